//! A plain HTTP/1.1 `GET` on loopback, as a Prometheus scrape or a kubelet probe does it: for
//! the tests and benchmarks that read the controller's and the servers' endpoints.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long a whole `GET` may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// An HTTP answer.
#[derive(Debug, Clone)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Status line and headers.
    pub head: String,
    /// Body.
    pub body: String,
}

/// `GET url` (`http://host:port/path`, no TLS, no chunked decoding: the servers here answer
/// `Connection: close` requests with a plain body).
pub async fn get(url: &str) -> Result<Response, String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("not an http URL: {url}"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let exchange = async {
        let mut stream = TcpStream::connect(authority)
            .await
            .map_err(|e| format!("connecting to {authority}: {e}"))?;
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| format!("sending to {url}: {e}"))?;
        let mut response = String::new();
        stream
            .read_to_string(&mut response)
            .await
            .map_err(|e| format!("reading from {url}: {e}"))?;
        Ok::<_, String>(response)
    };
    let response = tokio::time::timeout(TIMEOUT, exchange)
        .await
        .map_err(|_| format!("no answer from {url} within {TIMEOUT:?}"))??;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no HTTP header in {response:?}"))?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status in {head:?}"))?;
    Ok(Response {
        status,
        head: head.to_owned(),
        body: body.to_owned(),
    })
}
