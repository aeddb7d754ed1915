//! Many TWDs at once: the change burst (a few rolled-out TWDs given a new image together, in
//! rounds: how soon and how close together their new Deployments are created, and when all are
//! Current), the burst (N TWDs applied together, time to all Ready, peak read rate, memory,
//! history size) and the idle cost of a fleet that is fully rolled out.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use anyhow::anyhow;
use futures::{StreamExt, TryStreamExt, stream};
use serde::Serialize;
use serde_json::json;
use twc_workflows::model::TwdRef;

use crate::actions::{self, Cost, DAY};
use crate::cluster::{Cluster, seconds_between, system_time, worker};
use crate::latency::{self, Tracker};
use crate::ledger::{
    BurstMilestones, IdleTurns, MilestoneSummary, QueueWaits, ReactionInput, Timeline,
    summarize_milestones,
};
use crate::procstat::{self, MachineCpu};
use crate::prom;
use crate::sampler::{CallTime, Counters, Page, Reads, Sampler, Tick, peak_rate_over, wait_quiet};
use crate::stats::Summary;

/// Applies in flight at once.
const APPLY_CONCURRENCY: usize = 16;
/// Concurrent reads after a burst (history lengths, version create times).
const READ_CONCURRENCY: usize = 8;
/// How long after the last new Deployment the TWD watch may take to report every new
/// generation before the missing ones are left out of the hop ledger.
const GENERATION_TIMEOUT: Duration = Duration::from_secs(30);

/// The burst results.
#[derive(Debug, Clone, Serialize)]
pub struct Burst {
    /// TWDs applied together.
    pub twds: usize,
    /// First apply → every TWD Ready, s.
    pub all_ready_after_apply_s: f64,
    /// The last build's first poller → every TWD Ready, s (the target compares with 60 s).
    pub all_ready_after_last_poller_s: f64,
    /// First apply → the last build's first poller, s (pods starting on this machine).
    pub last_poller_after_apply_s: f64,
    /// Per TWD: first apply → Ready, s.
    pub ready_after_apply_s: Option<Summary>,
    /// Highest worker-deployment read rate the Temporal frontend served, per second, over 10 s
    /// spans (its counters are published in batches).
    pub peak_server_reads_per_s: f64,
    /// Worker-deployment reads the Temporal frontend served per second, over the whole burst.
    pub mean_server_reads_per_s: f64,
    /// Highest rate of worker-deployment reads the controller sent (its read budget's grants),
    /// per second, over spans of at least 1 s between readings of its pages (timed by their own
    /// arrival): what reaches Temporal's per-namespace limit.
    pub peak_controller_reads_per_s: f64,
    /// The same for its reads counted as their answers arrived (`twc_temporal_requests_total`):
    /// answers that waited on a busy server arrive together, so this can exceed what was sent
    /// in any second.
    pub peak_controller_answered_reads_per_s: f64,
    /// Controller calls refused with ResourceExhausted during the burst (any cause).
    pub resource_exhausted_calls: f64,
    /// Calls the Temporal frontend refused because a worker deployment was busy applying a
    /// change (retried by the controller; not a budget problem).
    pub busy_refusals: f64,
    /// Calls the Temporal frontend refused for rate or concurrency limits (the budget).
    pub rate_limited_calls: f64,
    /// Controller resident set: highest sample, MiB.
    pub controller_peak_rss_mib: f64,
    /// Controller CPU during the burst, s.
    pub controller_cpu_s: f64,
    /// The machine's CPUs busy during the burst, % of all their time (`None`: not readable).
    pub machine_busy_pct: Option<f64>,
    /// The Temporal dev server's CPU during the burst, s (`None`: process not found).
    pub temporal_cpu_s: Option<f64>,
    /// Every other process's CPU during the burst (the sample workers, the kube-apiserver, the
    /// pod runner, the benchmark), s: the machine's busy time less Temporal's and the
    /// controller's.
    pub other_cpu_s: Option<f64>,
    /// Events in each rollout workflow's history.
    pub rollout_history_events: Option<Summary>,
    /// Events in each TWD workflow's history (current run).
    pub twd_history_events: Option<Summary>,
    /// Temporal's own time per worker-deployment call during the burst.
    pub temporal_calls: Vec<CallTime>,
    /// Controller replicas running (the read and refusal counts of the controller are their
    /// sums; RSS and CPU are the sandbox's own controller's).
    pub replicas: usize,
}

/// One round of the change burst: every TWD given a new image at once.
#[derive(Debug, Clone, Serialize)]
pub struct ChangeRound {
    /// Image tag (build ID prefix) of the round.
    pub tag: String,
    /// First apply sent → the last new Deployment seen by the benchmark's watch, ms.
    pub last_created_ms: f64,
    /// First → last new Deployment seen by the watch, ms (how close together they were created).
    pub created_spread_ms: f64,
    /// First apply sent → the last build Current in Temporal (its `currentVersionChangedTime`),
    /// ms.
    pub all_current_ms: f64,
    /// First apply sent → every TWD Ready for the new build (seen by a TWD watch), ms.
    pub all_ready_ms: f64,
    /// Per TWD: first apply sent → its new Deployment seen, ms.
    pub created_ms: Vec<f64>,
    /// Where the reactions queued: each TWD's milestones from its apply to its new Deployment.
    pub hop_ledger: BurstLedger,
}

/// The milestones of a round's reactions, read from the TWD and rollout workflows' histories
/// once the round is over and the controller quiet, and the benchmark's own watch events; all
/// in ms after the round's first apply sent (wall clock, Temporal's event times on the same
/// machine's clock).
#[derive(Debug, Clone, Default, Serialize)]
pub struct BurstLedger {
    /// Per TWD.
    pub reactions: Vec<TwdReaction>,
    /// Each milestone over the TWDs: when reached (min, p50, max), the spread (max − min), and
    /// the hop from the previous milestone.
    pub milestones: Vec<MilestoneSummary>,
    /// Tasks' waits for a worker (started − scheduled), for the tasks scheduled between the
    /// first apply sent and the last new Deployment seen.
    pub queue_waits_to_last_created: QueueWaits,
    /// The same, up to the last build Current in Temporal.
    pub queue_waits_to_all_current: QueueWaits,
    /// TWD and rollout workflow histories that could not be read (their milestones missing).
    pub unread_histories: usize,
}

/// One TWD's reaction in a round.
#[derive(Debug, Clone, Serialize)]
pub struct TwdReaction {
    /// The TWD's name.
    pub twd: String,
    /// The new build (Temporal's Current after the round).
    pub build_id: Option<String>,
    /// Its milestones.
    #[serde(flatten)]
    pub milestones: BurstMilestones,
}

/// What the benchmark saw of one TWD in a round.
struct Sighting {
    name: String,
    apply_sent: Option<SystemTime>,
    /// The new `metadata.generation` and when the TWD watch saw it.
    generation: Option<(i64, SystemTime)>,
    deployment_seen: Option<SystemTime>,
    build_id: Option<String>,
}

/// The change-burst results.
#[derive(Debug, Clone, Serialize)]
pub struct ChangeBurst {
    /// TWDs changed together.
    pub twds: usize,
    /// Every round.
    pub rounds: Vec<ChangeRound>,
    /// Apply → last new Deployment, ms, over the rounds.
    pub last_created_ms: Option<Summary>,
    /// First → last new Deployment, ms, over the rounds.
    pub created_spread_ms: Option<Summary>,
    /// Apply → every build Current, ms, over the rounds.
    pub all_current_ms: Option<Summary>,
    /// Apply → every TWD Ready, ms, over the rounds.
    pub all_ready_ms: Option<Summary>,
}

/// `count` TWDs named `c000`… in `namespace` (and in the Temporal namespace of that name) are
/// rolled out, then changed to a new image all at once `rounds` times, each round from rest.
pub async fn change_burst(
    cluster: &Cluster,
    namespace: &str,
    count: usize,
    rounds: usize,
) -> anyhow::Result<ChangeBurst> {
    let timeout = Duration::from_secs(600);
    cluster.namespace(namespace).await?;
    cluster.temporal_namespace(namespace).await?;
    let names: Vec<String> = (0..count).map(|i| format!("c{i:03}")).collect();
    let (mut seen, mut tracker) = latency::watch(cluster, namespace).await?;
    let ready_with = |tag: &str| -> BTreeMap<String, String> {
        names
            .iter()
            .map(|n| (n.clone(), format!("{tag}-")))
            .collect()
    };
    let expected = ready_with("chg0");
    tokio::try_join!(
        cluster.wait_all_ready(namespace, &expected, timeout),
        apply_all(cluster, namespace, &names, "chg0"),
    )?;
    let mut measured = Vec::with_capacity(rounds);
    for round in 1..=rounds {
        // From rest, as in the latency scenario.
        wait_quiet(cluster, Duration::from_secs(3), Duration::from_secs(180)).await?;
        let tag = format!("chg{round}");
        let prefixes: Vec<String> = names.iter().map(|n| format!("{n}-{tag}-")).collect();
        // Reports that arrived while idle carry no new generation.
        while let Ok(next) = seen.try_recv() {
            tracker.note(next);
        }
        let old_generations: BTreeMap<&str, i64> = names
            .iter()
            .map(|n| (n.as_str(), tracker.generation(n)))
            .collect();
        let applied = Instant::now();
        let applied_at = SystemTime::now();
        let expected = ready_with(&tag);
        let (ready, sent) = tokio::try_join!(
            cluster.wait_all_ready(namespace, &expected, timeout),
            apply_all(cluster, namespace, &names, &tag),
        )?;
        let created: Vec<Instant> = latency::wait_for(
            &mut seen,
            &mut tracker,
            &format!("every Deployment *-{tag}-*"),
            |t| {
                prefixes
                    .iter()
                    .map(|p| {
                        t.created
                            .iter()
                            .find(|(n, _)| n.starts_with(p.as_str()))
                            .map(|(_, at)| *at)
                    })
                    .collect::<Option<Vec<Instant>>>()
            },
        )
        .await?;
        let first = created.iter().min().copied().unwrap_or(applied);
        let last = created.iter().max().copied().unwrap_or(applied);
        // The TWD watch reported each new generation before the Deployments, normally; a
        // generation it never reports leaves that TWD's watch milestone missing.
        let new_generation = |t: &Tracker, name: &str| {
            let old = old_generations.get(name).copied().unwrap_or(0);
            t.generations_at
                .iter()
                .filter(|((n, g), _)| n == name && *g > old)
                .map(|((_, g), at)| (*g, *at))
                .min_by_key(|(g, _)| *g)
        };
        latency::wait_within(&mut seen, &mut tracker, GENERATION_TIMEOUT, |t| {
            names
                .iter()
                .all(|n| new_generation(t, n).is_some())
                .then_some(())
        })
        .await;
        let deployment_names: Vec<String> =
            names.iter().map(|n| format!("{namespace}/{n}")).collect();
        let current = current_since(cluster, namespace, &deployment_names, &tag).await?;
        let last_current = current
            .values()
            .map(|(_, at)| *at)
            .max()
            .ok_or_else(|| anyhow!("no build became Current"))?;
        let sightings: Vec<Sighting> = names
            .iter()
            .zip(&prefixes)
            .map(|(name, prefix)| Sighting {
                name: name.clone(),
                apply_sent: sent.get(name).copied(),
                generation: new_generation(&tracker, name),
                deployment_seen: tracker
                    .created_at
                    .iter()
                    .find(|(n, _)| n.starts_with(prefix.as_str()))
                    .map(|(_, at)| *at),
                build_id: current
                    .get(&format!("{namespace}/{name}"))
                    .map(|(build, _)| build.clone()),
            })
            .collect();
        // The round's first apply sent: the origin of the milestones.
        let origin = sent.values().min().copied().unwrap_or(applied_at);
        let all_ready = ready.values().max().copied().unwrap_or(applied);
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let mut one = ChangeRound {
            last_created_ms: ms(last.saturating_duration_since(applied)),
            created_spread_ms: ms(last.saturating_duration_since(first)),
            all_current_ms: seconds_between(applied_at, last_current) * 1e3,
            all_ready_ms: ms(all_ready.saturating_duration_since(applied)),
            created_ms: created
                .iter()
                .map(|c| ms(c.saturating_duration_since(applied)))
                .collect(),
            hop_ledger: BurstLedger::default(),
            tag,
        };
        tracing::info!(
            round,
            last_created_ms = one.last_created_ms,
            created_spread_ms = one.created_spread_ms,
            all_current_ms = one.all_current_ms,
            all_ready_ms = one.all_ready_ms,
            "change burst"
        );
        // The histories are read once the controller is quiet, so the reads cost no round time.
        wait_quiet(cluster, Duration::from_secs(3), Duration::from_secs(180)).await?;
        one.hop_ledger = burst_ledger(cluster, namespace, &sightings, origin, last_current).await;
        for m in &one.hop_ledger.milestones {
            tracing::info!(
                round,
                milestone = %m.milestone,
                p50_ms = m.at_ms.as_ref().map(|s| s.median),
                spread_ms = m.spread_ms,
                hop_p50_ms = m.hop_ms.as_ref().map(|s| s.median),
                hop_max_ms = m.hop_ms.as_ref().map(|s| s.max),
                missing = m.missing,
                "change burst milestone"
            );
        }
        tracing::info!(
            round,
            to_last_created = ?one.hop_ledger.queue_waits_to_last_created,
            to_all_current = ?one.hop_ledger.queue_waits_to_all_current,
            "change burst queue waits"
        );
        measured.push(one);
    }
    let column =
        |f: fn(&ChangeRound) -> f64| Summary::of(&measured.iter().map(f).collect::<Vec<_>>());
    Ok(ChangeBurst {
        twds: count,
        last_created_ms: column(|r| r.last_created_ms),
        created_spread_ms: column(|r| r.created_spread_ms),
        all_current_ms: column(|r| r.all_current_ms),
        all_ready_ms: column(|r| r.all_ready_ms),
        rounds: measured,
    })
}

/// Per deployment name: its Current build, which has prefix `tag-`, and when it became Current
/// (Temporal's `currentVersionChangedTime`).
async fn current_since(
    cluster: &Cluster,
    temporal_namespace: &str,
    deployment_names: &[String],
    tag: &str,
) -> anyhow::Result<BTreeMap<String, (String, SystemTime)>> {
    let prefix = format!("{tag}-");
    let prefix = prefix.as_str();
    stream::iter(deployment_names)
        .map(|name| async move {
            let routing = cluster
                .describe_deployment(temporal_namespace, name)
                .await?
                .routing_config
                .unwrap_or_default();
            let build = routing
                .current_deployment_version
                .map(|v| v.build_id)
                .unwrap_or_default();
            anyhow::ensure!(
                build.starts_with(prefix),
                "{name}: Current is {build:?}, not {prefix}*"
            );
            let since = system_time(routing.current_version_changed_time.as_ref())
                .ok_or_else(|| anyhow!("{name}: no currentVersionChangedTime"))?;
            Ok((name.clone(), (build, since)))
        })
        .buffer_unordered(READ_CONCURRENCY)
        .try_collect()
        .await
}

/// Reads every TWD workflow and new rollout workflow of a round and times each reaction's
/// milestones from `origin`. A history that cannot be read leaves its milestones missing (and
/// says so in the log).
async fn burst_ledger(
    cluster: &Cluster,
    namespace: &str,
    sightings: &[Sighting],
    origin: SystemTime,
    last_current: SystemTime,
) -> BurstLedger {
    let read = |id: String| async move {
        match cluster.histories(&id).await {
            Ok(runs) => Some(Timeline::of(&runs)),
            Err(e) => {
                tracing::warn!("reading the history of {id}: {e:#}");
                None
            }
        }
    };
    let timelines: Vec<(Option<Timeline>, Option<Timeline>)> = stream::iter(sightings)
        .map(|s| {
            let twd = TwdRef {
                namespace: namespace.to_owned(),
                name: s.name.clone(),
            };
            let rollout_id = s.build_id.as_deref().map(|b| twd.rollout_workflow_id(b));
            async move {
                let rollout = match rollout_id {
                    Some(id) => read(id).await,
                    None => None,
                };
                (read(twd.twd_workflow_id()).await, rollout)
            }
        })
        .buffered(READ_CONCURRENCY)
        .collect()
        .await;
    let unread_histories = timelines
        .iter()
        .map(|(t, r)| usize::from(t.is_none()) + usize::from(r.is_none()))
        .sum();
    let (twds, rollouts): (Vec<Timeline>, Vec<Timeline>) = timelines
        .into_iter()
        .map(|(t, r)| (t.unwrap_or_default(), r.unwrap_or_default()))
        .unzip();
    let reactions: Vec<TwdReaction> = sightings
        .iter()
        .zip(twds.iter().zip(&rollouts))
        .map(|(s, (twd, rollout))| {
            let rollout_workflow_id = s
                .build_id
                .as_deref()
                .map(|b| {
                    TwdRef {
                        namespace: namespace.to_owned(),
                        name: s.name.clone(),
                    }
                    .rollout_workflow_id(b)
                })
                .unwrap_or_default();
            let input = ReactionInput {
                twd,
                rollout,
                // Generation 0 matches no signal: the signal's milestones are then missing.
                generation: s.generation.map_or(0, |(g, _)| g),
                rollout_workflow_id: &rollout_workflow_id,
                watch_seen: s.generation.map(|(_, at)| at),
                deployment_seen: s.deployment_seen,
            };
            TwdReaction {
                twd: s.name.clone(),
                build_id: s.build_id.clone(),
                milestones: BurstMilestones::read(input, s.apply_sent, origin),
            }
        })
        .collect();
    let last_created = sightings
        .iter()
        .filter_map(|s| s.deployment_seen)
        .max()
        .unwrap_or(last_current);
    let all: Vec<_> = reactions
        .iter()
        .map(|r| r.milestones.milestones())
        .collect();
    BurstLedger {
        milestones: summarize_milestones(&all),
        queue_waits_to_last_created: QueueWaits::read(&twds, &rollouts, origin, last_created),
        queue_waits_to_all_current: QueueWaits::read(&twds, &rollouts, origin, last_current),
        unread_histories,
        reactions,
    }
}

/// The idle results.
#[derive(Debug, Clone, Serialize)]
pub struct Idle {
    /// TWDs in the sandbox during the window (the fleet, and any other scenario's TWDs), all
    /// rolled out: the per-TWD figures divide by this.
    pub twds: usize,
    /// Controller replicas running (the controller's counters are their sums; RSS and CPU are
    /// the sandbox's own controller's).
    pub replicas: usize,
    /// Length of the measured window, s.
    pub window_s: f64,
    /// Worker-deployment reads of the controller per minute (one value per minute).
    pub controller_reads_per_min: Option<Summary>,
    /// Worker-deployment reads the Temporal frontend served per minute.
    pub server_reads_per_min: Option<Summary>,
    /// Controller reads per TWD per 5 minutes over the whole window.
    pub reads_per_twd_per_5min: f64,
    /// Kubernetes API requests of the controller per minute.
    pub controller_kube_requests_per_min: Option<Summary>,
    /// Resource requests the kube-apiserver served per minute (every client: controller, pod
    /// runner).
    pub apiserver_requests_per_min: Option<Summary>,
    /// Controller CPU, percent of one core, per minute.
    pub controller_cpu_pct: Option<Summary>,
    /// Controller resident set over the window, MiB.
    pub controller_rss_mib: Option<Summary>,
    /// Its anonymous part (heap, stacks), MiB.
    pub controller_rss_anon_mib: Option<Summary>,
    /// Its file part (the binary's pages the kernel keeps resident), MiB.
    pub controller_rss_file_mib: Option<Summary>,
    /// Kubernetes API requests of the controller per TWD per minute, over the whole window.
    pub kube_requests_per_twd_per_min: f64,
    /// What the TWD workflows recorded during the window (every TWD of the sandbox).
    pub twd_workflows: IdleHistories,
}

/// What the TWD workflows' histories recorded during the idle window.
#[derive(Debug, Clone, Default, Serialize)]
pub struct IdleHistories {
    /// TWD workflows whose histories were read (every TWD in the sandbox, other scenarios'
    /// included).
    pub twds: usize,
    /// TWD workflows whose histories could not be read.
    pub unread: usize,
    /// Events stamped inside the window, all of them.
    pub events: usize,
    /// `TimerFired` events inside the window (each starts an idle turn).
    pub timers_fired: usize,
    /// `WorkflowTaskCompleted` events inside the window.
    pub workflow_tasks: usize,
    /// Events per timer firing (per idle turn); `None` without a firing.
    pub events_per_turn: Option<f64>,
    /// Events per TWD workflow per 5 minutes.
    pub events_per_twd_per_5min: f64,
    /// `observe` and `recheck` activities scheduled inside the window (one worker-deployment
    /// read each).
    pub observations: usize,
    /// TWD workflows that observed more often than their resync period explains
    /// ([`IdleTurns::observations_beyond`]): not idle (retiring versions, say).
    pub busier_twds: usize,
    /// The observations of those beyond what the resync period explains.
    pub extra_observations: usize,
    /// Intervals between consecutive observations of one TWD workflow inside the window, over
    /// every idle TWD workflow (not busier) that observed at least twice.
    pub observation_intervals: usize,
    /// Total length of those intervals, s.
    pub observation_interval_s: f64,
    /// Observations (one worker-deployment read each) per TWD per 5 minutes, as 300 s over the
    /// mean interval between one TWD workflow's observations: unlike a count over the window, it
    /// does not depend on where the window's edges fall in each TWD's resync period. `None`
    /// without an interval.
    pub observations_per_twd_per_5min: Option<f64>,
    /// The events inside the window by type, and the Temporal actions they stand for by rule,
    /// every TWD workflow together.
    pub cost: Cost,
    /// Events per TWD workflow per day (the window's, scaled: per 5 minutes × 288).
    pub events_per_twd_per_day: f64,
    /// Estimated Temporal actions per TWD workflow per 5 minutes.
    pub actions_per_twd_per_5min: f64,
    /// Estimated Temporal actions per TWD workflow per day.
    pub actions_per_twd_per_day: f64,
}

/// `count` TWDs named `w000`… in `namespace` (and in the Temporal namespace of that name),
/// applied together, until all are Ready.
pub async fn burst(cluster: &Cluster, namespace: &str, count: usize) -> anyhow::Result<Burst> {
    cluster.namespace(namespace).await?;
    cluster.temporal_namespace(namespace).await?;
    let names: Vec<String> = (0..count).map(|i| format!("w{i:03}")).collect();
    let expected: BTreeMap<String, String> = names
        .iter()
        .map(|n| (n.clone(), "burst-".to_owned()))
        .collect();
    // Temporal's counters are judged over 10 s spans (`peak_server_reads_per_s`).
    let sampler = Sampler::start(
        cluster,
        Duration::from_secs(1),
        Reads::Counters { temporal_every: 5 },
    );
    let (before, server_time_before) =
        Counters::read_with_server_time(&cluster.metrics_pages()).await?;
    let cpu_before = controller_cpu(cluster)?;
    let temporal_pid = temporal_server_pid(cluster);
    let temporal_cpu = || {
        temporal_pid
            .and_then(procstat::sample)
            .map(|p| p.cpu.as_secs_f64())
    };
    let temporal_before = temporal_cpu();
    let machine_before = MachineCpu::read();
    let started = Instant::now();
    let started_at = SystemTime::now();
    let (ready, _) = tokio::try_join!(
        cluster.wait_all_ready(namespace, &expected, Duration::from_secs(900)),
        apply_all(cluster, namespace, &names, "burst"),
    )?;
    let (after, server_time) = Counters::read_with_server_time(&cluster.metrics_pages()).await?;
    let all_ready = ready.values().max().copied().unwrap_or(started);
    let all_ready_at = started_at + all_ready.saturating_duration_since(started);
    let ticks = sampler.finish().await;
    let cpu_after = controller_cpu(cluster)?;
    let temporal_cpu_s = temporal_before
        .zip(temporal_cpu())
        .map(|(before, after)| after - before);
    let machine = machine_before
        .zip(MachineCpu::read())
        .map(|(before, after)| {
            (
                (after.busy - before.busy).as_secs_f64(),
                (after.total - before.total).as_secs_f64(),
            )
        });

    let deployment_names: Vec<String> = names.iter().map(|n| format!("{namespace}/{n}")).collect();
    let first_pollers = first_poller_times(cluster, namespace, &deployment_names).await?;
    let last_poller = first_pollers
        .iter()
        .max()
        .copied()
        .ok_or_else(|| anyhow!("no version was created"))?;
    let (rollout_events, twd_events) = history_lengths(cluster, namespace, &names).await?;
    Ok(Burst {
        twds: count,
        all_ready_after_apply_s: all_ready.saturating_duration_since(started).as_secs_f64(),
        all_ready_after_last_poller_s: seconds_between(last_poller, all_ready_at),
        last_poller_after_apply_s: seconds_between(started_at, last_poller),
        ready_after_apply_s: Summary::of(
            &ready
                .values()
                .map(|t| t.saturating_duration_since(started).as_secs_f64())
                .collect::<Vec<_>>(),
        ),
        peak_server_reads_per_s: peak_rate_over(&ticks, 10.0, Page::Temporal, |c| c.server_reads),
        mean_server_reads_per_s: (after.server_reads - before.server_reads)
            / all_ready
                .saturating_duration_since(started)
                .as_secs_f64()
                .max(1.0),
        peak_controller_reads_per_s: peak_rate_over(&ticks, 1.0, Page::Controllers, |c| {
            c.controller_read_grants
        }),
        peak_controller_answered_reads_per_s: peak_rate_over(&ticks, 1.0, Page::Controllers, |c| {
            c.controller_reads
        }),
        resource_exhausted_calls: after.controller_rate_limited - before.controller_rate_limited,
        busy_refusals: after.server_busy - before.server_busy,
        rate_limited_calls: after.server_rate_limited - before.server_rate_limited,
        controller_peak_rss_mib: ticks.iter().map(|t| t.controller_rss).max().unwrap_or(0) as f64
            / MIB,
        controller_cpu_s: cpu_after - cpu_before,
        machine_busy_pct: machine
            .filter(|(_, total)| *total > 0.0)
            .map(|(busy, total)| busy / total * 100.0),
        temporal_cpu_s,
        other_cpu_s: machine
            .zip(temporal_cpu_s)
            .map(|((busy, _), temporal)| busy - temporal - (cpu_after - cpu_before)),
        rollout_history_events: Summary::of(&rollout_events),
        twd_history_events: Summary::of(&twd_events),
        temporal_calls: server_time.since(&server_time_before),
        replicas: cluster.controllers(),
    })
}

/// Most idle-fleet TWDs per Kubernetes and Temporal namespace (Temporal's default limit of
/// worker deployments per namespace is 100).
const IDLE_PER_NAMESPACE: usize = 100;

/// Adds `added` rolled-out TWDs (AllAtOnce, image tag `tag`) named `<prefix>000`… to
/// `namespace`, and to `namespace-2`, … past [`IDLE_PER_NAMESPACE`] (a Temporal namespace holds
/// at most 100 worker deployments by default), each Kubernetes namespace with a Temporal
/// namespace of its name; returns once all are Ready.
pub async fn grow(
    cluster: &Cluster,
    namespace: &str,
    prefix: &str,
    tag: &str,
    added: usize,
) -> anyhow::Result<()> {
    let names: Vec<String> = (0..added).map(|i| format!("{prefix}{i:03}")).collect();
    for (group, names) in names.chunks(IDLE_PER_NAMESPACE).enumerate() {
        let namespace = match group {
            0 => namespace.to_owned(),
            n => format!("{namespace}-{}", n + 1),
        };
        cluster.namespace(&namespace).await?;
        cluster.temporal_namespace(&namespace).await?;
        let expected: BTreeMap<String, String> = names
            .iter()
            .map(|n| (n.clone(), format!("{tag}-")))
            .collect();
        tokio::try_join!(
            cluster.wait_all_ready(&namespace, &expected, Duration::from_secs(900)),
            apply_all(cluster, &namespace, names, tag),
        )?;
    }
    Ok(())
}

/// Makes the fleet `total` TWDs strong (adding TWDs named `i000`… in `namespace`, and in
/// `namespace-2`, … past [`IDLE_PER_NAMESPACE`]), waits until all are rolled out and quiet,
/// then measures for `window`.
pub async fn idle(
    cluster: &Cluster,
    existing: usize,
    namespace: &str,
    total: usize,
    window: Duration,
) -> anyhow::Result<Idle> {
    grow(
        cluster,
        namespace,
        "i",
        "idle",
        total.saturating_sub(existing),
    )
    .await?;
    wait_quiet(cluster, Duration::from_secs(10), Duration::from_secs(180)).await?;
    tracing::info!(
        twds = total,
        ?window,
        "fleet rolled out and quiet; measuring idle cost"
    );

    let minute = Duration::from_secs(60).min(window);
    // The ticks give the resident set; the counters come from the snapshots, once a minute.
    let sampler = Sampler::start(cluster, Duration::from_secs(1), Reads::ProcessOnly);
    let window_from = SystemTime::now();
    let mut snapshots = vec![Snapshot::take(cluster).await?];
    let started = Instant::now();
    while started.elapsed() + Duration::from_millis(1) < window {
        let next = (minute * u32::try_from(snapshots.len()).unwrap_or(u32::MAX)).min(window);
        tokio::time::sleep_until(tokio::time::Instant::from_std(started + next)).await;
        snapshots.push(Snapshot::take(cluster).await?);
    }
    let ticks: Vec<Tick> = sampler.finish().await;
    let window_to = SystemTime::now();
    // Read after the window, so the reads are not counted in it.
    let twd_workflows = idle_histories(cluster, window_from, window_to).await?;

    let per_minute = |f: fn(&Snapshot) -> f64| {
        let rates: Vec<f64> = snapshots
            .windows(2)
            .map(|w| (f(&w[1]) - f(&w[0])) / (w[1].at_s - w[0].at_s) * 60.0)
            .collect();
        Summary::of(&rates)
    };
    let (first, last) = (&snapshots[0], &snapshots[snapshots.len() - 1]);
    let window_s = last.at_s - first.at_s;
    let reads = last.counters.controller_reads - first.counters.controller_reads;
    let kube_requests =
        last.counters.controller_kube_requests - first.counters.controller_kube_requests;
    // Per TWD means per TWD the controller looks after: the fleet and any other scenario's
    // TWDs left in the sandbox (the latency and steps TWDs are not part of `total`).
    let twds = total.max(twd_workflows.twds + twd_workflows.unread);
    Ok(Idle {
        kube_requests_per_twd_per_min: kube_requests / twds.max(1) as f64 * 60.0
            / window_s.max(1.0),
        twd_workflows,
        twds,
        replicas: cluster.controllers(),
        window_s,
        controller_reads_per_min: per_minute(|s| s.counters.controller_reads),
        server_reads_per_min: per_minute(|s| s.counters.server_reads),
        reads_per_twd_per_5min: reads / twds.max(1) as f64 * 300.0 / window_s.max(1.0),
        controller_kube_requests_per_min: per_minute(|s| s.counters.controller_kube_requests),
        apiserver_requests_per_min: per_minute(|s| s.apiserver_requests),
        controller_cpu_pct: per_minute(|s| s.controller_cpu_s).map(|mut s| {
            // CPU seconds per minute → percent of one core.
            for v in [
                &mut s.median,
                &mut s.p95,
                &mut s.min,
                &mut s.max,
                &mut s.mean,
            ] {
                *v = *v / 60.0 * 100.0;
            }
            s
        }),
        controller_rss_mib: mib_of(&ticks, |t| t.controller_rss),
        controller_rss_anon_mib: mib_of(&ticks, |t| t.controller_rss_anon),
        controller_rss_file_mib: mib_of(&ticks, |t| t.controller_rss_file),
    })
}

/// The summary of one of the ticks' byte counts, in MiB.
fn mib_of(ticks: &[Tick], bytes: impl Fn(&Tick) -> u64) -> Option<Summary> {
    Summary::of(
        &ticks
            .iter()
            .map(|t| bytes(t) as f64 / MIB)
            .collect::<Vec<_>>(),
    )
}

const MIB: f64 = 1024.0 * 1024.0;
/// The idle figures' unit: the TWD workflow's default resync period.
const FIVE_MINUTES: Duration = Duration::from_secs(300);

/// What every TWD workflow of the sandbox recorded in `[from, to]`.
async fn idle_histories(
    cluster: &Cluster,
    from: SystemTime,
    to: SystemTime,
) -> anyhow::Result<IdleHistories> {
    let api: kube::Api<twc_crds::TemporalWorkerDeployment> = kube::Api::all(cluster.kube.clone());
    let twds = api.list(&Default::default()).await?;
    let ids: Vec<String> = twds
        .items
        .iter()
        .filter_map(|t| {
            Some(
                twc_workflows::model::TwdRef {
                    namespace: t.metadata.namespace.clone()?,
                    name: t.metadata.name.clone()?,
                }
                .twd_workflow_id(),
            )
        })
        .collect();
    let read: Vec<Option<(IdleTurns, Cost)>> = stream::iter(&ids)
        .map(|id| async move {
            match cluster.histories(id).await {
                Ok(runs) => Some((
                    IdleTurns::read(&runs, from, to),
                    Cost::read(&runs, from, to),
                )),
                Err(e) => {
                    tracing::warn!("reading the history of {id}: {e:#}");
                    None
                }
            }
        })
        .buffer_unordered(READ_CONCURRENCY)
        .collect()
        .await;
    let turns: Vec<IdleTurns> = read.iter().flatten().map(|(t, _)| *t).collect();
    let window_s = seconds_between(from, to).max(1.0);
    let window = to.duration_since(from).unwrap_or_default();
    let mut histories = IdleHistories {
        twds: turns.len(),
        unread: read.len() - turns.len(),
        ..Default::default()
    };
    for (_, cost) in read.iter().flatten() {
        histories.cost.add(cost);
    }
    let per_twd = |count: usize, unit: Duration| {
        actions::per_workflow(count, histories.twds, window, unit).unwrap_or(0.0)
    };
    histories.events_per_twd_per_day = per_twd(histories.cost.events, DAY);
    histories.actions_per_twd_per_5min = per_twd(histories.cost.actions(), FIVE_MINUTES);
    histories.actions_per_twd_per_day = per_twd(histories.cost.actions(), DAY);
    // An idle TWD workflow observes once per resync period; one that observes more often is
    // acting (retiring a version, say), and its intervals are left out of the idle figure.
    let resync = twc_workflows::twd_workflow::DEFAULT_RESYNC;
    for t in &turns {
        histories.events += t.events;
        histories.timers_fired += t.timers_fired;
        histories.workflow_tasks += t.workflow_tasks;
        histories.observations += t.observations;
        match (t.observations_beyond(resync), t.observation_intervals()) {
            (0, Some((span, intervals))) => {
                histories.observation_intervals += intervals;
                histories.observation_interval_s += span.as_secs_f64();
            }
            (0, None) => {}
            (beyond, _) => {
                histories.busier_twds += 1;
                histories.extra_observations += beyond;
            }
        }
    }
    histories.observations_per_twd_per_5min = (histories.observation_interval_s > 0.0)
        .then(|| 300.0 * histories.observation_intervals as f64 / histories.observation_interval_s);
    histories.events_per_turn = (histories.timers_fired > 0)
        .then(|| histories.events as f64 / histories.timers_fired as f64);
    histories.events_per_twd_per_5min =
        histories.events as f64 / histories.twds.max(1) as f64 * 300.0 / window_s;
    tracing::info!(?histories, "idle TWD workflows' histories");
    Ok(histories)
}

/// Counters at one moment of the idle window.
struct Snapshot {
    at_s: f64,
    counters: Counters,
    apiserver_requests: f64,
    controller_cpu_s: f64,
}

impl Snapshot {
    async fn take(cluster: &Cluster) -> anyhow::Result<Self> {
        let counters = Counters::read(&cluster.metrics_pages()).await?;
        let apiserver = cluster.apiserver_metrics().await?;
        Ok(Self {
            at_s: seconds_since_epoch(),
            counters,
            // Resource requests only: the scrape itself (GET /metrics) is not one.
            apiserver_requests: prom::sum(&apiserver, "apiserver_request_total", |s| {
                s.label("resource").is_some_and(|r| !r.is_empty())
            }),
            controller_cpu_s: controller_cpu(cluster)?,
        })
    }
}

fn seconds_since_epoch() -> f64 {
    seconds_between(SystemTime::UNIX_EPOCH, SystemTime::now())
}

/// The sandbox's Temporal dev server, from the pid file the sandbox keeps.
fn temporal_server_pid(cluster: &Cluster) -> Option<u32> {
    cluster
        .temporal_pid()
        .inspect_err(|e| tracing::warn!(error = %e, "Temporal dev server's CPU not reported"))
        .ok()
}

fn controller_cpu(cluster: &Cluster) -> anyhow::Result<f64> {
    let pid = cluster.controller_pid()?;
    procstat::sample(pid)
        .map(|p| p.cpu.as_secs_f64())
        .ok_or_else(|| anyhow!("controller process {pid} is gone"))
}

/// Applies one TWD per name (AllAtOnce, image tag `tag`), in the Kubernetes namespace and the
/// Temporal namespace named `namespace`; returns when each apply was sent (wall clock).
async fn apply_all(
    cluster: &Cluster,
    namespace: &str,
    names: &[String],
    tag: &str,
) -> anyhow::Result<BTreeMap<String, SystemTime>> {
    apply_all_with(
        cluster,
        namespace,
        names,
        tag,
        &json!({ "strategy": "AllAtOnce" }),
    )
    .await
}

/// Applies one TWD per name with image tag `tag` and `rollout` as its `spec.rollout`, in the
/// Kubernetes namespace and the Temporal namespace named `namespace`, [`APPLY_CONCURRENCY`] at
/// a time; returns when each apply was sent (wall clock).
pub async fn apply_all_with(
    cluster: &Cluster,
    namespace: &str,
    names: &[String],
    tag: &str,
    rollout: &serde_json::Value,
) -> anyhow::Result<BTreeMap<String, SystemTime>> {
    stream::iter(names)
        .map(|name| async move {
            let manifest = worker(namespace, namespace, name, tag, rollout.clone());
            let sent = SystemTime::now();
            cluster.apply(&manifest).await?;
            Ok::<_, anyhow::Error>((name.clone(), sent))
        })
        .buffer_unordered(APPLY_CONCURRENCY)
        .try_collect()
        .await
}

/// When each deployment's current build first polled (its version's create time).
async fn first_poller_times(
    cluster: &Cluster,
    temporal_namespace: &str,
    deployment_names: &[String],
) -> anyhow::Result<Vec<SystemTime>> {
    stream::iter(deployment_names)
        .map(|name| async move {
            let info = cluster
                .describe_deployment(temporal_namespace, name)
                .await?;
            let build = info
                .routing_config
                .and_then(|r| r.current_deployment_version)
                .map(|v| v.build_id)
                .ok_or_else(|| anyhow!("{name} has no current version"))?;
            let version = cluster
                .describe_version(temporal_namespace, name, &build)
                .await?;
            system_time(version.create_time.as_ref())
                .ok_or_else(|| anyhow!("{name}:{build} has no create time"))
        })
        .buffer_unordered(READ_CONCURRENCY)
        .try_collect()
        .await
}

/// History lengths of each TWD's rollout workflow and TWD workflow.
async fn history_lengths(
    cluster: &Cluster,
    namespace: &str,
    names: &[String],
) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let api: kube::Api<twc_crds::TemporalWorkerDeployment> =
        kube::Api::namespaced(cluster.kube.clone(), namespace);
    let pairs: Vec<(f64, f64)> = stream::iter(names)
        .map(|name| {
            let api = api.clone();
            async move {
                let twd = api.get(name).await?;
                let rollout_id = twd
                    .status
                    .and_then(|s| s.rollout)
                    .and_then(|r| r.workflow_id)
                    .ok_or_else(|| anyhow!("{namespace}/{name} names no rollout workflow"))?;
                let rollout = cluster.history_length(&rollout_id).await?;
                let twd = cluster
                    .history_length(&format!("twd/{namespace}/{name}"))
                    .await?;
                Ok::<_, anyhow::Error>((rollout as f64, twd as f64))
            }
        })
        .buffer_unordered(READ_CONCURRENCY)
        .try_collect()
        .await?;
    Ok(pairs.into_iter().unzip())
}
