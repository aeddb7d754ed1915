//! The deletion path of a TWD (README, "Deletion"): after each cleanup attempt, whether the TWD
//! is done, is released without the cleanup of Temporal, or tries again, and when.
//!
//! A cleanup that cannot reach Temporal with the TWD's settings (the connection or its Secret
//! missing, Temporal out of reach or refusing the credentials) is given up only when nothing is
//! coming to fix it: the TWD's namespace or its connection is being deleted. Then a missing
//! connection or Secret releases the TWD at once (nothing can recreate it), and a Temporal out
//! of reach or refusing after [`TEARDOWN_GRACE`] of failed attempts (a server restarting is
//! given its chance). Outside a teardown, a missing connection or Secret releases the TWD after
//! [`MISSING_GIVE_UP`]; a Temporal out of reach or refusing, or one that answers "not yet"
//! (versions with pollers), is waited for: the user fixes or deletes the connection.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::contract::{CleanupBlock, CleanupOutcome, Teardown};
use crate::model::UnixMillis;

/// First pause between cleanup attempts; it doubles at each attempt up to [`RETRY_MAX`].
pub const RETRY_FIRST: Duration = Duration::from_secs(5);
/// Longest pause between cleanup attempts.
pub const RETRY_MAX: Duration = Duration::from_secs(120);
/// How long a cleanup that cannot reach Temporal (out of reach, or refusing the credentials)
/// is tried while the TWD's namespace or connection is being deleted, before the TWD is
/// released without it.
pub const TEARDOWN_GRACE: Duration = Duration::from_secs(30);
/// How long a missing connection or Secret blocks the cleanup while nothing is being deleted,
/// before the TWD is released without it.
pub const MISSING_GIVE_UP: Duration = Duration::from_secs(3600);

/// Where the deletion path stands (carried over a continue-as-new).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CleanupProgress {
    /// Cleanup attempts so far (sets the backoff).
    pub attempts: u32,
    /// Since when Temporal has been unreachable with the TWD's settings.
    pub blocked_since: Option<UnixMillis>,
    /// The last "waiting for" message shown (condition and event), so it is shown once.
    pub shown: Option<String>,
}

/// What the deletion path does after a cleanup attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeletionStep {
    /// Temporal and Kubernetes are cleaned up and the finalizers released.
    Finished,
    /// Release the TWD without cleaning up Temporal, saying what was left there.
    Release,
    /// Show what the cleanup waits for and try again after `pause` (sooner when the TWD or its
    /// connection changes).
    Retry {
        /// Until the next attempt.
        pause: Duration,
    },
}

/// Decides what follows the cleanup attempt that gave `outcome` at `now`, and records it in
/// `progress`: when Temporal became unreachable with the TWD's settings, and the attempt
/// count that sets the backoff. A pause never outlasts the moment the TWD is to be released.
pub fn after_attempt(
    progress: &mut CleanupProgress,
    outcome: &CleanupOutcome,
    now: UnixMillis,
) -> DeletionStep {
    let CleanupOutcome::Pending {
        blocked_by,
        teardown,
        ..
    } = outcome
    else {
        return DeletionStep::Finished;
    };
    let since = match blocked_by {
        Some(_) => *progress.blocked_since.get_or_insert(now),
        None => {
            progress.blocked_since = None;
            now
        }
    };
    let release_at = release_after(*blocked_by, *teardown).map(|after| since + millis(after));
    match release_at {
        Some(at) if now >= at => DeletionStep::Release,
        Some(at) => DeletionStep::Retry {
            pause: backoff(progress).min(Duration::from_millis(
                u64::try_from(at - now).unwrap_or(u64::MAX),
            )),
        },
        None => DeletionStep::Retry {
            pause: backoff(progress),
        },
    }
}

/// Counts an attempt that will be followed by another and returns the pause before it:
/// [`RETRY_FIRST`], doubling at each attempt, at most [`RETRY_MAX`].
pub fn backoff(progress: &mut CleanupProgress) -> Duration {
    progress.attempts = progress.attempts.saturating_add(1);
    RETRY_FIRST
        .saturating_mul(1 << progress.attempts.saturating_sub(1).min(6))
        .min(RETRY_MAX)
}

/// How long after Temporal became unreachable with the TWD's settings (`blocked_by`) it is
/// released without the cleanup; `None` while something may still fix it.
pub fn release_after(
    blocked_by: Option<CleanupBlock>,
    teardown: Option<Teardown>,
) -> Option<Duration> {
    use CleanupBlock::{ConnectionGone, Refused, SecretGone, Unreachable};
    match (blocked_by?, teardown) {
        (ConnectionGone | SecretGone, Some(_)) => Some(Duration::ZERO),
        (Unreachable | Refused, Some(_)) => Some(TEARDOWN_GRACE),
        (ConnectionGone | SecretGone, None) => Some(MISSING_GIVE_UP),
        (Unreachable | Refused, None) => None,
    }
}

fn millis(duration: Duration) -> UnixMillis {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(blocked_by: Option<CleanupBlock>, teardown: Option<Teardown>) -> CleanupOutcome {
        CleanupOutcome::Pending {
            message: "m".into(),
            blocked_by,
            teardown,
        }
    }

    const S: i64 = 1000;

    #[test]
    fn a_cleanup_out_of_reach_is_released_only_when_its_namespace_or_connection_goes() {
        use CleanupBlock::*;
        let (ns, conn) = (Some(Teardown::Namespace), Some(Teardown::Connection));
        // (what, blocked by, teardown, blocked since, now, expected step)
        let retry = |secs: u64| DeletionStep::Retry {
            pause: Duration::from_secs(secs),
        };
        let cases = [
            ("cleaned up", None, None, None, 0, DeletionStep::Finished),
            ("Temporal says not yet", None, ns, None, 0, retry(5)),
            (
                "not yet, for an hour",
                None,
                ns,
                Some(0),
                3600 * S,
                retry(5),
            ),
            (
                "unreachable, first attempt",
                Some(Unreachable),
                None,
                None,
                0,
                retry(5),
            ),
            (
                "unreachable for a day, nothing deleted",
                Some(Unreachable),
                None,
                Some(0),
                86_400 * S,
                retry(5),
            ),
            (
                "refused for a day, nothing deleted",
                Some(Refused),
                None,
                Some(0),
                86_400 * S,
                retry(5),
            ),
            (
                "unreachable, namespace deleted just now",
                Some(Unreachable),
                ns,
                None,
                0,
                retry(5),
            ),
            (
                "unreachable 29 s, namespace being deleted",
                Some(Unreachable),
                ns,
                Some(0),
                29 * S,
                retry(1),
            ),
            (
                "unreachable 30 s, namespace being deleted",
                Some(Unreachable),
                ns,
                Some(0),
                30 * S,
                DeletionStep::Release,
            ),
            (
                "refused 30 s, connection being deleted",
                Some(Refused),
                conn,
                Some(0),
                30 * S,
                DeletionStep::Release,
            ),
            (
                "unreachable for a day, then the connection deleted",
                Some(Unreachable),
                conn,
                Some(0),
                86_400 * S,
                DeletionStep::Release,
            ),
            (
                "Secret gone, namespace being deleted",
                Some(SecretGone),
                ns,
                None,
                0,
                DeletionStep::Release,
            ),
            (
                "connection gone, namespace being deleted",
                Some(ConnectionGone),
                ns,
                None,
                0,
                DeletionStep::Release,
            ),
            (
                "connection gone 59 min, nothing deleted",
                Some(ConnectionGone),
                None,
                Some(0),
                3540 * S,
                retry(5),
            ),
            (
                "Secret gone an hour, nothing deleted",
                Some(SecretGone),
                None,
                Some(0),
                3600 * S,
                DeletionStep::Release,
            ),
        ];
        for (what, blocked_by, teardown, since, now, expected) in cases {
            let mut progress = CleanupProgress {
                blocked_since: since,
                ..CleanupProgress::default()
            };
            let outcome = match expected {
                DeletionStep::Finished => CleanupOutcome::Done,
                _ => pending(blocked_by, teardown),
            };
            assert_eq!(
                after_attempt(&mut progress, &outcome, now),
                expected,
                "{what}"
            );
        }
    }

    #[test]
    fn blocked_since_is_kept_while_blocked_and_cleared_when_temporal_answers() {
        let mut progress = CleanupProgress::default();
        let unreachable = pending(Some(CleanupBlock::Unreachable), None);
        after_attempt(&mut progress, &unreachable, 10 * S);
        after_attempt(&mut progress, &unreachable, 20 * S);
        assert_eq!(progress.blocked_since, Some(10 * S));
        // A different cause of the same kind keeps the clock.
        after_attempt(
            &mut progress,
            &pending(Some(CleanupBlock::Refused), None),
            30 * S,
        );
        assert_eq!(progress.blocked_since, Some(10 * S));
        after_attempt(&mut progress, &pending(None, None), 40 * S);
        assert_eq!(progress.blocked_since, None);
    }

    #[test]
    fn attempts_back_off_from_5s_to_2min_and_meet_the_release_on_time() {
        let mut progress = CleanupProgress::default();
        let pauses: Vec<u64> = (0..8).map(|_| backoff(&mut progress).as_secs()).collect();
        assert_eq!(pauses, [5, 10, 20, 40, 80, 120, 120, 120]);

        // Out of reach while the namespace goes: attempts at 0, 5, 15 s, then at 30 s (not
        // 35 s) the TWD is released.
        let mut progress = CleanupProgress::default();
        let outcome = pending(Some(CleanupBlock::Unreachable), Some(Teardown::Namespace));
        let mut now = 0;
        let mut attempts_at = Vec::new();
        loop {
            attempts_at.push(now / S);
            match after_attempt(&mut progress, &outcome, now) {
                DeletionStep::Retry { pause } => now += millis(pause),
                step => {
                    assert_eq!(step, DeletionStep::Release);
                    break;
                }
            }
        }
        assert_eq!(attempts_at, [0, 5, 15, 30]);
    }
}
