//! Routing changes: manager identity claim, SetCurrent / SetRamping with conflict tokens, version
//! metadata, and the return to unversioned on TWD deletion.

use std::collections::HashMap;

use temporalio_client::{grpc::WorkflowService, tonic::IntoRequest};
use temporalio_common::protos::temporal::api::workflowservice::v1::{
    SetWorkerDeploymentCurrentVersionRequest, SetWorkerDeploymentManagerRequest,
    SetWorkerDeploymentRampingVersionRequest, UpdateWorkerDeploymentVersionMetadataRequest,
    set_worker_deployment_manager_request::NewManagerIdentity,
};
use tracing::{info, warn};
use twc_workflows::{
    contract::{RoutingChange, RoutingOutcome},
    model::{BlockReason, Blocked, TemporalState},
};

use crate::temporal::{
    convert::{decode_token, json_payload, version_ref},
    describe::{fetch_blocked, fetch_worker_deployment},
    error::{StatusClass, TemporalError},
    pool::TemporalClient,
};

/// Version metadata key holding the controller identity.
pub const METADATA_CONTROLLER: &str = "temporal.io/controller";
/// Version metadata key holding the controller version.
pub const METADATA_CONTROLLER_VERSION: &str = "temporal.io/controller-version";
/// The controller version stamped into version metadata.
pub const CONTROLLER_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Applies a routing change.
///
/// Reads the deployment first (for its manager identity). With `conflict_token` (base64, from the
/// observation the decision was based on) every write carries that token, so a change made by
/// someone else since gives [`RoutingOutcome::Conflict`]; without it the fresh token is used.
/// A free manager identity is claimed for `identity` first (`SetWorkerDeploymentManager(self)`),
/// and the write uses the token the claim returns. One held by another identity gives
/// `Blocked(PlanExecutionFailed)` with the CLI command that frees it. Writes never allow missing
/// task queues or versions without pollers. After SetCurrent/SetRamping the version metadata gets
/// [`METADATA_CONTROLLER`] and [`METADATA_CONTROLLER_VERSION`] (a metadata failure is only logged:
/// routing is already changed).
///
/// `Err` only for transient failures (unreachable, timeouts, rate limits): retry the activity.
pub async fn set_routing(
    client: &TemporalClient,
    namespace: &str,
    deployment_name: &str,
    identity: &str,
    change: RoutingChange,
    conflict_token: Option<&str>,
) -> Result<RoutingOutcome, TemporalError> {
    let none = TakeOver::default();
    let manager = Manager {
        identity,
        take_over: &none,
    };
    set_routing_as(
        client,
        namespace,
        deployment_name,
        &manager,
        change,
        conflict_token,
    )
    .await
}

/// Who writes routing: this controller's identity, and the identities it takes worker
/// deployments over from.
#[derive(Debug, Clone, Copy)]
pub struct Manager<'a> {
    /// The identity claimed as manager and sent with every write.
    pub identity: &'a str,
    /// Manager identities claimed over instead of refused.
    pub take_over: &'a TakeOver,
}

/// Manager identities of another controller (the Go Temporal Worker Controller) whose worker
/// deployments this controller takes over, claiming the manager identity from them instead of
/// stopping at it (`--take-over-manager-from`): exact identities, or prefixes ending in `*`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TakeOver(Vec<String>);

impl TakeOver {
    /// From the flag's values (empty ones ignored).
    pub fn new(patterns: impl IntoIterator<Item = String>) -> Self {
        Self(
            patterns
                .into_iter()
                .map(|p| p.trim().to_owned())
                .filter(|p| !p.is_empty())
                .collect(),
        )
    }

    /// Whether `holder` is an identity taken over from.
    pub fn covers(&self, holder: &str) -> bool {
        !holder.is_empty()
            && self
                .0
                .iter()
                .any(|pattern| match pattern.strip_suffix('*') {
                    Some(prefix) => holder.starts_with(prefix),
                    None => holder == pattern,
                })
    }
}

/// [`set_routing`] for `manager`: a manager identity it [`TakeOver::covers`] is claimed like a
/// free one.
pub async fn set_routing_as(
    client: &TemporalClient,
    namespace: &str,
    deployment_name: &str,
    manager: &Manager<'_>,
    change: RoutingChange,
    conflict_token: Option<&str>,
) -> Result<RoutingOutcome, TemporalError> {
    let identity = manager.identity;
    let state = match fetch_worker_deployment(client, namespace, deployment_name).await {
        Ok(Some(state)) => state,
        Ok(None) if change == RoutingChange::ClearRamp => return Ok(RoutingOutcome::Applied),
        Ok(None) => {
            return Ok(RoutingOutcome::Blocked(Blocked {
                reason: BlockReason::PlanExecutionFailed,
                message: format!(
                    "worker deployment '{deployment_name}' does not exist in Temporal namespace \
                     '{namespace}' (no worker of it has polled yet)"
                ),
            }));
        }
        Err(err) => return read_failure(err, namespace, deployment_name),
    };
    if change == RoutingChange::ClearRamp && state.ramping_build_id.is_none() {
        return Ok(RoutingOutcome::Applied);
    }
    let taking_over = manager.take_over.covers(&state.manager_identity);
    if !taking_over && let Some(blocked) = held_by_other(&state, deployment_name, identity) {
        return Ok(RoutingOutcome::Blocked(blocked));
    }
    let mut token = decode_token(conflict_token.unwrap_or(&state.conflict_token))?;
    if taking_over {
        info!(%namespace, %deployment_name, from = %state.manager_identity, "taking the manager identity over (--take-over-manager-from)");
    }
    if state.manager_identity.is_empty() || taking_over {
        match claim_manager(client, namespace, deployment_name, identity, token).await {
            Ok(new_token) => token = new_token,
            Err(err) => return write_failure(err, deployment_name),
        }
    }
    let written = match &change {
        RoutingChange::SetCurrent { build_id } => {
            set_current(
                client,
                namespace,
                deployment_name,
                build_id,
                token,
                identity,
                false,
            )
            .await
        }
        RoutingChange::SetRamping {
            build_id,
            percentage,
        } => {
            let percentage = f32::from(*percentage);
            set_ramping(
                client,
                namespace,
                deployment_name,
                build_id,
                percentage,
                token,
                identity,
            )
            .await
        }
        RoutingChange::ClearRamp => {
            set_ramping(client, namespace, deployment_name, "", 0.0, token, identity).await
        }
    };
    if let Err(err) = written {
        return write_failure(err, deployment_name);
    }
    info!(%namespace, %deployment_name, ?change, "routing changed");
    if let RoutingChange::SetCurrent { build_id } | RoutingChange::SetRamping { build_id, .. } =
        &change
        && let Err(err) =
            stamp_metadata(client, namespace, deployment_name, build_id, identity).await
    {
        warn!(%namespace, %deployment_name, %build_id, error = %err, "routing changed but the version metadata update failed");
    }
    Ok(RoutingOutcome::Applied)
}

/// Returns routing to unversioned workers (TWD deletion): clears any ramp, then sets Current to
/// unversioned with `ignore_missing_task_queues` (unversioned workers may be gone). A missing
/// deployment counts as done. Does not claim a free manager identity; one held by another
/// identity gives `Blocked`. `Err` only for transient failures and refused credentials (the
/// deletion path tells those from Temporal's other answers).
pub async fn reset_to_unversioned(
    client: &TemporalClient,
    namespace: &str,
    deployment_name: &str,
    identity: &str,
) -> Result<RoutingOutcome, TemporalError> {
    let state = match fetch_worker_deployment(client, namespace, deployment_name).await {
        Ok(Some(state)) => state,
        Ok(None) => return Ok(RoutingOutcome::Applied),
        Err(err) if err.needs_eviction() => return Err(err),
        Err(err) => return read_failure(err, namespace, deployment_name),
    };
    if state.current_build_id.is_none() && state.ramping_build_id.is_none() {
        return Ok(RoutingOutcome::Applied);
    }
    if let Some(blocked) = held_by_other(&state, deployment_name, identity) {
        return Ok(RoutingOutcome::Blocked(blocked));
    }
    let mut token = decode_token(&state.conflict_token)?;
    if state.ramping_build_id.is_some() {
        match set_ramping(client, namespace, deployment_name, "", 0.0, token, identity).await {
            Ok(new_token) => token = new_token,
            Err(err) if err.needs_eviction() => return Err(err),
            Err(err) => return write_failure(err, deployment_name),
        }
    }
    if state.current_build_id.is_some()
        && let Err(err) = set_current(
            client,
            namespace,
            deployment_name,
            "",
            token,
            identity,
            true,
        )
        .await
    {
        if err.needs_eviction() {
            return Err(err);
        }
        return write_failure(err, deployment_name);
    }
    info!(%namespace, %deployment_name, "routing returned to unversioned workers");
    Ok(RoutingOutcome::Applied)
}

/// The CLI command that frees a manager identity.
fn unset_command(deployment_name: &str, holder: &str) -> String {
    format!(
        "temporal worker deployment manager-identity unset --deployment-name {deployment_name} \
         --identity '{holder}'"
    )
}

/// `Blocked` for a manager identity held by `holder`.
fn manager_blocked(deployment_name: &str, holder: &str) -> Blocked {
    Blocked {
        reason: BlockReason::PlanExecutionFailed,
        message: format!(
            "manager identity of worker deployment {deployment_name} is held by '{holder}'; run \
             `{}` to let the controller manage it, or, when that is another controller you are \
             moving from (stopped), start this one with --take-over-manager-from '{holder}'",
            unset_command(deployment_name, holder)
        ),
    }
}

fn held_by_other(state: &TemporalState, deployment_name: &str, identity: &str) -> Option<Blocked> {
    (!state.manager_identity.is_empty() && state.manager_identity != identity)
        .then(|| manager_blocked(deployment_name, &state.manager_identity))
}

/// The holder named in "ManagerIdentity 'X' is set and does not match user identity 'Y'".
fn holder_from_message(message: &str) -> Option<&str> {
    let rest = message.split_once("ManagerIdentity '")?.1;
    rest.split_once('\'').map(|(holder, _)| holder)
}

/// Outcome of a failed read before a write.
fn read_failure(
    err: TemporalError,
    namespace: &str,
    deployment_name: &str,
) -> Result<RoutingOutcome, TemporalError> {
    if err.is_transient() {
        Err(err)
    } else {
        Ok(RoutingOutcome::Blocked(fetch_blocked(
            &err,
            namespace,
            deployment_name,
        )))
    }
}

/// Outcome of a failed write.
fn write_failure(
    err: TemporalError,
    deployment_name: &str,
) -> Result<RoutingOutcome, TemporalError> {
    let message = err.server_message();
    match err.class() {
        StatusClass::FailedPrecondition
            if message.to_ascii_lowercase().contains("conflict token") =>
        {
            Ok(RoutingOutcome::Conflict)
        }
        StatusClass::FailedPrecondition if message.contains("ManagerIdentity") => {
            let holder = holder_from_message(&message).unwrap_or("another identity");
            Ok(RoutingOutcome::Blocked(manager_blocked(
                deployment_name,
                holder,
            )))
        }
        StatusClass::Transient | StatusClass::RateLimited => Err(err),
        _ => Ok(RoutingOutcome::Blocked(
            err.to_blocked(BlockReason::PlanExecutionFailed),
        )),
    }
}

async fn claim_manager(
    client: &TemporalClient,
    namespace: &str,
    deployment_name: &str,
    identity: &str,
    token: Vec<u8>,
) -> Result<Vec<u8>, TemporalError> {
    let request = SetWorkerDeploymentManagerRequest {
        namespace: namespace.to_owned(),
        deployment_name: deployment_name.to_owned(),
        new_manager_identity: Some(NewManagerIdentity::Self_(true)),
        conflict_token: token,
        identity: identity.to_owned(),
    };
    let mut raw = client.raw().clone();
    let response = client
        .observe(
            "SetWorkerDeploymentManager",
            WorkflowService::set_worker_deployment_manager(&mut raw, request.into_request()),
        )
        .await
        .map_err(|s| client.rpc_error("SetWorkerDeploymentManager", deployment_name, &s))?;
    info!(%namespace, %deployment_name, %identity, "claimed the manager identity");
    Ok(response.into_inner().conflict_token)
}

async fn set_current(
    client: &TemporalClient,
    namespace: &str,
    deployment_name: &str,
    build_id: &str,
    token: Vec<u8>,
    identity: &str,
    ignore_missing_task_queues: bool,
) -> Result<Vec<u8>, TemporalError> {
    let request = SetWorkerDeploymentCurrentVersionRequest {
        namespace: namespace.to_owned(),
        deployment_name: deployment_name.to_owned(),
        build_id: build_id.to_owned(),
        conflict_token: token,
        identity: identity.to_owned(),
        ignore_missing_task_queues,
        allow_no_pollers: false,
        ..Default::default()
    };
    let mut raw = client.raw().clone();
    let response = client
        .observe(
            "SetWorkerDeploymentCurrentVersion",
            WorkflowService::set_worker_deployment_current_version(
                &mut raw,
                request.into_request(),
            ),
        )
        .await
        .map_err(|s| {
            client.rpc_error(
                "SetWorkerDeploymentCurrentVersion",
                format!("{deployment_name}:{build_id}"),
                &s,
            )
        })?;
    Ok(response.into_inner().conflict_token)
}

async fn set_ramping(
    client: &TemporalClient,
    namespace: &str,
    deployment_name: &str,
    build_id: &str,
    percentage: f32,
    token: Vec<u8>,
    identity: &str,
) -> Result<Vec<u8>, TemporalError> {
    let request = SetWorkerDeploymentRampingVersionRequest {
        namespace: namespace.to_owned(),
        deployment_name: deployment_name.to_owned(),
        build_id: build_id.to_owned(),
        percentage,
        conflict_token: token,
        identity: identity.to_owned(),
        ignore_missing_task_queues: false,
        allow_no_pollers: false,
        ..Default::default()
    };
    let mut raw = client.raw().clone();
    let response = client
        .observe(
            "SetWorkerDeploymentRampingVersion",
            WorkflowService::set_worker_deployment_ramping_version(
                &mut raw,
                request.into_request(),
            ),
        )
        .await
        .map_err(|s| {
            client.rpc_error(
                "SetWorkerDeploymentRampingVersion",
                format!("{deployment_name}:{build_id}"),
                &s,
            )
        })?;
    Ok(response.into_inner().conflict_token)
}

async fn stamp_metadata(
    client: &TemporalClient,
    namespace: &str,
    deployment_name: &str,
    build_id: &str,
    identity: &str,
) -> Result<(), TemporalError> {
    let upsert_entries = HashMap::from([
        (
            METADATA_CONTROLLER.to_owned(),
            json_payload(&serde_json::Value::from(identity), METADATA_CONTROLLER)?,
        ),
        (
            METADATA_CONTROLLER_VERSION.to_owned(),
            json_payload(
                &serde_json::Value::from(CONTROLLER_VERSION),
                METADATA_CONTROLLER_VERSION,
            )?,
        ),
    ]);
    let request = UpdateWorkerDeploymentVersionMetadataRequest {
        namespace: namespace.to_owned(),
        deployment_version: Some(version_ref(deployment_name, build_id)),
        upsert_entries,
        identity: identity.to_owned(),
        ..Default::default()
    };
    let mut raw = client.raw().clone();
    client
        .observe(
            "UpdateWorkerDeploymentVersionMetadata",
            WorkflowService::update_worker_deployment_version_metadata(
                &mut raw,
                request.into_request(),
            ),
        )
        .await
        .map_err(|s| {
            client.rpc_error(
                "UpdateWorkerDeploymentVersionMetadata",
                format!("{deployment_name}:{build_id}"),
                &s,
            )
        })?;
    Ok(())
}

#[cfg(test)]
mod take_over_tests {
    use super::*;

    #[test]
    fn only_the_identities_named_are_taken_over() {
        let take_over = TakeOver::new([
            "temporal-worker-controller/tw-system/*".to_owned(),
            "legacy".to_owned(),
            " ".to_owned(),
        ]);
        // (holder, taken over)
        let cases = [
            ("temporal-worker-controller/tw-system/0f3a-uid", true),
            ("temporal-worker-controller/other/0f3a-uid", false),
            ("legacy", true),
            ("legacy/more", false),
            ("", false),
            ("twc", false),
        ];
        for (holder, expected) in cases {
            assert_eq!(take_over.covers(holder), expected, "{holder}");
        }
        assert!(!TakeOver::default().covers("anyone"));
    }
}

#[cfg(test)]
mod tests {
    use temporalio_client::tonic::Status;

    use super::*;

    fn rpc(status: Status) -> TemporalError {
        TemporalError::rpc("SetWorkerDeploymentCurrentVersion", "d:v1", &status)
    }

    #[test]
    fn maps_write_failures() {
        assert_eq!(
            write_failure(
                rpc(Status::failed_precondition("conflict token mismatch")),
                "ns/d"
            )
            .ok(),
            Some(RoutingOutcome::Conflict)
        );
        let held = write_failure(
            rpc(Status::failed_precondition(
                "ManagerIdentity 'bob' is set and does not match user identity 'me'; to proceed, ...",
            )),
            "ns/d",
        );
        let Ok(RoutingOutcome::Blocked(blocked)) = held else {
            panic!("expected Blocked, got {held:?}");
        };
        assert_eq!(blocked.reason, BlockReason::PlanExecutionFailed);
        assert!(
            blocked
                .message
                .starts_with("manager identity of worker deployment ns/d is held by 'bob'"),
            "{}",
            blocked.message
        );
        assert!(
            blocked.message.contains("manager-identity unset"),
            "{}",
            blocked.message
        );

        let missing = write_failure(
            rpc(Status::not_found(
                "build ID 'v9' not found in Worker Deployment 'ns/d'",
            )),
            "ns/d",
        );
        let Ok(RoutingOutcome::Blocked(blocked)) = missing else {
            panic!("expected Blocked, got {missing:?}");
        };
        assert!(
            blocked.message.contains("build ID 'v9' not found"),
            "{}",
            blocked.message
        );

        assert!(write_failure(rpc(Status::unavailable("down")), "ns/d").is_err());
        assert!(write_failure(rpc(Status::resource_exhausted("slow")), "ns/d").is_err());
    }

    #[test]
    fn holder_parsing() {
        assert_eq!(
            holder_from_message("ManagerIdentity 'a b' is set and does not match"),
            Some("a b")
        );
        assert_eq!(holder_from_message("something else"), None);
    }
}
