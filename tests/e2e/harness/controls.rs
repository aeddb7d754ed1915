//! Operator controls from the tests, through each of the three paths a person has: the `twc`
//! binary (also as the `kubectl twc` plugin), the `temporal.io/rollout-action` annotation, and
//! `temporal workflow signal`; plus the TWD's events and conditions that must hold for a while.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams};
use tokio::process::Command;
use twc_sandbox::env::SandboxEnv;

use super::cli::{kubectl, temporal};
use super::env;
use super::wait::{server_logs, wait_for};

/// The way a control is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// `kubectl twc <action> NAME -n NS` (the binary as a kubectl plugin).
    Cli,
    /// `kubectl annotate twd NAME temporal.io/rollout-action=<action>`.
    Annotation,
    /// `temporal workflow signal --workflow-id twd/NS/NAME --name <action>` (no input).
    Temporal,
}

/// Exit status and output of a command.
#[derive(Debug)]
pub struct Exit {
    /// Exit code (None when killed by a signal).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

async fn output(mut command: Command) -> Exit {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    match command.output().await {
        Ok(out) => Exit {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        },
        Err(e) => panic!("running {command:?}: {e}"),
    }
}

/// The environment the operator commands read: kubeconfig and engine address.
fn operator_env(command: &mut Command) {
    let env = env();
    command
        .env("KUBECONFIG", &env.kubeconfig)
        .env("TWC_ENGINE_ADDRESS", &env.temporal_address)
        .env("TWC_ENGINE_NAMESPACE", &env.temporal_namespace)
        .env_remove("RUST_LOG");
}

/// The environment of a person in `make dev`: the sandbox's kubeconfig and env file (the two
/// `export`s its banner prints) and nothing else, so the operator commands must find the
/// engine Temporal on their own.
fn kubeconfig_only(command: &mut Command, sandbox: &SandboxEnv) {
    let env_file = sandbox
        .logs_dir
        .parent()
        .map(|state| state.join("env.json"))
        .unwrap_or_default();
    command
        .env("KUBECONFIG", &sandbox.kubeconfig)
        .env("TWC_ENV_FILE", env_file);
    for var in [
        "TWC_ENGINE_ADDRESS",
        "TWC_ENGINE_NAMESPACE",
        "TWC_UI_URL",
        "RUST_LOG",
    ] {
        command.env_remove(var);
    }
}

/// Runs the `twc` binary.
pub async fn twc(args: &[&str]) -> Exit {
    let mut command = Command::new(env().bin_dir.join("twc"));
    command.args(args);
    operator_env(&mut command);
    output(command).await
}

/// A folder holding `kubectl-twc`, a link to the `twc` binary, as a kubectl plugin install.
fn plugin_dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = env().logs_dir.with_file_name("kubectl-plugins");
        let link = dir.join("kubectl-twc");
        if let Err(e) = std::fs::create_dir_all(&dir) {
            panic!("creating {}: {e}", dir.display());
        }
        if std::fs::symlink_metadata(&link).is_err()
            && let Err(e) = std::os::unix::fs::symlink(env().bin_dir.join("twc"), &link)
        {
            panic!("linking {}: {e}", link.display());
        }
        dir
    })
}

/// Runs `kubectl twc ...`: kubectl finds the plugin on PATH.
pub async fn kubectl_twc(args: &[&str]) -> Exit {
    let path = std::env::var("PATH").unwrap_or_default();
    let mut command = Command::new(&env().kubectl);
    command
        .arg("twc")
        .args(args)
        .env("PATH", format!("{}:{path}", plugin_dir().display()));
    operator_env(&mut command);
    output(command).await
}

/// Runs `kubectl twc ...` against `sandbox` with its kubeconfig as the only setting (as after
/// `export KUBECONFIG=...` in `make dev`).
pub async fn kubectl_twc_in(sandbox: &SandboxEnv, args: &[&str]) -> Exit {
    let path = std::env::var("PATH").unwrap_or_default();
    let mut command = Command::new(&sandbox.kubectl);
    command
        .arg("twc")
        .args(args)
        .env("PATH", format!("{}:{path}", plugin_dir().display()));
    kubeconfig_only(&mut command, sandbox);
    output(command).await
}

/// Sends `action` to the TWD `name` the way `via` says; asserts that the sending succeeded
/// (for the CLI: that the control applied).
pub async fn send(via: Via, action: &str, namespace: &str, name: &str) {
    match via {
        Via::Cli => {
            let out = kubectl_twc(&[action, name, "-n", namespace]).await;
            assert_eq!(
                out.code,
                Some(0),
                "kubectl twc {action}: {out:?}\n{}",
                server_logs(40)
            );
        }
        Via::Annotation => {
            let value = format!("temporal.io/rollout-action={action}");
            // The kind of the object of that name (either name of the resource).
            let kind = match crate::harness::twd::read_worker(
                &crate::harness::kube_client().await,
                namespace,
                name,
            )
            .await
            {
                Ok(object) => object.kind.plural(),
                Err(e) => panic!("{e}"),
            };
            let out = kubectl(
                &[
                    "annotate",
                    "--overwrite",
                    kind,
                    name,
                    "-n",
                    namespace,
                    &value,
                ],
                None,
            )
            .await;
            assert!(out.success, "kubectl annotate: {}", out.stderr);
        }
        Via::Temporal => {
            let out = update_control(namespace, name, action).await;
            assert!(
                out.success,
                "temporal workflow update control {action}: {}{}",
                out.stdout, out.stderr
            );
        }
    }
}

/// `temporal workflow update execute --name control` of the TWD's workflow with `action` as
/// its input (the JSON string `"pause"`, ...): the one entry point of controls, as a user of
/// the Temporal CLI sends it.
pub async fn update_control(
    namespace: &str,
    name: &str,
    action: &str,
) -> crate::harness::cli::CliOutput {
    let workflow_id = format!("twd/{namespace}/{name}");
    let input = format!("\"{action}\"");
    temporal(&[
        "workflow",
        "update",
        "execute",
        "--namespace",
        &env().temporal_namespace,
        "--workflow-id",
        &workflow_id,
        "--name",
        "control",
        "--input",
        &input,
    ])
    .await
}

/// Waits until the watcher has removed the rollout-action annotation.
pub async fn wait_annotation_removed(client: &kube::Client, namespace: &str, name: &str) {
    wait_for(
        &format!("the rollout-action annotation of {namespace}/{name} is removed"),
        Duration::from_secs(60),
        || async {
            let twd = super::twd::get_twd(client, namespace, name).await?;
            match twd
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("temporal.io/rollout-action"))
            {
                Some(value) => Err(format!("still annotated with {value:?}")),
                None => Ok(()),
            }
        },
    )
    .await;
}

/// One event of a TWD: (type, reason, message).
pub type EventRow = (String, String, String);

/// The TWD's events (on either kind of its name).
pub async fn events(client: &kube::Client, namespace: &str, name: &str) -> Vec<EventRow> {
    let api: Api<Event> = Api::namespaced(client.clone(), namespace);
    let selector = format!("involvedObject.name={name}");
    api.list(&ListParams::default().fields(&selector))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| {
            e.involved_object
                .kind
                .as_deref()
                .and_then(twc_crds::WorkerKind::from_kind)
                .is_some()
        })
        .map(|e| {
            (
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.message.unwrap_or_default(),
            )
        })
        .collect()
}

/// Waits for an event with `reason` whose message contains `text`; returns it.
pub async fn wait_event(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    reason: &str,
    text: &str,
    timeout: Duration,
) -> EventRow {
    wait_for(
        &format!("event {reason} containing {text:?} on {namespace}/{name}"),
        timeout,
        || async {
            let all = events(client, namespace, name).await;
            all.iter()
                .find(|(_, r, m)| r == reason && m.contains(text))
                .cloned()
                .ok_or_else(|| format!("events: {all:?}"))
        },
    )
    .await
}

/// Asserts that `probe` keeps returning Ok for `duration` (checked every 200 ms); the opposite
/// of [`wait_for`], for "the ramp stays put while paused".
pub async fn holds_for<F, Fut>(what: &str, duration: Duration, mut probe: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let end = tokio::time::Instant::now() + duration;
    let mut ticks = tokio::time::interval(Duration::from_millis(200));
    while tokio::time::Instant::now() < end {
        ticks.tick().await;
        if let Err(observed) = probe().await {
            panic!(
                "{what} did not hold for {duration:?}: {observed}\n{}",
                server_logs(60)
            );
        }
    }
}
