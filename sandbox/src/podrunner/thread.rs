//! The pod runner on a thread of its own, with its own Tokio runtime: it keeps running pods
//! whatever the caller's runtime does (a test's single-threaded runtime only runs spawned tasks
//! while the test awaits), and its end is observable instead of silent.

use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::oneshot;

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
    /// Starts the pod runner against the API server of `kubeconfig`.
    pub fn start(kubeconfig: PathBuf, config: PodRunnerConfig) -> std::io::Result<Self> {
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let (done_tx, done_rx) = oneshot::channel();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(RUNTIME_THREADS)
            .thread_name("pod-runner")
            .enable_all()
            .build()?;
        let thread = std::thread::Builder::new()
            .name("pod-runner-main".into())
            .spawn(move || {
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
