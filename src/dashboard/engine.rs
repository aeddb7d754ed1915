//! What the dashboard reads from the engine Temporal: the TWD workflow's view and the rollout's
//! control state (as `kubectl twc status`), the analysis measurements and backlog reads recorded
//! in the workflows' histories, and the controls, sent through the same validated path as the
//! CLI. The client is made on first use and again after a failure, so a Temporal restart only
//! costs the requests made while it is down.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use futures::StreamExt;
use temporalio_client::{Client, WorkflowFetchHistoryOptions};
use temporalio_common::protos::temporal::api::common::v1::Payloads;
use temporalio_common::protos::temporal::api::history::v1::HistoryEvent;
use temporalio_common::protos::temporal::api::history::v1::history_event::Attributes;
use tokio::sync::Mutex;
use twc_workflows::contract::{
    AnalysisRequest, AnalysisResult, BacklogReport, ReadBacklog, RunAnalysis, ScaleDeployment,
    ScaleRequest,
};
use twc_workflows::model::{ControlAction, TwdRef};
use twc_workflows::rollout_workflow::RolloutWorkflow;
use twc_workflows::twd_workflow::TwdWorkflow;

use super::model::{self, BacklogPoint, Millis, Point, ScalePoint};
use crate::cli::control::{Answer, through_engine};
use crate::cli::engine::EngineArgs;
use crate::cli::{EngineView, engine_client, engine_view};

/// How long a connection attempt may take before a request answers without the engine.
const CONNECT_WAIT: Duration = Duration::from_secs(5);
/// History events read at most per workflow (the latest run; a run continues as new long
/// before this).
const HISTORY_EVENTS: usize = 20_000;

/// The engine Temporal, connected on demand.
pub struct Engine {
    args: EngineArgs,
    client: Mutex<Option<Client>>,
}

/// The series the workflows' histories hold.
#[derive(Debug, Default)]
pub struct Series {
    /// Analysis measurements of the rollout in status.
    pub analysis: Vec<Point>,
    /// Backlog reads of the TWD workflow's latest run.
    pub backlog: Vec<BacklogPoint>,
    /// Replica changes the TWD workflow's latest run made.
    pub scaled: Vec<ScalePoint>,
}

impl Engine {
    /// An engine reached with `args`; nothing is connected yet.
    pub fn new(args: EngineArgs) -> Self {
        Self {
            args,
            client: Mutex::new(None),
        }
    }

    /// The engine namespace.
    pub fn namespace(&self) -> &str {
        self.args.namespace()
    }

    async fn client(&self) -> anyhow::Result<Client> {
        let mut slot = self.client.lock().await;
        if let Some(client) = slot.as_ref() {
            return Ok(client.clone());
        }
        let client = engine_client(&self.args, CONNECT_WAIT).await?;
        *slot = Some(client.clone());
        Ok(client)
    }

    /// Drops the client after a failure: the next request connects again.
    async fn forget(&self) {
        *self.client.lock().await = None;
    }

    async fn checked<T>(&self, result: anyhow::Result<T>) -> anyhow::Result<T> {
        if result.is_err() {
            self.forget().await;
        }
        result
    }

    /// The TWD workflow's view and its rollout's control state.
    pub async fn view(&self, twd: &TwdRef) -> anyhow::Result<EngineView> {
        let client = self.client().await?;
        let view = engine_view(&client, twd).await;
        self.checked(view).await
    }

    /// Sends `action` to the TWD's rollout through the `control` update (as `kubectl twc`).
    pub async fn control(&self, twd: &TwdRef, action: ControlAction) -> anyhow::Result<Answer> {
        let client = self.client().await?;
        let answer = through_engine(&client, twd, action).await;
        self.checked(answer).await
    }

    /// The analysis measurements of rollout `rollout_id` and the backlog reads and scaling of
    /// the TWD workflow, from the latest run of each.
    pub async fn series(&self, twd: &TwdRef, rollout_id: Option<&str>) -> anyhow::Result<Series> {
        let client = self.client().await?;
        let mut series = Series::default();
        if let Some(rollout_id) = rollout_id {
            let events = self
                .checked(history::<RolloutWorkflow>(&client, rollout_id).await)
                .await?;
            for (at, input, output) in completed(&events, RunAnalysis::NAME) {
                let (Some(request), Some(result)) = (
                    decode::<AnalysisRequest>(input),
                    decode::<AnalysisResult>(output),
                ) else {
                    continue;
                };
                series
                    .analysis
                    .extend(model::analysis_points(at, request.step, &result));
            }
        }
        let events = self
            .checked(history::<TwdWorkflow>(&client, &twd.twd_workflow_id()).await)
            .await?;
        for (at, _, output) in completed(&events, ReadBacklog::NAME) {
            if let Some(report) = decode::<BacklogReport>(output) {
                series.backlog.extend(model::backlog_points(at, &report));
            }
        }
        for (at, input, _) in completed(&events, ScaleDeployment::NAME) {
            if let Some(request) = decode::<ScaleRequest>(input) {
                series.scaled.push(ScalePoint {
                    at,
                    deployment: request.name,
                    replicas: request.replicas,
                });
            }
        }
        Ok(series)
    }
}

/// The events of the latest run of `workflow_id`, at most [`HISTORY_EVENTS`].
async fn history<W>(client: &Client, workflow_id: &str) -> anyhow::Result<Vec<HistoryEvent>>
where
    W: temporalio_common::HasWorkflowDefinition,
{
    let mut stream = client
        .get_workflow_handle::<W>(workflow_id.to_owned())
        .fetch_history(WorkflowFetchHistoryOptions::default())
        .take(HISTORY_EVENTS);
    let mut events = Vec::new();
    while let Some(event) = stream.next().await {
        events.push(event.with_context(|| format!("reading the history of {workflow_id}"))?);
    }
    Ok(events)
}

/// Completed activities of type `name`: when each completed, its input and its result.
fn completed<'a>(
    events: &'a [HistoryEvent],
    name: &str,
) -> Vec<(Millis, Option<&'a Payloads>, Option<&'a Payloads>)> {
    let scheduled: std::collections::HashMap<i64, Option<&Payloads>> = events
        .iter()
        .filter_map(|e| match &e.attributes {
            Some(Attributes::ActivityTaskScheduledEventAttributes(a))
                if a.activity_type.as_ref().is_some_and(|t| t.name == name) =>
            {
                Some((e.event_id, a.input.as_ref()))
            }
            _ => None,
        })
        .collect();
    events
        .iter()
        .filter_map(|e| match &e.attributes {
            Some(Attributes::ActivityTaskCompletedEventAttributes(a)) => scheduled
                .get(&a.scheduled_event_id)
                .map(|input| (event_millis(e), *input, a.result.as_ref())),
            _ => None,
        })
        .collect()
}

fn event_millis(event: &HistoryEvent) -> Millis {
    event
        .event_time
        .as_ref()
        .and_then(|t| {
            let at = UNIX_EPOCH
                + Duration::from_secs(u64::try_from(t.seconds).ok()?)
                + Duration::from_nanos(u64::try_from(t.nanos).ok()?);
            at.duration_since(SystemTime::UNIX_EPOCH).ok()
        })
        .and_then(|d| i64::try_from(d.as_millis()).ok())
        .unwrap_or(0)
}

/// The first payload of `payloads` as JSON of `T` (activities' inputs and results are JSON).
fn decode<T: serde::de::DeserializeOwned>(payloads: Option<&Payloads>) -> Option<T> {
    let payload = payloads?.payloads.first()?;
    serde_json::from_slice(&payload.data)
        .map_err(|e| tracing::debug!("dashboard: an activity payload does not decode: {e}"))
        .ok()
}

#[cfg(test)]
mod tests {
    use temporalio_common::protos::temporal::api::common::v1::{ActivityType, Payload};
    use temporalio_common::protos::temporal::api::history::v1::{
        ActivityTaskCompletedEventAttributes, ActivityTaskScheduledEventAttributes,
    };

    use super::*;

    fn payloads(value: serde_json::Value) -> Option<Payloads> {
        Some(Payloads {
            payloads: vec![Payload {
                data: serde_json::to_vec(&value).unwrap_or_default(),
                ..Payload::default()
            }],
        })
    }

    fn scheduled(id: i64, name: &str, input: serde_json::Value) -> HistoryEvent {
        HistoryEvent {
            event_id: id,
            attributes: Some(Attributes::ActivityTaskScheduledEventAttributes(
                ActivityTaskScheduledEventAttributes {
                    activity_type: Some(ActivityType {
                        name: name.to_owned(),
                    }),
                    input: payloads(input),
                    ..Default::default()
                },
            )),
            ..HistoryEvent::default()
        }
    }

    fn done(id: i64, of: i64, seconds: i64, result: serde_json::Value) -> HistoryEvent {
        let mut event = HistoryEvent {
            event_id: id,
            event_time: Some(Default::default()),
            attributes: Some(Attributes::ActivityTaskCompletedEventAttributes(
                ActivityTaskCompletedEventAttributes {
                    scheduled_event_id: of,
                    result: payloads(result),
                    ..Default::default()
                },
            )),
            ..HistoryEvent::default()
        };
        if let Some(time) = event.event_time.as_mut() {
            time.seconds = seconds;
        }
        event
    }

    #[test]
    fn completed_activities_pair_their_input_with_their_result() {
        let events = vec![
            scheduled(
                5,
                "scale_deployment",
                serde_json::json!({"namespace":"ns","name":"d","replicas":3}),
            ),
            scheduled(6, "observe", serde_json::json!({})),
            done(7, 6, 1, serde_json::json!({})),
            done(8, 5, 2, serde_json::Value::Null),
        ];
        let found = completed(&events, "scale_deployment");
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].0, 2_000);
        let request: Option<ScaleRequest> = decode(found[0].1);
        assert_eq!(
            request.map(|r| (r.name, r.replicas)),
            Some(("d".to_owned(), 3))
        );
    }
}
