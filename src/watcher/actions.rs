//! The kubectl-only control path: a `temporal.io/rollout-action` annotation on a TWD becomes the
//! `control` update of its workflow. Every replica sees the annotation, so each first removes it
//! with a JSON patch that tests its value, and only the replica whose removal succeeds sends the
//! control: it is acted on exactly once however many replicas run (a bad value is answered with
//! a Warning event by that replica alone). Also the `ClusterConnectionUnsupported` warning.

use kube::api::{Patch, PatchParams};
use temporalio_client::errors::WorkflowUpdateError;
use temporalio_client::{Client, WorkflowExecuteUpdateOptions};
use twc_activities::k8s::connection::cluster_connection_unsupported;
use twc_activities::k8s::twd::worker_api;
use twc_activities::metrics::Metrics;
use twc_crds::WorkerKind;
use twc_crds::worker_deployment::ConnectionKind;
use twc_workflows::contract::EventKind;
use twc_workflows::control::{self, ROLLOUT_ACTION_ANNOTATION};
use twc_workflows::model::{ControlAction, TwdRef};
use twc_workflows::twd_workflow::TwdWorkflow;

use super::names::Stored;
use super::reconcile::WatchError;

/// The rollout-action annotation on `holder`, if any.
pub fn annotation(holder: &Stored) -> Option<&str> {
    holder
        .meta()
        .annotations
        .as_ref()
        .and_then(|a| a.get(ROLLOUT_ACTION_ANNOTATION))
        .map(String::as_str)
}

/// What taking an annotation came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    /// Nothing to send: another replica took it (or it changed), or a bad value this replica
    /// removed and answered.
    Nothing,
    /// This replica removed the annotation: it sends the control.
    Control(ControlAction),
}

/// Takes the annotation `value` of `holder`: removes it if it still holds `value`, and only
/// when that removal succeeds returns the control to send (a bad value is answered with a
/// Warning event instead).
pub async fn take(kube: &kube::Client, holder: &Stored, value: &str) -> Result<Taken, WatchError> {
    let twd = holder.twd();
    match remove_annotation(kube, &twd, holder.kind(), value).await? {
        Removal::NotOurs => {
            tracing::debug!(twd = %twd.key(), %value, "rollout action annotation taken by another replica (or changed)");
            Ok(Taken::Nothing)
        }
        Removal::Removed => match control::parse_action(value) {
            Some(action) => Ok(Taken::Control(action)),
            None => {
                let message = format!(
                    "{ROLLOUT_ACTION_ANNOTATION}={value:?} is not a rollout action; use one of pause, resume, promote, abort, retry. The annotation was removed."
                );
                event(
                    kube,
                    &twd,
                    EventKind::Warning,
                    "InvalidRolloutAction",
                    &message,
                )
                .await;
                Ok(Taken::Nothing)
            }
        },
    }
}

/// Sends a control taken from an annotation as the `control` update of the TWD's workflow (the
/// one entry point of controls). A refused control is answered with a `ControlIgnored` event
/// giving the reason, a workflow that does not run with `RolloutActionFailed`; an error that
/// may pass is returned (the control is sent again later).
pub async fn send_control(
    kube: &kube::Client,
    engine: &Client,
    metrics: &Metrics,
    twd: &TwdRef,
    action: ControlAction,
) -> Result<(), WatchError> {
    let name = control::action_name(action);
    let handle = engine.get_workflow_handle::<TwdWorkflow>(twd.twd_workflow_id());
    let sent = handle
        .execute_update(
            TwdWorkflow::control_update,
            action,
            WorkflowExecuteUpdateOptions::default(),
        )
        .await;
    let outcome = match &sent {
        Ok(_) => "success",
        Err(WorkflowUpdateError::Failed(_)) => "rejected",
        Err(WorkflowUpdateError::NotFound(_)) => "not_found",
        Err(_) => "error",
    };
    metrics.watcher_signal(
        "control",
        matches!(sent, Ok(_) | Err(WorkflowUpdateError::Failed(_))),
    );
    metrics.temporal_request("UpdateWorkflowExecution", outcome);
    match sent {
        Ok(answer) => {
            tracing::info!(twd = %twd.key(), action = name, %answer, "rollout action annotation accepted");
            Ok(())
        }
        Err(WorkflowUpdateError::Failed(failure)) => {
            tracing::info!(twd = %twd.key(), action = name, reason = %failure.message, "rollout action annotation refused");
            event(
                kube,
                twd,
                EventKind::Normal,
                control::REASON_IGNORED,
                &failure.message,
            )
            .await;
            Ok(())
        }
        Err(WorkflowUpdateError::NotFound(_)) => {
            let message = format!(
                "{ROLLOUT_ACTION_ANNOTATION}={name} was not applied: the workflow {} does not run; the controller starts it for every TWD it watches",
                twd.twd_workflow_id()
            );
            event(
                kube,
                twd,
                EventKind::Warning,
                "RolloutActionFailed",
                &message,
            )
            .await;
            Ok(())
        }
        Err(source) => Err(WatchError::SendControl {
            action: name,
            source: Box::new(source),
        }),
    }
}

/// A Warning event `ClusterConnectionUnsupported` on a TWD that references a ClusterConnection
/// while this controller is restricted to namespaces (its workflow shows the same reason in the
/// conditions).
pub async fn warn_unsupported_connection(kube: &kube::Client, restricted: bool, holder: &Stored) {
    let reference = &holder.spec().worker_options.connection_ref;
    if !restricted
        || reference.kind != ConnectionKind::ClusterConnection
        || holder.meta().deletion_timestamp.is_some()
    {
        return;
    }
    let twd = holder.twd();
    let message = cluster_connection_unsupported(&twd.namespace, &reference.name);
    event(
        kube,
        &twd,
        EventKind::Warning,
        "ClusterConnectionUnsupported",
        &message,
    )
    .await;
}

/// How removing the rollout-action annotation went (an error that may pass aside).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Removal {
    /// This replica removed the value it saw.
    Removed,
    /// The value is gone or changed (another replica took it, or a person changed it; a newer
    /// value arrives as its own watch event), or the TWD is gone.
    NotOurs,
}

impl Removal {
    /// Classifies the answer to the removal patch.
    fn of<T>(answer: Result<T, kube::Error>) -> Result<Self, kube::Error> {
        match answer {
            Ok(_) => Ok(Self::Removed),
            // 422: the `test` operation failed (the value changed or vanished); 404: the TWD is
            // gone; 409: a conflicting write.
            Err(kube::Error::Api(status)) if [404, 409, 422].contains(&status.code) => {
                Ok(Self::NotOurs)
            }
            Err(e) => Err(e),
        }
    }
}

/// Removes the annotation if it still holds `value` (a JSON patch `test` first, so a newer
/// value, or one another replica already removed, is left alone).
async fn remove_annotation(
    kube: &kube::Client,
    twd: &TwdRef,
    kind: WorkerKind,
    value: &str,
) -> Result<Removal, WatchError> {
    let path = format!(
        "/metadata/annotations/{}",
        ROLLOUT_ACTION_ANNOTATION
            .replace('~', "~0")
            .replace('/', "~1")
    );
    let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
        { "op": "test", "path": path, "value": value },
        { "op": "remove", "path": path },
    ]))
    .map_err(WatchError::AnnotationPatch)?;
    let answer = worker_api(kube, &twd.namespace, kind)
        .patch(
            &twd.name,
            &PatchParams::default(),
            &Patch::Json::<()>(patch),
        )
        .await;
    Removal::of(answer).map_err(WatchError::RemoveAnnotation)
}

async fn event(kube: &kube::Client, twd: &TwdRef, kind: EventKind, reason: &str, message: &str) {
    if let Err(e) = twc_activities::k8s::emit_event(kube, twd, kind, (reason, message), None).await
    {
        tracing::warn!(twd = %twd.key(), reason, "recording an event failed: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_replica_whose_removal_succeeds_takes_the_annotation() {
        let api = |code: u16| -> Result<(), kube::Error> {
            Err(kube::Error::Api(
                kube::core::Status::failure("patch", "Failure")
                    .with_code(code)
                    .boxed(),
            ))
        };
        // (case, answer to the patch, removal; None: retried)
        let cases = [
            ("removed", Ok(()), Some(Removal::Removed)),
            (
                "test failed: another replica removed it",
                api(422),
                Some(Removal::NotOurs),
            ),
            ("the TWD is gone", api(404), Some(Removal::NotOurs)),
            ("a conflicting write", api(409), Some(Removal::NotOurs)),
            ("server error", api(500), None),
            ("rate limited", api(429), None),
        ];
        for (case, answer, expected) in cases {
            assert_eq!(Removal::of(answer).ok(), expected, "{case}");
        }
    }
}
