//! Deleting TWDs whose Temporal cannot be cleaned up (issue #27): a connection nobody listens
//! on (`localhost:1`) and a client certificate Temporal's TLS front refuses.
//!
//! While its namespace or its connection is being deleted, such a TWD is released without the
//! cleanup of Temporal once the cleanup has failed for the controller's bound (30 s), so the
//! namespace goes; what was left in Temporal is in the controller's log, the TWD workflow's
//! history and a `TemporalCleanupSkipped` event (in the controller's own namespace when the
//! TWD's refuses new events). A TWD deleted on its own keeps waiting, saying why, until its
//! connection is fixed (then Temporal is cleaned) or deleted (then it is released).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};
use twc_activities::k8s::connection::ClusterAccess;
use twc_activities::k8s::release_finalizers;
use twc_crds::labels::DELETE_PROTECTION_FINALIZER;
use twc_crds::{TemporalConnection, TemporalWorkerDeployment};
use twc_workflows::model::TwdRef;

use crate::chaos::cluster::{Cluster, status_text};
use crate::harness::controls::holds_for;
use crate::harness::tls::TlsFront;
use crate::harness::twd::{condition, get_twd, legacy, worker};
use crate::harness::webhook::{Receiver, notifications_of, url_secret, wait_delivered};
use crate::long_horizon::{delete_namespace, holds_finalizer, leftovers};

/// A rollout, or a TWD's first blocked condition, shows well within this.
const SETTLE: Duration = Duration::from_secs(300);
/// A TWD whose cleanup cannot reach Temporal while its namespace or connection is being
/// deleted is released this long after the first failed attempt (the controller's bound).
const RELEASE_AFTER: Duration = Duration::from_secs(30);
/// The scenario's namespace is gone within this of `kubectl delete namespace` (the release
/// bound, a cleanup attempt, the namespace's own finalization).
const NAMESPACE_GONE: Duration = Duration::from_secs(75);
/// The sandbox's controller runs without `POD_NAMESPACE`: its own namespace is the default.
const CONTROLLER_NAMESPACE: &str = "default";

/// A TWD `name` of the sample worker v1 through the TemporalConnection `connection`.
fn twd(namespace: &str, name: &str, connection: &str) -> Value {
    // These tests run on the older kinds (TemporalWorkerDeployment, TemporalConnection).
    let mut manifest = legacy(worker(
        namespace,
        name,
        "v1",
        json!({ "strategy": "AllAtOnce" }),
    ));
    manifest["spec"]["workerOptions"]["connectionRef"]["name"] = json!(connection);
    manifest
}

/// A TemporalConnection `name` to an address nothing listens on.
fn unreachable_connection(namespace: &str, name: &str) -> Value {
    json!({
        "apiVersion": "temporal.io/v1alpha1", "kind": "TemporalConnection",
        "metadata": { "name": name, "namespace": namespace },
        "spec": { "hostPort": "localhost:1" }
    })
}

/// Applies a Secret with a client certificate `front` refuses and the TemporalConnection `name`
/// to `front` that presents it.
async fn refused_connection(cluster: &Cluster, front: &TlsFront, namespace: &str, name: &str) {
    let secret = format!("{name}-tls");
    cluster
        .apply(&front.foreign_secret(namespace, &secret).await)
        .await;
    cluster
        .apply(&front.connection(namespace, name, &secret))
        .await;
}

/// Waits until the TWD `name` shows `Progressing` with `reason` (its Temporal is out of reach).
async fn wait_blocked(cluster: &Cluster, namespace: &str, name: &str, reason: &str) {
    let (status, message) = cluster
        .wait_reason(namespace, name, "Progressing", reason, SETTLE)
        .await;
    assert_eq!(status, "False", "{namespace}/{name}: {message}");
}

/// Waits until every named TWD and TemporalConnection holds the delete-protection finalizer.
async fn wait_protected(cluster: &Cluster, namespace: &str, twds: &[&str], connections: &[&str]) {
    cluster
        .wait(
            "TWDs and connections hold the finalizer",
            SETTLE,
            || async {
                let mut missing = Vec::new();
                for name in twds {
                    if !holds_finalizer::<TemporalWorkerDeployment>(
                        &cluster.client,
                        namespace,
                        name,
                    )
                    .await
                    {
                        missing.push(format!("TWD {name}"));
                    }
                }
                for name in connections {
                    if !holds_finalizer::<TemporalConnection>(&cluster.client, namespace, name)
                        .await
                    {
                        missing.push(format!("TemporalConnection {name}"));
                    }
                }
                if missing.is_empty() {
                    Ok(())
                } else {
                    Err(format!("without the finalizer: {missing:?}"))
                }
            },
        )
        .await;
}

/// `kubectl delete <kind> <name> -n <namespace> --wait=false`.
async fn delete(cluster: &Cluster, kind: &str, name: &str, namespace: &str) {
    let out = cluster
        .kubectl(
            &["delete", kind, name, "-n", namespace, "--wait=false"],
            None,
        )
        .await;
    assert!(out.success, "kubectl delete {kind} {name}: {}", out.stderr);
}

/// Warning events with `reason` about the TWD `twd_namespace/name`, recorded in `namespace`:
/// their messages.
async fn warnings_about(
    cluster: &Cluster,
    namespace: &str,
    (twd_namespace, name): (&str, &str),
    reason: &str,
) -> Vec<String> {
    let selector = format!(
        "type=Warning,reason={reason},involvedObject.kind=TemporalWorkerDeployment,\
         involvedObject.namespace={twd_namespace},involvedObject.name={name}"
    );
    Api::<Event>::namespaced(cluster.client.clone(), namespace)
        .list(&ListParams::default().fields(&selector))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .map(|e| e.message.unwrap_or_default())
        .collect()
}

/// The TWD workflow's history (latest run) as JSON text.
async fn twd_history(cluster: &Cluster, namespace: &str, name: &str) -> String {
    let workflow_id = format!("twd/{namespace}/{name}");
    let out = cluster
        .temporal(&[
            "workflow",
            "show",
            "--namespace",
            &cluster.env.temporal_namespace,
            "--workflow-id",
            &workflow_id,
            "--output",
            "json",
        ])
        .await;
    assert!(
        out.success,
        "temporal workflow show {workflow_id}: {}",
        out.stderr
    );
    out.stdout
}

/// What a release without the cleanup of Temporal leaves for the user to find: a
/// `TemporalCleanupSkipped` Warning event (recorded in `event_namespace`) naming the worker
/// deployment left in Temporal and the command that removes it, the controller's log line, and
/// the release activity's result in the TWD workflow's history.
async fn assert_release_recorded(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
    event_namespace: &str,
) {
    let deployment = format!("{namespace}/{name}");
    let left = format!("Left in Temporal: worker deployment {deployment}");
    let remove = format!("temporal worker deployment delete --name {deployment}");
    let events = cluster
        .wait(
            &format!("a TemporalCleanupSkipped event about {deployment} in {event_namespace}"),
            SETTLE,
            || async {
                let found = warnings_about(
                    cluster,
                    event_namespace,
                    (namespace, name),
                    "TemporalCleanupSkipped",
                )
                .await;
                if found
                    .iter()
                    .any(|m| m.contains(&left) && m.contains(&remove))
                {
                    Ok(found)
                } else {
                    Err(format!("events: {found:?}"))
                }
            },
        )
        .await;
    eprintln!("deletion: {deployment}: event {events:?}");
    // The controller logs the release once it is done, so a moment after the TWD is gone.
    let released =
        format!("Released TemporalWorkerDeployment {deployment} without cleaning up Temporal");
    cluster
        .wait(
            &format!("the controller's log says what {deployment} left in Temporal"),
            Duration::from_secs(30),
            || async {
                let log = cluster
                    .env
                    .controller_log
                    .as_ref()
                    .and_then(|path| std::fs::read_to_string(path).ok())
                    .unwrap_or_default();
                if log
                    .lines()
                    .any(|l| l.contains(&released) && l.contains("Left in Temporal"))
                {
                    Ok(())
                } else {
                    Err("not logged yet".to_string())
                }
            },
        )
        .await;
    let history = twd_history(cluster, namespace, name).await;
    assert!(
        history.contains("release_without_temporal"),
        "the history of twd/{deployment} records the release"
    );
}

#[tokio::test]
async fn deleting_a_namespace_whose_twds_cannot_reach_temporal_completes_within_the_bound() {
    let cluster = Cluster::shared().await;
    let front = TlsFront::start_verifying(&cluster.env.temporal_address).await;
    let ns = cluster.namespace("nsgone").await;
    cluster.apply(&legacy(cluster.connection(&ns, "dev"))).await;
    cluster.apply(&twd(&ns, "ok", "dev")).await;
    cluster.apply(&unreachable_connection(&ns, "nowhere")).await;
    cluster.apply(&twd(&ns, "bad", "nowhere")).await;
    refused_connection(&cluster, &front, &ns, "strict").await;
    cluster.apply(&twd(&ns, "refused", "strict")).await;
    cluster.wait_ready(&ns, "ok", "v1", SETTLE).await;
    wait_blocked(&cluster, &ns, "bad", "TemporalClientCreationFailed").await;
    wait_blocked(&cluster, &ns, "refused", "AuthSecretInvalid").await;
    wait_protected(
        &cluster,
        &ns,
        &["ok", "bad", "refused"],
        &["dev", "nowhere", "strict"],
    )
    .await;

    let took = delete_namespace(&cluster, &ns, NAMESPACE_GONE).await;
    eprintln!(
        "deletion: namespace {ns} gone {:.1}s after `kubectl delete namespace`",
        took.as_secs_f64()
    );

    // `ok` was cleaned up in Temporal; `bad` was released without it, and says so where the
    // user can find it afterwards (its namespace refused events: the controller's has them).
    let routing = cluster.routing(&format!("{ns}/ok")).await;
    assert!(
        routing.as_ref().is_ok_and(|r| !r.exists),
        "worker deployment {ns}/ok removed from Temporal: {routing:?}"
    );
    assert_release_recorded(&cluster, &ns, "bad", CONTROLLER_NAMESPACE).await;
}

#[tokio::test]
async fn a_twd_deleted_alone_waits_for_its_temporal_until_the_connection_is_fixed_or_deleted() {
    let cluster = Cluster::shared().await;
    let front = TlsFront::start_verifying(&cluster.env.temporal_address).await;
    let ns = cluster.namespace("waits").await;
    // A webhook told when a deletion is blocked.
    let receiver = Receiver::start().await;
    cluster.apply(&url_secret(&ns, "hook", &receiver.url)).await;
    for (name, connection) in [("fixed", "fixme"), ("dropped", "dropme")] {
        cluster
            .apply(&unreachable_connection(&ns, connection))
            .await;
        let mut manifest = twd(&ns, name, connection);
        if name == "fixed" {
            manifest["spec"]["notifications"] =
                notifications_of("ops", "hook", &["DeletionBlocked"]);
        }
        cluster.apply(&manifest).await;
    }
    refused_connection(&cluster, &front, &ns, "strict").await;
    cluster.apply(&twd(&ns, "refused", "strict")).await;
    wait_blocked(&cluster, &ns, "fixed", "TemporalClientCreationFailed").await;
    wait_blocked(&cluster, &ns, "dropped", "TemporalClientCreationFailed").await;
    wait_blocked(&cluster, &ns, "refused", "AuthSecretInvalid").await;
    let twds = ["fixed", "dropped", "refused"];
    wait_protected(&cluster, &ns, &twds, &["fixme", "dropme", "strict"]).await;

    // Deleted on their own, they wait, and say why and what to do about it.
    for name in twds {
        delete(&cluster, "twd", name, &ns).await;
    }
    for (name, connection, reason) in [
        ("fixed", "fixme", "WaitingForTemporalCleanup"),
        ("dropped", "dropme", "WaitingForTemporalCleanup"),
        ("refused", "strict", "AuthSecretInvalid"),
    ] {
        let message = cluster
            .wait(
                &format!("{name}: Deleting={reason} naming TemporalConnection {connection}"),
                SETTLE,
                || async {
                    let twd = get_twd(&cluster.client, &ns, name).await?;
                    match condition(&twd, "Deleting") {
                        Some((status, r, message))
                            if status == "True"
                                && r == reason
                                && message
                                    .contains(&format!("TemporalConnection {ns}/{connection}")) =>
                        {
                            Ok(message)
                        }
                        _ => Err(status_text(&twd)),
                    }
                },
            )
            .await;
        eprintln!("deletion: {name} waits: {message}");
    }
    let told = wait_delivered(&receiver, 1, SETTLE).await;
    assert_eq!(
        (told[0]["event"].as_str(), told[0]["reason"].as_str()),
        (Some("DeletionBlocked"), Some("DeletionBlocked")),
        "{told:#?}"
    );
    assert!(
        told[0]["message"]
            .as_str()
            .is_some_and(|m| m.contains(&format!("TemporalConnection {ns}/fixme"))),
        "{told:#?}"
    );
    holds_for(
        "the TWDs deleted on their own keep waiting past the release bound",
        RELEASE_AFTER + Duration::from_secs(10),
        || async {
            for name in twds {
                if !holds_finalizer::<TemporalWorkerDeployment>(&cluster.client, &ns, name).await {
                    return Err(format!("{name} was released"));
                }
            }
            Ok(())
        },
    )
    .await;

    // Fixed: the cleanup finishes. Deleted: released without it, and the connection goes too.
    cluster
        .apply(&legacy(cluster.connection(&ns, "fixme")))
        .await;
    delete(&cluster, "temporalconnection", "dropme", &ns).await;
    delete(&cluster, "temporalconnection", "strict", &ns).await;
    let twds_api: Api<TemporalWorkerDeployment> = Api::namespaced(cluster.client.clone(), &ns);
    let connections: Api<TemporalConnection> = Api::namespaced(cluster.client.clone(), &ns);
    let changed_at = Instant::now();
    cluster
        .wait(
            "the TWDs and the deleted connections are gone",
            RELEASE_AFTER + Duration::from_secs(45),
            || async {
                let mut left = Vec::new();
                for name in twds {
                    if twds_api
                        .get_opt(name)
                        .await
                        .map_err(|e| e.to_string())?
                        .is_some()
                    {
                        left.push(format!("TWD {name}"));
                    }
                }
                for name in ["dropme", "strict"] {
                    if connections
                        .get_opt(name)
                        .await
                        .map_err(|e| e.to_string())?
                        .is_some()
                    {
                        left.push(format!("TemporalConnection {name}"));
                    }
                }
                if left.is_empty() {
                    Ok(())
                } else {
                    Err(format!(
                        "left: {left:?}; {}",
                        leftovers(&cluster.client, &ns).await
                    ))
                }
            },
        )
        .await;
    eprintln!(
        "deletion: released {:.1}s after the connections were fixed or deleted",
        changed_at.elapsed().as_secs_f64()
    );
    assert!(
        !holds_finalizer::<TemporalConnection>(&cluster.client, &ns, "fixme").await,
        "the fixed connection, used by no TWD any more, is released"
    );
    assert!(
        warnings_about(&cluster, &ns, (&ns, "fixed"), "TemporalCleanupSkipped")
            .await
            .is_empty(),
        "the fixed TWD was cleaned up, not skipped"
    );
    for name in ["dropped", "refused"] {
        assert_release_recorded(&cluster, &ns, name, &ns).await;
    }
}

#[tokio::test]
async fn releases_racing_over_the_same_connections_all_succeed() {
    // Two TWDs of a namespace released together (their connections deleted at once) both
    // release the connections no TWD uses any more: whichever comes second finds a connection
    // gone between reading and patching it, and must count that as released.
    let cluster = Cluster::shared().await;
    let ns = cluster.namespace("race").await;
    let connections: Api<TemporalConnection> = Api::namespaced(cluster.client.clone(), &ns);
    let names: Vec<String> = (0..12).map(|i| format!("c{i}")).collect();
    for name in &names {
        let mut manifest = unreachable_connection(&ns, name);
        manifest["metadata"]["finalizers"] = json!([DELETE_PROTECTION_FINALIZER]);
        let connection: TemporalConnection =
            serde_json::from_value(manifest).expect("a TemporalConnection");
        connections
            .create(&PostParams::default(), &connection)
            .await
            .unwrap_or_else(|e| panic!("creating {ns}/{name}: {e}"));
        connections
            .delete(name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("deleting {ns}/{name}: {e}"));
    }
    // No TWD of this name exists, so each release is of the namespace's unused connections.
    let twd = TwdRef {
        namespace: ns.clone(),
        name: "gone".into(),
    };
    let results = futures::future::join_all(
        (0..6).map(|_| release_finalizers(&cluster.client, ClusterAccess::Restricted, &twd)),
    )
    .await;
    let failed: Vec<String> = results
        .into_iter()
        .filter_map(|r| r.err().map(|e| e.to_string()))
        .collect();
    assert!(failed.is_empty(), "releases failed: {failed:#?}");
    let left: Vec<String> = connections
        .list(&ListParams::default())
        .await
        .expect("listing connections")
        .items
        .into_iter()
        .map(|c| c.name_any())
        .collect();
    assert!(left.is_empty(), "connections left: {left:?}");
}
