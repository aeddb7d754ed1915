//! `TemporalConnection`: how workers (and the controller, for routing calls) reach a Temporal
//! server: address, TLS server name, and mTLS or API-key credentials from Secrets.
//! `ClusterConnection`: the same, cluster-scoped, for TWDs of every namespace (each namespace
//! brings its own Secrets under the names it gives).

use k8s_openapi::api::core::v1::SecretKeySelector;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Address and credentials of a Temporal server.
// Several printer columns repeat `type_ = ...`; the lint mistakes them for duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "temporal.io",
    version = "v1alpha1",
    kind = "TemporalConnection",
    plural = "temporalconnections",
    singular = "temporalconnection",
    shortname = "tconn",
    namespaced,
    status = "TemporalConnectionStatus",
    derive = "PartialEq",
    doc = "How workers and the controller reach a Temporal server.",
    printcolumn(name = "Host", type_ = "string", json_path = ".spec.hostPort"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!(has(self.mutualTLSSecretRef) && has(self.apiKeySecretRef))")
        .message("Only one of mutualTLSSecretRef or apiKeySecretRef may be set"),
    validation = Rule::new("!has(self.workerCredentials) || (has(self.workerCredentials.mutualTLSSecretRef) != has(self.workerCredentials.apiKeySecretRef))")
        .message("workerCredentials needs exactly one of mutualTLSSecretRef or apiKeySecretRef"),
)]
pub struct TemporalConnectionSpec {
    /// `host:port` of the Temporal frontend, e.g. `my-ns.a1b2c.tmprl.cloud:7233`.
    #[schemars(regex(pattern = r"^[a-zA-Z0-9.-]+:[0-9]+$"))]
    pub host_port: String,
    /// TLS settings; a server name alone turns TLS on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSpec>,
    /// Secret with `tls.crt`, `tls.key` and optionally `ca.crt` for mutual TLS.
    #[serde(
        rename = "mutualTLSSecretRef",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub mutual_tls_secret_ref: Option<SecretReference>,
    /// Secret key holding an API key (TLS is then always on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_secret_ref: Option<SecretKeySelector>,
    /// Credentials given to worker pods instead of the ones above, which the controller then
    /// keeps for itself (routing changes, reads): workers need only poll, so their key or
    /// certificate can be one the server refuses a routing change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_credentials: Option<WorkerCredentials>,
}

/// Credentials of the worker pods when they differ from the controller's.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WorkerCredentials {
    /// Secret with `tls.crt`, `tls.key` and optionally `ca.crt` for the workers' mutual TLS.
    #[serde(
        rename = "mutualTLSSecretRef",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub mutual_tls_secret_ref: Option<SecretReference>,
    /// Secret key holding the workers' API key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_secret_ref: Option<SecretKeySelector>,
}

/// Spec of a [`ClusterConnection`]: the same fields and rules as a TemporalConnection's.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "temporal.io",
    version = "v1alpha1",
    kind = "ClusterConnection",
    plural = "clusterconnections",
    singular = "clusterconnection",
    shortname = "cconn",
    status = "TemporalConnectionStatus",
    derive = "PartialEq",
    doc = "How workers and the controller reach a Temporal server, for TWDs of every namespace \
           (Secrets it names are read in the namespace of the TWD that uses it).",
    printcolumn(name = "Host", type_ = "string", json_path = ".spec.hostPort"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(transparent)]
pub struct ClusterConnectionSpec(pub TemporalConnectionSpec);

/// `Connection`, the Go controller's GA name (since its v1.7) of `TemporalConnection`: the
/// same spec, status and rules, in the namespace of the worker deployments that use it.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "temporal.io",
    version = "v1alpha1",
    kind = "Connection",
    plural = "connections",
    singular = "connection",
    namespaced,
    status = "TemporalConnectionStatus",
    derive = "PartialEq",
    doc = "How workers and the controller reach a Temporal server.",
    printcolumn(name = "Host", type_ = "string", json_path = ".spec.hostPort"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(transparent)]
pub struct ConnectionSpec(pub TemporalConnectionSpec);

impl From<Connection> for TemporalConnection {
    /// The same object read as the older kind.
    fn from(object: Connection) -> Self {
        Self {
            metadata: object.metadata,
            spec: object.spec.0,
            status: object.status,
        }
    }
}

/// TLS options of a connection.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TlsSpec {
    /// Name used for SNI and certificate verification instead of the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[a-zA-Z0-9.-]+$"))]
    pub server_name: Option<String>,
    /// Secret key holding the PEM CA bundle that signed the server's certificate (for servers
    /// with a private CA); turns TLS on. Wins over a `ca.crt` in the mutual-TLS Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_secret_ref: Option<SecretKeySelector>,
}

/// Name of a Secret in the same namespace.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct SecretReference {
    /// Secret name.
    #[schemars(regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: String,
}

/// Observed state of a connection.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TemporalConnectionStatus {
    /// `Ready` with reason `Connected`, `AuthSecretInvalid` or `TemporalClientCreationFailed`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".to_owned()]))]
    pub conditions: Vec<Condition>,
    /// Generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// How a connection authenticates.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum AuthMode {
    /// Plaintext, or TLS without a client certificate when a server name is set.
    None,
    /// Client certificate from this Secret.
    MutualTls { secret_name: String },
    /// API key from this Secret key.
    ApiKey { secret_name: String, key: String },
}

impl TemporalConnectionSpec {
    /// The authentication mode of the controller's own client.
    pub fn auth_mode(&self) -> AuthMode {
        auth_mode(
            self.mutual_tls_secret_ref.as_ref(),
            self.api_key_secret_ref.as_ref(),
        )
    }

    /// The authentication mode given to worker pods: `workerCredentials` when set, else the
    /// controller's.
    pub fn worker_auth_mode(&self) -> AuthMode {
        match &self.worker_credentials {
            Some(w) => auth_mode(
                w.mutual_tls_secret_ref.as_ref(),
                w.api_key_secret_ref.as_ref(),
            ),
            None => self.auth_mode(),
        }
    }

    /// The Secret key of the server CA bundle, if set.
    pub fn ca_secret_ref(&self) -> Option<&SecretKeySelector> {
        self.tls.as_ref().and_then(|t| t.ca_secret_ref.as_ref())
    }

    /// The TLS server name, if set.
    pub fn server_name(&self) -> Option<&str> {
        self.tls.as_ref().and_then(|t| t.server_name.as_deref())
    }
}

fn auth_mode(
    mutual_tls: Option<&SecretReference>,
    api_key: Option<&SecretKeySelector>,
) -> AuthMode {
    if let Some(r) = mutual_tls {
        AuthMode::MutualTls {
            secret_name: r.name.clone(),
        }
    } else if let Some(r) = api_key {
        AuthMode::ApiKey {
            secret_name: r.name.clone(),
            key: r.key.clone(),
        }
    } else {
        AuthMode::None
    }
}

#[cfg(test)]
mod tests {
    use kube::CustomResourceExt;

    use super::*;
    use crate::worker_deployment::{ConnectionKind, ConnectionReference};

    #[test]
    fn a_cluster_connection_is_a_cluster_scoped_temporal_connection() {
        let cluster = ClusterConnection::crd();
        let namespaced = TemporalConnection::crd();
        assert_eq!(cluster.spec.scope, "Cluster");
        assert_eq!(namespaced.spec.scope, "Namespaced");
        assert_eq!(
            cluster.spec.names.short_names,
            Some(vec!["cconn".to_owned()])
        );
        // Same spec (fields, patterns and CEL rules) and status; only the descriptions of the
        // spec object itself differ.
        let schema = |crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
                      field: &str| {
            let mut schema = crd.spec.versions[0]
                .schema
                .as_ref()
                .and_then(|s| s.open_api_v3_schema.as_ref())
                .and_then(|root| root.properties.as_ref())
                .and_then(|p| p.get(field))
                .cloned()
                .unwrap_or_default();
            schema.description = None;
            schema
        };
        for field in ["spec", "status"] {
            assert_eq!(
                schema(&cluster, field),
                schema(&namespaced, field),
                "{field}"
            );
        }
        assert!(
            schema(&cluster, "spec")
                .x_kubernetes_validations
                .is_some_and(|rules| !rules.is_empty())
        );
    }

    #[test]
    fn a_reference_without_kind_is_a_temporal_connection_and_stays_so_written() {
        // (JSON of the reference, the kind read, the JSON written back)
        let cases = [
            (
                r#"{"name":"dev"}"#,
                ConnectionKind::TemporalConnection,
                r#"{"name":"dev"}"#,
            ),
            (
                r#"{"name":"dev","kind":"TemporalConnection"}"#,
                ConnectionKind::TemporalConnection,
                r#"{"name":"dev"}"#,
            ),
            (
                r#"{"name":"shared","kind":"ClusterConnection"}"#,
                ConnectionKind::ClusterConnection,
                r#"{"name":"shared","kind":"ClusterConnection"}"#,
            ),
        ];
        for (json, kind, written) in cases {
            let reference: ConnectionReference =
                serde_json::from_str(json).unwrap_or_else(|e| panic!("{json}: {e}"));
            assert_eq!(reference.kind, kind, "{json}");
            assert_eq!(
                serde_json::to_string(&reference).ok().as_deref(),
                Some(written),
                "{json}"
            );
        }
        let reference: Result<ConnectionReference, _> =
            serde_json::from_str(r#"{"name":"x","kind":"Connection"}"#);
        assert_eq!(
            reference.ok().map(|r| r.kind),
            Some(ConnectionKind::Connection)
        );
        assert!(
            serde_json::from_str::<ConnectionReference>(r#"{"name":"x","kind":"Secret"}"#).is_err()
        );
    }

    #[test]
    fn a_worker_deployment_without_connection_kind_uses_a_connection() {
        use crate::{TemporalWorkerDeployment, WorkerDeployment};
        // (kind of the object, connectionRef, the kind read)
        let cases = [
            (
                "WorkerDeployment",
                r#"{"name":"dev"}"#,
                ConnectionKind::Connection,
            ),
            (
                "WorkerDeployment",
                r#"{"name":"dev","kind":"TemporalConnection"}"#,
                ConnectionKind::TemporalConnection,
            ),
            (
                "WorkerDeployment",
                r#"{"name":"dev","kind":"ClusterConnection"}"#,
                ConnectionKind::ClusterConnection,
            ),
            (
                "TemporalWorkerDeployment",
                r#"{"name":"dev"}"#,
                ConnectionKind::TemporalConnection,
            ),
            (
                "TemporalWorkerDeployment",
                r#"{"name":"dev","kind":"Connection"}"#,
                ConnectionKind::Connection,
            ),
        ];
        for (kind, reference, expected) in cases {
            let json = format!(
                r#"{{"apiVersion":"temporal.io/v1alpha1","kind":"{kind}","metadata":{{"name":"w"}},
                "spec":{{"template":{{"spec":{{"containers":[{{"name":"w","image":"w:1"}}]}}}},
                "workerOptions":{{"connectionRef":{reference},"temporalNamespace":"default"}},
                "rollout":{{"strategy":"AllAtOnce"}}}}}}"#
            );
            let read = if kind == "WorkerDeployment" {
                serde_json::from_str::<WorkerDeployment>(&json).map(TemporalWorkerDeployment::from)
            } else {
                serde_json::from_str::<TemporalWorkerDeployment>(&json)
            };
            match read {
                Ok(object) => assert_eq!(
                    object.spec.worker_options.connection_ref.kind, expected,
                    "{kind} {reference}"
                ),
                Err(e) => panic!("{kind} {reference}: {e}"),
            }
        }
    }
}
