//! Reliability and security suite: rollouts while the controller is SIGKILLed at seeded-random
//! moments, while the Temporal dev server and the kube-apiserver restart, with two controllers
//! at once, under rapid-fire template changes, with hostile input, and with secrets that must
//! never leak. Each ends with the invariants of [`invariants`]: status, Deployments, routing and
//! the engine's workflows agree, nothing orphaned, nothing doubled.
//!
//! Tests that kill or restart servers, or run a second controller, start a private sandbox
//! ([`cluster::Private`]); the others use the shared one.
//!
//! Sizes come from environment variables with small defaults (`make test`); `make chaos` runs the
//! full-size suite: `CHAOS_ROLLOUTS` (TWDs rolled out twice under kills, 6), `CHAOS_KILLS`
//! (2 per TWD), `CHAOS_MAX_GAP_MS` (longest wait for a kill's trigger, 8000),
//! `CHAOS_MAX_DOWN_MS` (longest controller downtime, 2000), `CHAOS_REPLICA_ROLLOUTS` (TWDs of
//! the two-controller test, 4), `CHAOS_RAPID_CHANGES` (10) and `CHAOS_SEED` (printed; the same
//! seed plays the same kill schedule).

pub(crate) mod cluster;
mod hostile;
pub(crate) mod invariants;
mod schedule;
mod secrets;

use std::time::{Duration, Instant};

use futures::future::join_all;
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};
use twc_sandbox::up::{Sandbox, StopMode};

use self::cluster::{Cluster, Private};
use self::invariants::{Expected, assert_no_duplicate_gates, assert_no_orphans, assert_settled};
use self::schedule::{Rng, env_count, seed};
use twc_workflows::model::TwdRef;
use twc_workflows::twd_workflow::{SpecSignal, TwdInput};

use crate::harness::twd::{get_twd, target_build, worker};

/// A rollout finishes well within this, even while its controller is being killed.
const ROLLOUT: Duration = Duration::from_secs(300);

/// A watcher's signal (or its retry, every 5 s) lands well within this; far below the TWD
/// workflow's 5-minute resync.
const NUDGE: Duration = Duration::from_secs(60);

/// How a TWD of these tests rolls out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Strategy {
    AllAtOnce,
    /// Two short steps: 25% for 2s, 75% for 2s.
    Progressive,
    /// Promoted with the `promote` signal once it waits for promotion.
    Manual,
}

/// One TWD of a test and how it rolls out.
#[derive(Debug, Clone)]
struct Plan {
    name: String,
    strategy: Strategy,
    /// Runs the `GatePass` gate workflow.
    gated: bool,
}

impl Plan {
    /// `count` TWDs cycling through the strategies, every other one gated.
    fn mixed(count: usize) -> Vec<Self> {
        let strategies = [Strategy::AllAtOnce, Strategy::Progressive, Strategy::Manual];
        (0..count)
            .map(|i| Self {
                name: format!("w{i}"),
                strategy: strategies[i % strategies.len()],
                gated: i % 2 == 1,
            })
            .collect()
    }

    fn rollout(&self) -> Value {
        let mut rollout = match self.strategy {
            Strategy::AllAtOnce => json!({ "strategy": "AllAtOnce" }),
            Strategy::Progressive => json!({ "strategy": "Progressive", "steps": [
                { "rampPercentage": 25, "pauseDuration": "2s" },
                { "rampPercentage": 75, "pauseDuration": "2s" }
            ] }),
            Strategy::Manual => json!({ "strategy": "Manual" }),
        };
        if self.gated {
            rollout["gate"] = json!({ "workflowType": "GatePass" });
        }
        rollout
    }

    /// The TWD running the sample worker image `tag`. The progress deadline is long: killed
    /// controllers and restarted servers slow registration down, and a deadline stop is not
    /// what these tests look at.
    fn manifest(&self, namespace: &str, tag: &str) -> Value {
        let mut manifest = worker(namespace, &self.name, tag, self.rollout());
        manifest["spec"]["progressDeadlineSeconds"] = json!(900);
        manifest
    }

    fn expected(&self, namespace: &str, build: String) -> Expected {
        Expected {
            namespace: namespace.to_owned(),
            name: self.name.clone(),
            build,
            gated: self.gated,
        }
    }
}

/// Applies `tag` and waits until its build is Current, promoting a Manual rollout with the
/// `promote` signal once it waits for promotion; returns the build ID.
async fn roll_out(cluster: &Cluster, namespace: &str, plan: &Plan, tag: &str) -> String {
    cluster.apply(&plan.manifest(namespace, tag)).await;
    if plan.strategy == Strategy::Manual {
        let prefix = format!("{tag}-");
        cluster
            .wait(
                &format!("{namespace}/{} {tag} waits for promotion", plan.name),
                ROLLOUT,
                || async {
                    let twd = get_twd(&cluster.client, namespace, &plan.name).await?;
                    let waiting = crate::harness::twd::condition(&twd, "Ready")
                        .is_some_and(|(_, reason, _)| reason == "WaitingForPromotion");
                    let target = target_build(&twd).unwrap_or_default();
                    if waiting && cluster::fresh(&twd) && target.starts_with(&prefix) {
                        Ok(())
                    } else {
                        Err(cluster::status_text(&twd))
                    }
                },
            )
            .await;
        cluster.control(namespace, &plan.name, "promote").await;
    }
    let twd = cluster
        .wait_ready(namespace, &plan.name, tag, ROLLOUT)
        .await;
    target_build(&twd).unwrap_or_default()
}

/// Rolls each plan out to `v1`, then to `v2`, all TWDs at once; returns the expected end states.
async fn roll_out_twice(cluster: &Cluster, namespace: &str, plans: &[Plan]) -> Vec<Expected> {
    join_all(plans.iter().map(|plan| async move {
        roll_out(cluster, namespace, plan, "v1").await;
        let build = roll_out(cluster, namespace, plan, "v2").await;
        plan.expected(namespace, build)
    }))
    .await
}

/// Checks every TWD's end state, then the namespace as a whole.
async fn assert_all_settled(cluster: &Cluster, namespace: &str, expected: &[Expected]) {
    join_all(expected.iter().map(|e| assert_settled(cluster, e))).await;
    assert_no_orphans(cluster, namespace, expected).await;
    assert_no_duplicate_gates(cluster, &cluster.env.temporal_namespace).await;
}

/// What the chaos schedule waits for before the next kill.
#[derive(Debug, Clone, Copy)]
enum Trigger {
    /// A seeded delay.
    Delay,
    /// The next new Event with this reason in the namespace (a step just taken), or a
    /// seeded fallback delay when none comes.
    Event(&'static str),
}

const TRIGGERS: &[Trigger] = &[
    Trigger::Delay,
    Trigger::Event("DeploymentCreated"),
    Trigger::Event("GatePassed"),
    Trigger::Event("Ramped"),
    Trigger::Event("Promoted"),
    Trigger::Event("RolloutComplete"),
    Trigger::Event("ScaledDown"),
    Trigger::Event("DeploymentDeleted"),
];

/// Number of Events with `reason` in the namespace.
async fn event_count(client: &kube::Client, namespace: &str, reason: &str) -> usize {
    Api::<Event>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .map(|l| {
            l.items
                .iter()
                .filter(|e| e.reason.as_deref() == Some(reason))
                .count()
        })
        .unwrap_or_default()
}

/// SIGKILLs the controller up to `kills` times on the seeded schedule, restarting it after a
/// seeded downtime, and records one line per kill in `log`. Between kills it waits for its
/// trigger, at most `CHAOS_MAX_GAP_MS` (default 8 s); the downtime is at most
/// `CHAOS_MAX_DOWN_MS` (default 2 s).
async fn kill_controller_repeatedly(
    sandbox: &mut Sandbox,
    client: &kube::Client,
    namespace: &str,
    rng: &mut Rng,
    kills: usize,
    log: &mut Vec<String>,
) {
    let max_gap = env_count("CHAOS_MAX_GAP_MS", 8_000).max(1_500) as u64;
    let max_down = env_count("CHAOS_MAX_DOWN_MS", 2_000) as u64;
    for kill in 1..=kills {
        let trigger = *rng.pick(TRIGGERS);
        let fallback = rng.millis(1_500, max_gap);
        let waited = Instant::now();
        match trigger {
            // The seeded delay *is* the schedule (when to crash), not a wait for a condition.
            Trigger::Delay => tokio::time::sleep(fallback).await,
            Trigger::Event(reason) => {
                let before = event_count(client, namespace, reason).await;
                let deadline = Instant::now() + fallback;
                while Instant::now() < deadline
                    && event_count(client, namespace, reason).await <= before
                {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        let pid = sandbox.kill_controller().await;
        let downtime = rng.millis(0, max_down);
        // The seeded downtime is part of the schedule too: how long no controller runs.
        tokio::time::sleep(downtime).await;
        sandbox.restart_dead_controller();
        let line = format!(
            "kill {kill}: {trigger:?} after {:.1}s, pid {pid:?}, down {:.1}s",
            waited.elapsed().as_secs_f64(),
            downtime.as_secs_f64()
        );
        eprintln!("chaos: {line}");
        log.push(line);
    }
}

#[tokio::test]
async fn controller_killed_at_random_moments_still_completes_every_rollout_exactly_once() {
    let started = Instant::now();
    let seed = seed("crash");
    let mut rng = Rng::new(seed);
    let count = env_count("CHAOS_ROLLOUTS", 6);
    let kills = env_count("CHAOS_KILLS", 2 * count);
    let Private {
        mut sandbox,
        cluster,
    } = Private::start("crash").await;
    let ns = cluster.namespace("crash").await;
    cluster.apply(&cluster.connection(&ns, "dev")).await;
    let plans = Plan::mixed(count);

    let mut schedule = Vec::new();
    let work = roll_out_twice(&cluster, &ns, &plans);
    tokio::pin!(work);
    let expected = {
        let chaos = kill_controller_repeatedly(
            &mut sandbox,
            &cluster.client,
            &ns,
            &mut rng,
            kills,
            &mut schedule,
        );
        tokio::pin!(chaos);
        tokio::select! {
            expected = &mut work => expected,
            () = &mut chaos => work.await,
        }
    };
    // The rollouts may have finished between a kill and its restart.
    sandbox.restart_dead_controller();
    eprintln!(
        "crash: {count} TWDs rolled out twice under {} kills in {:.0}s",
        schedule.len(),
        started.elapsed().as_secs_f64()
    );
    assert_all_settled(&cluster, &ns, &expected).await;
    eprintln!(
        "crash: seed {seed}, settled after {:.0}s; schedule:\n  {}",
        started.elapsed().as_secs_f64(),
        schedule.join("\n  ")
    );
    sandbox.stop().await;
}

#[tokio::test]
async fn temporal_and_apiserver_restarts_mid_rollout_recover_without_help() {
    let started = Instant::now();
    let Private {
        mut sandbox,
        cluster,
    } = Private::start("restarts").await;
    let ns = cluster.namespace("restarts").await;
    cluster.apply(&cluster.connection(&ns, "dev")).await;
    let ramping = Plan {
        name: "ramping".into(),
        strategy: Strategy::Progressive,
        gated: false,
    };
    let gated = Plan {
        name: "gated".into(),
        strategy: Strategy::Progressive,
        gated: true,
    };
    let direct = Plan {
        name: "direct".into(),
        strategy: Strategy::AllAtOnce,
        gated: true,
    };
    let plans = [ramping.clone(), gated.clone(), direct.clone()];
    join_all(plans.iter().map(|p| roll_out(&cluster, &ns, p, "v1"))).await;

    // v2 everywhere; once `ramping` is at its first step, the Temporal dev server goes down.
    for plan in &plans {
        cluster.apply(&plan.manifest(&ns, "v2")).await;
    }
    let deployment_name = format!("{ns}/{}", ramping.name);
    cluster
        .wait("v2 of `ramping` ramps", ROLLOUT, || async {
            let r = cluster.routing(&deployment_name).await?;
            match r.ramping {
                Some(build) if build.starts_with("v2-") => Ok(()),
                _ => Err(format!("{r:?}")),
            }
        })
        .await;
    let down = Instant::now();
    if let Err(e) = sandbox
        .restart_temporal(StopMode::Kill, Duration::from_secs(2))
        .await
    {
        panic!("restarting Temporal: {e:#}\n{}", cluster.logs());
    }
    eprintln!(
        "restarts: Temporal killed mid-ramp and back after {:.1}s",
        down.elapsed().as_secs_f64()
    );

    // Once `gated` has moved on after that (its gate passed), the kube-apiserver goes down.
    cluster
        .wait("`gated` passes its v2 gate", ROLLOUT, || async {
            let twd = get_twd(&cluster.client, &ns, &gated.name).await?;
            let passed = twd
                .status
                .as_ref()
                .and_then(|s| s.target_version.as_ref())
                .is_some_and(|t| {
                    t.version.build_id.starts_with("v2-")
                        && !t.test_workflows.is_empty()
                        && t.test_workflows.iter().all(|w| w.status == "Completed")
                });
            if passed {
                Ok(())
            } else {
                Err(cluster::status_text(&twd))
            }
        })
        .await;
    cluster.apply(&direct.manifest(&ns, "v3")).await;
    let down = Instant::now();
    if let Err(e) = sandbox
        .restart_apiserver(StopMode::Kill, Duration::from_secs(2))
        .await
    {
        panic!("restarting the kube-apiserver: {e:#}\n{}", cluster.logs());
    }
    eprintln!(
        "restarts: kube-apiserver killed mid-rollout and back after {:.1}s",
        down.elapsed().as_secs_f64()
    );
    // A change made after the restart reaches the controller through its re-established watch.
    cluster.apply(&ramping.manifest(&ns, "v3")).await;

    let mut expected = Vec::new();
    for (plan, tag) in [(&ramping, "v3"), (&gated, "v2"), (&direct, "v3")] {
        let twd = cluster.wait_ready(&ns, &plan.name, tag, ROLLOUT).await;
        expected.push(plan.expected(&ns, target_build(&twd).unwrap_or_default()));
    }
    assert_all_settled(&cluster, &ns, &expected).await;
    eprintln!(
        "restarts: settled after {:.0}s",
        started.elapsed().as_secs_f64()
    );
    sandbox.stop().await;
}

/// A TemporalConnection changed while the engine Temporal is down: the watcher's nudge of the
/// TWDs that use it fails, and is sent again once Temporal is back, rather than left to the TWD
/// workflow's resync five minutes later.
#[tokio::test]
async fn a_connection_change_made_while_temporal_is_down_reaches_its_twd_once_temporal_is_back() {
    let Private {
        mut sandbox,
        cluster,
    } = Private::start("nudge").await;
    let ns = cluster.namespace("nudge").await;
    cluster.apply(&cluster.connection(&ns, "dev")).await;
    let plan = Plan {
        name: "nudged".into(),
        strategy: Strategy::AllAtOnce,
        gated: false,
    };
    roll_out(&cluster, &ns, &plan, "v1").await;
    let workflow_id = TwdRef {
        namespace: ns.clone(),
        name: plan.name.clone(),
    }
    .twd_workflow_id();
    let spec_signals = || async {
        crate::drain::count_events(&cluster, &workflow_id, |e| {
            e["workflowExecutionSignaledEventAttributes"]["signalName"].as_str()
                == Some("spec_changed")
        })
        .await
    };
    let before = cluster
        .wait("the TWD workflow's history", NUDGE, spec_signals)
        .await;
    let controller_log = cluster
        .env
        .controller_log
        .clone()
        .unwrap_or_else(|| panic!("the private sandbox runs no controller"));
    let failures = |key: &str| {
        std::fs::read_to_string(&controller_log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("signalling TWD workflow failed") && l.contains(key))
            .count()
    };
    let key = format!("{ns}/{}", plan.name);
    let failed_before = failures(&key);

    // Temporal goes down for a while (a schedule); meanwhile the connection changes (a label
    // does not change its generation, a spec field does) and the watcher's nudge fails.
    let mut changed = cluster.connection(&ns, "dev");
    changed["spec"]["hostPort"] = json!("127.0.0.1:1");
    let change = async {
        cluster
            .wait("Temporal down", NUDGE, || async {
                let health = cluster.temporal(&["operator", "cluster", "health"]).await;
                if health.success {
                    Err("still answering".to_owned())
                } else {
                    Ok(())
                }
            })
            .await;
        cluster.apply(&changed).await;
        cluster
            .wait("the watcher's nudge failing", NUDGE, || async {
                if failures(&key) > failed_before {
                    Ok(())
                } else {
                    Err("no failed signal logged".to_owned())
                }
            })
            .await;
    };
    let (restarted, ()) = tokio::join!(
        sandbox.restart_temporal(StopMode::Kill, Duration::from_secs(20)),
        change
    );
    if let Err(e) = restarted {
        panic!("restarting Temporal: {e:#}\n{}", cluster.logs());
    }

    // Well within the 5-minute resync, the nudge arrives.
    cluster
        .wait("the nudge recorded after the restart", NUDGE, || async {
            let now = spec_signals().await?;
            if now > before {
                Ok(())
            } else {
                Err(format!("{now} spec_changed signals, as before the change"))
            }
        })
        .await;
    sandbox.stop().await;
}

#[tokio::test]
async fn two_controllers_on_one_task_queue_roll_out_like_one() {
    let started = Instant::now();
    let Private {
        mut sandbox,
        cluster,
    } = Private::start("replicas").await;
    let second_log = sandbox
        .start_extra_controller()
        .unwrap_or_else(|e| panic!("starting a second controller: {e:#}"));
    let ns = cluster.namespace("replicas").await;
    cluster.apply(&cluster.connection(&ns, "dev")).await;
    let plans = Plan::mixed(env_count("CHAOS_REPLICA_ROLLOUTS", 4));
    let expected = roll_out_twice(&cluster, &ns, &plans).await;
    assert_all_settled(&cluster, &ns, &expected).await;

    // Both took part: each watcher signals every TWD it sees, and each worker ran activities
    // (their log lines carry the SDK's `RunActivity` span). The status each TWD ended with is
    // the projection of one consistent state, not the last of two fighting writers.
    for log in sandbox.controller_logs() {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        for sign in ["signalled TWD workflow", "RunActivity"] {
            assert!(
                text.contains(sign),
                "{} shows no {sign:?}:\n{}",
                log.display(),
                twc_sandbox::process::tail(&log, 40)
            );
        }
    }
    assert!(second_log.exists());
    // They count each other (their Leases) and so take half the read budget each.
    let url = cluster
        .env
        .controller_metrics_url
        .clone()
        .unwrap_or_else(|| panic!("the private sandbox names no controller metrics URL"));
    cluster
        .wait("the controller counts two replicas", ROLLOUT, || async {
            let page = twc_sandbox::http::get(&url).await?;
            let line = page
                .body
                .lines()
                .find(|l| l.starts_with("twc_controller_replicas "))
                .map(str::to_owned);
            match line.as_deref() {
                Some("twc_controller_replicas 2") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    for e in &expected {
        let twd = get_twd(&cluster.client, &ns, &e.name)
            .await
            .unwrap_or_else(|err| panic!("{err}"));
        let status = twd.status.clone().unwrap_or_default();
        assert_eq!(
            status.rollout.as_ref().and_then(|r| r.workflow_id.clone()),
            Some(format!("rollout/{ns}/{}/{}", e.name, e.build)),
            "status follows the last rollout: {status:?}"
        );
        assert_eq!(status.observed_generation, twd.metadata.generation);
    }
    eprintln!(
        "replicas: {} TWDs rolled out twice by two controllers in {:.0}s",
        plans.len(),
        started.elapsed().as_secs_f64()
    );
    sandbox.stop().await;
}

#[tokio::test]
async fn ten_image_changes_in_two_seconds_converge_on_the_last_and_retire_the_rest() {
    let cluster = Cluster::shared().await;
    let ns = cluster.namespace("rapid").await;
    cluster.apply(&cluster.connection(&ns, "dev")).await;
    let plan = Plan {
        name: "hello".into(),
        strategy: Strategy::Progressive,
        gated: true,
    };
    roll_out(&cluster, &ns, &plan, "v1").await;

    let changes = env_count("CHAOS_RAPID_CHANGES", 10);
    let tags: Vec<String> = (1..=changes).map(|i| format!("r{i}")).collect();
    let api: Api<twc_crds::WorkerDeployment> = Api::namespaced(cluster.client.clone(), &ns);
    let params = kube::api::PatchParams::apply("chaos-test").force();
    // Spread evenly over under two seconds, as a burst of CI pushes would be: the sleeps are
    // the schedule of the changes, not waits for anything.
    let spacing = Duration::from_millis(1_800) / u32::try_from(changes.max(1)).unwrap_or(1);
    let began = Instant::now();
    for (i, tag) in tags.iter().enumerate() {
        let manifest = plan.manifest(&ns, tag);
        if let Err(e) = api
            .patch(&plan.name, &params, &kube::api::Patch::Apply(&manifest))
            .await
        {
            panic!("applying {tag}: {e}");
        }
        let due = spacing * u32::try_from(i + 1).unwrap_or(u32::MAX);
        tokio::time::sleep(due.saturating_sub(began.elapsed())).await;
    }
    let burst = began.elapsed();
    // On a loaded machine the API calls alone may take longer; that only makes the burst slower.
    eprintln!("rapid: {changes} changes in {:.2}s", burst.as_secs_f64());

    let last = tags.last().cloned().unwrap_or_default();
    let twd = cluster.wait_ready(&ns, &plan.name, &last, ROLLOUT).await;
    let build = target_build(&twd).unwrap_or_default();
    let expected = plan.expected(&ns, build.clone());
    assert_settled(&cluster, &expected).await;

    // Every superseded rollout that started ended as Superseded, and its gates are not running;
    // none of the intermediate builds was ever promoted.
    let rollouts = cluster
        .workflows(&format!("WorkflowId STARTS_WITH 'rollout/{ns}/hello/'"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    for row in &rollouts {
        let row_build = row.id.rsplit('/').next().unwrap_or_default();
        let outcome = if row_build == build || row_build.starts_with("v1-") {
            "Complete"
        } else {
            "Superseded"
        };
        let query = format!("WorkflowId = '{}' AND TwcOutcome = '{outcome}'", row.id);
        cluster
            .wait(&format!("{} ended {outcome}", row.id), ROLLOUT, || async {
                match cluster.workflows(&query).await?.as_slice() {
                    [one] if one.status == "COMPLETED" => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            })
            .await;
    }
    let promoted = crate::harness::controls::events(&cluster.client, &ns, &plan.name)
        .await
        .into_iter()
        .filter(|(_, reason, _)| reason == "Promoted")
        .map(|(_, _, message)| message)
        .collect::<Vec<_>>();
    assert!(
        promoted
            .iter()
            .all(|m| m.contains(&build) || m.contains(" v1-")),
        "only v1 and the last build were promoted: {promoted:?}"
    );
    eprintln!(
        "rapid: {} rollout workflows for {changes} changes; converged on {build}",
        rollouts.len()
    );
}

/// The resync the test's TWD workflows start with (the watcher's would be the controller's
/// `TWC_RESYNC_INTERVAL`, 5 min by default).
const RESYNC_SECONDS: u32 = 20;

/// Plays the watcher for one TWD: signal-with-start of its workflow with the spec as the object
/// stands now (generation and build ID). `carried`: what a continued run's input carries (a
/// run started by the watcher carries nothing).
pub(crate) async fn signal_spec(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
    carried: Option<Value>,
) {
    let twd = get_twd(&cluster.client, namespace, name)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let twd_ref = TwdRef {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
    };
    let input = TwdInput {
        twd: twd_ref.clone(),
        search_attributes: true,
        history_event_bound: None,
        resync_seconds: Some(RESYNC_SECONDS),
        carried: None,
    };
    let signal = SpecSignal {
        generation: twd.metadata.generation.unwrap_or_default(),
        build_id: twc_crds::build_id::target_build_id(&twd).to_string(),
        deleting: false,
        uid: twd.metadata.uid.clone(),
        nudge: false,
    };
    let text = |value: serde_json::Result<String>| value.unwrap_or_else(|e| panic!("{e}"));
    let mut input = serde_json::to_value(&input).unwrap_or_else(|e| panic!("{e}"));
    input["carried"] = carried.unwrap_or(Value::Null);
    let (input, signal) = (
        text(serde_json::to_string(&input)),
        text(serde_json::to_string(&signal)),
    );
    let out = cluster
        .temporal(&[
            "workflow",
            "signal-with-start",
            "--workflow-id",
            &twd_ref.twd_workflow_id(),
            "--type",
            "twd",
            "--task-queue",
            twc_workflows::ENGINE_TASK_QUEUE,
            "--input",
            &input,
            "--signal-name",
            "spec_changed",
            "--signal-input",
            &signal,
        ])
        .await;
    assert!(out.success, "signal-with-start: {}", out.stderr);
}

#[tokio::test]
async fn a_newer_spec_seen_first_by_the_rollout_is_taken_over_instead_of_rerunning_the_old_build() {
    let Private {
        mut sandbox,
        cluster,
    } = Private::start("lagging").await;
    // The watcher looks elsewhere: the test signals the spec itself, and leaves one change out,
    // as a watcher that lags behind (re-establishing its watch after an API server restart)
    // would for a while. Unsignalled, a held rollout looks again at its resync (5 min by
    // default, the whole wait below): the test starts the TWD workflow with a short one
    // (`RESYNC_SECONDS`), which keeps the test about the takeover.
    if let Err(e) = sandbox
        .restart_controller_with_env(&[("TWC_WATCH_NAMESPACES", "nothing-to-watch")])
        .await
    {
        panic!("restarting the controller: {e:#}");
    }
    let ns = cluster.namespace("lagging").await;
    cluster.apply(&cluster.connection(&ns, "dev")).await;
    let plan = Plan {
        name: "hello".into(),
        strategy: Strategy::AllAtOnce,
        gated: false,
    };
    cluster.apply(&plan.manifest(&ns, "v1")).await;
    signal_spec(&cluster, &ns, &plan.name, None).await;
    cluster.wait_ready(&ns, &plan.name, "v1", ROLLOUT).await;

    // v2 holds its first step for ten minutes.
    let mut v2 = plan.manifest(&ns, "v2");
    v2["spec"]["rollout"] = json!({ "strategy": "Progressive", "steps": [ { "rampPercentage": 10, "pauseDuration": "10m" } ] });
    cluster.apply(&v2).await;
    signal_spec(&cluster, &ns, &plan.name, None).await;
    let deployment_name = format!("{ns}/{}", plan.name);
    cluster
        .wait("v2 ramps", ROLLOUT, || async {
            let r = cluster.routing(&deployment_name).await?;
            match r.ramping {
                Some(build) if build.starts_with("v2-") => Ok(()),
                _ => Err(format!("{r:?}")),
            }
        })
        .await;

    // v3, unsignalled: the v2 rollout sees it at its next look (its resync) and ends as
    // superseded; the TWD workflow must take v3 over from the object rather than run v2 again
    // (and again).
    cluster.apply(&plan.manifest(&ns, "v3")).await;
    let twd = cluster.wait_ready(&ns, &plan.name, "v3", ROLLOUT).await;
    let expected = plan.expected(&ns, target_build(&twd).unwrap_or_default());
    assert_all_settled(&cluster, &ns, &[expected]).await;
    sandbox.stop().await;
}
