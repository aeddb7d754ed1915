//! API keys of the production-like Temporal: JWTs signed ES256 by a key whose public half the
//! sandbox publishes as a JWKS over HTTP on loopback, where the server's default JWT key
//! provider fetches it (and fetches it again every refresh interval, so rotation shows).

use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// A key could not be made or a token not signed.
#[derive(Debug, thiserror::Error)]
pub enum JwtError {
    /// ring could not generate or load a key.
    #[error("making signing key {kid}: {reason}")]
    Key {
        /// Key ID.
        kid: String,
        /// ring's error.
        reason: String,
    },
    /// ring could not sign.
    #[error("signing a token with key {kid}")]
    Sign {
        /// Key ID.
        kid: String,
    },
    /// The JWKS endpoint could not listen.
    #[error("listening for the JWKS endpoint: {0}")]
    Listen(std::io::Error),
}

/// One ES256 key pair and its key ID.
struct SigningKey {
    kid: String,
    pair: EcdsaKeyPair,
}

impl SigningKey {
    fn generate(kid: String, rng: &SystemRandom) -> Result<Self, JwtError> {
        let key_error = |reason: String| JwtError::Key {
            kid: kid.clone(),
            reason,
        };
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, rng)
            .map_err(|e| key_error(e.to_string()))?;
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), rng)
            .map_err(|e| key_error(e.to_string()))?;
        Ok(Self { kid, pair })
    }

    /// The public key as a JWK (`kty` EC, `crv` P-256).
    fn jwk(&self) -> serde_json::Value {
        // Uncompressed point: 0x04, then x and y of 32 bytes each.
        let point = self.pair.public_key().as_ref();
        let x = point.get(1..33).unwrap_or_default();
        let y = point.get(33..65).unwrap_or_default();
        json!({
            "kty": "EC", "crv": "P-256", "alg": "ES256", "use": "sig", "kid": self.kid,
            "x": URL_SAFE_NO_PAD.encode(x), "y": URL_SAFE_NO_PAD.encode(y),
        })
    }

    /// A compact JWS of `claims`.
    fn sign(&self, claims: &serde_json::Value, rng: &SystemRandom) -> Result<String, JwtError> {
        let header = json!({ "alg": "ES256", "typ": "JWT", "kid": self.kid });
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let signature =
            self.pair
                .sign(rng, signing_input.as_bytes())
                .map_err(|_| JwtError::Sign {
                    kid: self.kid.clone(),
                })?;
        Ok(format!(
            "{signing_input}.{}",
            URL_SAFE_NO_PAD.encode(signature.as_ref())
        ))
    }
}

/// What happens to the signing key a rotation replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreviousKey {
    /// Stays in the JWKS: keys it signed keep working until they expire.
    Keep,
    /// Leaves the JWKS: keys it signed are refused once the server refreshes the key set.
    Retire,
}

struct Keys {
    /// Signs new API keys.
    current: SigningKey,
    /// Published besides `current` (rotated out, kept).
    kept: Vec<SigningKey>,
    /// Signs tokens the server must refuse; never published.
    unknown: SigningKey,
    /// Keys made so far (for key IDs).
    made: u32,
}

/// The sandbox's API key issuer: signing keys, the published key set, minting.
#[derive(Clone)]
pub struct Issuer {
    keys: Arc<Mutex<Keys>>,
    rng: SystemRandom,
}

impl std::fmt::Debug for Issuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issuer")
            .field("current_kid", &self.current_kid())
            .finish_non_exhaustive()
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Issuer {
    /// An issuer with one fresh signing key (`twc-sandbox-1`).
    pub fn new() -> Result<Self, JwtError> {
        let rng = SystemRandom::new();
        let keys = Keys {
            current: SigningKey::generate("twc-sandbox-1".to_owned(), &rng)?,
            kept: Vec::new(),
            unknown: SigningKey::generate("twc-sandbox-unknown".to_owned(), &rng)?,
            made: 1,
        };
        Ok(Self {
            keys: Arc::new(Mutex::new(keys)),
            rng,
        })
    }

    fn keys(&self) -> std::sync::MutexGuard<'_, Keys> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Key ID of the key that signs new API keys.
    pub fn current_kid(&self) -> String {
        self.keys().current.kid.clone()
    }

    /// An API key for `subject` with `permissions` (`<namespace>:<read|write|worker|admin>`,
    /// `system:<role>` for every namespace), valid for `ttl`.
    pub fn mint(
        &self,
        subject: &str,
        permissions: &[&str],
        ttl: Duration,
    ) -> Result<String, JwtError> {
        let claims = claims(subject, permissions, ttl);
        self.keys().current.sign(&claims, &self.rng)
    }

    /// An API key like [`Self::mint`]'s but signed by a key the server never saw: refused.
    pub fn mint_unknown(
        &self,
        subject: &str,
        permissions: &[&str],
        ttl: Duration,
    ) -> Result<String, JwtError> {
        let claims = claims(subject, permissions, ttl);
        self.keys().unknown.sign(&claims, &self.rng)
    }

    /// An API key like [`Self::mint`]'s that expired a minute ago: refused.
    pub fn mint_expired(&self, subject: &str, permissions: &[&str]) -> Result<String, JwtError> {
        let mut claims = claims(subject, permissions, Duration::ZERO);
        let now = now_secs();
        claims["iat"] = json!(now.saturating_sub(120));
        claims["exp"] = json!(now.saturating_sub(60));
        self.keys().current.sign(&claims, &self.rng)
    }

    /// Makes a new signing key the current one; returns its key ID. `previous` says whether
    /// the replaced key stays published.
    pub fn rotate(&self, previous: PreviousKey) -> Result<String, JwtError> {
        let mut keys = self.keys();
        keys.made += 1;
        let kid = format!("twc-sandbox-{}", keys.made);
        let new = SigningKey::generate(kid.clone(), &self.rng)?;
        let old = std::mem::replace(&mut keys.current, new);
        if previous == PreviousKey::Keep {
            keys.kept.push(old);
        }
        Ok(kid)
    }

    /// The published key set (JWKS JSON): the current key and the kept ones.
    pub fn jwks(&self) -> String {
        let keys = self.keys();
        let jwks: Vec<serde_json::Value> = std::iter::once(&keys.current)
            .chain(&keys.kept)
            .map(SigningKey::jwk)
            .collect();
        json!({ "keys": jwks }).to_string()
    }

    /// Serves [`Self::jwks`] on every path of `127.0.0.1:<free port>`; returns the URL and the
    /// server task (abort it to stop).
    pub async fn serve_jwks(&self) -> Result<(String, JoinHandle<()>), JwtError> {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(JwtError::Listen)?;
        let address = listener.local_addr().map_err(JwtError::Listen)?;
        let issuer = self.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let issuer = issuer.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |_: Request<hyper::body::Incoming>| {
                        let body = issuer.jwks();
                        async move {
                            Ok::<_, Infallible>(
                                Response::builder()
                                    .header("content-type", "application/json")
                                    .body(Full::new(Bytes::from(body)))
                                    .unwrap_or_default(),
                            )
                        }
                    });
                    if let Err(e) = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await
                    {
                        tracing::debug!("JWKS connection: {e}");
                    }
                });
            }
        });
        Ok((format!("http://{address}/.well-known/jwks.json"), task))
    }
}

/// The claims of an API key: subject, permissions, issued now, expiring after `ttl`.
fn claims(subject: &str, permissions: &[&str], ttl: Duration) -> serde_json::Value {
    let now = now_secs();
    json!({
        "sub": subject,
        "iss": "twc-sandbox",
        "permissions": permissions,
        "iat": now,
        "exp": now + ttl.as_secs(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::signature::{ECDSA_P256_SHA256_FIXED, UnparsedPublicKey};

    fn issuer() -> Issuer {
        Issuer::new().unwrap_or_else(|e| panic!("{e}"))
    }

    /// Verifies `token` against the JWK of key `kid` in `jwks`, as the server would.
    fn verifies(token: &str, jwks: &str) -> bool {
        let set: serde_json::Value = serde_json::from_str(jwks).unwrap_or_else(|e| panic!("{e}"));
        let mut parts = token.rsplitn(2, '.');
        let (Some(signature), Some(input)) = (parts.next(), parts.next()) else {
            return false;
        };
        let header: serde_json::Value = serde_json::from_slice(
            &URL_SAFE_NO_PAD
                .decode(input.split('.').next().unwrap_or_default())
                .unwrap_or_default(),
        )
        .unwrap_or_default();
        let Some(jwk) = set["keys"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|k| k["kid"] == header["kid"])
        else {
            return false;
        };
        let coordinate = |c: &str| {
            URL_SAFE_NO_PAD
                .decode(jwk[c].as_str().unwrap_or_default())
                .unwrap_or_default()
        };
        let mut point = vec![4u8];
        point.extend(coordinate("x"));
        point.extend(coordinate("y"));
        let signature = URL_SAFE_NO_PAD.decode(signature).unwrap_or_default();
        UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, point)
            .verify(input.as_bytes(), &signature)
            .is_ok()
    }

    #[test]
    fn minted_keys_verify_against_the_published_key_set_and_unknown_ones_do_not() {
        let issuer = issuer();
        let hour = Duration::from_secs(3600);
        let key = issuer
            .mint("me", &["default:write"], hour)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(verifies(&key, &issuer.jwks()));
        let claims = key.split('.').nth(1).unwrap_or_default();
        let claims: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(claims).unwrap_or_default())
                .unwrap_or_default();
        assert_eq!(claims["permissions"], json!(["default:write"]));
        assert_eq!(claims["sub"], "me");
        let unknown = issuer
            .mint_unknown("me", &["default:write"], hour)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(!verifies(&unknown, &issuer.jwks()));
    }

    #[test]
    fn rotation_retires_or_keeps_the_previous_key() {
        let issuer = issuer();
        let hour = Duration::from_secs(3600);
        let a = issuer
            .mint("me", &[], hour)
            .unwrap_or_else(|e| panic!("{e}"));
        let kid = issuer
            .rotate(PreviousKey::Keep)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(kid, "twc-sandbox-2");
        let b = issuer
            .mint("me", &[], hour)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(verifies(&a, &issuer.jwks()) && verifies(&b, &issuer.jwks()));
        issuer
            .rotate(PreviousKey::Retire)
            .unwrap_or_else(|e| panic!("{e}"));
        let c = issuer
            .mint("me", &[], hour)
            .unwrap_or_else(|e| panic!("{e}"));
        // Key 2 (b's) is retired; key 1 (a's) was kept by the first rotation and stays.
        assert!(verifies(&a, &issuer.jwks()));
        assert!(!verifies(&b, &issuer.jwks()));
        assert!(verifies(&c, &issuer.jwks()));
    }
}
