//! What a TWD status write says about its rollout, compared with the status it replaces.
//!
//! The rollout metrics are derived from status transitions, not from the workflows: the status
//! is persisted (and written with a resource-version precondition), so a retried write, a
//! resync or another replica running the same activity sees the new status as the old one and
//! finds no transition. Every duration is measured between timestamps of the statuses
//! (`rollout.startedAt`, `rollout.updatedAt`, `targetVersion.rampLastModifiedAt`,
//! `targetVersion.healthySince`), falling back to the writer's clock only where a status has no
//! timestamp for the moment.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use twc_crds::worker_deployment::{TemporalWorkerDeploymentStatus, VersionState};

/// `Ready` reasons of a rollout stopped without promotion, counted as failures.
pub const FAILURE_REASONS: [&str; 4] = [
    "GateFailed",
    "ProgressDeadlineExceeded",
    "AnalysisFailed",
    ABORTED_REASON,
];
/// `Ready` reason of a rollout that made its build Current.
pub const COMPLETE_REASON: &str = "RolloutComplete";
/// `Ready` reason of a rollout an operator aborted.
pub const ABORTED_REASON: &str = "Aborted";

/// How a rollout ended: the `outcome` label of `twc_rollout_outcome_duration_seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Its build became Current (`Ready` reason `RolloutComplete`).
    Complete,
    /// A gate, the progress deadline or a canary analysis stopped it.
    Failed,
    /// An operator aborted it.
    Aborted,
    /// The next rollout (of a newer build) started before it ended.
    Superseded,
}

impl Outcome {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Complete => "complete",
            Self::Failed => "failed",
            Self::Aborted => "aborted",
            Self::Superseded => "superseded",
        }
    }

    /// The outcome a `Ready` reason means, if it ends the rollout.
    fn of_reason(reason: &str) -> Option<Self> {
        match reason {
            COMPLETE_REASON => Some(Self::Complete),
            ABORTED_REASON => Some(Self::Aborted),
            r if FAILURE_REASONS.contains(&r) => Some(Self::Failed),
            _ => None,
        }
    }
}

/// One thing a status write shows happened to the TWD's rollout.
#[derive(Debug, Clone, PartialEq)]
pub enum RolloutEvent {
    /// A rollout workflow the previous status did not name.
    Started,
    /// The `Ready` reason became `RolloutComplete`; `duration` from `rollout.startedAt` to the
    /// writer's clock (`twc_rollout_duration_seconds`, as it has always been measured).
    Completed {
        /// Time since the rollout's start (or retry), when the status has its start.
        duration: Option<Duration>,
    },
    /// The `Ready` reason became one of [`FAILURE_REASONS`].
    Failed {
        /// That reason.
        reason: String,
    },
    /// The rollout reached an outcome, `duration` after its `startedAt`.
    Ended {
        /// How it ended.
        outcome: Outcome,
        /// From `rollout.startedAt` to the new status' `rollout.updatedAt`.
        duration: Duration,
    },
    /// A Progressive step ended by moving on (to the next step or to Current).
    StepDone {
        /// Index of the step (0-based).
        step: u32,
        /// From the step's `rampLastModifiedAt` to the next step's (or the promotion).
        duration: Duration,
    },
    /// The target build became Current.
    BecameCurrent {
        /// From its Deployment becoming Available (`healthySince`, or the rollout's start when
        /// later) to the status showing it Current.
        duration: Duration,
    },
}

/// The events `status` shows, replacing `previous` (the status stored before the write), at
/// `now` (the writer's clock, used only where a status lacks a timestamp).
pub fn rollout_events(
    previous: Option<&TemporalWorkerDeploymentStatus>,
    status: &TemporalWorkerDeploymentStatus,
    now: Timestamp,
) -> Vec<RolloutEvent> {
    let mut events = Vec::new();
    let at = updated_at(status).unwrap_or(now);
    let workflow = rollout_workflow(status);
    let same = previous.filter(|p| workflow.is_some() && rollout_workflow(p) == workflow);
    if let Some(previous) = previous.filter(|p| superseded(p, same.is_some()))
        && let Some(duration) = started_at(previous).and_then(|s| between(s, at))
    {
        events.push(RolloutEvent::Ended {
            outcome: Outcome::Superseded,
            duration,
        });
    }
    if workflow.is_none() {
        return events;
    }
    if same.is_none() {
        events.push(RolloutEvent::Started);
    }
    let reason = ready_reason(status);
    let before = same.and_then(ready_reason);
    let outcome = reason
        .filter(|r| Some(*r) != before)
        .and_then(|r| Some((r, Outcome::of_reason(r)?)));
    if let Some(previous) = same.filter(|p| !ready_reason(p).is_some_and(ends_rollout))
        && let Some(step) = step_done(previous, status, outcome.map(|(_, o)| o), at)
    {
        events.push(step);
    }
    if let Some((reason, outcome)) = outcome {
        if outcome == Outcome::Complete {
            let duration = started_at(status).and_then(|s| between(s, now));
            events.push(RolloutEvent::Completed { duration });
        } else {
            events.push(RolloutEvent::Failed {
                reason: reason.to_owned(),
            });
        }
        if let Some(duration) = started_at(status).and_then(|s| between(s, at)) {
            events.push(RolloutEvent::Ended { outcome, duration });
        }
    }
    if let Some(became) = became_current(previous, status, at) {
        events.push(became);
    }
    events
}

/// Whether `status` replaces a rollout the previous status named, still running, by another
/// rollout (a rollout workflow is per build) or by none: the TWD workflow forgets a rollout's
/// report only when it starts the next one.
fn superseded(previous: &TemporalWorkerDeploymentStatus, same_rollout: bool) -> bool {
    !same_rollout
        && rollout_workflow(previous).is_some()
        && !ready_reason(previous).is_some_and(ends_rollout)
}

/// The step `previous` showed, if `status` shows the rollout moved past it: to a later step,
/// or to Current.
fn step_done(
    previous: &TemporalWorkerDeploymentStatus,
    status: &TemporalWorkerDeploymentStatus,
    outcome: Option<Outcome>,
    at: Timestamp,
) -> Option<RolloutEvent> {
    let step = u32::try_from(previous.rollout.as_ref()?.step?).ok()?;
    let began = ramp_changed_at(previous)?;
    let next = status
        .rollout
        .as_ref()
        .and_then(|r| r.step)
        .and_then(|s| u32::try_from(s).ok());
    let ended = match next {
        Some(next) if next > step => ramp_changed_at(status).filter(|t| *t > began).unwrap_or(at),
        _ if outcome == Some(Outcome::Complete) => at,
        _ => return None,
    };
    let duration = between(began, ended)?;
    Some(RolloutEvent::StepDone { step, duration })
}

/// The target build, if `status` shows it Current and `previous` did not, or showed it Current
/// without knowing since when its Deployment is Available: the TWD workflow shows a rollout's
/// report of the routing it wrote on an observation that may predate the Deployment's
/// availability, and the write after the next observation brings it. The time it became
/// Current is then the earlier write's.
fn became_current(
    previous: Option<&TemporalWorkerDeploymentStatus>,
    status: &TemporalWorkerDeploymentStatus,
    at: Timestamp,
) -> Option<RolloutEvent> {
    let target = status.target_version.as_ref()?;
    if target.version.status != VersionState::Current {
        return None;
    }
    let build = target.version.build_id.as_str();
    let available = target.version.healthy_since.as_ref().map(|t| t.0)?;
    let current_at = match shown_current(previous, build) {
        ShownCurrent::No => at,
        ShownCurrent::Counted => return None,
        ShownCurrent::WithoutAvailability(shown) => shown.unwrap_or(at),
    };
    let since = started_at(status).map_or(available, |s| s.max(available));
    let duration = between(since, current_at)?;
    Some(RolloutEvent::BecameCurrent { duration })
}

/// What a previous status said about `build` being Current.
enum ShownCurrent {
    /// Nothing.
    No,
    /// Current with its availability (its time to Current was counted then), or Current
    /// before this rollout named it the target.
    Counted,
    /// Current, without knowing since when its Deployment is Available; written at that time.
    WithoutAvailability(Option<Timestamp>),
}

fn shown_current(previous: Option<&TemporalWorkerDeploymentStatus>, build: &str) -> ShownCurrent {
    let Some(previous) = previous else {
        return ShownCurrent::No;
    };
    let target = previous
        .target_version
        .as_ref()
        .filter(|t| t.version.build_id == build && t.version.status == VersionState::Current);
    if let Some(target) = target {
        return if target.version.healthy_since.is_some() {
            ShownCurrent::Counted
        } else {
            ShownCurrent::WithoutAvailability(updated_at(previous))
        };
    }
    if previous
        .current_version
        .as_ref()
        .is_some_and(|c| c.build_id == build)
    {
        ShownCurrent::Counted
    } else {
        ShownCurrent::No
    }
}

/// Whether a `Ready` reason is an outcome of the rollout (complete, failed or aborted).
fn ends_rollout(reason: &str) -> bool {
    Outcome::of_reason(reason).is_some()
}

/// `to - from`, unless negative.
fn between(from: Timestamp, to: Timestamp) -> Option<Duration> {
    Duration::try_from(from.duration_until(to)).ok()
}

/// The rollout workflow a status names.
fn rollout_workflow(status: &TemporalWorkerDeploymentStatus) -> Option<&str> {
    status.rollout.as_ref()?.workflow_id.as_deref()
}

fn started_at(status: &TemporalWorkerDeploymentStatus) -> Option<Timestamp> {
    status.rollout.as_ref()?.started_at.as_ref().map(|t| t.0)
}

fn updated_at(status: &TemporalWorkerDeploymentStatus) -> Option<Timestamp> {
    status.rollout.as_ref()?.updated_at.as_ref().map(|t| t.0)
}

fn ramp_changed_at(status: &TemporalWorkerDeploymentStatus) -> Option<Timestamp> {
    status
        .target_version
        .as_ref()?
        .ramp_last_modified_at
        .as_ref()
        .map(|t| t.0)
}

/// The reason of the status' `Ready` condition.
fn ready_reason(status: &TemporalWorkerDeploymentStatus) -> Option<&str> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.reason.as_str())
}
