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

/// Adds the finalizer to the TWD and to the TemporalConnection it references (neither when the
/// TWD is being deleted; not to a connection that is missing or being deleted), then releases
/// connections in the namespace that no TWD references any more (e.g. after a
/// `connectionRef` change).
pub async fn ensure_finalizers(client: &Client, twd: &TwdRef) -> Result<(), K8sError> {
    let twds: Api<TemporalWorkerDeployment> = Api::namespaced(client.clone(), &twd.namespace);
    let object = ObjectName::new("TemporalWorkerDeployment", &twd.namespace, &twd.name);
    let Some(resource) = twds
        .get_opt(&twd.name)
        .await
        .map_err(K8sError::api("get", &object))?
    else {
        return Ok(());
    };
    if resource.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let connections: Api<TemporalConnection> = Api::namespaced(client.clone(), &twd.namespace);
    let connection_name = &resource.spec.worker_options.connection_ref.name;
    let connection = ObjectName::new("TemporalConnection", &twd.namespace, connection_name);
    add_finalizer(&connections, &connection).await?;
    add_finalizer(&twds, &object).await?;
    release_unreferenced_connections(client, &twd.namespace).await
}

/// Removes the finalizer from the TWD (call on the deletion path, once Temporal is cleaned up)
/// and from every TemporalConnection in its namespace that no remaining TWD references.
pub async fn release_finalizers(client: &Client, twd: &TwdRef) -> Result<(), K8sError> {
    let twds: Api<TemporalWorkerDeployment> = Api::namespaced(client.clone(), &twd.namespace);
    let object = ObjectName::new("TemporalWorkerDeployment", &twd.namespace, &twd.name);
    remove_finalizer(&twds, &object).await?;
    release_unreferenced_connections(client, &twd.namespace).await
}

/// Removes the finalizer from connections in `namespace` that no TWD needs: a TWD counts while
/// it is live or still holds its own finalizer (its cleanup may still use the connection).
async fn release_unreferenced_connections(
    client: &Client,
    namespace: &str,
) -> Result<(), K8sError> {
    let twds: Api<TemporalWorkerDeployment> = Api::namespaced(client.clone(), namespace);
    let connections: Api<TemporalConnection> = Api::namespaced(client.clone(), namespace);
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
    let protected = connections
        .list(&ListParams::default())
        .await
        .map_err(K8sError::api("list TemporalConnections in", &scope))?
        .items
        .into_iter()
        .filter(|c| has_finalizer(c) && !in_use.contains(&c.name_any()));
    for connection in protected {
        remove_finalizer(
            &connections,
            &ObjectName::new("TemporalConnection", namespace, &connection.name_any()),
        )
        .await?;
    }
    Ok(())
}

fn has_finalizer<K: Resource>(object: &K) -> bool {
    object
        .finalizers()
        .iter()
        .any(|f| f == DELETE_PROTECTION_FINALIZER)
}

/// Adds the finalizer unless the object is missing, being deleted, or already has it.
async fn add_finalizer<K>(api: &Api<K>, object: &ObjectName) -> Result<(), K8sError>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    retry_on_conflict("add finalizer to", object, || async {
        let Some(current) = api
            .get_opt(&object.name)
            .await
            .map_err(K8sError::api("get", object))?
        else {
            return Ok(());
        };
        if current.meta().deletion_timestamp.is_some() || has_finalizer(&current) {
            return Ok(());
        }
        let mut finalizers = current.finalizers().to_vec();
        finalizers.push(DELETE_PROTECTION_FINALIZER.to_owned());
        patch_finalizers(api, object, &current, finalizers).await?;
        tracing::info!(%object, "added finalizer");
        Ok(())
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
