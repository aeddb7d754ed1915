//! Deterministic code only: the rollout decisions as pure functions ([`plan`]) and the Temporal
//! workflows that sequence them. No I/O, no clocks, no randomness, no threads.

pub mod contract;
pub mod control;
pub mod model;
pub mod plan;
pub mod rollout_workflow;
mod support;
pub mod twd_workflow;

/// Task queue of the engine's own workflows and activities.
pub const ENGINE_TASK_QUEUE: &str = "twc-engine";

/// History events after which an engine workflow continues as new, whatever signals arrived
/// (it also does when Temporal suggests it, at about 4,000 events by default). Far below
/// Temporal's hard limit of 51,200 events, so a rollout can hold a step for weeks.
pub const DEFAULT_HISTORY_EVENT_BOUND: u32 = 10_000;
