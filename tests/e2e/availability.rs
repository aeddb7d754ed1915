//! A ramping version that was Available and briefly is not (issue #31): a `replicas` change and
//! a pod killed during a long Progressive step, both well past the progress deadline counted
//! from the rollout's start, hold the rollout (`WaitingForAvailability`) instead of failing it;
//! it goes on by itself once the Deployment is Available again, and the step ends on time.
//! A private sandbox, so its controller's failure counter belongs to this scenario alone.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::Api;
use serde_json::{Value, json};
use twc_crds::worker_deployment::RolloutPhase;

use crate::chaos::cluster::{Cluster, Private, status_text};
use crate::harness::controls::events;
use crate::harness::twd::{condition, deployments, get_twd, target_build, worker};

const NAME: &str = "noisy";
/// `spec.progressDeadlineSeconds`: short, so the rollout is well past it mid-step.
const DEADLINE_SECS: i64 = 30;
/// The one Progressive step's pause: long enough to change replicas and kill a pod during it.
const STEP_SECS: i64 = 90;
/// Each pod is ready this long after it starts (a readiness probe's initial delay), so every
/// gap in availability outlasts the rollout's 10 s re-check while it holds a step.
const READY_DELAY_SECS: i64 = 12;
/// How soon after its Deployment is Available again the rollout must be Ramping again (a
/// 5-minute timer would not do).
const RESUME_WITHIN: Duration = Duration::from_secs(20);
const ROLLOUT: Duration = Duration::from_secs(180);

/// The TWD running `tag` with `replicas` pods, the short deadline, the slow readiness and one
/// 10 % step.
fn noisy(ns: &str, tag: &str, replicas: i32) -> Value {
    let rollout = json!({ "strategy": "Progressive",
        "steps": [ { "rampPercentage": 10, "pauseDuration": format!("{STEP_SECS}s") } ] });
    let mut manifest = worker(ns, NAME, tag, rollout);
    manifest["spec"]["replicas"] = json!(replicas);
    manifest["spec"]["progressDeadlineSeconds"] = json!(DEADLINE_SECS);
    manifest["spec"]["template"]["spec"]["containers"][0]["readinessProbe"] = json!({
        "exec": { "command": ["true"] },
        "initialDelaySeconds": READY_DELAY_SECS,
        "periodSeconds": 1
    });
    manifest
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// (phase, Ready reason, Progressing reason) of the TWD now.
async fn shown(client: &kube::Client, ns: &str) -> Result<(String, String, String), String> {
    let twd = get_twd(client, ns, NAME).await?;
    let phase = twd
        .status
        .as_ref()
        .and_then(|s| s.rollout.as_ref())
        .and_then(|r| r.phase)
        .map_or_else(|| "-".to_owned(), |p| format!("{p:?}"));
    let reason = |type_: &str| condition(&twd, type_).map(|c| c.1).unwrap_or_default();
    Ok((phase, reason("Ready"), reason("Progressing")))
}

/// Records every distinct (phase, Ready reason, Progressing reason) the TWD shows, every
/// 200 ms, until dropped.
struct Recorder {
    seen: Arc<Mutex<Vec<(String, String, String)>>>,
    stop: Arc<AtomicBool>,
}

impl Recorder {
    fn start(client: kube::Client, ns: String) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (into, stopped) = (Arc::clone(&seen), Arc::clone(&stop));
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(Duration::from_millis(200));
            while !stopped.load(Ordering::Relaxed) {
                ticks.tick().await;
                if let Ok(now) = shown(&client, &ns).await
                    && let Ok(mut seen) = into.lock()
                    && seen.last() != Some(&now)
                {
                    seen.push(now);
                }
            }
        });
        Self { seen, stop }
    }

    fn seen(&self) -> Vec<(String, String, String)> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Waits until the TWD's Progressing reason is `reason`; returns when it was seen (Unix ms).
async fn wait_progressing(cluster: &Cluster, ns: &str, reason: &str, timeout: Duration) -> i64 {
    cluster
        .wait(
            &format!("{ns}/{NAME} Progressing reason {reason}"),
            timeout,
            || async {
                let twd = get_twd(&cluster.client, ns, NAME).await?;
                match condition(&twd, "Progressing") {
                    Some(c) if c.1 == reason => Ok(now_ms()),
                    _ => Err(status_text(&twd)),
                }
            },
        )
        .await
}

/// Waits until the build's Deployment is Available with `replicas` ready pods for its latest
/// generation; returns when it was seen (Unix ms).
async fn wait_available(cluster: &Cluster, ns: &str, build: &str, replicas: i32) -> i64 {
    let name = deployments(&cluster.client, ns, NAME)
        .await
        .into_iter()
        .find(|d| d.1 == build)
        .map(|d| d.0)
        .unwrap_or_else(|| panic!("no Deployment of {build} in {ns}"));
    let api: Api<Deployment> = Api::namespaced(cluster.client.clone(), ns);
    cluster
        .wait(
            &format!("Deployment {ns}/{name} Available with {replicas} ready pods"),
            ROLLOUT,
            || async {
                let d = api.get(&name).await.map_err(|e| e.to_string())?;
                let status = d.status.clone().unwrap_or_default();
                let available = status
                    .conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Available" && c.status == "True");
                if available
                    && status.ready_replicas == Some(replicas)
                    && status.observed_generation == d.metadata.generation
                {
                    Ok(now_ms())
                } else {
                    Err(format!("{status:?}"))
                }
            },
        )
        .await
}

/// Waits until the rollout holds for availability, the build's two pods are Available again,
/// and the rollout is Ramping again within [`RESUME_WITHIN`] of that.
async fn held_until_available(cluster: &Cluster, ns: &str, build: &str) {
    wait_progressing(cluster, ns, "WaitingForAvailability", ROLLOUT).await;
    let available_at = wait_available(cluster, ns, build, 2).await;
    let resumed_at = wait_progressing(cluster, ns, "Ramping", ROLLOUT).await;
    assert!(
        resumed_at - available_at <= RESUME_WITHIN.as_millis() as i64,
        "Ramping again {} ms after the Deployment was Available",
        resumed_at - available_at
    );
}

/// Process IDs of the running pods of `build` of the worker deployment `ns/name`: the
/// sample-worker processes the pod runner started with that worker deployment and build in
/// their environment.
pub(crate) fn pod_pids(ns: &str, name: &str, build: &str) -> Vec<u32> {
    let wanted = [
        format!("TEMPORAL_DEPLOYMENT_NAME={ns}/{name}"),
        format!("TEMPORAL_WORKER_BUILD_ID={build}"),
    ];
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let vars: Vec<&[u8]> = environ.split(|b| *b == 0).collect();
            comm.trim() == "sample-worker" && wanted.iter().all(|w| vars.contains(&w.as_bytes()))
        })
        .collect()
}

/// SIGKILLs one pod of `build` of `ns/NAME`, which runs two.
async fn kill_one_pod(cluster: &Cluster, ns: &str, build: &str) {
    kill_one_of(cluster, ns, NAME, build, 2).await;
}

/// SIGKILLs one pod of `build` of `ns/name` once `pods` run (the pod runner restarts its
/// process, as a kubelet would).
pub(crate) async fn kill_one_of(cluster: &Cluster, ns: &str, name: &str, build: &str, pods: usize) {
    let pids = cluster
        .wait(
            &format!("{pods} running pods of {build}"),
            ROLLOUT,
            || async {
                let pids = pod_pids(ns, name, build);
                if pids.len() == pods {
                    Ok(pids)
                } else {
                    Err(format!("pods {pids:?}"))
                }
            },
        )
        .await;
    let pid = pids[0].to_string();
    let killed = tokio::process::Command::new("kill")
        .args(["-9", &pid])
        .status()
        .await
        .unwrap_or_else(|e| panic!("kill -9 {pid}: {e}"));
    assert!(killed.success(), "kill -9 {pid}: {killed}");
}

/// Every `twc_rollouts_failed_total` sample of the controller, with its value.
async fn failures(cluster: &Cluster) -> Result<Vec<(String, f64)>, String> {
    let url = cluster
        .env
        .controller_metrics_url
        .clone()
        .ok_or("the private sandbox names no controller metrics URL")?;
    let response = twc_sandbox::http::get(&url).await?;
    if response.status != 200 {
        return Err(format!("{url}: {}", response.head));
    }
    Ok(response
        .body
        .lines()
        .filter(|l| l.starts_with("twc_rollouts_failed_total"))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect())
}

#[tokio::test]
async fn replicas_changes_and_pod_restarts_during_a_long_step_hold_the_rollout_without_failing_it()
{
    let private = Private::start("availability").await;
    let cluster = &private.cluster;
    let ns = cluster.namespace("availability").await;
    cluster.apply(&cluster.connection(&ns, "dev")).await;
    cluster.apply(&noisy(&ns, "v1", 1)).await;
    cluster.wait_ready(&ns, NAME, "v1", ROLLOUT).await;

    cluster.apply(&noisy(&ns, "v2", 1)).await;
    let recorder = Recorder::start(cluster.client.clone(), ns.clone());
    let twd = cluster
        .wait("v2 ramping at 10%", ROLLOUT, || async {
            let twd = get_twd(&cluster.client, &ns, NAME).await?;
            let target = twd.status.as_ref().and_then(|s| s.target_version.as_ref());
            let ramping = target.and_then(|t| t.ramp_percentage).map(f32::round) == Some(10.0)
                && target.is_some_and(|t| t.version.build_id.starts_with("v2-"));
            if ramping {
                Ok(twd)
            } else {
                Err(status_text(&twd))
            }
        })
        .await;
    let v2 = target_build(&twd).unwrap_or_default();
    let status = twd.status.clone().unwrap_or_default();
    let started_at = status
        .rollout
        .and_then(|r| r.started_at)
        .map(|t| t.0.as_millisecond())
        .unwrap_or_else(|| panic!("no rollout start: {}", status_text(&twd)));
    let step_started_at = status
        .target_version
        .and_then(|t| t.ramp_last_modified_at)
        .map(|t| t.0.as_millisecond())
        .unwrap_or_else(|| panic!("no ramp time: {}", status_text(&twd)));
    let step_ends_at = step_started_at + STEP_SECS * 1000;

    // The scenario: past the progress deadline counted from the rollout's start.
    let past_deadline = started_at + (DEADLINE_SECS + 2) * 1000;
    cluster
        .wait(
            "the rollout is past its progress deadline",
            Duration::from_secs(60),
            || async {
                let now = now_ms();
                if now > past_deadline {
                    Ok(())
                } else {
                    Err(format!("{}s to go", (past_deadline - now) / 1000))
                }
            },
        )
        .await;

    // 1. spec.replicas 1 -> 2: the second pod is not ready for a while.
    let changed_at = now_ms();
    assert!(
        changed_at > started_at + DEADLINE_SECS * 1000,
        "replicas change before the deadline"
    );
    cluster.apply(&noisy(&ns, "v2", 2)).await;
    held_until_available(cluster, &ns, &v2).await;

    // 2. One pod killed: restarted, it is not ready for a while either.
    kill_one_pod(cluster, &ns, &v2).await;
    held_until_available(cluster, &ns, &v2).await;
    assert!(
        now_ms() < step_ends_at,
        "the scenario outlasted the step; lengthen STEP_SECS"
    );

    // The step ends on time: v2 becomes Current at the end of its pause.
    let promoted_at = cluster
        .wait("v2 Current", ROLLOUT, || async {
            let r = cluster.routing(&format!("{ns}/{NAME}")).await?;
            if r.current.as_deref() == Some(v2.as_str()) {
                Ok(now_ms())
            } else {
                Err(format!("{r:?}"))
            }
        })
        .await;
    assert!(
        promoted_at >= step_ends_at - 1000 && promoted_at <= step_ends_at + 15_000,
        "promoted {} ms after the step's end",
        promoted_at - step_ends_at
    );
    cluster.wait_ready(&ns, NAME, "v2", ROLLOUT).await;
    let seen = recorder.seen();
    drop(recorder);

    // Rolling throughout, never blocked, no Warning, no failure counted.
    let rolling = format!("{:?}", RolloutPhase::Rolling);
    let complete = format!("{:?}", RolloutPhase::Complete);
    assert!(
        seen.iter().all(
            |(phase, ready, progressing)| (*phase == rolling || *phase == complete)
                && ready != "ProgressDeadlineExceeded"
                && progressing != "ProgressDeadlineExceeded"
        ),
        "shown during the rollout: {seen:?}"
    );
    assert!(
        seen.iter().any(|s| s.2 == "WaitingForAvailability"),
        "{seen:?}"
    );
    let warnings: Vec<_> = events(&cluster.client, &ns, NAME)
        .await
        .into_iter()
        .filter(|e| e.0 != "Normal")
        .collect();
    assert!(warnings.is_empty(), "{warnings:?}");
    let failed = cluster
        .wait("the controller's metrics", ROLLOUT, || failures(cluster))
        .await;
    assert!(failed.iter().all(|(_, v)| *v == 0.0), "{failed:?}");
    private.sandbox.stop().await;
}
