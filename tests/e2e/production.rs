//! Rollouts against the production-like Temporal (`twc_sandbox::production`): the real server
//! built from its Go module, on PostgreSQL, serving TLS with client-certificate verification and
//! JWT authorization. The controller's engine runs there too, over mutual TLS with a certificate
//! of its own. Each test has a private sandbox (the shared one runs on the dev server).
//!
//! What is proven here: mutual-TLS and API-key rollouts complete (Deployment, pollers, gate,
//! Current) with worker credentials separate from the controller's; the workers' credential is
//! refused a routing change; an expired certificate, a certificate of an unknown CA and an API
//! key signed by an unknown key show `AuthSecretInvalid` with the cause; an API key rotated in
//! its Secret is used by the controller and by running workers without a restart of either.

use std::time::Duration;

use serde_json::{Value, json};
use twc_sandbox::production::pki::CertPair;
use twc_sandbox::production::{PreviousKey, ProductionTemporal};

use crate::chaos::cluster::{Cluster, Private};
use crate::harness::cli::{CliOutput, run};
use crate::harness::twd::{target_build, worker};

/// A rollout (Deployment, pollers, gate, promotion) finishes well within this.
const ROLLOUT: Duration = Duration::from_secs(240);
/// A refused credential shows on the TWD within this.
const REFUSAL: Duration = Duration::from_secs(120);
/// How long API keys minted here are valid.
const KEY_TTL: Duration = Duration::from_secs(3600);
/// The Temporal namespace the workers use on the production-like server.
const TEMPORAL_NS: &str = "default";

/// A private sandbox whose engine runs on the production-like Temporal.
async fn production_sandbox(name: &str) -> Private {
    let mut private = Private::start(name).await;
    if let Err(e) = private.sandbox.start_production_temporal(true).await {
        panic!("starting the production-like Temporal: {e:#}");
    }
    private
}

fn server(private: &Private) -> &ProductionTemporal {
    match private.sandbox.production_temporal() {
        Some(server) => server,
        None => panic!("the production-like Temporal is not running"),
    }
}

fn cert(server: &ProductionTemporal, cn: &str, permissions: &[&str]) -> CertPair {
    match server.client_cert(cn, permissions) {
        Ok(pair) => pair,
        Err(e) => panic!("client certificate {cn}: {e}"),
    }
}

fn tls_secret(namespace: &str, name: &str, pair: &CertPair) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": { "name": name, "namespace": namespace },
        "stringData": { "tls.crt": pair.cert_pem, "tls.key": pair.key_pem }
    })
}

fn key_secret(namespace: &str, name: &str, key: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": name, "namespace": namespace },
        "stringData": { "api-key": key }
    })
}

/// The sandbox CA as a Secret (`tls.caSecretRef`).
fn ca_secret(namespace: &str, server: &ProductionTemporal) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": "server-ca", "namespace": namespace },
        "stringData": { "ca.crt": server.ca_pem }
    })
}

/// A TemporalConnection `name` to the production-like server: its address, `server_name`, the
/// CA from `server-ca`, and `credentials` (the controller's and the workers' references).
fn connection(
    namespace: &str,
    name: &str,
    server: &ProductionTemporal,
    server_name: &str,
    credentials: Value,
) -> Value {
    let mut spec = json!({
        "hostPort": server.address,
        "tls": { "serverName": server_name, "caSecretRef": { "name": "server-ca", "key": "ca.crt" } }
    });
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), credentials.as_object()) {
        spec.extend(extra.clone());
    }
    json!({
        "apiVersion": "temporal.io/v1alpha1", "kind": "Connection",
        "metadata": { "name": name, "namespace": namespace },
        "spec": spec
    })
}

/// A TWD `name` of the sample worker `tag` through connection `connection`, promoted at once
/// after the `GatePass` gate.
fn twd(namespace: &str, name: &str, connection: &str, tag: &str) -> Value {
    let rollout = json!({ "strategy": "AllAtOnce", "gate": { "workflowType": "GatePass" } });
    let mut manifest = worker(namespace, name, tag, rollout);
    manifest["spec"]["workerOptions"] =
        json!({ "connectionRef": { "name": connection }, "temporalNamespace": TEMPORAL_NS });
    manifest
}

/// The `temporal` CLI against the production-like server with a client certificate, or with an
/// API key alone (under the TLS name that asks for no certificate).
async fn temporal_as(
    cluster: &Cluster,
    server: &ProductionTemporal,
    credential: Credential<'_>,
    args: &[&str],
) -> CliOutput {
    let mut command = tokio::process::Command::new(&cluster.env.temporal_cli);
    command
        .args(args)
        .args(["--address", &server.address])
        .args(["--namespace", TEMPORAL_NS])
        .args(["--tls-ca-path", &server.ca_path.display().to_string()]);
    match credential {
        Credential::Cert(pair) => {
            command
                .args(["--tls-server-name", &server.server_name])
                .args(["--tls-cert-path", &pair.cert_path.display().to_string()])
                .args(["--tls-key-path", &pair.key_path.display().to_string()]);
        }
        Credential::ApiKey(key) => {
            command
                .args(["--tls-server-name", &server.api_server_name])
                .args(["--api-key", key]);
        }
    }
    run(command, None).await
}

#[derive(Clone, Copy)]
enum Credential<'a> {
    Cert(&'a CertPair),
    ApiKey(&'a str),
}

/// Current build of a worker deployment on the production-like server, as an admin sees it.
async fn current_build(
    cluster: &Cluster,
    server: &ProductionTemporal,
    deployment: &str,
) -> Result<Option<String>, String> {
    let out = temporal_as(
        cluster,
        server,
        Credential::Cert(&server.admin_cert),
        &[
            "worker",
            "deployment",
            "describe",
            "--name",
            deployment,
            "--output",
            "json",
        ],
    )
    .await;
    if !out.success {
        return Err(out.stderr);
    }
    let v: Value = serde_json::from_str(&out.stdout).map_err(|e| format!("{e}: {}", out.stdout))?;
    Ok(v["routingConfig"]["currentVersionBuildID"]
        .as_str()
        .filter(|s| !s.is_empty())
        .map(str::to_owned))
}

/// Waits for the TWD's rollout of `tag` to complete and checks Temporal agrees; returns the build.
async fn rolled_out(
    cluster: &Cluster,
    server: &ProductionTemporal,
    ns: &str,
    name: &str,
    tag: &str,
) -> String {
    let twd = cluster.wait_ready(ns, name, tag, ROLLOUT).await;
    let build = target_build(&twd).unwrap_or_default();
    let deployment = format!("{ns}/{name}");
    let seen = current_build(cluster, server, &deployment).await;
    assert_eq!(
        seen,
        Ok(Some(build.clone())),
        "Temporal's Current of {deployment} is the TWD's target"
    );
    build
}

#[tokio::test]
async fn mutual_tls_rollouts_on_a_tls_server_keep_the_workers_certificate_out_of_routing() {
    let private = production_sandbox("prod-mtls").await;
    let cluster = &private.cluster;
    let server = server(&private);
    let ns = cluster.namespace("prod-mtls").await;

    let controller = cert(server, "twc-controller", &["default:write"]);
    let workers = cert(server, "orders-worker", &["default:worker"]);
    cluster.apply(&ca_secret(&ns, server)).await;
    cluster
        .apply(&tls_secret(&ns, "controller-cert", &controller))
        .await;
    cluster
        .apply(&tls_secret(&ns, "worker-cert", &workers))
        .await;
    cluster
        .apply(&connection(
            &ns,
            "prod",
            server,
            &server.server_name,
            json!({
                "mutualTLSSecretRef": { "name": "controller-cert" },
                "workerCredentials": { "mutualTLSSecretRef": { "name": "worker-cert" } }
            }),
        ))
        .await;
    cluster.apply(&twd(&ns, "hello", "prod", "v1")).await;
    // Pollers came from the workers' certificate, the gate ran on them, the controller's made
    // the build Current.
    let build = rolled_out(cluster, server, &ns, "hello", "v1").await;

    // The workers' certificate may poll but not route.
    let refused = temporal_as(
        cluster,
        server,
        Credential::Cert(&workers),
        &[
            "worker",
            "deployment",
            "set-current-version",
            "--deployment-name",
            &format!("{ns}/hello"),
            "--build-id",
            "__unversioned__",
            "--yes",
        ],
    )
    .await;
    assert!(!refused.success, "the workers' certificate changed routing");
    assert!(
        refused.stderr.contains("PermissionDenied") || refused.stderr.contains("unauthorized"),
        "refused for its permissions: {}",
        refused.stderr
    );
    assert_eq!(
        current_build(cluster, server, &format!("{ns}/hello")).await,
        Ok(Some(build))
    );

    // An expired certificate is named with its date, before anything connects.
    let expired = match server.expired_client_cert("expired", &["default:write"]) {
        Ok(pair) => pair,
        Err(e) => panic!("expired certificate: {e}"),
    };
    cluster
        .apply(&tls_secret(&ns, "expired-cert", &expired))
        .await;
    cluster
        .apply(&connection(
            &ns,
            "expired",
            server,
            &server.server_name,
            json!({ "mutualTLSSecretRef": { "name": "expired-cert" } }),
        ))
        .await;
    cluster.apply(&twd(&ns, "stale", "expired", "v1")).await;
    let (_, message) = cluster
        .wait_reason(&ns, "stale", "Ready", "AuthSecretInvalid", REFUSAL)
        .await;
    assert!(message.contains("expired at 2001-01-01"), "{message}");

    // A certificate of a CA the server does not trust: the server's refusal, as a credential
    // problem (not a transient connection failure).
    let foreign = match server.foreign_client_cert("stranger", &["default:write"]) {
        Ok(pair) => pair,
        Err(e) => panic!("foreign certificate: {e}"),
    };
    cluster
        .apply(&tls_secret(&ns, "foreign-cert", &foreign))
        .await;
    cluster
        .apply(&connection(
            &ns,
            "foreign",
            server,
            &server.server_name,
            json!({ "mutualTLSSecretRef": { "name": "foreign-cert" } }),
        ))
        .await;
    cluster.apply(&twd(&ns, "stranger", "foreign", "v1")).await;
    let (_, message) = cluster
        .wait_reason(&ns, "stranger", "Ready", "AuthSecretInvalid", REFUSAL)
        .await;
    assert!(
        message.contains("Temporal refused the client certificate"),
        "{message}"
    );
    private.sandbox.stop().await;
}

/// Lines containing `needle` in the pod runner's logs of the pods of the TWD's Deployments
/// (`<pods>/<ns>/<deployment>/<pod>.log`, current and past pods).
fn pod_log_lines(cluster: &Cluster, ns: &str, needle: &str) -> Vec<String> {
    let Ok(deployments) = std::fs::read_dir(cluster.env.pods_dir.join(ns)) else {
        return Vec::new();
    };
    deployments
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter_map(|dir| std::fs::read_dir(dir).ok())
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .flat_map(|text| {
            text.lines()
                .filter(|l| l.contains(needle))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// How many times the pod runner started a pod of the TWD (its `==> … pod … starting` lines).
fn pod_starts(cluster: &Cluster, ns: &str) -> usize {
    pod_log_lines(cluster, ns, "==> ")
        .iter()
        .filter(|l| l.contains(" starting "))
        .count()
}

#[tokio::test]
async fn api_key_rollouts_follow_a_rotated_key_without_restarts() {
    let private = production_sandbox("prod-apikey").await;
    let cluster = &private.cluster;
    let server = server(&private);
    let ns = cluster.namespace("prod-apikey").await;
    let mint = |permissions: &[&str]| match server.api_key(permissions, KEY_TTL) {
        Ok(key) => key,
        Err(e) => panic!("minting an API key: {e}"),
    };

    cluster.apply(&ca_secret(&ns, server)).await;
    cluster
        .apply(&key_secret(
            &ns,
            "controller-key",
            &mint(&["default:write"]),
        ))
        .await;
    cluster
        .apply(&key_secret(&ns, "worker-key", &mint(&["default:worker"])))
        .await;
    cluster
        .apply(&connection(
            &ns,
            "cloud",
            server,
            &server.api_server_name,
            json!({
                "apiKeySecretRef": { "name": "controller-key", "key": "api-key" },
                "workerCredentials": { "apiKeySecretRef": { "name": "worker-key", "key": "api-key" } }
            }),
        ))
        .await;
    cluster.apply(&twd(&ns, "hello", "cloud", "v1")).await;
    rolled_out(cluster, server, &ns, "hello", "v1").await;
    let starts_before = pod_starts(cluster, &ns);
    assert!(starts_before >= 1, "the v1 pod's log has its start");

    // A key signed by a key the server never published is refused by the server.
    let unknown = match server.unknown_signer_api_key(&["default:write"], KEY_TTL) {
        Ok(key) => key,
        Err(e) => panic!("minting an unknown-signer key: {e}"),
    };
    cluster
        .apply(&key_secret(&ns, "unknown-key", &unknown))
        .await;
    cluster
        .apply(&connection(
            &ns,
            "unknown",
            server,
            &server.api_server_name,
            json!({ "apiKeySecretRef": { "name": "unknown-key", "key": "api-key" } }),
        ))
        .await;
    cluster.apply(&twd(&ns, "refused", "unknown", "v1")).await;
    let (_, message) = cluster
        .wait_reason(&ns, "refused", "Ready", "AuthSecretInvalid", REFUSAL)
        .await;
    assert!(
        message.contains("Temporal refused the API key"),
        "{message}"
    );

    // Rotation: the signing key is retired; once the server has refreshed its key set, the
    // keys in the Secrets are refused, until the Secrets carry keys of the new signing key.
    let old_worker_key = mint(&["default:worker"]);
    let describe = [
        "operator",
        "namespace",
        "describe",
        "--namespace",
        TEMPORAL_NS,
    ];
    let accepted = temporal_as(
        cluster,
        server,
        Credential::ApiKey(&old_worker_key),
        &describe,
    )
    .await;
    assert!(
        accepted.success,
        "a worker key may read: {}",
        accepted.stderr
    );
    if let Err(e) = server.rotate_signing_key(PreviousKey::Retire) {
        panic!("rotating the signing key: {e}");
    }
    cluster
        .wait(
            "keys of the retired signing key refused",
            REFUSAL,
            || async {
                let out = temporal_as(
                    cluster,
                    server,
                    Credential::ApiKey(&old_worker_key),
                    &describe,
                )
                .await;
                if out.success {
                    Err("still accepted".to_owned())
                } else {
                    Ok(())
                }
            },
        )
        .await;
    cluster
        .apply(&key_secret(
            &ns,
            "controller-key",
            &mint(&["default:write"]),
        ))
        .await;
    cluster
        .apply(&key_secret(&ns, "worker-key", &mint(&["default:worker"])))
        .await;

    // The running v1 worker re-reads its key file and runs new work: a workflow routed to the
    // Current version completes, and its pod was never restarted.
    let workflow_id = format!("{ns}-after-rotation");
    let started = temporal_as(
        cluster,
        server,
        Credential::Cert(&server.admin_cert),
        &[
            "workflow",
            "start",
            "--type",
            "HelloWorld",
            "--task-queue",
            "hello-world",
            "--workflow-id",
            &workflow_id,
            "--input",
            "\"rotation\"",
        ],
    )
    .await;
    assert!(
        started.success,
        "temporal workflow start: {}",
        started.stderr
    );
    cluster
        .wait(
            "the workflow after the rotation completed",
            ROLLOUT,
            || async {
                let out = temporal_as(
                    cluster,
                    server,
                    Credential::Cert(&server.admin_cert),
                    &[
                        "workflow",
                        "describe",
                        "--workflow-id",
                        &workflow_id,
                        "--output",
                        "json",
                    ],
                )
                .await;
                let v: Value = serde_json::from_str(&out.stdout)
                    .map_err(|e| format!("{e}: {}", out.stderr))?;
                match v["workflowExecutionInfo"]["status"].as_str() {
                    Some("WORKFLOW_EXECUTION_STATUS_COMPLETED") => Ok(()),
                    other => Err(format!("status {other:?}")),
                }
            },
        )
        .await;
    assert!(
        !pod_log_lines(cluster, &ns, "API key file changed").is_empty(),
        "the worker logged that it took the new key"
    );
    assert_eq!(
        pod_starts(cluster, &ns),
        starts_before,
        "no pod was restarted"
    );

    // The controller builds a client with the rotated key: the next rollout completes.
    cluster.apply(&twd(&ns, "hello", "cloud", "v2")).await;
    rolled_out(cluster, server, &ns, "hello", "v2").await;
    private.sandbox.stop().await;
}
