//! One reconcile of a worker deployment object (either kind): its name's claim holder is read
//! from both kinds' stores; the holder's reconcile signals its workflow when its generation or
//! deletion is new to this replica or a nudge is owed, then takes its rollout-action annotation;
//! another object's reconcile only asks for a reconcile of the holder, with a nudge, when it
//! changed. Failures are returned and retried by the controller ([`error_policy`]).

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures::channel::mpsc::UnboundedSender;
use k8s_openapi::NamespaceResourceScope;
use kube::Resource;
use kube::api::ObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use serde::de::DeserializeOwned;
use temporalio_client::Client;
use temporalio_client::errors::{WorkflowStartError, WorkflowUpdateError};
use twc_activities::k8s::K8sError;
use twc_activities::k8s::error::describe;
use twc_crds::worker_deployment::ConnectionKind;
use twc_crds::{TemporalWorkerDeployment, WorkerDeployment};
use twc_workflows::control::ROLLOUT_ACTION_ANNOTATION;
use twc_workflows::model::TwdRef;

use super::WatcherConfig;
use super::actions::{self, Taken};
use super::lists::Watch;
use super::names::{self, NameMemory, Names, SpecPlan, Stored, Workers};
use super::{signal, slim};

/// How soon a failed reconcile (Temporal or Kubernetes unreachable, say) is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// A reconcile that could not do what it had to (retried after [`RETRY_AFTER`]).
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// Looking for a build another controller made failed.
    #[error("looking for a build to take over failed (will retry): {0}")]
    FindAdoptable(#[source] K8sError),
    /// Recording the build taken over failed.
    #[error("recording an adopted build failed (will retry): {0}")]
    RecordAdoption(#[source] K8sError),
    /// The signal-with-start of the TWD's workflow failed.
    #[error("signalling TWD workflow failed (will retry): {0}")]
    Signal(#[source] Box<WorkflowStartError>),
    /// The annotation's removal patch could not be built.
    #[error("building the patch that removes {ROLLOUT_ACTION_ANNOTATION}: {0}")]
    AnnotationPatch(#[source] serde_json::Error),
    /// Removing the annotation failed for a reason that may pass.
    #[error("removing {ROLLOUT_ACTION_ANNOTATION} failed (will retry): {}", describe(.0))]
    RemoveAnnotation(#[source] kube::Error),
    /// Sending a control taken from the annotation failed for a reason that may pass.
    #[error("sending the rollout action {action} failed (will retry): {source}")]
    SendControl {
        /// The control.
        action: &'static str,
        /// Why.
        #[source]
        source: Box<WorkflowUpdateError>,
    },
}

/// A worker deployment kind the watcher reconciles.
pub trait WorkerResource:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + DeserializeOwned
    + Debug
    + Send
    + Sync
    + 'static
{
    /// Its watch, as readiness counts it.
    const WATCH: Watch;

    /// The object as the stores of both kinds are read.
    fn stored(self: Arc<Self>) -> Stored;

    /// Drops what no reader of the stores uses, before its store takes it ([`slim`]).
    fn slim(&mut self);
}

impl WorkerResource for TemporalWorkerDeployment {
    const WATCH: Watch = Watch::TemporalWorkerDeployments;

    fn stored(self: Arc<Self>) -> Stored {
        Stored::Twd(self)
    }

    fn slim(&mut self) {
        slim::metadata(&mut self.metadata);
        slim::status(self.status.as_mut());
    }
}

impl WorkerResource for WorkerDeployment {
    const WATCH: Watch = Watch::WorkerDeployments;

    fn stored(self: Arc<Self>) -> Stored {
        Stored::Wd(self)
    }

    fn slim(&mut self) {
        slim::metadata(&mut self.metadata);
        slim::status(self.status.as_mut());
    }
}

/// Requests a reconcile of an object from its kind's controller (`reconcile_on`).
#[derive(Clone)]
pub struct Triggers {
    /// To the `TemporalWorkerDeployment` controller.
    pub twd: UnboundedSender<ObjectRef<TemporalWorkerDeployment>>,
    /// To the `WorkerDeployment` controller.
    pub wd: UnboundedSender<ObjectRef<WorkerDeployment>>,
}

impl Triggers {
    /// Asks for a reconcile of `object`.
    pub fn reconcile(&self, object: &Stored) {
        // A send fails only once the controller is gone (shutting down).
        match object {
            Stored::Twd(o) => {
                let _ = self.twd.unbounded_send(ObjectRef::from_obj(o.as_ref()));
            }
            Stored::Wd(o) => {
                let _ = self.wd.unbounded_send(ObjectRef::from_obj(o.as_ref()));
            }
        }
    }
}

/// What every reconcile of one watch scope shares.
pub struct Context {
    /// The Kubernetes client.
    pub kube: kube::Client,
    /// The engine's Temporal client.
    pub engine: Client,
    /// The watcher's settings.
    pub config: WatcherConfig,
    /// Both kinds' stores.
    pub workers: Workers,
    /// What is remembered per name.
    pub names: Names,
    /// Reconcile requests to both kinds' controllers.
    pub triggers: Triggers,
}

impl Context {
    /// Owes a nudge to the holders that use the connection of `kind` called `name` (in
    /// `namespace`; any for a ClusterConnection), and asks for their reconciles.
    pub fn nudge_users(&self, kind: ConnectionKind, namespace: Option<&str>, name: &str) {
        for user in self.workers.users_of(kind, namespace, name) {
            tracing::debug!(twd = %user.twd().key(), connection = %name, "connection changed: nudging");
            self.names.with(&user.twd(), NameMemory::owe_nudge);
            self.triggers.reconcile(&user);
        }
    }
}

impl Context {
    /// An object named as `meta` says was deleted (a controller does not reconcile deletions):
    /// the other kind's object of the name, if any, holds the claim now and is nudged; with none
    /// left, the name's memory and gauges go.
    pub fn deleted(&self, meta: &ObjectMeta) {
        let twd = TwdRef {
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
        };
        match names::holder(&self.workers.of_name(&twd)) {
            Some(holder) => {
                self.names.with(&twd, NameMemory::owe_nudge);
                self.triggers.reconcile(holder);
            }
            None => {
                self.names.forget(&twd);
                self.config.metrics.forget_twd(&twd.namespace, &twd.name);
            }
        }
    }
}

/// Retries a failed reconcile after [`RETRY_AFTER`].
pub fn error_policy<K>(_: Arc<K>, _: &WatchError, _: Arc<Context>) -> Action {
    Action::requeue(RETRY_AFTER)
}

/// Reconciles one object of either kind.
pub async fn reconcile<K: WorkerResource>(
    object: Arc<K>,
    context: Arc<Context>,
) -> Result<Action, WatchError> {
    // The claim is decided on both kinds' objects: both stores must hold their first list.
    context.workers.ready().await;
    let object = K::stored(object);
    let twd = object.twd();
    let objects = context.workers.of_name(&twd);
    let Some(holder) = names::holder(&objects) else {
        return Ok(Action::await_change());
    };
    context
        .config
        .metrics
        .twd_status(&twd.namespace, &twd.name, holder.status());
    if holder.kind() != object.kind() {
        // Refused, or handing over: its name's workflow settles it in a turn.
        let (kind, seen) = (object.kind(), object.seen());
        let changed = context.names.with(&twd, |m| {
            let changed = m.other_changed(kind, seen);
            if changed {
                m.owe_nudge();
            }
            changed
        });
        if changed {
            context.triggers.reconcile(holder);
        }
        return Ok(Action::await_change());
    }
    reconcile_holder(&context, &twd, holder).await?;
    Ok(Action::await_change())
}

/// Signals the holder's workflow if it must hear of it, then handles its annotation.
async fn reconcile_holder(
    context: &Context,
    twd: &TwdRef,
    holder: &Stored,
) -> Result<(), WatchError> {
    let seen = holder.seen();
    let handled = signal::signalled_before(holder.meta(), holder.status());
    let plan = context
        .names
        .with(twd, |m| m.plan(&seen, holder.kind(), handled));
    tracing::debug!(twd = %twd.key(), ?plan, "reconciling the claim holder");
    let fresh = match plan {
        SpecPlan::HandledBefore => return Ok(()),
        SpecPlan::Unchanged => false,
        SpecPlan::Signal { nudge, fresh } => {
            let object = holder.to_object();
            let signalled = signal::signal_twd(
                &context.kube,
                &context.engine,
                &context.config,
                &object,
                nudge,
            )
            .await;
            if let Err(e) = signalled {
                if nudge {
                    context.names.with(twd, NameMemory::owe_nudge);
                }
                return Err(e);
            }
            context.names.with(twd, |m| m.signalled(seen));
            fresh
        }
    };
    if fresh {
        let restricted = !context.config.namespaces.is_empty();
        actions::warn_unsupported_connection(&context.kube, restricted, holder).await;
    }
    rollout_action(context, twd, holder).await
}

/// Sends a control taken earlier and not sent yet, then takes the holder's rollout-action
/// annotation, if any.
async fn rollout_action(
    context: &Context,
    twd: &TwdRef,
    holder: &Stored,
) -> Result<(), WatchError> {
    if let Some(action) = context.names.with(twd, NameMemory::take_unsent) {
        send_control(context, twd, action).await?;
    }
    let uid = holder.seen().uid;
    let value = actions::annotation(holder);
    let pending = context
        .names
        .with(twd, |m| m.action_pending(value.map(|v| (uid.as_str(), v))));
    let Some(value) = value.filter(|_| pending) else {
        return Ok(());
    };
    let taken = actions::take(&context.kube, holder, value).await?;
    context.names.with(twd, |m| m.action_handled(&uid, value));
    match taken {
        Taken::Nothing => Ok(()),
        Taken::Control(action) => send_control(context, twd, action).await,
    }
}

/// Sends a control this replica took; keeps it to send again when that fails.
async fn send_control(
    context: &Context,
    twd: &TwdRef,
    action: twc_workflows::model::ControlAction,
) -> Result<(), WatchError> {
    let sent = actions::send_control(
        &context.kube,
        &context.engine,
        &context.config.metrics,
        twd,
        action,
    )
    .await;
    if sent.is_err() {
        context.names.with(twd, |m| m.keep_unsent(action));
    }
    sent
}
