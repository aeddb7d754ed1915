//! Resolves a TWD's TemporalConnection and its credential Secret into a [`ConnectionConfig`]
//! for the Temporal client pool, or says why it cannot (`TemporalConnectionNotFound`,
//! `AuthSecretInvalid`).

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::{Api, Client};
use twc_crds::TemporalConnection;
use twc_crds::connection::AuthMode;
use twc_workflows::model::{BlockReason, Blocked};

use super::credentials;
use super::error::{K8sError, ObjectName, is_not_found};
use crate::connection::{ConnectionAuth, ConnectionConfig};

/// Reads the TemporalConnection `connection_name` in `namespace` and the Secret it names, checks
/// the credentials, and returns both the object and the config to connect with.
pub async fn resolve_connection(
    client: &Client,
    namespace: &str,
    connection_name: &str,
    temporal_namespace: &str,
) -> Result<(TemporalConnection, ConnectionConfig), Blocked> {
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
) -> Result<TemporalConnection, Blocked> {
    let api: Api<TemporalConnection> = Api::namespaced(client.clone(), namespace);
    let not_found = |message: String| Blocked {
        reason: BlockReason::TemporalConnectionNotFound,
        message,
    };
    match api.get_opt(name).await {
        Ok(Some(connection)) => Ok(connection),
        Ok(None) => Err(not_found(format!(
            "TemporalConnection {namespace}/{name} not found; create it or fix spec.workerOptions.connectionRef.name"
        ))),
        Err(e) => {
            let object = ObjectName::new("TemporalConnection", namespace, name);
            Err(not_found(K8sError::api("get", &object)(e).to_string()))
        }
    }
}

async fn get_secret(
    client: &Client,
    namespace: &str,
    name: &str,
    connection: &str,
    field: &str,
) -> Result<Secret, Blocked> {
    if name.is_empty() {
        return Err(auth_invalid(format!(
            "TemporalConnection {namespace}/{connection}: {field}.name is not set"
        )));
    }
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    match api.get(name).await {
        Ok(secret) => Ok(secret),
        Err(e) if is_not_found(&e) => Err(auth_invalid(format!(
            "Secret {namespace}/{name} named by TemporalConnection {connection} ({field}) not found"
        ))),
        Err(e) => Err(auth_invalid(
            K8sError::api("get", &ObjectName::new("Secret", namespace, name))(e).to_string(),
        )),
    }
}

fn auth_invalid(message: String) -> Blocked {
    Blocked {
        reason: BlockReason::AuthSecretInvalid,
        message,
    }
}
