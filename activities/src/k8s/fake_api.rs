//! A Kubernetes API server that answers from a table (path → status code and body), for unit
//! tests that run the real kube client against answers a live server gives only at bad moments.

use kube::client::Body;

/// One answer: the HTTP status code and the body.
pub(crate) type Answer = (u16, String);

/// A client of a server answering each `GET <path>` of `routes`, and 404 to anything else.
pub(crate) fn client(routes: Vec<(String, Answer)>) -> kube::Client {
    recording_client(routes).0
}

/// [`client`], also recording each request as `<METHOD> <path>`.
pub(crate) fn recording_client(
    routes: Vec<(String, Answer)>,
) -> (kube::Client, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = std::sync::Arc::clone(&seen);
    let service = tower::service_fn(move |request: http::Request<Body>| {
        if let Ok(mut log) = log.lock() {
            log.push(format!("{} {}", request.method(), request.uri().path()));
        }
        let (code, body) = routes
            .iter()
            .find(|(path, _)| path == request.uri().path())
            .map_or_else(unserved, |(_, answer)| answer.clone());
        async move {
            http::Response::builder()
                .status(code)
                .body(Body::from(body.into_bytes()))
        }
    });
    (kube::Client::new(service, "default"), seen)
}

/// What the API server says of an object that does not exist: a 404 Status naming it.
pub(crate) fn not_found(resource: &str, name: &str) -> Answer {
    let status = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404,
        "reason": "NotFound", "message": format!("{resource} \"{name}\" not found"),
        "details": { "name": name, "kind": resource }
    });
    (404, status.to_string())
}

/// What it says of a path it does not serve (a custom resource whose CRD a restarting API
/// server has not loaded yet): plain text.
pub(crate) fn unserved() -> Answer {
    (404, "404 page not found\n".to_owned())
}

/// A failure Status with `code` and `reason` (5xx, 429, 403, ...).
pub(crate) fn failure(code: u16, reason: &str) -> Answer {
    let status = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
        "reason": reason, "message": format!("the test's API server says {reason}")
    });
    (code, status.to_string())
}

/// An object served as is.
pub(crate) fn ok(object: serde_json::Value) -> Answer {
    (200, object.to_string())
}
