//! Deleting versions and worker deployments.

use temporalio_client::{grpc::WorkflowService, tonic::IntoRequest};
use temporalio_common::protos::temporal::api::workflowservice::v1::{
    DeleteWorkerDeploymentRequest, DeleteWorkerDeploymentVersionRequest,
};
use tracing::{debug, info};
use twc_workflows::contract::DeleteVersionOutcome;

use crate::temporal::{
    convert::version_ref,
    error::{StatusClass, TemporalError},
    pool::TemporalClient,
};

/// Deletes a version. A version that is not there counts as deleted. The server's refusals that
/// time resolves (active pollers, still draining, current or ramping) give
/// [`DeleteVersionOutcome::NotYet`] with the server message, as does any other
/// `FailedPrecondition`. `skip_drainage` deletes even with open pinned workflows (TWD deletion
/// only). `Err` for everything else (transient failures included).
pub async fn delete_version(
    client: &TemporalClient,
    namespace: &str,
    deployment_name: &str,
    build_id: &str,
    skip_drainage: bool,
    identity: &str,
) -> Result<DeleteVersionOutcome, TemporalError> {
    let request = DeleteWorkerDeploymentVersionRequest {
        namespace: namespace.to_owned(),
        deployment_version: Some(version_ref(deployment_name, build_id)),
        skip_drainage,
        identity: identity.to_owned(),
        ..Default::default()
    };
    let mut raw = client.raw().clone();
    let result = client
        .observe(
            "DeleteWorkerDeploymentVersion",
            WorkflowService::delete_worker_deployment_version(&mut raw, request.into_request()),
        )
        .await;
    match result {
        Ok(_) => {
            info!(%namespace, %deployment_name, %build_id, skip_drainage, "deleted worker deployment version");
            Ok(DeleteVersionOutcome::Deleted)
        }
        Err(status) => outcome(client.rpc_error(
            "DeleteWorkerDeploymentVersion",
            format!("{deployment_name}:{build_id}"),
            &status,
        )),
    }
}

/// Deletes a worker deployment (the server allows it only once it has no versions). Missing
/// counts as deleted; refusals give [`DeleteVersionOutcome::NotYet`]. `Err` otherwise.
pub async fn delete_worker_deployment(
    client: &TemporalClient,
    namespace: &str,
    deployment_name: &str,
    identity: &str,
) -> Result<DeleteVersionOutcome, TemporalError> {
    let request = DeleteWorkerDeploymentRequest {
        namespace: namespace.to_owned(),
        deployment_name: deployment_name.to_owned(),
        identity: identity.to_owned(),
    };
    let mut raw = client.raw().clone();
    match client
        .observe(
            "DeleteWorkerDeployment",
            WorkflowService::delete_worker_deployment(&mut raw, request.into_request()),
        )
        .await
    {
        Ok(_) => {
            info!(%namespace, %deployment_name, "deleted worker deployment");
            Ok(DeleteVersionOutcome::Deleted)
        }
        Err(status) => {
            outcome(client.rpc_error("DeleteWorkerDeployment", deployment_name, &status))
        }
    }
}

fn outcome(err: TemporalError) -> Result<DeleteVersionOutcome, TemporalError> {
    match err.class() {
        StatusClass::NotFound => Ok(DeleteVersionOutcome::Deleted),
        StatusClass::FailedPrecondition => {
            debug!(error = %err, "deletion refused for now");
            Ok(DeleteVersionOutcome::NotYet {
                message: err.server_message(),
            })
        }
        _ => Err(err),
    }
}

#[cfg(test)]
mod tests {
    use temporalio_client::tonic::Status;

    use super::*;

    fn rpc(status: Status) -> TemporalError {
        TemporalError::rpc("DeleteWorkerDeploymentVersion", "d:v1", &status)
    }

    #[test]
    fn maps_outcomes() {
        assert_eq!(
            outcome(rpc(Status::not_found("gone"))).ok(),
            Some(DeleteVersionOutcome::Deleted)
        );
        let msg = "version 'd:v1' cannot be deleted since it has active pollers";
        assert_eq!(
            outcome(rpc(Status::failed_precondition(msg))).ok(),
            Some(DeleteVersionOutcome::NotYet {
                message: msg.to_owned()
            })
        );
        assert!(outcome(rpc(Status::not_found("Namespace x is not found."))).is_err());
        assert!(outcome(rpc(Status::unavailable("down"))).is_err());
    }
}
