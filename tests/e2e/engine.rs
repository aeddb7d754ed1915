//! The rollout engine under stress, end to end: superseded rollouts, step-list and routing edits
//! made mid-rollout, a manager identity held by someone else, bad connections and workers that
//! never poll, a controller killed mid-rollout, and replica changes after completion. Each test
//! asserts TWD status and conditions, the Deployments and the routing read back from Temporal.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::cli::{kubectl, temporal};
use crate::harness::twd::{
    Routing, apply, condition, connection, deployments, get_twd, routing, target_build, wait_ready,
    wait_reason, worker,
};
use crate::harness::wait::wait_for;
use crate::harness::webhook::{Receiver, notifications_of, url_secret, wait_delivered};
use crate::harness::{env, kube_client, test_namespace};

/// Every TWD of these tests has this name.
const NAME: &str = "hello";
/// A rollout (or a sunset) finishes well within this.
const ROLLOUT: Duration = Duration::from_secs(150);
/// The controller identity (`twc run` default), which is also the manager identity it claims.
const CONTROLLER_IDENTITY: &str = "twc";

fn all_at_once() -> Value {
    json!({ "strategy": "AllAtOnce" })
}

/// A Progressive rollout with `(percent, pause)` steps.
fn progressive(steps: &[(u8, &str)]) -> Value {
    let steps: Vec<Value> = steps
        .iter()
        .map(|(pct, pause)| json!({ "rampPercentage": pct, "pauseDuration": pause }))
        .collect();
    json!({ "strategy": "Progressive", "steps": steps })
}

/// The standard test TWD, edited by `edit`.
fn twd_with(ns: &str, tag: &str, rollout: Value, edit: impl FnOnce(&mut Value)) -> Value {
    let mut manifest = worker(ns, NAME, tag, rollout);
    edit(&mut manifest);
    manifest
}

/// Sets env vars on the worker container of a TWD manifest.
fn container_env(manifest: &mut Value, vars: &[(&str, &str)]) {
    let env: Vec<Value> = vars
        .iter()
        .map(|(name, value)| json!({ "name": name, "value": value }))
        .collect();
    manifest["spec"]["template"]["spec"]["containers"][0]["env"] = Value::from(env);
}

/// Temporal worker deployment name of the test TWD.
fn deployment_name(ns: &str) -> String {
    format!("{ns}/{NAME}")
}

/// Waits until the routing read back from Temporal satisfies `accept`.
async fn wait_routing(
    deployment_name: &str,
    what: &str,
    accept: impl Fn(&Routing) -> bool,
) -> Routing {
    wait_for(&format!("{what} ({deployment_name})"), ROLLOUT, || async {
        let r = routing(deployment_name).await?;
        if accept(&r) {
            Ok(r)
        } else {
            Err(format!("{r:?}"))
        }
    })
    .await
}

/// The ramp percentage of `build`, rounded, if it is the ramping version.
fn ramp_of(r: &Routing, build: &str) -> Option<i64> {
    (r.ramping.as_deref() == Some(build)).then(|| r.percentage.round() as i64)
}

/// Waits until `build` is Temporal's ramping version at `pct`%, recording every distinct ramp
/// percentage of `build` seen on the way into `seen`.
async fn wait_ramp(deployment_name: &str, build: &str, pct: i64, seen: &Rc<RefCell<Vec<i64>>>) {
    wait_for(
        &format!("{build} ramping at {pct}% ({deployment_name})"),
        ROLLOUT,
        || {
            let seen = Rc::clone(seen);
            async move {
                let r = routing(deployment_name).await?;
                if let Some(live) = ramp_of(&r, build) {
                    let mut seen = seen.borrow_mut();
                    if seen.last() != Some(&live) {
                        seen.push(live);
                    }
                    if live == pct {
                        return Ok(());
                    }
                }
                Err(format!("{r:?}; ramps seen {:?}", seen.borrow()))
            }
        },
    )
    .await;
}

/// Waits until the TWD's status targets a build other than `previous` (a newly applied
/// template) and returns it.
async fn wait_new_target(client: &kube::Client, ns: &str, previous: &str) -> String {
    wait_for(
        &format!("TWD {ns}/{NAME} targets a new build"),
        ROLLOUT,
        || async {
            let twd = get_twd(client, ns, NAME).await?;
            let fresh =
                twd.status.as_ref().and_then(|s| s.observed_generation) == twd.metadata.generation;
            match target_build(&twd) {
                Some(build) if fresh && !build.is_empty() && build != previous => Ok(build),
                other => Err(format!("target {other:?}, fresh {fresh}")),
            }
        },
    )
    .await
}

/// Workflow executions matching a visibility query: (workflow ID, status such as `COMPLETED`).
async fn list_workflows(query: &str) -> Result<Vec<(String, String)>, String> {
    let out = temporal(&["workflow", "list", "--query", query, "--output", "json"]).await;
    if !out.success {
        return Err(out.stderr);
    }
    let text = out.stdout.trim();
    if text.is_empty() {
        return Ok(Vec::new());
    }
    let rows: Value = serde_json::from_str(text).map_err(|e| format!("{e}: {text}"))?;
    Ok(rows
        .as_array()
        .into_iter()
        .flatten()
        .map(|row| {
            let id = row["execution"]["workflowId"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let status = row["status"]
                .as_str()
                .unwrap_or_default()
                .trim_start_matches("WORKFLOW_EXECUTION_STATUS_")
                .to_owned();
            (id, status)
        })
        .collect())
}

/// Waits until the rollout workflow `workflow_id` has ended with search attribute
/// `TwcOutcome = outcome` (visibility is updated a moment after the run closes).
async fn wait_outcome(workflow_id: &str, outcome: &str) {
    wait_for(
        &format!("{workflow_id} ended with outcome {outcome}"),
        ROLLOUT,
        || async {
            let query = format!("WorkflowId = '{workflow_id}' AND TwcOutcome = '{outcome}'");
            let rows = list_workflows(&query).await?;
            match rows.first() {
                Some((_, status)) if status == "COMPLETED" || status == "TERMINATED" => Ok(()),
                other => Err(format!(
                    "{other:?}; latest run: {:?}",
                    workflow_status(workflow_id).await
                )),
            }
        },
    )
    .await;
}

/// Status of the latest run of a workflow (`RUNNING`, `COMPLETED`, `CANCELED`, ...).
async fn workflow_status(workflow_id: &str) -> Result<String, String> {
    let v = crate::harness::cli::describe_workflow(workflow_id).await?;
    Ok(v["workflowExecutionInfo"]["status"]
        .as_str()
        .unwrap_or_default()
        .trim_start_matches("WORKFLOW_EXECUTION_STATUS_")
        .to_owned())
}

/// A `temporal` CLI call that must succeed.
async fn temporal_ok(args: &[&str]) -> String {
    let out = temporal(args).await;
    assert!(
        out.success,
        "temporal {}: {}{}",
        args.join(" "),
        out.stdout,
        out.stderr
    );
    out.stdout
}

/// The versioned Deployments of the test TWD as (build ID, replicas), sorted.
async fn builds(client: &kube::Client, ns: &str) -> Vec<(String, Option<i32>)> {
    let mut builds: Vec<(String, Option<i32>)> = deployments(client, ns, NAME)
        .await
        .into_iter()
        .map(|(_, build, replicas)| (build, replicas))
        .collect();
    builds.sort();
    builds
}

/// Waits until exactly `expected` builds have Deployments (no others) and Temporal lists no
/// version outside `expected`.
async fn wait_only_builds(client: &kube::Client, ns: &str, expected: &[&str]) {
    let deployment_name = deployment_name(ns);
    wait_for(
        &format!("only builds {expected:?} remain in {ns}"),
        ROLLOUT,
        || async {
            let deps = builds(client, ns).await;
            let r = routing(&deployment_name).await?;
            let deps_ok = deps.len() == expected.len()
                && deps.iter().all(|(b, _)| expected.contains(&b.as_str()));
            let versions_ok = r.versions.iter().all(|v| expected.contains(&v.as_str()));
            if deps_ok && versions_ok {
                Ok(())
            } else {
                Err(format!("deployments {deps:?}; versions {:?}", r.versions))
            }
        },
    )
    .await;
}

/// Rolls out v1 with AllAtOnce and returns its build ID.
async fn first_version(client: &kube::Client, ns: &str) -> String {
    apply(&connection(ns)).await;
    apply(&worker(ns, NAME, "v1", all_at_once())).await;
    let twd = wait_ready(client, ns, NAME, ROLLOUT).await;
    let build = target_build(&twd).unwrap_or_default();
    assert!(build.starts_with("v1-"), "build ID {build}");
    wait_routing(&deployment_name(ns), "v1 Current", |r| {
        r.current.as_deref() == Some(build.as_str())
    })
    .await;
    build
}

/// Asserts both conditions are False with `reason` and returns the Progressing message.
async fn assert_blocked(client: &kube::Client, ns: &str, reason: &str) -> String {
    let (status, _, message) = wait_reason(client, ns, NAME, "Progressing", reason, ROLLOUT).await;
    assert_eq!(status, "False", "Progressing: {message}");
    let twd = get_twd(client, ns, NAME)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let ready = condition(&twd, "Ready").unwrap_or_default();
    assert_eq!(ready.0, "False", "Ready: {ready:?}");
    message
}

#[tokio::test]
async fn superseding_a_ramping_rollout_promotes_only_the_newest_build() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "supersede").await;
    let deployment_name = deployment_name(&ns);
    let v1 = first_version(&client, &ns).await;

    // v2 ramps at 10% and would hold there for ten minutes.
    apply(&worker(&ns, NAME, "v2", progressive(&[(10, "10m")]))).await;
    let v2 = wait_new_target(&client, &ns, &v1).await;
    let seen = Rc::new(RefCell::new(Vec::new()));
    wait_ramp(&deployment_name, &v2, 10, &seen).await;
    let (_, reason, _) = wait_reason(&client, &ns, NAME, "Progressing", "Ramping", ROLLOUT).await;
    assert_eq!(reason, "Ramping");

    // v3 supersedes it with short steps.
    apply(&worker(&ns, NAME, "v3", progressive(&[(20, "2s")]))).await;
    let v3 = wait_new_target(&client, &ns, &v2).await;
    assert!(v3.starts_with("v3-"), "build ID {v3}");

    // The superseded rollout ended cleanly, without promoting v2.
    wait_outcome(&format!("rollout/{ns}/{NAME}/{v2}"), "Superseded").await;

    let twd = wait_ready(&client, &ns, NAME, ROLLOUT).await;
    assert_eq!(target_build(&twd).as_deref(), Some(v3.as_str()));
    let status = twd.status.clone().unwrap_or_default();
    assert_eq!(
        status.rollout.as_ref().and_then(|r| r.workflow_id.clone()),
        Some(format!("rollout/{ns}/{NAME}/{v3}")),
        "status follows the newest rollout: {status:?}"
    );
    let r = wait_routing(&deployment_name, "v3 Current, nothing ramping", |r| {
        r.current.as_deref() == Some(v3.as_str()) && r.ramping.is_none()
    })
    .await;
    assert_ne!(r.current.as_deref(), Some(v2.as_str()));
    wait_outcome(&format!("rollout/{ns}/{NAME}/{v3}"), "Complete").await;

    // v2 and v1 are scaled away and deleted, Deployments and Temporal versions alike.
    wait_only_builds(&client, &ns, &[&v3]).await;
    let deps = deployments(&client, &ns, NAME).await;
    assert_eq!(deps.len(), 1, "{deps:?}");
    assert_eq!(deps[0].2, Some(1), "{deps:?}");
}

#[tokio::test]
async fn superseding_a_rollout_in_its_gate_stops_the_gate_workflows() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "supgate").await;
    let deployment_name = deployment_name(&ns);
    let v1 = first_version(&client, &ns).await;

    // No worker registers this workflow type: the gate runs until something stops it.
    let gated = json!({ "strategy": "AllAtOnce", "gate": { "workflowType": "NoWorkerRunsThis" } });
    apply(&worker(&ns, NAME, "v2", gated)).await;
    let v2 = wait_new_target(&client, &ns, &v1).await;
    let prefix = format!("gate/{deployment_name}/{v2}/");
    let gates = wait_for("v2's gate workflows run", ROLLOUT, || async {
        let rows = list_workflows(&format!("WorkflowId STARTS_WITH '{prefix}'")).await?;
        if !rows.is_empty() && rows.iter().all(|(_, s)| s == "RUNNING") {
            Ok(rows)
        } else {
            Err(format!("{rows:?}"))
        }
    })
    .await;

    apply(&worker(&ns, NAME, "v3", all_at_once())).await;
    let v3 = wait_new_target(&client, &ns, &v2).await;
    for (gate, _) in &gates {
        wait_for(&format!("gate {gate} stopped"), ROLLOUT, || async {
            match workflow_status(gate).await? {
                s if s == "CANCELED" || s == "TERMINATED" => Ok(()),
                other => Err(other),
            }
        })
        .await;
    }
    let twd = wait_ready(&client, &ns, NAME, ROLLOUT).await;
    assert_eq!(target_build(&twd).as_deref(), Some(v3.as_str()));
    let r = routing(&deployment_name)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.current.as_deref(), Some(v3.as_str()), "{r:?}");
    assert_eq!(r.ramping, None, "{r:?}");
    wait_outcome(&format!("rollout/{ns}/{NAME}/{v2}"), "Superseded").await;
    wait_only_builds(&client, &ns, &[&v3]).await;
}

#[tokio::test]
async fn step_list_edits_snap_to_the_step_grid() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "stepedit").await;
    let deployment_name = deployment_name(&ns);
    let v1 = first_version(&client, &ns).await;

    apply(&worker(
        &ns,
        NAME,
        "v2",
        progressive(&[(10, "10m"), (50, "10m")]),
    ))
    .await;
    let v2 = wait_new_target(&client, &ns, &v1).await;
    let seen = Rc::new(RefCell::new(Vec::new()));
    wait_ramp(&deployment_name, &v2, 10, &seen).await;

    // Steps edited: the live 10% is no step any more; the last step at or below it is 5%, whose
    // short pause leads on to 30%, which holds for ten minutes. (The pause is long enough for a
    // reader to see 5% although Temporal refuses reads for a moment after each routing change.)
    apply(&worker(
        &ns,
        NAME,
        "v2",
        progressive(&[(5, "10s"), (30, "10m"), (60, "10m")]),
    ))
    .await;
    wait_ramp(&deployment_name, &v2, 30, &seen).await;
    assert_eq!(*seen.borrow(), vec![10, 5, 30], "ramps in order");
    let twd = wait_for("status shows the 30% step", ROLLOUT, || async {
        let twd = get_twd(&client, &ns, NAME).await?;
        let target = twd.status.as_ref().and_then(|s| s.target_version.clone());
        let pct = target.as_ref().and_then(|t| t.ramp_percentage);
        if pct.is_some_and(|p| (p - 30.0).abs() < 0.01) {
            Ok(twd)
        } else {
            Err(format!("{:?}", twd.status))
        }
    })
    .await;
    assert_eq!(target_build(&twd).as_deref(), Some(v2.as_str()));
    let (status, reason, _) = condition(&twd, "Progressing").unwrap_or_default();
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Ramping"));

    // (A ramp changed by hand is snapped back at the rollout's resync: tests/e2e/held.rs.)
    let r = routing(&deployment_name)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.current.as_deref(), Some(v1.as_str()), "{r:?}");

    // Shorter pauses: the 30% step is the last one and its pause is over, so v2 goes Current.
    apply(&worker(
        &ns,
        NAME,
        "v2",
        progressive(&[(5, "3s"), (30, "3s")]),
    ))
    .await;
    let twd = wait_ready(&client, &ns, NAME, ROLLOUT).await;
    assert_eq!(target_build(&twd).as_deref(), Some(v2.as_str()));
    wait_routing(&deployment_name, "v2 Current, nothing ramping", |r| {
        r.current.as_deref() == Some(v2.as_str()) && r.ramping.is_none()
    })
    .await;
    let ramps = seen.borrow().clone();
    assert!(
        ramps.iter().all(|p| [10, 5, 30].contains(p)),
        "no ramp off the grid: {ramps:?}"
    );
}

#[tokio::test]
async fn manager_identity_held_by_someone_else_blocks_promotion_until_unset() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "identity").await;
    let deployment_name = deployment_name(&ns);
    let v1 = first_version(&client, &ns).await;
    let twd = get_twd(&client, &ns, NAME)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        twd.status.as_ref().and_then(|s| s.manager_identity.clone()),
        Some(CONTROLLER_IDENTITY.to_owned())
    );

    temporal_ok(&[
        "worker",
        "deployment",
        "manager-identity",
        "set",
        "--deployment-name",
        &deployment_name,
        "--manager-identity",
        "someone-else",
        "--yes",
    ])
    .await;
    apply(&worker(&ns, NAME, "v2", all_at_once())).await;
    let v2 = wait_new_target(&client, &ns, &v1).await;
    let message = assert_blocked(&client, &ns, "PlanExecutionFailed").await;
    assert!(message.contains("someone-else"), "{message}");
    assert!(message.contains("manager-identity unset"), "{message}");
    let r = routing(&deployment_name)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        r.current.as_deref(),
        Some(v1.as_str()),
        "not promoted: {r:?}"
    );
    assert!(r.versions.contains(&v2), "v2 registered: {r:?}");
    let deps = builds(&client, &ns).await;
    assert!(deps.iter().any(|(b, _)| *b == v2), "{deps:?}");

    temporal_ok(&[
        "worker",
        "deployment",
        "manager-identity",
        "unset",
        "--deployment-name",
        &deployment_name,
        "--yes",
    ])
    .await;
    let twd = wait_ready(&client, &ns, NAME, ROLLOUT).await;
    assert_eq!(target_build(&twd).as_deref(), Some(v2.as_str()));
    let r = wait_routing(&deployment_name, "v2 Current", |r| {
        r.current.as_deref() == Some(v2.as_str())
    })
    .await;
    assert_eq!(r.ramping, None);
    let twd = wait_for("status shows the reclaimed identity", ROLLOUT, || async {
        let twd = get_twd(&client, &ns, NAME).await?;
        let holder = twd.status.as_ref().and_then(|s| s.manager_identity.clone());
        if holder.as_deref() == Some(CONTROLLER_IDENTITY) {
            Ok(twd)
        } else {
            Err(format!("manager identity {holder:?}"))
        }
    })
    .await;
    assert_eq!(target_build(&twd).as_deref(), Some(v2.as_str()));
}

#[tokio::test]
async fn missing_api_key_secret_is_auth_secret_invalid_until_a_working_connection_is_used() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "apikey").await;
    apply(&connection(&ns)).await;
    apply(&json!({
        "apiVersion": "temporal.io/v1alpha1",
        "kind": "Connection",
        "metadata": { "name": "cloud", "namespace": ns },
        "spec": {
            "hostPort": env().temporal_address,
            "apiKeySecretRef": { "name": "cloud-api-key", "key": "key" }
        }
    }))
    .await;
    let use_cloud = |m: &mut Value| {
        m["spec"]["workerOptions"]["connectionRef"]["name"] = json!("cloud");
    };
    apply(&twd_with(&ns, "v1", all_at_once(), use_cloud)).await;
    let message = assert_blocked(&client, &ns, "AuthSecretInvalid").await;
    assert!(message.contains("cloud-api-key"), "{message}");
    assert!(builds(&client, &ns).await.is_empty(), "nothing created yet");

    // With the Secret the key is valid, but the dev server speaks no TLS: the client fails.
    apply(&json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": "cloud-api-key", "namespace": ns },
        "stringData": { "key": "not-a-real-key" }
    }))
    .await;
    let message = assert_blocked(&client, &ns, "TemporalClientCreationFailed").await;
    assert!(
        !message.contains("not-a-real-key"),
        "secret leaked: {message}"
    );

    // Back to the plaintext connection: the rollout goes through.
    apply(&worker(&ns, NAME, "v1", all_at_once())).await;
    let twd = wait_ready(&client, &ns, NAME, ROLLOUT).await;
    let build = target_build(&twd).unwrap_or_default();
    wait_routing(&deployment_name(&ns), "v1 Current", |r| {
        r.current.as_deref() == Some(build.as_str())
    })
    .await;
    assert_eq!(builds(&client, &ns).await, vec![(build, Some(1))]);
}

#[tokio::test]
async fn unreachable_temporal_is_client_creation_failed_until_the_host_port_is_fixed() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "unreach").await;
    let mut unreachable = connection(&ns);
    unreachable["spec"]["hostPort"] = json!("127.0.0.1:1");
    apply(&unreachable).await;
    apply(&worker(&ns, NAME, "v1", all_at_once())).await;
    let message = assert_blocked(&client, &ns, "TemporalClientCreationFailed").await;
    assert!(message.contains("127.0.0.1:1"), "{message}");
    assert!(builds(&client, &ns).await.is_empty(), "nothing created yet");

    apply(&connection(&ns)).await;
    let twd = wait_ready(&client, &ns, NAME, ROLLOUT).await;
    let build = target_build(&twd).unwrap_or_default();
    wait_routing(&deployment_name(&ns), "v1 Current", |r| {
        r.current.as_deref() == Some(build.as_str())
    })
    .await;
    assert_eq!(builds(&client, &ns).await, vec![(build, Some(1))]);
}

#[tokio::test]
async fn workers_that_never_poll_exceed_the_progress_deadline_with_the_crash_message() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "deadline").await;
    apply(&connection(&ns)).await;
    // A webhook told when a build misses its deadline.
    let receiver = Receiver::start().await;
    apply(&url_secret(&ns, "hook", &receiver.url)).await;
    let crashing = twd_with(&ns, "v1", all_at_once(), |m| {
        m["spec"]["progressDeadlineSeconds"] = json!(10);
        m["spec"]["notifications"] = notifications_of("ops", "hook", &["ProgressDeadlineExceeded"]);
        container_env(m, &[("SAMPLE_CRASH_AT_START", "1")]);
    });
    apply(&crashing).await;
    let message = assert_blocked(&client, &ns, "ProgressDeadlineExceeded").await;
    assert!(message.contains("exited with code 1"), "{message}");
    let told = wait_delivered(&receiver, 1, ROLLOUT).await;
    assert_eq!(
        (told[0]["event"].as_str(), told[0]["reason"].as_str()),
        (
            Some("ProgressDeadlineExceeded"),
            Some("ProgressDeadlineExceeded")
        ),
        "{told:#?}"
    );
    let twd = get_twd(&client, &ns, NAME)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let crashed = target_build(&twd).unwrap_or_default();
    let r = routing(&deployment_name(&ns))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.current, None, "{r:?}");

    // A fixed template rolls out; the crashed build is retired.
    let fixed = twd_with(&ns, "v1", all_at_once(), |m| {
        m["spec"]["progressDeadlineSeconds"] = json!(60);
    });
    apply(&fixed).await;
    let twd = wait_ready(&client, &ns, NAME, ROLLOUT).await;
    let build = target_build(&twd).unwrap_or_default();
    assert_ne!(build, crashed);
    wait_routing(&deployment_name(&ns), "the fixed build Current", |r| {
        r.current.as_deref() == Some(build.as_str())
    })
    .await;
    wait_only_builds(&client, &ns, &[&build]).await;
}

#[tokio::test]
async fn unknown_temporal_namespace_is_reported_clearly_until_fixed() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "badtns").await;
    apply(&connection(&ns)).await;
    let wrong = twd_with(&ns, "v1", all_at_once(), |m| {
        m["spec"]["workerOptions"]["temporalNamespace"] = json!("no-such-namespace");
    });
    apply(&wrong).await;
    let message = assert_blocked(&client, &ns, "TemporalStateFetchFailed").await;
    assert!(message.contains("'no-such-namespace'"), "{message}");
    assert!(
        message.contains("does not exist") || message.contains("not found"),
        "{message}"
    );
    assert!(builds(&client, &ns).await.is_empty(), "nothing created yet");

    apply(&worker(&ns, NAME, "v1", all_at_once())).await;
    let twd = wait_ready(&client, &ns, NAME, ROLLOUT).await;
    let build = target_build(&twd).unwrap_or_default();
    wait_routing(&deployment_name(&ns), "v1 Current", |r| {
        r.current.as_deref() == Some(build.as_str())
    })
    .await;
}

/// The controller's current process ID, from the sandbox's pid file.
fn controller_pid() -> Result<u32, String> {
    let file = env()
        .controller_pid_file
        .as_ref()
        .ok_or("the sandbox runs no controller")?;
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    text.trim()
        .parse()
        .map_err(|e| format!("{}: {text:?}: {e}", file.display()))
}

/// SIGKILLs the sandbox's controller and waits until the sandbox has restarted it (it
/// supervises the controller like a Deployment would, checking every second).
pub(crate) async fn kill_controller() {
    let pid = controller_pid().unwrap_or_else(|e| panic!("{e}"));
    let killed = tokio::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .await
        .unwrap_or_else(|e| panic!("kill -9 {pid}: {e}"));
    assert!(killed.success(), "kill -9 {pid}: {killed}");
    wait_for(
        "the sandbox to restart the killed controller",
        Duration::from_secs(20),
        || async {
            match controller_pid() {
                Ok(new) if new != pid => Ok(()),
                other => Err(format!("controller pid {other:?} (killed {pid})")),
            }
        },
    )
    .await;
}

#[tokio::test]
async fn controller_killed_mid_rollout_still_completes_it_exactly_once() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "sigkill").await;
    let deployment_name = deployment_name(&ns);
    let v1 = first_version(&client, &ns).await;

    let rollout = json!({
        "strategy": "Progressive",
        "steps": [
            { "rampPercentage": 30, "pauseDuration": "8s" },
            { "rampPercentage": 60, "pauseDuration": "5s" }
        ],
        "gate": { "workflowType": "GatePass" }
    });
    apply(&worker(&ns, NAME, "v2", rollout)).await;
    let v2 = wait_new_target(&client, &ns, &v1).await;
    let seen = Rc::new(RefCell::new(Vec::new()));
    wait_ramp(&deployment_name, &v2, 30, &seen).await;

    kill_controller().await;

    let twd = wait_ready(&client, &ns, NAME, Duration::from_secs(240)).await;
    assert_eq!(target_build(&twd).as_deref(), Some(v2.as_str()));
    let r = wait_routing(&deployment_name, "v2 Current", |r| {
        r.current.as_deref() == Some(v2.as_str()) && r.ramping.is_none()
    })
    .await;
    let ramps = seen.borrow().clone();
    assert!(
        ramps.iter().all(|p| [30, 60].contains(p)),
        "ramps {ramps:?}"
    );

    // Status agrees with Temporal.
    let status = twd.status.clone().unwrap_or_default();
    assert_eq!(
        status.current_version.as_ref().map(|v| v.build_id.clone()),
        r.current,
        "status current version"
    );
    // One gate workflow per task queue, each run once and passed.
    let gates = list_workflows(&format!(
        "WorkflowId STARTS_WITH 'gate/{deployment_name}/{v2}/'"
    ))
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let runs = status
        .target_version
        .as_ref()
        .map(|t| t.test_workflows.clone())
        .unwrap_or_default();
    assert!(!gates.is_empty(), "gate ran");
    assert_eq!(gates.len(), runs.len(), "gates {gates:?}; status {runs:?}");
    assert!(gates.iter().all(|(_, s)| s == "COMPLETED"), "{gates:?}");
    // One rollout workflow for v2, completed once.
    wait_outcome(&format!("rollout/{ns}/{NAME}/{v2}"), "Complete").await;
    let rollouts = list_workflows(&format!("WorkflowId = 'rollout/{ns}/{NAME}/{v2}'"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(rollouts.len(), 1, "{rollouts:?}");
    assert_eq!(rollouts[0].1, "COMPLETED", "{rollouts:?}");
    // Exactly one Deployment per build, none for builds Temporal does not know.
    let deps = deployments(&client, &ns, NAME).await;
    for build in [&v1, &v2] {
        let of_build: Vec<_> = deps.iter().filter(|d| d.1 == *build).collect();
        assert!(of_build.len() <= 1, "one Deployment per build: {deps:?}");
    }
    assert!(deps.iter().any(|d| d.1 == v2), "{deps:?}");
    assert!(
        deps.iter().all(|d| r.versions.contains(&d.1)),
        "deployments {deps:?}, versions {:?}",
        r.versions
    );
}

#[tokio::test]
async fn replicas_changed_after_completion_scale_the_deployment_without_a_new_version() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "replicas").await;
    let deployment_name = deployment_name(&ns);
    let v1 = first_version(&client, &ns).await;
    assert_eq!(builds(&client, &ns).await, vec![(v1.clone(), Some(1))]);
    let generation = get_twd(&client, &ns, NAME)
        .await
        .map(|t| t.metadata.generation)
        .unwrap_or_else(|e| panic!("{e}"));

    let scaled = twd_with(&ns, "v1", all_at_once(), |m| {
        m["spec"]["replicas"] = json!(2)
    });
    apply(&scaled).await;
    wait_for("the Deployment is scaled to 2", ROLLOUT, || async {
        match builds(&client, &ns).await.as_slice() {
            [(build, Some(2))] if *build == v1 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let twd = wait_ready(&client, &ns, NAME, ROLLOUT).await;
    assert_ne!(
        twd.metadata.generation, generation,
        "a new generation was observed"
    );
    assert_eq!(target_build(&twd).as_deref(), Some(v1.as_str()));
    let r = routing(&deployment_name)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.current.as_deref(), Some(v1.as_str()), "{r:?}");
    assert_eq!(r.versions, vec![v1.clone()], "no new version: {r:?}");
    let pods = kubectl(&["get", "deploy", "-n", &ns, "-o", "json"], None).await;
    assert!(pods.success, "{}", pods.stderr);
    let list: Value = serde_json::from_str(&pods.stdout).unwrap_or_default();
    assert_eq!(
        list["items"].as_array().map(Vec::len),
        Some(1),
        "one Deployment"
    );
}
