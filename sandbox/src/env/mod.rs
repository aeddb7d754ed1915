//! The running sandbox as seen by its users: addresses, file paths and tool paths, written to
//! `<state-dir>/env.json` once everything is up, and read by the end-to-end tests.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Name of the file (in the state dir) that describes a running sandbox.
pub const ENV_FILE_NAME: &str = "env.json";
/// Environment variable pointing commands run by `twc-sandbox exec` at the env file.
pub const ENV_FILE_VAR: &str = "TWC_ENV_FILE";

/// Everything a client needs to use a running sandbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxEnv {
    /// Temporal frontend `host:port`.
    pub temporal_address: String,
    /// Temporal namespace that exists on the dev server.
    pub temporal_namespace: String,
    /// Temporal Web UI URL, when the UI runs.
    pub temporal_ui_url: Option<String>,
    /// Temporal server metrics URL (Prometheus).
    pub temporal_metrics_url: String,
    /// File holding the Temporal dev server's current process ID (rewritten when a test
    /// restarts it), for measuring its CPU.
    #[serde(default)]
    pub temporal_pid_file: Option<PathBuf>,
    /// The dynamic config given to the dev server beyond the sandbox's own
    /// (`--temporal-dynamic-config`), so sandboxes a test starts of its own can run the same.
    #[serde(default)]
    pub temporal_dynamic_config: Vec<String>,
    /// Admin kubeconfig of the kube-apiserver.
    pub kubeconfig: PathBuf,
    /// Folder with the server logs.
    pub logs_dir: PathBuf,
    /// Folder with the pod runner's per-pod logs.
    pub pods_dir: PathBuf,
    /// The `temporal` CLI.
    pub temporal_cli: PathBuf,
    /// The `kubectl` CLI.
    pub kubectl: PathBuf,
    /// Folder with the workspace binaries (`twc`, `sample-worker`, ...).
    pub bin_dir: PathBuf,
    /// The controller's log, when the sandbox runs a controller.
    pub controller_log: Option<PathBuf>,
    /// File holding the controller's current process ID. The sandbox restarts the controller
    /// when it dies (as a Deployment would), so crash tests can SIGKILL it.
    pub controller_pid_file: Option<PathBuf>,
    /// The controller's Prometheus metrics (`http://127.0.0.1:<port>/metrics`), when the sandbox
    /// runs a controller. A restarted controller keeps the port.
    #[serde(default)]
    pub controller_metrics_url: Option<String>,
    /// Base URL of the controller's `/healthz` and `/readyz` (`http://127.0.0.1:<port>`).
    #[serde(default)]
    pub controller_health_url: Option<String>,
    /// The controller's WorkerResourceTemplate admission webhook
    /// (`https://127.0.0.1:<port>/validate-...`), which the API server calls; a restarted
    /// controller keeps the port and the certificate.
    #[serde(default)]
    pub controller_webhook_url: Option<String>,
    /// Folder with the webhook's serving certificate (`tls.crt`, `tls.key`) and its CA (`ca.crt`).
    #[serde(default)]
    pub webhook_cert_dir: Option<PathBuf>,
    /// The `prometheus` binary, when installed (`make tools`); tests start their own with
    /// [`crate::prometheus::PrometheusOptions::for_sandbox`].
    #[serde(default)]
    pub prometheus_bin: Option<PathBuf>,
    /// Folder where the pods' workers announce their `/metrics` (Prometheus file_sd files).
    #[serde(default)]
    pub prometheus_targets_dir: Option<PathBuf>,
    /// Base URL of the sandbox's Prometheus (`http://127.0.0.1:<port>`), when it runs one.
    #[serde(default)]
    pub prometheus_url: Option<String>,
    /// The Jaeger all-in-one binary, when installed (`make jaeger`); tests start their own.
    #[serde(default)]
    pub jaeger_bin: Option<PathBuf>,
    /// Jaeger's query API base URL (`/api/traces?service=twc`), when the sandbox runs it.
    #[serde(default)]
    pub tracing_query_url: Option<String>,
    /// The OTLP/gRPC endpoint the sandbox's controllers export spans to, when Jaeger runs.
    #[serde(default)]
    pub otlp_endpoint: Option<String>,
    /// The production-like Temporal (PostgreSQL, mutual TLS, JWT authorization), when the
    /// sandbox runs one (`--production-temporal`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub production_temporal: Option<ProductionTemporalEnv>,
}

/// How to reach the sandbox's production-like Temporal ([`crate::production`]): every client
/// needs a certificate of its CA; permissions come from the certificate's OU, or from an API key
/// sent with it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProductionTemporalEnv {
    /// Frontend `127.0.0.1:<port>` (TLS only).
    pub address: String,
    /// TLS server name of its certificate (`temporal.test`).
    pub server_name: String,
    /// Namespaces it serves (`default` first).
    pub namespaces: Vec<String>,
    /// The CA (PEM) of the server's and the clients' certificates.
    pub ca_path: PathBuf,
    /// Client certificate and key granting `system:admin`.
    pub admin_cert_path: PathBuf,
    /// Key of [`Self::admin_cert_path`].
    pub admin_key_path: PathBuf,
    /// Client certificate and key granting nothing: for the TLS handshake of API key clients.
    pub client_cert_path: PathBuf,
    /// Key of [`Self::client_cert_path`].
    pub client_key_path: PathBuf,
    /// Client certificate the controller's engine uses (`<namespace>:write`), when the engine
    /// runs here.
    pub controller_cert_path: Option<PathBuf>,
    /// Key of [`Self::controller_cert_path`].
    pub controller_key_path: Option<PathBuf>,
    /// Folder of API keys (`<name>.jwt`: `system-admin`, `default-write`, `default-read`,
    /// `default-worker`), valid for a week.
    pub api_keys_dir: PathBuf,
    /// The key set (JWKS) the server verifies API keys with.
    pub jwks_url: String,
    /// Prometheus metrics of the server.
    pub metrics_url: String,
    /// The server's log.
    pub log: PathBuf,
    /// Whether the controller's engine (its rollout workflows) runs here rather than on the
    /// dev server.
    pub engine: bool,
}

/// The env file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    /// `TWC_ENV_FILE` is not set.
    #[error("{ENV_FILE_VAR} is not set: run through `twc-sandbox exec` (as `make test` does)")]
    NotSet,
    /// The file is missing or unreadable.
    #[error("reading sandbox env {path}: {source}")]
    Read {
        /// File path.
        path: PathBuf,
        /// I/O error.
        source: std::io::Error,
    },
    /// The file is not valid JSON of this shape.
    #[error("parsing sandbox env {path}: {source}")]
    Parse {
        /// File path.
        path: PathBuf,
        /// JSON error.
        source: serde_json::Error,
    },
}

impl SandboxEnv {
    /// Loads the env named by `TWC_ENV_FILE`.
    pub fn from_env_var() -> Result<Self, EnvError> {
        let path = std::env::var_os(ENV_FILE_VAR).ok_or(EnvError::NotSet)?;
        Self::load(Path::new(&path))
    }

    /// Loads an env file.
    pub fn load(path: &Path) -> Result<Self, EnvError> {
        let text = std::fs::read_to_string(path).map_err(|source| EnvError::Read {
            path: path.to_owned(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|source| EnvError::Parse {
            path: path.to_owned(),
            source,
        })
    }
}
