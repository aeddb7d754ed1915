//! What a stretch of workflow history costs: its events, and the Temporal Cloud actions they
//! stand for, estimated by Cloud's billing rules (docs.temporal.io/cloud/actions) as far as a
//! history shows them.
//!
//! Counted, per event stamped inside the window:
//! - `WorkflowExecutionStarted` of a run not started by a parent (a client's start, a
//!   signal-with-start, a continue-as-new; a child's continue-as-new too): 1;
//! - `StartChildWorkflowExecutionInitiated`: 2 (Cloud bills the child's start and its
//!   execution), so the child's own first `WorkflowExecutionStarted` is not counted again;
//! - `TimerStarted`: 1;
//! - `ActivityTaskScheduled`: 1, and `attempt − 1` more for its `ActivityTaskStarted` (Cloud
//!   bills every attempt; a retry writes no event of its own);
//! - local activities: 1 per workflow task that recorded local-activity markers, however
//!   many it recorded;
//! - `WorkflowExecutionSignaled` sent by a client: 1; a signal one workflow sends another is
//!   counted once, as the sender's `SignalExternalWorkflowExecutionInitiated`: 1;
//! - `UpsertWorkflowSearchAttributes`: 1 (none when it only sets `TemporalChangeVersion`);
//! - `WorkflowExecutionUpdateAccepted`: 1;
//! - `WorkflowExecutionOptionsUpdated`: 1.
//!
//! Not in a history, so not counted: activity heartbeats, queries, rejected updates, and a
//! workflow task heartbeat of a long local activity. A signal-with-start is one action in
//! Cloud but shows as a start and a signal (counted 2).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use serde::Serialize;
use temporalio_common::protos::temporal::api::enums::v1::EventType;
use temporalio_common::protos::temporal::api::history::v1::HistoryEvent;
use temporalio_common::protos::temporal::api::history::v1::history_event::Attributes;

use crate::cluster::system_time;

/// The marker the SDK records for a local activity's result.
pub const LOCAL_ACTIVITY_MARKER: &str = "core_local_activity";
/// The search attribute of workflow versioning, which Cloud does not bill for.
const CHANGE_VERSION: &str = "TemporalChangeVersion";
/// An hour.
pub const HOUR: Duration = Duration::from_secs(3600);
/// A day.
pub const DAY: Duration = Duration::from_secs(86_400);

/// A billing rule of Temporal Cloud that a history shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    /// A run started by a client, a signal-with-start or a continue-as-new.
    WorkflowStarted,
    /// A child workflow started (its start and its execution: 2).
    ChildWorkflowStarted,
    /// A timer started.
    TimerStarted,
    /// An activity scheduled (its first attempt).
    ActivityStarted,
    /// An activity's attempts after the first.
    ActivityRetried,
    /// A workflow task that recorded local-activity markers.
    LocalActivities,
    /// A signal from a client.
    ClientSignal,
    /// A signal a workflow sent.
    WorkflowSignal,
    /// Search attributes upserted.
    SearchAttributesUpserted,
    /// An update accepted.
    UpdateAccepted,
    /// Workflow execution options updated.
    OptionsUpdated,
}

/// The events of a stretch of history and the actions they stand for.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Cost {
    /// Events stamped inside the window.
    pub events: usize,
    /// The same, by event type (`TimerFired`, `MarkerRecorded`, ...).
    pub events_by_type: BTreeMap<String, usize>,
    /// Estimated actions, by rule.
    pub actions_by_rule: BTreeMap<Rule, usize>,
}

impl Cost {
    /// What the events of `runs` (every run of one workflow) stamped in `[from, to]` cost.
    pub fn read(runs: &[Vec<HistoryEvent>], from: SystemTime, to: SystemTime) -> Self {
        let mut cost = Self::default();
        for (run, events) in runs.iter().enumerate() {
            // Workflow tasks (by their completed event) that recorded local-activity markers.
            let mut marker_tasks = BTreeSet::new();
            for event in events {
                let Some(at) = system_time(event.event_time.as_ref()) else {
                    continue;
                };
                if at < from || at > to {
                    continue;
                }
                cost.events += 1;
                *cost.events_by_type.entry(event_type(event)).or_default() += 1;
                if let Some(Attributes::MarkerRecordedEventAttributes(m)) = &event.attributes
                    && m.marker_name == LOCAL_ACTIVITY_MARKER
                {
                    marker_tasks.insert((run, m.workflow_task_completed_event_id));
                }
                if let Some((rule, actions)) = charge(event) {
                    cost.add_actions(rule, actions);
                }
            }
            cost.add_actions(Rule::LocalActivities, marker_tasks.len());
        }
        cost
    }

    /// Every estimated action.
    pub fn actions(&self) -> usize {
        self.actions_by_rule.values().sum()
    }

    /// Adds `other` to this one.
    pub fn add(&mut self, other: &Cost) {
        self.events += other.events;
        for (kind, n) in &other.events_by_type {
            *self.events_by_type.entry(kind.clone()).or_default() += n;
        }
        for (rule, n) in &other.actions_by_rule {
            self.add_actions(*rule, *n);
        }
    }

    fn add_actions(&mut self, rule: Rule, actions: usize) {
        if actions > 0 {
            *self.actions_by_rule.entry(rule).or_default() += actions;
        }
    }
}

/// The actions one event stands for by itself (local activities are counted per workflow
/// task, in [`Cost::read`]).
fn charge(event: &HistoryEvent) -> Option<(Rule, usize)> {
    Some(match event.attributes.as_ref()? {
        Attributes::WorkflowExecutionStartedEventAttributes(a) => {
            let child = a.parent_workflow_execution.is_some();
            let continued = !a.continued_execution_run_id.is_empty();
            if child && !continued {
                return None;
            }
            (Rule::WorkflowStarted, 1)
        }
        Attributes::StartChildWorkflowExecutionInitiatedEventAttributes(_) => {
            (Rule::ChildWorkflowStarted, 2)
        }
        Attributes::TimerStartedEventAttributes(_) => (Rule::TimerStarted, 1),
        Attributes::ActivityTaskScheduledEventAttributes(_) => (Rule::ActivityStarted, 1),
        Attributes::ActivityTaskStartedEventAttributes(a) if a.attempt > 1 => (
            Rule::ActivityRetried,
            usize::try_from(a.attempt - 1).unwrap_or(0),
        ),
        Attributes::WorkflowExecutionSignaledEventAttributes(a)
            if a.external_workflow_execution.is_none() =>
        {
            (Rule::ClientSignal, 1)
        }
        Attributes::SignalExternalWorkflowExecutionInitiatedEventAttributes(_) => {
            (Rule::WorkflowSignal, 1)
        }
        Attributes::UpsertWorkflowSearchAttributesEventAttributes(a) => {
            let billed = a
                .search_attributes
                .as_ref()
                .is_some_and(|s| s.indexed_fields.keys().any(|k| k != CHANGE_VERSION));
            if !billed {
                return None;
            }
            (Rule::SearchAttributesUpserted, 1)
        }
        Attributes::WorkflowExecutionUpdateAcceptedEventAttributes(_) => (Rule::UpdateAccepted, 1),
        Attributes::WorkflowExecutionOptionsUpdatedEventAttributes(_) => (Rule::OptionsUpdated, 1),
        _ => return None,
    })
}

/// `TimerFired` for `EVENT_TYPE_TIMER_FIRED`.
fn event_type(event: &HistoryEvent) -> String {
    let name =
        EventType::try_from(event.event_type).map_or("EVENT_TYPE_UNSPECIFIED", |t| t.as_str_name());
    name.trim_start_matches("EVENT_TYPE_")
        .split('_')
        .map(|word| {
            let mut chars = word.chars();
            chars.next().map_or_else(String::new, |first| {
                first.to_string() + &chars.as_str().to_ascii_lowercase()
            })
        })
        .collect()
}

/// `count` things that `workflows` workflows did in `window`, per workflow per `unit` (an
/// hour, a day); `None` without a workflow or a window.
pub fn per_workflow(
    count: usize,
    workflows: usize,
    window: Duration,
    unit: Duration,
) -> Option<f64> {
    (workflows > 0 && !window.is_zero())
        .then(|| count as f64 / workflows as f64 * unit.as_secs_f64() / window.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use temporalio_common::protos::temporal::api::common::v1::{
        Payload, Payloads, SearchAttributes, WorkflowExecution,
    };
    use temporalio_common::protos::temporal::api::history::v1::{
        ActivityTaskScheduledEventAttributes, ActivityTaskStartedEventAttributes,
        MarkerRecordedEventAttributes, SignalExternalWorkflowExecutionInitiatedEventAttributes,
        StartChildWorkflowExecutionInitiatedEventAttributes, TimerFiredEventAttributes,
        TimerStartedEventAttributes, UpsertWorkflowSearchAttributesEventAttributes,
        WorkflowExecutionContinuedAsNewEventAttributes, WorkflowExecutionSignaledEventAttributes,
        WorkflowExecutionStartedEventAttributes, WorkflowExecutionUpdateAcceptedEventAttributes,
        WorkflowTaskCompletedEventAttributes, WorkflowTaskScheduledEventAttributes,
        WorkflowTaskStartedEventAttributes,
    };

    use super::*;

    fn t(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + s)
    }

    /// An event of type `kind` at second `s`, numbered `id`.
    fn event(id: i64, s: u64, kind: EventType, attributes: Attributes) -> HistoryEvent {
        let at = t(s)
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        HistoryEvent {
            event_id: id,
            event_time: Some(prost_wkt_types::Timestamp {
                seconds: at.as_secs() as i64,
                nanos: 0,
            }),
            event_type: kind as i32,
            attributes: Some(attributes),
            ..Default::default()
        }
    }

    /// A local-activity marker recorded by the workflow task completed as event `task`.
    fn marker(id: i64, s: u64, task: i64) -> HistoryEvent {
        event(
            id,
            s,
            EventType::MarkerRecorded,
            MarkerRecordedEventAttributes {
                marker_name: LOCAL_ACTIVITY_MARKER.to_owned(),
                workflow_task_completed_event_id: task,
                ..Default::default()
            }
            .into(),
        )
    }

    /// A workflow task completed as event `id`.
    fn task_completed(id: i64, s: u64) -> HistoryEvent {
        event(
            id,
            s,
            EventType::WorkflowTaskCompleted,
            WorkflowTaskCompletedEventAttributes::default().into(),
        )
    }

    /// One idle turn of a held rollout from second `s` on, its events numbered from `id`: the
    /// timer fires, a workflow task observes in a local activity (one marker) and starts the
    /// next timer.
    fn idle_turn(id: i64, s: u64) -> Vec<HistoryEvent> {
        vec![
            event(
                id,
                s,
                EventType::TimerFired,
                TimerFiredEventAttributes::default().into(),
            ),
            event(
                id + 1,
                s,
                EventType::WorkflowTaskScheduled,
                WorkflowTaskScheduledEventAttributes::default().into(),
            ),
            event(
                id + 2,
                s,
                EventType::WorkflowTaskStarted,
                WorkflowTaskStartedEventAttributes::default().into(),
            ),
            task_completed(id + 3, s),
            marker(id + 4, s, id + 3),
            event(
                id + 5,
                s,
                EventType::TimerStarted,
                TimerStartedEventAttributes::default().into(),
            ),
        ]
    }

    fn started(parent: bool, continued: bool) -> Attributes {
        WorkflowExecutionStartedEventAttributes {
            parent_workflow_execution: parent.then(WorkflowExecution::default),
            continued_execution_run_id: if continued {
                "r1".into()
            } else {
                String::new()
            },
            ..Default::default()
        }
        .into()
    }

    fn upsert(keys: &[&str]) -> Attributes {
        UpsertWorkflowSearchAttributesEventAttributes {
            search_attributes: Some(SearchAttributes {
                indexed_fields: keys
                    .iter()
                    .map(|k| ((*k).to_owned(), Payload::default()))
                    .collect::<HashMap<_, _>>(),
            }),
            ..Default::default()
        }
        .into()
    }

    #[test]
    fn an_idle_turn_of_a_hold_is_six_events_and_two_actions() {
        let cost = Cost::read(&[idle_turn(10, 100)], t(0), t(1000));
        assert_eq!(cost.events, 6);
        assert_eq!(
            cost.actions_by_rule,
            BTreeMap::from([(Rule::TimerStarted, 1), (Rule::LocalActivities, 1)])
        );
        assert_eq!(cost.events_by_type.get("MarkerRecorded"), Some(&1));
        assert_eq!(cost.events_by_type.get("WorkflowTaskCompleted"), Some(&1));
    }

    #[test]
    fn only_events_inside_the_window_count() {
        let run: Vec<HistoryEvent> = [idle_turn(1, 50), idle_turn(7, 350), idle_turn(13, 650)]
            .into_iter()
            .flatten()
            .collect();
        let cost = Cost::read(&[run], t(300), t(600));
        assert_eq!((cost.events, cost.actions()), (6, 2));
        // Every run of the workflow is read: a continued run's turn counts too.
        let cost = Cost::read(&[idle_turn(1, 350), idle_turn(1, 400)], t(300), t(600));
        assert_eq!((cost.events, cost.actions()), (12, 4));
    }

    #[test]
    fn local_activities_count_once_per_workflow_task_that_recorded_them() {
        let run = vec![
            task_completed(4, 10),
            marker(5, 10, 4),
            marker(6, 10, 4),
            marker(7, 10, 4),
            task_completed(10, 20),
            marker(11, 20, 10),
        ];
        let cost = Cost::read(&[run], t(0), t(100));
        assert_eq!(
            cost.actions_by_rule,
            BTreeMap::from([(Rule::LocalActivities, 2)])
        );
    }

    #[test]
    fn each_event_is_charged_by_its_rule() {
        let signaled = |from_workflow: bool| -> Attributes {
            WorkflowExecutionSignaledEventAttributes {
                signal_name: "report".into(),
                external_workflow_execution: from_workflow.then(WorkflowExecution::default),
                ..Default::default()
            }
            .into()
        };
        let activity_started = |attempt: i32| -> Attributes {
            ActivityTaskStartedEventAttributes {
                attempt,
                ..Default::default()
            }
            .into()
        };
        /// (what, the event's type, its attributes, the rule that bills it and how much).
        type Case<'a> = (&'a str, EventType, Attributes, Option<(Rule, usize)>);
        let cases: Vec<Case> = vec![
            (
                "a client's start",
                EventType::WorkflowExecutionStarted,
                started(false, false),
                Some((Rule::WorkflowStarted, 1)),
            ),
            (
                "a continue-as-new",
                EventType::WorkflowExecutionStarted,
                started(false, true),
                Some((Rule::WorkflowStarted, 1)),
            ),
            (
                "a child's first run: billed at the parent",
                EventType::WorkflowExecutionStarted,
                started(true, false),
                None,
            ),
            (
                "a child's continue-as-new",
                EventType::WorkflowExecutionStarted,
                started(true, true),
                Some((Rule::WorkflowStarted, 1)),
            ),
            (
                "a child started: its start and its execution",
                EventType::StartChildWorkflowExecutionInitiated,
                StartChildWorkflowExecutionInitiatedEventAttributes::default().into(),
                Some((Rule::ChildWorkflowStarted, 2)),
            ),
            (
                "the continued run's end: billed at the new run's start",
                EventType::WorkflowExecutionContinuedAsNew,
                WorkflowExecutionContinuedAsNewEventAttributes::default().into(),
                None,
            ),
            (
                "a timer started",
                EventType::TimerStarted,
                TimerStartedEventAttributes::default().into(),
                Some((Rule::TimerStarted, 1)),
            ),
            (
                "a timer fired",
                EventType::TimerFired,
                TimerFiredEventAttributes::default().into(),
                None,
            ),
            (
                "an activity scheduled",
                EventType::ActivityTaskScheduled,
                ActivityTaskScheduledEventAttributes::default().into(),
                Some((Rule::ActivityStarted, 1)),
            ),
            (
                "an activity started at its first attempt",
                EventType::ActivityTaskStarted,
                activity_started(1),
                None,
            ),
            (
                "an activity started at its third attempt: two retries",
                EventType::ActivityTaskStarted,
                activity_started(3),
                Some((Rule::ActivityRetried, 2)),
            ),
            (
                "a client's signal",
                EventType::WorkflowExecutionSignaled,
                signaled(false),
                Some((Rule::ClientSignal, 1)),
            ),
            (
                "a workflow's signal, received: billed where it was sent",
                EventType::WorkflowExecutionSignaled,
                signaled(true),
                None,
            ),
            (
                "a workflow's signal, sent",
                EventType::SignalExternalWorkflowExecutionInitiated,
                SignalExternalWorkflowExecutionInitiatedEventAttributes::default().into(),
                Some((Rule::WorkflowSignal, 1)),
            ),
            (
                "search attributes upserted",
                EventType::UpsertWorkflowSearchAttributes,
                upsert(&["TemporalChangeVersion", "TwcPhase"]),
                Some((Rule::SearchAttributesUpserted, 1)),
            ),
            (
                "only the change version upserted",
                EventType::UpsertWorkflowSearchAttributes,
                upsert(&["TemporalChangeVersion"]),
                None,
            ),
            (
                "an update accepted",
                EventType::WorkflowExecutionUpdateAccepted,
                WorkflowExecutionUpdateAcceptedEventAttributes::default().into(),
                Some((Rule::UpdateAccepted, 1)),
            ),
            (
                "a marker alone: counted per workflow task",
                EventType::MarkerRecorded,
                MarkerRecordedEventAttributes {
                    marker_name: LOCAL_ACTIVITY_MARKER.to_owned(),
                    details: HashMap::from([("data".to_owned(), Payloads::default())]),
                    ..Default::default()
                }
                .into(),
                None,
            ),
        ];
        for (name, kind, attributes, expected) in cases {
            assert_eq!(charge(&event(1, 0, kind, attributes)), expected, "{name}");
        }
    }

    #[test]
    fn event_types_are_named_as_temporal_spells_them() {
        let timer = event(
            1,
            0,
            EventType::TimerFired,
            TimerFiredEventAttributes::default().into(),
        );
        assert_eq!(event_type(&timer), "TimerFired");
        let signal = event(
            1,
            0,
            EventType::SignalExternalWorkflowExecutionInitiated,
            SignalExternalWorkflowExecutionInitiatedEventAttributes::default().into(),
        );
        assert_eq!(
            event_type(&signal),
            "SignalExternalWorkflowExecutionInitiated"
        );
    }

    #[test]
    fn costs_add_up() {
        let mut total = Cost::read(&[idle_turn(1, 10)], t(0), t(100));
        total.add(&Cost::read(&[idle_turn(1, 20)], t(0), t(100)));
        assert_eq!((total.events, total.actions()), (12, 4));
        assert_eq!(total.actions_by_rule.get(&Rule::TimerStarted), Some(&2));
    }

    #[test]
    fn rates_are_per_workflow_per_unit() {
        let minutes = |m: u64| Duration::from_secs(60 * m);
        let cases = [
            // 5 held rollouts, 2 idle turns of 6 events each in 10 minutes: 72 an hour.
            (60, 5, minutes(10), HOUR, Some(72.0)),
            // 2 actions per turn: 24 an hour.
            (20, 5, minutes(10), HOUR, Some(24.0)),
            // 200 TWDs, 1400 events in 5 minutes: 7 per 5 minutes, 2016 a day.
            (1400, 200, minutes(5), DAY, Some(2016.0)),
            (1400, 200, minutes(5), minutes(5), Some(7.0)),
            (10, 0, minutes(5), HOUR, None),
            (10, 5, Duration::ZERO, HOUR, None),
        ];
        for (count, workflows, window, unit, expected) in cases {
            let rate = per_workflow(count, workflows, window, unit);
            assert!(
                match (rate, expected) {
                    (Some(r), Some(e)) => (r - e).abs() < 1e-9,
                    (r, e) => r == e,
                },
                "{count} in {window:?} over {workflows}: {rate:?}, expected {expected:?}"
            );
        }
    }
}
