//! Reads of the worker deployment resource itself, under either of its kinds.
//!
//! A TWD's workflow is keyed by namespace and name: both kinds (`WorkerDeployment` and
//! `TemporalWorkerDeployment`) of that name stand for the one Temporal Worker Deployment. Every
//! read here returns the claim holder ([`twc_crds::kinds::claim_holder`]); the others are what
//! [`super::claims`] refuses or hands over. Also: whether its namespace is being deleted.

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DynamicObject, ListParams};
use kube::{Api, Client};
use twc_crds::kinds::{ClaimantFacts, claim_holder};
use twc_crds::{TemporalWorkerDeployment, WorkerDeployment, WorkerKind, WorkerObject};
use twc_workflows::model::TwdRef;

use super::error::{K8sError, ObjectName, is_forbidden};
use super::lookup::get_if_exists;

/// The objects of both kinds with one name, split by the claim rule.
#[derive(Debug, Clone)]
pub struct Claim {
    /// The one that drives the Temporal Worker Deployment.
    pub holder: WorkerObject,
    /// The others (refused while live, handed over from while being deleted).
    pub others: Vec<WorkerObject>,
}

/// The API of worker deployment objects of `kind` in `namespace`.
pub fn worker_api(client: &Client, namespace: &str, kind: WorkerKind) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), namespace, &kind.api_resource())
}

/// Names the object `name` of `kind` in `namespace`, for messages and errors.
pub fn worker_object_name(kind: WorkerKind, namespace: &str, name: &str) -> ObjectName {
    ObjectName::new(kind.as_str(), namespace, name)
}

/// Reads a listed or fetched object of `kind` into the controller's type.
// The error is the crate's one error type, as every caller returns it (async callers carry it
// in their futures anyway).
#[allow(clippy::result_large_err)]
pub fn parse_worker(
    kind: WorkerKind,
    object: DynamicObject,
    name: &ObjectName,
) -> Result<WorkerObject, K8sError> {
    let read = match kind {
        WorkerKind::WorkerDeployment => object
            .try_parse::<WorkerDeployment>()
            .map(WorkerObject::from),
        WorkerKind::TemporalWorkerDeployment => object
            .try_parse::<TemporalWorkerDeployment>()
            .map(WorkerObject::from),
    };
    read.map_err(|source| K8sError::Decode {
        object: name.clone(),
        message: source.to_string(),
    })
}

/// Every object of either kind named like `twd`.
pub async fn read_claimants(client: &Client, twd: &TwdRef) -> Result<Vec<WorkerObject>, K8sError> {
    let mut found = Vec::new();
    for kind in WorkerKind::ALL {
        let object = worker_object_name(kind, &twd.namespace, &twd.name);
        let api = worker_api(client, &twd.namespace, kind);
        if let Some(read) = get_if_exists(&api, &twd.name)
            .await
            .map_err(K8sError::api("get", &object))?
        {
            found.push(parse_worker(kind, read, &object)?);
        }
    }
    Ok(found)
}

/// The claim on the Temporal Worker Deployment of `twd`, or `None` when no object of either
/// kind has that name.
pub async fn read_claim(client: &Client, twd: &TwdRef) -> Result<Option<Claim>, K8sError> {
    Ok(split_claim(read_claimants(client, twd).await?))
}

/// Splits `objects` (of one name) into the holder and the others.
pub fn split_claim(mut objects: Vec<WorkerObject>) -> Option<Claim> {
    let facts: Vec<ClaimantFacts<'_>> = objects.iter().map(ClaimantFacts::of).collect();
    let index = claim_holder(&facts)?;
    let holder = objects.swap_remove(index);
    Some(Claim {
        holder,
        others: objects,
    })
}

/// The TWD (the claim holder of its name), or `None` when no object of either kind exists.
pub async fn get_twd(client: &Client, twd: &TwdRef) -> Result<Option<WorkerObject>, K8sError> {
    Ok(read_claim(client, twd).await?.map(|c| c.holder))
}

/// Every object of either kind in `namespace` (every namespace when `None`) that `params`
/// selects. A kind the API server does not serve (its CRD is not installed) lists nothing.
pub async fn list_workers(
    client: &Client,
    namespace: Option<&str>,
    params: &ListParams,
) -> Result<Vec<WorkerObject>, K8sError> {
    let mut found = Vec::new();
    for kind in WorkerKind::ALL {
        let scope = ObjectName::new(kind.as_str(), namespace.unwrap_or_default(), "(all)");
        let api: Api<DynamicObject> = match namespace {
            Some(namespace) => worker_api(client, namespace, kind),
            None => Api::all_with(client.clone(), &kind.api_resource()),
        };
        let listed = match api.list(params).await {
            Ok(list) => list.items,
            Err(kube::Error::Api(status)) if status.code == 404 => Vec::new(),
            Err(e) => return Err(K8sError::api("list", &scope)(e)),
        };
        for item in listed {
            let name = worker_object_name(
                kind,
                item.metadata.namespace.as_deref().unwrap_or_default(),
                item.metadata.name.as_deref().unwrap_or_default(),
            );
            found.push(parse_worker(kind, item, &name)?);
        }
    }
    Ok(found)
}

/// Whether the namespace `name` is being deleted (false when it is gone, or when the controller
/// may not read namespaces).
pub async fn namespace_deleting(client: &Client, name: &str) -> Result<bool, K8sError> {
    let api: Api<Namespace> = Api::all(client.clone());
    let object = ObjectName::cluster_scoped("Namespace", name);
    match get_if_exists(&api, name).await {
        Ok(namespace) => Ok(namespace.is_some_and(|n| n.metadata.deletion_timestamp.is_some())),
        Err(e) if is_forbidden(&e) => {
            tracing::debug!(%object, "may not read the namespace: {e}");
            Ok(false)
        }
        Err(e) => Err(K8sError::api("get", &object)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::error::{ErrorClass, classify};
    use crate::k8s::fake_api;

    const OLD: &str = "/apis/temporal.io/v1alpha1/namespaces/demo/temporalworkerdeployments/hello";
    const NEW: &str = "/apis/temporal.io/v1alpha1/namespaces/demo/workerdeployments/hello";

    fn twd() -> TwdRef {
        TwdRef {
            namespace: "demo".into(),
            name: "hello".into(),
        }
    }

    #[tokio::test]
    async fn a_twd_is_gone_only_when_the_api_server_says_so() {
        let client = fake_api::client(vec![
            (
                OLD.into(),
                fake_api::not_found("temporalworkerdeployments", "hello"),
            ),
            (
                NEW.into(),
                fake_api::not_found("workerdeployments", "hello"),
            ),
        ]);
        assert!(matches!(get_twd(&client, &twd()).await, Ok(None)));
        // A restarting API server that does not serve the CRD yet says nothing about the TWD.
        let client = fake_api::client(vec![
            (
                NEW.into(),
                fake_api::not_found("workerdeployments", "hello"),
            ),
            (OLD.into(), fake_api::unserved()),
        ]);
        match get_twd(&client, &twd()).await {
            Err(K8sError::Api { source, .. }) => {
                assert_eq!(classify(&source), ErrorClass::Transient);
            }
            other => panic!("an unserved path is an error to retry: {other:?}"),
        }
    }
}
