//! Status writes through the status subresource: merge patches guarded by the resourceVersion
//! just read (retried on conflict), skipped when nothing but timestamps would change.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use twc_crds::connection::TemporalConnectionStatus;
use twc_crds::worker_deployment::TemporalWorkerDeploymentStatus;
use twc_crds::worker_deployment::{ConnectionKind, ConnectionReference};
use twc_crds::{
    ClusterConnection, Connection, TemporalConnection, TemporalWorkerDeployment, WorkerKind,
};
use twc_workflows::model::TwdRef;

use super::conditions::{carry_transition_times, merge_patch, status_changed, upsert_condition};
use super::connection::connection_object;
use super::error::{K8sError, ObjectName};
use super::lookup::get_if_exists;
use super::retry::retry_on_conflict;
use super::twd::{get_twd, parse_worker, worker_api, worker_object_name};

/// Condition type on a TemporalConnection.
pub const CONNECTION_READY: &str = "Ready";

/// What a status write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusWrite {
    /// The status was patched.
    Written,
    /// Nothing but timestamps would have changed; no request was sent.
    Unchanged,
    /// The object does not exist.
    NotFound,
}

/// Makes the TWD's status `status`, keeping each condition's `lastTransitionTime` when its
/// status did not change, and skipping the write when only `rollout.updatedAt` or transition
/// times differ.
pub async fn write_twd_status(
    client: &Client,
    twd: &TwdRef,
    status: TemporalWorkerDeploymentStatus,
) -> Result<StatusWrite, K8sError> {
    write_twd_status_seen(client, twd, status)
        .await
        .map(|(write, _)| write)
}

/// [`write_twd_status`], also returning the TWD as read just before the write (`None` when it
/// does not exist), for callers that compare the old status with the new one. The status is
/// written on the claim holder of the TWD's name.
pub async fn write_twd_status_seen(
    client: &Client,
    twd: &TwdRef,
    status: TemporalWorkerDeploymentStatus,
) -> Result<(StatusWrite, Option<Box<TemporalWorkerDeployment>>), K8sError> {
    let Some(holder) = get_twd(client, twd).await? else {
        return Ok((StatusWrite::NotFound, None));
    };
    // The holder just read is the first try's object: read again only after a conflict.
    write_status_from(
        client,
        holder.kind,
        twd,
        status,
        Some(Box::new(holder.object)),
    )
    .await
}

/// Makes the status of the object of `kind` named like `twd` `status` (see [`write_twd_status`]).
pub async fn write_worker_status(
    client: &Client,
    kind: WorkerKind,
    twd: &TwdRef,
    status: TemporalWorkerDeploymentStatus,
) -> Result<(StatusWrite, Option<Box<TemporalWorkerDeployment>>), K8sError> {
    write_status_from(client, kind, twd, status, None).await
}

/// [`write_worker_status`], its first try on `read` when given (the object as just read),
/// every later try (after a conflict) on the object read again.
async fn write_status_from(
    client: &Client,
    kind: WorkerKind,
    twd: &TwdRef,
    status: TemporalWorkerDeploymentStatus,
    read: Option<Box<TemporalWorkerDeployment>>,
) -> Result<(StatusWrite, Option<Box<TemporalWorkerDeployment>>), K8sError> {
    let object = &worker_object_name(kind, &twd.namespace, &twd.name);
    let api = &worker_api(client, &twd.namespace, kind);
    let status = &status;
    // Taken by the first try only.
    let mut read = read;
    retry_on_conflict("write status of", object, || {
        let given = read.take();
        async move {
            let current = match given {
                Some(current) => *current,
                None => {
                    let Some(read) = get_if_exists(api, &twd.name)
                        .await
                        .map_err(K8sError::api("get", object))?
                    else {
                        return Ok((StatusWrite::NotFound, None));
                    };
                    parse_worker(kind, read, object)?.object
                }
            };
            let mut desired = status.clone();
            let current_conditions = current
                .status
                .as_ref()
                .map(|s| s.conditions.as_slice())
                .unwrap_or_default();
            carry_transition_times(&mut desired.conditions, current_conditions);
            if !status_changed(current.status.as_ref(), &desired) {
                tracing::debug!(%object, "status unchanged; not writing");
                return Ok((StatusWrite::Unchanged, Some(Box::new(current))));
            }
            patch_status(
                api,
                object,
                current.resource_version(),
                current.status.as_ref(),
                &desired,
            )
            .await?;
            tracing::debug!(%object, "wrote status");
            Ok((StatusWrite::Written, Some(Box::new(current))))
        }
    })
    .await
}

/// Sets the `Ready` condition (reasons `Connected`, `AuthSecretInvalid`,
/// `TemporalClientCreationFailed`) of the connection `reference` names for a TWD in `namespace`
/// (a TemporalConnection there, or a ClusterConnection), keeping its transition time when
/// `ready` did not change.
pub async fn write_connection_status(
    client: &Client,
    namespace: &str,
    reference: &ConnectionReference,
    ready: bool,
    reason: &str,
    message: &str,
) -> Result<StatusWrite, K8sError> {
    let object = connection_object(namespace, reference);
    let ready = Ready {
        ready,
        reason,
        message,
    };
    match reference.kind {
        ConnectionKind::TemporalConnection => {
            let api: Api<TemporalConnection> = Api::namespaced(client.clone(), namespace);
            write_ready(&api, &object, |c| c.status.as_ref(), &ready).await
        }
        ConnectionKind::Connection => {
            let api: Api<Connection> = Api::namespaced(client.clone(), namespace);
            write_ready(&api, &object, |c| c.status.as_ref(), &ready).await
        }
        ConnectionKind::ClusterConnection => {
            let api: Api<ClusterConnection> = Api::all(client.clone());
            write_ready(&api, &object, |c| c.status.as_ref(), &ready).await
        }
    }
}

/// A connection's `Ready` condition to write.
struct Ready<'a> {
    ready: bool,
    reason: &'a str,
    message: &'a str,
}

/// [`write_connection_status`] for either kind of connection.
async fn write_ready<K>(
    api: &Api<K>,
    object: &ObjectName,
    status_of: impl Fn(&K) -> Option<&TemporalConnectionStatus>,
    ready: &Ready<'_>,
) -> Result<StatusWrite, K8sError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let Ready {
        ready,
        reason,
        message,
    } = *ready;
    retry_on_conflict("write status of", object, || async {
        let Some(current) = get_if_exists(api, &object.name)
            .await
            .map_err(K8sError::api("get", object))?
        else {
            return Ok(StatusWrite::NotFound);
        };
        let generation = current.meta().generation;
        let current_status = status_of(&current);
        let mut desired = current_status.cloned().unwrap_or_default();
        desired.observed_generation = generation;
        upsert_condition(
            &mut desired.conditions,
            Condition {
                type_: CONNECTION_READY.into(),
                status: if ready { "True" } else { "False" }.into(),
                reason: reason.into(),
                message: message.into(),
                observed_generation: generation,
                last_transition_time: Time(Timestamp::now()),
            },
        );
        if current_status == Some(&desired) {
            return Ok(StatusWrite::Unchanged);
        }
        patch_status(
            api,
            object,
            current.resource_version(),
            current_status,
            &desired,
        )
        .await?;
        tracing::debug!(%object, ready, reason, "wrote connection status");
        Ok(StatusWrite::Written)
    })
    .await
}

/// Merge-patches `status` from `current` to `desired`, guarded by `resource_version`.
async fn patch_status<K, S>(
    api: &Api<K>,
    object: &ObjectName,
    resource_version: Option<String>,
    current: Option<&S>,
    desired: &S,
) -> Result<(), K8sError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    S: serde::Serialize,
{
    let encode = |source| K8sError::Encode {
        object: object.clone(),
        source,
    };
    let desired = serde_json::to_value(desired).map_err(encode)?;
    let status = match current
        .map(serde_json::to_value)
        .transpose()
        .map_err(encode)?
    {
        Some(current @ Value::Object(_)) => merge_patch(&current, &desired),
        _ => desired,
    };
    let patch = json!({ "metadata": { "resourceVersion": resource_version }, "status": status });
    api.patch_status(&object.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(K8sError::api("patch status of", object))?;
    Ok(())
}
