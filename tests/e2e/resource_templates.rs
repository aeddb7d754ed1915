//! WorkerResourceTemplates against the real servers: one copy per version with a live
//! Deployment (an HPA, a PodDisruptionBudget, a KEDA ScaledObject with KEDA's own CRD), filled
//! where the template says `{}`, following a rollout and reported per version; the admission
//! webhook (called by the real kube-apiserver) refusing kinds that are not allowed, authors who
//! may not create the kind, templates that break a rule, and scalers on a worker deployment
//! that scales itself (`spec.autoscaling`, which wins when it comes later), and answering again
//! once a killed controller is restarted.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use twc_crds::WorkerResourceTemplate;
use twc_crds::resource_template::render::copy_name;

use crate::harness::cli::{CliOutput, kubectl};
use crate::harness::controls::holds_for;
use crate::harness::twd::{apply, connection, target_build, wait_ready, worker};
use crate::harness::wait::wait_for;
use crate::harness::{kube_client, test_namespace};

const ROLLOUT: Duration = Duration::from_secs(150);
/// A copy follows its version within this (the controller reacts to the Deployment's change).
const FOLLOW: Duration = Duration::from_secs(60);
/// The KEDA release whose ScaledObject CRD the tests install (from its Go module).
const KEDA_MODULE: &str = "github.com/kedacore/keda/v2@v2.16.1";

/// A worker deployment of `tag` without `spec.replicas` (a scaler decides them).
fn scaled_worker(namespace: &str, name: &str, tag: &str) -> Value {
    let mut manifest = worker(namespace, name, tag, json!({ "strategy": "AllAtOnce" }));
    if let Some(spec) = manifest["spec"].as_object_mut() {
        spec.remove("replicas");
    }
    manifest
}

/// A WorkerResourceTemplate named `name` of `template` for the worker deployment `worker`.
fn template(namespace: &str, name: &str, worker: &str, template: Value) -> Value {
    json!({
        "apiVersion": "temporal.io/v1alpha1",
        "kind": "WorkerResourceTemplate",
        "metadata": { "name": name, "namespace": namespace },
        "spec": { "workerDeploymentRef": { "name": worker }, "template": template }
    })
}

fn hpa() -> Value {
    json!({
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": { "labels": { "team": "orders" } },
        "spec": {
            "scaleTargetRef": {},
            "minReplicas": 1,
            "maxReplicas": 3,
            "metrics": [{ "type": "External", "external": {
                "metric": { "name": "temporal_backlog", "selector": { "matchLabels": { "task_type": "Activity" } } },
                "target": { "type": "AverageValue", "averageValue": "10" } } }]
        }
    })
}

fn pdb() -> Value {
    json!({
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "spec": { "minAvailable": 1, "selector": { "matchLabels": {} } }
    })
}

/// `kubectl create` of `manifest` (as `user` when given); the API server's answer. A webhook
/// the API server cannot reach (the controller being restarted by another test) is waited for.
async fn create(manifest: &Value, user: Option<&str>) -> CliOutput {
    let mut args = vec!["create", "-f", "-"];
    if let Some(user) = user {
        args.extend(["--as", user]);
    }
    through_webhook(&args, manifest).await
}

/// `kubectl <args>` with `manifest` on standard input, again while the API server cannot reach
/// the webhook.
async fn through_webhook(args: &[&str], manifest: &Value) -> CliOutput {
    wait_for("the admission webhook to answer", FOLLOW, || async {
        let out = kubectl(args, Some(&manifest.to_string())).await;
        if out.stderr.contains("failed calling webhook") {
            Err(out.stderr)
        } else {
            Ok(out)
        }
    })
    .await
}

/// Creates `manifest`; panics with the API server's refusal.
async fn admitted(manifest: &Value) -> CliOutput {
    let out = create(manifest, None).await;
    assert!(out.success, "refused: {}", out.stderr);
    out
}

/// The API server's refusal of `manifest` (created as `user` when given); panics if admitted.
async fn refusal(manifest: &Value, user: Option<&str>) -> String {
    let out = create(manifest, user).await;
    assert!(!out.success, "admitted: {manifest}");
    out.stderr
}

async fn read_template(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<WorkerResourceTemplate, String> {
    Api::<WorkerResourceTemplate>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .map_err(|e| e.to_string())
}

/// (status, reason, message) of a template's `Ready` condition.
fn ready(template: &WorkerResourceTemplate) -> Option<(String, String, String)> {
    template
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Waits until the template reports copies for exactly `builds`, Ready for its generation.
async fn wait_applied(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    builds: &[&str],
) -> WorkerResourceTemplate {
    wait_for(
        &format!("WorkerResourceTemplate {namespace}/{name} applied to {builds:?}"),
        ROLLOUT,
        || async {
            let template = read_template(client, namespace, name).await?;
            let status = template.status.clone().unwrap_or_default();
            let reported: Vec<&str> = status
                .versions
                .iter()
                .map(|v| v.build_id.as_str())
                .collect();
            let fresh = status.observed_generation == template.metadata.generation;
            let all_applied = status.versions.iter().all(|v| {
                v.apply_error.is_none()
                    && Some(v.last_applied_generation) == template.metadata.generation
            });
            let is_ready =
                ready(&template).is_some_and(|(s, r, _)| s == "True" && r == "AllVersionsApplied");
            if reported == builds && fresh && all_applied && is_ready {
                Ok(template)
            } else {
                Err(format!(
                    "status: {}",
                    serde_json::to_string(&status).unwrap_or_default()
                ))
            }
        },
    )
    .await
}

/// Waits until the template's `Ready` has `reason`; returns its message.
async fn wait_ready_reason(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    reason: &str,
) -> String {
    wait_for(
        &format!("WorkerResourceTemplate {namespace}/{name} Ready reason {reason}"),
        FOLLOW,
        || async {
            let template = read_template(client, namespace, name).await?;
            match ready(&template) {
                Some((_, r, message)) if r == reason => Ok(message),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
}

/// Names of the objects of `api` in the namespace.
async fn names<K>(api: &Api<K>) -> Result<Vec<String>, String>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut names: Vec<String> = api
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?
        .items
        .iter()
        .filter_map(|o| o.meta().name.clone())
        .collect();
    names.sort();
    Ok(names)
}

/// Waits until the objects of `api` are exactly `expected` (sorted).
async fn wait_names<K>(what: &str, api: &Api<K>, mut expected: Vec<String>)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    expected.sort();
    wait_for(what, ROLLOUT, || async {
        let found = names(api).await?;
        if found == expected {
            Ok(())
        } else {
            Err(format!("found {found:?}, expected {expected:?}"))
        }
    })
    .await;
}

/// The versioned Deployment of `build` of worker `name`.
async fn deployment_of(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    build: &str,
) -> Deployment {
    let deployment_name =
        twc_crds::naming::versioned_deployment_name(name, &twc_crds::BuildId::new(build));
    match Api::<Deployment>::namespaced(client.clone(), namespace)
        .get(&deployment_name)
        .await
    {
        Ok(deployment) => deployment,
        Err(e) => panic!("Deployment {deployment_name}: {e}"),
    }
}

#[tokio::test]
async fn copies_follow_the_versions_of_a_rollout_with_their_fields_filled() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "wrt").await;
    apply(&connection(&ns)).await;
    apply(&scaled_worker(&ns, "hello", "v1")).await;
    let v1 = target_build(&wait_ready(&client, &ns, "hello", ROLLOUT).await).unwrap_or_default();
    admitted(&template(&ns, "scaler", "hello", hpa())).await;
    admitted(&template(&ns, "budget", "hello", pdb())).await;

    let scaler = wait_applied(&client, &ns, "scaler", &[&v1]).await;
    wait_applied(&client, &ns, "budget", &[&v1]).await;
    let deployment = deployment_of(&client, &ns, "hello", &v1).await;
    let selector: BTreeMap<String, String> = deployment
        .spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.clone())
        .unwrap_or_default();

    // The HPA copy: named by (worker, template, build), scaling the version's Deployment, its
    // metric selector merged with the version's labels, labelled and owned by the template.
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(client.clone(), &ns);
    let hpa_name = copy_name("hello", "scaler", &v1);
    assert_eq!(
        scaler
            .status
            .as_ref()
            .map(|s| s.versions[0].resource_name.clone()),
        Some(hpa_name.clone())
    );
    let copy = match hpas.get(&hpa_name).await {
        Ok(copy) => copy,
        Err(e) => panic!("the HPA copy {hpa_name}: {e}"),
    };
    let target = &copy.spec.scale_target_ref;
    assert_eq!(
        (
            target.api_version.as_deref(),
            target.kind.as_str(),
            target.name.clone()
        ),
        (
            Some("apps/v1"),
            "Deployment",
            deployment.metadata.name.clone().unwrap_or_default()
        )
    );
    let metric_labels = copy.spec.metrics.as_ref().and_then(|m| {
        m[0].external
            .as_ref()
            .and_then(|e| e.metric.selector.as_ref())
            .and_then(|s| s.match_labels.clone())
    });
    assert_eq!(
        metric_labels,
        Some(BTreeMap::from([
            ("task_type".to_owned(), "Activity".to_owned()),
            ("temporal_namespace".to_owned(), "default".to_owned()),
            ("temporal_worker_build_id".to_owned(), v1.clone()),
            (
                "temporal_worker_deployment_name".to_owned(),
                format!("{ns}_hello")
            ),
        ]))
    );
    let labels = copy.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("team").map(String::as_str), Some("orders"));
    for (key, value) in &selector {
        assert_eq!(labels.get(key), Some(value), "copy label {key}");
    }
    let owners = copy.metadata.owner_references.clone().unwrap_or_default();
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert_eq!(
        (
            owners[0].kind.as_str(),
            owners[0].uid.as_str(),
            owners[0].controller,
            owners[0].block_owner_deletion
        ),
        (
            "WorkerResourceTemplate",
            scaler.metadata.uid.as_deref().unwrap_or_default(),
            Some(true),
            Some(true)
        )
    );
    assert_eq!(
        copy.metadata
            .managed_fields
            .unwrap_or_default()
            .iter()
            .map(|f| (f.manager.clone(), f.operation.clone()))
            .collect::<Vec<_>>(),
        [(Some("twc".to_owned()), Some("Apply".to_owned()))],
        "written by server-side apply only"
    );

    // The PDB copy selects exactly the version's pods.
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &ns);
    let pdb_name = copy_name("hello", "budget", &v1);
    let budget = match pdbs.get(&pdb_name).await {
        Ok(budget) => budget,
        Err(e) => panic!("the PDB copy {pdb_name}: {e}"),
    };
    assert_eq!(
        budget
            .spec
            .and_then(|s| s.selector)
            .and_then(|s| s.match_labels),
        Some(selector)
    );

    // A rollout: v2 gets its copies; once the sunset deletes v1's Deployment, v1's copies go.
    apply(&scaled_worker(&ns, "hello", "v2")).await;
    let v2 = target_build(&wait_ready(&client, &ns, "hello", ROLLOUT).await).unwrap_or_default();
    assert_ne!(v1, v2);
    wait_names(
        "the HPA copies of v2 alone",
        &hpas,
        vec![copy_name("hello", "scaler", &v2)],
    )
    .await;
    wait_names(
        "the PDB copies of v2 alone",
        &pdbs,
        vec![copy_name("hello", "budget", &v2)],
    )
    .await;
    let scaler = wait_applied(&client, &ns, "scaler", &[&v2]).await;
    let entry = &scaler.status.unwrap_or_default().versions[0];
    assert_eq!(entry.last_applied_generation, 1);
    assert_eq!(entry.last_applied_hash.as_ref().map(String::len), Some(16));
    assert!(entry.last_transition_time.is_some());

    // A template edit is applied to every copy; deleting a template deletes its copies.
    let mut edited = template(&ns, "scaler", "hello", hpa());
    edited["spec"]["template"]["spec"]["maxReplicas"] = json!(5);
    let out = through_webhook(
        &["apply", "--server-side", "--force-conflicts", "-f", "-"],
        &edited,
    )
    .await;
    assert!(out.success, "{}", out.stderr);
    wait_for("the HPA copy with maxReplicas 5", FOLLOW, || async {
        let copy = hpas
            .get(&copy_name("hello", "scaler", &v2))
            .await
            .map_err(|e| e.to_string())?;
        (copy.spec.max_replicas == 5)
            .then_some(())
            .ok_or_else(|| format!("maxReplicas {}", copy.spec.max_replicas))
    })
    .await;
    let scaler = wait_applied(&client, &ns, "scaler", &[&v2]).await;
    assert_eq!(scaler.metadata.generation, Some(2));
    let out = kubectl(&["delete", "wrt", "budget", "-n", &ns], None).await;
    assert!(out.success, "{}", out.stderr);
    wait_names("the PDB copies garbage-collected", &pdbs, vec![]).await;
}

#[tokio::test]
async fn templates_are_refused_unless_allowed_and_their_author_may_create_the_kind() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "wrt-admit").await;

    // A kind the controller may not render: refused, nothing created.
    let config_map = template(
        &ns,
        "config",
        "hello",
        json!({ "apiVersion": "v1", "kind": "ConfigMap", "spec": {} }),
    );
    let refused = refusal(&config_map, None).await;
    assert!(
        refused.contains(
            "spec.template.kind ConfigMap is not allowed; allowed kinds: HorizontalPodAutoscaler, PodDisruptionBudget, ScaledObject"
        ),
        "{refused}"
    );

    // alice may manage templates and HPAs in the namespace, not PDBs.
    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": { "name": "templates", "namespace": ns },
        "rules": [
            { "apiGroups": ["temporal.io"], "resources": ["workerresourcetemplates"], "verbs": ["create", "get", "list"] },
            { "apiGroups": ["autoscaling"], "resources": ["horizontalpodautoscalers"], "verbs": ["create", "update", "delete"] }
        ]
    });
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": { "name": "alice-templates", "namespace": ns },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "templates" },
        "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice" }]
    });
    apply(&role).await;
    apply(&binding).await;
    let out = create(&template(&ns, "scaler", "hello", hpa()), Some("alice")).await;
    assert!(out.success, "alice's HPA template: {}", out.stderr);
    let refused = refusal(&template(&ns, "budget", "hello", pdb()), Some("alice")).await;
    assert!(
        refused.contains(&format!(
            "alice may not create poddisruptionbudgets.policy in namespace {ns}"
        )),
        "{refused}"
    );
    let templates: Api<WorkerResourceTemplate> = Api::namespaced(client.clone(), &ns);
    assert_eq!(names(&templates).await, Ok(vec!["scaler".to_owned()]));
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &ns);
    assert_eq!(names(&pdbs).await, Ok(vec![]));
}

#[tokio::test]
async fn invalid_templates_are_refused_with_the_field_that_is_wrong() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "wrt-invalid").await;
    let with = |edit: &dyn Fn(&mut Value)| {
        let mut manifest = template(&ns, "t", "hello", hpa());
        edit(&mut manifest);
        manifest
    };
    // (what, manifest, part of the refusal); CRD rules first, then the webhook's.
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "no reference",
            with(&|m| {
                m["spec"]
                    .as_object_mut()
                    .map(|s| s.remove("workerDeploymentRef"));
            }),
            "exactly one of spec.workerDeploymentRef and spec.temporalWorkerDeploymentRef (deprecated) must be set",
        ),
        (
            "both references",
            with(&|m| m["spec"]["temporalWorkerDeploymentRef"] = json!({ "name": "hello" })),
            "exactly one of spec.workerDeploymentRef and spec.temporalWorkerDeploymentRef (deprecated) must be set",
        ),
        (
            "a reference that is not a DNS label",
            with(&|m| m["spec"]["workerDeploymentRef"]["name"] = json!("Hello_World")),
            "spec.workerDeploymentRef.name in body should match",
        ),
        (
            "no template",
            with(&|m| {
                m["spec"].as_object_mut().map(|s| s.remove("template"));
            }),
            "spec.template: Required value",
        ),
        (
            "no apiVersion",
            with(&|m| {
                m["spec"]["template"]
                    .as_object_mut()
                    .map(|t| t.remove("apiVersion"));
            }),
            "spec.template.apiVersion: Required value",
        ),
        (
            "no kind",
            with(&|m| {
                m["spec"]["template"]
                    .as_object_mut()
                    .map(|t| t.remove("kind"));
            }),
            "spec.template.kind: Required value",
        ),
        (
            "no spec",
            with(&|m| {
                m["spec"]["template"]
                    .as_object_mut()
                    .map(|t| t.remove("spec"));
            }),
            "spec.template.spec: Required value",
        ),
        (
            "a name",
            with(&|m| m["spec"]["template"]["metadata"]["name"] = json!("mine")),
            "spec.template.metadata.name must not be set",
        ),
        (
            "a namespace",
            with(&|m| m["spec"]["template"]["metadata"]["namespace"] = json!("elsewhere")),
            "spec.template.metadata.namespace must not be set",
        ),
        (
            "a scaleTargetRef of its own",
            with(&|m| {
                m["spec"]["template"]["spec"]["scaleTargetRef"] =
                    json!({ "apiVersion": "apps/v1", "kind": "Deployment", "name": "mine" })
            }),
            "spec.template.spec.scaleTargetRef must be {}",
        ),
        (
            "a selector of its own",
            with(&|m| {
                m["spec"]["template"] = json!({ "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                    "spec": { "minAvailable": 1, "selector": { "matchLabels": { "app": "mine" } } } })
            }),
            "spec.template.spec.selector.matchLabels must be {} or absent",
        ),
        (
            "minReplicas 0",
            with(&|m| m["spec"]["template"]["spec"]["minReplicas"] = json!(0)),
            "spec.template.spec.minReplicas must not be 0",
        ),
        (
            "a metric label the controller sets",
            with(&|m| {
                m["spec"]["template"]["spec"]["metrics"][0]["external"]["metric"]["selector"]["matchLabels"]
                    ["temporal_worker_build_id"] = json!("v1")
            }),
            "spec.template.spec.metrics[0].external.metric.selector.matchLabels.temporal_worker_build_id must not be set",
        ),
        (
            "a KEDA temporal trigger naming its deployment",
            with(&|m| {
                m["spec"]["template"] = json!({ "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
                    "spec": { "scaleTargetRef": {}, "triggers": [{ "type": "temporal",
                        "metadata": { "workerDeploymentName": "default/hello", "taskQueue": "q" } }] } })
            }),
            "spec.template.spec.triggers[0].metadata.workerDeploymentName must be \"\" or absent",
        ),
        (
            "a kind the API server does not serve",
            with(&|m| {
                m["spec"]["template"]["apiVersion"] = json!("autoscaling/v9");
            }),
            "spec.template: the API server serves no kind HorizontalPodAutoscaler in autoscaling/v9",
        ),
    ];
    let mut wrong = Vec::new();
    for (what, manifest, expected) in &cases {
        let refused = refusal(manifest, None).await;
        if !refused.contains(expected) {
            wrong.push(format!("{what}: expected {expected:?} in {refused:?}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));

    // The deprecated reference is admitted, with a warning; the reference never changes.
    let mut deprecated = template(&ns, "old", "hello", pdb());
    deprecated["spec"] =
        json!({ "temporalWorkerDeploymentRef": { "name": "hello" }, "template": pdb() });
    let out = admitted(&deprecated).await;
    assert!(
        out.stderr.contains(
            "spec.temporalWorkerDeploymentRef is deprecated; use spec.workerDeploymentRef instead"
        ),
        "{}",
        out.stderr
    );
    let mut moved = deprecated.clone();
    moved["spec"] = json!({ "workerDeploymentRef": { "name": "other" }, "template": pdb() });
    let out = kubectl(&["replace", "-f", "-"], Some(&moved.to_string())).await;
    assert!(!out.success, "the reference changed");
    assert!(
        out.stderr
            .contains("spec.workerDeploymentRef.name cannot change"),
        "{}",
        out.stderr
    );
}

/// The ScaledObject CRD of the KEDA release [`KEDA_MODULE`], read from its Go module (the Go
/// module proxy serves the release's source, CRDs included).
async fn keda_scaled_object_crd() -> CustomResourceDefinition {
    let go = std::env::var_os("GO").map_or_else(|| PathBuf::from("go"), PathBuf::from);
    let mut command = tokio::process::Command::new(go);
    command.args(["mod", "download", "-json", KEDA_MODULE]);
    let out = crate::harness::cli::run(command, None).await;
    assert!(
        out.success,
        "go mod download {KEDA_MODULE}: {}{}",
        out.stdout, out.stderr
    );
    let module: Value = match serde_json::from_str(&out.stdout) {
        Ok(module) => module,
        Err(e) => panic!("go mod download's answer: {e}: {}", out.stdout),
    };
    let Some(dir) = module["Dir"].as_str() else {
        panic!("go mod download names no Dir: {module}");
    };
    let path = PathBuf::from(dir).join("config/crd/bases/keda.sh_scaledobjects.yaml");
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) => panic!("reading {}: {e}", path.display()),
    };
    match serde_saphyr::from_str(&text) {
        Ok(crd) => crd,
        Err(e) => panic!("parsing {}: {e}", path.display()),
    }
}

#[tokio::test]
async fn a_keda_scaled_object_is_rendered_per_version_with_kedas_own_crd() {
    let client = kube_client().await;
    let crd = keda_scaled_object_crd().await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    if let Err(e) = crds
        .patch(
            "scaledobjects.keda.sh",
            &PatchParams::apply("twc-e2e").force(),
            &Patch::Apply(&crd),
        )
        .await
    {
        panic!("installing KEDA's ScaledObject CRD: {e}");
    }
    wait_for("KEDA's CRD Established", FOLLOW, || async {
        let crd = crds
            .get("scaledobjects.keda.sh")
            .await
            .map_err(|e| e.to_string())?;
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        established
            .then_some(())
            .ok_or_else(|| "not yet".to_owned())
    })
    .await;

    let ns = test_namespace(&client, "wrt-keda").await;
    apply(&connection(&ns)).await;
    apply(&scaled_worker(&ns, "hello", "v1")).await;
    let v1 = target_build(&wait_ready(&client, &ns, "hello", ROLLOUT).await).unwrap_or_default();
    let scaled_object = json!({
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "spec": {
            "scaleTargetRef": {},
            "minReplicaCount": 1,
            "maxReplicaCount": 4,
            "triggers": [{ "type": "temporal", "metadata": {
                "endpoint": "temporal-frontend.temporal:7233", "taskQueue": "hello-world",
                "targetQueueSize": "5", "workerDeploymentName": "", "workerDeploymentBuildId": "",
                "namespace": "" } }]
        }
    });
    admitted(&template(&ns, "keda", "hello", scaled_object)).await;
    wait_applied(&client, &ns, "keda", &[&v1]).await;

    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("keda.sh", "v1alpha1", "ScaledObject"),
        "scaledobjects",
    );
    let scaled_objects: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &resource);
    let name = copy_name("hello", "keda", &v1);
    let copy = match scaled_objects.get(&name).await {
        Ok(copy) => copy,
        Err(e) => panic!("the ScaledObject copy {name}: {e}"),
    };
    let deployment =
        twc_crds::naming::versioned_deployment_name("hello", &twc_crds::BuildId::new(&v1));
    assert_eq!(
        copy.data["spec"]["scaleTargetRef"],
        json!({ "apiVersion": "apps/v1", "kind": "Deployment", "name": deployment })
    );
    assert_eq!(
        copy.data["spec"]["triggers"][0]["metadata"],
        json!({ "endpoint": "temporal-frontend.temporal:7233", "taskQueue": "hello-world",
            "targetQueueSize": "5", "workerDeploymentName": format!("{ns}/hello"),
            "workerDeploymentBuildId": v1, "namespace": "default" })
    );
}

#[tokio::test]
async fn a_scaler_is_refused_on_a_worker_with_autoscaling_and_autoscaling_added_later_wins() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "wrt-autoscaling").await;
    let autoscaling = json!({ "minReplicas": 1, "maxReplicas": 2, "backlogPerReplica": 10 });
    apply(&connection(&ns)).await;

    // At admission: a scaler on a worker deployment that scales itself is refused.
    let mut scaling = scaled_worker(&ns, "scaling", "v1");
    scaling["spec"]["autoscaling"] = autoscaling.clone();
    apply(&scaling).await;
    let refused = refusal(&template(&ns, "scaler", "scaling", hpa()), None).await;
    assert!(
        refused.contains(
            "spec.template.spec.scaleTargetRef: WorkerDeployment scaling has spec.autoscaling"
        ),
        "{refused}"
    );
    // A PodDisruptionBudget scales nothing: admitted.
    admitted(&template(&ns, "budget", "scaling", pdb())).await;

    // Later: the worker deployment gains spec.autoscaling; twc's autoscaler wins, the scaler's
    // copies go and the template says why.
    apply(&scaled_worker(&ns, "hello", "v1")).await;
    let v1 = target_build(&wait_ready(&client, &ns, "hello", ROLLOUT).await).unwrap_or_default();
    admitted(&template(&ns, "scaler", "hello", hpa())).await;
    wait_applied(&client, &ns, "scaler", &[&v1]).await;
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(client.clone(), &ns);
    let mut autoscaled = scaled_worker(&ns, "hello", "v1");
    autoscaled["spec"]["autoscaling"] = autoscaling;
    apply(&autoscaled).await;
    let message = wait_ready_reason(&client, &ns, "scaler", "ConflictsWithAutoscaling").await;
    assert!(
        message.contains("WorkerDeployment hello has spec.autoscaling"),
        "{message}"
    );
    wait_names("the HPA copies deleted", &hpas, vec![]).await;
    holds_for(
        "no copy comes back while spec.autoscaling is set",
        Duration::from_secs(3),
        || async {
            match names(&hpas).await? {
                found if found.is_empty() => Ok(()),
                found => Err(format!("{found:?}")),
            }
        },
    )
    .await;

    // Without spec.autoscaling again, the copy is back.
    apply(&scaled_worker(&ns, "hello", "v1")).await;
    wait_applied(&client, &ns, "scaler", &[&v1]).await;
    wait_names(
        "the HPA copy back",
        &hpas,
        vec![copy_name("hello", "scaler", &v1)],
    )
    .await;
}

#[tokio::test]
async fn a_failed_copy_is_reported_on_the_template_and_by_an_event() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "wrt-failed").await;
    apply(&connection(&ns)).await;
    apply(&scaled_worker(&ns, "hello", "v1")).await;
    let v1 = target_build(&wait_ready(&client, &ns, "hello", ROLLOUT).await).unwrap_or_default();
    // The API server refuses the rendered copy (an HPA without maxReplicas): the webhook cannot
    // know, the apply tells.
    let mut broken = hpa();
    if let Some(spec) = broken["spec"].as_object_mut() {
        spec.remove("maxReplicas");
    }
    admitted(&template(&ns, "broken", "hello", broken)).await;
    let message = wait_ready_reason(&client, &ns, "broken", "ApplyFailed").await;
    assert!(
        message.starts_with(&format!("version {v1}: applying HorizontalPodAutoscaler")),
        "{message}"
    );
    assert!(message.contains("maxReplicas"), "{message}");
    let template = read_template(&client, &ns, "broken")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let entry = &template.status.unwrap_or_default().versions[0];
    assert_eq!(
        (
            entry.build_id.as_str(),
            entry.last_applied_generation,
            entry.last_applied_hash.as_deref()
        ),
        (v1.as_str(), 0, None)
    );
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), &ns);
    wait_for("an ApplyFailed event on the template", FOLLOW, || async {
        let listed = events
            .list(&ListParams::default().fields("involvedObject.name=broken"))
            .await
            .map_err(|e| e.to_string())?
            .items;
        listed
            .iter()
            .any(|e| {
                e.involved_object.kind.as_deref() == Some("WorkerResourceTemplate")
                    && e.type_.as_deref() == Some("Warning")
                    && e.reason.as_deref() == Some("ApplyFailed")
                    && e.message
                        .as_deref()
                        .is_some_and(|m| m.contains("maxReplicas"))
            })
            .then_some(())
            .ok_or_else(|| format!("{} events", listed.len()))
    })
    .await;
}

#[tokio::test]
async fn the_webhook_answers_again_once_a_killed_controller_is_restarted() {
    // A private sandbox: killing the suite's controller would disturb the other tests.
    let mut private = crate::chaos::cluster::Private::start("wrt-webhook").await;
    let ns = private.cluster.namespace("wrt").await;
    let config_map = template(
        &ns,
        "config",
        "hello",
        json!({ "apiVersion": "v1", "kind": "ConfigMap", "spec": {} }),
    );
    let not_allowed = "spec.template.kind ConfigMap is not allowed";
    let cluster = &private.cluster;
    let try_create = || async {
        cluster
            .kubectl(&["create", "-f", "-"], Some(&config_map.to_string()))
            .await
    };
    cluster
        .wait("the webhook refusing a ConfigMap", FOLLOW, || async {
            let out = try_create().await;
            if out.stderr.contains(not_allowed) {
                Ok(())
            } else {
                Err(out.stderr)
            }
        })
        .await;

    // Killed: the API server cannot call it, and fails closed.
    assert!(private.sandbox.kill_controller().await.is_some());
    let down = try_create().await;
    assert!(
        !down.success && down.stderr.contains("failed calling webhook"),
        "{down:?}"
    );

    // Restarted on the same port with the same certificate: it answers again.
    assert!(private.sandbox.restart_dead_controller().is_some());
    let cluster = &private.cluster;
    cluster
        .wait(
            "the restarted webhook refusing a ConfigMap",
            FOLLOW,
            || async {
                let out = try_create().await;
                if out.stderr.contains(not_allowed) {
                    Ok(())
                } else {
                    Err(out.stderr)
                }
            },
        )
        .await;
    let out = cluster
        .kubectl(
            &["create", "-f", "-"],
            Some(&template(&ns, "budget", "hello", pdb()).to_string()),
        )
        .await;
    assert!(out.success, "{}", out.stderr);
    private.sandbox.stop().await;
}
