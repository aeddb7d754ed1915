//! Small conversions shared by the operations: timestamps, payloads, conflict tokens, requests.

use std::collections::HashMap;

use base64::{Engine as _, engine::general_purpose::STANDARD};
use temporalio_client::{
    request_extensions::NoRetryOnMatching,
    tonic::{Code, IntoRequest, Request, Status},
};
use temporalio_common::protos::temporal::api::{
    common::v1::{Payload, Payloads},
    deployment::v1::WorkerDeploymentVersion,
};
use twc_workflows::model::UnixMillis;

use crate::temporal::error::TemporalError;

/// Encoding of JSON payloads (what the SDKs' default converters and the CLI use).
pub(crate) const JSON_ENCODING: &[u8] = b"json/plain";

/// A protobuf timestamp in Unix milliseconds; unset, zero or pre-1970 (Go's zero time) → None.
pub(crate) fn millis(ts: Option<&prost_wkt_types::Timestamp>) -> Option<UnixMillis> {
    let ts = ts?;
    if ts.seconds <= 0 {
        return None;
    }
    Some(ts.seconds.saturating_mul(1000) + i64::from(ts.nanos) / 1_000_000)
}

/// A conflict token as the base64 text kept in workflow histories.
pub(crate) fn encode_token(token: &[u8]) -> String {
    STANDARD.encode(token)
}

/// The bytes of a base64 conflict token.
pub(crate) fn decode_token(token: &str) -> Result<Vec<u8>, TemporalError> {
    STANDARD
        .decode(token.trim())
        .map_err(|e| TemporalError::Encode {
            what: "conflict token (not base64)".to_owned(),
            message: e.to_string(),
        })
}

/// A `json/plain` payload.
pub(crate) fn json_payload(
    value: &serde_json::Value,
    what: &str,
) -> Result<Payload, TemporalError> {
    let data = serde_json::to_vec(value).map_err(|e| TemporalError::Encode {
        what: what.to_owned(),
        message: e.to_string(),
    })?;
    Ok(Payload {
        metadata: HashMap::from([("encoding".to_owned(), JSON_ENCODING.to_vec())]),
        data,
        ..Default::default()
    })
}

/// A single JSON argument, or no arguments.
pub(crate) fn json_args(
    value: Option<&serde_json::Value>,
    what: &str,
) -> Result<Option<Payloads>, TemporalError> {
    value
        .map(|v| {
            Ok(Payloads {
                payloads: vec![json_payload(v, what)?],
            })
        })
        .transpose()
}

/// A deployment version reference.
pub(crate) fn version_ref(deployment_name: &str, build_id: &str) -> WorkerDeploymentVersion {
    WorkerDeploymentVersion {
        build_id: build_id.to_owned(),
        deployment_name: deployment_name.to_owned(),
    }
}

fn is_rate_limited(status: &Status) -> bool {
    status.code() == Code::ResourceExhausted
}

/// A read request: the SDK's retry loop gives up at once on ResourceExhausted, so a rate-limited
/// read is reported (and backed off by the workflow) instead of retried against the same limit.
pub(crate) fn read_request<T>(message: T) -> Request<T> {
    let mut request = message.into_request();
    request.extensions_mut().insert(NoRetryOnMatching {
        predicate: is_rate_limited,
    });
    request
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps() {
        assert_eq!(millis(None), None);
        let zero = prost_wkt_types::Timestamp::default();
        assert_eq!(millis(Some(&zero)), None);
        let go_zero = prost_wkt_types::Timestamp {
            seconds: -62_135_596_800,
            nanos: 0,
        };
        assert_eq!(millis(Some(&go_zero)), None);
        let ts = prost_wkt_types::Timestamp {
            seconds: 1_700_000_000,
            nanos: 123_456_789,
        };
        assert_eq!(millis(Some(&ts)), Some(1_700_000_000_123));
    }

    #[test]
    fn tokens_round_trip() {
        let token = encode_token(&[0, 1, 2, 255]);
        assert_eq!(decode_token(&token).ok(), Some(vec![0, 1, 2, 255]));
        assert!(decode_token("not base64!").is_err());
    }

    #[test]
    fn payloads() {
        let args = json_args(Some(&serde_json::json!({"a": 1})), "input").expect("encodes");
        let payload = &args.expect("one arg").payloads[0];
        assert_eq!(payload.data, br#"{"a":1}"#);
        assert_eq!(
            payload.metadata.get("encoding").map(Vec::as_slice),
            Some(JSON_ENCODING)
        );
        assert!(json_args(None, "input").expect("none").is_none());
    }
}
