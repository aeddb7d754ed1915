//! The replay check's Job (issue #28): the new build's own pod template, running its replay
//! command over a list of real histories, and the verdict read back from its pod.
//!
//! The Job is named after the versioned Deployment, the rollout's run and the check's attempt,
//! so a retried activity (a controller killed while the Job runs) finds the Job it created
//! instead of starting a second one. It is owned by the Deployment (retired with the build).
//! Its pod runs the Deployment template's first container (sidecar containers would keep a
//! Job from ever finishing; init containers are kept) with the check's `command`/`args`, the
//! list of histories in `TWC_REPLAY_WORKFLOWS`, `TWC_REPLAY_REPORT_PATH=/dev/termination-log`,
//! no probes, `restartPolicy: Never`, `backoffLimit: 0` and the check's timeout as
//! `activeDeadlineSeconds`. The pod template's labels lose the Deployment's selector labels (its
//! ReplicaSet must not count the Job's pod) and gain [`REPLAY_CHECK_LABEL`].

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{ContainerStateTerminated, EnvVar, Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Deserialize;
use twc_crds::labels;
use twc_workflows::contract::{ReplayTarget, ReplayVerdict};

use super::error::{K8sError, ObjectName, is_already_exists};

/// Label on a replay Job and its pod.
pub const REPLAY_CHECK_LABEL: &str = "twc.temporal.io/replay-check";
/// Label the Job controller puts on a Job's pods.
const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";
/// Where the replay container writes its report (its termination message).
pub const REPORT_PATH: &str = "/dev/termination-log";
/// How often a running Job is looked at.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// What the check runs, from `spec.rollout.replayCheck`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayJobSpec {
    /// Replaces the container's `command` when set.
    pub command: Option<Vec<String>>,
    /// Replaces the container's `args` when set (cleared when only `command` is set).
    pub args: Option<Vec<String>>,
    /// `activeDeadlineSeconds` of the Job.
    pub timeout_seconds: i64,
}

/// The rollout check's Job name: the Deployment's, cut to fit, `-replay-<8 hex of the rollout
/// run's SHA-256>-<attempt>`. An activity retried in the same run finds its Job again; a new
/// run of the rollout (a `retry` after the check aborted it) checks afresh instead of reading
/// the aborted run's verdict back.
pub fn replay_job_name(deployment: &str, run_id: &str, attempt: u32) -> String {
    fitted(
        deployment,
        &format!("-replay-{}-{attempt}", short_digest(run_id)),
    )
}

/// The first 8 hex digits of `value`'s SHA-256 (run IDs may be time-ordered UUIDs, whose own
/// first digits two runs a minute apart share).
fn short_digest(value: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(value.as_bytes()))[..8].to_owned()
}

/// The Job name of the check before `moveToCurrent` moves `retired_build`'s pinned workflows
/// to the Current build of Deployment `current_deployment`: `<Deployment>-move-<8 hex of the
/// retired build's SHA-256>` (one Job per pair, found again at the next drain look).
pub fn move_job_name(current_deployment: &str, retired_build: &str) -> String {
    fitted(
        current_deployment,
        &format!("-move-{}", short_digest(retired_build)),
    )
}

/// `base` cut so that `base` + `suffix` fits a label value (63 characters).
fn fitted(base: &str, suffix: &str) -> String {
    let room = 63usize.saturating_sub(suffix.len());
    let base: String = base.chars().take(room).collect();
    format!("{}{suffix}", base.trim_end_matches('-'))
}

/// The replay Job of `deployment` (see the module documentation).
pub fn build_replay_job(
    deployment: &Deployment,
    spec: &ReplayJobSpec,
    targets: &[ReplayTarget],
    job_name: String,
) -> Result<Job, String> {
    let name = deployment.name_any();
    let uid = deployment
        .uid()
        .ok_or_else(|| format!("Deployment {name} has no uid"))?;
    let deployment_spec = deployment
        .spec
        .as_ref()
        .ok_or_else(|| format!("Deployment {name} has no spec"))?;
    let selector = deployment_spec
        .selector
        .match_labels
        .clone()
        .unwrap_or_default();
    let mut template: PodTemplateSpec = deployment_spec.template.clone();
    let mut pod_labels: BTreeMap<String, String> = template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    pod_labels.retain(|key, _| !selector.contains_key(key));
    pod_labels.insert(REPLAY_CHECK_LABEL.to_owned(), "true".to_owned());
    let mut pod_metadata = template.metadata.take().unwrap_or_default();
    pod_metadata.labels = Some(pod_labels);
    template.metadata = Some(pod_metadata);
    let pod_spec = template
        .spec
        .as_mut()
        .ok_or_else(|| format!("Deployment {name} has no pod spec"))?;
    if pod_spec.containers.is_empty() {
        return Err(format!("Deployment {name} has no containers"));
    }
    pod_spec.containers.truncate(1);
    pod_spec.restart_policy = Some("Never".to_owned());
    let list = serde_json::to_string(targets).map_err(|e| e.to_string())?;
    let container = &mut pod_spec.containers[0];
    if let Some(command) = &spec.command {
        container.command = Some(command.clone());
        container.args = spec.args.clone();
    } else if let Some(args) = &spec.args {
        container.args = Some(args.clone());
    }
    container.readiness_probe = None;
    container.liveness_probe = None;
    container.startup_probe = None;
    container.termination_message_path = Some(REPORT_PATH.to_owned());
    container.termination_message_policy = Some("FallbackToLogsOnError".to_owned());
    let env = container.env.get_or_insert_with(Vec::new);
    env.retain(|v| v.name != "TWC_REPLAY_WORKFLOWS" && v.name != "TWC_REPLAY_REPORT_PATH");
    for (key, value) in [
        ("TWC_REPLAY_WORKFLOWS", list),
        ("TWC_REPLAY_REPORT_PATH", REPORT_PATH.to_owned()),
    ] {
        env.push(EnvVar {
            name: key.to_owned(),
            value: Some(value),
            ..Default::default()
        });
    }
    let mut job_labels = BTreeMap::new();
    for key in [labels::DEPLOYMENT_NAME, labels::BUILD_ID] {
        if let Some(value) = deployment.labels().get(key) {
            job_labels.insert(key.to_owned(), value.clone());
        }
    }
    job_labels.insert(REPLAY_CHECK_LABEL.to_owned(), "true".to_owned());
    Ok(Job {
        metadata: ObjectMeta {
            name: Some(job_name),
            namespace: deployment.namespace(),
            labels: Some(job_labels),
            owner_references: Some(vec![OwnerReference {
                api_version: Deployment::api_version(&()).into_owned(),
                kind: Deployment::kind(&()).into_owned(),
                name,
                uid,
                controller: Some(false),
                block_owner_deletion: None,
            }]),
            ..Default::default()
        },
        spec: Some(JobSpec {
            backoff_limit: Some(0),
            active_deadline_seconds: Some(spec.timeout_seconds),
            template,
            ..Default::default()
        }),
        status: None,
    })
}

/// The JSON report of the replay contract (the fields the verdict needs).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct Report {
    passed: u32,
    workflow_types: BTreeMap<String, u32>,
    nondeterministic: Vec<Mismatch>,
    inconclusive: Vec<Unchecked>,
    seconds: f64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct Mismatch {
    workflow_id: String,
    run_id: String,
    workflow_type: String,
    message: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct Unchecked {
    workflow_id: String,
    reason: String,
}

/// The verdict of a finished replay Job from its pods; `None` while it runs. `histories` is how
/// many the Job was given (a passing container without a report replayed them all).
pub fn verdict(job: &Job, pods: &[Pod], histories: u32) -> Option<ReplayVerdict> {
    let name = job.name_any();
    let condition = |type_: &str| {
        job.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| {
                cs.iter()
                    .find(|c| c.type_ == type_ && c.status == "True")
                    .cloned()
            })
    };
    let complete = condition("Complete");
    let failed = condition("Failed");
    if complete.is_none() && failed.is_none() {
        return None;
    }
    let mut terminated: Vec<(&Pod, ContainerStateTerminated)> = pods
        .iter()
        .filter_map(|p| {
            let state = p
                .status
                .as_ref()?
                .container_statuses
                .as_ref()?
                .first()?
                .state
                .as_ref()?
                .terminated
                .clone()?;
            Some((p, state))
        })
        .collect();
    terminated.sort_by_key(|(_, t)| t.finished_at.clone());
    let last = terminated.last();
    let report = last
        .and_then(|(_, t)| t.message.as_deref())
        .and_then(|m| serde_json::from_str::<Report>(m.trim()).ok());
    if complete.is_some() {
        let report = report.unwrap_or(Report {
            passed: histories,
            ..Report::default()
        });
        return Some(ReplayVerdict::Passed {
            histories: report.passed,
            workflow_types: report.workflow_types,
            seconds: report.seconds,
        });
    }
    let failure = failed
        .map(|c| {
            format!(
                "{}: {}",
                c.reason.unwrap_or_default(),
                c.message.unwrap_or_default()
            )
        })
        .unwrap_or_default();
    let Some((pod, state)) = last else {
        let waiting = pods
            .iter()
            .filter_map(|p| {
                let w = p
                    .status
                    .as_ref()?
                    .container_statuses
                    .as_ref()?
                    .first()?
                    .state
                    .as_ref()?
                    .waiting
                    .clone()?;
                Some(format!(
                    "; pod {} could not start ({}: {})",
                    p.name_any(),
                    w.reason.unwrap_or_default(),
                    w.message.unwrap_or_default()
                ))
            })
            .collect::<String>();
        return Some(ReplayVerdict::Inconclusive {
            reason: format!(
                "replay Job {name} failed ({failure}) before its container ran{waiting}"
            ),
        });
    };
    let code = state.exit_code;
    let words = state.message.clone().unwrap_or_default();
    let pod_name = pod.name_any();
    Some(match (code, report) {
        (1, Some(report)) if !report.nondeterministic.is_empty() => {
            let count = u32::try_from(report.nondeterministic.len()).unwrap_or(u32::MAX);
            let first = report
                .nondeterministic
                .into_iter()
                .next()
                .unwrap_or_default();
            ReplayVerdict::Nondeterministic {
                workflow_id: first.workflow_id,
                run_id: first.run_id,
                workflow_type: first.workflow_type,
                message: first.message,
                count,
            }
        }
        (3, Some(report)) if !report.inconclusive.is_empty() => {
            let first = report.inconclusive.into_iter().next().unwrap_or_default();
            ReplayVerdict::Inconclusive {
                reason: format!(
                    "replay Job {name} could not check workflow {}: {}",
                    first.workflow_id, first.reason
                ),
            }
        }
        _ => ReplayVerdict::Inconclusive {
            reason: format!(
                "replay Job {name} failed ({failure}): pod {pod_name} exited with code {code} without a report naming a mismatch: {}",
                words.trim()
            ),
        },
    })
}

/// What [`run_replay_job`] found.
#[derive(Debug, Clone, PartialEq)]
pub struct JobVerdict {
    /// The verdict.
    pub verdict: ReplayVerdict,
    /// Whether this call created the Job (false: it existed, from an earlier attempt or look).
    pub created: bool,
}

/// Creates the replay Job unless it exists (a retried activity), then waits for its verdict,
/// looking every [`POLL_INTERVAL`].
pub async fn run_replay_job(
    client: &Client,
    job: Job,
    histories: u32,
) -> Result<JobVerdict, K8sError> {
    let namespace = job.namespace().unwrap_or_default();
    let name = job.name_any();
    let object = ObjectName::new("Job", &namespace, &name);
    let jobs: Api<Job> = Api::namespaced(client.clone(), &namespace);
    let created = match jobs.create(&PostParams::default(), &job).await {
        Ok(_) => {
            tracing::info!(job = %object, histories, "replay check started");
            true
        }
        Err(e) if is_already_exists(&e) => {
            tracing::info!(job = %object, "replay check Job exists; waiting for its verdict");
            false
        }
        Err(e) => return Err(K8sError::api("create", &object)(e)),
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let selector = ListParams::default().labels(&format!("{JOB_NAME_LABEL}={name}"));
    loop {
        let current = jobs
            .get(&name)
            .await
            .map_err(K8sError::api("get", &object))?;
        let listed = pods
            .list(&selector)
            .await
            .map_err(K8sError::api("list pods of", &object))?
            .items;
        if let Some(verdict) = verdict(&current, &listed, histories) {
            return Ok(JobVerdict { verdict, created });
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateWaiting, ContainerStatus, PodStatus,
    };
    use serde_json::json;

    fn deployment() -> Deployment {
        serde_json::from_value(json!({
            "metadata": {
                "name": "hello-v2-abc", "namespace": "demo", "uid": "u-1",
                "labels": { "temporal.io/deployment-name": "hello", "temporal.io/build-id": "v2" },
            },
            "spec": {
                "selector": { "matchLabels": {
                    "temporal.io/deployment-name": "hello", "temporal.io/build-id": "v2" } },
                "template": {
                    "metadata": { "labels": {
                        "temporal.io/deployment-name": "hello", "temporal.io/build-id": "v2",
                        "app": "hello" } },
                    "spec": { "containers": [
                        { "name": "worker", "image": "hello:v2", "args": ["--serve"],
                          "env": [ { "name": "TEMPORAL_ADDRESS", "value": "t:7233" } ],
                          "readinessProbe": { "tcpSocket": { "port": 9 } } },
                        { "name": "proxy", "image": "proxy:1" }
                    ] }
                }
            }
        }))
        .expect("a Deployment")
    }

    fn targets() -> Vec<ReplayTarget> {
        vec![ReplayTarget {
            workflow_id: "wf-1".into(),
            run_id: "r-1".into(),
        }]
    }

    #[test]
    fn the_job_runs_the_build_s_template_with_the_replay_command() {
        let spec = ReplayJobSpec {
            command: None,
            args: Some(vec!["replay".into()]),
            timeout_seconds: 300,
        };
        let job = build_replay_job(
            &deployment(),
            &spec,
            &targets(),
            "hello-v2-abc-replay-2".into(),
        )
        .expect("a Job");
        let value = serde_json::to_value(&job).expect("JSON");
        assert_eq!(value["metadata"]["name"], "hello-v2-abc-replay-2");
        assert_eq!(
            value["metadata"]["labels"]["temporal.io/deployment-name"],
            "hello"
        );
        assert_eq!(value["metadata"]["labels"][REPLAY_CHECK_LABEL], "true");
        assert_eq!(value["metadata"]["ownerReferences"][0]["uid"], "u-1");
        assert_eq!(value["spec"]["backoffLimit"], 0);
        assert_eq!(value["spec"]["activeDeadlineSeconds"], 300);
        let template = &value["spec"]["template"];
        assert_eq!(
            template["metadata"]["labels"],
            json!({ "app": "hello", REPLAY_CHECK_LABEL: "true" }),
            "the Deployment's selector labels are gone"
        );
        assert_eq!(template["spec"]["restartPolicy"], "Never");
        let containers = template["spec"]["containers"]
            .as_array()
            .expect("containers");
        assert_eq!(containers.len(), 1, "only the worker container");
        let worker = &containers[0];
        assert_eq!(worker["args"], json!(["replay"]));
        assert!(worker.get("command").is_none(), "the image's entrypoint");
        assert!(worker.get("readinessProbe").is_none());
        assert_eq!(worker["terminationMessagePath"], REPORT_PATH);
        assert_eq!(
            worker["env"],
            json!([
                { "name": "TEMPORAL_ADDRESS", "value": "t:7233" },
                { "name": "TWC_REPLAY_WORKFLOWS", "value": "[{\"workflowId\":\"wf-1\",\"runId\":\"r-1\"}]" },
                { "name": "TWC_REPLAY_REPORT_PATH", "value": REPORT_PATH },
            ])
        );

        let with_command = ReplayJobSpec {
            command: Some(vec!["/bin/replayer".into()]),
            args: None,
            timeout_seconds: 60,
        };
        let job =
            build_replay_job(&deployment(), &with_command, &targets(), "j".into()).expect("a Job");
        let worker =
            serde_json::to_value(&job).expect("JSON")["spec"]["template"]["spec"]["containers"][0]
                .clone();
        assert_eq!(worker["command"], json!(["/bin/replayer"]));
        assert!(
            worker.get("args").is_none(),
            "the worker's args are not the replayer's"
        );
    }

    #[test]
    fn job_names_fit_a_label_value() {
        let long = "x".repeat(80);
        let name = replay_job_name(&long, "run-1", 12);
        assert!(name.len() <= 63 && name.ends_with("-12"), "{name}");
        let name = replay_job_name("hello-v2", "run-1", 1);
        assert!(
            name.starts_with("hello-v2-replay-") && name.ends_with("-1") && name.len() == 26,
            "{name}"
        );
        assert_eq!(
            name,
            replay_job_name("hello-v2", "run-1", 1),
            "an activity retried in the run finds its Job again"
        );
        assert_ne!(
            name,
            replay_job_name("hello-v2", "run-1", 2),
            "a new attempt"
        );
        assert_ne!(
            name,
            replay_job_name("hello-v2", "run-2", 1),
            "a new run of the rollout"
        );
        let moved = move_job_name(&long, "v1-abc");
        assert!(moved.len() <= 63 && moved.contains("-move-"), "{moved}");
        assert_ne!(
            moved,
            move_job_name(&long, "v0-abc"),
            "one Job per retired build"
        );
        assert_eq!(moved, move_job_name(&long, "v1-abc"), "found again");
    }

    fn job(condition: Option<(&str, &str)>) -> Job {
        Job {
            metadata: ObjectMeta {
                name: Some("hello-v2-replay-1".into()),
                ..Default::default()
            },
            status: Some(JobStatus {
                conditions: condition.map(|(type_, reason)| {
                    vec![JobCondition {
                        type_: type_.into(),
                        status: "True".into(),
                        reason: Some(reason.into()),
                        message: Some("words".into()),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn pod(state: ContainerState) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("hello-v2-replay-1-x".into()),
                ..Default::default()
            },
            status: Some(PodStatus {
                container_statuses: Some(vec![ContainerStatus {
                    state: Some(state),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn exited(code: i32, message: &str) -> Pod {
        pod(ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: code,
                message: Some(message.into()),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    #[test]
    fn the_verdict_comes_from_the_exit_code_and_the_report() {
        let mismatch = r#"{"passed":1,"workflowTypes":{"HelloWorld":3},"events":30,
            "nondeterministic":[{"workflowId":"a","runId":"ra","workflowType":"HelloWorld","message":"[TMPRL1100] x"},
                                {"workflowId":"b","runId":"rb","workflowType":"HelloWorld","message":"y"}],
            "inconclusive":[],"seconds":0.5}"#;
        let passed = r#"{"passed":3,"workflowTypes":{"HelloWorld":2,"Sleeper":1},"nondeterministic":[],"inconclusive":[],"seconds":1.25}"#;
        let unchecked = r#"{"passed":0,"nondeterministic":[],"inconclusive":[{"workflowId":"gone","reason":"not found"}]}"#;
        let reason = |v: Option<ReplayVerdict>| match v {
            Some(ReplayVerdict::Inconclusive { reason }) => reason,
            other => panic!("not inconclusive: {other:?}"),
        };

        assert_eq!(
            verdict(&job(None), &[exited(0, passed)], 3),
            None,
            "still running"
        );
        assert_eq!(
            verdict(
                &job(Some(("Complete", "CompletionsReached"))),
                &[exited(0, passed)],
                3
            ),
            Some(ReplayVerdict::Passed {
                histories: 3,
                workflow_types: [("HelloWorld".into(), 2), ("Sleeper".into(), 1)].into(),
                seconds: 1.25,
            })
        );
        assert_eq!(
            verdict(
                &job(Some(("Complete", "CompletionsReached"))),
                &[exited(0, "")],
                4
            ),
            Some(ReplayVerdict::Passed {
                histories: 4,
                workflow_types: BTreeMap::new(),
                seconds: 0.0,
            }),
            "exit 0 is a pass even without a report"
        );
        assert_eq!(
            verdict(
                &job(Some(("Failed", "BackoffLimitExceeded"))),
                &[exited(1, mismatch)],
                3
            ),
            Some(ReplayVerdict::Nondeterministic {
                workflow_id: "a".into(),
                run_id: "ra".into(),
                workflow_type: "HelloWorld".into(),
                message: "[TMPRL1100] x".into(),
                count: 2,
            })
        );
        let failed = job(Some(("Failed", "BackoffLimitExceeded")));
        assert!(
            reason(verdict(&failed, &[exited(1, "panic: boom")], 3))
                .contains("exited with code 1 without a report naming a mismatch: panic: boom")
        );
        assert!(
            reason(verdict(&failed, &[exited(3, unchecked)], 3))
                .contains("could not check workflow gone: not found")
        );
        assert!(reason(verdict(&failed, &[exited(137, "")], 3)).contains("code 137"));
        let waiting = pod(ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some("ImageNotMapped".into()),
                message: Some("image \"x\" is not mapped".into()),
            }),
            ..Default::default()
        });
        let deadline = job(Some(("Failed", "DeadlineExceeded")));
        let words = reason(verdict(&deadline, &[waiting], 3));
        assert!(
            words.contains("DeadlineExceeded: words")
                && words.contains("could not start (ImageNotMapped: image \"x\" is not mapped)"),
            "{words}"
        );
    }
}
