//! `ClusterConnection`: one cluster-scoped connection serves TWDs of several namespaces, each
//! resolving the Secrets it names in its own namespace; it carries the delete-protection
//! finalizer while any TWD uses it, so deleting it waits for the last user; admission rejects a
//! reference of an unknown kind.
//!
//! ClusterConnections are cluster-scoped and the suite's sandbox is shared: each test names its
//! own after its first namespace. The restricted-namespaces case (`--watch-namespaces`: the
//! reason `ClusterConnectionUnsupported`) is proven in `deploy.rs`, whose controller runs with
//! the chart's namespace-restricted RBAC.

use std::time::Duration;

use kube::api::Api;
use serde_json::{Value, json};
use twc_crds::labels::DELETE_PROTECTION_FINALIZER;
use twc_crds::{ClusterConnection, TemporalWorkerDeployment};

use crate::harness::cli::kubectl;
use crate::harness::twd::{
    apply, condition, get_twd, legacy, routing, target_build, wait_ready, wait_reason,
};
use crate::harness::wait::wait_for;
use crate::harness::{env, kube_client, test_namespace};

/// Every TWD of these tests has this name.
const NAME: &str = "hello";

/// These tests run on the older kinds (TemporalWorkerDeployment, TemporalConnection), which
/// `twc` keeps serving; the rest of the suite uses WorkerDeployment and Connection.
fn worker(ns: &str, name: &str, tag: &str, rollout: Value) -> Value {
    legacy(crate::harness::twd::worker(ns, name, tag, rollout))
}
/// A rollout finishes well within this.
const ROLLOUT: Duration = Duration::from_secs(150);

/// A ClusterConnection `name` with `spec`.
fn cluster_connection(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "temporal.io/v1alpha1",
        "kind": "ClusterConnection",
        "metadata": { "name": name },
        "spec": spec
    })
}

/// The test TWD in `ns` running `tag`, using the ClusterConnection `connection`.
fn user(ns: &str, connection: &str, tag: &str) -> Value {
    let mut manifest = worker(ns, NAME, tag, json!({ "strategy": "AllAtOnce" }));
    manifest["spec"]["workerOptions"]["connectionRef"] =
        json!({ "name": connection, "kind": "ClusterConnection" });
    manifest
}

/// Waits until the TWD in `ns` is Ready and its target build is Current in Temporal; returns
/// the build.
async fn rolled_out(client: &kube::Client, ns: &str) -> String {
    let twd = wait_ready(client, ns, NAME, ROLLOUT).await;
    let build = target_build(&twd).unwrap_or_default();
    let deployment_name = format!("{ns}/{NAME}");
    wait_for(
        &format!("{build} Current in {deployment_name}"),
        ROLLOUT,
        || async {
            let r = routing(&deployment_name).await?;
            if r.current.as_deref() == Some(build.as_str()) {
                Ok(())
            } else {
                Err(format!("{r:?}"))
            }
        },
    )
    .await;
    build
}

/// The ClusterConnection, or `None` once it is gone.
async fn get_cluster_connection(
    client: &kube::Client,
    name: &str,
) -> Result<Option<ClusterConnection>, String> {
    Api::<ClusterConnection>::all(client.clone())
        .get_opt(name)
        .await
        .map_err(|e| e.to_string())
}

fn protected(connection: &ClusterConnection) -> bool {
    connection
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == DELETE_PROTECTION_FINALIZER)
}

/// `kubectl delete <kind> <name> [-n ns] --wait=false`; panics with kubectl's message.
async fn delete(kind: &str, name: &str, ns: Option<&str>) {
    let mut args = vec!["delete", kind, name, "--wait=false"];
    if let Some(ns) = ns {
        args.extend(["-n", ns]);
    }
    let out = kubectl(&args, None).await;
    assert!(out.success, "kubectl {}: {}", args.join(" "), out.stderr);
}

#[tokio::test]
async fn one_cluster_connection_serves_two_namespaces_and_outlives_its_users() {
    let client = kube_client().await;
    let ns_a = test_namespace(&client, "cconn-a").await;
    let ns_b = test_namespace(&client, "cconn-b").await;
    let name = format!("shared-{ns_a}");
    apply(&cluster_connection(
        &name,
        json!({ "hostPort": env().temporal_address }),
    ))
    .await;

    // A rollout in each namespace reaches Current through the one connection.
    for ns in [&ns_a, &ns_b] {
        apply(&user(ns, &name, "v1")).await;
    }
    for ns in [&ns_a, &ns_b] {
        rolled_out(&client, ns).await;
    }
    // A second version rolls out too (the connection keeps serving).
    apply(&user(&ns_b, &name, "v2")).await;
    let second = rolled_out(&client, &ns_b).await;
    assert!(second.starts_with("v2-"), "build {second}");

    // Protected while used, and Ready as its last resolution found it.
    let connection = wait_for(
        "the ClusterConnection protected and Ready",
        ROLLOUT,
        || async {
            let Some(c) = get_cluster_connection(&client, &name).await? else {
                return Err("gone".to_owned());
            };
            let ready = c.status.as_ref().and_then(|s| {
                s.conditions
                    .iter()
                    .find(|c| c.type_ == "Ready")
                    .map(|c| (c.status.clone(), c.reason.clone()))
            });
            if protected(&c) && ready == Some(("True".into(), "Connected".into())) {
                Ok(c)
            } else {
                Err(format!(
                    "finalizers {:?}, Ready {ready:?}",
                    c.metadata.finalizers
                ))
            }
        },
    )
    .await;
    assert!(connection.metadata.namespace.is_none());

    // Deleting it waits: it stays (Terminating) while either TWD uses it.
    delete("clusterconnection", &name, None).await;
    wait_for("the ClusterConnection Terminating", ROLLOUT, || async {
        match get_cluster_connection(&client, &name).await? {
            Some(c) if c.metadata.deletion_timestamp.is_some() && protected(&c) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    delete("twd", NAME, Some(&ns_a)).await;
    let twds_a: Api<TemporalWorkerDeployment> = Api::namespaced(client.clone(), &ns_a);
    wait_for("the first TWD cleaned up and gone", ROLLOUT, || async {
        match twds_a.get_opt(NAME).await {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let still = get_cluster_connection(&client, &name).await;
    assert!(
        matches!(&still, Ok(Some(c)) if protected(c)),
        "the second TWD still uses it: {still:?}"
    );
    // The remaining user keeps working with a connection being deleted.
    let twd = get_twd(&client, &ns_b, NAME)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        condition(&twd, "Ready").map(|c| (c.0, c.1)),
        Some(("True".into(), "RolloutComplete".into()))
    );

    // The last user's deletion cleans up Temporal through it, then lets it go.
    delete("twd", NAME, Some(&ns_b)).await;
    wait_for(
        "the last TWD and then the ClusterConnection gone",
        ROLLOUT,
        || async {
            let twd = get_twd(&client, &ns_b, NAME).await.ok();
            let connection = get_cluster_connection(&client, &name).await?;
            let r = routing(&format!("{ns_b}/{NAME}")).await?;
            match (twd, connection) {
                (None, None) if !r.exists => Ok(()),
                (twd, connection) => Err(format!(
                    "TWD present: {}; connection: {:?}; worker deployment exists: {}",
                    twd.is_some(),
                    connection.map(|c| c.metadata.finalizers),
                    r.exists
                )),
            }
        },
    )
    .await;
}

#[tokio::test]
async fn cluster_connection_secrets_are_read_in_the_twd_namespace() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "cconn-secret").await;
    let name = format!("keyed-{ns}");
    apply(&cluster_connection(
        &name,
        json!({ "hostPort": env().temporal_address,
                "apiKeySecretRef": { "name": "temporal-key", "key": "key" } }),
    ))
    .await;
    apply(&user(&ns, &name, "v1")).await;
    let (status, _, message) = wait_reason(
        &client,
        &ns,
        NAME,
        "Progressing",
        "AuthSecretInvalid",
        ROLLOUT,
    )
    .await;
    assert_eq!(status, "False");
    assert!(
        message.contains(&format!(
            "Secret {ns}/temporal-key named by ClusterConnection {name}"
        )),
        "{message}"
    );
    // Deleting the connection, then the TWD: the connection is held until the TWD is gone, and
    // the TWD, whose Temporal its connection can no longer reach, is released without cleanup.
    delete("clusterconnection", &name, None).await;
    delete("twd", NAME, Some(&ns)).await;
    wait_for(
        "the TWD, then the ClusterConnection gone",
        ROLLOUT,
        || async {
            let twd = get_twd(&client, &ns, NAME).await.ok();
            let connection = get_cluster_connection(&client, &name).await?;
            match (twd, connection) {
                (None, None) => Ok(()),
                (twd, connection) => Err(format!(
                    "TWD: {:?}; connection: {:?}",
                    twd.and_then(|t| t.status),
                    connection.map(|c| c.metadata.finalizers)
                )),
            }
        },
    )
    .await;
}

#[tokio::test]
async fn admission_rejects_an_unknown_connection_kind() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "cconn-kind").await;
    let mut manifest = user(&ns, "shared", "v1");
    manifest["spec"]["workerOptions"]["connectionRef"]["kind"] = json!("Secret");
    let out = kubectl(&["create", "-f", "-"], Some(&manifest.to_string())).await;
    assert!(!out.success, "an unknown kind was accepted");
    assert!(
        out.stderr.contains("spec.workerOptions.connectionRef.kind")
            && out.stderr.contains("Unsupported value: \"Secret\""),
        "{}",
        out.stderr
    );
    // The CRD's own rules apply to ClusterConnections as to TemporalConnections.
    let both = cluster_connection(
        &format!("both-{ns}"),
        json!({ "hostPort": "temporal:7233",
                "mutualTLSSecretRef": { "name": "tls" },
                "apiKeySecretRef": { "name": "key", "key": "key" } }),
    );
    let out = kubectl(&["create", "-f", "-"], Some(&both.to_string())).await;
    assert!(
        !out.success,
        "a connection with two kinds of credentials was accepted"
    );
    assert!(
        out.stderr
            .contains("Only one of mutualTLSSecretRef or apiKeySecretRef may be set"),
        "{}",
        out.stderr
    );
}
