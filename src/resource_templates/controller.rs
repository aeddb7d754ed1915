//! The WorkerResourceTemplate controller: a kube-runtime [`Controller`] over templates that also
//! wakes a template when a versioned Deployment of its worker changes (created, deleted by the
//! sunset, ...) and when its worker deployment (either kind) changes. Each reconcile reads the
//! worker and its live Deployments, plans ([`super::plan`]), applies copies with server-side
//! apply (field manager `twc`, forced), deletes copies of retired versions, and writes the
//! status. Every replica runs it: each step is idempotent and a status that would not change is
//! not written.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, PartialObjectMeta, Patch, PatchParams,
};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use twc_activities::k8s::conditions::merge_patch;
use twc_activities::k8s::deployment_view::is_controlled_by;
use twc_activities::k8s::error::{describe, is_not_found};
use twc_activities::k8s::{K8sError, ObjectName, read_claim};
use twc_crds::resource_template::checks::kind_allowed;
use twc_crds::resource_template::{TemplateVersionStatus, WorkerResourceTemplateStatus};
use twc_crds::{
    TemporalWorkerDeployment, WorkerDeployment, WorkerResourceTemplate, labels, naming,
};
use twc_workflows::contract::EventKind;
use twc_workflows::model::TwdRef;

use super::kinds::{KindError, KindResolver};
use super::plan::{self, CopyRef, Inputs, LiveVersion, Step, WorkerView};

/// Field manager of the copies' server-side applies.
pub const FIELD_MANAGER: &str = "twc";
/// How often each template's copies are applied whatever their hash says (repairing copies
/// edited or deleted by hand) and strays of a lost status are swept.
const FULL_APPLY_EVERY: Duration = Duration::from_secs(600);
/// When a copy failed, how soon it is tried again.
const RETRY_FAILED_AFTER: Duration = Duration::from_secs(30);
/// When a reconcile could not read what it needs, how soon it is tried again.
const RETRY_ERROR_AFTER: Duration = Duration::from_secs(10);
/// Changes arriving this close together are reconciled once.
const DEBOUNCE: Duration = Duration::from_millis(500);

/// What the controller needs.
#[derive(Clone)]
pub struct TemplatesConfig {
    /// Namespaces to watch (empty: all).
    pub namespaces: Vec<String>,
    /// Kinds a template may render (`--wrt-allowed-kinds`).
    pub allowed_kinds: Vec<String>,
}

/// A reconcile that could not read or write what it needs (retried).
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The worker deployment could not be read.
    #[error("reading the worker deployment of {template}: {source}")]
    Worker {
        /// The template.
        template: ObjectName,
        /// Why.
        source: Box<K8sError>,
    },
    /// The versioned Deployments could not be listed.
    #[error(
        "listing the Deployments of {template}'s worker deployment: {}",
        describe(source)
    )]
    Deployments {
        /// The template.
        template: ObjectName,
        /// Why.
        source: kube::Error,
    },
    /// The status could not be written.
    #[error("writing the status of {template}: {}", describe(source))]
    Status {
        /// The template.
        template: ObjectName,
        /// Why.
        source: kube::Error,
    },
}

/// Shared by every reconcile.
struct Context {
    client: Client,
    allowed_kinds: Vec<String>,
    kinds: KindResolver,
    /// When each template (by UID) last had every copy applied.
    full_applies: Mutex<HashMap<String, Instant>>,
}

impl Context {
    fn full_due(&self, uid: &str) -> bool {
        self.full_applies()
            .get(uid)
            .is_none_or(|at| at.elapsed() + RETRY_ERROR_AFTER >= FULL_APPLY_EVERY)
    }

    fn full_done(&self, uid: &str) {
        self.full_applies().insert(uid.to_owned(), Instant::now());
    }

    fn full_applies(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.full_applies
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Runs the controller (one per watched namespace, or one for all) until `shutdown` completes.
pub async fn run(
    client: Client,
    config: TemplatesConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let context = Arc::new(Context {
        client: client.clone(),
        allowed_kinds: config.allowed_kinds,
        kinds: KindResolver::new(client.clone()),
        full_applies: Mutex::new(HashMap::new()),
    });
    let shutdown = shutdown.boxed().shared();
    let scopes: Vec<Option<String>> = if config.namespaces.is_empty() {
        vec![None]
    } else {
        config.namespaces.into_iter().map(Some).collect()
    };
    let controllers = scopes.into_iter().map(|namespace| {
        run_in(
            client.clone(),
            namespace,
            Arc::clone(&context),
            shutdown.clone(),
        )
    });
    futures::future::join_all(controllers).await;
}

/// The API of `K` in `namespace` (every namespace when `None`).
fn scoped<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    }
}

async fn run_in(
    client: Client,
    namespace: Option<String>,
    context: Arc<Context>,
    shutdown: futures::future::Shared<futures::future::BoxFuture<'static, ()>>,
) {
    let namespace = namespace.as_deref();
    let templates = scoped::<WorkerResourceTemplate>(&client, namespace);
    let controller = Controller::new(templates, watcher::Config::default()).with_config(
        controller::Config::default()
            .debounce(DEBOUNCE)
            .concurrency(16),
    );
    let store = controller.store();
    let by_deployment = store.clone();
    let by_wd = store.clone();
    let by_twd = store;
    // The other objects are watched by their metadata alone: the mappers read names, labels
    // and namespaces, and a full Deployment, TWD or WorkerDeployment (pod template, status) is
    // many times larger to receive and decode, at every list and every status update.
    let deployments = watcher::watcher(
        scoped::<PartialObjectMeta<Deployment>>(&client, namespace),
        watcher::Config::default().labels(labels::DEPLOYMENT_NAME),
    );
    let worker_deployments = watcher::watcher(
        scoped::<PartialObjectMeta<WorkerDeployment>>(&client, namespace),
        watcher::Config::default(),
    );
    let twds = watcher::watcher(
        scoped::<PartialObjectMeta<TemporalWorkerDeployment>>(&client, namespace),
        watcher::Config::default(),
    );
    controller
        .watches_stream(
            deployments.default_backoff().touched_objects(),
            move |deployment: PartialObjectMeta<Deployment>| {
                let label = deployment.labels().get(labels::DEPLOYMENT_NAME).cloned();
                let namespace = deployment.namespace();
                templates_of(&by_deployment, namespace.as_deref(), |worker| {
                    label.as_deref() == Some(naming::deployment_name_label(worker).as_str())
                })
            },
        )
        .watches_stream(
            worker_deployments.default_backoff().touched_objects(),
            move |worker: PartialObjectMeta<WorkerDeployment>| {
                let name = worker.name_any();
                templates_of(&by_wd, worker.namespace().as_deref(), |w| w == name)
            },
        )
        .watches_stream(
            twds.default_backoff().touched_objects(),
            move |worker: PartialObjectMeta<TemporalWorkerDeployment>| {
                let name = worker.name_any();
                templates_of(&by_twd, worker.namespace().as_deref(), |w| w == name)
            },
        )
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, context)
        .for_each(|result| async move {
            match result {
                Ok((template, _)) => {
                    tracing::debug!(%template, "reconciled WorkerResourceTemplate")
                }
                Err(controller::Error::ReconcilerFailed(error, template)) => {
                    tracing::warn!(%template, "WorkerResourceTemplate: {error}");
                }
                Err(controller::Error::QueueError(error)) => {
                    tracing::warn!("WorkerResourceTemplate controller: watching: {error}");
                }
                Err(error) => tracing::debug!("WorkerResourceTemplate controller: {error}"),
            }
        })
        .await;
}

/// The templates in `namespace` whose worker deployment's name `matches`.
fn templates_of(
    store: &Store<WorkerResourceTemplate>,
    namespace: Option<&str>,
    matches: impl Fn(&str) -> bool,
) -> Vec<ObjectRef<WorkerResourceTemplate>> {
    store
        .state_filter(|t| {
            t.namespace().as_deref() == namespace && t.spec.worker_name().is_some_and(&matches)
        })
        .iter()
        .map(|t| ObjectRef::from_obj(t.as_ref()))
        .collect()
}

fn error_policy(_: Arc<WorkerResourceTemplate>, _: &TemplateError, _: Arc<Context>) -> Action {
    Action::requeue(RETRY_ERROR_AFTER)
}

async fn reconcile(
    template: Arc<WorkerResourceTemplate>,
    context: Arc<Context>,
) -> Result<Action, TemplateError> {
    if template.metadata.deletion_timestamp.is_some() {
        // Its copies are owned by it: the garbage collector deletes them.
        return Ok(Action::await_change());
    }
    let namespace = template.namespace().unwrap_or_default();
    let object = ObjectName::new("WorkerResourceTemplate", &namespace, &template.name_any());
    let Some(worker_name) = template.spec.worker_name() else {
        // The CRD refuses a template without a reference.
        return Ok(Action::await_change());
    };
    let worker_ref = TwdRef {
        namespace: namespace.clone(),
        name: worker_name.to_owned(),
    };
    let claim = read_claim(&context.client, &worker_ref)
        .await
        .map_err(|source| TemplateError::Worker {
            template: object.clone(),
            source: Box::new(source),
        })?;
    let (worker, versions) = match &claim {
        Some(claim) => {
            let owners: Vec<&str> = std::iter::once(&claim.holder)
                .chain(&claim.others)
                .map(|o| o.object_uid())
                .collect();
            let versions = live_versions(&context.client, &worker_ref, &owners)
                .await
                .map_err(|source| TemplateError::Deployments {
                    template: object.clone(),
                    source,
                })?;
            let holder = &claim.holder;
            let worker = WorkerView {
                describe: format!("{} {}", holder.kind, holder.name_any()),
                name: holder.name_any(),
                temporal_namespace: holder.spec.worker_options.temporal_namespace.clone(),
                autoscaling: holder.spec.autoscaling.is_some(),
            };
            (Some(worker), versions)
        }
        None => (None, Vec::new()),
    };
    let uid = template.metadata.uid.clone().unwrap_or_default();
    let full = context.full_due(&uid);
    let kind_refused = kind_allowed(
        template.spec.template_kind().unwrap_or_default(),
        &context.allowed_kinds,
    )
    .err();
    let plan = plan::plan(Inputs {
        template: &template,
        worker: worker.as_ref(),
        versions: &versions,
        kind_refused: kind_refused.as_deref(),
        full,
    });
    let now = Time(Timestamp::now());
    let generation = template.metadata.generation.unwrap_or_default();
    let previous = plan::entries_by_build(&template);
    let mut entries = Vec::new();
    for step in &plan.steps {
        let before = |build: &str| previous.get(build).copied();
        match step {
            Step::Keep { entry } => entries.push(entry.clone()),
            Step::Unrenderable {
                build_id,
                name,
                error,
            } => entries.push(plan::failed_entry(
                build_id,
                None,
                name,
                error,
                before(build_id),
                &now,
            )),
            Step::Apply {
                build_id,
                copy,
                replaces,
            } => {
                let copy_ref = CopyRef {
                    name: copy.name.clone(),
                    api_version: copy.api_version.clone(),
                    kind: copy.kind.clone(),
                };
                let replaced = match replaces {
                    Some(old) => delete_copy(&context, &namespace, old).await,
                    None => Ok(()),
                };
                let applied = match replaced {
                    Ok(()) => apply_copy(&context, &namespace, &copy_ref, &copy.object).await,
                    Err(e) => Err(e),
                };
                entries.push(match applied {
                    Ok(()) => {
                        plan::applied_entry(build_id, copy, generation, before(build_id), &now)
                    }
                    Err(error) => plan::failed_entry(
                        build_id,
                        Some(&copy_ref),
                        &copy.name,
                        &error,
                        before(build_id),
                        &now,
                    ),
                });
            }
            Step::Delete { build_id, copy } => {
                if let Err(error) = delete_copy(&context, &namespace, copy).await {
                    entries.push(plan::failed_entry(
                        build_id,
                        Some(copy),
                        &copy.name,
                        &error,
                        before(build_id),
                        &now,
                    ));
                }
            }
        }
    }
    if full
        && plan.blocked.is_none()
        && let Some(worker) = &worker
    {
        let keep: Vec<&str> = entries.iter().map(|e| e.resource_name.as_str()).collect();
        sweep_strays(&context, &template, &worker.name, &keep).await;
    }
    let failed = entries.iter().any(|e| e.apply_error.is_some());
    report_new_failures(&context, &template, &previous, &entries).await;
    let status = plan::status(
        template.status.as_ref(),
        generation,
        entries,
        plan.blocked.as_ref(),
        &now,
    );
    write_status(&context.client, &template, &object, status).await?;
    if failed {
        return Ok(Action::requeue(RETRY_FAILED_AFTER));
    }
    if full {
        context.full_done(&uid);
    }
    Ok(Action::requeue(FULL_APPLY_EVERY))
}

/// The worker's versions with a Deployment controlled by one of `owners` (the objects of either
/// kind with its name: the claim moves between them) and not being deleted.
async fn live_versions(
    client: &Client,
    worker: &TwdRef,
    owners: &[&str],
) -> Result<Vec<LiveVersion>, kube::Error> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), &worker.namespace);
    let selector = format!(
        "{}={}",
        labels::DEPLOYMENT_NAME,
        naming::deployment_name_label(&worker.name)
    );
    let deployments = api.list(&ListParams::default().labels(&selector)).await?;
    Ok(deployments
        .items
        .into_iter()
        .filter(|d| d.metadata.deletion_timestamp.is_none())
        .filter(|d| owners.iter().any(|uid| is_controlled_by(d, uid)))
        .filter_map(|d| {
            let build_id = d.labels().get(labels::BUILD_ID)?.clone();
            let selector = d
                .spec
                .as_ref()
                .and_then(|s| s.selector.match_labels.clone())
                .unwrap_or_default();
            Some(LiveVersion {
                build_id,
                deployment_name: d.name_any(),
                selector,
            })
        })
        .collect())
}

/// The API of `copy`'s kind in `namespace`; `Ok(None)` when the API server serves no such
/// namespaced kind.
async fn copy_api(
    context: &Context,
    namespace: &str,
    copy: &CopyRef,
) -> Result<Option<Api<DynamicObject>>, KindError> {
    let served = match context.kinds.resolve(&copy.api_version, &copy.kind).await {
        Ok(served) => served,
        Err(KindError::NotServed { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(served
        .namespaced
        .then(|| Api::namespaced_with(context.client.clone(), namespace, &served.resource)))
}

/// Server-side applies `object` (the copy `copy`).
async fn apply_copy(
    context: &Context,
    namespace: &str,
    copy: &CopyRef,
    object: &serde_json::Value,
) -> Result<(), String> {
    let api = match copy_api(context, namespace, copy).await {
        Ok(Some(api)) => api,
        Ok(None) => {
            // Not served, or cluster-scoped: say which.
            return Err(
                match context.kinds.resolve(&copy.api_version, &copy.kind).await {
                    Ok(_) => format!(
                        "{} is cluster-scoped: a WorkerResourceTemplate renders namespaced resources",
                        copy.kind
                    ),
                    Err(e) => e.to_string(),
                },
            );
        }
        Err(e) => return Err(e.to_string()),
    };
    match api
        .patch(
            &copy.name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(object),
        )
        .await
    {
        Ok(_) => {
            tracing::info!(kind = %copy.kind, name = %copy.name, %namespace, "applied WorkerResourceTemplate copy");
            Ok(())
        }
        Err(e) => {
            if matches!(&e, kube::Error::Api(status) if status.code == 404) {
                context.kinds.forget(&copy.api_version, &copy.kind);
            }
            Err(format!(
                "applying {} {}: {}",
                copy.kind,
                copy.name,
                describe(&e)
            ))
        }
    }
}

/// Deletes the copy `copy`; one already gone (or of a kind no longer served) counts as deleted.
async fn delete_copy(context: &Context, namespace: &str, copy: &CopyRef) -> Result<(), String> {
    let api = match copy_api(context, namespace, copy).await {
        Ok(Some(api)) => api,
        Ok(None) => return Ok(()),
        Err(e) => return Err(e.to_string()),
    };
    match api.delete(&copy.name, &DeleteParams::background()).await {
        Ok(_) => {
            tracing::info!(kind = %copy.kind, name = %copy.name, %namespace, "deleted WorkerResourceTemplate copy");
            Ok(())
        }
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(format!(
            "deleting {} {}: {}",
            copy.kind,
            copy.name,
            describe(&e)
        )),
    }
}

/// Deletes copies of `template` that its status no longer names (left by a status write that
/// failed after an apply): objects of its kind labelled with the worker deployment's name and
/// controlled by the template, other than `keep`. Best effort: a failure waits for the next
/// full pass.
async fn sweep_strays(
    context: &Context,
    template: &WorkerResourceTemplate,
    worker_name: &str,
    keep: &[&str],
) {
    let (Some(api_version), Some(kind)) = (
        template.spec.template_api_version(),
        template.spec.template_kind(),
    ) else {
        return;
    };
    let namespace = template.namespace().unwrap_or_default();
    let copy = CopyRef {
        name: String::new(),
        api_version: api_version.to_owned(),
        kind: kind.to_owned(),
    };
    let Ok(Some(api)) = copy_api(context, &namespace, &copy).await else {
        return;
    };
    let selector = format!(
        "{}={}",
        labels::DEPLOYMENT_NAME,
        naming::deployment_name_label(worker_name)
    );
    let uid = template.metadata.uid.as_deref().unwrap_or_default();
    let listed = match api
        .list_metadata(&ListParams::default().labels(&selector))
        .await
    {
        Ok(listed) => listed.items,
        Err(e) => {
            tracing::debug!(%namespace, kind, "listing copies to sweep: {}", describe(&e));
            return;
        }
    };
    for stray in listed.iter().filter(|o| {
        o.owner_references()
            .iter()
            .any(|r| r.controller == Some(true) && r.uid == uid)
            && !keep.contains(&o.name_any().as_str())
    }) {
        let stray = CopyRef {
            name: stray.name_any(),
            ..copy.clone()
        };
        if let Err(e) = delete_copy(context, &namespace, &stray).await {
            tracing::debug!(%namespace, "sweeping a stray copy: {e}");
        }
    }
}

/// A Warning event on the template for each copy whose error is new.
async fn report_new_failures(
    context: &Context,
    template: &WorkerResourceTemplate,
    previous: &BTreeMap<&str, &TemplateVersionStatus>,
    entries: &[TemplateVersionStatus],
) {
    let namespace = template.namespace().unwrap_or_default();
    let object = ObjectName::new("WorkerResourceTemplate", &namespace, &template.name_any());
    let reference = template.object_ref(&());
    for entry in entries {
        let Some(error) = &entry.apply_error else {
            continue;
        };
        let old = previous
            .get(entry.build_id.as_str())
            .and_then(|e| e.apply_error.as_ref());
        if old == Some(error) {
            continue;
        }
        let message = format!("version {}: {error}", entry.build_id);
        if let Err(e) = twc_activities::k8s::events::publish(
            &context.client,
            &reference,
            &object,
            EventKind::Warning,
            twc_crds::resource_template::TemplateReason::ApplyFailed.as_str(),
            &message,
        )
        .await
        {
            tracing::debug!(%object, "recording an event: {e}");
        }
    }
}

/// Writes `status` unless it says what the template's status already says.
async fn write_status(
    client: &Client,
    template: &WorkerResourceTemplate,
    object: &ObjectName,
    status: WorkerResourceTemplateStatus,
) -> Result<(), TemplateError> {
    if !plan::status_changed(template.status.as_ref(), &status) {
        return Ok(());
    }
    let to_json = |s: Option<&WorkerResourceTemplateStatus>| {
        s.and_then(|s| serde_json::to_value(s).ok())
            .unwrap_or_else(|| serde_json::json!({}))
    };
    let patch = serde_json::json!({
        "status": merge_patch(&to_json(template.status.as_ref()), &to_json(Some(&status)))
    });
    let namespace = template.namespace().unwrap_or_default();
    let api: Api<WorkerResourceTemplate> = Api::namespaced(client.clone(), &namespace);
    api.patch_status(
        &template.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map_err(|source| TemplateError::Status {
        template: object.clone(),
        source,
    })?;
    Ok(())
}
