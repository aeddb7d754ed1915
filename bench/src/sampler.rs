//! Background sampling while a scenario runs: the controller process (CPU, RSS) and the
//! read counters of the controller and of the Temporal server, once per interval.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use twc_sandbox::env::SandboxEnv;

use crate::cluster::{Cluster, scrape};
use crate::procstat;
use crate::prom::{self, Sample};

/// Worker-deployment read RPCs (what the server's 50/s worker-deployment read budget and the
/// controller's own read budget count).
pub const READS: &[&str] = &[
    "DescribeWorkerDeployment",
    "DescribeWorkerDeploymentVersion",
    "ListWorkerDeployments",
];

/// Counters as read at one moment.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Counters {
    /// Worker-deployment reads the controller made (its `twc_temporal_requests_total`; every
    /// replica's together).
    pub controller_reads: f64,
    /// Worker-deployment reads the controller's read budget let through, counted as they were
    /// sent (its `twc_temporal_read_grants_total`; every replica's together). The reads above
    /// are counted as their answers arrive, and answers slower than others bunch up.
    pub controller_read_grants: f64,
    /// Controller Temporal calls refused with ResourceExhausted.
    pub controller_rate_limited: f64,
    /// Worker-deployment reads the Temporal frontend served (`service_requests`).
    pub server_reads: f64,
    /// Kubernetes API requests the controller made (`twc_kubernetes_requests_total`; every
    /// replica's together).
    pub controller_kube_requests: f64,
    /// Those of the Kubernetes requests above that renew or count the replicas' Leases: a
    /// heartbeat every 10 s whatever the fleet does, so not a sign of work.
    pub controller_lease_requests: f64,
    /// Calls the Temporal frontend refused with ResourceExhausted because a worker deployment
    /// was busy applying a change (cause BusyWorkflow: retried, not a budget problem).
    pub server_busy: f64,
    /// Calls the Temporal frontend refused with ResourceExhausted for any other cause (rate and
    /// concurrency limits: the budget the controller must stay within).
    pub server_rate_limited: f64,
}

/// Where the counters are read: every running controller replica's `/metrics` (the sandbox's
/// own first) and the Temporal server's.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsPages {
    /// The controllers' pages.
    pub controllers: Vec<String>,
    /// Temporal's page.
    pub temporal: String,
}

impl MetricsPages {
    /// Every controller's samples (one list: their counters add up) with the moment the last
    /// of their pages arrived, and Temporal's samples. The pages are read side by side, and
    /// Temporal's (megabytes) can arrive a second after the controllers' (kilobytes), so a rate
    /// of the controllers' counters must be divided by the controllers' own times.
    async fn read(&self) -> anyhow::Result<(Vec<Sample>, Instant, Vec<Sample>)> {
        let ((controller, arrived), server) =
            tokio::try_join!(self.read_controllers(), scrape(&self.temporal))?;
        Ok((controller, arrived, server))
    }

    /// Every controller's samples, with the moment the last of their pages arrived.
    async fn read_controllers(&self) -> anyhow::Result<(Vec<Sample>, Instant)> {
        let pages = futures::future::try_join_all(self.controllers.iter().map(|u| scrape(u)));
        Ok((pages.await?.concat(), Instant::now()))
    }
}

impl Counters {
    /// Reads the controllers' and the Temporal server's pages; the controllers' counters are
    /// summed over the replicas.
    pub async fn read(pages: &MetricsPages) -> anyhow::Result<Self> {
        Ok(Self::read_stamped(pages).await?.0)
    }

    /// [`Counters::read`], with the moment the controllers' pages arrived.
    async fn read_stamped(pages: &MetricsPages) -> anyhow::Result<(Self, Instant)> {
        let (controller, arrived, server) = pages.read().await?;
        Ok((Self::from_pages(&controller, &server), arrived))
    }

    /// The controllers' counters alone (the Temporal server's are left at 0): Temporal's page
    /// is megabytes, and the server spends CPU on every reading of it.
    pub async fn read_controllers(pages: &MetricsPages) -> anyhow::Result<(Self, Instant)> {
        let (controller, arrived) = pages.read_controllers().await?;
        Ok((Self::from_pages(&controller, &[]), arrived))
    }

    /// These counters with the Temporal server's taken from `server` (read earlier).
    fn with_server_of(self, server: &Self) -> Self {
        Self {
            server_reads: server.server_reads,
            server_busy: server.server_busy,
            server_rate_limited: server.server_rate_limited,
            ..self
        }
    }

    /// The counters and Temporal's own time per call, from one reading of each page.
    pub async fn read_with_server_time(pages: &MetricsPages) -> anyhow::Result<(Self, ServerTime)> {
        let (controller, _, server) = pages.read().await?;
        Ok((
            Self::from_pages(&controller, &server),
            ServerTime::from_page(&server),
        ))
    }

    fn from_pages(controller: &[Sample], server: &[Sample]) -> Self {
        let is_read = |s: &Sample| s.label("operation").is_some_and(|op| READS.contains(&op));
        Self {
            controller_reads: prom::sum(controller, "twc_temporal_requests_total", is_read),
            controller_read_grants: prom::sum(controller, "twc_temporal_read_grants_total", |_| {
                true
            }),
            controller_rate_limited: prom::sum(controller, "twc_temporal_requests_total", |s| {
                s.label("outcome") == Some("resource_exhausted")
            }),
            server_reads: prom::sum(server, "service_requests", |s| {
                is_read(s) && s.label("service_name") == Some("frontend")
            }),
            controller_kube_requests: prom::sum(
                controller,
                "twc_kubernetes_requests_total",
                |_| true,
            ),
            controller_lease_requests: prom::sum(
                controller,
                "twc_kubernetes_requests_total",
                |s| s.label("resource") == Some("leases"),
            ),
            server_busy: prom::sum(server, "service_errors_resource_exhausted", |s| {
                s.label("service_name") == Some("frontend")
                    && s.label("resource_exhausted_cause") == Some("BusyWorkflow")
            }),
            server_rate_limited: prom::sum(server, "service_errors_resource_exhausted", |s| {
                s.label("service_name") == Some("frontend")
                    && s.label("resource_exhausted_cause") != Some("BusyWorkflow")
            }),
        }
    }
}

/// Worker-deployment calls whose time inside Temporal the scenarios report.
pub const DEPLOYMENT_CALLS: &[&str] = &[
    "DescribeWorkerDeployment",
    "SetWorkerDeploymentManager",
    "SetWorkerDeploymentCurrentVersion",
    "SetWorkerDeploymentRampingVersion",
    "UpdateWorkerDeploymentVersionMetadata",
];

/// Temporal's own time in each worker-deployment call so far: the frontend's `service_latency`
/// histogram's sum (s) and count per operation, every namespace together.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServerTime(BTreeMap<String, (f64, f64)>);

/// Temporal's own time in one kind of call over a span of the run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CallTime {
    /// The RPC.
    pub operation: String,
    /// Calls that finished in the span.
    pub calls: u64,
    /// Mean time from the frontend receiving a call to its answer, ms.
    pub mean_ms: f64,
}

impl ServerTime {
    /// Reads Temporal's page.
    pub async fn read(env: &SandboxEnv) -> anyhow::Result<Self> {
        Ok(Self::from_page(&scrape(&env.temporal_metrics_url).await?))
    }

    fn from_page(server: &[Sample]) -> Self {
        let mut calls = BTreeMap::new();
        for &operation in DEPLOYMENT_CALLS {
            let of = |s: &Sample| {
                s.label("operation") == Some(operation)
                    && s.label("service_name") == Some("frontend")
            };
            let sum = prom::sum(server, "service_latency_sum", of);
            let count = prom::sum(server, "service_latency_count", of);
            calls.insert(operation.to_owned(), (sum, count));
        }
        Self(calls)
    }

    /// Each call's mean time since `before` (calls not made in between are left out).
    pub fn since(&self, before: &Self) -> Vec<CallTime> {
        DEPLOYMENT_CALLS
            .iter()
            .filter_map(|&operation| {
                let (sum, count) = self.0.get(operation).copied().unwrap_or_default();
                let (sum0, count0) = before.0.get(operation).copied().unwrap_or_default();
                let calls = count - count0;
                (calls >= 1.0).then(|| CallTime {
                    operation: operation.to_owned(),
                    calls: calls.round() as u64,
                    mean_ms: (sum - sum0) / calls * 1e3,
                })
            })
            .collect()
    }
}

/// One sample.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Tick {
    /// Seconds since sampling started, when the Temporal page the tick's server counters come
    /// from had arrived (an earlier tick's, when this one did not read it): the time of the
    /// Temporal server's counters.
    pub at_s: f64,
    /// Seconds since sampling started, when the controllers' pages had arrived: the time of
    /// their counters.
    pub controller_at_s: f64,
    /// CPU seconds so far of the sandbox's own controller.
    pub controller_cpu_s: f64,
    /// Resident set of the sandbox's own controller, bytes.
    pub controller_rss: u64,
    /// Its anonymous part (heap, stacks), bytes.
    pub controller_rss_anon: u64,
    /// Its file part (the binary's pages), bytes.
    pub controller_rss_file: u64,
    /// The counters.
    pub counters: Counters,
}

/// What a sampler reads at each tick beside the controller process's CPU and RSS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reads {
    /// Nothing more: the ticks' counters stay at 0.
    ProcessOnly,
    /// The controllers' pages at every tick, Temporal's at the first tick and then every
    /// `temporal_every` ticks. Temporal's page is megabytes once a burst has created its task
    /// queues, and the dev server spends CPU on each reading, CPU the scenario measures.
    Counters {
        /// Ticks from one reading of Temporal's page to the next (0: only the first tick reads it).
        temporal_every: u32,
    },
}

/// A running sampler.
pub struct Sampler {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Vec<Tick>>,
}

impl Sampler {
    /// Samples every `interval` until [`Sampler::finish`].
    pub fn start(cluster: &Cluster, interval: Duration, reads: Reads) -> Self {
        let (stop, mut stopped) = oneshot::channel();
        let pid_file = cluster.env.controller_pid_file.clone();
        let pages = cluster.metrics_pages();
        let task = tokio::spawn(async move {
            let started = Instant::now();
            let since_start = |at: Instant| at.saturating_duration_since(started).as_secs_f64();
            let mut ticks = Vec::new();
            // The last reading of Temporal's page and when it arrived.
            let mut server: Option<(Counters, f64)> = None;
            let mut tick_count: u32 = 0;
            let mut timer = tokio::time::interval(interval);
            timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    _ = timer.tick() => {}
                }
                let process = pid_file
                    .as_deref()
                    .and_then(|f| std::fs::read_to_string(f).ok())
                    .and_then(|p| p.trim().parse().ok())
                    .and_then(procstat::sample);
                let (counters, at_s, controller_at_s) = match reads {
                    Reads::ProcessOnly => {
                        let now = since_start(Instant::now());
                        (Counters::default(), now, now)
                    }
                    Reads::Counters { temporal_every } => {
                        let due = tick_count.is_multiple_of(temporal_every);
                        tick_count = tick_count.wrapping_add(1);
                        match server {
                            Some((last, at_s)) if !due => {
                                let Ok((counters, arrived)) =
                                    Counters::read_controllers(&pages).await
                                else {
                                    continue;
                                };
                                (counters.with_server_of(&last), at_s, since_start(arrived))
                            }
                            _ => {
                                let Ok((counters, arrived)) = Counters::read_stamped(&pages).await
                                else {
                                    continue;
                                };
                                let at_s = since_start(Instant::now());
                                server = Some((counters, at_s));
                                (counters, at_s, since_start(arrived))
                            }
                        }
                    }
                };
                ticks.push(Tick {
                    at_s,
                    controller_at_s,
                    controller_cpu_s: process.map_or(0.0, |p| p.cpu.as_secs_f64()),
                    controller_rss: process.map_or(0, |p| p.rss),
                    controller_rss_anon: process.map_or(0, |p| p.rss_anon),
                    controller_rss_file: process.map_or(0, |p| p.rss_file),
                    counters,
                });
            }
            ticks
        });
        Self { stop, task }
    }

    /// Stops sampling and returns the samples.
    pub async fn finish(self) -> Vec<Tick> {
        let _ = self.stop.send(());
        self.task.await.unwrap_or_default()
    }
}

/// Waits until the controller has made no Kubernetes request and no Temporal read for
/// `quiet_for` (its last rollout's status writes, events and clean-up are done, and Temporal has
/// had time to settle after the last routing change), at most `max` (then it only warns).
pub async fn wait_quiet(
    cluster: &Cluster,
    quiet_for: Duration,
    max: Duration,
) -> anyhow::Result<()> {
    // The controllers' pages only: this polls four times a second, and Temporal's counters
    // say nothing about the controller being quiet. The replicas' Lease heartbeat (every 10 s)
    // is not work: counted, it kept a controller from ever being quiet for 10 s, and the idle
    // window then started three minutes later than the old controller's, at another phase of
    // the TWDs' resyncs.
    let activity = |(c, _): (Counters, Instant)| {
        (
            c.controller_kube_requests - c.controller_lease_requests,
            c.controller_reads,
        )
    };
    let deadline = Instant::now() + max;
    let pages = cluster.metrics_pages();
    let mut last = activity(Counters::read_controllers(&pages).await?);
    let mut since = Instant::now();
    while since.elapsed() < quiet_for {
        if Instant::now() > deadline {
            tracing::warn!(?max, "the controller did not go quiet; measuring anyway");
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = activity(Counters::read_controllers(&pages).await?);
        if now != last {
            last = now;
            since = Instant::now();
        }
    }
    Ok(())
}

/// Whose page a counter was read from, and so which of a tick's times it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Page {
    /// The controllers' pages ([`Tick::controller_at_s`]).
    Controllers,
    /// Temporal's page ([`Tick::at_s`]).
    Temporal,
}

impl Tick {
    fn at(&self, page: Page) -> f64 {
        match page {
            Page::Controllers => self.controller_at_s,
            Page::Temporal => self.at_s,
        }
    }
}

/// Highest rate of a counter, per second, over spans of at least `span_s` seconds (the
/// shortest span of consecutive samples that long, from each sample), timed by the moments
/// `page` was read. The Temporal server publishes its counters in batches, so its per-second
/// differences overstate peaks; spans of 10 s smooth that out. A token bucket grants at most
/// rate + burst in any span of a second, but more per second over shorter spans, so a peak
/// second needs spans of at least 1 s.
pub fn peak_rate_over(
    ticks: &[Tick],
    span_s: f64,
    page: Page,
    counter: impl Fn(&Counters) -> f64,
) -> f64 {
    let mut peak: f64 = 0.0;
    for (i, start) in ticks.iter().enumerate() {
        let Some(end) = ticks[i + 1..]
            .iter()
            .find(|t| t.at(page) - start.at(page) >= span_s && t.at(page) > start.at(page))
        else {
            break;
        };
        let rate =
            (counter(&end.counters) - counter(&start.counters)) / (end.at(page) - start.at(page));
        peak = peak.max(rate);
    }
    peak
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tick(at_s: f64, server_reads: f64) -> Tick {
        let mut tick = controller_tick(at_s, at_s, 0.0);
        tick.counters.server_reads = server_reads;
        tick
    }

    #[test]
    fn peak_rate_is_the_steepest_interval() {
        let ticks = [
            tick(0.0, 0.0),
            tick(1.0, 10.0),
            tick(2.0, 40.0),
            tick(4.0, 50.0),
        ];
        let reads = |c: &Counters| c.server_reads;
        assert_eq!(peak_rate_over(&ticks, 0.0, Page::Temporal, reads), 30.0);
        assert_eq!(peak_rate_over(&ticks[..1], 0.0, Page::Temporal, reads), 0.0);
        // Over 2 s spans: 0→2 s gives 20/s, 1→4 s gives 13.3/s, 2→4 s gives 5/s.
        assert_eq!(peak_rate_over(&ticks, 2.0, Page::Temporal, reads), 20.0);
    }

    /// A tick whose Temporal page arrived at `at_s` and the controllers' at `controller_at_s`.
    fn controller_tick(at_s: f64, controller_at_s: f64, controller_reads: f64) -> Tick {
        Tick {
            at_s,
            controller_at_s,
            controller_rss: 0,
            controller_rss_anon: 0,
            controller_rss_file: 0,
            controller_cpu_s: 0.0,
            counters: Counters {
                controller_reads,
                ..Counters::default()
            },
        }
    }

    /// The burst benchmark's case: the controller read 45 a second, its pages arrived once a
    /// second, but Temporal's slow page finished its ticks 1.27 s and then 0.73 s apart. Timed
    /// by the ticks' ends, the second interval came out at 61.6/s; timed by the controllers'
    /// pages it is 45/s.
    #[test]
    fn controller_rates_are_timed_by_the_controllers_pages() {
        let ticks = [
            controller_tick(0.30, 0.02, 0.0),
            controller_tick(1.57, 1.02, 45.0),
            controller_tick(2.30, 2.02, 90.0),
            controller_tick(3.31, 3.02, 135.0),
        ];
        let reads = |c: &Counters| c.controller_reads;
        assert!(peak_rate_over(&ticks, 0.0, Page::Temporal, reads) > 61.0);
        assert_eq!(peak_rate_over(&ticks, 1.0, Page::Controllers, reads), 45.0);
    }

    /// Over spans shorter than a second the bucket's burst shows as a higher rate; spans of at
    /// least 1 s do not take them.
    #[test]
    fn a_one_second_span_skips_shorter_intervals() {
        let tick = |at_s: f64, controller_reads: f64| controller_tick(at_s, at_s, controller_reads);
        // 5 + 40 × 0.5 = 25 reads in half a second (50/s), then 20 in the next half.
        let ticks = [
            tick(0.0, 0.0),
            tick(0.5, 25.0),
            tick(1.0, 45.0),
            tick(2.0, 85.0),
        ];
        let reads = |c: &Counters| c.controller_reads;
        assert_eq!(peak_rate_over(&ticks, 0.0, Page::Controllers, reads), 50.0);
        assert_eq!(peak_rate_over(&ticks, 1.0, Page::Controllers, reads), 45.0);
    }

    /// Temporal's page read every 5 ticks: the ticks in between repeat its last counters and
    /// their time, and the peak over 10 s spans is that of the readings alone.
    #[test]
    fn repeated_temporal_readings_do_not_change_the_peak() {
        // Readings at 0, 5, 10, 15, 20 s: 0, 50, 400, 450, 500 reads.
        let readings = [
            (0.0, 0.0),
            (5.0, 50.0),
            (10.0, 400.0),
            (15.0, 450.0),
            (20.0, 500.0),
        ];
        let sparse: Vec<Tick> = readings.iter().map(|&(at, n)| tick(at, n)).collect();
        let every_second: Vec<Tick> = (0..=20)
            .map(|second| {
                let (at, n) = readings[second / 5];
                let mut t = tick(at, n);
                t.controller_at_s = second as f64;
                t
            })
            .collect();
        let reads = |c: &Counters| c.server_reads;
        // 0 → 10 s: 40/s; 5 → 15 s: 40/s; 10 → 20 s: 10/s.
        assert_eq!(peak_rate_over(&sparse, 10.0, Page::Temporal, reads), 40.0);
        assert_eq!(
            peak_rate_over(&every_second, 10.0, Page::Temporal, reads),
            40.0
        );
    }

    #[test]
    fn the_server_counters_of_an_earlier_reading_keep_the_controllers() {
        let now = Counters {
            controller_reads: 8.0,
            controller_kube_requests: 3.0,
            ..Counters::default()
        };
        let earlier = Counters {
            controller_reads: 1.0,
            server_reads: 9.0,
            server_busy: 2.0,
            server_rate_limited: 1.0,
            ..Counters::default()
        };
        let merged = now.with_server_of(&earlier);
        assert_eq!(
            (
                merged.controller_reads,
                merged.controller_kube_requests,
                merged.server_reads,
                merged.server_busy,
                merged.server_rate_limited
            ),
            (8.0, 3.0, 9.0, 2.0, 1.0)
        );
    }

    #[test]
    fn counters_pick_reads_and_rate_limits() {
        let controller = prom::parse(
            "twc_temporal_requests_total{operation=\"DescribeWorkerDeployment\",outcome=\"success\"} 7\n\
             twc_temporal_requests_total{operation=\"DescribeWorkerDeployment\",outcome=\"resource_exhausted\"} 1\n\
             twc_temporal_requests_total{operation=\"SetWorkerDeploymentCurrentVersion\",outcome=\"success\"} 3\n\
             twc_temporal_read_grants_total 10\n\
             twc_kubernetes_requests_total{verb=\"get\",resource=\"deployments\",outcome=\"success\"} 5\n\
             twc_kubernetes_requests_total{verb=\"update\",resource=\"leases\",outcome=\"success\"} 2\n",
        );
        let server = prom::parse(
            "service_requests{operation=\"DescribeWorkerDeployment\",service_name=\"frontend\"} 9\n\
             service_requests{operation=\"DescribeWorkerDeployment\",service_name=\"history\"} 4\n\
             service_requests{operation=\"PollWorkflowTaskQueue\",service_name=\"frontend\"} 100\n\
             service_errors_resource_exhausted{operation=\"DescribeWorkerDeployment\",resource_exhausted_cause=\"BusyWorkflow\",service_name=\"frontend\"} 6\n\
             service_errors_resource_exhausted{operation=\"DescribeWorkerDeployment\",resource_exhausted_cause=\"RpsLimit\",service_name=\"frontend\"} 2\n\
             service_errors_resource_exhausted{operation=\"QueryWorkflow\",resource_exhausted_cause=\"BusyWorkflow\",service_name=\"history\"} 6\n",
        );
        let c = Counters::from_pages(&controller, &server);
        assert_eq!(
            (
                c.controller_reads,
                c.controller_read_grants,
                c.controller_rate_limited,
                c.server_reads,
                c.controller_kube_requests,
                c.controller_lease_requests
            ),
            (8.0, 10.0, 1.0, 9.0, 7.0, 2.0)
        );
        assert_eq!((c.server_busy, c.server_rate_limited), (6.0, 2.0));
    }

    #[test]
    fn counters_of_two_replicas_add_up() {
        let replica = |reads: u32, kube: u32| {
            prom::parse(&format!(
                "twc_temporal_requests_total{{operation=\"DescribeWorkerDeployment\",outcome=\"success\"}} {reads}\n\
                 twc_kubernetes_requests_total{{verb=\"get\",resource=\"deployments\",outcome=\"success\"}} {kube}\n\
                 twc_controller_replicas 2\n"
            ))
        };
        let controllers = [replica(7, 5), replica(3, 4)].concat();
        let c = Counters::from_pages(&controllers, &[]);
        assert_eq!(
            (c.controller_reads, c.controller_kube_requests),
            (10.0, 9.0)
        );
    }

    #[test]
    fn server_time_is_the_mean_of_the_calls_made_in_between() {
        let page = |set_sum: f64, set_count: f64| {
            prom::parse(&format!(
                "service_latency_sum{{namespace=\"a\",operation=\"SetWorkerDeploymentCurrentVersion\",service_name=\"frontend\"}} {set_sum}\n\
                 service_latency_count{{namespace=\"a\",operation=\"SetWorkerDeploymentCurrentVersion\",service_name=\"frontend\"}} {set_count}\n\
                 service_latency_sum{{namespace=\"b\",operation=\"SetWorkerDeploymentCurrentVersion\",service_name=\"frontend\"}} 1\n\
                 service_latency_count{{namespace=\"b\",operation=\"SetWorkerDeploymentCurrentVersion\",service_name=\"frontend\"}} 2\n\
                 service_latency_sum{{operation=\"SetWorkerDeploymentCurrentVersion\",service_name=\"history\"}} {set_sum}\n\
                 service_latency_count{{operation=\"SetWorkerDeploymentCurrentVersion\",service_name=\"history\"}} {set_count}\n\
                 service_latency_sum{{operation=\"DescribeWorkerDeployment\",service_name=\"frontend\"}} 0.5\n\
                 service_latency_count{{operation=\"DescribeWorkerDeployment\",service_name=\"frontend\"}} 10\n"
            ))
        };
        let before = ServerTime::from_page(&page(0.25, 1.0));
        let after = ServerTime::from_page(&page(1.25, 5.0));
        // Four Set calls took 1 s together; no Describe happened in between.
        assert_eq!(
            after.since(&before),
            vec![CallTime {
                operation: "SetWorkerDeploymentCurrentVersion".to_owned(),
                calls: 4,
                mean_ms: 250.0,
            }]
        );
        assert_eq!(
            after.since(&ServerTime::default())[0].operation,
            "DescribeWorkerDeployment"
        );
    }
}
