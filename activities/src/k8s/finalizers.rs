//! The `temporal.io/delete-protection` finalizer on TWDs (so deletion waits for cleanup in
//! Temporal) and on the TemporalConnections they use (so a connection in use is deleted last).
//!
//! Finalizer lists are merge-patched with the resourceVersion just read and retried on
//! conflict, so finalizers that others add at the same time are never lost.

use std::collections::BTreeSet;
use std::fmt::Debug;

use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;
use twc_crds::labels::DELETE_PROTECTION_FINALIZER;
use twc_crds::{TemporalConnection, TemporalWorkerDeployment};
use twc_workflows::model::TwdRef;

use super::error::{K8sError, ObjectName};
use super::retry::retry_on_conflict;
use super::twd::get_twd;

/// Adds the finalizer to the TWD and to the TemporalConnection it references (neither when the
/// TWD is being deleted; not to a connection that is missing or being deleted), then releases
/// connections in the namespace that no TWD references any more (e.g. after a
/// `connectionRef` change).
pub async fn ensure_finalizers(client: &Client, twd: &TwdRef) -> Result<(), K8sError> {
    match get_twd(client, twd).await? {
        Some(resource) => restore_finalizers(client, &resource).await.map(drop),
        None => Ok(()),
    }
}

/// [`ensure_finalizers`] for a TWD just read: returns the objects it added the finalizer to.
/// When nothing is missing it only lists the namespace's connections (and its TWDs when
/// another connection still holds the finalizer).
pub async fn restore_finalizers(
    client: &Client,
    resource: &TemporalWorkerDeployment,
) -> Result<Vec<ObjectName>, K8sError> {
    let namespace = resource.namespace().unwrap_or_default();
    if resource.metadata.deletion_timestamp.is_some() {
        return Ok(Vec::new());
    }
    let connections = list_connections(client, &namespace).await?;
    let connections_api: Api<TemporalConnection> = Api::namespaced(client.clone(), &namespace);
    let connection_name = &resource.spec.worker_options.connection_ref.name;
    let mut added = Vec::new();
    let referenced = connections
        .iter()
        .find(|c| c.name_any() == *connection_name);
    if referenced.is_some_and(|c| !has_finalizer(c) && c.metadata.deletion_timestamp.is_none()) {
        let object = ObjectName::new("TemporalConnection", &namespace, connection_name);
        if add_finalizer(&connections_api, &object).await? {
            added.push(object);
        }
    }
    if !has_finalizer(resource) {
        let twds: Api<TemporalWorkerDeployment> = Api::namespaced(client.clone(), &namespace);
        let object = ObjectName::new("TemporalWorkerDeployment", &namespace, &resource.name_any());
        if add_finalizer(&twds, &object).await? {
            added.push(object);
        }
    }
    // This TWD is live and uses its connection; only other protected connections may be unused.
    let others: Vec<&TemporalConnection> = connections
        .iter()
        .filter(|c| c.name_any() != *connection_name)
        .collect();
    release_unused(client, &namespace, &others).await?;
    Ok(added)
}

/// Removes the finalizer from the TWD (call on the deletion path, once Temporal is cleaned up)
/// and from every TemporalConnection in its namespace that no remaining TWD references.
pub async fn release_finalizers(client: &Client, twd: &TwdRef) -> Result<(), K8sError> {
    let twds: Api<TemporalWorkerDeployment> = Api::namespaced(client.clone(), &twd.namespace);
    let object = ObjectName::new("TemporalWorkerDeployment", &twd.namespace, &twd.name);
    remove_finalizer(&twds, &object).await?;
    release_unreferenced_connections(client, &twd.namespace).await
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
    connections: &[&TemporalConnection],
) -> Result<(), K8sError> {
    let protected: Vec<String> = connections
        .iter()
        .filter(|c| has_finalizer(**c))
        .map(|c| c.name_any())
        .collect();
    if protected.is_empty() {
        return Ok(());
    }
    let twds: Api<TemporalWorkerDeployment> = Api::namespaced(client.clone(), namespace);
    let scope = ObjectName::new("Namespace", namespace, namespace);
    let in_use: BTreeSet<String> = twds
        .list(&ListParams::default())
        .await
        .map_err(K8sError::api("list TemporalWorkerDeployments in", &scope))?
        .items
        .into_iter()
        .filter(|t| t.metadata.deletion_timestamp.is_none() || has_finalizer(t))
        .map(|t| t.spec.worker_options.connection_ref.name)
        .collect();
    let api: Api<TemporalConnection> = Api::namespaced(client.clone(), namespace);
    for name in protected.iter().filter(|n| !in_use.contains(*n)) {
        remove_finalizer(
            &api,
            &ObjectName::new("TemporalConnection", namespace, name),
        )
        .await?;
    }
    Ok(())
}

async fn list_connections(
    client: &Client,
    namespace: &str,
) -> Result<Vec<TemporalConnection>, K8sError> {
    let api: Api<TemporalConnection> = Api::namespaced(client.clone(), namespace);
    let scope = ObjectName::new("Namespace", namespace, namespace);
    Ok(api
        .list(&ListParams::default())
        .await
        .map_err(K8sError::api("list TemporalConnections in", &scope))?
        .items)
}

fn has_finalizer<K: Resource>(object: &K) -> bool {
    object
        .finalizers()
        .iter()
        .any(|f| f == DELETE_PROTECTION_FINALIZER)
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
        patch_finalizers(api, object, &current, finalizers).await?;
        tracing::info!(%object, "removed finalizer");
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
