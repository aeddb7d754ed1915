//! Pure rules for writing status without churn: a condition's `lastTransitionTime` moves only
//! when its status changes, and a status that differs only in timestamps is not written.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use serde_json::{Map, Value};
use twc_crds::worker_deployment::TemporalWorkerDeploymentStatus;

/// Keeps each desired condition's `lastTransitionTime` from the current condition of the same
/// type when the status did not change.
pub fn carry_transition_times(desired: &mut [Condition], current: &[Condition]) {
    for condition in desired {
        if let Some(old) = current
            .iter()
            .find(|c| c.type_ == condition.type_ && c.status == condition.status)
        {
            condition.last_transition_time = old.last_transition_time.clone();
        }
    }
}

/// Sets the condition of `condition.type_`, keeping its `lastTransitionTime` when the status
/// did not change.
pub fn upsert_condition(conditions: &mut Vec<Condition>, mut condition: Condition) {
    match conditions.iter_mut().find(|c| c.type_ == condition.type_) {
        Some(existing) => {
            if existing.status == condition.status {
                condition.last_transition_time = existing.last_transition_time.clone();
            }
            *existing = condition;
        }
        None => conditions.push(condition),
    }
}

/// Whether writing `desired` over `current` changes more than `rollout.updatedAt` and
/// condition transition times.
pub fn status_changed(
    current: Option<&TemporalWorkerDeploymentStatus>,
    desired: &TemporalWorkerDeploymentStatus,
) -> bool {
    let normalize = |status: &TemporalWorkerDeploymentStatus| {
        let mut status = status.clone();
        if let Some(rollout) = status.rollout.as_mut() {
            rollout.updated_at = None;
        }
        for condition in &mut status.conditions {
            condition.last_transition_time = Time(Timestamp::UNIX_EPOCH);
        }
        status
    };
    current.map(normalize) != Some(normalize(desired))
}

/// The JSON merge patch (RFC 7386) that turns `current` into `desired`: changed values, `null`
/// for removed keys, lists replaced whole.
pub fn merge_patch(current: &Value, desired: &Value) -> Value {
    match (current, desired) {
        (Value::Object(current), Value::Object(desired)) => {
            let mut patch = Map::new();
            for key in current.keys().filter(|k| !desired.contains_key(*k)) {
                patch.insert(key.clone(), Value::Null);
            }
            for (key, value) in desired {
                match current.get(key) {
                    Some(old) if old == value => {}
                    Some(old) if old.is_object() && value.is_object() => {
                        patch.insert(key.clone(), merge_patch(old, value));
                    }
                    _ => {
                        patch.insert(key.clone(), value.clone());
                    }
                }
            }
            Value::Object(patch)
        }
        (_, desired) => desired.clone(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use twc_crds::worker_deployment::RolloutStatus;

    use super::*;

    fn condition(type_: &str, status: &str, reason: &str, at: i64) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: format!("{type_} is {status}"),
            observed_generation: Some(1),
            last_transition_time: Time(Timestamp::from_second(at).expect("in range")),
        }
    }

    #[test]
    fn unchanged_statuses_keep_their_transition_time() {
        let current = [
            condition("Ready", "False", "WaitingForPollers", 100),
            condition("Progressing", "True", "x", 100),
        ];
        let mut desired = vec![
            condition("Ready", "False", "Ramping", 200),
            condition("Progressing", "False", "y", 200),
        ];
        carry_transition_times(&mut desired, &current);
        assert_eq!(
            desired[0].last_transition_time,
            current[0].last_transition_time
        );
        assert_eq!(desired[0].reason, "Ramping");
        assert_eq!(desired[1].last_transition_time.0.as_second(), 200);
    }

    #[test]
    fn upsert_replaces_by_type_and_moves_time_only_on_status_change() {
        let mut conditions = vec![condition("Ready", "False", "AuthSecretInvalid", 100)];
        upsert_condition(
            &mut conditions,
            condition("Ready", "False", "TemporalClientCreationFailed", 200),
        );
        assert_eq!(conditions.len(), 1);
        assert_eq!(
            (
                conditions[0].reason.as_str(),
                conditions[0].last_transition_time.0.as_second()
            ),
            ("TemporalClientCreationFailed", 100)
        );
        upsert_condition(
            &mut conditions,
            condition("Ready", "True", "Connected", 300),
        );
        assert_eq!(conditions[0].last_transition_time.0.as_second(), 300);
    }

    #[test]
    fn only_timestamps_changing_is_not_a_change() {
        let status = |updated: i64, at: i64| TemporalWorkerDeploymentStatus {
            conditions: vec![condition("Ready", "True", "RolloutComplete", at)],
            rollout: Some(RolloutStatus {
                updated_at: Some(Time(Timestamp::from_second(updated).expect("in range"))),
                ..Default::default()
            }),
            observed_generation: Some(1),
            ..Default::default()
        };
        assert!(!status_changed(Some(&status(1, 1)), &status(2, 2)));
        let mut newer = status(2, 2);
        newer.observed_generation = Some(2);
        assert!(status_changed(Some(&status(1, 1)), &newer));
        assert!(status_changed(None, &status(1, 1)));
    }

    #[test]
    fn merge_patch_nulls_removed_keys_and_replaces_lists() {
        let current =
            json!({"a": 1, "gone": {"x": 1}, "nested": {"keep": 1, "drop": 2}, "list": [1, 2]});
        let desired = json!({"a": 1, "nested": {"keep": 1, "new": 3}, "list": [2]});
        assert_eq!(
            merge_patch(&current, &desired),
            json!({"gone": null, "nested": {"drop": null, "new": 3}, "list": [2]})
        );
    }
}
