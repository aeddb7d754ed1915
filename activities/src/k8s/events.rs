//! Kubernetes Events on a worker deployment (`kubectl describe wd` / `kubectl events`) and on
//! the other objects the controller acts for, recorded through kube-runtime's events Recorder
//! with reporter `twc`. A namespace being
//! deleted refuses new events; an event about a worker deployment there is recorded in the
//! controller's own namespace instead (still regarding it), so what the deletion path says is
//! not lost.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client};
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
/// The cause the API server gives when it refuses new objects in a namespace being deleted.
const NAMESPACE_TERMINATING: &str = "NamespaceTerminating";

/// Where an event was recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// On the TWD, in its namespace.
    OnTwd,
    /// In the controller's own namespace (the TWD's is being deleted), regarding the TWD.
    InOwnNamespace,
    /// Nowhere: the TWD is gone.
    TwdGone,
}

/// Records an event on the TWD (the claim holder of its name); when its namespace is being
/// deleted, in `own_namespace` (the controller's) instead, if given.
pub async fn emit_event(
    client: &Client,
    twd: &TwdRef,
    kind: EventKind,
    (reason, message): (&str, &str),
    own_namespace: Option<&str>,
) -> Result<Recorded, K8sError> {
    let Some(resource) = get_twd(client, twd).await? else {
        tracing::debug!(twd = %twd.key(), reason, "TWD gone; event not recorded");
        return Ok(Recorded::TwdGone);
    };
    emit_event_on(client, &resource, kind, (reason, message), own_namespace).await
}

/// Records an event on `resource`, a worker deployment object of either kind (see
/// [`emit_event`]).
pub async fn emit_event_on(
    client: &Client,
    resource: &WorkerObject,
    kind: EventKind,
    (reason, message): (&str, &str),
    own_namespace: Option<&str>,
) -> Result<Recorded, K8sError> {
    let name = resource.metadata.name.as_deref().unwrap_or_default();
    let object = worker_object_name(
        resource.kind,
        resource.metadata.namespace.as_deref().unwrap_or_default(),
        name,
    );
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
    let regarding = resource.object_reference();
    let published = Recorder::new(client.clone(), reporter())
        .publish(&event, &regarding)
        .await;
    match (published, own_namespace) {
        (Ok(()), _) => {
            tracing::debug!(%object, reason, ?kind, "recorded event");
            Ok(Recorded::OnTwd)
        }
        (Err(e), Some(own_namespace)) if namespace_terminating(&e) => {
            let own = ObjectName::new("Event", own_namespace, name);
            Api::<K8sEvent>::namespaced(client.clone(), own_namespace)
                .create(
                    &PostParams::default(),
                    &event_in(own_namespace, &event, regarding),
                )
                .await
                .map_err(K8sError::api("record an event about a TWD in", &own))?;
            tracing::info!(%object, reason, namespace = own_namespace,
                "the TWD's namespace is being deleted; recorded the event in the controller's namespace");
            Ok(Recorded::InOwnNamespace)
        }
        (Err(e), _) => Err(K8sError::api("record an event on", &object)(e)),
    }
}

/// Whether the API server refused a write because the namespace is being deleted.
fn namespace_terminating(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status)
    if status.code == 403
        && status.details.as_ref().is_some_and(|d| {
            d.causes.iter().any(|c| c.reason == NAMESPACE_TERMINATING)
        }))
}

/// The events.k8s.io event kube-runtime's Recorder writes, in `namespace` rather than the
/// namespace of the object it regards.
fn event_in(namespace: &str, event: &Event, regarding: ObjectReference) -> K8sEvent {
    let now = Timestamp::now();
    let reporter = reporter();
    let name = format!(
        "{}.{:x}",
        regarding.name.as_deref().unwrap_or(REPORTER),
        now.as_nanosecond()
    );
    K8sEvent {
        action: Some(event.action.clone()),
        reason: Some(event.reason.clone()),
        event_time: Some(MicroTime(now)),
        regarding: Some(regarding),
        note: event.note.clone(),
        metadata: ObjectMeta {
            namespace: Some(namespace.to_owned()),
            name: Some(name),
            ..Default::default()
        },
        reporting_instance: Some(
            reporter
                .instance
                .clone()
                .unwrap_or_else(|| reporter.controller.clone()),
        ),
        reporting_controller: Some(reporter.controller),
        type_: Some(
            match event.type_ {
                EventType::Normal => "Normal",
                EventType::Warning => "Warning",
            }
            .to_owned(),
        ),
        ..Default::default()
    }
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

    fn refusal(code: u16, cause: &str) -> kube::Error {
        let status: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "code": code, "reason": "Forbidden",
            "message": "events.events.k8s.io is forbidden: unable to create new content in namespace demo because it is being terminated",
            "details": { "kind": "events.events.k8s.io",
                "causes": [ { "reason": cause, "message": "namespace demo is being terminated", "field": "metadata.namespace" } ] }
        }))
        .expect("a Status");
        kube::Error::Api(Box::new(status))
    }

    #[test]
    fn only_a_namespace_being_deleted_sends_events_to_the_controller_s_namespace() {
        assert!(namespace_terminating(&refusal(403, "NamespaceTerminating")));
        // RBAC refusing the write, or another cause: the event is not moved.
        assert!(!namespace_terminating(&refusal(403, "FieldValueForbidden")));
        assert!(!namespace_terminating(&refusal(
            409,
            "NamespaceTerminating"
        )));
    }

    #[test]
    fn an_event_moved_to_the_controller_s_namespace_still_regards_the_twd() {
        let regarding = ObjectReference {
            kind: Some("TemporalWorkerDeployment".into()),
            namespace: Some("demo".into()),
            name: Some("hello".into()),
            ..Default::default()
        };
        let event = Event {
            type_: EventType::Warning,
            reason: "TemporalCleanupSkipped".into(),
            note: Some("left in Temporal".into()),
            action: "TemporalCleanupSkipped".into(),
            secondary: None,
        };
        let moved = event_in("twc-system", &event, regarding.clone());
        assert_eq!(moved.metadata.namespace.as_deref(), Some("twc-system"));
        assert!(moved.metadata.name.is_some_and(|n| n.starts_with("hello.")));
        assert_eq!(moved.regarding, Some(regarding));
        assert_eq!(moved.type_.as_deref(), Some("Warning"));
        assert_eq!(moved.reason.as_deref(), Some("TemporalCleanupSkipped"));
        assert_eq!(moved.note.as_deref(), Some("left in Temporal"));
        assert!(
            moved.event_time.is_some(),
            "events.k8s.io requires eventTime"
        );
        assert_eq!(moved.reporting_controller.as_deref(), Some(REPORTER));
    }

    #[test]
    fn long_messages_are_cut_at_a_character_boundary() {
        assert_eq!(truncate("short", 10), "short");
        assert_eq!(truncate("ééé", 3), "é");
        assert_eq!(truncate(&"x".repeat(2000), MAX_NOTE).len(), MAX_NOTE);
    }
}
