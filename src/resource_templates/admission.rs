//! Whether a WorkerResourceTemplate may be created or changed (reference §5.2): the rules that
//! need only the object ([`twc_crds::resource_template::checks`]), then the ones that ask the
//! API server: the template's kind must be served and namespaced, the requesting user must be
//! allowed to create, update and delete that resource in the namespace (a
//! `LocalSubjectAccessReview` with the user's name, UID, groups and extra), so must the
//! controller itself (a `SelfSubjectAccessReview`), and a template that scales the Deployment
//! is refused on a worker deployment with `spec.autoscaling`. Refusals name the field.

use k8s_openapi::api::authorization::v1::{
    LocalSubjectAccessReview, ResourceAttributes, SelfSubjectAccessReview,
    SelfSubjectAccessReviewSpec, SubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};
use twc_activities::k8s::error::describe;
use twc_activities::k8s::get_twd;
use twc_crds::WorkerResourceTemplate;
use twc_crds::resource_template::checks::{
    self, WorkerScaling, autoscaling_conflict, kind_allowed, replicas_warning, template_problems,
    update_problems,
};
use twc_workflows::model::TwdRef;

use super::kinds::{KindResolver, ServedKind};

/// Verbs a template's author must have on the resource it renders: the controller creates,
/// updates and deletes copies on their behalf.
const AUTHOR_VERBS: [&str; 3] = ["create", "update", "delete"];
/// Verbs the controller uses on copies.
const CONTROLLER_VERBS: [&str; 4] = ["create", "patch", "delete", "list"];

/// Admits or refuses WorkerResourceTemplates.
pub struct Admission {
    client: Client,
    allowed_kinds: Vec<String>,
    kinds: KindResolver,
}

impl Admission {
    /// Checks through `client`, admitting the kinds in `allowed_kinds`.
    pub fn new(client: Client, allowed_kinds: Vec<String>) -> Self {
        Self {
            kinds: KindResolver::new(client.clone()),
            client,
            allowed_kinds,
        }
    }

    /// The answer to `request`.
    pub async fn review(&self, request: &AdmissionRequest<DynamicObject>) -> AdmissionResponse {
        let response = AdmissionResponse::from(request);
        match self.decide(request).await {
            Ok(warnings) => {
                let mut response = response;
                if !warnings.is_empty() {
                    response.warnings = Some(warnings);
                }
                response
            }
            Err(refusal) => {
                tracing::info!(
                    user = %request.user_info.username.as_deref().unwrap_or_default(),
                    namespace = %request.namespace.as_deref().unwrap_or_default(),
                    name = %request.name,
                    "refused WorkerResourceTemplate: {refusal}"
                );
                response.deny(refusal)
            }
        }
    }

    /// The warnings of an admitted request, or the refusal.
    async fn decide(
        &self,
        request: &AdmissionRequest<DynamicObject>,
    ) -> Result<Vec<String>, String> {
        if !matches!(request.operation, Operation::Create | Operation::Update) {
            return Ok(Vec::new());
        }
        let template = parse(request.object.as_ref())?;
        let old = match request.operation {
            Operation::Update => Some(parse(request.old_object.as_ref())?),
            _ => None,
        };
        // A change that leaves the spec alone (labels, finalizers, the garbage collector's
        // foreground deletion) was admitted with that spec: nothing to check again.
        if let Some(old) = &old
            && (old.spec == template.spec || template.metadata.deletion_timestamp.is_some())
        {
            return Ok(Vec::new());
        }
        let spec = &template.spec;
        let mut problems = template_problems(&spec.template);
        if let Some(old) = &old {
            problems.extend(update_problems(&old.spec, spec));
        }
        let kind = spec.template_kind().unwrap_or_default();
        if let Err(refusal) = kind_allowed(kind, &self.allowed_kinds) {
            problems.push(refusal);
        }
        if !problems.is_empty() {
            return Err(problems.join("; "));
        }
        let namespace = request
            .namespace
            .clone()
            .or_else(|| template.metadata.namespace.clone())
            .unwrap_or_default();
        let api_version = spec.template_api_version().unwrap_or_default();
        let served = self
            .kinds
            .resolve(api_version, kind)
            .await
            .map_err(|e| format!("spec.template: {e}"))?;
        if !served.namespaced {
            return Err(format!(
                "spec.template.kind {kind} is cluster-scoped: a WorkerResourceTemplate renders namespaced resources only"
            ));
        }
        self.author_may_manage(request, &namespace, &served).await?;
        self.controller_may_manage(&namespace, &served).await?;
        let mut warnings = checks::warnings(spec);
        if let Some(worker_name) = spec.worker_name() {
            let worker_ref = TwdRef {
                namespace: namespace.clone(),
                name: worker_name.to_owned(),
            };
            let worker = get_twd(&self.client, &worker_ref).await.map_err(|e| {
                format!("could not read the worker deployment {worker_name} to check spec.autoscaling ({e}); try again")
            })?;
            if let Some(worker) = worker {
                let describe = format!("{} {}", worker.kind, worker_name);
                let scaling = WorkerScaling {
                    worker: &describe,
                    autoscaling: worker.spec.autoscaling.is_some(),
                    replicas: worker.spec.replicas.is_some(),
                };
                if let Some(conflict) = autoscaling_conflict(&spec.template, &scaling) {
                    return Err(conflict);
                }
                warnings.extend(replicas_warning(&spec.template, &scaling));
            }
        }
        Ok(warnings)
    }

    /// Refuses unless the requesting user may create, update and delete the rendered resource
    /// in `namespace`.
    async fn author_may_manage(
        &self,
        request: &AdmissionRequest<DynamicObject>,
        namespace: &str,
        served: &ServedKind,
    ) -> Result<(), String> {
        let user = &request.user_info;
        let username = user.username.clone().unwrap_or_default();
        let api: Api<LocalSubjectAccessReview> = Api::namespaced(self.client.clone(), namespace);
        for verb in AUTHOR_VERBS {
            let review = LocalSubjectAccessReview {
                metadata: ObjectMeta {
                    namespace: Some(namespace.to_owned()),
                    ..Default::default()
                },
                spec: SubjectAccessReviewSpec {
                    user: user.username.clone(),
                    uid: user.uid.clone(),
                    groups: user.groups.clone(),
                    extra: user.extra.clone(),
                    resource_attributes: Some(attributes(verb, namespace, served)),
                    ..Default::default()
                },
                status: None,
            };
            let allowed = api
                .create(&PostParams::default(), &review)
                .await
                .map(|answer| answer.status.is_some_and(|s| s.allowed));
            refuse_unless(
                allowed,
                &username,
                verb,
                namespace,
                served,
                "a WorkerResourceTemplate has the controller create, update and delete them for its author, who needs those rights",
            )?;
        }
        Ok(())
    }

    /// Refuses unless the controller itself may manage the rendered resource in `namespace`
    /// (its RBAC comes from the Helm value that also lists the allowed kinds).
    async fn controller_may_manage(
        &self,
        namespace: &str,
        served: &ServedKind,
    ) -> Result<(), String> {
        let api: Api<SelfSubjectAccessReview> = Api::all(self.client.clone());
        for verb in CONTROLLER_VERBS {
            let review = SelfSubjectAccessReview {
                metadata: ObjectMeta::default(),
                spec: SelfSubjectAccessReviewSpec {
                    resource_attributes: Some(attributes(verb, namespace, served)),
                    ..Default::default()
                },
                status: None,
            };
            let allowed = api
                .create(&PostParams::default(), &review)
                .await
                .map(|answer| answer.status.is_some_and(|s| s.allowed));
            refuse_unless(
                allowed,
                "the controller",
                verb,
                namespace,
                served,
                "grant it (Helm value workerResourceTemplate.allowedResources lists the kinds and their resources)",
            )?;
        }
        Ok(())
    }
}

/// The refusal when an access review said no (`why` says what to do), or could not be made.
fn refuse_unless(
    allowed: Result<bool, kube::Error>,
    who: &str,
    verb: &str,
    namespace: &str,
    served: &ServedKind,
    why: &str,
) -> Result<(), String> {
    let resource = resource_name(served);
    match allowed {
        Ok(true) => Ok(()),
        Ok(false) => Err(format!(
            "spec.template.kind: {who} may not {verb} {resource} in namespace {namespace}; {why}"
        )),
        Err(e) => Err(format!(
            "could not check whether {who} may {verb} {resource} ({}); try again",
            describe(&e)
        )),
    }
}

/// The object of a request as a WorkerResourceTemplate.
fn parse(object: Option<&DynamicObject>) -> Result<WorkerResourceTemplate, String> {
    let object = object.ok_or("the request carries no object")?;
    let value = serde_json::to_value(object).map_err(|e| e.to_string())?;
    serde_json::from_value(value).map_err(|e| format!("not a valid WorkerResourceTemplate: {e}"))
}

fn attributes(verb: &str, namespace: &str, served: &ServedKind) -> ResourceAttributes {
    ResourceAttributes {
        namespace: Some(namespace.to_owned()),
        verb: Some(verb.to_owned()),
        group: Some(served.resource.group.clone()),
        version: Some(served.resource.version.clone()),
        resource: Some(served.resource.plural.clone()),
        ..Default::default()
    }
}

/// `plural.group` (`horizontalpodautoscalers.autoscaling`), or the plural alone for the core
/// group.
fn resource_name(served: &ServedKind) -> String {
    if served.resource.group.is_empty() {
        served.resource.plural.clone()
    } else {
        format!("{}.{}", served.resource.plural, served.resource.group)
    }
}
