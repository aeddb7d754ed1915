//! A load generator: starts workflows at a steady rate, so a version being rolled out has
//! traffic to measure (canary analysis) while it ramps. Used by `twc-sandbox load`, and in the
//! background by tests and benchmarks through [`LoadGenerator`].
//!
//! Starts are scheduled by a Tokio interval and each runs on a task of its own, so a slow
//! answer from the server delays neither the next start nor the rate.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use temporalio_client::errors::ClientConnectError;
use temporalio_client::grpc::WorkflowService;
use temporalio_client::tonic::IntoRequest;
use temporalio_client::{Client, ClientOptions, ConnectionOptions, Url};
use temporalio_common::protos::temporal::api::common::v1::{Payload, Payloads, WorkflowType};
use temporalio_common::protos::temporal::api::taskqueue::v1::TaskQueue;
use temporalio_common::protos::temporal::api::workflowservice::v1::StartWorkflowExecutionRequest;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// Identity of the load generator's client, and prefix of its request IDs.
const IDENTITY: &str = "twc-sandbox-load";
/// Highest rate accepted, per second.
pub const MAX_RATE: f64 = 10_000.0;
/// How long one start may take before it counts as failed.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// What to start, where and how fast.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadConfig {
    /// Temporal frontend `host:port` (a leading `http://` is accepted).
    pub address: String,
    /// Temporal namespace.
    pub namespace: String,
    /// Task queue the workflows start on.
    pub task_queue: String,
    /// Workflow type name.
    pub workflow_type: String,
    /// Workflows started per second.
    pub rate: f64,
    /// How long to run; until [`LoadGenerator::stop`] when `None`.
    pub duration: Option<Duration>,
    /// Workflow IDs are `<id_prefix><n>`, n counting from 1.
    pub id_prefix: String,
    /// The workflows' single argument (a JSON payload), or none.
    pub input: Option<Value>,
}

impl LoadConfig {
    /// `HelloWorld` workflows on task queue `hello-world` of namespace `default` at `rate` per
    /// second, IDs `load-<n>`, no input, until stopped.
    pub fn new(address: impl Into<String>, rate: f64) -> Self {
        Self {
            address: address.into(),
            namespace: "default".to_owned(),
            task_queue: "hello-world".to_owned(),
            workflow_type: "HelloWorld".to_owned(),
            rate,
            duration: None,
            id_prefix: "load-".to_owned(),
            input: None,
        }
    }
}

/// What a load run did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadStats {
    /// Workflows the server accepted.
    pub started: u64,
    /// Starts the server rejected, that failed on the way or timed out.
    pub failed_to_start: u64,
    /// The most recent failure, if any.
    pub last_error: Option<String>,
    /// How long starts were sent: until the duration passed or the stop (so far, while running).
    pub sending: Duration,
    /// Time since the generator started, including the wait for the last answers.
    pub elapsed: Duration,
}

impl LoadStats {
    /// Workflows started per second of sending.
    pub fn achieved_rate(&self) -> f64 {
        let seconds = self.sending.as_secs_f64();
        if seconds > 0.0 {
            self.started as f64 / seconds
        } else {
            0.0
        }
    }
}

/// The load generator could not start or ended badly.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The rate is not a positive number up to [`MAX_RATE`].
    #[error("rate must be more than 0 and at most {MAX_RATE} per second, got {0}")]
    InvalidRate(f64),
    /// The address does not make a URL.
    #[error("invalid Temporal address {address:?}: {source}")]
    InvalidAddress {
        /// The address given.
        address: String,
        /// Why.
        source: url::ParseError,
    },
    /// The input cannot be encoded.
    #[error("encoding the workflow input: {0}")]
    Input(#[source] serde_json::Error),
    /// Connecting failed.
    #[error("connecting to Temporal at {address}: {source}")]
    Connect {
        /// The address.
        address: String,
        /// Why.
        source: ClientConnectError,
    },
    /// The generator's task panicked.
    #[error("the load generator task failed: {0}")]
    Task(#[source] tokio::task::JoinError),
}

/// Counters shared with the start tasks.
#[derive(Default)]
struct Counters {
    started: AtomicU64,
    failed: AtomicU64,
    last_error: Mutex<Option<String>>,
    /// How long starts were sent, once sending has ended.
    sending: Mutex<Option<Duration>>,
}

impl Counters {
    fn record_failure(&self, workflow_id: &str, error: String) {
        let earlier = self.failed.fetch_add(1, Ordering::Relaxed);
        if earlier == 0 {
            tracing::warn!(%workflow_id, "starting a workflow failed: {error}");
        } else {
            tracing::debug!(%workflow_id, "starting a workflow failed: {error}");
        }
        *self
            .last_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(error);
    }

    fn snapshot(&self, elapsed: Duration) -> LoadStats {
        let sending = *self
            .sending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        LoadStats {
            started: self.started.load(Ordering::Relaxed),
            failed_to_start: self.failed.load(Ordering::Relaxed),
            last_error: self
                .last_error
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
            sending: sending.unwrap_or(elapsed),
            elapsed,
        }
    }
}

/// A load run in the background.
pub struct LoadGenerator {
    counters: Arc<Counters>,
    began: Instant,
    stop: watch::Sender<bool>,
    done: watch::Receiver<bool>,
    task: JoinHandle<()>,
}

impl LoadGenerator {
    /// Connects to Temporal and starts the load on a background task (connection errors are
    /// returned here, not later).
    pub async fn start(config: LoadConfig) -> Result<Self, LoadError> {
        if !(config.rate.is_finite() && config.rate > 0.0 && config.rate <= MAX_RATE) {
            return Err(LoadError::InvalidRate(config.rate));
        }
        let input = config
            .input
            .as_ref()
            .map(json_payloads)
            .transpose()
            .map_err(LoadError::Input)?;
        let client = connect(&config).await?;
        let counters = Arc::new(Counters::default());
        let (stop, stopped) = watch::channel(false);
        let began = Instant::now();
        tracing::info!(
            address = %config.address,
            namespace = %config.namespace,
            task_queue = %config.task_queue,
            workflow_type = %config.workflow_type,
            rate = config.rate,
            duration = ?config.duration,
            id_prefix = %config.id_prefix,
            "load generator started"
        );
        let (done_tx, done) = watch::channel(false);
        let run = run(client, config, input, counters.clone(), stopped);
        let task = tokio::spawn(async move {
            run.await;
            done_tx.send_replace(true);
        });
        Ok(Self {
            counters,
            began,
            stop,
            done,
            task,
        })
    }

    /// What the run did so far.
    pub fn stats(&self) -> LoadStats {
        self.counters.snapshot(self.began.elapsed())
    }

    /// Completes once the run is over (its duration passed, or it was stopped), keeping the
    /// generator for [`Self::stats`] and [`Self::stop`].
    pub async fn wait_done(&self) {
        let mut done = self.done.clone();
        // An error means the task is gone: done as well.
        let _ = done.wait_for(|done| *done).await;
    }

    /// Waits until the configured duration has passed and the last starts were answered (never
    /// returns for a run without a duration: use [`Self::stop`]).
    pub async fn finished(mut self) -> Result<LoadStats, LoadError> {
        (&mut self.task).await.map_err(LoadError::Task)?;
        Ok(self.stats())
    }

    /// Stops starting workflows, waits for the starts under way, and returns what the run did.
    pub async fn stop(self) -> Result<LoadStats, LoadError> {
        self.stop.send_replace(true);
        self.finished().await
    }
}

impl Drop for LoadGenerator {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn connect(config: &LoadConfig) -> Result<Client, LoadError> {
    let host_port = config
        .address
        .strip_prefix("http://")
        .unwrap_or(&config.address);
    let url =
        Url::parse(&format!("http://{host_port}")).map_err(|source| LoadError::InvalidAddress {
            address: config.address.clone(),
            source,
        })?;
    let connection = ConnectionOptions::new(url)
        .identity(IDENTITY.to_owned())
        .connect_timeout(CONNECT_TIMEOUT)
        .build();
    Client::connect(
        connection,
        ClientOptions::new(config.namespace.clone()).build(),
    )
    .await
    .map_err(|source| LoadError::Connect {
        address: config.address.clone(),
        source,
    })
}

/// A single JSON argument, encoded as the `temporal` CLI encodes `--input`.
fn json_payloads(value: &Value) -> Result<Payloads, serde_json::Error> {
    Ok(Payloads {
        payloads: vec![Payload {
            metadata: [("encoding".to_owned(), b"json/plain".to_vec())].into(),
            data: serde_json::to_vec(value)?,
            ..Default::default()
        }],
    })
}

/// Starts the configured workflows until stopped or the duration has passed.
async fn run(
    client: Client,
    config: LoadConfig,
    input: Option<Payloads>,
    counters: Arc<Counters>,
    stopped: watch::Receiver<bool>,
) {
    // Request IDs must differ between runs that reuse an ID prefix (the server deduplicates
    // starts by request ID).
    let run_nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let start = |n: u64| {
        let workflow_id = format!("{}{n}", config.id_prefix);
        let request = StartWorkflowExecutionRequest {
            namespace: config.namespace.clone(),
            workflow_id: workflow_id.clone(),
            workflow_type: Some(WorkflowType {
                name: config.workflow_type.clone(),
            }),
            task_queue: Some(TaskQueue {
                name: config.task_queue.clone(),
                ..Default::default()
            }),
            input: input.clone(),
            identity: IDENTITY.to_owned(),
            request_id: format!("{IDENTITY}-{run_nonce:x}-{workflow_id}"),
            ..Default::default()
        };
        start_one(client.clone(), request, counters.clone())
    };
    let began = Instant::now();
    let mut starts = tick_at_rate(config.rate, config.duration, stopped, start).await;
    *counters
        .sending
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(began.elapsed());
    // Every start has its own timeout, so this ends.
    while starts.join_next().await.is_some() {}
}

/// Calls `start(n)` for n = 1, 2, ... on a Tokio interval of `rate` per second, each on a task
/// of its own, until `stopped` or `duration` has passed; returns the tasks still running.
async fn tick_at_rate<F, Fut>(
    rate: f64,
    duration: Option<Duration>,
    mut stopped: watch::Receiver<bool>,
    mut start: F,
) -> JoinSet<()>
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let deadline = duration.map(|d| Instant::now() + d);
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    // A late tick (a busy runtime) is made up at once, so the count matches rate × time.
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut starts = JoinSet::new();
    let mut n: u64 = 0;
    loop {
        tokio::select! {
            biased;
            _ = stopped.wait_for(|stop| *stop) => break,
            () = sleep_until(deadline) => break,
            _ = ticks.tick() => {
                n += 1;
                starts.spawn(start(n));
            }
            Some(_) = starts.join_next(), if !starts.is_empty() => {}
        }
    }
    starts
}

/// Completes at `deadline`, never without one.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

async fn start_one(
    mut client: Client,
    request: StartWorkflowExecutionRequest,
    counters: Arc<Counters>,
) {
    let workflow_id = request.workflow_id.clone();
    let call = WorkflowService::start_workflow_execution(&mut client, request.into_request());
    match tokio::time::timeout(START_TIMEOUT, call).await {
        Ok(Ok(_)) => {
            counters.started.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Err(status)) => counters.record_failure(
            &workflow_id,
            format!("{:?}: {}", status.code(), status.message()),
        ),
        Err(_) => counters.record_failure(
            &workflow_id,
            format!("no answer within {}s", START_TIMEOUT.as_secs()),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn rates_outside_the_range_are_rejected_before_connecting() {
        for rate in [0.0, -1.0, f64::NAN, f64::INFINITY, MAX_RATE * 2.0] {
            let config = LoadConfig::new("127.0.0.1:9", rate);
            match LoadGenerator::start(config).await {
                Err(LoadError::InvalidRate(_)) => {}
                Err(e) => panic!("rate {rate}: {e}"),
                Ok(_) => panic!("rate {rate} accepted"),
            }
        }
    }

    /// Counts the starts of a run of `tick_at_rate` (on paused, auto-advancing time).
    async fn count_starts(
        rate: f64,
        duration: Option<Duration>,
        stopped: watch::Receiver<bool>,
    ) -> Vec<u64> {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let mut starts = tick_at_rate(rate, duration, stopped, move |n| {
            let record = record.clone();
            async move {
                // A slow server: answers take longer than the tick period.
                tokio::time::sleep(Duration::from_secs(1)).await;
                record.lock().unwrap_or_else(|e| e.into_inner()).push(n);
            }
        })
        .await;
        while starts.join_next().await.is_some() {}
        let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
        seen.sort_unstable();
        seen
    }

    #[tokio::test(start_paused = true)]
    async fn starts_rate_times_duration_workflows_however_slow_the_answers() {
        let (_stop, stopped) = watch::channel(false);
        let began = Instant::now();
        let seen = count_starts(5.0, Some(Duration::from_secs(20)), stopped).await;
        assert_eq!(seen, (1..=100).collect::<Vec<u64>>());
        // The last start was sent before the deadline and answered a second later.
        assert!(
            began.elapsed() <= Duration::from_secs(21),
            "{:?}",
            began.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_ends_a_run_without_duration() {
        let (stop, stopped) = watch::channel(false);
        let stopper = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(950)).await;
            stop.send_replace(true);
        });
        let seen = count_starts(10.0, None, stopped).await;
        // Ticks at 0, 100, ..., 900 ms.
        assert_eq!(seen.len(), 10, "{seen:?}");
        assert!(stopper.await.is_ok());
    }

    #[test]
    fn input_is_one_json_payload() {
        let payloads = json_payloads(&serde_json::json!("Ada")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(payloads.payloads.len(), 1);
        assert_eq!(payloads.payloads[0].data, b"\"Ada\"");
        assert_eq!(
            payloads.payloads[0]
                .metadata
                .get("encoding")
                .map(Vec::as_slice),
            Some(&b"json/plain"[..])
        );
    }

    #[test]
    fn achieved_rate_is_started_per_second() {
        let stats = LoadStats {
            started: 100,
            sending: Duration::from_secs(20),
            elapsed: Duration::from_secs(27),
            ..Default::default()
        };
        assert!((stats.achieved_rate() - 5.0).abs() < 1e-9);
        assert!(LoadStats::default().achieved_rate().abs() < 1e-9);
    }
}
