//! Starts child processes from one dedicated, long-lived thread, so that `PR_SET_PDEATHSIG`
//! kills them exactly when the runner goes away.
//!
//! `prctl(PR_SET_PDEATHSIG)` fires when the *thread* that forked the child exits, not the
//! process. Tokio may retire threads (blocking-pool threads after idling, a worker thread
//! handed off by `block_in_place`), which would SIGKILL healthy pods at random. So every fork
//! happens on the `pod-spawner` thread, which lives until the last [`Spawner`] handle is dropped
//! — i.e. after the runner stopped its pods — or until the runner process dies.

use std::io;
use std::sync::mpsc;

use tokio::process::{Child, Command};
use tokio::sync::oneshot;

/// A request to the spawner thread.
struct Request {
    command: Command,
    reply: oneshot::Sender<io::Result<Child>>,
}

/// Handle to the spawner thread; cheap to clone. The thread ends when every handle is dropped.
#[derive(Clone)]
pub struct Spawner {
    requests: mpsc::Sender<Request>,
}

impl Spawner {
    /// Starts the spawner thread; it registers children with the current Tokio runtime (an
    /// error outside of one).
    pub fn start() -> io::Result<Self> {
        let runtime = tokio::runtime::Handle::try_current().map_err(io::Error::other)?;
        let (requests, queue) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("pod-spawner".into())
            .spawn(move || {
                let _runtime = runtime.enter();
                while let Ok(Request { mut command, reply }) = queue.recv() {
                    // A dropped reply means the pod task is gone; `kill_on_drop` then reaps it.
                    let _ = reply.send(command.spawn());
                }
            })?;
        Ok(Self { requests })
    }

    /// Spawns `command` (prepared with [`die_with_runner`]) on the spawner thread.
    pub async fn spawn(&self, command: Command) -> io::Result<Child> {
        let (reply, answer) = oneshot::channel();
        self.requests
            .send(Request { command, reply })
            .map_err(|_| io::Error::other("pod spawner thread has stopped"))?;
        answer
            .await
            .map_err(|_| io::Error::other("pod spawner thread dropped the request"))?
    }
}

/// Makes the child die with SIGKILL when the spawning thread (or the whole runner) exits, puts
/// it in its own process group (so stopping a pod reaches its children too) and kills it when
/// its [`Child`] handle is dropped.
pub fn die_with_runner(command: &mut Command) {
    let runner_pid = libc::pid_t::try_from(std::process::id()).unwrap_or(0);
    command.kill_on_drop(true).process_group(0);
    // SAFETY: the closure runs in the forked child before exec and only calls the
    // async-signal-safe `prctl` and `getppid`; it allocates nothing.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The runner may have died between fork and prctl: then no signal will come.
            if libc::getppid() != runner_pid {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn spawned_child_runs_and_is_reaped() {
        let spawner = Spawner::start().unwrap();
        let mut command = Command::new("true");
        die_with_runner(&mut command);
        let mut child = spawner.spawn(command).await.unwrap();
        let status = child.wait().await.unwrap();
        assert!(status.success());
    }

    #[tokio::test]
    async fn missing_program_is_a_spawn_error() {
        let spawner = Spawner::start().unwrap();
        let command = Command::new("/nonexistent/twc-binary");
        assert!(spawner.spawn(command).await.is_err());
    }
}
