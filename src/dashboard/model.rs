//! What the dashboard shows, as pure functions of what Kubernetes and Temporal say: one
//! overview row per worker deployment, its versions, the rollout's steps on a timeline, and
//! the analysis and autoscaling series read from workflow histories. The server serializes
//! these; the page only draws them.

use serde::Serialize;
use twc_crds::WorkerObject;
use twc_crds::duration::parse_duration;
use twc_crds::worker_deployment::{
    AnalysisCheck, RolloutPhase, RolloutStrategy, TemporalWorkerDeploymentStatus, VersionStatus,
};
use twc_workflows::contract::{AnalysisResult, BacklogReport, Verdict};

/// Unix milliseconds.
pub type Millis = i64;

/// One worker deployment in the overview.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// `<namespace>/<name>`.
    pub key: String,
    pub namespace: String,
    pub name: String,
    /// `WorkerDeployment` or `TemporalWorkerDeployment`.
    pub kind: &'static str,
    /// `Rolling`, `Paused`, `Complete`, `Blocked`, `Aborted`, or `-` before the first status.
    pub phase: String,
    pub strategy: String,
    /// Current build.
    pub current: Option<String>,
    /// Target build when it is not Current yet.
    pub target: Option<String>,
    /// Percent of new workflows on the target while it ramps.
    pub ramp: Option<f64>,
    /// Why the rollout stopped or waits, when it does.
    pub stop: Option<Stop>,
    /// Creation time.
    pub created: Option<Millis>,
}

/// Why a rollout is not moving on its own: the `Progressing` condition's reason and message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Stop {
    pub reason: String,
    pub message: String,
}

/// Progressing reasons that mean the rollout is moving or done, not stopped.
const MOVING: [&str; 5] = [
    "RolloutComplete",
    "Ramping",
    "WaitingForPollers",
    "WaitingForAvailability",
    "",
];

/// The overview row of `twd`.
pub fn summary(twd: &WorkerObject) -> Summary {
    let status = twd.status.clone().unwrap_or_default();
    let namespace = twd.metadata.namespace.clone().unwrap_or_default();
    let name = twd.metadata.name.clone().unwrap_or_default();
    let current = status.current_version.as_ref().map(|c| c.build_id.clone());
    let target = status
        .target_version
        .as_ref()
        .map(|t| t.version.build_id.clone())
        .filter(|t| Some(t) != current.as_ref());
    let ramp = status
        .target_version
        .as_ref()
        .filter(|_| target.is_some())
        .and_then(|t| t.ramp_percentage)
        .map(f64::from);
    Summary {
        key: format!("{namespace}/{name}"),
        namespace,
        name,
        kind: twd.kind.as_str(),
        phase: phase_name(status.rollout.as_ref().and_then(|r| r.phase)),
        strategy: format!("{:?}", twd.spec.rollout.strategy),
        current,
        target,
        ramp,
        stop: stop(&status),
        created: twd
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.as_millisecond()),
    }
}

fn phase_name(phase: Option<RolloutPhase>) -> String {
    phase.map_or_else(|| "-".to_owned(), |p| format!("{p:?}"))
}

/// Progressing reasons that wait for a person while the condition stays `True` (a Manual
/// rollout waiting for `promote` is not failing, as in the Go controller's conditions).
const WAITING_FOR_A_PERSON: [&str; 1] = ["WaitingForPromotion"];

/// The reason a rollout stopped or waits for someone, from its `Progressing` condition.
fn stop(status: &TemporalWorkerDeploymentStatus) -> Option<Stop> {
    let progressing = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Progressing")?;
    let reason = progressing.reason.as_str();
    let waits = WAITING_FOR_A_PERSON.contains(&reason);
    if !waits && (progressing.status == "True" || MOVING.contains(&reason)) {
        return None;
    }
    Some(Stop {
        reason: progressing.reason.clone(),
        message: progressing.message.clone(),
    })
}

/// One version on a worker deployment's page.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VersionRow {
    /// `target`, `current`, `target, current` or `retired`.
    pub role: &'static str,
    pub build_id: String,
    /// Temporal's state: `Current`, `Ramping`, `Draining`, `Drained`, `Inactive`, ...
    pub state: String,
    /// Share of new workflows routed to it.
    pub routed: Option<f64>,
    pub deployment: Option<String>,
    /// Task queues its workers registered (polled) in Temporal.
    pub task_queues: usize,
    /// Pods wanted / ready, from its Deployment.
    pub replicas: Option<i32>,
    pub ready_replicas: Option<i32>,
    /// Open workflows pinned to it (counted while it drains).
    pub open_pinned: Option<i64>,
    /// Drain progress: steps done and the next one.
    pub drain_done: Vec<String>,
    pub drain_next: Option<String>,
    pub drain_next_at: Option<Millis>,
    pub eligible_for_deletion: bool,
}

/// Pods of a versioned Deployment, by build ID.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pods {
    pub replicas: i32,
    pub ready: i32,
}

/// The versions of `status`, target first, with the pods `pods_of` finds for each build.
pub fn versions(
    status: &TemporalWorkerDeploymentStatus,
    pods_of: impl Fn(&str) -> Option<Pods>,
) -> Vec<VersionRow> {
    let ramp = status
        .target_version
        .as_ref()
        .and_then(|t| t.ramp_percentage)
        .map(f64::from);
    let current = status.current_version.as_ref();
    let row = |role, version: &VersionStatus, routed| {
        let pods = pods_of(&version.build_id);
        VersionRow {
            role,
            build_id: version.build_id.clone(),
            state: format!("{:?}", version.status),
            routed,
            deployment: version.deployment.as_ref().and_then(|d| d.name.clone()),
            task_queues: version.task_queues.len(),
            replicas: pods.map(|p| p.replicas),
            ready_replicas: pods.map(|p| p.ready),
            open_pinned: None,
            drain_done: Vec::new(),
            drain_next: None,
            drain_next_at: None,
            eligible_for_deletion: false,
        }
    };
    let mut rows = Vec::new();
    if let Some(target) = &status.target_version
        && current.map(|c| &c.build_id) != Some(&target.version.build_id)
    {
        rows.push(row("target", &target.version, ramp));
    }
    if let Some(current) = current {
        let role = match &status.target_version {
            Some(t) if t.version.build_id == current.build_id => "target, current",
            _ => "current",
        };
        rows.push(row(role, current, Some(100.0 - ramp.unwrap_or(0.0))));
    }
    for old in &status.deprecated_versions {
        let mut retired = row("retired", &old.version, None);
        retired.open_pinned = old.open_pinned_workflows;
        retired.drain_done = old.drain_steps_done.clone();
        retired.drain_next = old.next_drain_action.clone();
        retired.drain_next_at = old
            .next_drain_action_at
            .as_ref()
            .map(|t| t.0.as_millisecond());
        retired.eligible_for_deletion = old.eligible_for_deletion;
        rows.push(retired);
    }
    rows
}

/// Where a step of a Progressive rollout stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum StepState {
    /// Passed.
    Done,
    /// In force now.
    Now,
    /// In force, held (an operator's pause, `spec.rollout.paused`, a stop).
    Held,
    /// Still to come.
    Planned,
}

/// One step on the rollout's timeline.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StepRow {
    pub index: usize,
    pub ramp: i32,
    pub pause: String,
    pub pause_ms: Millis,
    pub state: StepState,
    /// When it began (the step in force: its ramp was set).
    pub started: Option<Millis>,
    /// When it is planned to end (the step in force: the rollout's next step time; later
    /// steps: that plus the pauses before them).
    pub ends: Option<Millis>,
}

/// The rollout's steps: those before `step` done, `step` now (or held), the rest planned one
/// pause after another from `next_step_at`. A complete rollout has every step done.
pub fn timeline(
    twd: &WorkerObject,
    step: Option<usize>,
    held: bool,
    next_step_at: Option<Millis>,
) -> Vec<StepRow> {
    let rollout = &twd.spec.rollout;
    if rollout.strategy != RolloutStrategy::Progressive {
        return Vec::new();
    }
    let status = twd.status.clone().unwrap_or_default();
    let complete = status.rollout.as_ref().and_then(|r| r.phase) == Some(RolloutPhase::Complete);
    let started = status
        .target_version
        .as_ref()
        .and_then(|t| t.ramp_last_modified_at.as_ref())
        .map(|t| t.0.as_millisecond());
    let mut ends = next_step_at;
    rollout
        .steps
        .iter()
        .flatten()
        .enumerate()
        .map(|(index, s)| {
            let pause_ms = parse_duration(&s.pause_duration)
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
            let state = match step {
                _ if complete => StepState::Done,
                Some(now) if index < now => StepState::Done,
                Some(now) if index == now && held => StepState::Held,
                Some(now) if index == now => StepState::Now,
                _ => StepState::Planned,
            };
            let (row_started, row_ends) = match state {
                StepState::Now | StepState::Held => (started, if held { None } else { ends }),
                StepState::Planned => {
                    let begins = ends;
                    ends = ends.map(|e| e + pause_ms);
                    (begins, ends)
                }
                StepState::Done => (None, None),
            };
            StepRow {
                index,
                ramp: s.ramp_percentage,
                pause: s.pause_duration.clone(),
                pause_ms,
                state,
                started: row_started,
                ends: row_ends,
            }
        })
        .collect()
}

/// A check's passing bound, from the spec.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckLimit {
    pub name: String,
    /// What the value is: `failure %` or the Prometheus query.
    pub measures: String,
    pub max: Option<f64>,
    pub min: Option<f64>,
    pub dry_run: bool,
}

/// The bounds of each analysis check of the spec.
pub fn check_limits(checks: &[AnalysisCheck]) -> Vec<CheckLimit> {
    checks
        .iter()
        .map(|check| {
            let (measures, max, min) = match (&check.temporal, &check.prometheus) {
                (Some(t), _) => ("failure %".to_owned(), t.max_failure_percent, None),
                (None, Some(p)) => (p.query.clone(), p.max_value, p.min_value),
                (None, None) => (String::new(), None, None),
            };
            CheckLimit {
                name: check.name.clone(),
                measures,
                max,
                min,
                dry_run: check.dry_run,
            }
        })
        .collect()
}

/// One measurement on the analysis chart.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Point {
    pub check: String,
    pub at: Millis,
    pub step: u32,
    pub value: Option<f64>,
    pub baseline: Option<f64>,
    pub verdict: Verdict,
    pub message: String,
}

/// The points of one `run_analysis` result, measured at `at` during `step`.
pub fn analysis_points(at: Millis, step: u32, result: &AnalysisResult) -> Vec<Point> {
    result
        .measurements
        .iter()
        .map(|m| Point {
            check: m.check.clone(),
            at,
            step,
            value: m.value,
            baseline: m.baseline,
            verdict: m.verdict,
            message: m.message.clone(),
        })
        .collect()
}

/// Backlog of one version at one read.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BacklogPoint {
    pub at: Millis,
    pub build_id: String,
    pub backlog: u64,
    pub backlog_age_ms: i64,
}

/// The points of one `read_backlog` result read at `at` (versions that could not be read are
/// left out: unknown is not idle).
pub fn backlog_points(at: Millis, report: &BacklogReport) -> Vec<BacklogPoint> {
    report
        .versions
        .iter()
        .filter(|v| v.error.is_none())
        .map(|v| BacklogPoint {
            at,
            build_id: v.build_id.clone(),
            backlog: v.backlog,
            backlog_age_ms: v.backlog_age_ms,
        })
        .collect()
}

/// A replica count the controller set on a Deployment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ScalePoint {
    pub at: Millis,
    pub deployment: String,
    pub replicas: i32,
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;
    use twc_crds::worker_deployment::RolloutStatus;
    use twc_crds::{TemporalWorkerDeployment, WorkerKind};
    use twc_workflows::contract::{Measurement, VersionBacklog};

    use super::*;

    /// Role, build, state, share routed, ready pods.
    type VersionView<'a> = (&'a str, &'a str, &'a str, Option<f64>, Option<i32>);
    /// Name, what it measures, max, min, dry run.
    type LimitView<'a> = (&'a str, &'a str, Option<f64>, Option<f64>, bool);

    fn twd(rollout: serde_json::Value) -> WorkerObject {
        let object: TemporalWorkerDeployment = serde_json::from_value(json!({
            "apiVersion": "temporal.io/v1alpha1",
            "kind": "WorkerDeployment",
            "metadata": { "name": "hello", "namespace": "demo", "creationTimestamp": "2026-01-01T00:00:00Z" },
            "spec": {
                "workerOptions": { "connectionRef": { "name": "dev" }, "temporalNamespace": "default" },
                "rollout": rollout,
                "template": { "spec": { "containers": [ { "name": "w", "image": "i:v1" } ] } }
            }
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        WorkerObject {
            kind: WorkerKind::WorkerDeployment,
            object,
        }
    }

    fn time(ms: i64) -> Time {
        Time(Timestamp::from_millisecond(ms).unwrap_or_else(|e| panic!("{e}")))
    }

    fn progressing(status: &str, reason: &str, message: &str) -> Condition {
        Condition {
            type_: "Progressing".to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message: message.to_owned(),
            last_transition_time: time(0),
            observed_generation: None,
        }
    }

    fn status(value: serde_json::Value) -> TemporalWorkerDeploymentStatus {
        serde_json::from_value(value).unwrap_or_else(|e| panic!("{e}"))
    }

    /// v2 ramping at `ramp` over Current v1 (step 2 since 10 s after the epoch), v0 draining.
    fn ramping(ramp: f32) -> TemporalWorkerDeploymentStatus {
        status(json!({
            "targetVersion": { "buildID": "v2", "status": "Ramping", "rampPercentage": ramp,
                               "rampLastModifiedAt": "1970-01-01T00:00:10Z" },
            "currentVersion": { "buildID": "v1", "status": "Current" },
            "deprecatedVersions": [ { "buildID": "v0", "status": "Draining",
                                      "openPinnedWorkflows": 3, "nextDrainAction": "signal" } ],
            "rollout": { "phase": "Rolling", "step": 1 }
        }))
    }

    #[test]
    fn the_overview_row_shows_routing_and_why_a_rollout_stopped() {
        let cases = [
            (
                "ramping: target and its ramp, nothing stopped",
                progressing("True", "Ramping", "ramping"),
                Some("v2"),
                Some(30.0),
                None,
            ),
            (
                "a failed gate is the stop reason",
                progressing("False", "GateFailed", "gate RolloutGate failed"),
                Some("v2"),
                Some(30.0),
                Some("GateFailed"),
            ),
            (
                "waiting for a person is a stop (Progressing stays True meanwhile)",
                progressing("True", "WaitingForPromotion", "promote it"),
                Some("v2"),
                Some(30.0),
                Some("WaitingForPromotion"),
            ),
            (
                "waiting for a person is a stop, whatever the condition's status",
                progressing("False", "WaitingForPromotion", "promote it"),
                Some("v2"),
                Some(30.0),
                Some("WaitingForPromotion"),
            ),
            (
                "complete is not a stop",
                progressing("False", "RolloutComplete", "done"),
                Some("v2"),
                Some(30.0),
                None,
            ),
        ];
        for (what, condition, target, ramp, stopped) in cases {
            let mut worker = twd(json!({ "strategy": "Progressive" }));
            let mut status = ramping(30.0);
            status.conditions = vec![condition];
            worker.object.status = Some(status);
            let row = summary(&worker);
            assert_eq!(row.key, "demo/hello", "{what}");
            assert_eq!(row.current.as_deref(), Some("v1"), "{what}");
            assert_eq!(row.target.as_deref(), target, "{what}");
            assert_eq!(row.ramp, ramp, "{what}");
            assert_eq!(row.stop.map(|s| s.reason).as_deref(), stopped, "{what}");
            assert_eq!(row.created, Some(1_767_225_600_000), "{what}");
        }
    }

    #[test]
    fn a_target_that_is_current_is_not_shown_as_target() {
        let mut worker = twd(json!({ "strategy": "AllAtOnce" }));
        worker.object.status = Some(status(json!({
            "targetVersion": { "buildID": "v1", "status": "Current" },
            "currentVersion": { "buildID": "v1", "status": "Current" }
        })));
        let row = summary(&worker);
        assert_eq!(
            (row.current.as_deref(), row.target, row.ramp),
            (Some("v1"), None, None)
        );
        assert_eq!(row.phase, "-");
    }

    #[test]
    fn versions_split_new_workflows_between_target_and_current() {
        let pods = |build: &str| {
            (build == "v2").then_some(Pods {
                replicas: 2,
                ready: 1,
            })
        };
        let rows = versions(&ramping(25.0), pods);
        let view: Vec<VersionView<'_>> = rows
            .iter()
            .map(|r| {
                (
                    r.role,
                    r.build_id.as_str(),
                    r.state.as_str(),
                    r.routed,
                    r.ready_replicas,
                )
            })
            .collect();
        assert_eq!(
            view,
            vec![
                ("target", "v2", "Ramping", Some(25.0), Some(1)),
                ("current", "v1", "Current", Some(75.0), None),
                ("retired", "v0", "Draining", None, None),
            ]
        );
        assert_eq!(rows[2].open_pinned, Some(3));
        assert_eq!(rows[2].drain_next.as_deref(), Some("signal"));
    }

    #[test]
    fn the_timeline_marks_steps_done_now_held_and_planned() {
        let mut worker = twd(json!({ "strategy": "Progressive", "steps": [
            { "rampPercentage": 10, "pauseDuration": "30s" },
            { "rampPercentage": 50, "pauseDuration": "1m" },
            { "rampPercentage": 80, "pauseDuration": "2m" }
        ] }));
        worker.object.status = Some(ramping(50.0));
        let states = |rows: Vec<StepRow>| {
            rows.into_iter()
                .map(|r| (r.state, r.started, r.ends))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            states(timeline(&worker, Some(1), false, Some(70_000))),
            vec![
                (StepState::Done, None, None),
                (StepState::Now, Some(10_000), Some(70_000)),
                (StepState::Planned, Some(70_000), Some(190_000)),
            ],
            "the next step begins when the one in force ends and lasts its pause"
        );
        assert_eq!(
            states(timeline(&worker, Some(1), true, Some(70_000))),
            vec![
                (StepState::Done, None, None),
                (StepState::Held, Some(10_000), None),
                (StepState::Planned, Some(70_000), Some(190_000)),
            ],
            "a held step has no planned end"
        );
        if let Some(status) = worker.object.status.as_mut() {
            status.rollout = Some(RolloutStatus {
                phase: Some(RolloutPhase::Complete),
                ..RolloutStatus::default()
            });
        }
        assert!(
            timeline(&worker, None, false, None)
                .iter()
                .all(|r| r.state == StepState::Done),
            "a complete rollout passed every step"
        );
        assert!(timeline(&twd(json!({ "strategy": "Manual" })), None, false, None).is_empty());
    }

    #[test]
    fn checks_bring_their_limits_and_measurements_become_points() {
        let worker = twd(json!({ "strategy": "Progressive", "analysis": { "checks": [
            { "name": "failures", "temporal": { "maxFailurePercent": 10 } },
            { "name": "latency", "dryRun": true, "prometheus": { "address": "http://p", "query": "q", "minValue": 1, "maxValue": 2 } }
        ] } }));
        let checks = worker
            .spec
            .rollout
            .analysis
            .clone()
            .map(|a| a.checks)
            .unwrap_or_default();
        let limits = check_limits(&checks);
        let view: Vec<LimitView<'_>> = limits
            .iter()
            .map(|l| {
                (
                    l.name.as_str(),
                    l.measures.as_str(),
                    l.max,
                    l.min,
                    l.dry_run,
                )
            })
            .collect();
        assert_eq!(
            view,
            vec![
                ("failures", "failure %", Some(10.0), None, false),
                ("latency", "q", Some(2.0), Some(1.0), true),
            ]
        );
        let result = AnalysisResult {
            measurements: vec![Measurement {
                check: "failures".to_owned(),
                verdict: Verdict::Failed,
                value: Some(40.0),
                baseline: Some(0.0),
                samples: Some(20),
                message: "40% > 10%".to_owned(),
                queries: Vec::new(),
            }],
        };
        let points = analysis_points(5, 1, &result);
        assert_eq!(points.len(), 1);
        assert_eq!(
            (points[0].at, points[0].step, points[0].value),
            (5, 1, Some(40.0))
        );
        assert_eq!(points[0].verdict, Verdict::Failed);
    }

    #[test]
    fn unread_versions_leave_the_backlog_chart() {
        let report = BacklogReport {
            versions: vec![
                VersionBacklog {
                    build_id: "v1".to_owned(),
                    backlog: 7,
                    ..VersionBacklog::default()
                },
                VersionBacklog {
                    build_id: "v2".to_owned(),
                    error: Some("unavailable".to_owned()),
                    ..VersionBacklog::default()
                },
            ],
        };
        let points = backlog_points(9, &report);
        assert_eq!(
            points
                .iter()
                .map(|p| (p.at, p.build_id.as_str(), p.backlog))
                .collect::<Vec<_>>(),
            vec![(9, "v1", 7)]
        );
    }
}
