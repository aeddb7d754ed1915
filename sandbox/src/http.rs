//! A plain HTTP/1.1 `GET` on loopback, as a Prometheus scrape or a kubelet probe does it: for
//! the tests and benchmarks that read the controller's and the servers' endpoints (and over
//! TLS with basic auth, for the sandbox's protected Prometheus).

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
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

/// `GET url` (`http://host:port/path`, no TLS). A chunked body (Go servers such as Prometheus
/// send one when it is large) is decoded.
pub async fn get(url: &str) -> Result<Response, String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("not an http URL: {url}"))?;
    let (authority, path) = split(rest);
    let exchange = async {
        let stream = TcpStream::connect(authority)
            .await
            .map_err(|e| format!("connecting to {authority}: {e}"))?;
        exchange(stream, url, authority, path, None).await
    };
    let response = tokio::time::timeout(TIMEOUT, exchange)
        .await
        .map_err(|_| format!("no answer from {url} within {TIMEOUT:?}"))??;
    parse(url, &response)
}

/// `GET url` (`https://127.0.0.1:port/path`) verifying the server with the PEM CA `ca_pem`,
/// with an `Authorization` header when given: for the sandbox's protected Prometheus.
pub async fn get_tls(
    url: &str,
    ca_pem: &str,
    authorization: Option<&str>,
) -> Result<Response, String> {
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
    use tokio_rustls::rustls::{self, RootCertStore};
    let rest = url
        .strip_prefix("https://")
        .ok_or_else(|| format!("not an https URL: {url}"))?;
    let (authority, path) = split(rest);
    let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        let cert = cert.map_err(|e| format!("CA PEM: {e}"))?;
        roots
            .add(cert)
            .map_err(|e| format!("CA certificate: {e}"))?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let name = ServerName::try_from(host.to_owned()).map_err(|e| format!("{host}: {e}"))?;
    let exchange = async {
        let tcp = TcpStream::connect(authority)
            .await
            .map_err(|e| format!("connecting to {authority}: {e}"))?;
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS with {authority}: {e}"))?;
        exchange(tls, url, authority, path, authorization).await
    };
    let response = tokio::time::timeout(TIMEOUT, exchange)
        .await
        .map_err(|_| format!("no answer from {url} within {TIMEOUT:?}"))??;
    parse(url, &response)
}

/// The authority and path (`/` when none) of a URL without its scheme.
fn split(rest: &str) -> (&str, &str) {
    match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    }
}

/// Sends the request over `stream` and reads the whole answer.
async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    url: &str,
    authority: &str,
    path: &str,
    authorization: Option<&str>,
) -> Result<Vec<u8>, String> {
    let authorization = authorization
        .map(|value| format!("Authorization: {value}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {authority}\r\n{authorization}Connection: close\r\n\r\n"
    );
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("sending to {url}: {e}"))?;
    let mut response = Vec::new();
    // A TLS server may close without close_notify once it has answered: keep what came.
    match stream.read_to_end(&mut response).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !response.is_empty() => {}
        Err(e) => return Err(format!("reading from {url}: {e}")),
    }
    Ok(response)
}

/// The status, head and (de-chunked) body of an answer.
fn parse(url: &str, response: &[u8]) -> Result<Response, String> {
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| format!("no HTTP header in {:?}", String::from_utf8_lossy(response)))?;
    let head = std::str::from_utf8(&response[..split])
        .map_err(|e| format!("HTTP header from {url} is not text: {e}"))?;
    let body = &response[split + 4..];
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status in {head:?}"))?;
    let chunked = head.lines().any(|line| {
        line.split_once(':').is_some_and(|(name, value)| {
            name.trim().eq_ignore_ascii_case("transfer-encoding")
                && value.trim().eq_ignore_ascii_case("chunked")
        })
    });
    let body = if chunked {
        dechunk(body).ok_or_else(|| format!("malformed chunked body from {url}"))?
    } else {
        body.to_vec()
    };
    let body = String::from_utf8(body).map_err(|e| format!("body from {url} is not UTF-8: {e}"))?;
    Ok(Response {
        status,
        head: head.to_owned(),
        body,
    })
}

/// The payload of a chunked body: `<hex size>[;ext]\r\n<data>\r\n`... up to a size of 0.
fn dechunk(mut rest: &[u8]) -> Option<Vec<u8>> {
    let mut payload = Vec::new();
    loop {
        let line_end = rest.windows(2).position(|w| w == b"\r\n")?;
        let size_line = std::str::from_utf8(&rest[..line_end]).ok()?;
        let size_hex = size_line.split(';').next()?.trim();
        let size = usize::from_str_radix(size_hex, 16).ok()?;
        if size == 0 {
            return Some(payload);
        }
        let data = rest.get(line_end + 2..)?;
        payload.extend_from_slice(data.get(..size)?);
        rest = data.get(size..)?.strip_prefix(b"\r\n")?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_bodies_are_decoded() {
        assert_eq!(
            dechunk(b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\n\r\n").as_deref(),
            Some(&b"hello, world"[..])
        );
        // A chunk may end inside a character: the two bytes of "\u{e9}" in two chunks.
        assert_eq!(
            dechunk(b"2\r\na\xc3\r\n1\r\n\xa9\r\n0\r\n\r\n").as_deref(),
            Some("a\u{e9}".as_bytes())
        );
        assert_eq!(dechunk(b"5\r\nhel"), None);
        assert_eq!(dechunk(b"zz\r\n"), None);
    }
}
