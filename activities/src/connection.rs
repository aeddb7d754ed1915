//! A TemporalConnection resolved for use: address, TLS name and credentials read from Secrets.
//! Produced by the Kubernetes side ([`crate::k8s`]), consumed by the Temporal client pool
//! ([`crate::temporal`]). Never serialized into workflow history.

use std::fmt;

/// Credentials of a connection.
#[derive(Clone, PartialEq, Eq)]
pub enum ConnectionAuth {
    /// Plaintext, or server-authenticated TLS when `server_name` is set.
    None,
    /// Mutual TLS.
    MutualTls {
        /// PEM client certificate chain (`tls.crt`).
        cert_pem: Vec<u8>,
        /// PEM private key (`tls.key`).
        key_pem: Vec<u8>,
        /// PEM CA bundle (`ca.crt`), if the Secret has one.
        ca_pem: Option<Vec<u8>>,
    },
    /// API key (TLS on).
    ApiKey {
        /// The key.
        key: String,
    },
}

impl fmt::Debug for ConnectionAuth {
    /// Never prints secret material.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::None => f.write_str("None"),
            Self::MutualTls { ca_pem, .. } => write!(f, "MutualTls {{ ca: {} }}", ca_pem.is_some()),
            Self::ApiKey { .. } => f.write_str("ApiKey"),
        }
    }
}

/// Everything needed to build a client for the workers' Temporal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionConfig {
    /// `host:port`.
    pub host_port: String,
    /// TLS server name override.
    pub server_name: Option<String>,
    /// Temporal namespace of the workers (from the TWD).
    pub temporal_namespace: String,
    /// Credentials.
    pub auth: ConnectionAuth,
    /// PEM CA bundle from `spec.tls.caSecretRef` (wins over the mutual-TLS Secret's `ca.crt`).
    pub server_ca_pem: Option<Vec<u8>>,
    /// Whether the mutual-TLS Secret given to worker pods carries `ca.crt` (pods are pointed at
    /// it).
    pub worker_ca_in_secret: bool,
    /// Changes whenever any of the above changes (spec fields + Secret resourceVersion), so
    /// the client pool rebuilds clients on rotation. Contains no secret material.
    pub cache_key: String,
}
