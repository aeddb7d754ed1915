//! `twc run`: the controller process.

// The observability modules belong to `twc run`; declared here rather than in main.rs.
#[path = "memory.rs"]
mod memory;
#[path = "telemetry/mod.rs"]
pub mod telemetry;

use std::sync::Arc;

use anyhow::Context;
use tokio::signal::unix::{SignalKind, signal};
use twc_activities::engine::EngineActivities;
use twc_activities::k8s::ClusterAccess;
use twc_activities::metrics::Metrics;
use twc_worker::{connect_engine, run_engine_worker_reporting};

use self::telemetry::{BindAddress, Health, Task};
use crate::cli::engine::EngineArgs;
use crate::resource_templates::admission::Admission;
use crate::resource_templates::controller::{self as templates, TemplatesConfig};
use crate::resource_templates::webhook::{self, WebhookConfig};
use crate::watcher::{self, WatcherConfig};

/// Flags of `twc run` (each also readable from the environment).
#[derive(clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    engine: EngineArgs,
    /// Task queue of the engine's workflows.
    #[arg(long, env = "TWC_TASK_QUEUE", default_value = twc_workflows::ENGINE_TASK_QUEUE)]
    task_queue: String,
    /// Workflows kept in memory between their tasks; evicted ones are replayed from history.
    #[arg(long, env = "TWC_MAX_CACHED_WORKFLOWS", default_value_t = twc_worker::DEFAULT_MAX_CACHED_WORKFLOWS)]
    max_cached_workflows: usize,
    /// Waiting activities (for pollers, for gate workflows) run at once, on the waits task queue
    /// (`<task queue>-waits`) with slots of their own.
    #[arg(long, env = "TWC_MAX_CONCURRENT_WAITS", default_value_t = twc_worker::DEFAULT_MAX_CONCURRENT_WAITS,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_concurrent_waits: u32,
    /// History events after which an engine workflow continues as new (it also does when
    /// Temporal suggests it; applies to workflows started from then on). Lowered only to
    /// exercise continue-as-new in tests.
    #[arg(long, env = "TWC_HISTORY_EVENT_BOUND", default_value_t = twc_workflows::DEFAULT_HISTORY_EVENT_BOUND,
          value_parser = clap::value_parser!(u32).range(100..))]
    history_event_bound: u32,
    /// How often each TWD's workflow re-reads the world (Deployments, routing, the spec) when
    /// nothing else wakes it, repairing drift a missed watch event would leave (Go-style
    /// duration; applies to TWD workflows started from then on).
    #[arg(long, env = "TWC_RESYNC_INTERVAL", default_value = "5m", value_parser = |s: &str| parse_interval(s, std::time::Duration::from_secs(1)))]
    resync_interval: std::time::Duration,
    /// Identity on Temporal calls; also the manager identity claimed on worker deployments.
    /// Every replica of one installation must use the same value.
    #[arg(long, env = "TWC_IDENTITY", default_value = "twc")]
    identity: String,
    /// Manager identities of another controller whose worker deployments this one takes over:
    /// when a routing change meets a worker deployment managed by one of them, the manager
    /// identity is claimed instead of the change stopping (an exact identity, or a prefix
    /// ending in `*`, e.g. `temporal-worker-controller/temporal-system/*`; comma-separated or
    /// repeated). Only once that controller is stopped: see the migration guide in README.md.
    #[arg(long, env = "TWC_TAKE_OVER_MANAGER_FROM", value_delimiter = ',')]
    take_over_manager_from: Vec<String>,
    /// Worker-deployment reads a second the installation (all its replicas together) sends to
    /// each Temporal namespace of the workers (DescribeWorkerDeployment and the like; the server
    /// allows 50 a second per namespace, for all clients together). Each replica takes its share:
    /// the rate divided by the live replicas, counted from their Leases in the controller's
    /// namespace.
    #[arg(long, env = "TWC_TEMPORAL_READ_RATE", default_value_t = twc_activities::temporal::budget::DEFAULT_READ_RATE,
          value_parser = parse_rate)]
    temporal_read_rate: f64,
    /// Comma-separated namespaces to watch (default: all).
    #[arg(long, env = "TWC_WATCH_NAMESPACES", value_delimiter = ',')]
    watch_namespaces: Vec<String>,
    /// The controller's own namespace, where it records the events about TWDs whose namespace
    /// is being deleted (that namespace refuses new events). Default: the Kubernetes client's
    /// namespace (the pod's in a cluster; the kubeconfig context's, else `default`, outside).
    #[arg(long, env = "POD_NAMESPACE")]
    controller_namespace: Option<String>,
    /// Cluster-wide notification targets, told about the events of every worker deployment: a
    /// JSON object of the same form as a worker deployment's `spec.notifications`
    /// (`{"targets": [...]}`), each `urlSecretRef` naming a Secret in the controller's namespace.
    #[arg(long, env = "TWC_CLUSTER_NOTIFICATIONS", value_parser = parse_cluster_notifications)]
    cluster_notifications: Option<twc_crds::notifications::NotificationSpec>,
    /// Do not set the Twc* search attributes on rollouts (use when they are not registered).
    #[arg(long, env = "TWC_NO_SEARCH_ATTRIBUTES")]
    no_search_attributes: bool,
    /// Where Prometheus `/metrics` is served: `host:port`, `:port` (every interface, IPv6 too
    /// where available), port 0 for any free port, or `0` to turn it off.
    #[arg(long, env = "TWC_METRICS_BIND_ADDRESS", default_value = "0.0.0.0:8080")]
    metrics_bind_address: BindAddress,
    /// Where the `/healthz` (liveness) and `/readyz` (readiness) probes are served, in the same
    /// forms; the same address as the metrics serves all three on one port.
    #[arg(long, env = "TWC_HEALTH_BIND_ADDRESS", default_value = "0.0.0.0:8081")]
    health_bind_address: BindAddress,
    /// OTLP/gRPC endpoint to export rollout and activity spans to, e.g.
    /// `http://127.0.0.1:4317` (default: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`; neither set: no tracing). `OTEL_SERVICE_NAME` (default
    /// `twc`) and `OTEL_TRACES_SAMPLER(_ARG)` apply.
    #[arg(long)]
    otlp_endpoint: Option<String>,
    /// How often the controller hands the heap memory it freed back to the system (glibc's
    /// `malloc_trim`; Go-style duration, `0` turns it off). Without it the resident memory stays
    /// at the high-water mark of the last burst of rollouts.
    #[arg(long, env = "TWC_HEAP_TRIM_INTERVAL", default_value = "10s",
          value_parser = |s: &str| parse_interval(s, std::time::Duration::ZERO))]
    heap_trim_interval: std::time::Duration,
    /// Where the WorkerResourceTemplate admission webhook is served over HTTPS (the forms of
    /// `--metrics-bind-address`); only with `--webhook-cert-dir`.
    #[arg(long, env = "TWC_WEBHOOK_BIND_ADDRESS", default_value = ":9443")]
    webhook_bind_address: BindAddress,
    /// Folder with the webhook's serving certificate and key (`tls.crt`, `tls.key`; a renewed
    /// pair is picked up without a restart). Unset: no webhook is served.
    #[arg(long, env = "TWC_WEBHOOK_CERT_DIR")]
    webhook_cert_dir: Option<std::path::PathBuf>,
    /// Comma-separated kinds a WorkerResourceTemplate may render (case-insensitive), e.g.
    /// `HorizontalPodAutoscaler,PodDisruptionBudget`. Empty: every template is refused.
    #[arg(long, env = "TWC_WRT_ALLOWED_KINDS", value_delimiter = ',')]
    wrt_allowed_kinds: Vec<String>,
}

/// A positive, finite rate.
fn parse_rate(input: &str) -> Result<f64, String> {
    let rate: f64 = input.parse().map_err(|e| format!("{e}"))?;
    if rate.is_finite() && rate > 0.0 {
        Ok(rate)
    } else {
        Err("must be a positive number".to_owned())
    }
}

/// A Go-style duration flag (`90s`, `5m`, `1h30m`) of at least `minimum`.
fn parse_interval(
    input: &str,
    minimum: std::time::Duration,
) -> Result<std::time::Duration, String> {
    let duration = twc_crds::duration::parse_duration(input).map_err(|e| e.to_string())?;
    if duration < minimum {
        return Err(format!("must be at least {minimum:?}"));
    }
    Ok(duration)
}

/// Runs the controller until SIGINT/SIGTERM.
/// Parses `--cluster-notifications` (empty: none), checking what the CRD's schema checks of a
/// worker deployment's `spec.notifications` that a flag cannot: at least one target, distinct
/// names.
fn parse_cluster_notifications(
    text: &str,
) -> Result<twc_crds::notifications::NotificationSpec, String> {
    let spec: twc_crds::notifications::NotificationSpec = serde_json::from_str(text)
        .map_err(|e| format!("not a notifications object ({{\"targets\": [...]}}): {e}"))?;
    if spec.targets.is_empty() {
        return Err("no targets".to_owned());
    }
    for (i, target) in spec.targets.iter().enumerate() {
        if spec.targets[..i].iter().any(|t| t.name == target.name) {
            return Err(format!("target name {:?} is used twice", target.name));
        }
    }
    Ok(spec)
}

/// Stack of each of the runtime's worker threads.
const WORKER_STACK_BYTES: usize = 8 << 20;

pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        // Activities hold Kubernetes objects by value in deeply nested futures; an unoptimized
        // build overflowed tokio's 2 MiB default once. Only the pages a thread touches are
        // resident, so the headroom costs no memory.
        .thread_stack_size(WORKER_STACK_BYTES)
        .build()
        .context("starting tokio")?;
    runtime.block_on(run_async(args))
}

async fn run_async(args: RunArgs) -> anyhow::Result<()> {
    let mut config = args.engine.config(&args.task_queue, &args.identity);
    let trace_export = match telemetry::traces::endpoint(args.otlp_endpoint.as_deref()) {
        Some(endpoint) => {
            let (traces, export) = telemetry::traces::start(&endpoint)?;
            tracing::info!(%endpoint, "exporting spans over OTLP");
            config.traces = Some(traces);
            Some(export)
        }
        None => None,
    };
    config.max_cached_workflows = args.max_cached_workflows;
    config.max_concurrent_waits = args.max_concurrent_waits as usize;
    let watch_namespaces: Vec<String> = args
        .watch_namespaces
        .iter()
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
        .collect();
    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health::default());
    // Serve the probes first: liveness holds while connecting, readiness waits for the rest.
    telemetry::server::serve(
        args.metrics_bind_address,
        args.health_bind_address,
        telemetry::State {
            metrics: Arc::clone(&metrics),
            health: Arc::clone(&health),
        },
    )
    .await?;
    let kube = telemetry::kube::client(Arc::clone(&metrics))
        .await
        .context("connecting to Kubernetes")?;
    let allowed_kinds: Vec<String> = args
        .wrt_allowed_kinds
        .iter()
        .map(|k| k.trim().to_owned())
        .filter(|k| !k.is_empty())
        .collect();
    // WorkerResourceTemplates need Kubernetes only: admitted and rendered while Temporal is
    // still being reached.
    if let Some(cert_dir) = &args.webhook_cert_dir
        && args.webhook_bind_address != BindAddress::Off
    {
        let admission = Admission::new(kube.clone(), allowed_kinds.clone());
        webhook::serve(
            &WebhookConfig {
                address: args.webhook_bind_address,
                cert_dir: cert_dir.clone(),
            },
            Arc::new(admission),
        )
        .await?;
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut stop_templates = stop_rx.clone();
    let templates_health = Arc::clone(&health);
    let templates_config = TemplatesConfig {
        namespaces: watch_namespaces.clone(),
        allowed_kinds,
    };
    let templates_kube = kube.clone();
    let templates = tokio::spawn(async move {
        let _running = templates_health.guard(Task::Templates);
        templates::run(templates_kube, templates_config, async move {
            let _ = stop_templates.wait_for(|stop| *stop).await;
        })
        .await;
    });
    let engine = connect_engine(&config).await?;
    tracing::info!(address = %config.address, namespace = %config.namespace, task_queue = %config.task_queue,
        identity = %config.identity, watch = ?watch_namespaces, "controller starting");

    // Restricted to namespaces, the controller has no cluster-wide RBAC: no ClusterConnections.
    let cluster_access = if watch_namespaces.is_empty() {
        ClusterAccess::Granted
    } else {
        ClusterAccess::Restricted
    };
    let watcher_config = WatcherConfig {
        namespaces: watch_namespaces,
        task_queue: config.task_queue.clone(),
        search_attributes: !args.no_search_attributes,
        history_event_bound: args.history_event_bound,
        resync_seconds: u32::try_from(args.resync_interval.as_secs())
            .unwrap_or(u32::MAX)
            .max(1),
        metrics: Arc::clone(&metrics),
        traces: config.traces.clone(),
        connections: watcher::ConnectionView::default(),
    };
    // The activities read the connections' finalizers from the watcher's stores.
    let known_connections = watcher_config.connections.clone();
    let watched = watcher_config.namespaces.clone();
    let mut stop_watcher = stop_rx.clone();
    let watcher_health = Arc::clone(&health);
    let (watcher_kube, watcher_engine) = (kube.clone(), engine.clone());
    let watcher = tokio::spawn(async move {
        let _running = watcher_health.guard(Task::Watcher);
        watcher::run(
            watcher_kube,
            watcher_engine,
            watcher_config,
            || watcher_health.watcher_synced(),
            async move {
                let _ = stop_watcher.wait_for(|stop| *stop).await;
            },
        )
        .await;
    });
    // Tells held rollouts of their Deployments' changes (they do not poll).
    let mut stop_deployments = stop_rx.clone();
    let deployments = tokio::spawn(crate::deployment_watch::run(
        kube.clone(),
        engine.clone(),
        watched,
        Arc::clone(&metrics),
        async move {
            let _ = stop_deployments.wait_for(|stop| *stop).await;
        },
    ));
    let own_namespace = args
        .controller_namespace
        .clone()
        .filter(|n| !n.trim().is_empty())
        .unwrap_or_else(|| kube.default_namespace().to_owned());
    tracing::info!(namespace = %own_namespace, "events about TWDs of namespaces being deleted go to the controller's namespace");
    // Replicas divide Temporal's read limits between them (src/replicas.rs).
    let replicas = twc_activities::temporal::budget::Replicas::one();
    let lease = crate::replicas::ReplicaLease::of_this_process(
        &own_namespace,
        &config.task_queue,
        &config.identity,
    );
    let mut stop_leases = stop_rx.clone();
    let leases = tokio::spawn(crate::replicas::run(
        kube.clone(),
        lease,
        replicas.clone(),
        Arc::clone(&metrics),
        async move {
            let _ = stop_leases.wait_for(|stop| *stop).await;
        },
    ));
    let activities = EngineActivities::new(kube, config.identity.clone(), Arc::clone(&metrics))
        .with_cluster_access(cluster_access)
        .with_known_connections(Arc::new(known_connections))
        .with_read_rate(args.temporal_read_rate, replicas)
        .with_take_over(twc_activities::temporal::TakeOver::new(
            args.take_over_manager_from.clone(),
        ))
        .with_own_namespace(own_namespace.clone())
        .with_notifications(
            config.task_queue.clone(),
            twc_activities::notify::ClusterTargets {
                spec: args.cluster_notifications.clone(),
                secret_namespace: own_namespace,
            },
        );
    let mut stop_trim = stop_rx.clone();
    let trim = tokio::spawn(memory::trim_every(args.heap_trim_interval, async move {
        let _ = stop_trim.wait_for(|stop| *stop).await;
    }));
    let mut stop_worker = stop_rx;
    let worker_health = Arc::clone(&health);
    let worker = async {
        let _running = worker_health.guard(Task::Worker);
        run_engine_worker_reporting(
            engine,
            &config,
            activities,
            || worker_health.worker_running(),
            async move {
                let _ = stop_worker.wait_for(|stop| *stop).await;
            },
        )
        .await
    };
    tokio::pin!(worker);
    let result = tokio::select! {
        result = &mut worker => result.map_err(anyhow::Error::from),
        () = shutdown_signal() => {
            tracing::info!("shutting down");
            health.shutting_down();
            let _ = stop_tx.send(true);
            worker.await.map_err(anyhow::Error::from)
        }
    };
    let _ = stop_tx.send(true);
    let _ = watcher.await;
    let _ = deployments.await;
    let _ = leases.await;
    let _ = templates.await;
    let _ = trim.await;
    if let Some(export) = trace_export {
        export.shutdown().await;
    }
    result
}

async fn shutdown_signal() {
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        run: super::RunArgs,
    }

    #[test]
    fn templates_render_no_kind_and_serve_no_webhook_unless_told() {
        // (flags, allowed kinds, webhook certificate folder)
        let cases: [(&[&str], &[&str], Option<&str>); 3] = [
            (&[], &[], None),
            (
                &[
                    "--wrt-allowed-kinds",
                    "HorizontalPodAutoscaler,PodDisruptionBudget",
                ],
                &["HorizontalPodAutoscaler", "PodDisruptionBudget"],
                None,
            ),
            (
                &["--webhook-cert-dir", "/etc/twc/webhook"],
                &[],
                Some("/etc/twc/webhook"),
            ),
        ];
        for (flags, kinds, cert_dir) in cases {
            let parsed =
                Flags::try_parse_from(std::iter::once("twc-run").chain(flags.iter().copied()))
                    .unwrap_or_else(|e| panic!("{flags:?}: {e}"));
            assert_eq!(parsed.run.wrt_allowed_kinds, kinds, "{flags:?}");
            assert_eq!(
                parsed.run.webhook_cert_dir.as_deref(),
                cert_dir.map(std::path::Path::new),
                "{flags:?}"
            );
            assert_eq!(parsed.run.webhook_bind_address.to_string(), ":9443");
        }
    }

    #[test]
    fn the_interval_flags_take_go_durations_down_to_their_minimum() {
        // Ok((resync, heap trim) in ms) or Err(part of the message).
        type Expected = Result<(u64, u64), &'static str>;
        let cases: [(&[&str], Expected); 7] = [
            (&[], Ok((300_000, 10_000))),
            (&["--resync-interval", "1s"], Ok((1_000, 10_000))),
            (&["--resync-interval", "1m30s"], Ok((90_000, 10_000))),
            (&["--resync-interval", "999ms"], Err("must be at least 1s")),
            (&["--resync-interval", "5"], Err("invalid duration")),
            (&["--heap-trim-interval", "0"], Ok((300_000, 0))),
            (&["--heap-trim-interval", "soon"], Err("invalid duration")),
        ];
        for (flags, expected) in cases {
            let parsed =
                Flags::try_parse_from(std::iter::once("twc-run").chain(flags.iter().copied()));
            match (parsed, expected) {
                (Ok(flags_parsed), Ok((resync_ms, trim_ms))) => {
                    assert_eq!(
                        flags_parsed.run.resync_interval,
                        Duration::from_millis(resync_ms),
                        "{flags:?}"
                    );
                    assert_eq!(
                        flags_parsed.run.heap_trim_interval,
                        Duration::from_millis(trim_ms),
                        "{flags:?}"
                    );
                }
                (Err(error), Err(fragment)) => {
                    assert!(error.to_string().contains(fragment), "{flags:?}: {error}");
                }
                (Ok(_), Err(fragment)) => panic!("{flags:?} parsed; expected {fragment:?}"),
                (Err(error), Ok(_)) => panic!("{flags:?} refused: {error}"),
            }
        }
    }
}
