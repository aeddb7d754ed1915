//! The TWD workflow's decisions: what a turn does, given the workflow's state (its memory, and
//! what signals, reports and controls brought since the last turn) and what it observed. The
//! workflow (`twd_workflow.rs`) executes them; every change of its state is a method here, and
//! the status it writes is one function of that state ([`TwdState::status`]).
//!
//! A turn, woken by its timer or by a signal, is one [`TwdDecision`]:
//! - no spec yet: wait for one;
//! - the TWD is being deleted: the deletion path ([`crate::plan::deletion`]);
//! - only a report of the rollout under way came: show it ([`ReportShown`]), read nothing;
//! - otherwise a full [`Turn`]: show routing the rollout reported, re-assert resources first on a
//!   run's first turn, start or tell rollouts ([`Dispatch`]), answer controls ([`ControlStep`]),
//!   read the world ([`Reading`]), then show the status, retire versions
//!   ([`TwdState::sunset_plan`]) and autoscale ([`AutoscaleStep`]).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use twc_crds::worker_deployment::TemporalWorkerDeploymentStatus;

use crate::contract::TargetFailure;
use crate::control::{self, ControlEffect, ControlState};
use crate::model::{
    AppliedRouting, AutoscalePolicy, ControlAction, Observation, RolloutProgress, RolloutReport,
    UnixMillis,
};
use crate::plan::autoscale::{self, AutoscaleMemory, Scaled};
use crate::plan::conditions::ConditionView;
use crate::plan::deletion::CleanupProgress;
use crate::plan::drain::{DrainStep, PinnedSnapshot};
use crate::plan::sunset::{self, SunsetMemory, SunsetPlan};
use crate::plan::{notify, status};

/// Longest interval between re-assertions of a TWD's resources while nothing signals a change.
pub const REASSERT_EVERY: Duration = Duration::from_secs(30);

/// Wait before the next turn when a turn's reading failed.
pub const AFTER_A_FAILED_READING: Duration = Duration::from_secs(30);

/// `period` stretched by `draw` (in `[0, 1)`) to between 90 % and 110 % of it: the resyncs of
/// many TWDs started at once drift apart instead of reading Temporal together.
pub fn jittered(period: Duration, draw: f64) -> Duration {
    period.mul_f64(0.9 + 0.2 * draw.clamp(0.0, 1.0))
}

/// Loop turns after which a run from before the `short-runs` patch continues as new (with
/// an idle turn's 6 events, about 3,000 events: 1.7 days at the default resync).
pub const MAX_TURNS_PER_RUN: u32 = 500;

pub use crate::RUN_EVENT_BOUND;

/// How long a run may grow before it continues as new.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunLength {
    /// Turns this run has taken.
    pub turns: u32,
    /// Events in its history so far.
    pub history_length: u32,
    /// Temporal suggests continuing as new (the history is large in bytes).
    pub suggested: bool,
    /// The controller's history bound (`--history-event-bound`).
    pub bound: u32,
    /// The run has the `short-runs` patch (histories from before it keep their turn limit).
    pub short_runs: bool,
    /// The rollout this run worked on has ended and nothing is pending
    /// ([`TwdState::settled_after_work`]), under the `settled-runs` patch: the run ends there,
    /// so the idle time that follows is spent in a short history.
    pub settled_after_work: bool,
}

impl RunLength {
    /// Whether the run continues as new after the turn it has just taken.
    pub fn is_over(&self) -> bool {
        if self.suggested || self.settled_after_work {
            return true;
        }
        if self.short_runs {
            self.history_length >= self.bound.min(RUN_EVENT_BOUND)
        } else {
            self.turns >= MAX_TURNS_PER_RUN || self.history_length >= self.bound
        }
    }
}

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

    /// The signal an observation's reading of the TWD stands for (`None`: the TWD is gone).
    pub fn observed(observation: &Observation) -> Option<Self> {
        let observed = observation.spec.as_ref()?;
        Some(SpecSignal {
            generation: observed.generation,
            build_id: observed.target_build_id.clone(),
            deleting: observed.deleting,
            uid: Some(observed.uid.clone()),
            nudge: false,
        })
    }
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
    /// When its start was recorded (workflow time), under `show-starting-rollout`: until its
    /// first report the status names it by this and its workflow ID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<UnixMillis>,
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
    /// Webhook targets failing, as the notification workflow last reported.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notification_failures: Vec<TargetFailure>,
    /// The next run's first turn is a resync at a time the previous run chose, not a turn at
    /// once (absent: a turn at once, as every run before `settled-runs` started).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quiet_start: Option<QuietStart>,
    /// Continued by a build that bounds a run at [`RUN_EVENT_BOUND`] events (`short-runs`):
    /// the next run takes the bound without asking the patch, whose marker (with the
    /// search-attribute upsert the SDK adds to it) every run's first turn would record.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub short_runs: bool,
}

/// What a run that ends with nothing pending hands the next one, so its first turn is the
/// resync the previous run would have taken: at the same time, re-asserting and writing only
/// what is due or changed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuietStart {
    /// When the first turn falls due (workflow time).
    pub turn_at: UnixMillis,
    /// When the resources were last re-asserted.
    pub reasserted_at: Option<UnixMillis>,
    /// The status last written.
    pub status: Option<TemporalWorkerDeploymentStatus>,
}

impl QuietStart {
    /// The wait before the first turn of a run resumed from `carried` at `now`: none without a
    /// quiet start (or once its time has passed), else until its time.
    pub fn first_wait(carried: Option<&CarriedTwd>, now: UnixMillis) -> Duration {
        carried
            .and_then(|c| c.quiet_start.as_ref())
            .map_or(Duration::ZERO, |quiet| {
                Duration::from_millis(u64::try_from(quiet.turn_at - now).unwrap_or(0))
            })
    }
}

/// What the TWD workflow knows between turns: its memory (carried over a continue-as-new),
/// its inbox (what signals and controls brought since the last turn) and what this run has
/// read and shown.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TwdState {
    /// The spec the watcher (or an observation) last told of.
    pub spec: Option<SpecSignal>,
    /// Rollout in flight.
    pub active: Option<ActiveRollout>,
    /// Its latest report.
    pub last_report: Option<RolloutReport>,
    /// The workflow ID of the rollout being started (between [`launching`](Self::launching)
    /// and [`started`](Self::started)).
    pub launching: Option<String>,
    /// The latest report of each run of the rollout being started, received before its start
    /// was recorded: Temporal hands a workflow task's signals over before a child's start
    /// result, so a rollout that ran while this workflow's task waited (on a dead worker) has
    /// reported before `started` runs. `started` shows the started run's.
    pub early_reports: Vec<RolloutReport>,
    /// Versions being retired.
    pub sunset: Vec<SunsetMemory>,
    /// Builds an operator aborted (not restarted until the spec moves on).
    pub aborted: Vec<String>,
    /// Progress of the deletion path.
    pub cleanup: CleanupProgress,
    /// Autoscaler recommendations and pacing.
    pub autoscale: AutoscaleMemory,
    /// Webhook targets failing, as the notification workflow last reported.
    pub notification_failures: Vec<TargetFailure>,
    /// Inbox: controls received and not yet forwarded.
    pub controls: Vec<ControlAction>,
    /// Inbox: a duplicate spec signal arrived (something around the TWD changed): the rollout
    /// is told.
    pub poked: bool,
    /// Inbox: a spec signal arrived since the last re-assertion.
    pub spec_signalled: bool,
    /// When this run last re-asserted the TWD's resources.
    pub reasserted_at: Option<UnixMillis>,
    /// This run's latest observation (the base reported routing is shown on).
    pub last_observation: Option<Observation>,
    /// Sequence of the last report whose routing was considered for the status.
    pub routing_shown: u64,
    /// The status last written by this run.
    pub last_status: Option<TemporalWorkerDeploymentStatus>,
    /// This run started a rollout ([`launching`](Self::launching)) or took a report of one
    /// ([`receive_report`](Self::receive_report)).
    pub worked: bool,
}

/// What woke a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woke {
    /// Nothing: the turn follows the previous one at once (a run's first turn, a spec taken
    /// from an observation, a takeover during deletion).
    AtOnce,
    /// Its timer (a resync, a sunset or autoscaling step): nothing is expected to have changed.
    Timer,
    /// A signal, report or control before the timer.
    Signal,
}

/// What a turn does.
#[derive(Debug, Clone, PartialEq)]
pub enum TwdDecision {
    /// No spec signal yet: look again at the resync.
    AwaitSpec,
    /// The TWD is being deleted: stop the rollout, clean up, release the finalizers.
    Delete,
    /// Only a report of the rollout under way came: show it and read nothing; the timer keeps
    /// its deadline.
    ShowReport(Box<ReportShown>),
    /// A full turn.
    Turn(Turn),
}

/// A report-only turn's status: this run's latest observation, with the report's routing.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportShown {
    /// The latest observation with the reported routing applied (ramp times taken as now): it
    /// stays the run's latest observation, so a later report without routing keeps it.
    pub observation: Observation,
    /// The report whose routing it shows, if it brought any.
    pub routing_of: Option<u64>,
}

/// A full turn.
#[derive(Debug, Clone, PartialEq)]
pub struct Turn {
    /// The spec the turn acts on.
    pub spec: SpecSignal,
    /// Show routing the rollout in flight reported before anything else.
    pub show_reported_routing: bool,
    /// A run's first turn: re-assert the finalizers (and take over what another object of the
    /// name leaves) before a rollout is dispatched. Later turns dispatch first and re-assert
    /// with the reading.
    pub reassert_first: bool,
    /// Only the timer woke it: the reading is a local activity.
    pub quiet: bool,
}

/// The next turn's decision.
pub fn decide(state: &TwdState, woke: Woke, now: UnixMillis) -> TwdDecision {
    let Some(spec) = state.spec.clone() else {
        return TwdDecision::AwaitSpec;
    };
    if spec.deleting {
        return TwdDecision::Delete;
    }
    let only_a_report = woke == Woke::Signal && state.only_a_report_came();
    if only_a_report && let Some(shown) = state.report_to_show(now) {
        return TwdDecision::ShowReport(Box::new(shown));
    }
    TwdDecision::Turn(Turn {
        spec,
        // Routing a report-only turn could not show (no manager yet) is read instead.
        show_reported_routing: !only_a_report,
        reassert_first: state.reasserted_at.is_none(),
        quiet: woke == Woke::Timer,
    })
}

/// What a turn does about rollouts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dispatch {
    /// Nothing to start or tell.
    Nothing,
    /// Roll out a build new to this TWD, its Deployment created in the same workflow task
    /// (`room`: the run's latest observation shows room for it under the version limit). The
    /// rollout it supersedes, if still running, is nudged next.
    StartNew {
        /// Room for another version is known.
        room: bool,
        /// The superseded rollout to nudge.
        superseded: Option<String>,
    },
    /// Nudge the superseded rollout only: the new target was aborted before.
    NudgeSuperseded(String),
    /// Run the build's rollout again: it completed and the spec changed since.
    Restart,
    /// Its rollout exited as superseded while the build became the target again: run it again
    /// once an observation confirms the build is the target.
    RestartIfStillTarget(String),
    /// Tell the rollout in flight the spec (or something around it) changed.
    NotifySpecChange {
        /// The rollout.
        workflow_id: String,
        /// The generation it is told about.
        generation: i64,
    },
}

/// What a turn does with one control.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlStep {
    /// Forward it to the rollout in flight.
    Forward(String),
    /// Answer it with a Normal event (`reason`); nothing changes.
    Answer {
        /// Event reason.
        reason: &'static str,
        /// The answer.
        message: String,
    },
    /// `retry` after an abort: roll the build out again.
    Retry(String),
}

/// How a full turn reads the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// Re-assert resources and observe, in one activity (a local one on a quiet turn).
    Recheck {
        /// As a local activity.
        local: bool,
    },
    /// Observe in a local activity (one marker in the history): a quiet turn.
    LocalObserve,
    /// Observe in an activity, during which reports are shown.
    Observe,
}

impl Reading {
    /// The reading of a turn after its first (`reassert`: re-assertion due); `quiet`: only its
    /// timer woke it.
    pub fn of(reassert: bool, quiet: bool) -> Self {
        match (reassert, quiet) {
            (true, local) => Self::Recheck { local },
            (false, true) => Self::LocalObserve,
            (false, false) => Self::Observe,
        }
    }

    /// Whether reports that come during the reading are shown at once: not during a local
    /// activity on its own (a quiet turn expects nothing).
    pub fn shows_reports(self) -> bool {
        self != Self::LocalObserve
    }
}

/// What `spec.autoscaling` asks of a full turn.
#[derive(Debug, Clone, PartialEq)]
pub enum AutoscaleStep {
    /// No autoscaling.
    Off,
    /// Not due: look again at this time (if known).
    NotDue(Option<UnixMillis>),
    /// No version to size: look again after the idle period.
    Idle,
    /// Size `versions` from their backlogs (`read`: read them first; a fixed shared total
    /// reads nothing).
    Size {
        /// The policy.
        policy: AutoscalePolicy,
        /// The versions sized.
        versions: Vec<Scaled>,
        /// Read the backlogs first.
        read: bool,
    },
}

/// An observation the status shows, the spec generation it describes, and the condition the
/// deletion path adds (`Deleting`).
#[derive(Debug, Clone, PartialEq)]
pub struct Shown {
    /// What was read (with reported routing applied, where shown).
    pub observation: Observation,
    /// `status.observedGeneration`.
    pub generation: i64,
    /// The deletion path's condition.
    pub deleting: Option<ConditionView>,
}

impl Shown {
    /// `observation` as the status of `generation`.
    pub fn of(observation: Observation, generation: i64) -> Self {
        Self {
            observation,
            generation,
            deleting: None,
        }
    }

    /// `observation` as the status of the generation it read (`None`: the TWD was gone).
    pub fn as_read(observation: Observation) -> Option<Self> {
        let generation = observation.spec.as_ref()?.generation;
        Some(Self::of(observation, generation))
    }
}

/// Routing reported while a reading was under way: what the status showed before the first
/// such report, and the routing the last one brought. A reading that still sees the former was
/// read before the rollout's write and is settled on the latter ([`AppliedRouting::settle`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoutingDuringReading(Option<(AppliedRouting, AppliedRouting)>);

impl RoutingDuringReading {
    /// A report's routing was shown: `before` showed until then, `after` shows now.
    pub fn shown(&mut self, before: AppliedRouting, after: AppliedRouting) {
        let before = self.0.take().map_or(before, |(first, _)| first);
        self.0 = Some((before, after));
    }

    /// The reading, settled on the routing shown during it.
    pub fn settle(&self, read: Observation) -> Observation {
        match &self.0 {
            Some((before, after)) => after.settle(read, before),
            None => read,
        }
    }
}

impl TwdState {
    /// The state a run starts from.
    pub fn resumed(carried: Option<CarriedTwd>) -> Self {
        let Some(carried) = carried else {
            return Self::default();
        };
        Self {
            spec: carried.spec,
            active: carried.active,
            last_report: carried.last_report,
            sunset: carried.sunset,
            aborted: carried.aborted,
            cleanup: carried.cleanup,
            autoscale: carried.autoscale,
            notification_failures: carried.notification_failures,
            controls: carried.controls,
            poked: carried.poked,
            reasserted_at: carried.quiet_start.as_ref().and_then(|q| q.reasserted_at),
            last_status: carried.quiet_start.and_then(|q| q.status),
            ..Self::default()
        }
    }

    /// What the next run needs (signals received during this turn included). `turn_at`: when
    /// this run's next turn would have been, if nothing is pending (no signal came during the
    /// turn): the next run takes it as a [`QuietStart`] when the inbox is empty too.
    pub fn carried(&self, turn_at: Option<UnixMillis>) -> CarriedTwd {
        let quiet = self.controls.is_empty() && !self.poked && !self.spec_signalled;
        let quiet_start = turn_at.filter(|_| quiet).map(|turn_at| QuietStart {
            turn_at,
            reasserted_at: self.reasserted_at,
            status: self.last_status.clone(),
        });
        CarriedTwd {
            quiet_start,
            short_runs: true,
            spec: self.spec.clone(),
            active: self.active.clone(),
            last_report: self.last_report.clone(),
            sunset: self.sunset.clone(),
            aborted: self.aborted.clone(),
            controls: self.controls.clone(),
            poked: self.poked,
            cleanup: self.cleanup.clone(),
            autoscale: self.autoscale.clone(),
            notification_failures: self.notification_failures.clone(),
        }
    }

    /// The notification workflow's report of the targets failing now; returns whether it
    /// changes what the status shows.
    pub fn receive_notification_health(&mut self, failing: Vec<TargetFailure>) -> bool {
        if self.notification_failures == failing {
            return false;
        }
        self.notification_failures = failing;
        true
    }

    /// A spec signal from the watcher; returns whether it wants a turn (a new spec, or a
    /// duplicate that says something around the TWD changed).
    pub fn receive_spec(&mut self, signal: SpecSignal) -> bool {
        let nudge = signal.nudge;
        if !self.take_spec(signal) {
            if !nudge {
                // The spec held, sent again (a watcher's re-list): nothing to do.
                return false;
            }
            // Something around the TWD changed (its connection): the rollout is told too.
            self.poked = true;
        }
        self.spec_signalled = true;
        true
    }

    /// A rollout's report; returns whether it wants a turn. The last words of a superseded
    /// rollout (often delivered after the new rollout's first reports) and reports older than
    /// the one held are dropped. A report of the rollout being started is also kept aside for
    /// [`started`](Self::started) (which is all that differs from before `keep-early-reports`).
    pub fn receive_report(&mut self, report: RolloutReport) -> bool {
        if self.launching.as_ref() == Some(&report.workflow_id) {
            self.keep_early(&report);
        }
        let from_active = self
            .active
            .as_ref()
            .is_none_or(|a| a.workflow_id == report.workflow_id);
        let newer = self.last_report.as_ref().is_none_or(|last| {
            last.workflow_id != report.workflow_id || report.sequence > last.sequence
        });
        if !from_active || !newer {
            return false;
        }
        self.note_aborted(&report);
        self.last_report = Some(report);
        self.worked = true;
        true
    }

    /// Remembers `report`'s build as aborted when the report says so, so the spec naming it
    /// again does not roll it out again (until the spec moves on: [`take_spec`](Self::take_spec)).
    fn note_aborted(&mut self, report: &RolloutReport) {
        if report.progress == RolloutProgress::Aborted && !self.aborted.contains(&report.build_id) {
            self.aborted.push(report.build_id.clone());
        }
    }

    /// Takes `signal` as the spec when it is newer than the one held; returns whether it was.
    pub fn take_spec(&mut self, signal: SpecSignal) -> bool {
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

    /// Takes the spec `observation` read when it is newer than the one held (the watcher
    /// missed or has not yet delivered a change: ARCHITECTURE invariant 5); returns whether
    /// it did, so the turn that acts on it follows at once.
    pub fn adopt_observed_spec(&mut self, observation: &Observation) -> bool {
        let Some(signal) = SpecSignal::observed(observation) else {
            return false;
        };
        let newer = self
            .spec
            .as_ref()
            .is_some_and(|held| signal.supersedes(held));
        newer && self.take_spec(signal)
    }

    /// What `action` does now (the `control` update's answer), decided on the control state
    /// the rollout in flight last reported (a rollout that has not reported yet is taken as
    /// just started).
    pub fn control_effect(&self, action: ControlAction, twd: &str) -> ControlEffect {
        let state = self.active.as_ref().map(|active| {
            let report = self.report_of_active();
            report
                .and_then(|r| r.control.clone())
                .unwrap_or_else(|| ControlState::from_report(&active.build_id, report))
        });
        let wanted = self.spec.as_ref().map(|s| s.build_id.as_str());
        control::twd_effect(action, twd, state.as_ref(), wanted)
    }

    /// The latest report, when it comes from the rollout in flight.
    fn report_of_active(&self) -> Option<&RolloutReport> {
        let active = self.active.as_ref()?;
        self.last_report
            .as_ref()
            .filter(|r| r.workflow_id == active.workflow_id)
    }

    /// Nothing is under way: the spec is held and not being deleted, no rollout is being
    /// started, the one in flight (if any) has reported its end (Complete or Aborted), and no
    /// control, nudge or spec signal waits. Versions may still be retiring: the sunset's memory
    /// is carried like the rest.
    pub fn settled(&self) -> bool {
        let rollout_ended = self.active.is_none()
            || self.report_of_active().is_some_and(|r| {
                matches!(
                    r.progress,
                    RolloutProgress::Complete | RolloutProgress::Aborted
                )
            });
        self.spec.as_ref().is_some_and(|s| !s.deleting)
            && self.launching.is_none()
            && rollout_ended
            && self.controls.is_empty()
            && !self.poked
            && !self.spec_signalled
    }

    /// This run started a rollout or took a report of one, and nothing is under way now.
    pub fn settled_after_work(&self) -> bool {
        self.worked && self.settled()
    }

    /// Whether what woke this turn can only have been a report of the rollout in flight, still
    /// under way: no spec signal, control or nudge is pending, and this run's latest
    /// observation (the base the report is shown on) read Temporal.
    pub fn only_a_report_came(&self) -> bool {
        let in_flight = self.report_of_active().is_some_and(|report| {
            matches!(
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

    /// A report-only turn's status: the latest observation, with the latest report's routing
    /// when it brought routing not considered yet; `None` when that routing cannot be shown so
    /// (nobody managed the worker deployment yet, or nothing observed): a full turn reads it.
    fn report_to_show(&self, now: UnixMillis) -> Option<ReportShown> {
        let observation = self.last_observation.as_ref()?;
        let report = self.last_report.as_ref()?;
        match report
            .routing
            .as_ref()
            .filter(|_| report.sequence > self.routing_shown)
        {
            None => Some(ReportShown {
                observation: observation.clone(),
                routing_of: None,
            }),
            Some(routing) => Some(ReportShown {
                observation: routing.applied_at(observation, now)?,
                routing_of: Some(report.sequence),
            }),
        }
    }

    /// Records a report-only turn's status as this run's latest observation; what to show.
    pub fn show_report(&mut self, shown: ReportShown) -> Option<Shown> {
        if let Some(sequence) = shown.routing_of {
            self.routing_shown = sequence;
        }
        self.last_observation = Some(shown.observation.clone());
        Shown::as_read(shown.observation)
    }

    /// Whether the latest report brings routing not considered yet that can be shown during
    /// a reading: it comes from the rollout in flight, and this run's latest observation read
    /// the spec of that rollout's build. A first report after a spec change waits for the
    /// reading in flight, the first of the new spec (shown on the previous spec's reading, the
    /// status would describe the previous rollout with the new routing).
    pub fn routing_to_show(&self) -> bool {
        self.report_of_active().is_some_and(|r| {
            r.routing.is_some()
                && r.sequence > self.routing_shown
                && self
                    .last_observation
                    .as_ref()
                    .and_then(|o| o.spec.as_ref())
                    .is_some_and(|spec| spec.target_build_id == r.build_id)
        })
    }

    /// Routing the rollout in flight has just written, shown on this run's latest observation
    /// (without reading Temporal again; the turn's own reading corrects anything else): what to
    /// show, with the routing shown before and the routing shown now. Each report's routing is
    /// considered once, even when it cannot be shown.
    pub fn show_reported_routing(&mut self) -> Option<(Shown, AppliedRouting, AppliedRouting)> {
        let report = self.last_report.as_ref()?;
        let routing = report.routing.clone()?;
        if report.sequence <= self.routing_shown {
            return None;
        }
        self.routing_shown = report.sequence;
        self.report_of_active()?;
        let base = self.last_observation.as_ref()?;
        let before = AppliedRouting::read_in(base)?;
        // The status describes the spec that observation read, not a newer one a signal
        // brought meanwhile (that one is shown once observed).
        let shown = Shown::as_read(routing.applied_to(base)?)?;
        Some((shown, before, routing))
    }

    /// Whether resources are to be re-asserted now (a spec signal came, or
    /// [`REASSERT_EVERY`] passed); if so, `now` is taken as the last re-assertion.
    pub fn take_reassert_due(&mut self, now: UnixMillis) -> bool {
        let signalled = std::mem::take(&mut self.spec_signalled);
        let every = i64::try_from(REASSERT_EVERY.as_millis()).unwrap_or(i64::MAX);
        let due = signalled || self.reasserted_at.is_none_or(|at| now - at >= every);
        if due {
            self.reasserted_at = Some(now);
        }
        due
    }

    /// What the turn acting on `spec` does about rollouts; the nudge a duplicate spec signal
    /// asked for is taken.
    pub fn take_dispatch(&mut self, spec: &SpecSignal) -> Dispatch {
        let dispatch = self.dispatch(spec);
        self.poked = false;
        dispatch
    }

    /// What the turn acting on `spec` does about rollouts: start a new build (superseding the
    /// old one), run a finished one again, or tell the running one that something changed.
    pub fn dispatch(&self, spec: &SpecSignal) -> Dispatch {
        let aborted = self.aborted.contains(&spec.build_id);
        let Some(active) = &self.active else {
            return if aborted {
                Dispatch::Nothing
            } else {
                Dispatch::StartNew {
                    room: self.room_for_a_new_version(),
                    superseded: None,
                }
            };
        };
        let ended = |report: &RolloutReport| {
            matches!(
                report.progress,
                RolloutProgress::Superseded | RolloutProgress::Complete | RolloutProgress::Aborted
            )
        };
        if active.build_id != spec.build_id {
            // The new build first; the one it supersedes, if still running, learns of it next
            // (it re-checks the target itself, so the order does not matter to it).
            let superseded =
                (!self.report_of_active().is_some_and(ended)).then(|| active.workflow_id.clone());
            return match (aborted, superseded) {
                (false, superseded) => Dispatch::StartNew {
                    room: self.room_for_a_new_version(),
                    superseded,
                },
                (true, Some(workflow_id)) => Dispatch::NudgeSuperseded(workflow_id),
                (true, None) => Dispatch::Nothing,
            };
        }
        let ended = self
            .last_report
            .as_ref()
            .filter(|r| r.build_id == spec.build_id && ended(r))
            .map(|r| r.progress);
        let spec_changed = spec.generation > active.notified_generation;
        match ended {
            // It exited as superseded while its build became the target again: run it again.
            Some(RolloutProgress::Superseded) if !aborted => {
                Dispatch::RestartIfStillTarget(active.build_id.clone())
            }
            // Finished: a spec change (e.g. replicas) gets a fresh run, which ends at once when
            // the build is still Current.
            Some(RolloutProgress::Complete) if spec_changed => Dispatch::Restart,
            // The spec changed while it ran: it was nudged, but a nudge that lands after its
            // last observation began is not acted on. A fresh run applies the change.
            Some(RolloutProgress::Complete)
                if active
                    .started_generation
                    .is_some_and(|started| spec.generation > started) =>
            {
                Dispatch::Restart
            }
            Some(_) => Dispatch::Nothing,
            None if spec_changed || self.poked => Dispatch::NotifySpecChange {
                workflow_id: active.workflow_id.clone(),
                generation: spec.generation,
            },
            None => Dispatch::Nothing,
        }
    }

    /// Whether the run's latest observation shows room for a new version's Deployment under
    /// the default version limit, so its create need not read Temporal again.
    fn room_for_a_new_version(&self) -> bool {
        self.last_observation.as_ref().is_some_and(|o| {
            sunset::room_for_a_new_version(o, sunset::DEFAULT_MAX_VERSIONS_INELIGIBLE_FOR_DELETION)
        })
    }

    /// Keeps `report` as the latest of its run among [`TwdState::early_reports`].
    fn keep_early(&mut self, report: &RolloutReport) {
        match self
            .early_reports
            .iter_mut()
            .find(|early| early.run_id == report.run_id)
        {
            Some(early) if report.sequence > early.sequence => *early = report.clone(),
            Some(_) => {}
            None => self.early_reports.push(report.clone()),
        }
    }

    /// The rollout `workflow_id` is being started: its reports from now on are kept for
    /// [`started`](Self::started); none received before are.
    pub fn launching(&mut self, workflow_id: &str) {
        self.launching = Some(workflow_id.to_owned());
        self.early_reports.clear();
        self.worked = true;
    }

    /// The rollout of `spec`'s build (workflow `workflow_id`; `run_id` when this start made it,
    /// `None` when it was already running) was started: it is the one in flight, and its
    /// reports (whose sequence starts over) are shown from its first on, including
    /// (`keep_early`) those of that run that arrived since [`launching`](Self::launching),
    /// before its start was recorded. `at` (under `show-starting-rollout`) is when: the status
    /// names the rollout from then on, not only from its first report.
    pub fn started(
        &mut self,
        spec: &SpecSignal,
        workflow_id: String,
        run_id: Option<&str>,
        keep_early: bool,
        at: Option<UnixMillis>,
    ) {
        let early = std::mem::take(&mut self.early_reports);
        self.launching = None;
        let early = early
            .into_iter()
            .filter(|early| {
                keep_early
                    && early.workflow_id == workflow_id
                    && run_id.is_none_or(|run_id| early.run_id == run_id)
            })
            .max_by_key(|early| early.sequence);
        if let Some(early) = &early {
            self.note_aborted(early);
        }
        self.last_report = early;
        self.active = Some(ActiveRollout {
            build_id: spec.build_id.clone(),
            workflow_id,
            notified_generation: spec.generation,
            started_generation: Some(spec.generation),
            started_at: at,
        });
        self.routing_shown = 0;
    }

    /// The rollout in flight was told about `generation`.
    pub fn notified(&mut self, generation: i64) {
        if let Some(active) = self.active.as_mut() {
            active.notified_generation = generation;
        }
    }

    /// What the turn acting on `spec` does with `action`. With no rollout in flight (none
    /// yet, or it completed, was superseded or aborted) the control is answered with an event
    /// (`ControlIgnored`, or `ControlUnchanged` for a second `abort`), except `retry` after an
    /// abort of the build the spec asks for, which rolls it out again.
    pub fn control_step(&self, action: ControlAction, spec: &SpecSignal, twd: &str) -> ControlStep {
        let Some(active) = &self.active else {
            return ControlStep::Answer {
                reason: control::REASON_IGNORED,
                message: control::no_rollout(action, twd).message().to_owned(),
            };
        };
        let report = self.report_of_active();
        let ended = report.is_some_and(|r| {
            matches!(
                r.progress,
                RolloutProgress::Complete | RolloutProgress::Superseded | RolloutProgress::Aborted
            )
        });
        if !ended {
            return ControlStep::Forward(active.workflow_id.clone());
        }
        let state = ControlState {
            build_id: active.build_id.clone(),
            progress: report.map(|r| r.progress),
            blocked: None,
            operator_paused: false,
            spec_paused: false,
            promote_requested: false,
        };
        match control::effect(action, &state) {
            ControlEffect::Apply(message) if active.build_id == spec.build_id => {
                ControlStep::Retry(message)
            }
            answer => ControlStep::Answer {
                reason: answer.event_reason().unwrap_or(control::REASON_IGNORED),
                message: answer.message().to_owned(),
            },
        }
    }

    /// `retry` of the aborted `build`: it may roll out again.
    pub fn retried(&mut self, build: &str) {
        self.aborted.retain(|b| b != build);
    }

    /// A full turn read `observation` while acting on `spec`: it is the run's latest. What the
    /// status shows, or `None` when it read a newer spec than the one held, which is taken and
    /// acted on at once instead.
    pub fn observed(&mut self, observation: Observation, spec: &SpecSignal) -> Option<Shown> {
        self.last_observation = Some(observation.clone());
        if self.adopt_observed_spec(&observation) {
            return None;
        }
        Some(Shown::of(observation, spec.generation))
    }

    /// The status that shows `shown`: the one projection of the workflow's state (the latest
    /// report, the drains of retired versions) and what was read into the TWD's status.
    pub fn status(
        &self,
        shown: &Shown,
        name: &str,
        now: UnixMillis,
    ) -> TemporalWorkerDeploymentStatus {
        let observation = &shown.observation;
        let starting = self.active.as_ref().and_then(|active| {
            Some(status::StartedRollout {
                build_id: &active.build_id,
                workflow_id: &active.workflow_id,
                started_at: active.started_at?,
            })
        });
        let projected = status::project(
            observation,
            self.last_report.as_ref(),
            starting,
            shown.generation,
            now,
        );
        if let Some(condition) = &shown.deleting {
            return status::with_condition(projected, condition.clone(), shown.generation, now);
        }
        let projected = status::with_drain(projected, observation, &self.sunset, now);
        let projected = status::with_scale(projected, observation, name);
        notify::with_condition(
            projected,
            &self.notification_failures,
            shown.generation,
            now,
        )
    }

    /// Whether `status` is the one last written, apart from timestamps that move on every
    /// projection.
    pub fn shows(&self, status: &TemporalWorkerDeploymentStatus) -> bool {
        self.last_status
            .as_ref()
            .is_some_and(|last| same_status(last, status))
    }

    /// The sunset plan for `observation` at `now`; an aborted target is retired like any other
    /// non-current version, and versions nothing else would retire are adopted.
    pub fn sunset_plan(&self, observation: &Observation, now: UnixMillis) -> SunsetPlan {
        let mut observation = observation.clone();
        if let Some(spec) = observation.spec.as_mut()
            && self.aborted.contains(&spec.target_build_id)
        {
            spec.target_build_id.clear();
        }
        let memory = sunset::adopt_orphans(&observation, &self.sunset, now);
        sunset::plan(&observation, &memory, now)
    }

    /// The open workflows pinned to the retired `build` were counted.
    pub fn counted_pinned(&mut self, build: &str, pinned: PinnedSnapshot) {
        if let Some(entry) = self.sunset.iter_mut().find(|m| m.build_id == build) {
            entry.drain.pinned = Some(pinned);
        }
    }

    /// Drain step `step` of the retired `build` was done.
    pub fn drained(&mut self, build: &str, step: DrainStep) {
        if let Some(entry) = self.sunset.iter_mut().find(|m| m.build_id == build)
            && !entry.drain.done.contains(&step)
        {
            entry.drain.done.push(step);
        }
    }

    /// What `spec.autoscaling` asks of this turn, on `observation` at `now`. A shared fixed
    /// total reads nothing and is planned every turn, so a `/scale` change applies at once.
    pub fn autoscale_step(&self, observation: &Observation, now: UnixMillis) -> AutoscaleStep {
        let Some(policy) = observation
            .spec
            .as_ref()
            .and_then(|s| s.autoscaling.clone())
        else {
            return AutoscaleStep::Off;
        };
        if !policy.shared_total && !autoscale::due(&self.autoscale, now) {
            return AutoscaleStep::NotDue(self.autoscale.next_read_at);
        }
        let versions = autoscale::scaled_versions(observation);
        if versions.is_empty() {
            return AutoscaleStep::Idle;
        }
        let read = !policy.shared_total;
        AutoscaleStep::Size {
            policy,
            versions,
            read,
        }
    }
}

/// Written alike, apart from timestamps that move on every projection. Compared as Kubernetes
/// receives them (JSON, times to the second): a status carried over a continue-as-new comes
/// back from its JSON with the milliseconds of its times dropped, and must still equal the one
/// the next run projects from the same state.
fn same_status(a: &TemporalWorkerDeploymentStatus, b: &TemporalWorkerDeploymentStatus) -> bool {
    let written = |s: &TemporalWorkerDeploymentStatus| {
        let mut s = s.clone();
        if let Some(r) = s.rollout.as_mut() {
            r.updated_at = None;
        }
        for c in &mut s.conditions {
            c.last_transition_time =
                k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default());
        }
        serde_json::to_value(s).ok()
    };
    written(a).is_some_and(|a| written(b).is_some_and(|b| a == b))
}

#[cfg(test)]
mod tests;
