//! The HTTP(S) client the activities share for outside servers (Prometheus, webhooks): one
//! connection pool per use, HTTPS verified with the system's CA certificates.

use std::sync::Arc;
use std::time::Duration;

use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioTimer};

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
    let connector = tls.https_or_http().enable_http1().build();
    Ok(Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(60))
        .pool_timer(TokioTimer::new())
        .build(connector))
}
