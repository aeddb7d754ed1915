//! The pod runner turns a versioned Deployment into real sample-worker processes whose versioned
//! pollers register with Temporal, and writes the Deployment status as a Deployment controller would.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Container, EnvVar, Pod, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
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

/// A Job of the pod runner's kind (it runs Jobs with the deployment-name label): `script` run by
/// `sh -c`, or the image alone when `script` is `None`.
fn job(name: &str, script: Option<&str>, spec: serde_json::Value) -> Job {
    let mut container = json!({
        "name": "check",
        "image": "twc.local/sample-worker:v1",
        "terminationMessagePolicy": "FallbackToLogsOnError",
    });
    if let Some(script) = script {
        container["image"] = json!("twc.local/shell:v1");
        container["command"] = json!(["sh", "-c", script]);
    } else {
        container["image"] = json!("twc.local/not-in-the-image-table:v1");
    }
    let mut job = json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": { "name": name, "labels": { (labels::DEPLOYMENT_NAME): "jobs" } },
        "spec": {
            "template": { "spec": { "restartPolicy": "Never", "containers": [container] } },
        },
    });
    if let (Some(target), Some(extra)) = (job["spec"].as_object_mut(), spec.as_object()) {
        target.extend(extra.clone());
    }
    serde_json::from_value(job).expect("a Job")
}

/// The Job's `(type, reason)` conditions that are true.
fn job_conditions(job: &Job) -> Vec<(String, String)> {
    job.status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .filter(|c| c.status == "True")
        .map(|c| (c.type_.clone(), c.reason.clone().unwrap_or_default()))
        .collect()
}

/// Waits until the Job has a true `condition`; returns it and its pods.
async fn wait_job(api: &Api<Job>, pods: &Api<Pod>, name: &str, condition: &str) -> (Job, Vec<Pod>) {
    wait_for(
        &format!("Job {name} {condition}"),
        Duration::from_secs(90),
        || async {
            let job = api.get(name).await.map_err(|e| e.to_string())?;
            let listed = pods
                .list(
                    &ListParams::default().labels(&format!("batch.kubernetes.io/job-name={name}")),
                )
                .await
                .map_err(|e| e.to_string())?
                .items;
            if job_conditions(&job).iter().any(|(t, _)| t == condition) {
                Ok((job, listed))
            } else {
                Err(format!("{:?}", job.status))
            }
        },
    )
    .await
}

/// The terminated state of a pod's container: exit code, reason, message.
fn terminated(pod: &Pod) -> Option<(i32, String, String)> {
    let state = pod
        .status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .terminated
        .clone()?;
    Some((
        state.exit_code,
        state.reason.unwrap_or_default(),
        state.message.unwrap_or_default(),
    ))
}

#[tokio::test]
async fn jobs_run_to_completion_with_failures_deadlines_and_termination_messages() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "podrunner-jobs").await;
    let api: Api<Job> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let create = |job: Job| {
        let api = api.clone();
        async move {
            api.create(&PostParams::default(), &job)
                .await
                .unwrap_or_else(|e| panic!("creating a Job: {e}"));
        }
    };
    create(job(
        "passes",
        Some(r#"echo '{"passed":3}' > /dev/termination-log"#),
        json!({}),
    ))
    .await;
    create(job(
        "fails",
        Some("echo trying; echo 'no luck' >&2; exit 3"),
        json!({ "backoffLimit": 1 }),
    ))
    .await;
    create(job(
        "slow",
        Some("sleep 120"),
        json!({ "activeDeadlineSeconds": 3, "backoffLimit": 0 }),
    ))
    .await;
    create(job("unstartable", None, json!({}))).await;

    // Exit 0: Complete, one Succeeded pod with the file the container wrote as its message.
    let (done, listed) = wait_job(&api, &pods, "passes", "Complete").await;
    let status = done.status.clone().unwrap_or_default();
    // Zero counts are left out by the API server.
    let count = |n: Option<i32>| n.unwrap_or(0);
    assert_eq!(
        (
            count(status.succeeded),
            count(status.failed),
            count(status.active)
        ),
        (1, 0, 0),
        "{status:?}"
    );
    assert!(status.completion_time.is_some() && status.start_time.is_some());
    assert_eq!(listed.len(), 1, "one pod");
    assert_eq!(
        listed[0]
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .as_deref(),
        Some("Succeeded")
    );
    assert_eq!(
        terminated(&listed[0]),
        Some((0, "Completed".into(), "{\"passed\":3}\n".into()))
    );

    // Exit 3 twice with backoffLimit 1: Failed (BackoffLimitExceeded), two Failed pods whose
    // message is their output's tail (FallbackToLogsOnError).
    let (failed, listed) = wait_job(&api, &pods, "fails", "Failed").await;
    assert!(
        job_conditions(&failed).contains(&("Failed".into(), "BackoffLimitExceeded".into())),
        "{:?}",
        failed.status
    );
    assert_eq!(failed.status.as_ref().and_then(|s| s.failed), Some(2));
    assert_eq!(listed.len(), 2, "a new pod per attempt");
    for pod in &listed {
        let (code, reason, message) = terminated(pod).unwrap_or_default();
        assert_eq!((code, reason.as_str()), (3, "Error"), "{:?}", pod.status);
        assert!(
            message.contains("trying") && message.contains("no luck"),
            "{message:?}"
        );
    }

    // Past activeDeadlineSeconds: the process is stopped and the Job Failed (DeadlineExceeded).
    let (slow, _) = wait_job(&api, &pods, "slow", "Failed").await;
    assert!(
        job_conditions(&slow).contains(&("Failed".into(), "DeadlineExceeded".into())),
        "{:?}",
        slow.status
    );

    // An image the runner cannot play: the pod waits, saying why, and the Job stays active.
    let waiting = wait_for(
        "the unstartable Job's pod waits with ImageNotMapped",
        Duration::from_secs(60),
        || async {
            let listed = pods
                .list(&ListParams::default().labels("batch.kubernetes.io/job-name=unstartable"))
                .await
                .map_err(|e| e.to_string())?
                .items;
            let waiting = listed.first().and_then(|p| {
                let status = p.status.as_ref()?;
                let state = status.container_statuses.as_ref()?.first()?.state.clone()?;
                Some((status.phase.clone()?, state.waiting?))
            });
            match waiting {
                Some((phase, w)) if w.reason.as_deref() == Some("ImageNotMapped") => {
                    Ok((phase, w.message.unwrap_or_default()))
                }
                _ => Err(format!("{listed:?}")),
            }
        },
    )
    .await;
    assert_eq!(waiting.0, "Pending");
    assert!(
        waiting.1.contains("not-in-the-image-table"),
        "{}",
        waiting.1
    );
    let unstartable = api.get("unstartable").await.expect("the Job");
    assert_eq!(unstartable.status.as_ref().and_then(|s| s.active), Some(1));
    assert!(job_conditions(&unstartable).is_empty());

    // Deleting a Job deletes its pods (no kubelet confirms a graceful delete: the runner does).
    api.delete("unstartable", &DeleteParams::default())
        .await
        .expect("deleting the Job");
    wait_for(
        "the deleted Job's pods are gone",
        Duration::from_secs(30),
        || async {
            let left = pods
                .list(&ListParams::default().labels("batch.kubernetes.io/job-name=unstartable"))
                .await
                .map_err(|e| e.to_string())?
                .items
                .len();
            if left == 0 {
                Ok(())
            } else {
                Err(format!("{left} pods left"))
            }
        },
    )
    .await;
}
