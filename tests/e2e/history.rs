//! Rollouts that last days, compressed: a private sandbox whose controller continues its
//! workflows as new after a small history bound and resyncs every few seconds, so what takes
//! weeks in production (a step held for days under signals, a TWD workflow living for years, a
//! spec change the watcher never delivered) happens within a test.

use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};
use twc_crds::worker_deployment::RolloutPhase;

use crate::chaos::cluster::{Cluster, Private, fresh, status_text};
use crate::harness::controls::kubectl_twc_in;
use crate::harness::twd::{condition, deployments, get_twd, target_build, worker};
use crate::harness::wait::wait_for;

/// The test controller's history bound (the production default is 10,000 events).
const BOUND: u64 = 100;
/// Events a run may exceed the bound by: the bound is checked at the start of each turn, and
/// a turn (observation, answers to the controls that woke it, a report, a wait) plus the
/// signals that arrive meanwhile add up to a few tens of events.
const TURN_SLACK: u64 = 80;
const ROLLOUT: Duration = Duration::from_secs(180);

/// Runs of `workflow_id` in the engine namespace (newest first) with their history lengths.
async fn runs(cluster: &Cluster, workflow_id: &str) -> Result<Vec<(String, String, u64)>, String> {
    let rows = cluster
        .workflows(&format!("WorkflowId = '{workflow_id}'"))
        .await?;
    let mut runs = Vec::new();
    for row in rows {
        let described = cluster
            .describe_workflow(&cluster.env.temporal_namespace, &row.id, &row.run_id)
            .await?;
        let length = &described["workflowExecutionInfo"]["historyLength"];
        let length = length
            .as_u64()
            .or_else(|| length.as_str().and_then(|s| s.parse().ok()))
            .ok_or_else(|| format!("no historyLength in {described}"))?;
        runs.push((row.run_id, row.status, length));
    }
    Ok(runs)
}

/// Whether the live run of `workflow_id` is idle in its wait: no workflow task and no activity
/// pending, so a signal sent now starts one turn of its own.
async fn idle(cluster: &Cluster, workflow_id: &str) -> Result<(), String> {
    let described = cluster
        .describe_workflow(&cluster.env.temporal_namespace, workflow_id, "")
        .await?;
    let task = &described["pendingWorkflowTask"];
    let activities = described["pendingActivities"]
        .as_array()
        .map_or(0, Vec::len);
    if task.is_null() && activities == 0 {
        Ok(())
    } else {
        Err(format!(
            "busy: workflow task {task}, {activities} activities pending"
        ))
    }
}

/// Sends `control` to `workflow_id` until it has continued as new `times` more times than it
/// had, each once the run is idle again (a control per turn: the bound is checked at the start
/// of a turn, and signals piling up during a slow turn on a loaded machine would each add their
/// events to it); returns the runs.
async fn signal_until_continued(
    cluster: &Cluster,
    workflow_id: &str,
    controls: &[&str],
    times: usize,
) -> Vec<(String, String, u64)> {
    let before = runs(cluster, workflow_id)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .len();
    let sent = std::cell::Cell::new(0usize);
    let sent = &sent;
    cluster
        .wait(
            &format!("{workflow_id} continued as new {times} times under signals"),
            ROLLOUT,
            || async move {
                idle(cluster, workflow_id).await?;
                let control = controls[sent.get() % controls.len()];
                cluster.signal_control(workflow_id, control).await;
                sent.set(sent.get() + 1);
                let runs = runs(cluster, workflow_id).await?;
                if runs.len() >= before + times {
                    Ok(runs)
                } else {
                    Err(format!(
                        "{} runs after {sent} signals: {runs:?}",
                        runs.len(),
                        sent = sent.get()
                    ))
                }
            },
        )
        .await
}

/// When the first and the newest run of `workflow_id` started (Unix ms).
async fn run_starts_ms(cluster: &Cluster, workflow_id: &str) -> (i64, i64) {
    let rows = cluster
        .workflows(&format!("WorkflowId = '{workflow_id}'"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut starts = Vec::new();
    for row in rows {
        let described = cluster
            .describe_workflow(&cluster.env.temporal_namespace, &row.id, &row.run_id)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let started = described["workflowExecutionInfo"]["startTime"]
            .as_str()
            .and_then(|t| t.parse::<Timestamp>().ok())
            .unwrap_or_else(|| panic!("no startTime in {described}"));
        starts.push(started.as_millisecond());
    }
    let first = starts.iter().min().copied().unwrap_or_default();
    let newest = starts.iter().max().copied().unwrap_or_default();
    (first, newest)
}

/// The "Recent rollouts" of `kubectl twc status`: (build ID, seconds since it started).
async fn recent_rollouts(cluster: &Cluster, ns: &str, name: &str) -> Vec<(String, i64)> {
    let out = kubectl_twc_in(&cluster.env, &["status", name, "-n", ns]).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let rows: Vec<(String, i64)> = out
        .stdout
        .lines()
        .skip_while(|l| *l != "Recent rollouts")
        .skip(2)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| {
            let cells: Vec<&str> = l.split_whitespace().collect();
            let [build, .., age, "ago"] = cells.as_slice() else {
                return None;
            };
            Some(((*build).to_owned(), seconds(age)?))
        })
        .collect();
    assert!(!rows.is_empty(), "no recent rollouts:\n{}", out.stdout);
    rows
}

/// Seconds of an age as `kubectl twc` prints it (`5s`, `2m5s`, `1h2m`).
fn seconds(age: &str) -> Option<i64> {
    let mut total = 0;
    let mut number = String::new();
    for c in age.chars() {
        match c {
            '0'..='9' => number.push(c),
            'h' | 'm' | 's' => {
                let unit = match c {
                    'h' => 3600,
                    'm' => 60,
                    _ => 1,
                };
                total += number.parse::<i64>().ok()? * unit;
                number.clear();
            }
            _ => return None,
        }
    }
    Some(total)
}

async fn wait_phase(cluster: &Cluster, ns: &str, name: &str, phase: RolloutPhase) {
    cluster
        .wait(&format!("{ns}/{name} phase {phase:?}"), ROLLOUT, || async {
            let twd = get_twd(&cluster.client, ns, name).await?;
            let current = twd
                .status
                .as_ref()
                .and_then(|s| s.rollout.as_ref())
                .and_then(|r| r.phase);
            if current == Some(phase) {
                Ok(())
            } else {
                Err(status_text(&twd))
            }
        })
        .await;
}

/// A private sandbox whose controller runs with `env`, and a fresh namespace (`prefix`) with the
/// connection `dev`.
async fn private_with(name: &str, env: &[(&str, &str)], prefix: &str) -> (Private, String) {
    let mut private = Private::start(name).await;
    private
        .sandbox
        .restart_controller_with_env(env)
        .await
        .unwrap_or_else(|e| panic!("restarting the controller: {e}"));
    let cluster = &private.cluster;
    let ns = cluster.namespace(prefix).await;
    cluster.apply(&cluster.connection(&ns, "dev")).await;
    (private, ns)
}

fn assert_bounded(workflow_id: &str, runs: &[(String, String, u64)]) {
    for (run_id, status, length) in runs {
        assert!(
            *length <= BOUND + TURN_SLACK,
            "{workflow_id} run {run_id} ({status}) has {length} history events, over the bound of {BOUND} (+{TURN_SLACK})"
        );
    }
}

#[tokio::test]
async fn held_rollouts_continue_as_new_under_signals_and_finish() {
    let (private, ns) = private_with(
        "history-bound",
        &[("TWC_HISTORY_EVENT_BOUND", "100")],
        "history",
    )
    .await;
    let cluster = &private.cluster;

    // A Progressive rollout held at its first step (a pause of a day), paused and resumed by
    // operators over and over.
    let progressive = json!({ "strategy": "Progressive",
        "steps": [ { "rampPercentage": 10, "pauseDuration": "24h" } ] });
    cluster
        .apply(&worker(&ns, "held", "v1", progressive.clone()))
        .await;
    cluster.wait_ready(&ns, "held", "v1", ROLLOUT).await;
    cluster
        .apply(&worker(&ns, "held", "v2", progressive.clone()))
        .await;
    cluster
        .wait_reason(&ns, "held", "Progressing", "Ramping", ROLLOUT)
        .await;
    let twd = get_twd(&cluster.client, &ns, "held")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let v2 = target_build(&twd).unwrap_or_default();
    let rollout_id = format!("rollout/{ns}/held/{v2}");
    signal_until_continued(cluster, &rollout_id, &["pause", "resume"], 3).await;
    // `kubectl twc status` shows the rollout once, started when its first run started, even
    // when its newest run started well after it.
    let (first, _) = run_starts_ms(cluster, &rollout_id).await;
    wait_for(
        "the rollout's first run is 10 s old",
        Duration::from_secs(20),
        || async {
            let old = Timestamp::now().as_millisecond() - first;
            if old >= 10_000 {
                Ok(())
            } else {
                Err(format!("{old} ms"))
            }
        },
    )
    .await;
    signal_until_continued(cluster, &rollout_id, &["pause", "resume"], 1).await;
    let (_, newest) = run_starts_ms(cluster, &rollout_id).await;
    assert!(
        newest - first >= 10_000,
        "newest run {newest}, first {first}"
    );
    // The age the CLI prints lies between the first run's age before the call and after it
    // (the call may take seconds on a loaded machine), give or take a second of rounding.
    let age = || (Timestamp::now().as_millisecond() - first) / 1000;
    let before = age();
    let rows = recent_rollouts(cluster, &ns, "held").await;
    let after = age() + 1;
    let held_rows: Vec<_> = rows.iter().filter(|r| r.0 == v2).collect();
    assert_eq!(held_rows.len(), 1, "one row for {v2}: {rows:?}");
    assert!(
        (before - 1..=after).contains(&held_rows[0].1),
        "{v2} started {}s ago by the CLI, {before}..{after}s ago by its first run: {rows:?}",
        held_rows[0].1
    );
    assert_eq!(rows.len(), 2, "v1 and v2, once each: {rows:?}");

    // A pause survives continue-as-new: paused, then kept busy with more `pause` controls
    // (each answered "unchanged") until it has continued as new again.
    cluster.signal_control(&rollout_id, "pause").await;
    wait_phase(cluster, &ns, "held", RolloutPhase::Paused).await;
    signal_until_continued(cluster, &rollout_id, &["pause"], 1).await;
    wait_phase(cluster, &ns, "held", RolloutPhase::Paused).await;
    let routing = cluster
        .routing(&format!("{ns}/held"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (routing.ramping.as_deref(), routing.percentage.round()),
        (Some(v2.as_str()), 10.0),
        "the paused rollout still ramps at its step: {routing:?}"
    );
    // A spec change that keeps the build (replicas) nudges the held rollout too.
    let mut scaled = worker(&ns, "held", "v2", progressive.clone());
    scaled["spec"]["replicas"] = json!(2);
    cluster.apply(&scaled).await;
    cluster.signal_control(&rollout_id, "resume").await;
    wait_phase(cluster, &ns, "held", RolloutPhase::Rolling).await;
    cluster.signal_control(&rollout_id, "promote").await;
    let twd = cluster.wait_ready(&ns, "held", "v2", ROLLOUT).await;
    assert_eq!(target_build(&twd).as_deref(), Some(v2.as_str()));
    // Ready comes from the rollout's report, sent once routing is written; its run closes
    // right after (its last events): wait for the chain to end before reading it.
    let held_runs = wait_for("the held rollout's last run closes", ROLLOUT, || async {
        let runs = runs(cluster, &rollout_id).await?;
        if runs.iter().any(|r| r.1 == "RUNNING") {
            Err(format!("{runs:?}"))
        } else {
            Ok(runs)
        }
    })
    .await;
    // Five or more runs chained by continue-as-new, the last completed; the replicas change
    // made during the rollout may add a fresh run that applies it and ends at once.
    assert!(
        held_runs
            .iter()
            .filter(|r| r.1 == "CONTINUED_AS_NEW")
            .count()
            >= 4,
        "{held_runs:?}"
    );
    assert!(
        held_runs.iter().any(|r| r.1 == "COMPLETED"),
        "{held_runs:?}"
    );
    assert!(
        held_runs
            .iter()
            .all(|r| ["COMPLETED", "CONTINUED_AS_NEW", "RUNNING"].contains(&r.1.as_str())),
        "no run failed or was terminated: {held_runs:?}"
    );
    assert_bounded(&rollout_id, &held_runs);

    // A Manual rollout waiting days for a person, poked by controls that do not apply yet.
    let manual = json!({ "strategy": "Manual" });
    cluster
        .apply(&worker(&ns, "manual", "v1", manual.clone()))
        .await;
    cluster
        .wait_reason(&ns, "manual", "Ready", "WaitingForPromotion", ROLLOUT)
        .await;
    let twd = get_twd(&cluster.client, &ns, "manual")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let build = target_build(&twd).unwrap_or_default();
    let manual_id = format!("rollout/{ns}/manual/{build}");
    signal_until_continued(cluster, &manual_id, &["resume", "retry"], 2).await;
    let twd = get_twd(&cluster.client, &ns, "manual")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        condition(&twd, "Ready").map(|c| c.1),
        Some("WaitingForPromotion".to_owned()),
        "still waiting for a person after continuing as new: {}",
        status_text(&twd)
    );
    cluster.signal_control(&manual_id, "promote").await;
    cluster.wait_ready(&ns, "manual", "v1", ROLLOUT).await;
    let manual_runs = runs(cluster, &manual_id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_bounded(&manual_id, &manual_runs);

    // The TWD workflows continue as new too, and stay within the bound. A run continues at the
    // end of the turn that finds its history over the bound; a spec change that keeps the build
    // (replicas) is such a turn, so they are made until each has continued.
    for (name, tag, rollout) in [("held", "v2", progressive), ("manual", "v1", manual)] {
        let twd_id = format!("twd/{ns}/{name}");
        let deadline = Instant::now() + ROLLOUT;
        let mut replicas = 3;
        let twd_runs = loop {
            let twd_runs = runs(cluster, &twd_id)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            if twd_runs.len() >= 2 {
                break twd_runs;
            }
            assert!(
                Instant::now() < deadline,
                "{twd_id} did not continue as new: {twd_runs:?}"
            );
            let mut scaled = worker(&ns, name, tag, rollout.clone());
            scaled["spec"]["replicas"] = json!(replicas);
            cluster.apply(&scaled).await;
            wait_observed(cluster, &ns, name).await;
            replicas = 5 - replicas;
        };
        assert_bounded(&twd_id, &twd_runs);
    }
    private.sandbox.stop().await;
}

#[tokio::test]
async fn idle_twd_workflows_and_held_rollouts_continue_as_new_at_their_event_bound() {
    // A resync every second: the ~65 idle turns a TWD workflow takes in ~5 h at the default
    // 5 min fill its run in about a minute.
    let (private, ns) = private_with("short-runs", &[("TWC_RESYNC_INTERVAL", "1s")], "short").await;
    let cluster = &private.cluster;
    let rollout = json!({ "strategy": "AllAtOnce" });
    cluster.apply(&worker(&ns, "idle", "v1", rollout)).await;
    let ready = cluster.wait_ready(&ns, "idle", "v1", ROLLOUT).await;
    let build = target_build(&ready);

    let twd_id = format!("twd/{ns}/idle");
    let bound = u64::from(twc_workflows::plan::twd::RUN_EVENT_BOUND);
    let since = Timestamp::now();
    let before = lists_and_reads(&private).await;
    let twd_runs = wait_runs(cluster, &twd_id, 4, Duration::from_secs(300), false).await;
    // Every idle turn observes (a list of the TWD's Deployments and a worker-deployment read);
    // one every 30 s re-asserts first (`recheck`), and with nothing re-asserted its one list
    // serves both halves. So the lists are the reads, not one more per recheck.
    let rechecks = cluster
        .wait("two rechecks in the idle turns", ROLLOUT, || async {
            match rechecks_since(cluster, &twd_id, since).await? {
                n if n >= 2 => Ok(n),
                n => Err(format!("{n} rechecks")),
            }
        })
        .await;
    let after = lists_and_reads(&private).await;
    let (lists, reads) = (after.0 - before.0, after.1 - before.1);
    assert!(
        lists - reads < rechecks as f64,
        "{lists} lists of Deployments, {reads} worker-deployment reads and {rechecks} rechecks \
         in the idle turns: a recheck lists the Deployments twice"
    );
    // The first run ended with its rollout (`settled-runs`), far under the bound. Each idle run
    // since continued at the bound (at most one turn and the signals that came during it past
    // it), not at the 500 turns (~3,000 events) runs from before `short-runs` take.
    let (first, idle_runs) = twd_runs[1..].split_last().expect("four runs");
    assert!(first.2 < bound, "{twd_id}: {twd_runs:?}");
    for (run_id, status, length) in idle_runs {
        assert!(
            (bound..=bound + TURN_SLACK).contains(length),
            "{twd_id} run {run_id} ({status}) ended with {length} history events, not at the \
             bound of {bound} (+{TURN_SLACK}): {twd_runs:?}"
        );
    }
    // A run this build continued writes a status only when it differs from the last one
    // written, by this run or the one before it (a carried status equals the one the next run
    // projects, though its JSON keeps whole seconds); one continued at once, with a signal
    // pending, may have something new to show (a `healthySince` the report-only turn before it
    // did not read). And a continued run records no `short-runs` marker (its input says it has
    // the bound): no search-attribute upsert, which the SDK makes beside each marker.
    let mut written: Vec<(String, Value)> = Vec::new();
    for (run_id, _, _) in twd_runs.iter().rev() {
        let (writes, upserts) = writes_and_upserts(cluster, &twd_id, run_id).await;
        if run_id != &twd_runs[twd_runs.len() - 1].0 {
            assert_eq!(
                upserts, 0,
                "{twd_id} run {run_id}: search-attribute upserts"
            );
        }
        written.extend(writes.into_iter().map(|w| (run_id.clone(), w)));
    }
    for pair in written.windows(2) {
        assert_ne!(
            pair[0].1, pair[1].1,
            "{twd_id}: run {} wrote the status run {} had written last",
            pair[1].0, pair[0].0
        );
    }
    // Nothing moved: still v1, Ready, its one rollout.
    let twd = get_twd(&cluster.client, &ns, "idle")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(target_build(&twd), build, "{}", status_text(&twd));
    assert_eq!(
        condition(&twd, "Ready")
            .map(|(status, _, _)| status)
            .as_deref(),
        Some("True"),
        "{}",
        status_text(&twd)
    );
    let rollouts = recent_rollouts(cluster, &ns, "idle").await;
    assert_eq!(rollouts.len(), 1, "rollouts: {rollouts:?}");

    // A rollout held in a step of an hour, woken by the same 1 s resync: its runs continue as
    // new at the same bound (`short-rollout-runs`), not at Temporal's suggestion (~4,000
    // events), and it still promotes.
    let held = json!({ "strategy": "Progressive",
        "steps": [ { "rampPercentage": 10, "pauseDuration": "1h" } ] });
    cluster.apply(&worker(&ns, "idle", "v2", held)).await;
    cluster
        .wait_reason(&ns, "idle", "Progressing", "Ramping", ROLLOUT)
        .await;
    let twd = get_twd(&cluster.client, &ns, "idle")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let v2 = target_build(&twd).unwrap_or_default();
    let rollout_id = format!("rollout/{ns}/idle/{v2}");
    let held_runs = wait_runs(cluster, &rollout_id, 3, Duration::from_secs(300), false).await;
    for (run_id, status, length) in &held_runs[1..] {
        assert!(
            status == "CONTINUED_AS_NEW" && (bound..=bound + TURN_SLACK).contains(length),
            "{rollout_id} run {run_id} ({status}) ended with {length} history events, not at \
             the bound of {bound} (+{TURN_SLACK}): {held_runs:?}"
        );
    }
    cluster.signal_control(&rollout_id, "promote").await;
    let twd = cluster.wait_ready(&ns, "idle", "v2", ROLLOUT).await;
    assert_eq!(target_build(&twd).as_deref(), Some(v2.as_str()));
    private.sandbox.stop().await;
}

#[tokio::test]
async fn a_spec_change_that_comes_with_a_quiet_runs_first_task_is_rolled_out_at_once() {
    // The watcher looks elsewhere: the test plays it, so the spec signal reaches the run at its
    // very start (the watcher's signal-with-start, in the first workflow task).
    let (private, ns) = private_with(
        "quiet-signal",
        &[("TWC_WATCH_NAMESPACES", "nothing-to-watch")],
        "quiet",
    )
    .await;
    let cluster = &private.cluster;
    let rollout = json!({ "strategy": "AllAtOnce" });
    cluster
        .apply(&worker(&ns, "quiet", "v1", rollout.clone()))
        .await;
    crate::chaos::signal_spec(cluster, &ns, "quiet", None).await;
    cluster.wait_ready(&ns, "quiet", "v1", ROLLOUT).await;

    // The run that rolled v1 out continued as new with nothing pending: its successor waits
    // for its resync before its first turn.
    let twd_id = format!("twd/{ns}/quiet");
    let settled = wait_runs(cluster, &twd_id, 2, Duration::from_secs(120), true).await;
    let events = run_history(cluster, &twd_id, &settled[0].0)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let started = &events[0]["workflowExecutionStartedEventAttributes"];
    let mut carried = crate::baseline_upgrade::payload(&started["input"])["carried"].take();
    assert!(
        carried["quiet_start"].is_object(),
        "the idle run starts quietly: {carried}"
    );
    // A run that starts like it (its first turn an hour away) with v2's spec signal in its
    // first workflow task, as when the watcher signals while a run continues as new.
    let in_an_hour = Timestamp::now().as_millisecond() + 3_600_000;
    carried["quiet_start"]["turn_at"] = json!(in_an_hour);
    let out = cluster
        .temporal(&["workflow", "terminate", "--workflow-id", &twd_id])
        .await;
    assert!(out.success, "terminating {twd_id}: {}", out.stderr);
    cluster.apply(&worker(&ns, "quiet", "v2", rollout)).await;
    crate::chaos::signal_spec(cluster, &ns, "quiet", Some(carried)).await;
    cluster.wait_ready(&ns, "quiet", "v2", ROLLOUT).await;
    private.sandbox.stop().await;
}

/// Waits until the worker deployment's status was written for its current generation.
async fn wait_observed(cluster: &Cluster, ns: &str, name: &str) {
    cluster
        .wait(&format!("{ns}/{name} observed"), ROLLOUT, || async {
            let twd = get_twd(&cluster.client, ns, name).await?;
            if fresh(&twd) {
                Ok(())
            } else {
                Err(status_text(&twd))
            }
        })
        .await;
}

#[tokio::test]
async fn a_spec_change_the_watcher_missed_is_rolled_out_by_the_resync() {
    let (mut private, ns) =
        private_with("resync", &[("TWC_RESYNC_INTERVAL", "10s")], "resync").await;
    let cluster = &private.cluster;
    let rollout = json!({ "strategy": "AllAtOnce" });
    cluster
        .apply(&worker(&ns, "hello", "v1", rollout.clone()))
        .await;
    cluster.wait_ready(&ns, "hello", "v1", ROLLOUT).await;

    // From now on the controller's watcher looks at another namespace only: no signal reaches
    // the TWD's workflow, whose engine worker still runs.
    private
        .sandbox
        .restart_controller_with_env(&[
            ("TWC_RESYNC_INTERVAL", "10s"),
            ("TWC_WATCH_NAMESPACES", "nothing-to-watch"),
        ])
        .await
        .unwrap_or_else(|e| panic!("restarting the controller: {e}"));
    cluster.apply(&worker(&ns, "hello", "v2", rollout)).await;
    let twd = cluster
        .wait_ready(&ns, "hello", "v2", Duration::from_secs(90))
        .await;
    let build = target_build(&twd).unwrap_or_default();
    let routing = cluster
        .routing(&format!("{ns}/hello"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(routing.current.as_deref(), Some(build.as_str()));
    private.sandbox.stop().await;
}

/// `spec_changed` signals every run of `workflow_id` received.
async fn spec_signals(cluster: &Cluster, workflow_id: &str) -> Result<usize, String> {
    crate::drain::count_events(cluster, workflow_id, |e| {
        e["workflowExecutionSignaledEventAttributes"]["signalName"].as_str() == Some("spec_changed")
    })
    .await
}

#[tokio::test]
async fn a_restarted_controller_signals_no_twd_whose_workflow_has_its_generation() {
    let mut private = Private::start("restart-quiet").await;
    let cluster = &private.cluster;
    let ns = cluster.namespace("quiet").await;
    cluster.apply(&cluster.connection(&ns, "dev")).await;
    let rollout = json!({ "strategy": "AllAtOnce" });
    let names = ["one", "two", "three"];
    for name in names {
        cluster
            .apply(&worker(&ns, name, "v1", rollout.clone()))
            .await;
    }
    for name in names {
        cluster.wait_ready(&ns, name, "v1", ROLLOUT).await;
    }
    let mut before = Vec::new();
    for name in names {
        let id = format!("twd/{ns}/{name}");
        let count = cluster
            .wait("the TWD workflow's signals", ROLLOUT, || async {
                spec_signals(cluster, &id).await
            })
            .await;
        before.push(count);
    }

    private
        .sandbox
        .restart_controller_with_env(&[])
        .await
        .unwrap_or_else(|e| panic!("restarting the controller: {e}"));
    let cluster = &private.cluster;
    // Ready once its watcher has handled the first list of every watch.
    let ready = format!(
        "{}/readyz",
        private
            .sandbox
            .env
            .controller_health_url
            .clone()
            .unwrap_or_else(|| panic!("the private sandbox names no health URL"))
    );
    cluster
        .wait("the restarted controller ready", ROLLOUT, || async {
            match twc_sandbox::http::get(&ready).await {
                Ok(r) if r.status == 200 => Ok(()),
                Ok(r) => Err(r.head),
                Err(e) => Err(e),
            }
        })
        .await;
    // A change of one TWD reaches its workflow, and rolls out.
    cluster
        .apply(&worker(&ns, "one", "v2", rollout.clone()))
        .await;
    cluster.wait_ready(&ns, "one", "v2", ROLLOUT).await;
    let one = spec_signals(cluster, &format!("twd/{ns}/one"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(one > before[0], "the change of `one` was signalled");
    for (name, before) in names.iter().zip(&before).skip(1) {
        let after = spec_signals(cluster, &format!("twd/{ns}/{name}"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            after, *before,
            "{name}: the restarted controller signalled a TWD whose workflow had its generation"
        );
    }
    private.sandbox.stop().await;
}

/// The event types of one run ([`crate::held::event_type`]'s spelling).
async fn run_events(
    cluster: &Cluster,
    workflow_id: &str,
    run_id: &str,
) -> Result<Vec<String>, String> {
    let events = run_history(cluster, workflow_id, run_id).await?;
    Ok(events.iter().map(crate::held::event_type).collect())
}

/// The events of run `run_id` of `workflow_id`, as the server gives them.
async fn run_history(
    cluster: &Cluster,
    workflow_id: &str,
    run_id: &str,
) -> Result<Vec<serde_json::Value>, String> {
    let text = cluster
        .history(&cluster.env.temporal_namespace, workflow_id, run_id)
        .await?;
    let history: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{e}: {text}"))?;
    Ok(history["events"].as_array().cloned().unwrap_or_default())
}

/// The statuses a TWD workflow's run wrote, in order and as compared for a write (without
/// `rollout.updatedAt` and the conditions' `lastTransitionTime`), and how many search-attribute
/// upserts it made (the SDK makes one beside each patch marker a run records; the TWD workflow
/// makes none of its own).
async fn writes_and_upserts(
    cluster: &Cluster,
    workflow_id: &str,
    run_id: &str,
) -> (Vec<Value>, usize) {
    let events = run_history(cluster, workflow_id, run_id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let writes = events
        .iter()
        .map(|e| &e["activityTaskScheduledEventAttributes"])
        .filter(|a| a["activityType"]["name"] == "write_status")
        .map(|a| {
            let mut status = crate::baseline_upgrade::payload(&a["input"])["status"].take();
            if let Some(rollout) = status["rollout"].as_object_mut() {
                rollout.remove("updatedAt");
            }
            for condition in status["conditions"].as_array_mut().into_iter().flatten() {
                if let Some(condition) = condition.as_object_mut() {
                    condition.remove("lastTransitionTime");
                }
            }
            status
        })
        .collect();
    let upserts = events
        .iter()
        .filter(|e| crate::held::event_type(e) == "upsertworkflowsearchattributes")
        .count();
    (writes, upserts)
}

/// The private controller's lists of Deployments and worker-deployment reads so far (its
/// `twc_kubernetes_requests_total` and `twc_temporal_requests_total`).
async fn lists_and_reads(private: &Private) -> (f64, f64) {
    let Some(url) = private.sandbox.env.controller_metrics_url.as_deref() else {
        panic!("the private sandbox names no controller metrics URL");
    };
    let scrape = crate::metrics::Scrape::take_from(url)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    (
        scrape.sum(
            "twc_kubernetes_requests_total",
            &[r#"verb="list""#, r#"resource="deployments""#],
        ),
        scrape.sum(
            "twc_temporal_requests_total",
            &[r#"operation="DescribeWorkerDeployment""#],
        ),
    )
}

/// The `recheck` activities (local or not) the runs of `workflow_id` recorded since `since`.
async fn rechecks_since(
    cluster: &Cluster,
    workflow_id: &str,
    since: Timestamp,
) -> Result<usize, String> {
    let mut count = 0;
    for (run_id, _, _) in runs(cluster, workflow_id).await? {
        for event in run_history(cluster, workflow_id, &run_id).await? {
            if crate::baseline_upgrade::event_time(&event) < since {
                continue;
            }
            let local = crate::baseline_upgrade::payload(
                &event["markerRecordedEventAttributes"]["details"]["data"],
            );
            let scheduled = &event["activityTaskScheduledEventAttributes"]["activityType"];
            if local["activity_type"] == "recheck" || scheduled["name"] == "recheck" {
                count += 1;
            }
        }
    }
    Ok(count)
}

/// Waits up to `within` until `workflow_id` has `count` runs or more (and, when `newest_idle`,
/// its newest run idle in its wait); returns them newest first.
async fn wait_runs(
    cluster: &Cluster,
    workflow_id: &str,
    count: usize,
    within: Duration,
    newest_idle: bool,
) -> Vec<(String, String, u64)> {
    cluster
        .wait(
            &format!("{workflow_id} to have {count} runs (the newest idle: {newest_idle})"),
            within,
            || async {
                let runs = runs(cluster, workflow_id).await?;
                if runs.len() < count {
                    return Err(format!("{runs:?}"));
                }
                if newest_idle {
                    idle(cluster, workflow_id).await?;
                }
                Ok(runs)
            },
        )
        .await
}

/// Asserts that `run_id`'s first workflow task only started the timer of its first turn (the
/// resync the previous run was due), and that nothing ran before that timer fired: no turn at
/// once, no activity, no status write.
async fn assert_quiet_start(cluster: &Cluster, workflow_id: &str, run_id: &str) {
    let events = run_events(cluster, workflow_id, run_id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let first_task: Vec<&str> = events.iter().take(5).map(String::as_str).collect();
    assert_eq!(
        first_task,
        [
            "workflowexecutionstarted",
            "workflowtaskscheduled",
            "workflowtaskstarted",
            "workflowtaskcompleted",
            "timerstarted"
        ],
        "{workflow_id} run {run_id}: {events:?}"
    );
    let before_it_fired: Vec<&String> = events
        .iter()
        .skip(5)
        .take_while(|t| *t != "timerfired")
        .collect();
    assert!(
        before_it_fired.is_empty(),
        "{workflow_id} run {run_id} did something before its first timer: {events:?}"
    );
}

#[tokio::test]
async fn a_twd_workflow_continues_as_new_once_its_rollout_has_ended_and_resumes_at_its_resync() {
    let cluster = Cluster::shared().await;
    let ns = cluster.namespace("settled").await;
    cluster.apply(&cluster.connection(&ns, "dev")).await;
    let rollout = json!({ "strategy": "AllAtOnce" });
    cluster
        .apply(&worker(&ns, "settle", "v1", rollout.clone()))
        .await;
    let ready = cluster.wait_ready(&ns, "settle", "v1", ROLLOUT).await;
    let v1 = target_build(&ready);
    let twd_id = format!("twd/{ns}/settle");
    let bound = u64::from(twc_workflows::plan::twd::RUN_EVENT_BOUND);

    // The run that rolled v1 out ended with it, far under the event bound; the next one waits
    // for its resync (5 min in the shared sandbox) with nothing done.
    let settled = wait_runs(&cluster, &twd_id, 2, Duration::from_secs(120), true).await;
    let (ended_id, ended_status, ended_length) = &settled[1];
    assert_eq!(ended_status, "CONTINUED_AS_NEW", "{settled:?}");
    assert!(*ended_length < bound, "{settled:?}");
    let ended = run_events(&cluster, &twd_id, ended_id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        ended.last().map(String::as_str),
        Some("workflowexecutioncontinuedasnew"),
        "{ended:?}"
    );
    assert_quiet_start(&cluster, &twd_id, &settled[0].0).await;
    let twd = get_twd(&cluster.client, &ns, "settle")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(target_build(&twd), v1, "{}", status_text(&twd));

    // The next rollout is the new run's work: it ends with it too, and retiring v1 goes on in
    // the run after (the sunset's memory is carried): v1's Deployment is deleted.
    cluster.apply(&worker(&ns, "settle", "v2", rollout)).await;
    let ready = cluster.wait_ready(&ns, "settle", "v2", ROLLOUT).await;
    let v2 = target_build(&ready).unwrap_or_default();
    let after = wait_runs(&cluster, &twd_id, 3, Duration::from_secs(120), true).await;
    assert_eq!(after[1].1, "CONTINUED_AS_NEW", "{after:?}");
    assert_eq!(after[2].0, *ended_id, "{after:?}");
    cluster
        .wait(
            &format!("{ns}/settle: only {v2}'s Deployment"),
            ROLLOUT,
            || async {
                let left = deployments(&cluster.client, &ns, "settle").await;
                if left.iter().all(|(_, build, _)| *build == v2) && !left.is_empty() {
                    Ok(())
                } else {
                    Err(format!("{left:?}"))
                }
            },
        )
        .await;
    let rollouts = recent_rollouts(&cluster, &ns, "settle").await;
    assert_eq!(rollouts.len(), 2, "rollouts: {rollouts:?}");
}
