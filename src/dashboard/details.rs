//! One worker deployment's page, as JSON: the overview row, versions, the rollout's timeline,
//! analysis and autoscaling series, drain, conditions, events and Web UI links. Kubernetes'
//! view comes from the watches (and an events list); the engine's parts are left out, with
//! the reason, while the engine Temporal cannot be reached.

use serde_json::{Value, json};
use twc_crds::worker_deployment::RolloutPhase;
use twc_workflows::model::{RolloutProgress, TwdRef};

use super::Dashboard;
use super::model::{self, Pods};
use super::store::Key;
use crate::cli::status::{event_time, rollouts_query, twd_events};
use crate::cli::url_encode;

/// Events shown on a page.
const EVENTS_SHOWN: usize = 30;

/// The page of `key`, or None when no such worker deployment is watched.
pub async fn details(dashboard: &Dashboard, key: &Key) -> Option<Value> {
    let twd = dashboard.store.worker(key)?;
    let twd_ref = TwdRef {
        namespace: key.0.clone(),
        name: key.1.clone(),
    };
    let status = twd.status.clone().unwrap_or_default();
    let rollout = status.rollout.clone().unwrap_or_default();
    let pods = dashboard.store.pods(key);
    let versions = model::versions(&status, |build| pods.get(build).copied());

    let (view, engine_error) = match dashboard.engine.view(&twd_ref).await {
        Ok(view) => (Some(view), None),
        Err(e) => (None, Some(format!("{e:#}"))),
    };
    let report = view.as_ref().and_then(|v| {
        v.twd.last_report.as_ref().filter(|r| {
            v.twd
                .active
                .as_ref()
                .is_some_and(|a| a.workflow_id == r.workflow_id)
        })
    });
    let control = view.as_ref().and_then(|v| v.control.as_ref());
    let operator_paused = control.is_some_and(|c| c.operator_paused);
    let held = operator_paused
        || twd.spec.rollout.paused
        || matches!(
            rollout.phase,
            Some(RolloutPhase::Paused | RolloutPhase::Blocked | RolloutPhase::Aborted)
        )
        || report.is_some_and(|r| r.progress == RolloutProgress::Paused);
    let step = report
        .and_then(|r| r.step)
        .or_else(|| rollout.step.and_then(|s| u32::try_from(s).ok()))
        .and_then(|s| usize::try_from(s).ok());
    let ramping = status
        .target_version
        .as_ref()
        .and_then(|t| t.ramp_percentage)
        .is_some();
    let next_step_at = report.and_then(|r| r.next_step_at);
    let steps = model::timeline(&twd, step.filter(|_| ramping), held, next_step_at);
    let held_by = match (twd.spec.rollout.paused, operator_paused) {
        (true, _) => Some("spec.rollout.paused (set it to false to continue)"),
        (false, true) => Some("an operator's pause (resume to continue)"),
        _ => None,
    };

    let series = match &engine_error {
        None => dashboard
            .engine
            .series(&twd_ref, rollout.workflow_id.as_deref())
            .await
            .unwrap_or_else(|e| {
                tracing::debug!("dashboard: reading histories of {}: {e:#}", twd_ref.key());
                super::engine::Series::default()
            }),
        Some(_) => super::engine::Series::default(),
    };
    let checks = twd
        .spec
        .rollout
        .analysis
        .as_ref()
        .map(|a| model::check_limits(&a.checks))
        .unwrap_or_default();
    let events = match twd_events(&dashboard.kube, &twd_ref).await {
        Ok(events) => events
            .into_iter()
            .take(EVENTS_SHOWN)
            .map(|e| {
                json!({
                    "at": event_time(&e),
                    "type": e.type_,
                    "reason": e.reason,
                    "message": e.message,
                    "count": e.series.as_ref().and_then(|s| s.count).or(e.count),
                })
            })
            .collect(),
        Err(e) => {
            tracing::debug!("dashboard: {e:#}");
            Vec::new()
        }
    };
    let links = links(
        dashboard,
        &twd_ref,
        rollout.workflow_id.as_deref(),
        rollout.run_id.as_deref(),
    );
    Some(json!({
        "summary": model::summary(&twd),
        "generation": twd.metadata.generation,
        "observedGeneration": status.observed_generation,
        "rollout": {
            "workflowId": rollout.workflow_id,
            "runId": rollout.run_id,
            "phase": rollout.phase.map(|p| format!("{p:?}")),
            "message": rollout.message,
            "startedAt": rollout.started_at.as_ref().map(|t| t.0.as_millisecond()),
            "updatedAt": rollout.updated_at.as_ref().map(|t| t.0.as_millisecond()),
            "step": step,
            "nextStepAt": next_step_at,
            "heldBy": held_by,
            "promoteRequested": control.is_some_and(|c| c.promote_requested),
            "analysis": rollout.analysis,
        },
        "versions": versions,
        "steps": steps,
        "checks": checks,
        "analysis": series.analysis,
        "autoscaling": twd.spec.autoscaling.as_ref().map(|a| json!({
            "minReplicas": a.min_replicas,
            "maxReplicas": a.max_replicas,
            "backlogPerReplica": a.backlog_per_replica,
            "backlogAgeSeconds": a.backlog_age_seconds,
        })),
        "backlog": series.backlog,
        "scaled": series.scaled,
        "pods": pods.iter().map(|(build, Pods { replicas, ready })| json!({
            "buildId": build, "replicas": replicas, "ready": ready,
        })).collect::<Vec<_>>(),
        "conditions": status.conditions.iter().map(|c| json!({
            "type": c.type_,
            "status": c.status,
            "reason": c.reason,
            "message": c.message,
            "since": c.last_transition_time.0.as_millisecond(),
        })).collect::<Vec<_>>(),
        "events": events,
        "links": links,
        "engineError": engine_error,
        "now": super::server::now_millis(),
    }))
}

/// Web UI links of the rollout workflow, the TWD workflow and every rollout of the TWD.
fn links(dashboard: &Dashboard, twd: &TwdRef, rollout: Option<&str>, run: Option<&str>) -> Value {
    let Some(ui) = dashboard.ui_url.as_deref() else {
        return json!({});
    };
    let namespace = url_encode(dashboard.engine.namespace());
    let workflow = |id: &str, run: Option<&str>| match run {
        Some(run) => format!(
            "{ui}/namespaces/{namespace}/workflows/{}/{}/history",
            url_encode(id),
            url_encode(run)
        ),
        None => format!("{ui}/namespaces/{namespace}/workflows/{}", url_encode(id)),
    };
    json!({
        "rollout": rollout.map(|id| workflow(id, run)),
        "twdWorkflow": workflow(&twd.twd_workflow_id(), None),
        "allRollouts": format!(
            "{ui}/namespaces/{namespace}/workflows?query={}",
            url_encode(&rollouts_query(twd))
        ),
    })
}
