//! End-to-end tests against a real Temporal dev server, a real kube-apiserver and the local pod
//! runner. Run them with `make test` (or `make e2e`), which starts the sandbox once for the run.

mod harness;

mod analysis;
mod autoscaling;
mod availability;
mod chaos;
mod cluster_connection;
mod controls;
mod crd_validation;
mod dashboard;
mod deletion;
mod deploy;
mod drain;
mod engine;
mod held;
mod history;
mod kinds;
mod long_horizon;
mod metrics;
mod notifications;
mod pod_runner;
mod production;
mod reassert;
mod recovery;
mod replay_check;
mod resource_templates;
mod rollout;
mod takeover;
mod tracing;
mod upgrade;
