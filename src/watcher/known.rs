//! The activities' view of the connections' finalizers ([`KnownConnections`]), read from the
//! watcher's stores in this process: the connections of each kind and both worker kinds, per
//! watch scope. Every turn of every TWD re-asserts its finalizers, and without this view lists
//! the connections of its namespace and the ClusterConnections to find one left to release;
//! with it, it lists only when a store shows one.
//!
//! A scope answers only once the watches it reads have finished their first list; before, or
//! for a namespace no scope watches, the answer is "not known" and the activity lists as
//! without the view. The stores may be a moment behind the API server: the activity acts only
//! on what it lists or reads then, so a store behind can delay a release, never make a wrong
//! one ([`twc_activities::k8s::finalizers`]).

use std::sync::{Arc, Mutex, PoisonError};

use kube::ResourceExt;
use kube::api::ObjectMeta;
use kube::runtime::reflector::Store;
use twc_activities::k8s::KnownConnections;
use twc_crds::labels::DELETE_PROTECTION_FINALIZER;
use twc_crds::worker_deployment::{
    ConnectionKind, ConnectionReference, TemporalWorkerDeploymentSpec,
};
use twc_crds::{ClusterConnection, Connection, TemporalConnection};

use super::names::Workers;

/// The stores of one watch scope.
#[derive(Clone)]
pub struct ScopeStores {
    /// The namespace watched (`None`: every namespace).
    pub namespace: Option<String>,
    /// Both worker kinds, and which watches of the scope have listed once.
    pub workers: Workers,
    /// `TemporalConnection`s.
    pub temporal_connections: Store<TemporalConnection>,
    /// `Connection`s.
    pub connections: Store<Connection>,
    /// `ClusterConnection`s, watched in the scope of every namespace only.
    pub cluster_connections: Option<Store<ClusterConnection>>,
}

/// The stores of every watch scope, shared by the watcher (which adds each scope as it starts)
/// and the activities (which read them). Clones share them.
#[derive(Clone, Default)]
pub struct ConnectionView {
    scopes: Arc<Mutex<Vec<ScopeStores>>>,
}

impl ConnectionView {
    /// Adds the stores of a scope.
    pub fn add(&self, scope: ScopeStores) {
        self.scopes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(scope);
    }

    /// The scope that watches `namespace` (`None`: the scope of every namespace).
    fn scope(&self, namespace: Option<&str>) -> Option<ScopeStores> {
        let scopes = self.scopes.lock().unwrap_or_else(PoisonError::into_inner);
        scopes
            .iter()
            .find(|s| match (s.namespace.as_deref(), namespace) {
                (None, _) => true,
                (Some(watched), Some(namespace)) => watched == namespace,
                (Some(_), None) => false,
            })
            .cloned()
    }
}

impl KnownConnections for ConnectionView {
    fn may_release(&self, namespace: &str, used: &ConnectionReference) -> Option<bool> {
        let scope = self.scope(Some(namespace))?;
        if !scope.workers.lists.now().all() {
            return None;
        }
        let held = |kind: ConnectionKind, meta: &ObjectMeta| {
            meta.namespace.as_deref() == Some(namespace)
                && holds_finalizer(meta)
                && !(kind == used.kind && meta.name.as_deref() == Some(used.name.as_str()))
        };
        let temporal_connections = scope
            .temporal_connections
            .state_filter(|c| held(ConnectionKind::TemporalConnection, &c.metadata))
            .into_iter()
            .map(|c| (ConnectionKind::TemporalConnection, c.name_any()));
        let connections = scope
            .connections
            .state_filter(|c| held(ConnectionKind::Connection, &c.metadata))
            .into_iter()
            .map(|c| (ConnectionKind::Connection, c.name_any()));
        let releasable: Vec<(ConnectionKind, String)> =
            temporal_connections.chain(connections).collect();
        Some(
            releasable
                .iter()
                .any(|(kind, name)| !in_use(&scope.workers, Some(namespace), *kind, name)),
        )
    }

    fn may_release_cluster(&self, used: &str) -> Option<bool> {
        let scope = self.scope(None)?;
        let cluster_connections = scope.cluster_connections.as_ref()?;
        if !scope.workers.lists.now().cluster() {
            return None;
        }
        let releasable = cluster_connections.state_filter(|c| {
            c.metadata.name.as_deref() != Some(used)
                && c.metadata.deletion_timestamp.is_some()
                && holds_finalizer(&c.metadata)
        });
        Some(releasable.iter().any(|c| {
            !in_use(
                &scope.workers,
                None,
                ConnectionKind::ClusterConnection,
                &c.name_any(),
            )
        }))
    }
}

/// Whether the object holds the delete-protection finalizer.
fn holds_finalizer(meta: &ObjectMeta) -> bool {
    meta.finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == DELETE_PROTECTION_FINALIZER))
}

/// Whether a worker object of `namespace` (any when `None`) needs the connection of `kind`
/// called `name`: it references it and is live or still holds its own finalizer (its cleanup
/// may use the connection), as the finalizers' release decides.
fn in_use(workers: &Workers, namespace: Option<&str>, kind: ConnectionKind, name: &str) -> bool {
    let needs = |meta: &ObjectMeta, spec: &TemporalWorkerDeploymentSpec| {
        needs_connection(meta, spec, namespace, kind, name)
    };
    workers.twd.find(|o| needs(&o.metadata, &o.spec)).is_some()
        || workers.wd.find(|o| needs(&o.metadata, &o.spec.0)).is_some()
}

/// [`in_use`] of one worker object.
fn needs_connection(
    meta: &ObjectMeta,
    spec: &TemporalWorkerDeploymentSpec,
    namespace: Option<&str>,
    kind: ConnectionKind,
    name: &str,
) -> bool {
    let reference = &spec.worker_options.connection_ref;
    reference.kind == kind
        && reference.name == name
        && namespace.is_none_or(|namespace| meta.namespace.as_deref() == Some(namespace))
        && (meta.deletion_timestamp.is_none() || holds_finalizer(meta))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kube::runtime::reflector;
    use kube::runtime::watcher::Event;
    use twc_crds::{TemporalWorkerDeployment, WorkerDeployment};

    use super::*;
    use crate::watcher::lists::{Lists, Watch};

    fn meta(namespace: Option<&str>, name: &str, deleting: bool, held: bool) -> ObjectMeta {
        ObjectMeta {
            namespace: namespace.map(str::to_owned),
            name: Some(name.to_owned()),
            uid: Some(format!("{}/{name}", namespace.unwrap_or_default())),
            deletion_timestamp: deleting.then_some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)),
            finalizers: held.then(|| vec![DELETE_PROTECTION_FINALIZER.to_owned()]),
            ..Default::default()
        }
    }

    /// A TWD of `namespace` using the connection of `kind` called `connection`.
    fn twd(
        namespace: &str,
        name: &str,
        kind: ConnectionKind,
        connection: &str,
        deleting: bool,
        held: bool,
    ) -> TemporalWorkerDeployment {
        let mut spec = twc_crds::worker_deployment::test_support::spec_with_image("w:v1");
        spec.worker_options.connection_ref = ConnectionReference {
            name: connection.to_owned(),
            kind,
        };
        TemporalWorkerDeployment {
            metadata: meta(Some(namespace), name, deleting, held),
            spec,
            status: None,
        }
    }

    fn temporal_connection(namespace: &str, name: &str, held: bool) -> TemporalConnection {
        let mut connection: TemporalConnection = serde_json::from_value(serde_json::json!({
            "apiVersion": "temporal.io/v1alpha1",
            "kind": "TemporalConnection",
            "metadata": {},
            "spec": { "hostPort": "temporal:7233" },
        }))
        .unwrap_or_else(|e| panic!("a TemporalConnection: {e}"));
        connection.metadata = meta(Some(namespace), name, false, held);
        connection
    }

    fn cluster_connection(name: &str, deleting: bool, held: bool) -> ClusterConnection {
        let mut connection: ClusterConnection = serde_json::from_value(serde_json::json!({
            "apiVersion": "temporal.io/v1alpha1",
            "kind": "ClusterConnection",
            "metadata": {},
            "spec": { "hostPort": "temporal:7233" },
        }))
        .unwrap_or_else(|e| panic!("a ClusterConnection: {e}"));
        connection.metadata = meta(None, name, deleting, held);
        connection
    }

    /// A store holding `objects` as its first list.
    fn listed<K>(objects: Vec<K>) -> Store<K>
    where
        K: kube::Resource<DynamicType = ()> + Clone + 'static,
    {
        let (store, mut writer) = reflector::store::<K>();
        writer.apply_watcher_event(&Event::Init);
        for object in objects {
            writer.apply_watcher_event(&Event::InitApply(object));
        }
        writer.apply_watcher_event(&Event::InitDone);
        store
    }

    /// The view of one scope of every namespace, its watches listed as `lists` says.
    fn view_of(
        twds: Vec<TemporalWorkerDeployment>,
        temporal_connections: Vec<TemporalConnection>,
        cluster_connections: Vec<ClusterConnection>,
        lists: &[Watch],
    ) -> ConnectionView {
        let marked = Lists::default();
        for watch in lists {
            marked.mark(*watch);
        }
        let view = ConnectionView::default();
        view.add(ScopeStores {
            namespace: None,
            workers: Workers {
                twd: listed(twds),
                wd: listed::<WorkerDeployment>(Vec::new()),
                lists: marked,
            },
            temporal_connections: listed(temporal_connections),
            connections: listed::<Connection>(Vec::new()),
            cluster_connections: Some(listed(cluster_connections)),
        });
        view
    }

    const ALL: [Watch; 5] = [
        Watch::TemporalWorkerDeployments,
        Watch::WorkerDeployments,
        Watch::TemporalConnections,
        Watch::Connections,
        Watch::ClusterConnections,
    ];

    #[test]
    fn a_namespace_s_connections_are_listed_only_when_one_may_be_left_to_release() {
        use ConnectionKind::{Connection as Conn, TemporalConnection as Tc};
        let used = ConnectionReference {
            name: "dev".to_owned(),
            kind: Tc,
        };
        let dev = || temporal_connection("demo", "dev", true);
        // (case, TWDs, connections, watches listed, may release)
        let cases = [
            (
                "only the used connection is protected",
                vec![twd("demo", "a", Tc, "dev", false, true)],
                vec![dev()],
                ALL.to_vec(),
                Some(false),
            ),
            (
                "another one is protected and used by another TWD",
                vec![
                    twd("demo", "a", Tc, "dev", false, true),
                    twd("demo", "b", Tc, "prod", false, true),
                ],
                vec![dev(), temporal_connection("demo", "prod", true)],
                ALL.to_vec(),
                Some(false),
            ),
            (
                "another one is protected and its last user is still cleaning up",
                vec![
                    twd("demo", "a", Tc, "dev", false, true),
                    twd("demo", "b", Tc, "prod", true, true),
                ],
                vec![dev(), temporal_connection("demo", "prod", true)],
                ALL.to_vec(),
                Some(false),
            ),
            (
                "another one is protected and no TWD uses it (a connectionRef changed)",
                vec![twd("demo", "a", Tc, "dev", false, true)],
                vec![dev(), temporal_connection("demo", "old", true)],
                ALL.to_vec(),
                Some(true),
            ),
            (
                "its last user is deleted and released",
                vec![
                    twd("demo", "a", Tc, "dev", false, true),
                    twd("demo", "b", Tc, "prod", true, false),
                ],
                vec![dev(), temporal_connection("demo", "prod", true)],
                ALL.to_vec(),
                Some(true),
            ),
            (
                "a TWD of another namespace does not use it",
                vec![
                    twd("demo", "a", Tc, "dev", false, true),
                    twd("other", "b", Tc, "prod", false, true),
                ],
                vec![dev(), temporal_connection("demo", "prod", true)],
                ALL.to_vec(),
                Some(true),
            ),
            (
                "a reference of the other kind does not use it",
                vec![
                    twd("demo", "a", Tc, "dev", false, true),
                    twd("demo", "b", Conn, "prod", false, true),
                ],
                vec![dev(), temporal_connection("demo", "prod", true)],
                ALL.to_vec(),
                Some(true),
            ),
            (
                "one without the finalizer has nothing to release",
                vec![twd("demo", "a", Tc, "dev", false, true)],
                vec![dev(), temporal_connection("demo", "old", false)],
                ALL.to_vec(),
                Some(false),
            ),
            (
                "one of another namespace is not this namespace's",
                vec![twd("demo", "a", Tc, "dev", false, true)],
                vec![dev(), temporal_connection("other", "old", true)],
                ALL.to_vec(),
                Some(false),
            ),
            (
                "the Connections are not listed yet",
                vec![twd("demo", "a", Tc, "dev", false, true)],
                vec![dev()],
                vec![
                    Watch::TemporalWorkerDeployments,
                    Watch::WorkerDeployments,
                    Watch::TemporalConnections,
                ],
                None,
            ),
            (
                "the WorkerDeployments are not listed yet",
                vec![twd("demo", "a", Tc, "dev", false, true)],
                vec![dev()],
                vec![
                    Watch::TemporalWorkerDeployments,
                    Watch::TemporalConnections,
                    Watch::Connections,
                ],
                None,
            ),
        ];
        for (case, twds, connections, lists, expected) in cases {
            let view = view_of(twds, connections, Vec::new(), &lists);
            assert_eq!(view.may_release("demo", &used), expected, "{case}");
        }
    }

    #[test]
    fn cluster_connections_are_listed_only_when_one_being_deleted_may_be_released() {
        use ConnectionKind::{ClusterConnection as Cc, TemporalConnection as Tc};
        // (case, TWDs, ClusterConnections, watches listed, used, may release)
        let cases = [
            (
                "none being deleted",
                vec![twd("a", "a", Cc, "shared", false, true)],
                vec![cluster_connection("shared", false, true)],
                ALL.to_vec(),
                "shared",
                Some(false),
            ),
            (
                "the used one being deleted is this TWD's to keep",
                vec![twd("a", "a", Cc, "shared", false, true)],
                vec![cluster_connection("shared", true, true)],
                ALL.to_vec(),
                "shared",
                Some(false),
            ),
            (
                "being deleted while a TWD of another namespace uses it",
                vec![
                    twd("a", "a", Tc, "dev", false, true),
                    twd("b", "b", Cc, "shared", false, true),
                ],
                vec![cluster_connection("shared", true, true)],
                ALL.to_vec(),
                "",
                Some(false),
            ),
            (
                "being deleted and used by nobody",
                vec![twd("a", "a", Tc, "dev", false, true)],
                vec![cluster_connection("shared", true, true)],
                ALL.to_vec(),
                "",
                Some(true),
            ),
            (
                "being deleted and already released",
                vec![twd("a", "a", Tc, "dev", false, true)],
                vec![cluster_connection("shared", true, false)],
                ALL.to_vec(),
                "",
                Some(false),
            ),
            (
                "the ClusterConnections are not listed yet",
                vec![twd("a", "a", Tc, "dev", false, true)],
                vec![],
                ALL[..4].to_vec(),
                "",
                None,
            ),
        ];
        for (case, twds, cluster_connections, lists, used, expected) in cases {
            let view = view_of(twds, Vec::new(), cluster_connections, &lists);
            assert_eq!(view.may_release_cluster(used), expected, "{case}");
        }
    }

    #[test]
    fn a_namespace_no_scope_watches_is_not_known() {
        let view = ConnectionView::default();
        let marked = Lists::default();
        for watch in ALL {
            marked.mark(watch);
        }
        view.add(ScopeStores {
            namespace: Some("demo".to_owned()),
            workers: Workers {
                twd: listed::<TemporalWorkerDeployment>(Vec::new()),
                wd: listed::<WorkerDeployment>(Vec::new()),
                lists: marked,
            },
            temporal_connections: listed::<TemporalConnection>(Vec::new()),
            connections: listed::<Connection>(Vec::new()),
            cluster_connections: None,
        });
        let used = ConnectionReference {
            name: "dev".to_owned(),
            kind: ConnectionKind::TemporalConnection,
        };
        assert_eq!(view.may_release("demo", &used), Some(false));
        assert_eq!(view.may_release("other", &used), None);
        assert_eq!(
            view.may_release_cluster(""),
            None,
            "no scope of every namespace"
        );
    }
}
