//! Taking a fleet over from the Go Temporal Worker Controller with nothing moving: no new build,
//! no routing change, no pod restart, no pinned workflow moved; the next template change rolls
//! out under `twc`, which then takes the manager identity over (`--take-over-manager-from`).
//!
//! The test does not build or run the Go controller (its module could be built from the Go
//! module proxy; its code is not carried here): it builds the state the Go controller leaves
//! behind itself, the way it makes it (reference §2.3-§2.5, §3.13, §8): WorkerDeployments and a
//! Connection with its finalizer, versioned Deployments `<name>-<build>` with build IDs like
//! `v1-4b95`, its selector labels, its env appended after the user's, its pod-template hash
//! annotations, a controller owner reference to the WorkerDeployment, routing set and the
//! manager identity claimed by its identity, and a status without `twc`'s `rollout`. It does so in a private sandbox whose controller is stopped, as
//! the Go controller is during a migration.

use std::time::Duration;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use twc_crds::BuildId;
use twc_crds::naming::versioned_deployment_name;

use crate::chaos::cluster::{Cluster, Private};
use crate::harness::controls::holds_for;
use crate::harness::twd::{condition, get_twd, pod_starts, target_build, worker};

/// The Go controller's manager identity: `<CONTROLLER_IDENTITY>/<uid of its namespace>`.
const GO_IDENTITY: &str =
    "temporal-worker-controller/tw-system/6f1c2d6e-0d57-4b4c-9d2b-0d9d6a8e1f00";
/// What the controller is started with to take those over.
const TAKE_OVER: &str = "temporal-worker-controller/tw-system/*";
const WAIT: Duration = Duration::from_secs(120);

/// One worker deployment of the fleet: its rollout and the versions the Go controller made,
/// oldest first (the last one runs the spec's template).
struct Worker {
    name: &'static str,
    /// (image tag, Go build ID)
    versions: &'static [(&'static str, &'static str)],
    /// Ramp of the last version, when it is ramping.
    ramp: Option<f64>,
    /// Whether the last version is Current (else the first one is, and the last is the target).
    last_is_current: bool,
}

const FLEET: [Worker; 3] = [
    Worker {
        name: "orders",
        versions: &[("v1", "v1-4b95")],
        ramp: None,
        last_is_current: true,
    },
    Worker {
        name: "payments",
        versions: &[("v1", "v1-8bbc"), ("v2", "v2-6df8")],
        ramp: Some(25.0),
        last_is_current: false,
    },
    Worker {
        name: "emails",
        versions: &[("v1", "v1-c894"), ("v2", "v2-7d5f")],
        ramp: None,
        last_is_current: false,
    },
];

impl Worker {
    fn rollout(&self) -> Value {
        match self.name {
            "orders" => json!({ "strategy": "AllAtOnce" }),
            "payments" => json!({ "strategy": "Progressive",
                "steps": [{ "rampPercentage": 25, "pauseDuration": "1h" }] }),
            _ => json!({ "strategy": "Manual" }),
        }
    }

    /// The WorkerDeployment, its template running `tag`, as a Go controller user writes it.
    fn manifest(&self, ns: &str, tag: &str) -> Value {
        let mut manifest = worker(ns, self.name, tag, self.rollout());
        manifest["spec"]["template"]["metadata"] = json!({ "labels": { "app": self.name } });
        manifest["spec"]["template"]["spec"]["containers"][0]["env"] =
            json!([{ "name": "SAMPLE_TASK_QUEUE", "value": self.name }]);
        manifest
    }

    fn current_build(&self) -> &'static str {
        let (_, build) = if self.last_is_current {
            self.versions[self.versions.len() - 1]
        } else {
            self.versions[0]
        };
        build
    }

    fn target_build(&self) -> &'static str {
        self.versions[self.versions.len() - 1].1
    }
}

fn hex_sha256(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// The versioned Deployment the Go controller makes for `build` of `manifest` (a
/// WorkerDeployment with uid `uid`), connected to `host_port`.
fn go_deployment(ns: &str, manifest: &Value, uid: &str, build: &str, host_port: &str) -> Value {
    let name = manifest["metadata"]["name"].as_str().unwrap_or_default();
    let template = &manifest["spec"]["template"];
    let selector = json!({ "temporal.io/deployment-name": name, "temporal.io/build-id": build });
    let mut pod = template.clone();
    let labels = pod["metadata"]["labels"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let mut all_labels = labels.clone();
    all_labels.extend(selector.as_object().cloned().unwrap_or_default());
    pod["metadata"]["labels"] = Value::Object(all_labels);
    pod["metadata"]["annotations"] = json!({
        "temporal.io/connection-spec-hash": hex_sha256(host_port),
        "temporal.io/pod-template-spec-hash": hex_sha256(&template.to_string()),
    });
    let temporal_namespace = manifest["spec"]["workerOptions"]["temporalNamespace"].clone();
    for container in pod["spec"]["containers"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        let mut env = container["env"].as_array().cloned().unwrap_or_default();
        env.extend([
            json!({ "name": "TEMPORAL_ADDRESS", "value": host_port }),
            json!({ "name": "TEMPORAL_NAMESPACE", "value": temporal_namespace }),
            json!({ "name": "TEMPORAL_DEPLOYMENT_NAME", "value": format!("{ns}/{name}") }),
            json!({ "name": "TEMPORAL_WORKER_BUILD_ID", "value": build }),
        ]);
        container["env"] = Value::Array(env);
    }
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {
            "name": versioned_deployment_name(name, &BuildId::new(build)),
            "namespace": ns,
            "labels": selector,
            "ownerReferences": [{
                "apiVersion": "temporal.io/v1alpha1", "kind": "WorkerDeployment", "name": name,
                "uid": uid, "controller": true, "blockOwnerDeletion": true
            }]
        },
        "spec": {
            "replicas": 1,
            "minReadySeconds": 0,
            "selector": { "matchLabels": selector },
            "template": pod
        }
    })
}

/// The temporal CLI as the Go controller, against the private sandbox.
async fn as_go(cluster: &Cluster, args: &[&str]) {
    let mut all = args.to_vec();
    all.extend(["--identity", GO_IDENTITY]);
    let out = cluster.temporal(&all).await;
    assert!(out.success, "temporal {args:?}: {}", out.stderr);
}

/// (status, build) of a workflow's latest run.
async fn run_of(cluster: &Cluster, id: &str) -> Result<(String, String), String> {
    let out = cluster
        .temporal(&[
            "workflow",
            "describe",
            "--workflow-id",
            id,
            "--output",
            "json",
        ])
        .await;
    if !out.success {
        return Err(out.stderr);
    }
    let v: Value = serde_json::from_str(&out.stdout).map_err(|e| e.to_string())?;
    let info = &v["workflowExecutionInfo"];
    let status = info["status"]
        .as_str()
        .unwrap_or_default()
        .trim_start_matches("WORKFLOW_EXECUTION_STATUS_")
        .to_owned();
    let build = info["versioningInfo"]["deploymentVersion"]["buildId"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    Ok((status, build))
}

/// What must not move: routing, versions, Deployments (name and uid), pods, pinned workflows.
async fn snapshot(
    cluster: &Cluster,
    ns: &str,
    pinned: &[(String, String)],
) -> Result<String, String> {
    let mut parts = Vec::new();
    for w in &FLEET {
        let r = cluster.routing(&format!("{ns}/{}", w.name)).await?;
        let mut versions = r.versions.clone();
        versions.sort();
        parts.push(format!(
            "{}: current {:?} ramping {:?} {}% versions {versions:?}",
            w.name, r.current, r.ramping, r.percentage
        ));
    }
    let out = cluster
        .kubectl(&["get", "deployments", "-n", ns, "-o", "jsonpath={range .items[*]}{.metadata.name}={.metadata.uid}/{.spec.template.metadata.annotations} {end}"], None)
        .await;
    parts.push(format!("deployments {}", out.stdout));
    parts.push(format!("pods {:?}", pod_starts(&cluster.env.pods_dir, ns)));
    for (id, _) in pinned {
        let (status, build) = run_of(cluster, id).await?;
        parts.push(format!("{id}: {status} on {build}"));
    }
    Ok(parts.join("\n"))
}

#[tokio::test]
async fn a_fleet_of_the_go_controller_is_taken_over_with_nothing_moving() {
    let mut private = Private::start("takeover").await;
    // The Go controller ran the fleet; twc is not running yet.
    assert!(private.sandbox.kill_controller().await.is_some());
    let cluster = &private.cluster;
    let ns = cluster.namespace("takeover").await;
    let host_port = cluster.env.temporal_address.clone();
    let mut connection = cluster.connection(&ns, "dev");
    connection["metadata"]["finalizers"] = json!(["temporal.io/delete-protection"]);
    cluster.apply(&connection).await;

    let mut pinned: Vec<(String, String)> = Vec::new();
    for w in &FLEET {
        let (last_tag, _) = w.versions[w.versions.len() - 1];
        let mut manifest = w.manifest(&ns, last_tag);
        manifest["metadata"]["finalizers"] = json!(["temporal.io/delete-protection"]);
        cluster.apply(&manifest).await;
        let uid = cluster
            .kubectl(
                &[
                    "get",
                    "wd",
                    w.name,
                    "-n",
                    &ns,
                    "-o",
                    "jsonpath={.metadata.uid}",
                ],
                None,
            )
            .await
            .stdout;
        for (tag, build) in w.versions {
            let deployment = go_deployment(&ns, &w.manifest(&ns, tag), &uid, build, &host_port);
            cluster.apply(&deployment).await;
        }
        let deployment_name = format!("{ns}/{}", w.name);
        let builds: Vec<&str> = w.versions.iter().map(|(_, b)| *b).collect();
        cluster
            .wait(
                &format!("{deployment_name}: every version registered"),
                WAIT,
                || async {
                    let r = cluster.routing(&deployment_name).await?;
                    if builds.iter().all(|b| r.versions.iter().any(|v| v == b)) {
                        Ok(())
                    } else {
                        Err(format!("{r:?}"))
                    }
                },
            )
            .await;
        as_go(
            cluster,
            &[
                "worker",
                "deployment",
                "manager-identity",
                "set",
                "--deployment-name",
                &deployment_name,
                "--self",
                "--yes",
            ],
        )
        .await;
        as_go(
            cluster,
            &[
                "worker",
                "deployment",
                "set-current-version",
                "--deployment-name",
                &deployment_name,
                "--build-id",
                w.current_build(),
                "--yes",
            ],
        )
        .await;
        // Pinned workflows of the Current version, started before any ramp.
        for i in 0..2 {
            let id = format!("{}-subscription-{i}", w.name);
            let out = cluster
                .temporal(&[
                    "workflow",
                    "start",
                    "--type",
                    "Subscription",
                    "--task-queue",
                    w.name,
                    "--workflow-id",
                    &id,
                    "--input",
                    "{}",
                ])
                .await;
            assert!(out.success, "{}", out.stderr);
            pinned.push((id, w.current_build().to_owned()));
        }
        if let Some(ramp) = w.ramp {
            let percentage = ramp.to_string();
            as_go(
                cluster,
                &[
                    "worker",
                    "deployment",
                    "set-ramping-version",
                    "--deployment-name",
                    &deployment_name,
                    "--build-id",
                    w.target_build(),
                    "--percentage",
                    &percentage,
                    "--yes",
                ],
            )
            .await;
        }
        // The status the Go controller left (no `rollout`: twc never managed it).
        let status = json!({ "status": {
            "targetVersion": { "buildID": w.target_build(), "status": if w.last_is_current { "Current" } else { "Inactive" } },
            "currentVersion": { "buildID": w.current_build(), "status": "Current" },
            "managerIdentity": GO_IDENTITY,
            "conditions": [{ "type": "Ready", "status": "True", "reason": "RolloutComplete", "message": "Rollout complete",
                             "lastTransitionTime": "2026-11-20T10:00:00Z" }]
        }});
        let out = cluster
            .kubectl(
                &[
                    "patch",
                    "wd",
                    w.name,
                    "-n",
                    &ns,
                    "--subresource=status",
                    "--type=merge",
                    "-p",
                    &status.to_string(),
                ],
                None,
            )
            .await;
        assert!(out.success, "{}", out.stderr);
    }
    cluster
        .wait("the pinned workflows run on their builds", WAIT, || async {
            for (id, build) in &pinned {
                let (status, on) = run_of(cluster, id).await?;
                if status != "RUNNING" || on != *build {
                    return Err(format!("{id}: {status} on {on:?}"));
                }
            }
            Ok(())
        })
        .await;
    let before = snapshot(cluster, &ns, &pinned)
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    // twc takes over, told whose manager identity it may claim.
    private
        .sandbox
        .restart_controller_with_env(&[("TWC_TAKE_OVER_MANAGER_FROM", TAKE_OVER)])
        .await
        .unwrap_or_else(|e| panic!("starting twc: {e:#}"));
    let cluster = &private.cluster;
    for w in &FLEET {
        let expected = match w.name {
            "orders" => "RolloutComplete",
            "payments" => "Ramping",
            _ => "WaitingForPromotion",
        };
        cluster
            .wait(&format!("{} adopted and shown", w.name), WAIT, || async {
                let twd = get_twd(&cluster.client, &ns, w.name).await?;
                let status = twd.status.clone().unwrap_or_default();
                let adopted = status.adopted_build.as_ref().map(|a| a.build_id.clone());
                let reason = condition(&twd, "Ready").map(|c| c.1);
                let managed = status.rollout.is_some();
                if target_build(&twd).as_deref() == Some(w.target_build())
                    && adopted.as_deref() == Some(w.target_build())
                    && reason.as_deref() == Some(expected)
                    && managed
                {
                    Ok(())
                } else {
                    Err(serde_json::to_string(&twd.status).unwrap_or_default())
                }
            })
            .await;
    }
    holds_for("nothing moved", Duration::from_secs(10), || async {
        let now = snapshot(cluster, &ns, &pinned).await?;
        if now == before {
            Ok(())
        } else {
            Err(format!("before:\n{before}\nnow:\n{now}"))
        }
    })
    .await;

    // The next template change rolls out under twc, which claims the manager identity.
    let orders = &FLEET[0];
    cluster.apply(&orders.manifest(&ns, "v2")).await;
    cluster
        .wait("orders v2 Current under twc", WAIT, || async {
            let twd = get_twd(&cluster.client, &ns, "orders").await?;
            let target = target_build(&twd).unwrap_or_default();
            let r = cluster.routing(&format!("{ns}/orders")).await?;
            let manager = twd.status.as_ref().and_then(|s| s.manager_identity.clone());
            if target.starts_with("v2-")
                && target != "v2-4b95"
                && r.current.as_deref() == Some(target.as_str())
                && manager.as_deref() == Some("twc")
            {
                Ok(target)
            } else {
                Err(format!(
                    "target {target}, routing {r:?}, manager {manager:?}"
                ))
            }
        })
        .await;

    // Handing back (README, "Back to the Go controller"): pin the build with
    // unsafeCustomBuildID while twc runs (nothing moves), stop twc; the Go controller then finds
    // its target built, routed, and its Deployments carrying its connection hash and no
    // pod-template hash of its own, so it changes nothing.
    let current = target_build(
        &get_twd(&cluster.client, &ns, "orders")
            .await
            .unwrap_or_else(|e| panic!("{e}")),
    )
    .unwrap_or_default();
    let before = snapshot(cluster, &ns, &pinned)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut pinned_build = orders.manifest(&ns, "v2");
    pinned_build["spec"]["workerOptions"]["unsafeCustomBuildID"] = json!(current);
    cluster.apply(&pinned_build).await;
    cluster
        .wait("the pinned build is taken as the target", WAIT, || async {
            let twd = get_twd(&cluster.client, &ns, "orders").await?;
            let seen = twd.status.as_ref().and_then(|s| s.observed_generation);
            if seen == twd.metadata.generation
                && target_build(&twd).as_deref() == Some(current.as_str())
            {
                Ok(())
            } else {
                Err(serde_json::to_string(&twd.status).unwrap_or_default())
            }
        })
        .await;
    holds_for(
        "nothing moved when the build was pinned",
        Duration::from_secs(5),
        || async {
            let now = snapshot(cluster, &ns, &pinned).await?;
            if now == before {
                Ok(())
            } else {
                Err(format!("before:\n{before}\nnow:\n{now}"))
            }
        },
    )
    .await;
    assert!(private.sandbox.kill_controller().await.is_some());
    let deployments: Value = serde_json::from_str(
        &cluster
            .kubectl(
                &[
                    "get",
                    "deployments",
                    "-n",
                    &ns,
                    "-l",
                    "temporal.io/deployment-name=orders",
                    "-o",
                    "json",
                ],
                None,
            )
            .await
            .stdout,
    )
    .unwrap_or_default();
    let target = deployments["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|d| d["metadata"]["labels"]["temporal.io/build-id"] == json!(current))
        .cloned()
        .unwrap_or_else(|| panic!("no Deployment of {current}: {deployments}"));
    let annotations = &target["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(
        annotations["temporal.io/connection-spec-hash"],
        json!(hex_sha256(&cluster.env.temporal_address))
    );
    assert!(
        annotations
            .get("temporal.io/pod-template-spec-hash")
            .is_none(),
        "{annotations}"
    );
    assert_eq!(
        target["metadata"]["name"],
        json!(versioned_deployment_name("orders", &BuildId::new(&current)))
    );
    let r = cluster
        .routing(&format!("{ns}/orders"))
        .await
        .unwrap_or_default();
    assert_eq!(r.current.as_deref(), Some(current.as_str()));
    private.sandbox.stop().await;
}
