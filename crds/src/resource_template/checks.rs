//! The admission rules of a WorkerResourceTemplate that need only the objects (reference §5.2):
//! what a template may contain, which kinds are allowed, what an update may not change, and
//! the conflict with a worker deployment's own `spec.autoscaling`. Each refusal names the
//! field and says what to do. The webhook adds the rules that ask the API server (discovery,
//! SubjectAccessReview).

use serde_json::{Map, Value};

use super::WorkerResourceTemplateSpec;
use super::render::{KEDA_TRIGGER_FIELDS, METRIC_LABELS, scale_target_refs};

/// The warning given to a template that uses the deprecated reference.
pub const DEPRECATED_REF_WARNING: &str =
    "spec.temporalWorkerDeploymentRef is deprecated; use spec.workerDeploymentRef instead";

/// Everything wrong with `template` on its own, one message per problem (empty: admissible).
pub fn template_problems(template: &Map<String, Value>) -> Vec<String> {
    let mut problems = Vec::new();
    for field in ["apiVersion", "kind"] {
        if template
            .get(field)
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            problems.push(format!(
                "spec.template.{field} is required: the kind of resource to copy per version"
            ));
        }
    }
    if let Some(Value::Object(metadata)) = template.get("metadata") {
        for (field, why) in [
            (
                "name",
                "each copy is named after its worker deployment, template and build ID",
            ),
            (
                "generateName",
                "each copy is named after its worker deployment, template and build ID",
            ),
            (
                "namespace",
                "copies are made in the WorkerResourceTemplate's namespace",
            ),
        ] {
            if metadata.contains_key(field) {
                problems.push(format!(
                    "spec.template.metadata.{field} must not be set: {why}"
                ));
            }
        }
    }
    let Some(spec) = template.get("spec") else {
        problems.push("spec.template.spec is required".to_owned());
        return problems;
    };
    let Value::Object(spec) = spec else {
        problems.push("spec.template.spec must be an object".to_owned());
        return problems;
    };
    for (path, value) in scale_target_refs(spec) {
        if !is_empty_object(value) {
            problems.push(format!(
                "spec.template.{path} must be {{}}: twc points each copy at its version's Deployment"
            ));
        }
    }
    if let Some(labels) = spec.get("selector").and_then(|s| s.get("matchLabels"))
        && !(labels.is_null() || is_empty_object(labels))
    {
        problems.push(
            "spec.template.spec.selector.matchLabels must be {} or absent: twc fills in the labels of each version's pods"
                .to_owned(),
        );
    }
    if spec.get("minReplicas").and_then(Value::as_i64) == Some(0) {
        problems.push(
            "spec.template.spec.minReplicas must not be 0: a version scaled to zero has no worker polling its task queues"
                .to_owned(),
        );
    }
    if let Some(Value::Array(metrics)) = spec.get("metrics") {
        for (index, metric) in metrics.iter().enumerate() {
            let labels = metric
                .pointer("/external/metric/selector/matchLabels")
                .and_then(Value::as_object);
            for key in labels.into_iter().flat_map(|l| l.keys()) {
                if METRIC_LABELS.contains(&key.as_str()) {
                    problems.push(format!(
                        "spec.template.spec.metrics[{index}].external.metric.selector.matchLabels.{key} must not be set: twc sets it for each version"
                    ));
                }
            }
        }
    }
    if let Some(Value::Array(triggers)) = spec.get("triggers") {
        for (index, trigger) in triggers.iter().enumerate() {
            if trigger.get("type").and_then(Value::as_str) != Some("temporal") {
                continue;
            }
            for field in KEDA_TRIGGER_FIELDS {
                let value = trigger.get("metadata").and_then(|m| m.get(field));
                if value.is_some_and(|v| v.as_str() != Some("")) {
                    problems.push(format!(
                        "spec.template.spec.triggers[{index}].metadata.{field} must be \"\" or absent: twc fills it for each version"
                    ));
                }
            }
        }
    }
    problems
}

/// Whether `kind` is one of `allowed` (compared case-insensitively); the refusal says which
/// kinds are.
pub fn kind_allowed(kind: &str, allowed: &[String]) -> Result<(), String> {
    if allowed.iter().any(|a| a.eq_ignore_ascii_case(kind)) {
        return Ok(());
    }
    if allowed.is_empty() {
        return Err(format!(
            "spec.template.kind {kind} is not allowed: no kind is (the controller's --wrt-allowed-kinds is empty, so every WorkerResourceTemplate is refused)"
        ));
    }
    Err(format!(
        "spec.template.kind {kind} is not allowed; allowed kinds: {} (the controller's --wrt-allowed-kinds, Helm value workerResourceTemplate.allowedResources)",
        allowed.join(", ")
    ))
}

/// What an update from `old` to `new` may not change: the referenced worker deployment.
pub fn update_problems(
    old: &WorkerResourceTemplateSpec,
    new: &WorkerResourceTemplateSpec,
) -> Vec<String> {
    match (old.worker_name(), new.worker_name()) {
        (Some(was), Some(now)) if was != now => vec![format!(
            "spec.workerDeploymentRef.name cannot change (was {was}, now {now}): create another WorkerResourceTemplate for the other worker deployment"
        )],
        _ => Vec::new(),
    }
}

/// Warnings to give the author of `spec` (admitted anyway).
pub fn warnings(spec: &WorkerResourceTemplateSpec) -> Vec<String> {
    spec.temporal_worker_deployment_ref
        .as_ref()
        .map(|_| DEPRECATED_REF_WARNING.to_owned())
        .into_iter()
        .collect()
}

/// What the worker deployment a template references says about scaling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerScaling<'a> {
    /// `<Kind> <name>` of the worker deployment (the claim holder of its name).
    pub worker: &'a str,
    /// It has `spec.autoscaling`.
    pub autoscaling: bool,
    /// It has `spec.replicas`.
    pub replicas: bool,
}

/// A template that scales the Deployment on a worker deployment with `spec.autoscaling` would
/// fight twc's own autoscaler: the refusal, naming both fields.
pub fn autoscaling_conflict(
    template: &Map<String, Value>,
    worker: &WorkerScaling<'_>,
) -> Option<String> {
    (worker.autoscaling && super::render::scales_deployment(template)).then(|| {
        format!(
            "spec.template.spec.scaleTargetRef: {} has spec.autoscaling, which scales each version's Deployment itself, and a scaler copied per version would fight it; remove spec.autoscaling from {} (and leave spec.replicas unset) or render a template without scaleTargetRef",
            worker.worker, worker.worker
        )
    })
}

/// A warning for a scaler template on a worker deployment with `spec.replicas`, which twc
/// keeps applying to its versions' Deployments.
pub fn replicas_warning(
    template: &Map<String, Value>,
    worker: &WorkerScaling<'_>,
) -> Option<String> {
    (worker.replicas && super::render::scales_deployment(template)).then(|| {
        format!(
            "{} sets spec.replicas, which twc keeps applying to its versions' Deployments; leave it unset so the scaler this template renders decides",
            worker.worker
        )
    })
}

fn is_empty_object(value: &Value) -> bool {
    value.as_object().is_some_and(Map::is_empty)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn object(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            other => panic!("not an object: {other}"),
        }
    }

    fn hpa(spec: Value) -> Map<String, Value> {
        object(
            json!({ "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "spec": spec }),
        )
    }

    #[test]
    fn templates_are_refused_with_the_field_that_is_wrong() {
        // (template, expected problems; empty: admitted)
        let cases: Vec<(Map<String, Value>, Vec<&str>)> = vec![
            (
                hpa(json!({ "scaleTargetRef": {}, "minReplicas": 1, "maxReplicas": 3 })),
                vec![],
            ),
            (
                object(
                    json!({ "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                    "spec": { "selector": { "matchLabels": {} }, "minAvailable": 1 } }),
                ),
                vec![],
            ),
            (
                object(
                    json!({ "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                    "spec": { "selector": { "matchLabels": null } } }),
                ),
                vec![],
            ),
            (
                object(json!({ "kind": "HorizontalPodAutoscaler", "spec": {} })),
                vec![
                    "spec.template.apiVersion is required: the kind of resource to copy per version",
                ],
            ),
            (
                object(json!({ "apiVersion": "v1", "kind": "X" })),
                vec!["spec.template.spec is required"],
            ),
            (
                object(
                    json!({ "apiVersion": "v1", "kind": "X", "metadata": { "name": "a", "namespace": "b" }, "spec": {} }),
                ),
                vec![
                    "spec.template.metadata.name must not be set: each copy is named after its worker deployment, template and build ID",
                    "spec.template.metadata.namespace must not be set: copies are made in the WorkerResourceTemplate's namespace",
                ],
            ),
            (
                hpa(json!({ "scaleTargetRef": { "kind": "Deployment", "name": "mine" } })),
                vec![
                    "spec.template.spec.scaleTargetRef must be {}: twc points each copy at its version's Deployment",
                ],
            ),
            (
                hpa(json!({ "nested": [ { "scaleTargetRef": { "name": "x" } } ] })),
                vec![
                    "spec.template.spec.nested[0].scaleTargetRef must be {}: twc points each copy at its version's Deployment",
                ],
            ),
            (
                object(
                    json!({ "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                    "spec": { "selector": { "matchLabels": { "app": "x" } } } }),
                ),
                vec![
                    "spec.template.spec.selector.matchLabels must be {} or absent: twc fills in the labels of each version's pods",
                ],
            ),
            (
                hpa(json!({ "scaleTargetRef": {}, "minReplicas": 0 })),
                vec![
                    "spec.template.spec.minReplicas must not be 0: a version scaled to zero has no worker polling its task queues",
                ],
            ),
            (
                hpa(json!({ "scaleTargetRef": {}, "metrics": [
                    { "type": "External", "external": { "metric": { "name": "m",
                        "selector": { "matchLabels": { "task_type": "Workflow", "temporal_worker_build_id": "v1" } } } } }
                ] })),
                vec![
                    "spec.template.spec.metrics[0].external.metric.selector.matchLabels.temporal_worker_build_id must not be set: twc sets it for each version",
                ],
            ),
            (
                object(
                    json!({ "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "spec": {
                    "scaleTargetRef": {},
                    "triggers": [
                        { "type": "temporal", "metadata": { "workerDeploymentName": "", "namespace": "prod", "taskQueue": "q" } },
                        { "type": "cron", "metadata": { "namespace": "anything" } }
                    ] } }),
                ),
                vec![
                    "spec.template.spec.triggers[0].metadata.namespace must be \"\" or absent: twc fills it for each version",
                ],
            ),
        ];
        for (template, expected) in cases {
            assert_eq!(template_problems(&template), expected, "{template:?}");
        }
    }

    #[test]
    fn only_allowed_kinds_are_admitted_in_any_case() {
        let allowed = vec![
            "HorizontalPodAutoscaler".to_owned(),
            "PodDisruptionBudget".to_owned(),
        ];
        let cases = [
            ("HorizontalPodAutoscaler", &allowed, None),
            ("horizontalpodautoscaler", &allowed, None),
            (
                "ScaledObject",
                &allowed,
                Some(
                    "spec.template.kind ScaledObject is not allowed; allowed kinds: HorizontalPodAutoscaler, PodDisruptionBudget (the controller's --wrt-allowed-kinds, Helm value workerResourceTemplate.allowedResources)",
                ),
            ),
            (
                "HorizontalPodAutoscaler",
                &Vec::new(),
                Some(
                    "spec.template.kind HorizontalPodAutoscaler is not allowed: no kind is (the controller's --wrt-allowed-kinds is empty, so every WorkerResourceTemplate is refused)",
                ),
            ),
        ];
        for (kind, allowed, refusal) in cases {
            assert_eq!(
                kind_allowed(kind, allowed).err().as_deref(),
                refusal,
                "{kind}"
            );
        }
    }

    #[test]
    fn the_reference_cannot_change_but_may_move_to_the_new_field() {
        let spec = |json: Value| -> WorkerResourceTemplateSpec {
            serde_json::from_value(json).unwrap_or_else(|e| panic!("{e}"))
        };
        let template = json!({ "apiVersion": "v1", "kind": "X", "spec": {} });
        let old =
            spec(json!({ "temporalWorkerDeploymentRef": { "name": "a" }, "template": template }));
        let same = spec(json!({ "workerDeploymentRef": { "name": "a" }, "template": template }));
        let other = spec(json!({ "workerDeploymentRef": { "name": "b" }, "template": template }));
        assert!(update_problems(&old, &same).is_empty());
        assert_eq!(
            update_problems(&same, &other),
            [
                "spec.workerDeploymentRef.name cannot change (was a, now b): create another WorkerResourceTemplate for the other worker deployment"
            ]
        );
        assert_eq!(warnings(&old), [DEPRECATED_REF_WARNING]);
        assert!(warnings(&same).is_empty());
    }

    #[test]
    fn a_scaler_on_a_worker_with_autoscaling_is_refused_and_one_with_replicas_warned() {
        let scaler = hpa(json!({ "scaleTargetRef": {} }));
        let pdb = object(
            json!({ "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "spec": { "selector": { "matchLabels": {} } } }),
        );
        let worker = |autoscaling, replicas| WorkerScaling {
            worker: "WorkerDeployment hello",
            autoscaling,
            replicas,
        };
        assert!(
            autoscaling_conflict(&scaler, &worker(true, false)).is_some_and(|m| m.starts_with(
                "spec.template.spec.scaleTargetRef: WorkerDeployment hello has spec.autoscaling"
            ))
        );
        assert_eq!(autoscaling_conflict(&pdb, &worker(true, false)), None);
        assert_eq!(autoscaling_conflict(&scaler, &worker(false, true)), None);
        assert!(replicas_warning(&scaler, &worker(false, true)).is_some());
        assert_eq!(replicas_warning(&pdb, &worker(false, true)), None);
    }
}
