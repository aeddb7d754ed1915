//! The HTTP(S) client the activities share for outside servers (Prometheus, webhooks): one
//! connection pool per use, HTTPS verified with the system's CA certificates, or with a private
//! CA bundle a Prometheus check names.

use std::sync::Arc;
use std::time::Duration;

use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// A pooled HTTP/1 client of `http://` and `https://` URLs sending bodies of type `B`; `what`
/// names its servers in the warning logged when the system has no CA certificates (then
/// `https` fails certificate verification).
pub fn client<B>(what: &str) -> Result<Client<HttpsConnector<HttpConnector>, B>, String>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
{
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls =
        match HttpsConnectorBuilder::new().with_provider_and_native_roots(Arc::clone(&provider)) {
            Ok(builder) => builder,
            Err(err) => {
                tracing::warn!(
                    "no system CA certificates ({err}): {what} with https will fail certificate \
                     verification"
                );
                let config = rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .map_err(|e| format!("cannot set up TLS: {e}"))?
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth();
                HttpsConnectorBuilder::new().with_tls_config(config)
            }
        };
    Ok(pooled(tls.https_or_http().enable_http1().build()))
}

/// A pooled HTTP/1 client like [`client`] whose HTTPS trusts only the certificates of the PEM
/// bundle `ca_pem` (a private CA); `Err` says why the bundle cannot be used (never its bytes).
pub fn client_with_ca<B>(ca_pem: &[u8]) -> Result<Client<HttpsConnector<HttpConnector>, B>, String>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
{
    let roots = ca_roots(ca_pem)?;
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| format!("cannot set up TLS: {e}"))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_or_http()
        .enable_http1()
        .build();
    Ok(pooled(connector))
}

/// The trust anchors of a PEM CA bundle: every certificate in it (other blocks are ignored).
pub fn ca_roots(ca_pem: &[u8]) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    for certificate in CertificateDer::pem_slice_iter(ca_pem) {
        let certificate =
            certificate.map_err(|e| format!("the CA bundle is not readable PEM ({e})"))?;
        roots
            .add(certificate)
            .map_err(|e| format!("the CA bundle holds an unusable certificate ({e})"))?;
    }
    if roots.is_empty() {
        return Err("the CA bundle holds no PEM certificate".to_owned());
    }
    Ok(roots)
}

fn pooled<B>(connector: HttpsConnector<HttpConnector>) -> Client<HttpsConnector<HttpConnector>, B>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
{
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(60))
        .pool_timer(TokioTimer::new())
        .build(connector)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A public self-signed test certificate (its key was discarded).
    const CERT: &[u8] = include_bytes!("k8s/testdata/client.crt");

    #[test]
    fn a_ca_bundle_gives_its_certificates_as_roots_or_says_why_not() {
        let mut two = CERT.to_vec();
        two.extend_from_slice(b"some text between blocks\n");
        two.extend_from_slice(CERT);
        let unterminated = &CERT[..CERT.len() - 30];
        let not_der: &[u8] = b"-----BEGIN CERTIFICATE-----\nc2VjcmV0\n-----END CERTIFICATE-----\n";
        // (bundle, roots or part of the message)
        let cases: [(&[u8], Result<usize, &str>); 5] = [
            (CERT, Ok(1)),
            (&two, Ok(2)),
            (
                b"not a certificate",
                Err("the CA bundle holds no PEM certificate"),
            ),
            (unterminated, Err("the CA bundle is not readable PEM")),
            (not_der, Err("the CA bundle holds an unusable certificate")),
        ];
        for (bundle, expected) in cases {
            match (ca_roots(bundle), expected) {
                (Ok(roots), Ok(count)) => assert_eq!(roots.len(), count),
                (Err(message), Err(part)) => {
                    assert!(
                        message.contains(part),
                        "{message:?} should contain {part:?}"
                    );
                    assert!(!message.contains("c2VjcmV0"), "{message}");
                }
                (got, want) => panic!("got {:?}, want {want:?}", got.map(|r| r.len())),
            }
        }
        let client: Result<Client<_, http_body_util::Empty<bytes::Bytes>>, _> =
            client_with_ca(b"junk");
        assert_eq!(
            client.err().as_deref(),
            Some("the CA bundle holds no PEM certificate")
        );
    }
}
