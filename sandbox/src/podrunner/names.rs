//! Pod names: `<deployment>-<5 random characters>`, like pods made by a ReplicaSet.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

/// Characters Kubernetes uses for generated name suffixes (no vowels, no look-alikes).
const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
/// Length of the random suffix.
const SUFFIX_LEN: usize = 5;
/// Longest base kept, so that names stay within 63 characters.
const MAX_BASE_LEN: usize = 57;

/// A fresh pod name for `deployment` that `taken` does not reject.
pub fn pod_name(deployment: &str, taken: impl Fn(&str) -> bool) -> String {
    let base: String = deployment.chars().take(MAX_BASE_LEN).collect();
    let base = base.trim_end_matches('-');
    loop {
        let name = format!("{base}-{}", suffix(random()));
        if !taken(&name) {
            return name;
        }
    }
}

/// Five characters of [`ALPHABET`] drawn from `seed`.
fn suffix(mut seed: u64) -> String {
    let radix = ALPHABET.len() as u64;
    (0..SUFFIX_LEN)
        .map(|_| {
            let c = ALPHABET[(seed % radix) as usize];
            seed /= radix;
            char::from(c)
        })
        .collect()
}

/// A random number from the standard library's randomly keyed hasher and a counter.
fn random() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_names_extend_the_deployment_name() {
        let name = pod_name("worker-v1", |_| false);
        let suffix = name.strip_prefix("worker-v1-").unwrap();
        assert_eq!(suffix.len(), SUFFIX_LEN);
        assert!(suffix.bytes().all(|b| ALPHABET.contains(&b)));
    }

    #[test]
    fn taken_names_are_not_reused() {
        let first = pod_name("w", |_| false);
        let second = pod_name("w", |n| n == first);
        assert_ne!(first, second);
    }

    #[test]
    fn long_deployment_names_are_shortened() {
        let name = pod_name(&"a".repeat(80), |_| false);
        assert_eq!(name.len(), MAX_BASE_LEN + 1 + SUFFIX_LEN);
    }
}
