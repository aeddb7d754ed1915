//! Deterministic code only: the rollout decisions as pure functions ([`plan`]) and the Temporal
//! workflows that sequence them. No I/O, no clocks, no randomness, no threads.

pub mod contract;
pub mod control;
pub mod model;
pub mod plan;
pub mod rollout_workflow;
pub mod twd_workflow;

/// Task queue of the engine's own workflows and activities.
pub const ENGINE_TASK_QUEUE: &str = "twc-engine";
