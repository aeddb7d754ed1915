//! `WorkerResourceTemplate` (`wrt`): one copy of a namespaced resource (an HPA, a
//! PodDisruptionBudget, a KEDA `ScaledObject`, ...) per version of a worker deployment, as the
//! Go controller's resource of that name (reference §1.3, §3.17).
//!
//! The template is free-form: the API server keeps whatever object it is given, the controller
//! fills in what depends on the version ([`render`]) and a validating webhook decides which
//! kinds a template may render and whether its author may create them.

pub mod checks;
pub mod render;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A DNS label: what a worker deployment's name must be to be referenced.
pub const DNS_LABEL_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

/// The name of the worker deployment a spec references, whichever field names it (the empty
/// string when neither does, which the CRD refuses). CEL over `self` (a spec).
const EFFECTIVE_REF: &str = "(has(self.workerDeploymentRef) ? self.workerDeploymentRef.name : (has(self.temporalWorkerDeploymentRef) ? self.temporalWorkerDeploymentRef.name : ''))";

/// Renders one copy of `spec.template` per version of a worker deployment.
// Several printer columns repeat `type_ = ...`; the lint mistakes them for duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "temporal.io",
    version = "v1alpha1",
    kind = "WorkerResourceTemplate",
    plural = "workerresourcetemplates",
    singular = "workerresourcetemplate",
    shortname = "wrt",
    namespaced,
    status = "WorkerResourceTemplateStatus",
    derive = "PartialEq",
    doc = "One copy of a namespaced resource (HPA, PodDisruptionBudget, KEDA ScaledObject, ...) per version of a worker deployment.",
    printcolumn(
        name = "Worker",
        type_ = "string",
        json_path = ".spec.workerDeploymentRef.name"
    ),
    printcolumn(name = "Kind", type_ = "string", json_path = ".spec.template.kind"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.workerDeploymentRef) != has(self.temporalWorkerDeploymentRef)")
        .message("exactly one of spec.workerDeploymentRef and spec.temporalWorkerDeploymentRef (deprecated) must be set"),
    validation = Rule::new(format!("{EFFECTIVE_REF} == {}", EFFECTIVE_REF.replace("self.", "oldSelf.")))
        .message("spec.workerDeploymentRef.name cannot change: create another WorkerResourceTemplate for the other worker deployment"),
)]
pub struct WorkerResourceTemplateSpec {
    /// The worker deployment (a `WorkerDeployment` or `TemporalWorkerDeployment` of this name
    /// in the same namespace) whose versions each get a copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_deployment_ref: Option<WorkerDeploymentReference>,
    /// Deprecated name of `workerDeploymentRef` (the Go controller's older field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temporal_worker_deployment_ref: Option<WorkerDeploymentReference>,
    /// The resource to copy per version: `apiVersion`, `kind` and `spec` of any allowed
    /// namespaced kind, without `metadata.name` or `metadata.namespace`. Write `{}` where the
    /// version goes: `scaleTargetRef: {}` (anywhere) becomes the version's Deployment,
    /// `spec.selector.matchLabels: {}` its pods' labels; each
    /// `spec.metrics[*].external.metric.selector.matchLabels` gets the version's metric labels,
    /// and a KEDA `temporal` trigger's empty `workerDeploymentName`, `workerDeploymentBuildId`
    /// and `namespace` are filled.
    #[schemars(schema_with = "template_schema")]
    pub template: Map<String, Value>,
}

/// A worker deployment in the template's namespace.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct WorkerDeploymentReference {
    /// Its name.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
}

impl WorkerResourceTemplateSpec {
    /// The referenced worker deployment's name, whichever field names it.
    pub fn worker_name(&self) -> Option<&str> {
        self.worker_deployment_ref
            .as_ref()
            .or(self.temporal_worker_deployment_ref.as_ref())
            .map(|r| r.name.as_str())
    }

    /// The template's `kind`.
    pub fn template_kind(&self) -> Option<&str> {
        self.template.get("kind").and_then(Value::as_str)
    }

    /// The template's `apiVersion`.
    pub fn template_api_version(&self) -> Option<&str> {
        self.template.get("apiVersion").and_then(Value::as_str)
    }
}

/// Schema of `spec.template`: any object the API server keeps as given, with the fields every
/// copy needs (`apiVersion`, `kind`, `spec`) required and the ones the controller sets
/// (`metadata.name`, `metadata.namespace`) refused.
fn template_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "The resource to copy per version: apiVersion, kind and spec of an allowed namespaced kind.",
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
        "required": ["apiVersion", "kind", "spec"],
        "properties": {
            "apiVersion": { "type": "string", "minLength": 1 },
            "kind": { "type": "string", "minLength": 1 },
            "metadata": {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": true,
                "properties": {
                    "name": { "type": "string" },
                    "generateName": { "type": "string" },
                    "namespace": { "type": "string" },
                    "labels": { "type": "object", "additionalProperties": { "type": "string" } },
                    "annotations": { "type": "object", "additionalProperties": { "type": "string" } }
                },
                "x-kubernetes-validations": [
                    {
                        "rule": "!has(self.name) && !has(self.generateName)",
                        "message": "spec.template.metadata.name must not be set: each copy is named after its worker deployment, template and build ID"
                    },
                    {
                        "rule": "!has(self.namespace)",
                        "message": "spec.template.metadata.namespace must not be set: copies are made in the WorkerResourceTemplate's namespace"
                    }
                ]
            },
            "spec": { "type": "object", "x-kubernetes-preserve-unknown-fields": true }
        }
    })
}

/// Observed state, written by the controller (status subresource).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WorkerResourceTemplateStatus {
    /// One entry per version with a copy (or one being deleted), by build ID.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["buildID".to_owned()]))]
    pub versions: Vec<TemplateVersionStatus>,
    /// `Ready`: True once every version's copy is applied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".to_owned()]))]
    pub conditions: Vec<Condition>,
    /// Generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The copy of one version.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TemplateVersionStatus {
    /// The version's build ID.
    #[serde(rename = "buildID")]
    pub build_id: String,
    /// Name of the copy.
    pub resource_name: String,
    /// Generation of the template last applied to this version; 0: never applied.
    #[serde(default)]
    pub last_applied_generation: i64,
    /// Why the last apply (or deletion) failed; empty once it succeeds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apply_error: Option<String>,
    /// Hash of the copy last applied (16 hex characters); unchanged copies are not applied again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_applied_hash: Option<String>,
    /// When this entry last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// `apiVersion` of the copy (so a copy of a kind the template no longer renders is found
    /// and deleted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// `kind` of the copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

/// Reasons of a WorkerResourceTemplate's `Ready` condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TemplateReason {
    /// True: every version's copy is applied.
    AllVersionsApplied,
    /// False: a copy could not be rendered, applied or deleted (the message is the first error).
    ApplyFailed,
    /// False: no worker deployment of the referenced name exists.
    WorkerDeploymentNotFound,
    /// False: the template scales the Deployment while the worker deployment has
    /// `spec.autoscaling`, which wins: no scaler copy is applied.
    ConflictsWithAutoscaling,
    /// False: the template's kind is not one the controller is allowed to render.
    KindNotAllowed,
}

impl TemplateReason {
    /// The reason as written in the condition.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AllVersionsApplied => "AllVersionsApplied",
            Self::ApplyFailed => "ApplyFailed",
            Self::WorkerDeploymentNotFound => "WorkerDeploymentNotFound",
            Self::ConflictsWithAutoscaling => "ConflictsWithAutoscaling",
            Self::KindNotAllowed => "KindNotAllowed",
        }
    }

    /// The `Ready` status this reason goes with.
    pub fn ready(self) -> bool {
        self == Self::AllVersionsApplied
    }
}

impl std::fmt::Display for TemplateReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use kube::CustomResourceExt;

    use super::*;

    #[test]
    fn the_crd_has_its_names_columns_and_status() {
        let crd = WorkerResourceTemplate::crd();
        assert_eq!(crd.spec.names.short_names, Some(vec!["wrt".to_owned()]));
        assert_eq!(crd.spec.scope, "Namespaced");
        let version = &crd.spec.versions[0];
        assert!(
            version
                .subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some()
        );
        let columns: Vec<_> = version
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| (c.name.as_str(), c.json_path.as_str()))
            .collect();
        assert_eq!(
            columns,
            [
                ("Worker", ".spec.workerDeploymentRef.name"),
                ("Kind", ".spec.template.kind"),
                ("Ready", ".status.conditions[?(@.type==\"Ready\")].status"),
                ("Age", ".metadata.creationTimestamp"),
            ]
        );
    }

    #[test]
    fn either_reference_names_the_worker() {
        let spec = |json: Value| -> WorkerResourceTemplateSpec {
            serde_json::from_value(json).unwrap_or_else(|e| panic!("{e}"))
        };
        let template = serde_json::json!({ "apiVersion": "v1", "kind": "X", "spec": {} });
        let cases = [
            (
                spec(
                    serde_json::json!({ "workerDeploymentRef": { "name": "a" }, "template": template }),
                ),
                Some("a"),
            ),
            (
                spec(
                    serde_json::json!({ "temporalWorkerDeploymentRef": { "name": "b" }, "template": template }),
                ),
                Some("b"),
            ),
            (spec(serde_json::json!({ "template": template })), None),
        ];
        for (spec, name) in cases {
            assert_eq!(spec.worker_name(), name, "{spec:?}");
            assert_eq!(spec.template_kind(), Some("X"));
        }
    }
}
