//! Canary analysis stopping a bad build (`spec.rollout.analysis`): one Progressive TWD with a
//! single 50 % step held 60 s and a Temporal check (`maxIncreaseOverCurrent: 5`,
//! `minSamples: 10`), HelloWorld load from the sandbox's load generator on its task queue, then
//! a new build of which [`BAD_FAIL_SHARE`] percent of the workflows fail. Measured from the
//! first failing workflow on the bad build (its close time in visibility) to routing restored
//! (Temporal's `rampingVersionChangedTime` once no version ramps), from the ramp start to the
//! same moment, and to the benchmark seeing `Ready` with reason `AnalysisFailed`.

use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, anyhow, bail};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use serde::Serialize;
use serde_json::{Value, json};
use temporalio_common::protos::temporal::api::deployment::v1::WorkerDeploymentVersion;
use twc_crds::TemporalWorkerDeployment;
use twc_sandbox::load::{LoadConfig, LoadGenerator};

use crate::cluster::{Cluster, seconds_between, system_time, worker};

/// The TWD.
const NAME: &str = "analysis";
/// `SAMPLE_FAIL_SHARE` of the bad build, percent.
const BAD_FAIL_SHARE: u32 = 30;
/// The one step: ramp percentage and a pause long enough that only the analysis ends it.
const STEP: (u32, &str) = (50, "60s");
/// How often Temporal is asked while waiting.
const POLL: Duration = Duration::from_millis(250);
/// How long a rollout may take before the benchmark gives up.
const ROLLOUT_TIMEOUT: Duration = Duration::from_secs(180);
/// How long the abort may take after the apply of the bad build before the benchmark gives up.
const ABORT_TIMEOUT: Duration = Duration::from_secs(300);

/// Which clock a moment was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Clock {
    /// Temporal's own timestamp.
    Server,
    /// When the benchmark saw it (Temporal gave no usable timestamp).
    Benchmark,
}

/// The canary-analysis results (one run).
#[derive(Debug, Clone, Serialize)]
pub struct Analysis {
    /// The check's `interval`, s.
    pub interval_s: f64,
    /// HelloWorld workflows started per second on the TWD's task queue.
    pub rate_per_s: f64,
    /// Share of the bad build's workflows that fail (`SAMPLE_FAIL_SHARE`), percent.
    pub bad_fail_share_pct: u32,
    /// The build that stayed Current.
    pub current_build: String,
    /// The bad build.
    pub bad_build: String,
    /// First failing workflow on the bad build (close time) → routing restored, s.
    pub first_failure_to_routing_restored_s: f64,
    /// The bad build's ramp set → routing restored, s.
    pub ramp_to_routing_restored_s: f64,
    /// First failing workflow on the bad build → the benchmark saw `Ready` with reason
    /// `AnalysisFailed`, s.
    pub first_failure_to_condition_s: f64,
    /// The bad build's ramp set → its first failing workflow, s.
    pub ramp_to_first_failure_s: f64,
    /// The clock routing restored was read from.
    pub routing_restored_clock: Clock,
    /// When the benchmark saw routing restored − Temporal's timestamp of it, s (polled every
    /// 250 ms).
    pub routing_restored_seen_after_server_s: Option<f64>,
    /// The failure share of the check's last measurement (from
    /// `status.rollout.analysis[0].message`), percent.
    pub measured_failure_pct: Option<f64>,
    /// That message.
    pub analysis_message: Option<String>,
    /// Measurements of the check in the step (successful, failed and inconclusive).
    pub measurements: i32,
    /// Failed workflows of the bad build in visibility at the end.
    pub failed_workflows: usize,
    /// Workflows the load generator started.
    pub workflows_started: u64,
}

/// The bad build's ramp as Temporal's routing showed it.
struct Ramp {
    /// The ramping build.
    build: String,
    /// When it started ramping (Temporal's `rampingVersionChangedTime`).
    since: SystemTime,
    /// When the ramp was cleared, and by which clock.
    cleared: SystemTime,
    cleared_clock: Clock,
    /// When the benchmark saw it cleared.
    cleared_seen: SystemTime,
}

/// A Progressive TWD of the sample worker polling `task_queue` with the Temporal check,
/// measured every `interval`; `fail_share` percent of its HelloWorld workflows fail.
fn analysed_worker(
    namespace: &str,
    temporal_namespace: &str,
    tag: &str,
    task_queue: &str,
    fail_share: u32,
    interval: Duration,
) -> Value {
    let (ramp, pause) = STEP;
    let rollout = json!({
        "strategy": "Progressive",
        "steps": [{ "rampPercentage": ramp, "pauseDuration": pause }],
        "analysis": { "checks": [{
            "name": "failures",
            "interval": format!("{}s", interval.as_secs()),
            "inconclusiveLimit": 30,
            "temporal": { "maxIncreaseOverCurrent": 5, "minSamples": 10 }
        }] }
    });
    let mut manifest = worker(namespace, temporal_namespace, NAME, tag, rollout);
    manifest["spec"]["template"]["spec"]["containers"][0]["env"] = json!([
        { "name": "SAMPLE_TASK_QUEUE", "value": task_queue },
        { "name": "SAMPLE_FAIL_SHARE", "value": fail_share.to_string() },
    ]);
    manifest
}

/// Rolls out a good v1, puts load on it, applies a bad v2 and times its abort.
pub async fn run(
    cluster: &Cluster,
    namespace: &str,
    interval: Duration,
    rate: f64,
) -> anyhow::Result<Analysis> {
    cluster.namespace(namespace).await?;
    let temporal_namespace = cluster.env.temporal_namespace.clone();
    let task_queue = format!("{namespace}-hello");
    let deployment_name = format!("{namespace}/{NAME}");
    let manifest = |tag: &str, fail_share: u32| {
        analysed_worker(
            namespace,
            &temporal_namespace,
            tag,
            &task_queue,
            fail_share,
            interval,
        )
    };
    cluster.apply(&manifest("an1", 0)).await?;
    let expected = [(NAME.to_owned(), "an1-".to_owned())].into();
    cluster
        .wait_all_ready(namespace, &expected, ROLLOUT_TIMEOUT)
        .await
        .with_context(|| format!("rolling out {deployment_name} build an1-*"))?;
    let v1 = cluster.current_build(&deployment_name).await?;

    let load = LoadGenerator::start(LoadConfig {
        namespace: temporal_namespace.clone(),
        task_queue: task_queue.clone(),
        workflow_type: "HelloWorld".to_owned(),
        id_prefix: format!("{namespace}-load-"),
        ..LoadConfig::new(cluster.env.temporal_address.clone(), rate)
    })
    .await
    .context("starting the load generator")?;

    cluster.apply(&manifest("an2", BAD_FAIL_SHARE)).await?;
    let (ramp, (condition_seen, twd)) = tokio::try_join!(
        watch_ramp(cluster, &deployment_name, &v1),
        wait_analysis_failed(cluster, namespace, "an2-"),
    )?;
    let stats = load.stop().await.context("stopping the load generator")?;
    tracing::info!(
        started = stats.started,
        failed_to_start = stats.failed_to_start,
        rate = stats.achieved_rate(),
        "analysis: load stopped"
    );

    let query = format!(
        "TemporalWorkerDeploymentVersion = '{deployment_name}:{}' AND ExecutionStatus = 'Failed'",
        ramp.build
    );
    let failed = cluster.list_workflows(&query).await?;
    // Visibility has no ORDER BY: the first failure is the smallest close time.
    let first_failure = failed
        .iter()
        .filter_map(|w| system_time(w.close_time.as_ref()))
        .min()
        .ok_or_else(|| anyhow!("no failed workflow with a close time where {query}"))?;
    let check = twd
        .status
        .and_then(|s| s.rollout)
        .and_then(|r| r.analysis.into_iter().next())
        .unwrap_or_default();
    let measured = Analysis {
        interval_s: interval.as_secs_f64(),
        rate_per_s: rate,
        bad_fail_share_pct: BAD_FAIL_SHARE,
        current_build: v1,
        bad_build: ramp.build,
        first_failure_to_routing_restored_s: seconds_between(first_failure, ramp.cleared),
        ramp_to_routing_restored_s: seconds_between(ramp.since, ramp.cleared),
        first_failure_to_condition_s: seconds_between(first_failure, condition_seen),
        ramp_to_first_failure_s: seconds_between(ramp.since, first_failure),
        routing_restored_clock: ramp.cleared_clock,
        routing_restored_seen_after_server_s: (ramp.cleared_clock == Clock::Server)
            .then(|| seconds_between(ramp.cleared, ramp.cleared_seen)),
        measured_failure_pct: check.message.as_deref().and_then(failure_share),
        analysis_message: check.message,
        measurements: check.successful + check.failed + check.inconclusive,
        failed_workflows: failed.len(),
        workflows_started: stats.started,
    };
    tracing::info!(
        first_failure_to_routing_restored_s = measured.first_failure_to_routing_restored_s,
        ramp_to_routing_restored_s = measured.ramp_to_routing_restored_s,
        first_failure_to_condition_s = measured.first_failure_to_condition_s,
        measured_failure_pct = ?measured.measured_failure_pct,
        measurements = measured.measurements,
        "analysis: bad build aborted"
    );
    Ok(measured)
}

/// Follows Temporal's routing of `deployment_name` until a build other than `current` has
/// ramped and the ramp is cleared again with `current` still Current.
async fn watch_ramp(
    cluster: &Cluster,
    deployment_name: &str,
    current: &str,
) -> anyhow::Result<Ramp> {
    let deadline = Instant::now() + ABORT_TIMEOUT;
    let mut ramping: Option<(String, SystemTime)> = None;
    loop {
        let last = match cluster
            .describe_deployment(&cluster.env.temporal_namespace, deployment_name)
            .await
        {
            Ok(info) => {
                let seen = SystemTime::now();
                let routing = info.routing_config.unwrap_or_default();
                let now_current = build_of(routing.current_deployment_version.as_ref());
                let now_ramping = build_of(routing.ramping_deployment_version.as_ref());
                let changed = system_time(routing.ramping_version_changed_time.as_ref());
                if now_current.as_deref() != Some(current) {
                    bail!(
                        "{deployment_name}: Current is {now_current:?}, no longer {current}: \
                         the analysis did not stop the bad build"
                    );
                }
                match (&ramping, now_ramping) {
                    (None, Some(build)) => {
                        tracing::info!(%build, "analysis: bad build ramping");
                        ramping = Some((build, changed.unwrap_or(seen)));
                    }
                    (Some((build, since)), None) => {
                        // A cleared ramp moves `rampingVersionChangedTime`; a server that
                        // does not leaves the ramp's own time, useless here.
                        let (cleared, cleared_clock) = match changed {
                            Some(at) if at > *since => (at, Clock::Server),
                            _ => (seen, Clock::Benchmark),
                        };
                        return Ok(Ramp {
                            build: build.clone(),
                            since: *since,
                            cleared,
                            cleared_clock,
                            cleared_seen: seen,
                        });
                    }
                    _ => {}
                }
                format!(
                    "current {now_current:?}, ramped {:?}",
                    ramping.as_ref().map(|(build, _)| build)
                )
            }
            Err(e) => format!("{e:#}"),
        };
        if Instant::now() >= deadline {
            bail!(
                "{deployment_name}: no ramp set and cleared within {ABORT_TIMEOUT:?} (last: {last})"
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Waits until the TWD, targeting a build with `prefix`, has `Ready` with reason
/// `AnalysisFailed`; returns when the benchmark saw it so, and the TWD then.
async fn wait_analysis_failed(
    cluster: &Cluster,
    namespace: &str,
    prefix: &str,
) -> anyhow::Result<(SystemTime, TemporalWorkerDeployment)> {
    let api: Api<TemporalWorkerDeployment> = Api::namespaced(cluster.kube.clone(), namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={NAME}"));
    let mut events = Box::pin(watcher(api, config).default_backoff().applied_objects());
    let deadline = tokio::time::Instant::now() + ABORT_TIMEOUT;
    loop {
        let event = tokio::time::timeout_at(deadline, events.next())
            .await
            .map_err(|_| {
                anyhow!("{namespace}/{NAME}: no AnalysisFailed within {ABORT_TIMEOUT:?}")
            })?;
        let twd = match event {
            Some(Ok(twd)) => twd,
            Some(Err(e)) => {
                tracing::warn!("watching {namespace}/{NAME}: {e}");
                continue;
            }
            None => bail!("the watch of {namespace}/{NAME} ended"),
        };
        if analysis_failed(&twd, prefix) {
            return Ok((SystemTime::now(), twd));
        }
    }
}

/// Whether `twd` targets a build with `prefix` and its `Ready` condition has reason
/// `AnalysisFailed`.
fn analysis_failed(twd: &TemporalWorkerDeployment, prefix: &str) -> bool {
    let target = twd
        .status
        .as_ref()
        .and_then(|s| s.target_version.as_ref())
        .is_some_and(|t| t.version.build_id.starts_with(prefix));
    target && ready_condition(twd).is_some_and(|c| c.reason == "AnalysisFailed")
}

/// The TWD's `Ready` condition.
fn ready_condition(twd: &TemporalWorkerDeployment) -> Option<&Condition> {
    twd.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
}

fn build_of(version: Option<&WorkerDeploymentVersion>) -> Option<String> {
    version
        .map(|v| v.build_id.clone())
        .filter(|b| !b.is_empty())
}

/// The percentage in an analysis message's `failure share 31.0% (...)`.
fn failure_share(message: &str) -> Option<f64> {
    let (_, rest) = message.split_once("failure share ")?;
    rest.split_once('%')?.0.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_share_is_read_from_the_analysis_message() {
        assert_eq!(
            failure_share(
                "failure share 31.0% (31 of 100 workflows failed, timed out or were terminated) \
                 on build v2; failure share 0.0% (0 of 90 workflows failed, timed out or were \
                 terminated) on build v1; limit: Current + 5 points = 5.0%"
            ),
            Some(31.0)
        );
        assert_eq!(
            failure_share("only 4 of 10 judged workflows so far: failure share 75.0% (3 of 4)"),
            Some(75.0)
        );
        assert_eq!(failure_share("no workflows yet"), None);
    }
}
