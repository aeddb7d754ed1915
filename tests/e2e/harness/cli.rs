//! The real `kubectl` and `temporal` CLIs against the sandbox.

use std::process::Stdio;

use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use super::env;

/// Output of a CLI call.
#[derive(Debug)]
pub struct CliOutput {
    /// Exit success.
    pub success: bool,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

/// Runs a command to completion, `stdin` piped in; panics only when it cannot be started.
pub async fn run(mut command: Command, stdin: Option<&str>) -> CliOutput {
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => panic!("starting {command:?}: {e}"),
    };
    if let (Some(mut pipe), Some(text)) = (child.stdin.take(), stdin)
        && let Err(e) = pipe.write_all(text.as_bytes()).await
    {
        panic!("writing stdin of {command:?}: {e}");
    }
    match child.wait_with_output().await {
        Ok(out) => CliOutput {
            success: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        },
        Err(e) => panic!("waiting for {command:?}: {e}"),
    }
}

/// Runs kubectl with the sandbox kubeconfig, `stdin` piped in.
pub async fn kubectl(args: &[&str], stdin: Option<&str>) -> CliOutput {
    let env = env();
    let mut command = Command::new(&env.kubectl);
    command.arg("--kubeconfig").arg(&env.kubeconfig).args(args);
    run(command, stdin).await
}

/// Runs the temporal CLI against the sandbox's dev server.
pub async fn temporal(args: &[&str]) -> CliOutput {
    let env = env();
    let mut command = Command::new(&env.temporal_cli);
    command
        .args(args)
        .args(["--address", &env.temporal_address]);
    run(command, None).await
}

/// `temporal workflow describe --output json` of the latest run of `workflow_id` in the engine
/// namespace of the shared sandbox.
pub async fn describe_workflow(workflow_id: &str) -> Result<serde_json::Value, String> {
    json_output(
        temporal(&[
            "workflow",
            "describe",
            "--workflow-id",
            workflow_id,
            "--output",
            "json",
        ])
        .await,
    )
}

/// The JSON a successful CLI call printed, or its error output.
pub fn json_output(out: CliOutput) -> Result<serde_json::Value, String> {
    if !out.success {
        return Err(out.stderr);
    }
    serde_json::from_str(&out.stdout).map_err(|e| format!("{e}: {}", out.stdout))
}
