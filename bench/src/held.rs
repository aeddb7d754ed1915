//! What a held rollout costs while nothing happens: a few TWDs rolled to a new build with a
//! Progressive step far longer than the measurement (25 % for 2 h), then left alone for a
//! window. Every run of each rollout workflow and of its TWD workflow is read afterwards, and
//! the events stamped inside the window counted, with the Temporal Cloud actions they stand for
//! ([`crate::actions`]), per held rollout per hour.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use anyhow::bail;
use futures::{StreamExt, stream};
use serde::Serialize;
use serde_json::{Value, json};
use twc_workflows::model::TwdRef;

use crate::actions::{self, Cost, HOUR};
use crate::cluster::Cluster;
use crate::fleet::apply_all_with;
use crate::sampler::wait_quiet;
use crate::stats::Summary;

/// The held step's ramp.
pub const STEP_PERCENT: f64 = 25.0;
/// The held step's pause: far longer than any window.
pub const STEP_PAUSE: &str = "2h";
/// How long the rollouts may take to reach their step.
const RAMP_TIMEOUT: Duration = Duration::from_secs(600);
/// Concurrent history reads.
const READ_CONCURRENCY: usize = 4;

/// The held-rollout results.
#[derive(Debug, Clone, Serialize)]
pub struct Held {
    /// Rollouts held together.
    pub rollouts: usize,
    /// The step they were held in.
    pub step: String,
    /// The measured window, s.
    pub window_s: f64,
    /// Rollouts still ramping at the step when the window ended (all of them, or the figures
    /// are not of held rollouts).
    pub still_held: usize,
    /// Per held rollout.
    pub per_rollout: Vec<HeldRollout>,
    /// Events of each rollout workflow (every run) stamped inside the window, per hour.
    pub rollout_events_per_hour: Option<Summary>,
    /// Estimated Temporal actions of each rollout workflow, per hour.
    pub rollout_actions_per_hour: Option<Summary>,
    /// Events of each held rollout's TWD workflow (every run), per hour.
    pub twd_events_per_hour: Option<Summary>,
    /// Estimated Temporal actions of each held rollout's TWD workflow, per hour.
    pub twd_actions_per_hour: Option<Summary>,
    /// The rollout workflows' events and actions inside the window, all together.
    pub rollout_workflows: Cost,
    /// The TWD workflows' events and actions inside the window, all together.
    pub twd_workflows: Cost,
    /// Histories that could not be read (their workflows left out).
    pub unread: usize,
}

/// One held rollout.
#[derive(Debug, Clone, Serialize)]
pub struct HeldRollout {
    /// The TWD.
    pub twd: String,
    /// The held build.
    pub build_id: String,
    /// Its rollout workflow's events and actions inside the window.
    pub rollout: Cost,
    /// Its TWD workflow's events and actions inside the window.
    pub twd_workflow: Cost,
}

fn held_rollout() -> Value {
    json!({ "strategy": "Progressive",
        "steps": [ { "rampPercentage": STEP_PERCENT, "pauseDuration": STEP_PAUSE } ] })
}

/// `count` TWDs named `h000`… in `namespace` (and in the Temporal namespace of that name) are
/// rolled out, then rolled to a new build that ramps into the long step; once all ramp, the
/// benchmark leaves them alone for `window` and reads what their workflows recorded.
pub async fn run(
    cluster: &Cluster,
    namespace: &str,
    count: usize,
    window: Duration,
) -> anyhow::Result<Held> {
    cluster.namespace(namespace).await?;
    cluster.temporal_namespace(namespace).await?;
    let names: Vec<String> = (0..count).map(|i| format!("h{i:03}")).collect();
    // The first build goes Current at once (a Progressive rollout without a Current version
    // skips its steps); the second one ramps into the step and stays there.
    let expected: BTreeMap<String, String> = names
        .iter()
        .map(|n| (n.clone(), "held0-".to_owned()))
        .collect();
    let rollout = held_rollout();
    tokio::try_join!(
        cluster.wait_all_ready(namespace, &expected, RAMP_TIMEOUT),
        apply_all_with(cluster, namespace, &names, "held0", &rollout),
    )?;
    apply_all_with(cluster, namespace, &names, "held1", &rollout).await?;
    let deployment_names: Vec<String> = names.iter().map(|n| format!("{namespace}/{n}")).collect();
    let builds = wait_ramping(cluster, namespace, &deployment_names, "held1-").await?;
    // The step's own reports and status writes are over within a second; the rest of the
    // sandbox (an idle fleet's resyncs) need not be quiet.
    wait_quiet(cluster, Duration::from_secs(5), Duration::from_secs(60)).await?;
    tracing::info!(rollouts = count, ?window, "rollouts held; measuring");
    let from = SystemTime::now();
    tokio::time::sleep(window).await;
    let to = SystemTime::now();
    // Read after the window, so the reads are not in it.
    let still = ramping(cluster, namespace, &deployment_names, "held1-")
        .await
        .unwrap_or_default();
    let still_held = builds
        .iter()
        .filter(|(name, build)| still.get(*name) == Some(*build))
        .count();
    let read: Vec<Option<HeldRollout>> = stream::iter(names.iter().zip(&deployment_names))
        .map(|(name, deployment)| {
            let build = builds.get(deployment).cloned().unwrap_or_default();
            async move {
                let twd = TwdRef {
                    namespace: namespace.to_owned(),
                    name: name.clone(),
                };
                let cost = |id: String| async move {
                    match cluster.histories(&id).await {
                        Ok(runs) => Some(Cost::read(&runs, from, to)),
                        Err(e) => {
                            tracing::warn!("reading the history of {id}: {e:#}");
                            None
                        }
                    }
                };
                Some(HeldRollout {
                    rollout: cost(twd.rollout_workflow_id(&build)).await?,
                    twd_workflow: cost(twd.twd_workflow_id()).await?,
                    twd: name.clone(),
                    build_id: build,
                })
            }
        })
        .buffered(READ_CONCURRENCY)
        .collect()
        .await;
    let per_rollout: Vec<HeldRollout> = read.iter().flatten().cloned().collect();
    let window = to.duration_since(from).unwrap_or(window);
    let held = summarize(count, window, still_held, per_rollout, read.len());
    tracing::info!(
        rollout_events_per_hour = ?held.rollout_events_per_hour.as_ref().map(|s| s.median),
        rollout_actions_per_hour = ?held.rollout_actions_per_hour.as_ref().map(|s| s.median),
        twd_events_per_hour = ?held.twd_events_per_hour.as_ref().map(|s| s.median),
        still_held,
        "held rollouts"
    );
    Ok(held)
}

/// The figures of `per_rollout` over `window` (`attempted` rollouts read, some perhaps not).
fn summarize(
    count: usize,
    window: Duration,
    still_held: usize,
    per_rollout: Vec<HeldRollout>,
    attempted: usize,
) -> Held {
    let hourly = |f: &dyn Fn(&HeldRollout) -> usize| {
        let rates: Vec<f64> = per_rollout
            .iter()
            .filter_map(|r| actions::per_workflow(f(r), 1, window, HOUR))
            .collect();
        Summary::of(&rates)
    };
    let mut rollout_workflows = Cost::default();
    let mut twd_workflows = Cost::default();
    for r in &per_rollout {
        rollout_workflows.add(&r.rollout);
        twd_workflows.add(&r.twd_workflow);
    }
    Held {
        rollouts: count,
        step: format!("{STEP_PERCENT} % for {STEP_PAUSE}"),
        window_s: window.as_secs_f64(),
        still_held,
        rollout_events_per_hour: hourly(&|r| r.rollout.events),
        rollout_actions_per_hour: hourly(&|r| r.rollout.actions()),
        twd_events_per_hour: hourly(&|r| r.twd_workflow.events),
        twd_actions_per_hour: hourly(&|r| r.twd_workflow.actions()),
        rollout_workflows,
        twd_workflows,
        unread: attempted - per_rollout.len(),
        per_rollout,
    }
}

/// Waits until every deployment ramps a build with `prefix` at [`STEP_PERCENT`]; returns each
/// one's build.
async fn wait_ramping(
    cluster: &Cluster,
    temporal_namespace: &str,
    deployment_names: &[String],
    prefix: &str,
) -> anyhow::Result<BTreeMap<String, String>> {
    let deadline = tokio::time::Instant::now() + RAMP_TIMEOUT;
    loop {
        let ramping = ramping(cluster, temporal_namespace, deployment_names, prefix).await?;
        if ramping.len() == deployment_names.len() {
            return Ok(ramping);
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "only {} of {} deployments ramp {prefix}* at {STEP_PERCENT} % after {RAMP_TIMEOUT:?}",
                ramping.len(),
                deployment_names.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The deployments that ramp a build with `prefix` at [`STEP_PERCENT`], with that build.
async fn ramping(
    cluster: &Cluster,
    temporal_namespace: &str,
    deployment_names: &[String],
    prefix: &str,
) -> anyhow::Result<BTreeMap<String, String>> {
    let mut ramping = BTreeMap::new();
    for name in deployment_names {
        let routing = cluster
            .describe_deployment(temporal_namespace, name)
            .await?
            .routing_config
            .unwrap_or_default();
        let at_step = (f64::from(routing.ramping_version_percentage) - STEP_PERCENT).abs() < 0.01;
        if let Some(build) = routing
            .ramping_deployment_version
            .map(|v| v.build_id)
            .filter(|b| b.starts_with(prefix) && at_step)
        {
            ramping.insert(name.clone(), build);
        }
    }
    Ok(ramping)
}

#[cfg(test)]
mod tests {
    use crate::actions::Rule;

    use super::*;

    fn cost(events: usize, timers: usize, marker_tasks: usize) -> Cost {
        Cost {
            events,
            events_by_type: BTreeMap::new(),
            actions_by_rule: BTreeMap::from([
                (Rule::TimerStarted, timers),
                (Rule::LocalActivities, marker_tasks),
            ]),
        }
    }

    fn held(name: &str, rollout: Cost, twd: Cost) -> HeldRollout {
        HeldRollout {
            twd: name.to_owned(),
            build_id: "held1-b".to_owned(),
            rollout,
            twd_workflow: twd,
        }
    }

    #[test]
    fn held_figures_are_per_rollout_per_hour() {
        // 10 minutes: two idle turns (6 events, 2 actions each) in one rollout, three in the
        // other; the TWD workflows turned twice each.
        let per_rollout = vec![
            held("h000", cost(12, 2, 2), cost(12, 2, 2)),
            held("h001", cost(18, 3, 3), cost(12, 2, 2)),
        ];
        let h = summarize(3, Duration::from_secs(600), 2, per_rollout, 3);
        let events = h.rollout_events_per_hour.expect("rates");
        assert_eq!((events.n, events.min, events.max), (2, 72.0, 108.0));
        let actions = h.rollout_actions_per_hour.expect("rates");
        assert_eq!((actions.min, actions.max), (24.0, 36.0));
        assert_eq!(h.twd_events_per_hour.map(|s| s.median), Some(72.0));
        assert_eq!(
            (h.rollout_workflows.events, h.rollout_workflows.actions()),
            (30, 10)
        );
        assert_eq!((h.unread, h.still_held, h.rollouts), (1, 2, 3));
        assert_eq!(h.step, "25 % for 2h");
    }
}
