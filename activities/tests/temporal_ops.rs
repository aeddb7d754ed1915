//! The Temporal operations against a real Temporal dev server and real versioned workers.
//!
//! Needs two binaries, given by environment variables (the Makefile sets them):
//! - `TWC_TEMPORAL_CLI`: the `temporal` CLI (runs `temporal server start-dev`),
//! - `TWC_SAMPLE_WORKER`: the sample worker (`cargo build -p twc-sample-worker`).
//!
//! The test starts its own dev server on free ports and its own worker processes, runs independent
//! scenarios concurrently on unique worker deployment names, and kills every process it started.

use std::{
    future::Future,
    path::{Path, PathBuf},
    process::Stdio,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result, anyhow, bail, ensure};
use serde_json::json;
use temporalio_client::{
    grpc::WorkflowService,
    tonic::{Code, IntoRequest},
};
use temporalio_common::protos::temporal::api::{
    common::v1::{Payload, Payloads, WorkflowExecution, WorkflowType},
    enums::v1::{TaskQueueKind as TaskQueueKindProto, WorkflowExecutionStatus},
    history::v1::history_event::Attributes,
    taskqueue::v1::TaskQueue,
    workflow::v1::versioning_override::Override,
    workflowservice::v1::{
        DescribeWorkerDeploymentVersionRequest, DescribeWorkflowExecutionRequest,
        DescribeWorkflowExecutionResponse, GetWorkflowExecutionHistoryRequest,
        RequestCancelWorkflowExecutionRequest, SetWorkerDeploymentCurrentVersionRequest,
        SetWorkerDeploymentManagerRequest, SignalWorkflowExecutionRequest,
        StartWorkflowExecutionRequest, TerminateWorkflowExecutionRequest,
        set_worker_deployment_manager_request::NewManagerIdentity,
    },
};
use tokio::{
    process::{Child, Command},
    sync::Mutex,
    time::Instant,
};
use twc_activities::{
    connection::{ConnectionAuth, ConnectionConfig},
    temporal::{
        ClientPool, DrainError, DrainStep, GateKey, PoolOptions, QueryFeature, TaskQueueKind,
        TemporalClient,
        analysis::{self, Limits, TemporalCheck, WorkflowFilter},
        backlog::UNKNOWN_TO_TEMPORAL,
        cancel_build_gates, cancel_gates, count_pinned, delete_version, delete_worker_deployment,
        describe_worker_deployment, drain_version,
        error::is_manager_identity_conflict,
        gate_workflow_id, read_backlog,
        replay::{CandidateSource, candidate_query, list_candidates, pick},
        reset_to_unversioned,
        routing::{METADATA_CONTROLLER, METADATA_CONTROLLER_VERSION},
        set_routing, start_gates, stop_build_gates, version_task_queues, wait_gates,
    },
};
use twc_crds::worker_deployment::VersionState;
use twc_workflows::{
    contract::{
        DeleteVersionOutcome, DrainAction, GateRun, Measurement, PinnedCount, RoutingChange,
        RoutingOutcome, StepGateRef, Verdict, VersionBacklog,
    },
    model::{BlockReason, TemporalState},
};

const NAMESPACE: &str = "default";
const IDENTITY: &str = "twc-test/controller";
const OTHER_IDENTITY: &str = "someone-else";
const TASK_QUEUE: &str = "hello-world";
/// Upper bound for the whole test.
const TEST_DEADLINE: Duration = Duration::from_secs(300);
/// Upper bound for one awaited condition.
const WAIT: Duration = Duration::from_secs(60);

/// A process started by the test; killed explicitly at the end (and on drop as a fallback).
struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn spawn(name: &str, mut command: Command, log_dir: &Path) -> Result<Self> {
        let log = log_dir.join(format!("{}.log", name.replace('/', "_")));
        let out =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        Ok(Self {
            name: name.to_owned(),
            child,
            log,
        })
    }

    async fn kill(&mut self) {
        if let Err(e) = self.child.kill().await {
            eprintln!("killing {}: {e}", self.name);
        }
    }
}

/// Shared by the scenarios.
struct Ctx {
    worker_bin: PathBuf,
    cli: PathBuf,
    address: String,
    log_dir: PathBuf,
    suffix: String,
    pool: ClientPool,
    config: ConnectionConfig,
    procs: Mutex<Vec<Proc>>,
}

impl Ctx {
    /// A worker deployment name unique to this run (`<k8s-namespace>/<name>` like real ones).
    fn deployment(&self, scenario: &str) -> String {
        format!("twc-test/{scenario}-{}", self.suffix)
    }

    async fn client(&self) -> Result<TemporalClient> {
        self.pool
            .get(&self.config)
            .await
            .map_err(|b| anyhow!("{:?}: {}", b.reason, b.message))
    }

    /// Starts a sample worker of `deployment`/`build_id` polling `hello-world`.
    async fn start_worker(&self, deployment: &str, build_id: &str) -> Result<()> {
        self.start_worker_on(deployment, build_id, TASK_QUEUE)
            .await
            .map(|_| ())
    }

    /// Starts a sample worker of `deployment`/`build_id` polling `task_queue`; returns its
    /// process ID.
    async fn start_worker_on(
        &self,
        deployment: &str,
        build_id: &str,
        task_queue: &str,
    ) -> Result<u32> {
        self.start_worker_with(deployment, build_id, task_queue, &[])
            .await
    }

    /// [`Ctx::start_worker_on`] with more environment variables.
    async fn start_worker_with(
        &self,
        deployment: &str,
        build_id: &str,
        task_queue: &str,
        vars: &[(&str, &str)],
    ) -> Result<u32> {
        let mut command = Command::new(&self.worker_bin);
        command
            .env("TEMPORAL_ADDRESS", &self.address)
            .env("TEMPORAL_NAMESPACE", NAMESPACE)
            .env("TEMPORAL_DEPLOYMENT_NAME", deployment)
            .env("TEMPORAL_WORKER_BUILD_ID", build_id)
            .env("SAMPLE_TASK_QUEUE", task_queue)
            .env("RUST_LOG", "info")
            .envs(vars.iter().copied());
        let proc = Proc::spawn(
            &format!("worker-{deployment}-{build_id}"),
            command,
            &self.log_dir,
        )?;
        let pid = proc.child.id().context("the worker exited at once")?;
        self.procs.lock().await.push(proc);
        Ok(pid)
    }

    /// Stops a worker this test started (SIGTERM, the SDK's graceful shutdown) and waits until
    /// its process exited, so nothing of it polls any more.
    async fn stop_worker(&self, pid: u32) -> Result<()> {
        let mut proc = {
            let mut procs = self.procs.lock().await;
            let index = procs
                .iter()
                .position(|p| p.child.id() == Some(pid))
                .with_context(|| format!("no running process {pid} of this test"))?;
            procs.remove(index)
        };
        signal_process(pid, "-TERM").await?;
        // On timeout the process is killed as `proc` drops.
        let status = tokio::time::timeout(WAIT, proc.child.wait())
            .await
            .with_context(|| format!("{} did not stop within {WAIT:?}", proc.name))?
            .with_context(|| format!("waiting for {} to stop", proc.name))?;
        eprintln!("{} stopped: {status}", proc.name);
        Ok(())
    }

    async fn describe(&self, deployment: &str) -> Result<TemporalState> {
        describe_worker_deployment(&self.client().await?, NAMESPACE, deployment)
            .await
            .map_err(|b| anyhow!("{:?}: {}", b.reason, b.message))
    }

    /// Waits until `build_id` appears among the deployment's versions.
    async fn registered(&self, deployment: &str, build_id: &str) -> Result<TemporalState> {
        eventually(
            &format!("{deployment}:{build_id} to register"),
            WAIT,
            || async {
                let state = self.describe(deployment).await?;
                Ok(state.version(build_id).is_some().then_some(state))
            },
        )
        .await
    }

    async fn kill_all(&self) {
        for proc in self.procs.lock().await.iter_mut() {
            proc.kill().await;
        }
    }
}

/// Polls `check` until it gives `Some` or `timeout` passes (errors count as "not yet").
async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    let mut last = String::from("condition not met");
    loop {
        match check().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => {}
            Err(e) => last = format!("{e:#}"),
        }
        if Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting for {what}; last: {last}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn env_path(var: &str) -> PathBuf {
    match std::env::var_os(var) {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        _ => panic!(
            "{var} is not set: it must point at the {} binary (the Makefile sets it)",
            if var == "TWC_TEMPORAL_CLI" {
                "`temporal` CLI"
            } else {
                "sample worker"
            }
        ),
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Starts a dev server on free ports; `dynamic_config` adds `--dynamic-config-value` entries.
async fn start_server(
    cli: &Path,
    log_dir: &Path,
    name: &str,
    dynamic_config: &[&str],
) -> Result<(Proc, String)> {
    let port = free_port()?;
    let mut command = Command::new(cli);
    command.args([
        "server",
        "start-dev",
        "--ip",
        "127.0.0.1",
        "--port",
        &port.to_string(),
        "--http-port",
        &free_port()?.to_string(),
        "--metrics-port",
        &free_port()?.to_string(),
        "--headless",
        "--log-level",
        "warn",
        "--dynamic-config-value",
        "matching.wv.VersionDrainageStatusRefreshInterval=\"1s\"",
        "--dynamic-config-value",
        "matching.wv.VersionDrainageStatusVisibilityGracePeriod=\"1s\"",
    ]);
    for value in dynamic_config {
        command.args(["--dynamic-config-value", value]);
    }
    let proc = Proc::spawn(name, command, log_dir)?;
    Ok((proc, format!("127.0.0.1:{port}")))
}

fn plaintext_config(address: &str) -> ConnectionConfig {
    ConnectionConfig {
        host_port: address.to_owned(),
        server_name: None,
        temporal_namespace: NAMESPACE.to_owned(),
        auth: ConnectionAuth::None,
        cache_key: format!("test/{address}"),
        server_ca_pem: None,
        worker_ca_in_secret: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn temporal_operations_against_a_dev_server() {
    let cli = env_path("TWC_TEMPORAL_CLI");
    let worker_bin = env_path("TWC_SAMPLE_WORKER");
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    let suffix = format!("{}-{nanos:x}", std::process::id());
    let log_dir = std::env::temp_dir().join(format!("twc-temporal-ops-{suffix}"));
    std::fs::create_dir_all(&log_dir).expect("log dir");

    // One workflow task failure or timeout is enough for the server to report a stuck
    // workflow (`TemporalReportedProblems`), which the analysis scenario counts.
    let (mut server, address) = start_server(
        &cli,
        &log_dir,
        "temporal-dev-server",
        &["system.numConsecutiveWorkflowTaskProblemsToTriggerSearchAttribute=1"],
    )
    .await
    .expect("dev server starts");
    let ctx = Arc::new(Ctx {
        worker_bin,
        cli,
        address: address.clone(),
        log_dir: log_dir.clone(),
        suffix,
        pool: ClientPool::new(PoolOptions::new(IDENTITY)),
        config: plaintext_config(&address),
        procs: Mutex::new(Vec::new()),
    });

    let outcome = tokio::time::timeout(TEST_DEADLINE, async {
        wait_for_server(&mut server, &ctx.pool, &ctx.config).await?;
        let (a, b, c, d, e, f, g, h) = tokio::join!(
            scenario_routing_gates_deletion(&ctx),
            scenario_manager_identity(&ctx),
            scenario_missing_things(&ctx),
            scenario_rate_limited(&ctx),
            scenario_drain(&ctx),
            scenario_analysis(&ctx),
            scenario_backlog(&ctx),
            scenario_replay(&ctx),
        );
        let failures: Vec<String> = [
            ("routing/gates/deletion", a),
            ("manager identity", b),
            ("missing things", c),
            ("rate limited", d),
            ("drain", e),
            ("analysis", f),
            ("backlog", g),
            ("replay", h),
        ]
        .into_iter()
        .filter_map(|(name, r)| r.err().map(|e| format!("{name}: {e:#}")))
        .collect();
        if failures.is_empty() {
            Ok(())
        } else {
            Err(anyhow!(failures.join("\n")))
        }
    })
    .await;

    ctx.kill_all().await;
    server.kill().await;

    match outcome {
        Ok(Ok(())) => {
            let _ = std::fs::remove_dir_all(&log_dir);
        }
        Ok(Err(e)) => panic!("{e:#}\n(process logs in {})", log_dir.display()),
        Err(_) => panic!(
            "test exceeded {TEST_DEADLINE:?} (process logs in {})",
            log_dir.display()
        ),
    }
}

/// Waits until the server answers and the namespace exists.
async fn wait_for_server(
    server: &mut Proc,
    pool: &ClientPool,
    config: &ConnectionConfig,
) -> Result<()> {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok(Some(status)) = server.child.try_wait() {
            bail!(
                "dev server exited with {status}; see {}",
                server.log.display()
            );
        }
        let last = match pool.get(config).await {
            Ok(client) => {
                match describe_worker_deployment(&client, NAMESPACE, "twc-test/probe").await {
                    Ok(_) => return Ok(()),
                    Err(b) => b.message,
                }
            }
            Err(b) => b.message,
        };
        if Instant::now() >= deadline {
            bail!("the dev server did not accept calls within {WAIT:?}: {last}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Rejects a routing outcome other than `Applied`.
fn applied(
    what: &str,
    outcome: Result<RoutingOutcome, twc_activities::temporal::TemporalError>,
) -> Result<()> {
    match outcome {
        Ok(RoutingOutcome::Applied) => Ok(()),
        other => bail!("{what}: expected Applied, got {other:?}"),
    }
}

async fn run_gates_to_end(
    client: &TemporalClient,
    runs: Vec<GateRun>,
) -> Result<(Vec<GateRun>, usize)> {
    let beats = AtomicUsize::new(0);
    let done = tokio::time::timeout(
        WAIT,
        wait_gates(client, NAMESPACE, runs, || {
            beats.fetch_add(1, Ordering::Relaxed);
        }),
    )
    .await
    .context("gates did not close in time")?
    .map_err(|b| anyhow!("{:?}: {}", b.reason, b.message))?;
    Ok((done, beats.load(Ordering::Relaxed)))
}

/// Registration, SetCurrent with manager claim, ramp, conflict, gates (pass, fail, cancel),
/// deletion refusals, drainage, return to unversioned.
async fn scenario_routing_gates_deletion(ctx: &Ctx) -> Result<()> {
    let dep = ctx.deployment("main");
    let client = ctx.client().await?;

    // Registration after the first poll.
    ctx.start_worker(&dep, "v1").await?;
    let state = ctx.registered(&dep, "v1").await?;
    ensure!(state.exists);
    ensure!(
        state.version("v1").map(|v| v.state) == Some(VersionState::Inactive),
        "new version should be Inactive: {state:?}"
    );
    ensure!(state.manager_identity.is_empty(), "{state:?}");
    // The version's own record can lag its summary a little, and task queues register one by
    // one as the worker's pollers arrive.
    let queues = eventually("v1's task queues", WAIT, || async {
        let queues = version_task_queues(&client, NAMESPACE, &dep, "v1")
            .await
            .map_err(|b| anyhow!("{}", b.message))?
            .unwrap_or_default();
        let both = queues.contains(&(TASK_QUEUE.to_owned(), TaskQueueKind::Workflow))
            && queues.contains(&(TASK_QUEUE.to_owned(), TaskQueueKind::Activity));
        Ok(both.then_some(queues))
    })
    .await?;
    eprintln!("task queues of v1: {queues:?}");

    // SetCurrent without a token: claims the manager identity first.
    applied(
        "set current v1",
        set_routing(
            &client,
            NAMESPACE,
            &dep,
            IDENTITY,
            RoutingChange::SetCurrent {
                build_id: "v1".into(),
            },
            None,
        )
        .await,
    )?;
    let state = ctx.describe(&dep).await?;
    ensure!(state.current_build_id.as_deref() == Some("v1"), "{state:?}");
    ensure!(
        state.manager_identity == IDENTITY,
        "manager identity not claimed: {state:?}"
    );
    ensure!(state.last_modifier_identity == IDENTITY, "{state:?}");
    ensure!(
        state.version("v1").map(|v| v.state) == Some(VersionState::Current),
        "{state:?}"
    );
    check_metadata(&client, &dep, "v1").await?;

    // Ramp v2 to 25 % with the observed token.
    ctx.start_worker(&dep, "v2").await?;
    let observed = ctx.registered(&dep, "v2").await?;
    applied(
        "ramp v2 25%",
        set_routing(
            &client,
            NAMESPACE,
            &dep,
            IDENTITY,
            RoutingChange::SetRamping {
                build_id: "v2".into(),
                percentage: 25,
            },
            Some(&observed.conflict_token),
        )
        .await,
    )?;
    let state = ctx.describe(&dep).await?;
    ensure!(state.ramping_build_id.as_deref() == Some("v2"), "{state:?}");
    ensure!(state.ramp_percentage == Some(25.0), "{state:?}");
    ensure!(
        state.ramp_changed_at.is_some() && state.ramping_since.is_some(),
        "{state:?}"
    );
    ensure!(
        state.version("v2").map(|v| v.state) == Some(VersionState::Ramping),
        "{state:?}"
    );
    ensure!(state.current_build_id.as_deref() == Some("v1"), "{state:?}");

    // The token of the observation before the ramp is stale now.
    let stale = set_routing(
        &client,
        NAMESPACE,
        &dep,
        IDENTITY,
        RoutingChange::SetRamping {
            build_id: "v2".into(),
            percentage: 30,
        },
        Some(&observed.conflict_token),
    )
    .await;
    ensure!(
        matches!(stale, Ok(RoutingOutcome::Conflict)),
        "stale token: {stale:?}"
    );

    gates(&client, &dep).await?;

    // Deletion refusals and drainage.
    let ramping = delete_version(&client, NAMESPACE, &dep, "v2", false, IDENTITY).await?;
    ensure!(
        matches!(&ramping, DeleteVersionOutcome::NotYet { message } if message.contains("current or ramping")),
        "delete ramping version: {ramping:?}"
    );
    applied(
        "clear ramp",
        set_routing(
            &client,
            NAMESPACE,
            &dep,
            IDENTITY,
            RoutingChange::ClearRamp,
            None,
        )
        .await,
    )?;
    let state = ctx.describe(&dep).await?;
    eprintln!("v2 right after leaving the ramp: {:?}", state.version("v2"));
    ensure!(
        state.ramping_build_id.is_none() && state.ramp_percentage.is_none(),
        "{state:?}"
    );
    applied(
        "clear ramp again (no-op)",
        set_routing(
            &client,
            NAMESPACE,
            &dep,
            IDENTITY,
            RoutingChange::ClearRamp,
            None,
        )
        .await,
    )?;
    for skip_drainage in [false, true] {
        let outcome =
            delete_version(&client, NAMESPACE, &dep, "v2", skip_drainage, IDENTITY).await?;
        ensure!(
            matches!(outcome, DeleteVersionOutcome::NotYet { .. }),
            "delete v2 with live pollers (skip_drainage {skip_drainage}): {outcome:?}"
        );
        eprintln!("delete v2 (skip_drainage {skip_drainage}): {outcome:?}");
    }
    let drained = eventually("v2 to drain", WAIT, || async {
        let state = ctx.describe(&dep).await?;
        Ok(state
            .version("v2")
            .filter(|v| v.state == VersionState::Drained)
            .cloned())
    })
    .await?;
    ensure!(
        drained.drainage_known
            && drained.drained_since.is_some()
            && drained.deactivated_at.is_some(),
        "drained version: {drained:?}"
    );

    // TWD deletion path.
    applied(
        "reset to unversioned",
        reset_to_unversioned(&client, NAMESPACE, &dep, IDENTITY).await,
    )?;
    let state = ctx.describe(&dep).await?;
    ensure!(
        state.current_build_id.is_none() && state.ramping_build_id.is_none(),
        "{state:?}"
    );
    let v1 = state.version("v1").context("v1 gone")?;
    eprintln!("v1 right after leaving Current: {v1:?}");
    ensure!(
        v1.last_current_at.is_some() && v1.deactivated_at.is_some(),
        "{v1:?}"
    );
    let outcome = delete_worker_deployment(&client, NAMESPACE, &dep, IDENTITY).await?;
    ensure!(
        matches!(outcome, DeleteVersionOutcome::NotYet { .. }),
        "delete deployment with versions: {outcome:?}"
    );
    eprintln!("delete deployment with versions: {outcome:?}");
    Ok(())
}

/// Version metadata written after a routing change.
async fn check_metadata(client: &TemporalClient, dep: &str, build_id: &str) -> Result<()> {
    let request = DescribeWorkerDeploymentVersionRequest {
        namespace: NAMESPACE.to_owned(),
        deployment_version: Some(
            temporalio_common::protos::temporal::api::deployment::v1::WorkerDeploymentVersion {
                build_id: build_id.to_owned(),
                deployment_name: dep.to_owned(),
            },
        ),
        ..Default::default()
    };
    let mut raw = client.raw().clone();
    let info =
        WorkflowService::describe_worker_deployment_version(&mut raw, request.into_request())
            .await?
            .into_inner()
            .worker_deployment_version_info
            .context("no version info")?;
    let entries = info.metadata.map(|m| m.entries).unwrap_or_default();
    let value = |key: &str| {
        entries
            .get(key)
            .map(|p| String::from_utf8_lossy(&p.data).into_owned())
            .unwrap_or_default()
    };
    ensure!(
        value(METADATA_CONTROLLER) == format!("\"{IDENTITY}\""),
        "metadata: {entries:?}"
    );
    ensure!(
        value(METADATA_CONTROLLER_VERSION) == format!("\"{}\"", env!("CARGO_PKG_VERSION")),
        "metadata: {entries:?}"
    );
    Ok(())
}

/// Gate workflows pinned to the ramping v2: pass, retry attaches, fail, cancel.
async fn gates(client: &TemporalClient, dep: &str) -> Result<()> {
    let queues: Vec<String> = version_task_queues(client, NAMESPACE, dep, "v2")
        .await
        .map_err(|b| anyhow!("{}", b.message))?
        .context("v2 unknown")?
        .into_iter()
        .filter(|(_, kind)| *kind == TaskQueueKind::Workflow)
        .map(|(name, _)| name)
        .collect();
    ensure!(
        queues == [TASK_QUEUE],
        "workflow task queues of v2: {queues:?}"
    );
    let start = |workflow_type: &'static str, input: Option<serde_json::Value>, key: GateKey| {
        let queues = queues.clone();
        async move {
            start_gates(
                client,
                NAMESPACE,
                dep,
                "v2",
                workflow_type,
                input,
                key,
                &queues,
            )
            .await
            .map_err(|e| anyhow!("{e}"))
        }
    };

    // A passing gate; a retried start attaches to the same run.
    let input = json!({"greeting": "hello", "fail": false});
    let runs = start("RolloutGate", Some(input.clone()), attempt(1)).await?;
    ensure!(runs.len() == 1, "{runs:?}");
    ensure!(
        runs[0].workflow_id == gate_workflow_id(dep, "v2", TASK_QUEUE, attempt(1)),
        "{runs:?}"
    );
    let again = start("RolloutGate", Some(input.clone()), attempt(1)).await?;
    ensure!(
        again[0].run_id == runs[0].run_id,
        "retry started another run: {again:?} vs {runs:?}"
    );
    let (done, beats) = run_gates_to_end(client, runs.clone()).await?;
    ensure!(done[0].status == "Completed", "{done:?}");
    ensure!(beats >= 1, "heartbeat never called");
    check_pinned(client, &done[0], dep, "v2").await?;
    let after = start("RolloutGate", Some(input), attempt(1)).await?;
    ensure!(
        after[0].run_id == runs[0].run_id && after[0].status == "Completed",
        "retry after close: {after:?}"
    );

    // A failing gate.
    let runs = start("GateFail", None, attempt(2)).await?;
    let (done, _) = run_gates_to_end(client, runs).await?;
    ensure!(done[0].status == "Failed", "{done:?}");

    // Cancel by runs.
    let runs = start("Sleeper", Some(json!(600)), attempt(3)).await?;
    ensure!(runs[0].status == "Running", "{runs:?}");
    cancel_gates(client, NAMESPACE, &runs).await?;
    let (done, _) = run_gates_to_end(client, runs.clone()).await?;
    ensure!(done[0].status == "Canceled", "{done:?}");
    cancel_gates(client, NAMESPACE, &runs)
        .await
        .context("cancelling a closed gate")?;

    // Cancel by build (visibility).
    let runs = start("Sleeper", Some(json!(600)), attempt(4)).await?;
    eventually(
        "the build's running gate to be found and cancelled",
        WAIT,
        || async {
            let n = cancel_build_gates(client, NAMESPACE, dep, "v2").await?;
            Ok((n >= 1 && cancel_requested_or_closed(client, &runs[0]).await?).then_some(()))
        },
    )
    .await?;
    let (done, _) = run_gates_to_end(client, runs).await?;
    ensure!(done[0].status == "Canceled", "{done:?}");

    // Stop by build: a gate that honours the cancellation ends Canceled within the grace (a
    // step gate here: its ID is found by the build's prefix too)...
    let step_gate = GateKey::Step(StepGateRef {
        step: 1,
        rollout_started_at: 1_700_000_000_000,
    });
    let runs = start("Sleeper", Some(json!(600)), step_gate).await?;
    ensure!(
        runs[0].workflow_id == format!("gate/{dep}/v2/{TASK_QUEUE}/step1-1700000000000"),
        "{runs:?}"
    );
    eventually("the build's sleeping gate to be stopped", WAIT, || async {
        let n = stop_build_gates(client, NAMESPACE, dep, "v2", Duration::from_secs(10)).await?;
        Ok((n >= 1 && cancel_requested_or_closed(client, &runs[0]).await?).then_some(()))
    })
    .await?;
    let (done, _) = run_gates_to_end(client, runs).await?;
    ensure!(done[0].status == "Canceled", "{done:?}");
    // ...and one no worker can run (so it never sees the cancellation) is terminated after it.
    let runs = start("NoWorkerRunsThis", None, attempt(6)).await?;
    eventually("the build's stuck gate to be stopped", WAIT, || async {
        let n = stop_build_gates(client, NAMESPACE, dep, "v2", Duration::from_secs(1)).await?;
        Ok((n >= 1 && cancel_requested_or_closed(client, &runs[0]).await?).then_some(()))
    })
    .await?;
    let (done, _) = run_gates_to_end(client, runs).await?;
    ensure!(done[0].status == "Terminated", "{done:?}");
    Ok(())
}

/// The key of the rollout gate's attempt `n`.
fn attempt(n: u32) -> GateKey {
    GateKey::Rollout { attempt: n }
}

/// Whether a gate was asked to cancel or has closed. Visibility can still list a gate cancelled
/// a moment ago as running: a by-build stop may find that one instead of the new gate, and must
/// then be asked again.
async fn cancel_requested_or_closed(client: &TemporalClient, run: &GateRun) -> Result<bool> {
    let response = describe_execution(client, &run.workflow_id, &run.run_id).await?;
    let closed = response
        .workflow_execution_info
        .is_some_and(|i| i.status != WorkflowExecutionStatus::Running as i32);
    let cancel_requested = response
        .workflow_extended_info
        .is_some_and(|i| i.cancel_requested);
    Ok(closed || cancel_requested)
}

/// The gate ran with a pinned override to the build.
async fn check_pinned(
    client: &TemporalClient,
    run: &GateRun,
    dep: &str,
    build_id: &str,
) -> Result<()> {
    let info = describe_execution(client, &run.workflow_id, &run.run_id)
        .await?
        .workflow_execution_info
        .context("no execution info")?;
    let versioning = info.versioning_info.context("no versioning info")?;
    let pinned = versioning
        .versioning_override
        .and_then(|o| o.r#override)
        .and_then(|o| match o {
            Override::Pinned(p) => p.version,
            _ => None,
        })
        .context("no pinned override")?;
    ensure!(
        pinned.deployment_name == dep && pinned.build_id == build_id,
        "{pinned:?}"
    );
    let ran_on = versioning
        .deployment_version
        .map(|v| v.build_id)
        .unwrap_or_default();
    ensure!(ran_on == build_id, "gate ran on build '{ran_on}'");
    Ok(())
}

async fn set_manager(
    client: &TemporalClient,
    dep: &str,
    manager: &str,
    identity: &str,
) -> Result<()> {
    let request = SetWorkerDeploymentManagerRequest {
        namespace: NAMESPACE.to_owned(),
        deployment_name: dep.to_owned(),
        new_manager_identity: Some(NewManagerIdentity::ManagerIdentity(manager.to_owned())),
        conflict_token: Vec::new(),
        identity: identity.to_owned(),
    };
    let mut raw = client.raw().clone();
    WorkflowService::set_worker_deployment_manager(&mut raw, request.into_request()).await?;
    Ok(())
}

/// A manager identity held by someone else blocks routing until it is unset with the CLI command
/// the message names.
async fn scenario_manager_identity(ctx: &Ctx) -> Result<()> {
    let dep = ctx.deployment("manager");
    let client = ctx.client().await?;
    ctx.start_worker(&dep, "v1").await?;
    ctx.registered(&dep, "v1").await?;
    set_manager(&client, &dep, OTHER_IDENTITY, OTHER_IDENTITY).await?;

    let outcome = set_routing(
        &client,
        NAMESPACE,
        &dep,
        IDENTITY,
        RoutingChange::SetCurrent {
            build_id: "v1".into(),
        },
        None,
    )
    .await;
    let Ok(RoutingOutcome::Blocked(blocked)) = outcome else {
        bail!("expected Blocked, got {outcome:?}");
    };
    ensure!(
        blocked.reason == BlockReason::PlanExecutionFailed,
        "{blocked:?}"
    );
    ensure!(
        blocked.message.starts_with(&format!(
            "manager identity of worker deployment {dep} is held by '{OTHER_IDENTITY}'"
        )),
        "{}",
        blocked.message
    );
    ensure!(
        blocked
            .message
            .contains(&format!("manager-identity unset --deployment-name {dep}")),
        "{}",
        blocked.message
    );

    // The server's own refusal matches what the write path classifies.
    let request = SetWorkerDeploymentCurrentVersionRequest {
        namespace: NAMESPACE.to_owned(),
        deployment_name: dep.clone(),
        build_id: "v1".to_owned(),
        identity: IDENTITY.to_owned(),
        ..Default::default()
    };
    let mut raw = client.raw().clone();
    let refused =
        WorkflowService::set_worker_deployment_current_version(&mut raw, request.into_request())
            .await;
    match refused {
        Err(status) if is_manager_identity_conflict(&status) => {
            ensure!(status.code() == Code::FailedPrecondition, "{status:?}");
        }
        other => bail!("server accepted or refused differently: {other:?}"),
    }

    // Unset with the CLI, as the message says.
    let output = Command::new(&ctx.cli)
        .args([
            "worker",
            "deployment",
            "manager-identity",
            "unset",
            "--deployment-name",
            &dep,
            "--identity",
            OTHER_IDENTITY,
            "--yes",
            "--address",
            &ctx.address,
            "--namespace",
            NAMESPACE,
        ])
        .kill_on_drop(true)
        .output()
        .await?;
    ensure!(
        output.status.success(),
        "manager-identity unset failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );

    applied(
        "set current after unset",
        set_routing(
            &client,
            NAMESPACE,
            &dep,
            IDENTITY,
            RoutingChange::SetCurrent {
                build_id: "v1".into(),
            },
            None,
        )
        .await,
    )?;
    let state = ctx.describe(&dep).await?;
    ensure!(
        state.manager_identity == IDENTITY && state.current_build_id.as_deref() == Some("v1"),
        "{state:?}"
    );
    Ok(())
}

/// Things that do not exist: deployments, versions, namespaces.
async fn scenario_missing_things(ctx: &Ctx) -> Result<()> {
    let dep = ctx.deployment("missing");
    let client = ctx.client().await?;
    let state = ctx.describe(&dep).await?;
    ensure!(
        !state.exists && state.versions.is_empty() && state.current_build_id.is_none(),
        "{state:?}"
    );
    let queues = version_task_queues(&client, NAMESPACE, &dep, "v1")
        .await
        .map_err(|b| anyhow!("{}", b.message))?;
    ensure!(queues.is_none(), "{queues:?}");
    let deleted = delete_version(&client, NAMESPACE, &dep, "v1", false, IDENTITY).await?;
    ensure!(deleted == DeleteVersionOutcome::Deleted, "{deleted:?}");
    let deleted = delete_worker_deployment(&client, NAMESPACE, &dep, IDENTITY).await?;
    ensure!(deleted == DeleteVersionOutcome::Deleted, "{deleted:?}");
    let set = set_routing(
        &client,
        NAMESPACE,
        &dep,
        IDENTITY,
        RoutingChange::SetCurrent {
            build_id: "v1".into(),
        },
        None,
    )
    .await;
    ensure!(
        matches!(&set, Ok(RoutingOutcome::Blocked(b)) if b.reason == BlockReason::PlanExecutionFailed),
        "{set:?}"
    );
    applied(
        "clear ramp of a missing deployment",
        set_routing(
            &client,
            NAMESPACE,
            &dep,
            IDENTITY,
            RoutingChange::ClearRamp,
            None,
        )
        .await,
    )?;
    applied(
        "reset a missing deployment",
        reset_to_unversioned(&client, NAMESPACE, &dep, IDENTITY).await,
    )?;

    // A missing namespace is an error, never "the deployment does not exist".
    let missing_ns = describe_worker_deployment(&client, "no-such-namespace", &dep).await;
    ensure!(
        matches!(&missing_ns, Err(b) if b.reason == BlockReason::TemporalStateFetchFailed),
        "{missing_ns:?}"
    );

    // The pool reuses clients and rebuilds after eviction (a pool of its own: the other
    // scenarios use the shared one concurrently).
    let pool = ClientPool::new(PoolOptions::new(IDENTITY));
    let first = pool
        .get(&ctx.config)
        .await
        .map_err(|b| anyhow!("{}", b.message))?;
    pool.get(&ctx.config)
        .await
        .map_err(|b| anyhow!("{}", b.message))?;
    ensure!(pool.len() == 1, "a second get created another client");
    first.evict();
    ensure!(pool.is_empty(), "evict did not drop the client");
    let rebuilt = pool
        .get(&ctx.config)
        .await
        .map_err(|b| anyhow!("{}", b.message))?;
    ensure!(pool.len() == 1, "no reconnect after eviction");
    first.evict();
    ensure!(pool.len() == 1, "a stale handle evicted the rebuilt client");
    ensure!(
        describe_worker_deployment(&rebuilt, NAMESPACE, &dep)
            .await
            .is_ok()
    );
    Ok(())
}

/// A server limiting worker-deployment reads to 1/s: an unbudgeted burst of reads is refused
/// with ResourceExhausted, reported at once (the SDK does not retry it) as
/// "Rate limited by Temporal server: ...".
async fn scenario_rate_limited(ctx: &Ctx) -> Result<()> {
    let (mut server, address) = start_server(
        &ctx.cli,
        &ctx.log_dir,
        "temporal-dev-server-rate-limited",
        &["frontend.globalNamespaceWorkerDeploymentReadRPS=1"],
    )
    .await?;
    let config = plaintext_config(&address);
    let mut options = PoolOptions::new(IDENTITY);
    options.read_rate_per_sec = 10_000.0;
    options.read_burst = 10_000;
    let pool = ClientPool::new(options);
    let ready = wait_for_server(&mut server, &pool, &config).await;
    ctx.procs.lock().await.push(server);
    ready?;
    let client = pool
        .get(&config)
        .await
        .map_err(|b| anyhow!("{}", b.message))?;
    let dep = ctx.deployment("rate-limited");
    let started = Instant::now();
    let reads = (0..40).map(|_| describe_worker_deployment(&client, NAMESPACE, &dep));
    let results = futures::future::join_all(reads).await;
    let elapsed = started.elapsed();
    let limited: Vec<_> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    ensure!(!limited.is_empty(), "no read was rate limited");
    for blocked in &limited {
        ensure!(
            blocked.reason == BlockReason::TemporalStateFetchFailed
                && blocked
                    .message
                    .starts_with("Rate limited by Temporal server: "),
            "{blocked:?}"
        );
    }
    ensure!(
        elapsed < Duration::from_secs(5),
        "rate-limited reads took {elapsed:?}: retried by the SDK?"
    );
    eprintln!(
        "{} of 40 reads rate limited in {elapsed:?}: {}",
        limited.len(),
        limited[0].message
    );
    Ok(())
}

/// The drain signal's default name (the sample worker's `Subscription` and `Stubborn` listen
/// for it).
const DRAIN_SIGNAL: &str = "twc-drain";

/// A workflow the drain scenario started: its ID and first run.
struct Started {
    workflow_id: String,
    first_run_id: String,
}

/// Starts `workflow_type` on `task_queue` (routed by the task queue's Current version).
async fn start_workflow(
    client: &TemporalClient,
    task_queue: &str,
    workflow_type: &str,
    workflow_id: &str,
    input: Option<serde_json::Value>,
) -> Result<Started> {
    let request = start_request(task_queue, workflow_type, workflow_id, input);
    start(client, request).await
}

/// Timeouts of a started workflow.
#[derive(Debug, Clone, Copy, Default)]
struct Timeouts {
    execution: Option<Duration>,
    task: Option<Duration>,
}

/// Starts a `Sleeper` of an hour on `task_queue` with `timeouts`.
async fn start_sleeper(
    client: &TemporalClient,
    task_queue: &str,
    workflow_id: &str,
    timeouts: Timeouts,
) -> Result<Started> {
    let duration = |d: Duration| prost_wkt_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: 0,
    };
    let request = StartWorkflowExecutionRequest {
        workflow_execution_timeout: timeouts.execution.map(duration),
        workflow_task_timeout: timeouts.task.map(duration),
        ..start_request(task_queue, "Sleeper", workflow_id, Some(json!(3600)))
    };
    start(client, request).await
}

fn start_request(
    task_queue: &str,
    workflow_type: &str,
    workflow_id: &str,
    input: Option<serde_json::Value>,
) -> StartWorkflowExecutionRequest {
    StartWorkflowExecutionRequest {
        namespace: NAMESPACE.to_owned(),
        workflow_id: workflow_id.to_owned(),
        workflow_type: Some(WorkflowType {
            name: workflow_type.to_owned(),
        }),
        task_queue: Some(TaskQueue {
            name: task_queue.to_owned(),
            kind: TaskQueueKindProto::Normal as i32,
            normal_name: String::new(),
        }),
        input: input.map(|v| Payloads {
            payloads: vec![json_payload(&v)],
        }),
        identity: "twc-test/starter".to_owned(),
        request_id: workflow_id.to_owned(),
        ..Default::default()
    }
}

async fn start(client: &TemporalClient, request: StartWorkflowExecutionRequest) -> Result<Started> {
    let workflow_id = request.workflow_id.clone();
    let workflow_type = request
        .workflow_type
        .as_ref()
        .map(|t| t.name.clone())
        .unwrap_or_default();
    let mut raw = client.raw().clone();
    let response = WorkflowService::start_workflow_execution(&mut raw, request.into_request())
        .await
        .with_context(|| format!("starting {workflow_type} {workflow_id}"))?
        .into_inner();
    Ok(Started {
        workflow_id,
        first_run_id: response.run_id,
    })
}

fn json_payload(value: &serde_json::Value) -> Payload {
    Payload {
        metadata: [("encoding".to_owned(), b"json/plain".to_vec())].into(),
        data: value.to_string().into_bytes(),
        ..Default::default()
    }
}

/// What the drain scenario asserts about a run.
#[derive(Debug)]
struct RunView {
    run_id: String,
    status: WorkflowExecutionStatus,
    /// Build the run's workflow tasks ran on.
    build_id: String,
    /// `(deployment, build)` of a pinned versioning override.
    pinned_override: Option<(String, String)>,
}

/// DescribeWorkflowExecution of the run `run_id` of a workflow (the latest when empty).
async fn describe_execution(
    client: &TemporalClient,
    workflow_id: &str,
    run_id: &str,
) -> Result<DescribeWorkflowExecutionResponse> {
    let request = DescribeWorkflowExecutionRequest {
        namespace: NAMESPACE.to_owned(),
        execution: Some(WorkflowExecution {
            workflow_id: workflow_id.to_owned(),
            run_id: run_id.to_owned(),
        }),
    };
    let mut raw = client.raw().clone();
    Ok(
        WorkflowService::describe_workflow_execution(&mut raw, request.into_request())
            .await?
            .into_inner(),
    )
}

/// The run `run_id` of a workflow (the latest when empty).
async fn describe_run(client: &TemporalClient, workflow_id: &str, run_id: &str) -> Result<RunView> {
    let info = describe_execution(client, workflow_id, run_id)
        .await?
        .workflow_execution_info
        .context("no execution info")?;
    let versioning = info.versioning_info.unwrap_or_default();
    Ok(RunView {
        run_id: info.execution.map(|e| e.run_id).unwrap_or_default(),
        status: WorkflowExecutionStatus::try_from(info.status)
            .unwrap_or(WorkflowExecutionStatus::Unspecified),
        build_id: versioning
            .deployment_version
            .map(|v| v.build_id)
            .unwrap_or_default(),
        pinned_override: versioning
            .versioning_override
            .and_then(|o| o.r#override)
            .and_then(|o| match o {
                Override::Pinned(p) => p.version.map(|v| (v.deployment_name, v.build_id)),
                _ => None,
            }),
    })
}

/// Every event of a run's history.
async fn history(
    client: &TemporalClient,
    workflow_id: &str,
    run_id: &str,
) -> Result<Vec<Attributes>> {
    let mut events = Vec::new();
    let mut next_page_token = Vec::new();
    loop {
        let request = GetWorkflowExecutionHistoryRequest {
            namespace: NAMESPACE.to_owned(),
            execution: Some(WorkflowExecution {
                workflow_id: workflow_id.to_owned(),
                run_id: run_id.to_owned(),
            }),
            next_page_token,
            ..Default::default()
        };
        let mut raw = client.raw().clone();
        let response =
            WorkflowService::get_workflow_execution_history(&mut raw, request.into_request())
                .await?
                .into_inner();
        events.extend(
            response
                .history
                .into_iter()
                .flat_map(|h| h.events)
                .filter_map(|e| e.attributes),
        );
        if response.next_page_token.is_empty() {
            return Ok(events);
        }
        next_page_token = response.next_page_token;
    }
}

/// How many `signal_name` signals a run received.
async fn signals_received(
    client: &TemporalClient,
    workflow_id: &str,
    run_id: &str,
    signal_name: &str,
) -> Result<usize> {
    Ok(history(client, workflow_id, run_id)
        .await?
        .iter()
        .filter(|a| matches!(a, Attributes::WorkflowExecutionSignaledEventAttributes(s) if s.signal_name == signal_name))
        .count())
}

async fn signal(client: &TemporalClient, workflow_id: &str, signal_name: &str) -> Result<()> {
    let request = SignalWorkflowExecutionRequest {
        namespace: NAMESPACE.to_owned(),
        workflow_execution: Some(WorkflowExecution {
            workflow_id: workflow_id.to_owned(),
            run_id: String::new(),
        }),
        signal_name: signal_name.to_owned(),
        identity: "twc-test/signaller".to_owned(),
        request_id: format!("{workflow_id}/{signal_name}"),
        ..Default::default()
    };
    let mut raw = client.raw().clone();
    WorkflowService::signal_workflow_execution(&mut raw, request.into_request()).await?;
    Ok(())
}

/// The JSON result of a completed run.
async fn completed_result(
    client: &TemporalClient,
    workflow_id: &str,
    run_id: &str,
) -> Result<serde_json::Value> {
    let events = history(client, workflow_id, run_id).await?;
    let Some(Attributes::WorkflowExecutionCompletedEventAttributes(done)) = events.last() else {
        bail!(
            "{workflow_id} did not complete: last event {:?}",
            events.last()
        );
    };
    let payload = done
        .result
        .as_ref()
        .and_then(|r| r.payloads.first())
        .context("no result")?;
    Ok(serde_json::from_slice(&payload.data)?)
}

/// Waits until visibility counts `open` workflows pinned to `build_id` of `dep`.
async fn await_pinned(
    client: &TemporalClient,
    dep: &str,
    build_id: &str,
    include: &[String],
    open: u64,
) -> Result<PinnedCount> {
    eventually(
        &format!("{open} open workflow(s) pinned to {dep}:{build_id}"),
        WAIT,
        || async {
            let count = count_pinned(client, NAMESPACE, dep, build_id, include, &[]).await?;
            Ok((count.open == open).then_some(count))
        },
    )
    .await
}

fn strings(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| (*s).to_owned()).collect()
}

fn step<'a>(dep: &'a str, build_id: &'a str, action: &'a DrainAction) -> DrainStep<'a> {
    DrainStep {
        namespace: NAMESPACE,
        deployment_name: dep,
        twd_uid: "0d7c9a1e-test",
        build_id,
        action,
        include_types: &[],
        exclude_types: &[],
        rate: 20,
        dry_run: false,
    }
}

/// Sets the Current version of a deployment.
async fn set_current(client: &TemporalClient, dep: &str, build_id: &str) -> Result<()> {
    applied(
        &format!("set current {dep}:{build_id}"),
        set_routing(
            client,
            NAMESPACE,
            dep,
            IDENTITY,
            RoutingChange::SetCurrent {
                build_id: build_id.into(),
            },
            None,
        )
        .await,
    )
}

/// Draining a retired version: counts, a dry run, the drain signal (listeners continue as new
/// onto the Current version; a repeated step attaches to its batch and signals nobody twice),
/// cancellation and termination of what is left, and a move to the Current version; never a
/// workflow of another version or another deployment (with the same build ID). Steps on a
/// version in routing are refused.
async fn scenario_drain(ctx: &Ctx) -> Result<()> {
    let client = ctx.client().await?;
    let dep = ctx.deployment("drain");
    let other = ctx.deployment("drain-other");
    // Task queues of their own: the other scenarios route `hello-world` as they please.
    let (queue, other_queue) = (
        format!("drain-{}", ctx.suffix),
        format!("drain-other-{}", ctx.suffix),
    );
    let id = |name: &str| format!("{name}-{}", ctx.suffix);
    let started_at = now_millis();

    for (d, q) in [(&dep, &queue), (&other, &other_queue)] {
        for build in ["v1", "v2"] {
            ctx.start_worker_on(d, build, q).await?;
        }
    }
    for d in [&dep, &other] {
        for build in ["v1", "v2"] {
            ctx.registered(d, build).await?;
        }
        set_current(&client, d, "v1").await?;
    }

    // On v1 of the drained deployment: 2 listeners, 2 that ignore the signal, 1 Sleeper.
    let hours = Some(json!({"hours": 5}));
    let sub_a1 = start_workflow(&client, &queue, "Subscription", &id("sub-a1"), None).await?;
    let sub_a2 = start_workflow(&client, &queue, "Subscription", &id("sub-a2"), hours).await?;
    let stub_a1 = start_workflow(&client, &queue, "Stubborn", &id("stub-a1"), None).await?;
    let stub_a2 = start_workflow(&client, &queue, "Stubborn", &id("stub-a2"), None).await?;
    let sleep_a1 = start_workflow(
        &client,
        &queue,
        "Sleeper",
        &id("sleep-a1"),
        Some(json!(3600)),
    )
    .await?;
    // On v1 of another deployment (same build ID).
    let sub_b1 = start_workflow(&client, &other_queue, "Subscription", &id("sub-b1"), None).await?;
    let sub_b2 = start_workflow(&client, &other_queue, "Subscription", &id("sub-b2"), None).await?;
    let stub_b1 = start_workflow(&client, &other_queue, "Stubborn", &id("stub-b1"), None).await?;
    let v1_count = await_pinned(&client, &dep, "v1", &[], 5).await?;
    await_pinned(&client, &other, "v1", &[], 3).await?;

    // v2 becomes Current; new workflows land there.
    set_current(&client, &dep, "v2").await?;
    let sub_a_new = start_workflow(&client, &queue, "Subscription", &id("sub-a-new"), None).await?;
    let stub_a_new = start_workflow(&client, &queue, "Stubborn", &id("stub-a-new"), None).await?;
    await_pinned(&client, &dep, "v2", &[], 2).await?;

    // Counts: the query, the open workflows and the oldest start time; type filters.
    ensure!(
        v1_count.query
            == format!(
                "TemporalWorkerDeploymentVersion = '{dep}:v1' AND \
                 TemporalWorkflowVersioningBehavior = 'Pinned' AND ExecutionStatus = 'Running'"
            ),
        "{v1_count:?}"
    );
    let oldest = v1_count.oldest_started_at.context("no oldest start time")?;
    ensure!(
        oldest >= started_at - 1_000 && oldest <= now_millis(),
        "oldest {oldest} not within the scenario (started {started_at})"
    );
    // The dev server's SQLite visibility refused `ORDER BY`; the refusal is remembered on this
    // connection's pool entry only: a connection with another cache key (a changed spec or
    // Secret) asks again, and nothing outlives the entries of the pool.
    ensure!(
        client.refuses(QueryFeature::OrderBy),
        "the ORDER BY refusal was not remembered"
    );
    let mut rotated = ctx.config.clone();
    rotated.cache_key = format!("{}/rotated", rotated.cache_key);
    let fresh = ctx
        .pool
        .get(&rotated)
        .await
        .map_err(|b| anyhow!("{:?}: {}", b.reason, b.message))?;
    ensure!(
        !fresh.refuses(QueryFeature::OrderBy) && !client.refuses(QueryFeature::ReportedProblems),
        "a refusal leaked to another connection or feature"
    );
    let stubborn =
        count_pinned(&client, NAMESPACE, &dep, "v1", &strings(&["Stubborn"]), &[]).await?;
    ensure!(stubborn.open == 2, "{stubborn:?}");
    let neither = count_pinned(
        &client,
        NAMESPACE,
        &dep,
        "v1",
        &[],
        &strings(&["Subscription", "Stubborn"]),
    )
    .await?;
    ensure!(neither.open == 1, "{neither:?}");

    // A step on a version in routing is refused.
    let refused = drain_version(&client, &step(&other, "v1", &DrainAction::Cancel), || false).await;
    ensure!(
        matches!(&refused, Err(DrainError::Refused { .. })),
        "drain of the Current version: {refused:?}"
    );

    // Dry run: counts, acts on nothing.
    let signal_step = DrainAction::Signal {
        name: DRAIN_SIGNAL.into(),
    };
    let dry = drain_version(
        &client,
        &DrainStep {
            dry_run: true,
            ..step(&dep, "v1", &signal_step)
        },
        || false,
    )
    .await?;
    ensure!(
        dry.job_id.is_none()
            && dry.matched == 5
            && dry.succeeded == 0
            && dry.query == v1_count.query,
        "dry run: {dry:?}"
    );
    for w in [&sub_a1, &stub_a1, &sleep_a1] {
        let n = signals_received(&client, &w.workflow_id, &w.first_run_id, DRAIN_SIGNAL).await?;
        ensure!(n == 0, "dry run signalled {}", w.workflow_id);
    }

    // The drain signal: listeners continue as new onto v2; the others hear it once.
    let signalled = drain_version(&client, &step(&dep, "v1", &signal_step), || false).await?;
    eprintln!("signal step: {signalled:?}");
    let job_id = signalled.job_id.clone().context("no job ID")?;
    ensure!(
        job_id.starts_with(&format!("drain/{dep}/v1/signal/r")) && job_id.ends_with("/0d7c9a1e"),
        "{job_id}"
    );
    ensure!(
        signalled.matched == 5 && signalled.succeeded == 5 && signalled.failed == 0,
        "{signalled:?}"
    );
    for w in [&sub_a1, &sub_a2] {
        let first = describe_run(&client, &w.workflow_id, &w.first_run_id).await?;
        ensure!(
            first.status == WorkflowExecutionStatus::ContinuedAsNew && first.build_id == "v1",
            "{}: first run {first:?}",
            w.workflow_id
        );
        let latest = eventually(&format!("{} to run on v2", w.workflow_id), WAIT, || async {
            let run = describe_run(&client, &w.workflow_id, "").await?;
            Ok((run.build_id == "v2").then_some(run))
        })
        .await?;
        ensure!(
            latest.status == WorkflowExecutionStatus::Running && latest.run_id != w.first_run_id,
            "{}: new run {latest:?}",
            w.workflow_id
        );
    }
    for w in [&stub_a1, &stub_a2, &sleep_a1] {
        let run = describe_run(&client, &w.workflow_id, "").await?;
        ensure!(
            run.status == WorkflowExecutionStatus::Running && run.build_id == "v1",
            "{}: {run:?}",
            w.workflow_id
        );
        let n = signals_received(&client, &w.workflow_id, &w.first_run_id, DRAIN_SIGNAL).await?;
        ensure!(n == 1, "{} received {n} drain signals", w.workflow_id);
    }
    await_pinned(&client, &dep, "v1", &[], 3).await?;

    // The same step again (a retry after a crash): attaches to its batch, signals nobody twice.
    let again = drain_version(&client, &step(&dep, "v1", &signal_step), || false).await?;
    ensure!(
        again == signalled,
        "retried step: {again:?} vs {signalled:?}"
    );
    for w in [&stub_a1, &stub_a2, &sleep_a1] {
        let n = signals_received(&client, &w.workflow_id, &w.first_run_id, DRAIN_SIGNAL).await?;
        ensure!(
            n == 1,
            "{} received {n} drain signals after the retry",
            w.workflow_id
        );
    }

    // Cancel the Stubborn ones, then terminate what is left.
    let cancelled = drain_version(
        &client,
        &DrainStep {
            include_types: &strings(&["Stubborn"]),
            ..step(&dep, "v1", &DrainAction::Cancel)
        },
        || false,
    )
    .await?;
    ensure!(
        cancelled.matched == 2 && cancelled.succeeded == 2 && cancelled.failed == 0,
        "{cancelled:?}"
    );
    for w in [&stub_a1, &stub_a2] {
        eventually(
            &format!("{} to be cancelled", w.workflow_id),
            WAIT,
            || async {
                let run = describe_run(&client, &w.workflow_id, "").await?;
                Ok((run.status == WorkflowExecutionStatus::Canceled).then_some(()))
            },
        )
        .await?;
    }
    let run = describe_run(&client, &sleep_a1.workflow_id, "").await?;
    ensure!(
        run.status == WorkflowExecutionStatus::Running,
        "Sleeper: {run:?}"
    );
    let terminated = drain_version(&client, &step(&dep, "v1", &DrainAction::Terminate), || {
        false
    })
    .await?;
    ensure!(
        terminated.matched == 1 && terminated.succeeded == 1,
        "{terminated:?}"
    );
    let run = describe_run(&client, &sleep_a1.workflow_id, "").await?;
    ensure!(
        run.status == WorkflowExecutionStatus::Terminated,
        "Sleeper: {run:?}"
    );
    await_pinned(&client, &dep, "v1", &[], 0).await?;

    // Nothing else was touched: v2's workflows, the new runs, the other deployment's v1.
    for w in [&sub_a_new, &stub_a_new, &sub_b1, &sub_b2, &stub_b1] {
        let run = describe_run(&client, &w.workflow_id, "").await?;
        ensure!(
            run.status == WorkflowExecutionStatus::Running && run.run_id == w.first_run_id,
            "{}: {run:?}",
            w.workflow_id
        );
        let n = signals_received(&client, &w.workflow_id, &w.first_run_id, DRAIN_SIGNAL).await?;
        ensure!(n == 0, "{} was signalled", w.workflow_id);
    }
    for w in [&sub_a1, &sub_a2] {
        let run = describe_run(&client, &w.workflow_id, "").await?;
        ensure!(
            run.status == WorkflowExecutionStatus::Running && run.build_id == "v2",
            "{}: {run:?}",
            w.workflow_id
        );
    }
    await_pinned(&client, &dep, "v2", &[], 4).await?;

    // Move to Current on the other deployment: its Subscriptions are pinned to v2 and end there;
    // its Stubborn (not of the included type) stays on v1.
    set_current(&client, &other, "v2").await?;
    let wrong = DrainAction::MoveToCurrent {
        current_build_id: "v3".into(),
    };
    let refused = drain_version(&client, &step(&other, "v1", &wrong), || false).await;
    ensure!(
        matches!(&refused, Err(DrainError::Refused { .. })),
        "move to a version that is not Current: {refused:?}"
    );
    let move_step = DrainAction::MoveToCurrent {
        current_build_id: "v2".into(),
    };
    let moved = drain_version(
        &client,
        &DrainStep {
            include_types: &strings(&["Subscription"]),
            ..step(&other, "v1", &move_step)
        },
        || false,
    )
    .await?;
    ensure!(
        moved.matched == 2 && moved.succeeded == 2 && moved.failed == 0,
        "{moved:?}"
    );
    for w in [&sub_b1, &sub_b2] {
        let run = describe_run(&client, &w.workflow_id, "").await?;
        ensure!(
            run.pinned_override == Some((other.clone(), "v2".to_owned())),
            "{}: {run:?}",
            w.workflow_id
        );
    }
    signal(&client, &sub_b1.workflow_id, "end").await?;
    let ended = eventually("the moved Subscription to end", WAIT, || async {
        let run = describe_run(&client, &sub_b1.workflow_id, "").await?;
        Ok((run.status == WorkflowExecutionStatus::Completed).then_some(run))
    })
    .await?;
    ensure!(ended.build_id == "v2", "{ended:?}");
    let result = completed_result(&client, &sub_b1.workflow_id, &ended.run_id).await?;
    ensure!(
        result == json!("subscription ended on build v2 (earlier runs: none)"),
        "{result}"
    );
    let stub = describe_run(&client, &stub_b1.workflow_id, "").await?;
    ensure!(
        stub.status == WorkflowExecutionStatus::Running
            && stub.build_id == "v1"
            && stub.pinned_override.is_none(),
        "{stub:?}"
    );
    await_pinned(&client, &other, "v1", &[], 1).await?;

    // A rollback to v1 and a new retirement: the steps run again under new job IDs. A step
    // cancelled while its batch runs stops the batch.
    set_current(&client, &dep, "v1").await?;
    let mut again_on_v1 = Vec::new();
    for n in 0..5 {
        let w = start_workflow(
            &client,
            &queue,
            "Stubborn",
            &id(&format!("stub-r{n}")),
            None,
        )
        .await?;
        again_on_v1.push(w);
    }
    await_pinned(&client, &dep, "v1", &[], 5).await?;
    set_current(&client, &dep, "v2").await?;
    let stopped = drain_version(
        &client,
        &DrainStep {
            rate: 1,
            ..step(&dep, "v1", &DrainAction::Cancel)
        },
        || true,
    )
    .await;
    let Err(DrainError::Cancelled { job_id: stopped_id }) = &stopped else {
        bail!("cancelled step: {stopped:?}");
    };
    ensure!(
        stopped_id.starts_with(&format!("drain/{dep}/v1/cancel/r"))
            && *stopped_id != cancelled.job_id.clone().unwrap_or_default(),
        "a new retirement reuses the job ID: {stopped_id}"
    );
    let retried = drain_version(&client, &step(&dep, "v1", &DrainAction::Cancel), || false).await;
    ensure!(
        matches!(&retried, Err(DrainError::BatchFailed { job_id, .. }) if job_id == stopped_id),
        "the step after its batch was stopped: {retried:?}"
    );
    let open = count_pinned(&client, NAMESPACE, &dep, "v1", &[], &[])
        .await?
        .open;
    eprintln!("{open} of 5 left open by the stopped batch");
    Ok(())
}

/// Canary analysis counts: the workflows started on a build since the window start, by how they
/// fared (failed, timed out, terminated, stuck on a workflow task problem; completed, canceled),
/// of the Current build too, without gate types and with type filters; judged against limits.
async fn scenario_analysis(ctx: &Ctx) -> Result<()> {
    let client = ctx.client().await?;
    let dep = ctx.deployment("analysis");
    // A task queue of its own: the other scenarios route `hello-world` as they please.
    let queue = format!("analysis-{}", ctx.suffix);
    let id = |name: &str| format!("analysis-{name}-{}", ctx.suffix);
    ctx.start_worker_on(&dep, "v1", &queue).await?;
    let v2_worker = ctx.start_worker_on(&dep, "v2", &queue).await?;
    ctx.registered(&dep, "v1").await?;
    ctx.registered(&dep, "v2").await?;
    set_current(&client, &dep, "v1").await?;
    // Visibility keeps start times in its own clock: a window opened a moment before.
    let window_start = now_millis() - 1_000;

    // On v1 (Current): 2 completed, 1 failed.
    let mut v1_runs = Vec::new();
    for n in 1..=2 {
        v1_runs.push(
            start_workflow(
                &client,
                &queue,
                "HelloWorld",
                &id(&format!("v1-ok{n}")),
                None,
            )
            .await?,
        );
    }
    v1_runs.push(start_workflow(&client, &queue, "GateFail", &id("v1-fail"), None).await?);
    for run in &v1_runs {
        closed_on(&client, run, "v1").await?;
    }

    // On v2: 3 completed, 2 failed, 1 timed out, 1 terminated, 1 canceled, 1 running, and a
    // gate (never counted).
    set_current(&client, &dep, "v2").await?;
    let mut closing = Vec::new();
    for n in 1..=3 {
        closing.push(
            start_workflow(
                &client,
                &queue,
                "HelloWorld",
                &id(&format!("v2-ok{n}")),
                None,
            )
            .await?,
        );
    }
    for n in 1..=2 {
        closing.push(
            start_workflow(
                &client,
                &queue,
                "GateFail",
                &id(&format!("v2-fail{n}")),
                None,
            )
            .await?,
        );
    }
    closing.push(start_workflow(&client, &queue, "GatePass", &id("v2-gate"), None).await?);
    let timeout = Timeouts {
        execution: Some(Duration::from_secs(5)),
        task: None,
    };
    closing.push(start_sleeper(&client, &queue, &id("v2-timeout"), timeout).await?);
    let terminated = start_sleeper(&client, &queue, &id("v2-term"), Timeouts::default()).await?;
    let canceled = start_sleeper(&client, &queue, &id("v2-cancel"), Timeouts::default()).await?;
    let running = start_sleeper(&client, &queue, &id("v2-run"), Timeouts::default()).await?;
    for run in [&terminated, &canceled, &running] {
        on_build(&client, run, "v2").await?;
    }
    terminate(&client, &terminated.workflow_id).await?;
    request_cancel(&client, &canceled.workflow_id).await?;
    closing.extend([terminated, canceled]);
    for run in &closing {
        closed_on(&client, run, "v2").await?;
    }

    // One stuck on v2: its first workflow task completed there (so visibility knows its
    // version), then its worker froze while holding the next one, which timed out.
    let short_tasks = Timeouts {
        execution: None,
        task: Some(Duration::from_secs(1)),
    };
    let stuck = start_sleeper(&client, &queue, &id("v2-stuck"), short_tasks).await?;
    on_build(&client, &stuck, "v2").await?;
    signal_process(v2_worker, "-STOP").await?;
    let frozen = async {
        signal(&client, &stuck.workflow_id, "wake-up").await?;
        let gate_types = strings(&["GatePass"]);
        let filter = WorkflowFilter {
            window_start,
            include: &[],
            exclude: &[],
            gate_types: &gate_types,
        };
        let check = TemporalCheck {
            name: "failures",
            namespace: NAMESPACE,
            deployment_name: &dep,
            build_id: "v2",
            current_build_id: Some("v1"),
            filter,
            limits: Limits {
                max_failure_percent: None,
                max_increase_over_current: Some(10.0),
                min_samples: 3,
            },
        };
        // v2: 5 bad (2 failed, 1 timed out, 1 terminated, 1 stuck) of 9 judged; v1: 1 of 3.
        let measured = eventually("v2's workflows to be counted, one stuck", WAIT, || async {
            let m = analysis::measure(&client, &check).await;
            Ok((m.samples == Some(9) && m.message.contains("(1 stuck)")).then_some(m))
        })
        .await?;
        eprintln!("analysis measurement: {measured:?}");
        ensure!(measured.verdict == Verdict::Failed, "{measured:?}");
        ensure!(
            measured.message
                == "failure share 55.6% (5 of 9 workflows failed, timed out, were terminated or \
                    are stuck on a workflow task problem (1 stuck)) on build v2; Current build \
                    v1: 33.3% (1 of 3); limit: Current + 10 points = 43.3%",
            "{measured:?}"
        );
        ensure!(
            close(measured.value, 500.0 / 9.0) && close(measured.baseline, 100.0 / 3.0),
            "{measured:?}"
        );
        let version = |build: &str| {
            format!(
                "TemporalWorkerDeploymentVersion = '{dep}:{build}' AND StartTime >= '{}' AND \
                 WorkflowType NOT IN ('GatePass')",
                k8s_openapi::jiff::Timestamp::from_millisecond(window_start)
                    .map(|t| t.to_string())
                    .unwrap_or_default()
            )
        };
        let stuck_query = |build: &str| {
            format!(
                "{} AND ExecutionStatus = 'Running' AND TemporalReportedProblems IS NOT NULL",
                version(build)
            )
        };
        ensure!(
            measured.queries
                == [
                    format!("{} GROUP BY ExecutionStatus", version("v2")),
                    stuck_query("v2"),
                    format!("{} GROUP BY ExecutionStatus", version("v1")),
                    stuck_query("v1"),
                ],
            "{:#?}",
            measured.queries
        );

        // Type filters: without Sleeper, 2 failed of 5; only HelloWorld, none of 3.
        let sleepers = strings(&["Sleeper"]);
        let no_sleepers = measure_with(&client, &check, &[], &sleepers, None).await?;
        ensure!(
            no_sleepers.samples == Some(5) && close(no_sleepers.value, 40.0),
            "{no_sleepers:?}"
        );
        let hello = strings(&["HelloWorld"]);
        let only_hello = measure_with(&client, &check, &hello, &[], Some(5.0)).await?;
        ensure!(
            only_hello.samples == Some(3)
                && close(only_hello.value, 0.0)
                && only_hello.verdict == Verdict::Successful,
            "{only_hello:?}"
        );
        // A window opened after everything started: nothing to judge yet.
        let later = TemporalCheck {
            filter: WorkflowFilter {
                window_start: now_millis() + 60_000,
                ..check.filter
            },
            ..check
        };
        let empty = analysis::measure(&client, &later).await;
        ensure!(
            empty.verdict == Verdict::Inconclusive
                && empty.samples == Some(0)
                && empty.message == "only 0 of 3 judged workflows so far on build v2",
            "{empty:?}"
        );
        Ok(())
    };
    let outcome = frozen.await;
    signal_process(v2_worker, "-CONT").await?;
    outcome
}

/// Backlog of a version: workflows routed to a version none of whose workers polls wait in its
/// workflow task queue, and `read_backlog` reports them (count and age) until a worker of the
/// version drains them; a version Temporal does not know is reported as unknown, not idle.
async fn scenario_backlog(ctx: &Ctx) -> Result<()> {
    const WORKFLOWS: u64 = 5;
    let client = ctx.client().await?;
    let dep = ctx.deployment("backlog");
    // A task queue of its own: the other scenarios route `hello-world` as they please.
    let queue = format!("backlog-{}", ctx.suffix);
    let id = |n: u64| format!("backlog-{n}-{}", ctx.suffix);
    let builds = strings(&["v1", "never-seen"]);
    let read = || async {
        let versions = read_backlog(&client, NAMESPACE, &dep, &builds).await;
        ensure!(
            versions
                .iter()
                .map(|v| v.build_id.as_str())
                .eq(["v1", "never-seen"]),
            "one entry per requested build, in order: {versions:?}"
        );
        ensure!(
            versions[1].error.as_deref() == Some(UNKNOWN_TO_TEMPORAL) && versions[1].backlog == 0,
            "{:?}",
            versions[1]
        );
        let v1 = versions[0].clone();
        ensure!(v1.error.is_none(), "{v1:?}");
        Ok(v1)
    };
    let workflow_queue = |v: &VersionBacklog| {
        v.task_queues
            .iter()
            .find(|q| q.name == queue && q.kind == "workflow")
            .cloned()
    };

    // v1 registers with its workflow task queue, becomes Current, and its only worker stops.
    let worker = ctx.start_worker_on(&dep, "v1", &queue).await?;
    ctx.registered(&dep, "v1").await?;
    eventually("v1's workflow task queue", WAIT, || async {
        let queues = version_task_queues(&client, NAMESPACE, &dep, "v1")
            .await
            .map_err(|b| anyhow!("{}", b.message))?
            .unwrap_or_default();
        Ok(queues
            .contains(&(queue.clone(), TaskQueueKind::Workflow))
            .then_some(()))
    })
    .await?;
    set_current(&client, &dep, "v1").await?;
    let idle = read().await?;
    eprintln!("backlog of v1 before the workflows: {idle:?}");
    ensure!(idle.backlog == 0, "{idle:?}");
    ctx.stop_worker(worker).await?;

    // Workflows routed to v1 wait in its workflow task queue.
    let started_at = Instant::now();
    let mut runs = Vec::new();
    for n in 1..=WORKFLOWS {
        runs.push(start_workflow(&client, &queue, "HelloWorld", &id(n), None).await?);
    }
    let waiting = eventually(
        &format!("a backlog of {WORKFLOWS} on v1's workflow task queue"),
        WAIT,
        || async {
            let v1 = read().await?;
            let reported =
                workflow_queue(&v1).is_some_and(|q| q.backlog >= WORKFLOWS && q.backlog_age_ms > 0);
            Ok(reported.then_some(v1))
        },
    )
    .await?;
    eprintln!(
        "backlog of v1 reported {:?} after the first start: {waiting:?}",
        started_at.elapsed()
    );
    ensure!(
        waiting.backlog >= WORKFLOWS && waiting.backlog_age_ms > 0,
        "{waiting:?}"
    );

    // A worker of v1 drains it.
    let drain_started = Instant::now();
    ctx.start_worker_on(&dep, "v1", &queue).await?;
    for run in &runs {
        closed_on(&client, run, "v1").await?;
    }
    let closed_after = drain_started.elapsed();
    let drained = eventually("v1's backlog to drain", WAIT, || async {
        let v1 = read().await?;
        Ok((v1.backlog == 0).then_some(v1))
    })
    .await?;
    eprintln!(
        "backlog of v1 reported 0 {:?} after its worker started (its workflows closed after \
         {closed_after:?}): {drained:?}",
        drain_started.elapsed()
    );
    ensure!(
        drained.task_queues.iter().all(|q| q.backlog == 0),
        "{drained:?}"
    );
    Ok(())
}

/// Waits until a workflow task of the run completed on `build_id`.
async fn on_build(client: &TemporalClient, run: &Started, build_id: &str) -> Result<RunView> {
    eventually(
        &format!("{} to run on {build_id}", run.workflow_id),
        WAIT,
        || async {
            let view = describe_run(client, &run.workflow_id, &run.first_run_id).await?;
            Ok((view.build_id == build_id).then_some(view))
        },
    )
    .await
}

/// Waits until the run closed, and checks it ran on `build_id`.
async fn closed_on(client: &TemporalClient, run: &Started, build_id: &str) -> Result<()> {
    let view = eventually(&format!("{} to close", run.workflow_id), WAIT, || async {
        let view = describe_run(client, &run.workflow_id, &run.first_run_id).await?;
        Ok((view.status != WorkflowExecutionStatus::Running).then_some(view))
    })
    .await?;
    ensure!(
        view.build_id == build_id,
        "{} closed on {:?}, not {build_id}: {view:?}",
        run.workflow_id,
        view.build_id
    );
    Ok(())
}

async fn terminate(client: &TemporalClient, workflow_id: &str) -> Result<()> {
    let request = TerminateWorkflowExecutionRequest {
        namespace: NAMESPACE.to_owned(),
        workflow_execution: Some(WorkflowExecution {
            workflow_id: workflow_id.to_owned(),
            run_id: String::new(),
        }),
        reason: "twc-test".to_owned(),
        identity: "twc-test/terminator".to_owned(),
        ..Default::default()
    };
    let mut raw = client.raw().clone();
    WorkflowService::terminate_workflow_execution(&mut raw, request.into_request()).await?;
    Ok(())
}

async fn request_cancel(client: &TemporalClient, workflow_id: &str) -> Result<()> {
    let request = RequestCancelWorkflowExecutionRequest {
        namespace: NAMESPACE.to_owned(),
        workflow_execution: Some(WorkflowExecution {
            workflow_id: workflow_id.to_owned(),
            run_id: String::new(),
        }),
        identity: "twc-test/canceller".to_owned(),
        request_id: format!("cancel/{workflow_id}"),
        ..Default::default()
    };
    let mut raw = client.raw().clone();
    WorkflowService::request_cancel_workflow_execution(&mut raw, request.into_request()).await?;
    Ok(())
}

/// Sends a signal (`-STOP`, `-CONT`) to a process the test started.
async fn signal_process(pid: u32, signal: &str) -> Result<()> {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .await
        .with_context(|| format!("kill {signal} {pid}"))?;
    ensure!(status.success(), "kill {signal} {pid}: {status}");
    Ok(())
}

/// `check` measured with other type filters and an absolute limit instead of the relative one.
async fn measure_with(
    client: &TemporalClient,
    check: &TemporalCheck<'_>,
    include: &[String],
    exclude: &[String],
    max_failure_percent: Option<f64>,
) -> Result<Measurement> {
    let check = TemporalCheck {
        filter: WorkflowFilter {
            include,
            exclude,
            ..check.filter
        },
        current_build_id: None,
        limits: Limits {
            max_failure_percent: max_failure_percent.or(Some(100.0)),
            max_increase_over_current: None,
            ..check.limits
        },
        ..*check
    };
    Ok(analysis::measure(client, &check).await)
}

fn close(value: Option<f64>, expected: f64) -> bool {
    value.is_some_and(|v| (v - expected).abs() < 1e-9)
}

fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// `sample-worker replay` (the replay check's contract) run with `vars` over `targets`: its exit
/// code and the report it wrote to `TWC_REPLAY_REPORT_PATH` (the same JSON as on stdout).
async fn run_replay(
    ctx: &Ctx,
    dep: &str,
    label: &str,
    targets: &serde_json::Value,
    vars: &[(&str, &str)],
) -> Result<(i32, serde_json::Value)> {
    let report_path = ctx.log_dir.join(format!("replay-{label}.json"));
    let output = Command::new(&ctx.worker_bin)
        .arg("replay")
        .env("TEMPORAL_ADDRESS", &ctx.address)
        .env("TEMPORAL_NAMESPACE", NAMESPACE)
        .env("TEMPORAL_DEPLOYMENT_NAME", dep)
        .env("TEMPORAL_WORKER_BUILD_ID", label)
        .env("TWC_REPLAY_WORKFLOWS", targets.to_string())
        .env("TWC_REPLAY_REPORT_PATH", &report_path)
        .envs(vars.iter().copied())
        .stdin(Stdio::null())
        .output()
        .await
        .context("running sample-worker replay")?;
    let code = output.status.code().context("replay killed by a signal")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let written = std::fs::read_to_string(&report_path)
        .with_context(|| format!("replay {label} wrote no report; stdout: {stdout}"))?;
    let report: serde_json::Value = serde_json::from_str(&written)
        .with_context(|| format!("replay {label} report is not JSON: {written}"))?;
    ensure!(
        stdout.trim() == written.trim(),
        "replay {label}: stdout and the report file differ: {stdout} vs {written}"
    );
    eprintln!("replay {label}: exit {code}, report {report}");
    Ok((code, report))
}

/// The workflow IDs of a report's `kind` list.
fn reported_ids(report: &serde_json::Value, kind: &str) -> Vec<String> {
    let mut ids: Vec<String> = report[kind]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["workflowId"].as_str().map(str::to_owned))
        .collect();
    ids.sort();
    ids
}

async fn scenario_replay(ctx: &Ctx) -> Result<()> {
    let client = ctx.client().await?;
    let dep = ctx.deployment("replay");
    let queue = format!("replay-{}", ctx.suffix);
    let id = |name: &str| format!("{name}-{}", ctx.suffix);
    ctx.start_worker_on(&dep, "v1", &queue).await?;
    ctx.registered(&dep, "v1").await?;
    set_current(&client, &dep, "v1").await?;

    // Two completed HelloWorlds, and a Sleeper open mid-history (its timer started).
    let hello_a = start_workflow(&client, &queue, "HelloWorld", &id("hello-a"), None).await?;
    let hello_b = start_workflow(&client, &queue, "HelloWorld", &id("hello-b"), None).await?;
    let sleeper = start_workflow(
        &client,
        &queue,
        "Sleeper",
        &id("sleeper"),
        Some(json!(3600)),
    )
    .await?;
    closed_on(&client, &hello_a, "v1").await?;
    closed_on(&client, &hello_b, "v1").await?;
    eventually("the Sleeper's timer to start", WAIT, || async {
        let events = history(&client, &sleeper.workflow_id, &sleeper.first_run_id).await?;
        Ok(events
            .iter()
            .any(|a| matches!(a, Attributes::TimerStartedEventAttributes(_)))
            .then_some(()))
    })
    .await?;
    let targets = json!([
        { "workflowId": hello_a.workflow_id, "runId": hello_a.first_run_id },
        { "workflowId": hello_b.workflow_id },
        { "workflowId": sleeper.workflow_id, "runId": sleeper.first_run_id },
    ]);
    let mut hellos = vec![hello_a.workflow_id.clone(), hello_b.workflow_id.clone()];
    hellos.sort();

    // The same code, and code that changed only what an activity does: every history replays.
    for (label, vars) in [
        ("same", &[][..]),
        ("activity-change", &[("SAMPLE_FAIL_SHARE", "100")][..]),
    ] {
        let (code, report) = run_replay(ctx, &dep, label, &targets, vars).await?;
        ensure!(code == 0, "replay {label}: exit {code}: {report}");
        ensure!(
            report["passed"] == 3
                && report["workflowTypes"] == json!({ "HelloWorld": 2, "Sleeper": 1 })
                && reported_ids(&report, "nondeterministic").is_empty()
                && reported_ids(&report, "inconclusive").is_empty(),
            "replay {label}: {report}"
        );
    }

    // HelloWorld's commands reordered: both of its histories mismatch, named with the
    // replayer's words; the Sleeper still replays.
    let (code, report) = run_replay(
        ctx,
        &dep,
        "reordered-hello",
        &targets,
        &[("SAMPLE_NONDETERMINISTIC", "HelloWorld")],
    )
    .await?;
    ensure!(code == 1, "reordered HelloWorld: exit {code}: {report}");
    ensure!(
        report["passed"] == 1 && reported_ids(&report, "nondeterministic") == hellos,
        "reordered HelloWorld: {report}"
    );
    for mismatch in report["nondeterministic"].as_array().into_iter().flatten() {
        ensure!(
            mismatch["workflowType"] == "HelloWorld"
                && mismatch["runId"].as_str().is_some_and(|r| !r.is_empty())
                && mismatch["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("Nondeterminism")),
            "a mismatch names the run, its type and the replayer's words: {mismatch}"
        );
    }
    ensure!(
        report["nondeterministic"].as_array().is_some_and(|l| l
            .iter()
            .any(|m| m["runId"] == hello_a.first_run_id.as_str())),
        "the run given is the run replayed: {report}"
    );

    // The open Sleeper, mid-history, mismatches when its commands are reordered.
    let (code, report) = run_replay(
        ctx,
        &dep,
        "reordered-sleeper",
        &targets,
        &[("SAMPLE_NONDETERMINISTIC", "Sleeper")],
    )
    .await?;
    ensure!(
        code == 1
            && report["passed"] == 2
            && reported_ids(&report, "nondeterministic") == vec![sleeper.workflow_id.clone()],
        "reordered Sleeper: exit {code}: {report}"
    );

    // The sample a replay check takes of v1: the open pinned Sleeper (`moveToCurrent` would
    // move it) and the closed HelloWorlds, read from visibility; replayed, they pass.
    let candidates = eventually("visibility to list v1's workflows", WAIT, || async {
        let mut all = Vec::new();
        for source in [
            CandidateSource::PinnedOn("v1"),
            CandidateSource::ClosedOn("v1"),
        ] {
            let query = candidate_query(&dep, source)?;
            all.extend(list_candidates(&client, NAMESPACE, &query).await?);
        }
        Ok((all.len() >= 3).then_some(all))
    })
    .await?;
    let (sample, too_long) = pick(candidates, 50, 10_000);
    let picked: Vec<(&str, &str, bool)> = sample
        .iter()
        .map(|c| (c.workflow_id.as_str(), c.workflow_type.as_str(), c.open))
        .collect();
    ensure!(
        too_long == 0
            && picked.len() == 3
            && picked[0] == (sleeper.workflow_id.as_str(), "Sleeper", true)
            && picked[1..]
                .iter()
                .all(|(id, t, open)| hellos.iter().any(|h| h == id) && *t == "HelloWorld" && !open)
            && sample.iter().all(|c| !c.run_id.is_empty()
                && c.started_at > 0
                && (c.open || c.history_length > 0)),
        "the sample of v1: {sample:?}"
    );
    let sampled: Vec<serde_json::Value> = sample
        .iter()
        .map(|c| json!({ "workflowId": c.workflow_id, "runId": c.run_id }))
        .collect();
    let (code, report) = run_replay(ctx, &dep, "sampled", &json!(sampled), &[]).await?;
    ensure!(
        code == 0 && report["passed"] == 3,
        "the sample replays: {report}"
    );

    // Open AutoUpgrade workflows on a build are candidates too (they move with the routing).
    let auto = ctx.deployment("replay-auto");
    let auto_queue = format!("replay-auto-{}", ctx.suffix);
    ctx.start_worker_with(
        &auto,
        "v1",
        &auto_queue,
        &[("SAMPLE_VERSIONING_BEHAVIOR", "auto-upgrade")],
    )
    .await?;
    ctx.registered(&auto, "v1").await?;
    set_current(&client, &auto, "v1").await?;
    let upgrading = start_workflow(
        &client,
        &auto_queue,
        "Sleeper",
        &id("upgrading"),
        Some(json!(3600)),
    )
    .await?;
    let query = candidate_query(&auto, CandidateSource::AutoUpgradeOn("v1"))?;
    let listed = eventually("the AutoUpgrade Sleeper to be listed", WAIT, || async {
        let listed = list_candidates(&client, NAMESPACE, &query).await?;
        Ok(listed
            .iter()
            .any(|c| c.workflow_id == upgrading.workflow_id && c.open)
            .then_some(listed))
    })
    .await?;
    ensure!(
        listed.len() == 1 && listed[0].run_id == upgrading.first_run_id,
        "only the AutoUpgrade workflow of {auto}: {listed:?}"
    );
    let pinned_query = candidate_query(&auto, CandidateSource::PinnedOn("v1"))?;
    let pinned = list_candidates(&client, NAMESPACE, &pinned_query).await?;
    ensure!(
        pinned.is_empty(),
        "no pinned workflow on {auto}: {pinned:?}"
    );
    terminate(&client, &upgrading.workflow_id).await?;

    // A history that cannot be fetched is inconclusive (exit 3), never a pass.
    let missing = json!([
        { "workflowId": hello_a.workflow_id },
        { "workflowId": id("never-started") },
    ]);
    let (code, report) = run_replay(ctx, &dep, "missing", &missing, &[]).await?;
    ensure!(
        code == 3
            && report["passed"] == 1
            && reported_ids(&report, "inconclusive") == vec![id("never-started")]
            && report["inconclusive"][0]["reason"]
                .as_str()
                .is_some_and(|r| r.contains("fetching its history")),
        "missing workflow: exit {code}: {report}"
    );

    // No list: a configuration error (exit 2) before anything connects.
    let output = Command::new(&ctx.worker_bin)
        .arg("replay")
        .env("TEMPORAL_ADDRESS", &ctx.address)
        .env("TEMPORAL_DEPLOYMENT_NAME", &dep)
        .env("TEMPORAL_WORKER_BUILD_ID", "none")
        .env_remove("TWC_REPLAY_WORKFLOWS")
        .env_remove("TWC_REPLAY_WORKFLOWS_FILE")
        .output()
        .await?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(
        output.status.code() == Some(2) && stderr.contains("TWC_REPLAY_WORKFLOWS"),
        "no list: {:?}: {stderr}",
        output.status
    );
    terminate(&client, &sleeper.workflow_id).await?;
    Ok(())
}
