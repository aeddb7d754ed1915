//! Draining a retired version on purpose (`spec.sunset.drain`): one TWD with
//! `drain: { signalAfter: 5s }`, many open `Subscription` workflows of the sample worker pinned
//! to v1, then v2 rolled out. Measured from the `signalAfter` moment — v1's retirement, taken as
//! the moment the benchmark saw v2 Current in Temporal, plus 5 s — to Temporal reporting v1
//! Drained, and to every workflow's latest run being on v2 (each `Subscription` obeys the drain
//! signal by continuing as new onto the Current version).

use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail};
use futures::{StreamExt, TryStreamExt, stream};
use serde::Serialize;
use serde_json::{Value, json};
use temporalio_common::protos::temporal::api::enums::v1::VersionDrainageStatus;

use crate::cluster::{Cluster, seconds_between, system_time, worker};

/// The TWD.
const NAME: &str = "drain";
/// `spec.sunset.drain.signalAfter`.
const SIGNAL_AFTER: Duration = Duration::from_secs(5);
/// Workflows started or described at once.
const PARALLEL: usize = 20;
/// How often Temporal is asked while waiting.
const POLL: Duration = Duration::from_millis(250);
/// How long a rollout may take before the benchmark gives up.
const ROLLOUT_TIMEOUT: Duration = Duration::from_secs(180);
/// How long the drain may take before the benchmark gives up.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(600);

/// The drain results (one run).
#[derive(Debug, Clone, Serialize)]
pub struct Drain {
    /// Open `Subscription` workflows pinned to the retired version.
    pub workflows: usize,
    /// The retired build.
    pub retired_build: String,
    /// The build that replaced it.
    pub current_build: String,
    /// `spec.sunset.drain.signalAfter`, s.
    pub signal_after_s: f64,
    /// Starting the workflows until every one was seen running pinned to v1, s.
    pub pinned_after_start_s: f64,
    /// Apply of v2 → v2 seen Current in Temporal (the retirement), s.
    pub current_after_apply_s: f64,
    /// Temporal's `currentSinceTime` of v2 − the moment the benchmark saw it Current, s
    /// (negative: how late the benchmark saw it).
    pub server_current_minus_seen_s: Option<f64>,
    /// `signalAfter` moment → v1 seen Drained by `DescribeWorkerDeploymentVersion`, s.
    pub signal_to_drained_s: f64,
    /// `signalAfter` moment → v1 Drained by Temporal's own timestamp (`drainageInfo.lastChangedTime`), s.
    pub signal_to_drained_server_s: Option<f64>,
    /// `signalAfter` moment → the latest run of every workflow seen running on v2, s.
    pub signal_to_all_moved_s: f64,
}

/// A TWD of the sample worker polling `task_queue`, with a drain after [`SIGNAL_AFTER`].
fn drained_worker(namespace: &str, temporal_namespace: &str, tag: &str, task_queue: &str) -> Value {
    let mut manifest = worker(
        namespace,
        temporal_namespace,
        NAME,
        tag,
        json!({ "strategy": "AllAtOnce" }),
    );
    manifest["spec"]["template"]["spec"]["containers"][0]["env"] =
        json!([{ "name": "SAMPLE_TASK_QUEUE", "value": task_queue }]);
    manifest["spec"]["sunset"] = json!({
        "scaledownDelay": "2s",
        "deleteDelay": "3s",
        "drain": { "signalAfter": format!("{}s", SIGNAL_AFTER.as_secs()) }
    });
    manifest
}

/// Rolls out v1, starts `count` workflows pinned to it, rolls out v2 and times the drain.
pub async fn run(cluster: &Cluster, namespace: &str, count: usize) -> anyhow::Result<Drain> {
    cluster.namespace(namespace).await?;
    let temporal_namespace = cluster.env.temporal_namespace.clone();
    let task_queue = format!("{namespace}-subscriptions");
    let deployment_name = format!("{namespace}/{NAME}");
    cluster
        .apply(&drained_worker(
            namespace,
            &temporal_namespace,
            "dr1",
            &task_queue,
        ))
        .await?;
    wait_ready(cluster, namespace, "dr1-").await?;
    let v1 = cluster.current_build(&deployment_name).await?;

    let ids: Vec<String> = (1..=count)
        .map(|i| format!("{namespace}-sub-{i}"))
        .collect();
    let started = Instant::now();
    stream::iter(&ids)
        .map(|id| cluster.start_workflow("Subscription", &task_queue, id))
        .buffer_unordered(PARALLEL)
        .try_collect::<Vec<()>>()
        .await?;
    wait_runs(cluster, &ids, &v1, ROLLOUT_TIMEOUT)
        .await
        .context("waiting for the workflows to run pinned to v1")?;
    let pinned_after_start_s = started.elapsed().as_secs_f64();
    tracing::info!(
        workflows = count,
        build = %v1,
        seconds = pinned_after_start_s,
        "drain: workflows pinned to v1"
    );

    let applied = Instant::now();
    cluster
        .apply(&drained_worker(
            namespace,
            &temporal_namespace,
            "dr2",
            &task_queue,
        ))
        .await?;
    let (v2, retired) = wait_current(cluster, &deployment_name, &v1).await?;
    let current_after_apply_s = applied.elapsed().as_secs_f64();
    let signal_at = retired + SIGNAL_AFTER;
    let server_current = cluster
        .describe_version(&temporal_namespace, &deployment_name, &v2)
        .await
        .ok()
        .and_then(|v| system_time(v.current_since_time.as_ref()));
    tracing::info!(build = %v2, seconds = current_after_apply_s, "drain: v2 Current, v1 retired");

    let moved = async {
        wait_runs(cluster, &ids, &v2, DRAIN_TIMEOUT)
            .await
            .context("waiting for the workflows to move to v2")
    };
    let drained = wait_drained(cluster, &deployment_name, &v1);
    let ((drained, drained_server), moved) = tokio::try_join!(drained, moved)?;
    let measured = Drain {
        workflows: count,
        retired_build: v1,
        current_build: v2,
        signal_after_s: SIGNAL_AFTER.as_secs_f64(),
        pinned_after_start_s,
        current_after_apply_s,
        server_current_minus_seen_s: server_current.map(|s| seconds_between(retired, s)),
        signal_to_drained_s: seconds_between(signal_at, drained),
        signal_to_drained_server_s: drained_server.map(|d| seconds_between(signal_at, d)),
        signal_to_all_moved_s: seconds_between(signal_at, moved),
    };
    tracing::info!(
        signal_to_drained_s = measured.signal_to_drained_s,
        signal_to_drained_server_s = ?measured.signal_to_drained_server_s,
        signal_to_all_moved_s = measured.signal_to_all_moved_s,
        "drain: v1 Drained"
    );
    Ok(measured)
}

/// Waits until the latest run of each of `ids` is running on `build`; returns when the last of
/// them was seen so.
async fn wait_runs(
    cluster: &Cluster,
    ids: &[String],
    build: &str,
    timeout: Duration,
) -> anyhow::Result<SystemTime> {
    let deadline = Instant::now() + timeout;
    let mut pending: Vec<&String> = ids.iter().collect();
    let mut last = SystemTime::now();
    loop {
        // Each workflow with its latest run and when the answer came.
        let seen = stream::iter(pending.iter().copied())
            .map(|id| async move {
                let run = cluster.latest_run(id).await;
                (id, run, SystemTime::now())
            })
            .buffer_unordered(PARALLEL)
            .collect::<Vec<_>>()
            .await;
        let mut still = Vec::new();
        let mut example = None;
        for (id, run, at) in seen {
            match run {
                Ok((true, b)) if b == build => last = last.max(at),
                Ok((running, b)) => {
                    example.get_or_insert_with(|| format!("{id}: running {running}, build {b:?}"));
                    still.push(id);
                }
                Err(e) => {
                    example.get_or_insert_with(|| format!("{e:#}"));
                    still.push(id);
                }
            }
        }
        pending = still;
        if pending.is_empty() {
            return Ok(last);
        }
        if Instant::now() >= deadline {
            bail!(
                "{} of {} workflows not running on {build} after {timeout:?} (e.g. {})",
                pending.len(),
                ids.len(),
                example.unwrap_or_default()
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Waits until a build other than `old` is Current; returns it and when it was seen so.
async fn wait_current(
    cluster: &Cluster,
    deployment_name: &str,
    old: &str,
) -> anyhow::Result<(String, SystemTime)> {
    let deadline = Instant::now() + ROLLOUT_TIMEOUT;
    loop {
        if let Ok(build) = cluster.current_build(deployment_name).await
            && build != old
        {
            return Ok((build, SystemTime::now()));
        }
        if Instant::now() >= deadline {
            bail!("{deployment_name}: no new Current version after {ROLLOUT_TIMEOUT:?}");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Waits until Temporal reports `build` Drained; returns when the benchmark saw it so and
/// Temporal's own timestamp of the change.
async fn wait_drained(
    cluster: &Cluster,
    deployment_name: &str,
    build: &str,
) -> anyhow::Result<(SystemTime, Option<SystemTime>)> {
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    let mut status = VersionDrainageStatus::Unspecified;
    loop {
        let info = cluster
            .describe_version(&cluster.env.temporal_namespace, deployment_name, build)
            .await?;
        let seen = SystemTime::now();
        if let Some(drainage) = info.drainage_info {
            status = VersionDrainageStatus::try_from(drainage.status).unwrap_or(status);
            if status == VersionDrainageStatus::Drained {
                return Ok((seen, system_time(drainage.last_changed_time.as_ref())));
            }
        }
        if Instant::now() >= deadline {
            bail!("{deployment_name}:{build} not Drained after {DRAIN_TIMEOUT:?} ({status:?})");
        }
        tokio::time::sleep(POLL).await;
    }
}

async fn wait_ready(cluster: &Cluster, namespace: &str, prefix: &str) -> anyhow::Result<()> {
    let expected = [(NAME.to_owned(), prefix.to_owned())].into();
    cluster
        .wait_all_ready(namespace, &expected, ROLLOUT_TIMEOUT)
        .await
        .with_context(|| format!("rolling out {namespace}/{NAME} build {prefix}*"))?;
    Ok(())
}
