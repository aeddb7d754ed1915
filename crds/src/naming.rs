//! Names derived from a TemporalWorkerDeployment: the Temporal worker deployment name and the
//! name of each versioned Kubernetes Deployment.

use sha2::{Digest, Sha256};

use crate::BuildId;

/// Longest versioned Deployment name, so generated pod names stay within 63 characters.
pub const MAX_DEPLOYMENT_NAME_LEN: usize = 47;

/// Name of the Worker Deployment in Temporal: `<k8s-namespace>/<twd-name>`.
pub fn temporal_deployment_name(namespace: &str, twd_name: &str) -> String {
    format!("{namespace}/{twd_name}")
}

/// Name of the Kubernetes Deployment of one version: `<twd>-<buildID>`, shortened with a hash
/// when longer than 47 characters, then DNS-cleaned and lowercased.
pub fn versioned_deployment_name(twd_name: &str, build_id: &BuildId) -> String {
    let full = format!("{twd_name}-{build_id}");
    let name = if full.len() > MAX_DEPLOYMENT_NAME_LEN {
        let digest = hex::encode(Sha256::digest(full.as_bytes()));
        format!(
            "{}-{}-{}",
            first_chars(twd_name, 10),
            first_chars(build_id.as_str(), 10),
            &digest[..10]
        )
    } else {
        full
    };
    dns_clean(&name)
}

/// Label-safe form of a TWD name for the `temporal.io/deployment-name` label (at most 63).
pub fn deployment_name_label(twd_name: &str) -> String {
    let cleaned = dns_clean(twd_name);
    cleaned[..cleaned.len().min(63)]
        .trim_end_matches('-')
        .to_owned()
}

fn first_chars(value: &str, n: usize) -> &str {
    match value.char_indices().nth(n) {
        Some((i, _)) => &value[..i],
        None => value,
    }
}

/// Replaces each run of characters outside `[a-zA-Z0-9-]` with `-` and lowercases.
pub fn dns_clean(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut in_run = false;
    for c in raw.chars() {
        if c.is_ascii_alphanumeric() || c == '-' {
            out.push(c.to_ascii_lowercase());
            in_run = false;
        } else if !in_run {
            out.push('-');
            in_run = true;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versioned_deployment_names_match_the_go_controller() {
        let cases = [
            ("worker-name", "abc123", "worker-name-abc123"),
            (
                "worker-name",
                "image-v2.1.0-a1b2c3d4",
                "worker-name-image-v2-1-0-a1b2c3d4",
            ),
            ("worker-name", "master--HEAD", "worker-name-master--head"),
            (
                "worker-name-0123456789-0123456789",
                "image-v2.1.0-0123456789-0123456789",
                "worker-nam-image-v2-1-9c4f60cc97",
            ),
        ];
        for (twd, build, expected) in cases {
            assert_eq!(
                versioned_deployment_name(twd, &BuildId::new(build)),
                expected,
                "{twd} + {build}"
            );
        }
    }

    #[test]
    fn versioned_deployment_names_never_exceed_47_characters() {
        let twd = "w".repeat(63);
        let build = BuildId::new("b".repeat(63));
        let name = versioned_deployment_name(&twd, &build);
        assert!(name.len() <= MAX_DEPLOYMENT_NAME_LEN, "{name}");
        assert_ne!(
            name,
            versioned_deployment_name(&twd, &BuildId::new(format!("{}c", "b".repeat(62))))
        );
    }

    #[test]
    fn temporal_deployment_name_is_namespace_slash_name() {
        assert_eq!(
            temporal_deployment_name("demo", "hello-world"),
            "demo/hello-world"
        );
    }

    #[test]
    fn deployment_name_label_is_label_safe() {
        assert_eq!(deployment_name_label("Hello.World"), "hello-world");
        assert_eq!(deployment_name_label(&"a".repeat(70)).len(), 63);
    }
}
