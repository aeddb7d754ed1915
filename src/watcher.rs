//! The light Kubernetes watcher: turns WorkerDeployment and WorkerObject changes into
//! signals on each TWD's workflow (signal-with-start), and Connection, TemporalConnection and
//! ClusterConnection changes into nudges of the TWDs that use them (ClusterConnections only when
//! every namespace is watched). It decides nothing; duplicate signals are harmless (the workflow
//! ignores generations it has seen and at most resyncs).
//!
//! Both kinds of one name share one workflow: the signal always carries the claim holder
//! ([`twc_crds::kinds::claim_holder`]), read from a cache of both watches; a change of the other
//! object (refused, or handing over) only nudges the workflow, whose turn settles it.
//!
//! It also carries the kubectl-only control path: a `temporal.io/rollout-action` annotation on a
//! TWD becomes the `control` signal on its workflow. Every replica sees the annotation, so each
//! first removes it with a conditional patch, and only the replica whose removal succeeds sends
//! the control: it is acted on exactly once however many replicas run (a bad value is answered
//! with a Warning event by that replica alone).
//!
//! Every replica's watcher sees every TWD, status included, so it sets the per-TWD gauges
//! (`twc_ramp_percentage`, `twc_versions`), and it reports when it has handled the initial list
//! of every watch (readiness).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use temporalio_client::errors::WorkflowUpdateError;
use temporalio_client::{Client, WorkflowExecuteUpdateOptions, WorkflowStartOptions};
use twc_activities::k8s::adoption;
use twc_activities::k8s::connection::cluster_connection_unsupported;
use twc_activities::k8s::twd::{split_claim, worker_api};
use twc_activities::metrics::Metrics;
use twc_crds::worker_deployment::ConnectionKind;
use twc_crds::{
    ClusterConnection, Connection, TemporalConnection, TemporalWorkerDeployment, WorkerDeployment,
    WorkerKind, WorkerObject,
};
use twc_workflows::contract::EventKind;
use twc_workflows::control::{self, ROLLOUT_ACTION_ANNOTATION};
use twc_workflows::model::{ControlAction, TwdRef};
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
    /// History events after which the engine's workflows continue as new.
    pub history_event_bound: u32,
    /// Seconds between a TWD workflow's level-triggered resyncs.
    pub resync_seconds: u32,
    /// Where signals and per-TWD gauges are recorded.
    pub metrics: Arc<Metrics>,
    /// Where spec signals are recorded as spans, if tracing is on.
    pub traces: Option<twc_worker::traces::Traces>,
}

/// Most signals in flight at once.
const MAX_SIGNALS_IN_FLIGHT: usize = 64;

/// Last signal sent per TWD, to skip status-only updates.
type Sent = HashMap<(String, String), (String, i64, bool)>;

/// Rollout-action annotation values handled per TWD (uid, value), until the object is seen
/// without the annotation: watch events from before its removal must not act on it again.
type Actions = HashMap<(String, String), (String, String)>;

/// What the watcher remembers about the TWDs it signals.
#[derive(Default)]
struct TwdSignals {
    /// Last spec signal per TWD.
    sent: Sent,
    /// Rollout-action annotations already handled.
    actions: Actions,
    /// Controls this replica took from an annotation and could not send yet (retried).
    unsent: Vec<TakenControl>,
}

/// A control this replica took from a TWD's annotation (it removed the annotation, so no other
/// replica sends it): it must be sent.
#[derive(Debug, Clone)]
struct TakenControl {
    twd: TwdRef,
    action: ControlAction,
}

/// Watches until the stream ends (it does not, normally) or `shutdown` completes. `synced` is
/// called once, when the initial list of every watch has been handled.
pub async fn run(
    kube: kube::Client,
    engine: Client,
    config: WatcherConfig,
    synced: impl FnOnce(),
    shutdown: impl std::future::Future<Output = ()>,
) {
    let old = merged_stream::<TemporalWorkerDeployment>(&kube, &config.namespaces)
        .map(|e| e.map(|w| w.map(WorkerObject::from)));
    let new = merged_stream::<WorkerDeployment>(&kube, &config.namespaces)
        .map(|e| e.map(|w| w.map(WorkerObject::from)));
    let mut twds = futures::stream::select(
        old.map(|e| (WorkerKind::TemporalWorkerDeployment, e)),
        new.map(|e| (WorkerKind::WorkerDeployment, e)),
    );
    // Each kind's stream tagged with its kind: the first list of each counts on its own.
    let old_connections = merged_stream::<TemporalConnection>(&kube, &config.namespaces).map(|e| {
        let kind = ConnectionKind::TemporalConnection;
        (kind, e.map(|w| w.map(|c| (kind, c))))
    });
    let new_connections = merged_stream::<Connection>(&kube, &config.namespaces).map(|e| {
        let kind = ConnectionKind::Connection;
        (
            kind,
            e.map(|w| w.map(|c| (kind, TemporalConnection::from(c)))),
        )
    });
    let mut connections = futures::stream::select(old_connections, new_connections);
    let mut cluster_connections = cluster_connection_stream(&kube, &config.namespaces);
    let mut cluster_generations: HashMap<String, (i64, bool)> = HashMap::new();
    tokio::pin!(shutdown);
    let mut state = TwdSignals::default();
    let mut connection_generations: HashMap<(ConnectionKind, String, String), i64> = HashMap::new();
    let mut retry = tokio::time::interval(Duration::from_secs(5));
    // TWDs whose signal failed (Temporal unreachable, say), retried every 5 s with their force
    // (with the claim holder of their name at that time).
    let mut failed: HashMap<(String, String), bool> = HashMap::new();
    let watches = config.namespaces.len().max(1);
    let mut sync = InitialSync::new(watches, synced);
    let mut workers = Workers::default();
    let mut signals = Signals::new(kube.clone());
    // The TWD workflows already running: a TWD of the first list whose workflow runs and has
    // written the status of its generation is not signalled again (a restarted replica wakes
    // nothing); one listed later, or changed, is.
    let mut running = running_twd_workflows(&engine).await;
    loop {
        tokio::select! {
            () = &mut shutdown => return,
            Some((kind, event)) = twds.next() => match event {
                Ok(Watched::Applied(watch, object)) => {
                    let key = Workers::key(&object);
                    let nudge = workers.applied(&config.metrics, watch, object);
                    if let Some(holder) = workers.holder(&key) {
                        if !nudge && running.remove(&workflow_id_of(holder)) && signalled_before(holder) {
                            state.sent.insert(key, sent_key(holder));
                            continue;
                        }
                        signals.submit(&engine, &config, &state.sent, holder.clone(), nudge);
                    }
                }
                Ok(Watched::Deleted(watch, object)) => {
                    let key = Workers::key(&object);
                    workers.deleted(&config.metrics, watch, &object);
                    // The other kind of the name, if any, holds the claim now.
                    if let Some(holder) = workers.holder(&key) {
                        signals.submit(&engine, &config, &state.sent, holder.clone(), true);
                    }
                }
                Ok(Watched::Listing(watch)) => workers.listing(kind, watch),
                Ok(Watched::Listed(watch)) => {
                    workers.listed(&config.metrics, kind, watch);
                    sync.listed(Kind::Twd(kind), watch);
                    if sync.done() {
                        // Only the first list is taken from it; the set goes.
                        running = HashSet::new();
                    }
                }
                Err(e) => tracing::warn!("watching {kind}s: {e}"),
            },
            Some((twd, force, fresh, outcome)) = signals.in_flight.next(), if !signals.in_flight.is_empty() => {
                if !after_signal(&kube, &engine, &config, &mut state, &twd, fresh, outcome).await {
                    let key = Workers::key(&twd);
                    let forced = failed.get(&key).copied().unwrap_or_default();
                    failed.insert(key, force || forced);
                }
                signals.done(&engine, &config, &state.sent, &twd);
            }
            Some((connection_kind, event)) = connections.next() => match event {
                Ok(Watched::Listed(watch)) => sync.listed(Kind::Connection(connection_kind), watch),
                Ok(Watched::Listing(_)) => {}
                Ok(Watched::Deleted(_, (kind, connection))) => {
                    connection_generations.remove(&connection_key(kind, &connection));
                }
                Ok(Watched::Applied(_, (kind, connection))) => {
                    // Only spec changes (and first sight after the first list: the workflows of
                    // a restarted replica's TWDs have seen their connections) matter; status
                    // writes are ignored.
                    let generation = connection.metadata.generation.unwrap_or_default();
                    let before = connection_generations.insert(connection_key(kind, &connection), generation);
                    if before != Some(generation) && (before.is_some() || sync.done()) {
                        for twd in workers.users_of(kind, &connection) {
                            signals.submit(&engine, &config, &state.sent, twd, true);
                        }
                    }
                }
                Err(e) => tracing::warn!("watching connections: {e}"),
            },
            Some(event) = cluster_connections.next() => match event {
                Ok(Watched::Applied(_, connection)) => {
                    // Spec changes, first sight and deletion (which the users' turns release).
                    let name = connection.metadata.name.clone().unwrap_or_default();
                    let seen = (
                        connection.metadata.generation.unwrap_or_default(),
                        connection.metadata.deletion_timestamp.is_some(),
                    );
                    let before = cluster_generations.insert(name.clone(), seen);
                    if before != Some(seen) && (before.is_some() || sync.done()) {
                        for twd in workers.users_of_cluster_connection(&name) {
                            signals.submit(&engine, &config, &state.sent, twd, true);
                        }
                    }
                }
                Ok(Watched::Deleted(_, connection)) => {
                    cluster_generations.remove(&connection.metadata.name.clone().unwrap_or_default());
                }
                Ok(Watched::Listing(_) | Watched::Listed(_)) => {}
                Err(e) => tracing::warn!("watching ClusterConnections: {e}"),
            },
            _ = retry.tick() => {
                for (key, force) in std::mem::take(&mut failed) {
                    if let Some(holder) = workers.holder(&key) {
                        signals.submit(&engine, &config, &state.sent, holder.clone(), force);
                    }
                }
                for control in std::mem::take(&mut state.unsent) {
                    if !send_control(&kube, &engine, &config, &control).await {
                        state.unsent.push(control);
                    }
                }
            }
        }
    }
}

/// IDs of the TWD workflows running now, read once when the watcher starts (empty if Temporal
/// cannot list them: every TWD is signalled then, as it would be anyway).
async fn running_twd_workflows(engine: &Client) -> HashSet<String> {
    let options = temporalio_client::WorkflowListOptions::builder().build();
    let mut stream =
        engine.list_workflows("WorkflowType='twd' AND ExecutionStatus='Running'", options);
    let mut running = HashSet::new();
    while let Some(execution) = stream.next().await {
        match execution {
            Ok(execution) => {
                running.insert(execution.id().to_owned());
            }
            Err(e) => {
                tracing::warn!(
                    "listing the running TWD workflows failed; every TWD is signalled: {e}"
                );
                return HashSet::new();
            }
        }
    }
    tracing::info!(
        running = running.len(),
        "TWD workflows running at the start"
    );
    running
}

/// Whether the TWD's workflow has already handled its current generation: the status it wrote
/// says so (and the object is not being deleted and carries no rollout action, which are
/// always handled).
fn signalled_before(twd: &WorkerObject) -> bool {
    let status = twd.status.as_ref();
    let action = twd
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(ROLLOUT_ACTION_ANNOTATION));
    !twd.deleting()
        && !action
        && status.is_some_and(|s| s.rollout.is_some())
        && status.and_then(|s| s.observed_generation) == twd.metadata.generation
}

/// The ID of the TWD's workflow.
fn workflow_id_of(twd: &WorkerObject) -> String {
    TwdRef {
        namespace: twd.metadata.namespace.clone().unwrap_or_default(),
        name: twd.metadata.name.clone().unwrap_or_default(),
    }
    .twd_workflow_id()
}

/// What [`Sent`] remembers of a TWD signalled (or found signalled).
fn sent_key(twd: &WorkerObject) -> (String, i64, bool) {
    (
        twd.metadata.uid.clone().unwrap_or_default(),
        twd.metadata.generation.unwrap_or_default(),
        twd.metadata.deletion_timestamp.is_some(),
    )
}

/// Key of a connection's last seen generation.
fn connection_key(
    kind: ConnectionKind,
    connection: &TemporalConnection,
) -> (ConnectionKind, String, String) {
    (
        kind,
        connection.metadata.namespace.clone().unwrap_or_default(),
        connection.metadata.name.clone().unwrap_or_default(),
    )
}

/// What a watch reports, tagged with the index of the watch (one per watched namespace, or one
/// for all).
#[derive(Debug)]
enum Watched<K> {
    /// Created or changed (or listed).
    Applied(usize, K),
    /// Deleted.
    Deleted(usize, K),
    /// A (re-)list began: what it does not list again is gone.
    Listing(usize),
    /// A (re-)list ended: every object of the watch was reported since `Listing`.
    Listed(usize),
}

impl<K> Watched<K> {
    /// The same report about an object of another type.
    fn map<T>(self, f: impl FnOnce(K) -> T) -> Watched<T> {
        match self {
            Self::Applied(watch, object) => Watched::Applied(watch, f(object)),
            Self::Deleted(watch, object) => Watched::Deleted(watch, f(object)),
            Self::Listing(watch) => Watched::Listing(watch),
            Self::Listed(watch) => Watched::Listed(watch),
        }
    }
}

/// Which stream a watch belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Twd(WorkerKind),
    Connection(ConnectionKind),
}

/// Calls `synced` once every watch of both worker kinds and of connections has finished its
/// first list.
struct InitialSync<F> {
    watches: usize,
    listed: HashSet<(Kind, usize)>,
    synced: Option<F>,
}

impl<F: FnOnce()> InitialSync<F> {
    fn new(watches: usize, synced: F) -> Self {
        Self {
            watches,
            listed: HashSet::new(),
            synced: Some(synced),
        }
    }

    /// Whether every watch has finished its first list.
    fn done(&self) -> bool {
        self.synced.is_none()
    }

    fn listed(&mut self, kind: Kind, watch: usize) {
        self.listed.insert((kind, watch));
        // Both worker kinds and both namespaced connection kinds.
        let kinds = WorkerKind::ALL.len() + 2;
        if self.listed.len() >= kinds * self.watches
            && let Some(synced) = self.synced.take()
        {
            tracing::info!(
                watches = self.watches,
                "initial lists of worker deployments and connections handled"
            );
            synced();
        }
    }
}

/// The worker deployment objects the watches reported, both kinds, by name: the claim holder of
/// each name comes from here, and so do the per-TWD gauges (of the holder). A re-list drops the
/// objects it no longer shows (deleted while the watch was down, which no Deleted event reports).
#[derive(Default)]
struct Workers {
    objects: HashMap<(String, String), Vec<WorkerObject>>,
    /// Names each (kind, watch) reported, to find what a re-list missed.
    known: HashMap<(WorkerKind, usize), HashSet<(String, String)>>,
    relisted: HashMap<(WorkerKind, usize), HashSet<(String, String)>>,
    /// The last (uid, generation, deleting) of each object that is not its name's holder, to
    /// nudge the workflow once per change of it (a status write of a refused object is none).
    others: HashMap<(String, String, WorkerKind), (String, i64, bool)>,
}

impl Workers {
    fn key(twd: &WorkerObject) -> (String, String) {
        (
            twd.metadata.namespace.clone().unwrap_or_default(),
            twd.metadata.name.clone().unwrap_or_default(),
        )
    }

    /// The claim holder of a name.
    fn holder(&self, key: &(String, String)) -> Option<&WorkerObject> {
        let objects = self.objects.get(key)?;
        let holder = split_claim(objects.clone())?.holder;
        objects
            .iter()
            .find(|o| o.kind == holder.kind && o.object_uid() == holder.object_uid())
    }

    /// Records `twd`; returns whether its name's workflow must be nudged although its holder's
    /// spec may be unchanged (`twd` is not the holder and changed).
    fn applied(&mut self, metrics: &Metrics, watch: usize, twd: WorkerObject) -> bool {
        let key = Self::key(&twd);
        let kind = twd.kind;
        let seen = (
            twd.object_uid().to_owned(),
            twd.metadata.generation.unwrap_or_default(),
            twd.deleting(),
        );
        if let Some(relisted) = self.relisted.get_mut(&(kind, watch)) {
            relisted.insert(key.clone());
        }
        self.known
            .entry((kind, watch))
            .or_default()
            .insert(key.clone());
        let objects = self.objects.entry(key.clone()).or_default();
        objects.retain(|o| o.kind != kind);
        objects.push(twd);
        let holder = self.holder(&key).map(|h| h.kind);
        if let Some(holder) = self.holder(&key) {
            metrics.twd_status(&key.0, &key.1, holder.status.as_ref());
        }
        let other = (key.0, key.1, kind);
        if holder == Some(kind) {
            self.others.remove(&other);
            return false;
        }
        self.others.insert(other, seen.clone()) != Some(seen)
    }

    fn deleted(&mut self, metrics: &Metrics, watch: usize, twd: &WorkerObject) {
        let key = Self::key(twd);
        self.forget(metrics, &key, twd.kind);
        if let Some(known) = self.known.get_mut(&(twd.kind, watch)) {
            known.remove(&key);
        }
    }

    /// Drops the object of `kind` named `key`, and the gauges when no object of the name is left.
    fn forget(&mut self, metrics: &Metrics, key: &(String, String), kind: WorkerKind) {
        self.others.remove(&(key.0.clone(), key.1.clone(), kind));
        let Some(objects) = self.objects.get_mut(key) else {
            return;
        };
        objects.retain(|o| o.kind != kind);
        if objects.is_empty() {
            self.objects.remove(key);
            metrics.forget_twd(&key.0, &key.1);
        } else if let Some(holder) = self.holder(key) {
            metrics.twd_status(&key.0, &key.1, holder.status.as_ref());
        }
    }

    fn listing(&mut self, kind: WorkerKind, watch: usize) {
        self.relisted.insert((kind, watch), HashSet::new());
    }

    fn listed(&mut self, metrics: &Metrics, kind: WorkerKind, watch: usize) {
        let Some(relisted) = self.relisted.remove(&(kind, watch)) else {
            return;
        };
        let known = self.known.remove(&(kind, watch)).unwrap_or_default();
        for key in known.difference(&relisted) {
            self.forget(metrics, key, kind);
        }
        self.known.insert((kind, watch), relisted);
    }

    /// The claim holders whose `connectionRef` names the connection of `kind` (namespaced).
    fn users_of(&self, kind: ConnectionKind, connection: &TemporalConnection) -> Vec<WorkerObject> {
        let namespace = connection.metadata.namespace.as_deref().unwrap_or_default();
        let name = connection.metadata.name.as_deref().unwrap_or_default();
        self.holders()
            .filter(|t| t.metadata.namespace.as_deref() == Some(namespace))
            .filter(|t| {
                let reference = &t.spec.worker_options.connection_ref;
                reference.kind == kind && reference.name == name
            })
            .collect()
    }

    /// The claim holders of any namespace whose `connectionRef` names the ClusterConnection
    /// `name`.
    fn users_of_cluster_connection(&self, name: &str) -> Vec<WorkerObject> {
        self.holders()
            .filter(|t| {
                let reference = &t.spec.worker_options.connection_ref;
                reference.kind == ConnectionKind::ClusterConnection && reference.name == name
            })
            .collect()
    }

    fn holders(&self) -> impl Iterator<Item = WorkerObject> + '_ {
        self.objects
            .keys()
            .filter_map(|key| self.holder(key).cloned())
    }
}

/// Objects of a kind across the watched namespaces, with the watcher's backoff.
fn merged_stream<K>(
    kube: &kube::Client,
    namespaces: &[String],
) -> futures::stream::BoxStream<'static, Result<Watched<K>, watcher::Error>>
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
    let streams = apis.into_iter().enumerate().map(|(watch, api)| {
        watcher::watcher(api, watcher::Config::default())
            .default_backoff()
            .map(move |event| {
                event.map(|event| match event {
                    Event::Apply(o) | Event::InitApply(o) => Watched::Applied(watch, o),
                    Event::Delete(o) => Watched::Deleted(watch, o),
                    Event::Init => Watched::Listing(watch),
                    Event::InitDone => Watched::Listed(watch),
                })
            })
            .boxed()
    });
    futures::stream::select_all(streams).boxed()
}

/// ClusterConnections, watched when every namespace is (a controller restricted to namespaces
/// may not read them: never ready). Not part of readiness: a ClusterConnection CRD installed
/// after the controller is picked up by the watch's retries.
fn cluster_connection_stream(
    kube: &kube::Client,
    namespaces: &[String],
) -> futures::stream::BoxStream<'static, Result<Watched<ClusterConnection>, watcher::Error>> {
    if !namespaces.is_empty() {
        return futures::stream::pending().boxed();
    }
    let api: Api<ClusterConnection> = Api::all(kube.clone());
    watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .map(|event| {
            event.map(|event| match event {
                Event::Apply(o) | Event::InitApply(o) => Watched::Applied(0, o),
                Event::Delete(o) => Watched::Deleted(0, o),
                Event::Init => Watched::Listing(0),
                Event::InitDone => Watched::Listed(0),
            })
        })
        .boxed()
}

/// What signalling one TWD came to.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Signalled {
    /// Nothing new to signal (or not a namespaced object).
    Unchanged,
    /// Delivered: remember it under this key.
    Sent((String, String), (String, i64, bool)),
    /// Not delivered (retried later).
    Failed,
}

/// Signals a TWD's workflow if its generation or deletion state is new (or `force`).
async fn signal_twd(
    kube: &kube::Client,
    engine: &Client,
    config: &WatcherConfig,
    sent: &Sent,
    twd: &WorkerObject,
    force: bool,
) -> Signalled {
    let (Some(namespace), Some(name)) = (twd.metadata.namespace.clone(), twd.metadata.name.clone())
    else {
        return Signalled::Unchanged;
    };
    let uid = twd.metadata.uid.clone().unwrap_or_default();
    let generation = twd.metadata.generation.unwrap_or_default();
    let deleting = twd.metadata.deletion_timestamp.is_some();
    let key = (namespace.clone(), name.clone());
    if !force && sent.get(&key) == Some(&(uid.clone(), generation, deleting)) {
        return Signalled::Unchanged;
    }
    let twd_ref = TwdRef { namespace, name };
    // First sight of a worker deployment another controller managed: take over the build of a
    // live Deployment running its template, so that nothing is rolled out again.
    let mut adopted = None;
    if adoption::may_adopt(twd) {
        match adoption::find_adoptable_build(kube, twd).await {
            Ok(None) => {}
            Ok(Some(build)) => match adoption::record_adoption(kube, twd, &build).await {
                Ok(()) => adopted = Some(build),
                Err(e) => {
                    tracing::warn!(twd = %twd_ref.key(), "recording an adopted build failed (will retry): {e}");
                    return Signalled::Failed;
                }
            },
            Err(e) => {
                tracing::warn!(twd = %twd_ref.key(), "looking for a build to take over failed (will retry): {e}");
                return Signalled::Failed;
            }
        }
    }
    let build_id = match adopted {
        Some(adopted) => adopted.build_id,
        None => twc_crds::build_id::target_build_id(twd).to_string(),
    };
    let signal = SpecSignal {
        generation,
        build_id,
        deleting,
        uid: Some(uid.clone()),
        nudge: force,
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
    match result {
        Ok(_) => {
            let elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
            tracing::info!(twd = %twd_ref.key(), generation, build_id = %signal.build_id, deleting, elapsed_ms, "signalled TWD workflow");
            config.metrics.watcher_signal("spec_changed", true);
            config
                .metrics
                .temporal_request("SignalWithStartWorkflowExecution", "success");
            Signalled::Sent(key, (uid, generation, deleting))
        }
        Err(e) => {
            tracing::warn!(twd = %twd_ref.key(), "signalling TWD workflow failed (will retry): {e}");
            config.metrics.watcher_signal("spec_changed", false);
            config
                .metrics
                .temporal_request("SignalWithStartWorkflowExecution", "error");
            Signalled::Failed
        }
    }
}

/// What follows a TWD's signal: remembering it, the `ClusterConnectionUnsupported` warning on
/// a generation seen first, and its rollout-action annotation. False when the TWD must be
/// handled again later (a control taken from the annotation is retried on its own).
async fn after_signal(
    kube: &kube::Client,
    engine: &Client,
    config: &WatcherConfig,
    state: &mut TwdSignals,
    twd: &WorkerObject,
    fresh: bool,
    outcome: Signalled,
) -> bool {
    match outcome {
        Signalled::Failed => return false,
        Signalled::Sent(key, seen) => {
            state.sent.insert(key, seen);
        }
        Signalled::Unchanged => {}
    }
    if fresh {
        warn_unsupported_connection(kube, config, twd).await;
    }
    match take_rollout_action(kube, &mut state.actions, twd).await {
        Taken::Nothing => true,
        Taken::Retry => false,
        Taken::Control(control) => {
            if !send_control(kube, engine, config, &control).await {
                state.unsent.push(control);
            }
            true
        }
    }
}

/// A TWD's signal in flight: the object, whether it was forced, whether its generation was new,
/// and the outcome.
type SignalInFlight = futures::future::BoxFuture<'static, (WorkerObject, bool, bool, Signalled)>;

/// TWD signals sent concurrently, so a burst of changes (or the users of a changed connection)
/// is not signalled one after another and never holds up the watch: at most
/// [`MAX_SIGNALS_IN_FLIGHT`] at once, one per TWD at a time (a newer object of a TWD whose
/// signal is in flight waits, and replaces any older one waiting, forced if either was), the
/// rest in arrival order. A forced signal (a nudge after a connection change) is sent even when
/// the TWD's generation was.
struct Signals {
    /// The Kubernetes client (a first signal may take a build over: [`signal_twd`]).
    kube: kube::Client,
    in_flight: futures::stream::FuturesUnordered<SignalInFlight>,
    /// TWDs with a signal in flight.
    busy: HashSet<(String, String)>,
    /// The latest object of each busy TWD that changed again meanwhile, and whether it is forced.
    queued: HashMap<(String, String), (WorkerObject, bool)>,
    /// TWDs waiting for room, oldest first, and whether each is forced.
    backlog: std::collections::VecDeque<(WorkerObject, bool)>,
}

impl Signals {
    fn new(kube: kube::Client) -> Self {
        Self {
            kube,
            in_flight: Default::default(),
            busy: Default::default(),
            queued: Default::default(),
            backlog: Default::default(),
        }
    }

    fn key(twd: &WorkerObject) -> (String, String) {
        (
            twd.metadata.namespace.clone().unwrap_or_default(),
            twd.metadata.name.clone().unwrap_or_default(),
        )
    }

    /// Signals `twd` now, or as soon as its TWD's signal in flight and the room allow.
    fn submit(
        &mut self,
        engine: &Client,
        config: &WatcherConfig,
        sent: &Sent,
        twd: WorkerObject,
        force: bool,
    ) {
        let key = Self::key(&twd);
        if self.busy.contains(&key) {
            let forced = self.queued.get(&key).is_some_and(|(_, f)| *f);
            self.queued.insert(key, (twd, force || forced));
        } else if self.in_flight.len() >= MAX_SIGNALS_IN_FLIGHT {
            self.backlog.push_back((twd, force));
        } else {
            self.start(engine, config, sent, twd, force);
        }
    }

    fn start(
        &mut self,
        engine: &Client,
        config: &WatcherConfig,
        sent: &Sent,
        twd: WorkerObject,
        force: bool,
    ) {
        let key = Self::key(&twd);
        let fresh = is_fresh(sent, &twd);
        let known: Sent = sent
            .get(&key)
            .map(|seen| (key.clone(), seen.clone()))
            .into_iter()
            .collect();
        let (engine, config, kube) = (engine.clone(), config.clone(), self.kube.clone());
        self.busy.insert(key);
        self.in_flight.push(Box::pin(async move {
            let outcome = signal_twd(&kube, &engine, &config, &known, &twd, force).await;
            (twd, force, fresh, outcome)
        }));
    }

    /// `twd`'s signal ended: its waiting successor, else the oldest in the backlog, goes next.
    fn done(&mut self, engine: &Client, config: &WatcherConfig, sent: &Sent, twd: &WorkerObject) {
        let key = Self::key(twd);
        self.busy.remove(&key);
        if let Some((next, force)) = self.queued.remove(&key) {
            self.start(engine, config, sent, next, force);
            return;
        }
        while self.in_flight.len() < MAX_SIGNALS_IN_FLIGHT
            && let Some((next, force)) = self.backlog.pop_front()
        {
            self.submit(engine, config, sent, next, force);
        }
    }
}

/// Whether the TWD's generation or deletion state has not been signalled yet.
fn is_fresh(sent: &Sent, twd: &WorkerObject) -> bool {
    let key = (
        twd.metadata.namespace.clone().unwrap_or_default(),
        twd.metadata.name.clone().unwrap_or_default(),
    );
    let seen = (
        twd.metadata.uid.clone().unwrap_or_default(),
        twd.metadata.generation.unwrap_or_default(),
        twd.metadata.deletion_timestamp.is_some(),
    );
    sent.get(&key) != Some(&seen)
}

/// A Warning event `ClusterConnectionUnsupported` on a TWD that references a ClusterConnection
/// while this controller is restricted to namespaces (its workflow shows the same reason in the
/// conditions); once per generation seen by this replica.
async fn warn_unsupported_connection(
    kube: &kube::Client,
    config: &WatcherConfig,
    twd: &WorkerObject,
) {
    let reference = &twd.spec.worker_options.connection_ref;
    let (Some(namespace), Some(name)) = (&twd.metadata.namespace, &twd.metadata.name) else {
        return;
    };
    if config.namespaces.is_empty()
        || reference.kind != ConnectionKind::ClusterConnection
        || twd.metadata.deletion_timestamp.is_some()
    {
        return;
    }
    let message = cluster_connection_unsupported(namespace, &reference.name);
    let twd_ref = TwdRef {
        namespace: namespace.clone(),
        name: name.clone(),
    };
    warn_event(kube, &twd_ref, "ClusterConnectionUnsupported", &message).await;
}

/// What this replica does about a TWD's rollout-action annotation.
#[derive(Debug)]
enum Taken {
    /// Nothing (no annotation, already handled, another replica took it, or a bad value this
    /// replica removed and answered).
    Nothing,
    /// This replica removed the annotation: it sends the control.
    Control(TakenControl),
    /// The removal failed for a reason that may pass: try again later.
    Retry,
}

/// Takes a `temporal.io/rollout-action` annotation: removes it with a patch that tests its
/// value first, and only when that removal succeeds returns the control to send (or, for a bad
/// value, answers it with a Warning event). With several replicas only one removal succeeds, so
/// the control is sent once.
async fn take_rollout_action(
    kube: &kube::Client,
    actions: &mut Actions,
    twd: &WorkerObject,
) -> Taken {
    let (Some(namespace), Some(name)) = (twd.metadata.namespace.clone(), twd.metadata.name.clone())
    else {
        return Taken::Nothing;
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
        return Taken::Nothing;
    };
    let uid = twd.metadata.uid.clone().unwrap_or_default();
    let handled = (uid, value.clone());
    if actions.get(&key) == Some(&handled) {
        return Taken::Nothing;
    }
    let twd_ref = TwdRef { namespace, name };
    let removal = remove_action_annotation(kube, &twd_ref, twd.kind, &value).await;
    if removal == Removal::Retry {
        return Taken::Retry;
    }
    actions.insert(key, handled);
    if removal == Removal::NotOurs {
        tracing::debug!(twd = %twd_ref.key(), %value, "rollout action annotation taken by another replica (or changed)");
        return Taken::Nothing;
    }
    match control::parse_action(&value) {
        Some(action) => Taken::Control(TakenControl {
            twd: twd_ref,
            action,
        }),
        None => {
            let message = format!(
                "{ROLLOUT_ACTION_ANNOTATION}={value:?} is not a rollout action; use one of pause, resume, promote, abort, retry. The annotation was removed."
            );
            warn_event(kube, &twd_ref, "InvalidRolloutAction", &message).await;
            Taken::Nothing
        }
    }
}

/// Sends a control taken from an annotation as the `control` update of the TWD's workflow (the
/// one entry point of controls). A refused control is answered with a `ControlIgnored` event
/// giving the reason, as a control that changes nothing is. False when it failed for a reason
/// that may pass (sent again later).
async fn send_control(
    kube: &kube::Client,
    engine: &Client,
    config: &WatcherConfig,
    control: &TakenControl,
) -> bool {
    let TakenControl { twd, action } = control;
    let name = control::action_name(*action);
    let handle = engine.get_workflow_handle::<TwdWorkflow>(twd.twd_workflow_id());
    let sent = handle
        .execute_update(
            TwdWorkflow::control_update,
            *action,
            WorkflowExecuteUpdateOptions::default(),
        )
        .await;
    let outcome = match &sent {
        Ok(_) => "success",
        Err(WorkflowUpdateError::Failed(_)) => "rejected",
        Err(WorkflowUpdateError::NotFound(_)) => "not_found",
        Err(_) => "error",
    };
    config.metrics.watcher_signal(
        "control",
        matches!(sent, Ok(_) | Err(WorkflowUpdateError::Failed(_))),
    );
    config
        .metrics
        .temporal_request("UpdateWorkflowExecution", outcome);
    match sent {
        Ok(answer) => {
            tracing::info!(twd = %twd.key(), action = name, %answer, "rollout action annotation accepted");
            true
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
            true
        }
        Err(WorkflowUpdateError::NotFound(_)) => {
            let message = format!(
                "{ROLLOUT_ACTION_ANNOTATION}={name} was not applied: the workflow {} does not run; the controller starts it for every TWD it watches",
                twd.twd_workflow_id()
            );
            warn_event(kube, twd, "RolloutActionFailed", &message).await;
            true
        }
        Err(e) => {
            tracing::warn!(twd = %twd.key(), action = name, "sending the rollout action failed (will retry): {e}");
            false
        }
    }
}

/// How removing the rollout-action annotation went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Removal {
    /// This replica removed the value it saw.
    Removed,
    /// The value is gone or changed (another replica took it, or a person changed it; a newer
    /// value arrives as its own watch event), or the TWD is gone.
    NotOurs,
    /// Failed for a reason that may pass.
    Retry,
}

impl Removal {
    /// Classifies the answer to the removal patch.
    fn of<T>(answer: &Result<T, kube::Error>) -> Self {
        match answer {
            Ok(_) => Self::Removed,
            // 422: the `test` operation failed (the value changed or vanished); 404: the TWD is
            // gone; 409: a conflicting write.
            Err(kube::Error::Api(status)) if [404, 409, 422].contains(&status.code) => {
                Self::NotOurs
            }
            Err(_) => Self::Retry,
        }
    }
}

/// Removes the annotation if it still holds `value` (a JSON patch `test` first, so a newer
/// value, or one another replica already removed, is left alone).
async fn remove_action_annotation(
    kube: &kube::Client,
    twd: &TwdRef,
    kind: WorkerKind,
    value: &str,
) -> Removal {
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
            return Removal::NotOurs;
        }
    };
    let api = worker_api(kube, &twd.namespace, kind);
    let answer = api
        .patch(
            &twd.name,
            &PatchParams::default(),
            &Patch::Json::<()>(patch),
        )
        .await;
    let removal = Removal::of(&answer);
    if let (Removal::Retry, Err(e)) = (removal, &answer) {
        tracing::warn!(twd = %twd.key(), "removing {ROLLOUT_ACTION_ANNOTATION} failed (will retry): {e}");
    }
    removal
}

async fn warn_event(kube: &kube::Client, twd: &TwdRef, reason: &str, message: &str) {
    event(kube, twd, EventKind::Warning, reason, message).await;
}

async fn event(kube: &kube::Client, twd: &TwdRef, kind: EventKind, reason: &str, message: &str) {
    if let Err(e) = twc_activities::k8s::emit_event(kube, twd, kind, (reason, message), None).await
    {
        tracing::warn!(twd = %twd.key(), reason, "recording an event failed: {e}");
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use kube::api::ObjectMeta;

    use super::*;

    fn twd(namespace: &str, name: &str) -> WorkerObject {
        object(
            WorkerKind::TemporalWorkerDeployment,
            namespace,
            name,
            0,
            false,
        )
    }

    /// An object of `kind` created at `created` seconds, being deleted or not.
    fn object(
        kind: WorkerKind,
        namespace: &str,
        name: &str,
        created: i64,
        deleting: bool,
    ) -> WorkerObject {
        let time = |s: i64| {
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::from_second(s).unwrap_or_default(),
            )
        };
        WorkerObject {
            kind,
            object: TemporalWorkerDeployment {
                metadata: ObjectMeta {
                    namespace: Some(namespace.to_owned()),
                    name: Some(name.to_owned()),
                    uid: Some(format!("{kind}-{name}")),
                    creation_timestamp: Some(time(created)),
                    deletion_timestamp: deleting.then(|| time(created + 1)),
                    ..Default::default()
                },
                spec: twc_crds::worker_deployment::test_support::spec_with_image("w:v1"),
                status: None,
            },
        }
    }

    #[test]
    fn the_holder_of_a_name_is_signalled_and_a_change_of_the_other_only_nudges() {
        use WorkerKind::{TemporalWorkerDeployment as Twd, WorkerDeployment as Wd};
        let metrics = Metrics::new();
        let mut workers = Workers::default();
        let key = ("demo".to_owned(), "hello".to_owned());
        let holder = |w: &Workers| w.holder(&key).map(|h| h.kind);
        assert!(!workers.applied(&metrics, 0, object(Twd, "demo", "hello", 10, false)));
        assert_eq!(holder(&workers), Some(Twd));
        // A later WorkerDeployment of the name is refused: the holder stays; nudged once.
        assert!(workers.applied(&metrics, 0, object(Wd, "demo", "hello", 20, false)));
        assert!(!workers.applied(&metrics, 0, object(Wd, "demo", "hello", 20, false)));
        assert_eq!(holder(&workers), Some(Twd));
        // Deleting the TemporalWorkerDeployment hands the claim to the WorkerDeployment.
        assert!(workers.applied(&metrics, 0, object(Twd, "demo", "hello", 10, true)));
        assert_eq!(holder(&workers), Some(Wd));
        workers.deleted(&metrics, 0, &object(Twd, "demo", "hello", 10, true));
        assert_eq!(holder(&workers), Some(Wd));
        // A re-list that misses it drops the last one.
        workers.listing(Wd, 0);
        workers.listed(&metrics, Wd, 0);
        assert_eq!(holder(&workers), None);
    }

    /// The `twc_versions` sample lines, sorted (a family's series render in no set order).
    fn series(metrics: &Metrics) -> Vec<String> {
        let mut series: Vec<String> = metrics
            .render()
            .lines()
            .filter(|l| l.starts_with("twc_versions{"))
            .map(str::to_owned)
            .collect();
        series.sort();
        series
    }

    #[test]
    fn only_the_replica_whose_removal_succeeds_takes_the_annotation() {
        let api = |code: u16| -> Result<(), kube::Error> {
            Err(kube::Error::Api(
                kube::core::Status::failure("patch", "Failure")
                    .with_code(code)
                    .boxed(),
            ))
        };
        let cases = [
            ("removed", Ok(()), Removal::Removed),
            (
                "test failed: another replica removed it",
                api(422),
                Removal::NotOurs,
            ),
            ("the TWD is gone", api(404), Removal::NotOurs),
            ("a conflicting write", api(409), Removal::NotOurs),
            ("server error", api(500), Removal::Retry),
            ("rate limited", api(429), Removal::Retry),
        ];
        for (case, answer, expected) in cases {
            assert_eq!(Removal::of(&answer), expected, "{case}");
        }
    }

    #[test]
    fn synced_once_every_watch_of_every_kind_listed() {
        let calls = Cell::new(0);
        let mut sync = InitialSync::new(2, || calls.set(calls.get() + 1));
        let (old, new) = (
            Kind::Twd(WorkerKind::TemporalWorkerDeployment),
            Kind::Twd(WorkerKind::WorkerDeployment),
        );
        sync.listed(old, 0);
        sync.listed(old, 1);
        sync.listed(old, 0);
        sync.listed(new, 0);
        sync.listed(new, 1);
        let (old_connections, new_connections) = (
            Kind::Connection(ConnectionKind::TemporalConnection),
            Kind::Connection(ConnectionKind::Connection),
        );
        sync.listed(old_connections, 0);
        sync.listed(old_connections, 1);
        sync.listed(old_connections, 1);
        assert_eq!(calls.get(), 0, "one connection kind listed, not the other");
        sync.listed(new_connections, 0);
        assert_eq!(calls.get(), 0);
        sync.listed(new_connections, 1);
        assert_eq!(calls.get(), 1);
    }

    #[test]
    fn gauges_go_with_deleted_twds_and_with_those_a_relist_misses() {
        let metrics = Metrics::new();
        let mut gauges = Workers::default();
        let old = WorkerKind::TemporalWorkerDeployment;
        gauges.listing(old, 0);
        for name in ["a", "b", "c"] {
            gauges.applied(&metrics, 0, twd("demo", name));
        }
        gauges.listed(&metrics, old, 0);
        assert_eq!(series(&metrics).len(), 3);
        gauges.deleted(&metrics, 0, &twd("demo", "a"));
        assert_eq!(
            series(&metrics),
            vec![
                r#"twc_versions{namespace="demo",name="b"} 0"#,
                r#"twc_versions{namespace="demo",name="c"} 0"#
            ]
        );
        // The watch was down while c was deleted: the re-list does not show it.
        gauges.listing(old, 0);
        gauges.applied(&metrics, 0, twd("demo", "b"));
        gauges.listed(&metrics, old, 0);
        assert_eq!(
            series(&metrics),
            vec![r#"twc_versions{namespace="demo",name="b"} 0"#]
        );
    }
}
