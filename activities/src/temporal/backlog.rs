//! Task-queue statistics of worker deployment versions (`DescribeWorkerDeploymentVersion` with
//! `report_task_queue_stats`): the backlog that backlog-based autoscaling scales each version's
//! Deployment from. A version that cannot be read is reported with why, never as idle.

use temporalio_common::protos::temporal::api::{
    enums::v1::TaskQueueType, taskqueue::v1::TaskQueueStats,
    workflowservice::v1::DescribeWorkerDeploymentVersionResponse,
};
use tracing::debug;
use twc_workflows::contract::{QueueBacklog, VersionBacklog};

use crate::temporal::{
    describe::{describe_version_response, task_queue_kind, with_busy_retries},
    error::TemporalError,
    pool::TemporalClient,
};

/// The `error` of a version Temporal does not know (or whose worker deployment it does not
/// know): the caller counts it as unknown, not as idle.
pub const UNKNOWN_TO_TEMPORAL: &str = "unknown to Temporal";

/// The statistics of each of `build_ids` of a worker deployment, in order: one read per version
/// (concurrently, each paid from the namespace's read budget). Never fails: a version that
/// cannot be read carries its `error`.
pub async fn read_backlog(
    client: &TemporalClient,
    namespace: &str,
    deployment_name: &str,
    build_ids: &[String],
) -> Vec<VersionBacklog> {
    futures::future::join_all(
        build_ids
            .iter()
            .map(|build_id| read_version_backlog(client, namespace, deployment_name, build_id)),
    )
    .await
}

/// The statistics of one version (see [`read_backlog`]). A read refused because the worker
/// deployment is busy applying a routing change is retried for a few seconds first.
pub async fn read_version_backlog(
    client: &TemporalClient,
    namespace: &str,
    deployment_name: &str,
    build_id: &str,
) -> VersionBacklog {
    let described = with_busy_retries(deployment_name, || {
        describe_version_response(client, namespace, deployment_name, build_id, true)
    })
    .await;
    let backlog = backlog_of_read(build_id, described);
    match &backlog.error {
        Some(error) => {
            debug!(%namespace, %deployment_name, %build_id, %error, "version backlog unknown");
        }
        None => debug!(
            %namespace,
            %deployment_name,
            %build_id,
            backlog = backlog.backlog,
            backlog_age_ms = backlog.backlog_age_ms,
            add_rate = backlog.add_rate,
            dispatch_rate = backlog.dispatch_rate,
            "version backlog read"
        ),
    }
    backlog
}

/// The statistics of a version from the outcome of its read: the response's, or an `error`
/// ([`UNKNOWN_TO_TEMPORAL`] when Temporal does not know it, the failure otherwise).
pub fn backlog_of_read(
    build_id: &str,
    read: Result<Option<DescribeWorkerDeploymentVersionResponse>, TemporalError>,
) -> VersionBacklog {
    let error = match read {
        Ok(Some(response)) => return version_backlog(build_id, &response),
        Ok(None) => UNKNOWN_TO_TEMPORAL.to_owned(),
        Err(err) => err.to_string(),
    };
    VersionBacklog {
        build_id: build_id.to_owned(),
        error: Some(error),
        ..VersionBacklog::default()
    }
}

/// The statistics of a version from a `DescribeWorkerDeploymentVersion` asked with
/// `report_task_queue_stats`: backlogs and rates summed over its task queues, the oldest task's
/// age the largest. Queues come sorted by name and kind. A queue the server gave no statistics
/// for (a server without them, or a request without `report_task_queue_stats`) makes the version
/// unknown: `error` names the queues, the others are still listed and summed.
pub fn version_backlog(
    build_id: &str,
    response: &DescribeWorkerDeploymentVersionResponse,
) -> VersionBacklog {
    let mut task_queues = Vec::new();
    let mut without_stats = Vec::new();
    for queue in &response.version_task_queues {
        let kind = kind_name(queue.r#type);
        match &queue.stats {
            Some(stats) => task_queues.push(queue_backlog(&queue.name, kind, stats)),
            None => without_stats.push(format!("{} ({kind})", queue.name)),
        }
    }
    task_queues.sort_by(|a, b| (&a.name, &a.kind).cmp(&(&b.name, &b.kind)));
    let error = (!without_stats.is_empty()).then(|| {
        format!(
            "Temporal reported no statistics for task queue(s) {} of this version; the server \
             may predate task-queue statistics of worker deployment versions",
            without_stats.join(", ")
        )
    });
    VersionBacklog {
        build_id: build_id.to_owned(),
        backlog: task_queues
            .iter()
            .fold(0, |sum: u64, q| sum.saturating_add(q.backlog)),
        backlog_age_ms: task_queues
            .iter()
            .map(|q| q.backlog_age_ms)
            .max()
            .unwrap_or(0),
        add_rate: task_queues.iter().map(|q| q.add_rate).sum(),
        dispatch_rate: task_queues.iter().map(|q| q.dispatch_rate).sum(),
        task_queues,
        error,
    }
}

/// One queue's statistics; negative counts, ages and rates (and NaN rates) read as zero.
fn queue_backlog(name: &str, kind: &str, stats: &TaskQueueStats) -> QueueBacklog {
    QueueBacklog {
        name: name.to_owned(),
        kind: kind.to_owned(),
        backlog: u64::try_from(stats.approximate_backlog_count).unwrap_or(0),
        backlog_age_ms: stats
            .approximate_backlog_age
            .as_ref()
            .map_or(0, |age| duration_millis(age.seconds, age.nanos)),
        add_rate: rate(stats.tasks_add_rate),
        dispatch_rate: rate(stats.tasks_dispatch_rate),
    }
}

/// `workflow`, `activity`, `nexus`, or `unspecified` for a type this build does not know (its
/// backlog still counts).
fn kind_name(raw: i32) -> &'static str {
    match task_queue_kind(raw) {
        Some(kind) => kind.as_str(),
        None => {
            debug!(
                r#type = ?TaskQueueType::try_from(raw),
                raw, "task queue of an unspecified type"
            );
            "unspecified"
        }
    }
}

/// A protobuf duration in whole milliseconds, zero when negative.
fn duration_millis(seconds: i64, nanos: i32) -> i64 {
    seconds
        .saturating_mul(1000)
        .saturating_add(i64::from(nanos) / 1_000_000)
        .max(0)
}

/// A rate as reported, zero when negative or not a number.
fn rate(value: f32) -> f64 {
    f64::from(value).max(0.0)
}

#[cfg(test)]
mod tests {
    use temporalio_client::tonic::Status;
    use temporalio_common::protos::temporal::api::workflowservice::v1::describe_worker_deployment_version_response::VersionTaskQueue;

    use super::*;

    fn stats(count: i64, age_ms: i64, add: f32, dispatch: f32) -> TaskQueueStats {
        TaskQueueStats {
            approximate_backlog_count: count,
            approximate_backlog_age: Some(prost_wkt_types::Duration {
                seconds: age_ms.div_euclid(1000),
                nanos: i32::try_from(age_ms.rem_euclid(1000) * 1_000_000).unwrap_or(0),
            }),
            tasks_add_rate: add,
            tasks_dispatch_rate: dispatch,
            ..Default::default()
        }
    }

    fn queue(name: &str, kind: TaskQueueType, stats: Option<TaskQueueStats>) -> VersionTaskQueue {
        VersionTaskQueue {
            name: name.to_owned(),
            r#type: kind as i32,
            stats,
            ..Default::default()
        }
    }

    fn listed(
        name: &str,
        kind: &str,
        backlog: u64,
        age: i64,
        add: f64,
        dispatch: f64,
    ) -> QueueBacklog {
        QueueBacklog {
            name: name.to_owned(),
            kind: kind.to_owned(),
            backlog,
            backlog_age_ms: age,
            add_rate: add,
            dispatch_rate: dispatch,
        }
    }

    #[test]
    fn a_versions_backlog_is_summed_over_its_queues_with_the_oldest_age() {
        use TaskQueueType::{Activity, Nexus, Unspecified, Workflow};
        struct Case {
            name: &'static str,
            queues: Vec<VersionTaskQueue>,
            expected: VersionBacklog,
        }
        let cases = [
            Case {
                name: "no task queue yet: idle",
                queues: vec![],
                expected: VersionBacklog {
                    build_id: "v1".into(),
                    ..VersionBacklog::default()
                },
            },
            Case {
                name: "workflow and activity queues, listed sorted",
                queues: vec![
                    queue("orders", Workflow, Some(stats(7, 1_500, 2.0, 0.5))),
                    queue("emails", Activity, Some(stats(3, 9_250, 1.0, 1.0))),
                    queue("orders", Activity, Some(stats(0, 0, 0.25, 0.25))),
                ],
                expected: VersionBacklog {
                    build_id: "v1".into(),
                    backlog: 10,
                    backlog_age_ms: 9_250,
                    add_rate: 3.25,
                    dispatch_rate: 1.75,
                    task_queues: vec![
                        listed("emails", "activity", 3, 9_250, 1.0, 1.0),
                        listed("orders", "activity", 0, 0, 0.25, 0.25),
                        listed("orders", "workflow", 7, 1_500, 2.0, 0.5),
                    ],
                    error: None,
                },
            },
            Case {
                name: "nonsense from the server reads as zero; odd kinds still count",
                queues: vec![
                    queue("q", Workflow, Some(stats(-4, -2_000, f32::NAN, -1.0))),
                    queue("q", Nexus, Some(stats(2, 10, 0.5, 0.0))),
                    queue("q", Unspecified, Some(stats(1, 20, 0.0, 0.0))),
                ],
                expected: VersionBacklog {
                    build_id: "v1".into(),
                    backlog: 3,
                    backlog_age_ms: 20,
                    add_rate: 0.5,
                    dispatch_rate: 0.0,
                    task_queues: vec![
                        listed("q", "nexus", 2, 10, 0.5, 0.0),
                        listed("q", "unspecified", 1, 20, 0.0, 0.0),
                        listed("q", "workflow", 0, 0, 0.0, 0.0),
                    ],
                    error: None,
                },
            },
            Case {
                name: "a queue without statistics makes the version unknown",
                queues: vec![
                    queue("orders", Workflow, None),
                    queue("orders", Activity, Some(stats(4, 100, 1.0, 0.0))),
                ],
                expected: VersionBacklog {
                    build_id: "v1".into(),
                    backlog: 4,
                    backlog_age_ms: 100,
                    add_rate: 1.0,
                    dispatch_rate: 0.0,
                    task_queues: vec![listed("orders", "activity", 4, 100, 1.0, 0.0)],
                    error: Some(
                        "Temporal reported no statistics for task queue(s) orders (workflow) of \
                         this version; the server may predate task-queue statistics of worker \
                         deployment versions"
                            .into(),
                    ),
                },
            },
        ];
        for case in cases {
            let response = DescribeWorkerDeploymentVersionResponse {
                version_task_queues: case.queues,
                ..Default::default()
            };
            assert_eq!(
                version_backlog("v1", &response),
                case.expected,
                "{}",
                case.name
            );
        }
    }

    #[test]
    fn a_version_that_cannot_be_read_is_unknown_not_idle() {
        let cases = [
            (
                "unknown to Temporal",
                Ok(None),
                UNKNOWN_TO_TEMPORAL.to_owned(),
            ),
            (
                "unreachable",
                Err(TemporalError::rpc(
                    "DescribeWorkerDeploymentVersion",
                    "ns/d:v1",
                    &Status::unavailable("connection refused"),
                )),
                "DescribeWorkerDeploymentVersion ns/d:v1: Unavailable: connection refused"
                    .to_owned(),
            ),
            (
                "rate limited",
                Err(TemporalError::rpc(
                    "DescribeWorkerDeploymentVersion",
                    "ns/d:v1",
                    &Status::resource_exhausted("namespace rate limit exceeded"),
                )),
                "DescribeWorkerDeploymentVersion ns/d:v1: ResourceExhausted: namespace rate \
                 limit exceeded"
                    .to_owned(),
            ),
        ];
        for (name, read, error) in cases {
            assert_eq!(
                backlog_of_read("v1", read),
                VersionBacklog {
                    build_id: "v1".into(),
                    error: Some(error),
                    ..VersionBacklog::default()
                },
                "{name}"
            );
        }
    }

    #[test]
    fn a_read_version_is_its_responses_statistics() {
        let response = DescribeWorkerDeploymentVersionResponse {
            version_task_queues: vec![queue(
                "orders",
                TaskQueueType::Workflow,
                Some(stats(5, 2_000, 1.0, 0.0)),
            )],
            ..Default::default()
        };
        let read = backlog_of_read("v2", Ok(Some(response.clone())));
        assert_eq!(read, version_backlog("v2", &response));
        assert_eq!((read.backlog, read.error), (5, None));
    }
}
