//! Notifications, decided: the idempotency key of an event, which targets to try again and
//! when, which targets are failing, and the condition that shows them on the TWD. The
//! notification workflow sequences these; the `send_notification` activity does the sending.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use twc_crds::worker_deployment::TemporalWorkerDeploymentStatus;

use serde::{Deserialize, Serialize};

use crate::contract::{Notification, TargetFailure, TargetResult};
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

/// Notifications a target still owes after a try it failed in a way a retry can fix, oldest
/// first: while it has any, it gets later notifications only through its lane, in order, so a
/// target that keeps failing holds up its own notifications and no other target's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lane {
    /// Owed notifications, oldest first, each with when it is given up.
    pub pending: VecDeque<Owed>,
    /// Failed tries of the oldest.
    pub tries: u32,
    /// When the oldest is tried (again).
    pub next_at: UnixMillis,
}

/// A notification a target owes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owed {
    /// The notification.
    pub notification: Notification,
    /// Given up at this time ([`GIVE_UP_AFTER`] after its first try).
    pub give_up_at: UnixMillis,
}

/// The lanes of the failing targets, by target name.
pub type Lanes = BTreeMap<String, Lane>;

/// After the first try of `notification` (sent to every target that wants it except those
/// with a lane, at `now`): the targets that failed and may recover get a lane with it, and
/// every lane gets it behind what it already owes (its target was not tried; the `only` try
/// of the lane tells whether that target wants it).
pub fn after_first_try(
    lanes: &mut Lanes,
    notification: &Notification,
    results: &[TargetResult],
    now: UnixMillis,
) {
    let owed = Owed {
        notification: notification.clone(),
        give_up_at: now.saturating_add(millis(GIVE_UP_AFTER)),
    };
    for lane in lanes.values_mut() {
        lane.pending.push_back(owed.clone());
    }
    for target in retry_targets(results) {
        lanes.entry(target).or_insert_with(|| Lane {
            pending: VecDeque::from([owed.clone()]),
            tries: 0,
            next_at: now.saturating_add(millis(retry_delay(0))),
        });
    }
}

/// After a try of the oldest notification `target` owes, at `now` (`result`: its line of the
/// outcome, `None` when the target was not tried: it no longer wants that event, or is gone):
/// delivered, refused for good or given up, the lane moves on to the next at once (and is
/// removed when empty); failed in a way a retry can fix, the same one is tried again later.
pub fn after_lane_try(
    lanes: &mut Lanes,
    target: &str,
    result: Option<&TargetResult>,
    now: UnixMillis,
) {
    let Some(lane) = lanes.get_mut(target) else {
        return;
    };
    let retry = result
        .and_then(|r| r.failure.as_ref())
        .is_some_and(|f| f.reason.retryable());
    let given_up = lane.pending.front().is_none_or(|o| now >= o.give_up_at);
    if retry && !given_up {
        lane.tries = lane.tries.saturating_add(1);
        lane.next_at = now.saturating_add(millis(retry_delay(lane.tries)));
        return;
    }
    lane.pending.pop_front();
    lane.tries = 0;
    lane.next_at = now;
    if lane.pending.is_empty() {
        lanes.remove(target);
    }
}

/// The lane whose oldest notification is due at `now` (the earliest due first).
pub fn due_lane(lanes: &Lanes, now: UnixMillis) -> Option<String> {
    lanes
        .iter()
        .filter(|(_, lane)| lane.next_at <= now)
        .min_by_key(|(_, lane)| lane.next_at)
        .map(|(target, _)| target.clone())
}

/// When the next lane is due, if any lane owes anything.
pub fn next_due(lanes: &Lanes) -> Option<UnixMillis> {
    lanes.values().map(|lane| lane.next_at).min()
}

fn millis(d: Duration) -> UnixMillis {
    UnixMillis::try_from(d.as_millis()).unwrap_or(UnixMillis::MAX)
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

    fn notification(key: &str) -> Notification {
        Notification {
            key: key.to_owned(),
            event: twc_crds::notifications::NotificationEvent::StepReached,
            reason: "Ramping".to_owned(),
            message: key.to_owned(),
            workflow_id: "rollout/ns/hello/v2".to_owned(),
            at: 0,
        }
    }

    fn owed(lanes: &Lanes, target: &str) -> Vec<String> {
        lanes
            .get(target)
            .map(|l| {
                l.pending
                    .iter()
                    .map(|o| o.notification.key.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn a_failing_target_owes_its_notifications_in_its_own_lane_and_the_others_go_on() {
        let mut lanes = Lanes::new();
        // e1: `slack` fails (retryable), `hook` is told, `bad` has no Secret (not retried).
        let e1 = notification("e1");
        after_first_try(
            &mut lanes,
            &e1,
            &[
                result("slack", Some(Delivery)),
                result("hook", None),
                result("bad", Some(Secret)),
            ],
            1_000,
        );
        assert_eq!(lanes.keys().collect::<Vec<_>>(), ["slack"]);
        assert_eq!(owed(&lanes, "slack"), ["e1"]);
        assert_eq!(next_due(&lanes), Some(2_000), "retried after 1 s");
        assert_eq!(due_lane(&lanes, 1_500), None);
        assert_eq!(due_lane(&lanes, 2_000).as_deref(), Some("slack"));
        // e2 is sent to the others at once (`slack` is left out of its first try) and queued
        // behind e1 for `slack`.
        after_first_try(
            &mut lanes,
            &notification("e2"),
            &[result("hook", None)],
            1_200,
        );
        assert_eq!(owed(&lanes, "slack"), ["e1", "e2"]);
        // `slack` fails e1 again: backoff doubles; then delivers it: e2 is due at once.
        after_lane_try(
            &mut lanes,
            "slack",
            Some(&result("slack", Some(Delivery))),
            2_000,
        );
        assert_eq!((lanes["slack"].tries, lanes["slack"].next_at), (1, 4_000));
        after_lane_try(&mut lanes, "slack", Some(&result("slack", None)), 4_000);
        assert_eq!(owed(&lanes, "slack"), ["e2"]);
        assert_eq!(
            (lanes["slack"].tries, due_lane(&lanes, 4_000).as_deref()),
            (0, Some("slack"))
        );
        // A target that no longer wants e2 (no line for it) moves on: the lane is gone.
        after_lane_try(&mut lanes, "slack", None, 4_100);
        assert!(lanes.is_empty(), "{lanes:?}");
        assert_eq!(next_due(&lanes), None);
    }

    #[test]
    fn an_owed_notification_is_given_up_an_hour_after_its_first_try_and_the_next_follows() {
        let mut lanes = Lanes::new();
        let hour = millis(GIVE_UP_AFTER);
        after_first_try(
            &mut lanes,
            &notification("e1"),
            &[result("slack", Some(Delivery))],
            0,
        );
        after_first_try(&mut lanes, &notification("e2"), &[], hour / 2);
        let failed = result("slack", Some(Delivery));
        after_lane_try(&mut lanes, "slack", Some(&failed), hour - 1);
        assert_eq!(owed(&lanes, "slack"), ["e1", "e2"], "still within the hour");
        after_lane_try(&mut lanes, "slack", Some(&failed), hour);
        assert_eq!(owed(&lanes, "slack"), ["e2"], "e1 given up");
        assert_eq!((lanes["slack"].tries, lanes["slack"].next_at), (0, hour));
        // A refusal that no retry fixes ends that notification at once too.
        after_lane_try(
            &mut lanes,
            "slack",
            Some(&result("slack", Some(Secret))),
            hour + 1,
        );
        assert!(lanes.is_empty());
    }

    #[test]
    fn the_earliest_due_lane_goes_first() {
        let mut lanes = Lanes::new();
        let failed = |t: &str| result(t, Some(Delivery));
        after_first_try(&mut lanes, &notification("e1"), &[failed("a")], 500);
        after_lane_try(&mut lanes, "a", Some(&failed("a")), 1_500);
        after_first_try(&mut lanes, &notification("e2"), &[failed("b")], 2_000);
        assert_eq!(owed(&lanes, "a"), ["e1", "e2"]);
        assert_eq!(owed(&lanes, "b"), ["e2"]);
        assert_eq!((lanes["a"].next_at, lanes["b"].next_at), (3_500, 3_000));
        assert_eq!(due_lane(&lanes, 5_000).as_deref(), Some("b"));
        assert_eq!(next_due(&lanes), Some(3_000));
    }
}
