//! The runner's bookkeeping: one entry per watched Deployment with its pods, reconciled on
//! watch events and on a timer, and its status written back when it changes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher;
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use super::DeploymentKey;
use super::launch::PodPlace;
use super::names;
use super::status::{self, DeploymentView, PodView, Rollout};
use super::supervisor::{self, Phase, PodHandle, Shared};

/// Longest wait for one status write.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Extra time, beyond the stop grace period, that shutdown waits for pod tasks.
const SHUTDOWN_SLACK: Duration = Duration::from_secs(3);

/// One watched Deployment and its pods.
struct Tracked {
    deployment: Deployment,
    template: Arc<PodTemplateSpec>,
    template_json: String,
    desired: i32,
    pods: Vec<PodHandle>,
    rollout: Rollout,
    last_written: Option<DeploymentStatus>,
    write_failing: bool,
}

/// All watched Deployments and the tasks of their pods.
pub struct Runner {
    shared: Arc<Shared>,
    work_dir: PathBuf,
    deployments: BTreeMap<DeploymentKey, Tracked>,
    /// Pod tasks, including those still stopping; dropping the set kills their processes.
    pub tasks: JoinSet<()>,
    relisting: Option<BTreeSet<DeploymentKey>>,
}

impl Runner {
    /// A runner with no Deployments yet; pod folders and logs go under `work_dir`.
    pub fn new(shared: Arc<Shared>, work_dir: PathBuf) -> Self {
        Self {
            shared,
            work_dir,
            deployments: BTreeMap::new(),
            tasks: JoinSet::new(),
            relisting: None,
        }
    }

    /// Applies one watch event.
    pub async fn handle(&mut self, event: watcher::Event<Deployment>) {
        match event {
            watcher::Event::Init => self.relisting = Some(BTreeSet::new()),
            watcher::Event::InitApply(d) => {
                if let (Some(seen), Some(key)) = (self.relisting.as_mut(), DeploymentKey::of(&d)) {
                    seen.insert(key);
                }
                self.apply(d).await;
            }
            watcher::Event::InitDone => {
                if let Some(seen) = self.relisting.take() {
                    let gone: Vec<DeploymentKey> = self
                        .deployments
                        .keys()
                        .filter(|k| !seen.contains(*k))
                        .cloned()
                        .collect();
                    for key in gone {
                        self.remove(&key, "no longer listed");
                    }
                }
            }
            watcher::Event::Apply(d) => self.apply(d).await,
            watcher::Event::Delete(d) => {
                if let Some(key) = DeploymentKey::of(&d) {
                    self.remove(&key, "deleted");
                }
            }
        }
    }

    /// Takes in the latest version of a Deployment and reconciles it.
    async fn apply(&mut self, deployment: Deployment) {
        let Some(key) = DeploymentKey::of(&deployment) else {
            return;
        };
        if deployment.metadata.deletion_timestamp.is_some() {
            self.remove(&key, "being deleted");
            return;
        }
        let spec = deployment.spec.clone().unwrap_or_default();
        let template_json = match serde_json::to_string(&spec.template) {
            Ok(json) => json,
            Err(e) => {
                warn!(deployment = %key, "cannot serialize pod template: {e}");
                return;
            }
        };
        let desired = spec.replicas.unwrap_or(1).max(0);
        let now = Timestamp::now();
        let tracked = self.deployments.entry(key.clone()).or_insert_with(|| {
            info!(deployment = %key, replicas = desired, "tracking deployment");
            Tracked {
                deployment: deployment.clone(),
                template: Arc::new(spec.template.clone()),
                template_json: template_json.clone(),
                desired,
                pods: Vec::new(),
                rollout: Rollout::new(now),
                last_written: None,
                write_failing: false,
            }
        });
        if tracked.template_json != template_json {
            info!(deployment = %key, pods = tracked.pods.len(), "pod template changed; replacing pods");
            for pod in tracked.pods.drain(..) {
                pod.stop();
            }
            tracked.template = Arc::new(spec.template);
            tracked.template_json = template_json;
            tracked.rollout = Rollout::new(now);
        } else if tracked.desired != desired {
            info!(deployment = %key, from = tracked.desired, to = desired, "scaling");
            tracked.rollout = Rollout::new(now);
        }
        tracked.desired = desired;
        tracked.deployment = deployment;
        self.reconcile_pods(&key);
        self.sync_status(&key).await;
    }

    /// Stops every pod of a Deployment and forgets it.
    fn remove(&mut self, key: &DeploymentKey, why: &str) {
        if let Some(tracked) = self.deployments.remove(key) {
            info!(deployment = %key, pods = tracked.pods.len(), "deployment {why}; stopping its pods");
            for pod in &tracked.pods {
                pod.stop();
            }
        }
    }

    /// Starts missing pods and stops surplus ones; replaces pods whose task ended.
    fn reconcile_pods(&mut self, key: &DeploymentKey) {
        let Some(tracked) = self.deployments.get_mut(key) else {
            return;
        };
        tracked.pods.retain(|pod| {
            let ended = pod.state().phase == Phase::Stopped;
            if ended {
                warn!(deployment = %key, pod = %pod.name, "pod task ended unexpectedly; replacing it");
            }
            !ended
        });
        let desired = usize::try_from(tracked.desired).unwrap_or(0);
        while tracked.pods.len() > desired {
            // Like a ReplicaSet: not-ready pods go first, then the newest.
            let victim = tracked
                .pods
                .iter()
                .rposition(|p| {
                    !matches!(
                        p.state().phase,
                        Phase::Running {
                            ready_since: Some(_),
                            ..
                        }
                    )
                })
                .unwrap_or(tracked.pods.len() - 1);
            let pod = tracked.pods.remove(victim);
            info!(deployment = %key, pod = %pod.name, "scale down: stopping pod");
            pod.stop();
        }
        while tracked.pods.len() < desired {
            let name = names::pod_name(&key.name, |n| tracked.pods.iter().any(|p| p.name == n));
            let folder = self.work_dir.join(&key.namespace).join(&key.name);
            let place = PodPlace {
                namespace: key.namespace.clone(),
                name: name.clone(),
                dir: folder.join(&name),
                log: folder.join(format!("{name}.log")),
            };
            info!(deployment = %key, pod = %name, log = %place.log.display(), "starting pod");
            let pod = supervisor::start_pod(
                &mut self.tasks,
                self.shared.clone(),
                key.clone(),
                place,
                tracked.template.clone(),
                tracked.template_json.clone(),
            );
            tracked.pods.push(pod);
        }
    }

    /// Reconciles every Deployment and refreshes its status (called on a timer).
    pub async fn resync(&mut self) {
        let keys: Vec<DeploymentKey> = self.deployments.keys().cloned().collect();
        for key in keys {
            self.reconcile_pods(&key);
            self.sync_status(&key).await;
        }
    }

    /// Computes a Deployment's status and writes it if it changed.
    pub async fn sync_status(&mut self, key: &DeploymentKey) {
        let Some(tracked) = self.deployments.get_mut(key) else {
            return;
        };
        let views: Vec<PodView> = tracked
            .pods
            .iter()
            .map(|p| p.state().view(&p.name, p.template == tracked.template_json))
            .collect();
        let spec = tracked.deployment.spec.as_ref();
        let view = DeploymentView {
            name: key.name.clone(),
            generation: tracked.deployment.metadata.generation,
            desired: tracked.desired,
            min_ready_seconds: spec.and_then(|s| s.min_ready_seconds).unwrap_or(0),
            progress_deadline_seconds: spec
                .and_then(|s| s.progress_deadline_seconds)
                .unwrap_or(status::DEFAULT_PROGRESS_DEADLINE_SECONDS),
        };
        let observed = tracked.deployment.status.as_ref();
        let previous = tracked.last_written.as_ref().or(observed);
        let computed = status::compute(
            &view,
            &views,
            &mut tracked.rollout,
            previous,
            Timestamp::now(),
        );
        if tracked.last_written.as_ref() == Some(&computed) {
            return;
        }
        if tracked.last_written.is_none()
            && observed.is_some_and(|o| status::normalized(o) == status::normalized(&computed))
        {
            tracked.last_written = Some(computed);
            return;
        }
        let api: Api<Deployment> = Api::namespaced(self.shared.client.clone(), &key.namespace);
        let body = serde_json::json!({ "status": computed });
        let (params, patch) = (PatchParams::default(), Patch::Merge(&body));
        let write = api.patch_status(&key.name, &params, &patch);
        let failure = match tokio::time::timeout(WRITE_TIMEOUT, write).await {
            Ok(Ok(_)) => None,
            Ok(Err(kube::Error::Api(e))) if e.code == 404 => {
                debug!(deployment = %key, "deployment gone before its status was written");
                return;
            }
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some(format!("timed out after {}s", WRITE_TIMEOUT.as_secs())),
        };
        match failure {
            None => {
                if tracked.write_failing {
                    info!(deployment = %key, "writing deployment status works again");
                }
                debug!(
                    deployment = %key,
                    ready = computed.ready_replicas,
                    available = computed.available_replicas,
                    "deployment status written"
                );
                tracked.write_failing = false;
                tracked.last_written = Some(computed);
            }
            Some(e) => {
                if !tracked.write_failing {
                    warn!(deployment = %key, "cannot write deployment status (will retry): {e}");
                }
                tracked.write_failing = true;
            }
        }
    }

    /// Stops every pod and waits for their processes to end (killing stragglers).
    pub async fn shutdown(mut self) {
        let pods: usize = self.deployments.values().map(|t| t.pods.len()).sum();
        info!(pods, "pod runner shutting down; stopping all pods");
        for tracked in self.deployments.values() {
            for pod in &tracked.pods {
                pod.stop();
            }
        }
        let wait_all = async {
            while let Some(result) = self.tasks.join_next().await {
                log_task_end(result);
            }
        };
        if tokio::time::timeout(supervisor::STOP_GRACE + SHUTDOWN_SLACK, wait_all)
            .await
            .is_err()
        {
            warn!("pods did not stop in time; killing them");
            self.tasks.shutdown().await;
        }
        self.deployments.clear();
    }
}

/// Logs a pod task that ended by panicking.
pub fn log_task_end(result: Result<(), tokio::task::JoinError>) {
    if let Err(e) = result
        && e.is_panic()
    {
        warn!("a pod task panicked: {e}");
    }
}
