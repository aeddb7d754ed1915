//! The image table: which local binary plays which container image, and where binaries are found.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Failure to read or parse the image table.
#[derive(Debug, thiserror::Error)]
pub enum ImagesError {
    /// The file could not be read.
    #[error("cannot read image table {path}")]
    Read {
        /// The image table file.
        path: PathBuf,
        /// The I/O failure.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a valid image table.
    #[error("invalid image table {path}")]
    Parse {
        /// The image table file.
        path: PathBuf,
        /// The YAML failure.
        #[source]
        source: Box<serde_saphyr::Error>,
    },
    /// A key or a binary name in the table is unusable.
    #[error("invalid image table {path}: {reason}")]
    Invalid {
        /// The image table file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// The file format of `images.yaml`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ImagesFile {
    images: BTreeMap<String, String>,
}

/// Image repository → binary name, as loaded from `images.yaml`.
#[derive(Debug, Clone, Default)]
pub struct ImageTable {
    entries: BTreeMap<String, String>,
    source: PathBuf,
}

impl ImageTable {
    /// Reads and validates the table at `path`.
    pub fn load(path: &Path) -> Result<Self, ImagesError> {
        let text = std::fs::read_to_string(path).map_err(|source| ImagesError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parses a table from YAML text; `source` only names it in messages.
    pub fn parse(text: &str, source: &Path) -> Result<Self, ImagesError> {
        let file: ImagesFile = serde_saphyr::from_str(text).map_err(|e| ImagesError::Parse {
            path: source.to_path_buf(),
            source: Box::new(e),
        })?;
        let mut entries = BTreeMap::new();
        for (image, binary) in file.images {
            let invalid = |reason: String| ImagesError::Invalid {
                path: source.to_path_buf(),
                reason,
            };
            let repo = repository(&image);
            if repo != image {
                return Err(invalid(format!(
                    "key {image:?} must be an image repository without tag or digest ({repo:?})"
                )));
            }
            if binary.is_empty() || binary.contains('/') {
                return Err(invalid(format!(
                    "binary {binary:?} for {image:?} must be a plain file name"
                )));
            }
            entries.insert(image, binary);
        }
        Ok(Self {
            entries,
            source: source.to_path_buf(),
        })
    }

    /// The binary name mapped to `image` (tag and digest ignored), if any.
    pub fn binary_for(&self, image: &str) -> Option<&str> {
        self.entries.get(repository(image)).map(String::as_str)
    }

    /// The file the table was loaded from.
    pub fn source(&self) -> &Path {
        &self.source
    }
}

/// The repository part of an image reference: without `@digest` and without `:tag`.
///
/// A colon before the last `/` belongs to a registry port (`localhost:5000/app`) and is kept.
pub fn repository(image: &str) -> &str {
    let without_digest = image.split_once('@').map_or(image, |(repo, _)| repo);
    match without_digest.rfind(':') {
        Some(colon) if !without_digest[colon..].contains('/') => &without_digest[..colon],
        _ => without_digest,
    }
}

/// Finds an executable file called `name` in `dirs`, in order; the result is absolute.
pub fn find_in_dirs(name: &str, dirs: &[PathBuf]) -> Option<PathBuf> {
    dirs.iter()
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
        .map(|found| std::path::absolute(&found).unwrap_or(found))
}

/// Finds an executable in the runner's own `PATH`.
pub fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    let dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    find_in_dirs(name, &dirs)
}

/// True for a regular file with an execute bit.
fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(yaml: &str) -> ImageTable {
        match ImageTable::parse(yaml, Path::new("images.yaml")) {
            Ok(table) => table,
            Err(e) => panic!("table should parse: {e}"),
        }
    }

    #[test]
    fn tag_and_digest_are_ignored_when_looking_up_an_image() {
        let t = table("images:\n  twc.local/sample-worker: sample-worker\n");
        assert_eq!(
            t.binary_for("twc.local/sample-worker:v1"),
            Some("sample-worker")
        );
        assert_eq!(
            t.binary_for("twc.local/sample-worker:v2"),
            Some("sample-worker")
        );
        assert_eq!(
            t.binary_for("twc.local/sample-worker@sha256:abcd"),
            Some("sample-worker")
        );
        assert_eq!(
            t.binary_for("twc.local/sample-worker"),
            Some("sample-worker")
        );
    }

    #[test]
    fn unmapped_image_has_no_binary() {
        let t = table("images:\n  twc.local/sample-worker: sample-worker\n");
        assert_eq!(t.binary_for("twc.local/other:v1"), None);
        assert_eq!(t.binary_for("sample-worker:v1"), None);
    }

    #[test]
    fn registry_port_is_part_of_the_repository() {
        assert_eq!(repository("localhost:5000/app:v3"), "localhost:5000/app");
        assert_eq!(repository("localhost:5000/app"), "localhost:5000/app");
        assert_eq!(repository("app@sha256:00"), "app");
        assert_eq!(repository("reg:1/app:v1@sha256:00"), "reg:1/app");
    }

    #[test]
    fn table_keys_with_a_tag_are_rejected() {
        let err = ImageTable::parse("images:\n  app:v1: app\n", Path::new("x.yaml"));
        assert!(matches!(err, Err(ImagesError::Invalid { .. })));
    }

    #[test]
    fn binary_names_with_a_slash_are_rejected() {
        let err = ImageTable::parse("images:\n  app: ../app\n", Path::new("x.yaml"));
        assert!(matches!(err, Err(ImagesError::Invalid { .. })));
    }

    #[test]
    fn checked_in_example_table_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/images.yaml");
        let t = match ImageTable::load(&path) {
            Ok(t) => t,
            Err(e) => panic!("examples/images.yaml should load: {e}"),
        };
        assert_eq!(
            t.binary_for("twc.local/sample-worker:abc"),
            Some("sample-worker")
        );
    }

    #[test]
    fn binaries_are_found_in_the_first_dir_that_has_them() {
        let base = std::env::temp_dir().join(format!("twc-images-test-{}", std::process::id()));
        let (first, second) = (base.join("a"), base.join("b"));
        for dir in [&first, &second] {
            std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("mkdir: {e}"));
        }
        let write_exec = |path: &Path| {
            std::fs::write(path, "#!/bin/sh\n").unwrap_or_else(|e| panic!("write: {e}"));
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
                .unwrap_or_else(|e| panic!("chmod: {e}"));
        };
        write_exec(&second.join("tool"));
        std::fs::write(first.join("notexec"), "x").unwrap_or_else(|e| panic!("write: {e}"));
        let dirs = vec![first.clone(), second.clone()];
        assert_eq!(find_in_dirs("tool", &dirs), Some(second.join("tool")));
        assert_eq!(find_in_dirs("notexec", &dirs), None);
        write_exec(&first.join("tool"));
        assert_eq!(find_in_dirs("tool", &dirs), Some(first.join("tool")));
        let _ = std::fs::remove_dir_all(&base);
    }
}
