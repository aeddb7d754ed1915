//! All side effects of the engine: Kubernetes objects, the workers' Temporal (routing, versions,
//! gate workflows), and the reads of canary analysis (Temporal visibility, Prometheus). Every
//! operation is idempotent and safe to retry.

pub mod backoff;
pub mod connection;
pub mod engine;
pub mod http;
pub mod k8s;
pub mod metrics;
pub mod notify;
pub mod prometheus;
pub mod temporal;
