//! The pod runner on a thread of its own, with its own Tokio runtime: it keeps running pods
//! whatever the caller's runtime does (a test's single-threaded runtime only runs spawned tasks
//! while the test awaits), and its end is observable instead of silent.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::oneshot;
use tracing::Dispatch;

use crate::apiserver;
use crate::podrunner::{self, PodRunnerConfig};

/// Worker threads of the pod runner's runtime.
const RUNTIME_THREADS: usize = 2;

/// A pod runner running on its own thread.
pub struct PodRunnerThread {
    stop: Option<oneshot::Sender<()>>,
    done: oneshot::Receiver<Result<(), String>>,
    /// How it ended, once it has.
    ended: Option<String>,
    thread: Option<JoinHandle<()>>,
}

impl PodRunnerThread {
    /// Starts the pod runner against the API server of `kubeconfig`. When the process has no
    /// global tracing subscriber (a test binary starting a private sandbox), the pod runner's
    /// log goes to `log` instead of nowhere.
    pub fn start(
        kubeconfig: PathBuf,
        config: PodRunnerConfig,
        log: &Path,
    ) -> std::io::Result<Self> {
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let (done_tx, done_rx) = oneshot::channel();
        let dispatch = if tracing::dispatcher::has_been_set() {
            None
        } else {
            Some(file_dispatch(log)?)
        };
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder
            .worker_threads(RUNTIME_THREADS)
            .thread_name("pod-runner")
            .enable_all();
        if let Some(dispatch) = dispatch.clone() {
            // The runtime's threads live as long as the runtime, so the default they set is
            // never to be restored: the guard is forgotten rather than dropped at once.
            builder.on_thread_start(move || {
                std::mem::forget(tracing::dispatcher::set_default(&dispatch));
            });
        }
        let runtime = builder.build()?;
        let thread = std::thread::Builder::new()
            .name("pod-runner-main".into())
            .spawn(move || {
                let _default = dispatch.as_ref().map(tracing::dispatcher::set_default);
                let result = runtime.block_on(async move {
                    let client = apiserver::client(&kubeconfig)
                        .await
                        .map_err(|e| e.to_string())?;
                    podrunner::run(client, config, async {
                        let _ = stop_rx.await;
                    })
                    .await
                    .map_err(|e| format!("{e:#}"))
                });
                runtime.shutdown_timeout(Duration::from_secs(5));
                if let Err(e) = &result {
                    tracing::error!("pod runner ended: {e}");
                }
                let _ = done_tx.send(result);
            })?;
        Ok(Self {
            stop: Some(stop_tx),
            done: done_rx,
            ended: None,
            thread: Some(thread),
        })
    }

    /// How the pod runner ended, if it has (it only ends when stopped, or on an error).
    pub fn ended(&mut self) -> Option<String> {
        if self.ended.is_none() {
            self.ended = match self.done.try_recv() {
                Ok(Ok(())) => Some("stopped".to_owned()),
                Ok(Err(e)) => Some(e),
                Err(oneshot::error::TryRecvError::Empty) => None,
                Err(oneshot::error::TryRecvError::Closed) => Some("its thread panicked".to_owned()),
            };
        }
        self.ended.clone()
    }

    /// Stops the pod runner (and its pods) and waits up to `grace` for it.
    pub async fn stop(&mut self, grace: Duration) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if self.ended.is_none() {
            match tokio::time::timeout(grace, &mut self.done).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) => tracing::warn!("pod runner ended with an error: {e}"),
                Ok(Err(_)) => tracing::warn!("pod runner thread panicked"),
                Err(_) => {
                    tracing::warn!("pod runner did not stop within {grace:?}");
                    return;
                }
            }
        }
        if let Some(thread) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }
}

/// A subscriber writing plain lines (no colours) to `path`, appended.
fn file_dispatch(path: &Path) -> std::io::Result<Dispatch> {
    let file = File::options().create(true).append(true).open(path)?;
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube=warn".into()),
        )
        .with_ansi(false)
        .with_writer(Arc::new(file))
        .finish();
    Ok(Dispatch::new(subscriber))
}
