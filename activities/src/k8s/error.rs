//! The one error type of the Kubernetes operations: which object, which operation, and why.

use std::fmt;

use twc_workflows::model::{BlockReason, Blocked};

/// A Kubernetes object named for messages: `Deployment demo/worker-v1-abc`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectName {
    /// Kind, e.g. `Deployment`.
    pub kind: &'static str,
    /// Namespace (empty for a cluster-scoped object).
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

    /// Names a cluster-scoped object of `kind`.
    pub fn cluster_scoped(kind: &'static str, name: &str) -> Self {
        Self::new(kind, "", name)
    }
}

impl fmt::Display for ObjectName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{} {}", self.kind, self.name)
        } else {
            write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
        }
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
    /// An object the API server returned could not be read as its type.
    #[error("read {object}: {message}")]
    Decode {
        /// The object.
        object: ObjectName,
        /// What did not fit.
        message: String,
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
            Self::Api { source, .. } => match classify(source) {
                ErrorClass::Transient => return None,
                ErrorClass::Refused if is_forbidden(source) => {
                    " (check the controller's RBAC permissions)"
                }
                ErrorClass::Refused | ErrorClass::NotFound => "",
            },
            Self::BeingDeleted { .. } | Self::Conflict { .. } => return None,
            Self::NotOwned { .. } | Self::Encode { .. } | Self::Decode { .. } => "",
        };
        Some(Blocked {
            reason: BlockReason::PlanExecutionFailed,
            message: format!("{self}{hint}"),
        })
    }
}

/// Why something a TWD references (its TemporalConnection, a Secret, a ConfigMap) could not be
/// read or used.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// Missing or unusable, or a read the API server keeps refusing: a condition to show until
    /// someone changes something.
    #[error("{}", .0.message)]
    Blocked(Blocked),
    /// The API server could not answer now: the activity fails and Temporal retries it; no
    /// condition names the object.
    #[error(transparent)]
    Transient(Box<K8sError>),
}

impl ResolveError {
    /// A failed read of an object that exists or may exist (a 404 naming it is handled by the
    /// caller): transient failures are retried, refusals become conditions.
    pub fn from_read(error: K8sError) -> Self {
        match error.blocked() {
            Some(blocked) => Self::Blocked(blocked),
            None => Self::Transient(Box::new(error)),
        }
    }
}

impl From<Blocked> for ResolveError {
    fn from(blocked: Blocked) -> Self {
        Self::Blocked(blocked)
    }
}

/// What a failed Kubernetes call means for whoever made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The object asked about does not exist: a 404 that names it.
    NotFound,
    /// The API server refuses this request and will keep refusing it (RBAC, an invalid
    /// request): someone has to change something.
    Refused,
    /// Retrying as is may succeed: the API server unreachable, timing out, overloaded or
    /// throttling (5xx, 408, 429), a write conflict (409), or a 404 that names no object (a
    /// restarting API server answers so for custom resources until it serves their CRDs again).
    Transient,
}

/// Classifies a failed Kubernetes call.
pub fn classify(error: &kube::Error) -> ErrorClass {
    let kube::Error::Api(status) = error else {
        // Transport, TLS, timeouts, an unreadable answer: the API server could not be heard.
        return ErrorClass::Transient;
    };
    let names_object = status.details.as_ref().is_some_and(|d| !d.name.is_empty());
    match status.code {
        404 if names_object => ErrorClass::NotFound,
        404 | 408 | 409 | 429 => ErrorClass::Transient,
        400..=499 => ErrorClass::Refused,
        _ => ErrorClass::Transient,
    }
}

/// A client error in one line: the API server's message and reason, or the transport error.
pub fn describe(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) if !status.message.is_empty() => {
            format!("{} ({}, {})", status.message, status.reason, status.code)
        }
        other => other.to_string(),
    }
}

/// Whether the API server answered that the object does not exist ([`ErrorClass::NotFound`]).
pub fn is_not_found(error: &kube::Error) -> bool {
    classify(error) == ErrorClass::NotFound
}

pub(crate) fn is_forbidden(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 403)
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

    fn status(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(Status::failure("it failed", reason).with_code(code).boxed())
    }

    fn api_error(code: u16, reason: &str) -> K8sError {
        K8sError::Api {
            verb: "create",
            object: ObjectName::new("Deployment", "demo", "worker-v1"),
            source: status(code, reason),
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

    /// A `Status` as the API server sends it.
    fn answered(status: serde_json::Value) -> kube::Error {
        let status: Status = serde_json::from_value(status).expect("a Status");
        kube::Error::Api(status.boxed())
    }

    fn transport(kind: std::io::ErrorKind) -> kube::Error {
        kube::Error::Service(Box::new(std::io::Error::new(kind, "from the test")))
    }

    #[test]
    fn only_a_404_naming_the_object_means_it_does_not_exist() {
        use ErrorClass::{NotFound, Refused, Transient};
        let object_missing = answered(serde_json::json!({
            "status": "Failure", "code": 404, "reason": "NotFound",
            "message": "temporalconnections.temporal.io \"dev\" not found",
            "details": { "name": "dev", "group": "temporal.io", "kind": "temporalconnections" }
        }));
        // What kube-rs makes of the plain-text 404 of a path the API server does not serve
        // (yet): a restarted server answers so for custom resources until their CRDs load.
        let path_unknown = kube::Error::Api(
            Status::failure("404 page not found", "Failed to parse error data")
                .with_code(404)
                .boxed(),
        );
        let cases: Vec<(&str, kube::Error, ErrorClass)> = vec![
            ("object not found", object_missing, NotFound),
            ("path not served", path_unknown, Transient),
            ("forbidden", status(403, "Forbidden"), Refused),
            ("unauthorized", status(401, "Unauthorized"), Refused),
            ("invalid", status(422, "Invalid"), Refused),
            ("bad request", status(400, "BadRequest"), Refused),
            ("request timeout", status(408, "Timeout"), Transient),
            ("conflict", status(409, "Conflict"), Transient),
            ("throttled", status(429, "TooManyRequests"), Transient),
            ("internal error", status(500, "InternalError"), Transient),
            ("unavailable", status(503, "ServiceUnavailable"), Transient),
            ("gateway timeout", status(504, "Timeout"), Transient),
            (
                "connection refused",
                transport(std::io::ErrorKind::ConnectionRefused),
                Transient,
            ),
            (
                "connection reset",
                transport(std::io::ErrorKind::ConnectionReset),
                Transient,
            ),
            (
                "client timeout",
                transport(std::io::ErrorKind::TimedOut),
                Transient,
            ),
            (
                "stream cut",
                kube::Error::ReadEvents(std::io::ErrorKind::UnexpectedEof.into()),
                Transient,
            ),
        ];
        for (what, error, class) in cases {
            assert_eq!(classify(&error), class, "{what}: {error}");
        }
    }
}
