//! The failure switch (`SAMPLE_FAIL_SHARE`): a version that fails a given share of its
//! `HelloWorld` workflows, so canary analysis has something to detect.
//!
//! Which workflows fail is decided from a SHA-256 of the workflow ID, not by chance: the same
//! workflow always gets the same outcome (on every attempt and every worker of the version), and
//! over many workflows the failing share is close to the percentage asked for.

use std::{fmt, str::FromStr};

use sha2::{Digest, Sha256};

/// A whole percentage of workflows, 0 to 100.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct FailShare(u8);

impl FailShare {
    /// No workflow fails (the default).
    pub const NONE: Self = Self(0);

    /// The percentage, 0 to 100.
    pub fn percent(self) -> u8 {
        self.0
    }

    /// Whether the workflow `workflow_id` is one of the failing share.
    pub fn fails(self, workflow_id: &str) -> bool {
        bucket(workflow_id) < self.0
    }
}

/// A share outside 0..=100, or not a whole number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidFailShare;

impl fmt::Display for InvalidFailShare {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not a whole percentage from 0 to 100")
    }
}

impl std::error::Error for InvalidFailShare {}

impl FromStr for FailShare {
    type Err = InvalidFailShare;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().parse::<u8>() {
            Ok(percent) if percent <= 100 => Ok(Self(percent)),
            _ => Err(InvalidFailShare),
        }
    }
}

/// The workflow's bucket, 0 to 99: the first 8 bytes of its ID's SHA-256, modulo 100.
fn bucket(workflow_id: &str) -> u8 {
    let digest = Sha256::digest(workflow_id.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    // The remainder is below 100, so it always fits.
    u8::try_from(u64::from_be_bytes(first) % 100).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(percent: &str) -> FailShare {
        percent.parse().unwrap_or_else(|e| panic!("{percent}: {e}"))
    }

    fn failing(share: FailShare, ids: usize) -> usize {
        (0..ids)
            .filter(|n| share.fails(&format!("load-{n}")))
            .count()
    }

    #[test]
    fn thirty_percent_fails_about_thirty_percent_of_many_workflows() {
        let failed = failing(share("30"), 1000);
        assert!((250..=350).contains(&failed), "{failed} of 1000 failed");
    }

    #[test]
    fn zero_fails_none_and_hundred_fails_all() {
        assert_eq!(failing(FailShare::NONE, 1000), 0);
        assert_eq!(failing(share("100"), 1000), 1000);
    }

    #[test]
    fn the_same_workflow_always_gets_the_same_outcome() {
        let share = share("50");
        for n in 0..100 {
            let id = format!("hello-{n}");
            assert_eq!(share.fails(&id), share.fails(&id), "{id}");
        }
        // Fixed buckets: the hash does not change between builds, platforms or processes.
        assert_eq!(bucket("load-1"), 20);
        assert_eq!(bucket("hello"), 42);
    }

    #[test]
    fn a_larger_share_fails_a_superset() {
        let (low, high) = (share("20"), share("60"));
        for n in 0..500 {
            let id = format!("wf-{n}");
            assert!(!low.fails(&id) || high.fails(&id), "{id}");
        }
    }

    #[test]
    fn only_whole_percentages_parse() {
        assert_eq!(share(" 7 ").percent(), 7);
        for bad in ["101", "-1", "", "1.5", "30%"] {
            assert_eq!(bad.parse::<FailShare>(), Err(InvalidFailShare), "{bad}");
        }
    }
}
