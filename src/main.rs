//! `twc`: the controller binary. `run` starts the watcher and the Temporal worker that hosts the
//! rollout workflows; the other subcommands are tools for people.

mod run;
mod watcher;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let result = match cli.command {
        Command::Crds { out_dir } => print_crds(out_dir),
        Command::Run(args) => run::run(*args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("twc: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,kube=warn,temporalio_sdk_core=warn".into());
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
