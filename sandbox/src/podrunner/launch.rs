//! Turning a pod template into a command line: program, arguments, environment, volumes, log.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, PodTemplateSpec};
use tokio::process::Command;

use super::env::{self, PodFields};
use super::images::{self, ImageTable};
use super::probe::{self, ReadinessProbe};
use super::sources;
use super::spawner::die_with_runner;
use super::volumes;

/// Where a container writes its termination message unless it says otherwise.
pub const DEFAULT_TERMINATION_MESSAGE_PATH: &str = "/dev/termination-log";

/// Why a pod cannot start now (shown like a container's `waiting` state); retried with back-off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    /// Kubernetes-like reason, e.g. `ImageNotMapped`, `CreateContainerConfigError`.
    pub reason: &'static str,
    /// Human-readable message, e.g. naming the image or the missing secret.
    pub message: String,
}

impl Waiting {
    /// A waiting state with `reason` and `message`.
    pub fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }
}

/// Where and as whom a pod runs.
#[derive(Debug, Clone)]
pub struct PodPlace {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// The pod's private folder (volumes, working folder).
    pub dir: PathBuf,
    /// The file stdout and stderr are appended to.
    pub log: PathBuf,
}

/// Runner-wide settings a launch needs.
pub struct LaunchSettings<'a> {
    /// API client, to read Secrets and ConfigMaps.
    pub client: &'a kube::Client,
    /// The image table.
    pub images: &'a ImageTable,
    /// Folders binaries are looked up in.
    pub bin_dirs: &'a [PathBuf],
    /// The metrics SD folder, given to the process as [`super::METRICS_SD_DIR_VAR`].
    pub metrics_sd_dir: Option<&'a Path>,
}

/// Everything needed to start the pod's process.
#[derive(Debug)]
pub struct Launch {
    /// The resolved program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Its complete environment.
    pub env: BTreeMap<String, String>,
    /// Its working folder.
    pub cwd: PathBuf,
    /// The readiness probe, if the container has one the runner can run.
    pub probe: Option<ReadinessProbe>,
    /// Why the container's probe is ignored, if it is.
    pub probe_problem: Option<String>,
    /// The log file, opened for appending.
    pub log: std::fs::File,
    /// The pod's folder.
    pub dir: PathBuf,
    /// The container's volume mounts (re-materialized when their Secrets change).
    pub mounts: Vec<volumes::Mount>,
    /// Where the process's `terminationMessagePath` (default `/dev/termination-log`) is on this
    /// host: the runner reads a Job pod's termination message from it.
    pub termination_message: PathBuf,
}

impl Launch {
    /// The command to spawn: cleared environment, stdio to the log, dies with the runner.
    pub fn command(&self) -> std::io::Result<Command> {
        let mut command = Command::new(&self.program);
        command
            .args(&self.args)
            .env_clear()
            .envs(&self.env)
            .current_dir(&self.cwd)
            .stdin(std::process::Stdio::null())
            .stdout(self.log.try_clone()?)
            .stderr(self.log.try_clone()?);
        die_with_runner(&mut command);
        Ok(command)
    }
}

/// The container the runner plays: the first one (others are ignored).
pub fn main_container(template: &PodTemplateSpec) -> Option<&Container> {
    template.spec.as_ref()?.containers.first()
}

/// Prepares a start of the pod: resolves program, environment and volumes and opens the log.
pub async fn prepare(
    settings: &LaunchSettings<'_>,
    template: &PodTemplateSpec,
    place: &PodPlace,
) -> Result<Launch, Waiting> {
    let spec = template
        .spec
        .as_ref()
        .ok_or_else(|| Waiting::new("InvalidPodSpec", "pod template has no spec"))?;
    let container = spec
        .containers
        .first()
        .ok_or_else(|| Waiting::new("InvalidPodSpec", "pod template has no containers"))?;
    let command = container.command.as_deref().unwrap_or_default();
    let image_binary = if command.is_empty() {
        Some(image_binary(container, settings.images, settings.bin_dirs)?)
    } else {
        None
    };

    let refs = sources::referenced(spec, container);
    let sources = sources::fetch(settings.client, &place.namespace, &refs)
        .await
        .map_err(|e| {
            Waiting::new(
                "CreateContainerConfigError",
                format!("cannot read secrets/configmaps: {e}"),
            )
        })?;
    let metadata = template.metadata.clone().unwrap_or_default();
    let fields = PodFields {
        name: place.name.clone(),
        namespace: place.namespace.clone(),
        labels: metadata.labels.unwrap_or_default(),
        annotations: metadata.annotations.unwrap_or_default(),
        service_account: spec
            .service_account_name
            .clone()
            .unwrap_or_else(|| "default".into()),
    };
    let container_env = env::resolve(container, &fields, &sources)
        .map_err(|e| Waiting::new("CreateContainerConfigError", e.to_string()))?;
    let mounts = volumes::plan(spec, container)
        .map_err(|e| Waiting::new("CreateContainerConfigError", e.to_string()))?;
    let termination_path = container
        .termination_message_path
        .clone()
        .filter(|p| p.starts_with('/'))
        .unwrap_or_else(|| DEFAULT_TERMINATION_MESSAGE_PATH.to_owned());
    // The termination message file is rewritten like a mount: `/dev/termination-log` in an
    // env value or an argument names the pod folder's copy.
    let mount_paths: Vec<&str> = mounts
        .iter()
        .filter(|m| m.is_emulated())
        .map(|m| m.mount_path.as_str())
        .chain([termination_path.as_str()])
        .collect();
    let rewrite = |value: &str| volumes::rewrite_paths(value, &place.dir, &mount_paths);
    let expand = |value: &str| {
        rewrite(&env::expand(value, |name| {
            container_env.get(name).map(String::as_str)
        }))
    };

    let (program, mut args) = match image_binary {
        Some(program) => (program, Vec::new()),
        None => {
            let expanded: Vec<String> = command.iter().map(|c| expand(c)).collect();
            let (first, rest) = expanded
                .split_first()
                .ok_or_else(|| Waiting::new("InvalidPodSpec", "empty command"))?;
            (command_program(first, settings.bin_dirs)?, rest.to_vec())
        }
    };
    args.extend(container.args.iter().flatten().map(|a| expand(a)));

    let mut process_env = runner_env(place, settings.metrics_sd_dir);
    process_env.extend(container_env.iter().map(|(k, v)| (k.clone(), rewrite(v))));

    let cwd = match container
        .working_dir
        .as_deref()
        .filter(|w| w.starts_with('/'))
    {
        Some(dir) => volumes::host_path(&place.dir, dir),
        None => place.dir.clone(),
    };
    let (probe, probe_problem) = match probe::readiness_probe(
        container,
        |name| resolve_command(name, settings.bin_dirs),
        |a| rewrite(a),
    ) {
        Ok(probe) => (probe, None),
        Err(problem) => (None, Some(problem)),
    };

    let header = format!(
        "==> {} pod {} starting {} {}\n",
        k8s_openapi::jiff::Timestamp::now(),
        place.name,
        program.display(),
        args.join(" ")
    );
    let (dir, cwd_for_disk, log_path) = (place.dir.clone(), cwd.clone(), place.log.clone());
    let kept_mounts = mounts.clone();
    let termination_message = volumes::host_path(&place.dir, &termination_path);
    let termination_dir = termination_message.parent().map(Path::to_path_buf);
    let log = tokio::task::spawn_blocking(move || {
        let log = write_to_disk(&dir, &cwd_for_disk, &mounts, &sources, &log_path, &header)?;
        if let Some(parent) = termination_dir {
            std::fs::create_dir_all(&parent).map_err(|e| {
                Waiting::new(
                    "CreateContainerError",
                    format!("cannot create {}: {e}", parent.display()),
                )
            })?;
        }
        Ok(log)
    })
    .await
    .map_err(|e| {
        Waiting::new(
            "CreateContainerError",
            format!("volume setup task failed: {e}"),
        )
    })??;

    Ok(Launch {
        program,
        args,
        env: process_env,
        cwd,
        probe,
        probe_problem,
        log,
        dir: place.dir.clone(),
        mounts: kept_mounts,
        termination_message,
    })
}

/// What the runner gives every process before the container's own environment (which wins):
/// its `PATH` and `HOME`, `HOSTNAME` = the pod name, and the metrics SD folder if there is one.
fn runner_env(place: &PodPlace, metrics_sd_dir: Option<&Path>) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = ["PATH", "HOME"]
        .into_iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
        .collect();
    env.insert("HOSTNAME".to_owned(), place.name.clone());
    if let Some(dir) = metrics_sd_dir {
        env.insert(
            super::METRICS_SD_DIR_VAR.to_owned(),
            dir.display().to_string(),
        );
    }
    env
}

/// Creates the pod folder, writes its volumes and opens its log with a start marker.
fn write_to_disk(
    dir: &Path,
    cwd: &Path,
    mounts: &[volumes::Mount],
    sources: &sources::Sources,
    log_path: &Path,
    header: &str,
) -> Result<std::fs::File, Waiting> {
    use std::io::Write;
    let io_err = |what: &str, path: &Path, e: std::io::Error| {
        Waiting::new(
            "CreateContainerError",
            format!("cannot {what} {}: {e}", path.display()),
        )
    };
    std::fs::create_dir_all(dir).map_err(|e| io_err("create", dir, e))?;
    volumes::materialize(dir, mounts, sources).map_err(|e| {
        let detail = match std::error::Error::source(&e) {
            Some(source) => format!("{e}: {source}"),
            None => e.to_string(),
        };
        Waiting::new("CreateContainerConfigError", detail)
    })?;
    std::fs::create_dir_all(cwd).map_err(|e| io_err("create", cwd, e))?;
    if let Some(parent) = log_path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| io_err("create", parent, e))?;
    }
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_path)
        .map_err(|e| io_err("open", log_path, e))?;
    log.write_all(header.as_bytes())
        .map_err(|e| io_err("write", log_path, e))?;
    Ok(log)
}

/// The binary playing the container's image.
fn image_binary(
    container: &Container,
    images: &ImageTable,
    bin_dirs: &[PathBuf],
) -> Result<PathBuf, Waiting> {
    let image = container
        .image
        .as_deref()
        .filter(|i| !i.is_empty())
        .ok_or_else(|| Waiting::new("InvalidImageName", "container has no image"))?;
    let binary = images.binary_for(image).ok_or_else(|| {
        Waiting::new(
            "ImageNotMapped",
            format!(
                "image {image:?} is not mapped to a binary in {}",
                images.source().display()
            ),
        )
    })?;
    images::find_in_dirs(binary, bin_dirs).ok_or_else(|| {
        Waiting::new(
            "BinaryNotFound",
            format!(
                "binary {binary:?} for image {image:?} not found in {}",
                dirs_text(bin_dirs)
            ),
        )
    })
}

/// The program of a container `command`: a path, or a name found in the bin dirs or `PATH`.
fn command_program(first: &str, bin_dirs: &[PathBuf]) -> Result<PathBuf, Waiting> {
    resolve_command(first, bin_dirs).ok_or_else(|| {
        Waiting::new(
            "BinaryNotFound",
            format!(
                "command {first:?} not found in {} or PATH",
                dirs_text(bin_dirs)
            ),
        )
    })
}

/// Resolves a command name: paths as they are, plain names in the bin dirs, then in `PATH`.
fn resolve_command(name: &str, bin_dirs: &[PathBuf]) -> Option<PathBuf> {
    if name.contains('/') {
        return Some(PathBuf::from(name));
    }
    images::find_in_dirs(name, bin_dirs).or_else(|| images::find_in_path(name))
}

/// The bin dirs as a readable list.
fn dirs_text(dirs: &[PathBuf]) -> String {
    let list: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    format!("[{}]", list.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place() -> PodPlace {
        PodPlace {
            namespace: "demo".into(),
            name: "hello-v1-x7k2p".into(),
            dir: PathBuf::from("/pods/demo/hello-v1/hello-v1-x7k2p"),
            log: PathBuf::from("/pods/demo/hello-v1/hello-v1-x7k2p.log"),
        }
    }

    #[test]
    fn every_process_gets_its_pod_name_as_hostname() {
        let env = runner_env(&place(), None);
        assert_eq!(
            env.get("HOSTNAME").map(String::as_str),
            Some("hello-v1-x7k2p")
        );
        assert!(
            !env.contains_key(super::super::METRICS_SD_DIR_VAR),
            "{env:?}"
        );
    }

    #[test]
    fn the_metrics_sd_folder_reaches_every_process_when_the_runner_has_one() {
        let env = runner_env(&place(), Some(Path::new("/state/prometheus/targets")));
        assert_eq!(
            env.get(super::super::METRICS_SD_DIR_VAR)
                .map(String::as_str),
            Some("/state/prometheus/targets")
        );
    }
}
