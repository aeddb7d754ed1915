//! The rollout of one build (`rollout/<ns>/<name>/<build>`): a durable, level-triggered loop.
//! Each turn observes the world (one activity), asks [`plan::rollout::decide`] for the next
//! step, performs it (one activity or a durable timer) and reports progress to the TWD
//! workflow, which owns status. Because every turn re-observes, a crash, a missed signal, a
//! step-list edit or a routing change made by hand all converge the same way.
//!
//! The history reads as the rollout log: `observe`, `create_deployment`, `wait_for_pollers`,
//! `run_gate`, `set_routing` (with summaries such as "ramp 25%"), timers for step pauses.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use temporalio_common::MemoValues;
use temporalio_common::search_attributes::SearchAttributeKey;
use temporalio_macros::{workflow, workflow_methods};
use temporalio_sdk::workflows::join;
use temporalio_sdk::{
    ActivityOptions, CancellableFuture, ContinueAsNewOptions, SyncWorkflowContext, WorkflowContext,
    WorkflowContextView, WorkflowResult,
};

use crate::contract::{
    AnalysisRequest, BuildRequest, CancelGates, CreateDeployment, CreateDeploymentOutcome,
    EmitEvent, EventKind, EventRequest, GateRequest, GateRun, Observe, PollerWaitOutcome,
    ReplayCheckRequest, ReplayVerdict, RoutingChange, RoutingOutcome, RoutingRequest, RunAnalysis,
    RunGate, RunReplayCheck, ScaleDeployment, ScaleRequest, SetRouting, StepGateRef, Verdict,
    WaitForPollers, WaitForPollersRequest,
};
use crate::control::{self, ControlEffect, ControlState};
use crate::model::{
    AppliedRouting, BlockReason, Blocked, ControlAction, Observation, RolloutProgress,
    RolloutReport, TwdRef, UnixMillis,
};
use crate::plan::analysis::StepGate;
use crate::plan::rollout::{
    GateState, HeldTime, HoldTransition, RolloutDecision, RolloutMemory, decide,
};
use crate::support::{
    self, PATCH_SHORT_ROLLOUT_RUNS, activity_failed, history_full, millis, now_millis,
    replay_options, run_activity, short_options, waiting_options, with_summary,
};
use crate::twd_workflow::TwdWorkflow;

/// Search attribute: Kubernetes namespace of the TWD.
pub const SA_NAMESPACE: SearchAttributeKey<String> = SearchAttributeKey::keyword("TwcNamespace");
/// Search attribute: TWD name.
pub const SA_NAME: SearchAttributeKey<String> = SearchAttributeKey::keyword("TwcName");
/// Search attribute: build ID being rolled out.
pub const SA_BUILD_ID: SearchAttributeKey<String> = SearchAttributeKey::keyword("TwcBuildId");
/// Search attribute: `Running`, `Blocked` while a failed gate or the progress deadline stops the
/// rollout (back to `Running` when it moves again), then how it ended: `Complete`,
/// `Superseded` or `Aborted`.
pub const SA_OUTCOME: SearchAttributeKey<String> = SearchAttributeKey::keyword("TwcOutcome");

/// Longest single wait for pollers or gate results before re-observing.
const MAX_ACTIVITY_WAIT: Duration = Duration::from_secs(60);
/// Longest wait in a hold (a step's pause, a pause, a Manual promotion, a failed gate, a build
/// waiting to be Available again) when nothing signals a change: the TWD workflow's resync
/// interval unless its input says otherwise. A hold wakes on what can change its decision (a
/// control, a spec change forwarded by the TWD workflow, a watched change of its Deployments,
/// its own timer); this slow look only catches what no watch reports: a routing change made by
/// hand in Temporal, which is snapped back to the step grid then (reference §3.7).
const DEFAULT_RESYNC: Duration = crate::twd_workflow::DEFAULT_RESYNC;
/// How long activity failures (after their own retries) may last before the rollout reports
/// them: longer than a restart of the API server or of Temporal.
const TRANSIENT_GRACE: Duration = Duration::from_secs(60);
/// Re-check interval while failures are within [`TRANSIENT_GRACE`].
const TRANSIENT_RECHECK: Duration = Duration::from_secs(5);
/// Re-check interval while blocked by an error that may clear by itself.
const BLOCKED_RECHECK: Duration = Duration::from_secs(30);
/// Attempts to clear this build's ramp on abort before giving up (each re-reads routing).
const ABORT_ROUTING_ATTEMPTS: u32 = 5;

/// Input of a rollout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RolloutInput {
    /// The TWD.
    pub twd: TwdRef,
    /// The build to roll out.
    pub build_id: String,
    /// History events after which the rollout continues as new (default
    /// [`crate::DEFAULT_HISTORY_EVENT_BOUND`]; absent in histories from before it existed).
    #[serde(default)]
    pub history_event_bound: Option<u32>,
    /// Memory carried over a continue-as-new (None on the first run).
    pub carried: Option<CarriedRollout>,
    /// The TWD workflow creates the build's Deployment alongside this rollout's start
    ///, so the rollout does not create first; its first observation
    /// decides as always (absent in inputs from before it existed).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub created_by_parent: bool,
    /// Seconds a hold waits at most when nothing signals a change (the TWD workflow's resync;
    /// default [`DEFAULT_RESYNC`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resync_seconds: Option<u32>,
}

/// What survives a continue-as-new.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CarriedRollout {
    /// Decision memory.
    pub memory: RolloutMemory,
    /// Gate attempt number.
    pub gate_attempt: u32,
    /// Report sequence.
    pub sequence: u64,
    /// Controls received and not yet answered.
    #[serde(default)]
    pub controls: Vec<ControlAction>,
    /// Gate runs of the attempt in force.
    #[serde(default)]
    pub gate_runs: Vec<GateRun>,
    /// The last report sent to the TWD workflow (not sent again unless it changes).
    #[serde(default)]
    pub last_report: Option<RolloutReport>,
    /// Since when activities have been failing (transient errors are not reported at once).
    #[serde(default)]
    pub failing_since: Option<UnixMillis>,
    /// `spec.rollout.paused` as last observed (controls are answered from it before the new
    /// run's first observation).
    #[serde(default)]
    pub spec_paused: bool,
    /// When the rollout's first run started (the rollout's start, however many runs it takes);
    /// absent in inputs carried from before it existed.
    #[serde(default)]
    pub first_started_at: Option<UnixMillis>,
    /// Whether the rollout was stopped (`TwcOutcome=Blocked`) when its run continued as new:
    /// the closing run's `TwcOutcome` becomes `ContinuedAsNew`, and the new run sets it back.
    #[serde(default)]
    pub blocked: bool,
}

/// Memo key of a continued run: when the rollout's first run started (Unix milliseconds), so
/// a list of runs shows one rollout with its start (`twc status`).
pub const MEMO_ROLLOUT_STARTED_AT: &str = "rolloutStartedAt";

/// How a rollout ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RolloutOutcome {
    /// The build is Current.
    Complete,
    /// A newer build took over, or the TWD was deleted.
    Superseded,
    /// An operator aborted it.
    Aborted,
}

/// The rollout workflow's state.
#[workflow]
pub struct RolloutWorkflow {
    input: RolloutInput,
    memory: RolloutMemory,
    gate_attempt: u32,
    gate_runs: Vec<GateRun>,
    /// Bumped by every signal; waits end when it changes.
    wakeups: u64,
    /// `wakeups` when the turn in progress observed the world: a wait ends at once if a signal
    /// came in after that (during an activity or a report), so none is missed.
    observed_wakeups: u64,
    /// Bumped by the watcher's `deployment_changed` signal. Holds end when it changes; waits
    /// that watch the Deployments themselves (for pollers, for availability) do not.
    deployment_changes: u64,
    /// `deployment_changes` when the turn in progress observed the world.
    observed_deployment_changes: u64,
    abort_requested: bool,
    retry_requested: bool,
    /// Controls received and not yet answered.
    controls: Vec<ControlAction>,
    /// `spec.rollout.paused` as last observed.
    spec_paused: bool,
    /// `TwcOutcome` is `Blocked` (stopped by a failed gate or the progress deadline).
    outcome_blocked: bool,
    last_report: Option<RolloutReport>,
    sequence: u64,
    /// Since when activities have been failing after their retries (cleared by a successful
    /// observation): a failure is reported only once it outlasts [`TRANSIENT_GRACE`].
    failing_since: Option<UnixMillis>,
    /// When the rollout's first run started.
    first_started_at: UnixMillis,
}

#[workflow_methods]
impl RolloutWorkflow {
    /// Builds the initial state from the input.
    #[init]
    pub fn new(ctx: &WorkflowContextView, input: RolloutInput) -> Self {
        Self::starting(input, millis(ctx.start_time()))
    }

    /// Runs the rollout until the build is Current, superseded or aborted.
    #[run(name = "rollout")]
    pub async fn run(ctx: &mut WorkflowContext<Self>) -> WorkflowResult<RolloutOutcome> {
        let twd = ctx.state(|s| s.input.twd.clone());
        let build_id = ctx.state(|s| s.input.build_id.clone());
        // A continued run: the run before it left `ContinuedAsNew` (which this run inherited),
        // so that only the live run answers `TwcOutcome` queries. A first run starts `Running`.
        if ctx.state(|s| s.input.carried.is_some()) {
            let blocked = ctx.state(|s| s.outcome_blocked);
            set_outcome(ctx, if blocked { "Blocked" } else { "Running" });
        }
        if ctx.state(|s| s.input.carried.is_none() && !s.input.created_by_parent) {
            create_first(ctx, &twd, &build_id).await;
        }
        let mut turns = 0u32;
        let mut prefetched: Option<Box<Observation>> = None;
        loop {
            turns += 1;
            let continue_now = turns > 1
                && (history_full(ctx, ctx.state(|s| s.input.history_event_bound))
                    || past_run_bound(ctx));
            if continue_now {
                let input = ctx.state(RolloutWorkflow::continued_input);
                let mut memo = MemoValues::new();
                memo.insert(MEMO_ROLLOUT_STARTED_AT, ctx.state(|s| s.first_started_at));
                let options = ContinueAsNewOptions::builder().memo(memo).build();
                set_outcome(ctx, "ContinuedAsNew");
                ctx.continue_as_new(input, options)?;
            }
            // An observation the wait for pollers made once ready is decided on directly; the
            // signals counted when that wait began still count as unseen if any came since.
            let observation = match prefetched.take() {
                Some(observation) => *observation,
                None => {
                    ctx.state_mut(|s| {
                        s.observed_wakeups = s.wakeups;
                        s.observed_deployment_changes = s.deployment_changes;
                    });
                    match observe(ctx, &twd).await {
                        Ok(o) => o,
                        Err(blocked) => {
                            on_failure(ctx, blocked).await;
                            continue;
                        }
                    }
                }
            };
            if observation.temporal.is_ok() {
                ctx.state_mut(|s| s.failing_since = None);
            }
            let now = now_millis(ctx);
            answer_controls(ctx, &twd, &observation).await;
            apply_operator_flags(ctx);
            if ctx.state(|s| s.abort_requested) {
                return abort(ctx, &twd, &build_id, &observation, None).await;
            }
            track_hold(ctx, &twd, &observation, now).await;
            ctx.state_mut(|s| s.memory.progress.track(&observation, &build_id, now));
            let memory = ctx.state(|s| s.memory.clone());
            let decision = decide(&observation, &memory, now);
            mark_blocked(
                ctx,
                matches!(
                    decision,
                    RolloutDecision::GateFailed(_) | RolloutDecision::DeadlineExceeded(_)
                ),
            );
            match decision {
                RolloutDecision::Superseded => {
                    cancel_gates(ctx, &twd, &build_id).await;
                    report(ctx, RolloutProgress::Superseded, None, None).await;
                    set_outcome(ctx, "Superseded");
                    return Ok(RolloutOutcome::Superseded);
                }
                RolloutDecision::Blocked(blocked) => {
                    let recheck = match blocked.reason {
                        BlockReason::InvalidSpec => ctx.state(RolloutWorkflow::resync),
                        // Usually a busy worker deployment right after a write: look again soon.
                        BlockReason::TemporalStateFetchFailed => Duration::from_secs(5),
                        _ => BLOCKED_RECHECK,
                    };
                    report(ctx, RolloutProgress::Blocked, Some(blocked), None).await;
                    wait_for_change(ctx, recheck).await;
                }
                RolloutDecision::CreateDeployment => {
                    report(ctx, RolloutProgress::WaitingForPollers, None, None).await;
                    let request = BuildRequest {
                        twd: twd.clone(),
                        build_id: build_id.clone(),
                        version_limit: None,
                    };
                    match run_activity(
                        ctx,
                        CreateDeployment,
                        request,
                        "create Deployment",
                        short_options(),
                    )
                    .await
                    {
                        Ok(created @ CreateDeploymentOutcome::Created { .. }) => {
                            let reason = CreateDeploymentOutcome::CREATED_REASON;
                            let message = created.created_message(&build_id).unwrap_or_default();
                            event(ctx, &twd, EventKind::Normal, reason, message).await;
                        }
                        Ok(
                            CreateDeploymentOutcome::Exists { .. }
                            | CreateDeploymentOutcome::Superseded
                            | CreateDeploymentOutcome::Deferred { .. },
                        ) => {}
                        Ok(CreateDeploymentOutcome::Blocked(blocked)) => {
                            report(ctx, RolloutProgress::Blocked, Some(blocked), None).await;
                            wait_for_change(ctx, BLOCKED_RECHECK).await;
                        }
                        Err(blocked) => on_failure(ctx, blocked).await,
                    }
                }
                RolloutDecision::ScaleTarget { replicas } => {
                    let Some(deployment) =
                        observation.deployment(&build_id).map(|d| d.name.clone())
                    else {
                        continue;
                    };
                    let request = ScaleRequest {
                        namespace: twd.namespace.clone(),
                        name: deployment,
                        replicas,
                    };
                    if let Err(blocked) = run_activity(
                        ctx,
                        ScaleDeployment,
                        request,
                        &format!("scale to {replicas}"),
                        short_options(),
                    )
                    .await
                    {
                        on_failure(ctx, blocked).await;
                    }
                }
                RolloutDecision::WaitForPollers { deadline_at } => {
                    report(ctx, RolloutProgress::WaitingForPollers, None, None).await;
                    let max_wait = Duration::from_millis(
                        u64::try_from(deadline_at - now).unwrap_or(0).max(1000),
                    )
                    .min(MAX_ACTIVITY_WAIT);
                    prefetched = wait_until_ready(ctx, &twd, &build_id, max_wait).await;
                }
                RolloutDecision::DeadlineExceeded(blocked) => {
                    report(ctx, RolloutProgress::Blocked, Some(blocked.clone()), None).await;
                    event(
                        ctx,
                        &twd,
                        EventKind::Warning,
                        "ProgressDeadlineExceeded",
                        blocked.message,
                    )
                    .await;
                    hold(ctx, None).await;
                }
                RolloutDecision::WaitForAvailability { message } => {
                    let ramp = ramp_of(&observation, &build_id)
                        .map(|pct| (step_of(&observation, pct), Some(pct), None));
                    let progress = RolloutProgress::WaitingForAvailability;
                    send_report(ctx, progress, None, ramp, None, Some(message)).await;
                    // Woken by the watched change of the Deployment, not a timer.
                    hold(ctx, None).await;
                }
                RolloutDecision::RunGate => {
                    report(ctx, RolloutProgress::WaitingForPromotion, None, None).await;
                    run_gate(ctx, &twd, &build_id, &observation).await;
                }
                RolloutDecision::GateFailed(blocked) => {
                    if let Some(deployment) = observation.deployment(&build_id)
                        && deployment.replicas != Some(0)
                    {
                        let request = ScaleRequest {
                            namespace: twd.namespace.clone(),
                            name: deployment.name.clone(),
                            replicas: 0,
                        };
                        let _ = run_activity(
                            ctx,
                            ScaleDeployment,
                            request,
                            "scale failed build to 0",
                            short_options(),
                        )
                        .await;
                    }
                    report(ctx, RolloutProgress::Blocked, Some(blocked), None).await;
                    hold(ctx, None).await;
                }
                RolloutDecision::Paused => {
                    let ramp = ramp_of(&observation, &build_id)
                        .map(|pct| (step_of(&observation, pct), Some(pct), None));
                    report(ctx, RolloutProgress::Paused, None, ramp).await;
                    hold(ctx, None).await;
                }
                RolloutDecision::WaitForManualPromotion => {
                    report(ctx, RolloutProgress::WaitingForPromotion, None, None).await;
                    hold(ctx, None).await;
                }
                RolloutDecision::SetCurrent => {
                    route(
                        ctx,
                        &twd,
                        &observation,
                        RoutingChange::SetCurrent {
                            build_id: build_id.clone(),
                        },
                        Some((RolloutProgress::Complete, None)),
                    )
                    .await;
                    // Reported Complete with the routing just written: done,
                    // without reading Temporal again while it applies the change.
                    let reported_complete = ctx.state(|s| {
                        s.last_report.as_ref().is_some_and(|r| {
                            r.progress == RolloutProgress::Complete && r.routing.is_some()
                        })
                    });
                    if reported_complete {
                        return complete(ctx, &twd, &build_id).await;
                    }
                }
                RolloutDecision::SetRamping { percentage, step } => {
                    let change = RoutingChange::SetRamping {
                        build_id: build_id.clone(),
                        percentage,
                    };
                    let ramp = Some((step, Some(percentage), None));
                    let applied = Some((RolloutProgress::Ramping, ramp));
                    if route(ctx, &twd, &observation, change, applied).await {
                        report(ctx, RolloutProgress::Ramping, None, ramp).await;
                    }
                }
                RolloutDecision::ClearRamp => {
                    route(ctx, &twd, &observation, RoutingChange::ClearRamp, None).await;
                }
                RolloutDecision::HoldStep { step, until } => {
                    let percentage = ramp_of(&observation, &build_id);
                    report(
                        ctx,
                        RolloutProgress::Ramping,
                        None,
                        Some((step, percentage, Some(until))),
                    )
                    .await;
                    let left =
                        Duration::from_millis(u64::try_from(until - now).unwrap_or(0).max(1));
                    hold(ctx, Some(left)).await;
                }
                RolloutDecision::Analyze { step, checks } => {
                    analyze(ctx, &twd, &build_id, &observation, step, &checks).await;
                }
                RolloutDecision::RunStepGate { step } => {
                    run_step_gate(ctx, &twd, &build_id, &observation, step).await;
                }
                RolloutDecision::AnalysisHold {
                    step,
                    until,
                    wake_at,
                    inconclusive,
                } => {
                    let percentage = ramp_of(&observation, &build_id);
                    let ramp = Some((step, percentage, Some(until)));
                    match inconclusive {
                        Some(blocked) => {
                            report(ctx, RolloutProgress::Blocked, Some(blocked), ramp).await;
                        }
                        None => report(ctx, RolloutProgress::Ramping, None, ramp).await,
                    }
                    let wait =
                        Duration::from_millis(u64::try_from(wake_at - now).unwrap_or(0).max(1));
                    hold(ctx, Some(wait)).await;
                }
                RolloutDecision::AnalysisFailed(blocked) => {
                    return abort(ctx, &twd, &build_id, &observation, Some(blocked)).await;
                }
                RolloutDecision::RunReplayCheck => {
                    report(ctx, RolloutProgress::WaitingForPromotion, None, None).await;
                    replay_check(ctx, &twd, &build_id, &observation).await;
                }
                RolloutDecision::ReplayCheckFailed(blocked) => {
                    return abort(ctx, &twd, &build_id, &observation, Some(blocked)).await;
                }
                RolloutDecision::ReplayCheckHeld(blocked) => {
                    report(ctx, RolloutProgress::Blocked, Some(blocked), None).await;
                    hold(ctx, None).await;
                }
                RolloutDecision::Complete => {
                    report(ctx, RolloutProgress::Complete, None, None).await;
                    return complete(ctx, &twd, &build_id).await;
                }
            }
        }
    }

    /// Something changed (spec edit, Deployment status, resync): observe again now.
    #[signal(name = "nudge")]
    pub fn nudge(&mut self, _ctx: &mut SyncWorkflowContext<Self>, _reason: String) {
        self.wakeups += 1;
    }

    /// One of the TWD's Deployments changed in a way its decisions read (replicas,
    /// availability, a failing rollout, deletion), from the controller's Deployment watch: a hold
    /// looks again now. Waits that watch the Deployments themselves carry on.
    #[signal(name = "deployment_changed")]
    pub fn deployment_changed(&mut self, _ctx: &mut SyncWorkflowContext<Self>, _name: String) {
        self.deployment_changes += 1;
    }

    /// Operator control, forwarded by the TWD workflow once its `control` update accepted it;
    /// answered and applied by the run loop.
    #[signal(name = "control")]
    pub fn control(&mut self, _ctx: &mut SyncWorkflowContext<Self>, action: ControlAction) {
        self.push_control(action);
    }

    /// The latest progress report.
    #[query(name = "status")]
    pub fn status(&self, _ctx: &WorkflowContextView) -> Option<RolloutReport> {
        self.last_report.clone()
    }

    /// What an operator control would do now (the CLI answers with it before sending one).
    #[query(name = "control_state")]
    pub fn control_state(&self, _ctx: &WorkflowContextView) -> ControlState {
        self.control_view()
    }
}

impl RolloutWorkflow {
    /// The state a run starts from at `now`: a fresh rollout, or what the run before it carried.
    fn starting(input: RolloutInput, now: UnixMillis) -> Self {
        let carried = input.carried.clone().unwrap_or_else(|| CarriedRollout {
            memory: RolloutMemory {
                build_id: input.build_id.clone(),
                started_at: now,
                gate: GateState::NotRun,
                promote_requested: false,
                pause_requested: false,
                held: HeldTime::default(),
                analysis: Default::default(),
                progress: Default::default(),
                replay: Default::default(),
            },
            gate_attempt: 1,
            sequence: 0,
            controls: Vec::new(),
            gate_runs: Vec::new(),
            last_report: None,
            failing_since: None,
            spec_paused: false,
            first_started_at: Some(now),
            blocked: false,
        });
        let pending_controls = carried.controls.len() as u64;
        Self {
            input,
            memory: carried.memory,
            gate_attempt: carried.gate_attempt,
            gate_runs: carried.gate_runs,
            // Carried controls count as signals not yet handled.
            wakeups: pending_controls,
            observed_wakeups: 0,
            deployment_changes: 0,
            observed_deployment_changes: 0,
            abort_requested: false,
            retry_requested: false,
            controls: carried.controls,
            spec_paused: carried.spec_paused,
            outcome_blocked: carried.blocked,
            last_report: carried.last_report,
            sequence: carried.sequence,
            failing_since: carried.failing_since,
            first_started_at: carried.first_started_at.unwrap_or(now),
        }
    }

    /// The input of the next run: everything this run decides from (an abort or a retry is
    /// acted on in the turn that applies it, so none is pending here).
    fn continued_input(&self) -> RolloutInput {
        RolloutInput {
            twd: self.input.twd.clone(),
            build_id: self.input.build_id.clone(),
            history_event_bound: self.input.history_event_bound,
            carried: Some(CarriedRollout {
                memory: self.memory.clone(),
                gate_attempt: self.gate_attempt,
                sequence: self.sequence,
                controls: self.controls.clone(),
                gate_runs: self.gate_runs.clone(),
                last_report: self.last_report.clone(),
                failing_since: self.failing_since,
                spec_paused: self.spec_paused,
                first_started_at: Some(self.first_started_at),
                blocked: self.outcome_blocked,
            }),
            created_by_parent: false,
            resync_seconds: self.input.resync_seconds,
        }
    }

    /// How long a hold waits at most when nothing signals a change.
    fn resync(&self) -> Duration {
        self.input.resync_seconds.map_or(DEFAULT_RESYNC, |seconds| {
            Duration::from_secs(u64::from(seconds.max(1)))
        })
    }

    fn push_control(&mut self, action: ControlAction) {
        self.controls.push(action);
        self.wakeups += 1;
    }

    fn control_view(&self) -> ControlState {
        ControlState {
            build_id: self.input.build_id.clone(),
            progress: self.last_report.as_ref().map(|r| r.progress),
            blocked: self
                .last_report
                .as_ref()
                .and_then(|r| r.blocked.as_ref())
                .map(|b| b.reason),
            operator_paused: self.memory.pause_requested,
            spec_paused: self.spec_paused,
            promote_requested: self.memory.promote_requested,
        }
    }
}

/// Answers the controls received since the last turn: applies those that apply (recording the
/// operator's intent for [`decide`]) and answers the others with a `ControlUnchanged` or
/// `ControlIgnored` event.
async fn answer_controls(
    ctx: &mut WorkflowContext<RolloutWorkflow>,
    twd: &TwdRef,
    observation: &Observation,
) {
    let spec_paused = observation.spec.as_ref().is_some_and(|s| s.paused);
    ctx.state_mut(|s| s.spec_paused = spec_paused);
    let controls = ctx.state_mut(|s| std::mem::take(&mut s.controls));
    for action in controls {
        let answer = ctx.state(|s| control::effect(action, &s.control_view()));
        let reason = answer.event_reason().unwrap_or(control::REASON_IGNORED);
        let message = match answer {
            ControlEffect::Apply(message) => {
                ctx.state_mut(|s| match action {
                    ControlAction::Pause => s.memory.pause_requested = true,
                    ControlAction::Resume => s.memory.pause_requested = false,
                    ControlAction::Promote => {
                        s.memory.promote_requested = true;
                        s.memory.pause_requested = false;
                    }
                    ControlAction::Abort => s.abort_requested = true,
                    ControlAction::Retry => s.retry_requested = true,
                });
                if action == ControlAction::Retry {
                    event(ctx, twd, EventKind::Normal, "Retrying", message).await;
                }
                continue;
            }
            ControlEffect::Unchanged(message) | ControlEffect::NotApplicable(message) => message,
        };
        event(ctx, twd, EventKind::Normal, reason, message).await;
    }
}

/// Follows holds (`spec.rollout.paused` or an operator's pause) so they do not use up the
/// Progressive step in force, and records `Paused` / `Resumed` events.
async fn track_hold(
    ctx: &mut WorkflowContext<RolloutWorkflow>,
    twd: &TwdRef,
    observation: &Observation,
    now: UnixMillis,
) {
    let step_clock = observation
        .temporal
        .as_ref()
        .ok()
        .and_then(|t| t.ramp_changed_at);
    let (spec_paused, operator_paused) = ctx.state(|s| (s.spec_paused, s.memory.pause_requested));
    let held = spec_paused || operator_paused;
    let Some(transition) = ctx.state_mut(|s| s.memory.held.track(held, step_clock, now)) else {
        return;
    };
    let build = ctx.state(|s| s.input.build_id.clone());
    let (reason, message) = match transition {
        HoldTransition::Held => {
            let by = if operator_paused {
                "an operator (send `resume` to continue)"
            } else {
                "spec.rollout.paused (set it to false to continue)"
            };
            ("Paused", format!("Rollout of build {build} paused by {by}"))
        }
        HoldTransition::Released => (
            "Resumed",
            format!(
                "Rollout of build {build} resumed; the step in force continues where it paused"
            ),
        ),
    };
    event(ctx, twd, EventKind::Normal, reason, message).await;
}

/// Sets `TwcOutcome=Blocked` while a failed gate or the progress deadline stops the rollout,
/// and back to `Running` when it moves again, so `TwcOutcome='Blocked'` lists stuck rollouts.
/// (Not unset: SDK 1.1.1 encodes an unset as an empty payload, which the server rejects.)
fn mark_blocked(ctx: &mut WorkflowContext<RolloutWorkflow>, stopped: bool) {
    if ctx.state(|s| s.outcome_blocked) == stopped {
        return;
    }
    ctx.state_mut(|s| s.outcome_blocked = stopped);
    set_outcome(ctx, if stopped { "Blocked" } else { "Running" });
}

/// Whether this rollout was started with the `Twc*` search attributes (they are registered).
fn search_attributes_on(ctx: &WorkflowContext<RolloutWorkflow>) -> bool {
    ctx.search_attributes().contains_key(&SA_BUILD_ID)
}

/// Applies a pending `retry`: the gate runs again (new attempt) and the progress deadline is
/// measured afresh (a build revived from zero replicas must become Available within it again).
fn apply_operator_flags(ctx: &mut WorkflowContext<RolloutWorkflow>) {
    let now = now_millis(ctx);
    ctx.state_mut(|s| {
        if s.retry_requested {
            s.retry_requested = false;
            if matches!(
                s.memory.gate,
                GateState::Failed { .. } | GateState::TimedOut { .. }
            ) {
                s.memory.gate = GateState::NotRun;
                s.gate_attempt += 1;
                s.gate_runs.clear();
            }
            s.memory.started_at = now;
            s.memory.progress = Default::default();
            s.memory.replay.retry();
        }
    });
}

/// Runs the replay check of the build (`spec.rollout.replayCheck`) and records its verdict,
/// with an event saying what it found.
async fn replay_check(
    ctx: &mut WorkflowContext<RolloutWorkflow>,
    twd: &TwdRef,
    build_id: &str,
    observation: &Observation,
) {
    let Some(check) = observation
        .spec
        .as_ref()
        .and_then(|s| s.replay_check.clone())
    else {
        return;
    };
    let temporal = observation.temporal.as_ref().ok();
    let options = replay_options(check.timeout_seconds);
    let dry_run = check.dry_run;
    let request = ReplayCheckRequest {
        twd: twd.clone(),
        build_id: build_id.to_owned(),
        attempt: ctx.state(|s| s.memory.replay.attempt),
        current_build_id: temporal.and_then(|t| t.current_build_id.clone()),
        ramping_build_id: temporal
            .and_then(|t| t.ramping_build_id.clone())
            .filter(|b| b != build_id),
        check,
    };
    let verdict = match run_activity(ctx, RunReplayCheck, request, "replay check", options).await {
        Ok(verdict) => verdict,
        Err(blocked) => return on_failure(ctx, blocked).await,
    };
    let dry = if dry_run {
        " (dryRun: the rollout goes on whatever the verdict)"
    } else {
        ""
    };
    let (kind, reason, message) = match &verdict {
        ReplayVerdict::Passed {
            histories,
            workflow_types,
            seconds,
        } => {
            let types: Vec<String> = workflow_types
                .iter()
                .map(|(name, n)| format!("{name} {n}"))
                .collect();
            let message = if *histories == 0 {
                format!("Replay check of build {build_id}: no history to replay")
            } else {
                let noun = if *histories == 1 {
                    "history"
                } else {
                    "histories"
                };
                format!(
                    "Replay check of build {build_id} passed: {histories} {noun} replayed ({}) in {seconds:.1}s",
                    types.join(", ")
                )
            };
            (EventKind::Normal, "ReplayCheckPassed", message)
        }
        // Not in dry run, the abort that follows says it, with the replayer's words.
        ReplayVerdict::Nondeterministic { .. } if !dry_run => {
            let verdict = verdict.clone();
            ctx.state_mut(|s| s.memory.replay.verdict = Some(verdict));
            return;
        }
        ReplayVerdict::Nondeterministic {
            workflow_id,
            workflow_type,
            count,
            ..
        } => (
            EventKind::Warning,
            "ReplayCheckFailed",
            format!(
                "Replay check of build {build_id}: {count} of the histories do not replay, the first workflow {workflow_id} ({workflow_type}){dry}"
            ),
        ),
        ReplayVerdict::Inconclusive { reason } => (
            EventKind::Warning,
            "ReplayCheckInconclusive",
            format!("Replay check of build {build_id} could not decide: {reason}{dry}"),
        ),
    };
    event(ctx, twd, kind, reason, message).await;
    ctx.state_mut(|s| s.memory.replay.verdict = Some(verdict));
}

/// One observation, as a local activity: a turn of a hold costs its timer, one workflow task
/// and one marker in history, not an activity's three events and a second workflow task.
async fn observe(
    ctx: &mut WorkflowContext<RolloutWorkflow>,
    twd: &TwdRef,
) -> Result<Observation, Blocked> {
    support::run_local_activity(ctx, Observe, twd.clone(), "observe").await
}

/// Waits (one `wait_for_pollers`, at most `max_wait`, ended early by a signal) until the build
/// is registered and Available; returns the observation the wait made once it was. A blocked
/// connection or a failure is reported here.
async fn wait_until_ready(
    ctx: &mut WorkflowContext<RolloutWorkflow>,
    twd: &TwdRef,
    build_id: &str,
    max_wait: Duration,
) -> Option<Box<Observation>> {
    let request = WaitForPollersRequest {
        twd: twd.clone(),
        build_id: build_id.to_owned(),
        max_wait_ms: i64::try_from(max_wait.as_millis()).unwrap_or(60_000),
        observe_when_ready: true,
    };
    let options = waits_queue(ctx, waiting_options(max_wait));
    let options = with_summary(options, "wait for pollers");
    let waiting = ctx.execute_activity(WaitForPollers, request, options);
    let waited = unless_signalled(ctx, waiting)
        .await
        .map(|outcome| outcome.map_err(|e| activity_failed("wait_for_pollers", &e)));
    match waited {
        Some(Ok(PollerWaitOutcome {
            blocked: Some(blocked),
            ..
        })) => {
            report(ctx, RolloutProgress::Blocked, Some(blocked), None).await;
            wait_for_change(ctx, BLOCKED_RECHECK).await;
            None
        }
        Some(Err(blocked)) => {
            on_failure(ctx, blocked).await;
            None
        }
        Some(Ok(PollerWaitOutcome { observation, .. })) => observation,
        None => None,
    }
}

/// Runs the gate (bounded wait), records its result in memory.
async fn run_gate(
    ctx: &mut WorkflowContext<RolloutWorkflow>,
    twd: &TwdRef,
    build_id: &str,
    observation: &Observation,
) {
    let Some(workflow_type) = observation
        .spec
        .as_ref()
        .and_then(|s| s.gate_workflow_type.clone())
    else {
        ctx.state_mut(|s| s.memory.gate = GateState::Passed);
        return;
    };
    let attempt = ctx.state(|s| s.gate_attempt);
    let request = GateRequest {
        twd: twd.clone(),
        build_id: build_id.to_owned(),
        workflow_type: workflow_type.clone(),
        attempt,
        max_wait_ms: i64::try_from(MAX_ACTIVITY_WAIT.as_millis()).unwrap_or(60_000),
        step: None,
    };
    let summary = format!("gate {workflow_type} (attempt {attempt})");
    let Some(outcome) = await_gate(ctx, request, &summary).await else {
        return;
    };
    let finished = !outcome.runs.is_empty() && outcome.runs.iter().all(|r| r.status != "Running");
    ctx.state_mut(|s| s.gate_runs = outcome.runs.clone());
    if outcome.passed {
        ctx.state_mut(|s| s.memory.gate = GateState::Passed);
        event(
            ctx,
            twd,
            EventKind::Normal,
            "GatePassed",
            format!("Gate {workflow_type} passed on build {build_id}"),
        )
        .await;
    } else if finished {
        let failed: Vec<String> = outcome
            .runs
            .iter()
            .filter(|r| r.status != "Completed")
            .map(|r| format!("{} on {}: {}", r.workflow_id, r.task_queue, r.status))
            .collect();
        let timed_out = outcome.runs.iter().any(|r| r.status == "TimedOut");
        if timed_out {
            // Stopped at the decision that follows, with its own Warning event.
            let message = failed.join("; ");
            ctx.state_mut(|s| s.memory.gate = GateState::TimedOut { message });
            return;
        }
        let message = format!(
            "Gate {workflow_type} failed on build {build_id}: {}",
            failed.join("; ")
        );
        ctx.state_mut(|s| {
            s.memory.gate = GateState::Failed {
                message: message.clone(),
            }
        });
        event(ctx, twd, EventKind::Warning, "GateFailed", message).await;
    }
}

/// Measures the analysis checks due in the step in force (one `run_analysis` activity, whose
/// result is the measurement record in the history) and records them; a check beyond its limit
/// stops the rollout at the next decision.
async fn analyze(
    ctx: &mut WorkflowContext<RolloutWorkflow>,
    twd: &TwdRef,
    build_id: &str,
    observation: &Observation,
    step: usize,
    due: &[String],
) {
    let Some((view, clock, current)) = analysis_context(observation) else {
        return;
    };
    let step_index = u32::try_from(step).unwrap_or(u32::MAX);
    ctx.state_mut(|s| s.memory.analysis.enter_step(step_index, clock));
    let checks: Vec<_> = view
        .checks
        .iter()
        .filter(|c| due.contains(&c.name))
        .cloned()
        .collect();
    let request = AnalysisRequest {
        twd: twd.clone(),
        build_id: build_id.to_owned(),
        current_build_id: current,
        window_start: clock,
        step: step_index,
        checks,
        gate_types: gate_types(observation),
    };
    let summary = format!("analysis step {} ({})", step + 1, due.join(", "));
    match run_activity(ctx, RunAnalysis, request, &summary, short_options()).await {
        Ok(result) => {
            let now = now_millis(ctx);
            ctx.state_mut(|s| {
                s.memory
                    .analysis
                    .record_measurements(&view, &result.measurements, now)
            });
            for measurement in &result.measurements {
                let dry_run = view
                    .checks
                    .iter()
                    .any(|c| c.name == measurement.check && c.dry_run);
                if measurement.verdict == Verdict::Failed {
                    let (kind, reason) = if dry_run {
                        (EventKind::Normal, "AnalysisDryRunFailed")
                    } else {
                        (EventKind::Warning, "AnalysisCheckFailed")
                    };
                    let message = format!(
                        "Check {} failed on build {build_id} in step {}: {}",
                        measurement.check,
                        step + 1,
                        measurement.message
                    );
                    event(ctx, twd, kind, reason, message).await;
                }
            }
        }
        Err(blocked) => on_failure(ctx, blocked).await,
    }
}

/// Runs the gate workflow of the step in force (pinned to the build) and records its result.
async fn run_step_gate(
    ctx: &mut WorkflowContext<RolloutWorkflow>,
    twd: &TwdRef,
    build_id: &str,
    observation: &Observation,
    step: usize,
) {
    let Some((view, clock, _)) = analysis_context(observation) else {
        return;
    };
    let Some(workflow_type) = view.step_gate(step).map(str::to_owned) else {
        return;
    };
    let step_index = u32::try_from(step).unwrap_or(u32::MAX);
    ctx.state_mut(|s| s.memory.analysis.enter_step(step_index, clock));
    let request = GateRequest {
        twd: twd.clone(),
        build_id: build_id.to_owned(),
        workflow_type: workflow_type.clone(),
        attempt: 1,
        max_wait_ms: i64::try_from(MAX_ACTIVITY_WAIT.as_millis()).unwrap_or(60_000),
        step: Some(StepGateRef {
            step: step_index,
            rollout_started_at: ctx.state(|s| s.memory.started_at),
        }),
    };
    let summary = format!("gate {workflow_type} of step {}", step + 1);
    let Some(outcome) = await_gate(ctx, request, &summary).await else {
        return;
    };
    let finished = !outcome.runs.is_empty() && outcome.runs.iter().all(|r| r.status != "Running");
    if outcome.passed {
        ctx.state_mut(|s| s.memory.analysis.record_gate(StepGate::Passed));
        event(
            ctx,
            twd,
            EventKind::Normal,
            "StepGatePassed",
            format!(
                "Gate {workflow_type} of step {} passed on build {build_id}",
                step + 1
            ),
        )
        .await;
    } else if finished {
        let failed: Vec<String> = outcome
            .runs
            .iter()
            .filter(|r| r.status != "Completed")
            .map(|r| {
                format!(
                    "{} {} on {}: {}",
                    workflow_type, r.workflow_id, r.task_queue, r.status
                )
            })
            .collect();
        let message = failed.join("; ");
        ctx.state_mut(|s| s.memory.analysis.record_gate(StepGate::Failed { message }));
    }
}

/// The analysis spec, the step clock and the Current build, when analysis applies now.
fn analysis_context(
    observation: &Observation,
) -> Option<(crate::model::AnalysisView, UnixMillis, Option<String>)> {
    let view = observation.spec.as_ref()?.analysis.clone()?;
    let temporal = observation.temporal.as_ref().ok()?;
    let clock = temporal.ramp_changed_at?;
    let current = temporal.current_build_id.clone().filter(|c| !c.is_empty());
    Some((view, clock, current))
}

/// Workflow types of the rollout's gates (never counted by a Temporal check).
fn gate_types(observation: &Observation) -> Vec<String> {
    let Some(spec) = observation.spec.as_ref() else {
        return Vec::new();
    };
    let mut types: Vec<String> = spec.gate_workflow_type.iter().cloned().collect();
    if let Some(view) = &spec.analysis {
        for gate in view.step_gates.iter().flatten() {
            if !types.contains(gate) {
                types.push(gate.clone());
            }
        }
    }
    types
}

/// `options` on the waits task queue.
fn waits_queue(
    ctx: &WorkflowContext<RolloutWorkflow>,
    mut options: ActivityOptions,
) -> ActivityOptions {
    options.task_queue = Some(crate::waits_task_queue(ctx.info().task_queue()));
    options
}

/// Runs `run_gate` unless a signal interrupts it; a failure or a blocked gate is reported here.
/// Returns the runs' outcome when the activity answered with one.
async fn await_gate(
    ctx: &mut WorkflowContext<RolloutWorkflow>,
    request: GateRequest,
    summary: &str,
) -> Option<crate::contract::GateOutcome> {
    let options = waits_queue(ctx, waiting_options(MAX_ACTIVITY_WAIT));
    let options = with_summary(options, summary);
    let running = ctx.execute_activity(RunGate, request, options);
    let outcome = unless_signalled(ctx, running)
        .await
        .map(|outcome| outcome.map_err(|e| activity_failed("run_gate", &e)));
    match outcome {
        None => None,
        Some(Err(blocked)) => {
            on_failure(ctx, blocked).await;
            None
        }
        Some(Ok(crate::contract::GateOutcome {
            blocked: Some(blocked),
            ..
        })) => {
            report(ctx, RolloutProgress::Blocked, Some(blocked), None).await;
            wait_for_change(ctx, BLOCKED_RECHECK).await;
            None
        }
        Some(Ok(outcome)) => Some(outcome),
    }
}

/// Performs a routing change; true when applied.
async fn route(
    ctx: &mut WorkflowContext<RolloutWorkflow>,
    twd: &TwdRef,
    observation: &Observation,
    change: RoutingChange,
    applied: Option<AppliedReport>,
) -> bool {
    let summary = match &change {
        RoutingChange::SetCurrent { build_id } => format!("set current {build_id}"),
        RoutingChange::SetRamping {
            build_id,
            percentage,
        } => format!("ramp {build_id} to {percentage}%"),
        RoutingChange::ClearRamp => "clear ramp".to_owned(),
    };
    let token = observation
        .temporal
        .as_ref()
        .ok()
        .map(|t| t.conflict_token.clone())
        .filter(|t| !t.is_empty());
    let request = RoutingRequest {
        twd: twd.clone(),
        change: change.clone(),
        conflict_token: token,
    };
    match run_activity(ctx, SetRouting, request, &summary, short_options()).await {
        Ok(RoutingOutcome::Applied) => {
            let routing = routing_after(observation, &change);
            // Complete only when nothing else is left ramping (a ramp of another build is
            // cleared by the next turn first).
            let applied = applied.filter(|(progress, _)| {
                *progress != RolloutProgress::Complete || routing.ramping_build_id.is_none()
            });
            if let Some((progress, ramp)) = applied {
                send_report(ctx, progress, None, ramp, Some(routing), None).await;
            }
            let (reason, message) = match &change {
                RoutingChange::SetCurrent { build_id }
                    if ctx.state(|s| s.memory.promote_requested) =>
                {
                    (
                        "PromotedByOperator",
                        format!(
                            "Build {build_id} is now Current (promoted by an operator; remaining steps and pauses skipped)"
                        ),
                    )
                }
                RoutingChange::SetCurrent { build_id } => {
                    ("Promoted", format!("Build {build_id} is now Current"))
                }
                RoutingChange::SetRamping {
                    build_id,
                    percentage,
                } => (
                    "Ramped",
                    format!("Build {build_id} ramped to {percentage}%"),
                ),
                RoutingChange::ClearRamp => {
                    ("RampCleared", "Cleared the ramping version".to_owned())
                }
            };
            event(ctx, twd, EventKind::Normal, reason, message).await;
            true
        }
        Ok(RoutingOutcome::Conflict) => false,
        Err(blocked) => {
            on_failure(ctx, blocked).await;
            false
        }
        Ok(RoutingOutcome::Blocked(blocked)) => {
            event(
                ctx,
                twd,
                EventKind::Warning,
                blocked.reason.as_str(),
                blocked.message.clone(),
            )
            .await;
            report(ctx, RolloutProgress::Blocked, Some(blocked), None).await;
            wait_for_change(ctx, BLOCKED_RECHECK).await;
            false
        }
    }
}

/// The end of a rollout whose build is Current (reported as such): the event and the outcome.
async fn complete(
    ctx: &mut WorkflowContext<RolloutWorkflow>,
    twd: &TwdRef,
    build_id: &str,
) -> WorkflowResult<RolloutOutcome> {
    event(
        ctx,
        twd,
        EventKind::Normal,
        "RolloutComplete",
        format!("Build {build_id} is Current"),
    )
    .await;
    set_outcome(ctx, "Complete");
    Ok(RolloutOutcome::Complete)
}

/// What a rollout reports once a routing write it made is applied: its
/// progress and step.
type AppliedReport = (
    RolloutProgress,
    Option<(usize, Option<u8>, Option<UnixMillis>)>,
);

/// Routing as `change` leaves the routing of `observation` (Temporal clears a ramp when the
/// ramping build becomes Current; another ramping build keeps its ramp).
fn routing_after(observation: &Observation, change: &RoutingChange) -> AppliedRouting {
    let (current, ramping, percentage) = AppliedRouting::read_in(observation)
        .map(|r| (r.current_build_id, r.ramping_build_id, r.ramp_percentage))
        .unwrap_or_default();
    match change {
        RoutingChange::SetCurrent { build_id } => {
            let ramp_stays = ramping.as_ref().is_some_and(|r| r != build_id);
            AppliedRouting {
                current_build_id: Some(build_id.clone()),
                ramping_build_id: ramping.filter(|_| ramp_stays),
                ramp_percentage: percentage.filter(|_| ramp_stays),
            }
        }
        RoutingChange::SetRamping {
            build_id,
            percentage,
        } => AppliedRouting {
            current_build_id: current,
            ramping_build_id: Some(build_id.clone()),
            ramp_percentage: Some(*percentage),
        },
        RoutingChange::ClearRamp => AppliedRouting {
            current_build_id: current,
            ramping_build_id: None,
            ramp_percentage: None,
        },
    }
}

/// Abort: routing back to the previous Current (this build's ramp is cleared, re-reading and
/// retrying on a conflict), gates cancelled, report, end. The TWD workflow then retires the
/// build like any other non-current version (drain, scale down, delete), so pinned workflows
/// that started on it during the ramp can still finish.
async fn abort(
    ctx: &mut WorkflowContext<RolloutWorkflow>,
    twd: &TwdRef,
    build_id: &str,
    observation: &Observation,
    failed_analysis: Option<Blocked>,
) -> WorkflowResult<RolloutOutcome> {
    cancel_gates(ctx, twd, build_id).await;
    let mut observation = observation.clone();
    for _ in 0..ABORT_ROUTING_ATTEMPTS {
        let ramping = observation
            .temporal
            .as_ref()
            .is_ok_and(|t| t.ramping_build_id.as_deref() == Some(build_id));
        if !ramping || route(ctx, twd, &observation, RoutingChange::ClearRamp, None).await {
            break;
        }
        match observe(ctx, twd).await {
            Ok(fresh) => observation = fresh,
            Err(_) => wait_for_change(ctx, BLOCKED_RECHECK).await,
        }
    }
    let current = observation
        .temporal
        .as_ref()
        .ok()
        .and_then(|t| t.current_build_id.clone())
        .filter(|c| !c.is_empty() && c != build_id);
    let routing = match current {
        Some(current) => format!("new workflows go to build {current}"),
        None => "new workflows go to unversioned workers".to_owned(),
    };
    match failed_analysis {
        Some(blocked) => {
            let message = format!("{} Routing: {routing}.", blocked.message);
            event(
                ctx,
                twd,
                EventKind::Warning,
                blocked.reason.as_str(),
                message.clone(),
            )
            .await;
            let blocked = Blocked { message, ..blocked };
            report(ctx, RolloutProgress::Aborted, Some(blocked), None).await;
        }
        None => {
            event(
                ctx,
                twd,
                EventKind::Normal,
                "Aborted",
                format!("Rollout of build {build_id} aborted by an operator: {routing}; build {build_id} is retired"),
            )
            .await;
            report(ctx, RolloutProgress::Aborted, None, None).await;
        }
    }
    set_outcome(ctx, "Aborted");
    Ok(RolloutOutcome::Aborted)
}

/// Stops the build's gate workflows that may still run: those last seen running, and any a gate
/// not yet decided may have started (a `run_gate` interrupted by a signal reports no runs).
async fn cancel_gates(ctx: &mut WorkflowContext<RolloutWorkflow>, twd: &TwdRef, build_id: &str) {
    let running = ctx.state(|s| s.gate_runs.iter().any(|r| r.status == "Running"));
    let undecided = ctx.state(|s| s.memory.gate == GateState::NotRun);
    // A step gate may be running (only rollouts with analysis have a step in their records).
    let step_gate = ctx
        .state(|s| s.memory.analysis.step.is_some() && s.memory.analysis.gate == StepGate::NotRun);
    if running || step_gate || undecided {
        let request = BuildRequest {
            twd: twd.clone(),
            build_id: build_id.to_owned(),
            version_limit: None,
        };
        let _ = run_activity(
            ctx,
            CancelGates,
            request,
            "cancel gate workflows",
            short_options(),
        )
        .await;
    }
}

/// The first step of a fresh rollout: its build's Deployment is created
/// together with its first report, in one workflow task, before anything is observed. Only a
/// creation is acted on here; anything else (exists, superseded, blocked, deferred for the
/// version limit, failed) is left to the first observation, which decides as before.
async fn create_first(ctx: &mut WorkflowContext<RolloutWorkflow>, twd: &TwdRef, build_id: &str) {
    let request = BuildRequest::create_before_observing(twd, build_id);
    let options = with_summary(short_options(), "create Deployment");
    let creating = ctx.execute_activity(CreateDeployment, request, options);
    let reporting = report(ctx, RolloutProgress::WaitingForPollers, None, None);
    let (created, ()) = join!(creating, reporting);
    if let Some(message) = created.ok().and_then(|c| c.created_message(build_id)) {
        let reason = CreateDeploymentOutcome::CREATED_REASON;
        event(ctx, twd, EventKind::Normal, reason, message).await;
    }
}

/// Sends a report to the TWD workflow when anything in it changed.
async fn report(
    ctx: &WorkflowContext<RolloutWorkflow>,
    progress: RolloutProgress,
    blocked: Option<Blocked>,
    ramp: Option<(usize, Option<u8>, Option<UnixMillis>)>,
) {
    send_report(ctx, progress, blocked, ramp, None, None).await;
}

/// [`report`], with the routing just written when there is one, and a message of its own when
/// the decision has one. A report that differs from the last one only in its routing is not
/// sent again.
async fn send_report(
    ctx: &WorkflowContext<RolloutWorkflow>,
    progress: RolloutProgress,
    blocked: Option<Blocked>,
    ramp: Option<(usize, Option<u8>, Option<UnixMillis>)>,
    routing: Option<AppliedRouting>,
    message: Option<String>,
) {
    let info = ctx.info();
    let (workflow_id, run_id) = (info.workflow_id().to_owned(), info.run_id().to_owned());
    let message = message.unwrap_or_else(|| report_message(ctx, progress, blocked.as_ref(), ramp));
    let candidate = ctx.state(|s| RolloutReport {
        build_id: s.input.build_id.clone(),
        workflow_id,
        run_id,
        progress,
        step: ramp.map(|(step, _, _)| u32::try_from(step).unwrap_or(u32::MAX)),
        ramp_percentage: ramp.and_then(|(_, pct, _)| pct),
        next_step_at: ramp.and_then(|(_, _, until)| until),
        control: Some(ControlState {
            build_id: s.input.build_id.clone(),
            progress: Some(progress),
            blocked: blocked.as_ref().map(|b| b.reason),
            operator_paused: s.memory.pause_requested,
            spec_paused: s.spec_paused,
            promote_requested: s.memory.promote_requested,
        }),
        blocked,
        message,
        started_at: s.memory.started_at,
        gate_runs: s.gate_runs.clone(),
        analysis: s.memory.analysis.status(),
        sequence: s.sequence + 1,
        routing,
    });
    let unchanged = ctx.state(|s| {
        s.last_report.as_ref().is_some_and(|last| {
            RolloutReport {
                sequence: candidate.sequence,
                routing: candidate.routing.clone(),
                ..last.clone()
            } == candidate
        })
    });
    if unchanged {
        return;
    }
    ctx.state_mut(|s| {
        s.sequence += 1;
        s.last_report = Some(candidate.clone());
    });
    let parent = ctx.state(|s| s.input.twd.twd_workflow_id());
    // The TWD workflow may be gone (TWD deleted); a failed report changes nothing here.
    let _ = ctx
        .external_workflow(parent, None)
        .signal(
            TwdWorkflow::rollout_update,
            candidate,
            support::signal_options(),
        )
        .await;
}

fn report_message(
    ctx: &WorkflowContext<RolloutWorkflow>,
    progress: RolloutProgress,
    blocked: Option<&Blocked>,
    ramp: Option<(usize, Option<u8>, Option<UnixMillis>)>,
) -> String {
    let build = ctx.state(|s| s.input.build_id.clone());
    if let Some(blocked) = blocked {
        return blocked.message.clone();
    }
    match progress {
        RolloutProgress::WaitingForPollers => {
            format!("Waiting for workers of build {build} to poll and become available")
        }
        RolloutProgress::WaitingForPromotion => {
            if ctx.state(|s| s.memory.gate == GateState::NotRun) {
                format!("Build {build} is registered; running its gate")
            } else {
                format!("Build {build} is registered and waiting for promotion")
            }
        }
        RolloutProgress::WaitingForAvailability => {
            format!("Build {build} was Available and is not now; the rollout holds until it is")
        }
        RolloutProgress::Ramping => match ramp {
            Some((step, Some(pct), _)) => {
                format!("Build {build} ramping at {pct}% (step {})", step + 1)
            }
            _ => format!("Build {build} is ramping"),
        },
        RolloutProgress::Complete => format!("Build {build} is Current"),
        RolloutProgress::Blocked => format!("Rollout of build {build} is blocked"),
        RolloutProgress::Paused => format!("Rollout of build {build} is paused"),
        RolloutProgress::Superseded => format!("Build {build} was superseded by a newer build"),
        RolloutProgress::Aborted => format!("Rollout of build {build} was aborted"),
    }
}

async fn event(
    ctx: &mut WorkflowContext<RolloutWorkflow>,
    twd: &TwdRef,
    kind: EventKind,
    reason: &str,
    message: String,
) {
    let request = EventRequest {
        twd: twd.clone(),
        kind,
        reason: reason.to_owned(),
        message,
    };
    let _ = run_activity(
        ctx,
        EmitEvent,
        request,
        &format!("event {reason}"),
        short_options(),
    )
    .await;
}

/// Whether the run has reached [`RUN_EVENT_BOUND`](crate::RUN_EVENT_BOUND) events
/// (`short-rollout-runs`; asked only once it has, so shorter runs record no marker).
fn past_run_bound(ctx: &WorkflowContext<RolloutWorkflow>) -> bool {
    ctx.history_length() >= crate::RUN_EVENT_BOUND && ctx.patched(PATCH_SHORT_ROLLOUT_RUNS)
}

fn set_outcome(ctx: &mut WorkflowContext<RolloutWorkflow>, outcome: &str) {
    if search_attributes_on(ctx) {
        ctx.upsert_search_attributes([SA_OUTCOME.value_set(outcome.to_owned())]);
    }
}

/// Waits until a signal arrives (a watched Deployment change included) or `timeout` passes.
async fn wait_for_change(ctx: &mut WorkflowContext<RolloutWorkflow>, timeout: Duration) {
    let seen = ctx.state(|s| (s.observed_wakeups, s.observed_deployment_changes));
    let timer = ctx.timer(support::timer(timeout));
    let changed = move |s: &RolloutWorkflow| (s.wakeups, s.deployment_changes) != seen;
    let _ = support::unless(ctx, timer, changed, |_| true).await;
}

/// Holds until something that can change the decision happens, `due` passes (a step's end,
/// an analysis interval), or the resync interval passes, whichever is first.
async fn hold(ctx: &mut WorkflowContext<RolloutWorkflow>, due: Option<Duration>) {
    let resync = ctx.state(RolloutWorkflow::resync);
    wait_for_change(ctx, due.map_or(resync, |due| due.min(resync))).await;
}

/// Waits for `future` (a timer or an activity) unless a signal arrives first (counted from the
/// turn's observation, so none that came in meanwhile is missed); then it is cancelled and
/// `None` is returned.
async fn unless_signalled<F>(ctx: &WorkflowContext<RolloutWorkflow>, future: F) -> Option<F::Output>
where
    F: CancellableFuture,
{
    let seen = ctx.state(|s| s.observed_wakeups);
    support::unless(
        ctx,
        future,
        move |s: &RolloutWorkflow| s.wakeups != seen,
        |_| true,
    )
    .await
}

/// An activity failed after its retries: a transient error (expected conditions come back as
/// values). It is reported (`PlanExecutionFailed` with the cause) only once failures have
/// lasted [`TRANSIENT_GRACE`]; until then the rollout looks again soon, so a short outage of the
/// API server or of Temporal changes no condition.
async fn on_failure(ctx: &mut WorkflowContext<RolloutWorkflow>, blocked: Blocked) {
    let now = now_millis(ctx);
    let since = ctx.state_mut(|s| *s.failing_since.get_or_insert(now));
    if now - since < i64::try_from(TRANSIENT_GRACE.as_millis()).unwrap_or(i64::MAX) {
        wait_for_change(ctx, TRANSIENT_RECHECK).await;
        return;
    }
    report(ctx, RolloutProgress::Blocked, Some(blocked), None).await;
    wait_for_change(ctx, BLOCKED_RECHECK).await;
}

/// Index of the Progressive step a live ramp percentage belongs to.
fn step_of(observation: &Observation, percentage: u8) -> usize {
    observation
        .spec
        .as_ref()
        .and_then(|s| {
            s.steps
                .iter()
                .rposition(|step| step.ramp_percentage <= percentage)
        })
        .unwrap_or(0)
}

fn ramp_of(observation: &Observation, build_id: &str) -> Option<u8> {
    let routing = AppliedRouting::read_in(observation)?;
    if routing.ramping_build_id.as_deref() != Some(build_id) {
        return None;
    }
    routing.ramp_percentage
}

#[cfg(test)]
mod tests {
    use twc_crds::worker_deployment::RolloutStrategy;

    use twc_crds::worker_deployment::VersionState;

    use super::*;
    use crate::model::TemporalState;
    use crate::plan::fixtures::{
        NEW, OLD, deployment, observation, secs, spec, temporal_with_old_current,
    };

    #[test]
    fn a_continued_run_starts_from_everything_the_run_before_it_decided_from() {
        let input = RolloutInput {
            twd: TwdRef {
                namespace: "demo".into(),
                name: "hello".into(),
            },
            build_id: NEW.into(),
            history_event_bound: Some(100),
            carried: None,
            created_by_parent: true,
            resync_seconds: Some(60),
        };
        let mut first = RolloutWorkflow::starting(input, secs(10));
        first.spec_paused = true;
        first.memory.pause_requested = true;
        first.memory.progress.available_at = Some(secs(20));
        first.memory.held.held_since = Some(secs(30));
        first.gate_attempt = 2;
        first.sequence = 7;
        first.failing_since = Some(secs(40));
        first.push_control(ControlAction::Resume);

        let next = RolloutWorkflow::starting(first.continued_input(), secs(5_000));
        // Controls are answered as the run before would have, before any observation.
        assert_eq!(next.control_view(), first.control_view());
        assert!(next.control_view().spec_paused);
        assert_eq!(next.memory, first.memory);
        // The carried control is still to be handled.
        assert_eq!(next.wakeups, 1);
        assert_eq!(next.first_started_at, secs(10), "the rollout's start");
        assert_eq!(next.memory.started_at, secs(10));
        // And it would carry the same again.
        assert_eq!(next.continued_input(), first.continued_input());
    }

    #[test]
    fn routing_after_a_write_is_what_temporal_then_routes() {
        let current = |build: &str| RoutingChange::SetCurrent {
            build_id: build.into(),
        };
        let ramp = |build: &str, percentage: u8| RoutingChange::SetRamping {
            build_id: build.into(),
            percentage,
        };
        let routing =
            |current: Option<&str>, ramping: Option<&str>, percentage: Option<u8>| AppliedRouting {
                current_build_id: current.map(str::to_owned),
                ramping_build_id: ramping.map(str::to_owned),
                ramp_percentage: percentage,
            };
        let mut ramping_new = temporal_with_old_current();
        ramping_new.ramping_build_id = Some(NEW.into());
        ramping_new.ramp_percentage = Some(25.0);
        let mut ramping_other = ramping_new.clone();
        ramping_other.ramping_build_id = Some("v9-other".into());
        let cases: Vec<(&str, TemporalState, RoutingChange, AppliedRouting)> = vec![
            (
                "ramp from nothing",
                temporal_with_old_current(),
                ramp(NEW, 10),
                routing(Some(OLD), Some(NEW), Some(10)),
            ),
            (
                "next step",
                ramping_new.clone(),
                ramp(NEW, 50),
                routing(Some(OLD), Some(NEW), Some(50)),
            ),
            (
                "promotion clears the build's own ramp",
                ramping_new.clone(),
                current(NEW),
                routing(Some(NEW), None, None),
            ),
            (
                "another build's ramp stays",
                ramping_other,
                current(NEW),
                routing(Some(NEW), Some("v9-other"), Some(25)),
            ),
            (
                "clear ramp",
                ramping_new,
                RoutingChange::ClearRamp,
                routing(Some(OLD), None, None),
            ),
        ];
        for (name, temporal, change, expected) in cases {
            let observed = observation(
                spec(RolloutStrategy::Progressive),
                vec![deployment(OLD), deployment(NEW)],
                temporal,
            );
            let after = routing_after(&observed, &change);
            assert_eq!(after, expected, "{name}");
            // The observation the TWD workflow shows then reads the same routing.
            let shown = after.applied_to(&observed).expect("managed and readable");
            let t = shown.temporal.as_ref().expect("readable");
            assert_eq!(t.current_build_id, expected.current_build_id, "{name}");
            assert_eq!(t.ramping_build_id, expected.ramping_build_id, "{name}");
            assert_eq!(
                t.ramp_percentage,
                expected.ramp_percentage.map(f32::from),
                "{name}"
            );
            assert_eq!(shown.deployments, observed.deployments, "{name}");
            let state = |build: &str| t.version(build).map(|v| v.state);
            if let Some(current) = &expected.current_build_id {
                assert_eq!(state(current), Some(VersionState::Current), "{name}");
            }
            if let Some(ramping) = &expected.ramping_build_id {
                assert_eq!(state(ramping), Some(VersionState::Ramping), "{name}");
            }
        }
        // Nothing shown before anybody managed the deployment (the write claimed it) or while
        // Temporal was unreadable.
        let mut unmanaged = temporal_with_old_current();
        unmanaged.manager_identity.clear();
        let observed = observation(spec(RolloutStrategy::AllAtOnce), vec![], unmanaged);
        let routing = routing_after(&observed, &current(NEW));
        assert_eq!(routing.applied_to(&observed), None);
        let mut unreadable = observed.clone();
        unreadable.temporal = Err(Blocked {
            reason: BlockReason::TemporalStateFetchFailed,
            message: "down".into(),
        });
        assert_eq!(routing.applied_to(&unreadable), None);
        // The build that left routing drains; a build Temporal had not listed is added.
        let observed = observation(
            spec(RolloutStrategy::AllAtOnce),
            vec![],
            temporal_with_old_current(),
        );
        let shown = routing_after(&observed, &current(NEW))
            .applied_to(&observed)
            .expect("managed and readable");
        let t = shown.temporal.as_ref().expect("readable");
        assert_eq!(
            t.version(OLD).map(|v| v.state),
            Some(VersionState::Draining)
        );
        assert_eq!(t.version(NEW).map(|v| v.state), Some(VersionState::Current));
    }
}
