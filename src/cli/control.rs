//! `pause`, `resume`, `promote`, `abort`, `retry`: send a control to a TWD's rollout, through
//! the engine Temporal (the `control` update of the TWD's workflow, which accepts it with what it
//! does or rejects it with why) or, with `--via-annotation`, through the
//! `temporal.io/rollout-action` annotation, which the controller's watcher sends as the same
//! update.
//!
//! Through the engine the answer is synchronous: `accepted: <what it does>` (exit 0) or
//! `rejected: <why>` (exit 1). Through the annotation the command waits for the controller to
//! take the annotation and for the event that answers it.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::Event;
use kube::api::{Patch, PatchParams};
use temporalio_client::errors::WorkflowUpdateError;
use temporalio_client::{Client, WorkflowExecuteUpdateOptions};
use twc_workflows::control::{self, ROLLOUT_ACTION_ANNOTATION};
use twc_workflows::model::{ControlAction, TwdRef};
use twc_workflows::twd_workflow::TwdWorkflow;

use super::engine::EngineArgs;
use super::status::twd_events;
use super::{NotApplicable, TwdArgs, block_on, engine_args, engine_client, get_twd, kube_client};

/// Flags of the control commands.
#[derive(clap::Args, Debug, Clone)]
pub struct ControlArgs {
    #[command(flatten)]
    twd: TwdArgs,
    #[command(flatten)]
    engine: EngineArgs,
    /// Send the control through the `temporal.io/rollout-action` annotation instead of the
    /// engine Temporal (for when only the Kubernetes API is reachable from here).
    #[arg(long)]
    via_annotation: bool,
    /// With --via-annotation: seconds to wait for the controller to take the annotation, then
    /// for the event that answers it.
    #[arg(long, default_value_t = 60)]
    timeout: u64,
}

/// How long the rollout workflow has to accept or reject an update (it needs a controller).
const UPDATE_WAIT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(500);

/// The answer to a control.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Taken; what it does (or that it was already so).
    Accepted(String),
    /// Not taken; why.
    Rejected(String),
    /// Sent, with no answer yet; what to do to follow it.
    Unanswered(String),
}

/// Sends `action` to the rollout of the TWD named in `args`.
pub fn run(action: ControlAction, args: ControlArgs) -> anyhow::Result<()> {
    block_on(send(action, args))
}

async fn send(action: ControlAction, args: ControlArgs) -> anyhow::Result<()> {
    let (kube, namespace) = kube_client(&args.twd).await?;
    get_twd(&kube, &namespace, &args.twd.name).await?;
    let twd = TwdRef {
        namespace,
        name: args.twd.name.clone(),
    };
    let answer = if args.via_annotation {
        via_annotation(&kube, &twd, action, Duration::from_secs(args.timeout)).await?
    } else {
        let engine = engine_client(
            &engine_args(&args.engine, &args.twd),
            Duration::from_secs(15),
        )
        .await
        .context("use --via-annotation when the engine Temporal is not reachable from here")?;
        through_engine(&engine, &twd, action).await?
    };
    match answer {
        Answer::Accepted(message) => {
            println!("accepted: {message}");
            Ok(())
        }
        Answer::Rejected(reason) => Err(NotApplicable(reason).into()),
        Answer::Unanswered(message) => {
            println!("{message}");
            Ok(())
        }
    }
}

/// Sends `action` as the `control` update of the TWD's workflow, the one entry point of
/// controls: it accepts the control with what it does (and forwards it to the rollout in
/// flight, or rolls an aborted build out again) or refuses it with why. The
/// dashboard's buttons use it too.
pub async fn through_engine(
    engine: &Client,
    twd: &TwdRef,
    action: ControlAction,
) -> anyhow::Result<Answer> {
    let workflow_id = twd.twd_workflow_id();
    let handle = engine.get_workflow_handle::<TwdWorkflow>(workflow_id.clone());
    let update = handle.execute_update(
        TwdWorkflow::control_update,
        action,
        WorkflowExecuteUpdateOptions::default(),
    );
    match tokio::time::timeout(UPDATE_WAIT, update).await {
        Ok(Ok(answer)) => Ok(Answer::Accepted(answer)),
        Ok(Err(WorkflowUpdateError::Failed(failure))) => Ok(Answer::Rejected(failure.message)),
        Ok(Err(WorkflowUpdateError::NotFound(_))) => Ok(Answer::Rejected(format!(
            "{}: workflow {workflow_id} does not run; the controller starts it for every worker \
             deployment it watches",
            control::action_name(action)
        ))),
        Ok(Err(e)) => Err(anyhow::Error::new(e).context(format!(
            "sending `{}` to workflow {workflow_id}",
            control::action_name(action)
        ))),
        Err(_) => anyhow::bail!(
            "workflow {workflow_id} took no decision on `{}` within {}s: is the controller running?",
            control::action_name(action),
            UPDATE_WAIT.as_secs()
        ),
    }
}

/// Sets the annotation, waits until the controller removed it, then for the event that
/// answers it.
async fn via_annotation(
    kube: &kube::Client,
    twd: &TwdRef,
    action: ControlAction,
    timeout: Duration,
) -> anyhow::Result<Answer> {
    let name = control::action_name(action);
    let before: HashMap<String, String> = twd_events(kube, twd)
        .await?
        .into_iter()
        .filter_map(|e| Some((e.metadata.uid?, e.metadata.resource_version?)))
        .collect();
    let holder = get_twd(kube, &twd.namespace, &twd.name).await?;
    let api = twc_activities::k8s::twd::worker_api(kube, &twd.namespace, holder.kind);
    let patch =
        serde_json::json!({ "metadata": { "annotations": { ROLLOUT_ACTION_ANNOTATION: name } } });
    api.patch(&twd.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("annotating {} {}", holder.kind, twd.key()))?;
    println!(
        "Annotated {} with {ROLLOUT_ACTION_ANNOTATION}={name}.",
        twd.key()
    );

    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let current = get_twd(kube, &twd.namespace, &twd.name).await?;
        let pending = current
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ROLLOUT_ACTION_ANNOTATION))
            .is_some_and(|v| v == name);
        if !pending {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!(
                "the controller has not taken the annotation within {}s: is it running and watching namespace {:?}? The annotation stays and is applied when it does.",
                timeout.as_secs(),
                twd.namespace
            );
        }
        tokio::time::sleep(POLL).await;
    }
    println!("The controller took `{name}`.");

    let deadline = tokio::time::Instant::now() + timeout;
    while tokio::time::Instant::now() < deadline {
        let new_events = twd_events(kube, twd).await?.into_iter().filter(|e| {
            match (&e.metadata.uid, &e.metadata.resource_version) {
                (Some(uid), Some(version)) => before.get(uid) != Some(version),
                _ => false,
            }
        });
        if let Some(answer) = answer_of(action, new_events) {
            return Ok(answer);
        }
        tokio::time::sleep(POLL).await;
    }
    Ok(Answer::Unanswered(format!(
        "No answer yet; follow it with `kubectl twc status {} -n {}`.",
        twd.name, twd.namespace
    )))
}

/// What an event answering a control says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Verdict {
    /// Not about this control.
    Unrelated,
    /// It did not apply.
    Refused,
    /// Applied, or already so.
    Taken,
}

/// The answer among new events of the TWD to `action` sent by annotation: a control that was
/// applied (or already so) wins over a refusal seen at the same time.
fn answer_of(action: ControlAction, events: impl IntoIterator<Item = Event>) -> Option<Answer> {
    let (verdict, event) = events
        .into_iter()
        .map(|e| (verdict(action, &e), e))
        .filter(|(v, _)| *v != Verdict::Unrelated)
        .max_by_key(|(v, _)| *v)?;
    let text = format!(
        "{}: {}",
        event.reason.unwrap_or_default(),
        event.message.unwrap_or_default()
    );
    Some(match verdict {
        Verdict::Taken => Answer::Accepted(text),
        Verdict::Refused | Verdict::Unrelated => Answer::Rejected(text),
    })
}

/// Whether `event` answers `action`, and how.
fn verdict(action: ControlAction, event: &Event) -> Verdict {
    let name = control::action_name(action);
    let reason = event.reason.as_deref().unwrap_or_default();
    let message = event.message.as_deref().unwrap_or_default();
    let about_it = message.starts_with(&format!("{name}:"));
    let applied = match action {
        ControlAction::Pause => "Paused",
        ControlAction::Resume => "Resumed",
        ControlAction::Promote => "PromotedByOperator",
        ControlAction::Abort => "Aborted",
        ControlAction::Retry => "Retrying",
    };
    match reason {
        r if r == applied => Verdict::Taken,
        control::REASON_UNCHANGED if about_it => Verdict::Taken,
        control::REASON_IGNORED if about_it => Verdict::Refused,
        "InvalidRolloutAction" | "RolloutActionFailed"
            if message.contains(&format!("{ROLLOUT_ACTION_ANNOTATION}={name}")) =>
        {
            Verdict::Refused
        }
        _ => Verdict::Unrelated,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(reason: &str, message: &str) -> Event {
        Event {
            reason: Some(reason.to_owned()),
            message: Some(message.to_owned()),
            ..Event::default()
        }
    }

    #[test]
    fn an_applied_control_is_reported_even_beside_a_refusal() {
        let events = [
            event("ControlIgnored", "promote: build v2 is already Current"),
            event("PromotedByOperator", "Build v2 is now Current"),
            event("RolloutComplete", "Build v2 is Current"),
        ];
        assert_eq!(
            answer_of(ControlAction::Promote, events),
            Some(Answer::Accepted(
                "PromotedByOperator: Build v2 is now Current".to_owned()
            ))
        );
    }

    #[test]
    fn only_answers_to_this_control_count() {
        let cases = [
            (
                ControlAction::Pause,
                event("ControlUnchanged", "pause: already paused"),
                Verdict::Taken,
            ),
            (
                ControlAction::Pause,
                event("ControlUnchanged", "resume: not paused"),
                Verdict::Unrelated,
            ),
            (
                ControlAction::Retry,
                event("ControlIgnored", "retry: nothing to retry"),
                Verdict::Refused,
            ),
            (
                ControlAction::Abort,
                event("Aborted", "Rollout of build v3 aborted"),
                Verdict::Taken,
            ),
            (
                ControlAction::Promote,
                event("Ramped", "Build v2 ramped to 10%"),
                Verdict::Unrelated,
            ),
            (
                ControlAction::Promote,
                event(
                    "RolloutActionFailed",
                    "temporal.io/rollout-action=promote was not applied",
                ),
                Verdict::Refused,
            ),
        ];
        for (action, event, expected) in cases {
            assert_eq!(verdict(action, &event), expected, "{action:?} {event:?}");
        }
        assert_eq!(answer_of(ControlAction::Pause, []), None);
    }
}
