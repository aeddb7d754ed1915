//! A held rollout pays per change, not per minute (issue #29, item 8). A Progressive step held
//! for an hour sleeps until something can change its decision: an idle resync costs its timer,
//! one workflow task and one marker (the observation, a local activity), nothing else; a lost
//! pod and a Deployment scaled by hand reach it through the controller's Deployment watch
//! within seconds, well inside the resync; a ramp changed by hand in Temporal, which no watch
//! reports, is snapped back to the step grid by the resync; a pause holds the same way.
//!
//! A private sandbox whose controller resyncs every 30 s (the default is 5 min), so the slow
//! look comes within the test.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::Api;
use serde_json::{Value, json};

use crate::availability::kill_one_of;
use crate::chaos::cluster::{Cluster, Private, status_text};
use crate::harness::twd::{condition, deployments, get_twd, target_build, worker};

const NAME: &str = "held";
const RESYNC: &str = "30s";
const ROLLOUT: Duration = Duration::from_secs(180);
/// How soon a held rollout must act on a watched change: well inside the resync.
const WATCHED_WITHIN: Duration = Duration::from_secs(12);
/// The percentage of the one-hour step.
const STEP: f64 = 20.0;
/// What an idle turn of a hold may add to the history: the timer's firing, one workflow task
/// (scheduled, started, completed), the observation's marker and the next timer.
const IDLE_TURN_EVENTS: usize = 6;
/// The identity the sandbox's controller routes as.
const CONTROLLER_IDENTITY: &str = "twc";

/// `tag` with one pod, ready 6 s after it starts (so a lost pod leaves the build not Available
/// for a while), and one 20 % step of an hour.
fn held(ns: &str, tag: &str) -> Value {
    let rollout = json!({ "strategy": "Progressive",
        "steps": [ { "rampPercentage": STEP, "pauseDuration": "1h" } ] });
    let mut manifest = worker(ns, NAME, tag, rollout);
    manifest["spec"]["template"]["spec"]["containers"][0]["readinessProbe"] = json!({
        "exec": { "command": ["true"] },
        "initialDelaySeconds": 6,
        "periodSeconds": 1
    });
    manifest
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// An event's type without the `EVENT_TYPE_` prefix, in lower case without underscores
/// (`timerfired`), however the CLI spells it.
pub(crate) fn event_type(event: &Value) -> String {
    event["eventType"]
        .as_str()
        .unwrap_or_default()
        .trim_start_matches("EVENT_TYPE_")
        .replace('_', "")
        .to_ascii_lowercase()
}

/// The events of the rollout's running run.
async fn rollout_events(cluster: &Cluster, workflow_id: &str) -> Result<Vec<Value>, String> {
    let query = format!("WorkflowId = '{workflow_id}' AND ExecutionStatus = 'Running'");
    let run = cluster
        .workflows(&query)
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| format!("{workflow_id} does not run"))?;
    let text = cluster
        .history(&cluster.env.temporal_namespace, workflow_id, &run.run_id)
        .await?;
    let history: Value = serde_json::from_str(&text).map_err(|e| format!("{e}: {text}"))?;
    Ok(history["events"].as_array().cloned().unwrap_or_default())
}

/// The events from one timer's firing to the next, after event index `from`, when the turn
/// between them was idle (no signal, no activity, no update): what an idle turn costs. `Err`
/// while the history has no such pair yet.
fn idle_turn(events: &[Value], from: usize) -> Result<Vec<String>, String> {
    let fired: Vec<usize> = events
        .iter()
        .enumerate()
        .skip(from)
        .filter(|(_, e)| event_type(e) == "timerfired")
        .map(|(i, _)| i)
        .collect();
    for pair in fired.windows(2) {
        let turn: Vec<String> = events[pair[0] + 1..=pair[1]]
            .iter()
            .map(event_type)
            .collect();
        let woken = turn.iter().any(|t| {
            t.contains("signaled") || t.contains("activitytaskscheduled") || t.contains("update")
        });
        if !woken {
            return Ok(turn);
        }
    }
    Err(format!(
        "no idle turn yet among {} events after {from}",
        events.len()
    ))
}

/// Waits for an idle turn of the hold after event index `from`; asserts what it cost and that
/// its timer was the resync's.
async fn assert_idle_turn_costs_little(cluster: &Cluster, workflow_id: &str, from: usize) {
    let (turn, events) = cluster
        .wait("an idle turn of the hold", ROLLOUT, || async {
            let events = rollout_events(cluster, workflow_id).await?;
            idle_turn(&events, from).map(|turn| (turn, events))
        })
        .await;
    assert!(
        turn.len() <= IDLE_TURN_EVENTS,
        "an idle turn cost {} events: {turn:?}",
        turn.len()
    );
    assert!(
        turn.iter().any(|t| t == "markerrecorded"),
        "the observation is a local activity: {turn:?}"
    );
    let timers: Vec<&Value> = events
        .iter()
        .skip(from)
        .filter(|e| event_type(e) == "timerstarted")
        .collect();
    let resync_timers = timers
        .iter()
        .filter(|e| e["timerStartedEventAttributes"]["startToFireTimeout"] == RESYNC)
        .count();
    assert!(
        resync_timers >= 1,
        "the hold sleeps for the resync ({RESYNC}): {timers:?}"
    );
}

/// Waits until the TWD's Progressing reason is `reason`; returns when (Unix ms).
async fn wait_progressing(cluster: &Cluster, ns: &str, reason: &str, timeout: Duration) -> i64 {
    cluster
        .wait(&format!("Progressing reason {reason}"), timeout, || async {
            let twd = get_twd(&cluster.client, ns, NAME).await?;
            match condition(&twd, "Progressing") {
                Some(c) if c.1 == reason => Ok(now_ms()),
                _ => Err(status_text(&twd)),
            }
        })
        .await
}

/// Waits until Temporal ramps `build` at `percentage`; returns when (Unix ms).
async fn wait_ramp(
    cluster: &Cluster,
    ns: &str,
    build: &str,
    percentage: f64,
    timeout: Duration,
) -> i64 {
    cluster
        .wait(
            &format!("{build} ramping at {percentage}%"),
            timeout,
            || async {
                let r = cluster.routing(&format!("{ns}/{NAME}")).await?;
                if r.ramping.as_deref() == Some(build) && (r.percentage - percentage).abs() < 0.01 {
                    Ok(now_ms())
                } else {
                    Err(format!("{r:?}"))
                }
            },
        )
        .await
}

/// The ramp percentage of `deployment_name` in Temporal and when it was last set (Unix ms).
async fn ramp_changed(cluster: &Cluster, deployment_name: &str) -> Result<(f64, i64), String> {
    let v = cluster
        .describe_deployment(&cluster.env.temporal_namespace, deployment_name)
        .await?
        .ok_or_else(|| format!("no worker deployment {deployment_name}"))?;
    let rc = &v["routingConfig"];
    let changed = rc["rampingVersionPercentageChangedTime"]
        .as_str()
        .ok_or_else(|| format!("no rampingVersionPercentageChangedTime in {rc}"))?;
    let changed: k8s_openapi::jiff::Timestamp =
        changed.parse().map_err(|e| format!("{changed}: {e}"))?;
    let percentage = rc["rampingVersionPercentage"].as_f64().unwrap_or(0.0);
    Ok((percentage, changed.as_millisecond()))
}

#[tokio::test]
async fn a_held_rollout_sleeps_until_something_changes_and_sees_each_change() {
    let mut private = Private::start("held").await;
    private
        .sandbox
        .restart_controller_with_env(&[("TWC_RESYNC_INTERVAL", RESYNC)])
        .await
        .unwrap_or_else(|e| panic!("restarting the controller: {e}"));
    let cluster = &private.cluster;
    let ns = cluster.namespace("held").await;
    cluster.apply(&cluster.connection(&ns, "dev")).await;
    cluster.apply(&held(&ns, "v1")).await;
    cluster.wait_ready(&ns, NAME, "v1", ROLLOUT).await;

    cluster.apply(&held(&ns, "v2")).await;
    let twd = cluster
        .wait("v2 is the target", ROLLOUT, || async {
            let twd = get_twd(&cluster.client, &ns, NAME).await?;
            match target_build(&twd) {
                Some(build) if build.starts_with("v2-") => Ok(twd),
                _ => Err(status_text(&twd)),
            }
        })
        .await;
    let v2 = target_build(&twd).unwrap_or_default();
    wait_ramp(cluster, &ns, &v2, STEP, ROLLOUT).await;
    wait_progressing(cluster, &ns, "Ramping", ROLLOUT).await;
    let rollout = format!("rollout/{ns}/{NAME}/{v2}");

    // 1. Idle in the hour-long step: a turn per resync, each costing a handful of events.
    let from = cluster
        .wait("the rollout's history", ROLLOUT, || async {
            rollout_events(cluster, &rollout).await.map(|e| e.len())
        })
        .await;
    assert_idle_turn_costs_little(cluster, &rollout, from).await;

    // 2. A lost pod: the build is not Available until its restarted pod is ready (6 s); the
    // rollout holds for it at once, and goes on when it is back.
    let killed_at = now_ms();
    kill_one_of(cluster, &ns, NAME, &v2, 1).await;
    let held_at = wait_progressing(cluster, &ns, "WaitingForAvailability", WATCHED_WITHIN).await;
    let resumed_at = wait_progressing(cluster, &ns, "Ramping", ROLLOUT).await;
    assert!(
        held_at - killed_at <= WATCHED_WITHIN.as_millis() as i64,
        "held {} ms after the kill",
        held_at - killed_at
    );
    assert!(
        resumed_at - held_at < 30_000,
        "Ramping again {} ms after holding (not at the resync)",
        resumed_at - held_at
    );

    // 3. The build's Deployment scaled by hand: scaled back to the spec's one replica at once.
    let name = deployments(&cluster.client, &ns, NAME)
        .await
        .into_iter()
        .find(|d| d.1 == v2)
        .map(|d| d.0)
        .unwrap_or_else(|| panic!("no Deployment of {v2}"));
    let scaled = cluster
        .kubectl(
            &["-n", &ns, "scale", "deployment", &name, "--replicas=3"],
            None,
        )
        .await;
    assert!(scaled.success, "kubectl scale: {}", scaled.stderr);
    let scaled_at = now_ms();
    let api: Api<Deployment> = Api::namespaced(cluster.client.clone(), &ns);
    let restored_at = cluster
        .wait(
            "the Deployment back at 1 replica",
            WATCHED_WITHIN,
            || async {
                let d = api.get(&name).await.map_err(|e| e.to_string())?;
                match d.spec.as_ref().and_then(|s| s.replicas) {
                    Some(1) => Ok(now_ms()),
                    other => Err(format!("replicas {other:?}")),
                }
            },
        )
        .await;
    assert!(
        restored_at - scaled_at <= WATCHED_WITHIN.as_millis() as i64,
        "restored {} ms after the edit",
        restored_at - scaled_at
    );

    // 4. A ramp changed by hand in Temporal (no watch reports it): back on the step grid at the
    // next resync at the latest. The rollout may also look sooner (the Deployment edited in 3
    // still reports its pods going), so the test does not wait to see 45 %: it waits for a ramp
    // percentage set back to the step after the edit, by its change time in Temporal.
    let edited_at = now_ms();
    let out = cluster
        .temporal(&[
            "worker",
            "deployment",
            "set-ramping-version",
            "--deployment-name",
            &format!("{ns}/{NAME}"),
            "--build-id",
            &v2,
            "--percentage",
            "45",
            "--yes",
            "--identity",
            CONTROLLER_IDENTITY,
        ])
        .await;
    assert!(out.success, "set-ramping-version: {}", out.stderr);
    cluster
        .wait(
            "the hand-set ramp back on the step grid",
            Duration::from_secs(30 + 30),
            || async {
                let (percentage, changed_at) =
                    ramp_changed(cluster, &format!("{ns}/{NAME}")).await?;
                if (percentage - STEP).abs() < 0.01 && changed_at > edited_at {
                    Ok(())
                } else {
                    Err(format!(
                        "{percentage}% set at {changed_at} (edited at {edited_at})"
                    ))
                }
            },
        )
        .await;

    // 5. Paused: the same sleep.
    cluster.control(&ns, NAME, "pause").await;
    wait_progressing(cluster, &ns, "Paused", ROLLOUT).await;
    let from = rollout_events(cluster, &rollout)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .len();
    assert_idle_turn_costs_little(cluster, &rollout, from).await;
    cluster.control(&ns, NAME, "resume").await;
    wait_progressing(cluster, &ns, "Ramping", ROLLOUT).await;
    let r = cluster
        .routing(&format!("{ns}/{NAME}"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.ramping.as_deref(), Some(v2.as_str()), "{r:?}");
    private.sandbox.stop().await;
}
