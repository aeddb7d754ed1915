//! Label, annotation and finalizer keys the controller writes on Kubernetes objects.

/// Label on each versioned Deployment: the (DNS-cleaned) TemporalWorkerDeployment name.
pub const DEPLOYMENT_NAME: &str = "temporal.io/deployment-name";
/// Label on each versioned Deployment and its pods: the build ID.
pub const BUILD_ID: &str = "temporal.io/build-id";
/// Standard label naming the tool that manages an object.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY`] on objects this controller creates.
pub const MANAGED_BY_VALUE: &str = "twc";
/// Pod-template annotation: SHA-256 of the user's `spec.template` (the key is this
/// controller's own: the Go controller rolls a Deployment carrying its
/// [`GO_POD_TEMPLATE_SPEC_HASH`] in place when the value differs from its own hash, which a
/// Deployment handed back to it must not be).
pub const POD_TEMPLATE_HASH: &str = "twc.temporal.io/pod-template-hash";
/// Pod-template annotation: SHA-256 of every connection setting the pods were built with.
pub const CONNECTION_SPEC_HASH: &str = "twc.temporal.io/connection-hash";
/// Pod-template annotation of the Go controller: SHA-256 of the connection's address, TLS
/// server name and credential Secret name. Written with its formula, so that controller finds
/// nothing to change in Deployments handed back to it.
pub const GO_CONNECTION_SPEC_HASH: &str = "temporal.io/connection-spec-hash";
/// Pod-template annotation of the Go controller: its hash of the pod template (read, never
/// written).
pub const GO_POD_TEMPLATE_SPEC_HASH: &str = "temporal.io/pod-template-spec-hash";
/// Finalizer on TemporalWorkerDeployments and the TemporalConnections they reference.
pub const DELETE_PROTECTION_FINALIZER: &str = "temporal.io/delete-protection";
/// Annotation an operator sets to send a rollout action (`pause`, `resume`, `promote`, ...).
pub const ROLLOUT_ACTION: &str = "temporal.io/rollout-action";
