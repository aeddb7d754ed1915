//! Turning a WorkerResourceTemplate into the copy of one version (reference §3.17): what is
//! filled in where the template says `{}`, the copy's name, labels and owner, and the hash that
//! tells an unchanged copy from a changed one. Pure functions, no I/O.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use crate::naming::dns_clean;

/// Longest name of a copy (as a versioned Deployment's: its pods' names must fit 63 characters,
/// should a template ever render a Deployment).
pub const MAX_COPY_NAME_LEN: usize = 47;
/// Hex characters of the name's hash suffix.
const NAME_HASH_LEN: usize = 8;
/// Hex characters of a rendered copy's hash (`status.versions[].lastAppliedHash`).
pub const RENDERED_HASH_LEN: usize = 16;

/// Metric label: `<namespace>_<worker deployment>`.
pub const METRIC_DEPLOYMENT_NAME: &str = "temporal_worker_deployment_name";
/// Metric label: the build ID.
pub const METRIC_BUILD_ID: &str = "temporal_worker_build_id";
/// Metric label: the Temporal namespace the workers poll.
pub const METRIC_TEMPORAL_NAMESPACE: &str = "temporal_namespace";
/// The metric labels the controller owns (a template may not set them).
pub const METRIC_LABELS: [&str; 3] = [
    METRIC_DEPLOYMENT_NAME,
    METRIC_BUILD_ID,
    METRIC_TEMPORAL_NAMESPACE,
];
/// KEDA `temporal` trigger metadata the controller fills when empty.
pub const KEDA_TRIGGER_FIELDS: [&str; 3] = [
    "workerDeploymentName",
    "workerDeploymentBuildId",
    "namespace",
];

/// Name of the copy of template `template` for version `build_id` of worker deployment
/// `worker`: DNS-clean(`<worker>-<template>-<build>`) cut to 38 characters, then `-` and the
/// first 8 hex characters of SHA-256(worker + template + build) (at most 47, unique per triple;
/// the Go controller's `ComputeWorkerResourceTemplateName`).
pub fn copy_name(worker: &str, template: &str, build_id: &str) -> String {
    let digest = hex::encode(Sha256::digest(
        format!("{worker}{template}{build_id}").as_bytes(),
    ));
    let readable = dns_clean(&format!("{worker}-{template}-{build_id}"));
    let room = MAX_COPY_NAME_LEN - 1 - NAME_HASH_LEN;
    let prefix = readable[..readable.len().min(room)].trim_end_matches('-');
    format!("{prefix}-{}", &digest[..NAME_HASH_LEN])
}

/// What a copy needs to know of the worker deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerFacts<'a> {
    /// Kubernetes namespace (of the worker deployment and the template).
    pub namespace: &'a str,
    /// The worker deployment's name.
    pub name: &'a str,
    /// Temporal namespace its workers poll.
    pub temporal_namespace: &'a str,
}

/// What a copy needs to know of one version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionFacts<'a> {
    /// The build ID.
    pub build_id: &'a str,
    /// Name of the version's Deployment.
    pub deployment_name: &'a str,
    /// The labels that select the version's pods (the Deployment's `spec.selector.matchLabels`).
    pub selector: &'a BTreeMap<String, String>,
}

/// The WorkerResourceTemplate that owns the copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its UID.
    pub uid: &'a str,
}

/// One version's copy, ready to apply.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    /// `metadata.name`.
    pub name: String,
    /// `apiVersion`.
    pub api_version: String,
    /// `kind`.
    pub kind: String,
    /// The whole object.
    pub object: Value,
    /// [`RENDERED_HASH_LEN`] hex characters of SHA-256 of the object's JSON.
    pub hash: String,
}

/// A template that cannot be rendered (the CRD and the webhook refuse these; a template
/// admitted before either existed may still be one).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// A required field is missing or of the wrong type.
    #[error("spec.template.{field} must be {expected}")]
    Field {
        /// The field, under `spec.template`.
        field: &'static str,
        /// What it must be.
        expected: &'static str,
    },
}

/// The copy of `template` for `version` of `worker`, owned by `owner`: the template with
/// `{}` sentinels filled inside its `spec` ([`inject`]), named by [`copy_name`], in the
/// worker's namespace, labelled with the template's labels and the version's selector labels,
/// and with `owner` as its only (controller) owner so deleting the template deletes its copies.
pub fn render(
    template: &Map<String, Value>,
    owner: Owner<'_>,
    worker: WorkerFacts<'_>,
    version: VersionFacts<'_>,
) -> Result<Rendered, RenderError> {
    let text = |field: &'static str| {
        template
            .get(field)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .ok_or(RenderError::Field {
                field,
                expected: "a non-empty string",
            })
    };
    let (api_version, kind) = (text("apiVersion")?, text("kind")?);
    let mut object = template.clone();
    object.remove("status");
    match object.get_mut("spec") {
        Some(Value::Object(spec)) => inject(spec, worker, version),
        _ => {
            return Err(RenderError::Field {
                field: "spec",
                expected: "an object",
            });
        }
    }
    let name = copy_name(worker.name, owner.name, version.build_id);
    let mut metadata = match object.remove("metadata") {
        Some(Value::Object(metadata)) => metadata,
        _ => Map::new(),
    };
    let mut labels: Map<String, Value> = match metadata.remove("labels") {
        Some(Value::Object(labels)) => labels,
        _ => Map::new(),
    };
    for (key, value) in version.selector {
        labels.insert(key.clone(), Value::String(value.clone()));
    }
    metadata.insert("name".into(), Value::String(name.clone()));
    metadata.insert("namespace".into(), Value::String(worker.namespace.into()));
    metadata.insert("labels".into(), Value::Object(labels));
    metadata.insert(
        "ownerReferences".into(),
        json!([{
            "apiVersion": format!("{}/{}", crate::GROUP, crate::VERSION),
            "kind": "WorkerResourceTemplate",
            "name": owner.name,
            "uid": owner.uid,
            "controller": true,
            "blockOwnerDeletion": true,
        }]),
    );
    object.insert("metadata".into(), Value::Object(metadata));
    let object = Value::Object(object);
    let hash = rendered_hash(&object);
    Ok(Rendered {
        name,
        api_version,
        kind,
        object,
        hash,
    })
}

/// [`RENDERED_HASH_LEN`] hex characters of SHA-256 of `object`'s JSON (keys sorted, so equal
/// objects hash equal on every replica).
pub fn rendered_hash(object: &Value) -> String {
    let bytes = serde_json::to_vec(&sorted(object)).unwrap_or_default();
    hex::encode(Sha256::digest(&bytes))[..RENDERED_HASH_LEN].to_owned()
}

/// `value` with every object's keys in order.
fn sorted(value: &Value) -> Value {
    match value {
        Value::Object(fields) => {
            let ordered: BTreeMap<&String, Value> =
                fields.iter().map(|(k, v)| (k, sorted(v))).collect();
            Value::Object(ordered.into_iter().map(|(k, v)| (k.clone(), v)).collect())
        }
        Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

/// Fills the version into a template's `spec`:
/// - `selector.matchLabels` that is exactly `{}` → the version's selector labels;
/// - every `metrics[*].external.metric.selector.matchLabels` that is present → the three
///   [`METRIC_LABELS`] merged in (the template's own keys kept);
/// - every `triggers[*]` of `type: temporal` → its [`KEDA_TRIGGER_FIELDS`] that are `""` filled
///   with `<namespace>/<name>`, the build ID and the Temporal namespace;
/// - every `scaleTargetRef` (at any depth, in arrays too) that is exactly `{}` → the version's
///   Deployment.
pub fn inject(spec: &mut Map<String, Value>, worker: WorkerFacts<'_>, version: VersionFacts<'_>) {
    if let Some(Value::Object(selector)) = spec.get_mut("selector")
        && selector
            .get("matchLabels")
            .is_some_and(|m| m.as_object().is_some_and(Map::is_empty))
    {
        selector.insert(
            "matchLabels".into(),
            Value::Object(
                version
                    .selector
                    .iter()
                    .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                    .collect(),
            ),
        );
    }
    let metric_labels = [
        (
            METRIC_DEPLOYMENT_NAME,
            format!("{}_{}", worker.namespace, worker.name),
        ),
        (METRIC_BUILD_ID, version.build_id.to_owned()),
        (
            METRIC_TEMPORAL_NAMESPACE,
            worker.temporal_namespace.to_owned(),
        ),
    ];
    for selector in metric_selectors(spec) {
        if let Some(existing) = selector.get_mut("matchLabels") {
            if !existing.is_object() {
                *existing = Value::Object(Map::new());
            }
            if let Value::Object(labels) = existing {
                for (key, value) in &metric_labels {
                    labels.insert((*key).to_owned(), Value::String(value.clone()));
                }
            }
        }
    }
    let trigger_values = [
        format!("{}/{}", worker.namespace, worker.name),
        version.build_id.to_owned(),
        worker.temporal_namespace.to_owned(),
    ];
    for metadata in temporal_trigger_metadata(spec) {
        for (field, value) in KEDA_TRIGGER_FIELDS.iter().zip(&trigger_values) {
            if let Some(slot) = metadata.get_mut(*field)
                && slot.as_str() == Some("")
            {
                *slot = Value::String(value.clone());
            }
        }
    }
    fill_scale_target_refs(spec, version.deployment_name);
}

/// The `selector` objects of `spec.metrics[*].external.metric`.
pub fn metric_selectors(spec: &mut Map<String, Value>) -> Vec<&mut Map<String, Value>> {
    let Some(Value::Array(metrics)) = spec.get_mut("metrics") else {
        return Vec::new();
    };
    metrics
        .iter_mut()
        .filter_map(|metric| {
            metric
                .pointer_mut("/external/metric/selector")
                .and_then(Value::as_object_mut)
        })
        .collect()
}

/// The `metadata` objects of `spec.triggers[*]` whose `type` is `temporal` (KEDA).
pub fn temporal_trigger_metadata(spec: &mut Map<String, Value>) -> Vec<&mut Map<String, Value>> {
    let Some(Value::Array(triggers)) = spec.get_mut("triggers") else {
        return Vec::new();
    };
    triggers
        .iter_mut()
        .filter(|t| t.get("type").and_then(Value::as_str) == Some("temporal"))
        .filter_map(|t| t.get_mut("metadata").and_then(Value::as_object_mut))
        .collect()
}

fn fill_scale_target_refs(object: &mut Map<String, Value>, deployment_name: &str) {
    for (key, value) in object.iter_mut() {
        if key == "scaleTargetRef" {
            if value.as_object().is_some_and(Map::is_empty) {
                *value = json!({ "apiVersion": "apps/v1", "kind": "Deployment", "name": deployment_name });
            }
            continue;
        }
        fill_nested(value, deployment_name);
    }
}

fn fill_nested(value: &mut Value, deployment_name: &str) {
    match value {
        Value::Object(object) => fill_scale_target_refs(object, deployment_name),
        Value::Array(items) => items
            .iter_mut()
            .for_each(|item| fill_nested(item, deployment_name)),
        _ => {}
    }
}

/// Paths (under `spec.template.spec`) of every `scaleTargetRef`, at any depth: a template with
/// one scales the version's Deployment.
pub fn scale_target_refs(spec: &Map<String, Value>) -> Vec<(String, &Value)> {
    let mut found = Vec::new();
    collect_scale_target_refs(spec, "spec", &mut found);
    found
}

fn collect_scale_target_refs<'a>(
    object: &'a Map<String, Value>,
    path: &str,
    found: &mut Vec<(String, &'a Value)>,
) {
    for (key, value) in object {
        let here = format!("{path}.{key}");
        if key == "scaleTargetRef" {
            found.push((here, value));
            continue;
        }
        collect_nested(value, &here, found);
    }
}

fn collect_nested<'a>(value: &'a Value, path: &str, found: &mut Vec<(String, &'a Value)>) {
    match value {
        Value::Object(object) => collect_scale_target_refs(object, path, found),
        Value::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                collect_nested(item, &format!("{path}[{index}]"), found);
            }
        }
        _ => {}
    }
}

/// Whether the template scales the version's Deployment (has a `scaleTargetRef` in its spec).
pub fn scales_deployment(template: &Map<String, Value>) -> bool {
    template
        .get("spec")
        .and_then(Value::as_object)
        .is_some_and(|spec| !scale_target_refs(spec).is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn selector() -> BTreeMap<String, String> {
        BTreeMap::from([
            ("temporal.io/build-id".to_owned(), "v2-abc".to_owned()),
            ("temporal.io/deployment-name".to_owned(), "hello".to_owned()),
        ])
    }

    const WORKER: WorkerFacts<'static> = WorkerFacts {
        namespace: "demo",
        name: "hello",
        temporal_namespace: "orders",
    };

    fn version(selector: &BTreeMap<String, String>) -> VersionFacts<'_> {
        VersionFacts {
            build_id: "v2-abc",
            deployment_name: "hello-v2-abc",
            selector,
        }
    }

    fn spec_after(spec: Value) -> Value {
        let labels = selector();
        let Value::Object(mut spec) = spec else {
            panic!("not an object")
        };
        inject(&mut spec, WORKER, version(&labels));
        Value::Object(spec)
    }

    #[test]
    fn copy_names_are_short_unique_per_triple_and_readable() {
        // (worker, template, build, expected)
        let cases = [
            ("hello", "hpa", "v1-abcd", "hello-hpa-v1-abcd-"),
            ("Hello.World", "pdb", "v1", "hello-world-pdb-v1-"),
            (
                &"w".repeat(30),
                "template",
                "v1",
                "wwwwwwwwwwwwwwwwwwwwwwwwwwwwww-templat-",
            ),
            (
                &"w".repeat(37),
                "t",
                "v1",
                "wwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwww-",
            ),
        ];
        for (worker, template, build, prefix) in cases {
            let name = copy_name(worker, template, build);
            let expected_prefix = prefix.trim_end_matches('-');
            assert!(
                name.starts_with(&format!("{expected_prefix}-")),
                "{name} should start with {expected_prefix}-"
            );
            assert!(name.len() <= MAX_COPY_NAME_LEN, "{name}");
            let suffix = &name[name.len() - NAME_HASH_LEN..];
            assert!(suffix.chars().all(|c| c.is_ascii_hexdigit()), "{name}");
            assert!(
                !name.contains("--"),
                "no trailing dash before the hash: {name}"
            );
        }
        let long = "w".repeat(63);
        assert_ne!(
            copy_name(&long, "t", "build-1"),
            copy_name(&long, "t", "build-2"),
            "builds differing only past the cut still differ"
        );
        // The hash is over the untruncated triple (as the Go controller's).
        let digest = hex::encode(Sha256::digest(b"hellohpav1-abcd"));
        assert_eq!(
            copy_name("hello", "hpa", "v1-abcd"),
            format!("hello-hpa-v1-abcd-{}", &digest[..8])
        );
    }

    #[test]
    fn sentinels_are_filled_and_everything_else_is_kept() {
        // (spec before, spec after)
        let cases = [
            // HPA: scaleTargetRef {} and an External metric selector merged with user keys.
            (
                json!({
                    "scaleTargetRef": {},
                    "minReplicas": 2,
                    "metrics": [
                        { "type": "External", "external": { "metric": { "name": "backlog",
                            "selector": { "matchLabels": { "task_type": "Activity" } } } } },
                        { "type": "External", "external": { "metric": { "name": "other",
                            "selector": { "matchLabels": {} } } } },
                        { "type": "External", "external": { "metric": { "name": "no-selector" } } },
                        { "type": "Resource", "resource": { "name": "cpu" } }
                    ]
                }),
                json!({
                    "scaleTargetRef": { "apiVersion": "apps/v1", "kind": "Deployment", "name": "hello-v2-abc" },
                    "minReplicas": 2,
                    "metrics": [
                        { "type": "External", "external": { "metric": { "name": "backlog",
                            "selector": { "matchLabels": { "task_type": "Activity",
                                "temporal_worker_deployment_name": "demo_hello",
                                "temporal_worker_build_id": "v2-abc",
                                "temporal_namespace": "orders" } } } } },
                        { "type": "External", "external": { "metric": { "name": "other",
                            "selector": { "matchLabels": {
                                "temporal_worker_deployment_name": "demo_hello",
                                "temporal_worker_build_id": "v2-abc",
                                "temporal_namespace": "orders" } } } } },
                        { "type": "External", "external": { "metric": { "name": "no-selector" } } },
                        { "type": "Resource", "resource": { "name": "cpu" } }
                    ]
                }),
            ),
            // PDB: selector.matchLabels {} becomes the version's pod labels.
            (
                json!({ "minAvailable": 1, "selector": { "matchLabels": {} } }),
                json!({ "minAvailable": 1, "selector": { "matchLabels": {
                    "temporal.io/build-id": "v2-abc", "temporal.io/deployment-name": "hello" } } }),
            ),
            // A selector the user wrote is left alone.
            (
                json!({ "selector": { "matchLabels": { "app": "x" } } }),
                json!({ "selector": { "matchLabels": { "app": "x" } } }),
            ),
            // KEDA: scaleTargetRef {} and empty temporal trigger fields; set fields and other
            // trigger types untouched.
            (
                json!({
                    "scaleTargetRef": {},
                    "triggers": [
                        { "type": "temporal", "metadata": { "workerDeploymentName": "",
                            "workerDeploymentBuildId": "", "namespace": "", "taskQueue": "orders" } },
                        { "type": "temporal", "metadata": { "namespace": "fixed", "taskQueue": "x" } },
                        { "type": "cpu", "metadata": { "namespace": "" } }
                    ]
                }),
                json!({
                    "scaleTargetRef": { "apiVersion": "apps/v1", "kind": "Deployment", "name": "hello-v2-abc" },
                    "triggers": [
                        { "type": "temporal", "metadata": { "workerDeploymentName": "demo/hello",
                            "workerDeploymentBuildId": "v2-abc", "namespace": "orders", "taskQueue": "orders" } },
                        { "type": "temporal", "metadata": { "namespace": "fixed", "taskQueue": "x" } },
                        { "type": "cpu", "metadata": { "namespace": "" } }
                    ]
                }),
            ),
            // scaleTargetRef at any depth, in arrays too; a filled one is kept.
            (
                json!({ "a": { "scaleTargetRef": {} }, "b": [ { "c": { "scaleTargetRef": {} } } ],
                        "scaleTargetRef": { "kind": "StatefulSet", "name": "mine" } }),
                json!({ "a": { "scaleTargetRef": { "apiVersion": "apps/v1", "kind": "Deployment", "name": "hello-v2-abc" } },
                        "b": [ { "c": { "scaleTargetRef": { "apiVersion": "apps/v1", "kind": "Deployment", "name": "hello-v2-abc" } } } ],
                        "scaleTargetRef": { "kind": "StatefulSet", "name": "mine" } }),
            ),
        ];
        for (before, after) in cases {
            assert_eq!(spec_after(before.clone()), after, "{before}");
        }
    }

    #[test]
    fn a_copy_is_named_labelled_and_owned_by_its_template() {
        let labels = selector();
        let template = json!({
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": { "labels": { "team": "orders" }, "annotations": { "note": "kept" } },
            "spec": { "minAvailable": 1, "selector": { "matchLabels": {} } },
            "status": { "ignored": true }
        });
        let Value::Object(template) = template else {
            panic!()
        };
        let owner = Owner {
            name: "pdb",
            uid: "uid-1",
        };
        let rendered =
            render(&template, owner, WORKER, version(&labels)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(rendered.name, copy_name("hello", "pdb", "v2-abc"));
        assert_eq!(
            (rendered.api_version.as_str(), rendered.kind.as_str()),
            ("policy/v1", "PodDisruptionBudget")
        );
        let object = &rendered.object;
        assert_eq!(object["metadata"]["name"], json!(rendered.name));
        assert_eq!(object["metadata"]["namespace"], json!("demo"));
        assert_eq!(
            object["metadata"]["labels"],
            json!({ "team": "orders", "temporal.io/build-id": "v2-abc", "temporal.io/deployment-name": "hello" })
        );
        assert_eq!(object["metadata"]["annotations"], json!({ "note": "kept" }));
        assert_eq!(
            object["metadata"]["ownerReferences"],
            json!([{ "apiVersion": "temporal.io/v1alpha1", "kind": "WorkerResourceTemplate",
                "name": "pdb", "uid": "uid-1", "controller": true, "blockOwnerDeletion": true }])
        );
        assert!(object.get("status").is_none());
        assert_eq!(rendered.hash.len(), RENDERED_HASH_LEN);
        assert_eq!(rendered.hash, rendered_hash(object));

        // Another version: another name and hash; the same version again: the same hash.
        let other = BTreeMap::from([("temporal.io/build-id".to_owned(), "v3".to_owned())]);
        let v3 = VersionFacts {
            build_id: "v3",
            deployment_name: "hello-v3",
            selector: &other,
        };
        let third = render(&template, owner, WORKER, v3).unwrap_or_else(|e| panic!("{e}"));
        assert_ne!(third.name, rendered.name);
        assert_ne!(third.hash, rendered.hash);
        let again =
            render(&template, owner, WORKER, version(&labels)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(again.hash, rendered.hash);
    }

    #[test]
    fn templates_without_what_a_copy_needs_are_not_rendered() {
        let labels = selector();
        let owner = Owner {
            name: "t",
            uid: "u",
        };
        let cases = [
            (
                json!({ "kind": "X", "spec": {} }),
                "spec.template.apiVersion must be a non-empty string",
            ),
            (
                json!({ "apiVersion": "v1", "spec": {} }),
                "spec.template.kind must be a non-empty string",
            ),
            (
                json!({ "apiVersion": "v1", "kind": "X" }),
                "spec.template.spec must be an object",
            ),
            (
                json!({ "apiVersion": "v1", "kind": "X", "spec": [] }),
                "spec.template.spec must be an object",
            ),
        ];
        for (template, message) in cases {
            let Value::Object(template) = template else {
                panic!()
            };
            match render(&template, owner, WORKER, version(&labels)) {
                Err(e) => assert_eq!(e.to_string(), message),
                Ok(r) => panic!("rendered {:?}", r.object),
            }
        }
    }

    #[test]
    fn a_template_scales_the_deployment_when_it_has_a_scale_target_ref_anywhere() {
        let cases = [
            (json!({ "spec": { "scaleTargetRef": {} } }), true),
            (
                json!({ "spec": { "x": [ { "scaleTargetRef": {} } ] } }),
                true,
            ),
            (
                json!({ "spec": { "selector": { "matchLabels": {} } } }),
                false,
            ),
            (
                json!({ "metadata": { "scaleTargetRef": {} }, "spec": {} }),
                false,
            ),
        ];
        for (template, scales) in cases {
            let Value::Object(template) = template else {
                panic!()
            };
            assert_eq!(scales_deployment(&template), scales, "{template:?}");
        }
    }
}
