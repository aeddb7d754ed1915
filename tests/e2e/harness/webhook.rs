//! A real HTTP webhook receiver for the notification tests: it records every POST (its JSON
//! body, its idempotency header and the status it answered) and can be told to answer 500 for
//! a while.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;

/// One POST the receiver got.
#[derive(Debug, Clone)]
pub struct Received {
    /// Its JSON body (`null` when it was not JSON).
    pub body: Value,
    /// Its `idempotency-key` header.
    pub key_header: Option<String>,
    /// The status the receiver answered.
    pub status: u16,
}

#[derive(Default)]
struct State {
    received: Vec<Received>,
    failing_until: Option<Instant>,
}

/// A webhook receiver on loopback, stopped when dropped.
pub struct Receiver {
    /// Its URL (`http://127.0.0.1:<port>/hook`).
    pub url: String,
    state: Arc<Mutex<State>>,
    server: tokio::task::JoinHandle<()>,
}

impl Receiver {
    /// Starts a receiver answering 204 to every POST.
    pub async fn start() -> Self {
        let listener = match TcpListener::bind("127.0.0.1:0").await {
            Ok(listener) => listener,
            Err(e) => panic!("binding the webhook receiver: {e}"),
        };
        let url = match listener.local_addr() {
            Ok(address) => format!("http://{address}/hook"),
            Err(e) => panic!("webhook receiver address: {e}"),
        };
        let state = Arc::new(Mutex::new(State::default()));
        let shared = Arc::clone(&state);
        let server = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let state = Arc::clone(&shared);
                tokio::spawn(async move {
                    let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                        let state = Arc::clone(&state);
                        async move { Ok::<_, hyper::Error>(answer(&state, request).await) }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { url, state, server }
    }

    /// Answers 500 to every POST for the next `duration`.
    pub fn fail_for(&self, duration: Duration) {
        self.lock().failing_until = Some(Instant::now() + duration);
    }

    /// Whether it still answers 500 (within its [`Receiver::fail_for`]).
    pub fn failing(&self) -> bool {
        self.lock()
            .failing_until
            .is_some_and(|until| Instant::now() < until)
    }

    /// Every POST received so far, in order.
    pub fn received(&self) -> Vec<Received> {
        self.lock().received.clone()
    }

    /// Bodies of the POSTs answered 2xx, in order, once per idempotency key (a duplicate of a
    /// key already delivered is left out, as a receiver honouring the key would). The key is
    /// the header's: a Slack payload has none of its own.
    pub fn delivered(&self) -> Vec<Value> {
        let mut seen = std::collections::HashSet::new();
        self.received()
            .into_iter()
            .filter(|r| (200..300).contains(&r.status))
            .filter(|r| seen.insert(r.key_header.clone()))
            .map(|r| r.body)
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn answer(
    state: &Mutex<State>,
    request: Request<hyper::body::Incoming>,
) -> Response<Full<Bytes>> {
    let key_header = request
        .headers()
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = match request.into_body().collect().await {
        Ok(collected) => serde_json::from_slice(&collected.to_bytes()).unwrap_or(Value::Null),
        Err(_) => Value::Null,
    };
    let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
    let failing = state
        .failing_until
        .is_some_and(|until| Instant::now() < until);
    let status = if failing {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::NO_CONTENT
    };
    state.received.push(Received {
        body,
        key_header,
        status: status.as_u16(),
    });
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = status;
    response
}

/// A Secret `name` in `namespace` holding `url` under key `url`.
pub fn url_secret(namespace: &str, name: &str, url: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": { "name": name, "namespace": namespace },
        "stringData": { "url": url }
    })
}

/// `spec.notifications` with one Generic target `name` whose URL is in Secret `secret`.
pub fn notifications(name: &str, secret: &str) -> Value {
    json!({ "targets": [ {
        "name": name,
        "urlSecretRef": { "name": secret, "key": "url" }
    } ] })
}

/// [`notifications`] with one target that wants only `events`.
pub fn notifications_of(name: &str, secret: &str, events: &[&str]) -> Value {
    let mut spec = notifications(name, secret);
    spec["targets"][0]["events"] = json!(events);
    spec
}

/// Waits until `receiver` has delivered `count` notifications (once per key); returns them.
pub async fn wait_delivered(receiver: &Receiver, count: usize, timeout: Duration) -> Vec<Value> {
    crate::harness::wait::wait_for(
        &format!("{count} notifications delivered"),
        timeout,
        || async {
            let delivered = receiver.delivered();
            if delivered.len() >= count {
                Ok(delivered)
            } else {
                Err(format!("delivered {:?}", events(&delivered)))
            }
        },
    )
    .await
}

/// The `(event, reason)` pairs of `bodies`, in order.
pub fn events(bodies: &[Value]) -> Vec<(String, String)> {
    bodies
        .iter()
        .map(|b| {
            (
                b["event"].as_str().unwrap_or_default().to_owned(),
                b["reason"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}
