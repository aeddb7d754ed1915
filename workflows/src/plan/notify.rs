//! Notifications, decided: the idempotency key of an event, which targets to try again and
//! when, which targets are failing, and the condition that shows them on the TWD. The
//! notification workflow sequences these; the `send_notification` activity does the sending.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use twc_crds::worker_deployment::TemporalWorkerDeploymentStatus;

use crate::contract::{TargetFailure, TargetResult};
use crate::model::UnixMillis;
use crate::plan::conditions;

/// Condition type showing webhook targets that keep failing.
pub const CONDITION_TYPE: &str = "NotificationsDelivered";
/// How long one notification is retried before it is given up (the rollout never waits).
pub const GIVE_UP_AFTER: Duration = Duration::from_secs(3600);
/// Longest wait between two tries of a notification.
const MAX_DELAY: Duration = Duration::from_secs(30);

/// The key of the event recorded by activity `activity_id` of run `run_id` of `workflow_id`:
/// the same however often that activity is retried, different for every other event.
pub fn idempotency_key(workflow_id: &str, run_id: &str, activity_id: &str) -> String {
    format!("{workflow_id}#{run_id}#{activity_id}")
}

/// The idempotency key of the `WaitingForPromotion` notification a status write stands for:
/// `after` shows a Manual rollout waiting for a person and `before` did not (or is the same
/// status: a retried write whose first try went through). The rollout run names the key, so
/// every write of the same wait gives the same one.
pub fn waiting_for_promotion_key(
    manual: bool,
    before: Option<&TemporalWorkerDeploymentStatus>,
    after: &TemporalWorkerDeploymentStatus,
) -> Option<String> {
    let waiting = |status: &TemporalWorkerDeploymentStatus| {
        status.conditions.iter().any(|c| {
            c.type_ == conditions::PROGRESSING
                && c.reason == conditions::REASON_WAITING_FOR_PROMOTION
        })
    };
    if !manual || !waiting(after) || before.is_some_and(|b| waiting(b) && b != after) {
        return None;
    }
    let rollout = after.rollout.as_ref()?;
    let (workflow_id, run_id) = (rollout.workflow_id.as_ref()?, rollout.run_id.as_ref()?);
    Some(format!("{workflow_id}#{run_id}#WaitingForPromotion"))
}

/// Wait before try number `tries + 1` of a notification: 1 s, doubling, at most 30 s.
pub fn retry_delay(tries: u32) -> Duration {
    let doubled = Duration::from_secs(1).saturating_mul(1u32 << tries.min(10));
    doubled.min(MAX_DELAY)
}

/// Targets to try again after `results`: those that failed in a way a retry can fix.
pub fn retry_targets(results: &[TargetResult]) -> Vec<String> {
    results
        .iter()
        .filter(|r| r.failure.as_ref().is_some_and(|f| f.reason.retryable()))
        .map(|r| r.target.clone())
        .collect()
}

/// The failing targets after `results`: a failure replaces what was known of its target, a
/// delivery clears it; others are unchanged. Sorted by target name.
pub fn failing_after(failing: &[TargetFailure], results: &[TargetResult]) -> Vec<TargetFailure> {
    let mut next: Vec<TargetFailure> = failing
        .iter()
        .filter(|f| !results.iter().any(|r| r.target == f.target))
        .cloned()
        .collect();
    next.extend(results.iter().filter_map(|r| r.failure.clone()));
    next.sort_by(|a, b| a.target.cmp(&b.target));
    next
}

/// `status` with the `NotificationsDelivered` condition while some target fails (False, the
/// first failure's reason, every failing target in the message); without it otherwise.
pub fn with_condition(
    mut status: TemporalWorkerDeploymentStatus,
    failing: &[TargetFailure],
    generation: i64,
    now: UnixMillis,
) -> TemporalWorkerDeploymentStatus {
    status.conditions.retain(|c| c.type_ != CONDITION_TYPE);
    let Some(first) = failing.first() else {
        return status;
    };
    let message = failing
        .iter()
        .map(|f| format!("target {}: {}", f.target, f.message))
        .collect::<Vec<_>>()
        .join("; ");
    status.conditions.push(Condition {
        type_: CONDITION_TYPE.to_owned(),
        status: "False".to_owned(),
        reason: first.reason.as_str().to_owned(),
        message,
        observed_generation: Some(generation),
        last_transition_time: Time(
            Timestamp::from_millisecond(now).unwrap_or(Timestamp::UNIX_EPOCH),
        ),
    });
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::NotificationFailure::{
        NotificationDeliveryFailed as Delivery, NotificationSecretNotFound as Secret,
    };

    fn failure(target: &str, reason: crate::contract::NotificationFailure) -> TargetFailure {
        TargetFailure {
            target: target.to_owned(),
            reason,
            message: format!("{target} failed"),
        }
    }

    fn result(target: &str, failed: Option<crate::contract::NotificationFailure>) -> TargetResult {
        TargetResult {
            target: target.to_owned(),
            failure: failed.map(|r| failure(target, r)),
        }
    }

    #[test]
    fn keys_are_the_same_for_a_retried_activity_and_differ_between_events() {
        let key = idempotency_key("rollout/ns/hello/v2", "run-1", "7");
        assert_eq!(key, idempotency_key("rollout/ns/hello/v2", "run-1", "7"));
        assert_ne!(key, idempotency_key("rollout/ns/hello/v2", "run-1", "8"));
        assert_ne!(key, idempotency_key("rollout/ns/hello/v2", "run-2", "7"));
    }

    #[test]
    fn a_manual_rollout_starting_to_wait_for_promotion_is_notified_once_per_run() {
        use twc_crds::worker_deployment::RolloutStatus;
        let status = |reason: &str, message: &str| TemporalWorkerDeploymentStatus {
            conditions: vec![Condition {
                type_: conditions::PROGRESSING.to_owned(),
                status: "True".to_owned(),
                reason: reason.to_owned(),
                message: message.to_owned(),
                observed_generation: None,
                last_transition_time: Time(Timestamp::UNIX_EPOCH),
            }],
            rollout: Some(RolloutStatus {
                workflow_id: Some("rollout/ns/hello/v2".to_owned()),
                run_id: Some("r1".to_owned()),
                ..RolloutStatus::default()
            }),
            ..TemporalWorkerDeploymentStatus::default()
        };
        let waiting = status("WaitingForPromotion", "waiting");
        let waiting_later = status("WaitingForPromotion", "still waiting");
        let polling = status("WaitingForPollers", "polling");
        let key = Some("rollout/ns/hello/v2#r1#WaitingForPromotion".to_owned());
        let cases = [
            (
                "the wait begins",
                true,
                Some(&polling),
                &waiting,
                key.clone(),
            ),
            ("a first status write", true, None, &waiting, key.clone()),
            (
                "a retried write",
                true,
                Some(&waiting),
                &waiting,
                key.clone(),
            ),
            (
                "the wait goes on",
                true,
                Some(&waiting),
                &waiting_later,
                None,
            ),
            ("not waiting", true, Some(&waiting), &polling, None),
            (
                "not Manual: a gate runs",
                false,
                Some(&polling),
                &waiting,
                None,
            ),
        ];
        for (what, manual, before, after, expected) in cases {
            assert_eq!(
                waiting_for_promotion_key(manual, before, after),
                expected,
                "{what}"
            );
        }
    }

    #[test]
    fn retries_back_off_to_thirty_seconds() {
        let delays: Vec<u64> = (0..8).map(|n| retry_delay(n).as_secs()).collect();
        assert_eq!(delays, vec![1, 2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(retry_delay(u32::MAX).as_secs(), 30);
    }

    #[test]
    fn only_delivery_failures_are_tried_again() {
        let results = [
            result("ok", None),
            result("down", Some(Delivery)),
            result("nosecret", Some(Secret)),
        ];
        assert_eq!(retry_targets(&results), vec!["down".to_owned()]);
    }

    #[test]
    fn failing_targets_follow_their_latest_result() {
        let cases = [
            (
                "a first failure",
                vec![],
                vec![result("a", Some(Delivery))],
                vec!["a"],
            ),
            (
                "a delivery clears",
                vec![failure("a", Delivery)],
                vec![result("a", None)],
                vec![],
            ),
            (
                "others stay as they were",
                vec![failure("b", Secret)],
                vec![result("a", Some(Delivery))],
                vec!["a", "b"],
            ),
        ];
        for (what, before, results, expected) in cases {
            let after = failing_after(&before, &results);
            let names: Vec<&str> = after.iter().map(|f| f.target.as_str()).collect();
            assert_eq!(names, expected, "{what}");
        }
    }

    #[test]
    fn the_condition_names_every_failing_target_and_goes_once_they_deliver() {
        let failing = [failure("a", Secret), failure("b", Delivery)];
        let status = with_condition(TemporalWorkerDeploymentStatus::default(), &failing, 3, 0);
        let condition = status
            .conditions
            .iter()
            .find(|c| c.type_ == CONDITION_TYPE)
            .cloned()
            .unwrap_or_else(|| panic!("no condition"));
        assert_eq!(
            (condition.status.as_str(), condition.reason.as_str()),
            ("False", "NotificationSecretNotFound")
        );
        assert_eq!(condition.message, "target a: a failed; target b: b failed");
        assert_eq!(condition.observed_generation, Some(3));
        let cleared = with_condition(status, &[], 3, 0);
        assert!(cleared.conditions.iter().all(|c| c.type_ != CONDITION_TYPE));
    }
}
