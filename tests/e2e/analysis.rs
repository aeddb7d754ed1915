//! Canary analysis (`spec.rollout.analysis`, `steps[].gate`), end to end: sample workers of a
//! good and of a bad build (`SAMPLE_FAIL_SHARE`), load from the sandbox's load generator on the
//! TWD's task queue, the controller measuring each step against the real Temporal dev server
//! (and a real Prometheus), and aborting a bad build with routing back where it was.

use std::time::Duration;

use serde_json::{Value, json};

use crate::chaos::cluster::Private;
use crate::harness::controls::{Via, kubectl_twc, send, wait_event};
use crate::harness::twd::{
    apply, connection, get_twd, routing, target_build, wait_ready, wait_reason, worker,
};
use crate::harness::wait::wait_for;
use crate::harness::webhook::{Receiver, events, notifications_of, url_secret, wait_delivered};
use crate::harness::{env, kube_client, test_namespace};
use twc_sandbox::env::SandboxEnv;
use twc_sandbox::load::{LoadConfig, LoadGenerator};
use twc_sandbox::prometheus::{PROTECTED_PASSWORD, PROTECTED_USER, Prometheus, PrometheusOptions};

const ROLLOUT: Duration = Duration::from_secs(180);
const ANALYSIS: Duration = Duration::from_secs(120);

/// Workflows started per second by the load generator.
const RATE: u32 = 10;

/// A TWD of sample workers polling `task_queue`, Progressive through `steps`, with `analysis`;
/// `fail_share` percent of its HelloWorld workflows fail.
pub(crate) fn analysed_worker(
    ns: &str,
    name: &str,
    tag: &str,
    task_queue: &str,
    fail_share: u32,
    steps: Value,
    analysis: Option<Value>,
) -> Value {
    let mut rollout = json!({ "strategy": "Progressive", "steps": steps });
    if let Some(analysis) = analysis {
        rollout["analysis"] = analysis;
    }
    let mut manifest = worker(ns, name, tag, rollout);
    manifest["spec"]["template"]["spec"]["containers"][0]["env"] = json!([
        { "name": "SAMPLE_TASK_QUEUE", "value": task_queue },
        { "name": "SAMPLE_FAIL_SHARE", "value": fail_share.to_string() },
    ]);
    manifest
}

/// The Temporal check used here: no worse than Current + 5 points, judged on 15 workflows.
fn temporal_check(name: &str, extra: Value) -> Value {
    let mut check = json!({
        "name": name,
        "interval": "3s",
        "inconclusiveLimit": 10,
        "temporal": { "maxIncreaseOverCurrent": 5, "minSamples": 15 }
    });
    if let (Some(check), Some(extra)) = (check.as_object_mut(), extra.as_object()) {
        check.extend(extra.clone());
    }
    check
}

/// Starts HelloWorld workflows on `task_queue` of the sandbox's Temporal at [`RATE`] per second
/// until the returned generator is dropped.
pub(crate) async fn load(env: &SandboxEnv, task_queue: &str, id_prefix: &str) -> LoadGenerator {
    load_at(env, task_queue, id_prefix, RATE).await
}

/// [`load`] at `rate` workflows a second.
pub(crate) async fn load_at(
    env: &SandboxEnv,
    task_queue: &str,
    id_prefix: &str,
    rate: u32,
) -> LoadGenerator {
    let config = LoadConfig {
        namespace: env.temporal_namespace.clone(),
        task_queue: task_queue.to_owned(),
        workflow_type: "HelloWorld".to_owned(),
        id_prefix: id_prefix.to_owned(),
        ..LoadConfig::new(env.temporal_address.clone(), f64::from(rate))
    };
    match LoadGenerator::start(config).await {
        Ok(generator) => generator,
        Err(e) => panic!("starting the load generator: {e}"),
    }
}

/// Waits until Temporal's routing of `deployment` has `current` as Current and no ramp.
async fn wait_routing(deployment: &str, current: &str) {
    wait_for(
        &format!("{deployment}: {current} Current, no ramp"),
        ANALYSIS,
        || async {
            let r = routing(deployment).await?;
            if r.current.as_deref() == Some(current) && r.ramping.is_none() {
                Ok(())
            } else {
                Err(format!("{r:?}"))
            }
        },
    )
    .await;
}

/// `status.rollout.analysis` of a TWD, as JSON.
pub(crate) async fn analysis_status(
    client: &kube::Client,
    ns: &str,
    name: &str,
) -> Result<Value, String> {
    let twd = get_twd(client, ns, name).await?;
    let rollout = twd.status.and_then(|s| s.rollout).unwrap_or_default();
    serde_json::to_value(&rollout.analysis).map_err(|e| e.to_string())
}

#[tokio::test]
async fn a_good_build_passes_every_step_and_a_failing_one_is_aborted_at_the_first() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "analysis").await;
    let tq = format!("analysis-{ns}");
    let steps = json!([
        { "rampPercentage": 50, "pauseDuration": "8s" },
        { "rampPercentage": 75, "pauseDuration": "4s" }
    ]);
    let analysis = json!({ "checks": [ temporal_check("failures", json!({})) ] });
    // A webhook told of failed analyses.
    let receiver = Receiver::start().await;
    let manifest = |tag: &str, fail: u32| {
        let mut manifest = analysed_worker(
            &ns,
            "hello",
            tag,
            &tq,
            fail,
            steps.clone(),
            Some(analysis.clone()),
        );
        manifest["spec"]["notifications"] = notifications_of("ops", "hook", &["AnalysisFailed"]);
        manifest
    };
    apply(&connection(&ns)).await;
    apply(&url_secret(&ns, "hook", &receiver.url)).await;
    apply(&manifest("v1", 0)).await;
    let twd = wait_ready(&client, &ns, "hello", ROLLOUT).await;
    let v1 = target_build(&twd).unwrap_or_default();
    let _load = load(env(), &tq, &format!("{ns}-load-")).await;

    // A good v2 passes both steps' checks and becomes Current.
    apply(&manifest("v2", 0)).await;
    let twd = wait_ready(&client, &ns, "hello", ROLLOUT).await;
    let v2 = target_build(&twd).unwrap_or_default();
    assert_ne!(v1, v2);
    let passed = analysis_status(&client, &ns, "hello")
        .await
        .unwrap_or_default();
    assert_eq!(passed[0]["name"], "failures", "{passed}");
    assert_eq!(passed[0]["step"], 1, "the last step's records: {passed}");
    assert!(passed[0]["successful"].as_i64() >= Some(1), "{passed}");
    assert_eq!(passed[0]["failed"], 0, "{passed}");

    // A v3 whose workflows fail 30% of the time is aborted at the first step.
    apply(&manifest("v3", 30)).await;
    let (_, reason, message) =
        wait_reason(&client, &ns, "hello", "Ready", "AnalysisFailed", ANALYSIS).await;
    assert_eq!(reason, "AnalysisFailed");
    assert!(
        message.contains("failure share") && message.contains("step 1"),
        "the message names the measured share and the step: {message}"
    );
    let deployment = format!("{ns}/hello");
    wait_routing(&deployment, &v2).await;
    let (kind, _, event) = wait_event(
        &client,
        &ns,
        "hello",
        "AnalysisFailed",
        "failure share",
        ANALYSIS,
    )
    .await;
    assert_eq!(kind, "Warning", "{event}");
    let failed = analysis_status(&client, &ns, "hello")
        .await
        .unwrap_or_default();
    assert_eq!(
        (failed[0]["step"].as_i64(), failed[0]["phase"].as_str()),
        (Some(0), Some("Failed")),
        "{failed}"
    );
    // `kubectl twc status` shows the analysis.
    let shown = kubectl_twc(&["status", "hello", "-n", &ns]).await;
    assert_eq!(shown.code, Some(0), "{shown:?}");
    let table = shown
        .stdout
        .split("Analysis (spec.rollout.analysis)")
        .nth(1)
        .unwrap_or_default();
    assert!(
        table
            .lines()
            .any(|l| l.contains("failures") && l.contains("Failed")),
        "{}",
        shown.stdout
    );
    // `retry` runs it again, and the check catches it again.
    let before = crate::harness::controls::events(&client, &ns, "hello")
        .await
        .iter()
        .filter(|(_, r, _)| r == "AnalysisFailed")
        .count();
    send(Via::Cli, "retry", &ns, "hello").await;
    wait_for("a second AnalysisFailed after retry", ANALYSIS, || async {
        let after = crate::harness::controls::events(&client, &ns, "hello")
            .await
            .iter()
            .filter(|(_, r, _)| r == "AnalysisFailed")
            .count();
        if after > before {
            Ok(())
        } else {
            Err(format!("{after} AnalysisFailed events"))
        }
    })
    .await;
    wait_routing(&deployment, &v2).await;
    // The webhook was told of each failure, with the measurement, and of nothing else.
    let told = wait_delivered(&receiver, 2, ANALYSIS).await;
    assert_eq!(
        events(&told),
        vec![("AnalysisFailed".to_owned(), "AnalysisFailed".to_owned()); 2],
        "{told:#?}"
    );
    assert!(
        told.iter().all(|b| b["message"]
            .as_str()
            .is_some_and(|m| m.contains("failure share"))),
        "{told:#?}"
    );
}

#[tokio::test]
async fn a_dry_run_check_records_failures_and_the_rollout_proceeds() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "analysis-dry").await;
    let tq = format!("analysis-{ns}");
    let steps = json!([{ "rampPercentage": 50, "pauseDuration": "30s" }]);
    let analysis = json!({ "checks": [ {
        "name": "failures", "interval": "3s", "dryRun": true,
        "temporal": { "maxFailurePercent": 5, "minSamples": 8 }
    } ] });
    // A webhook told of failed analyses.
    let receiver = Receiver::start().await;
    let manifest = |tag: &str, fail: u32| {
        let mut manifest = analysed_worker(
            &ns,
            "hello",
            tag,
            &tq,
            fail,
            steps.clone(),
            Some(analysis.clone()),
        );
        manifest["spec"]["notifications"] = notifications_of("ops", "hook", &["AnalysisFailed"]);
        manifest
    };
    apply(&connection(&ns)).await;
    apply(&url_secret(&ns, "hook", &receiver.url)).await;
    apply(&manifest("v1", 0)).await;
    wait_ready(&client, &ns, "hello", ROLLOUT).await;
    let _load = load(env(), &tq, &format!("{ns}-load-")).await;
    apply(&manifest("v2", 30)).await;
    wait_event(
        &client,
        &ns,
        "hello",
        "AnalysisDryRunFailed",
        "failure share",
        ANALYSIS,
    )
    .await;
    let twd = wait_ready(&client, &ns, "hello", ROLLOUT).await;
    let v2 = target_build(&twd).unwrap_or_default();
    wait_routing(&format!("{ns}/hello"), &v2).await;
    let recorded = analysis_status(&client, &ns, "hello")
        .await
        .unwrap_or_default();
    assert_eq!(recorded[0]["dryRun"], true, "{recorded}");
    assert!(recorded[0]["failed"].as_i64() >= Some(1), "{recorded}");
}

#[tokio::test]
async fn a_failing_step_gate_aborts_at_its_step_after_earlier_steps_passed() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "analysis-gate").await;
    let tq = format!("analysis-{ns}");
    let steps = json!([
        { "rampPercentage": 20, "pauseDuration": "2s", "gate": { "workflowType": "GatePass" } },
        { "rampPercentage": 40, "pauseDuration": "2s", "gate": { "workflowType": "GateFail" } },
        { "rampPercentage": 60, "pauseDuration": "2s" }
    ]);
    let manifest = |tag: &str| analysed_worker(&ns, "hello", tag, &tq, 0, steps.clone(), None);
    apply(&connection(&ns)).await;
    apply(&manifest("v1")).await;
    let twd = wait_ready(&client, &ns, "hello", ROLLOUT).await;
    let v1 = target_build(&twd).unwrap_or_default();
    apply(&manifest("v2")).await;
    wait_event(&client, &ns, "hello", "StepGatePassed", "step 1", ANALYSIS).await;
    let (_, _, message) =
        wait_reason(&client, &ns, "hello", "Ready", "AnalysisFailed", ANALYSIS).await;
    assert!(
        message.contains("gate of step 2 failed") && message.contains("GateFail"),
        "{message}"
    );
    wait_routing(&format!("{ns}/hello"), &v1).await;
    let routed = routing(&format!("{ns}/hello"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        routed.current.as_deref(),
        Some(v1.as_str()),
        "Current untouched"
    );
}

#[tokio::test]
async fn no_traffic_is_inconclusive_held_with_its_reason_then_aborted() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "analysis-idle").await;
    let tq = format!("analysis-{ns}");
    let steps = json!([{ "rampPercentage": 30, "pauseDuration": "2s" }]);
    let analysis = json!({ "checks": [ temporal_check("failures", json!({ "interval": "2s", "inconclusiveLimit": 3 })) ] });
    let manifest = |tag: &str| {
        analysed_worker(
            &ns,
            "hello",
            tag,
            &tq,
            0,
            steps.clone(),
            Some(analysis.clone()),
        )
    };
    apply(&connection(&ns)).await;
    apply(&manifest("v1")).await;
    let twd = wait_ready(&client, &ns, "hello", ROLLOUT).await;
    let v1 = target_build(&twd).unwrap_or_default();
    apply(&manifest("v2")).await;
    let (_, _, held) = wait_reason(
        &client,
        &ns,
        "hello",
        "Progressing",
        "AnalysisInconclusive",
        ANALYSIS,
    )
    .await;
    assert!(held.contains("only 0 of"), "the reason says why: {held}");
    let (_, _, aborted) =
        wait_reason(&client, &ns, "hello", "Ready", "AnalysisFailed", ANALYSIS).await;
    assert!(
        aborted.contains("inconclusive 4 time(s) in a row"),
        "{aborted}"
    );
    wait_routing(&format!("{ns}/hello"), &v1).await;
}

/// Verdicts of the `run_analysis` results in a history (`temporal workflow show` JSON).
pub(crate) fn recorded_verdicts(history: &Value) -> Vec<String> {
    use base64::Engine as _;
    history["events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| {
            e["activityTaskCompletedEventAttributes"]["result"]["payloads"][0]["data"].as_str()
        })
        .filter_map(|data| base64::engine::general_purpose::STANDARD.decode(data).ok())
        .filter_map(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
        .filter_map(|result| result["measurements"].as_array().cloned())
        .flatten()
        .filter_map(|m| m["verdict"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn a_controller_killed_during_an_analysis_interval_resumes_without_counting_twice() {
    let mut private = Private::start("analysis-kill").await;
    let ns = private.cluster.namespace("analysis-kill").await;
    let tq = format!("analysis-{ns}");
    private
        .cluster
        .apply(&private.cluster.connection(&ns, "dev"))
        .await;
    let steps = json!([{ "rampPercentage": 50, "pauseDuration": "15s" }]);
    let analysis = json!({ "checks": [ {
        "name": "failures", "interval": "3s", "inconclusiveLimit": 20,
        "temporal": { "maxFailurePercent": 50, "minSamples": 3 }
    } ] });
    let manifest = |tag: &str| {
        analysed_worker(
            &ns,
            "hello",
            tag,
            &tq,
            0,
            steps.clone(),
            Some(analysis.clone()),
        )
    };
    private.cluster.apply(&manifest("v1")).await;
    private
        .cluster
        .wait_ready(&ns, "hello", "v1", ROLLOUT)
        .await;
    let _load = load(&private.cluster.env, &tq, &format!("{ns}-load-")).await;
    private.cluster.apply(&manifest("v2")).await;
    // Killed once the first measurement is recorded, in the interval before the next.
    let client = private.cluster.client.clone();
    private
        .cluster
        .wait("a first measurement recorded", ANALYSIS, || async {
            let recorded = analysis_status(&client, &ns, "hello").await?;
            let measured = recorded[0]["successful"].as_i64().unwrap_or(0)
                + recorded[0]["inconclusive"].as_i64().unwrap_or(0);
            if measured >= 1 {
                Ok(())
            } else {
                Err(format!("{recorded}"))
            }
        })
        .await;
    assert!(
        private.sandbox.kill_controller().await.is_some(),
        "the controller was running"
    );
    assert!(
        private.sandbox.restart_dead_controller().is_some(),
        "the controller restarts"
    );
    let twd = private
        .cluster
        .wait_ready(&ns, "hello", "v2", ROLLOUT)
        .await;
    let rollout = twd.status.and_then(|s| s.rollout).unwrap_or_default();
    let check = rollout.analysis.first().cloned().unwrap_or_default();
    // Every run_analysis result in the rollout's history is counted once in status.
    let workflow_id = rollout.workflow_id.unwrap_or_default();
    let mut verdicts = Vec::new();
    let runs = private
        .cluster
        .workflows(&format!("WorkflowId = '{workflow_id}'"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    for run in runs {
        let text = private
            .cluster
            .history(
                &private.cluster.env.temporal_namespace,
                &workflow_id,
                &run.run_id,
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let history: Value = serde_json::from_str(&text).unwrap_or_default();
        verdicts.extend(recorded_verdicts(&history));
    }
    let successful = verdicts.iter().filter(|v| *v == "Successful").count();
    assert!(
        successful >= 2,
        "measured before and after the kill: {verdicts:?}"
    );
    assert_eq!(
        i64::from(check.successful),
        i64::try_from(successful).unwrap_or(-1),
        "status counts each measurement of the history once: {check:?}, history {verdicts:?}"
    );
    assert_eq!(check.failed, 0, "{check:?}");
}

/// A Prometheus of its own scraping every sample worker of the shared sandbox.
async fn prometheus() -> Prometheus {
    let options = match PrometheusOptions::for_sandbox(env()) {
        Ok(options) => options,
        Err(e) => panic!("Prometheus options: {e}"),
    };
    match Prometheus::start(&options).await {
        Ok(prometheus) => prometheus,
        Err(e) => panic!("starting Prometheus: {e}"),
    }
}

/// Failure ratio of the build under analysis over the last 20 s, from the sample workers'
/// `sample_greetings_total` counter.
const FAILURE_RATIO: &str = "sum(rate(sample_greetings_total{build_id=\"{{buildID}}\",outcome=\"failed\"}[20s])) / sum(rate(sample_greetings_total{build_id=\"{{buildID}}\"}[20s]))";

#[tokio::test]
async fn a_failing_build_is_caught_by_a_prometheus_query() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "analysis-prom").await;
    let tq = format!("analysis-{ns}");
    let prometheus = prometheus().await;
    let steps = json!([{ "rampPercentage": 50, "pauseDuration": "30s" }]);
    let analysis = json!({ "checks": [ {
        "name": "failure-ratio", "interval": "3s", "inconclusiveLimit": 15,
        "prometheus": { "address": prometheus.url, "query": FAILURE_RATIO, "maxValue": 0.1 }
    } ] });
    // A webhook told of failed analyses.
    let receiver = Receiver::start().await;
    let manifest = |tag: &str, fail: u32| {
        let mut manifest = analysed_worker(
            &ns,
            "hello",
            tag,
            &tq,
            fail,
            steps.clone(),
            Some(analysis.clone()),
        );
        manifest["spec"]["notifications"] = notifications_of("ops", "hook", &["AnalysisFailed"]);
        manifest
    };
    apply(&connection(&ns)).await;
    apply(&url_secret(&ns, "hook", &receiver.url)).await;
    apply(&manifest("v1", 0)).await;
    let twd = wait_ready(&client, &ns, "hello", ROLLOUT).await;
    let v1 = target_build(&twd).unwrap_or_default();
    let _load = load(env(), &tq, &format!("{ns}-load-")).await;
    apply(&manifest("v2", 30)).await;
    let (_, _, message) =
        wait_reason(&client, &ns, "hello", "Ready", "AnalysisFailed", ANALYSIS).await;
    assert!(
        message.contains("failure-ratio") && message.contains("0.1"),
        "the message names the check, its value and the bound: {message}"
    );
    wait_routing(&format!("{ns}/hello"), &v1).await;
    let recorded = analysis_status(&client, &ns, "hello")
        .await
        .unwrap_or_default();
    assert_eq!(recorded[0]["phase"], "Failed", "{recorded}");
}

#[tokio::test]
async fn a_query_prometheus_rejects_holds_the_rollout_with_its_message_until_fixed() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "analysis-promql").await;
    let tq = format!("analysis-{ns}");
    let prometheus = prometheus().await;
    let steps = json!([{ "rampPercentage": 50, "pauseDuration": "2s" }]);
    let with_query = |query: &str| {
        json!({ "checks": [ {
            "name": "ratio", "interval": "2s", "inconclusiveLimit": 30,
            "prometheus": { "address": prometheus.url, "query": query, "maxValue": 0.5 }
        } ] })
    };
    let manifest = |tag: &str, analysis: Value| {
        analysed_worker(&ns, "hello", tag, &tq, 0, steps.clone(), Some(analysis))
    };
    apply(&connection(&ns)).await;
    apply(&manifest("v1", with_query("vector(0)"))).await;
    let twd = wait_ready(&client, &ns, "hello", ROLLOUT).await;
    let v1 = target_build(&twd).unwrap_or_default();
    apply(&manifest(
        "v2",
        with_query("sum(rate(sample_greetings_total[1m]"),
    ))
    .await;
    let (_, _, message) = wait_reason(
        &client,
        &ns,
        "hello",
        "Progressing",
        "InvalidSpec",
        ANALYSIS,
    )
    .await;
    assert!(
        message.contains("ratio") && message.contains("parse error"),
        "Prometheus's own message: {message}"
    );
    let routed = routing(&format!("{ns}/hello"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        routed.current.as_deref(),
        Some(v1.as_str()),
        "nothing promoted: {routed:?}"
    );
    // Fixed: measured again, and the rollout completes.
    apply(&manifest("v2", with_query("vector(0.2)"))).await;
    let twd = wait_ready(&client, &ns, "hello", ROLLOUT).await;
    assert_ne!(target_build(&twd), Some(v1));
}

/// A Prometheus of its own served as managed services serve one: HTTPS with a certificate of a
/// CA of its own, and basic auth.
async fn protected_prometheus() -> Prometheus {
    let options = match PrometheusOptions::for_sandbox(env()) {
        Ok(options) => PrometheusOptions {
            protected: true,
            ..options
        },
        Err(e) => panic!("Prometheus options: {e}"),
    };
    match Prometheus::start(&options).await {
        Ok(prometheus) => prometheus,
        Err(e) => panic!("starting the protected Prometheus: {e}"),
    }
}

/// A Secret of `ns` of `type_` with `data` (as text).
fn secret(ns: &str, name: &str, type_: &str, data: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Secret", "type": type_,
        "metadata": { "name": name, "namespace": ns },
        "stringData": data,
    })
}

#[tokio::test]
async fn a_prometheus_behind_tls_and_basic_auth_is_queried_with_the_secrets_and_wrong_credentials_abort_with_their_reason()
 {
    let client = kube_client().await;
    let ns = test_namespace(&client, "analysis-prom-auth").await;
    let tq = format!("analysis-{ns}");
    let prometheus = protected_prometheus().await;
    let ca_pem = prometheus.ca_pem.clone().unwrap_or_default();
    apply(&secret(
        &ns,
        "prom-ca",
        "Opaque",
        json!({ "ca.crt": ca_pem }),
    ))
    .await;
    apply(&secret(
        &ns,
        "prom-auth",
        "kubernetes.io/basic-auth",
        json!({ "username": PROTECTED_USER, "password": PROTECTED_PASSWORD }),
    ))
    .await;
    apply(&secret(
        &ns,
        "prom-wrong",
        "kubernetes.io/basic-auth",
        json!({ "username": PROTECTED_USER, "password": "not-the-password" }),
    ))
    .await;
    let steps = json!([{ "rampPercentage": 50, "pauseDuration": "2s" }]);
    // `inconclusiveLimit` 0: the first measurement that is not a verdict aborts.
    let with_auth = |auth_secret: &str| {
        json!({ "checks": [ {
            "name": "ratio", "interval": "2s", "inconclusiveLimit": 0,
            "prometheus": {
                "address": prometheus.url, "query": "vector(0.2)", "maxValue": 0.5,
                "auth": { "basicAuthSecretRef": { "name": auth_secret } },
                "tls": { "caSecretRef": { "name": "prom-ca", "key": "ca.crt" } },
            }
        } ] })
    };
    let manifest = |tag: &str, analysis: Value| {
        analysed_worker(&ns, "hello", tag, &tq, 0, steps.clone(), Some(analysis))
    };
    apply(&connection(&ns)).await;
    apply(&manifest("v1", with_auth("prom-auth"))).await;
    let twd = wait_ready(&client, &ns, "hello", ROLLOUT).await;
    let v1 = target_build(&twd).unwrap_or_default();

    // The right credentials and CA: measured, passed, promoted.
    apply(&manifest("v2", with_auth("prom-auth"))).await;
    let v2 = wait_for("v2 targeted", ROLLOUT, || async {
        let twd = get_twd(&client, &ns, "hello").await?;
        target_build(&twd)
            .filter(|build| *build != v1)
            .ok_or_else(|| "still v1".to_owned())
    })
    .await;
    // With `inconclusiveLimit` 0, a measurement that could not reach Prometheus would have
    // aborted the rollout: v2 Current means it was measured and passed.
    wait_routing(&format!("{ns}/hello"), &v2).await;

    // A wrong password: Prometheus answers 401, named with the Secret, and the rollout aborts.
    apply(&manifest("v3", with_auth("prom-wrong"))).await;
    let (_, _, message) =
        wait_reason(&client, &ns, "hello", "Ready", "AnalysisFailed", ANALYSIS).await;
    assert!(
        message.contains("ratio")
            && message.contains("refused the query's credentials (HTTP 401)")
            && message.contains(&format!("Secret {ns}/prom-wrong")),
        "the message names the check, the refusal and the Secret: {message}"
    );
    assert!(!message.contains("not-the-password"), "{message}");
    wait_routing(&format!("{ns}/hello"), &v2).await;
}
