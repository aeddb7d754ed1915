//! Configuration read from the environment.
//!
//! Every problem found here is a configuration error: `main` reports it and exits with code 2.

use std::{
    env, fmt, fs,
    net::{Ipv4Addr, SocketAddr},
    path::PathBuf,
};

use temporalio_common::worker::VersioningBehavior;

use crate::failure::FailShare;

/// Task queue used when `SAMPLE_TASK_QUEUE` is not set.
pub const DEFAULT_TASK_QUEUE: &str = "hello-world";
/// Namespace used when `TEMPORAL_NAMESPACE` is not set.
pub const DEFAULT_NAMESPACE: &str = "default";

/// A configuration error, reported before anything connects.
#[derive(Debug)]
pub struct ConfigError(String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

fn config_err(msg: impl Into<String>) -> ConfigError {
    ConfigError(msg.into())
}

/// Client certificate and key, already read from disk (PEM).
#[derive(Clone)]
pub struct ClientCert {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
}

/// TLS settings; present only when TLS is on.
#[derive(Clone)]
pub struct TlsConfig {
    pub server_ca_pem: Option<Vec<u8>>,
    pub server_name: Option<String>,
    pub client_cert: Option<ClientCert>,
}

/// Where `/metrics` is served and whether a Prometheus file_sd target file announces it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsConfig {
    /// The listener's address (`SAMPLE_METRICS_ADDR`, else `127.0.0.1:0`: any free port).
    pub bind: SocketAddr,
    /// Folder to write `<pod>-<pid>.json` into (`SAMPLE_METRICS_SD_DIR`).
    pub sd_dir: Option<PathBuf>,
}

/// Everything the worker needs to know before it connects.
#[derive(Clone)]
pub struct Config {
    /// `host:port` as given (a leading `http://`/`https://` is stripped).
    pub address: String,
    pub namespace: String,
    pub deployment_name: String,
    pub build_id: String,
    /// The main task queue first, then the extra ones (no duplicates).
    pub task_queues: Vec<String>,
    pub versioning_behavior: VersioningBehavior,
    pub tls: Option<TlsConfig>,
    pub api_key: Option<String>,
    /// `TEMPORAL_API_KEY_PATH`: re-read while running, so a rotated key is used without a restart.
    pub api_key_path: Option<String>,
    pub fail_gate: bool,
    /// Activities run at once per worker (`SAMPLE_ACTIVITY_SLOTS`, default 100).
    pub activity_slots: usize,
    /// How long `greet` takes (`SAMPLE_GREET_DELAY_MS`, default 0): with few slots, load builds
    /// a backlog (for autoscaling tests).
    pub greet_delay_ms: u64,
    pub never_poll: bool,
    /// Share of `HelloWorld` workflows whose `greet` activity fails (`SAMPLE_FAIL_SHARE`).
    pub fail_share: FailShare,
    /// `/metrics`, when `SAMPLE_METRICS_ADDR` or `SAMPLE_METRICS_SD_DIR` asks for it.
    pub metrics: Option<MetricsConfig>,
    /// Workflow types whose commands this build issues in another order
    /// (`SAMPLE_NONDETERMINISTIC`): a build that cannot replay the histories of earlier ones.
    pub nondeterministic: Nondeterministic,
}

/// Workflow types that `SAMPLE_NONDETERMINISTIC` makes issue their commands in another order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Nondeterministic {
    /// `HelloWorld` waits on a 1 ms timer before its `greet` activity.
    pub hello_world: bool,
    /// `Sleeper` runs the `greet` activity before its timer.
    pub sleeper: bool,
}

impl Nondeterministic {
    /// Parses a comma-separated list of workflow types (`HelloWorld`, `Sleeper`).
    fn parse(value: &str) -> Result<Self, ConfigError> {
        let mut out = Self::default();
        for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match name {
                "HelloWorld" => out.hello_world = true,
                "Sleeper" => out.sleeper = true,
                other => {
                    return Err(config_err(format!(
                        "SAMPLE_NONDETERMINISTIC lists workflow types among HelloWorld and \
                         Sleeper, got '{other}'"
                    )));
                }
            }
        }
        Ok(out)
    }
}

impl Config {
    /// Reads the configuration from the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|key| env::var(key).ok())
    }

    /// Reads the configuration through `lookup` (the environment in production, a map in tests).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        // Empty or blank values count as unset.
        let get = |key: &str| {
            lookup(key)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };

        let mut missing = Vec::new();
        let address = get("TEMPORAL_ADDRESS").or_else(|| get("TEMPORAL_HOST_PORT"));
        if address.is_none() {
            missing.push("TEMPORAL_ADDRESS (or TEMPORAL_HOST_PORT)");
        }
        let deployment_name = get("TEMPORAL_DEPLOYMENT_NAME");
        if deployment_name.is_none() {
            missing.push("TEMPORAL_DEPLOYMENT_NAME");
        }
        let build_id = get("TEMPORAL_WORKER_BUILD_ID").or_else(|| get("WORKER_BUILD_ID"));
        if build_id.is_none() {
            missing.push("TEMPORAL_WORKER_BUILD_ID (or WORKER_BUILD_ID)");
        }
        let (Some(address), Some(deployment_name), Some(build_id)) =
            (address, deployment_name, build_id)
        else {
            return Err(config_err(format!(
                "missing required environment variable(s): {}",
                missing.join(", ")
            )));
        };

        let address = normalize_address(&address)?;
        let namespace = get("TEMPORAL_NAMESPACE").unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned());

        let main_queue = get("SAMPLE_TASK_QUEUE").unwrap_or_else(|| DEFAULT_TASK_QUEUE.to_owned());
        let mut task_queues = vec![main_queue];
        if let Some(extra) = get("SAMPLE_EXTRA_TASK_QUEUES") {
            for queue in extra.split(',').map(str::trim).filter(|q| !q.is_empty()) {
                if !task_queues.iter().any(|q| q == queue) {
                    task_queues.push(queue.to_owned());
                }
            }
        }

        let versioning_behavior = match get("SAMPLE_VERSIONING_BEHAVIOR")
            .map(|v| v.to_ascii_lowercase())
            .as_deref()
        {
            None | Some("pinned") => VersioningBehavior::Pinned,
            Some("auto-upgrade" | "auto_upgrade" | "autoupgrade") => {
                VersioningBehavior::AutoUpgrade
            }
            Some(other) => {
                return Err(config_err(format!(
                    "SAMPLE_VERSIONING_BEHAVIOR must be 'pinned' or 'auto-upgrade', got '{other}'"
                )));
            }
        };

        // The key as a file (the controller mounts it) wins: it follows a rotated Secret.
        let api_key_path = get("TEMPORAL_API_KEY_PATH");
        let api_key = match &api_key_path {
            Some(path) => Some(read_api_key(path)?),
            None => get("TEMPORAL_API_KEY"),
        };
        let cert_path = get("TEMPORAL_TLS_CLIENT_CERT_PATH");
        let key_path = get("TEMPORAL_TLS_CLIENT_KEY_PATH");
        let client_cert = match (cert_path, key_path) {
            (None, None) => None,
            (Some(cert), Some(key)) => Some(ClientCert {
                cert_pem: read_file("TEMPORAL_TLS_CLIENT_CERT_PATH", &cert)?,
                key_pem: read_file("TEMPORAL_TLS_CLIENT_KEY_PATH", &key)?,
            }),
            (Some(_), None) => {
                return Err(config_err(
                    "TEMPORAL_TLS_CLIENT_CERT_PATH is set but TEMPORAL_TLS_CLIENT_KEY_PATH is not",
                ));
            }
            (None, Some(_)) => {
                return Err(config_err(
                    "TEMPORAL_TLS_CLIENT_KEY_PATH is set but TEMPORAL_TLS_CLIENT_CERT_PATH is not",
                ));
            }
        };
        let server_ca_pem = get("TEMPORAL_TLS_CA_CERT_PATH")
            .map(|path| read_file("TEMPORAL_TLS_CA_CERT_PATH", &path))
            .transpose()?;
        let server_name = get("TEMPORAL_TLS_SERVER_NAME");

        // An explicit TEMPORAL_TLS wins; otherwise an API key or a client certificate turns TLS on.
        let tls_on = match get("TEMPORAL_TLS") {
            Some(v) => parse_bool("TEMPORAL_TLS", &v)?,
            None => api_key.is_some() || client_cert.is_some(),
        };
        let tls = tls_on.then_some(TlsConfig {
            server_ca_pem,
            server_name,
            client_cert,
        });

        let fail_gate = flag(&get, "SAMPLE_FAIL_GATE")?;
        let activity_slots = match get("SAMPLE_ACTIVITY_SLOTS") {
            None => 100,
            Some(v) => match v.parse::<usize>() {
                Ok(n) if (1..=10_000).contains(&n) => n,
                _ => {
                    return Err(config_err(format!(
                        "SAMPLE_ACTIVITY_SLOTS must be a whole number from 1 to 10000, got '{v}'"
                    )));
                }
            },
        };
        let greet_delay_ms = match get("SAMPLE_GREET_DELAY_MS") {
            None => 0,
            Some(v) => match v.parse::<u64>() {
                Ok(n) if n <= 600_000 => n,
                _ => {
                    return Err(config_err(format!(
                        "SAMPLE_GREET_DELAY_MS must be milliseconds from 0 to 600000, got '{v}'"
                    )));
                }
            },
        };
        let never_poll = flag(&get, "SAMPLE_NEVER_POLL")?;
        let fail_share = match get("SAMPLE_FAIL_SHARE") {
            None => FailShare::NONE,
            Some(v) => v.parse().map_err(|_| {
                config_err(format!(
                    "SAMPLE_FAIL_SHARE must be a whole percentage from 0 to 100, got '{v}'"
                ))
            })?,
        };
        let metrics = metrics_config(&get)?;
        let nondeterministic = get("SAMPLE_NONDETERMINISTIC")
            .map(|v| Nondeterministic::parse(&v))
            .transpose()?
            .unwrap_or_default();

        Ok(Self {
            address,
            namespace,
            deployment_name,
            build_id,
            task_queues,
            versioning_behavior,
            tls,
            api_key,
            api_key_path,
            fail_gate,
            activity_slots,
            greet_delay_ms,
            never_poll,
            fail_share,
            metrics,
            nondeterministic,
        })
    }

    /// The URL the client connects to (`https` when TLS is on).
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.address)
    }
}

/// Whether a flag such as `SAMPLE_CRASH_AT_START` is on, looked up in the process environment.
pub fn env_flag(key: &str) -> Result<bool, ConfigError> {
    flag(
        &|k: &str| env::var(k).ok().filter(|v| !v.trim().is_empty()),
        key,
    )
}

/// `SAMPLE_METRICS_ADDR` and `SAMPLE_METRICS_SD_DIR`: no metrics listener unless one is set.
fn metrics_config(
    get: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<MetricsConfig>, ConfigError> {
    let bind = get("SAMPLE_METRICS_ADDR")
        .map(|v| {
            v.parse::<SocketAddr>().map_err(|_| {
                config_err(format!(
                    "SAMPLE_METRICS_ADDR must be ip:port (e.g. 127.0.0.1:9464, 0.0.0.0:0), got '{v}'"
                ))
            })
        })
        .transpose()?;
    let sd_dir = get("SAMPLE_METRICS_SD_DIR").map(PathBuf::from);
    if bind.is_none() && sd_dir.is_none() {
        return Ok(None);
    }
    Ok(Some(MetricsConfig {
        bind: bind.unwrap_or_else(|| SocketAddr::from((Ipv4Addr::LOCALHOST, 0))),
        sd_dir,
    }))
}

fn flag(get: &dyn Fn(&str) -> Option<String>, key: &str) -> Result<bool, ConfigError> {
    get(key).map_or(Ok(false), |v| parse_bool(key, &v))
}

fn parse_bool(key: &str, value: &str) -> Result<bool, ConfigError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        other => Err(config_err(format!(
            "{key} must be a boolean (1/0, true/false), got '{other}'"
        ))),
    }
}

fn normalize_address(raw: &str) -> Result<String, ConfigError> {
    let host_port = raw
        .strip_prefix("http://")
        .or_else(|| raw.strip_prefix("https://"))
        .unwrap_or(raw)
        .trim_end_matches('/');
    let valid = host_port
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if valid {
        Ok(host_port.to_owned())
    } else {
        Err(config_err(format!(
            "TEMPORAL_ADDRESS must be host:port, got '{raw}'"
        )))
    }
}

/// Reads an API key file (`TEMPORAL_API_KEY_PATH`), trimmed; an empty file is an error.
pub fn read_api_key(path: &str) -> Result<String, ConfigError> {
    let bytes = read_file("TEMPORAL_API_KEY_PATH", path)?;
    let key = String::from_utf8(bytes)
        .map_err(|_| config_err(format!("TEMPORAL_API_KEY_PATH: '{path}' is not UTF-8 text")))?;
    let key = key.trim();
    if key.is_empty() {
        return Err(config_err(format!(
            "TEMPORAL_API_KEY_PATH: '{path}' is empty"
        )));
    }
    Ok(key.to_owned())
}

fn read_file(key: &str, path: &str) -> Result<Vec<u8>, ConfigError> {
    fs::read(path).map_err(|e| config_err(format!("{key}: cannot read '{path}': {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Config::from_lookup(|k| map.get(k).cloned())
    }

    const BASE: [(&str, &str); 3] = [
        ("TEMPORAL_ADDRESS", "127.0.0.1:7233"),
        ("TEMPORAL_DEPLOYMENT_NAME", "dep"),
        ("TEMPORAL_WORKER_BUILD_ID", "v1"),
    ];

    #[test]
    fn defaults() {
        let c = cfg(&BASE).expect("base config parses");
        assert_eq!(c.namespace, "default");
        assert_eq!(c.task_queues, vec!["hello-world".to_owned()]);
        assert_eq!(c.versioning_behavior, VersioningBehavior::Pinned);
        assert!(c.tls.is_none());
        assert_eq!(c.url(), "http://127.0.0.1:7233");
        assert_eq!(c.fail_share, FailShare::NONE);
        assert_eq!(c.metrics, None);
    }

    #[test]
    fn nondeterministic_names_known_workflow_types() {
        let with = |value: &str| {
            let mut pairs = BASE.to_vec();
            pairs.push(("SAMPLE_NONDETERMINISTIC", value));
            cfg(&pairs).map(|c| c.nondeterministic)
        };
        let none = Nondeterministic::default();
        let hello = Nondeterministic {
            hello_world: true,
            ..none
        };
        let both = Nondeterministic {
            hello_world: true,
            sleeper: true,
        };
        assert_eq!(cfg(&BASE).ok().map(|c| c.nondeterministic), Some(none));
        for (value, wanted) in [
            ("HelloWorld", Some(hello)),
            (" HelloWorld , Sleeper ", Some(both)),
            ("Sleeper,HelloWorld,", Some(both)),
            (",", Some(none)),
            ("helloworld", None),
            ("HelloWorld,Stubborn", None),
        ] {
            assert_eq!(
                with(value).ok(),
                wanted,
                "SAMPLE_NONDETERMINISTIC={value:?}"
            );
        }
        let refused = with("Stubborn").err().map(|e| e.to_string());
        assert!(
            refused
                .as_deref()
                .is_some_and(|m| m.contains("SAMPLE_NONDETERMINISTIC") && m.contains("'Stubborn'")),
            "{refused:?}"
        );
    }

    #[test]
    fn fail_share_is_a_percentage() {
        let with = |value: &str| {
            let mut pairs = BASE.to_vec();
            pairs.push(("SAMPLE_FAIL_SHARE", value));
            cfg(&pairs).map(|c| c.fail_share.percent())
        };
        assert_eq!(with("30").ok(), Some(30));
        assert_eq!(with(" 0 ").ok(), Some(0));
        assert_eq!(with("100").ok(), Some(100));
        for bad in ["101", "-1", "30%", "0.5", "many"] {
            let err = with(bad).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains("SAMPLE_FAIL_SHARE"), "{bad}: {err:?}");
        }
    }

    #[test]
    fn metrics_listen_on_a_free_loopback_port_when_only_the_sd_dir_is_set() {
        let mut pairs = BASE.to_vec();
        pairs.push(("SAMPLE_METRICS_SD_DIR", "/tmp/targets"));
        let c = cfg(&pairs).expect("config parses");
        assert_eq!(
            c.metrics,
            Some(MetricsConfig {
                bind: SocketAddr::from(([127, 0, 0, 1], 0)),
                sd_dir: Some(PathBuf::from("/tmp/targets")),
            })
        );

        let mut pairs = BASE.to_vec();
        pairs.push(("SAMPLE_METRICS_ADDR", "0.0.0.0:9464"));
        let c = cfg(&pairs).expect("config parses");
        assert_eq!(
            c.metrics,
            Some(MetricsConfig {
                bind: SocketAddr::from(([0, 0, 0, 0], 9464)),
                sd_dir: None,
            })
        );

        let mut pairs = BASE.to_vec();
        pairs.push(("SAMPLE_METRICS_ADDR", "localhost:9464"));
        assert!(cfg(&pairs).is_err());
    }

    #[test]
    fn missing_required_lists_all() {
        let err = cfg(&[]).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("TEMPORAL_ADDRESS"), "{err}");
        assert!(err.contains("TEMPORAL_DEPLOYMENT_NAME"), "{err}");
        assert!(err.contains("TEMPORAL_WORKER_BUILD_ID"), "{err}");
    }

    #[test]
    fn fallbacks_extra_queues_and_api_key() {
        let c = cfg(&[
            ("TEMPORAL_HOST_PORT", "temporal:7233"),
            ("TEMPORAL_DEPLOYMENT_NAME", "dep"),
            ("WORKER_BUILD_ID", "v2"),
            ("SAMPLE_EXTRA_TASK_QUEUES", " a, ,b,hello-world,a "),
            ("SAMPLE_VERSIONING_BEHAVIOR", "auto-upgrade"),
            ("TEMPORAL_API_KEY", "k"),
        ]);
        let c = c.expect("config parses");
        assert_eq!(c.build_id, "v2");
        assert_eq!(c.task_queues, vec!["hello-world", "a", "b"]);
        assert_eq!(c.versioning_behavior, VersioningBehavior::AutoUpgrade);
        assert!(c.tls.is_some());
        assert_eq!(c.url(), "https://temporal:7233");
    }

    #[test]
    fn an_api_key_file_wins_over_the_variable_and_must_not_be_empty() {
        let dir = std::env::temp_dir().join(format!("sample-worker-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let file = dir.join("api-key");
        std::fs::write(&file, "from-file\n").expect("write key");
        let path = file.display().to_string();
        let mut pairs = BASE.to_vec();
        pairs.push(("TEMPORAL_API_KEY", "from-env"));
        pairs.push(("TEMPORAL_API_KEY_PATH", &path));
        let c = cfg(&pairs).expect("config parses");
        assert_eq!(c.api_key.as_deref(), Some("from-file"));
        assert_eq!(c.api_key_path.as_deref(), Some(path.as_str()));
        assert!(c.tls.is_some(), "an API key turns TLS on");
        std::fs::write(&file, " \n").expect("write key");
        let err = cfg(&pairs).err().expect("empty key file");
        assert!(err.to_string().contains("is empty"), "{err}");
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn bad_values_are_errors() {
        let mut bad_tls = BASE.to_vec();
        bad_tls.push(("TEMPORAL_TLS", "maybe"));
        assert!(cfg(&bad_tls).is_err());
        let mut bad_behavior = BASE.to_vec();
        bad_behavior.push(("SAMPLE_VERSIONING_BEHAVIOR", "sometimes"));
        assert!(cfg(&bad_behavior).is_err());
        let mut half_mtls = BASE.to_vec();
        half_mtls.push(("TEMPORAL_TLS_CLIENT_CERT_PATH", "/nonexistent"));
        assert!(cfg(&half_mtls).is_err());
        assert!(
            cfg(&[
                ("TEMPORAL_ADDRESS", "no-port"),
                ("TEMPORAL_DEPLOYMENT_NAME", "dep"),
                ("TEMPORAL_WORKER_BUILD_ID", "v1"),
            ])
            .is_err()
        );
    }
}
