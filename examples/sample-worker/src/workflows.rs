//! Workflows and activities of the sample worker.
//!
//! Workflow type names are fixed with `#[run(name = "...")]` and the activity name with
//! `#[activity(name = "...")]`, so tests and the `temporal` CLI can address them by name.

use std::{sync::Arc, time::Duration};

use serde::{Deserialize, Serialize, de::DeserializeOwned};
use serde_json::Value;
use temporalio_common::{data_converters::RawValue, protos::temporal::api::common::v1::Payload};
use temporalio_macros::{activities, workflow, workflow_methods};
use temporalio_sdk::{
    ActivityOptions, ApplicationFailure, SyncWorkflowContext, TimerResult, WorkflowContext,
    WorkflowResult, WorkflowTermination,
    activities::{ActivityContext, ActivityError},
};
use temporalio_workflow::{ContinueAsNewOptions, ContinueAsNewVersioningBehavior};

use crate::{
    failure::FailShare,
    metrics::{GreetingMetrics, Outcome},
};

/// Encoding of JSON payloads (what the `temporal` CLI sends for `--input`).
const JSON_ENCODING: &[u8] = b"json/plain";
/// Encoding of a `null` payload.
const NULL_ENCODING: &[u8] = b"binary/null";

/// A non-retryable application failure with a type name tests can match on.
fn app_failure(type_name: &str, message: impl Into<String>) -> WorkflowTermination {
    ApplicationFailure::builder(message.into())
        .type_name(type_name.to_owned())
        .non_retryable(true)
        .build()
        .into()
}

/// Decodes an optional single argument.
///
/// Inputs are taken as [`RawValue`] because the SDK's serde converter rejects zero payloads, and a
/// workflow started without `--input` has none. No payload or a `null` payload gives `None`.
fn decode_optional<T: DeserializeOwned>(input: &RawValue) -> WorkflowResult<Option<T>> {
    let Some(payload) = input.payloads.first() else {
        return Ok(None);
    };
    let encoding = payload.metadata.get("encoding").map(Vec::as_slice);
    if encoding == Some(NULL_ENCODING) || (encoding.is_none() && payload.data.is_empty()) {
        return Ok(None);
    }
    if encoding != Some(JSON_ENCODING) {
        let shown = encoding.map_or_else(
            || "<none>".to_owned(),
            |e| String::from_utf8_lossy(e).into_owned(),
        );
        return Err(app_failure(
            "InvalidInput",
            format!("unsupported input encoding '{shown}', expected json/plain"),
        ));
    }
    serde_json::from_slice::<Option<T>>(&payload.data)
        .map_err(|e| app_failure("InvalidInput", format!("cannot decode input: {e}")))
}

/// A short label for the deployment version this workflow task runs on.
fn build_label(ctx: &WorkflowContext<impl Sized>) -> String {
    ctx.current_deployment_version()
        .map_or_else(|| "unversioned".to_owned(), |v| v.build_id)
}

/// Activities; the struct carries the worker's build ID, its failure switch and its metrics.
pub struct Greeter {
    pub build_id: String,
    /// Share of workflows whose `greet` fails (`SAMPLE_FAIL_SHARE`).
    pub fail_share: FailShare,
    /// Counts every `greet` by outcome.
    pub metrics: Arc<GreetingMetrics>,
    /// How long each `greet` takes (`SAMPLE_GREET_DELAY_MS`).
    pub delay: Duration,
}

#[activities]
impl Greeter {
    /// Returns `"Hello, <name>!"`, or fails with a non-retryable `SampleFailure` when the
    /// calling workflow is one of the failing share. Logs which build ran it.
    #[activity(name = "greet")]
    pub async fn greet(
        self: Arc<Self>,
        ctx: ActivityContext,
        name: String,
    ) -> Result<String, ActivityError> {
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        let workflow_id = ctx.info().workflow_id.as_deref().unwrap_or_default();
        if self.fail_share.fails(workflow_id) {
            self.metrics.record(Outcome::Failed);
            tracing::info!(build_id = %self.build_id, %workflow_id, "greet activity failing on purpose");
            return Err(ActivityError::application(
                ApplicationFailure::builder(format!(
                    "greet fails for {}% of workflows on build {} (SAMPLE_FAIL_SHARE), \
                     and {workflow_id} is one of them",
                    self.fail_share.percent(),
                    self.build_id
                ))
                .type_name("SampleFailure".to_owned())
                .non_retryable(true)
                .build(),
            ));
        }
        self.metrics.record(Outcome::Ok);
        tracing::info!(build_id = %self.build_id, %name, "greet activity");
        Ok(format!("Hello, {name}!"))
    }
}

/// `HelloWorld`: greets the input name (default `World`) through the `greet` activity and returns
/// `"Hello, <name>! (build <build id>)"`. Fails with the activity's failure when `greet` fails
/// (`SAMPLE_FAIL_SHARE`). With `reorder` (`SAMPLE_NONDETERMINISTIC=HelloWorld`) it first waits on
/// a 1 ms timer: a build whose commands differ from earlier builds' (it cannot replay their
/// histories).
#[workflow]
pub struct HelloWorld {
    reorder: bool,
}

impl HelloWorld {
    /// The worker registers this workflow with a factory so the variant comes from its config.
    pub fn new(reorder: bool) -> Self {
        Self { reorder }
    }
}

#[workflow_methods(factory_only)]
impl HelloWorld {
    #[run(name = "HelloWorld")]
    pub async fn run(ctx: &mut WorkflowContext<Self>, input: RawValue) -> WorkflowResult<String> {
        let name = decode_optional::<String>(&input)?
            .filter(|n| !n.trim().is_empty())
            .unwrap_or_else(|| "World".to_owned());
        if ctx.state(|s| s.reorder)
            && ctx.timer(Duration::from_millis(1)).await == TimerResult::Cancelled
        {
            return Err(WorkflowTermination::cancelled());
        }
        let greeting = ctx
            .execute_activity(
                Greeter::greet,
                name,
                ActivityOptions::start_to_close_timeout(Duration::from_secs(10)),
            )
            .await?;
        Ok(format!("{greeting} (build {})", build_label(ctx)))
    }
}

/// `RolloutGate`: returns its input unchanged, unless the input is an object with `"fail": true`
/// or the worker runs with `SAMPLE_FAIL_GATE=1`. With `"sleepSeconds": n` it first waits `n`
/// seconds on a durable timer (a gate that takes its time).
#[workflow]
pub struct RolloutGate {
    fail_gate: bool,
}

impl RolloutGate {
    /// The worker registers this workflow with a factory so the flag comes from its config.
    pub fn new(fail_gate: bool) -> Self {
        Self { fail_gate }
    }
}

#[workflow_methods(factory_only)]
impl RolloutGate {
    #[run(name = "RolloutGate")]
    pub async fn run(ctx: &mut WorkflowContext<Self>, input: RawValue) -> WorkflowResult<Value> {
        let input = decode_optional::<Value>(&input)?.unwrap_or(Value::Null);
        if let Some(seconds) = input.get("sleepSeconds").and_then(Value::as_u64)
            && seconds > 0
            && ctx.timer(Duration::from_secs(seconds)).await == TimerResult::Cancelled
        {
            return Err(WorkflowTermination::cancelled());
        }
        let build = build_label(ctx);
        if input.get("fail").and_then(Value::as_bool) == Some(true) {
            return Err(app_failure(
                "GateFailed",
                format!("rollout gate failed: input asked for failure (build {build})"),
            ));
        }
        if ctx.state(|s| s.fail_gate) {
            return Err(app_failure(
                "GateFailed",
                format!("rollout gate failed: worker has SAMPLE_FAIL_GATE set (build {build})"),
            ));
        }
        Ok(input)
    }
}

/// `GatePass`: always succeeds and returns its input (or null).
#[workflow]
#[derive(Default)]
pub struct GatePass;

#[workflow_methods]
impl GatePass {
    #[run(name = "GatePass")]
    pub async fn run(_ctx: &mut WorkflowContext<Self>, input: RawValue) -> WorkflowResult<Value> {
        Ok(decode_optional::<Value>(&input)?.unwrap_or(Value::Null))
    }
}

/// `GateFail`: always fails with a non-retryable `GateFailed` application error.
#[workflow]
#[derive(Default)]
pub struct GateFail;

#[workflow_methods]
impl GateFail {
    #[run(name = "GateFail")]
    pub async fn run(ctx: &mut WorkflowContext<Self>, _input: RawValue) -> WorkflowResult<Value> {
        Err(app_failure(
            "GateFailed",
            format!(
                "GateFail always fails (build {}): this gate exists to block a rollout",
                build_label(ctx)
            ),
        ))
    }
}

/// `Sleeper`: waits on a durable timer for the given number of seconds, then returns
/// `"slept <n>s (build <build id>)"`. With `reorder` (`SAMPLE_NONDETERMINISTIC=Sleeper`) it first
/// runs the `greet` activity: a build that cannot replay earlier builds' histories.
#[workflow]
pub struct Sleeper {
    reorder: bool,
}

impl Sleeper {
    /// The worker registers this workflow with a factory so the variant comes from its config.
    pub fn new(reorder: bool) -> Self {
        Self { reorder }
    }
}

#[workflow_methods(factory_only)]
impl Sleeper {
    #[run(name = "Sleeper")]
    pub async fn run(ctx: &mut WorkflowContext<Self>, seconds: u64) -> WorkflowResult<String> {
        if ctx.state(|s| s.reorder) {
            ctx.execute_activity(
                Greeter::greet,
                "Sleeper".to_owned(),
                ActivityOptions::start_to_close_timeout(Duration::from_secs(10)),
            )
            .await?;
        }
        // A zero-length timer is rejected by the server, so skip it.
        if seconds > 0 && ctx.timer(Duration::from_secs(seconds)).await == TimerResult::Cancelled {
            return Err(WorkflowTermination::cancelled());
        }
        Ok(format!("slept {seconds}s (build {})", build_label(ctx)))
    }
}

/// Name of the signal the controller sends to workflows still pinned to a retired version
/// (`spec.sunset.drain.signalName` defaults to it). It carries no input.
pub const DRAIN_SIGNAL: &str = "twc-drain";
/// Name of the signal that ends a `Subscription`.
pub const END_SIGNAL: &str = "end";

/// Input of `Subscription`; every field is optional.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct SubscriptionInput {
    /// How long the subscription lasts (a durable timer) unless drained or ended; forever when
    /// unset.
    pub hours: Option<u64>,
    /// Builds the earlier runs of this subscription ran on, oldest first (each continue-as-new
    /// appends the build it leaves).
    pub earlier_builds: Vec<String>,
}

/// `Subscription`: a long-running pinned workflow that listens for the drain signal. On
/// [`DRAIN_SIGNAL`] it continues as new with initial versioning behavior AutoUpgrade, so the new
/// run starts on the Current version (and stays pinned there), carrying the builds it ran on
/// in [`SubscriptionInput::earlier_builds`]. On [`END_SIGNAL`], or when its `hours` have passed,
/// it returns `"subscription ended on build <build> (earlier runs: <builds or none>)"`.
#[workflow]
#[derive(Default)]
pub struct Subscription {
    drain_requested: bool,
    end_requested: bool,
}

#[workflow_methods]
impl Subscription {
    #[run(name = "Subscription")]
    pub async fn run(ctx: &mut WorkflowContext<Self>, input: RawValue) -> WorkflowResult<String> {
        let mut input = decode_optional::<SubscriptionInput>(&input)?.unwrap_or_default();
        let woken = |s: &Self| s.drain_requested || s.end_requested;
        let cancelled = match input.hours.filter(|h| *h > 0) {
            Some(hours) => {
                temporalio_sdk::workflows::select! {
                    timer = ctx.timer(Duration::from_secs(hours.saturating_mul(3600))) => {
                        timer == TimerResult::Cancelled
                    }
                    woken = ctx.wait_condition(woken) => woken.is_err(),
                }
            }
            None => ctx.wait_condition(woken).await.is_err(),
        };
        if cancelled {
            return Err(WorkflowTermination::cancelled());
        }
        // The build of the task that woke it: a versioning override may have moved the run.
        let build = build_label(ctx);
        if ctx.state(|s| s.drain_requested && !s.end_requested) {
            input.earlier_builds.push(build);
            let next = RawValue::new(vec![json_payload(&input)?]);
            let options = ContinueAsNewOptions::builder()
                .initial_versioning_behavior(ContinueAsNewVersioningBehavior::AutoUpgrade)
                .build();
            return match ctx.continue_as_new(next, options) {
                Err(termination) => Err(termination),
                Ok(never) => match never {},
            };
        }
        let earlier = if input.earlier_builds.is_empty() {
            "none".to_owned()
        } else {
            input.earlier_builds.join(", ")
        };
        Ok(format!(
            "subscription ended on build {build} (earlier runs: {earlier})"
        ))
    }

    /// The drain signal: continue as new on the Current version.
    #[signal(name = DRAIN_SIGNAL)]
    pub fn drain(&mut self, _ctx: &mut SyncWorkflowContext<Self>, _input: RawValue) {
        self.drain_requested = true;
    }

    /// Ends the subscription.
    #[signal(name = END_SIGNAL)]
    pub fn end(&mut self, _ctx: &mut SyncWorkflowContext<Self>, _input: RawValue) {
        self.end_requested = true;
    }
}

/// `Stubborn`: a long-running pinned workflow that waits forever and ignores the drain signal
/// (it counts it and does nothing); only a cancellation ends it, as Canceled.
#[workflow]
#[derive(Default)]
pub struct Stubborn {
    drain_signals_ignored: u32,
}

#[workflow_methods]
impl Stubborn {
    #[run(name = "Stubborn")]
    pub async fn run(ctx: &mut WorkflowContext<Self>, _input: RawValue) -> WorkflowResult<String> {
        // Never true: waits until the workflow is cancelled.
        let _cancelled = ctx.wait_condition(|_: &Self| false).await;
        let ignored = ctx.state(|s| s.drain_signals_ignored);
        tracing::info!(build = %build_label(ctx), ignored, "Stubborn cancelled");
        Err(WorkflowTermination::cancelled())
    }

    /// Heard and ignored.
    #[signal(name = DRAIN_SIGNAL)]
    pub fn drain(&mut self, _ctx: &mut SyncWorkflowContext<Self>, _input: RawValue) {
        self.drain_signals_ignored += 1;
    }
}

/// A `json/plain` payload of `value`.
fn json_payload(value: &impl Serialize) -> WorkflowResult<Payload> {
    let data = serde_json::to_vec(value)
        .map_err(|e| app_failure("InvalidInput", format!("cannot encode input: {e}")))?;
    Ok(Payload {
        metadata: [("encoding".to_owned(), JSON_ENCODING.to_vec())].into(),
        data,
        ..Default::default()
    })
}
