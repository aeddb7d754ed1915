//! Draining a retired version on purpose: counting the open workflows pinned to it and acting on
//! them with one Temporal batch operation per step (signal, cancel, terminate, or a pinned
//! versioning override to the Current version).
//!
//! Workflows are selected by the search attributes the server maintains for Worker Versioning
//! ([`pinned_workflows_query`]), so a step never reaches workflows of another version or of
//! another worker deployment. A step runs under a job ID derived from the TWD, the build, the
//! time the version left routing and the action ([`drain_job_id`]): a retry after a crash finds
//! its job and waits for it instead of starting a second one. A step is refused while the build
//! is Current or Ramping ([`check_drainable`]).

use std::time::Duration;

use temporalio_client::{grpc::WorkflowService, tonic::IntoRequest};
use temporalio_common::protos::temporal::api::{
    batch::v1::{
        BatchOperationCancellation, BatchOperationSignal, BatchOperationTermination,
        BatchOperationUpdateWorkflowExecutionOptions,
    },
    enums::v1::BatchOperationState,
    workflow::v1::{WorkflowExecutionInfo, WorkflowExecutionOptions},
    workflowservice::v1::{
        CountWorkflowExecutionsRequest, CountWorkflowExecutionsResponse,
        DescribeBatchOperationRequest, DescribeBatchOperationResponse,
        ListWorkflowExecutionsRequest, StartBatchOperationRequest, StopBatchOperationRequest,
        start_batch_operation_request::Operation,
    },
};
use tracing::{debug, info, warn};
use twc_crds::worker_deployment::VersionState;
use twc_workflows::{
    contract::{DrainAction, DrainOutcome, PinnedCount},
    model::{TemporalState, UnixMillis},
};

use crate::temporal::{
    convert::{millis, read_request},
    describe::fetch_worker_deployment,
    error::{StatusClass, TemporalError},
    gate::pinned_override,
    pool::{QueryFeature, TemporalClient},
    query::{UnsafeQueryValue, quote, quote_list},
};

/// How often a running batch operation is described.
pub const BATCH_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Page size of the listing that finds the oldest workflow when the visibility store cannot
/// order by start time.
const OLDEST_SCAN_PAGE: i32 = 100;
/// Length of the TWD UID prefix in a job ID (enough to tell a recreated TWD from its
/// predecessor).
const UID_PREFIX_LEN: usize = 8;

/// Why a drain step or count could not be done.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DrainError {
    /// A name or filter value cannot be written into a visibility query safely.
    #[error("cannot put {what} {value:?} into a visibility query: {reason}")]
    UnsafeQueryValue {
        /// What the value is (workflow type, build ID, ...).
        what: &'static str,
        /// The value.
        value: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// The step must not run in the deployment's current state (the build is Current or
    /// Ramping again, or the Current version is not the one to move to).
    #[error("drain of version {build_id} of worker deployment {deployment_name} refused: {reason}")]
    Refused {
        /// Worker deployment name.
        deployment_name: String,
        /// The build to drain.
        build_id: String,
        /// Why.
        reason: String,
    },
    /// A call to Temporal failed.
    #[error(transparent)]
    Temporal(#[from] TemporalError),
    /// The batch operation ended as Failed (stopped, or failed on the server).
    #[error(
        "batch operation {job_id} ended as failed ({succeeded} of {matched} succeeded, \
         {failed} failed): {reason}"
    )]
    BatchFailed {
        /// Batch job ID.
        job_id: String,
        /// Workflows the batch matched.
        matched: u64,
        /// Operations that succeeded.
        succeeded: u64,
        /// Operations that failed.
        failed: u64,
        /// The server's reason, if any.
        reason: String,
    },
    /// The batch job the step started is not found right after (retry the step).
    #[error("batch operation {job_id} is not found right after it was started")]
    BatchVanished {
        /// Batch job ID.
        job_id: String,
    },
    /// The step was cancelled while its batch ran; the batch was stopped.
    #[error("drain step {job_id} cancelled; its batch operation was stopped")]
    Cancelled {
        /// Batch job ID.
        job_id: String,
    },
}

impl DrainError {
    /// Retrying the same step later may succeed without anyone changing anything.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Temporal(err) => err.is_transient() || err.needs_eviction(),
            Self::BatchVanished { .. } => true,
            _ => false,
        }
    }

    /// A short type name for failures reported to the workflow.
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::UnsafeQueryValue { .. } => "DrainQueryInvalid",
            Self::Refused { .. } => "DrainRefused",
            Self::Temporal(_) => "DrainCallFailed",
            Self::BatchFailed { .. } | Self::BatchVanished { .. } => "DrainBatchFailed",
            Self::Cancelled { .. } => "DrainCancelled",
        }
    }
}

impl From<UnsafeQueryValue> for DrainError {
    fn from(err: UnsafeQueryValue) -> Self {
        Self::UnsafeQueryValue {
            what: err.what,
            value: err.value,
            reason: err.reason,
        }
    }
}

/// The visibility query of the open workflows pinned to `build_id` of `deployment_name`, of the
/// types in `include` (all when empty) and not in `exclude`:
///
/// `TemporalWorkerDeploymentVersion = '<deployment>:<build>' AND
/// TemporalWorkflowVersioningBehavior = 'Pinned' AND ExecutionStatus = 'Running'`, then
/// `AND WorkflowType IN (...)` and `AND WorkflowType NOT IN (...)` when given (on one line).
///
/// Values are quoted by [`quote`], which refuses those the stores cannot match reliably.
pub fn pinned_workflows_query(
    deployment_name: &str,
    build_id: &str,
    include: &[String],
    exclude: &[String],
) -> Result<String, DrainError> {
    let version = quote(
        "worker deployment version",
        &format!("{deployment_name}:{build_id}"),
    )?;
    let mut query = format!(
        "TemporalWorkerDeploymentVersion = {version} AND \
         TemporalWorkflowVersioningBehavior = 'Pinned' AND ExecutionStatus = 'Running'"
    );
    if !include.is_empty() {
        query.push_str(&format!(" AND WorkflowType IN ({})", quote_list(include)?));
    }
    if !exclude.is_empty() {
        query.push_str(&format!(
            " AND WorkflowType NOT IN ({})",
            quote_list(exclude)?
        ));
    }
    Ok(query)
}

/// The batch job ID of a drain step:
/// `drain/<deployment>/<build>/<action>[/r<left routing, Unix ms>][/<TWD UID prefix>]`, with
/// characters other than ASCII letters, digits and `._:/@-` replaced by `_`.
///
/// The time the version left routing tells a retirement from a later one (after a rollback and a
/// new rollout the same build is retired again, and its steps must run again); the UID tells a
/// TWD from an earlier one of the same name. Both stay the same across retries of a step.
pub fn drain_job_id(
    deployment_name: &str,
    build_id: &str,
    action: &DrainAction,
    retired_at: Option<UnixMillis>,
    twd_uid: &str,
) -> String {
    let mut id = format!(
        "drain/{deployment_name}/{build_id}/{}",
        action_label(action)
    );
    if let Some(at) = retired_at {
        id.push_str(&format!("/r{at}"));
    }
    let uid: String = twd_uid.chars().take(UID_PREFIX_LEN).collect();
    if !uid.is_empty() {
        id.push('/');
        id.push_str(&uid);
    }
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._:/@-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// `signal`, `cancel`, `terminate` or `move-to-<current build>`.
fn action_label(action: &DrainAction) -> String {
    match action {
        DrainAction::Signal { .. } => "signal".to_owned(),
        DrainAction::Cancel => "cancel".to_owned(),
        DrainAction::Terminate => "terminate".to_owned(),
        DrainAction::MoveToCurrent { current_build_id } => format!("move-to-{current_build_id}"),
    }
}

/// What the action does, in words (batch reasons, logs).
fn action_words(action: &DrainAction) -> String {
    match action {
        DrainAction::Signal { name } => format!("signal '{name}' to"),
        DrainAction::Cancel => "cancel".to_owned(),
        DrainAction::Terminate => "terminate".to_owned(),
        DrainAction::MoveToCurrent { current_build_id } => {
            format!("pin to Current version {current_build_id}")
        }
    }
}

/// Whether a step may act on `build_id` in the deployment's current state; on success, when
/// the version left routing (part of the job ID). Refused while the build is Current or
/// Ramping (a rollback brought it back: its workflows are live traffic again), and, for
/// [`DrainAction::MoveToCurrent`], unless the target is the Current version and not the build
/// itself. A deployment Temporal does not know has nothing pinned to it: allowed.
pub fn check_drainable(
    state: &TemporalState,
    deployment_name: &str,
    build_id: &str,
    action: &DrainAction,
) -> Result<Option<UnixMillis>, DrainError> {
    let refuse = |reason: String| DrainError::Refused {
        deployment_name: deployment_name.to_owned(),
        build_id: build_id.to_owned(),
        reason,
    };
    let version = state.version(build_id);
    let in_routing = state.current_build_id.as_deref() == Some(build_id)
        || state.ramping_build_id.as_deref() == Some(build_id)
        || version
            .is_some_and(|v| matches!(v.state, VersionState::Current | VersionState::Ramping));
    if in_routing {
        return Err(refuse(
            "the version is Current or Ramping again, so its workflows are live traffic".to_owned(),
        ));
    }
    if let DrainAction::MoveToCurrent { current_build_id } = action {
        if current_build_id == build_id {
            return Err(refuse(format!(
                "cannot move workflows of {build_id} to the same build"
            )));
        }
        if state.current_build_id.as_deref() != Some(current_build_id.as_str()) {
            return Err(refuse(format!(
                "workflows were to be moved to {current_build_id}, but the Current version is {}",
                state.current_build_id.as_deref().unwrap_or("unversioned")
            )));
        }
    }
    Ok(version.and_then(|v| v.deactivated_at))
}

/// The batch operation of an action: a signal with no input, a cancellation, a termination, or
/// an options update setting a pinned versioning override to `<deployment>:<current build>`.
fn batch_operation(action: &DrainAction, deployment_name: &str, identity: &str) -> Operation {
    let identity = identity.to_owned();
    match action {
        DrainAction::Signal { name } => Operation::SignalOperation(BatchOperationSignal {
            signal: name.clone(),
            identity,
            ..Default::default()
        }),
        DrainAction::Cancel => {
            Operation::CancellationOperation(BatchOperationCancellation { identity })
        }
        DrainAction::Terminate => Operation::TerminationOperation(BatchOperationTermination {
            identity,
            details: None,
        }),
        DrainAction::MoveToCurrent { current_build_id } => {
            Operation::UpdateWorkflowOptionsOperation(
                BatchOperationUpdateWorkflowExecutionOptions {
                    identity,
                    workflow_execution_options: Some(WorkflowExecutionOptions {
                        versioning_override: Some(pinned_override(
                            deployment_name,
                            current_build_id,
                        )),
                        ..Default::default()
                    }),
                    update_mask: Some(prost_wkt_types::FieldMask {
                        paths: vec!["versioning_override".to_owned()],
                    }),
                },
            )
        }
    }
}

/// Counts the open workflows pinned to `build_id` (one CountWorkflowExecutions) and finds the
/// oldest one's start time (see [`oldest_start_time`]; no listing when none is open). Every
/// call is paid from the namespace's read budget.
pub async fn count_pinned(
    client: &TemporalClient,
    namespace: &str,
    deployment_name: &str,
    build_id: &str,
    include: &[String],
    exclude: &[String],
) -> Result<PinnedCount, DrainError> {
    let query = pinned_workflows_query(deployment_name, build_id, include, exclude)?;
    let open = count_workflows(client, namespace, &query).await?;
    let oldest_started_at = if open == 0 {
        None
    } else {
        oldest_start_time(client, namespace, &query).await?
    };
    Ok(PinnedCount {
        query,
        open,
        oldest_started_at,
    })
}

/// The number of workflows `query` matches.
pub(crate) async fn count_workflows(
    client: &TemporalClient,
    namespace: &str,
    query: &str,
) -> Result<u64, TemporalError> {
    let response = count_executions(client, namespace, query).await?;
    Ok(u64::try_from(response.count).unwrap_or(0))
}

/// One CountWorkflowExecutions of `query` (grouped when it says `GROUP BY`), paid from the
/// read budget.
pub(crate) async fn count_executions(
    client: &TemporalClient,
    namespace: &str,
    query: &str,
) -> Result<CountWorkflowExecutionsResponse, TemporalError> {
    client.acquire_read().await;
    let request = read_request(CountWorkflowExecutionsRequest {
        namespace: namespace.to_owned(),
        query: query.to_owned(),
    });
    let mut raw = client.raw().clone();
    let response = client
        .observe(
            "CountWorkflowExecutions",
            WorkflowService::count_workflow_executions(&mut raw, request),
        )
        .await
        .map_err(|s| client.rpc_error("CountWorkflowExecutions", query, &s))?;
    Ok(response.into_inner())
}

/// Start time of the oldest workflow the query matches, with one ListWorkflowExecutions:
/// `ORDER BY StartTime ASC` with page size 1 where the visibility store supports it. Stores
/// that refuse `ORDER BY` (the SQL stores, including the dev server's SQLite; the refusal is
/// remembered per connection) list newest first: there the smallest start time of one page of up
/// to 100 is taken, which is the oldest when at most 100 are open and otherwise the oldest of
/// the 100 most recently started (the true oldest is at least as old).
pub async fn oldest_start_time(
    client: &TemporalClient,
    namespace: &str,
    query: &str,
) -> Result<Option<UnixMillis>, TemporalError> {
    if !client.refuses(QueryFeature::OrderBy) {
        let ordered = format!("{query} ORDER BY StartTime ASC");
        match start_times(client, namespace, &ordered, 1).await {
            Ok(times) => return Ok(times.into_iter().min()),
            Err(err) if refuses_order_by(&err) => {
                debug!(error = %err, "visibility store cannot order by start time; scanning one page");
                client.mark_refused(QueryFeature::OrderBy);
            }
            Err(err) => return Err(err),
        }
    }
    Ok(start_times(client, namespace, query, OLDEST_SCAN_PAGE)
        .await?
        .into_iter()
        .min())
}

fn refuses_order_by(err: &TemporalError) -> bool {
    err.class() == StatusClass::Other
        && err
            .server_message()
            .to_ascii_uppercase()
            .contains("ORDER BY")
}

/// Start times of the first page of a listing.
async fn start_times(
    client: &TemporalClient,
    namespace: &str,
    query: &str,
    page_size: i32,
) -> Result<Vec<UnixMillis>, TemporalError> {
    Ok(first_page(client, namespace, query, page_size)
        .await?
        .iter()
        .filter_map(|e| millis(e.start_time.as_ref()))
        .collect())
}

/// The first page (at most `page_size`) of the executions `query` matches: one
/// ListWorkflowExecutions, paid from the read budget.
pub(crate) async fn first_page(
    client: &TemporalClient,
    namespace: &str,
    query: &str,
    page_size: i32,
) -> Result<Vec<WorkflowExecutionInfo>, TemporalError> {
    client.acquire_read().await;
    let request = read_request(ListWorkflowExecutionsRequest {
        namespace: namespace.to_owned(),
        page_size,
        next_page_token: Vec::new(),
        query: query.to_owned(),
    });
    let mut raw = client.raw().clone();
    let response = client
        .observe(
            "ListWorkflowExecutions",
            WorkflowService::list_workflow_executions(&mut raw, request),
        )
        .await
        .map_err(|s| client.rpc_error("ListWorkflowExecutions", query, &s))?;
    Ok(response.into_inner().executions)
}

/// One drain step of a retired version.
#[derive(Debug, Clone, Copy)]
pub struct DrainStep<'a> {
    /// Temporal namespace.
    pub namespace: &'a str,
    /// Worker deployment name (`<k8s namespace>/<TWD name>`).
    pub deployment_name: &'a str,
    /// UID of the TWD (a prefix of it goes into the job ID).
    pub twd_uid: &'a str,
    /// The retired build.
    pub build_id: &'a str,
    /// What to do.
    pub action: &'a DrainAction,
    /// Only these workflow types (empty: all).
    pub include_types: &'a [String],
    /// Never these workflow types.
    pub exclude_types: &'a [String],
    /// Operations per second of the batch (0: the server's default, `worker.batcherRPS`).
    pub rate: u32,
    /// Count only.
    pub dry_run: bool,
}

/// Runs a drain step: reads the worker deployment and refuses per [`check_drainable`]; in
/// dry-run counts the matching workflows and returns (no job); otherwise attaches to the step's
/// batch job if it exists (a retry) or starts it, then describes it every
/// [`BATCH_POLL_INTERVAL`] until it completes, and returns its counts. `cancelled` is asked
/// before each poll: when it says so the batch is stopped and [`DrainError::Cancelled`]
/// returned; a later run of the same step finds the stopped job and fails with
/// [`DrainError::BatchFailed`] (it never starts the job again).
pub async fn drain_version(
    client: &TemporalClient,
    step: &DrainStep<'_>,
    cancelled: impl Fn() -> bool,
) -> Result<DrainOutcome, DrainError> {
    let query = pinned_workflows_query(
        step.deployment_name,
        step.build_id,
        step.include_types,
        step.exclude_types,
    )?;
    let state = fetch_worker_deployment(client, step.namespace, step.deployment_name)
        .await?
        .unwrap_or_default();
    let retired_at = check_drainable(&state, step.deployment_name, step.build_id, step.action)?;
    if step.dry_run {
        let matched = count_workflows(client, step.namespace, &query).await?;
        info!(namespace = %step.namespace, deployment_name = %step.deployment_name, build_id = %step.build_id, matched, %query, "drain dry run: counted only");
        return Ok(DrainOutcome {
            query,
            job_id: None,
            matched,
            succeeded: 0,
            failed: 0,
        });
    }
    let job_id = drain_job_id(
        step.deployment_name,
        step.build_id,
        step.action,
        retired_at,
        step.twd_uid,
    );
    if describe_batch(client, step.namespace, &job_id)
        .await?
        .is_some()
    {
        info!(%job_id, "drain batch already exists; attaching to it");
    } else {
        start_batch(client, step, &query, &job_id).await?;
    }
    loop {
        if cancelled() {
            stop_batch(client, step.namespace, &job_id).await?;
            return Err(DrainError::Cancelled { job_id });
        }
        let Some(described) = describe_batch(client, step.namespace, &job_id).await? else {
            return Err(DrainError::BatchVanished { job_id });
        };
        let outcome = outcome_of(&described, &query, &job_id);
        match BatchOperationState::try_from(described.state)
            .unwrap_or(BatchOperationState::Unspecified)
        {
            BatchOperationState::Completed => {
                info!(%job_id, matched = outcome.matched, succeeded = outcome.succeeded, failed = outcome.failed, "drain batch completed");
                return Ok(outcome);
            }
            BatchOperationState::Failed => {
                return Err(DrainError::BatchFailed {
                    job_id,
                    matched: outcome.matched,
                    succeeded: outcome.succeeded,
                    failed: outcome.failed,
                    reason: described.reason,
                });
            }
            BatchOperationState::Running | BatchOperationState::Unspecified => {}
        }
        tokio::time::sleep(crate::backoff::spread(BATCH_POLL_INTERVAL)).await;
    }
}

fn outcome_of(
    described: &DescribeBatchOperationResponse,
    query: &str,
    job_id: &str,
) -> DrainOutcome {
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    DrainOutcome {
        query: query.to_owned(),
        job_id: Some(job_id.to_owned()),
        matched: count(described.total_operation_count),
        succeeded: count(described.complete_operation_count),
        failed: count(described.failure_operation_count),
    }
}

async fn start_batch(
    client: &TemporalClient,
    step: &DrainStep<'_>,
    query: &str,
    job_id: &str,
) -> Result<(), TemporalError> {
    let reason = format!(
        "twc: {} workflows pinned to retired version {} of TemporalWorkerDeployment {}",
        action_words(step.action),
        step.build_id,
        step.deployment_name
    );
    let request = StartBatchOperationRequest {
        namespace: step.namespace.to_owned(),
        visibility_query: query.to_owned(),
        job_id: job_id.to_owned(),
        reason,
        // Rates are small integers: exact in f32.
        max_operations_per_second: step.rate as f32,
        operation: Some(batch_operation(
            step.action,
            step.deployment_name,
            client.identity(),
        )),
        ..Default::default()
    };
    let mut raw = client.raw().clone();
    match client
        .observe(
            "StartBatchOperation",
            WorkflowService::start_batch_operation(&mut raw, request.into_request()),
        )
        .await
    {
        Ok(_) => {
            info!(namespace = %step.namespace, %job_id, %query, rate = step.rate, "started drain batch");
            Ok(())
        }
        // Started by an earlier attempt between our describe and this start.
        Err(status) if status.code() == temporalio_client::tonic::Code::AlreadyExists => {
            info!(%job_id, "drain batch started meanwhile; attaching to it");
            Ok(())
        }
        Err(status) => Err(client.rpc_error("StartBatchOperation", job_id, &status)),
    }
}

/// The batch job, or `None` when the server does not know it.
async fn describe_batch(
    client: &TemporalClient,
    namespace: &str,
    job_id: &str,
) -> Result<Option<DescribeBatchOperationResponse>, TemporalError> {
    client.acquire_read().await;
    let request = read_request(DescribeBatchOperationRequest {
        namespace: namespace.to_owned(),
        job_id: job_id.to_owned(),
    });
    let mut raw = client.raw().clone();
    match client
        .observe(
            "DescribeBatchOperation",
            WorkflowService::describe_batch_operation(&mut raw, request),
        )
        .await
    {
        Ok(response) => Ok(Some(response.into_inner())),
        Err(status) => {
            let err = client.rpc_error("DescribeBatchOperation", job_id, &status);
            if err.class() == StatusClass::NotFound {
                Ok(None)
            } else {
                Err(err)
            }
        }
    }
}

async fn stop_batch(
    client: &TemporalClient,
    namespace: &str,
    job_id: &str,
) -> Result<(), TemporalError> {
    let request = StopBatchOperationRequest {
        namespace: namespace.to_owned(),
        job_id: job_id.to_owned(),
        reason: "twc: drain step cancelled (the version was rolled back to, or the rollout ended)"
            .to_owned(),
        identity: client.identity().to_owned(),
    };
    let mut raw = client.raw().clone();
    match client
        .observe(
            "StopBatchOperation",
            WorkflowService::stop_batch_operation(&mut raw, request.into_request()),
        )
        .await
    {
        Ok(_) => {
            warn!(%namespace, %job_id, "stopped drain batch");
            Ok(())
        }
        Err(status) => {
            let err = client.rpc_error("StopBatchOperation", job_id, &status);
            // Already finished or gone: nothing left to stop.
            if matches!(
                err.class(),
                StatusClass::NotFound | StatusClass::FailedPrecondition
            ) {
                debug!(%job_id, error = %err, "drain batch already over");
                Ok(())
            } else {
                Err(err)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use twc_workflows::model::TemporalVersion;

    use super::*;

    fn types(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    const BASE: &str = "TemporalWorkerDeploymentVersion = 'demo/hello:v1' AND \
                        TemporalWorkflowVersioningBehavior = 'Pinned' AND ExecutionStatus = 'Running'";

    #[test]
    fn the_query_selects_open_pinned_workflows_of_one_version_with_type_filters() {
        let cases: [(&[&str], &[&str], String); 5] = [
            (&[], &[], BASE.to_owned()),
            (
                &["Subscription", "Stubborn"],
                &[],
                format!("{BASE} AND WorkflowType IN ('Subscription', 'Stubborn')"),
            ),
            (
                &[],
                &["Billing"],
                format!("{BASE} AND WorkflowType NOT IN ('Billing')"),
            ),
            (
                &["A", "B", "A"],
                &["B"],
                format!("{BASE} AND WorkflowType IN ('A', 'B') AND WorkflowType NOT IN ('B')"),
            ),
            (
                &["it's"],
                &["O'Brien's"],
                format!(
                    "{BASE} AND WorkflowType IN ('it''s') AND WorkflowType NOT IN ('O''Brien''s')"
                ),
            ),
        ];
        for (include, exclude, expected) in cases {
            let query =
                pinned_workflows_query("demo/hello", "v1", &types(include), &types(exclude))
                    .expect("valid");
            assert_eq!(query, expected, "include {include:?} exclude {exclude:?}");
        }
    }

    #[test]
    fn values_the_stores_cannot_match_reliably_are_refused() {
        for bad in ["a\\b", "q\"q", "line\nbreak", "", "  "] {
            let err = pinned_workflows_query("demo/hello", "v1", &[], &types(&[bad]))
                .expect_err("refused");
            assert!(
                matches!(&err, DrainError::UnsafeQueryValue { what: "workflow type", value, .. } if value == bad),
                "{err:?}"
            );
            assert_eq!(err.type_name(), "DrainQueryInvalid");
        }
        let err = pinned_workflows_query("demo/hello", "v\\1", &[], &[]).expect_err("refused");
        assert!(
            err.to_string()
                .starts_with("cannot put worker deployment version \"demo/hello:v\\\\1\""),
            "{err}"
        );
    }

    #[test]
    fn job_ids_name_the_twd_build_action_and_retirement() {
        let signal = DrainAction::Signal {
            name: "twc-drain".into(),
        };
        let cases = [
            (
                &signal,
                Some(1_700_000_000_000),
                "0d7c9a1e-5b2f-4c55-9d4e-123456789abc",
                "drain/demo/hello/v1/signal/r1700000000000/0d7c9a1e",
            ),
            (&DrainAction::Cancel, None, "", "drain/demo/hello/v1/cancel"),
            (
                &DrainAction::Terminate,
                Some(5),
                "u",
                "drain/demo/hello/v1/terminate/r5/u",
            ),
            (
                &DrainAction::MoveToCurrent {
                    current_build_id: "v2 new".into(),
                },
                None,
                "",
                "drain/demo/hello/v1/move-to-v2_new",
            ),
        ];
        for (action, retired_at, uid, expected) in cases {
            assert_eq!(
                drain_job_id("demo/hello", "v1", action, retired_at, uid),
                expected
            );
        }
        // Deterministic: the same step gives the same ID.
        assert_eq!(
            drain_job_id("demo/hello", "v1", &signal, Some(7), "abc"),
            drain_job_id("demo/hello", "v1", &signal, Some(7), "abc")
        );
    }

    fn version(
        build_id: &str,
        state: VersionState,
        deactivated_at: Option<i64>,
    ) -> TemporalVersion {
        TemporalVersion {
            build_id: build_id.into(),
            state,
            drained_since: None,
            drainage_known: true,
            last_current_at: None,
            deactivated_at,
        }
    }

    fn state(current: Option<&str>, ramping: Option<&str>) -> TemporalState {
        let role = |b: &str| {
            if current == Some(b) {
                VersionState::Current
            } else if ramping == Some(b) {
                VersionState::Ramping
            } else {
                VersionState::Draining
            }
        };
        TemporalState {
            exists: true,
            current_build_id: current.map(str::to_owned),
            ramping_build_id: ramping.map(str::to_owned),
            versions: ["v1", "v2", "v3"]
                .into_iter()
                .map(|b| {
                    version(
                        b,
                        role(b),
                        (role(b) == VersionState::Draining).then_some(42),
                    )
                })
                .collect(),
            ..TemporalState::default()
        }
    }

    #[test]
    fn a_step_is_refused_while_its_build_is_in_routing_or_the_move_target_is_not_current() {
        let move_to = |b: &str| DrainAction::MoveToCurrent {
            current_build_id: b.into(),
        };
        let cancel = DrainAction::Cancel;
        let cases = [
            (state(Some("v2"), None), "v1", cancel.clone(), Ok(Some(42))),
            (
                state(Some("v1"), None),
                "v1",
                cancel.clone(),
                Err("Current or Ramping"),
            ),
            (
                state(Some("v2"), Some("v1")),
                "v1",
                cancel.clone(),
                Err("Current or Ramping"),
            ),
            (state(Some("v2"), None), "v1", move_to("v2"), Ok(Some(42))),
            (
                state(Some("v3"), None),
                "v1",
                move_to("v2"),
                Err("the Current version is v3"),
            ),
            (
                state(Some("v2"), None),
                "v2",
                move_to("v2"),
                Err("Current or Ramping"),
            ),
            (TemporalState::default(), "v1", cancel.clone(), Ok(None)),
        ];
        for (state, build, action, expected) in cases {
            let got = check_drainable(&state, "demo/hello", build, &action);
            match (got, expected) {
                (Ok(at), Ok(want)) => assert_eq!(at, want, "{build} {action:?}"),
                (Err(err), Err(part)) => {
                    assert!(err.to_string().contains(part), "{err}");
                    assert_eq!(err.type_name(), "DrainRefused");
                    assert!(!err.is_transient());
                }
                (got, want) => panic!("{build} {action:?}: got {got:?}, want {want:?}"),
            }
        }
        let err = check_drainable(&state(Some("v2"), None), "d", "v1", &move_to("v1"))
            .expect_err("same build");
        assert!(err.to_string().contains("same build"), "{err}");
    }

    #[test]
    fn each_action_is_its_batch_operation() {
        let op = batch_operation(
            &DrainAction::Signal {
                name: "twc-drain".into(),
            },
            "demo/hello",
            "twc",
        );
        assert!(
            matches!(&op, Operation::SignalOperation(s) if s.signal == "twc-drain" && s.input.is_none() && s.identity == "twc"),
            "{op:?}"
        );
        assert!(matches!(
            batch_operation(&DrainAction::Cancel, "d", "twc"),
            Operation::CancellationOperation(_)
        ));
        assert!(matches!(
            batch_operation(&DrainAction::Terminate, "d", "twc"),
            Operation::TerminationOperation(_)
        ));
        let op = batch_operation(
            &DrainAction::MoveToCurrent {
                current_build_id: "v2".into(),
            },
            "demo/hello",
            "twc",
        );
        let Operation::UpdateWorkflowOptionsOperation(update) = op else {
            panic!("{op:?}");
        };
        assert_eq!(
            update.update_mask.map(|m| m.paths),
            Some(vec!["versioning_override".to_owned()])
        );
        let overridden = update
            .workflow_execution_options
            .and_then(|o| o.versioning_override);
        assert_eq!(overridden, Some(pinned_override("demo/hello", "v2")));
    }

    #[test]
    fn an_order_by_refusal_is_told_apart_from_other_errors() {
        use temporalio_client::tonic::Status;
        let refused = TemporalError::rpc(
            "ListWorkflowExecutions",
            "q",
            &Status::invalid_argument(
                "invalid query: operation is not supported: 'ORDER BY' clause",
            ),
        );
        assert!(refuses_order_by(&refused));
        let other = TemporalError::rpc(
            "ListWorkflowExecutions",
            "q",
            &Status::invalid_argument("invalid query: unknown field"),
        );
        assert!(!refuses_order_by(&other));
        let down = TemporalError::rpc(
            "ListWorkflowExecutions",
            "q",
            &Status::unavailable("ORDER BY"),
        );
        assert!(!refuses_order_by(&down));
    }
}
