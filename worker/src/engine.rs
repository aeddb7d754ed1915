//! The engine's own Temporal: where the rollout workflows run (not the workers' Temporal, which
//! activities reach through each TWD's TemporalConnection).

use std::path::PathBuf;
use std::time::Duration;

use temporalio_client::{
    Client, ClientOptions, ClientTlsOptions, Connection, ConnectionOptions, TlsOptions, Url,
};
use temporalio_sdk::runtime::PollerBehavior;
use temporalio_sdk::runtime::worker_tuner::{FixedSizeSlotSupplier, TunerHolder};
use temporalio_sdk::{Runtime, Worker, WorkerOptions};
use twc_activities::engine::EngineActivities;
use twc_workflows::notify_workflow::NotifyWorkflow;
use twc_workflows::rollout_workflow::RolloutWorkflow;
use twc_workflows::twd_workflow::TwdWorkflow;

use crate::traces::activity::ActivitySpans;
use crate::traces::workflow::run_spans;

/// How to reach the engine namespace.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// `host:port` of the engine's Temporal frontend.
    pub address: String,
    /// Engine namespace.
    pub namespace: String,
    /// Task queue of the engine's workflows and activities.
    pub task_queue: String,
    /// Client identity (also the manager identity claimed on worker deployments).
    pub identity: String,
    /// API key, if the engine namespace needs one (turns TLS on).
    pub api_key: Option<String>,
    /// TLS settings, if any.
    pub tls: Option<EngineTls>,
    /// Workflows kept in memory between their tasks (least recently used evicted first); an
    /// evicted workflow is replayed from its history at its next task.
    pub max_cached_workflows: usize,
    /// Where run and activity spans go ([`crate::traces`]); `None` records none.
    pub traces: Option<crate::traces::Traces>,
    /// Waiting activities (`wait_for_pollers`, `run_gate`) run at once on the waits task queue
    /// ([`twc_workflows::waits_task_queue`]), in slots of their own.
    pub max_concurrent_waits: usize,
}

/// Default of [`EngineConfig::max_cached_workflows`]: the rollouts in flight and the TWD
/// workflows that woke recently stay cached; an idle TWD workflow, which wakes every few
/// minutes, is replayed from its (short) history instead. A cached workflow costs 0.1-0.2 MiB of
/// the controller's heap; 50 rather than 100 took the idle RSS at 200 TWDs from 74.5 to 63-66 MiB
/// and the peak of a burst of 100 from 76.1 to 71.1 MiB, with the burst's latency and the idle
/// CPU level (BENCHMARKS.md, "... the engine's workflow cache"): past the cache's size, a fleet's
/// periodic wakes replay nearly every time either way: least-recently-used eviction of wakes
/// that come round in turn evicts each workflow before its next wake.
pub const DEFAULT_MAX_CACHED_WORKFLOWS: usize = 50;

/// Workflow-task polls open at once (half on the normal queue, half on this worker's sticky
/// queue).
const WORKFLOW_TASK_POLLS: usize = 16;

/// Default of [`EngineConfig::max_concurrent_waits`]: a wait costs a watch and a timer, not a
/// thread, so a burst of a thousand rollouts waits at once.
pub const DEFAULT_MAX_CONCURRENT_WAITS: u32 = 1000;

/// TLS settings of the engine connection.
#[derive(Debug, Clone, Default)]
pub struct EngineTls {
    /// Client certificate (PEM) for mTLS.
    pub client_cert: Option<PathBuf>,
    /// Client key (PEM) for mTLS.
    pub client_key: Option<PathBuf>,
    /// CA bundle (PEM) to trust instead of the system roots.
    pub ca_cert: Option<PathBuf>,
    /// Server name for SNI and verification.
    pub server_name: Option<String>,
}

/// Starting the engine worker failed.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// Bad address.
    #[error("invalid engine address {address:?}: {message}")]
    Address {
        /// What was given.
        address: String,
        /// Parser message.
        message: String,
    },
    /// A TLS file could not be read.
    #[error("reading {path}: {source}")]
    TlsFile {
        /// File.
        path: PathBuf,
        /// I/O error.
        source: std::io::Error,
    },
    /// Could not connect.
    #[error("connecting to the engine Temporal at {address}: {message}")]
    Connect {
        /// Address.
        address: String,
        /// Client error.
        message: String,
    },
    /// The worker could not be built or failed.
    #[error("engine worker: {0}")]
    Worker(String),
}

/// Connects to the engine namespace.
pub async fn connect_engine(config: &EngineConfig) -> Result<Client, WorkerError> {
    let tls_on = config.tls.is_some() || config.api_key.is_some();
    let scheme = if tls_on { "https" } else { "http" };
    let url = Url::parse(&format!("{scheme}://{}", config.address)).map_err(|e| {
        WorkerError::Address {
            address: config.address.clone(),
            message: e.to_string(),
        }
    })?;
    let tls = match (&config.tls, tls_on) {
        (Some(tls), _) => Some(tls_options(tls)?),
        (None, true) => Some(TlsOptions::builder().build()),
        (None, false) => None,
    };
    let options = ConnectionOptions::new(url)
        .identity(config.identity.clone())
        .maybe_tls_options(tls)
        .maybe_api_key(config.api_key.clone())
        .connect_timeout(Duration::from_secs(15))
        .build();
    let connect_error = |message: String| WorkerError::Connect {
        address: config.address.clone(),
        message,
    };
    let connection = Connection::connect(options)
        .await
        .map_err(|e| connect_error(e.to_string()))?;
    Client::new(
        connection,
        ClientOptions::new(config.namespace.clone()).build(),
    )
    .map_err(|e| connect_error(e.to_string()))
}

fn tls_options(tls: &EngineTls) -> Result<TlsOptions, WorkerError> {
    let read = |path: &PathBuf| {
        std::fs::read(path).map_err(|source| WorkerError::TlsFile {
            path: path.clone(),
            source,
        })
    };
    let ca = tls.ca_cert.as_ref().map(read).transpose()?;
    let client = match (&tls.client_cert, &tls.client_key) {
        (Some(cert), Some(key)) => Some(
            ClientTlsOptions::builder()
                .client_cert(read(cert)?)
                .client_private_key(read(key)?)
                .build(),
        ),
        _ => None,
    };
    Ok(TlsOptions::builder()
        .maybe_server_root_ca_cert(ca)
        .maybe_domain(tls.server_name.clone())
        .maybe_client_tls_options(client)
        .build())
}

/// Runs the engine worker (workflows + activities) until `shutdown` completes.
pub async fn run_engine_worker(
    client: Client,
    config: &EngineConfig,
    activities: EngineActivities,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), WorkerError> {
    run_engine_worker_reporting(client, config, activities, || {}, shutdown).await
}

/// [`run_engine_worker`], calling `running` once the worker is built and enters its polling
/// loop (readiness of `twc run`).
pub async fn run_engine_worker_reporting(
    client: Client,
    config: &EngineConfig,
    activities: EngineActivities,
    running: impl FnOnce(),
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), WorkerError> {
    let runtime = Runtime::from_current_tokio(Default::default())
        .map_err(|e| WorkerError::Worker(e.to_string()))?;
    let worker_error = |e: &dyn std::fmt::Display| WorkerError::Worker(e.to_string());
    let options = WorkerOptions::new(config.task_queue.clone())
        .graceful_shutdown_period(Duration::from_secs(5))
        .max_cached_workflows(config.max_cached_workflows)
        // Activities heartbeat every second against a 5 s heartbeat timeout (so a killed
        // controller's activity is retried within seconds); the SDK would otherwise send only
        // every 4 s (0.8 x the timeout), leaving about 1 s of margin.
        .max_heartbeat_throttle_interval(Duration::from_secs(2))
        // A burst of changes is a burst of workflow tasks on both queues at once (new rollouts
        // start on the normal one, cached TWD workflows continue on the sticky one): the
        // SDK's default of 5 polls, one of them normal, left tasks waiting for a poll.
        .workflow_task_poller_behavior(PollerBehavior::SimpleMaximum(WORKFLOW_TASK_POLLS))
        .nonsticky_to_sticky_poll_ratio(0.5)
        .register_activities(activities.clone())
        .register_workflow::<TwdWorkflow>()
        .map_err(|e| worker_error(&e))?
        .register_workflow::<RolloutWorkflow>()
        .map_err(|e| worker_error(&e))?
        .register_workflow::<NotifyWorkflow>()
        .map_err(|e| worker_error(&e))?;
    // The waits queue's worker: activities only, with slots of their own, so waiting rollouts
    // never hold the slots of the engine queue's quick activities.
    let waits_tuner = TunerHolder::builder()
        .workflow_task_slot_supplier(FixedSizeSlotSupplier::new(1))
        .activity_task_slot_supplier(FixedSizeSlotSupplier::new(
            config.max_concurrent_waits.max(1),
        ))
        .local_activity_task_slot_supplier(FixedSizeSlotSupplier::new(1))
        .nexus_task_slot_supplier(FixedSizeSlotSupplier::new(1))
        .build();
    let waits_options = WorkerOptions::new(twc_workflows::waits_task_queue(&config.task_queue))
        .graceful_shutdown_period(Duration::from_secs(5))
        .max_heartbeat_throttle_interval(Duration::from_secs(2))
        .tuner(waits_tuner)
        .register_activities(activities);
    let (options, waits_options) = match &config.traces {
        Some(traces) => (
            options
                .activity_inbound_interceptor(ActivitySpans::new(traces.clone()))
                .workflow_interceptor(run_spans(traces.clone()))
                .build(),
            waits_options
                .activity_inbound_interceptor(ActivitySpans::new(traces.clone()))
                .build(),
        ),
        None => (options.build(), waits_options.build()),
    };
    let mut worker =
        Worker::new(&runtime, client.clone(), options).map_err(|e| worker_error(&e))?;
    let mut waits_worker =
        Worker::new(&runtime, client, waits_options).map_err(|e| worker_error(&e))?;
    let shutdown_handle = worker.shutdown_handle();
    let waits_shutdown_handle = waits_worker.shutdown_handle();
    running();
    let run = async {
        let running = async {
            let (engine, waits) = tokio::join!(worker.run(), waits_worker.run());
            engine.and(waits)
        };
        tokio::pin!(running);
        let result = tokio::select! {
            result = &mut running => result,
            () = shutdown => {
                shutdown_handle();
                waits_shutdown_handle();
                running.await
            }
        };
        result.map_err(|e| worker_error(&e))
    };
    tokio::task::LocalSet::new().run_until(run).await
}
