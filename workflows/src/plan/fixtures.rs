//! Builders for the plan tests: small, valid observations that each test bends to its case.

use twc_crds::worker_deployment::{RolloutStrategy, VersionState};

use crate::model::{
    DeploymentView, Observation, SpecView, StepView, TemporalState, TemporalVersion, UnixMillis,
};

/// The build every test rolls out.
pub const NEW: &str = "v2-bbbbbbbbbb";
/// The build that is Current before the rollout.
pub const OLD: &str = "v1-aaaaaaaaaa";

/// Seconds to milliseconds.
pub const fn secs(s: i64) -> UnixMillis {
    s * 1000
}

/// A valid spec targeting [`NEW`].
pub fn spec(strategy: RolloutStrategy) -> SpecView {
    SpecView {
        generation: 3,
        uid: "uid-1".into(),
        namespace: "demo".into(),
        deleting: false,
        target_build_id: NEW.into(),
        target_deployment_name: deployment_name(NEW),
        strategy,
        steps: Vec::new(),
        gate_workflow_type: None,
        paused: false,
        rollback_window_ms: secs(3600),
        progress_deadline_ms: secs(600),
        replicas: Some(2),
        scaledown_delay_ms: secs(3600),
        delete_delay_ms: secs(24 * 3600),
        connection_name: "dev".into(),
        temporal_namespace: "default".into(),
        invalid: Vec::new(),
        drain: None,
        analysis: None,
        autoscaling: None,
        adopted_build: None,
        replay_check: None,
    }
}

/// Progressive steps from `(percent, pause seconds)` pairs.
pub fn steps(pairs: &[(u8, i64)]) -> Vec<StepView> {
    pairs
        .iter()
        .map(|&(ramp_percentage, pause)| StepView {
            ramp_percentage,
            pause_ms: secs(pause),
        })
        .collect()
}

/// Name of a build's Deployment.
pub fn deployment_name(build: &str) -> String {
    format!("hello-{build}")
}

/// A healthy Deployment of `build` with 2 replicas.
pub fn deployment(build: &str) -> DeploymentView {
    DeploymentView {
        name: deployment_name(build),
        build_id: build.into(),
        replicas: Some(2),
        status_replicas: 2,
        ready_replicas: 2,
        available: true,
        available_since: Some(secs(5)),
        problem: None,
        deleting: false,
    }
}

/// A Deployment of `build` scaled to zero.
pub fn scaled_to_zero(build: &str) -> DeploymentView {
    DeploymentView {
        replicas: Some(0),
        status_replicas: 0,
        ready_replicas: 0,
        ..deployment(build)
    }
}

/// A version as Temporal reports it, with a known drainage status.
pub fn version(build: &str, state: VersionState) -> TemporalVersion {
    TemporalVersion {
        build_id: build.into(),
        state,
        drained_since: None,
        drainage_known: true,
        last_current_at: None,
        deactivated_at: None,
    }
}

/// Temporal with [`OLD`] Current and nothing ramping.
pub fn temporal_with_old_current() -> TemporalState {
    TemporalState {
        exists: true,
        current_build_id: Some(OLD.into()),
        versions: vec![version(OLD, VersionState::Current)],
        manager_identity: "twc/ns-uid".into(),
        last_modifier_identity: "twc/ns-uid".into(),
        conflict_token: "dG9rZW4=".into(),
        ..TemporalState::default()
    }
}

/// An observation of `spec` with the given Deployments and Temporal state.
pub fn observation(
    spec: SpecView,
    deployments: Vec<DeploymentView>,
    temporal: TemporalState,
) -> Observation {
    Observation {
        spec: Some(spec),
        deployments,
        temporal: Ok(temporal),
        observed_at: 0,
    }
}
