//! The Secrets and ConfigMaps a pod refers to: which ones, and reading them from the API server.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{ConfigMap, Container, PodSpec, Secret};
use kube::Api;

/// The kind of object a pod reads keys from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SourceKind {
    /// A `v1/Secret`.
    Secret,
    /// A `v1/ConfigMap`.
    ConfigMap,
}

impl std::fmt::Display for SourceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SourceKind::Secret => "secret",
            SourceKind::ConfigMap => "configmap",
        })
    }
}

/// Keys and values of one object; values are raw bytes (Secrets may hold binary data).
pub type SourceData = BTreeMap<String, Vec<u8>>;

/// The objects a pod refers to, as read from the API server; `None` means "does not exist".
#[derive(Debug, Clone, Default)]
pub struct Sources {
    objects: BTreeMap<(SourceKind, String), Option<SourceData>>,
}

impl Sources {
    /// Records the content (or absence) of one object.
    pub fn insert(&mut self, kind: SourceKind, name: &str, data: Option<SourceData>) {
        self.objects.insert((kind, name.to_string()), data);
    }

    /// The content of an object, or `None` if it does not exist (or was never read).
    pub fn get(&self, kind: SourceKind, name: &str) -> Option<&SourceData> {
        self.objects
            .get(&(kind, name.to_string()))
            .and_then(Option::as_ref)
    }
}

/// Every object named by the container's `env`, `envFrom` and by the pod volumes it mounts.
pub fn referenced(spec: &PodSpec, container: &Container) -> BTreeSet<(SourceKind, String)> {
    let mut refs = BTreeSet::new();
    for var in container.env.iter().flatten() {
        let Some(from) = &var.value_from else {
            continue;
        };
        if let Some(sel) = &from.secret_key_ref {
            refs.insert((SourceKind::Secret, sel.name.clone()));
        }
        if let Some(sel) = &from.config_map_key_ref {
            refs.insert((SourceKind::ConfigMap, sel.name.clone()));
        }
    }
    for from in container.env_from.iter().flatten() {
        if let Some(src) = &from.secret_ref {
            refs.insert((SourceKind::Secret, src.name.clone()));
        }
        if let Some(src) = &from.config_map_ref {
            refs.insert((SourceKind::ConfigMap, src.name.clone()));
        }
    }
    let mounted: BTreeSet<&str> = container
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.name.as_str())
        .collect();
    for volume in spec.volumes.iter().flatten() {
        if !mounted.contains(volume.name.as_str()) {
            continue;
        }
        if let Some(name) = volume.secret.as_ref().and_then(|s| s.secret_name.clone()) {
            refs.insert((SourceKind::Secret, name));
        }
        if let Some(cm) = &volume.config_map {
            refs.insert((SourceKind::ConfigMap, cm.name.clone()));
        }
    }
    refs
}

/// Reads every referenced object in `namespace`; a missing object is recorded as absent.
pub async fn fetch(
    client: &kube::Client,
    namespace: &str,
    refs: &BTreeSet<(SourceKind, String)>,
) -> Result<Sources, kube::Error> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let mut sources = Sources::default();
    for (kind, name) in refs {
        let data = match kind {
            SourceKind::Secret => secrets.get_opt(name).await?.map(secret_data),
            SourceKind::ConfigMap => config_maps.get_opt(name).await?.map(config_map_data),
        };
        sources.insert(*kind, name, data);
    }
    Ok(sources)
}

/// The keys of a Secret (`stringData` is write-only, but honored if a server echoes it).
fn secret_data(secret: Secret) -> SourceData {
    let mut data: SourceData = secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    for (k, v) in secret.string_data.unwrap_or_default() {
        data.insert(k, v.into_bytes());
    }
    data
}

/// The keys of a ConfigMap: `data` and `binaryData` together.
fn config_map_data(cm: ConfigMap) -> SourceData {
    let mut data: SourceData = cm
        .binary_data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    for (k, v) in cm.data.unwrap_or_default() {
        data.insert(k, v.into_bytes());
    }
    data
}
