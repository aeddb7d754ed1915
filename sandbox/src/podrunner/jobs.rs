//! Jobs: the runner plays the Job controller and the kubelet for Jobs that carry the
//! `temporal.io/deployment-name` label (the controller's replay checks run as such Jobs).
//!
//! One pod at a time (`completions` and `parallelism` of 1, the only shape emulated): the pod is
//! a Pod object (bound to the sandbox's node, owned by the Job, status written as a kubelet
//! would: `Pending` with the waiting reason while it cannot start, `Running`, then `Succeeded`
//! or `Failed` with the container's exit code and termination message) and a process started
//! like a Deployment's pod (see the module above), never restarted in place. A failed pod
//! counts in `status.failed`; the next pod starts after 1 s, 2 s, 4 s, ... until
//! `spec.backoffLimit` (default 6) failures have been exceeded (`Failed`, reason
//! `BackoffLimitExceeded`). `spec.activeDeadlineSeconds` counts from `status.startTime`: past it
//! the running process is stopped and the Job fails with `DeadlineExceeded`. A pod that cannot
//! start (unmapped image, missing binary or Secret) stays `Pending` with that reason, as a
//! kubelet pulling a missing image would, until the deadline (then `Failed`, still
//! with that waiting state: it never ran). The termination message is the
//! file at the container's `terminationMessagePath` (default `/dev/termination-log`, rewritten to
//! the pod folder like a mount path), at most 4,096 bytes; with `terminationMessagePolicy:
//! FallbackToLogsOnError` a failed container without one gets the last 80 lines of its output
//! (at most 2,048 bytes). Deleting a Job stops its process and deletes its Pods at once (the
//! garbage collector's graceful delete would wait for a kubelet to confirm it). A Job whose pod was running when the runner stopped gets that pod marked
//! `Failed` on the next start (counted as a failure, as a lost node would be).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::{Job, JobCondition, JobStatus};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{info, warn};

use super::DeploymentKey;
use super::launch::{self, Launch, LaunchSettings, PodPlace, Waiting};
use super::names;
use super::supervisor::{self, CrashBackoff, PodProcess, Shared};

/// The node every Job pod is bound to.
pub const NODE_NAME: &str = "twc-sandbox";
/// Label the Job controller puts on a Job's pods.
pub const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";
/// Failures allowed when a Job does not say (`spec.backoffLimit`).
const DEFAULT_BACKOFF_LIMIT: i32 = 6;
/// A termination message is cut to this many bytes.
const MESSAGE_LIMIT: usize = 4096;
/// Output lines and bytes kept for `FallbackToLogsOnError`.
const FALLBACK_LINES: usize = 80;
const FALLBACK_BYTES: usize = 2048;

/// How a Job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobEnd {
    /// Its pod exited 0.
    Complete,
    /// Too many failures, or past its deadline.
    Failed {
        /// `BackoffLimitExceeded` or `DeadlineExceeded`.
        reason: &'static str,
        /// Human-readable detail.
        message: String,
    },
}

/// What the Job's status is computed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobProgress {
    /// `status.startTime`.
    pub started: Timestamp,
    /// Pods that failed.
    pub failed: i32,
    /// Whether a pod is running or waiting to run.
    pub active: bool,
    /// How and when it ended, once it has.
    pub end: Option<(JobEnd, Timestamp)>,
}

/// The Job status a Job controller would write for `progress` (the interim
/// `SuccessCriteriaMet`/`FailureTarget` conditions come with the final one, as the API server
/// requires).
pub fn job_status(progress: &JobProgress) -> JobStatus {
    let condition = |type_: &str, reason: &str, message: &str, at: Timestamp| JobCondition {
        type_: type_.to_owned(),
        status: "True".to_owned(),
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
        last_probe_time: Some(Time(at)),
        last_transition_time: Some(Time(at)),
    };
    let (succeeded, conditions, completion_time) = match &progress.end {
        None => (0, None, None),
        Some((JobEnd::Complete, at)) => {
            let message = "Reached expected number of succeeded pods";
            (
                1,
                Some(vec![
                    condition("SuccessCriteriaMet", "CompletionsReached", message, *at),
                    condition("Complete", "CompletionsReached", message, *at),
                ]),
                Some(Time(*at)),
            )
        }
        Some((JobEnd::Failed { reason, message }, at)) => (
            0,
            Some(vec![
                condition("FailureTarget", reason, message, *at),
                condition("Failed", reason, message, *at),
            ]),
            None,
        ),
    };
    let active = progress.active && progress.end.is_none();
    JobStatus {
        start_time: Some(Time(progress.started)),
        active: Some(i32::from(active)),
        ready: Some(0),
        terminating: Some(0),
        succeeded: Some(succeeded),
        failed: Some(progress.failed),
        completion_time,
        conditions,
        ..Default::default()
    }
}

/// Whether a Job has ended (a `Complete` or `Failed` condition that is true).
pub fn finished(job: &Job) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
        })
}

/// The termination message of a container that ended with `exit_code`: the file it wrote, or,
/// under `FallbackToLogsOnError` when it failed without one, the tail of `output`.
pub fn termination_message(
    written: &str,
    output: &str,
    exit_code: i32,
    fallback_to_logs: bool,
) -> String {
    if !written.trim().is_empty() || !fallback_to_logs || exit_code == 0 {
        return cut(written, MESSAGE_LIMIT).to_owned();
    }
    let lines: Vec<&str> = output.lines().collect();
    let tail = lines[lines.len().saturating_sub(FALLBACK_LINES)..].join("\n");
    let start = tail.len().saturating_sub(FALLBACK_BYTES);
    let mut start = start;
    while !tail.is_char_boundary(start) {
        start += 1;
    }
    tail[start..].to_owned()
}

fn cut(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The Jobs being run.
pub struct JobRunner {
    shared: Arc<Shared>,
    work_dir: PathBuf,
    /// Stop switches of the Job tasks, by Job (with its uid).
    running: BTreeMap<DeploymentKey, (String, watch::Sender<bool>)>,
    /// Jobs whose task ended (by uid): a watch event older than the task's last status write
    /// must not run them again.
    done: BTreeMap<DeploymentKey, String>,
    /// The Job tasks; each ends with its Job's key and uid.
    pub tasks: JoinSet<(DeploymentKey, String)>,
}

impl JobRunner {
    /// A runner with no Jobs yet; pod folders and logs go under `work_dir/<ns>/<job>/`.
    pub fn new(shared: Arc<Shared>, work_dir: PathBuf) -> Self {
        Self {
            shared,
            work_dir,
            running: BTreeMap::new(),
            done: BTreeMap::new(),
            tasks: JoinSet::new(),
        }
    }

    /// Applies one watch event.
    pub fn handle(&mut self, event: watcher::Event<Job>) {
        match event {
            watcher::Event::Apply(job) | watcher::Event::InitApply(job) => self.apply(job),
            watcher::Event::Delete(job) => {
                if let Some(key) = key_of(&job) {
                    self.stop(&key, "deleted");
                    self.done.remove(&key);
                    let delete = delete_pods(self.shared.client.clone(), key.clone());
                    self.tasks.spawn(delete.tagged(key, String::new()));
                }
            }
            watcher::Event::Init | watcher::Event::InitDone => {}
        }
    }

    /// A task ended: its Job is done (unless another Job of that name runs by now).
    pub fn ended(&mut self, key: DeploymentKey, uid: String) {
        if uid.is_empty() {
            return;
        }
        if self
            .running
            .get(&key)
            .is_some_and(|(running, _)| *running == uid)
        {
            self.running.remove(&key);
        }
        self.done.insert(key, uid);
    }

    fn apply(&mut self, job: Job) {
        let Some(key) = key_of(&job) else {
            return;
        };
        let uid = job.uid().unwrap_or_default();
        if job.metadata.deletion_timestamp.is_some() {
            // Foreground deletion waits for the pods, which only the runner removes at once.
            if self.running.contains_key(&key) || self.done.contains_key(&key) {
                self.stop(&key, "being deleted");
                self.done.remove(&key);
                let delete = delete_pods(self.shared.client.clone(), key.clone());
                self.tasks.spawn(delete.tagged(key, String::new()));
            }
            return;
        }
        if finished(&job) || self.done.get(&key) == Some(&uid) {
            return;
        }
        if let Some((running_uid, _)) = self.running.get(&key) {
            if *running_uid == uid {
                return;
            }
            // Deleted and created again under the same name.
            self.stop(&key, "replaced");
        }
        info!(job = %key, "running job");
        let (stop, stopped) = watch::channel(false);
        self.running.insert(key.clone(), (uid.clone(), stop));
        let task = JobTask {
            shared: self.shared.clone(),
            folder: self.work_dir.join(&key.namespace).join(&key.name),
            key: key.clone(),
            job,
            stop: stopped,
        };
        self.tasks.spawn(task.run().tagged(key, uid));
    }

    fn stop(&mut self, key: &DeploymentKey, why: &str) {
        if let Some((_, stop)) = self.running.remove(key) {
            info!(job = %key, "job {why}; stopping its pod");
            stop.send_replace(true);
        }
    }

    /// Stops every Job's pod and waits for the tasks.
    pub async fn shutdown(mut self) {
        for (_, stop) in self.running.values() {
            stop.send_replace(true);
        }
        let wait_all = async { while self.tasks.join_next().await.is_some() {} };
        if tokio::time::timeout(supervisor::STOP_GRACE * 2, wait_all)
            .await
            .is_err()
        {
            self.tasks.shutdown().await;
        }
    }
}

/// Tags a task's end with its Job's key and uid.
trait Tagged: std::future::Future<Output = ()> + Sized {
    fn tagged(
        self,
        key: DeploymentKey,
        uid: String,
    ) -> impl std::future::Future<Output = (DeploymentKey, String)> {
        async move {
            self.await;
            (key, uid)
        }
    }
}

impl<F: std::future::Future<Output = ()>> Tagged for F {}

fn key_of(job: &Job) -> Option<DeploymentKey> {
    Some(DeploymentKey {
        namespace: job.metadata.namespace.clone()?,
        name: job.metadata.name.clone()?,
    })
}

/// Deletes the Pods of a deleted Job with no grace period, as a kubelet confirms a pod's end
/// (the garbage collector's graceful delete leaves them terminating otherwise).
async fn delete_pods(client: kube::Client, key: DeploymentKey) {
    let pods: Api<Pod> = Api::namespaced(client, &key.namespace);
    let selector = ListParams::default().labels(&format!("{JOB_NAME_LABEL}={}", key.name));
    // As a kubelet confirms a pod's end: at once (a graceful delete would wait for it).
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::background()
    };
    if let Err(e) = pods.delete_collection(&params, &selector).await {
        warn!(job = %key, "cannot delete the pods of a deleted job: {e}");
    }
}

/// How one pod of a Job ended.
enum PodEnd {
    /// Its process exited (or was killed) with this code.
    Exited { code: i32 },
    /// The Job's deadline passed first.
    Deadline,
    /// The Job was deleted or the runner stops.
    Stopped,
}

struct JobTask {
    shared: Arc<Shared>,
    folder: PathBuf,
    key: DeploymentKey,
    job: Job,
    stop: watch::Receiver<bool>,
}

impl JobTask {
    async fn run(mut self) {
        let status = self.job.status.clone().unwrap_or_default();
        let mut progress = JobProgress {
            started: status
                .start_time
                .map(|t| t.0)
                .unwrap_or_else(Timestamp::now),
            failed: status.failed.unwrap_or(0),
            active: true,
            end: None,
        };
        progress.failed += self.fail_orphaned_pods().await;
        let spec = self.job.spec.clone().unwrap_or_default();
        let backoff_limit = spec.backoff_limit.unwrap_or(DEFAULT_BACKOFF_LIMIT);
        let deadline = spec
            .active_deadline_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map(|s| {
                let elapsed = Timestamp::now()
                    .duration_since(progress.started)
                    .unsigned_abs();
                tokio::time::Instant::now() + Duration::from_secs(s).saturating_sub(elapsed)
            });
        let template = Arc::new(spec.template);
        let mut backoff = CrashBackoff::default();
        loop {
            if progress.failed > backoff_limit {
                let message = format!(
                    "Job has reached the specified backoff limit ({backoff_limit} failures)"
                );
                self.end(&mut progress, "BackoffLimitExceeded", message)
                    .await;
                return;
            }
            self.write_status(&progress).await;
            match self.run_pod(&template, deadline).await {
                PodEnd::Stopped => return,
                PodEnd::Deadline => {
                    let message = "Job was active longer than specified deadline".to_owned();
                    self.end(&mut progress, "DeadlineExceeded", message).await;
                    return;
                }
                PodEnd::Exited { code: 0 } => {
                    progress.end = Some((JobEnd::Complete, Timestamp::now()));
                    self.write_status(&progress).await;
                    info!(job = %self.key, "job complete");
                    return;
                }
                PodEnd::Exited { code } => {
                    progress.failed += 1;
                    warn!(job = %self.key, code, failed = progress.failed, "job pod failed");
                    self.write_status(&progress).await;
                    let delay = backoff.next_delay();
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        () = self.stopped() => return,
                    }
                }
            }
        }
    }

    async fn end(&mut self, progress: &mut JobProgress, reason: &'static str, message: String) {
        warn!(job = %self.key, reason, "job failed: {message}");
        progress.end = Some((JobEnd::Failed { reason, message }, Timestamp::now()));
        self.write_status(progress).await;
    }

    /// Resolves once the Job is deleted or the runner stops.
    async fn stopped(&mut self) {
        while !*self.stop.borrow() {
            if self.stop.changed().await.is_err() {
                return;
            }
        }
    }

    /// Marks `Failed` the Job's pods left `Pending` or `Running` by an earlier runner; returns
    /// how many.
    async fn fail_orphaned_pods(&self) -> i32 {
        let pods: Api<Pod> = Api::namespaced(self.shared.client.clone(), &self.key.namespace);
        let selector = ListParams::default().labels(&format!("{JOB_NAME_LABEL}={}", self.key.name));
        let Ok(list) = pods.list(&selector).await else {
            return 0;
        };
        let mut failed = 0;
        for pod in list.items {
            let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
            if matches!(phase.as_deref(), Some("Succeeded" | "Failed")) {
                continue;
            }
            let body = json!({ "status": {
                "phase": "Failed",
                "reason": "NodeLost",
                "message": "the pod runner restarted while this pod ran",
            }});
            if pods
                .patch_status(
                    &pod.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&body),
                )
                .await
                .is_ok()
            {
                failed += 1;
            }
        }
        failed
    }

    /// Creates a pod, runs its process once, and records how it ended.
    async fn run_pod(
        &mut self,
        template: &Arc<PodTemplateSpec>,
        deadline: Option<tokio::time::Instant>,
    ) -> PodEnd {
        let past_deadline = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(past_deadline);
        let name = names::pod_name(&self.key.name, |_| false);
        let place = PodPlace {
            namespace: self.key.namespace.clone(),
            name: name.clone(),
            dir: self.folder.join(&name),
            log: self.folder.join(format!("{name}.log")),
        };
        let pods: Api<Pod> = Api::namespaced(self.shared.client.clone(), &self.key.namespace);
        let container = launch::main_container(template)
            .cloned()
            .unwrap_or_default();
        if let Err(e) = pods
            .create(&PostParams::default(), &self.pod_object(&name, template))
            .await
        {
            warn!(job = %self.key, pod = %name, "cannot create the pod object: {e}");
        }
        let pod = PodWriter {
            api: pods,
            name: name.clone(),
            container: container.name.clone(),
            image: container.image.clone().unwrap_or_default(),
        };
        // Prepare until it can start (or the deadline passes, or the Job goes).
        let mut backoff = CrashBackoff::default();
        let mut last_waiting: Option<Waiting> = None;
        let launch = loop {
            let settings = LaunchSettings {
                client: &self.shared.client,
                images: &self.shared.images,
                bin_dirs: &self.shared.bin_dirs,
                metrics_sd_dir: self.shared.metrics_sd_dir.as_deref(),
            };
            let prepared = match launch::prepare(&settings, template, &place).await {
                Ok(launch) => launch
                    .command()
                    .map(|command| (launch, command))
                    .map_err(|e| Waiting::new("RunContainerError", e.to_string())),
                Err(waiting) => Err(waiting),
            };
            let waiting = match prepared {
                Ok((launch, command)) => match self.shared.spawner.spawn(command).await {
                    Ok(child) => break (launch, PodProcess(child)),
                    Err(e) => Waiting::new(
                        "RunContainerError",
                        format!("cannot start {}: {e}", launch.program.display()),
                    ),
                },
                Err(waiting) => waiting,
            };
            if last_waiting.as_ref() != Some(&waiting) {
                warn!(job = %self.key, pod = %name, reason = waiting.reason, "job pod cannot start: {}", waiting.message);
                pod.waiting(&waiting).await;
            }
            last_waiting = Some(waiting);
            tokio::select! {
                () = tokio::time::sleep(backoff.next_delay()) => {}
                () = &mut past_deadline => {
                    // Never started: no terminated state, as a kubelet reports a pod removed
                    // while its image could not be pulled.
                    if let Some(waiting) = &last_waiting {
                        pod.never_started(waiting).await;
                    }
                    return PodEnd::Deadline;
                }
                () = self.stopped() => return PodEnd::Stopped,
            }
        };
        let (launch, mut process) = launch;
        let started = Timestamp::now();
        info!(job = %self.key, pod = %name, pid = process.0.id().unwrap_or_default(), "job pod started");
        pod.running(started).await;
        enum Why {
            Exited(std::io::Result<std::process::ExitStatus>),
            Deadline,
            Stopped,
        }
        let why = tokio::select! {
            status = process.0.wait() => Why::Exited(status),
            () = &mut past_deadline => Why::Deadline,
            () = self.stopped() => Why::Stopped,
        };
        let (code, reason) = match why {
            Why::Exited(status) => {
                let code = match &status {
                    Ok(s) => exit_code(s),
                    Err(_) => 1,
                };
                (code, if code == 0 { "Completed" } else { "Error" })
            }
            Why::Deadline | Why::Stopped => {
                let how = supervisor::terminate(&mut process).await;
                supervisor::append_log(
                    &launch,
                    &format!("==> {} stopped: {how}\n", Timestamp::now()),
                );
                if matches!(why, Why::Stopped) {
                    return PodEnd::Stopped;
                }
                pod.ended(137, "DeadlineExceeded", "", Some(started)).await;
                return PodEnd::Deadline;
            }
        };
        supervisor::append_log(
            &launch,
            &format!("==> {} exited with code {code}\n", Timestamp::now()),
        );
        let message = read_message(&launch, &place, code, &container).await;
        pod.ended(code, reason, &message, Some(started)).await;
        PodEnd::Exited { code }
    }

    /// The Pod object of a Job pod: the template, bound to the sandbox's node, owned by the Job.
    fn pod_object(&self, name: &str, template: &PodTemplateSpec) -> Pod {
        let mut metadata = template.metadata.clone().unwrap_or_default();
        metadata.name = Some(name.to_owned());
        metadata.namespace = Some(self.key.namespace.clone());
        metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(JOB_NAME_LABEL.to_owned(), self.key.name.clone());
        metadata.owner_references = Some(vec![OwnerReference {
            api_version: Job::api_version(&()).into_owned(),
            kind: Job::kind(&()).into_owned(),
            name: self.key.name.clone(),
            uid: self.job.uid().unwrap_or_default(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]);
        let mut spec = template.spec.clone().unwrap_or_default();
        spec.node_name = Some(NODE_NAME.to_owned());
        spec.automount_service_account_token = Some(false);
        Pod {
            metadata,
            spec: Some(spec),
            status: None,
        }
    }

    async fn write_status(&self, progress: &JobProgress) {
        let api: Api<Job> = Api::namespaced(self.shared.client.clone(), &self.key.namespace);
        let body = json!({ "status": job_status(progress) });
        if let Err(e) = api
            .patch_status(
                &self.key.name,
                &PatchParams::default(),
                &Patch::Merge(&body),
            )
            .await
        {
            warn!(job = %self.key, "cannot write job status: {e}");
        }
    }
}

/// The exit code a container runtime reports: the code, or 128 + the signal.
fn exit_code(status: &std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

/// The pod's termination message (see [`termination_message`]).
async fn read_message(
    launch: &Launch,
    place: &PodPlace,
    code: i32,
    container: &k8s_openapi::api::core::v1::Container,
) -> String {
    let written = tokio::fs::read(&launch.termination_message)
        .await
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let fallback = container.termination_message_policy.as_deref() == Some("FallbackToLogsOnError");
    let output = if fallback && code != 0 && written.trim().is_empty() {
        let log = tokio::fs::read(&place.log).await.unwrap_or_default();
        String::from_utf8_lossy(&log)
            .lines()
            .filter(|l| !l.starts_with("==> "))
            .collect::<Vec<_>>()
            .join("\n")
    } else {
        String::new()
    };
    termination_message(&written, &output, code, fallback)
}

/// Writes one Job pod's status.
struct PodWriter {
    api: Api<Pod>,
    name: String,
    container: String,
    image: String,
}

impl PodWriter {
    async fn write(&self, phase: &str, state: serde_json::Value, ready: bool) {
        let body = json!({ "status": {
            "phase": phase,
            "containerStatuses": [{
                "name": self.container,
                "image": self.image,
                "imageID": "",
                "ready": ready,
                "started": ready,
                "restartCount": 0,
                "state": state,
            }],
        }});
        if let Err(e) = self
            .api
            .patch_status(&self.name, &PatchParams::default(), &Patch::Merge(&body))
            .await
        {
            warn!(pod = %self.name, "cannot write job pod status: {e}");
        }
    }

    async fn waiting(&self, waiting: &Waiting) {
        let state = json!({ "waiting": { "reason": waiting.reason, "message": waiting.message } });
        self.write("Pending", state, false).await;
    }

    async fn never_started(&self, waiting: &Waiting) {
        let state = json!({ "waiting": { "reason": waiting.reason, "message": waiting.message } });
        self.write("Failed", state, false).await;
    }

    async fn running(&self, started: Timestamp) {
        let state = json!({ "running": { "startedAt": Time(started) } });
        self.write("Running", state, true).await;
    }

    async fn ended(&self, code: i32, reason: &str, message: &str, started: Option<Timestamp>) {
        let phase = if code == 0 { "Succeeded" } else { "Failed" };
        let now = Time(Timestamp::now());
        let state = json!({ "terminated": {
            "exitCode": code,
            "reason": reason,
            "message": message,
            "startedAt": started.map(Time),
            "finishedAt": now,
        }});
        self.write(phase, state, false).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).expect("a timestamp")
    }

    fn types(status: &JobStatus) -> Vec<(String, Option<String>)> {
        status
            .conditions
            .iter()
            .flatten()
            .map(|c| (c.type_.clone(), c.reason.clone()))
            .collect()
    }

    #[test]
    fn job_status_follows_the_job_controller() {
        let running = JobProgress {
            started: at(0),
            failed: 2,
            active: true,
            end: None,
        };
        let complete = JobProgress {
            end: Some((JobEnd::Complete, at(30))),
            ..running.clone()
        };
        let failed = JobProgress {
            end: Some((
                JobEnd::Failed {
                    reason: "BackoffLimitExceeded",
                    message: "too many".into(),
                },
                at(40),
            )),
            ..running.clone()
        };
        let s = job_status(&running);
        assert_eq!(
            (s.active, s.succeeded, s.failed, s.completion_time.is_some()),
            (Some(1), Some(0), Some(2), false)
        );
        assert!(types(&s).is_empty());

        let s = job_status(&complete);
        assert_eq!(
            (s.active, s.succeeded, s.completion_time.clone()),
            (Some(0), Some(1), Some(Time(at(30))))
        );
        let reason = Some("CompletionsReached".to_owned());
        assert_eq!(
            types(&s),
            vec![
                ("SuccessCriteriaMet".to_owned(), reason.clone()),
                ("Complete".to_owned(), reason)
            ]
        );

        let s = job_status(&failed);
        assert_eq!(
            (s.active, s.succeeded, s.completion_time.clone()),
            (Some(0), Some(0), None)
        );
        let reason = Some("BackoffLimitExceeded".to_owned());
        assert_eq!(
            types(&s),
            vec![
                ("FailureTarget".to_owned(), reason.clone()),
                ("Failed".to_owned(), reason)
            ]
        );
        assert_eq!(s.start_time, Some(Time(at(0))));
    }

    #[test]
    fn the_termination_message_is_the_file_or_under_fallback_the_output_s_tail() {
        let output: String = (1..=100).map(|n| format!("line {n}\n")).collect();
        for (written, code, fallback, wanted_start, wanted_end) in [
            ("{\"ok\":true}", 0, false, "{\"ok\":true}", "{\"ok\":true}"),
            ("report", 1, true, "report", "report"),
            ("", 1, false, "", ""),
            ("", 0, true, "", ""),
            ("  \n", 1, true, "line 21", "line 100"),
        ] {
            let message = termination_message(written, &output, code, fallback);
            assert!(
                message.starts_with(wanted_start) && message.ends_with(wanted_end),
                "{written:?}, exit {code}, fallback {fallback}: {message:?}"
            );
        }
        let long = "é".repeat(3000);
        let message = termination_message(&long, "", 0, false);
        assert!(message.len() <= MESSAGE_LIMIT && message.chars().all(|c| c == 'é'));
        let noisy: String = (0..80).map(|_| format!("{}\n", "x".repeat(100))).collect();
        assert!(termination_message("", &noisy, 2, true).len() <= FALLBACK_BYTES);
    }

    #[test]
    fn a_job_is_finished_by_a_true_complete_or_failed_condition() {
        let with = |conditions: &[(&str, &str)]| Job {
            status: Some(JobStatus {
                conditions: Some(
                    conditions
                        .iter()
                        .map(|(t, s)| JobCondition {
                            type_: (*t).to_owned(),
                            status: (*s).to_owned(),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(!finished(&Job::default()));
        assert!(!finished(&with(&[("SuccessCriteriaMet", "True")])));
        assert!(!finished(&with(&[("Complete", "False")])));
        assert!(finished(&with(&[("Complete", "True")])));
        assert!(finished(&with(&[
            ("FailureTarget", "True"),
            ("Failed", "True")
        ])));
    }
}
