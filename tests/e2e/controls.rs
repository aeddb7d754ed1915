//! Operator controls end to end: pause, resume, promote, abort and retry through each of the
//! three paths (the `kubectl twc` plugin, the rollout-action annotation, `temporal workflow
//! signal` with no input), `spec.rollout.paused` as a declarative hold, and the rollout
//! history as a visibility query; the CLI's synchronous answers (the rollout's `control`
//! update), the engine found from the `make dev` kubeconfig, and an annotation acted on once
//! with two controller replicas. Real controller, Temporal, kube-apiserver and sample workers.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use twc_crds::worker_deployment::RolloutPhase;

use twc_sandbox::up::Sandbox;

use crate::chaos::cluster::{Cluster, Private};
use crate::harness::cli::{kubectl, temporal};
use crate::harness::controls::{
    EventRow, Via, events, holds_for, kubectl_twc, kubectl_twc_in, send, twc, update_control,
    wait_annotation_removed, wait_event,
};
use crate::harness::twd::{
    apply, condition, connection, deployments, get_twd, routing, target_build, wait_ready,
    wait_reason, worker,
};
use crate::harness::wait::wait_for;
use crate::harness::{env, kube_client, test_namespace};

const ROLLOUT: Duration = Duration::from_secs(120);
const ANSWER: Duration = Duration::from_secs(60);

/// Two Progressive steps that never end by themselves during a test.
fn slow_steps() -> Value {
    json!({ "strategy": "Progressive", "steps": [
        { "rampPercentage": 30, "pauseDuration": "10m" },
        { "rampPercentage": 60, "pauseDuration": "10m" }
    ] })
}

/// Waits until a build whose ID starts with `prefix` ramps at `percent`; returns its ID.
async fn wait_ramp(deployment_name: &str, prefix: &str, percent: i64) -> String {
    wait_for(
        &format!("{deployment_name}: a {prefix}* build ramps at {percent}%"),
        ROLLOUT,
        || async {
            let r = routing(deployment_name).await?;
            match &r.ramping {
                Some(b) if b.starts_with(prefix) && r.percentage.round() as i64 == percent => {
                    Ok(b.clone())
                }
                _ => Err(format!("{r:?}")),
            }
        },
    )
    .await
}

async fn wait_current(deployment_name: &str, build: &str) {
    wait_for(
        &format!("{deployment_name}: {build} is Current and nothing ramps"),
        ROLLOUT,
        || async {
            let r = routing(deployment_name).await?;
            if r.current.as_deref() == Some(build) && r.ramping.is_none() {
                Ok(())
            } else {
                Err(format!("{r:?}"))
            }
        },
    )
    .await;
}

async fn wait_phase(client: &kube::Client, ns: &str, name: &str, phase: RolloutPhase) {
    wait_for(&format!("{ns}/{name} phase {phase:?}"), ROLLOUT, || async {
        let twd = get_twd(client, ns, name).await?;
        let rollout = twd.status.as_ref().and_then(|s| s.rollout.clone());
        match rollout {
            Some(r) if r.phase == Some(phase) => Ok(()),
            other => Err(format!("rollout status {other:?}")),
        }
    })
    .await;
}

/// The TWD `hello` in a fresh namespace (`<prefix>-...`) rolled out to `v1` with `rollout` and
/// Ready; returns the client, the namespace and the v1 build ID.
async fn hello_ready(prefix: &str, rollout: Value) -> (kube::Client, String, String) {
    let client = kube_client().await;
    let ns = test_namespace(&client, prefix).await;
    apply(&connection(&ns)).await;
    apply(&worker(&ns, "hello", "v1", rollout)).await;
    let v1 = target_build(&wait_ready(&client, &ns, "hello", ROLLOUT).await).unwrap_or_default();
    (client, ns, v1)
}

/// How a control that changes nothing is answered.
#[derive(Clone, Copy)]
enum Answer {
    /// Already in force (idempotent): exit 0, event `ControlUnchanged`.
    Unchanged,
    /// Does not apply: exit 1, event `ControlIgnored`.
    NotApplicable,
}

/// Sends a control that changes nothing and waits for its answer the way the path shows it:
/// the CLI's exit code and message, or the answering event.
async fn expect_answer(
    via: Via,
    client: &kube::Client,
    ns: &str,
    action: &str,
    answer: Answer,
    text: &str,
) {
    let (exit, reason) = match answer {
        Answer::Unchanged => (0, "ControlUnchanged"),
        Answer::NotApplicable => (1, "ControlIgnored"),
    };
    if via == Via::Cli {
        let out = kubectl_twc(&[action, "hello", "-n", ns]).await;
        assert_eq!(out.code, Some(exit), "kubectl twc {action}: {out:?}");
        assert!(
            out.stdout.contains(text) || out.stderr.contains(text),
            "kubectl twc {action} says {text:?}: {out:?}"
        );
        return;
    }
    if via == Via::Temporal {
        // The update answers at once: accepted with what it does, or refused with why.
        let out = update_control(ns, "hello", action).await;
        assert_eq!(out.success, exit == 0, "update control {action}: {out:?}");
        assert!(
            out.stdout.contains(text) || out.stderr.contains(text),
            "update control {action} says {text:?}: {out:?}"
        );
        return;
    }
    send(via, action, ns, "hello").await;
    if via == Via::Annotation {
        wait_annotation_removed(client, ns, "hello").await;
    }
    wait_event(client, ns, "hello", reason, text, ANSWER).await;
}

/// The whole life of an operator's controls on one TWD through one path: pause holds a ramp
/// (Phase Paused, ramp unchanged), a second pause changes nothing, resume continues, promote
/// skips the remaining steps, a promote with nothing rolling is answered, and abort during the
/// next ramp routes back to the previous Current and retires the aborted version.
async fn controls_through(via: Via, prefix: &str) {
    let client = kube_client().await;
    let ns = test_namespace(&client, prefix).await;
    let deployment_name = format!("{ns}/hello");
    apply(&connection(&ns)).await;
    apply(&worker(&ns, "hello", "v1", slow_steps())).await;
    let v1 = target_build(&wait_ready(&client, &ns, "hello", ROLLOUT).await).unwrap_or_default();

    apply(&worker(&ns, "hello", "v2", slow_steps())).await;
    let v2 = wait_ramp(&deployment_name, "v2-", 30).await;

    // Pause: the ramp stays, the phase says so.
    send(via, "pause", &ns, "hello").await;
    if via == Via::Annotation {
        wait_annotation_removed(&client, &ns, "hello").await;
    }
    wait_phase(&client, &ns, "hello", RolloutPhase::Paused).await;
    let (status, _, _) = wait_reason(&client, &ns, "hello", "Ready", "Paused", ROLLOUT).await;
    assert_eq!(status, "False");
    wait_event(&client, &ns, "hello", "Paused", "an operator", ANSWER).await;
    let r = routing(&deployment_name)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (r.ramping.as_deref(), r.percentage.round() as i64),
        (Some(v2.as_str()), 30),
        "a pause keeps the ramp: {r:?}"
    );

    // Pause again: idempotent, answered, nothing changes.
    expect_answer(
        via,
        &client,
        &ns,
        "pause",
        Answer::Unchanged,
        "already paused",
    )
    .await;

    send(via, "resume", &ns, "hello").await;
    wait_reason(&client, &ns, "hello", "Ready", "Ramping", ROLLOUT).await;
    wait_event(&client, &ns, "hello", "Resumed", &v2, ANSWER).await;

    // Promote skips the rest of a 10-minute step and the next one.
    send(via, "promote", &ns, "hello").await;
    wait_current(&deployment_name, &v2).await;
    let twd = wait_ready(&client, &ns, "hello", ROLLOUT).await;
    assert_eq!(target_build(&twd).as_deref(), Some(v2.as_str()));
    wait_event(&client, &ns, "hello", "PromotedByOperator", &v2, ANSWER).await;

    // Nothing rolling: promote is answered, not an error loop.
    expect_answer(
        via,
        &client,
        &ns,
        "promote",
        Answer::NotApplicable,
        "already Current",
    )
    .await;

    // Abort during the next ramp.
    apply(&worker(&ns, "hello", "v3", slow_steps())).await;
    let v3 = wait_ramp(&deployment_name, "v3-", 30).await;
    send(via, "abort", &ns, "hello").await;
    let (status, _, message) =
        wait_reason(&client, &ns, "hello", "Progressing", "Aborted", ROLLOUT).await;
    assert_eq!(status, "False", "{message}");
    wait_phase(&client, &ns, "hello", RolloutPhase::Aborted).await;
    wait_current(&deployment_name, &v2).await;
    wait_event(&client, &ns, "hello", "Aborted", &v3, ANSWER).await;
    wait_for("the aborted build is retired", ROLLOUT, || async {
        let deps = deployments(&client, &ns, "hello").await;
        match deps.iter().find(|d| d.1 == v3) {
            None | Some((_, _, Some(0))) => Ok(()),
            Some(other) => Err(format!("{other:?}")),
        }
    })
    .await;
    let r = routing(&deployment_name)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.current.as_deref(), Some(v2.as_str()), "{r:?}");
    assert_ne!(v1, v2);

    // `retry` rolls an aborted build out again.
    send(via, "retry", &ns, "hello").await;
    if via == Via::Annotation {
        wait_annotation_removed(&client, &ns, "hello").await;
    }
    assert_eq!(wait_ramp(&deployment_name, "v3-", 30).await, v3);
    wait_reason(&client, &ns, "hello", "Ready", "Ramping", ROLLOUT).await;
}

#[tokio::test]
async fn controls_through_the_kubectl_plugin() {
    controls_through(Via::Cli, "ctl-cli").await;
}

#[tokio::test]
async fn controls_through_the_rollout_action_annotation() {
    controls_through(Via::Annotation, "ctl-annot").await;
}

#[tokio::test]
async fn controls_through_the_temporal_workflow_update() {
    controls_through(Via::Temporal, "ctl-temporal").await;
}

#[tokio::test]
async fn a_bad_rollout_action_is_answered_with_a_warning_and_removed() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "ctl-badaction").await;
    apply(&connection(&ns)).await;
    apply(&worker(
        &ns,
        "hello",
        "v1",
        json!({ "strategy": "AllAtOnce" }),
    ))
    .await;
    wait_ready(&client, &ns, "hello", ROLLOUT).await;
    let out = kubectl(
        &[
            "annotate",
            "wd",
            "hello",
            "-n",
            &ns,
            "temporal.io/rollout-action=rollback",
        ],
        None,
    )
    .await;
    assert!(out.success, "{}", out.stderr);
    wait_annotation_removed(&client, &ns, "hello").await;
    let (kind, _, message) = wait_event(
        &client,
        &ns,
        "hello",
        "InvalidRolloutAction",
        "rollback",
        ANSWER,
    )
    .await;
    assert_eq!(kind, "Warning");
    assert!(
        message.contains("pause, resume, promote, abort, retry"),
        "{message}"
    );
}

#[tokio::test]
async fn the_cli_reports_usage_and_missing_resources_with_exit_codes() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "ctl-exit").await;
    let missing = twc(&["status", "nope", "-n", &ns]).await;
    assert_eq!(missing.code, Some(3), "{missing:?}");
    assert!(missing.stderr.contains("not found"), "{missing:?}");
    let missing = kubectl_twc(&["promote", "nope", "-n", &ns]).await;
    assert_eq!(missing.code, Some(3), "{missing:?}");
    let usage = twc(&["pause"]).await;
    assert_eq!(usage.code, Some(2), "{usage:?}");
    let usage = kubectl_twc(&["frobnicate", "hello"]).await;
    assert_eq!(usage.code, Some(2), "{usage:?}");
    assert!(usage.stderr.contains("kubectl twc"), "{usage:?}");
}

#[tokio::test]
async fn paused_in_the_spec_holds_the_ramp_and_the_step_timer() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "ctl-specpause").await;
    let deployment_name = format!("{ns}/hello");
    apply(&connection(&ns)).await;
    let steps = |paused: bool| {
        json!({ "strategy": "Progressive", "paused": paused, "steps": [
            { "rampPercentage": 30, "pauseDuration": "12s" },
            { "rampPercentage": 60, "pauseDuration": "12s" }
        ] })
    };
    apply(&worker(&ns, "hello", "v1", steps(false))).await;
    wait_ready(&client, &ns, "hello", ROLLOUT).await;

    apply(&worker(&ns, "hello", "v2", steps(false))).await;
    let v2 = wait_ramp(&deployment_name, "v2-", 30).await;
    let ramped_at = Instant::now();
    apply(&worker(&ns, "hello", "v2", steps(true))).await;
    wait_phase(&client, &ns, "hello", RolloutPhase::Paused).await;
    let (_, reason, _) = condition(
        &get_twd(&client, &ns, "hello")
            .await
            .unwrap_or_else(|e| panic!("{e}")),
        "Progressing",
    )
    .unwrap_or_default();
    assert_eq!(reason, "Paused");
    wait_event(
        &client,
        &ns,
        "hello",
        "Paused",
        "spec.rollout.paused",
        ANSWER,
    )
    .await;
    let out = kubectl(
        &[
            "get",
            "wd",
            "hello",
            "-n",
            &ns,
            "-o",
            "custom-columns=PHASE:.status.rollout.phase",
        ],
        None,
    )
    .await;
    assert!(
        out.stdout.contains("Paused"),
        "Phase column: {}",
        out.stdout
    );

    // Held past the end of the 12 s step: the ramp stays at 30%.
    let past_the_step = Duration::from_secs(16).saturating_sub(ramped_at.elapsed());
    let still_at_30 = || async {
        let r = routing(&deployment_name).await?;
        if r.ramping.as_deref() == Some(v2.as_str()) && r.percentage.round() as i64 == 30 {
            Ok(())
        } else {
            Err(format!("{r:?}"))
        }
    };
    holds_for("the ramp while paused", past_the_step, still_at_30).await;

    // A resume by an operator does not release a declarative hold.
    let out = kubectl_twc(&["resume", "hello", "-n", &ns]).await;
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("spec.rollout.paused"), "{out:?}");

    apply(&worker(&ns, "hello", "v2", steps(false))).await;
    wait_reason(&client, &ns, "hello", "Ready", "Ramping", ROLLOUT).await;
    // The step had most of its 12 s left when it was paused: it does not end at once.
    holds_for(
        "the rest of the step after resume",
        Duration::from_secs(4),
        still_at_30,
    )
    .await;
    wait_ramp(&deployment_name, "v2-", 60).await;
    wait_current(&deployment_name, &v2).await;
    wait_event(&client, &ns, "hello", "Resumed", &v2, ANSWER).await;
}

/// Gate workflow runs of the target: (workflow ID, status).
async fn gate_runs(client: &kube::Client, ns: &str) -> Vec<(String, String)> {
    get_twd(client, ns, "hello")
        .await
        .ok()
        .and_then(|t| t.status)
        .and_then(|s| s.target_version)
        .map(|t| {
            t.test_workflows
                .into_iter()
                .map(|w| (w.workflow_id, w.status))
                .collect()
        })
        .unwrap_or_default()
}

async fn wait_gate_attempt(client: &kube::Client, ns: &str, attempt: u32, status: &str) {
    wait_for(
        &format!("gate attempt {attempt} {status}"),
        ROLLOUT,
        || async {
            let runs = gate_runs(client, ns).await;
            let done = !runs.is_empty()
                && runs
                    .iter()
                    .all(|(id, s)| id.ends_with(&format!("/{attempt}")) && s == status);
            if done {
                Ok(())
            } else {
                Err(format!("{runs:?}"))
            }
        },
    )
    .await;
}

async fn list_workflows(query: &str) -> String {
    let out = temporal(&[
        "workflow",
        "list",
        "--namespace",
        &env().temporal_namespace,
        "--query",
        query,
    ])
    .await;
    assert!(out.success, "temporal workflow list: {}", out.stderr);
    out.stdout
}

#[tokio::test]
async fn retry_runs_a_failed_gate_again_through_each_path() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "ctl-retry").await;
    let deployment_name = format!("{ns}/hello");
    apply(&connection(&ns)).await;
    let gate_input = |fail: bool| {
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": "gate-input", "namespace": ns },
            "data": { "payload.json": json!({ "fail": fail }).to_string() }
        })
    };
    apply(&gate_input(true)).await;
    apply(&worker(
        &ns,
        "hello",
        "v1",
        json!({ "strategy": "AllAtOnce" }),
    ))
    .await;
    let v1 = target_build(&wait_ready(&client, &ns, "hello", ROLLOUT).await).unwrap_or_default();

    let gated = json!({ "strategy": "AllAtOnce", "gate": { "workflowType": "RolloutGate",
        "inputFrom": { "configMapKeyRef": { "name": "gate-input", "key": "payload.json" } } } });
    apply(&worker(&ns, "hello", "v2", gated)).await;
    wait_reason(&client, &ns, "hello", "Progressing", "GateFailed", ROLLOUT).await;
    wait_gate_attempt(&client, &ns, 1, "Failed").await;
    let v2 = target_build(
        &get_twd(&client, &ns, "hello")
            .await
            .unwrap_or_else(|e| panic!("{e}")),
    )
    .unwrap_or_default();
    let rollout_id = format!("rollout/{ns}/hello/{v2}");

    // "All stuck rollouts" is one visibility query.
    let blocked = format!("TwcOutcome='Blocked' AND TwcNamespace='{ns}'");
    wait_for("the blocked rollout is listed", ROLLOUT, || async {
        let listed = list_workflows(&blocked).await;
        if listed.contains(&rollout_id) {
            Ok(())
        } else {
            Err(listed)
        }
    })
    .await;

    // Retried while the input still fails: the gate runs again and fails again.
    send(Via::Annotation, "retry", &ns, "hello").await;
    wait_annotation_removed(&client, &ns, "hello").await;
    wait_event(&client, &ns, "hello", "Retrying", &v2, ANSWER).await;
    wait_gate_attempt(&client, &ns, 2, "Failed").await;
    send(Via::Temporal, "retry", &ns, "hello").await;
    wait_gate_attempt(&client, &ns, 3, "Failed").await;
    let r = routing(&deployment_name)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        r.current.as_deref(),
        Some(v1.as_str()),
        "routing untouched: {r:?}"
    );

    // Fixed input: the retried gate passes and the rollout completes.
    apply(&gate_input(false)).await;
    send(Via::Cli, "retry", &ns, "hello").await;
    wait_gate_attempt(&client, &ns, 4, "Completed").await;
    wait_current(&deployment_name, &v2).await;
    wait_ready(&client, &ns, "hello", ROLLOUT).await;

    // Nothing left to retry.
    let out = kubectl_twc(&["retry", "hello", "-n", &ns]).await;
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("retry"), "{out:?}");
    wait_for(
        "the rollout is no longer listed as blocked",
        ROLLOUT,
        || async {
            let listed = list_workflows(&blocked).await;
            if listed.contains(&rollout_id) {
                Err(listed)
            } else {
                Ok(())
            }
        },
    )
    .await;
}

#[tokio::test]
async fn rollouts_of_a_twd_are_listed_by_a_visibility_query() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "ctl-history").await;
    apply(&connection(&ns)).await;
    apply(&worker(
        &ns,
        "hello",
        "v1",
        json!({ "strategy": "AllAtOnce" }),
    ))
    .await;
    let v1 = target_build(&wait_ready(&client, &ns, "hello", ROLLOUT).await).unwrap_or_default();
    apply(&worker(
        &ns,
        "hello",
        "v2",
        json!({ "strategy": "AllAtOnce" }),
    ))
    .await;
    let v2 = target_build(&wait_ready(&client, &ns, "hello", ROLLOUT).await).unwrap_or_default();
    assert!(v2.starts_with("v2-"), "{v2}");

    let query = format!("TwcName='hello' AND TwcNamespace='{ns}'");
    let listed = wait_for("both rollouts are listed", ROLLOUT, || async {
        let listed = list_workflows(&query).await;
        let both = [&v1, &v2]
            .iter()
            .all(|b| listed.contains(&format!("rollout/{ns}/hello/{b}")));
        if both { Ok(listed) } else { Err(listed) }
    })
    .await;
    assert!(!listed.contains("gate/"), "only rollouts: {listed}");
    // A rollout records its outcome as it ends, which can be after the TWD shows it Ready,
    // and the visibility store indexes it moments later: wait for both.
    let complete_query = format!("{query} AND TwcOutcome='Complete'");
    wait_for("both rollouts are listed Complete", ROLLOUT, || async {
        let complete = list_workflows(&complete_query).await;
        if complete.contains(&v1) && complete.contains(&v2) {
            Ok(())
        } else {
            Err(complete)
        }
    })
    .await;

    // `twc status` shows the same history, with Web UI links.
    let out = twc(&[
        "status",
        "hello",
        "-n",
        &ns,
        "--ui-url",
        "http://127.0.0.1:8233",
    ])
    .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    for text in [
        "Recent rollouts",
        v1.as_str(),
        v2.as_str(),
        "Complete",
        "http://127.0.0.1:8233/namespaces/",
        "rollout%2F",
        "Events",
        "RolloutComplete",
    ] {
        assert!(
            out.stdout.contains(text),
            "status shows {text:?}:\n{}",
            out.stdout
        );
    }
}

#[tokio::test]
async fn pause_on_a_completed_rollout_is_rejected_with_its_reason() {
    let (_, ns, v1) = hello_ready("ctl-ended", json!({ "strategy": "AllAtOnce" })).await;

    let out = kubectl_twc(&["pause", "hello", "-n", &ns]).await;
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(
        out.stderr
            .contains(&format!("rejected: pause: build {v1} is already Current")),
        "the rejection says why: {out:?}"
    );
    assert!(!out.stdout.contains("accepted"), "{out:?}");
}

#[tokio::test]
async fn an_applicable_control_through_the_cli_is_accepted_with_what_it_does() {
    let (client, ns, _) = hello_ready("ctl-update", slow_steps()).await;
    let deployment_name = format!("{ns}/hello");
    apply(&worker(&ns, "hello", "v2", slow_steps())).await;
    let v2 = wait_ramp(&deployment_name, "v2-", 30).await;

    // The rollout's validator refuses what does not apply, with the reason.
    let out = kubectl_twc(&["retry", "hello", "-n", &ns]).await;
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(
        out.stderr.contains("rejected: retry: nothing to retry"),
        "{out:?}"
    );

    let out = kubectl_twc(&["pause", "hello", "-n", &ns]).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        out.stdout.contains(&format!(
            "accepted: pause: the rollout of build {v2} holds where it is"
        )),
        "{out:?}"
    );
    wait_phase(&client, &ns, "hello", RolloutPhase::Paused).await;
    wait_event(&client, &ns, "hello", "Paused", "an operator", ANSWER).await;

    // The control reached the TWD workflow as its `control` update (the one entry point),
    // which forwarded it to the rollout as a signal.
    let show = |workflow_id: String| async move {
        let history = temporal(&[
            "workflow",
            "show",
            "--namespace",
            &env().temporal_namespace,
            "--workflow-id",
            &workflow_id,
            "--output",
            "json",
        ])
        .await;
        assert!(history.success, "{}", history.stderr);
        history.stdout.replace(['_', ' ', '\n'], "").to_lowercase()
    };
    let twd_history = show(format!("twd/{ns}/hello")).await;
    assert!(
        twd_history.contains("workflowexecutionupdateaccepted"),
        "no accepted update in the history of twd/{ns}/hello"
    );
    let rollout_history = show(format!("rollout/{ns}/hello/{v2}")).await;
    assert!(
        rollout_history.contains("\"signalname\":\"control\""),
        "no control signal in the history of the rollout of {v2}"
    );
}

#[tokio::test]
async fn the_cli_finds_the_sandbox_temporal_through_the_env_file_the_sandbox_prints() {
    let (_, ns, v1) = hello_ready("ctl-devenv", json!({ "strategy": "AllAtOnce" })).await;

    // Only KUBECONFIG and TWC_ENV_FILE are set, as after the exports `make dev` prints.
    let out = kubectl_twc_in(env(), &["status", "hello", "-n", &ns]).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        !out.stdout.contains("not reachable"),
        "status reached the engine: {}",
        out.stdout
    );
    for text in ["Recent rollouts", v1.as_str()] {
        assert!(
            out.stdout.contains(text),
            "status shows {text:?}:\n{}",
            out.stdout
        );
    }
    let out = kubectl_twc_in(env(), &["promote", "hello", "-n", &ns]).await;
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("rejected: promote:"), "{out:?}");
}

/// Waits until every controller of `sandbox` has signalled the TWD `namespace/name` (each
/// watcher sees it).
async fn wait_seen_by_every_controller(
    cluster: &Cluster,
    sandbox: &Sandbox,
    namespace: &str,
    name: &str,
) {
    let sign = format!("twd={namespace}/{name}");
    cluster
        .wait(
            &format!("every controller signalled {namespace}/{name}"),
            ROLLOUT,
            || async {
                let logs = sandbox.controller_logs();
                let silent: Vec<_> = logs
                    .iter()
                    .filter(|log| {
                        !std::fs::read_to_string(log)
                            .unwrap_or_default()
                            .lines()
                            .any(|l| l.contains("signalled TWD workflow") && l.contains(&sign))
                    })
                    .collect();
                if logs.len() >= 2 && silent.is_empty() {
                    Ok(())
                } else {
                    Err(format!("{} controllers, silent: {silent:?}", logs.len()))
                }
            },
        )
        .await;
}

#[tokio::test]
async fn two_replicas_apply_an_annotation_control_exactly_once() {
    let Private {
        mut sandbox,
        cluster,
    } = Private::start("ctl-replicas").await;
    sandbox
        .start_extra_controller()
        .unwrap_or_else(|e| panic!("starting a second controller: {e:#}"));
    let ns = cluster.namespace("ctl-replicas").await;
    cluster.apply(&cluster.connection(&ns, "dev")).await;
    cluster
        .apply(&worker(
            &ns,
            "hello",
            "v1",
            json!({ "strategy": "AllAtOnce" }),
        ))
        .await;
    cluster.wait_ready(&ns, "hello", "v1", ROLLOUT).await;
    cluster
        .apply(&worker(&ns, "hello", "v2", json!({ "strategy": "Manual" })))
        .await;
    cluster
        .wait_reason(&ns, "hello", "Ready", "WaitingForPromotion", ROLLOUT)
        .await;
    wait_seen_by_every_controller(&cluster, &sandbox, &ns, "hello").await;

    let out = kubectl_twc_in(
        &cluster.env,
        &["promote", "hello", "-n", &ns, "--via-annotation"],
    )
    .await;
    assert_eq!(out.code, Some(0), "{out:?}\n{}", cluster.logs());
    assert!(
        out.stdout.contains("accepted: PromotedByOperator"),
        "{out:?}"
    );
    let twd = cluster.wait_ready(&ns, "hello", "v2", ROLLOUT).await;
    let v2 = target_build(&twd).unwrap_or_default();

    // One replica sent it: one promotion, and no second delivery answered as a control that
    // changes nothing (it would arrive within moments of the first).
    let answers = |events: Vec<EventRow>| -> Vec<EventRow> {
        events
            .into_iter()
            .filter(|(_, reason, _)| {
                ["PromotedByOperator", "ControlUnchanged", "ControlIgnored"]
                    .contains(&reason.as_str())
            })
            .collect()
    };
    let only_the_promotion = || async {
        let seen = answers(events(&cluster.client, &ns, "hello").await);
        match seen.as_slice() {
            [(_, reason, message)] if reason == "PromotedByOperator" && message.contains(&v2) => {
                Ok(())
            }
            _ => Err(format!("control answers: {seen:?}")),
        }
    };
    holds_for(
        "exactly one answer to the annotation",
        Duration::from_secs(5),
        only_the_promotion,
    )
    .await;
    let sent: usize = sandbox
        .controller_logs()
        .iter()
        .map(|log| {
            std::fs::read_to_string(log)
                .unwrap_or_default()
                .lines()
                .filter(|l| {
                    l.contains("rollout action annotation accepted")
                        && l.contains(&format!("twd={ns}/hello"))
                })
                .count()
        })
        .sum();
    assert_eq!(sent, 1, "controllers that sent the control");
    sandbox.stop().await;
}
