//! The `temporal.io/delete-protection` finalizer on TWDs (so deletion waits for cleanup in
//! Temporal) and on the TemporalConnections and ClusterConnections they use (so a connection in
//! use is deleted last).
//!
//! A TemporalConnection is released once no TWD of its namespace uses it. A ClusterConnection
//! may be used from every namespace, so it is released when the last TWD using it is deleted,
//! or, if it is being deleted after its users moved to another connection, by the next turn of
//! any TWD (its users are found with a field selector on `connectionRef.name`). A controller
//! restricted to namespaces ([`ClusterAccess::Restricted`]) leaves ClusterConnections alone.
//!
//! Finalizer lists are merge-patched with the resourceVersion just read and retried on
//! conflict, so finalizers that others add at the same time are never lost.
//!
//! Every turn of every TWD re-asserts its finalizers ([`restore_finalizers`]). With a view of
//! the connections that a watch in the same process keeps ([`KnownConnections`]), a turn lists
//! the connections (and the TWDs) only when the view shows one that may be left to release;
//! otherwise it reads the connection the TWD uses by name. The view only spares lists: what is
//! added or removed is still decided on what the turn reads, as without it.

use std::collections::BTreeSet;
use std::fmt::Debug;

use kube::api::{DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;
use twc_crds::labels::DELETE_PROTECTION_FINALIZER;
use twc_crds::worker_deployment::{ConnectionKind, ConnectionReference};
use twc_crds::{ClusterConnection, WorkerObject};
use twc_workflows::model::TwdRef;

use super::connection::{ClusterAccess, Connection};
use super::error::{K8sError, ObjectName, is_not_found};
use super::retry::retry_on_conflict;
use super::twd::{get_twd, list_workers, read_claimants, worker_api, worker_object_name};

/// The connections' finalizers as a watch of them in this process sees them (the controller's
/// watcher keeps stores of every kind of connection, and of the TWDs), to spare the lists of
/// [`restore_finalizers`] when there is nothing to release.
///
/// An answer may be a moment behind the API server. It is only ever used to skip work that
/// would find nothing to do: a view that misses a connection to release delays its release to
/// a later turn (of any TWD of the namespace, or of the cluster); one that shows a connection
/// to release that is not lets the turn list and find that out, as without the view.
pub trait KnownConnections: Send + Sync {
    /// Whether a Connection or TemporalConnection of `namespace` other than the one `used`
    /// names holds the finalizer while no TWD of the namespace needs it (one that is live, or
    /// still holds its own finalizer, and references it). `None` when the watches of the
    /// namespace have not listed the connections and the TWDs yet (or do not watch it).
    fn may_release(&self, namespace: &str, used: &ConnectionReference) -> Option<bool>;

    /// Whether a ClusterConnection other than `used` (empty: none) is being deleted and holds
    /// the finalizer while no TWD of any namespace needs it. `None` when the ClusterConnections
    /// and the TWDs of every namespace have not been listed yet (or are not watched).
    fn may_release_cluster(&self, used: &str) -> Option<bool>;
}

/// Adds the finalizer to the TWD and to the connection it references (neither when the TWD is
/// being deleted; not to a connection that is missing or being deleted), then releases
/// connections in the namespace that no TWD references any more (e.g. after a
/// `connectionRef` change), and ClusterConnections being deleted that no TWD references.
pub async fn ensure_finalizers(
    client: &Client,
    access: ClusterAccess,
    twd: &TwdRef,
    known: Option<&dyn KnownConnections>,
) -> Result<(), K8sError> {
    match get_twd(client, twd).await? {
        Some(resource) => restore_finalizers(client, access, &resource, known, None)
            .await
            .map(drop),
        None => Ok(()),
    }
}

/// A Connection or TemporalConnection of a namespace, as the finalizer logic sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NamespacedConnection {
    kind: ConnectionKind,
    name: String,
    protected: bool,
    deleting: bool,
}

impl NamespacedConnection {
    fn object(&self, namespace: &str) -> ObjectName {
        ObjectName::new(self.kind.as_str(), namespace, &self.name)
    }
}

/// The API of connections of a namespaced `kind` in `namespace`.
fn connection_api(client: &Client, namespace: &str, kind: ConnectionKind) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), namespace, &kind.api_resource())
}

/// [`ensure_finalizers`] for a TWD just read: returns the objects it added the finalizer to.
/// When nothing is missing it only lists the namespace's connections (and its TWDs when
/// another connection still holds the finalizer); with `known` saying no other connection may
/// be released, it only reads the one the TWD uses, and not even that when `used` is the
/// connection the caller just read for the TWD (protected or being deleted: nothing to add).
pub async fn restore_finalizers(
    client: &Client,
    access: ClusterAccess,
    resource: &WorkerObject,
    known: Option<&dyn KnownConnections>,
    used: Option<&Connection>,
) -> Result<Vec<ObjectName>, K8sError> {
    let namespace = resource.namespace().unwrap_or_default();
    if resource.metadata.deletion_timestamp.is_some() {
        return Ok(Vec::new());
    }
    let reference = &resource.spec.worker_options.connection_ref;
    let uses = |c: &NamespacedConnection| c.kind == reference.kind && c.name == reference.name;
    // Listed unless the watch of the connections shows none of the others to release.
    let connections = match known.and_then(|k| k.may_release(&namespace, reference)) {
        Some(false) => None,
        Some(true) | None => Some(list_connections(client, &namespace).await?),
    };
    // The used connection when it may lack the finalizer: as listed, or, not listed, read by
    // `add_finalizer` (which adds nothing to one that is missing, being deleted or protected).
    let unprotected = match &connections {
        Some(connections) => connections
            .iter()
            .find(|c| uses(c) && !c.protected && !c.deleting)
            .map(|c| c.kind),
        None => (reference.kind.is_in_namespace() && used.is_none_or(needs_protection))
            .then_some(reference.kind),
    };
    let mut added = Vec::new();
    if let Some(kind) = unprotected {
        let object = ObjectName::new(kind.as_str(), &namespace, &reference.name);
        let api = connection_api(client, &namespace, kind);
        if add_finalizer(&api, &object).await? {
            added.push(object);
        }
    }
    if !has_finalizer(&resource.object) {
        let name = resource.name_any();
        let api = worker_api(client, &namespace, resource.kind);
        let object = worker_object_name(resource.kind, &namespace, &name);
        if add_finalizer(&api, &object).await? {
            added.push(object);
        }
    }
    // This TWD is live and uses its connection; only other protected connections may be unused.
    if let Some(connections) = &connections {
        let others: Vec<&NamespacedConnection> = connections.iter().filter(|c| !uses(c)).collect();
        release_unused(client, &namespace, &others).await?;
    }
    if access == ClusterAccess::Granted {
        added.extend(restore_cluster_finalizer(client, resource, known, used).await?);
    }
    Ok(added)
}

/// The ClusterConnection side of [`restore_finalizers`]: protects the one the TWD uses, and
/// releases others that are being deleted and that no TWD uses any more (listed only when
/// `known` does not say there is none).
async fn restore_cluster_finalizer(
    client: &Client,
    resource: &WorkerObject,
    known: Option<&dyn KnownConnections>,
    read: Option<&Connection>,
) -> Result<Option<ObjectName>, K8sError> {
    let reference = &resource.spec.worker_options.connection_ref;
    let used = match reference.kind {
        ConnectionKind::ClusterConnection => reference.name.as_str(),
        ConnectionKind::TemporalConnection | ConnectionKind::Connection => "",
    };
    let api: Api<ClusterConnection> = Api::all(client.clone());
    if known.and_then(|k| k.may_release_cluster(used)) == Some(false) {
        // Nothing to release: only the used one, if any, is read (`add_finalizer` adds nothing
        // to one that is missing, being deleted or protected).
        if used.is_empty() || read.is_some_and(|c| !needs_protection(c)) {
            return Ok(None);
        }
        let object = ObjectName::cluster_scoped("ClusterConnection", used);
        let added = add_finalizer(&api, &object).await?;
        return Ok(added.then_some(object));
    }
    let connections = list_cluster_connections(client).await?;
    let mut added = None;
    if connections.iter().any(|c| {
        c.name_any() == used && !has_finalizer(c) && c.metadata.deletion_timestamp.is_none()
    }) {
        let object = ObjectName::cluster_scoped("ClusterConnection", used);
        if add_finalizer(&api, &object).await? {
            added = Some(object);
        }
    }
    for connection in connections.iter().filter(|c| {
        c.name_any() != used && has_finalizer(*c) && c.metadata.deletion_timestamp.is_some()
    }) {
        release_cluster_connection(client, &connection.name_any(), None).await?;
    }
    Ok(added)
}

/// Removes the finalizer from the ClusterConnection `name` unless a TWD other than `leaving`
/// uses it (live, or still holding its own finalizer).
async fn release_cluster_connection(
    client: &Client,
    name: &str,
    leaving: Option<&TwdRef>,
) -> Result<(), K8sError> {
    let users = cluster_connection_users(client, name).await?;
    if still_used(&users, leaving) {
        return Ok(());
    }
    let api: Api<ClusterConnection> = Api::all(client.clone());
    remove_finalizer(&api, &ObjectName::cluster_scoped("ClusterConnection", name)).await
}

/// Whether one of `users` other than `leaving` still needs the connection: it is live, or it
/// still holds its own finalizer (its cleanup may still use the connection). Both kinds of a
/// leaving TWD's name are leaving.
fn still_used(users: &[WorkerObject], leaving: Option<&TwdRef>) -> bool {
    users.iter().any(|t| {
        let this = leaving.is_some_and(|l| {
            t.namespace().as_deref() == Some(l.namespace.as_str()) && t.name_any() == l.name
        });
        !this && (t.metadata.deletion_timestamp.is_none() || has_finalizer(&t.object))
    })
}

/// The TWDs (of either kind) of every namespace whose `connectionRef` names the
/// ClusterConnection `name`: a field selector on `spec.workerOptions.connectionRef.name` (a
/// `selectableField` of the CRDs), or, where an installed CRD predates it, a filter over all.
async fn cluster_connection_users(
    client: &Client,
    name: &str,
) -> Result<Vec<WorkerObject>, K8sError> {
    let selected =
        ListParams::default().fields(&format!("spec.workerOptions.connectionRef.name={name}"));
    let twds = match list_workers(client, None, &selected).await {
        Ok(list) => list,
        Err(K8sError::Api {
            source: kube::Error::Api(status),
            ..
        }) if status.code == 400 => list_workers(client, None, &ListParams::default()).await?,
        Err(e) => return Err(e),
    };
    Ok(twds
        .into_iter()
        .filter(|t| {
            let reference = &t.spec.worker_options.connection_ref;
            reference.kind == ConnectionKind::ClusterConnection && reference.name == name
        })
        .collect())
}

/// Every ClusterConnection; none when the API server does not serve them (CRD not installed).
async fn list_cluster_connections(client: &Client) -> Result<Vec<ClusterConnection>, K8sError> {
    let api: Api<ClusterConnection> = Api::all(client.clone());
    let scope = ObjectName::cluster_scoped("ClusterConnection", "(all)");
    match api.list(&ListParams::default()).await {
        Ok(list) => Ok(list.items),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(Vec::new()),
        Err(e) => Err(K8sError::api("list", &scope)(e)),
    }
}

/// Removes the finalizer from the TWD (call on the deletion path, once Temporal is cleaned up)
/// and from any other object of its name being deleted, from every connection in its namespace
/// that no remaining TWD references, and from the ClusterConnection it used if no other TWD
/// uses it (released first: once the TWD's finalizer is gone, so is the TWD, and with it the
/// record of what it used).
pub async fn release_finalizers(
    client: &Client,
    access: ClusterAccess,
    twd: &TwdRef,
) -> Result<(), K8sError> {
    let objects = read_claimants(client, twd).await?;
    if access == ClusterAccess::Granted {
        for resource in &objects {
            let reference = &resource.spec.worker_options.connection_ref;
            if reference.kind == ConnectionKind::ClusterConnection {
                release_cluster_connection(client, &reference.name, Some(twd)).await?;
            }
        }
    }
    for resource in objects.iter().filter(|o| o.deleting()) {
        release_worker(client, resource).await?;
    }
    release_unreferenced_connections(client, &twd.namespace).await
}

/// Removes the finalizer from one worker deployment object.
pub async fn release_worker(client: &Client, resource: &WorkerObject) -> Result<(), K8sError> {
    let namespace = resource.namespace().unwrap_or_default();
    let api = worker_api(client, &namespace, resource.kind);
    let object = worker_object_name(resource.kind, &namespace, &resource.name_any());
    remove_finalizer(&api, &object).await
}

/// Removes the finalizer from connections in `namespace` that no TWD needs.
async fn release_unreferenced_connections(
    client: &Client,
    namespace: &str,
) -> Result<(), K8sError> {
    let connections = list_connections(client, namespace).await?;
    release_unused(client, namespace, &connections.iter().collect::<Vec<_>>()).await
}

/// Removes the finalizer from those of `connections` no TWD needs: a TWD counts while it is live
/// or still holds its own finalizer (its cleanup may still use the connection). Lists the TWDs
/// only when one of `connections` holds the finalizer.
async fn release_unused(
    client: &Client,
    namespace: &str,
    connections: &[&NamespacedConnection],
) -> Result<(), K8sError> {
    if !connections.iter().any(|c| c.protected) {
        return Ok(());
    }
    let in_use: BTreeSet<(ConnectionKind, String)> =
        list_workers(client, Some(namespace), &ListParams::default())
            .await?
            .into_iter()
            .filter(|t| t.metadata.deletion_timestamp.is_none() || has_finalizer(&t.object))
            .map(|t| t.object.spec.worker_options.connection_ref)
            .filter(|r| r.kind.is_in_namespace())
            .map(|r| (r.kind, r.name))
            .collect();
    for connection in connections
        .iter()
        .filter(|c| c.protected && !in_use.contains(&(c.kind, c.name.clone())))
    {
        let api = connection_api(client, namespace, connection.kind);
        remove_finalizer(&api, &connection.object(namespace)).await?;
    }
    Ok(())
}

/// The Connections and TemporalConnections of `namespace` (a kind the API server does not
/// serve has none).
async fn list_connections(
    client: &Client,
    namespace: &str,
) -> Result<Vec<NamespacedConnection>, K8sError> {
    let mut found = Vec::new();
    for kind in [
        ConnectionKind::Connection,
        ConnectionKind::TemporalConnection,
    ] {
        let scope = ObjectName::new(kind.as_str(), namespace, "(all)");
        let listed = match connection_api(client, namespace, kind)
            .list(&ListParams::default())
            .await
        {
            Ok(list) => list.items,
            Err(kube::Error::Api(status)) if status.code == 404 => Vec::new(),
            Err(e) => return Err(K8sError::api("list", &scope)(e)),
        };
        found.extend(listed.into_iter().map(|c| NamespacedConnection {
            kind,
            protected: has_finalizer(&c),
            deleting: c.metadata.deletion_timestamp.is_some(),
            name: c.name_any(),
        }));
    }
    Ok(found)
}

fn has_finalizer<K: Resource>(object: &K) -> bool {
    object
        .finalizers()
        .iter()
        .any(|f| f == DELETE_PROTECTION_FINALIZER)
}

/// Whether a connection just read lacks the delete-protection finalizer and is not being
/// deleted (only then may [`add_finalizer`] add it).
fn needs_protection(connection: &Connection) -> bool {
    let protected = match connection {
        Connection::Namespaced(c) => has_finalizer(c),
        Connection::Cluster(c) => has_finalizer(c),
    };
    !protected && !connection.is_deleting()
}

/// Adds the finalizer unless the object is missing, being deleted, or already has it; returns
/// whether it added it.
async fn add_finalizer<K>(api: &Api<K>, object: &ObjectName) -> Result<bool, K8sError>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    retry_on_conflict("add finalizer to", object, || async {
        let Some(current) = api
            .get_opt(&object.name)
            .await
            .map_err(K8sError::api("get", object))?
        else {
            return Ok(false);
        };
        if current.meta().deletion_timestamp.is_some() || has_finalizer(&current) {
            return Ok(false);
        }
        let mut finalizers = current.finalizers().to_vec();
        finalizers.push(DELETE_PROTECTION_FINALIZER.to_owned());
        patch_finalizers(api, object, &current, finalizers).await?;
        tracing::info!(%object, "added finalizer");
        Ok(true)
    })
    .await
}

/// Removes the finalizer if the object exists and has it.
async fn remove_finalizer<K>(api: &Api<K>, object: &ObjectName) -> Result<(), K8sError>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    retry_on_conflict("remove finalizer from", object, || async {
        let Some(current) = api
            .get_opt(&object.name)
            .await
            .map_err(K8sError::api("get", object))?
        else {
            return Ok(());
        };
        if !has_finalizer(&current) {
            return Ok(());
        }
        let finalizers = current
            .finalizers()
            .iter()
            .filter(|f| *f != DELETE_PROTECTION_FINALIZER)
            .cloned()
            .collect();
        match patch_finalizers(api, object, &current, finalizers).await {
            Ok(()) => tracing::info!(%object, "removed finalizer"),
            // Deleted between the read and the write (another release removed the last
            // finalizer first): nothing holds it any more, which is what was asked.
            Err(K8sError::Api { source, .. }) if is_not_found(&source) => {
                tracing::debug!(%object, "already gone when its finalizer was removed");
            }
            Err(e) => return Err(e),
        }
        Ok(())
    })
    .await
}

async fn patch_finalizers<K>(
    api: &Api<K>,
    object: &ObjectName,
    current: &K,
    finalizers: Vec<String>,
) -> Result<(), K8sError>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let patch = json!({ "metadata": { "finalizers": finalizers, "resourceVersion": current.resource_version() } });
    api.patch(&object.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(K8sError::api("patch finalizers of", object))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use kube::api::ObjectMeta;
    use twc_crds::worker_deployment::ConnectionReference;

    use super::*;
    use crate::k8s::fake_api;

    /// A TWD `namespace/name`, being deleted or not, holding its finalizer or not.
    fn twd(namespace: &str, name: &str, deleting: bool, held: bool) -> WorkerObject {
        twc_crds::TemporalWorkerDeployment {
            metadata: ObjectMeta {
                namespace: Some(namespace.into()),
                name: Some(name.into()),
                deletion_timestamp: deleting.then(|| Time(Timestamp::now())),
                finalizers: held.then(|| vec![DELETE_PROTECTION_FINALIZER.to_owned()]),
                ..Default::default()
            },
            spec: twc_crds::worker_deployment::test_support::spec_with_image("w:v1"),
            status: None,
        }
        .into()
    }

    #[test]
    fn a_cluster_connection_is_released_when_no_other_twd_needs_it() {
        let leaving = TwdRef {
            namespace: "team-a".into(),
            name: "hello".into(),
        };
        // (what, its users, the TWD being released, still used)
        let cases = [
            ("no users", vec![], None, false),
            (
                "a live user",
                vec![twd("team-b", "hello", false, true)],
                None,
                true,
            ),
            (
                "only the TWD being released",
                vec![twd("team-a", "hello", true, true)],
                Some(&leaving),
                false,
            ),
            (
                "the same name in another namespace",
                vec![
                    twd("team-a", "hello", true, true),
                    twd("team-b", "hello", false, false),
                ],
                Some(&leaving),
                true,
            ),
            (
                "another user still cleaning up",
                vec![twd("team-b", "other", true, true)],
                Some(&leaving),
                true,
            ),
            (
                "another user deleted and released",
                vec![twd("team-b", "other", true, false)],
                Some(&leaving),
                false,
            ),
        ];
        for (what, users, leaving, expected) in cases {
            assert_eq!(still_used(&users, leaving), expected, "{what}");
        }
    }

    /// Says that no other connection of any namespace may be released.
    struct NothingToRelease;

    impl KnownConnections for NothingToRelease {
        fn may_release(&self, _: &str, _: &ConnectionReference) -> Option<bool> {
            Some(false)
        }

        fn may_release_cluster(&self, _: &str) -> Option<bool> {
            Some(false)
        }
    }

    /// The TemporalConnection `dev` of `team-a`, protected or not.
    fn connection(protected: bool) -> Connection {
        Connection::Namespaced(twc_crds::TemporalConnection {
            metadata: ObjectMeta {
                namespace: Some("team-a".into()),
                name: Some("dev".into()),
                finalizers: protected.then(|| vec![DELETE_PROTECTION_FINALIZER.to_owned()]),
                ..Default::default()
            },
            spec: twc_crds::TemporalConnectionSpec {
                host_port: "temporal:7233".into(),
                tls: None,
                mutual_tls_secret_ref: None,
                api_key_secret_ref: None,
                worker_credentials: None,
            },
            status: None,
        })
    }

    #[tokio::test]
    async fn a_connection_just_read_as_protected_is_not_read_again() {
        let get = "GET /apis/temporal.io/v1alpha1/namespaces/team-a/temporalconnections/dev";
        // (what the caller read of the used connection, the requests made)
        let cases = [
            ("nothing", None, vec![get]),
            ("protected", Some(connection(true)), vec![]),
            ("unprotected", Some(connection(false)), vec![get]),
        ];
        for (what, used, expected) in cases {
            let path = get.trim_start_matches("GET ").to_owned();
            let missing = fake_api::not_found("temporalconnections", "dev");
            let (client, seen) = fake_api::recording_client(vec![(path, missing)]);
            let resource = twd("team-a", "hello", false, true);
            let added = restore_finalizers(
                &client,
                ClusterAccess::Restricted,
                &resource,
                Some(&NothingToRelease),
                used.as_ref(),
            )
            .await;
            assert!(added.is_ok_and(|a| a.is_empty()), "{what}");
            let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
            assert_eq!(seen, expected, "{what}");
        }
    }
}
