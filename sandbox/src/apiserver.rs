//! The local kube-apiserver (with etcd) built from the Kubernetes Go modules by
//! `sandbox/apiserver` (`make tools`), and CRD installation into it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::process::Command;

use crate::process::{Supervised, spawn_logged};
use crate::wait::{WaitError, wait_until};

/// Field manager of objects the sandbox applies.
pub const FIELD_MANAGER: &str = "twc-sandbox";

/// A running API server.
#[derive(Debug)]
pub struct ApiServer {
    /// Admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// HTTPS port on 127.0.0.1; a restart reuses it so clients reconnect.
    pub port: u16,
    /// The process.
    pub process: Supervised,
}

/// The API server or the CRDs could not be brought up.
#[derive(Debug, thiserror::Error)]
pub enum ApiServerError {
    /// The process could not start.
    #[error(transparent)]
    Process(#[from] crate::process::ProcessError),
    /// The kubeconfig never appeared.
    #[error("kube-apiserver did not become ready (log: {log}): {source}")]
    NotReady {
        /// Log file to read.
        log: PathBuf,
        /// What the wait saw.
        source: WaitError,
    },
    /// The process exited while starting, every time it was started.
    #[error("kube-apiserver exited while starting ({status}; log: {log})")]
    Exited {
        /// Log file to read.
        log: PathBuf,
        /// How it exited.
        status: String,
    },
    /// `apiserver.json` (written before the kubeconfig) is missing or unreadable.
    #[error("reading {path}: {message}")]
    Info {
        /// File path.
        path: PathBuf,
        /// What was wrong.
        message: String,
    },
    /// The kubeconfig is unusable.
    #[error("loading kubeconfig {path}: {message}")]
    Kubeconfig {
        /// Kubeconfig path.
        path: PathBuf,
        /// Loader error.
        message: String,
    },
    /// Applying a CRD failed.
    #[error("applying CRD {name}: {source}")]
    ApplyCrd {
        /// CRD name.
        name: String,
        /// API error.
        source: kube::Error,
    },
    /// A CRD never became Established.
    #[error("CRD {name} not established: {source}")]
    CrdNotEstablished {
        /// CRD name.
        name: String,
        /// What the wait saw.
        source: WaitError,
    },
}

/// Starts `twc-apiserver --dir <dir>` and waits for its kubeconfig (written once /readyz passes).
pub async fn start(binary: &Path, dir: &Path, log: &Path) -> Result<ApiServer, ApiServerError> {
    start_on(binary, dir, log, None).await
}

/// Like [`start`], on `port` when given: restarting on the port and `dir` of an earlier run
/// keeps etcd's data, the certificates and the tokens, so clients of the kubeconfig reconnect.
pub async fn start_on(
    binary: &Path,
    dir: &Path,
    log: &Path,
    port: Option<u16>,
) -> Result<ApiServer, ApiServerError> {
    let kubeconfig = dir.join("kubeconfig");
    let mut attempt = 1;
    loop {
        // A kubeconfig left by an earlier run must not be mistaken for readiness.
        let _ = std::fs::remove_file(&kubeconfig);
        let mut command = Command::new(binary);
        command.arg("--dir").arg(dir);
        if let Some(port) = port {
            command.arg("--port").arg(port.to_string());
        }
        let mut process = spawn_logged("kube-apiserver", command, log)?;
        let started = wait_until(
            "kube-apiserver kubeconfig",
            Duration::from_secs(120),
            || {
                let ready = kubeconfig.exists();
                let exited = if ready { None } else { process.exited() };
                async move { if ready { Some(Ok(())) } else { exited.map(Err) } }
            },
        )
        .await
        .map_err(|source| ApiServerError::NotReady {
            log: log.to_owned(),
            source,
        })?;
        match started {
            Ok(()) => {
                let port = read_port(&dir.join("apiserver.json"))?;
                return Ok(ApiServer {
                    kubeconfig,
                    port,
                    process,
                });
            }
            // etcd's ports are picked free, then bound: another process may take one in
            // between ("address already in use"). A new start picks new ones.
            Err(status) if attempt < START_ATTEMPTS => {
                tracing::warn!(%status, attempt, log = %log.display(), "kube-apiserver exited while starting; starting it again");
                attempt += 1;
            }
            Err(status) => {
                return Err(ApiServerError::Exited {
                    log: log.to_owned(),
                    status,
                });
            }
        }
    }
}

/// Starts of the kube-apiserver tried before giving up on one that exits while starting.
const START_ATTEMPTS: u32 = 3;

/// The `port` of `apiserver.json`.
fn read_port(path: &Path) -> Result<u16, ApiServerError> {
    let fail = |message: String| ApiServerError::Info {
        path: path.to_owned(),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
    let info: serde_json::Value = serde_json::from_str(&text).map_err(|e| fail(e.to_string()))?;
    info["port"]
        .as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .ok_or_else(|| fail(format!("no port in {text}")))
}

/// A client for a kubeconfig file.
pub async fn client(kubeconfig: &Path) -> Result<kube::Client, ApiServerError> {
    let fail = |message: String| ApiServerError::Kubeconfig {
        path: kubeconfig.to_owned(),
        message,
    };
    let config = Kubeconfig::read_from(kubeconfig).map_err(|e| fail(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(config, &KubeConfigOptions::default())
        .await
        .map_err(|e| fail(e.to_string()))?;
    kube::Client::try_from(config).map_err(|e| fail(e.to_string()))
}

/// Server-side applies the controller's CRDs and waits until they are served.
pub async fn install_crds(client: &kube::Client) -> Result<(), ApiServerError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for manifest in twc_crds::crd_yaml::crd_manifests() {
        let name = manifest.crd.metadata.name.clone().unwrap_or_default();
        api.patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&manifest.crd),
        )
        .await
        .map_err(|source| ApiServerError::ApplyCrd {
            name: name.clone(),
            source,
        })?;
        wait_until(
            &format!("CRD {name} Established"),
            Duration::from_secs(30),
            || async {
                let crd = api.get(&name).await.ok()?;
                let established = crd
                    .status?
                    .conditions?
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True");
                established.then_some(())
            },
        )
        .await
        .map_err(|source| ApiServerError::CrdNotEstablished {
            name: name.clone(),
            source,
        })?;
    }
    Ok(())
}
