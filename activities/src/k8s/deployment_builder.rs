//! The one place that turns a worker deployment (either kind), its connection and a build ID into the
//! versioned Kubernetes Deployment (Go controller reference §2.4, §2.5).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use kube::ResourceExt;
use twc_crds::{BuildId, TemporalConnectionSpec, WorkerObject, build_id, labels, naming};

use twc_crds::worker_deployment::ReplicasMode;

use super::injection::{self, ServerCa, WorkerIdentity};

/// The versioned Deployment of `build_id`: deterministic name, selector labels, a controller
/// owner reference to the TWD, hash annotations, and the user's pod template with the Temporal
/// env vars (and mutual-TLS volume) injected.
pub fn build_deployment(
    twd: &WorkerObject,
    connection: &TemporalConnectionSpec,
    build_id: &BuildId,
    ca: ServerCa,
) -> Deployment {
    let namespace = twd.namespace().unwrap_or_default();
    let twd_name = twd.name_any();
    let user_template = &twd.spec.template;
    let user_meta = user_template.metadata.clone().unwrap_or_default();

    let selector = selector_labels(&twd_name, build_id);
    let mut object_labels = selector.clone();
    object_labels.insert(labels::MANAGED_BY.into(), labels::MANAGED_BY_VALUE.into());
    let mut pod_labels = user_meta.labels.clone().unwrap_or_default();
    pod_labels.extend(object_labels.clone());

    let mut pod_annotations = user_meta.annotations.clone().unwrap_or_default();
    pod_annotations.insert(
        labels::POD_TEMPLATE_HASH.into(),
        build_id::template_hash(user_template),
    );
    pod_annotations.insert(
        labels::CONNECTION_SPEC_HASH.into(),
        injection::connection_spec_hash(connection, ca),
    );
    pod_annotations.insert(
        labels::GO_CONNECTION_SPEC_HASH.into(),
        injection::go_connection_spec_hash(connection),
    );

    let identity = WorkerIdentity {
        temporal_namespace: twd.spec.worker_options.temporal_namespace.clone(),
        deployment_name: naming::temporal_deployment_name(&namespace, &twd_name),
        build_id: build_id.to_string(),
    };
    let mut pod_spec = user_template.spec.clone().unwrap_or_default();
    injection::inject(&mut pod_spec, &identity, connection, ca);

    Deployment {
        metadata: ObjectMeta {
            name: Some(naming::versioned_deployment_name(&twd_name, build_id)),
            namespace: Some(namespace),
            labels: Some(object_labels),
            annotations: user_meta.annotations.filter(|a| !a.is_empty()),
            owner_references: Some(vec![controller_reference(twd)]),
            ..Default::default()
        },
        spec: Some(DeploymentSpec {
            // A shared total is split once the version is routed; until then one pod registers it.
            replicas: match twd.spec.replicas_mode {
                ReplicasMode::Shared if twd.spec.replicas.is_some() => Some(1),
                _ => twd.spec.replicas,
            },
            min_ready_seconds: Some(twd.spec.min_ready_seconds),
            progress_deadline_seconds: Some(twd.spec.progress_deadline_seconds),
            selector: LabelSelector {
                match_labels: Some(selector),
                match_expressions: None,
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: Some(pod_annotations),
                    ..Default::default()
                }),
                spec: Some(pod_spec),
            },
            ..Default::default()
        }),
        status: None,
    }
}

/// The two labels that select a version's pods: TWD name and build ID.
pub fn selector_labels(twd_name: &str, build_id: &BuildId) -> BTreeMap<String, String> {
    let build = build_id.as_str();
    BTreeMap::from([
        (
            labels::DEPLOYMENT_NAME.to_owned(),
            naming::deployment_name_label(twd_name),
        ),
        (
            labels::BUILD_ID.to_owned(),
            build[..build.len().min(63)].to_owned(),
        ),
    ])
}

/// The controller owner reference a versioned Deployment carries to its TWD.
pub fn controller_reference(twd: &WorkerObject) -> OwnerReference {
    OwnerReference {
        api_version: format!("{}/{}", twc_crds::GROUP, twc_crds::VERSION),
        kind: twd.kind.as_str().to_owned(),
        name: twd.name_any(),
        uid: twd.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{EnvVar, SecretKeySelector};
    use twc_crds::connection::SecretReference;
    use twc_crds::worker_deployment::test_support::spec_with_image;

    use super::*;

    fn twd() -> WorkerObject {
        let mut spec = spec_with_image("worker:v1");
        spec.replicas = Some(3);
        spec.min_ready_seconds = 5;
        spec.progress_deadline_seconds = 120;
        spec.template.metadata = Some(ObjectMeta {
            labels: Some(BTreeMap::from([
                ("team".to_owned(), "payments".to_owned()),
                (labels::BUILD_ID.to_owned(), "user-value".to_owned()),
            ])),
            annotations: Some(BTreeMap::from([("note".to_owned(), "hi".to_owned())])),
            ..Default::default()
        });
        if let Some(pod) = spec.template.spec.as_mut() {
            pod.containers[0].env = Some(vec![EnvVar {
                name: "TEMPORAL_ADDRESS".into(),
                value: Some("user:1".into()),
                value_from: None,
            }]);
        }
        let mut twd = twc_crds::TemporalWorkerDeployment::new("worker", spec);
        twd.metadata.namespace = Some("demo".into());
        twd.metadata.uid = Some("uid-1".into());
        twd.into()
    }

    fn connection() -> TemporalConnectionSpec {
        TemporalConnectionSpec {
            host_port: "temporal:7233".into(),
            tls: None,
            mutual_tls_secret_ref: None,
            api_key_secret_ref: None,
            worker_credentials: None,
        }
    }

    fn build() -> BuildId {
        BuildId::new("v1-0123456789")
    }

    #[test]
    fn name_namespace_and_owner_point_at_the_twd_of_its_kind() {
        let mut wd = twd();
        wd.kind = twc_crds::WorkerKind::WorkerDeployment;
        let d = build_deployment(&wd, &connection(), &build(), ServerCa::SystemRoots);
        let owners = d.metadata.owner_references.expect("owner");
        assert_eq!(owners[0].kind, "WorkerDeployment");
        let d = build_deployment(&twd(), &connection(), &build(), ServerCa::SystemRoots);
        assert_eq!(d.metadata.name.as_deref(), Some("worker-v1-0123456789"));
        assert_eq!(d.metadata.namespace.as_deref(), Some("demo"));
        let owners = d.metadata.owner_references.expect("owner");
        assert_eq!(owners.len(), 1);
        let owner = &owners[0];
        assert_eq!(
            (
                owner.api_version.as_str(),
                owner.kind.as_str(),
                owner.name.as_str(),
                owner.uid.as_str()
            ),
            (
                "temporal.io/v1alpha1",
                "TemporalWorkerDeployment",
                "worker",
                "uid-1"
            )
        );
        assert_eq!(
            (owner.controller, owner.block_owner_deletion),
            (Some(true), Some(true))
        );
    }

    #[test]
    fn labels_select_by_twd_and_build_and_win_over_user_labels() {
        let d = build_deployment(&twd(), &connection(), &build(), ServerCa::SystemRoots);
        let object_labels = d.metadata.labels.expect("labels");
        assert_eq!(object_labels[labels::DEPLOYMENT_NAME], "worker");
        assert_eq!(object_labels[labels::BUILD_ID], "v1-0123456789");
        assert_eq!(object_labels[labels::MANAGED_BY], "twc");
        assert!(
            !object_labels.contains_key("team"),
            "TWD labels are not copied to the Deployment"
        );
        let spec = d.spec.expect("spec");
        let selector = spec.selector.match_labels.expect("selector");
        assert_eq!(selector.len(), 2);
        assert_eq!(selector[labels::BUILD_ID], "v1-0123456789");
        let pod_labels = spec
            .template
            .metadata
            .and_then(|m| m.labels)
            .expect("pod labels");
        assert_eq!(pod_labels["team"], "payments");
        assert_eq!(pod_labels[labels::BUILD_ID], "v1-0123456789");
        assert_eq!(pod_labels[labels::MANAGED_BY], "twc");
    }

    #[test]
    fn replicas_and_timing_are_copied() {
        let spec = build_deployment(&twd(), &connection(), &build(), ServerCa::SystemRoots)
            .spec
            .expect("spec");
        assert_eq!(spec.replicas, Some(3));
        assert_eq!(spec.min_ready_seconds, Some(5));
        assert_eq!(spec.progress_deadline_seconds, Some(120));
        let mut unset = twd();
        unset.spec.replicas = None;
        let spec = build_deployment(&unset, &connection(), &build(), ServerCa::SystemRoots)
            .spec
            .expect("spec");
        assert_eq!(spec.replicas, None);
        let mut shared = twd();
        shared.spec.replicas = Some(6);
        shared.spec.replicas_mode = ReplicasMode::Shared;
        let spec = build_deployment(&shared, &connection(), &build(), ServerCa::SystemRoots)
            .spec
            .expect("spec");
        assert_eq!(
            spec.replicas,
            Some(1),
            "a shared total is split after routing"
        );
    }

    #[test]
    fn annotations_carry_user_annotations_and_stable_hashes() {
        let a = build_deployment(&twd(), &connection(), &build(), ServerCa::SystemRoots);
        let b = build_deployment(&twd(), &connection(), &build(), ServerCa::SystemRoots);
        assert_eq!(a, b);
        assert_eq!(
            a.metadata.annotations.as_ref().map(|m| m["note"].as_str()),
            Some("hi")
        );
        let pod_annotations = a
            .spec
            .and_then(|s| s.template.metadata)
            .and_then(|m| m.annotations)
            .expect("pod annotations");
        assert_eq!(pod_annotations["note"], "hi");
        assert_eq!(
            pod_annotations[labels::POD_TEMPLATE_HASH],
            build_id::template_hash(&twd().spec.template)
        );
        assert_eq!(
            pod_annotations[labels::CONNECTION_SPEC_HASH],
            injection::connection_spec_hash(&connection(), ServerCa::SystemRoots)
        );
    }

    #[test]
    fn user_env_is_replaced_and_identity_injected() {
        let spec = build_deployment(&twd(), &connection(), &build(), ServerCa::SystemRoots)
            .spec
            .expect("spec");
        let env = spec.template.spec.expect("pod").containers[0]
            .env
            .clone()
            .expect("env");
        let find = |name: &str| {
            env.iter()
                .filter(|v| v.name == name)
                .map(|v| v.value.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(find("TEMPORAL_ADDRESS"), [Some("temporal:7233".to_owned())]);
        assert_eq!(
            find("TEMPORAL_DEPLOYMENT_NAME"),
            [Some("demo/worker".to_owned())]
        );
        assert_eq!(
            find("TEMPORAL_WORKER_BUILD_ID"),
            [Some("v1-0123456789".to_owned())]
        );
    }

    #[test]
    fn mutual_tls_and_api_key_connections_shape_the_pod() {
        let mut mtls = connection();
        mtls.mutual_tls_secret_ref = Some(SecretReference {
            name: "client-cert".into(),
        });
        let pod = build_deployment(&twd(), &mtls, &build(), ServerCa::InSecret)
            .spec
            .and_then(|s| s.template.spec)
            .expect("pod");
        assert_eq!(
            pod.volumes.as_ref().map(|v| v[0].name.as_str()),
            Some(injection::TLS_VOLUME)
        );

        let mut api_key = connection();
        api_key.api_key_secret_ref = Some(SecretKeySelector {
            name: "cloud".into(),
            key: "key".into(),
            optional: None,
        });
        let pod = build_deployment(&twd(), &api_key, &build(), ServerCa::SystemRoots)
            .spec
            .and_then(|s| s.template.spec)
            .expect("pod");
        // The key as a variable and as a file that follows the Secret.
        assert_eq!(
            pod.volumes.as_ref().map(|v| v[0].name.as_str()),
            Some(injection::API_KEY_VOLUME)
        );
        assert!(
            pod.containers[0]
                .env
                .iter()
                .flatten()
                .any(|v| v.name == "TEMPORAL_API_KEY")
        );
    }
}
