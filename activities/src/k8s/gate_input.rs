//! Resolves a gate's input (the rollout's gate or a step's): inline `input`, or `inputFrom` a
//! ConfigMap or Secret key in the TWD's namespace. Input must be a JSON object. Secret-sourced input is never logged (size
//! only); other input logs its size and top-level keys.

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{Api, Client};
use serde_json::Value;
use twc_crds::worker_deployment::{GateSpec, RolloutSpec};
use twc_workflows::model::{BlockReason, Blocked};

use super::error::{K8sError, ObjectName, ResolveError};
use super::lookup::get_if_exists;

/// Where a gate's input comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum InputSource<'a> {
    /// No input: the gate workflow gets no argument.
    None,
    /// The gate's `input`.
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

/// A gate of the TWD's spec and where it is (`spec.rollout.gate`, `spec.rollout.steps[1].gate`),
/// for messages.
#[derive(Debug, Clone, PartialEq)]
pub struct GateField<'a> {
    /// The gate.
    pub gate: &'a GateSpec,
    /// Its path in the spec.
    pub path: String,
}

impl<'a> GateField<'a> {
    /// The rollout's gate (`spec.rollout.gate`).
    pub fn rollout(gate: &'a GateSpec) -> Self {
        Self {
            gate,
            path: "spec.rollout.gate".to_owned(),
        }
    }
}

/// The gate of step `step` (0-based, as in the spec's list) in `rollout`;
/// `PlanGenerationFailed` when the step or its gate is no longer in the spec (it changed since
/// the rollout reached the step).
pub fn step_gate(rollout: &RolloutSpec, step: u32) -> Result<GateField<'_>, Blocked> {
    let steps = rollout.steps.as_deref().unwrap_or_default();
    let path = format!("spec.rollout.steps[{step}].gate");
    let found = usize::try_from(step).ok().and_then(|i| steps.get(i));
    match found {
        Some(s) => match &s.gate {
            Some(gate) => Ok(GateField { gate, path }),
            None => Err(plan_failed(format!(
                "{path} is not set any more: step {} of the rollout has no gate to run (the spec \
                 changed while the rollout was in that step)",
                u64::from(step) + 1
            ))),
        },
        None => Err(plan_failed(format!(
            "step {} of the rollout is not in spec.rollout.steps any more ({} step(s)), so its \
             gate cannot run (the spec changed while the rollout was in that step)",
            u64::from(step) + 1,
            steps.len()
        ))),
    }
}

/// A gate's input: `None` without input; `InvalidSpec` when the input is not a JSON object or
/// both sources are set; `PlanGenerationFailed` when the ConfigMap, Secret or key is missing (or
/// the API server refuses the read); [`ResolveError::Transient`] when the API server could not
/// answer. `namespace` is the TWD's.
pub async fn gate_input(
    client: &Client,
    namespace: &str,
    field: &GateField<'_>,
) -> Result<Option<Value>, ResolveError> {
    let GateField { gate, path } = field;
    match input_source(gate, path)? {
        InputSource::None => Ok(None),
        InputSource::Inline(value) => {
            let input = check_object(value.clone(), &format!("{path}.input"))?;
            log_input(&input, "inline", false);
            Ok(Some(input))
        }
        InputSource::ConfigMap {
            name,
            key,
            optional,
        } => {
            let object = ObjectName::new("ConfigMap", namespace, name);
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
            let config_map = get_if_exists(&api, name)
                .await
                .map_err(|e| read_failed(K8sError::api("get", &object)(e)))?;
            let bytes = match config_map {
                Some(config_map) => config_map_value(&config_map, key),
                None if optional => return Ok(None),
                None => {
                    return Err(
                        plan_failed(format!("{object} not found ({path}.inputFrom)")).into(),
                    );
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
            let object = ObjectName::new("Secret", namespace, name);
            let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
            let secret = get_if_exists(&api, name)
                .await
                .map_err(|e| read_failed(K8sError::api("get", &object)(e)))?;
            let bytes = match secret {
                Some(secret) => secret_value(&secret, key),
                None if optional => return Ok(None),
                None => {
                    return Err(
                        plan_failed(format!("{object} not found ({path}.inputFrom)")).into(),
                    );
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

/// Which source a gate (at `path` in the spec) uses; `InvalidSpec` when it names both or an
/// `inputFrom` names none or both.
pub fn input_source<'a>(gate: &'a GateSpec, path: &str) -> Result<InputSource<'a>, Blocked> {
    let invalid = |message: String| Blocked {
        reason: BlockReason::InvalidSpec,
        message,
    };
    // The CRD lets a reference's name be empty (as Kubernetes and the Go controller's CRD do).
    let named = |name: &'a str, field: &str, kind: &str| {
        if name.is_empty() {
            Err(invalid(format!(
                "{path}.inputFrom.{field}.name is empty: name the {kind} that holds the input"
            )))
        } else {
            Ok(name)
        }
    };
    match (&gate.input, &gate.input_from) {
        (Some(_), Some(_)) => Err(invalid(format!(
            "{path}: set only one of input or inputFrom"
        ))),
        (Some(value), None) => Ok(InputSource::Inline(value)),
        (None, None) => Ok(InputSource::None),
        (None, Some(from)) => match (&from.config_map_key_ref, &from.secret_key_ref) {
            (Some(r), None) => Ok(InputSource::ConfigMap {
                name: named(&r.name, "configMapKeyRef", "ConfigMap")?,
                key: &r.key,
                optional: r.optional.unwrap_or(false),
            }),
            (None, Some(r)) => Ok(InputSource::Secret {
                name: named(&r.name, "secretKeyRef", "Secret")?,
                key: &r.key,
                optional: r.optional.unwrap_or(false),
            }),
            _ => Err(invalid(format!(
                "{path}.inputFrom: set exactly one of configMapKeyRef or secretKeyRef"
            ))),
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
            input_source(&gate(Some(inline.clone()), None), "spec.rollout.gate"),
            Ok(InputSource::Inline(&inline))
        );
        assert_eq!(
            input_source(&gate(None, None), "spec.rollout.gate"),
            Ok(InputSource::None)
        );
        let from_cm = gate(
            None,
            Some(GateInputSource {
                config_map_key_ref: Some(config_map_ref("cm", "k")),
                secret_key_ref: None,
            }),
        );
        assert_eq!(
            input_source(&from_cm, "spec.rollout.gate"),
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
            input_source(&from_secret, "spec.rollout.gate"),
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
                input_source(&invalid, "spec.rollout.gate").map_err(|b| b.reason),
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

    fn rollout(steps: Vec<Option<GateSpec>>) -> RolloutSpec {
        RolloutSpec {
            strategy: twc_crds::worker_deployment::RolloutStrategy::Progressive,
            steps: Some(
                steps
                    .into_iter()
                    .enumerate()
                    .map(|(i, gate)| twc_crds::worker_deployment::RolloutStep {
                        ramp_percentage: 10 * (i32::try_from(i).unwrap_or(0) + 1),
                        pause_duration: "1m".into(),
                        gate,
                    })
                    .collect(),
            ),
            gate: Some(gate(None, None)),
            paused: false,
            rollback_window: "1h".into(),
            analysis: None,
            replay_check: None,
        }
    }

    #[test]
    fn a_step_gate_comes_from_its_step_and_a_removed_one_cannot_run() {
        let mut smoke = gate(Some(json!({"n": 1})), None);
        smoke.workflow_type = "Smoke".into();
        let spec = rollout(vec![None, Some(smoke.clone())]);
        assert_eq!(
            step_gate(&spec, 1),
            Ok(GateField {
                gate: &smoke,
                path: "spec.rollout.steps[1].gate".to_owned()
            })
        );
        let cases = [
            (
                0,
                "spec.rollout.steps[0].gate is not set any more: step 1 of the rollout has no gate",
            ),
            (
                2,
                "step 3 of the rollout is not in spec.rollout.steps any more (2 step(s))",
            ),
            (
                u32::MAX,
                "step 4294967296 of the rollout is not in spec.rollout.steps",
            ),
        ];
        for (step, expected) in cases {
            let blocked = step_gate(&spec, step).expect_err("no gate");
            assert_eq!(blocked.reason, BlockReason::PlanGenerationFailed);
            assert!(blocked.message.starts_with(expected), "{}", blocked.message);
        }
        let no_steps = RolloutSpec {
            steps: None,
            ..spec
        };
        assert!(step_gate(&no_steps, 0).is_err());
    }

    #[test]
    fn source_problems_name_the_gate_they_are_in() {
        let both = gate(
            Some(json!({})),
            Some(GateInputSource {
                config_map_key_ref: Some(config_map_ref("cm", "k")),
                secret_key_ref: None,
            }),
        );
        let blocked = input_source(&both, "spec.rollout.steps[2].gate").expect_err("both");
        assert_eq!(
            blocked.message,
            "spec.rollout.steps[2].gate: set only one of input or inputFrom"
        );
        let neither = gate(
            None,
            Some(GateInputSource {
                config_map_key_ref: None,
                secret_key_ref: None,
            }),
        );
        let blocked = input_source(&neither, "spec.rollout.gate").expect_err("neither");
        assert_eq!(
            blocked.message,
            "spec.rollout.gate.inputFrom: set exactly one of configMapKeyRef or secretKeyRef"
        );
        let unnamed = gate(
            None,
            Some(GateInputSource {
                config_map_key_ref: None,
                secret_key_ref: Some(secret_ref("", "k")),
            }),
        );
        let blocked = input_source(&unnamed, "spec.rollout.gate").expect_err("unnamed");
        assert_eq!(blocked.reason, BlockReason::InvalidSpec);
        assert_eq!(
            blocked.message,
            "spec.rollout.gate.inputFrom.secretKeyRef.name is empty: name the Secret that holds \
             the input"
        );
    }
}
