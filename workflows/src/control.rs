//! Operator controls (`pause`, `resume`, `promote`, `abort`, `retry`): whether one applies to a
//! rollout in its present state, and the sentence that answers it. The workflows answer with a
//! Kubernetes event, the CLI on the terminal; both use this module so they say the same thing.
//!
//! Every control is idempotent: sending it twice is answered [`ControlEffect::Unchanged`] and
//! changes nothing; a control that cannot apply (promote with nothing rolling) is answered
//! [`ControlEffect::NotApplicable`] with what to do instead.

use serde::{Deserialize, Serialize};

use crate::model::{BlockReason, ControlAction, RolloutProgress, RolloutReport};

/// Annotation that sends a control through Kubernetes alone
/// (`kubectl annotate wd NAME temporal.io/rollout-action=promote`); the watcher sends it as the
/// `control` update of the TWD's workflow and removes it.
pub const ROLLOUT_ACTION_ANNOTATION: &str = "temporal.io/rollout-action";

/// What a control needs to know about the rollout it is sent to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlState {
    /// Build being rolled out.
    pub build_id: String,
    /// Latest reported progress (None: the rollout has not reported yet).
    pub progress: Option<RolloutProgress>,
    /// Why it is blocked, when it is.
    pub blocked: Option<BlockReason>,
    /// Held by an operator's `pause`.
    pub operator_paused: bool,
    /// Held by `spec.rollout.paused`.
    pub spec_paused: bool,
    /// An operator's `promote` is pending.
    pub promote_requested: bool,
}

impl ControlState {
    /// The control state a rollout's latest `report` implies when the rollout itself cannot
    /// say (it has not reported its control state yet, or it has ended): no operator hold or
    /// pending promotion.
    pub fn from_report(build_id: &str, report: Option<&RolloutReport>) -> Self {
        Self {
            build_id: build_id.to_owned(),
            progress: report.map(|r| r.progress),
            blocked: report.and_then(|r| r.blocked.as_ref()).map(|b| b.reason),
            operator_paused: false,
            spec_paused: false,
            promote_requested: false,
        }
    }
}

/// The answer to a control.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ControlEffect {
    /// The control applies; what it does.
    Apply(String),
    /// Already in the state the control asks for; nothing changes.
    Unchanged(String),
    /// The control does not apply; why, and what to do instead.
    NotApplicable(String),
}

/// Event reason of a control that changed nothing because it was already in force.
pub const REASON_UNCHANGED: &str = "ControlUnchanged";
/// Event reason of a control that does not apply.
pub const REASON_IGNORED: &str = "ControlIgnored";

impl ControlEffect {
    /// The answer in words.
    pub fn message(&self) -> &str {
        match self {
            Self::Apply(m) | Self::Unchanged(m) | Self::NotApplicable(m) => m,
        }
    }

    /// Reason of the event that answers a control which changes nothing (None when it applies:
    /// its effect is answered by the transition's own event, such as `Paused`).
    pub fn event_reason(&self) -> Option<&'static str> {
        match self {
            Self::Apply(_) => None,
            Self::Unchanged(_) => Some(REASON_UNCHANGED),
            Self::NotApplicable(_) => Some(REASON_IGNORED),
        }
    }
}

/// The control's name as sent (`pause`, `resume`, ...).
pub fn action_name(action: ControlAction) -> &'static str {
    match action {
        ControlAction::Pause => "pause",
        ControlAction::Resume => "resume",
        ControlAction::Promote => "promote",
        ControlAction::Abort => "abort",
        ControlAction::Retry => "retry",
    }
}

/// Parses a control name (`pause`, `resume`, `promote`, `abort`, `retry`; case-insensitive).
pub fn parse_action(text: &str) -> Option<ControlAction> {
    const ALL: [ControlAction; 5] = [
        ControlAction::Pause,
        ControlAction::Resume,
        ControlAction::Promote,
        ControlAction::Abort,
        ControlAction::Retry,
    ];
    let text = text.trim();
    ALL.into_iter()
        .find(|a| action_name(*a).eq_ignore_ascii_case(text))
}

/// The answer to a control when the TWD has no rollout at all.
pub fn no_rollout(action: ControlAction, twd: &str) -> ControlEffect {
    ControlEffect::NotApplicable(format!(
        "{}: no rollout of {twd} is in progress",
        action_name(action)
    ))
}

/// What `action` does when sent to the workflow of the TWD `twd` (the one entry point of
/// controls): decided on `rollout`, the control state its rollout in flight reported (None: no
/// rollout), and `wanted_build`, the build its spec asks for (a `retry` after an abort rolls the
/// aborted build out again only while the spec still asks for it).
pub fn twd_effect(
    action: ControlAction,
    twd: &str,
    rollout: Option<&ControlState>,
    wanted_build: Option<&str>,
) -> ControlEffect {
    let Some(state) = rollout else {
        return no_rollout(action, twd);
    };
    match effect(action, state) {
        ControlEffect::Apply(_)
            if state.progress == Some(RolloutProgress::Aborted)
                && wanted_build != Some(state.build_id.as_str()) =>
        {
            ControlEffect::NotApplicable(format!(
                "{}: the spec now asks for build {}, not the aborted build {}",
                action_name(action),
                wanted_build.unwrap_or("-"),
                state.build_id
            ))
        }
        answer => answer,
    }
}

/// Decides what `action` does to a rollout in `state`.
pub fn effect(action: ControlAction, state: &ControlState) -> ControlEffect {
    let build = state.build_id.as_str();
    let name = action_name(action);
    if let Some(ended) = ended(state) {
        return match (action, state.progress) {
            (ControlAction::Abort, Some(RolloutProgress::Aborted)) => ControlEffect::Unchanged(
                format!("abort: the rollout of build {build} is already aborted"),
            ),
            (ControlAction::Retry, Some(RolloutProgress::Aborted)) => ControlEffect::Apply(
                format!("retry: rolling out build {build} again after its abort"),
            ),
            _ => ControlEffect::NotApplicable(format!("{name}: {ended}")),
        };
    }
    match action {
        ControlAction::Pause if state.operator_paused => ControlEffect::Unchanged(format!(
            "pause: the rollout of build {build} is already paused"
        )),
        ControlAction::Pause => ControlEffect::Apply(format!(
            "pause: the rollout of build {build} holds where it is (ramp unchanged, step timer stopped) until `resume`"
        )),
        ControlAction::Resume => match (state.operator_paused, state.spec_paused) {
            (true, true) => ControlEffect::Apply(format!(
                "resume: operator pause released, but the rollout of build {build} stays held by spec.rollout.paused until it is set to false"
            )),
            (true, false) => ControlEffect::Apply(format!(
                "resume: the rollout of build {build} continues where it paused"
            )),
            (false, true) => ControlEffect::NotApplicable(format!(
                "resume: the rollout of build {build} is held by spec.rollout.paused; set it to false to resume"
            )),
            (false, false) => ControlEffect::Unchanged(format!(
                "resume: the rollout of build {build} is not paused"
            )),
        },
        ControlAction::Promote if state.promote_requested => ControlEffect::Unchanged(format!(
            "promote: promotion of build {build} was already requested"
        )),
        ControlAction::Promote => ControlEffect::Apply(promote_message(state)),
        ControlAction::Abort => ControlEffect::Apply(format!(
            "abort: routing goes back to the previous Current version and build {build} is retired"
        )),
        ControlAction::Retry => match state.blocked {
            Some(BlockReason::GateFailed) if blocked(state) => {
                ControlEffect::Apply(format!("retry: running the gate of build {build} again"))
            }
            Some(BlockReason::ProgressDeadlineExceeded) if blocked(state) => ControlEffect::Apply(
                format!("retry: the progress deadline of build {build} starts again"),
            ),
            Some(BlockReason::ReplayCheckInconclusive) if blocked(state) => ControlEffect::Apply(
                format!("retry: running the replay check of build {build} again"),
            ),
            _ => ControlEffect::NotApplicable(format!(
                "retry: nothing to retry; retry re-runs a failed gate or an inconclusive replay check, or a rollout stopped by its progress deadline, and the rollout of build {build} is {}",
                describe(state)
            )),
        },
    }
}

fn promote_message(state: &ControlState) -> String {
    let build = state.build_id.as_str();
    if state.spec_paused {
        return format!(
            "promote: build {build} becomes Current once spec.rollout.paused is set to false"
        );
    }
    match (state.progress, state.blocked) {
        (Some(RolloutProgress::Blocked), Some(BlockReason::GateFailed)) => format!(
            "promote: build {build} becomes Current once its gate passes; send `retry` to run the gate again"
        ),
        (Some(RolloutProgress::Blocked), Some(reason)) => format!(
            "promote: build {build} becomes Current once the rollout is no longer blocked ({})",
            reason.as_str()
        ),
        _ => format!(
            "promote: skipping the remaining steps and pauses; build {build} becomes Current now (after its gate, if one is still running)"
        ),
    }
}

fn blocked(state: &ControlState) -> bool {
    state.progress == Some(RolloutProgress::Blocked)
}

/// Why a rollout that has ended takes no more controls (None while it runs).
fn ended(state: &ControlState) -> Option<String> {
    let build = state.build_id.as_str();
    match state.progress? {
        RolloutProgress::Complete => Some(format!(
            "build {build} is already Current; no rollout is in progress"
        )),
        RolloutProgress::Superseded => Some(format!(
            "the rollout of build {build} was superseded by a newer build"
        )),
        RolloutProgress::Aborted => Some(format!(
            "the rollout of build {build} was aborted; send `retry` or push a new version to roll out again"
        )),
        _ => None,
    }
}

/// The rollout's state in a few words.
pub fn describe(state: &ControlState) -> String {
    let held = if state.operator_paused || state.spec_paused {
        " (paused)"
    } else {
        ""
    };
    let what = match state.progress {
        None => "starting".to_owned(),
        Some(RolloutProgress::WaitingForPollers) => "waiting for its workers".to_owned(),
        Some(RolloutProgress::WaitingForPromotion) => {
            "waiting for its gate or promotion".to_owned()
        }
        Some(RolloutProgress::Ramping) => "ramping".to_owned(),
        Some(RolloutProgress::WaitingForAvailability) => {
            "waiting for its Deployment to be Available again".to_owned()
        }
        Some(RolloutProgress::Paused) => "paused".to_owned(),
        Some(RolloutProgress::Complete) => "complete".to_owned(),
        Some(RolloutProgress::Superseded) => "superseded".to_owned(),
        Some(RolloutProgress::Aborted) => "aborted".to_owned(),
        Some(RolloutProgress::Blocked) => match state.blocked {
            Some(reason) => format!("blocked ({})", reason.as_str()),
            None => "blocked".to_owned(),
        },
    };
    if state.progress == Some(RolloutProgress::Paused) {
        what
    } else {
        format!("{what}{held}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_twd_workflow_answers_controls_from_what_its_rollout_reported() {
        let state = |progress: Option<RolloutProgress>, paused: bool| ControlState {
            build_id: "v2-abc".into(),
            progress,
            blocked: None,
            operator_paused: paused,
            spec_paused: false,
            promote_requested: false,
        };
        let ramping = state(Some(RolloutProgress::Ramping), false);
        let paused = state(Some(RolloutProgress::Paused), true);
        let aborted = state(Some(RolloutProgress::Aborted), false);
        let complete = state(Some(RolloutProgress::Complete), false);
        let unreported = state(None, false);
        use ControlAction::{Pause, Promote, Retry};
        // (action, the rollout's state, the build the spec asks for, applies / unchanged /
        // refused, words of the answer)
        let cases = [
            (
                Pause,
                None,
                Some("v2-abc"),
                "refused",
                "no rollout of demo/hello",
            ),
            (
                Pause,
                Some(&ramping),
                Some("v2-abc"),
                "applies",
                "holds where it is",
            ),
            (
                Pause,
                Some(&paused),
                Some("v2-abc"),
                "unchanged",
                "already paused",
            ),
            (
                Pause,
                Some(&complete),
                Some("v2-abc"),
                "refused",
                "already Current",
            ),
            (
                Promote,
                Some(&unreported),
                Some("v2-abc"),
                "applies",
                "becomes Current now",
            ),
            (
                Retry,
                Some(&aborted),
                Some("v2-abc"),
                "applies",
                "again after its abort",
            ),
            (
                Retry,
                Some(&aborted),
                Some("v3-def"),
                "refused",
                "now asks for build v3-def",
            ),
        ];
        for (action, rollout, wanted, verdict, words) in cases {
            let answer = twd_effect(action, "demo/hello", rollout, wanted);
            let got = match &answer {
                ControlEffect::Apply(_) => "applies",
                ControlEffect::Unchanged(_) => "unchanged",
                ControlEffect::NotApplicable(_) => "refused",
            };
            assert_eq!(got, verdict, "{action:?} on {rollout:?}: {answer:?}");
            assert!(answer.message().contains(words), "{action:?}: {answer:?}");
        }
    }
    use ControlAction::{Abort, Pause, Promote, Resume, Retry};

    fn state(progress: RolloutProgress) -> ControlState {
        ControlState {
            build_id: "v2".into(),
            progress: Some(progress),
            blocked: None,
            operator_paused: false,
            spec_paused: false,
            promote_requested: false,
        }
    }

    fn kind(effect: &ControlEffect) -> &'static str {
        match effect {
            ControlEffect::Apply(_) => "apply",
            ControlEffect::Unchanged(_) => "unchanged",
            ControlEffect::NotApplicable(_) => "not applicable",
        }
    }

    fn blocked_by(reason: BlockReason) -> ControlState {
        ControlState {
            blocked: Some(reason),
            ..state(RolloutProgress::Blocked)
        }
    }

    #[test]
    fn each_control_applies_once_and_is_idempotent() {
        let ramping = state(RolloutProgress::Ramping);
        let paused = ControlState {
            operator_paused: true,
            ..state(RolloutProgress::Paused)
        };
        let spec_paused = ControlState {
            spec_paused: true,
            ..state(RolloutProgress::Paused)
        };
        let promoting = ControlState {
            promote_requested: true,
            ..ramping.clone()
        };
        let cases = [
            ("pause a ramp", Pause, ramping.clone(), "apply"),
            ("pause twice", Pause, paused.clone(), "unchanged"),
            ("resume a pause", Resume, paused.clone(), "apply"),
            ("resume twice", Resume, ramping.clone(), "unchanged"),
            (
                "resume a spec pause",
                Resume,
                spec_paused.clone(),
                "not applicable",
            ),
            ("promote a ramp", Promote, ramping.clone(), "apply"),
            ("promote twice", Promote, promoting, "unchanged"),
            ("promote a spec pause", Promote, spec_paused, "apply"),
            ("abort a ramp", Abort, ramping.clone(), "apply"),
            (
                "abort twice",
                Abort,
                state(RolloutProgress::Aborted),
                "unchanged",
            ),
            (
                "retry a failed gate",
                Retry,
                blocked_by(BlockReason::GateFailed),
                "apply",
            ),
            (
                "retry a missed deadline",
                Retry,
                blocked_by(BlockReason::ProgressDeadlineExceeded),
                "apply",
            ),
            (
                "retry an inconclusive replay check",
                Retry,
                blocked_by(BlockReason::ReplayCheckInconclusive),
                "apply",
            ),
            (
                "retry an aborted rollout",
                Retry,
                state(RolloutProgress::Aborted),
                "apply",
            ),
            ("retry a ramp", Retry, ramping, "not applicable"),
            (
                "retry a missing connection",
                Retry,
                blocked_by(BlockReason::TemporalConnectionNotFound),
                "not applicable",
            ),
        ];
        for (name, action, state, expected) in cases {
            assert_eq!(kind(&effect(action, &state)), expected, "{name}");
        }
    }

    #[test]
    fn nothing_applies_to_a_finished_rollout_but_retry_after_abort() {
        for progress in [RolloutProgress::Complete, RolloutProgress::Superseded] {
            for action in [Pause, Resume, Promote, Abort, Retry] {
                let answer = effect(action, &state(progress));
                assert_eq!(kind(&answer), "not applicable", "{action:?} {progress:?}");
                assert!(answer.message().starts_with(action_name(action)));
            }
        }
        let answer = effect(Promote, &state(RolloutProgress::Complete));
        assert_eq!(
            answer.message(),
            "promote: build v2 is already Current; no rollout is in progress"
        );
    }

    #[test]
    fn the_spec_pause_is_named_in_the_answer() {
        let held = ControlState {
            spec_paused: true,
            ..state(RolloutProgress::Paused)
        };
        assert!(
            effect(Resume, &held)
                .message()
                .contains("set it to false to resume")
        );
    }

    #[test]
    fn action_names_round_trip_and_unknown_names_are_rejected() {
        for action in [Pause, Resume, Promote, Abort, Retry] {
            assert_eq!(parse_action(action_name(action)), Some(action));
        }
        assert_eq!(parse_action(" Promote "), Some(Promote));
        assert_eq!(parse_action("rollback"), None);
        assert_eq!(parse_action(""), None);
    }
}
