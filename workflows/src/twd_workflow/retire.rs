//! Executes what a full turn's reading asks beyond the status: the sunset plan of retired
//! versions ([`crate::plan::twd::TwdState::sunset_plan`]: drains, scale-downs, deletions) and
//! `spec.autoscaling` ([`crate::plan::twd::AutoscaleStep`]).

use std::time::Duration;

use temporalio_sdk::WorkflowContext;

use super::{TwdWorkflow, event, until};
use crate::contract::{
    BacklogReport, BacklogRequest, CountPinned, DeleteDeployment, DeleteVersion,
    DeleteVersionOutcome, DeleteVersionRequest, DeploymentRequest, DrainAction, DrainRequest,
    DrainVersion, EventKind, PinnedRequest, ReadBacklog, ScaleDeployment, ScaleRequest,
};
use crate::model::{DrainPolicy, Observation, TwdRef};
use crate::plan::autoscale;
use crate::plan::drain::{DrainStep, PinnedSnapshot};
use crate::plan::sunset::SunsetAction;
use crate::plan::twd::AutoscaleStep;
use crate::support::{drain_options, now_millis, run_activity, short_options};

/// Records a Normal event `reason` of what an activity did, once it is `done`.
async fn announce(
    ctx: &WorkflowContext<TwdWorkflow>,
    twd: &TwdRef,
    done: bool,
    reason: &str,
    message: String,
) {
    if done {
        event(ctx, twd, EventKind::Normal, reason, message).await;
    }
}

/// Executes the sunset plan; returns when to look again.
pub(super) async fn versions(
    ctx: &mut WorkflowContext<TwdWorkflow>,
    twd: &TwdRef,
    observation: &Observation,
) -> Option<Duration> {
    let now = now_millis(ctx);
    let plan = ctx.state(|s| s.state.sunset_plan(observation, now));
    ctx.state_mut(|s| s.state.sunset = plan.memory.clone());
    let policy = observation
        .spec
        .as_ref()
        .and_then(|s| s.drain.clone())
        .unwrap_or_default();
    for action in plan.actions {
        match action {
            SunsetAction::CountPinned { build_id } => {
                count_pinned(ctx, twd, &policy, &build_id).await;
            }
            SunsetAction::Drain {
                build_id,
                step,
                action,
            } => {
                drain_step(ctx, twd, &policy, &build_id, step, action).await;
            }
            SunsetAction::ScaleToZero {
                build_id,
                deployment,
            } => {
                let request = ScaleRequest {
                    namespace: twd.namespace.clone(),
                    name: deployment.clone(),
                    replicas: 0,
                };
                let summary = format!("scale {build_id} to 0");
                let scaled = run_activity(ctx, ScaleDeployment, request, &summary, short_options());
                let message =
                    format!("Scaled Deployment {deployment} of retired build {build_id} to 0");
                announce(ctx, twd, scaled.await.is_ok(), "ScaledDown", message).await;
            }
            SunsetAction::DeleteDeployment {
                build_id,
                deployment,
            } => {
                let request = DeploymentRequest {
                    namespace: twd.namespace.clone(),
                    name: deployment.clone(),
                };
                let summary = format!("delete Deployment of {build_id}");
                let deleted =
                    run_activity(ctx, DeleteDeployment, request, &summary, short_options());
                let message =
                    format!("Deleted Deployment {deployment} of retired build {build_id}");
                announce(
                    ctx,
                    twd,
                    deleted.await.is_ok(),
                    "DeploymentDeleted",
                    message,
                )
                .await;
            }
            SunsetAction::DeleteVersion { build_id } => {
                let request = DeleteVersionRequest {
                    twd: twd.clone(),
                    build_id: build_id.clone(),
                    skip_drainage: false,
                };
                match run_activity(
                    ctx,
                    DeleteVersion,
                    request,
                    &format!("delete version {build_id}"),
                    short_options(),
                )
                .await
                {
                    Ok(DeleteVersionOutcome::Deleted) => {
                        event(
                            ctx,
                            twd,
                            EventKind::Normal,
                            "VersionDeleted",
                            format!("Deleted version {build_id} from Temporal"),
                        )
                        .await;
                    }
                    Ok(DeleteVersionOutcome::NotYet { .. }) | Err(_) => {}
                }
            }
        }
    }
    plan.next_check_at
        .map(|at| Duration::from_millis(u64::try_from(at - now).unwrap_or(0).max(1000)))
}

/// Counts the open workflows pinned to a retired version (shown in status).
async fn count_pinned(
    ctx: &mut WorkflowContext<TwdWorkflow>,
    twd: &TwdRef,
    policy: &DrainPolicy,
    build_id: &str,
) {
    let request = PinnedRequest {
        twd: twd.clone(),
        build_id: build_id.to_owned(),
        include_types: policy.include_types.clone(),
        exclude_types: policy.exclude_types.clone(),
    };
    let summary = format!("count pinned workflows of {build_id}");
    let Ok(count) = run_activity(ctx, CountPinned, request, &summary, short_options()).await else {
        return;
    };
    let pinned = PinnedSnapshot {
        open: count.open,
        oldest_started_at: count.oldest_started_at,
        counted_at: now_millis(ctx),
    };
    ctx.state_mut(|s| s.state.counted_pinned(build_id, pinned));
}

/// Runs one drain step of a retired version (a batch operation over its pinned workflows) and
/// records it as done; a Normal event says what it did, a Warning event that it failed (it is
/// tried again at the next look).
async fn drain_step(
    ctx: &mut WorkflowContext<TwdWorkflow>,
    twd: &TwdRef,
    policy: &DrainPolicy,
    build_id: &str,
    step: DrainStep,
    action: DrainAction,
) {
    let request = DrainRequest {
        twd: twd.clone(),
        build_id: build_id.to_owned(),
        action: action.clone(),
        include_types: policy.include_types.clone(),
        exclude_types: policy.exclude_types.clone(),
        rate: policy.rate,
        dry_run: policy.dry_run,
    };
    let what = match &action {
        DrainAction::Signal { name } => format!("signal {name}"),
        DrainAction::Cancel => "cancel".to_owned(),
        DrainAction::Terminate => "terminate".to_owned(),
        DrainAction::MoveToCurrent { current_build_id } => {
            format!("move to the Current version {current_build_id}")
        }
    };
    let summary = format!("drain {build_id}: {what}");
    match run_activity(ctx, DrainVersion, request, &summary, drain_options()).await {
        Ok(outcome) => {
            ctx.state_mut(|s| s.state.drained(build_id, step));
            let message = if policy.dry_run {
                format!(
                    "Dry run: would {what} {} workflows pinned to retired build {build_id} ({})",
                    outcome.matched, outcome.query
                )
            } else {
                format!(
                    "{}: {what} for {} workflows pinned to retired build {build_id} ({} done, {} failed; batch {})",
                    step.as_str(),
                    outcome.matched,
                    outcome.succeeded,
                    outcome.failed,
                    outcome.job_id.unwrap_or_default()
                )
            };
            let reason = match step {
                DrainStep::MoveToCurrent => "DrainMovedToCurrent",
                DrainStep::Signal => "DrainSignalled",
                DrainStep::Cancel => "DrainCancelled",
                DrainStep::Terminate => "DrainTerminated",
            };
            event(ctx, twd, EventKind::Normal, reason, message).await;
        }
        Err(blocked) => {
            event(
                ctx,
                twd,
                EventKind::Warning,
                "DrainFailed",
                format!(
                    "Drain step {} ({what}) of retired build {build_id} failed: {}",
                    step.as_str(),
                    blocked.message
                ),
            )
            .await;
        }
    }
}

/// Executes the turn's [`AutoscaleStep`]: one `read_backlog` when a read is due (its result is
/// the record of what was seen), a `scale_deployment` per change with a Normal `Scaled` event
/// giving the numbers. Returns when to look again (None without autoscaling).
pub(super) async fn autoscale(
    ctx: &mut WorkflowContext<TwdWorkflow>,
    twd: &TwdRef,
    observation: &Observation,
) -> Option<Duration> {
    let now = now_millis(ctx);
    let (policy, versions, read) = match ctx.state(|s| s.state.autoscale_step(observation, now)) {
        AutoscaleStep::Off => return None,
        AutoscaleStep::NotDue(at) => return at.map(|at| until(at, now)),
        AutoscaleStep::Idle => return Some(read_again(ctx, now, autoscale::IDLE_READ_MS)),
        AutoscaleStep::Size {
            policy,
            versions,
            read,
        } => (policy, versions, read),
    };
    let report = if read {
        let request = BacklogRequest {
            twd: twd.clone(),
            build_ids: versions.iter().map(|v| v.build_id.clone()).collect(),
        };
        match run_activity(ctx, ReadBacklog, request, "read backlog", short_options()).await {
            Ok(report) => report,
            Err(_) => return Some(read_again(ctx, now, autoscale::BUSY_READ_MS)),
        }
    } else {
        // A fixed total (`replicasMode: Shared`): nothing to read.
        BacklogReport::default()
    };
    let now = now_millis(ctx);
    let memory = ctx.state(|s| s.state.autoscale.clone());
    let plan = autoscale::plan(&policy, &versions, &report.versions, &memory, now);
    let next = plan.memory.next_read_at.unwrap_or(now);
    ctx.state_mut(|s| s.state.autoscale = plan.memory);
    for change in plan.changes {
        let request = ScaleRequest {
            namespace: twd.namespace.clone(),
            name: change.deployment.clone(),
            replicas: change.to,
        };
        let summary = format!("scale {} to {}", change.build_id, change.to);
        if run_activity(ctx, ScaleDeployment, request, &summary, short_options())
            .await
            .is_ok()
        {
            event(ctx, twd, EventKind::Normal, "Scaled", change.message).await;
        }
    }
    Some(until(next, now))
}

/// Reads the backlogs again `after` milliseconds from `now`; the wait until then.
fn read_again(ctx: &WorkflowContext<TwdWorkflow>, now: i64, after: i64) -> Duration {
    let next = now.saturating_add(after);
    ctx.state_mut(|s| s.state.autoscale.next_read_at = Some(next));
    until(next, now)
}
