//! The dashboard's HTTP server: the page and its assets (embedded in the binary), the JSON the
//! page reads, the controls it sends, and `/api/live`, a server-sent event stream of every
//! change the watches see. HTTP/1.1 on hyper, as `twc run`'s metrics endpoint.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::broadcast::error::RecvError;
use twc_workflows::control;
use twc_workflows::model::TwdRef;

use super::Dashboard;
use super::details::details;
use super::store::{Change, Key};
use crate::cli::control::Answer;

type Body = BoxBody<Bytes, Infallible>;

/// A comment line on the live stream this often, so proxies and browsers keep it open.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");
const ICON_SVG: &str = include_str!("assets/icon.svg");

/// Serves `dashboard` on `listener` until the process ends.
pub async fn serve(listener: TcpListener, dashboard: Arc<Dashboard>) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!("dashboard: accepting a connection: {e}");
                continue;
            }
        };
        let dashboard = dashboard.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let dashboard = dashboard.clone();
                async move { Ok::<_, Infallible>(route(&dashboard, request).await) }
            });
            if let Err(e) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%peer, "dashboard connection: {e}");
            }
        });
    }
}

async fn route(dashboard: &Arc<Dashboard>, request: Request<Incoming>) -> Response<Body> {
    let path = request.uri().path().to_owned();
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    if let Err(refused) = same_site(dashboard.loopback, request.method(), request.headers()) {
        return json_response(StatusCode::FORBIDDEN, &json!({ "error": refused }));
    }
    match (request.method(), segments.as_slice()) {
        (&Method::GET, [""] | ["w", _, _]) => asset("text/html; charset=utf-8", INDEX_HTML),
        (&Method::GET, ["assets", "app.js"]) => asset("text/javascript; charset=utf-8", APP_JS),
        (&Method::GET, ["assets", "app.css"]) => asset("text/css; charset=utf-8", APP_CSS),
        (&Method::GET, ["assets", "icon.svg"] | ["favicon.ico"]) => {
            asset("image/svg+xml", ICON_SVG)
        }
        (&Method::GET, ["api", "overview"]) => json_response(
            StatusCode::OK,
            &json!({
                "synced": dashboard.store.synced(),
                "now": now_millis(),
                "rows": dashboard.store.rows(),
            }),
        ),
        (&Method::GET, ["api", "workers", namespace, name]) => {
            let key = (decode(namespace), decode(name));
            match details(dashboard, &key).await {
                Some(value) => json_response(StatusCode::OK, &value),
                None => not_found(&key),
            }
        }
        (&Method::POST, ["api", "workers", namespace, name, action]) => {
            let key = (decode(namespace), decode(name));
            send_control(dashboard, &key, action).await
        }
        (&Method::GET, ["api", "live"]) => live(dashboard),
        _ => json_response(
            StatusCode::NOT_FOUND,
            &json!({ "error": format!("no such page: {path}") }),
        ),
    }
}

fn asset(content_type: &'static str, body: &'static str) -> Response<Body> {
    response(
        StatusCode::OK,
        content_type,
        Bytes::from_static(body.as_bytes()),
    )
}

fn response(status: StatusCode, content_type: &'static str, body: Bytes) -> Response<Body> {
    let mut response = Response::new(Full::new(body).boxed());
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    headers.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    response
}

fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    response(
        status,
        "application/json",
        Bytes::from(serde_json::to_vec(value).unwrap_or_default()),
    )
}

fn not_found(key: &Key) -> Response<Body> {
    json_response(
        StatusCode::NOT_FOUND,
        &json!({ "error": format!("no worker deployment {}/{} in the watched namespaces", key.0, key.1) }),
    )
}

/// The header the page sends with a control (its value: the control). A cross-site form or
/// `fetch` cannot send it without a CORS preflight, which this server never grants.
const CONTROL_HEADER: &str = "x-twc-control";

/// Refuses what another site's page could make a browser send: a control without the page's
/// header or from another origin, and, on a loopback address, any request naming a host other
/// than a loopback one (a DNS-rebound name).
fn same_site(loopback: bool, method: &Method, headers: &http::HeaderMap) -> Result<(), String> {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    if loopback && !is_loopback_host(host) {
        return Err(format!(
            "host {host:?} is not a loopback address; open the dashboard at the address it printed"
        ));
    }
    if *method != Method::POST {
        return Ok(());
    }
    if !headers.contains_key(CONTROL_HEADER) {
        return Err("controls are sent by the dashboard's page only".to_owned());
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or_default();
        let authority = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"))
            .unwrap_or_default();
        if !authority.eq_ignore_ascii_case(host) {
            return Err(format!("controls from {origin} are refused"));
        }
    }
    Ok(())
}

/// Whether `host` (a Host header: name or address, and port) is a loopback one.
fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.eq_ignore_ascii_case("localhost")
        || name.to_ascii_lowercase().ends_with(".localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Sends a control through the engine's validated path and answers as the CLI prints it.
async fn send_control(dashboard: &Dashboard, key: &Key, action: &str) -> Response<Body> {
    let Some(action) = control::parse_action(action) else {
        return json_response(
            StatusCode::BAD_REQUEST,
            &json!({ "error": format!("{action:?} is not a control: use pause, resume, promote, abort or retry") }),
        );
    };
    if dashboard.store.worker(key).is_none() {
        return not_found(key);
    }
    let twd = TwdRef {
        namespace: key.0.clone(),
        name: key.1.clone(),
    };
    let (accepted, text) = match dashboard.engine.control(&twd, action).await {
        Ok(Answer::Accepted(message)) => (true, format!("accepted: {message}")),
        Ok(Answer::Rejected(reason)) => (false, format!("rejected: {reason}")),
        Ok(Answer::Unanswered(message)) => (false, message),
        Err(e) => (false, format!("failed: {e:#}")),
    };
    tracing::info!(twd = %twd.key(), action = control::action_name(action), %text, "dashboard control");
    json_response(
        StatusCode::OK,
        &json!({ "accepted": accepted, "answer": text }),
    )
}

/// The live stream: `row` events with a worker deployment's new overview row (or `null` when
/// it is gone), `details` events when its page should reload its details, and `reload` when
/// this page fell behind and must read everything again.
fn live(dashboard: &Dashboard) -> Response<Body> {
    let changes = dashboard.store.subscribe();
    let hello = futures::stream::once(async { frame("hello", &json!({ "now": now_millis() })) });
    let updates = futures::stream::unfold(changes, |mut changes| async move {
        let message = tokio::select! {
            change = changes.recv() => match change {
                Ok(Change::Row(key, row)) => frame(
                    "row",
                    &json!({ "key": format!("{}/{}", key.0, key.1), "row": row }),
                ),
                Ok(Change::Details(key)) => {
                    frame("details", &json!({ "key": format!("{}/{}", key.0, key.1) }))
                }
                Err(RecvError::Lagged(_)) => frame("reload", &json!({})),
                Err(RecvError::Closed) => return None,
            },
            () = tokio::time::sleep(KEEP_ALIVE) => Bytes::from_static(b": keep-alive\n\n"),
        };
        Some((Ok::<_, Infallible>(Frame::data(message)), changes))
    });
    let body = StreamBody::new(hello.map(|b| Ok(Frame::data(b))).chain(updates));
    let mut response = Response::new(BodyExt::boxed(body));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    response
}

fn frame(event: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {event}\ndata: {data}\n\n"))
}

/// Decodes a percent-encoded path segment.
fn decode(segment: &str) -> String {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Now, in Unix milliseconds (the page measures ages against the server's clock).
pub fn now_millis() -> i64 {
    Timestamp::now().as_millisecond()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_are_percent_decoded() {
        assert_eq!(decode("demo"), "demo");
        assert_eq!(decode("a%2Fb%20c"), "a/b c");
        assert_eq!(decode("bad%zz"), "bad%zz");
    }

    #[test]
    fn controls_need_the_pages_header_and_origin_and_loopback_names_only() {
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut map = http::HeaderMap::new();
            for (name, value) in pairs {
                map.insert(*name, header::HeaderValue::from_static(value));
            }
            map
        };
        let page = headers(&[
            ("host", "127.0.0.1:3100"),
            ("origin", "http://127.0.0.1:3100"),
            ("x-twc-control", "pause"),
        ]);
        assert!(same_site(true, &Method::POST, &page).is_ok());
        assert!(same_site(true, &Method::GET, &headers(&[("host", "localhost:3100")])).is_ok());
        assert!(same_site(true, &Method::GET, &headers(&[("host", "[::1]:3100")])).is_ok());
        // A form or simple fetch of another site: no header.
        let form = headers(&[
            ("host", "127.0.0.1:3100"),
            ("origin", "https://evil.example"),
        ]);
        assert!(same_site(true, &Method::POST, &form).is_err());
        // The header from another origin (it would need a preflight, but still).
        let other = headers(&[
            ("host", "127.0.0.1:3100"),
            ("origin", "https://evil.example"),
            ("x-twc-control", "abort"),
        ]);
        assert!(same_site(true, &Method::POST, &other).is_err());
        // A DNS-rebound name on a loopback listener, even for reads.
        let rebound = headers(&[("host", "evil.example:3100")]);
        assert!(same_site(true, &Method::GET, &rebound).is_err());
        // Listening beyond loopback (--address), any name the operator uses is served.
        assert!(same_site(false, &Method::GET, &rebound).is_ok());
        let remote = headers(&[
            ("host", "dash.internal:3100"),
            ("origin", "http://dash.internal:3100"),
            ("x-twc-control", "promote"),
        ]);
        assert!(same_site(false, &Method::POST, &remote).is_ok());
    }

    #[test]
    fn live_frames_are_server_sent_events() {
        assert_eq!(
            frame("row", &json!({ "key": "a/b" })),
            Bytes::from("event: row\ndata: {\"key\":\"a/b\"}\n\n")
        );
    }
}
