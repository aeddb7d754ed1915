//! A full turn of the TWD workflow ([`Turn`]), in one order: show routing the rollout reported,
//! re-assert resources (a run's first turn), dispatch rollouts, answer controls, read the world,
//! then show the status, retire versions and autoscale.

use std::time::Duration;

use futures::FutureExt;
use temporalio_common::search_attributes::SearchAttributes;
use temporalio_sdk::workflows::{join, select};
use temporalio_sdk::{
    ChildWorkflowOptions, ParentClosePolicy, WorkflowContext, WorkflowIdReusePolicy,
};

use super::{TwdWorkflow, event, nudge, retire, show};
use crate::contract::{
    BuildRequest, CreateDeployment, CreateDeploymentOutcome, EventKind, Observe, ReassertResources,
    Recheck,
};
use crate::model::{AppliedRouting, Blocked, Observation, TwdRef};
use crate::plan::twd::{
    AFTER_A_FAILED_READING, ControlStep, Dispatch, Reading, RoutingDuringReading, SpecSignal, Turn,
};
use crate::rollout_workflow::{
    RolloutInput, RolloutWorkflow, SA_BUILD_ID, SA_NAME, SA_NAMESPACE, SA_OUTCOME,
};
use crate::support::{
    self, PATCH_KEEP_EARLY_REPORTS, PATCH_SHOW_STARTING_ROLLOUT, now_millis, run_activity,
    run_local_activity, short_options, with_summary,
};

/// Runs `turn`; returns when to look again.
pub(super) async fn run(
    ctx: &mut WorkflowContext<TwdWorkflow>,
    twd: &TwdRef,
    turn: Turn,
    resync: Duration,
) -> Duration {
    if turn.show_reported_routing {
        let _ = show_reported_routing(ctx).await;
    }
    // A rollout is dispatched before resources are re-asserted (the new build's Deployment
    // need not wait for it), except on a run's first turn, which asserts the finalizers (and
    // takes over what another object of the name leaves) first; the re-assertion then goes
    // with the reading, in one activity.
    if turn.reassert_first {
        reassert_resources(ctx, twd).await;
    }
    dispatch(ctx, twd, &turn.spec).await;
    forward_controls(ctx, twd, &turn.spec).await;
    let reassert = !turn.reassert_first && {
        let now = now_millis(ctx);
        ctx.state_mut(|s| s.state.take_reassert_due(now))
    };
    let Ok(observation) = read(ctx, twd, Reading::of(reassert, turn.quiet)).await else {
        return AFTER_A_FAILED_READING;
    };
    let Some(shown) = ctx.state_mut(|s| s.state.observed(observation.clone(), &turn.spec)) else {
        // A change the watcher did not signal: act on it now.
        return Duration::ZERO;
    };
    show(ctx, shown).await;
    let retire = retire::versions(ctx, twd, &observation)
        .await
        .unwrap_or(resync)
        .min(resync);
    match retire::autoscale(ctx, twd, &observation).await {
        Some(scale) => retire.min(scale),
        None => retire,
    }
}

/// Shows routing the rollout in flight has just written; returns the routing shown before and
/// now, when it showed.
async fn show_reported_routing(
    ctx: &WorkflowContext<TwdWorkflow>,
) -> Option<(AppliedRouting, AppliedRouting)> {
    let (shown, before, after) = ctx.state_mut(|s| s.state.show_reported_routing())?;
    show(ctx, shown).await;
    Some((before, after))
}

/// Re-asserts finalizers, connection settings and (under `unsafeCustomBuildID`) the pod
/// template; each change is a Normal event. A failure is retried at the next turn.
async fn reassert_resources(ctx: &mut WorkflowContext<TwdWorkflow>, twd: &TwdRef) {
    let now = now_millis(ctx);
    if !ctx.state_mut(|s| s.state.take_reassert_due(now)) {
        return;
    }
    let Ok(outcome) = run_activity(
        ctx,
        ReassertResources,
        twd.clone(),
        "reassert resources",
        short_options(),
    )
    .await
    else {
        return;
    };
    for change in outcome.changes {
        event(ctx, twd, EventKind::Normal, &change.reason, change.message).await;
    }
}

/// The turn's reading. Routing the rollout in flight reports meanwhile is shown at once (an
/// observation takes seconds when Temporal refuses reads of a worker deployment that has just
/// changed), except during a quiet turn's local observation: a report that comes meanwhile
/// waits for it to end.
async fn read(
    ctx: &WorkflowContext<TwdWorkflow>,
    twd: &TwdRef,
    reading: Reading,
) -> Result<Observation, Blocked> {
    match reading {
        Reading::Recheck { local } => showing_reports(ctx, recheck(ctx, twd, local)).await,
        Reading::LocalObserve => run_local_activity(ctx, Observe, twd.clone(), "observe").await,
        Reading::Observe => {
            let observe = run_activity(ctx, Observe, twd.clone(), "observe", short_options());
            showing_reports(ctx, observe).await
        }
    }
}

/// `recheck`: re-assertion and observation in one activity (a local one if `local`); each
/// change re-asserted is a Normal event.
async fn recheck(
    ctx: &WorkflowContext<TwdWorkflow>,
    twd: &TwdRef,
    local: bool,
) -> Result<Observation, Blocked> {
    let summary = "reassert resources and observe";
    let outcome = if local {
        run_local_activity(ctx, Recheck, twd.clone(), summary).await?
    } else {
        run_activity(ctx, Recheck, twd.clone(), summary, short_options()).await?
    };
    for change in outcome.reasserted.changes {
        event(ctx, twd, EventKind::Normal, &change.reason, change.message).await;
    }
    Ok(outcome.observation)
}

/// Runs `reading`, showing the routing the rollout in flight reports meanwhile
/// ([`crate::plan::twd::TwdState::routing_to_show`]); the reading is settled on it.
async fn showing_reports<F>(
    ctx: &WorkflowContext<TwdWorkflow>,
    reading: F,
) -> Result<Observation, Blocked>
where
    F: Future<Output = Result<Observation, Blocked>>,
{
    let mut reading = std::pin::pin!(reading.fuse());
    let mut during = RoutingDuringReading::default();
    loop {
        select! {
            read = reading.as_mut() => return read.map(|read| during.settle(read)),
            _ = ctx.wait_condition_with_options(|s: &TwdWorkflow| s.state.routing_to_show(), support::condition_options()) => {
                if let Some((before, after)) = show_reported_routing(ctx).await {
                    during.shown(before, after);
                }
            }
        }
    }
}

/// Executes the turn's [`Dispatch`].
async fn dispatch(ctx: &mut WorkflowContext<TwdWorkflow>, twd: &TwdRef, spec: &SpecSignal) {
    match ctx.state_mut(|s| s.state.take_dispatch(spec)) {
        Dispatch::Nothing => {}
        Dispatch::StartNew { room, superseded } => {
            start_new_build(ctx, twd, spec, room).await;
            if let Some(workflow_id) = superseded {
                nudge(ctx, &workflow_id, "superseded by a newer build").await;
            }
        }
        Dispatch::NudgeSuperseded(workflow_id) => {
            nudge(ctx, &workflow_id, "superseded by a newer build").await;
        }
        Dispatch::Restart => launch(ctx, twd, spec, false).await,
        Dispatch::RestartIfStillTarget(build_id) => {
            if let Some(spec) = confirm_target(ctx, twd, &build_id).await {
                launch(ctx, twd, &spec, false).await;
            }
        }
        Dispatch::NotifySpecChange {
            workflow_id,
            generation,
        } => {
            nudge(ctx, &workflow_id, "spec changed").await;
            ctx.state_mut(|s| s.state.notified(generation));
        }
    }
}

/// The spec to run the superseded rollout of `build_id` again with, if an observation of the
/// TWD confirms that build is its target. The rollout may have been superseded by a spec newer
/// than the last signal (the watcher lags behind, e.g. while it re-establishes its watch after
/// an API server restart): such a spec is taken over, and its turn follows at once.
async fn confirm_target(
    ctx: &mut WorkflowContext<TwdWorkflow>,
    twd: &TwdRef,
    build_id: &str,
) -> Option<SpecSignal> {
    let summary = format!("observe: is {build_id} still the target?");
    let observation = run_activity(ctx, Observe, twd.clone(), &summary, short_options())
        .await
        .ok()?;
    // The TWD is gone: its deletion signal follows.
    let observed = SpecSignal::observed(&observation)?;
    let confirmed = !observed.deleting && observed.build_id == build_id;
    ctx.state_mut(|s| {
        if s.state.take_spec(observed) {
            s.wakeups += 1;
        }
    });
    if confirmed {
        ctx.state(|s| s.state.spec.clone())
    } else {
        None
    }
}

/// Starts the rollout of a build that is new to this TWD. Its Deployment is created in the same
/// workflow task (the create is idempotent by name and creates only what the rollout's first
/// observation would), so the new pods do not wait for the child to start and run its first
/// task; the rollout then skips its own create-first. With `room` known for another version,
/// the create reads nothing but the TWD (Temporal refuses reads of a worker deployment for a
/// moment after each change).
async fn start_new_build(
    ctx: &mut WorkflowContext<TwdWorkflow>,
    twd: &TwdRef,
    spec: &SpecSignal,
    room: bool,
) {
    let request = if room {
        BuildRequest::create_with_room(twd, &spec.build_id)
    } else {
        BuildRequest::create_before_observing(twd, &spec.build_id)
    };
    let options = with_summary(short_options(), "create Deployment");
    let (created, ()) = {
        let creating = ctx.execute_activity(CreateDeployment, request, options);
        let starting = launch(ctx, twd, spec, true);
        join!(creating, starting)
    };
    if let Some(message) = created.ok().and_then(|c| c.created_message(&spec.build_id)) {
        let reason = CreateDeploymentOutcome::CREATED_REASON;
        event(ctx, twd, EventKind::Normal, reason, message).await;
    }
}

/// Starts the rollout child of `spec`'s build (`created`: its Deployment is being created
/// alongside) and makes it the one in flight.
async fn launch(
    ctx: &WorkflowContext<TwdWorkflow>,
    twd: &TwdRef,
    spec: &SpecSignal,
    created: bool,
) {
    let workflow_id = twd.rollout_workflow_id(&spec.build_id);
    let input = RolloutInput {
        twd: twd.clone(),
        build_id: spec.build_id.clone(),
        history_event_bound: ctx.state(|s| s.input.history_event_bound),
        carried: None,
        created_by_parent: created,
        resync_seconds: ctx.state(|s| s.input.resync_seconds),
    };
    let search_attributes = ctx.state(|s| s.input.search_attributes).then(|| {
        SearchAttributes::new([
            SA_NAMESPACE.value_set(twd.namespace.clone()),
            SA_NAME.value_set(twd.name.clone()),
            SA_BUILD_ID.value_set(spec.build_id.clone()),
            SA_OUTCOME.value_set("Running".to_owned()),
        ])
    });
    let options = ChildWorkflowOptions::builder()
        .workflow_id(workflow_id.clone())
        .parent_close_policy(ParentClosePolicy::Abandon)
        .id_reuse_policy(WorkflowIdReusePolicy::AllowDuplicate)
        .static_summary(format!(
            "Rollout of {} to build {}",
            twd.key(),
            spec.build_id
        ))
        .maybe_search_attributes(search_attributes)
        .cancellation_token(support::own_token())
        .build();
    ctx.state_mut(|s| s.state.launching(&workflow_id));
    let started = ctx
        .start_child_workflow(RolloutWorkflow::run, input, options)
        .await;
    if started.is_err() {
        // Already running (e.g. a superseded run that has not exited yet): it re-observes and
        // carries on, since its build is the target again.
        nudge(ctx, &workflow_id, "build is the target again").await;
    }
    let run_id = started.as_ref().ok().map(|child| child.run_id.clone());
    let keep_early = ctx.patched(PATCH_KEEP_EARLY_REPORTS);
    let at = ctx
        .patched(PATCH_SHOW_STARTING_ROLLOUT)
        .then(|| now_millis(ctx));
    ctx.state_mut(|s| {
        s.state
            .started(spec, workflow_id, run_id.as_deref(), keep_early, at)
    });
}

/// Executes a [`ControlStep`] for each control received: forwarded to the rollout in flight,
/// answered with an event, or (`retry` after an abort) the build rolled out again.
async fn forward_controls(ctx: &mut WorkflowContext<TwdWorkflow>, twd: &TwdRef, spec: &SpecSignal) {
    let controls = ctx.state_mut(|s| std::mem::take(&mut s.state.controls));
    let key = twd.key();
    for action in controls {
        match ctx.state(|s| s.state.control_step(action, spec, &key)) {
            ControlStep::Forward(workflow_id) => {
                let _ = ctx
                    .external_workflow(workflow_id, None)
                    .signal(RolloutWorkflow::control, action, support::signal_options())
                    .await;
            }
            ControlStep::Answer { reason, message } => {
                event(ctx, twd, EventKind::Normal, reason, message).await;
            }
            ControlStep::Retry(message) => {
                ctx.state_mut(|s| s.state.retried(&spec.build_id));
                event(ctx, twd, EventKind::Normal, "Retrying", message).await;
                launch(ctx, twd, spec, false).await;
            }
        }
    }
}
