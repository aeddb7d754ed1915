//! Assembles the Temporal worker that hosts the engine: the connection to the engine namespace,
//! the rollout workflows and the activities with their clients.

pub mod engine;

pub use engine::{
    DEFAULT_MAX_CACHED_WORKFLOWS, EngineConfig, EngineTls, WorkerError, connect_engine,
    run_engine_worker, run_engine_worker_reporting,
};
