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
    let v = crate::harness::cli::json_output(
        cluster
            .temporal(&[
                "workflow",
                "describe",
                "--workflow-id",
                workflow_id,
                "--output",
                "json",
            ])
            .await,
    )?;
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

/// Waits until `activity` of `workflow_id` runs, kills the controller (SIGKILL) and restarts
/// it; returns the attempt that was running, and when and at what time the restart happened.
async fn kill_while_running(
    private: &mut Private,
    workflow_id: &str,
    activity: &str,
) -> (u64, Instant, SystemTime) {
    let cluster = &private.cluster;
    let attempt = cluster
        .wait(
            &format!("{activity} of {workflow_id} running"),
            ROLLOUT,
            || async {
                let (attempt, state, started) =
                    pending_activity(cluster, workflow_id, activity).await?;
                if state.ends_with("STARTED") && !started.is_empty() {
                    Ok(attempt)
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
    (attempt, Instant::now(), SystemTime::now())
}

/// Kills the controller while `activity` of `workflow_id` runs, restarts it, and returns how
/// long after the restart the activity ran again (a new attempt started).
async fn kill_during(private: &mut Private, workflow_id: &str, activity: &str) -> Duration {
    let (attempt, restarted, restarted_at) =
        kill_while_running(private, workflow_id, activity).await;
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

#[tokio::test]
async fn a_controller_killed_during_create_deployment_or_set_routing_resumes_within_seconds() {
    let mut private = Private::start("recovery-steps").await;
    // Test-only fault injection: the first attempt of these activities is held for a minute,
    // so the kill lands while one is in flight.
    private
        .sandbox
        .restart_controller_with_env(&[(
            "TWC_TEST_HOLD_ACTIVITIES",
            "create_deployment,set_routing",
        )])
        .await
        .unwrap_or_else(|e| panic!("restarting the controller: {e}"));
    let ns = private.cluster.namespace("recovery-steps").await;
    private
        .cluster
        .apply(&private.cluster.connection(&ns, "dev"))
        .await;
    private
        .cluster
        .apply(&worker(
            &ns,
            "hello",
            "v1",
            json!({ "strategy": "AllAtOnce" }),
        ))
        .await;
    // The TWD workflow creates the build's Deployment as it starts the rollout (its status
    // names the build once that turn's create has ended).
    let twd_id = format!("twd/{ns}/hello");
    let (_, restarted, _) = kill_while_running(&mut private, &twd_id, "create_deployment").await;
    let build = private
        .cluster
        .wait(
            "the Deployment created after the restart",
            ROLLOUT,
            || async {
                let deployments =
                    crate::harness::twd::deployments(&private.cluster.client, &ns, "hello").await;
                deployments
                    .first()
                    .map(|d| d.1.clone())
                    .ok_or_else(|| format!("{deployments:?}"))
            },
        )
        .await;
    let created_after = restarted.elapsed();
    assert!(
        created_after <= RESUMED_WITHIN,
        "create_deployment resumed {created_after:?} after the restart"
    );
    let rollout_id = format!("rollout/{ns}/hello/{build}");

    let (_, restarted, _) = kill_while_running(&mut private, &rollout_id, "set_routing").await;
    private
        .cluster
        .wait("the build Current after the restart", ROLLOUT, || async {
            let routing = private.cluster.routing(&format!("{ns}/hello")).await?;
            if routing.current.as_deref() == Some(build.as_str()) {
                Ok(())
            } else {
                Err(format!("{routing:?}"))
            }
        })
        .await;
    let routed_after = restarted.elapsed();
    assert!(
        routed_after <= RESUMED_WITHIN,
        "set_routing resumed {routed_after:?} after the restart"
    );
    private
        .cluster
        .wait_ready(&ns, "hello", "v1", ROLLOUT)
        .await;
    private.sandbox.stop().await;
}
