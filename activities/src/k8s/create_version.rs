//! The `create_deployment` step as one call: re-read the TWD, make sure the build is still its
//! target, resolve the connection, build the Deployment and create it if absent.

use kube::Client;
use twc_crds::BuildId;
use twc_workflows::contract::CreateDeploymentOutcome;
use twc_workflows::model::{BlockReason, Blocked, TwdRef};
use twc_workflows::plan::spec_view::spec_view;

use super::connection::{ClusterAccess, ResolvedConnection, resolve_connection};
use super::deployment_builder::build_deployment;
use super::deployments::{CreateOutcome, create_deployment_if_absent};
use super::error::{K8sError, ResolveError};
use super::injection::ServerCa;
use super::twd::get_twd;

/// Creates the versioned Deployment of `build_id` unless it exists. `Superseded` when the TWD is
/// gone, being deleted or now asks for another build; `Blocked` for an invalid spec, a
/// connection problem or a request the API server will keep refusing. Transient failures are
/// errors, for the activity to retry.
pub async fn create_versioned_deployment(
    client: &Client,
    access: ClusterAccess,
    twd: &TwdRef,
    build_id: &str,
) -> Result<CreateDeploymentOutcome, K8sError> {
    let Some(resource) = get_twd(client, twd).await? else {
        return Ok(CreateDeploymentOutcome::Superseded);
    };
    let view = spec_view(&resource);
    if view.deleting || view.target_build_id != build_id {
        tracing::info!(twd = %twd.key(), build_id, target = %view.target_build_id, "build superseded; not creating");
        return Ok(CreateDeploymentOutcome::Superseded);
    }
    if !view.invalid.is_empty() {
        let message = view.invalid.join("; ");
        return Ok(CreateDeploymentOutcome::Blocked(Blocked {
            reason: BlockReason::InvalidSpec,
            message,
        }));
    }
    let ResolvedConnection { connection, config } = match resolve_connection(
        client,
        access,
        &twd.namespace,
        &resource.spec.worker_options.connection_ref,
        &view.temporal_namespace,
    )
    .await
    {
        Ok(resolved) => resolved,
        Err(ResolveError::Blocked(blocked)) => {
            return Ok(CreateDeploymentOutcome::Blocked(blocked));
        }
        Err(ResolveError::Transient(e)) => return Err(*e),
    };
    let deployment = build_deployment(
        &resource,
        connection.spec(),
        &BuildId::new(build_id),
        ServerCa::of(&config),
    );
    match create_deployment_if_absent(client, &deployment).await {
        Ok(CreateOutcome::Created { name }) => Ok(CreateDeploymentOutcome::Created { name }),
        Ok(CreateOutcome::Exists { name }) => Ok(CreateDeploymentOutcome::Exists { name }),
        Err(e) => match e.blocked() {
            Some(blocked) => Ok(CreateDeploymentOutcome::Blocked(blocked)),
            None => Err(e),
        },
    }
}
