//! What a replay check costs (`spec.rollout.replayCheck`): one TWD of AutoUpgrade sample
//! workers with the check, `count` HelloWorld workflows completed on v1, then v2 rolled out.
//! From the v2 rollout's history (Temporal's event times): the build ready (the last
//! `wait_for_pollers` completed before the check) → `run_replay_check` completed (the verdict),
//! and the check's own activity (scheduled → completed), with the histories it replayed (its
//! result). The Temporal frontend's `ListWorkflowExecutions` and `GetWorkflowExecutionHistory`
//! requests (`service_requests`, every client) from the apply of v2 to v2 Current are the
//! extra reads: the controller's candidate listings and the Job's history fetches.

use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail};
use futures::{StreamExt, TryStreamExt, stream};
use serde::Serialize;
use serde_json::{Value, json};
use temporalio_common::protos::temporal::api::history::v1::HistoryEvent;
use temporalio_common::protos::temporal::api::history::v1::history_event::Attributes;

use crate::cluster::{Cluster, scrape, seconds_between, system_time, worker};
use crate::prom;

/// The TWD.
const NAME: &str = "replay";
/// Workflows started at once.
const PARALLEL: usize = 20;
/// How often Temporal is asked while waiting.
const POLL: Duration = Duration::from_millis(250);
/// How long a rollout may take before the benchmark gives up.
const ROLLOUT_TIMEOUT: Duration = Duration::from_secs(300);

/// The replay check's cost (one run).
#[derive(Debug, Clone, Serialize)]
pub struct ReplayCost {
    /// HelloWorld workflows completed on v1 (the candidates).
    pub workflows: usize,
    /// Histories the check replayed (its verdict), if the history says.
    pub histories: Option<u64>,
    /// The rollout's last `wait_for_pollers` completed (v2 ready) → `run_replay_check`
    /// completed (the verdict), s, Temporal's event times.
    pub ready_to_verdict_s: Option<f64>,
    /// `run_replay_check` scheduled → completed, s.
    pub check_activity_s: Option<f64>,
    /// Apply of v2 → v2 seen Current, s.
    pub apply_to_current_s: f64,
    /// `ListWorkflowExecutions` requests the Temporal frontend served meanwhile.
    pub list_requests: f64,
    /// `GetWorkflowExecutionHistory` requests the Temporal frontend served meanwhile.
    pub history_requests: f64,
}

fn checked_worker(namespace: &str, temporal_namespace: &str, tag: &str, queue: &str) -> Value {
    let mut manifest = worker(
        namespace,
        temporal_namespace,
        NAME,
        tag,
        json!({ "strategy": "AllAtOnce", "replayCheck": { "args": ["replay"], "maxHistories": 50 } }),
    );
    manifest["spec"]["template"]["spec"]["containers"][0]["env"] = json!([
        { "name": "SAMPLE_TASK_QUEUE", "value": queue },
        { "name": "SAMPLE_VERSIONING_BEHAVIOR", "value": "auto-upgrade" },
    ]);
    manifest
}

/// Frontend requests of `operation` so far.
async fn served(url: &str, operation: &str) -> anyhow::Result<f64> {
    let page = scrape(url).await?;
    Ok(prom::sum(&page, "service_requests", |s| {
        s.label("operation") == Some(operation) && s.label("service_name") == Some("frontend")
    }))
}

/// Rolls out v1, completes `count` workflows on it, rolls out v2 and reads the check's cost.
pub async fn run(cluster: &Cluster, namespace: &str, count: usize) -> anyhow::Result<ReplayCost> {
    cluster.namespace(namespace).await?;
    let temporal_namespace = cluster.env.temporal_namespace.clone();
    let queue = format!("{namespace}-hello");
    let deployment_name = format!("{namespace}/{NAME}");
    cluster
        .apply(&checked_worker(
            namespace,
            &temporal_namespace,
            "rp1",
            &queue,
        ))
        .await?;
    let expected = [(NAME.to_owned(), "rp1-".to_owned())].into();
    cluster
        .wait_all_ready(namespace, &expected, ROLLOUT_TIMEOUT)
        .await
        .context("rolling out v1")?;
    let v1 = cluster.current_build(&deployment_name).await?;
    let ids: Vec<String> = (1..=count)
        .map(|i| format!("{namespace}-hello-{i}"))
        .collect();
    stream::iter(&ids)
        .map(|id| cluster.start_workflow("HelloWorld", &queue, id))
        .buffer_unordered(PARALLEL)
        .try_collect::<Vec<()>>()
        .await?;
    let deadline = Instant::now() + ROLLOUT_TIMEOUT;
    loop {
        let closed = cluster
            .list_workflows(&format!(
                "TemporalWorkerDeploymentVersion = '{deployment_name}:{v1}' AND ExecutionStatus = 'Completed'"
            ))
            .await?
            .len();
        if closed >= count {
            break;
        }
        if Instant::now() >= deadline {
            bail!("{closed} of {count} workflows completed on {v1}");
        }
        tokio::time::sleep(POLL).await;
    }

    let url = cluster.metrics_pages().temporal;
    let (lists, fetches) = (
        served(&url, "ListWorkflowExecutions").await?,
        served(&url, "GetWorkflowExecutionHistory").await?,
    );
    let applied = Instant::now();
    cluster
        .apply(&checked_worker(
            namespace,
            &temporal_namespace,
            "rp2",
            &queue,
        ))
        .await?;
    let v2 = loop {
        if let Ok(build) = cluster.current_build(&deployment_name).await
            && build != v1
        {
            break build;
        }
        if Instant::now() >= deadline + ROLLOUT_TIMEOUT {
            bail!("{deployment_name}: v2 not Current after {ROLLOUT_TIMEOUT:?}");
        }
        tokio::time::sleep(POLL).await;
    };
    let apply_to_current_s = applied.elapsed().as_secs_f64();
    let list_requests = served(&url, "ListWorkflowExecutions").await? - lists;
    let history_requests = served(&url, "GetWorkflowExecutionHistory").await? - fetches;
    let runs = cluster
        .histories(&format!("rollout/{deployment_name}/{v2}"))
        .await?;
    let events: Vec<HistoryEvent> = runs.into_iter().flatten().collect();
    let (ready, scheduled, completed, histories) = check_times(&events);
    let measured = ReplayCost {
        workflows: count,
        histories,
        ready_to_verdict_s: ready.zip(completed).map(|(a, b)| seconds_between(a, b)),
        check_activity_s: scheduled.zip(completed).map(|(a, b)| seconds_between(a, b)),
        apply_to_current_s,
        list_requests,
        history_requests,
    };
    tracing::info!(?measured, "replay: v2 checked and Current");
    Ok(measured)
}

/// From a rollout's history: the last `wait_for_pollers` completed before the check, the
/// check scheduled and completed, and the histories its result says it replayed.
fn check_times(
    events: &[HistoryEvent],
) -> (
    Option<SystemTime>,
    Option<SystemTime>,
    Option<SystemTime>,
    Option<u64>,
) {
    let mut types = std::collections::BTreeMap::new();
    let (mut ready, mut scheduled, mut completed, mut histories) = (None, None, None, None);
    for event in events {
        let at = system_time(event.event_time.as_ref());
        match &event.attributes {
            Some(Attributes::ActivityTaskScheduledEventAttributes(a)) => {
                let name = a.activity_type.as_ref().map(|t| t.name.clone());
                types.insert(event.event_id, name.clone().unwrap_or_default());
                if name.as_deref() == Some("run_replay_check") && scheduled.is_none() {
                    scheduled = at;
                }
            }
            Some(Attributes::ActivityTaskCompletedEventAttributes(a)) => {
                match types.get(&a.scheduled_event_id).map(String::as_str) {
                    Some("wait_for_pollers") if scheduled.is_none() => ready = at,
                    Some("run_replay_check") if completed.is_none() => {
                        completed = at;
                        histories = a
                            .result
                            .as_ref()
                            .and_then(|r| r.payloads.first())
                            .and_then(|p| serde_json::from_slice::<Value>(&p.data).ok())
                            .and_then(|v| v["Passed"]["histories"].as_u64());
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }
    (ready, scheduled, completed, histories)
}
