//! Notifications end to end: a real webhook receiver in the test process gets the events of a
//! worker deployment's rollouts through `spec.notifications`, once per event (by idempotency
//! key) and in order, across a controller SIGKILL and after a minute of 500 answers; a target
//! that fails shows as the `NotificationsDelivered` condition and holds up neither the rollout
//! nor the other targets; operator and failure events reach a cluster-wide Slack target and
//! the targets that chose them.

use std::time::Duration;

use serde_json::{Value, json};

use crate::chaos::cluster::Private;
use crate::harness::controls::holds_for;
use crate::harness::twd::{apply, condition, connection, get_twd, wait_ready, worker};
use crate::harness::wait::wait_for;
use crate::harness::webhook::{Receiver, events, notifications, url_secret, wait_delivered};
use crate::harness::{kube_client, test_namespace};

const ROLLOUT: Duration = Duration::from_secs(120);
const CONDITION: &str = "NotificationsDelivered";

fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    expected
        .iter()
        .map(|(e, r)| ((*e).to_owned(), (*r).to_owned()))
        .collect()
}

/// Every POST of a key carries the same body and names that key in its header too.
fn assert_duplicates_identical(receiver: &Receiver) {
    let received = receiver.received();
    for r in &received {
        let key = r.body["idempotencyKey"].as_str().unwrap_or_default();
        assert!(
            !key.is_empty(),
            "a payload without idempotency key: {}",
            r.body
        );
        assert_eq!(
            r.key_header.as_deref(),
            Some(key),
            "header and payload keys"
        );
        for other in received.iter().filter(|o| o.body["idempotencyKey"] == key) {
            assert_eq!(other.body, r.body, "two payloads of key {key}");
        }
    }
}

#[tokio::test]
async fn every_event_of_a_progressive_rollout_arrives_once_and_in_order_across_a_sigkill() {
    let receiver = Receiver::start().await;
    let mut private = Private::start("notify-sigkill").await;
    let cluster = &private.cluster;
    let ns = cluster.namespace("notify").await;
    cluster.apply(&cluster.connection(&ns, "dev")).await;
    cluster.apply(&url_secret(&ns, "hook", &receiver.url)).await;
    let progressive = json!({ "strategy": "Progressive", "steps": [
        { "rampPercentage": 25, "pauseDuration": "8s" },
        { "rampPercentage": 50, "pauseDuration": "8s" } ] });
    let with_notifications = |tag: &str| {
        let mut manifest = worker(&ns, "hello", tag, progressive.clone());
        manifest["spec"]["notifications"] = notifications("ops", "hook");
        manifest
    };
    cluster.apply(&with_notifications("v1")).await;
    cluster.wait_ready(&ns, "hello", "v1", ROLLOUT).await;
    // The first build has no Current to ramp from: it becomes Current at once.
    let first = pairs(&[
        ("RolloutStarted", "DeploymentCreated"),
        ("Promoted", "Promoted"),
        ("RolloutComplete", "RolloutComplete"),
    ]);
    let delivered = wait_delivered(&receiver, first.len(), ROLLOUT).await;
    assert_eq!(events(&delivered), first);

    cluster.apply(&with_notifications("v2")).await;
    // Killed while the first step holds, just after its notification went out.
    cluster
        .wait("the 25% step notified", ROLLOUT, || async {
            let delivered = receiver.delivered();
            if delivered
                .iter()
                .any(|b| b["message"].as_str().is_some_and(|m| m.contains("25%")))
            {
                Ok(())
            } else {
                Err(format!("delivered {:?}", events(&delivered)))
            }
        })
        .await;
    assert!(private.sandbox.kill_controller().await.is_some());
    assert!(private.sandbox.restart_dead_controller().is_some());
    let cluster = &private.cluster;
    cluster.wait_ready(&ns, "hello", "v2", ROLLOUT).await;
    let mut all = first.clone();
    all.extend(pairs(&[
        ("RolloutStarted", "DeploymentCreated"),
        ("StepReached", "Ramped"),
        ("StepReached", "Ramped"),
        ("Promoted", "Promoted"),
        ("RolloutComplete", "RolloutComplete"),
    ]));
    let delivered = wait_delivered(&receiver, all.len(), ROLLOUT).await;
    assert_eq!(events(&delivered), all, "{delivered:#?}");
    let ramps: Vec<&str> = delivered
        .iter()
        .filter(|b| b["event"] == "StepReached")
        .filter_map(|b| b["message"].as_str())
        .collect();
    assert!(
        ramps[0].ends_with("25%") && ramps[1].ends_with("50%"),
        "{ramps:?}"
    );
    assert!(
        delivered
            .iter()
            .all(|b| b["workerDeployment"]["name"] == "hello"
                && b["workerDeployment"]["namespace"] == ns.as_str())
    );
    assert_duplicates_identical(&receiver);
    holds_for(
        "no notification after the last",
        Duration::from_secs(5),
        || async {
            let delivered = receiver.delivered();
            if delivered.len() == all.len() {
                Ok(())
            } else {
                Err(format!("delivered {:?}", events(&delivered)))
            }
        },
    )
    .await;
    private.sandbox.stop().await;
}

#[tokio::test]
async fn a_receiver_failing_for_a_minute_gets_the_events_afterwards_and_the_condition_clears() {
    let receiver = Receiver::start().await;
    receiver.fail_for(Duration::from_secs(60));
    // A second target that answers: the failing one holds up none of its notifications.
    let healthy = Receiver::start().await;
    let client = kube_client().await;
    let ns = test_namespace(&client, "notify-500").await;
    apply(&connection(&ns)).await;
    apply(&url_secret(&ns, "hook", &receiver.url)).await;
    apply(&url_secret(&ns, "team-hook", &healthy.url)).await;
    let mut manifest = worker(&ns, "hello", "v1", json!({ "strategy": "AllAtOnce" }));
    let mut targets = notifications("ops", "hook");
    if let Some(list) = targets["targets"].as_array_mut() {
        list.extend(
            notifications("team", "team-hook")["targets"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
        );
    }
    manifest["spec"]["notifications"] = targets;
    apply(&manifest).await;

    // The rollout does not wait for the webhook.
    wait_ready(&client, &ns, "hello", ROLLOUT).await;
    let (status, _, message) = wait_for("the failing target shown", ROLLOUT, || async {
        let twd = get_twd(&client, &ns, "hello").await?;
        match condition(&twd, CONDITION) {
            Some(c) if c.1 == "NotificationDeliveryFailed" => Ok(c),
            other => Err(format!("{CONDITION}: {other:?}")),
        }
    })
    .await;
    assert_eq!(status, "False");
    assert!(
        message.contains("target ops") && message.contains("500") && !message.contains("team"),
        "{message}"
    );

    let expected = pairs(&[
        ("RolloutStarted", "DeploymentCreated"),
        ("Promoted", "Promoted"),
        ("RolloutComplete", "RolloutComplete"),
    ]);
    // The healthy target has every event, in order, while the other still refuses them.
    let told = wait_delivered(&healthy, expected.len(), Duration::from_secs(45)).await;
    assert_eq!(events(&told), expected);
    assert!(
        receiver.delivered().is_empty() && receiver.failing(),
        "the failing receiver still refuses: {:?}",
        events(&receiver.delivered())
    );

    let delivered = wait_delivered(&receiver, expected.len(), Duration::from_secs(150)).await;
    assert_eq!(events(&delivered), expected);
    assert!(
        receiver.received().iter().any(|r| r.status == 500),
        "the receiver refused some tries"
    );
    assert_duplicates_identical(&receiver);
    assert_duplicates_identical(&healthy);
    assert_eq!(events(&healthy.delivered()), expected, "told once each");
    wait_for("the condition cleared", ROLLOUT, || async {
        let twd = get_twd(&client, &ns, "hello").await?;
        match condition(&twd, CONDITION) {
            None => Ok(()),
            Some(c) => Err(format!("{CONDITION}: {c:?}")),
        }
    })
    .await;
}

#[tokio::test]
async fn a_missing_secret_is_a_condition_with_its_reason_and_the_rollout_completes() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "notify-nosecret").await;
    apply(&connection(&ns)).await;
    let mut manifest = worker(&ns, "hello", "v1", json!({ "strategy": "AllAtOnce" }));
    manifest["spec"]["notifications"] = notifications("ops", "missing");
    apply(&manifest).await;
    wait_ready(&client, &ns, "hello", ROLLOUT).await;
    let (status, _, message) = wait_for("the missing Secret shown", ROLLOUT, || async {
        let twd = get_twd(&client, &ns, "hello").await?;
        match condition(&twd, CONDITION) {
            Some(c) if c.1 == "NotificationSecretNotFound" => Ok(c),
            other => Err(format!("{CONDITION}: {other:?}")),
        }
    })
    .await;
    assert_eq!(status, "False");
    assert!(
        message.contains("target ops") && message.contains(&format!("Secret {ns}/missing")),
        "{message}"
    );
}

/// The Slack texts of `bodies`, each cut after the worker deployment's name.
fn slack_heads(bodies: &[Value]) -> Vec<String> {
    bodies
        .iter()
        .map(|b| {
            let text = b["text"].as_str().unwrap_or_default();
            text.split(':').next().unwrap_or_default().to_owned()
        })
        .collect()
}

#[tokio::test]
async fn operator_and_failure_events_reach_a_cluster_wide_slack_target_and_the_targets_that_chose_them()
 {
    let platform = Receiver::start().await;
    let team = Receiver::start().await;
    let mut private = Private::start("notify-cluster").await;
    // A cluster-wide target, its Secret in the controller's own namespace, told only of the
    // events a platform team chose.
    let created = private
        .cluster
        .kubectl(&["create", "namespace", "twc-system"], None)
        .await;
    assert!(created.success, "{}", created.stderr);
    private
        .cluster
        .apply(&url_secret("twc-system", "platform-hook", &platform.url))
        .await;
    let cluster_targets = json!({ "targets": [ {
        "name": "platform",
        "format": "Slack",
        "urlSecretRef": { "name": "platform-hook", "key": "url" },
        "events": ["WaitingForPromotion", "Paused", "Aborted", "GateFailed"]
    } ] });
    if let Err(e) = private
        .sandbox
        .restart_controller_with_env(&[
            ("POD_NAMESPACE", "twc-system"),
            ("TWC_CLUSTER_NOTIFICATIONS", &cluster_targets.to_string()),
        ])
        .await
    {
        panic!("restarting the controller with cluster-wide targets: {e:#}");
    }
    let cluster = &private.cluster;
    let ns = cluster.namespace("notify-cluster").await;
    cluster.apply(&cluster.connection(&ns, "dev")).await;
    cluster
        .apply(&url_secret(&ns, "team-hook", &team.url))
        .await;
    // The worker deployment's own target wants two events only.
    let manifest = |tag: &str, rollout: Value| {
        let mut manifest = worker(&ns, "hello", tag, rollout);
        manifest["spec"]["notifications"] = json!({ "targets": [ {
            "name": "team",
            "urlSecretRef": { "name": "team-hook", "key": "url" },
            "events": ["Aborted", "GateFailed"]
        } ] });
        manifest
    };
    cluster
        .apply(&manifest("v1", json!({ "strategy": "AllAtOnce" })))
        .await;
    cluster.wait_ready(&ns, "hello", "v1", ROLLOUT).await;

    // A Manual rollout waits, is paused and aborted by an operator.
    cluster
        .apply(&manifest("v2", json!({ "strategy": "Manual" })))
        .await;
    cluster
        .wait_reason(&ns, "hello", "Progressing", "WaitingForPromotion", ROLLOUT)
        .await;
    cluster.control(&ns, "hello", "pause").await;
    cluster
        .wait_reason(&ns, "hello", "Progressing", "Paused", ROLLOUT)
        .await;
    cluster.control(&ns, "hello", "abort").await;
    cluster
        .wait_reason(&ns, "hello", "Progressing", "Aborted", ROLLOUT)
        .await;
    // The next build's gate fails.
    let gated = json!({ "strategy": "AllAtOnce", "gate": { "workflowType": "GateFail" } });
    cluster.apply(&manifest("v3", gated)).await;
    cluster
        .wait_reason(&ns, "hello", "Progressing", "GateFailed", ROLLOUT)
        .await;

    let heads: Vec<String> = ["WaitingForPromotion", "Paused", "Aborted", "GateFailed"]
        .iter()
        .map(|event| format!("*{event}* {ns}/hello"))
        .collect();
    let told = wait_delivered(&platform, heads.len(), ROLLOUT).await;
    assert_eq!(slack_heads(&told), heads, "{told:#?}");
    let expected = pairs(&[("Aborted", "Aborted"), ("GateFailed", "GateFailed")]);
    let delivered = wait_delivered(&team, expected.len(), ROLLOUT).await;
    assert_eq!(events(&delivered), expected, "{delivered:#?}");
    assert_duplicates_identical(&team);
    holds_for(
        "nothing more to either target",
        Duration::from_secs(3),
        || async {
            let (p, t) = (platform.delivered(), team.delivered());
            if p.len() == heads.len() && t.len() == expected.len() {
                Ok(())
            } else {
                Err(format!(
                    "platform {:?}, team {:?}",
                    slack_heads(&p),
                    events(&t)
                ))
            }
        },
    )
    .await;
    let twd = match get_twd(&cluster.client, &ns, "hello").await {
        Ok(twd) => twd,
        Err(e) => panic!("reading the worker deployment: {e}"),
    };
    assert_eq!(condition(&twd, CONDITION), None, "every target delivered");
    private.sandbox.stop().await;
}
