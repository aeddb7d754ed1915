//! One span per activity execution (each attempt), child of its workflow run's span: an
//! activity inbound interceptor, so the activities themselves carry no tracing code. What the
//! span says about the TWD, build and step comes from the activity's input and result types
//! (the [`twc_workflows::contract`] types), read without changing them.

use std::time::SystemTime;

use opentelemetry::KeyValue;
use opentelemetry::trace::SpanKind;
use temporalio_sdk::activities::ActivityError;
use temporalio_sdk::interceptors::{
    ActivityExecutionValue, ActivityInboundInterceptor, ExecuteActivityInput,
    ExecuteActivityOutput, Next,
};
use twc_workflows::contract::{
    AnalysisRequest, BacklogRequest, BuildRequest, CreateDeploymentOutcome, DeleteVersionOutcome,
    DeleteVersionRequest, DrainRequest, GateOutcome, GateRequest, PinnedRequest, PollerWaitOutcome,
    RoutingChange, RoutingOutcome, RoutingRequest, StatusRequest, WaitForPollersRequest,
};
use twc_workflows::model::TwdRef;

use super::{
    ACTIVITY_ID, ACTIVITY_TYPE, ATTEMPT, BUILD_ID, FinishedSpan, OUTCOME, RESULT, RUN_ID, STEP,
    Traces, WORKFLOW_ID, WORKFLOW_TYPE, ids, parse_rollout_workflow_id, twd_attributes,
};

/// Records a span per activity execution into [`Traces`].
pub struct ActivitySpans {
    traces: Traces,
}

impl ActivitySpans {
    /// Spans into `traces`.
    pub fn new(traces: Traces) -> Self {
        Self { traces }
    }
}

impl ActivityInboundInterceptor for ActivitySpans {
    fn execute_activity<'a>(
        &'a self,
        input: ExecuteActivityInput,
        next: Next<'a, ExecuteActivityInput, ExecuteActivityOutput<'a>>,
    ) -> ExecuteActivityOutput<'a> {
        let start = SystemTime::now();
        let info = input.activity_info();
        let workflow = info.workflow_id.clone().zip(info.workflow_run_id.clone());
        let mut attributes = vec![
            KeyValue::new(ACTIVITY_TYPE, info.activity_type.clone()),
            KeyValue::new(ACTIVITY_ID, info.activity_id.clone()),
            KeyValue::new(ATTEMPT, i64::from(info.attempt)),
        ];
        if let Some(workflow_type) = &info.workflow_type {
            attributes.push(KeyValue::new(WORKFLOW_TYPE, workflow_type.clone()));
        }
        if let Some((workflow_id, run_id)) = &workflow {
            attributes.push(KeyValue::new(WORKFLOW_ID, workflow_id.clone()));
            attributes.push(KeyValue::new(RUN_ID, run_id.clone()));
        }
        let (twd, build, step) = subject(&input, workflow.as_ref().map(|(id, _)| id.as_str()));
        // A build's Deployment created by a TWD workflow, not by the build's rollout.
        let new_build = match (&twd, &build, workflow.as_ref()) {
            (Some(twd), Some(build), Some((workflow_id, _)))
                if info.activity_type == "create_deployment"
                    && parse_rollout_workflow_id(workflow_id).is_none() =>
            {
                Some(twd.rollout_workflow_id(build))
            }
            _ => None,
        };
        if let Some(twd) = &twd {
            attributes.extend(twd_attributes(twd));
        }
        if let Some(build) = build {
            attributes.push(KeyValue::new(BUILD_ID, build));
        }
        if let Some(step) = step {
            attributes.push(KeyValue::new(STEP, i64::from(step)));
        }
        let name = info.activity_type.clone();
        Box::pin(async move {
            let result = next.run(input).await;
            let (outcome, error) = match &result {
                Ok(output) => {
                    if let Some(word) = result_word(output.as_ref()) {
                        attributes.push(KeyValue::new(RESULT, word));
                    }
                    ("ok", None)
                }
                Err(ActivityError::Cancelled { .. }) => ("cancelled", None),
                Err(ActivityError::Application(failure)) => ("error", Some(failure.to_string())),
                Err(ActivityError::WillCompleteAsync) => ("async", None),
                Err(_) => ("error", None),
            };
            attributes.push(KeyValue::new(OUTCOME, outcome));
            let (trace_id, parent, links) = match (&workflow, &new_build) {
                // The TWD workflow creates a new build's Deployment alongside its rollout's
                // start (`create-with-start`): the span belongs to that rollout's trace,
                // linked to the TWD workflow run that made it (the rollout run's span ID is
                // not known yet).
                (Some((workflow_id, run_id)), Some(rollout_id)) => (
                    Some(ids::rollout_trace_id(rollout_id)),
                    None,
                    vec![ids::run_span_context(workflow_id, run_id)],
                ),
                (Some((workflow_id, run_id)), None) => (
                    Some(ids::run_trace_id(workflow_id, run_id)),
                    Some(ids::run_span_context(workflow_id, run_id)),
                    Vec::new(),
                ),
                (None, _) => (None, None, Vec::new()),
            };
            self.traces.record(FinishedSpan {
                name: name.into(),
                kind: SpanKind::Internal,
                trace_id,
                span_id: None,
                parent,
                start,
                end: SystemTime::now(),
                attributes,
                links,
                error,
            });
            result
        })
    }
}

/// TWD, build and step an activity is about, from its input (or its rollout's workflow ID).
fn subject(
    input: &ExecuteActivityInput,
    workflow_id: Option<&str>,
) -> (Option<TwdRef>, Option<String>, Option<u32>) {
    let from_workflow = workflow_id.and_then(parse_rollout_workflow_id);
    let (twd, build, step) = if let Some(r) = input.args_ref::<BuildRequest>() {
        (Some(r.twd.clone()), Some(r.build_id.clone()), None)
    } else if let Some(r) = input.args_ref::<WaitForPollersRequest>() {
        (Some(r.twd.clone()), Some(r.build_id.clone()), None)
    } else if let Some(r) = input.args_ref::<GateRequest>() {
        (
            Some(r.twd.clone()),
            Some(r.build_id.clone()),
            r.step.as_ref().map(|s| s.step),
        )
    } else if let Some(r) = input.args_ref::<AnalysisRequest>() {
        (Some(r.twd.clone()), Some(r.build_id.clone()), Some(r.step))
    } else if let Some(r) = input.args_ref::<RoutingRequest>() {
        let build = match &r.change {
            RoutingChange::SetCurrent { build_id } | RoutingChange::SetRamping { build_id, .. } => {
                Some(build_id.clone())
            }
            RoutingChange::ClearRamp => None,
        };
        (Some(r.twd.clone()), build, None)
    } else if let Some(r) = input.args_ref::<DeleteVersionRequest>() {
        (Some(r.twd.clone()), Some(r.build_id.clone()), None)
    } else if let Some(r) = input.args_ref::<PinnedRequest>() {
        (Some(r.twd.clone()), Some(r.build_id.clone()), None)
    } else if let Some(r) = input.args_ref::<DrainRequest>() {
        (Some(r.twd.clone()), Some(r.build_id.clone()), None)
    } else if let Some(r) = input.args_ref::<BacklogRequest>() {
        (Some(r.twd.clone()), None, None)
    } else if let Some(r) = input.args_ref::<StatusRequest>() {
        let rollout = r.status.rollout.as_ref();
        let step = rollout
            .and_then(|r| r.step)
            .and_then(|s| u32::try_from(s).ok());
        (Some(r.twd.clone()), None, step)
    } else if let Some(twd) = input.args_ref::<TwdRef>() {
        (Some(twd.clone()), None, None)
    } else {
        (None, None, None)
    };
    match from_workflow {
        Some((workflow_twd, workflow_build)) => (
            twd.or(Some(workflow_twd)),
            build.or(Some(workflow_build)),
            step,
        ),
        None => (twd, build, step),
    }
}

/// One word for results that say more than success.
fn result_word(output: &dyn ActivityExecutionValue) -> Option<&'static str> {
    if let Some(outcome) = output.downcast_ref::<CreateDeploymentOutcome>() {
        return Some(match outcome {
            CreateDeploymentOutcome::Created { .. } => "created",
            CreateDeploymentOutcome::Exists { .. } => "exists",
            CreateDeploymentOutcome::Superseded => "superseded",
            CreateDeploymentOutcome::Blocked(_) => "blocked",
            CreateDeploymentOutcome::Deferred { .. } => "deferred",
        });
    }
    if let Some(outcome) = output.downcast_ref::<RoutingOutcome>() {
        return Some(match outcome {
            RoutingOutcome::Applied => "applied",
            RoutingOutcome::Conflict => "conflict",
            RoutingOutcome::Blocked(_) => "blocked",
        });
    }
    if let Some(outcome) = output.downcast_ref::<PollerWaitOutcome>() {
        return Some(match outcome {
            PollerWaitOutcome {
                blocked: Some(_), ..
            } => "blocked",
            PollerWaitOutcome {
                registered: true,
                available: true,
                ..
            } => "ready",
            _ => "not_ready",
        });
    }
    if let Some(outcome) = output.downcast_ref::<GateOutcome>() {
        return Some(match outcome {
            GateOutcome {
                blocked: Some(_), ..
            } => "blocked",
            GateOutcome { passed: true, .. } => "passed",
            _ => "not_passed",
        });
    }
    if let Some(outcome) = output.downcast_ref::<DeleteVersionOutcome>() {
        return Some(match outcome {
            DeleteVersionOutcome::Deleted => "deleted",
            DeleteVersionOutcome::NotYet { .. } => "not_yet",
        });
    }
    None
}
