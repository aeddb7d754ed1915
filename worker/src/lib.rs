//! Assembles the Temporal worker that hosts the engine: the connection to the engine namespace,
//! the rollout workflows and the activities with their clients, and their OpenTelemetry spans.

pub mod engine;
pub mod traces;

pub use engine::{
    DEFAULT_MAX_CACHED_WORKFLOWS, DEFAULT_MAX_CONCURRENT_WAITS, EngineConfig, EngineTls,
    WorkerError, connect_engine, run_engine_worker, run_engine_worker_reporting,
};
