//! OpenTelemetry traces end to end: a private sandbox whose controller exports spans over OTLP
//! to a real Jaeger (built from its Go module by `make jaeger`), one real rollout, and the spans
//! read back from Jaeger's query API.

use std::time::Duration;

use serde_json::{Value, json};
use twc_worker::traces::ids;

use crate::chaos::cluster::Private;
use crate::harness::twd::{target_build, worker};

const ROLLOUT: Duration = Duration::from_secs(180);
/// Batches leave the controller every second in the sandbox; Jaeger indexes them at once.
const SPANS_ARRIVE: Duration = Duration::from_secs(60);

/// A Jaeger span's tag value, as text.
fn tag(span: &Value, key: &str) -> Option<String> {
    span["tags"].as_array()?.iter().find_map(|t| {
        (t["key"] == key).then(|| match &t["value"] {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
    })
}

/// Jaeger prints IDs as hex without leading zeros; compare them as numbers.
fn hex(id: &Value) -> Option<u128> {
    u128::from_str_radix(id.as_str()?, 16).ok()
}

fn id(display: impl std::fmt::Display) -> Option<u128> {
    u128::from_str_radix(&display.to_string(), 16).ok()
}

/// References of `span` of type `kind` (`CHILD_OF`, `FOLLOWS_FROM`) as (trace, span) IDs.
fn references(span: &Value, kind: &str) -> Vec<(Option<u128>, Option<u128>)> {
    span["references"]
        .as_array()
        .map(|refs| {
            refs.iter()
                .filter(|r| r["refType"] == kind)
                .map(|r| (hex(&r["traceID"]), hex(&r["spanID"])))
                .collect()
        })
        .unwrap_or_default()
}

/// What the test expects of the rollout's trace; `Err` says what is missing yet.
fn check_rollout_trace(trace: &Value, ns: &str, build: &str) -> Result<(), String> {
    let spans = trace["spans"].as_array().cloned().unwrap_or_default();
    let names: Vec<String> = spans
        .iter()
        .map(|s| s["operationName"].as_str().unwrap_or_default().to_owned())
        .collect();
    let rollout_id = format!("rollout/{ns}/hello/{build}");
    let rollout = spans
        .iter()
        .find(|s| s["operationName"] == "rollout")
        .ok_or_else(|| format!("no rollout span yet; spans {names:?}"))?;
    for (key, expected) in [
        ("twc.twd.namespace", ns),
        ("twc.twd.name", "hello"),
        ("twc.build_id", build),
        ("temporalWorkflowID", rollout_id.as_str()),
        ("twc.outcome", "complete"),
    ] {
        let value = tag(rollout, key);
        if value.as_deref() != Some(expected) {
            return Err(format!(
                "rollout span {key} = {value:?}, expected {expected}"
            ));
        }
    }
    let run_id = tag(rollout, "temporalRunID").ok_or("rollout span without run ID")?;
    let rollout_span = hex(&rollout["spanID"]);
    if rollout_span != id(ids::run_span_id(&rollout_id, &run_id)) {
        return Err(format!(
            "rollout span ID {} is not derived",
            rollout["spanID"]
        ));
    }
    for activity in ["wait_for_pollers", "set_routing"] {
        let child = spans.iter().find(|s| {
            s["operationName"] == activity
                && references(s, "CHILD_OF")
                    .iter()
                    .any(|(_, parent)| *parent == rollout_span)
        });
        let Some(child) = child else {
            return Err(format!(
                "no {activity} span child of the rollout span yet; spans {names:?}"
            ));
        };
        if tag(child, "twc.build_id").as_deref() != Some(build)
            || tag(child, "twc.outcome").as_deref() != Some("ok")
            || tag(child, "temporalAttempt").is_none()
        {
            return Err(format!(
                "{activity} span lacks build, outcome or attempt: {child}"
            ));
        }
    }
    let signal = spans
        .iter()
        .find(|s| {
            s["operationName"] == "signal spec_changed"
                && tag(s, "twc.build_id").as_deref() == Some(build)
                && tag(s, "twc.outcome").as_deref() == Some("ok")
        })
        .ok_or_else(|| format!("no watcher signal span in the trace; spans {names:?}"))?;
    let twd_run = tag(signal, "temporalRunID").ok_or("signal span without the TWD run ID")?;
    let twd_workflow = format!("twd/{ns}/hello");
    let expected_link = (
        id(ids::run_trace_id(&twd_workflow, &twd_run)),
        id(ids::run_span_id(&twd_workflow, &twd_run)),
    );
    if !references(signal, "FOLLOWS_FROM").contains(&expected_link) {
        return Err(format!(
            "signal span not linked to the TWD workflow run: {signal}"
        ));
    }
    // The TWD workflow creates the build's Deployment as it starts the rollout: that span is
    // in the rollout's trace too, linked to the TWD workflow run.
    let created = spans
        .iter()
        .find(|s| {
            s["operationName"] == "create_deployment"
                && tag(s, "twc.build_id").as_deref() == Some(build)
        })
        .ok_or_else(|| format!("no create_deployment span in the trace; spans {names:?}"))?;
    // `exists` when the rollout's first observation created it a moment before.
    if tag(created, "twc.outcome").as_deref() != Some("ok")
        || !matches!(
            tag(created, "twc.result").as_deref(),
            Some("created" | "exists")
        )
        || tag(created, "temporalAttempt").is_none()
    {
        return Err(format!(
            "create_deployment span lacks outcome, result or attempt: {created}"
        ));
    }
    if !references(created, "FOLLOWS_FROM").contains(&expected_link) {
        return Err(format!(
            "create_deployment span not linked to the TWD workflow run: {created}"
        ));
    }
    Ok(())
}

#[tokio::test]
async fn a_rollout_is_one_trace_of_its_run_its_activities_and_the_watchers_signal() {
    let mut private = Private::start("tracing").await;
    let query_url = private
        .sandbox
        .start_tracing()
        .await
        .unwrap_or_else(|e| panic!("starting Jaeger (`make jaeger` builds it): {e:#}"));
    let cluster = &private.cluster;
    let ns = cluster.namespace("tracing").await;
    cluster.apply(&cluster.connection(&ns, "dev")).await;
    cluster
        .apply(&worker(
            &ns,
            "hello",
            "v1",
            json!({ "strategy": "AllAtOnce" }),
        ))
        .await;
    let twd = cluster.wait_ready(&ns, "hello", "v1", ROLLOUT).await;
    let build = target_build(&twd).unwrap_or_default();
    let trace_id = id(ids::rollout_trace_id(&format!(
        "rollout/{ns}/hello/{build}"
    )));

    let trace = cluster
        .wait("the rollout's trace in Jaeger", SPANS_ARRIVE, || async {
            let traces = twc_sandbox::tracing_backend::traces(&query_url, "twc")
                .await
                .map_err(|e| e.to_string())?;
            let trace = traces
                .into_iter()
                .find(|t| hex(&t["traceID"]) == trace_id)
                .ok_or_else(|| format!("no trace {trace_id:x?} yet"))?;
            check_rollout_trace(&trace, &ns, &build).map(|()| trace)
        })
        .await;
    let service = trace["processes"]
        .as_object()
        .and_then(|p| p.values().next())
        .map(|p| p["serviceName"].clone());
    assert_eq!(service, Some(json!("twc")), "{trace}");
    private.sandbox.stop().await;
}
