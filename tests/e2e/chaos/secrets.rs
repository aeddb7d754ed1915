//! Secrets stay secret: an API key read from a Secret for a TemporalConnection, and gate input
//! read from a Secret, appear in no workflow history, memo or search attribute of the engine,
//! in no Kubernetes object or event, and in no controller or server log. The only place a
//! secret may be is where the user sent it: the gate workflow's own input (and its echo).

use std::time::Duration;

use serde_json::json;

use super::cluster::{Cluster, Private, WorkflowRow};
use crate::harness::twd::{target_build, worker};

const ROLLOUT: Duration = Duration::from_secs(240);
/// Temporal namespace of the workers (and their gate workflows), apart from the engine's.
const WORKERS: &str = "workers";

/// A value nobody else would write: the test's secret.
fn secret_value(kind: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{kind}-{:x}-{:x}", nanos, std::process::id())
}

/// Where each secret was found: (what was scanned, which secret).
type Leaks = Vec<(String, &'static str)>;

fn scan(what: &str, text: &str, secrets: &[(&'static str, &str)], leaks: &mut Leaks) {
    for (name, value) in secrets {
        if text.contains(value) {
            leaks.push((what.to_owned(), name));
        }
    }
}

/// History (`workflow show`) and description (memo, search attributes) of every run.
async fn workflow_texts(cluster: &Cluster, temporal_ns: &str) -> Vec<(WorkflowRow, String)> {
    let rows = cluster
        .workflows_in(temporal_ns, "")
        .await
        .unwrap_or_else(|e| panic!("listing workflows in {temporal_ns}: {e}"));
    let mut texts = Vec::new();
    for row in rows {
        let history = cluster
            .history(temporal_ns, &row.id, &row.run_id)
            .await
            .unwrap_or_else(|e| panic!("history of {}: {e}", row.id));
        let described = cluster
            .describe_workflow(temporal_ns, &row.id, &row.run_id)
            .await
            .unwrap_or_else(|e| panic!("describing {}: {e}", row.id));
        texts.push((row, format!("{history}\n{described}")));
    }
    texts
}

#[tokio::test]
async fn secrets_never_reach_histories_memos_objects_events_or_logs() {
    let started = std::time::Instant::now();
    let Private {
        mut sandbox,
        cluster,
    } = Private::start("secrets").await;
    // Debug logs of the controller's own crates: the most it ever says.
    let debug = "info,twc=debug,twc_activities=debug,twc_worker=debug,twc_workflows=debug";
    if let Err(e) = sandbox
        .restart_controller_with_env(&[("RUST_LOG", debug)])
        .await
    {
        panic!("restarting the controller with debug logs: {e:#}");
    }
    let created = cluster
        .temporal(&["operator", "namespace", "create", "--namespace", WORKERS])
        .await;
    assert!(
        created.success,
        "creating namespace {WORKERS}: {}",
        created.stderr
    );
    cluster
        .wait(
            "the workers namespace serves requests",
            Duration::from_secs(60),
            || async { cluster.workflows_in(WORKERS, "").await.map(|_| ()) },
        )
        .await;

    let api_key = secret_value("apikey");
    let gate_token = secret_value("gatetoken");
    let ns = cluster.namespace("secrets").await;
    cluster
        .apply(&json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": "cloud-api-key", "namespace": ns },
            "stringData": { "key": api_key }
        }))
        .await;
    cluster
        .apply(&json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": "gate-input", "namespace": ns },
            "stringData": { "input.json": json!({ "checks": ["smoke"], "token": gate_token }).to_string() }
        }))
        .await;
    cluster.apply(&cluster.connection(&ns, "dev")).await;
    let mut cloud = cluster.connection(&ns, "cloud");
    cloud["spec"]["apiKeySecretRef"] = json!({ "name": "cloud-api-key", "key": "key" });
    cluster.apply(&cloud).await;

    // The API key is read and used: with it the connection gets as far as the TLS handshake
    // the dev server cannot do (a missing or unread key would be AuthSecretInvalid).
    let mut keyed = worker(&ns, "keyed", "v1", json!({ "strategy": "AllAtOnce" }));
    keyed["spec"]["workerOptions"]["connectionRef"]["name"] = json!("cloud");
    keyed["spec"]["workerOptions"]["temporalNamespace"] = json!(WORKERS);
    cluster.apply(&keyed).await;
    let (status, message) = cluster
        .wait_reason(
            &ns,
            "keyed",
            "Progressing",
            "TemporalClientCreationFailed",
            ROLLOUT,
        )
        .await;
    assert_eq!(status, "False", "{message}");

    // Gate input from a Secret, through two rollouts.
    let rollout = json!({ "strategy": "AllAtOnce", "gate": { "workflowType": "RolloutGate",
        "inputFrom": { "secretKeyRef": { "name": "gate-input", "key": "input.json" } } } });
    for tag in ["v1", "v2"] {
        let mut gated = worker(&ns, "gated", tag, rollout.clone());
        gated["spec"]["workerOptions"]["temporalNamespace"] = json!(WORKERS);
        cluster.apply(&gated).await;
        let twd = cluster.wait_ready(&ns, "gated", tag, ROLLOUT).await;
        assert!(target_build(&twd).is_some());
    }

    let secrets = [
        ("API key", api_key.as_str()),
        ("gate input", gate_token.as_str()),
    ];
    let mut leaks = Leaks::new();
    let mut seen_in_gates = 0;

    let engine = workflow_texts(&cluster, &cluster.env.temporal_namespace).await;
    assert!(
        engine.iter().any(|(r, _)| r.id.starts_with("rollout/")),
        "engine workflows listed: {:?}",
        engine.iter().map(|(r, _)| &r.id).collect::<Vec<_>>()
    );
    for (row, text) in &engine {
        scan(
            &format!("engine workflow {} ({})", row.id, row.run_id),
            text,
            &secrets,
            &mut leaks,
        );
    }
    let workers = workflow_texts(&cluster, WORKERS).await;
    for (row, text) in &workers {
        if row.id.starts_with(&format!("gate/{ns}/gated/")) && text.contains(&gate_token) {
            // Its input, as the user asked: the one place the gate secret belongs.
            seen_in_gates += 1;
            scan(
                &format!("gate workflow {}", row.id),
                text,
                &secrets[..1],
                &mut leaks,
            );
        } else {
            scan(
                &format!("worker workflow {}", row.id),
                text,
                &secrets,
                &mut leaks,
            );
        }
    }
    assert!(
        seen_in_gates >= 2,
        "the scan finds the gate input where it belongs (in each gate's history), else it proves nothing: {:?}",
        workers.iter().map(|(r, _)| &r.id).collect::<Vec<_>>()
    );

    for name in ["keyed", "gated"] {
        let described = cluster
            .temporal(&[
                "worker",
                "deployment",
                "describe",
                "--namespace",
                WORKERS,
                "--name",
                &format!("{ns}/{name}"),
                "--output",
                "json",
            ])
            .await;
        scan(
            &format!("worker deployment {ns}/{name}"),
            &described.stdout,
            &secrets,
            &mut leaks,
        );
    }
    let objects = cluster
        .kubectl(
            &[
                "get",
                "events,wd,connections,twd,tconn,deploy,configmaps",
                "-n",
                &ns,
                "-o",
                "json",
            ],
            None,
        )
        .await;
    assert!(objects.success, "{}", objects.stderr);
    scan(
        "Kubernetes objects and events",
        &objects.stdout,
        &secrets,
        &mut leaks,
    );
    for log in sandbox
        .controller_logs()
        .into_iter()
        .chain(sandbox.server_logs())
    {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(!text.is_empty(), "{} is empty", log.display());
        scan(&log.display().to_string(), &text, &secrets, &mut leaks);
    }
    assert!(leaks.is_empty(), "secrets found in: {leaks:?}");
    eprintln!(
        "secrets: scanned {} engine and {} worker workflow runs, objects, events and logs in {:.0}s: no leak",
        engine.len(),
        workers.len(),
        started.elapsed().as_secs_f64()
    );
    sandbox.stop().await;
}
