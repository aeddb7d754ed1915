//! Resolves a TWD's TemporalConnection and its credential Secret into a [`ConnectionConfig`]
//! for the Temporal client pool, or says why it cannot: `TemporalConnectionNotFound` only when
//! the connection does not exist, `AuthSecretInvalid` only when its Secret does not exist or
//! is malformed or expired. A read the API server could not answer (timeout, refused
//! connection, 5xx, 429) is [`ResolveError::Transient`], for the activity to retry.

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::{Api, Client};
use twc_crds::connection::AuthMode;
use twc_crds::worker_deployment::{ConnectionKind, ConnectionReference};
use twc_crds::{ClusterConnection, TemporalConnection, TemporalConnectionSpec};
use twc_workflows::model::{BlockReason, Blocked};

use super::credentials;
use super::error::{K8sError, ObjectName, ResolveError};
use super::lookup::get_if_exists;
use crate::connection::{ConnectionAuth, ConnectionConfig};

/// The connection object a TWD uses.
#[derive(Debug, Clone, PartialEq)]
pub enum Connection {
    /// A Connection or TemporalConnection in the TWD's namespace (read as the latter).
    Namespaced(TemporalConnection),
    /// A cluster-scoped ClusterConnection (its Secrets are read in the TWD's namespace).
    Cluster(ClusterConnection),
}

impl Connection {
    /// Its spec (both kinds have the same).
    pub fn spec(&self) -> &TemporalConnectionSpec {
        match self {
            Self::Namespaced(c) => &c.spec,
            Self::Cluster(c) => &c.spec.0,
        }
    }

    /// Whether it is being deleted.
    pub fn is_deleting(&self) -> bool {
        match self {
            Self::Namespaced(c) => c.metadata.deletion_timestamp.is_some(),
            Self::Cluster(c) => c.metadata.deletion_timestamp.is_some(),
        }
    }
}

/// Whether the controller may read cluster-scoped objects (ClusterConnections). Restricted to
/// namespaces (`--watch-namespaces`), it has no cluster-wide RBAC, so it does not try.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ClusterAccess {
    /// Every namespace is watched: cluster-wide permissions.
    #[default]
    Granted,
    /// Only some namespaces are watched: namespaced permissions only.
    Restricted,
}

/// The object `reference` names, for messages: `TemporalConnection demo/dev`,
/// `ClusterConnection shared`.
pub fn connection_object(namespace: &str, reference: &ConnectionReference) -> ObjectName {
    match reference.kind {
        kind @ (ConnectionKind::TemporalConnection | ConnectionKind::Connection) => {
            ObjectName::new(kind.as_str(), namespace, &reference.name)
        }
        ConnectionKind::ClusterConnection => {
            ObjectName::cluster_scoped("ClusterConnection", &reference.name)
        }
    }
}

/// A connection as read, with the config its Temporal is reached with.
#[derive(Debug)]
pub struct ResolvedConnection {
    /// The TemporalConnection, Connection or ClusterConnection object.
    pub connection: Connection,
    /// What the client pool connects with (its credentials read and checked).
    pub config: ConnectionConfig,
}

/// Reads the connection `reference` names (a TemporalConnection in `namespace` or a
/// ClusterConnection) and the Secrets it names (always in `namespace`), checks the credentials,
/// and returns both the object and the config to connect with.
pub async fn resolve_connection(
    client: &Client,
    access: ClusterAccess,
    namespace: &str,
    reference: &ConnectionReference,
    temporal_namespace: &str,
) -> Result<ResolvedConnection, ResolveError> {
    let connection = get_connection(client, access, namespace, reference).await?;
    // Names the connection in messages.
    let connection_name = &connection_object(namespace, reference).to_string();
    let spec = connection.spec();
    let (auth, secret) = read_auth(
        client,
        namespace,
        connection_name,
        spec.auth_mode(),
        ("mutualTLSSecretRef", "apiKeySecretRef"),
    )
    .await?;
    // Workers' own credentials are checked like the controller's: a missing or expired one is
    // the user's to fix, and would otherwise only show as pods that cannot connect.
    let worker_auth = if spec.worker_credentials.is_some() {
        read_auth(
            client,
            namespace,
            connection_name,
            spec.worker_auth_mode(),
            (
                "workerCredentials.mutualTLSSecretRef",
                "workerCredentials.apiKeySecretRef",
            ),
        )
        .await?
        .0
    } else {
        auth.clone()
    };
    let ca_secret = match spec.ca_secret_ref() {
        Some(selector) => {
            let secret = get_secret(
                client,
                namespace,
                &selector.name,
                connection_name,
                "tls.caSecretRef",
            )
            .await?;
            let pem = credentials::ca_bundle(&secret, &selector.key).map_err(auth_invalid)?;
            Some((secret, pem))
        }
        None => None,
    };
    let config = ConnectionConfig {
        host_port: spec.host_port.clone(),
        server_name: spec.server_name().map(str::to_owned),
        temporal_namespace: temporal_namespace.to_owned(),
        cache_key: credentials::cache_key(
            spec,
            temporal_namespace,
            secret.as_ref(),
            ca_secret.as_ref().map(|(s, _)| s),
        ),
        auth,
        server_ca_pem: ca_secret.map(|(_, pem)| pem),
        worker_ca_in_secret: matches!(
            worker_auth,
            ConnectionAuth::MutualTls {
                ca_pem: Some(_),
                ..
            }
        ),
    };
    tracing::debug!(namespace, connection = connection_name, auth = ?config.auth, "resolved connection");
    Ok(ResolvedConnection { connection, config })
}

/// Reads and checks the credential Secret of one auth mode; `fields` names the spec fields of the
/// mutual-TLS and API-key references for messages.
async fn read_auth(
    client: &Client,
    namespace: &str,
    connection_name: &str,
    mode: AuthMode,
    fields: (&str, &str),
) -> Result<(ConnectionAuth, Option<Secret>), ResolveError> {
    match mode {
        AuthMode::None => Ok((ConnectionAuth::None, None)),
        AuthMode::MutualTls { secret_name } => {
            let secret =
                get_secret(client, namespace, &secret_name, connection_name, fields.0).await?;
            let auth =
                credentials::mutual_tls_auth(&secret, Timestamp::now()).map_err(auth_invalid)?;
            Ok((auth, Some(secret)))
        }
        AuthMode::ApiKey { secret_name, key } => {
            let secret =
                get_secret(client, namespace, &secret_name, connection_name, fields.1).await?;
            let auth = credentials::api_key_auth(&secret, &key).map_err(auth_invalid)?;
            Ok((auth, Some(secret)))
        }
    }
}

async fn get_connection(
    client: &Client,
    access: ClusterAccess,
    namespace: &str,
    reference: &ConnectionReference,
) -> Result<Connection, ResolveError> {
    if let Some(blocked) = unsupported(access, namespace, reference) {
        return Err(ResolveError::Blocked(blocked));
    }
    let object = connection_object(namespace, reference);
    connection_read(
        &object,
        find_connection(client, access, namespace, reference).await,
    )
}

/// `ClusterConnectionUnsupported` when `reference` names a ClusterConnection and the controller
/// has no cluster-wide access.
fn unsupported(
    access: ClusterAccess,
    namespace: &str,
    reference: &ConnectionReference,
) -> Option<Blocked> {
    (access == ClusterAccess::Restricted && reference.kind == ConnectionKind::ClusterConnection)
        .then(|| Blocked {
            reason: BlockReason::ClusterConnectionUnsupported,
            message: cluster_connection_unsupported(namespace, &reference.name),
        })
}

/// Why a TWD in `namespace` cannot use the ClusterConnection `name` when the controller is
/// restricted to namespaces, and what to do (the condition's and the Warning event's message).
pub fn cluster_connection_unsupported(namespace: &str, name: &str) -> String {
    format!(
        "spec.workerOptions.connectionRef names ClusterConnection {name}, but this controller \
         watches only some namespaces (--watch-namespaces, Helm rbac.watchNamespaces) and may \
         not read cluster-scoped objects; reference a TemporalConnection in namespace \
         {namespace} instead, or run the controller for every namespace"
    )
}

/// What a read of the connection means: only a connection that does not exist is
/// `TemporalConnectionNotFound`.
fn connection_read(
    object: &ObjectName,
    read: Result<Option<Connection>, K8sError>,
) -> Result<Connection, ResolveError> {
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

/// The connection `reference` names, or `None` when it does not exist or is a ClusterConnection
/// the controller may not read (for the deletion path, which needs to know whether it is being
/// deleted and where it pointed).
pub async fn find_connection(
    client: &Client,
    access: ClusterAccess,
    namespace: &str,
    reference: &ConnectionReference,
) -> Result<Option<Connection>, K8sError> {
    let object = connection_object(namespace, reference);
    let read = match reference.kind {
        ConnectionKind::TemporalConnection => {
            let api: Api<TemporalConnection> = Api::namespaced(client.clone(), namespace);
            get_if_exists(&api, &reference.name)
                .await
                .map(|c| c.map(Connection::Namespaced))
        }
        ConnectionKind::Connection => {
            let api: Api<twc_crds::Connection> = Api::namespaced(client.clone(), namespace);
            get_if_exists(&api, &reference.name)
                .await
                .map(|c| c.map(|c| Connection::Namespaced(c.into())))
        }
        ConnectionKind::ClusterConnection if access == ClusterAccess::Restricted => Ok(None),
        ConnectionKind::ClusterConnection => {
            let api: Api<ClusterConnection> = Api::all(client.clone());
            get_if_exists(&api, &reference.name)
                .await
                .map(|c| c.map(Connection::Cluster))
        }
    };
    read.map_err(K8sError::api("get", &object))
}

async fn get_secret(
    client: &Client,
    namespace: &str,
    name: &str,
    connection: &str,
    field: &str,
) -> Result<Secret, ResolveError> {
    if name.is_empty() {
        return Err(auth_invalid(format!("{connection}: {field}.name is not set")).into());
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
            "{object} named by {connection} ({field}) not found"
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
            let resolved = resolve_connection(
                &client,
                ClusterAccess::Granted,
                "demo",
                &ConnectionReference::namespaced("cloud"),
                "default",
            )
            .await;
            assert_eq!(shown(resolved), expected, "{what}");
        }
        let client = served(connection_object(), secret_object());
        let reference = ConnectionReference::namespaced("cloud");
        let ResolvedConnection { config, .. } = resolve_connection(
            &client,
            ClusterAccess::Granted,
            "demo",
            &reference,
            "default",
        )
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
        let Err(ResolveError::Blocked(blocked)) = secret_read(
            &secret,
            "TemporalConnection dev",
            "apiKeySecretRef",
            Ok(None),
        ) else {
            panic!("a missing Secret blocks");
        };
        assert_eq!(
            blocked.message,
            "Secret demo/cloud named by TemporalConnection dev (apiKeySecretRef) not found"
        );
    }

    /// A TemporalConnection `cloud` in `demo` and a ClusterConnection `cloud`, both naming the
    /// API-key Secret `cloud-key`, which only `demo` has.
    fn served_by_kind() -> kube::Client {
        let cluster = fake_api::ok(serde_json::json!({
            "apiVersion": "temporal.io/v1alpha1", "kind": "ClusterConnection",
            "metadata": { "name": "cloud" },
            "spec": { "hostPort": "cluster:7233",
                      "apiKeySecretRef": { "name": "cloud-key", "key": "key" } }
        }));
        fake_api::client(vec![
            (
                "/apis/temporal.io/v1alpha1/namespaces/demo/temporalconnections/cloud".into(),
                connection_object(),
            ),
            (
                "/apis/temporal.io/v1alpha1/clusterconnections/cloud".into(),
                cluster,
            ),
            (
                "/apis/temporal.io/v1alpha1/clusterconnections/gone".into(),
                fake_api::not_found("clusterconnections", "gone"),
            ),
            (
                "/api/v1/namespaces/demo/secrets/cloud-key".into(),
                secret_object(),
            ),
            (
                "/api/v1/namespaces/team-b/secrets/cloud-key".into(),
                fake_api::not_found("secrets", "cloud-key"),
            ),
        ])
    }

    #[tokio::test]
    async fn the_reference_kind_decides_which_connection_and_secrets_in_the_twd_namespace() {
        use BlockReason::{
            AuthSecretInvalid, ClusterConnectionUnsupported, TemporalConnectionNotFound,
        };
        use ClusterAccess::{Granted, Restricted};
        use ConnectionKind::{ClusterConnection, TemporalConnection};
        // (what, access, TWD namespace, kind, name, the host reached or the condition and a
        // part of its message)
        let cases = [
            (
                "namespaced",
                Granted,
                "demo",
                TemporalConnection,
                "cloud",
                Ok("temporal:7233"),
            ),
            (
                "namespaced, restricted",
                Restricted,
                "demo",
                TemporalConnection,
                "cloud",
                Ok("temporal:7233"),
            ),
            (
                "cluster-scoped",
                Granted,
                "demo",
                ClusterConnection,
                "cloud",
                Ok("cluster:7233"),
            ),
            (
                "cluster-scoped, the namespace lacks the Secret",
                Granted,
                "team-b",
                ClusterConnection,
                "cloud",
                Err((
                    AuthSecretInvalid,
                    "Secret team-b/cloud-key named by ClusterConnection cloud (apiKeySecretRef) not found",
                )),
            ),
            (
                "cluster-scoped, missing",
                Granted,
                "demo",
                ClusterConnection,
                "gone",
                Err((
                    TemporalConnectionNotFound,
                    "ClusterConnection gone not found; create it",
                )),
            ),
            (
                "cluster-scoped, restricted to namespaces",
                Restricted,
                "demo",
                ClusterConnection,
                "cloud",
                Err((
                    ClusterConnectionUnsupported,
                    "watches only some namespaces (--watch-namespaces",
                )),
            ),
            (
                "cluster-scoped, restricted, says what to do",
                Restricted,
                "demo",
                ClusterConnection,
                "cloud",
                Err((
                    ClusterConnectionUnsupported,
                    "reference a TemporalConnection in namespace demo instead",
                )),
            ),
        ];
        let client = served_by_kind();
        for (what, access, namespace, kind, name, expected) in cases {
            let reference = ConnectionReference {
                name: name.to_owned(),
                kind,
            };
            let resolved =
                resolve_connection(&client, access, namespace, &reference, "default").await;
            match (resolved, expected) {
                (Ok(ResolvedConnection { connection, config }), Ok(host)) => {
                    assert_eq!(config.host_port, host, "{what}");
                    assert_eq!(connection.spec().host_port, host, "{what}");
                }
                (Err(ResolveError::Blocked(blocked)), Err((reason, message))) => {
                    assert_eq!(blocked.reason, reason, "{what}");
                    assert!(
                        blocked.message.contains(message),
                        "{what}: {}",
                        blocked.message
                    );
                }
                (Err(e), _) => panic!("{what}: {e}"),
                (Ok(_), Err(_)) => panic!("{what}: resolved"),
            }
        }
    }

    #[tokio::test]
    async fn a_restricted_controller_does_not_read_cluster_connections_at_all() {
        // Nothing is served: any read would be an error to retry, not a condition.
        let client = fake_api::client(Vec::new());
        let reference = ConnectionReference {
            name: "cloud".into(),
            kind: ConnectionKind::ClusterConnection,
        };
        let resolved = resolve_connection(
            &client,
            ClusterAccess::Restricted,
            "demo",
            &reference,
            "default",
        )
        .await;
        assert_eq!(
            shown(resolved),
            Some(BlockReason::ClusterConnectionUnsupported)
        );
        let found = find_connection(&client, ClusterAccess::Restricted, "demo", &reference).await;
        assert!(matches!(found, Ok(None)), "{found:?}");
    }
}
