//! The dashboard's picture of the cluster, kept current by Kubernetes watches (both kinds of
//! worker deployment, their versioned Deployments and their events): every change of a worker
//! deployment's row, pods or events is announced on a broadcast channel the live pages follow.
//! The watches relist and back off on their own (kube-runtime), so an API server restart only
//! delays them.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use futures::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event as WatchEvent};
use tokio::sync::broadcast;
use twc_crds::kinds::{ClaimantFacts, claim_holder};
use twc_crds::{WorkerKind, WorkerObject};

use super::model::{Pods, Summary, summary};

/// Label of a versioned Deployment naming its worker deployment.
const DEPLOYMENT_NAME_LABEL: &str = "temporal.io/deployment-name";
/// Label of a versioned Deployment naming its build.
const BUILD_ID_LABEL: &str = "temporal.io/build-id";

/// `(namespace, name)` of a worker deployment.
pub type Key = (String, String);

/// What changed, for the live pages.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// A worker deployment's row (None: it is gone).
    Row(Key, Option<Box<Summary>>),
    /// Its pods or events changed (its page reloads its details).
    Details(Key),
}

/// The objects the watches have seen.
#[derive(Default)]
struct Objects {
    /// Objects of either kind under one name, by kind.
    workers: BTreeMap<Key, HashMap<WorkerKind, WorkerObject>>,
    /// Pods of each build: (namespace, worker deployment) -> build -> pods.
    pods: HashMap<Key, HashMap<String, Pods>>,
    /// Whether every watch has listed once.
    listed: [bool; 2],
}

/// The cluster as the dashboard sees it.
pub struct Store {
    objects: RwLock<Objects>,
    changes: broadcast::Sender<Change>,
}

impl Store {
    /// An empty store; `capacity` changes are kept for a slow page before it must reload.
    pub fn new(capacity: usize) -> Arc<Self> {
        let (changes, _) = broadcast::channel(capacity);
        Arc::new(Self {
            objects: RwLock::new(Objects::default()),
            changes,
        })
    }

    /// Follows the changes from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }

    /// Every worker deployment's row, by namespace and name.
    pub fn rows(&self) -> Vec<Summary> {
        let objects = self.read();
        objects
            .workers
            .values()
            .filter_map(holder)
            .map(summary)
            .collect()
    }

    /// Whether both kinds were listed once (the overview is complete).
    pub fn synced(&self) -> bool {
        self.read().listed.iter().all(|l| *l)
    }

    /// The object holding the name `key`.
    pub fn worker(&self, key: &Key) -> Option<WorkerObject> {
        self.read().workers.get(key).and_then(holder).cloned()
    }

    /// The pods of each build of `key`.
    pub fn pods(&self, key: &Key) -> HashMap<String, Pods> {
        self.read().pods.get(key).cloned().unwrap_or_default()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Objects> {
        self.objects.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Objects> {
        self.objects.write().unwrap_or_else(|e| e.into_inner())
    }

    fn announce(&self, change: Change) {
        // No page open: nobody to tell.
        let _ = self.changes.send(change);
    }

    /// Records `object` (or its deletion) and announces its row when it changed.
    fn worker_seen(&self, object: WorkerObject, deleted: bool) {
        let key = key_of(&object);
        let (before, after) = {
            let mut objects = self.write();
            let before = objects.workers.get(&key).and_then(holder).map(summary);
            let entry = objects.workers.entry(key.clone()).or_default();
            if deleted {
                entry.remove(&object.kind);
            } else {
                entry.insert(object.kind, object);
            }
            let after = entry
                .values()
                .next()
                .is_some()
                .then(|| holder(entry).map(summary));
            if entry.is_empty() {
                objects.workers.remove(&key);
            }
            (before, after.flatten())
        };
        if before != after {
            self.announce(Change::Row(key.clone(), after.map(Box::new)));
        }
        self.announce(Change::Details(key));
    }

    /// Replaces every object of `kind` with a fresh list (a watch's relist).
    fn relisted(&self, kind: WorkerKind, listed: Vec<WorkerObject>) {
        let stale: Vec<WorkerObject> = {
            let objects = self.read();
            objects
                .workers
                .values()
                .filter_map(|by_kind| by_kind.get(&kind))
                .filter(|o| !listed.iter().any(|l| key_of(l) == key_of(o)))
                .cloned()
                .collect()
        };
        for gone in stale {
            self.worker_seen(gone, true);
        }
        for object in listed {
            self.worker_seen(object, false);
        }
        let index = usize::from(kind == WorkerKind::TemporalWorkerDeployment);
        self.write().listed[index] = true;
    }

    fn deployment_seen(&self, deployment: &Deployment, deleted: bool) {
        let labels = deployment.metadata.labels.clone().unwrap_or_default();
        let (Some(name), Some(build)) = (
            labels.get(DEPLOYMENT_NAME_LABEL),
            labels.get(BUILD_ID_LABEL),
        ) else {
            return;
        };
        let key = (
            deployment.metadata.namespace.clone().unwrap_or_default(),
            name.clone(),
        );
        let pods = Pods {
            replicas: deployment
                .spec
                .as_ref()
                .and_then(|s| s.replicas)
                .unwrap_or(0),
            ready: deployment
                .status
                .as_ref()
                .and_then(|s| s.ready_replicas)
                .unwrap_or(0),
        };
        let changed = {
            let mut objects = self.write();
            let builds = objects.pods.entry(key.clone()).or_default();
            if deleted {
                builds.remove(build).is_some()
            } else {
                builds.insert(build.clone(), pods) != Some(pods)
            }
        };
        if changed {
            self.announce(Change::Details(key));
        }
    }

    fn event_seen(&self, event: &Event) {
        let involved = &event.involved_object;
        if involved
            .kind
            .as_deref()
            .and_then(WorkerKind::from_kind)
            .is_none()
        {
            return;
        }
        let key = (
            involved.namespace.clone().unwrap_or_default(),
            involved.name.clone().unwrap_or_default(),
        );
        if self.read().workers.contains_key(&key) {
            self.announce(Change::Details(key));
        }
    }
}

fn key_of(object: &WorkerObject) -> Key {
    (
        object.metadata.namespace.clone().unwrap_or_default(),
        object.metadata.name.clone().unwrap_or_default(),
    )
}

/// The object of a name that holds its claim (the other kind's, if any, is refused).
fn holder(by_kind: &HashMap<WorkerKind, WorkerObject>) -> Option<&WorkerObject> {
    let objects: Vec<&WorkerObject> = WorkerKind::ALL
        .iter()
        .filter_map(|k| by_kind.get(k))
        .collect();
    let facts: Vec<ClaimantFacts<'_>> = objects.iter().map(|o| ClaimantFacts::of(o)).collect();
    claim_holder(&facts).and_then(|i| objects.get(i).copied())
}

/// The scopes to watch: each namespace, or `""` for every namespace.
fn scopes(namespaces: &[String]) -> Vec<&str> {
    if namespaces.is_empty() {
        vec![""]
    } else {
        namespaces.iter().map(String::as_str).collect()
    }
}

/// Runs the watches until the process ends: worker deployments of both kinds, versioned
/// Deployments and Events of the chosen namespaces (every namespace when empty).
pub async fn watch(store: Arc<Store>, client: kube::Client, namespaces: Vec<String>) {
    let mut tasks = Vec::new();
    for kind in WorkerKind::ALL {
        let resource = kind.api_resource();
        for ns in scopes(&namespaces) {
            let api = if ns.is_empty() {
                Api::<DynamicObject>::all_with(client.clone(), &resource)
            } else {
                Api::namespaced_with(client.clone(), ns, &resource)
            };
            tasks.push(tokio::spawn(watch_workers(store.clone(), kind, api)));
        }
    }
    for ns in scopes(&namespaces) {
        let api = namespaced::<Deployment>(&client, ns);
        let config = watcher::Config::default().labels(DEPLOYMENT_NAME_LABEL);
        let store = store.clone();
        tasks.push(tokio::spawn(follow(
            api,
            config,
            move |event| match event {
                WatchEvent::Apply(d) | WatchEvent::InitApply(d) => store.deployment_seen(&d, false),
                WatchEvent::Delete(d) => store.deployment_seen(&d, true),
                WatchEvent::Init | WatchEvent::InitDone => {}
            },
        )));
    }
    for ns in scopes(&namespaces) {
        let api = namespaced::<Event>(&client, ns);
        let store = store.clone();
        tasks.push(tokio::spawn(follow(
            api,
            watcher::Config::default(),
            move |event| {
                if let WatchEvent::Apply(e) = event {
                    store.event_seen(&e);
                }
            },
        )));
    }
    futures::future::join_all(tasks).await;
}

fn namespaced<K>(client: &kube::Client, namespace: &str) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    <K as kube::Resource>::DynamicType: Default,
{
    if namespace.is_empty() {
        Api::all(client.clone())
    } else {
        Api::namespaced(client.clone(), namespace)
    }
}

/// Follows one watch, with kube-runtime's backoff, handing each event to `handle`.
async fn follow<K>(api: Api<K>, config: watcher::Config, mut handle: impl FnMut(WatchEvent<K>))
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let stream = watcher::watcher(api, config).default_backoff();
    drive(stream, &mut handle).await;
}

async fn drive<K>(
    stream: impl Stream<Item = Result<WatchEvent<K>, watcher::Error>>,
    handle: &mut impl FnMut(WatchEvent<K>),
) {
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(event) => handle(event),
            Err(e) => tracing::warn!("dashboard watch: {e} (retrying)"),
        }
    }
}

/// Follows the worker deployments of one kind: a relist replaces what was known of the kind.
async fn watch_workers(store: Arc<Store>, kind: WorkerKind, api: Api<DynamicObject>) {
    let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
    let mut listing: Vec<WorkerObject> = Vec::new();
    let parse = |object: DynamicObject| {
        let name = twc_activities::k8s::twd::worker_object_name(
            kind,
            object.metadata.namespace.as_deref().unwrap_or_default(),
            object.metadata.name.as_deref().unwrap_or_default(),
        );
        twc_activities::k8s::twd::parse_worker(kind, object, &name)
            .map_err(|e| tracing::warn!("dashboard: {e}"))
            .ok()
    };
    drive(stream, &mut |event| match event {
        WatchEvent::Init => listing.clear(),
        WatchEvent::InitApply(object) => listing.extend(parse(object)),
        WatchEvent::InitDone => store.relisted(kind, std::mem::take(&mut listing)),
        WatchEvent::Apply(object) => {
            if let Some(object) = parse(object) {
                store.worker_seen(object, false);
            }
        }
        WatchEvent::Delete(object) => {
            if let Some(object) = parse(object) {
                store.worker_seen(object, true);
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use twc_crds::TemporalWorkerDeployment;

    use super::*;

    fn object(kind: WorkerKind, name: &str, created: &str, ramp: Option<f32>) -> WorkerObject {
        let object: TemporalWorkerDeployment = serde_json::from_value(json!({
            "apiVersion": "temporal.io/v1alpha1",
            "kind": kind.as_str(),
            "metadata": { "name": name, "namespace": "demo", "uid": format!("{name}-{created}"),
                          "creationTimestamp": created },
            "spec": {
                "workerOptions": { "connectionRef": { "name": "dev" }, "temporalNamespace": "default" },
                "rollout": { "strategy": "AllAtOnce" },
                "template": { "spec": { "containers": [ { "name": "w", "image": "i:v1" } ] } }
            },
            "status": { "targetVersion": { "buildID": "v2", "status": "Ramping", "rampPercentage": ramp },
                        "currentVersion": { "buildID": "v1", "status": "Current" } }
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        WorkerObject { kind, object }
    }

    fn drain(rx: &mut broadcast::Receiver<Change>) -> Vec<Change> {
        std::iter::from_fn(|| rx.try_recv().ok()).collect()
    }

    #[test]
    fn a_row_is_announced_when_it_changes_and_pages_hear_of_every_change() {
        let store = Store::new(16);
        let mut rx = store.subscribe();
        let key = ("demo".to_owned(), "hello".to_owned());
        store.worker_seen(
            object(
                WorkerKind::WorkerDeployment,
                "hello",
                "2026-01-01T00:00:00Z",
                Some(10.0),
            ),
            false,
        );
        let changes = drain(&mut rx);
        assert!(
            matches!(&changes[0], Change::Row(k, Some(row)) if *k == key && row.ramp == Some(10.0))
        );
        assert_eq!(changes[1], Change::Details(key.clone()));

        // The same row again (a resync): only the page's details are refreshed.
        store.worker_seen(
            object(
                WorkerKind::WorkerDeployment,
                "hello",
                "2026-01-01T00:00:00Z",
                Some(10.0),
            ),
            false,
        );
        assert_eq!(drain(&mut rx), vec![Change::Details(key.clone())]);

        store.worker_seen(
            object(
                WorkerKind::WorkerDeployment,
                "hello",
                "2026-01-01T00:00:00Z",
                Some(50.0),
            ),
            false,
        );
        assert!(matches!(&drain(&mut rx)[0], Change::Row(_, Some(row)) if row.ramp == Some(50.0)));

        store.worker_seen(
            object(
                WorkerKind::WorkerDeployment,
                "hello",
                "2026-01-01T00:00:00Z",
                None,
            ),
            true,
        );
        assert!(matches!(&drain(&mut rx)[0], Change::Row(k, None) if *k == key));
        assert!(store.rows().is_empty());
    }

    #[test]
    fn one_row_per_name_the_claim_holder_of_both_kinds() {
        let store = Store::new(16);
        store.worker_seen(
            object(
                WorkerKind::WorkerDeployment,
                "hello",
                "2026-02-01T00:00:00Z",
                Some(10.0),
            ),
            false,
        );
        store.worker_seen(
            object(
                WorkerKind::TemporalWorkerDeployment,
                "hello",
                "2026-01-01T00:00:00Z",
                Some(20.0),
            ),
            false,
        );
        let rows = store.rows();
        assert_eq!(rows.len(), 1);
        assert_eq!(
            (rows[0].kind, rows[0].ramp),
            ("TemporalWorkerDeployment", Some(20.0))
        );
    }

    #[test]
    fn a_relist_forgets_what_is_gone() {
        let store = Store::new(16);
        store.worker_seen(
            object(
                WorkerKind::WorkerDeployment,
                "a",
                "2026-01-01T00:00:00Z",
                None,
            ),
            false,
        );
        store.worker_seen(
            object(
                WorkerKind::WorkerDeployment,
                "b",
                "2026-01-01T00:00:00Z",
                None,
            ),
            false,
        );
        assert!(!store.synced());
        store.relisted(
            WorkerKind::WorkerDeployment,
            vec![object(
                WorkerKind::WorkerDeployment,
                "b",
                "2026-01-01T00:00:00Z",
                None,
            )],
        );
        store.relisted(WorkerKind::TemporalWorkerDeployment, Vec::new());
        assert_eq!(
            store
                .rows()
                .iter()
                .map(|r| r.name.as_str())
                .collect::<Vec<_>>(),
            vec!["b"]
        );
        assert!(store.synced());
    }
}
