//! Draining a retired version on purpose (SPEC §11): what to do, when, to the workflows still
//! pinned to it, under the TWD's drain policy (`spec.sunset.drain`).
//!
//! The clock of every step is the time the version stopped being Current or Ramping (the
//! sunset's `retired_at`). Each step is done once per retirement: a version routed to again
//! (rollback) loses its sunset memory, so its drain starts over when it is retired again.

use serde::{Deserialize, Serialize};
use twc_crds::worker_deployment::VersionState;

use crate::contract::DrainAction;
use crate::model::{DrainPolicy, UnixMillis};

/// How often the open pinned workflows of a draining version are counted (for status, and to
/// know when nothing is left to act on).
pub const COUNT_INTERVAL_MS: i64 = 60_000;

/// A step of a version's drain, in the order they fall due.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum DrainStep {
    /// Pin the workflows of a build declared compatible to the Current version.
    MoveToCurrent,
    /// Send the drain signal.
    Signal,
    /// Cancel the workflows still open.
    Cancel,
    /// Terminate the workflows still open.
    Terminate,
}

impl DrainStep {
    /// Lower-case name, for job IDs, events and status.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MoveToCurrent => "moveToCurrent",
            Self::Signal => "signal",
            Self::Cancel => "cancel",
            Self::Terminate => "terminate",
        }
    }
}

/// The last count of a version's open pinned workflows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinnedSnapshot {
    /// Open pinned workflows.
    pub open: u64,
    /// Start time of the oldest.
    pub oldest_started_at: Option<UnixMillis>,
    /// When they were counted.
    pub counted_at: UnixMillis,
}

/// What a version's drain has done so far (part of its sunset memory).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainMemory {
    /// Steps done (or, in dry-run, counted) since the version was retired.
    pub done: Vec<DrainStep>,
    /// The last count.
    pub pinned: Option<PinnedSnapshot>,
}

/// The drain of one version now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DrainPlan {
    /// Steps due now, in order, with what each does.
    pub due: Vec<(DrainStep, DrainAction)>,
    /// Count the open pinned workflows now.
    pub count: bool,
    /// The next step not yet due, and when it falls due.
    pub next: Option<(DrainStep, UnixMillis)>,
    /// When to look again for this version's drain (next step or next count).
    pub check_at: Option<UnixMillis>,
}

/// Plans the drain of the retired version `build_id` (Temporal state `state`, retired at
/// `retired_at`) under `policy` at `now`.
///
/// Only a Draining version has pinned workflows to act on. `MoveToCurrent` is due at once for
/// builds the policy declares compatible, and only while there is a Current version other than
/// this one; the other steps fall due their delay after retirement. A step already done is not
/// planned again. While a version drains, its pinned workflows are counted every
/// [`COUNT_INTERVAL_MS`].
pub fn plan(
    policy: &DrainPolicy,
    build_id: &str,
    state: VersionState,
    current_build_id: Option<&str>,
    retired_at: UnixMillis,
    memory: &DrainMemory,
    now: UnixMillis,
) -> DrainPlan {
    let mut plan = DrainPlan::default();
    if state != VersionState::Draining {
        return plan;
    }
    let current = current_build_id.filter(|c| !c.is_empty() && *c != build_id);
    let mut steps: Vec<(DrainStep, UnixMillis, DrainAction)> = Vec::new();
    if let Some(current) = current
        && policy.move_to_current.iter().any(|b| b == build_id)
    {
        steps.push((
            DrainStep::MoveToCurrent,
            retired_at,
            DrainAction::MoveToCurrent {
                current_build_id: current.to_owned(),
            },
        ));
    }
    let delayed = [
        (
            DrainStep::Signal,
            policy.signal_after_ms,
            DrainAction::Signal {
                name: policy.signal_name.clone(),
            },
        ),
        (
            DrainStep::Cancel,
            policy.cancel_after_ms,
            DrainAction::Cancel,
        ),
        (
            DrainStep::Terminate,
            policy.terminate_after_ms,
            DrainAction::Terminate,
        ),
    ];
    for (step, after, action) in delayed {
        if let Some(after) = after {
            steps.push((step, retired_at.saturating_add(after.max(0)), action));
        }
    }
    for (step, at, action) in steps {
        if memory.done.contains(&step) {
            continue;
        }
        if now >= at {
            plan.due.push((step, action));
        } else if plan.next.is_none_or(|(_, next)| at < next) {
            plan.next = Some((step, at));
        }
    }
    let count_at = memory
        .pinned
        .map_or(now, |p| p.counted_at.saturating_add(COUNT_INTERVAL_MS));
    plan.count = now >= count_at;
    let next_count = if plan.count {
        now.saturating_add(COUNT_INTERVAL_MS)
    } else {
        count_at
    };
    plan.check_at = Some(plan.next.map_or(next_count, |(_, at)| at.min(next_count)));
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::fixtures::secs;

    const OLD: &str = "v1-aaaaaaaaaa";
    const NEW: &str = "v2-bbbbbbbbbb";
    const RETIRED_AT: UnixMillis = 1_000_000;

    fn policy() -> DrainPolicy {
        DrainPolicy {
            signal_after_ms: Some(secs(60)),
            signal_name: "twc-drain".into(),
            cancel_after_ms: Some(secs(600)),
            terminate_after_ms: None,
            include_types: Vec::new(),
            exclude_types: Vec::new(),
            rate: 50,
            dry_run: false,
            move_to_current: Vec::new(),
        }
    }

    fn done(steps: &[DrainStep]) -> DrainMemory {
        DrainMemory {
            done: steps.to_vec(),
            pinned: Some(PinnedSnapshot {
                open: 5,
                oldest_started_at: Some(0),
                counted_at: RETIRED_AT,
            }),
        }
    }

    fn steps(plan: &DrainPlan) -> Vec<DrainStep> {
        plan.due.iter().map(|(s, _)| *s).collect()
    }

    #[test]
    fn each_step_falls_due_its_delay_after_retirement_and_is_done_once() {
        use DrainStep::*;
        let signal = RETIRED_AT + secs(60);
        let cancel = RETIRED_AT + secs(600);
        // (case, now, steps done before, steps due now, next step)
        type Case<'a> = (
            &'a str,
            UnixMillis,
            &'a [DrainStep],
            &'a [DrainStep],
            Option<(DrainStep, UnixMillis)>,
        );
        let cases: [Case; 6] = [
            ("just retired", RETIRED_AT, &[], &[], Some((Signal, signal))),
            (
                "before the signal",
                signal - 1,
                &[],
                &[],
                Some((Signal, signal)),
            ),
            ("signal due", signal, &[], &[Signal], Some((Cancel, cancel))),
            (
                "signal done",
                signal + 1,
                &[Signal],
                &[],
                Some((Cancel, cancel)),
            ),
            (
                "both due after a long outage",
                cancel + 1,
                &[],
                &[Signal, Cancel],
                None,
            ),
            ("all done", cancel + 1, &[Signal, Cancel], &[], None),
        ];
        for (name, now, already, due, next) in cases {
            let plan = super::plan(
                &policy(),
                OLD,
                VersionState::Draining,
                Some(NEW),
                RETIRED_AT,
                &done(already),
                now,
            );
            assert_eq!(steps(&plan), due, "{name}");
            assert_eq!(plan.next, next, "{name}");
        }
    }

    #[test]
    fn only_a_draining_version_is_acted_on() {
        for state in [
            VersionState::Drained,
            VersionState::Inactive,
            VersionState::NotRegistered,
            VersionState::Current,
            VersionState::Ramping,
        ] {
            let plan = super::plan(
                &policy(),
                OLD,
                state,
                Some(NEW),
                RETIRED_AT,
                &DrainMemory::default(),
                RETIRED_AT + secs(3600),
            );
            assert_eq!(plan, DrainPlan::default(), "{state:?}");
        }
    }

    #[test]
    fn compatible_builds_move_to_the_current_version_at_once_and_others_never() {
        let compatible = DrainPolicy {
            move_to_current: vec![OLD.into()],
            ..policy()
        };
        let plan = super::plan(
            &compatible,
            OLD,
            VersionState::Draining,
            Some(NEW),
            RETIRED_AT,
            &DrainMemory::default(),
            RETIRED_AT,
        );
        assert_eq!(
            plan.due,
            vec![(
                DrainStep::MoveToCurrent,
                DrainAction::MoveToCurrent {
                    current_build_id: NEW.into()
                }
            )]
        );
        // Not declared compatible, or no other Current version: never moved.
        for (policy, current) in [
            (policy(), Some(NEW)),
            (compatible.clone(), None),
            (compatible, Some(OLD)),
        ] {
            let plan = super::plan(
                &policy,
                OLD,
                VersionState::Draining,
                current,
                RETIRED_AT,
                &DrainMemory::default(),
                RETIRED_AT + secs(3600),
            );
            assert!(
                !steps(&plan).contains(&DrainStep::MoveToCurrent),
                "{current:?}: {plan:?}"
            );
        }
    }

    #[test]
    fn the_open_workflows_are_counted_every_interval_and_the_next_look_is_the_earliest() {
        let fresh = DrainMemory::default();
        let plan_at = |memory: &DrainMemory, now| {
            super::plan(
                &policy(),
                OLD,
                VersionState::Draining,
                Some(NEW),
                RETIRED_AT,
                memory,
                now,
            )
        };
        let first = plan_at(&fresh, RETIRED_AT);
        assert!(first.count);
        assert_eq!(first.check_at, Some(RETIRED_AT + secs(60)));
        let counted = done(&[]);
        let soon = plan_at(&counted, RETIRED_AT + secs(10));
        assert!(!soon.count);
        assert_eq!(soon.check_at, Some(RETIRED_AT + COUNT_INTERVAL_MS));
        let later = plan_at(&counted, RETIRED_AT + COUNT_INTERVAL_MS);
        assert!(later.count);
    }
}
