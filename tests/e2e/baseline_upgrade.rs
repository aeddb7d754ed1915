//! Upgrading the controller over running rollouts (issue #29, item 9). The last release's `twc`
//! (`TWC_BASELINE_BIN`, built by `make baseline` at `TWC_BASELINE_REF`, default `v0.1.0`) brings
//! four worker deployments into states that last: a Progressive step held after its gate, a
//! Manual build waiting for promotion after its gate, a drain between its signal and its cancel,
//! and a step's analysis between two measurements. It is stopped as a rolling update stops it
//! (SIGTERM), the build under test starts on the same servers, and every rollout completes as
//! it would have under one binary: each ramp written once, the held step's end and the cancel
//! done by the new build, one Deployment and one gate run per build, one drain signal and one
//! cancel per pinned workflow, every measurement counted once, all read from the workflows'
//! histories and the Kubernetes objects.
//!
//! The build under test replays every history the release wrote. A workflow change shipped
//! without a patch fails those workflow tasks with a nondeterminism error; the test watches the
//! histories for failed workflow tasks and stops with them.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use base64::Engine as _;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use crate::analysis::{analysed_worker, analysis_status, load_at, recorded_verdicts};
use crate::chaos::cluster::{Cluster, Private, fresh, status_text};
use crate::chaos::invariants::{Expected, assert_no_orphans, assert_settled};
use crate::drain::{
    cancel_requests, drain_signals, drained_worker, latest_run, start_workflow, wait_runs_within,
};
use crate::harness::controls::events;
use crate::harness::twd::{condition, get_twd, target_build, worker};

/// A Progressive step held after a gate: 25 % for long enough to stop one controller and start
/// the other inside it, then 50 % briefly.
const HELD: &str = "held";
/// A Manual rollout whose gate passed, waiting for promotion.
const MANUAL: &str = "manual";
/// A retired version drained: signalled soon, cancelled long after.
const DRAINED: &str = "drained";
/// A Progressive step measured by a Temporal check under load.
const ANALYSED: &str = "analysed";
const SCENARIOS: [&str; 4] = [HELD, MANUAL, DRAINED, ANALYSED];

/// The held step's pause, the analysed step's, and the drain's cancel: each outlasts getting
/// every scenario into its state plus the controller swap (at most 10 s to stop). That took tens
/// of seconds on an idle machine, over 75 s on a loaded 2-core one (a CI run of 2026-11-29, where
/// an analysed step of 75 s ended during the swap), and 155 s from empty caches, with clippy and
/// the unit tests compiling cold beside the tests (2026-11-29, where a held step of 150 s ended
/// before the swap); hence 300 s. The test prints when each scenario reached its state.
const LASTING: Duration = Duration::from_secs(300);

/// The analysed step's measurement interval.
const MEASURED_EVERY: Duration = Duration::from_secs(5);
/// Workflows a second started for the analysed step to measure: at its 50 % ramp, five samples
/// of v2 in a measurement on average, where the check needs three (and tolerates inconclusive
/// ones). At the analysis tests' 10 a second they were 3,220 workflows, 35 of the 42 thousand
/// events of this test's private Temporal, which took 199 CPU-s, more than any other server of
/// the suite but the shared one (2026-12-01).
const LOAD_RATE: u32 = 2;
/// Inconclusive measurements (too few samples) in a row the analysed step tolerates: every
/// measurement it has time for, and some, so they never end it early.
const INCONCLUSIVE_LIMIT: u64 = LASTING.as_secs() / MEASURED_EVERY.as_secs() + 20;
// The CRD admits at most 100 (`inconclusiveLimit`'s maximum); a longer LASTING needs a longer
// interval.
const _: () = assert!(INCONCLUSIVE_LIMIT <= 100);

/// [`LASTING`] as a duration of the spec (the held step's and the analysed step's pause).
fn lasting() -> String {
    format!("{}s", LASTING.as_secs())
}
/// Every wait's deadline. Generous: on a loaded 2-core machine the debug controllers' workflow
/// tasks have outrun Temporal's 10 s task timeout and a retried task waited 41 s for a poller
/// (a CI run of 2026-11-29), so a rollout or the drain's cancel step can take minutes there;
/// what the test asserts is that each completes, once.
const ROLLOUT: Duration = Duration::from_secs(300);
/// The most the controller swap takes: the release gets 10 s to stop (SIGKILL after), the
/// build under test starts in a few more. Checked against what is left of [`LASTING`].
const SWAP: Duration = Duration::from_secs(30);
/// How often the histories are read for failed workflow tasks while the rollouts complete.
const TASK_FAILURE_SCAN: Duration = Duration::from_secs(5);

/// The last release's controller binary, which `make test` / `make e2e` build and name.
fn baseline_binary() -> PathBuf {
    let Some(path) = std::env::var_os("TWC_BASELINE_BIN").filter(|p| !p.is_empty()) else {
        panic!(
            "TWC_BASELINE_BIN is unset: the upgrade test runs the last release's twc first. Run \
             it through `make e2e` or `make test` (they build it with `make baseline`), or set \
             TWC_BASELINE_BIN=$(scripts/build-baseline.sh) (TWC_BASELINE_REF picks the release, \
             default v0.1.0)"
        );
    };
    let path = PathBuf::from(path);
    assert!(
        path.is_file(),
        "TWC_BASELINE_BIN={} is not a file: run `make baseline`",
        path.display()
    );
    path
}

/// Each scenario's sample workers poll a task queue of their own.
fn task_queue(ns: &str, name: &str) -> String {
    format!("upgrade-{ns}-{name}")
}

/// Scenario `name`'s worker deployment running `tag`.
fn manifest(ns: &str, name: &str, tag: &str) -> Value {
    let tq = task_queue(ns, name);
    let gate = json!({ "workflowType": "GatePass" });
    let mut manifest = match name {
        HELD => worker(
            ns,
            name,
            tag,
            json!({ "strategy": "Progressive", "gate": gate, "steps": [
                { "rampPercentage": 25, "pauseDuration": lasting() },
                { "rampPercentage": 50, "pauseDuration": "3s" }
            ] }),
        ),
        // The first version has nothing to wait for; the second waits for its promotion.
        MANUAL if tag == "v1" => worker(ns, name, tag, json!({ "strategy": "AllAtOnce" })),
        MANUAL => worker(ns, name, tag, json!({ "strategy": "Manual", "gate": gate })),
        DRAINED => {
            // Signalled at once, cancelled well after the swap.
            let drain = json!({ "signalAfter": "2s", "cancelAfter": lasting() });
            return drained_worker(ns, name, tag, &tq, drain);
        }
        _ => {
            let steps = json!([{ "rampPercentage": 50, "pauseDuration": lasting() }]);
            let analysis = json!({ "checks": [ {
                "name": "failures", "interval": format!("{}s", MEASURED_EVERY.as_secs()),
                "inconclusiveLimit": INCONCLUSIVE_LIMIT,
                "temporal": { "maxFailurePercent": 50, "minSamples": 3 }
            } ] });
            return analysed_worker(ns, name, tag, &tq, 0, steps, Some(analysis));
        }
    };
    manifest["spec"]["template"]["spec"]["containers"][0]["env"] =
        json!([{ "name": "SAMPLE_TASK_QUEUE", "value": tq }]);
    manifest
}

#[tokio::test]
async fn rollouts_the_last_release_left_held_complete_once_under_this_build() {
    let baseline = baseline_binary();
    eprintln!("baseline controller: {}", baseline.display());
    let mut private = Private::start_with_controller("upgrade", Some(baseline)).await;
    let cluster = &private.cluster;
    let ns = cluster.namespace("upgrade").await;
    cluster.apply(&cluster.connection(&ns, "dev")).await;

    // 1. The release rolls out v1 everywhere, then v2 into each lasting state.
    for name in SCENARIOS {
        cluster.apply(&manifest(&ns, name, "v1")).await;
    }
    for name in SCENARIOS {
        cluster.wait_ready(&ns, name, "v1", ROLLOUT).await;
    }
    let drained_tq = task_queue(&ns, DRAINED);
    let stubborn: Vec<String> = (1..=2).map(|i| format!("{ns}-stub-{i}")).collect();
    let subscription = format!("{ns}-sub");
    for id in &stubborn {
        start_workflow(cluster, "Stubborn", &drained_tq, id).await;
    }
    start_workflow(cluster, "Subscription", &drained_tq, &subscription).await;
    let pinned: Vec<String> = stubborn.iter().chain([&subscription]).cloned().collect();
    wait_runs_within(cluster, &pinned, "RUNNING", "v1", ROLLOUT).await;
    let analysed_load = load_at(
        &cluster.env,
        &task_queue(&ns, ANALYSED),
        &format!("{ns}-load-"),
        LOAD_RATE,
    )
    .await;
    for name in SCENARIOS {
        cluster.apply(&manifest(&ns, name, "v2")).await;
    }
    let applied = Instant::now();
    let (held, manual, drained, analysed) = tokio::join!(
        reached(&ns, HELD, applied, held_in_its_step(cluster, &ns)),
        reached(&ns, MANUAL, applied, waiting_for_promotion(cluster, &ns)),
        reached(
            &ns,
            DRAINED,
            applied,
            drain_signalled(cluster, &ns, &stubborn)
        ),
        reached(&ns, ANALYSED, applied, analysis_measured(cluster, &ns)),
    );
    wait_runs_within(
        cluster,
        std::slice::from_ref(&subscription),
        "RUNNING",
        "v2",
        ROLLOUT,
    )
    .await;

    // 2. The upgrade: the release stops gracefully, the build under test starts. The clocked
    // states (the held step, the analysed step, the drain's cancel) began after v2's apply, so
    // each has at least LASTING minus the time since then left; the swap must fit in it.
    let setup = applied.elapsed();
    assert!(
        setup + SWAP < LASTING,
        "the scenarios took {:.0}s after v2's apply to reach their states (lines above): the \
         held step, the analysed step and the drain's cancel, {}s each, may end before the \
         controller swap (up to {}s) and would be done by the release, not by the build under \
         test; the machine is too loaded for LASTING",
        setup.as_secs_f64(),
        LASTING.as_secs(),
        SWAP.as_secs()
    );
    let stopping = Timestamp::now();
    let swap_began = Instant::now();
    if let Err(e) = private.sandbox.restart_controller_with_binary(None).await {
        panic!("starting the build under test: {e:#}");
    }
    let swap_took = swap_began.elapsed();
    let started = Timestamp::now();
    eprintln!("controller replaced by the build under test between {stopping} and {started}");
    // The check above counted SWAP for this; when the swap took longer, its margin did not hold,
    // and the test says so here rather than leaving it to a later failure to explain.
    assert!(
        swap_took <= SWAP,
        "the controller swap took {:.1}s, more than the {}s the check before it allowed",
        swap_took.as_secs_f64(),
        SWAP.as_secs()
    );

    // 3. Everything completes, unless the build under test cannot run the release's workflows.
    // The held step, the analysed step and the drain's cancel have up to LASTING still to run.
    let complete = async {
        cluster.control(&ns, MANUAL, "promote").await;
        let analysed_ready = async {
            cluster
                .wait_ready(&ns, ANALYSED, "v2", LASTING + ROLLOUT)
                .await;
            drop(analysed_load);
        };
        tokio::join!(
            cluster.wait_ready(&ns, HELD, "v2", LASTING + ROLLOUT),
            cluster.wait_ready(&ns, MANUAL, "v2", ROLLOUT),
            cluster.wait_ready(&ns, DRAINED, "v2", ROLLOUT),
            analysed_ready,
            wait_runs_within(cluster, &stubborn, "CANCELED", "v1", LASTING + ROLLOUT),
        );
    };
    tokio::select! {
        () = complete => {}
        failures = first_task_failures(cluster, &ns) => panic!(
            "the build under test failed workflow tasks of workflows the release \
             ({}) started: a workflow change without a patch (workflows/README.md, \
             \"Versioning policy\")?\n{failures}",
            baseline_binary().display()
        ),
    }
    let builds = [
        (HELD, held.as_str()),
        (MANUAL, manual.as_str()),
        (DRAINED, drained.as_str()),
        (ANALYSED, analysed.as_str()),
    ];
    let expected: Vec<Expected> = builds
        .iter()
        .map(|&(name, build)| Expected {
            namespace: ns.clone(),
            name: name.to_owned(),
            build: build.to_owned(),
            gated: name == HELD || name == MANUAL,
        })
        .collect();
    for one in &expected {
        assert_settled(cluster, one).await;
    }
    assert_no_orphans(cluster, &ns, &expected).await;

    // 4. Each happened once, on the side of the swap it belongs to.
    let swap = Swap { stopping, started };
    let histories = Histories::read(cluster, &ns, &builds).await;
    assert_held_step_ended_once(&histories, &swap, &held);
    assert_promoted_once(&histories, &swap, &manual);
    assert_drained_once(cluster, &histories, &swap, &stubborn, &subscription).await;
    assert_measured_once(cluster, &histories, &swap, &ns, &analysed).await;
    for (name, build) in builds {
        let created = histories.created_deployments(name, build);
        assert_eq!(
            created, 1,
            "{name}: the Deployment of {build} created {created} times"
        );
    }
    for (name, build) in [(HELD, &held), (MANUAL, &manual)] {
        let gates = cluster
            .workflows(&format!(
                "WorkflowId STARTS_WITH 'gate/{ns}/{name}/{build}/'"
            ))
            .await
            .unwrap_or_else(|e| panic!("listing the gates of {name}: {e}"));
        assert_eq!(gates.len(), 1, "{name}: one gate run of {build}: {gates:?}");
    }
    let failures = histories.task_failures();
    assert!(
        failures.is_empty(),
        "workflow tasks failed: {}",
        failures.join("\n")
    );
    private.sandbox.stop().await;
}

/// Awaits `state`, scenario `name`'s wait for its lasting state, and prints how long after
/// `applied` (v2's apply) it got there; returns what the wait returned.
async fn reached<T>(ns: &str, name: &str, applied: Instant, state: impl Future<Output = T>) -> T {
    let out = state.await;
    eprintln!(
        "{ns}/{name} in its state {:.1}s after v2 was applied",
        applied.elapsed().as_secs_f64()
    );
    out
}

/// Waits until v2 of [`HELD`] ramps at 25 % in its held step; returns its build ID.
async fn held_in_its_step(cluster: &Cluster, ns: &str) -> String {
    cluster
        .wait("the held step at 25 %", ROLLOUT, || async {
            let twd = get_twd(&cluster.client, ns, HELD).await?;
            let build = target_build(&twd).filter(|b| b.starts_with("v2-"));
            let routing = cluster.routing(&format!("{ns}/{HELD}")).await?;
            let progressing = condition(&twd, "Progressing").map(|c| c.1);
            match build {
                Some(build)
                    if routing.ramping.as_deref() == Some(build.as_str())
                        && (routing.percentage - 25.0).abs() < 0.01
                        && progressing.as_deref() == Some("Ramping") =>
                {
                    Ok(build)
                }
                _ => Err(format!("routing {routing:?}; {}", status_text(&twd))),
            }
        })
        .await
}

/// Waits until v2 of [`MANUAL`] passed its gate and waits for promotion; returns its build ID.
async fn waiting_for_promotion(cluster: &Cluster, ns: &str) -> String {
    cluster
        .wait(
            "the Manual build waiting for promotion",
            ROLLOUT,
            || async {
                let twd = get_twd(&cluster.client, ns, MANUAL).await?;
                let waiting =
                    condition(&twd, "Ready").is_some_and(|c| c.1 == "WaitingForPromotion");
                let target = twd.status.as_ref().and_then(|s| s.target_version.clone());
                let gate_passed = target.as_ref().is_some_and(|t| {
                    !t.test_workflows.is_empty()
                        && t.test_workflows.iter().all(|w| w.status == "Completed")
                });
                match target_build(&twd) {
                    Some(build)
                        if build.starts_with("v2-") && waiting && gate_passed && fresh(&twd) =>
                    {
                        Ok(build)
                    }
                    _ => Err(status_text(&twd)),
                }
            },
        )
        .await
}

/// Waits until v2 of [`DRAINED`] is Current and v1's drain signal reached every `stubborn`
/// workflow, none cancelled yet; returns v2's build ID.
async fn drain_signalled(cluster: &Cluster, ns: &str, stubborn: &[String]) -> String {
    let twd = cluster.wait_ready(ns, DRAINED, "v2", ROLLOUT).await;
    cluster
        .wait(
            "the drain signal sent, the cancel not yet",
            ROLLOUT,
            || async {
                let signalled = events(&cluster.client, ns, DRAINED)
                    .await
                    .iter()
                    .any(|(_, reason, _)| reason == "DrainSignalled");
                for id in stubborn {
                    let (signals, cancels) = (
                        drain_signals(cluster, id).await?,
                        cancel_requests(cluster, id).await?,
                    );
                    assert_eq!(
                        cancels, 0,
                        "{id} cancelled before the upgrade: lengthen LASTING"
                    );
                    if signals != 1 || !signalled {
                        return Err(format!("{id}: {signals} drain signals; event {signalled}"));
                    }
                }
                Ok(())
            },
        )
        .await;
    target_build(&twd).unwrap_or_default()
}

/// Waits until v2 of [`ANALYSED`] ramps at 50 % with a measurement recorded; returns its build
/// ID.
async fn analysis_measured(cluster: &Cluster, ns: &str) -> String {
    cluster
        .wait(
            "a first measurement of the analysed step",
            ROLLOUT,
            || async {
                let twd = get_twd(&cluster.client, ns, ANALYSED).await?;
                let recorded = analysis_status(&cluster.client, ns, ANALYSED).await?;
                let measured = recorded[0]["successful"].as_i64().unwrap_or(0)
                    + recorded[0]["inconclusive"].as_i64().unwrap_or(0);
                let routing = cluster.routing(&format!("{ns}/{ANALYSED}")).await?;
                match target_build(&twd) {
                    Some(build)
                        if build.starts_with("v2-")
                            && routing.ramping.as_deref() == Some(build.as_str())
                            && measured >= 1 =>
                    {
                        Ok(build)
                    }
                    _ => Err(format!("routing {routing:?}; analysis {recorded}")),
                }
            },
        )
        .await
}

/// When the release's controller was asked to stop, and when the build under test had started:
/// what a history records before the first was done by the release, after the second by the
/// build under test.
struct Swap {
    stopping: Timestamp,
    started: Timestamp,
}

impl Swap {
    /// Asserts that `what` happened once, before the swap (`before`) or after it.
    fn assert_once(&self, what: &str, times: &[Timestamp], before: bool) {
        assert_eq!(times.len(), 1, "{what} {} times: {times:?}", times.len());
        let (side, on_its_side) = if before {
            ("before the upgrade", times[0] < self.stopping)
        } else {
            ("after the upgrade", times[0] > self.started)
        };
        assert!(
            on_its_side,
            "{what} at {}, not {side} (stopping {}, started {}): the scenario was not in \
             its state at the upgrade",
            times[0], self.stopping, self.started
        );
    }
}

/// Every run's events of the engine workflows of the scenarios (`twd/...`, `rollout/.../v2`).
struct Histories {
    /// (workflow ID, events of each of its runs, oldest first).
    workflows: Vec<(String, Vec<Vec<Value>>)>,
}

impl Histories {
    async fn read(cluster: &Cluster, ns: &str, builds: &[(&str, &str)]) -> Self {
        let mut workflows = Vec::new();
        for (name, build) in builds {
            for id in [
                format!("twd/{ns}/{name}"),
                format!("rollout/{ns}/{name}/{build}"),
            ] {
                let runs = run_histories(cluster, &id)
                    .await
                    .unwrap_or_else(|e| panic!("reading the history of {id}: {e}"));
                workflows.push((id, runs));
            }
        }
        Self { workflows }
    }

    /// Events of every run of the workflows whose ID starts with `prefix`.
    fn events(&self, prefix: &str) -> impl Iterator<Item = &Vec<Value>> {
        self.workflows
            .iter()
            .filter(move |(id, _)| id.starts_with(prefix))
            .flat_map(|(_, runs)| runs)
    }

    /// (when scheduled, input) of each `activity` scheduled by the workflows of `prefix`.
    fn scheduled(&self, prefix: &str, activity: &str) -> Vec<(Timestamp, Value)> {
        self.events(prefix)
            .flatten()
            .filter(|e| {
                e["activityTaskScheduledEventAttributes"]["activityType"]["name"] == activity
            })
            .map(|e| {
                let input = payload(&e["activityTaskScheduledEventAttributes"]["input"]);
                (event_time(e), input)
            })
            .collect()
    }

    /// When each routing write of `rollout/<ns>/<name>/<build>` matching `change` was scheduled.
    fn routing_writes(
        &self,
        name: &str,
        build: &str,
        change: impl Fn(&Value) -> bool,
    ) -> Vec<Timestamp> {
        self.scheduled(
            &format!("rollout/{}/{name}/{build}", self.namespace()),
            "set_routing",
        )
        .into_iter()
        .filter(|(_, input)| change(&input["change"]))
        .map(|(at, _)| at)
        .collect()
    }

    /// How many `create_deployment` activities of scenario `name` created `build`'s Deployment.
    fn created_deployments(&self, name: &str, build: &str) -> usize {
        let ns = self.namespace();
        let mut created = 0;
        for runs in [
            self.events(&format!("twd/{ns}/{name}")),
            self.events(&format!("rollout/{ns}/{name}/{build}")),
        ] {
            for events in runs {
                let creates: Vec<&str> = events
                    .iter()
                    .filter(|e| {
                        e["activityTaskScheduledEventAttributes"]["activityType"]["name"]
                            == "create_deployment"
                            && payload(&e["activityTaskScheduledEventAttributes"]["input"])
                                ["build_id"]
                                == build
                    })
                    .filter_map(|e| e["eventId"].as_str())
                    .collect();
                created += events
                    .iter()
                    .filter(|e| {
                        let done = &e["activityTaskCompletedEventAttributes"];
                        done["scheduledEventId"]
                            .as_str()
                            .is_some_and(|id| creates.contains(&id))
                            && payload(&done["result"]).get("Created").is_some()
                    })
                    .count();
            }
        }
        created
    }

    /// The Kubernetes namespace of the scenarios (from the first workflow ID).
    fn namespace(&self) -> &str {
        self.workflows
            .first()
            .and_then(|(id, _)| id.split('/').nth(1))
            .unwrap_or_default()
    }

    /// Every failed workflow task, in words.
    fn task_failures(&self) -> Vec<String> {
        self.workflows
            .iter()
            .flat_map(|(id, runs)| {
                runs.iter()
                    .flat_map(move |events| task_failures(id, events))
            })
            .collect()
    }
}

/// The held step ended under the build under test: 25 % written once by the release, 50 % and
/// Current once each by the build under test.
fn assert_held_step_ended_once(histories: &Histories, swap: &Swap, build: &str) {
    let ramp =
        |pct: u64| histories.routing_writes(HELD, build, |c| c["SetRamping"]["percentage"] == pct);
    swap.assert_once("held: the 25 % ramp written", &ramp(25), true);
    swap.assert_once("held: the 50 % ramp written", &ramp(50), false);
    let current = histories.routing_writes(HELD, build, |c| c.get("SetCurrent").is_some());
    swap.assert_once("held: set Current", &current, false);
}

/// The Manual build was promoted once, by the build under test, and never ramped.
fn assert_promoted_once(histories: &Histories, swap: &Swap, build: &str) {
    let current = histories.routing_writes(MANUAL, build, |c| c.get("SetCurrent").is_some());
    swap.assert_once("manual: set Current", &current, false);
    let ramps = histories.routing_writes(MANUAL, build, |c| c.get("SetRamping").is_some());
    assert!(ramps.is_empty(), "manual: ramped {ramps:?}");
}

/// v1's drain: one signal batch by the release, one cancel batch by the build under test; each
/// pinned workflow signalled once, each stubborn one cancelled once, the obeying one not.
async fn assert_drained_once(
    cluster: &Cluster,
    histories: &Histories,
    swap: &Swap,
    stubborn: &[String],
    subscription: &str,
) {
    let ns = histories.namespace().to_owned();
    let batches = histories.scheduled(&format!("twd/{ns}/{DRAINED}"), "drain_version");
    let of = |action: &str| -> Vec<Timestamp> {
        batches
            .iter()
            .filter(|(_, input)| input["action"] == action || input["action"].get(action).is_some())
            .map(|(at, _)| *at)
            .collect()
    };
    swap.assert_once("drained: the signal batch", &of("Signal"), true);
    swap.assert_once("drained: the cancel batch", &of("Cancel"), false);
    for id in stubborn.iter().map(String::as_str).chain([subscription]) {
        let signals = drain_signals(cluster, id)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let cancels = cancel_requests(cluster, id)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let expected_cancels = usize::from(id != subscription);
        assert_eq!(
            (signals, cancels),
            (1, expected_cancels),
            "{id}: (drain signals, cancel requests)"
        );
    }
    let (status, build) = latest_run(cluster, subscription)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        status == "RUNNING" && build.starts_with("v2-"),
        "{subscription} moved to v2: {status} on {build}"
    );
}

/// Every measurement of the analysed step is in the status once, with some made by each build.
async fn assert_measured_once(
    cluster: &Cluster,
    histories: &Histories,
    swap: &Swap,
    ns: &str,
    build: &str,
) {
    let prefix = format!("rollout/{ns}/{ANALYSED}/{build}");
    let mut verdicts = Vec::new();
    let (mut before, mut after) = (0, 0);
    for events in histories.events(&prefix) {
        let history = json!({ "events": events });
        verdicts.extend(recorded_verdicts(&history));
    }
    for (at, _) in histories.scheduled(&prefix, "run_analysis") {
        if at < swap.stopping {
            before += 1;
        } else if at > swap.started {
            after += 1;
        }
    }
    assert!(
        before >= 1 && after >= 1,
        "analysed: measured {before} times before the upgrade and {after} after"
    );
    let twd = get_twd(&cluster.client, ns, ANALYSED)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let rollout = twd.status.and_then(|s| s.rollout).unwrap_or_default();
    let check = rollout.analysis.first().cloned().unwrap_or_default();
    let count = |verdict: &str| {
        i32::try_from(verdicts.iter().filter(|v| *v == verdict).count()).unwrap_or(i32::MAX)
    };
    assert_eq!(
        (check.successful, check.failed),
        (count("Successful"), count("Failed")),
        "analysed: status counts each measurement of the history once: {check:?}, history \
         {verdicts:?}"
    );
}

/// Every run's events of workflow `id`, oldest run first.
async fn run_histories(cluster: &Cluster, id: &str) -> Result<Vec<Vec<Value>>, String> {
    let mut runs = cluster.workflows(&format!("WorkflowId = '{id}'")).await?;
    runs.reverse();
    let mut histories = Vec::new();
    for run in runs {
        let text = cluster
            .history(&cluster.env.temporal_namespace, id, &run.run_id)
            .await?;
        let history: Value = serde_json::from_str(&text).map_err(|e| format!("{e}: {text}"))?;
        histories.push(history["events"].as_array().cloned().unwrap_or_default());
    }
    Ok(histories)
}

/// Reads the histories of the namespace's engine workflows every [`TASK_FAILURE_SCAN`] until
/// one has a failed workflow task; returns them all, in words. Never returns while none fails.
async fn first_task_failures(cluster: &Cluster, ns: &str) -> String {
    let query =
        format!("WorkflowId STARTS_WITH 'twd/{ns}/' OR WorkflowId STARTS_WITH 'rollout/{ns}/'");
    let mut scans = tokio::time::interval(TASK_FAILURE_SCAN);
    loop {
        scans.tick().await;
        let Ok(rows) = cluster.workflows(&query).await else {
            continue;
        };
        let mut failures = Vec::new();
        for row in rows {
            if let Ok(text) = cluster
                .history(&cluster.env.temporal_namespace, &row.id, &row.run_id)
                .await
                && let Ok(history) = serde_json::from_str::<Value>(&text)
            {
                let events = history["events"].as_array().cloned().unwrap_or_default();
                failures.extend(task_failures(&row.id, &events));
            }
        }
        if !failures.is_empty() {
            return failures.join("\n");
        }
    }
}

/// The failed workflow tasks of one run, in words: workflow, event, cause, message. Not counted:
/// a task that tried to close the workflow while a signal came in (`UNHANDLED_COMMAND`), which
/// the server answers with a new task, as under one binary.
fn task_failures(id: &str, events: &[Value]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| {
            let failed = e.get("workflowTaskFailedEventAttributes")?;
            if failed["cause"]
                .as_str()
                .is_some_and(|c| c.contains("UNHANDLED_COMMAND") || c.contains("UnhandledCommand"))
            {
                return None;
            }
            Some(format!(
                "{id} event {}: workflow task failed ({}): {}",
                e["eventId"].as_str().unwrap_or("?"),
                failed["cause"].as_str().unwrap_or("no cause"),
                failed["failure"]["message"]
                    .as_str()
                    .unwrap_or("no message")
            ))
        })
        .collect()
}

/// The JSON value of the first payload of a `payloads` object (activity input or result).
pub(crate) fn payload(payloads: &Value) -> Value {
    payloads["payloads"][0]["data"]
        .as_str()
        .and_then(|data| base64::engine::general_purpose::STANDARD.decode(data).ok())
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}

/// When an event was recorded.
pub(crate) fn event_time(event: &Value) -> Timestamp {
    event["eventTime"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("an event without a time: {event}"))
}
