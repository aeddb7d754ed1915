//! How to reach the engine Temporal (where the rollout workflows run): flags shared by `run`
//! and the operator commands.

use std::path::PathBuf;

use twc_worker::{EngineConfig, EngineTls};

/// Engine Temporal flags (each also readable from the environment).
#[derive(clap::Args, Debug, Clone)]
pub struct EngineArgs {
    /// `host:port` of the engine Temporal (where the rollout workflows run).
    #[arg(long, env = "TWC_ENGINE_ADDRESS", default_value = "127.0.0.1:7233")]
    pub engine_address: String,
    /// Engine Temporal namespace.
    #[arg(long, env = "TWC_ENGINE_NAMESPACE", default_value = "default")]
    pub engine_namespace: String,
    /// API key for the engine Temporal (turns TLS on).
    #[arg(long, env = "TWC_ENGINE_API_KEY", hide_env_values = true)]
    pub engine_api_key: Option<String>,
    /// Client certificate (PEM) for mTLS to the engine Temporal.
    #[arg(long, env = "TWC_ENGINE_TLS_CERT")]
    pub engine_tls_cert: Option<PathBuf>,
    /// Client key (PEM) for mTLS to the engine Temporal.
    #[arg(long, env = "TWC_ENGINE_TLS_KEY")]
    pub engine_tls_key: Option<PathBuf>,
    /// CA bundle (PEM) for the engine Temporal.
    #[arg(long, env = "TWC_ENGINE_TLS_CA")]
    pub engine_tls_ca: Option<PathBuf>,
    /// TLS server name of the engine Temporal (turns TLS on).
    #[arg(long, env = "TWC_ENGINE_TLS_SERVER_NAME")]
    pub engine_tls_server_name: Option<String>,
}

impl EngineArgs {
    /// The connection settings, with the task queue and client identity to use.
    pub fn config(&self, task_queue: &str, identity: &str) -> EngineConfig {
        let tls = (self.engine_tls_cert.is_some()
            || self.engine_tls_ca.is_some()
            || self.engine_tls_server_name.is_some())
        .then(|| EngineTls {
            client_cert: self.engine_tls_cert.clone(),
            client_key: self.engine_tls_key.clone(),
            ca_cert: self.engine_tls_ca.clone(),
            server_name: self.engine_tls_server_name.clone(),
        });
        EngineConfig {
            address: self.engine_address.clone(),
            namespace: self.engine_namespace.clone(),
            task_queue: task_queue.to_owned(),
            identity: identity.to_owned(),
            api_key: self.engine_api_key.clone(),
            tls,
            max_cached_workflows: twc_worker::DEFAULT_MAX_CACHED_WORKFLOWS,
        }
    }
}
