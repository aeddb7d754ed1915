//! Kubernetes Events on a worker deployment (`kubectl describe wd` / `kubectl events`) and on the
//! other objects the controller acts for, recorded through kube-runtime's events Recorder with
//! reporter `twc`.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use twc_crds::WorkerObject;
use twc_workflows::contract::EventKind;
use twc_workflows::model::TwdRef;

use super::error::{K8sError, ObjectName};
use super::twd::{get_twd, worker_object_name};

/// Reporting controller name on every event.
pub const REPORTER: &str = "twc";
/// Longest event note the API server accepts (bytes).
const MAX_NOTE: usize = 1024;
/// Longest event reason and action (bytes).
const MAX_REASON: usize = 128;

/// Records an event on the TWD (the claim holder of its name); returns false (and records
/// nothing) when the TWD is gone.
pub async fn emit_event(
    client: &Client,
    twd: &TwdRef,
    kind: EventKind,
    reason: &str,
    message: &str,
) -> Result<bool, K8sError> {
    let Some(resource) = get_twd(client, twd).await? else {
        tracing::debug!(twd = %twd.key(), reason, "TWD gone; event not recorded");
        return Ok(false);
    };
    emit_event_on(client, &resource, kind, reason, message).await?;
    Ok(true)
}

/// Records an event on `resource`, a worker deployment object of either kind.
pub async fn emit_event_on(
    client: &Client,
    resource: &WorkerObject,
    kind: EventKind,
    reason: &str,
    message: &str,
) -> Result<(), K8sError> {
    let object = worker_object_name(
        resource.kind,
        resource.metadata.namespace.as_deref().unwrap_or_default(),
        resource.metadata.name.as_deref().unwrap_or_default(),
    );
    publish(
        client,
        &resource.object_reference(),
        &object,
        kind,
        reason,
        message,
    )
    .await
}

/// Records an event on the object `reference` points at (`object` names it in errors).
pub async fn publish(
    client: &Client,
    reference: &ObjectReference,
    object: &ObjectName,
    kind: EventKind,
    reason: &str,
    message: &str,
) -> Result<(), K8sError> {
    let reason = truncate(reason, MAX_REASON);
    let event = Event {
        type_: match kind {
            EventKind::Normal => EventType::Normal,
            EventKind::Warning => EventType::Warning,
        },
        reason: reason.to_owned(),
        note: Some(truncate(message, MAX_NOTE).to_owned()),
        action: reason.to_owned(),
        secondary: None,
    };
    Recorder::new(client.clone(), reporter())
        .publish(&event, reference)
        .await
        .map_err(K8sError::api("record an event on", object))?;
    tracing::debug!(%object, reason, ?kind, "recorded event");
    Ok(())
}

/// `twc`, with this replica's pod name as the instance when known.
fn reporter() -> Reporter {
    let instance = ["POD_NAME", "HOSTNAME"]
        .into_iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()));
    Reporter {
        controller: REPORTER.into(),
        instance: instance.map(|i| truncate(&i, MAX_REASON).to_owned()),
    }
}

/// The longest prefix of `text` within `max` bytes, cut at a character boundary.
fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_messages_are_cut_at_a_character_boundary() {
        assert_eq!(truncate("short", 10), "short");
        assert_eq!(truncate("ééé", 3), "é");
        assert_eq!(truncate(&"x".repeat(2000), MAX_NOTE).len(), MAX_NOTE);
    }
}
