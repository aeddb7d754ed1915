//! Which real histories a replay check replays against a new build (issue #28): the workflows
//! that can move to it, and recent work of the build they would leave.
//!
//! Candidates come from visibility, one page of `ListWorkflowExecutions` per query (each paid
//! from the namespace's read budget): open AutoUpgrade workflows on the Current and on the
//! Ramping build (they move as the new build ramps and becomes Current), open Pinned workflows
//! of builds whose workflows `moveToCurrent` would move, and recently closed workflows on the
//! Current build (the code paths the new build will run). [`pick`] then bounds the sample.

use std::collections::{BTreeMap, BTreeSet};

use temporalio_common::protos::temporal::api::enums::v1::WorkflowExecutionStatus;

use crate::temporal::convert::millis;
use crate::temporal::drain::first_page;
use crate::temporal::error::TemporalError;
use crate::temporal::pool::TemporalClient;
use crate::temporal::query::{UnsafeQueryValue, quote};

/// Executions listed per query (one page).
pub const CANDIDATES_PER_QUERY: i32 = 200;

/// A workflow run the check could replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayCandidate {
    /// Workflow ID.
    pub workflow_id: String,
    /// Run ID.
    pub run_id: String,
    /// Workflow type.
    pub workflow_type: String,
    /// Events in its history as visibility reports it (SQL visibility stores, the dev
    /// server's included, record it at close: 0 for an open workflow there).
    pub history_length: i64,
    /// When it started (Unix ms; 0 when unknown).
    pub started_at: i64,
    /// Whether it is still running.
    pub open: bool,
}

/// What the check may replay and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CandidateSource<'a> {
    /// Open AutoUpgrade workflows on this build.
    AutoUpgradeOn(&'a str),
    /// Open Pinned workflows on this build (`moveToCurrent` would move them).
    PinnedOn(&'a str),
    /// Closed workflows of this build, most recent first.
    ClosedOn(&'a str),
}

/// The visibility query of `source` in worker deployment `deployment_name`.
pub fn candidate_query(
    deployment_name: &str,
    source: CandidateSource<'_>,
) -> Result<String, UnsafeQueryValue> {
    let version = |build: &str| {
        quote(
            "worker deployment version",
            &format!("{deployment_name}:{build}"),
        )
    };
    Ok(match source {
        CandidateSource::AutoUpgradeOn(build) => format!(
            "TemporalWorkerDeploymentVersion = {} AND \
             TemporalWorkflowVersioningBehavior = 'AutoUpgrade' AND ExecutionStatus = 'Running'",
            version(build)?
        ),
        CandidateSource::PinnedOn(build) => format!(
            "TemporalWorkerDeploymentVersion = {} AND \
             TemporalWorkflowVersioningBehavior = 'Pinned' AND ExecutionStatus = 'Running'",
            version(build)?
        ),
        CandidateSource::ClosedOn(build) => format!(
            "TemporalWorkerDeploymentVersion = {} AND ExecutionStatus != 'Running'",
            version(build)?
        ),
    })
}

/// One page of the executions `query` matches, as candidates.
pub async fn list_candidates(
    client: &TemporalClient,
    namespace: &str,
    query: &str,
) -> Result<Vec<ReplayCandidate>, TemporalError> {
    Ok(first_page(client, namespace, query, CANDIDATES_PER_QUERY)
        .await?
        .into_iter()
        .filter_map(|info| {
            let execution = info.execution?;
            Some(ReplayCandidate {
                workflow_id: execution.workflow_id,
                run_id: execution.run_id,
                workflow_type: info.r#type.map(|t| t.name).unwrap_or_default(),
                history_length: info.history_length,
                started_at: millis(info.start_time.as_ref()).unwrap_or(0),
                open: info.status == WorkflowExecutionStatus::Running as i32,
            })
        })
        .collect())
}

/// The sample of at most `max` candidates, none longer than `max_events` events: every workflow
/// type represented as far as `max` allows (types take turns, in the order their first
/// candidate comes), each type's open workflows first, the longest first (they carry the most
/// code paths; where visibility does not know an open history's length, the oldest first),
/// then its closed ones as listed (most recent first). A run listed by two queries counts
/// once. Returns the sample and how many were left out for their length.
pub fn pick(
    candidates: Vec<ReplayCandidate>,
    max: usize,
    max_events: i64,
) -> (Vec<ReplayCandidate>, usize) {
    let mut seen = BTreeSet::new();
    let mut too_long = 0;
    let mut order: Vec<String> = Vec::new();
    let mut by_type: BTreeMap<String, Vec<(usize, ReplayCandidate)>> = BTreeMap::new();
    for (index, candidate) in candidates.into_iter().enumerate() {
        if !seen.insert((candidate.workflow_id.clone(), candidate.run_id.clone())) {
            continue;
        }
        if candidate.history_length > max_events {
            too_long += 1;
            continue;
        }
        if !by_type.contains_key(&candidate.workflow_type) {
            order.push(candidate.workflow_type.clone());
        }
        by_type
            .entry(candidate.workflow_type.clone())
            .or_default()
            .push((index, candidate));
    }
    for list in by_type.values_mut() {
        // Open before closed; open ones longest first; otherwise as listed.
        list.sort_by(|(ia, a), (ib, b)| {
            b.open.cmp(&a.open).then_with(|| {
                if a.open && b.open {
                    b.history_length
                        .cmp(&a.history_length)
                        .then(a.started_at.cmp(&b.started_at))
                        .then(ia.cmp(ib))
                } else {
                    ia.cmp(ib)
                }
            })
        });
        list.reverse();
    }
    let mut sample = Vec::new();
    while sample.len() < max {
        let mut took = false;
        for workflow_type in &order {
            if sample.len() >= max {
                break;
            }
            if let Some((_, candidate)) = by_type.get_mut(workflow_type).and_then(Vec::pop) {
                sample.push(candidate);
                took = true;
            }
        }
        if !took {
            break;
        }
    }
    (sample, too_long)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(id: &str, workflow_type: &str, length: i64, open: bool) -> ReplayCandidate {
        ReplayCandidate {
            workflow_id: id.to_owned(),
            run_id: format!("{id}-run"),
            workflow_type: workflow_type.to_owned(),
            history_length: length,
            started_at: 1_000,
            open,
        }
    }

    fn ids(sample: &[ReplayCandidate]) -> Vec<&str> {
        sample.iter().map(|c| c.workflow_id.as_str()).collect()
    }

    #[test]
    fn the_sample_represents_every_type_longest_open_first() {
        let candidates = vec![
            run("a-short", "A", 10, true),
            run("a-long", "A", 500, true),
            run("a-closed", "A", 20, false),
            run("a-closed-older", "A", 900, false),
            run("b-open", "B", 30, true),
            run("c-closed", "C", 12, false),
            run("a-long", "A", 500, true),
            run("huge", "B", 50_000, true),
        ];
        for (max, max_events, wanted, too_long) in [
            (
                10,
                10_000,
                vec![
                    "a-long",
                    "b-open",
                    "c-closed",
                    "a-short",
                    "a-closed",
                    "a-closed-older",
                ],
                1,
            ),
            (3, 10_000, vec!["a-long", "b-open", "c-closed"], 1),
            (2, 10_000, vec!["a-long", "b-open"], 1),
            (
                10,
                100,
                vec!["a-short", "b-open", "c-closed", "a-closed"],
                3,
            ),
            (0, 10_000, vec![], 1),
        ] {
            let (sample, left_out) = pick(candidates.clone(), max, max_events);
            assert_eq!(
                (ids(&sample), left_out),
                (wanted.clone(), too_long),
                "max {max}, max events {max_events}"
            );
        }
    }

    #[test]
    fn open_histories_of_unknown_length_go_oldest_first() {
        let started = |id: &str, at: i64| ReplayCandidate {
            started_at: at,
            ..run(id, "A", 0, true)
        };
        let (sample, _) = pick(
            vec![
                started("new", 300),
                started("old", 100),
                started("mid", 200),
            ],
            2,
            10,
        );
        assert_eq!(ids(&sample), vec!["old", "mid"]);
    }

    #[test]
    fn queries_name_the_version_and_what_moves() {
        let query = |source| candidate_query("demo/hello", source).expect("a query");
        assert_eq!(
            query(CandidateSource::AutoUpgradeOn("v1")),
            "TemporalWorkerDeploymentVersion = 'demo/hello:v1' AND \
             TemporalWorkflowVersioningBehavior = 'AutoUpgrade' AND ExecutionStatus = 'Running'"
        );
        assert_eq!(
            query(CandidateSource::PinnedOn("v0")),
            "TemporalWorkerDeploymentVersion = 'demo/hello:v0' AND \
             TemporalWorkflowVersioningBehavior = 'Pinned' AND ExecutionStatus = 'Running'"
        );
        assert_eq!(
            query(CandidateSource::ClosedOn("v1")),
            "TemporalWorkerDeploymentVersion = 'demo/hello:v1' AND ExecutionStatus != 'Running'"
        );
        assert!(candidate_query("demo/hello", CandidateSource::ClosedOn("v\"1")).is_err());
    }
}
