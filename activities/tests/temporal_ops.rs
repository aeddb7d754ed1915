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
    common::v1::WorkflowExecution,
    workflow::v1::versioning_override::Override,
    workflowservice::v1::{
        DescribeWorkerDeploymentVersionRequest, DescribeWorkflowExecutionRequest,
        SetWorkerDeploymentCurrentVersionRequest, SetWorkerDeploymentManagerRequest,
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
        ClientPool, PoolOptions, TaskQueueKind, TemporalClient, cancel_build_gates, cancel_gates,
        delete_version, delete_worker_deployment, describe_worker_deployment,
        error::is_manager_identity_conflict,
        gate_workflow_id, reset_to_unversioned,
        routing::{METADATA_CONTROLLER, METADATA_CONTROLLER_VERSION},
        set_routing, start_gates, stop_build_gates, version_task_queues, wait_gates,
    },
};
use twc_crds::worker_deployment::VersionState;
use twc_workflows::{
    contract::{DeleteVersionOutcome, GateRun, RoutingChange, RoutingOutcome},
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
        let mut command = Command::new(&self.worker_bin);
        command
            .env("TEMPORAL_ADDRESS", &self.address)
            .env("TEMPORAL_NAMESPACE", NAMESPACE)
            .env("TEMPORAL_DEPLOYMENT_NAME", deployment)
            .env("TEMPORAL_WORKER_BUILD_ID", build_id)
            .env("RUST_LOG", "info");
        let proc = Proc::spawn(
            &format!("worker-{deployment}-{build_id}"),
            command,
            &self.log_dir,
        )?;
        self.procs.lock().await.push(proc);
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

    let (mut server, address) = start_server(&cli, &log_dir, "temporal-dev-server", &[])
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
        let (a, b, c, d) = tokio::join!(
            scenario_routing_gates_deletion(&ctx),
            scenario_manager_identity(&ctx),
            scenario_missing_things(&ctx),
            scenario_rate_limited(&ctx),
        );
        let failures: Vec<String> = [
            ("routing/gates/deletion", a),
            ("manager identity", b),
            ("missing things", c),
            ("rate limited", d),
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
    let start = |workflow_type: &'static str, input: Option<serde_json::Value>, attempt: u32| {
        let queues = queues.clone();
        async move {
            start_gates(
                client,
                NAMESPACE,
                dep,
                "v2",
                workflow_type,
                input,
                attempt,
                &queues,
            )
            .await
            .map_err(|e| anyhow!("{e}"))
        }
    };

    // A passing gate; a retried start attaches to the same run.
    let input = json!({"greeting": "hello", "fail": false});
    let runs = start("RolloutGate", Some(input.clone()), 1).await?;
    ensure!(runs.len() == 1, "{runs:?}");
    ensure!(
        runs[0].workflow_id == gate_workflow_id(dep, "v2", TASK_QUEUE, 1),
        "{runs:?}"
    );
    let again = start("RolloutGate", Some(input.clone()), 1).await?;
    ensure!(
        again[0].run_id == runs[0].run_id,
        "retry started another run: {again:?} vs {runs:?}"
    );
    let (done, beats) = run_gates_to_end(client, runs.clone()).await?;
    ensure!(done[0].status == "Completed", "{done:?}");
    ensure!(beats >= 1, "heartbeat never called");
    check_pinned(client, &done[0], dep, "v2").await?;
    let after = start("RolloutGate", Some(input), 1).await?;
    ensure!(
        after[0].run_id == runs[0].run_id && after[0].status == "Completed",
        "retry after close: {after:?}"
    );

    // A failing gate.
    let runs = start("GateFail", None, 2).await?;
    let (done, _) = run_gates_to_end(client, runs).await?;
    ensure!(done[0].status == "Failed", "{done:?}");

    // Cancel by runs.
    let runs = start("Sleeper", Some(json!(600)), 3).await?;
    ensure!(runs[0].status == "Running", "{runs:?}");
    cancel_gates(client, NAMESPACE, &runs).await?;
    let (done, _) = run_gates_to_end(client, runs.clone()).await?;
    ensure!(done[0].status == "Canceled", "{done:?}");
    cancel_gates(client, NAMESPACE, &runs)
        .await
        .context("cancelling a closed gate")?;

    // Cancel by build (visibility).
    let runs = start("Sleeper", Some(json!(600)), 4).await?;
    eventually(
        "the build's running gate to be found and cancelled",
        WAIT,
        || async {
            let n = cancel_build_gates(client, NAMESPACE, dep, "v2").await?;
            Ok((n >= 1).then_some(()))
        },
    )
    .await?;
    let (done, _) = run_gates_to_end(client, runs).await?;
    ensure!(done[0].status == "Canceled", "{done:?}");

    // Stop by build: a gate that honours the cancellation ends Canceled within the grace...
    let runs = start("Sleeper", Some(json!(600)), 5).await?;
    eventually("the build's sleeping gate to be stopped", WAIT, || async {
        let n = stop_build_gates(client, NAMESPACE, dep, "v2", Duration::from_secs(10)).await?;
        Ok((n >= 1).then_some(()))
    })
    .await?;
    let (done, _) = run_gates_to_end(client, runs).await?;
    ensure!(done[0].status == "Canceled", "{done:?}");
    // ...and one no worker can run (so it never sees the cancellation) is terminated after it.
    let runs = start("NoWorkerRunsThis", None, 6).await?;
    eventually("the build's stuck gate to be stopped", WAIT, || async {
        let n = stop_build_gates(client, NAMESPACE, dep, "v2", Duration::from_secs(1)).await?;
        Ok((n >= 1).then_some(()))
    })
    .await?;
    let (done, _) = run_gates_to_end(client, runs).await?;
    ensure!(done[0].status == "Terminated", "{done:?}");
    Ok(())
}

/// The gate ran with a pinned override to the build.
async fn check_pinned(
    client: &TemporalClient,
    run: &GateRun,
    dep: &str,
    build_id: &str,
) -> Result<()> {
    let request = DescribeWorkflowExecutionRequest {
        namespace: NAMESPACE.to_owned(),
        execution: Some(WorkflowExecution {
            workflow_id: run.workflow_id.clone(),
            run_id: run.run_id.clone(),
        }),
    };
    let mut raw = client.raw().clone();
    let info = WorkflowService::describe_workflow_execution(&mut raw, request.into_request())
        .await?
        .into_inner()
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
