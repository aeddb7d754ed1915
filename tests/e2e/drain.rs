//! Draining retired versions on purpose (`spec.sunset.drain`, SPEC §11), end to end: long
//! running pinned sample workflows (`Subscription` obeys the drain signal by continuing as new
//! onto the Current version, `Stubborn` ignores it), a real Temporal dev server running the
//! batch operations, and the controller retiring the old version with no person involved.

use std::time::Duration;

use serde_json::{Value, json};

use crate::chaos::cluster::{Cluster, Private};
use crate::harness::cli::json_output;
use crate::harness::controls::{events, holds_for, kubectl_twc, wait_event};
use crate::harness::twd::{
    apply, connection, deployments, get_twd, routing, target_build, wait_ready, worker,
};
use crate::harness::wait::wait_for;
use crate::harness::webhook::{
    Receiver, events as notified, notifications_of, url_secret, wait_delivered,
};
use crate::harness::{kube_client, test_namespace};

const ROLLOUT: Duration = Duration::from_secs(180);
const DRAIN: Duration = Duration::from_secs(120);
/// The drain signal the sample workflows listen for (the default `signalName`).
pub(crate) const SIGNAL: &str = "twc-drain";

/// A TWD whose sample workers poll `task_queue`, retiring versions fast, with `drain`.
pub(crate) fn drained_worker(
    ns: &str,
    name: &str,
    tag: &str,
    task_queue: &str,
    drain: Value,
) -> Value {
    let mut manifest = worker(ns, name, tag, json!({ "strategy": "AllAtOnce" }));
    manifest["spec"]["template"]["spec"]["containers"][0]["env"] =
        json!([{ "name": "SAMPLE_TASK_QUEUE", "value": task_queue }]);
    manifest["spec"]["sunset"] =
        json!({ "scaledownDelay": "2s", "deleteDelay": "3s", "drain": drain });
    manifest
}

pub(crate) async fn start_workflow(cluster: &Cluster, type_: &str, task_queue: &str, id: &str) {
    start_workflow_with(cluster, type_, task_queue, id, None).await;
}

/// Starts workflow `id` of `type_` on `task_queue`, with `input` (JSON) when given.
pub(crate) async fn start_workflow_with(
    cluster: &Cluster,
    type_: &str,
    task_queue: &str,
    id: &str,
    input: Option<&str>,
) {
    let mut args = vec![
        "workflow",
        "start",
        "--type",
        type_,
        "--task-queue",
        task_queue,
        "--workflow-id",
        id,
    ];
    if let Some(input) = input {
        args.extend(["--input", input]);
    }
    let out = cluster.temporal(&args).await;
    assert!(out.success, "temporal workflow start {id}: {}", out.stderr);
}

/// Status (`RUNNING`, `CANCELED`, ...) and build ID of the latest run of `id`.
pub(crate) async fn latest_run(cluster: &Cluster, id: &str) -> Result<(String, String), String> {
    let v = json_output(
        cluster
            .temporal(&[
                "workflow",
                "describe",
                "--workflow-id",
                id,
                "--output",
                "json",
            ])
            .await,
    )?;
    let info = &v["workflowExecutionInfo"];
    let status = info["status"]
        .as_str()
        .unwrap_or_default()
        .trim_start_matches("WORKFLOW_EXECUTION_STATUS_")
        .to_owned();
    let versioning = &info["versioningInfo"];
    let build = versioning["deploymentVersion"]["buildId"]
        .as_str()
        .map(str::to_owned)
        .or_else(|| {
            versioning["version"]
                .as_str()
                .and_then(|v| v.rsplit_once(':'))
                .map(|(_, b)| b.to_owned())
        })
        .unwrap_or_default();
    Ok((status, build))
}

/// Waits until the latest run of each of `ids` is `status` on a build starting with `tag-`.
pub(crate) async fn wait_runs(cluster: &Cluster, ids: &[String], status: &str, tag: &str) {
    wait_runs_within(cluster, ids, status, tag, DRAIN).await;
}

/// [`wait_runs`] with a deadline of the caller's.
pub(crate) async fn wait_runs_within(
    cluster: &Cluster,
    ids: &[String],
    status: &str,
    tag: &str,
    deadline: Duration,
) {
    let prefix = format!("{tag}-");
    wait_for(&format!("{ids:?} {status} on {tag}"), deadline, || async {
        let mut seen = Vec::new();
        for id in ids {
            let (s, build) = latest_run(cluster, id).await?;
            if s != status || !build.starts_with(&prefix) {
                return Err(format!("{id}: {s} on {build:?}; before: {seen:?}"));
            }
            seen.push((id.clone(), s, build));
        }
        Ok(())
    })
    .await;
}

/// History events of every run of `id` for which `keep` holds.
pub(crate) async fn count_events(
    cluster: &Cluster,
    id: &str,
    keep: impl Fn(&Value) -> bool,
) -> Result<usize, String> {
    let mut count = 0;
    for run in cluster.workflows(&format!("WorkflowId = '{id}'")).await? {
        let history: Value = serde_json::from_str(
            &cluster
                .history(&cluster.env.temporal_namespace, id, &run.run_id)
                .await?,
        )
        .map_err(|e| e.to_string())?;
        count += history["events"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| keep(e))
            .count();
    }
    Ok(count)
}

/// How many times `id`'s runs (all of them) received the drain signal.
pub(crate) async fn drain_signals(cluster: &Cluster, id: &str) -> Result<usize, String> {
    count_events(cluster, id, |e| {
        e["workflowExecutionSignaledEventAttributes"]["signalName"].as_str() == Some(SIGNAL)
    })
    .await
}

/// How many cancellation requests `id`'s runs received.
pub(crate) async fn cancel_requests(cluster: &Cluster, id: &str) -> Result<usize, String> {
    count_events(cluster, id, |e| {
        e.get("workflowExecutionCancelRequestedEventAttributes")
            .is_some()
    })
    .await
}

#[tokio::test]
async fn obeying_workflows_move_to_v2_the_rest_are_cancelled_and_v1_is_retired_unattended() {
    let client = kube_client().await;
    let cluster = Cluster::shared().await;
    let ns = test_namespace(&client, "drain").await;
    let tq = format!("drain-{ns}");
    let other_tq = format!("drain-other-{ns}");
    let drain = json!({ "signalAfter": "5s", "cancelAfter": "15s" });
    // A webhook told of drain actions.
    let receiver = Receiver::start().await;
    let told_of_drains = |tag: &str, drain: Value| {
        let mut manifest = drained_worker(&ns, "hello", tag, &tq, drain);
        manifest["spec"]["notifications"] = notifications_of("ops", "hook", &["Drain"]);
        manifest
    };
    apply(&connection(&ns)).await;
    apply(&url_secret(&ns, "hook", &receiver.url)).await;
    apply(&told_of_drains("v1", drain.clone())).await;
    apply(&drained_worker(
        &ns,
        "other",
        "v1",
        &other_tq,
        drain.clone(),
    ))
    .await;
    let twd = wait_ready(&client, &ns, "hello", ROLLOUT).await;
    let v1 = target_build(&twd).unwrap_or_default();
    wait_ready(&client, &ns, "other", ROLLOUT).await;

    let obeying: Vec<String> = (1..=3).map(|i| format!("{ns}-sub-{i}")).collect();
    let stubborn: Vec<String> = (1..=2).map(|i| format!("{ns}-stub-{i}")).collect();
    for id in &obeying {
        start_workflow(&cluster, "Subscription", &tq, id).await;
    }
    for id in &stubborn {
        start_workflow(&cluster, "Stubborn", &tq, id).await;
    }
    let bystander = format!("{ns}-other-sub");
    start_workflow(&cluster, "Subscription", &other_tq, &bystander).await;
    let all: Vec<String> = obeying.iter().chain(&stubborn).cloned().collect();
    wait_runs(&cluster, &all, "RUNNING", "v1").await;
    wait_runs(&cluster, std::slice::from_ref(&bystander), "RUNNING", "v1").await;

    apply(&told_of_drains("v2", drain)).await;
    let twd = wait_ready(&client, &ns, "hello", ROLLOUT).await;
    let v2 = target_build(&twd).unwrap_or_default();
    let on_v2 = format!("{ns}-sub-on-v2");
    start_workflow(&cluster, "Subscription", &tq, &on_v2).await;
    wait_runs(&cluster, std::slice::from_ref(&on_v2), "RUNNING", "v2").await;

    // After signalAfter: the obeying workflows continued as new onto v2.
    wait_runs(&cluster, &obeying, "RUNNING", "v2").await;
    wait_event(&client, &ns, "hello", "DrainSignalled", &v1, DRAIN).await;
    // After cancelAfter: the others are cancelled.
    wait_runs(&cluster, &stubborn, "CANCELED", "v1").await;
    wait_event(&client, &ns, "hello", "DrainCancelled", &v1, DRAIN).await;
    // The webhook was told of both, in order, naming the build.
    let told = wait_delivered(&receiver, 2, DRAIN).await;
    assert_eq!(
        notified(&told),
        [("Drain", "DrainSignalled"), ("Drain", "DrainCancelled")]
            .map(|(e, r)| (e.to_owned(), r.to_owned())),
        "{told:#?}"
    );
    assert!(
        told.iter()
            .all(|b| b["message"].as_str().is_some_and(|m| m.contains(&v1))),
        "{told:#?}"
    );
    // v1 drains, is scaled down and deleted, Deployment and Temporal version.
    let deployment_name = format!("{ns}/hello");
    wait_for(
        "v1 deleted from Kubernetes and Temporal",
        ROLLOUT,
        || async {
            let deps = deployments(&client, &ns, "hello").await;
            let r = routing(&deployment_name).await?;
            if deps.iter().all(|d| d.1 != v1) && !r.versions.contains(&v1) {
                Ok(())
            } else {
                Err(format!("deployments {deps:?}; versions {:?}", r.versions))
            }
        },
    )
    .await;

    // Untouched: the workflow on v2 and the other TWD's workflow, never signalled.
    for id in [&on_v2, &bystander] {
        let (status, _) = latest_run(&cluster, id)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(status, "RUNNING", "{id}");
        let signals = drain_signals(&cluster, id)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(signals, 0, "{id} was signalled");
    }
    assert_ne!(v1, v2);
}

#[tokio::test]
async fn a_dry_run_counts_and_acts_on_nothing() {
    let client = kube_client().await;
    let cluster = Cluster::shared().await;
    let ns = test_namespace(&client, "drain-dry").await;
    let tq = format!("drain-{ns}");
    let drain = json!({ "signalAfter": "1s", "cancelAfter": "2s", "dryRun": true });
    apply(&connection(&ns)).await;
    apply(&drained_worker(&ns, "hello", "v1", &tq, drain.clone())).await;
    wait_ready(&client, &ns, "hello", ROLLOUT).await;
    let ids: Vec<String> = (1..=2).map(|i| format!("{ns}-stub-{i}")).collect();
    for id in &ids {
        start_workflow(&cluster, "Stubborn", &tq, id).await;
    }
    wait_runs(&cluster, &ids, "RUNNING", "v1").await;
    apply(&drained_worker(&ns, "hello", "v2", &tq, drain)).await;
    wait_ready(&client, &ns, "hello", ROLLOUT).await;
    let (_, _, message) =
        wait_event(&client, &ns, "hello", "DrainCancelled", "Dry run", DRAIN).await;
    assert!(message.contains("would cancel 2 workflows"), "{message}");
    // Counted in status too.
    wait_for(
        "the open pinned workflows counted in status",
        DRAIN,
        || async {
            let twd = get_twd(&client, &ns, "hello").await?;
            let counted = twd
                .status
                .as_ref()
                .and_then(|s| s.deprecated_versions.first())
                .and_then(|d| d.open_pinned_workflows);
            if counted == Some(2) {
                Ok(())
            } else {
                Err(format!("{:?}", twd.status.map(|s| s.deprecated_versions)))
            }
        },
    )
    .await;
    // And in `kubectl twc status`.
    let shown = kubectl_twc(&["status", "hello", "-n", &ns]).await;
    assert_eq!(shown.code, Some(0), "{shown:?}");
    let drain_table = shown
        .stdout
        .split("Drain (spec.sunset.drain)")
        .nth(1)
        .unwrap_or_default();
    assert!(
        drain_table
            .lines()
            .any(|l| l.contains("v1-") && l.contains(" 2 ")),
        "{}",
        shown.stdout
    );
    for id in &ids {
        let (status, _) = latest_run(&cluster, id)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(status, "RUNNING", "{id} was acted on in a dry run");
        assert_eq!(
            drain_signals(&cluster, id)
                .await
                .unwrap_or_else(|e| panic!("{e}")),
            0
        );
    }
}

#[tokio::test]
async fn workflows_of_a_build_declared_compatible_move_to_the_current_version_and_complete_there() {
    let client = kube_client().await;
    let cluster = Cluster::shared().await;
    let ns = test_namespace(&client, "drain-move").await;
    let tq = format!("drain-{ns}");
    apply(&connection(&ns)).await;
    // First without the declaration, to learn v1's build ID.
    let plain = json!({ "signalAfter": "1h" });
    apply(&drained_worker(&ns, "hello", "v1", &tq, plain)).await;
    let twd = wait_ready(&client, &ns, "hello", ROLLOUT).await;
    let v1 = target_build(&twd).unwrap_or_default();
    let compatible = json!({ "signalAfter": "1h", "moveToCurrent": { "buildIDs": [v1] } });
    apply(&drained_worker(&ns, "hello", "v1", &tq, compatible.clone())).await;
    let sleepers: Vec<String> = (1..=2).map(|i| format!("{ns}-sleep-{i}")).collect();
    for id in &sleepers {
        let out = cluster
            .temporal(&[
                "workflow",
                "start",
                "--type",
                "Sleeper",
                "--task-queue",
                &tq,
                "--workflow-id",
                id,
                "--input",
                "25",
            ])
            .await;
        assert!(out.success, "{}", out.stderr);
    }
    wait_runs(&cluster, &sleepers, "RUNNING", "v1").await;
    apply(&drained_worker(&ns, "hello", "v2", &tq, compatible)).await;
    let twd = wait_ready(&client, &ns, "hello", ROLLOUT).await;
    let v2 = target_build(&twd).unwrap_or_default();
    wait_event(&client, &ns, "hello", "DrainMovedToCurrent", &v1, DRAIN).await;
    // They complete on v2: the sample Sleeper returns the build that ran its last task.
    for id in &sleepers {
        let result = wait_for(&format!("{id} completed"), DRAIN, || async {
            let out = cluster
                .temporal(&[
                    "workflow",
                    "result",
                    "--workflow-id",
                    id,
                    "--output",
                    "json",
                ])
                .await;
            if out.success {
                Ok(out.stdout)
            } else {
                Err(out.stderr)
            }
        })
        .await;
        assert!(result.contains(&v2), "{id} completed elsewhere: {result}");
    }
}

#[tokio::test]
async fn a_rollback_to_the_draining_version_stops_its_drain() {
    let client = kube_client().await;
    let cluster = Cluster::shared().await;
    let ns = test_namespace(&client, "drain-rollback").await;
    let tq = format!("drain-{ns}");
    let drain = json!({ "signalAfter": "15s" });
    apply(&connection(&ns)).await;
    apply(&drained_worker(&ns, "hello", "v1", &tq, drain.clone())).await;
    let twd = wait_ready(&client, &ns, "hello", ROLLOUT).await;
    let v1 = target_build(&twd).unwrap_or_default();
    let id = format!("{ns}-sub");
    start_workflow(&cluster, "Subscription", &tq, &id).await;
    wait_runs(&cluster, std::slice::from_ref(&id), "RUNNING", "v1").await;
    apply(&drained_worker(&ns, "hello", "v2", &tq, drain.clone())).await;
    wait_ready(&client, &ns, "hello", ROLLOUT).await;
    // Back to v1 within its rollback window: promoted at once, before its signalAfter.
    apply(&drained_worker(&ns, "hello", "v1", &tq, drain)).await;
    let twd = wait_ready(&client, &ns, "hello", ROLLOUT).await;
    assert_eq!(target_build(&twd).as_deref(), Some(v1.as_str()));
    holds_for(
        "no drain step for the Current v1",
        Duration::from_secs(20),
        || async {
            let drained: Vec<_> = events(&client, &ns, "hello")
                .await
                .into_iter()
                .filter(|(_, reason, message)| reason.starts_with("Drain") && message.contains(&v1))
                .collect();
            if drained.is_empty() {
                Ok(())
            } else {
                Err(format!("{drained:?}"))
            }
        },
    )
    .await;
    let (status, build) = latest_run(&cluster, &id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (status.as_str(), build.starts_with("v1-")),
        ("RUNNING", true)
    );
    assert_eq!(
        drain_signals(&cluster, &id)
            .await
            .unwrap_or_else(|e| panic!("{e}")),
        0
    );
}

#[tokio::test]
async fn a_controller_killed_between_the_signal_and_the_cancel_signals_once_and_cancels_once() {
    let mut private = Private::start("drain-kill").await;
    let ns = private.cluster.namespace("drain-kill").await;
    let tq = format!("drain-{ns}");
    let drain = json!({ "signalAfter": "2s", "cancelAfter": "20s" });
    private
        .cluster
        .apply(&private.cluster.connection(&ns, "dev"))
        .await;
    private
        .cluster
        .apply(&drained_worker(&ns, "hello", "v1", &tq, drain.clone()))
        .await;
    private
        .cluster
        .wait_ready(&ns, "hello", "v1", ROLLOUT)
        .await;
    let ids: Vec<String> = (1..=2).map(|i| format!("{ns}-stub-{i}")).collect();
    for id in &ids {
        start_workflow(&private.cluster, "Stubborn", &tq, id).await;
    }
    wait_runs(&private.cluster, &ids, "RUNNING", "v1").await;
    private
        .cluster
        .apply(&drained_worker(&ns, "hello", "v2", &tq, drain))
        .await;
    private
        .cluster
        .wait_ready(&ns, "hello", "v2", ROLLOUT)
        .await;
    let client = private.cluster.client.clone();
    private
        .cluster
        .wait("the drain signal sent", DRAIN, || async {
            let all = events(&client, &ns, "hello").await;
            if all.iter().any(|(_, r, _)| r == "DrainSignalled") {
                Ok(())
            } else {
                Err(format!("{all:?}"))
            }
        })
        .await;
    assert!(private.sandbox.kill_controller().await.is_some());
    assert!(private.sandbox.restart_dead_controller().is_some());
    wait_runs(&private.cluster, &ids, "CANCELED", "v1").await;
    for id in &ids {
        let signals = drain_signals(&private.cluster, id)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(signals, 1, "{id} signalled {signals} times");
        let cancels = cancel_requests(&private.cluster, id)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cancels, 1, "{id} asked to cancel {cancels} times");
    }
    private.sandbox.stop().await;
}
