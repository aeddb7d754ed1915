//! Building, applying and reading worker deployments (the `WorkerDeployment` kind by default;
//! [`legacy`] turns a manifest into the older kinds), their Deployments and their routing in
//! Temporal, for the engine tests.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};
use twc_crds::TemporalWorkerDeployment;

use super::cli::{kubectl, temporal};
use super::env;
use super::wait::wait_for;

/// Sample-worker image with a tag (each tag is a distinct build).
pub fn image(tag: &str) -> String {
    format!("twc.local/sample-worker:{tag}")
}

/// A Connection named `dev` to the sandbox's Temporal.
pub fn connection(namespace: &str) -> Value {
    json!({
        "apiVersion": "temporal.io/v1alpha1",
        "kind": "Connection",
        "metadata": { "name": "dev", "namespace": namespace },
        "spec": { "hostPort": env().temporal_address }
    })
}

/// `manifest` (a WorkerDeployment or Connection) as the older kind of the same name
/// (TemporalWorkerDeployment, TemporalConnection), which `twc` keeps serving.
pub fn legacy(mut manifest: Value) -> Value {
    let older = match manifest["kind"].as_str() {
        Some("WorkerDeployment") => "TemporalWorkerDeployment",
        Some("Connection") => "TemporalConnection",
        _ => return manifest,
    };
    manifest["kind"] = older.into();
    manifest
}

/// A WorkerDeployment running the sample worker with `tag`, 1 replica, short sunset delays.
pub fn worker(namespace: &str, name: &str, tag: &str, rollout: Value) -> Value {
    json!({
        "apiVersion": "temporal.io/v1alpha1",
        "kind": "WorkerDeployment",
        "metadata": { "name": name, "namespace": namespace },
        "spec": {
            "replicas": 1,
            "progressDeadlineSeconds": 120,
            "workerOptions": { "connectionRef": { "name": "dev" }, "temporalNamespace": env().temporal_namespace },
            "rollout": rollout,
            "sunset": { "scaledownDelay": "2s", "deleteDelay": "3s" },
            "template": { "spec": { "containers": [ { "name": "worker", "image": image(tag) } ] } }
        }
    })
}

/// `kubectl apply --server-side` of a manifest; panics with kubectl's message on failure.
pub async fn apply(manifest: &Value) {
    let out = kubectl(
        &["apply", "--server-side", "--force-conflicts", "-f", "-"],
        Some(&manifest.to_string()),
    )
    .await;
    assert!(out.success, "kubectl apply failed: {}", out.stderr);
}

/// Reads a worker deployment of either kind (the one holding its name's claim).
pub async fn get_twd(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<TemporalWorkerDeployment, String> {
    read_worker(client, namespace, name).await.map(|o| o.object)
}

/// Reads a worker deployment of either kind, with its kind.
pub async fn read_worker(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<twc_crds::WorkerObject, String> {
    let twd = twc_workflows::model::TwdRef {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
    };
    match twc_activities::k8s::get_twd(client, &twd).await {
        Ok(Some(object)) => Ok(object),
        Ok(None) => Err(format!("no worker deployment {namespace}/{name}")),
        Err(e) => Err(e.to_string()),
    }
}

/// A condition of a TWD: (status, reason, message).
pub fn condition(twd: &TemporalWorkerDeployment, type_: &str) -> Option<(String, String, String)> {
    twd.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Waits until `Ready` is True for the TWD's current generation and target `build` is Current.
pub async fn wait_ready(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    timeout: Duration,
) -> TemporalWorkerDeployment {
    wait_for(
        &format!("TWD {namespace}/{name} Ready"),
        timeout,
        || async {
            let twd = get_twd(client, namespace, name).await?;
            let status = twd.status.clone().unwrap_or_default();
            let ready = condition(&twd, "Ready")
                .is_some_and(|(s, r, _)| s == "True" && r == "RolloutComplete");
            let fresh = status.observed_generation == twd.metadata.generation;
            if ready && fresh {
                Ok(twd)
            } else {
                Err(format!(
                    "status: {}",
                    serde_json::to_string(&twd.status).unwrap_or_default()
                ))
            }
        },
    )
    .await
}

/// Waits until a condition has the given reason (any status).
pub async fn wait_reason(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    type_: &str,
    reason: &str,
    timeout: Duration,
) -> (String, String, String) {
    wait_for(
        &format!("TWD {namespace}/{name} {type_} reason {reason}"),
        timeout,
        || async {
            let twd = get_twd(client, namespace, name).await?;
            match condition(&twd, type_) {
                Some(c) if c.1 == reason => Ok(c),
                other => Err(format!(
                    "{type_}: {other:?}; status: {}",
                    serde_json::to_string(&twd.status).unwrap_or_default()
                )),
            }
        },
    )
    .await
}

/// Target build ID in status.
pub fn target_build(twd: &TemporalWorkerDeployment) -> Option<String> {
    twd.status
        .as_ref()?
        .target_version
        .as_ref()
        .map(|t| t.version.build_id.clone())
}

/// The versioned Deployments of a TWD: (name, build ID, spec replicas).
pub async fn deployments(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Vec<(String, String, Option<i32>)> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let selector = format!(
        "{}={}",
        twc_crds::labels::DEPLOYMENT_NAME,
        twc_crds::naming::deployment_name_label(name)
    );
    let list = api
        .list(&ListParams::default().labels(&selector))
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    list.into_iter()
        .filter(|d| d.metadata.deletion_timestamp.is_none())
        .map(|d| {
            let build = d
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(twc_crds::labels::BUILD_ID).cloned())
                .unwrap_or_default();
            (
                d.metadata.name.unwrap_or_default(),
                build,
                d.spec.and_then(|s| s.replicas),
            )
        })
        .collect()
}

/// Routing read back from Temporal: (current build, ramping build, ramp %, known build IDs).
#[derive(Debug, Clone, Default)]
pub struct Routing {
    /// Current build ID (None = unversioned).
    pub current: Option<String>,
    /// Ramping build ID.
    pub ramping: Option<String>,
    /// Ramp percentage.
    pub percentage: f64,
    /// Build IDs Temporal knows.
    pub versions: Vec<String>,
    /// Whether the worker deployment exists.
    pub exists: bool,
}

impl Routing {
    /// The routing of `temporal worker deployment describe --output json`'s answer.
    pub fn from_describe(v: &Value) -> Self {
        let text = |v: &Value| v.as_str().filter(|s| !s.is_empty()).map(str::to_owned);
        let rc = &v["routingConfig"];
        Self {
            current: text(&rc["currentVersionBuildID"]),
            ramping: text(&rc["rampingVersionBuildID"]),
            percentage: rc["rampingVersionPercentage"].as_f64().unwrap_or(0.0),
            versions: v["versionSummaries"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| text(&s["BuildID"]))
                .collect(),
            exists: true,
        }
    }
}

/// DescribeWorkerDeployment through the temporal CLI.
pub async fn routing(deployment_name: &str) -> Result<Routing, String> {
    let out = temporal(&[
        "worker",
        "deployment",
        "describe",
        "--name",
        deployment_name,
        "--output",
        "json",
    ])
    .await;
    if !out.success {
        if out.stderr.contains("no Worker Deployment found") || out.stderr.contains("NotFound") {
            return Ok(Routing::default());
        }
        return Err(out.stderr);
    }
    let v: Value = serde_json::from_str(&out.stdout).map_err(|e| format!("{e}: {}", out.stdout))?;
    Ok(Routing::from_describe(&v))
}

/// How many times each pod of `namespace` started, by pod log, from the pod runner's logs under
/// `pods_dir` (one `==> ... starting` line per start; a replaced pod is a new log): equal maps
/// before and after something mean no pod was restarted or replaced.
pub fn pod_starts(
    pods_dir: &std::path::Path,
    namespace: &str,
) -> std::collections::BTreeMap<String, usize> {
    let mut starts = std::collections::BTreeMap::new();
    for deployment in std::fs::read_dir(pods_dir.join(namespace))
        .into_iter()
        .flatten()
        .flatten()
    {
        for log in std::fs::read_dir(deployment.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let path = log.path();
            if path.extension().is_some_and(|e| e == "log") {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let count = text
                    .lines()
                    .filter(|l| l.starts_with("==>") && l.contains(" starting "))
                    .count();
                starts.insert(path.display().to_string(), count);
            }
        }
    }
    starts
}
