//! What rollouts that last days meet: a kube-apiserver outage mid-rollout (no configuration
//! error is ever reported, the rollout completes), a namespace deleted with API-key and
//! mutual-TLS TWDs in it (it goes away), and a deletion whose Temporal cleanup is blocked by a
//! missing Secret (the TWD says why, and finishes once the Secret is back).
//!
//! Mutual-TLS connections reach the dev server through [`TlsFront`]; an API-key connection
//! cannot (the dev server speaks no TLS and API keys are checked against the system roots), so
//! its TWD stays at `TemporalClientCreationFailed`.

use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Namespace};
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::{Value, json};
use twc_crds::labels::DELETE_PROTECTION_FINALIZER;
use twc_crds::{TemporalConnection, TemporalWorkerDeployment};
use twc_sandbox::up::StopMode;

use crate::chaos::cluster::{Cluster, Private, status_text};
use crate::harness::controls::wait_event;
use crate::harness::tls::TlsFront;
use crate::harness::twd::{condition, deployments, get_twd, legacy, target_build, worker};

/// A rollout finishes well within this, even across an outage.
const ROLLOUT: Duration = Duration::from_secs(300);
/// A deleted namespace holding TWDs is gone within this.
const NAMESPACE_GONE: Duration = Duration::from_secs(120);
/// Condition reasons that blame the user's configuration: an outage must never produce them.
const CONFIGURATION_ERRORS: [&str; 3] = [
    "TemporalConnectionNotFound",
    "AuthSecretInvalid",
    "PlanExecutionFailed",
];

/// A TWD named `name` running the sample worker `tag` through the TemporalConnection
/// `connection`.
fn twd(namespace: &str, name: &str, connection: &str, tag: &str, rollout: Value) -> Value {
    // These tests run on the older kinds, which `twc` keeps serving.
    let mut manifest = legacy(worker(namespace, name, tag, rollout));
    manifest["spec"]["workerOptions"]["connectionRef"]["name"] = json!(connection);
    manifest
}

fn all_at_once() -> Value {
    json!({ "strategy": "AllAtOnce" })
}

/// The API-key Secret and TemporalConnection `cloud` to the dev server (TLS on, so it never
/// connects).
fn api_key_objects(cluster: &Cluster, namespace: &str) -> [Value; 2] {
    let mut connection = legacy(cluster.connection(namespace, "cloud"));
    connection["spec"]["apiKeySecretRef"] = json!({ "name": "cloud-api-key", "key": "key" });
    [
        json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": "cloud-api-key", "namespace": namespace },
            "stringData": { "key": "not-a-real-key" }
        }),
        connection,
    ]
}

/// Every `<kind> <type>=<status> <reason>` the TWD `name` and the TemporalConnection
/// `connection` show, added to `seen` every 200 ms until `done` is set. Reads that fail (the
/// API server is down) are skipped.
async fn record_conditions(
    cluster: &Cluster,
    namespace: &str,
    (name, connection): (&str, &str),
    seen: &RefCell<BTreeSet<String>>,
    done: &Cell<bool>,
) {
    let twds: Api<TemporalWorkerDeployment> = Api::namespaced(cluster.client.clone(), namespace);
    let connections: Api<TemporalConnection> = Api::namespaced(cluster.client.clone(), namespace);
    let mut ticker = tokio::time::interval(Duration::from_millis(200));
    while !done.get() {
        ticker.tick().await;
        let mut shown = Vec::new();
        if let Ok(twd) = twds.get(name).await {
            shown.extend(
                twd.status
                    .into_iter()
                    .flat_map(|s| s.conditions)
                    .map(|c| format!("TWD {}={} {}", c.type_, c.status, c.reason)),
            );
        }
        if let Ok(connection) = connections.get(connection).await {
            shown.extend(
                connection
                    .status
                    .into_iter()
                    .flat_map(|s| s.conditions)
                    .map(|c| format!("TemporalConnection {}={} {}", c.type_, c.status, c.reason)),
            );
        }
        seen.borrow_mut().extend(shown);
    }
}

/// Warning events in the namespace: (object, reason, message).
async fn warnings(client: &kube::Client, namespace: &str) -> Vec<(String, String, String)> {
    Api::<Event>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().fields("type=Warning"))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .map(|e| {
            (
                e.involved_object.name.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.message.unwrap_or_default(),
            )
        })
        .collect()
}

/// Whether an object of `kind` holds the delete-protection finalizer (false when it is gone).
pub(crate) async fn holds_finalizer<K>(client: &kube::Client, namespace: &str, name: &str) -> bool
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    Api::<K>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .is_ok_and(|o| {
            o.meta()
                .finalizers
                .iter()
                .flatten()
                .any(|f| f == DELETE_PROTECTION_FINALIZER)
        })
}

/// The TWDs left in a namespace, with their finalizers and conditions, for "last observed".
pub(crate) async fn leftovers(client: &kube::Client, namespace: &str) -> String {
    let twds = Api::<TemporalWorkerDeployment>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    let described: Vec<String> = twds
        .iter()
        .map(|t| {
            format!(
                "{} finalizers {:?}: {}",
                t.metadata.name.clone().unwrap_or_default(),
                t.metadata.finalizers,
                status_text(t)
            )
        })
        .collect();
    format!(
        "TWDs left: [{}]; warnings: {:?}",
        described.join("; "),
        warnings(client, namespace).await
    )
}

/// The `client-tls` Secret and the `mtls` TemporalConnection through `front`, applied in `ns`;
/// returns the Secret (to apply it again).
async fn mtls_connection(cluster: &Cluster, front: &TlsFront, ns: &str) -> Value {
    let secret = front.secret(ns, "client-tls");
    cluster.apply(&secret).await;
    cluster
        .apply(&front.connection(ns, "mtls", "client-tls"))
        .await;
    secret
}

#[tokio::test]
async fn kube_apiserver_stopped_for_20s_mid_rollout_reports_no_configuration_error_and_completes() {
    let started = Instant::now();
    let Private {
        mut sandbox,
        cluster,
    } = Private::start("apiserver-outage").await;
    // Mutual TLS, so the credential Secret is read on every step, as the connection is.
    let front = TlsFront::start(&cluster.env.temporal_address).await;
    let ns = cluster.namespace("outage").await;
    mtls_connection(&cluster, &front, &ns).await;
    cluster
        .apply(&twd(&ns, "hello", "mtls", "v1", all_at_once()))
        .await;
    cluster.wait_ready(&ns, "hello", "v1", ROLLOUT).await;

    // v2 ramps in three steps; once it ramps, the kube-apiserver goes away for 20 s.
    let steps = json!({ "strategy": "Progressive", "steps": [
        { "rampPercentage": 10, "pauseDuration": "5s" },
        { "rampPercentage": 50, "pauseDuration": "5s" },
        { "rampPercentage": 90, "pauseDuration": "5s" }
    ] });
    cluster.apply(&twd(&ns, "hello", "mtls", "v2", steps)).await;
    let deployment_name = format!("{ns}/hello");
    cluster
        .wait("v2 ramps", ROLLOUT, || async {
            let r = cluster.routing(&deployment_name).await?;
            match r.ramping {
                Some(build) if build.starts_with("v2-") => Ok(()),
                _ => Err(format!("{r:?}")),
            }
        })
        .await;

    let seen = RefCell::new(BTreeSet::new());
    let done = Cell::new(false);
    let outage_then_completion = async {
        let down = Instant::now();
        if let Err(e) = sandbox
            .restart_apiserver(StopMode::Kill, Duration::from_secs(20))
            .await
        {
            panic!("restarting the kube-apiserver: {e:#}\n{}", cluster.logs());
        }
        eprintln!(
            "outage: kube-apiserver back after {:.1}s",
            down.elapsed().as_secs_f64()
        );
        let twd = cluster.wait_ready(&ns, "hello", "v2", ROLLOUT).await;
        done.set(true);
        twd
    };
    let ((), twd) = tokio::join!(
        record_conditions(&cluster, &ns, ("hello", "mtls"), &seen, &done),
        outage_then_completion
    );
    let seen = seen.into_inner();
    eprintln!("outage: conditions seen: {seen:?}");

    assert!(
        target_build(&twd).is_some_and(|b| b.starts_with("v2-")),
        "v2 completed: {}",
        status_text(&twd)
    );
    let blamed: Vec<&String> = seen
        .iter()
        .filter(|s| CONFIGURATION_ERRORS.iter().any(|r| s.ends_with(r)))
        .collect();
    assert!(
        blamed.is_empty(),
        "an outage was reported as a configuration error: {blamed:?} (all seen: {seen:?})"
    );
    let warned: Vec<_> = warnings(&cluster.client, &ns)
        .await
        .into_iter()
        .filter(|(_, reason, message)| {
            CONFIGURATION_ERRORS
                .iter()
                .any(|r| reason == r || message.contains(r))
        })
        .collect();
    assert!(
        warned.is_empty(),
        "Warning events blame the configuration: {warned:?}"
    );
    eprintln!(
        "outage: rollout completed {:.0}s after the start",
        started.elapsed().as_secs_f64()
    );
    drop(front);
    sandbox.stop().await;
}

#[tokio::test]
async fn deleting_a_namespace_with_api_key_and_mtls_twds_completes() {
    let cluster = Cluster::shared().await;
    let front = TlsFront::start(&cluster.env.temporal_address).await;
    let ns = cluster.namespace("nsdelete").await;
    mtls_connection(&cluster, &front, &ns).await;
    for object in api_key_objects(&cluster, &ns) {
        cluster.apply(&object).await;
    }
    cluster
        .apply(&twd(&ns, "mtls-worker", "mtls", "v1", all_at_once()))
        .await;
    cluster
        .apply(&twd(&ns, "keyed-worker", "cloud", "v1", all_at_once()))
        .await;
    cluster.wait_ready(&ns, "mtls-worker", "v1", ROLLOUT).await;
    let (status, message) = cluster
        .wait_reason(
            &ns,
            "keyed-worker",
            "Progressing",
            "TemporalClientCreationFailed",
            ROLLOUT,
        )
        .await;
    assert_eq!(status, "False", "{message}");
    // Deletion has something to wait for: every TWD and connection is protected.
    cluster
        .wait(
            "TWDs and connections hold the finalizer",
            ROLLOUT,
            || async {
                let twds = [
                    holds_finalizer::<TemporalWorkerDeployment>(
                        &cluster.client,
                        &ns,
                        "mtls-worker",
                    )
                    .await,
                    holds_finalizer::<TemporalWorkerDeployment>(
                        &cluster.client,
                        &ns,
                        "keyed-worker",
                    )
                    .await,
                ];
                let connections = [
                    holds_finalizer::<TemporalConnection>(&cluster.client, &ns, "mtls").await,
                    holds_finalizer::<TemporalConnection>(&cluster.client, &ns, "cloud").await,
                ];
                if twds.iter().chain(&connections).all(|held| *held) {
                    Ok(())
                } else {
                    Err(format!("TWDs {twds:?}, connections {connections:?}"))
                }
            },
        )
        .await;

    let took = delete_namespace(&cluster, &ns, NAMESPACE_GONE).await;
    eprintln!(
        "nsdelete: namespace gone {:.1}s after `kubectl delete namespace`",
        took.as_secs_f64()
    );
}

/// `kubectl delete namespace <ns> --wait=false`, then waits up to `timeout` for it to be gone
/// (the TWDs left in it are the last observation); returns how long it took.
pub(crate) async fn delete_namespace(cluster: &Cluster, ns: &str, timeout: Duration) -> Duration {
    let deleted_at = Instant::now();
    let out = cluster
        .kubectl(&["delete", "namespace", ns, "--wait=false"], None)
        .await;
    assert!(out.success, "kubectl delete namespace: {}", out.stderr);
    let namespaces: Api<Namespace> = Api::all(cluster.client.clone());
    cluster
        .wait(&format!("namespace {ns} is gone"), timeout, || async {
            match namespaces.get_opt(ns).await {
                Ok(None) => Ok(()),
                Ok(Some(_)) => Err(leftovers(&cluster.client, ns).await),
                Err(e) => Err(e.to_string()),
            }
        })
        .await;
    deleted_at.elapsed()
}

#[tokio::test]
async fn a_twd_whose_temporal_cleanup_is_blocked_says_why() {
    let cluster = Cluster::shared().await;
    let front = TlsFront::start(&cluster.env.temporal_address).await;
    let ns = cluster.namespace("blocked").await;
    let secret = mtls_connection(&cluster, &front, &ns).await;
    cluster
        .apply(&twd(&ns, "hello", "mtls", "v1", all_at_once()))
        .await;
    cluster.wait_ready(&ns, "hello", "v1", ROLLOUT).await;
    let deployment_name = format!("{ns}/hello");

    // The Secret goes first, then the TWD: Temporal cannot be cleaned up.
    let out = cluster
        .kubectl(&["delete", "secret", "client-tls", "-n", &ns], None)
        .await;
    assert!(out.success, "kubectl delete secret: {}", out.stderr);
    let twds: Api<TemporalWorkerDeployment> = Api::namespaced(cluster.client.clone(), &ns);
    if let Err(e) = twds.delete("hello", &DeleteParams::default()).await {
        panic!("deleting the TWD: {e}");
    }
    let message = cluster
        .wait(
            "a Deleting condition naming the missing Secret",
            ROLLOUT,
            || async {
                let twd = get_twd(&cluster.client, &ns, "hello").await?;
                match condition(&twd, "Deleting") {
                    Some((_, reason, message))
                        if reason == "AuthSecretInvalid" && message.contains("client-tls") =>
                    {
                        Ok(message)
                    }
                    _ => Err(status_text(&twd)),
                }
            },
        )
        .await;
    assert!(
        message.contains("Secret"),
        "the condition says what to restore: {message}"
    );
    let (_, _, event) = wait_event(
        &cluster.client,
        &ns,
        "hello",
        "DeletionBlocked",
        "client-tls",
        ROLLOUT,
    )
    .await;
    eprintln!("blocked: condition {message:?}; event {event:?}");
    let twd = get_twd(&cluster.client, &ns, "hello")
        .await
        .unwrap_or_else(|e| panic!("the TWD waits for its cleanup: {e}"));
    assert!(
        twd.metadata.deletion_timestamp.is_some(),
        "{}",
        status_text(&twd)
    );

    // With the Secret back, the cleanup finishes: TWD, Deployments and Temporal's worker
    // deployment are gone.
    cluster.apply(&secret).await;
    cluster
        .wait(
            "TWD, Deployments and the worker deployment are gone",
            ROLLOUT,
            || async {
                let twd = twds.get_opt("hello").await.map_err(|e| e.to_string())?;
                let left = deployments(&cluster.client, &ns, "hello").await;
                let routing = cluster.routing(&deployment_name).await?;
                match twd {
                    None if left.is_empty() && !routing.exists => Ok(()),
                    _ => Err(format!(
                        "TWD {}, Deployments {left:?}, routing {routing:?}",
                        twd.as_ref().map_or_else(|| "gone".to_owned(), status_text)
                    )),
                }
            },
        )
        .await;
}
