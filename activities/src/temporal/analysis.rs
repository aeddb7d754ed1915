//! The Temporal provider of canary analysis: how the workflows started on a build since a step's
//! ramp was set fared, from visibility counts, compared with limits and with the Current build
//! over the same window.
//!
//! Per build, one `CountWorkflowExecutions ... GROUP BY ExecutionStatus` gives the workflows by
//! status, and a second count the running ones stuck on a workflow task problem the server
//! reported (`TemporalReportedProblems`, set after consecutive workflow task failures or
//! timeouts; self-hosted servers set it only with
//! `system.numConsecutiveWorkflowTaskProblemsToTriggerSearchAttribute`). A server that does not
//! know that attribute is remembered per connection and its stuck workflows count as none. Workflows
//! are attributed to a build by `TemporalWorkerDeploymentVersion`, which the server sets once a
//! workflow task completed on it: a workflow whose first workflow task never completes is
//! counted on no build. Every count is paid from the namespace's read budget.
//!
//! Deciding ([`judge`]) is a pure function of the counts and the limits.

use temporalio_common::protos::temporal::api::workflowservice::v1::count_workflow_executions_response::AggregationGroup;
use tracing::{debug, info, warn};
use twc_workflows::{
    contract::{Measurement, Verdict},
    model::UnixMillis,
};

use crate::temporal::{
    drain::{count_executions, count_workflows},
    error::{StatusClass, TemporalError},
    pool::{QueryFeature, TemporalClient},
    query::{UnsafeQueryValue, quote, quote_list, time_literal},
};

/// The search attribute of reported workflow task problems.
const REPORTED_PROBLEMS: &str = "TemporalReportedProblems";

/// The workflows of one build in the window, by how they fared.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outcomes {
    /// Completed.
    pub completed: u64,
    /// Failed.
    pub failed: u64,
    /// Canceled.
    pub canceled: u64,
    /// Terminated.
    pub terminated: u64,
    /// Continued as new (the run closed; its successor counts on its own).
    pub continued_as_new: u64,
    /// Timed out.
    pub timed_out: u64,
    /// Still running (not judged, except the stuck ones).
    pub running: u64,
    /// Running and stuck on a reported workflow task problem (also in `running`).
    pub stuck: u64,
}

impl Outcomes {
    /// Failed, timed out, terminated or stuck.
    pub fn bad(&self) -> u64 {
        self.failed
            .saturating_add(self.timed_out)
            .saturating_add(self.terminated)
            .saturating_add(self.stuck)
    }

    /// The workflows that have an outcome: every closed one and the stuck ones.
    pub fn judged(&self) -> u64 {
        [
            self.completed,
            self.failed,
            self.canceled,
            self.terminated,
            self.continued_as_new,
            self.timed_out,
            self.stuck,
        ]
        .into_iter()
        .fold(0, u64::saturating_add)
    }

    /// `100 * bad / judged`, none without judged workflows.
    pub fn failure_percent(&self) -> Option<f64> {
        let judged = self.judged();
        (judged > 0).then(|| 100.0 * self.bad() as f64 / judged as f64)
    }

    /// Adds `count` workflows of the status named `status` (as visibility names it); false for
    /// a status that is not judged here (e.g. `Paused`).
    fn add(&mut self, status: &str, count: u64) -> bool {
        let slot = match status {
            "Running" => &mut self.running,
            "Completed" => &mut self.completed,
            "Failed" => &mut self.failed,
            "Canceled" => &mut self.canceled,
            "Terminated" => &mut self.terminated,
            "ContinuedAsNew" => &mut self.continued_as_new,
            "TimedOut" => &mut self.timed_out,
            _ => return false,
        };
        *slot = slot.saturating_add(count);
        true
    }
}

/// Which workflows a check judges: those started since `window_start`, of the `include` types
/// (all when empty), never of the `exclude` or `gate_types`.
#[derive(Debug, Clone, Copy)]
pub struct WorkflowFilter<'a> {
    /// Start of the window (the step's ramp was set then).
    pub window_start: UnixMillis,
    /// Only these workflow types (empty: all).
    pub include: &'a [String],
    /// Never these workflow types.
    pub exclude: &'a [String],
    /// The gate workflows' types: never judged.
    pub gate_types: &'a [String],
}

/// The visibility queries of one build's workflows in the window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowQueries {
    /// Counts them by execution status.
    pub by_status: String,
    /// Counts the running ones stuck on a reported workflow task problem.
    pub stuck: String,
}

/// The queries of the workflows of `build_id` of `deployment_name` that `filter` selects:
///
/// `TemporalWorkerDeploymentVersion = '<deployment>:<build>' AND StartTime >= '<RFC 3339>'`,
/// then `AND WorkflowType IN (...)` and `AND WorkflowType NOT IN (<exclude and gate types>)`
/// when given; by status with `GROUP BY ExecutionStatus`, stuck with
/// `AND ExecutionStatus = 'Running' AND TemporalReportedProblems IS NOT NULL`.
pub fn window_queries(
    deployment_name: &str,
    build_id: &str,
    filter: &WorkflowFilter<'_>,
) -> Result<WindowQueries, UnsafeQueryValue> {
    let version = quote(
        "worker deployment version",
        &format!("{deployment_name}:{build_id}"),
    )?;
    let since = time_literal(filter.window_start)?;
    let mut base = format!("TemporalWorkerDeploymentVersion = {version} AND StartTime >= {since}");
    if !filter.include.is_empty() {
        base.push_str(&format!(
            " AND WorkflowType IN ({})",
            quote_list(filter.include)?
        ));
    }
    let excluded = quote_list(filter.exclude.iter().chain(filter.gate_types))?;
    if !excluded.is_empty() {
        base.push_str(&format!(" AND WorkflowType NOT IN ({excluded})"));
    }
    Ok(WindowQueries {
        by_status: format!("{base} GROUP BY ExecutionStatus"),
        stuck: format!(
            "{base} AND ExecutionStatus = 'Running' AND {REPORTED_PROBLEMS} IS NOT NULL"
        ),
    })
}

/// The limits of a Temporal check.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Highest failure share (percent) that passes.
    pub max_failure_percent: Option<f64>,
    /// Highest failure share above the Current build's (points) that passes.
    pub max_increase_over_current: Option<f64>,
    /// Judged workflows needed for a verdict (of each build compared).
    pub min_samples: u64,
}

/// A verdict on counts, with what it is based on.
#[derive(Debug, Clone, PartialEq)]
pub struct Judgement {
    /// The verdict.
    pub verdict: Verdict,
    /// Failure share of the build, percent.
    pub value: Option<f64>,
    /// Failure share of the Current build, percent.
    pub baseline: Option<f64>,
    /// Judged workflows of the build.
    pub samples: u64,
    /// The counts and limits, in words.
    pub message: String,
}

/// Judges the outcomes of `build_id` (`new`) against `limits`, and against the Current build's
/// outcomes (`current`) when there is a relative limit. Fewer than `min_samples` judged
/// workflows is inconclusive. The relative limit applies only when the Current build has
/// `min_samples` judged workflows too; without it the absolute limit decides alone, and a check
/// with no absolute limit is inconclusive.
pub fn judge(
    limits: &Limits,
    build_id: &str,
    new: &Outcomes,
    current: Option<(&str, &Outcomes)>,
) -> Judgement {
    let min_samples = limits.min_samples.max(1);
    let samples = new.judged();
    let value = new.failure_percent();
    let baseline = current.and_then(|(_, c)| c.failure_percent());
    let current_part = current.map(|(build, c)| match c.failure_percent() {
        Some(share) => format!(
            "Current build {build}: {share:.1}% ({} of {})",
            c.bad(),
            c.judged()
        ),
        None => format!("Current build {build}: no judged workflows"),
    });
    let judgement = |verdict, message: String| Judgement {
        verdict,
        value,
        baseline,
        samples,
        message,
    };
    let share = match value {
        Some(share) if samples >= min_samples => share,
        _ => {
            let mut message = format!("only {samples} of {min_samples} judged workflows so far");
            match value {
                Some(_) => message.push_str(&format!(": {}", share_words(build_id, new))),
                None => message.push_str(&format!(" on build {build_id}")),
            }
            return judgement(Verdict::Inconclusive, message);
        }
    };
    let relative: Option<Result<(f64, f64), String>> =
        limits
            .max_increase_over_current
            .map(|points| match current {
                None => Err("there is no Current build to compare with".to_owned()),
                Some((build, c)) => match c.failure_percent() {
                    Some(base) if c.judged() >= min_samples => Ok((points, base + points)),
                    _ => Err(format!(
                        "Current build {build} has only {} of {min_samples} judged workflows",
                        c.judged()
                    )),
                },
            });
    let mut limit_words = Vec::new();
    let mut failed = false;
    if let Some(max) = limits.max_failure_percent {
        limit_words.push(format!("{max:.1}%"));
        failed |= share > max;
    }
    let mut unapplied = None;
    match relative {
        Some(Ok((points, limit))) => {
            limit_words.push(format!("Current + {points} points = {limit:.1}%"));
            failed |= share > limit;
        }
        Some(Err(reason)) => unapplied = Some(reason),
        None => {}
    }
    let mut message = share_words(build_id, new);
    if let Some(part) = current_part {
        message.push_str(&format!("; {part}"));
    }
    if !limit_words.is_empty() {
        message.push_str(&format!("; limit: {}", limit_words.join(" and ")));
    }
    let verdict = match unapplied {
        Some(reason) if limit_words.is_empty() => {
            message.push_str(&format!("; no limit to compare with: {reason}"));
            Verdict::Inconclusive
        }
        Some(reason) => {
            message.push_str(&format!("; relative limit not applied: {reason}"));
            if failed {
                Verdict::Failed
            } else {
                Verdict::Successful
            }
        }
        None if failed => Verdict::Failed,
        None => Verdict::Successful,
    };
    judgement(verdict, message)
}

/// `failure share 31.0% (31 of 100 workflows failed, timed out or were terminated) on build v2`
/// (the stuck ones named when there are any).
fn share_words(build_id: &str, outcomes: &Outcomes) -> String {
    let share = outcomes.failure_percent().unwrap_or(0.0);
    let (bad, judged) = (outcomes.bad(), outcomes.judged());
    let what = if outcomes.stuck == 0 {
        "failed, timed out or were terminated".to_owned()
    } else {
        format!(
            "failed, timed out, were terminated or are stuck on a workflow task problem ({} stuck)",
            outcomes.stuck
        )
    };
    format!("failure share {share:.1}% ({bad} of {judged} workflows {what}) on build {build_id}")
}

/// Why the outcomes of a build could not be counted.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CountError {
    /// A call to Temporal failed.
    #[error(transparent)]
    Temporal(#[from] TemporalError),
    /// The count came back without groups.
    #[error(
        "the visibility store counted {count} workflows without grouping them by execution \
         status (GROUP BY ExecutionStatus is not supported there)"
    )]
    Ungrouped {
        /// The count it gave.
        count: u64,
    },
}

/// The outcomes of a grouped count: `count` in all, `groups` by status.
fn outcomes_of(count: i64, groups: &[AggregationGroup]) -> Result<Outcomes, CountError> {
    let count = u64::try_from(count).unwrap_or(0);
    if groups.is_empty() && count > 0 {
        return Err(CountError::Ungrouped { count });
    }
    let mut outcomes = Outcomes::default();
    for group in groups {
        let status = group.group_values.first().map(|p| {
            serde_json::from_slice::<String>(&p.data)
                .unwrap_or_else(|_| String::from_utf8_lossy(&p.data).into_owned())
        });
        let n = u64::try_from(group.count).unwrap_or(0);
        match status {
            Some(status) if outcomes.add(&status, n) => {}
            other => {
                debug!(status = ?other, count = n, "workflows of a status analysis does not judge")
            }
        }
    }
    Ok(outcomes)
}

fn refuses_reported_problems(err: &TemporalError) -> bool {
    err.class() == StatusClass::Other && err.server_message().contains(REPORTED_PROBLEMS)
}

/// The outcomes of one build: the grouped count, then (where the server knows the attribute)
/// the stuck count. Records each query it sends in `sent`; the flag says whether stuck
/// workflows were counted.
async fn count_outcomes(
    client: &TemporalClient,
    namespace: &str,
    queries: &WindowQueries,
    sent: &mut Vec<String>,
) -> Result<(Outcomes, bool), CountError> {
    sent.push(queries.by_status.clone());
    let response = count_executions(client, namespace, &queries.by_status).await?;
    let mut outcomes = outcomes_of(response.count, &response.groups)?;
    if client.refuses(QueryFeature::ReportedProblems) {
        return Ok((outcomes, false));
    }
    sent.push(queries.stuck.clone());
    match count_workflows(client, namespace, &queries.stuck).await {
        Ok(stuck) => {
            outcomes.stuck = stuck;
            Ok((outcomes, true))
        }
        Err(err) if refuses_reported_problems(&err) => {
            warn!(error = %err, "the Temporal server does not know {REPORTED_PROBLEMS}; stuck workflows are not counted");
            client.mark_refused(QueryFeature::ReportedProblems);
            Ok((outcomes, false))
        }
        Err(err) => Err(err.into()),
    }
}

/// A Temporal check of a build.
#[derive(Debug, Clone, Copy)]
pub struct TemporalCheck<'a> {
    /// Check name.
    pub name: &'a str,
    /// Temporal namespace of the workers.
    pub namespace: &'a str,
    /// Worker deployment name.
    pub deployment_name: &'a str,
    /// The build under analysis.
    pub build_id: &'a str,
    /// The Current build, if any.
    pub current_build_id: Option<&'a str>,
    /// Which workflows count.
    pub filter: WorkflowFilter<'a>,
    /// The limits.
    pub limits: Limits,
}

/// Measures a Temporal check: counts the build's outcomes (and the Current build's, when the
/// check has a relative limit and there is a Current build) and [`judge`]s them. A check whose
/// filter cannot be queried is `Invalid`; a failed count is `Inconclusive`, with the error.
pub async fn measure(client: &TemporalClient, check: &TemporalCheck<'_>) -> Measurement {
    let measurement = |verdict, message: String, queries: Vec<String>| Measurement {
        check: check.name.to_owned(),
        verdict,
        value: None,
        baseline: None,
        samples: None,
        message,
        queries,
    };
    let compare_with = check
        .current_build_id
        .filter(|b| check.limits.max_increase_over_current.is_some() && *b != check.build_id);
    let planned =
        window_queries(check.deployment_name, check.build_id, &check.filter).and_then(|new| {
            let current = compare_with
                .map(|b| window_queries(check.deployment_name, b, &check.filter).map(|q| (b, q)))
                .transpose()?;
            Ok((new, current))
        });
    let (new_queries, current_queries) = match planned {
        Ok(planned) => planned,
        Err(err) => return measurement(Verdict::Invalid, err.to_string(), Vec::new()),
    };
    let mut sent = Vec::new();
    let counted = count_outcomes(client, check.namespace, &new_queries, &mut sent).await;
    let (new, mut stuck_counted) = match counted {
        Ok(counted) => counted,
        Err(err) => {
            let message = format!(
                "cannot count the workflows of build {}: {err}",
                check.build_id
            );
            return measurement(Verdict::Inconclusive, message, sent);
        }
    };
    let mut current = None;
    if let Some((build, queries)) = &current_queries {
        let build = *build;
        match count_outcomes(client, check.namespace, queries, &mut sent).await {
            Ok((outcomes, counted)) => {
                stuck_counted &= counted;
                current = Some((build, outcomes));
            }
            Err(err) => {
                let message = format!("cannot count the workflows of Current build {build}: {err}");
                return measurement(Verdict::Inconclusive, message, sent);
            }
        }
    }
    let judgement = judge(
        &check.limits,
        check.build_id,
        &new,
        current.as_ref().map(|(b, o)| (*b, o)),
    );
    let mut message = judgement.message;
    if !stuck_counted {
        message.push_str(&format!(
            "; workflows stuck on workflow task problems are not counted: this Temporal server \
             does not know the {REPORTED_PROBLEMS} search attribute"
        ));
    }
    info!(
        check = %check.name,
        build_id = %check.build_id,
        verdict = judgement.verdict.as_str(),
        failure_percent = ?judgement.value,
        samples = judgement.samples,
        "measured Temporal check"
    );
    Measurement {
        check: check.name.to_owned(),
        verdict: judgement.verdict,
        value: judgement.value,
        baseline: judgement.baseline,
        samples: Some(judgement.samples),
        message,
        queries: sent,
    }
}

#[cfg(test)]
mod tests {
    use temporalio_common::protos::temporal::api::common::v1::Payload;

    use super::*;

    fn types(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    const BASE: &str = "TemporalWorkerDeploymentVersion = 'demo/hello:v2' AND \
                        StartTime >= '2023-11-14T22:13:20Z'";

    #[test]
    fn the_queries_select_a_builds_workflows_started_in_the_window_without_gates() {
        type Types = &'static [&'static str];
        let cases: [(Types, Types, Types, String); 5] = [
            (&[], &[], &[], BASE.to_owned()),
            (
                &[],
                &[],
                &["Smoke"],
                format!("{BASE} AND WorkflowType NOT IN ('Smoke')"),
            ),
            (
                &["Order", "Refund"],
                &[],
                &["Smoke"],
                format!(
                    "{BASE} AND WorkflowType IN ('Order', 'Refund') AND WorkflowType NOT IN ('Smoke')"
                ),
            ),
            (
                &[],
                &["Cron", "Smoke"],
                &["Smoke", "Canary"],
                format!("{BASE} AND WorkflowType NOT IN ('Cron', 'Smoke', 'Canary')"),
            ),
            (
                &["it's"],
                &[],
                &[],
                format!("{BASE} AND WorkflowType IN ('it''s')"),
            ),
        ];
        for (include, exclude, gates, base) in cases {
            let (include, exclude, gate_types) = (types(include), types(exclude), types(gates));
            let filter = WorkflowFilter {
                window_start: 1_700_000_000_000,
                include: &include,
                exclude: &exclude,
                gate_types: &gate_types,
            };
            let queries = window_queries("demo/hello", "v2", &filter).expect("valid");
            assert_eq!(
                queries,
                WindowQueries {
                    by_status: format!("{base} GROUP BY ExecutionStatus"),
                    stuck: format!(
                        "{base} AND ExecutionStatus = 'Running' AND TemporalReportedProblems IS NOT NULL"
                    ),
                }
            );
        }
    }

    #[test]
    fn a_filter_the_stores_cannot_match_reliably_is_refused() {
        let bad = types(&["a\\b"]);
        let filter = WorkflowFilter {
            window_start: 0,
            include: &[],
            exclude: &bad,
            gate_types: &[],
        };
        let err = window_queries("demo/hello", "v2", &filter).expect_err("refused");
        assert_eq!((err.what, err.value.as_str()), ("workflow type", "a\\b"));
        let filter = WorkflowFilter {
            window_start: i64::MAX,
            exclude: &[],
            ..filter
        };
        let err = window_queries("demo/hello", "v2", &filter).expect_err("refused");
        assert_eq!(err.what, "time");
    }

    fn group(status: &str, count: i64) -> AggregationGroup {
        AggregationGroup {
            group_values: vec![Payload {
                data: format!("\"{status}\"").into_bytes(),
                ..Default::default()
            }],
            count,
        }
    }

    #[test]
    fn grouped_counts_become_outcomes() {
        let groups = [
            group("Running", 4),
            group("Completed", 60),
            group("Failed", 20),
            group("Canceled", 3),
            group("Terminated", 5),
            group("ContinuedAsNew", 2),
            group("TimedOut", 6),
            group("Paused", 9),
        ];
        let outcomes = outcomes_of(109, &groups).expect("grouped");
        assert_eq!(
            outcomes,
            Outcomes {
                completed: 60,
                failed: 20,
                canceled: 3,
                terminated: 5,
                continued_as_new: 2,
                timed_out: 6,
                running: 4,
                stuck: 0,
            }
        );
        assert_eq!((outcomes.bad(), outcomes.judged()), (31, 96));
        assert_eq!(outcomes_of(0, &[]).expect("empty"), Outcomes::default());
        assert!(matches!(
            outcomes_of(7, &[]),
            Err(CountError::Ungrouped { count: 7 })
        ));
    }

    #[test]
    fn stuck_workflows_are_judged_and_bad() {
        let outcomes = Outcomes {
            completed: 8,
            running: 5,
            stuck: 2,
            ..Outcomes::default()
        };
        assert_eq!((outcomes.bad(), outcomes.judged()), (2, 10));
        assert_eq!(outcomes.failure_percent(), Some(20.0));
        assert_eq!(Outcomes::default().failure_percent(), None);
    }

    /// `bad` failed and the rest completed.
    fn counts(bad: u64, judged: u64) -> Outcomes {
        Outcomes {
            completed: judged - bad,
            failed: bad,
            ..Outcomes::default()
        }
    }

    fn limits(absolute: Option<f64>, relative: Option<f64>, min_samples: u64) -> Limits {
        Limits {
            max_failure_percent: absolute,
            max_increase_over_current: relative,
            min_samples,
        }
    }

    #[test]
    fn verdicts_follow_the_limits_the_samples_and_the_current_build() {
        use Verdict::{Failed, Inconclusive, Successful};
        /// Counts of v2 (and of Current v1) judged against limits.
        struct Case {
            name: &'static str,
            limits: Limits,
            new: Outcomes,
            current: Option<Outcomes>,
            verdict: Verdict,
            message: &'static str,
        }
        let case = |name, limits, new, current, verdict, message| Case {
            name,
            limits,
            new,
            current,
            verdict,
            message,
        };
        let cases = [
            case(
                "within the absolute limit",
                limits(Some(5.0), None, 10),
                counts(4, 100),
                None,
                Successful,
                "failure share 4.0% (4 of 100 workflows failed, timed out or were terminated) \
                 on build v2; limit: 5.0%",
            ),
            case(
                "at the absolute limit passes",
                limits(Some(5.0), None, 10),
                counts(5, 100),
                None,
                Successful,
                "failure share 5.0% (5 of 100 workflows failed, timed out or were terminated) \
                 on build v2; limit: 5.0%",
            ),
            case(
                "above the absolute limit",
                limits(Some(5.0), None, 10),
                counts(31, 100),
                None,
                Failed,
                "failure share 31.0% (31 of 100 workflows failed, timed out or were terminated) \
                 on build v2; limit: 5.0%",
            ),
            case(
                "too few samples",
                limits(Some(5.0), None, 10),
                counts(3, 4),
                None,
                Inconclusive,
                "only 4 of 10 judged workflows so far: failure share 75.0% (3 of 4 workflows \
                 failed, timed out or were terminated) on build v2",
            ),
            case(
                "no samples",
                limits(Some(5.0), None, 10),
                Outcomes {
                    running: 7,
                    ..Outcomes::default()
                },
                None,
                Inconclusive,
                "only 0 of 10 judged workflows so far on build v2",
            ),
            case(
                "above Current plus the increase",
                limits(None, Some(2.0), 10),
                counts(31, 100),
                Some(counts(0, 80)),
                Failed,
                "failure share 31.0% (31 of 100 workflows failed, timed out or were terminated) \
                 on build v2; Current build v1: 0.0% (0 of 80); limit: Current + 2 points = 2.0%",
            ),
            case(
                "within Current plus the increase",
                limits(None, Some(2.5), 10),
                counts(6, 100),
                Some(counts(4, 100)),
                Successful,
                "failure share 6.0% (6 of 100 workflows failed, timed out or were terminated) \
                 on build v2; Current build v1: 4.0% (4 of 100); limit: Current + 2.5 points = 6.5%",
            ),
            case(
                "both limits, the relative one exceeded",
                limits(Some(10.0), Some(1.0), 10),
                counts(6, 100),
                Some(counts(4, 100)),
                Failed,
                "failure share 6.0% (6 of 100 workflows failed, timed out or were terminated) \
                 on build v2; Current build v1: 4.0% (4 of 100); limit: 10.0% and Current + 1 \
                 points = 5.0%",
            ),
            case(
                "too few Current samples: the absolute limit decides",
                limits(Some(10.0), Some(1.0), 10),
                counts(6, 100),
                Some(counts(0, 3)),
                Successful,
                "failure share 6.0% (6 of 100 workflows failed, timed out or were terminated) \
                 on build v2; Current build v1: 0.0% (0 of 3); limit: 10.0%; relative limit not \
                 applied: Current build v1 has only 3 of 10 judged workflows",
            ),
            case(
                "too few Current samples and no absolute limit",
                limits(None, Some(1.0), 10),
                counts(60, 100),
                Some(Outcomes::default()),
                Inconclusive,
                "failure share 60.0% (60 of 100 workflows failed, timed out or were terminated) \
                 on build v2; Current build v1: no judged workflows; no limit to compare with: \
                 Current build v1 has only 0 of 10 judged workflows",
            ),
            case(
                "no Current build and no absolute limit",
                limits(None, Some(1.0), 10),
                counts(6, 100),
                None,
                Inconclusive,
                "failure share 6.0% (6 of 100 workflows failed, timed out or were terminated) \
                 on build v2; no limit to compare with: there is no Current build to compare with",
            ),
            case(
                "stuck workflows are named",
                limits(Some(1.0), None, 10),
                Outcomes {
                    completed: 9,
                    running: 3,
                    stuck: 1,
                    ..Outcomes::default()
                },
                None,
                Failed,
                "failure share 10.0% (1 of 10 workflows failed, timed out, were terminated or are \
                 stuck on a workflow task problem (1 stuck)) on build v2; limit: 1.0%",
            ),
        ];
        for Case {
            name,
            limits,
            new,
            current,
            verdict,
            message,
        } in cases
        {
            let got = judge(&limits, "v2", &new, current.as_ref().map(|c| ("v1", c)));
            assert_eq!(got.verdict, verdict, "{name}");
            assert_eq!(got.message, message, "{name}");
            assert_eq!(got.samples, new.judged(), "{name}");
            assert_eq!(got.value, new.failure_percent(), "{name}");
            assert_eq!(
                got.baseline,
                current.and_then(|c| c.failure_percent()),
                "{name}"
            );
        }
    }

    #[test]
    fn a_refused_reported_problems_attribute_is_told_apart_from_other_errors() {
        use temporalio_client::tonic::Status;
        let cases = [
            (
                Status::invalid_argument(
                    "invalid query: invalid search attribute: TemporalReportedProblems",
                ),
                true,
            ),
            (
                Status::invalid_argument("invalid query: invalid search attribute: FooBar"),
                false,
            ),
            (Status::unavailable("TemporalReportedProblems"), false),
        ];
        for (status, refused) in cases {
            let err = TemporalError::rpc("CountWorkflowExecutions", "q", &status);
            assert_eq!(refuses_reported_problems(&err), refused, "{status:?}");
        }
    }
}
