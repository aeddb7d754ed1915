//! `twc-sandbox`: the local environment behind `make dev` and `make test`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tokio::signal::unix::{SignalKind, signal};
use twc_sandbox::env::ENV_FILE_VAR;
use twc_sandbox::load::{LoadConfig, LoadGenerator, LoadStats};
use twc_sandbox::prometheus::PROMETHEUS_URL_VAR;
use twc_sandbox::up::{Sandbox, SandboxOptions};

/// Local sandbox: Temporal dev server, kube-apiserver, pod runner and controller on loopback.
#[derive(Parser)]
#[command(name = "twc-sandbox", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args, Clone)]
struct Common {
    /// Folder for state, logs and `env.json`.
    #[arg(long)]
    state_dir: PathBuf,
    /// Folder with the installed tools (temporal, kubectl, twc-apiserver).
    #[arg(long, env = "TWC_TOOLS_DIR", default_value = ".tools")]
    tools_dir: PathBuf,
    /// Repository root (for examples/images.yaml and examples/dev).
    #[arg(long, default_value = ".")]
    repo_dir: PathBuf,
    /// Do not start the controller.
    #[arg(long)]
    no_controller: bool,
    /// Also start Prometheus (`<tools-dir>/bin/prometheus`, from `make tools`), scraping the
    /// `/metrics` of every worker the pod runner runs each second.
    #[arg(long)]
    prometheus: bool,
    /// Also start Jaeger (`<tools-dir>/bin/jaeger-all-in-one`, from `make jaeger`) and have the
    /// controller export its rollout and activity spans there over OTLP.
    #[arg(long)]
    tracing: bool,
    /// Also start the production-like Temporal (the real server on PostgreSQL, mutual TLS, JWT
    /// authorization; `make temporal-server postgres`) and run the controller's engine on it.
    #[arg(long)]
    production_temporal: bool,
    /// More dynamic config for the Temporal dev server, `key=value` (repeatable; in the
    /// environment variable, entries separated by spaces), given after the sandbox's own and
    /// replacing its entry of the same key: e.g. `matching.deploymentWorkflowVersion=2` for
    /// routing changes that return before they reach every task queue.
    #[arg(
        long = "temporal-dynamic-config",
        env = "TWC_SANDBOX_TEMPORAL_DYNAMIC_CONFIG",
        value_delimiter = ' ',
        value_parser = twc_sandbox::temporal::parse_dynamic_config
    )]
    temporal_dynamic_config: Vec<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Start the sandbox and keep it running until Ctrl-C.
    Up {
        #[command(flatten)]
        common: Common,
        /// Apply the sample Connection and WorkerDeployment of examples/dev.
        #[arg(long)]
        apply_samples: bool,
    },
    /// Start the sandbox (no Web UI, fast drainage), run a command in it, stop it.
    Exec {
        #[command(flatten)]
        common: Common,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Run only the pod runner against an existing API server.
    PodRunner {
        /// Kubeconfig of the API server.
        #[arg(long, env = "KUBECONFIG")]
        kubeconfig: PathBuf,
        /// Image table.
        #[arg(long, default_value = "examples/images.yaml")]
        images: PathBuf,
        /// Folders with the binaries named in the image table (default: this binary's folder).
        #[arg(long)]
        bin_dir: Vec<PathBuf>,
        /// Folder for pod working directories and logs.
        #[arg(long)]
        work_dir: PathBuf,
        /// Folder where workers announce their `/metrics` to Prometheus (file_sd files); every
        /// pod gets it as SAMPLE_METRICS_SD_DIR.
        #[arg(long)]
        metrics_sd_dir: Option<PathBuf>,
    },
    /// Start workflows at a steady rate (e.g. traffic for canary analysis), then print a summary.
    Load {
        /// Temporal frontend host:port.
        #[arg(long, env = "TEMPORAL_ADDRESS")]
        address: String,
        /// Temporal namespace.
        #[arg(long, default_value = "default")]
        namespace: String,
        /// Task queue the workflows start on.
        #[arg(long, default_value = "hello-world")]
        task_queue: String,
        /// Workflow type.
        #[arg(long, default_value = "HelloWorld")]
        workflow_type: String,
        /// Workflows started per second (fractions allowed, e.g. 0.5).
        #[arg(long)]
        rate: f64,
        /// How long to run (Go-style: 60s, 5m, 1h30m); 0 runs until Ctrl-C.
        #[arg(long, default_value = "60s", value_parser = parse_duration)]
        duration: Duration,
        /// Workflow IDs are <prefix><n>, n counting from 1.
        #[arg(long, default_value = "load-")]
        id_prefix: String,
        /// The workflows' argument, as JSON (e.g. '"Ada"').
        #[arg(long, value_parser = parse_json)]
        input: Option<serde_json::Value>,
    },
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    twc_crds::duration::parse_duration(text).map_err(|e| e.to_string())
}

fn parse_json(text: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(Cli::parse()).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("twc-sandbox: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Up {
            common,
            apply_samples,
        } => up(common, apply_samples).await,
        Command::Exec { common, command } => exec(common, command).await,
        Command::PodRunner {
            kubeconfig,
            images,
            bin_dir,
            work_dir,
            metrics_sd_dir,
        } => {
            let client = twc_sandbox::apiserver::client(&kubeconfig).await?;
            let bin_dirs = if bin_dir.is_empty() {
                vec![own_dir()?]
            } else {
                bin_dir
            };
            let config = twc_sandbox::podrunner::PodRunnerConfig {
                images_file: images,
                bin_dirs,
                work_dir,
                metrics_sd_dir,
            };
            twc_sandbox::podrunner::run(client, config, shutdown_signal()).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Load {
            address,
            namespace,
            task_queue,
            workflow_type,
            rate,
            duration,
            id_prefix,
            input,
        } => {
            load(LoadConfig {
                address,
                namespace,
                task_queue,
                workflow_type,
                rate,
                duration: (!duration.is_zero()).then_some(duration),
                id_prefix,
                input,
            })
            .await
        }
    }
}

/// How often `twc-sandbox load` reports progress.
const LOAD_PROGRESS_EVERY: Duration = Duration::from_secs(10);

async fn load(config: LoadConfig) -> anyhow::Result<ExitCode> {
    let generator = LoadGenerator::start(config).await?;
    let mut progress = tokio::time::interval(LOAD_PROGRESS_EVERY);
    progress.tick().await;
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    {
        let finished = generator.wait_done();
        tokio::pin!(finished);
        loop {
            tokio::select! {
                () = &mut finished => break,
                () = &mut shutdown => {
                    tracing::info!("interrupted; stopping the load");
                    break;
                }
                _ = progress.tick() => {
                    let stats = generator.stats();
                    tracing::info!(
                        started = stats.started,
                        failed_to_start = stats.failed_to_start,
                        "load in progress"
                    );
                }
            }
        }
    }
    let stats = generator.stop().await?;
    print_load_summary(&stats);
    Ok(if stats.started == 0 && stats.failed_to_start > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn print_load_summary(stats: &LoadStats) {
    tracing::info!(
        started = stats.started,
        failed_to_start = stats.failed_to_start,
        sending_seconds = stats.sending.as_secs_f64(),
        seconds = stats.elapsed.as_secs_f64(),
        rate = stats.achieved_rate(),
        "load finished"
    );
    println!(
        "started {} workflows, failed to start {}; sent over {:.1}s ({:.2}/s), last answer after {:.1}s",
        stats.started,
        stats.failed_to_start,
        stats.sending.as_secs_f64(),
        stats.achieved_rate(),
        stats.elapsed.as_secs_f64(),
    );
    if let Some(error) = &stats.last_error {
        println!("last start failure: {error}");
    }
}

fn options(common: &Common, ui: bool, fast_drainage: bool) -> anyhow::Result<SandboxOptions> {
    let absolute =
        |p: &Path| std::path::absolute(p).with_context(|| format!("resolving {}", p.display()));
    Ok(SandboxOptions {
        state_dir: absolute(&common.state_dir)?,
        tools_dir: absolute(&common.tools_dir)?,
        bin_dir: own_dir()?,
        repo_dir: absolute(&common.repo_dir)?,
        ui,
        fast_drainage,
        temporal_dynamic_config: common.temporal_dynamic_config.clone(),
        controller: !common.no_controller && own_dir()?.join("twc").exists(),
        controller_bin: None,
    })
}

/// Folder of this binary, where cargo also puts `twc` and `sample-worker`.
fn own_dir() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating twc-sandbox")?;
    exe.parent()
        .map(Path::to_owned)
        .context("twc-sandbox has no parent folder")
}

/// Starts Prometheus in `sandbox` when `--prometheus` asks for it; stops the sandbox if it fails.
async fn start_prometheus_if_asked(sandbox: Sandbox, common: &Common) -> anyhow::Result<Sandbox> {
    let mut sandbox = sandbox;
    if common.prometheus
        && let Err(e) = sandbox.start_prometheus().await
    {
        sandbox.stop().await;
        return Err(e.context("starting Prometheus (--prometheus)"));
    }
    if common.tracing
        && let Err(e) = sandbox.start_tracing().await
    {
        sandbox.stop().await;
        return Err(e.context("starting Jaeger (--tracing)"));
    }
    if common.production_temporal
        && let Err(e) = sandbox.start_production_temporal(true).await
    {
        sandbox.stop().await;
        return Err(e.context("starting the production-like Temporal (--production-temporal)"));
    }
    Ok(sandbox)
}

async fn up(common: Common, apply_samples: bool) -> anyhow::Result<ExitCode> {
    let options = options(&common, true, false)?;
    let sandbox = Sandbox::start(&options).await?;
    let mut sandbox = start_prometheus_if_asked(sandbox, &common).await?;
    if apply_samples && let Err(e) = apply_sample_manifests(&sandbox, &options.repo_dir).await {
        sandbox.stop().await;
        return Err(e);
    }
    print_banner(&sandbox, &options);
    let outcome = tokio::select! {
        () = shutdown_signal() => Ok(ExitCode::SUCCESS),
        dead = watch_for_dead_process(&mut sandbox) => Err(anyhow::anyhow!("{} exited unexpectedly ({}); see {}",
            dead.0, dead.1, sandbox.env.logs_dir.display())),
    };
    eprintln!("\nstopping the sandbox...");
    sandbox.stop().await;
    outcome
}

async fn exec(common: Common, command: Vec<String>) -> anyhow::Result<ExitCode> {
    let options = options(&common, false, true)?;
    let sandbox = Sandbox::start(&options).await?;
    let mut sandbox = start_prometheus_if_asked(sandbox, &common).await?;
    let (program, args) = command.split_first().context("no command given")?;
    // TEMPORAL_ADDRESS is deliberately not exported: the temporal CLI would pick it up.
    let mut child = tokio::process::Command::new(program);
    child
        .args(args)
        .env(
            ENV_FILE_VAR,
            options.state_dir.join(twc_sandbox::env::ENV_FILE_NAME),
        )
        .env("KUBECONFIG", &sandbox.env.kubeconfig);
    if let Some(url) = &sandbox.env.prometheus_url {
        child.env(PROMETHEUS_URL_VAR, url);
    }
    if let Some(url) = &sandbox.env.tracing_query_url {
        child.env(twc_sandbox::tracing_backend::TRACING_QUERY_URL_VAR, url);
    }
    let child = child.status();
    tokio::pin!(child);
    // Like a Deployment, the sandbox restarts a controller that died (crash tests kill it).
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(500));
    let status = loop {
        tokio::select! {
            status = &mut child => break status,
            _ = tick.tick() => {
                sandbox.restart_dead_controller();
            }
        }
    };
    let code = match &status {
        Ok(s) if s.success() => ExitCode::SUCCESS,
        Ok(s) => {
            eprintln!(
                "{program} failed ({s}); server logs follow\n{}",
                sandbox.log_tails(60)
            );
            ExitCode::from(u8::try_from(s.code().unwrap_or(1)).unwrap_or(1))
        }
        Err(e) => {
            eprintln!("could not run {program}: {e}");
            ExitCode::FAILURE
        }
    };
    sandbox.stop().await;
    Ok(code)
}

async fn watch_for_dead_process(sandbox: &mut Sandbox) -> (String, String) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tick.tick().await;
        sandbox.restart_dead_controller();
        if let Some(dead) = sandbox.dead_process() {
            return dead;
        }
    }
}

/// Completes on SIGINT (Ctrl-C) or SIGTERM.
async fn shutdown_signal() {
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        // Without signal handlers the only way out is being killed; never complete.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
}

/// Applies examples/dev/*.yaml with `${TEMPORAL_ADDRESS}` filled in.
async fn apply_sample_manifests(sandbox: &Sandbox, repo_dir: &Path) -> anyhow::Result<()> {
    let dir = repo_dir.join("examples/dev");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        let text = text.replace("${TEMPORAL_ADDRESS}", &sandbox.env.temporal_address);
        let mut child = tokio::process::Command::new(&sandbox.env.kubectl)
            .arg("--kubeconfig")
            .arg(&sandbox.env.kubeconfig)
            .args(["apply", "--server-side", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .context("running kubectl")?;
        if let Some(mut stdin) = child.stdin.take() {
            use tokio::io::AsyncWriteExt;
            stdin.write_all(text.as_bytes()).await?;
        }
        let status = child.wait().await?;
        anyhow::ensure!(
            status.success(),
            "kubectl apply of {} failed ({status})",
            file.display()
        );
    }
    Ok(())
}

fn print_banner(sandbox: &Sandbox, options: &SandboxOptions) {
    let env = &sandbox.env;
    println!(
        "\n\
        ================ twc sandbox is up ================\n\
        Temporal Web UI : {ui}\n\
        Temporal address: {addr} (namespace default; `kubectl twc` finds it through TWC_ENV_FILE)\n\
        kubeconfig      : {kc}\n\
        logs            : {logs}\n\
        controller      : {controller}\n\
        metrics, probes : {metrics}, {health}/healthz, {health}/readyz\n\
        WRT webhook     : {webhook} (kinds {kinds})\n\
        Prometheus      : {prometheus}\n\
        Traces (Jaeger) : {traces}\n\
        \n\
        Try:\n\
        \x20 export KUBECONFIG={kc} TWC_ENV_FILE={env_file}\n\
        \x20 alias kubectl='{kubectl_bin}'\n\
        \x20 kubectl get wd -A\n\
        \x20 kubectl -n demo get deploy,wd\n\
        \x20 # roll out a new version (a new image tag is a new build ID):\n\
        \x20 kubectl -n demo patch wd hello --type merge -p '{{\"spec\":{{\"template\":{{\"spec\":{{\"containers\":[{{\"name\":\"worker\",\"image\":\"twc.local/sample-worker:v2\"}}]}}}}}}}}'\n\
        \x20 kubectl -n demo get wd hello -w\n\
        \x20 {temporal} worker deployment describe --name demo/hello --address {addr}\n\
        \x20 # the operator commands, as a kubectl plugin (no other setting needed here):\n\
        \x20 ln -sf {bin}/twc ~/.local/bin/kubectl-twc\n\
        \x20 kubectl twc status hello -n demo\n\
        \x20 kubectl twc pause hello -n demo    # also: resume, promote, abort, retry\n\
        \x20 # traffic for canary analysis, and its failure ratio per build (with --prometheus):\n\
        \x20 {bin}/twc-sandbox load --address {addr} --rate 5 --duration 5m\n\
        \x20 curl -s {prometheus_api}/api/v1/query --data-urlencode 'query=sum by (build_id) (rate(sample_greetings_total{{outcome=\"failed\"}}[1m])) / sum by (build_id) (rate(sample_greetings_total[1m]))'\n\
        {production}\
        \n\
        Ctrl-C stops everything.\n",
        ui = env.temporal_ui_url.as_deref().unwrap_or("(disabled)"),
        addr = env.temporal_address,
        kc = env.kubeconfig.display(),
        env_file = options
            .state_dir
            .join(twc_sandbox::env::ENV_FILE_NAME)
            .display(),
        logs = env.logs_dir.display(),
        controller = if options.controller {
            "running"
        } else {
            "not running (build it with `make build`)"
        },
        kubectl_bin = env.kubectl.display(),
        temporal = env.temporal_cli.display(),
        metrics = env.controller_metrics_url.as_deref().unwrap_or("-"),
        health = env.controller_health_url.as_deref().unwrap_or("-"),
        webhook = env.controller_webhook_url.as_deref().unwrap_or("-"),
        kinds = twc_sandbox::webhook::ALLOWED_KINDS,
        prometheus = env.prometheus_url.as_deref().map_or_else(
            || "not running (start it with --prometheus; `make tools` installs it)".to_owned(),
            |url| format!("{url} (scrapes every worker's /metrics each second)"),
        ),
        prometheus_api = env
            .prometheus_url
            .as_deref()
            .unwrap_or("http://<prometheus>"),
        bin = env.bin_dir.display(),
        production = production_banner(env),
        traces = env.tracing_query_url.as_deref().map_or_else(
            || "not running (start it with --tracing; `make jaeger` builds it)".to_owned(),
            |url| format!(
                "{url}/api/traces?service=twc (query API; the Jaeger UI's assets are not in \
                 its Go module, so {url}/ is a placeholder page); controller exports to {}",
                env.otlp_endpoint.as_deref().unwrap_or("-")
            ),
        ),
    );
}

/// The banner's lines about the production-like Temporal, when it runs.
fn production_banner(env: &twc_sandbox::env::SandboxEnv) -> String {
    let Some(p) = &env.production_temporal else {
        return String::new();
    };
    let tls = format!(
        "--address {} --tls-ca-path {} --tls-server-name {}",
        p.address,
        p.ca_path.display(),
        p.server_name
    );
    format!(
        "\n\
        Production-like Temporal (PostgreSQL, mutual TLS, JWT; log {log}):\n\
        \x20 address {addr}, server name {name}, CA {ca}{engine}\n\
        \x20 # mutual TLS: permissions from the certificate's OU (this one: system:admin)\n\
        \x20 {temporal} operator namespace describe -n default {tls} --tls-cert-path {admin_cert} --tls-key-path {admin_key}\n\
        \x20 # API key (JWT; {keys}/*.jwt) with a certificate that grants nothing by itself\n\
        \x20 {temporal} workflow list -n default {tls} --tls-cert-path {client_cert} --tls-key-path {client_key} --api-key \"$(cat {keys}/default-read.jwt)\"\n",
        log = p.log.display(),
        addr = p.address,
        name = p.server_name,
        ca = p.ca_path.display(),
        engine = if p.engine {
            "; the controller's engine runs here"
        } else {
            ""
        },
        temporal = env.temporal_cli.display(),
        admin_cert = p.admin_cert_path.display(),
        admin_key = p.admin_key_path.display(),
        client_cert = p.client_cert_path.display(),
        client_key = p.client_key_path.display(),
        keys = p.api_keys_dir.display(),
    )
}
