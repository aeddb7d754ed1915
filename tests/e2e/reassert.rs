//! What each turn of a TWD's workflow re-asserts (SPEC §10), end to end: finalizers removed by
//! hand come back and follow a `connectionRef` change; TemporalConnection changes (address,
//! auth mode, API-key Secret name) reach the running workers' Deployments; and under
//! `unsafeCustomBuildID` a template edit rolls the existing Deployment in place.
//!
//! A turn runs when the watcher signals a spec change (of the TWD, or of a connection it uses)
//! or at the resync (5 minutes). Where the change under test is not a spec change (a finalizer
//! removed), the test nudges the TWD with a change that affects no worker:
//! `spec.sunset.deleteDelay`.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::EnvVar;
use kube::Resource;
use kube::api::Api;
use serde_json::{Value, json};
use twc_crds::labels::{BUILD_ID, DELETE_PROTECTION_FINALIZER, POD_TEMPLATE_HASH};
use twc_crds::{TemporalConnection, TemporalWorkerDeployment};

use crate::harness::cli::{kubectl, temporal};
use crate::harness::controls::{events, wait_event};
use crate::harness::twd::{apply, deployments, get_twd, legacy, routing, target_build, wait_ready};
use crate::harness::wait::wait_for;
use crate::harness::{env, kube_client, test_namespace};

/// Every TWD of these tests has this name.
const NAME: &str = "hello";

/// These tests run on the older kinds (TemporalWorkerDeployment, TemporalConnection), which
/// `twc` keeps serving; the rest of the suite uses WorkerDeployment and Connection.
fn worker(ns: &str, name: &str, tag: &str, rollout: Value) -> Value {
    legacy(crate::harness::twd::worker(ns, name, tag, rollout))
}

/// The older kind of connection (see [`worker`]).
fn connection(ns: &str) -> Value {
    legacy(crate::harness::twd::connection(ns))
}
/// A rollout finishes well within this.
const ROLLOUT: Duration = Duration::from_secs(150);
/// A turn after a nudge re-asserts within this (the 5-minute resync is never waited for).
const TURN: Duration = Duration::from_secs(60);

fn all_at_once() -> Value {
    json!({ "strategy": "AllAtOnce" })
}

/// The standard test TWD, edited by `edit`.
fn twd_with(ns: &str, edit: impl FnOnce(&mut Value)) -> Value {
    let mut manifest = worker(ns, NAME, "v1", all_at_once());
    edit(&mut manifest);
    manifest
}

/// Creates the connection `dev` and the TWD `manifest`, waits until its build is Current, and
/// returns (build ID, versioned Deployment name).
async fn ready(client: &kube::Client, ns: &str, manifest: &Value) -> (String, String) {
    apply(&connection(ns)).await;
    apply(manifest).await;
    let twd = wait_ready(client, ns, NAME, ROLLOUT).await;
    let build = target_build(&twd).unwrap_or_default();
    wait_current(ns, &build).await;
    let deps = deployments(client, ns, NAME).await;
    let [(deployment, built, _)] = deps.as_slice() else {
        panic!("one versioned Deployment expected: {deps:?}");
    };
    assert_eq!(*built, build);
    (build, deployment.clone())
}

/// Waits until `build` is Temporal's current version of the test TWD.
async fn wait_current(ns: &str, build: &str) {
    let deployment_name = format!("{ns}/{NAME}");
    wait_for(
        &format!("{build} Current in {deployment_name}"),
        ROLLOUT,
        || async {
            let r = routing(&deployment_name).await?;
            if r.current.as_deref() == Some(build) {
                Ok(())
            } else {
                Err(format!("{r:?}"))
            }
        },
    )
    .await;
}

/// A merge patch with kubectl; panics with its message on failure.
async fn patch(kind: &str, ns: &str, name: &str, patch: &Value) {
    let out = kubectl(
        &[
            "patch",
            kind,
            name,
            "-n",
            ns,
            "--type",
            "merge",
            "-p",
            &patch.to_string(),
        ],
        None,
    )
    .await;
    assert!(
        out.success,
        "kubectl patch {kind} {name}: {}{}",
        out.stdout, out.stderr
    );
}

/// A spec change that touches no worker: it only makes the watcher signal a turn.
async fn nudge(ns: &str) {
    patch(
        "temporalworkerdeployment",
        ns,
        NAME,
        &json!({ "spec": { "sunset": { "deleteDelay": "4s" } } }),
    )
    .await;
}

fn protected<K: Resource>(object: &K) -> bool {
    object
        .meta()
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == DELETE_PROTECTION_FINALIZER)
}

async fn get_connection(
    client: &kube::Client,
    ns: &str,
    name: &str,
) -> Result<TemporalConnection, String> {
    Api::<TemporalConnection>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .map_err(|e| e.to_string())
}

/// Waits until the TWD and each of `connections` hold the finalizer as `(name, expected)` says.
async fn wait_finalizers(client: &kube::Client, ns: &str, twd: bool, connections: &[(&str, bool)]) {
    wait_for(
        &format!("finalizers in {ns}: TWD {twd}, connections {connections:?}"),
        TURN,
        || async {
            let mut seen = vec![(
                format!("TWD {NAME}"),
                protected(&get_twd(client, ns, NAME).await?),
            )];
            for (name, _) in connections {
                let held = protected(&get_connection(client, ns, name).await?);
                seen.push((format!("connection {name}"), held));
            }
            let expected = std::iter::once(twd).chain(connections.iter().map(|(_, held)| *held));
            if seen.iter().map(|(_, held)| *held).eq(expected) {
                Ok(())
            } else {
                Err(format!("{seen:?}"))
            }
        },
    )
    .await;
}

async fn get_deployment(client: &kube::Client, ns: &str, name: &str) -> Result<Deployment, String> {
    Api::<Deployment>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .map_err(|e| e.to_string())
}

/// An env var of the Deployment's worker container.
fn container_env(deployment: &Deployment, name: &str) -> Option<EnvVar> {
    deployment
        .spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .containers
        .first()?
        .env
        .iter()
        .flatten()
        .find(|v| v.name == name)
        .cloned()
}

/// The Secret a Deployment's `TEMPORAL_API_KEY` is read from: (name, key).
fn api_key_ref(deployment: &Deployment) -> Option<(String, String)> {
    let selector = container_env(deployment, "TEMPORAL_API_KEY")?
        .value_from?
        .secret_key_ref?;
    Some((selector.name, selector.key))
}

/// Waits until the Deployment `name` satisfies `accept` (an error says what it saw) and returns
/// it.
async fn wait_deployment(
    client: &kube::Client,
    ns: &str,
    name: &str,
    what: &str,
    accept: impl Fn(&Deployment) -> Result<(), String>,
) -> Deployment {
    wait_for(&format!("Deployment {ns}/{name}: {what}"), TURN, || async {
        let deployment = get_deployment(client, ns, name).await?;
        accept(&deployment).map(|()| deployment)
    })
    .await
}

/// Waits until the Deployment's rolled pods are all up: status for its latest generation,
/// Available.
async fn wait_rolled(client: &kube::Client, ns: &str, name: &str) {
    wait_deployment(client, ns, name, "latest generation Available", |d| {
        let status = d.status.clone().unwrap_or_default();
        let available = status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Available" && c.status == "True");
        if available && status.observed_generation == d.metadata.generation {
            Ok(())
        } else {
            Err(format!(
                "generation {:?}, status {status:?}",
                d.metadata.generation
            ))
        }
    })
    .await;
}

/// The pod runner's logs of the Deployment's pods, one string per pod (current and past).
fn pod_logs(ns: &str, deployment: &str) -> Vec<String> {
    let dir = env().pods_dir.join(ns).join(deployment);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .collect()
}

/// Runs the sample `HelloWorld` workflow on `task_queue` to completion (routed to the current
/// version, so only its pods can run it).
async fn run_hello_world(task_queue: &str, workflow_id: &str) {
    let out = temporal(&[
        "workflow",
        "start",
        "--type",
        "HelloWorld",
        "--task-queue",
        task_queue,
        "--workflow-id",
        workflow_id,
        "--input",
        "\"reassert\"",
    ])
    .await;
    assert!(out.success, "temporal workflow start: {}", out.stderr);
    wait_for(
        &format!("workflow {workflow_id} completed"),
        TURN,
        || async {
            let v = crate::harness::cli::describe_workflow(workflow_id).await?;
            match v["workflowExecutionInfo"]["status"].as_str() {
                Some("WORKFLOW_EXECUTION_STATUS_COMPLETED") => Ok(()),
                other => Err(format!("status {other:?}")),
            }
        },
    )
    .await;
}

#[tokio::test]
async fn a_finalizer_removed_by_hand_comes_back() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "refinalize").await;
    ready(&client, &ns, &worker(&ns, NAME, "v1", all_at_once())).await;
    wait_finalizers(&client, &ns, true, &[("dev", true)]).await;

    let before = finalizer_events(&client, &ns).await;

    let release = json!({ "metadata": { "finalizers": null } });
    patch("temporalworkerdeployment", &ns, NAME, &release).await;
    patch("temporalconnection", &ns, "dev", &release).await;
    nudge(&ns).await;
    wait_finalizers(&client, &ns, true, &[("dev", true)]).await;
    // Each restoration is told once more than the first addition was.
    let objects = [
        format!("TemporalWorkerDeployment {ns}/{NAME}"),
        format!("TemporalConnection {ns}/dev"),
    ];
    wait_for("a FinalizerRestored event per object", TURN, || async {
        let after = finalizer_events(&client, &ns).await;
        let count =
            |events: &[String], object: &str| events.iter().filter(|m| m.ends_with(object)).count();
        if objects
            .iter()
            .all(|o| count(&after, o) == count(&before, o) + 1)
        {
            Ok(())
        } else {
            Err(format!("before the nudge {before:?}; now {after:?}"))
        }
    })
    .await;
}

/// Messages of the TWD's `FinalizerRestored` events.
async fn finalizer_events(client: &kube::Client, ns: &str) -> Vec<String> {
    events(client, ns, NAME)
        .await
        .into_iter()
        .filter(|(_, reason, _)| reason == "FinalizerRestored")
        .map(|(_, _, message)| message)
        .collect()
}

#[tokio::test]
async fn a_connection_ref_change_moves_the_connection_finalizer() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "refmove").await;
    let mut other = connection(&ns);
    other["metadata"]["name"] = json!("other");
    apply(&other).await;
    let (build, deployment) = ready(&client, &ns, &worker(&ns, NAME, "v1", all_at_once())).await;
    wait_finalizers(&client, &ns, true, &[("dev", true), ("other", false)]).await;

    apply(&twd_with(&ns, |m| {
        m["spec"]["workerOptions"]["connectionRef"]["name"] = json!("other");
    }))
    .await;
    wait_finalizers(&client, &ns, true, &[("dev", false), ("other", true)]).await;
    wait_event(
        &client,
        &ns,
        NAME,
        "FinalizerRestored",
        &format!("TemporalConnection {ns}/other"),
        TURN,
    )
    .await;

    // Both connections reach the same server: the version and its Deployment are untouched.
    wait_ready(&client, &ns, NAME, ROLLOUT).await;
    wait_current(&ns, &build).await;
    let deps = deployments(&client, &ns, NAME).await;
    assert_eq!(
        deps.iter().map(|d| d.0.as_str()).collect::<Vec<_>>(),
        [deployment.as_str()]
    );
    // The released connection can now be deleted; the one in use stays.
    let out = kubectl(
        &[
            "delete",
            "temporalconnection",
            "dev",
            "-n",
            &ns,
            "--wait=true",
            "--timeout=30s",
        ],
        None,
    )
    .await;
    assert!(
        out.success,
        "deleting the released connection: {}",
        out.stderr
    );
}

#[tokio::test]
async fn a_connection_address_change_reaches_running_workers() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "readdress").await;
    let task_queue = format!("reassert-{ns}");
    let manifest = twd_with(&ns, |m| {
        m["spec"]["template"]["spec"]["containers"][0]["env"] =
            json!([{ "name": "SAMPLE_TASK_QUEUE", "value": task_queue }]);
    });
    let (build, deployment) = ready(&client, &ns, &manifest).await;
    let address = env().temporal_address.clone();
    let port = address.rsplit_once(':').map(|(_, p)| p).unwrap_or_default();
    let moved = if address.starts_with("localhost:") {
        format!("127.0.0.1:{port}")
    } else {
        format!("localhost:{port}")
    };

    patch(
        "temporalconnection",
        &ns,
        "dev",
        &json!({ "spec": { "hostPort": moved } }),
    )
    .await;
    wait_deployment(
        &client,
        &ns,
        &deployment,
        "TEMPORAL_ADDRESS follows",
        |d| match container_env(d, "TEMPORAL_ADDRESS").and_then(|v| v.value) {
            Some(value) if value == moved => Ok(()),
            other => Err(format!("TEMPORAL_ADDRESS {other:?}")),
        },
    )
    .await;
    wait_event(
        &client,
        &ns,
        NAME,
        "ConnectionUpdated",
        &format!("address {address} -> {moved}"),
        TURN,
    )
    .await;
    wait_rolled(&client, &ns, &deployment).await;

    // The restarted pods poll with the new address: a workflow routed to the version runs,
    // and the pod that ran it was started with that address.
    run_hello_world(&task_queue, &format!("{ns}-after-move")).await;
    let logs = pod_logs(&ns, &deployment);
    assert!(
        logs.iter().any(|log| {
            log.contains(&format!("address={moved}"))
                && log.contains("connected to Temporal")
                && log.contains("greet activity")
        }),
        "no pod started with {moved} ran the workflow:\n{}",
        logs.join("\n-----\n")
    );
    let twd = wait_ready(&client, &ns, NAME, ROLLOUT).await;
    assert_eq!(target_build(&twd).as_deref(), Some(build.as_str()));
    wait_current(&ns, &build).await;
    assert_eq!(deployments(&client, &ns, NAME).await.len(), 1);
}

#[tokio::test]
async fn an_api_key_secret_rename_reaches_the_deployment() {
    // The dev server speaks no TLS and API-key workers always use TLS: their pods cannot
    // poll it, so this asserts what the Deployment is told; the last step returns to the
    // plaintext connection and the workers poll again.
    let client = kube_client().await;
    let ns = test_namespace(&client, "rekey").await;
    let (build, deployment) = ready(&client, &ns, &worker(&ns, NAME, "v1", all_at_once())).await;
    for name in ["key-a", "key-b"] {
        apply(&json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": name, "namespace": ns },
            "stringData": { "key": format!("not-a-real-key-{name}") }
        }))
        .await;
    }
    let use_key =
        |name: &str| json!({ "spec": { "apiKeySecretRef": { "name": name, "key": "key" } } });

    // Auth mode switch: none -> API key.
    patch("temporalconnection", &ns, "dev", &use_key("key-a")).await;
    wait_deployment(
        &client,
        &ns,
        &deployment,
        "API key from key-a",
        |d| match api_key_ref(d) {
            Some((name, key)) if name == "key-a" && key == "key" => Ok(()),
            other => Err(format!("TEMPORAL_API_KEY from {other:?}")),
        },
    )
    .await;

    // Rename.
    patch("temporalconnection", &ns, "dev", &use_key("key-b")).await;
    let renamed =
        wait_deployment(
            &client,
            &ns,
            &deployment,
            "API key from key-b",
            |d| match api_key_ref(d) {
                Some((name, _)) if name == "key-b" => Ok(()),
                other => Err(format!("TEMPORAL_API_KEY from {other:?}")),
            },
        )
        .await;
    let tls = container_env(&renamed, "TEMPORAL_TLS").and_then(|v| v.value);
    assert_eq!(tls.as_deref(), Some("true"));
    let event = wait_event(
        &client,
        &ns,
        NAME,
        "ConnectionUpdated",
        "API key (Secret key-a, key key) -> API key (Secret key-b, key key)",
        TURN,
    )
    .await;
    assert!(
        !event.2.contains("not-a-real-key"),
        "secret leaked: {event:?}"
    );

    // And back: no API key, the workers poll again, the version stays Current.
    patch(
        "temporalconnection",
        &ns,
        "dev",
        &json!({ "spec": { "apiKeySecretRef": null } }),
    )
    .await;
    wait_deployment(&client, &ns, &deployment, "no API key", |d| {
        match (api_key_ref(d), container_env(d, "TEMPORAL_TLS")) {
            (None, None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    wait_rolled(&client, &ns, &deployment).await;
    wait_ready(&client, &ns, NAME, ROLLOUT).await;
    wait_current(&ns, &build).await;
}

#[tokio::test]
async fn a_template_edit_under_unsafe_custom_build_id_rolls_the_deployment_in_place() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "inplace").await;
    let custom = |edit: Option<&str>| {
        twd_with(&ns, |m| {
            m["spec"]["workerOptions"]["unsafeCustomBuildID"] = json!("custom-1");
            if let Some(value) = edit {
                m["spec"]["template"]["spec"]["containers"][0]["env"] =
                    json!([{ "name": "SAMPLE_EDIT", "value": value }]);
            }
        })
    };
    let (build, deployment) = ready(&client, &ns, &custom(None)).await;
    assert_eq!(build, "custom-1");
    let before = get_deployment(&client, &ns, &deployment)
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    apply(&custom(Some("edited"))).await;
    let edited: TemporalWorkerDeployment = get_twd(&client, &ns, NAME)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let wanted_hash = twc_crds::build_id::template_hash(&edited.spec.template);
    let rolled = wait_deployment(&client, &ns, &deployment, "the edited template", |d| {
        let value = container_env(d, "SAMPLE_EDIT").and_then(|v| v.value);
        let hash = d
            .spec
            .as_ref()
            .and_then(|s| s.template.metadata.as_ref())
            .and_then(|m| m.annotations.as_ref())
            .and_then(|a| a.get(POD_TEMPLATE_HASH).cloned());
        if value.as_deref() == Some("edited") && hash.as_deref() == Some(wanted_hash.as_str()) {
            Ok(())
        } else {
            Err(format!("SAMPLE_EDIT {value:?}, template hash {hash:?}"))
        }
    })
    .await;
    wait_event(&client, &ns, NAME, "TemplateUpdated", &deployment, TURN).await;

    // Same Deployment (uid), same build ID, same selector; routing unchanged.
    assert_eq!(rolled.metadata.uid, before.metadata.uid);
    assert_eq!(
        rolled
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(BUILD_ID)),
        Some(&build)
    );
    assert_eq!(
        rolled.spec.as_ref().map(|s| &s.selector),
        before.spec.as_ref().map(|s| &s.selector)
    );
    assert_eq!(
        container_env(&rolled, "TEMPORAL_WORKER_BUILD_ID").and_then(|v| v.value),
        Some(build.clone())
    );
    wait_rolled(&client, &ns, &deployment).await;
    let twd = wait_ready(&client, &ns, NAME, ROLLOUT).await;
    assert_eq!(target_build(&twd).as_deref(), Some(build.as_str()));
    wait_current(&ns, &build).await;
    let deps = deployments(&client, &ns, NAME).await;
    assert_eq!(
        deps.iter().map(|d| d.0.as_str()).collect::<Vec<_>>(),
        [deployment.as_str()]
    );
}
