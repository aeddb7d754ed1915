//! Resolves a gate's input: inline `input`, or `inputFrom` a ConfigMap or Secret key in the
//! TWD's namespace. Input must be a JSON object. Secret-sourced input is never logged (size
//! only); other input logs its size and top-level keys.

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{Api, Client, ResourceExt};
use serde_json::Value;
use twc_crds::TemporalWorkerDeployment;
use twc_crds::worker_deployment::GateSpec;
use twc_workflows::model::{BlockReason, Blocked};

use super::error::{K8sError, ObjectName, ResolveError};
use super::lookup::get_if_exists;

/// Where a gate's input comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum InputSource<'a> {
    /// No input: the gate workflow gets no argument.
    None,
    /// `spec.rollout.gate.input`.
    Inline(&'a Value),
    /// A ConfigMap key (`data`, then `binaryData`).
    ConfigMap {
        /// ConfigMap name.
        name: &'a str,
        /// Key.
        key: &'a str,
        /// Missing is not an error.
        optional: bool,
    },
    /// A Secret key.
    Secret {
        /// Secret name.
        name: &'a str,
        /// Key.
        key: &'a str,
        /// Missing is not an error.
        optional: bool,
    },
}

/// The TWD's gate input: `None` without a gate or input; `InvalidSpec` when the input is not a
/// JSON object or both sources are set; `PlanGenerationFailed` when the ConfigMap, Secret or key
/// is missing (or the API server refuses the read); [`ResolveError::Transient`] when the API
/// server could not answer.
pub async fn gate_input(
    client: &Client,
    twd: &TemporalWorkerDeployment,
) -> Result<Option<Value>, ResolveError> {
    let Some(gate) = twd.spec.rollout.gate.as_ref() else {
        return Ok(None);
    };
    let namespace = twd.namespace().unwrap_or_default();
    match input_source(gate)? {
        InputSource::None => Ok(None),
        InputSource::Inline(value) => {
            let input = check_object(value.clone(), "spec.rollout.gate.input")?;
            log_input(&input, "inline", false);
            Ok(Some(input))
        }
        InputSource::ConfigMap {
            name,
            key,
            optional,
        } => {
            let object = ObjectName::new("ConfigMap", &namespace, name);
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
            let config_map = get_if_exists(&api, name)
                .await
                .map_err(|e| read_failed(K8sError::api("get", &object)(e)))?;
            let bytes = match config_map {
                Some(config_map) => config_map_value(&config_map, key),
                None if optional => return Ok(None),
                None => {
                    return Err(plan_failed(format!(
                        "{object} not found (spec.rollout.gate.inputFrom)"
                    ))
                    .into());
                }
            };
            let input = required(bytes, key, &object, optional)?;
            let input = parse_input(&input, &format!("key {key:?} of {object}"))?;
            if let Some(value) = &input {
                log_input(value, &object.to_string(), false);
            }
            Ok(input)
        }
        InputSource::Secret {
            name,
            key,
            optional,
        } => {
            let object = ObjectName::new("Secret", &namespace, name);
            let api: Api<Secret> = Api::namespaced(client.clone(), &namespace);
            let secret = get_if_exists(&api, name)
                .await
                .map_err(|e| read_failed(K8sError::api("get", &object)(e)))?;
            let bytes = match secret {
                Some(secret) => secret_value(&secret, key),
                None if optional => return Ok(None),
                None => {
                    return Err(plan_failed(format!(
                        "{object} not found (spec.rollout.gate.inputFrom)"
                    ))
                    .into());
                }
            };
            let input = required(bytes, key, &object, optional)?;
            let input = parse_input(&input, &format!("key {key:?} of {object}"))?;
            if let Some(value) = &input {
                log_input(value, &object.to_string(), true);
            }
            Ok(input)
        }
    }
}

/// Which source a gate uses; `InvalidSpec` when it names both or an `inputFrom` names none or
/// both.
pub fn input_source(gate: &GateSpec) -> Result<InputSource<'_>, Blocked> {
    let invalid = |message: &str| Blocked {
        reason: BlockReason::InvalidSpec,
        message: message.to_owned(),
    };
    match (&gate.input, &gate.input_from) {
        (Some(_), Some(_)) => Err(invalid(
            "spec.rollout.gate: set only one of input or inputFrom",
        )),
        (Some(value), None) => Ok(InputSource::Inline(value)),
        (None, None) => Ok(InputSource::None),
        (None, Some(from)) => match (&from.config_map_key_ref, &from.secret_key_ref) {
            (Some(r), None) => Ok(InputSource::ConfigMap {
                name: &r.name,
                key: &r.key,
                optional: r.optional.unwrap_or(false),
            }),
            (None, Some(r)) => Ok(InputSource::Secret {
                name: &r.name,
                key: &r.key,
                optional: r.optional.unwrap_or(false),
            }),
            _ => Err(invalid(
                "spec.rollout.gate.inputFrom: set exactly one of configMapKeyRef or secretKeyRef",
            )),
        },
    }
}

/// A ConfigMap key's bytes, from `data` first, then `binaryData`.
pub fn config_map_value(config_map: &ConfigMap, key: &str) -> Option<Vec<u8>> {
    let text = config_map
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|v| v.as_bytes().to_vec());
    text.or_else(|| {
        config_map
            .binary_data
            .as_ref()
            .and_then(|d| d.get(key))
            .map(|v| v.0.clone())
    })
}

/// A Secret key's bytes.
pub fn secret_value(secret: &Secret, key: &str) -> Option<Vec<u8>> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|v| v.0.clone())
}

/// Parses gate input read from `origin`: empty means no input; otherwise it must be a JSON
/// object (`InvalidSpec`). Error messages never quote the input.
pub fn parse_input(bytes: &[u8], origin: &str) -> Result<Option<Value>, Blocked> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let value: Value = serde_json::from_slice(bytes).map_err(|e| Blocked {
        reason: BlockReason::InvalidSpec,
        message: format!(
            "gate input in {origin} is not valid JSON (line {}, column {})",
            e.line(),
            e.column()
        ),
    })?;
    check_object(value, origin).map(Some)
}

fn check_object(value: Value, origin: &str) -> Result<Value, Blocked> {
    let kind = match &value {
        Value::Object(_) => return Ok(value),
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
    };
    Err(Blocked {
        reason: BlockReason::InvalidSpec,
        message: format!("gate input in {origin} must be a JSON object, not {kind}"),
    })
}

fn required(
    bytes: Option<Vec<u8>>,
    key: &str,
    object: &ObjectName,
    optional: bool,
) -> Result<Vec<u8>, Blocked> {
    match bytes {
        Some(bytes) => Ok(bytes),
        None if optional => Ok(Vec::new()),
        None => Err(plan_failed(format!(
            "key {key:?} not found in {} {}/{}",
            object.kind, object.namespace, object.name
        ))),
    }
}

/// A failed read of the input's ConfigMap or Secret: retried when transient, else
/// `PlanGenerationFailed`.
fn read_failed(error: K8sError) -> ResolveError {
    match ResolveError::from_read(error) {
        ResolveError::Blocked(blocked) => plan_failed(blocked.message).into(),
        transient => transient,
    }
}

fn plan_failed(message: String) -> Blocked {
    Blocked {
        reason: BlockReason::PlanGenerationFailed,
        message,
    }
}

fn log_input(value: &Value, origin: &str, secret: bool) {
    let size = value.to_string().len();
    if secret {
        tracing::debug!(origin, size, "resolved gate input from a Secret");
    } else {
        let keys: Vec<&str> = value
            .as_object()
            .map(|o| o.keys().map(String::as_str).collect())
            .unwrap_or_default();
        tracing::debug!(origin, size, ?keys, "resolved gate input");
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::{ConfigMapKeySelector, SecretKeySelector};
    use serde_json::json;
    use twc_crds::worker_deployment::GateInputSource;

    use super::*;

    fn gate(input: Option<Value>, from: Option<GateInputSource>) -> GateSpec {
        GateSpec {
            workflow_type: "Check".into(),
            input,
            input_from: from,
        }
    }

    fn config_map_ref(name: &str, key: &str) -> ConfigMapKeySelector {
        ConfigMapKeySelector {
            name: name.into(),
            key: key.into(),
            optional: None,
        }
    }

    fn secret_ref(name: &str, key: &str) -> SecretKeySelector {
        SecretKeySelector {
            name: name.into(),
            key: key.into(),
            optional: Some(true),
        }
    }

    #[test]
    fn the_source_is_inline_or_exactly_one_reference() {
        let inline = json!({"a": 1});
        assert_eq!(
            input_source(&gate(Some(inline.clone()), None)),
            Ok(InputSource::Inline(&inline))
        );
        assert_eq!(input_source(&gate(None, None)), Ok(InputSource::None));
        let from_cm = gate(
            None,
            Some(GateInputSource {
                config_map_key_ref: Some(config_map_ref("cm", "k")),
                secret_key_ref: None,
            }),
        );
        assert_eq!(
            input_source(&from_cm),
            Ok(InputSource::ConfigMap {
                name: "cm",
                key: "k",
                optional: false
            })
        );
        let from_secret = gate(
            None,
            Some(GateInputSource {
                config_map_key_ref: None,
                secret_key_ref: Some(secret_ref("s", "k")),
            }),
        );
        assert_eq!(
            input_source(&from_secret),
            Ok(InputSource::Secret {
                name: "s",
                key: "k",
                optional: true
            })
        );

        let both = gate(
            Some(inline.clone()),
            Some(GateInputSource {
                config_map_key_ref: Some(config_map_ref("cm", "k")),
                secret_key_ref: None,
            }),
        );
        let neither = gate(
            None,
            Some(GateInputSource {
                config_map_key_ref: None,
                secret_key_ref: None,
            }),
        );
        for invalid in [both, neither] {
            assert_eq!(
                input_source(&invalid).map_err(|b| b.reason),
                Err(BlockReason::InvalidSpec)
            );
        }
    }

    #[test]
    fn config_map_keys_are_read_from_data_then_binary_data() {
        let config_map = ConfigMap {
            data: Some(BTreeMap::from([(
                "text".to_owned(),
                "{\"a\":1}".to_owned(),
            )])),
            binary_data: Some(BTreeMap::from([
                ("text".to_owned(), ByteString(b"ignored".to_vec())),
                ("bin".to_owned(), ByteString(b"{\"b\":2}".to_vec())),
            ])),
            ..Default::default()
        };
        assert_eq!(
            config_map_value(&config_map, "text").as_deref(),
            Some(&b"{\"a\":1}"[..])
        );
        assert_eq!(
            config_map_value(&config_map, "bin").as_deref(),
            Some(&b"{\"b\":2}"[..])
        );
        assert_eq!(config_map_value(&config_map, "missing"), None);
    }

    #[test]
    fn secret_keys_are_read_from_data() {
        let secret = Secret {
            data: Some(BTreeMap::from([(
                "input".to_owned(),
                ByteString(b"{}".to_vec()),
            )])),
            ..Default::default()
        };
        assert_eq!(secret_value(&secret, "input").as_deref(), Some(&b"{}"[..]));
        assert_eq!(secret_value(&secret, "other"), None);
    }

    #[test]
    fn input_must_be_a_json_object() {
        assert_eq!(
            parse_input(b"{\"x\": [1]}", "k"),
            Ok(Some(json!({"x": [1]})))
        );
        assert_eq!(parse_input(b"  \n", "k"), Ok(None));
        let not_json = parse_input(b"{\"password\": hunter2}", "key \"k\" of Secret ns/s")
            .expect_err("invalid");
        assert_eq!(not_json.reason, BlockReason::InvalidSpec);
        assert!(
            !not_json.message.contains("hunter2"),
            "{}",
            not_json.message
        );
        assert!(
            not_json.message.contains("Secret ns/s"),
            "{}",
            not_json.message
        );
        let array = parse_input(b"[1]", "k").expect_err("array");
        assert_eq!(
            (array.reason, array.message.contains("not an array")),
            (BlockReason::InvalidSpec, true)
        );
    }

    #[test]
    fn a_missing_key_names_the_key_and_object() {
        let object = ObjectName::new("ConfigMap", "ns", "gate");
        let missing = required(None, "x", &object, false).expect_err("missing");
        assert_eq!(missing.reason, BlockReason::PlanGenerationFailed);
        assert_eq!(missing.message, "key \"x\" not found in ConfigMap ns/gate");
        assert_eq!(required(None, "x", &object, true), Ok(Vec::new()));
    }
}
