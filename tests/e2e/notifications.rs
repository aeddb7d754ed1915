//! Notifications end to end: a real webhook receiver in the test process gets the events of a
//! worker deployment's rollouts through `spec.notifications`, once per event (by idempotency
//! key) and in order, across a controller SIGKILL and after a minute of 500 answers; a target
//! that fails shows as the `NotificationsDelivered` condition and never holds the rollout.

use std::time::Duration;

use serde_json::{Value, json};

use crate::chaos::cluster::Private;
use crate::harness::controls::holds_for;
use crate::harness::twd::{apply, condition, connection, get_twd, wait_ready, worker};
use crate::harness::wait::wait_for;
use crate::harness::webhook::{Receiver, events, notifications, url_secret};
use crate::harness::{kube_client, test_namespace};

const ROLLOUT: Duration = Duration::from_secs(120);
const CONDITION: &str = "NotificationsDelivered";

fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    expected
        .iter()
        .map(|(e, r)| ((*e).to_owned(), (*r).to_owned()))
        .collect()
}

/// Waits until the receiver has delivered `count` notifications (once per key).
async fn wait_delivered(receiver: &Receiver, count: usize, timeout: Duration) -> Vec<Value> {
    wait_for(
        &format!("{count} notifications delivered"),
        timeout,
        || async {
            let delivered = receiver.delivered();
            if delivered.len() >= count {
                Ok(delivered)
            } else {
                Err(format!("delivered {:?}", events(&delivered)))
            }
        },
    )
    .await
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
    let client = kube_client().await;
    let ns = test_namespace(&client, "notify-500").await;
    apply(&connection(&ns)).await;
    apply(&url_secret(&ns, "hook", &receiver.url)).await;
    let mut manifest = worker(&ns, "hello", "v1", json!({ "strategy": "AllAtOnce" }));
    manifest["spec"]["notifications"] = notifications("ops", "hook");
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
        message.contains("target ops") && message.contains("500"),
        "{message}"
    );
    assert!(receiver.delivered().is_empty());

    let expected = pairs(&[
        ("RolloutStarted", "DeploymentCreated"),
        ("Promoted", "Promoted"),
        ("RolloutComplete", "RolloutComplete"),
    ]);
    let delivered = wait_delivered(&receiver, expected.len(), Duration::from_secs(150)).await;
    assert_eq!(events(&delivered), expected);
    assert!(
        receiver.received().iter().any(|r| r.status == 500),
        "the receiver refused some tries"
    );
    assert_duplicates_identical(&receiver);
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
