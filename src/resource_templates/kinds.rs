//! Which resource the API server serves for a template's `apiVersion` and `kind`: discovery,
//! remembered until a request says the resource went away.

use std::collections::HashMap;
use std::sync::Mutex;

use kube::Client;
use kube::core::{ApiResource, GroupVersion};
use kube::discovery::Scope;

/// A kind the API server serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedKind {
    /// How to address its objects.
    pub resource: ApiResource,
    /// Whether its objects live in namespaces.
    pub namespaced: bool,
}

/// A kind that cannot be resolved.
#[derive(Debug, thiserror::Error)]
pub enum KindError {
    /// `apiVersion` is not `group/version` or `version`.
    #[error("spec.template.apiVersion {0:?} is not an API version such as autoscaling/v2")]
    BadApiVersion(String),
    /// The API server serves no such kind.
    #[error(
        "the API server serves no kind {kind} in {api_version}: check spec.template.apiVersion and kind (for a custom resource such as KEDA's ScaledObject, install its CRD first)"
    )]
    NotServed {
        /// `apiVersion`.
        api_version: String,
        /// `kind`.
        kind: String,
    },
    /// Discovery failed (the API server could not answer).
    #[error("discovering {kind} in {api_version}: {message}")]
    Discovery {
        /// `apiVersion`.
        api_version: String,
        /// `kind`.
        kind: String,
        /// The client error.
        message: String,
    },
}

/// Resolves kinds through discovery, caching what it found.
pub struct KindResolver {
    client: Client,
    served: Mutex<HashMap<(String, String), ServedKind>>,
}

impl KindResolver {
    /// A resolver asking through `client`.
    pub fn new(client: Client) -> Self {
        Self {
            client,
            served: Mutex::new(HashMap::new()),
        }
    }

    /// The resource of `kind` in `api_version`.
    pub async fn resolve(&self, api_version: &str, kind: &str) -> Result<ServedKind, KindError> {
        let key = (api_version.to_owned(), kind.to_owned());
        if let Some(served) = self.lock().get(&key) {
            return Ok(served.clone());
        }
        let group_version: GroupVersion = api_version
            .parse()
            .map_err(|_| KindError::BadApiVersion(api_version.to_owned()))?;
        let gvk = group_version.with_kind(kind);
        let not_served = || KindError::NotServed {
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
        };
        let (resource, capabilities) = match kube::discovery::pinned_kind(&self.client, &gvk).await
        {
            Ok(found) => found,
            Err(kube::Error::Discovery(_)) => return Err(not_served()),
            Err(kube::Error::Api(status)) if status.code == 404 => return Err(not_served()),
            Err(e) => {
                return Err(KindError::Discovery {
                    api_version: api_version.to_owned(),
                    kind: kind.to_owned(),
                    message: twc_activities::k8s::error::describe(&e),
                });
            }
        };
        let served = ServedKind {
            resource,
            namespaced: capabilities.scope == Scope::Namespaced,
        };
        self.lock().insert(key, served.clone());
        Ok(served)
    }

    /// Forgets what was found for `kind` in `api_version` (its CRD may have been deleted).
    pub fn forget(&self, api_version: &str, kind: &str) {
        self.lock()
            .remove(&(api_version.to_owned(), kind.to_owned()));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), ServedKind>> {
        self.served
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
