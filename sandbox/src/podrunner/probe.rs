//! Readiness probes (`exec`, `httpGet`, `tcpSocket`) run against a local pod.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::Command;

use super::env::POD_IP;
use super::spawner::{Spawner, die_with_runner};

/// What a probe does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeAction {
    /// Runs a command in the pod's environment; exit code 0 is success.
    Exec {
        /// Resolved program.
        program: PathBuf,
        /// Its arguments.
        args: Vec<String>,
    },
    /// `GET http://host:port/path`; a 2xx or 3xx status is success.
    HttpGet {
        /// Host (the pod IP by default).
        host: String,
        /// Port.
        port: u16,
        /// Path and query.
        path: String,
        /// Extra request headers.
        headers: Vec<(String, String)>,
    },
    /// A TCP connection that opens is success (also used for `httpGet` with HTTPS).
    Tcp {
        /// Host (the pod IP by default).
        host: String,
        /// Port.
        port: u16,
    },
}

/// A readiness probe with its timing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadinessProbe {
    /// What to check.
    pub action: ProbeAction,
    /// Wait before the first check.
    pub initial_delay: Duration,
    /// Time between checks.
    pub period: Duration,
    /// Time a check may take.
    pub timeout: Duration,
    /// Successes in a row that make the pod ready.
    pub success_threshold: u32,
    /// Failures in a row that make a ready pod unready.
    pub failure_threshold: u32,
}

/// Reads the container's readiness probe; `Err` names a probe the runner cannot run.
///
/// `resolve` finds the program of an `exec` probe and `rewrite` moves mounted paths in its
/// arguments, like for the container itself.
pub fn readiness_probe(
    container: &Container,
    resolve: impl Fn(&str) -> Option<PathBuf>,
    rewrite: impl Fn(&str) -> String,
) -> Result<Option<ReadinessProbe>, String> {
    let Some(probe) = &container.readiness_probe else {
        return Ok(None);
    };
    let action = action(probe, container, resolve, rewrite)?;
    let secs = |v: Option<i32>, default: u64| {
        Duration::from_secs(v.and_then(|n| u64::try_from(n).ok()).unwrap_or(default))
    };
    let count = |v: Option<i32>, default: u32| {
        v.and_then(|n| u32::try_from(n).ok())
            .filter(|n| *n > 0)
            .unwrap_or(default)
    };
    Ok(Some(ReadinessProbe {
        action,
        initial_delay: secs(probe.initial_delay_seconds, 0),
        period: secs(probe.period_seconds, 10).max(Duration::from_secs(1)),
        timeout: secs(probe.timeout_seconds, 1).max(Duration::from_secs(1)),
        success_threshold: count(probe.success_threshold, 1),
        failure_threshold: count(probe.failure_threshold, 3),
    }))
}

/// The action of a probe.
fn action(
    probe: &Probe,
    container: &Container,
    resolve: impl Fn(&str) -> Option<PathBuf>,
    rewrite: impl Fn(&str) -> String,
) -> Result<ProbeAction, String> {
    if let Some(exec) = &probe.exec {
        let command = exec.command.as_deref().unwrap_or_default();
        let (first, rest) = command
            .split_first()
            .ok_or("exec probe without a command")?;
        let first = rewrite(first);
        let program =
            resolve(&first).ok_or_else(|| format!("exec probe program {first:?} not found"))?;
        return Ok(ProbeAction::Exec {
            program,
            args: rest.iter().map(|a| rewrite(a)).collect(),
        });
    }
    if let Some(http) = &probe.http_get {
        let port = port(&http.port, container)?;
        let host = http
            .host
            .clone()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| POD_IP.into());
        if http
            .scheme
            .as_deref()
            .is_some_and(|s| s.eq_ignore_ascii_case("HTTPS"))
        {
            return Ok(ProbeAction::Tcp { host, port });
        }
        let path = http
            .path
            .clone()
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| "/".into());
        let headers = http
            .http_headers
            .iter()
            .flatten()
            .map(|h| (h.name.clone(), h.value.clone()))
            .collect();
        return Ok(ProbeAction::HttpGet {
            host,
            port,
            path: if path.starts_with('/') {
                path
            } else {
                format!("/{path}")
            },
            headers,
        });
    }
    if let Some(tcp) = &probe.tcp_socket {
        let host = tcp
            .host
            .clone()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| POD_IP.into());
        return Ok(ProbeAction::Tcp {
            host,
            port: port(&tcp.port, container)?,
        });
    }
    Err("unsupported readiness probe (grpc or empty)".into())
}

/// A probe port: a number, or the name of a container port.
fn port(port: &IntOrString, container: &Container) -> Result<u16, String> {
    let number = match port {
        IntOrString::Int(n) => *n,
        IntOrString::String(name) => match name.parse::<i32>() {
            Ok(n) => n,
            Err(_) => container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name))
                .map(|p| p.container_port)
                .ok_or_else(|| format!("probe port {name:?} is not a named container port"))?,
        },
    };
    u16::try_from(number).map_err(|_| format!("probe port {number} is out of range"))
}

/// Where an `exec` probe runs: the pod's environment and folder.
#[derive(Debug, Clone)]
pub struct ExecContext {
    /// Environment of the pod process.
    pub env: BTreeMap<String, String>,
    /// Working folder of the pod process.
    pub cwd: PathBuf,
}

/// Runs one check; `true` on success. Any failure, including a timeout, is `false`.
pub async fn check(
    action: &ProbeAction,
    timeout: Duration,
    spawner: &Spawner,
    ctx: &ExecContext,
) -> bool {
    tokio::time::timeout(timeout, check_once(action, spawner, ctx))
        .await
        .unwrap_or(false)
}

/// One check without a time limit (the caller bounds it; dropping it kills an exec probe).
async fn check_once(action: &ProbeAction, spawner: &Spawner, ctx: &ExecContext) -> bool {
    match action {
        ProbeAction::Exec { program, args } => {
            let mut command = Command::new(program);
            command
                .args(args)
                .env_clear()
                .envs(&ctx.env)
                .current_dir(&ctx.cwd)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null());
            die_with_runner(&mut command);
            match spawner.spawn(command).await {
                Ok(mut child) => child.wait().await.is_ok_and(|s| s.success()),
                Err(_) => false,
            }
        }
        ProbeAction::Tcp { host, port } => TcpStream::connect((host.as_str(), *port)).await.is_ok(),
        ProbeAction::HttpGet {
            host,
            port,
            path,
            headers,
        } => http_get(host, *port, path, headers)
            .await
            .is_some_and(|code| (200..400).contains(&code)),
    }
}

/// A minimal HTTP/1.1 GET; returns the response status code.
async fn http_get(host: &str, port: u16, path: &str, headers: &[(String, String)]) -> Option<u16> {
    let mut stream = TcpStream::connect((host, port)).await.ok()?;
    let mut request = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: kube-probe/twc-sandbox\r\nAccept: */*\r\nConnection: close\r\n"
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut head = Vec::with_capacity(64);
    let mut buf = [0u8; 256];
    while !head.contains(&b'\n') && head.len() < 4096 {
        let n = stream.read(&mut buf).await.ok()?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    parse_status_line(&head)
}

/// The status code of `HTTP/1.x NNN reason`.
fn parse_status_line(head: &[u8]) -> Option<u16> {
    let line = head.split(|b| *b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let mut parts = line.split_whitespace();
    parts.next().filter(|v| v.starts_with("HTTP/"))?;
    parts.next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ContainerPort, HTTPGetAction};

    #[test]
    fn http_probe_on_a_named_port_uses_the_container_port() {
        let container = Container {
            name: "w".into(),
            ports: Some(vec![ContainerPort {
                name: Some("metrics".into()),
                container_port: 9090,
                ..Default::default()
            }]),
            readiness_probe: Some(Probe {
                http_get: Some(HTTPGetAction {
                    port: IntOrString::String("metrics".into()),
                    path: Some("healthz".into()),
                    ..Default::default()
                }),
                period_seconds: Some(2),
                ..Default::default()
            }),
            ..Default::default()
        };
        let probe = readiness_probe(&container, |_| None, str::to_string)
            .unwrap()
            .unwrap();
        assert_eq!(
            probe.action,
            ProbeAction::HttpGet {
                host: "127.0.0.1".into(),
                port: 9090,
                path: "/healthz".into(),
                headers: vec![]
            }
        );
        assert_eq!(
            (probe.period, probe.failure_threshold),
            (Duration::from_secs(2), 3)
        );
    }

    #[test]
    fn status_line_is_parsed() {
        assert_eq!(parse_status_line(b"HTTP/1.1 204 No Content\r\n"), Some(204));
        assert_eq!(parse_status_line(b"garbage"), None);
    }
}
