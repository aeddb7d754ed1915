//! What the controller adds to worker pods so they reach Temporal as the right version: env vars
//! in every container (a user's own variable of the same name is replaced in place, never
//! duplicated) and the credential Secrets as files: the client certificate at
//! `/etc/temporal/tls`, the API key at `/etc/temporal/api-key/api-key` (besides
//! `TEMPORAL_API_KEY`, so a rotated key reaches running pods), a CA bundle at
//! `/etc/temporal/ca/ca.crt`. Workers get `spec.workerCredentials` when it is set.
//!
//! Variable names follow the Go controller and the Temporal SDKs' `envconfig` loader, plus the
//! older `TEMPORAL_HOST_PORT` / `WORKER_BUILD_ID` names and `TEMPORAL_TLS_CA_CERT_PATH`.

use k8s_openapi::api::core::v1::{
    Container, EnvVar, EnvVarSource, KeyToPath, PodSpec, SecretKeySelector, SecretVolumeSource,
    Volume, VolumeMount,
};
use sha2::{Digest, Sha256};
use twc_crds::connection::{AuthMode, TemporalConnectionSpec};

use crate::connection::ConnectionConfig;

/// Name of the pod volume holding the mutual-TLS Secret.
pub const TLS_VOLUME: &str = "temporal-tls";
/// Where the mutual-TLS Secret is mounted in every container.
pub const TLS_MOUNT_PATH: &str = "/etc/temporal/tls";
/// Name of the pod volume holding the API key (`spec.apiKeySecretRef`'s key, as one file).
pub const API_KEY_VOLUME: &str = "temporal-api-key";
/// Where the API key volume is mounted; the key is the file `api-key` in it.
pub const API_KEY_MOUNT_PATH: &str = "/etc/temporal/api-key";
/// Name of the pod volume holding the server CA bundle of `spec.tls.caSecretRef`.
pub const CA_VOLUME: &str = "temporal-ca";
/// Where the CA volume is mounted; the bundle is the file `ca.crt` in it.
pub const CA_MOUNT_PATH: &str = "/etc/temporal/ca";

/// Env vars derived from the connection: set, replaced or removed when the connection changes.
pub const CONNECTION_ENV: &[&str] = &[
    "TEMPORAL_ADDRESS",
    "TEMPORAL_HOST_PORT",
    "TEMPORAL_TLS_SERVER_NAME",
    "TEMPORAL_TLS",
    "TEMPORAL_TLS_CLIENT_CERT_PATH",
    "TEMPORAL_TLS_CLIENT_KEY_PATH",
    "TEMPORAL_TLS_CA_CERT_PATH",
    "TEMPORAL_TLS_SERVER_CA_CERT_PATH",
    "TEMPORAL_API_KEY",
    "TEMPORAL_API_KEY_PATH",
];

/// Whether a mutual-TLS Secret carries the server's CA (`ca.crt`), so pods are pointed at it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerCa {
    /// The Secret has `ca.crt`: `TEMPORAL_TLS_CA_CERT_PATH` points at it.
    InSecret,
    /// No `ca.crt` (or no mutual TLS): workers trust their system roots.
    SystemRoots,
}

impl ServerCa {
    /// Reads it off a resolved connection (the workers' mutual-TLS Secret).
    pub fn of(config: &ConnectionConfig) -> Self {
        if config.worker_ca_in_secret {
            Self::InSecret
        } else {
            Self::SystemRoots
        }
    }
}

/// Who the workers are in Temporal: from the TWD and the build, not the connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerIdentity {
    /// Temporal namespace the workers poll.
    pub temporal_namespace: String,
    /// Temporal worker deployment name, `<k8s-namespace>/<twd-name>`.
    pub deployment_name: String,
    /// Build ID of the version.
    pub build_id: String,
}

/// The Go controller's connection hash (its `temporal.io/connection-spec-hash`): hex SHA-256 of
/// the address, the TLS server name and the mutual-TLS (else API-key) Secret name, concatenated;
/// empty without an address.
pub fn go_connection_spec_hash(connection: &TemporalConnectionSpec) -> String {
    if connection.host_port.is_empty() {
        return String::new();
    }
    let secret = connection
        .mutual_tls_secret_ref
        .as_ref()
        .map(|r| r.name.as_str())
        .or(connection
            .api_key_secret_ref
            .as_ref()
            .map(|r| r.name.as_str()))
        .unwrap_or_default();
    let text = format!(
        "{}{}{secret}",
        connection.host_port,
        connection.server_name().unwrap_or_default()
    );
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// Hex SHA-256 of everything the connection injects into pods (address, TLS name, auth mode,
/// Secret name and key, CA presence); pods are rebuilt when it changes. No secret material.
pub fn connection_spec_hash(connection: &TemporalConnectionSpec, ca: ServerCa) -> String {
    // API-key pods also get the key as a file (re-read on rotation), hence a mode of its own.
    let (mode, secret, key) = match connection.worker_auth_mode() {
        AuthMode::None => ("none", String::new(), String::new()),
        AuthMode::MutualTls { secret_name } => ("mtls", secret_name, String::new()),
        AuthMode::ApiKey { secret_name, key } => ("apikey+file", secret_name, key),
    };
    let ca = match ca {
        ServerCa::InSecret => "ca",
        ServerCa::SystemRoots => "",
    };
    let mut fields = vec![
        connection.host_port.as_str(),
        connection.server_name().unwrap_or(""),
        mode,
        &secret,
        &key,
        ca,
    ];
    // Only present when set, so the hash of a connection without it is what it always was.
    if let Some(selector) = connection.ca_secret_ref() {
        fields.extend(["ca-secret", selector.name.as_str(), selector.key.as_str()]);
    }
    let mut hasher = Sha256::new();
    for field in fields {
        hasher.update(field.as_bytes());
        hasher.update([0]);
    }
    hex::encode(hasher.finalize())
}

/// Adds the identity and connection env vars to every container (not init containers) and the
/// mutual-TLS volume and mounts when the connection uses a client certificate.
pub fn inject(
    pod: &mut PodSpec,
    identity: &WorkerIdentity,
    connection: &TemporalConnectionSpec,
    ca: ServerCa,
) {
    let mut env = connection_env(connection, ca);
    env.extend(identity_env(identity));
    for container in &mut pod.containers {
        for var in &env {
            set_env(container, var.clone());
        }
    }
    apply_volumes(pod, connection, false);
}

/// Brings the connection part of a built pod spec up to date with `connection`: connection env
/// vars are set in place, those the connection no longer calls for are removed, and the
/// mutual-TLS volume is added, repointed or removed. Identity env vars are left alone.
pub fn reinject_connection(pod: &mut PodSpec, connection: &TemporalConnectionSpec, ca: ServerCa) {
    let env = connection_env(connection, ca);
    for container in &mut pod.containers {
        if let Some(vars) = container.env.as_mut() {
            vars.retain(|v| {
                !CONNECTION_ENV.contains(&v.name.as_str()) || env.iter().any(|e| e.name == v.name)
            });
        }
        for var in &env {
            set_env(container, var.clone());
        }
    }
    apply_volumes(pod, connection, true);
}

fn identity_env(identity: &WorkerIdentity) -> Vec<EnvVar> {
    vec![
        value("TEMPORAL_NAMESPACE", &identity.temporal_namespace),
        value("TEMPORAL_DEPLOYMENT_NAME", &identity.deployment_name),
        value("TEMPORAL_WORKER_BUILD_ID", &identity.build_id),
        value("WORKER_BUILD_ID", &identity.build_id),
    ]
}

fn connection_env(connection: &TemporalConnectionSpec, ca: ServerCa) -> Vec<EnvVar> {
    let mut env = vec![
        value("TEMPORAL_ADDRESS", &connection.host_port),
        value("TEMPORAL_HOST_PORT", &connection.host_port),
    ];
    let server_name = connection.server_name();
    if let Some(name) = server_name {
        env.push(value("TEMPORAL_TLS_SERVER_NAME", name));
    }
    let explicit_ca = connection.ca_secret_ref().is_some();
    match connection.worker_auth_mode() {
        AuthMode::MutualTls { .. } => {
            env.push(value("TEMPORAL_TLS", "true"));
            env.push(value(
                "TEMPORAL_TLS_CLIENT_CERT_PATH",
                &format!("{TLS_MOUNT_PATH}/tls.crt"),
            ));
            env.push(value(
                "TEMPORAL_TLS_CLIENT_KEY_PATH",
                &format!("{TLS_MOUNT_PATH}/tls.key"),
            ));
        }
        AuthMode::ApiKey { secret_name, key } => {
            env.push(value("TEMPORAL_TLS", "true"));
            env.push(EnvVar {
                name: "TEMPORAL_API_KEY".into(),
                value: None,
                value_from: Some(EnvVarSource {
                    secret_key_ref: Some(SecretKeySelector {
                        name: secret_name,
                        key,
                        optional: None,
                    }),
                    ..Default::default()
                }),
            });
            // The same key as a file, which follows the Secret: a worker that re-reads it picks
            // up a rotated key without a restart.
            env.push(value(
                "TEMPORAL_API_KEY_PATH",
                &format!("{API_KEY_MOUNT_PATH}/api-key"),
            ));
        }
        // A server name or a CA bundle alone turns TLS on, as it does for the controller's own
        // client.
        AuthMode::None if server_name.is_some() || explicit_ca => {
            env.push(value("TEMPORAL_TLS", "true"));
        }
        AuthMode::None => {}
    }
    let ca_path = if explicit_ca {
        Some(format!("{CA_MOUNT_PATH}/ca.crt"))
    } else if ca == ServerCa::InSecret
        && matches!(connection.worker_auth_mode(), AuthMode::MutualTls { .. })
    {
        Some(format!("{TLS_MOUNT_PATH}/ca.crt"))
    } else {
        None
    };
    if let Some(ca_path) = ca_path {
        env.push(value("TEMPORAL_TLS_CA_CERT_PATH", &ca_path));
        env.push(value("TEMPORAL_TLS_SERVER_CA_CERT_PATH", &ca_path));
    }
    env
}

fn value(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: Some(value.to_owned()),
        value_from: None,
    }
}

/// Sets `var` at the position of the first variable of the same name (dropping any later
/// duplicates), or appends it.
fn set_env(container: &mut Container, var: EnvVar) {
    let vars = container.env.get_or_insert_default();
    match vars.iter().position(|v| v.name == var.name) {
        Some(first) => {
            let mut index = 0;
            vars.retain(|v| {
                let keep = index <= first || v.name != var.name;
                index += 1;
                keep
            });
            vars[first] = var;
        }
        None => vars.push(var),
    }
}

/// Adds (or repoints) the connection's volumes and their mounts: `temporal-tls` for mutual TLS,
/// `temporal-api-key` for an API key, `temporal-ca` for a CA bundle Secret, replacing any volume
/// or mount in their way; those the connection does not call for are removed only when
/// `remove_unused`.
fn apply_volumes(pod: &mut PodSpec, connection: &TemporalConnectionSpec, remove_unused: bool) {
    let (tls, api_key) = match connection.worker_auth_mode() {
        AuthMode::MutualTls { secret_name } => (Some(secret_source(secret_name, None)), None),
        AuthMode::ApiKey { secret_name, key } => (
            None,
            Some(secret_source(secret_name, Some((key, "api-key")))),
        ),
        AuthMode::None => (None, None),
    };
    let ca = connection
        .ca_secret_ref()
        .map(|s| secret_source(s.name.clone(), Some((s.key.clone(), "ca.crt"))));
    for (name, path, source) in [
        (TLS_VOLUME, TLS_MOUNT_PATH, tls),
        (API_KEY_VOLUME, API_KEY_MOUNT_PATH, api_key),
        (CA_VOLUME, CA_MOUNT_PATH, ca),
    ] {
        if source.is_some() || remove_unused {
            apply_volume(pod, name, path, source);
        }
    }
}

/// A Secret volume source, of one key at one path when `item` is given.
fn secret_source(secret_name: String, item: Option<(String, &str)>) -> SecretVolumeSource {
    SecretVolumeSource {
        secret_name: Some(secret_name),
        items: item.map(|(key, path)| {
            vec![KeyToPath {
                key,
                path: path.to_owned(),
                mode: None,
            }]
        }),
        ..Default::default()
    }
}

/// Removes volume `name` and every mount of it or at `path`, then adds it back from `source`
/// mounted read-only at `path` in every container.
fn apply_volume(pod: &mut PodSpec, name: &str, path: &str, source: Option<SecretVolumeSource>) {
    if let Some(volumes) = pod.volumes.as_mut() {
        volumes.retain(|v| v.name != name);
    }
    for container in &mut pod.containers {
        if let Some(mounts) = container.volume_mounts.as_mut() {
            mounts.retain(|m| m.name != name && m.mount_path != path);
        }
    }
    if pod.volumes.as_ref().is_some_and(Vec::is_empty) {
        pod.volumes = None;
    }
    let Some(source) = source else {
        return;
    };
    pod.volumes.get_or_insert_default().push(Volume {
        name: name.into(),
        secret: Some(source),
        ..Default::default()
    });
    for container in &mut pod.containers {
        container
            .volume_mounts
            .get_or_insert_default()
            .push(VolumeMount {
                name: name.into(),
                mount_path: path.into(),
                read_only: Some(true),
                ..Default::default()
            });
    }
}

#[cfg(test)]
mod tests {
    use twc_crds::connection::{SecretReference, TlsSpec};

    use super::*;

    fn plain(host_port: &str) -> TemporalConnectionSpec {
        TemporalConnectionSpec {
            host_port: host_port.into(),
            tls: None,
            mutual_tls_secret_ref: None,
            api_key_secret_ref: None,
            worker_credentials: None,
        }
    }

    fn mtls(secret: &str) -> TemporalConnectionSpec {
        TemporalConnectionSpec {
            mutual_tls_secret_ref: Some(SecretReference {
                name: secret.into(),
            }),
            ..plain("ns.tmprl.cloud:7233")
        }
    }

    fn api_key(secret: &str, key: &str) -> TemporalConnectionSpec {
        TemporalConnectionSpec {
            api_key_secret_ref: Some(SecretKeySelector {
                name: secret.into(),
                key: key.into(),
                optional: None,
            }),
            ..plain("ns.tmprl.cloud:7233")
        }
    }

    fn identity() -> WorkerIdentity {
        WorkerIdentity {
            temporal_namespace: "default".into(),
            deployment_name: "demo/worker".into(),
            build_id: "v1-abc".into(),
        }
    }

    fn pod(containers: &[&str]) -> PodSpec {
        PodSpec {
            containers: containers
                .iter()
                .map(|n| Container {
                    name: (*n).into(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn env_value<'a>(container: &'a Container, name: &str) -> Option<&'a str> {
        let vars: Vec<&EnvVar> = container
            .env
            .iter()
            .flatten()
            .filter(|v| v.name == name)
            .collect();
        assert!(vars.len() <= 1, "{name} appears {} times", vars.len());
        vars.first().and_then(|v| v.value.as_deref())
    }

    #[test]
    fn every_container_gets_address_namespace_deployment_and_build_id() {
        let mut spec = pod(&["worker", "sidecar"]);
        inject(
            &mut spec,
            &identity(),
            &plain("temporal:7233"),
            ServerCa::SystemRoots,
        );
        for c in &spec.containers {
            assert_eq!(env_value(c, "TEMPORAL_ADDRESS"), Some("temporal:7233"));
            assert_eq!(env_value(c, "TEMPORAL_HOST_PORT"), Some("temporal:7233"));
            assert_eq!(env_value(c, "TEMPORAL_NAMESPACE"), Some("default"));
            assert_eq!(
                env_value(c, "TEMPORAL_DEPLOYMENT_NAME"),
                Some("demo/worker")
            );
            assert_eq!(env_value(c, "TEMPORAL_WORKER_BUILD_ID"), Some("v1-abc"));
            assert_eq!(env_value(c, "WORKER_BUILD_ID"), Some("v1-abc"));
            assert_eq!(env_value(c, "TEMPORAL_TLS"), None);
            assert_eq!(env_value(c, "TEMPORAL_TLS_SERVER_NAME"), None);
        }
        assert!(spec.volumes.is_none());
    }

    #[test]
    fn init_containers_are_left_alone() {
        let mut spec = pod(&["worker"]);
        spec.init_containers = Some(vec![Container {
            name: "init".into(),
            ..Default::default()
        }]);
        inject(
            &mut spec,
            &identity(),
            &mtls("client-cert"),
            ServerCa::SystemRoots,
        );
        let init = &spec.init_containers.as_ref().expect("kept")[0];
        assert!(init.env.is_none() && init.volume_mounts.is_none());
    }

    #[test]
    fn a_users_own_value_is_replaced_in_place_not_duplicated() {
        let mut spec = pod(&["worker"]);
        spec.containers[0].env = Some(vec![
            value("FIRST", "1"),
            value("TEMPORAL_ADDRESS", "mine:1"),
            value("MIDDLE", "2"),
            value("TEMPORAL_ADDRESS", "again:2"),
            EnvVar {
                name: "TEMPORAL_NAMESPACE".into(),
                value: None,
                value_from: Some(EnvVarSource::default()),
            },
        ]);
        inject(
            &mut spec,
            &identity(),
            &plain("temporal:7233"),
            ServerCa::SystemRoots,
        );
        let c = &spec.containers[0];
        let names: Vec<&str> = c.env.iter().flatten().map(|v| v.name.as_str()).collect();
        assert_eq!(
            &names[..4],
            ["FIRST", "TEMPORAL_ADDRESS", "MIDDLE", "TEMPORAL_NAMESPACE"]
        );
        assert_eq!(env_value(c, "TEMPORAL_ADDRESS"), Some("temporal:7233"));
        let namespace = c
            .env
            .iter()
            .flatten()
            .find(|v| v.name == "TEMPORAL_NAMESPACE")
            .expect("set");
        assert_eq!(
            (namespace.value.as_deref(), namespace.value_from.is_none()),
            (Some("default"), true)
        );
    }

    #[test]
    fn server_name_is_injected_and_turns_tls_on() {
        let mut connection = plain("temporal:7233");
        connection.tls = Some(TlsSpec {
            server_name: Some("temporal.example".into()),
            ca_secret_ref: None,
        });
        let mut spec = pod(&["worker"]);
        inject(&mut spec, &identity(), &connection, ServerCa::SystemRoots);
        assert_eq!(
            env_value(&spec.containers[0], "TEMPORAL_TLS_SERVER_NAME"),
            Some("temporal.example")
        );
        assert_eq!(env_value(&spec.containers[0], "TEMPORAL_TLS"), Some("true"));
    }

    #[test]
    fn mutual_tls_mounts_the_secret_in_every_container() {
        let mut spec = pod(&["worker", "sidecar"]);
        inject(
            &mut spec,
            &identity(),
            &mtls("client-cert"),
            ServerCa::InSecret,
        );
        let volumes = spec.volumes.as_ref().expect("volume added");
        assert_eq!(volumes.len(), 1);
        assert_eq!(volumes[0].name, TLS_VOLUME);
        let secret = volumes[0]
            .secret
            .as_ref()
            .and_then(|s| s.secret_name.as_deref());
        assert_eq!(secret, Some("client-cert"));
        for c in &spec.containers {
            assert_eq!(env_value(c, "TEMPORAL_TLS"), Some("true"));
            assert_eq!(
                env_value(c, "TEMPORAL_TLS_CLIENT_CERT_PATH"),
                Some("/etc/temporal/tls/tls.crt")
            );
            assert_eq!(
                env_value(c, "TEMPORAL_TLS_CLIENT_KEY_PATH"),
                Some("/etc/temporal/tls/tls.key")
            );
            assert_eq!(
                env_value(c, "TEMPORAL_TLS_CA_CERT_PATH"),
                Some("/etc/temporal/tls/ca.crt")
            );
            assert_eq!(
                env_value(c, "TEMPORAL_TLS_SERVER_CA_CERT_PATH"),
                Some("/etc/temporal/tls/ca.crt")
            );
            let mounts = c.volume_mounts.as_ref().expect("mounted");
            assert_eq!(
                (mounts.len(), mounts[0].mount_path.as_str()),
                (1, TLS_MOUNT_PATH)
            );
            assert_eq!(mounts[0].read_only, Some(true));
        }
    }

    #[test]
    fn mutual_tls_without_a_ca_does_not_point_at_a_missing_file() {
        let mut spec = pod(&["worker"]);
        inject(
            &mut spec,
            &identity(),
            &mtls("client-cert"),
            ServerCa::SystemRoots,
        );
        assert_eq!(
            env_value(&spec.containers[0], "TEMPORAL_TLS_CA_CERT_PATH"),
            None
        );
        assert_eq!(
            env_value(&spec.containers[0], "TEMPORAL_TLS_SERVER_CA_CERT_PATH"),
            None
        );
    }

    #[test]
    fn a_users_own_tls_volume_is_replaced() {
        let mut spec = pod(&["worker"]);
        spec.volumes = Some(vec![Volume {
            name: TLS_VOLUME.into(),
            ..Default::default()
        }]);
        spec.containers[0].volume_mounts = Some(vec![VolumeMount {
            name: "other".into(),
            mount_path: TLS_MOUNT_PATH.into(),
            ..Default::default()
        }]);
        inject(
            &mut spec,
            &identity(),
            &mtls("client-cert"),
            ServerCa::SystemRoots,
        );
        assert_eq!(spec.volumes.as_ref().map(Vec::len), Some(1));
        assert_eq!(
            spec.containers[0].volume_mounts.as_ref().map(Vec::len),
            Some(1)
        );
    }

    #[test]
    fn a_users_own_volume_at_the_tls_path_is_kept_without_mutual_tls() {
        let mut spec = pod(&["worker"]);
        spec.volumes = Some(vec![Volume {
            name: TLS_VOLUME.into(),
            ..Default::default()
        }]);
        inject(
            &mut spec,
            &identity(),
            &plain("temporal:7233"),
            ServerCa::SystemRoots,
        );
        assert_eq!(spec.volumes.as_ref().map(Vec::len), Some(1));
    }

    #[test]
    fn api_key_comes_from_the_secret_key_and_turns_tls_on() {
        let mut spec = pod(&["worker"]);
        inject(
            &mut spec,
            &identity(),
            &api_key("cloud", "api-key"),
            ServerCa::SystemRoots,
        );
        let c = &spec.containers[0];
        assert_eq!(env_value(c, "TEMPORAL_TLS"), Some("true"));
        let key = c
            .env
            .iter()
            .flatten()
            .find(|v| v.name == "TEMPORAL_API_KEY")
            .expect("api key");
        assert_eq!(key.value, None);
        let selector = key
            .value_from
            .as_ref()
            .and_then(|s| s.secret_key_ref.as_ref())
            .expect("secret ref");
        assert_eq!(
            (selector.name.as_str(), selector.key.as_str()),
            ("cloud", "api-key")
        );
        // The same key as a file that follows the Secret.
        assert_eq!(
            env_value(c, "TEMPORAL_API_KEY_PATH"),
            Some("/etc/temporal/api-key/api-key")
        );
        let volumes = spec.volumes.as_ref().expect("api key volume");
        assert_eq!(volumes.len(), 1);
        assert_eq!(volumes[0].name, API_KEY_VOLUME);
        let source = volumes[0].secret.as_ref().expect("secret volume");
        assert_eq!(source.secret_name.as_deref(), Some("cloud"));
        let items = source.items.as_ref().expect("one key");
        assert_eq!(
            (items[0].key.as_str(), items[0].path.as_str()),
            ("api-key", "api-key")
        );
        let mounts = c.volume_mounts.as_ref().expect("mounted");
        assert_eq!(mounts[0].mount_path, API_KEY_MOUNT_PATH);
    }

    #[test]
    fn workers_get_their_own_credentials_when_set() {
        let mut connection = mtls("controller-cert");
        connection.worker_credentials = Some(twc_crds::connection::WorkerCredentials {
            mutual_tls_secret_ref: None,
            api_key_secret_ref: Some(SecretKeySelector {
                name: "worker-key".into(),
                key: "key".into(),
                optional: None,
            }),
        });
        let mut spec = pod(&["worker"]);
        inject(&mut spec, &identity(), &connection, ServerCa::SystemRoots);
        let c = &spec.containers[0];
        let key = c
            .env
            .iter()
            .flatten()
            .find(|v| v.name == "TEMPORAL_API_KEY")
            .and_then(|v| v.value_from.as_ref())
            .and_then(|f| f.secret_key_ref.as_ref())
            .expect("the workers' key");
        assert_eq!(key.name, "worker-key");
        assert_eq!(env_value(c, "TEMPORAL_TLS_CLIENT_CERT_PATH"), None);
        let names: Vec<&str> = spec
            .volumes
            .iter()
            .flatten()
            .map(|v| v.name.as_str())
            .collect();
        assert_eq!(
            names,
            [API_KEY_VOLUME],
            "the controller's certificate is not mounted"
        );
        assert_ne!(
            connection_spec_hash(&connection, ServerCa::SystemRoots),
            connection_spec_hash(&mtls("controller-cert"), ServerCa::SystemRoots)
        );
    }

    #[test]
    fn a_ca_bundle_secret_is_mounted_and_wins_over_the_tls_secrets_ca() {
        let mut connection = mtls("client-cert");
        connection.tls = Some(TlsSpec {
            server_name: None,
            ca_secret_ref: Some(SecretKeySelector {
                name: "server-ca".into(),
                key: "bundle.pem".into(),
                optional: None,
            }),
        });
        let mut spec = pod(&["worker"]);
        inject(&mut spec, &identity(), &connection, ServerCa::InSecret);
        let c = &spec.containers[0];
        assert_eq!(
            env_value(c, "TEMPORAL_TLS_CA_CERT_PATH"),
            Some("/etc/temporal/ca/ca.crt")
        );
        assert_eq!(
            env_value(c, "TEMPORAL_TLS_SERVER_CA_CERT_PATH"),
            Some("/etc/temporal/ca/ca.crt")
        );
        let ca = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == CA_VOLUME)
            .and_then(|v| v.secret.as_ref())
            .expect("ca volume");
        assert_eq!(ca.secret_name.as_deref(), Some("server-ca"));
        assert_eq!(ca.items.as_ref().expect("one key")[0].key, "bundle.pem");
        // Without mutual TLS, a CA bundle alone turns TLS on.
        let mut plain_ca = plain("temporal:7233");
        plain_ca.tls = connection.tls.clone();
        let mut spec = pod(&["worker"]);
        inject(&mut spec, &identity(), &plain_ca, ServerCa::SystemRoots);
        assert_eq!(env_value(&spec.containers[0], "TEMPORAL_TLS"), Some("true"));
        // Dropping it removes the volume and the variables.
        reinject_connection(&mut spec, &plain("temporal:7233"), ServerCa::SystemRoots);
        assert!(spec.volumes.is_none());
        assert_eq!(
            env_value(&spec.containers[0], "TEMPORAL_TLS_CA_CERT_PATH"),
            None
        );
        assert_ne!(
            connection_spec_hash(&plain_ca, ServerCa::SystemRoots),
            connection_spec_hash(&plain("temporal:7233"), ServerCa::SystemRoots)
        );
    }

    #[test]
    fn switching_from_mutual_tls_to_api_key_rewrites_env_and_volumes() {
        let mut spec = pod(&["worker"]);
        spec.containers[0].env = Some(vec![value("USER_VAR", "x")]);
        inject(
            &mut spec,
            &identity(),
            &mtls("client-cert"),
            ServerCa::InSecret,
        );
        reinject_connection(&mut spec, &api_key("cloud", "key"), ServerCa::SystemRoots);
        let c = &spec.containers[0];
        for gone in [
            "TEMPORAL_TLS_CLIENT_CERT_PATH",
            "TEMPORAL_TLS_CLIENT_KEY_PATH",
            "TEMPORAL_TLS_CA_CERT_PATH",
        ] {
            assert!(
                c.env.iter().flatten().all(|v| v.name != gone),
                "{gone} left behind"
            );
        }
        assert!(c.env.iter().flatten().any(|v| v.name == "TEMPORAL_API_KEY"));
        assert_eq!(env_value(c, "USER_VAR"), Some("x"));
        assert_eq!(env_value(c, "TEMPORAL_WORKER_BUILD_ID"), Some("v1-abc"));
        let volumes: Vec<&str> = spec
            .volumes
            .iter()
            .flatten()
            .map(|v| v.name.as_str())
            .collect();
        assert_eq!(volumes, [API_KEY_VOLUME], "the TLS volume is gone");
        let mounts: Vec<&str> = c
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| m.mount_path.as_str())
            .collect();
        assert_eq!(mounts, [API_KEY_MOUNT_PATH]);
    }

    #[test]
    fn reinjecting_updates_address_and_secret_in_place() {
        let mut spec = pod(&["worker"]);
        inject(
            &mut spec,
            &identity(),
            &mtls("old-cert"),
            ServerCa::SystemRoots,
        );
        let order_before: Vec<String> = spec.containers[0]
            .env
            .iter()
            .flatten()
            .map(|v| v.name.clone())
            .collect();
        let mut moved = mtls("new-cert");
        moved.host_port = "other:7233".into();
        reinject_connection(&mut spec, &moved, ServerCa::SystemRoots);
        let c = &spec.containers[0];
        let order_after: Vec<String> = c.env.iter().flatten().map(|v| v.name.clone()).collect();
        assert_eq!(order_before, order_after);
        assert_eq!(env_value(c, "TEMPORAL_ADDRESS"), Some("other:7233"));
        let secret = spec
            .volumes
            .as_ref()
            .and_then(|v| v[0].secret.as_ref())
            .and_then(|s| s.secret_name.as_deref());
        assert_eq!(secret, Some("new-cert"));
    }

    #[test]
    fn the_go_controllers_connection_hash_covers_address_server_name_and_secret_name() {
        let sha = |text: &str| hex::encode(Sha256::digest(text.as_bytes()));
        let mut named = mtls("client-tls");
        named.tls = Some(twc_crds::connection::TlsSpec {
            server_name: Some("temporal.example".into()),
            ca_secret_ref: None,
        });
        // (connection, what the Go controller hashes)
        let cases = [
            (plain("temporal:7233"), "temporal:7233".to_owned()),
            (
                mtls("client-tls"),
                format!("{}client-tls", mtls("client-tls").host_port),
            ),
            (
                named.clone(),
                format!("{}temporal.exampleclient-tls", named.host_port),
            ),
        ];
        for (connection, text) in cases {
            assert_eq!(go_connection_spec_hash(&connection), sha(&text), "{text}");
        }
        assert_eq!(go_connection_spec_hash(&plain("")), "");
    }

    #[test]
    fn connection_hash_is_stable_and_sees_auth_mode_secret_key_and_ca() {
        let base = connection_spec_hash(&mtls("x"), ServerCa::SystemRoots);
        assert_eq!(
            base,
            connection_spec_hash(&mtls("x"), ServerCa::SystemRoots)
        );
        assert_eq!(base.len(), 64);
        let others = [
            connection_spec_hash(&mtls("x"), ServerCa::InSecret),
            connection_spec_hash(&mtls("y"), ServerCa::SystemRoots),
            connection_spec_hash(&api_key("x", "k"), ServerCa::SystemRoots),
            connection_spec_hash(&api_key("x", "other"), ServerCa::SystemRoots),
            connection_spec_hash(&plain("ns.tmprl.cloud:7233"), ServerCa::SystemRoots),
        ];
        for (i, other) in others.iter().enumerate() {
            assert_ne!(&base, other, "case {i}");
        }
    }
}
