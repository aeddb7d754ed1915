//! The HTTP endpoints of `twc run`: `/metrics` on the metrics address, `/healthz` and `/readyz`
//! on the health address (all three on one listener when both addresses are the same). A plain
//! HTTP/1.1 server on hyper, which the Kubernetes and Temporal clients already bring in.

use std::convert::Infallible;
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use twc_activities::metrics::{CONTENT_TYPE, Metrics};

use super::health::Health;

/// A connection is closed after this long, whatever it is doing (scrapes and probes take
/// milliseconds; this bounds idle and slow clients).
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a listener binds: `host:port`, `:port` (every interface) or off (`0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindAddress {
    /// This address (port 0: any free port, see the log for the one chosen).
    Addr(SocketAddr),
    /// Every interface: IPv6 and IPv4 (`[::]`) where the host has IPv6, else `0.0.0.0`.
    AnyInterface(u16),
    /// No listener.
    Off,
}

/// A bind address that does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadBindAddress(String);

impl fmt::Display for BadBindAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} is not a bind address: use host:port (an IP address), :port for every interface, or 0 to turn the endpoint off",
            self.0
        )
    }
}

impl std::error::Error for BadBindAddress {}

impl FromStr for BindAddress {
    type Err = BadBindAddress;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let bad = || BadBindAddress(s.to_owned());
        if s == "0" {
            return Ok(Self::Off);
        }
        if let Some(port) = s.strip_prefix(':') {
            return port.parse().map(Self::AnyInterface).map_err(|_| bad());
        }
        s.parse().map(Self::Addr).map_err(|_| bad())
    }
}

impl fmt::Display for BindAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Addr(addr) => write!(f, "{addr}"),
            Self::AnyInterface(port) => write!(f, ":{port}"),
            Self::Off => f.write_str("0"),
        }
    }
}

/// The endpoints one listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Endpoints {
    /// `/metrics`.
    pub metrics: bool,
    /// `/healthz` and `/readyz`.
    pub health: bool,
}

/// What the endpoints read.
#[derive(Debug, Clone)]
pub struct State {
    /// Rendered on `/metrics`.
    pub metrics: Arc<Metrics>,
    /// Answered on `/healthz` and `/readyz`.
    pub health: Arc<Health>,
}

/// A listener that could not be opened.
#[derive(Debug, thiserror::Error)]
#[error("listening on {address} for {what}: {source}")]
pub struct BindError {
    /// The address asked for.
    pub address: BindAddress,
    /// Which endpoints.
    pub what: &'static str,
    /// The socket error.
    pub source: std::io::Error,
}

/// Opens the metrics and health listeners (one when the addresses are equal) and serves them
/// on background tasks for the life of the runtime. Returns the bound addresses with what each
/// serves (port 0 resolved), so callers and logs know where to look.
pub async fn serve(
    metrics_address: BindAddress,
    health_address: BindAddress,
    state: State,
) -> Result<Vec<(SocketAddr, Endpoints)>, BindError> {
    let mut plan: Vec<(BindAddress, Endpoints)> = Vec::new();
    for (address, endpoints) in [
        (
            metrics_address,
            Endpoints {
                metrics: true,
                health: false,
            },
        ),
        (
            health_address,
            Endpoints {
                metrics: false,
                health: true,
            },
        ),
    ] {
        if address == BindAddress::Off {
            continue;
        }
        match plan.iter_mut().find(|(a, _)| *a == address) {
            Some((_, existing)) => {
                existing.metrics |= endpoints.metrics;
                existing.health |= endpoints.health;
            }
            None => plan.push((address, endpoints)),
        }
    }
    let mut bound = Vec::new();
    for (address, endpoints) in plan {
        let what = match (endpoints.metrics, endpoints.health) {
            (true, true) => "/metrics, /healthz and /readyz",
            (true, false) => "/metrics",
            _ => "/healthz and /readyz",
        };
        let listener = bind(address).await.map_err(|source| BindError {
            address,
            what,
            source,
        })?;
        let local = listener.local_addr().map_err(|source| BindError {
            address,
            what,
            source,
        })?;
        tracing::info!(address = %local, "serving {what}");
        tokio::spawn(accept_loop(listener, endpoints, state.clone()));
        bound.push((local, endpoints));
    }
    Ok(bound)
}

/// A listener on `address` (every interface: IPv6 and IPv4 where the host has IPv6).
pub async fn bind(address: BindAddress) -> std::io::Result<TcpListener> {
    match address {
        BindAddress::Addr(addr) => TcpListener::bind(addr).await,
        BindAddress::AnyInterface(port) => {
            match TcpListener::bind((Ipv6Addr::UNSPECIFIED, port)).await {
                Ok(listener) => Ok(listener),
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Err(e),
                // No IPv6 on this host.
                Err(_) => TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).await,
            }
        }
        BindAddress::Off => Err(std::io::Error::other("endpoint turned off")),
    }
}

async fn accept_loop(listener: TcpListener, endpoints: Endpoints, state: State) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors and the like: wait instead of spinning.
                tracing::warn!("accepting a connection: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                let response = respond(request.method(), request.uri().path(), endpoints, &state);
                async move { Ok::<_, Infallible>(response) }
            });
            let connection = http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service);
            if let Ok(Err(e)) = tokio::time::timeout(CONNECTION_TIMEOUT, connection).await {
                tracing::debug!("telemetry connection: {e}");
            }
        });
    }
}

/// The response to `method path` on a listener serving `endpoints`.
pub fn respond(
    method: &Method,
    path: &str,
    endpoints: Endpoints,
    state: &State,
) -> Response<Full<Bytes>> {
    let known = match path {
        "/metrics" => endpoints.metrics,
        "/healthz" | "/readyz" => endpoints.health,
        _ => false,
    };
    if !known {
        return text(StatusCode::NOT_FOUND, "not found\n".to_owned());
    }
    if method != Method::GET && method != Method::HEAD {
        let mut response = text(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed\n".to_owned(),
        );
        response
            .headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    let body = |result: Result<(), Vec<&'static str>>| match result {
        Ok(()) => text(StatusCode::OK, "ok\n".to_owned()),
        Err(problems) => text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{}\n", problems.join("\n")),
        ),
    };
    let mut response = match path {
        "/metrics" => {
            let mut response = text(StatusCode::OK, state.metrics.render());
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static(CONTENT_TYPE),
            );
            response
        }
        "/healthz" => body(state.health.liveness()),
        _ => body(state.health.readiness()),
    };
    if method == Method::HEAD {
        *response.body_mut() = Full::new(Bytes::new());
    }
    response
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    fn state() -> State {
        State {
            metrics: Arc::new(Metrics::new()),
            health: Arc::new(Health::default()),
        }
    }

    const BOTH: Endpoints = Endpoints {
        metrics: true,
        health: true,
    };

    async fn body(response: Response<Full<Bytes>>) -> String {
        match response.into_body().collect().await {
            Ok(collected) => String::from_utf8_lossy(&collected.to_bytes()).into_owned(),
            Err(e) => match e {},
        }
    }

    #[test]
    fn bind_addresses_parse() {
        let parse = |s: &str| s.parse::<BindAddress>();
        assert_eq!(
            parse("0.0.0.0:8080"),
            Ok(BindAddress::Addr(SocketAddr::from(([0, 0, 0, 0], 8080))))
        );
        assert_eq!(
            parse("127.0.0.1:0"),
            Ok(BindAddress::Addr(SocketAddr::from(([127, 0, 0, 1], 0))))
        );
        assert_eq!(
            parse("[::1]:9090"),
            Ok(BindAddress::Addr(SocketAddr::from((
                Ipv6Addr::LOCALHOST,
                9090
            ))))
        );
        assert_eq!(parse(":8081"), Ok(BindAddress::AnyInterface(8081)));
        assert_eq!(parse("0"), Ok(BindAddress::Off));
        for bad in ["", "8080", "localhost:8080", ":http", "1.2.3.4"] {
            assert!(parse(bad).is_err(), "{bad:?} parsed");
        }
        assert_eq!(BindAddress::AnyInterface(8081).to_string(), ":8081");
    }

    #[tokio::test]
    async fn each_listener_serves_only_its_endpoints() {
        let state = state();
        let metrics_only = Endpoints {
            metrics: true,
            health: false,
        };
        let health_only = Endpoints {
            metrics: false,
            health: true,
        };
        let status =
            |path: &str, endpoints| respond(&Method::GET, path, endpoints, &state).status();
        assert_eq!(status("/metrics", metrics_only), StatusCode::OK);
        assert_eq!(status("/healthz", metrics_only), StatusCode::NOT_FOUND);
        assert_eq!(status("/metrics", health_only), StatusCode::NOT_FOUND);
        assert_eq!(status("/healthz", health_only), StatusCode::OK);
        assert_eq!(status("/", BOTH), StatusCode::NOT_FOUND);
        assert_eq!(
            respond(&Method::POST, "/metrics", BOTH, &state).status(),
            StatusCode::METHOD_NOT_ALLOWED
        );
        let head = respond(&Method::HEAD, "/metrics", BOTH, &state);
        assert_eq!(head.status(), StatusCode::OK);
        assert_eq!(body(head).await, "");
    }

    #[tokio::test]
    async fn readyz_says_what_is_missing_until_ready() {
        let state = state();
        let response = respond(&Method::GET, "/readyz", BOTH, &state);
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        let text = body(response).await;
        assert!(text.contains("watcher has not synced"), "{text}");
        state.health.watcher_synced();
        state.health.worker_running();
        let response = respond(&Method::GET, "/readyz", BOTH, &state);
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(body(response).await, "ok\n");
    }

    /// One request over a real socket: what a Prometheus scrape or a kubelet probe does.
    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut stream = match tokio::net::TcpStream::connect(addr).await {
            Ok(s) => s,
            Err(e) => panic!("connecting to {addr}: {e}"),
        };
        let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
        if let Err(e) = stream.write_all(request.as_bytes()).await {
            panic!("{e}");
        }
        let mut response = String::new();
        if let Err(e) = stream.read_to_string(&mut response).await {
            panic!("{e}");
        }
        response
    }

    #[tokio::test]
    async fn serves_over_tcp_on_one_listener_when_the_addresses_are_equal() {
        let state = state();
        state.metrics.kubernetes_request("list", "pods", "success");
        let loopback = BindAddress::Addr(SocketAddr::from(([127, 0, 0, 1], 0)));
        // Equal addresses share one listener...
        let bound = match serve(loopback, loopback, state.clone()).await {
            Ok(bound) => bound,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(bound.len(), 1, "{bound:?}");
        assert_eq!(bound[0].1, BOTH);
        let addr = bound[0].0;
        let metrics = get(addr, "/metrics").await;
        assert!(metrics.starts_with("HTTP/1.1 200 OK\r\n"), "{metrics}");
        assert!(
            metrics.contains("content-type: application/openmetrics-text; version=1.0.0"),
            "{metrics}"
        );
        assert!(
            metrics.contains(
                r#"twc_kubernetes_requests_total{verb="list",resource="pods",outcome="success"} 1"#
            ),
            "{metrics}"
        );
        let healthz = get(addr, "/healthz").await;
        assert!(healthz.starts_with("HTTP/1.1 200 OK\r\n"), "{healthz}");
        let readyz = get(addr, "/readyz").await;
        assert!(readyz.starts_with("HTTP/1.1 503 "), "{readyz}");

        // ... and an address in use is an error that names the endpoints.
        let split = match serve(loopback, BindAddress::Off, state.clone()).await {
            Ok(bound) => bound,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(split.len(), 1);
        let taken = BindAddress::Addr(split[0].0);
        match serve(BindAddress::Off, taken, state).await {
            Ok(bound) => panic!("bound {bound:?} twice"),
            Err(e) => assert!(e.to_string().contains("/healthz and /readyz"), "{e}"),
        }
    }
}
