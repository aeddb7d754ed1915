//! OpenTelemetry spans of the engine: one span per workflow run (a rollout, a TWD workflow run)
//! and one per activity execution, linked without passing anything through workflow code.
//!
//! # Why deterministic trace context
//!
//! Workflow code is replayed, so it must not emit telemetry, and changing what it sends (a
//! trace header on each scheduled activity, a trace field in an input) would change recorded
//! commands and need patch markers. Instead, every span's place in a trace is *derived* from
//! identities the emitter already knows ([`ids`]):
//!
//! - A rollout's trace ID is a hash of its workflow ID `rollout/<ns>/<name>/<build>`: the trace
//!   of "rolling out build B of TWD ns/name". The watcher knows the namespace, name and build
//!   of the spec it signals, so its `signal spec_changed` span lands in that same trace.
//! - A run's span ID is a hash of workflow ID + run ID. An activity knows both from its
//!   activity info, so it becomes a child of its run's span ([`activity`]); a run continued as
//!   new is a child of the run it continues (the SDK tells the run it continued from).
//! - The run span itself is emitted by a workflow interceptor when the run closes, live, never
//!   during replay ([`workflow`]), with the run's start time from Temporal and its end at the
//!   closing workflow task's time.
//! - A TWD workflow (unbounded, one per TWD) gets one trace per run instead; the watcher's
//!   signal span links to the run it signalled (signal-with-start returns its run ID).
//!
//! Because IDs are derived, every replica emits spans of one rollout into the same trace at any
//! time, and a `traceidratio` sampler decides the same way for all of them. Temporal IDs use the
//! attribute names of the Temporal SDKs' own OpenTelemetry interceptors (`temporalWorkflowID`,
//! `temporalRunID`, `temporalActivityID`); ours start with `twc.`.
//!
//! Nothing here depends on the OpenTelemetry SDK: spans go to the [`Traces`] handle the binary
//! builds (`src/telemetry/traces.rs`), which exports them over OTLP.

pub mod activity;
pub mod ids;
pub mod workflow;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::SystemTime;

use opentelemetry::global::BoxedTracer;
use opentelemetry::trace::{
    Link, SpanBuilder, SpanContext, SpanKind, Status, TraceContextExt, Tracer,
};
use opentelemetry::{Context, KeyValue};
use twc_workflows::model::TwdRef;

/// Attribute: Temporal workflow ID (as the Temporal SDKs name it).
pub const WORKFLOW_ID: &str = "temporalWorkflowID";
/// Attribute: Temporal run ID.
pub const RUN_ID: &str = "temporalRunID";
/// Attribute: Temporal activity ID.
pub const ACTIVITY_ID: &str = "temporalActivityID";
/// Attribute: Temporal workflow type.
pub const WORKFLOW_TYPE: &str = "temporalWorkflowType";
/// Attribute: Temporal activity type.
pub const ACTIVITY_TYPE: &str = "temporalActivityType";
/// Attribute: activity attempt (1 for the first).
pub const ATTEMPT: &str = "temporalAttempt";
/// Attribute: Kubernetes namespace of the TWD.
pub const TWD_NAMESPACE: &str = "twc.twd.namespace";
/// Attribute: name of the TWD.
pub const TWD_NAME: &str = "twc.twd.name";
/// Attribute: build ID.
pub const BUILD_ID: &str = "twc.build_id";
/// Attribute: progressive rollout step (0-based), where the activity is about one.
pub const STEP: &str = "twc.rollout.step";
/// Attribute: how the span's work ended (`ok`, `error`, `cancelled`, `complete`, ...).
pub const OUTCOME: &str = "twc.outcome";
/// Attribute: what an activity returned, in one word where it says more than `ok`.
pub const RESULT: &str = "twc.result";

/// Where the engine's spans go: a tracer of the binary's tracer provider, shared.
#[derive(Clone)]
pub struct Traces {
    tracer: Arc<BoxedTracer>,
}

impl std::fmt::Debug for Traces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Traces")
    }
}

impl Traces {
    /// Spans through `tracer` (e.g. an OpenTelemetry SDK tracer).
    pub fn new<T>(tracer: T) -> Self
    where
        T: Tracer + Send + Sync + 'static,
        T::Span: Send + Sync + 'static,
    {
        Self {
            tracer: Arc::new(BoxedTracer::new(Box::new(tracer))),
        }
    }

    /// Records a finished span with explicit identity and times.
    pub fn record(&self, span: FinishedSpan) {
        let FinishedSpan {
            name,
            kind,
            trace_id,
            span_id,
            parent,
            start,
            end,
            attributes,
            links,
            error,
        } = span;
        let mut builder = SpanBuilder::from_name(name)
            .with_kind(kind)
            .with_start_time(start)
            .with_attributes(attributes)
            .with_links(links.into_iter().map(Link::with_context).collect());
        builder.span_id = span_id;
        builder.end_time = Some(end);
        if let Some(message) = error {
            builder.status = Status::error(message);
        }
        let parent_cx = match parent {
            Some(parent) => Context::new().with_remote_span_context(parent),
            None => {
                builder.trace_id = trace_id;
                Context::new()
            }
        };
        let span = self.tracer.build_with_context(builder, &parent_cx);
        drop(span);
    }
}

/// A span to record once its work is over.
pub struct FinishedSpan {
    /// Span name (low cardinality: an activity type, `rollout`, `twd`).
    pub name: Cow<'static, str>,
    /// Span kind.
    pub kind: SpanKind,
    /// Trace ID when there is no parent (random when `None`).
    pub trace_id: Option<opentelemetry::trace::TraceId>,
    /// Span ID, when derived (random otherwise).
    pub span_id: Option<opentelemetry::trace::SpanId>,
    /// Parent span, if any.
    pub parent: Option<SpanContext>,
    /// Start.
    pub start: SystemTime,
    /// End.
    pub end: SystemTime,
    /// Attributes.
    pub attributes: Vec<KeyValue>,
    /// Linked spans.
    pub links: Vec<SpanContext>,
    /// Error message, if the work failed.
    pub error: Option<String>,
}

/// TWD and build of a rollout workflow ID (`rollout/<ns>/<name>/<build>`).
pub fn parse_rollout_workflow_id(workflow_id: &str) -> Option<(TwdRef, String)> {
    let rest = workflow_id.strip_prefix("rollout/")?;
    let mut parts = rest.splitn(3, '/');
    let (namespace, name, build) = (parts.next()?, parts.next()?, parts.next()?);
    if namespace.is_empty() || name.is_empty() || build.is_empty() {
        return None;
    }
    Some((
        TwdRef {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        },
        build.to_owned(),
    ))
}

/// Attributes naming a TWD.
pub fn twd_attributes(twd: &TwdRef) -> [KeyValue; 2] {
    [
        KeyValue::new(TWD_NAMESPACE, twd.namespace.clone()),
        KeyValue::new(TWD_NAME, twd.name.clone()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rollout_workflow_ids_name_their_twd_and_build() {
        let twd = TwdRef {
            namespace: "team-a".into(),
            name: "hello".into(),
        };
        let id = twd.rollout_workflow_id("v2-abc123");
        assert_eq!(
            parse_rollout_workflow_id(&id),
            Some((twd, "v2-abc123".to_owned()))
        );
        assert_eq!(parse_rollout_workflow_id("twd/team-a/hello"), None);
        assert_eq!(parse_rollout_workflow_id("rollout/team-a/hello"), None);
    }
}
