//! The trace backend of the sandbox: Jaeger all-in-one (built from its Go module into
//! `.tools/bin` by `make jaeger`), with in-memory storage, an OTLP/gRPC receiver the controller
//! exports to, and the query API (`/api/traces?service=twc`) that people and tests read.
//!
//! The Jaeger UI's assets are not part of the Go module (they are built with npm and embedded
//! at release time), so the query port serves a placeholder page: read traces through the API.
//! Every port is a free loopback one, so tests can run their own Jaeger beside the sandbox's.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use tokio::process::Command;

use crate::ports::free_port;
use crate::process::{Supervised, spawn_logged};
use crate::wait::{WaitError, wait_until};

/// Environment variable giving commands run by `twc-sandbox exec --tracing` the query API URL.
pub const TRACING_QUERY_URL_VAR: &str = "TWC_SANDBOX_TRACING_QUERY_URL";
/// How long Jaeger may take to answer its health check.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Attempts of [`Jaeger::start`] when a port it picked was taken in the meantime.
const PORT_ATTEMPTS: usize = 3;

/// The Jaeger binary in a tools folder (`make tools` puts it there).
pub fn binary(tools_dir: &Path) -> PathBuf {
    tools_dir.join("bin/jaeger-all-in-one")
}

/// Jaeger could not be started or queried.
#[derive(Debug, thiserror::Error)]
pub enum TracingError {
    /// The binary is not installed.
    #[error("{path} is missing: run `make jaeger` (or `make tools`)")]
    Missing {
        /// Where it was looked for.
        path: PathBuf,
    },
    /// No free port.
    #[error("finding a free port: {0}")]
    Port(#[source] std::io::Error),
    /// The process could not start.
    #[error(transparent)]
    Process(#[from] crate::process::ProcessError),
    /// It exited before becoming ready.
    #[error("Jaeger exited at start ({status}; log: {log})")]
    Exited {
        /// How it ended.
        status: String,
        /// Log file to read.
        log: PathBuf,
    },
    /// It never became ready.
    #[error("Jaeger did not become ready (log: {log}): {source}")]
    NotReady {
        /// Log file to read.
        log: PathBuf,
        /// What the wait saw.
        source: WaitError,
    },
    /// A query failed.
    #[error("GET {url}: {message}")]
    Query {
        /// The URL.
        url: String,
        /// What went wrong.
        message: String,
    },
}

/// A running Jaeger; it is killed when dropped, stopped gracefully by [`Self::stop`].
#[derive(Debug)]
pub struct Jaeger {
    /// OTLP/gRPC endpoint to export to, `http://127.0.0.1:<port>`.
    pub otlp_endpoint: String,
    /// Base URL of the query API (and of the placeholder UI page).
    pub query_url: String,
    /// The process.
    pub process: Supervised,
}

impl Jaeger {
    /// Starts `binary` on free loopback ports, logging to `log`, and waits until it is healthy;
    /// retried on other ports if one was taken meanwhile.
    pub async fn start(binary: &Path, log: &Path) -> Result<Self, TracingError> {
        if !binary.exists() {
            return Err(TracingError::Missing {
                path: binary.to_owned(),
            });
        }
        let mut attempt = 1;
        loop {
            match start_on(binary, log, Ports::free()?).await {
                Err(e @ TracingError::Exited { .. })
                    if attempt < PORT_ATTEMPTS && port_was_taken(log) =>
                {
                    tracing::warn!("{e}; retrying on other ports");
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    /// The traces of `service` (Jaeger's JSON: `data[]` of `{traceID, spans[], processes}`).
    pub async fn traces(&self, service: &str) -> Result<Vec<Value>, TracingError> {
        traces(&self.query_url, service).await
    }

    /// Stops Jaeger (SIGTERM, SIGKILL after 10 s).
    pub async fn stop(&mut self) {
        self.process.stop(Duration::from_secs(10)).await;
    }
}

/// The traces of `service` from the Jaeger query API at `query_url` (at most 1000, newest
/// first, over the last hour).
pub async fn traces(query_url: &str, service: &str) -> Result<Vec<Value>, TracingError> {
    let url = format!(
        "{}/api/traces?service={}&limit=1000&lookback=1h",
        query_url.trim_end_matches('/'),
        url::form_urlencoded::byte_serialize(service.as_bytes()).collect::<String>()
    );
    let fail = |message: String| TracingError::Query {
        url: url.clone(),
        message,
    };
    let response = crate::http::get(&url).await.map_err(fail)?;
    if response.status != 200 {
        return Err(fail(format!("HTTP {}: {}", response.status, response.body)));
    }
    let body: Value = serde_json::from_str(&response.body).map_err(|e| fail(e.to_string()))?;
    Ok(body["data"].as_array().cloned().unwrap_or_default())
}

#[derive(Debug, Clone, Copy)]
struct Ports {
    otlp_grpc: u16,
    otlp_http: u16,
    query_http: u16,
    query_grpc: u16,
    admin: u16,
    collector_grpc: u16,
    collector_http: u16,
}

impl Ports {
    fn free() -> Result<Self, TracingError> {
        let port = || free_port().map_err(TracingError::Port);
        Ok(Self {
            otlp_grpc: port()?,
            otlp_http: port()?,
            query_http: port()?,
            query_grpc: port()?,
            admin: port()?,
            collector_grpc: port()?,
            collector_http: port()?,
        })
    }
}

/// Whether Jaeger's log says a port was taken.
fn port_was_taken(log: &Path) -> bool {
    std::fs::read_to_string(log).is_ok_and(|l| l.contains("address already in use"))
}

async fn start_on(binary: &Path, log: &Path, ports: Ports) -> Result<Jaeger, TracingError> {
    let at = |port: u16| format!("127.0.0.1:{port}");
    let mut command = Command::new(binary);
    command
        .arg(format!(
            "--collector.otlp.grpc.host-port={}",
            at(ports.otlp_grpc)
        ))
        .arg(format!(
            "--collector.otlp.http.host-port={}",
            at(ports.otlp_http)
        ))
        .arg(format!(
            "--query.http-server.host-port={}",
            at(ports.query_http)
        ))
        .arg(format!(
            "--query.grpc-server.host-port={}",
            at(ports.query_grpc)
        ))
        .arg(format!("--admin.http.host-port={}", at(ports.admin)))
        .arg(format!(
            "--collector.grpc-server.host-port={}",
            at(ports.collector_grpc)
        ))
        .arg(format!(
            "--collector.http-server.host-port={}",
            at(ports.collector_http)
        ))
        // No Zipkin receiver (its default port is fixed).
        .arg("--collector.zipkin.host-port=")
        .arg("--memory.max-traces=100000")
        .arg("--log-level=warn")
        // Jaeger traces itself to OTEL_EXPORTER_OTLP_ENDPOINT (default localhost:4317, maybe
        // another sandbox's Jaeger): off.
        .env("OTEL_TRACES_SAMPLER", "always_off")
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://{}", at(ports.otlp_grpc)),
        )
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env_remove("OTEL_SERVICE_NAME");
    let mut process = spawn_logged("jaeger", command, log)?;
    let health_url = format!("http://{}/", at(ports.admin));
    let ready = wait_until("Jaeger health check", READY_TIMEOUT, || async {
        let response = crate::http::get(&health_url).await.ok()?;
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
    let outcome = tokio::select! {
        ready = ready => ready.map_err(|source| TracingError::NotReady { log: log.to_owned(), source }),
        status = exited => Err(TracingError::Exited { status, log: log.to_owned() }),
    };
    outcome?;
    Ok(Jaeger {
        otlp_endpoint: format!("http://{}", at(ports.otlp_grpc)),
        query_url: format!("http://{}", at(ports.query_http)),
        process,
    })
}
