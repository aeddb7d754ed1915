//! A private PostgreSQL cluster for one production-like Temporal: `initdb` into a fresh folder,
//! `postgres` on a free loopback port (and a Unix socket in its data folder), no system
//! service. PostgreSQL refuses to run as root; run as root, the sandbox runs it as the
//! `postgres` user that Debian's package creates (`scripts/install-postgres.sh`), with its data
//! folder under the temporary directory (the state folder may be in root's home).

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::process::Command;

use crate::ports::free_port;
use crate::process::{Supervised, spawn_logged, tail};
use crate::wait::wait_until;

/// Environment variable naming the folder with `initdb`, `postgres` and `pg_isready`, when
/// they are not in `/usr/lib/postgresql/<version>/bin`.
pub const POSTGRES_BIN_DIR_VAR: &str = "TWC_POSTGRES_BIN_DIR";
/// The database user Temporal connects as (trust authentication on loopback).
pub const USER: &str = "temporal";
/// Attempts of [`Postgres::start`] when the port it picked was taken in the meantime.
const PORT_ATTEMPTS: usize = 3;

/// PostgreSQL could not be started.
#[derive(Debug, thiserror::Error)]
pub enum PostgresError {
    /// No PostgreSQL binaries were found.
    #[error(
        "PostgreSQL binaries not found in /usr/lib/postgresql/*/bin or ${POSTGRES_BIN_DIR_VAR}: \
         run scripts/install-postgres.sh (`make postgres`)"
    )]
    NotInstalled,
    /// Running as root, but there is no `postgres` user to run PostgreSQL as.
    #[error(
        "running as root and there is no `postgres` user to run PostgreSQL as: run \
         scripts/install-postgres.sh (`make postgres`), which installs Debian's postgresql"
    )]
    NoUser,
    /// A folder could not be prepared.
    #[error("preparing {path}: {source}")]
    Io {
        /// Path.
        path: PathBuf,
        /// I/O error.
        source: std::io::Error,
    },
    /// No free port.
    #[error("finding a free port: {0}")]
    Port(std::io::Error),
    /// `initdb` failed.
    #[error("initdb failed ({status}); log {log}:\n{tail}")]
    Initdb {
        /// Exit status.
        status: String,
        /// Log file.
        log: PathBuf,
        /// Its last lines.
        tail: String,
    },
    /// The server process could not start.
    #[error(transparent)]
    Process(#[from] crate::process::ProcessError),
    /// The server did not accept connections in time, or exited.
    #[error("PostgreSQL did not become ready ({why}); log {log}:\n{tail}")]
    NotReady {
        /// What was seen.
        why: String,
        /// Log file.
        log: PathBuf,
        /// Its last lines.
        tail: String,
    },
}

/// A running private PostgreSQL.
#[derive(Debug)]
pub struct Postgres {
    /// Loopback port.
    pub port: u16,
    /// The `postgres` process.
    pub process: Supervised,
    /// Data folder (removed by [`Self::stop`] and on drop when it is a temporary one).
    pub data_dir: PathBuf,
    temporary: bool,
}

/// Who runs PostgreSQL: this user, or (as root) the `postgres` user.
#[derive(Debug, Clone, Copy)]
struct RunAs {
    uid: u32,
    gid: u32,
}

impl Postgres {
    /// Creates a cluster (`initdb`, superuser [`USER`], trust authentication) and starts it on a
    /// free loopback port. `state_dir` holds the data folder unless running as root; `log`
    /// receives the output of `initdb` and `postgres`.
    pub async fn start(state_dir: &Path, log: &Path) -> Result<Self, PostgresError> {
        let bin = bin_dir().ok_or(PostgresError::NotInstalled)?;
        let run_as = run_as()?;
        let (data_dir, temporary) = match run_as {
            Some(_) => (temporary_data_dir(), true),
            None => (state_dir.join("postgres"), false),
        };
        if data_dir.exists() {
            std::fs::remove_dir_all(&data_dir).map_err(io(&data_dir))?;
        }
        std::fs::create_dir_all(&data_dir).map_err(io(&data_dir))?;
        initdb(&bin, &data_dir, run_as, log).await?;
        let mut attempt = 1;
        loop {
            let port = free_port().map_err(PostgresError::Port)?;
            let mut command = command(&bin.join("postgres"), run_as);
            command
                .arg("-D")
                .arg(&data_dir)
                .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-k"])
                .arg(&data_dir)
                // A throwaway cluster: durability buys nothing, speed does.
                .args(["-c", "fsync=off", "-c", "synchronous_commit=off"])
                .args(["-c", "full_page_writes=off", "-c", "max_connections=300"]);
            let mut cluster = Self {
                port,
                process: spawn_logged("postgres", command, log)?,
                data_dir: data_dir.clone(),
                temporary,
            };
            match wait_ready(&bin, &mut cluster, log).await {
                Err(PostgresError::NotReady { why, .. })
                    if attempt < PORT_ATTEMPTS && tail(log, 20).contains("could not bind") =>
                {
                    tracing::warn!(port, "PostgreSQL: {why}; retrying on another port");
                    // The next attempt uses the same data folder.
                    cluster.temporary = false;
                    attempt += 1;
                }
                Err(e) => return Err(e),
                Ok(()) => return Ok(cluster),
            }
        }
    }

    /// Stops the server (fast shutdown) and removes a temporary data folder.
    pub async fn stop(&mut self) {
        self.process.stop(Duration::from_secs(10)).await;
        self.remove_temporary();
    }

    fn remove_temporary(&mut self) {
        if self.temporary && self.data_dir.exists() {
            let _ = std::fs::remove_dir_all(&self.data_dir);
        }
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if self.temporary && self.process.exited().is_none() {
            // Dropped while running (a failed test): kill it now rather than when the process
            // handle drops (kill_on_drop), so that its folder can go too.
            if let Some(pid) = self.process.pid() {
                // SAFETY: plain syscall on a child we own that has not been reaped.
                unsafe {
                    libc::kill(pid as libc::pid_t, libc::SIGKILL);
                }
            }
        }
        self.remove_temporary();
    }
}

/// `initdb` into `data_dir`, its output appended to `log`.
async fn initdb(
    bin: &Path,
    data_dir: &Path,
    run_as: Option<RunAs>,
    log: &Path,
) -> Result<(), PostgresError> {
    if let Some(RunAs { uid, gid }) = run_as {
        std::os::unix::fs::chown(data_dir, Some(uid), Some(gid)).map_err(io(data_dir))?;
    }
    let mut initdb = command(&bin.join("initdb"), run_as);
    initdb.arg("-D").arg(data_dir).args([
        "-U",
        USER,
        "--auth=trust",
        "-E",
        "UTF8",
        "--locale=C",
        "--no-sync",
    ]);
    let status = super::run_logged(initdb, log)
        .await
        .map_err(io(&bin.join("initdb")))?;
    if !status.success() {
        return Err(PostgresError::Initdb {
            status: status.to_string(),
            log: log.to_owned(),
            tail: tail(log, 20),
        });
    }
    Ok(())
}

/// Waits until `pg_isready` answers yes, failing early if the server exits.
async fn wait_ready(bin: &Path, cluster: &mut Postgres, log: &Path) -> Result<(), PostgresError> {
    let pg_isready = bin.join("pg_isready");
    let port = cluster.port.to_string();
    let ready = wait_until(
        "PostgreSQL to accept connections",
        Duration::from_secs(60),
        || {
            let exited = cluster.process.exited();
            let pg_isready = pg_isready.clone();
            let port = port.clone();
            async move {
                if let Some(status) = exited {
                    return Some(Err(format!("postgres exited ({status})")));
                }
                let out = Command::new(&pg_isready)
                    .args(["-q", "-h", "127.0.0.1", "-p", &port, "-U", USER])
                    .status()
                    .await
                    .ok()?;
                out.success().then_some(Ok(()))
            }
        },
    )
    .await;
    let why = match ready {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(why)) => why,
        Err(e) => e.to_string(),
    };
    Err(PostgresError::NotReady {
        why,
        log: log.to_owned(),
        tail: tail(log, 20),
    })
}

/// A command for `program`, run as `run_as` when given.
fn command(program: &Path, run_as: Option<RunAs>) -> Command {
    let mut command = Command::new(program);
    if let Some(RunAs { uid, gid }) = run_as {
        command.uid(uid).gid(gid);
        // Its own home, not root's: PostgreSQL tools look at $HOME (e.g. for .pgpass).
        command.env("HOME", "/tmp");
    }
    command
}

/// Folder with the PostgreSQL binaries: `$TWC_POSTGRES_BIN_DIR`, else the newest
/// `/usr/lib/postgresql/<version>/bin` (Debian and Ubuntu).
fn bin_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os(POSTGRES_BIN_DIR_VAR) {
        return Some(PathBuf::from(dir));
    }
    let versions = std::fs::read_dir("/usr/lib/postgresql").ok()?;
    versions
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let version: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .max_by_key(|(version, _)| *version)
        .map(|(_, bin)| bin)
}

/// As root, the `postgres` user; otherwise nobody else (PostgreSQL runs as this user).
fn run_as() -> Result<Option<RunAs>, PostgresError> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let name = c"postgres";
    // SAFETY: a NUL-terminated name; the returned record is read at once, before any other
    // getpw* call on this thread could overwrite it.
    let user = unsafe { libc::getpwnam(name.as_ptr()) };
    if user.is_null() {
        return Err(PostgresError::NoUser);
    }
    // SAFETY: non-null pointer to a passwd record from getpwnam.
    let (uid, gid) = unsafe { ((*user).pw_uid, (*user).pw_gid) };
    Ok(Some(RunAs { uid, gid }))
}

/// A fresh folder name under the temporary directory (world-traversable, unlike root's home).
fn temporary_data_dir() -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    std::env::temp_dir().join(format!(
        "twc-postgres-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ))
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> PostgresError {
    let path = path.to_owned();
    move |source| PostgresError::Io { path, source }
}
