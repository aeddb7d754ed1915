//! `kubectl twc dashboard`: a local web page of every worker deployment in the chosen
//! namespaces, live (Kubernetes watches pushed to the page as server-sent events), with the
//! operator controls as buttons that go through the same validated path as the CLI.
//!
//! It runs on the operator's machine with the caller's kubeconfig and the engine Temporal the
//! CLI uses; it writes nothing but the controls. The page, its script, styles and icon are
//! compiled into the binary: nothing is fetched from elsewhere at run time.

mod details;
mod engine;
pub mod model;
mod server;
mod store;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use tokio::net::TcpListener;

use self::engine::Engine;
use self::store::Store;
use crate::cli::engine::{EngineArgs, sandbox_of};
use crate::cli::{block_on, kube_config};

/// Changes kept for a page that reads them slowly before it is told to reload.
const CHANGES_KEPT: usize = 4096;

/// Flags of `dashboard`.
#[derive(clap::Args, Debug, Clone)]
pub struct DashboardArgs {
    /// Namespaces to show, comma-separated or repeated (default: every namespace).
    #[arg(short = 'n', long = "namespace", value_delimiter = ',')]
    namespaces: Vec<String>,
    /// Address to listen on (default: loopback only; the page can send controls).
    #[arg(long, env = "TWC_DASHBOARD_ADDRESS", default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    address: IpAddr,
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, env = "TWC_DASHBOARD_PORT", default_value_t = 3100)]
    port: u16,
    /// Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then in-cluster).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Kubeconfig context to use (default: the current context).
    #[arg(long)]
    context: Option<String>,
    #[command(flatten)]
    engine: EngineArgs,
    /// Temporal Web UI base URL, for links to the workflows (e.g. http://localhost:8233).
    #[arg(long, env = "TWC_UI_URL")]
    ui_url: Option<String>,
}

/// What the server needs.
pub struct Dashboard {
    store: Arc<Store>,
    engine: Engine,
    kube: kube::Client,
    ui_url: Option<String>,
    /// Whether it listens on a loopback address only (then only loopback host names are served,
    /// so a DNS-rebound page of another site cannot reach it).
    loopback: bool,
}

/// Runs the dashboard until Ctrl-C.
pub fn run(args: DashboardArgs) -> anyhow::Result<()> {
    block_on(serve(args))
}

async fn serve(args: DashboardArgs) -> anyhow::Result<()> {
    let config = kube_config(args.kubeconfig.as_deref(), args.context.as_deref()).await?;
    let kube = kube::Client::try_from(config).context("building the Kubernetes client")?;
    let sandbox = sandbox_of(args.kubeconfig.as_deref());
    let engine = Engine::new(args.engine.or_sandbox(sandbox.as_ref()));
    let ui_url = args
        .ui_url
        .clone()
        .or_else(|| sandbox.and_then(|s| s.temporal_ui_url))
        .map(|u| u.trim_end_matches('/').to_owned())
        .filter(|u| !u.is_empty());
    let store = Store::new(CHANGES_KEPT);
    let address = SocketAddr::new(args.address, args.port);
    let listener = TcpListener::bind(address)
        .await
        .with_context(|| format!("listening on {address} (choose another with --port)"))?;
    let bound = listener.local_addr().context("reading the bound address")?;
    let dashboard = Arc::new(Dashboard {
        store: store.clone(),
        engine,
        kube: kube.clone(),
        ui_url,
        loopback: bound.ip().is_loopback(),
    });
    println!("Dashboard: http://{bound}/ (Ctrl-C to stop)");
    let namespaces = args.namespaces.clone();
    tokio::select! {
        () = store::watch(store, kube, namespaces) => Ok(()),
        () = server::serve(listener, dashboard) => Ok(()),
        signal = tokio::signal::ctrl_c() => signal.context("waiting for Ctrl-C"),
    }
}
