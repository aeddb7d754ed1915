//! Kubernetes operations as plain async functions over a [`kube::Client`]: building, listing,
//! creating, scaling, updating and deleting versioned Deployments, resolving TemporalConnections
//! and ClusterConnections and their Secrets, TWD and connection status, Events, finalizers, gate input, the
//! credentials and CA of Prometheus analysis checks, and what each turn of a TWD's workflow
//! re-asserts.
//!
//! Every write is idempotent (create-if-absent by deterministic name, scale-to, delete-if-present,
//! conflict-retried patches guarded by resourceVersion), so a retried activity converges.
//! Secret values are never logged or returned in errors.

pub mod adoption;
pub mod claims;
pub mod conditions;
pub mod connection;
pub mod create_version;
pub mod credentials;
pub mod deployment_builder;
pub mod deployment_view;
pub mod deployments;
pub mod error;
pub mod events;
#[cfg(test)]
pub(crate) mod fake_api;
pub mod finalizers;
pub mod gate_input;
pub mod injection;
pub mod lookup;
pub mod prometheus_access;
pub mod reassert;
pub mod replay_job;
pub mod retry;
pub mod status;
pub mod twd;

pub use connection::{
    ClusterAccess, Connection, ResolvedConnection, find_connection, resolve_connection,
};
pub use create_version::create_versioned_deployment;
pub use deployment_builder::build_deployment;
pub use deployments::{
    CreateOutcome, create_deployment_if_absent, delete_deployment, list_owned_deployments,
    list_versioned_deployments, scale_deployment, update_deployment, versioned_deployment_changes,
};
pub use error::{K8sError, ObjectName, ResolveError};
pub use events::{emit_event, emit_event_on};
pub use finalizers::{KnownConnections, ensure_finalizers, release_finalizers, restore_finalizers};
pub use gate_input::{GateField, gate_input, step_gate};
pub use injection::ServerCa;
pub use reassert::{Reasserted, reassert_claimed, reassert_resources};
pub use status::{
    StatusWrite, write_connection_status, write_twd_status, write_twd_status_seen,
    write_worker_status,
};
pub use twd::{Claim, get_twd, list_workers, namespace_deleting, read_claim, read_claimants};
