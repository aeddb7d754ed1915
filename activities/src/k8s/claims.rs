//! What happens to the objects of a TWD's name that do not hold the claim on its Temporal
//! Worker Deployment ([`super::twd::Claim`]).
//!
//! - A live one is refused: its status says which object holds the claim (`DuplicateClaim`,
//!   with a Warning event when that first shows) and nothing else is done for it.
//! - One being deleted hands over to the holder: the Deployments it controls are re-owned by
//!   the holder (an owner-reference change: no pod restarts) and its finalizer is removed,
//!   without touching Temporal, whose versions and routing the holder keeps as they are. This
//!   is how a `TemporalWorkerDeployment` moves to a `WorkerDeployment` of the same name.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use twc_crds::{WorkerObject, labels, naming};
use twc_workflows::contract::{EventKind, ResourceChange};
use twc_workflows::model::TwdRef;
use twc_workflows::plan::conditions::REASON_DUPLICATE_CLAIM;
use twc_workflows::plan::status;

use super::deployment_builder::controller_reference;
use super::deployment_view::is_controlled_by;
use super::error::{K8sError, ObjectName};
use super::events::emit_event_on;
use super::finalizers::release_worker;
use super::status::{StatusWrite, write_worker_status};
use super::twd::Claim;

/// Event reason on the holder when it took over from an object of its name being deleted.
pub const TOOK_OVER: &str = "TookOver";

/// Refuses the live objects of `claim.others` and hands over from those being deleted; returns
/// the hand-overs done (Normal events on the holder).
pub async fn settle_others(
    client: &Client,
    claim: &Claim,
) -> Result<Vec<ResourceChange>, K8sError> {
    let mut changes = Vec::new();
    if claim.holder.deleting() {
        // Everything of this name is being deleted: the deletion path cleans up and releases.
        return Ok(changes);
    }
    for other in &claim.others {
        if other.deleting() {
            changes.push(hand_over(client, other, &claim.holder).await?);
        } else {
            refuse(client, other, &claim.holder).await?;
        }
    }
    Ok(changes)
}

/// Shows on `other` that `holder` drives its name's Temporal Worker Deployment; the Warning
/// event goes out when the status first says so.
async fn refuse(
    client: &Client,
    other: &WorkerObject,
    holder: &WorkerObject,
) -> Result<(), K8sError> {
    let twd = twd_ref(other);
    let refused = status::refused(
        other.kind.as_str(),
        &holder.describe(),
        &twd.key(),
        other.metadata.generation.unwrap_or_default(),
        Timestamp::now().as_millisecond(),
    );
    let message = refused.conditions[0].message.clone();
    let (written, before) = write_worker_status(client, other.kind, &twd, refused).await?;
    let shown_before = before.and_then(|b| b.status).is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.reason == REASON_DUPLICATE_CLAIM)
    });
    if written == StatusWrite::Written && !shown_before {
        tracing::warn!(object = %other.describe(), holder = %holder.describe(), "refused: {message}");
        emit_event_on(
            client,
            other,
            EventKind::Warning,
            (REASON_DUPLICATE_CLAIM, &message),
            None,
        )
        .await?;
    }
    Ok(())
}

/// Re-owns the Deployments `leaving` controls to `holder`, then releases `leaving`.
async fn hand_over(
    client: &Client,
    leaving: &WorkerObject,
    holder: &WorkerObject,
) -> Result<ResourceChange, K8sError> {
    let twd = twd_ref(holder);
    let api: Api<Deployment> = Api::namespaced(client.clone(), &twd.namespace);
    let selector = format!(
        "{}={}",
        labels::DEPLOYMENT_NAME,
        naming::deployment_name_label(&twd.name)
    );
    let scope = ObjectName::new(leaving.kind.as_str(), &twd.namespace, &twd.name);
    let deployments = api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(K8sError::api("list Deployments of", &scope))?
        .items;
    let mut moved = Vec::new();
    for deployment in deployments
        .iter()
        .filter(|d| is_controlled_by(d, leaving.object_uid()))
    {
        let name = deployment.name_any();
        let mut owners: Vec<_> = deployment
            .owner_references()
            .iter()
            .filter(|o| o.uid != leaving.object_uid())
            .cloned()
            .collect();
        owners.push(controller_reference(holder));
        let patch = json!({ "metadata": {
            "ownerReferences": owners,
            "resourceVersion": deployment.resource_version(),
        }});
        let object = ObjectName::new("Deployment", &twd.namespace, &name);
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(K8sError::api("re-own", &object))?;
        moved.push(name);
    }
    release_worker(client, leaving).await?;
    let message = format!(
        "{} took over Temporal worker deployment {} from {} (being deleted): its versions and \
         routing are kept as they are; Deployments now controlled by it: {}",
        holder.describe(),
        twd.key(),
        leaving.describe(),
        if moved.is_empty() {
            "none".to_owned()
        } else {
            moved.join(", ")
        }
    );
    tracing::info!(twd = %twd.key(), "{message}");
    Ok(ResourceChange {
        reason: TOOK_OVER.to_owned(),
        message,
    })
}

fn twd_ref(object: &WorkerObject) -> TwdRef {
    TwdRef {
        namespace: object.namespace().unwrap_or_default(),
        name: object.name_any(),
    }
}
