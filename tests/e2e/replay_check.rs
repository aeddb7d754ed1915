//! Replay-checked rollouts (`spec.rollout.replayCheck`, issue #28), end to end: real
//! AutoUpgrade workflows of v1 (open mid-history and completed), a v2 whose workflow commands
//! are reordered (`SAMPLE_NONDETERMINISTIC`) aborted by the check before any routing change,
//! and a v3 that changes only activity code passing it and taking the open workflows over
//! (the Subscription's next task, its `end` signal, runs on v3); a v4 whose check cannot run,
//! held until its check is fixed and `retry` runs it again; a v5 that does not replay, rolled
//! out anyway under `dryRun`.
//! The check's Job runs `sample-worker replay` through the pod runner.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;

use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use twc_crds::BuildId;
use twc_crds::naming::versioned_deployment_name;

use crate::chaos::cluster::Cluster;
use crate::drain::{latest_run, start_workflow_with, wait_runs};
use crate::engine::kill_controller;
use crate::harness::controls::{Via, events, send, wait_event};
use crate::harness::twd::{
    apply, connection, get_twd, routing, target_build, wait_ready, wait_reason, worker,
};
use crate::harness::wait::wait_for;
use crate::harness::webhook::{self, Receiver, notifications_of, url_secret, wait_delivered};
use crate::harness::{env, kube_client, test_namespace};

const ROLLOUT: Duration = Duration::from_secs(180);

/// An AllAtOnce TWD of AutoUpgrade sample workers on `task_queue`, replay-checked, with more
/// container environment `vars`.
fn checked_worker(ns: &str, tag: &str, task_queue: &str, vars: &[(&str, &str)]) -> Value {
    let mut manifest = worker(ns, "hello", tag, json!({ "strategy": "AllAtOnce" }));
    manifest["spec"]["rollout"]["replayCheck"] = json!({ "args": ["replay"], "timeout": "90s" });
    let mut env = vec![
        json!({ "name": "SAMPLE_TASK_QUEUE", "value": task_queue }),
        json!({ "name": "SAMPLE_VERSIONING_BEHAVIOR", "value": "auto-upgrade" }),
    ];
    env.extend(
        vars.iter()
            .map(|(name, value)| json!({ "name": name, "value": value })),
    );
    manifest["spec"]["template"]["spec"]["containers"][0]["env"] = Value::from(env);
    manifest
}

/// The names of every replay Job `namespace` has had since the call, kept by a watch that
/// runs until the test ends (a Job deleted later stays in the set).
fn watch_job_names(client: kube::Client, namespace: &str) -> Arc<Mutex<BTreeSet<String>>> {
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let config = watcher::Config::default().labels("twc.temporal.io/replay-check=true");
    let events = watcher::watcher(Api::<Job>::namespaced(client, namespace), config);
    let names = Arc::clone(&seen);
    tokio::spawn(async move {
        let mut events = std::pin::pin!(events.default_backoff().applied_objects());
        while let Some(job) = events.next().await {
            if let (Ok(job), Ok(mut names)) = (job, names.lock()) {
                names.extend(job.metadata.name);
            }
        }
    });
    seen
}

#[tokio::test]
async fn a_non_deterministic_build_is_aborted_before_any_workflow_moves_and_a_safe_one_passes() {
    let client = kube_client().await;
    let cluster = Cluster::shared().await;
    let ns = test_namespace(&client, "replay").await;
    let tq = format!("replay-{ns}");
    let deployment_name = format!("{ns}/hello");
    // A webhook that wants only the replay check's notifications.
    let receiver = Receiver::start().await;
    apply(&url_secret(&ns, "hook", &receiver.url)).await;
    let put = |mut manifest: Value| {
        manifest["spec"]["notifications"] = notifications_of("ops", "hook", &["ReplayCheck"]);
        async move { apply(&manifest).await }
    };
    apply(&connection(&ns)).await;
    put(checked_worker(&ns, "v1", &tq, &[])).await;
    let v1 = target_build(&wait_ready(&client, &ns, "hello", ROLLOUT).await).expect("v1 build");

    // AutoUpgrade work of v1: two completed HelloWorlds, a Sleeper open mid-history (its timer
    // started) and a Subscription waiting for its `end` signal.
    let hellos = [format!("{ns}-hello-1"), format!("{ns}-hello-2")];
    for id in &hellos {
        start_workflow_with(&cluster, "HelloWorld", &tq, id, Some("\"replay\"")).await;
    }
    let sleeper = format!("{ns}-sleeper");
    start_workflow_with(&cluster, "Sleeper", &tq, &sleeper, Some("3600")).await;
    let subscription = format!("{ns}-subscription");
    start_workflow_with(&cluster, "Subscription", &tq, &subscription, Some("{}")).await;
    wait_runs(&cluster, &hellos, "COMPLETED", "v1").await;
    let open = [sleeper.clone(), subscription.clone()];
    wait_runs(&cluster, &open, "RUNNING", "v1").await;

    // Every replay Job the namespace ever has, watched from before the first one: an aborted
    // build's Deployment (and the Jobs it owns) may be deleted seconds after the abort.
    let jobs_seen = watch_job_names(client.clone(), &ns);

    // v2 reorders the commands of both workflow types: the check replays v1's histories with
    // v2's image and aborts it, routing untouched.
    put(checked_worker(
        &ns,
        "v2",
        &tq,
        &[("SAMPLE_NONDETERMINISTIC", "HelloWorld,Sleeper")],
    ))
    .await;
    let (_, _, message) =
        wait_reason(&client, &ns, "hello", "Ready", "ReplayCheckFailed", ROLLOUT).await;
    eprintln!("replay check: v2: {message}");
    assert!(
        message.contains("Nondeterminism") && message.contains("aborted before any workflow moved"),
        "{message}"
    );
    assert!(
        [&hellos[0], &hellos[1], &sleeper]
            .iter()
            .any(|id| message.contains(id.as_str())),
        "the condition names the workflow: {message}"
    );
    let v2 = target_build(&get_twd(&client, &ns, "hello").await.expect("the TWD")).expect("v2");
    assert_ne!(v2, v1);
    let routed = routing(&deployment_name).await.expect("routing");
    assert_eq!(
        (routed.current.as_deref(), routed.ramping.as_deref()),
        (Some(v1.as_str()), None),
        "routing unchanged"
    );
    let (_, _, warned) = wait_event(&client, &ns, "hello", "ReplayCheckFailed", &v2, ROLLOUT).await;
    assert!(
        warned.contains("cannot replay") && warned.contains("Routing: new workflows go to build"),
        "{warned}"
    );
    // `retry` rolls v2 out again and checks it afresh (a second Job, not the first one's
    // verdict read back), which aborts it again: still nothing moved.
    send(Via::Cli, "retry", &ns, "hello").await;
    let v2_jobs = format!(
        "{}-replay-",
        versioned_deployment_name("hello", &BuildId::new(&v2))
    );
    wait_for("a second replay Job of v2", ROLLOUT, || async {
        let seen = jobs_seen.lock().map_err(|e| e.to_string())?;
        match seen
            .iter()
            .filter(|name| name.starts_with(&v2_jobs))
            .count()
        {
            2 => Ok(()),
            _ => Err(format!("replay Jobs seen: {seen:?}")),
        }
    })
    .await;
    wait_reason(&client, &ns, "hello", "Ready", "ReplayCheckFailed", ROLLOUT).await;
    // No AutoUpgrade workflow ran a task on v2.
    for id in &open {
        let (status, build) = latest_run(&cluster, id).await.expect("the run");
        assert_eq!(
            (status.as_str(), build.as_str()),
            ("RUNNING", v1.as_str()),
            "{id}"
        );
    }

    // v3 changes only what an activity does: the same histories replay, it becomes Current
    // and the open AutoUpgrade workflows go on there.
    put(checked_worker(
        &ns,
        "v3",
        &tq,
        &[("SAMPLE_GREET_DELAY_MS", "1")],
    ))
    .await;
    let twd = wait_ready(&client, &ns, "hello", ROLLOUT).await;
    let v3 = target_build(&twd).expect("v3 build");
    assert!(v3 != v1 && v3 != v2);
    let (_, _, passed) = wait_event(&client, &ns, "hello", "ReplayCheckPassed", &v3, ROLLOUT).await;
    eprintln!("replay check: v3: {passed}");
    assert!(
        passed.contains("4 histories replayed") && passed.contains("HelloWorld"),
        "{passed}"
    );
    let out = cluster
        .temporal(&[
            "workflow",
            "signal",
            "--workflow-id",
            &subscription,
            "--name",
            "end",
        ])
        .await;
    assert!(out.success, "signal end: {}", out.stderr);
    wait_runs(
        &cluster,
        std::slice::from_ref(&subscription),
        "COMPLETED",
        "v3",
    )
    .await;
    let all = events(&client, &ns, "hello").await;
    assert!(
        !all.iter()
            .any(|(_, reason, m)| reason == "ReplayCheckFailed" && m.contains(&v3)),
        "{all:?}"
    );

    // v4's check cannot run (its command is nowhere): inconclusive after the Job's timeout,
    // with the pod's reason, and the rollout holds; routing stays on v3.
    let mut v4 = checked_worker(&ns, "v4", &tq, &[]);
    v4["spec"]["rollout"]["replayCheck"] =
        json!({ "command": ["no-such-replayer"], "timeout": "10s" });
    put(v4).await;
    let (_, _, message) = wait_reason(
        &client,
        &ns,
        "hello",
        "Progressing",
        "ReplayCheckInconclusive",
        ROLLOUT,
    )
    .await;
    eprintln!("replay check: v4: {message}");
    assert!(
        message.contains("could not start (BinaryNotFound") && message.contains("retry"),
        "{message}"
    );
    let routed = routing(&deployment_name).await.expect("routing");
    assert_eq!(
        (routed.current.as_deref(), routed.ramping.as_deref()),
        (Some(v3.as_str()), None),
        "an inconclusive check moves nothing"
    );

    // The check's command fixed (spec.rollout only: still build v4) and `retry` sent: the
    // check runs again as its next attempt (a second Job), passes, and v4 becomes Current.
    let held = target_build(&get_twd(&client, &ns, "hello").await.expect("the TWD")).expect("v4");
    put(checked_worker(&ns, "v4", &tq, &[])).await;
    send(Via::Cli, "retry", &ns, "hello").await;
    let twd = wait_ready(&client, &ns, "hello", ROLLOUT).await;
    let v4 = target_build(&twd).expect("v4 build");
    assert_eq!(v4, held, "the fixed check is the same build's");
    let (_, _, passed) = wait_event(&client, &ns, "hello", "ReplayCheckPassed", &v4, ROLLOUT).await;
    eprintln!("replay check: v4 retried: {passed}");
    let routed = routing(&deployment_name).await.expect("routing");
    assert_eq!(routed.current.as_deref(), Some(v4.as_str()));
    let deployment = versioned_deployment_name("hello", &BuildId::new(&v4));
    let mut v4_jobs: Vec<String> = jobs_seen
        .lock()
        .expect("the Jobs seen")
        .iter()
        .filter(|name| name.starts_with(&format!("{deployment}-replay-")))
        .cloned()
        .collect();
    v4_jobs.sort_by_key(|name| name.ends_with("-1"));
    assert!(
        v4_jobs.len() == 2 && v4_jobs[0].ends_with("-0") && v4_jobs[1].ends_with("-1"),
        "one Job per attempt of v4's check: {v4_jobs:?}"
    );

    // A dry run: v5 reorders HelloWorld's commands, the check finds it on a HelloWorld that
    // completed on v4, says so in a Warning, and the rollout goes on: v5 becomes Current.
    let on_v4 = format!("{ns}-hello-3");
    start_workflow_with(&cluster, "HelloWorld", &tq, &on_v4, Some("\"dry\"")).await;
    wait_runs(&cluster, std::slice::from_ref(&on_v4), "COMPLETED", "v4").await;
    let mut v5 = checked_worker(&ns, "v5", &tq, &[("SAMPLE_NONDETERMINISTIC", "HelloWorld")]);
    v5["spec"]["rollout"]["replayCheck"]["dryRun"] = json!(true);
    put(v5).await;
    let twd = wait_ready(&client, &ns, "hello", ROLLOUT).await;
    let v5 = target_build(&twd).expect("v5 build");
    assert_ne!(v5, v4);
    let (_, _, warned) = wait_event(&client, &ns, "hello", "ReplayCheckFailed", &v5, ROLLOUT).await;
    eprintln!("replay check: v5 dry run: {warned}");
    assert!(
        warned.contains(&on_v4) && warned.contains("dryRun: the rollout goes on"),
        "{warned}"
    );
    let routed = routing(&deployment_name).await.expect("routing");
    assert_eq!(
        routed.current.as_deref(),
        Some(v5.as_str()),
        "a dry run holds nothing"
    );

    // Every verdict was notified, in order, and nothing else (the target wants ReplayCheck).
    let expected: Vec<(String, String)> = [
        "ReplayCheckFailed",
        "ReplayCheckFailed",
        "ReplayCheckPassed",
        "ReplayCheckInconclusive",
        "ReplayCheckPassed",
        "ReplayCheckFailed",
    ]
    .iter()
    .map(|reason| ("ReplayCheck".to_owned(), (*reason).to_owned()))
    .collect();
    let delivered = wait_delivered(&receiver, expected.len(), ROLLOUT).await;
    assert_eq!(webhook::events(&delivered), expected);
    let out = cluster
        .temporal(&["workflow", "terminate", "--workflow-id", &sleeper])
        .await;
    assert!(out.success, "terminate: {}", out.stderr);
}

#[tokio::test]
async fn move_to_current_moves_pinned_workflows_only_once_they_replay_on_the_current_build() {
    let client = kube_client().await;
    let cluster = Cluster::shared().await;
    let ns = test_namespace(&client, "replay-move").await;
    let tq = format!("replay-move-{ns}");
    // Pinned workers (the default), v1 declared compatible once its build ID is known.
    let pinned = |tag: &str, drain: Value, vars: &[(&str, &str)]| {
        let mut manifest = checked_worker(&ns, tag, &tq, vars);
        manifest["spec"]["template"]["spec"]["containers"][0]["env"][1]["value"] = json!("pinned");
        manifest["spec"]["sunset"] =
            json!({ "scaledownDelay": "1h", "deleteDelay": "2h", "drain": drain });
        manifest
    };
    apply(&connection(&ns)).await;
    apply(&pinned("v1", json!({ "signalAfter": "1h" }), &[])).await;
    let v1 = target_build(&wait_ready(&client, &ns, "hello", ROLLOUT).await).expect("v1 build");
    let compatible = json!({ "signalAfter": "1h", "moveToCurrent": { "buildIDs": [v1] } });
    apply(&pinned("v1", compatible.clone(), &[])).await;
    let sleepers: Vec<String> = (1..=2).map(|i| format!("{ns}-sleep-{i}")).collect();
    for id in &sleepers {
        start_workflow_with(&cluster, "Sleeper", &tq, id, Some("75")).await;
    }
    wait_runs(&cluster, &sleepers, "RUNNING", "v1").await;

    // v2 reorders Sleeper's commands: its own check has nothing to replay (no AutoUpgrade or
    // closed workflow on v1), but the move of v1's pinned Sleepers to it is refused.
    apply(&pinned(
        "v2",
        compatible.clone(),
        &[("SAMPLE_NONDETERMINISTIC", "Sleeper")],
    ))
    .await;
    let v2 = target_build(&wait_ready(&client, &ns, "hello", ROLLOUT).await).expect("v2 build");
    let (_, _, refused) =
        wait_event(&client, &ns, "hello", "ReplayCheckFailed", &v1, ROLLOUT).await;
    eprintln!("replay check: move to v2: {refused}");
    assert!(
        refused.contains("do not replay on the Current build")
            && refused.contains(&v2)
            && refused.contains("none was moved")
            && refused.contains("Nondeterminism"),
        "{refused}"
    );
    for id in &sleepers {
        let (status, build) = latest_run(&cluster, id).await.expect("the run");
        assert_eq!(
            (status.as_str(), build.as_str()),
            ("RUNNING", v1.as_str()),
            "{id}"
        );
    }
    let moved: Vec<_> = events(&client, &ns, "hello")
        .await
        .into_iter()
        .filter(|(_, reason, _)| reason == "DrainMovedToCurrent")
        .collect();
    assert!(moved.is_empty(), "{moved:?}");

    // v3 keeps Sleeper's commands: the same workflows replay on it and are moved, and complete
    // there.
    apply(&pinned("v3", compatible, &[])).await;
    let v3 = target_build(&wait_ready(&client, &ns, "hello", ROLLOUT).await).expect("v3 build");
    let (_, _, moved) =
        wait_event(&client, &ns, "hello", "DrainMovedToCurrent", &v1, ROLLOUT).await;
    assert!(
        moved.contains(&v3) && moved.contains("for 2 workflows"),
        "{moved}"
    );
    wait_runs(&cluster, &sleepers, "COMPLETED", "v3").await;
}

#[tokio::test]
async fn a_controller_killed_while_the_replay_job_runs_waits_for_that_job_instead_of_a_second() {
    let client = kube_client().await;
    let cluster = Cluster::shared().await;
    let ns = test_namespace(&client, "replay-kill").await;
    let tq = format!("replay-kill-{ns}");
    // A replay that takes its time: 8 s of sleep, then the sample worker's own replay.
    let slow = |tag: &str, vars: &[(&str, &str)]| {
        let mut manifest = checked_worker(&ns, tag, &tq, vars);
        let worker = env().bin_dir.join("sample-worker");
        manifest["spec"]["rollout"]["replayCheck"] = json!({
            "command": ["sh", "-c", "sleep 8 && exec \"$0\" replay", worker.display().to_string()],
            "timeout": "120s",
        });
        manifest
    };
    apply(&connection(&ns)).await;
    apply(&slow("v1", &[])).await;
    wait_ready(&client, &ns, "hello", ROLLOUT).await;
    let hello = format!("{ns}-hello");
    start_workflow_with(&cluster, "HelloWorld", &tq, &hello, Some("\"kill\"")).await;
    wait_runs(&cluster, std::slice::from_ref(&hello), "COMPLETED", "v1").await;

    apply(&slow("v2", &[("SAMPLE_GREET_DELAY_MS", "1")])).await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let replay_jobs = ListParams::default().labels("twc.temporal.io/replay-check=true");
    let running = wait_for("the replay Job to run", ROLLOUT, || async {
        let listed = jobs
            .list(&replay_jobs)
            .await
            .map_err(|e| e.to_string())?
            .items;
        match listed.as_slice() {
            [job] if job.status.as_ref().and_then(|s| s.active) == Some(1) => {
                Ok(job.metadata.name.clone().unwrap_or_default())
            }
            other => Err(format!("{} replay Jobs", other.len())),
        }
    })
    .await;

    kill_controller().await;

    let twd = wait_ready(&client, &ns, "hello", ROLLOUT).await;
    let v2 = target_build(&twd).expect("v2 build");
    let (_, _, passed) = wait_event(&client, &ns, "hello", "ReplayCheckPassed", &v2, ROLLOUT).await;
    assert!(passed.contains("1 history replayed"), "{passed}");
    let listed: Vec<String> = jobs
        .list(&replay_jobs)
        .await
        .expect("listing Jobs")
        .items
        .into_iter()
        .map(|j| j.metadata.name.unwrap_or_default())
        .collect();
    assert_eq!(
        listed,
        vec![running],
        "one replay Job, waited for across the kill"
    );
}
