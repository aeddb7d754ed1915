//! `spec.notifications`: webhook targets told about a worker deployment's rollout events
//! (generic JSON or Slack's incoming-webhook format), each URL in a Secret.

use k8s_openapi::api::core::v1::SecretKeySelector;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Webhook targets of a worker deployment's rollout events.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self.targets.all(t, self.targets.exists_one(u, u.name == t.name))")
        .message("spec.notifications.targets: each target needs a name of its own"),
)]
pub struct NotificationSpec {
    /// Where to send the events (1 to 10 targets).
    #[schemars(length(min = 1, max = 10))]
    pub targets: Vec<NotificationTarget>,
}

/// One webhook.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NotificationTarget {
    /// Name shown in conditions and logs (`[a-z0-9-]`, at most 63 characters).
    #[schemars(regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"), length(max = 63))]
    pub name: String,
    /// Payload format: `Generic` (a JSON object, see the README) or `Slack` (an
    /// incoming-webhook message).
    #[serde(default)]
    pub format: NotificationFormat,
    /// Secret key in the worker deployment's namespace holding the webhook URL (`http://` or
    /// `https://`).
    pub url_secret_ref: SecretKeySelector,
    /// Events to send; empty or unset: every event.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 20))]
    pub events: Vec<NotificationEvent>,
}

/// Payload format of a target.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NotificationFormat {
    /// `{"idempotencyKey", "event", "reason", "message", "workerDeployment", ...}`.
    #[default]
    Generic,
    /// `{"text": ...}` for a Slack incoming webhook.
    Slack,
}

/// A rollout event a target can subscribe to.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NotificationEvent {
    /// A new build's Deployment was created: its rollout began.
    RolloutStarted,
    /// A Progressive step's ramp was set.
    StepReached,
    /// An operator paused the rollout.
    Paused,
    /// A Manual rollout's build is ready and waits for `promote`.
    WaitingForPromotion,
    /// The build was made Current (by the rollout or by an operator's `promote`).
    Promoted,
    /// The rollout is complete: the target build is Current.
    RolloutComplete,
    /// An operator aborted the rollout.
    Aborted,
    /// Canary analysis failed and aborted the rollout.
    AnalysisFailed,
    /// The rollout's gate failed.
    GateFailed,
    /// The new build made no progress within `progressDeadlineSeconds`.
    ProgressDeadlineExceeded,
    /// A drain step acted on a retired version's pinned workflows (or failed).
    Drain,
    /// Deleting the worker deployment is blocked (Temporal cannot be cleaned up).
    DeletionBlocked,
    /// The replay check of a new build (`spec.rollout.replayCheck`) decided: passed, found
    /// histories that do not replay, or could not decide.
    ReplayCheck,
}

impl NotificationEvent {
    /// The event's name, as in the spec and the payload.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RolloutStarted => "RolloutStarted",
            Self::StepReached => "StepReached",
            Self::Paused => "Paused",
            Self::WaitingForPromotion => "WaitingForPromotion",
            Self::Promoted => "Promoted",
            Self::RolloutComplete => "RolloutComplete",
            Self::Aborted => "Aborted",
            Self::AnalysisFailed => "AnalysisFailed",
            Self::GateFailed => "GateFailed",
            Self::ProgressDeadlineExceeded => "ProgressDeadlineExceeded",
            Self::Drain => "Drain",
            Self::DeletionBlocked => "DeletionBlocked",
            Self::ReplayCheck => "ReplayCheck",
        }
    }

    /// The notification a Kubernetes event of `reason` (recorded by the workflows) stands
    /// for, if any.
    pub fn of_reason(reason: &str) -> Option<Self> {
        Some(match reason {
            "DeploymentCreated" => Self::RolloutStarted,
            "Ramped" => Self::StepReached,
            "Paused" => Self::Paused,
            "WaitingForPromotion" => Self::WaitingForPromotion,
            "Promoted" | "PromotedByOperator" => Self::Promoted,
            "RolloutComplete" => Self::RolloutComplete,
            "Aborted" => Self::Aborted,
            "AnalysisFailed" => Self::AnalysisFailed,
            "GateFailed" => Self::GateFailed,
            "ProgressDeadlineExceeded" => Self::ProgressDeadlineExceeded,
            "DrainSignalled"
            | "DrainCancelled"
            | "DrainTerminated"
            | "DrainMovedToCurrent"
            | "DrainFailed" => Self::Drain,
            "DeletionBlocked" => Self::DeletionBlocked,
            "ReplayCheckPassed" | "ReplayCheckFailed" | "ReplayCheckInconclusive" => {
                Self::ReplayCheck
            }
            _ => return None,
        })
    }
}

impl NotificationTarget {
    /// Whether this target wants `event`.
    pub fn wants(&self, event: NotificationEvent) -> bool {
        self.events.is_empty() || self.events.contains(&event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workflows_event_reasons_map_to_notifications() {
        let cases = [
            ("DeploymentCreated", Some(NotificationEvent::RolloutStarted)),
            ("Ramped", Some(NotificationEvent::StepReached)),
            ("PromotedByOperator", Some(NotificationEvent::Promoted)),
            ("Promoted", Some(NotificationEvent::Promoted)),
            ("RolloutComplete", Some(NotificationEvent::RolloutComplete)),
            ("AnalysisFailed", Some(NotificationEvent::AnalysisFailed)),
            ("DrainFailed", Some(NotificationEvent::Drain)),
            ("DeletionBlocked", Some(NotificationEvent::DeletionBlocked)),
            ("ReplayCheckPassed", Some(NotificationEvent::ReplayCheck)),
            ("ReplayCheckFailed", Some(NotificationEvent::ReplayCheck)),
            (
                "ReplayCheckInconclusive",
                Some(NotificationEvent::ReplayCheck),
            ),
            ("Resumed", None),
            ("ScaledDown", None),
            ("GatePassed", None),
        ];
        for (reason, expected) in cases {
            assert_eq!(NotificationEvent::of_reason(reason), expected, "{reason}");
        }
        for event in [NotificationEvent::Drain, NotificationEvent::StepReached] {
            let json = serde_json::to_value(event).unwrap_or_default();
            assert_eq!(
                json,
                event.as_str(),
                "the payload names events as the spec does"
            );
        }
    }

    #[test]
    fn a_target_without_events_wants_every_event() {
        let target = |events: Vec<NotificationEvent>| NotificationTarget {
            name: "ops".to_owned(),
            format: NotificationFormat::Generic,
            url_secret_ref: SecretKeySelector::default(),
            events,
        };
        assert!(target(Vec::new()).wants(NotificationEvent::Paused));
        let only = target(vec![NotificationEvent::RolloutComplete]);
        assert!(only.wants(NotificationEvent::RolloutComplete));
        assert!(!only.wants(NotificationEvent::Paused));
    }
}
