//! Step accuracy: how long each Progressive ramp step was actually held, against its
//! `pauseDuration`, from Temporal's own routing timestamps.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use anyhow::anyhow;
use serde::Serialize;
use serde_json::{Value, json};

use crate::cluster::{Cluster, seconds_between, system_time, worker};
use crate::latency::{self, wait_within};
use crate::stats::Summary;

/// The steps each rollout takes: (ramp %, pause seconds).
pub const STEPS: &[(u32, u64)] = &[(10, 5), (25, 10), (50, 5)];

/// How often routing is read while a rollout runs (only to catch every change; the times
/// themselves are the server's).
const POLL: Duration = Duration::from_millis(200);

/// How long one rollout may take.
const ROLLOUT_TIMEOUT: Duration = Duration::from_secs(240);

/// One step of one rollout.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    /// Ramp percentage.
    pub ramp: u32,
    /// Configured pause, ms.
    pub pause_ms: f64,
    /// Time from this ramp being set to the next routing change, ms.
    pub held_ms: f64,
    /// `held_ms - pause_ms`.
    pub overshoot_ms: f64,
    /// This ramp set in Temporal (`rampingVersionPercentageChangedTime`) → the benchmark's TWD
    /// watch first shows it in `status.targetVersion.rampPercentage`, ms; `None` when it never
    /// did within [`STATUS_TIMEOUT`].
    pub status_lag_ms: Option<f64>,
}

/// The step-accuracy results.
#[derive(Debug, Clone, Serialize)]
pub struct Steps {
    /// Every step of every rollout, in order.
    pub steps: Vec<Step>,
    /// Overshoot over all steps, ms.
    pub overshoot_ms: Option<Summary>,
    /// Overshoot relative to the pause, percent.
    pub overshoot_pct: Option<Summary>,
    /// Ramp set in Temporal → shown in the TWD's status, ms, over all steps.
    pub ramp_status_lag_ms: Option<Summary>,
    /// The build Current in Temporal → shown as `status.currentVersion`, ms, over the rollouts.
    pub current_status_lag_ms: Option<Summary>,
    /// Ramp steps and promotions whose status change was never seen.
    pub status_lag_missing: usize,
}

/// How long after a routing change the TWD's status may take to show it before its lag is
/// reported missing.
const STATUS_TIMEOUT: Duration = Duration::from_secs(30);

fn rollout_spec() -> Value {
    let steps: Vec<Value> = STEPS
        .iter()
        .map(
            |(ramp, pause)| json!({ "rampPercentage": ramp, "pauseDuration": format!("{pause}s") }),
        )
        .collect();
    json!({ "strategy": "Progressive", "steps": steps })
}

/// Runs `count` Progressive rollouts one after the other.
pub async fn run(cluster: &Cluster, namespace: &str, count: usize) -> anyhow::Result<Steps> {
    cluster.namespace(namespace).await?;
    let name = "steps";
    let deployment_name = format!("{namespace}/{name}");
    let (mut seen, mut tracker) = latency::watch(cluster, namespace).await?;
    cluster
        .apply(&worker(
            namespace,
            &cluster.env.temporal_namespace,
            name,
            "step0",
            rollout_spec(),
        ))
        .await?;
    let expected = BTreeMap::from([(name.to_owned(), "step0-".to_owned())]);
    cluster
        .wait_all_ready(namespace, &expected, ROLLOUT_TIMEOUT)
        .await?;

    let mut steps = Vec::new();
    let mut current_lags = Vec::new();
    let mut missing = 0;
    for i in 1..=count {
        let tag = format!("step{i}");
        cluster
            .apply(&worker(
                namespace,
                &cluster.env.temporal_namespace,
                name,
                &tag,
                rollout_spec(),
            ))
            .await?;
        let prefix = format!("{tag}-");
        let changes = watch_routing(cluster, &deployment_name, &prefix).await?;
        // The status's view of each change, on the benchmark's clock (same machine).
        let mut shown = Vec::with_capacity(changes.len());
        for (k, (ramp, at)) in changes.iter().enumerate() {
            // The last change is the promotion (100 %): shown as the status's current version.
            let promoted = *ramp == 100 && k + 1 == changes.len();
            let seen_at = wait_within(&mut seen, &mut tracker, STATUS_TIMEOUT, |t| {
                if promoted {
                    t.current_seen
                        .iter()
                        .find(|((n, b), _)| n == name && b.starts_with(&prefix))
                        .map(|(_, s)| *s)
                } else {
                    t.ramp_seen
                        .iter()
                        .find(|((n, b, r), _)| n == name && b.starts_with(&prefix) && r == ramp)
                        .map(|(_, s)| *s)
                }
            })
            .await;
            let lag = seen_at.map(|s| seconds_between(*at, s) * 1e3);
            if lag.is_none() {
                missing += 1;
            }
            tracing::info!(rollout = i, ramp, status_lag_ms = ?lag, "routing change shown in status");
            shown.push(lag);
        }
        if changes.last().is_some_and(|(ramp, _)| *ramp == 100)
            && let Some(Some(lag)) = shown.last()
        {
            current_lags.push(*lag);
        }
        for (k, (ramp, pause)) in STEPS.iter().enumerate() {
            let (Some(start), Some(end)) = (changes.get(k), changes.get(k + 1)) else {
                return Err(anyhow!(
                    "rollout {tag}: routing changes {changes:?} miss step {k}"
                ));
            };
            let pause_ms = Duration::from_secs(*pause).as_secs_f64() * 1e3;
            let held_ms = seconds_between(start.1, end.1) * 1e3;
            tracing::info!(rollout = i, ramp, held_ms, pause_ms, "step held");
            steps.push(Step {
                ramp: *ramp,
                pause_ms,
                held_ms,
                overshoot_ms: held_ms - pause_ms,
                status_lag_ms: shown.get(k).copied().flatten(),
            });
        }
    }
    Ok(Steps {
        ramp_status_lag_ms: Summary::of(
            &steps
                .iter()
                .filter_map(|s| s.status_lag_ms)
                .collect::<Vec<_>>(),
        ),
        current_status_lag_ms: Summary::of(&current_lags),
        status_lag_missing: missing,
        overshoot_ms: Summary::of(&steps.iter().map(|s| s.overshoot_ms).collect::<Vec<_>>()),
        overshoot_pct: Summary::of(
            &steps
                .iter()
                .map(|s| s.overshoot_ms / s.pause_ms * 100.0)
                .collect::<Vec<_>>(),
        ),
        steps,
    })
}

/// The routing changes of the build with `prefix` until it is Current: (ramp %, when) for
/// each ramp step, then (100, when it became Current). Times are the server's.
async fn watch_routing(
    cluster: &Cluster,
    deployment_name: &str,
    prefix: &str,
) -> anyhow::Result<Vec<(u32, SystemTime)>> {
    let deadline = tokio::time::Instant::now() + ROLLOUT_TIMEOUT;
    let mut changes: Vec<(u32, SystemTime)> = Vec::new();
    loop {
        if tokio::time::Instant::now() > deadline {
            return Err(anyhow!(
                "{deployment_name}: build {prefix}* not Current within {ROLLOUT_TIMEOUT:?} (changes so far {changes:?})"
            ));
        }
        let routing = cluster
            .describe_deployment(&cluster.env.temporal_namespace, deployment_name)
            .await?
            .routing_config
            .unwrap_or_default();
        let build = |v: &Option<
            temporalio_common::protos::temporal::api::deployment::v1::WorkerDeploymentVersion,
        >| { v.as_ref().is_some_and(|v| v.build_id.starts_with(prefix)) };
        if build(&routing.current_deployment_version) {
            if let Some(at) = system_time(routing.current_version_changed_time.as_ref()) {
                changes.push((100, at));
            }
            return Ok(changes);
        }
        if build(&routing.ramping_deployment_version)
            && let Some(at) = system_time(routing.ramping_version_percentage_changed_time.as_ref())
        {
            let ramp = routing.ramping_version_percentage.round() as u32;
            if changes.last().is_none_or(|(_, last)| *last != at) {
                changes.push((ramp, at));
            }
        }
        tokio::time::sleep(POLL).await;
    }
}
