//! Helpers both engine workflows use: running an activity with a summary for the Web UI and
//! its failure as `PlanExecutionFailed`, the activity options, workflow time, and the history
//! bound after which a workflow continues as new.

use std::time::Duration;

use temporalio_sdk::{ActivityOptions, WorkflowContext};

use crate::model::{BlockReason, Blocked, UnixMillis};

/// Runs an activity; a failure after its retries becomes `PlanExecutionFailed`.
pub(crate) async fn run_activity<W, A>(
    ctx: &mut WorkflowContext<W>,
    activity: A,
    input: A::Input,
    summary: &str,
    options: ActivityOptions,
) -> Result<A::Output, Blocked>
where
    A: temporalio_common::ActivityDefinition,
    A::Output: temporalio_common::data_converters::TemporalDeserializable,
{
    let name = activity.name().to_owned();
    let options = with_summary(options, summary);
    ctx.execute_activity(activity, input, options)
        .await
        .map_err(|e| activity_failed(&name, &e))
}

pub(crate) fn with_summary(mut options: ActivityOptions, summary: &str) -> ActivityOptions {
    options.summary = Some(summary.to_owned());
    options
}

pub(crate) fn activity_failed(name: &str, error: &dyn std::fmt::Display) -> Blocked {
    Blocked {
        reason: BlockReason::PlanExecutionFailed,
        message: format!("activity {name} failed: {error}"),
    }
}

/// Options for quick activities: a few retries with backoff (about 20 s in all), then the
/// workflow decides. Activities heartbeat every second, so one whose worker died (a killed
/// controller) is retried on another after [`HEARTBEAT_TIMEOUT`], not after its 60 s.
pub(crate) fn short_options() -> ActivityOptions {
    let retry = temporalio_common::RetryPolicy::builder()
        .initial_interval(Duration::from_millis(500))
        .maximum_interval(Duration::from_secs(5))
        .maximum_attempts(6)
        .build();
    ActivityOptions::with_start_to_close_timeout(Duration::from_secs(60))
        .heartbeat_timeout(HEARTBEAT_TIMEOUT)
        .retry_policy(retry)
        .build()
}

/// Longest silence of a running activity before Temporal retries it elsewhere.
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(5);

/// Options for activities that wait up to `max_wait` while heartbeating.
pub(crate) fn waiting_options(max_wait: Duration) -> ActivityOptions {
    let retry = temporalio_common::RetryPolicy::builder()
        .initial_interval(Duration::from_secs(1))
        .maximum_interval(Duration::from_secs(10))
        .maximum_attempts(3)
        .build();
    ActivityOptions::with_start_to_close_timeout(max_wait + Duration::from_secs(60))
        .heartbeat_timeout(HEARTBEAT_TIMEOUT)
        .retry_policy(retry)
        .build()
}

/// Whether the workflow should continue as new now: Temporal suggests it (its history is
/// large), or the history reached `bound` events (default [`crate::DEFAULT_HISTORY_EVENT_BOUND`]).
pub(crate) fn history_full<W>(ctx: &WorkflowContext<W>, bound: Option<u32>) -> bool {
    ctx.continue_as_new_suggested()
        || ctx.history_length() >= bound.unwrap_or(crate::DEFAULT_HISTORY_EVENT_BOUND)
}

/// Workflow time in Unix milliseconds (deterministic: recorded in history).
pub(crate) fn now_millis<W>(ctx: &WorkflowContext<W>) -> UnixMillis {
    millis(ctx.workflow_time())
}

/// Options of a drain step: a batch over many workflows may take minutes (it heartbeats).
pub(crate) fn drain_options() -> ActivityOptions {
    let retry = temporalio_common::RetryPolicy::builder()
        .initial_interval(Duration::from_secs(1))
        .maximum_interval(Duration::from_secs(10))
        .maximum_attempts(5)
        .build();
    ActivityOptions::with_start_to_close_timeout(Duration::from_secs(3600))
        .heartbeat_timeout(HEARTBEAT_TIMEOUT)
        .retry_policy(retry)
        .build()
}

pub(crate) fn millis(time: Option<std::time::SystemTime>) -> UnixMillis {
    time.and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
