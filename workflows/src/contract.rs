//! The activities the workflows call: names, inputs and outputs. The `activities` crate
//! implements each with `#[activity(name = ...)]` under the same name; this crate only needs
//! the definitions, so workflow code never links I/O.

use serde::{Deserialize, Serialize};
use temporalio_common::ActivityDefinition;
use twc_crds::worker_deployment::TemporalWorkerDeploymentStatus;

use crate::model::{Blocked, Observation, TwdRef, UnixMillis};

macro_rules! activity {
    ($(#[$doc:meta])* $marker:ident, $name:literal, $input:ty => $output:ty) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Default)]
        pub struct $marker;

        impl $marker {
            /// Activity type name.
            pub const NAME: &'static str = $name;
        }

        impl ActivityDefinition for $marker {
            type Input = $input;
            type Output = $output;

            fn name(&self) -> &str {
                $name
            }
        }
    };
}

activity!(
    /// Reads the TWD, its Deployments and Temporal's routing state.
    Observe, "observe", TwdRef => Observation
);
activity!(
    /// Adds the delete-protection finalizer to the TWD and its TemporalConnection.
    EnsureFinalizers, "ensure_finalizers", TwdRef => ()
);
activity!(
    /// Creates the versioned Deployment of a build if it does not exist (checks the build is
    /// still the TWD's target first).
    CreateDeployment, "create_deployment", BuildRequest => CreateDeploymentOutcome
);
activity!(
    /// Sets a Deployment's replicas through the scale subresource.
    ScaleDeployment, "scale_deployment", ScaleRequest => ()
);
activity!(
    /// Deletes a Deployment if present.
    DeleteDeployment, "delete_deployment", DeploymentRequest => ()
);
activity!(
    /// Waits (polling, heartbeating) until the build has registered pollers in Temporal and its
    /// Deployment is Available, or `max_wait_ms` passes.
    WaitForPollers, "wait_for_pollers", WaitForPollersRequest => PollerWaitOutcome
);
activity!(
    /// Changes routing in the worker's Temporal: claims the manager identity when free, uses the
    /// conflict token, stamps version metadata.
    SetRouting, "set_routing", RoutingRequest => RoutingOutcome
);
activity!(
    /// Deletes a version from Temporal.
    DeleteVersion, "delete_version", DeleteVersionRequest => DeleteVersionOutcome
);
activity!(
    /// Starts the gate workflows (one per workflow task queue, pinned to the build) and waits
    /// for their results.
    RunGate, "run_gate", GateRequest => GateOutcome
);
activity!(
    /// Cancels running gate workflows of a build.
    CancelGates, "cancel_gates", BuildRequest => ()
);
activity!(
    /// Writes TWD status through the status subresource (keeps condition transition times
    /// when a condition did not change).
    WriteStatus, "write_status", StatusRequest => ()
);
activity!(
    /// Records a Kubernetes Event on the TWD (in the controller's own namespace when the TWD's
    /// is being deleted and refuses new events).
    EmitEvent, "emit_event", EventRequest => ()
);
activity!(
    /// Deletion path: routing back to unversioned, Deployments scaled away, versions and the
    /// worker deployment deleted in Temporal, finalizers removed.
    CleanupDeleted, "cleanup_deleted", TwdRef => CleanupOutcome
);
activity!(
    /// Deletion path when Temporal cannot be cleaned and nothing is coming to fix it (see
    /// [`crate::plan::deletion`]): deletes the versioned Deployments, says what was left in
    /// Temporal and how to remove it (a `TemporalCleanupSkipped` Warning event and the log),
    /// releases the finalizers and returns the same words.
    ReleaseWithoutTemporal, "release_without_temporal", ReleaseRequest => String
);
activity!(
    /// Counts the open workflows pinned to a version of the TWD (matching the drain policy's
    /// type filter) and finds the oldest one's start time; a visibility count, not a listing.
    CountPinned, "count_pinned_workflows", PinnedRequest => PinnedCount
);
activity!(
    /// One drain step of a retired version: a Temporal batch operation (signal, cancel,
    /// terminate, or a pinned versioning override to the Current version) over the open
    /// workflows pinned to that version, under a job ID derived from the TWD, build and step
    /// (a retry after a crash finds the same job and never starts a second one); waits for it
    /// to finish. In dry-run only counts.
    DrainVersion, "drain_version", DrainRequest => DrainOutcome
);
activity!(
    /// Re-asserts what the TWD needs, every turn of its workflow: the finalizer on the TWD and
    /// on the TemporalConnection it references now (released from connections no TWD uses),
    /// the connection's current settings on every live versioned Deployment (a rolling
    /// restart), and under `unsafeCustomBuildID` the current pod template on the target
    /// build's Deployment. Returns what it changed.
    ReassertResources, "reassert_resources", TwdRef => ReassertOutcome
);

activity!(
    /// `reassert_resources`, then `observe`, as one activity: a TWD workflow turn that has
    /// nothing to do before its observation spends one activity on both (a quiet turn's
    /// history is 11 events instead of 17). A failed re-assertion does not fail the
    /// observation: it is retried at a later turn, as on its own.
    Recheck, "recheck", TwdRef => RecheckOutcome
);

activity!(
    /// The replay check of a new build: picks real histories from the worker's Temporal (open
    /// AutoUpgrade workflows on the Current and Ramping builds, recent closed ones on Current),
    /// runs the build's own image on them as a Job (one per attempt: a retry finds the Job it
    /// created) and returns its verdict. Without histories to replay it passes without a Job.
    RunReplayCheck, "run_replay_check", ReplayCheckRequest => ReplayVerdict
);

activity!(
    /// Measures canary analysis checks of a build over a window (Temporal visibility counts of
    /// the new and the Current version, or a Prometheus query); one measurement per check.
    RunAnalysis, "run_analysis", AnalysisRequest => AnalysisResult
);

activity!(
    /// Reads each listed version's task-queue statistics from Temporal
    /// (`DescribeWorkerDeploymentVersion` with task-queue stats): backlog, its age, add and
    /// dispatch rates, summed over the version's task queues. One read per version.
    ReadBacklog, "read_backlog", BacklogRequest => BacklogReport
);

/// A build of a TWD.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildRequest {
    /// The TWD.
    pub twd: TwdRef,
    /// The build ID.
    pub build_id: String,
    /// `create_deployment` only: observe first, and create only if Temporal can be read and
    /// fewer retired versions than this are not yet eligible for deletion (what the rollout's
    /// first observation would decide), else answer [`CreateDeploymentOutcome::Deferred`]. Set
    /// when a Deployment is created before the rollout's first observation; `None` creates
    /// regardless (older histories, a create the rollout planned from an observation, and one
    /// an earlier observation showed room for: [`BuildRequest::create_with_room`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version_limit: Option<u32>,
}

impl BuildRequest {
    /// The `create_deployment` made before the rollout's first observation (by the rollout's
    /// create-first, or by the TWD workflow as it starts the rollout): limited to what that
    /// observation would create, under the default version limit.
    pub fn create_before_observing(twd: &TwdRef, build_id: &str) -> Self {
        Self {
            twd: twd.clone(),
            build_id: build_id.to_owned(),
            version_limit: Some(
                u32::try_from(crate::plan::sunset::DEFAULT_MAX_VERSIONS_INELIGIBLE_FOR_DELETION)
                    .unwrap_or(u32::MAX),
            ),
        }
    }

    /// The `create_deployment` of a build an earlier observation already showed room for
    /// ([`crate::plan::sunset::room_for_a_new_version`]): nothing is read but the TWD.
    pub fn create_with_room(twd: &TwdRef, build_id: &str) -> Self {
        Self {
            twd: twd.clone(),
            build_id: build_id.to_owned(),
            version_limit: None,
        }
    }
}

/// Result of `create_deployment`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CreateDeploymentOutcome {
    /// Created now.
    Created {
        /// Deployment name.
        name: String,
    },
    /// It was already there (a retried activity, or a rollback to an existing version).
    Exists {
        /// Deployment name.
        name: String,
    },
    /// The TWD now asks for another build (or is gone): nothing was created.
    Superseded,
    /// Cannot create (connection missing, version limit, ...).
    Blocked(Blocked),
    /// Not created: Temporal could not be read or the version limit is reached
    /// ([`BuildRequest::version_limit`]); the rollout's first observation decides and reports.
    Deferred {
        /// Versioned Deployments of other builds.
        others: u32,
    },
}

impl CreateDeploymentOutcome {
    /// Reason of the event that a Deployment was created.
    pub const CREATED_REASON: &'static str = "DeploymentCreated";

    /// The message of the event that `build_id`'s Deployment was created now (None: nothing
    /// was created).
    pub fn created_message(&self, build_id: &str) -> Option<String> {
        match self {
            Self::Created { name } => {
                Some(format!("Created Deployment {name} for build {build_id}"))
            }
            _ => None,
        }
    }
}

/// Scale a Deployment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScaleRequest {
    /// Namespace.
    pub namespace: String,
    /// Deployment name.
    pub name: String,
    /// Desired replicas.
    pub replicas: i32,
}

/// A Deployment by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeploymentRequest {
    /// Namespace.
    pub namespace: String,
    /// Deployment name.
    pub name: String,
}

/// Input of `wait_for_pollers`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitForPollersRequest {
    /// The TWD.
    pub twd: TwdRef,
    /// The build.
    pub build_id: String,
    /// Longest time to wait in this call (the workflow calls again while within its deadline).
    pub max_wait_ms: i64,
    /// Once the build is registered and Available, observe (as `observe` does) and return the
    /// observation, so the rollout decides from it without another activity. False in every
    /// request from before it existed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub observe_when_ready: bool,
}

/// Result of `wait_for_pollers`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PollerWaitOutcome {
    /// Temporal lists the build as a version of the worker deployment (in a state other than
    /// NotRegistered). Outcomes recorded before 2026-11-24 also carry the version's workflow task
    /// queues (`workflow_task_queues`), which nothing read; they are ignored when read back.
    pub registered: bool,
    /// The Deployment is Available.
    pub available: bool,
    /// Why not, in words (e.g. the Deployment's own failure message).
    pub problem: Option<String>,
    /// Connection-level failure that makes waiting pointless until fixed.
    pub blocked: Option<Blocked>,
    /// The observation made once ready, when the request asked for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observation: Option<Box<crate::model::Observation>>,
}

/// A routing change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum RoutingChange {
    /// Make a build Current (clears its ramp).
    SetCurrent {
        /// Build ID.
        build_id: String,
    },
    /// Ramp a build to a percentage.
    SetRamping {
        /// Build ID.
        build_id: String,
        /// Percentage 1..=99.
        percentage: u8,
    },
    /// Remove any ramping version.
    ClearRamp,
}

/// Input of `set_routing`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoutingRequest {
    /// The TWD.
    pub twd: TwdRef,
    /// What to change.
    pub change: RoutingChange,
    /// Conflict token from the observation the decision was made on (base64); the write fails
    /// if routing changed since.
    pub conflict_token: Option<String>,
}

/// Result of `set_routing`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RoutingOutcome {
    /// Applied.
    Applied,
    /// Routing changed since the observation; observe again.
    Conflict,
    /// Refused (manager identity held by someone else, pollers missing, ...).
    Blocked(Blocked),
}

/// Input of `delete_version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteVersionRequest {
    /// The TWD.
    pub twd: TwdRef,
    /// Build ID.
    pub build_id: String,
    /// Delete even if pinned workflows are open (deletion of the TWD only).
    pub skip_drainage: bool,
}

/// Result of `delete_version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeleteVersionOutcome {
    /// Deleted, or it was not there.
    Deleted,
    /// Not yet possible (pollers still seen, still draining); try again later.
    NotYet {
        /// Server message.
        message: String,
    },
}

/// Input of `run_gate`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateRequest {
    /// The TWD.
    pub twd: TwdRef,
    /// Build under test.
    pub build_id: String,
    /// Gate workflow type.
    pub workflow_type: String,
    /// Attempt number (1 first; a `retry` increments it and it becomes part of the IDs).
    pub attempt: u32,
    /// Longest time to wait for results in this call; the runs keep going and the next call
    /// attaches to them (IDs are deterministic).
    pub max_wait_ms: i64,
    /// A step gate (`spec.rollout.steps[step].gate`) instead of the rollout's gate
    /// (`spec.rollout.gate`). Absent in requests from before step gates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<StepGateRef>,
}

/// Which step gate to run. Its workflow IDs are
/// `gate/<deployment>/<build>/<task queue>/step<step>-<rollout_started_at>`: distinct per step
/// and per rollout of the build (a rollout retried after an abort runs its step gates again).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepGateRef {
    /// Step index.
    pub step: u32,
    /// Start of the rollout (workflow time, milliseconds since the epoch).
    pub rollout_started_at: UnixMillis,
}

/// One gate workflow execution.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateRun {
    /// Workflow ID.
    pub workflow_id: String,
    /// Run ID.
    pub run_id: String,
    /// Task queue.
    pub task_queue: String,
    /// `Running`, `Completed`, `Failed`, `Canceled`, `Terminated` or `TimedOut`.
    pub status: String,
}

/// Result of `run_gate`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateOutcome {
    /// Every gate run of this attempt.
    pub runs: Vec<GateRun>,
    /// All completed successfully.
    pub passed: bool,
    /// Could not run (input source missing, not a JSON object, connection problems).
    pub blocked: Option<Blocked>,
}

/// Input of `write_status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusRequest {
    /// The TWD.
    pub twd: TwdRef,
    /// The full status to write.
    pub status: TemporalWorkerDeploymentStatus,
}

/// Event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    /// Something happened as planned.
    Normal,
    /// Something failed.
    Warning,
}

/// Input of `emit_event`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventRequest {
    /// The TWD.
    pub twd: TwdRef,
    /// Normal or Warning.
    pub kind: EventKind,
    /// Event reason (CamelCase).
    pub reason: String,
    /// Human message.
    pub message: String,
}

/// Result of `cleanup_deleted`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CleanupOutcome {
    /// Everything removed, finalizers released.
    Done,
    /// Still waiting (e.g. versions with lingering pollers); try again later.
    Pending {
        /// What is left, or what blocks the cleanup and what to do about it.
        message: String,
        /// Why Temporal cannot be reached with the TWD's settings, when that is the cause
        /// (absent in histories recorded before it existed).
        #[serde(default)]
        blocked_by: Option<CleanupBlock>,
        /// What is being deleted with the TWD, when `blocked_by` is set and something is.
        #[serde(default)]
        teardown: Option<Teardown>,
    },
}

/// Why the deletion path cannot reach Temporal with the TWD's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CleanupBlock {
    /// The connection is missing.
    ConnectionGone,
    /// The connection's credential Secret is missing or unusable.
    SecretGone,
    /// Temporal is out of reach with the connection's settings (nothing listens at its address,
    /// the server is down, TLS fails).
    Unreachable,
    /// Temporal refused the connection's credentials.
    Refused,
}

/// What is being deleted along with a TWD whose cleanup cannot reach Temporal: nothing will
/// fix its settings any more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Teardown {
    /// The TWD's namespace.
    Namespace,
    /// The connection it uses.
    Connection,
}

/// Input of `release_without_temporal`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseRequest {
    /// The TWD.
    pub twd: TwdRef,
    /// Why Temporal could not be cleaned up (the last cleanup attempt's words).
    pub cause: String,
}

/// Input of `count_pinned_workflows`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinnedRequest {
    /// The TWD.
    pub twd: TwdRef,
    /// The version's build ID.
    pub build_id: String,
    /// Only these workflow types (empty: all).
    pub include_types: Vec<String>,
    /// Never these workflow types.
    pub exclude_types: Vec<String>,
}

/// Result of `count_pinned_workflows`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinnedCount {
    /// The visibility query used (readable in the history).
    pub query: String,
    /// Open pinned workflows on the version.
    pub open: u64,
    /// Start time of the oldest of them.
    pub oldest_started_at: Option<UnixMillis>,
}

/// What a drain step does to each matching workflow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DrainAction {
    /// Send the drain signal (no input); workflows that listen continue as new on the Current
    /// version.
    Signal {
        /// Signal name.
        name: String,
    },
    /// Request cancellation.
    Cancel,
    /// Terminate.
    Terminate,
    /// Pin to the Current version instead (a versioning override): for builds declared
    /// compatible.
    MoveToCurrent {
        /// The Current build ID to pin to.
        current_build_id: String,
    },
}

/// Input of `drain_version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainRequest {
    /// The TWD.
    pub twd: TwdRef,
    /// The retired version's build ID.
    pub build_id: String,
    /// What to do.
    pub action: DrainAction,
    /// Only these workflow types (empty: all).
    pub include_types: Vec<String>,
    /// Never these workflow types.
    pub exclude_types: Vec<String>,
    /// Operations per second.
    pub rate: u32,
    /// Count only.
    pub dry_run: bool,
}

/// Result of `drain_version`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainOutcome {
    /// The visibility query the batch ran over (readable in the history).
    pub query: String,
    /// Batch job ID (none in dry-run).
    pub job_id: Option<String>,
    /// Workflows the query matched when the step started.
    pub matched: u64,
    /// Operations that succeeded.
    pub succeeded: u64,
    /// Operations that failed (e.g. a workflow that closed meanwhile).
    pub failed: u64,
}

/// Result of `reassert_resources`: one entry per change made (each becomes a Normal event).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReassertOutcome {
    /// What was changed.
    pub changes: Vec<ResourceChange>,
}

/// Result of `recheck`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecheckOutcome {
    /// What the re-assertion changed (empty when it failed).
    pub reasserted: ReassertOutcome,
    /// The observation made after it.
    pub observation: Observation,
}

/// A change `reassert_resources` made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceChange {
    /// Event reason: `FinalizerRestored`, `ConnectionUpdated` or `TemplateUpdated`.
    pub reason: String,
    /// Event message naming the object and what changed.
    pub message: String,
}

/// Input of `run_analysis`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AnalysisRequest {
    /// The TWD.
    pub twd: TwdRef,
    /// The build under analysis (the ramping one).
    pub build_id: String,
    /// The Current build to compare with, if any.
    pub current_build_id: Option<String>,
    /// Start of the window: when the step's ramp was set (workflows started since then count).
    pub window_start: UnixMillis,
    /// Index of the step in force.
    pub step: u32,
    /// The checks to measure now.
    pub checks: Vec<crate::model::CheckView>,
    /// Workflow types that never count (the gate workflows).
    pub gate_types: Vec<String>,
}

/// Result of `run_analysis`: one measurement per requested check, in order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AnalysisResult {
    /// The measurements.
    pub measurements: Vec<Measurement>,
}

/// One measurement of one check.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    /// Check name.
    pub check: String,
    /// The verdict.
    pub verdict: Verdict,
    /// The measured value (failure percent of the new version, or the query's value).
    pub value: Option<f64>,
    /// The Current version's failure percent in the same window (Temporal, relative limit).
    pub baseline: Option<f64>,
    /// Judged workflows of the new version (Temporal).
    pub samples: Option<u64>,
    /// The measurement and its thresholds, in words.
    pub message: String,
    /// What was asked: visibility queries or the PromQL query as sent.
    pub queries: Vec<String>,
}

/// Verdict of a measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Verdict {
    /// Within the thresholds.
    Successful,
    /// Outside the thresholds.
    Failed,
    /// No verdict: no data, too few workflows, or the provider could not be read.
    Inconclusive,
    /// The provider refused the check itself (e.g. PromQL it cannot parse): a spec error.
    Invalid,
}

impl Verdict {
    /// The phase string shown in status.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Successful => "Successful",
            Self::Failed => "Failed",
            Self::Inconclusive => "Inconclusive",
            Self::Invalid => "Invalid",
        }
    }
}

/// Input of `read_backlog`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BacklogRequest {
    /// The TWD.
    pub twd: TwdRef,
    /// The versions to read.
    pub build_ids: Vec<String>,
}

/// Result of `read_backlog`: one entry per requested build, in order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BacklogReport {
    /// The versions' statistics.
    pub versions: Vec<VersionBacklog>,
}

/// Task-queue statistics of one version, over all its task queues.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VersionBacklog {
    /// Build ID.
    pub build_id: String,
    /// Tasks waiting in the version's task queues (sum).
    pub backlog: u64,
    /// Age of the oldest waiting task, milliseconds (largest over the queues).
    pub backlog_age_ms: i64,
    /// Tasks added per second (sum, Temporal's 30 s average).
    pub add_rate: f64,
    /// Tasks dispatched per second (sum).
    pub dispatch_rate: f64,
    /// Per task queue, for the history.
    pub task_queues: Vec<QueueBacklog>,
    /// Why the version could not be read (it then counts as unknown, not as idle).
    pub error: Option<String>,
}

/// Statistics of one task queue of a version.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QueueBacklog {
    /// Task queue name.
    pub name: String,
    /// `workflow` or `activity`.
    pub kind: String,
    /// Waiting tasks.
    pub backlog: u64,
    /// Age of the oldest, milliseconds.
    pub backlog_age_ms: i64,
    /// Added per second.
    pub add_rate: f64,
    /// Dispatched per second.
    pub dispatch_rate: f64,
}

activity!(
    /// Sends one notification to the webhook targets of the TWD's `spec.notifications` that want
    /// its event (or to those of `only`): reads each URL from its Secret, posts the payload once
    /// per target and reports each target's result (a failure is data, not an error, so the
    /// notification workflow decides what to retry).
    SendNotification, "send_notification", NotificationRequest => NotificationOutcome
);

/// One rollout event to tell the TWD's webhook targets about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notification {
    /// Unique per event and the same however often its sending is retried: derived from the
    /// workflow, run and activity that recorded the event ([`crate::plan::notify::idempotency_key`]).
    pub key: String,
    /// The event.
    pub event: twc_crds::notifications::NotificationEvent,
    /// Reason of the Kubernetes event it came with.
    pub reason: String,
    /// Its message.
    pub message: String,
    /// The workflow that recorded it (`rollout/...` or `twd/...`).
    pub workflow_id: String,
    /// When it was recorded (Unix milliseconds).
    pub at: UnixMillis,
}

/// Input of `send_notification`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotificationRequest {
    /// The TWD whose targets to tell.
    pub twd: TwdRef,
    /// What to tell.
    pub notification: Notification,
    /// Only these targets (a retry after some failed); `None`: every target that wants it.
    pub only: Option<Vec<String>>,
    /// Not these targets (they owe earlier notifications and get this one later, in order).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub except: Vec<String>,
}

/// Result of `send_notification`: one line per target tried.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotificationOutcome {
    /// Each target's result.
    pub results: Vec<TargetResult>,
}

/// How sending to one target went.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetResult {
    /// Target name.
    pub target: String,
    /// Why it failed; `None`: delivered (a 2xx answer).
    pub failure: Option<TargetFailure>,
}

/// A target that could not be told.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetFailure {
    /// Target name.
    pub target: String,
    /// Why, as a condition reason.
    pub reason: NotificationFailure,
    /// What happened and what to do.
    pub message: String,
}

/// Why a target could not be told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NotificationFailure {
    /// The Secret or key holding its URL is missing, or the URL is not a URL (not retried: the
    /// spec or the Secret must change).
    NotificationSecretNotFound,
    /// The webhook did not answer 2xx, or could not be reached (retried with backoff).
    NotificationDeliveryFailed,
}

impl NotificationFailure {
    /// The condition reason.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotificationSecretNotFound => "NotificationSecretNotFound",
            Self::NotificationDeliveryFailed => "NotificationDeliveryFailed",
        }
    }

    /// Whether sending again may help without a change of the spec or the Secret.
    pub fn retryable(self) -> bool {
        self == Self::NotificationDeliveryFailed
    }
}

/// One workflow run a replay check replays.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplayTarget {
    /// Workflow ID.
    pub workflow_id: String,
    /// Run ID.
    pub run_id: String,
}

/// What a replay check found (the replay Job's verdict).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ReplayVerdict {
    /// Every history replayed against the new build.
    Passed {
        /// Histories replayed.
        histories: u32,
        /// Histories per workflow type.
        workflow_types: std::collections::BTreeMap<String, u32>,
        /// How long the replay took, seconds (the container's own figure).
        seconds: f64,
    },
    /// A history did not replay: the build is non-deterministic for it.
    Nondeterministic {
        /// The first such run.
        workflow_id: String,
        /// Its run ID.
        run_id: String,
        /// Its workflow type.
        workflow_type: String,
        /// The replayer's own words (the first mismatching event).
        message: String,
        /// How many histories did not replay.
        count: u32,
    },
    /// The check could not decide (the Job could not run, crashed, timed out, or some history
    /// could not be checked): never a pass.
    Inconclusive {
        /// Why, with the Job's and pod's words.
        reason: String,
    },
}

/// Input of `run_replay_check`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayCheckRequest {
    /// The TWD.
    pub twd: TwdRef,
    /// The new build.
    pub build_id: String,
    /// Which run of the check (its Job's name carries it).
    pub attempt: u32,
    /// The Current build, whose workflows would move.
    pub current_build_id: Option<String>,
    /// Another build ramping now, whose AutoUpgrade workflows would move too.
    pub ramping_build_id: Option<String>,
    /// `spec.rollout.replayCheck`.
    pub check: crate::model::ReplayCheckView,
}
