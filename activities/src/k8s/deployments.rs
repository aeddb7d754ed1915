//! Reads and idempotent writes of versioned Deployments: list a TWD's versions, create if
//! absent, scale through the scale subresource, delete, and update in place (connection
//! changes, in-place template rolls).

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use twc_crds::{TemporalConnectionSpec, labels, naming};
use twc_workflows::model::{DeploymentView, TwdRef};

use super::deployment_view::{deployment_view, is_controlled_by};
use super::error::{K8sError, ObjectName, is_already_exists, is_not_found};
use super::injection::{self, ServerCa};
use super::retry::retry_on_conflict;

/// What [`create_deployment_if_absent`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateOutcome {
    /// Created by this call.
    Created {
        /// Deployment name.
        name: String,
    },
    /// Already there, controlled by the same TWD (a retried activity, or a rollback).
    Exists {
        /// Deployment name.
        name: String,
    },
}

impl CreateOutcome {
    /// The Deployment's name either way.
    pub fn name(&self) -> &str {
        match self {
            Self::Created { name } | Self::Exists { name } => name,
        }
    }
}

/// The TWD's versioned Deployments: those labelled with its name and controlled by `twd_uid`
/// (a TWD deleted and re-created under the same name does not adopt its predecessor's), oldest
/// first.
pub async fn list_versioned_deployments(
    client: &Client,
    twd: &TwdRef,
    twd_uid: &str,
) -> Result<Vec<DeploymentView>, K8sError> {
    Ok(list_owned_deployments(client, twd, twd_uid)
        .await?
        .iter()
        .filter_map(deployment_view)
        .collect())
}

/// [`list_versioned_deployments`] as the Deployment objects themselves.
pub async fn list_owned_deployments(
    client: &Client,
    twd: &TwdRef,
    twd_uid: &str,
) -> Result<Vec<Deployment>, K8sError> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), &twd.namespace);
    let selector = format!(
        "{}={}",
        labels::DEPLOYMENT_NAME,
        naming::deployment_name_label(&twd.name)
    );
    let object = ObjectName::new("TemporalWorkerDeployment", &twd.namespace, &twd.name);
    let mut deployments = api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(K8sError::api("list Deployments of", &object))?
        .items;
    deployments.retain(|d| is_controlled_by(d, twd_uid));
    deployments.sort_by(|a, b| {
        let created = |d: &Deployment| d.metadata.creation_timestamp.as_ref().map(|t| t.0);
        created(a)
            .cmp(&created(b))
            .then_with(|| a.name_any().cmp(&b.name_any()))
    });
    Ok(deployments)
}

/// Changes of the TWD's versioned Deployments (any of them: created, status written,
/// deleted), as a stream that yields once per change. A watch, so a waiting activity hears of a
/// Deployment becoming Available at once instead of at its next poll. Watch errors are retried
/// with back-off and never end the stream; callers bound their waits with a timer anyway.
pub fn versioned_deployment_changes(
    client: &Client,
    twd: &TwdRef,
) -> impl futures::Stream<Item = ()> + Send + use<> {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let api: Api<Deployment> = Api::namespaced(client.clone(), &twd.namespace);
    let selector = format!(
        "{}={}",
        labels::DEPLOYMENT_NAME,
        naming::deployment_name_label(&twd.name)
    );
    watcher(api, watcher::Config::default().labels(&selector))
        .default_backoff()
        .filter_map(|event| async move {
            match event {
                Ok(
                    watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone,
                ) => Some(()),
                Ok(_) => None,
                Err(e) => {
                    tracing::debug!("watching versioned Deployments: {e}");
                    None
                }
            }
        })
}

/// Creates `deployment` unless a Deployment of that name exists. An existing one is accepted
/// only when it is controlled by the same owner and not being deleted, so a retried call never
/// yields two Deployments or adopts a stranger's.
pub async fn create_deployment_if_absent(
    client: &Client,
    deployment: &Deployment,
) -> Result<CreateOutcome, K8sError> {
    let namespace = deployment.namespace().unwrap_or_default();
    let name = deployment.name_any();
    let object = ObjectName::new("Deployment", &namespace, &name);
    let api: Api<Deployment> = Api::namespaced(client.clone(), &namespace);
    match api.create(&PostParams::default(), deployment).await {
        Ok(_) => {
            tracing::info!(%object, "created versioned Deployment");
            return Ok(CreateOutcome::Created { name });
        }
        Err(e) if is_already_exists(&e) => {}
        Err(e) => return Err(K8sError::api("create", &object)(e)),
    }
    let existing = api
        .get_opt(&name)
        .await
        .map_err(K8sError::api("get", &object))?;
    let Some(existing) = existing else {
        // Deleted between our create and get: the retry will create it.
        return Err(K8sError::BeingDeleted { object });
    };
    if existing.metadata.deletion_timestamp.is_some() {
        return Err(K8sError::BeingDeleted { object });
    }
    let owner = deployment
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true));
    match owner {
        Some(owner) if is_controlled_by(&existing, &owner.uid) => {
            tracing::debug!(%object, "versioned Deployment already exists");
            Ok(CreateOutcome::Exists { name })
        }
        _ => Err(K8sError::NotOwned {
            object,
            owner: owner.map_or_else(
                || "the requested owner".to_owned(),
                |o| format!("{} {namespace}/{} (uid {})", o.kind, o.name, o.uid),
            ),
        }),
    }
}

/// Sets a Deployment's replicas through the `scale` subresource. Returns false when the
/// Deployment does not exist (nothing to scale).
pub async fn scale_deployment(
    client: &Client,
    namespace: &str,
    name: &str,
    replicas: i32,
) -> Result<bool, K8sError> {
    let object = ObjectName::new("Deployment", namespace, name);
    let api: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let patch = serde_json::json!({ "spec": { "replicas": replicas } });
    match api
        .patch_scale(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {
            tracing::info!(%object, replicas, "scaled Deployment");
            Ok(true)
        }
        Err(e) if is_not_found(&e) => Ok(false),
        Err(e) => Err(K8sError::api("scale", &object)(e)),
    }
}

/// Deletes a Deployment with background propagation (its ReplicaSets and pods follow). Returns
/// false when it was already gone.
pub async fn delete_deployment(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<bool, K8sError> {
    let object = ObjectName::new("Deployment", namespace, name);
    let api: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => {
            tracing::info!(%object, "deleted Deployment");
            Ok(true)
        }
        Err(e) if is_not_found(&e) => Ok(false),
        Err(e) => Err(K8sError::api("delete", &object)(e)),
    }
}

/// Replaces the Deployment `name` with what `change` makes of a fresh copy, when it says it
/// changed something (`Some`), re-reading and re-deciding on conflict. A change of the pod
/// template is a rolling restart. A missing or deleting Deployment is left alone (`None`).
pub async fn update_deployment<T>(
    client: &Client,
    namespace: &str,
    name: &str,
    change: impl Fn(&mut Deployment) -> Option<T>,
) -> Result<Option<T>, K8sError> {
    let object = ObjectName::new("Deployment", namespace, name);
    let api: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let (api, object, change) = (&api, &object, &change);
    retry_on_conflict("update", object, || async move {
        let Some(mut deployment) = api
            .get_opt(name)
            .await
            .map_err(K8sError::api("get", object))?
        else {
            return Ok(None);
        };
        if deployment.metadata.deletion_timestamp.is_some() {
            return Ok(None);
        }
        let Some(changed) = change(&mut deployment) else {
            return Ok(None);
        };
        api.replace(name, &PostParams::default(), &deployment)
            .await
            .map_err(K8sError::api("update", object))?;
        tracing::info!(%object, "updated versioned Deployment");
        Ok(Some(changed))
    })
    .await
}

/// Rewrites the pod template for the connection (address, TLS and API-key env vars, the
/// mutual-TLS volume) unless its hash annotation already matches; returns whether anything
/// changed.
pub(super) fn apply_connection(
    deployment: &mut Deployment,
    connection: &TemporalConnectionSpec,
    ca: ServerCa,
) -> bool {
    let hash = injection::connection_spec_hash(connection, ca);
    // Stamped when taken over from another controller with these settings (`adoption`).
    if deployment
        .annotations()
        .get(super::adoption::ADOPTED_CONNECTION_HASH)
        == Some(&hash)
    {
        return false;
    }
    let Some(spec) = deployment.spec.as_mut() else {
        return false;
    };
    let template_meta = spec.template.metadata.get_or_insert_default();
    let annotations = template_meta.annotations.get_or_insert_default();
    if annotations
        .get(labels::CONNECTION_SPEC_HASH)
        .map(String::as_str)
        == Some(hash.as_str())
    {
        return false;
    }
    annotations.insert(labels::CONNECTION_SPEC_HASH.to_owned(), hash);
    annotations.insert(
        labels::GO_CONNECTION_SPEC_HASH.to_owned(),
        injection::go_connection_spec_hash(connection),
    );
    if let Some(pod) = spec.template.spec.as_mut() {
        injection::reinject_connection(pod, connection, ca);
    }
    true
}

#[cfg(test)]
mod tests {
    use twc_crds::TemporalWorkerDeployment;
    use twc_crds::connection::SecretReference;
    use twc_crds::worker_deployment::test_support::spec_with_image;

    use super::*;
    use crate::k8s::deployment_builder::build_deployment;

    fn connection(secret: &str) -> TemporalConnectionSpec {
        TemporalConnectionSpec {
            host_port: "temporal:7233".into(),
            tls: None,
            mutual_tls_secret_ref: Some(SecretReference {
                name: secret.into(),
            }),
            api_key_secret_ref: None,
            worker_credentials: None,
        }
    }

    fn built(connection: &TemporalConnectionSpec) -> Deployment {
        let mut twd = TemporalWorkerDeployment::new("worker", spec_with_image("worker:v1"));
        twd.metadata.namespace = Some("demo".into());
        build_deployment(
            &twd.into(),
            connection,
            &twc_crds::BuildId::new("v1"),
            ServerCa::SystemRoots,
        )
    }

    #[test]
    fn an_unchanged_connection_leaves_the_deployment_alone() {
        let old = connection("cert");
        let mut deployment = built(&old);
        let before = deployment.clone();
        assert!(!apply_connection(
            &mut deployment,
            &old,
            ServerCa::SystemRoots
        ));
        assert_eq!(deployment, before);
    }

    #[test]
    fn a_changed_connection_matches_a_fresh_build() {
        let new = connection("rotated");
        let mut deployment = built(&connection("cert"));
        assert!(apply_connection(
            &mut deployment,
            &new,
            ServerCa::SystemRoots
        ));
        assert_eq!(deployment, built(&new));
    }
}
