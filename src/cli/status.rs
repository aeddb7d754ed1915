//! `status NAME`: a readable view of a TWD's rollout for the on-call operator: versions and
//! their states, ramp, step and time to the next one, gate results, the rollout workflow with
//! a Web UI link, recent rollouts (a visibility query) and the last events.
//!
//! The Kubernetes status is enough to print most of it; the engine Temporal, when reachable,
//! adds the exact time of the next step, who holds a pause, and the rollout history.

use std::fmt::Write as _;
use std::time::{Duration, UNIX_EPOCH};

use anyhow::Context as _;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::ListParams;
use temporalio_client::{Client, WorkflowListOptions};
use twc_crds::worker_deployment::{DeprecatedVersion, RolloutStrategy, VersionStatus};
use twc_crds::{TemporalWorkerDeployment, WorkerKind, WorkerObject};
use twc_workflows::control::ControlState;
use twc_workflows::model::{RolloutProgress, TwdRef};
use twc_workflows::rollout_workflow::{MEMO_ROLLOUT_STARTED_AT, SA_BUILD_ID, SA_OUTCOME};

use super::engine::{EngineArgs, sandbox_of};
use super::{
    EngineView, TwdArgs, block_on, engine_client, engine_view, get_twd, human_duration,
    kube_client, url_encode,
};

/// Flags of `status`.
#[derive(clap::Args, Debug, Clone)]
pub struct StatusArgs {
    #[command(flatten)]
    twd: TwdArgs,
    #[command(flatten)]
    engine: EngineArgs,
    /// Temporal Web UI base URL, for links to the rollout workflow (e.g. http://localhost:8233).
    #[arg(long, env = "TWC_UI_URL")]
    ui_url: Option<String>,
    /// Events to show.
    #[arg(long, default_value_t = 10)]
    events: usize,
}

/// How long `status` waits for the engine Temporal before showing Kubernetes' view alone.
const ENGINE_WAIT: Duration = Duration::from_secs(5);
/// Rollouts listed under "Recent rollouts".
const RECENT_ROLLOUTS: usize = 5;
/// Runs read to find them (a rollout that continued as new has several).
const RUNS_READ: usize = 100;

/// Prints the status of the TWD named in `args`.
pub fn run(args: StatusArgs) -> anyhow::Result<()> {
    block_on(async move {
        let text = status(&args).await?;
        print!("{text}");
        Ok(())
    })
}

/// Everything `status` shows.
/// `Scaled` events shown under Autoscaling.
const SCALED_SHOWN: usize = 3;

struct Snapshot {
    twd: WorkerObject,
    twd_ref: TwdRef,
    engine: Result<(EngineView, Vec<RolloutRow>), String>,
    events: Vec<Event>,
    /// The latest `Scaled` events (autoscaling), newest first.
    scaled: Vec<Event>,
    engine_namespace: String,
    ui_url: Option<String>,
    now_ms: i64,
}

/// One line of "Recent rollouts": one rollout, however many runs it took.
#[derive(Debug)]
struct RolloutRow {
    build_id: String,
    status: String,
    outcome: String,
    started_ms: Option<i64>,
}

/// One run of a rollout workflow, as the visibility list returns it.
#[derive(Debug, Clone)]
struct RunRow {
    workflow_id: String,
    build_id: String,
    status: String,
    outcome: String,
    /// The run's own start.
    started_ms: Option<i64>,
    /// The rollout's start, in the memo of a run continued from another.
    rollout_started_ms: Option<i64>,
}

/// Rollouts of `runs` (listed newest first), one per workflow ID, at most `limit`: the newest
/// run's status and outcome, the rollout's start (its first run's).
fn rollout_rows(runs: impl IntoIterator<Item = RunRow>, limit: usize) -> Vec<RolloutRow> {
    let mut seen = std::collections::HashSet::new();
    runs.into_iter()
        .filter(|run| seen.insert(run.workflow_id.clone()))
        .take(limit)
        .map(|run| RolloutRow {
            started_ms: run.rollout_started_ms.or(run.started_ms),
            build_id: run.build_id,
            status: run.status,
            outcome: run.outcome,
        })
        .collect()
}

async fn status(args: &StatusArgs) -> anyhow::Result<String> {
    let (kube, namespace) = kube_client(&args.twd).await?;
    let twd = get_twd(&kube, &namespace, &args.twd.name).await?;
    let twd_ref = TwdRef {
        namespace,
        name: args.twd.name.clone(),
    };
    let sandbox = sandbox_of(args.twd.kubeconfig.as_deref());
    let engine_args = args.engine.or_sandbox(sandbox.as_ref());
    let engine = match engine_client(&engine_args, ENGINE_WAIT).await {
        Ok(client) => engine_parts(&client, &twd_ref).await,
        Err(e) => Err(format!("{e:#}")),
    };
    let mut events = twd_events(&kube, &twd_ref).await?;
    let scaled: Vec<Event> = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some("Scaled"))
        .take(SCALED_SHOWN)
        .cloned()
        .collect();
    events.truncate(args.events);
    let snapshot = Snapshot {
        twd,
        twd_ref,
        engine,
        events,
        scaled,
        engine_namespace: engine_args.namespace().to_owned(),
        ui_url: args
            .ui_url
            .clone()
            .or_else(|| sandbox.and_then(|s| s.temporal_ui_url))
            .map(|u| u.trim_end_matches('/').to_owned())
            .filter(|u| !u.is_empty()),
        now_ms: Timestamp::now().as_millisecond(),
    };
    Ok(render(&snapshot))
}

async fn engine_parts(
    engine: &Client,
    twd: &TwdRef,
) -> Result<(EngineView, Vec<RolloutRow>), String> {
    let view = engine_view(engine, twd)
        .await
        .map_err(|e| format!("{e:#}"))?;
    let rows = recent_rollouts(engine, twd).await.unwrap_or_else(|e| {
        tracing::debug!("listing rollouts: {e}");
        Vec::new()
    });
    Ok((view, rows))
}

/// The visibility query that lists every rollout of a TWD.
pub fn rollouts_query(twd: &TwdRef) -> String {
    format!(
        "WorkflowType='rollout' AND TwcNamespace='{}' AND TwcName='{}'",
        twd.namespace, twd.name
    )
}

async fn recent_rollouts(engine: &Client, twd: &TwdRef) -> anyhow::Result<Vec<RolloutRow>> {
    let options = WorkflowListOptions::builder().limit(RUNS_READ).build();
    let mut stream = engine.list_workflows(rollouts_query(twd), options);
    let mut runs = Vec::new();
    let mut rollouts = std::collections::HashSet::new();
    while let Some(execution) = stream.next().await {
        let execution = execution.context("listing the TWD's rollout workflows")?;
        // Enough once a rollout beyond those shown begins.
        if rollouts.insert(execution.id().to_owned()) && rollouts.len() > RECENT_ROLLOUTS {
            break;
        }
        let attributes = execution.search_attributes();
        runs.push(RunRow {
            workflow_id: execution.id().to_owned(),
            build_id: attributes.get(&SA_BUILD_ID).unwrap_or_default(),
            status: format!("{:?}", execution.status()),
            outcome: attributes.get(&SA_OUTCOME).unwrap_or_default(),
            started_ms: execution
                .start_time()
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .and_then(|d| i64::try_from(d.as_millis()).ok()),
            rollout_started_ms: execution
                .memo()
                .get::<i64>(MEMO_ROLLOUT_STARTED_AT)
                .ok()
                .flatten(),
        });
    }
    Ok(rollout_rows(runs, RECENT_ROLLOUTS))
}

/// The TWD's events (on either kind of its name), newest first.
pub async fn twd_events(kube: &kube::Client, twd: &TwdRef) -> anyhow::Result<Vec<Event>> {
    let api: Api<Event> = Api::namespaced(kube.clone(), &twd.namespace);
    let selector = format!("involvedObject.name={}", twd.name);
    let mut events = api
        .list(&ListParams::default().fields(&selector))
        .await
        .map_err(|e| anyhow::Error::new(e).context(format!("listing events of {}", twd.key())))?
        .items;
    events.retain(|e| {
        e.involved_object
            .kind
            .as_deref()
            .and_then(WorkerKind::from_kind)
            .is_some()
    });
    events.sort_by_key(|e| std::cmp::Reverse(event_time(e)));
    Ok(events)
}

/// When an event last happened, in Unix milliseconds.
pub fn event_time(event: &Event) -> i64 {
    event
        .series
        .as_ref()
        .and_then(|s| s.last_observed_time.as_ref())
        .map(|t| t.0)
        .or_else(|| event.last_timestamp.as_ref().map(|t| t.0))
        .or_else(|| event.event_time.as_ref().map(|t| t.0))
        .or_else(|| event.metadata.creation_timestamp.as_ref().map(|t| t.0))
        .map_or(0, |t| t.as_millisecond())
}

fn render(s: &Snapshot) -> String {
    let mut out = String::new();
    let spec = &s.twd.spec;
    let status = s.twd.status.clone().unwrap_or_default();
    let rollout = status.rollout.clone().unwrap_or_default();
    let view = s.engine.as_ref().ok().map(|(view, _)| view);
    let report = view.and_then(|v| {
        v.twd.last_report.as_ref().filter(|r| {
            v.twd
                .active
                .as_ref()
                .is_some_and(|a| a.workflow_id == r.workflow_id)
        })
    });
    let control = view.and_then(|v| v.control.as_ref());

    let _ = writeln!(out, "{} {}", s.twd.kind, s.twd_ref.key());
    field(&mut out, "Strategy", &strategy(&s.twd));
    let phase = rollout
        .phase
        .map_or_else(|| "-".to_owned(), |p| format!("{p:?}"));
    field(&mut out, "Phase", &phase);
    if let Some(message) = rollout.message.as_deref() {
        field(&mut out, "Message", message);
    }
    for type_ in ["Ready", "Progressing"] {
        if let Some(c) = status.conditions.iter().find(|c| c.type_ == type_) {
            field(&mut out, type_, &format!("{} ({})", c.status, c.reason));
        }
    }

    let _ = writeln!(out, "\nVersions");
    let target_ramp = status
        .target_version
        .as_ref()
        .and_then(|t| t.ramp_percentage);
    let mut rows = vec![row(["ROLE", "BUILD ID", "STATE", "RAMP", "DEPLOYMENT"])];
    if let Some(target) = &status.target_version {
        let current = status.current_version.as_ref().map(|c| c.build_id.as_str());
        if current != Some(target.version.build_id.as_str()) {
            let ramp = target_ramp.map_or_else(|| "-".to_owned(), |p| format!("{p:.0}%"));
            rows.push(version_row("target", &target.version, ramp, ""));
        }
    }
    if let Some(current) = &status.current_version {
        let role = match &status.target_version {
            Some(t) if t.version.build_id == current.build_id => "target, current",
            _ => "current",
        };
        let ramp = format!("{:.0}%", 100.0 - target_ramp.unwrap_or(0.0));
        rows.push(version_row(role, current, ramp, ""));
    }
    for old in &status.deprecated_versions {
        let note = if old.eligible_for_deletion {
            " (eligible for deletion)"
        } else {
            ""
        };
        rows.push(version_row("retired", &old.version, "-".to_owned(), note));
    }
    table(&mut out, &rows);
    let drains: Vec<Vec<String>> = status
        .deprecated_versions
        .iter()
        .filter_map(|old| drain_row(old, s.now_ms))
        .collect();
    if !drains.is_empty() {
        let _ = writeln!(out, "\nDrain (spec.sunset.drain)");
        let mut rows = vec![row(["BUILD ID", "OPEN PINNED", "OLDEST", "DONE", "NEXT"])];
        rows.extend(drains);
        table(&mut out, &rows);
    }

    let _ = writeln!(out, "\nRollout");
    if let Some(step) = step_line(
        s,
        report
            .map(|r| r.step)
            .unwrap_or(rollout.step.map(|x| x.max(0).unsigned_abs())),
    ) {
        field(&mut out, "Step", &step);
    }
    if let Some(next) = next_step_line(s, report, control) {
        field(&mut out, "Next step", &next);
    }
    if let Some(hold) = hold_line(spec.rollout.paused, control) {
        field(&mut out, "Held by", &hold);
    }
    if control.is_some_and(|c| c.promote_requested) {
        field(&mut out, "Promotion", "requested by an operator");
    }
    if let Some(gate) = &spec.rollout.gate {
        let runs = status
            .target_version
            .as_ref()
            .map(|t| t.test_workflows.clone())
            .unwrap_or_default();
        let text = if runs.is_empty() {
            format!("{} (not run yet)", gate.workflow_type)
        } else {
            runs.iter()
                .map(|r| {
                    format!(
                        "{} {} ({} on task queue {})",
                        gate.workflow_type, r.status, r.workflow_id, r.task_queue
                    )
                })
                .collect::<Vec<_>>()
                .join("; ")
        };
        field(&mut out, "Gate", &text);
    }
    if let Some(policy) = &spec.autoscaling {
        let _ = writeln!(out, "\nAutoscaling (spec.autoscaling)");
        let target = match (policy.backlog_per_replica, policy.backlog_age_seconds) {
            (Some(per), _) => format!("{per} waiting tasks per replica"),
            (None, Some(age)) => format!("oldest waiting task {age}s"),
            (None, None) => "-".to_owned(),
        };
        field(
            &mut out,
            "Policy",
            &format!(
                "{}..{} replicas (Current + Ramping), target {target}, windows up {} / down {}, Draining {}..{}",
                policy.min_replicas,
                policy.max_replicas,
                policy.scale_up_window,
                policy.scale_down_window,
                policy.draining.min_replicas,
                policy.draining.max_replicas
            ),
        );
        if s.scaled.is_empty() {
            field(&mut out, "Last change", "none yet");
        }
        for event in &s.scaled {
            let at = ago(s.now_ms, event_time(event));
            field(
                &mut out,
                "Scaled",
                &format!("{at}: {}", event.message.as_deref().unwrap_or_default()),
            );
        }
    }
    if !rollout.analysis.is_empty() {
        let _ = writeln!(out, "\nAnalysis (spec.rollout.analysis)");
        let mut rows = vec![row([
            "CHECK", "STEP", "LAST", "OK", "FAILED", "INCONCL.", "MEASURED",
        ])];
        for check in &rollout.analysis {
            let name = if check.dry_run {
                format!("{} (dry run)", check.name)
            } else {
                check.name.clone()
            };
            let measured = check
                .measured_at
                .as_ref()
                .map_or_else(|| "-".to_owned(), |t| ago(s.now_ms, t.0.as_millisecond()));
            rows.push(vec![
                name,
                (check.step + 1).to_string(),
                check.phase.clone().unwrap_or_else(|| "-".to_owned()),
                check.successful.to_string(),
                check.failed.to_string(),
                check.inconclusive.to_string(),
                measured,
            ]);
        }
        table(&mut out, &rows);
        for check in &rollout.analysis {
            if let Some(message) = &check.message {
                let _ = writeln!(out, "  {}: {message}", check.name);
            }
        }
    }
    let twd_workflow = s.twd_ref.twd_workflow_id();
    match (&rollout.workflow_id, &rollout.run_id) {
        (Some(id), run) => {
            let run_text = run
                .as_deref()
                .map(|r| format!(" (run {r})"))
                .unwrap_or_default();
            field(&mut out, "Workflow", &format!("{id}{run_text}"));
            if let Some(ui) = &s.ui_url {
                let path = match run {
                    Some(run) => format!("{}/{}/history", url_encode(id), url_encode(run)),
                    None => url_encode(id),
                };
                field(
                    &mut out,
                    "Web UI",
                    &format!(
                        "{ui}/namespaces/{}/workflows/{path}",
                        url_encode(&s.engine_namespace)
                    ),
                );
            }
        }
        (None, _) => field(&mut out, "Workflow", "-"),
    }
    field(&mut out, "TWD workflow", &twd_workflow);
    if let Some(ui) = &s.ui_url {
        field(
            &mut out,
            "All rollouts",
            &format!(
                "{ui}/namespaces/{}/workflows?query={}",
                url_encode(&s.engine_namespace),
                url_encode(&rollouts_query(&s.twd_ref))
            ),
        );
    }

    match &s.engine {
        Ok((_, rows)) if !rows.is_empty() => {
            let _ = writeln!(out, "\nRecent rollouts");
            let mut table_rows = vec![row(["BUILD ID", "STATUS", "OUTCOME", "STARTED"])];
            for r in rows {
                table_rows.push(vec![
                    r.build_id.clone(),
                    r.status.clone(),
                    dash(&r.outcome),
                    r.started_ms
                        .map_or_else(|| "-".to_owned(), |t| ago(s.now_ms, t)),
                ]);
            }
            table(&mut out, &table_rows);
        }
        Ok(_) => {}
        Err(e) => {
            let _ = writeln!(
                out,
                "\n(engine Temporal not reachable, showing Kubernetes status only: {e})"
            );
        }
    }

    let _ = writeln!(out, "\nEvents");
    if s.events.is_empty() {
        let _ = writeln!(out, "  (none)");
    } else {
        let mut rows = vec![row(["AGE", "TYPE", "REASON", "MESSAGE"])];
        for e in &s.events {
            let count = e
                .series
                .as_ref()
                .and_then(|x| x.count)
                .or(e.count)
                .filter(|c| *c > 1)
                .map(|c| format!(" (x{c})"))
                .unwrap_or_default();
            rows.push(vec![
                ago(s.now_ms, event_time(e)),
                e.type_.clone().unwrap_or_default(),
                e.reason.clone().unwrap_or_default(),
                format!("{}{count}", e.message.clone().unwrap_or_default()),
            ]);
        }
        table(&mut out, &rows);
    }
    out
}

fn strategy(twd: &TemporalWorkerDeployment) -> String {
    let rollout = &twd.spec.rollout;
    let mut text = match rollout.strategy {
        RolloutStrategy::Progressive => {
            let steps: Vec<String> = rollout
                .steps
                .iter()
                .flatten()
                .map(|s| format!("{}% for {}", s.ramp_percentage, s.pause_duration))
                .collect();
            format!("Progressive: {}", steps.join(", "))
        }
        other => format!("{other:?}"),
    };
    if let Some(gate) = &rollout.gate {
        let _ = write!(text, "; gate {}", gate.workflow_type);
    }
    if rollout.paused {
        text.push_str("; spec.rollout.paused=true");
    }
    text
}

fn step_line(s: &Snapshot, step: Option<u32>) -> Option<String> {
    let steps = s.twd.spec.rollout.steps.as_ref()?;
    let ramping = s
        .twd
        .status
        .as_ref()
        .and_then(|st| st.target_version.as_ref())
        .and_then(|t| t.ramp_percentage)
        .is_some();
    if s.twd.spec.rollout.strategy != RolloutStrategy::Progressive || !ramping {
        return None;
    }
    let index = usize::try_from(step?).ok()?;
    let current = steps.get(index)?;
    Some(format!(
        "{} of {} ({}% for {})",
        index + 1,
        steps.len(),
        current.ramp_percentage,
        current.pause_duration
    ))
}

fn next_step_line(
    s: &Snapshot,
    report: Option<&twc_workflows::model::RolloutReport>,
    control: Option<&ControlState>,
) -> Option<String> {
    if control.is_some_and(|c| c.operator_paused || c.spec_paused)
        || report.is_some_and(|r| r.progress == RolloutProgress::Paused)
    {
        return Some("on hold; the step's remaining pause continues after resume".to_owned());
    }
    let report = report?;
    let at = report.next_step_at?;
    let next = report
        .step
        .and_then(|i| usize::try_from(i).ok())
        .and_then(|i| s.twd.spec.rollout.steps.as_ref()?.get(i + 1))
        .map_or_else(
            || "Current".to_owned(),
            |step| format!("{}%", step.ramp_percentage),
        );
    Some(format!(
        "in {} (then {next})",
        human_duration(at - s.now_ms)
    ))
}

fn hold_line(spec_paused: bool, control: Option<&ControlState>) -> Option<String> {
    let operator = control.is_some_and(|c| c.operator_paused);
    match (spec_paused, operator) {
        (true, true) => Some("spec.rollout.paused and an operator's pause".to_owned()),
        (true, false) => Some("spec.rollout.paused (set it to false to continue)".to_owned()),
        (false, true) => Some("an operator's pause (`resume` to continue)".to_owned()),
        (false, false) => None,
    }
}

fn version_row(role: &str, version: &VersionStatus, ramp: String, note: &str) -> Vec<String> {
    let deployment = version
        .deployment
        .as_ref()
        .and_then(|d| d.name.clone())
        .unwrap_or_else(|| "-".to_owned());
    vec![
        role.to_owned(),
        version.build_id.clone(),
        format!("{:?}", version.status),
        ramp,
        format!("{deployment}{note}"),
    ]
}

/// A retired version's drain: open pinned workflows, the oldest, steps done, the next step.
fn drain_row(old: &DeprecatedVersion, now_ms: i64) -> Option<Vec<String>> {
    if old.open_pinned_workflows.is_none() && old.next_drain_action.is_none() {
        return None;
    }
    let millis = |t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time| t.0.as_millisecond();
    let next = match (&old.next_drain_action, &old.next_drain_action_at) {
        (Some(step), Some(at)) if millis(at) > now_ms => {
            format!("{step} in {}", human_duration(millis(at) - now_ms))
        }
        (Some(step), _) => format!("{step} now"),
        (None, _) => "-".to_owned(),
    };
    Some(vec![
        old.version.build_id.clone(),
        old.open_pinned_workflows
            .map_or_else(|| "-".to_owned(), |n| n.to_string()),
        old.oldest_pinned_workflow_started_at
            .as_ref()
            .map_or_else(|| "-".to_owned(), |t| ago(now_ms, millis(t))),
        dash(&old.drain_steps_done.join(", ")),
        next,
    ])
}

fn ago(now_ms: i64, at_ms: i64) -> String {
    if at_ms <= 0 {
        return "-".to_owned();
    }
    format!("{} ago", human_duration(now_ms - at_ms))
}

fn dash(text: &str) -> String {
    if text.is_empty() {
        "-".to_owned()
    } else {
        text.to_owned()
    }
}

fn row<const N: usize>(cells: [&str; N]) -> Vec<String> {
    cells.iter().map(|c| (*c).to_owned()).collect()
}

fn field(out: &mut String, name: &str, value: &str) {
    let _ = writeln!(out, "  {:<14}{value}", format!("{name}:"));
}

/// Left-aligned columns, two spaces apart; the last column is not padded.
fn table(out: &mut String, rows: &[Vec<String>]) {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for r in rows {
        let mut line = String::from("  ");
        for (i, cell) in r.iter().enumerate() {
            if i + 1 == r.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<width$}  ", width = widths[i]);
            }
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns_and_leave_the_last_one_free() {
        let mut out = String::new();
        table(
            &mut out,
            &[
                row(["AGE", "REASON", "MESSAGE"]),
                row(["5s", "Ramped", "ramped to 30%"]),
            ],
        );
        assert_eq!(
            out,
            "  AGE  REASON  MESSAGE\n  5s   Ramped  ramped to 30%\n"
        );
    }

    #[test]
    fn recent_rollouts_show_one_row_per_rollout_with_its_first_runs_start() {
        let run = |id: &str, status: &str, started: i64, rollout_started: Option<i64>| RunRow {
            workflow_id: format!("rollout/ns/hello/{id}"),
            build_id: id.to_owned(),
            status: status.to_owned(),
            outcome: format!("{status} outcome"),
            started_ms: Some(started),
            rollout_started_ms: rollout_started,
        };
        // v3 runs in its sixth run (five continue-as-new since it started at 1000), newest
        // first; then v2 (one run) and v1 (two runs).
        let mut runs = vec![run("v3", "Running", 6000, Some(1000))];
        for started in [5000, 4000, 3000, 2000] {
            runs.push(run("v3", "ContinuedAsNew", started, Some(1000)));
        }
        runs.push(run("v3", "ContinuedAsNew", 1000, None));
        runs.push(run("v2", "Completed", 900, None));
        runs.push(run("v1", "Completed", 500, Some(100)));
        runs.push(run("v1", "ContinuedAsNew", 100, None));
        let shown: Vec<(String, String, String, Option<i64>)> = rollout_rows(runs.clone(), 5)
            .into_iter()
            .map(|r| (r.build_id, r.status, r.outcome, r.started_ms))
            .collect();
        let row = |id: &str, status: &str, started: i64| {
            let outcome = format!("{status} outcome");
            (id.to_owned(), status.to_owned(), outcome, Some(started))
        };
        assert_eq!(
            shown,
            vec![
                row("v3", "Running", 1000),
                row("v2", "Completed", 900),
                row("v1", "Completed", 100),
            ]
        );
        assert_eq!(rollout_rows(runs, 2).len(), 2, "at most the limit");
    }

    #[test]
    fn the_rollouts_query_selects_one_twd() {
        let twd = TwdRef {
            namespace: "prod".into(),
            name: "orders".into(),
        };
        assert_eq!(
            rollouts_query(&twd),
            "WorkflowType='rollout' AND TwcNamespace='prod' AND TwcName='orders'"
        );
    }
}
