//! The rollout state machine of one build: the next step toward making it Current.
//!
//! Mirrors the Go controller's routing decision (reference §3.6) and Progressive algorithm
//! (§3.7), with our additions: progress deadline, gate failure handling, configurable rollback
//! window, declarative pause, manual promotion.

use serde::{Deserialize, Serialize};
use twc_crds::worker_deployment::{RolloutStrategy, VersionState};

use crate::contract::ReplayVerdict;
use crate::model::{
    AnalysisView, BlockReason, Blocked, DeploymentView, Observation, SpecView, StepView,
    TemporalVersion, UnixMillis,
};
use crate::plan::analysis::{AnalysisMemory, StepAnalysis};

/// What the rollout workflow remembers between decisions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RolloutMemory {
    /// The build being rolled out.
    pub build_id: String,
    /// When the rollout started (workflow time).
    pub started_at: UnixMillis,
    /// Gate progress.
    pub gate: GateState,
    /// Operator asked to promote now (skip remaining steps and pauses).
    pub promote_requested: bool,
    /// Operator hold (signal), in addition to `spec.rollout.paused`.
    pub pause_requested: bool,
    /// Time spent held while a Progressive step was in force; it does not use up the step's
    /// `pauseDuration`.
    #[serde(default)]
    pub held: HeldTime,
    /// Canary analysis of the step in force (absent in memories from before it existed).
    #[serde(default)]
    pub analysis: crate::plan::analysis::AnalysisMemory,
    /// The build's progress toward Available, which the progress deadline measures.
    #[serde(default)]
    pub progress: Progress,
    /// The replay check of the build (absent in memories from before it existed).
    #[serde(default)]
    pub replay: ReplayCheck,
}

/// The replay check's progress (`spec.rollout.replayCheck`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReplayCheck {
    /// Which run of the check this is (its Job is named after it): `retry` after an
    /// inconclusive verdict runs it again as the next attempt.
    pub attempt: u32,
    /// The verdict, once the check ran.
    pub verdict: Option<crate::contract::ReplayVerdict>,
}

impl ReplayCheck {
    /// Forgets an inconclusive verdict so the check runs again (a `retry`).
    pub fn retry(&mut self) {
        if matches!(
            self.verdict,
            Some(crate::contract::ReplayVerdict::Inconclusive { .. })
        ) {
            self.verdict = None;
            self.attempt += 1;
        }
    }
}

/// How far the build got toward serving, for the progress deadline.
///
/// Kubernetes measures a Deployment's `progressDeadlineSeconds` from its last progress (more
/// pods updated or available), not from the start of its rollout; so does the rollout: more of
/// the build's pods ready, or its workers registered, is progress. Once the build was registered
/// and Available the deadline no longer applies: a pod restarting, an eviction or more replicas
/// starting later make it briefly not Available, which holds the rollout
/// ([`RolloutDecision::WaitForAvailability`]) instead of failing it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// When the build last progressed; `None`: not since the rollout started (or was retried).
    pub last_at: Option<UnixMillis>,
    /// Most of its pods seen ready at once.
    pub ready_replicas: i32,
    /// Its workers were seen registered with Temporal.
    pub registered: bool,
    /// When it was first seen registered and Available.
    pub available_at: Option<UnixMillis>,
}

impl Progress {
    /// Records what `observation` shows of `build` at `now`; true when it progressed.
    pub fn track(&mut self, observation: &Observation, build: &str, now: UnixMillis) -> bool {
        let Some(deployment) = observation.deployment(build) else {
            return false;
        };
        let registered = registered_version(observation, build).is_some();
        let mut progressed = false;
        if deployment.ready_replicas > self.ready_replicas {
            self.ready_replicas = deployment.ready_replicas;
            progressed = true;
        }
        if registered && !self.registered {
            self.registered = true;
            progressed = true;
        }
        if registered && deployment.available && self.available_at.is_none() {
            self.available_at = Some(now);
            progressed = true;
        }
        if progressed {
            self.last_at = Some(now);
        }
        progressed
    }

    /// When the progress deadline of `deadline_ms` passes for a rollout started (or retried)
    /// at `started_at`.
    pub fn deadline_at(&self, started_at: UnixMillis, deadline_ms: i64) -> UnixMillis {
        self.last_at
            .map_or(started_at, |at| at.max(started_at))
            .saturating_add(deadline_ms)
    }
}

/// How long the rollout has been held (paused) during the Progressive step in force.
///
/// A step's clock is Temporal's ramp-changed time, which a pause leaves alone; the time held is
/// added to the step's pause instead, so after `resume` the step's remaining pause continues.
/// A new step (a new ramp-changed time) starts from zero.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldTime {
    /// The step's clock (ramp-changed time) the time below belongs to.
    pub step_clock: Option<UnixMillis>,
    /// Milliseconds held in finished holds during that step.
    pub held_ms: i64,
    /// Start of the hold in progress, if held now.
    pub held_since: Option<UnixMillis>,
}

/// A change between held and not held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum HoldTransition {
    /// The rollout became held.
    Held,
    /// The rollout is no longer held.
    Released,
}

impl HeldTime {
    /// Milliseconds the step with clock `step_clock` has been held so far, including a hold in
    /// progress.
    pub fn held_during(&self, step_clock: Option<UnixMillis>, now: UnixMillis) -> i64 {
        let ongoing = self
            .held_since
            .map_or(0, |since| now.saturating_sub(since).max(0));
        if self.step_clock == step_clock {
            self.held_ms.saturating_add(ongoing)
        } else {
            ongoing
        }
    }

    /// Records whether the rollout is `held` at `now` while the step with `step_clock` is in
    /// force; returns the transition, if any.
    pub fn track(
        &mut self,
        held: bool,
        step_clock: Option<UnixMillis>,
        now: UnixMillis,
    ) -> Option<HoldTransition> {
        if self.step_clock != step_clock {
            self.step_clock = step_clock;
            self.held_ms = 0;
            // A hold in progress counts toward the new step from now on.
            self.held_since = self.held_since.map(|_| now);
        }
        match (held, self.held_since) {
            (true, None) => {
                self.held_since = Some(now);
                Some(HoldTransition::Held)
            }
            (false, Some(since)) => {
                self.held_ms = self
                    .held_ms
                    .saturating_add(now.saturating_sub(since).max(0));
                self.held_since = None;
                Some(HoldTransition::Released)
            }
            _ => None,
        }
    }
}

/// Where the gate stands for this build.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum GateState {
    /// Not run yet (or no gate configured).
    NotRun,
    /// All gate workflows completed successfully.
    Passed,
    /// A gate workflow did not complete successfully.
    Failed {
        /// What failed.
        message: String,
    },
    /// A gate workflow ran out of its execution timeout (SPEC §4.8: the progress deadline of
    /// the gate, not a failed gate).
    TimedOut {
        /// Which gate workflows timed out.
        message: String,
    },
}

/// The next step of a rollout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum RolloutDecision {
    /// The TWD is gone, being deleted, or targets another build: stop without touching routing.
    Superseded,
    /// Cannot proceed for now; report and wait for a change (signal) or retry later.
    Blocked(Blocked),
    /// Create the versioned Deployment.
    CreateDeployment,
    /// Set the target Deployment's replicas (spec.replicas changed, or revive 0 -> 1).
    ScaleTarget {
        /// Desired replicas.
        replicas: i32,
    },
    /// Wait until the build's workers registered and its Deployment is Available.
    WaitForPollers {
        /// Give up with ProgressDeadlineExceeded at this time.
        deadline_at: UnixMillis,
    },
    /// The progress deadline passed before the build registered or became available.
    DeadlineExceeded(Blocked),
    /// The build was registered and Available and is not now (a pod restarting, more replicas
    /// starting): hold where the rollout is, with no deadline, until it is Available again.
    WaitForAvailability {
        /// What is missing, in words.
        message: String,
    },
    /// Run the gate workflows.
    RunGate,
    /// The gate failed: scale the build to zero and stop (until retry or a new build).
    GateFailed(Blocked),
    /// Held by `spec.rollout.paused` or a pause signal.
    Paused,
    /// Manual strategy: registered, waiting for a person to promote.
    WaitForManualPromotion,
    /// Make the build Current.
    SetCurrent,
    /// Ramp the build to a step's percentage.
    SetRamping {
        /// Percentage.
        percentage: u8,
        /// Step index.
        step: usize,
    },
    /// The build is Current but another build still ramps: clear the ramp.
    ClearRamp,
    /// Hold the current step until `until`.
    HoldStep {
        /// Step index.
        step: usize,
        /// When the step's pause ends.
        until: UnixMillis,
    },
    /// The build is Current and nothing else ramps: the rollout is done.
    Complete,
    /// Measure these analysis checks of the step in force.
    Analyze {
        /// Step index.
        step: usize,
        /// Names of the checks due.
        checks: Vec<String>,
    },
    /// Run the gate workflow of the step in force.
    RunStepGate {
        /// Step index.
        step: usize,
    },
    /// Hold the step in force while its analysis goes on: look again at `wake_at` (the next
    /// measurement or the pause end); `inconclusive` says why a step whose pause is over does
    /// not advance.
    AnalysisHold {
        /// Step index.
        step: usize,
        /// When the step's pause ends.
        until: UnixMillis,
        /// When to look again.
        wake_at: UnixMillis,
        /// Checks without a passing verdict after the pause.
        inconclusive: Option<Blocked>,
    },
    /// A check or a step gate failed: abort (ramp cleared, build retired).
    AnalysisFailed(Blocked),
    /// Replay real histories against the build before its first routing change.
    RunReplayCheck,
    /// The build could not replay a history: abort before any workflow moved to it.
    ReplayCheckFailed(Blocked),
    /// The replay check could not decide: hold until `retry` or a new build.
    ReplayCheckHeld(Blocked),
}

/// Ramp percentages closer than this are the same step (Temporal stores the ramp as a float).
const RAMP_TOLERANCE: f32 = 0.01;

/// The GateFailed block for a build.
fn gate_failed(build: &str, message: &str) -> Blocked {
    Blocked {
        reason: BlockReason::GateFailed,
        message: format!(
            "Gate workflow for buildID {build} did not succeed: {message}. Send `retry` to run it again, or push a new version."
        ),
    }
}

/// Decides the next step of the rollout of `memory.build_id` from an observation at `now`.
///
/// Checks, first match wins: superseded; invalid spec; Temporal unreadable; no Deployment;
/// failed gate; replicas; already Current (clear a stale ramp, else complete); not registered or
/// not Available (wait: bounded by the progress deadline, counted from the build's last
/// progress, until it was once registered and Available; held without a deadline after);
/// rollback (promote at once); gate; pause; manual promotion; Manual strategy; no Current
/// version yet; AllAtOnce; Progressive steps.
///
/// Two consequences of that order: a paused rollout still runs its gate (the gate routes no
/// traffic) and still completes a rollback (a rollback is one jump back to a known version).
/// The Go controller's unversioned-poller probe (reference §3.3, §3.6 item 6) is not
/// implemented: with no Current version the build is always made Current directly, because
/// ramping against unversioned workers would need per-task-queue reads on every decision.
pub fn decide(
    observation: &Observation,
    memory: &RolloutMemory,
    now: UnixMillis,
) -> RolloutDecision {
    let build = memory.build_id.as_str();
    let Some(spec) = observation
        .spec
        .as_ref()
        .filter(|s| !s.deleting && s.target_build_id == build)
    else {
        return RolloutDecision::Superseded;
    };
    if let Some(message) = &memory.analysis.failed {
        return RolloutDecision::AnalysisFailed(Blocked {
            reason: BlockReason::AnalysisFailed,
            message: format!(
                "Canary analysis of buildID {build} failed: {message}. The rollout was aborted: the ramp is cleared and the build is retired; send `retry` to roll it out again, or push a new version."
            ),
        });
    }
    if !spec.invalid.is_empty() {
        return RolloutDecision::Blocked(Blocked {
            reason: BlockReason::InvalidSpec,
            message: spec.invalid.join("; "),
        });
    }
    if let Some(message) = spec
        .analysis
        .as_ref()
        .and_then(|view| memory.analysis.refusal(view))
    {
        return RolloutDecision::Blocked(Blocked {
            reason: BlockReason::InvalidSpec,
            message,
        });
    }
    let temporal = match &observation.temporal {
        Ok(temporal) => temporal,
        Err(blocked) => return RolloutDecision::Blocked(blocked.clone()),
    };
    let Some(deployment) = observation.deployment(build) else {
        if crate::plan::sunset::version_limit_reached(
            observation,
            crate::plan::sunset::DEFAULT_MAX_VERSIONS_INELIGIBLE_FOR_DELETION,
        ) {
            return RolloutDecision::Blocked(Blocked {
                reason: BlockReason::VersionLimitReached,
                message: format!(
                    "Not creating a Deployment for buildID {build}: {} or more retired versions are not yet eligible for deletion; \
                     they must drain and be scaled down first",
                    crate::plan::sunset::DEFAULT_MAX_VERSIONS_INELIGIBLE_FOR_DELETION
                ),
            });
        }
        return RolloutDecision::CreateDeployment;
    };
    // A failed gate keeps the build scaled to zero until `retry` or a new build: checked before
    // the replica rule, which would otherwise scale it straight back up.
    if spec.gate_workflow_type.is_some()
        && let GateState::Failed { message } = &memory.gate
    {
        return RolloutDecision::GateFailed(gate_failed(build, message));
    }
    if let Some(replicas) = target_replicas(spec, deployment) {
        return RolloutDecision::ScaleTarget { replicas };
    }

    let current = non_empty(temporal.current_build_id.as_ref());
    let ramping = non_empty(temporal.ramping_build_id.as_ref());
    if current == Some(build) {
        let stale_ramp = ramping.is_some_and(|r| r != build);
        return if stale_ramp && spec.strategy != RolloutStrategy::Manual {
            RolloutDecision::ClearRamp
        } else {
            RolloutDecision::Complete
        };
    }

    let version = registered_version(observation, build);
    if version.is_none() || !deployment.available {
        if memory.progress.available_at.is_some() {
            return RolloutDecision::WaitForAvailability {
                message: unavailable_message(build, deployment, version.is_some()),
            };
        }
        let deadline_at = memory
            .progress
            .deadline_at(memory.started_at, spec.progress_deadline_ms);
        if now > deadline_at {
            return RolloutDecision::DeadlineExceeded(deadline_blocked(
                spec,
                deployment,
                version.is_some(),
            ));
        }
        return RolloutDecision::WaitForPollers { deadline_at };
    }
    if is_rollback(spec, version, now) {
        return RolloutDecision::SetCurrent;
    }

    if spec.gate_workflow_type.is_some() {
        match &memory.gate {
            GateState::Passed => {}
            GateState::NotRun => return RolloutDecision::RunGate,
            GateState::Failed { message } => {
                return RolloutDecision::GateFailed(gate_failed(build, message));
            }
            GateState::TimedOut { message } => {
                return RolloutDecision::DeadlineExceeded(Blocked {
                    reason: BlockReason::ProgressDeadlineExceeded,
                    message: format!(
                        "Gate of buildID {build} did not finish within its timeout: {message}. Fix the gate or its workers, then send `retry` or push a new version."
                    ),
                });
            }
        }
    }
    // Before the first routing change, and only when there is a Current build whose
    // workflows could move (a build that already ramps had its routing changed).
    if spec.replay_check.is_some() && current.is_some() && ramping != Some(build) {
        let dry_run = spec.replay_check.as_ref().is_some_and(|c| c.dry_run);
        match &memory.replay.verdict {
            None => return RolloutDecision::RunReplayCheck,
            Some(ReplayVerdict::Passed { .. }) => {}
            Some(_) if dry_run => {}
            Some(ReplayVerdict::Nondeterministic {
                workflow_id,
                run_id,
                workflow_type,
                message,
                count,
            }) => {
                return RolloutDecision::ReplayCheckFailed(Blocked {
                    reason: BlockReason::ReplayCheckFailed,
                    message: format!(
                        "Build {build} cannot replay {count} of the histories it would take over: workflow {workflow_id} (run {run_id}, type {workflow_type}): {message}. The rollout was aborted before any workflow moved to it; fix the change (guard it with a patch or a new workflow type), then push a new version or send `retry`."
                    ),
                });
            }
            Some(ReplayVerdict::Inconclusive { reason }) => {
                return RolloutDecision::ReplayCheckHeld(Blocked {
                    reason: BlockReason::ReplayCheckInconclusive,
                    message: format!(
                        "The replay check of build {build} could not decide: {reason}. No workflow moved to it; fix the cause, then send `retry` to run the check again."
                    ),
                });
            }
        }
    }
    if spec.paused || memory.pause_requested {
        return RolloutDecision::Paused;
    }
    if memory.promote_requested {
        return RolloutDecision::SetCurrent;
    }
    match spec.strategy {
        RolloutStrategy::Manual => RolloutDecision::WaitForManualPromotion,
        _ if current.is_none() => RolloutDecision::SetCurrent,
        RolloutStrategy::AllAtOnce => RolloutDecision::SetCurrent,
        RolloutStrategy::Progressive => {
            let live_ramp = if ramping == Some(build) {
                temporal.ramp_percentage
            } else {
                None
            };
            let held_ms = memory.held.held_during(temporal.ramp_changed_at, now);
            let analysis = spec.analysis.as_ref().map(|view| (view, &memory.analysis));
            progressive(
                &spec.steps,
                live_ramp,
                temporal.ramp_changed_at,
                held_ms,
                now,
                analysis,
            )
        }
    }
}

/// The build's version, if Temporal lists it registered.
fn registered_version<'a>(
    observation: &'a Observation,
    build: &str,
) -> Option<&'a TemporalVersion> {
    observation
        .temporal
        .as_ref()
        .ok()?
        .version(build)
        .filter(|v| v.state != VersionState::NotRegistered)
}

/// What a build that was Available lacks now.
fn unavailable_message(build: &str, deployment: &DeploymentView, registered: bool) -> String {
    let missing = if deployment.available {
        "Temporal does not list its workers as registered".to_owned()
    } else {
        let wanted = deployment.replicas.unwrap_or(1);
        let problem = deployment
            .problem
            .as_deref()
            .map(|p| format!(": {p}"))
            .unwrap_or_default();
        let unregistered = if registered {
            ""
        } else {
            "; Temporal does not list its workers as registered"
        };
        format!(
            "Deployment {} has {} of {wanted} pods ready{problem}{unregistered}",
            deployment.name, deployment.ready_replicas
        )
    };
    format!(
        "Build {build} was Available and is not now ({missing}); the rollout holds where it is until it is Available again"
    )
}

/// Replicas the target Deployment must be scaled to, if any (reference §2.6).
fn target_replicas(spec: &SpecView, deployment: &DeploymentView) -> Option<i32> {
    match spec.replicas {
        Some(wanted) if deployment.replicas != Some(wanted) => Some(wanted),
        None if deployment.replicas == Some(0) => Some(1),
        _ => None,
    }
}

/// The target was Current within the rollback window (reference §3.9, window configurable).
fn is_rollback(spec: &SpecView, version: Option<&TemporalVersion>, now: UnixMillis) -> bool {
    spec.strategy != RolloutStrategy::Manual
        && spec.rollback_window_ms > 0
        && version
            .and_then(|v| v.last_current_at)
            .is_some_and(|at| now.saturating_sub(at) <= spec.rollback_window_ms)
}

/// Reference §3.7: snap to the last step at or below the live ramp, hold it for its pause
/// (extended by `held_ms`, the time the rollout was paused during the step), then move to the
/// next step or, after the last one, to Current.
fn progressive(
    steps: &[StepView],
    ramp: Option<f32>,
    ramp_changed_at: Option<UnixMillis>,
    held_ms: i64,
    now: UnixMillis,
    analysis: Option<(&AnalysisView, &AnalysisMemory)>,
) -> RolloutDecision {
    let Some(first) = steps.first() else {
        return RolloutDecision::Blocked(Blocked {
            reason: BlockReason::InvalidSpec,
            message: "spec.rollout.steps: steps are required for Progressive rollout".to_owned(),
        });
    };
    let Some(ramp) = ramp else {
        return RolloutDecision::SetRamping {
            percentage: first.ramp_percentage,
            step: 0,
        };
    };
    let index = steps
        .iter()
        .rposition(|s| f32::from(s.ramp_percentage) <= ramp + RAMP_TOLERANCE)
        .unwrap_or(0);
    let step = steps.get(index).unwrap_or(first);
    if (ramp - f32::from(step.ramp_percentage)).abs() > RAMP_TOLERANCE {
        return RolloutDecision::SetRamping {
            percentage: step.ramp_percentage,
            step: index,
        };
    }
    let until = ramp_changed_at
        .unwrap_or(now)
        .saturating_add(step.pause_ms)
        .saturating_add(held_ms);
    if let (Some((view, memory)), Some(clock)) = (analysis, ramp_changed_at) {
        let step_index = u32::try_from(index).unwrap_or(u32::MAX);
        match memory.next(view, step_index, clock, until, now) {
            StepAnalysis::RunGate => return RolloutDecision::RunStepGate { step: index },
            StepAnalysis::Measure(checks) => {
                return RolloutDecision::Analyze {
                    step: index,
                    checks,
                };
            }
            StepAnalysis::Wait {
                until: wake_at,
                inconclusive,
            } => {
                return RolloutDecision::AnalysisHold {
                    step: index,
                    until,
                    wake_at,
                    inconclusive: inconclusive.map(|message| Blocked {
                        reason: BlockReason::AnalysisInconclusive,
                        message: format!(
                            "Step {} (ramp {}%) is over but its analysis has no passing verdict yet: {message}",
                            index + 1,
                            step.ramp_percentage
                        ),
                    }),
                };
            }
            StepAnalysis::Passed => {}
        }
    }
    if ramp_changed_at.is_none() || until > now {
        return RolloutDecision::HoldStep { step: index, until };
    }
    match steps.get(index + 1) {
        Some(next) => RolloutDecision::SetRamping {
            percentage: next.ramp_percentage,
            step: index + 1,
        },
        None => RolloutDecision::SetCurrent,
    }
}

fn deadline_blocked(spec: &SpecView, deployment: &DeploymentView, registered: bool) -> Blocked {
    let build = &spec.target_build_id;
    let missing = match (registered, deployment.available) {
        (false, false) => format!(
            "no worker of buildID {build} polled Temporal and Deployment {} is not Available",
            deployment.name
        ),
        (false, true) => format!("no worker of buildID {build} polled Temporal"),
        (true, _) => format!("Deployment {} is not Available", deployment.name),
    };
    let problem = deployment
        .problem
        .as_deref()
        .map(|p| format!(" ({p})"))
        .unwrap_or_default();
    Blocked {
        reason: BlockReason::ProgressDeadlineExceeded,
        message: format!(
            "Progress deadline of {}s exceeded: {missing}{problem}. Fix the workers, then send `retry` or push a new version.",
            spec.progress_deadline_ms / 1000
        ),
    }
}

fn non_empty(value: Option<&String>) -> Option<&str> {
    value.map(String::as_str).filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use twc_crds::worker_deployment::RolloutStrategy::{AllAtOnce, Manual, Progressive};

    use super::*;
    use crate::model::TemporalState;
    use crate::plan::fixtures::*;

    fn memory() -> RolloutMemory {
        RolloutMemory {
            build_id: NEW.into(),
            started_at: 0,
            gate: GateState::NotRun,
            promote_requested: false,
            pause_requested: false,
            held: HeldTime::default(),
            analysis: AnalysisMemory::default(),
            progress: Progress::default(),
            replay: ReplayCheck::default(),
        }
    }

    fn spec_for(strategy: RolloutStrategy) -> SpecView {
        let mut spec = spec(strategy);
        if strategy == Progressive {
            spec.steps = steps(&[(25, 5), (50, 10), (75, 30)]);
        }
        spec
    }

    /// NEW registered (Inactive) and Available, OLD Current.
    fn ready(strategy: RolloutStrategy) -> Observation {
        let mut temporal = temporal_with_old_current();
        temporal.versions.push(version(NEW, VersionState::Inactive));
        observation(
            spec_for(strategy),
            vec![deployment(OLD), deployment(NEW)],
            temporal,
        )
    }

    /// NEW registered and Available, no Current version in Temporal (the first rollout).
    fn first_version(strategy: RolloutStrategy) -> Observation {
        let temporal = TemporalState {
            exists: true,
            versions: vec![version(NEW, VersionState::Inactive)],
            ..TemporalState::default()
        };
        observation(spec_for(strategy), vec![deployment(NEW)], temporal)
    }

    /// NEW was Current `ago` milliseconds before now and is Drained; OLD is Current.
    fn previously_current(strategy: RolloutStrategy, ago: i64, now: UnixMillis) -> Observation {
        let mut obs = ready(strategy);
        if let Ok(t) = obs.temporal.as_mut() {
            t.versions[1] = TemporalVersion {
                last_current_at: Some(now - ago),
                ..version(NEW, VersionState::Drained)
            };
        }
        obs
    }

    /// NEW Current and OLD still ramping.
    fn current_with_stale_ramp(strategy: RolloutStrategy) -> Observation {
        let temporal = TemporalState {
            exists: true,
            current_build_id: Some(NEW.into()),
            ramping_build_id: Some(OLD.into()),
            ramp_percentage: Some(10.0),
            ramp_changed_at: Some(0),
            versions: vec![
                version(NEW, VersionState::Current),
                version(OLD, VersionState::Ramping),
            ],
            ..TemporalState::default()
        };
        observation(
            spec_for(strategy),
            vec![deployment(OLD), deployment(NEW)],
            temporal,
        )
    }

    /// NEW ramping at `percent`, the percentage set at `changed_at`.
    fn ramping(spec: SpecView, percent: f32, changed_at: Option<UnixMillis>) -> Observation {
        let mut temporal = temporal_with_old_current();
        temporal.ramping_build_id = Some(NEW.into());
        temporal.ramp_percentage = Some(percent);
        temporal.ramp_changed_at = changed_at;
        temporal.versions.push(version(NEW, VersionState::Ramping));
        observation(spec, vec![deployment(OLD), deployment(NEW)], temporal)
    }

    fn edit(mut obs: Observation, f: impl FnOnce(&mut Observation)) -> Observation {
        f(&mut obs);
        obs
    }

    fn temporal_mut(obs: &mut Observation) -> &mut TemporalState {
        obs.temporal.as_mut().expect("fixture has a Temporal state")
    }

    fn spec_mut(obs: &mut Observation) -> &mut SpecView {
        obs.spec.as_mut().expect("fixture has a spec")
    }

    fn new_deployment_mut(obs: &mut Observation) -> &mut DeploymentView {
        obs.deployments
            .iter_mut()
            .find(|d| d.build_id == NEW)
            .expect("fixture has NEW's Deployment")
    }

    #[test]
    fn go_controller_outcome_table_reference_3_6() {
        let hour = secs(3600);
        let now = secs(10_000);
        let cases: Vec<(&str, Observation, RolloutDecision)> = vec![
            // first version, no current
            (
                "first version, Manual stays Inactive",
                first_version(Manual),
                RolloutDecision::WaitForManualPromotion,
            ),
            (
                "first version, AllAtOnce goes Current",
                first_version(AllAtOnce),
                RolloutDecision::SetCurrent,
            ),
            (
                "first version, Progressive skips the steps",
                first_version(Progressive),
                RolloutDecision::SetCurrent,
            ),
            // current exists (different build)
            (
                "current exists, Manual stays Inactive",
                ready(Manual),
                RolloutDecision::WaitForManualPromotion,
            ),
            (
                "current exists, AllAtOnce goes Current",
                ready(AllAtOnce),
                RolloutDecision::SetCurrent,
            ),
            (
                "current exists, Progressive ramps at step 0",
                ready(Progressive),
                RolloutDecision::SetRamping {
                    percentage: 25,
                    step: 0,
                },
            ),
            // rollback within the window
            (
                "rollback, Manual stays as is",
                previously_current(Manual, hour / 2, now),
                RolloutDecision::WaitForManualPromotion,
            ),
            (
                "rollback, AllAtOnce goes Current",
                previously_current(AllAtOnce, hour / 2, now),
                RolloutDecision::SetCurrent,
            ),
            (
                "rollback, Progressive goes Current at once",
                previously_current(Progressive, hour / 2, now),
                RolloutDecision::SetCurrent,
            ),
            // target == current, another build ramping
            (
                "stale ramp, Manual does nothing",
                current_with_stale_ramp(Manual),
                RolloutDecision::Complete,
            ),
            (
                "stale ramp, AllAtOnce clears it",
                current_with_stale_ramp(AllAtOnce),
                RolloutDecision::ClearRamp,
            ),
            (
                "stale ramp, Progressive clears it",
                current_with_stale_ramp(Progressive),
                RolloutDecision::ClearRamp,
            ),
        ];
        for (name, obs, expected) in cases {
            assert_eq!(decide(&obs, &memory(), now), expected, "{name}");
        }
    }

    #[test]
    fn the_rollout_ends_without_acting_when_the_build_is_no_longer_the_target() {
        let cases = [
            ("TWD gone", edit(ready(AllAtOnce), |o| o.spec = None)),
            (
                "TWD being deleted",
                edit(ready(AllAtOnce), |o| spec_mut(o).deleting = true),
            ),
            (
                "newer build targeted",
                edit(ready(AllAtOnce), |o| {
                    spec_mut(o).target_build_id = "v3-cccccccccc".into()
                }),
            ),
            (
                "newer build targeted while this one ramps",
                edit(ramping(spec_for(Progressive), 50.0, Some(0)), |o| {
                    spec_mut(o).target_build_id = "v3-cccccccccc".into()
                }),
            ),
        ];
        for (name, obs) in cases {
            assert_eq!(
                decide(&obs, &memory(), 0),
                RolloutDecision::Superseded,
                "{name}"
            );
        }
    }

    #[test]
    fn an_invalid_spec_blocks_with_every_problem_listed() {
        let obs = edit(ready(AllAtOnce), |o| {
            spec_mut(o).invalid = vec!["first".into(), "second".into()]
        });
        assert_eq!(
            decide(&obs, &memory(), 0),
            RolloutDecision::Blocked(Blocked {
                reason: BlockReason::InvalidSpec,
                message: "first; second".into()
            })
        );
    }

    #[test]
    fn an_unreadable_temporal_blocks_with_its_reason() {
        let blocked = Blocked {
            reason: BlockReason::AuthSecretInvalid,
            message: "secret tls missing".into(),
        };
        let obs = edit(ready(AllAtOnce), |o| o.temporal = Err(blocked.clone()));
        assert_eq!(
            decide(&obs, &memory(), 0),
            RolloutDecision::Blocked(blocked)
        );
    }

    #[test]
    fn a_missing_or_deleting_deployment_is_created() {
        let missing = edit(ready(AllAtOnce), |o| {
            o.deployments.retain(|d| d.build_id != NEW)
        });
        let deleting = edit(ready(AllAtOnce), |o| new_deployment_mut(o).deleting = true);
        assert_eq!(
            decide(&missing, &memory(), 0),
            RolloutDecision::CreateDeployment
        );
        assert_eq!(
            decide(&deleting, &memory(), 0),
            RolloutDecision::CreateDeployment
        );
    }

    #[test]
    fn target_replicas_follow_the_spec_or_revive_from_zero() {
        let cases: Vec<(&str, Option<i32>, Option<i32>, RolloutDecision)> = vec![
            (
                "spec 3, deployment 2",
                Some(3),
                Some(2),
                RolloutDecision::ScaleTarget { replicas: 3 },
            ),
            (
                "spec 3, deployment unset",
                Some(3),
                None,
                RolloutDecision::ScaleTarget { replicas: 3 },
            ),
            (
                "spec 0, deployment 2",
                Some(0),
                Some(2),
                RolloutDecision::ScaleTarget { replicas: 0 },
            ),
            (
                "spec unset, deployment 0 is revived",
                None,
                Some(0),
                RolloutDecision::ScaleTarget { replicas: 1 },
            ),
            (
                "spec unset, deployment 5 left to the autoscaler",
                None,
                Some(5),
                RolloutDecision::SetCurrent,
            ),
            (
                "spec unset, deployment unset",
                None,
                None,
                RolloutDecision::SetCurrent,
            ),
            (
                "spec matches",
                Some(2),
                Some(2),
                RolloutDecision::SetCurrent,
            ),
        ];
        for (name, wanted, actual, expected) in cases {
            let obs = edit(ready(AllAtOnce), |o| {
                spec_mut(o).replicas = wanted;
                new_deployment_mut(o).replicas = actual;
            });
            assert_eq!(decide(&obs, &memory(), 0), expected, "{name}");
        }
    }

    #[test]
    fn replicas_are_fixed_even_after_completion() {
        let obs = edit(current_with_stale_ramp(AllAtOnce), |o| {
            spec_mut(o).replicas = Some(4)
        });
        assert_eq!(
            decide(&obs, &memory(), 0),
            RolloutDecision::ScaleTarget { replicas: 4 }
        );
    }

    #[test]
    fn a_current_build_completes_without_gate_or_pause() {
        let obs = edit(current_with_stale_ramp(Progressive), |o| {
            temporal_mut(o).ramping_build_id = None;
            temporal_mut(o).ramp_percentage = None;
            let spec = spec_mut(o);
            spec.gate_workflow_type = Some("Smoke".into());
            spec.paused = true;
        });
        let memory = RolloutMemory {
            pause_requested: true,
            ..memory()
        };
        assert_eq!(decide(&obs, &memory, 0), RolloutDecision::Complete);
    }

    #[test]
    fn a_build_made_current_by_hand_completes_even_in_manual() {
        let obs = edit(current_with_stale_ramp(Manual), |o| {
            temporal_mut(o).ramping_build_id = None
        });
        assert_eq!(decide(&obs, &memory(), 0), RolloutDecision::Complete);
    }

    #[test]
    fn rollback_window_decides_whether_a_previous_version_skips_gate_and_steps() {
        let now = secs(100_000);
        let with_gate = |mut obs: Observation| {
            spec_mut(&mut obs).gate_workflow_type = Some("Smoke".into());
            obs
        };
        let cases: Vec<(&str, Observation, RolloutDecision)> = vec![
            (
                "inside the window",
                with_gate(previously_current(Progressive, secs(1800), now)),
                RolloutDecision::SetCurrent,
            ),
            (
                "at the window's edge",
                with_gate(previously_current(Progressive, secs(3600), now)),
                RolloutDecision::SetCurrent,
            ),
            (
                "outside the window runs the gate",
                with_gate(previously_current(Progressive, secs(3601), now)),
                RolloutDecision::RunGate,
            ),
            (
                "outside the window ramps",
                previously_current(Progressive, secs(7200), now),
                RolloutDecision::SetRamping {
                    percentage: 25,
                    step: 0,
                },
            ),
            (
                "disabled window ramps",
                edit(previously_current(Progressive, secs(60), now), |o| {
                    spec_mut(o).rollback_window_ms = 0
                }),
                RolloutDecision::SetRamping {
                    percentage: 25,
                    step: 0,
                },
            ),
            (
                "a longer window reaches further back",
                edit(previously_current(Progressive, secs(7200), now), |o| {
                    spec_mut(o).rollback_window_ms = secs(3 * 3600)
                }),
                RolloutDecision::SetCurrent,
            ),
            (
                "a rollback still waits for its pods",
                edit(previously_current(AllAtOnce, secs(60), now), |o| {
                    new_deployment_mut(o).available = false
                }),
                RolloutDecision::WaitForPollers {
                    deadline_at: secs(600) + now - secs(10),
                },
            ),
            (
                "a rollback is not held by pause",
                edit(previously_current(AllAtOnce, secs(60), now), |o| {
                    spec_mut(o).paused = true
                }),
                RolloutDecision::SetCurrent,
            ),
            (
                "Manual never rolls back",
                previously_current(Manual, secs(60), now),
                RolloutDecision::WaitForManualPromotion,
            ),
        ];
        let memory = RolloutMemory {
            started_at: now - secs(10),
            ..memory()
        };
        for (name, obs, expected) in cases {
            assert_eq!(decide(&obs, &memory, now), expected, "{name}");
        }
    }

    #[test]
    fn waiting_for_pollers_is_bounded_by_the_progress_deadline() {
        let not_registered = edit(ready(AllAtOnce), |o| {
            temporal_mut(o).versions.retain(|v| v.build_id != NEW)
        });
        let listed_not_registered = edit(ready(AllAtOnce), |o| {
            temporal_mut(o).versions[1].state = VersionState::NotRegistered;
        });
        let unavailable = edit(ready(AllAtOnce), |o| {
            let d = new_deployment_mut(o);
            d.available = false;
            d.problem = Some("back-off restarting failed container".into());
        });
        let memory = RolloutMemory {
            started_at: secs(100),
            ..memory()
        };
        let deadline_at = secs(700);
        for (name, obs) in [
            ("not registered", &not_registered),
            ("listed as NotRegistered", &listed_not_registered),
            ("not available", &unavailable),
        ] {
            assert_eq!(
                decide(obs, &memory, secs(100)),
                RolloutDecision::WaitForPollers { deadline_at },
                "{name} at start"
            );
            assert_eq!(
                decide(obs, &memory, deadline_at),
                RolloutDecision::WaitForPollers { deadline_at },
                "{name} at deadline"
            );
            let RolloutDecision::DeadlineExceeded(blocked) = decide(obs, &memory, deadline_at + 1)
            else {
                panic!("{name}: expected DeadlineExceeded after the deadline");
            };
            assert_eq!(
                blocked.reason,
                BlockReason::ProgressDeadlineExceeded,
                "{name}"
            );
            assert!(
                blocked.message.contains("600s"),
                "{name}: {}",
                blocked.message
            );
        }
        let RolloutDecision::DeadlineExceeded(blocked) =
            decide(&unavailable, &memory, deadline_at + 1)
        else {
            panic!("expected DeadlineExceeded");
        };
        assert!(
            blocked
                .message
                .contains("back-off restarting failed container"),
            "{}",
            blocked.message
        );
        assert!(
            blocked.message.contains(&deployment_name(NEW)),
            "{}",
            blocked.message
        );
        let RolloutDecision::DeadlineExceeded(blocked) =
            decide(&not_registered, &memory, deadline_at + 1)
        else {
            panic!("expected DeadlineExceeded");
        };
        assert!(
            blocked
                .message
                .contains(&format!("no worker of buildID {NEW} polled Temporal")),
            "{}",
            blocked.message
        );
    }

    /// A memory whose build was registered and Available at `at` (its last progress).
    fn was_available(at: UnixMillis) -> RolloutMemory {
        RolloutMemory {
            progress: Progress {
                last_at: Some(at),
                ready_replicas: 2,
                registered: true,
                available_at: Some(at),
            },
            ..memory()
        }
    }

    /// NEW's Deployment with `ready` of its pods ready, not Available.
    fn with_ready(obs: Observation, ready: i32) -> Observation {
        edit(obs, |o| {
            let d = new_deployment_mut(o);
            d.ready_replicas = ready;
            d.available = false;
        })
    }

    #[test]
    fn the_progress_deadline_counts_from_the_last_progress_like_a_deployments() {
        let unavailable = with_ready(ready(AllAtOnce), 1);
        let progressed_at = |at: UnixMillis, started_at: UnixMillis| RolloutMemory {
            started_at,
            progress: Progress {
                last_at: Some(at),
                ready_replicas: 1,
                registered: true,
                available_at: None,
            },
            ..memory()
        };
        let exceeded = |o: &Observation, m: &RolloutMemory, now| matches!(decide(o, m, now), RolloutDecision::DeadlineExceeded(b) if b.reason == BlockReason::ProgressDeadlineExceeded);
        // (name, memory, now, Some(deadline) to wait for, or None for exceeded)
        let cases: Vec<(&str, RolloutMemory, UnixMillis, Option<UnixMillis>)> = vec![
            (
                "no progress since the start",
                memory(),
                secs(600),
                Some(secs(600)),
            ),
            (
                "no progress since the start, past it",
                memory(),
                secs(601),
                None,
            ),
            (
                "a pod got ready late: counted from then",
                progressed_at(secs(500), 0),
                secs(1000),
                Some(secs(1100)),
            ),
            (
                "no progress since that pod",
                progressed_at(secs(500), 0),
                secs(1101),
                None,
            ),
            (
                "retried after it: counted from the retry",
                progressed_at(secs(500), secs(2000)),
                secs(2100),
                Some(secs(2600)),
            ),
        ];
        for (name, memory, now, expected) in cases {
            match expected {
                Some(deadline_at) => assert_eq!(
                    decide(&unavailable, &memory, now),
                    RolloutDecision::WaitForPollers { deadline_at },
                    "{name}"
                ),
                None => assert!(exceeded(&unavailable, &memory, now), "{name}"),
            }
        }
    }

    #[test]
    fn a_build_that_was_available_holds_while_briefly_not_and_is_never_past_its_deadline() {
        // Issue #31: Progressive, one 5 h step at 10 %, a progress deadline of 600 s; the build
        // was registered and Available 60 s into the rollout and ramped at 70 s.
        let mut spec = spec_for(Progressive);
        spec.steps = steps(&[(10, 5 * 3600)]);
        let step = ramping(spec, 10.0, Some(secs(70)));
        let memory = was_available(secs(60));
        let hold = RolloutDecision::HoldStep {
            step: 0,
            until: secs(70 + 5 * 3600),
        };
        let holds_for_availability = |o: &Observation, now| {
            let decision = decide(o, &memory, now);
            match decision {
                RolloutDecision::WaitForAvailability { message } => message,
                other => panic!("expected WaitForAvailability, got {other:?}"),
            }
        };
        // 11.8 minutes in, past the deadline counted from the start: spec.replicas went from 1 to
        // 2, the Deployment was scaled and 1 of its 2 pods is ready.
        let scaled_up = with_ready(step.clone(), 1);
        let message = holds_for_availability(&scaled_up, secs(708));
        assert!(
            message.contains(&format!(
                "Deployment {} has 1 of 2 pods ready",
                deployment_name(NEW)
            )),
            "{message}"
        );
        // Hours later a pod is evicted (its problem named), or Temporal briefly does not list
        // the version: the same hold.
        let evicted = edit(with_ready(step.clone(), 1), |o| {
            new_deployment_mut(o).problem = Some("pod hello-x: process exited".into())
        });
        let message = holds_for_availability(&evicted, secs(4 * 3600));
        assert!(message.contains("pod hello-x: process exited"), "{message}");
        let unlisted = edit(step.clone(), |o| {
            temporal_mut(o).versions.retain(|v| v.build_id != NEW)
        });
        let message = holds_for_availability(&unlisted, secs(4 * 3600));
        assert!(message.contains("not list its workers"), "{message}");
        // Available again: the step goes on to its end, which the hold did not move.
        assert_eq!(decide(&step, &memory, secs(712)), hold);
        assert_eq!(
            decide(&step, &memory, secs(70 + 5 * 3600)),
            RolloutDecision::SetCurrent
        );
    }

    #[test]
    fn progress_is_more_pods_ready_registration_or_availability() {
        let not_registered = |pods: i32| {
            edit(with_ready(ready(AllAtOnce), pods), |o| {
                temporal_mut(o).versions.retain(|v| v.build_id != NEW)
            })
        };
        let mut progress = Progress::default();
        // (name, observation, progressed)
        let steps: Vec<(&str, Observation, bool)> = vec![
            ("nothing ready yet", not_registered(0), false),
            ("a pod ready", not_registered(1), true),
            ("the same pod", not_registered(1), false),
            ("the pod restarted", not_registered(0), false),
            ("ready again: no new best", not_registered(1), false),
            ("registered", with_ready(ready(AllAtOnce), 1), true),
            ("a second pod", with_ready(ready(AllAtOnce), 2), true),
            ("Available", ready(AllAtOnce), true),
            (
                "a pod restarted after",
                with_ready(ready(AllAtOnce), 1),
                false,
            ),
        ];
        for (i, (name, obs, progressed)) in steps.iter().enumerate() {
            let now = secs(i as i64 * 10);
            let last = progress.last_at;
            assert_eq!(progress.track(obs, NEW, now), *progressed, "{name}");
            let expected = if *progressed { Some(now) } else { last };
            assert_eq!(progress.last_at, expected, "{name}");
        }
        assert_eq!(progress.available_at, Some(secs(70)));
        // No Deployment (being created) is no progress.
        let missing = edit(ready(AllAtOnce), |o| o.deployments.clear());
        assert!(!Progress::default().track(&missing, NEW, 0));
    }

    #[test]
    fn the_gate_runs_before_routing_in_every_strategy() {
        for strategy in [Manual, AllAtOnce, Progressive] {
            let obs = edit(ready(strategy), |o| {
                spec_mut(o).gate_workflow_type = Some("Smoke".into())
            });
            assert_eq!(
                decide(&obs, &memory(), 0),
                RolloutDecision::RunGate,
                "{strategy:?}"
            );
            let failed = RolloutMemory {
                gate: GateState::Failed {
                    message: "Smoke on orders: Failed".into(),
                },
                ..memory()
            };
            let RolloutDecision::GateFailed(blocked) = decide(&obs, &failed, 0) else {
                panic!("{strategy:?}: expected GateFailed");
            };
            assert_eq!(blocked.reason, BlockReason::GateFailed);
            assert!(
                blocked.message.contains("Smoke on orders: Failed"),
                "{}",
                blocked.message
            );
            let passed = RolloutMemory {
                gate: GateState::Passed,
                ..memory()
            };
            assert_eq!(
                decide(&obs, &passed, 0),
                decide(&ready(strategy), &memory(), 0),
                "{strategy:?} after the gate"
            );
        }
    }

    fn replay_check(dry_run: bool) -> crate::model::ReplayCheckView {
        crate::model::ReplayCheckView {
            command: None,
            args: Some(vec!["replay".into()]),
            max_histories: 50,
            max_history_events: 20_000,
            timeout_seconds: 600,
            dry_run,
        }
    }

    fn with_verdict(verdict: Option<ReplayVerdict>) -> RolloutMemory {
        RolloutMemory {
            replay: ReplayCheck {
                attempt: 0,
                verdict,
            },
            ..memory()
        }
    }

    #[test]
    fn the_replay_check_runs_before_the_first_routing_change_and_decides_it() {
        let passed = Some(ReplayVerdict::Passed {
            histories: 3,
            workflow_types: [("HelloWorld".into(), 3)].into(),
            seconds: 1.0,
        });
        let mismatch = Some(ReplayVerdict::Nondeterministic {
            workflow_id: "order-7".into(),
            run_id: "r-7".into(),
            workflow_type: "Order".into(),
            message: "[TMPRL1100] Nondeterminism error: Timer machine does not handle this event"
                .into(),
            count: 2,
        });
        let unsure = Some(ReplayVerdict::Inconclusive {
            reason: "replay Job x failed (DeadlineExceeded: too long)".into(),
        });
        let checked = |strategy, dry_run| {
            edit(ready(strategy), |o| {
                spec_mut(o).replay_check = Some(replay_check(dry_run))
            })
        };
        for strategy in [Manual, AllAtOnce, Progressive] {
            let unchecked = decide(&ready(strategy), &memory(), 0);
            for (dry_run, verdict, wanted) in [
                (false, None, Some("RunReplayCheck")),
                (false, passed.clone(), None),
                (false, mismatch.clone(), Some("ReplayCheckFailed")),
                (false, unsure.clone(), Some("ReplayCheckHeld")),
                (true, None, Some("RunReplayCheck")),
                (true, mismatch.clone(), None),
                (true, unsure.clone(), None),
            ] {
                let decision = decide(
                    &checked(strategy, dry_run),
                    &with_verdict(verdict.clone()),
                    0,
                );
                match wanted {
                    None => assert_eq!(
                        decision, unchecked,
                        "{strategy:?}, dry run {dry_run}, {verdict:?}: as without the check"
                    ),
                    Some(name) => assert!(
                        format!("{decision:?}").starts_with(name),
                        "{strategy:?}, dry run {dry_run}, {verdict:?}: {decision:?}"
                    ),
                }
            }
        }
        let RolloutDecision::ReplayCheckFailed(blocked) =
            decide(&checked(AllAtOnce, false), &with_verdict(mismatch), 0)
        else {
            panic!("expected ReplayCheckFailed");
        };
        assert_eq!(blocked.reason, BlockReason::ReplayCheckFailed);
        for words in [
            "order-7",
            "r-7",
            "Order",
            "Timer machine",
            "2 of the histories",
        ] {
            assert!(
                blocked.message.contains(words),
                "{words}: {}",
                blocked.message
            );
        }
        let RolloutDecision::ReplayCheckHeld(blocked) =
            decide(&checked(AllAtOnce, false), &with_verdict(unsure), 0)
        else {
            panic!("expected ReplayCheckHeld");
        };
        assert_eq!(blocked.reason, BlockReason::ReplayCheckInconclusive);
        assert!(
            blocked.message.contains("DeadlineExceeded"),
            "{}",
            blocked.message
        );

        // No check where nothing could move yet or routing already changed: the first version,
        // a build already ramping, a rollback.
        let first = edit(first_version(AllAtOnce), |o| {
            spec_mut(o).replay_check = Some(replay_check(false))
        });
        assert_eq!(decide(&first, &memory(), 0), RolloutDecision::SetCurrent);
        let mut spec = spec_for(Progressive);
        spec.replay_check = Some(replay_check(false));
        let ramping_now = ramping(spec, 25.0, Some(0));
        assert!(!format!("{:?}", decide(&ramping_now, &memory(), 1)).starts_with("RunReplayCheck"));
        let back = edit(previously_current(AllAtOnce, 1000, 5000), |o| {
            spec_mut(o).replay_check = Some(replay_check(false))
        });
        assert_eq!(decide(&back, &memory(), 5000), RolloutDecision::SetCurrent);
        // The check waits for the gate, and for the build to be registered and Available.
        let gated = edit(checked(AllAtOnce, false), |o| {
            spec_mut(o).gate_workflow_type = Some("Smoke".into())
        });
        assert_eq!(decide(&gated, &memory(), 0), RolloutDecision::RunGate);
    }

    #[test]
    fn retry_runs_an_inconclusive_replay_check_again_as_the_next_attempt() {
        let mut check = ReplayCheck {
            attempt: 0,
            verdict: Some(ReplayVerdict::Inconclusive { reason: "x".into() }),
        };
        check.retry();
        assert_eq!(
            check,
            ReplayCheck {
                attempt: 1,
                verdict: None
            }
        );
        let failed = ReplayCheck {
            attempt: 1,
            verdict: Some(ReplayVerdict::Nondeterministic {
                workflow_id: "a".into(),
                run_id: "b".into(),
                workflow_type: "c".into(),
                message: "d".into(),
                count: 1,
            }),
        };
        let mut retried = failed.clone();
        retried.retry();
        assert_eq!(
            retried, failed,
            "a mismatch aborts the rollout; retry starts a new one"
        );
    }

    #[test]
    fn a_gate_that_outlives_its_timeout_stops_at_the_progress_deadline_not_as_failed() {
        // SPEC §4.8: a gate not finished within its timeout is ProgressDeadlineExceeded.
        let obs = edit(ready(Progressive), |o| {
            spec_mut(o).gate_workflow_type = Some("Smoke".into())
        });
        let timed_out = RolloutMemory {
            gate: GateState::TimedOut {
                message: "gate/ns/w/b/orders/1 on orders: TimedOut".into(),
            },
            ..memory()
        };
        let RolloutDecision::DeadlineExceeded(blocked) = decide(&obs, &timed_out, 0) else {
            panic!("expected DeadlineExceeded");
        };
        assert_eq!(blocked.reason, BlockReason::ProgressDeadlineExceeded);
        assert!(
            blocked.message.contains("orders: TimedOut"),
            "{}",
            blocked.message
        );
        // Without a gate configured, the old state is ignored.
        assert_eq!(
            decide(&ready(AllAtOnce), &timed_out, 0),
            RolloutDecision::SetCurrent
        );
    }

    #[test]
    fn gate_state_is_ignored_without_a_gate() {
        let failed = RolloutMemory {
            gate: GateState::Failed {
                message: "old".into(),
            },
            ..memory()
        };
        assert_eq!(
            decide(&ready(AllAtOnce), &failed, 0),
            RolloutDecision::SetCurrent
        );
    }

    #[test]
    fn the_gate_waits_for_registration() {
        let obs = edit(ready(AllAtOnce), |o| {
            spec_mut(o).gate_workflow_type = Some("Smoke".into());
            temporal_mut(o).versions.retain(|v| v.build_id != NEW);
        });
        assert_eq!(
            decide(&obs, &memory(), 0),
            RolloutDecision::WaitForPollers {
                deadline_at: secs(600)
            }
        );
    }

    #[test]
    fn a_paused_rollout_keeps_its_ramp_and_does_not_advance() {
        let long_ago = Some(-secs(3600));
        let cases = [
            (
                "spec.paused before routing",
                edit(ready(AllAtOnce), |o| spec_mut(o).paused = true),
                memory(),
            ),
            (
                "pause signal before routing",
                ready(AllAtOnce),
                RolloutMemory {
                    pause_requested: true,
                    ..memory()
                },
            ),
            (
                "pause signal mid-ramp with the pause expired",
                ramping(spec_for(Progressive), 50.0, long_ago),
                RolloutMemory {
                    pause_requested: true,
                    ..memory()
                },
            ),
            (
                "spec.paused holds a ramp off the step grid",
                edit(ramping(spec_for(Progressive), 60.0, long_ago), |o| {
                    spec_mut(o).paused = true
                }),
                memory(),
            ),
            (
                "pause wins over promote",
                ready(Progressive),
                RolloutMemory {
                    pause_requested: true,
                    promote_requested: true,
                    ..memory()
                },
            ),
            (
                "pause applies after the gate passed",
                edit(ready(AllAtOnce), |o| {
                    let spec = spec_mut(o);
                    spec.paused = true;
                    spec.gate_workflow_type = Some("Smoke".into());
                }),
                RolloutMemory {
                    gate: GateState::Passed,
                    ..memory()
                },
            ),
        ];
        for (name, obs, memory) in cases {
            assert_eq!(decide(&obs, &memory, 0), RolloutDecision::Paused, "{name}");
        }
    }

    #[test]
    fn promote_skips_remaining_steps_and_pauses() {
        let promote = RolloutMemory {
            promote_requested: true,
            ..memory()
        };
        let cases = [
            ("before the first step", ready(Progressive)),
            ("mid-step", ramping(spec_for(Progressive), 50.0, Some(0))),
            ("Manual promotion", ready(Manual)),
        ];
        for (name, obs) in cases {
            assert_eq!(
                decide(&obs, &promote, secs(1)),
                RolloutDecision::SetCurrent,
                "{name}"
            );
        }
        let gated = edit(ready(Manual), |o| {
            spec_mut(o).gate_workflow_type = Some("Smoke".into())
        });
        assert_eq!(
            decide(&gated, &promote, 0),
            RolloutDecision::RunGate,
            "promote still waits for the gate"
        );
    }

    #[test]
    fn manual_never_changes_routing_without_a_promotion() {
        let now = secs(10_000);
        let observations = [
            ready(Manual),
            first_version(Manual),
            previously_current(Manual, secs(60), now),
            current_with_stale_ramp(Manual),
            ramping(spec_for(Manual), 30.0, Some(0)),
        ];
        for obs in observations {
            let decision = decide(&obs, &memory(), now);
            assert!(
                !matches!(
                    decision,
                    RolloutDecision::SetCurrent
                        | RolloutDecision::SetRamping { .. }
                        | RolloutDecision::ClearRamp
                ),
                "Manual changed routing: {decision:?}"
            );
        }
    }

    #[test]
    fn progressive_steps_snap_hold_and_advance_reference_3_7() {
        let standard = spec_for(Progressive);
        let grid = |pairs: &[(u8, i64)]| {
            let mut spec = spec_for(Progressive);
            spec.steps = steps(pairs);
            spec
        };
        let now = secs(100);
        let cases: Vec<(&str, Observation, RolloutDecision)> = vec![
            (
                "another build ramps: replaced by step 0",
                edit(ready(Progressive), |o| {
                    let t = temporal_mut(o);
                    t.ramping_build_id = Some("v0-zzzzzzzzzz".into());
                    t.ramp_percentage = Some(40.0);
                }),
                RolloutDecision::SetRamping {
                    percentage: 25,
                    step: 0,
                },
            ),
            (
                "on a step, pause running",
                ramping(standard.clone(), 50.0, Some(secs(95))),
                RolloutDecision::HoldStep {
                    step: 1,
                    until: secs(105),
                },
            ),
            (
                "on a step, pause ends exactly now",
                ramping(standard.clone(), 50.0, Some(secs(90))),
                RolloutDecision::SetRamping {
                    percentage: 75,
                    step: 2,
                },
            ),
            (
                "last step, pause over",
                ramping(standard.clone(), 75.0, Some(secs(10))),
                RolloutDecision::SetCurrent,
            ),
            (
                "last step, pause running",
                ramping(standard.clone(), 75.0, Some(secs(80))),
                RolloutDecision::HoldStep {
                    step: 2,
                    until: secs(110),
                },
            ),
            (
                "ramp time unknown: hold a full pause from now",
                ramping(standard.clone(), 25.0, None),
                RolloutDecision::HoldStep {
                    step: 0,
                    until: secs(105),
                },
            ),
            (
                "ramp at 0% counts as below every step",
                ramping(standard.clone(), 0.0, Some(0)),
                RolloutDecision::SetRamping {
                    percentage: 25,
                    step: 0,
                },
            ),
            (
                "float ramp from Temporal matches the integer step",
                ramping(standard.clone(), 49.999_996, Some(secs(99))),
                RolloutDecision::HoldStep {
                    step: 1,
                    until: secs(109),
                },
            ),
            (
                "manual 20% with steps 5/10/25/50 snaps down to 10",
                ramping(
                    grid(&[(5, 10), (10, 10), (25, 10), (50, 10)]),
                    20.0,
                    Some(0),
                ),
                RolloutDecision::SetRamping {
                    percentage: 10,
                    step: 1,
                },
            ),
            (
                "manual 1% with steps 10/25/50 snaps up to 10",
                ramping(grid(&[(10, 10), (25, 10), (50, 10)]), 1.0, Some(0)),
                RolloutDecision::SetRamping {
                    percentage: 10,
                    step: 0,
                },
            ),
            (
                "manual 90% above the last step snaps to the last step",
                ramping(standard.clone(), 90.0, Some(0)),
                RolloutDecision::SetRamping {
                    percentage: 75,
                    step: 2,
                },
            ),
            (
                "manual jump onto a later step holds that step from the edit",
                ramping(standard.clone(), 75.0, Some(secs(99))),
                RolloutDecision::HoldStep {
                    step: 2,
                    until: secs(129),
                },
            ),
            (
                "step list edited: live ramp no longer a step, resume from the last step below it",
                ramping(
                    grid(&[(10, 60), (30, 60), (60, 60), (90, 60)]),
                    50.0,
                    Some(secs(99)),
                ),
                RolloutDecision::SetRamping {
                    percentage: 30,
                    step: 1,
                },
            ),
            (
                "step list edited: live ramp still a step, its new pause applies",
                ramping(grid(&[(20, 60), (50, 120), (80, 60)]), 50.0, Some(secs(50))),
                RolloutDecision::HoldStep {
                    step: 1,
                    until: secs(170),
                },
            ),
            (
                "step list edited: steps appended after the live ramp are still run",
                ramping(
                    grid(&[(25, 5), (50, 10), (75, 30), (90, 30)]),
                    75.0,
                    Some(secs(10)),
                ),
                RolloutDecision::SetRamping {
                    percentage: 90,
                    step: 3,
                },
            ),
        ];
        for (name, obs, expected) in cases {
            assert_eq!(decide(&obs, &memory(), now), expected, "{name}");
        }
    }

    #[test]
    fn a_hold_does_not_use_up_the_step_pause() {
        // Step 2 (50%, 10 s) set at 0 s; held from 2 s to 20 s; resumed at 21 s.
        let obs = ramping(spec_for(Progressive), 50.0, Some(0));
        let step_clock = Some(0);
        let mut memory = memory();
        assert_eq!(memory.held.track(false, step_clock, secs(1)), None);
        assert_eq!(
            memory.held.track(true, step_clock, secs(2)),
            Some(HoldTransition::Held)
        );
        assert_eq!(memory.held.track(true, step_clock, secs(15)), None);
        // Released at 20 s: 8 s of the step's pause are left, so it ends at 28 s.
        assert_eq!(
            decide(&obs, &memory, secs(20)),
            RolloutDecision::HoldStep {
                step: 1,
                until: secs(28)
            }
        );
        assert_eq!(
            memory.held.track(false, step_clock, secs(20)),
            Some(HoldTransition::Released)
        );
        let hold = RolloutDecision::HoldStep {
            step: 1,
            until: secs(28),
        };
        assert_eq!(decide(&obs, &memory, secs(21)), hold);
        assert_eq!(
            decide(&obs, &memory, secs(28)),
            RolloutDecision::SetRamping {
                percentage: 75,
                step: 2
            }
        );
    }

    #[test]
    fn a_new_step_starts_with_no_held_time() {
        let mut memory = memory();
        memory.held.track(true, Some(0), secs(1));
        memory.held.track(false, Some(0), secs(60));
        // The next step's ramp was set at 61 s: its clock is new, the earlier hold is forgotten.
        let obs = ramping(spec_for(Progressive), 75.0, Some(secs(61)));
        assert_eq!(memory.held.track(false, Some(secs(61)), secs(62)), None);
        assert_eq!(memory.held.held_ms, 0);
        assert_eq!(
            decide(&obs, &memory, secs(62)),
            RolloutDecision::HoldStep {
                step: 2,
                until: secs(91)
            }
        );
    }

    #[test]
    fn progressive_without_steps_is_reported_not_panicked() {
        let obs = edit(ready(Progressive), |o| spec_mut(o).steps.clear());
        let RolloutDecision::Blocked(blocked) = decide(&obs, &memory(), 0) else {
            panic!("expected Blocked");
        };
        assert_eq!(blocked.reason, BlockReason::InvalidSpec);
    }

    /// What the simulated Temporal saw: a ramp percentage or the promotion, at a time in seconds.
    #[derive(Debug, PartialEq)]
    enum Routed {
        Ramp(u8),
        Current,
    }

    /// Runs decisions against a simulated Temporal, applying each routing change at once.
    /// `tick` None: wake exactly when a held step ends (durable timers); Some(s): every s seconds.
    fn simulate(
        spec: SpecView,
        initial_ramp: Option<f32>,
        tick: Option<i64>,
    ) -> Vec<(i64, Routed)> {
        let mut obs = match initial_ramp {
            Some(percent) => ramping(spec, percent, Some(-secs(1))),
            None => edit(ready(Progressive), |o| *spec_mut(o) = spec),
        };
        let mut now = 0;
        let mut log = Vec::new();
        for _ in 0..1000 {
            match decide(&obs, &memory(), now) {
                RolloutDecision::SetRamping { percentage, .. } => {
                    let t = temporal_mut(&mut obs);
                    t.ramping_build_id = Some(NEW.into());
                    t.ramp_percentage = Some(f32::from(percentage));
                    t.ramp_changed_at = Some(now);
                    log.push((now / 1000, Routed::Ramp(percentage)));
                }
                RolloutDecision::SetCurrent => {
                    let t = temporal_mut(&mut obs);
                    t.current_build_id = Some(NEW.into());
                    t.ramping_build_id = None;
                    t.ramp_percentage = None;
                    log.push((now / 1000, Routed::Current));
                }
                RolloutDecision::HoldStep { until, .. } => {
                    assert!(until > now, "a hold must end in the future");
                    now = match tick {
                        Some(seconds) => now + secs(seconds),
                        None => until,
                    };
                }
                RolloutDecision::Complete => return log,
                other => panic!("unexpected decision {other:?} at {now}"),
            }
        }
        panic!("rollout did not complete: {log:?}");
    }

    #[test]
    fn progressive_rollout_holds_each_step_for_its_pause() {
        let expected = vec![
            (0, Routed::Ramp(25)),
            (5, Routed::Ramp(50)),
            (15, Routed::Ramp(75)),
            (45, Routed::Current),
        ];
        assert_eq!(
            simulate(spec_for(Progressive), None, None),
            expected,
            "durable timers"
        );
        assert_eq!(
            simulate(spec_for(Progressive), None, Some(1)),
            expected,
            "checked every second"
        );
    }

    #[test]
    fn progressive_rollout_checked_every_minute_takes_three_minutes() {
        let expected = vec![
            (0, Routed::Ramp(25)),
            (60, Routed::Ramp(50)),
            (120, Routed::Ramp(75)),
            (180, Routed::Current),
        ];
        assert_eq!(simulate(spec_for(Progressive), None, Some(60)), expected);
    }

    #[test]
    fn progressive_rollout_resumes_from_a_manual_ramp_on_the_step_grid() {
        let mut spec = spec_for(Progressive);
        spec.steps = steps(&[(5, 10), (10, 10), (25, 10), (50, 10)]);
        assert_eq!(
            simulate(spec, Some(20.0), None),
            vec![
                (0, Routed::Ramp(10)),
                (10, Routed::Ramp(25)),
                (20, Routed::Ramp(50)),
                (30, Routed::Current)
            ],
            "manual 20% snaps to 10"
        );
        let mut spec = spec_for(Progressive);
        spec.steps = steps(&[(10, 10), (25, 10), (50, 10)]);
        assert_eq!(
            simulate(spec, Some(1.0), None),
            vec![
                (0, Routed::Ramp(10)),
                (10, Routed::Ramp(25)),
                (20, Routed::Ramp(50)),
                (30, Routed::Current)
            ],
            "manual 1% snaps to 10"
        );
    }

    fn with_analysis(step_gates: Vec<Option<String>>) -> SpecView {
        use crate::model::{AnalysisView, CheckProvider, CheckView};
        let mut spec = spec_for(Progressive);
        spec.analysis = Some(AnalysisView {
            checks: vec![CheckView {
                name: "failures".into(),
                interval_ms: secs(2),
                failure_limit: 0,
                inconclusive_limit: 1,
                dry_run: false,
                provider: CheckProvider::Temporal {
                    max_failure_percent: Some(5.0),
                    max_increase_over_current: None,
                    min_samples: 10,
                    include_types: Vec::new(),
                    exclude_types: Vec::new(),
                },
            }],
            step_gates,
        });
        spec
    }

    fn measured(verdict: crate::contract::Verdict) -> Vec<crate::contract::Measurement> {
        vec![crate::contract::Measurement {
            check: "failures".into(),
            verdict,
            value: Some(0.0),
            baseline: None,
            samples: Some(20),
            message: format!("failure share ({verdict:?})"),
            queries: Vec::new(),
        }]
    }

    #[test]
    fn analysis_measures_gates_and_decides_each_step() {
        use crate::contract::Verdict::{Failed, Inconclusive, Invalid, Successful};
        let clock = secs(100);
        let obs = ramping(
            with_analysis(vec![None, Some("Smoke".into())]),
            25.0,
            Some(clock),
        );
        let view = obs
            .spec
            .as_ref()
            .and_then(|s| s.analysis.clone())
            .expect("analysis");
        let in_step = |verdicts: &[crate::contract::Verdict], at: UnixMillis| {
            let mut memory = memory();
            memory.analysis.enter_step(0, clock);
            for (i, verdict) in verdicts.iter().enumerate() {
                memory.analysis.record_measurements(
                    &view,
                    &measured(*verdict),
                    at - secs(verdicts.len() as i64 - 1 - i as i64) * 2,
                );
            }
            memory
        };
        let analyze = RolloutDecision::Analyze {
            step: 0,
            checks: vec!["failures".into()],
        };
        // (name, memory, now, expected decision kind)
        let cases: Vec<(&str, RolloutMemory, UnixMillis, &str)> = vec![
            (
                "before the first interval: hold",
                memory(),
                clock + secs(1),
                "AnalysisHold",
            ),
            (
                "one interval after the ramp: measure",
                memory(),
                clock + secs(2),
                "Analyze",
            ),
            (
                "passing, pause not over: hold",
                in_step(&[Successful], clock + secs(4)),
                clock + secs(4),
                "AnalysisHold",
            ),
            (
                "passing after the pause: next step",
                in_step(&[Successful], clock + secs(5)),
                clock + secs(5) + 1,
                "SetRamping",
            ),
            (
                "inconclusive after the pause: held with a reason",
                in_step(&[Inconclusive], clock + secs(5)),
                clock + secs(5) + 1,
                "Inconclusive",
            ),
            (
                "failed: abort",
                in_step(&[Failed], clock + secs(2)),
                clock + secs(3),
                "AnalysisFailed",
            ),
            (
                "inconclusive beyond the limit: abort",
                in_step(&[Inconclusive, Inconclusive], clock + secs(4)),
                clock + secs(4) + 1,
                "AnalysisFailed",
            ),
            (
                "refused by the provider: InvalidSpec",
                in_step(&[Invalid], clock + secs(2)),
                clock + secs(3),
                "InvalidSpec",
            ),
        ];
        for (name, memory, now, expected) in cases {
            let decision = decide(&obs, &memory, now);
            let kind = match &decision {
                RolloutDecision::AnalysisHold {
                    inconclusive: Some(b),
                    ..
                } => {
                    assert_eq!(b.reason, BlockReason::AnalysisInconclusive, "{name}");
                    "Inconclusive"
                }
                RolloutDecision::AnalysisHold { .. } => "AnalysisHold",
                RolloutDecision::Analyze { .. } => {
                    assert_eq!(decision, analyze, "{name}");
                    "Analyze"
                }
                RolloutDecision::SetRamping {
                    percentage: 50,
                    step: 1,
                } => "SetRamping",
                RolloutDecision::AnalysisFailed(b) => {
                    assert_eq!(b.reason, BlockReason::AnalysisFailed, "{name}");
                    assert!(b.message.contains("failure share"), "{name}: {}", b.message);
                    "AnalysisFailed"
                }
                RolloutDecision::Blocked(b) if b.reason == BlockReason::InvalidSpec => {
                    "InvalidSpec"
                }
                other => panic!("{name}: unexpected {other:?}"),
            };
            assert_eq!(kind, expected, "{name}");
        }
        // Step 2 has a gate: it runs before anything else in that step.
        let step2 = ramping(
            with_analysis(vec![None, Some("Smoke".into())]),
            50.0,
            Some(secs(200)),
        );
        assert_eq!(
            decide(&step2, &memory(), secs(203)),
            RolloutDecision::RunStepGate { step: 1 }
        );
        // An operator's promote skips the analysis.
        let promote = RolloutMemory {
            promote_requested: true,
            ..memory()
        };
        assert_eq!(
            decide(&obs, &promote, clock + secs(2)),
            RolloutDecision::SetCurrent
        );
    }
}
