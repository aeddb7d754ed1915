//! `pause`, `resume`, `promote`, `abort`, `retry`: send a control to a TWD's rollout, through
//! the engine Temporal (signal `control` on `twd/<ns>/<name>`) or, with `--via-annotation`,
//! through the `temporal.io/rollout-action` annotation that the controller's watcher turns into
//! that signal.
//!
//! Through the engine the answer is known before anything is sent (the rollout's
//! `control_state` query), so a control that does not apply is reported and not sent. Through
//! the annotation the command waits for the controller to take the annotation and for the
//! event that answers it.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::Event;
use kube::Api;
use kube::api::{Patch, PatchParams};
use temporalio_client::WorkflowSignalOptions;
use twc_crds::TemporalWorkerDeployment;
use twc_workflows::control::{self, ControlEffect, ROLLOUT_ACTION_ANNOTATION};
use twc_workflows::model::{ControlAction, TwdRef};
use twc_workflows::twd_workflow::TwdWorkflow;

use super::engine::EngineArgs;
use super::status::twd_events;
use super::{NotApplicable, TwdArgs, block_on, engine_client, engine_view, get_twd, kube_client};

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
    /// With --via-annotation: seconds to wait for the controller to take the annotation.
    #[arg(long, default_value_t = 60)]
    timeout: u64,
}

/// Event reasons that answer a control.
const ANSWERS: &[&str] = &[
    "ControlIgnored",
    "ControlUnchanged",
    "InvalidRolloutAction",
    "RolloutActionFailed",
    "Paused",
    "Resumed",
    "PromotedByOperator",
    "Aborted",
    "Retrying",
];
/// Answers that mean the control did nothing.
const REFUSALS: &[&str] = &[
    "ControlIgnored",
    "InvalidRolloutAction",
    "RolloutActionFailed",
];
/// How long to wait for the event that answers an annotation once the controller took it.
const ANSWER_WAIT: Duration = Duration::from_secs(15);
const POLL: Duration = Duration::from_millis(500);

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
    if args.via_annotation {
        return via_annotation(&kube, &twd, action, Duration::from_secs(args.timeout)).await;
    }
    let engine = engine_client(&args.engine, Duration::from_secs(15))
        .await
        .context("use --via-annotation when the engine Temporal is not reachable from here")?;
    let view = engine_view(&engine, &twd).await?;
    let answer = match &view.control {
        Some(state) => control::effect(action, state),
        None => control::no_rollout(action, &twd.key()),
    };
    match answer {
        ControlEffect::Apply(message) => {
            let workflow_id = twd.twd_workflow_id();
            engine
                .get_workflow_handle::<TwdWorkflow>(workflow_id.clone())
                .signal(
                    TwdWorkflow::control,
                    action,
                    WorkflowSignalOptions::default(),
                )
                .await
                .with_context(|| format!("signalling workflow {workflow_id}"))?;
            println!("{message}");
            println!(
                "Sent `{}` to workflow {workflow_id}.",
                control::action_name(action)
            );
            Ok(())
        }
        ControlEffect::Unchanged(message) => {
            println!("{message} (nothing sent)");
            Ok(())
        }
        ControlEffect::NotApplicable(message) => Err(NotApplicable(message).into()),
    }
}

/// Sets the annotation, waits until the controller removed it, then for the event that
/// answers it.
async fn via_annotation(
    kube: &kube::Client,
    twd: &TwdRef,
    action: ControlAction,
    timeout: Duration,
) -> anyhow::Result<()> {
    let name = control::action_name(action);
    let before: HashMap<String, String> = twd_events(kube, twd)
        .await?
        .into_iter()
        .filter_map(|e| Some((e.metadata.uid?, e.metadata.resource_version?)))
        .collect();
    let api: Api<TemporalWorkerDeployment> = Api::namespaced(kube.clone(), &twd.namespace);
    let patch =
        serde_json::json!({ "metadata": { "annotations": { ROLLOUT_ACTION_ANNOTATION: name } } });
    api.patch(&twd.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("annotating temporalworkerdeployment {}", twd.key()))?;
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

    let deadline = tokio::time::Instant::now() + ANSWER_WAIT;
    while tokio::time::Instant::now() < deadline {
        let answer = twd_events(kube, twd).await?.into_iter().find(|e| {
            let reason = e.reason.as_deref().unwrap_or_default();
            let new = match (&e.metadata.uid, &e.metadata.resource_version) {
                (Some(uid), Some(version)) => before.get(uid) != Some(version),
                _ => false,
            };
            new && ANSWERS.contains(&reason)
        });
        if let Some(event) = answer {
            return answered(&event);
        }
        tokio::time::sleep(POLL).await;
    }
    println!(
        "No answer yet; follow it with `kubectl twc status {} -n {}`.",
        twd.name, twd.namespace
    );
    Ok(())
}

fn answered(event: &Event) -> anyhow::Result<()> {
    let reason = event.reason.clone().unwrap_or_default();
    let message = event.message.clone().unwrap_or_default();
    if REFUSALS.contains(&reason.as_str()) {
        return Err(NotApplicable(format!("{reason}: {message}")).into());
    }
    println!("{reason}: {message}");
    Ok(())
}
