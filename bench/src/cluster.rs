//! The sandbox's servers as the benchmarks see them: Kubernetes and Temporal clients, metric
//! pages, the controller process, and TWD manifests.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, anyhow, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use temporalio_client::grpc::WorkflowService;
use temporalio_client::tonic::Code;
use temporalio_client::tonic::IntoRequest;
use temporalio_client::{Client, ClientOptions, Connection, ConnectionOptions, Url};
use temporalio_common::protos::temporal::api::common::v1::{WorkflowExecution, WorkflowType};
use temporalio_common::protos::temporal::api::deployment::v1::{
    WorkerDeploymentInfo, WorkerDeploymentVersion, WorkerDeploymentVersionInfo,
};
use temporalio_common::protos::temporal::api::enums::v1::WorkflowExecutionStatus;
use temporalio_common::protos::temporal::api::history::v1::HistoryEvent;
use temporalio_common::protos::temporal::api::taskqueue::v1::TaskQueue;
use temporalio_common::protos::temporal::api::workflow::v1::WorkflowExecutionInfo;
use temporalio_common::protos::temporal::api::workflowservice::v1::describe_worker_deployment_version_response::VersionTaskQueue;
use temporalio_common::protos::temporal::api::workflowservice::v1::{
    DescribeWorkerDeploymentRequest, DescribeWorkerDeploymentVersionRequest,
    DescribeWorkerDeploymentVersionResponse, DescribeWorkflowExecutionRequest,
    GetWorkflowExecutionHistoryRequest, ListWorkflowExecutionsRequest, RegisterNamespaceRequest,
    StartWorkflowExecutionRequest,
};
use twc_crds::TemporalWorkerDeployment;
use twc_sandbox::env::SandboxEnv;
use twc_sandbox::up::Replica;

use crate::prom::{self, Sample};
use crate::sampler::MetricsPages;

/// Field manager of the benchmark's applies.
const MANAGER: &str = "twc-bench";

/// How long a started or stopped replica may take to be counted by every controller (each
/// renews its Lease and counts the others every 10 s; a Lease counts for 30 s after its last
/// renewal, and a stopped replica deletes its own).
const REPLICA_COUNT_TIMEOUT: Duration = Duration::from_secs(90);

/// The sandbox, connected.
pub struct Cluster {
    /// What the sandbox wrote about itself.
    pub env: SandboxEnv,
    /// Kubernetes client (admin).
    pub kube: kube::Client,
    temporal: Client,
    /// Controller replicas the benchmark started beside the sandbox's own.
    replicas: std::sync::Mutex<Vec<Replica>>,
}

impl Cluster {
    /// Connects to the sandbox named by `TWC_SANDBOX_ENV` (set by `twc-sandbox exec`).
    pub async fn connect() -> anyhow::Result<Self> {
        let env = SandboxEnv::from_env_var()
            .context("run the benchmarks through `make bench` (twc-sandbox exec)")?;
        let kube = twc_sandbox::apiserver::client(&env.kubeconfig).await?;
        let url = Url::parse(&format!("http://{}", env.temporal_address))?;
        let connection = Connection::connect(
            ConnectionOptions::new(url)
                .identity(MANAGER.to_owned())
                .build(),
        )
        .await
        .with_context(|| format!("connecting to Temporal at {}", env.temporal_address))?;
        let temporal = Client::new(
            connection,
            ClientOptions::new(env.temporal_namespace.clone()).build(),
        )?;
        Ok(Self {
            env,
            kube,
            temporal,
            replicas: std::sync::Mutex::default(),
        })
    }

    /// The `/metrics` pages of every running controller (the sandbox's own, and the replicas
    /// the benchmark started) and of Temporal.
    pub fn metrics_pages(&self) -> MetricsPages {
        let controllers = self
            .env
            .controller_metrics_url
            .iter()
            .cloned()
            .chain(self.lock_replicas().iter().map(|r| r.metrics_url.clone()))
            .collect();
        MetricsPages {
            controllers,
            temporal: self.env.temporal_metrics_url.clone(),
        }
    }

    /// Controllers running: the sandbox's own and the replicas the benchmark started.
    pub fn controllers(&self) -> usize {
        1 + self.lock_replicas().len()
    }

    /// Starts one more controller replica beside the sandbox's own (`twc run` with the same
    /// servers, engine namespace and task queue, and the default read budget, which the
    /// replicas divide between them as the chart's do), and waits until every controller counts
    /// all of them.
    pub async fn start_replica(&self) -> anyhow::Result<()> {
        let name = format!("controller-bench-{}", self.controllers() + 1);
        let replica = twc_sandbox::up::start_replica(&self.env, &name, &[])?;
        tracing::info!(log = %replica.process.log.display(), "started controller replica {name}");
        self.lock_replicas().push(replica);
        self.wait_replicas_counted().await
    }

    /// Stops the replicas the benchmark started (SIGTERM: each deletes its Lease) and waits
    /// until the sandbox's controller counts itself alone again.
    pub async fn stop_replicas(&self) -> anyhow::Result<()> {
        let replicas = std::mem::take(&mut *self.lock_replicas());
        for mut replica in replicas {
            replica.process.stop(Duration::from_secs(10)).await;
        }
        self.wait_replicas_counted().await
    }

    /// Waits until every running controller's `twc_controller_replicas` is the number running.
    async fn wait_replicas_counted(&self) -> anyhow::Result<()> {
        let expected = self.controllers() as f64;
        let pages = self.metrics_pages().controllers;
        let deadline = Instant::now() + REPLICA_COUNT_TIMEOUT;
        loop {
            let mut counts = Vec::with_capacity(pages.len());
            for page in &pages {
                let samples = scrape(page).await.unwrap_or_default();
                counts.push(prom::sum(&samples, "twc_controller_replicas", |_| true));
            }
            if counts.iter().all(|c| *c == expected) {
                tracing::info!(replicas = expected, "every controller counts the replicas");
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "the controllers count {counts:?} replicas, not {expected}, after {REPLICA_COUNT_TIMEOUT:?}"
                );
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    fn lock_replicas(&self) -> std::sync::MutexGuard<'_, Vec<Replica>> {
        self.replicas
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Process ID of the running controller.
    pub fn controller_pid(&self) -> anyhow::Result<u32> {
        let file = self
            .env
            .controller_pid_file
            .as_deref()
            .ok_or_else(|| anyhow!("the sandbox runs no controller"))?;
        read_pid(file)
    }

    /// Process ID of the sandbox's Temporal dev server.
    pub fn temporal_pid(&self) -> anyhow::Result<u32> {
        let file = self
            .env
            .temporal_pid_file
            .as_deref()
            .ok_or_else(|| anyhow!("the sandbox names no Temporal pid file"))?;
        read_pid(file)
    }

    /// The kube-apiserver's `/metrics`.
    pub async fn apiserver_metrics(&self) -> anyhow::Result<Vec<Sample>> {
        let request = http::Request::get("/metrics").body(Vec::new())?;
        let page = self.kube.request_text(request).await?;
        Ok(prom::parse(&page))
    }

    /// Creates namespace `name` with a TemporalConnection `dev` to the sandbox's Temporal.
    pub async fn namespace(&self, name: &str) -> anyhow::Result<()> {
        let namespaces: Api<Namespace> = Api::all(self.kube.clone());
        let namespace: Namespace = serde_json::from_value(json!({ "metadata": { "name": name } }))?;
        namespaces
            .create(&PostParams::default(), &namespace)
            .await
            .with_context(|| format!("creating namespace {name}"))?;
        self.apply(&json!({
            "apiVersion": "temporal.io/v1alpha1",
            "kind": "TemporalConnection",
            "metadata": { "name": "dev", "namespace": name },
            "spec": { "hostPort": self.env.temporal_address }
        }))
        .await
    }

    /// Server-side apply of a namespaced temporal.io manifest (as `kubectl apply
    /// --server-side` does it).
    pub async fn apply(&self, manifest: &Value) -> anyhow::Result<()> {
        let kind = manifest["kind"].as_str().unwrap_or_default();
        let plural = match kind {
            "TemporalWorkerDeployment" => "temporalworkerdeployments",
            "TemporalConnection" => "temporalconnections",
            other => bail!("cannot apply kind {other:?}"),
        };
        let resource = ApiResource {
            group: twc_crds::GROUP.into(),
            version: twc_crds::VERSION.into(),
            api_version: format!("{}/{}", twc_crds::GROUP, twc_crds::VERSION),
            kind: kind.into(),
            plural: plural.into(),
        };
        let namespace = manifest["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default();
        let name = manifest["metadata"]["name"].as_str().unwrap_or_default();
        let api: Api<DynamicObject> = Api::namespaced_with(self.kube.clone(), namespace, &resource);
        api.patch(
            name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(manifest),
        )
        .await
        .with_context(|| format!("applying {kind} {namespace}/{name}"))?;
        Ok(())
    }

    /// Waits until every TWD of `expected` (name → build ID prefix) in `namespace` is Ready with
    /// a target build of that prefix; returns when each became so (as seen by a watch).
    pub async fn wait_all_ready(
        &self,
        namespace: &str,
        expected: &BTreeMap<String, String>,
        timeout: Duration,
    ) -> anyhow::Result<BTreeMap<String, Instant>> {
        let api: Api<TemporalWorkerDeployment> = Api::namespaced(self.kube.clone(), namespace);
        let mut events = Box::pin(watcher(api, watcher::Config::default()).default_backoff());
        let mut ready = BTreeMap::new();
        let deadline = tokio::time::Instant::now() + timeout;
        while ready.len() < expected.len() {
            let event = tokio::time::timeout_at(deadline, events.next())
                .await
                .map_err(|_| {
                    let missing: BTreeSet<&String> = expected
                        .keys()
                        .filter(|k| !ready.contains_key(*k))
                        .collect();
                    anyhow!("timed out after {timeout:?}; not Ready: {missing:?}")
                })?;
            let twd = match event {
                Some(Ok(watcher::Event::Apply(twd) | watcher::Event::InitApply(twd))) => twd,
                Some(Ok(_)) => continue,
                Some(Err(e)) => {
                    tracing::warn!("watching TWDs: {e}");
                    continue;
                }
                None => bail!("the TWD watch ended"),
            };
            let name = twd.metadata.name.clone().unwrap_or_default();
            if let Some(prefix) = expected.get(&name)
                && !ready.contains_key(&name)
                && is_ready_with(&twd, prefix)
            {
                ready.insert(name, Instant::now());
            }
        }
        Ok(ready)
    }

    /// Registers Temporal namespace `name` (one day of retention) unless it exists, and waits
    /// until the frontend serves worker-deployment calls in it. Each Temporal namespace holds
    /// at most 100 worker deployments by default (`matching.maxDeployments`), so a fleet larger
    /// than that spreads over several, as a platform team's would.
    pub async fn temporal_namespace(&self, name: &str) -> anyhow::Result<()> {
        let request = RegisterNamespaceRequest {
            namespace: name.to_owned(),
            workflow_execution_retention_period: Some(prost_wkt_types::Duration {
                seconds: 86_400,
                nanos: 0,
            }),
            ..Default::default()
        };
        let mut raw = self.temporal.clone();
        if let Err(status) =
            WorkflowService::register_namespace(&mut raw, request.into_request()).await
            && status.code() != Code::AlreadyExists
        {
            return Err(anyhow!("registering Temporal namespace {name}: {status}"));
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let probe = DescribeWorkerDeploymentRequest {
                namespace: name.to_owned(),
                deployment_name: "twc-bench-probe".to_owned(),
            };
            let mut raw = self.temporal.clone();
            let served =
                match WorkflowService::describe_worker_deployment(&mut raw, probe.into_request())
                    .await
                {
                    Ok(_) => true,
                    // The deployment is unknown, the namespace is not.
                    Err(status) => {
                        status.code() == Code::NotFound
                            && !status.message().to_ascii_lowercase().contains("namespace")
                    }
                };
            if served {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!("Temporal namespace {name} is not served after 60 s");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// `DescribeWorkerDeployment`.
    pub async fn describe_deployment(
        &self,
        temporal_namespace: &str,
        deployment_name: &str,
    ) -> anyhow::Result<WorkerDeploymentInfo> {
        let request = DescribeWorkerDeploymentRequest {
            namespace: temporal_namespace.to_owned(),
            deployment_name: deployment_name.to_owned(),
        };
        let mut raw = self.temporal.clone();
        let response =
            WorkflowService::describe_worker_deployment(&mut raw, request.into_request())
                .await
                .with_context(|| format!("describing worker deployment {deployment_name}"))?;
        response
            .into_inner()
            .worker_deployment_info
            .ok_or_else(|| anyhow!("no info for worker deployment {deployment_name}"))
    }

    /// The build of `deployment_name`'s Current version in the sandbox's Temporal namespace.
    pub async fn current_build(&self, deployment_name: &str) -> anyhow::Result<String> {
        self.describe_deployment(&self.env.temporal_namespace, deployment_name)
            .await?
            .routing_config
            .and_then(|r| r.current_deployment_version)
            .map(|v| v.build_id)
            .filter(|b| !b.is_empty())
            .ok_or_else(|| anyhow!("{deployment_name} has no current version"))
    }

    /// `DescribeWorkerDeploymentVersion`.
    pub async fn describe_version(
        &self,
        temporal_namespace: &str,
        deployment_name: &str,
        build_id: &str,
    ) -> anyhow::Result<WorkerDeploymentVersionInfo> {
        self.describe_version_response(temporal_namespace, deployment_name, build_id, false)
            .await?
            .worker_deployment_version_info
            .ok_or_else(|| anyhow!("no info for version {deployment_name}:{build_id}"))
    }

    /// The task queues of version `build_id` of `deployment_name` in the sandbox's Temporal
    /// namespace with their statistics (`DescribeWorkerDeploymentVersion` with
    /// `report_task_queue_stats`, as the controller reads backlogs).
    pub async fn version_task_queues(
        &self,
        deployment_name: &str,
        build_id: &str,
    ) -> anyhow::Result<Vec<VersionTaskQueue>> {
        Ok(self
            .describe_version_response(
                &self.env.temporal_namespace,
                deployment_name,
                build_id,
                true,
            )
            .await?
            .version_task_queues)
    }

    async fn describe_version_response(
        &self,
        temporal_namespace: &str,
        deployment_name: &str,
        build_id: &str,
        report_task_queue_stats: bool,
    ) -> anyhow::Result<DescribeWorkerDeploymentVersionResponse> {
        let request = DescribeWorkerDeploymentVersionRequest {
            namespace: temporal_namespace.to_owned(),
            deployment_version: Some(WorkerDeploymentVersion {
                deployment_name: deployment_name.to_owned(),
                build_id: build_id.to_owned(),
            }),
            report_task_queue_stats,
            ..Default::default()
        };
        let mut raw = self.temporal.clone();
        let response =
            WorkflowService::describe_worker_deployment_version(&mut raw, request.into_request())
                .await
                .with_context(|| format!("describing version {deployment_name}:{build_id}"))?;
        Ok(response.into_inner())
    }

    /// Starts workflow `workflow_id` of type `workflow_type` on `task_queue`, without input (as
    /// `temporal workflow start` does).
    pub async fn start_workflow(
        &self,
        workflow_type: &str,
        task_queue: &str,
        workflow_id: &str,
    ) -> anyhow::Result<()> {
        let request = StartWorkflowExecutionRequest {
            namespace: self.env.temporal_namespace.clone(),
            workflow_id: workflow_id.to_owned(),
            workflow_type: Some(WorkflowType {
                name: workflow_type.to_owned(),
            }),
            task_queue: Some(TaskQueue {
                name: task_queue.to_owned(),
                ..Default::default()
            }),
            identity: MANAGER.to_owned(),
            request_id: format!("{MANAGER}-{workflow_id}"),
            ..Default::default()
        };
        let mut raw = self.temporal.clone();
        WorkflowService::start_workflow_execution(&mut raw, request.into_request())
            .await
            .with_context(|| format!("starting workflow {workflow_id}"))?;
        Ok(())
    }

    /// Every workflow execution of the sandbox's Temporal namespace that visibility `query`
    /// selects (`ListWorkflowExecutions`, all pages).
    pub async fn list_workflows(&self, query: &str) -> anyhow::Result<Vec<WorkflowExecutionInfo>> {
        let mut executions = Vec::new();
        let mut next_page_token = Vec::new();
        loop {
            let request = ListWorkflowExecutionsRequest {
                namespace: self.env.temporal_namespace.clone(),
                page_size: 1000,
                next_page_token,
                query: query.to_owned(),
            };
            let mut raw = self.temporal.clone();
            let page = WorkflowService::list_workflow_executions(&mut raw, request.into_request())
                .await
                .with_context(|| format!("listing workflows where {query}"))?
                .into_inner();
            executions.extend(page.executions);
            if page.next_page_token.is_empty() {
                return Ok(executions);
            }
            next_page_token = page.next_page_token;
        }
    }

    /// Whether the latest run of `workflow_id` is running, and the build it is pinned to (or
    /// runs on; empty before its first workflow task completed).
    pub async fn latest_run(&self, workflow_id: &str) -> anyhow::Result<(bool, String)> {
        let info = self.describe_latest(workflow_id).await?;
        let running = info.status == WorkflowExecutionStatus::Running as i32;
        let build = info
            .versioning_info
            .and_then(|v| v.deployment_version)
            .map(|d| d.build_id)
            .unwrap_or_default();
        Ok((running, build))
    }

    /// Events in the history of the latest run of `workflow_id`.
    pub async fn history_length(&self, workflow_id: &str) -> anyhow::Result<i64> {
        Ok(self.describe_latest(workflow_id).await?.history_length)
    }

    /// The history of every run of `workflow_id` in the sandbox's Temporal namespace (the
    /// runs visibility lists and the latest run), one list of events per run.
    pub async fn histories(&self, workflow_id: &str) -> anyhow::Result<Vec<Vec<HistoryEvent>>> {
        let latest = self.describe_latest(workflow_id).await?;
        let listed = self
            .list_workflows(&format!("WorkflowId = '{workflow_id}'"))
            .await?;
        let mut run_ids: BTreeSet<String> = listed
            .into_iter()
            .chain([latest])
            .filter_map(|info| info.execution.map(|e| e.run_id))
            .collect();
        run_ids.retain(|r| !r.is_empty());
        let mut histories = Vec::with_capacity(run_ids.len());
        for run_id in run_ids {
            histories.push(self.history(workflow_id, &run_id).await?);
        }
        Ok(histories)
    }

    /// Every event of run `run_id` of `workflow_id` (`GetWorkflowExecutionHistory`, all pages).
    async fn history(&self, workflow_id: &str, run_id: &str) -> anyhow::Result<Vec<HistoryEvent>> {
        let mut events = Vec::new();
        let mut next_page_token = Vec::new();
        loop {
            let request = GetWorkflowExecutionHistoryRequest {
                namespace: self.env.temporal_namespace.clone(),
                execution: Some(WorkflowExecution {
                    workflow_id: workflow_id.to_owned(),
                    run_id: run_id.to_owned(),
                }),
                next_page_token,
                skip_archival: true,
                ..Default::default()
            };
            let mut raw = self.temporal.clone();
            let page =
                WorkflowService::get_workflow_execution_history(&mut raw, request.into_request())
                    .await
                    .with_context(|| format!("reading the history of {workflow_id} run {run_id}"))?
                    .into_inner();
            events.extend(page.history.map(|h| h.events).unwrap_or_default());
            if page.next_page_token.is_empty() {
                return Ok(events);
            }
            next_page_token = page.next_page_token;
        }
    }

    /// `DescribeWorkflowExecution` of the latest run of `workflow_id`.
    async fn describe_latest(&self, workflow_id: &str) -> anyhow::Result<WorkflowExecutionInfo> {
        let request = DescribeWorkflowExecutionRequest {
            namespace: self.env.temporal_namespace.clone(),
            execution: Some(WorkflowExecution {
                workflow_id: workflow_id.to_owned(),
                run_id: String::new(),
            }),
        };
        let mut raw = self.temporal.clone();
        WorkflowService::describe_workflow_execution(&mut raw, request.into_request())
            .await
            .with_context(|| format!("describing workflow {workflow_id}"))?
            .into_inner()
            .workflow_execution_info
            .ok_or_else(|| anyhow!("no info for workflow {workflow_id}"))
    }
}

/// Whether `twd` is Ready (RolloutComplete) for its current generation with a target build
/// starting with `prefix`.
pub fn is_ready_with(twd: &TemporalWorkerDeployment, prefix: &str) -> bool {
    let Some(status) = &twd.status else {
        return false;
    };
    let fresh = status.observed_generation.is_some()
        && status.observed_generation == twd.metadata.generation;
    let ready = status
        .conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True" && c.reason == "RolloutComplete");
    let target = status
        .target_version
        .as_ref()
        .is_some_and(|t| t.version.build_id.starts_with(prefix));
    fresh && ready && target
}

/// A TWD of the sample worker with image tag `tag` (each tag is its own build, with build ID
/// prefix `tag-`), one replica and short sunset delays.
pub fn worker(
    namespace: &str,
    temporal_namespace: &str,
    name: &str,
    tag: &str,
    rollout: Value,
) -> Value {
    json!({
        "apiVersion": "temporal.io/v1alpha1",
        "kind": "TemporalWorkerDeployment",
        "metadata": { "name": name, "namespace": namespace },
        "spec": {
            "replicas": 1,
            "workerOptions": { "connectionRef": { "name": "dev" }, "temporalNamespace": temporal_namespace },
            "rollout": rollout,
            "sunset": { "scaledownDelay": "2s", "deleteDelay": "3s" },
            "template": { "spec": { "containers": [
                { "name": "worker", "image": format!("twc.local/sample-worker:{tag}") }
            ] } }
        }
    })
}

/// Seconds from `earlier` to `later` (negative when `later` is before).
pub fn seconds_between(earlier: SystemTime, later: SystemTime) -> f64 {
    match later.duration_since(earlier) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

/// A protobuf timestamp as a `SystemTime`; `None` when unset.
pub fn system_time(ts: Option<&prost_wkt_types::Timestamp>) -> Option<SystemTime> {
    let ts = ts?;
    if ts.seconds <= 0 {
        return None;
    }
    let secs = u64::try_from(ts.seconds).ok()?;
    let nanos = u32::try_from(ts.nanos).ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::new(secs, nanos))
}

/// A Prometheus page.
pub async fn scrape(url: &str) -> anyhow::Result<Vec<Sample>> {
    let response = twc_sandbox::http::get(url).await.map_err(|e| anyhow!(e))?;
    if response.status != 200 {
        bail!("GET {url}: HTTP {}", response.status);
    }
    Ok(prom::parse(&response.body))
}

fn read_pid(file: &Path) -> anyhow::Result<u32> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    text.trim()
        .parse()
        .with_context(|| format!("no process ID in {}", file.display()))
}
