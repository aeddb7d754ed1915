//! The per-TWD workflow (`twd/<ns>/<name>`): long-lived, started and signalled by the watcher.
//! It serializes rollouts (one rollout child per build; a newer build supersedes the old one),
//! is the only writer of the TWD's status, retires old versions (sunset), runs the deletion
//! path, and periodically re-reads the world so a missed event never strands anything.
//!
//! Each turn is one decision of [`plan::twd`](crate::plan::twd); this module only waits for
//! the next turn and executes the decision (`turn` a full turn, `retire` the sunset and
//! autoscaling, `deletion` the deletion path). Signals, reports and controls only record what
//! they bring in the workflow's state.
//!
//! Rollouts are started with `ParentClosePolicy::Abandon` and report back by signalling this
//! workflow's ID, so this workflow can continue-as-new at any time without losing them: it
//! carries the active rollout's ID in its input.

mod deletion;
mod retire;
mod turn;

use std::time::Duration;

use serde::{Deserialize, Serialize};
use temporalio_macros::{workflow, workflow_methods};
use temporalio_sdk::{SyncWorkflowContext, WorkflowContext, WorkflowContextView, WorkflowResult};
use twc_crds::worker_deployment::TemporalWorkerDeploymentStatus;

use crate::contract::{
    EmitEvent, EventKind, EventRequest, StatusRequest, TargetFailure, WriteStatus,
};
use crate::control::ControlEffect;
use crate::model::{ControlAction, RolloutReport, TwdRef, UnixMillis};
pub use crate::plan::deletion::CleanupProgress;
use crate::plan::twd::{self, ReportShown, RunLength, Shown, TwdDecision, TwdState, Woke};
pub use crate::plan::twd::{ActiveRollout, CarriedTwd, SpecSignal};
use crate::rollout_workflow::RolloutWorkflow;
use crate::support::{
    self, PATCH_CANCEL_BEATEN_TIMERS, PATCH_SETTLED_RUNS, PATCH_SHORT_RUNS, now_millis,
    run_activity, short_options,
};

/// Default level-triggered resync interval when nothing else is due.
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(300);

/// Input of the TWD workflow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TwdInput {
    /// The TWD.
    pub twd: TwdRef,
    /// Set search attributes on rollouts (they must be registered in the engine namespace).
    pub search_attributes: bool,
    /// History events after which this workflow and its rollouts continue as new (default
    /// [`crate::DEFAULT_HISTORY_EVENT_BOUND`]; absent in histories from before it existed).
    #[serde(default)]
    pub history_event_bound: Option<u32>,
    /// Seconds between level-triggered resyncs when nothing else is due (default 300; absent
    /// in histories from before it existed).
    #[serde(default)]
    pub resync_seconds: Option<u32>,
    /// State carried over a continue-as-new.
    pub carried: Option<CarriedTwd>,
}

/// Answer of the `status` query.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TwdStatusView {
    /// Latest spec signal.
    pub spec: Option<SpecSignal>,
    /// Rollout in flight.
    pub active: Option<ActiveRollout>,
    /// Its latest report.
    pub last_report: Option<RolloutReport>,
}

/// The TWD workflow's state.
#[workflow]
pub struct TwdWorkflow {
    input: TwdInput,
    /// What the decisions are made on.
    state: TwdState,
    /// Bumped by every signal, report or control that wants a turn; waits end when it changes.
    wakeups: u64,
    /// Spec signals received by this run (a change of the TWD or its connection ends a pause
    /// of the deletion path).
    spec_signals: u64,
    /// `wakeups` as the run started, before the signals of its first workflow task.
    started_wakeups: u64,
}

#[workflow_methods]
impl TwdWorkflow {
    /// Builds the initial state from the input.
    #[init]
    pub fn new(_ctx: &WorkflowContextView, input: TwdInput) -> Self {
        let state = TwdState::resumed(input.carried.clone());
        // Carried controls count as signals not yet handled.
        let wakeups = state.controls.len() as u64;
        Self {
            input,
            wakeups,
            state,
            spec_signals: 0,
            started_wakeups: wakeups,
        }
    }

    /// Runs until the TWD is deleted and cleaned up: waits for a signal or its timer, then
    /// executes the turn [`twd::decide`] asks for.
    #[run(name = "twd")]
    pub async fn run(ctx: &mut WorkflowContext<Self>) -> WorkflowResult<()> {
        let twd = ctx.state(|s| s.input.twd.clone());
        let period = ctx
            .state(|s| s.input.resync_seconds)
            .map_or(DEFAULT_RESYNC, |seconds| {
                Duration::from_secs(u64::from(seconds.max(1)))
            });
        // A run continued with nothing pending takes its first turn when the previous run's
        // next one was due; a signal that came with its first workflow task (the handlers ran
        // before this) is pending, so that turn comes at once.
        let started = now_millis(ctx);
        let mut seen = ctx.state(|s| s.started_wakeups);
        let mut next_wake = if ctx.state(|s| s.wakeups != seen) {
            Duration::ZERO
        } else {
            ctx.state(|s| twd::QuietStart::first_wait(s.input.carried.as_ref(), started))
        };
        let mut turns = 0u32;
        // Signals counted before a turn starts are handled by it; one that arrives while the
        // turn runs (a control during an activity) ends the next wait at once.
        loop {
            // Each resync falls due a little earlier or later than the period (the workflow's
            // deterministic randomness).
            let resync = twd::jittered(period, ctx.random::<f64>());
            let due_at = now_millis(ctx).saturating_add(millis(next_wake));
            let woke = wait(ctx, next_wake, seen).await;
            seen = ctx.state(|s| s.wakeups);
            turns += 1;
            let now = now_millis(ctx);
            match ctx.state(|s| twd::decide(&s.state, woke, now)) {
                TwdDecision::AwaitSpec => next_wake = resync,
                TwdDecision::Delete => {
                    if deletion::delete(ctx, &twd).await? {
                        return Ok(());
                    }
                    // A live object of the name took over: back to managing it.
                    next_wake = Duration::ZERO;
                }
                TwdDecision::ShowReport(report) => {
                    show_report(ctx, *report).await;
                    // The timer the report interrupted keeps its deadline.
                    let left = due_at.saturating_sub(now_millis(ctx)).max(0);
                    next_wake = Duration::from_millis(u64::try_from(left).unwrap_or(0));
                    continue_as_new_if_due(ctx, turns, next_wake, seen)?;
                }
                TwdDecision::Turn(turn) => {
                    next_wake = turn::run(ctx, &twd, turn, resync).await;
                    continue_as_new_if_due(ctx, turns, next_wake, seen)?;
                }
            }
        }
    }

    /// The TWD changed (from the watcher). Older generations are ignored.
    #[signal(name = "spec_changed")]
    pub fn spec_changed(&mut self, _ctx: &mut SyncWorkflowContext<Self>, signal: SpecSignal) {
        if self.state.receive_spec(signal) {
            self.spec_signals += 1;
            self.wakeups += 1;
        }
    }

    /// The notification workflow's report of the webhook targets failing now (empty: all
    /// deliver); shown as the `NotificationsDelivered` condition at the next turn.
    #[signal(name = "notification_health")]
    pub fn notification_health(
        &mut self,
        _ctx: &mut SyncWorkflowContext<Self>,
        failing: Vec<TargetFailure>,
    ) {
        if self.state.receive_notification_health(failing) {
            self.wakeups += 1;
        }
    }

    /// Progress from a rollout child.
    #[signal(name = "rollout_update")]
    pub fn rollout_update(&mut self, _ctx: &mut SyncWorkflowContext<Self>, report: RolloutReport) {
        if self.state.receive_report(report) {
            self.wakeups += 1;
        }
    }

    /// Refuses a control that does not apply now (a `pause` of a rollout that is already
    /// complete, a `retry` with nothing to retry, any control with no rollout), with the reason;
    /// the caller gets it at once.
    #[update_validator(control_update)]
    pub fn validate_control_update(
        &self,
        _ctx: &WorkflowContextView,
        action: &ControlAction,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        match self.state.control_effect(*action, &self.input.twd.key()) {
            ControlEffect::NotApplicable(message) => Err(message.into()),
            ControlEffect::Apply(_) | ControlEffect::Unchanged(_) => Ok(()),
        }
    }

    /// The one entry point of operator controls (the CLI, the `temporal.io/rollout-action`
    /// annotation, `temporal workflow update --name control`): an accepted control is forwarded
    /// to the rollout in flight at the next turn (or, `retry` after an abort, rolls the build
    /// out again); the answer says what it does (or that nothing changes).
    #[update(name = "control")]
    pub fn control_update(
        &mut self,
        _ctx: &mut SyncWorkflowContext<Self>,
        action: ControlAction,
    ) -> String {
        let answer = self.state.control_effect(action, &self.input.twd.key());
        self.state.controls.push(action);
        self.wakeups += 1;
        answer.message().to_owned()
    }

    /// Spec, rollout in flight and its latest report.
    #[query(name = "status")]
    pub fn status(&self, _ctx: &WorkflowContextView) -> TwdStatusView {
        TwdStatusView {
            spec: self.state.spec.clone(),
            active: self.state.active.clone(),
            last_report: self.state.last_report.clone(),
        }
    }
}

/// Waits `next_wake` (no wait when zero) or until a signal counted after `seen` arrives.
async fn wait(ctx: &WorkflowContext<TwdWorkflow>, next_wake: Duration, seen: u64) -> Woke {
    if next_wake.is_zero() {
        return Woke::AtOnce;
    }
    let timer = ctx.timer(support::timer(next_wake));
    let signalled = move |s: &TwdWorkflow| s.wakeups != seen;
    let cancel = |ctx: &WorkflowContext<TwdWorkflow>| ctx.patched(PATCH_CANCEL_BEATEN_TIMERS);
    match support::unless(ctx, timer, signalled, cancel).await {
        Some(_) => Woke::Timer,
        None => Woke::Signal,
    }
}

/// Continues as new once the run is as long as [`RunLength`] allows, or has settled after a
/// rollout. `next_wake`: when the next turn would be; `seen`: the signal count the turn started
/// from (a signal since then makes the next run's first turn follow at once).
fn continue_as_new_if_due(
    ctx: &mut WorkflowContext<TwdWorkflow>,
    turns: u32,
    next_wake: Duration,
    seen: u64,
) -> WorkflowResult<()> {
    let settled = ctx.state(|s| s.state.settled_after_work());
    let length = RunLength {
        turns,
        history_length: ctx.history_length(),
        suggested: ctx.continue_as_new_suggested(),
        bound: ctx
            .state(|s| s.input.history_event_bound)
            .unwrap_or(crate::DEFAULT_HISTORY_EVENT_BOUND),
        // A run this build continued has the bound without asking (no marker in each run).
        short_runs: ctx.state(|s| s.input.carried.as_ref().is_some_and(|c| c.short_runs))
            || ctx.patched(PATCH_SHORT_RUNS),
        // Asked only of a run that settles, so other runs record no marker for it.
        settled_after_work: settled && ctx.patched(PATCH_SETTLED_RUNS),
    };
    if length.is_over() {
        let pending = ctx.state(|s| s.wakeups != seen);
        let turn_at = (!pending && !next_wake.is_zero())
            .then(|| now_millis(ctx).saturating_add(millis(next_wake)));
        continue_as_new(ctx, turn_at)?;
    }
    Ok(())
}

/// Continues as new, carrying everything the next run needs (signals that arrived during this
/// turn included: they are handled by the next run's first turn, at once; with nothing pending
/// it comes at `turn_at`).
fn continue_as_new(
    ctx: &mut WorkflowContext<TwdWorkflow>,
    turn_at: Option<UnixMillis>,
) -> WorkflowResult<()> {
    let input = ctx.state(|s| TwdInput {
        carried: Some(s.state.carried(turn_at)),
        ..s.input.clone()
    });
    ctx.continue_as_new(input, Default::default())?;
    Ok(())
}

/// A report-only turn: the report is shown on this run's latest observation, which keeps the
/// routing it brought. Nothing is read.
async fn show_report(ctx: &WorkflowContext<TwdWorkflow>, report: ReportShown) {
    if let Some(shown) = ctx.state_mut(|s| s.state.show_report(report)) {
        show(ctx, shown).await;
    }
}

/// The status writer: writes the status that shows `shown` ([`TwdState::status`]) when it
/// differs from the last one written.
async fn show(ctx: &WorkflowContext<TwdWorkflow>, shown: Shown) {
    let now = now_millis(ctx);
    let (status, unchanged) = ctx.state(|s| {
        let status = s.state.status(&shown, &s.input.twd.name, now);
        let unchanged = s.state.shows(&status);
        (status, unchanged)
    });
    if unchanged {
        return;
    }
    if write_status(ctx, status.clone()).await {
        ctx.state_mut(|s| s.state.last_status = Some(status));
    }
}

/// Writes `status`; returns whether it was written.
async fn write_status(
    ctx: &WorkflowContext<TwdWorkflow>,
    status: TemporalWorkerDeploymentStatus,
) -> bool {
    let twd = ctx.state(|s| s.input.twd.clone());
    let request = StatusRequest { twd, status };
    run_activity(ctx, WriteStatus, request, "write status", short_options())
        .await
        .is_ok()
}

/// Tells a rollout that something changed (it re-observes). A rollout that already ended
/// cannot be signalled; nothing to do then.
async fn nudge(ctx: &WorkflowContext<TwdWorkflow>, workflow_id: &str, reason: &str) {
    let _ = ctx
        .external_workflow(workflow_id.to_owned(), None)
        .signal(
            RolloutWorkflow::nudge,
            reason.to_owned(),
            support::signal_options(),
        )
        .await;
}

async fn event(
    ctx: &WorkflowContext<TwdWorkflow>,
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

fn millis(duration: Duration) -> UnixMillis {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// The wait until `at`, at least a millisecond.
fn until(at: UnixMillis, now: UnixMillis) -> Duration {
    Duration::from_millis(u64::try_from(at - now).unwrap_or(0).max(1))
}
