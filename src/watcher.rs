//! The light Kubernetes watcher: turns TemporalWorkerDeployment changes into signals on each
//! TWD's workflow (signal-with-start), and TemporalConnection changes into nudges of the TWDs
//! that use them. It decides nothing; duplicate signals are harmless (the workflow ignores
//! generations it has seen and at most resyncs).
//!
//! It also carries the kubectl-only control path: a `temporal.io/rollout-action` annotation on a
//! TWD becomes the `control` signal, then the annotation is removed (a bad value is answered
//! with a Warning event and removed too).

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use temporalio_client::errors::WorkflowInteractionError;
use temporalio_client::{Client, WorkflowSignalOptions, WorkflowStartOptions};
use twc_crds::{TemporalConnection, TemporalWorkerDeployment};
use twc_workflows::contract::EventKind;
use twc_workflows::control::{self, ROLLOUT_ACTION_ANNOTATION};
use twc_workflows::model::TwdRef;
use twc_workflows::twd_workflow::{SpecSignal, TwdInput, TwdWorkflow};

/// What the watcher needs.
#[derive(Clone)]
pub struct WatcherConfig {
    /// Namespaces to watch (empty: all).
    pub namespaces: Vec<String>,
    /// Engine task queue.
    pub task_queue: String,
    /// Whether rollouts carry search attributes.
    pub search_attributes: bool,
}

/// Last signal sent per TWD, to skip status-only updates.
type Sent = HashMap<(String, String), (String, i64, bool)>;

/// Rollout-action annotation values handled per TWD (uid, value), until the object is seen
/// without the annotation: watch events from before its removal must not resend the control.
type Actions = HashMap<(String, String), (String, String)>;

/// Watches until the stream ends (it does not, normally) or `shutdown` completes.
pub async fn run(
    kube: kube::Client,
    engine: Client,
    config: WatcherConfig,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let twds = merged_stream::<TemporalWorkerDeployment>(&kube, &config.namespaces);
    let connections = merged_stream::<TemporalConnection>(&kube, &config.namespaces);
    tokio::pin!(shutdown);
    let mut twds = twds;
    let mut connections = connections;
    let mut sent: Sent = HashMap::new();
    let mut connection_generations: HashMap<(String, String), i64> = HashMap::new();
    let mut retry = tokio::time::interval(Duration::from_secs(5));
    let mut failed: Vec<TemporalWorkerDeployment> = Vec::new();
    let mut actions: Actions = HashMap::new();
    loop {
        tokio::select! {
            () = &mut shutdown => return,
            Some(event) = twds.next() => match event {
                Ok(twd) => {
                    let signalled = signal_twd(&engine, &config, &mut sent, &twd, false).await
                        && rollout_action(&kube, &engine, &mut actions, &twd).await;
                    if !signalled {
                        failed.push(twd);
                    }
                }
                Err(e) => tracing::warn!("watching TemporalWorkerDeployments: {e}"),
            },
            Some(event) = connections.next() => match event {
                Ok(connection) => {
                    // Only spec changes (and first sight) matter; status writes are ignored.
                    let key = (connection.metadata.namespace.clone().unwrap_or_default(), connection.metadata.name.clone().unwrap_or_default());
                    let generation = connection.metadata.generation.unwrap_or_default();
                    if connection_generations.insert(key, generation) != Some(generation) {
                        nudge_users(&kube, &engine, &config, &mut sent, &connection).await;
                    }
                }
                Err(e) => tracing::warn!("watching TemporalConnections: {e}"),
            },
            _ = retry.tick() => {
                for twd in std::mem::take(&mut failed) {
                    let signalled = signal_twd(&engine, &config, &mut sent, &twd, false).await
                        && rollout_action(&kube, &engine, &mut actions, &twd).await;
                    if !signalled {
                        failed.push(twd);
                    }
                }
            }
        }
    }
}

/// Applied objects of a kind across the watched namespaces, with the watcher's backoff.
fn merged_stream<K>(
    kube: &kube::Client,
    namespaces: &[String],
) -> futures::stream::BoxStream<'static, Result<K, watcher::Error>>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default,
{
    let apis: Vec<Api<K>> = if namespaces.is_empty() {
        vec![Api::all(kube.clone())]
    } else {
        namespaces
            .iter()
            .map(|ns| Api::namespaced(kube.clone(), ns))
            .collect()
    };
    let streams = apis.into_iter().map(|api| {
        watcher::watcher(api, watcher::Config::default())
            .default_backoff()
            .filter_map(|event| async move {
                match event {
                    Ok(Event::Apply(o) | Event::InitApply(o)) => Some(Ok(o)),
                    Ok(_) => None,
                    Err(e) => Some(Err(e)),
                }
            })
            .boxed()
    });
    futures::stream::select_all(streams).boxed()
}

/// Signals a TWD's workflow if its generation or deletion state is new (or `force`).
/// Returns false when the signal could not be delivered (retried later).
async fn signal_twd(
    engine: &Client,
    config: &WatcherConfig,
    sent: &mut Sent,
    twd: &TemporalWorkerDeployment,
    force: bool,
) -> bool {
    let (Some(namespace), Some(name)) = (twd.metadata.namespace.clone(), twd.metadata.name.clone())
    else {
        return true;
    };
    let uid = twd.metadata.uid.clone().unwrap_or_default();
    let generation = twd.metadata.generation.unwrap_or_default();
    let deleting = twd.metadata.deletion_timestamp.is_some();
    let key = (namespace.clone(), name.clone());
    if !force && sent.get(&key) == Some(&(uid.clone(), generation, deleting)) {
        return true;
    }
    let twd_ref = TwdRef { namespace, name };
    let signal = SpecSignal {
        generation,
        build_id: twc_crds::build_id::compute_build_id(&twd.spec).to_string(),
        deleting,
    };
    let input = TwdInput {
        twd: twd_ref.clone(),
        search_attributes: config.search_attributes,
        carried: None,
    };
    let options =
        WorkflowStartOptions::new(config.task_queue.clone(), twd_ref.twd_workflow_id()).build();
    match engine
        .signal_with_start_workflow(
            TwdWorkflow::run,
            input,
            TwdWorkflow::spec_changed,
            signal.clone(),
            options,
        )
        .await
    {
        Ok(_) => {
            tracing::info!(twd = %twd_ref.key(), generation, build_id = %signal.build_id, deleting, "signalled TWD workflow");
            sent.insert(key, (uid, generation, deleting));
            true
        }
        Err(e) => {
            tracing::warn!(twd = %twd_ref.key(), "signalling TWD workflow failed (will retry): {e}");
            false
        }
    }
}

/// A connection changed (created, fixed, rotated): nudge every TWD that references it.
async fn nudge_users(
    kube: &kube::Client,
    engine: &Client,
    config: &WatcherConfig,
    sent: &mut Sent,
    connection: &TemporalConnection,
) {
    let (Some(namespace), Some(name)) = (
        connection.metadata.namespace.as_deref(),
        connection.metadata.name.as_deref(),
    ) else {
        return;
    };
    let api: Api<TemporalWorkerDeployment> = Api::namespaced(kube.clone(), namespace);
    let list = match api.list(&Default::default()).await {
        Ok(list) => list,
        Err(e) => {
            tracing::warn!(%namespace, "listing TWDs after a connection change: {e}");
            return;
        }
    };
    for twd in list
        .items
        .iter()
        .filter(|t| t.spec.worker_options.connection_ref.name == name)
    {
        signal_twd(engine, config, sent, twd, true).await;
    }
}

/// Turns a `temporal.io/rollout-action` annotation into the `control` signal on the TWD's
/// workflow, then removes it. Returns false when it must be tried again later.
async fn rollout_action(
    kube: &kube::Client,
    engine: &Client,
    actions: &mut Actions,
    twd: &TemporalWorkerDeployment,
) -> bool {
    let (Some(namespace), Some(name)) = (twd.metadata.namespace.clone(), twd.metadata.name.clone())
    else {
        return true;
    };
    let key = (namespace.clone(), name.clone());
    let Some(value) = twd
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ROLLOUT_ACTION_ANNOTATION))
        .cloned()
    else {
        actions.remove(&key);
        return true;
    };
    let uid = twd.metadata.uid.clone().unwrap_or_default();
    let handled = (uid, value.clone());
    if actions.get(&key) == Some(&handled) {
        return true;
    }
    let twd_ref = TwdRef { namespace, name };
    match control::parse_action(&value) {
        Some(action) => {
            let sent = engine
                .get_workflow_handle::<TwdWorkflow>(twd_ref.twd_workflow_id())
                .signal(
                    TwdWorkflow::control,
                    action,
                    WorkflowSignalOptions::default(),
                )
                .await;
            match sent {
                Ok(()) => {
                    tracing::info!(twd = %twd_ref.key(), action = control::action_name(action), "rollout action annotation sent as a signal");
                }
                Err(WorkflowInteractionError::NotFound(_)) => {
                    let message = format!(
                        "{ROLLOUT_ACTION_ANNOTATION}={value} was not applied: the workflow {} does not run; the controller starts it for every TWD it watches",
                        twd_ref.twd_workflow_id()
                    );
                    warn_event(kube, &twd_ref, "RolloutActionFailed", &message).await;
                }
                Err(e) => {
                    tracing::warn!(twd = %twd_ref.key(), "sending the rollout action {value:?} failed (will retry): {e}");
                    return false;
                }
            }
        }
        None => {
            let message = format!(
                "{ROLLOUT_ACTION_ANNOTATION}={value:?} is not a rollout action; use one of pause, resume, promote, abort, retry. The annotation was removed."
            );
            warn_event(kube, &twd_ref, "InvalidRolloutAction", &message).await;
        }
    }
    let removed = remove_action_annotation(kube, &twd_ref, &value).await;
    if removed {
        actions.insert(key, handled);
    }
    removed
}

/// Removes the annotation if it still holds `value` (a JSON patch `test` keeps a newer value,
/// which arrives as its own watch event). False when it must be tried again.
async fn remove_action_annotation(kube: &kube::Client, twd: &TwdRef, value: &str) -> bool {
    let path = format!(
        "/metadata/annotations/{}",
        ROLLOUT_ACTION_ANNOTATION
            .replace('~', "~0")
            .replace('/', "~1")
    );
    let patch: json_patch::Patch = match serde_json::from_value(serde_json::json!([
        { "op": "test", "path": path, "value": value },
        { "op": "remove", "path": path },
    ])) {
        Ok(patch) => patch,
        Err(e) => {
            tracing::error!("building the annotation removal patch: {e}");
            return true;
        }
    };
    let api: Api<TemporalWorkerDeployment> = Api::namespaced(kube.clone(), &twd.namespace);
    match api
        .patch(
            &twd.name,
            &PatchParams::default(),
            &Patch::Json::<()>(patch),
        )
        .await
    {
        Ok(_) => true,
        // Gone, or the annotation changed or vanished meanwhile (the test failed).
        Err(kube::Error::Api(status)) if [404, 409, 422].contains(&status.code) => true,
        Err(e) => {
            tracing::warn!(twd = %twd.key(), "removing {ROLLOUT_ACTION_ANNOTATION} failed (will retry): {e}");
            false
        }
    }
}

async fn warn_event(kube: &kube::Client, twd: &TwdRef, reason: &str, message: &str) {
    if let Err(e) =
        twc_activities::k8s::emit_event(kube, twd, EventKind::Warning, reason, message).await
    {
        tracing::warn!(twd = %twd.key(), reason, "recording an event failed: {e}");
    }
}
