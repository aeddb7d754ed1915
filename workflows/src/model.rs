//! Plain data exchanged between workflows and activities: what activities observe and what
//! workflows ask them to do. Everything here is recorded in workflow histories, so it is kept
//! small and never carries secret values or whole pod templates.
//!
//! Times are Unix milliseconds (`i64`) so they serialize the same everywhere.

use serde::{Deserialize, Serialize};
use twc_crds::worker_deployment::{RolloutStrategy, VersionState};

/// Unix time in milliseconds.
pub type UnixMillis = i64;

/// A TemporalWorkerDeployment by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TwdRef {
    /// Kubernetes namespace.
    pub namespace: String,
    /// Resource name.
    pub name: String,
}

impl TwdRef {
    /// `<namespace>/<name>`, also the Temporal worker deployment name.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Workflow ID of the per-TWD workflow.
    pub fn twd_workflow_id(&self) -> String {
        format!("twd/{}/{}", self.namespace, self.name)
    }

    /// Workflow ID of the rollout of one build.
    pub fn rollout_workflow_id(&self, build_id: &str) -> String {
        format!("rollout/{}/{}/{}", self.namespace, self.name, build_id)
    }
}

/// The parts of a TWD spec the engine decides on (no pod template, no gate input values).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpecView {
    /// `metadata.generation`.
    pub generation: i64,
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.namespace` (for object references in status).
    #[serde(default)]
    pub namespace: String,
    /// Whether `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// Build ID computed from the spec.
    pub target_build_id: String,
    /// Name of the versioned Deployment of the target build.
    pub target_deployment_name: String,
    /// Rollout strategy.
    pub strategy: RolloutStrategy,
    /// Progressive steps (ramp percent, pause in milliseconds).
    pub steps: Vec<StepView>,
    /// Gate workflow type, if a gate is configured.
    pub gate_workflow_type: Option<String>,
    /// `spec.rollout.paused`.
    pub paused: bool,
    /// Rollback window in milliseconds (0 disables).
    pub rollback_window_ms: i64,
    /// `spec.progressDeadlineSeconds` in milliseconds.
    pub progress_deadline_ms: i64,
    /// `spec.replicas`.
    pub replicas: Option<i32>,
    /// `spec.sunset.scaledownDelay` in milliseconds.
    pub scaledown_delay_ms: i64,
    /// `spec.sunset.deleteDelay` in milliseconds.
    pub delete_delay_ms: i64,
    /// Name of the referenced TemporalConnection.
    pub connection_name: String,
    /// Temporal namespace of the workers.
    pub temporal_namespace: String,
    /// Problems the schema cannot catch (`InvalidSpec`); empty when valid.
    pub invalid: Vec<String>,
    /// `spec.sunset.drain`: what to do to workflows still pinned to a retired version (absent
    /// in histories from before it existed).
    #[serde(default)]
    pub drain: Option<DrainPolicy>,
    /// `spec.rollout.analysis` and the step gates (absent in histories from before they
    /// existed, and when neither is configured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis: Option<AnalysisView>,
    /// `spec.autoscaling` (absent in histories from before it existed, and when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<AutoscalePolicy>,
    /// `status.adoptedBuild` while it stands for the current pod template: the target build
    /// was taken over from another controller (kept in the status the engine writes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adopted_build: Option<twc_crds::worker_deployment::AdoptedBuild>,
    /// `spec.rollout.replayCheck` (absent in histories from before it existed, and when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_check: Option<ReplayCheckView>,
}

/// The replay check of a new build (`spec.rollout.replayCheck`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayCheckView {
    /// Replaces the worker container's command in the Job.
    pub command: Option<Vec<String>>,
    /// Replaces the worker container's args in the Job.
    pub args: Option<Vec<String>>,
    /// Histories replayed at most.
    pub max_histories: u32,
    /// Histories longer than this many events are left out.
    pub max_history_events: u32,
    /// `activeDeadlineSeconds` of the Job.
    pub timeout_seconds: i64,
    /// Record the verdict and proceed whatever it is.
    pub dry_run: bool,
}

/// Backlog-driven replicas (`spec.autoscaling`), windows in milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AutoscalePolicy {
    /// Fewest replicas of Current and Ramping together.
    pub min_replicas: u32,
    /// Most replicas of Current and Ramping together.
    pub max_replicas: u32,
    /// What a replica is expected to handle.
    pub target: BacklogTarget,
    /// Scale-up stabilization window.
    pub up_window_ms: i64,
    /// Scale-down stabilization window.
    pub down_window_ms: i64,
    /// Fewest replicas of a Draining version.
    pub draining_min: u32,
    /// Most replicas of a Draining version.
    pub draining_max: u32,
    /// `replicasMode: Shared`: a fixed total (`spec.replicas`) split by role, without reading
    /// backlogs; Draining versions are left alone.
    #[serde(default)]
    pub shared_total: bool,
}

/// The autoscaling target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum BacklogTarget {
    /// Waiting tasks per replica.
    PerReplica(u64),
    /// Age of the oldest waiting task, milliseconds.
    AgeMs(i64),
}

/// Canary analysis of a Progressive rollout: checks measured during each step, and gate
/// workflows run at given steps.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AnalysisView {
    /// The checks (`spec.rollout.analysis.checks`).
    pub checks: Vec<CheckView>,
    /// Gate workflow type of each step (`spec.rollout.steps[i].gate`), by step index.
    pub step_gates: Vec<Option<String>>,
}

impl AnalysisView {
    /// The gate workflow type of step `step`, if it has one.
    pub fn step_gate(&self, step: usize) -> Option<&str> {
        self.step_gates.get(step).and_then(|g| g.as_deref())
    }
}

/// One analysis check.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckView {
    /// Check name.
    pub name: String,
    /// Milliseconds between two measurements.
    pub interval_ms: i64,
    /// Failed measurements a step tolerates.
    pub failure_limit: u32,
    /// Inconclusive measurements in a row a step tolerates.
    pub inconclusive_limit: u32,
    /// Record only.
    pub dry_run: bool,
    /// What is measured.
    pub provider: CheckProvider,
}

/// What a check measures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum CheckProvider {
    /// Failure share of the new version's workflows (Temporal visibility counts).
    Temporal {
        /// Absolute limit, percent.
        max_failure_percent: Option<f64>,
        /// Limit relative to the Current version's share in the same window, points.
        max_increase_over_current: Option<f64>,
        /// Judged workflows needed for a verdict.
        min_samples: u64,
        /// Only these workflow types (empty: all).
        include_types: Vec<String>,
        /// Never these workflow types.
        exclude_types: Vec<String>,
    },
    /// A PromQL instant query with bounds.
    Prometheus {
        /// Base URL of the Prometheus HTTP API.
        address: String,
        /// The query, placeholders not yet replaced.
        query: String,
        /// Highest passing value.
        max_value: Option<f64>,
        /// Lowest passing value.
        min_value: Option<f64>,
    },
}

/// The drain policy of retired versions (`spec.sunset.drain`), durations in milliseconds since
/// the version stopped being Current or Ramping.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainPolicy {
    /// Send the drain signal this long after retirement.
    pub signal_after_ms: Option<i64>,
    /// Name of the drain signal.
    pub signal_name: String,
    /// Cancel the workflows still open this long after retirement.
    pub cancel_after_ms: Option<i64>,
    /// Terminate the workflows still open this long after retirement.
    pub terminate_after_ms: Option<i64>,
    /// Only workflows of these types (empty: every type).
    pub include_types: Vec<String>,
    /// Never workflows of these types.
    pub exclude_types: Vec<String>,
    /// Operations per second of each batch.
    pub rate: u32,
    /// Count and report only; act on nothing.
    pub dry_run: bool,
    /// Builds declared compatible with any later build: their pinned workflows are moved to
    /// the Current version (a pinned versioning override) as soon as they are retired.
    pub move_to_current: Vec<String>,
}

/// One Progressive step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepView {
    /// Ramp percentage (1..=99).
    pub ramp_percentage: u8,
    /// Pause in milliseconds.
    pub pause_ms: i64,
}

/// A versioned Deployment owned by the TWD.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeploymentView {
    /// Deployment name.
    pub name: String,
    /// Value of its `temporal.io/build-id` label.
    pub build_id: String,
    /// `spec.replicas` (None = unset).
    pub replicas: Option<i32>,
    /// `status.replicas` as observed.
    pub status_replicas: i32,
    /// `status.readyReplicas`.
    pub ready_replicas: i32,
    /// `Available` condition is True and the status is for the current generation.
    pub available: bool,
    /// When `Available` last became True.
    pub available_since: Option<UnixMillis>,
    /// Message of a failing `Progressing` condition (e.g. crashing pods), if any.
    pub problem: Option<String>,
    /// Whether the Deployment is being deleted.
    pub deleting: bool,
}

/// Temporal's view of the worker deployment (one DescribeWorkerDeployment).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TemporalState {
    /// Whether the worker deployment exists in Temporal at all.
    pub exists: bool,
    /// Current build ID (None = unversioned).
    pub current_build_id: Option<String>,
    /// Ramping build ID, if any.
    pub ramping_build_id: Option<String>,
    /// Ramp percentage of the ramping build.
    pub ramp_percentage: Option<f32>,
    /// When the ramping build became the ramping version (server time).
    #[serde(default)]
    pub ramping_since: Option<UnixMillis>,
    /// When the ramp percentage last changed (server time).
    pub ramp_changed_at: Option<UnixMillis>,
    /// Every version Temporal knows.
    pub versions: Vec<TemporalVersion>,
    /// Who may change routing ("" = nobody claimed it).
    pub manager_identity: String,
    /// Who changed routing last.
    pub last_modifier_identity: String,
    /// Conflict token of this read (base64).
    pub conflict_token: String,
    /// Routing changes are still propagating to task queues.
    pub routing_update_in_progress: bool,
}

impl TemporalState {
    /// The version entry for a build ID.
    pub fn version(&self, build_id: &str) -> Option<&TemporalVersion> {
        self.versions.iter().find(|v| v.build_id == build_id)
    }
}

/// One version as Temporal reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TemporalVersion {
    /// Build ID.
    pub build_id: String,
    /// State (Inactive, Ramping, Current, Draining, Drained).
    pub state: VersionState,
    /// When drainage status last changed to Drained.
    pub drained_since: Option<UnixMillis>,
    /// Whether a drainage check has happened since the version left routing.
    pub drainage_known: bool,
    /// When the version was last Current (for rollback).
    pub last_current_at: Option<UnixMillis>,
    /// When the version left routing.
    pub deactivated_at: Option<UnixMillis>,
}

/// Why the engine cannot make progress; the names are condition reasons (a public contract).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum BlockReason {
    /// The spec is invalid in a way the schema cannot catch.
    InvalidSpec,
    /// The referenced TemporalConnection does not exist.
    TemporalConnectionNotFound,
    /// A credential Secret is missing, malformed or expired.
    AuthSecretInvalid,
    /// Temporal could not be reached.
    TemporalClientCreationFailed,
    /// Temporal was reached but the worker deployment could not be read (incl. rate limits).
    TemporalStateFetchFailed,
    /// A decision could not be made (e.g. gate input source missing).
    PlanGenerationFailed,
    /// A Kubernetes or Temporal write failed (e.g. manager identity held by someone else).
    PlanExecutionFailed,
    /// The gate workflow did not succeed.
    GateFailed,
    /// The new version did not register or become available in time.
    ProgressDeadlineExceeded,
    /// Too many versions are not yet eligible for deletion.
    VersionLimitReached,
    /// A canary analysis check (or a step gate) failed: the rollout was aborted.
    AnalysisFailed,
    /// A canary analysis check has no verdict yet (no data, too few workflows): the step is
    /// held until it has one.
    AnalysisInconclusive,
    /// The TWD references a ClusterConnection, but this controller is restricted to namespaces
    /// (`--watch-namespaces`) and has no cluster-wide access to read it.
    ClusterConnectionUnsupported,
    /// The new build could not replay a real history (`spec.rollout.replayCheck`): the rollout
    /// was aborted before any workflow moved to it.
    ReplayCheckFailed,
    /// The replay check could not decide (its Job could not run, crashed or timed out): the
    /// rollout holds until `retry` or a new build.
    ReplayCheckInconclusive,
}

impl BlockReason {
    /// The condition reason string.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidSpec => "InvalidSpec",
            Self::TemporalConnectionNotFound => "TemporalConnectionNotFound",
            Self::AuthSecretInvalid => "AuthSecretInvalid",
            Self::TemporalClientCreationFailed => "TemporalClientCreationFailed",
            Self::TemporalStateFetchFailed => "TemporalStateFetchFailed",
            Self::PlanGenerationFailed => "PlanGenerationFailed",
            Self::PlanExecutionFailed => "PlanExecutionFailed",
            Self::GateFailed => "GateFailed",
            Self::ProgressDeadlineExceeded => "ProgressDeadlineExceeded",
            Self::VersionLimitReached => "VersionLimitReached",
            Self::AnalysisFailed => "AnalysisFailed",
            Self::AnalysisInconclusive => "AnalysisInconclusive",
            Self::ClusterConnectionUnsupported => "ClusterConnectionUnsupported",
            Self::ReplayCheckFailed => "ReplayCheckFailed",
            Self::ReplayCheckInconclusive => "ReplayCheckInconclusive",
        }
    }
}

/// A reason with a human message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blocked {
    /// Condition reason.
    pub reason: BlockReason,
    /// What went wrong and what to do.
    pub message: String,
}

/// Everything the engine reads about one TWD in one activity call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// The spec, or None when the TWD no longer exists.
    pub spec: Option<SpecView>,
    /// The TWD's versioned Deployments.
    pub deployments: Vec<DeploymentView>,
    /// Temporal's state, or why it could not be read (connection problems included).
    pub temporal: Result<TemporalState, Blocked>,
    /// Server-side "now" of the observation (the activity's clock), for information only.
    pub observed_at: UnixMillis,
}

impl Observation {
    /// The Deployment of a build, if any.
    pub fn deployment(&self, build_id: &str) -> Option<&DeploymentView> {
        self.deployments
            .iter()
            .find(|d| d.build_id == build_id && !d.deleting)
    }
}

/// A rollout's progress as the TWD workflow shows it in status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RolloutProgress {
    /// Creating the Deployment / waiting for workers to register and become available.
    WaitingForPollers,
    /// Registered; gate running or waiting for promotion (Manual).
    WaitingForPromotion,
    /// Ramping at a step.
    Ramping,
    /// The build was Available and is not now (a pod restarting, more replicas starting): held
    /// where it is, without a deadline, until it is Available again.
    WaitingForAvailability,
    /// Target is Current.
    Complete,
    /// Stopped by an error (see the reason).
    Blocked,
    /// Held by `paused`.
    Paused,
    /// A newer build took over.
    Superseded,
    /// An operator aborted the rollout: routing went back, the build is being retired.
    Aborted,
}

/// Operator controls (the validated update `control` of the TWD workflow, forwarded to the
/// rollout).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ControlAction {
    /// Hold the rollout where it is.
    Pause,
    /// Release a hold.
    Resume,
    /// Skip remaining steps and pauses: make the build Current now.
    Promote,
    /// Stop promoting, route back to the previous Current, retire the build.
    Abort,
    /// Re-run a failed gate, or restart the progress deadline.
    Retry,
}

/// What a rollout workflow tells the TWD workflow (signal `rollout_update`), which turns it into
/// status and events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RolloutReport {
    /// Build being rolled out.
    pub build_id: String,
    /// Rollout workflow ID.
    pub workflow_id: String,
    /// Rollout workflow run ID.
    pub run_id: String,
    /// Where it is.
    pub progress: RolloutProgress,
    /// Progressive step index in force, if ramping.
    pub step: Option<u32>,
    /// Ramp percentage in force, if ramping.
    pub ramp_percentage: Option<u8>,
    /// When the current step's pause ends, if holding a step.
    pub next_step_at: Option<UnixMillis>,
    /// Why it is blocked, if it is.
    pub blocked: Option<Blocked>,
    /// What it is doing, in words.
    pub message: String,
    /// When the rollout started.
    pub started_at: UnixMillis,
    /// Gate workflow runs of the latest attempt.
    pub gate_runs: Vec<crate::contract::GateRun>,
    /// Canary analysis of the step in force (absent in reports from before it existed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub analysis: Vec<twc_crds::worker_deployment::AnalysisCheckStatus>,
    /// Monotonic counter, so a stale report (delivered late) never overwrites a newer one.
    pub sequence: u64,
    /// Routing the rollout has just written to Temporal, in the report sent right after the
    /// write: the TWD workflow shows it in the status at once, without reading Temporal again
    /// (which refuses reads of a worker deployment for a moment after a change). Absent in
    /// other reports and in those from before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<AppliedRouting>,
    /// What an operator control would find: the TWD workflow validates controls against it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control: Option<crate::control::ControlState>,
}

/// Routing as a rollout left it after a write it made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedRouting {
    /// Current build ID (None = unversioned).
    pub current_build_id: Option<String>,
    /// Ramping build ID, if any.
    pub ramping_build_id: Option<String>,
    /// Ramp percentage of the ramping build.
    pub ramp_percentage: Option<u8>,
}

impl AppliedRouting {
    /// The routing `observation` read; `None` when Temporal was unreadable.
    pub fn read_in(observation: &Observation) -> Option<Self> {
        let temporal = observation.temporal.as_ref().ok()?;
        Some(Self {
            current_build_id: temporal.current_build_id.clone(),
            ramping_build_id: temporal.ramping_build_id.clone(),
            ramp_percentage: temporal
                .ramp_percentage
                .map(|p| p.round().clamp(0.0, 100.0) as u8),
        })
    }

    /// An observation read while this routing (reported by the rollout in flight) was shown,
    /// where `before` was shown until then. One that still reads `before` was read before the
    /// rollout's write reached Temporal and gets this routing; any other reading is Temporal's
    /// newer word (this write, or a change after it) and is kept.
    pub fn settle(&self, observation: Observation, before: &AppliedRouting) -> Observation {
        let read = Self::read_in(&observation);
        if read.as_ref() != Some(before) || before == self {
            return observation;
        }
        self.applied_to(&observation).unwrap_or(observation)
    }

    /// `observation` as it would read after this routing was written: routing, and the state
    /// of each version it moved (a build that left routing is Draining until Temporal says
    /// more; a build Temporal had not listed yet is added). `None` when the observation cannot
    /// say enough: Temporal was unreadable, or nobody managed the worker deployment yet (the
    /// write claimed it, and only Temporal knows with which identity).
    pub fn applied_to(&self, observation: &Observation) -> Option<Observation> {
        let mut observation = observation.clone();
        let temporal = observation.temporal.as_mut().ok()?;
        if temporal.manager_identity.is_empty() {
            return None;
        }
        let before = [
            temporal.current_build_id.take(),
            temporal.ramping_build_id.take(),
        ];
        temporal.current_build_id = self.current_build_id.clone();
        temporal.ramping_build_id = self.ramping_build_id.clone();
        temporal.ramp_percentage = self.ramp_percentage.map(f32::from);
        let routed = [
            (self.current_build_id.as_deref(), VersionState::Current),
            (self.ramping_build_id.as_deref(), VersionState::Ramping),
        ];
        for (build, state) in routed {
            let Some(build) = build else { continue };
            match temporal.versions.iter_mut().find(|v| v.build_id == build) {
                Some(version) => version.state = state,
                None => temporal.versions.push(TemporalVersion {
                    build_id: build.to_owned(),
                    state,
                    drained_since: None,
                    drainage_known: false,
                    last_current_at: None,
                    deactivated_at: None,
                }),
            }
        }
        for build in before.iter().flatten() {
            let still_routed = routed.iter().any(|(b, _)| *b == Some(build.as_str()));
            if let Some(version) = temporal.versions.iter_mut().find(|v| v.build_id == *build)
                && !still_routed
            {
                version.state = VersionState::Draining;
            }
        }
        Some(observation)
    }

    /// [`Self::applied_to`], with the ramp's timestamps taken as `at` where the ramp changed
    /// (the moment the report of the write came, tens of milliseconds after Temporal's own
    /// stamp, which the next observation reads).
    pub fn applied_at(&self, observation: &Observation, at: UnixMillis) -> Option<Observation> {
        let before = observation.temporal.as_ref().ok()?;
        let (build, percentage) = (before.ramping_build_id.clone(), before.ramp_percentage);
        let mut applied = self.applied_to(observation)?;
        let temporal = applied.temporal.as_mut().ok()?;
        if self.ramping_build_id.is_none() {
            temporal.ramping_since = None;
            temporal.ramp_changed_at = None;
        } else {
            if self.ramping_build_id != build {
                temporal.ramping_since = Some(at);
            }
            if self.ramping_build_id != build || temporal.ramp_percentage != percentage {
                temporal.ramp_changed_at = Some(at);
            }
        }
        Some(applied)
    }
}
