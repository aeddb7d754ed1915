//! Reaction latency (apply of a new image → versioned Deployment exists, and the benchmark's own
//! TWD watch seeing the new generation → its Deployment watch seeing the Deployment) and
//! promotion latency (the new build's first poller → routing Current), over repeated AllAtOnce
//! rollouts of one TWD. Each rollout starts from rest: the previous build Current and the
//! controller idle.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, anyhow};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use serde::Serialize;
use serde_json::json;
use tokio::sync::mpsc;
use twc_crds::TemporalWorkerDeployment;

use twc_workflows::model::TwdRef;

use crate::cluster::{Cluster, seconds_between, system_time, worker};
use crate::ledger::{
    HopSummary, PromotionLedger, ReactionInput, ReactionLedger, Timeline, summarize, tally,
};
use crate::sampler::{CallTime, ServerTime, wait_quiet};
use crate::stats::Summary;

/// How long the controller must have been idle before a rollout starts.
const QUIET: Duration = Duration::from_secs(3);
/// How long one rollout (or its clean-up) may take before the benchmark gives up.
const ROLLOUT_TIMEOUT: Duration = Duration::from_secs(180);
/// How long after Ready the TWD's status may take to show the build Current before the
/// status lag is reported missing.
const STATUS_TIMEOUT: Duration = Duration::from_secs(30);

/// One rollout's measurements.
#[derive(Debug, Clone, Serialize)]
pub struct Rollout {
    /// Build ID rolled out.
    pub build_id: String,
    /// Apply → versioned Deployment seen by a watch, ms.
    pub reaction_ms: f64,
    /// The new generation of the TWD seen by the benchmark's TWD watch → the versioned
    /// Deployment seen by its Deployment watch, ms (the controller's share of the reaction:
    /// the apply's own round trip and the API server's watch fan-out are left out).
    pub watch_reaction_ms: f64,
    /// First poller of the build (version created in Temporal) → build Current, ms (server
    /// timestamps).
    pub promotion_ms: f64,
    /// The Deployment seen Available by a watch → build Current in Temporal, ms (the
    /// controller's own share of the promotion: the rest is pods becoming ready).
    pub available_to_current_ms: f64,
    /// Apply → TWD Ready for the build, ms.
    pub apply_to_ready_ms: f64,
    /// The build Current in Temporal (`currentVersionChangedTime`) → the benchmark's TWD watch
    /// first shows it as `status.currentVersion`, ms; `None` when the watch never did.
    pub status_lag_ms: Option<f64>,
    /// Events in the rollout workflow's history (every run), read once the controller is
    /// quiet after the last rollout; `None` when it could not be read.
    pub rollout_history_events: Option<usize>,
    /// Where the reaction's time went.
    pub reaction_hops: ReactionLedger,
    /// Where the promotion's time went.
    pub promotion_hops: PromotionLedger,
}

/// The latency results.
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    /// Every rollout.
    pub rollouts: Vec<Rollout>,
    /// Reaction latency, ms.
    pub reaction_ms: Option<Summary>,
    /// Reaction from the TWD watch event, ms.
    pub watch_reaction_ms: Option<Summary>,
    /// Promotion latency, ms.
    pub promotion_ms: Option<Summary>,
    /// Available → Current, ms.
    pub available_to_current_ms: Option<Summary>,
    /// Apply → Ready, ms.
    pub apply_to_ready_ms: Option<Summary>,
    /// Current in Temporal → the TWD's status shows it, ms.
    pub status_lag_ms: Option<Summary>,
    /// Rollouts whose status never showed the build Current within [`STATUS_TIMEOUT`].
    pub status_lag_missing: usize,
    /// Events per rollout workflow (every run).
    pub rollout_history_events: Option<Summary>,
    /// The reaction's hops over the rollouts.
    pub reaction_hops: Vec<HopSummary>,
    /// The promotion's hops over the rollouts.
    pub promotion_hops: Vec<HopSummary>,
    /// What the TWD workflow ran between the signal and the child's start (description →
    /// rollouts).
    pub twd_between: Vec<(String, usize)>,
    /// What the rollout ran before scheduling `create_deployment`.
    pub rollout_between: Vec<(String, usize)>,
    /// What the rollout ran between `wait_for_pollers` and `set_routing`.
    pub wait_to_routing_between: Vec<(String, usize)>,
    /// Temporal's own time per worker-deployment call while the measured rollouts ran.
    pub temporal_calls: Vec<CallTime>,
}

/// What a rollout's ledgers are read from once the controller is quiet.
struct Pending {
    build_id: String,
    generation: i64,
    watch_seen: Option<SystemTime>,
    deployment_seen: Option<SystemTime>,
    available: SystemTime,
    current_since: Option<SystemTime>,
    status_seen: Option<SystemTime>,
}

/// What the watches report (Deployment appearances and availability, TWD generations;
/// deletions do not matter).
#[derive(Debug)]
pub enum Seen {
    /// The Deployment watch's initial list is complete.
    Listed,
    /// The TWD watch's initial list is complete.
    TwdsListed,
    /// A Deployment appeared (the monotonic and the wall clock of the watch event).
    Created(String, Instant, SystemTime),
    /// A Deployment became Available.
    Available(String, SystemTime),
    /// A TWD was seen with this `metadata.generation` (monotonic and wall clock).
    Generation(String, i64, Instant, SystemTime),
    /// A TWD's status as the watch event showed it.
    Status(String, StatusView, SystemTime),
}

/// The routing a TWD's status shows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StatusView {
    /// `status.currentVersion.buildID`.
    pub current: Option<String>,
    /// `status.targetVersion.buildID` and its `rampPercentage` (when ramping).
    pub target: Option<(String, Option<f32>)>,
}

impl StatusView {
    fn of(twd: &TemporalWorkerDeployment) -> Self {
        let Some(status) = &twd.status else {
            return Self::default();
        };
        Self {
            current: status.current_version.as_ref().map(|v| v.build_id.clone()),
            target: status
                .target_version
                .as_ref()
                .map(|t| (t.version.build_id.clone(), t.ramp_percentage)),
        }
    }
}

/// The namespace's Deployments and TWDs as the watches have reported them so far.
#[derive(Debug, Default)]
pub struct Tracker {
    /// Deployment name → when the watch first reported it.
    pub created: BTreeMap<String, Instant>,
    /// Deployment name → when the watch first reported it, wall clock.
    pub created_at: BTreeMap<String, SystemTime>,
    /// Deployment name → when the watch first reported it Available.
    pub available: BTreeMap<String, SystemTime>,
    /// (TWD name, generation) → when the watch first reported that generation.
    pub generations: BTreeMap<(String, i64), Instant>,
    /// (TWD name, generation) → when the watch first reported it, wall clock.
    pub generations_at: BTreeMap<(String, i64), SystemTime>,
    /// (TWD name, build ID) → when the watch first showed that build as the status's current
    /// version.
    pub current_seen: BTreeMap<(String, String), SystemTime>,
    /// (TWD name, build ID, ramp %) → when the watch first showed that build as the status's
    /// target ramping at that percentage (rounded).
    pub ramp_seen: BTreeMap<(String, String, u32), SystemTime>,
    deployments_listed: bool,
    twds_listed: bool,
}

impl Tracker {
    /// Records one report.
    pub fn note(&mut self, seen: Seen) {
        match seen {
            Seen::Listed => self.deployments_listed = true,
            Seen::TwdsListed => self.twds_listed = true,
            Seen::Created(name, at, wall) => {
                self.created.entry(name.clone()).or_insert(at);
                self.created_at.entry(name).or_insert(wall);
            }
            Seen::Available(name, at) => {
                self.available.entry(name).or_insert(at);
            }
            Seen::Generation(name, generation, at, wall) => {
                self.generations
                    .entry((name.clone(), generation))
                    .or_insert(at);
                self.generations_at
                    .entry((name, generation))
                    .or_insert(wall);
            }
            Seen::Status(name, view, wall) => {
                if let Some(current) = view.current {
                    self.current_seen
                        .entry((name.clone(), current))
                        .or_insert(wall);
                }
                if let Some((build, Some(ramp))) = view.target {
                    self.ramp_seen
                        .entry((name, build, ramp.round() as u32))
                        .or_insert(wall);
                }
            }
        }
    }

    /// The newest generation of TWD `name` seen so far (0 when none).
    pub fn generation(&self, name: &str) -> i64 {
        self.generations
            .keys()
            .filter(|(n, _)| n == name)
            .map(|(_, g)| *g)
            .max()
            .unwrap_or(0)
    }
}

/// Watches the Deployments and the TWDs of `namespace`, reporting Deployment appearances and
/// availability and TWD generations, each stamped when the watch event arrived. Returns once
/// both watches have listed.
pub async fn watch(
    cluster: &Cluster,
    namespace: &str,
) -> anyhow::Result<(mpsc::UnboundedReceiver<Seen>, Tracker)> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    watch_deployments(cluster, namespace, tx.clone());
    watch_twds(cluster, namespace, tx);
    let mut tracker = Tracker::default();
    let deadline = tokio::time::Instant::now() + ROLLOUT_TIMEOUT;
    while !(tracker.deployments_listed && tracker.twds_listed) {
        let next = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .map_err(|_| {
                anyhow!("the watches of {namespace} did not list within {ROLLOUT_TIMEOUT:?}")
            })?
            .ok_or_else(|| anyhow!("a watch of {namespace} ended before listing"))?;
        tracker.note(next);
    }
    Ok((rx, tracker))
}

/// Watches the TWDs of `namespace`, reporting each generation and status.
fn watch_twds(cluster: &Cluster, namespace: &str, tx: mpsc::UnboundedSender<Seen>) {
    let api: Api<TemporalWorkerDeployment> = Api::namespaced(cluster.kube.clone(), namespace);
    tokio::spawn(async move {
        let mut events = Box::pin(watcher(api, watcher::Config::default()).default_backoff());
        while let Some(event) = events.next().await {
            let (now, wall) = (Instant::now(), SystemTime::now());
            let seen = match event {
                Ok(watcher::Event::InitDone) => vec![Seen::TwdsListed],
                Ok(watcher::Event::Apply(t) | watcher::Event::InitApply(t)) => {
                    let name = t.metadata.name.clone().unwrap_or_default();
                    vec![
                        Seen::Generation(
                            name.clone(),
                            t.metadata.generation.unwrap_or(0),
                            now,
                            wall,
                        ),
                        Seen::Status(name, StatusView::of(&t), wall),
                    ]
                }
                Ok(watcher::Event::Init | watcher::Event::Delete(_)) | Err(_) => continue,
            };
            for s in seen {
                if tx.send(s).is_err() {
                    return;
                }
            }
        }
    });
}

/// Watches the Deployments of `namespace`, reporting appearances and availability.
fn watch_deployments(cluster: &Cluster, namespace: &str, tx: mpsc::UnboundedSender<Seen>) {
    let api: Api<Deployment> = Api::namespaced(cluster.kube.clone(), namespace);
    tokio::spawn(async move {
        let mut events = Box::pin(watcher(api, watcher::Config::default()).default_backoff());
        while let Some(event) = events.next().await {
            let (now, wall) = (Instant::now(), SystemTime::now());
            let seen = match event {
                Ok(watcher::Event::InitDone) => vec![Seen::Listed],
                Ok(watcher::Event::Apply(d) | watcher::Event::InitApply(d)) => {
                    let name = d.metadata.name.clone().unwrap_or_default();
                    let mut seen = vec![Seen::Created(name.clone(), now, wall)];
                    if is_available(&d) {
                        seen.push(Seen::Available(name, wall));
                    }
                    seen
                }
                Ok(watcher::Event::Init | watcher::Event::Delete(_)) | Err(_) => Vec::new(),
            };
            for s in seen {
                if tx.send(s).is_err() {
                    return;
                }
            }
        }
    });
}

fn is_available(d: &Deployment) -> bool {
    d.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "Available" && c.status == "True")
        })
}

/// Rolls out `count` new images one after the other (AllAtOnce).
pub async fn run(cluster: &Cluster, namespace: &str, count: usize) -> anyhow::Result<Latency> {
    cluster.namespace(namespace).await?;
    let name = "latency";
    let rollout = json!({ "strategy": "AllAtOnce" });
    // Measure only once the watches are established.
    let (mut seen, mut tracker) = watch(cluster, namespace).await?;
    cluster
        .apply(&worker(
            namespace,
            &cluster.env.temporal_namespace,
            name,
            "lat0",
            rollout.clone(),
        ))
        .await?;
    wait_ready(cluster, namespace, name, "lat0-").await?;

    let deployment_name = format!("{namespace}/{name}");
    let server_time_before = ServerTime::read(&cluster.env).await?;
    let mut rollouts = Vec::with_capacity(count);
    let mut pending = Vec::with_capacity(count);
    for i in 1..=count {
        // From rest: the controller idle for a while (as when someone applies a change minutes
        // after the last one). Older builds may still be draining: the controller only looks
        // at them every 30 s, and waiting for their retirement would make the run long.
        wait_quiet(cluster, QUIET, ROLLOUT_TIMEOUT).await?;
        let tag = format!("lat{i}");
        let prefix = format!("{name}-{tag}-");
        // Reports that arrived while idle (status writes) carry no new generation.
        while let Ok(next) = seen.try_recv() {
            tracker.note(next);
        }
        let old_generation = tracker.generation(name);
        let applied = Instant::now();
        cluster
            .apply(&worker(
                namespace,
                &cluster.env.temporal_namespace,
                name,
                &tag,
                rollout.clone(),
            ))
            .await?;
        let (deployment, created) = wait_for(
            &mut seen,
            &mut tracker,
            &format!("Deployment {prefix}*"),
            |t| {
                t.created
                    .iter()
                    .find(|(n, _)| n.starts_with(&prefix))
                    .map(|(n, at)| (n.clone(), *at))
            },
        )
        .await?;
        let (generation, changed) = wait_for(
            &mut seen,
            &mut tracker,
            &format!("TWD {name} generation > {old_generation}"),
            |t| {
                t.generations
                    .iter()
                    .filter(|((n, g), _)| n == name && *g > old_generation)
                    .map(|((_, g), at)| (*g, *at))
                    .min_by_key(|(_, at)| *at)
            },
        )
        .await?;
        let watch_seen = tracker
            .generations_at
            .get(&(name.to_owned(), generation))
            .copied();
        let deployment_seen = tracker.created_at.get(&deployment).copied();
        let ready = wait_ready(cluster, namespace, name, &format!("{tag}-")).await?;
        let available = wait_for(
            &mut seen,
            &mut tracker,
            &format!("{prefix}* Available"),
            |t| {
                t.available
                    .iter()
                    .find(|(n, _)| n.starts_with(&prefix))
                    .map(|(_, at)| *at)
            },
        )
        .await?;
        let routing = cluster
            .describe_deployment(&cluster.env.temporal_namespace, &deployment_name)
            .await?
            .routing_config
            .unwrap_or_default();
        let build_id = routing
            .current_deployment_version
            .map(|v| v.build_id)
            .filter(|b| !b.is_empty())
            .ok_or_else(|| anyhow!("{deployment_name} has no current version"))?;
        let current_since = system_time(routing.current_version_changed_time.as_ref());
        let status_seen = wait_within(&mut seen, &mut tracker, STATUS_TIMEOUT, |t| {
            t.current_seen
                .get(&(name.to_owned(), build_id.clone()))
                .copied()
        })
        .await;
        let version = cluster
            .describe_version(&cluster.env.temporal_namespace, &deployment_name, &build_id)
            .await?;
        let first_poller = system_time(version.create_time.as_ref())
            .ok_or_else(|| anyhow!("version {build_id} has no create time"))?;
        let current = system_time(version.current_since_time.as_ref())
            .ok_or_else(|| anyhow!("version {build_id} was never current"))?;
        pending.push(Pending {
            build_id: build_id.clone(),
            generation,
            watch_seen,
            deployment_seen,
            available,
            current_since,
            status_seen,
        });
        let measured = Rollout {
            status_lag_ms: current_since
                .zip(status_seen)
                .map(|(c, s)| seconds_between(c, s) * 1e3),
            rollout_history_events: None,
            reaction_hops: ReactionLedger::default(),
            promotion_hops: PromotionLedger::default(),
            build_id,
            reaction_ms: created.saturating_duration_since(applied).as_secs_f64() * 1e3,
            watch_reaction_ms: created.saturating_duration_since(changed).as_secs_f64() * 1e3,
            promotion_ms: seconds_between(first_poller, current) * 1e3,
            available_to_current_ms: seconds_between(available, current) * 1e3,
            apply_to_ready_ms: ready.saturating_duration_since(applied).as_secs_f64() * 1e3,
        };
        tracing::info!(
            rollout = i,
            build = %measured.build_id,
            reaction_ms = measured.reaction_ms,
            watch_reaction_ms = measured.watch_reaction_ms,
            promotion_ms = measured.promotion_ms,
            available_to_current_ms = measured.available_to_current_ms,
            ready_ms = measured.apply_to_ready_ms,
            status_lag_ms = measured.status_lag_ms,
            "rolled out"
        );
        rollouts.push(measured);
    }
    let temporal_calls = ServerTime::read(&cluster.env)
        .await?
        .since(&server_time_before);
    // The histories are read once the controller is quiet, so the reads cost no rollout time.
    wait_quiet(cluster, QUIET, ROLLOUT_TIMEOUT).await?;
    read_ledgers(cluster, namespace, name, &pending, &mut rollouts).await;
    let column = |f: fn(&Rollout) -> f64| Summary::of(&rollouts.iter().map(f).collect::<Vec<_>>());
    let status_lags: Vec<f64> = rollouts.iter().filter_map(|r| r.status_lag_ms).collect();
    let events: Vec<f64> = rollouts
        .iter()
        .filter_map(|r| r.rollout_history_events)
        .map(|n| n as f64)
        .collect();
    let reaction: Vec<_> = rollouts.iter().map(|r| r.reaction_hops.hops()).collect();
    let promotion: Vec<_> = rollouts.iter().map(|r| r.promotion_hops.hops()).collect();
    Ok(Latency {
        temporal_calls,
        status_lag_missing: rollouts.len() - status_lags.len(),
        status_lag_ms: Summary::of(&status_lags),
        rollout_history_events: Summary::of(&events),
        reaction_hops: summarize(&reaction),
        promotion_hops: summarize(&promotion),
        twd_between: tally(
            rollouts
                .iter()
                .map(|r| r.reaction_hops.twd_between.as_ref()),
        ),
        rollout_between: tally(
            rollouts
                .iter()
                .map(|r| r.reaction_hops.rollout_between.as_ref()),
        ),
        wait_to_routing_between: tally(
            rollouts
                .iter()
                .map(|r| r.promotion_hops.wait_to_routing_between.as_ref()),
        ),
        reaction_ms: column(|r| r.reaction_ms),
        watch_reaction_ms: column(|r| r.watch_reaction_ms),
        promotion_ms: column(|r| r.promotion_ms),
        available_to_current_ms: column(|r| r.available_to_current_ms),
        apply_to_ready_ms: column(|r| r.apply_to_ready_ms),
        rollouts,
    })
}

/// Takes watch reports until `probe` gives a value, at most [`ROLLOUT_TIMEOUT`].
pub async fn wait_for<T>(
    seen: &mut mpsc::UnboundedReceiver<Seen>,
    tracker: &mut Tracker,
    what: &str,
    probe: impl Fn(&Tracker) -> Option<T>,
) -> anyhow::Result<T>
where
    T: Sized,
{
    let deadline = tokio::time::Instant::now() + ROLLOUT_TIMEOUT;
    loop {
        if let Some(value) = probe(tracker) {
            return Ok(value);
        }
        let next = tokio::time::timeout_at(deadline, seen.recv())
            .await
            .map_err(|_| anyhow!("no {what} within {ROLLOUT_TIMEOUT:?}"))?
            .ok_or_else(|| anyhow!("the watches ended"))?;
        tracker.note(next);
    }
}

/// Takes watch reports until `probe` gives a value; `None` when `timeout` passes (or the
/// watches end) first.
pub async fn wait_within<T>(
    seen: &mut mpsc::UnboundedReceiver<Seen>,
    tracker: &mut Tracker,
    timeout: Duration,
    probe: impl Fn(&Tracker) -> Option<T>,
) -> Option<T> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = probe(tracker) {
            return Some(value);
        }
        let next = tokio::time::timeout_at(deadline, seen.recv())
            .await
            .ok()??;
        tracker.note(next);
    }
}

/// Reads the engine workflows' histories and fills in each rollout's ledgers and history size.
/// A history that cannot be read leaves its hops missing (and says so in the log).
async fn read_ledgers(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
    pending: &[Pending],
    rollouts: &mut [Rollout],
) {
    let twd = TwdRef {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
    };
    let twd_timeline = match cluster.histories(&twd.twd_workflow_id()).await {
        Ok(runs) => Timeline::of(&runs),
        Err(e) => {
            tracing::warn!("reading the TWD workflow's history: {e:#}");
            Timeline::default()
        }
    };
    for (p, rollout) in pending.iter().zip(rollouts.iter_mut()) {
        let workflow_id = twd.rollout_workflow_id(&p.build_id);
        let timeline = match cluster.histories(&workflow_id).await {
            Ok(runs) => {
                let timeline = Timeline::of(&runs);
                rollout.rollout_history_events = Some(timeline.event_count());
                timeline
            }
            Err(e) => {
                tracing::warn!("reading the history of {workflow_id}: {e:#}");
                Timeline::default()
            }
        };
        rollout.reaction_hops = ReactionLedger::read(ReactionInput {
            twd: &twd_timeline,
            rollout: &timeline,
            generation: p.generation,
            rollout_workflow_id: &workflow_id,
            watch_seen: p.watch_seen,
            deployment_seen: p.deployment_seen,
        });
        rollout.promotion_hops =
            PromotionLedger::read(&timeline, Some(p.available), p.current_since, p.status_seen);
        tracing::info!(
            build = %p.build_id,
            events = ?rollout.rollout_history_events,
            reaction = ?rollout.reaction_hops,
            promotion = ?rollout.promotion_hops,
            "hop ledger"
        );
    }
}

async fn wait_ready(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
    prefix: &str,
) -> anyhow::Result<Instant> {
    let expected = BTreeMap::from([(name.to_owned(), prefix.to_owned())]);
    let ready = cluster
        .wait_all_ready(namespace, &expected, ROLLOUT_TIMEOUT)
        .await
        .with_context(|| format!("rolling out {namespace}/{name} build {prefix}*"))?;
    ready
        .get(name)
        .copied()
        .ok_or_else(|| anyhow!("{name} not Ready"))
}
