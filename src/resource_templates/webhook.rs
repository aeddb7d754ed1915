//! The HTTPS endpoint the API server calls to admit WorkerResourceTemplates
//! ([`VALIDATE_PATH`], an `AdmissionReview` in, one out). HTTP/1.1 on hyper over rustls; the
//! serving certificate is `tls.crt` and `tls.key` of a folder (a mounted Secret), read again
//! when the files change, so a renewed certificate needs no restart.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::crypto::CryptoProvider;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::rustls::{self, ServerConfig};

use super::admission::Admission;
use crate::run::telemetry::server::{BindAddress, bind};

/// Path of the WorkerResourceTemplate validating webhook (the Go controller's).
pub const VALIDATE_PATH: &str = "/validate-temporal-io-v1alpha1-workerresourcetemplate";
/// File names in the certificate folder.
const CERT_FILE: &str = "tls.crt";
const KEY_FILE: &str = "tls.key";
/// Largest AdmissionReview read (the template, and the old one on update).
const MAX_BODY: usize = 8 * 1024 * 1024;
/// A connection is closed after this long (the API server's webhook calls time out at 10 s).
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the certificate files are checked for a change.
const RELOAD_CHECK_EVERY: Duration = Duration::from_secs(10);

/// Where and with what the webhook is served.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// Listen address.
    pub address: BindAddress,
    /// Folder with `tls.crt` and `tls.key`.
    pub cert_dir: PathBuf,
}

/// The webhook could not start.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// A certificate file could not be read or used.
    #[error("the webhook's serving certificate in {dir}: {message}")]
    Certificate {
        /// The folder.
        dir: PathBuf,
        /// What was wrong.
        message: String,
    },
    /// The listener could not be opened.
    #[error("listening on {address} for the admission webhook: {source}")]
    Bind {
        /// The address.
        address: BindAddress,
        /// The socket error.
        source: std::io::Error,
    },
}

/// Opens the listener and serves the webhook on a background task for the life of the runtime;
/// returns the bound address.
pub async fn serve(
    config: &WebhookConfig,
    admission: Arc<Admission>,
) -> Result<std::net::SocketAddr, WebhookError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certificate = ReloadingCertificate::load(&config.cert_dir, Arc::clone(&provider))?;
    let mut tls = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| WebhookError::Certificate {
            dir: config.cert_dir.clone(),
            message: e.to_string(),
        })?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(certificate));
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(tls));
    let listener = bind(config.address)
        .await
        .map_err(|source| WebhookError::Bind {
            address: config.address,
            source,
        })?;
    let local = listener.local_addr().map_err(|source| WebhookError::Bind {
        address: config.address,
        source,
    })?;
    tracing::info!(address = %local, path = VALIDATE_PATH, "serving the WorkerResourceTemplate admission webhook");
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!("webhook: accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let (acceptor, admission) = (acceptor.clone(), Arc::clone(&admission));
            tokio::spawn(async move {
                let connection = async {
                    let stream = match acceptor.accept(stream).await {
                        Ok(stream) => stream,
                        Err(e) => {
                            tracing::debug!("webhook: TLS handshake: {e}");
                            return;
                        }
                    };
                    let service = service_fn(move |request| {
                        let admission = Arc::clone(&admission);
                        async move { Ok::<_, Infallible>(respond(request, &admission).await) }
                    });
                    if let Err(e) = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await
                    {
                        tracing::debug!("webhook connection: {e}");
                    }
                };
                let _ = tokio::time::timeout(CONNECTION_TIMEOUT, connection).await;
            });
        }
    });
    Ok(local)
}

async fn respond(
    request: Request<hyper::body::Incoming>,
    admission: &Admission,
) -> Response<Full<Bytes>> {
    if request.uri().path() != VALIDATE_PATH {
        return plain(StatusCode::NOT_FOUND, "not found\n");
    }
    if request.method() != Method::POST {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "POST an AdmissionReview\n");
    }
    let body = match Limited::new(request.into_body(), MAX_BODY).collect().await {
        Ok(body) => body.to_bytes(),
        Err(e) => return plain(StatusCode::BAD_REQUEST, &format!("reading the body: {e}\n")),
    };
    let response = match serde_json::from_slice::<AdmissionReview<DynamicObject>>(&body)
        .map_err(|e| e.to_string())
        .and_then(|review| {
            let request: Result<AdmissionRequest<DynamicObject>, _> = review.try_into();
            request.map_err(|_| "no request in the AdmissionReview".to_owned())
        }) {
        Ok(request) => admission.review(&request).await,
        Err(e) => AdmissionResponse::invalid(format!("not an AdmissionReview: {e}")),
    };
    match serde_json::to_vec(&response.into_review()) {
        Ok(json) => {
            let mut response = Response::new(Full::new(Bytes::from(json)));
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("application/json"),
            );
            response
        }
        Err(e) => plain(StatusCode::INTERNAL_SERVER_ERROR, &format!("{e}\n")),
    }
}

fn plain(status: StatusCode, text: &str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(text.to_owned())));
    *response.status_mut() = status;
    response
}

/// The serving certificate, read again when its files change.
#[derive(Debug)]
struct ReloadingCertificate {
    dir: PathBuf,
    provider: Arc<CryptoProvider>,
    state: Mutex<Loaded>,
}

#[derive(Debug)]
struct Loaded {
    key: Arc<CertifiedKey>,
    modified: Option<SystemTime>,
    checked: Instant,
}

impl ReloadingCertificate {
    fn load(dir: &Path, provider: Arc<CryptoProvider>) -> Result<Self, WebhookError> {
        let key = read_certified_key(dir, &provider)?;
        Ok(Self {
            dir: dir.to_owned(),
            provider,
            state: Mutex::new(Loaded {
                key: Arc::new(key),
                modified: modified(dir),
                checked: Instant::now(),
            }),
        })
    }
}

impl ResolvesServerCert for ReloadingCertificate {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if state.checked.elapsed() >= RELOAD_CHECK_EVERY {
            state.checked = Instant::now();
            let now = modified(&self.dir);
            if now != state.modified {
                match read_certified_key(&self.dir, &self.provider) {
                    Ok(key) => {
                        tracing::info!(dir = %self.dir.display(), "webhook: serving the renewed certificate");
                        state.key = Arc::new(key);
                        state.modified = now;
                    }
                    // Half-written files (a Secret being updated): keep the old one, look again.
                    Err(e) => tracing::warn!("webhook: {e}"),
                }
            }
        }
        Some(Arc::clone(&state.key))
    }
}

/// The latest modification time of the two files (a mounted Secret swaps a symlink).
fn modified(dir: &Path) -> Option<SystemTime> {
    [CERT_FILE, KEY_FILE]
        .iter()
        .filter_map(|f| {
            std::fs::metadata(dir.join(f))
                .and_then(|m| m.modified())
                .ok()
        })
        .max()
}

fn read_certified_key(dir: &Path, provider: &CryptoProvider) -> Result<CertifiedKey, WebhookError> {
    let fail = |message: String| WebhookError::Certificate {
        dir: dir.to_owned(),
        message,
    };
    let certs = CertificateDer::pem_file_iter(dir.join(CERT_FILE))
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| fail(format!("{CERT_FILE}: {e}")))?;
    if certs.is_empty() {
        return Err(fail(format!("{CERT_FILE} holds no certificate")));
    }
    let key = PrivateKeyDer::from_pem_file(dir.join(KEY_FILE))
        .map_err(|e| fail(format!("{KEY_FILE}: {e}")))?;
    CertifiedKey::from_der(certs, key, provider).map_err(|e| fail(e.to_string()))
}
