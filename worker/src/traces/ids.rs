//! Trace and span IDs derived from Temporal identities (see the [module doc](super)): SHA-256
//! of a versioned, domain-separated string, truncated to 16 bytes (trace) or 8 bytes (span).

use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
use sha2::{Digest, Sha256};

/// Prefix of every hashed string; a new scheme gets a new prefix.
const SCHEME: &str = "twc-trace/v1";

fn digest(kind: &str, parts: &[&str]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(SCHEME.as_bytes());
    hasher.update([0]);
    hasher.update(kind.as_bytes());
    for part in parts {
        hasher.update([0]);
        hasher.update(part.as_bytes());
    }
    hasher.finalize().into()
}

fn trace_id(kind: &str, parts: &[&str]) -> TraceId {
    let digest = digest(kind, parts);
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    // All zeros is the invalid ID; a 2^-128 chance, still never emitted.
    if bytes == [0; 16] {
        bytes[15] = 1;
    }
    TraceId::from_bytes(bytes)
}

fn span_id(kind: &str, parts: &[&str]) -> SpanId {
    let digest = digest(kind, parts);
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    if bytes == [0; 8] {
        bytes[7] = 1;
    }
    SpanId::from_bytes(bytes)
}

/// The trace of a rollout workflow ID (`rollout/<ns>/<name>/<build>`): every run of it, its
/// activities and the watcher's signals for that build.
pub fn rollout_trace_id(rollout_workflow_id: &str) -> TraceId {
    trace_id("rollout", &[rollout_workflow_id])
}

/// The trace of one run of a workflow: the rollout trace for rollout workflows, one trace per
/// run for the others (a TWD workflow lives as long as its TWD).
pub fn run_trace_id(workflow_id: &str, run_id: &str) -> TraceId {
    if super::parse_rollout_workflow_id(workflow_id).is_some() {
        rollout_trace_id(workflow_id)
    } else {
        trace_id("run-trace", &[workflow_id, run_id])
    }
}

/// The span of one workflow run.
pub fn run_span_id(workflow_id: &str, run_id: &str) -> SpanId {
    span_id("run", &[workflow_id, run_id])
}

/// The span context of one workflow run, as a remote parent or link target. Marked sampled:
/// the exporter's sampler decides on the trace ID alone, the same way for every span of it.
pub fn run_span_context(workflow_id: &str, run_id: &str) -> SpanContext {
    SpanContext::new(
        run_trace_id(workflow_id, run_id),
        run_span_id(workflow_id, run_id),
        TraceFlags::SAMPLED,
        true,
        TraceState::NONE,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROLLOUT: &str = "rollout/team-a/hello/v2-abc123";

    #[test]
    fn ids_are_stable_across_processes_and_releases() {
        // Replicas and restarts must agree, and so must releases: pinned (SHA-256 prefixes of
        // "twc-trace/v1\0rollout\0<id>" and "twc-trace/v1\0run\0<id>\0<run>").
        assert_eq!(
            rollout_trace_id(ROLLOUT).to_string(),
            "c31c51b0860a0275a64d90d931693dfc"
        );
        assert_eq!(run_span_id(ROLLOUT, "r1").to_string(), "1733c0d77b2fdc76");
    }

    #[test]
    fn every_run_of_a_rollout_shares_its_trace_and_has_its_own_span() {
        let first = run_span_context(ROLLOUT, "run-1");
        let continued = run_span_context(ROLLOUT, "run-2");
        assert_eq!(first.trace_id(), rollout_trace_id(ROLLOUT));
        assert_eq!(continued.trace_id(), first.trace_id());
        assert_ne!(continued.span_id(), first.span_id());
        assert!(first.is_valid() && first.is_remote() && first.is_sampled());
    }

    #[test]
    fn other_builds_and_twd_workflow_runs_get_traces_of_their_own() {
        let other_build = rollout_trace_id("rollout/team-a/hello/v3-def456");
        assert_ne!(other_build, rollout_trace_id(ROLLOUT));
        let twd_run_1 = run_trace_id("twd/team-a/hello", "run-1");
        let twd_run_2 = run_trace_id("twd/team-a/hello", "run-2");
        assert_ne!(twd_run_1, twd_run_2);
        assert_ne!(twd_run_1, rollout_trace_id(ROLLOUT));
        // Not the run span's digest either.
        let span = run_span_id("twd/team-a/hello", "run-1").to_bytes();
        assert_ne!(twd_run_1.to_bytes()[..8], span);
    }

    #[test]
    fn parts_are_separated_so_shifted_boundaries_differ() {
        assert_ne!(run_span_id("a/b", "c"), run_span_id("a", "b/c"));
        assert_ne!(run_span_id("ab", "c"), run_span_id("a", "bc"));
    }
}
