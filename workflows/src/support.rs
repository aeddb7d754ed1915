//! Helpers both engine workflows use: running an activity with a summary for the Web UI and
//! its failure as `PlanExecutionFailed`, the activity options, workflow time, and the history
//! bound after which a workflow continues as new.

use std::time::Duration;

use temporalio_sdk::workflows::select;
use temporalio_sdk::{
    ActivityOptions, CancellableFuture, LocalActivityOptions, SignalWorkflowOptions, TimerOptions,
    WaitConditionOptions, WorkflowCancellationToken, WorkflowContext,
};

use crate::model::{BlockReason, Blocked, UnixMillis};

/// The `twd` workflow cancels a wait's timer that a signal beat (since v0.1.0; see
/// `CHANGELOG.md`).
pub(crate) const PATCH_CANCEL_BEATEN_TIMERS: &str = "cancel-beaten-timers";
/// The `twd` workflow shows the reports a rollout sent before its start was recorded (they
/// arrive in the same workflow task as the start's result, and are handed over first) instead
/// of dropping them (since v0.1.0; see `CHANGELOG.md`).
pub(crate) const PATCH_KEEP_EARLY_REPORTS: &str = "keep-early-reports";
/// The `twd` workflow notes when it started a rollout, and its status names that rollout
/// (workflow ID, start) and shows it waiting for pollers until its first report, instead of
/// deriving a `WaitingForPromotion` from a build Temporal already holds (since v0.1.0; see
/// `CHANGELOG.md`).
pub(crate) const PATCH_SHOW_STARTING_ROLLOUT: &str = "show-starting-rollout";

/// The `twd` workflow continues as new after [`RUN_EVENT_BOUND`](crate::RUN_EVENT_BOUND)
/// history events instead of 500 turns, so a cached run holds a short history (since v0.1.0;
/// see `CHANGELOG.md`).
pub(crate) const PATCH_SHORT_RUNS: &str = "short-runs";

/// The `twd` workflow continues as new once the rollout it worked on has ended, and the next
/// run's first turn waits for the resync the previous run would have taken, so an idle TWD's
/// cached run holds the few events of its resyncs (since v0.1.0; see `CHANGELOG.md`).
pub(crate) const PATCH_SETTLED_RUNS: &str = "settled-runs";

/// The `rollout` workflow continues as new at the same bound as the `twd` workflow's runs
/// ([`RUN_EVENT_BOUND`](crate::RUN_EVENT_BOUND)), not only at
/// `--history-event-bound` or Temporal's suggestion (since v0.1.0; see `CHANGELOG.md`).
pub(crate) const PATCH_SHORT_ROLLOUT_RUNS: &str = "short-rollout-runs";

/// Waits for `future` (a timer or an activity) unless `woken` comes to hold first; then the
/// future is cancelled when `cancel` says so, and `None` is returned.
///
/// temporalio-workflow 1.1.1 does not cancel a future that is dropped: a dropped timer still
/// fires when it is due, a `TimerFired` and a workflow task for nothing (and one per signal
/// that woke a wait). `cancel` is asked only when the future was beaten, so a workflow whose
/// older histories did not cancel can say whether this history does (a patch).
pub(crate) async fn unless<W, F>(
    ctx: &WorkflowContext<W>,
    future: F,
    woken: impl FnMut(&W) -> bool,
    cancel: impl FnOnce(&WorkflowContext<W>) -> bool,
) -> Option<F::Output>
where
    F: CancellableFuture,
{
    let mut future = std::pin::pin!(future);
    let finished = select! {
        output = future.as_mut() => Some(output),
        _ = ctx.wait_condition_with_options(woken, condition_options()) => None,
    };
    if finished.is_none() && cancel(ctx) {
        future.as_ref().get_ref().cancel();
        let _ = future.await;
    }
    finished
}

/// Runs an activity; a failure after its retries becomes `PlanExecutionFailed`.
pub(crate) async fn run_activity<W, A>(
    ctx: &WorkflowContext<W>,
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

/// Runs a quick read as a local activity (in this worker, recorded as one marker in the
/// history instead of an activity's three events and a second workflow task), with the retries
/// of [`short_options`]; a failure after them becomes `PlanExecutionFailed`.
pub(crate) async fn run_local_activity<W, A>(
    ctx: &WorkflowContext<W>,
    activity: A,
    input: A::Input,
    summary: &str,
) -> Result<A::Output, Blocked>
where
    A: temporalio_common::ActivityDefinition,
    A::Output: temporalio_common::data_converters::TemporalDeserializable,
{
    let name = activity.name().to_owned();
    ctx.execute_local_activity(activity, input, local_options(summary))
        .await
        .map_err(|e| activity_failed(&name, &e))
}

/// Options of a local activity: [`short_options`]' retries and timeout, its own cancellation
/// token ([`own_token`]).
fn local_options(summary: &str) -> LocalActivityOptions {
    LocalActivityOptions::builder()
        .retry_policy(short_retry())
        .start_to_close_timeout(Duration::from_secs(60))
        .schedule_to_close_timeout(Duration::from_secs(120))
        .cancellation_token(own_token())
        .summary(summary.to_owned())
        .build()
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

/// A cancellation token for one timer, activity, child workflow, signal or condition, detached
/// from the workflow's own token.
///
/// temporalio-workflow 1.1.1 registers every such operation with the workflow's token unless the
/// options carry a token, and removes the registration only when the operation completes. The
/// registration holds the workflow's context, which holds the token: an operation dropped before
/// it completes (a timer a signal interrupted, and every pending operation when the run leaves
/// the worker's cache) keeps the run's whole context in memory until the process exits. With
/// an idle fleet of 1,000 TWDs that was ~100 MiB of the controller's heap after 30 minutes, and
/// it grows with every eviction (BENCHMARKS.md, "Controller memory"). A token of its own is
/// dropped with the operation, and the registration with it.
///
/// The operations no longer follow a cancel request of the workflow itself: twc never cancels
/// its own workflows (a rollout is stopped with `abort`, a TWD's workflow ends with the TWD),
/// and the commands a workflow sends are unchanged, so recorded histories replay as before.
pub(crate) fn own_token() -> WorkflowCancellationToken {
    WorkflowCancellationToken::new()
}

/// A timer with its own cancellation token ([`own_token`]).
pub(crate) fn timer(duration: Duration) -> TimerOptions {
    TimerOptions::builder(duration)
        .cancellation_token(own_token())
        .build()
}

/// Options of a signal to another workflow, with its own cancellation token ([`own_token`]).
pub(crate) fn signal_options() -> SignalWorkflowOptions {
    SignalWorkflowOptions::builder()
        .cancellation_token(own_token())
        .build()
}

/// Options of a wait for a condition, with its own cancellation token ([`own_token`]).
pub(crate) fn condition_options() -> WaitConditionOptions {
    WaitConditionOptions::builder()
        .cancellation_token(own_token())
        .build()
}

/// Options for quick activities: a few retries with backoff (about 20 s in all), then the
/// workflow decides. Activities heartbeat every second, so one whose worker died (a killed
/// controller) is retried on another after [`HEARTBEAT_TIMEOUT`], not after its 60 s.
pub(crate) fn short_options() -> ActivityOptions {
    ActivityOptions::with_start_to_close_timeout(Duration::from_secs(60))
        .heartbeat_timeout(HEARTBEAT_TIMEOUT)
        .retry_policy(short_retry())
        .cancellation_token(own_token())
        .build()
}

/// A few retries with backoff (about 20 s in all).
fn short_retry() -> temporalio_common::RetryPolicy {
    temporalio_common::RetryPolicy::builder()
        .initial_interval(Duration::from_millis(500))
        .maximum_interval(Duration::from_secs(5))
        .maximum_attempts(6)
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
        .cancellation_token(own_token())
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
/// The replay check: its Job's timeout plus two minutes to start it and read its verdict; a
/// retried attempt waits for the same Job.
pub(crate) fn replay_options(job_timeout_seconds: i64) -> ActivityOptions {
    let retry = temporalio_common::RetryPolicy::builder()
        .initial_interval(Duration::from_secs(1))
        .maximum_interval(Duration::from_secs(10))
        .maximum_attempts(5)
        .build();
    let job = Duration::from_secs(u64::try_from(job_timeout_seconds).unwrap_or(600));
    ActivityOptions::with_start_to_close_timeout(job + Duration::from_secs(120))
        .heartbeat_timeout(HEARTBEAT_TIMEOUT)
        .retry_policy(retry)
        .cancellation_token(own_token())
        .build()
}

pub(crate) fn drain_options() -> ActivityOptions {
    let retry = temporalio_common::RetryPolicy::builder()
        .initial_interval(Duration::from_secs(1))
        .maximum_interval(Duration::from_secs(10))
        .maximum_attempts(5)
        .build();
    ActivityOptions::with_start_to_close_timeout(Duration::from_secs(3600))
        .heartbeat_timeout(HEARTBEAT_TIMEOUT)
        .retry_policy(retry)
        .cancellation_token(own_token())
        .build()
}

pub(crate) fn millis(time: Option<std::time::SystemTime>) -> UnixMillis {
    time.and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use std::rc::{Rc, Weak};
    use std::task::{Context, Poll};

    use temporalio_sdk::BaseWorkflowContext;
    use temporalio_workflow::__private::sdk::{WorkflowHost, WorkflowInit};
    use temporalio_workflow::common::data_converters::DataConverter;
    use temporalio_workflow::common::protos::coresdk::{
        workflow_activation::InitializeWorkflow, workflow_commands::WorkflowCommand,
    };

    use super::*;

    /// Takes the commands of a workflow context built outside a worker.
    struct Host;

    impl WorkflowHost for Host {
        fn set_current_details(&self, _details: String) {}
        fn push_command(&self, _command: WorkflowCommand) {}
    }

    /// Starts a timer with `options` in a fresh workflow context, drops the timer before it
    /// fires (as a signal that ends a wait, or an eviction, does), drops the context, and
    /// returns a weak reference to what the context held: alive afterwards means the context
    /// was never freed.
    fn context_after_a_dropped_timer(options: TimerOptions) -> Weak<dyn WorkflowHost> {
        let host: Rc<dyn WorkflowHost> = Rc::new(Host);
        let held = Rc::downgrade(&host);
        let ctx = BaseWorkflowContext::from_raw(
            WorkflowInit {
                namespace: "default".to_owned(),
                task_queue: "twc-engine".to_owned(),
                run_id: "run".to_owned(),
                initialize_workflow: InitializeWorkflow::default(),
            },
            DataConverter::default(),
            host,
            None,
            Vec::new(),
        );
        let mut timer = Box::pin(ctx.timer(options));
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(matches!(timer.as_mut().poll(&mut cx), Poll::Pending));
        drop(timer);
        drop(ctx);
        held
    }

    /// The SDK's leak this works around: a timer on the workflow's own token, dropped before it
    /// fires, keeps the workflow's context alive for good. When this fails, the SDK no longer
    /// leaks and [`own_token`] can go.
    #[test]
    fn a_dropped_timer_on_the_workflow_s_token_keeps_its_context_alive() {
        let held = context_after_a_dropped_timer(TimerOptions::from(Duration::from_secs(300)));
        assert!(held.upgrade().is_some(), "the context was freed");
    }

    #[test]
    fn a_dropped_timer_on_its_own_token_frees_its_context() {
        let held = context_after_a_dropped_timer(timer(Duration::from_secs(300)));
        assert!(held.upgrade().is_none(), "the context is still alive");
    }

    /// Every kind of operation the workflows start carries a token of its own, so none
    /// registers with the workflow's token.
    #[test]
    fn every_operation_s_options_carry_their_own_cancellation_token() {
        let activities = [
            short_options(),
            waiting_options(Duration::from_secs(60)),
            drain_options(),
        ];
        for options in &activities {
            assert!(options.cancellation_token.is_some(), "{options:?}");
        }
        assert!(timer(Duration::from_secs(1)).cancellation_token.is_some());
        assert!(signal_options().cancellation_token.is_some());
        assert!(condition_options().cancellation_token.is_some());
    }
}
