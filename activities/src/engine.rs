//! The activities of the rollout engine: each one implements an activity of
//! [`twc_workflows::contract`] under the same name, by composing the Kubernetes ([`crate::k8s`])
//! and Temporal ([`crate::temporal`]) operations. Expected conditions (blocked, superseded, not
//! yet) are returned as values for the workflow to decide on; only transient failures are errors
//! (and retried by Temporal).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use tokio::time::MissedTickBehavior;

use temporalio_macros::activities;
use temporalio_sdk::activities::{ActivityContext, ActivityError};
use twc_crds::WorkerObject;
use twc_crds::notifications::{NotificationEvent, NotificationSpec};
use twc_crds::worker_deployment::{
    ConnectionReference, RolloutStrategy, TemporalWorkerDeploymentStatus, VersionState,
};
use twc_workflows::contract::{
    AnalysisRequest, AnalysisResult, BacklogReport, BacklogRequest, BuildRequest, CleanupBlock,
    CleanupOutcome, CreateDeploymentOutcome, DeleteVersionOutcome, DeleteVersionRequest,
    DeploymentRequest, DrainAction, DrainOutcome, DrainRequest, EventKind, EventRequest,
    GateOutcome, GateRequest, Measurement, PinnedCount, PinnedRequest, PollerWaitOutcome,
    RecheckOutcome, ReleaseRequest, ReplayCheckRequest, ReplayTarget, ReplayVerdict, RoutingChange,
    RoutingOutcome, RoutingRequest, ScaleRequest, StatusRequest, Teardown, WaitForPollersRequest,
};
use twc_workflows::contract::{
    Notification, NotificationFailure, NotificationOutcome, NotificationRequest, TargetFailure,
    TargetResult,
};
use twc_workflows::model::{
    BlockReason, Blocked, CheckProvider, CheckView, Observation, SpecView, TemporalState, TwdRef,
};
use twc_workflows::notify_workflow::{NotifyInput, NotifyWorkflow, notify_workflow_id};
use twc_workflows::plan::deletion;
use twc_workflows::plan::spec_view::spec_view;

use crate::k8s::connection::{ClusterAccess, connection_object};
use crate::k8s::deployment_view::deployment_view;
use crate::k8s::{self, ResolveError};
use crate::metrics::{self, Metrics};
use crate::notify;
use crate::prometheus::{self, PrometheusClient};
use crate::temporal::{
    self, ClientPool, PoolOptions, StatusClass, TaskQueueKind, TemporalClient, TemporalError,
};

/// How often `run_gate` looks again.
const POLL_INTERVAL: Duration = Duration::from_millis(500);
/// How soon `wait_for_pollers` looks again once the Deployment is Available (waiting for the
/// version to register in Temporal); the interval doubles at each such look up to
/// [`POLLER_RECHECK_MAX`], so a burst of rollouts whose workers are slow to poll does not spend
/// the namespace's read budget on them.
const POLLER_RECHECK: Duration = Duration::from_millis(200);
/// The longest interval between `wait_for_pollers`' looks once the Deployment is Available.
const POLLER_RECHECK_MAX: Duration = Duration::from_secs(2);
/// How often `wait_for_pollers` looks again while the Deployment is not Available, unless a
/// watch event about it comes first.
const AVAILABILITY_RECHECK: Duration = Duration::from_secs(1);
/// How long `cancel_gates` lets cancelled gate workflows close before terminating them.
const GATE_STOP_GRACE: Duration = Duration::from_secs(10);
/// How often every activity heartbeats while it runs. The workflows give each activity a
/// heartbeat timeout of a few seconds, so one whose controller died is retried elsewhere soon;
/// the SDK sends the latest heartbeat at most once per 80% of that timeout.
const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(1);

/// Shared state of the engine's activities: the Kubernetes client, the pool of clients for the
/// workers' Temporal servers, the client of Prometheus servers, the controller identity and the
/// metrics. Clones share all of it (the engine's two workers serve the same activities).
#[derive(Clone)]
pub struct EngineActivities {
    kube: kube::Client,
    pool: ClientPool,
    prometheus: Arc<PrometheusClient>,
    identity: String,
    metrics: Arc<Metrics>,
    /// Last Ready state written per connection (by its name for messages), to avoid rewriting
    /// it on every observe.
    connection_states: Arc<Mutex<HashMap<String, (bool, String)>>>,
    /// Whether ClusterConnections may be used (not when restricted to namespaces).
    cluster_access: ClusterAccess,
    /// Manager identities of another controller taken over (`--take-over-manager-from`).
    take_over: temporal::TakeOver,
    /// The controller's own namespace: where events about TWDs of a namespace being deleted
    /// are recorded.
    own_namespace: String,
    /// The webhook client of notifications.
    webhooks: Arc<notify::WebhookClient>,
    /// The controller's cluster-wide notification targets.
    cluster_notifications: Arc<notify::ClusterTargets>,
    /// The engine's task queue, where notification workflows run (default: the queue of the
    /// activity that queues one).
    engine_task_queue: Option<String>,
    /// The connections' finalizers as the watcher in this process sees them, which spares the
    /// lists of every turn's re-assertion (none: it lists).
    known_connections: Option<Arc<dyn k8s::KnownConnections>>,
}

/// A TWD resolved for work against its Temporal.
struct Resolved {
    resource: WorkerObject,
    spec: SpecView,
    temporal: TemporalClient,
}

/// Why a TWD could not be resolved for work against its Temporal.
enum Unresolved {
    /// Its connection, or a Secret the connection names, is missing or unusable (or may not be
    /// used by this controller).
    Settings(Blocked),
    /// No client of its Temporal could be made with them.
    Client {
        /// How the TWD shows it.
        blocked: Blocked,
        /// Temporal refused the credentials (rather than being out of reach).
        refused: bool,
    },
}

impl Unresolved {
    fn into_blocked(self) -> Blocked {
        match self {
            Self::Settings(blocked) | Self::Client { blocked, .. } => blocked,
        }
    }
}

/// Where a `wait_for_pollers` spent its time, for its debug log line.
#[derive(Default)]
struct WaitLooks {
    /// When the Deployment was first seen Available, after the wait started.
    available_after: Option<Duration>,
    /// The last look's Deployment list.
    list: Duration,
    /// The last Temporal read (once Available, the whole observation), if any.
    ask: Option<Duration>,
    /// Looks woken by a change of the Deployments (the watch).
    by_change: u32,
    /// Looks woken by the recheck timer.
    by_timer: u32,
}

impl EngineActivities {
    /// Activities using `kube` and claiming `identity` as manager of worker deployments; they
    /// count what they observe (rollout starts, completions and failures in the statuses they
    /// write, Temporal calls, poller waits) in `metrics`.
    pub fn new(kube: kube::Client, identity: String, metrics: Arc<Metrics>) -> Self {
        let mut options = PoolOptions::new(identity.clone());
        options.metrics = Arc::clone(&metrics);
        let pool = ClientPool::new(options);
        Self {
            kube,
            pool,
            prometheus: Arc::new(PrometheusClient::default()),
            identity,
            metrics,
            connection_states: Arc::new(Mutex::new(HashMap::new())),
            cluster_access: ClusterAccess::Granted,
            take_over: temporal::TakeOver::default(),
            own_namespace: "default".to_owned(),
            webhooks: Arc::new(notify::WebhookClient::default()),
            cluster_notifications: Arc::new(notify::ClusterTargets::default()),
            engine_task_queue: None,
            known_connections: None,
        }
    }

    /// The same activities reading the connections' finalizers from `known` (the watcher's
    /// stores in this process) to list connections only when one may be left to release.
    pub fn with_known_connections(mut self, known: Arc<dyn k8s::KnownConnections>) -> Self {
        self.known_connections = Some(known);
        self
    }

    /// The same activities starting notification workflows on the engine's `task_queue` and
    /// telling the cluster-wide targets of `cluster` too (`--cluster-notifications`).
    pub fn with_notifications(
        mut self,
        task_queue: impl Into<String>,
        cluster: notify::ClusterTargets,
    ) -> Self {
        self.engine_task_queue = Some(task_queue.into());
        self.cluster_notifications = Arc::new(cluster);
        self
    }

    /// The same activities reading at most `per_second` worker-deployment APIs a second from
    /// each Temporal namespace, divided between the live `replicas` (the server's own limit is
    /// per namespace, for all clients).
    pub fn with_read_rate(mut self, per_second: f64, replicas: temporal::budget::Replicas) -> Self {
        let mut options = PoolOptions::new(self.identity.clone());
        options.metrics = Arc::clone(&self.metrics);
        options.read_rate_per_sec = per_second;
        options.replicas = replicas;
        self.pool = ClientPool::new(options);
        self
    }

    /// The same activities claiming the manager identity of worker deployments from the
    /// identities `take_over` covers instead of stopping at them.
    pub fn with_take_over(mut self, take_over: temporal::TakeOver) -> Self {
        self.take_over = take_over;
        self
    }

    /// The same activities recording events about TWDs of a namespace being deleted (which
    /// refuses new events) in `namespace`, the controller's own (default: `default`).
    pub fn with_own_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.own_namespace = namespace.into();
        self
    }

    /// The same activities with `access` to cluster-scoped objects: [`ClusterAccess::Restricted`]
    /// for a controller restricted to namespaces, whose TWDs may then not use ClusterConnections.
    pub fn with_cluster_access(mut self, access: ClusterAccess) -> Self {
        self.cluster_access = access;
        self
    }

    /// The TWD, its spec view and a client of its Temporal; `Ok(None)` when the TWD is gone.
    /// A read the API server could not answer is an error (the activity is retried), never a
    /// missing or invalid connection.
    async fn resolve(
        &self,
        twd: &TwdRef,
    ) -> Result<Option<Result<Resolved, Blocked>>, ActivityError> {
        Ok(self
            .resolve_detailed(twd)
            .await?
            .map(|r| r.map_err(Unresolved::into_blocked)))
    }

    /// [`EngineActivities::resolve`], saying which side failed.
    async fn resolve_detailed(
        &self,
        twd: &TwdRef,
    ) -> Result<Option<Result<Resolved, Unresolved>>, ActivityError> {
        let resource = k8s::get_twd(&self.kube, twd).await.map_err(retryable)?;
        self.resolve_read(twd, resource, None).await
    }

    /// [`EngineActivities::resolve_detailed`] of the TWD as just read (`None`: gone), with its
    /// connection when the caller just resolved it too (then it is not read again).
    async fn resolve_read(
        &self,
        twd: &TwdRef,
        resource: Option<WorkerObject>,
        resolved: Option<k8s::ResolvedConnection>,
    ) -> Result<Option<Result<Resolved, Unresolved>>, ActivityError> {
        let Some(resource) = resource else {
            return Ok(None);
        };
        let spec = spec_view(&resource);
        let reference = &resource.spec.worker_options.connection_ref;
        let resolved = match resolved {
            Some(resolved) => Ok(resolved),
            None => {
                k8s::resolve_connection(
                    &self.kube,
                    self.cluster_access,
                    &twd.namespace,
                    reference,
                    &spec.temporal_namespace,
                )
                .await
            }
        };
        let config = match resolved {
            Ok(resolved) => resolved.config,
            Err(ResolveError::Transient(e)) => return Err(retryable(e)),
            Err(ResolveError::Blocked(blocked)) => {
                self.note_connection(&twd.namespace, reference, Err(&blocked))
                    .await;
                return Ok(Some(Err(Unresolved::Settings(blocked))));
            }
        };
        match self.pool.try_get(&config).await {
            Ok(temporal) => Ok(Some(Ok(Resolved {
                resource,
                spec,
                temporal,
            }))),
            Err(error) => {
                let blocked = temporal::pool::creation_failed(&config, &error);
                let reference = &resource.spec.worker_options.connection_ref;
                self.note_connection(&twd.namespace, reference, Err(&blocked))
                    .await;
                Ok(Some(Err(Unresolved::Client {
                    blocked,
                    refused: error.needs_eviction(),
                })))
            }
        }
    }

    /// Records the Ready condition of the connection `reference` names for a TWD in `namespace`
    /// when it changed since the last write. Only what is about the connection itself is written
    /// (`Connected`, `AuthSecretInvalid`, `TemporalClientCreationFailed`): a missing connection
    /// has no status, and other reasons concern the TWD. A ClusterConnection shows the last
    /// resolution, from whichever namespace (its Secrets are each namespace's own).
    async fn note_connection(
        &self,
        namespace: &str,
        reference: &ConnectionReference,
        state: Result<(), &Blocked>,
    ) {
        let about_connection = |b: &Blocked| {
            matches!(
                b.reason,
                BlockReason::AuthSecretInvalid | BlockReason::TemporalClientCreationFailed
            )
        };
        if matches!(state, Err(b) if !about_connection(b)) {
            return;
        }
        let (ready, reason, message) = match state {
            Ok(()) => (
                true,
                "Connected".to_owned(),
                "Temporal is reachable with these settings".to_owned(),
            ),
            Err(b) => (false, b.reason.as_str().to_owned(), b.message.clone()),
        };
        let key = connection_object(namespace, reference).to_string();
        let changed = match self.connection_states.lock() {
            Ok(states) => states.get(&key) != Some(&(ready, reason.clone())),
            Err(_) => true,
        };
        if !changed {
            return;
        }
        match k8s::write_connection_status(
            &self.kube, namespace, reference, ready, &reason, &message,
        )
        .await
        {
            Ok(_) => {
                if let Ok(mut states) = self.connection_states.lock() {
                    states.insert(key, (ready, reason));
                }
            }
            Err(e) => {
                tracing::warn!(%namespace, connection = %key, "writing connection status: {e}")
            }
        }
    }

    /// Whether the TWD still exists, is not being deleted and targets `build_id`.
    async fn still_target(&self, twd: &TwdRef, build_id: &str) -> Result<bool, ActivityError> {
        let resource = k8s::get_twd(&self.kube, twd).await.map_err(retryable)?;
        Ok(resource.is_some_and(|r| {
            let spec = spec_view(&r);
            !spec.deleting && spec.target_build_id == build_id
        }))
    }

    /// The deletion path's answer when Temporal cannot be reached with the TWD's settings
    /// (`block`, because of `cause`): what it waits for, what the user can do, and what is being
    /// deleted along with the TWD (then nothing will fix the settings).
    async fn cleanup_blocked(
        &self,
        twd: &TwdRef,
        resource: &twc_crds::TemporalWorkerDeployment,
        block: CleanupBlock,
        cause: &str,
    ) -> Result<CleanupOutcome, ActivityError> {
        let reference = &resource.spec.worker_options.connection_ref;
        let connection = connection_object(&twd.namespace, reference).to_string();
        let teardown = self.teardown(twd, resource).await?;
        Ok(CleanupOutcome::Pending {
            message: cleanup_blocked_message(twd, &connection, cause, block, teardown),
            blocked_by: Some(block),
            teardown,
        })
    }

    /// What is being deleted along with the TWD: its namespace (read only with cluster-wide
    /// access; a controller restricted to namespaces has no ClusterConnections, and a namespace
    /// being deleted deletes its TemporalConnections), or the connection it uses.
    async fn teardown(
        &self,
        twd: &TwdRef,
        resource: &twc_crds::TemporalWorkerDeployment,
    ) -> Result<Option<Teardown>, ActivityError> {
        if self.cluster_access == ClusterAccess::Granted
            && k8s::namespace_deleting(&self.kube, &twd.namespace)
                .await
                .map_err(retryable)?
        {
            return Ok(Some(Teardown::Namespace));
        }
        Ok(self
            .connection_of(twd, resource)
            .await?
            .is_some_and(|c| c.is_deleting())
            .then_some(Teardown::Connection))
    }

    /// The connection the TWD uses, if it exists (and may be read).
    async fn connection_of(
        &self,
        twd: &TwdRef,
        resource: &twc_crds::TemporalWorkerDeployment,
    ) -> Result<Option<k8s::Connection>, ActivityError> {
        k8s::find_connection(
            &self.kube,
            self.cluster_access,
            &twd.namespace,
            &resource.spec.worker_options.connection_ref,
        )
        .await
        .map_err(retryable)
    }

    /// Evicts the client of a failed call when its credentials were rejected.
    fn after_error(&self, client: &TemporalClient, error: &TemporalError) {
        if error.needs_eviction() {
            self.pool.evict(client.key());
        }
    }

    /// The TWD resolved for a count, drain step or analysis; a TWD that is gone (failure type
    /// `gone_type`) or whose Temporal cannot be reached fails the activity without retry (the
    /// workflow decides what next).
    async fn resolve_or_fail(
        &self,
        twd: &TwdRef,
        gone_type: &str,
    ) -> Result<Resolved, ActivityError> {
        match self.resolve(twd).await? {
            None => Err(not_retryable(gone_type, gone(twd).message)),
            Some(Err(blocked)) => Err(not_retryable(blocked.reason.as_str(), blocked.message)),
            Some(Ok(resolved)) => Ok(resolved),
        }
    }

    /// Measures one analysis check of `request` (never fails: a provider that cannot answer
    /// gives an inconclusive measurement).
    async fn measure(
        &self,
        resolved: &Resolved,
        request: &AnalysisRequest,
        check: &CheckView,
    ) -> Measurement {
        let deployment_name = request.twd.key();
        match &check.provider {
            CheckProvider::Temporal {
                max_failure_percent,
                max_increase_over_current,
                min_samples,
                include_types,
                exclude_types,
            } => {
                let check = temporal::analysis::TemporalCheck {
                    name: &check.name,
                    namespace: &resolved.spec.temporal_namespace,
                    deployment_name: &deployment_name,
                    build_id: &request.build_id,
                    current_build_id: request.current_build_id.as_deref(),
                    filter: temporal::analysis::WorkflowFilter {
                        window_start: request.window_start,
                        include: include_types,
                        exclude: exclude_types,
                        gate_types: &request.gate_types,
                    },
                    limits: temporal::analysis::Limits {
                        max_failure_percent: *max_failure_percent,
                        max_increase_over_current: *max_increase_over_current,
                        min_samples: *min_samples,
                    },
                };
                temporal::analysis::measure(&resolved.temporal, &check).await
            }
            CheckProvider::Prometheus {
                address,
                query,
                max_value,
                min_value,
            } => {
                let placeholders = prometheus::Placeholders {
                    build_id: &request.build_id,
                    current_build_id: request.current_build_id.as_deref(),
                    deployment_name: &deployment_name,
                    temporal_namespace: &resolved.spec.temporal_namespace,
                    namespace: &request.twd.namespace,
                    name: &request.twd.name,
                };
                let query = prometheus::substitute(query, &placeholders);
                // Credentials and CA come from the live spec (the check's view carries no
                // Secret names) and its Secrets, read at each measurement.
                let spec = resolved
                    .resource
                    .object
                    .spec
                    .rollout
                    .analysis
                    .iter()
                    .flat_map(|analysis| &analysis.checks)
                    .find(|c| c.name == check.name)
                    .and_then(|c| c.prometheus.as_ref());
                let access = match spec {
                    Some(spec) => {
                        k8s::prometheus_access::prometheus_access(
                            &self.kube,
                            &request.twd.namespace,
                            spec,
                        )
                        .await
                    }
                    None => Ok(prometheus::PrometheusAccess::default()),
                };
                let access = match access {
                    Ok(access) => access,
                    Err(problem) => {
                        return prometheus::unreadable_access(&check.name, &query, &problem);
                    }
                };
                let check = prometheus::PrometheusCheck {
                    name: &check.name,
                    address,
                    query: &query,
                    min_value: *min_value,
                    max_value: *max_value,
                    access: &access,
                };
                prometheus::measure(&self.prometheus, &check).await
            }
        }
    }

    /// The activity error of a failed count or drain step: cancelled as such, retried when
    /// transient (or after rejected credentials, with the client evicted), otherwise a
    /// non-retryable failure named by [`temporal::DrainError::type_name`].
    /// Replays `sample` in a Job of `build_id`'s Deployment (named by `job_name` from the
    /// Deployment's name) and returns the verdict.
    async fn replay_on(
        &self,
        resolved: &Resolved,
        twd: &TwdRef,
        build_id: &str,
        sample: &[temporal::replay::ReplayCandidate],
        check: &twc_workflows::model::ReplayCheckView,
        job_name: impl Fn(&str) -> String,
    ) -> Result<k8s::replay_job::JobVerdict, ActivityError> {
        let uid = resolved.resource.metadata.uid.clone().unwrap_or_default();
        let deployment = k8s::list_owned_deployments(&self.kube, twd, &uid)
            .await
            .map_err(retryable)?
            .into_iter()
            .find(|d| {
                d.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(twc_crds::labels::BUILD_ID))
                    .is_some_and(|b| b == build_id)
            })
            .ok_or_else(|| {
                not_retryable(
                    "ReplayDeploymentGone",
                    format!("no Deployment of build {build_id} to run the replay check with"),
                )
            })?;
        let targets: Vec<ReplayTarget> = sample
            .iter()
            .map(|c| ReplayTarget {
                workflow_id: c.workflow_id.clone(),
                run_id: c.run_id.clone(),
            })
            .collect();
        let spec = k8s::replay_job::ReplayJobSpec {
            command: check.command.clone(),
            args: check.args.clone(),
            timeout_seconds: check.timeout_seconds,
        };
        let name = job_name(&deployment.metadata.name.clone().unwrap_or_default());
        let job = k8s::replay_job::build_replay_job(&deployment, &spec, &targets, name)
            .map_err(|e| not_retryable("ReplayCheckInvalid", e))?;
        let histories = u32::try_from(targets.len()).unwrap_or(u32::MAX);
        k8s::replay_job::run_replay_job(&self.kube, job, histories)
            .await
            .map_err(retryable)
    }

    /// The workflows of `twd` that each of `sources` names (one visibility page each), in
    /// order, for a replay check to pick from. A query that cannot be written fails without
    /// retry; a listing Temporal fails is retried (and the client evicted when it is broken).
    async fn replay_candidates(
        &self,
        resolved: &Resolved,
        twd: &TwdRef,
        sources: &[temporal::replay::CandidateSource<'_>],
    ) -> Result<Vec<temporal::replay::ReplayCandidate>, ActivityError> {
        use temporal::replay::{candidate_query, list_candidates};
        let deployment_name = twd.key();
        let mut candidates = Vec::new();
        for source in sources {
            let query = candidate_query(&deployment_name, *source)
                .map_err(|e| not_retryable("ReplayCheckInvalid", e.to_string()))?;
            let listed = list_candidates(
                &resolved.temporal,
                &resolved.spec.temporal_namespace,
                &query,
            )
            .await
            .map_err(|e| {
                self.after_error(&resolved.temporal, &e);
                retryable(e)
            })?;
            candidates.extend(listed);
        }
        Ok(candidates)
    }

    /// Before `moveToCurrent` moves `request`'s pinned workflows to the Current build: with
    /// `spec.rollout.replayCheck`, a sample of them is replayed on the Current build; unless
    /// they all replay (or the check is a dry run) the step fails without moving any, saying
    /// why (the drain tries again at its next look, finding the same Job's verdict).
    async fn check_move(
        &self,
        resolved: &Resolved,
        request: &DrainRequest,
        current_build_id: &str,
    ) -> Result<(), ActivityError> {
        use temporal::replay::{CandidateSource, pick};
        let Some(check) = resolved.spec.replay_check.as_ref() else {
            return Ok(());
        };
        let listed = self
            .replay_candidates(
                resolved,
                &request.twd,
                &[CandidateSource::PinnedOn(&request.build_id)],
            )
            .await?
            .into_iter()
            .filter(|c| {
                (request.include_types.is_empty()
                    || request.include_types.contains(&c.workflow_type))
                    && !request.exclude_types.contains(&c.workflow_type)
            })
            .collect();
        let max = usize::try_from(check.max_histories).unwrap_or(usize::MAX);
        let (sample, _) = pick(listed, max, i64::from(check.max_history_events));
        if sample.is_empty() {
            return Ok(());
        }
        let retired = request.build_id.clone();
        let found = self
            .replay_on(
                resolved,
                &request.twd,
                current_build_id,
                &sample,
                check,
                |deployment| k8s::replay_job::move_job_name(deployment, &retired),
            )
            .await?;
        let refusal = match found.verdict {
            ReplayVerdict::Passed { .. } => return Ok(()),
            ReplayVerdict::Nondeterministic {
                workflow_id,
                run_id,
                workflow_type,
                message,
                count,
            } => format!(
                "replay check: {count} of the workflows pinned to {retired} do not replay on the Current build {current_build_id}, none was moved: workflow {workflow_id} (run {run_id}, type {workflow_type}): {message}"
            ),
            ReplayVerdict::Inconclusive { reason } => format!(
                "replay check on the Current build {current_build_id} could not decide, none was moved: {reason}"
            ),
        };
        let refusal = if check.dry_run {
            format!("{refusal} (dryRun: moving them anyway)")
        } else {
            refusal
        };
        // Said once per check (the drain's later looks find the same Job and verdict): the
        // workflow's own DrainFailed event only knows that the step failed.
        if found.created
            && let Err(e) = k8s::emit_event(
                &self.kube,
                &request.twd,
                EventKind::Warning,
                ("ReplayCheckFailed", &refusal),
                Some(&self.own_namespace),
            )
            .await
        {
            tracing::warn!(twd = %request.twd.key(), "recording ReplayCheckFailed failed: {e}");
        }
        tracing::warn!(twd = %request.twd.key(), "{refusal}");
        if check.dry_run {
            return Ok(());
        }
        Err(not_retryable("ReplayCheckFailed", refusal))
    }

    fn drain_failure(&self, client: &TemporalClient, error: temporal::DrainError) -> ActivityError {
        if let temporal::DrainError::Temporal(e) = &error {
            self.after_error(client, e);
        }
        if matches!(error, temporal::DrainError::Cancelled { .. }) {
            tracing::warn!("{error}");
            ActivityError::cancelled()
        } else if error.is_transient() {
            retryable(error)
        } else {
            not_retryable(error.type_name(), error.to_string())
        }
    }
}

#[activities]
impl EngineActivities {
    /// Reads the TWD, its Deployments and Temporal's routing state.
    #[activity(name = "observe")]
    pub async fn observe(
        self: Arc<Self>,
        ctx: ActivityContext,
        twd: TwdRef,
    ) -> Result<Observation, ActivityError> {
        with_heartbeats(&ctx, self.observe_now(&twd)).await
    }

    /// What `observe` returns, read now.
    async fn observe_now(&self, twd: &TwdRef) -> Result<Observation, ActivityError> {
        let observed_at = now_millis();
        let resource = k8s::get_twd(&self.kube, twd).await.map_err(retryable)?;
        self.observe_read(twd, observed_at, resource, None, None)
            .await
    }

    /// [`EngineActivities::observe_now`] of the TWD as read at `observed_at` (`None`: gone),
    /// with its connection and its versioned Deployments when the caller just read them.
    async fn observe_read(
        &self,
        twd: &TwdRef,
        observed_at: i64,
        resource: Option<WorkerObject>,
        resolved: Option<k8s::ResolvedConnection>,
        listed: Option<Vec<Deployment>>,
    ) -> Result<Observation, ActivityError> {
        let gone = || Observation {
            spec: None,
            deployments: Vec::new(),
            temporal: Ok(TemporalState::default()),
            observed_at,
        };
        let Some(resource) = resource else {
            return Ok(gone());
        };
        let uid = resource.metadata.uid.clone().unwrap_or_default();
        let view = spec_view(&resource);
        let Some(resolved) = self.resolve_read(twd, Some(resource), resolved).await? else {
            return Ok(gone());
        };
        // The Deployments as the caller listed them, or as listed now.
        let deployments = async {
            match listed {
                Some(listed) => Ok(listed.iter().filter_map(deployment_view).collect()),
                None => k8s::list_versioned_deployments(&self.kube, twd, &uid).await,
            }
        };
        let (spec, temporal, deployments) = match resolved.map_err(Unresolved::into_blocked) {
            Ok(r) => {
                // Temporal and the Deployments are read at once.
                let deployment_name = twd.key();
                let (state, deployments) = tokio::join!(
                    temporal::describe_worker_deployment(
                        &r.temporal,
                        &r.spec.temporal_namespace,
                        &deployment_name,
                    ),
                    deployments,
                );
                if state.is_ok() {
                    let reference = &r.resource.spec.worker_options.connection_ref;
                    self.note_connection(&twd.namespace, reference, Ok(()))
                        .await;
                }
                (r.spec, state, deployments.map_err(retryable)?)
            }
            Err(blocked) => {
                let deployments = deployments.await.map_err(retryable)?;
                (view, Err(blocked), deployments)
            }
        };
        Ok(Observation {
            spec: Some(spec),
            deployments,
            temporal,
            observed_at,
        })
    }

    /// Adds the delete-protection finalizers.
    #[activity(name = "ensure_finalizers")]
    pub async fn ensure_finalizers(
        self: Arc<Self>,
        ctx: ActivityContext,
        twd: TwdRef,
    ) -> Result<(), ActivityError> {
        with_heartbeats(&ctx, async {
            k8s::ensure_finalizers(
                &self.kube,
                self.cluster_access,
                &twd,
                self.known_connections.as_deref(),
            )
            .await
            .map_err(retryable)
        })
        .await
    }

    /// Creates the build's Deployment if absent.
    #[activity(name = "create_deployment")]
    pub async fn create_deployment(
        self: Arc<Self>,
        ctx: ActivityContext,
        request: BuildRequest,
    ) -> Result<CreateDeploymentOutcome, ActivityError> {
        with_heartbeats(&ctx, async {
            // A rollout creating before its first observation (`version_limit` set) creates
            // only what that observation would: not while Temporal cannot be read, nor past
            // the version limit; otherwise its observation decides.
            if let Some(limit) = request.version_limit {
                let observation = self.observe_now(&request.twd).await?;
                let others = observation
                    .deployments
                    .iter()
                    .filter(|d| !d.deleting && d.build_id != request.build_id)
                    .count();
                let others = u32::try_from(others).unwrap_or(u32::MAX);
                let limit = usize::try_from(limit).unwrap_or(usize::MAX);
                if observation.temporal.is_err()
                    || twc_workflows::plan::sunset::version_limit_reached(&observation, limit)
                {
                    return Ok(CreateDeploymentOutcome::Deferred { others });
                }
            }
            match k8s::create_versioned_deployment(
                &self.kube,
                self.cluster_access,
                &request.twd,
                &request.build_id,
            )
            .await
            {
                Ok(outcome) => Ok(outcome),
                Err(e) => match e.blocked() {
                    Some(blocked) => Ok(CreateDeploymentOutcome::Blocked(blocked)),
                    None => Err(retryable(e)),
                },
            }
        })
        .await
    }

    /// Scales a Deployment.
    #[activity(name = "scale_deployment")]
    pub async fn scale_deployment(
        self: Arc<Self>,
        ctx: ActivityContext,
        request: ScaleRequest,
    ) -> Result<(), ActivityError> {
        with_heartbeats(&ctx, async {
            k8s::scale_deployment(
                &self.kube,
                &request.namespace,
                &request.name,
                request.replicas,
            )
            .await
            .map(|_| ())
            .map_err(retryable)
        })
        .await
    }

    /// Deletes a Deployment.
    #[activity(name = "delete_deployment")]
    pub async fn delete_deployment(
        self: Arc<Self>,
        ctx: ActivityContext,
        request: DeploymentRequest,
    ) -> Result<(), ActivityError> {
        with_heartbeats(&ctx, async {
            k8s::delete_deployment(&self.kube, &request.namespace, &request.name)
                .await
                .map(|_| ())
                .map_err(retryable)
        })
        .await
    }

    /// Waits for the build's pollers and its Deployment's availability (bounded).
    #[activity(name = "wait_for_pollers")]
    pub async fn wait_for_pollers(
        self: Arc<Self>,
        ctx: ActivityContext,
        request: WaitForPollersRequest,
    ) -> Result<PollerWaitOutcome, ActivityError> {
        with_heartbeats(&ctx, async {
            let started = tokio::time::Instant::now();
            let deadline =
                started + Duration::from_millis(u64::try_from(request.max_wait_ms).unwrap_or(0));
            let resolved = match self.resolve(&request.twd).await? {
                None => {
                    return Ok(not_ready(
                        None,
                        Some("the TemporalWorkerDeployment is gone".into()),
                    ));
                }
                Some(Err(blocked)) => return Ok(not_ready(Some(blocked), None)),
                Some(Ok(r)) => r,
            };
            let uid = resolved.resource.metadata.uid.clone().unwrap_or_default();
            let deployment_name = request.twd.key();
            let mut changes = Box::pin(k8s::versioned_deployment_changes(&self.kube, &request.twd));
            // Temporal is read on the first look (a connection that cannot work is reported at
            // once), whenever the Deployment is Available, and at the deadline: pods that are not
            // Available do not end the wait, and a burst of rollouts must not spend the
            // namespace's read budget on reads that cannot. Once Available, one observation (the
            // TWD, Temporal's worker deployment, the Deployments) says both whether the build is
            // registered, read as the rollout's planner reads it (listed by
            // `DescribeWorkerDeployment` in a state other than NotRegistered), and what the
            // rollout decides next. (`DescribeWorkerDeploymentVersion` right after the first
            // poll answers in ~300 ms on the dev server; the deployment's description in a few.)
            let mut registration: Result<bool, Blocked> = Ok(false);
            let mut asked = false;
            // Where the wait's time goes (logged at debug level when it ends): the last look's
            // Deployment list and Temporal read, and what woke each look.
            let mut looks = WaitLooks::default();
            let mut poller_recheck = POLLER_RECHECK;
            loop {
                let look_started = tokio::time::Instant::now();
                let deployments = k8s::list_versioned_deployments(&self.kube, &request.twd, &uid)
                    .await
                    .map_err(retryable)?;
                looks.list = look_started.elapsed();
                let deployment = deployments
                    .iter()
                    .find(|d| d.build_id == request.build_id && !d.deleting);
                let mut available = deployment.is_some_and(|d| d.available);
                let mut problem = deployment.and_then(|d| d.problem.clone());
                if available && looks.available_after.is_none() {
                    looks.available_after = Some(started.elapsed());
                }
                let at_deadline = tokio::time::Instant::now() >= deadline;
                let mut observation = None;
                if available {
                    let ask_started = tokio::time::Instant::now();
                    let observed = self.observe_now(&request.twd).await?;
                    looks.ask = Some(ask_started.elapsed());
                    registration = registered_in(&observed.temporal, &request.build_id);
                    // The observation's own list is the newer one.
                    let deployment = observed
                        .deployments
                        .iter()
                        .find(|d| d.build_id == request.build_id && !d.deleting);
                    available = deployment.is_some_and(|d| d.available);
                    problem = deployment.and_then(|d| d.problem.clone());
                    observation = Some(observed);
                } else if !asked || at_deadline {
                    let ask_started = tokio::time::Instant::now();
                    let state = temporal::describe_worker_deployment(
                        &resolved.temporal,
                        &resolved.spec.temporal_namespace,
                        &deployment_name,
                    )
                    .await;
                    looks.ask = Some(ask_started.elapsed());
                    registration = registered_in(&state, &request.build_id);
                }
                asked = true;
                let registered = matches!(registration, Ok(true));
                let done = registered && available;
                if done || at_deadline || ctx.is_cancelled() {
                    self.metrics.waited_for_pollers(started.elapsed(), done);
                    let blocked = registration.err();
                    let observation = observation
                        .filter(|_| done && request.observe_when_ready)
                        .map(Box::new);
                    tracing::debug!(
                        twd = %request.twd.key(),
                        build = %request.build_id,
                        done,
                        total_ms = started.elapsed().as_millis() as u64,
                        available_after_ms = looks.available_after.map(|d| d.as_millis() as u64),
                        last_list_ms = looks.list.as_millis() as u64,
                        last_ask_ms = looks.ask.map(|d| d.as_millis() as u64),
                        woken_by_change = looks.by_change,
                        woken_by_timer = looks.by_timer,
                        "wait for pollers ended"
                    );
                    return Ok(PollerWaitOutcome {
                        registered,
                        available,
                        problem,
                        blocked,
                        observation,
                    });
                }
                // Pods up: pollers register within moments, so look again soon (then less and
                // less often). Until then a change of the Deployment (its status turning
                // Available) ends the wait early.
                let interval = if available {
                    let interval = poller_recheck;
                    poller_recheck = (poller_recheck * 2).min(POLLER_RECHECK_MAX);
                    interval
                } else {
                    AVAILABILITY_RECHECK
                };
                tokio::select! {
                    () = tokio::time::sleep(crate::backoff::spread(interval)) => looks.by_timer += 1,
                    _ = changes.next() => looks.by_change += 1,
                }
            }
        })
        .await
    }

    /// Changes routing in the workers' Temporal.
    #[activity(name = "set_routing")]
    pub async fn set_routing(
        self: Arc<Self>,
        ctx: ActivityContext,
        request: RoutingRequest,
    ) -> Result<RoutingOutcome, ActivityError> {
        with_heartbeats(&ctx, async {
            let resolved = match self.resolve(&request.twd).await? {
                None => return Ok(RoutingOutcome::Blocked(gone(&request.twd))),
                Some(Err(blocked)) => return Ok(RoutingOutcome::Blocked(blocked)),
                Some(Ok(r)) => r,
            };
            // Each attempt re-reads the TWD: a write for a build the TWD no longer targets (a
            // rollout superseded while this activity was retried, e.g. through a restart of
            // Temporal) is not made; the rollout observes again and sees it is superseded.
            if routes_a_stale_build(&request.change, &resolved.spec) {
                tracing::info!(twd = %request.twd.key(), change = ?request.change, target = %resolved.spec.target_build_id, "routing change for a build the TWD no longer targets; not written");
                return Ok(RoutingOutcome::Conflict);
            }
            let manager = temporal::Manager {
                identity: &self.identity,
                take_over: &self.take_over,
            };
            let result = temporal::set_routing_as(
                &resolved.temporal,
                &resolved.spec.temporal_namespace,
                &request.twd.key(),
                &manager,
                request.change,
                request.conflict_token.as_deref(),
            )
            .await;
            match result {
                Ok(outcome) => Ok(outcome),
                Err(e) => {
                    self.after_error(&resolved.temporal, &e);
                    if e.is_transient() {
                        Err(retryable(e))
                    } else {
                        Ok(RoutingOutcome::Blocked(
                            e.to_blocked(BlockReason::PlanExecutionFailed),
                        ))
                    }
                }
            }
        })
        .await
    }

    /// Deletes a version from the workers' Temporal.
    #[activity(name = "delete_version")]
    pub async fn delete_version(
        self: Arc<Self>,
        ctx: ActivityContext,
        request: DeleteVersionRequest,
    ) -> Result<DeleteVersionOutcome, ActivityError> {
        with_heartbeats(&ctx, async {
            let resolved = match self.resolve(&request.twd).await? {
                None => {
                    return Ok(DeleteVersionOutcome::NotYet {
                        message: "the TemporalWorkerDeployment is gone".into(),
                    });
                }
                Some(Err(blocked)) => {
                    return Ok(DeleteVersionOutcome::NotYet {
                        message: blocked.message,
                    });
                }
                Some(Ok(r)) => r,
            };
            temporal::delete_version(
                &resolved.temporal,
                &resolved.spec.temporal_namespace,
                &request.twd.key(),
                &request.build_id,
                request.skip_drainage,
                &self.identity,
            )
            .await
            .map_err(|e| {
                self.after_error(&resolved.temporal, &e);
                retryable(e)
            })
        })
        .await
    }

    /// Starts the gate workflows (idempotently) and waits a bounded time for their results: the
    /// rollout's gate, or the gate of a step (type and input from that step as the spec has it
    /// now; a step or gate no longer there is `PlanGenerationFailed`).
    #[activity(name = "run_gate")]
    pub async fn run_gate(
        self: Arc<Self>,
        ctx: ActivityContext,
        request: GateRequest,
    ) -> Result<GateOutcome, ActivityError> {
        with_heartbeats(&ctx, async {
            let blocked_outcome = |blocked: Blocked| GateOutcome {
                runs: Vec::new(),
                passed: false,
                blocked: Some(blocked),
            };
            let resolved = match self.resolve(&request.twd).await? {
                None => return Ok(blocked_outcome(gone(&request.twd))),
                Some(Err(blocked)) => return Ok(blocked_outcome(blocked)),
                Some(Ok(r)) => r,
            };
            // The rollout's gate, or the gate of the step in force (as the spec says now).
            let rollout = &resolved.resource.spec.rollout;
            let gate = match request.step {
                None => rollout.gate.as_ref().map(k8s::GateField::rollout),
                Some(step) => match k8s::step_gate(rollout, step.step) {
                    Ok(field) => Some(field),
                    Err(blocked) => return Ok(blocked_outcome(blocked)),
                },
            };
            let workflow_type = match (&gate, request.step) {
                (Some(field), Some(step)) => {
                    if field.gate.workflow_type != request.workflow_type {
                        tracing::info!(
                            twd = %request.twd.key(),
                            step = step.step,
                            requested = %request.workflow_type,
                            spec = %field.gate.workflow_type,
                            "the step's gate workflow type changed; running the spec's"
                        );
                    }
                    field.gate.workflow_type.clone()
                }
                _ => request.workflow_type.clone(),
            };
            let input = match &gate {
                None => None,
                Some(field) => {
                    match k8s::gate_input(&self.kube, &request.twd.namespace, field).await {
                        Ok(input) => input,
                        Err(ResolveError::Blocked(blocked)) => return Ok(blocked_outcome(blocked)),
                        Err(ResolveError::Transient(e)) => return Err(retryable(e)),
                    }
                }
            };
            let namespace = resolved.spec.temporal_namespace.clone();
            let deployment_name = request.twd.key();
            let max_wait = Duration::from_millis(u64::try_from(request.max_wait_ms).unwrap_or(0));
            let deadline = tokio::time::Instant::now() + max_wait;
            // The version's workflow task queues: known once its workers polled.
            let task_queues = loop {
                match temporal::version_task_queues(
                    &resolved.temporal,
                    &namespace,
                    &deployment_name,
                    &request.build_id,
                )
                .await
                {
                    Ok(Some(queues)) => {
                        let workflow: Vec<String> = queues
                            .into_iter()
                            .filter(|(_, k)| *k == TaskQueueKind::Workflow)
                            .map(|(n, _)| n)
                            .collect();
                        if !workflow.is_empty() {
                            break workflow;
                        }
                    }
                    Ok(None) => {}
                    Err(blocked) => return Ok(blocked_outcome(blocked)),
                }
                if tokio::time::Instant::now() >= deadline {
                    return Ok(GateOutcome {
                        runs: Vec::new(),
                        passed: false,
                        blocked: None,
                    });
                }
                tokio::time::sleep(crate::backoff::spread(POLL_INTERVAL)).await;
            };
            // The wait above may be long: a build superseded meanwhile gets no gates (its rollout
            // stops the gates it knows of, and would miss these).
            if ctx.is_cancelled() || !self.still_target(&request.twd, &request.build_id).await? {
                return Ok(GateOutcome {
                    runs: Vec::new(),
                    passed: false,
                    blocked: None,
                });
            }
            let runs = match temporal::start_gates(
                &resolved.temporal,
                &namespace,
                &deployment_name,
                &request.build_id,
                &workflow_type,
                input,
                temporal::GateKey::of(&request),
                &task_queues,
            )
            .await
            {
                Ok(runs) => runs,
                Err(e) if e.is_transient() => {
                    self.after_error(&resolved.temporal, &e.source);
                    return Err(retryable(e));
                }
                Err(e) => {
                    self.after_error(&resolved.temporal, &e.source);
                    return Ok(blocked_outcome(e.to_blocked()));
                }
            };
            let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
            let wait = temporal::wait_gates(&resolved.temporal, &namespace, runs.clone(), || {});
            let waited = tokio::time::timeout(remaining, wait).await;
            let runs = match waited {
                Ok(Ok(runs)) => runs,
                Ok(Err(blocked)) => return Ok(blocked_outcome(blocked)),
                Err(_) => runs,
            };
            let passed = !runs.is_empty() && runs.iter().all(|r| r.status == "Completed");
            Ok(GateOutcome {
                runs,
                passed,
                blocked: None,
            })
        })
        .await
    }

    /// Cancels the build's running gate workflows; terminates those that ignore it.
    #[activity(name = "cancel_gates")]
    pub async fn cancel_gates(
        self: Arc<Self>,
        ctx: ActivityContext,
        request: BuildRequest,
    ) -> Result<(), ActivityError> {
        with_heartbeats(&ctx, async {
            let Some(Ok(resolved)) = self.resolve(&request.twd).await? else {
                return Ok(());
            };
            temporal::stop_build_gates(
                &resolved.temporal,
                &resolved.spec.temporal_namespace,
                &request.twd.key(),
                &request.build_id,
                GATE_STOP_GRACE,
            )
            .await
            .map(|_| ())
            .map_err(retryable)
        })
        .await
    }

    /// Writes the TWD's status.
    #[activity(name = "write_status")]
    pub async fn write_status(
        self: Arc<Self>,
        ctx: ActivityContext,
        request: StatusRequest,
    ) -> Result<(), ActivityError> {
        with_heartbeats(&ctx, async {
            let twd = &request.twd;
            let (write, before) =
                k8s::write_twd_status_seen(&self.kube, twd, request.status.clone())
                    .await
                    .map_err(retryable)?;
            if let (k8s::StatusWrite::Written | k8s::StatusWrite::Unchanged, Some(before)) =
                (write, before)
            {
                let manual = before.spec.rollout.strategy == RolloutStrategy::Manual;
                if let Some(key) = twc_workflows::plan::notify::waiting_for_promotion_key(
                    manual,
                    before.status.as_ref(),
                    &request.status,
                ) {
                    let message = request
                        .status
                        .rollout
                        .as_ref()
                        .and_then(|r| r.message.clone())
                        .unwrap_or_else(|| "The rollout waits for promotion".to_owned());
                    let notification = Notification {
                        key,
                        event: NotificationEvent::WaitingForPromotion,
                        reason: "WaitingForPromotion".to_owned(),
                        message,
                        workflow_id: ctx.info().workflow_id.clone().unwrap_or_default(),
                        at: now_millis(),
                    };
                    self.queue_notification(
                        &ctx,
                        twd,
                        before.spec.notifications.as_ref(),
                        notification,
                    )
                    .await?;
                }
                self.metrics.status_written(
                    metrics::strategy_label(&before.spec.rollout.strategy),
                    before.status.as_ref(),
                    &request.status,
                    k8s_openapi::jiff::Timestamp::now(),
                );
            }
            Ok(())
        })
        .await
    }

    /// Records an Event on the TWD.
    #[activity(name = "emit_event")]
    pub async fn emit_event(
        self: Arc<Self>,
        ctx: ActivityContext,
        request: EventRequest,
    ) -> Result<(), ActivityError> {
        with_heartbeats(&ctx, async {
            let twd = &request.twd;
            let Some(resource) = k8s::get_twd(&self.kube, twd).await.map_err(retryable)? else {
                tracing::debug!(twd = %twd.key(), reason = %request.reason, "TWD gone; event not recorded");
                return Ok(());
            };
            k8s::emit_event_on(
                &self.kube,
                &resource,
                request.kind,
                (&request.reason, &request.message),
                Some(&self.own_namespace),
            )
            .await
            .map_err(retryable)?;
            let Some(event) = NotificationEvent::of_reason(&request.reason) else {
                return Ok(());
            };
            let info = ctx.info();
            let workflow_id = info.workflow_id.clone().unwrap_or_default();
            let key = twc_workflows::plan::notify::idempotency_key(
                &workflow_id,
                info.workflow_run_id.as_deref().unwrap_or_default(),
                &info.activity_id,
            );
            let notification = Notification {
                key,
                event,
                reason: request.reason.clone(),
                message: request.message.clone(),
                workflow_id,
                at: now_millis(),
            };
            self.queue_notification(&ctx, twd, resource.spec.notifications.as_ref(), notification)
                .await
        })
        .await
    }

    /// Queues `notification` on the notification workflow of `twd` (starting it if need be)
    /// when one of its targets wants it. A retried activity queues the same key again, which
    /// the workflow drops.
    async fn queue_notification(
        &self,
        ctx: &ActivityContext,
        twd: &TwdRef,
        own: Option<&NotificationSpec>,
        notification: Notification,
    ) -> Result<(), ActivityError> {
        let targets = notify::targets_for(
            own,
            &twd.namespace,
            &self.cluster_notifications,
            notification.event,
            None,
        );
        if targets.is_empty() {
            return Ok(());
        }
        let task_queue = self
            .engine_task_queue
            .clone()
            .unwrap_or_else(|| ctx.info().task_queue.clone());
        let input = NotifyInput {
            twd: twd.clone(),
            carried: None,
        };
        let options =
            temporalio_client::WorkflowStartOptions::new(task_queue, notify_workflow_id(twd))
                .build();
        let (event, key) = (notification.event, notification.key.clone());
        ctx.client()
            .signal_with_start_workflow(
                NotifyWorkflow::run,
                input,
                NotifyWorkflow::notify,
                notification,
                options,
            )
            .await
            .map_err(|e| {
                ActivityError::from(anyhow::anyhow!(
                    "queueing notification {} of {} failed: {e}",
                    event.as_str(),
                    twd.key()
                ))
            })?;
        tracing::info!(twd = %twd.key(), event = event.as_str(), %key, targets = targets.len(), "queued notification");
        Ok(())
    }

    /// Sends one notification to the targets of the TWD that want it (or to `only`, never to
    /// `except`); each
    /// target's result is data for the notification workflow, not an error.
    #[activity(name = "send_notification")]
    pub async fn send_notification(
        self: Arc<Self>,
        ctx: ActivityContext,
        request: NotificationRequest,
    ) -> Result<NotificationOutcome, ActivityError> {
        with_heartbeats(&ctx, async {
            let twd = &request.twd;
            let Some(resource) = k8s::get_twd(&self.kube, twd).await.map_err(retryable)? else {
                return Ok(NotificationOutcome::default());
            };
            let notification = &request.notification;
            let targets = notify::targets_for(
                resource.spec.notifications.as_ref(),
                &twd.namespace,
                &self.cluster_notifications,
                notification.event,
                request.only.as_deref(),
            );
            let mut results = Vec::with_capacity(targets.len());
            for target in targets
                .into_iter()
                .filter(|t| !request.except.contains(&t.name))
            {
                let failure = match notify::read_url(&self.kube, &target)
                    .await
                    .map_err(retryable)?
                {
                    Err(failure) => Some(failure),
                    Ok(url) => {
                        let body = notify::payload(target.format, twd, notification);
                        self.webhooks
                            .post(&url, &notification.key, &body)
                            .await
                            .err()
                            .map(|why| TargetFailure {
                                target: target.name.clone(),
                                reason: NotificationFailure::NotificationDeliveryFailed,
                                message: format!("{why}; retried with backoff"),
                            })
                    }
                };
                match &failure {
                    None => tracing::info!(twd = %twd.key(), target = %target.name,
                        event = notification.event.as_str(), key = %notification.key, "notification delivered"),
                    Some(f) => tracing::warn!(twd = %twd.key(), target = %target.name,
                        event = notification.event.as_str(), reason = f.reason.as_str(), "notification not delivered: {}", f.message),
                }
                results.push(TargetResult {
                    target: target.name,
                    failure,
                });
            }
            Ok(NotificationOutcome { results })
        })
        .await
    }

    /// Deletion path of a TWD. A failure to reach Temporal with the TWD's settings (missing
    /// connection or Secret, Temporal out of reach or refusing the credentials, on connecting
    /// or on a call) is `Pending` with its [`CleanupBlock`], for the workflow to decide whether
    /// to give the cleanup up; Temporal answering "not yet" is `Pending` without one.
    #[activity(name = "cleanup_deleted")]
    pub async fn cleanup_deleted(
        self: Arc<Self>,
        ctx: ActivityContext,
        twd: TwdRef,
    ) -> Result<CleanupOutcome, ActivityError> {
        with_heartbeats(&ctx, async {
            // A live object of this name (the other kind) holds the Temporal Worker Deployment:
            // nothing of it is cleaned up (a late signal of a handed-over object lands here).
            if let Some(live) = k8s::get_twd(&self.kube, &twd)
                .await
                .map_err(retryable)?
                .filter(|holder| !holder.deleting())
            {
                return Ok(CleanupOutcome::Pending {
                    message: format!(
                        "{} is live and manages worker deployment {}: nothing is cleaned up",
                        live.describe(),
                        twd.key()
                    ),
                    blocked_by: None,
                    teardown: None,
                });
            }
            let resolved = match self.resolve_detailed(&twd).await? {
                None => return Ok(CleanupOutcome::Done),
                Some(Err(unresolved)) => return self.cleanup_unresolved(&twd, unresolved).await,
                Some(Ok(r)) => r,
            };
            let namespace = resolved.spec.temporal_namespace.clone();
            let deployment_name = twd.key();
            let client = &resolved.temporal;
            let out_of_reach =
                |error: &TemporalError| out_of_reach(error).map(|block| (block, error.to_string()));
            // 1. New work goes to unversioned workers again.
            let waiting_to_route = format!(
                "Waiting to route worker deployment {deployment_name} back to unversioned workers"
            );
            match temporal::reset_to_unversioned(
                client,
                &namespace,
                &deployment_name,
                &self.identity,
            )
            .await
            {
                Ok(RoutingOutcome::Applied) => {}
                Ok(other) => {
                    return Ok(pending(format!("{waiting_to_route}: {other:?}")));
                }
                Err(e) => {
                    if let Some((block, cause)) = out_of_reach(&e) {
                        return self
                            .cleanup_blocked(&twd, &resolved.resource, block, &cause)
                            .await;
                    }
                    return Ok(pending(format!("{waiting_to_route}: {e}")));
                }
            }
            // 2. Stop the versioned workers (their pollers must be gone before versions can go).
            let uid = resolved.resource.metadata.uid.clone().unwrap_or_default();
            for deployment in k8s::list_versioned_deployments(&self.kube, &twd, &uid)
                .await
                .map_err(retryable)?
            {
                k8s::delete_deployment(&self.kube, &twd.namespace, &deployment.name)
                    .await
                    .map_err(retryable)?;
            }
            // 3. Versions and the worker deployment.
            let state = match temporal::describe::fetch_worker_deployment(
                client,
                &namespace,
                &deployment_name,
            )
            .await
            {
                Ok(state) => state.unwrap_or_default(),
                Err(e) => {
                    if let Some((block, cause)) = out_of_reach(&e) {
                        return self
                            .cleanup_blocked(&twd, &resolved.resource, block, &cause)
                            .await;
                    }
                    let blocked =
                        temporal::describe::fetch_blocked(&e, &namespace, &deployment_name);
                    return Ok(pending(format!(
                        "Waiting to read worker deployment {deployment_name} from Temporal: {}",
                        blocked.message
                    )));
                }
            };
            let mut pending_parts = Vec::new();
            let mut blocked_by = None;
            for version in &state.versions {
                match temporal::delete_version(
                    client,
                    &namespace,
                    &deployment_name,
                    &version.build_id,
                    true,
                    &self.identity,
                )
                .await
                {
                    Ok(DeleteVersionOutcome::Deleted) => {}
                    Ok(DeleteVersionOutcome::NotYet { message }) => {
                        pending_parts.push(format!("{}: {message}", version.build_id))
                    }
                    Err(e) => {
                        blocked_by = blocked_by.or_else(|| out_of_reach(&e));
                        pending_parts.push(format!("{}: {e}", version.build_id))
                    }
                }
            }
            if state.exists && pending_parts.is_empty() {
                match temporal::delete_worker_deployment(
                    client,
                    &namespace,
                    &deployment_name,
                    &self.identity,
                )
                .await
                {
                    Ok(DeleteVersionOutcome::Deleted) => {}
                    Ok(DeleteVersionOutcome::NotYet { message }) => pending_parts.push(message),
                    Err(e) => {
                        blocked_by = blocked_by.or_else(|| out_of_reach(&e));
                        pending_parts.push(e.to_string())
                    }
                }
            }
            if let Some((block, cause)) = blocked_by {
                return self
                    .cleanup_blocked(&twd, &resolved.resource, block, &cause)
                    .await;
            }
            if !pending_parts.is_empty() {
                return Ok(pending(format!(
                    "Waiting to delete worker deployment {deployment_name} from Temporal: {}",
                    pending_parts.join("; ")
                )));
            }
            // 4. Let the TWD (and, if unused, its connection) go.
            k8s::release_finalizers(&self.kube, self.cluster_access, &twd)
                .await
                .map_err(retryable)?;
            Ok(CleanupOutcome::Done)
        })
        .await
    }

    /// The deletion path's answer when the TWD could not be resolved for its Temporal: which of
    /// the connection, its Secret or Temporal is at fault. Reasons that are about neither
    /// (e.g. a ClusterConnection a controller restricted to namespaces may not use) wait.
    async fn cleanup_unresolved(
        &self,
        twd: &TwdRef,
        unresolved: Unresolved,
    ) -> Result<CleanupOutcome, ActivityError> {
        let (block, cause) = match unresolved {
            Unresolved::Settings(blocked) => match blocked.reason {
                BlockReason::TemporalConnectionNotFound => {
                    (CleanupBlock::ConnectionGone, blocked.message)
                }
                BlockReason::AuthSecretInvalid => (CleanupBlock::SecretGone, blocked.message),
                _ => {
                    return Ok(pending(format!(
                        "Waiting to remove worker deployment {} from Temporal: {}",
                        twd.key(),
                        blocked.message
                    )));
                }
            },
            Unresolved::Client { blocked, refused } => {
                let block = if refused {
                    CleanupBlock::Refused
                } else {
                    CleanupBlock::Unreachable
                };
                (block, blocked.message)
            }
        };
        let Some(resource) = k8s::get_twd(&self.kube, twd).await.map_err(retryable)? else {
            return Ok(CleanupOutcome::Done);
        };
        self.cleanup_blocked(twd, &resource, block, &cause).await
    }

    /// Deletion path when Temporal cannot be cleaned up and nothing is coming to fix it:
    /// deletes the versioned Deployments, says what was left in Temporal and how to remove it
    /// by hand (a `TemporalCleanupSkipped` Warning event, in the controller's own namespace when
    /// the TWD's is being deleted, and a log line), releases the finalizers (the connection's
    /// too, once no other TWD uses it) and returns the same words. Does nothing to a TWD that
    /// is not being deleted.
    #[activity(name = "release_without_temporal")]
    pub async fn release_without_temporal(
        self: Arc<Self>,
        ctx: ActivityContext,
        request: ReleaseRequest,
    ) -> Result<String, ActivityError> {
        let ReleaseRequest { twd, cause } = request;
        with_heartbeats(&ctx, async {
            let Some(resource) = k8s::get_twd(&self.kube, &twd).await.map_err(retryable)? else {
                return Ok(format!(
                    "TemporalWorkerDeployment {} is already gone; nothing was left to release",
                    twd.key()
                ));
            };
            let spec = spec_view(&resource);
            if !spec.deleting {
                return Ok(format!(
                    "TemporalWorkerDeployment {} is not being deleted; nothing was released",
                    twd.key()
                ));
            }
            let connection = self.connection_of(&twd, &resource).await?;
            let mut deleted = 0;
            for deployment in k8s::list_versioned_deployments(&self.kube, &twd, &spec.uid)
                .await
                .map_err(retryable)?
            {
                if !deployment.deleting
                    && k8s::delete_deployment(&self.kube, &twd.namespace, &deployment.name)
                        .await
                        .map_err(retryable)?
                {
                    deleted += 1;
                }
            }
            let left = LeftInTemporal {
                deployment_name: twd.key(),
                temporal_namespace: spec.temporal_namespace.clone(),
                address: connection.map(|c| c.spec().host_port.clone()),
                versions: known_versions(resource.status.as_ref()),
                identity: self.identity.clone(),
            };
            // What was left and how to remove it come before the cause: an event keeps only
            // the first 1,024 bytes.
            let message = format!(
                "Released TemporalWorkerDeployment {} without cleaning up Temporal; deleted {deleted} versioned Deployment(s). {}. Why: {cause}",
                twd.key(),
                left.describe()
            );
            // The event goes first: once the finalizer is gone, so is the TWD it is about.
            // Failing to record it does not hold the release (the log and the workflow history
            // have the same words).
            if let Err(e) = k8s::emit_event(
                &self.kube,
                &twd,
                EventKind::Warning,
                ("TemporalCleanupSkipped", &message),
                Some(&self.own_namespace),
            )
            .await
            {
                tracing::warn!(twd = %twd.key(), "recording TemporalCleanupSkipped failed: {e}");
            }
            k8s::release_finalizers(&self.kube, self.cluster_access, &twd)
                .await
                .map_err(retryable)?;
            tracing::warn!(twd = %twd.key(), "{message}");
            Ok(message)
        })
        .await
    }

    /// Re-asserts finalizers, the connection's settings on live Deployments and, under
    /// `unsafeCustomBuildID`, the current pod template; returns what it changed.
    #[activity(name = "reassert_resources")]
    pub async fn reassert_resources(
        self: Arc<Self>,
        ctx: ActivityContext,
        twd: TwdRef,
    ) -> Result<twc_workflows::contract::ReassertOutcome, ActivityError> {
        with_heartbeats(&ctx, async { self.reassert(&twd).await.map_err(retryable) }).await
    }

    /// Re-asserts the TWD's resources ([`k8s::reassert_resources`]).
    async fn reassert(
        &self,
        twd: &TwdRef,
    ) -> Result<twc_workflows::contract::ReassertOutcome, k8s::K8sError> {
        k8s::reassert_resources(
            &self.kube,
            self.cluster_access,
            twd,
            self.known_connections.as_deref(),
        )
        .await
    }

    /// Re-asserts the TWD's resources (a failure is logged and retried at a later turn), then
    /// observes.
    #[activity(name = "recheck")]
    pub async fn recheck(
        self: Arc<Self>,
        ctx: ActivityContext,
        twd: TwdRef,
    ) -> Result<RecheckOutcome, ActivityError> {
        with_heartbeats(&ctx, async {
            // The claim is read once for both halves, and so is the connection when nothing
            // was changed (else the observation reads what the changes left).
            let observed_at = now_millis();
            let claim = k8s::read_claim(&self.kube, &twd)
                .await
                .map_err(retryable)?;
            let holder = claim.as_ref().map(|c| c.holder.clone());
            let reasserted = match k8s::reassert_claimed(
                &self.kube,
                self.cluster_access,
                &twd,
                claim,
                self.known_connections.as_deref(),
            )
            .await
            {
                Ok(reasserted) => reasserted,
                Err(e) => {
                    tracing::warn!(twd = %twd.key(), "re-asserting resources failed (retried at a later turn): {e}");
                    k8s::Reasserted::default()
                }
            };
            let k8s::Reasserted {
                outcome: reasserted,
                resolved,
                deployments,
            } = reasserted;
            // Nothing changed: the claim, connection and Deployments just read are current, and
            // a quiet turn lists its Deployments once.
            let observation = if reasserted.changes.is_empty() {
                self.observe_read(&twd, observed_at, holder, resolved, deployments)
                    .await?
            } else {
                self.observe_now(&twd).await?
            };
            Ok(RecheckOutcome {
                reasserted,
                observation,
            })
        })
        .await
    }

    /// The replay check of a new build (see the contract's `RunReplayCheck`): candidates from
    /// visibility, a sample of them replayed by a Job of the build's own pod template.
    #[activity(name = "run_replay_check")]
    pub async fn run_replay_check(
        self: Arc<Self>,
        ctx: ActivityContext,
        request: ReplayCheckRequest,
    ) -> Result<ReplayVerdict, ActivityError> {
        use temporal::replay::{CandidateSource, pick};
        with_heartbeats(&ctx, async {
            let resolved = self.resolve_or_fail(&request.twd, "ReplayTwdGone").await?;
            let mut sources = Vec::new();
            for build in [&request.current_build_id, &request.ramping_build_id]
                .into_iter()
                .flatten()
            {
                sources.push(CandidateSource::AutoUpgradeOn(build));
            }
            if let Some(current) = &request.current_build_id {
                sources.push(CandidateSource::ClosedOn(current));
            }
            let candidates = self
                .replay_candidates(&resolved, &request.twd, &sources)
                .await?;
            let max = usize::try_from(request.check.max_histories).unwrap_or(usize::MAX);
            let (sample, too_long) = pick(
                candidates,
                max,
                i64::from(request.check.max_history_events),
            );
            if sample.is_empty() {
                tracing::info!(twd = %request.twd.key(), build = %request.build_id, too_long, "replay check: no history to replay");
                return Ok(ReplayVerdict::Passed {
                    histories: 0,
                    workflow_types: Default::default(),
                    seconds: 0.0,
                });
            }
            let run_id = ctx.info().workflow_run_id.clone().unwrap_or_default();
            let job_name = |deployment: &str| {
                k8s::replay_job::replay_job_name(deployment, &run_id, request.attempt)
            };
            self.replay_on(&resolved, &request.twd, &request.build_id, &sample, &request.check, job_name)
                .await
                .map(|found| found.verdict)
        })
        .await
    }

    /// Counts the open workflows pinned to a version of the TWD (a visibility count) and finds
    /// the oldest one's start time. A TWD that is gone or whose Temporal cannot be reached, and
    /// a filter that cannot be queried, fail without retry; transient failures are retried.
    #[activity(name = "count_pinned_workflows")]
    pub async fn count_pinned_workflows(
        self: Arc<Self>,
        ctx: ActivityContext,
        request: PinnedRequest,
    ) -> Result<PinnedCount, ActivityError> {
        with_heartbeats(&ctx, async {
            let resolved = self.resolve_or_fail(&request.twd, "DrainTwdGone").await?;
            temporal::count_pinned(
                &resolved.temporal,
                &resolved.spec.temporal_namespace,
                &request.twd.key(),
                &request.build_id,
                &request.include_types,
                &request.exclude_types,
            )
            .await
            .map_err(|e| self.drain_failure(&resolved.temporal, e))
        })
        .await
    }

    /// One drain step of a retired version: a batch operation over its open pinned workflows
    /// (attached to, not restarted, on retry), awaited to the end; in dry-run a count only.
    /// Refused (without retry) while the build is Current or Ramping; cancelling the activity
    /// stops the batch.
    #[activity(name = "drain_version")]
    pub async fn drain_version(
        self: Arc<Self>,
        ctx: ActivityContext,
        request: DrainRequest,
    ) -> Result<DrainOutcome, ActivityError> {
        with_heartbeats(&ctx, async {
            let resolved = self.resolve_or_fail(&request.twd, "DrainTwdGone").await?;
            if let DrainAction::MoveToCurrent { current_build_id } = &request.action
                && !request.dry_run
            {
                self.check_move(&resolved, &request, current_build_id)
                    .await?;
            }
            let deployment_name = request.twd.key();
            let uid = resolved.resource.metadata.uid.clone().unwrap_or_default();
            let step = temporal::DrainStep {
                namespace: &resolved.spec.temporal_namespace,
                deployment_name: &deployment_name,
                twd_uid: &uid,
                build_id: &request.build_id,
                action: &request.action,
                include_types: &request.include_types,
                exclude_types: &request.exclude_types,
                rate: request.rate,
                dry_run: request.dry_run,
            };
            temporal::drain_version(&resolved.temporal, &step, || ctx.is_cancelled())
                .await
                .map_err(|e| self.drain_failure(&resolved.temporal, e))
        })
        .await
    }

    /// Measures canary analysis checks of a build: one measurement per check, in order (checks
    /// measured concurrently). A provider that cannot answer gives an inconclusive measurement,
    /// never a failed activity; a TWD that is gone or whose Temporal cannot be reached fails
    /// without retry.
    #[activity(name = "run_analysis")]
    pub async fn run_analysis(
        self: Arc<Self>,
        ctx: ActivityContext,
        request: AnalysisRequest,
    ) -> Result<AnalysisResult, ActivityError> {
        with_heartbeats(&ctx, async {
            let resolved = self
                .resolve_or_fail(&request.twd, "AnalysisTwdGone")
                .await?;
            let measurements = futures::future::join_all(
                request
                    .checks
                    .iter()
                    .map(|check| self.measure(&resolved, &request, check)),
            )
            .await;
            tracing::info!(
                twd = %request.twd.key(),
                build_id = %request.build_id,
                step = request.step,
                verdicts = ?measurements
                    .iter()
                    .map(|m| (m.check.as_str(), m.verdict.as_str()))
                    .collect::<Vec<_>>(),
                "analysis measured"
            );
            Ok(AnalysisResult { measurements })
        })
        .await
    }

    /// Reads each requested version's task-queue statistics (backlog, its age, add and dispatch
    /// rates), one entry per build in order, versions read concurrently. A version that cannot
    /// be read carries its error (`unknown to Temporal` when Temporal does not know it), never
    /// fails the activity; a TWD that is gone or whose Temporal cannot be reached fails without
    /// retry.
    #[activity(name = "read_backlog")]
    pub async fn read_backlog(
        self: Arc<Self>,
        ctx: ActivityContext,
        request: BacklogRequest,
    ) -> Result<BacklogReport, ActivityError> {
        with_heartbeats(&ctx, async {
            let resolved = self.resolve_or_fail(&request.twd, "BacklogTwdGone").await?;
            let versions = temporal::read_backlog(
                &resolved.temporal,
                &resolved.spec.temporal_namespace,
                &request.twd.key(),
                &request.build_ids,
            )
            .await;
            tracing::debug!(
                twd = %request.twd.key(),
                backlogs = ?versions
                    .iter()
                    .map(|v| (v.build_id.as_str(), v.backlog, v.error.as_deref()))
                    .collect::<Vec<_>>(),
                "backlog read"
            );
            Ok(BacklogReport { versions })
        })
        .await
    }
}

/// A cleanup that waits for Temporal to finish something (no [`CleanupBlock`]).
fn pending(message: String) -> CleanupOutcome {
    CleanupOutcome::Pending {
        message,
        blocked_by: None,
        teardown: None,
    }
}

/// Whether a failed call means Temporal is out of reach with the TWD's settings, or refused
/// its credentials (rather than answering "not yet").
fn out_of_reach(error: &TemporalError) -> Option<CleanupBlock> {
    match error.class() {
        StatusClass::Auth => Some(CleanupBlock::Refused),
        StatusClass::Transient => Some(CleanupBlock::Unreachable),
        _ => None,
    }
}

/// What the deletion path says when it cannot reach Temporal with the TWD's connection
/// (`connection`, e.g. `TemporalConnection demo/dev`) because of `block` (`cause` in the
/// words of the failure), and what is being deleted along with it (`teardown`): what it waits
/// for, what the user can do, and when the TWD is released without the cleanup.
fn cleanup_blocked_message(
    twd: &TwdRef,
    connection: &str,
    cause: &str,
    block: CleanupBlock,
    teardown: Option<Teardown>,
) -> String {
    let deployment = twd.key();
    if let Some(teardown) = teardown {
        let going = match teardown {
            Teardown::Namespace => format!("namespace {} is being deleted", twd.namespace),
            Teardown::Connection => format!("{connection} is being deleted"),
        };
        let when = match deletion::release_after(Some(block), Some(teardown)) {
            Some(after) if !after.is_zero() => {
                format!("once the cleanup has failed for {}s", after.as_secs())
            }
            _ => "now".to_owned(),
        };
        return format!(
            "Cannot remove worker deployment {deployment} from Temporal through {connection}: \
             {cause}; {going}, so nothing will fix that: the TemporalWorkerDeployment is \
             released without that cleanup {when}, and the worker deployment stays in Temporal"
        );
    }
    let give_up = deletion::release_after(Some(block), None)
        .map(|after| format!("after {}h", after.as_secs() / 3600))
        .unwrap_or_default();
    let delete_instead = format!(
        "or delete {connection} to release the TemporalWorkerDeployment without that cleanup \
         (worker deployment {deployment} then stays in Temporal)"
    );
    match block {
        CleanupBlock::ConnectionGone => format!(
            "Waiting for {connection} (not found) to remove worker deployment {deployment} from \
             Temporal: recreate the connection to let the cleanup finish; otherwise the \
             TemporalWorkerDeployment is released without that cleanup {give_up} and worker \
             deployment {deployment} stays in Temporal"
        ),
        CleanupBlock::SecretGone => format!(
            "Waiting for the credentials of {connection} to remove worker deployment \
             {deployment} from Temporal: {cause}. Restore the Secret to let the cleanup finish; \
             otherwise the TemporalWorkerDeployment is released without that cleanup {give_up} \
             and worker deployment {deployment} stays in Temporal"
        ),
        CleanupBlock::Unreachable => format!(
            "Waiting to remove worker deployment {deployment} from Temporal: {cause}. Fix \
             {connection} (its hostPort, TLS settings, or the server it names) to let the \
             cleanup finish, {delete_instead}"
        ),
        CleanupBlock::Refused => format!(
            "Waiting to remove worker deployment {deployment} from Temporal, which refuses the \
             credentials of {connection}: {cause}. Fix the credentials to let the cleanup \
             finish, {delete_instead}"
        ),
    }
}

/// What `release_without_temporal` left in the workers' Temporal.
struct LeftInTemporal {
    deployment_name: String,
    temporal_namespace: String,
    /// `hostPort` of the connection, when it still exists.
    address: Option<String>,
    /// Build IDs the TWD's status knew, with their role.
    versions: Vec<(String, &'static str)>,
    /// Manager identity the controller claimed on the worker deployment.
    identity: String,
}

impl LeftInTemporal {
    /// The worker deployment, where it is, its known versions and the commands that remove it.
    fn describe(&self) -> String {
        let Self {
            deployment_name,
            temporal_namespace,
            address,
            versions,
            identity,
        } = self;
        let address = address.as_deref().unwrap_or("<address of your Temporal>");
        let versions = if versions.is_empty() {
            "no version known to the TemporalWorkerDeployment's status (`temporal worker \
             deployment describe` lists them)"
                .to_owned()
        } else {
            let list: Vec<String> = versions
                .iter()
                .map(|(build, role)| format!("{build} ({role})"))
                .collect();
            format!("versions {}", list.join(", "))
        };
        format!(
            "Left in Temporal: worker deployment {deployment_name} in namespace \
             {temporal_namespace} at {address}, with {versions}. To remove it by hand, with \
             `--address {address} --namespace {temporal_namespace} --identity {identity}` on each \
             command: `temporal worker deployment set-current-version --deployment-name \
             {deployment_name} --unversioned --yes`, then for each version `temporal worker \
             deployment delete-version --deployment-name {deployment_name} --build-id <build ID> \
             --skip-drainage`, then `temporal worker deployment delete --name {deployment_name}`"
        )
    }
}

/// The versions a TWD's status names, each once: current, target, deprecated.
fn known_versions(status: Option<&TemporalWorkerDeploymentStatus>) -> Vec<(String, &'static str)> {
    let Some(status) = status else {
        return Vec::new();
    };
    let current = status
        .current_version
        .iter()
        .map(|v| (v.build_id.clone(), "current"));
    let target = status
        .target_version
        .iter()
        .map(|t| (t.version.build_id.clone(), "target"));
    let deprecated = status
        .deprecated_versions
        .iter()
        .map(|d| (d.version.build_id.clone(), "deprecated"));
    let mut versions: Vec<(String, &'static str)> = Vec::new();
    for (build, role) in current.chain(target).chain(deprecated) {
        if !build.is_empty() && !versions.iter().any(|(b, _)| *b == build) {
            versions.push((build, role));
        }
    }
    versions
}

/// Whether `temporal` lists `build_id` as a registered version (as the rollout's planner reads
/// it: listed, in a state other than NotRegistered).
fn registered_in(
    temporal: &Result<TemporalState, Blocked>,
    build_id: &str,
) -> Result<bool, Blocked> {
    match temporal {
        Ok(state) => Ok(state
            .version(build_id)
            .is_some_and(|v| v.state != VersionState::NotRegistered)),
        Err(blocked) => Err(blocked.clone()),
    }
}

fn not_ready(blocked: Option<Blocked>, problem: Option<String>) -> PollerWaitOutcome {
    PollerWaitOutcome {
        registered: false,
        available: false,
        problem,
        blocked,
        observation: None,
    }
}

fn gone(twd: &TwdRef) -> Blocked {
    Blocked {
        reason: BlockReason::PlanExecutionFailed,
        message: format!("TemporalWorkerDeployment {} is gone", twd.key()),
    }
}

/// Runs `work`, heartbeating every [`HEARTBEAT_INTERVAL`] until it ends. The first heartbeat
/// comes after one interval, so the many activities that end sooner cost no heartbeat call.
async fn with_heartbeats<T>(
    ctx: &ActivityContext,
    work: impl Future<Output = Result<T, ActivityError>>,
) -> Result<T, ActivityError> {
    #[cfg(feature = "test-hooks")]
    let work = test_hooks::held(ctx, work);
    alongside_every(HEARTBEAT_INTERVAL, || heartbeat(ctx), work).await
}

/// Fault injection for the end-to-end tests, compiled only with the `test-hooks` feature (which
/// `make test` builds with, and the release build and image do not).
#[cfg(feature = "test-hooks")]
mod test_hooks {
    use std::time::Duration;

    use temporalio_sdk::activities::ActivityContext;

    /// A comma-separated list of activity types whose first attempt is held for [`HOLD`]
    /// (heartbeating) before it runs, so a test can kill the controller while such an activity
    /// is in flight.
    const HOLD_VAR: &str = "TWC_TEST_HOLD_ACTIVITIES";
    /// How long [`HOLD_VAR`] holds a first attempt.
    const HOLD: Duration = Duration::from_secs(60);

    /// `work`, after the hold [`HOLD_VAR`] asks for this attempt.
    pub(super) async fn held<T>(ctx: &ActivityContext, work: impl Future<Output = T>) -> T {
        if let Some(hold) = hold(&ctx.info().activity_type, ctx.info().attempt) {
            tracing::warn!(activity = %ctx.info().activity_type, "holding the first attempt ({HOLD_VAR})");
            tokio::time::sleep(hold).await;
        }
        work.await
    }

    fn hold(activity_type: &str, attempt: u32) -> Option<Duration> {
        static HELD: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
        let held = HELD.get_or_init(|| {
            std::env::var(HOLD_VAR)
                .unwrap_or_default()
                .split(',')
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect()
        });
        (attempt <= 1 && held.iter().any(|h| h == activity_type)).then_some(HOLD)
    }
}

/// Runs `work`, calling `beat` every `interval` (the first after one interval) until `work`
/// ends.
async fn alongside_every<T, B>(
    interval: Duration,
    beat: impl Fn() -> B,
    work: impl Future<Output = T>,
) -> T
where
    B: Future<Output = ()>,
{
    let beats = async {
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            beat().await;
        }
    };
    tokio::select! {
        result = work => result,
        never = beats => never,
    }
}

async fn heartbeat(ctx: &ActivityContext) {
    if let Err(e) = ctx.record_heartbeat(()).await {
        tracing::debug!("heartbeat not recorded: {e}");
    }
}

/// A failure retrying cannot fix: the workflow gets it at once, with `type_name`.
fn not_retryable(type_name: &str, message: String) -> ActivityError {
    ActivityError::application(
        temporalio_sdk::ApplicationFailure::builder(message)
            .type_name(type_name.to_owned())
            .non_retryable(true)
            .build(),
    )
}

/// A transient failure: Temporal retries the activity.
fn retryable(error: impl std::error::Error + Send + Sync + 'static) -> ActivityError {
    ActivityError::from(anyhow::Error::new(error))
}

fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Whether `change` would route new work to a build the TWD no longer targets (or the TWD is
/// being deleted). Clearing a ramp is never stale.
fn routes_a_stale_build(change: &RoutingChange, spec: &SpecView) -> bool {
    match change {
        RoutingChange::SetCurrent { build_id } | RoutingChange::SetRamping { build_id, .. } => {
            spec.deleting || spec.target_build_id != *build_id
        }
        RoutingChange::ClearRamp => false,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    fn twd() -> TwdRef {
        TwdRef {
            namespace: "demo".into(),
            name: "hello".into(),
        }
    }

    #[test]
    fn routing_is_written_only_for_the_build_the_twd_targets() {
        let mut resource = twc_crds::TemporalWorkerDeployment {
            metadata: kube::api::ObjectMeta {
                namespace: Some("demo".into()),
                name: Some("hello".into()),
                generation: Some(3),
                ..Default::default()
            },
            spec: twc_crds::worker_deployment::test_support::spec_with_image("w:v3"),
            status: None,
        };
        let spec = spec_view(&resource);
        let target = spec.target_build_id.clone();
        let current = |build_id: &str| RoutingChange::SetCurrent {
            build_id: build_id.into(),
        };
        let ramp = |build_id: &str| RoutingChange::SetRamping {
            build_id: build_id.into(),
            percentage: 10,
        };
        assert!(!routes_a_stale_build(&current(&target), &spec));
        assert!(!routes_a_stale_build(&ramp(&target), &spec));
        // A rollout of v2 superseded by v3 while its write was retried.
        assert!(routes_a_stale_build(&current("v2-5d8c"), &spec));
        assert!(routes_a_stale_build(&ramp("v2-5d8c"), &spec));
        assert!(!routes_a_stale_build(&RoutingChange::ClearRamp, &spec));
        resource.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
        );
        let deleting = spec_view(&resource);
        assert!(routes_a_stale_build(&current(&target), &deleting));
    }

    #[tokio::test(start_paused = true)]
    async fn work_is_accompanied_by_a_heartbeat_every_second() {
        let beats = AtomicU32::new(0);
        let started = tokio::time::Instant::now();
        let work = async {
            tokio::time::sleep(Duration::from_millis(4_500)).await;
            "done"
        };
        let beat = || async {
            beats.fetch_add(1, Ordering::Relaxed);
        };
        let result = alongside_every(HEARTBEAT_INTERVAL, beat, work).await;
        assert_eq!(result, "done");
        assert_eq!(started.elapsed(), Duration::from_millis(4_500));
        // At 1, 2, 3 and 4 s; none after the work ended.
        assert_eq!(beats.load(Ordering::Relaxed), 4);

        // Work that ends within the first interval costs no heartbeat.
        let quick = async { tokio::time::sleep(Duration::from_millis(300)).await };
        alongside_every(HEARTBEAT_INTERVAL, beat, quick).await;
        assert_eq!(beats.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn a_blocked_cleanup_says_what_it_waits_for_and_what_to_do() {
        use CleanupBlock::*;
        let secret = "Secret demo/cloud-api-key named by TemporalConnection cloud (apiKeySecretRef) not found";
        let unreachable =
            "cannot create a Temporal client for namespace 'default': Connection refused";
        let conn = "TemporalConnection demo/cloud";
        let cases = [
            (
                ConnectionGone,
                "",
                None,
                vec![
                    "Waiting for TemporalConnection demo/cloud (not found)",
                    "worker deployment demo/hello",
                    "recreate the connection",
                    "released without that cleanup after 1h",
                ],
            ),
            (
                SecretGone,
                secret,
                None,
                vec![
                    "Waiting for the credentials of TemporalConnection demo/cloud",
                    "Secret demo/cloud-api-key",
                    "Restore the Secret",
                    "released without that cleanup after 1h",
                ],
            ),
            (
                Unreachable,
                unreachable,
                None,
                vec![
                    "Waiting to remove worker deployment demo/hello from Temporal",
                    "Connection refused",
                    "Fix TemporalConnection demo/cloud (its hostPort",
                    "or delete TemporalConnection demo/cloud to release",
                ],
            ),
            (
                Refused,
                "Temporal refused the API key",
                None,
                vec![
                    "refuses the credentials of TemporalConnection demo/cloud",
                    "Fix the credentials",
                    "or delete TemporalConnection demo/cloud to release",
                ],
            ),
            (
                Unreachable,
                unreachable,
                Some(Teardown::Namespace),
                vec![
                    "Cannot remove worker deployment demo/hello from Temporal through TemporalConnection demo/cloud",
                    "Connection refused",
                    "namespace demo is being deleted",
                    "released without that cleanup once the cleanup has failed for 30s",
                ],
            ),
            (
                Refused,
                "Temporal refused the client certificate",
                Some(Teardown::Connection),
                vec![
                    "TemporalConnection demo/cloud is being deleted",
                    "released without that cleanup once the cleanup has failed for 30s",
                ],
            ),
            (
                SecretGone,
                secret,
                Some(Teardown::Namespace),
                vec![
                    "Secret demo/cloud-api-key",
                    "namespace demo is being deleted",
                    "released without that cleanup now",
                ],
            ),
        ];
        for (block, cause, teardown, expected) in cases {
            let message = cleanup_blocked_message(&twd(), conn, cause, block, teardown);
            for part in expected {
                assert!(
                    message.contains(part),
                    "{block:?} {teardown:?}: {part:?} in {message}"
                );
            }
        }
    }

    #[test]
    fn only_a_temporal_out_of_reach_or_refusing_blocks_the_cleanup() {
        use temporalio_client::tonic::Code;
        let rpc = |code| {
            TemporalError::rpc(
                "DeleteWorkerDeploymentVersion",
                "demo/hello",
                &temporalio_client::tonic::Status::new(code, "m"),
            )
        };
        let cases = [
            (Code::Unavailable, Some(CleanupBlock::Unreachable)),
            (Code::DeadlineExceeded, Some(CleanupBlock::Unreachable)),
            (Code::PermissionDenied, Some(CleanupBlock::Refused)),
            (Code::Unauthenticated, Some(CleanupBlock::Refused)),
            (Code::FailedPrecondition, None),
            (Code::ResourceExhausted, None),
            (Code::NotFound, None),
        ];
        for (code, expected) in cases {
            assert_eq!(out_of_reach(&rpc(code)), expected, "{code:?}");
        }
    }

    #[test]
    fn versions_left_in_temporal_are_the_ones_the_status_names_once_each() {
        let version =
            |build: &str, state: &str| serde_json::json!({ "buildID": build, "status": state });
        let status: TemporalWorkerDeploymentStatus = serde_json::from_value(serde_json::json!({
            "currentVersion": version("v2-b", "Current"),
            "targetVersion": version("v3-c", "Ramping"),
            "deprecatedVersions": [version("v1-a", "Drained"), version("v2-b", "Current")],
        }))
        .expect("a status");
        assert_eq!(
            known_versions(Some(&status)),
            vec![
                ("v2-b".to_owned(), "current"),
                ("v3-c".to_owned(), "target"),
                ("v1-a".to_owned(), "deprecated"),
            ]
        );
        assert!(known_versions(None).is_empty());
    }

    #[test]
    fn what_was_left_in_temporal_comes_with_the_commands_that_remove_it() {
        let left = LeftInTemporal {
            deployment_name: "demo/hello".into(),
            temporal_namespace: "workers".into(),
            address: Some("temporal.example:7233".into()),
            versions: vec![("v2-b".into(), "current"), ("v3-c".into(), "target")],
            identity: "twc".into(),
        };
        let text = left.describe();
        for part in [
            "worker deployment demo/hello in namespace workers at temporal.example:7233",
            "versions v2-b (current), v3-c (target)",
            "--address temporal.example:7233 --namespace workers --identity twc",
            "temporal worker deployment set-current-version --deployment-name demo/hello --unversioned --yes",
            "temporal worker deployment delete-version --deployment-name demo/hello --build-id <build ID> --skip-drainage",
            "temporal worker deployment delete --name demo/hello",
        ] {
            assert!(text.contains(part), "{part:?} in {text}");
        }
        let unknown = LeftInTemporal {
            address: None,
            versions: Vec::new(),
            ..left
        };
        let text = unknown.describe();
        assert!(text.contains("at <address of your Temporal>"), "{text}");
        assert!(text.contains("no version known"), "{text}");
    }
}
