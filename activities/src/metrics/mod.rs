//! The controller's Prometheus metrics: [`Metrics`], the families `twc run` exports on
//! `/metrics`, kept in a `prometheus-client` registry and rendered in the OpenMetrics text
//! format.
//!
//! Metrics are recorded where the controller does I/O: in the activities (which observe what
//! rollouts do, from the status and events the workflows ask them to write; see [`rollout`]), in
//! the Temporal and Kubernetes clients, and in the watcher. Workflow code never records metrics:
//! it is replayed, and a replay must not count anything twice.

pub mod rollout;

use std::fmt;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use prometheus_client::encoding::{EncodeLabelSet, text};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use twc_crds::worker_deployment::{RolloutStrategy, TemporalWorkerDeploymentStatus, VersionState};

pub use rollout::{COMPLETE_REASON, FAILURE_REASONS, Outcome, RolloutEvent, rollout_events};

/// Content type of [`Metrics::render`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Buckets of the rollout and time-to-Current histograms: 5 s to 1 day.
const ROLLOUT_BUCKETS: [f64; 12] = [
    5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0,
];
/// Buckets of `twc_wait_for_pollers_seconds`: 0.25 s to 10 min.
const POLLER_WAIT_BUCKETS: [f64; 12] = [
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];
/// Buckets of `twc_rollout_step_duration_seconds`: 1 s (the shortest pause) to 1 day.
const STEP_BUCKETS: [f64; 12] = [
    1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 21600.0, 86400.0,
];
/// Step indexes from this one on share the `step` label `"10+"` (a spec has at most 20 steps).
const STEP_LABELS: u32 = 10;

fn rollout_histogram() -> Histogram {
    Histogram::new(ROLLOUT_BUCKETS)
}

fn poller_wait_histogram() -> Histogram {
    Histogram::new(POLLER_WAIT_BUCKETS)
}

fn step_histogram() -> Histogram {
    Histogram::new(STEP_BUCKETS)
}

/// A family of histograms that share one bucket layout.
type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabels {
    version: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StrategyLabels {
    strategy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailureLabels {
    strategy: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    strategy: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepLabels {
    strategy: String,
    step: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TwdLabels {
    namespace: String,
    name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TemporalLabels {
    operation: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KubernetesLabels {
    verb: String,
    resource: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PollerWaitLabels {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SignalLabels {
    signal: String,
    outcome: String,
}

/// The metrics of `twc run`. Share one instance (in an `Arc`) between the activities, the
/// clients and the watcher; [`Metrics::render`] produces the `/metrics` page.
pub struct Metrics {
    registry: Registry,
    rollouts_started: Family<StrategyLabels, Counter>,
    rollouts_completed: Family<StrategyLabels, Counter>,
    rollouts_failed: Family<FailureLabels, Counter>,
    rollout_duration: Histograms<StrategyLabels>,
    rollout_outcome_duration: Histograms<OutcomeLabels>,
    rollout_step_duration: Histograms<StepLabels>,
    time_to_current: Histograms<StrategyLabels>,
    ramp_percentage: Family<TwdLabels, Gauge<f64, AtomicU64>>,
    versions: Family<TwdLabels, Gauge>,
    temporal_requests: Family<TemporalLabels, Counter>,
    read_grants: Counter,
    kubernetes_requests: Family<KubernetesLabels, Counter>,
    wait_for_pollers: Histograms<PollerWaitLabels>,
    watcher_signals: Family<SignalLabels, Counter>,
    replicas: Gauge,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Every family, with no series yet (except `twc_build_info`).
    ///
    /// Help texts carry no final period: the library adds one. Counters are registered without
    /// their `_total` suffix, which the OpenMetrics encoder appends to their samples.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let build_info = Family::<VersionLabels, Gauge>::default();
        registry.register(
            "twc_build_info",
            "Version of the running twc binary (always 1)",
            build_info.clone(),
        );
        let metrics = Self {
            rollouts_started: registered(
                &mut registry,
                "twc_rollouts_started",
                "Rollouts started (a rollout workflow first named in a worker deployment's status), by strategy",
                Family::default(),
            ),
            rollouts_completed: registered(
                &mut registry,
                "twc_rollouts_completed",
                "Rollouts that made their build Current (Ready reason became RolloutComplete), by strategy",
                Family::default(),
            ),
            rollouts_failed: registered(
                &mut registry,
                "twc_rollouts_failed",
                "Rollouts stopped without promotion (Ready reason became GateFailed, ProgressDeadlineExceeded, AnalysisFailed or Aborted), by strategy and reason",
                Family::default(),
            ),
            rollout_duration: registered(
                &mut registry,
                "twc_rollout_duration_seconds",
                "Time from a rollout's start (or retry) to its build becoming Current",
                Family::new_with_constructor(rollout_histogram),
            ),
            rollout_outcome_duration: registered(
                &mut registry,
                "twc_rollout_outcome_duration_seconds",
                "Time from a rollout's start (or retry, status rollout.startedAt) to its outcome (status rollout.updatedAt), by strategy and outcome: complete (build Current), failed (GateFailed, ProgressDeadlineExceeded, AnalysisFailed), aborted (by an operator), superseded (a newer build became the target first)",
                Family::new_with_constructor(rollout_histogram),
            ),
            rollout_step_duration: registered(
                &mut registry,
                "twc_rollout_step_duration_seconds",
                "Time a rollout held a ramp step before moving on to the next step or to Current (status targetVersion.rampLastModifiedAt to the next change), pauses included, by strategy and step index (0-based; 10 and later share 10+)",
                Family::new_with_constructor(step_histogram),
            ),
            time_to_current: registered(
                &mut registry,
                "twc_time_to_current_seconds",
                "Time from a new build's Deployment becoming Available (status targetVersion.healthySince, or the rollout's startedAt when later) to the build becoming Current, by strategy",
                Family::new_with_constructor(rollout_histogram),
            ),
            ramp_percentage: registered(
                &mut registry,
                "twc_ramp_percentage",
                "Share of new workflows routed to the worker deployment's target version, from its status: the ramp while Ramping, 100 once Current, 0 otherwise",
                Family::default(),
            ),
            versions: registered(
                &mut registry,
                "twc_versions",
                "Versions of a worker deployment (WorkerDeployment or TemporalWorkerDeployment of one name) in its status (target, current and deprecated versions with a Deployment)",
                Family::default(),
            ),
            temporal_requests: registered(
                &mut registry,
                "twc_temporal_requests",
                "Temporal API calls made by the controller (activities and watcher), by RPC and outcome (success or the gRPC status code)",
                Family::default(),
            ),
            read_grants: registered(
                &mut registry,
                "twc_temporal_read_grants",
                "Worker-deployment reads the read budget let through, counted as they are sent (twc_temporal_requests counts each once its answer arrives, so answers slower than others bunch up there)",
                Counter::default(),
            ),
            kubernetes_requests: registered(
                &mut registry,
                "twc_kubernetes_requests",
                "Kubernetes API requests made by the controller, by verb, resource and outcome (success, not_found, conflict, error)",
                Family::default(),
            ),
            wait_for_pollers: registered(
                &mut registry,
                "twc_wait_for_pollers_seconds",
                "Time each wait_for_pollers activity waited, by outcome (ready: pollers registered and Deployment available; not_ready: its bounded wait ended first)",
                Family::new_with_constructor(poller_wait_histogram),
            ),
            watcher_signals: registered(
                &mut registry,
                "twc_watcher_signals",
                "Signals the watcher sent to the engine's workflows, by signal (spec_changed, control to TWD workflows; deployment_changed to rollouts) and outcome (success, error)",
                Family::default(),
            ),
            replicas: registered(
                &mut registry,
                "twc_controller_replicas",
                "Live replicas of this installation (their Leases renewed in time), which divide each Temporal namespace's read budget between them",
                Gauge::default(),
            ),
            registry,
        };
        build_info
            .get_or_create(&VersionLabels {
                version: env!("CARGO_PKG_VERSION").to_owned(),
            })
            .set(1);
        metrics
    }

    /// `count` live replicas share the read budget.
    pub fn replicas(&self, count: u32) {
        self.replicas.set(i64::from(count));
    }

    /// A rollout began.
    pub fn rollout_started(&self, strategy: &str) {
        self.rollouts_started
            .get_or_create(&StrategyLabels::of(strategy))
            .inc();
    }

    /// A rollout made its build Current after `duration` (when known).
    pub fn rollout_completed(&self, strategy: &str, duration: Option<Duration>) {
        let labels = StrategyLabels::of(strategy);
        self.rollouts_completed.get_or_create(&labels).inc();
        if let Some(duration) = duration {
            self.rollout_duration
                .get_or_create(&labels)
                .observe(duration.as_secs_f64());
        }
    }

    /// A rollout stopped without promotion.
    pub fn rollout_failed(&self, strategy: &str, reason: &str) {
        self.rollouts_failed
            .get_or_create(&FailureLabels {
                strategy: strategy.to_owned(),
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// A rollout reached `outcome` `duration` after its start.
    pub fn rollout_ended(&self, strategy: &str, outcome: Outcome, duration: Duration) {
        self.rollout_outcome_duration
            .get_or_create(&OutcomeLabels {
                strategy: strategy.to_owned(),
                outcome: outcome.as_str().to_owned(),
            })
            .observe(duration.as_secs_f64());
    }

    /// A rollout moved past its ramp step `step` after holding it for `duration`.
    pub fn rollout_step_done(&self, strategy: &str, step: u32, duration: Duration) {
        let step = if step < STEP_LABELS {
            step.to_string()
        } else {
            format!("{STEP_LABELS}+")
        };
        self.rollout_step_duration
            .get_or_create(&StepLabels {
                strategy: strategy.to_owned(),
                step,
            })
            .observe(duration.as_secs_f64());
    }

    /// A new build became Current `duration` after its Deployment became Available.
    pub fn became_current(&self, strategy: &str, duration: Duration) {
        self.time_to_current
            .get_or_create(&StrategyLabels::of(strategy))
            .observe(duration.as_secs_f64());
    }

    /// Records what a status write says about the TWD's rollout, compared with the status it
    /// replaces (see [`rollout_events`]): a rollout start, its completion or failure, how long
    /// it took to reach its outcome, each ramp step it moved past, and the time its build took
    /// to become Current. The status is persisted, so a repeated write or another replica
    /// never counts the same transition twice.
    pub fn status_written(
        &self,
        strategy: &str,
        previous: Option<&TemporalWorkerDeploymentStatus>,
        status: &TemporalWorkerDeploymentStatus,
        now: Timestamp,
    ) {
        for event in rollout_events(previous, status, now) {
            match event {
                RolloutEvent::Started => self.rollout_started(strategy),
                RolloutEvent::Completed { duration } => self.rollout_completed(strategy, duration),
                RolloutEvent::Failed { reason } => self.rollout_failed(strategy, &reason),
                RolloutEvent::Ended { outcome, duration } => {
                    self.rollout_ended(strategy, outcome, duration);
                }
                RolloutEvent::StepDone { step, duration } => {
                    self.rollout_step_done(strategy, step, duration);
                }
                RolloutEvent::BecameCurrent { duration } => self.became_current(strategy, duration),
            }
        }
    }

    /// Sets the per-TWD gauges from a TWD's status as the watcher sees it.
    pub fn twd_status(
        &self,
        namespace: &str,
        name: &str,
        status: Option<&TemporalWorkerDeploymentStatus>,
    ) {
        let (ramp, versions) = status.map_or((0.0, 0), |s| (ramp_percentage(s), version_count(s)));
        let labels = TwdLabels::of(namespace, name);
        self.ramp_percentage.get_or_create(&labels).set(ramp);
        self.versions
            .get_or_create(&labels)
            .set(i64::try_from(versions).unwrap_or(i64::MAX));
    }

    /// Drops the per-TWD series of a TWD that is gone.
    pub fn forget_twd(&self, namespace: &str, name: &str) {
        let labels = TwdLabels::of(namespace, name);
        self.ramp_percentage.remove(&labels);
        self.versions.remove(&labels);
    }

    /// Counts a Temporal API call.
    pub fn temporal_request(&self, operation: &str, outcome: &str) {
        self.temporal_requests
            .get_or_create(&TemporalLabels {
                operation: operation.to_owned(),
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    /// Counts a worker-deployment read the read budget let through, as it is sent.
    pub fn read_granted(&self) {
        self.read_grants.inc();
    }

    /// Counts a Kubernetes API request.
    pub fn kubernetes_request(&self, verb: &str, resource: &str, outcome: &str) {
        self.kubernetes_requests
            .get_or_create(&KubernetesLabels {
                verb: verb.to_owned(),
                resource: resource.to_owned(),
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    /// Records how long a `wait_for_pollers` activity waited.
    pub fn waited_for_pollers(&self, waited: Duration, ready: bool) {
        let outcome = if ready { "ready" } else { "not_ready" };
        self.wait_for_pollers
            .get_or_create(&PollerWaitLabels {
                outcome: outcome.to_owned(),
            })
            .observe(waited.as_secs_f64());
    }

    /// Counts a signal the watcher sent (or failed to send).
    pub fn watcher_signal(&self, signal: &str, success: bool) {
        let outcome = if success { "success" } else { "error" };
        self.watcher_signals
            .get_or_create(&SignalLabels {
                signal: signal.to_owned(),
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    /// Every family in the OpenMetrics text format (served as [`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(8192);
        if let Err(e) = text::encode(&mut out, &self.registry) {
            // Writing to a String does not fail; a label encoder could, and then the page is
            // cut short rather than the endpoint failing.
            tracing::warn!(error = %e, "encoding metrics");
        }
        out
    }
}

/// Registers `metric` under `name` and returns it (a handle to the same series).
fn registered<M>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M
where
    M: prometheus_client::registry::Metric + Clone,
{
    registry.register(name, help, metric.clone());
    metric
}

impl StrategyLabels {
    fn of(strategy: &str) -> Self {
        Self {
            strategy: strategy.to_owned(),
        }
    }
}

impl TwdLabels {
    fn of(namespace: &str, name: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }
}

/// The `strategy` label of a TWD's rollout strategy.
pub fn strategy_label(strategy: &RolloutStrategy) -> &'static str {
    match strategy {
        RolloutStrategy::Manual => "Manual",
        RolloutStrategy::AllAtOnce => "AllAtOnce",
        RolloutStrategy::Progressive => "Progressive",
    }
}

/// Share of new workflows the status says go to the target version: its ramp while Ramping,
/// 100 once Current, otherwise 0.
pub fn ramp_percentage(status: &TemporalWorkerDeploymentStatus) -> f64 {
    let Some(target) = &status.target_version else {
        return 0.0;
    };
    match target.version.status {
        VersionState::Current => 100.0,
        VersionState::Ramping => f64::from(target.ramp_percentage.unwrap_or(0.0)),
        _ => 0.0,
    }
}

/// Distinct build IDs in the status: target, current and deprecated versions.
pub fn version_count(status: &TemporalWorkerDeploymentStatus) -> usize {
    let mut builds: Vec<&str> = status
        .target_version
        .iter()
        .map(|t| t.version.build_id.as_str())
        .chain(status.current_version.iter().map(|c| c.build_id.as_str()))
        .chain(
            status
                .deprecated_versions
                .iter()
                .map(|d| d.version.build_id.as_str()),
        )
        .filter(|b| !b.is_empty())
        .collect();
    builds.sort_unstable();
    builds.dedup();
    builds.len()
}

#[cfg(test)]
mod tests;
