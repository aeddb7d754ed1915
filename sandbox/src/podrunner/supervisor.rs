//! One task per pod: starts its process, restarts it with CrashLoopBackOff-like back-off,
//! tracks readiness, and stops it (SIGTERM, then SIGKILL after a grace period) when asked.

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::jiff::Timestamp;
use tokio::process::Child;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::DeploymentKey;
use super::images::ImageTable;
use super::launch::{self, Launch, LaunchSettings, PodPlace, Waiting};
use super::probe::{self, ExecContext, ReadinessProbe};
use super::spawner::Spawner;
use super::status::PodView;
use super::{sources, volumes};

/// How often a running pod's Secret and ConfigMap volumes are re-read (a kubelet takes up to
/// about a minute; the sandbox is quicker so tests of rotation stay short).
const VOLUME_REFRESH: Duration = Duration::from_secs(2);
/// First restart delay.
const BACKOFF_INITIAL: Duration = Duration::from_secs(1);
/// Longest restart delay.
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A process that ran this long before exiting restarts without accumulated back-off.
const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(60);
/// How long a process runs without exiting before it counts as ready (without a probe).
pub const READY_AFTER: Duration = Duration::from_secs(1);
/// Time between SIGTERM and SIGKILL when stopping a pod.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// Exponential restart delays: 1s, 2s, 4s, ... capped at 30s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrashBackoff {
    next: Duration,
}

impl Default for CrashBackoff {
    fn default() -> Self {
        Self {
            next: BACKOFF_INITIAL,
        }
    }
}

impl CrashBackoff {
    /// The delay before the next attempt; doubles the one after.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        delay
    }

    /// Starts over at the first delay.
    pub fn reset(&mut self) {
        *self = Self::default();
    }
}

/// What a pod is doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// Not started yet.
    Pending,
    /// Cannot start (image, binary, secret...); retried with back-off.
    Waiting(Waiting),
    /// The process runs.
    Running {
        /// Its process id.
        pid: u32,
        /// When it started.
        started: Timestamp,
        /// Since when it is ready, if it is.
        ready_since: Option<Timestamp>,
    },
    /// The process exited and waits for its restart.
    CrashLoopBackOff,
    /// The pod is being stopped.
    Stopping,
    /// The pod task has ended.
    Stopped,
}

/// The observable state of one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodState {
    /// What it is doing.
    pub phase: Phase,
    /// How often its process exited and was (or will be) restarted.
    pub restarts: u32,
    /// How its process last ended, e.g. `process exited with code 1`.
    pub last_exit: Option<String>,
}

impl Default for PodState {
    fn default() -> Self {
        Self {
            phase: Phase::Pending,
            restarts: 0,
            last_exit: None,
        }
    }
}

impl PodState {
    /// Records that the process ended with `status`; it counts as a restart.
    pub fn record_exit(&mut self, status: &str) {
        self.restarts = self.restarts.saturating_add(1);
        self.last_exit = Some(status.to_string());
        self.phase = Phase::CrashLoopBackOff;
    }

    /// The pod as the status computation sees it.
    pub fn view(&self, name: &str, updated: bool) -> PodView {
        let ready_since = match &self.phase {
            Phase::Running { ready_since, .. } => *ready_since,
            _ => None,
        };
        let crash = || {
            self.last_exit
                .as_ref()
                .map(|exit| format!("{exit} (restarted {} times)", self.restarts))
        };
        let problem = match &self.phase {
            Phase::Waiting(w) => Some(w.message.clone()),
            Phase::CrashLoopBackOff => crash(),
            Phase::Running {
                ready_since: None, ..
            } => crash(),
            _ => None,
        };
        PodView {
            name: name.to_string(),
            updated,
            ready_since,
            problem,
        }
    }
}

/// Describes how a process ended, e.g. `process exited with code 1`.
pub fn describe_exit(status: &ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("process exited with code {code}");
    }
    match status.signal() {
        Some(signal) => {
            let name = match signal {
                libc::SIGKILL => " (SIGKILL)",
                libc::SIGTERM => " (SIGTERM)",
                libc::SIGSEGV => " (SIGSEGV)",
                libc::SIGABRT => " (SIGABRT)",
                libc::SIGINT => " (SIGINT)",
                _ => "",
            };
            format!("process was killed by signal {signal}{name}")
        }
        None => format!("process ended: {status}"),
    }
}

/// Runner-wide context shared by all pod tasks.
pub struct Shared {
    /// API client.
    pub client: kube::Client,
    /// Image table.
    pub images: ImageTable,
    /// Folders binaries are looked up in.
    pub bin_dirs: Vec<PathBuf>,
    /// Folder of the processes' Prometheus file_sd target files, if any.
    pub metrics_sd_dir: Option<PathBuf>,
    /// Forks the processes.
    pub spawner: Spawner,
    /// Tells the runner that a pod of a Deployment changed state.
    pub changed: mpsc::UnboundedSender<DeploymentKey>,
}

/// The runner's handle on a pod task.
#[derive(Debug)]
pub struct PodHandle {
    /// The pod name.
    pub name: String,
    /// The `spec.template` (as JSON) the pod runs.
    pub template: String,
    state: Arc<Mutex<PodState>>,
    stop: watch::Sender<bool>,
}

impl PodHandle {
    /// A copy of the pod's current state.
    pub fn state(&self) -> PodState {
        lock(&self.state).clone()
    }

    /// Asks the pod task to stop its process and end.
    pub fn stop(&self) {
        self.stop.send_replace(true);
    }
}

/// Starts a pod task in `tasks`; it runs until [`PodHandle::stop`] or until the handle is dropped.
pub fn start_pod(
    tasks: &mut tokio::task::JoinSet<()>,
    shared: Arc<Shared>,
    key: DeploymentKey,
    place: PodPlace,
    template: Arc<PodTemplateSpec>,
    template_json: String,
) -> PodHandle {
    let state = Arc::new(Mutex::new(PodState::default()));
    let (stop, stopped) = watch::channel(false);
    let pod = PodTask {
        shared,
        key,
        place: place.clone(),
        template,
        state: state.clone(),
        stop: stopped,
    };
    let guard = MarkStoppedOnDrop(state.clone());
    tasks.spawn(async move {
        let _guard = guard;
        pod.run().await;
    });
    PodHandle {
        name: place.name,
        template: template_json,
        state,
        stop,
    }
}

/// Marks a pod `Stopped` when its task ends in any way (also by panic or abort), so the
/// runner replaces a pod whose task died.
struct MarkStoppedOnDrop(Arc<Mutex<PodState>>);

impl Drop for MarkStoppedOnDrop {
    fn drop(&mut self) {
        lock(&self.0).phase = Phase::Stopped;
    }
}

/// Locks a pod state, ignoring poisoning (the state is plain data).
fn lock(state: &Mutex<PodState>) -> MutexGuard<'_, PodState> {
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The state of one pod task.
struct PodTask {
    shared: Arc<Shared>,
    key: DeploymentKey,
    place: PodPlace,
    template: Arc<PodTemplateSpec>,
    state: Arc<Mutex<PodState>>,
    stop: watch::Receiver<bool>,
}

/// How supervision of a running process ended.
enum Outcome {
    /// The process exited by itself.
    Exited(String),
    /// The runner asked the pod to stop.
    StopRequested,
}

/// Kills the process group of a child that was not reaped yet when dropped (e.g. on abort).
pub(crate) struct PodProcess(pub(crate) Child);

impl PodProcess {
    /// Sends `signal` to the pod's process group while its leader is not reaped.
    fn signal(&self, signal: libc::c_int) {
        if let Some(pid) = self.0.id().and_then(|pid| libc::pid_t::try_from(pid).ok()) {
            // SAFETY: plain syscall; the group id is the pid of our unreaped child (it was
            // spawned with process_group(0)), so it cannot name anyone else's group.
            unsafe {
                libc::killpg(pid, signal);
            }
        }
    }
}

impl Drop for PodProcess {
    fn drop(&mut self) {
        self.signal(libc::SIGKILL);
    }
}

impl PodTask {
    /// The task body.
    async fn run(self) {
        let mut backoff = CrashBackoff::default();
        let mut last_waiting: Option<Waiting> = None;
        while !*self.stop.borrow() {
            let settings = LaunchSettings {
                client: &self.shared.client,
                images: &self.shared.images,
                bin_dirs: &self.shared.bin_dirs,
                metrics_sd_dir: self.shared.metrics_sd_dir.as_deref(),
            };
            let prepared = tokio::select! {
                prepared = launch::prepare(&settings, &self.template, &self.place) => prepared,
                () = self.stop_requested() => break,
            };
            let started = match prepared {
                Ok(launch) => self.spawn(launch).await,
                Err(waiting) => Err(waiting),
            };
            let (process, launch) = match started {
                Ok(started) => started,
                Err(waiting) => {
                    if last_waiting.as_ref() != Some(&waiting) {
                        warn!(pod = %self.place.name, deployment = %self.key, reason = waiting.reason, "pod cannot start: {}", waiting.message);
                    }
                    last_waiting = Some(waiting.clone());
                    self.set(|s| s.phase = Phase::Waiting(waiting));
                    if self.sleep_unless_stopped(backoff.next_delay()).await {
                        break;
                    }
                    continue;
                }
            };
            last_waiting = None;
            let began = Instant::now();
            let pid = process.0.id();
            let outcome = self.supervise(process, &launch).await;
            self.remove_metrics_target(pid).await;
            match outcome {
                Outcome::StopRequested => break,
                Outcome::Exited(how) => {
                    if began.elapsed() >= BACKOFF_RESET_AFTER {
                        backoff.reset();
                    }
                    let delay = backoff.next_delay();
                    append_log(&launch, &format!("==> {} {how}\n", Timestamp::now()));
                    self.set(|s| s.record_exit(&how));
                    let restarts = self.state().restarts;
                    warn!(pod = %self.place.name, deployment = %self.key, restarts, "pod {how}; restarting in {}s", delay.as_secs());
                    if self.sleep_unless_stopped(delay).await {
                        break;
                    }
                }
            }
        }
        self.set(|s| s.phase = Phase::Stopping);
        if let Err(e) = tokio::fs::remove_dir_all(&self.place.dir).await
            && e.kind() != std::io::ErrorKind::NotFound
        {
            warn!(pod = %self.place.name, "cannot remove pod folder {}: {e}", self.place.dir.display());
        }
        self.set(|s| s.phase = Phase::Stopped);
    }

    /// Removes the file_sd target file of the ended process `pid`, which a process that did not
    /// exit cleanly leaves behind (Prometheus would keep scraping a dead port).
    async fn remove_metrics_target(&self, pid: Option<u32>) {
        let (Some(dir), Some(pid)) = (&self.shared.metrics_sd_dir, pid) else {
            return;
        };
        let file = super::metrics_target_file(dir, &self.place.name, pid);
        match tokio::fs::remove_file(&file).await {
            Ok(()) => debug!(pod = %self.place.name, "removed metrics target {}", file.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                warn!(pod = %self.place.name, "cannot remove metrics target {}: {e}", file.display())
            }
        }
    }

    /// Spawns the prepared process.
    async fn spawn(&self, launch: Launch) -> Result<(PodProcess, Launch), Waiting> {
        let run_error = |e: std::io::Error| {
            Waiting::new(
                "RunContainerError",
                format!("cannot start {}: {e}", launch.program.display()),
            )
        };
        let command = launch.command().map_err(run_error)?;
        let child = self
            .shared
            .spawner
            .spawn(command)
            .await
            .map_err(run_error)?;
        let pid = child.id().unwrap_or_default();
        info!(pod = %self.place.name, deployment = %self.key, pid, program = %launch.program.display(), "pod started");
        if let Some(problem) = &launch.probe_problem {
            warn!(pod = %self.place.name, "readiness probe ignored ({problem}); ready after {}s of running", READY_AFTER.as_secs());
        }
        self.set(|s| {
            s.phase = Phase::Running {
                pid,
                started: Timestamp::now(),
                ready_since: None,
            }
        });
        Ok((PodProcess(child), launch))
    }

    /// Waits for the process to exit or for a stop request, tracking readiness meanwhile.
    async fn supervise(&self, mut process: PodProcess, launch: &Launch) -> Outcome {
        let exec_ctx = ExecContext {
            env: launch.env.clone(),
            cwd: launch.cwd.clone(),
        };
        let stop_requested = self.stop_requested();
        let outcome = {
            let readiness = self.track_readiness(launch.probe.as_ref(), &exec_ctx);
            let volumes = self.follow_volumes(launch);
            tokio::select! {
                status = process.0.wait() => Outcome::Exited(match status {
                    Ok(status) => describe_exit(&status),
                    Err(e) => format!("process could not be waited for: {e}"),
                }),
                () = stop_requested => Outcome::StopRequested,
                () = readiness => Outcome::StopRequested,
                () = volumes => Outcome::StopRequested,
            }
        };
        if let Outcome::StopRequested = outcome {
            self.set(|s| s.phase = Phase::Stopping);
            let how = terminate(&mut process).await;
            info!(pod = %self.place.name, deployment = %self.key, "pod stopped ({how})");
            append_log(
                launch,
                &format!("==> {} stopped: {how}\n", Timestamp::now()),
            );
        }
        outcome
    }

    /// Re-reads the Secrets and ConfigMaps of the pod's volumes every [`VOLUME_REFRESH`] and
    /// replaces the files that changed, as a kubelet does (so a rotated key reaches a running
    /// process); never returns.
    async fn follow_volumes(&self, launch: &Launch) {
        let refs = volumes::sources_of(&launch.mounts);
        if refs.is_empty() {
            return std::future::pending().await;
        }
        let mut ticks = tokio::time::interval(VOLUME_REFRESH);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            ticks.tick().await;
            let sources =
                match sources::fetch(&self.shared.client, &self.place.namespace, &refs).await {
                    Ok(sources) => sources,
                    Err(e) => {
                        debug!(pod = %self.place.name, "volume sources not re-read: {e}");
                        continue;
                    }
                };
            let (dir, mounts) = (launch.dir.clone(), launch.mounts.clone());
            let written =
                tokio::task::spawn_blocking(move || volumes::materialize(&dir, &mounts, &sources))
                    .await;
            match written {
                Ok(Ok(())) => {}
                Ok(Err(e)) => warn!(pod = %self.place.name, "volume not refreshed: {e}"),
                Err(e) => warn!(pod = %self.place.name, "volume refresh task failed: {e}"),
            }
        }
    }

    /// Marks the pod ready after [`READY_AFTER`] or by its probe; never returns.
    async fn track_readiness(&self, probe: Option<&ReadinessProbe>, exec_ctx: &ExecContext) {
        let set_ready = |ready: bool| {
            self.set(|s| {
                if let Phase::Running { ready_since, .. } = &mut s.phase {
                    *ready_since = match (ready, *ready_since) {
                        (true, None) => Some(Timestamp::now()),
                        (true, since) => since,
                        (false, _) => None,
                    };
                }
            })
        };
        let Some(probe) = probe else {
            tokio::time::sleep(READY_AFTER).await;
            set_ready(true);
            return std::future::pending().await;
        };
        tokio::time::sleep(probe.initial_delay).await;
        let (mut successes, mut failures, mut ready) = (0u32, 0u32, false);
        loop {
            if probe::check(&probe.action, probe.timeout, &self.shared.spawner, exec_ctx).await {
                successes = successes.saturating_add(1);
                failures = 0;
                if !ready && successes >= probe.success_threshold {
                    ready = true;
                    set_ready(true);
                }
            } else {
                failures = failures.saturating_add(1);
                successes = 0;
                if ready && failures >= probe.failure_threshold {
                    ready = false;
                    debug!(pod = %self.place.name, "readiness probe failed {failures} times");
                    set_ready(false);
                }
            }
            tokio::time::sleep(probe.period).await;
        }
    }

    /// Sleeps for `delay`; `true` if a stop was requested meanwhile.
    async fn sleep_unless_stopped(&self, delay: Duration) -> bool {
        let stop_requested = self.stop_requested();
        tokio::select! {
            () = tokio::time::sleep(delay) => *self.stop.borrow(),
            () = stop_requested => true,
        }
    }

    /// Completes when the runner asks the pod to stop (or dropped its handle).
    fn stop_requested(&self) -> impl Future<Output = ()> + use<> {
        let mut stop = self.stop.clone();
        async move {
            // An error means the runner dropped the handle: that is a stop too.
            let _ = stop.wait_for(|s| *s).await;
        }
    }

    /// Changes the pod state and tells the runner (only if it changed).
    fn set(&self, change: impl FnOnce(&mut PodState)) {
        let changed = {
            let mut state = lock(&self.state);
            let before = state.clone();
            change(&mut state);
            *state != before
        };
        if changed {
            let _ = self.shared.changed.send(self.key.clone());
        }
    }

    /// A copy of the pod state.
    fn state(&self) -> PodState {
        lock(&self.state).clone()
    }
}

/// Stops a pod's process group: SIGTERM, then SIGKILL after [`STOP_GRACE`].
pub(crate) async fn terminate(process: &mut PodProcess) -> String {
    if let Ok(Some(status)) = process.0.try_wait() {
        return describe_exit(&status);
    }
    process.signal(libc::SIGTERM);
    if let Ok(Ok(status)) = tokio::time::timeout(STOP_GRACE, process.0.wait()).await {
        return describe_exit(&status);
    }
    process.signal(libc::SIGKILL);
    match process.0.wait().await {
        Ok(status) => format!(
            "{} after {}s grace",
            describe_exit(&status),
            STOP_GRACE.as_secs()
        ),
        Err(e) => format!("could not be waited for: {e}"),
    }
}

/// Appends a marker line to the pod log (best effort).
pub(crate) fn append_log(launch: &Launch, line: &str) {
    use std::io::Write;
    let mut log = &launch.log;
    if let Err(e) = log.write_all(line.as_bytes()) {
        debug!("cannot write pod log marker: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restart_delays_double_up_to_thirty_seconds() {
        let mut b = CrashBackoff::default();
        let delays: Vec<u64> = (0..7).map(|_| b.next_delay().as_secs()).collect();
        assert_eq!(delays, vec![1, 2, 4, 8, 16, 30, 30]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_secs(1));
    }

    #[test]
    fn crashed_process_is_counted_as_restart() {
        let mut state = PodState {
            phase: Phase::Running {
                pid: 42,
                started: Timestamp::UNIX_EPOCH,
                ready_since: Some(Timestamp::UNIX_EPOCH),
            },
            ..Default::default()
        };
        state.record_exit("process exited with code 1");
        state.record_exit("process exited with code 1");
        assert_eq!(state.restarts, 2);
        let view = state.view("w-abcde", true);
        assert_eq!(view.ready_since, None);
        assert_eq!(
            view.problem.as_deref(),
            Some("process exited with code 1 (restarted 2 times)")
        );
    }

    #[test]
    fn running_pod_is_ready_only_once_marked() {
        let mut state = PodState {
            phase: Phase::Running {
                pid: 1,
                started: Timestamp::UNIX_EPOCH,
                ready_since: None,
            },
            ..Default::default()
        };
        assert_eq!(state.view("p", true).ready_since, None);
        assert_eq!(state.view("p", true).problem, None);
        state.phase = Phase::Running {
            pid: 1,
            started: Timestamp::UNIX_EPOCH,
            ready_since: Some(Timestamp::UNIX_EPOCH),
        };
        assert_eq!(
            state.view("p", true).ready_since,
            Some(Timestamp::UNIX_EPOCH)
        );
    }

    #[test]
    fn waiting_pod_reports_its_reason_message() {
        let state = PodState {
            phase: Phase::Waiting(Waiting::new(
                "ImageNotMapped",
                "image \"x:v1\" is not mapped",
            )),
            ..Default::default()
        };
        assert_eq!(
            state.view("p", true).problem.as_deref(),
            Some("image \"x:v1\" is not mapped")
        );
    }

    #[test]
    fn exit_statuses_are_described() {
        assert_eq!(
            describe_exit(&ExitStatus::from_raw(1 << 8)),
            "process exited with code 1"
        );
        assert_eq!(
            describe_exit(&ExitStatus::from_raw(libc::SIGKILL)),
            "process was killed by signal 9 (SIGKILL)"
        );
    }

    /// Pod tasks with a client that is never contacted (no Secrets or ConfigMaps referenced).
    struct Harness {
        shared: Arc<Shared>,
        changed: mpsc::UnboundedReceiver<DeploymentKey>,
        tasks: tokio::task::JoinSet<()>,
        dir: PathBuf,
    }

    impl Harness {
        fn new(name: &str) -> Self {
            let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
            let (changed_tx, changed) = mpsc::unbounded_channel();
            let images = ImageTable::parse(
                "images:\n  twc.local/sh: sh\n",
                std::path::Path::new("images.yaml"),
            )
            .unwrap();
            let dir =
                std::env::temp_dir().join(format!("twc-supervisor-{name}-{}", std::process::id()));
            Self {
                shared: Arc::new(Shared {
                    client: kube::Client::try_from(config).unwrap(),
                    images,
                    bin_dirs: vec![PathBuf::from("/nonexistent")],
                    metrics_sd_dir: Some(dir.join("targets")),
                    spawner: Spawner::start().unwrap(),
                    changed: changed_tx,
                }),
                changed,
                tasks: tokio::task::JoinSet::new(),
                dir,
            }
        }

        fn start(&mut self, image: &str, command: &[&str]) -> PodHandle {
            let template = PodTemplateSpec {
                spec: Some(k8s_openapi::api::core::v1::PodSpec {
                    containers: vec![k8s_openapi::api::core::v1::Container {
                        name: "main".into(),
                        image: Some(image.into()),
                        command: (!command.is_empty())
                            .then(|| command.iter().map(|c| c.to_string()).collect()),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            };
            let key = DeploymentKey {
                namespace: "ns".into(),
                name: "dep".into(),
            };
            let place = PodPlace {
                namespace: "ns".into(),
                name: "dep-abcde".into(),
                dir: self.dir.join("dep-abcde"),
                log: self.dir.join("dep-abcde.log"),
            };
            start_pod(
                &mut self.tasks,
                self.shared.clone(),
                key,
                place,
                Arc::new(template),
                "{}".into(),
            )
        }

        /// Waits (on state-change notifications, bounded) until `pred` holds for the pod.
        async fn until(&mut self, pod: &PodHandle, pred: impl Fn(&PodState) -> bool) -> PodState {
            let wait = async {
                loop {
                    let state = pod.state();
                    if pred(&state) {
                        return state;
                    }
                    self.changed.recv().await.unwrap();
                }
            };
            tokio::time::timeout(Duration::from_secs(20), wait)
                .await
                .unwrap_or_else(|_| {
                    panic!("pod never reached the expected state: {:?}", pod.state())
                })
        }

        /// Stops the pod and waits for its task to end.
        async fn stop(&mut self, pod: &PodHandle) {
            pod.stop();
            let all = async { while self.tasks.join_next().await.is_some() {} };
            tokio::time::timeout(Duration::from_secs(20), all)
                .await
                .unwrap();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn alive(pid: u32) -> bool {
        // SAFETY: signal 0 only checks that the process exists.
        unsafe { libc::kill(pid as libc::pid_t, 0) == 0 }
    }

    #[tokio::test]
    async fn exiting_process_is_restarted_and_its_exit_recorded() {
        let mut h = Harness::new("crash");
        let pod = h.start("any", &["sh", "-c", "echo out; echo err >&2; exit 3"]);
        let state = h.until(&pod, |s| s.restarts >= 1).await;
        assert_eq!(
            state.last_exit.as_deref(),
            Some("process exited with code 3")
        );
        let log = std::fs::read_to_string(h.dir.join("dep-abcde.log")).unwrap();
        assert!(log.contains("out\nerr\n"), "{log}");
        assert!(log.contains("process exited with code 3"), "{log}");
        h.stop(&pod).await;
    }

    #[tokio::test]
    async fn running_process_becomes_ready_and_is_stopped_with_its_pod() {
        let mut h = Harness::new("ready");
        let pod = h.start("any", &["sleep", "600"]);
        let state = h
            .until(&pod, |s| {
                matches!(
                    s.phase,
                    Phase::Running {
                        ready_since: Some(_),
                        ..
                    }
                )
            })
            .await;
        let Phase::Running { pid, .. } = state.phase else {
            unreachable!()
        };
        assert!(alive(pid));
        h.stop(&pod).await;
        assert!(!alive(pid), "process {pid} survived its pod");
        assert_eq!(pod.state().phase, Phase::Stopped);
        assert!(!h.dir.join("dep-abcde").exists(), "pod folder is removed");
    }

    #[tokio::test]
    async fn a_killed_process_leaves_no_metrics_target_behind() {
        let mut h = Harness::new("sdfile");
        let targets = h.dir.join("targets");
        std::fs::create_dir_all(&targets).unwrap();
        // Writes its target file as the sample worker does, then never removes it. (`$$$$` is
        // the shell's `$$`: the runner expands `$(VAR)` and `$$` like Kubernetes does.)
        let pod = h.start(
            "any",
            &[
                "sh",
                "-c",
                "echo '[]' > \"$SAMPLE_METRICS_SD_DIR/$HOSTNAME-$$$$.json\"; exec sleep 600",
            ],
        );
        let state = h
            .until(&pod, |s| matches!(s.phase, Phase::Running { .. }))
            .await;
        let Phase::Running { pid, .. } = state.phase else {
            unreachable!()
        };
        let file = crate::podrunner::metrics_target_file(&targets, "dep-abcde", pid);
        let written = crate::wait::wait_until("target file", Duration::from_secs(20), || async {
            file.exists().then_some(())
        })
        .await;
        assert!(written.is_ok(), "{} never written", file.display());
        pod.stop();
        let all = async { while h.tasks.join_next().await.is_some() {} };
        tokio::time::timeout(Duration::from_secs(20), all)
            .await
            .unwrap();
        assert!(!file.exists(), "{} left behind", file.display());
        let _ = std::fs::remove_dir_all(&h.dir);
    }

    #[tokio::test]
    async fn unmapped_image_keeps_the_pod_waiting() {
        let mut h = Harness::new("unmapped");
        let pod = h.start("twc.local/unknown:v7", &[]);
        let state = h
            .until(&pod, |s| matches!(s.phase, Phase::Waiting(_)))
            .await;
        let Phase::Waiting(waiting) = state.phase else {
            unreachable!()
        };
        assert_eq!(waiting.reason, "ImageNotMapped");
        assert!(
            waiting.message.contains("twc.local/unknown:v7"),
            "{}",
            waiting.message
        );
        h.stop(&pod).await;
    }

    #[tokio::test]
    async fn mapped_image_without_binary_keeps_the_pod_waiting() {
        let mut h = Harness::new("nobinary");
        let pod = h.start("twc.local/sh:v1", &[]);
        let state = h
            .until(&pod, |s| matches!(s.phase, Phase::Waiting(_)))
            .await;
        let Phase::Waiting(waiting) = state.phase else {
            unreachable!()
        };
        assert_eq!(waiting.reason, "BinaryNotFound");
        h.stop(&pod).await;
    }
}
