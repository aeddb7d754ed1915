//! Errors of the Temporal operations and the classification of gRPC status codes.

use std::error::Error as StdError;

use prost::{Message, Name};
use rustls::AlertDescription;
use temporalio_client::{
    errors::ClientConnectError,
    tonic::{Code, Status},
};
use temporalio_common::protos::{
    google::rpc::Status as RpcStatus, temporal::api::errordetails::v1::NamespaceNotFoundFailure,
};
use twc_workflows::model::{BlockReason, Blocked};

use super::tls_probe::certificate_alert;

/// What a gRPC status means to the controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusClass {
    /// The entity (deployment, version, workflow) does not exist.
    NotFound,
    /// The Temporal namespace does not exist (never "the entity is gone").
    NamespaceNotFound,
    /// The server refused the change in the current state (conflict token, manager identity,
    /// pollers, drainage, ...).
    FailedPrecondition,
    /// Rate limited (or another server resource limit).
    RateLimited,
    /// Credentials rejected: the cached client must be evicted and rebuilt.
    Auth,
    /// Worth retrying as is (unreachable, timeout, internal error).
    Transient,
    /// Anything else (invalid argument, already exists, unimplemented, ...).
    Other,
}

/// What the failure detail Temporal attaches to a status says (the status's details are a
/// `google.rpc.Status` whose entries are `temporal.api.errordetails.v1` messages), where the
/// controller decides on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailureDetail {
    /// No detail the controller reads.
    #[default]
    None,
    /// `NamespaceNotFoundFailure`: the Temporal namespace does not exist.
    NamespaceNotFound,
}

impl FailureDetail {
    /// The detail of a status.
    pub fn of(status: &Status) -> Self {
        Self::decode(status.details())
    }

    /// The detail in the encoded `google.rpc.Status` of a status's details.
    fn decode(details: &[u8]) -> Self {
        let Ok(status) = RpcStatus::decode(details) else {
            return Self::None;
        };
        status
            .details
            .iter()
            .find_map(|any| {
                // `type.googleapis.com/<full name>`
                let name = any.type_url.rsplit('/').next()?;
                (name == NamespaceNotFoundFailure::full_name()).then_some(Self::NamespaceNotFound)
            })
            .unwrap_or_default()
    }
}

/// Classifies a gRPC status.
pub fn classify(status: &Status) -> StatusClass {
    classify_parts(status.code(), status.message(), FailureDetail::of(status))
}

fn classify_parts(code: Code, message: &str, detail: FailureDetail) -> StatusClass {
    match code {
        Code::NotFound if is_namespace_not_found(message, detail) => StatusClass::NamespaceNotFound,
        Code::NotFound => StatusClass::NotFound,
        Code::FailedPrecondition => StatusClass::FailedPrecondition,
        Code::ResourceExhausted => StatusClass::RateLimited,
        Code::Unauthenticated | Code::PermissionDenied => StatusClass::Auth,
        Code::Unavailable
        | Code::DeadlineExceeded
        | Code::Internal
        | Code::Unknown
        | Code::Aborted
        | Code::Cancelled
        | Code::DataLoss => StatusClass::Transient,
        _ => StatusClass::Other,
    }
}

/// The server reports a missing namespace as NotFound too; its details carry a
/// `NamespaceNotFoundFailure` (decoded as the protos define it) and the message names the
/// namespace.
fn is_namespace_not_found(message: &str, detail: FailureDetail) -> bool {
    let lower = message.to_ascii_lowercase();
    detail == FailureDetail::NamespaceNotFound
        || (lower.starts_with("namespace ") && lower.contains("not found"))
}

/// Whether a status is a `FailedPrecondition` "conflict token mismatch".
pub fn is_conflict_token_mismatch(status: &Status) -> bool {
    status.code() == Code::FailedPrecondition
        && status
            .message()
            .to_ascii_lowercase()
            .contains("conflict token")
}

/// Whether a status is the server refusing a write because another identity holds the
/// deployment's manager identity.
pub fn is_manager_identity_conflict(status: &Status) -> bool {
    status.code() == Code::FailedPrecondition && status.message().contains("ManagerIdentity")
}

/// An error of a Temporal operation, with enough context to explain it in a condition message.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TemporalError {
    /// The connection settings cannot be turned into a client (bad address, bad PEM, ...).
    #[error("invalid Temporal connection settings for {host_port}: {message}")]
    InvalidConfig {
        /// `host:port` of the connection.
        host_port: String,
        /// What is wrong.
        message: String,
    },
    /// The server could not be reached or the TLS handshake failed.
    #[error("cannot connect to Temporal at {host_port}: {message}")]
    Connect {
        /// `host:port` of the connection.
        host_port: String,
        /// The connection error with its causes.
        message: String,
        /// The gRPC code when the failure came from the first call on the new connection.
        code: Option<Code>,
        /// The TLS alert with which the server refused our client certificate.
        refused_certificate: Option<AlertDescription>,
    },
    /// A gRPC call failed.
    #[error("{op} {target}: {code:?}: {message}")]
    Rpc {
        /// The RPC (e.g. `DescribeWorkerDeployment`).
        op: &'static str,
        /// What it was about (deployment name, version, workflow ID).
        target: String,
        /// gRPC status code.
        code: Code,
        /// Server message.
        message: String,
        /// Classification of the status.
        class: StatusClass,
    },
    /// A payload could not be encoded.
    #[error("cannot encode {what}: {message}")]
    Encode {
        /// What was being encoded.
        what: String,
        /// Why it failed.
        message: String,
    },
}

impl TemporalError {
    /// Wraps a failed call.
    pub fn rpc(op: &'static str, target: impl Into<String>, status: &Status) -> Self {
        Self::Rpc {
            op,
            target: target.into(),
            code: status.code(),
            message: status.message().to_owned(),
            class: classify(status),
        }
    }

    /// Wraps a connection failure.
    pub fn connect(host_port: &str, err: &ClientConnectError) -> Self {
        let code = match err {
            ClientConnectError::SystemInfoCallError(status) => Some(status.code()),
            _ => None,
        };
        Self::Connect {
            host_port: host_port.to_owned(),
            message: error_chain(err),
            code,
            refused_certificate: certificate_alert(err),
        }
    }

    /// Classification of the failure (connection failures count as transient, rejected
    /// credentials as [`StatusClass::Auth`]).
    pub fn class(&self) -> StatusClass {
        match self {
            Self::Rpc { class, .. } => *class,
            Self::Connect {
                code: Some(Code::Unauthenticated | Code::PermissionDenied),
                ..
            } => StatusClass::Auth,
            Self::Connect {
                refused_certificate: Some(_),
                ..
            } => StatusClass::Auth,
            Self::Connect { .. } => StatusClass::Transient,
            Self::InvalidConfig { .. } | Self::Encode { .. } => StatusClass::Other,
        }
    }

    /// The gRPC code, if the failure came from a call.
    pub fn code(&self) -> Option<Code> {
        match self {
            Self::Rpc { code, .. } => Some(*code),
            Self::Connect { code, .. } => *code,
            _ => None,
        }
    }

    /// The server's message (or the error text when there is no server message).
    pub fn server_message(&self) -> String {
        match self {
            Self::Rpc { message, .. } => message.clone(),
            other => other.to_string(),
        }
    }

    /// The entity does not exist (a missing namespace does not count).
    pub fn is_not_found(&self) -> bool {
        self.class() == StatusClass::NotFound
    }

    /// The server refused the change in the current state.
    pub fn is_failed_precondition(&self) -> bool {
        self.class() == StatusClass::FailedPrecondition
    }

    /// The server rate limited the call.
    pub fn is_rate_limited(&self) -> bool {
        self.class() == StatusClass::RateLimited
    }

    /// Credentials were rejected: evict the cached client.
    pub fn needs_eviction(&self) -> bool {
        self.class() == StatusClass::Auth
    }

    /// Retrying the same call later may succeed without anyone changing anything
    /// (unreachable, timeouts, rate limits).
    pub fn is_transient(&self) -> bool {
        matches!(
            self.class(),
            StatusClass::Transient | StatusClass::RateLimited
        )
    }

    /// The error as a condition reason and message.
    pub fn to_blocked(&self, reason: BlockReason) -> Blocked {
        Blocked {
            reason,
            message: self.to_string(),
        }
    }
}

/// The error and its causes joined with `": "`, skipping causes already contained in the text.
pub(crate) fn error_chain(err: &(dyn StdError + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let part = cause.to_string();
        if !part.is_empty() && !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_client_certificate_is_a_credential_problem_not_a_network_one() {
        let connect = |refused_certificate| TemporalError::Connect {
            host_port: "t:7233".into(),
            message: "transport error".into(),
            code: None,
            refused_certificate,
        };
        let refused = connect(Some(AlertDescription::BadCertificate));
        assert_eq!(refused.class(), StatusClass::Auth);
        assert!(refused.needs_eviction());
        assert_eq!(connect(None).class(), StatusClass::Transient);
    }

    #[test]
    fn classifies_codes() {
        let nf = Status::not_found("no Worker Deployment found with name 'x'");
        assert_eq!(classify(&nf), StatusClass::NotFound);
        let ns = Status::not_found("Namespace nope is not found.");
        assert_eq!(classify(&ns), StatusClass::NamespaceNotFound);
        // The server's `NamespaceNotFoundFailure` detail says so whatever the message.
        let detailed = with_detail(
            Status::not_found("no such thing"),
            &NamespaceNotFoundFailure {
                namespace: "nope".into(),
            },
        );
        assert_eq!(
            FailureDetail::of(&detailed),
            FailureDetail::NamespaceNotFound
        );
        assert_eq!(classify(&detailed), StatusClass::NamespaceNotFound);
        assert_eq!(FailureDetail::of(&nf), FailureDetail::None);
        let garbage = Status::with_details(Code::NotFound, "gone", b"\xff\xff".to_vec().into());
        assert_eq!(FailureDetail::of(&garbage), FailureDetail::None);
        assert_eq!(
            classify(&Status::resource_exhausted("slow down")),
            StatusClass::RateLimited
        );
        assert_eq!(
            classify(&Status::permission_denied("no")),
            StatusClass::Auth
        );
        assert_eq!(classify(&Status::unauthenticated("no")), StatusClass::Auth);
        assert_eq!(
            classify(&Status::unavailable("down")),
            StatusClass::Transient
        );
        assert_eq!(
            classify(&Status::invalid_argument("bad")),
            StatusClass::Other
        );
        assert!(is_conflict_token_mismatch(&Status::failed_precondition(
            "conflict token mismatch"
        )));
        assert!(is_manager_identity_conflict(&Status::failed_precondition(
            "ManagerIdentity 'x' is set and does not match user identity 'y'"
        )));
    }

    /// `status` with `detail` in its details, as the server encodes them.
    fn with_detail<T: Name>(status: Status, detail: &T) -> Status {
        let details = RpcStatus {
            code: status.code() as i32,
            message: status.message().to_owned(),
            details: vec![prost_wkt_types::Any {
                type_url: format!("type.googleapis.com/{}", T::full_name()),
                value: detail.encode_to_vec(),
            }],
        };
        Status::with_details(
            status.code(),
            status.message(),
            details.encode_to_vec().into(),
        )
    }

    #[test]
    fn error_flags() {
        let err = TemporalError::rpc(
            "DescribeWorkerDeployment",
            "d",
            &Status::unauthenticated("x"),
        );
        assert!(err.needs_eviction());
        assert!(!err.is_transient());
        let err = TemporalError::rpc("X", "d", &Status::resource_exhausted("x"));
        assert!(err.is_rate_limited() && err.is_transient());
        let blocked = err.to_blocked(BlockReason::TemporalStateFetchFailed);
        assert_eq!(blocked.reason, BlockReason::TemporalStateFetchFailed);
        assert!(
            blocked.message.contains("ResourceExhausted"),
            "{}",
            blocked.message
        );
    }
}
