//! One span per engine workflow run (`rollout` for a rollout, `twd` for a TWD workflow run),
//! recorded when the run closes: completed, continued as new, cancelled or failed. A workflow
//! interceptor observes the run's result and touches nothing the workflow sends; it records only
//! when the closing workflow task runs live (`is_replaying_history_events` is false), so replay
//! after an eviction or on another replica never records a run twice. Its start is the run's
//! start time as Temporal recorded it, its end the closing workflow task's time.

use std::time::SystemTime;

use opentelemetry::KeyValue;
use opentelemetry::trace::SpanKind;
use temporalio_sdk::workflow_interceptors::{
    ExecuteWorkflowInput, ExecuteWorkflowResult, WorkflowInterceptor,
    WorkflowInterceptorConstructor, WorkflowInterceptorContext, WorkflowInterceptorFuture,
    WorkflowNext,
};
use temporalio_sdk::{WorkflowContextView, WorkflowTermination};
use twc_workflows::model::TwdRef;
use twc_workflows::rollout_workflow::RolloutOutcome;

use super::{
    BUILD_ID, FinishedSpan, OUTCOME, RUN_ID, Traces, WORKFLOW_ID, WORKFLOW_TYPE, ids,
    parse_rollout_workflow_id, twd_attributes,
};

/// Attribute: the first run of a chain of runs continued as new.
const FIRST_RUN_ID: &str = "temporalFirstRunID";

/// The interceptor constructor to register on the engine worker.
pub fn run_spans(traces: Traces) -> WorkflowInterceptorConstructor {
    WorkflowInterceptorConstructor::new(move |view: &WorkflowContextView| RunSpan {
        traces: traces.clone(),
        workflow_id: view.workflow_id().to_owned(),
        run_id: view.run_id().to_owned(),
        workflow_type: view.workflow_type().to_owned(),
        first_run_id: view.first_execution_run_id().to_owned(),
        continued_from: view.continued_from_run_id().map(str::to_owned),
        start: view.start_time(),
    })
}

/// What one run's span needs, taken when the run's workflow is instantiated.
struct RunSpan {
    traces: Traces,
    workflow_id: String,
    run_id: String,
    workflow_type: String,
    first_run_id: String,
    continued_from: Option<String>,
    start: Option<SystemTime>,
}

impl WorkflowInterceptor for RunSpan {
    fn execute<'a>(
        &'a self,
        ctx: WorkflowInterceptorContext,
        input: ExecuteWorkflowInput,
        next: WorkflowNext<
            'a,
            ExecuteWorkflowInput,
            WorkflowInterceptorFuture<'a, ExecuteWorkflowResult>,
        >,
    ) -> WorkflowInterceptorFuture<'a, ExecuteWorkflowResult> {
        WorkflowInterceptorFuture::new(async move {
            let result = next.run(input).await;
            if !ctx.is_replaying_history_events()
                && let Some((outcome, error)) = outcome(&result)
            {
                self.record(ctx.workflow_time(), outcome, error);
            }
            result
        })
    }
}

impl RunSpan {
    fn record(&self, end: Option<SystemTime>, outcome: String, error: Option<String>) {
        let end = end.unwrap_or_else(SystemTime::now);
        let mut attributes = vec![
            KeyValue::new(WORKFLOW_ID, self.workflow_id.clone()),
            KeyValue::new(RUN_ID, self.run_id.clone()),
            KeyValue::new(FIRST_RUN_ID, self.first_run_id.clone()),
            KeyValue::new(WORKFLOW_TYPE, self.workflow_type.clone()),
            KeyValue::new(OUTCOME, outcome),
        ];
        let rollout = parse_rollout_workflow_id(&self.workflow_id);
        let (name, twd) = match &rollout {
            Some((twd, build)) => {
                attributes.push(KeyValue::new(BUILD_ID, build.clone()));
                ("rollout", Some(twd.clone()))
            }
            None => ("twd", parse_twd_workflow_id(&self.workflow_id)),
        };
        if let Some(twd) = &twd {
            attributes.extend(twd_attributes(twd));
        }
        // A rollout run continued as new is a child of the run it continues (same trace); a TWD
        // workflow run, with a trace of its own, links to the previous one.
        let previous = self
            .continued_from
            .as_deref()
            .map(|previous| ids::run_span_context(&self.workflow_id, previous));
        let (parent, links) = match (rollout.is_some(), previous) {
            (true, previous) => (previous, Vec::new()),
            (false, previous) => (None, previous.into_iter().collect()),
        };
        self.traces.record(FinishedSpan {
            name: name.into(),
            kind: SpanKind::Internal,
            trace_id: Some(ids::run_trace_id(&self.workflow_id, &self.run_id)),
            span_id: Some(ids::run_span_id(&self.workflow_id, &self.run_id)),
            parent,
            start: self.start.unwrap_or(end).min(end),
            end,
            attributes,
            links,
            error,
        });
    }
}

/// How a run closed, or `None` when it did not (evicted from the cache).
fn outcome(result: &ExecuteWorkflowResult) -> Option<(String, Option<String>)> {
    match result {
        Ok(output) => Some((
            match output.downcast_ref::<RolloutOutcome>() {
                Some(RolloutOutcome::Complete) => "complete",
                Some(RolloutOutcome::Superseded) => "superseded",
                Some(RolloutOutcome::Aborted) => "aborted",
                None => "completed",
            }
            .to_owned(),
            None,
        )),
        Err(WorkflowTermination::ContinueAsNew(_)) => Some(("continued_as_new".to_owned(), None)),
        Err(WorkflowTermination::Cancelled { .. }) => Some(("cancelled".to_owned(), None)),
        Err(WorkflowTermination::Failed(e)) => Some(("failed".to_owned(), Some(e.to_string()))),
        Err(WorkflowTermination::Evicted) => None,
    }
}

/// The TWD of a TWD workflow ID (`twd/<ns>/<name>`).
fn parse_twd_workflow_id(workflow_id: &str) -> Option<TwdRef> {
    let (namespace, name) = workflow_id.strip_prefix("twd/")?.split_once('/')?;
    Some(TwdRef {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
    })
}
