//! The pod runner: plays kubelet and the Deployment controller for the worker Deployments the
//! controller creates, running each pod as a local process, and kubelet and the Job controller
//! for Jobs with the same label (see [`jobs`]: one pod at a time, as a Pod object and a process,
//! with `backoffLimit`, `activeDeadlineSeconds` and termination messages).
//!
//! # What it does
//!
//! It watches Deployments in all namespaces that carry the `temporal.io/deployment-name` label
//! and keeps `spec.replicas` (nil → 1) pods of each running. A pod is one process, named
//! `<deployment>-<5 random characters>`, that plays the *first* container of the pod template
//! (other containers, init containers and sidecars are ignored).
//!
//! - **Program.** Without a `command`, the container image is looked up in the image table
//!   (`examples/images.yaml`, see [`images`]): its repository (tag and digest ignored) names a
//!   binary, searched in [`PodRunnerConfig::bin_dirs`] in order. With a `command`, its first
//!   element is the program (a path, or a name searched in the bin dirs, then in the runner's
//!   `PATH`) and the rest come before `args`. An unmapped image or a missing binary starts no
//!   process: the pod waits (reason `ImageNotMapped`/`BinaryNotFound`), the Deployment's
//!   `Progressing` message names the image, and the start is retried with back-off.
//! - **Environment.** Only the container's `envFrom` and `env` (plain values, `secretKeyRef`,
//!   `configMapKeyRef` honoring `optional`, `fieldRef` for `metadata.name`,
//!   `metadata.namespace`, labels, annotations, `status.podIP` = 127.0.0.1), with `$(VAR)`
//!   expanded like Kubernetes does, on top of what the runner provides: its own `PATH` and
//!   `HOME`, `HOSTNAME` = the pod name (as a container sees it), and, when the runner has a
//!   [`PodRunnerConfig::metrics_sd_dir`], [`METRICS_SD_DIR_VAR`] naming it. Secrets and
//!   ConfigMaps are read from the API server at each start; a missing required one keeps the pod
//!   waiting (`CreateContainerConfigError`) and is retried.
//! - **Metrics discovery.** Every pod runs on loopback, so a worker serving `/metrics` picks a
//!   free port and announces it to Prometheus in a file_sd file `<metrics_sd_dir>/<pod>-<pid>.json`
//!   (the sample worker does). It removes the file when it exits cleanly; the runner removes it
//!   after any exit (a crash or a SIGKILL leaves it behind otherwise).
//! - **Volumes and path rewriting.** Secret, ConfigMap and emptyDir volumes mounted by the
//!   container are written under the pod's private folder `<work_dir>/<ns>/<deployment>/<pod>/`,
//!   at `<podDir><mountPath>` (honoring `items`, `subPath` and file modes). Since the process
//!   cannot see the container path, every env value, `command` element and arg that contains a
//!   path under a mount path is rewritten to the host path: with a Secret mounted at
//!   `/etc/temporal/tls`, `--tls-cert=/etc/temporal/tls/tls.crt` becomes
//!   `--tls-cert=<podDir>/etc/temporal/tls/tls.crt`. A mount path is only recognized as a whole
//!   path (at the start of the value or after `=`, `:`, `,`, `;`, space or a quote, and ending at
//!   a `/`, a separator or the end), the longest mount wins, and paths inside files are *not*
//!   rewritten. `workingDir` is mapped the same way; without it the process runs in the pod
//!   folder. Volume files are written at each (re)start; later Secret changes are not synced.
//! - **Supervision.** stdout and stderr are appended to `<work_dir>/<ns>/<deployment>/<pod>.log`
//!   (with `==>` marker lines at start, exit and stop). A process that exits (with any code:
//!   Deployments restart always) is counted as a restart and restarted after 1s, 2s, 4s, ...
//!   capped at 30s (reset when it had run for a minute). Scale-down stops surplus pods
//!   (not-ready first, then the newest); deleting the Deployment stops all of its pods; a change
//!   of `spec.template` (compared as JSON) replaces all pods at once (stop old, start new);
//!   stopping is SIGTERM to the pod's process group, then SIGKILL after 5s.
//! - **Readiness.** A process is ready once it has run for 1 second without exiting, or, if the
//!   container has an `exec`, `httpGet` or `tcpSocket` readiness probe, when the probe says so
//!   (with its delays and thresholds; `httpGet` over HTTPS only checks the TCP connection). It is
//!   available once ready for `spec.minReadySeconds`.
//! - **Status.** Written with a merge patch of the status subresource, only when it changed:
//!   `observedGeneration`, the replica counts, and the `Available` and `Progressing` conditions
//!   (see [`status`]), whose messages name pod problems such as
//!   `pod w-v1-x7k2p: process exited with code 1 (restarted 3 times)`.
//!
//! # Processes never outlive the runner
//!
//! Each child is started with `prctl(PR_SET_PDEATHSIG, SIGKILL)`, in its own process group,
//! and with `kill_on_drop`. PDEATHSIG fires when the *thread* that forked the child exits, so all
//! forks happen on one dedicated thread that lives exactly as long as the runner (see
//! [`spawner`]): if the runner process dies, the kernel kills the children; if [`run`]'s future
//! is dropped, the pod tasks are aborted and their process groups are SIGKILLed; on a normal
//! shutdown every pod is stopped (SIGTERM, then SIGKILL) before [`run`] returns.
//!
//! # Not emulated
//!
//! Rolling-update surge/unavailability limits (template changes recreate all pods), paused
//! Deployments, liveness and startup probes, gRPC probes, resource limits, Pod and ReplicaSet
//! objects of Deployments (nothing is written for them but Deployment status; Job pods are Pod
//! objects), Job `completions`/`parallelism` above 1, indexed Jobs, pod failure and success
//! policies, suspended Jobs, projected,
//! downwardAPI and persistent volumes, and `resourceFieldRef`/`fileKeyRef` env sources.

pub mod env;
pub mod images;
pub mod jobs;
pub mod launch;
pub mod names;
pub mod probe;
pub mod runner;
pub mod sources;
pub mod spawner;
pub mod status;
pub mod supervisor;
pub mod thread;
pub mod volumes;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::mpsc;
use tracing::{info, warn};

use self::images::ImageTable;
use self::runner::Runner;
use self::spawner::Spawner;
use self::supervisor::Shared;

/// Label of the versioned worker Deployments the controller creates.
pub const DEPLOYMENT_NAME_LABEL: &str = twc_crds::labels::DEPLOYMENT_NAME;
/// Environment variable naming the metrics SD folder in every pod (read by the sample worker).
pub const METRICS_SD_DIR_VAR: &str = "SAMPLE_METRICS_SD_DIR";
/// How often every Deployment is reconciled and its status recomputed.
const RESYNC_PERIOD: Duration = Duration::from_secs(1);

/// Settings of the pod runner.
#[derive(Debug, Clone)]
pub struct PodRunnerConfig {
    /// YAML table mapping container images to local binaries (`examples/images.yaml`).
    pub images_file: PathBuf,
    /// Folders where the binaries named in the image table are looked up, in order.
    pub bin_dirs: Vec<PathBuf>,
    /// Folder for per-pod working directories, materialized secret volumes and logs.
    pub work_dir: PathBuf,
    /// Folder of Prometheus file_sd target files, given to every pod as [`METRICS_SD_DIR_VAR`].
    pub metrics_sd_dir: Option<PathBuf>,
}

/// The file_sd file a pod's process `pid` writes into the metrics SD folder `dir`.
pub fn metrics_target_file(dir: &std::path::Path, pod: &str, pid: u32) -> PathBuf {
    dir.join(format!("{pod}-{pid}.json"))
}

/// Why the pod runner could not start.
#[derive(Debug, thiserror::Error)]
pub enum PodRunnerError {
    /// The image table could not be loaded.
    #[error(transparent)]
    Images(#[from] images::ImagesError),
    /// The work folder could not be created.
    #[error("cannot create work folder {path}")]
    WorkDir {
        /// The folder.
        path: PathBuf,
        /// The I/O failure.
        #[source]
        source: std::io::Error,
    },
    /// The process-spawning thread could not be started.
    #[error("cannot start the pod spawner thread")]
    Spawner(#[source] std::io::Error),
}

/// Namespace and name of a Deployment.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeploymentKey {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl DeploymentKey {
    /// The key of a Deployment, if it has a namespace and a name.
    pub fn of(deployment: &Deployment) -> Option<Self> {
        Some(Self {
            namespace: deployment.metadata.namespace.clone()?,
            name: deployment.metadata.name.clone()?,
        })
    }
}

impl std::fmt::Display for DeploymentKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Runs until `shutdown` completes, then stops every process it started.
///
/// Fails only at start (image table, work folder, spawner thread); watch and API errors later on
/// are logged and retried.
pub async fn run(
    client: kube::Client,
    config: PodRunnerConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), PodRunnerError> {
    let images = ImageTable::load(&config.images_file)?;
    let work_dir_error = |source| PodRunnerError::WorkDir {
        path: config.work_dir.clone(),
        source,
    };
    tokio::fs::create_dir_all(&config.work_dir)
        .await
        .map_err(work_dir_error)?;
    // Absolute, because processes run in their pod folder and get rewritten absolute paths.
    let work_dir = tokio::fs::canonicalize(&config.work_dir)
        .await
        .map_err(work_dir_error)?;
    if let Some(dir) = &config.metrics_sd_dir {
        tokio::fs::create_dir_all(dir)
            .await
            .map_err(|source| PodRunnerError::WorkDir {
                path: dir.clone(),
                source,
            })?;
    }
    let spawner = Spawner::start().map_err(PodRunnerError::Spawner)?;
    let (changed_tx, mut changed_rx) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared {
        client: client.clone(),
        images,
        bin_dirs: config.bin_dirs.clone(),
        metrics_sd_dir: config.metrics_sd_dir.clone(),
        spawner,
        changed: changed_tx,
    });
    let mut runner = Runner::new(shared.clone(), work_dir.clone());
    let mut job_runner = jobs::JobRunner::new(shared, work_dir.clone());

    let deployments: Api<Deployment> = Api::all(client.clone());
    let watch_config = watcher::Config::default().labels(DEPLOYMENT_NAME_LABEL);
    let mut events = pin!(watcher(deployments, watch_config.clone()).default_backoff());
    let job_api: Api<Job> = Api::all(client);
    let mut job_events = pin!(watcher(job_api, watch_config).default_backoff());
    let mut shutdown = pin!(shutdown);
    let mut resync = tokio::time::interval(RESYNC_PERIOD);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    info!(
        images = %config.images_file.display(),
        bin_dirs = ?config.bin_dirs,
        work_dir = %work_dir.display(),
        metrics_sd_dir = ?config.metrics_sd_dir,
        "pod runner started"
    );

    loop {
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            event = events.next() => match event {
                Some(Ok(event)) => runner.handle(event).await,
                Some(Err(e)) => warn!("watching deployments failed (retrying with back-off): {e}"),
                None => {
                    warn!("deployment watch ended unexpectedly");
                    break;
                }
            },
            Some(key) = changed_rx.recv() => {
                let mut keys = BTreeSet::from([key]);
                while let Ok(key) = changed_rx.try_recv() {
                    keys.insert(key);
                }
                for key in keys {
                    runner.sync_status(&key).await;
                }
            }
            Some(result) = runner.tasks.join_next(), if !runner.tasks.is_empty() => {
                runner::log_task_end(result);
            }
            event = job_events.next() => match event {
                Some(Ok(event)) => job_runner.handle(event),
                Some(Err(e)) => warn!("watching jobs failed (retrying with back-off): {e}"),
                None => {
                    warn!("job watch ended unexpectedly");
                    break;
                }
            },
            Some(result) = job_runner.tasks.join_next(), if !job_runner.tasks.is_empty() => {
                match result {
                    Ok((key, uid)) => job_runner.ended(key, uid),
                    Err(e) => warn!("a job task failed: {e}"),
                }
            }
            _ = resync.tick() => runner.resync().await,
        }
    }
    job_runner.shutdown().await;
    runner.shutdown().await;
    info!("pod runner stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn run_future_can_be_spawned_on_a_multi_threaded_runtime() {
        fn assert_send<T: Send>(_: T) {}
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let runner_config = PodRunnerConfig {
            images_file: PathBuf::from("images.yaml"),
            bin_dirs: vec![],
            work_dir: PathBuf::from("work"),
            metrics_sd_dir: None,
        };
        assert_send(run(client, runner_config, async {}));
    }

    #[tokio::test]
    async fn missing_image_table_fails_at_start() {
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let runner_config = PodRunnerConfig {
            images_file: PathBuf::from("/nonexistent/images.yaml"),
            bin_dirs: vec![],
            work_dir: std::env::temp_dir().join("twc-podrunner-never-created"),
            metrics_sd_dir: None,
        };
        let result = run(client, runner_config, async {}).await;
        assert!(
            matches!(result, Err(PodRunnerError::Images(_))),
            "{result:?}"
        );
    }
}
