//! Why a mutual-TLS connection failed. In TLS 1.3 the server judges the client certificate
//! after the client has finished its handshake, so a gRPC client that writes first often sees
//! only a closed connection or a broken pipe, not the server's alert. When connecting with a
//! client certificate fails that way, a bare handshake with the same settings reads the
//! server's first answer: its alert (`UnknownCA`, `CertificateExpired`, ...) names a refused
//! certificate; anything else leaves the failure as it was. Alerts are read as rustls reports
//! them ([`rustls::Error::AlertReceived`]), never from error text.

use std::error::Error as StdError;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{AlertDescription, ClientConfig, RootCertStore};
use tokio::io::AsyncReadExt;

use crate::connection::{ConnectionAuth, ConnectionConfig};

/// How long the probe may take in all.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Alerts a server sends when it refuses the client certificate: the certificate, not the
/// network, is at fault.
const CERTIFICATE_ALERTS: &[AlertDescription] = &[
    AlertDescription::BadCertificate,
    AlertDescription::CertificateRequired,
    AlertDescription::CertificateExpired,
    AlertDescription::CertificateRevoked,
    AlertDescription::CertificateUnknown,
    AlertDescription::UnsupportedCertificate,
    AlertDescription::UnknownCA,
];

/// The alert with which the server refused our client certificate, if `err` (or one of its
/// causes, through the I/O errors that carry rustls' errors) is one.
pub(crate) fn certificate_alert(err: &(dyn StdError + 'static)) -> Option<AlertDescription> {
    let mut next = Some(err);
    while let Some(err) = next {
        let rustls_error = err.downcast_ref::<rustls::Error>().or_else(|| {
            err.downcast_ref::<std::io::Error>()?
                .get_ref()?
                .downcast_ref::<rustls::Error>()
        });
        if let Some(rustls::Error::AlertReceived(alert)) = rustls_error
            && CERTIFICATE_ALERTS.contains(alert)
        {
            return Some(*alert);
        }
        next = err.source();
    }
    None
}

/// The alert with which the server refuses the connection's client certificate (`UnknownCA`,
/// ...); `None` when the connection has no client certificate, the probe cannot be made, or
/// the server did not refuse it.
pub(crate) async fn refused_certificate(config: &ConnectionConfig) -> Option<AlertDescription> {
    let ConnectionAuth::MutualTls {
        cert_pem,
        key_pem,
        ca_pem,
    } = &config.auth
    else {
        return None;
    };
    let ca = config.server_ca_pem.as_ref().or(ca_pem.as_ref());
    let client = client_config(cert_pem, key_pem, ca)?;
    let host_port = config
        .host_port
        .trim()
        .trim_start_matches("https://")
        .trim_start_matches("http://")
        .trim_end_matches('/');
    let host = host_port.rsplit_once(':').map_or(host_port, |(h, _)| h);
    let name = config.server_name.as_deref().unwrap_or(host).to_owned();
    let name = ServerName::try_from(name).ok()?;
    let exchange = async {
        let tcp = tokio::net::TcpStream::connect(host_port).await?;
        let mut tls = tokio_rustls::TlsConnector::from(Arc::new(client))
            .connect(name, tcp)
            .await?;
        let mut first = [0u8; 1];
        // Only a failure (the server's alert) matters, not what or how much was read.
        let _read = tls.read(&mut first).await?;
        Ok::<(), std::io::Error>(())
    };
    match tokio::time::timeout(PROBE_TIMEOUT, exchange).await {
        Ok(Err(error)) => certificate_alert(&error),
        _ => None,
    }
}

/// A client configuration like the Temporal client's: the CA given (else the system's roots),
/// the client certificate, HTTP/2.
fn client_config(
    cert_pem: &[u8],
    key_pem: &[u8],
    ca_pem: Option<&Vec<u8>>,
) -> Option<ClientConfig> {
    let mut roots = RootCertStore::empty();
    match ca_pem {
        Some(ca) => {
            for cert in CertificateDer::pem_slice_iter(ca) {
                roots.add(cert.ok()?).ok()?;
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
        }
    }
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .ok()?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).ok()?;
    let mut config =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .ok()?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .ok()?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Some(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_alert_is_found_through_the_io_errors_that_carry_it() {
        let alert = |description| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                rustls::Error::AlertReceived(description),
            )
        };
        assert_eq!(
            certificate_alert(&alert(AlertDescription::UnknownCA)),
            Some(AlertDescription::UnknownCA)
        );
        assert_eq!(
            certificate_alert(&alert(AlertDescription::CertificateRequired)),
            Some(AlertDescription::CertificateRequired)
        );
        // Other alerts and other errors are not about the certificate.
        assert_eq!(
            certificate_alert(&alert(AlertDescription::HandshakeFailure)),
            None
        );
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(certificate_alert(&refused), None);
    }
}
