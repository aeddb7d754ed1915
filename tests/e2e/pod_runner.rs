//! The pod runner turns a versioned Deployment into real sample-worker processes whose versioned
//! pollers register with Temporal, and writes the Deployment status as a Deployment controller would.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{Container, EnvVar, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use twc_crds::labels;

use crate::harness::twd::routing;
use crate::harness::wait::wait_for;
use crate::harness::{env, kube_client, test_namespace};

fn worker_deployment(
    name: &str,
    deployment_name: &str,
    build_id: &str,
    replicas: i32,
) -> Deployment {
    let selector: BTreeMap<String, String> = [
        (labels::DEPLOYMENT_NAME.to_owned(), name.to_owned()),
        (labels::BUILD_ID.to_owned(), build_id.to_owned()),
    ]
    .into();
    let env_var = |name: &str, value: &str| EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..Default::default()
    };
    Deployment {
        metadata: ObjectMeta {
            name: Some(format!("{name}-{build_id}")),
            labels: Some(selector.clone()),
            ..Default::default()
        },
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector: LabelSelector {
                match_labels: Some(selector.clone()),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(selector),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "worker".into(),
                        image: Some("twc.local/sample-worker:v1".into()),
                        env: Some(vec![
                            env_var("TEMPORAL_ADDRESS", &env().temporal_address),
                            env_var("TEMPORAL_NAMESPACE", &env().temporal_namespace),
                            env_var("TEMPORAL_DEPLOYMENT_NAME", deployment_name),
                            env_var("TEMPORAL_WORKER_BUILD_ID", build_id),
                        ]),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn condition_true(deployment: &Deployment, type_: &str) -> bool {
    deployment
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == type_ && c.status == "True"))
}

#[tokio::test]
async fn deployment_becomes_polling_workers_and_available_status() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "podrunner").await;
    let deployment_name = format!("{ns}/hello");
    let build_id = "v1-e2e";
    let api: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let created = api
        .create(
            &PostParams::default(),
            &worker_deployment("hello", &deployment_name, build_id, 2),
        )
        .await;
    let name = match created {
        Ok(d) => d.metadata.name.unwrap_or_default(),
        Err(e) => panic!("creating Deployment: {e}"),
    };

    wait_for(
        "Deployment Available with 2 ready replicas",
        Duration::from_secs(60),
        || async {
            let d = api.get(&name).await.map_err(|e| e.to_string())?;
            let status = d.status.clone().unwrap_or_default();
            let ok = condition_true(&d, "Available")
                && status.ready_replicas == Some(2)
                && status.available_replicas == Some(2)
                && status.observed_generation == d.metadata.generation;
            if ok {
                Ok(())
            } else {
                Err(format!("{:?}", d.status))
            }
        },
    )
    .await;

    wait_for(
        "Temporal lists the build ID of the worker deployment",
        Duration::from_secs(60),
        || async {
            let ids = routing(&deployment_name).await?.versions;
            if ids.iter().any(|id| id == build_id) {
                Ok(())
            } else {
                Err(format!("registered: {ids:?}"))
            }
        },
    )
    .await;

    let scale = json!({ "spec": { "replicas": 0 } });
    if let Err(e) = api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&scale))
        .await
    {
        panic!("scaling to zero: {e}");
    }
    wait_for(
        "Deployment status reports zero replicas",
        Duration::from_secs(30),
        || async {
            let d = api.get(&name).await.map_err(|e| e.to_string())?;
            let status = d.status.clone().unwrap_or_default();
            let ok = status.replicas.unwrap_or(0) == 0
                && status.observed_generation == d.metadata.generation;
            if ok {
                Ok(())
            } else {
                Err(format!("{:?}", d.status))
            }
        },
    )
    .await;
}
