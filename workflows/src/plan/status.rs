//! The TWD status as a projection of the latest observation and rollout report.
//!
//! Version entries come from the observation (Temporal's routing and version list, the owned
//! Deployments); conditions and `rollout` come from the report of the rollout of the current
//! target, corrected by the observation where the observation knows better (an invalid spec, an
//! unreadable Temporal, a target that is or is no longer Current).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use twc_crds::worker_deployment::{
    DeprecatedVersion, GateWorkflowStatus, RolloutPhase, RolloutStatus, TargetVersion, TaskQueue,
    TemporalWorkerDeploymentStatus, VersionState, VersionStatus,
};

use crate::model::{
    BlockReason, Blocked, Observation, RolloutProgress, RolloutReport, TemporalState, UnixMillis,
};
use crate::plan::conditions::{ConditionView, rollout_conditions};
use crate::plan::drain;
use crate::plan::sunset::{SunsetMemory, eligible_for_deletion};

/// A rollout the TWD workflow started, known before it reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StartedRollout<'a> {
    /// Its build.
    pub build_id: &'a str,
    /// Its workflow ID.
    pub workflow_id: &'a str,
    /// When its start was recorded.
    pub started_at: UnixMillis,
}

/// Builds the full status to write. Condition times are filled by the status writer.
///
/// Conditions carry `now` as `lastTransitionTime`; the status writer keeps the previous time
/// when a condition's status did not change. While Temporal cannot be read, every version is
/// shown `NotRegistered`, there is no `currentVersion`, and both conditions say why
/// (`TemporalStateFetchFailed` or the connection reason). A rollout of the target that was
/// `started` and has not reported yet is named by its workflow ID and start, and shown
/// waiting for pollers (its first step), whatever state Temporal holds its build in.
pub fn project(
    observation: &Observation,
    report: Option<&RolloutReport>,
    started: Option<StartedRollout<'_>>,
    generation: i64,
    now: UnixMillis,
) -> TemporalWorkerDeploymentStatus {
    let mut status = TemporalWorkerDeploymentStatus {
        observed_generation: Some(generation),
        ..Default::default()
    };
    let Some(spec) = observation.spec.as_ref() else {
        return status;
    };
    let temporal = observation.temporal.as_ref().ok();
    let target = spec.target_build_id.as_str();
    let report = report.filter(|r| r.build_id == target);
    let started = started.filter(|s| s.build_id == target && report.is_none());
    let routing = Routing::of(temporal);
    let versions = Versions {
        observation,
        namespace: &spec.namespace,
        routing: &routing,
        temporal,
    };

    status.adopted_build = spec.adopted_build.clone();
    status.target_version = Some(target_version(&versions, target, report));
    status.current_version = routing.current.map(|build| versions.status(build));
    status.deprecated_versions = deprecated_versions(&versions, target);
    if let Some(t) = temporal {
        status.version_count = Some(i32::try_from(t.versions.len()).unwrap_or(i32::MAX));
        status.manager_identity = non_empty(&t.manager_identity);
        status.last_modifier_identity = non_empty(&t.last_modifier_identity);
        status.version_conflict_token = non_empty(&t.conflict_token);
    }

    let (progress, blocked) =
        effective_progress(observation, report, started, versions.state(target));
    status.conditions = rollout_conditions(target, progress, blocked.as_ref())
        .into_iter()
        .map(|c| condition(c, generation, now))
        .collect();
    status.rollout = Some(rollout_status(
        report,
        started,
        progress,
        blocked.as_ref(),
        now,
    ));
    status
}

/// What Temporal routes to, with empty build IDs read as none.
struct Routing<'a> {
    current: Option<&'a str>,
    ramping: Option<&'a str>,
}

impl<'a> Routing<'a> {
    fn of(temporal: Option<&'a TemporalState>) -> Self {
        let pick = |value: Option<&'a String>| value.map(String::as_str).filter(|b| !b.is_empty());
        Routing {
            current: pick(temporal.and_then(|t| t.current_build_id.as_ref())),
            ramping: pick(temporal.and_then(|t| t.ramping_build_id.as_ref())),
        }
    }
}

/// Builds version entries from one observation.
struct Versions<'a> {
    observation: &'a Observation,
    namespace: &'a str,
    routing: &'a Routing<'a>,
    temporal: Option<&'a TemporalState>,
}

impl Versions<'_> {
    /// Routing decides Current and Ramping; otherwise Temporal's version state, else NotRegistered.
    fn state(&self, build: &str) -> VersionState {
        if self.routing.current == Some(build) {
            VersionState::Current
        } else if self.routing.ramping == Some(build) {
            VersionState::Ramping
        } else {
            self.temporal
                .and_then(|t| t.version(build))
                .map_or(VersionState::NotRegistered, |v| v.state)
        }
    }

    fn status(&self, build: &str) -> VersionStatus {
        let deployment = self.observation.deployment(build);
        VersionStatus {
            build_id: build.to_owned(),
            status: self.state(build),
            healthy_since: deployment
                .filter(|d| d.available)
                .and_then(|d| d.available_since)
                .map(time),
            deployment: deployment.map(|d| ObjectReference {
                api_version: Some("apps/v1".to_owned()),
                kind: Some("Deployment".to_owned()),
                name: Some(d.name.clone()),
                namespace: Some(self.namespace.to_owned()).filter(|n| !n.is_empty()),
                ..ObjectReference::default()
            }),
            task_queues: Vec::new(),
        }
    }
}

fn target_version(
    versions: &Versions<'_>,
    target: &str,
    report: Option<&RolloutReport>,
) -> TargetVersion {
    let mut version = versions.status(target);
    let runs = report.map(|r| r.gate_runs.as_slice()).unwrap_or_default();
    let queues: BTreeSet<&str> = runs.iter().map(|r| r.task_queue.as_str()).collect();
    version.task_queues = queues
        .into_iter()
        .map(|name| TaskQueue {
            name: name.to_owned(),
        })
        .collect();
    let mut test_workflows: Vec<GateWorkflowStatus> = runs
        .iter()
        .map(|r| GateWorkflowStatus {
            workflow_id: r.workflow_id.clone(),
            run_id: r.run_id.clone(),
            status: r.status.clone(),
            task_queue: r.task_queue.clone(),
        })
        .collect();
    test_workflows
        .sort_by(|a, b| (&a.task_queue, &a.workflow_id).cmp(&(&b.task_queue, &b.workflow_id)));

    let ramp = versions
        .temporal
        .filter(|_| versions.routing.ramping == Some(target));
    TargetVersion {
        version,
        test_workflows,
        ramp_percentage: ramp.map(|t| t.ramp_percentage.unwrap_or(0.0).clamp(0.0, 100.0)),
        ramping_since: ramp.and_then(|t| t.ramping_since).map(time),
        ramp_last_modified_at: ramp.and_then(|t| t.ramp_changed_at).map(time),
    }
}

/// One entry per owned Deployment that is neither target nor current, sorted by build ID.
fn deprecated_versions(versions: &Versions<'_>, target: &str) -> Vec<DeprecatedVersion> {
    let mut by_build = BTreeMap::new();
    for deployment in versions
        .observation
        .deployments
        .iter()
        .filter(|d| !d.deleting)
    {
        let build = deployment.build_id.as_str();
        if build == target
            || versions.routing.current == Some(build)
            || by_build.contains_key(build)
        {
            continue;
        }
        let version = versions.status(build);
        let temporal_version = versions.temporal.and_then(|t| t.version(build));
        let drained = version.status == VersionState::Drained;
        by_build.insert(
            build,
            DeprecatedVersion {
                drained_since: temporal_version
                    .and_then(|v| v.drained_since)
                    .filter(|_| drained)
                    .map(time),
                eligible_for_deletion: drained
                    && eligible_for_deletion(temporal_version, deployment),
                version,
                open_pinned_workflows: None,
                oldest_pinned_workflow_started_at: None,
                next_drain_action: None,
                next_drain_action_at: None,
                drain_steps_done: Vec::new(),
            },
        );
    }
    by_build.into_values().collect()
}

/// The progress to show: the report's, unless the observation knows better; a rollout
/// `started` and not reported yet is waiting for pollers.
fn effective_progress(
    observation: &Observation,
    report: Option<&RolloutReport>,
    started: Option<StartedRollout<'_>>,
    target_state: VersionState,
) -> (RolloutProgress, Option<Blocked>) {
    if let Some(spec) = observation.spec.as_ref().filter(|s| !s.invalid.is_empty()) {
        let blocked = Blocked {
            reason: BlockReason::InvalidSpec,
            message: spec.invalid.join("; "),
        };
        return (RolloutProgress::Blocked, Some(blocked));
    }
    if let Err(blocked) = &observation.temporal {
        return (RolloutProgress::Blocked, Some(blocked.clone()));
    }
    match report {
        Some(r)
            if matches!(
                r.progress,
                RolloutProgress::Blocked | RolloutProgress::Aborted
            ) =>
        {
            (r.progress, r.blocked.clone())
        }
        _ if target_state == VersionState::Current => (RolloutProgress::Complete, None),
        Some(r) if r.progress != RolloutProgress::Complete => (r.progress, r.blocked.clone()),
        None if started.is_some() => (RolloutProgress::WaitingForPollers, None),
        // No report yet, or one that says Complete while Temporal no longer agrees.
        _ => (progress_from_state(target_state), None),
    }
}

fn progress_from_state(state: VersionState) -> RolloutProgress {
    match state {
        VersionState::Current => RolloutProgress::Complete,
        VersionState::Ramping => RolloutProgress::Ramping,
        VersionState::Inactive | VersionState::Draining | VersionState::Drained => {
            RolloutProgress::WaitingForPromotion
        }
        VersionState::NotRegistered => RolloutProgress::WaitingForPollers,
    }
}

/// `status.rollout`: the target's rollout as its last `report` tells it or, before its first
/// report, as the TWD workflow `started` it (its workflow ID and start only).
fn rollout_status(
    report: Option<&RolloutReport>,
    started: Option<StartedRollout<'_>>,
    progress: RolloutProgress,
    blocked: Option<&Blocked>,
    now: UnixMillis,
) -> RolloutStatus {
    let phase = match progress {
        RolloutProgress::WaitingForPollers
        | RolloutProgress::WaitingForPromotion
        | RolloutProgress::Ramping
        | RolloutProgress::WaitingForAvailability
        | RolloutProgress::Superseded => RolloutPhase::Rolling,
        RolloutProgress::Paused => RolloutPhase::Paused,
        RolloutProgress::Complete => RolloutPhase::Complete,
        RolloutProgress::Blocked => RolloutPhase::Blocked,
        RolloutProgress::Aborted => RolloutPhase::Aborted,
    };
    let report_message = report.map(|r| r.message.clone()).filter(|m| !m.is_empty());
    let message = match (progress, blocked) {
        (RolloutProgress::Blocked | RolloutProgress::Aborted, Some(b)) => Some(b.message.clone()),
        _ => report_message,
    };
    RolloutStatus {
        workflow_id: report
            .map(|r| r.workflow_id.clone())
            .or_else(|| started.map(|s| s.workflow_id.to_owned())),
        run_id: report.map(|r| r.run_id.clone()),
        phase: Some(phase),
        step: report
            .and_then(|r| r.step)
            .map(|s| i32::try_from(s).unwrap_or(i32::MAX)),
        paused: progress == RolloutProgress::Paused,
        message,
        started_at: report
            .map(|r| r.started_at)
            .or_else(|| started.map(|s| s.started_at))
            .map(time),
        updated_at: Some(time(now)),
        analysis: report.map(|r| r.analysis.clone()).unwrap_or_default(),
    }
}

/// `status` with what the `/scale` subresource reads: the pods of the target and Current
/// versions (`replicas`) and a label selector of every pod of the worker (`selector`).
pub fn with_scale(
    mut status: TemporalWorkerDeploymentStatus,
    observation: &Observation,
    twd_name: &str,
) -> TemporalWorkerDeploymentStatus {
    let Some(spec) = observation.spec.as_ref() else {
        return status;
    };
    let current = observation
        .temporal
        .as_ref()
        .ok()
        .and_then(|t| t.current_build_id.as_deref());
    let pods: i32 = observation
        .deployments
        .iter()
        .filter(|d| !d.deleting)
        .filter(|d| d.build_id == spec.target_build_id || Some(d.build_id.as_str()) == current)
        .map(|d| d.status_replicas)
        .sum();
    status.replicas = Some(pods);
    status.selector = Some(format!(
        "{}={}",
        twc_crds::labels::DEPLOYMENT_NAME,
        twc_crds::naming::deployment_name_label(twd_name)
    ));
    status
}

/// `status` with the drain of each deprecated version (SPEC §11): its open pinned workflows as
/// last counted, the oldest one's start, the steps done and the next step with its time.
pub fn with_drain(
    mut status: TemporalWorkerDeploymentStatus,
    observation: &Observation,
    memory: &[SunsetMemory],
    now: UnixMillis,
) -> TemporalWorkerDeploymentStatus {
    let Some(policy) = observation.spec.as_ref().and_then(|s| s.drain.as_ref()) else {
        return status;
    };
    let temporal = observation.temporal.as_ref().ok();
    let current = temporal.and_then(|t| t.current_build_id.as_deref());
    for deprecated in &mut status.deprecated_versions {
        let Some(entry) = memory
            .iter()
            .find(|m| m.build_id == deprecated.version.build_id)
        else {
            continue;
        };
        if let Some(pinned) = entry.drain.pinned {
            deprecated.open_pinned_workflows = Some(i64::try_from(pinned.open).unwrap_or(i64::MAX));
            deprecated.oldest_pinned_workflow_started_at = pinned.oldest_started_at.map(time);
        }
        deprecated.drain_steps_done = entry
            .drain
            .done
            .iter()
            .map(|s| s.as_str().to_owned())
            .collect();
        let plan = drain::plan(
            policy,
            &entry.build_id,
            deprecated.version.status,
            current,
            entry.retired_at,
            &entry.drain,
            now,
        );
        let next = plan.due.first().map(|(step, _)| (*step, now)).or(plan.next);
        deprecated.next_drain_action = next.map(|(step, _)| step.as_str().to_owned());
        deprecated.next_drain_action_at = next.map(|(_, at)| time(at));
    }
    status
}

/// The status of an object refused by the claim rule (see
/// [`crate::plan::conditions::refused_conditions`]): both conditions False and the Phase column
/// `Blocked`, nothing else (it drives nothing).
pub fn refused(
    this_kind: &str,
    holder: &str,
    temporal_name: &str,
    generation: i64,
    now: UnixMillis,
) -> TemporalWorkerDeploymentStatus {
    let conditions = crate::plan::conditions::refused_conditions(this_kind, holder, temporal_name);
    let message = conditions[0].message.clone();
    TemporalWorkerDeploymentStatus {
        observed_generation: Some(generation),
        conditions: conditions
            .into_iter()
            .map(|c| condition(c, generation, now))
            .collect(),
        rollout: Some(RolloutStatus {
            phase: Some(RolloutPhase::Blocked),
            message: Some(message),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// `status` with the [`crate::plan::conditions::DELETING`] condition set to `view` (replacing
/// an earlier one).
pub fn with_condition(
    mut status: TemporalWorkerDeploymentStatus,
    view: ConditionView,
    generation: i64,
    now: UnixMillis,
) -> TemporalWorkerDeploymentStatus {
    status.conditions.retain(|c| c.type_ != view.type_);
    status.conditions.push(condition(view, generation, now));
    status
}

fn condition(view: ConditionView, generation: i64, now: UnixMillis) -> Condition {
    Condition {
        last_transition_time: time(now),
        message: view.message,
        observed_generation: Some(generation),
        reason: view.reason,
        status: if view.status { "True" } else { "False" }.to_owned(),
        type_: view.type_,
    }
}

/// Unix milliseconds as a Kubernetes time, clamped to the representable range.
pub(crate) fn time(millis: UnixMillis) -> Time {
    Time(
        Timestamp::from_millisecond(millis).unwrap_or(if millis < 0 {
            Timestamp::MIN
        } else {
            Timestamp::MAX
        }),
    )
}

fn non_empty(value: &str) -> Option<String> {
    Some(value.to_owned()).filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use twc_crds::worker_deployment::RolloutStrategy;

    use super::*;
    use crate::contract::GateRun;
    use crate::model::{DeploymentView, TemporalVersion};
    use crate::plan::fixtures::*;

    const NOW: UnixMillis = secs(1_000);
    const RETIRED: &str = "v0-rrrrrrrrrr";

    fn t(millis: UnixMillis) -> Time {
        time(millis)
    }

    /// NEW ramping at 25%, OLD Current, RETIRED Drained and at zero, another Draining.
    fn mid_rollout() -> Observation {
        let temporal = TemporalState {
            exists: true,
            current_build_id: Some(OLD.into()),
            ramping_build_id: Some(NEW.into()),
            ramp_percentage: Some(25.0),
            ramping_since: Some(secs(100)),
            ramp_changed_at: Some(secs(200)),
            versions: vec![
                version(OLD, VersionState::Current),
                version(NEW, VersionState::Ramping),
                TemporalVersion {
                    drained_since: Some(secs(50)),
                    ..version(RETIRED, VersionState::Drained)
                },
                version("v0-draining", VersionState::Draining),
            ],
            manager_identity: "twc/uid".into(),
            last_modifier_identity: "someone".into(),
            conflict_token: "dG9rZW4=".into(),
            ..TemporalState::default()
        };
        let deployments = vec![
            deployment("v0-draining"),
            deployment(NEW),
            scaled_to_zero(RETIRED),
            deployment(OLD),
            DeploymentView {
                deleting: true,
                ..deployment("v0-deleting")
            },
        ];
        observation(spec(RolloutStrategy::Progressive), deployments, temporal)
    }

    fn report(progress: RolloutProgress) -> RolloutReport {
        RolloutReport {
            build_id: NEW.into(),
            workflow_id: format!("rollout/demo/hello/{NEW}"),
            run_id: "run-1".into(),
            progress,
            step: Some(0),
            ramp_percentage: Some(25),
            next_step_at: Some(secs(205)),
            blocked: None,
            message: "Ramping to 25% (step 1 of 3)".into(),
            started_at: secs(90),
            control: None,
            analysis: Vec::new(),
            gate_runs: vec![
                GateRun {
                    workflow_id: "gate-b".into(),
                    run_id: "r2".into(),
                    task_queue: "payments".into(),
                    status: "Completed".into(),
                },
                GateRun {
                    workflow_id: "gate-a".into(),
                    run_id: "r1".into(),
                    task_queue: "orders".into(),
                    status: "Completed".into(),
                },
            ],
            sequence: 4,
            routing: None,
        }
    }

    /// `(type, status, reason)` of each condition.
    type Reasons = Vec<(String, String, String)>;

    fn reasons(status: &TemporalWorkerDeploymentStatus) -> Reasons {
        status
            .conditions
            .iter()
            .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
            .collect()
    }

    fn both(status: &str, reason: &str) -> Reasons {
        vec![
            ("Ready".to_owned(), "False".to_owned(), reason.to_owned()),
            (
                "Progressing".to_owned(),
                status.to_owned(),
                reason.to_owned(),
            ),
        ]
    }

    #[test]
    fn target_version_shows_build_state_deployment_ramp_and_gate_runs() {
        let status = project(
            &mid_rollout(),
            Some(&report(RolloutProgress::Ramping)),
            None,
            3,
            NOW,
        );
        let target = status.target_version.expect("target version");
        assert_eq!(target.version.build_id, NEW);
        assert_eq!(target.version.status, VersionState::Ramping);
        assert_eq!(target.version.healthy_since, Some(t(secs(5))));
        assert_eq!(
            target.version.deployment,
            Some(ObjectReference {
                api_version: Some("apps/v1".into()),
                kind: Some("Deployment".into()),
                name: Some(deployment_name(NEW)),
                namespace: Some("demo".into()),
                ..ObjectReference::default()
            })
        );
        assert_eq!(target.ramp_percentage, Some(25.0));
        assert_eq!(target.ramping_since, Some(t(secs(100))));
        assert_eq!(target.ramp_last_modified_at, Some(t(secs(200))));
        let queues: Vec<&str> = target
            .version
            .task_queues
            .iter()
            .map(|q| q.name.as_str())
            .collect();
        assert_eq!(queues, ["orders", "payments"]);
        let gates: Vec<(&str, &str)> = target
            .test_workflows
            .iter()
            .map(|w| (w.workflow_id.as_str(), w.task_queue.as_str()))
            .collect();
        assert_eq!(gates, [("gate-a", "orders"), ("gate-b", "payments")]);
    }

    #[test]
    fn current_and_deprecated_versions_come_from_temporal_and_the_deployments() {
        let status = project(
            &mid_rollout(),
            Some(&report(RolloutProgress::Ramping)),
            None,
            3,
            NOW,
        );
        let current = status.current_version.expect("current version");
        assert_eq!(
            (current.build_id.as_str(), current.status),
            (OLD, VersionState::Current)
        );
        assert_eq!(
            current.deployment.and_then(|d| d.name),
            Some(deployment_name(OLD))
        );

        let deprecated: Vec<(&str, VersionState, Option<Time>, bool)> = status
            .deprecated_versions
            .iter()
            .map(|v| {
                (
                    v.version.build_id.as_str(),
                    v.version.status,
                    v.drained_since.clone(),
                    v.eligible_for_deletion,
                )
            })
            .collect();
        assert_eq!(
            deprecated,
            [
                ("v0-draining", VersionState::Draining, None, false),
                (RETIRED, VersionState::Drained, Some(t(secs(50))), true),
            ],
            "sorted by build ID, Deployments being deleted left out"
        );
        assert_eq!(status.version_count, Some(4));
        assert_eq!(status.manager_identity.as_deref(), Some("twc/uid"));
        assert_eq!(status.last_modifier_identity.as_deref(), Some("someone"));
        assert_eq!(status.version_conflict_token.as_deref(), Some("dG9rZW4="));
        assert_eq!(status.observed_generation, Some(3));
    }

    #[test]
    fn a_drained_version_with_running_pods_is_not_eligible_for_deletion() {
        let mut obs = mid_rollout();
        obs.deployments
            .iter_mut()
            .filter(|d| d.build_id == RETIRED)
            .for_each(|d| d.status_replicas = 1);
        let status = project(&obs, None, None, 3, NOW);
        assert!(
            status
                .deprecated_versions
                .iter()
                .all(|v| !v.eligible_for_deletion)
        );
    }

    #[test]
    fn an_unregistered_target_without_a_deployment_has_no_references() {
        let mut obs = mid_rollout();
        obs.deployments.retain(|d| d.build_id != NEW);
        if let Ok(temporal) = obs.temporal.as_mut() {
            temporal.versions.retain(|v| v.build_id != NEW);
            temporal.ramping_build_id = None;
        }
        let target = project(&obs, None, None, 3, NOW)
            .target_version
            .expect("target version");
        assert_eq!(target.version.status, VersionState::NotRegistered);
        assert_eq!(target.version.deployment, None);
        assert_eq!(target.version.healthy_since, None);
        assert_eq!(target.ramp_percentage, None);
        assert_eq!(target.ramping_since, None);
    }

    #[test]
    fn an_unavailable_deployment_has_no_healthy_since() {
        let mut obs = mid_rollout();
        obs.deployments
            .iter_mut()
            .filter(|d| d.build_id == NEW)
            .for_each(|d| d.available = false);
        let target = project(&obs, None, None, 3, NOW)
            .target_version
            .expect("target version");
        assert_eq!(target.version.healthy_since, None);
        assert!(target.version.deployment.is_some());
    }

    #[test]
    fn conditions_and_phase_follow_the_report_corrected_by_the_observation() {
        let current = {
            let mut obs = mid_rollout();
            if let Ok(t) = obs.temporal.as_mut() {
                t.current_build_id = Some(NEW.into());
                t.ramping_build_id = None;
            }
            obs
        };
        let invalid = {
            let mut obs = mid_rollout();
            if let Some(spec) = obs.spec.as_mut() {
                spec.invalid = vec!["bad steps".into()];
            }
            obs
        };
        let unreadable = {
            let mut obs = mid_rollout();
            obs.temporal = Err(Blocked {
                reason: BlockReason::TemporalStateFetchFailed,
                message: "rate limited".into(),
            });
            obs
        };
        let blocked_report = RolloutReport {
            blocked: Some(Blocked {
                reason: BlockReason::GateFailed,
                message: "gate failed".into(),
            }),
            ..report(RolloutProgress::Blocked)
        };
        let other_build_report = RolloutReport {
            build_id: "v9-other".into(),
            ..report(RolloutProgress::Paused)
        };
        let cases: Vec<(
            &str,
            Observation,
            Option<RolloutReport>,
            Reasons,
            RolloutPhase,
        )> = vec![
            (
                "ramping report",
                mid_rollout(),
                Some(report(RolloutProgress::Ramping)),
                both("True", "Ramping"),
                RolloutPhase::Rolling,
            ),
            (
                "a ramping build briefly not Available is still rolling",
                mid_rollout(),
                Some(report(RolloutProgress::WaitingForAvailability)),
                both("True", "WaitingForAvailability"),
                RolloutPhase::Rolling,
            ),
            (
                "paused report",
                mid_rollout(),
                Some(report(RolloutProgress::Paused)),
                both("False", "Paused"),
                RolloutPhase::Paused,
            ),
            (
                "blocked report",
                mid_rollout(),
                Some(blocked_report.clone()),
                both("False", "GateFailed"),
                RolloutPhase::Blocked,
            ),
            (
                "aborted report",
                mid_rollout(),
                Some(report(RolloutProgress::Aborted)),
                both("False", "Aborted"),
                RolloutPhase::Aborted,
            ),
            (
                "target Current in Temporal",
                current.clone(),
                Some(report(RolloutProgress::Ramping)),
                vec![
                    ("Ready".into(), "True".into(), "RolloutComplete".into()),
                    (
                        "Progressing".into(),
                        "False".into(),
                        "RolloutComplete".into(),
                    ),
                ],
                RolloutPhase::Complete,
            ),
            (
                "report says Complete but the target is no longer Current",
                mid_rollout(),
                Some(report(RolloutProgress::Complete)),
                both("True", "Ramping"),
                RolloutPhase::Rolling,
            ),
            (
                "invalid spec wins",
                invalid,
                Some(report(RolloutProgress::Ramping)),
                both("False", "InvalidSpec"),
                RolloutPhase::Blocked,
            ),
            (
                "unreadable Temporal wins",
                unreadable,
                Some(report(RolloutProgress::Ramping)),
                both("False", "TemporalStateFetchFailed"),
                RolloutPhase::Blocked,
            ),
            (
                "no report: derived from Temporal",
                mid_rollout(),
                None,
                both("True", "Ramping"),
                RolloutPhase::Rolling,
            ),
            (
                "a report of another build is ignored",
                mid_rollout(),
                Some(other_build_report),
                both("True", "Ramping"),
                RolloutPhase::Rolling,
            ),
        ];
        for (name, obs, report, expected, phase) in cases {
            let status = project(&obs, report.as_ref(), None, 3, NOW);
            assert_eq!(reasons(&status), expected, "{name}");
            assert_eq!(status.rollout.and_then(|r| r.phase), Some(phase), "{name}");
        }
    }

    #[test]
    fn progress_without_a_report_is_derived_from_the_target_state() {
        let cases = [
            (
                VersionState::NotRegistered,
                RolloutProgress::WaitingForPollers,
            ),
            (VersionState::Inactive, RolloutProgress::WaitingForPromotion),
            (VersionState::Drained, RolloutProgress::WaitingForPromotion),
            (VersionState::Draining, RolloutProgress::WaitingForPromotion),
            (VersionState::Ramping, RolloutProgress::Ramping),
            (VersionState::Current, RolloutProgress::Complete),
        ];
        for (state, expected) in cases {
            assert_eq!(progress_from_state(state), expected, "{state:?}");
        }
    }

    #[test]
    fn a_started_rollout_is_named_and_waits_for_pollers_until_it_reports() {
        let workflow = format!("rollout/demo/hello/{NEW}");
        let started = |build| StartedRollout {
            build_id: build,
            workflow_id: &workflow,
            started_at: secs(300),
        };
        let with_target = |state: VersionState| {
            let mut obs = mid_rollout();
            if let Ok(t) = obs.temporal.as_mut() {
                t.ramping_build_id = None;
                t.versions.retain(|v| v.build_id != NEW);
                match state {
                    VersionState::Current => t.current_build_id = Some(NEW.into()),
                    VersionState::NotRegistered => {}
                    state => t.versions.push(version(NEW, state)),
                }
            }
            obs
        };
        // (case, target's state in Temporal, report, started rollout) -> what is shown:
        // (Ready reason, rollout.workflowID, rollout.startedAt)
        type Shown<'a> = (&'a str, Option<&'a str>, Option<UnixMillis>);
        type Case<'a> = (
            &'a str,
            VersionState,
            Option<RolloutReport>,
            Option<StartedRollout<'a>>,
            Shown<'a>,
        );
        let cases: Vec<Case<'_>> = vec![
            (
                "registered before the rollout reported: not yet waiting for promotion",
                VersionState::Inactive,
                None,
                Some(started(NEW)),
                ("WaitingForPollers", Some(&workflow), Some(secs(300))),
            ),
            (
                "not registered, started",
                VersionState::NotRegistered,
                None,
                Some(started(NEW)),
                ("WaitingForPollers", Some(&workflow), Some(secs(300))),
            ),
            (
                "a drained build rolled out again",
                VersionState::Drained,
                None,
                Some(started(NEW)),
                ("WaitingForPollers", Some(&workflow), Some(secs(300))),
            ),
            (
                "already Current: complete",
                VersionState::Current,
                None,
                Some(started(NEW)),
                ("RolloutComplete", Some(&workflow), Some(secs(300))),
            ),
            (
                "its first report takes over, with the rollout's own start",
                VersionState::Inactive,
                Some(report(RolloutProgress::WaitingForPromotion)),
                Some(started(NEW)),
                ("WaitingForPromotion", Some(&workflow), Some(secs(90))),
            ),
            (
                "a rollout of another build is not the target's",
                VersionState::Inactive,
                None,
                Some(started("v9-other")),
                ("WaitingForPromotion", None, None),
            ),
            (
                "no start known (histories before show-starting-rollout)",
                VersionState::Inactive,
                None,
                None,
                ("WaitingForPromotion", None, None),
            ),
        ];
        for (name, state, report, started, (reason, workflow_id, started_at)) in cases {
            let status = project(&with_target(state), report.as_ref(), started, 3, NOW);
            let ready = status
                .conditions
                .iter()
                .find(|c| c.type_ == "Ready")
                .map(|c| c.reason.as_str());
            assert_eq!(ready, Some(reason), "{name}");
            let rollout = status.rollout.expect("rollout");
            assert_eq!(rollout.workflow_id.as_deref(), workflow_id, "{name}");
            assert_eq!(rollout.started_at, started_at.map(t), "{name}");
        }
    }

    #[test]
    fn conditions_carry_generation_and_now() {
        let status = project(&mid_rollout(), None, None, 9, NOW);
        assert_eq!(status.conditions.len(), 2);
        for c in &status.conditions {
            assert_eq!(c.observed_generation, Some(9));
            assert_eq!(c.last_transition_time, t(NOW));
        }
        let [ready, progressing] = [&status.conditions[0], &status.conditions[1]];
        assert_eq!(ready.message, format!("Target version {NEW} is ramping"));
        assert_eq!(
            progressing.message,
            format!("Target version {NEW} is receiving a percentage of new workflows")
        );
    }

    #[test]
    fn rollout_links_the_workflow_and_says_where_it_is() {
        let mut paused = report(RolloutProgress::Paused);
        paused.step = Some(2);
        let rollout = project(&mid_rollout(), Some(&paused), None, 3, NOW)
            .rollout
            .expect("rollout");
        assert_eq!(
            rollout,
            RolloutStatus {
                workflow_id: Some(format!("rollout/demo/hello/{NEW}")),
                run_id: Some("run-1".into()),
                phase: Some(RolloutPhase::Paused),
                step: Some(2),
                paused: true,
                message: Some("Ramping to 25% (step 1 of 3)".into()),
                started_at: Some(t(secs(90))),
                updated_at: Some(t(NOW)),
                analysis: Vec::new(),
            }
        );
        let blocked = RolloutReport {
            blocked: Some(Blocked {
                reason: BlockReason::ProgressDeadlineExceeded,
                message: "deadline".into(),
            }),
            ..report(RolloutProgress::Blocked)
        };
        let rollout = project(&mid_rollout(), Some(&blocked), None, 3, NOW)
            .rollout
            .expect("rollout");
        assert_eq!(rollout.message.as_deref(), Some("deadline"));
        assert!(!rollout.paused);
    }

    #[test]
    fn without_temporal_versions_are_unknown_and_the_reason_is_shown() {
        let mut obs = mid_rollout();
        obs.temporal = Err(Blocked {
            reason: BlockReason::AuthSecretInvalid,
            message: "secret missing".into(),
        });
        let status = project(&obs, None, None, 3, NOW);
        assert_eq!(
            status.target_version.as_ref().map(|t| t.version.status),
            Some(VersionState::NotRegistered)
        );
        assert_eq!(status.current_version, None);
        assert_eq!(status.version_count, None);
        assert_eq!(reasons(&status), both("False", "AuthSecretInvalid"));
    }

    #[test]
    fn a_gone_twd_projects_only_its_generation() {
        let mut obs = mid_rollout();
        obs.spec = None;
        assert_eq!(
            project(&obs, None, None, 3, NOW),
            TemporalWorkerDeploymentStatus {
                observed_generation: Some(3),
                ..Default::default()
            }
        );
    }

    #[test]
    fn status_times_are_rfc3339_and_never_panic() {
        assert_eq!(
            serde_json::to_value(t(secs(1_700_000_000))).ok(),
            Some(serde_json::json!("2023-11-14T22:13:20Z"))
        );
        assert_eq!(time(i64::MAX), Time(Timestamp::MAX));
        assert_eq!(time(i64::MIN), Time(Timestamp::MIN));
    }
}
