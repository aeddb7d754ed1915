//! Checks credential Secrets before anything connects with them: mutual-TLS certificates must
//! parse and stay valid for a few more minutes, API keys, bearer tokens and basic-auth pairs
//! must be there. Messages name the Secret and the key and never contain secret material.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use sha2::{Digest, Sha256};
use twc_crds::connection::{AuthMode, TemporalConnectionSpec};
use x509_cert::Certificate;
use x509_cert::der::Decode;

use crate::connection::ConnectionAuth;
use crate::prometheus::Credentials;

/// A client certificate must stay valid at least this long to be used.
pub const MIN_CERT_VALIDITY: Duration = Duration::from_secs(5 * 60);

const TLS_SECRET_TYPES: &[&str] = &["Opaque", "kubernetes.io/tls"];

/// Reads and checks a mutual-TLS Secret (`tls.crt`, `tls.key`, optional `ca.crt`) at `now`.
pub fn mutual_tls_auth(secret: &Secret, now: Timestamp) -> Result<ConnectionAuth, String> {
    let what = describe(secret);
    check_type(secret, TLS_SECRET_TYPES, &what)?;
    let cert_pem = required(secret, "tls.crt", &what)?;
    let key_pem = required(secret, "tls.key", &what)?;
    let chain = certificates(&cert_pem).map_err(|e| format!("{what}: tls.crt {e}"))?;
    for certificate in &chain {
        check_validity(certificate, now)
            .map_err(|e| format!("{what}: certificate in tls.crt {e}"))?;
    }
    check_private_key(&key_pem).map_err(|e| format!("{what}: tls.key {e}"))?;
    let ca_pem = match data(secret, "ca.crt").filter(|ca| !ca.iter().all(u8::is_ascii_whitespace)) {
        Some(ca) => {
            certificates(ca).map_err(|e| format!("{what}: ca.crt {e}"))?;
            Some(ca.to_vec())
        }
        None => None,
    };
    Ok(ConnectionAuth::MutualTls {
        cert_pem,
        key_pem,
        ca_pem,
    })
}

/// Reads an API key from a Secret key (surrounding whitespace, e.g. a trailing newline from
/// `echo`, is dropped).
pub fn api_key_auth(secret: &Secret, key: &str) -> Result<ConnectionAuth, String> {
    let what = describe(secret);
    check_type(secret, &["Opaque"], &what)?;
    let api_key = text(secret, key, &what)?;
    Ok(ConnectionAuth::ApiKey {
        key: api_key.to_owned(),
    })
}

/// Reads a bearer token from a Secret key (a Prometheus check's `auth.bearerTokenSecretRef`);
/// surrounding whitespace is dropped.
pub fn bearer_token(secret: &Secret, key: &str) -> Result<Credentials, String> {
    let what = describe(secret);
    let token = text(secret, key, &what)?;
    Ok(Credentials::Bearer(token.to_owned()))
}

/// Reads `username` and `password` from a Secret (a Prometheus check's
/// `auth.basicAuthSecretRef`; type `kubernetes.io/basic-auth` or `Opaque`). The password is
/// taken as it is; surrounding whitespace of the user name is dropped.
pub fn basic_auth(secret: &Secret) -> Result<Credentials, String> {
    let what = describe(secret);
    check_type(secret, &["kubernetes.io/basic-auth", "Opaque"], &what)?;
    let username = text(secret, "username", &what)?.to_owned();
    let password =
        data(secret, "password").ok_or_else(|| format!("{what} has no key \"password\""))?;
    let password = std::str::from_utf8(password)
        .map_err(|_| format!("{what}: key \"password\" is not UTF-8 text"))?
        .to_owned();
    Ok(Credentials::Basic { username, password })
}

/// The trimmed UTF-8 text of a Secret key, which must not be empty.
fn text<'a>(secret: &'a Secret, key: &str, what: &str) -> Result<&'a str, String> {
    let bytes = data(secret, key).ok_or_else(|| format!("{what} has no key {key:?}"))?;
    let text = std::str::from_utf8(bytes)
        .map_err(|_| format!("{what}: key {key:?} is not UTF-8 text"))?
        .trim();
    if text.is_empty() {
        return Err(format!("{what}: key {key:?} is empty"));
    }
    Ok(text)
}

/// Reads a PEM CA bundle from a Secret key (`spec.tls.caSecretRef`).
pub fn ca_bundle(secret: &Secret, key: &str) -> Result<Vec<u8>, String> {
    let what = describe(secret);
    let bytes = data(secret, key).ok_or_else(|| format!("{what} has no key {key:?}"))?;
    certificates(bytes).map_err(|e| format!("{what}: {key} {e}"))?;
    Ok(bytes.to_vec())
}

/// Identifies a resolved connection for the client pool: every spec field that matters plus
/// the uid and resourceVersion of the credential and CA Secrets (so a rotated Secret yields a
/// new key), never their bytes.
pub fn cache_key(
    connection: &TemporalConnectionSpec,
    temporal_namespace: &str,
    secret: Option<&Secret>,
    ca_secret: Option<&Secret>,
) -> String {
    let (mode, secret_name, key) = match connection.auth_mode() {
        AuthMode::None => ("none", String::new(), String::new()),
        AuthMode::MutualTls { secret_name } => ("mtls", secret_name, String::new()),
        AuthMode::ApiKey { secret_name, key } => ("apikey", secret_name, key),
    };
    let uid = secret
        .and_then(|s| s.metadata.uid.clone())
        .unwrap_or_default();
    let version = secret
        .and_then(ResourceExt::resource_version)
        .unwrap_or_default();
    let ca = ca_secret
        .map(|s| {
            format!(
                "{}/{}/{}",
                connection.ca_secret_ref().map_or("", |r| r.key.as_str()),
                s.metadata.uid.clone().unwrap_or_default(),
                s.resource_version().unwrap_or_default()
            )
        })
        .unwrap_or_default();
    let fields = [
        connection.host_port.as_str(),
        connection.server_name().unwrap_or(""),
        temporal_namespace,
        mode,
        &secret_name,
        &key,
        &uid,
        &version,
        &ca,
    ];
    let mut hasher = Sha256::new();
    for field in fields {
        hasher.update(field.as_bytes());
        hasher.update([0]);
    }
    hex::encode(hasher.finalize())
}

fn describe(secret: &Secret) -> String {
    format!(
        "Secret {}/{}",
        secret.namespace().unwrap_or_default(),
        secret.name_any()
    )
}

fn check_type(secret: &Secret, allowed: &[&str], what: &str) -> Result<(), String> {
    let type_ = secret.type_.as_deref().unwrap_or("Opaque");
    if allowed.contains(&type_) {
        Ok(())
    } else {
        Err(format!(
            "{what} has type {type_:?}; use {}",
            allowed.join(" or ")
        ))
    }
}

fn data<'a>(secret: &'a Secret, key: &str) -> Option<&'a [u8]> {
    secret.data.as_ref()?.get(key).map(|b| b.0.as_slice())
}

fn required(secret: &Secret, key: &str, what: &str) -> Result<Vec<u8>, String> {
    match data(secret, key) {
        Some(bytes) if !bytes.is_empty() => Ok(bytes.to_vec()),
        _ => Err(format!("{what} has no {key:?}")),
    }
}

/// What a file holding no readable PEM says (never its bytes).
fn pem_problem(err: &pem::Error) -> String {
    match err {
        pem::Error::MissingSectionEnd { .. } => "has a PEM block without its END line".into(),
        pem::Error::IllegalSectionStart { .. } => "has a malformed PEM header".into(),
        pem::Error::Base64Decode(_) => "has an unreadable PEM block".into(),
        _ => "is not PEM text".into(),
    }
}

/// The certificates of a PEM file, parsed; other blocks and text between them are ignored.
fn certificates(input: &[u8]) -> Result<Vec<Certificate>, String> {
    let certificates: Vec<Certificate> = CertificateDer::pem_slice_iter(input)
        .map(|der| {
            let der = der.map_err(|e| pem_problem(&e))?;
            Certificate::from_der(&der)
                .map_err(|_| "holds a certificate that does not parse".to_owned())
        })
        .collect::<Result<_, _>>()?;
    if certificates.is_empty() {
        return Err("holds no PEM certificate".into());
    }
    Ok(certificates)
}

fn check_validity(certificate: &Certificate, now: Timestamp) -> Result<(), String> {
    let not_after_secs = certificate
        .tbs_certificate()
        .validity()
        .not_after
        .to_unix_duration()
        .as_secs();
    let not_after = i64::try_from(not_after_secs)
        .ok()
        .and_then(|s| Timestamp::from_second(s).ok())
        .ok_or("has an out-of-range expiry")?;
    let remaining = not_after.as_second() - now.as_second();
    if remaining <= 0 {
        Err(format!("expired at {not_after}; renew the certificate"))
    } else if remaining < MIN_CERT_VALIDITY.as_secs() as i64 {
        Err(format!(
            "expires at {not_after}, in less than 5 minutes; renew the certificate"
        ))
    } else {
        Ok(())
    }
}

fn check_private_key(input: &[u8]) -> Result<(), String> {
    // PKCS #8 encrypted keys have a label of their own, which the PEM reader skips as unknown.
    const ENCRYPTED: &[u8] = b"-----BEGIN ENCRYPTED PRIVATE KEY-----";
    if input.windows(ENCRYPTED.len()).any(|w| w == ENCRYPTED) {
        return Err(
            "holds an encrypted private key, which cannot be used; store it unencrypted".into(),
        );
    }
    match PrivateKeyDer::from_pem_slice(input) {
        Ok(key) if !key.secret_der().is_empty() => Ok(()),
        Ok(_) | Err(pem::Error::NoItemsFound) => Err("holds no PEM private key".into()),
        Err(e) => Err(pem_problem(&e)),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use twc_crds::connection::SecretReference;

    use super::*;

    /// A public self-signed test certificate (its key was discarded).
    const CERT: &[u8] = include_bytes!("testdata/client.crt");
    /// `notAfter` of [`CERT`].
    const CERT_NOT_AFTER: i64 = 2_110_655_977;
    /// A syntactically valid PEM key block (not a real key).
    const KEY: &[u8] = b"-----BEGIN PRIVATE KEY-----\nAAECAwQFBgcI\n-----END PRIVATE KEY-----\n";

    fn secret(type_: Option<&str>, entries: &[(&str, &[u8])]) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some("client-cert".into()),
                namespace: Some("demo".into()),
                uid: Some("uid-s".into()),
                resource_version: Some("41".into()),
                ..Default::default()
            },
            type_: type_.map(str::to_owned),
            data: Some(
                entries
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), ByteString(v.to_vec())))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..Default::default()
        }
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).expect("in range")
    }

    fn well_before_expiry() -> Timestamp {
        at(CERT_NOT_AFTER - 86_400)
    }

    #[test]
    fn a_valid_tls_secret_yields_cert_key_and_ca() {
        let s = secret(
            Some("kubernetes.io/tls"),
            &[("tls.crt", CERT), ("tls.key", KEY), ("ca.crt", CERT)],
        );
        match mutual_tls_auth(&s, well_before_expiry()) {
            Ok(ConnectionAuth::MutualTls {
                cert_pem,
                key_pem,
                ca_pem,
            }) => {
                assert_eq!((cert_pem.as_slice(), key_pem.as_slice()), (CERT, KEY));
                assert_eq!(ca_pem.as_deref(), Some(CERT));
            }
            other => panic!("unexpected {other:?}"),
        }
        let without_ca = secret(None, &[("tls.crt", CERT), ("tls.key", KEY)]);
        assert!(matches!(
            mutual_tls_auth(&without_ca, well_before_expiry()),
            Ok(ConnectionAuth::MutualTls { ca_pem: None, .. })
        ));
    }

    #[test]
    fn leading_text_and_ec_parameter_blocks_are_tolerated() {
        let mut cert = b"Bag Attributes\n  friendlyName: client\n".to_vec();
        cert.extend_from_slice(CERT);
        let mut key =
            b"-----BEGIN EC PARAMETERS-----\nBggqhkjOPQMBBw==\n-----END EC PARAMETERS-----\n"
                .to_vec();
        key.extend_from_slice(KEY);
        let s = secret(None, &[("tls.crt", &cert), ("tls.key", &key)]);
        assert!(mutual_tls_auth(&s, well_before_expiry()).is_ok());
    }

    #[test]
    fn certificates_expiring_within_five_minutes_are_refused() {
        let s = secret(None, &[("tls.crt", CERT), ("tls.key", KEY)]);
        assert!(mutual_tls_auth(&s, at(CERT_NOT_AFTER - 301)).is_ok());
        let soon = mutual_tls_auth(&s, at(CERT_NOT_AFTER - 299)).expect_err("expiring");
        assert!(
            soon.contains("less than 5 minutes") && soon.contains("Secret demo/client-cert"),
            "{soon}"
        );
        let expired = mutual_tls_auth(&s, at(CERT_NOT_AFTER + 1)).expect_err("expired");
        assert!(
            expired.contains("expired at 2036-11-18T21:19:37Z"),
            "{expired}"
        );
    }

    #[test]
    fn broken_tls_secrets_say_what_is_wrong_without_the_bytes() {
        let garbage: &[u8] = b"-----BEGIN CERTIFICATE-----\nc2VjcmV0\n-----END CERTIFICATE-----\n";
        let cases: [(Secret, &str); 7] = [
            (
                secret(
                    Some("kubernetes.io/basic-auth"),
                    &[("tls.crt", CERT), ("tls.key", KEY)],
                ),
                "has type",
            ),
            (secret(None, &[("tls.key", KEY)]), "no \"tls.crt\""),
            (secret(None, &[("tls.crt", CERT)]), "no \"tls.key\""),
            (
                secret(None, &[("tls.crt", b"not pem"), ("tls.key", KEY)]),
                "tls.crt holds no PEM certificate",
            ),
            (
                secret(None, &[("tls.crt", garbage), ("tls.key", KEY)]),
                "does not parse",
            ),
            (
                secret(None, &[("tls.crt", CERT), ("tls.key", CERT)]),
                "tls.key holds no PEM private key",
            ),
            (
                secret(
                    None,
                    &[("tls.crt", CERT), ("tls.key", KEY), ("ca.crt", b"junk")],
                ),
                "ca.crt holds no PEM",
            ),
        ];
        for (s, expected) in cases {
            let message = mutual_tls_auth(&s, well_before_expiry()).expect_err(expected);
            assert!(
                message.contains(expected),
                "{message:?} should contain {expected:?}"
            );
            assert!(
                !message.contains("c2VjcmV0") && !message.contains("AAECAwQFBgcI"),
                "{message}"
            );
        }
    }

    #[test]
    fn encrypted_keys_and_unterminated_blocks_are_named_as_such() {
        let encrypted: &[u8] =
            b"-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAECAwQFBgcI\n-----END ENCRYPTED PRIVATE KEY-----\n";
        let unterminated = &CERT[..CERT.len() - 30];
        let cases: [(&[u8], &[u8], &str); 2] = [
            (CERT, encrypted, "tls.key holds an encrypted private key"),
            (
                unterminated,
                KEY,
                "tls.crt has a PEM block without its END line",
            ),
        ];
        for (cert, key, expected) in cases {
            let s = secret(None, &[("tls.crt", cert), ("tls.key", key)]);
            let message = mutual_tls_auth(&s, well_before_expiry()).expect_err(expected);
            assert!(message.contains(expected), "{message:?}");
        }
    }

    #[test]
    fn api_keys_are_read_trimmed_and_must_exist() {
        let s = secret(None, &[("key", b"sk-123\n")]);
        assert_eq!(
            api_key_auth(&s, "key"),
            Ok(ConnectionAuth::ApiKey {
                key: "sk-123".into()
            })
        );
        assert!(
            api_key_auth(&s, "other")
                .expect_err("missing")
                .contains("has no key \"other\"")
        );
        let empty = secret(None, &[("key", b" \n")]);
        assert!(
            api_key_auth(&empty, "key")
                .expect_err("empty")
                .contains("is empty")
        );
        let tls = secret(Some("kubernetes.io/tls"), &[("key", b"sk")]);
        assert!(api_key_auth(&tls, "key").is_err());
    }

    #[test]
    fn bearer_tokens_are_read_trimmed_and_must_be_there() {
        let secret_with = |bytes: &[u8]| secret(None, &[("token", bytes)]);
        // (Secret, key, the token read or part of the message)
        let cases: [(Secret, &str, Result<&str, &str>); 5] = [
            (
                secret_with(b"  s3cr3t-token\n"),
                "token",
                Ok("s3cr3t-token"),
            ),
            (
                secret_with(b"s3cr3t-token"),
                "other",
                Err("Secret demo/client-cert has no key \"other\""),
            ),
            (
                secret_with(b" \n"),
                "token",
                Err("Secret demo/client-cert: key \"token\" is empty"),
            ),
            (
                secret_with(b"\xffs3cr3t"),
                "token",
                Err("key \"token\" is not UTF-8 text"),
            ),
            (
                secret(Some("kubernetes.io/tls"), &[("token", b"s3cr3t-token")]),
                "token",
                Ok("s3cr3t-token"),
            ),
        ];
        for (s, key, expected) in cases {
            match (bearer_token(&s, key), expected) {
                (Ok(got), Ok(token)) => assert_eq!(got, Credentials::Bearer(token.into())),
                (Err(message), Err(part)) => {
                    assert!(
                        message.contains(part),
                        "{message:?} should contain {part:?}"
                    );
                    assert!(!message.contains("s3cr3t"), "{message}");
                }
                (got, want) => panic!("key {key}: got {got:?}, want {want:?}"),
            }
        }
    }

    /// The username and password read, or part of the message.
    type BasicAuthRead = Result<(&'static str, &'static str), &'static str>;

    #[test]
    fn basic_auth_is_read_from_username_and_password_without_showing_them() {
        // (Secret, what is read)
        let cases: [(Secret, BasicAuthRead); 6] = [
            (
                secret(
                    Some("kubernetes.io/basic-auth"),
                    &[("username", b"grafana\n"), ("password", b" pa ss ")],
                ),
                Ok(("grafana", " pa ss ")),
            ),
            (
                secret(None, &[("username", b"u"), ("password", b"hunter2")]),
                Ok(("u", "hunter2")),
            ),
            (
                secret(None, &[("username", b"u")]),
                Err("Secret demo/client-cert has no key \"password\""),
            ),
            (
                secret(None, &[("password", b"hunter2")]),
                Err("Secret demo/client-cert has no key \"username\""),
            ),
            (
                secret(None, &[("username", b"u"), ("password", b"\xffhunter2")]),
                Err("key \"password\" is not UTF-8 text"),
            ),
            (
                secret(
                    Some("kubernetes.io/tls"),
                    &[("username", b"u"), ("password", b"hunter2")],
                ),
                Err("has type \"kubernetes.io/tls\"; use kubernetes.io/basic-auth or Opaque"),
            ),
        ];
        for (s, expected) in cases {
            match (basic_auth(&s), expected) {
                (Ok(got), Ok((username, password))) => assert_eq!(
                    got,
                    Credentials::Basic {
                        username: username.into(),
                        password: password.into()
                    }
                ),
                (Err(message), Err(part)) => {
                    assert!(
                        message.contains(part),
                        "{message:?} should contain {part:?}"
                    );
                    assert!(!message.contains("hunter2"), "{message}");
                }
                (got, want) => panic!("got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn ca_bundles_must_hold_a_certificate() {
        let cases: [(&[u8], &str, Result<(), &str>); 3] = [
            (CERT, "ca.crt", Ok(())),
            (
                CERT,
                "other",
                Err("Secret demo/client-cert has no key \"other\""),
            ),
            (
                b"not a certificate",
                "ca.crt",
                Err("Secret demo/client-cert: ca.crt holds no PEM certificate"),
            ),
        ];
        for (bytes, key, expected) in cases {
            let s = secret(None, &[("ca.crt", bytes)]);
            match (ca_bundle(&s, key), expected) {
                (Ok(pem), Ok(())) => assert_eq!(pem, bytes),
                (Err(message), Err(part)) => assert!(message.contains(part), "{message:?}"),
                (got, want) => panic!("key {key}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn cache_key_follows_spec_and_secret_version_but_not_secret_bytes() {
        let spec = TemporalConnectionSpec {
            host_port: "ns.tmprl.cloud:7233".into(),
            tls: None,
            mutual_tls_secret_ref: Some(SecretReference {
                name: "client-cert".into(),
            }),
            api_key_secret_ref: None,
            worker_credentials: None,
        };
        let s = secret(None, &[("tls.crt", CERT)]);
        let base = cache_key(&spec, "ns", Some(&s), None);
        let mut other_bytes = secret(None, &[("tls.crt", b"different")]);
        other_bytes.metadata.resource_version = s.metadata.resource_version.clone();
        assert_eq!(base, cache_key(&spec, "ns", Some(&other_bytes), None));
        let mut rotated = s.clone();
        rotated.metadata.resource_version = Some("42".into());
        assert_ne!(base, cache_key(&spec, "ns", Some(&rotated), None));
        assert_ne!(base, cache_key(&spec, "other-ns", Some(&s), None));
        let mut moved = spec.clone();
        moved.host_port = "elsewhere:7233".into();
        assert_ne!(base, cache_key(&moved, "ns", Some(&s), None));
        assert!(!base.contains("different"));
    }
}
