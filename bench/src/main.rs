//! `make bench`: measures the controller against the sandbox's real servers (Temporal dev
//! server, kube-apiserver, pod runner) with release builds, and writes the figures as JSON
//! (`benchmarks/results.json`) and as the generated table of BENCHMARKS.md.
//!
//! Scenarios, in order (each on namespaces of its own):
//! - `latency`: repeated AllAtOnce rollouts of one TWD: reaction latency (apply → versioned
//!   Deployment, seen by a watch) and promotion latency (first poller → Current, from
//!   Temporal's timestamps), the hop ledger of each (where the time went, from the engine
//!   workflows' histories: see `ledger`), how far the TWD's status lags Temporal's routing, and
//!   history events per rollout;
//! - `steps`: Progressive rollouts: how long each ramp step was held against its pause, and how
//!   far the status lags each ramp change;
//! - `change-burst`: a few TWDs (20) whose image is changed at once, in rounds: apply → the last
//!   new Deployment created, the spread of their creation times, apply → every build Current;
//! - `burst`: many TWDs applied at once: time to all Ready, peak read rate, rate-limit errors,
//!   controller memory and CPU, workflow history sizes;
//! - `idle`: the fleet grown to its idle size and left alone: reads, API requests (also per TWD
//!   per minute), CPU, RSS, and the TWD workflows' history events and Temporal actions per idle
//!   turn, per 5 minutes and per day;
//! - `held`: a few rollouts held in a long Progressive step with nothing happening: their
//!   rollout and TWD workflows' history events and Temporal actions per held rollout per hour;
//! - `burst-2r`, `idle-2r`: the burst and the idle fleet again with a second controller replica
//!   (the replicas divide the read budget between them): reads Temporal served against its
//!   per-namespace limit, calls it refused for its limits, idle reads per TWD;
//! - `dashboard`: `kubectl twc dashboard` in headless Chromium over the whole fleet (grown to
//!   200 if smaller): the overview's first paint and every row shown, and how long after the
//!   status a change shows on the open page (see `dashboard`);
//! - `replay`: the replay check of a new build (`spec.rollout.replayCheck`) over
//!   `BENCH_REPLAY_WORKFLOWS` (50) completed AutoUpgrade workflows: build ready → verdict, the
//!   check's activity, the histories replayed, the extra Temporal reads (see `replay.rs`).
//! - `drain`: a retired version with many open pinned workflows drained on purpose
//!   (`spec.sunset.drain.signalAfter`): `signalAfter` → the version Drained in Temporal;
//! - `analysis`: canary analysis stopping a bad build under load: its first failing workflow →
//!   routing restored (the ramp cleared in Temporal), and → `AnalysisFailed` on the TWD;
//! - `autoscaling`: backlog-based autoscaling under load: a backlog appearing on an idle version
//!   → its Deployment's first new replica requested, and the controller's backlog reads per
//!   version per minute when idle and when busy.
//!
//! Settings (environment): `BENCH_QUICK` (`1`: a few-minutes suite, see [`Options`]),
//! `BENCH_SCENARIOS` (comma-separated, default all), `BENCH_ROLLOUTS` (30),
//! `BENCH_STEP_ROLLOUTS` (3), `BENCH_CHANGE_TWDS` (20), `BENCH_CHANGE_ROUNDS` (3),
//! `BENCH_BURST_TWDS` (100, also of `burst-2r`), `BENCH_IDLE_TWDS` (200),
//! `BENCH_IDLE_SECONDS` (300, also of `idle-2r`), `BENCH_HELD_TWDS` (5), `BENCH_HELD_SECONDS`
//! (600: two of the TWD workflow's 5-minute resyncs), `BENCH_DASHBOARD_TWDS` (200),
//! `BENCH_DASHBOARD_LOADS` (5), `BENCH_DASHBOARD_UPDATES` (10), `BENCH_DRAIN_WORKFLOWS` (200),
//! `BENCH_ANALYSIS_INTERVAL` (the
//! check's interval in whole seconds, `5` or `5s`; 5), `BENCH_ANALYSIS_RATE` (HelloWorld
//! workflows started per second during the analysis; 10), `BENCH_AUTOSCALE_ROUNDS` (scale-ups
//! timed; 5), `BENCH_AUTOSCALE_IDLE_SECONDS` (the window without load in which backlog reads are
//! counted; 120), `BENCH_JSON` (benchmarks/results.json), `BENCH_MARKDOWN` (BENCHMARKS.md),
//! `BENCH_SERVERS` (server versions, for the report).

mod actions;
mod analysis;
mod autoscaling;
mod cluster;
mod dashboard;
mod drain;
mod fleet;
mod held;
mod latency;
mod ledger;
mod procstat;
mod prom;
mod replay;
mod report;
mod sampler;
mod stats;
mod steps;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::Context;

use crate::cluster::Cluster;
use crate::report::{Results, RunContext};

/// Every scenario, in the order they run.
const SCENARIOS: [&str; 13] = [
    "latency",
    "steps",
    "change-burst",
    "burst",
    "idle",
    "held",
    "burst-2r",
    "idle-2r",
    "dashboard",
    "drain",
    "analysis",
    "autoscaling",
    "replay",
];

/// The scenarios of `BENCH_QUICK=1`: the long ones (burst of 100, drain, analysis,
/// autoscaling, replay) are left out.
const QUICK_SCENARIOS: [&str; 5] = ["latency", "steps", "change-burst", "idle", "dashboard"];

/// What to run, from the environment. `BENCH_QUICK=1` changes the defaults to a run of a few
/// minutes ([`QUICK_SCENARIOS`], 5 latency rollouts, 1 Progressive rollout, 2 rounds of the
/// change burst of 20, an idle fleet of 40 TWDs for 120 s); variables set explicitly still win.
struct Options {
    scenarios: Vec<String>,
    rollouts: usize,
    step_rollouts: usize,
    change_twds: usize,
    change_rounds: usize,
    burst_twds: usize,
    idle_twds: usize,
    idle_window: Duration,
    held_twds: usize,
    held_window: Duration,
    dashboard_twds: usize,
    dashboard_loads: usize,
    dashboard_updates: usize,
    drain_workflows: usize,
    replay_workflows: usize,
    analysis_interval: Duration,
    analysis_rate: f64,
    autoscale_rounds: usize,
    autoscale_idle_window: Duration,
    json: PathBuf,
    markdown: PathBuf,
}

impl Options {
    fn from_env() -> anyhow::Result<Self> {
        let number = |key: &str, default: usize| -> anyhow::Result<usize> {
            match std::env::var(key) {
                Ok(v) => v
                    .trim()
                    .parse()
                    .with_context(|| format!("{key}={v:?} is not a number")),
                Err(_) => Ok(default),
            }
        };
        let quick = match std::env::var("BENCH_QUICK") {
            Ok(v) => match v.trim() {
                "" | "0" | "false" => false,
                "1" | "true" => true,
                other => anyhow::bail!("BENCH_QUICK={other:?}: expected 1 or 0"),
            },
            Err(_) => false,
        };
        // The default of a setting: the full suite's, or the quick one's.
        let pick = |full: usize, short: usize| if quick { short } else { full };
        let scenarios = std::env::var("BENCH_SCENARIOS")
            .unwrap_or_else(|_| {
                if quick {
                    QUICK_SCENARIOS.join(",")
                } else {
                    SCENARIOS.join(",")
                }
            })
            .split(',')
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>();
        for s in &scenarios {
            anyhow::ensure!(
                SCENARIOS.contains(&s.as_str()),
                "BENCH_SCENARIOS: unknown scenario {s:?} ({})",
                SCENARIOS.join(", ")
            );
        }
        let analysis_interval = match std::env::var("BENCH_ANALYSIS_INTERVAL") {
            Ok(v) => v
                .trim()
                .trim_end_matches('s')
                .parse::<u64>()
                .ok()
                .filter(|s| *s >= 1)
                .map(Duration::from_secs)
                .with_context(|| {
                    format!("BENCH_ANALYSIS_INTERVAL={v:?} is not a whole number of seconds ≥ 1")
                })?,
            Err(_) => Duration::from_secs(5),
        };
        let analysis_rate = match std::env::var("BENCH_ANALYSIS_RATE") {
            Ok(v) => v
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|r| r.is_finite() && *r > 0.0)
                .with_context(|| format!("BENCH_ANALYSIS_RATE={v:?} is not a positive number"))?,
            Err(_) => 10.0,
        };
        let autoscale_rounds = number("BENCH_AUTOSCALE_ROUNDS", 5)?;
        anyhow::ensure!(
            autoscale_rounds >= 1,
            "BENCH_AUTOSCALE_ROUNDS must be at least 1"
        );
        let autoscale_idle_seconds = number("BENCH_AUTOSCALE_IDLE_SECONDS", 120)?;
        anyhow::ensure!(
            autoscale_idle_seconds >= 1,
            "BENCH_AUTOSCALE_IDLE_SECONDS must be at least 1"
        );
        Ok(Self {
            scenarios,
            rollouts: number("BENCH_ROLLOUTS", pick(30, 5))?,
            step_rollouts: number("BENCH_STEP_ROLLOUTS", pick(3, 1))?,
            change_twds: number("BENCH_CHANGE_TWDS", 20)?,
            change_rounds: number("BENCH_CHANGE_ROUNDS", pick(3, 2))?,
            burst_twds: number("BENCH_BURST_TWDS", 100)?,
            idle_twds: number("BENCH_IDLE_TWDS", pick(200, 40))?,
            idle_window: Duration::from_secs(number("BENCH_IDLE_SECONDS", pick(300, 120))? as u64),
            held_twds: number("BENCH_HELD_TWDS", 5)?,
            held_window: Duration::from_secs(number("BENCH_HELD_SECONDS", 600)? as u64),
            dashboard_twds: number("BENCH_DASHBOARD_TWDS", pick(200, 40))?,
            dashboard_loads: number("BENCH_DASHBOARD_LOADS", pick(5, 3))?,
            dashboard_updates: number("BENCH_DASHBOARD_UPDATES", pick(10, 3))?,
            drain_workflows: number("BENCH_DRAIN_WORKFLOWS", 200)?,
            replay_workflows: number("BENCH_REPLAY_WORKFLOWS", 50)?,
            analysis_interval,
            analysis_rate,
            autoscale_rounds,
            autoscale_idle_window: Duration::from_secs(autoscale_idle_seconds as u64),
            json: std::env::var("BENCH_JSON")
                .unwrap_or_else(|_| "benchmarks/results.json".into())
                .into(),
            markdown: std::env::var("BENCH_MARKDOWN")
                .unwrap_or_else(|_| "BENCHMARKS.md".into())
                .into(),
        })
    }

    fn runs(&self, scenario: &str) -> bool {
        self.scenarios.iter().any(|s| s == scenario)
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("twc-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> anyhow::Result<()> {
    let options = Options::from_env()?;
    let cluster = Cluster::connect().await?;
    let run = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() % 100_000);
    let mut results = Results {
        context: context(&options),
        latency: None,
        steps: None,
        change_burst: None,
        burst: None,
        idle: None,
        held: None,
        burst_two_replicas: None,
        idle_two_replicas: None,
        dashboard: None,
        drain: None,
        replay: None,
        analysis: None,
        autoscaling: None,
    };
    if options.runs("latency") {
        tracing::info!(
            rollouts = options.rollouts,
            "latency: sequential AllAtOnce rollouts"
        );
        let ns = format!("bench-latency-{run}");
        results.latency = Some(latency::run(&cluster, &ns, options.rollouts).await?);
        save(&mut results, &options)?;
    }
    if options.runs("steps") {
        tracing::info!(
            rollouts = options.step_rollouts,
            "steps: Progressive rollouts"
        );
        let ns = format!("bench-steps-{run}");
        results.steps = Some(steps::run(&cluster, &ns, options.step_rollouts).await?);
        save(&mut results, &options)?;
    }
    let mut fleet = 0;
    if options.runs("change-burst") {
        tracing::info!(
            twds = options.change_twds,
            rounds = options.change_rounds,
            "change-burst: TWDs whose image changes at once"
        );
        let ns = format!("bench-change-{run}");
        results.change_burst = Some(
            fleet::change_burst(&cluster, &ns, options.change_twds, options.change_rounds).await?,
        );
        fleet += options.change_twds;
        save(&mut results, &options)?;
    }
    if options.runs("burst") {
        tracing::info!(twds = options.burst_twds, "burst: TWDs applied at once");
        let ns = format!("bench-burst-{run}");
        results.burst = Some(fleet::burst(&cluster, &ns, options.burst_twds).await?);
        fleet += options.burst_twds;
        save(&mut results, &options)?;
    }
    if options.runs("idle") {
        tracing::info!(
            twds = options.idle_twds,
            "idle: a rolled-out fleet left alone"
        );
        let ns = format!("bench-idle-{run}");
        results.idle =
            Some(fleet::idle(&cluster, fleet, &ns, options.idle_twds, options.idle_window).await?);
        fleet = fleet.max(options.idle_twds);
        save(&mut results, &options)?;
    }
    if options.runs("held") {
        tracing::info!(
            rollouts = options.held_twds,
            window = ?options.held_window,
            "held: rollouts held in a long step, nothing happening"
        );
        let ns = format!("bench-held-{run}");
        results.held =
            Some(held::run(&cluster, &ns, options.held_twds, options.held_window).await?);
        fleet += options.held_twds;
        save(&mut results, &options)?;
    }
    if options.runs("burst-2r") || options.runs("idle-2r") {
        tracing::info!("starting a second controller replica");
        cluster.start_replica().await?;
    }
    if options.runs("burst-2r") {
        tracing::info!(
            twds = options.burst_twds,
            "burst-2r: TWDs applied at once, two controller replicas"
        );
        let ns = format!("bench-burst2r-{run}");
        results.burst_two_replicas = Some(fleet::burst(&cluster, &ns, options.burst_twds).await?);
        fleet += options.burst_twds;
        save(&mut results, &options)?;
    }
    if options.runs("idle-2r") {
        tracing::info!(
            twds = fleet.max(options.idle_twds),
            "idle-2r: the fleet left alone, two controller replicas"
        );
        let ns = format!("bench-idle2r-{run}");
        results.idle_two_replicas =
            Some(fleet::idle(&cluster, fleet, &ns, options.idle_twds, options.idle_window).await?);
        save(&mut results, &options)?;
    }
    if cluster.controllers() > 1 {
        cluster.stop_replicas().await?;
    }
    if options.runs("dashboard") {
        tracing::info!(
            twds = options.dashboard_twds,
            loads = options.dashboard_loads,
            updates = options.dashboard_updates,
            "dashboard: the overview of the whole fleet in a browser"
        );
        let ns = format!("bench-dashboard-{run}");
        results.dashboard = Some(
            dashboard::run(
                &cluster,
                &ns,
                options.dashboard_twds,
                options.dashboard_loads,
                options.dashboard_updates,
            )
            .await?,
        );
        save(&mut results, &options)?;
    }
    if options.runs("drain") {
        tracing::info!(
            workflows = options.drain_workflows,
            "drain: a retired version with open pinned workflows"
        );
        let ns = format!("bench-drain-{run}");
        results.drain = Some(drain::run(&cluster, &ns, options.drain_workflows).await?);
        save(&mut results, &options)?;
    }
    if options.runs("analysis") {
        tracing::info!(
            interval = ?options.analysis_interval,
            rate = options.analysis_rate,
            "analysis: canary analysis stopping a bad build"
        );
        let ns = format!("bench-analysis-{run}");
        results.analysis = Some(
            analysis::run(
                &cluster,
                &ns,
                options.analysis_interval,
                options.analysis_rate,
            )
            .await?,
        );
        save(&mut results, &options)?;
    }
    if options.runs("autoscaling") {
        tracing::info!(
            rounds = options.autoscale_rounds,
            idle_window = ?options.autoscale_idle_window,
            "autoscaling: scaling a worker from its backlog"
        );
        let ns = format!("bench-autoscaling-{run}");
        results.autoscaling = Some(
            autoscaling::run(
                &cluster,
                &ns,
                options.autoscale_rounds,
                options.autoscale_idle_window,
            )
            .await?,
        );
        save(&mut results, &options)?;
    }
    if options.runs("replay") {
        tracing::info!(
            workflows = options.replay_workflows,
            "replay: the replay check of a new build"
        );
        let ns = format!("bench-replay-{run}");
        results.replay = Some(replay::run(&cluster, &ns, options.replay_workflows).await?);
        save(&mut results, &options)?;
    }
    println!("{}", results.table());
    Ok(())
}

/// Writes what has been measured so far (a later scenario failing loses nothing).
fn save(results: &mut Results, options: &Options) -> anyhow::Result<()> {
    results.context.date = utc_now();
    results.write(&options.json, &options.markdown)?;
    tracing::info!(json = %options.json.display(), markdown = %options.markdown.display(), "results written");
    Ok(())
}

fn context(options: &Options) -> RunContext {
    let mut command = String::from("make bench");
    for (key, value) in std::env::vars() {
        // The sandbox's extra dynamic config changes the server measured: the table says so.
        if (key.starts_with("BENCH_") && key != "BENCH_SERVERS")
            || key == "TWC_SANDBOX_TEMPORAL_DYNAMIC_CONFIG"
        {
            command.push_str(&format!(" {key}={value}"));
        }
    }
    let _ = options;
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    RunContext {
        date: utc_now(),
        command,
        cpu: cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|l| l.split_once(':'))
            .map_or_else(|| "unknown CPU".to_owned(), |(_, m)| m.trim().to_owned()),
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        memory_gib: meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|l| l.split_whitespace().next()?.parse::<f64>().ok())
            .map_or(0.0, |kib| kib / 1024.0 / 1024.0),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map_or_else(|_| "unknown".to_owned(), |k| k.trim().to_owned()),
        rustc: command_output("rustc", &["--version"]),
        servers: std::env::var("BENCH_SERVERS").unwrap_or_else(|_| "servers unknown".into()),
    }
}

fn utc_now() -> String {
    command_output("date", &["-u", "+%Y-%m-%d %H:%M UTC"])
}

fn command_output(program: &str, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map_or_else(
            || format!("{program}: unknown"),
            |o| String::from_utf8_lossy(&o.stdout).trim().to_owned(),
        )
}
