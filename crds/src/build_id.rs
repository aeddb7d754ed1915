//! Build IDs: each distinct pod template is one worker version.
//!
//! `<image tag | digest | repo path>-<hash>` where the hash is the first 10 hex characters of the
//! SHA-256 of the canonical JSON of `spec.template` (the Go controller uses a 4-character FNV
//! hash with 10,000 values; collisions there silently swallow a rollout). Sanitized to
//! `[a-zA-Z0-9._-]`, at most 63 characters, valid as a label value and a Temporal build ID.

use std::fmt;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::TemporalWorkerDeploymentSpec;

/// Longest build ID (a Kubernetes label value).
pub const MAX_BUILD_ID_LEN: usize = 63;
/// Hex characters of the template hash in a build ID.
pub const HASH_LEN: usize = 10;

/// A worker version's build ID.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct BuildId(String);

impl BuildId {
    /// Wraps a build ID read back from Temporal or a label (no validation).
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The build ID text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for BuildId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Computes the build ID of a spec: the custom one if it sanitizes to something, else derived
/// from the first container's image and the template hash.
pub fn compute_build_id(spec: &TemporalWorkerDeploymentSpec) -> BuildId {
    if let Some(custom) = spec.worker_options.unsafe_custom_build_id.as_deref() {
        let cleaned = truncate_clean(&sanitize(custom), MAX_BUILD_ID_LEN);
        if !cleaned.is_empty() {
            return BuildId(cleaned);
        }
    }
    let hash = template_hash(&spec.template);
    let image = spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.image.as_deref())
        .filter(|i| !i.is_empty());
    match image {
        Some(image) => {
            let short_hash = &hash[..HASH_LEN];
            let max_prefix = MAX_BUILD_ID_LEN - HASH_LEN - 1;
            let prefix = truncate_clean(&sanitize(image_prefix(image)), max_prefix);
            if prefix.is_empty() {
                BuildId(short_hash.to_owned())
            } else {
                BuildId(format!("{prefix}-{short_hash}"))
            }
        }
        None => BuildId(hash[..2 * HASH_LEN].to_owned()),
    }
}

/// The build ID of a worker deployment's current spec: the build taken over for exactly this
/// pod template (`status.adoptedBuild`, see [`crate::worker_deployment::AdoptedBuild`]) unless
/// a custom build ID is set, else [`compute_build_id`].
pub fn target_build_id(twd: &crate::TemporalWorkerDeployment) -> BuildId {
    if twd.spec.worker_options.unsafe_custom_build_id.is_none()
        && let Some(adopted) = adopted_build(twd)
    {
        return BuildId(adopted.build_id.clone());
    }
    compute_build_id(&twd.spec)
}

/// `status.adoptedBuild` when it stands for the current pod template.
pub fn adopted_build(
    twd: &crate::TemporalWorkerDeployment,
) -> Option<&crate::worker_deployment::AdoptedBuild> {
    let adopted = twd.status.as_ref()?.adopted_build.as_ref()?;
    (adopted.template_hash == template_hash(&twd.spec.template) && !adopted.build_id.is_empty())
        .then_some(adopted)
}

/// Hex SHA-256 of the canonical JSON (keys sorted, no whitespace) of a pod template.
pub fn template_hash(template: &PodTemplateSpec) -> String {
    // A PodTemplateSpec always serializes; fall back to Null rather than panicking.
    let value = serde_json::to_value(template).unwrap_or(serde_json::Value::Null);
    let mut canonical = String::new();
    write_canonical(&value, &mut canonical);
    hex::encode(Sha256::digest(canonical.as_bytes()))
}

fn write_canonical(value: &serde_json::Value, out: &mut String) {
    match value {
        serde_json::Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(&map[key], out);
            }
            out.push('}');
        }
        serde_json::Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// The part of an image reference that names the build: its tag, else its digest, else its
/// repository path without the registry; the raw text when it does not parse.
pub fn image_prefix(image: &str) -> &str {
    let (name_and_tag, digest) = match image.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (image, None),
    };
    let last_slash = name_and_tag.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match name_and_tag[last_slash..].rfind(':') {
        Some(i) => (
            &name_and_tag[..last_slash + i],
            Some(&name_and_tag[last_slash + i + 1..]),
        ),
        None => (name_and_tag, None),
    };
    let path = strip_registry(name);
    if !is_valid_repository_path(path) || tag.is_some_and(|t| !is_valid_tag(t)) {
        return image;
    }
    if let Some(tag) = tag {
        return tag;
    }
    if let Some(digest) = digest {
        return digest.split_once(':').map_or(digest, |(_, hex)| hex);
    }
    path
}

fn strip_registry(name: &str) -> &str {
    match name.split_once('/') {
        Some((first, rest))
            if (first.contains('.') || first.contains(':') || first == "localhost")
                && first
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':')) =>
        {
            rest
        }
        _ => name,
    }
}

fn is_valid_repository_path(path: &str) -> bool {
    !path.is_empty()
        && path.split('/').all(|component| {
            !component.is_empty()
                && component.chars().all(|c| {
                    c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-')
                })
                && component.starts_with(|c: char| c.is_ascii_alphanumeric())
                && component.ends_with(|c: char| c.is_ascii_alphanumeric())
        })
}

fn is_valid_tag(tag: &str) -> bool {
    !tag.is_empty()
        && tag.len() <= 128
        && tag.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
        && tag
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// Replaces each run of characters outside `[a-zA-Z0-9._-]` with one `-` and trims `-._` from
/// both ends.
pub fn sanitize(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut in_run = false;
    for c in raw.chars() {
        if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
            out.push(c);
            in_run = false;
        } else if !in_run {
            out.push('-');
            in_run = true;
        }
    }
    trim_separators(&out).to_owned()
}

fn truncate_clean(value: &str, max: usize) -> String {
    // `value` is ASCII after sanitizing, so byte truncation is character truncation.
    let cut = &value[..value.len().min(max)];
    trim_separators(cut).to_owned()
}

fn trim_separators(value: &str) -> &str {
    value.trim_matches(|c| matches!(c, '-' | '.' | '_'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker_deployment::test_support::spec_with_image;

    #[test]
    fn an_adopted_build_stands_for_its_template_only() {
        use crate::TemporalWorkerDeployment;
        use crate::worker_deployment::{AdoptedBuild, TemporalWorkerDeploymentStatus};
        let twd = |image: &str, adopted_for: Option<&str>, custom: Option<&str>| {
            let mut spec = spec_with_image(image);
            spec.worker_options.unsafe_custom_build_id = custom.map(str::to_owned);
            let mut twd = TemporalWorkerDeployment::new("w", spec);
            twd.status = adopted_for.map(|for_image| TemporalWorkerDeploymentStatus {
                adopted_build: Some(AdoptedBuild {
                    build_id: "v1-4b95".into(),
                    template_hash: template_hash(&spec_with_image(for_image).template),
                }),
                ..Default::default()
            });
            twd
        };
        let computed = |image: &str| compute_build_id(&spec_with_image(image)).to_string();
        // (image, adopted for the template of, custom build ID, target build)
        let cases = [
            ("w:v1", None, None, computed("w:v1")),
            ("w:v1", Some("w:v1"), None, "v1-4b95".to_owned()),
            // The template moved on: the adoption lapses.
            ("w:v2", Some("w:v1"), None, computed("w:v2")),
            // A custom build ID wins.
            ("w:v1", Some("w:v1"), Some("mine"), "mine".to_owned()),
        ];
        for (image, adopted_for, custom, expected) in cases {
            let object = twd(image, adopted_for, custom);
            assert_eq!(
                target_build_id(&object).as_str(),
                expected,
                "{image} {adopted_for:?} {custom:?}"
            );
        }
    }

    #[test]
    fn image_prefix_takes_tag_then_digest_then_path() {
        let digest = "a".repeat(64);
        let cases = [
            ("temporal/hello-world:v1.0.0", "v1.0.0"),
            ("my.app/test/foo_bar:v1.0", "v1.0"),
            ("docker.io/library/busybox:latest@sha256:0123", "latest"),
            ("docker.io/library/busybox", "library/busybox"),
            ("localhost:5000/worker", "worker"),
            ("my.test_image", "my.test_image"),
            ("this.is.my_weird/image", "this.is.my_weird/image"),
            ("Upper/Case:v1", "Upper/Case:v1"),
        ];
        for (image, expected) in cases {
            assert_eq!(image_prefix(image), expected, "{image}");
        }
        let with_digest = format!("registry.example/worker@sha256:{digest}");
        assert_eq!(image_prefix(&with_digest), digest);
    }

    #[test]
    fn sanitize_replaces_runs_and_trims() {
        assert_eq!(sanitize("library/busybox"), "library-busybox");
        assert_eq!(sanitize("---my-build-id---"), "my-build-id");
        assert_eq!(sanitize("a//b::c"), "a-b-c");
        assert_eq!(sanitize("###$$$%%%"), "");
        assert_eq!(sanitize("v1.0_rc"), "v1.0_rc");
        assert_eq!(sanitize("tag-ünïcode"), "tag--n-code");
    }

    #[test]
    fn build_id_is_prefix_and_ten_hex_hash() {
        let id = compute_build_id(&spec_with_image("temporal/hello-world:v1.0.0"));
        let (prefix, hash) = id.as_str().rsplit_once('-').expect("has a hash suffix");
        assert_eq!(prefix, "v1.0.0");
        assert_eq!(hash.len(), HASH_LEN);
        assert!(hash.chars().all(|c| c.is_ascii_hexdigit()));
    }

    #[test]
    fn weird_image_names_are_sanitized() {
        let id = compute_build_id(&spec_with_image("this.is.my_weird/image"));
        assert!(id.as_str().starts_with("this.is.my_weird-image-"), "{id}");
        let id = compute_build_id(&spec_with_image("my.test_image"));
        assert!(id.as_str().starts_with("my.test_image-"), "{id}");
    }

    #[test]
    fn identical_templates_give_identical_ids_whatever_else_differs() {
        let a = spec_with_image("worker:v1");
        let mut b = a.clone();
        b.replicas = Some(7);
        b.rollout.paused = true;
        b.sunset.delete_delay = "1m".into();
        b.worker_options.temporal_namespace = "other".into();
        assert_eq!(compute_build_id(&a), compute_build_id(&b));
    }

    #[test]
    fn any_template_change_changes_the_id() {
        let base = spec_with_image("worker:v1");
        let mut env = base.clone();
        if let Some(pod) = env.template.spec.as_mut() {
            pod.containers[0].env = Some(vec![k8s_openapi::api::core::v1::EnvVar {
                name: "X".into(),
                value: Some("1".into()),
                ..Default::default()
            }]);
        }
        let mut label = base.clone();
        label.template.metadata.get_or_insert_default().labels =
            Some([("team".to_owned(), "a".to_owned())].into());
        let image = spec_with_image("worker:v2");
        let ids = [&base, &env, &label, &image].map(compute_build_id);
        for i in 0..ids.len() {
            for j in i + 1..ids.len() {
                assert_ne!(ids[i], ids[j], "{i} vs {j}");
            }
        }
    }

    /// The CRDs default the name of a reference Kubernetes lets be empty (`secretKeyRef`,
    /// `envFrom[].secretRef`, `imagePullSecrets[]`, ...) to `""`, as the Go controller's do:
    /// stored with or without it, a template is the same build. They do not fill in the core
    /// defaults that would be another build (`ports[].protocol: TCP`, `grpc.service: ""`): an
    /// API server applies CRD defaults to stored objects too, when it reads them, so every
    /// worker deployment using such a field would roll out again.
    #[test]
    fn the_defaults_of_the_crds_leave_build_ids_as_they_were() {
        let hash = |reference: serde_json::Value, port: serde_json::Value| {
            let template = serde_json::json!({ "spec": {
                "containers": [ {
                    "name": "worker",
                    "image": "worker:v1",
                    "env": [ { "name": "TOKEN", "valueFrom": { "secretKeyRef": reference } } ],
                    "ports": [ port ],
                } ],
                "imagePullSecrets": [ {} ],
            } });
            let template: PodTemplateSpec =
                serde_json::from_value(template).expect("a pod template");
            template_hash(&template)
        };
        let port = serde_json::json!({ "containerPort": 9090 });
        let without_name = hash(serde_json::json!({ "key": "token" }), port.clone());
        let defaulted = hash(serde_json::json!({ "key": "token", "name": "" }), port);
        assert_eq!(without_name, defaulted);
        let tcp = hash(
            serde_json::json!({ "key": "token" }),
            serde_json::json!({ "containerPort": 9090, "protocol": "TCP" }),
        );
        assert_ne!(without_name, tcp);
    }

    #[test]
    fn long_image_tags_keep_the_id_within_63_characters() {
        let tag = "t".repeat(100);
        let id = compute_build_id(&spec_with_image(&format!("worker:{tag}")));
        assert_eq!(id.as_str().len(), MAX_BUILD_ID_LEN);
        assert!(id.as_str().starts_with(&"t".repeat(52)));
    }

    #[test]
    fn truncation_never_leaves_a_separator_before_the_hash() {
        let tag = format!("{}.x", "t".repeat(51));
        let id = compute_build_id(&spec_with_image(&format!("worker:{tag}")));
        assert!(!id.as_str().contains(".-"), "{id}");
    }

    #[test]
    fn custom_build_id_overrides_and_is_sanitized() {
        let mut spec = spec_with_image("worker:v1");
        let cases = [
            ("manual-override-v1", "manual-override-v1".to_owned()),
            ("---my-build-id---", "my-build-id".to_owned()),
            (&*"x".repeat(67), "x".repeat(63)),
        ];
        for (custom, expected) in cases {
            spec.worker_options.unsafe_custom_build_id = Some(custom.to_owned());
            assert_eq!(compute_build_id(&spec).as_str(), expected);
        }
        spec.worker_options.unsafe_custom_build_id = Some("###$$$%%%".into());
        assert!(compute_build_id(&spec).as_str().starts_with("v1-"));
    }

    #[test]
    fn template_without_image_uses_the_hash_alone() {
        let spec = spec_with_image("");
        let id = compute_build_id(&spec);
        assert_eq!(id.as_str().len(), 2 * HASH_LEN);
        assert!(id.as_str().chars().all(|c| c.is_ascii_hexdigit()));
    }

    #[test]
    fn template_hash_ignores_map_key_order() {
        let mut a = PodTemplateSpec {
            metadata: Some(Default::default()),
            ..Default::default()
        };
        let mut b = a.clone();
        if let Some(m) = a.metadata.as_mut() {
            m.labels = Some([("a".into(), "1".into()), ("b".into(), "2".into())].into());
        }
        if let Some(m) = b.metadata.as_mut() {
            m.labels = Some([("b".into(), "2".into()), ("a".into(), "1".into())].into());
        }
        assert_eq!(template_hash(&a), template_hash(&b));
    }
}
