//! The controller's Prometheus metrics: a small registry of labeled counters, gauges and
//! histograms rendered in the Prometheus text format (version 0.0.4), and [`Metrics`], the
//! families `twc run` exports on `/metrics`.
//!
//! Metrics are recorded where the controller does I/O: in the activities (which observe what
//! rollouts do, from the status and events the workflows ask them to write), in the Temporal and
//! Kubernetes clients, and in the watcher. Workflow code never records metrics: it is replayed,
//! and a replay must not count anything twice.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use twc_crds::worker_deployment::{RolloutStrategy, TemporalWorkerDeploymentStatus, VersionState};

/// Content type of [`Metrics::render`]'s output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `Ready` reasons of a rollout stopped without promotion, counted as failures.
pub const FAILURE_REASONS: [&str; 3] = ["GateFailed", "ProgressDeadlineExceeded", "Aborted"];
/// `Ready` reason of a rollout that made its build Current.
pub const COMPLETE_REASON: &str = "RolloutComplete";

/// Buckets of `twc_rollout_duration_seconds`: 5 s to 1 day.
const ROLLOUT_BUCKETS: &[f64] = &[
    5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0,
];
/// Buckets of `twc_wait_for_pollers_seconds`: 0.25 s to 10 min.
const POLLER_WAIT_BUCKETS: &[f64] = &[
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

/// A metric's value in one series.
trait Value: Default {
    /// `counter`, `gauge` or `histogram`.
    const KIND: &'static str;
    /// Writes the series' lines; `labels` is the rendered label set without braces.
    fn render(&self, name: &str, labels: &str, out: &mut String);
}

/// A monotonically increasing count.
#[derive(Debug, Default)]
struct Counter(u64);

impl Value for Counter {
    const KIND: &'static str = "counter";

    fn render(&self, name: &str, labels: &str, out: &mut String) {
        let _ = writeln!(out, "{name}{} {}", braces(labels), self.0);
    }
}

/// A value that goes up and down.
#[derive(Debug, Default)]
struct Gauge(f64);

impl Value for Gauge {
    const KIND: &'static str = "gauge";

    fn render(&self, name: &str, labels: &str, out: &mut String) {
        let _ = writeln!(out, "{name}{} {}", braces(labels), number(self.0));
    }
}

/// Observations counted in cumulative buckets, with their sum and count.
#[derive(Debug, Default)]
struct Histogram {
    bounds: &'static [f64],
    /// Per bucket (not cumulative); one more than `bounds` for `+Inf`.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, value: f64) {
        if self.counts.len() != self.bounds.len() + 1 {
            self.counts = vec![0; self.bounds.len() + 1];
        }
        let index = self
            .bounds
            .iter()
            .position(|bound| value <= *bound)
            .unwrap_or(self.bounds.len());
        self.counts[index] += 1;
        self.sum += value;
        self.count += 1;
    }
}

impl Value for Histogram {
    const KIND: &'static str = "histogram";

    fn render(&self, name: &str, labels: &str, out: &mut String) {
        let separator = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (i, bound) in self.bounds.iter().enumerate() {
            cumulative += self.counts.get(i).copied().unwrap_or(0);
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{separator}le=\"{}\"}} {cumulative}",
                number(*bound)
            );
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels}{separator}le=\"+Inf\"}} {}",
            self.count
        );
        let _ = writeln!(out, "{name}_sum{} {}", braces(labels), number(self.sum));
        let _ = writeln!(out, "{name}_count{} {}", braces(labels), self.count);
    }
}

/// One metric: its name, help, label names and a series per label value tuple.
struct Family<V> {
    name: &'static str,
    help: &'static str,
    labels: &'static [&'static str],
    /// Histogram buckets (histograms only).
    bounds: &'static [f64],
    series: Mutex<BTreeMap<Vec<String>, V>>,
}

impl<V: Value> Family<V> {
    fn new(name: &'static str, help: &'static str, labels: &'static [&'static str]) -> Self {
        Self {
            name,
            help,
            labels,
            bounds: &[],
            series: Mutex::new(BTreeMap::new()),
        }
    }

    /// Runs `f` on the series of `values` (created at its zero value if new). Values beyond the
    /// family's label names are ignored; missing ones are empty.
    fn with(&self, values: &[&str], f: impl FnOnce(&mut V)) {
        let key: Vec<String> = (0..self.labels.len())
            .map(|i| values.get(i).copied().unwrap_or_default().to_owned())
            .collect();
        let mut series = self.series.lock().unwrap_or_else(PoisonError::into_inner);
        f(series.entry(key).or_default());
    }

    /// Drops every series whose label `label` is `value` for each given pair.
    fn remove_matching(&self, matches: &[(&str, &str)]) {
        let positions: Vec<(usize, &str)> = matches
            .iter()
            .filter_map(|(label, value)| {
                let index = self.labels.iter().position(|l| l == label)?;
                Some((index, *value))
            })
            .collect();
        if positions.len() != matches.len() {
            return;
        }
        let mut series = self.series.lock().unwrap_or_else(PoisonError::into_inner);
        series.retain(|key, _| !positions.iter().all(|(i, v)| key[*i] == *v));
    }

    fn render(&self, out: &mut String) {
        let _ = writeln!(out, "# HELP {} {}", self.name, escape_help(self.help));
        let _ = writeln!(out, "# TYPE {} {}", self.name, V::KIND);
        let series = self.series.lock().unwrap_or_else(PoisonError::into_inner);
        for (values, value) in series.iter() {
            let labels = self
                .labels
                .iter()
                .zip(values)
                .map(|(name, value)| format!("{name}=\"{}\"", escape_label(value)))
                .collect::<Vec<_>>()
                .join(",");
            value.render(self.name, &labels, out);
        }
    }
}

impl Family<Histogram> {
    fn histogram(
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
        bounds: &'static [f64],
    ) -> Self {
        Self {
            bounds,
            ..Self::new(name, help, labels)
        }
    }

    fn observe(&self, values: &[&str], value: f64) {
        let bounds = self.bounds;
        self.with(values, |h| {
            h.bounds = bounds;
            h.observe(value);
        });
    }
}

/// The metrics of `twc run`. Share one instance (in an `Arc`) between the activities, the
/// clients and the watcher; [`Metrics::render`] produces the `/metrics` page.
pub struct Metrics {
    build_info: Family<Gauge>,
    rollouts_started: Family<Counter>,
    rollouts_completed: Family<Counter>,
    rollouts_failed: Family<Counter>,
    rollout_duration: Family<Histogram>,
    ramp_percentage: Family<Gauge>,
    versions: Family<Gauge>,
    temporal_requests: Family<Counter>,
    kubernetes_requests: Family<Counter>,
    wait_for_pollers: Family<Histogram>,
    watcher_signals: Family<Counter>,
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
    pub fn new() -> Self {
        let metrics = Self {
            build_info: Family::new(
                "twc_build_info",
                "Version of the running twc binary (always 1).",
                &["version"],
            ),
            rollouts_started: Family::new(
                "twc_rollouts_started_total",
                "Rollouts started (a rollout workflow first named in a TWD's status), by strategy.",
                &["strategy"],
            ),
            rollouts_completed: Family::new(
                "twc_rollouts_completed_total",
                "Rollouts that made their build Current (Ready reason became RolloutComplete), by strategy.",
                &["strategy"],
            ),
            rollouts_failed: Family::new(
                "twc_rollouts_failed_total",
                "Rollouts stopped without promotion (Ready reason became GateFailed, ProgressDeadlineExceeded or Aborted), by strategy and reason.",
                &["strategy", "reason"],
            ),
            rollout_duration: Family::histogram(
                "twc_rollout_duration_seconds",
                "Time from a rollout's start (or retry) to its build becoming Current.",
                &["strategy"],
                ROLLOUT_BUCKETS,
            ),
            ramp_percentage: Family::new(
                "twc_ramp_percentage",
                "Share of new workflows routed to the TWD's target version, from its status: the ramp while Ramping, 100 once Current, 0 otherwise.",
                &["namespace", "name"],
            ),
            versions: Family::new(
                "twc_versions",
                "Versions of a TWD in its status (target, current and deprecated versions with a Deployment).",
                &["namespace", "name"],
            ),
            temporal_requests: Family::new(
                "twc_temporal_requests_total",
                "Temporal API calls made by the controller (activities and watcher), by RPC and outcome (success or the gRPC status code).",
                &["operation", "outcome"],
            ),
            kubernetes_requests: Family::new(
                "twc_kubernetes_requests_total",
                "Kubernetes API requests made by the controller, by verb, resource and outcome (success, not_found, conflict, error).",
                &["verb", "resource", "outcome"],
            ),
            wait_for_pollers: Family::histogram(
                "twc_wait_for_pollers_seconds",
                "Time each wait_for_pollers activity waited, by outcome (ready: pollers registered and Deployment available; not_ready: its bounded wait ended first).",
                &["outcome"],
                POLLER_WAIT_BUCKETS,
            ),
            watcher_signals: Family::new(
                "twc_watcher_signals_total",
                "Signals the watcher sent to TWD workflows, by signal (spec_changed, control) and outcome (success, error).",
                &["signal", "outcome"],
            ),
        };
        metrics
            .build_info
            .with(&[env!("CARGO_PKG_VERSION")], |g| g.0 = 1.0);
        metrics
    }

    /// A rollout began.
    pub fn rollout_started(&self, strategy: &str) {
        self.rollouts_started.with(&[strategy], |c| c.0 += 1);
    }

    /// A rollout made its build Current after `duration` (when known).
    pub fn rollout_completed(&self, strategy: &str, duration: Option<Duration>) {
        self.rollouts_completed.with(&[strategy], |c| c.0 += 1);
        if let Some(duration) = duration {
            self.rollout_duration
                .observe(&[strategy], duration.as_secs_f64());
        }
    }

    /// A rollout stopped without promotion.
    pub fn rollout_failed(&self, strategy: &str, reason: &str) {
        self.rollouts_failed.with(&[strategy, reason], |c| c.0 += 1);
    }

    /// Counts what a status write says about the TWD's rollout, compared with the status it
    /// replaces: a rollout workflow the old status did not name has started; a `Ready` reason
    /// that became `RolloutComplete` completed it (its duration measured from the status'
    /// `rollout.startedAt` to `now`); one that became `GateFailed`, `ProgressDeadlineExceeded`
    /// or `Aborted` failed it. The status is persisted, so a repeated write or another replica
    /// never counts the same transition twice.
    pub fn status_written(
        &self,
        strategy: &str,
        previous: Option<&TemporalWorkerDeploymentStatus>,
        status: &TemporalWorkerDeploymentStatus,
        now: Timestamp,
    ) {
        let Some(workflow) = rollout_workflow(status) else {
            return;
        };
        let same_rollout = previous.and_then(rollout_workflow) == Some(workflow);
        if !same_rollout {
            self.rollout_started(strategy);
        }
        let reason = ready_reason(status);
        let before = previous.filter(|_| same_rollout).and_then(ready_reason);
        match reason {
            Some(r) if Some(r) == before => {}
            Some(COMPLETE_REASON) => {
                let age = status
                    .rollout
                    .as_ref()
                    .and_then(|r| r.started_at.as_ref())
                    .and_then(|started| Duration::try_from(started.0.duration_until(now)).ok());
                self.rollout_completed(strategy, age);
            }
            Some(r) if FAILURE_REASONS.contains(&r) => self.rollout_failed(strategy, r),
            _ => {}
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
        self.ramp_percentage
            .with(&[namespace, name], |g| g.0 = ramp);
        self.versions
            .with(&[namespace, name], |g| g.0 = versions as f64);
    }

    /// Drops the per-TWD series of a TWD that is gone.
    pub fn forget_twd(&self, namespace: &str, name: &str) {
        let matches = [("namespace", namespace), ("name", name)];
        self.ramp_percentage.remove_matching(&matches);
        self.versions.remove_matching(&matches);
    }

    /// Counts a Temporal API call.
    pub fn temporal_request(&self, operation: &str, outcome: &str) {
        self.temporal_requests
            .with(&[operation, outcome], |c| c.0 += 1);
    }

    /// Counts a Kubernetes API request.
    pub fn kubernetes_request(&self, verb: &str, resource: &str, outcome: &str) {
        self.kubernetes_requests
            .with(&[verb, resource, outcome], |c| c.0 += 1);
    }

    /// Records how long a `wait_for_pollers` activity waited.
    pub fn waited_for_pollers(&self, waited: Duration, ready: bool) {
        let outcome = if ready { "ready" } else { "not_ready" };
        self.wait_for_pollers
            .observe(&[outcome], waited.as_secs_f64());
    }

    /// Counts a signal the watcher sent (or failed to send).
    pub fn watcher_signal(&self, signal: &str, success: bool) {
        let outcome = if success { "success" } else { "error" };
        self.watcher_signals.with(&[signal, outcome], |c| c.0 += 1);
    }

    /// Every family in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        self.build_info.render(&mut out);
        self.rollouts_started.render(&mut out);
        self.rollouts_completed.render(&mut out);
        self.rollouts_failed.render(&mut out);
        self.rollout_duration.render(&mut out);
        self.ramp_percentage.render(&mut out);
        self.versions.render(&mut out);
        self.temporal_requests.render(&mut out);
        self.kubernetes_requests.render(&mut out);
        self.wait_for_pollers.render(&mut out);
        self.watcher_signals.render(&mut out);
        out
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

/// The rollout workflow a status names.
fn rollout_workflow(status: &TemporalWorkerDeploymentStatus) -> Option<&str> {
    status.rollout.as_ref()?.workflow_id.as_deref()
}

/// The reason of the status' `Ready` condition.
fn ready_reason(status: &TemporalWorkerDeploymentStatus) -> Option<&str> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.reason.as_str())
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

fn braces(labels: &str) -> String {
    if labels.is_empty() {
        String::new()
    } else {
        format!("{{{labels}}}")
    }
}

/// A sample value as Prometheus writes it (`+Inf`, `-Inf`, `NaN` for the special values).
fn number(value: f64) -> String {
    if value.is_nan() {
        "NaN".to_owned()
    } else if value.is_infinite() {
        if value > 0.0 { "+Inf" } else { "-Inf" }.to_owned()
    } else {
        value.to_string()
    }
}

/// Label values escape backslash, double quote and line feed.
fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Help text escapes backslash and line feed.
fn escape_help(help: &str) -> String {
    help.replace('\\', "\\\\").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use twc_crds::worker_deployment::{
        DeprecatedVersion, RolloutStatus, TargetVersion, VersionStatus,
    };

    use super::*;

    /// The value of one sample line (`name{labels}`) in a rendered page.
    fn sample(page: &str, series: &str) -> Option<String> {
        page.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ').map(str::to_owned))
    }

    fn version(build: &str, state: VersionState) -> VersionStatus {
        VersionStatus {
            build_id: build.to_owned(),
            status: state,
            healthy_since: None,
            deployment: None,
            task_queues: Vec::new(),
        }
    }

    fn status(
        workflow: Option<&str>,
        target: Option<(&str, VersionState, Option<f32>)>,
    ) -> TemporalWorkerDeploymentStatus {
        TemporalWorkerDeploymentStatus {
            target_version: target.map(|(build, state, ramp)| TargetVersion {
                version: version(build, state),
                test_workflows: Vec::new(),
                ramp_percentage: ramp,
                ramping_since: None,
                ramp_last_modified_at: None,
            }),
            rollout: workflow.map(|w| RolloutStatus {
                workflow_id: Some(w.to_owned()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn counters_render_with_help_type_and_escaped_labels() {
        let metrics = Metrics::new();
        metrics.kubernetes_request("get", "deployments", "success");
        metrics.kubernetes_request("get", "deployments", "success");
        metrics.temporal_request("Describe\"x\"\\\n", "success");
        let page = metrics.render();
        assert!(page.contains("# HELP twc_kubernetes_requests_total "));
        assert!(page.contains("# TYPE twc_kubernetes_requests_total counter\n"));
        assert_eq!(
            sample(
                &page,
                r#"twc_kubernetes_requests_total{verb="get",resource="deployments",outcome="success"}"#
            )
            .as_deref(),
            Some("2")
        );
        assert_eq!(
            sample(
                &page,
                r#"twc_temporal_requests_total{operation="Describe\"x\"\\\n",outcome="success"}"#
            )
            .as_deref(),
            Some("1")
        );
        assert_eq!(
            sample(
                &page,
                &format!(
                    "twc_build_info{{version=\"{}\"}}",
                    env!("CARGO_PKG_VERSION")
                )
            )
            .as_deref(),
            Some("1")
        );
    }

    #[test]
    fn every_family_has_one_help_and_type_line_and_samples_follow_their_type() {
        let metrics = Metrics::new();
        metrics.rollout_started("Progressive");
        metrics.rollout_completed("Progressive", Some(Duration::from_secs(42)));
        metrics.rollout_failed("Manual", "GateFailed");
        metrics.waited_for_pollers(Duration::from_millis(700), true);
        metrics.watcher_signal("spec_changed", true);
        let page = metrics.render();
        let mut current: Option<String> = None;
        let mut seen = std::collections::HashSet::new();
        for line in page.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let name = rest.split(' ').next().unwrap_or_default().to_owned();
                assert!(seen.insert(name.clone()), "{name} declared twice");
                current = Some(name);
            } else if !line.starts_with('#') {
                let family = current.as_deref().unwrap_or_default();
                let name = line.split(['{', ' ']).next().unwrap_or_default();
                let ok = name == family
                    || [
                        format!("{family}_bucket"),
                        format!("{family}_sum"),
                        format!("{family}_count"),
                    ]
                    .contains(&name.to_owned());
                assert!(ok, "{line} outside its family {family}");
                let value = line.rsplit(' ').next().unwrap_or_default();
                assert!(
                    value.parse::<f64>().is_ok() || ["+Inf", "-Inf", "NaN"].contains(&value),
                    "{line}"
                );
            }
        }
        assert_eq!(seen.len(), 11, "{page}");
    }

    #[test]
    fn histograms_are_cumulative_with_inf_sum_and_count() {
        let metrics = Metrics::new();
        for secs in [0.1, 0.7, 3.0, 3.0, 10_000.0] {
            metrics.waited_for_pollers(Duration::from_secs_f64(secs), true);
        }
        let page = metrics.render();
        let bucket = |le: &str| {
            sample(
                &page,
                &format!("twc_wait_for_pollers_seconds_bucket{{outcome=\"ready\",le=\"{le}\"}}"),
            )
        };
        assert_eq!(bucket("0.25").as_deref(), Some("1"));
        assert_eq!(bucket("0.5").as_deref(), Some("1"));
        assert_eq!(bucket("1").as_deref(), Some("2"));
        assert_eq!(bucket("2.5").as_deref(), Some("2"));
        assert_eq!(bucket("5").as_deref(), Some("4"));
        assert_eq!(bucket("600").as_deref(), Some("4"));
        assert_eq!(bucket("+Inf").as_deref(), Some("5"));
        assert_eq!(
            sample(
                &page,
                r#"twc_wait_for_pollers_seconds_count{outcome="ready"}"#
            )
            .as_deref(),
            Some("5")
        );
        let sum = sample(
            &page,
            r#"twc_wait_for_pollers_seconds_sum{outcome="ready"}"#,
        )
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or_default();
        assert!((sum - 10_006.8).abs() < 1e-6, "{sum}");
    }

    fn ready(status: &mut TemporalWorkerDeploymentStatus, reason: &str) {
        status.conditions = vec![Condition {
            type_: "Ready".to_owned(),
            status: if reason == COMPLETE_REASON {
                "True"
            } else {
                "False"
            }
            .to_owned(),
            reason: reason.to_owned(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
        }];
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    #[test]
    fn status_transitions_count_each_rollout_start_completion_and_failure_once() {
        let metrics = Metrics::new();
        let mut first = status(
            Some("rollout/demo/hello/v1"),
            Some(("v1", VersionState::NotRegistered, None)),
        );
        if let Some(rollout) = first.rollout.as_mut() {
            rollout.started_at = Some(Time(at(1000)));
        }
        ready(&mut first, "WaitingForPollers");
        // First write, then the same status again (a retried write or a resync).
        metrics.status_written("AllAtOnce", None, &first, at(1001));
        metrics.status_written("AllAtOnce", Some(&first), &first, at(1002));
        let mut done = first.clone();
        ready(&mut done, COMPLETE_REASON);
        metrics.status_written("AllAtOnce", Some(&first), &done, at(1042));
        metrics.status_written("AllAtOnce", Some(&done), &done, at(1100));
        // A new rollout whose gate fails, written twice, then retried and failing again.
        let mut second = status(
            Some("rollout/demo/hello/v2"),
            Some(("v2", VersionState::Inactive, None)),
        );
        ready(&mut second, "GateFailed");
        metrics.status_written("Progressive", Some(&done), &second, at(1200));
        metrics.status_written("Progressive", Some(&second), &second, at(1300));
        let mut retried = second.clone();
        ready(&mut retried, "WaitingForPromotion");
        metrics.status_written("Progressive", Some(&second), &retried, at(1400));
        metrics.status_written("Progressive", Some(&retried), &second, at(1500));
        // A status without a rollout counts nothing.
        metrics.status_written("Manual", None, &status(None, None), at(1600));

        let page = metrics.render();
        let value = |series: &str| sample(&page, series);
        assert_eq!(
            value(r#"twc_rollouts_started_total{strategy="AllAtOnce"}"#).as_deref(),
            Some("1")
        );
        assert_eq!(
            value(r#"twc_rollouts_completed_total{strategy="AllAtOnce"}"#).as_deref(),
            Some("1")
        );
        assert_eq!(
            value(r#"twc_rollout_duration_seconds_sum{strategy="AllAtOnce"}"#).as_deref(),
            Some("42")
        );
        assert_eq!(
            value(r#"twc_rollout_duration_seconds_bucket{strategy="AllAtOnce",le="60"}"#)
                .as_deref(),
            Some("1")
        );
        assert_eq!(
            value(r#"twc_rollouts_started_total{strategy="Progressive"}"#).as_deref(),
            Some("1")
        );
        assert_eq!(
            value(r#"twc_rollouts_failed_total{strategy="Progressive",reason="GateFailed"}"#)
                .as_deref(),
            Some("2")
        );
        assert!(!page.contains(r#"strategy="Manual""#), "{page}");
        assert!(
            !page.contains(r#"twc_rollouts_completed_total{strategy="Progressive"}"#),
            "{page}"
        );
    }

    #[test]
    fn per_twd_gauges_follow_the_status_and_go_with_the_twd() {
        let metrics = Metrics::new();
        let ramping = status(
            Some("rollout/demo/hello/v2"),
            Some(("v2", VersionState::Ramping, Some(25.0))),
        );
        metrics.twd_status("demo", "hello", Some(&ramping));
        metrics.twd_status("demo", "other", None);
        let page = metrics.render();
        assert_eq!(
            sample(
                &page,
                r#"twc_ramp_percentage{namespace="demo",name="hello"}"#
            )
            .as_deref(),
            Some("25")
        );
        assert_eq!(
            sample(&page, r#"twc_versions{namespace="demo",name="hello"}"#).as_deref(),
            Some("1")
        );
        assert_eq!(
            sample(&page, r#"twc_versions{namespace="demo",name="other"}"#).as_deref(),
            Some("0")
        );
        metrics.forget_twd("demo", "hello");
        let page = metrics.render();
        assert!(!page.contains("name=\"hello\""), "{page}");
        assert!(page.contains("name=\"other\""), "{page}");
    }

    #[test]
    fn ramp_and_version_count_follow_the_status() {
        let mut s = status(None, Some(("v2", VersionState::Ramping, Some(10.0))));
        assert_eq!(ramp_percentage(&s), 10.0);
        s.current_version = Some(version("v1", VersionState::Current));
        s.deprecated_versions = vec![
            DeprecatedVersion {
                version: version("v0", VersionState::Draining),
                drained_since: None,
                eligible_for_deletion: false,
                open_pinned_workflows: None,
                oldest_pinned_workflow_started_at: None,
                next_drain_action: None,
                next_drain_action_at: None,
                drain_steps_done: Vec::new(),
            },
            DeprecatedVersion {
                version: version("v1", VersionState::Draining),
                drained_since: None,
                eligible_for_deletion: false,
                open_pinned_workflows: None,
                oldest_pinned_workflow_started_at: None,
                next_drain_action: None,
                next_drain_action_at: None,
                drain_steps_done: Vec::new(),
            },
        ];
        assert_eq!(version_count(&s), 3);
        if let Some(target) = s.target_version.as_mut() {
            target.version.status = VersionState::Current;
        }
        assert_eq!(ramp_percentage(&s), 100.0);
        if let Some(target) = s.target_version.as_mut() {
            target.version.status = VersionState::Inactive;
        }
        assert_eq!(ramp_percentage(&s), 0.0);
        assert_eq!(
            ramp_percentage(&TemporalWorkerDeploymentStatus::default()),
            0.0
        );
    }

    #[test]
    fn special_values_use_prometheus_spelling() {
        assert_eq!(number(f64::INFINITY), "+Inf");
        assert_eq!(number(f64::NEG_INFINITY), "-Inf");
        assert_eq!(number(f64::NAN), "NaN");
        assert_eq!(number(0.25), "0.25");
        assert_eq!(number(86400.0), "86400");
    }
}
