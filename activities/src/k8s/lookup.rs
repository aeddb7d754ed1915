//! Reads that tell an object that does not exist from an API server that cannot say.

use std::fmt::Debug;

use kube::Api;
use serde::de::DeserializeOwned;

use super::error::is_not_found;

/// The object, or `None` when the API server answers that it does not exist. Unlike
/// `Api::get_opt`, a 404 that names no object (a restarting API server's answer for custom
/// resources until it serves their CRDs again) is an error, not `None`.
pub(crate) async fn get_if_exists<K>(api: &Api<K>, name: &str) -> Result<Option<K>, kube::Error>
where
    K: Clone + DeserializeOwned + Debug,
{
    match api.get(name).await {
        Ok(object) => Ok(Some(object)),
        Err(e) if is_not_found(&e) => Ok(None),
        Err(e) => Err(e),
    }
}
