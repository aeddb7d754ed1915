//! The operator commands: `status`, `pause`, `resume`, `promote`, `abort`, `retry`. The same
//! binary installed as `kubectl-twc` is a kubectl plugin (`kubectl twc promote my-worker`).
//!
//! They read the TWD from Kubernetes with kubectl's flags and talk to its workflows in the
//! engine Temporal (found through the kubeconfig's env file in the `make dev` sandbox);
//! `--via-annotation` sends a control through the Kubernetes API alone. Exit codes: 0 done
//! (accepted), 1 failed or rejected, 2 usage, 3 not found.

pub mod control;
pub mod engine;
pub mod status;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use kube::config::{Config, KubeConfigOptions, Kubeconfig};
use temporalio_client::errors::WorkflowQueryError;
use temporalio_client::{Client, WorkflowQueryOptions};
use twc_crds::WorkerObject;
use twc_workflows::control::ControlState;
use twc_workflows::model::TwdRef;
use twc_workflows::rollout_workflow::RolloutWorkflow;
use twc_workflows::twd_workflow::{TwdStatusView, TwdWorkflow};

use self::engine::EngineArgs;

/// Exit code of a failure (including a control that does not apply).
pub const EXIT_FAILURE: u8 = 1;
/// Exit code when the TWD or its workflow does not exist.
pub const EXIT_NOT_FOUND: u8 = 3;

/// Which TWD, and how to reach its cluster (kubectl's flags).
#[derive(clap::Args, Debug, Clone)]
pub struct TwdArgs {
    /// Name of the WorkerDeployment (or TemporalWorkerDeployment).
    pub name: String,
    /// Namespace of the TWD (default: the kubeconfig context's namespace).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context to use (default: the current context).
    #[arg(long)]
    pub context: Option<String>,
}

/// Something the command was asked about does not exist (exit code 3).
#[derive(Debug)]
pub struct NotFound(pub String);

impl std::fmt::Display for NotFound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NotFound {}

/// A control rejected because it does not apply to the rollout as it is, with the reason
/// (exit code 1; printed as `rejected: <reason>`).
#[derive(Debug)]
pub struct NotApplicable(pub String);

impl std::fmt::Display for NotApplicable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rejected: {}", self.0)
    }
}

impl std::error::Error for NotApplicable {}

/// Runs an operator command on a fresh tokio runtime.
pub fn block_on<F: std::future::Future<Output = anyhow::Result<()>>>(
    future: F,
) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting tokio")?
        .block_on(future)
}

/// A Kubernetes client from kubectl's flags, and the namespace to use.
pub async fn kube_client(args: &TwdArgs) -> anyhow::Result<(kube::Client, String)> {
    let config = kube_config(args.kubeconfig.as_deref(), args.context.as_deref()).await?;
    let namespace = args
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let client = kube::Client::try_from(config).context("building the Kubernetes client")?;
    Ok((client, namespace))
}

/// The Kubernetes client configuration kubectl would use with `--kubeconfig` and `--context`.
pub async fn kube_config(
    kubeconfig: Option<&std::path::Path>,
    context: Option<&str>,
) -> anyhow::Result<Config> {
    let options = KubeConfigOptions {
        context: context.map(str::to_owned),
        ..KubeConfigOptions::default()
    };
    match kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .with_context(|| format!("loading kubeconfig {}", path.display()))
        }
        None if context.is_some() => Config::from_kubeconfig(&options)
            .await
            .context("loading the kubeconfig"),
        None => Config::infer()
            .await
            .context("finding a kubeconfig (set --kubeconfig or KUBECONFIG)"),
    }
}

/// Reads the TWD: the `WorkerDeployment` or `TemporalWorkerDeployment` of that name that holds
/// its Temporal Worker Deployment; none of either kind is [`NotFound`].
pub async fn get_twd(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> anyhow::Result<WorkerObject> {
    let twd = TwdRef {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
    };
    match twc_activities::k8s::get_twd(client, &twd).await {
        Ok(Some(object)) => Ok(object),
        Ok(None) => Err(NotFound(format!(
            "workerdeployment (or temporalworkerdeployment) {name:?} not found in namespace {namespace:?}"
        ))
        .into()),
        Err(e) => Err(anyhow::Error::new(e).context(format!("reading {namespace}/{name}"))),
    }
}

/// Identity recorded in the workflow history with each signal: who sent the control.
pub fn cli_identity() -> String {
    let user = ["USER", "USERNAME", "LOGNAME"]
        .into_iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
        .unwrap_or_else(|| "unknown".to_owned());
    format!("twc-cli@{user}")
}

/// The engine flags of a command, with the Temporal of the `make dev` sandbox when the
/// kubeconfig in use is that sandbox's and no address was given.
pub fn engine_args(engine: &EngineArgs, twd: &TwdArgs) -> EngineArgs {
    engine.or_sandbox(engine::sandbox_of(twd.kubeconfig.as_deref()).as_ref())
}

/// Connects to the engine Temporal within `within`.
pub async fn engine_client(args: &EngineArgs, within: Duration) -> anyhow::Result<Client> {
    let config = args.config(twc_workflows::ENGINE_TASK_QUEUE, &cli_identity());
    match tokio::time::timeout(within, twc_worker::connect_engine(&config)).await {
        Ok(client) => client
            .map_err(anyhow::Error::from)
            .with_context(|| format!("connecting to the engine Temporal at {}", config.address)),
        Err(_) => anyhow::bail!(
            "connecting to the engine Temporal at {} timed out after {}s (set --engine-address or TWC_ENGINE_ADDRESS)",
            config.address,
            within.as_secs()
        ),
    }
}

/// What the engine knows about a TWD: its workflow's view and, when a rollout runs, what a
/// control would do to it.
pub struct EngineView {
    /// The TWD workflow's `status` query.
    pub twd: TwdStatusView,
    /// The rollout's `control_state` query (None when there is no rollout).
    pub control: Option<ControlState>,
}

/// Queries the TWD workflow and its rollout; a missing TWD workflow is [`NotFound`].
pub async fn engine_view(engine: &Client, twd: &TwdRef) -> anyhow::Result<EngineView> {
    let workflow_id = twd.twd_workflow_id();
    let view = engine
        .get_workflow_handle::<TwdWorkflow>(workflow_id.clone())
        .query(TwdWorkflow::status, (), WorkflowQueryOptions::default())
        .await;
    let view = match view {
        Ok(view) => view,
        Err(WorkflowQueryError::NotFound(_)) => {
            return Err(NotFound(format!(
                "workflow {workflow_id} not found in the engine namespace: is the controller running and watching namespace {:?}?",
                twd.namespace
            ))
            .into());
        }
        Err(e) => {
            return Err(anyhow::Error::new(e).context(format!("querying workflow {workflow_id}")));
        }
    };
    let Some(active) = view.active.clone() else {
        return Ok(EngineView {
            twd: view,
            control: None,
        });
    };
    let queried = engine
        .get_workflow_handle::<RolloutWorkflow>(active.workflow_id.clone())
        .query(
            RolloutWorkflow::control_state,
            (),
            WorkflowQueryOptions::default(),
        )
        .await;
    let control = match queried {
        Ok(state) => state,
        // A rollout that has ended may not answer queries; its last report says enough.
        Err(e) => {
            tracing::debug!(workflow_id = %active.workflow_id, "control_state query failed: {e}");
            let report = view
                .last_report
                .as_ref()
                .filter(|r| r.workflow_id == active.workflow_id);
            ControlState::from_report(&active.build_id, report)
        }
    };
    Ok(EngineView {
        twd: view,
        control: Some(control),
    })
}

/// Percent-encodes a URL path segment or query value.
pub fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `1h2m`, `3m4s`, `5s`.
pub fn human_duration(millis: i64) -> String {
    let secs = (millis.max(0) + 999) / 1000;
    let (h, m, s) = (secs / 3600, secs % 3600 / 60, secs % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, _) => format!("{m}m{s}s"),
        _ => format!("{h}h{m}m"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workflow_ids_are_encoded_for_web_ui_links() {
        assert_eq!(
            url_encode("rollout/ns/hello/v2-abc_1.x"),
            "rollout%2Fns%2Fhello%2Fv2-abc_1.x"
        );
        assert_eq!(url_encode("TwcName='a b'"), "TwcName%3D%27a%20b%27");
    }

    #[test]
    fn durations_read_like_kubectl_ages() {
        assert_eq!(human_duration(0), "0s");
        assert_eq!(human_duration(4_200), "5s");
        assert_eq!(human_duration(125_000), "2m5s");
        assert_eq!(human_duration(3_720_000), "1h2m");
        assert_eq!(human_duration(-5), "0s");
    }
}
