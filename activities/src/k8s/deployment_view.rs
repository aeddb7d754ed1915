//! What the engine needs to know about a versioned Deployment ([`DeploymentView`]), read off the
//! Deployment object.

use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition};
use kube::ResourceExt;
use twc_crds::labels;
use twc_workflows::model::DeploymentView;

/// Whether the Deployment is controlled by the object with `owner_uid`.
pub fn is_controlled_by(deployment: &Deployment, owner_uid: &str) -> bool {
    deployment
        .owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && o.uid == owner_uid)
}

/// The engine's view of a Deployment; `None` when it has no build-ID label (not a version).
pub fn deployment_view(deployment: &Deployment) -> Option<DeploymentView> {
    let build_id = deployment.labels().get(labels::BUILD_ID)?.clone();
    let status = deployment.status.clone().unwrap_or_default();
    let conditions = status.conditions.unwrap_or_default();
    let condition = |type_: &str| conditions.iter().find(|c| c.type_ == type_);
    let available_condition = condition("Available").filter(|c| c.status == "True");
    let current =
        status.observed_generation.unwrap_or(0) >= deployment.metadata.generation.unwrap_or(0);
    let failing = |c: &&DeploymentCondition| c.status == "False";
    let problem = condition("Progressing")
        .filter(failing)
        .or_else(|| condition("Available").filter(failing))
        .and_then(|c| c.message.clone())
        .filter(|m| !m.is_empty());
    Some(DeploymentView {
        name: deployment.name_any(),
        build_id,
        replicas: deployment.spec.as_ref().and_then(|s| s.replicas),
        status_replicas: status.replicas.unwrap_or(0),
        ready_replicas: status.ready_replicas.unwrap_or(0),
        available: available_condition.is_some() && current,
        available_since: available_condition
            .and_then(|c| c.last_transition_time.as_ref())
            .map(|t| t.0.as_millisecond()),
        problem,
        deleting: deployment.metadata.deletion_timestamp.is_some(),
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::apps::v1::{DeploymentSpec, DeploymentStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
    use k8s_openapi::jiff::Timestamp;

    use super::*;

    fn condition(type_: &str, status: &str, message: &str, at_ms: i64) -> DeploymentCondition {
        DeploymentCondition {
            type_: type_.into(),
            status: status.into(),
            message: Some(message.into()),
            last_transition_time: Timestamp::from_millisecond(at_ms).ok().map(Time),
            ..Default::default()
        }
    }

    fn deployment(
        generation: i64,
        observed: i64,
        conditions: Vec<DeploymentCondition>,
    ) -> Deployment {
        Deployment {
            metadata: ObjectMeta {
                name: Some("worker-v1".into()),
                generation: Some(generation),
                labels: Some(BTreeMap::from([(
                    labels::BUILD_ID.to_owned(),
                    "v1".to_owned(),
                )])),
                owner_references: Some(vec![OwnerReference {
                    uid: "uid-1".into(),
                    controller: Some(true),
                    ..Default::default()
                }]),
                ..Default::default()
            },
            spec: Some(DeploymentSpec {
                replicas: Some(2),
                ..Default::default()
            }),
            status: Some(DeploymentStatus {
                observed_generation: Some(observed),
                replicas: Some(2),
                ready_replicas: Some(1),
                conditions: Some(conditions),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn available_needs_the_condition_and_a_current_observation() {
        let ok = deployment(
            2,
            2,
            vec![condition("Available", "True", "ok", 1_700_000_000_000)],
        );
        let view = deployment_view(&ok).expect("version");
        assert!(view.available);
        assert_eq!(view.available_since, Some(1_700_000_000_000));
        assert_eq!(
            (view.replicas, view.status_replicas, view.ready_replicas),
            (Some(2), 2, 1)
        );
        assert_eq!(view.problem, None);

        let stale = deployment(3, 2, vec![condition("Available", "True", "ok", 1)]);
        assert!(!deployment_view(&stale).expect("version").available);
    }

    #[test]
    fn a_failing_progressing_condition_is_the_problem() {
        let d = deployment(
            1,
            1,
            vec![
                condition(
                    "Available",
                    "False",
                    "Deployment does not have minimum availability.",
                    1,
                ),
                condition(
                    "Progressing",
                    "False",
                    "ReplicaSet \"x\" has timed out progressing.",
                    2,
                ),
            ],
        );
        let view = deployment_view(&d).expect("version");
        assert!(!view.available);
        assert_eq!(view.available_since, None);
        assert_eq!(
            view.problem.as_deref(),
            Some("ReplicaSet \"x\" has timed out progressing.")
        );

        let unavailable = deployment(1, 1, vec![condition("Available", "False", "not yet", 1)]);
        assert_eq!(
            deployment_view(&unavailable)
                .expect("version")
                .problem
                .as_deref(),
            Some("not yet")
        );
    }

    #[test]
    fn deletion_and_ownership_are_reported() {
        let mut d = deployment(1, 1, vec![]);
        assert!(is_controlled_by(&d, "uid-1"));
        assert!(!is_controlled_by(&d, "uid-2"));
        d.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        assert!(deployment_view(&d).expect("version").deleting);
    }

    #[test]
    fn deployments_without_a_build_id_label_are_not_versions() {
        let mut d = deployment(1, 1, vec![]);
        d.metadata.labels = None;
        assert!(deployment_view(&d).is_none());
    }
}
