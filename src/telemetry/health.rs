//! What `/healthz` and `/readyz` answer.
//!
//! - **Live** (`/healthz`): none of the process's long-running tasks (the watcher, the engine
//!   worker, the WorkerResourceTemplate controller) has stopped. Starting up (connecting to Kubernetes and the engine) is live; a
//!   watcher that panicked is not, so the kubelet restarts the pod. A dependency being down is
//!   never a liveness failure: the tasks wait and retry on their own.
//! - **Ready** (`/readyz`): live, not shutting down, the watcher has listed and handled every
//!   watched TemporalWorkerDeployment and TemporalConnection once (the first `InitDone` of each
//!   of its watches; it stays ready through later re-lists), and the engine worker runs: it
//!   was built on a connected engine client and its polling loop has not returned (when it
//!   returns the process exits).

use std::sync::atomic::{AtomicBool, Ordering};

/// Health of the controller's tasks, shared by them and the HTTP server.
#[derive(Debug, Default)]
pub struct Health {
    watcher_synced: AtomicBool,
    watcher_stopped: AtomicBool,
    templates_stopped: AtomicBool,
    worker_running: AtomicBool,
    worker_stopped: AtomicBool,
    shutting_down: AtomicBool,
}

/// A long-running task of the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Task {
    /// The Kubernetes watcher.
    Watcher,
    /// The engine's Temporal worker.
    Worker,
    /// The WorkerResourceTemplate controller.
    Templates,
}

/// Marks its task stopped when dropped (also when the task panics and unwinds).
#[derive(Debug)]
pub struct TaskGuard<'a> {
    health: &'a Health,
    task: Task,
}

impl Drop for TaskGuard<'_> {
    fn drop(&mut self) {
        self.health.stopped(self.task);
    }
}

impl Health {
    /// The watcher handled the initial list of every watch.
    pub fn watcher_synced(&self) {
        self.watcher_synced.store(true, Ordering::Release);
    }

    /// The engine worker was built and runs its polling loop.
    pub fn worker_running(&self) {
        self.worker_running.store(true, Ordering::Release);
    }

    /// A task ended (normally only at shutdown).
    pub fn stopped(&self, task: Task) {
        match task {
            Task::Watcher => self.watcher_stopped.store(true, Ordering::Release),
            Task::Templates => self.templates_stopped.store(true, Ordering::Release),
            Task::Worker => {
                self.worker_running.store(false, Ordering::Release);
                self.worker_stopped.store(true, Ordering::Release);
            }
        }
    }

    /// A guard that marks `task` stopped when dropped: hold it for the task's lifetime.
    pub fn guard(&self, task: Task) -> TaskGuard<'_> {
        TaskGuard { health: self, task }
    }

    /// SIGTERM/SIGINT received: no longer ready.
    pub fn shutting_down(&self) {
        self.shutting_down.store(true, Ordering::Release);
    }

    /// `Ok` when live, otherwise what is wrong.
    pub fn liveness(&self) -> Result<(), Vec<&'static str>> {
        let mut problems = Vec::new();
        if self.watcher_stopped.load(Ordering::Acquire) {
            problems.push("the watcher stopped");
        }
        if self.worker_stopped.load(Ordering::Acquire) {
            problems.push("the engine worker stopped");
        }
        if self.templates_stopped.load(Ordering::Acquire) {
            problems.push("the WorkerResourceTemplate controller stopped");
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }

    /// `Ok` when ready, otherwise what is missing.
    pub fn readiness(&self) -> Result<(), Vec<&'static str>> {
        let mut problems = self.liveness().err().unwrap_or_default();
        if self.shutting_down.load(Ordering::Acquire) {
            problems.push("shutting down");
        }
        if !self.watcher_synced.load(Ordering::Acquire) {
            problems.push("the watcher has not synced its initial list");
        }
        if !self.worker_running.load(Ordering::Acquire)
            && !self.worker_stopped.load(Ordering::Acquire)
        {
            problems.push("the engine worker is not running yet");
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_while_starting_ready_once_synced_and_running() {
        let health = Health::default();
        assert_eq!(health.liveness(), Ok(()));
        assert_eq!(
            health.readiness(),
            Err(vec![
                "the watcher has not synced its initial list",
                "the engine worker is not running yet"
            ])
        );
        health.worker_running();
        assert_eq!(
            health.readiness(),
            Err(vec!["the watcher has not synced its initial list"])
        );
        health.watcher_synced();
        assert_eq!(health.readiness(), Ok(()));
        health.shutting_down();
        assert_eq!(health.readiness(), Err(vec!["shutting down"]));
        assert_eq!(health.liveness(), Ok(()));
    }

    #[test]
    fn a_stopped_task_fails_both_probes_even_when_it_panicked() {
        let health = std::sync::Arc::new(Health::default());
        health.worker_running();
        health.watcher_synced();
        let shared = std::sync::Arc::clone(&health);
        let panicked = std::thread::spawn(move || {
            let _guard = shared.guard(Task::Watcher);
            panic!("watcher bug");
        })
        .join();
        assert!(panicked.is_err());
        assert_eq!(health.liveness(), Err(vec!["the watcher stopped"]));
        assert_eq!(health.readiness(), Err(vec!["the watcher stopped"]));
        drop(health.guard(Task::Worker));
        assert_eq!(
            health.liveness(),
            Err(vec!["the watcher stopped", "the engine worker stopped"])
        );
    }
}
