//! Resolves a TWD's TemporalConnection and its credential Secret into a [`ConnectionConfig`]
//! for the Temporal client pool, or says why it cannot: `TemporalConnectionNotFound` only when
//! the connection does not exist, `AuthSecretInvalid` only when its Secret does not exist or
//! is malformed or expired. A read the API server could not answer (timeout, refused
//! connection, 5xx, 429) is [`ResolveError::Transient`], for the activity to retry.

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::{Api, Client};
use twc_crds::TemporalConnection;
use twc_crds::connection::AuthMode;
use twc_workflows::model::{BlockReason, Blocked};

use super::credentials;
use super::error::{K8sError, ObjectName, ResolveError};
use super::lookup::get_if_exists;
use crate::connection::{ConnectionAuth, ConnectionConfig};

/// Reads the TemporalConnection `connection_name` in `namespace` and the Secret it names, checks
/// the credentials, and returns both the object and the config to connect with.
pub async fn resolve_connection(
    client: &Client,
    namespace: &str,
    connection_name: &str,
    temporal_namespace: &str,
) -> Result<(TemporalConnection, ConnectionConfig), ResolveError> {
    let connection = get_connection(client, namespace, connection_name).await?;
    let spec = &connection.spec;
    let (auth, secret) = match spec.auth_mode() {
        AuthMode::None => (ConnectionAuth::None, None),
        AuthMode::MutualTls { secret_name } => {
            let secret = get_secret(
                client,
                namespace,
                &secret_name,
                connection_name,
                "mutualTLSSecretRef",
            )
            .await?;
            let auth =
                credentials::mutual_tls_auth(&secret, Timestamp::now()).map_err(auth_invalid)?;
            (auth, Some(secret))
        }
        AuthMode::ApiKey { secret_name, key } => {
            let secret = get_secret(
                client,
                namespace,
                &secret_name,
                connection_name,
                "apiKeySecretRef",
            )
            .await?;
            let auth = credentials::api_key_auth(&secret, &key).map_err(auth_invalid)?;
            (auth, Some(secret))
        }
    };
    let config = ConnectionConfig {
        host_port: spec.host_port.clone(),
        server_name: spec.server_name().map(str::to_owned),
        temporal_namespace: temporal_namespace.to_owned(),
        cache_key: credentials::cache_key(spec, temporal_namespace, secret.as_ref()),
        auth,
    };
    tracing::debug!(namespace, connection = connection_name, auth = ?config.auth, "resolved TemporalConnection");
    Ok((connection, config))
}

async fn get_connection(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<TemporalConnection, ResolveError> {
    let object = ObjectName::new("TemporalConnection", namespace, name);
    connection_read(&object, find_connection(client, namespace, name).await)
}

/// What a read of the TemporalConnection means: only a connection that does not exist is
/// `TemporalConnectionNotFound`.
fn connection_read(
    object: &ObjectName,
    read: Result<Option<TemporalConnection>, K8sError>,
) -> Result<TemporalConnection, ResolveError> {
    match read {
        Ok(Some(connection)) => Ok(connection),
        Ok(None) => Err(ResolveError::Blocked(Blocked {
            reason: BlockReason::TemporalConnectionNotFound,
            message: format!(
                "{object} not found; create it or fix spec.workerOptions.connectionRef.name"
            ),
        })),
        Err(e) => Err(ResolveError::from_read(e)),
    }
}

/// The TemporalConnection, or `None` when it does not exist (for the deletion path, which
/// needs to know whether it is being deleted and where it pointed).
pub async fn find_connection(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Option<TemporalConnection>, K8sError> {
    let api: Api<TemporalConnection> = Api::namespaced(client.clone(), namespace);
    let object = ObjectName::new("TemporalConnection", namespace, name);
    get_if_exists(&api, name)
        .await
        .map_err(K8sError::api("get", &object))
}

async fn get_secret(
    client: &Client,
    namespace: &str,
    name: &str,
    connection: &str,
    field: &str,
) -> Result<Secret, ResolveError> {
    if name.is_empty() {
        return Err(auth_invalid(format!(
            "TemporalConnection {namespace}/{connection}: {field}.name is not set"
        ))
        .into());
    }
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let object = ObjectName::new("Secret", namespace, name);
    let read = get_if_exists(&api, name)
        .await
        .map_err(K8sError::api("get", &object));
    secret_read(&object, connection, field, read)
}

/// What a read of the credential Secret means: only a Secret that does not exist is
/// `AuthSecretInvalid` here (its content is checked by [`credentials`]).
fn secret_read(
    object: &ObjectName,
    connection: &str,
    field: &str,
    read: Result<Option<Secret>, K8sError>,
) -> Result<Secret, ResolveError> {
    match read {
        Ok(Some(secret)) => Ok(secret),
        Ok(None) => Err(auth_invalid(format!(
            "{object} named by TemporalConnection {connection} ({field}) not found"
        ))
        .into()),
        Err(e) => Err(ResolveError::from_read(e)),
    }
}

fn auth_invalid(message: String) -> Blocked {
    Blocked {
        reason: BlockReason::AuthSecretInvalid,
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::fake_api;

    /// What a resolution failure shows: a condition reason, or `None` for a retry.
    fn shown(result: Result<impl Sized, ResolveError>) -> Option<BlockReason> {
        match result {
            Ok(_) => panic!("resolved"),
            Err(ResolveError::Blocked(blocked)) => Some(blocked.reason),
            Err(ResolveError::Transient(_)) => None,
        }
    }

    /// The API-key connection `cloud` and its Secret `cloud-key` in `demo`, as served.
    fn served(connection: fake_api::Answer, secret: fake_api::Answer) -> kube::Client {
        fake_api::client(vec![
            (
                "/apis/temporal.io/v1alpha1/namespaces/demo/temporalconnections/cloud".into(),
                connection,
            ),
            ("/api/v1/namespaces/demo/secrets/cloud-key".into(), secret),
        ])
    }

    fn connection_object() -> fake_api::Answer {
        fake_api::ok(serde_json::json!({
            "apiVersion": "temporal.io/v1alpha1", "kind": "TemporalConnection",
            "metadata": { "name": "cloud", "namespace": "demo" },
            "spec": { "hostPort": "temporal:7233",
                      "apiKeySecretRef": { "name": "cloud-key", "key": "key" } }
        }))
    }

    fn secret_object() -> fake_api::Answer {
        fake_api::ok(serde_json::json!({
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": { "name": "cloud-key", "namespace": "demo", "uid": "u1",
                          "resourceVersion": "7" },
            "data": { "key": "c2VjcmV0" }
        }))
    }

    #[tokio::test]
    async fn what_the_api_server_answers_decides_between_a_condition_and_a_retry() {
        use BlockReason::{AuthSecretInvalid, PlanExecutionFailed, TemporalConnectionNotFound};
        use fake_api::{failure, not_found, unserved};
        // (what happens, the connection's answer, the Secret's, the condition or None: retry)
        let cases = [
            (
                "connection missing",
                not_found("temporalconnections", "cloud"),
                secret_object(),
                Some(TemporalConnectionNotFound),
            ),
            (
                "connections not served yet",
                unserved(),
                secret_object(),
                None,
            ),
            (
                "API server unavailable",
                failure(503, "ServiceUnavailable"),
                secret_object(),
                None,
            ),
            (
                "Secret missing",
                connection_object(),
                not_found("secrets", "cloud-key"),
                Some(AuthSecretInvalid),
            ),
            (
                "Secret read fails",
                connection_object(),
                failure(500, "InternalError"),
                None,
            ),
            (
                "Secret read throttled",
                connection_object(),
                failure(429, "TooManyRequests"),
                None,
            ),
            (
                "Secret read times out",
                connection_object(),
                failure(504, "Timeout"),
                None,
            ),
            (
                "Secret read forbidden",
                connection_object(),
                failure(403, "Forbidden"),
                Some(PlanExecutionFailed),
            ),
        ];
        for (what, connection, secret, expected) in cases {
            let client = served(connection, secret);
            let resolved = resolve_connection(&client, "demo", "cloud", "default").await;
            assert_eq!(shown(resolved), expected, "{what}");
        }
        let client = served(connection_object(), secret_object());
        let (_, config) = resolve_connection(&client, "demo", "cloud", "default")
            .await
            .unwrap_or_else(|e| panic!("all served: {e}"));
        assert_eq!(config.host_port, "temporal:7233");
    }

    #[test]
    fn missing_objects_are_named_with_what_to_do() {
        let connection = ObjectName::new("TemporalConnection", "demo", "dev");
        let Err(ResolveError::Blocked(blocked)) = connection_read(&connection, Ok(None)) else {
            panic!("a missing connection blocks");
        };
        assert_eq!(
            blocked.message,
            "TemporalConnection demo/dev not found; create it or fix spec.workerOptions.connectionRef.name"
        );
        let secret = ObjectName::new("Secret", "demo", "cloud");
        let Err(ResolveError::Blocked(blocked)) =
            secret_read(&secret, "dev", "apiKeySecretRef", Ok(None))
        else {
            panic!("a missing Secret blocks");
        };
        assert_eq!(
            blocked.message,
            "Secret demo/cloud named by TemporalConnection dev (apiKeySecretRef) not found"
        );
    }
}
