//! Autoscaling from Temporal's backlog (`spec.autoscaling`): one AllAtOnce TWD of sample workers
//! with one activity slot and a 400 ms activity, `minReplicas: 1`, `maxReplicas: 3`,
//! `backlogPerReplica: 3`, `scaleUpWindow: 0s`, `scaleDownWindow: 5s`, and HelloWorld load at
//! 6 workflows/s from the sandbox's load generator (one replica serves ~2.5/s, so a backlog
//! grows).
//!
//! Rounds: with the version idle at one replica, the load starts at a chosen moment of the
//! controller's idle read period (the moments spread evenly over the rounds, counted from its
//! last `read_backlog` in the TWD workflow's history). Measured from the benchmark's first
//! `DescribeWorkerDeploymentVersion` (with task-queue statistics) showing a backlog on the
//! version — and from that moment minus Temporal's age of the oldest waiting task — to the
//! Deployment's `spec.replicas` first above one (polled every 100 ms). The load then stops and
//! the version scales back down before the next round.
//!
//! Reads: the `read_backlog` activities in the TWD workflow's history (every run) scheduled
//! during a window without load and during one with load, each counted once per version it read
//! (its input's `build_ids`).

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, anyhow, bail};
use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::api::ListParams;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use temporalio_common::protos::temporal::api::common::v1::Payloads;
use temporalio_common::protos::temporal::api::history::v1::HistoryEvent;
use temporalio_common::protos::temporal::api::history::v1::history_event::Attributes;
use twc_sandbox::load::{LoadConfig, LoadGenerator};
use twc_workflows::contract::{BacklogReport, BacklogRequest, ReadBacklog, ScaleDeployment};
use twc_workflows::plan::autoscale::{BUSY_READ_MS, IDLE_READ_MS};

use crate::cluster::{Cluster, scrape, seconds_between, system_time, worker};
use crate::prom;
use crate::stats::Summary;

/// The TWD.
const NAME: &str = "autoscale";
/// HelloWorld workflows started per second while loaded.
const RATE: f64 = 6.0;
/// `spec.autoscaling.minReplicas`.
const MIN_REPLICAS: i32 = 1;
/// `spec.autoscaling.maxReplicas`.
const MAX_REPLICAS: i32 = 3;
/// `spec.autoscaling.backlogPerReplica`.
const BACKLOG_PER_REPLICA: i32 = 3;
/// `spec.autoscaling.scaleDownWindow`.
const SCALE_DOWN_WINDOW: Duration = Duration::from_secs(5);
/// Length of the window with load in which backlog reads are counted.
const BUSY_WINDOW: Duration = Duration::from_secs(60);
/// How often the benchmark reads the version's backlog while waiting for one.
const BACKLOG_POLL: Duration = Duration::from_millis(250);
/// How often the benchmark reads the Deployment's replicas while waiting for a change.
const REPLICAS_POLL: Duration = Duration::from_millis(100);
/// How long the rollout may take before the benchmark gives up.
const ROLLOUT_TIMEOUT: Duration = Duration::from_secs(180);
/// How long the load may run without a scale-up before the benchmark gives up.
const SCALE_UP_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the version may take to be idle at its minimum again.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(240);
/// Past the busy read interval: no `read_backlog` for this long means the controller is at its
/// idle cadence.
const SETTLE_MARGIN: Duration = Duration::from_secs(2);

/// One round: the version idle at its minimum, load started, the first scale-up.
#[derive(Debug, Clone, Serialize)]
pub struct Round {
    /// The load started this long after the controller's previous `read_backlog` (the moment
    /// of its idle read period chosen for the round), s.
    pub load_after_previous_read_s: f64,
    /// Load started → the benchmark first saw a backlog on the version, s.
    pub load_to_backlog_seen_s: f64,
    /// Waiting tasks the benchmark saw then.
    pub backlog_seen: u64,
    /// Temporal's age of the oldest waiting task then, s.
    pub backlog_age_s: f64,
    /// Backlog first seen → the Deployment's `spec.replicas` seen above the minimum, s.
    pub backlog_seen_to_scale_up_s: f64,
    /// Backlog start by Temporal's age (first seen − age) → `spec.replicas` seen above the
    /// minimum, s.
    pub backlog_start_to_scale_up_s: f64,
    /// `spec.replicas` first seen above the minimum.
    pub replicas: i32,
    /// The controller's `read_backlog` the scale-up came from (scheduled) → `spec.replicas`
    /// seen above the minimum, ms.
    pub scaling_read_to_scale_up_ms: Option<f64>,
    /// The backlog that read reported.
    pub scaling_read_backlog: Option<u64>,
    /// The backlogs reported by the controller's `read_backlog`s after the load started and
    /// before that one (each below a replica's worth, or stale in Temporal's cache).
    pub earlier_read_backlogs: Vec<Option<u64>>,
}

/// Backlog reads over one window.
#[derive(Debug, Clone, Serialize)]
pub struct ReadWindow {
    /// Length, s.
    pub window_s: f64,
    /// `read_backlog` activities scheduled in the window.
    pub read_activities: usize,
    /// Versions they read together (one `DescribeWorkerDeploymentVersion` each).
    pub version_reads: usize,
    /// Distinct versions read.
    pub versions: usize,
    /// Version reads per version per minute over whole read periods: from the window's first
    /// read to its last, the reads before the last ÷ versions ÷ the minutes between them (the
    /// window's count without the rounding at its edges; the window figure when it holds fewer
    /// than two reads).
    pub reads_per_version_per_min: f64,
    /// Version reads per version per minute over the whole window (whole reads ÷ its length).
    pub window_reads_per_version_per_min: f64,
    /// `scale_deployment` activities scheduled in the window.
    pub scale_changes: usize,
    /// The controller's `DescribeWorkerDeploymentVersion` calls per minute (its `/metrics`:
    /// every TWD it serves, not only backlog reads).
    pub controller_version_reads_per_min: f64,
    /// Workflows the load generator started during the window and before it.
    pub workflows_started: u64,
}

/// The autoscaling results.
#[derive(Debug, Clone, Serialize)]
pub struct Autoscaling {
    /// HelloWorld workflows started per second under load.
    pub rate_per_s: f64,
    /// `minReplicas`.
    pub min_replicas: i32,
    /// `maxReplicas`.
    pub max_replicas: i32,
    /// `backlogPerReplica`.
    pub backlog_per_replica: i32,
    /// `scaleDownWindow`, s (`scaleUpWindow` is 0 s).
    pub scale_down_window_s: f64,
    /// The controller's backlog read interval when idle, s.
    pub idle_read_interval_s: f64,
    /// Its interval while a version has a backlog or a change is held, s.
    pub busy_read_interval_s: f64,
    /// Every round.
    pub rounds: Vec<Round>,
    /// Backlog first seen → new replica requested, s.
    pub backlog_seen_to_scale_up_s: Option<Summary>,
    /// Backlog start by Temporal's age → new replica requested, s.
    pub backlog_start_to_scale_up_s: Option<Summary>,
    /// The scaling `read_backlog` → new replica requested, ms.
    pub scaling_read_to_scale_up_ms: Option<Summary>,
    /// Load started → backlog first seen, s.
    pub load_to_backlog_seen_s: Option<Summary>,
    /// Reads without load, the version at its minimum.
    pub idle: ReadWindow,
    /// Reads with load, once scaling began.
    pub busy: ReadWindow,
}

/// The TWD and what the benchmark knows of it.
struct Scenario<'a> {
    cluster: &'a Cluster,
    namespace: &'a str,
    task_queue: String,
    deployment_name: String,
    workflow_id: String,
    build: String,
}

/// A backlog as the benchmark first saw it.
struct BacklogSeen {
    at: SystemTime,
    backlog: u64,
    age: Duration,
}

/// What the TWD workflow's history (all runs) says about autoscaling.
#[derive(Debug, Default, PartialEq)]
struct ScalingHistory {
    /// `read_backlog` activities, by scheduled time.
    reads: Vec<BacklogRead>,
    /// When each `scale_deployment` activity was scheduled, in order.
    scales: Vec<SystemTime>,
}

/// One `read_backlog` activity.
#[derive(Debug, Clone, PartialEq)]
struct BacklogRead {
    scheduled: SystemTime,
    /// The versions it read (its input's `build_ids`).
    build_ids: Vec<String>,
    /// The backlog it reported, summed over the versions (`None`: no result).
    backlog: Option<u64>,
}

/// A TWD of sample workers on `task_queue` with one activity slot and a 400 ms activity, sized
/// by `spec.autoscaling`.
fn scaled_worker(namespace: &str, temporal_namespace: &str, task_queue: &str) -> Value {
    let mut manifest = worker(
        namespace,
        temporal_namespace,
        NAME,
        "as1",
        json!({ "strategy": "AllAtOnce" }),
    );
    let spec = &mut manifest["spec"];
    if let Some(spec) = spec.as_object_mut() {
        spec.remove("replicas");
    }
    spec["autoscaling"] = json!({
        "minReplicas": MIN_REPLICAS,
        "maxReplicas": MAX_REPLICAS,
        "backlogPerReplica": BACKLOG_PER_REPLICA,
        "scaleUpWindow": "0s",
        "scaleDownWindow": format!("{}s", SCALE_DOWN_WINDOW.as_secs()),
    });
    spec["template"]["spec"]["containers"][0]["env"] = json!([
        { "name": "SAMPLE_TASK_QUEUE", "value": task_queue },
        { "name": "SAMPLE_ACTIVITY_SLOTS", "value": "1" },
        { "name": "SAMPLE_GREET_DELAY_MS", "value": "400" },
    ]);
    manifest
}

/// Rolls out the TWD, times `rounds` scale-ups, then counts backlog reads over `idle_window`
/// without load and [`BUSY_WINDOW`] with load.
pub async fn run(
    cluster: &Cluster,
    namespace: &str,
    rounds: usize,
    idle_window: Duration,
) -> anyhow::Result<Autoscaling> {
    cluster.namespace(namespace).await?;
    let task_queue = format!("{namespace}-hello");
    cluster
        .apply(&scaled_worker(
            namespace,
            &cluster.env.temporal_namespace,
            &task_queue,
        ))
        .await?;
    let expected = [(NAME.to_owned(), "as1-".to_owned())].into();
    cluster
        .wait_all_ready(namespace, &expected, ROLLOUT_TIMEOUT)
        .await
        .with_context(|| format!("rolling out {namespace}/{NAME} build as1-*"))?;
    let deployment_name = format!("{namespace}/{NAME}");
    let build = cluster.current_build(&deployment_name).await?;
    let scenario = Scenario {
        cluster,
        namespace,
        task_queue,
        deployment_name,
        workflow_id: format!("twd/{namespace}/{NAME}"),
        build,
    };

    let idle_period = millis(IDLE_READ_MS);
    let mut measured = Vec::with_capacity(rounds);
    for round in 1..=rounds {
        // Midpoints of equal slices of the idle period: load arriving at any moment of it.
        let offset = idle_period.mul_f64((round as f64 - 0.5) / rounds as f64);
        let r = scenario
            .round(round, offset)
            .await
            .with_context(|| format!("autoscaling round {round}"))?;
        tracing::info!(
            round,
            load_after_previous_read_s = r.load_after_previous_read_s,
            backlog_seen_to_scale_up_s = r.backlog_seen_to_scale_up_s,
            backlog_start_to_scale_up_s = r.backlog_start_to_scale_up_s,
            scaling_read_to_scale_up_ms = ?r.scaling_read_to_scale_up_ms,
            "autoscaling: scaled up"
        );
        measured.push(r);
    }

    scenario.settle().await?;
    tracing::info!(
        ?idle_window,
        "autoscaling: counting backlog reads without load"
    );
    let idle = scenario.read_window(idle_window, None).await?;
    let load = scenario.load("busy").await?;
    let busy = async {
        scenario.first_scale_up().await?;
        tracing::info!(window = ?BUSY_WINDOW, "autoscaling: counting backlog reads under load");
        scenario.read_window(BUSY_WINDOW, Some(&load)).await
    }
    .await;
    load.stop().await.context("stopping the load generator")?;
    let busy = busy?;
    tracing::info!(
        idle_reads_per_version_per_min = idle.reads_per_version_per_min,
        busy_reads_per_version_per_min = busy.reads_per_version_per_min,
        "autoscaling: backlog reads counted"
    );

    let summary = |f: fn(&Round) -> Option<f64>| {
        Summary::of(&measured.iter().filter_map(f).collect::<Vec<_>>())
    };
    Ok(Autoscaling {
        rate_per_s: RATE,
        min_replicas: MIN_REPLICAS,
        max_replicas: MAX_REPLICAS,
        backlog_per_replica: BACKLOG_PER_REPLICA,
        scale_down_window_s: SCALE_DOWN_WINDOW.as_secs_f64(),
        idle_read_interval_s: idle_period.as_secs_f64(),
        busy_read_interval_s: millis(BUSY_READ_MS).as_secs_f64(),
        backlog_seen_to_scale_up_s: summary(|r| Some(r.backlog_seen_to_scale_up_s)),
        backlog_start_to_scale_up_s: summary(|r| Some(r.backlog_start_to_scale_up_s)),
        scaling_read_to_scale_up_ms: summary(|r| r.scaling_read_to_scale_up_ms),
        load_to_backlog_seen_s: summary(|r| Some(r.load_to_backlog_seen_s)),
        rounds: measured,
        idle,
        busy,
    })
}

impl Scenario<'_> {
    /// Waits until the version is idle at its minimum, then starts the load `offset` into one
    /// of the controller's idle read periods and times the first scale-up.
    async fn round(&self, round: usize, offset: Duration) -> anyhow::Result<Round> {
        let last_read = self.settle().await?;
        let start = load_start(last_read, offset, millis(IDLE_READ_MS), SystemTime::now());
        tokio::time::sleep(
            start
                .duration_since(SystemTime::now())
                .unwrap_or(Duration::ZERO),
        )
        .await;
        let load = self.load(&format!("r{round}")).await?;
        let started = SystemTime::now();
        let watched = tokio::try_join!(self.first_backlog(), self.first_scale_up());
        load.stop().await.context("stopping the load generator")?;
        let (seen, (scaled_at, replicas)) = watched?;

        let history = self.scaling_history().await?;
        let previous_read = history
            .reads
            .iter()
            .rev()
            .find(|r| r.scheduled <= started)
            .map_or(last_read, |r| r.scheduled);
        let scale_requested = history.scales.iter().find(|at| **at >= started).copied();
        let scaling_read = scale_requested.and_then(|at| {
            history
                .reads
                .iter()
                .rev()
                .find(|r| r.scheduled <= at && r.scheduled >= started)
        });
        let earlier_read_backlogs = history
            .reads
            .iter()
            .filter(|r| {
                r.scheduled >= started && scaling_read.is_some_and(|s| r.scheduled < s.scheduled)
            })
            .map(|r| r.backlog)
            .collect();
        let backlog_start = seen.at.checked_sub(seen.age).unwrap_or(seen.at);
        Ok(Round {
            load_after_previous_read_s: seconds_between(previous_read, started),
            load_to_backlog_seen_s: seconds_between(started, seen.at),
            backlog_seen: seen.backlog,
            backlog_age_s: seen.age.as_secs_f64(),
            backlog_seen_to_scale_up_s: seconds_between(seen.at, scaled_at),
            backlog_start_to_scale_up_s: seconds_between(backlog_start, scaled_at),
            replicas,
            scaling_read_to_scale_up_ms: scaling_read
                .map(|r| seconds_between(r.scheduled, scaled_at) * 1000.0),
            scaling_read_backlog: scaling_read.and_then(|r| r.backlog),
            earlier_read_backlogs,
        })
    }

    /// Waits until the Deployment is at its minimum, the version has no backlog and the
    /// controller reads at its idle cadence (its last `read_backlog` found no backlog, or none
    /// came for longer than its busy interval); returns when its last read was scheduled.
    async fn settle(&self) -> anyhow::Result<SystemTime> {
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        let settled = millis(BUSY_READ_MS) + SETTLE_MARGIN;
        loop {
            let mut wait = BACKLOG_POLL;
            let state = match self.replicas().await? {
                Some(MIN_REPLICAS) => match self.backlog().await?.0 {
                    0 => match self.scaling_history().await?.reads.last() {
                        Some(last) => {
                            let quiet = SystemTime::now()
                                .duration_since(last.scheduled)
                                .unwrap_or(Duration::ZERO);
                            if last.backlog == Some(0) || quiet >= settled {
                                return Ok(last.scheduled);
                            }
                            wait = settled - quiet;
                            format!("last backlog read {:.1} s ago", quiet.as_secs_f64())
                        }
                        None => "no backlog read yet".to_owned(),
                    },
                    backlog => format!("backlog {backlog}"),
                },
                other => format!("replicas {other:?}"),
            };
            if Instant::now() >= deadline {
                bail!(
                    "{}/{NAME} not idle at {MIN_REPLICAS} replica after {SETTLE_TIMEOUT:?} \
                     ({state})",
                    self.namespace
                );
            }
            tokio::time::sleep(wait).await;
        }
    }

    /// Counts backlog reads over `window` (with `load` running, if any).
    async fn read_window(
        &self,
        window: Duration,
        load: Option<&LoadGenerator>,
    ) -> anyhow::Result<ReadWindow> {
        let before = self.controller_version_reads().await?;
        let from = SystemTime::now();
        tokio::time::sleep(window).await;
        let to = SystemTime::now();
        let after = self.controller_version_reads().await?;
        let history = self.scaling_history().await?;
        Ok(ReadWindow {
            workflows_started: load.map_or(0, |l| l.stats().started),
            ..history.window(from, to, after - before)
        })
    }

    /// Starts the load, workflow IDs `<namespace>-<label>-<n>`.
    async fn load(&self, label: &str) -> anyhow::Result<LoadGenerator> {
        LoadGenerator::start(LoadConfig {
            namespace: self.cluster.env.temporal_namespace.clone(),
            task_queue: self.task_queue.clone(),
            workflow_type: "HelloWorld".to_owned(),
            id_prefix: format!("{}-{label}-", self.namespace),
            ..LoadConfig::new(self.cluster.env.temporal_address.clone(), RATE)
        })
        .await
        .context("starting the load generator")
    }

    /// Polls the version's task-queue statistics until they show a backlog.
    async fn first_backlog(&self) -> anyhow::Result<BacklogSeen> {
        let deadline = Instant::now() + SCALE_UP_TIMEOUT;
        loop {
            let last = match self.backlog().await {
                Ok((0, _)) => "no backlog".to_owned(),
                Ok((backlog, age)) => {
                    return Ok(BacklogSeen {
                        at: SystemTime::now(),
                        backlog,
                        age,
                    });
                }
                Err(e) => format!("{e:#}"),
            };
            if Instant::now() >= deadline {
                bail!(
                    "{}:{}: no backlog seen within {SCALE_UP_TIMEOUT:?} of load ({last})",
                    self.deployment_name,
                    self.build
                );
            }
            tokio::time::sleep(BACKLOG_POLL).await;
        }
    }

    /// Polls the Deployment until its `spec.replicas` is above the minimum; returns when it was
    /// seen so, and the count.
    async fn first_scale_up(&self) -> anyhow::Result<(SystemTime, i32)> {
        let deadline = Instant::now() + SCALE_UP_TIMEOUT;
        loop {
            let last = match self.replicas().await {
                Ok(Some(r)) if r > MIN_REPLICAS => return Ok((SystemTime::now(), r)),
                Ok(other) => format!("replicas {other:?}"),
                Err(e) => format!("{e:#}"),
            };
            if Instant::now() >= deadline {
                bail!(
                    "{}/{NAME}: no scale-up within {SCALE_UP_TIMEOUT:?} of load ({last})",
                    self.namespace
                );
            }
            tokio::time::sleep(REPLICAS_POLL).await;
        }
    }

    /// `spec.replicas` of the build's Deployment (`None`: unset).
    async fn replicas(&self) -> anyhow::Result<Option<i32>> {
        let api: Api<Deployment> = Api::namespaced(self.cluster.kube.clone(), self.namespace);
        let list = api
            .list(&ListParams::default())
            .await
            .with_context(|| format!("listing the Deployments of {}", self.namespace))?;
        list.items
            .iter()
            .find(|d| {
                d.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(twc_crds::labels::BUILD_ID))
                    .is_some_and(|b| *b == self.build)
            })
            .map(|d| d.spec.as_ref().and_then(|s| s.replicas))
            .ok_or_else(|| anyhow!("{}: no Deployment of build {}", self.namespace, self.build))
    }

    /// Waiting tasks over the version's task queues and the oldest one's age, as Temporal
    /// reports them.
    async fn backlog(&self) -> anyhow::Result<(u64, Duration)> {
        let queues = self
            .cluster
            .version_task_queues(&self.deployment_name, &self.build)
            .await?;
        let stats = queues.iter().filter_map(|q| q.stats.as_ref());
        let backlog = stats
            .clone()
            .map(|s| u64::try_from(s.approximate_backlog_count).unwrap_or(0))
            .sum();
        let age = stats
            .filter_map(|s| s.approximate_backlog_age.as_ref())
            .map(|a| {
                Duration::new(
                    u64::try_from(a.seconds).unwrap_or(0),
                    u32::try_from(a.nanos).unwrap_or(0),
                )
            })
            .max()
            .unwrap_or(Duration::ZERO);
        Ok((backlog, age))
    }

    /// The autoscaling activities of the TWD workflow, every run.
    async fn scaling_history(&self) -> anyhow::Result<ScalingHistory> {
        let runs = self.cluster.histories(&self.workflow_id).await?;
        ScalingHistory::of(&runs).with_context(|| format!("reading {}", self.workflow_id))
    }

    /// The controller's `DescribeWorkerDeploymentVersion` calls so far.
    async fn controller_version_reads(&self) -> anyhow::Result<f64> {
        let url = self
            .cluster
            .env
            .controller_metrics_url
            .as_deref()
            .ok_or_else(|| anyhow!("the sandbox runs no controller"))?;
        Ok(prom::sum(
            &scrape(url).await?,
            "twc_temporal_requests_total",
            |s| s.label("operation") == Some("DescribeWorkerDeploymentVersion"),
        ))
    }
}

impl ScalingHistory {
    /// The `read_backlog` and `scale_deployment` activities of `runs` (each a run's events).
    fn of(runs: &[Vec<HistoryEvent>]) -> anyhow::Result<Self> {
        let mut history = Self::default();
        for events in runs {
            // Scheduled event ID → index in `reads`, for the results.
            let mut scheduled = HashMap::new();
            for event in events {
                let at = system_time(event.event_time.as_ref());
                match &event.attributes {
                    Some(Attributes::ActivityTaskScheduledEventAttributes(a)) => {
                        let kind = a.activity_type.as_ref().map(|t| t.name.as_str());
                        let at = at.ok_or_else(|| anyhow!("event {} has no time", event.event_id));
                        if kind == Some(ReadBacklog::NAME) {
                            let request: BacklogRequest = decode(a.input.as_ref())
                                .with_context(|| format!("input of event {}", event.event_id))?;
                            scheduled.insert(event.event_id, history.reads.len());
                            history.reads.push(BacklogRead {
                                scheduled: at?,
                                build_ids: request.build_ids,
                                backlog: None,
                            });
                        } else if kind == Some(ScaleDeployment::NAME) {
                            history.scales.push(at?);
                        }
                    }
                    Some(Attributes::ActivityTaskCompletedEventAttributes(a)) => {
                        if let Some(&index) = scheduled.get(&a.scheduled_event_id) {
                            let report: BacklogReport = decode(a.result.as_ref())
                                .with_context(|| format!("result of event {}", event.event_id))?;
                            history.reads[index].backlog =
                                Some(report.versions.iter().map(|v| v.backlog).sum());
                        }
                    }
                    _ => {}
                }
            }
        }
        history.reads.sort_by_key(|r| r.scheduled);
        history.scales.sort();
        Ok(history)
    }

    /// The reads and changes scheduled in `[from, to)`; `controller_version_reads` is the
    /// controller's own count of version reads over the same time.
    fn window(
        &self,
        from: SystemTime,
        to: SystemTime,
        controller_version_reads: f64,
    ) -> ReadWindow {
        let within = |at: &SystemTime| (from..to).contains(at);
        let reads: Vec<&BacklogRead> = self.reads.iter().filter(|r| within(&r.scheduled)).collect();
        let version_reads = |reads: &[&BacklogRead]| reads.iter().map(|r| r.build_ids.len()).sum();
        let versions = reads
            .iter()
            .flat_map(|r| &r.build_ids)
            .collect::<BTreeSet<_>>()
            .len()
            .max(1);
        let per_version_per_min =
            |reads: usize, seconds: f64| reads as f64 / versions as f64 / (seconds / 60.0);
        let window_s = seconds_between(from, to);
        let window_reads_per_version_per_min =
            per_version_per_min(version_reads(&reads), window_s.max(f64::EPSILON));
        let reads_per_version_per_min = match (reads.first(), reads.last()) {
            (Some(first), Some(last)) if last.scheduled > first.scheduled => per_version_per_min(
                version_reads(&reads[..reads.len() - 1]),
                seconds_between(first.scheduled, last.scheduled),
            ),
            _ => window_reads_per_version_per_min,
        };
        ReadWindow {
            window_s,
            read_activities: reads.len(),
            version_reads: version_reads(&reads),
            versions,
            reads_per_version_per_min,
            window_reads_per_version_per_min,
            scale_changes: self.scales.iter().filter(|at| within(at)).count(),
            controller_version_reads_per_min: controller_version_reads / window_s.max(f64::EPSILON)
                * 60.0,
            workflows_started: 0,
        }
    }
}

/// The first payload of an activity's input or result, as JSON.
fn decode<T: DeserializeOwned>(payloads: Option<&Payloads>) -> anyhow::Result<T> {
    let payload = payloads
        .and_then(|p| p.payloads.first())
        .ok_or_else(|| anyhow!("no payload"))?;
    serde_json::from_slice(&payload.data).context("decoding the payload as JSON")
}

/// The first moment not before `earliest` that lies `offset` into one of the idle read periods
/// (`period` long) following a read at `last_read`.
fn load_start(
    last_read: SystemTime,
    offset: Duration,
    period: Duration,
    earliest: SystemTime,
) -> SystemTime {
    let mut at = last_read + offset;
    while at < earliest && !period.is_zero() {
        at += period;
    }
    at
}

/// A controller interval in milliseconds as a duration.
fn millis(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use temporalio_common::protos::temporal::api::common::v1::{ActivityType, Payload};
    use temporalio_common::protos::temporal::api::history::v1::{
        ActivityTaskCompletedEventAttributes, ActivityTaskScheduledEventAttributes,
    };

    use super::*;

    fn at(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + s)
    }

    fn payloads(value: Value) -> Option<Payloads> {
        Some(Payloads {
            payloads: vec![Payload {
                data: value.to_string().into_bytes(),
                ..Default::default()
            }],
        })
    }

    fn event(id: i64, s: u64, attributes: Attributes) -> HistoryEvent {
        HistoryEvent {
            event_id: id,
            event_time: Some(prost_wkt_types::Timestamp {
                seconds: i64::try_from(1_700_000_000 + s).unwrap_or(0),
                nanos: 0,
            }),
            attributes: Some(attributes),
            ..Default::default()
        }
    }

    fn scheduled(id: i64, s: u64, name: &str, input: Value) -> HistoryEvent {
        event(
            id,
            s,
            Attributes::ActivityTaskScheduledEventAttributes(
                ActivityTaskScheduledEventAttributes {
                    activity_type: Some(ActivityType {
                        name: name.to_owned(),
                    }),
                    input: payloads(input),
                    ..Default::default()
                },
            ),
        )
    }

    fn completed(id: i64, s: u64, scheduled_event_id: i64, result: Value) -> HistoryEvent {
        event(
            id,
            s,
            Attributes::ActivityTaskCompletedEventAttributes(
                ActivityTaskCompletedEventAttributes {
                    scheduled_event_id,
                    result: payloads(result),
                    ..Default::default()
                },
            ),
        )
    }

    fn read(id: i64, s: u64, builds: &[&str]) -> HistoryEvent {
        let twd = json!({ "namespace": "ns", "name": "autoscale" });
        scheduled(
            id,
            s,
            ReadBacklog::NAME,
            json!({ "twd": twd, "build_ids": builds }),
        )
    }

    fn report(id: i64, s: u64, scheduled_event_id: i64, backlogs: &[u64]) -> HistoryEvent {
        let versions: Vec<Value> = backlogs
            .iter()
            .map(|b| {
                json!({ "build_id": "v1", "backlog": b, "backlog_age_ms": 0, "add_rate": 0.0,
                "dispatch_rate": 0.0, "task_queues": [], "error": null })
            })
            .collect();
        completed(id, s, scheduled_event_id, json!({ "versions": versions }))
    }

    #[test]
    fn backlog_reads_and_scale_changes_are_read_from_every_run_of_the_history() {
        let scale = json!({ "namespace": "ns", "name": "autoscale-v1", "replicas": 2 });
        let runs = vec![
            vec![
                read(5, 0, &["v1"]),
                report(7, 1, 5, &[0]),
                scheduled(9, 2, "observe", json!({})),
                read(11, 30, &["v1", "v2"]),
                report(13, 31, 11, &[4, 2]),
                scheduled(14, 31, ScaleDeployment::NAME, scale),
            ],
            // The next run reuses event IDs.
            vec![read(5, 36, &["v1"])],
        ];
        let history = ScalingHistory::of(&runs).expect("decodes");
        assert_eq!(
            history,
            ScalingHistory {
                reads: vec![
                    BacklogRead {
                        scheduled: at(0),
                        build_ids: vec!["v1".into()],
                        backlog: Some(0),
                    },
                    BacklogRead {
                        scheduled: at(30),
                        build_ids: vec!["v1".into(), "v2".into()],
                        backlog: Some(6),
                    },
                    BacklogRead {
                        scheduled: at(36),
                        build_ids: vec!["v1".into()],
                        backlog: None,
                    },
                ],
                scales: vec![at(31)],
            }
        );
    }

    #[test]
    fn reads_per_version_per_minute_count_each_version_a_read_covers_over_whole_read_periods() {
        let reads = |every: u64, builds: &[&str]| ScalingHistory {
            reads: (0..6)
                .map(|i| BacklogRead {
                    scheduled: at(10 + i * every),
                    build_ids: builds.iter().map(|b| (*b).to_owned()).collect(),
                    backlog: Some(0),
                })
                .collect(),
            scales: vec![at(41), at(200)],
        };
        // Reads at 10, 40 and 70 s in [0, 80): two read periods in one minute, three reads in
        // 80 s.
        let idle = reads(30, &["v1"]).window(at(0), at(80), 4.0);
        assert_eq!(
            (idle.read_activities, idle.version_reads, idle.versions),
            (3, 3, 1)
        );
        assert_eq!(idle.reads_per_version_per_min, 2.0);
        assert_eq!(idle.window_reads_per_version_per_min, 2.25);
        assert_eq!(idle.controller_version_reads_per_min, 3.0);
        assert_eq!(idle.scale_changes, 1);
        // Each read covers both versions: each version is read as often as the reads come.
        let two = reads(5, &["v1", "v2"]).window(at(0), at(60), 0.0);
        assert_eq!(
            (two.read_activities, two.version_reads, two.versions),
            (6, 12, 2)
        );
        assert_eq!(two.reads_per_version_per_min, 12.0);
        assert_eq!(two.window_reads_per_version_per_min, 6.0);
        // One read: the window figure.
        let one = reads(100, &["v1"]).window(at(0), at(60), 0.0);
        assert_eq!(one.read_activities, 1);
        assert_eq!(one.reads_per_version_per_min, 1.0);
    }

    #[test]
    fn an_activity_input_that_is_not_a_backlog_request_is_an_error() {
        assert!(ScalingHistory::of(&[vec![read(1, 0, &["v1"])]]).is_ok());
        assert!(
            ScalingHistory::of(&[vec![scheduled(1, 0, ReadBacklog::NAME, json!(7))]]).is_err(),
            "not a read of no version"
        );
    }

    #[test]
    fn load_starts_at_the_chosen_moment_of_the_next_idle_read_period_not_yet_past() {
        let period = Duration::from_secs(30);
        let cases = [
            ("offset still ahead", 9, 5, 9),
            ("offset already past: the next period", 3, 7, 33),
            ("two periods past", 3, 40, 63),
        ];
        for (name, offset, now, expected) in cases {
            assert_eq!(
                load_start(at(0), Duration::from_secs(offset), period, at(now)),
                at(expected),
                "{name}"
            );
        }
    }
}
