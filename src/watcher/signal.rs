//! The spec signal: signal-with-start of a TWD's workflow, after taking over a build another
//! controller made (first sight), with its span and metrics; and what the watcher learns from
//! Temporal once at the start (which TWD workflows run).

use futures::StreamExt;
use temporalio_client::{Client, WorkflowListOptions, WorkflowStartOptions};
use twc_activities::k8s::adoption;
use twc_crds::WorkerObject;
use twc_workflows::control::ROLLOUT_ACTION_ANNOTATION;
use twc_workflows::model::TwdRef;
use twc_workflows::twd_workflow::{SpecSignal, TwdInput, TwdWorkflow};

use super::WatcherConfig;
use super::reconcile::WatchError;

/// Signals the holder `twd` of its name to its workflow (starting it if needed); `nudge` asks
/// for a turn even if the spec is the one held.
pub async fn signal_twd(
    kube: &kube::Client,
    engine: &Client,
    config: &WatcherConfig,
    twd: &WorkerObject,
    nudge: bool,
) -> Result<(), WatchError> {
    let twd_ref = TwdRef {
        namespace: twd.metadata.namespace.clone().unwrap_or_default(),
        name: twd.metadata.name.clone().unwrap_or_default(),
    };
    // First sight of a worker deployment another controller managed: take over the build of a
    // live Deployment running its template, so that nothing is rolled out again.
    let mut adopted = None;
    if adoption::may_adopt(twd) {
        let found = adoption::find_adoptable_build(kube, twd)
            .await
            .map_err(WatchError::FindAdoptable)?;
        if let Some(build) = found {
            adoption::record_adoption(kube, twd, &build)
                .await
                .map_err(WatchError::RecordAdoption)?;
            adopted = Some(build);
        }
    }
    let build_id = match adopted {
        Some(adopted) => adopted.build_id,
        None => twc_crds::build_id::target_build_id(twd).to_string(),
    };
    let generation = twd.metadata.generation.unwrap_or_default();
    let deleting = twd.deleting();
    let signal = SpecSignal {
        generation,
        build_id,
        deleting,
        uid: twd.metadata.uid.clone(),
        nudge,
    };
    let input = TwdInput {
        twd: twd_ref.clone(),
        search_attributes: config.search_attributes,
        history_event_bound: Some(config.history_event_bound),
        resync_seconds: Some(config.resync_seconds),
        carried: None,
    };
    let options =
        WorkflowStartOptions::new(config.task_queue.clone(), twd_ref.twd_workflow_id()).build();
    let sent_at = std::time::SystemTime::now();
    let started = std::time::Instant::now();
    let result = engine
        .signal_with_start_workflow(
            TwdWorkflow::run,
            input,
            TwdWorkflow::spec_changed,
            signal.clone(),
            options,
        )
        .await;
    if let Some(traces) = &config.traces {
        use crate::run::telemetry::traces::{SpecSignal as Span, record_spec_signal};
        let result = match &result {
            Ok(handle) => Ok(handle.run_id()),
            Err(e) => Err(e.to_string()),
        };
        let (twd, build_id, start) = (&twd_ref, signal.build_id.as_str(), sent_at);
        record_spec_signal(
            traces,
            Span {
                twd,
                generation,
                build_id,
                deleting,
                start,
                result,
            },
        );
    }
    let ok = result.is_ok();
    config.metrics.watcher_signal("spec_changed", ok);
    config.metrics.temporal_request(
        "SignalWithStartWorkflowExecution",
        if ok { "success" } else { "error" },
    );
    result.map_err(|e| WatchError::Signal(Box::new(e)))?;
    let elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
    tracing::info!(twd = %twd_ref.key(), generation, build_id = %signal.build_id, deleting, nudge, elapsed_ms, "signalled TWD workflow");
    Ok(())
}

/// The TWDs whose workflows run now, read once when the watcher starts (none if Temporal
/// cannot list them: every TWD is signalled then, as it would be anyway).
pub async fn running_twd_workflows(engine: &Client) -> Vec<TwdRef> {
    let options = WorkflowListOptions::builder().build();
    let mut stream =
        engine.list_workflows("WorkflowType='twd' AND ExecutionStatus='Running'", options);
    let mut running = Vec::new();
    while let Some(execution) = stream.next().await {
        match execution {
            Ok(execution) => running.extend(twd_of_workflow(execution.id())),
            Err(e) => {
                tracing::warn!(
                    "listing the running TWD workflows failed; every TWD is signalled: {e}"
                );
                return Vec::new();
            }
        }
    }
    tracing::info!(
        running = running.len(),
        "TWD workflows running at the start"
    );
    running
}

/// The TWD of a workflow ID `twd/<namespace>/<name>`.
fn twd_of_workflow(id: &str) -> Option<TwdRef> {
    let (namespace, name) = id.strip_prefix("twd/")?.split_once('/')?;
    Some(TwdRef {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
    })
}

/// Whether the TWD's workflow has already handled its current generation: the status it wrote
/// says so (and the object is not being deleted and carries no rollout action, which are
/// always handled).
pub fn signalled_before(
    meta: &kube::api::ObjectMeta,
    status: Option<&twc_crds::worker_deployment::TemporalWorkerDeploymentStatus>,
) -> bool {
    let action = meta
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(ROLLOUT_ACTION_ANNOTATION));
    meta.deletion_timestamp.is_none()
        && !action
        && status.is_some_and(|s| s.rollout.is_some())
        && status.and_then(|s| s.observed_generation) == meta.generation
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kube::api::ObjectMeta;
    use twc_crds::worker_deployment::{RolloutStatus, TemporalWorkerDeploymentStatus};

    use super::*;

    #[test]
    fn a_twd_workflow_id_names_its_twd() {
        let twd = TwdRef {
            namespace: "demo".to_owned(),
            name: "hello".to_owned(),
        };
        assert_eq!(twd_of_workflow(&twd.twd_workflow_id()), Some(twd));
        assert_eq!(twd_of_workflow("rollout/demo/hello/v1"), None);
        assert_eq!(twd_of_workflow("twd/demo"), None);
    }

    #[test]
    fn a_status_of_the_generation_with_a_rollout_means_its_workflow_handled_it() {
        let meta = |generation: i64, deleting: bool, annotated: bool| ObjectMeta {
            generation: Some(generation),
            deletion_timestamp: deleting.then_some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)),
            annotations: annotated.then(|| {
                BTreeMap::from([(ROLLOUT_ACTION_ANNOTATION.to_owned(), "promote".to_owned())])
            }),
            ..Default::default()
        };
        let status = |observed: i64, rollout: bool| TemporalWorkerDeploymentStatus {
            observed_generation: Some(observed),
            rollout: rollout.then(RolloutStatus::default),
            ..Default::default()
        };
        // (case, metadata, status, handled)
        let cases = [
            (
                "its generation, a rollout",
                meta(2, false, false),
                Some(status(2, true)),
                true,
            ),
            (
                "an older generation",
                meta(3, false, false),
                Some(status(2, true)),
                false,
            ),
            (
                "no rollout shown yet",
                meta(2, false, false),
                Some(status(2, false)),
                false,
            ),
            ("no status", meta(2, false, false), None, false),
            (
                "being deleted",
                meta(2, true, false),
                Some(status(2, true)),
                false,
            ),
            (
                "a rollout action waiting",
                meta(2, false, true),
                Some(status(2, true)),
                false,
            ),
        ];
        for (case, meta, status, handled) in cases {
            assert_eq!(signalled_before(&meta, status.as_ref()), handled, "{case}");
        }
    }
}
