//! Certificates of the production-like Temporal, made with `rcgen`: the sandbox CA, the
//! frontend's server certificate, and client certificates (valid, expired, or issued by a CA
//! the server does not trust) whose organizational unit names their permissions.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType, date_time_ymd,
};

/// A certificate could not be made or written.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// rcgen refused the parameters or could not sign.
    #[error("making certificate {name}: {source}")]
    Generate {
        /// Certificate name.
        name: String,
        /// rcgen's error.
        source: rcgen::Error,
    },
    /// A PEM file could not be written.
    #[error("writing {path}: {source}")]
    Write {
        /// File path.
        path: PathBuf,
        /// I/O error.
        source: std::io::Error,
    },
}

/// A certificate and its private key, as PEM text and as files.
#[derive(Debug, Clone)]
pub struct CertPair {
    /// Certificate (PEM).
    pub cert_pem: String,
    /// Private key (PKCS#8 PEM).
    pub key_pem: String,
    /// File holding `cert_pem`.
    pub cert_path: PathBuf,
    /// File holding `key_pem`.
    pub key_path: PathBuf,
}

/// When a client certificate is valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Validity {
    /// From 1975 to 4096 (rcgen's default): valid for any test.
    Current,
    /// During the year 2000: expired.
    Expired,
}

/// A certificate authority: its certificate and the key that signs what it issues.
pub struct Authority {
    /// The CA certificate (PEM).
    pub cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
    name: String,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Authority {
    /// A fresh self-signed CA named `name`.
    pub fn new(name: &str) -> Result<Self, PkiError> {
        let generate = |source| PkiError::Generate {
            name: name.to_owned(),
            source,
        };
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(generate)?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
        ];
        let key = KeyPair::generate().map_err(generate)?;
        let cert = params.self_signed(&key).map_err(generate)?;
        Ok(Self {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
            name: name.to_owned(),
        })
    }

    /// A server certificate for `dns_names` and 127.0.0.1.
    pub fn server_cert(&self, dns_names: &[&str]) -> Result<(String, String), PkiError> {
        let name = dns_names.first().copied().unwrap_or("server");
        let generate = |source| PkiError::Generate {
            name: name.to_owned(),
            source,
        };
        let sans: Vec<String> = dns_names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(sans).map_err(generate)?;
        params
            .subject_alt_names
            .push(SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()));
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().map_err(generate)?;
        let cert = params.signed_by(&key, &self.issuer).map_err(generate)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// A client certificate with common name `cn` whose organizational unit lists
    /// `permissions` (space-separated, `<namespace>:<role>` as in an API key).
    pub fn client_cert(
        &self,
        cn: &str,
        permissions: &[&str],
        validity: Validity,
    ) -> Result<(String, String), PkiError> {
        let generate = |source| PkiError::Generate {
            name: cn.to_owned(),
            source,
        };
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(generate)?;
        params.distinguished_name.push(DnType::CommonName, cn);
        if !permissions.is_empty() {
            params
                .distinguished_name
                .push(DnType::OrganizationalUnitName, permissions.join(" "));
        }
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        if validity == Validity::Expired {
            params.not_before = date_time_ymd(2000, 1, 1);
            params.not_after = date_time_ymd(2001, 1, 1);
        }
        let key = KeyPair::generate().map_err(generate)?;
        let cert = params.signed_by(&key, &self.issuer).map_err(generate)?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}

/// Writes a certificate and its key as `<dir>/<stem>.pem` and `<dir>/<stem>.key`; a stem
/// already used gets a number, so no pair overwrites another.
pub fn write_pair(
    dir: &Path,
    stem: &str,
    (cert_pem, key_pem): (String, String),
) -> Result<CertPair, PkiError> {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let safe: String = stem
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut stem = safe.clone();
    while dir.join(format!("{stem}.pem")).exists() {
        stem = format!("{safe}-{}", COUNTER.fetch_add(1, Ordering::Relaxed) + 2);
    }
    let cert_path = dir.join(format!("{stem}.pem"));
    let key_path = dir.join(format!("{stem}.key"));
    for (path, text) in [(&cert_path, &cert_pem), (&key_path, &key_pem)] {
        std::fs::write(path, text).map_err(|source| PkiError::Write {
            path: path.clone(),
            source,
        })?;
    }
    Ok(CertPair {
        cert_pem,
        key_pem,
        cert_path,
        key_path,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_certificates_carry_their_permissions_and_are_signed_by_the_ca() {
        let ca = Authority::new("test CA").unwrap_or_else(|e| panic!("{e}"));
        let (cert, key) = ca
            .client_cert(
                "worker",
                &["default:write", "other:read"],
                Validity::Current,
            )
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(cert.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(key.starts_with("-----BEGIN PRIVATE KEY-----"));
        let der = pem_der(&cert);
        let text = String::from_utf8_lossy(&der);
        assert!(text.contains("default:write other:read"), "OU missing");
        assert!(text.contains("test CA"), "issuer missing");
    }

    fn pem_der(pem: &str) -> Vec<u8> {
        use base64::Engine;
        let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        base64::engine::general_purpose::STANDARD
            .decode(body)
            .unwrap_or_else(|e| panic!("{e}"))
    }
}
