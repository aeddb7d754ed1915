//! Deployment status from the state of its local pods, computed like the Deployment controller
//! does (counts, `Available` and `Progressing` conditions), without any I/O.

use k8s_openapi::api::apps::v1::{DeploymentCondition, DeploymentStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// Default of `spec.progressDeadlineSeconds`.
pub const DEFAULT_PROGRESS_DEADLINE_SECONDS: i32 = 600;
/// How many pod problems a condition message names at most.
const MAX_PROBLEMS: usize = 3;

/// What the status computation needs to know about one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    /// The pod name.
    pub name: String,
    /// Whether it runs the current pod template.
    pub updated: bool,
    /// Since when it is ready, if it is.
    pub ready_since: Option<Timestamp>,
    /// Why it is not running or not ready, for condition messages (e.g.
    /// `process exited with code 1 (restarted 3 times)`).
    pub problem: Option<String>,
}

/// The Deployment fields the status depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeploymentView {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// `spec.replicas` (nil → 1).
    pub desired: i32,
    /// `spec.minReadySeconds`.
    pub min_ready_seconds: i32,
    /// `spec.progressDeadlineSeconds` (nil → 600).
    pub progress_deadline_seconds: i32,
}

/// Replica counts of a Deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    /// Pods that exist.
    pub replicas: i32,
    /// Pods of the current template.
    pub updated: i32,
    /// Pods that are ready.
    pub ready: i32,
    /// Pods ready for at least `minReadySeconds`.
    pub available: i32,
    /// Desired (or existing, if more) pods that are not available.
    pub unavailable: i32,
}

/// Counts pods by state at `now`.
pub fn count(deployment: &DeploymentView, pods: &[PodView], now: Timestamp) -> Counts {
    let min_ready = SignedDuration::from_secs(i64::from(deployment.min_ready_seconds.max(0)));
    let n =
        |pred: &dyn Fn(&PodView) -> bool| saturating_i32(pods.iter().filter(|p| pred(p)).count());
    let replicas = saturating_i32(pods.len());
    let available = n(&|p| p.ready_since.is_some_and(|since| since + min_ready <= now));
    Counts {
        replicas,
        updated: n(&|p| p.updated),
        ready: n(&|p| p.ready_since.is_some()),
        available,
        unavailable: (deployment.desired.max(replicas) - available).max(0),
    }
}

/// Progress of the current rollout, remembered between status computations.
///
/// A rollout starts when the runner first sees a Deployment and whenever its pod template or
/// replica count changes. It progresses whenever more pods become updated or available; it
/// times out when it made no progress for `progressDeadlineSeconds`; once complete it stays
/// complete (`NewReplicaSetAvailable`) until the next rollout, like in Kubernetes, where a pod
/// crashing later only makes the Deployment unavailable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rollout {
    last_progress: Timestamp,
    best_updated: i32,
    best_available: i32,
    complete: bool,
}

impl Rollout {
    /// A rollout that starts at `now`.
    pub fn new(now: Timestamp) -> Self {
        Self {
            last_progress: now,
            best_updated: 0,
            best_available: 0,
            complete: false,
        }
    }

    /// Records the counts seen at `now`.
    fn observe(&mut self, counts: &Counts, now: Timestamp) {
        if counts.updated > self.best_updated || counts.available > self.best_available {
            self.last_progress = now;
            self.best_updated = self.best_updated.max(counts.updated);
            self.best_available = self.best_available.max(counts.available);
        }
    }
}

/// The status to write for `deployment`, given its pods at `now`.
///
/// `previous` is the status written last (or read from the server): conditions that did not
/// change keep its `lastTransitionTime`, and keep its `lastUpdateTime` too when their reason and
/// message did not change either, so an unchanged state computes an identical status.
pub fn compute(
    deployment: &DeploymentView,
    pods: &[PodView],
    rollout: &mut Rollout,
    previous: Option<&DeploymentStatus>,
    now: Timestamp,
) -> DeploymentStatus {
    // Availability uses the exact time; timestamps written to the API are whole seconds.
    let counts = count(deployment, pods, now);
    let now = whole_seconds(now);
    rollout.observe(&counts, now);
    let desired = deployment.desired;
    let complete =
        counts.updated == desired && counts.replicas == desired && counts.available >= desired;
    rollout.complete |= complete;
    let problems = problems(pods);
    let with_problems = |base: String| {
        if problems.is_empty() {
            base
        } else {
            format!("{base} {problems}")
        }
    };

    let available = counts.available >= desired;
    let available_condition = if available {
        (
            "True",
            "MinimumReplicasAvailable",
            "Deployment has minimum availability.".to_string(),
        )
    } else {
        (
            "False",
            "MinimumReplicasUnavailable",
            with_problems("Deployment does not have minimum availability.".to_string()),
        )
    };

    let name = &deployment.name;
    let deadline =
        SignedDuration::from_secs(i64::from(deployment.progress_deadline_seconds.max(0)));
    let progressing_condition = if rollout.complete {
        (
            "True",
            "NewReplicaSetAvailable",
            format!("Deployment {name:?} has successfully progressed."),
        )
    } else if now.duration_since(rollout.last_progress) > deadline {
        (
            "False",
            "ProgressDeadlineExceeded",
            with_problems(format!("Deployment {name:?} has timed out progressing.")),
        )
    } else {
        (
            "True",
            "ReplicaSetUpdated",
            with_problems(format!("Deployment {name:?} is progressing.")),
        )
    };

    let prev_conditions = previous
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let condition = |type_: &str, (status, reason, message): (&str, &str, String)| {
        merge_condition(
            prev_conditions.iter().find(|c| c.type_ == type_),
            type_,
            status,
            reason,
            message,
            now,
        )
    };
    DeploymentStatus {
        observed_generation: deployment.generation,
        replicas: Some(counts.replicas),
        updated_replicas: Some(counts.updated),
        ready_replicas: Some(counts.ready),
        available_replicas: Some(counts.available),
        unavailable_replicas: Some(counts.unavailable),
        conditions: Some(vec![
            condition("Available", available_condition),
            condition("Progressing", progressing_condition),
        ]),
        collision_count: None,
        terminating_replicas: None,
    }
}

/// A condition with timestamps carried over from `prev` where nothing changed.
fn merge_condition(
    prev: Option<&DeploymentCondition>,
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
    now: Timestamp,
) -> DeploymentCondition {
    let same_status = prev.is_some_and(|p| p.status == status);
    let unchanged = same_status
        && prev.is_some_and(|p| {
            p.reason.as_deref() == Some(reason) && p.message.as_deref() == Some(message.as_str())
        });
    let keep = |t: Option<&Time>, keep: bool| match t {
        Some(t) if keep => t.clone(),
        _ => Time(now),
    };
    DeploymentCondition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: Some(reason.to_string()),
        message: Some(message),
        last_transition_time: Some(keep(
            prev.and_then(|p| p.last_transition_time.as_ref()),
            same_status,
        )),
        last_update_time: Some(keep(
            prev.and_then(|p| p.last_update_time.as_ref()),
            unchanged,
        )),
    }
}

/// The first few pod problems, as `pod NAME: PROBLEM; ...`.
fn problems(pods: &[PodView]) -> String {
    let mut listed: Vec<String> = pods
        .iter()
        .filter(|p| p.ready_since.is_none())
        .filter_map(|p| {
            p.problem
                .as_ref()
                .map(|problem| format!("pod {}: {problem}", p.name))
        })
        .collect();
    let more = listed.len().saturating_sub(MAX_PROBLEMS);
    listed.truncate(MAX_PROBLEMS);
    let mut text = listed.join("; ");
    if more > 0 {
        text.push_str(&format!(" (and {more} more)"));
    }
    text
}

/// The status as the API server returns it: zero counts are omitted there (`omitempty`).
pub fn normalized(status: &DeploymentStatus) -> DeploymentStatus {
    let zero_to_none = |v: Option<i32>| v.filter(|n| *n != 0);
    DeploymentStatus {
        replicas: zero_to_none(status.replicas),
        updated_replicas: zero_to_none(status.updated_replicas),
        ready_replicas: zero_to_none(status.ready_replicas),
        available_replicas: zero_to_none(status.available_replicas),
        unavailable_replicas: zero_to_none(status.unavailable_replicas),
        terminating_replicas: zero_to_none(status.terminating_replicas),
        collision_count: zero_to_none(status.collision_count),
        observed_generation: status.observed_generation.filter(|g| *g != 0),
        conditions: status.conditions.clone().filter(|c| !c.is_empty()),
    }
}

/// `now` without sub-second precision (the API serializes whole seconds).
pub fn whole_seconds(now: Timestamp) -> Timestamp {
    Timestamp::from_second(now.as_second()).unwrap_or(now)
}

/// A count as `i32`, saturating.
fn saturating_i32(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    fn deployment(desired: i32) -> DeploymentView {
        DeploymentView {
            name: "w-v1".into(),
            generation: Some(3),
            desired,
            min_ready_seconds: 0,
            progress_deadline_seconds: DEFAULT_PROGRESS_DEADLINE_SECONDS,
        }
    }

    fn ready(name: &str, since: i64) -> PodView {
        PodView {
            name: name.into(),
            updated: true,
            ready_since: Some(t(since)),
            problem: None,
        }
    }

    fn crashed(name: &str, restarts: u32) -> PodView {
        PodView {
            name: name.into(),
            updated: true,
            ready_since: None,
            problem: Some(format!(
                "process exited with code 1 (restarted {restarts} times)"
            )),
        }
    }

    fn condition<'a>(status: &'a DeploymentStatus, type_: &str) -> &'a DeploymentCondition {
        status
            .conditions
            .as_ref()
            .and_then(|cs| cs.iter().find(|c| c.type_ == type_))
            .unwrap()
    }

    #[test]
    fn all_ready_pods_make_the_deployment_available_and_complete() {
        let d = deployment(2);
        let mut rollout = Rollout::new(t(0));
        let s = compute(
            &d,
            &[ready("a", 1), ready("b", 2)],
            &mut rollout,
            None,
            t(5),
        );
        assert_eq!(s.observed_generation, Some(3));
        assert_eq!(
            (
                s.replicas,
                s.updated_replicas,
                s.ready_replicas,
                s.available_replicas,
                s.unavailable_replicas
            ),
            (Some(2), Some(2), Some(2), Some(2), Some(0))
        );
        let available = condition(&s, "Available");
        assert_eq!(
            (available.status.as_str(), available.reason.as_deref()),
            ("True", Some("MinimumReplicasAvailable"))
        );
        let progressing = condition(&s, "Progressing");
        assert_eq!(
            (progressing.status.as_str(), progressing.reason.as_deref()),
            ("True", Some("NewReplicaSetAvailable"))
        );
    }

    #[test]
    fn pods_ready_for_less_than_min_ready_seconds_are_not_available() {
        let mut d = deployment(1);
        d.min_ready_seconds = 10;
        let mut rollout = Rollout::new(t(0));
        let s = compute(&d, &[ready("a", 1)], &mut rollout, None, t(5));
        assert_eq!((s.ready_replicas, s.available_replicas), (Some(1), Some(0)));
        assert_eq!(condition(&s, "Available").status, "False");
        assert_eq!(
            condition(&s, "Progressing").reason.as_deref(),
            Some("ReplicaSetUpdated")
        );
        let s = compute(&d, &[ready("a", 1)], &mut rollout, Some(&s), t(11));
        assert_eq!(s.available_replicas, Some(1));
        assert_eq!(condition(&s, "Available").status, "True");
    }

    #[test]
    fn pod_ready_within_the_current_second_is_available_without_min_ready_seconds() {
        let now = t(10).checked_add(SignedDuration::from_millis(700)).unwrap();
        let ready_at = t(10).checked_add(SignedDuration::from_millis(300)).unwrap();
        let pod = PodView {
            ready_since: Some(ready_at),
            ..ready("a", 0)
        };
        let mut rollout = Rollout::new(t(0));
        let s = compute(&deployment(1), &[pod], &mut rollout, None, now);
        assert_eq!(s.available_replicas, Some(1));
        let available = condition(&s, "Available");
        assert_eq!(available.last_transition_time, Some(Time(t(10))));
    }

    #[test]
    fn zero_replicas_is_available() {
        let mut rollout = Rollout::new(t(0));
        let s = compute(&deployment(0), &[], &mut rollout, None, t(1));
        assert_eq!(
            (s.replicas, s.available_replicas, s.unavailable_replicas),
            (Some(0), Some(0), Some(0))
        );
        assert_eq!(condition(&s, "Available").status, "True");
        assert_eq!(
            condition(&s, "Progressing").reason.as_deref(),
            Some("NewReplicaSetAvailable")
        );
    }

    #[test]
    fn crashed_process_is_reported_while_progressing() {
        let mut rollout = Rollout::new(t(0));
        let s = compute(
            &deployment(1),
            &[crashed("w-v1-abcde", 3)],
            &mut rollout,
            None,
            t(30),
        );
        let p = condition(&s, "Progressing");
        assert_eq!(
            (p.status.as_str(), p.reason.as_deref()),
            ("True", Some("ReplicaSetUpdated"))
        );
        assert_eq!(
            p.message.as_deref(),
            Some(
                "Deployment \"w-v1\" is progressing. pod w-v1-abcde: process exited with code 1 (restarted 3 times)"
            )
        );
        assert_eq!(s.unavailable_replicas, Some(1));
    }

    #[test]
    fn no_progress_within_the_deadline_exceeds_it_with_the_crash_in_the_message() {
        let mut d = deployment(1);
        d.progress_deadline_seconds = 60;
        let mut rollout = Rollout::new(t(0));
        let s = compute(&d, &[crashed("w-v1-abcde", 0)], &mut rollout, None, t(0));
        let s = compute(
            &d,
            &[crashed("w-v1-abcde", 2)],
            &mut rollout,
            Some(&s),
            t(60),
        );
        assert_eq!(condition(&s, "Progressing").status, "True");
        let s = compute(
            &d,
            &[crashed("w-v1-abcde", 5)],
            &mut rollout,
            Some(&s),
            t(61),
        );
        let p = condition(&s, "Progressing");
        assert_eq!(
            (p.status.as_str(), p.reason.as_deref()),
            ("False", Some("ProgressDeadlineExceeded"))
        );
        let message = p.message.as_deref().unwrap_or_default();
        assert!(
            message.contains("process exited with code 1 (restarted 5 times)"),
            "{message}"
        );
        assert_eq!(p.last_transition_time, Some(Time(t(61))));
    }

    #[test]
    fn progress_resets_the_deadline() {
        let mut d = deployment(2);
        d.progress_deadline_seconds = 60;
        let mut rollout = Rollout::new(t(0));
        compute(
            &d,
            &[ready("a", 40), crashed("b", 1)],
            &mut rollout,
            None,
            t(50),
        );
        let s = compute(
            &d,
            &[ready("a", 40), crashed("b", 4)],
            &mut rollout,
            None,
            t(100),
        );
        assert_eq!(
            condition(&s, "Progressing").reason.as_deref(),
            Some("ReplicaSetUpdated")
        );
    }

    #[test]
    fn crash_after_a_complete_rollout_makes_it_unavailable_but_not_failed() {
        let mut d = deployment(1);
        d.progress_deadline_seconds = 60;
        let mut rollout = Rollout::new(t(0));
        compute(&d, &[ready("a", 1)], &mut rollout, None, t(2));
        let s = compute(&d, &[crashed("a", 1)], &mut rollout, None, t(500));
        assert_eq!(
            condition(&s, "Progressing").reason.as_deref(),
            Some("NewReplicaSetAvailable")
        );
        let a = condition(&s, "Available");
        assert_eq!(a.status, "False");
        assert!(
            a.message
                .as_deref()
                .unwrap_or_default()
                .contains("pod a: process exited")
        );
    }

    #[test]
    fn unchanged_state_computes_an_identical_status() {
        let d = deployment(1);
        let mut rollout = Rollout::new(t(0));
        let first = compute(&d, &[ready("a", 1)], &mut rollout, None, t(2));
        let second = compute(&d, &[ready("a", 1)], &mut rollout, Some(&first), t(90));
        assert_eq!(first, second);
    }

    #[test]
    fn transition_time_changes_only_with_the_condition_status() {
        let d = deployment(1);
        let mut rollout = Rollout::new(t(0));
        let first = compute(&d, &[crashed("a", 1)], &mut rollout, None, t(1));
        let second = compute(&d, &[crashed("a", 2)], &mut rollout, Some(&first), t(3));
        let (a1, a2) = (
            condition(&first, "Available"),
            condition(&second, "Available"),
        );
        assert_eq!(a2.last_transition_time, a1.last_transition_time);
        assert_eq!(a2.last_update_time, Some(Time(t(3))), "message changed");
        let third = compute(&d, &[ready("a", 4)], &mut rollout, Some(&second), t(5));
        assert_eq!(
            condition(&third, "Available").last_transition_time,
            Some(Time(t(5)))
        );
    }

    #[test]
    fn unmapped_image_is_named_in_the_progressing_message() {
        let pod = PodView {
            name: "w-v1-xyz12".into(),
            updated: true,
            ready_since: None,
            problem: Some("image \"twc.local/nope:v1\" is not mapped to a binary".into()),
        };
        let mut rollout = Rollout::new(t(0));
        let s = compute(&deployment(1), &[pod], &mut rollout, None, t(1));
        let message = condition(&s, "Progressing")
            .message
            .clone()
            .unwrap_or_default();
        assert!(message.contains("twc.local/nope:v1"), "{message}");
    }

    #[test]
    fn condition_messages_name_at_most_three_pods() {
        let pods: Vec<PodView> = (0..5).map(|i| crashed(&format!("p{i}"), 1)).collect();
        let mut rollout = Rollout::new(t(0));
        let s = compute(&deployment(5), &pods, &mut rollout, None, t(1));
        let message = condition(&s, "Progressing")
            .message
            .clone()
            .unwrap_or_default();
        assert!(
            message.contains("pod p2:") && !message.contains("pod p3:"),
            "{message}"
        );
        assert!(message.ends_with("(and 2 more)"), "{message}");
    }

    #[test]
    fn surplus_pods_count_as_replicas_until_stopped() {
        let c = count(&deployment(1), &[ready("a", 0), ready("b", 0)], t(1));
        assert_eq!((c.replicas, c.available, c.unavailable), (2, 2, 0));
    }

    #[test]
    fn normalized_status_drops_zero_counts_like_the_api_server() {
        let mut rollout = Rollout::new(t(0));
        let s = compute(&deployment(0), &[], &mut rollout, None, t(1));
        let n = normalized(&s);
        assert_eq!((n.replicas, n.available_replicas), (None, None));
        assert_eq!(n.observed_generation, Some(3));
    }
}
