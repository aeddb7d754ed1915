//! Deterministic code only: the rollout decisions as pure functions ([`plan`]) and the Temporal
//! workflows that sequence them. No I/O, no clocks, no randomness, no threads.

pub mod contract;
pub mod control;
pub mod model;
pub mod notify_workflow;
pub mod plan;
pub mod rollout_workflow;
mod support;
pub mod twd_workflow;

/// Task queue of the engine's own workflows and activities.
pub const ENGINE_TASK_QUEUE: &str = "twc-engine";

/// Suffix of the task queue of the engine's waiting activities (`wait_for_pollers`,
/// `run_gate`): `<engine task queue>-waits`, served by a worker of its own with its own
/// activity slots, so rollouts that wait never hold the slots the others need.
pub const WAITS_QUEUE_SUFFIX: &str = "-waits";

/// The task queue of the waiting activities of workflows on `task_queue`.
pub fn waits_task_queue(task_queue: &str) -> String {
    format!("{task_queue}{WAITS_QUEUE_SUFFIX}")
}

/// History events after which an engine workflow continues as new, whatever signals arrived
/// (it also does when Temporal suggests it, at about 4,000 events by default). Far below
/// Temporal's hard limit of 51,200 events, so a rollout can hold a step for weeks.
pub const DEFAULT_HISTORY_EVENT_BOUND: u32 = 10_000;

/// History events after which a `twd` run (`short-runs`) or a `rollout` run
/// (`short-rollout-runs`) continues as new; a lower `--history-event-bound` wins. A cached run
/// keeps the capacity of the last history the SDK handed it (2,024 bytes an event,
/// temporalio-protos 0.10.2): after a replay from the start, as every resync of a fleet larger
/// than the worker's workflow cache is, that is the whole run. 500 TWD turns kept up to ~6 MB a
/// cached run, a rollout held for days up to ~8 MB at Temporal's suggestion (~4,000 events);
/// 400 events keep under 1 MB. An idle TWD pays for it with one continue-as-new every ~5 hours
/// (about 65 turns at the default resync), a held rollout about as often (72 events an hour).
pub const RUN_EVENT_BOUND: u32 = 400;
