//! Crash recovery: a controller SIGKILLed while one of its activities waits (on a gate, on
//! pollers) leaves that activity silent; Temporal notices within its heartbeat timeout and the
//! restarted controller takes the step up again within seconds, not after the activity's
//! start-to-close timeout.

use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};

use crate::chaos::cluster::{Cluster, Private};
use crate::harness::twd::{get_twd, target_build, worker};

const ROLLOUT: Duration = Duration::from_secs(180);
/// The bound: the step resumes within this of the controller's restart.
const RESUMED_WITHIN: Duration = Duration::from_secs(10);

/// The pending activity of type `activity` of workflow `workflow_id`: (attempt, state, last
/// started time as RFC 3339 text).
async fn pending_activity(
    cluster: &Cluster,
    workflow_id: &str,
    activity: &str,
) -> Result<(u64, String, String), String> {
    let out = cluster
        .temporal(&[
            "workflow",
            "describe",
            "--workflow-id",
            workflow_id,
            "--output",
            "json",
        ])
        .await;
    if !out.success {
        return Err(out.stderr);
    }
    let v: Value = serde_json::from_str(&out.stdout).map_err(|e| format!("{e}: {}", out.stdout))?;
    let pending = v["pendingActivities"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let found = pending
        .iter()
        .find(|a| a["activityType"]["name"].as_str() == Some(activity))
        .ok_or_else(|| format!("no pending {activity}: {pending:?}"))?;
    let attempt = found["attempt"]
        .as_u64()
        .or_else(|| found["attempt"].as_str().and_then(|s| s.parse().ok()))
        .unwrap_or(1);
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    Ok((
        attempt,
        text(&found["state"]),
        text(&found["lastStartedTime"]),
    ))
}

/// Kills the controller while `activity` of `workflow_id` runs, restarts it, and returns how
/// long after the restart the activity ran again (a new attempt started).
async fn kill_during(private: &mut Private, workflow_id: &str, activity: &str) -> Duration {
    let cluster = &private.cluster;
    let (attempt, _, _) = cluster
        .wait(
            &format!("{activity} of {workflow_id} running"),
            ROLLOUT,
            || async {
                let (attempt, state, started) =
                    pending_activity(cluster, workflow_id, activity).await?;
                if state.ends_with("STARTED") && !started.is_empty() {
                    Ok((attempt, state, started))
                } else {
                    Err(format!("attempt {attempt} {state} {started}"))
                }
            },
        )
        .await;
    let pid = private.sandbox.kill_controller().await;
    assert!(pid.is_some(), "the controller was running");
    assert!(
        private.sandbox.restart_dead_controller().is_some(),
        "the controller restarts"
    );
    let restarted = Instant::now();
    let restarted_at = SystemTime::now();
    let cluster = &private.cluster;
    cluster
        .wait(
            &format!("{activity} of {workflow_id} running again after the restart"),
            ROLLOUT,
            || async {
                let (now_attempt, state, started) =
                    pending_activity(cluster, workflow_id, activity).await?;
                let started_after = started
                    .parse::<k8s_openapi::jiff::Timestamp>()
                    .is_ok_and(|t| SystemTime::from(t) > restarted_at);
                if now_attempt > attempt && state.ends_with("STARTED") && started_after {
                    Ok(())
                } else {
                    Err(format!("attempt {now_attempt} {state} since {started}"))
                }
            },
        )
        .await;
    restarted.elapsed()
}

#[tokio::test]
async fn a_controller_killed_during_a_wait_resumes_it_within_seconds_of_its_restart() {
    let mut private = Private::start("recovery").await;
    let ns = private.cluster.namespace("recovery").await;
    private
        .cluster
        .apply(&private.cluster.connection(&ns, "dev"))
        .await;

    // A gate that takes 40 s: the rollout's run_gate activity waits for it.
    let gated = json!({ "strategy": "AllAtOnce",
        "gate": { "workflowType": "RolloutGate", "input": { "sleepSeconds": 40 } } });
    private
        .cluster
        .apply(&worker(&ns, "gated", "v1", gated))
        .await;
    let build = private
        .cluster
        .wait("the gated TWD's target build", ROLLOUT, || async {
            let twd = get_twd(&private.cluster.client, &ns, "gated").await?;
            target_build(&twd).ok_or_else(|| "no target yet".to_owned())
        })
        .await;
    let rollout_id = format!("rollout/{ns}/gated/{build}");
    let gate_resumed = kill_during(&mut private, &rollout_id, "run_gate").await;
    assert!(
        gate_resumed <= RESUMED_WITHIN,
        "the gate wait resumed {gate_resumed:?} after the restart"
    );
    private
        .cluster
        .wait_ready(&ns, "gated", "v1", ROLLOUT)
        .await;

    // Workers that never poll: the rollout's wait_for_pollers activity waits for them.
    let mut silent = worker(&ns, "silent", "v1", json!({ "strategy": "AllAtOnce" }));
    silent["spec"]["template"]["spec"]["containers"][0]["env"] =
        json!([{ "name": "SAMPLE_NEVER_POLL", "value": "1" }]);
    private.cluster.apply(&silent).await;
    let build = private
        .cluster
        .wait("the silent TWD's target build", ROLLOUT, || async {
            let twd = get_twd(&private.cluster.client, &ns, "silent").await?;
            target_build(&twd).ok_or_else(|| "no target yet".to_owned())
        })
        .await;
    let rollout_id = format!("rollout/{ns}/silent/{build}");
    let wait_resumed = kill_during(&mut private, &rollout_id, "wait_for_pollers").await;
    assert!(
        wait_resumed <= RESUMED_WITHIN,
        "the poller wait resumed {wait_resumed:?} after the restart"
    );
    private.sandbox.stop().await;
}
