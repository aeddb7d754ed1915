//! Reads of the TemporalWorkerDeployment itself.

use kube::{Api, Client};
use twc_crds::TemporalWorkerDeployment;
use twc_workflows::model::TwdRef;

use super::error::{K8sError, ObjectName};
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
