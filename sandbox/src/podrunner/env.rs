//! A container's environment, resolved the way kubelet does: `envFrom`, then `env` in order,
//! with `$(VAR)` references to earlier variables expanded.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, EnvVar};

use super::sources::{SourceKind, Sources};

/// Pod fields that `valueFrom.fieldRef` can read.
#[derive(Debug, Clone, Default)]
pub struct PodFields {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.labels` of the pod template.
    pub labels: BTreeMap<String, String>,
    /// `metadata.annotations` of the pod template.
    pub annotations: BTreeMap<String, String>,
    /// `spec.serviceAccountName`.
    pub service_account: String,
}

/// The address reported for `status.podIP` and `status.hostIP`: every pod runs on loopback.
pub const POD_IP: &str = "127.0.0.1";

/// Why a container's environment cannot be built (the pod is not started).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    /// A required Secret or ConfigMap does not exist.
    #[error("{kind} \"{name}\" not found")]
    MissingObject {
        /// Secret or ConfigMap.
        kind: SourceKind,
        /// Its name.
        name: String,
    },
    /// A required key is not in its Secret or ConfigMap.
    #[error("couldn't find key {key} in {kind} \"{name}\"")]
    MissingKey {
        /// Secret or ConfigMap.
        kind: SourceKind,
        /// Its name.
        name: String,
        /// The missing key.
        key: String,
    },
    /// A `fieldRef` to a field the runner does not know.
    #[error("env var {var}: unsupported fieldRef {path:?}")]
    UnsupportedField {
        /// The variable.
        var: String,
        /// The field path.
        path: String,
    },
    /// A `valueFrom` kind the runner does not support.
    #[error("env var {var}: unsupported valueFrom ({what})")]
    UnsupportedSource {
        /// The variable.
        var: String,
        /// Which kind of source.
        what: &'static str,
    },
}

/// Resolves the container's environment (without the runner's own `PATH`/`HOME`).
pub fn resolve(
    container: &Container,
    fields: &PodFields,
    sources: &Sources,
) -> Result<BTreeMap<String, String>, EnvError> {
    let mut env = BTreeMap::new();
    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.as_deref().unwrap_or("");
        let (kind, name, optional) = match (&from.secret_ref, &from.config_map_ref) {
            (Some(s), _) => (SourceKind::Secret, &s.name, s.optional),
            (None, Some(c)) => (SourceKind::ConfigMap, &c.name, c.optional),
            (None, None) => continue,
        };
        match sources.get(kind, name) {
            Some(data) => {
                for (key, value) in data {
                    let var = format!("{prefix}{key}");
                    if is_valid_name(&var) {
                        env.insert(var, lossy(value));
                    }
                }
            }
            None if optional.unwrap_or(false) => {}
            None => {
                return Err(EnvError::MissingObject {
                    kind,
                    name: name.clone(),
                });
            }
        }
    }
    for var in container.env.iter().flatten() {
        if let Some(value) = resolve_var(var, fields, sources, &env)? {
            env.insert(var.name.clone(), value);
        }
    }
    Ok(env)
}

/// One `env` entry; `Ok(None)` when an optional source is missing (the variable is left out).
fn resolve_var(
    var: &EnvVar,
    fields: &PodFields,
    sources: &Sources,
    earlier: &BTreeMap<String, String>,
) -> Result<Option<String>, EnvError> {
    let Some(from) = &var.value_from else {
        let raw = var.value.as_deref().unwrap_or("");
        return Ok(Some(expand(raw, |name| {
            earlier.get(name).map(String::as_str)
        })));
    };
    if let Some(sel) = &from.secret_key_ref {
        return lookup_key(
            sources,
            SourceKind::Secret,
            &sel.name,
            &sel.key,
            sel.optional,
        );
    }
    if let Some(sel) = &from.config_map_key_ref {
        return lookup_key(
            sources,
            SourceKind::ConfigMap,
            &sel.name,
            &sel.key,
            sel.optional,
        );
    }
    if let Some(sel) = &from.field_ref {
        return field_value(&sel.field_path, fields)
            .map(Some)
            .ok_or_else(|| EnvError::UnsupportedField {
                var: var.name.clone(),
                path: sel.field_path.clone(),
            });
    }
    let what = if from.resource_field_ref.is_some() {
        "resourceFieldRef"
    } else if from.file_key_ref.is_some() {
        "fileKeyRef"
    } else {
        "empty"
    };
    Err(EnvError::UnsupportedSource {
        var: var.name.clone(),
        what,
    })
}

/// A key of a Secret or ConfigMap, honoring `optional`.
fn lookup_key(
    sources: &Sources,
    kind: SourceKind,
    name: &str,
    key: &str,
    optional: Option<bool>,
) -> Result<Option<String>, EnvError> {
    let optional = optional.unwrap_or(false);
    let Some(data) = sources.get(kind, name) else {
        return if optional {
            Ok(None)
        } else {
            Err(EnvError::MissingObject {
                kind,
                name: name.to_string(),
            })
        };
    };
    match data.get(key) {
        Some(value) => Ok(Some(lossy(value))),
        None if optional => Ok(None),
        None => Err(EnvError::MissingKey {
            kind,
            name: name.to_string(),
            key: key.to_string(),
        }),
    }
}

/// The value of a downward-API field path, if supported.
fn field_value(path: &str, fields: &PodFields) -> Option<String> {
    let map_key = |prefix: &str| {
        path.strip_prefix(prefix)?
            .strip_suffix("']")
            .map(str::to_string)
    };
    match path {
        "metadata.name" => Some(fields.name.clone()),
        "metadata.namespace" => Some(fields.namespace.clone()),
        "spec.serviceAccountName" => Some(fields.service_account.clone()),
        "spec.nodeName" => Some("localhost".to_string()),
        "status.podIP" | "status.hostIP" | "status.podIPs" | "status.hostIPs" => {
            Some(POD_IP.to_string())
        }
        _ => {
            if let Some(key) = map_key("metadata.labels['") {
                return Some(fields.labels.get(&key).cloned().unwrap_or_default());
            }
            let key = map_key("metadata.annotations['")?;
            Some(fields.annotations.get(&key).cloned().unwrap_or_default())
        }
    }
}

/// Expands `$(NAME)` with `lookup`, like Kubernetes: `$$` is a literal `$`, and references to
/// unknown names (or without a closing parenthesis) are kept as written.
pub fn expand<'a>(input: &str, lookup: impl Fn(&str) -> Option<&'a str>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(dollar) = rest.find('$') {
        out.push_str(&rest[..dollar]);
        let after = &rest[dollar + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(') {
            match inner.find(')') {
                Some(close) => {
                    let name = &inner[..close];
                    match lookup(name) {
                        Some(value) => out.push_str(value),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &inner[close + 1..];
                }
                None => {
                    out.push_str(&rest[dollar..]);
                    rest = "";
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// Whether an `envFrom` key can become a variable name (Kubernetes skips the others).
fn is_valid_name(name: &str) -> bool {
    !name.is_empty() && !name.contains('=') && name.bytes().all(|b| (0x20..0x7f).contains(&b))
}

/// Bytes as a string for an environment variable (invalid UTF-8 is replaced).
fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ConfigMapEnvSource, EnvFromSource, EnvVarSource, ObjectFieldSelector, SecretKeySelector,
    };

    fn plain(name: &str, value: &str) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: Some(value.into()),
            ..Default::default()
        }
    }

    fn secret_ref(name: &str, secret: &str, key: &str, optional: Option<bool>) -> EnvVar {
        EnvVar {
            name: name.into(),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: secret.into(),
                    key: key.into(),
                    optional,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn container(env: Vec<EnvVar>) -> Container {
        Container {
            name: "worker".into(),
            env: Some(env),
            ..Default::default()
        }
    }

    fn fields() -> PodFields {
        PodFields {
            name: "w-abcde".into(),
            namespace: "ns1".into(),
            labels: BTreeMap::from([("temporal.io/build-id".into(), "v1".into())]),
            ..Default::default()
        }
    }

    fn sources_with_secret(name: &str, key: &str, value: &str) -> Sources {
        let mut s = Sources::default();
        s.insert(
            SourceKind::Secret,
            name,
            Some(BTreeMap::from([(
                key.to_string(),
                value.as_bytes().to_vec(),
            )])),
        );
        s
    }

    #[test]
    fn plain_values_are_passed_through() {
        let c = container(vec![plain("A", "1"), plain("B", "two words")]);
        let env = resolve(&c, &fields(), &Sources::default()).unwrap();
        assert_eq!(env.get("A").map(String::as_str), Some("1"));
        assert_eq!(env.get("B").map(String::as_str), Some("two words"));
        assert_eq!(env.len(), 2);
    }

    #[test]
    fn references_to_earlier_variables_are_expanded() {
        let c = container(vec![
            plain("HOST", "localhost"),
            plain("ADDR", "$(HOST):7233"),
            plain("LATER", "$(AFTER)"),
            plain("AFTER", "x"),
            plain("ESCAPED", "$$(HOST)"),
        ]);
        let env = resolve(&c, &fields(), &Sources::default()).unwrap();
        assert_eq!(env["ADDR"], "localhost:7233");
        assert_eq!(env["LATER"], "$(AFTER)");
        assert_eq!(env["ESCAPED"], "$(HOST)");
    }

    #[test]
    fn expansion_keeps_malformed_references() {
        let none = |_: &str| None;
        assert_eq!(expand("a$b", none), "a$b");
        assert_eq!(expand("$(OPEN", none), "$(OPEN");
        assert_eq!(expand("end$", none), "end$");
        assert_eq!(expand("$(X)$(Y)", |n| (n == "X").then_some("1")), "1$(Y)");
    }

    #[test]
    fn later_entries_override_earlier_ones() {
        let c = container(vec![plain("A", "1"), plain("A", "2")]);
        let env = resolve(&c, &fields(), &Sources::default()).unwrap();
        assert_eq!(env["A"], "2");
    }

    #[test]
    fn secret_keys_are_read_from_sources() {
        let c = container(vec![secret_ref("KEY", "creds", "api-key", None)]);
        let env = resolve(
            &c,
            &fields(),
            &sources_with_secret("creds", "api-key", "s3cr3t"),
        )
        .unwrap();
        assert_eq!(env["KEY"], "s3cr3t");
    }

    #[test]
    fn missing_required_secret_is_an_error() {
        let c = container(vec![secret_ref("KEY", "creds", "api-key", None)]);
        let err = resolve(&c, &fields(), &Sources::default()).unwrap_err();
        assert_eq!(err.to_string(), "secret \"creds\" not found");
    }

    #[test]
    fn missing_required_key_is_an_error() {
        let c = container(vec![secret_ref("KEY", "creds", "other", None)]);
        let err =
            resolve(&c, &fields(), &sources_with_secret("creds", "api-key", "v")).unwrap_err();
        assert!(matches!(err, EnvError::MissingKey { .. }), "{err}");
    }

    #[test]
    fn missing_optional_secret_leaves_the_variable_out() {
        let c = container(vec![
            secret_ref("KEY", "creds", "api-key", Some(true)),
            secret_ref("OTHER", "present", "nope", Some(true)),
        ]);
        let env = resolve(&c, &fields(), &sources_with_secret("present", "k", "v")).unwrap();
        assert!(env.is_empty());
    }

    #[test]
    fn pod_name_and_namespace_come_from_field_refs() {
        let field = |name: &str, path: &str| EnvVar {
            name: name.into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: path.into(),
                    api_version: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let c = container(vec![
            field("POD", "metadata.name"),
            field("NS", "metadata.namespace"),
            field("BUILD", "metadata.labels['temporal.io/build-id']"),
            field("IP", "status.podIP"),
        ]);
        let env = resolve(&c, &fields(), &Sources::default()).unwrap();
        assert_eq!(env["POD"], "w-abcde");
        assert_eq!(env["NS"], "ns1");
        assert_eq!(env["BUILD"], "v1");
        assert_eq!(env["IP"], "127.0.0.1");
        let bad = container(vec![field("X", "status.phase")]);
        assert!(matches!(
            resolve(&bad, &fields(), &Sources::default()),
            Err(EnvError::UnsupportedField { .. })
        ));
    }

    #[test]
    fn env_from_adds_prefixed_keys_and_env_overrides_them() {
        let mut c = container(vec![
            plain("CFG_MODE", "override"),
            plain("X", "$(CFG_HOST)"),
        ]);
        c.env_from = Some(vec![EnvFromSource {
            prefix: Some("CFG_".into()),
            config_map_ref: Some(ConfigMapEnvSource {
                name: "settings".into(),
                optional: None,
            }),
            secret_ref: None,
        }]);
        let mut sources = Sources::default();
        sources.insert(
            SourceKind::ConfigMap,
            "settings",
            Some(BTreeMap::from([
                ("MODE".to_string(), b"default".to_vec()),
                ("HOST".to_string(), b"h".to_vec()),
                ("bad=name".to_string(), b"skipped".to_vec()),
            ])),
        );
        let env = resolve(&c, &fields(), &sources).unwrap();
        assert_eq!(env["CFG_MODE"], "override");
        assert_eq!(env["CFG_HOST"], "h");
        assert_eq!(env["X"], "h");
        assert!(!env.contains_key("CFG_bad=name"));
    }
}
