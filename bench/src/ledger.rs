//! Hop ledgers: where the time of a reaction and of a promotion goes, read from the engine
//! workflows' histories (Temporal's event timestamps) and the benchmark's own watch events.
//!
//! Everything here is a pure function of the events, so the tests build histories by hand. A
//! hop whose ends cannot both be found is `None` (missing), never 0.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime};

use serde::Serialize;
use temporalio_common::protos::temporal::api::common::v1::Payloads;
use temporalio_common::protos::temporal::api::history::v1::history_event::Attributes;
use temporalio_common::protos::temporal::api::history::v1::{
    HistoryEvent, MarkerRecordedEventAttributes,
};

use crate::cluster::{seconds_between, system_time};
use crate::stats::Summary;

/// Signal the watcher sends the TWD workflow when the spec changes.
const SPEC_CHANGED: &str = "spec_changed";
/// Activity that creates the versioned Deployment.
const CREATE_DEPLOYMENT: &str = "create_deployment";
/// Activity that waits for the build's pollers.
const WAIT_FOR_POLLERS: &str = "wait_for_pollers";
/// Activity that changes routing in Temporal.
const SET_ROUTING: &str = "set_routing";
/// The activities that read the world, Temporal's worker deployment included: `observe`, and
/// `recheck` (a quiet turn's re-assertion and observation in one).
const OBSERVATIONS: [&str; 2] = [
    twc_workflows::contract::Observe::NAME,
    twc_workflows::contract::Recheck::NAME,
];

/// One activity of a history: its type and the times of its scheduled, started and completed
/// events.
#[derive(Debug, Clone, PartialEq)]
struct Activity {
    kind: String,
    scheduled: Option<SystemTime>,
    started: Option<SystemTime>,
    completed: Option<SystemTime>,
}

/// One workflow task of a history: the times of its scheduled and started events.
#[derive(Debug, Clone, Copy, PartialEq)]
struct WorkflowTask {
    scheduled: Option<SystemTime>,
    started: Option<SystemTime>,
}

/// What an event of a history is, as far as the ledgers care.
#[derive(Debug, Clone, PartialEq)]
enum Kind {
    /// `WorkflowExecutionStarted`.
    Started,
    /// `WorkflowExecutionSignaled`: the signal's name and its first argument as JSON.
    Signaled(String, Option<serde_json::Value>),
    /// `WorkflowTaskScheduled` of the task with this index in [`Timeline::workflow_tasks`].
    WorkflowTaskScheduled(usize),
    /// `WorkflowTaskStarted` of the task with this index.
    WorkflowTaskStarted(usize),
    /// `WorkflowTaskCompleted`.
    WorkflowTaskCompleted,
    /// `ActivityTaskScheduled` of the activity with this index in [`Timeline::activities`].
    ActivityScheduled(usize),
    /// `ActivityTaskCompleted` of the activity with this index.
    ActivityCompleted(usize),
    /// `StartChildWorkflowExecutionInitiated` of this workflow ID.
    ChildInitiated(String),
    /// `TimerFired`.
    TimerFired,
    /// Anything else.
    Other,
}

/// One event: when, and what.
#[derive(Debug, Clone, PartialEq)]
struct Event {
    at: Option<SystemTime>,
    kind: Kind,
}

/// Every run of one workflow as one sequence of events (runs in the order they started), with
/// its activities and workflow tasks matched up across their scheduled, started and completed
/// events.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timeline {
    events: Vec<Event>,
    activities: Vec<Activity>,
    workflow_tasks: Vec<WorkflowTask>,
}

impl Timeline {
    /// The timeline of a workflow's runs (one list of events per run, in any order).
    pub fn of(runs: &[Vec<HistoryEvent>]) -> Self {
        let mut ordered: Vec<&Vec<HistoryEvent>> = runs.iter().collect();
        ordered.sort_by_key(|run| {
            run.first()
                .and_then(|e| system_time(e.event_time.as_ref()))
                .unwrap_or(SystemTime::UNIX_EPOCH)
        });
        let mut timeline = Self::default();
        for run in ordered {
            timeline.push_run(run);
        }
        timeline
    }

    fn push_run(&mut self, run: &[HistoryEvent]) {
        // Event IDs are per run: scheduled event ID → activity index, and → workflow task
        // index.
        let mut by_scheduled: HashMap<i64, usize> = HashMap::new();
        let mut tasks_by_scheduled: HashMap<i64, usize> = HashMap::new();
        for event in run {
            let at = system_time(event.event_time.as_ref());
            let kind = match &event.attributes {
                Some(Attributes::WorkflowExecutionStartedEventAttributes(_)) => Kind::Started,
                Some(Attributes::WorkflowExecutionSignaledEventAttributes(a)) => {
                    Kind::Signaled(a.signal_name.clone(), first_argument(a.input.as_ref()))
                }
                Some(Attributes::WorkflowTaskScheduledEventAttributes(_)) => {
                    let index = self.workflow_tasks.len();
                    self.workflow_tasks.push(WorkflowTask {
                        scheduled: at,
                        started: None,
                    });
                    tasks_by_scheduled.insert(event.event_id, index);
                    Kind::WorkflowTaskScheduled(index)
                }
                Some(Attributes::WorkflowTaskStartedEventAttributes(a)) => {
                    match tasks_by_scheduled.get(&a.scheduled_event_id) {
                        Some(&i) => {
                            self.workflow_tasks[i].started = at;
                            Kind::WorkflowTaskStarted(i)
                        }
                        None => Kind::Other,
                    }
                }
                Some(Attributes::WorkflowTaskCompletedEventAttributes(_)) => {
                    Kind::WorkflowTaskCompleted
                }
                Some(Attributes::ActivityTaskScheduledEventAttributes(a)) => {
                    let index = self.activities.len();
                    self.activities.push(Activity {
                        kind: a
                            .activity_type
                            .as_ref()
                            .map(|t| t.name.clone())
                            .unwrap_or_default(),
                        scheduled: at,
                        started: None,
                        completed: None,
                    });
                    by_scheduled.insert(event.event_id, index);
                    Kind::ActivityScheduled(index)
                }
                Some(Attributes::ActivityTaskStartedEventAttributes(a)) => {
                    if let Some(&i) = by_scheduled.get(&a.scheduled_event_id) {
                        self.activities[i].started = at;
                    }
                    Kind::Other
                }
                Some(Attributes::ActivityTaskCompletedEventAttributes(a)) => {
                    match by_scheduled.get(&a.scheduled_event_id) {
                        Some(&i) => {
                            self.activities[i].completed = at;
                            Kind::ActivityCompleted(i)
                        }
                        None => Kind::Other,
                    }
                }
                Some(Attributes::StartChildWorkflowExecutionInitiatedEventAttributes(a)) => {
                    Kind::ChildInitiated(a.workflow_id.clone())
                }
                Some(Attributes::TimerFiredEventAttributes(_)) => Kind::TimerFired,
                _ => Kind::Other,
            };
            self.events.push(Event { at, kind });
        }
    }

    /// Position of the first event at or after `from` that `matches`.
    fn find(&self, from: usize, matches: impl Fn(&Kind) -> bool) -> Option<usize> {
        (from..self.events.len()).find(|&i| matches(&self.events[i].kind))
    }

    fn at(&self, position: usize) -> Option<SystemTime> {
        self.events.get(position).and_then(|e| e.at)
    }

    /// What ran strictly between two positions: workflow tasks completed and activities
    /// scheduled (their types, in order).
    fn between(&self, from: usize, to: usize) -> Between {
        let mut between = Between::default();
        for event in self.events.iter().take(to).skip(from + 1) {
            match &event.kind {
                Kind::WorkflowTaskCompleted => between.workflow_tasks += 1,
                Kind::ActivityScheduled(i) => {
                    between.activities.push(self.activities[*i].kind.clone());
                }
                _ => {}
            }
        }
        between
    }

    /// Events in the history (every run).
    pub fn event_count(&self) -> usize {
        self.events.len()
    }

    /// Started − scheduled, ms, of every workflow task scheduled in `[from, to]` that started.
    pub fn workflow_task_waits(&self, from: SystemTime, to: SystemTime) -> Vec<f64> {
        waits(
            self.workflow_tasks.iter().map(|t| (t.scheduled, t.started)),
            from,
            to,
        )
    }

    /// Started − scheduled, ms, of every activity scheduled in `[from, to]` that started.
    pub fn activity_waits(&self, from: SystemTime, to: SystemTime) -> Vec<f64> {
        waits(
            self.activities.iter().map(|a| (a.scheduled, a.started)),
            from,
            to,
        )
    }
}

/// Started − scheduled, ms, of the tasks scheduled in `[from, to]` that started.
fn waits(
    tasks: impl Iterator<Item = (Option<SystemTime>, Option<SystemTime>)>,
    from: SystemTime,
    to: SystemTime,
) -> Vec<f64> {
    tasks
        .filter(|(scheduled, _)| scheduled.is_some_and(|s| s >= from && s <= to))
        .filter_map(|(scheduled, started)| ms(scheduled, started))
        .collect()
}

/// The first argument of a signal or activity, when it is JSON.
fn first_argument(payloads: Option<&Payloads>) -> Option<serde_json::Value> {
    let payload = payloads?.payloads.first()?;
    serde_json::from_slice(&payload.data).ok()
}

/// Workflow tasks and activities between two events of a history.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Between {
    /// `WorkflowTaskCompleted` events.
    pub workflow_tasks: usize,
    /// Types of the activities scheduled, in order.
    pub activities: Vec<String>,
}

impl Between {
    /// A short description: `2 WFTs; observe, ensure_finalizers`.
    pub fn describe(&self) -> String {
        let tasks = match self.workflow_tasks {
            1 => "1 WFT".to_owned(),
            n => format!("{n} WFTs"),
        };
        if self.activities.is_empty() {
            format!("{tasks}; no activity")
        } else {
            format!("{tasks}; {}", self.activities.join(", "))
        }
    }
}

/// Milliseconds from `from` to `to`; `None` when either is missing.
fn ms(from: Option<SystemTime>, to: Option<SystemTime>) -> Option<f64> {
    Some(seconds_between(from?, to?) * 1e3)
}

/// The hops of one reaction: the benchmark's TWD watch seeing the new generation → the
/// versioned Deployment seen by its Deployment watch, through the engine's workflows.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ReactionLedger {
    /// The benchmark's TWD watch event → `spec_changed` (the new generation) recorded in the
    /// TWD workflow, ms.
    pub watch_to_signal_ms: Option<f64>,
    /// Signal recorded → `create_deployment` scheduled by the TWD workflow itself, ms (since
    /// `create-with-start` it creates a new build's Deployment as it starts the rollout).
    pub signal_to_create_scheduled_ms: Option<f64>,
    /// Signal recorded → `StartChildWorkflowExecutionInitiated` of the new build's rollout, ms.
    pub signal_to_child_initiated_ms: Option<f64>,
    /// What the TWD workflow ran between the signal and the child's start.
    pub twd_between: Option<Between>,
    /// Child initiated → the rollout's `WorkflowExecutionStarted`, ms.
    pub child_initiated_to_started_ms: Option<f64>,
    /// Rollout started → `create_deployment` scheduled, ms.
    pub started_to_create_scheduled_ms: Option<f64>,
    /// What the rollout ran between its start and scheduling `create_deployment`.
    pub rollout_between: Option<Between>,
    /// `create_deployment` scheduled → started, ms.
    pub create_scheduled_to_started_ms: Option<f64>,
    /// `create_deployment` started → completed, ms.
    pub create_started_to_completed_ms: Option<f64>,
    /// `create_deployment` completed → the Deployment seen by the benchmark's watch, ms
    /// (negative when the watch saw the Deployment before Temporal recorded the completion).
    pub create_completed_to_seen_ms: Option<f64>,
    /// `create_deployment` started → the Deployment seen by the benchmark's watch, ms (the
    /// create call and the watch's fan-out, without the completion's report to Temporal).
    pub create_started_to_seen_ms: Option<f64>,
}

/// What the reaction ledger is read from.
#[derive(Debug, Clone, Copy)]
pub struct ReactionInput<'a> {
    /// The TWD workflow's timeline.
    pub twd: &'a Timeline,
    /// The new build's rollout workflow's timeline.
    pub rollout: &'a Timeline,
    /// The TWD's new `metadata.generation`.
    pub generation: i64,
    /// The new build's rollout workflow ID.
    pub rollout_workflow_id: &'a str,
    /// When the benchmark's TWD watch saw the new generation (its clock).
    pub watch_seen: Option<SystemTime>,
    /// When the benchmark's Deployment watch saw the new Deployment (its clock).
    pub deployment_seen: Option<SystemTime>,
}

/// Where the events of one reaction are: positions in the TWD's and the rollout's timelines.
struct ReactionEvents {
    /// `spec_changed` carrying the new generation (TWD timeline).
    signal: Option<usize>,
    /// `StartChildWorkflowExecutionInitiated` of the new build's rollout (TWD timeline).
    child: Option<usize>,
    /// The rollout's `WorkflowExecutionStarted` (rollout timeline).
    started: Option<usize>,
    /// The rollout's first `ActivityTaskScheduled` of `create_deployment` (rollout timeline).
    create: Option<usize>,
    /// The TWD workflow's `ActivityTaskScheduled` of `create_deployment` after the signal (TWD
    /// timeline).
    twd_create: Option<usize>,
}

impl ReactionEvents {
    fn find(input: &ReactionInput<'_>) -> Self {
        let ReactionInput {
            twd,
            rollout,
            generation,
            rollout_workflow_id,
            ..
        } = *input;
        let signal = twd.find(0, |k| match k {
            Kind::Signaled(name, Some(arg)) => {
                name == SPEC_CHANGED
                    && arg.get("generation").and_then(serde_json::Value::as_i64) == Some(generation)
            }
            _ => false,
        });
        // The child is looked for after the signal when there is one (an older build's rollout
        // may share nothing with it, but a retried start could), else anywhere: the workflow's
        // own observation can see the new spec and start the child before the signal arrives.
        let is_child =
            |k: &Kind| matches!(k, Kind::ChildInitiated(id) if id == rollout_workflow_id);
        let child = twd
            .find(signal.unwrap_or(0), is_child)
            .or_else(|| twd.find(0, is_child));
        let started = rollout.find(0, |k| matches!(k, Kind::Started));
        let create = rollout.find(started.unwrap_or(0), |k| {
            matches!(k, Kind::ActivityScheduled(i) if rollout.activities[*i].kind == CREATE_DEPLOYMENT)
        });
        let twd_create = signal.and_then(|from| {
            twd.find(from, |k| {
                matches!(k, Kind::ActivityScheduled(i) if twd.activities[*i].kind == CREATE_DEPLOYMENT)
            })
        });
        Self {
            signal,
            child,
            started,
            create,
            twd_create,
        }
    }

    /// The `create_deployment` activity: the TWD workflow's when it created the Deployment,
    /// else the rollout's.
    fn create_activity<'a>(
        &self,
        twd: &'a Timeline,
        rollout: &'a Timeline,
    ) -> Option<&'a Activity> {
        let scheduled =
            |timeline: &'a Timeline, position: usize| match timeline.events[position].kind {
                Kind::ActivityScheduled(i) => timeline.activities.get(i),
                _ => None,
            };
        match self.twd_create {
            Some(p) => scheduled(twd, p),
            None => self.create.and_then(|p| scheduled(rollout, p)),
        }
    }
}

impl ReactionLedger {
    /// The ledger of one reaction.
    pub fn read(input: ReactionInput<'_>) -> Self {
        let ReactionInput {
            twd,
            rollout,
            watch_seen,
            deployment_seen,
            ..
        } = input;
        let found = ReactionEvents::find(&input);
        let ReactionEvents {
            signal,
            child,
            started,
            create,
            ..
        } = found;
        let create_activity = found.create_activity(twd, rollout);
        let twd_create = found.twd_create;
        let signal_at = signal.and_then(|p| twd.at(p));
        let child_at = child.and_then(|p| twd.at(p));
        let started_at = started.and_then(|p| rollout.at(p));
        Self {
            watch_to_signal_ms: ms(watch_seen, signal_at),
            signal_to_create_scheduled_ms: ms(signal_at, twd_create.and_then(|p| twd.at(p))),
            signal_to_child_initiated_ms: ms(signal_at, child_at),
            twd_between: signal
                .zip(child)
                .filter(|(s, c)| s < c)
                .map(|(s, c)| twd.between(s, c)),
            child_initiated_to_started_ms: ms(child_at, started_at),
            started_to_create_scheduled_ms: ms(started_at, create.and_then(|p| rollout.at(p))),
            rollout_between: started.zip(create).map(|(s, c)| rollout.between(s, c)),
            create_scheduled_to_started_ms: create_activity
                .and_then(|a| ms(a.scheduled, a.started)),
            create_started_to_completed_ms: create_activity
                .and_then(|a| ms(a.started, a.completed)),
            create_completed_to_seen_ms: create_activity
                .and_then(|a| ms(a.completed, deployment_seen)),
            create_started_to_seen_ms: create_activity.and_then(|a| ms(a.started, deployment_seen)),
        }
    }

    /// The timed hops, named as in the report.
    pub fn hops(&self) -> [(&'static str, Option<f64>); 9] {
        [
            (
                "TWD watch event → spec_changed recorded",
                self.watch_to_signal_ms,
            ),
            (
                "signal recorded → create_deployment scheduled (TWD workflow)",
                self.signal_to_create_scheduled_ms,
            ),
            (
                "signal recorded → child rollout initiated",
                self.signal_to_child_initiated_ms,
            ),
            (
                "child initiated → rollout started",
                self.child_initiated_to_started_ms,
            ),
            (
                "rollout started → create_deployment scheduled",
                self.started_to_create_scheduled_ms,
            ),
            (
                "create_deployment scheduled → started",
                self.create_scheduled_to_started_ms,
            ),
            (
                "create_deployment started → completed",
                self.create_started_to_completed_ms,
            ),
            (
                "create_deployment completed → Deployment seen",
                self.create_completed_to_seen_ms,
            ),
            (
                "create_deployment started → Deployment seen",
                self.create_started_to_seen_ms,
            ),
        ]
    }
}

/// The hops of one promotion: the Deployment Available → the build Current in Temporal, through
/// the rollout workflow.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PromotionLedger {
    /// The Deployment seen Available by the benchmark's watch → `wait_for_pollers` completed,
    /// ms.
    pub available_to_wait_completed_ms: Option<f64>,
    /// `wait_for_pollers` completed → the next activity scheduled, ms.
    pub wait_completed_to_next_scheduled_ms: Option<f64>,
    /// What the rollout ran between `wait_for_pollers` completing and `set_routing` scheduled
    /// (`set_routing` itself not included).
    pub wait_to_routing_between: Option<Between>,
    /// `wait_for_pollers` completed → `set_routing` scheduled, ms.
    pub wait_completed_to_routing_scheduled_ms: Option<f64>,
    /// `set_routing` scheduled → started, ms.
    pub routing_scheduled_to_started_ms: Option<f64>,
    /// `set_routing` started → Temporal's `currentVersionChangedTime`, ms.
    pub routing_started_to_current_ms: Option<f64>,
    /// `set_routing` started → completed, ms.
    pub routing_started_to_completed_ms: Option<f64>,
    /// Temporal's `currentVersionChangedTime` → `set_routing` completed, ms: how long Temporal's
    /// write went on after it stamped the change (the status cannot show it before).
    pub current_to_routing_completed_ms: Option<f64>,
    /// `set_routing` completed → the benchmark's TWD watch shows the build as
    /// `status.currentVersion`, ms: the controller's share of the status lag.
    pub routing_completed_to_status_ms: Option<f64>,
}

impl PromotionLedger {
    /// The ledger of one promotion from the rollout's timeline, when the benchmark saw the
    /// Deployment Available, Temporal's `currentVersionChangedTime` of the build, and when the
    /// benchmark's TWD watch showed the build as `status.currentVersion`.
    pub fn read(
        rollout: &Timeline,
        available_seen: Option<SystemTime>,
        current_since: Option<SystemTime>,
        status_seen: Option<SystemTime>,
    ) -> Self {
        let routing_calls: Vec<usize> = (0..rollout.events.len())
            .filter(|&p| matches!(rollout.events[p].kind, Kind::ActivityScheduled(i) if rollout.activities[i].kind == SET_ROUTING))
            .collect();
        let activity_at = |p: usize| match rollout.events[p].kind {
            Kind::ActivityScheduled(i) | Kind::ActivityCompleted(i) => rollout.activities.get(i),
            _ => None,
        };
        // The call that made the build Current completes after the change; without the change's
        // time, the first call after the last wait.
        let last_wait_before = |end: usize| {
            (0..end).rev().find(|&p| {
                matches!(rollout.events[p].kind, Kind::ActivityCompleted(i) if rollout.activities[i].kind == WAIT_FOR_POLLERS)
            })
        };
        let routing = match current_since {
            Some(current) => routing_calls.iter().copied().find(|&p| {
                activity_at(p)
                    .and_then(|a| a.completed)
                    .is_some_and(|c| c >= current)
            }),
            None => None,
        }
        .or_else(|| {
            let wait = last_wait_before(rollout.events.len())?;
            routing_calls.iter().copied().find(|&p| p > wait)
        });
        let wait = match routing {
            Some(r) => last_wait_before(r),
            None => last_wait_before(rollout.events.len()),
        };
        let wait_done = wait.and_then(|p| rollout.at(p));
        let next =
            wait.and_then(|w| rollout.find(w + 1, |k| matches!(k, Kind::ActivityScheduled(_))));
        let call = routing.and_then(activity_at);
        Self {
            available_to_wait_completed_ms: ms(available_seen, wait_done),
            wait_completed_to_next_scheduled_ms: ms(wait_done, next.and_then(|p| rollout.at(p))),
            wait_to_routing_between: wait
                .zip(routing)
                .filter(|(w, r)| w < r)
                .map(|(w, r)| rollout.between(w, r)),
            wait_completed_to_routing_scheduled_ms: ms(wait_done, call.and_then(|a| a.scheduled)),
            routing_scheduled_to_started_ms: call.and_then(|a| ms(a.scheduled, a.started)),
            routing_started_to_current_ms: call.and_then(|a| ms(a.started, current_since)),
            routing_started_to_completed_ms: call.and_then(|a| ms(a.started, a.completed)),
            current_to_routing_completed_ms: call.and_then(|a| ms(current_since, a.completed)),
            routing_completed_to_status_ms: call.and_then(|a| ms(a.completed, status_seen)),
        }
    }

    /// The timed hops, named as in the report.
    pub fn hops(&self) -> [(&'static str, Option<f64>); 8] {
        [
            (
                "Deployment seen Available → wait_for_pollers completed",
                self.available_to_wait_completed_ms,
            ),
            (
                "wait_for_pollers completed → next activity scheduled",
                self.wait_completed_to_next_scheduled_ms,
            ),
            (
                "wait_for_pollers completed → set_routing scheduled",
                self.wait_completed_to_routing_scheduled_ms,
            ),
            (
                "set_routing scheduled → started",
                self.routing_scheduled_to_started_ms,
            ),
            (
                "set_routing started → Current in Temporal",
                self.routing_started_to_current_ms,
            ),
            (
                "set_routing started → completed",
                self.routing_started_to_completed_ms,
            ),
            (
                "Current in Temporal → set_routing completed (Temporal's write returning)",
                self.current_to_routing_completed_ms,
            ),
            (
                "set_routing completed → status shows Current (the controller's report)",
                self.routing_completed_to_status_ms,
            ),
        ]
    }
}

/// Where one reaction of a burst stood at each milestone, ms after the burst's first apply was
/// sent (wall clock; Temporal's event times are on the same machine's clock). A milestone that
/// cannot be found is `None` (missing), never 0.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct BurstMilestones {
    /// The benchmark sent this TWD's apply.
    pub apply_sent_ms: Option<f64>,
    /// The benchmark's TWD watch saw the new generation.
    pub twd_watch_ms: Option<f64>,
    /// `spec_changed` carrying the new generation recorded in the TWD workflow.
    pub signal_recorded_ms: Option<f64>,
    /// `WorkflowTaskScheduled` of the TWD workflow task that handled the signal (earlier than
    /// the signal when a task was already scheduled and took it).
    pub twd_task_scheduled_ms: Option<f64>,
    /// `WorkflowTaskStarted` of the TWD workflow task that handled the signal (the first
    /// started after it).
    pub twd_task_started_ms: Option<f64>,
    /// `StartChildWorkflowExecutionInitiated` of the new build's rollout.
    pub child_initiated_ms: Option<f64>,
    /// The rollout's `WorkflowExecutionStarted`.
    pub rollout_started_ms: Option<f64>,
    /// The rollout's first `WorkflowTaskScheduled`.
    pub rollout_task_scheduled_ms: Option<f64>,
    /// That workflow task's `WorkflowTaskStarted`.
    pub rollout_task_started_ms: Option<f64>,
    /// The rollout's first `create_deployment` scheduled.
    pub create_scheduled_ms: Option<f64>,
    /// That activity started.
    pub create_started_ms: Option<f64>,
    /// That activity completed.
    pub create_completed_ms: Option<f64>,
    /// The benchmark's Deployment watch saw the new Deployment.
    pub deployment_seen_ms: Option<f64>,
    /// The TWD workflow scheduled the create, in the task that started the rollout (since
    /// `create-with-start`), rather than the rollout's first task.
    pub created_by_twd: bool,
}

/// One milestone of a reaction: its name, when it was reached (ms after the origin), and the
/// name of the milestone it follows (in the same list), whose time its hop is counted from.
pub type Milestone = (&'static str, Option<f64>, Option<&'static str>);

impl BurstMilestones {
    /// The milestones of one reaction, from the same events as its [`ReactionLedger`], with
    /// when the benchmark sent the TWD's apply, counted from `origin` (the burst's first apply
    /// sent).
    pub fn read(
        input: ReactionInput<'_>,
        apply_sent: Option<SystemTime>,
        origin: SystemTime,
    ) -> Self {
        let ReactionInput {
            twd,
            rollout,
            watch_seen,
            deployment_seen,
            ..
        } = input;
        let found = ReactionEvents::find(&input);
        // The TWD workflow task that handled the signal: the first to start after it.
        let twd_task = found
            .signal
            .and_then(|s| twd.find(s, |k| matches!(k, Kind::WorkflowTaskStarted(_))))
            .and_then(|p| match twd.events[p].kind {
                Kind::WorkflowTaskStarted(i) => twd.workflow_tasks.get(i),
                _ => None,
            });
        let rollout_task = found
            .started
            .and_then(|s| rollout.find(s, |k| matches!(k, Kind::WorkflowTaskScheduled(_))))
            .and_then(|p| match rollout.events[p].kind {
                Kind::WorkflowTaskScheduled(i) => rollout.workflow_tasks.get(i),
                _ => None,
            });
        let create = found.create_activity(twd, rollout);
        let after = |at: Option<SystemTime>| ms(Some(origin), at);
        Self {
            apply_sent_ms: after(apply_sent),
            twd_watch_ms: after(watch_seen),
            signal_recorded_ms: after(found.signal.and_then(|p| twd.at(p))),
            twd_task_scheduled_ms: after(twd_task.and_then(|t| t.scheduled)),
            twd_task_started_ms: after(twd_task.and_then(|t| t.started)),
            child_initiated_ms: after(found.child.and_then(|p| twd.at(p))),
            rollout_started_ms: after(found.started.and_then(|p| rollout.at(p))),
            rollout_task_scheduled_ms: after(rollout_task.and_then(|t| t.scheduled)),
            rollout_task_started_ms: after(rollout_task.and_then(|t| t.started)),
            create_scheduled_ms: after(create.and_then(|a| a.scheduled)),
            create_started_ms: after(create.and_then(|a| a.started)),
            create_completed_ms: after(create.and_then(|a| a.completed)),
            deployment_seen_ms: after(deployment_seen),
            created_by_twd: found.twd_create.is_some(),
        }
    }

    /// The milestones in the order a reaction passes them, named as in the report, each with
    /// the one it follows. The rollout's start and the create are two branches after the TWD
    /// workflow's task: the create follows that task when the TWD workflow made it, the
    /// rollout's first task otherwise, so no hop is counted across the branches.
    pub fn milestones(&self) -> [Milestone; 13] {
        const APPLY: &str = "apply sent";
        const WATCH: &str = "TWD watch event";
        const SIGNAL: &str = "spec_changed recorded";
        const TWD_SCHEDULED: &str = "TWD workflow task scheduled";
        const TWD_STARTED: &str = "TWD workflow task started";
        const CHILD: &str = "child rollout initiated";
        const ROLLOUT: &str = "rollout started";
        const ROLLOUT_SCHEDULED: &str = "rollout's first workflow task scheduled";
        const ROLLOUT_STARTED: &str = "rollout's first workflow task started";
        const CREATE_STARTED: &str = "create_deployment started";
        let (create, create_follows) = if self.created_by_twd {
            ("create_deployment scheduled (TWD workflow)", TWD_STARTED)
        } else {
            ("create_deployment scheduled (rollout)", ROLLOUT_STARTED)
        };
        [
            (APPLY, self.apply_sent_ms, None),
            (WATCH, self.twd_watch_ms, Some(APPLY)),
            (SIGNAL, self.signal_recorded_ms, Some(WATCH)),
            (TWD_SCHEDULED, self.twd_task_scheduled_ms, Some(SIGNAL)),
            (TWD_STARTED, self.twd_task_started_ms, Some(TWD_SCHEDULED)),
            (CHILD, self.child_initiated_ms, Some(TWD_STARTED)),
            (ROLLOUT, self.rollout_started_ms, Some(CHILD)),
            (
                ROLLOUT_SCHEDULED,
                self.rollout_task_scheduled_ms,
                Some(ROLLOUT),
            ),
            (
                ROLLOUT_STARTED,
                self.rollout_task_started_ms,
                Some(ROLLOUT_SCHEDULED),
            ),
            (create, self.create_scheduled_ms, Some(create_follows)),
            (CREATE_STARTED, self.create_started_ms, Some(create)),
            (
                "create_deployment completed",
                self.create_completed_ms,
                Some(CREATE_STARTED),
            ),
            (
                "Deployment seen",
                self.deployment_seen_ms,
                Some(CREATE_STARTED),
            ),
        ]
    }
}

/// One milestone over the reactions of a burst.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct MilestoneSummary {
    /// The milestone.
    pub milestone: String,
    /// When the reactions reached it, ms after the first apply (over those where it was found).
    pub at_ms: Option<Summary>,
    /// Latest − earliest, ms: how far apart the reactions reached it.
    pub spread_ms: Option<f64>,
    /// The milestone the hop is counted from (`None` for the first).
    pub follows: Option<String>,
    /// Per reaction, this milestone − the one it follows, ms (`None` for the first milestone).
    pub hop_ms: Option<Summary>,
    /// Reactions where the milestone was not found.
    pub missing: usize,
}

/// Summaries of the same milestones over the reactions of a burst (each given as its
/// `milestones()`): when they were reached, how far apart, and the hop from the milestone each
/// follows. A reaction's own predecessor is used, so reactions whose create was made by
/// different workflows are each counted from theirs; the summary names the first reaction's.
pub fn summarize_milestones<const N: usize>(reactions: &[[Milestone; N]]) -> Vec<MilestoneSummary> {
    let Some(first) = reactions.first() else {
        return Vec::new();
    };
    (0..N)
        .map(|k| {
            let at: Vec<f64> = reactions.iter().filter_map(|r| r[k].1).collect();
            let hops: Vec<f64> = reactions
                .iter()
                .filter_map(|r| {
                    let follows = r[k].2?;
                    let previous = r.iter().find(|m| m.0 == follows)?;
                    Some(r[k].1? - previous.1?)
                })
                .collect();
            let at_ms = Summary::of(&at);
            MilestoneSummary {
                milestone: first[k].0.to_owned(),
                follows: first[k].2.map(str::to_owned),
                spread_ms: at_ms.as_ref().map(|s| s.max - s.min),
                hop_ms: Summary::of(&hops),
                missing: reactions.len() - at.len(),
                at_ms,
            }
        })
        .collect()
}

/// How long tasks waited for a worker (started − scheduled) in a window of a burst: a queue of
/// workflow tasks or activities shows here.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct QueueWaits {
    /// Workflow tasks of the TWD workflows scheduled in the window, ms.
    pub twd_workflow_tasks_ms: Option<Summary>,
    /// Workflow tasks of the rollout workflows scheduled in the window, ms.
    pub rollout_workflow_tasks_ms: Option<Summary>,
    /// Activities (any type) of both scheduled in the window, ms.
    pub activities_ms: Option<Summary>,
}

impl QueueWaits {
    /// The waits of the tasks scheduled in `[from, to]` in these timelines.
    pub fn read(
        twds: &[Timeline],
        rollouts: &[Timeline],
        from: SystemTime,
        to: SystemTime,
    ) -> Self {
        let tasks = |timelines: &[Timeline]| {
            let waits: Vec<f64> = timelines
                .iter()
                .flat_map(|t| t.workflow_task_waits(from, to))
                .collect();
            Summary::of(&waits)
        };
        let activities: Vec<f64> = twds
            .iter()
            .chain(rollouts)
            .flat_map(|t| t.activity_waits(from, to))
            .collect();
        Self {
            twd_workflow_tasks_ms: tasks(twds),
            rollout_workflow_tasks_ms: tasks(rollouts),
            activities_ms: Summary::of(&activities),
        }
    }
}

/// One hop over many rollouts.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct HopSummary {
    /// The hop.
    pub hop: String,
    /// Its duration over the rollouts where both ends were found, ms.
    pub ms: Option<Summary>,
    /// Rollouts where an end was not found.
    pub missing: usize,
}

/// Summaries of the same hops over many ledgers (each given as its `hops()`).
pub fn summarize<const N: usize>(ledgers: &[[(&'static str, Option<f64>); N]]) -> Vec<HopSummary> {
    let Some(first) = ledgers.first() else {
        return Vec::new();
    };
    (0..N)
        .map(|k| {
            let values: Vec<f64> = ledgers.iter().filter_map(|l| l[k].1).collect();
            HopSummary {
                hop: first[k].0.to_owned(),
                missing: ledgers.len() - values.len(),
                ms: Summary::of(&values),
            }
        })
        .collect()
}

/// How often each "what ran in between" occurred over many ledgers (`missing` for ledgers
/// where it could not be read), most frequent first.
pub fn tally<'a>(between: impl IntoIterator<Item = Option<&'a Between>>) -> Vec<(String, usize)> {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for b in between {
        let key = b.map_or_else(|| "missing".to_owned(), Between::describe);
        *counts.entry(key).or_default() += 1;
    }
    let mut counts: Vec<(String, usize)> = counts.into_iter().collect();
    counts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    counts
}

/// What an idle TWD workflow spent in a window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct IdleTurns {
    /// Events stamped inside the window.
    pub events: usize,
    /// `TimerFired` events inside the window (each wakes the workflow for a turn).
    pub timers_fired: usize,
    /// `WorkflowTaskCompleted` events inside the window.
    pub workflow_tasks: usize,
    /// `observe` and `recheck` activities scheduled inside the window, and local ones recorded
    /// (a quiet turn's, by their marker): each reads Temporal's worker deployment once.
    pub observations: usize,
    /// When the first and the last of those were scheduled (or recorded).
    pub observed_between: Option<(SystemTime, SystemTime)>,
}

impl IdleTurns {
    /// Observations beyond what a resync every `resync` explains: one more than the resync
    /// periods between the first and the last (a second of slack for the timers' own delays).
    pub fn observations_beyond(&self, resync: Duration) -> usize {
        let Some((span, _)) = self.observation_intervals() else {
            return 0;
        };
        let periods =
            ((span + Duration::from_secs(1)).as_secs_f64() / resync.as_secs_f64()).floor() as usize;
        self.observations.saturating_sub(1 + periods)
    }

    /// The time between this workflow's first and last observation in the window, and the
    /// number of intervals it spans (observations − 1); `None` with fewer than two.
    pub fn observation_intervals(&self) -> Option<(Duration, usize)> {
        let (first, last) = self.observed_between?;
        let intervals = self.observations.checked_sub(1).filter(|n| *n > 0)?;
        Some((last.duration_since(first).unwrap_or_default(), intervals))
    }

    /// What the workflow with `runs` recorded in `[from, to]`.
    pub fn read(runs: &[Vec<HistoryEvent>], from: SystemTime, to: SystemTime) -> Self {
        let mut turns = Self::default();
        for event in runs.iter().flatten() {
            let Some(at) = system_time(event.event_time.as_ref()) else {
                continue;
            };
            if at < from || at > to {
                continue;
            }
            turns.events += 1;
            match &event.attributes {
                Some(Attributes::TimerFiredEventAttributes(_)) => turns.timers_fired += 1,
                Some(Attributes::WorkflowTaskCompletedEventAttributes(_)) => {
                    turns.workflow_tasks += 1;
                }
                Some(Attributes::ActivityTaskScheduledEventAttributes(a))
                    if a.activity_type
                        .as_ref()
                        .is_some_and(|t| OBSERVATIONS.contains(&t.name.as_str())) =>
                {
                    turns.observed(at);
                }
                // A quiet turn observes in a local activity: its marker.
                Some(Attributes::MarkerRecordedEventAttributes(m))
                    if local_activity_type(m)
                        .is_some_and(|t| OBSERVATIONS.contains(&t.as_str())) =>
                {
                    turns.observed(at);
                }
                _ => {}
            }
        }
        turns
    }

    fn observed(&mut self, at: SystemTime) {
        self.observations += 1;
        let first = self.observed_between.map_or(at, |(first, _)| first.min(at));
        let last = self.observed_between.map_or(at, |(_, last)| last.max(at));
        self.observed_between = Some((first, last));
    }
}

/// The activity type of a local-activity marker (the SDK writes its data as JSON); `None` for
/// another marker.
fn local_activity_type(marker: &MarkerRecordedEventAttributes) -> Option<String> {
    if marker.marker_name != crate::actions::LOCAL_ACTIVITY_MARKER {
        return None;
    }
    let data = marker.details.get("data")?.payloads.first()?;
    let data: serde_json::Value = serde_json::from_slice(&data.data).ok()?;
    Some(data.get("activity_type")?.as_str()?.to_owned())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use temporalio_common::protos::temporal::api::common::v1::{ActivityType, Payload};
    use temporalio_common::protos::temporal::api::history::v1::{
        ActivityTaskCompletedEventAttributes, ActivityTaskScheduledEventAttributes,
        ActivityTaskStartedEventAttributes, StartChildWorkflowExecutionInitiatedEventAttributes,
        TimerFiredEventAttributes, WorkflowExecutionSignaledEventAttributes,
        WorkflowExecutionStartedEventAttributes, WorkflowTaskCompletedEventAttributes,
        WorkflowTaskScheduledEventAttributes, WorkflowTaskStartedEventAttributes,
    };

    use super::*;

    /// A run's events, numbered from 1, stamped `ms` after a fixed origin.
    struct Run(Vec<HistoryEvent>);

    fn t(ms: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000) + Duration::from_millis(ms)
    }

    impl Run {
        fn new() -> Self {
            Self(Vec::new())
        }

        fn push(mut self, ms: u64, attributes: Attributes) -> Self {
            let at = t(ms)
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default();
            self.0.push(HistoryEvent {
                event_id: self.0.len() as i64 + 1,
                event_time: Some(prost_wkt_types::Timestamp {
                    seconds: at.as_secs() as i64,
                    nanos: at.subsec_nanos() as i32,
                }),
                attributes: Some(attributes),
                ..Default::default()
            });
            self
        }

        fn started(self, ms: u64) -> Self {
            self.push(
                ms,
                WorkflowExecutionStartedEventAttributes::default().into(),
            )
        }

        fn task(self, ms: u64) -> Self {
            self.push(ms, WorkflowTaskScheduledEventAttributes::default().into())
                .push(ms, WorkflowTaskCompletedEventAttributes::default().into())
        }

        /// A workflow task scheduled, started and completed at the given times.
        fn timed_task(self, scheduled: u64, started: u64, completed: u64) -> Self {
            let run = self.push(
                scheduled,
                WorkflowTaskScheduledEventAttributes::default().into(),
            );
            let id = run.0.len() as i64;
            run.task_done(id, started, completed)
        }

        /// The workflow task scheduled as event `scheduled` started and completed.
        fn task_done(self, scheduled: i64, started: u64, completed: u64) -> Self {
            self.push(
                started,
                WorkflowTaskStartedEventAttributes {
                    scheduled_event_id: scheduled,
                    ..Default::default()
                }
                .into(),
            )
            .push(
                completed,
                WorkflowTaskCompletedEventAttributes::default().into(),
            )
        }

        fn signal(self, ms: u64, name: &str, generation: i64) -> Self {
            let input = Payloads {
                payloads: vec![Payload {
                    data: serde_json::to_vec(&serde_json::json!({
                        "generation": generation, "build_id": "b", "deleting": false
                    }))
                    .unwrap_or_default(),
                    ..Default::default()
                }],
            };
            self.push(
                ms,
                WorkflowExecutionSignaledEventAttributes {
                    signal_name: name.to_owned(),
                    input: Some(input),
                    ..Default::default()
                }
                .into(),
            )
        }

        fn child(self, ms: u64, workflow_id: &str) -> Self {
            self.push(
                ms,
                StartChildWorkflowExecutionInitiatedEventAttributes {
                    workflow_id: workflow_id.to_owned(),
                    ..Default::default()
                }
                .into(),
            )
        }

        /// An activity of `kind` scheduled, started and completed at the given times; returns
        /// the run and the scheduled event's ID.
        fn scheduled(self, ms: u64, kind: &str) -> (Self, i64) {
            let run = self.push(
                ms,
                ActivityTaskScheduledEventAttributes {
                    activity_type: Some(ActivityType {
                        name: kind.to_owned(),
                    }),
                    ..Default::default()
                }
                .into(),
            );
            let id = run.0.len() as i64;
            (run, id)
        }

        fn activity_done(self, scheduled: i64, started: u64, completed: u64) -> Self {
            self.push(
                started,
                ActivityTaskStartedEventAttributes {
                    scheduled_event_id: scheduled,
                    ..Default::default()
                }
                .into(),
            )
            .push(
                completed,
                ActivityTaskCompletedEventAttributes {
                    scheduled_event_id: scheduled,
                    ..Default::default()
                }
                .into(),
            )
        }

        fn activity(self, ms: u64, kind: &str, started: u64, completed: u64) -> Self {
            let (run, id) = self.scheduled(ms, kind);
            run.activity_done(id, started, completed)
        }

        /// A local activity of type `kind`, recorded as a marker by the task just completed.
        fn local_activity(self, ms: u64, kind: &str) -> Self {
            let data = serde_json::json!({ "seq": 1, "attempt": 1, "activity_type": kind });
            let completed = self.0.len() as i64;
            self.push(
                ms,
                MarkerRecordedEventAttributes {
                    marker_name: crate::actions::LOCAL_ACTIVITY_MARKER.to_owned(),
                    details: std::collections::HashMap::from([(
                        "data".to_owned(),
                        Payloads {
                            payloads: vec![Payload {
                                data: data.to_string().into_bytes(),
                                ..Default::default()
                            }],
                        },
                    )]),
                    workflow_task_completed_event_id: completed,
                    ..Default::default()
                }
                .into(),
            )
        }

        fn timer(self, ms: u64) -> Self {
            self.push(ms, TimerFiredEventAttributes::default().into())
        }
    }

    const ROLLOUT: &str = "rollout/ns/w/b2";

    fn twd_history() -> Timeline {
        let run = Run::new()
            .started(0)
            .task(1)
            .signal(100, SPEC_CHANGED, 1)
            .task(110)
            .signal(1_000, SPEC_CHANGED, 2)
            .task(1_010)
            .activity(1_012, "ensure_finalizers", 1_013, 1_020)
            .task(1_030)
            .child(1_030, ROLLOUT);
        Timeline::of(&[run.0])
    }

    #[test]
    fn reaction_ledger_times_each_hop_when_the_rollout_observes_before_creating() {
        let rollout = Run::new()
            .started(1_040)
            .task(1_050)
            .activity(1_050, "observe", 1_052, 1_080)
            .task(1_090);
        let (rollout, create) = rollout.scheduled(1_090, CREATE_DEPLOYMENT);
        let rollout = rollout.activity_done(create, 1_095, 1_120);
        let rollout = Timeline::of(&[rollout.0]);
        let ledger = ReactionLedger::read(ReactionInput {
            twd: &twd_history(),
            rollout: &rollout,
            generation: 2,
            rollout_workflow_id: ROLLOUT,
            watch_seen: Some(t(990)),
            deployment_seen: Some(t(1_125)),
        });
        assert_eq!(
            ledger.hops().map(|(_, ms)| ms.map(|v| v.round() as i64)),
            [
                Some(10),
                None,
                Some(30),
                Some(10),
                Some(50),
                Some(5),
                Some(25),
                Some(5),
                Some(30)
            ]
        );
        assert_eq!(
            ledger.twd_between,
            Some(Between {
                workflow_tasks: 2,
                activities: vec!["ensure_finalizers".to_owned()],
            })
        );
        assert_eq!(
            ledger.rollout_between.as_ref().map(Between::describe),
            Some("2 WFTs; observe".to_owned())
        );
    }

    /// A spec change whose TWD-workflow task (started 1,010 ms) creates the Deployment as it
    /// starts the rollout (both at 1,012 ms); the rollout's first task comes at 1,030 ms.
    fn created_with_start() -> (Timeline, Timeline) {
        let (twd, create) = Run::new()
            .started(0)
            .task(1)
            .signal(1_000, SPEC_CHANGED, 2)
            .timed_task(1_002, 1_010, 1_012)
            .scheduled(1_012, CREATE_DEPLOYMENT);
        let twd = Timeline::of(&[twd
            .child(1_012, ROLLOUT)
            .activity_done(create, 1_013, 1_040)
            .0]);
        let rollout = Timeline::of(&[Run::new()
            .started(1_020)
            .task(1_030)
            .activity(1_060, "observe", 1_061, 1_080)
            .0]);
        (twd, rollout)
    }

    /// The reaction of [`created_with_start`]: the TWD watch saw the change at 998 ms, the
    /// Deployment watch the Deployment at 1,038 ms.
    fn seen_at<'a>(twd: &'a Timeline, rollout: &'a Timeline) -> ReactionInput<'a> {
        ReactionInput {
            twd,
            rollout,
            generation: 2,
            rollout_workflow_id: ROLLOUT,
            watch_seen: Some(t(998)),
            deployment_seen: Some(t(1_038)),
        }
    }

    #[test]
    fn reaction_ledger_times_the_create_the_twd_workflow_makes_as_it_starts_the_rollout() {
        let (twd, rollout) = created_with_start();
        let ledger = ReactionLedger::read(seen_at(&twd, &rollout));
        assert_eq!(
            ledger.hops().map(|(_, ms)| ms.map(|v| v.round() as i64)),
            [
                Some(2),
                Some(12),
                Some(12),
                Some(8),
                None,
                Some(1),
                Some(27),
                Some(-2),
                Some(25)
            ]
        );
    }

    #[test]
    fn reaction_ledger_handles_create_as_the_first_activity() {
        let (rollout, create) = Run::new()
            .started(1_040)
            .task(1_045)
            .scheduled(1_045, CREATE_DEPLOYMENT);
        let rollout = rollout
            .activity(1_045, "observe", 1_046, 1_070)
            .activity_done(create, 1_046, 1_060);
        let rollout = Timeline::of(&[rollout.0]);
        let ledger = ReactionLedger::read(ReactionInput {
            twd: &twd_history(),
            rollout: &rollout,
            generation: 2,
            rollout_workflow_id: ROLLOUT,
            watch_seen: None,
            deployment_seen: Some(t(1_061)),
        });
        assert_eq!(ledger.watch_to_signal_ms, None, "no watch time: missing");
        assert_eq!(ledger.started_to_create_scheduled_ms, Some(5.0));
        assert_eq!(
            ledger.rollout_between,
            Some(Between {
                workflow_tasks: 1,
                activities: Vec::new(),
            })
        );
        assert_eq!(ledger.create_started_to_completed_ms, Some(14.0));
        assert_eq!(ledger.create_completed_to_seen_ms, Some(1.0));
    }

    #[test]
    fn reaction_ledger_reports_hops_it_cannot_find_as_missing() {
        let empty = Timeline::default();
        let ledger = ReactionLedger::read(ReactionInput {
            twd: &twd_history(),
            rollout: &empty,
            generation: 3,
            rollout_workflow_id: "rollout/ns/w/other",
            watch_seen: Some(t(0)),
            deployment_seen: Some(t(2_000)),
        });
        assert!(ledger.hops().iter().all(|(_, ms)| ms.is_none()));
        assert_eq!(ledger.twd_between, None);
        assert_eq!(ledger.rollout_between, None);
    }

    #[test]
    fn timeline_orders_runs_and_matches_activities_within_each_run() {
        // Event IDs restart in each run: run 2's activity must not complete run 1's.
        let (first, id) = Run::new().started(0).scheduled(5, "observe");
        let first = first.activity_done(id, 6, 9);
        let second = Run::new().started(100).activity(105, "observe", 106, 150);
        let timeline = Timeline::of(&[second.0, first.0]);
        assert_eq!(timeline.activities.len(), 2);
        assert_eq!(timeline.activities[0].completed, Some(t(9)));
        assert_eq!(timeline.activities[1].completed, Some(t(150)));
        assert_eq!(timeline.event_count(), 8);
    }

    #[test]
    fn promotion_ledger_follows_the_wait_to_the_routing_call_that_made_the_build_current() {
        let rollout = Run::new()
            .started(0)
            .task(1)
            .activity(1, CREATE_DEPLOYMENT, 2, 10)
            .task(11)
            .activity(11, WAIT_FOR_POLLERS, 12, 2_000)
            .task(2_010)
            .activity(2_010, "observe", 2_011, 2_040)
            .task(2_050)
            .activity(2_050, SET_ROUTING, 2_052, 2_080)
            .task(2_090)
            .activity(2_090, "observe", 2_091, 2_100);
        let rollout = Timeline::of(&[rollout.0]);
        let ledger =
            PromotionLedger::read(&rollout, Some(t(1_900)), Some(t(2_070)), Some(t(2_135)));
        assert_eq!(
            ledger.hops().map(|(_, ms)| ms.map(|v| v.round() as i64)),
            [
                Some(100),
                Some(10),
                Some(50),
                Some(2),
                Some(18),
                Some(28),
                Some(10),
                Some(55)
            ]
        );
        assert_eq!(
            ledger
                .wait_to_routing_between
                .as_ref()
                .map(Between::describe),
            Some("2 WFTs; observe".to_owned())
        );
    }

    #[test]
    fn promotion_ledger_without_a_wait_reports_the_wait_hops_missing() {
        let rollout = Run::new()
            .started(0)
            .task(1)
            .activity(1, SET_ROUTING, 2, 30);
        let rollout = Timeline::of(&[rollout.0]);
        let ledger = PromotionLedger::read(&rollout, Some(t(0)), Some(t(20)), None);
        assert_eq!(ledger.available_to_wait_completed_ms, None);
        assert_eq!(ledger.current_to_routing_completed_ms, Some(10.0));
        assert_eq!(ledger.routing_completed_to_status_ms, None);
        assert_eq!(ledger.wait_completed_to_routing_scheduled_ms, None);
        assert_eq!(ledger.wait_to_routing_between, None);
        assert_eq!(ledger.routing_started_to_current_ms, Some(18.0));
    }

    #[test]
    fn summaries_count_missing_hops_apart_from_measured_ones() {
        let a = [("hop", Some(10.0))];
        let b = [("hop", None)];
        let c = [("hop", Some(30.0))];
        let summary = summarize(&[a, b, c]);
        assert_eq!(summary.len(), 1);
        assert_eq!(summary[0].missing, 1);
        assert_eq!(
            summary[0].ms.as_ref().map(|s| (s.n, s.median)),
            Some((2, 10.0))
        );
        let one = Between {
            workflow_tasks: 1,
            activities: Vec::new(),
        };
        assert_eq!(
            tally([Some(&one), None, Some(&one)]),
            vec![
                ("1 WFT; no activity".to_owned(), 2),
                ("missing".to_owned(), 1)
            ]
        );
    }

    #[test]
    fn idle_turns_count_only_events_inside_the_window() {
        // A quiet turn's recheck and a later observe count as observations; the write does not,
        // nor the recheck after the window.
        let run = Run::new()
            .started(0)
            .task(1)
            .timer(1_000)
            .task(1_001)
            .activity(1_002, "recheck", 1_003, 1_010)
            .task(1_011)
            .activity(1_012, "write_status", 1_013, 1_020)
            .task(1_021)
            .activity(1_022, "observe", 1_023, 1_030)
            .task(1_031)
            .timer(5_000)
            .task(5_001)
            .activity(5_002, "recheck", 5_003, 5_010);
        let runs = [run.0];
        let turns = IdleTurns::read(&runs, t(500), t(1_500));
        assert_eq!(
            turns,
            IdleTurns {
                events: 18,
                timers_fired: 1,
                workflow_tasks: 4,
                observations: 2,
                observed_between: Some((t(1_002), t(1_022))),
            }
        );
        // Two observations 20 ms apart: one interval of 20 ms; the later recheck is outside.
        assert_eq!(
            turns.observation_intervals(),
            Some((Duration::from_millis(20), 1))
        );
        let whole = IdleTurns::read(&runs, t(500), t(6_000));
        assert_eq!(
            whole.observation_intervals(),
            Some((Duration::from_millis(4_000), 2))
        );
        let one = IdleTurns::read(&runs, t(4_000), t(6_000));
        assert_eq!(
            one.observation_intervals(),
            None,
            "a single observation spans nothing"
        );

        // With a resync every 2 s: the observations 20 ms apart are one more than it explains,
        // three over 4 s are what it explains; one alone is nothing beyond.
        let resync = Duration::from_secs(2);
        assert_eq!(turns.observations_beyond(resync), 1);
        assert_eq!(whole.observations_beyond(resync), 0);
        assert_eq!(one.observations_beyond(resync), 0);
        assert_eq!(whole.observations_beyond(Duration::from_secs(10)), 2);
    }

    #[test]
    fn a_quiet_turn_observes_in_a_local_activity_its_marker_counts() {
        // Turns only the timer woke: the observation is a local activity, one marker each; a
        // marker of another local activity is no observation.
        let run = Run::new()
            .started(0)
            .task(1)
            .timer(1_000)
            .task(1_001)
            .local_activity(1_005, "observe")
            .timer(301_000)
            .task(301_001)
            .local_activity(301_005, "recheck")
            .local_activity(301_006, "write_status");
        let turns = IdleTurns::read(&[run.0], t(500), t(400_000));
        assert_eq!(turns.observations, 2);
        assert_eq!(
            turns.observation_intervals(),
            Some((Duration::from_millis(300_000), 1))
        );
        assert_eq!(turns.observations_beyond(Duration::from_secs(300)), 0);
    }
    /// The rollout of the burst tests: started at 1_040, its first task queued 300 ms,
    /// `create_deployment` scheduled in that task and queued 200 ms.
    fn burst_rollout() -> Timeline {
        let (rollout, create) = Run::new()
            .started(1_040)
            .timed_task(1_040, 1_340, 1_350)
            .scheduled(1_350, CREATE_DEPLOYMENT);
        Timeline::of(&[rollout.activity_done(create, 1_550, 1_600).0])
    }

    fn burst_input<'a>(twd: &'a Timeline, rollout: &'a Timeline) -> ReactionInput<'a> {
        ReactionInput {
            twd,
            rollout,
            generation: 2,
            rollout_workflow_id: ROLLOUT,
            watch_seen: Some(t(520)),
            deployment_seen: Some(t(1_590)),
        }
    }

    #[test]
    fn burst_milestones_take_the_signal_s_task_even_when_it_was_scheduled_before_the_signal() {
        // A task already scheduled (not started) when the signal arrives handles it.
        let (twd, task) = Run::new()
            .started(0)
            .timed_task(1, 2, 3)
            .scheduled(4, "observe");
        let twd = twd
            .activity_done(task, 5, 400)
            .push(400, WorkflowTaskScheduledEventAttributes::default().into());
        let scheduled = twd.0.len() as i64;
        let twd = twd
            .signal(530, SPEC_CHANGED, 2)
            .task_done(scheduled, 900, 1_010)
            .child(1_010, ROLLOUT);
        let twd = Timeline::of(&[twd.0]);
        let rollout = burst_rollout();
        let milestones = BurstMilestones::read(burst_input(&twd, &rollout), Some(t(510)), t(500));
        assert_eq!(
            milestones
                .milestones()
                .map(|(_, ms, _)| ms.map(|v| v.round() as i64)),
            [
                Some(10),
                Some(20),
                Some(30),
                Some(-100),
                Some(400),
                Some(510),
                Some(540),
                Some(540),
                Some(840),
                Some(850),
                Some(1_050),
                Some(1_100),
                Some(1_090),
            ]
        );
    }

    #[test]
    fn burst_milestone_hops_follow_the_create_the_twd_workflow_makes_not_the_rollout_s_task() {
        // The TWD workflow schedules the create in the task that starts the rollout; the
        // rollout's first task comes later. The create's hop counts from the TWD task, so no
        // hop is negative.
        let (twd, rollout) = created_with_start();
        let input = seen_at(&twd, &rollout);
        let milestones = BurstMilestones::read(input, Some(t(990)), t(990));
        assert!(milestones.created_by_twd);
        let summary = summarize_milestones(&[milestones.milestones()]);
        let hops: Vec<(&str, Option<&str>, Option<i64>)> = summary
            .iter()
            .map(|m| {
                (
                    m.milestone.as_str(),
                    m.follows.as_deref(),
                    m.hop_ms.as_ref().map(|h| h.median.round() as i64),
                )
            })
            .collect();
        assert!(
            hops.iter().all(|(_, _, hop)| hop.is_none_or(|h| h >= 0)),
            "a negative hop: {hops:?}"
        );
        let find = |name: &str| hops.iter().find(|h| h.0 == name).copied();
        assert_eq!(
            find("create_deployment scheduled (TWD workflow)"),
            Some((
                "create_deployment scheduled (TWD workflow)",
                Some("TWD workflow task started"),
                Some(2)
            ))
        );
        assert_eq!(
            find("child rollout initiated"),
            Some((
                "child rollout initiated",
                Some("TWD workflow task started"),
                Some(2)
            ))
        );
        assert_eq!(
            find("Deployment seen"),
            Some((
                "Deployment seen",
                Some("create_deployment started"),
                Some(25)
            ))
        );
    }

    #[test]
    fn burst_milestones_take_the_next_task_when_the_signal_arrives_during_one() {
        // A task in flight when the signal arrives does not see it: the server buffers the
        // signal after that task's completion and schedules another.
        let twd = Run::new().started(0).timed_task(1, 2, 3);
        let in_flight = twd.push(500, WorkflowTaskScheduledEventAttributes::default().into());
        let id = in_flight.0.len() as i64;
        let twd = in_flight
            .push(
                510,
                WorkflowTaskStartedEventAttributes {
                    scheduled_event_id: id,
                    ..Default::default()
                }
                .into(),
            )
            .push(600, WorkflowTaskCompletedEventAttributes::default().into())
            .signal(530, SPEC_CHANGED, 2)
            .timed_task(600, 700, 710)
            .child(710, ROLLOUT);
        let twd = Timeline::of(&[twd.0]);
        let rollout = burst_rollout();
        let milestones = BurstMilestones::read(burst_input(&twd, &rollout), None, t(500));
        assert_eq!(milestones.apply_sent_ms, None, "no apply time: missing");
        assert_eq!(milestones.twd_task_scheduled_ms, Some(100.0));
        assert_eq!(milestones.twd_task_started_ms, Some(200.0));
        assert_eq!(milestones.child_initiated_ms, Some(210.0));
    }

    #[test]
    fn burst_milestones_without_the_signal_leave_the_twd_task_missing() {
        let twd = Timeline::of(&[Run::new().started(0).timed_task(1, 2, 3).0]);
        let rollout = burst_rollout();
        let milestones = BurstMilestones::read(burst_input(&twd, &rollout), Some(t(500)), t(500));
        assert_eq!(milestones.apply_sent_ms, Some(0.0));
        assert_eq!(milestones.signal_recorded_ms, None);
        assert_eq!(milestones.twd_task_scheduled_ms, None);
        assert_eq!(milestones.twd_task_started_ms, None);
        assert_eq!(milestones.child_initiated_ms, None);
        assert_eq!(milestones.rollout_task_started_ms, Some(840.0));
    }

    #[test]
    fn burst_milestones_keep_a_child_started_before_the_signal_arrived() {
        // The workflow's own turn saw the new spec and started the rollout; the signal came
        // later.
        let twd = Run::new()
            .started(0)
            .timed_task(300, 310, 320)
            .child(320, ROLLOUT)
            .signal(530, SPEC_CHANGED, 2)
            .timed_task(530, 540, 550);
        let twd = Timeline::of(&[twd.0]);
        let rollout = burst_rollout();
        let milestones = BurstMilestones::read(burst_input(&twd, &rollout), None, t(500));
        assert_eq!(milestones.signal_recorded_ms, Some(30.0));
        assert_eq!(milestones.twd_task_started_ms, Some(40.0));
        assert_eq!(milestones.child_initiated_ms, Some(-180.0));
    }

    #[test]
    fn milestone_summaries_give_spread_and_hops_over_the_reactions() {
        // "task" follows "apply", not "signal": its hops skip the missing signal.
        let a = [
            ("apply", Some(0.0), None),
            ("signal", Some(10.0), Some("apply")),
            ("task", Some(100.0), Some("apply")),
        ];
        let b = [
            ("apply", Some(5.0), None),
            ("signal", Some(20.0), Some("apply")),
            ("task", Some(2_000.0), Some("apply")),
        ];
        let c = [
            ("apply", Some(8.0), None),
            ("signal", None, Some("apply")),
            ("task", Some(1_000.0), Some("apply")),
        ];
        let summary = summarize_milestones(&[a, b, c]);
        let shown: Vec<_> = summary
            .iter()
            .map(|m| {
                (
                    m.milestone.as_str(),
                    m.follows.as_deref(),
                    m.at_ms.as_ref().map(|s| s.median),
                    m.spread_ms,
                    m.hop_ms.as_ref().map(|s| (s.n, s.median, s.max)),
                    m.missing,
                )
            })
            .collect();
        assert_eq!(
            shown,
            vec![
                ("apply", None, Some(5.0), Some(8.0), None, 0),
                (
                    "signal",
                    Some("apply"),
                    Some(10.0),
                    Some(10.0),
                    Some((2, 10.0, 15.0)),
                    1
                ),
                (
                    "task",
                    Some("apply"),
                    Some(1_000.0),
                    Some(1_900.0),
                    Some((3, 992.0, 1_995.0)),
                    0
                ),
            ]
        );
        assert!(summarize_milestones::<1>(&[]).is_empty());
    }

    #[test]
    fn queue_waits_count_tasks_scheduled_inside_the_window() {
        let twd = Run::new()
            .started(0)
            .timed_task(0, 5, 6)
            .timed_task(1_000, 1_400, 1_410)
            .activity(1_410, "observe", 1_420, 1_500);
        let rollout = Run::new()
            .started(1_100)
            .timed_task(1_100, 1_900, 1_910)
            .timed_task(3_000, 3_001, 3_002);
        let waits = QueueWaits::read(
            &[Timeline::of(&[twd.0])],
            &[Timeline::of(&[rollout.0])],
            t(1_000),
            t(2_000),
        );
        let show = |s: &Option<Summary>| s.as_ref().map(|s| (s.n, s.median));
        assert_eq!(show(&waits.twd_workflow_tasks_ms), Some((1, 400.0)));
        assert_eq!(show(&waits.rollout_workflow_tasks_ms), Some((1, 800.0)));
        assert_eq!(show(&waits.activities_ms), Some((1, 10.0)));
    }
}
