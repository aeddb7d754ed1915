//! Prometheus metrics of the sample worker: the outcomes of its `greet` activity, served on
//! `/metrics` over plain HTTP, and optionally announced to Prometheus through a file_sd target
//! file (many workers share one host in the sandbox, so each listens on a port of its own
//! choosing and says where).

use std::{
    convert::Infallible,
    fmt,
    net::{Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use anyhow::{Context, Result};
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::{server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use prometheus_client::{
    encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder, text},
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};
use serde_json::json;
use tokio::{net::TcpListener, task::JoinHandle};
use tracing::{debug, info, warn};

use crate::config::MetricsConfig;

/// Content type of the OpenMetrics text prometheus-client writes.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// A connection is closed after this long, whatever it is doing (a scrape takes milliseconds).
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);

/// How one `greet` activity ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// It returned its greeting.
    Ok,
    /// It failed on purpose (`SAMPLE_FAIL_SHARE`).
    Failed,
}

impl Outcome {
    /// The `outcome` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Failed => "failed",
        }
    }
}

impl EncodeLabelValue for Outcome {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), fmt::Error> {
        fmt::Write::write_str(encoder, self.as_str())
    }
}

/// Labels of `sample_greetings_total`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct GreetingLabels {
    build_id: String,
    outcome: Outcome,
}

/// The worker's metrics.
pub struct GreetingMetrics {
    registry: Registry,
    greetings: Family<GreetingLabels, Counter>,
    build_id: String,
}

impl GreetingMetrics {
    /// Metrics of a worker of `build_id`; both outcomes start at 0, so a ratio of the two has
    /// data before the first failure.
    pub fn new(build_id: &str) -> Self {
        let greetings = Family::<GreetingLabels, Counter>::default();
        let mut registry = Registry::default();
        registry.register(
            "sample_greetings",
            "greet activities run, by build ID and outcome (ok or failed)",
            greetings.clone(),
        );
        let metrics = Self {
            registry,
            greetings,
            build_id: build_id.to_owned(),
        };
        for outcome in [Outcome::Ok, Outcome::Failed] {
            // Creating the series is the point; the returned guard is not needed.
            let _ = metrics.greetings.get_or_create(&metrics.labels(outcome));
        }
        metrics
    }

    fn labels(&self, outcome: Outcome) -> GreetingLabels {
        GreetingLabels {
            build_id: self.build_id.clone(),
            outcome,
        }
    }

    /// Counts one `greet` activity that ended with `outcome`.
    pub fn record(&self, outcome: Outcome) {
        self.greetings.get_or_create(&self.labels(outcome)).inc();
    }

    /// The OpenMetrics text of every metric.
    pub fn render(&self) -> Result<String, fmt::Error> {
        let mut page = String::new();
        text::encode(&mut page, &self.registry)?;
        Ok(page)
    }
}

/// Who this worker is, for the labels of its file_sd target.
pub struct Instance<'a> {
    /// Pod name (or host name outside Kubernetes).
    pub pod: &'a str,
    /// `TEMPORAL_DEPLOYMENT_NAME`.
    pub deployment: &'a str,
    /// `TEMPORAL_WORKER_BUILD_ID`.
    pub build_id: &'a str,
}

/// The running `/metrics` listener; dropping it stops serving and removes the target file.
pub struct MetricsServer {
    /// Where `/metrics` is served (port 0 resolved).
    pub address: SocketAddr,
    _target: Option<TargetFile>,
    accept: JoinHandle<()>,
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Binds the listener of `config`, serves `/metrics` on a background task and, with an SD
/// folder, writes the file_sd target file that points Prometheus at it.
pub async fn serve(
    config: &MetricsConfig,
    metrics: Arc<GreetingMetrics>,
    instance: &Instance<'_>,
) -> Result<MetricsServer> {
    let listener = TcpListener::bind(config.bind)
        .await
        .with_context(|| format!("listening on {} for /metrics", config.bind))?;
    let address = listener
        .local_addr()
        .context("reading the /metrics listener's address")?;
    let target = match &config.sd_dir {
        Some(dir) => Some(TargetFile::write(dir, scrape_address(address), instance)?),
        None => None,
    };
    Ok(MetricsServer {
        address,
        _target: target,
        accept: tokio::spawn(accept_loop(listener, metrics)),
    })
}

/// The address Prometheus scrapes: a wildcard bind is reached on loopback.
fn scrape_address(bound: SocketAddr) -> SocketAddr {
    if bound.ip().is_unspecified() {
        SocketAddr::from((Ipv4Addr::LOCALHOST, bound.port()))
    } else {
        bound
    }
}

async fn accept_loop(listener: TcpListener, metrics: Arc<GreetingMetrics>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors and the like: wait instead of spinning.
                warn!("accepting a /metrics connection: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                let response = respond(request.method(), request.uri().path(), &metrics);
                async move { Ok::<_, Infallible>(response) }
            });
            let connection = http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service);
            if let Ok(Err(e)) = tokio::time::timeout(CONNECTION_TIMEOUT, connection).await {
                debug!("/metrics connection: {e}");
            }
        });
    }
}

/// The answer to `method path`.
fn respond(method: &Method, path: &str, metrics: &GreetingMetrics) -> Response<Full<Bytes>> {
    if path != "/metrics" {
        return plain(StatusCode::NOT_FOUND, "not found\n".to_owned());
    }
    if method != Method::GET && method != Method::HEAD {
        return plain(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed\n".to_owned(),
        );
    }
    let mut response = match metrics.render() {
        Ok(page) => {
            let mut response = plain(StatusCode::OK, page);
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static(CONTENT_TYPE),
            );
            response
        }
        Err(e) => plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics: {e}\n"),
        ),
    };
    if method == Method::HEAD {
        *response.body_mut() = Full::new(Bytes::new());
    }
    response
}

fn plain(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// A Prometheus file_sd file `<dir>/<pod>-<pid>.json` naming this worker's `/metrics`; removed
/// when dropped.
struct TargetFile {
    path: PathBuf,
}

impl TargetFile {
    /// Writes the file (to a temporary name first, so Prometheus never reads half of it).
    fn write(dir: &Path, address: SocketAddr, instance: &Instance<'_>) -> Result<Self> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating the metrics SD folder {}", dir.display()))?;
        let stem = format!("{}-{}", file_safe(instance.pod), std::process::id());
        let path = dir.join(format!("{stem}.json"));
        // Not `*.json`, so Prometheus ignores it until the rename.
        let tmp = dir.join(format!(".{stem}.json.tmp"));
        let body = target_json(address, instance);
        std::fs::write(&tmp, body.to_string())
            .with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &path)
            .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
        info!(path = %path.display(), %address, "wrote Prometheus target file");
        Ok(Self { path })
    }
}

impl Drop for TargetFile {
    fn drop(&mut self) {
        match std::fs::remove_file(&self.path) {
            Ok(()) => debug!(path = %self.path.display(), "removed metrics target file"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => warn!(path = %self.path.display(), "cannot remove metrics target file: {e}"),
        }
    }
}

/// The file_sd document: one target group with the worker's labels.
fn target_json(address: SocketAddr, instance: &Instance<'_>) -> serde_json::Value {
    json!([{
        "targets": [address.to_string()],
        "labels": {
            "build_id": instance.build_id,
            "deployment": instance.deployment,
            "pod": instance.pod,
        },
    }])
}

/// `name` with every character outside `[A-Za-z0-9._-]` replaced by `_`.
fn file_safe(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    const INSTANCE: Instance<'static> = Instance {
        pod: "hello-v2-x7k2p",
        deployment: "demo/hello",
        build_id: "v2",
    };

    fn page(metrics: &GreetingMetrics) -> String {
        metrics
            .render()
            .unwrap_or_else(|e| panic!("rendering: {e}"))
    }

    /// The value of `sample_greetings_total{build_id="v2",outcome=...}` on a page.
    fn greetings(page: &str, outcome: &str) -> Option<u64> {
        let series = format!(r#"sample_greetings_total{{build_id="v2",outcome="{outcome}"}} "#);
        page.lines()
            .find_map(|line| line.strip_prefix(&series))
            .and_then(|value| value.parse().ok())
    }

    #[test]
    fn counts_greetings_by_build_and_outcome_from_zero() {
        let metrics = GreetingMetrics::new("v2");
        let before = page(&metrics);
        assert_eq!(
            (greetings(&before, "ok"), greetings(&before, "failed")),
            (Some(0), Some(0)),
            "{before}"
        );
        metrics.record(Outcome::Ok);
        metrics.record(Outcome::Ok);
        metrics.record(Outcome::Failed);
        let after = page(&metrics);
        assert_eq!(
            (greetings(&after, "ok"), greetings(&after, "failed")),
            (Some(2), Some(1)),
            "{after}"
        );
        assert!(after.contains("# TYPE sample_greetings counter"), "{after}");
    }

    #[test]
    fn target_file_names_the_scrape_address_and_labels() {
        let address = scrape_address(SocketAddr::from(([0, 0, 0, 0], 4242)));
        assert_eq!(address, SocketAddr::from(([127, 0, 0, 1], 4242)));
        assert_eq!(
            target_json(address, &INSTANCE),
            json!([{
                "targets": ["127.0.0.1:4242"],
                "labels": {"build_id": "v2", "deployment": "demo/hello", "pod": "hello-v2-x7k2p"},
            }])
        );
        assert_eq!(file_safe("a/b c.d-e_f"), "a_b_c.d-e_f");
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "sample-worker-{name}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    async fn get(address: SocketAddr, path: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(address)
            .await
            .unwrap_or_else(|e| panic!("connecting to {address}: {e}"));
        let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
        stream
            .write_all(request.as_bytes())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut response = String::new();
        stream
            .read_to_string(&mut response)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        response
    }

    #[tokio::test]
    async fn serves_metrics_on_a_free_port_and_announces_it_until_dropped() {
        let dir = temp_dir("sd");
        let config = MetricsConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            sd_dir: Some(dir.clone()),
        };
        let metrics = Arc::new(GreetingMetrics::new("v2"));
        metrics.record(Outcome::Failed);
        let server = serve(&config, metrics, &INSTANCE)
            .await
            .unwrap_or_else(|e| panic!("serving: {e:#}"));
        assert_ne!(server.address.port(), 0);

        let file = dir.join(format!("hello-v2-x7k2p-{}.json", std::process::id()));
        let written: serde_json::Value = serde_json::from_slice(
            &std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display())),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            written[0]["targets"][0],
            json!(server.address.to_string()),
            "{written}"
        );
        let names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{e}"))
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect();
        assert_eq!(names.len(), 1, "no temporary file left behind: {names:?}");

        let response = get(server.address, "/metrics").await;
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
        assert_eq!(greetings(&response, "failed"), Some(1), "{response}");
        let missing = get(server.address, "/other").await;
        assert!(missing.starts_with("HTTP/1.1 404 "), "{missing}");

        drop(server);
        assert!(!file.exists(), "{} still there", file.display());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
