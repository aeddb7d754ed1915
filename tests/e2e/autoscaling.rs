//! Autoscaling each version from Temporal's own backlog (`spec.autoscaling`), and the TWD's
//! `/scale` subresource, end to end: sample workers with one activity slot and a slow activity
//! (so load builds a real backlog on the version's task queues), the sandbox's load generator,
//! and the controller reading each version's task-queue statistics from the dev server.

use std::time::Duration;

use serde_json::{Value, json};
use twc_sandbox::load::{LoadConfig, LoadGenerator};

use crate::chaos::cluster::Private;
use crate::harness::cli::kubectl;
use crate::harness::controls::{Via, holds_for, kubectl_twc, send, wait_event};
use crate::harness::twd::{apply, connection, deployments, target_build, wait_ready, worker};
use crate::harness::wait::wait_for;
use crate::harness::{env, kube_client, test_namespace};

const ROLLOUT: Duration = Duration::from_secs(180);
const SCALING: Duration = Duration::from_secs(120);

/// A TWD of sample workers on `task_queue` with one activity slot and a 400 ms activity, so a
/// few workflows per second build a backlog; `autoscaling` as given, `rollout` as given.
fn scaled_worker(
    ns: &str,
    tag: &str,
    task_queue: &str,
    rollout: Value,
    autoscaling: Value,
) -> Value {
    let mut manifest = worker(ns, "hello", tag, rollout);
    let spec = &mut manifest["spec"];
    if let Some(spec) = spec.as_object_mut() {
        spec.remove("replicas");
    }
    spec["autoscaling"] = autoscaling;
    spec["template"]["spec"]["containers"][0]["env"] = json!([
        { "name": "SAMPLE_TASK_QUEUE", "value": task_queue },
        { "name": "SAMPLE_ACTIVITY_SLOTS", "value": "1" },
        { "name": "SAMPLE_GREET_DELAY_MS", "value": "400" },
    ]);
    manifest
}

/// Spec replicas of the TWD's Deployment of the build starting with `tag-`.
async fn replicas(client: &kube::Client, ns: &str, tag: &str) -> Result<Option<i32>, String> {
    let prefix = format!("{tag}-");
    let api: kube::Api<k8s_openapi::api::apps::v1::Deployment> =
        kube::Api::namespaced(client.clone(), ns);
    let list = api
        .list(&kube::api::ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    list.items
        .iter()
        .find(|d| {
            d.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("temporal.io/build-id"))
                .is_some_and(|b| b.starts_with(&prefix))
        })
        .map(|d| d.spec.as_ref().and_then(|s| s.replicas))
        .ok_or_else(|| format!("no Deployment of {tag}"))
}

async fn wait_replicas(client: &kube::Client, ns: &str, tag: &str, wanted: i32) {
    wait_for(&format!("{tag} at {wanted} replicas"), SCALING, || async {
        match replicas(client, ns, tag).await? {
            Some(r) if r == wanted => Ok(()),
            other => Err(format!("{tag}: {other:?}")),
        }
    })
    .await;
}

async fn load(task_queue: &str, id_prefix: &str, rate: f64) -> LoadGenerator {
    let config = LoadConfig {
        namespace: env().temporal_namespace.clone(),
        task_queue: task_queue.to_owned(),
        id_prefix: id_prefix.to_owned(),
        ..LoadConfig::new(env().temporal_address.clone(), rate)
    };
    match LoadGenerator::start(config).await {
        Ok(generator) => generator,
        Err(e) => panic!("starting the load generator: {e}"),
    }
}

#[tokio::test]
async fn a_backlog_raises_the_current_version_to_its_maximum_and_it_comes_back_down_after_the_window()
 {
    let client = kube_client().await;
    let ns = test_namespace(&client, "autoscale").await;
    let tq = format!("autoscale-{ns}");
    let autoscaling = json!({
        "minReplicas": 1, "maxReplicas": 3, "backlogPerReplica": 3,
        "scaleUpWindow": "2s", "scaleDownWindow": "20s"
    });
    apply(&connection(&ns)).await;
    apply(&scaled_worker(
        &ns,
        "v1",
        &tq,
        json!({ "strategy": "AllAtOnce" }),
        autoscaling,
    ))
    .await;
    wait_ready(&client, &ns, "hello", ROLLOUT).await;
    wait_replicas(&client, &ns, "v1", 1).await;

    // 6 workflows a second against 2.5 activities a second per replica: a backlog grows.
    let generator = load(&tq, &format!("{ns}-load-"), 6.0).await;
    wait_replicas(&client, &ns, "v1", 3).await;
    let (_, _, message) =
        wait_event(&client, &ns, "hello", "Scaled", "to 3 replicas", SCALING).await;
    assert!(
        message.contains("backlog") && message.contains("3 waiting tasks per replica"),
        "the event gives the numbers: {message}"
    );
    let shown = kubectl_twc(&["status", "hello", "-n", &ns]).await;
    assert_eq!(shown.code, Some(0), "{shown:?}");
    let section = shown
        .stdout
        .split("Autoscaling (spec.autoscaling)")
        .nth(1)
        .unwrap_or_default();
    assert!(
        section.contains("1..3 replicas") && section.contains("to 3 replicas"),
        "kubectl twc status shows the policy and the last change: {}",
        shown.stdout
    );
    let stats = generator.stop().await.unwrap_or_else(|e| panic!("{e}"));
    assert!(stats.started > 0, "{stats:?}");
    // Not before the scale-down window: still 3 for a while after the load stopped.
    holds_for(
        "three replicas during the scale-down window",
        Duration::from_secs(8),
        || async {
            match replicas(&client, &ns, "v1").await? {
                Some(3) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    // Then back to the minimum.
    wait_replicas(&client, &ns, "v1", 1).await;
}

#[tokio::test]
async fn a_ramping_version_holds_its_share_and_takes_all_replicas_at_promotion() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "autoscale-ramp").await;
    let tq = format!("autoscale-{ns}");
    let autoscaling = json!({
        "minReplicas": 5, "maxReplicas": 5, "backlogPerReplica": 100,
        "scaleUpWindow": "0s", "scaleDownWindow": "0s"
    });
    let rollout = json!({ "strategy": "Progressive",
        "steps": [ { "rampPercentage": 20, "pauseDuration": "1h" } ] });
    apply(&connection(&ns)).await;
    apply(&scaled_worker(
        &ns,
        "v1",
        &tq,
        rollout.clone(),
        autoscaling.clone(),
    ))
    .await;
    wait_ready(&client, &ns, "hello", ROLLOUT).await;
    wait_replicas(&client, &ns, "v1", 5).await;
    apply(&scaled_worker(&ns, "v2", &tq, rollout, autoscaling)).await;
    // 20 % of 5: one replica for v2, four for v1.
    wait_replicas(&client, &ns, "v2", 1).await;
    wait_replicas(&client, &ns, "v1", 4).await;
    send(Via::Cli, "promote", &ns, "hello").await;
    let twd = wait_ready(&client, &ns, "hello", ROLLOUT).await;
    assert!(target_build(&twd).is_some_and(|b| b.starts_with("v2-")));
    wait_replicas(&client, &ns, "v2", 5).await;
}

#[tokio::test]
async fn a_draining_version_at_zero_is_revived_for_its_pinned_workflow_then_scaled_back() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "autoscale-revive").await;
    let tq = format!("autoscale-{ns}");
    let autoscaling = json!({
        "minReplicas": 1, "maxReplicas": 2, "backlogPerReplica": 5,
        "scaleUpWindow": "0s", "scaleDownWindow": "5s",
        "draining": { "minReplicas": 0, "maxReplicas": 1 }
    });
    let rollout = json!({ "strategy": "AllAtOnce" });
    apply(&connection(&ns)).await;
    apply(&scaled_worker(
        &ns,
        "v1",
        &tq,
        rollout.clone(),
        autoscaling.clone(),
    ))
    .await;
    wait_ready(&client, &ns, "hello", ROLLOUT).await;
    // A long-running workflow pinned to v1.
    let id = format!("{ns}-sub");
    let started = crate::harness::cli::temporal(&[
        "workflow",
        "start",
        "--type",
        "Subscription",
        "--task-queue",
        &tq,
        "--workflow-id",
        &id,
    ])
    .await;
    assert!(started.success, "{}", started.stderr);
    wait_for("the subscription running on v1", SCALING, || async {
        let v = crate::harness::cli::describe_workflow(&id).await?;
        let build = v["workflowExecutionInfo"]["versioningInfo"]["deploymentVersion"]["buildId"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if build.starts_with("v1-") {
            Ok(())
        } else {
            Err(format!("on {build:?}"))
        }
    })
    .await;
    apply(&scaled_worker(&ns, "v2", &tq, rollout, autoscaling)).await;
    wait_ready(&client, &ns, "hello", ROLLOUT).await;
    // v1 drains (its subscription is open) and, idle, is scaled to zero.
    wait_replicas(&client, &ns, "v1", 0).await;
    // The subscription wakes up: its workflow task waits on v1's queue, v1 is revived.
    let ended = crate::harness::cli::temporal(&[
        "workflow",
        "signal",
        "--workflow-id",
        &id,
        "--name",
        "end",
    ])
    .await;
    assert!(ended.success, "{}", ended.stderr);
    wait_event(&client, &ns, "hello", "Scaled", "from 0 to 1", SCALING).await;
    let result = wait_for("the subscription completed", SCALING, || async {
        let out =
            crate::harness::cli::temporal(&["workflow", "result", "--workflow-id", &id]).await;
        if out.success {
            Ok(out.stdout)
        } else {
            Err(out.stderr)
        }
    })
    .await;
    assert!(
        result.contains("ended on build v1-"),
        "served by v1: {result}"
    );
    // Idle again: back to zero (or already retired by the sunset).
    wait_for("v1 back at zero or gone", SCALING, || async {
        match replicas(&client, &ns, "v1").await {
            Ok(Some(0)) | Err(_) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

#[tokio::test]
async fn kubectl_scale_drives_spec_replicas_through_the_scale_subresource() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "scale-sub").await;
    apply(&connection(&ns)).await;
    apply(&worker(
        &ns,
        "hello",
        "v1",
        json!({ "strategy": "AllAtOnce" }),
    ))
    .await;
    wait_ready(&client, &ns, "hello", ROLLOUT).await;
    let scaled = kubectl(&["scale", "wd/hello", "-n", &ns, "--replicas=3"], None).await;
    assert!(scaled.success, "{}", scaled.stderr);
    wait_replicas(&client, &ns, "v1", 3).await;
    // The subresource reads status.replicas and the selector back.
    wait_for("status.replicas 3 with a selector", SCALING, || async {
        let out = kubectl(
            &[
                "get",
                "--raw",
                &format!(
                    "/apis/temporal.io/v1alpha1/namespaces/{ns}/workerdeployments/hello/scale"
                ),
            ],
            None,
        )
        .await;
        let v: Value =
            serde_json::from_str(&out.stdout).map_err(|e| format!("{e}: {}", out.stderr))?;
        let selector = v["status"]["selector"].as_str().unwrap_or_default();
        if v["spec"]["replicas"] == 3
            && v["status"]["replicas"] == 3
            && selector.contains("temporal.io/deployment-name=hello")
        {
            Ok(())
        } else {
            Err(v.to_string())
        }
    })
    .await;
}

#[tokio::test]
async fn without_replicas_or_autoscaling_a_hand_scaled_deployment_keeps_its_replicas() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "scale-hand").await;
    let mut manifest = worker(&ns, "hello", "v1", json!({ "strategy": "AllAtOnce" }));
    if let Some(spec) = manifest["spec"].as_object_mut() {
        spec.remove("replicas");
    }
    apply(&connection(&ns)).await;
    apply(&manifest).await;
    wait_ready(&client, &ns, "hello", ROLLOUT).await;
    let name = deployments(&client, &ns, "hello")
        .await
        .first()
        .map(|d| d.0.clone())
        .unwrap_or_default();
    let scaled = kubectl(
        &[
            "scale",
            &format!("deployment/{name}"),
            "-n",
            &ns,
            "--replicas=2",
        ],
        None,
    )
    .await;
    assert!(scaled.success, "{}", scaled.stderr);
    // A spec change makes the controller look at the TWD again; the replicas stay.
    let mut edited = manifest.clone();
    edited["spec"]["sunset"]["scaledownDelay"] = json!("3s");
    apply(&edited).await;
    holds_for("the hand-set replicas", Duration::from_secs(8), || async {
        match replicas(&client, &ns, "v1").await? {
            Some(2) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

#[tokio::test]
async fn a_controller_killed_during_a_scale_up_ends_at_the_expected_replicas_without_oscillating() {
    let mut private = Private::start("autoscale-kill").await;
    let ns = private.cluster.namespace("autoscale-kill").await;
    let tq = format!("autoscale-{ns}");
    let autoscaling = json!({
        "minReplicas": 1, "maxReplicas": 3, "backlogPerReplica": 3,
        "scaleUpWindow": "2s", "scaleDownWindow": "10m"
    });
    private
        .cluster
        .apply(&private.cluster.connection(&ns, "dev"))
        .await;
    private
        .cluster
        .apply(&scaled_worker(
            &ns,
            "v1",
            &tq,
            json!({ "strategy": "AllAtOnce" }),
            autoscaling,
        ))
        .await;
    private
        .cluster
        .wait_ready(&ns, "hello", "v1", ROLLOUT)
        .await;
    let config = LoadConfig {
        namespace: private.cluster.env.temporal_namespace.clone(),
        task_queue: tq.clone(),
        id_prefix: format!("{ns}-load-"),
        ..LoadConfig::new(private.cluster.env.temporal_address.clone(), 6.0)
    };
    let _load = match LoadGenerator::start(config).await {
        Ok(generator) => generator,
        Err(e) => panic!("starting the load generator: {e}"),
    };
    let client = private.cluster.client.clone();
    // Killed as soon as the scale-up has begun.
    private
        .cluster
        .wait("the scale-up begun", SCALING, || async {
            match replicas(&client, &ns, "v1").await? {
                Some(r) if r > 1 => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    assert!(
        private.sandbox.kill_controller().await.is_some(),
        "the controller was running"
    );
    assert!(
        private.sandbox.restart_dead_controller().is_some(),
        "the controller restarts"
    );
    private
        .cluster
        .wait("v1 at its maximum after the restart", SCALING, || async {
            match replicas(&client, &ns, "v1").await? {
                Some(3) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    // No oscillation: it stays at the maximum while the load lasts.
    holds_for(
        "three replicas under load",
        Duration::from_secs(10),
        || async {
            match replicas(&client, &ns, "v1").await? {
                Some(3) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    let api: kube::Api<k8s_openapi::api::core::v1::Event> =
        kube::Api::namespaced(client.clone(), &ns);
    let scaled: Vec<String> = api
        .list(&kube::api::ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("Scaled"))
        .filter_map(|e| e.message)
        .collect();
    assert!(
        scaled
            .iter()
            .all(|m| !m.contains("from 3 to") && !m.contains("from 2 to 1")),
        "never scaled back down: {scaled:?}"
    );
}

#[tokio::test]
async fn kubectl_scale_of_a_shared_total_is_split_by_role() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "scale-shared").await;
    let rollout = json!({ "strategy": "Progressive",
        "steps": [ { "rampPercentage": 20, "pauseDuration": "1h" } ] });
    let shared = |tag: &str| {
        let mut manifest = worker(&ns, "hello", tag, rollout.clone());
        manifest["spec"]["replicasMode"] = json!("Shared");
        manifest
    };
    apply(&connection(&ns)).await;
    apply(&shared("v1")).await;
    wait_ready(&client, &ns, "hello", ROLLOUT).await;
    apply(&shared("v2")).await;
    wait_for("v2 ramping", ROLLOUT, || async {
        let twd = crate::harness::twd::get_twd(&client, &ns, "hello").await?;
        let ramp = twd
            .status
            .as_ref()
            .and_then(|s| s.target_version.as_ref())
            .and_then(|t| t.ramp_percentage);
        if ramp == Some(20.0) {
            Ok(())
        } else {
            Err(format!("ramp {ramp:?}"))
        }
    })
    .await;
    // The total as an HPA would set it, through /scale: 20 % of 6 rounded up for v2.
    let scaled = kubectl(&["scale", "wd/hello", "-n", &ns, "--replicas=6"], None).await;
    assert!(scaled.success, "{}", scaled.stderr);
    wait_replicas(&client, &ns, "v2", 2).await;
    wait_replicas(&client, &ns, "v1", 4).await;
    send(Via::Cli, "promote", &ns, "hello").await;
    wait_replicas(&client, &ns, "v2", 6).await;
}
