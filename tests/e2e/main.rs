//! End-to-end tests against a real Temporal dev server, a real kube-apiserver and the local pod
//! runner. Run them with `make test` (or `make e2e`), which starts the sandbox once for the run.

mod harness;

mod crd_validation;
mod pod_runner;
mod rollout;
