//! `sample-worker replay`: replays real histories against this build's workflow code, the check a
//! rollout can run before any workflow moves to a new build.
//!
//! The contract (see README.md, "Replay check"): the workflows to replay arrive as a JSON list
//! of `{"workflowId": "...", "runId": "..."}` (`runId` optional: the latest run) in
//! `TWC_REPLAY_WORKFLOWS`, or in the file `TWC_REPLAY_WORKFLOWS_FILE`; the connection comes from
//! the same variables as the worker's. Each history is fetched from Temporal and replayed with
//! the SDK's replayer against the workflow types this build registers, configured as the worker
//! would be. A JSON report goes to stdout (one line) and, when `TWC_REPLAY_REPORT_PATH` is set,
//! to that file (a container's termination message: at most 4,096 bytes). Exit codes: 0 every
//! history replayed, 1 at least one did not (non-determinism), 3 no mismatch but some history
//! could not be checked (not found, unreadable, unregistered type), 2 a configuration error.

use std::{
    collections::BTreeMap,
    process::ExitCode,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use temporalio_client::{Client, WorkflowExecutionInfo, WorkflowFetchHistoryOptions};
use temporalio_common::protos::temporal::api::history::v1::{
    History, HistoryEvent, history_event::Attributes,
};
use temporalio_sdk::workflow_replayer::{
    WorkflowReplayError, WorkflowReplayFailure, WorkflowReplayer, WorkflowReplayerOptions,
};
use tracing::{error, info};

use crate::{
    EXIT_CONFIG, EXIT_FAILURE,
    config::Config,
    register_workflows,
    workflows::{GateFail, GatePass, HelloWorld, RolloutGate, Sleeper, Stubborn, Subscription},
};

/// Exit code when no history mismatched but some could not be checked.
pub const EXIT_INCONCLUSIVE: u8 = 3;
/// A container's termination message holds at most this many bytes.
const TERMINATION_MESSAGE_LIMIT: usize = 4096;

/// One workflow run to replay.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReplayTarget {
    pub workflow_id: String,
    /// The run; the latest run of `workflow_id` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
}

/// A history the build's code could not replay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Mismatch {
    pub workflow_id: String,
    pub run_id: String,
    pub workflow_type: String,
    /// The replayer's own words (Temporal's `[TMPRL1100]` non-determinism message).
    pub message: String,
}

/// A history that could not be checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Unchecked {
    pub workflow_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    pub reason: String,
}

/// What the check found; written as JSON.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// Histories replayed to their end without a mismatch.
    pub passed: usize,
    /// Histories checked (passed or mismatched) per workflow type.
    pub workflow_types: BTreeMap<String, usize>,
    /// Events replayed in all.
    pub events: usize,
    pub nondeterministic: Vec<Mismatch>,
    pub inconclusive: Vec<Unchecked>,
    /// Some entries were left out to fit a termination message.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    pub seconds: f64,
}

impl Report {
    /// 0, 1 or 3: see the module documentation.
    pub fn exit_code(&self) -> u8 {
        if !self.nondeterministic.is_empty() {
            EXIT_FAILURE
        } else if !self.inconclusive.is_empty() {
            EXIT_INCONCLUSIVE
        } else {
            0
        }
    }

    /// The report as JSON of at most `limit` bytes: the counts always, then as many mismatches
    /// and unchecked histories as fit (the first of each first), with `truncated` set when any
    /// was left out.
    pub fn to_json_within(&self, limit: usize) -> String {
        let full = json(self);
        if full.len() <= limit {
            return full;
        }
        let mut fitted = Report {
            nondeterministic: Vec::new(),
            inconclusive: Vec::new(),
            truncated: true,
            ..self.clone()
        };
        let mut mismatches = self.nondeterministic.iter();
        let mut unchecked = self.inconclusive.iter();
        loop {
            let mut grew = false;
            if let Some(m) = mismatches.next() {
                fitted.nondeterministic.push(shortened(m, limit / 2));
                if json(&fitted).len() > limit {
                    fitted.nondeterministic.pop();
                } else {
                    grew = true;
                }
            }
            if let Some(u) = unchecked.next() {
                fitted.inconclusive.push(u.clone());
                if json(&fitted).len() > limit {
                    fitted.inconclusive.pop();
                } else {
                    grew = true;
                }
            }
            if !grew {
                return json(&fitted);
            }
        }
    }
}

fn json(report: &Report) -> String {
    // A struct of strings and numbers always serializes.
    serde_json::to_string(report).unwrap_or_default()
}

/// `mismatch` with its message cut to `max` bytes (on a character boundary).
fn shortened(mismatch: &Mismatch, max: usize) -> Mismatch {
    let mut end = mismatch.message.len().min(max);
    while !mismatch.message.is_char_boundary(end) {
        end -= 1;
    }
    Mismatch {
        message: mismatch.message[..end].to_owned(),
        ..mismatch.clone()
    }
}

/// Parses the list of workflows to replay: a JSON array of [`ReplayTarget`], at least one.
pub fn parse_targets(text: &str, source: &str) -> Result<Vec<ReplayTarget>, String> {
    let targets: Vec<ReplayTarget> = serde_json::from_str(text).map_err(|e| {
        format!("{source} must be a JSON list of {{\"workflowId\": ..., \"runId\": ...}}: {e}")
    })?;
    if targets.is_empty() {
        return Err(format!("{source} lists no workflows"));
    }
    if let Some(blank) = targets.iter().position(|t| t.workflow_id.trim().is_empty()) {
        return Err(format!("{source}: entry {blank} has an empty workflowId"));
    }
    Ok(targets)
}

/// The list from `TWC_REPLAY_WORKFLOWS` or the file `TWC_REPLAY_WORKFLOWS_FILE` (exactly one).
fn targets_from_env() -> Result<Vec<ReplayTarget>, String> {
    let get = |key: &str| std::env::var(key).ok().filter(|v| !v.trim().is_empty());
    match (
        get("TWC_REPLAY_WORKFLOWS"),
        get("TWC_REPLAY_WORKFLOWS_FILE"),
    ) {
        (Some(text), None) => parse_targets(&text, "TWC_REPLAY_WORKFLOWS"),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(&path)
                .map_err(|e| format!("reading TWC_REPLAY_WORKFLOWS_FILE {path}: {e}"))?;
            parse_targets(&text, &format!("TWC_REPLAY_WORKFLOWS_FILE {path}"))
        }
        (Some(_), Some(_)) => {
            Err("set TWC_REPLAY_WORKFLOWS or TWC_REPLAY_WORKFLOWS_FILE, not both".to_owned())
        }
        (None, None) => Err(
            "no workflows to replay: set TWC_REPLAY_WORKFLOWS (a JSON list) or \
             TWC_REPLAY_WORKFLOWS_FILE (a file holding one)"
                .to_owned(),
        ),
    }
}

/// Runs the check and reports it; returns the process exit code.
pub async fn main(config: Config) -> ExitCode {
    let targets = match targets_from_env() {
        Ok(targets) => targets,
        Err(e) => {
            error!("configuration error: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let report_path = std::env::var("TWC_REPLAY_REPORT_PATH")
        .ok()
        .filter(|p| !p.trim().is_empty());
    let report = match check(&config, &targets).await {
        Ok(report) => report,
        Err(e) => {
            // Nothing was checked (no connection, no replayer): inconclusive, never a pass.
            error!("replay check could not run: {e:#}");
            Report {
                inconclusive: targets
                    .iter()
                    .map(|t| Unchecked {
                        workflow_id: t.workflow_id.clone(),
                        run_id: t.run_id.clone(),
                        reason: format!("{e:#}"),
                    })
                    .collect(),
                ..Report::default()
            }
        }
    };
    println!("{}", json(&report));
    if let Some(path) = report_path
        && let Err(e) = std::fs::write(&path, report.to_json_within(TERMINATION_MESSAGE_LIMIT))
    {
        error!("writing the report to TWC_REPLAY_REPORT_PATH {path}: {e}");
    }
    info!(
        passed = report.passed,
        nondeterministic = report.nondeterministic.len(),
        inconclusive = report.inconclusive.len(),
        "replay check done"
    );
    ExitCode::from(report.exit_code())
}

/// Fetches and replays every target, one at a time (the replayer runs one history at a time).
async fn check(config: &Config, targets: &[ReplayTarget]) -> Result<Report> {
    let started = Instant::now();
    let client = crate::connect(config).await?;
    let options = WorkflowReplayerOptions::new().namespace(config.namespace.clone());
    let options = register_workflows!(options, config).build();
    let replayer = WorkflowReplayer::new(options).context("creating the workflow replayer")?;
    let mut report = Report::default();
    for target in targets {
        let events = match fetch(&client, &config.namespace, target).await {
            Ok(events) => events,
            Err(e) => {
                report.inconclusive.push(Unchecked {
                    workflow_id: target.workflow_id.clone(),
                    run_id: target.run_id.clone(),
                    reason: format!("fetching its history: {e:#}"),
                });
                continue;
            }
        };
        let (workflow_type, run_id) = started_with(&events);
        let count = events.len();
        let outcome = replayer.replay_workflow(History { events }.into()).await;
        match outcome {
            Ok(()) => {
                report.passed += 1;
                report.events += count;
                *report.workflow_types.entry(workflow_type).or_default() += 1;
            }
            Err(WorkflowReplayError::Replay(WorkflowReplayFailure::Nondeterminism { message })) => {
                report.events += count;
                *report
                    .workflow_types
                    .entry(workflow_type.clone())
                    .or_default() += 1;
                report.nondeterministic.push(Mismatch {
                    workflow_id: target.workflow_id.clone(),
                    run_id: run_id.unwrap_or_default(),
                    workflow_type,
                    message: core_message(&message).to_owned(),
                });
            }
            Err(other) => report.inconclusive.push(Unchecked {
                workflow_id: target.workflow_id.clone(),
                run_id: run_id.or_else(|| target.run_id.clone()),
                reason: format!("replaying its {workflow_type} history: {other}"),
            }),
        }
    }
    report.seconds = round_ms(started.elapsed());
    Ok(report)
}

fn round_ms(elapsed: Duration) -> f64 {
    (elapsed.as_secs_f64() * 1000.0).round() / 1000.0
}

async fn fetch(
    client: &Client,
    namespace: &str,
    target: &ReplayTarget,
) -> Result<Vec<HistoryEvent>> {
    let events = WorkflowExecutionInfo::builder()
        .namespace(namespace.to_owned())
        .workflow_id(target.workflow_id.clone())
        .maybe_run_id(target.run_id.clone())
        .build()
        .bind_untyped(client.clone())
        .fetch_history(WorkflowFetchHistoryOptions::default())
        .into_events()
        .await?;
    anyhow::ensure!(!events.is_empty(), "the history is empty");
    Ok(events)
}

/// The workflow type and run ID a history starts with.
fn started_with(events: &[HistoryEvent]) -> (String, Option<String>) {
    match events.first().and_then(|e| e.attributes.as_ref()) {
        Some(Attributes::WorkflowExecutionStartedEventAttributes(started)) => (
            started
                .workflow_type
                .as_ref()
                .map(|t| t.name.clone())
                .unwrap_or_default(),
            Some(started.original_execution_run_id.clone()).filter(|r| !r.is_empty()),
        ),
        _ => (String::new(), None),
    }
}

/// Core wraps its `[TMPRL1100] Nondeterminism error: ...` text in the debug form of a failure;
/// the text alone is what a reader needs.
fn core_message(message: &str) -> &str {
    message
        .find("[TMPRL")
        .map(|start| &message[start..])
        .and_then(|rest| rest.find("\", ").map(|end| &rest[..end]))
        .unwrap_or(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workflow_list_is_a_json_list_of_ids() {
        let one = |id: &str, run: Option<&str>| ReplayTarget {
            workflow_id: id.to_owned(),
            run_id: run.map(str::to_owned),
        };
        for (text, wanted) in [
            (
                r#"[{"workflowId":"a","runId":"r1"},{"workflowId":"b"}]"#,
                Ok(vec![one("a", Some("r1")), one("b", None)]),
            ),
            ("[]", Err("lists no workflows")),
            (
                r#"[{"workflowId":" "}]"#,
                Err("entry 0 has an empty workflowId"),
            ),
            (r#"[{"workflow":"a"}]"#, Err("must be a JSON list")),
            (r#"{"workflowId":"a"}"#, Err("must be a JSON list")),
        ] {
            let got = parse_targets(text, "TWC_REPLAY_WORKFLOWS");
            match (&got, &wanted) {
                (Ok(targets), Ok(wanted)) => assert_eq!(targets, wanted, "{text}"),
                (Err(message), Err(part)) => assert!(
                    message.starts_with("TWC_REPLAY_WORKFLOWS") && message.contains(part),
                    "{text}: {message}"
                ),
                _ => panic!("{text}: got {got:?}, wanted {wanted:?}"),
            }
        }
    }

    fn mismatch(n: usize, message_len: usize) -> Mismatch {
        Mismatch {
            workflow_id: format!("wf-{n}"),
            run_id: format!("run-{n}"),
            workflow_type: "HelloWorld".to_owned(),
            message: "x".repeat(message_len),
        }
    }

    fn unchecked(n: usize) -> Unchecked {
        Unchecked {
            workflow_id: format!("gone-{n}"),
            run_id: None,
            reason: "fetching its history: not found".to_owned(),
        }
    }

    #[test]
    fn the_exit_code_says_mismatch_before_inconclusive_before_pass() {
        let passed = Report {
            passed: 2,
            ..Report::default()
        };
        let inconclusive = Report {
            inconclusive: vec![unchecked(0)],
            ..passed.clone()
        };
        let both = Report {
            nondeterministic: vec![mismatch(0, 10)],
            ..inconclusive.clone()
        };
        assert_eq!(
            [&passed, &inconclusive, &both].map(Report::exit_code),
            [0, EXIT_INCONCLUSIVE, EXIT_FAILURE]
        );
    }

    #[test]
    fn a_report_fits_a_termination_message_keeping_the_first_of_each_kind() {
        let small = Report {
            passed: 3,
            nondeterministic: vec![mismatch(0, 100)],
            ..Report::default()
        };
        assert_eq!(small.to_json_within(4096), json(&small), "fits: unchanged");

        let big = Report {
            passed: 40,
            nondeterministic: (0..30).map(|n| mismatch(n, 3000)).collect(),
            inconclusive: (0..100).map(unchecked).collect(),
            ..Report::default()
        };
        let text = big.to_json_within(4096);
        assert!(text.len() <= 4096, "{} bytes", text.len());
        let value: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
        assert_eq!(value["truncated"], true);
        assert_eq!(value["passed"], 40);
        assert_eq!(value["nondeterministic"][0]["workflowId"], "wf-0");
        assert_eq!(value["inconclusive"][0]["workflowId"], "gone-0");
    }

    #[test]
    fn the_core_message_is_cut_out_of_the_failure_s_debug_form() {
        let debug = r#"Failure { message: "[TMPRL1100] Nondeterminism error: Timer machine does not handle this event: HistoryEvent(id: 5, ActivityTaskScheduled)", source: "" }"#;
        assert_eq!(
            core_message(debug),
            "[TMPRL1100] Nondeterminism error: Timer machine does not handle this event: HistoryEvent(id: 5, ActivityTaskScheduled)"
        );
        assert_eq!(core_message("plain words"), "plain words");
    }
}
