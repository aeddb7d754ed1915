//! Observability of `twc run`: the Prometheus `/metrics` endpoint and the `/healthz` and
//! `/readyz` probes ([`server`], [`health`]), the Kubernetes client that counts its requests
//! ([`kube`]), what the JSON logs carry ([`logs`]), and the OpenTelemetry span export
//! ([`traces`]). The metrics themselves live in [`twc_activities::metrics`], where the
//! activities record them.

pub mod health;
pub mod kube;
mod logs;
pub mod server;
pub mod traces;

pub use health::{Health, Task};
pub use server::{BindAddress, State};
