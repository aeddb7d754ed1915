//! `TemporalWorkerDeployment`: one Temporal worker, rolled out version by version.
//!
//! Field names and defaults match the Go controller's resource so its manifests apply
//! unchanged; `rollout.paused`, `rollout.rollbackWindow` and `status.rollout` are ours.

use k8s_openapi::api::core::v1::{
    ConfigMapKeySelector, ObjectReference, PodTemplateSpec, SecretKeySelector,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::core::{Message, Rule};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Go-style duration such as `30s`, `5m` or `1h30m` (what CEL's `duration()` accepts).
pub const DURATION_PATTERN: &str = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$";

/// Desired state of a Temporal worker: its pods, how new versions are rolled out and how old
/// ones are retired.
// Several printer columns repeat `type_ = ...`; the lint mistakes them for duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "temporal.io",
    version = "v1alpha1",
    kind = "TemporalWorkerDeployment",
    plural = "temporalworkerdeployments",
    singular = "temporalworkerdeployment",
    shortname = "twd",
    shortname = "twdeployment",
    shortname = "tworkerdeployment",
    namespaced,
    status = "TemporalWorkerDeploymentStatus",
    derive = "PartialEq",
    doc = "A Temporal worker rolled out version by version with Worker Versioning.",
    printcolumn(name = "Current", type_ = "string", json_path = ".status.currentVersion.buildID"),
    printcolumn(name = "Target", type_ = "string", json_path = ".status.targetVersion.buildID"),
    printcolumn(name = "Ramp %", type_ = "number", json_path = ".status.targetVersion.rampPercentage"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.rollout.phase"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    selectable = ".spec.workerOptions.connectionRef.name",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    validation = Rule::new("size(self.metadata.name) <= 63").message("name cannot be more than 63 characters"),
    validation = Rule::new("!has(self.spec.autoscaling) || !has(self.spec.replicas)").message("spec.replicas and spec.autoscaling cannot both be set: autoscaling decides the replicas of every version"),
)]
#[serde(rename_all = "camelCase")]
pub struct TemporalWorkerDeploymentSpec {
    /// Pods per active version (target and current), or with `replicasMode: Shared` the total
    /// of the Current and Ramping versions. Unset: left to an autoscaler. The `/scale`
    /// subresource (`kubectl scale`, HPA, KEDA) sets it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// `PerVersion` (default, as the Go controller): every active version runs `replicas`
    /// pods. `Shared`: `replicas` is one total that the Current and Ramping versions share by
    /// ramp (for an HPA or KEDA driving `/scale`).
    #[serde(default, skip_serializing_if = "ReplicasMode::is_per_version")]
    pub replicas_mode: ReplicasMode,
    /// Pod template of the worker; each distinct template is a new version (build ID).
    pub template: PodTemplateSpec,
    /// Seconds a new pod must be ready before it counts as available.
    #[serde(default)]
    pub min_ready_seconds: i32,
    /// Seconds a new version may make no progress (more pods ready, its pollers registered)
    /// before it is registered and available; then the rollout stops with
    /// `ProgressDeadlineExceeded`. A version that was available once is not stopped by it.
    #[serde(default = "default_progress_deadline_seconds")]
    #[schemars(range(min = 1))]
    pub progress_deadline_seconds: i32,
    /// Where and as what the workers connect to Temporal.
    pub worker_options: WorkerOptions,
    /// How a new version receives traffic.
    pub rollout: RolloutSpec,
    /// How versions that lost their traffic are retired.
    #[serde(default)]
    pub sunset: SunsetSpec,
    /// Scales each version's Deployment from its own backlog in Temporal, by role (Current,
    /// Ramping, Draining). Exclusive with `replicas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<AutoscalingSpec>,
    /// Webhooks (generic JSON or Slack) told about the rollout's events, each URL in a Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notifications: Option<crate::notifications::NotificationSpec>,
}

/// `WorkerDeployment`, the Go controller's GA name (since its v1.7) of
/// `TemporalWorkerDeployment`: the same spec, status, defaults and rules. The only difference
/// is the default kind of `spec.workerOptions.connectionRef`: a `Connection`.
// Several printer columns repeat `type_ = ...`; the lint mistakes them for duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "temporal.io",
    version = "v1alpha1",
    kind = "WorkerDeployment",
    plural = "workerdeployments",
    singular = "workerdeployment",
    shortname = "wd",
    shortname = "wdeployment",
    namespaced,
    status = "TemporalWorkerDeploymentStatus",
    derive = "PartialEq",
    doc = "A Temporal worker rolled out version by version with Worker Versioning.",
    printcolumn(name = "Current", type_ = "string", json_path = ".status.currentVersion.buildID"),
    printcolumn(name = "Target", type_ = "string", json_path = ".status.targetVersion.buildID"),
    printcolumn(name = "Ramp %", type_ = "number", json_path = ".status.targetVersion.rampPercentage"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.rollout.phase"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    selectable = ".spec.workerOptions.connectionRef.name",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    validation = Rule::new("size(self.metadata.name) <= 63").message("name cannot be more than 63 characters"),
    validation = Rule::new("!has(self.spec.autoscaling) || !has(self.spec.replicas)").message("spec.replicas and spec.autoscaling cannot both be set: autoscaling decides the replicas of every version"),
)]
#[serde(transparent)]
pub struct WorkerDeploymentSpec(pub TemporalWorkerDeploymentSpec);

impl<'de> Deserialize<'de> for WorkerDeploymentSpec {
    /// Reads the spec, taking a `connectionRef` without `kind` as a `Connection`.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut value = serde_json::Value::deserialize(deserializer)?;
        if let Some(reference) = value
            .pointer_mut("/workerOptions/connectionRef")
            .and_then(|r| r.as_object_mut())
        {
            reference
                .entry("kind")
                .or_insert_with(|| ConnectionKind::Connection.as_str().into());
        }
        TemporalWorkerDeploymentSpec::deserialize(value)
            .map(Self)
            .map_err(serde::de::Error::custom)
    }
}

impl From<WorkerDeployment> for TemporalWorkerDeployment {
    /// The same object read as the older kind (its connection's kind made explicit).
    fn from(object: WorkerDeployment) -> Self {
        Self {
            metadata: object.metadata,
            spec: object.spec.0,
            status: object.status,
        }
    }
}

/// What `spec.replicas` counts.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReplicasMode {
    /// Pods of each active version.
    #[default]
    PerVersion,
    /// One total shared by the Current and Ramping versions, split by ramp.
    Shared,
}

impl ReplicasMode {
    /// Whether this is the default (not written out).
    pub fn is_per_version(&self) -> bool {
        *self == Self::PerVersion
    }
}

fn default_progress_deadline_seconds() -> i32 {
    600
}

/// Temporal connection settings of the worker.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WorkerOptions {
    /// The connection the workers use: a Connection (or TemporalConnection) in the same
    /// namespace, or a ClusterConnection (`kind: ClusterConnection`).
    pub connection_ref: ConnectionReference,
    /// Temporal namespace the workers poll.
    #[schemars(length(min = 1))]
    pub temporal_namespace: String,
    /// Overrides the computed build ID. Template edits then update that version in place.
    #[serde(
        rename = "unsafeCustomBuildID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(
        length(max = 63),
        regex(pattern = r"^[a-zA-Z0-9]([a-zA-Z0-9._-]*[a-zA-Z0-9])?$")
    )]
    pub unsafe_custom_build_id: Option<String>,
}

/// The connection the workers use: a TemporalConnection in the same namespace (the default),
/// or a cluster-scoped ClusterConnection.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ConnectionReference {
    /// Name of the connection.
    #[schemars(regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: String,
    /// `Connection` (the default of a WorkerDeployment) or `TemporalConnection` (the default
    /// of a TemporalWorkerDeployment), both in the same namespace, or `ClusterConnection`
    /// (cluster-scoped; its Secrets are read in the worker deployment's namespace).
    #[serde(default, skip_serializing_if = "ConnectionKind::is_namespaced")]
    pub kind: ConnectionKind,
}

impl ConnectionReference {
    /// A reference to the TemporalConnection `name` in the TWD's namespace.
    pub fn namespaced(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            kind: ConnectionKind::TemporalConnection,
        }
    }
}

/// Kind of the connection a worker deployment references.
#[derive(
    JsonSchema,
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
)]
pub enum ConnectionKind {
    /// A `TemporalConnection` in the worker deployment's namespace (the default of a
    /// `TemporalWorkerDeployment`).
    #[default]
    TemporalConnection,
    /// A `Connection` in the worker deployment's namespace (the default of a
    /// `WorkerDeployment`; the Go controller's GA name of `TemporalConnection`).
    Connection,
    /// A cluster-scoped `ClusterConnection`.
    ClusterConnection,
}

impl ConnectionKind {
    /// Whether this is the default, namespaced kind (not written out).
    pub fn is_namespaced(&self) -> bool {
        *self == Self::TemporalConnection
    }

    /// The kind's name, as in `kind:`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TemporalConnection => "TemporalConnection",
            Self::Connection => "Connection",
            Self::ClusterConnection => "ClusterConnection",
        }
    }

    /// Whether the connection lives in the worker deployment's namespace (either name of the
    /// namespaced kind).
    pub fn is_in_namespace(self) -> bool {
        self != Self::ClusterConnection
    }

    /// The plural resource name, as in API paths.
    pub fn plural(self) -> &'static str {
        match self {
            Self::TemporalConnection => "temporalconnections",
            Self::Connection => "connections",
            Self::ClusterConnection => "clusterconnections",
        }
    }

    /// What the Kubernetes client needs to address connections of this kind.
    pub fn api_resource(self) -> kube::core::ApiResource {
        kube::core::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk(crate::GROUP, crate::VERSION, self.as_str()),
            self.plural(),
        )
    }
}

impl std::fmt::Display for ConnectionKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Rollout strategy of new versions.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self.strategy != 'Progressive' || (has(self.steps) && size(self.steps) > 0)")
        .message("steps are required for Progressive rollout"),
    validation = Rule::new("self.strategy != 'Progressive' || !has(self.steps) || (self.steps.map(s, s.rampPercentage).isSorted() && self.steps.all(s, self.steps.filter(t, t.rampPercentage == s.rampPercentage).size() == 1))")
        .message("rampPercentage must increase between each step"),
    validation = Rule::new("!has(self.analysis) || self.strategy == 'Progressive'")
        .message("analysis needs the Progressive strategy: checks are measured while the new version ramps"),
)]
pub struct RolloutSpec {
    /// `Manual` never changes routing; `AllAtOnce` makes a new version Current once it is
    /// ready; `Progressive` ramps through `steps` first.
    pub strategy: RolloutStrategy,
    /// Ramp steps of a Progressive rollout, each held for its pause.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 20))]
    pub steps: Option<Vec<RolloutStep>>,
    /// Workflow that must succeed on the new version before it gets any traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<GateSpec>,
    /// Holds the rollout in flight where it is until set back to false.
    #[serde(default)]
    pub paused: bool,
    /// A version that was Current within this window is promoted again at once (rollback);
    /// `0s` disables it.
    #[serde(default = "default_rollback_window")]
    #[schemars(
        length(max = 32),
        regex(pattern = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$")
    )]
    pub rollback_window: String,
    /// Checks measured while a Progressive rollout ramps; a failed check aborts the rollout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis: Option<AnalysisSpec>,
    /// Before a new version's first routing change, replay real histories of workflows that
    /// would move to it (open AutoUpgrade ones, recent ones of the Current version) against it
    /// in a Job running its own image; a version that cannot replay them is aborted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_check: Option<ReplayCheckSpec>,
}

/// Histories replayed at most when `maxHistories` is not set.
pub const DEFAULT_REPLAY_MAX_HISTORIES: i32 = 50;
/// Longest history (events) replayed when `maxHistoryEvents` is not set.
pub const DEFAULT_REPLAY_MAX_HISTORY_EVENTS: i32 = 20_000;
/// How long a replay Job may run when `timeout` is not set.
pub const DEFAULT_REPLAY_TIMEOUT: &str = "10m";

/// The replay check of a new version: a Job of the version's pod template whose first
/// container runs `command`/`args` (the replay contract: README, "Replay check").
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.command) || has(self.args)")
        .message("replayCheck needs command or args: with neither, its Job would start the worker itself instead of the replay"),
)]
pub struct ReplayCheckSpec {
    /// Replaces the worker container's `command` in the Job (its `args` then come from `args`
    /// only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 32))]
    pub command: Option<Vec<String>>,
    /// Replaces the worker container's `args` in the Job (with the image's entrypoint when
    /// `command` is not set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub args: Option<Vec<String>>,
    /// Histories replayed at most; every workflow type found is represented as far as this
    /// allows.
    #[serde(default = "default_replay_max_histories")]
    #[schemars(range(min = 1, max = 500))]
    pub max_histories: i32,
    /// Histories longer than this many events are left out.
    #[serde(default = "default_replay_max_history_events")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub max_history_events: i32,
    /// How long the Job may run (`activeDeadlineSeconds`); past it the check is inconclusive.
    #[serde(default = "default_replay_timeout")]
    #[schemars(length(max = 32))]
    #[x_kube(
        validation = duration_format("timeout"),
        validation = Rule::new(format!("!self.matches('{}') || duration(self) >= duration('10s')", cel_duration_pattern()))
            .message("timeout must be at least 10s"),
    )]
    pub timeout: String,
    /// Record the verdict and proceed whatever it is.
    #[serde(default)]
    pub dry_run: bool,
}

fn default_replay_max_histories() -> i32 {
    DEFAULT_REPLAY_MAX_HISTORIES
}

fn default_replay_max_history_events() -> i32 {
    DEFAULT_REPLAY_MAX_HISTORY_EVENTS
}

fn default_replay_timeout() -> String {
    DEFAULT_REPLAY_TIMEOUT.to_owned()
}

fn default_rollback_window() -> String {
    "1h".to_owned()
}

/// How routing moves to a new version.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RolloutStrategy {
    /// Register the version; promotion is left to a person.
    Manual,
    /// Make the version Current as soon as it is ready.
    AllAtOnce,
    /// Ramp the version through `steps`, then make it Current.
    Progressive,
}

/// One ramp step of a Progressive rollout.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStep {
    /// Percentage of new workflows routed to the new version during this step.
    #[schemars(range(min = 1, max = 99))]
    pub ramp_percentage: i32,
    /// How long the step is held, from when its ramp was set (`30s`, `5m`, `1h30m`; at least `1s`).
    #[schemars(length(max = 32))]
    #[x_kube(
        validation = Rule::new(r"self.matches('^([0-9]+(\\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$')")
            .message("pauseDuration must be a duration such as 30s, 5m or 1h30m"),
        validation = Rule::new(r"!self.matches('^([0-9]+(\\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$') || duration(self) >= duration('1s')")
            .message("pauseDuration must be at least 1s"),
    )]
    pub pause_duration: String,
    /// Workflow run pinned to the new version once this step's ramp is set; the step does not
    /// advance before it succeeds, and its failure aborts the rollout (`AnalysisFailed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<GateSpec>,
}

/// Default time between two measurements of a check.
pub const DEFAULT_ANALYSIS_INTERVAL: &str = "30s";
/// Default number of inconclusive measurements in a row a check may have in a step.
pub const DEFAULT_INCONCLUSIVE_LIMIT: i32 = 3;
/// Default number of workflows a Temporal check needs before it judges.
pub const DEFAULT_MIN_SAMPLES: i32 = 10;
/// Placeholders a Prometheus query may contain (replaced before the query is sent).
pub const PROMQL_PLACEHOLDERS: [&str; 7] = [
    "{{buildID}}",
    "{{version}}",
    "{{currentBuildID}}",
    "{{deploymentName}}",
    "{{temporalNamespace}}",
    "{{namespace}}",
    "{{name}}",
];

/// Canary analysis of a Progressive rollout: every check is measured every `interval` while a
/// step is in force, from the moment its ramp was set. A step advances only when its pause is
/// over and every check's latest measurement passed. A failed check aborts the rollout.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self.checks.all(c, self.checks.filter(d, d.name == c.name).size() == 1)")
        .message("check names must be unique"),
)]
pub struct AnalysisSpec {
    /// The checks; each must pass for a step to advance.
    #[schemars(length(min = 1, max = 10))]
    pub checks: Vec<AnalysisCheck>,
}

/// One check: exactly one provider (`temporal` or `prometheus`) and its limits.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.temporal) != has(self.prometheus)")
        .message("a check needs exactly one provider: temporal or prometheus"),
)]
pub struct AnalysisCheck {
    /// Name shown in status, events and the history (`[a-z0-9-]`).
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    /// Time between two measurements, the first one `interval` after the step's ramp was set.
    #[serde(default = "default_analysis_interval")]
    #[schemars(length(max = 32))]
    #[x_kube(
        validation = duration_format("interval"),
        validation = Rule::new(format!("!self.matches('{}') || duration(self) >= duration('1s')", cel_duration_pattern()))
            .message("interval must be at least 1s"),
    )]
    pub interval: String,
    /// Failed measurements a step tolerates; one more aborts the rollout.
    #[serde(default)]
    #[schemars(range(min = 0, max = 100))]
    pub failure_limit: i32,
    /// Inconclusive measurements in a row (no data, too few workflows) a step tolerates while
    /// it waits for data; one more aborts the rollout.
    #[serde(default = "default_inconclusive_limit")]
    #[schemars(range(min = 0, max = 100))]
    pub inconclusive_limit: i32,
    /// Measure and record only: the result never holds or aborts the rollout.
    #[serde(default)]
    pub dry_run: bool,
    /// Built-in provider: how the workflows that ran on the new version fared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temporal: Option<TemporalCheck>,
    /// A PromQL query against a Prometheus server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<PrometheusCheck>,
}

fn default_analysis_interval() -> String {
    DEFAULT_ANALYSIS_INTERVAL.to_owned()
}

fn default_inconclusive_limit() -> i32 {
    DEFAULT_INCONCLUSIVE_LIMIT
}

fn default_min_samples() -> i32 {
    DEFAULT_MIN_SAMPLES
}

/// Of the workflows started on the new version since the step's ramp was set, the share that
/// failed, timed out or was terminated, or is stuck on a reported workflow-task problem (such
/// as non-determinism), out of those that closed or are stuck (Temporal visibility counts).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.maxFailurePercent) || has(self.maxIncreaseOverCurrent)")
        .message("a temporal check needs maxFailurePercent or maxIncreaseOverCurrent"),
)]
pub struct TemporalCheck {
    /// Highest failure share (percent) of the new version's workflows that passes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 100.0))]
    pub max_failure_percent: Option<f64>,
    /// Highest failure share (percent) above the Current version's share in the same window
    /// that passes (`2` means "no worse than Current plus 2 points").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 100.0))]
    pub max_increase_over_current: Option<f64>,
    /// Judged workflows of the new version needed for a verdict; fewer is inconclusive.
    #[serde(default = "default_min_samples")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub min_samples: i32,
    /// Which workflow types count (every type when unset; gate workflows never count).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_types: Option<WorkflowTypeFilter>,
}

/// A PromQL instant query whose single value must stay within bounds. The query may contain
/// `{{buildID}}`, `{{version}}`, `{{currentBuildID}}`, `{{deploymentName}}`,
/// `{{temporalNamespace}}`, `{{namespace}}` and `{{name}}`; an empty result is inconclusive.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.maxValue) || has(self.minValue)")
        .message("a prometheus check needs maxValue or minValue"),
    validation = Rule::new("!has(self.maxValue) || !has(self.minValue) || self.minValue <= self.maxValue")
        .message("minValue must not be above maxValue"),
    validation = Rule::new("!has(self.tls) || self.address.startsWith('https://')")
        .message("prometheus.tls applies to an https:// address only"),
)]
pub struct PrometheusCheck {
    /// Base URL of the Prometheus HTTP API, such as `http://prometheus.monitoring:9090`.
    #[schemars(length(min = 1, max = 2048), regex(pattern = r"^https?://[^\s]+$"))]
    pub address: String,
    /// The PromQL query; it must return one value (a scalar or a one-element vector).
    #[schemars(length(min = 1, max = 4096))]
    pub query: String,
    /// Highest value that passes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_value: Option<f64>,
    /// Lowest value that passes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_value: Option<f64>,
    /// Credentials sent with each query (managed Prometheus services and servers behind an
    /// authenticating proxy require them), read from a Secret in the TWD's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<PrometheusAuth>,
    /// TLS settings of an `https://` address whose certificate a private CA signed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<PrometheusTls>,
}

/// How queries authenticate: exactly one of a bearer token or basic auth.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.bearerTokenSecretRef) != has(self.basicAuthSecretRef)")
        .message("prometheus.auth needs exactly one of bearerTokenSecretRef or basicAuthSecretRef"),
)]
pub struct PrometheusAuth {
    /// A Secret key holding a token, sent as `Authorization: Bearer <token>` (surrounding
    /// whitespace dropped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_token_secret_ref: Option<SecretKeySelector>,
    /// A Secret with the keys `username` and `password` (type `kubernetes.io/basic-auth` or
    /// `Opaque`), sent as HTTP basic auth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basic_auth_secret_ref: Option<crate::connection::SecretReference>,
}

/// The credentials a [`PrometheusAuth`] names, as one choice.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PrometheusAuthRef<'a> {
    /// A token in a Secret key.
    BearerToken(&'a SecretKeySelector),
    /// A `kubernetes.io/basic-auth` Secret.
    BasicAuth(&'a crate::connection::SecretReference),
}

impl PrometheusAuth {
    /// The one credential source set; `None` when both or neither are (admission refuses
    /// both).
    pub fn secret_ref(&self) -> Option<PrometheusAuthRef<'_>> {
        match (&self.bearer_token_secret_ref, &self.basic_auth_secret_ref) {
            (Some(selector), None) => Some(PrometheusAuthRef::BearerToken(selector)),
            (None, Some(reference)) => Some(PrometheusAuthRef::BasicAuth(reference)),
            _ => None,
        }
    }
}

/// TLS settings of a Prometheus address.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PrometheusTls {
    /// Secret key holding the PEM CA bundle that signed the server's certificate; it replaces
    /// the system's CA certificates for this address.
    pub ca_secret_ref: SecretKeySelector,
}

/// A workflow run on the new version (pinned to it) that must succeed before promotion.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(self.input) || !has(self.inputFrom)")
        .message("only one of input or inputFrom may be set"),
)]
pub struct GateSpec {
    /// Workflow type to start, one per workflow task queue of the new version.
    #[schemars(length(min = 1))]
    pub workflow_type: String,
    /// JSON object passed as the gate workflow's first argument.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::crd_yaml::preserve_unknown_fields")]
    pub input: Option<serde_json::Value>,
    /// Reads the input from a ConfigMap or Secret key instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_from: Option<GateInputSource>,
}

/// Where gate input is read from: exactly one of the two keys.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.configMapKeyRef) != has(self.secretKeyRef)")
        .message("exactly one of configMapKeyRef or secretKeyRef must be set"),
)]
pub struct GateInputSource {
    /// A key of a ConfigMap in the TWD's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_key_ref: Option<ConfigMapKeySelector>,
    /// A key of a Secret in the TWD's namespace (never logged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key_ref: Option<SecretKeySelector>,
}

/// Delays applied to versions that no longer receive new work.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SunsetSpec {
    /// Time after a version is Drained before its Deployment is scaled to zero.
    #[serde(default = "default_scaledown_delay")]
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"))]
    pub scaledown_delay: String,
    /// Time after the scale-down before the Deployment and the Temporal version are deleted.
    #[serde(default = "default_delete_delay")]
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"))]
    pub delete_delay: String,
    /// What to do to workflows still pinned to a version after it stopped being Current or
    /// Ramping, so that it drains sooner. Absent: nothing; the version drains on its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<DrainSpec>,
}

impl Default for SunsetSpec {
    fn default() -> Self {
        Self {
            scaledown_delay: default_scaledown_delay(),
            delete_delay: default_delete_delay(),
            drain: None,
        }
    }
}

fn default_scaledown_delay() -> String {
    "1h".to_owned()
}

fn default_delete_delay() -> String {
    "24h".to_owned()
}

/// Default scale-up stabilization window.
pub const DEFAULT_SCALE_UP_WINDOW: &str = "15s";
/// Default scale-down stabilization window.
pub const DEFAULT_SCALE_DOWN_WINDOW: &str = "2m";

/// Backlog-driven replicas. The Current and Ramping versions share one total, from their
/// combined backlog, between `minReplicas` and `maxReplicas`; the Ramping version holds its ramp's
/// share of it (rounded up, at least one). A Draining version is scaled from its own backlog
/// between `draining.minReplicas` and `draining.maxReplicas`, so a pinned workflow that wakes up
/// on a version scaled to zero gets a worker.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self.minReplicas <= self.maxReplicas")
        .message("minReplicas must not be above maxReplicas"),
    validation = Rule::new("has(self.backlogPerReplica) != has(self.backlogAgeSeconds)")
        .message("set exactly one target: backlogPerReplica or backlogAgeSeconds"),
)]
pub struct AutoscalingSpec {
    /// Fewest replicas of the Current and Ramping versions together.
    #[serde(default = "default_min_replicas")]
    #[schemars(range(min = 1, max = 1000))]
    pub min_replicas: i32,
    /// Most replicas of the Current and Ramping versions together.
    #[schemars(range(min = 1, max = 1000))]
    pub max_replicas: i32,
    /// Target: waiting tasks per replica.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub backlog_per_replica: Option<i32>,
    /// Target: age of the oldest waiting task, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86_400))]
    pub backlog_age_seconds: Option<i32>,
    /// A higher replica count is applied only once every recommendation during this window
    /// asked for at least it (`0s`: at once).
    #[serde(default = "default_scale_up_window")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = duration_format("scaleUpWindow"))]
    pub scale_up_window: String,
    /// A lower replica count is applied only once no recommendation during this window asked
    /// for more.
    #[serde(default = "default_scale_down_window")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = duration_format("scaleDownWindow"))]
    pub scale_down_window: String,
    /// Bounds of each Draining version.
    #[serde(default)]
    pub draining: DrainingScaling,
}

fn default_min_replicas() -> i32 {
    1
}

fn default_scale_up_window() -> String {
    DEFAULT_SCALE_UP_WINDOW.to_owned()
}

fn default_scale_down_window() -> String {
    DEFAULT_SCALE_DOWN_WINDOW.to_owned()
}

/// Replicas of a Draining version (out of routing, pinned workflows still open).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self.minReplicas <= self.maxReplicas")
        .message("draining.minReplicas must not be above draining.maxReplicas"),
)]
pub struct DrainingScaling {
    /// Fewest replicas; `0` lets an idle Draining version scale to zero (it is revived when
    /// work for it appears).
    #[serde(default)]
    #[schemars(range(min = 0, max = 1000))]
    pub min_replicas: i32,
    /// Most replicas.
    #[serde(default = "default_min_replicas")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_replicas: i32,
}

impl Default for DrainingScaling {
    fn default() -> Self {
        Self {
            min_replicas: 0,
            max_replicas: 1,
        }
    }
}

/// Signal name of the drain policy when `signalName` is not set; workers listen for it.
pub const DEFAULT_DRAIN_SIGNAL: &str = "twc-drain";
/// Operations per second of each drain batch when `rate` is not set.
pub const DEFAULT_DRAIN_RATE: i32 = 50;
/// Highest `rate` the schema accepts.
pub const MAX_DRAIN_RATE: i32 = 1000;

/// Actions on the workflows still open and pinned to a retired version (one that stopped being
/// Current or Ramping). Each delay counts from that moment; each action is taken once.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.signalAfter) || has(self.cancelAfter) || has(self.terminateAfter) || has(self.moveToCurrent)")
        .message("drain must set at least one of signalAfter, cancelAfter, terminateAfter or moveToCurrent"),
    validation = not_shorter_than("cancelAfter", "signalAfter"),
    validation = not_shorter_than("terminateAfter", "cancelAfter"),
    validation = not_shorter_than("terminateAfter", "signalAfter"),
)]
pub struct DrainSpec {
    /// Time after retirement at which workflows still open get the `signalName` signal (they
    /// are expected to continue-as-new onto the Current version). Unset: no signal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = duration_format("signalAfter"))]
    pub signal_after: Option<String>,
    /// Name of the signal sent at `signalAfter`, with no arguments.
    #[serde(default = "default_drain_signal_name")]
    #[schemars(length(min = 1, max = 255))]
    pub signal_name: String,
    /// Time after retirement at which workflows still open are cancelled. Unset: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = duration_format("cancelAfter"))]
    pub cancel_after: Option<String>,
    /// Time after retirement at which workflows still open are terminated. Unset: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = duration_format("terminateAfter"))]
    pub terminate_after: Option<String>,
    /// Which workflow types the drain acts on (every type when unset). Applies to every action,
    /// `moveToCurrent` included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_types: Option<WorkflowTypeFilter>,
    /// Operations per second of each batch operation (signal, cancel, terminate, move).
    #[serde(default = "default_drain_rate")]
    #[schemars(range(min = 1, max = MAX_DRAIN_RATE))]
    pub rate: i32,
    /// Count the workflows each action would touch and report them, acting on none.
    #[serde(default)]
    pub dry_run: bool,
    /// Move the workflows pinned to the listed builds to the Current version as soon as those
    /// builds are retired. Only for builds whose workflows are compatible with later builds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub move_to_current: Option<MoveToCurrent>,
}

fn default_drain_signal_name() -> String {
    DEFAULT_DRAIN_SIGNAL.to_owned()
}

fn default_drain_rate() -> i32 {
    DEFAULT_DRAIN_RATE
}

/// CEL form of [`DURATION_PATTERN`] inside a single-quoted CEL string.
fn cel_duration_pattern() -> String {
    DURATION_PATTERN.replace('\\', "\\\\")
}

/// Rule on a duration field: it parses as a Go-style duration. The pattern has no sign, so a
/// negative duration is rejected too.
fn duration_format(field: &str) -> Rule {
    Rule::new(format!("self.matches('{}')", cel_duration_pattern())).message(Message::Message(
        format!("{field} must be a non-negative duration such as 30s, 5m or 1h30m"),
    ))
}

/// Rule on the drain policy: when both durations are set and parse, `later` is at least `earlier`.
fn not_shorter_than(later: &str, earlier: &str) -> Rule {
    let pattern = cel_duration_pattern();
    Rule::new(format!(
        "!has(self.{later}) || !has(self.{earlier}) \
         || !self.{later}.matches('{pattern}') || !self.{earlier}.matches('{pattern}') \
         || duration(self.{later}) >= duration(self.{earlier})"
    ))
    .message(Message::Message(format!(
        "{later} must not be shorter than {earlier}"
    )))
    .field_path(format!(".{later}"))
}

/// Workflow types a drain acts on: those in `include` (all when empty) minus those in `exclude`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(self.include) || !has(self.exclude) || !self.include.exists(t, t in self.exclude)")
        .message("a workflow type cannot be both included and excluded"),
)]
pub struct WorkflowTypeFilter {
    /// Only workflows of these types; empty or unset: every type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100), inner(length(min = 1, max = 255)))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub include: Vec<String>,
    /// Never workflows of these types, even when included.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100), inner(length(min = 1, max = 255)))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub exclude: Vec<String>,
}

/// Builds whose pinned workflows may run on any later build.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct MoveToCurrent {
    /// Build IDs declared compatible with later builds: once one is retired, its pinned
    /// workflows get a versioning override pinning them to the Current version.
    #[serde(rename = "buildIDs")]
    #[schemars(
        length(min = 1, max = 100),
        inner(
            length(max = 63),
            regex(pattern = r"^[a-zA-Z0-9]([a-zA-Z0-9._-]*[a-zA-Z0-9])?$")
        )
    )]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub build_ids: Vec<String>,
}

/// Observed state, written only by the controller (status subresource).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TemporalWorkerDeploymentStatus {
    /// The version computed from the current spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_version: Option<TargetVersion>,
    /// The version Temporal routes new work to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_version: Option<VersionStatus>,
    /// Versions with a Deployment that are neither target nor current, sorted by build ID.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deprecated_versions: Vec<DeprecatedVersion>,
    /// Conflict token of the last routing read (base64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version_conflict_token: Option<String>,
    /// Identity that last changed the routing config in Temporal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_modifier_identity: Option<String>,
    /// Identity allowed to change the routing config in Temporal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manager_identity: Option<String>,
    /// Number of versions Temporal knows for this worker deployment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub version_count: Option<i32>,
    /// `Ready` and `Progressing`, with reasons usable by kubectl wait, Helm, Flux and Argo CD.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".to_owned()]))]
    pub conditions: Vec<Condition>,
    /// Generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The rollout workflow driving this resource, for jumping to the Temporal Web UI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutStatus>,
    /// Pods of the target and Current versions (the `/scale` subresource's status replicas).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Label selector of every pod of this worker, all versions (for `/scale`: HPA, KEDA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// The build ID of a version another controller made (the Go Temporal Worker Controller)
    /// whose Deployment runs exactly the current pod template, taken over instead of computing a
    /// new one; it lapses when the template changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adopted_build: Option<AdoptedBuild>,
}

/// A build ID taken over for a pod template.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AdoptedBuild {
    /// The build ID, as the version's Deployment is labelled.
    #[serde(rename = "buildID")]
    pub build_id: String,
    /// SHA-256 of the pod template it stands for (the `temporal.io/pod-template-spec-hash` of
    /// this controller).
    pub template_hash: String,
}

/// Lifecycle state of a version, from Temporal's point of view.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VersionState {
    /// No worker of this build has polled yet.
    NotRegistered,
    /// Registered, not in routing.
    Inactive,
    /// Receives a percentage of new workflows.
    Ramping,
    /// Receives all other new workflows.
    Current,
    /// Out of routing, pinned workflows still open.
    Draining,
    /// Out of routing, no open pinned workflows.
    Drained,
}

/// Common fields of every version entry.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VersionStatus {
    /// Build ID of the version.
    #[serde(rename = "buildID")]
    pub build_id: String,
    /// Temporal state of the version.
    pub status: VersionState,
    /// When the version's Deployment last became Available.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy_since: Option<Time>,
    /// The version's Deployment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment: Option<ObjectReference>,
    /// Workflow task queues the version polls (target only, while it is not current).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub task_queues: Vec<TaskQueue>,
}

/// A task queue name.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct TaskQueue {
    /// Task queue name.
    pub name: String,
}

/// The version the spec asks for, with its rollout progress.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TargetVersion {
    #[serde(flatten)]
    #[allow(missing_docs)]
    pub version: VersionStatus,
    /// Gate workflow runs on this version.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub test_workflows: Vec<GateWorkflowStatus>,
    /// Percentage of new workflows routed here while ramping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 100.0))]
    pub ramp_percentage: Option<f32>,
    /// When this version became the ramping version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ramping_since: Option<Time>,
    /// When the ramp percentage last changed (the clock of Progressive steps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ramp_last_modified_at: Option<Time>,
}

/// A gate workflow execution.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct GateWorkflowStatus {
    /// Workflow ID.
    #[serde(rename = "workflowID")]
    pub workflow_id: String,
    /// Run ID.
    #[serde(rename = "runID")]
    pub run_id: String,
    /// `Running`, `Completed`, `Failed`, `Canceled`, `Terminated` or `TimedOut`.
    pub status: String,
    /// Task queue it ran on.
    #[serde(rename = "taskQueue")]
    pub task_queue: String,
}

/// A version that is neither target nor current, on its way out.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DeprecatedVersion {
    #[serde(flatten)]
    #[allow(missing_docs)]
    pub version: VersionStatus,
    /// When Temporal reported the version Drained.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drained_since: Option<Time>,
    /// Drained and scaled to zero: may be deleted.
    #[serde(default)]
    pub eligible_for_deletion: bool,
    /// Open workflows pinned to this version, as last counted (with a drain policy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_pinned_workflows: Option<i64>,
    /// Start time of the oldest of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_pinned_workflow_started_at: Option<Time>,
    /// The next step of its drain: `moveToCurrent`, `signal`, `cancel` or `terminate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_drain_action: Option<String>,
    /// When that step falls due.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_drain_action_at: Option<Time>,
    /// Drain steps done since the version was retired.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drain_steps_done: Vec<String>,
}

/// Where the rollout workflow is, for people and tools.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    /// Workflow ID of the rollout in the engine namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_id: Option<String>,
    /// Run ID of that workflow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// `Rolling`, `Paused`, `Complete` or `Blocked`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<RolloutPhase>,
    /// Index of the Progressive step in force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<i32>,
    /// Whether the rollout is held.
    #[serde(default)]
    pub paused: bool,
    /// What the rollout is doing or waiting for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When this rollout started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When this status was last written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<Time>,
    /// Canary analysis of the step in force (or of the step that ended the rollout).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub analysis: Vec<AnalysisCheckStatus>,
}

/// Where one analysis check stands in the step in force.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AnalysisCheckStatus {
    /// Check name (`gate` for the step's gate workflow).
    pub name: String,
    /// Index of the step the counts belong to.
    pub step: i32,
    /// `Successful`, `Failed`, `Inconclusive` or `Running` (step gate), of the last measurement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The last measurement, in words (measured values and thresholds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Measurements in this step that passed.
    #[serde(default)]
    pub successful: i32,
    /// Measurements in this step that failed.
    #[serde(default)]
    pub failed: i32,
    /// Inconclusive measurements in this step (in a row at the last one).
    #[serde(default)]
    pub inconclusive: i32,
    /// Recorded only (`dryRun`).
    #[serde(default)]
    pub dry_run: bool,
    /// When it was last measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_at: Option<Time>,
}

/// Coarse phase of a rollout (the Phase printer column).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RolloutPhase {
    /// Moving toward the target version.
    Rolling,
    /// Held by an operator or `spec.rollout.paused`.
    Paused,
    /// The target version is Current.
    Complete,
    /// Stopped by an error that needs attention.
    Blocked,
    /// An operator aborted the rollout of the target (`retry` rolls it out again).
    Aborted,
}

/// Small specs for unit tests of this and other crates.
#[doc(hidden)]
pub mod test_support {
    use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};

    use super::*;

    /// A minimal valid spec whose only container runs `image`.
    pub fn spec_with_image(image: &str) -> TemporalWorkerDeploymentSpec {
        TemporalWorkerDeploymentSpec {
            replicas: Some(1),
            replicas_mode: ReplicasMode::PerVersion,
            template: PodTemplateSpec {
                metadata: None,
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "worker".into(),
                        image: (!image.is_empty()).then(|| image.to_owned()),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
            },
            min_ready_seconds: 0,
            progress_deadline_seconds: 600,
            worker_options: WorkerOptions {
                connection_ref: ConnectionReference::namespaced("dev"),
                temporal_namespace: "default".into(),
                unsafe_custom_build_id: None,
            },
            rollout: RolloutSpec {
                strategy: RolloutStrategy::AllAtOnce,
                steps: None,
                gate: None,
                paused: false,
                rollback_window: "1h".into(),
                analysis: None,
                replay_check: None,
            },
            sunset: SunsetSpec::default(),
            autoscaling: None,
            notifications: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use kube::CustomResourceExt;
    use serde_json::json;

    use super::*;

    #[test]
    fn prometheus_auth_names_exactly_one_secret_or_none() {
        // (auth as written, the Secret it names: Some((kind, name)) or None)
        let cases = [
            (
                json!({ "bearerTokenSecretRef": { "name": "grafana", "key": "token" } }),
                Some(("bearer", "grafana")),
            ),
            (
                json!({ "basicAuthSecretRef": { "name": "prom-auth" } }),
                Some(("basic", "prom-auth")),
            ),
            (
                json!({ "bearerTokenSecretRef": { "name": "t", "key": "token" },
                        "basicAuthSecretRef": { "name": "b" } }),
                None,
            ),
            (json!({}), None),
        ];
        for (auth, expected) in cases {
            let parsed: PrometheusAuth =
                serde_json::from_value(auth.clone()).unwrap_or_else(|e| panic!("{auth}: {e}"));
            let named = parsed.secret_ref().map(|r| match r {
                PrometheusAuthRef::BearerToken(s) => ("bearer", s.name.as_str()),
                PrometheusAuthRef::BasicAuth(s) => ("basic", s.name.as_str()),
            });
            assert_eq!(named, expected, "{auth}");
        }
    }

    #[test]
    fn the_crd_refuses_ambiguous_prometheus_auth_and_tls_on_plain_http() {
        let crd = serde_json::to_string(&TemporalWorkerDeployment::crd()).unwrap_or_default();
        for rule in [
            "has(self.bearerTokenSecretRef) != has(self.basicAuthSecretRef)",
            "prometheus.auth needs exactly one of bearerTokenSecretRef or basicAuthSecretRef",
            "!has(self.tls) || self.address.startsWith('https://')",
            "prometheus.tls applies to an https:// address only",
        ] {
            assert!(crd.contains(rule), "{rule}");
        }
    }
}
