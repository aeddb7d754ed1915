//! Reads of the TemporalWorkerDeployment itself, and of its namespace.

use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, Client};
use twc_crds::TemporalWorkerDeployment;
use twc_workflows::model::TwdRef;

use super::error::{K8sError, ObjectName, is_forbidden};
use super::lookup::get_if_exists;

/// The TWD, or `None` when it does not exist.
pub async fn get_twd(
    client: &Client,
    twd: &TwdRef,
) -> Result<Option<TemporalWorkerDeployment>, K8sError> {
    let api: Api<TemporalWorkerDeployment> = Api::namespaced(client.clone(), &twd.namespace);
    let object = ObjectName::new("TemporalWorkerDeployment", &twd.namespace, &twd.name);
    get_if_exists(&api, &twd.name)
        .await
        .map_err(K8sError::api("get", &object))
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

    const PATH: &str = "/apis/temporal.io/v1alpha1/namespaces/demo/temporalworkerdeployments/hello";

    fn twd() -> TwdRef {
        TwdRef {
            namespace: "demo".into(),
            name: "hello".into(),
        }
    }

    #[tokio::test]
    async fn a_twd_is_gone_only_when_the_api_server_says_so() {
        let client = fake_api::client(vec![(
            PATH.into(),
            fake_api::not_found("temporalworkerdeployments", "hello"),
        )]);
        assert!(matches!(get_twd(&client, &twd()).await, Ok(None)));
        // A restarting API server that does not serve the CRD yet says nothing about the TWD.
        let client = fake_api::client(vec![(PATH.into(), fake_api::unserved())]);
        match get_twd(&client, &twd()).await {
            Err(K8sError::Api { source, .. }) => {
                assert_eq!(classify(&source), ErrorClass::Transient);
            }
            other => panic!("an unserved path is an error to retry: {other:?}"),
        }
    }
}
