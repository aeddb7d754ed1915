//! Hostile and broken input: gate input near the object size limit, gate input that is not
//! JSON, a pod template with a megabyte of env, names at their length limits, unicode image
//! tags. Each is either rejected with a clear message or rolled out, and never blows up the
//! engine's workflow histories.

use std::time::Duration;

use serde_json::{Value, json};

use super::cluster::Cluster;
use super::invariants::{Expected, assert_settled};
use crate::harness::twd::{deployments, target_build, worker};

const ROLLOUT: Duration = Duration::from_secs(240);
/// The engine's own workflows stay this small whatever the TWD carries (their inputs are
/// references, digests and small reports; activities read the object).
const MAX_ENGINE_HISTORY: u64 = 256 * 1024;
const MIB: usize = 1024 * 1024;

fn all_at_once() -> Value {
    json!({ "strategy": "AllAtOnce" })
}

/// Asserts that every run of the TWD's own workflows (`twd/...` and `rollout/...`) has a small
/// history; returns the sizes seen.
async fn assert_small_histories(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
) -> Vec<(String, u64)> {
    let query = format!(
        "WorkflowId = 'twd/{namespace}/{name}' OR WorkflowId STARTS_WITH 'rollout/{namespace}/{name}/'"
    );
    let rows = cluster
        .workflows(&query)
        .await
        .unwrap_or_else(|e| panic!("listing workflows: {e}"));
    assert!(
        rows.len() >= 2,
        "the TWD and rollout workflows are listed: {rows:?}"
    );
    let mut sizes = Vec::new();
    for row in rows {
        let size = cluster
            .history_size(&row.id, &row.run_id)
            .await
            .unwrap_or_else(|e| panic!("describing {}: {e}", row.id));
        assert!(
            size < MAX_ENGINE_HISTORY,
            "history of {} ({}) is {size} bytes",
            row.id,
            row.run_id
        );
        sizes.push((row.id, size));
    }
    sizes
}

/// A string of `len` ASCII characters that does not compress to nothing.
fn filler(len: usize, seed: u8) -> String {
    (0..len)
        .map(|i| char::from(b'a' + ((i * 7 + usize::from(seed)) % 26) as u8))
        .collect()
}

#[tokio::test]
async fn gate_input_near_the_object_size_limit_is_rejected_or_rolled_out_with_small_histories() {
    let cluster = Cluster::shared().await;
    let ns = cluster.namespace("biggate").await;
    cluster.apply(&cluster.connection(&ns, "dev")).await;
    let with_input = |size: usize| {
        let rollout = json!({ "strategy": "AllAtOnce", "gate": {
            "workflowType": "GatePass",
            "input": { "checks": ["smoke"], "blob": filler(size, 1) }
        } });
        worker(&ns, "hello", "v1", rollout)
    };

    // Past etcd's 1.5 MiB object limit: the API server refuses it, saying why.
    let out = cluster.try_apply(&with_input(MIB * 8 / 5)).await;
    assert!(!out.success, "a 1.6 MiB TWD was accepted");
    let message = out.stderr.to_lowercase();
    assert!(
        message.contains("too large") || message.contains("too long"),
        "rejection says why: {}",
        out.stderr
    );

    // Just under it: the gate gets the whole input; the engine's histories do not.
    cluster.apply(&with_input(MIB * 13 / 10)).await;
    let twd = cluster.wait_ready(&ns, "hello", "v1", ROLLOUT).await;
    let build = target_build(&twd).unwrap_or_default();
    let gate = twd
        .status
        .as_ref()
        .and_then(|s| s.target_version.as_ref())
        .and_then(|t| t.test_workflows.first().cloned())
        .unwrap_or_else(|| panic!("no gate run in status: {:?}", twd.status));
    let gate_rows = cluster
        .workflows(&format!("WorkflowId = '{}'", gate.workflow_id))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let gate_size = cluster
        .history_size(&gate.workflow_id, &gate_rows[0].run_id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        gate_size > MIB as u64,
        "the gate got its 1.3 MiB input: {gate_size} bytes"
    );
    let sizes = assert_small_histories(&cluster, &ns, "hello").await;
    eprintln!("biggate: gate history {gate_size} bytes; engine histories {sizes:?}");
    assert_settled(
        &cluster,
        &Expected {
            namespace: ns.clone(),
            name: "hello".into(),
            build,
            gated: true,
        },
    )
    .await;
}

#[tokio::test]
async fn gate_input_that_is_not_json_is_invalid_spec_without_quoting_it_until_fixed() {
    let cluster = Cluster::shared().await;
    let ns = cluster.namespace("badgate").await;
    cluster.apply(&cluster.connection(&ns, "dev")).await;
    let config_map = |payload: &str| {
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": "gate-input", "namespace": ns },
            "data": { "payload.json": payload }
        })
    };
    cluster
        .apply(&config_map(
            "{\"checks\": [smoke], \"token\": hunter2-not-json",
        ))
        .await;
    let rollout = json!({ "strategy": "AllAtOnce", "gate": { "workflowType": "RolloutGate",
        "inputFrom": { "configMapKeyRef": { "name": "gate-input", "key": "payload.json" } } } });
    cluster.apply(&worker(&ns, "hello", "v1", rollout)).await;
    let (status, message) = cluster
        .wait_reason(&ns, "hello", "Progressing", "InvalidSpec", ROLLOUT)
        .await;
    assert_eq!(status, "False", "{message}");
    assert!(message.contains("not valid JSON"), "{message}");
    assert!(
        message.contains("gate-input"),
        "names the ConfigMap: {message}"
    );
    assert!(!message.contains("hunter2"), "quotes the input: {message}");
    let deployment_name = format!("{ns}/hello");
    let r = cluster
        .routing(&deployment_name)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.current, None, "nothing promoted: {r:?}");

    cluster
        .apply(&config_map("{\"checks\": [\"smoke\"]}"))
        .await;
    let twd = cluster.wait_ready(&ns, "hello", "v1", ROLLOUT).await;
    let build = target_build(&twd).unwrap_or_default();
    assert_settled(
        &cluster,
        &Expected {
            namespace: ns.clone(),
            name: "hello".into(),
            build,
            gated: true,
        },
    )
    .await;
}

#[tokio::test]
async fn a_megabyte_of_env_in_the_template_rolls_out_with_small_workflow_histories() {
    let cluster = Cluster::shared().await;
    let ns = cluster.namespace("bigenv").await;
    cluster.apply(&cluster.connection(&ns, "dev")).await;
    // 16 values of 64 KiB: 1 MiB in all, each under the kernel's 128 KiB limit per variable.
    let vars: Vec<Value> = (0..16u8)
        .map(|i| json!({ "name": format!("BIG_{i}"), "value": filler(64 * 1024, i) }))
        .collect();
    let manifest = |tag: &str| {
        let mut m = worker(&ns, "hello", tag, all_at_once());
        m["spec"]["template"]["spec"]["containers"][0]["env"] = Value::from(vars.clone());
        m
    };
    cluster.apply(&manifest("v1")).await;
    cluster.wait_ready(&ns, "hello", "v1", ROLLOUT).await;
    cluster.apply(&manifest("v2")).await;
    let twd = cluster.wait_ready(&ns, "hello", "v2", ROLLOUT).await;
    let build = target_build(&twd).unwrap_or_default();
    assert_settled(
        &cluster,
        &Expected {
            namespace: ns.clone(),
            name: "hello".into(),
            build: build.clone(),
            gated: false,
        },
    )
    .await;
    let out = cluster
        .kubectl(&["get", "deploy", "-n", &ns, "-o", "json"], None)
        .await;
    assert!(out.success, "{}", out.stderr);
    assert!(
        out.stdout.len() > 1024 * 1024,
        "the Deployment carries the env ({} bytes)",
        out.stdout.len()
    );
    let sizes = assert_small_histories(&cluster, &ns, "hello").await;
    eprintln!("bigenv: engine histories {sizes:?}");
}

#[tokio::test]
async fn names_at_their_length_limits_roll_out_end_to_end() {
    let cluster = Cluster::shared().await;
    let ns = cluster.namespace("longname").await;
    cluster.apply(&cluster.connection(&ns, "dev")).await;
    let name = format!("{:x<63}", "long-name-");
    assert_eq!(name.len(), 63);
    let tag = format!("v1-{}", "t".repeat(125));
    cluster
        .apply(&worker(&ns, &name, &tag, all_at_once()))
        .await;
    let twd = cluster.wait_ready(&ns, &name, "v1", ROLLOUT).await;
    let build = target_build(&twd).unwrap_or_default();
    assert!(
        build.len() <= 63,
        "build ID {build} has {} characters",
        build.len()
    );
    assert!(build_id_charset(&build), "build ID {build}");
    let deps = deployments(&cluster.client, &ns, &name).await;
    assert_eq!(deps.len(), 1, "{deps:?}");
    let deployment = &deps[0].0;
    assert!(
        deployment.len() <= twc_crds::naming::MAX_DEPLOYMENT_NAME_LEN && dns_label(deployment),
        "Deployment name {deployment} ({} characters)",
        deployment.len()
    );
    assert_settled(
        &cluster,
        &Expected {
            namespace: ns.clone(),
            name: name.clone(),
            build,
            gated: false,
        },
    )
    .await;
}

#[tokio::test]
async fn unicode_image_tags_give_sanitized_build_ids_that_roll_out() {
    let cluster = Cluster::shared().await;
    let ns = cluster.namespace("unicode").await;
    cluster.apply(&cluster.connection(&ns, "dev")).await;
    cluster
        .apply(&worker(&ns, "hello", "v1-ünïcødé-🚀-版本", all_at_once()))
        .await;
    // Not a valid Docker tag: the whole reference names the build, sanitized (as the Go
    // controller does with an image reference it cannot parse).
    let twd = cluster
        .wait_ready(&ns, "hello", "twc.local-sample-worker-v1", ROLLOUT)
        .await;
    let build = target_build(&twd).unwrap_or_default();
    assert!(
        build_id_charset(&build) && build.len() <= 63,
        "build ID {build}"
    );
    assert_settled(
        &cluster,
        &Expected {
            namespace: ns.clone(),
            name: "hello".into(),
            build,
            gated: false,
        },
    )
    .await;
}

fn build_id_charset(build: &str) -> bool {
    !build.is_empty()
        && build
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// RFC 1123 label: lower-case alphanumerics and `-`, alphanumeric at both ends.
fn dns_label(name: &str) -> bool {
    let ends_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    ends_ok(name.chars().next())
        && ends_ok(name.chars().last())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}
