//! Reading a worker deployment and its versions (`DescribeWorkerDeployment`,
//! `DescribeWorkerDeploymentVersion`), each read paid from the namespace's read budget.

use std::future::Future;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};

use serde::{Deserialize, Serialize};
use temporalio_client::grpc::WorkflowService;
use temporalio_common::protos::temporal::api::{
    deployment::v1::{
        RoutingConfig, WorkerDeploymentInfo, worker_deployment_info::WorkerDeploymentVersionSummary,
    },
    enums::v1::{
        RoutingConfigUpdateState, TaskQueueType, VersionDrainageStatus,
        WorkerDeploymentVersionStatus,
    },
    workflowservice::v1::{
        DescribeWorkerDeploymentRequest, DescribeWorkerDeploymentResponse,
        DescribeWorkerDeploymentVersionRequest, DescribeWorkerDeploymentVersionResponse,
    },
};
use tracing::debug;
use twc_crds::worker_deployment::VersionState;
use twc_workflows::model::{BlockReason, Blocked, TemporalState, TemporalVersion};

use crate::temporal::{
    convert::{encode_token, millis, read_request, version_ref},
    error::{StatusClass, TemporalError},
    pool::TemporalClient,
};

/// Kind of a task queue a version polls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum TaskQueueKind {
    /// Workflow tasks.
    Workflow,
    /// Activity tasks.
    Activity,
    /// Nexus tasks.
    Nexus,
}

impl TaskQueueKind {
    /// Lowercase name (`workflow`, `activity`, `nexus`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Workflow => "workflow",
            Self::Activity => "activity",
            Self::Nexus => "nexus",
        }
    }
}

/// Temporal's view of a worker deployment. NotFound is not an error: it gives
/// `TemporalState { exists: false, .. }`. A rate limit gives `TemporalStateFetchFailed` with
/// "Rate limited by Temporal server: ..."; every other failure `TemporalStateFetchFailed` too.
/// Rejected credentials also evict the client from its pool.
pub async fn describe_worker_deployment(
    client: &TemporalClient,
    namespace: &str,
    deployment_name: &str,
) -> Result<TemporalState, Blocked> {
    match fetch_worker_deployment(client, namespace, deployment_name).await {
        Ok(Some(state)) => Ok(state),
        Ok(None) => Ok(TemporalState::default()),
        Err(err) => Err(fetch_blocked(&err, namespace, deployment_name)),
    }
}

/// The `Blocked` of a failed read.
pub(crate) fn fetch_blocked(
    err: &TemporalError,
    namespace: &str,
    deployment_name: &str,
) -> Blocked {
    let message = if err.is_rate_limited() {
        format!("Rate limited by Temporal server: {}", err.server_message())
    } else if err.class() == StatusClass::NamespaceNotFound {
        format!(
            "Temporal namespace '{namespace}' does not exist on the server of this \
             TemporalConnection: fix spec.workerOptions.temporalNamespace or create the namespace \
             ({})",
            err.server_message()
        )
    } else {
        format!(
            "cannot read worker deployment '{deployment_name}' in Temporal namespace '{namespace}': {err}"
        )
    };
    Blocked {
        reason: BlockReason::TemporalStateFetchFailed,
        message,
    }
}

/// Reads a worker deployment; `None` when it does not exist. A read refused because the worker
/// deployment is busy is retried a few times (see [`with_busy_retries`]).
pub(crate) async fn fetch_worker_deployment(
    client: &TemporalClient,
    namespace: &str,
    deployment_name: &str,
) -> Result<Option<TemporalState>, TemporalError> {
    let state = with_busy_retries(deployment_name, || {
        describe_worker_deployment_once(client, namespace, deployment_name)
    })
    .await?;
    let Some(mut state) = state else {
        return Ok(None);
    };
    confirm_stale_draining(client, namespace, deployment_name, &mut state, now_millis()).await;
    Ok(Some(state))
}

/// How long after leaving routing a version's summary may say Draining before the version
/// itself is asked. The deployment's summary of a version is a copy the server updates when
/// the version reports its drainage; that report can get lost (seen on a dev server after
/// quick successive routing changes: the version said drained, the summary said Draining for
/// good), and sunset would then wait forever.
pub const DRAINING_CONFIRM_AFTER_MS: i64 = 10_000;

/// Asks each version whose summary has said Draining for longer than
/// [`DRAINING_CONFIRM_AFTER_MS`] for its own drainage status (one extra read per such
/// version) and takes that when it says Drained. A failed read keeps the summary's word.
async fn confirm_stale_draining(
    client: &TemporalClient,
    namespace: &str,
    deployment_name: &str,
    state: &mut TemporalState,
    now: i64,
) {
    let stale: Vec<String> = state
        .versions
        .iter()
        .filter(|v| draining_for_long(v, now))
        .map(|v| v.build_id.clone())
        .collect();
    // The versions are asked at once (each read still takes a token of the read budget).
    let mut reads = Vec::with_capacity(stale.len());
    for build_id in &stale {
        reads.push(with_busy_retries(deployment_name, move || {
            describe_version_once(client, namespace, deployment_name, build_id)
        }));
    }
    let answers = futures::future::join_all(reads).await;
    for (build_id, drainage) in stale.iter().zip(answers) {
        let Some(version) = state.versions.iter_mut().find(|v| v.build_id == *build_id) else {
            continue;
        };
        match drainage {
            Ok(Some(described)) => apply_version_drainage(version, &described),
            Ok(None) => {}
            Err(err) => {
                debug!(%deployment_name, %build_id, error = %err, "could not confirm drainage; keeping the summary's status");
            }
        }
    }
}

/// Whether the summary has said Draining for longer than [`DRAINING_CONFIRM_AFTER_MS`].
fn draining_for_long(version: &TemporalVersion, now: i64) -> bool {
    version.state == VersionState::Draining
        && version
            .deactivated_at
            .is_some_and(|at| now.saturating_sub(at) > DRAINING_CONFIRM_AFTER_MS)
}

/// Takes the version's own word when it says Drained.
fn apply_version_drainage(version: &mut TemporalVersion, described: &DescribedVersion) {
    if described.drainage != Some(VersionDrainageStatus::Drained) {
        return;
    }
    debug!(build_id = %version.build_id, "the version says drained while the deployment's summary says draining");
    version.state = VersionState::Drained;
    version.drainage_known = true;
    version.drained_since = described.drained_since.or(version.deactivated_at);
}

fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// How long a read refused because the worker deployment is busy is retried. The server
/// refuses reads of a deployment while it applies a routing change (1-3 s on a dev server).
const BUSY_PATIENCE: Duration = Duration::from_secs(4);
/// Delay before the first retry of such a read; each retry waits twice as long, up to
/// [`BUSY_MAX_DELAY`]. The refusals also come while versions register under a burst (579 in a
/// burst of 100, all before the deployment's routing changed), and every retry is paid from the
/// namespace's read budget: doubling spends at most 6 retries in [`BUSY_PATIENCE`] where growing
/// by 100 ms spent up to 14, which the burst's other reads queued behind.
const BUSY_FIRST_DELAY: Duration = Duration::from_millis(100);
/// Longest delay between two such retries.
const BUSY_MAX_DELAY: Duration = Duration::from_millis(1000);

/// Whether the server refused a call because the worker deployment is busy applying a change
/// ("too many requests issued to Worker Deployment '...'"), which clears within moments, unlike
/// a namespace rate limit.
pub(crate) fn is_busy_deployment(err: &TemporalError) -> bool {
    err.is_rate_limited() && {
        let message = err.server_message().to_ascii_lowercase();
        message.contains("too many requests") && message.contains("worker deployment")
    }
}

/// Runs `call` until it is not refused as [`is_busy_deployment`], waiting at most
/// [`BUSY_PATIENCE`] in all between tries (exponential from [`BUSY_FIRST_DELAY`] up to
/// [`BUSY_MAX_DELAY`], jittered so that the reads of many rollouts refused at once do not come
/// back at once). Right after a routing change the server refuses reads of the deployment for
/// a moment; reporting that as a blocked rollout would make the TWD's conditions flap, and
/// long back-off steps would delay the read well past the end of the busy period.
pub(crate) async fn with_busy_retries<T, F, Fut>(
    deployment_name: &str,
    call: F,
) -> Result<T, TemporalError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, TemporalError>>,
{
    let backoff = ExponentialBuilder::new()
        .with_min_delay(BUSY_FIRST_DELAY)
        .with_max_delay(BUSY_MAX_DELAY)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .with_total_delay(Some(BUSY_PATIENCE));
    call.retry(backoff)
        .sleep(tokio::time::sleep)
        .when(is_busy_deployment)
        .notify(|err, delay| {
            debug!(%deployment_name, error = %err, ?delay, "worker deployment busy; reading again");
        })
        .await
}

async fn describe_worker_deployment_once(
    client: &TemporalClient,
    namespace: &str,
    deployment_name: &str,
) -> Result<Option<TemporalState>, TemporalError> {
    client.acquire_read().await;
    let request = read_request(DescribeWorkerDeploymentRequest {
        namespace: namespace.to_owned(),
        deployment_name: deployment_name.to_owned(),
    });
    let mut raw = client.raw().clone();
    match client
        .observe(
            "DescribeWorkerDeployment",
            WorkflowService::describe_worker_deployment(&mut raw, request),
        )
        .await
    {
        Ok(response) => Ok(Some(state_from_response(response.into_inner()))),
        Err(status) => {
            let err = client.rpc_error("DescribeWorkerDeployment", deployment_name, &status);
            if err.class() == StatusClass::NotFound {
                debug!(%namespace, %deployment_name, "worker deployment not found");
                Ok(None)
            } else {
                Err(err)
            }
        }
    }
}

/// The task queues a version has polled (every kind), or `None` when Temporal does not know the
/// version (or the deployment).
pub async fn version_task_queues(
    client: &TemporalClient,
    namespace: &str,
    deployment_name: &str,
    build_id: &str,
) -> Result<Option<Vec<(String, TaskQueueKind)>>, Blocked> {
    fetch_version_task_queues(client, namespace, deployment_name, build_id)
        .await
        .map_err(|err| fetch_blocked(&err, namespace, deployment_name))
}

/// [`version_task_queues`] with the typed error.
pub async fn fetch_version_task_queues(
    client: &TemporalClient,
    namespace: &str,
    deployment_name: &str,
    build_id: &str,
) -> Result<Option<Vec<(String, TaskQueueKind)>>, TemporalError> {
    let described = with_busy_retries(deployment_name, || {
        describe_version_once(client, namespace, deployment_name, build_id)
    })
    .await?;
    Ok(described.map(|d| d.task_queues))
}

/// What a `DescribeWorkerDeploymentVersion` says that the engine uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct DescribedVersion {
    /// Task queues the version polled, sorted.
    task_queues: Vec<(String, TaskQueueKind)>,
    /// The version's own drainage status, when it has one.
    drainage: Option<VersionDrainageStatus>,
    /// When that status last changed.
    drained_since: Option<i64>,
}

async fn describe_version_once(
    client: &TemporalClient,
    namespace: &str,
    deployment_name: &str,
    build_id: &str,
) -> Result<Option<DescribedVersion>, TemporalError> {
    let response =
        describe_version_response(client, namespace, deployment_name, build_id, false).await?;
    Ok(response.map(|r| described_from_response(&r)))
}

/// One `DescribeWorkerDeploymentVersion`, paid from the namespace's read budget; `None` when
/// Temporal does not know the version (or its deployment). With `report_task_queue_stats` the
/// server adds each task queue's statistics.
pub(crate) async fn describe_version_response(
    client: &TemporalClient,
    namespace: &str,
    deployment_name: &str,
    build_id: &str,
    report_task_queue_stats: bool,
) -> Result<Option<DescribeWorkerDeploymentVersionResponse>, TemporalError> {
    client.acquire_read().await;
    let request = read_request(DescribeWorkerDeploymentVersionRequest {
        namespace: namespace.to_owned(),
        deployment_version: Some(version_ref(deployment_name, build_id)),
        report_task_queue_stats,
        ..Default::default()
    });
    let mut raw = client.raw().clone();
    match client
        .observe(
            "DescribeWorkerDeploymentVersion",
            WorkflowService::describe_worker_deployment_version(&mut raw, request),
        )
        .await
    {
        Ok(response) => Ok(Some(response.into_inner())),
        Err(status) => {
            let err = client.rpc_error(
                "DescribeWorkerDeploymentVersion",
                format!("{deployment_name}:{build_id}"),
                &status,
            );
            if err.class() == StatusClass::NotFound {
                Ok(None)
            } else {
                Err(err)
            }
        }
    }
}

/// What the engine uses of a version's description.
fn described_from_response(response: &DescribeWorkerDeploymentVersionResponse) -> DescribedVersion {
    let mut queues: Vec<(String, TaskQueueKind)> = response
        .version_task_queues
        .iter()
        .filter_map(|q| Some((q.name.clone(), task_queue_kind(q.r#type)?)))
        .collect();
    if queues.is_empty() {
        // Older servers only fill the info's list.
        queues = response
            .worker_deployment_version_info
            .iter()
            .flat_map(|info| &info.task_queue_infos)
            .filter_map(|q| Some((q.name.clone(), task_queue_kind(q.r#type)?)))
            .collect();
    }
    queues.sort();
    queues.dedup();
    let drainage_info = response
        .worker_deployment_version_info
        .as_ref()
        .and_then(|info| info.drainage_info.as_ref());
    DescribedVersion {
        task_queues: queues,
        drainage: drainage_info.and_then(|d| VersionDrainageStatus::try_from(d.status).ok()),
        drained_since: drainage_info.and_then(|d| millis(d.last_changed_time.as_ref())),
    }
}

/// The kind of a task queue type; `None` when unspecified (or unknown to this build).
pub(crate) fn task_queue_kind(raw: i32) -> Option<TaskQueueKind> {
    match TaskQueueType::try_from(raw).ok()? {
        TaskQueueType::Workflow => Some(TaskQueueKind::Workflow),
        TaskQueueType::Activity => Some(TaskQueueKind::Activity),
        TaskQueueType::Nexus => Some(TaskQueueKind::Nexus),
        TaskQueueType::Unspecified => None,
    }
}

/// Maps a describe response (exposed for unit tests of the mapping).
pub(crate) fn state_from_response(response: DescribeWorkerDeploymentResponse) -> TemporalState {
    let conflict_token = encode_token(&response.conflict_token);
    let Some(info) = response.worker_deployment_info else {
        return TemporalState {
            exists: true,
            conflict_token,
            ..TemporalState::default()
        };
    };
    state_from_info(info, conflict_token)
}

fn state_from_info(info: WorkerDeploymentInfo, conflict_token: String) -> TemporalState {
    let routing = info.routing_config.unwrap_or_default();
    let current_build_id = current_build(&routing);
    let ramping_build_id = ramping_build(&routing);
    let (ramp_percentage, ramping_since, ramp_changed_at) = if ramping_build_id.is_some() {
        (
            Some(routing.ramping_version_percentage),
            millis(routing.ramping_version_changed_time.as_ref()),
            millis(routing.ramping_version_percentage_changed_time.as_ref()),
        )
    } else {
        (None, None, None)
    };
    let versions = info
        .version_summaries
        .iter()
        .filter_map(|s| {
            version_from_summary(s, current_build_id.as_deref(), ramping_build_id.as_deref())
        })
        .collect();
    TemporalState {
        exists: true,
        current_build_id,
        ramping_build_id,
        ramp_percentage,
        ramping_since,
        ramp_changed_at,
        versions,
        manager_identity: info.manager_identity,
        last_modifier_identity: info.last_modifier_identity,
        conflict_token,
        routing_update_in_progress: info.routing_config_update_state
            == RoutingConfigUpdateState::InProgress as i32,
    }
}

fn current_build(routing: &RoutingConfig) -> Option<String> {
    routing
        .current_deployment_version
        .as_ref()
        .map(|v| v.build_id.clone())
        .filter(|b| !b.is_empty())
}

fn ramping_build(routing: &RoutingConfig) -> Option<String> {
    routing
        .ramping_deployment_version
        .as_ref()
        .map(|v| v.build_id.clone())
        .filter(|b| !b.is_empty())
}

fn version_from_summary(
    summary: &WorkerDeploymentVersionSummary,
    current: Option<&str>,
    ramping: Option<&str>,
) -> Option<TemporalVersion> {
    let build_id = summary
        .deployment_version
        .as_ref()
        .map(|v| v.build_id.clone())
        .filter(|b| !b.is_empty())?;
    let drainage = summary.drainage_info.as_ref();
    let drainage_status = drainage.map_or(summary.drainage_status, |d| d.status);
    let drainage_status = VersionDrainageStatus::try_from(drainage_status)
        .unwrap_or(VersionDrainageStatus::Unspecified);
    let state = match WorkerDeploymentVersionStatus::try_from(summary.status)
        .unwrap_or(WorkerDeploymentVersionStatus::Unspecified)
    {
        WorkerDeploymentVersionStatus::Current => VersionState::Current,
        WorkerDeploymentVersionStatus::Ramping => VersionState::Ramping,
        WorkerDeploymentVersionStatus::Draining => VersionState::Draining,
        WorkerDeploymentVersionStatus::Drained => VersionState::Drained,
        WorkerDeploymentVersionStatus::Inactive => VersionState::Inactive,
        // Pre-registered with CreateWorkerDeploymentVersion; no worker has polled yet.
        WorkerDeploymentVersionStatus::Created => VersionState::NotRegistered,
        // Servers without the status field: derive it like the Go controller.
        WorkerDeploymentVersionStatus::Unspecified => {
            if current == Some(build_id.as_str()) {
                VersionState::Current
            } else if ramping == Some(build_id.as_str()) {
                VersionState::Ramping
            } else {
                match drainage_status {
                    VersionDrainageStatus::Draining => VersionState::Draining,
                    VersionDrainageStatus::Drained => VersionState::Drained,
                    VersionDrainageStatus::Unspecified => VersionState::Inactive,
                }
            }
        }
    };
    let deactivated_at = millis(summary.last_deactivation_time.as_ref());
    let last_checked = drainage.and_then(|d| millis(d.last_checked_time.as_ref()));
    // Known when the server checked drainage after the version last left routing. Right after
    // SetCurrent/ClearRamp the server already reports Draining, before any check.
    let drainage_known = match deactivated_at {
        // Never left routing: there is nothing to drain.
        None => true,
        Some(deactivated) => match last_checked {
            Some(checked) => checked >= deactivated,
            None => state == VersionState::Drained,
        },
    };
    let drained_since = if state == VersionState::Drained {
        drainage.and_then(|d| millis(d.last_changed_time.as_ref()))
    } else {
        None
    };
    Some(TemporalVersion {
        build_id,
        state,
        drained_since,
        drainage_known,
        last_current_at: millis(summary.last_current_time.as_ref()),
        deactivated_at,
    })
}

#[cfg(test)]
mod tests {
    use temporalio_common::protos::temporal::api::deployment::v1::VersionDrainageInfo;

    use super::*;

    fn ts(seconds: i64) -> Option<prost_wkt_types::Timestamp> {
        Some(prost_wkt_types::Timestamp { seconds, nanos: 0 })
    }

    fn summary(
        build: &str,
        status: WorkerDeploymentVersionStatus,
    ) -> WorkerDeploymentVersionSummary {
        WorkerDeploymentVersionSummary {
            deployment_version: Some(version_ref("d", build)),
            status: status as i32,
            ..Default::default()
        }
    }

    #[test]
    fn maps_routing_and_versions() {
        let mut drained = summary("v0", WorkerDeploymentVersionStatus::Drained);
        drained.last_deactivation_time = ts(100);
        drained.last_current_time = ts(90);
        drained.drainage_info = Some(VersionDrainageInfo {
            status: VersionDrainageStatus::Drained as i32,
            last_changed_time: ts(200),
            last_checked_time: ts(210),
        });
        let mut draining = summary("v1", WorkerDeploymentVersionStatus::Draining);
        draining.last_deactivation_time = ts(300);
        draining.drainage_info = Some(VersionDrainageInfo {
            status: VersionDrainageStatus::Draining as i32,
            last_changed_time: ts(300),
            last_checked_time: ts(250),
        });
        let mut demoted = summary("v5", WorkerDeploymentVersionStatus::Draining);
        demoted.last_deactivation_time = ts(500);
        let info = WorkerDeploymentInfo {
            version_summaries: vec![
                drained,
                draining,
                summary("v2", WorkerDeploymentVersionStatus::Current),
                summary("v3", WorkerDeploymentVersionStatus::Ramping),
                summary("v4", WorkerDeploymentVersionStatus::Created),
                demoted,
            ],
            routing_config: Some(RoutingConfig {
                current_deployment_version: Some(version_ref("d", "v2")),
                ramping_deployment_version: Some(version_ref("d", "v3")),
                ramping_version_percentage: 25.0,
                ramping_version_changed_time: ts(350),
                ramping_version_percentage_changed_time: ts(400),
                ..Default::default()
            }),
            manager_identity: "me".to_owned(),
            last_modifier_identity: "me".to_owned(),
            routing_config_update_state: RoutingConfigUpdateState::InProgress as i32,
            ..Default::default()
        };
        let state = state_from_response(DescribeWorkerDeploymentResponse {
            conflict_token: vec![1, 2, 3],
            worker_deployment_info: Some(info),
        });
        assert!(state.exists);
        assert_eq!(state.current_build_id.as_deref(), Some("v2"));
        assert_eq!(state.ramping_build_id.as_deref(), Some("v3"));
        assert_eq!(state.ramp_percentage, Some(25.0));
        assert_eq!(state.ramping_since, Some(350_000));
        assert_eq!(state.ramp_changed_at, Some(400_000));
        assert_eq!(state.conflict_token, "AQID");
        assert!(state.routing_update_in_progress);
        assert_eq!(state.manager_identity, "me");

        let v0 = state.version("v0").expect("v0");
        assert_eq!(v0.state, VersionState::Drained);
        assert_eq!(v0.drained_since, Some(200_000));
        assert!(v0.drainage_known);
        assert_eq!(v0.last_current_at, Some(90_000));
        assert_eq!(v0.deactivated_at, Some(100_000));

        let v1 = state.version("v1").expect("v1");
        assert_eq!(v1.state, VersionState::Draining);
        assert!(!v1.drainage_known, "no check since deactivation");
        assert_eq!(v1.drained_since, None);

        assert_eq!(
            state.version("v2").map(|v| v.state),
            Some(VersionState::Current)
        );
        assert_eq!(
            state.version("v3").map(|v| v.state),
            Some(VersionState::Ramping)
        );
        assert_eq!(
            state.version("v4").map(|v| v.state),
            Some(VersionState::NotRegistered)
        );
        assert!(state.version("v2").is_some_and(|v| v.drainage_known));
        let v5 = state.version("v5").expect("v5");
        assert!(!v5.drainage_known, "demoted, never checked: {v5:?}");
    }

    #[test]
    fn busy_deployments_are_told_apart_from_rate_limits() {
        use temporalio_client::tonic::Status;
        let busy = TemporalError::rpc(
            "DescribeWorkerDeployment",
            "ns/d",
            &Status::resource_exhausted(
                "too many requests issued to Worker Deployment 'ns/d'. Please try again later",
            ),
        );
        assert!(is_busy_deployment(&busy));
        let limited = TemporalError::rpc(
            "DescribeWorkerDeployment",
            "ns/d",
            &Status::resource_exhausted("namespace rate limit exceeded"),
        );
        assert!(!is_busy_deployment(&limited));
        let other =
            TemporalError::rpc("DescribeWorkerDeployment", "ns/d", &Status::unavailable(""));
        assert!(!is_busy_deployment(&other));
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_deployment_is_read_again_at_growing_jittered_intervals_within_the_patience() {
        use std::sync::{Mutex, PoisonError};
        use temporalio_client::tonic::Status;
        let tries = Mutex::new(Vec::new());
        let started = tokio::time::Instant::now();
        let result: Result<(), TemporalError> = with_busy_retries("ns/d", || {
            tries
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(started.elapsed());
            async {
                Err(TemporalError::rpc(
                    "DescribeWorkerDeployment",
                    "ns/d",
                    &Status::resource_exhausted(
                        "too many requests issued to Worker Deployment 'ns/d'. Please try again later",
                    ),
                ))
            }
        })
        .await;
        assert!(result.is_err_and(|e| is_busy_deployment(&e)));
        let tries = tries.into_inner().unwrap_or_else(PoisonError::into_inner);
        let gaps: Vec<Duration> = tries.windows(2).map(|w| w[1] - w[0]).collect();
        // Each wait is its exponential step (0.1, 0.2, 0.4, ... s, at most 1 s) plus a jitter
        // of up to as much again (to the millisecond: backon computes in f32); all of them
        // within the patience.
        assert!(gaps.len() >= 3, "{gaps:?}");
        let slack = Duration::from_millis(1);
        for (i, gap) in gaps.iter().enumerate() {
            let step = (BUSY_FIRST_DELAY * 2u32.pow(i as u32)).min(BUSY_MAX_DELAY);
            assert!(
                *gap + slack >= step && *gap <= step * 2 + slack,
                "wait {i}: {gap:?} for {step:?}"
            );
        }
        // backon keeps the sum of the waits it asks for within the patience; tokio's timer
        // rounds each sleep up to its next millisecond, so the clock may pass it by up to 1 ms
        // a wait (4.001 s seen in CI with 6 waits).
        let rounding = slack * u32::try_from(gaps.len()).unwrap_or(u32::MAX);
        assert!(
            started.elapsed() <= BUSY_PATIENCE + rounding,
            "{:?} after {} waits",
            started.elapsed(),
            gaps.len()
        );
    }

    #[test]
    fn a_missing_namespace_is_named_in_the_message() {
        use temporalio_client::tonic::Status;
        let err = TemporalError::rpc(
            "DescribeWorkerDeployment",
            "ns/d",
            &Status::not_found("Namespace nope is not found."),
        );
        let blocked = fetch_blocked(&err, "nope", "ns/d");
        assert_eq!(blocked.reason, BlockReason::TemporalStateFetchFailed);
        assert!(
            blocked
                .message
                .starts_with("Temporal namespace 'nope' does not exist"),
            "{}",
            blocked.message
        );
    }

    #[test]
    fn unspecified_status_falls_back_to_routing_and_drainage() {
        let mut old = summary("a", WorkerDeploymentVersionStatus::Unspecified);
        old.drainage_status = VersionDrainageStatus::Draining as i32;
        let info = WorkerDeploymentInfo {
            version_summaries: vec![
                summary("c", WorkerDeploymentVersionStatus::Unspecified),
                old,
                summary("i", WorkerDeploymentVersionStatus::Unspecified),
            ],
            routing_config: Some(RoutingConfig {
                current_deployment_version: Some(version_ref("d", "c")),
                ..Default::default()
            }),
            ..Default::default()
        };
        let state = state_from_info(info, String::new());
        assert_eq!(
            state.version("c").map(|v| v.state),
            Some(VersionState::Current)
        );
        assert_eq!(
            state.version("a").map(|v| v.state),
            Some(VersionState::Draining)
        );
        assert_eq!(
            state.version("i").map(|v| v.state),
            Some(VersionState::Inactive)
        );
        assert_eq!(state.ramping_build_id, None);
        assert_eq!(state.ramp_percentage, None);
    }

    fn draining(deactivated_at: Option<i64>) -> TemporalVersion {
        TemporalVersion {
            build_id: "v1".into(),
            state: VersionState::Draining,
            drained_since: None,
            drainage_known: true,
            last_current_at: Some(1_000),
            deactivated_at,
        }
    }

    #[test]
    fn only_versions_draining_for_long_are_confirmed() {
        let now = 100_000;
        assert!(draining_for_long(&draining(Some(now - 10_001)), now));
        assert!(!draining_for_long(&draining(Some(now - 10_000)), now));
        assert!(!draining_for_long(&draining(None), now));
        let mut drained = draining(Some(0));
        drained.state = VersionState::Drained;
        assert!(!draining_for_long(&drained, now));
    }

    #[test]
    fn the_versions_own_drained_status_wins_over_a_stale_summary() {
        let mut version = draining(Some(5_000));
        apply_version_drainage(
            &mut version,
            &DescribedVersion {
                drainage: Some(VersionDrainageStatus::Drained),
                drained_since: Some(7_000),
                ..Default::default()
            },
        );
        assert_eq!(version.state, VersionState::Drained);
        assert_eq!(version.drained_since, Some(7_000));
        assert!(version.drainage_known);

        // Still draining (or no word) leaves the summary's status.
        for drainage in [Some(VersionDrainageStatus::Draining), None] {
            let mut version = draining(Some(5_000));
            apply_version_drainage(
                &mut version,
                &DescribedVersion {
                    drainage,
                    ..Default::default()
                },
            );
            assert_eq!(version, draining(Some(5_000)));
        }
    }
}
