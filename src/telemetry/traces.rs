//! OpenTelemetry traces of `twc run`, exported over OTLP/gRPC when an endpoint is configured
//! (`--otlp-endpoint`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`);
//! otherwise no provider, no exporter thread, no span.
//!
//! The spans themselves, and why their trace context is derived from Temporal identities
//! instead of propagated, are described in [`twc_worker::traces`]. This module builds the
//! OpenTelemetry SDK pipeline (batch span processor, OTLP exporter over tonic, which the Temporal
//! client already brings), reads the standard `OTEL_SERVICE_NAME` (default `twc`) and
//! `OTEL_TRACES_SAMPLER(_ARG)`, and records the watcher's signal spans.
//!
//! The `tracing` spans of the process (logs, and the Temporal SDK's own `RunWorkflow` spans,
//! which are entered again on every replay) are deliberately not bridged to OpenTelemetry.

use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use opentelemetry::KeyValue;
use opentelemetry::trace::{SpanKind, TracerProvider as _};
use opentelemetry_otlp::{WithExportConfig, WithTonicConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use twc_worker::traces::{self, FinishedSpan, Traces, ids};
use twc_workflows::model::TwdRef;

/// Default service name when `OTEL_SERVICE_NAME` is not set.
pub const DEFAULT_SERVICE_NAME: &str = "twc";
/// How long shutdown waits for the last batch to be exported.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// The running export pipeline; [`TraceExport::shutdown`] flushes it.
pub struct TraceExport {
    provider: SdkTracerProvider,
    endpoint: String,
}

/// Where spans are exported: the flag, else the standard environment variables.
pub fn endpoint(flag: Option<&str>) -> Option<String> {
    let env = |name: &str| std::env::var(name).ok();
    flag.map(str::to_owned)
        .or_else(|| env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
        .or_else(|| env("OTEL_EXPORTER_OTLP_ENDPOINT"))
        .map(|e| e.trim().to_owned())
        .filter(|e| !e.is_empty())
}

/// Starts exporting to `endpoint` (must run inside the tokio runtime: the gRPC channel lives
/// there). Returns the handle the engine records spans into.
pub fn start(endpoint: &str) -> anyhow::Result<(Traces, TraceExport)> {
    let mut exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint);
    if endpoint.starts_with("https://") {
        exporter = exporter.with_tls_config(
            opentelemetry_otlp::tonic_types::transport::ClientTlsConfig::new().with_native_roots(),
        );
    }
    let exporter = exporter
        .build()
        .with_context(|| format!("building the OTLP span exporter for {endpoint}"))?;
    let service_name = std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|n| !n.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_owned());
    let resource = Resource::builder()
        .with_service_name(service_name)
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(sampler_from_env(
            std::env::var("OTEL_TRACES_SAMPLER").ok().as_deref(),
            std::env::var("OTEL_TRACES_SAMPLER_ARG").ok().as_deref(),
        ))
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("twc");
    Ok((
        Traces::new(tracer),
        TraceExport {
            provider,
            endpoint: endpoint.to_owned(),
        },
    ))
}

impl TraceExport {
    /// Exports what is buffered and stops the exporter (bounded by a few seconds).
    pub async fn shutdown(self) {
        let endpoint = self.endpoint;
        let provider = self.provider;
        let done =
            tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT))
                .await;
        match done {
            Ok(Ok(())) => tracing::info!(%endpoint, "spans flushed"),
            Ok(Err(e)) => tracing::warn!(%endpoint, "flushing spans: {e}"),
            Err(e) => tracing::warn!(%endpoint, "flushing spans: {e}"),
        }
    }
}

/// The sampler named by `OTEL_TRACES_SAMPLER` (default: every span). Every span twc emits has a
/// trace ID derived from its rollout or workflow run, so the trace-ID ratio decides the same for
/// all spans of a trace without looking at parents: the `parentbased_*` names mean their root
/// sampler here.
fn sampler_from_env(name: Option<&str>, arg: Option<&str>) -> Sampler {
    let ratio = || {
        arg.and_then(|a| a.trim().parse::<f64>().ok())
            .filter(|r| (0.0..=1.0).contains(r))
            .unwrap_or(1.0)
    };
    match name.map(str::trim).unwrap_or("") {
        "" | "always_on" | "parentbased_always_on" => Sampler::AlwaysOn,
        "always_off" | "parentbased_always_off" => Sampler::AlwaysOff,
        "traceidratio" | "parentbased_traceidratio" => Sampler::TraceIdRatioBased(ratio()),
        other => {
            tracing::warn!(
                sampler = other,
                "unsupported OTEL_TRACES_SAMPLER; sampling every span"
            );
            Sampler::AlwaysOn
        }
    }
}

/// What the watcher's `signal spec_changed` span records.
pub struct SpecSignal<'a> {
    /// The TWD.
    pub twd: &'a TwdRef,
    /// Its generation.
    pub generation: i64,
    /// Build ID of its spec.
    pub build_id: &'a str,
    /// Whether it is being deleted.
    pub deleting: bool,
    /// When the signal was sent.
    pub start: SystemTime,
    /// The TWD workflow run signalled, or why the signal failed.
    pub result: Result<Option<&'a str>, String>,
}

/// Records the watcher's span of one spec signal in the trace of the rollout of its build (the
/// rollout it may cause), linked to the TWD workflow run it reached.
pub fn record_spec_signal(traces: &Traces, signal: SpecSignal<'_>) {
    let rollout_id = signal.twd.rollout_workflow_id(signal.build_id);
    let twd_workflow_id = signal.twd.twd_workflow_id();
    let mut attributes: Vec<KeyValue> = traces::twd_attributes(signal.twd).into();
    attributes.extend([
        KeyValue::new(traces::BUILD_ID, signal.build_id.to_owned()),
        KeyValue::new("twc.generation", signal.generation),
        KeyValue::new("twc.deleting", signal.deleting),
        KeyValue::new(traces::WORKFLOW_ID, twd_workflow_id.clone()),
        KeyValue::new("twc.rollout_workflow_id", rollout_id.clone()),
    ]);
    let (links, error) = match &signal.result {
        Ok(run_id) => {
            attributes.push(KeyValue::new(traces::OUTCOME, "ok"));
            let links = run_id
                .map(|run_id| {
                    attributes.push(KeyValue::new(traces::RUN_ID, run_id.to_owned()));
                    ids::run_span_context(&twd_workflow_id, run_id)
                })
                .into_iter()
                .collect();
            (links, None)
        }
        Err(message) => {
            attributes.push(KeyValue::new(traces::OUTCOME, "error"));
            (Vec::new(), Some(message.clone()))
        }
    };
    traces.record(FinishedSpan {
        name: "signal spec_changed".into(),
        kind: SpanKind::Producer,
        trace_id: Some(ids::rollout_trace_id(&rollout_id)),
        span_id: None,
        parent: None,
        start: signal.start,
        end: SystemTime::now(),
        attributes,
        links,
        error,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samplers_follow_the_standard_names_and_ratio_decides_on_the_trace_id_alone() {
        assert!(matches!(sampler_from_env(None, None), Sampler::AlwaysOn));
        assert!(matches!(
            sampler_from_env(Some("parentbased_always_off"), None),
            Sampler::AlwaysOff
        ));
        assert!(matches!(
            sampler_from_env(Some("parentbased_traceidratio"), Some("0.25")),
            Sampler::TraceIdRatioBased(r) if (r - 0.25).abs() < f64::EPSILON
        ));
        assert!(matches!(
            sampler_from_env(Some("traceidratio"), Some("not a number")),
            Sampler::TraceIdRatioBased(r) if (r - 1.0).abs() < f64::EPSILON
        ));
        assert!(matches!(
            sampler_from_env(Some("xray"), None),
            Sampler::AlwaysOn
        ));
    }

    #[test]
    fn the_flag_wins_over_the_environment_and_blank_means_off() {
        assert_eq!(
            endpoint(Some("http://127.0.0.1:4317")).as_deref(),
            Some("http://127.0.0.1:4317")
        );
        assert_eq!(endpoint(Some("  ")), None);
    }
}
