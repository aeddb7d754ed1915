//! The two names of the worker deployment resource: `WorkerDeployment` (the Go controller's GA
//! kind, used by the rest of the suite) and `TemporalWorkerDeployment`. One name in one namespace
//! is one Temporal Worker Deployment: a second object of that name is refused, and moving from
//! the old kind to the new one (apply the new, delete the old) changes nothing in Temporal or in
//! the pods.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::Api;
use serde_json::json;

use crate::harness::cli::kubectl;
use crate::harness::controls::{holds_for, wait_event};
use crate::harness::twd::{
    apply, condition, connection, deployments, get_twd, legacy, pod_starts, read_worker, routing,
    target_build, wait_ready, worker,
};
use crate::harness::wait::wait_for;
use crate::harness::{env, kube_client, test_namespace};

const ROLLOUT: Duration = Duration::from_secs(120);

/// The kind and UID of a Deployment's controller owner.
async fn controller_of(client: &kube::Client, namespace: &str, name: &str) -> (String, String) {
    let deployment = Api::<Deployment>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("reading Deployment {name}: {e}"));
    deployment
        .metadata
        .owner_references
        .unwrap_or_default()
        .into_iter()
        .find(|o| o.controller == Some(true))
        .map(|o| (o.kind, o.uid))
        .unwrap_or_default()
}

#[tokio::test]
async fn moving_a_temporal_worker_deployment_to_a_worker_deployment_changes_nothing() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "move").await;
    let temporal_name = format!("{ns}/hello");
    let rollout = json!({ "strategy": "AllAtOnce" });
    apply(&legacy(connection(&ns))).await;
    apply(&legacy(worker(&ns, "hello", "v1", rollout.clone()))).await;
    let old = wait_ready(&client, &ns, "hello", ROLLOUT).await;
    let build = target_build(&old).unwrap_or_default();
    let before = routing(&temporal_name).await.unwrap_or_default();
    assert_eq!(before.current.as_deref(), Some(build.as_str()));
    let deployed = deployments(&client, &ns, "hello").await;
    assert_eq!(deployed.len(), 1, "{deployed:?}");
    let deployment = deployed[0].0.clone();
    let pods = pod_starts(&env().pods_dir, &ns);
    assert!(!pods.is_empty(), "the pod runner started the v1 pod");

    // The new kinds beside the old: the WorkerDeployment is refused, nothing moves.
    apply(&connection(&ns)).await;
    apply(&worker(&ns, "hello", "v1", rollout.clone())).await;
    let refused = format!("TemporalWorkerDeployment {ns}/hello already manages");
    wait_for("the WorkerDeployment is refused", ROLLOUT, || async {
        let wd: twc_crds::WorkerDeployment = Api::namespaced(client.clone(), &ns)
            .get("hello")
            .await
            .map_err(|e| e.to_string())?;
        let twd: twc_crds::TemporalWorkerDeployment = wd.into();
        match condition(&twd, "Ready") {
            Some((s, r, m)) if s == "False" && r == "DuplicateClaim" && m.contains(&refused) => {
                Ok(())
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    wait_event(&client, &ns, "hello", "DuplicateClaim", &refused, ROLLOUT).await;
    assert_eq!(
        read_worker(&client, &ns, "hello").await.map(|o| o.kind),
        Ok(twc_crds::WorkerKind::TemporalWorkerDeployment),
        "the older object keeps the claim"
    );

    // Deleting the old kind hands everything over as it is.
    let out = kubectl(
        &[
            "delete",
            "temporalworkerdeployment",
            "hello",
            "-n",
            &ns,
            "--wait=false",
        ],
        None,
    )
    .await;
    assert!(out.success, "{}", out.stderr);
    wait_for("the TemporalWorkerDeployment is gone", ROLLOUT, || async {
        let gone = kubectl(&["get", "twd", "hello", "-n", &ns], None).await;
        if gone.success {
            Err("still there".to_owned())
        } else {
            Ok(())
        }
    })
    .await;
    let new = wait_ready(&client, &ns, "hello", ROLLOUT).await;
    assert_eq!(target_build(&new).as_deref(), Some(build.as_str()));
    let (owner_kind, owner_uid) = controller_of(&client, &ns, &deployment).await;
    assert_eq!(owner_kind, "WorkerDeployment");
    assert_eq!(Some(owner_uid), new.metadata.uid.clone());
    let after = routing(&temporal_name).await.unwrap_or_default();
    assert_eq!(after.current, before.current);
    assert_eq!(after.ramping, before.ramping);
    assert_eq!(after.versions, before.versions);
    assert_eq!(
        pod_starts(&env().pods_dir, &ns),
        pods,
        "no pod was restarted or replaced"
    );
    let remaining = deployments(&client, &ns, "hello").await;
    assert_eq!(remaining, deployed, "the same Deployment, untouched");
    // Nothing uses the TemporalConnection any more: its finalizer is released.
    wait_for("the TemporalConnection is released", ROLLOUT, || async {
        let out = kubectl(
            &[
                "get",
                "tconn",
                "dev",
                "-n",
                &ns,
                "-o",
                "jsonpath={.metadata.finalizers}",
            ],
            None,
        )
        .await;
        if out.success && out.stdout.trim().is_empty() {
            Ok(())
        } else {
            Err(format!("{out:?}"))
        }
    })
    .await;

    // The WorkerDeployment now rolls out changes itself.
    apply(&worker(&ns, "hello", "v2", rollout)).await;
    wait_for("v2 Current under the WorkerDeployment", ROLLOUT, || async {
        let twd = get_twd(&client, &ns, "hello").await?;
        let target = target_build(&twd).unwrap_or_default();
        let r = routing(&temporal_name).await?;
        if target.starts_with("v2-") && r.current.as_deref() == Some(target.as_str()) {
            Ok(())
        } else {
            Err(format!("target {target}, routing {r:?}"))
        }
    })
    .await;
}

#[tokio::test]
async fn a_second_object_of_the_same_name_is_refused_and_touches_nothing() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "claim").await;
    let temporal_name = format!("{ns}/hello");
    let rollout = json!({ "strategy": "AllAtOnce" });
    apply(&connection(&ns)).await;
    apply(&worker(&ns, "hello", "v1", rollout.clone())).await;
    let holder = wait_ready(&client, &ns, "hello", ROLLOUT).await;
    let build = target_build(&holder).unwrap_or_default();
    let deployed = deployments(&client, &ns, "hello").await;

    // The same name under the older kind, with another image: refused, nothing of v2 is made.
    apply(&legacy(connection(&ns))).await;
    apply(&legacy(worker(&ns, "hello", "v2", rollout))).await;
    let refused = format!("WorkerDeployment {ns}/hello already manages");
    let twds: Api<twc_crds::TemporalWorkerDeployment> = Api::namespaced(client.clone(), &ns);
    wait_for(
        "the TemporalWorkerDeployment is refused",
        ROLLOUT,
        || async {
            let twd = twds.get("hello").await.map_err(|e| e.to_string())?;
            let phase = twd
                .status
                .as_ref()
                .and_then(|s| s.rollout.as_ref())
                .and_then(|r| r.phase);
            match (
                condition(&twd, "Ready"),
                condition(&twd, "Progressing"),
                phase,
            ) {
                (
                    Some((r, rr, m)),
                    Some((p, pr, _)),
                    Some(twc_crds::worker_deployment::RolloutPhase::Blocked),
                ) if r == "False"
                    && p == "False"
                    && rr == "DuplicateClaim"
                    && pr == "DuplicateClaim"
                    && m.contains(&refused) =>
                {
                    Ok(())
                }
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    wait_event(&client, &ns, "hello", "DuplicateClaim", &refused, ROLLOUT).await;
    holds_for(
        "nothing of the refused object is built or routed",
        Duration::from_secs(5),
        || async {
            let now = deployments(&client, &ns, "hello").await;
            let r = routing(&temporal_name).await?;
            if now == deployed && r.current.as_deref() == Some(build.as_str()) {
                Ok(())
            } else {
                Err(format!("deployments {now:?}, routing {r:?}"))
            }
        },
    )
    .await;
    let twd = twds.get("hello").await.unwrap_or_else(|e| panic!("{e}"));
    assert!(
        twd.metadata.finalizers.unwrap_or_default().is_empty(),
        "a refused object gets no finalizer: deleting it is immediate"
    );
    let out = kubectl(
        &["delete", "twd", "hello", "-n", &ns, "--timeout=30s"],
        None,
    )
    .await;
    assert!(out.success, "{}", out.stderr);
    let still = wait_ready(&client, &ns, "hello", ROLLOUT).await;
    assert_eq!(target_build(&still).as_deref(), Some(build.as_str()));
    assert_eq!(
        read_worker(&client, &ns, "hello").await.map(|o| o.kind),
        Ok(twc_crds::WorkerKind::WorkerDeployment)
    );
    let r = routing(&temporal_name).await.unwrap_or_default();
    assert_eq!(r.current.as_deref(), Some(build.as_str()));
}
