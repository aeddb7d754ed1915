//! One sandbox as the chaos tests see it, either the shared one of the test run or a private one
//! a test starts (and may break) on its own: kubectl, the temporal CLI and waits against *its*
//! servers, with *its* logs attached to every failure.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::process::Command;
use twc_crds::TemporalWorkerDeployment;
use twc_sandbox::env::SandboxEnv;
use twc_sandbox::up::{Sandbox, SandboxOptions};

use crate::harness::cli::{CliOutput, run};
use crate::harness::twd::{Routing, condition, get_twd, target_build};
use crate::harness::wait::wait_for_with_logs;
use crate::harness::{env, test_namespace};

/// A sandbox's servers seen through their CLIs and an admin client.
pub struct Cluster {
    /// Addresses, paths and tools.
    pub env: SandboxEnv,
    /// Admin client of its kube-apiserver.
    pub client: kube::Client,
}

/// One workflow execution from a visibility query.
#[derive(Debug, Clone)]
pub struct WorkflowRow {
    /// Workflow ID.
    pub id: String,
    /// Run ID.
    pub run_id: String,
    /// `RUNNING`, `COMPLETED`, `CANCELED`, `TERMINATED`, `CONTINUED_AS_NEW`, ...
    pub status: String,
}

impl Cluster {
    /// The shared sandbox of the test run.
    pub async fn shared() -> Self {
        Self::of(env().clone()).await
    }

    /// The sandbox described by `env`.
    pub async fn of(env: SandboxEnv) -> Self {
        let client = match twc_sandbox::apiserver::client(&env.kubeconfig).await {
            Ok(client) => client,
            Err(e) => panic!("kube client: {e}"),
        };
        Self { env, client }
    }

    /// Tails of this sandbox's logs (servers and controllers), for failure messages.
    pub fn logs(&self) -> String {
        let mut logs: Vec<PathBuf> = std::fs::read_dir(&self.env.logs_dir)
            .map(|dir| dir.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        logs.sort();
        logs.iter()
            .map(|log| {
                format!(
                    "===== {} =====\n{}\n",
                    log.display(),
                    twc_sandbox::process::tail(log, 60)
                )
            })
            .collect()
    }

    /// Polls `probe` until Ok; panics after `timeout` with the last observation and the logs.
    pub async fn wait<T, F, Fut>(&self, what: &str, timeout: Duration, probe: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, String>>,
    {
        wait_for_with_logs(what, timeout, || self.logs(), probe).await
    }

    /// A fresh Kubernetes namespace.
    pub async fn namespace(&self, prefix: &str) -> String {
        test_namespace(&self.client, prefix).await
    }

    /// kubectl with this sandbox's kubeconfig.
    pub async fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> CliOutput {
        let mut command = Command::new(&self.env.kubectl);
        command
            .arg("--kubeconfig")
            .arg(&self.env.kubeconfig)
            .args(args);
        run(command, stdin).await
    }

    /// The temporal CLI against this sandbox's dev server (namespace given in `args`, else
    /// `default`).
    pub async fn temporal(&self, args: &[&str]) -> CliOutput {
        let mut command = Command::new(&self.env.temporal_cli);
        command
            .args(args)
            .args(["--address", &self.env.temporal_address]);
        run(command, None).await
    }

    /// `kubectl apply --server-side`; panics with kubectl's message on failure.
    pub async fn apply(&self, manifest: &Value) {
        let out = self.try_apply(manifest).await;
        assert!(out.success, "kubectl apply failed: {}", out.stderr);
    }

    /// `kubectl apply --server-side`, failure returned.
    pub async fn try_apply(&self, manifest: &Value) -> CliOutput {
        self.kubectl(
            &["apply", "--server-side", "--force-conflicts", "-f", "-"],
            Some(&manifest.to_string()),
        )
        .await
    }

    /// A Connection named `name` to this sandbox's Temporal.
    pub fn connection(&self, namespace: &str, name: &str) -> Value {
        json!({
            "apiVersion": "temporal.io/v1alpha1",
            "kind": "Connection",
            "metadata": { "name": name, "namespace": namespace },
            "spec": { "hostPort": self.env.temporal_address }
        })
    }

    /// Sends the `control` signal with `action` (`"pause"`, ...) to a rollout workflow of the
    /// engine namespace directly, as the TWD's workflow forwards an accepted control (to pile
    /// up signals in its history).
    pub async fn signal_control(&self, workflow_id: &str, action: &str) {
        let input = format!("\"{action}\"");
        let out = self
            .temporal(&[
                "workflow",
                "signal",
                "--workflow-id",
                workflow_id,
                "--name",
                "control",
                "--input",
                &input,
            ])
            .await;
        assert!(
            out.success,
            "temporal workflow signal control {action} to {workflow_id}: {}",
            out.stderr
        );
    }

    /// Sends the operator control `action` (`promote`, ...) to the TWD's workflow
    /// (`twd/<namespace>/<name>`) as the `control` update; asserts it was accepted.
    pub async fn control(&self, namespace: &str, name: &str, action: &str) {
        let workflow_id = format!("twd/{namespace}/{name}");
        let input = format!("\"{action}\"");
        let out = self
            .temporal(&[
                "workflow",
                "update",
                "execute",
                "--workflow-id",
                &workflow_id,
                "--name",
                "control",
                "--input",
                &input,
            ])
            .await;
        assert!(
            out.success,
            "temporal workflow update control {action} of {workflow_id}: {}",
            out.stderr
        );
    }

    /// Routing of a worker deployment in Temporal namespace `temporal_ns`.
    pub async fn routing_in(
        &self,
        temporal_ns: &str,
        deployment_name: &str,
    ) -> Result<Routing, String> {
        let Some(v) = self
            .describe_deployment(temporal_ns, deployment_name)
            .await?
        else {
            return Ok(Routing::default());
        };
        Ok(Routing::from_describe(&v))
    }

    /// `temporal worker deployment describe --output json` of `deployment_name` in Temporal
    /// namespace `temporal_ns` (None: no such worker deployment).
    pub async fn describe_deployment(
        &self,
        temporal_ns: &str,
        deployment_name: &str,
    ) -> Result<Option<Value>, String> {
        let out = self
            .temporal(&[
                "worker",
                "deployment",
                "describe",
                "--namespace",
                temporal_ns,
                "--name",
                deployment_name,
                "--output",
                "json",
            ])
            .await;
        if !out.success {
            if out.stderr.contains("no Worker Deployment found") || out.stderr.contains("NotFound")
            {
                return Ok(None);
            }
            return Err(out.stderr);
        }
        serde_json::from_str(&out.stdout)
            .map(Some)
            .map_err(|e| format!("{e}: {}", out.stdout))
    }

    /// Routing of a worker deployment in the `default` Temporal namespace.
    pub async fn routing(&self, deployment_name: &str) -> Result<Routing, String> {
        self.routing_in(&self.env.temporal_namespace, deployment_name)
            .await
    }

    /// Every execution (each run) matching a visibility query in Temporal namespace
    /// `temporal_ns`; an empty query lists all of them.
    pub async fn workflows_in(
        &self,
        temporal_ns: &str,
        query: &str,
    ) -> Result<Vec<WorkflowRow>, String> {
        let mut args = vec![
            "workflow",
            "list",
            "--namespace",
            temporal_ns,
            "--output",
            "json",
        ];
        if !query.is_empty() {
            args.extend(["--query", query]);
        }
        let out = self.temporal(&args).await;
        if !out.success {
            return Err(out.stderr);
        }
        let text = out.stdout.trim();
        if text.is_empty() {
            return Ok(Vec::new());
        }
        let rows: Value = serde_json::from_str(text).map_err(|e| format!("{e}: {text}"))?;
        let field = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        Ok(rows
            .as_array()
            .into_iter()
            .flatten()
            .map(|row| WorkflowRow {
                id: field(&row["execution"]["workflowId"]),
                run_id: field(&row["execution"]["runId"]),
                status: field(&row["status"])
                    .trim_start_matches("WORKFLOW_EXECUTION_STATUS_")
                    .to_owned(),
            })
            .collect())
    }

    /// [`Self::workflows_in`] the engine namespace.
    pub async fn workflows(&self, query: &str) -> Result<Vec<WorkflowRow>, String> {
        self.workflows_in(&self.env.temporal_namespace, query).await
    }

    /// `temporal workflow describe --output json` of one run.
    pub async fn describe_workflow(
        &self,
        temporal_ns: &str,
        workflow_id: &str,
        run_id: &str,
    ) -> Result<Value, String> {
        let out = self
            .temporal(&[
                "workflow",
                "describe",
                "--namespace",
                temporal_ns,
                "--workflow-id",
                workflow_id,
                "--run-id",
                run_id,
                "--output",
                "json",
            ])
            .await;
        if !out.success {
            return Err(out.stderr);
        }
        serde_json::from_str(&out.stdout).map_err(|e| format!("{e}: {}", out.stdout))
    }

    /// `temporal workflow show --output json` (the full history) of one run, as text.
    pub async fn history(
        &self,
        temporal_ns: &str,
        workflow_id: &str,
        run_id: &str,
    ) -> Result<String, String> {
        let out = self
            .temporal(&[
                "workflow",
                "show",
                "--namespace",
                temporal_ns,
                "--workflow-id",
                workflow_id,
                "--run-id",
                run_id,
                "--output",
                "json",
            ])
            .await;
        if out.success {
            Ok(out.stdout)
        } else {
            Err(out.stderr)
        }
    }

    /// History size in bytes of one run, as Temporal accounts it.
    pub async fn history_size(&self, workflow_id: &str, run_id: &str) -> Result<u64, String> {
        let v = self
            .describe_workflow(&self.env.temporal_namespace, workflow_id, run_id)
            .await?;
        let size = &v["workflowExecutionInfo"]["historySizeBytes"];
        size.as_u64()
            .or_else(|| size.as_str().and_then(|s| s.parse().ok()))
            .ok_or_else(|| format!("no historySizeBytes in {v}"))
    }

    /// Waits until `Ready` is True for the TWD's current generation with a target build that
    /// starts with `<tag>-`; returns the TWD.
    pub async fn wait_ready(
        &self,
        namespace: &str,
        name: &str,
        tag: &str,
        timeout: Duration,
    ) -> TemporalWorkerDeployment {
        let prefix = format!("{tag}-");
        self.wait(
            &format!("TWD {namespace}/{name} Ready with build {tag}-*"),
            timeout,
            || async {
                let twd = get_twd(&self.client, namespace, name).await?;
                let ready = condition(&twd, "Ready")
                    .is_some_and(|(s, r, _)| s == "True" && r == "RolloutComplete");
                if ready
                    && fresh(&twd)
                    && target_build(&twd).is_some_and(|b| b.starts_with(&prefix))
                {
                    Ok(twd)
                } else {
                    Err(status_text(&twd))
                }
            },
        )
        .await
    }

    /// Waits until condition `type_` has `reason` for the TWD's current generation; returns
    /// (status, message).
    pub async fn wait_reason(
        &self,
        namespace: &str,
        name: &str,
        type_: &str,
        reason: &str,
        timeout: Duration,
    ) -> (String, String) {
        self.wait(
            &format!("TWD {namespace}/{name} {type_} reason {reason}"),
            timeout,
            || async {
                let twd = get_twd(&self.client, namespace, name).await?;
                match condition(&twd, type_) {
                    Some((status, r, message)) if r == reason && fresh(&twd) => {
                        Ok((status, message))
                    }
                    _ => Err(status_text(&twd)),
                }
            },
        )
        .await
    }
}

/// Status was written for the object's current generation.
pub fn fresh(twd: &TemporalWorkerDeployment) -> bool {
    twd.status.as_ref().and_then(|s| s.observed_generation) == twd.metadata.generation
}

/// The status as JSON text, for "last observed" messages.
pub fn status_text(twd: &TemporalWorkerDeployment) -> String {
    format!(
        "generation {:?}, status {}",
        twd.metadata.generation,
        serde_json::to_string(&twd.status).unwrap_or_default()
    )
}

/// A sandbox of its own (Temporal, kube-apiserver, pod runner, controller), for a test that
/// kills or restarts its servers or runs more controllers. Its state lives next to the shared
/// sandbox's, in `<state-dir>/chaos/<name>`; stop it with `sandbox.stop()` (dropping it kills
/// everything it started).
pub struct Private {
    /// The running sandbox (restart and kill its parts through it).
    pub sandbox: Sandbox,
    /// Its servers seen through their CLIs.
    pub cluster: Cluster,
}

impl Private {
    /// Starts a private sandbox with a controller, fast drainage and no Web UI.
    pub async fn start(name: &str) -> Self {
        Self::start_with_controller(name, None).await
    }

    /// [`Self::start`] with the controller run from `controller_bin` (None: the build under
    /// test's `twc`), e.g. an older release's build.
    pub async fn start_with_controller(name: &str, controller_bin: Option<PathBuf>) -> Self {
        Self::start_with(name, controller_bin, &[]).await
    }

    /// [`Self::start_with_controller`] with more dynamic config for its Temporal dev server
    /// (`key=value` each, after the shared sandbox's own).
    pub async fn start_with(
        name: &str,
        controller_bin: Option<PathBuf>,
        temporal_dynamic_config: &[&str],
    ) -> Self {
        let shared = env();
        let base = shared
            .logs_dir
            .parent()
            .map_or_else(std::env::temp_dir, Path::to_owned);
        let repo_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        // <tools>/venv/bin/temporal
        let tools_dir = shared
            .temporal_cli
            .ancestors()
            .nth(3)
            .map_or_else(|| repo_dir.join(".tools"), Path::to_owned);
        let options = SandboxOptions {
            state_dir: base.join("chaos").join(name),
            tools_dir,
            bin_dir: shared.bin_dir.clone(),
            repo_dir,
            ui: false,
            fast_drainage: true,
            temporal_dynamic_config: shared
                .temporal_dynamic_config
                .iter()
                .cloned()
                .chain(temporal_dynamic_config.iter().map(|e| (*e).to_owned()))
                .collect(),
            controller: true,
            controller_bin,
        };
        let sandbox = match Sandbox::start(&options).await {
            Ok(sandbox) => sandbox,
            Err(e) => panic!(
                "starting the private sandbox {}: {e:#}",
                options.state_dir.display()
            ),
        };
        let cluster = Cluster::of(sandbox.env.clone()).await;
        Self { sandbox, cluster }
    }
}
