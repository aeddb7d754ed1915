//! The CRDs reject bad manifests at admission, with a message that says what is wrong, and
//! accept the Go controller's manifests with the same defaults.

use serde_json::{Value, json};

use crate::harness::cli::kubectl;
use crate::harness::{kube_client, test_namespace};

fn worker(namespace: &str, name: &str) -> Value {
    json!({
        "apiVersion": "temporal.io/v1alpha1",
        "kind": "TemporalWorkerDeployment",
        "metadata": { "name": name, "namespace": namespace },
        "spec": {
            "replicas": 1,
            "workerOptions": { "connectionRef": { "name": "dev" }, "temporalNamespace": "default" },
            "rollout": {
                "strategy": "Progressive",
                "steps": [
                    { "rampPercentage": 10, "pauseDuration": "30s" },
                    { "rampPercentage": 50, "pauseDuration": "5m" }
                ]
            },
            "sunset": { "scaledownDelay": "1h", "deleteDelay": "24h" },
            "template": { "spec": { "containers": [ { "name": "worker", "image": "twc.local/sample-worker:v1" } ] } }
        }
    })
}

fn connection(namespace: &str, name: &str) -> Value {
    json!({
        "apiVersion": "temporal.io/v1alpha1",
        "kind": "TemporalConnection",
        "metadata": { "name": name, "namespace": namespace },
        "spec": { "hostPort": "my-ns.a1b2c.tmprl.cloud:7233" }
    })
}

fn steps(ramps: &[i64], pause: &str) -> Value {
    Value::Array(
        ramps
            .iter()
            .map(|r| json!({ "rampPercentage": r, "pauseDuration": pause }))
            .collect(),
    )
}

/// Sets `spec.sunset.drain` of a worker manifest.
fn drain(policy: Value) -> Box<dyn Fn(&mut Value)> {
    Box::new(move |m| m["spec"]["sunset"]["drain"] = policy.clone())
}

/// Sets `spec.autoscaling` of a worker manifest (without `replicas`).
fn autoscaling(policy: Value) -> Box<dyn Fn(&mut Value)> {
    Box::new(move |m| {
        if let Some(spec) = m["spec"].as_object_mut() {
            spec.remove("replicas");
        }
        m["spec"]["autoscaling"] = policy.clone();
    })
}

/// Sets `spec.rollout.analysis` of a worker manifest.
fn analysis(analysis: Value) -> Box<dyn Fn(&mut Value)> {
    Box::new(move |m| m["spec"]["rollout"]["analysis"] = analysis.clone())
}

/// `manifest` under the current name of its kind (WorkerDeployment, Connection).
fn current_kind(mut manifest: Value) -> Value {
    let current = match manifest["kind"].as_str() {
        Some("TemporalWorkerDeployment") => "WorkerDeployment",
        Some("TemporalConnection") => "Connection",
        _ => return manifest,
    };
    manifest["kind"] = current.into();
    manifest
}

/// Applies `manifest` and returns kubectl's error text if it was rejected.
async fn rejection(manifest: &Value) -> Option<String> {
    let out = kubectl(&["create", "-f", "-"], Some(&manifest.to_string())).await;
    (!out.success).then_some(out.stderr)
}

#[tokio::test]
async fn invalid_manifests_are_rejected_with_a_clear_message() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "crd-invalid").await;
    let long_name = "w".repeat(64);
    type Mutation = Box<dyn Fn(&mut Value)>;
    let cases: Vec<(&str, Value, Mutation, &str)> = vec![
        (
            "progressive without steps",
            worker(&ns, "a"),
            Box::new(|m| m["spec"]["rollout"]["steps"] = json!([])),
            "steps are required for Progressive rollout",
        ),
        (
            "progressive with steps absent",
            worker(&ns, "a"),
            Box::new(|m| {
                m["spec"]["rollout"]
                    .as_object_mut()
                    .map(|r| r.remove("steps"));
            }),
            "steps are required for Progressive rollout",
        ),
        (
            "ramp 0",
            worker(&ns, "a"),
            Box::new(|m| m["spec"]["rollout"]["steps"] = steps(&[0, 50], "30s")),
            "should be greater than or equal to 1",
        ),
        (
            "ramp 100",
            worker(&ns, "a"),
            Box::new(|m| m["spec"]["rollout"]["steps"] = steps(&[50, 100], "30s")),
            "should be less than or equal to 99",
        ),
        (
            "decreasing ramps",
            worker(&ns, "a"),
            Box::new(|m| m["spec"]["rollout"]["steps"] = steps(&[50, 25], "30s")),
            "rampPercentage must increase between each step",
        ),
        (
            "repeated ramps",
            worker(&ns, "a"),
            Box::new(|m| m["spec"]["rollout"]["steps"] = steps(&[25, 25], "30s")),
            "rampPercentage must increase between each step",
        ),
        (
            "21 steps",
            worker(&ns, "a"),
            Box::new(|m| {
                m["spec"]["rollout"]["steps"] = steps(&(1..=21).collect::<Vec<_>>(), "30s")
            }),
            "must have at most 20 items",
        ),
        (
            "pause not a duration",
            worker(&ns, "a"),
            Box::new(|m| m["spec"]["rollout"]["steps"][0]["pauseDuration"] = json!("soon")),
            "pauseDuration must be a duration such as 30s, 5m or 1h30m",
        ),
        (
            "pause below 1s",
            worker(&ns, "a"),
            Box::new(|m| m["spec"]["rollout"]["steps"][0]["pauseDuration"] = json!("500ms")),
            "pauseDuration must be at least 1s",
        ),
        (
            "replay check without command or args",
            worker(&ns, "a"),
            Box::new(|m| m["spec"]["rollout"]["replayCheck"] = json!({ "maxHistories": 10 })),
            "replayCheck needs command or args",
        ),
        (
            "replay check with a negative bound",
            worker(&ns, "a"),
            Box::new(|m| {
                m["spec"]["rollout"]["replayCheck"] =
                    json!({ "args": ["replay"], "maxHistories": -1 })
            }),
            "spec.rollout.replayCheck.maxHistories: Invalid value: -1: spec.rollout.replayCheck.maxHistories in body should be greater than or equal to 1",
        ),
        (
            "replay check with an empty command",
            worker(&ns, "a"),
            Box::new(|m| m["spec"]["rollout"]["replayCheck"] = json!({ "command": [] })),
            "spec.rollout.replayCheck.command: Invalid value: 0: spec.rollout.replayCheck.command in body should have at least 1 items",
        ),
        (
            "replay check with a short timeout",
            worker(&ns, "a"),
            Box::new(|m| {
                m["spec"]["rollout"]["replayCheck"] = json!({ "args": ["replay"], "timeout": "5s" })
            }),
            "timeout must be at least 10s",
        ),
        (
            "unknown strategy",
            worker(&ns, "a"),
            Box::new(|m| m["spec"]["rollout"]["strategy"] = json!("Sometimes")),
            "Unsupported value: \"Sometimes\"",
        ),
        (
            "name longer than 63",
            worker(&ns, &long_name),
            Box::new(|_| {}),
            "name cannot be more than 63 characters",
        ),
        (
            "gate input not an object",
            worker(&ns, "a"),
            Box::new(|m| {
                m["spec"]["rollout"]["gate"] =
                    json!({ "workflowType": "RolloutGate", "input": [1, 2] })
            }),
            "spec.rollout.gate.input in body must be of type object",
        ),
        (
            "gate input and inputFrom",
            worker(&ns, "a"),
            Box::new(|m| {
                m["spec"]["rollout"]["gate"] = json!({ "workflowType": "RolloutGate", "input": {"a": 1},
                "inputFrom": { "configMapKeyRef": { "name": "c", "key": "k" } } })
            }),
            "only one of input or inputFrom may be set",
        ),
        (
            "gate inputFrom with both sources",
            worker(&ns, "a"),
            Box::new(|m| {
                m["spec"]["rollout"]["gate"] = json!({ "workflowType": "RolloutGate",
                "inputFrom": { "configMapKeyRef": { "name": "c", "key": "k" }, "secretKeyRef": { "name": "s", "key": "k" } } })
            }),
            "exactly one of configMapKeyRef or secretKeyRef must be set",
        ),
        (
            "missing template",
            worker(&ns, "a"),
            Box::new(|m| {
                m["spec"].as_object_mut().map(|s| s.remove("template"));
            }),
            "spec.template: Required value",
        ),
        (
            "bad unsafeCustomBuildID",
            worker(&ns, "a"),
            Box::new(|m| m["spec"]["workerOptions"]["unsafeCustomBuildID"] = json!("-bad id-")),
            "spec.workerOptions.unsafeCustomBuildID",
        ),
        (
            "drain signalAfter negative",
            worker(&ns, "a"),
            drain(json!({ "signalAfter": "-1s" })),
            "spec.sunset.drain.signalAfter: Invalid value: \"-1s\": signalAfter must be a non-negative duration such as 30s, 5m or 1h30m",
        ),
        (
            "drain signalAfter not a duration",
            worker(&ns, "a"),
            drain(json!({ "signalAfter": "1 day" })),
            "signalAfter must be a non-negative duration such as 30s, 5m or 1h30m",
        ),
        (
            "drain cancelAfter shorter than signalAfter",
            worker(&ns, "a"),
            drain(json!({ "signalAfter": "2h", "cancelAfter": "1h30m" })),
            "spec.sunset.drain.cancelAfter: Invalid value: cancelAfter must not be shorter than signalAfter",
        ),
        (
            "drain terminateAfter shorter than cancelAfter",
            worker(&ns, "a"),
            drain(json!({ "cancelAfter": "1h", "terminateAfter": "59m" })),
            "terminateAfter must not be shorter than cancelAfter",
        ),
        (
            "drain unknown field",
            worker(&ns, "a"),
            drain(json!({ "signalAfter": "1h", "workflowTypez": { "include": ["A"] } })),
            "unknown field \"spec.sunset.drain.workflowTypez\"",
        ),
        (
            "drain unknown filter field",
            worker(&ns, "a"),
            drain(json!({ "signalAfter": "1h", "workflowTypes": { "includes": ["A"] } })),
            "unknown field \"spec.sunset.drain.workflowTypes.includes\"",
        ),
        (
            "drain type both included and excluded",
            worker(&ns, "a"),
            drain(
                json!({ "signalAfter": "1h", "workflowTypes": { "include": ["A"], "exclude": ["A"] } }),
            ),
            "a workflow type cannot be both included and excluded",
        ),
        (
            "drain rate 0",
            worker(&ns, "a"),
            drain(json!({ "signalAfter": "1h", "rate": 0 })),
            "spec.sunset.drain.rate in body should be greater than or equal to 1",
        ),
        (
            "drain empty",
            worker(&ns, "a"),
            drain(json!({})),
            "drain must set at least one of signalAfter, cancelAfter, terminateAfter or moveToCurrent",
        ),
        (
            "drain moveToCurrent without builds",
            worker(&ns, "a"),
            drain(json!({ "moveToCurrent": {} })),
            "spec.sunset.drain.moveToCurrent.buildIDs: Required value",
        ),
        (
            "analysis threshold above 100",
            worker(&ns, "a"),
            analysis(json!({ "checks": [
                { "name": "failures", "temporal": { "maxFailurePercent": 150 } }
            ] })),
            "should be less than or equal to 100",
        ),
        (
            "analysis check without a provider",
            worker(&ns, "a"),
            analysis(json!({ "checks": [ { "name": "failures" } ] })),
            "a check needs exactly one provider: temporal or prometheus",
        ),
        (
            "analysis check with two providers",
            worker(&ns, "a"),
            analysis(json!({ "checks": [ {
                "name": "both",
                "temporal": { "maxFailurePercent": 5 },
                "prometheus": { "address": "http://p:9090", "query": "up", "maxValue": 1 }
            } ] })),
            "a check needs exactly one provider: temporal or prometheus",
        ),
        (
            "temporal check without a threshold",
            worker(&ns, "a"),
            analysis(json!({ "checks": [ { "name": "f", "temporal": { "minSamples": 5 } } ] })),
            "a temporal check needs maxFailurePercent or maxIncreaseOverCurrent",
        ),
        (
            "prometheus check with min above max",
            worker(&ns, "a"),
            analysis(json!({ "checks": [ { "name": "p", "prometheus": {
                "address": "http://p:9090", "query": "up", "minValue": 2, "maxValue": 1
            } } ] })),
            "minValue must not be above maxValue",
        ),
        (
            "prometheus auth with both secret refs",
            worker(&ns, "a"),
            analysis(json!({ "checks": [ { "name": "p", "prometheus": {
                "address": "https://p:9090", "query": "up", "maxValue": 1,
                "auth": {
                    "bearerTokenSecretRef": { "name": "t", "key": "token" },
                    "basicAuthSecretRef": { "name": "b" }
                }
            } } ] })),
            "prometheus.auth needs exactly one of bearerTokenSecretRef or basicAuthSecretRef",
        ),
        (
            "prometheus auth with no secret ref",
            worker(&ns, "a"),
            analysis(json!({ "checks": [ { "name": "p", "prometheus": {
                "address": "https://p:9090", "query": "up", "maxValue": 1, "auth": {}
            } } ] })),
            "prometheus.auth needs exactly one of bearerTokenSecretRef or basicAuthSecretRef",
        ),
        (
            "prometheus tls on an http address",
            worker(&ns, "a"),
            analysis(json!({ "checks": [ { "name": "p", "prometheus": {
                "address": "http://p:9090", "query": "up", "maxValue": 1,
                "tls": { "caSecretRef": { "name": "ca", "key": "ca.crt" } }
            } } ] })),
            "prometheus.tls applies to an https:// address only",
        ),
        (
            "analysis interval below 1s",
            worker(&ns, "a"),
            analysis(json!({ "checks": [
                { "name": "f", "interval": "500ms", "temporal": { "maxFailurePercent": 5 } }
            ] })),
            "interval must be at least 1s",
        ),
        (
            "repeated check names",
            worker(&ns, "a"),
            analysis(json!({ "checks": [
                { "name": "f", "temporal": { "maxFailurePercent": 5 } },
                { "name": "f", "temporal": { "maxFailurePercent": 9 } }
            ] })),
            "check names must be unique",
        ),
        (
            "analysis without Progressive",
            worker(&ns, "a"),
            Box::new(|m| {
                m["spec"]["rollout"] = json!({
                    "strategy": "AllAtOnce",
                    "analysis": { "checks": [ { "name": "f", "temporal": { "maxFailurePercent": 5 } } ] }
                })
            }),
            "analysis needs the Progressive strategy",
        ),
        (
            "autoscaling min above max",
            worker(&ns, "a"),
            autoscaling(json!({ "minReplicas": 5, "maxReplicas": 2, "backlogPerReplica": 10 })),
            "minReplicas must not be above maxReplicas",
        ),
        (
            "autoscaling zero target",
            worker(&ns, "a"),
            autoscaling(json!({ "maxReplicas": 2, "backlogPerReplica": 0 })),
            "should be greater than or equal to 1",
        ),
        (
            "autoscaling without a target",
            worker(&ns, "a"),
            autoscaling(json!({ "maxReplicas": 2 })),
            "set exactly one target: backlogPerReplica or backlogAgeSeconds",
        ),
        (
            "autoscaling with replicas",
            worker(&ns, "a"),
            Box::new(|m| {
                m["spec"]["replicas"] = json!(2);
                m["spec"]["autoscaling"] = json!({ "maxReplicas": 2, "backlogPerReplica": 5 });
            }),
            "spec.replicas and spec.autoscaling cannot both be set",
        ),
        (
            "both mTLS and API key",
            connection(&ns, "c"),
            Box::new(|m| {
                m["spec"]["mutualTLSSecretRef"] = json!({ "name": "tls" });
                m["spec"]["apiKeySecretRef"] = json!({ "name": "key", "key": "apikey" });
            }),
            "Only one of mutualTLSSecretRef or apiKeySecretRef may be set",
        ),
        (
            "hostPort with a scheme",
            connection(&ns, "c"),
            Box::new(|m| m["spec"]["hostPort"] = json!("https://x:7233")),
            "spec.hostPort in body should match",
        ),
        (
            "hostPort without a port",
            connection(&ns, "c"),
            Box::new(|m| m["spec"]["hostPort"] = json!("temporal")),
            "spec.hostPort in body should match",
        ),
    ];
    let mut failures = Vec::new();
    for (name, manifest, mutate, expected) in cases {
        // The same rules under both names of each kind.
        for mut manifest in [manifest.clone(), current_kind(manifest)] {
            mutate(&mut manifest);
            let kind = manifest["kind"].as_str().unwrap_or_default().to_owned();
            match rejection(&manifest).await {
                None => failures.push(format!("{name} ({kind}): was accepted")),
                Some(err) if !err.contains(expected) => failures.push(format!(
                    "{name} ({kind}): message {err:?} lacks {expected:?}"
                )),
                Some(_) => {}
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let stored = kubectl(
        &["get", "twd,tconn,wd,connections", "-n", &ns, "-o", "name"],
        None,
    )
    .await;
    assert_eq!(
        stored.stdout.trim(),
        "",
        "rejected manifests must not be stored"
    );
}

#[tokio::test]
async fn go_controller_manifests_are_accepted_with_the_same_defaults() {
    let client = kube_client().await;
    // (short name of the worker kind, of the connection kind, and their full names)
    let kinds = [
        (
            "twd",
            "tconn",
            "temporalworkerdeployment",
            "temporalconnection",
        ),
        ("wd", "connection", "workerdeployment", "connection"),
    ];
    for (short, connection_short, worker_kind, connection_kind) in kinds {
        let ns = test_namespace(&client, "crd-valid").await;
        accepted_with_the_same_defaults(&ns, short, connection_short, worker_kind, connection_kind)
            .await;
    }
}

async fn accepted_with_the_same_defaults(
    ns: &str,
    short: &str,
    connection_short: &str,
    worker_kind: &str,
    connection_kind: &str,
) {
    let ns = ns.to_owned();
    let current = short == "wd";
    let of_kind = |m: Value| if current { current_kind(m) } else { m };
    let mut manifest = of_kind(worker(&ns, "hello"));
    manifest["spec"]["rollout"]["gate"] =
        json!({ "workflowType": "RolloutGate", "input": { "thresholds": { "errorRate": 0.01 } } });
    manifest["spec"]["rollout"]["steps"] = steps(&[1, 10, 50], "1s");
    manifest["spec"].as_object_mut().map(|s| s.remove("sunset"));
    let created = kubectl(&["create", "-f", "-"], Some(&manifest.to_string())).await;
    assert!(created.success, "valid TWD rejected: {}", created.stderr);
    let conn = kubectl(
        &["create", "-f", "-"],
        Some(&of_kind(connection(&ns, "dev")).to_string()),
    )
    .await;
    assert!(conn.success, "valid connection rejected: {}", conn.stderr);

    let got = kubectl(&["get", short, "hello", "-n", &ns, "-o", "json"], None).await;
    let stored: Value = serde_json::from_str(&got.stdout).unwrap_or_default();
    let spec = &stored["spec"];
    assert_eq!(spec["progressDeadlineSeconds"], json!(600));
    assert_eq!(spec["minReadySeconds"], json!(0));
    assert_eq!(
        spec["sunset"],
        json!({ "scaledownDelay": "1h", "deleteDelay": "24h" })
    );
    assert_eq!(spec["rollout"]["paused"], json!(false));
    assert_eq!(spec["rollout"]["rollbackWindow"], json!("1h"));
    assert_eq!(
        spec["rollout"]["gate"]["input"]["thresholds"]["errorRate"],
        json!(0.01)
    );

    let named = kubectl(&["get", short, "-n", &ns, "-o", "name"], None).await;
    assert_eq!(
        named.stdout.trim(),
        format!("{worker_kind}.temporal.io/hello")
    );
    let columns = kubectl(&["get", short, "-n", &ns], None).await;
    let header = columns.stdout.lines().next().unwrap_or_default().to_owned();
    for column in ["NAME", "CURRENT", "TARGET", "RAMP %", "PHASE", "AGE"] {
        assert!(header.contains(column), "header {header:?} lacks {column}");
    }
    let tconn = kubectl(
        &["get", connection_short, "dev", "-n", &ns, "-o", "name"],
        None,
    )
    .await;
    assert_eq!(
        tconn.stdout.trim(),
        format!("{connection_kind}.temporal.io/dev")
    );
}

/// A pod template as the Go controller's CRD takes it: references without a name (Kubernetes
/// lets it be empty), a port without a protocol, a gRPC probe without a service, and
/// Kubernetes 1.35's `workloadRef`.
fn go_controller_pod_template() -> Value {
    json!({ "spec": {
        "containers": [ {
            "name": "worker",
            "image": "twc.local/sample-worker:v1",
            "env": [
                { "name": "TOKEN", "valueFrom": { "secretKeyRef": { "key": "token" } } },
                { "name": "MODE", "valueFrom": { "configMapKeyRef": { "key": "mode", "optional": true } } }
            ],
            "envFrom": [ { "secretRef": {} }, { "configMapRef": { "optional": true } } ],
            "ports": [ { "name": "metrics", "containerPort": 9090 } ],
            "readinessProbe": { "grpc": { "port": 7233 } }
        } ],
        "imagePullSecrets": [ {} ],
        "volumes": [
            { "name": "config", "configMap": {} },
            { "name": "both", "projected": { "sources": [ { "secret": {} }, { "configMap": {} } ] } }
        ],
        "workloadRef": { "name": "gang", "podGroup": "workers" }
    } })
}

#[tokio::test]
async fn go_controller_pod_templates_are_accepted_and_stored_with_the_name_defaults() {
    let client = kube_client().await;
    for short in ["twd", "wd"] {
        // A namespace each: a WorkerDeployment beside a TemporalWorkerDeployment of the same
        // name is a hand-over.
        let ns = test_namespace(&client, "crd-template").await;
        let mut manifest = worker(&ns, "refs");
        if short == "wd" {
            manifest = current_kind(manifest);
        }
        manifest["spec"]["template"] = go_controller_pod_template();
        // kubectl's default --validate=strict: a field the schema lacks is refused, not pruned.
        let created = kubectl(&["create", "-f", "-"], Some(&manifest.to_string())).await;
        assert!(created.success, "{short} refused: {}", created.stderr);

        let got = kubectl(&["get", short, "refs", "-n", &ns, "-o", "json"], None).await;
        let stored: Value = serde_json::from_str(&got.stdout).unwrap_or_default();
        let pod = &stored["spec"]["template"]["spec"];
        let container = &pod["containers"][0];
        // Names default to "", as the Go controller's CRD and Kubernetes default them.
        assert_eq!(
            container["env"],
            json!([
                { "name": "TOKEN", "valueFrom": { "secretKeyRef": { "key": "token", "name": "" } } },
                { "name": "MODE", "valueFrom": { "configMapKeyRef": { "key": "mode", "name": "", "optional": true } } }
            ]),
            "{short}"
        );
        assert_eq!(
            container["envFrom"],
            json!([ { "secretRef": { "name": "" } }, { "configMapRef": { "name": "", "optional": true } } ]),
            "{short}"
        );
        assert_eq!(
            pod["imagePullSecrets"],
            json!([ { "name": "" } ]),
            "{short}"
        );
        assert_eq!(
            pod["volumes"],
            json!([
                { "name": "config", "configMap": { "name": "" } },
                { "name": "both", "projected": { "sources": [
                    { "secret": { "name": "" } }, { "configMap": { "name": "" } }
                ] } }
            ]),
            "{short}"
        );
        // Not the core defaults the Go controller's CRDs also fill in (`protocol: TCP`,
        // `service: ""`): the API server applies a CRD's defaults to stored objects when it
        // reads them, and the build ID hashes the template as stored, so every worker
        // deployment with such a port or probe would roll out again after a CRD upgrade
        // (twc_crds::build_id, the_defaults_of_the_crds_leave_build_ids_as_they_were).
        assert_eq!(
            container["ports"],
            json!([ { "name": "metrics", "containerPort": 9090 } ]),
            "{short}"
        );
        assert_eq!(
            container["readinessProbe"]["grpc"],
            json!({ "port": 7233 }),
            "{short}"
        );
        assert_eq!(
            pod["workloadRef"],
            json!({ "name": "gang", "podGroup": "workers" }),
            "{short}"
        );
    }
}

#[tokio::test]
async fn server_side_apply_rejects_unknown_drain_fields() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "crd-drain-ssa").await;
    for unknown in [
        json!({ "signalAfter": "1h", "workflowTypez": { "include": ["A"] } }),
        json!({ "signalAfter": "1h", "workflowTypes": { "includes": ["A"] } }),
    ] {
        let mut manifest = worker(&ns, "a");
        manifest["spec"]["sunset"]["drain"] = unknown;
        let out = kubectl(
            &["apply", "--server-side", "-f", "-"],
            Some(&manifest.to_string()),
        )
        .await;
        assert!(!out.success, "accepted: {manifest}");
        assert!(
            out.stderr.contains("field not declared in schema"),
            "message {:?} does not name the unknown field",
            out.stderr
        );
    }
    let stored = kubectl(&["get", "twd", "-n", &ns, "-o", "name"], None).await;
    assert_eq!(
        stored.stdout.trim(),
        "",
        "rejected manifests must not be stored"
    );
}

#[tokio::test]
async fn a_drain_policy_is_accepted_with_its_defaults() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "crd-drain-valid").await;
    let mut manifest = worker(&ns, "hello");
    // 90m and 1h30m are the same duration: the order rules compare durations, not text.
    manifest["spec"]["sunset"]["drain"] = json!({
        "signalAfter": "90m",
        "cancelAfter": "1h30m",
        "terminateAfter": "1.5h30m",
        "workflowTypes": { "exclude": ["Billing"] },
        "moveToCurrent": { "buildIDs": ["v1-0123456789"] }
    });
    let created = kubectl(&["create", "-f", "-"], Some(&manifest.to_string())).await;
    assert!(created.success, "valid drain rejected: {}", created.stderr);

    let got = kubectl(&["get", "twd", "hello", "-n", &ns, "-o", "json"], None).await;
    let stored: Value = serde_json::from_str(&got.stdout).unwrap_or_default();
    assert_eq!(
        stored["spec"]["sunset"]["drain"],
        json!({
            "signalAfter": "90m",
            "signalName": "twc-drain",
            "cancelAfter": "1h30m",
            "terminateAfter": "1.5h30m",
            "workflowTypes": { "exclude": ["Billing"] },
            "rate": 50,
            "dryRun": false,
            "moveToCurrent": { "buildIDs": ["v1-0123456789"] }
        })
    );
}
