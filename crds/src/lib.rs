//! The controller's API: the `WorkerDeployment` and `Connection` custom resources (and their older
//! names `TemporalWorkerDeployment` and `TemporalConnection`), the cluster-scoped
//! `ClusterConnection`, the `WorkerResourceTemplate` (group `temporal.io`, version `v1alpha1`)
//! and how it renders per version, the rules that turn a pod
//! template into a build ID and a Deployment name, and the generated CRD manifests.
//!
//! The Rust types here are the source of truth; `crds/*.yaml` is generated from them
//! ([`crd_yaml`]) and a test fails when the checked-in files drift.

pub mod build_id;
pub mod connection;
pub mod crd_yaml;
pub mod duration;
pub mod kinds;
pub mod labels;
pub mod naming;
pub mod notifications;
pub mod resource_template;
pub mod worker_deployment;

pub use build_id::BuildId;
pub use connection::{
    ClusterConnection, ClusterConnectionSpec, Connection, ConnectionSpec, TemporalConnection,
    TemporalConnectionSpec,
};
pub use kinds::{WorkerKind, WorkerObject};
pub use resource_template::{WorkerResourceTemplate, WorkerResourceTemplateSpec};
pub use worker_deployment::{
    TemporalWorkerDeployment, TemporalWorkerDeploymentSpec, WorkerDeployment, WorkerDeploymentSpec,
};

/// API group of both resources.
pub const GROUP: &str = "temporal.io";
/// API version of both resources.
pub const VERSION: &str = "v1alpha1";
