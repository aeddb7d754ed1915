//! Operations on the workers' Temporal (the one a TemporalConnection points at), as plain async
//! functions for the activities: a client pool, reading a worker deployment, routing changes,
//! version deletion, gate workflows, draining retired versions, the visibility counts of
//! canary analysis and the task-queue backlogs of autoscaling.
//!
//! Every call sets the request's `namespace` itself; worker-deployment reads are paid from a
//! per-namespace token bucket ([`budget`]); rejected credentials evict the client from its pool.
//! Writes never send `allow_no_pollers = true`.

pub mod analysis;
pub mod backlog;
pub mod budget;
mod convert;
pub mod describe;
pub mod drain;
pub mod error;
pub mod gate;
pub mod pool;
pub mod query;
pub mod replay;
pub mod routing;
mod tls_probe;
pub mod versions;

pub use backlog::read_backlog;
pub use budget::TokenBucket;
pub use describe::{
    TaskQueueKind, describe_worker_deployment, fetch_version_task_queues, version_task_queues,
};
pub use drain::{
    DrainError, DrainStep, check_drainable, count_pinned, drain_job_id, drain_version,
    pinned_workflows_query,
};
pub use error::{StatusClass, TemporalError, classify};
pub use gate::{
    GateKey, StartGateError, cancel_build_gates, cancel_gates, gate_workflow_id,
    gate_workflow_id_prefix, start_gates, stop_build_gates, wait_gates,
};
pub use pool::{ClientPool, PoolKey, PoolOptions, QueryFeature, TemporalClient};
pub use routing::{Manager, TakeOver, reset_to_unversioned, set_routing, set_routing_as};
pub use versions::{delete_version, delete_worker_deployment};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection::ConnectionConfig;

    fn assert_send<T: Send>(_: &T) {}

    /// Activities need `Send` futures: this only has to compile.
    #[allow(dead_code)]
    fn futures_are_send(pool: &ClientPool, config: &ConnectionConfig, client: &TemporalClient) {
        assert_send(&pool.get(config));
        assert_send(&describe_worker_deployment(client, "", ""));
        assert_send(&version_task_queues(client, "", "", ""));
        assert_send(&read_backlog(client, "", "", &[]));
        assert_send(&set_routing(
            client,
            "",
            "",
            "",
            twc_workflows::contract::RoutingChange::ClearRamp,
            None,
        ));
        assert_send(&reset_to_unversioned(client, "", "", ""));
        assert_send(&delete_version(client, "", "", "", false, ""));
        assert_send(&delete_worker_deployment(client, "", "", ""));
        assert_send(&start_gates(
            client,
            "",
            "",
            "",
            "",
            None,
            GateKey::Rollout { attempt: 1 },
            &[],
        ));
        assert_send(&wait_gates(client, "", Vec::new(), || {}));
        assert_send(&cancel_gates(client, "", &[]));
        assert_send(&cancel_build_gates(client, "", "", ""));
        assert_send(&count_pinned(client, "", "", "", &[], &[]));
        let action = twc_workflows::contract::DrainAction::Cancel;
        let step = DrainStep {
            namespace: "",
            deployment_name: "",
            twd_uid: "",
            build_id: "",
            action: &action,
            include_types: &[],
            exclude_types: &[],
            rate: 1,
            dry_run: true,
        };
        assert_send(&drain_version(client, &step, || false));
        assert_send(&stop_build_gates(
            client,
            "",
            "",
            "",
            std::time::Duration::ZERO,
        ));
    }
}
