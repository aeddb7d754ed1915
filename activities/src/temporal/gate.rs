//! Gate workflows: one per workflow task queue of the new version, pinned to it, started
//! idempotently, awaited with long polls, cancelled on supersede.

use std::time::Duration;

use futures::future::try_join_all;
use temporalio_client::{
    grpc::WorkflowService,
    tonic::{Code, IntoRequest},
};
use temporalio_common::protos::temporal::api::{
    common::v1::{WorkflowExecution, WorkflowType},
    enums::v1::{
        HistoryEventFilterType, TaskQueueKind as ProtoTaskQueueKind, WorkflowExecutionStatus,
        WorkflowIdConflictPolicy, WorkflowIdReusePolicy,
    },
    history::v1::history_event::Attributes,
    taskqueue::v1::TaskQueue,
    workflow::v1::{
        VersioningOverride,
        versioning_override::{Override, PinnedOverride, PinnedOverrideBehavior},
    },
    workflowservice::v1::{
        DescribeWorkflowExecutionRequest, GetWorkflowExecutionHistoryRequest,
        ListWorkflowExecutionsRequest, RequestCancelWorkflowExecutionRequest,
        StartWorkflowExecutionRequest, TerminateWorkflowExecutionRequest,
    },
};
use tracing::{debug, info, warn};
use twc_workflows::{
    contract::{GateRequest, GateRun, StepGateRef},
    model::{BlockReason, Blocked},
};

use crate::temporal::{
    convert::{json_args, version_ref},
    error::{StatusClass, TemporalError},
    pool::TemporalClient,
};

/// Execution timeout of a gate workflow.
pub const GATE_EXECUTION_TIMEOUT: Duration = Duration::from_secs(3600);
/// How often [`wait_gates`] calls its heartbeat.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(5);
/// Consecutive transient failures [`wait_gates`] tolerates per gate before giving up.
const MAX_CONSECUTIVE_ERRORS: u32 = 8;
/// The first wait after a failed poll of a gate.
const ERROR_FIRST_DELAY: Duration = Duration::from_secs(2);
/// The longest wait between failed polls of a gate (before jitter).
const ERROR_MAX_DELAY: Duration = Duration::from_secs(32);

/// The waits between failed polls of a gate: 2 s, 4 s, ... up to 32 s, jittered.
fn error_backoff() -> impl Iterator<Item = Duration> {
    crate::backoff::exponential(ERROR_FIRST_DELAY, ERROR_MAX_DELAY)
}

/// Status string of a running gate.
pub const RUNNING: &str = "Running";
/// Status string of a gate that completed successfully.
pub const COMPLETED: &str = "Completed";

/// Which gate of a build a run is: the rollout's gate or a step gate of one rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateKey {
    /// The rollout's gate (`spec.rollout.gate`), by attempt (a `retry` increments it).
    Rollout {
        /// Attempt number, 1 first.
        attempt: u32,
    },
    /// The gate of a step (`spec.rollout.steps[step].gate`) in one rollout of the build.
    Step(StepGateRef),
}

impl GateKey {
    /// The gate a `run_gate` request asks for.
    pub fn of(request: &GateRequest) -> Self {
        match request.step {
            Some(step) => Self::Step(step),
            None => Self::Rollout {
                attempt: request.attempt,
            },
        }
    }
}

/// Workflow ID of a gate: `gate/<deployment_name>/<build_id>/<task_queue>/<attempt>` for the
/// rollout's gate, `gate/<deployment_name>/<build_id>/<task_queue>/step<step>-<rollout started
/// at>` for a step gate. Both start with [`gate_workflow_id_prefix`], so stopping the gates of a
/// build finds every one of them.
pub fn gate_workflow_id(
    deployment_name: &str,
    build_id: &str,
    task_queue: &str,
    key: GateKey,
) -> String {
    let prefix = gate_workflow_id_prefix(deployment_name, build_id);
    match key {
        GateKey::Rollout { attempt } => format!("{prefix}{task_queue}/{attempt}"),
        GateKey::Step(StepGateRef {
            step,
            rollout_started_at,
        }) => format!("{prefix}{task_queue}/step{step}-{rollout_started_at}"),
    }
}

/// Prefix shared by every gate workflow ID of a build: `gate/<deployment_name>/<build_id>/`.
pub fn gate_workflow_id_prefix(deployment_name: &str, build_id: &str) -> String {
    format!("gate/{deployment_name}/{build_id}/")
}

/// The status string of a workflow execution status (`Running`, `Completed`, `Failed`,
/// `Canceled`, `Terminated`, `TimedOut`; continued-as-new, paused and unknown count as running).
pub fn status_name(status: i32) -> &'static str {
    match WorkflowExecutionStatus::try_from(status).unwrap_or(WorkflowExecutionStatus::Unspecified)
    {
        WorkflowExecutionStatus::Completed => COMPLETED,
        WorkflowExecutionStatus::Failed => "Failed",
        WorkflowExecutionStatus::Canceled => "Canceled",
        WorkflowExecutionStatus::Terminated => "Terminated",
        WorkflowExecutionStatus::TimedOut => "TimedOut",
        WorkflowExecutionStatus::Running
        | WorkflowExecutionStatus::ContinuedAsNew
        | WorkflowExecutionStatus::Paused
        | WorkflowExecutionStatus::Unspecified => RUNNING,
    }
}

/// Starts one gate workflow per task queue (pass the version's *workflow* task queues), pinned to
/// `(deployment_name, build_id)`, with `input` as the single JSON argument (no arguments when
/// `None`). IDs come from [`gate_workflow_id`] with `key`; reuse policy RejectDuplicate and conflict policy
/// UseExisting make a retried call attach to the runs it started before, even once they closed
/// (their current status is returned).
#[allow(clippy::too_many_arguments)]
pub async fn start_gates(
    client: &TemporalClient,
    namespace: &str,
    deployment_name: &str,
    build_id: &str,
    workflow_type: &str,
    input: Option<serde_json::Value>,
    key: GateKey,
    task_queues: &[String],
) -> Result<Vec<GateRun>, StartGateError> {
    let mut runs = Vec::with_capacity(task_queues.len());
    for task_queue in task_queues {
        let gate = Gate {
            namespace,
            deployment_name,
            build_id,
            workflow_type,
            input: input.as_ref(),
            key,
            task_queue,
        };
        let run = start_gate(client, &gate)
            .await
            .map_err(|source| StartGateError {
                workflow_type: workflow_type.to_owned(),
                build_id: build_id.to_owned(),
                task_queue: task_queue.clone(),
                source,
            })?;
        runs.push(run);
    }
    Ok(runs)
}

/// A gate workflow that could not be started.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "Failed to start gate workflow \"{workflow_type}\" (buildID {build_id}, taskQueue {task_queue}): {source}"
)]
pub struct StartGateError {
    /// Workflow type of the gate.
    pub workflow_type: String,
    /// Build the gate was for.
    pub build_id: String,
    /// Task queue it was started on.
    pub task_queue: String,
    /// Why the start failed.
    #[source]
    pub source: TemporalError,
}

impl StartGateError {
    /// Retrying the start later may succeed without anyone changing anything.
    pub fn is_transient(&self) -> bool {
        self.source.is_transient()
    }

    /// The failure as a `PlanExecutionFailed` condition.
    pub fn to_blocked(&self) -> Blocked {
        Blocked {
            reason: BlockReason::PlanExecutionFailed,
            message: self.to_string(),
        }
    }
}

/// One gate workflow to start.
struct Gate<'a> {
    namespace: &'a str,
    deployment_name: &'a str,
    build_id: &'a str,
    workflow_type: &'a str,
    input: Option<&'a serde_json::Value>,
    key: GateKey,
    task_queue: &'a str,
}

/// Size in bytes and top-level keys of a gate input: all that is ever logged of it.
fn input_summary(input: Option<&serde_json::Value>) -> (usize, Vec<String>) {
    let Some(value) = input else {
        return (0, Vec::new());
    };
    let size = serde_json::to_vec(value).map_or(0, |v| v.len());
    let keys = value
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    (size, keys)
}

async fn start_gate(client: &TemporalClient, gate: &Gate<'_>) -> Result<GateRun, TemporalError> {
    let workflow_id = gate_workflow_id(
        gate.deployment_name,
        gate.build_id,
        gate.task_queue,
        gate.key,
    );
    let (input_bytes, input_keys) = input_summary(gate.input);
    let request = StartWorkflowExecutionRequest {
        namespace: gate.namespace.to_owned(),
        workflow_id: workflow_id.clone(),
        workflow_type: Some(WorkflowType {
            name: gate.workflow_type.to_owned(),
        }),
        task_queue: Some(TaskQueue {
            name: gate.task_queue.to_owned(),
            kind: ProtoTaskQueueKind::Normal as i32,
            normal_name: String::new(),
        }),
        input: json_args(gate.input, "gate input")?,
        workflow_execution_timeout: Some(prost_wkt_types::Duration {
            seconds: GATE_EXECUTION_TIMEOUT
                .as_secs()
                .try_into()
                .unwrap_or(i64::MAX),
            nanos: 0,
        }),
        identity: client.identity().to_owned(),
        // Stable, so a retried start is recognised as the same request.
        request_id: workflow_id.clone(),
        workflow_id_reuse_policy: WorkflowIdReusePolicy::RejectDuplicate as i32,
        workflow_id_conflict_policy: WorkflowIdConflictPolicy::UseExisting as i32,
        versioning_override: Some(pinned_override(gate.deployment_name, gate.build_id)),
        ..Default::default()
    };
    let mut raw = client.raw().clone();
    match client
        .observe(
            "StartWorkflowExecution",
            WorkflowService::start_workflow_execution(&mut raw, request.into_request()),
        )
        .await
    {
        Ok(response) => {
            let response = response.into_inner();
            info!(
                namespace = %gate.namespace,
                %workflow_id,
                run_id = %response.run_id,
                workflow_type = %gate.workflow_type,
                started = response.started,
                input_bytes,
                input_keys = ?input_keys,
                "gate workflow started (or attached to)"
            );
            Ok(GateRun {
                workflow_id,
                run_id: response.run_id,
                task_queue: gate.task_queue.to_owned(),
                status: status_name(response.status).to_owned(),
            })
        }
        // A run with this ID already closed (RejectDuplicate): report it.
        Err(status) if status.code() == Code::AlreadyExists => {
            let (run_id, status) = describe_execution(client, gate.namespace, &workflow_id).await?;
            debug!(%workflow_id, %run_id, %status, "gate workflow already ran");
            Ok(GateRun {
                workflow_id,
                run_id,
                task_queue: gate.task_queue.to_owned(),
                status: status.to_owned(),
            })
        }
        Err(status) => Err(client.rpc_error("StartWorkflowExecution", workflow_id, &status)),
    }
}

/// A pinned versioning override to `<deployment_name>:<build_id>`.
pub(crate) fn pinned_override(deployment_name: &str, build_id: &str) -> VersioningOverride {
    VersioningOverride {
        r#override: Some(Override::Pinned(PinnedOverride {
            behavior: PinnedOverrideBehavior::Pinned as i32,
            version: Some(version_ref(deployment_name, build_id)),
        })),
        ..Default::default()
    }
}

/// Run ID and status of the latest run of a workflow ID.
async fn describe_execution(
    client: &TemporalClient,
    namespace: &str,
    workflow_id: &str,
) -> Result<(String, &'static str), TemporalError> {
    let request = DescribeWorkflowExecutionRequest {
        namespace: namespace.to_owned(),
        execution: Some(WorkflowExecution {
            workflow_id: workflow_id.to_owned(),
            run_id: String::new(),
        }),
    };
    let mut raw = client.raw().clone();
    let response = client
        .observe(
            "DescribeWorkflowExecution",
            WorkflowService::describe_workflow_execution(&mut raw, request.into_request()),
        )
        .await
        .map_err(|s| client.rpc_error("DescribeWorkflowExecution", workflow_id, &s))?
        .into_inner();
    let info = response.workflow_execution_info.unwrap_or_default();
    let run_id = info.execution.map(|e| e.run_id).unwrap_or_default();
    Ok((run_id, status_name(info.status)))
}

/// Waits until every run is closed and returns them with their final status (runs already
/// closed are returned as they are). Uses one long poll for the close event per gate (a request
/// about every 20 s while it runs) and follows continue-as-new and retries to the new run.
/// `heartbeat` is called every [`HEARTBEAT_INTERVAL`] while waiting. Gives
/// `Blocked(TemporalStateFetchFailed)` after repeated failures of a poll or if a gate workflow
/// cannot be found.
pub async fn wait_gates(
    client: &TemporalClient,
    namespace: &str,
    runs: Vec<GateRun>,
    heartbeat: impl Fn(),
) -> Result<Vec<GateRun>, Blocked> {
    let waits = try_join_all(
        runs.into_iter()
            .map(|run| wait_gate(client, namespace, run)),
    );
    tokio::pin!(waits);
    let mut ticker = tokio::time::interval(HEARTBEAT_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            result = &mut waits => {
                return result.map_err(|err| Blocked {
                    reason: BlockReason::TemporalStateFetchFailed,
                    message: format!("cannot follow gate workflows: {err}"),
                });
            }
            _ = ticker.tick() => heartbeat(),
        }
    }
}

async fn wait_gate(
    client: &TemporalClient,
    namespace: &str,
    mut run: GateRun,
) -> Result<GateRun, TemporalError> {
    let mut page_token = Vec::new();
    let mut errors = 0u32;
    let mut error_delays = error_backoff();
    while run.status == RUNNING {
        let request = GetWorkflowExecutionHistoryRequest {
            namespace: namespace.to_owned(),
            execution: Some(WorkflowExecution {
                workflow_id: run.workflow_id.clone(),
                run_id: run.run_id.clone(),
            }),
            next_page_token: std::mem::take(&mut page_token),
            wait_new_event: true,
            history_event_filter_type: HistoryEventFilterType::CloseEvent as i32,
            skip_archival: true,
            ..Default::default()
        };
        let mut raw = client.raw().clone();
        let response = match client
            .observe(
                "GetWorkflowExecutionHistory",
                WorkflowService::get_workflow_execution_history(
                    &mut raw,
                    request.clone().into_request(),
                ),
            )
            .await
        {
            Ok(response) => response.into_inner(),
            Err(status) => {
                let err = client.rpc_error(
                    "GetWorkflowExecutionHistory",
                    run.workflow_id.clone(),
                    &status,
                );
                errors += 1;
                if !err.is_transient() || errors >= MAX_CONSECUTIVE_ERRORS {
                    return Err(err);
                }
                warn!(workflow_id = %run.workflow_id, error = %err, "polling a gate workflow failed; retrying");
                page_token = request.next_page_token;
                let delay = error_delays.next().unwrap_or(ERROR_MAX_DELAY);
                tokio::time::sleep(delay).await;
                continue;
            }
        };
        errors = 0;
        error_delays = error_backoff();
        let close = response
            .history
            .and_then(|h| h.events.into_iter().last())
            .and_then(|e| e.attributes);
        match close {
            None => page_token = response.next_page_token,
            Some(attributes) => {
                if let Some(next_run) = apply_close_event(&mut run, attributes) {
                    debug!(workflow_id = %run.workflow_id, %next_run, "gate workflow continues in a new run");
                    run.run_id = next_run;
                }
            }
        }
    }
    info!(workflow_id = %run.workflow_id, run_id = %run.run_id, status = %run.status, "gate workflow closed");
    Ok(run)
}

/// Records a close event on the run; returns the new run ID when the execution continues in
/// another run (continue-as-new, retry).
fn apply_close_event(run: &mut GateRun, attributes: Attributes) -> Option<String> {
    let (status, next_run) = match attributes {
        Attributes::WorkflowExecutionCompletedEventAttributes(_) => (COMPLETED, String::new()),
        Attributes::WorkflowExecutionFailedEventAttributes(a) => {
            let message = a.failure.map(|f| f.message).unwrap_or_default();
            info!(workflow_id = %run.workflow_id, %message, "gate workflow failed");
            ("Failed", a.new_execution_run_id)
        }
        Attributes::WorkflowExecutionTimedOutEventAttributes(a) => {
            ("TimedOut", a.new_execution_run_id)
        }
        Attributes::WorkflowExecutionCanceledEventAttributes(_) => ("Canceled", String::new()),
        Attributes::WorkflowExecutionTerminatedEventAttributes(_) => ("Terminated", String::new()),
        Attributes::WorkflowExecutionContinuedAsNewEventAttributes(a) => {
            (RUNNING, a.new_execution_run_id)
        }
        _ => (RUNNING, String::new()),
    };
    if next_run.is_empty() {
        run.status = status.to_owned();
        None
    } else {
        run.status = RUNNING.to_owned();
        Some(next_run)
    }
}

/// Requests cancellation of the given runs that are still running (their latest run, so a
/// continued-as-new gate is cancelled too). Gates already closed or gone are fine.
pub async fn cancel_gates(
    client: &TemporalClient,
    namespace: &str,
    runs: &[GateRun],
) -> Result<(), TemporalError> {
    for run in runs.iter().filter(|r| r.status == RUNNING) {
        cancel_gate(client, namespace, &run.workflow_id).await?;
    }
    Ok(())
}

/// Cancels every running gate workflow of a build, found through visibility
/// (`WorkflowId STARTS_WITH "gate/<deployment>/<build>/"`). Visibility lags a little, so a gate
/// started a moment ago may be missed: prefer [`cancel_gates`] with the runs when they are known.
/// Returns how many cancellations were requested.
pub async fn cancel_build_gates(
    client: &TemporalClient,
    namespace: &str,
    deployment_name: &str,
    build_id: &str,
) -> Result<usize, TemporalError> {
    let workflow_ids = running_build_gates(client, namespace, deployment_name, build_id).await?;
    for workflow_id in &workflow_ids {
        cancel_gate(client, namespace, workflow_id).await?;
    }
    Ok(workflow_ids.len())
}

/// Interval of the checks whether cancelled gates have closed.
const STOP_POLL_INTERVAL: Duration = Duration::from_millis(500);

/// Stops every running gate workflow of a build: requests cancellation (as
/// [`cancel_build_gates`]), waits up to `grace` for the gates to close, then terminates those
/// still running. A gate pinned to a build that is being retired may never see its cancellation
/// (its workers are scaled away, or cannot run it), and would otherwise run until its one-hour
/// timeout. Returns how many gates were stopped.
pub async fn stop_build_gates(
    client: &TemporalClient,
    namespace: &str,
    deployment_name: &str,
    build_id: &str,
    grace: Duration,
) -> Result<usize, TemporalError> {
    let workflow_ids = running_build_gates(client, namespace, deployment_name, build_id).await?;
    for workflow_id in &workflow_ids {
        cancel_gate(client, namespace, workflow_id).await?;
    }
    let deadline = tokio::time::Instant::now() + grace;
    let mut running = workflow_ids.clone();
    while !running.is_empty() {
        let mut still = Vec::with_capacity(running.len());
        for workflow_id in running {
            match describe_execution(client, namespace, &workflow_id).await {
                Ok((_, status)) if status != RUNNING => {}
                Err(err) if err.class() == StatusClass::NotFound => {}
                Ok(_) | Err(_) => still.push(workflow_id),
            }
        }
        running = still;
        if running.is_empty() || tokio::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(crate::backoff::spread(STOP_POLL_INTERVAL)).await;
    }
    for workflow_id in &running {
        terminate_gate(client, namespace, workflow_id).await?;
    }
    Ok(workflow_ids.len())
}

/// IDs of the running gate workflows of a build, from visibility.
async fn running_build_gates(
    client: &TemporalClient,
    namespace: &str,
    deployment_name: &str,
    build_id: &str,
) -> Result<Vec<String>, TemporalError> {
    let prefix = gate_workflow_id_prefix(deployment_name, build_id);
    let query = format!(
        "WorkflowId STARTS_WITH \"{}\" AND ExecutionStatus = \"Running\"",
        prefix.replace('\\', "\\\\").replace('"', "\\\"")
    );
    let mut page_token = Vec::new();
    let mut workflow_ids = Vec::new();
    loop {
        let request = ListWorkflowExecutionsRequest {
            namespace: namespace.to_owned(),
            page_size: 100,
            next_page_token: page_token,
            query: query.clone(),
        };
        let mut raw = client.raw().clone();
        let response = client
            .observe(
                "ListWorkflowExecutions",
                WorkflowService::list_workflow_executions(&mut raw, request.into_request()),
            )
            .await
            .map_err(|s| client.rpc_error("ListWorkflowExecutions", prefix.clone(), &s))?
            .into_inner();
        workflow_ids.extend(
            response
                .executions
                .into_iter()
                .filter_map(|e| e.execution.map(|x| x.workflow_id)),
        );
        if response.next_page_token.is_empty() {
            return Ok(workflow_ids);
        }
        page_token = response.next_page_token;
    }
}

async fn terminate_gate(
    client: &TemporalClient,
    namespace: &str,
    workflow_id: &str,
) -> Result<(), TemporalError> {
    let request = TerminateWorkflowExecutionRequest {
        namespace: namespace.to_owned(),
        workflow_execution: Some(WorkflowExecution {
            workflow_id: workflow_id.to_owned(),
            run_id: String::new(),
        }),
        reason: "rollout superseded or aborted; the gate did not stop when cancelled".to_owned(),
        identity: client.identity().to_owned(),
        ..Default::default()
    };
    let mut raw = client.raw().clone();
    match client
        .observe(
            "TerminateWorkflowExecution",
            WorkflowService::terminate_workflow_execution(&mut raw, request.into_request()),
        )
        .await
    {
        Ok(_) => {
            info!(%namespace, %workflow_id, "terminated gate workflow that ignored its cancellation");
            Ok(())
        }
        Err(status) => {
            let err = client.rpc_error("TerminateWorkflowExecution", workflow_id, &status);
            if err.class() == StatusClass::NotFound {
                debug!(%workflow_id, "gate workflow already closed or gone");
                Ok(())
            } else {
                Err(err)
            }
        }
    }
}

async fn cancel_gate(
    client: &TemporalClient,
    namespace: &str,
    workflow_id: &str,
) -> Result<(), TemporalError> {
    let request = RequestCancelWorkflowExecutionRequest {
        namespace: namespace.to_owned(),
        workflow_execution: Some(WorkflowExecution {
            workflow_id: workflow_id.to_owned(),
            run_id: String::new(),
        }),
        identity: client.identity().to_owned(),
        request_id: format!("cancel/{workflow_id}"),
        reason: "rollout superseded or aborted".to_owned(),
        ..Default::default()
    };
    let mut raw = client.raw().clone();
    match client
        .observe(
            "RequestCancelWorkflowExecution",
            WorkflowService::request_cancel_workflow_execution(&mut raw, request.into_request()),
        )
        .await
    {
        Ok(_) => {
            info!(%namespace, %workflow_id, "requested cancellation of gate workflow");
            Ok(())
        }
        Err(status) => {
            let err = client.rpc_error("RequestCancelWorkflowExecution", workflow_id, &status);
            if err.class() == StatusClass::NotFound {
                debug!(%workflow_id, "gate workflow already closed or gone");
                Ok(())
            } else {
                Err(err)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use temporalio_common::protos::temporal::api::history::v1::{
        WorkflowExecutionCompletedEventAttributes, WorkflowExecutionContinuedAsNewEventAttributes,
        WorkflowExecutionFailedEventAttributes,
    };

    use super::*;

    fn run() -> GateRun {
        GateRun {
            workflow_id: "gate/ns/d/v1/q/1".to_owned(),
            run_id: "r1".to_owned(),
            task_queue: "q".to_owned(),
            status: RUNNING.to_owned(),
        }
    }

    #[test]
    fn gate_ids_name_the_build_queue_and_attempt_or_step_of_a_rollout() {
        let step = |step, rollout_started_at| {
            GateKey::Step(StepGateRef {
                step,
                rollout_started_at,
            })
        };
        let cases = [
            (GateKey::Rollout { attempt: 2 }, "gate/ns/d/v1/q/2"),
            (
                step(0, 1_700_000_000_000),
                "gate/ns/d/v1/q/step0-1700000000000",
            ),
            (step(3, 5), "gate/ns/d/v1/q/step3-5"),
        ];
        for (key, expected) in cases {
            let id = gate_workflow_id("ns/d", "v1", "q", key);
            assert_eq!(id, expected);
            // Stopping a build's gates finds every kind.
            assert!(
                id.starts_with(&gate_workflow_id_prefix("ns/d", "v1")),
                "{id}"
            );
        }
        // A later rollout of the same build runs its step gates again, under new IDs.
        assert_ne!(
            gate_workflow_id("ns/d", "v1", "q", step(1, 10)),
            gate_workflow_id("ns/d", "v1", "q", step(1, 20))
        );
    }

    #[test]
    fn a_request_names_its_gate_by_step_when_it_has_one() {
        let mut request = GateRequest {
            twd: twc_workflows::model::TwdRef {
                namespace: "ns".into(),
                name: "d".into(),
            },
            build_id: "v1".into(),
            workflow_type: "Check".into(),
            attempt: 3,
            max_wait_ms: 0,
            step: None,
        };
        assert_eq!(GateKey::of(&request), GateKey::Rollout { attempt: 3 });
        let step = StepGateRef {
            step: 1,
            rollout_started_at: 42,
        };
        request.step = Some(step);
        assert_eq!(GateKey::of(&request), GateKey::Step(step));
    }

    #[test]
    fn statuses() {
        assert_eq!(
            status_name(WorkflowExecutionStatus::Completed as i32),
            "Completed"
        );
        assert_eq!(
            status_name(WorkflowExecutionStatus::TimedOut as i32),
            "TimedOut"
        );
        assert_eq!(
            status_name(WorkflowExecutionStatus::ContinuedAsNew as i32),
            "Running"
        );
        assert_eq!(status_name(99), "Running");
    }

    #[test]
    fn close_events() {
        let mut r = run();
        assert_eq!(
            apply_close_event(
                &mut r,
                Attributes::WorkflowExecutionCompletedEventAttributes(
                    WorkflowExecutionCompletedEventAttributes::default()
                )
            ),
            None
        );
        assert_eq!(r.status, "Completed");

        let mut r = run();
        let next = apply_close_event(
            &mut r,
            Attributes::WorkflowExecutionContinuedAsNewEventAttributes(
                WorkflowExecutionContinuedAsNewEventAttributes {
                    new_execution_run_id: "r2".to_owned(),
                    ..Default::default()
                },
            ),
        );
        assert_eq!(next.as_deref(), Some("r2"));
        assert_eq!(r.status, "Running");

        let mut r = run();
        apply_close_event(
            &mut r,
            Attributes::WorkflowExecutionFailedEventAttributes(
                WorkflowExecutionFailedEventAttributes::default(),
            ),
        );
        assert_eq!(r.status, "Failed");
    }

    #[test]
    fn input_summary_shows_only_size_and_keys() {
        let input = serde_json::json!({"secret": "x", "n": 1});
        let (size, mut keys) = input_summary(Some(&input));
        keys.sort();
        assert_eq!(
            size,
            serde_json::to_vec(&input)
                .map(|v| v.len())
                .unwrap_or_default()
        );
        assert_eq!(keys, vec!["n", "secret"]);
        assert_eq!(input_summary(None), (0, Vec::new()));
    }

    #[test]
    fn override_is_pinned_to_the_version() {
        let o = pinned_override("ns/d", "v1");
        let Some(Override::Pinned(p)) = o.r#override else {
            panic!("not pinned");
        };
        assert_eq!(p.behavior, PinnedOverrideBehavior::Pinned as i32);
        assert_eq!(p.version, Some(version_ref("ns/d", "v1")));
    }
}
