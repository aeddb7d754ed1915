//! Pod volumes on the local disk: Secret, ConfigMap and emptyDir volumes are written under the
//! pod directory, and container paths under their mount paths are rewritten to point there.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, KeyToPath, PodSpec, Volume};

use super::sources::{SourceKind, Sources};

/// File mode of projected keys when the volume sets none (Kubernetes' default).
const DEFAULT_MODE: i32 = 0o644;

/// Why the pod's volumes cannot be set up (the pod is not started).
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// A mount path, sub path or item path is not usable.
    #[error("volume {volume}: invalid path {path:?}: {reason}")]
    InvalidPath {
        /// The volume name.
        volume: String,
        /// The offending path.
        path: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A volume mount names no volume of the pod.
    #[error("volume mount {volume:?} names no volume of the pod")]
    UnknownVolume {
        /// The volume name.
        volume: String,
    },
    /// The Secret or ConfigMap behind a volume does not exist.
    #[error("MountVolume.SetUp failed for volume {volume:?}: {kind} \"{name}\" not found")]
    MissingObject {
        /// The volume name.
        volume: String,
        /// Secret or ConfigMap.
        kind: SourceKind,
        /// Its name.
        name: String,
    },
    /// A key listed in `items` (or a `subPath`) is not in the Secret or ConfigMap.
    #[error(
        "MountVolume.SetUp failed for volume {volume:?}: key {key} not found in {kind} \"{name}\""
    )]
    MissingKey {
        /// The volume name.
        volume: String,
        /// Secret or ConfigMap.
        kind: SourceKind,
        /// Its name.
        name: String,
        /// The missing key.
        key: String,
    },
    /// Writing a file or folder failed.
    #[error("cannot write {path}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The I/O failure.
        #[source]
        source: std::io::Error,
    },
}

/// What backs a mount.
#[derive(Debug, Clone, PartialEq)]
pub enum MountSource {
    /// Keys of a Secret or ConfigMap, as files.
    Keys {
        /// Secret or ConfigMap.
        kind: SourceKind,
        /// Its name.
        name: String,
        /// Only these keys, at these paths (all keys at their own names if `None`).
        items: Option<Vec<KeyToPath>>,
        /// A missing object or key is not an error.
        optional: bool,
        /// Mode of the files unless an item sets its own.
        default_mode: i32,
    },
    /// An empty folder.
    EmptyDir,
    /// A volume type the runner does not emulate (named for the warning).
    Unsupported(&'static str),
}

/// One volume mount of the container, resolved against the pod's volumes.
#[derive(Debug, Clone, PartialEq)]
pub struct Mount {
    /// The volume name.
    pub volume: String,
    /// The absolute path inside the container, without a trailing `/`.
    pub mount_path: String,
    /// Mount only this file or folder of the volume.
    pub sub_path: Option<String>,
    /// What backs it.
    pub source: MountSource,
}

impl Mount {
    /// Whether the runner writes this mount to disk (and so rewrites paths under it).
    pub fn is_emulated(&self) -> bool {
        !matches!(self.source, MountSource::Unsupported(_))
    }
}

/// Resolves the container's `volumeMounts` against the pod's `volumes`.
pub fn plan(spec: &PodSpec, container: &Container) -> Result<Vec<Mount>, VolumeError> {
    let volumes: BTreeMap<&str, &Volume> = spec
        .volumes
        .iter()
        .flatten()
        .map(|v| (v.name.as_str(), v))
        .collect();
    let mut mounts = Vec::new();
    for vm in container.volume_mounts.iter().flatten() {
        let volume = volumes
            .get(vm.name.as_str())
            .ok_or_else(|| VolumeError::UnknownVolume {
                volume: vm.name.clone(),
            })?;
        let invalid = |path: &str, reason| VolumeError::InvalidPath {
            volume: vm.name.clone(),
            path: path.to_string(),
            reason,
        };
        let mount_path = vm.mount_path.trim_end_matches('/');
        if !vm.mount_path.starts_with('/') || mount_path.is_empty() {
            return Err(invalid(&vm.mount_path, "must be absolute and not /"));
        }
        if has_parent_refs(Path::new(mount_path)) {
            return Err(invalid(&vm.mount_path, "must not contain '..'"));
        }
        let sub_path = vm.sub_path.clone().filter(|s| !s.is_empty());
        if let Some(sub) = &sub_path
            && !is_safe_relative(sub)
        {
            return Err(invalid(sub, "subPath must be relative without '..'"));
        }
        mounts.push(Mount {
            volume: vm.name.clone(),
            mount_path: mount_path.to_string(),
            sub_path,
            source: source_of(volume),
        });
    }
    Ok(mounts)
}

/// The emulated source of a volume.
fn source_of(volume: &Volume) -> MountSource {
    if let Some(s) = &volume.secret {
        return MountSource::Keys {
            kind: SourceKind::Secret,
            name: s.secret_name.clone().unwrap_or_default(),
            items: s.items.clone(),
            optional: s.optional.unwrap_or(false),
            default_mode: s.default_mode.unwrap_or(DEFAULT_MODE),
        };
    }
    if let Some(c) = &volume.config_map {
        return MountSource::Keys {
            kind: SourceKind::ConfigMap,
            name: c.name.clone(),
            items: c.items.clone(),
            optional: c.optional.unwrap_or(false),
            default_mode: c.default_mode.unwrap_or(DEFAULT_MODE),
        };
    }
    if volume.empty_dir.is_some() {
        return MountSource::EmptyDir;
    }
    MountSource::Unsupported(if volume.persistent_volume_claim.is_some() {
        "persistentVolumeClaim"
    } else if volume.projected.is_some() {
        "projected"
    } else if volume.host_path.is_some() {
        "hostPath"
    } else if volume.downward_api.is_some() {
        "downwardAPI"
    } else {
        "other"
    })
}

/// Where a container path under `mount_path` lives on the host: `<pod_dir><mount_path>`.
pub fn host_path(pod_dir: &Path, container_path: &str) -> PathBuf {
    pod_dir.join(container_path.trim_start_matches('/'))
}

/// Writes every emulated mount under `pod_dir`: at a pod's start, and again whenever its Secrets
/// or ConfigMaps may have changed (changed files are replaced, as a kubelet does).
pub fn materialize(pod_dir: &Path, mounts: &[Mount], sources: &Sources) -> Result<(), VolumeError> {
    for mount in mounts {
        let target = host_path(pod_dir, &mount.mount_path);
        match &mount.source {
            MountSource::Unsupported(_) => {}
            MountSource::EmptyDir => create_dir(&target)?,
            MountSource::Keys {
                kind,
                name,
                items,
                optional,
                default_mode,
            } => {
                let files = projected_files(
                    mount,
                    *kind,
                    name,
                    items.as_deref(),
                    *optional,
                    *default_mode,
                    sources,
                )?;
                match &mount.sub_path {
                    Some(sub) => {
                        let Some((_, data, mode)) = files.iter().find(|(rel, _, _)| rel == sub)
                        else {
                            if *optional {
                                continue;
                            }
                            return Err(VolumeError::MissingKey {
                                volume: mount.volume.clone(),
                                kind: *kind,
                                name: name.clone(),
                                key: sub.clone(),
                            });
                        };
                        write_file(&target, data, *mode)?;
                    }
                    None => {
                        create_dir(&target)?;
                        for (rel, data, mode) in &files {
                            write_file(&target.join(rel), data, *mode)?;
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// The files a Secret or ConfigMap volume projects: relative path, content, mode.
fn projected_files(
    mount: &Mount,
    kind: SourceKind,
    name: &str,
    items: Option<&[KeyToPath]>,
    optional: bool,
    default_mode: i32,
    sources: &Sources,
) -> Result<Vec<(String, Vec<u8>, i32)>, VolumeError> {
    let Some(data) = sources.get(kind, name) else {
        return if optional {
            Ok(Vec::new())
        } else {
            Err(VolumeError::MissingObject {
                volume: mount.volume.clone(),
                kind,
                name: name.to_string(),
            })
        };
    };
    let Some(items) = items else {
        return Ok(data
            .iter()
            .map(|(k, v)| (k.clone(), v.clone(), default_mode))
            .collect());
    };
    let mut files = Vec::new();
    for item in items {
        if !is_safe_relative(&item.path) {
            return Err(VolumeError::InvalidPath {
                volume: mount.volume.clone(),
                path: item.path.clone(),
                reason: "item path must be relative without '..'",
            });
        }
        match data.get(&item.key) {
            Some(v) => files.push((
                item.path.clone(),
                v.clone(),
                item.mode.unwrap_or(default_mode),
            )),
            None if optional => {}
            None => {
                return Err(VolumeError::MissingKey {
                    volume: mount.volume.clone(),
                    kind,
                    name: name.to_string(),
                    key: item.key.clone(),
                });
            }
        }
    }
    Ok(files)
}

/// `mkdir -p`.
fn create_dir(path: &Path) -> Result<(), VolumeError> {
    std::fs::create_dir_all(path).map_err(|source| VolumeError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Writes one projected file with its mode, creating its folder. A file that already has this
/// content and mode is left alone; otherwise the new one is written beside it and renamed over
/// it, so a process reading the file (a rotated key) never sees it half-written or missing.
fn write_file(path: &Path, data: &[u8], mode: i32) -> Result<(), VolumeError> {
    let io = |source| VolumeError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(parent) = path.parent() {
        create_dir(parent)?;
    }
    let mode = u32::try_from(mode).unwrap_or(DEFAULT_MODE as u32) & 0o777;
    let unchanged = std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o777 == mode)
        && std::fs::read(path).is_ok_and(|old| old == data);
    if unchanged {
        return Ok(());
    }
    let mut staged = path.as_os_str().to_owned();
    staged.push(".twc-new");
    let staged = PathBuf::from(staged);
    // A previous attempt may have left a read-only staged file; replace it.
    match std::fs::remove_file(&staged) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(e)),
        _ => {}
    }
    std::fs::write(&staged, data).map_err(io)?;
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(mode)).map_err(io)?;
    std::fs::rename(&staged, path).map_err(io)
}

/// The Secrets and ConfigMaps the mounts project (re-read to follow their changes).
pub fn sources_of(mounts: &[Mount]) -> std::collections::BTreeSet<(SourceKind, String)> {
    mounts
        .iter()
        .filter_map(|m| match &m.source {
            MountSource::Keys { kind, name, .. } => Some((*kind, name.clone())),
            _ => None,
        })
        .collect()
}

/// A relative path that stays inside its folder.
fn is_safe_relative(path: &str) -> bool {
    let p = Path::new(path);
    !path.is_empty() && p.is_relative() && !has_parent_refs(p)
}

/// Whether a path has a `..` component.
fn has_parent_refs(path: &Path) -> bool {
    path.components().any(|c| matches!(c, Component::ParentDir))
}

/// Rewrites container paths under any of `mount_paths` to their host location under `pod_dir`.
///
/// A mount path is recognized where a path can start (the start of the value or after one of
/// `= : , ; space tab quote ( [ {`) and where it ends as a whole component (end of the value,
/// `/`, or such a separator), so `--tls-cert=/etc/tls/tls.crt` and `A=/etc/tls:/etc/other`
/// are rewritten but `/etc/tlsx` and `x/etc/tls` are not. The longest mount path wins.
pub fn rewrite_paths(value: &str, pod_dir: &Path, mount_paths: &[&str]) -> String {
    if mount_paths.is_empty() {
        return value.to_string();
    }
    let mut sorted: Vec<&str> = mount_paths.to_vec();
    sorted.sort_by_key(|m| std::cmp::Reverse(m.len()));
    let pod = pod_dir.to_string_lossy();
    let pod = pod.trim_end_matches('/');
    let bytes = value.as_bytes();
    let mut out = String::with_capacity(value.len());
    let mut i = 0;
    while i < value.len() {
        let starts_path = i == 0 || is_separator(bytes[i - 1]);
        if starts_path && bytes[i] == b'/' {
            let found = sorted.iter().find(|m| {
                let end = i + m.len();
                value[i..].starts_with(**m)
                    && (end == bytes.len()
                        || bytes[end] == b'/'
                        || is_separator(bytes[end])
                        || is_closer(bytes[end]))
            });
            if let Some(m) = found {
                out.push_str(pod);
                out.push_str(m);
                i += m.len();
                continue;
            }
        }
        let Some(ch) = value[i..].chars().next() else {
            break;
        };
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

/// Characters after which a path may start.
fn is_separator(b: u8) -> bool {
    matches!(
        b,
        b'=' | b':' | b',' | b';' | b' ' | b'\t' | b'"' | b'\'' | b'(' | b'[' | b'{'
    )
}

/// Characters that may close a path.
fn is_closer(b: u8) -> bool {
    matches!(b, b')' | b']' | b'}')
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{SecretVolumeSource, VolumeMount};

    const POD: &str = "/w/ns/dep/dep-abcde";

    fn rw(value: &str, mounts: &[&str]) -> String {
        rewrite_paths(value, Path::new(POD), mounts)
    }

    #[test]
    fn paths_under_a_mount_are_moved_into_the_pod_dir() {
        let m = ["/etc/temporal/tls"];
        assert_eq!(
            rw("/etc/temporal/tls/tls.crt", &m),
            format!("{POD}/etc/temporal/tls/tls.crt")
        );
        assert_eq!(
            rw("/etc/temporal/tls", &m),
            format!("{POD}/etc/temporal/tls")
        );
        assert_eq!(
            rw("--tls-cert=/etc/temporal/tls/tls.crt", &m),
            format!("--tls-cert={POD}/etc/temporal/tls/tls.crt")
        );
        assert_eq!(
            rw("/etc/temporal/tls/a:/etc/temporal/tls/b", &m),
            format!("{POD}/etc/temporal/tls/a:{POD}/etc/temporal/tls/b")
        );
    }

    #[test]
    fn paths_that_only_share_a_prefix_are_left_alone() {
        let m = ["/etc/temporal/tls"];
        assert_eq!(rw("/etc/temporal/tlsx/a", &m), "/etc/temporal/tlsx/a");
        assert_eq!(rw("x/etc/temporal/tls/a", &m), "x/etc/temporal/tls/a");
        assert_eq!(rw("/etc/temporal", &m), "/etc/temporal");
        assert_eq!(rw("plain value", &m), "plain value");
    }

    #[test]
    fn the_longest_mount_path_wins() {
        let m = ["/etc", "/etc/tls"];
        assert_eq!(rw("/etc/tls/ca.pem", &m), format!("{POD}/etc/tls/ca.pem"));
        assert_eq!(rw("/etc/other", &m), format!("{POD}/etc/other"));
    }

    #[test]
    fn non_ascii_values_survive_rewriting() {
        assert_eq!(
            rw("héllo /etc/x ✓", &["/etc/x"]),
            format!("héllo {POD}/etc/x ✓")
        );
    }

    fn spec_with_secret_mount(
        sub_path: Option<&str>,
        items: Option<Vec<KeyToPath>>,
    ) -> (PodSpec, Container) {
        let container = Container {
            name: "w".into(),
            volume_mounts: Some(vec![VolumeMount {
                name: "tls".into(),
                mount_path: "/etc/temporal/tls/".into(),
                sub_path: sub_path.map(str::to_string),
                ..Default::default()
            }]),
            ..Default::default()
        };
        let spec = PodSpec {
            containers: vec![container.clone()],
            volumes: Some(vec![Volume {
                name: "tls".into(),
                secret: Some(SecretVolumeSource {
                    secret_name: Some("client-tls".into()),
                    items,
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ..Default::default()
        };
        (spec, container)
    }

    fn tls_sources() -> Sources {
        let mut s = Sources::default();
        s.insert(
            SourceKind::Secret,
            "client-tls",
            Some(BTreeMap::from([
                ("tls.crt".to_string(), b"CERT".to_vec()),
                ("tls.key".to_string(), b"KEY".to_vec()),
            ])),
        );
        s
    }

    fn temp_pod_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("twc-volumes-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn secret_volume_keys_become_files_under_the_pod_dir() {
        let (spec, container) = spec_with_secret_mount(None, None);
        let mounts = plan(&spec, &container).unwrap();
        assert_eq!(mounts[0].mount_path, "/etc/temporal/tls");
        let dir = temp_pod_dir("all");
        materialize(&dir, &mounts, &tls_sources()).unwrap();
        let crt = dir.join("etc/temporal/tls/tls.crt");
        assert_eq!(std::fs::read(&crt).unwrap(), b"CERT");
        assert_eq!(
            std::fs::read(dir.join("etc/temporal/tls/tls.key")).unwrap(),
            b"KEY"
        );
        assert_eq!(
            std::fs::metadata(&crt).unwrap().permissions().mode() & 0o777,
            0o644
        );
        // A second start overwrites the files instead of failing.
        materialize(&dir, &mounts, &tls_sources()).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_changed_secret_replaces_only_the_changed_files() {
        let (spec, container) = spec_with_secret_mount(None, None);
        let mounts = plan(&spec, &container).unwrap();
        assert_eq!(
            sources_of(&mounts).into_iter().collect::<Vec<_>>(),
            vec![(SourceKind::Secret, "client-tls".to_owned())]
        );
        let dir = temp_pod_dir("rotate");
        materialize(&dir, &mounts, &tls_sources()).unwrap();
        let crt = dir.join("etc/temporal/tls/tls.crt");
        let key = dir.join("etc/temporal/tls/tls.key");
        let key_inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&key).unwrap());
        let mut rotated = Sources::default();
        rotated.insert(
            SourceKind::Secret,
            "client-tls",
            Some(BTreeMap::from([
                ("tls.crt".to_string(), b"NEW CERT".to_vec()),
                ("tls.key".to_string(), b"KEY".to_vec()),
            ])),
        );
        materialize(&dir, &mounts, &rotated).unwrap();
        assert_eq!(std::fs::read(&crt).unwrap(), b"NEW CERT");
        let after = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&key).unwrap());
        assert_eq!(key_inode, after, "an unchanged file is not rewritten");
        assert!(!dir.join("etc/temporal/tls/tls.crt.twc-new").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn sub_path_mounts_a_single_key_as_a_file() {
        let (spec, container) = spec_with_secret_mount(Some("tls.crt"), None);
        let mounts = plan(&spec, &container).unwrap();
        let dir = temp_pod_dir("sub");
        materialize(&dir, &mounts, &tls_sources()).unwrap();
        assert_eq!(
            std::fs::read(dir.join("etc/temporal/tls")).unwrap(),
            b"CERT"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn items_select_and_rename_keys() {
        let items = vec![KeyToPath {
            key: "tls.crt".into(),
            path: "certs/client.pem".into(),
            mode: Some(0o600),
        }];
        let (spec, container) = spec_with_secret_mount(None, Some(items));
        let mounts = plan(&spec, &container).unwrap();
        let dir = temp_pod_dir("items");
        materialize(&dir, &mounts, &tls_sources()).unwrap();
        let pem = dir.join("etc/temporal/tls/certs/client.pem");
        assert_eq!(std::fs::read(&pem).unwrap(), b"CERT");
        assert_eq!(
            std::fs::metadata(&pem).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert!(!dir.join("etc/temporal/tls/tls.key").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn missing_secret_for_a_volume_is_an_error() {
        let (spec, container) = spec_with_secret_mount(None, None);
        let mounts = plan(&spec, &container).unwrap();
        let dir = temp_pod_dir("missing");
        let err = materialize(&dir, &mounts, &Sources::default()).unwrap_err();
        assert!(matches!(err, VolumeError::MissingObject { .. }), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn mount_paths_escaping_the_pod_dir_are_rejected() {
        let (spec, mut container) = spec_with_secret_mount(None, None);
        if let Some(m) = container.volume_mounts.as_mut().and_then(|v| v.first_mut()) {
            m.mount_path = "/etc/../../x".into();
        }
        assert!(matches!(
            plan(&spec, &container),
            Err(VolumeError::InvalidPath { .. })
        ));
    }
}
