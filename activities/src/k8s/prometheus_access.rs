//! What a Prometheus check of the analysis needs beyond its address: the credentials and the
//! private CA its spec names, read from Secrets in the TWD's namespace when it is measured (a
//! rotated Secret counts from the next measurement). Messages name the Secret and key, never
//! their bytes.

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};
use twc_crds::worker_deployment::{PrometheusAuthRef, PrometheusCheck};

use super::credentials;
use super::error::{K8sError, ObjectName};
use super::lookup::get_if_exists;
use crate::prometheus::{Authorization, CaBundle, PrometheusAccess};

/// Why the access of a Prometheus check could not be read.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    /// `prometheus.auth` names both credential Secrets, or neither (admission refuses it; an
    /// object stored before the rule may still have it).
    #[error("prometheus.auth needs exactly one of bearerTokenSecretRef or basicAuthSecretRef")]
    AmbiguousAuth,
    /// The Secret a field names does not exist.
    #[error("{object} named by prometheus.{field} not found")]
    SecretNotFound {
        /// The Secret.
        object: ObjectName,
        /// The field naming it.
        field: &'static str,
    },
    /// The Secret could not be read.
    #[error(transparent)]
    Api(Box<K8sError>),
    /// The Secret does not hold what the field says (a missing or empty key, an unreadable
    /// CA bundle, a wrong type).
    #[error("prometheus.{field}: {problem}")]
    Unusable {
        /// The field naming the Secret.
        field: &'static str,
        /// What is wrong, naming the Secret and key.
        problem: String,
    },
}

/// Where a credential comes from and where it is read from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AccessField<'a> {
    /// `auth.bearerTokenSecretRef`: Secret `name`, key `key`.
    BearerToken {
        /// Secret name.
        name: &'a str,
        /// Key.
        key: &'a str,
    },
    /// `auth.basicAuthSecretRef`: Secret `name`.
    BasicAuth {
        /// Secret name.
        name: &'a str,
    },
    /// `tls.caSecretRef`: Secret `name`, key `key`.
    Ca {
        /// Secret name.
        name: &'a str,
        /// Key.
        key: &'a str,
    },
}

impl<'a> AccessField<'a> {
    /// The spec field under `prometheus.`.
    pub fn path(self) -> &'static str {
        match self {
            Self::BearerToken { .. } => "auth.bearerTokenSecretRef",
            Self::BasicAuth { .. } => "auth.basicAuthSecretRef",
            Self::Ca { .. } => "tls.caSecretRef",
        }
    }

    /// The Secret it names.
    pub fn secret_name(self) -> &'a str {
        match self {
            Self::BearerToken { name, .. } | Self::BasicAuth { name } | Self::Ca { name, .. } => {
                name
            }
        }
    }

    /// Where the value is, for messages: `bearer token in key "token" of Secret shop/prom`.
    pub fn source(self, namespace: &str) -> String {
        match self {
            Self::BearerToken { name, key } => {
                format!("bearer token in key {key:?} of Secret {namespace}/{name}")
            }
            Self::BasicAuth { name } => format!("basic auth in Secret {namespace}/{name}"),
            Self::Ca { name, key } => format!("key {key:?} of Secret {namespace}/{name}"),
        }
    }
}

/// The fields of `check` that name Secrets: its credentials (if any) and its CA (if any).
pub fn access_fields(check: &PrometheusCheck) -> Result<Vec<AccessField<'_>>, AccessError> {
    let mut fields = Vec::new();
    if let Some(auth) = &check.auth {
        fields.push(match auth.secret_ref() {
            Some(PrometheusAuthRef::BearerToken(selector)) => AccessField::BearerToken {
                name: &selector.name,
                key: &selector.key,
            },
            Some(PrometheusAuthRef::BasicAuth(reference)) => AccessField::BasicAuth {
                name: &reference.name,
            },
            None => return Err(AccessError::AmbiguousAuth),
        });
    }
    if let Some(tls) = &check.tls {
        fields.push(AccessField::Ca {
            name: &tls.ca_secret_ref.name,
            key: &tls.ca_secret_ref.key,
        });
    }
    Ok(fields)
}

/// The access that the Secrets read for a check's fields give (a TWD in `namespace`). Pure:
/// the reads are [`prometheus_access`]'s.
pub fn access_from(
    namespace: &str,
    fields: &[(AccessField<'_>, &Secret)],
) -> Result<PrometheusAccess, AccessError> {
    let mut access = PrometheusAccess::default();
    for &(field, secret) in fields {
        let unusable = |problem| AccessError::Unusable {
            field: field.path(),
            problem,
        };
        match field {
            AccessField::BearerToken { key, .. } => {
                access.authorization = Some(Authorization {
                    credentials: credentials::bearer_token(secret, key).map_err(unusable)?,
                    source: field.source(namespace),
                });
            }
            AccessField::BasicAuth { .. } => {
                access.authorization = Some(Authorization {
                    credentials: credentials::basic_auth(secret).map_err(unusable)?,
                    source: field.source(namespace),
                });
            }
            AccessField::Ca { key, .. } => {
                access.ca = Some(CaBundle {
                    pem: credentials::ca_bundle(secret, key).map_err(unusable)?,
                    source: field.source(namespace),
                });
            }
        }
    }
    Ok(access)
}

/// Reads the Secrets `check` names in `namespace` and the access they give.
pub async fn prometheus_access(
    client: &Client,
    namespace: &str,
    check: &PrometheusCheck,
) -> Result<PrometheusAccess, AccessError> {
    let fields = access_fields(check)?;
    let mut secrets = Vec::with_capacity(fields.len());
    for field in &fields {
        secrets.push(read(client, namespace, *field).await?);
    }
    let pairs: Vec<(AccessField<'_>, &Secret)> = fields.iter().copied().zip(&secrets).collect();
    access_from(namespace, &pairs)
}

/// The Secret that `field` names.
async fn read(
    client: &Client,
    namespace: &str,
    field: AccessField<'_>,
) -> Result<Secret, AccessError> {
    let name = field.secret_name();
    let object = ObjectName::new("Secret", namespace, name);
    // A selector's name may be left empty (Kubernetes defaults it to ""): no such Secret.
    if name.is_empty() {
        return Err(AccessError::SecretNotFound {
            object,
            field: field.path(),
        });
    }
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    match get_if_exists(&api, name).await {
        Ok(Some(secret)) => Ok(secret),
        Ok(None) => Err(AccessError::SecretNotFound {
            object,
            field: field.path(),
        }),
        Err(e) => Err(AccessError::Api(Box::new(K8sError::api("get", &object)(e)))),
    }
}

#[cfg(test)]
mod tests {
    use base64::{Engine as _, engine::general_purpose::STANDARD as BASE64};
    use serde_json::json;

    use super::super::fake_api::{self, Answer, failure, not_found};
    use super::*;
    use crate::prometheus::Credentials;

    /// A public self-signed test certificate (its key was discarded).
    const CERT: &[u8] = include_bytes!("testdata/client.crt");

    fn check(prometheus: serde_json::Value) -> PrometheusCheck {
        serde_json::from_value(prometheus).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A check with basic auth from `prom-auth` and the CA in `prom-ca` key `ca.crt`.
    fn protected_check() -> PrometheusCheck {
        check(json!({
            "address": "https://prometheus.shop:9090", "query": "up", "maxValue": 1,
            "auth": { "basicAuthSecretRef": { "name": "prom-auth" } },
            "tls": { "caSecretRef": { "name": "prom-ca", "key": "ca.crt" } }
        }))
    }

    fn secret(name: &str, type_: &str, data: &[(&str, &[u8])]) -> Answer {
        let data: serde_json::Map<String, serde_json::Value> = data
            .iter()
            .map(|(key, value)| ((*key).to_owned(), json!(BASE64.encode(value))))
            .collect();
        fake_api::ok(json!({
            "apiVersion": "v1", "kind": "Secret", "type": type_,
            "metadata": { "name": name, "namespace": "shop" },
            "data": data
        }))
    }

    fn basic_auth_secret() -> Answer {
        secret(
            "prom-auth",
            "kubernetes.io/basic-auth",
            &[("username", b"twc"), ("password", b"hunter2")],
        )
    }

    fn ca_secret() -> Answer {
        secret("prom-ca", "Opaque", &[("ca.crt", CERT)])
    }

    fn served(auth: Answer, ca: Answer) -> Client {
        fake_api::client(vec![
            ("/api/v1/namespaces/shop/secrets/prom-auth".into(), auth),
            ("/api/v1/namespaces/shop/secrets/prom-ca".into(), ca),
        ])
    }

    #[test]
    fn the_fields_of_a_check_name_its_secrets() {
        let cases = [
            (
                json!({ "address": "http://p:9090", "query": "up", "maxValue": 1 }),
                Ok(vec![]),
            ),
            (
                json!({ "address": "http://p:9090", "query": "up", "maxValue": 1,
                        "auth": { "bearerTokenSecretRef": { "name": "grafana", "key": "token" } } }),
                Ok(vec![AccessField::BearerToken {
                    name: "grafana",
                    key: "token",
                }]),
            ),
            (
                json!({ "address": "https://p:9090", "query": "up", "maxValue": 1,
                        "auth": { "basicAuthSecretRef": { "name": "prom-auth" } },
                        "tls": { "caSecretRef": { "name": "prom-ca", "key": "ca.crt" } } }),
                Ok(vec![
                    AccessField::BasicAuth { name: "prom-auth" },
                    AccessField::Ca {
                        name: "prom-ca",
                        key: "ca.crt",
                    },
                ]),
            ),
            (
                json!({ "address": "http://p:9090", "query": "up", "maxValue": 1,
                        "auth": { "bearerTokenSecretRef": { "name": "t", "key": "token" },
                                  "basicAuthSecretRef": { "name": "b" } } }),
                Err(
                    "prometheus.auth needs exactly one of bearerTokenSecretRef or basicAuthSecretRef",
                ),
            ),
            (
                json!({ "address": "http://p:9090", "query": "up", "maxValue": 1, "auth": {} }),
                Err(
                    "prometheus.auth needs exactly one of bearerTokenSecretRef or basicAuthSecretRef",
                ),
            ),
        ];
        for (spec, expected) in cases {
            let check = check(spec.clone());
            match (access_fields(&check), expected) {
                (Ok(fields), Ok(want)) => assert_eq!(fields, want, "{spec}"),
                (Err(err), Err(message)) => assert_eq!(err.to_string(), message, "{spec}"),
                (got, want) => panic!("{spec}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn sources_name_the_secret_and_key() {
        let cases = [
            (
                AccessField::BearerToken {
                    name: "grafana",
                    key: "token",
                },
                "bearer token in key \"token\" of Secret shop/grafana",
            ),
            (
                AccessField::BasicAuth { name: "prom-auth" },
                "basic auth in Secret shop/prom-auth",
            ),
            (
                AccessField::Ca {
                    name: "prom-ca",
                    key: "ca.crt",
                },
                "key \"ca.crt\" of Secret shop/prom-ca",
            ),
        ];
        for (field, source) in cases {
            assert_eq!(field.source("shop"), source);
        }
    }

    #[tokio::test]
    async fn the_secrets_of_a_check_give_its_access_or_say_what_is_missing() {
        // (what happens, the auth Secret's answer, the CA Secret's, the message or None: read)
        let cases = [
            ("both readable", basic_auth_secret(), ca_secret(), None),
            (
                "auth Secret missing",
                not_found("secrets", "prom-auth"),
                ca_secret(),
                Some(
                    "Secret shop/prom-auth named by prometheus.auth.basicAuthSecretRef not found"
                        .to_owned(),
                ),
            ),
            (
                "CA Secret missing",
                basic_auth_secret(),
                not_found("secrets", "prom-ca"),
                Some(
                    "Secret shop/prom-ca named by prometheus.tls.caSecretRef not found".to_owned(),
                ),
            ),
            (
                "password missing",
                secret(
                    "prom-auth",
                    "kubernetes.io/basic-auth",
                    &[("username", b"twc")],
                ),
                ca_secret(),
                Some(
                    "prometheus.auth.basicAuthSecretRef: Secret shop/prom-auth has no key \
                     \"password\""
                        .to_owned(),
                ),
            ),
            (
                "CA key missing",
                basic_auth_secret(),
                secret("prom-ca", "Opaque", &[("tls.crt", CERT)]),
                Some(
                    "prometheus.tls.caSecretRef: Secret shop/prom-ca has no key \"ca.crt\""
                        .to_owned(),
                ),
            ),
            (
                "CA unreadable",
                basic_auth_secret(),
                secret("prom-ca", "Opaque", &[("ca.crt", b"hunter2")]),
                Some(
                    "prometheus.tls.caSecretRef: Secret shop/prom-ca: ca.crt holds no PEM \
                     certificate"
                        .to_owned(),
                ),
            ),
            (
                "Secrets may not be read",
                failure(403, "Forbidden"),
                ca_secret(),
                Some("get Secret shop/prom-auth".to_owned()),
            ),
        ];
        for (what, auth, ca, expected) in cases {
            let client = served(auth, ca);
            let access = prometheus_access(&client, "shop", &protected_check()).await;
            match (access, expected) {
                (Ok(access), None) => {
                    assert_eq!(
                        access.authorization.map(|a| (a.credentials, a.source)),
                        Some((
                            Credentials::Basic {
                                username: "twc".into(),
                                password: "hunter2".into()
                            },
                            "basic auth in Secret shop/prom-auth".to_owned()
                        )),
                        "{what}"
                    );
                    assert_eq!(
                        access.ca.map(|ca| (ca.pem, ca.source)),
                        Some((
                            CERT.to_vec(),
                            "key \"ca.crt\" of Secret shop/prom-ca".to_owned()
                        )),
                        "{what}"
                    );
                }
                (Err(err), Some(message)) => {
                    let text = err.to_string();
                    assert!(text.starts_with(&message), "{what}: {text}");
                    assert!(!text.contains("hunter2"), "{what}: {text}");
                }
                (got, want) => panic!("{what}: got {got:?}, want {want:?}"),
            }
        }
    }
}
