//! Replays every recorded history in `tests/histories/` against the current workflow code and
//! fails on any nondeterminism: the controller's workflows live for months, so a change that
//! cannot replay their existing histories breaks running rollouts on upgrade.
//!
//! Fixtures are `<type>-<scenario>.json`, where `<type>` is the workflow type (`twd`,
//! `rollout`), in the JSON written by `temporal workflow show --output json`. Record new ones
//! with `scripts/record-histories.sh` (see `workflows/README.md`).

mod history_json;

use std::path::{Path, PathBuf};

use temporalio_client::WorkflowHistory;
use temporalio_common::protos::temporal::api::history::v1::History;
use temporalio_common::protos::temporal::api::history::v1::history_event::Attributes;
use temporalio_sdk::workflow_replayer::{
    WorkflowReplayError, WorkflowReplayFailure, WorkflowReplayer, WorkflowReplayerOptions,
};
use twc_workflows::notify_workflow::NotifyWorkflow;
use twc_workflows::rollout_workflow::RolloutWorkflow;
use twc_workflows::twd_workflow::TwdWorkflow;

/// Workflow types the engine registers; each needs at least one fixture.
const WORKFLOW_TYPES: &[&str] = &["twd", "rollout", "notify"];

struct Fixture {
    /// File name.
    name: String,
    /// Workflow type from its first event.
    workflow_type: String,
    history: History,
}

fn histories_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/histories")
}

/// Every `*.json` in `tests/histories/` and in its per-release folders (`tests/histories/v0.1.0/`),
/// in path order.
fn load_fixtures() -> Vec<Fixture> {
    let mut paths = Vec::new();
    json_files(&histories_dir(), &mut paths);
    paths.sort();
    paths.iter().map(|path| load_fixture(path)).collect()
}

fn json_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading fixture folder {}: {e}", dir.display()));
    for entry in entries {
        let path = entry
            .unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()))
            .path();
        if path.is_dir() {
            json_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "json") {
            out.push(path);
        }
    }
}

fn load_fixture(path: &Path) -> Fixture {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("reading fixture {name}: {e}"));
    let history = history_json::decode_history(&bytes)
        .unwrap_or_else(|e| panic!("fixture {name} is not a readable history: {e}"));
    let workflow_type = match history.events.first().and_then(|e| e.attributes.as_ref()) {
        Some(Attributes::WorkflowExecutionStartedEventAttributes(started)) => started
            .workflow_type
            .as_ref()
            .map(|t| t.name.clone())
            .unwrap_or_default(),
        _ => panic!("fixture {name}: the first event is not WorkflowExecutionStarted"),
    };
    assert!(
        name.starts_with(&format!("{workflow_type}-")),
        "fixture {name} holds a {workflow_type:?} workflow: name it {workflow_type}-<scenario>.json"
    );
    assert!(
        WORKFLOW_TYPES.contains(&workflow_type.as_str()),
        "fixture {name}: workflow type {workflow_type:?} is not one the engine registers"
    );
    let ids_in_order = history
        .events
        .iter()
        .zip(1..)
        .all(|(event, id)| event.event_id == id);
    assert!(
        ids_in_order,
        "fixture {name}: event IDs are not 1, 2, 3, ... (truncated or edited by hand?)"
    );
    Fixture {
        name,
        workflow_type,
        history,
    }
}

/// The same workflow registrations as the engine worker (`twc_worker::engine`).
fn replayer() -> WorkflowReplayer {
    let options = WorkflowReplayerOptions::new()
        .register_workflow::<TwdWorkflow>()
        .expect("registering TwdWorkflow for replay")
        .register_workflow::<RolloutWorkflow>()
        .expect("registering RolloutWorkflow for replay")
        .register_workflow::<NotifyWorkflow>()
        .expect("registering NotifyWorkflow for replay")
        .build();
    WorkflowReplayer::new(options).expect("creating the workflow replayer")
}

fn describe(error: &WorkflowReplayError) -> String {
    match error {
        WorkflowReplayError::Replay(WorkflowReplayFailure::Nondeterminism { message }) => {
            format!("NONDETERMINISM: {}", core_message(message))
        }
        other => other.to_string(),
    }
}

/// Core wraps its `[TMPRL1100] Nondeterminism error: ...` text in the debug form of a failure
/// proto; the text alone is what a reader needs.
fn core_message(message: &str) -> &str {
    message
        .find("[TMPRL")
        .map(|start| &message[start..])
        .and_then(|rest| rest.find("\", ").map(|end| &rest[..end]))
        .unwrap_or(message)
}

#[test]
fn every_workflow_type_has_fixtures() {
    let fixtures = load_fixtures();
    for workflow_type in WORKFLOW_TYPES {
        assert!(
            fixtures.iter().any(|f| f.workflow_type == *workflow_type),
            "no recorded history of workflow type {workflow_type:?} in {}",
            histories_dir().display()
        );
    }
}

#[tokio::test]
async fn recorded_histories_replay_against_current_workflow_code() {
    let fixtures = load_fixtures();
    assert!(
        !fixtures.is_empty(),
        "no fixtures in {}",
        histories_dir().display()
    );
    let replayer = replayer();
    let mut failures = Vec::new();
    for fixture in &fixtures {
        let history = WorkflowHistory::from(fixture.history.clone());
        match replayer.replay_workflow(history).await {
            Ok(()) => eprintln!(
                "replayed {} ({} events): ok",
                fixture.name,
                fixture.history.events.len()
            ),
            Err(error) => {
                let line = format!("{}: {}", fixture.name, describe(&error));
                eprintln!("replayed {line}");
                failures.push(line);
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} recorded histories no longer replay against the workflow code. Running \
         workflows with such histories would break on upgrade: guard the change with \
         ctx.patched(\"...\") or ship it as a new workflow type (see workflows/README.md).\n{}",
        failures.len(),
        fixtures.len(),
        failures.join("\n")
    );
}
