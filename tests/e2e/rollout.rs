//! The rollout engine end to end: real controller, real Temporal, real kube-apiserver, sample
//! workers run by the pod runner. Each test asserts TWD status, Deployments and the routing
//! read back from Temporal.

use std::time::Duration;

use kube::api::{Api, DeleteParams};
use serde_json::json;

use crate::harness::twd::{
    apply, condition, connection, deployments, get_twd, routing, target_build, wait_ready,
    wait_reason, worker,
};
use crate::harness::wait::wait_for;
use crate::harness::{kube_client, test_namespace};

const ROLLOUT: Duration = Duration::from_secs(120);

fn all_at_once() -> serde_json::Value {
    json!({ "strategy": "AllAtOnce" })
}

async fn current_build(deployment_name: &str, expected: &str) {
    wait_for(
        &format!("Temporal current version of {deployment_name} = {expected}"),
        ROLLOUT,
        || async {
            let r = routing(deployment_name).await?;
            if r.current.as_deref() == Some(expected) {
                Ok(())
            } else {
                Err(format!("{r:?}"))
            }
        },
    )
    .await;
}

#[tokio::test]
async fn all_at_once_promotes_each_version_and_retires_the_old_one() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "allatonce").await;
    let deployment_name = format!("{ns}/hello");
    apply(&connection(&ns)).await;
    apply(&worker(&ns, "hello", "v1", all_at_once())).await;
    let twd = wait_ready(&client, &ns, "hello", ROLLOUT).await;
    let first = target_build(&twd).unwrap_or_default();
    assert!(first.starts_with("v1-"), "build ID {first}");
    current_build(&deployment_name, &first).await;
    let deps = deployments(&client, &ns, "hello").await;
    assert_eq!(deps.len(), 1, "{deps:?}");
    assert_eq!(deps[0].2, Some(1));

    apply(&worker(&ns, "hello", "v2", all_at_once())).await;
    let twd = wait_ready(&client, &ns, "hello", ROLLOUT).await;
    let second = target_build(&twd).unwrap_or_default();
    assert!(
        second.starts_with("v2-") && second != first,
        "build ID {second}"
    );
    current_build(&deployment_name, &second).await;

    wait_for(
        "the first version's Deployment and Temporal version are deleted",
        ROLLOUT,
        || async {
            let deps = deployments(&client, &ns, "hello").await;
            let r = routing(&deployment_name).await?;
            let gone = deps.iter().all(|d| d.1 != first) && !r.versions.contains(&first);
            if gone {
                Ok(())
            } else {
                Err(format!("deployments {deps:?}; versions {:?}", r.versions))
            }
        },
    )
    .await;
    let deps = deployments(&client, &ns, "hello").await;
    assert_eq!(
        deps.iter().map(|d| d.1.clone()).collect::<Vec<_>>(),
        vec![second]
    );
}

#[tokio::test]
async fn manual_registers_but_never_promotes_even_with_a_passing_gate() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "manual").await;
    let deployment_name = format!("{ns}/hello");
    apply(&connection(&ns)).await;
    let rollout = json!({ "strategy": "Manual", "gate": { "workflowType": "GatePass" } });
    apply(&worker(&ns, "hello", "v1", rollout)).await;
    let (status, _, _) = wait_reason(
        &client,
        &ns,
        "hello",
        "Ready",
        "WaitingForPromotion",
        ROLLOUT,
    )
    .await;
    assert_eq!(status, "False");
    let twd = wait_for(
        "the gate passed and the version waits for promotion",
        ROLLOUT,
        || async {
            let twd = get_twd(&client, &ns, "hello").await?;
            let target = twd.status.as_ref().and_then(|s| s.target_version.clone());
            let passed = target.is_some_and(|t| {
                !t.test_workflows.is_empty()
                    && t.test_workflows.iter().all(|w| w.status == "Completed")
            });
            if passed {
                Ok(twd)
            } else {
                Err(format!("{:?}", twd.status))
            }
        },
    )
    .await;
    let (status, reason, _) = condition(&twd, "Ready").unwrap_or_default();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "WaitingForPromotion")
    );
    let build = target_build(&twd).unwrap_or_default();
    let r = routing(&deployment_name)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(r.versions.contains(&build), "registered: {r:?}");
    assert_eq!(r.current, None, "Manual must not route: {r:?}");
    assert_eq!(r.ramping, None, "Manual must not route: {r:?}");
}

#[tokio::test]
async fn progressive_ramps_through_each_step_then_becomes_current() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "progressive").await;
    let deployment_name = format!("{ns}/hello");
    apply(&connection(&ns)).await;
    // Each step lasts long enough for a poll of the routing to land in it: a poll is a CLI call
    // and a TWD read, at most a second apart, and with 3 s steps one loaded run saw neither.
    let rollout = json!({ "strategy": "Progressive", "steps": [
        { "rampPercentage": 30, "pauseDuration": "10s" },
        { "rampPercentage": 60, "pauseDuration": "10s" }
    ] });
    apply(&worker(&ns, "hello", "v1", rollout.clone())).await;
    // No Current yet: the first version becomes Current directly.
    let twd = wait_ready(&client, &ns, "hello", ROLLOUT).await;
    let first = target_build(&twd).unwrap_or_default();
    current_build(&deployment_name, &first).await;

    let applied = std::time::Instant::now();
    apply(&worker(&ns, "hello", "v2", rollout)).await;
    let seen = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    // Every poll's outcome and when it began and ended after v2's apply (whether a poll could
    // land in a step), for the assertion's message.
    let polls = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let second = wait_for(
        "v2 ramps 30% then 60% then becomes Current",
        ROLLOUT,
        || {
            let seen = seen.clone();
            let polls = polls.clone();
            let client = &client;
            let ns = &ns;
            let deployment_name = &deployment_name;
            async move {
                let began = applied.elapsed();
                let polled = async {
                    let r = routing(deployment_name).await?;
                    let twd = get_twd(client, ns, "hello").await?;
                    Ok::<_, String>((r, twd))
                }
                .await;
                polls.borrow_mut().push(match &polled {
                    Ok((r, twd)) => format!(
                        "{began:?}..{:?}: ramping {:?} at {}, current {:?}, target {:?}",
                        applied.elapsed(),
                        r.ramping,
                        r.percentage,
                        r.current,
                        target_build(twd)
                    ),
                    Err(e) => format!("{began:?}..{:?}: {e}", applied.elapsed()),
                });
                let (r, twd) = polled?;
                let mut seen = seen.borrow_mut();
                let target = target_build(&twd).unwrap_or_default();
                if r.ramping.as_deref() == Some(target.as_str()) {
                    let pct = r.percentage.round() as i64;
                    if seen.last() != Some(&pct) {
                        seen.push(pct);
                    }
                }
                if r.current.as_deref() == Some(target.as_str()) && target.starts_with("v2-") {
                    Ok(target)
                } else {
                    Err(format!("routing {r:?}, ramps seen {seen:?}"))
                }
            }
        },
    )
    .await;
    assert_eq!(
        *seen.borrow(),
        vec![30, 60],
        "ramp steps observed in order; the polls: {:#?}",
        polls.borrow()
    );
    let twd = wait_ready(&client, &ns, "hello", ROLLOUT).await;
    assert_eq!(target_build(&twd).as_deref(), Some(second.as_str()));
}

#[tokio::test]
async fn failing_gate_stops_with_gate_failed_and_leaves_routing_untouched() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "gatefail").await;
    let deployment_name = format!("{ns}/hello");
    apply(&connection(&ns)).await;
    apply(&worker(&ns, "hello", "v1", all_at_once())).await;
    let twd = wait_ready(&client, &ns, "hello", ROLLOUT).await;
    let first = target_build(&twd).unwrap_or_default();

    let rollout = json!({ "strategy": "AllAtOnce", "gate": { "workflowType": "RolloutGate", "input": { "fail": true } } });
    apply(&worker(&ns, "hello", "v2", rollout)).await;
    let (status, _, message) =
        wait_reason(&client, &ns, "hello", "Progressing", "GateFailed", ROLLOUT).await;
    assert_eq!(status, "False");
    assert!(message.contains("RolloutGate"), "{message}");
    let r = routing(&deployment_name)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        r.current.as_deref(),
        Some(first.as_str()),
        "routing untouched: {r:?}"
    );
    assert_eq!(r.ramping, None);
    wait_for("the failed build is scaled to zero", ROLLOUT, || async {
        let deps = deployments(&client, &ns, "hello").await;
        let failed = deps.iter().find(|d| d.1 != first).cloned();
        match failed {
            Some((_, _, Some(0))) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

#[tokio::test]
async fn gate_input_from_a_config_map_reaches_the_gate_workflow() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "gateinput").await;
    apply(&connection(&ns)).await;
    apply(&json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": "gate-input", "namespace": ns },
        "data": { "payload.json": "{\"checks\":[\"smoke\"],\"fail\":false}" }
    }))
    .await;
    let rollout = json!({ "strategy": "AllAtOnce", "gate": { "workflowType": "RolloutGate",
        "inputFrom": { "configMapKeyRef": { "name": "gate-input", "key": "payload.json" } } } });
    apply(&worker(&ns, "hello", "v1", rollout)).await;
    let twd = wait_ready(&client, &ns, "hello", ROLLOUT).await;
    let runs = twd
        .status
        .as_ref()
        .and_then(|s| s.target_version.as_ref())
        .map(|t| t.test_workflows.clone())
        .unwrap_or_default();
    assert!(!runs.is_empty(), "gate runs recorded: {:?}", twd.status);
    let result = crate::harness::cli::temporal(&[
        "workflow",
        "result",
        "--workflow-id",
        &runs[0].workflow_id,
        "--output",
        "json",
    ])
    .await;
    assert!(result.success, "{}", result.stderr);
    assert!(
        result.stdout.contains("smoke"),
        "gate result carries its input: {}",
        result.stdout
    );
}

#[tokio::test]
async fn rollback_to_a_recent_current_build_is_promoted_at_once() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "rollback").await;
    let deployment_name = format!("{ns}/hello");
    apply(&connection(&ns)).await;
    let slow = json!({ "strategy": "Progressive", "steps": [ { "rampPercentage": 10, "pauseDuration": "10m" } ] });
    apply(&worker(&ns, "hello", "v1", slow.clone())).await;
    let first = target_build(&wait_ready(&client, &ns, "hello", ROLLOUT).await).unwrap_or_default();
    apply(&worker(&ns, "hello", "v2", all_at_once())).await;
    let second =
        target_build(&wait_ready(&client, &ns, "hello", ROLLOUT).await).unwrap_or_default();
    assert_ne!(first, second);
    // Back to v1 with a 10-minute step: a rollback skips the steps.
    apply(&worker(&ns, "hello", "v1", slow)).await;
    let back = target_build(&wait_ready(&client, &ns, "hello", ROLLOUT).await).unwrap_or_default();
    assert_eq!(back, first);
    current_build(&deployment_name, &first).await;
}

#[tokio::test]
async fn missing_connection_is_reported_and_creating_it_resumes_the_rollout() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "noconn").await;
    apply(&worker(&ns, "hello", "v1", all_at_once())).await;
    let (status, _, message) = wait_reason(
        &client,
        &ns,
        "hello",
        "Progressing",
        "TemporalConnectionNotFound",
        ROLLOUT,
    )
    .await;
    assert_eq!(status, "False");
    assert!(message.contains("dev"), "{message}");
    apply(&connection(&ns)).await;
    wait_ready(&client, &ns, "hello", ROLLOUT).await;
}

#[tokio::test]
async fn deleting_a_twd_returns_routing_to_unversioned_and_removes_everything() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "delete").await;
    let deployment_name = format!("{ns}/hello");
    apply(&connection(&ns)).await;
    apply(&worker(&ns, "hello", "v1", all_at_once())).await;
    let twd = wait_ready(&client, &ns, "hello", ROLLOUT).await;
    assert!(
        twd.metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == twc_crds::labels::DELETE_PROTECTION_FINALIZER)
    );
    let api: Api<twc_crds::WorkerDeployment> = Api::namespaced(client.clone(), &ns);
    if let Err(e) = api.delete("hello", &DeleteParams::default()).await {
        panic!("deleting TWD: {e}");
    }
    wait_for(
        "TWD, Deployments and the Temporal worker deployment are gone",
        ROLLOUT,
        || async {
            let twd_gone = matches!(api.get_opt("hello").await, Ok(None));
            let deps = deployments(&client, &ns, "hello").await;
            let r = routing(&deployment_name).await?;
            if twd_gone && deps.is_empty() && !r.exists {
                Ok(())
            } else {
                Err(format!(
                    "twd gone {twd_gone}, deployments {deps:?}, routing {r:?}"
                ))
            }
        },
    )
    .await;
    let conn = crate::harness::cli::kubectl(
        &[
            "get",
            "connection",
            "dev",
            "-n",
            &ns,
            "-o",
            "jsonpath={.metadata.finalizers}",
        ],
        None,
    )
    .await;
    assert!(
        !conn.stdout.contains("delete-protection"),
        "connection finalizer released: {}",
        conn.stdout
    );
}
