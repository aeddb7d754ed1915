//! Child processes of the sandbox (servers, the controller): started with their output in a
//! log file, killed if the sandbox dies, stopped gracefully on shutdown.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

/// A child process could not be started or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// The log file could not be opened.
    #[error("opening log file {path}: {source}")]
    Log {
        /// Log path.
        path: PathBuf,
        /// I/O error.
        source: std::io::Error,
    },
    /// The program could not be started.
    #[error("starting {program}: {source}")]
    Spawn {
        /// Program path.
        program: String,
        /// I/O error.
        source: std::io::Error,
    },
}

/// A running child whose output goes to a log file.
#[derive(Debug)]
pub struct Supervised {
    /// Short name for messages.
    pub name: String,
    /// Its log file.
    pub log: PathBuf,
    child: Child,
}

/// Starts `command` with stdout and stderr appended to `log`. The child gets SIGKILL if the
/// sandbox process dies without stopping it (PR_SET_PDEATHSIG).
pub fn spawn_logged(
    name: &str,
    mut command: Command,
    log: &Path,
) -> Result<Supervised, ProcessError> {
    let open = || {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|source| ProcessError::Log {
                path: log.to_owned(),
                source,
            })
    };
    let program = command
        .as_std()
        .get_program()
        .to_string_lossy()
        .into_owned();
    command
        .stdin(Stdio::null())
        .stdout(open()?)
        .stderr(open()?)
        .kill_on_drop(true);
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = command
        .spawn()
        .map_err(|source| ProcessError::Spawn { program, source })?;
    Ok(Supervised {
        name: name.to_owned(),
        log: log.to_owned(),
        child,
    })
}

impl Supervised {
    /// Whether the process has exited, with its status text.
    pub fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            Ok(None) => None,
            Err(e) => Some(format!("unknown ({e})")),
        }
    }

    /// Process ID while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Sends SIGTERM, waits up to `grace`, then SIGKILL.
    pub async fn stop(&mut self, grace: Duration) {
        if let Some(pid) = self.child.id() {
            // SAFETY: plain syscall on a pid we own; it has not been reaped yet.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGTERM);
            }
        }
        if tokio::time::timeout(grace, self.child.wait())
            .await
            .is_err()
        {
            tracing::warn!(process = %self.name, "did not stop within {grace:?}; killing it");
            let _ = self.child.kill().await;
        }
    }

    /// Kills the process at once (SIGKILL), as a crash would.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }
}

/// Last `lines` lines of a log file, for failure reports.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
