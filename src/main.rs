//! `twc`: the controller binary. `run` starts the watcher and the Temporal worker that hosts the
//! rollout workflows; the other subcommands are tools for people. Installed (or linked) as
//! `kubectl-twc`, it is a kubectl plugin: `kubectl twc status my-worker -n prod`.

mod cli;
mod dashboard;
mod deployment_watch;
mod replicas;
mod resource_templates;
mod run;
mod watcher;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use twc_workflows::model::ControlAction;

use crate::cli::control::ControlArgs;

/// Rolls out Temporal workers on Kubernetes with Worker Versioning.
#[derive(Parser)]
#[command(name = "twc", version, about)]
struct Cli {
    /// Log format: `text` or `json`.
    #[arg(long, global = true, env = "TWC_LOG_FORMAT", default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the controller: the watcher and the engine's Temporal worker.
    Run(Box<run::RunArgs>),
    /// Print the CustomResourceDefinitions (or write them into a folder).
    Crds {
        /// Write one YAML file per CRD into this folder instead of printing them.
        #[arg(long)]
        out_dir: Option<PathBuf>,
    },
    /// Show a TWD's rollout: versions, ramp, step, time to the next step, gate, events, links.
    Status(Box<cli::status::StatusArgs>),
    /// Hold the rollout in flight where it is (ramp unchanged, step timer stopped).
    Pause(Box<ControlArgs>),
    /// Release an operator's pause; the step in force continues where it paused.
    Resume(Box<ControlArgs>),
    /// Skip the remaining steps and pauses: make the new version Current now.
    Promote(Box<ControlArgs>),
    /// Stop the rollout: route back to the previous Current version and retire the new one.
    Abort(Box<ControlArgs>),
    /// Run a failed gate again, restart a rollout stopped by its progress deadline, or roll out
    /// an aborted version again.
    Retry(Box<ControlArgs>),
    /// Serve a live web page of every worker deployment, with the controls as buttons.
    Dashboard(Box<dashboard::DashboardArgs>),
}

/// Name of the binary as a kubectl plugin.
const KUBECTL_PLUGIN: &str = "kubectl-twc";

fn main() -> ExitCode {
    let plugin = std::env::args_os()
        .next()
        .map(PathBuf::from)
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .is_some_and(|n| n == KUBECTL_PLUGIN);
    let mut command = Cli::command();
    if plugin {
        command = command.name("kubectl twc").bin_name("kubectl twc");
    }
    // Usage errors exit with code 2 (clap's convention).
    let cli = match Cli::from_arg_matches(&command.get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let quiet = !matches!(cli.command, Command::Run(_) | Command::Dashboard(_));
    init_logging(cli.log_format, quiet);
    let result = match cli.command {
        Command::Crds { out_dir } => print_crds(out_dir),
        Command::Run(args) => run::run(*args),
        Command::Status(args) => cli::status::run(*args),
        Command::Pause(args) => cli::control::run(ControlAction::Pause, *args),
        Command::Resume(args) => cli::control::run(ControlAction::Resume, *args),
        Command::Promote(args) => cli::control::run(ControlAction::Promote, *args),
        Command::Abort(args) => cli::control::run(ControlAction::Abort, *args),
        Command::Retry(args) => cli::control::run(ControlAction::Retry, *args),
        Command::Dashboard(args) => dashboard::run(*args),
    };
    let name = if plugin { "kubectl twc" } else { "twc" };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.downcast_ref::<cli::NotApplicable>().is_some() => {
            eprintln!("{e}");
            ExitCode::from(cli::EXIT_FAILURE)
        }
        Err(e) if e.downcast_ref::<cli::NotFound>().is_some() => {
            eprintln!("{name}: {e:#}");
            ExitCode::from(cli::EXIT_NOT_FOUND)
        }
        Err(e) => {
            eprintln!("{name}: {e:#}");
            ExitCode::from(cli::EXIT_FAILURE)
        }
    }
}

/// Logs go to stderr; the operator commands only log warnings unless `RUST_LOG` says otherwise.
fn init_logging(format: LogFormat, quiet: bool) {
    let default = if quiet {
        "warn"
    } else {
        "info,kube=warn,temporalio_sdk_core=warn"
    };
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| default.into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(false).init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn print_crds(out_dir: Option<PathBuf>) -> anyhow::Result<()> {
    for manifest in twc_crds::crd_yaml::crd_manifests() {
        let yaml = twc_crds::crd_yaml::render_yaml(&manifest.crd)?;
        match &out_dir {
            Some(dir) => {
                let path = dir.join(manifest.file_name);
                std::fs::write(&path, yaml)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            None => print!("---\n{yaml}"),
        }
    }
    Ok(())
}
