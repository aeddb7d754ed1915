//! Bringing the whole sandbox up and down: Temporal dev server, kube-apiserver with the CRDs,
//! the pod runner and (optionally) the controller.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;

use tokio::process::Command;

use crate::apiserver::{self, ApiServer};
use crate::env::{ENV_FILE_NAME, ProductionTemporalEnv, SandboxEnv};
use crate::podrunner::PodRunnerConfig;
use crate::podrunner::thread::PodRunnerThread;
use crate::ports::free_port;
use crate::process::{Supervised, spawn_logged, tail};
use crate::production::{ProductionTemporal, ProductionTemporalOptions};
use crate::prometheus::{self, Prometheus, PrometheusOptions};
use crate::temporal::{self, TemporalOptions, TemporalServer};
use crate::tracing_backend::{self, Jaeger};
use crate::webhook;

/// How a server or the controller is stopped by a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopMode {
    /// SIGTERM, then SIGKILL after a grace period.
    Graceful,
    /// SIGKILL at once, as a crash would.
    Kill,
}

/// Where things are and what to start.
#[derive(Debug, Clone)]
pub struct SandboxOptions {
    /// Folder for state, logs and the env file.
    pub state_dir: PathBuf,
    /// Folder with installed tools (`make tools`).
    pub tools_dir: PathBuf,
    /// Folder with the workspace binaries.
    pub bin_dir: PathBuf,
    /// Repository root (for `examples/images.yaml`).
    pub repo_dir: PathBuf,
    /// Serve the Temporal Web UI.
    pub ui: bool,
    /// Make drainage status refresh every second.
    pub fast_drainage: bool,
    /// More dynamic config for the Temporal dev server, `key=value` each
    /// (`--temporal-dynamic-config`).
    pub temporal_dynamic_config: Vec<String>,
    /// Start the controller (`twc run`).
    pub controller: bool,
    /// The controller's binary; None: `<bin_dir>/twc` (e.g. an older release's build, for an
    /// upgrade test).
    pub controller_bin: Option<PathBuf>,
}

/// A running sandbox.
pub struct Sandbox {
    /// What clients need to know.
    pub env: SandboxEnv,
    temporal: TemporalServer,
    temporal_options: TemporalOptions,
    apiserver: ApiServer,
    apiserver_bin: PathBuf,
    apiserver_dir: PathBuf,
    controller: Option<Supervised>,
    /// More controllers on the same engine namespace and task queue (replicas).
    extra_controllers: Vec<Supervised>,
    /// How controllers are started from now on (binary, extra environment).
    launch: ControllerLaunch,
    pod_runner: PodRunnerThread,
    /// Prometheus, once [`Self::start_prometheus`] started it.
    prometheus: Option<Prometheus>,
    /// Jaeger, once [`Self::start_tracing`] started it.
    jaeger: Option<Jaeger>,
    /// The production-like Temporal, once [`Self::start_production_temporal`] started it.
    production: Option<ProductionTemporal>,
    state_dir: PathBuf,
    tools_dir: PathBuf,
}

impl Sandbox {
    /// Starts everything and writes `<state-dir>/env.json`.
    pub async fn start(options: &SandboxOptions) -> anyhow::Result<Self> {
        let logs_dir = options.state_dir.join("logs");
        let pods_dir = options.state_dir.join("pods");
        // Every start is fresh: no state of an earlier run (etcd, Temporal, pods) leaks in.
        if options.state_dir.exists() {
            std::fs::remove_dir_all(&options.state_dir)
                .map_err(|e| anyhow::anyhow!("clearing {}: {e}", options.state_dir.display()))?;
        }
        for dir in [&options.state_dir, &logs_dir, &pods_dir] {
            std::fs::create_dir_all(dir)
                .map_err(|e| anyhow::anyhow!("creating {}: {e}", dir.display()))?;
        }
        let temporal_cli = options.tools_dir.join("venv/bin/temporal");
        let kubectl = options.tools_dir.join("venv/bin/kubectl");
        let apiserver_bin = options.tools_dir.join("bin/twc-apiserver");
        for tool in [&temporal_cli, &kubectl, &apiserver_bin] {
            anyhow::ensure!(
                tool.exists(),
                "{} is missing: run `make tools`",
                tool.display()
            );
        }

        tracing::info!("starting Temporal dev server and kube-apiserver");
        let temporal_options = TemporalOptions {
            cli: temporal_cli.clone(),
            db_file: options.state_dir.join("temporal.db"),
            log: logs_dir.join("temporal.log"),
            ui: options.ui,
            fast_drainage: options.fast_drainage,
            dynamic_config: options.temporal_dynamic_config.clone(),
        };
        let apiserver_dir = options.state_dir.join("apiserver");
        let apiserver_log = logs_dir.join("apiserver.log");
        let (temporal, apiserver) = tokio::join!(
            temporal::start(&temporal_options),
            apiserver::start(&apiserver_bin, &apiserver_dir, &apiserver_log),
        );
        let (temporal, apiserver) = (temporal?, apiserver?);
        let client = apiserver::client(&apiserver.kubeconfig).await?;
        apiserver::install_crds(&client).await?;

        let targets_dir = prometheus::targets_dir(&options.state_dir);
        let runner_config = PodRunnerConfig {
            images_file: options.repo_dir.join("examples/images.yaml"),
            bin_dirs: vec![options.bin_dir.clone()],
            work_dir: pods_dir.clone(),
            // Workers announce their /metrics there whether or not Prometheus runs yet, so one
            // started later (`start_prometheus`, or a test's own) finds them all.
            metrics_sd_dir: Some(targets_dir.clone()),
        };
        let pod_runner_log = logs_dir.join("podrunner.log");
        let pod_runner =
            PodRunnerThread::start(apiserver.kubeconfig.clone(), runner_config, &pod_runner_log)
                .map_err(|e| anyhow::anyhow!("starting the pod runner thread: {e}"))?;

        let temporal_pid_file = options.state_dir.join("temporal.pid");
        write_pid_file(&temporal_pid_file, &temporal.process)?;
        let mut env = SandboxEnv {
            temporal_address: temporal.address.clone(),
            temporal_namespace: "default".to_owned(),
            temporal_ui_url: temporal.ui_url.clone(),
            temporal_metrics_url: temporal.metrics_url.clone(),
            temporal_pid_file: Some(temporal_pid_file),
            temporal_dynamic_config: options.temporal_dynamic_config.clone(),
            kubeconfig: apiserver.kubeconfig.clone(),
            logs_dir,
            pods_dir,
            temporal_cli,
            kubectl,
            bin_dir: options.bin_dir.clone(),
            controller_log: None,
            controller_pid_file: None,
            controller_metrics_url: None,
            controller_health_url: None,
            controller_webhook_url: None,
            webhook_cert_dir: None,
            prometheus_bin: Some(prometheus::binary(&options.tools_dir)).filter(|b| b.exists()),
            prometheus_targets_dir: Some(targets_dir),
            prometheus_url: None,
            jaeger_bin: Some(tracing_backend::binary(&options.tools_dir)).filter(|b| b.exists()),
            tracing_query_url: None,
            otlp_endpoint: None,
            production_temporal: None,
        };
        let launch = ControllerLaunch {
            binary: options.controller_bin.clone(),
            vars: Vec::new(),
        };
        let controller = if options.controller {
            // The API server calls the controller's webhook before admitting a
            // WorkerResourceTemplate; without a controller nothing would answer it.
            let cert_dir = options.state_dir.join("webhook");
            let ca = webhook::write_certificates(&cert_dir)?;
            let port = free_port()?;
            let url = format!("https://127.0.0.1:{port}{}", webhook::PATH);
            webhook::register(&client, &url, &ca).await?;
            env.controller_webhook_url = Some(url);
            env.webhook_cert_dir = Some(cert_dir);
            Some(start_controller(&mut env, &launch)?)
        } else {
            None
        };
        write_env_file(&options.state_dir, &env)?;
        Ok(Self {
            env,
            temporal,
            temporal_options,
            apiserver,
            apiserver_bin,
            apiserver_dir,
            controller,
            extra_controllers: Vec::new(),
            launch,
            pod_runner,
            prometheus: None,
            jaeger: None,
            production: None,
            state_dir: options.state_dir.clone(),
            tools_dir: options.tools_dir.clone(),
        })
    }

    /// Starts Prometheus (`<tools>/bin/prometheus`) scraping every worker the pod runner runs,
    /// records its URL in the env file and returns it; it stops with the sandbox. Returns the
    /// URL of the running one when called again.
    pub async fn start_prometheus(&mut self) -> anyhow::Result<String> {
        if let Some(running) = &self.prometheus {
            return Ok(running.url.clone());
        }
        let options = PrometheusOptions::for_state_dir(&self.state_dir, &self.tools_dir);
        let running = Prometheus::start(&options).await?;
        let url = running.url.clone();
        self.prometheus = Some(running);
        self.env.prometheus_url = Some(url.clone());
        write_env_file(&self.state_dir, &self.env)?;
        Ok(url)
    }

    /// Starts Jaeger (`<tools>/bin/jaeger-all-in-one`), restarts the controller exporting its
    /// spans there (`OTEL_EXPORTER_OTLP_ENDPOINT`, batches every second), records the query API
    /// URL in the env file and returns it; it stops with the sandbox. Returns the URL of the
    /// running one when called again.
    pub async fn start_tracing(&mut self) -> anyhow::Result<String> {
        if let Some(running) = &self.jaeger {
            return Ok(running.query_url.clone());
        }
        let binary = tracing_backend::binary(&self.tools_dir);
        let running = Jaeger::start(&binary, &self.env.logs_dir.join("jaeger.log")).await?;
        let (query_url, endpoint) = (running.query_url.clone(), running.otlp_endpoint.clone());
        self.jaeger = Some(running);
        self.env.tracing_query_url = Some(query_url.clone());
        self.env.otlp_endpoint = Some(endpoint.clone());
        let mut vars: Vec<(String, String)> = self
            .launch
            .vars
            .iter()
            .filter(|(k, _)| k != "OTEL_EXPORTER_OTLP_ENDPOINT" && k != "OTEL_BSP_SCHEDULE_DELAY")
            .cloned()
            .collect();
        vars.push(("OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(), endpoint));
        vars.push(("OTEL_BSP_SCHEDULE_DELAY".to_owned(), "1000".to_owned()));
        let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        self.restart_controller_with_env(&vars).await?;
        write_env_file(&self.state_dir, &self.env)?;
        Ok(query_url)
    }

    /// Starts the production-like Temporal ([`crate::production`]: PostgreSQL, mutual TLS,
    /// JWT) in `<state>/production-temporal`, writes client certificates and API keys there,
    /// records it in the env file and returns it; it stops with the sandbox. With `engine`, the
    /// controller's engine moves there: the controller restarts connecting over mutual TLS
    /// with a certificate granting `default:write`. Returns the running one when called again.
    pub async fn start_production_temporal(
        &mut self,
        engine: bool,
    ) -> anyhow::Result<&ProductionTemporal> {
        if self.production.is_none() {
            let mut options = ProductionTemporalOptions::new(
                self.state_dir.join("production-temporal"),
                &self.tools_dir,
            );
            options.fast_drainage = self.temporal_options.fast_drainage;
            let server = ProductionTemporal::start(&options).await?;
            self.env.production_temporal = Some(production_env(&server, engine)?);
            self.production = Some(server);
            if engine && let Some(controller) = self.controller.as_mut() {
                controller.stop(Duration::from_secs(10)).await;
                self.controller = Some(start_controller(&mut self.env, &self.launch)?);
            }
            write_env_file(&self.state_dir, &self.env)?;
        }
        self.production
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("the production-like Temporal is not running"))
    }

    /// The production-like Temporal, when [`Self::start_production_temporal`] started it: for
    /// more client certificates and API keys.
    pub fn production_temporal(&self) -> Option<&ProductionTemporal> {
        self.production.as_ref()
    }

    /// The name and exit status of a server that died, if any.
    pub fn dead_process(&mut self) -> Option<(String, String)> {
        if let Some(dead) = self.production.as_mut().and_then(|p| p.dead_process()) {
            return Some(dead);
        }
        [&mut self.temporal.process, &mut self.apiserver.process]
            .into_iter()
            .chain(self.prometheus.as_mut().map(|p| &mut p.process))
            .chain(self.jaeger.as_mut().map(|j| &mut j.process))
            .find_map(|p| p.exited().map(|status| (p.name.clone(), status)))
            .or_else(|| {
                self.pod_runner
                    .ended()
                    .map(|how| ("pod runner".to_owned(), how))
            })
    }

    /// Restarts the controller if it exited (crash tests SIGKILL it); returns how it ended.
    pub fn restart_dead_controller(&mut self) -> Option<String> {
        let status = self.controller.as_mut()?.exited()?;
        tracing::warn!("controller exited ({status}); restarting it");
        match start_controller(&mut self.env, &self.launch) {
            Ok(process) => self.controller = Some(process),
            Err(e) => tracing::error!("restarting the controller failed: {e:#}"),
        }
        Some(status)
    }

    /// Kills the controller with SIGKILL, as a crash would; returns its process ID. It stays
    /// dead until [`Self::restart_dead_controller`].
    pub async fn kill_controller(&mut self) -> Option<u32> {
        let controller = self.controller.as_mut()?;
        let pid = controller.pid();
        controller.kill().await;
        pid
    }

    /// Sets extra environment variables (e.g. `RUST_LOG`) of the controllers started from now
    /// on, and restarts the controller with them.
    pub async fn restart_controller_with_env(
        &mut self,
        vars: &[(&str, &str)],
    ) -> anyhow::Result<()> {
        self.launch.vars = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        self.restart_controller().await
    }

    /// Runs the controller from `binary` (None: `<bin_dir>/twc`) from now on: stops the running
    /// one gracefully (SIGTERM, SIGKILL after 10 s), as a rolling update would, and starts the
    /// new one with the same environment, ports and log (an upgrade, or a downgrade).
    pub async fn restart_controller_with_binary(
        &mut self,
        binary: Option<PathBuf>,
    ) -> anyhow::Result<()> {
        if let Some(binary) = &binary {
            anyhow::ensure!(
                binary.is_file(),
                "controller binary {} does not exist",
                binary.display()
            );
        }
        self.launch.binary = binary;
        self.restart_controller().await
    }

    /// Stops the running controller gracefully and starts it again as `launch` says.
    async fn restart_controller(&mut self) -> anyhow::Result<()> {
        if let Some(controller) = self.controller.as_mut() {
            controller.stop(Duration::from_secs(10)).await;
            self.controller = Some(start_controller(&mut self.env, &self.launch)?);
        }
        Ok(())
    }

    /// Process ID of the controller while it runs.
    pub fn controller_pid(&self) -> Option<u32> {
        self.controller.as_ref()?.pid()
    }

    /// Starts one more controller (`twc run`, same engine namespace, task queue and identity,
    /// as another replica would); its log is `logs/controller-<n>.log`, returned.
    pub fn start_extra_controller(&mut self) -> anyhow::Result<PathBuf> {
        let n = self.extra_controllers.len() + 2;
        let launch = self.launch.clone();
        let replica = start_replica_with(&self.env, &format!("controller-{n}"), &launch)?;
        let log = replica.process.log.clone();
        self.extra_controllers.push(replica.process);
        Ok(log)
    }

    /// Log files of every controller started so far (restarts append to the same file).
    pub fn controller_logs(&self) -> Vec<PathBuf> {
        self.controller
            .iter()
            .chain(&self.extra_controllers)
            .map(|c| c.log.clone())
            .collect()
    }

    /// Log files of the servers (Temporal, kube-apiserver).
    pub fn server_logs(&self) -> Vec<PathBuf> {
        vec![
            self.temporal.process.log.clone(),
            self.apiserver.process.log.clone(),
        ]
    }

    /// Stops the Temporal dev server and starts it again on the same ports with the same
    /// database file, after `downtime` (a schedule, e.g. to let clients notice the outage).
    /// Workflows, namespaces and search attributes survive; clients reconnect on their own.
    pub async fn restart_temporal(
        &mut self,
        how: StopMode,
        downtime: Duration,
    ) -> anyhow::Result<()> {
        stop(&mut self.temporal.process, how).await;
        tracing::info!(ports = ?self.temporal.ports, "Temporal dev server stopped ({how:?})");
        tokio::time::sleep(downtime).await;
        self.temporal = temporal::start_on(&self.temporal_options, self.temporal.ports).await?;
        if let Some(pid_file) = &self.env.temporal_pid_file {
            write_pid_file(pid_file, &self.temporal.process)?;
        }
        tracing::info!(address = %self.temporal.address, "Temporal dev server restarted");
        Ok(())
    }

    /// Stops the kube-apiserver (with its etcd) and starts it again on the same port with the
    /// same state folder, after `downtime`. Objects, certificates and tokens survive, so the
    /// kubeconfig stays valid and clients (pod runner, controllers) reconnect on their own.
    pub async fn restart_apiserver(
        &mut self,
        how: StopMode,
        downtime: Duration,
    ) -> anyhow::Result<()> {
        let port = self.apiserver.port;
        stop(&mut self.apiserver.process, how).await;
        tracing::info!(port, "kube-apiserver stopped ({how:?})");
        tokio::time::sleep(downtime).await;
        let log = self.apiserver.process.log.clone();
        self.apiserver =
            apiserver::start_on(&self.apiserver_bin, &self.apiserver_dir, &log, Some(port)).await?;
        tracing::info!(port, "kube-apiserver restarted");
        Ok(())
    }

    /// Last lines of every server log, for failure reports.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut logs: Vec<&Path> = vec![&self.temporal.process.log, &self.apiserver.process.log];
        if let Some(jaeger) = &self.jaeger {
            logs.push(&jaeger.process.log);
        }
        if let Some(production) = &self.production {
            logs.extend([production.log.as_path(), production.postgres_log.as_path()]);
        }
        if let Some(prometheus) = &self.prometheus {
            logs.push(&prometheus.process.log);
        }
        for controller in self.controller.iter().chain(&self.extra_controllers) {
            logs.push(&controller.log);
        }
        logs.iter()
            .map(|log| {
                format!(
                    "===== {} (last {lines} lines) =====\n{}\n",
                    log.display(),
                    tail(log, lines)
                )
            })
            .collect()
    }

    /// Stops the controller, the pod runner (and its processes), then the servers and
    /// Prometheus.
    pub async fn stop(mut self) {
        let grace = Duration::from_secs(10);
        for controller in self
            .controller
            .iter_mut()
            .chain(self.extra_controllers.iter_mut())
        {
            controller.stop(grace).await;
        }
        self.pod_runner.stop(Duration::from_secs(30)).await;
        let prometheus = async {
            if let Some(prometheus) = self.prometheus.as_mut() {
                prometheus.stop().await;
            }
        };
        let jaeger = async {
            if let Some(jaeger) = self.jaeger.as_mut() {
                jaeger.stop().await;
            }
        };
        let production = async {
            if let Some(production) = self.production.take() {
                production.stop().await;
            }
        };
        tokio::join!(
            self.temporal.process.stop(grace),
            self.apiserver.process.stop(grace),
            prometheus,
            jaeger,
            production,
        );
    }
}

async fn stop(process: &mut Supervised, how: StopMode) {
    match how {
        StopMode::Graceful => process.stop(Duration::from_secs(10)).await,
        StopMode::Kill => process.kill().await,
    }
}

/// How a controller is started: its binary and extra environment.
#[derive(Debug, Clone, Default)]
struct ControllerLaunch {
    /// None: `<bin_dir>/twc`.
    binary: Option<PathBuf>,
    /// Extra environment (e.g. `RUST_LOG`).
    vars: Vec<(String, String)>,
}

fn start_controller(env: &mut SandboxEnv, launch: &ControllerLaunch) -> anyhow::Result<Supervised> {
    let log = env.logs_dir.join("controller.log");
    // A restarted controller keeps the ports the env file names.
    let ports = match TelemetryPorts::of(env) {
        Some(ports) => ports,
        None => TelemetryPorts {
            webhook: url_port(env.controller_webhook_url.as_deref()),
            ..TelemetryPorts::free()?
        },
    };
    let process = spawn_controller(env, launch, "controller", &log, ports)?;
    env.controller_metrics_url = Some(ports.metrics_url());
    env.controller_health_url = Some(ports.health_url());
    let pid_file = env.logs_dir.with_file_name("controller.pid");
    write_pid_file(&pid_file, &process)?;
    env.controller_log = Some(log);
    env.controller_pid_file = Some(pid_file);
    Ok(process)
}

/// A controller replica started beside a running sandbox's own controller.
#[derive(Debug)]
pub struct Replica {
    /// The `twc run` process (killed when dropped).
    pub process: Supervised,
    /// Its Prometheus metrics (`http://127.0.0.1:<port>/metrics`).
    pub metrics_url: String,
}

/// Starts one more controller against the servers `env` describes (`twc run`, same engine
/// namespace, task queue and identity, as another replica of the Deployment would run, with
/// extra environment `vars`), named `name`, its output in `logs/<name>.log`. For the sandbox's
/// own process ([`Sandbox::start_extra_controller`]) and for commands run inside a sandbox
/// that read its env file (`twc-sandbox exec`), such as the benchmarks.
pub fn start_replica(
    env: &SandboxEnv,
    name: &str,
    vars: &[(String, String)],
) -> anyhow::Result<Replica> {
    let launch = ControllerLaunch {
        binary: None,
        vars: vars.to_vec(),
    };
    start_replica_with(env, name, &launch)
}

/// [`start_replica`] with the binary and environment of `launch`.
fn start_replica_with(
    env: &SandboxEnv,
    name: &str,
    launch: &ControllerLaunch,
) -> anyhow::Result<Replica> {
    let log = env.logs_dir.join(format!("{name}.log"));
    let ports = TelemetryPorts::free()?;
    let process = spawn_controller(env, launch, name, &log, ports)?;
    Ok(Replica {
        process,
        metrics_url: ports.metrics_url(),
    })
}

/// Writes `process`'s ID to `path` (empty when it has already exited).
fn write_pid_file(path: &Path, process: &Supervised) -> anyhow::Result<()> {
    std::fs::write(
        path,
        process.pid().map(|p| p.to_string()).unwrap_or_default(),
    )
    .with_context(|| format!("writing {}", path.display()))
}

/// Loopback ports of a controller's `/metrics` and `/healthz` + `/readyz`: free ones, so
/// controllers of several sandboxes (and replicas) run side by side; and of its admission
/// webhook, for the controller the API server calls.
#[derive(Debug, Clone, Copy)]
struct TelemetryPorts {
    metrics: u16,
    health: u16,
    webhook: Option<u16>,
}

impl TelemetryPorts {
    /// Free ports, and no webhook (another replica's: the API server calls the first one).
    fn free() -> std::io::Result<Self> {
        Ok(Self {
            metrics: free_port()?,
            health: free_port()?,
            webhook: None,
        })
    }

    /// The ports the env file names for the controller, if any.
    fn of(env: &SandboxEnv) -> Option<Self> {
        Some(Self {
            metrics: url_port(env.controller_metrics_url.as_deref())?,
            health: url_port(env.controller_health_url.as_deref())?,
            webhook: url_port(env.controller_webhook_url.as_deref()),
        })
    }

    fn metrics_url(self) -> String {
        format!("http://127.0.0.1:{}/metrics", self.metrics)
    }

    fn health_url(self) -> String {
        format!("http://127.0.0.1:{}", self.health)
    }
}

/// The port of an `http://` or `https://` URL on a host with an explicit port.
fn url_port(url: Option<&str>) -> Option<u16> {
    let url = url?;
    let authority = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))?;
    let authority = authority.split('/').next()?;
    authority.rsplit_once(':')?.1.parse().ok()
}

/// `twc run` (the binary `launch` names, with its extra environment) against the sandbox's
/// servers, output appended to `log`, serving its metrics and probes on `ports` of 127.0.0.1.
fn spawn_controller(
    env: &SandboxEnv,
    launch: &ControllerLaunch,
    name: &str,
    log: &Path,
    ports: TelemetryPorts,
) -> anyhow::Result<Supervised> {
    let binary = launch
        .binary
        .clone()
        .unwrap_or_else(|| env.bin_dir.join("twc"));
    tracing::info!(binary = %binary.display(), "starting controller {name}");
    let mut command = Command::new(binary);
    command
        .arg("run")
        .arg(format!(
            "--metrics-bind-address=127.0.0.1:{}",
            ports.metrics
        ))
        .arg(format!("--health-bind-address=127.0.0.1:{}", ports.health))
        .arg(format!("--wrt-allowed-kinds={}", webhook::ALLOWED_KINDS))
        .env("KUBECONFIG", &env.kubeconfig)
        .env("TWC_ENGINE_ADDRESS", &env.temporal_address)
        .env("TWC_ENGINE_NAMESPACE", &env.temporal_namespace);
    if let Some(production) = env.production_temporal.as_ref().filter(|p| p.engine) {
        command
            .env("TWC_ENGINE_ADDRESS", &production.address)
            .env("TWC_ENGINE_TLS_CA", &production.ca_path)
            .env("TWC_ENGINE_TLS_SERVER_NAME", &production.server_name);
        if let (Some(cert), Some(key)) = (
            &production.controller_cert_path,
            &production.controller_key_path,
        ) {
            command
                .env("TWC_ENGINE_TLS_CERT", cert)
                .env("TWC_ENGINE_TLS_KEY", key);
        }
    }
    if let (Some(port), Some(dir)) = (ports.webhook, &env.webhook_cert_dir) {
        command
            .arg(format!("--webhook-bind-address=127.0.0.1:{port}"))
            .arg("--webhook-cert-dir")
            .arg(dir);
    }
    command
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "info".to_owned()),
        )
        .envs(launch.vars.iter().map(|(k, v)| (k, v)));
    Ok(spawn_logged(name, command, log)?)
}

/// API keys `twc-sandbox up --production-temporal` writes (`<name>.jwt`), by permissions.
const PRODUCTION_API_KEYS: &[(&str, &str)] = &[
    ("system-admin", "system:admin"),
    ("default-write", "default:write"),
    ("default-read", "default:read"),
    ("default-worker", "default:worker"),
];
/// How long those API keys are valid.
const PRODUCTION_API_KEY_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// The env file's view of `server`, after writing the client certificates (and, with
/// `engine`, the controller's) and API keys it names.
fn production_env(
    server: &ProductionTemporal,
    engine: bool,
) -> anyhow::Result<ProductionTemporalEnv> {
    let client = server.client_cert("client", &[])?;
    let controller = if engine {
        let namespace = server.namespaces.first().map_or("default", String::as_str);
        Some(server.client_cert("controller", &[&format!("{namespace}:write")])?)
    } else {
        None
    };
    let api_keys_dir = server.state_dir.join("api-keys");
    std::fs::create_dir_all(&api_keys_dir)?;
    for (name, permission) in PRODUCTION_API_KEYS {
        let key = server.api_key(&[permission], PRODUCTION_API_KEY_TTL)?;
        std::fs::write(api_keys_dir.join(format!("{name}.jwt")), key)?;
    }
    Ok(ProductionTemporalEnv {
        address: server.address.clone(),
        server_name: server.server_name.clone(),
        namespaces: server.namespaces.clone(),
        ca_path: server.ca_path.clone(),
        admin_cert_path: server.admin_cert.cert_path.clone(),
        admin_key_path: server.admin_cert.key_path.clone(),
        client_cert_path: client.cert_path,
        client_key_path: client.key_path,
        controller_cert_path: controller.as_ref().map(|c| c.cert_path.clone()),
        controller_key_path: controller.map(|c| c.key_path),
        api_keys_dir,
        jwks_url: server.jwks_url.clone(),
        metrics_url: server.metrics_url.clone(),
        log: server.log.clone(),
        engine,
    })
}

fn write_env_file(state_dir: &Path, env: &SandboxEnv) -> anyhow::Result<()> {
    let path = state_dir.join(ENV_FILE_NAME);
    let tmp = state_dir.join(format!("{ENV_FILE_NAME}.tmp"));
    std::fs::write(&tmp, serde_json::to_vec_pretty(env)?)?;
    std::fs::rename(&tmp, &path)?;
    Ok(())
}
