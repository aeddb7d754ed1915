//! Prometheus for the sandbox (Debian's binary, unpacked into `.tools/bin` by `make tools`):
//! scrapes every worker the pod runner announces in `<state-dir>/prometheus/targets/*.json`
//! (file_sd) every second, so canary analysis and the tests that check it see fresh rates.
//!
//! Several instances can run on one state folder (a test may start its own beside the one of
//! `twc-sandbox exec --prometheus`): each has its own port, config file and TSDB folder. An
//! instance may be protected as a managed Prometheus service is ([`PrometheusOptions::protected`]):
//! HTTPS with a certificate of a CA of its own, and basic auth (Prometheus's
//! `--web.config.file`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use tokio::process::Command;

use crate::env::SandboxEnv;
use crate::ports::free_port;
use crate::process::{Supervised, spawn_logged};
use crate::wait::{WaitError, wait_until};

/// Environment variable giving commands run by `twc-sandbox exec --prometheus` the base URL.
pub const PROMETHEUS_URL_VAR: &str = "TWC_SANDBOX_PROMETHEUS_URL";
/// Folder (in the state dir) with Prometheus' config, data and the file_sd targets.
pub const PROMETHEUS_DIR: &str = "prometheus";
/// How long Prometheus may take to answer `/-/ready`.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Attempts of [`Prometheus::start`] when the port it picked was taken in the meantime.
const PORT_ATTEMPTS: usize = 3;
/// User of a protected Prometheus's basic auth.
pub const PROTECTED_USER: &str = "twc";
/// Password of [`PROTECTED_USER`].
pub const PROTECTED_PASSWORD: &str = "twc-sandbox-password";
/// bcrypt hash (cost 4) of [`PROTECTED_PASSWORD`], as Prometheus's web config wants it (made
/// with Go's `golang.org/x/crypto/bcrypt`, as Prometheus's documentation suggests; libxcrypt's
/// `crypt(3)` gives it back from the password and itself).
const PROTECTED_PASSWORD_BCRYPT: &str =
    "$2a$04$AT1QEw9B8b8iTcze0Y6wRePanFPpn.nwC7aBgiOq5nnAthFFJB6De";

/// The Prometheus binary in a tools folder (`make tools` puts it there).
pub fn binary(tools_dir: &Path) -> PathBuf {
    tools_dir.join("bin/prometheus")
}

/// The file_sd folder of a sandbox state folder: where workers announce their `/metrics`.
pub fn targets_dir(state_dir: &Path) -> PathBuf {
    state_dir.join(PROMETHEUS_DIR).join("targets")
}

/// How to start Prometheus.
#[derive(Debug, Clone)]
pub struct PrometheusOptions {
    /// The `prometheus` binary.
    pub binary: PathBuf,
    /// Folder for its config and TSDB; `<dir>/targets/*.json` are scraped.
    pub dir: PathBuf,
    /// Port on 127.0.0.1; a free one when `None`.
    pub port: Option<u16>,
    /// Log file (appended to).
    pub log: PathBuf,
    /// Serve HTTPS only (a certificate for 127.0.0.1 of a CA made for it) and ask every
    /// request for basic auth ([`PROTECTED_USER`], [`PROTECTED_PASSWORD`]).
    pub protected: bool,
}

impl PrometheusOptions {
    /// Options for a sandbox's state folder and tools folder (log in `<state-dir>/logs`).
    pub fn for_state_dir(state_dir: &Path, tools_dir: &Path) -> Self {
        Self {
            binary: binary(tools_dir),
            dir: state_dir.join(PROMETHEUS_DIR),
            port: None,
            log: state_dir.join("logs").join("prometheus.log"),
            protected: false,
        }
    }

    /// Options for the running sandbox `env` (as the end-to-end tests see it), on a free port.
    pub fn for_sandbox(env: &SandboxEnv) -> Result<Self, PrometheusError> {
        let missing = |what: &str| PrometheusError::NotInSandbox {
            what: what.to_owned(),
        };
        let binary = env
            .prometheus_bin
            .clone()
            .ok_or_else(|| missing("prometheusBin"))?;
        let dir = env
            .prometheus_targets_dir
            .as_deref()
            .and_then(Path::parent)
            .map(Path::to_owned)
            .ok_or_else(|| missing("prometheusTargetsDir"))?;
        Ok(Self {
            binary,
            dir,
            port: None,
            log: env.logs_dir.join("prometheus.log"),
            protected: false,
        })
    }
}

/// Prometheus could not be started or queried.
#[derive(Debug, thiserror::Error)]
pub enum PrometheusError {
    /// The binary is not installed.
    #[error("{path} is missing: run `make tools` (scripts/install-prometheus.sh)")]
    Missing {
        /// Where it was looked for.
        path: PathBuf,
    },
    /// The sandbox's env file does not say where Prometheus is (written by an older sandbox).
    #[error("the sandbox env has no {what}: restart the sandbox with this twc-sandbox")]
    NotInSandbox {
        /// The missing field.
        what: String,
    },
    /// A file or folder could not be written.
    #[error("writing {path}: {source}")]
    Write {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// No free port.
    #[error("finding a free port: {0}")]
    Port(#[source] std::io::Error),
    /// The process could not start.
    #[error(transparent)]
    Process(#[from] crate::process::ProcessError),
    /// It exited before becoming ready.
    #[error("Prometheus exited at start ({status}; log: {log})")]
    Exited {
        /// How it ended.
        status: String,
        /// Log file to read.
        log: PathBuf,
    },
    /// It never became ready.
    #[error("Prometheus did not become ready (log: {log}): {source}")]
    NotReady {
        /// Log file to read.
        log: PathBuf,
        /// What the wait saw.
        source: WaitError,
    },
    /// The certificates of a protected instance could not be made.
    #[error(transparent)]
    Pki(#[from] crate::production::pki::PkiError),
    /// A query failed.
    #[error("query {query:?} against {url}: {message}")]
    Query {
        /// The PromQL.
        query: String,
        /// The Prometheus base URL.
        url: String,
        /// What went wrong.
        message: String,
    },
}

/// One element of a query result: its labels and value.
#[derive(Debug, Clone, PartialEq)]
pub struct QuerySample {
    /// The series' labels (empty for an aggregate without `by`, or a scalar).
    pub labels: BTreeMap<String, String>,
    /// The value at the evaluation time.
    pub value: f64,
}

/// A running Prometheus; it is killed when dropped, stopped gracefully by [`Self::stop`].
#[derive(Debug)]
pub struct Prometheus {
    /// Base URL, `http://127.0.0.1:<port>` (`https://` when protected).
    pub url: String,
    /// The CA certificate (PEM) of a protected instance's server certificate.
    pub ca_pem: Option<String>,
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// The file_sd folder it watches.
    pub targets_dir: PathBuf,
    /// The process.
    pub process: Supervised,
}

impl Prometheus {
    /// Writes the config, starts Prometheus and waits until `/-/ready` answers 200. On a free
    /// port (unless `options.port` is set), retried on another one if it was taken meanwhile.
    pub async fn start(options: &PrometheusOptions) -> Result<Self, PrometheusError> {
        if !options.binary.exists() {
            return Err(PrometheusError::Missing {
                path: options.binary.clone(),
            });
        }
        let mut attempt = 1;
        loop {
            let port = match options.port {
                Some(port) => port,
                None => free_port().map_err(PrometheusError::Port)?,
            };
            match start_on(options, port).await {
                Err(e @ PrometheusError::Exited { .. })
                    if options.port.is_none()
                        && attempt < PORT_ATTEMPTS
                        && port_was_taken(&options.log) =>
                {
                    tracing::warn!("{e}; retrying on another port");
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    /// Evaluates an instant PromQL query now; a scalar result is one sample without labels.
    pub async fn query(&self, promql: &str) -> Result<Vec<QuerySample>, PrometheusError> {
        query_with(&self.url, promql, self.ca_pem.as_deref()).await
    }

    /// Stops Prometheus (SIGTERM, SIGKILL after 10 s).
    pub async fn stop(&mut self) {
        self.process.stop(Duration::from_secs(10)).await;
    }
}

/// Evaluates an instant PromQL query against the Prometheus at `url` (e.g. the value of
/// `TWC_SANDBOX_PROMETHEUS_URL`).
pub async fn query(url: &str, promql: &str) -> Result<Vec<QuerySample>, PrometheusError> {
    query_with(url, promql, None).await
}

/// [`query`], of a protected instance (whose CA is `ca_pem`) when `ca_pem` is set.
async fn query_with(
    url: &str,
    promql: &str,
    ca_pem: Option<&str>,
) -> Result<Vec<QuerySample>, PrometheusError> {
    let fail = |message: String| PrometheusError::Query {
        query: promql.to_owned(),
        url: url.to_owned(),
        message,
    };
    let encoded: String = url::form_urlencoded::byte_serialize(promql.as_bytes()).collect();
    let response = get(
        &format!("{}/api/v1/query?query={encoded}", url.trim_end_matches('/')),
        ca_pem,
    )
    .await
    .map_err(fail)?;
    let body: Value = serde_json::from_str(&response.body)
        .map_err(|e| fail(format!("HTTP {}: {e}: {}", response.status, response.body)))?;
    if body["status"] != "success" {
        return Err(fail(format!(
            "HTTP {}: {}: {}",
            response.status, body["errorType"], body["error"]
        )));
    }
    parse_result(&body["data"]).map_err(fail)
}

/// The samples of a query's `data` (`vector` or `scalar`).
fn parse_result(data: &Value) -> Result<Vec<QuerySample>, String> {
    let value_of = |pair: &Value| -> Result<f64, String> {
        pair.get(1)
            .and_then(Value::as_str)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("no value in {pair}"))
    };
    match data["resultType"].as_str() {
        Some("scalar") => Ok(vec![QuerySample {
            labels: BTreeMap::new(),
            value: value_of(&data["result"])?,
        }]),
        Some("vector") => data["result"]
            .as_array()
            .ok_or_else(|| format!("no result array in {data}"))?
            .iter()
            .map(|sample| {
                let labels = sample["metric"]
                    .as_object()
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                            .collect()
                    })
                    .unwrap_or_default();
                Ok(QuerySample {
                    labels,
                    value: value_of(&sample["value"])?,
                })
            })
            .collect(),
        other => Err(format!(
            "result type {other:?} is not supported (only instant vectors and scalars)"
        )),
    }
}

/// `GET url`, over HTTPS with basic auth for a protected instance (whose CA is `ca_pem`).
async fn get(url: &str, ca_pem: Option<&str>) -> Result<crate::http::Response, String> {
    match ca_pem {
        Some(ca_pem) => crate::http::get_tls(url, ca_pem, Some(&basic_authorization())).await,
        None => crate::http::get(url).await,
    }
}

/// The `Authorization` header value of [`PROTECTED_USER`].
pub fn basic_authorization() -> String {
    use base64::Engine as _;
    let credentials = format!("{PROTECTED_USER}:{PROTECTED_PASSWORD}");
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(credentials)
    )
}

/// Prometheus's web config of a protected instance: TLS with `cert_file` and `key_file`,
/// basic auth of [`PROTECTED_USER`].
fn web_config_yaml(cert_file: &Path, key_file: &Path) -> String {
    // JSON is YAML: quoting through serde_json keeps any character of the paths safe.
    let cert = Value::from(cert_file.display().to_string());
    let key = Value::from(key_file.display().to_string());
    let hash = Value::from(PROTECTED_PASSWORD_BCRYPT);
    format!(
        "tls_server_config:\n\
        \x20 cert_file: {cert}\n\
        \x20 key_file: {key}\n\
        basic_auth_users:\n\
        \x20 {PROTECTED_USER}: {hash}\n"
    )
}

/// Whether Prometheus' log says its port was taken.
fn port_was_taken(log: &Path) -> bool {
    std::fs::read_to_string(log).is_ok_and(|l| l.contains("address already in use"))
}

/// The config: every file_sd target in `targets_dir`, scraped and evaluated every second.
/// Scraped labels win over the target's (`honor_labels`), so a metric's own `build_id` is kept
/// as it is instead of becoming `exported_build_id`.
fn config_yaml(targets_dir: &Path) -> String {
    let pattern = targets_dir.join("*.json");
    // JSON is YAML: quoting the path through serde_json keeps any character in it safe.
    let files = Value::from(pattern.display().to_string());
    format!(
        "global:\n\
        \x20 scrape_interval: 1s\n\
        \x20 scrape_timeout: 1s\n\
        \x20 evaluation_interval: 1s\n\
        scrape_configs:\n\
        \x20 - job_name: workers\n\
        \x20   honor_labels: true\n\
        \x20   file_sd_configs:\n\
        \x20     - files: [{files}]\n\
        \x20       refresh_interval: 1s\n"
    )
}

async fn start_on(options: &PrometheusOptions, port: u16) -> Result<Prometheus, PrometheusError> {
    let targets_dir = options.dir.join("targets");
    let data_dir = options.dir.join(format!("data-{port}"));
    let config_file = options.dir.join(format!("prometheus-{port}.yml"));
    let write_err = |path: &Path| {
        let path = path.to_owned();
        move |source| PrometheusError::Write { path, source }
    };
    for dir in [&targets_dir, &data_dir] {
        std::fs::create_dir_all(dir).map_err(write_err(dir))?;
    }
    if let Some(logs) = options.log.parent() {
        std::fs::create_dir_all(logs).map_err(write_err(logs))?;
    }
    std::fs::write(&config_file, config_yaml(&targets_dir)).map_err(write_err(&config_file))?;

    let mut command = Command::new(&options.binary);
    command
        .arg(format!("--config.file={}", config_file.display()))
        .arg(format!("--storage.tsdb.path={}", data_dir.display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--log.level=warn");
    let ca_pem = if options.protected {
        let authority = crate::production::pki::Authority::new("twc sandbox Prometheus CA")?;
        let (cert_pem, key_pem) = authority.server_cert(&["localhost"])?;
        let cert_file = options.dir.join(format!("tls-{port}.crt"));
        let key_file = options.dir.join(format!("tls-{port}.key"));
        let web_file = options.dir.join(format!("web-{port}.yml"));
        std::fs::write(&cert_file, cert_pem).map_err(write_err(&cert_file))?;
        std::fs::write(&key_file, key_pem).map_err(write_err(&key_file))?;
        std::fs::write(&web_file, web_config_yaml(&cert_file, &key_file))
            .map_err(write_err(&web_file))?;
        command.arg(format!("--web.config.file={}", web_file.display()));
        Some(authority.cert_pem.clone())
    } else {
        None
    };
    let mut process = spawn_logged("prometheus", command, &options.log)?;
    let scheme = if ca_pem.is_some() { "https" } else { "http" };
    let url = format!("{scheme}://127.0.0.1:{port}");
    let ready_url = format!("{url}/-/ready");
    let ready = wait_until("Prometheus /-/ready", READY_TIMEOUT, || async {
        let response = get(&ready_url, ca_pem.as_deref()).await.ok()?;
        (response.status == 200).then_some(())
    });
    let exited = async {
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        loop {
            tick.tick().await;
            if let Some(status) = process.exited() {
                return status;
            }
        }
    };
    tokio::select! {
        result = ready => result.map_err(|source| PrometheusError::NotReady {
            log: options.log.clone(),
            source,
        })?,
        status = exited => {
            return Err(PrometheusError::Exited { status, log: options.log.clone() });
        }
    }
    tracing::info!(%url, targets = %targets_dir.display(), "Prometheus is ready");
    Ok(Prometheus {
        url,
        ca_pem,
        port,
        targets_dir,
        process,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn config_scrapes_every_file_sd_target_every_second() {
        let yaml = config_yaml(Path::new("/state/prometheus/targets"));
        assert!(yaml.contains("scrape_interval: 1s"), "{yaml}");
        assert!(yaml.contains("evaluation_interval: 1s"), "{yaml}");
        assert!(yaml.contains("scrape_timeout: 1s"), "{yaml}");
        assert!(
            yaml.contains(r#"- files: ["/state/prometheus/targets/*.json"]"#),
            "{yaml}"
        );
    }

    #[test]
    fn a_protected_instance_serves_tls_and_asks_for_basic_auth() {
        let yaml = web_config_yaml(Path::new("/p/tls-1.crt"), Path::new("/p/tls-1.key"));
        assert_eq!(
            yaml,
            "tls_server_config:\n  cert_file: \"/p/tls-1.crt\"\n  key_file: \"/p/tls-1.key\"\n\
             basic_auth_users:\n  twc: \"$2a$04$AT1QEw9B8b8iTcze0Y6wRePanFPpn.nwC7aBgiOq5nnAthFFJB6De\"\n"
        );
        // base64("twc:twc-sandbox-password")
        assert_eq!(
            basic_authorization(),
            "Basic dHdjOnR3Yy1zYW5kYm94LXBhc3N3b3Jk"
        );
    }

    #[test]
    fn vector_and_scalar_results_parse() {
        let vector = json!({
            "resultType": "vector",
            "result": [
                {"metric": {"build_id": "v2"}, "value": [1.7e9, "0.3"]},
                {"metric": {}, "value": [1.7e9, "NaN"]},
            ],
        });
        let samples = parse_result(&vector).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(samples.len(), 2);
        assert_eq!(
            samples[0].labels.get("build_id").map(String::as_str),
            Some("v2")
        );
        assert!((samples[0].value - 0.3).abs() < 1e-9);
        assert!(samples[1].value.is_nan());

        let scalar = json!({"resultType": "scalar", "result": [1.7e9, "2"]});
        let samples = parse_result(&scalar).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            samples,
            vec![QuerySample {
                labels: BTreeMap::new(),
                value: 2.0
            }]
        );

        let matrix = json!({"resultType": "matrix", "result": []});
        assert!(parse_result(&matrix).is_err());
    }

    #[test]
    fn options_for_a_sandbox_come_from_its_env_file() {
        let env: SandboxEnv = serde_json::from_value(json!({
            "temporalAddress": "127.0.0.1:7233",
            "temporalNamespace": "default",
            "temporalUiUrl": null,
            "temporalMetricsUrl": "http://127.0.0.1:9/metrics",
            "kubeconfig": "/s/apiserver/kubeconfig",
            "logsDir": "/s/logs",
            "podsDir": "/s/pods",
            "temporalCli": "/t/venv/bin/temporal",
            "kubectl": "/t/venv/bin/kubectl",
            "binDir": "/b",
            "controllerLog": null,
            "controllerPidFile": null,
            "prometheusBin": "/t/bin/prometheus",
            "prometheusTargetsDir": "/s/prometheus/targets",
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let options = PrometheusOptions::for_sandbox(&env).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(options.binary, PathBuf::from("/t/bin/prometheus"));
        assert_eq!(options.dir, PathBuf::from("/s/prometheus"));
        assert_eq!(options.log, PathBuf::from("/s/logs/prometheus.log"));
        assert_eq!(options.port, None);
    }
}
