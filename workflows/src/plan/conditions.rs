//! The `Ready` and `Progressing` conditions and their reasons (a public contract: CD tools and
//! scripts match on them; see the seed CD guide and reference §4.1).

use serde::{Deserialize, Serialize};

use crate::contract::CleanupBlock;
use crate::model::{BlockReason, Blocked, RolloutProgress};

/// Condition type: the target version is Current in Temporal.
pub const READY: &str = "Ready";
/// Condition type: a rollout is in flight and not blocked.
pub const PROGRESSING: &str = "Progressing";
/// Reason of a completed rollout (both conditions).
pub const REASON_ROLLOUT_COMPLETE: &str = "RolloutComplete";
/// Reason while the target ramps.
pub const REASON_RAMPING: &str = "Ramping";
/// Reason while the target is registered but not promoted.
pub const REASON_WAITING_FOR_PROMOTION: &str = "WaitingForPromotion";
/// Reason while the target's workers have not registered.
pub const REASON_WAITING_FOR_POLLERS: &str = "WaitingForPollers";
/// Reason while a target that was Available is briefly not (a pod restarting, more replicas
/// starting): the rollout holds until it is again.
pub const REASON_WAITING_FOR_AVAILABILITY: &str = "WaitingForAvailability";
/// Reason while the rollout is held by `spec.rollout.paused` or a pause signal.
pub const REASON_PAUSED: &str = "Paused";
/// Reason after an operator aborted the rollout of the target.
pub const REASON_ABORTED: &str = "Aborted";

/// Reason on an object refused because the other kind of its name holds the claim on the
/// Temporal Worker Deployment (both conditions False).
pub const REASON_DUPLICATE_CLAIM: &str = "DuplicateClaim";

/// Condition type, while a deleted TWD's cleanup waits for something: what it waits for.
pub const DELETING: &str = "Deleting";
/// Reason of [`DELETING`] while Temporal is out of reach, or lags the cleanup (versions with
/// pollers).
pub const REASON_WAITING_FOR_TEMPORAL_CLEANUP: &str = "WaitingForTemporalCleanup";

/// A condition without timestamps (the status writer keeps transition times stable).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConditionView {
    /// `Ready` or `Progressing`.
    pub type_: String,
    /// True or False.
    pub status: bool,
    /// CamelCase reason.
    pub reason: String,
    /// Human message.
    pub message: String,
}

/// The [`DELETING`] condition of a deleted TWD whose cleanup is waiting: the reason names the
/// object at fault when that is the cause (the connection missing; its Secret missing or its
/// credentials refused), else Temporal (out of reach, or not done yet).
pub fn deletion_condition(blocked_by: Option<CleanupBlock>, message: &str) -> ConditionView {
    let reason = match blocked_by {
        Some(CleanupBlock::ConnectionGone) => BlockReason::TemporalConnectionNotFound.as_str(),
        Some(CleanupBlock::SecretGone | CleanupBlock::Refused) => {
            BlockReason::AuthSecretInvalid.as_str()
        }
        Some(CleanupBlock::Unreachable) | None => REASON_WAITING_FOR_TEMPORAL_CLEANUP,
    };
    ConditionView {
        type_: DELETING.to_owned(),
        status: true,
        reason: reason.to_owned(),
        message: format!("Deletion waits for the cleanup of Temporal: {message}"),
    }
}

/// `[Ready, Progressing]` of an object refused because `holder` (`<Kind> <namespace>/<name>`)
/// already drives the Temporal Worker Deployment `temporal_name`.
pub fn refused_conditions(
    this_kind: &str,
    holder: &str,
    temporal_name: &str,
) -> [ConditionView; 2] {
    let message = format!(
        "{holder} already manages Temporal worker deployment {temporal_name}; this {this_kind} \
         changes nothing until {holder} is deleted, then takes over its versions, routing and \
         Deployments as they are"
    );
    [READY, PROGRESSING].map(|type_| ConditionView {
        type_: type_.to_owned(),
        status: false,
        reason: REASON_DUPLICATE_CLAIM.to_owned(),
        message: message.clone(),
    })
}

/// `[Ready, Progressing]` for a rollout of `target_build` at `progress` (reference §4.1, SPEC §4.7).
///
/// `blocked` is read only when `progress` is [`RolloutProgress::Blocked`]; its reason becomes
/// the reason of both conditions (without one, `PlanExecutionFailed`). `Superseded` is never
/// shown: the caller passes the new target, which is waiting for its pollers.
///
/// `Paused` sets both conditions False with reason `Paused`: Progressing cannot be True (nothing
/// moves) and our conditions have no Unknown. kstatus (Helm 4, Flux) reads Ready=False as "in
/// progress", so `--wait` keeps waiting until the rollout is resumed or times out; the seed Argo
/// CD health check shows it Degraded, which is what a held rollout needs: a person. `Aborted`
/// is shown the same way with reason `Aborted`.
pub fn rollout_conditions(
    target_build: &str,
    progress: RolloutProgress,
    blocked: Option<&Blocked>,
) -> [ConditionView; 2] {
    let pair = |ready: bool,
                progressing: bool,
                reason: &str,
                ready_message: String,
                progressing_message: String| {
        [
            ConditionView {
                type_: READY.to_owned(),
                status: ready,
                reason: reason.to_owned(),
                message: ready_message,
            },
            ConditionView {
                type_: PROGRESSING.to_owned(),
                status: progressing,
                reason: reason.to_owned(),
                message: progressing_message,
            },
        ]
    };
    match progress {
        RolloutProgress::Complete => pair(
            true,
            false,
            REASON_ROLLOUT_COMPLETE,
            format!("Rollout complete for buildID {target_build}"),
            format!("Target version {target_build} is current"),
        ),
        RolloutProgress::Ramping => pair(
            false,
            true,
            REASON_RAMPING,
            format!("Target version {target_build} is ramping"),
            format!("Target version {target_build} is receiving a percentage of new workflows"),
        ),
        RolloutProgress::WaitingForPromotion => pair(
            false,
            true,
            REASON_WAITING_FOR_PROMOTION,
            format!("Target version {target_build} is registered but not yet promoted"),
            format!("Target version {target_build} is waiting for promotion to current"),
        ),
        RolloutProgress::WaitingForPollers | RolloutProgress::Superseded => pair(
            false,
            true,
            REASON_WAITING_FOR_POLLERS,
            format!("Target version {target_build} is not yet registered with Temporal"),
            format!("Waiting for workers with buildID {target_build} to start polling"),
        ),
        RolloutProgress::WaitingForAvailability => pair(
            false,
            true,
            REASON_WAITING_FOR_AVAILABILITY,
            format!("Target version {target_build} was available and is not now"),
            format!(
                "Waiting for the Deployment of buildID {target_build} to be Available again; the rollout holds where it is"
            ),
        ),
        RolloutProgress::Paused => pair(
            false,
            false,
            REASON_PAUSED,
            format!("Rollout of buildID {target_build} is paused"),
            format!(
                "Rollout of buildID {target_build} is paused; resume it with the resume signal or set spec.rollout.paused to false"
            ),
        ),
        RolloutProgress::Aborted if let Some(b) = blocked => pair(
            false,
            false,
            b.reason.as_str(),
            b.message.clone(),
            b.message.clone(),
        ),
        RolloutProgress::Aborted => pair(
            false,
            false,
            REASON_ABORTED,
            format!(
                "Rollout of buildID {target_build} was aborted; new workflows go to the previous current version"
            ),
            format!(
                "Rollout of buildID {target_build} was aborted by an operator; push a new version to roll out again"
            ),
        ),
        RolloutProgress::Blocked => {
            let (reason, message) = match blocked {
                Some(b) => (b.reason.as_str(), b.message.clone()),
                None => (
                    BlockReason::PlanExecutionFailed.as_str(),
                    format!("Rollout of buildID {target_build} is blocked"),
                ),
            };
            pair(false, false, reason, message.clone(), message)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flat(conditions: [ConditionView; 2]) -> [(String, bool, String, String); 2] {
        conditions.map(|c| (c.type_, c.status, c.reason, c.message))
    }

    fn row(
        type_: &str,
        status: bool,
        reason: &str,
        message: &str,
    ) -> (String, bool, String, String) {
        (
            type_.to_owned(),
            status,
            reason.to_owned(),
            message.to_owned(),
        )
    }

    #[test]
    fn conditions_match_the_public_contract() {
        let b = "v2-abc";
        let blocked = Blocked {
            reason: BlockReason::GateFailed,
            message: "gate Smoke failed".into(),
        };
        let cases = [
            (
                RolloutProgress::Complete,
                None,
                [
                    row(
                        "Ready",
                        true,
                        "RolloutComplete",
                        "Rollout complete for buildID v2-abc",
                    ),
                    row(
                        "Progressing",
                        false,
                        "RolloutComplete",
                        "Target version v2-abc is current",
                    ),
                ],
            ),
            (
                RolloutProgress::Ramping,
                None,
                [
                    row(
                        "Ready",
                        false,
                        "Ramping",
                        "Target version v2-abc is ramping",
                    ),
                    row(
                        "Progressing",
                        true,
                        "Ramping",
                        "Target version v2-abc is receiving a percentage of new workflows",
                    ),
                ],
            ),
            (
                RolloutProgress::WaitingForPromotion,
                None,
                [
                    row(
                        "Ready",
                        false,
                        "WaitingForPromotion",
                        "Target version v2-abc is registered but not yet promoted",
                    ),
                    row(
                        "Progressing",
                        true,
                        "WaitingForPromotion",
                        "Target version v2-abc is waiting for promotion to current",
                    ),
                ],
            ),
            (
                RolloutProgress::WaitingForPollers,
                None,
                [
                    row(
                        "Ready",
                        false,
                        "WaitingForPollers",
                        "Target version v2-abc is not yet registered with Temporal",
                    ),
                    row(
                        "Progressing",
                        true,
                        "WaitingForPollers",
                        "Waiting for workers with buildID v2-abc to start polling",
                    ),
                ],
            ),
            (
                RolloutProgress::WaitingForAvailability,
                None,
                [
                    row(
                        "Ready",
                        false,
                        "WaitingForAvailability",
                        "Target version v2-abc was available and is not now",
                    ),
                    row(
                        "Progressing",
                        true,
                        "WaitingForAvailability",
                        "Waiting for the Deployment of buildID v2-abc to be Available again; the rollout holds where it is",
                    ),
                ],
            ),
            (
                RolloutProgress::Superseded,
                None,
                [
                    row(
                        "Ready",
                        false,
                        "WaitingForPollers",
                        "Target version v2-abc is not yet registered with Temporal",
                    ),
                    row(
                        "Progressing",
                        true,
                        "WaitingForPollers",
                        "Waiting for workers with buildID v2-abc to start polling",
                    ),
                ],
            ),
            (
                RolloutProgress::Blocked,
                Some(&blocked),
                [
                    row("Ready", false, "GateFailed", "gate Smoke failed"),
                    row("Progressing", false, "GateFailed", "gate Smoke failed"),
                ],
            ),
            (
                RolloutProgress::Blocked,
                None,
                [
                    row(
                        "Ready",
                        false,
                        "PlanExecutionFailed",
                        "Rollout of buildID v2-abc is blocked",
                    ),
                    row(
                        "Progressing",
                        false,
                        "PlanExecutionFailed",
                        "Rollout of buildID v2-abc is blocked",
                    ),
                ],
            ),
            (
                RolloutProgress::Ramping,
                Some(&blocked),
                [
                    row(
                        "Ready",
                        false,
                        "Ramping",
                        "Target version v2-abc is ramping",
                    ),
                    row(
                        "Progressing",
                        true,
                        "Ramping",
                        "Target version v2-abc is receiving a percentage of new workflows",
                    ),
                ],
            ),
        ];
        for (progress, blocked, expected) in cases {
            assert_eq!(
                flat(rollout_conditions(b, progress, blocked)),
                expected,
                "{progress:?} {blocked:?}"
            );
        }
    }

    #[test]
    fn a_paused_rollout_is_neither_ready_nor_progressing() {
        let [ready, progressing] = rollout_conditions("v2-abc", RolloutProgress::Paused, None);
        assert_eq!((ready.status, ready.reason.as_str()), (false, "Paused"));
        assert_eq!(
            (progressing.status, progressing.reason.as_str()),
            (false, "Paused")
        );
        assert!(
            progressing.message.contains("spec.rollout.paused"),
            "{}",
            progressing.message
        );
    }

    #[test]
    fn an_aborted_rollout_is_neither_ready_nor_progressing() {
        let [ready, progressing] = rollout_conditions("v2-abc", RolloutProgress::Aborted, None);
        assert_eq!((ready.status, ready.reason.as_str()), (false, "Aborted"));
        assert_eq!(
            (progressing.status, progressing.reason.as_str()),
            (false, "Aborted")
        );
    }

    #[test]
    fn every_block_reason_is_carried_verbatim() {
        let reasons = [
            BlockReason::InvalidSpec,
            BlockReason::TemporalConnectionNotFound,
            BlockReason::AuthSecretInvalid,
            BlockReason::TemporalClientCreationFailed,
            BlockReason::TemporalStateFetchFailed,
            BlockReason::PlanGenerationFailed,
            BlockReason::PlanExecutionFailed,
            BlockReason::GateFailed,
            BlockReason::ProgressDeadlineExceeded,
            BlockReason::VersionLimitReached,
            BlockReason::ClusterConnectionUnsupported,
            BlockReason::ReplayCheckFailed,
            BlockReason::ReplayCheckInconclusive,
        ];
        for reason in reasons {
            let blocked = Blocked {
                reason,
                message: "m".into(),
            };
            let [ready, progressing] =
                rollout_conditions("b", RolloutProgress::Blocked, Some(&blocked));
            assert_eq!(ready.reason, reason.as_str());
            assert_eq!(progressing.reason, reason.as_str());
            assert!(!ready.status && !progressing.status, "{reason:?}");
        }
    }

    #[test]
    fn a_blocked_deletion_names_the_object_at_fault_only_when_one_is() {
        let cases = [
            (
                Some(CleanupBlock::ConnectionGone),
                "TemporalConnectionNotFound",
            ),
            (Some(CleanupBlock::SecretGone), "AuthSecretInvalid"),
            (Some(CleanupBlock::Refused), "AuthSecretInvalid"),
            (Some(CleanupBlock::Unreachable), "WaitingForTemporalCleanup"),
            (None, "WaitingForTemporalCleanup"),
        ];
        for (blocked_by, reason) in cases {
            let view = deletion_condition(blocked_by, "Secret demo/key not found");
            assert_eq!(
                (view.type_.as_str(), view.status, view.reason.as_str()),
                ("Deleting", true, reason),
                "{blocked_by:?}"
            );
            assert!(view.message.ends_with("Secret demo/key not found"));
        }
    }
}
