//! The one error type of the Kubernetes operations: which object, which operation, and why.

use std::fmt;

use twc_workflows::model::{BlockReason, Blocked};

/// A Kubernetes object named for messages: `Deployment demo/worker-v1-abc`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectName {
    /// Kind, e.g. `Deployment`.
    pub kind: &'static str,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl ObjectName {
    /// Names an object of `kind`.
    pub fn new(kind: &'static str, namespace: &str, name: &str) -> Self {
        Self {
            kind,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }
}

impl fmt::Display for ObjectName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
    }
}

/// A failed Kubernetes operation.
#[derive(Debug, thiserror::Error)]
pub enum K8sError {
    /// The API server refused the request or could not be reached.
    #[error("{verb} {object}: {}", describe(source))]
    Api {
        /// What was attempted (`get`, `create`, `patch status of`, ...).
        verb: &'static str,
        /// The object.
        object: ObjectName,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// An object the controller would create already exists and belongs to something else.
    #[error("{object} already exists and is not controlled by {owner}; delete or rename it")]
    NotOwned {
        /// The existing object.
        object: ObjectName,
        /// The owner we expected, e.g. `TemporalWorkerDeployment demo/worker (uid ...)`.
        owner: String,
    },
    /// An object with the wanted name is still being deleted; retrying later succeeds.
    #[error("{object} is being deleted; retry once it is gone")]
    BeingDeleted {
        /// The object.
        object: ObjectName,
    },
    /// Optimistic-concurrency retries ran out because others kept writing the object.
    #[error("{verb} {object}: still conflicting after {attempts} attempts")]
    Conflict {
        /// What was attempted.
        verb: &'static str,
        /// The object.
        object: ObjectName,
        /// How many writes were tried.
        attempts: u32,
    },
    /// A value could not be turned into JSON for a request.
    #[error("encode a request for {object}: {source}")]
    Encode {
        /// The object.
        object: ObjectName,
        /// The serializer error.
        #[source]
        source: serde_json::Error,
    },
}

impl K8sError {
    /// A closure wrapping a client error with what was attempted on which object, for `map_err`.
    pub fn api<'a>(
        verb: &'static str,
        object: &'a ObjectName,
    ) -> impl FnOnce(kube::Error) -> Self + 'a {
        move |source| Self::Api {
            verb,
            object: object.clone(),
            source,
        }
    }

    /// The blocking condition this error stands for, or `None` when retrying can fix it
    /// (server errors, timeouts, conflicts, throttling, an object still being deleted).
    pub fn blocked(&self) -> Option<Blocked> {
        let hint = match self {
            Self::Api {
                source: kube::Error::Api(status),
                ..
            } => match status.code {
                403 => " (check the controller's RBAC permissions)",
                408 | 409 | 429 => return None,
                400..=499 => "",
                _ => return None,
            },
            Self::Api { .. } | Self::BeingDeleted { .. } | Self::Conflict { .. } => return None,
            Self::NotOwned { .. } | Self::Encode { .. } => "",
        };
        Some(Blocked {
            reason: BlockReason::PlanExecutionFailed,
            message: format!("{self}{hint}"),
        })
    }
}

/// A client error in one line: the API server's message and reason, or the transport error.
fn describe(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) if !status.message.is_empty() => {
            format!("{} ({}, {})", status.message, status.reason, status.code)
        }
        other => other.to_string(),
    }
}

/// Whether the API server answered 404.
pub(crate) fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.is_not_found())
}

/// Whether the API server refused a write because the object changed (409 Conflict).
pub(crate) fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.is_conflict())
}

/// Whether a create found the name taken (409 AlreadyExists).
pub(crate) fn is_already_exists(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.is_already_exists())
}

#[cfg(test)]
mod tests {
    use kube::core::Status;

    use super::*;

    fn api_error(code: u16, reason: &str) -> K8sError {
        K8sError::Api {
            verb: "create",
            object: ObjectName::new("Deployment", "demo", "worker-v1"),
            source: kube::Error::Api(Status::failure("it failed", reason).with_code(code).boxed()),
        }
    }

    #[test]
    fn messages_name_the_operation_and_object() {
        assert_eq!(
            api_error(422, "Invalid").to_string(),
            "create Deployment demo/worker-v1: it failed (Invalid, 422)"
        );
    }

    #[test]
    fn client_errors_block_with_plan_execution_failed() {
        let blocked = api_error(403, "Forbidden").blocked().expect("403 blocks");
        assert_eq!(blocked.reason, BlockReason::PlanExecutionFailed);
        assert!(blocked.message.contains("RBAC"), "{}", blocked.message);
        assert!(api_error(422, "Invalid").blocked().is_some());
    }

    #[test]
    fn transient_errors_are_left_to_retries() {
        for (code, reason) in [
            (500, "InternalError"),
            (409, "Conflict"),
            (429, "TooManyRequests"),
            (503, ""),
        ] {
            assert!(api_error(code, reason).blocked().is_none(), "{code}");
        }
        let gone = K8sError::BeingDeleted {
            object: ObjectName::new("Deployment", "demo", "x"),
        };
        assert!(gone.blocked().is_none());
    }
}
