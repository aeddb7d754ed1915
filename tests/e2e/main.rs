//! End-to-end tests against a real Temporal dev server, a real kube-apiserver and the local pod
//! runner. Run them with `make test` (or `make e2e`), which starts the sandbox once for the run.

mod harness;

mod analysis;
mod async_routing;
mod autoscaling;
mod availability;
// libtest starts the tests in the order of their names. The upgrade test is among the longest of
// the suite (two controllers one after the other, over rollouts held in steps, ~2.5 min) and waits
// more than it computes: named `baseline_upgrade` it starts among the first and runs beside the
// others, where as `upgrade` it started last and ran alone for its last ~2.5 min.
mod baseline_upgrade;
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
