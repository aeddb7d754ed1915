//! The deletion path of the TWD workflow: stop the rollout, clean Temporal and Kubernetes up
//! with backoff ([`crate::plan::deletion`]), release the finalizers.

use temporalio_sdk::{WorkflowContext, WorkflowResult};

use super::{TwdWorkflow, continue_as_new, event, nudge, write_status};
use crate::contract::{
    CleanupBlock, CleanupDeleted, CleanupOutcome, EventKind, Observe, ReleaseRequest,
    ReleaseWithoutTemporal,
};
use crate::model::TwdRef;
use crate::plan::conditions;
use crate::plan::deletion::{self, DeletionStep};
use crate::plan::twd::Shown;
use crate::support::{
    self, PATCH_CANCEL_BEATEN_TIMERS, history_full, now_millis, run_activity, short_options,
};

/// Deletion: stop the rollout, clean Temporal and Kubernetes, release the finalizers; true
/// once the TWD is released, false when a spec signal of a live object of its name (the other
/// kind, which took over) ended it first.
pub(super) async fn delete(
    ctx: &mut WorkflowContext<TwdWorkflow>,
    twd: &TwdRef,
) -> WorkflowResult<bool> {
    if let Some(active) = ctx.state(|s| s.state.active.clone()) {
        nudge(ctx, &active.workflow_id, "TWD deleted").await;
    }
    delete_with_backoff(ctx, twd).await
}

/// The deletion path: cleanup attempts until Temporal and Kubernetes are cleaned up, or until
/// [`deletion::after_attempt`] gives the cleanup of Temporal up (its namespace or connection
/// is being deleted, or a missing connection or Secret stayed missing); the TWD is then
/// released without it, and what was left in Temporal is said in the release activity's
/// result, the controller's log and a Warning event. Between attempts, what the cleanup waits
/// for is shown once per change (the `Deleting` condition and a Warning event), and the pause
/// ends early when the TWD or its connection changes. Continues as new like the main loop.
async fn delete_with_backoff(
    ctx: &mut WorkflowContext<TwdWorkflow>,
    twd: &TwdRef,
) -> WorkflowResult<bool> {
    loop {
        if !ctx.state(|s| s.state.spec.as_ref().is_some_and(|spec| spec.deleting)) {
            return Ok(false);
        }
        let outcome = run_activity(
            ctx,
            CleanupDeleted,
            twd.clone(),
            "clean up deleted TWD",
            short_options(),
        )
        .await
        .unwrap_or_else(|failed| CleanupOutcome::Pending {
            message: failed.message,
            blocked_by: None,
            teardown: None,
        });
        let now = now_millis(ctx);
        let step = ctx.state_mut(|s| deletion::after_attempt(&mut s.state.cleanup, &outcome, now));
        let CleanupOutcome::Pending {
            message,
            blocked_by,
            ..
        } = outcome
        else {
            return Ok(true);
        };
        let pause = match step {
            DeletionStep::Finished => return Ok(true),
            DeletionStep::Release => {
                let request = ReleaseRequest {
                    twd: twd.clone(),
                    cause: message,
                };
                let released = run_activity(
                    ctx,
                    ReleaseWithoutTemporal,
                    request,
                    "release without cleaning Temporal",
                    short_options(),
                )
                .await;
                if released.is_ok() {
                    return Ok(true);
                }
                ctx.state_mut(|s| deletion::backoff(&mut s.state.cleanup))
            }
            DeletionStep::Retry { pause } => {
                show_cleanup_wait(ctx, twd, blocked_by, &message).await;
                pause
            }
        };
        let seen = ctx.state(|s| s.spec_signals);
        let timer = ctx.timer(support::timer(pause));
        let changed = move |s: &TwdWorkflow| s.spec_signals != seen;
        let cancel = |ctx: &WorkflowContext<TwdWorkflow>| ctx.patched(PATCH_CANCEL_BEATEN_TIMERS);
        let _ = support::unless(ctx, timer, changed, cancel).await;
        if history_full(ctx, ctx.state(|s| s.input.history_event_bound)) {
            continue_as_new(ctx, None)?;
        }
    }
}

/// Shows what the deletion waits for (the `Deleting` condition and a Warning event), once per
/// change of the message.
async fn show_cleanup_wait(
    ctx: &mut WorkflowContext<TwdWorkflow>,
    twd: &TwdRef,
    blocked_by: Option<CleanupBlock>,
    message: &str,
) {
    if ctx.state(|s| s.state.cleanup.shown.as_deref() == Some(message)) {
        return;
    }
    ctx.state_mut(|s| s.state.cleanup.shown = Some(message.to_owned()));
    let view = conditions::deletion_condition(blocked_by, message);
    event(
        ctx,
        twd,
        EventKind::Warning,
        "DeletionBlocked",
        view.message.clone(),
    )
    .await;
    let Ok(observation) = run_activity(ctx, Observe, twd.clone(), "observe", short_options()).await
    else {
        return;
    };
    let Some(shown) = Shown::as_read(observation) else {
        return;
    };
    let shown = Shown {
        deleting: Some(view),
        ..shown
    };
    let now = now_millis(ctx);
    let status = ctx.state(|s| s.state.status(&shown, &twd.name, now));
    write_status(ctx, status).await;
}
