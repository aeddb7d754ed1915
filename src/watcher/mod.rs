//! The light Kubernetes watcher: turns WorkerDeployment and TemporalWorkerDeployment changes
//! into signals on each TWD's workflow (signal-with-start), and Connection, TemporalConnection
//! and ClusterConnection spec changes into nudges of the TWDs that use them (ClusterConnections
//! only when every namespace is watched). It decides nothing; duplicate signals are harmless
//! (the workflow ignores generations it has seen and at most resyncs).
//!
//! Built on kube-runtime: per watch scope (every namespace, or each of `--watch-namespaces`) one
//! [`Controller`] per worker kind, whose reflector stores are read together, since both kinds of
//! one name share one workflow `twd/<ns>/<name>`: the claim holder
//! ([`twc_crds::kinds::claim_holder`]) is decided from both stores, and only its reconcile
//! signals; a change of the other object (refused, or handing over) asks for a reconcile of the
//! holder with a nudge. The connections' watches ([`connections`]) ask for the reconciles of
//! their users the same way (`reconcile_on`). The controllers deduplicate and serialize the
//! reconciles of each object and run at most [`CONCURRENCY`] at once per kind; a reconcile that
//! fails is retried by their error policy. Nothing waits on Temporal outside a reconcile, so a
//! slow call holds up one object only.
//!
//! The holder's reconcile also carries the kubectl-only control path ([`actions`]: the
//! `temporal.io/rollout-action` annotation, taken by exactly one replica) and sets the per-TWD
//! gauges (`twc_ramp_percentage`, `twc_versions`) from the holder's status. What the watcher
//! remembers per name ([`names`]) is dropped, and the gauges forgotten, when the name's last
//! object is deleted, or within [`PRUNE_EVERY`] of a re-list that misses it. It reports when
//! every counted watch has finished its first list ([`lists`], readiness).
//!
//! The stores keep no `managedFields` and nothing else the watcher does not read ([`slim`]).
//! The activities of this process read the connections' finalizers from the stores
//! ([`known`]), which spares every turn's lists of connections.

mod actions;
mod connections;
mod known;
mod lists;
mod names;
mod reconcile;
mod signal;
mod slim;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::{BoxFuture, Shared};
use futures::{FutureExt, StreamExt};
use k8s_openapi::NamespaceResourceScope;
use kube::Resource;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher;
use temporalio_client::Client;
use twc_activities::metrics::Metrics;
use twc_crds::{
    ClusterConnection, Connection, TemporalConnection, TemporalWorkerDeployment, WorkerDeployment,
};
use twc_workflows::model::TwdRef;

pub use self::known::ConnectionView;
use self::known::ScopeStores;
use self::lists::{FirstLists, Lists, Watch};
use self::names::{Names, Workers};
use self::reconcile::{Context, Triggers, WorkerResource};

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
    /// Where each watch scope's stores are given to the activities.
    pub connections: ConnectionView,
}

/// Reconciles of one worker kind (in one watch scope) run at once.
const CONCURRENCY: u16 = 32;

/// How often the memory of names with no object left is dropped (and their gauges forgotten).
const PRUNE_EVERY: Duration = Duration::from_secs(30);

/// How long the watcher waits at its start for the list of running TWD workflows (without it,
/// every TWD is signalled, which is harmless).
const LIST_RUNNING_TIMEOUT: Duration = Duration::from_secs(30);

/// After shutdown begins, how long reconciles under way may take to finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The shutdown every task of the watcher waits for.
type Shutdown = Shared<BoxFuture<'static, ()>>;

/// Watches until `shutdown` completes. `synced` is called once, when every store of worker
/// deployments and connections holds its first list.
pub async fn run(
    kube: kube::Client,
    engine: Client,
    config: WatcherConfig,
    synced: impl FnOnce(),
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let shutdown: Shutdown = shutdown.boxed().shared();
    // The TWD workflows already running: a TWD of the first list whose workflow runs and has
    // written the status of its generation is not signalled again (a restarted replica wakes
    // nothing); one changed later is.
    let running = tokio::select! {
        running = tokio::time::timeout(LIST_RUNNING_TIMEOUT, signal::running_twd_workflows(&engine)) => {
            running.unwrap_or_else(|_| {
                tracing::warn!("listing the running TWD workflows took too long; every TWD is signalled");
                Vec::new()
            })
        }
        () = shutdown.clone() => return,
    };
    let scopes: Vec<Option<String>> = if config.namespaces.is_empty() {
        vec![None]
    } else {
        config.namespaces.iter().cloned().map(Some).collect()
    };
    let (scopes, ready): (Vec<_>, Vec<_>) = scopes
        .into_iter()
        .map(|namespace| {
            let running: Vec<TwdRef> = running
                .iter()
                .filter(|t| namespace.as_ref().is_none_or(|ns| &t.namespace == ns))
                .cloned()
                .collect();
            scope(&kube, &engine, &config, namespace, running, &shutdown)
        })
        .unzip();
    let readiness = async {
        let listed = futures::future::join_all(ready).await;
        if listed.iter().all(|listed| *listed) {
            tracing::info!(
                scopes = listed.len(),
                "first lists of worker deployments and connections held"
            );
            synced();
        }
    };
    let grace = async {
        shutdown.clone().await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    tokio::select! {
        _ = futures::future::join(futures::future::join_all(scopes), readiness) => {}
        () = grace => {}
    }
}

/// The controllers and watches of one scope (every namespace when `namespace` is `None`), and
/// a future that is true once all of its stores that readiness waits for hold their first list.
fn scope(
    kube: &kube::Client,
    engine: &Client,
    config: &WatcherConfig,
    namespace: Option<String>,
    running: Vec<TwdRef>,
    shutdown: &Shutdown,
) -> (BoxFuture<'static, ()>, BoxFuture<'static, bool>) {
    let namespace = namespace.as_deref();
    let (twd_trigger, twds) = futures::channel::mpsc::unbounded();
    let (wd_trigger, wds) = futures::channel::mpsc::unbounded();
    let (twd_store, twd_writer) = reflector::store::<TemporalWorkerDeployment>();
    let (wd_store, wd_writer) = reflector::store::<WorkerDeployment>();
    let lists = Lists::default();
    let workers = Workers {
        twd: twd_store,
        wd: wd_store,
        lists: lists.clone(),
    };
    let context = Arc::new(Context {
        kube: kube.clone(),
        engine: engine.clone(),
        config: config.clone(),
        workers: workers.clone(),
        names: Names::with_running(running),
        triggers: Triggers {
            twd: twd_trigger,
            wd: wd_trigger,
        },
    });
    let twd_controller = controller(kube, namespace, twd_writer, twds, &context);
    let wd_controller = controller(kube, namespace, wd_writer, wds, &context);
    let (old_store, old_writer) = reflector::store::<TemporalConnection>();
    let old_watch = connections::watch(
        scoped::<TemporalConnection>(kube, namespace),
        old_writer,
        Arc::clone(&context),
        Some(Watch::TemporalConnections),
    );
    let (new_store, new_writer) = reflector::store::<Connection>();
    let new_watch = connections::watch(
        scoped::<Connection>(kube, namespace),
        new_writer,
        Arc::clone(&context),
        Some(Watch::Connections),
    );
    // A controller restricted to namespaces may not read ClusterConnections. Not part of
    // readiness: a ClusterConnection CRD installed after the controller is picked up by the
    // watch's retries.
    let (cluster_store, cluster_watch) = match namespace {
        None => {
            let api = Api::<ClusterConnection>::all(kube.clone());
            let (store, writer) = reflector::store::<ClusterConnection>();
            let watch = connections::watch(
                api,
                writer,
                Arc::clone(&context),
                Some(Watch::ClusterConnections),
            );
            (Some(store), watch.boxed())
        }
        Some(_) => (None, futures::future::pending().boxed()),
    };
    config.connections.add(ScopeStores {
        namespace: namespace.map(str::to_owned),
        workers: workers.clone(),
        temporal_connections: old_store,
        connections: new_store,
        cluster_connections: cluster_store,
    });
    let ready = async move {
        lists.wait_for(FirstLists::all).await;
        true
    };
    let shutdown = shutdown.clone();
    let run = async move {
        let watches = futures::future::join4(old_watch, new_watch, cluster_watch, prune(&context));
        let controllers = futures::future::join(
            run_controller(twd_controller, &context, &shutdown),
            run_controller(wd_controller, &context, &shutdown),
        );
        let watches = async {
            tokio::select! {
                _ = watches => {}
                () = shutdown.clone() => {}
            }
        };
        futures::future::join(controllers, watches).await;
    };
    (run.boxed(), ready.boxed())
}

/// The controller of the worker kind `K` in `namespace`, whose reflector writes `writer`; it
/// also reconciles what `triggers` asks. A deletion (which a controller does not reconcile) is
/// told to the context: the other kind's object of the name may hold its claim now. After a
/// re-list every object is reconciled again: a reconcile reads the store, which takes a
/// re-list's objects only once it ends.
fn controller<K: WorkerResource>(
    kube: &kube::Client,
    namespace: Option<&str>,
    writer: reflector::store::Writer<K>,
    triggers: futures::channel::mpsc::UnboundedReceiver<ObjectRef<K>>,
    context: &Arc<Context>,
) -> Controller<K> {
    let store = writer.as_reader();
    let (context, listed) = (Arc::clone(context), store.clone());
    let mut listed_once = false;
    let objects = watcher::watcher(scoped::<K>(kube, namespace), watcher::Config::default())
        .default_backoff()
        .modify(|object: &mut K| object.slim())
        .reflect(writer)
        .inspect(move |event| match event {
            Ok(watcher::Event::Delete(object)) => context.deleted(object.meta()),
            Ok(watcher::Event::InitDone) => {
                if std::mem::replace(&mut listed_once, true) {
                    for object in listed.state() {
                        context.triggers.reconcile(&K::stored(object));
                    }
                } else {
                    context.workers.lists.mark(K::WATCH);
                }
            }
            _ => {}
        })
        .applied_objects();
    Controller::for_stream(objects, store)
        .with_config(controller::Config::default().concurrency(CONCURRENCY))
        .reconcile_on(triggers)
}

/// Runs a worker kind's controller until `shutdown` (reconciles under way finish).
async fn run_controller<K: WorkerResource>(
    controller: Controller<K>,
    context: &Arc<Context>,
    shutdown: &Shutdown,
) {
    let kind = K::kind(&());
    controller
        .graceful_shutdown_on(shutdown.clone())
        .run(
            reconcile::reconcile::<K>,
            reconcile::error_policy,
            Arc::clone(context),
        )
        .for_each(|result| {
            match result {
                Ok(_) => {}
                Err(controller::Error::ReconcilerFailed(error, object)) => {
                    let twd = format!(
                        "{}/{}",
                        object.namespace.as_deref().unwrap_or_default(),
                        object.name
                    );
                    tracing::warn!(%twd, "{error}");
                }
                Err(controller::Error::QueueError(error)) => {
                    tracing::warn!("watching {kind}s: {error}");
                }
                // An object asked for by a trigger and deleted meanwhile, say.
                Err(error) => tracing::debug!("{kind} controller: {error}"),
            }
            std::future::ready(())
        })
        .await;
}

/// Drops, every [`PRUNE_EVERY`], the memory of the names of `context`'s scope with no object
/// left, and forgets their gauges.
async fn prune(context: &Arc<Context>) {
    context.workers.ready().await;
    let mut every = tokio::time::interval(PRUNE_EVERY);
    loop {
        every.tick().await;
        forget_gone(&context.names, &context.workers, &context.config.metrics);
    }
}

/// Drops the memory of the names with no object left in `workers` (deleted, or missed by a
/// re-list), and forgets their gauges.
fn forget_gone(names: &Names, workers: &Workers, metrics: &Metrics) {
    for twd in names.prune(|twd| !workers.of_name(twd).is_empty()) {
        metrics.forget_twd(&twd.namespace, &twd.name);
    }
}

/// The API of `K` in `namespace` (every namespace when `None`).
fn scoped<K>(kube: &kube::Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(namespace) => Api::namespaced(kube.clone(), namespace),
        None => Api::all(kube.clone()),
    }
}

#[cfg(test)]
mod tests {
    use kube::api::ObjectMeta;
    use kube::runtime::watcher::Event;

    use super::*;
    use crate::watcher::names::NameMemory;

    fn twd(name: &str) -> TemporalWorkerDeployment {
        TemporalWorkerDeployment {
            metadata: ObjectMeta {
                namespace: Some("demo".to_owned()),
                name: Some(name.to_owned()),
                uid: Some(name.to_owned()),
                ..Default::default()
            },
            spec: twc_crds::worker_deployment::test_support::spec_with_image("w:v1"),
            status: None,
        }
    }

    fn twd_ref(name: &str) -> TwdRef {
        TwdRef {
            namespace: "demo".to_owned(),
            name: name.to_owned(),
        }
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
    fn memory_and_gauges_go_with_deleted_twds_and_with_those_a_relist_misses() {
        let metrics = Metrics::new();
        let names = Names::default();
        let (twds, mut writer) = reflector::store::<TemporalWorkerDeployment>();
        let (wds, _wd_writer) = reflector::store::<WorkerDeployment>();
        let workers = Workers {
            twd: twds,
            wd: wds,
            lists: Lists::default(),
        };
        writer.apply_watcher_event(&Event::Init);
        for name in ["a", "b", "c", "d"] {
            writer.apply_watcher_event(&Event::InitApply(twd(name)));
            metrics.twd_status("demo", name, None);
            names.with(&twd_ref(name), NameMemory::owe_nudge);
        }
        writer.apply_watcher_event(&Event::InitDone);
        forget_gone(&names, &workers, &metrics);
        assert_eq!(series(&metrics).len(), 4, "every TWD is there");
        writer.apply_watcher_event(&Event::Delete(twd("a")));
        forget_gone(&names, &workers, &metrics);
        assert_eq!(series(&metrics).len(), 3, "a deleted TWD goes");
        // The watch was down while c and d were deleted: the re-list does not show them.
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitApply(twd("b")));
        writer.apply_watcher_event(&Event::InitDone);
        forget_gone(&names, &workers, &metrics);
        assert_eq!(
            series(&metrics),
            vec![r#"twc_versions{namespace="demo",name="b"} 0"#]
        );
        assert_eq!(names.len(), 1);
    }
}
