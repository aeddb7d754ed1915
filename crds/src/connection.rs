//! `TemporalConnection`: how workers (and the controller, for routing calls) reach a Temporal
//! server: address, TLS server name, and mTLS or API-key credentials from Secrets.

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
}

/// TLS options of a connection.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TlsSpec {
    /// Name used for SNI and certificate verification instead of the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[a-zA-Z0-9.-]+$"))]
    pub server_name: Option<String>,
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
    /// The authentication mode this spec selects.
    pub fn auth_mode(&self) -> AuthMode {
        if let Some(r) = &self.mutual_tls_secret_ref {
            AuthMode::MutualTls {
                secret_name: r.name.clone(),
            }
        } else if let Some(r) = &self.api_key_secret_ref {
            AuthMode::ApiKey {
                secret_name: r.name.clone(),
                key: r.key.clone(),
            }
        } else {
            AuthMode::None
        }
    }

    /// The TLS server name, if set.
    pub fn server_name(&self) -> Option<&str> {
        self.tls.as_ref().and_then(|t| t.server_name.as_deref())
    }
}
