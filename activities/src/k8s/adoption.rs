//! Taking over versions another controller made (the Go Temporal Worker Controller), with
//! nothing moving: no new build, no pod restart.
//!
//! Its build IDs come from a hash `twc` cannot reproduce, so a worker deployment it managed
//! would get a "new" build of the same code. Instead, when a live versioned Deployment of the
//! worker deployment runs exactly the spec's pod template, its build ID is taken over and
//! recorded in `status.adoptedBuild` ([`find_adoptable_build`], [`record_adoption`]); it lapses
//! with the next template change, which rolls out under `twc`'s own build IDs.
//!
//! "Exactly" is decided the way the API server sees it: the spec's template is defaulted by a
//! dry-run create of a Deployment, and compared with the live pod template without what a
//! controller adds (the Temporal env vars, the credential volumes, the selector labels and the
//! hash annotations).
//!
//! Its Deployments also carry pod-template annotations computed differently (the connection
//! hash of `twc` covers more settings): rewriting them would restart every pod, Draining
//! versions included. A Deployment whose pods already carry the connection's settings is
//! stamped instead, on the Deployment itself (no restart), with the hash `twc` would have
//! written ([`ADOPTED_CONNECTION_HASH`]).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use twc_crds::worker_deployment::AdoptedBuild;
use twc_crds::{WorkerObject, build_id, labels, naming};

use super::deployment_view::is_controlled_by;
use super::error::{K8sError, ObjectName};
use super::injection::{API_KEY_VOLUME, CA_VOLUME, CONNECTION_ENV, TLS_VOLUME};
use super::twd::{worker_api, worker_object_name};

/// Deployment annotation: the connection hash of `twc` for the settings the pods of a taken-over
/// Deployment already carry (its own pod-template annotation is another controller's).
pub const ADOPTED_CONNECTION_HASH: &str = "twc.temporal.io/adopted-connection-hash";

/// Deployment annotation: the pod-template hash of `twc` for the template the pods of a
/// taken-over Deployment already run (under `unsafeCustomBuildID`, whose Deployment follows
/// template edits in place).
pub const ADOPTED_TEMPLATE_HASH: &str = "twc.temporal.io/adopted-pod-template-hash";

/// Env vars a controller sets in every container (the Temporal identity of the version and the
/// connection's settings): not part of the user's template.
const IDENTITY_ENV: &[&str] = &[
    "TEMPORAL_NAMESPACE",
    "TEMPORAL_DEPLOYMENT_NAME",
    "TEMPORAL_WORKER_BUILD_ID",
    "WORKER_BUILD_ID",
];

/// Pod-template annotations a controller sets.
const CONTROLLER_ANNOTATIONS: &[&str] = &[
    labels::POD_TEMPLATE_HASH,
    labels::CONNECTION_SPEC_HASH,
    labels::GO_POD_TEMPLATE_SPEC_HASH,
    labels::GO_CONNECTION_SPEC_HASH,
];

/// Whether `twd` may take over a build: it never had a status from `twc` (its status has no
/// `rollout`), records no adoption yet, uses no custom build ID and is not being deleted.
pub fn may_adopt(twd: &WorkerObject) -> bool {
    let status = twd.status.as_ref();
    status.and_then(|s| s.rollout.as_ref()).is_none()
        && status.and_then(|s| s.adopted_build.as_ref()).is_none()
        && twd.spec.worker_options.unsafe_custom_build_id.is_none()
        && !twd.deleting()
}

/// The build of a live versioned Deployment of `twd` (one it controls) that runs exactly the
/// spec's pod template, when no Deployment of the computed build exists; `None` otherwise.
pub async fn find_adoptable_build(
    client: &Client,
    twd: &WorkerObject,
) -> Result<Option<AdoptedBuild>, K8sError> {
    let namespace = twd.namespace().unwrap_or_default();
    let name = twd.name_any();
    let computed = build_id::compute_build_id(&twd.spec);
    let api: Api<Deployment> = Api::namespaced(client.clone(), &namespace);
    let selector = format!(
        "{}={}",
        labels::DEPLOYMENT_NAME,
        naming::deployment_name_label(&name)
    );
    let scope = worker_object_name(twd.kind, &namespace, &name);
    let mut live: Vec<Deployment> = api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(K8sError::api("list Deployments of", &scope))?
        .items
        .into_iter()
        .filter(|d| {
            d.metadata.deletion_timestamp.is_none() && is_controlled_by(d, twd.object_uid())
        })
        .collect();
    let build_of = |d: &Deployment| d.labels().get(labels::BUILD_ID).cloned();
    if live.is_empty()
        || live
            .iter()
            .any(|d| build_of(d).as_deref() == Some(computed.as_str()))
    {
        return Ok(None);
    }
    // The newest first: a template re-applied after a revert matches its latest version.
    live.sort_by_key(|d| std::cmp::Reverse(d.metadata.creation_timestamp.clone().map(|t| t.0)));
    let wanted =
        normalized(defaulted_template(client, &namespace, &name, &twd.spec.template).await?);
    for deployment in &live {
        let (Some(build), Some(spec)) = (build_of(deployment), deployment.spec.as_ref()) else {
            continue;
        };
        if normalized(spec.template.clone()) == wanted {
            return Ok(Some(AdoptedBuild {
                build_id: build,
                template_hash: build_id::template_hash(&twd.spec.template),
            }));
        }
    }
    Ok(None)
}

/// Whether `deployment` runs exactly the pod template of `twd` (see the module docs).
pub async fn runs_template(
    client: &Client,
    deployment: &Deployment,
    twd: &WorkerObject,
) -> Result<bool, K8sError> {
    let Some(spec) = deployment.spec.as_ref() else {
        return Ok(false);
    };
    let namespace = twd.namespace().unwrap_or_default();
    let wanted =
        defaulted_template(client, &namespace, &twd.name_any(), &twd.spec.template).await?;
    Ok(normalized(spec.template.clone()) == normalized(wanted))
}

/// Adds `stamps` to the annotations of `deployment` (its own metadata: its pods are untouched).
pub async fn stamp_deployment(
    client: &Client,
    deployment: &Deployment,
    stamps: &BTreeMap<String, String>,
) -> Result<(), K8sError> {
    let namespace = deployment.namespace().unwrap_or_default();
    let name = deployment.name_any();
    let object = ObjectName::new("Deployment", &namespace, &name);
    let patch = json!({ "metadata": { "annotations": stamps } });
    Api::<Deployment>::namespaced(client.clone(), &namespace)
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(K8sError::api("stamp", &object))?;
    tracing::info!(%object, ?stamps, "taken over as it runs: the pods are left as they are");
    Ok(())
}

/// Writes `adopted` as `status.adoptedBuild` of `twd` (a merge patch of that field alone).
pub async fn record_adoption(
    client: &Client,
    twd: &WorkerObject,
    adopted: &AdoptedBuild,
) -> Result<(), K8sError> {
    let namespace = twd.namespace().unwrap_or_default();
    let name = twd.name_any();
    let object = worker_object_name(twd.kind, &namespace, &name);
    let patch = json!({ "status": { "adoptedBuild": adopted } });
    worker_api(client, &namespace, twd.kind)
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(K8sError::api("record the adopted build of", &object))?;
    tracing::info!(%object, build_id = %adopted.build_id, "took over the build of a Deployment running the spec's pod template");
    Ok(())
}

/// `template` as the API server stores it in a Deployment (defaults filled in), from a dry-run
/// create that persists nothing.
async fn defaulted_template(
    client: &Client,
    namespace: &str,
    name: &str,
    template: &PodTemplateSpec,
) -> Result<PodTemplateSpec, K8sError> {
    let selector = BTreeMap::from([("twc.temporal.io/adoption-check".to_owned(), name.to_owned())]);
    let mut template = template.clone();
    template
        .metadata
        .get_or_insert_default()
        .labels
        .get_or_insert_default()
        .extend(selector.clone());
    let probe = Deployment {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-adoption-check-", &name[..name.len().min(30)])),
            namespace: Some(namespace.to_owned()),
            ..Default::default()
        },
        spec: Some(DeploymentSpec {
            selector: LabelSelector {
                match_labels: Some(selector),
                match_expressions: None,
            },
            template,
            ..Default::default()
        }),
        status: None,
    };
    let object = ObjectName::new("Deployment", namespace, &format!("{name}-adoption-check"));
    let params = PostParams {
        dry_run: true,
        field_manager: Some("twc".to_owned()),
    };
    let created = Api::<Deployment>::namespaced(client.clone(), namespace)
        .create(&params, &probe)
        .await
        .map_err(K8sError::api("dry-run create", &object))?;
    let mut defaulted = created.spec.map(|s| s.template).unwrap_or_default();
    if let Some(labels) = defaulted.metadata.as_mut().and_then(|m| m.labels.as_mut()) {
        labels.remove("twc.temporal.io/adoption-check");
    }
    Ok(defaulted)
}

/// A pod template without what a controller adds, with empty lists and maps as absent.
fn normalized(mut template: PodTemplateSpec) -> PodTemplateSpec {
    if let Some(meta) = template.metadata.as_mut() {
        if let Some(labels) = meta.labels.as_mut() {
            labels.remove(labels::BUILD_ID);
            labels.remove(labels::DEPLOYMENT_NAME);
            if labels.get(labels::MANAGED_BY).map(String::as_str) == Some(labels::MANAGED_BY_VALUE)
            {
                labels.remove(labels::MANAGED_BY);
            }
        }
        if let Some(annotations) = meta.annotations.as_mut() {
            annotations.retain(|k, _| !CONTROLLER_ANNOTATIONS.contains(&k.as_str()));
        }
        meta.labels = meta.labels.take().filter(|l| !l.is_empty());
        meta.annotations = meta.annotations.take().filter(|a| !a.is_empty());
        meta.creation_timestamp = None;
    }
    if template
        .metadata
        .as_ref()
        .is_some_and(|m| *m == ObjectMeta::default())
    {
        template.metadata = None;
    }
    if let Some(pod) = template.spec.as_mut() {
        strip_pod(pod);
    }
    template
}

fn strip_pod(pod: &mut PodSpec) {
    let injected = |name: &str| CONNECTION_ENV.contains(&name) || IDENTITY_ENV.contains(&name);
    let volume = |name: &str| [TLS_VOLUME, API_KEY_VOLUME, CA_VOLUME].contains(&name);
    for container in &mut pod.containers {
        if let Some(env) = container.env.as_mut() {
            env.retain(|v| !injected(&v.name));
        }
        container.env = container.env.take().filter(|e| !e.is_empty());
        if let Some(mounts) = container.volume_mounts.as_mut() {
            mounts.retain(|m| !volume(&m.name));
        }
        container.volume_mounts = container.volume_mounts.take().filter(|m| !m.is_empty());
    }
    if let Some(volumes) = pod.volumes.as_mut() {
        volumes.retain(|v| !volume(&v.name));
    }
    pod.volumes = pod.volumes.take().filter(|v| !v.is_empty());
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Container, EnvVar, Volume, VolumeMount};

    use super::*;

    fn env(name: &str, value: &str) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: Some(value.into()),
            value_from: None,
        }
    }

    /// A template as a user writes it, with `extra` env.
    fn user(image: &str, extra: &[EnvVar]) -> PodTemplateSpec {
        PodTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some(BTreeMap::from([("app".into(), "hello".into())])),
                ..Default::default()
            }),
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "worker".into(),
                    image: Some(image.into()),
                    env: Some(extra.to_vec()).filter(|e| !e.is_empty()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
        }
    }

    /// `template` as the Go controller runs it: env appended, the mTLS volume, selector labels
    /// and its hash annotations.
    fn as_go_runs_it(mut template: PodTemplateSpec) -> PodTemplateSpec {
        let meta = template.metadata.get_or_insert_default();
        meta.labels.get_or_insert_default().extend([
            (labels::BUILD_ID.to_owned(), "v1-4b95".to_owned()),
            (labels::DEPLOYMENT_NAME.to_owned(), "hello".to_owned()),
        ]);
        meta.annotations.get_or_insert_default().extend([
            (
                labels::GO_POD_TEMPLATE_SPEC_HASH.to_owned(),
                "aa".to_owned(),
            ),
            (labels::GO_CONNECTION_SPEC_HASH.to_owned(), "bb".to_owned()),
        ]);
        if let Some(pod) = template.spec.as_mut() {
            for c in &mut pod.containers {
                c.env.get_or_insert_default().extend([
                    env("TEMPORAL_ADDRESS", "temporal:7233"),
                    env("TEMPORAL_NAMESPACE", "default"),
                    env("TEMPORAL_DEPLOYMENT_NAME", "ns/hello"),
                    env("TEMPORAL_WORKER_BUILD_ID", "v1-4b95"),
                    env("TEMPORAL_TLS", "true"),
                ]);
                c.volume_mounts = Some(vec![VolumeMount {
                    name: TLS_VOLUME.into(),
                    mount_path: "/etc/temporal/tls".into(),
                    ..Default::default()
                }]);
            }
            pod.volumes = Some(vec![Volume {
                name: TLS_VOLUME.into(),
                ..Default::default()
            }]);
        }
        template
    }

    #[test]
    fn a_template_matches_the_one_a_controller_runs_without_its_injections() {
        let level = [env("LEVEL", "debug")];
        // (what, the user's template, what the Deployment runs, same)
        let cases = [
            (
                "as made",
                user("w:v1", &[]),
                as_go_runs_it(user("w:v1", &[])),
                true,
            ),
            (
                "with the user's env",
                user("w:v1", &level),
                as_go_runs_it(user("w:v1", &level)),
                true,
            ),
            (
                "another image",
                user("w:v2", &[]),
                as_go_runs_it(user("w:v1", &[])),
                false,
            ),
            (
                "env removed since",
                user("w:v1", &[]),
                as_go_runs_it(user("w:v1", &level)),
                false,
            ),
            (
                "env added since",
                user("w:v1", &level),
                as_go_runs_it(user("w:v1", &[])),
                false,
            ),
            // The user's own TEMPORAL_ADDRESS is replaced by a controller anyway.
            (
                "a user value of an injected name",
                user("w:v1", &[env("TEMPORAL_ADDRESS", "mine:1")]),
                as_go_runs_it(user("w:v1", &[])),
                true,
            ),
        ];
        for (what, wanted, running, same) in cases {
            assert_eq!(normalized(wanted) == normalized(running), same, "{what}");
        }
    }
}
