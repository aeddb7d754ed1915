//! Sample Temporal worker, versioned with Worker Versioning, used to exercise the controller.
//!
//! See README.md for the environment variables and workflow types.

mod config;
mod failure;
mod metrics;
mod replay;
mod workflows;

use std::{process::ExitCode, sync::Arc, time::Duration};

use anyhow::{Context, Result};
use temporalio_client::{
    Client, ClientOptions, ClientTlsOptions, Connection, ConnectionOptions, TlsOptions, Url,
};
use temporalio_common::worker::{WorkerDeploymentOptions, WorkerDeploymentVersion};
use temporalio_sdk::runtime::worker_tuner::{FixedSizeSlotSupplier, TunerHolder};
use temporalio_sdk::{Runtime, Worker, WorkerOptions};
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::mpsc,
};
use tracing::{error, info, warn};
use tracing_subscriber::EnvFilter;

use crate::{
    config::{Config, env_flag},
    metrics::{GreetingMetrics, Instance},
    workflows::{
        GateFail, GatePass, Greeter, HelloWorld, RolloutGate, Sleeper, Stubborn, Subscription,
    },
};

/// Exit code for configuration errors.
const EXIT_CONFIG: u8 = 2;
/// Exit code for runtime failures (and `SAMPLE_CRASH_AT_START`).
const EXIT_FAILURE: u8 = 1;
/// How long to wait for the server connection before giving up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

#[tokio::main]
async fn main() -> ExitCode {
    init_logging();

    match env_flag("SAMPLE_CRASH_AT_START") {
        Ok(true) => {
            error!("SAMPLE_CRASH_AT_START is set: exiting with code 1 on purpose");
            return ExitCode::from(EXIT_FAILURE);
        }
        Ok(false) => {}
        Err(e) => {
            error!("configuration error: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    }

    let config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            error!("configuration error: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    match std::env::args().nth(1).as_deref() {
        None => {}
        Some("replay") => return replay::main(config).await,
        Some(other) => {
            error!("unknown subcommand '{other}': the only one is 'replay' (none runs the worker)");
            return ExitCode::from(EXIT_CONFIG);
        }
    }

    info!(
        address = %config.address,
        namespace = %config.namespace,
        deployment_name = %config.deployment_name,
        build_id = %config.build_id,
        task_queues = %config.task_queues.join(","),
        versioning_behavior = ?config.versioning_behavior,
        tls = config.tls.is_some(),
        api_key = config.api_key.is_some(),
        fail_gate = config.fail_gate,
        fail_share = config.fail_share.percent(),
        metrics = ?config.metrics,
        "starting sample worker"
    );

    match run(config).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("sample worker failed: {e:#}");
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

fn init_logging() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
}

/// Resolves when SIGTERM or SIGINT arrives.
struct ShutdownSignal {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl ShutdownSignal {
    fn install() -> Result<Self> {
        Ok(Self {
            term: signal(SignalKind::terminate()).context("installing SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("installing SIGINT handler")?,
        })
    }

    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

async fn run(config: Config) -> Result<()> {
    let mut shutdown = ShutdownSignal::install()?;
    let greeting_metrics = Arc::new(GreetingMetrics::new(&config.build_id));
    // Held until `run` returns: serving stops and the target file is removed then.
    let _metrics_server = match &config.metrics {
        Some(metrics_config) => {
            let pod = instance_name();
            let instance = Instance {
                pod: &pod,
                deployment: &config.deployment_name,
                build_id: &config.build_id,
            };
            let server =
                metrics::serve(metrics_config, greeting_metrics.clone(), &instance).await?;
            info!(address = %server.address, "serving /metrics");
            Some(server)
        }
        None => None,
    };

    if config.never_poll {
        warn!("SAMPLE_NEVER_POLL is set: not connecting to Temporal, idling until SIGTERM/SIGINT");
        let sig = shutdown.recv().await;
        info!("received {sig}, exiting");
        return Ok(());
    }

    let client = tokio::select! {
        client = connect(&config) => client?,
        sig = shutdown.recv() => {
            info!("received {sig} while connecting, exiting");
            return Ok(());
        }
    };
    info!(url = %config.url(), "connected to Temporal");
    if let Some(path) = config.api_key_path.clone() {
        tokio::spawn(follow_api_key_file(
            client.connection().clone(),
            path,
            config.api_key.clone(),
        ));
    }

    let runtime = Runtime::from_current_tokio(Default::default())
        .context("creating the Temporal SDK runtime")?;

    let mut workers = Vec::with_capacity(config.task_queues.len());
    for task_queue in &config.task_queues {
        let options = worker_options(&config, task_queue, &greeting_metrics)
            .with_context(|| format!("building worker options for task queue '{task_queue}'"))?;
        let worker = Worker::new(&runtime, client.clone(), options)
            .with_context(|| format!("creating worker for task queue '{task_queue}'"))?;
        workers.push(worker);
    }

    // `Worker::run` is not `Send`, so all workers run as local tasks on this thread.
    tokio::task::LocalSet::new()
        .run_until(run_workers(workers, shutdown))
        .await
}

/// How often the API key file is re-read (a kubelet refreshes Secret volumes within a minute).
const API_KEY_RECHECK: Duration = Duration::from_secs(2);

/// Re-reads the API key file and hands a changed key to the connection, which uses it on the
/// next call: a key rotated in its Secret reaches a running worker without a restart.
async fn follow_api_key_file(connection: Connection, path: String, mut current: Option<String>) {
    let mut ticks = tokio::time::interval(API_KEY_RECHECK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        match config::read_api_key(&path) {
            Ok(key) if current.as_deref() != Some(key.as_str()) => {
                info!(path = %path, "API key file changed; using the new key");
                connection.set_api_key(Some(key.clone()));
                current = Some(key);
            }
            Ok(_) => {}
            // Mid-rotation the file can be briefly missing; keep the key in use.
            Err(e) => warn!("keeping the API key in use: {e}"),
        }
    }
}

async fn connect(config: &Config) -> Result<Client> {
    let url = Url::parse(&config.url()).with_context(|| format!("invalid URL {}", config.url()))?;
    let tls = config.tls.as_ref().map(|tls| {
        TlsOptions::builder()
            .maybe_server_root_ca_cert(tls.server_ca_pem.clone())
            .maybe_domain(tls.server_name.clone())
            .maybe_client_tls_options(tls.client_cert.as_ref().map(|c| {
                ClientTlsOptions::builder()
                    .client_cert(c.cert_pem.clone())
                    .client_private_key(c.key_pem.clone())
                    .build()
            }))
            .build()
    });
    let connection_options = ConnectionOptions::new(url)
        .identity(format!(
            "sample-worker/{}@{}",
            config.build_id,
            instance_name()
        ))
        .maybe_tls_options(tls)
        .maybe_api_key(config.api_key.clone())
        .connect_timeout(CONNECT_TIMEOUT)
        .build();
    let connection = Connection::connect(connection_options)
        .await
        .with_context(|| format!("connecting to Temporal at {}", config.address))?;
    Client::new(
        connection,
        ClientOptions::new(config.namespace.clone()).build(),
    )
    .context("creating the Temporal client")
}

/// The pod name (`POD_NAME`, then `HOSTNAME`, as a container sees it), else the host name.
fn instance_name() -> String {
    ["POD_NAME", "HOSTNAME"]
        .into_iter()
        .find_map(|key| std::env::var(key).ok().filter(|v| !v.trim().is_empty()))
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

/// Registers every workflow type of the sample on `builder` (a worker's options, or the `replay`
/// subcommand's replayer: both must know the same types, configured the same way), with `?` on
/// each registration.
macro_rules! register_workflows {
    ($builder:expr, $config:expr) => {{
        let fail_gate = $config.fail_gate;
        let variant = $config.nondeterministic;
        $builder
            .register_workflow_with_factory::<HelloWorld, _>(move || {
                HelloWorld::new(variant.hello_world)
            })?
            .register_workflow_with_factory::<RolloutGate, _>(move || RolloutGate::new(fail_gate))?
            .register_workflow::<GatePass>()?
            .register_workflow::<GateFail>()?
            .register_workflow_with_factory::<Sleeper, _>(move || Sleeper::new(variant.sleeper))?
            .register_workflow::<Subscription>()?
            .register_workflow::<Stubborn>()?
    }};
}
pub(crate) use register_workflows;

fn worker_options(
    config: &Config,
    task_queue: &str,
    metrics: &Arc<GreetingMetrics>,
) -> Result<WorkerOptions> {
    let version = WorkerDeploymentVersion::builder()
        .deployment_name(config.deployment_name.clone())
        .build_id(config.build_id.clone())
        .build();
    // A versioned worker must always have a default versioning behavior: this SDK cannot set one
    // per workflow, and without it the server loops on empty workflow tasks.
    let deployment = WorkerDeploymentOptions::new(version)
        .use_worker_versioning(true)
        .default_versioning_behavior(config.versioning_behavior)
        .build();
    let options = WorkerOptions::new(task_queue)
        .deployment_options(deployment)
        .graceful_shutdown_period(Duration::from_secs(10))
        .tuner(activity_slots(config.activity_slots))
        .register_activities(Greeter {
            build_id: config.build_id.clone(),
            fail_share: config.fail_share,
            metrics: metrics.clone(),
            delay: Duration::from_millis(config.greet_delay_ms),
        });
    let options = register_workflows!(options, config).build();
    Ok(options)
}

/// The SDK's default slots (100 of each kind), with `activities` activity slots.
fn activity_slots(activities: usize) -> TunerHolder {
    TunerHolder::builder()
        .workflow_task_slot_supplier(FixedSizeSlotSupplier::new(100))
        .activity_task_slot_supplier(FixedSizeSlotSupplier::new(activities))
        .local_activity_task_slot_supplier(FixedSizeSlotSupplier::new(100))
        .nexus_task_slot_supplier(FixedSizeSlotSupplier::new(100))
        .build()
}

/// Runs every worker until a shutdown signal arrives or one of them stops, then shuts all of them
/// down and waits for them to finish.
async fn run_workers(workers: Vec<Worker>, mut shutdown: ShutdownSignal) -> Result<()> {
    let count = workers.len();
    let (done_tx, mut done_rx) = mpsc::unbounded_channel();
    let mut stop_handles: Vec<Arc<dyn Fn()>> = Vec::with_capacity(count);
    for mut worker in workers {
        stop_handles.push(Arc::new(worker.shutdown_handle()));
        let done_tx = done_tx.clone();
        tokio::task::spawn_local(async move {
            let task_queue = worker.task_queue().to_owned();
            info!(%task_queue, "worker polling");
            let result = worker.run().await;
            // The receiver outlives every worker task; a failed send only means main is gone.
            let _ = done_tx.send((task_queue, result));
        });
    }
    drop(done_tx);

    let mut failures = Vec::new();
    let mut finished = 0usize;
    tokio::select! {
        sig = shutdown.recv() => info!("received {sig}, shutting down workers"),
        Some((task_queue, result)) = done_rx.recv() => {
            finished += 1;
            match result {
                Ok(()) => {
                    error!(%task_queue, "worker stopped unexpectedly, shutting down the others");
                    failures.push(format!("{task_queue}: worker stopped unexpectedly"));
                }
                Err(e) => {
                    error!(%task_queue, "worker failed: {e}");
                    failures.push(format!("{task_queue}: {e}"));
                }
            }
        }
    }
    for stop in &stop_handles {
        stop();
    }
    while finished < count {
        let Some((task_queue, result)) = done_rx.recv().await else {
            break;
        };
        finished += 1;
        match result {
            Ok(()) => info!(%task_queue, "worker shut down"),
            Err(e) => {
                error!(%task_queue, "worker failed during shutdown: {e}");
                failures.push(format!("{task_queue}: {e}"));
            }
        }
    }
    if failures.is_empty() {
        info!("all workers stopped, exiting");
        Ok(())
    } else {
        anyhow::bail!("worker(s) failed: {}", failures.join("; "))
    }
}
