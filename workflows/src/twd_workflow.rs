//! The per-TWD workflow (`twd/<ns>/<name>`): long-lived, started and signalled by the watcher.
//! It serializes rollouts (one rollout child per build; a newer build supersedes the old one),
//! is the only writer of the TWD's status, retires old versions (sunset), runs the deletion
//! path, and periodically re-reads the world so a missed event never strands anything.
//!
//! Rollouts are started with `ParentClosePolicy::Abandon` and report back by signalling this
//! workflow's ID, so this workflow can continue-as-new at any time without losing them: it
//! carries the active rollout's ID in its input.

use std::time::Duration;

use futures::FutureExt;
use serde::{Deserialize, Serialize};
use temporalio_common::search_attributes::SearchAttributes;
use temporalio_macros::{workflow, workflow_methods};
use temporalio_sdk::workflows::{join, select};
use temporalio_sdk::{
    ChildWorkflowOptions, ParentClosePolicy, SyncWorkflowContext, WorkflowContext,
    WorkflowContextView, WorkflowIdReusePolicy, WorkflowResult,
};
use twc_crds::worker_deployment::TemporalWorkerDeploymentStatus;

use crate::contract::{
    BacklogReport, BacklogRequest, BuildRequest, CleanupBlock, CleanupDeleted, CleanupOutcome,
    CountPinned, CreateDeployment, CreateDeploymentOutcome, DeleteDeployment, DeleteVersion,
    DeleteVersionOutcome, DeleteVersionRequest, DeploymentRequest, DrainAction, DrainRequest,
    DrainVersion, EmitEvent, EventKind, EventRequest, Observe, PinnedRequest, ReadBacklog,
    ReassertResources, Recheck, ReleaseRequest, ReleaseWithoutTemporal, ScaleDeployment,
    ScaleRequest, StatusRequest, WriteStatus,
};
use crate::control::{self, ControlEffect, ControlState};
use crate::model::{
    AppliedRouting, ControlAction, DrainPolicy, Observation, RolloutProgress, RolloutReport,
    TwdRef, UnixMillis,
};
use crate::plan::autoscale::{self, AutoscaleMemory};
pub use crate::plan::deletion::CleanupProgress;
use crate::plan::deletion::{self, DeletionStep};
use crate::plan::drain::{DrainStep, PinnedSnapshot};
use crate::plan::sunset::{SunsetAction, SunsetMemory};
use crate::plan::{conditions, status, sunset};
use crate::rollout_workflow::{
    RolloutInput, RolloutWorkflow, SA_BUILD_ID, SA_NAME, SA_NAMESPACE, SA_OUTCOME,
};
use crate::support::{
    self, drain_options, history_full, now_millis, run_activity, short_options, with_summary,
};

/// Longest interval between re-assertions of a TWD's resources while nothing signals a change.
const REASSERT_EVERY: Duration = Duration::from_secs(30);
/// `period` stretched by `draw` (in `[0, 1)`) to between 90 % and 110 % of it.
fn jittered(period: Duration, draw: f64) -> Duration {
    period.mul_f64(0.9 + 0.2 * draw.clamp(0.0, 1.0))
}

/// Default level-triggered resync interval when nothing else is due.
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(300);
/// Loop turns after which the workflow continues as new.
const MAX_TURNS_PER_RUN: u32 = 500;

/// What the watcher sends on every change of the TWD (deduplicated by generation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpecSignal {
    /// `metadata.generation`.
    pub generation: i64,
    /// Build ID computed from the spec.
    pub build_id: String,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// `metadata.uid` of the object it was read from: the other kind of the TWD's name, taking
    /// over, starts its own generations (absent in signals from before both kinds were served).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// A turn is wanted even if the spec is the one held: something around the TWD changed
    /// (its connection, another object of its name). Without it a duplicate changes nothing,
    /// so a watcher that restarts and lists every TWD again wakes none of them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub nudge: bool,
}

impl SpecSignal {
    /// Whether this signal replaces `held`: a newer generation of the same object, its
    /// deletion, or another object of the name (the other kind, taking over).
    pub fn supersedes(&self, held: &SpecSignal) -> bool {
        let other_object = matches!((&self.uid, &held.uid), (Some(a), Some(b)) if a != b);
        other_object || self.generation > held.generation || (self.deleting && !held.deleting)
    }
}

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

/// What survives a continue-as-new.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CarriedTwd {
    /// Latest spec signal.
    pub spec: Option<SpecSignal>,
    /// Rollout in flight.
    pub active: Option<ActiveRollout>,
    /// Its latest report.
    pub last_report: Option<RolloutReport>,
    /// Versions being retired.
    pub sunset: Vec<SunsetMemory>,
    /// Builds an operator aborted (not restarted until the spec moves on).
    pub aborted: Vec<String>,
    /// Controls received and not yet forwarded.
    #[serde(default)]
    pub controls: Vec<ControlAction>,
    /// A duplicate spec signal arrived and the rollout was not nudged yet.
    #[serde(default)]
    pub poked: bool,
    /// Progress of the deletion path.
    #[serde(default)]
    pub cleanup: CleanupProgress,
    /// Autoscaler recommendations and pacing (`spec.autoscaling`).
    #[serde(default)]
    pub autoscale: AutoscaleMemory,
}

/// The rollout child in flight.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActiveRollout {
    /// Its build.
    pub build_id: String,
    /// Its workflow ID.
    pub workflow_id: String,
    /// Spec generation it was last told about.
    pub notified_generation: i64,
    /// Spec generation it was started for.
    #[serde(default)]
    pub started_generation: Option<i64>,
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
    spec: Option<SpecSignal>,
    active: Option<ActiveRollout>,
    last_report: Option<RolloutReport>,
    sunset: Vec<SunsetMemory>,
    aborted: Vec<String>,
    controls: Vec<ControlAction>,
    wakeups: u64,
    /// A duplicate spec signal arrived (something around the TWD changed): nudge the rollout.
    poked: bool,
    last_status: Option<TemporalWorkerDeploymentStatus>,
    cleanup: CleanupProgress,
    /// When this run last re-asserted the TWD's resources.
    reasserted_at: Option<UnixMillis>,
    /// A spec signal arrived since then (the spec or something around it changed).
    spec_signalled: bool,
    /// Spec signals received by this run (a change of the TWD or its connection ends a pause
    /// of the deletion path).
    spec_signals: u64,
    /// Autoscaler recommendations and pacing.
    autoscale: AutoscaleMemory,
    /// This run's latest observation (the base of a status that shows reported routing).
    last_observation: Option<Observation>,
    /// Sequence of the last report whose routing the status shows.
    routing_shown: u64,
}

#[workflow_methods]
impl TwdWorkflow {
    /// Builds the initial state from the input.
    #[init]
    pub fn new(_ctx: &WorkflowContextView, input: TwdInput) -> Self {
        let carried = input.carried.clone().unwrap_or_else(|| CarriedTwd {
            spec: None,
            active: None,
            last_report: None,
            sunset: Vec::new(),
            aborted: Vec::new(),
            controls: Vec::new(),
            poked: false,
            cleanup: CleanupProgress::default(),
            autoscale: AutoscaleMemory::default(),
        });
        Self {
            input,
            spec: carried.spec,
            active: carried.active,
            last_report: carried.last_report,
            sunset: carried.sunset,
            aborted: carried.aborted,
            // Carried controls count as signals not yet handled.
            wakeups: carried.controls.len() as u64,
            controls: carried.controls,
            poked: carried.poked,
            last_status: None,
            cleanup: carried.cleanup,
            reasserted_at: None,
            spec_signalled: false,
            spec_signals: 0,
            autoscale: carried.autoscale,
            last_observation: None,
            routing_shown: 0,
        }
    }

    /// Runs until the TWD is deleted and cleaned up.
    #[run(name = "twd")]
    pub async fn run(ctx: &mut WorkflowContext<Self>) -> WorkflowResult<()> {
        let twd = ctx.state(|s| s.input.twd.clone());
        let mut next_wake = Duration::ZERO;
        let mut turns = 0u32;
        // Signals counted before a turn starts are handled by it; one that arrives while the
        // turn runs (a control during an activity) ends the next wait at once.
        let mut seen = ctx.state(|s| s.wakeups);
        let period = ctx
            .state(|s| s.input.resync_seconds)
            .map_or(DEFAULT_RESYNC, |seconds| {
                Duration::from_secs(u64::from(seconds.max(1)))
            });
        loop {
            // Each resync falls due a little earlier or later than the period (±10 %, from the
            // workflow's deterministic randomness), so the resyncs of many TWDs started at once
            // (a controller install, a restart of Temporal) drift apart instead of reading
            // Temporal together.
            let resync = jittered(period, ctx.random::<f64>());
            // When the pending timer is due (workflow time), and whether a signal ended the
            // wait before it.
            let due_at = now_millis(ctx)
                .saturating_add(i64::try_from(next_wake.as_millis()).unwrap_or(i64::MAX));
            let mut signalled_early = false;
            let timed = !next_wake.is_zero();
            if timed {
                signalled_early = select! {
                    _ = ctx.timer(support::timer(next_wake)) => false,
                    _ = ctx.wait_condition_with_options(move |s: &Self| s.wakeups != seen, support::condition_options()) => true,
                };
            }
            seen = ctx.state(|s| s.wakeups);
            turns += 1;
            let Some(spec) = ctx.state(|s| s.spec.clone()) else {
                next_wake = resync;
                continue;
            };
            if spec.deleting {
                if delete(ctx, &twd).await? {
                    return Ok(());
                }
                // A live object of the name took over: back to managing it.
                next_wake = Duration::ZERO;
                continue;
            }
            // A turn woken only by a report of the rollout under way shows it on this run's
            // latest observation and reads nothing; the timer it interrupted keeps its
            // deadline. Routing that cannot be shown that way (the deployment has no manager
            // yet) is read in a full turn instead.
            if signalled_early && ctx.state(TwdWorkflow::only_a_report_came) {
                if show_report(ctx, &twd).await {
                    let left = due_at.saturating_sub(now_millis(ctx)).max(0);
                    next_wake = Duration::from_millis(u64::try_from(left).unwrap_or(0));
                    if turns >= MAX_TURNS_PER_RUN
                        || history_full(ctx, ctx.state(|s| s.input.history_event_bound))
                    {
                        continue_as_new(ctx)?;
                    }
                    continue;
                }
            } else {
                let _ = show_reported_routing(ctx, &twd).await;
            }
            // A rollout is dispatched before resources are re-asserted (the new build's
            // Deployment need not wait for it), except on a run's first turn, which asserts the
            // finalizers (and takes over what another object of the name leaves) first; the
            // re-assertion then goes with the observation, in one activity.
            let dispatch_first = ctx.state(|s| s.reasserted_at.is_some());
            if dispatch_first {
                dispatch_rollout(ctx, &twd, &spec).await;
            } else {
                reassert_resources(ctx, &twd).await;
                dispatch_rollout(ctx, &twd, &spec).await;
            }
            forward_controls(ctx, &twd, &spec).await;
            // A turn only the timer woke (a resync, a sunset or autoscaling step) expects
            // nothing: its reading is a local activity, one marker in the history.
            let quiet = timed && !signalled_early;
            next_wake = observe_and_act(ctx, &twd, &spec, dispatch_first, quiet, resync).await;
            let continue_now = turns >= MAX_TURNS_PER_RUN
                || history_full(ctx, ctx.state(|s| s.input.history_event_bound));
            if continue_now {
                continue_as_new(ctx)?;
            }
        }
    }

    /// The TWD changed (from the watcher). Older generations are ignored.
    #[signal(name = "spec_changed")]
    pub fn spec_changed(&mut self, _ctx: &mut SyncWorkflowContext<Self>, signal: SpecSignal) {
        let nudge = signal.nudge;
        if !self.take_spec(signal) {
            if !nudge {
                // The spec held, sent again (a watcher's re-list): nothing to do.
                return;
            }
            // Something around the TWD changed (its connection): the rollout is told too.
            self.poked = true;
        }
        self.spec_signalled = true;
        self.spec_signals += 1;
        self.wakeups += 1;
    }

    /// Progress from a rollout child.
    #[signal(name = "rollout_update")]
    pub fn rollout_update(&mut self, _ctx: &mut SyncWorkflowContext<Self>, report: RolloutReport) {
        // The last words of a superseded rollout (often delivered after the new rollout's first
        // reports) must not replace the report of the rollout in flight.
        let from_active = self
            .active
            .as_ref()
            .is_none_or(|a| a.workflow_id == report.workflow_id);
        if !from_active {
            return;
        }
        let newer = self.last_report.as_ref().is_none_or(|last| {
            last.workflow_id != report.workflow_id || report.sequence > last.sequence
        });
        if newer {
            if report.progress == RolloutProgress::Aborted
                && !self.aborted.contains(&report.build_id)
            {
                self.aborted.push(report.build_id.clone());
            }
            self.last_report = Some(report);
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
        match self.control_effect(*action) {
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
        let answer = self.control_effect(action);
        self.push_control(action);
        answer.message().to_owned()
    }

    /// Spec, rollout in flight and its latest report.
    #[query(name = "status")]
    pub fn status(&self, _ctx: &WorkflowContextView) -> TwdStatusView {
        TwdStatusView {
            spec: self.spec.clone(),
            active: self.active.clone(),
            last_report: self.last_report.clone(),
        }
    }
}

/// Continues as new, carrying everything the next run needs (signals that arrived during this
/// turn included: they are handled by the next run's first turn).
fn continue_as_new(ctx: &mut WorkflowContext<TwdWorkflow>) -> WorkflowResult<()> {
    let input = ctx.state(|s| TwdInput {
        twd: s.input.twd.clone(),
        search_attributes: s.input.search_attributes,
        history_event_bound: s.input.history_event_bound,
        resync_seconds: s.input.resync_seconds,
        carried: Some(CarriedTwd {
            spec: s.spec.clone(),
            active: s.active.clone(),
            last_report: s.last_report.clone(),
            sunset: s.sunset.clone(),
            aborted: s.aborted.clone(),
            controls: s.controls.clone(),
            poked: s.poked,
            cleanup: s.cleanup.clone(),
            autoscale: s.autoscale.clone(),
        }),
    });
    ctx.continue_as_new(input, Default::default())?;
    Ok(())
}

/// Scales the versions from their backlogs under `spec.autoscaling` when a read is due: one
/// `read_backlog` (its result is the record of what was seen), a `scale_deployment` per change
/// with a Normal `Scaled` event giving the numbers. Returns when to look again (None without
/// autoscaling).
async fn autoscale(
    ctx: &mut WorkflowContext<TwdWorkflow>,
    twd: &TwdRef,
    observation: &Observation,
) -> Option<Duration> {
    let policy = observation.spec.as_ref()?.autoscaling.clone()?;
    let wait = |at: UnixMillis, now: UnixMillis| {
        Duration::from_millis(u64::try_from(at - now).unwrap_or(0).max(1))
    };
    let now = now_millis(ctx);
    let memory = ctx.state(|s| s.autoscale.clone());
    // A shared fixed total reads nothing: planned every turn, so a `/scale` change applies at once.
    if !policy.shared_total && !autoscale::due(&memory, now) {
        return memory.next_read_at.map(|at| wait(at, now));
    }
    let versions = autoscale::scaled_versions(observation);
    if versions.is_empty() {
        let next = now.saturating_add(autoscale::IDLE_READ_MS);
        ctx.state_mut(|s| s.autoscale.next_read_at = Some(next));
        return Some(wait(next, now));
    }
    let report = if policy.shared_total {
        // A fixed total (`replicasMode: Shared`): nothing to read.
        BacklogReport::default()
    } else {
        let request = BacklogRequest {
            twd: twd.clone(),
            build_ids: versions.iter().map(|v| v.build_id.clone()).collect(),
        };
        let Ok(report) =
            run_activity(ctx, ReadBacklog, request, "read backlog", short_options()).await
        else {
            let next = now.saturating_add(autoscale::BUSY_READ_MS);
            ctx.state_mut(|s| s.autoscale.next_read_at = Some(next));
            return Some(wait(next, now));
        };
        report
    };
    let now = now_millis(ctx);
    let plan = autoscale::plan(&policy, &versions, &report.versions, &memory, now);
    let next = plan.memory.next_read_at.unwrap_or(now);
    ctx.state_mut(|s| s.autoscale = plan.memory.clone());
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
    Some(wait(next, now))
}

/// A full turn's reading: observes (with the re-assertion when due), then writes the status,
/// retires versions and autoscales; returns when to look again. A `quiet` turn (only its timer
/// woke it) reads in a local activity: a report that comes meanwhile waits for it to end,
/// which a busy turn's reading (an activity, during which reports are shown) does not make
/// it do.
async fn observe_and_act(
    ctx: &mut WorkflowContext<TwdWorkflow>,
    twd: &TwdRef,
    spec: &SpecSignal,
    combined: bool,
    quiet: bool,
    resync: Duration,
) -> Duration {
    let observed = match (combined && take_reassert_due(ctx), quiet) {
        (true, _) => observe_showing_reports(ctx, twd, recheck(ctx, twd, quiet)).await,
        (false, true) => support::run_local_activity(ctx, Observe, twd.clone(), "observe").await,
        (false, false) => {
            let observe = run_activity(ctx, Observe, twd.clone(), "observe", short_options());
            observe_showing_reports(ctx, twd, observe).await
        }
    };
    match observed {
        Ok(observation) => {
            ctx.state_mut(|s| s.last_observation = Some(observation.clone()));
            if adopt_observed_spec(ctx, &observation) {
                // A change the watcher did not signal: act on it now.
                Duration::ZERO
            } else {
                write_status(ctx, twd, &observation, spec.generation).await;
                let retire = retire_versions(ctx, twd, &observation)
                    .await
                    .unwrap_or(resync)
                    .min(resync);
                match autoscale(ctx, twd, &observation).await {
                    Some(scale) => retire.min(scale),
                    None => retire,
                }
            }
        }
        Err(_) => Duration::from_secs(30),
    }
}

/// Re-asserts finalizers, connection settings and (under `unsafeCustomBuildID`) the pod
/// template; each change is a Normal event. A failure is retried at the next turn. Done on the
/// first turn of a run, on turns after a spec signal (the TWD or its connection changed), and
/// otherwise at most every [`REASSERT_EVERY`], so the turns a rollout's reports cause stay
/// cheap.
async fn reassert_resources(ctx: &mut WorkflowContext<TwdWorkflow>, twd: &TwdRef) {
    if !take_reassert_due(ctx) {
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

/// Writes the status at once when the rollout in flight reported routing it has just written:
/// this run's latest observation with that routing, so a routing change shows without reading
/// Temporal again (the turn's own observation, which follows, corrects anything else).
/// Returns the routing the status showed before and the routing it shows now, when it wrote.
async fn show_reported_routing(
    ctx: &WorkflowContext<TwdWorkflow>,
    twd: &TwdRef,
) -> Option<(AppliedRouting, AppliedRouting)> {
    // Each report's routing is considered once, even when it cannot be shown.
    let (base, routing) = ctx.state_mut(|s| {
        let report = s.last_report.as_ref()?;
        let routing = report.routing.as_ref()?;
        if report.sequence <= s.routing_shown {
            return None;
        }
        s.routing_shown = report.sequence;
        let from_active = s
            .active
            .as_ref()
            .is_some_and(|a| a.workflow_id == report.workflow_id);
        if !from_active {
            return None;
        }
        Some((s.last_observation.clone()?, routing.clone()))
    })?;
    let observation = routing.applied_to(&base)?;
    // The status describes the spec that observation read, not a newer one a signal brought
    // meanwhile (that one is shown once observed).
    let generation = observation.spec.as_ref().map(|s| s.generation)?;
    write_status(ctx, twd, &observation, generation).await;
    Some((AppliedRouting::read_in(&base)?, routing))
}

/// Runs a turn's observation (`observe` or `recheck`). Routing the rollout in flight reports
/// meanwhile is shown at once instead of after the observation
/// when the run's latest observation read its build's spec ([`TwdWorkflow::routing_to_show`]):
/// an observation takes seconds when Temporal refuses reads of a worker deployment that has
/// just changed. An observation that still reads the routing shown before those reports was read
/// before the rollout's write and gets the reported routing (see [`AppliedRouting::settle`]).
async fn observe_showing_reports<F>(
    ctx: &WorkflowContext<TwdWorkflow>,
    twd: &TwdRef,
    observation: F,
) -> Result<Observation, crate::model::Blocked>
where
    F: Future<Output = Result<Observation, crate::model::Blocked>>,
{
    let mut observation = std::pin::pin!(observation.fuse());
    // The routing shown before the first report shown during the observation, and the last.
    let mut shown: Option<(AppliedRouting, AppliedRouting)> = None;
    loop {
        select! {
            observed = observation.as_mut() => {
                return observed.map(|read| match &shown {
                    Some((before, after)) => after.settle(read, before),
                    None => read,
                });
            }
            _ = ctx.wait_condition_with_options(TwdWorkflow::routing_to_show, support::condition_options()) => {
                if let Some((before, after)) = show_reported_routing(ctx, twd).await {
                    let before = shown.map_or(before, |(first, _)| first);
                    shown = Some((before, after));
                }
            }
        }
    }
}

/// A report-only turn: the latest report is shown on this run's latest
/// observation, which from then on carries the routing the report brought (with the ramp's
/// timestamps taken as now), so a later report without routing does not take it back. Nothing
/// is read. False when the routing cannot be shown that way (no manager yet, or nothing
/// observed): a full turn follows.
async fn show_report(ctx: &mut WorkflowContext<TwdWorkflow>, twd: &TwdRef) -> bool {
    let now = now_millis(ctx);
    let base = ctx.state_mut(|s| {
        let observation = s.last_observation.as_ref()?;
        let report = s.last_report.as_ref()?;
        let Some(routing) = report
            .routing
            .as_ref()
            .filter(|_| report.sequence > s.routing_shown)
        else {
            return Some(observation.clone());
        };
        let applied = routing.applied_at(observation, now)?;
        s.routing_shown = report.sequence;
        s.last_observation = Some(applied.clone());
        Some(applied)
    });
    let Some(observation) = base else {
        return false;
    };
    if let Some(generation) = observation.spec.as_ref().map(|s| s.generation) {
        write_status(ctx, twd, &observation, generation).await;
    }
    true
}

/// Whether resources are to be re-asserted this turn (a spec signal came, or
/// [`REASSERT_EVERY`] passed); if so, the time is taken as the last re-assertion.
fn take_reassert_due(ctx: &mut WorkflowContext<TwdWorkflow>) -> bool {
    let now = now_millis(ctx);
    ctx.state_mut(|s| {
        let signalled = std::mem::take(&mut s.spec_signalled);
        let every = i64::try_from(REASSERT_EVERY.as_millis()).unwrap_or(i64::MAX);
        let due = signalled || s.reasserted_at.is_none_or(|at| now - at >= every);
        if due {
            s.reasserted_at = Some(now);
        }
        due
    })
}

/// `recheck`: re-assertion and observation in one activity (a local one on a `quiet` turn);
/// each change re-asserted is a Normal event.
async fn recheck(
    ctx: &WorkflowContext<TwdWorkflow>,
    twd: &TwdRef,
    quiet: bool,
) -> Result<Observation, crate::model::Blocked> {
    let summary = "reassert resources and observe";
    let outcome = if quiet {
        support::run_local_activity(ctx, Recheck, twd.clone(), summary).await?
    } else {
        run_activity(ctx, Recheck, twd.clone(), summary, short_options()).await?
    };
    for change in outcome.reasserted.changes {
        event(ctx, twd, EventKind::Normal, &change.reason, change.message).await;
    }
    Ok(outcome.observation)
}

/// Takes the observed spec when it is newer than the last spec signal (the watcher missed or
/// has not yet delivered a change: ARCHITECTURE invariant 5); returns whether it did, so the
/// turn that acts on it follows at once.
fn adopt_observed_spec(ctx: &mut WorkflowContext<TwdWorkflow>, observation: &Observation) -> bool {
    let Some(observed) = observation.spec.as_ref() else {
        return false;
    };
    let signal = SpecSignal {
        generation: observed.generation,
        build_id: observed.target_build_id.clone(),
        deleting: observed.deleting,
        uid: Some(observed.uid.clone()),
        nudge: false,
    };
    let newer = ctx.state(|s| s.spec.as_ref().is_some_and(|held| signal.supersedes(held)));
    if !newer {
        return false;
    }
    ctx.state_mut(|s| s.take_spec(signal))
}

impl TwdWorkflow {
    /// Takes `signal` as the spec when it is newer than the one held; returns whether it was.
    fn take_spec(&mut self, signal: SpecSignal) -> bool {
        let newer = self
            .spec
            .as_ref()
            .is_none_or(|current| signal.supersedes(current));
        if newer {
            // Another object of the name took over: its status was never written by this run.
            if self
                .spec
                .as_ref()
                .is_some_and(|held| held.uid != signal.uid)
            {
                self.last_status = None;
            }
            // An aborted build rolls out again once the spec has moved on and come back to it.
            self.aborted.retain(|build| *build == signal.build_id);
            self.spec = Some(signal);
        }
        newer
    }

    /// What `action` does now, decided on the control state the rollout in flight last
    /// reported (a rollout that has not reported yet is taken as just started).
    fn control_effect(&self, action: ControlAction) -> ControlEffect {
        let state = self.active.as_ref().map(|active| {
            let report = self
                .last_report
                .as_ref()
                .filter(|r| r.workflow_id == active.workflow_id);
            report
                .and_then(|r| r.control.clone())
                .unwrap_or_else(|| ControlState {
                    build_id: active.build_id.clone(),
                    progress: report.map(|r| r.progress),
                    blocked: report.and_then(|r| r.blocked.as_ref()).map(|b| b.reason),
                    operator_paused: false,
                    spec_paused: false,
                    promote_requested: false,
                })
        });
        let wanted = self.spec.as_ref().map(|s| s.build_id.as_str());
        control::twd_effect(action, &self.input.twd.key(), state.as_ref(), wanted)
    }

    fn push_control(&mut self, action: ControlAction) {
        self.controls.push(action);
        self.wakeups += 1;
    }

    /// Whether the latest report brings routing not considered yet that can be shown during
    /// an observation: it comes from the rollout in flight, and this run's latest observation
    /// read the spec of that rollout's build. A first report after a spec change waits for the
    /// observation in flight, the first of the new spec (shown on the previous spec's reading,
    /// the status would describe the previous rollout with the new routing).
    fn routing_to_show(&self) -> bool {
        self.last_report.as_ref().is_some_and(|r| {
            r.routing.is_some()
                && r.sequence > self.routing_shown
                && self
                    .active
                    .as_ref()
                    .is_some_and(|a| a.workflow_id == r.workflow_id)
                && self
                    .last_observation
                    .as_ref()
                    .and_then(|o| o.spec.as_ref())
                    .is_some_and(|spec| spec.target_build_id == r.build_id)
        })
    }

    /// Whether what woke this turn can only have been a report of the rollout in flight, still
    /// under way: no spec signal, control or nudge is pending, and this run's latest
    /// observation (the base the report is shown on) read Temporal.
    fn only_a_report_came(&self) -> bool {
        let in_flight = self.last_report.as_ref().is_some_and(|report| {
            self.active
                .as_ref()
                .is_some_and(|a| a.workflow_id == report.workflow_id)
                && matches!(
                    report.progress,
                    RolloutProgress::WaitingForPollers
                        | RolloutProgress::WaitingForPromotion
                        | RolloutProgress::Ramping
                        | RolloutProgress::WaitingForAvailability
                        | RolloutProgress::Paused
                )
        });
        in_flight
            && !self.spec_signalled
            && !self.poked
            && self.controls.is_empty()
            && self
                .last_observation
                .as_ref()
                .is_some_and(|o| o.temporal.is_ok())
    }
}

/// Starts a rollout for a new target build (superseding the old one), or tells the running one
/// that something changed.
async fn dispatch_rollout(ctx: &mut WorkflowContext<TwdWorkflow>, twd: &TwdRef, spec: &SpecSignal) {
    let active = ctx.state(|s| s.active.clone());
    let aborted = ctx.state(|s| s.aborted.contains(&spec.build_id));
    let poked = ctx.state_mut(|s| std::mem::take(&mut s.poked));
    let Some(active) = active else {
        if !aborted {
            start_new_build(ctx, twd, spec).await;
        }
        return;
    };
    if active.build_id != spec.build_id {
        // The new build first; the one it supersedes, if still running, learns of it next (it
        // re-checks the target itself, so the order does not matter to it).
        let ended = ctx.state(|s| {
            s.last_report.as_ref().is_some_and(|r| {
                r.workflow_id == active.workflow_id
                    && matches!(
                        r.progress,
                        RolloutProgress::Superseded
                            | RolloutProgress::Complete
                            | RolloutProgress::Aborted
                    )
            })
        });
        if !aborted {
            start_new_build(ctx, twd, spec).await;
        }
        if !ended {
            nudge(ctx, &active.workflow_id, "superseded by a newer build").await;
        }
        return;
    }
    let ended = ctx.state(|s| {
        s.last_report
            .as_ref()
            .filter(|r| r.build_id == spec.build_id)
            .map(|r| r.progress)
            .filter(|p| {
                matches!(
                    p,
                    RolloutProgress::Superseded
                        | RolloutProgress::Complete
                        | RolloutProgress::Aborted
                )
            })
    });
    let spec_changed = spec.generation > active.notified_generation;
    match ended {
        // It exited as superseded while its build became the target again: run it again.
        Some(RolloutProgress::Superseded) if !aborted => {
            if let Some(spec) = confirm_target(ctx, twd, &active.build_id).await {
                start_rollout(ctx, twd, &spec).await;
            }
        }
        // Finished: a spec change (e.g. replicas) gets a fresh run, which ends at once when the
        // build is still Current.
        Some(RolloutProgress::Complete) if spec_changed => start_rollout(ctx, twd, spec).await,
        // The spec changed while it ran (e.g. replicas): it was nudged, but a nudge that lands
        // after its last observation began is not acted on. A fresh run applies the change
        // (and ends at once, the build being Current).
        Some(RolloutProgress::Complete)
            if active
                .started_generation
                .is_some_and(|started| spec.generation > started) =>
        {
            start_rollout(ctx, twd, spec).await;
        }
        Some(_) => {}
        None if spec_changed || poked => {
            nudge(ctx, &active.workflow_id, "spec changed").await;
            ctx.state_mut(|s| {
                if let Some(a) = s.active.as_mut() {
                    a.notified_generation = spec.generation;
                }
            });
        }
        None => {}
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
    let observed = observation.spec?;
    let confirmed = !observed.deleting && observed.target_build_id == build_id;
    let signal = SpecSignal {
        generation: observed.generation,
        build_id: observed.target_build_id,
        deleting: observed.deleting,
        uid: Some(observed.uid),
        nudge: false,
    };
    ctx.state_mut(|s| {
        if s.take_spec(signal) {
            s.wakeups += 1;
        }
    });
    if confirmed {
        ctx.state(|s| s.spec.clone())
    } else {
        None
    }
}

/// Starts the rollout of a build that is new to this TWD. Its Deployment is created in the same
/// workflow task (the create is idempotent by name and creates only what the rollout's first
/// observation would), so the new pods do not wait for the child to start and run its first
/// task; the rollout then skips its own create-first.
async fn start_new_build(ctx: &mut WorkflowContext<TwdWorkflow>, twd: &TwdRef, spec: &SpecSignal) {
    // The run's latest observation may already show room for the new version; then the
    // create does not read Temporal again, which is refused for a moment after each change to
    // the worker deployment.
    let room = ctx.state(|s| {
        s.last_observation.as_ref().is_some_and(|o| {
            sunset::room_for_a_new_version(o, sunset::DEFAULT_MAX_VERSIONS_INELIGIBLE_FOR_DELETION)
        })
    });
    let request = if room {
        BuildRequest::create_with_room(twd, &spec.build_id)
    } else {
        BuildRequest::create_before_observing(twd, &spec.build_id)
    };
    let options = with_summary(short_options(), "create Deployment");
    let (created, ()) = {
        let creating = ctx.execute_activity(CreateDeployment, request, options);
        let starting = launch_rollout(ctx, twd, spec, true);
        join!(creating, starting)
    };
    if let Ok(CreateDeploymentOutcome::Created { name }) = created {
        event(
            ctx,
            twd,
            EventKind::Normal,
            "DeploymentCreated",
            format!("Created Deployment {name} for build {}", spec.build_id),
        )
        .await;
    }
}

async fn start_rollout(ctx: &mut WorkflowContext<TwdWorkflow>, twd: &TwdRef, spec: &SpecSignal) {
    launch_rollout(ctx, twd, spec, false).await;
}

/// Starts the rollout child of `spec`'s build (`created`: its Deployment is being created
/// alongside) and makes it the one in flight.
async fn launch_rollout(
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
    let started = ctx
        .start_child_workflow(RolloutWorkflow::run, input, options)
        .await;
    if started.is_err() {
        // Already running (e.g. a superseded run that has not exited yet): it re-observes and
        // carries on, since its build is the target again.
        nudge(ctx, &workflow_id, "build is the target again").await;
    }
    ctx.state_mut(|s| {
        s.active = Some(ActiveRollout {
            build_id: spec.build_id.clone(),
            workflow_id,
            notified_generation: spec.generation,
            started_generation: Some(spec.generation),
        });
        s.last_report = None;
        // A new rollout's report sequence starts over: its routing is shown from its first
        // report on.
        s.routing_shown = 0;
    });
}

async fn nudge(ctx: &WorkflowContext<TwdWorkflow>, workflow_id: &str, reason: &str) {
    // A rollout that already ended cannot be signalled; nothing to do then.
    let _ = ctx
        .external_workflow(workflow_id.to_owned(), None)
        .signal(
            RolloutWorkflow::nudge,
            reason.to_owned(),
            support::signal_options(),
        )
        .await;
}

/// Forwards controls to the rollout in flight. With none in flight (no rollout yet, or it
/// completed, was superseded or aborted) the control is answered with an event
/// (`ControlIgnored`, or `ControlUnchanged` for a second `abort`),
/// except `retry` after an abort, which rolls the build out again.
async fn forward_controls(ctx: &mut WorkflowContext<TwdWorkflow>, twd: &TwdRef, spec: &SpecSignal) {
    let controls = ctx.state_mut(|s| std::mem::take(&mut s.controls));
    for action in controls {
        let (active, report) = ctx.state(|s| {
            let active = s.active.clone();
            let report = s.last_report.clone().filter(|r| {
                active
                    .as_ref()
                    .is_some_and(|a| a.workflow_id == r.workflow_id)
            });
            (active, report)
        });
        let Some(active) = active else {
            let answer = control::no_rollout(action, &twd.key());
            event(
                ctx,
                twd,
                EventKind::Normal,
                control::REASON_IGNORED,
                answer.message().to_owned(),
            )
            .await;
            continue;
        };
        let ended = report.as_ref().is_some_and(|r| {
            matches!(
                r.progress,
                RolloutProgress::Complete | RolloutProgress::Superseded | RolloutProgress::Aborted
            )
        });
        if !ended {
            let _ = ctx
                .external_workflow(active.workflow_id.clone(), None)
                .signal(RolloutWorkflow::control, action, support::signal_options())
                .await;
            continue;
        }
        let state = ControlState {
            build_id: active.build_id.clone(),
            progress: report.as_ref().map(|r| r.progress),
            blocked: None,
            operator_paused: false,
            spec_paused: false,
            promote_requested: false,
        };
        match control::effect(action, &state) {
            ControlEffect::Apply(message) if active.build_id == spec.build_id => {
                // `retry` after an abort: roll the build out again.
                ctx.state_mut(|s| s.aborted.retain(|b| *b != spec.build_id));
                event(ctx, twd, EventKind::Normal, "Retrying", message).await;
                start_rollout(ctx, twd, spec).await;
            }
            answer => {
                let reason = answer.event_reason().unwrap_or(control::REASON_IGNORED);
                event(
                    ctx,
                    twd,
                    EventKind::Normal,
                    reason,
                    answer.message().to_owned(),
                )
                .await;
            }
        }
    }
}

/// Writes the status projection when it differs from the last one written.
async fn write_status(
    ctx: &WorkflowContext<TwdWorkflow>,
    twd: &TwdRef,
    observation: &Observation,
    generation: i64,
) {
    let now = now_millis(ctx);
    let report = ctx.state(|s| s.last_report.clone());
    let projected = status::project(observation, report.as_ref(), generation, now);
    let sunset = ctx.state(|s| s.sunset.clone());
    let projected = status::with_drain(projected, observation, &sunset, now);
    let projected = status::with_scale(projected, observation, &twd.name);
    let unchanged = ctx.state(|s| {
        s.last_status
            .as_ref()
            .is_some_and(|last| same_status(last, &projected))
    });
    if unchanged {
        return;
    }
    let request = StatusRequest {
        twd: twd.clone(),
        status: projected.clone(),
    };
    if run_activity(ctx, WriteStatus, request, "write status", short_options())
        .await
        .is_ok()
    {
        ctx.state_mut(|s| s.last_status = Some(projected));
    }
}

/// Equal apart from timestamps that move on every projection.
fn same_status(a: &TemporalWorkerDeploymentStatus, b: &TemporalWorkerDeploymentStatus) -> bool {
    let strip = |s: &TemporalWorkerDeploymentStatus| {
        let mut s = s.clone();
        if let Some(r) = s.rollout.as_mut() {
            r.updated_at = None;
        }
        for c in &mut s.conditions {
            c.last_transition_time =
                k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default());
        }
        s
    };
    strip(a) == strip(b)
}

/// Executes the sunset plan; returns when to look again.
async fn retire_versions(
    ctx: &mut WorkflowContext<TwdWorkflow>,
    twd: &TwdRef,
    observation: &Observation,
) -> Option<Duration> {
    let now = now_millis(ctx);
    let memory = ctx.state(|s| s.sunset.clone());
    // An aborted target is retired like any other non-current version.
    let mut observation = observation.clone();
    if let Some(spec) = observation.spec.as_mut()
        && ctx.state(|s| s.aborted.contains(&spec.target_build_id))
    {
        spec.target_build_id.clear();
    }
    // Versions nothing else would retire are adopted.
    let memory = sunset::adopt_orphans(&observation, &memory, now);
    let plan = sunset::plan(&observation, &memory, now);
    ctx.state_mut(|s| s.sunset = plan.memory.clone());
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
                if run_activity(
                    ctx,
                    ScaleDeployment,
                    request,
                    &format!("scale {build_id} to 0"),
                    short_options(),
                )
                .await
                .is_ok()
                {
                    event(
                        ctx,
                        twd,
                        EventKind::Normal,
                        "ScaledDown",
                        format!("Scaled Deployment {deployment} of retired build {build_id} to 0"),
                    )
                    .await;
                }
            }
            SunsetAction::DeleteDeployment {
                build_id,
                deployment,
            } => {
                let request = DeploymentRequest {
                    namespace: twd.namespace.clone(),
                    name: deployment.clone(),
                };
                if run_activity(
                    ctx,
                    DeleteDeployment,
                    request,
                    &format!("delete Deployment of {build_id}"),
                    short_options(),
                )
                .await
                .is_ok()
                {
                    event(
                        ctx,
                        twd,
                        EventKind::Normal,
                        "DeploymentDeleted",
                        format!("Deleted Deployment {deployment} of retired build {build_id}"),
                    )
                    .await;
                }
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
    let now = now_millis(ctx);
    ctx.state_mut(|s| {
        if let Some(entry) = s.sunset.iter_mut().find(|m| m.build_id == build_id) {
            entry.drain.pinned = Some(PinnedSnapshot {
                open: count.open,
                oldest_started_at: count.oldest_started_at,
                counted_at: now,
            });
        }
    });
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
            ctx.state_mut(|s| {
                if let Some(entry) = s.sunset.iter_mut().find(|m| m.build_id == build_id)
                    && !entry.drain.done.contains(&step)
                {
                    entry.drain.done.push(step);
                }
            });
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

/// Deletion: stop the rollout, clean Temporal and Kubernetes, release the finalizers; true
/// once the TWD is released, false when a spec signal of a live object of its name (the other
/// kind, which took over) ended it first.
async fn delete(ctx: &mut WorkflowContext<TwdWorkflow>, twd: &TwdRef) -> WorkflowResult<bool> {
    if let Some(active) = ctx.state(|s| s.active.clone()) {
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
        if !ctx.state(|s| s.spec.as_ref().is_some_and(|spec| spec.deleting)) {
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
        let step = ctx.state_mut(|s| deletion::after_attempt(&mut s.cleanup, &outcome, now));
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
                ctx.state_mut(|s| deletion::backoff(&mut s.cleanup))
            }
            DeletionStep::Retry { pause } => {
                show_cleanup_wait(ctx, twd, blocked_by, &message).await;
                pause
            }
        };
        let seen = ctx.state(|s| s.spec_signals);
        select! {
            _ = ctx.timer(support::timer(pause)) => {},
            _ = ctx.wait_condition_with_options(move |s: &TwdWorkflow| s.spec_signals != seen, support::condition_options()) => {},
        };
        if history_full(ctx, ctx.state(|s| s.input.history_event_bound)) {
            continue_as_new(ctx)?;
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
    if ctx.state(|s| s.cleanup.shown.as_deref() == Some(message)) {
        return;
    }
    ctx.state_mut(|s| s.cleanup.shown = Some(message.to_owned()));
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
    let Some(generation) = observation.spec.as_ref().map(|s| s.generation) else {
        return;
    };
    let now = now_millis(ctx);
    let report = ctx.state(|s| s.last_report.clone());
    let projected = status::project(&observation, report.as_ref(), generation, now);
    let request = StatusRequest {
        twd: twd.clone(),
        status: status::with_condition(projected, view, generation, now),
    };
    let _ = run_activity(ctx, WriteStatus, request, "write status", short_options()).await;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resync_falls_due_within_ten_percent_of_its_period() {
        let period = Duration::from_secs(300);
        // (draw, seconds)
        let cases = [
            (0.0, 270.0),
            (0.5, 300.0),
            (0.999, 329.94),
            (-1.0, 270.0),
            (7.0, 330.0),
        ];
        for (draw, seconds) in cases {
            let got = jittered(period, draw).as_secs_f64();
            assert!((got - seconds).abs() < 0.01, "{draw}: {got}");
        }
    }

    fn report(workflow_id: &str, progress: RolloutProgress) -> RolloutReport {
        RolloutReport {
            build_id: "v2".to_owned(),
            workflow_id: workflow_id.to_owned(),
            run_id: "run".to_owned(),
            progress,
            step: None,
            ramp_percentage: None,
            next_step_at: None,
            blocked: None,
            message: String::new(),
            started_at: 0,
            gate_runs: Vec::new(),
            analysis: Vec::new(),
            sequence: 1,
            routing: None,
            control: None,
        }
    }

    /// A run that has observed once, with rollout `r2` of `v2` in flight and waiting.
    fn rolling() -> TwdWorkflow {
        TwdWorkflow {
            input: TwdInput {
                twd: TwdRef {
                    namespace: "ns".to_owned(),
                    name: "w".to_owned(),
                },
                search_attributes: false,
                history_event_bound: None,
                resync_seconds: None,
                carried: None,
            },
            spec: None,
            active: Some(ActiveRollout {
                build_id: "v2".to_owned(),
                workflow_id: "r2".to_owned(),
                notified_generation: 2,
                started_generation: Some(2),
            }),
            last_report: Some(report("r2", RolloutProgress::WaitingForPollers)),
            sunset: Vec::new(),
            aborted: Vec::new(),
            controls: Vec::new(),
            wakeups: 0,
            poked: false,
            last_status: None,
            cleanup: CleanupProgress::default(),
            reasserted_at: Some(0),
            spec_signalled: false,
            spec_signals: 0,
            autoscale: AutoscaleMemory::default(),
            last_observation: Some(Observation {
                spec: None,
                deployments: Vec::new(),
                temporal: Ok(crate::model::TemporalState::default()),
                observed_at: 0,
            }),
            routing_shown: 0,
        }
    }

    #[test]
    fn only_reports_of_a_rollout_still_under_way_skip_the_observation() {
        type Change = fn(&mut TwdWorkflow);
        let cases: [(&str, Change, bool); 13] = [
            ("waiting for pollers", |_| {}, true),
            (
                "waiting for promotion",
                |s| s.last_report = Some(report("r2", RolloutProgress::WaitingForPromotion)),
                true,
            ),
            (
                "ramping",
                |s| s.last_report = Some(report("r2", RolloutProgress::Ramping)),
                true,
            ),
            (
                "paused",
                |s| s.last_report = Some(report("r2", RolloutProgress::Paused)),
                true,
            ),
            (
                "complete: retire and observe",
                |s| s.last_report = Some(report("r2", RolloutProgress::Complete)),
                false,
            ),
            (
                "blocked",
                |s| s.last_report = Some(report("r2", RolloutProgress::Blocked)),
                false,
            ),
            (
                "aborted",
                |s| s.last_report = Some(report("r2", RolloutProgress::Aborted)),
                false,
            ),
            (
                "a report of another rollout",
                |s| s.last_report = Some(report("r1", RolloutProgress::Ramping)),
                false,
            ),
            ("a spec signal too", |s| s.spec_signalled = true, false),
            ("a duplicate spec signal too", |s| s.poked = true, false),
            (
                "a control too",
                |s| s.controls.push(ControlAction::Pause),
                false,
            ),
            (
                "nothing observed yet in this run",
                |s| s.last_observation = None,
                false,
            ),
            (
                "the latest observation could not read Temporal",
                |s| {
                    if let Some(o) = s.last_observation.as_mut() {
                        o.temporal = Err(crate::model::Blocked {
                            reason: crate::model::BlockReason::TemporalClientCreationFailed,
                            message: String::new(),
                        });
                    }
                },
                false,
            ),
        ];
        for (case, change, expected) in cases {
            let mut state = rolling();
            change(&mut state);
            assert_eq!(state.only_a_report_came(), expected, "{case}");
        }
    }

    #[test]
    fn reported_routing_stamps_the_ramp_with_the_report_time_where_it_changed() {
        use crate::model::{AppliedRouting, TemporalState};
        let observed = |ramping: Option<&str>, percentage: Option<f32>| Observation {
            spec: None,
            deployments: Vec::new(),
            temporal: Ok(TemporalState {
                current_build_id: Some("v1".to_owned()),
                ramping_build_id: ramping.map(str::to_owned),
                ramp_percentage: percentage,
                ramping_since: ramping.map(|_| 100),
                ramp_changed_at: ramping.map(|_| 200),
                manager_identity: "twc".to_owned(),
                ..TemporalState::default()
            }),
            observed_at: 0,
        };
        let routing = |ramping: Option<&str>, percentage: Option<u8>| AppliedRouting {
            current_build_id: Some("v1".to_owned()),
            ramping_build_id: ramping.map(str::to_owned),
            ramp_percentage: percentage,
        };
        // (case, before, reported, expected ramping_since, expected ramp_changed_at)
        let cases = [
            (
                "a new ramp",
                observed(None, None),
                routing(Some("v2"), Some(10)),
                Some(900),
                Some(900),
            ),
            (
                "the next step",
                observed(Some("v2"), Some(10.0)),
                routing(Some("v2"), Some(40)),
                Some(100),
                Some(900),
            ),
            (
                "the same step again",
                observed(Some("v2"), Some(40.0)),
                routing(Some("v2"), Some(40)),
                Some(100),
                Some(200),
            ),
            (
                "the ramp cleared",
                observed(Some("v2"), Some(40.0)),
                routing(None, None),
                None,
                None,
            ),
        ];
        for (case, before, reported, since, changed) in cases {
            let applied = reported.applied_at(&before, 900).expect(case);
            let temporal = applied.temporal.expect(case);
            assert_eq!(
                (temporal.ramping_since, temporal.ramp_changed_at),
                (since, changed),
                "{case}"
            );
        }
        let mut unmanaged = observed(None, None);
        if let Ok(t) = unmanaged.temporal.as_mut() {
            t.manager_identity.clear();
        }
        assert_eq!(
            routing(Some("v2"), Some(10)).applied_at(&unmanaged, 900),
            None,
            "no manager yet: not shown from the report"
        );
    }

    #[test]
    fn reports_are_shown_during_an_observation_only_on_a_reading_of_their_builds_spec() {
        use crate::model::AppliedRouting;
        let routed = |mut s: TwdWorkflow| {
            if let Some(r) = s.last_report.as_mut() {
                r.routing = Some(AppliedRouting {
                    current_build_id: Some("v1".to_owned()),
                    ramping_build_id: Some("v2".to_owned()),
                    ramp_percentage: Some(10),
                });
            }
            s
        };
        fn reading(s: &mut TwdWorkflow, target: &str) {
            if let Some(o) = s.last_observation.as_mut() {
                let mut spec = crate::plan::fixtures::spec(
                    twc_crds::worker_deployment::RolloutStrategy::Progressive,
                );
                spec.target_build_id = target.to_owned();
                o.spec = Some(spec);
            }
        }
        type Change = fn(&mut TwdWorkflow);
        let cases: [(&str, Change, bool); 6] = [
            (
                "routing on a reading of v2's spec",
                |s: &mut TwdWorkflow| reading(s, "v2"),
                true,
            ),
            (
                "a reading of the previous spec (v1)",
                |s: &mut TwdWorkflow| reading(s, "v1"),
                false,
            ),
            (
                "nothing read yet",
                |s: &mut TwdWorkflow| s.last_observation = None,
                false,
            ),
            (
                "already shown",
                |s: &mut TwdWorkflow| {
                    reading(s, "v2");
                    s.routing_shown = 1;
                },
                false,
            ),
            (
                "a report of another rollout",
                |s: &mut TwdWorkflow| {
                    reading(s, "v2");
                    if let Some(r) = s.last_report.as_mut() {
                        r.workflow_id = "r1".to_owned();
                    }
                },
                false,
            ),
            (
                "a report without routing",
                |s: &mut TwdWorkflow| {
                    reading(s, "v2");
                    if let Some(r) = s.last_report.as_mut() {
                        r.routing = None;
                    }
                },
                false,
            ),
        ];
        for (case, change, expected) in cases {
            let mut state = routed(rolling());
            change(&mut state);
            assert_eq!(state.routing_to_show(), expected, "{case}");
        }
    }

    #[test]
    fn an_observation_read_before_the_reported_write_is_settled_on_the_reported_routing() {
        use crate::model::{AppliedRouting, TemporalState};
        use crate::plan::fixtures::version;
        use twc_crds::worker_deployment::VersionState;
        let observed = |current: &str, ramping: Option<(&str, f32)>| Observation {
            spec: None,
            deployments: Vec::new(),
            temporal: Ok(TemporalState {
                current_build_id: Some(current.to_owned()),
                ramping_build_id: ramping.map(|(b, _)| b.to_owned()),
                ramp_percentage: ramping.map(|(_, p)| p),
                versions: vec![
                    version(
                        "v1",
                        if current == "v1" {
                            VersionState::Current
                        } else {
                            VersionState::Draining
                        },
                    ),
                    version(
                        "v2",
                        if current == "v2" {
                            VersionState::Current
                        } else {
                            VersionState::Inactive
                        },
                    ),
                ],
                manager_identity: "twc".to_owned(),
                ..TemporalState::default()
            }),
            observed_at: 0,
        };
        let routing = |current: &str, ramping: Option<(&str, u8)>| AppliedRouting {
            current_build_id: Some(current.to_owned()),
            ramping_build_id: ramping.map(|(b, _)| b.to_owned()),
            ramp_percentage: ramping.map(|(_, p)| p),
        };
        // (case, read, shown before the reports, shown from the last report, expected current,
        // expected ramp)
        let cases = [
            (
                "read before the write: the report's routing",
                observed("v1", None),
                routing("v1", None),
                routing("v2", None),
                "v2",
                None,
            ),
            (
                "read after the write: as read",
                observed("v2", None),
                routing("v1", None),
                routing("v2", None),
                "v2",
                None,
            ),
            (
                "changed again after the write (an operator): as read",
                observed("v1", Some(("v2", 5.0))),
                routing("v1", None),
                routing("v2", None),
                "v1",
                Some(("v2".to_owned(), 5.0)),
            ),
            (
                "a ramp step read before its write: the step",
                observed("v1", Some(("v2", 10.0))),
                routing("v1", Some(("v2", 10))),
                routing("v1", Some(("v2", 40))),
                "v1",
                Some(("v2".to_owned(), 40.0)),
            ),
        ];
        for (case, read, before, shown, current, ramp) in cases {
            let settled = shown.settle(read, &before);
            let temporal = settled.temporal.expect(case);
            assert_eq!(
                temporal.current_build_id.as_deref(),
                Some(current),
                "{case}"
            );
            assert_eq!(
                temporal
                    .ramping_build_id
                    .clone()
                    .zip(temporal.ramp_percentage),
                ramp,
                "{case}"
            );
            let state = |build: &str| temporal.version(build).map(|v| v.state);
            if current == "v2" {
                assert_eq!(state("v2"), Some(VersionState::Current), "{case}");
                assert_eq!(state("v1"), Some(VersionState::Draining), "{case}");
            }
        }
        let mut unreadable = observed("v1", None);
        unreadable.temporal = Err(crate::model::Blocked {
            reason: crate::model::BlockReason::PlanExecutionFailed,
            message: "unreachable".to_owned(),
        });
        let settled = routing("v2", None).settle(unreadable.clone(), &routing("v1", None));
        assert_eq!(
            settled, unreadable,
            "an unreadable Temporal stays unreadable"
        );
    }
}
