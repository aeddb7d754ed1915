//! How to reach the engine Temporal (where the rollout workflows run): flags shared by `run`
//! and the operator commands, and, for the operator commands, the sandbox of `make dev` found
//! through the kubeconfig, so `kubectl twc status` works there with no setting at all.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use twc_worker::{EngineConfig, EngineTls};

/// Engine address when neither the flag, the environment nor a sandbox names one.
pub const DEFAULT_ENGINE_ADDRESS: &str = "127.0.0.1:7233";
/// Engine namespace when neither the flag, the environment nor a sandbox names one.
pub const DEFAULT_ENGINE_NAMESPACE: &str = "default";

/// Engine Temporal flags (each also readable from the environment).
#[derive(clap::Args, Debug, Clone)]
pub struct EngineArgs {
    /// `host:port` of the engine Temporal (where the rollout workflows run) [default:
    /// 127.0.0.1:7233; the operator commands use the sandbox's when the kubeconfig is one of
    /// `make dev`].
    #[arg(long, env = "TWC_ENGINE_ADDRESS")]
    pub engine_address: Option<String>,
    /// Engine Temporal namespace [default: default].
    #[arg(long, env = "TWC_ENGINE_NAMESPACE")]
    pub engine_namespace: Option<String>,
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
            address: self
                .engine_address
                .clone()
                .unwrap_or_else(|| DEFAULT_ENGINE_ADDRESS.to_owned()),
            namespace: self.namespace().to_owned(),
            task_queue: task_queue.to_owned(),
            identity: identity.to_owned(),
            api_key: self.engine_api_key.clone(),
            tls,
            max_cached_workflows: twc_worker::DEFAULT_MAX_CACHED_WORKFLOWS,
            traces: None,
            max_concurrent_waits: twc_worker::DEFAULT_MAX_CONCURRENT_WAITS as usize,
        }
    }

    /// The engine Temporal namespace.
    pub fn namespace(&self) -> &str {
        self.engine_namespace
            .as_deref()
            .unwrap_or(DEFAULT_ENGINE_NAMESPACE)
    }

    /// These flags with the sandbox's Temporal in place of an address (and namespace) nobody
    /// set.
    pub fn or_sandbox(&self, sandbox: Option<&Sandbox>) -> Self {
        let mut args = self.clone();
        let Some(sandbox) = sandbox else {
            return args;
        };
        if args.engine_address.is_some() {
            return args;
        }
        match sandbox.production_temporal.as_ref().filter(|p| p.engine) {
            // The engine runs on the production-like Temporal: its address, CA, server name and
            // the controller's certificate, unless set.
            Some(production) => {
                args.engine_address = Some(production.address.clone());
                args.engine_tls_ca
                    .get_or_insert_with(|| production.ca_path.clone());
                args.engine_tls_server_name
                    .get_or_insert_with(|| production.server_name.clone());
                if args.engine_tls_cert.is_none()
                    && args.engine_api_key.is_none()
                    && let (Some(cert), Some(key)) = (
                        &production.controller_cert_path,
                        &production.controller_key_path,
                    )
                {
                    args.engine_tls_cert = Some(cert.clone());
                    args.engine_tls_key = Some(key.clone());
                }
            }
            None => args.engine_address = Some(sandbox.temporal_address.clone()),
        }
        if args.engine_namespace.is_none() {
            args.engine_namespace = Some(sandbox.temporal_namespace.clone());
        }
        args
    }
}

/// What the operator commands take from a running sandbox's env file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sandbox {
    /// Temporal frontend `host:port`.
    pub temporal_address: String,
    /// Temporal namespace of the engine.
    pub temporal_namespace: String,
    /// Temporal Web UI, when it runs.
    #[serde(default)]
    pub temporal_ui_url: Option<String>,
    /// The sandbox's kubeconfig (the env file belongs to this kubeconfig only).
    kubeconfig: PathBuf,
    /// The production-like Temporal (`--production-temporal`), when it runs.
    #[serde(default)]
    pub production_temporal: Option<ProductionEngine>,
}

/// What the operator commands take from the sandbox's production-like Temporal: where the
/// engine runs when `engine` is set, and the controller's credentials there.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProductionEngine {
    /// Frontend `host:port` (TLS).
    pub address: String,
    /// TLS server name of its certificate.
    pub server_name: String,
    /// CA of its certificate.
    pub ca_path: PathBuf,
    /// The controller's client certificate, when the engine runs there.
    #[serde(default)]
    pub controller_cert_path: Option<PathBuf>,
    /// Its key.
    #[serde(default)]
    pub controller_key_path: Option<PathBuf>,
    /// Whether the controller's engine runs there.
    #[serde(default)]
    pub engine: bool,
}

/// Names the env file of a running sandbox (`twc-sandbox exec` sets it; `make dev` prints the
/// `export`).
pub const SANDBOX_ENV_VAR: &str = "TWC_ENV_FILE";

/// The sandbox named by [`SANDBOX_ENV_VAR`], when the kubeconfig in use (`--kubeconfig`, else
/// each file of `$KUBECONFIG`) is that sandbox's: its Temporal is where the engine runs. None
/// otherwise (never a guess from files next to the kubeconfig).
pub fn sandbox_of(kubeconfig: Option<&Path>) -> Option<Sandbox> {
    let env_file = std::env::var_os(SANDBOX_ENV_VAR).map(PathBuf::from)?;
    sandbox_from(&env_file, kubeconfig)
}

/// The sandbox of `env_file` when it names the kubeconfig in use.
fn sandbox_from(env_file: &Path, kubeconfig: Option<&Path>) -> Option<Sandbox> {
    let candidates: Vec<PathBuf> = match kubeconfig {
        Some(path) => vec![path.to_owned()],
        None => std::env::var_os("KUBECONFIG")
            .map(|v| std::env::split_paths(&v).collect())
            .unwrap_or_default(),
    };
    let text = std::fs::read_to_string(env_file).ok()?;
    let sandbox: Sandbox = serde_json::from_str(&text).ok()?;
    let named = std::fs::canonicalize(&sandbox.kubeconfig).ok()?;
    candidates
        .iter()
        .any(|path| std::fs::canonicalize(path).ok().as_ref() == Some(&named))
        .then_some(sandbox)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Name of the file a sandbox writes into its state folder; its kubeconfig is
    /// `<state folder>/apiserver/kubeconfig`.
    const SANDBOX_ENV_FILE: &str = "env.json";

    fn args(address: Option<&str>) -> EngineArgs {
        EngineArgs {
            engine_address: address.map(str::to_owned),
            engine_namespace: None,
            engine_api_key: None,
            engine_tls_cert: None,
            engine_tls_key: None,
            engine_tls_ca: None,
            engine_tls_server_name: None,
        }
    }

    /// A sandbox state folder as `twc-sandbox up` leaves it; returns its kubeconfig.
    fn sandbox_dir(name: &str, env_kubeconfig: Option<&Path>) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("twc-cli-{}-{name}", std::process::id()));
        let kubeconfig = dir.join("apiserver").join("kubeconfig");
        std::fs::create_dir_all(dir.join("apiserver")).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(&kubeconfig, "apiVersion: v1\n").unwrap_or_else(|e| panic!("{e}"));
        let env = serde_json::json!({
            "temporalAddress": "127.0.0.1:40123",
            "temporalNamespace": "default",
            "temporalUiUrl": "http://127.0.0.1:40124",
            "temporalMetricsUrl": "http://127.0.0.1:40125/metrics",
            "kubeconfig": env_kubeconfig.unwrap_or(&kubeconfig),
            "logsDir": dir.join("logs"),
        });
        std::fs::write(dir.join(SANDBOX_ENV_FILE), env.to_string())
            .unwrap_or_else(|e| panic!("{e}"));
        kubeconfig
    }

    /// The env file of the sandbox folder `sandbox_dir` made for `kubeconfig`.
    fn env_file_of(kubeconfig: &Path) -> PathBuf {
        kubeconfig
            .ancestors()
            .nth(2)
            .map(|dir| dir.join(SANDBOX_ENV_FILE))
            .unwrap_or_else(|| panic!("no state folder"))
    }

    #[test]
    fn a_sandbox_kubeconfig_leads_to_the_sandbox_temporal() {
        let kubeconfig = sandbox_dir("found", None);
        let sandbox = sandbox_from(&env_file_of(&kubeconfig), Some(&kubeconfig));
        assert_eq!(
            sandbox.as_ref().map(|s| s.temporal_address.as_str()),
            Some("127.0.0.1:40123")
        );
        let config = args(None).or_sandbox(sandbox.as_ref()).config("q", "me");
        assert_eq!(
            (config.address.as_str(), config.namespace.as_str()),
            ("127.0.0.1:40123", "default")
        );
    }

    #[test]
    fn a_sandbox_whose_engine_runs_on_the_production_like_temporal_leads_there_over_mtls() {
        let kubeconfig = sandbox_dir("production", None);
        let env_file = kubeconfig
            .ancestors()
            .nth(2)
            .map(|dir| dir.join(SANDBOX_ENV_FILE))
            .unwrap_or_else(|| panic!("no state folder"));
        let text = std::fs::read_to_string(&env_file).unwrap_or_else(|e| panic!("{e}"));
        let mut env: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}"));
        env["productionTemporal"] = serde_json::json!({
            "address": "127.0.0.1:40200", "serverName": "temporal.test",
            "caPath": "/state/certs/ca.pem", "controllerCertPath": "/state/certs/controller.pem",
            "controllerKeyPath": "/state/certs/controller.key", "engine": true,
            "apiKeysDir": "/state/api-keys"
        });
        std::fs::write(&env_file, env.to_string()).unwrap_or_else(|e| panic!("{e}"));
        let sandbox = sandbox_from(&env_file_of(&kubeconfig), Some(&kubeconfig));
        let config = args(None).or_sandbox(sandbox.as_ref()).config("q", "me");
        assert_eq!(config.address, "127.0.0.1:40200");
        let tls = config.tls.unwrap_or_else(|| panic!("TLS on"));
        assert_eq!(tls.server_name.as_deref(), Some("temporal.test"));
        assert_eq!(tls.ca_cert, Some(PathBuf::from("/state/certs/ca.pem")));
        assert_eq!(
            tls.client_cert,
            Some(PathBuf::from("/state/certs/controller.pem"))
        );
        // Without `engine`, the dev server stays the engine.
        env["productionTemporal"]["engine"] = serde_json::json!(false);
        std::fs::write(&env_file, env.to_string()).unwrap_or_else(|e| panic!("{e}"));
        let sandbox = sandbox_from(&env_file_of(&kubeconfig), Some(&kubeconfig));
        let config = args(None).or_sandbox(sandbox.as_ref()).config("q", "me");
        assert_eq!(config.address, "127.0.0.1:40123");
        assert!(config.tls.is_none());
    }

    #[test]
    fn an_address_that_was_set_wins_over_the_sandbox() {
        let kubeconfig = sandbox_dir("set", None);
        let sandbox = sandbox_from(&env_file_of(&kubeconfig), Some(&kubeconfig));
        let config = args(Some("temporal.example:7233"))
            .or_sandbox(sandbox.as_ref())
            .config("q", "me");
        assert_eq!(config.address, "temporal.example:7233");
        assert_eq!(args(None).config("q", "me").address, DEFAULT_ENGINE_ADDRESS);
    }

    #[test]
    fn an_env_file_of_another_kubeconfig_is_not_used() {
        let other = std::env::temp_dir().join("twc-cli-other-kubeconfig");
        std::fs::write(&other, "apiVersion: v1\n").unwrap_or_else(|e| panic!("{e}"));
        let kubeconfig = sandbox_dir("other", Some(&other));
        assert_eq!(
            sandbox_from(&env_file_of(&kubeconfig), Some(&kubeconfig)),
            None
        );
        assert_eq!(
            sandbox_from(
                &env_file_of(&kubeconfig),
                Some(Path::new("/nonexistent/kubeconfig"))
            ),
            None
        );
    }
}
