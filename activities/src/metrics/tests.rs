use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use twc_crds::worker_deployment::{DeprecatedVersion, RolloutStatus, TargetVersion, VersionStatus};

use super::*;

/// The value of one sample line (`name{labels}`) in a rendered page.
fn sample(page: &str, series: &str) -> Option<String> {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ').map(str::to_owned))
}

/// A sample's value as a number (0 when absent).
fn value(page: &str, series: &str) -> f64 {
    sample(page, series)
        .and_then(|v| v.parse().ok())
        .unwrap_or_default()
}

/// One sample line: name, labels in order, value.
type Sample = (String, Vec<(String, String)>, String);

/// One family of a rendered page: its type, help and samples.
#[derive(Debug, Default)]
struct Exposed {
    kind: String,
    help: String,
    samples: Vec<Sample>,
}

/// Parses an OpenMetrics page (label values without commas or escapes) into its families.
fn families(page: &str) -> BTreeMap<String, Exposed> {
    let mut families: BTreeMap<String, Exposed> = BTreeMap::new();
    let mut current = String::new();
    for line in page.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            current = name.to_owned();
            assert!(!families.contains_key(name), "{name} declared twice");
            families.entry(current.clone()).or_default().help = help.to_owned();
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            assert_eq!(name, current, "TYPE of {name} after HELP of {current}");
            families.entry(current.clone()).or_default().kind = kind.to_owned();
        } else if line == "# EOF" {
            current.clear();
        } else {
            let (series, value) = line.rsplit_once(' ').unwrap_or((line, ""));
            let (name, labels) = match series.split_once('{') {
                Some((name, labels)) => (name, labels.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = labels
                .split(',')
                .filter(|l| !l.is_empty())
                .filter_map(|l| {
                    let (k, v) = l.split_once('=')?;
                    Some((k.to_owned(), v.trim_matches('"').to_owned()))
                })
                .collect();
            families.entry(current.clone()).or_default().samples.push((
                name.to_owned(),
                labels,
                value.to_owned(),
            ));
        }
    }
    families
}

fn version(build: &str, state: VersionState) -> VersionStatus {
    VersionStatus {
        build_id: build.to_owned(),
        status: state,
        healthy_since: None,
        deployment: None,
        task_queues: Vec::new(),
    }
}

fn status(
    workflow: Option<&str>,
    target: Option<(&str, VersionState, Option<f32>)>,
) -> TemporalWorkerDeploymentStatus {
    TemporalWorkerDeploymentStatus {
        target_version: target.map(|(build, state, ramp)| TargetVersion {
            version: version(build, state),
            test_workflows: Vec::new(),
            ramp_percentage: ramp,
            ramping_since: None,
            ramp_last_modified_at: None,
        }),
        rollout: workflow.map(|w| RolloutStatus {
            workflow_id: Some(w.to_owned()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn ready(status: &mut TemporalWorkerDeploymentStatus, reason: &str) {
    status.conditions = vec![Condition {
        type_: "Ready".to_owned(),
        status: if reason == COMPLETE_REASON {
            "True"
        } else {
            "False"
        }
        .to_owned(),
        reason: reason.to_owned(),
        message: String::new(),
        observed_generation: None,
        last_transition_time: Time(Timestamp::UNIX_EPOCH),
    }];
}

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(secs).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// A status of rollout `build` (workflow `rollout/demo/hello/<build>`) started at `started`,
/// written at `updated`, with the target in `state` and `Ready` reason `reason`.
fn rollout_status(
    build: &str,
    state: VersionState,
    reason: &str,
    started: i64,
    updated: i64,
) -> TemporalWorkerDeploymentStatus {
    let workflow = format!("rollout/demo/hello/{build}");
    let mut s = status(Some(&workflow), Some((build, state, None)));
    if let Some(rollout) = s.rollout.as_mut() {
        rollout.started_at = Some(Time(at(started)));
        rollout.updated_at = Some(Time(at(updated)));
    }
    ready(&mut s, reason);
    s
}

/// `s` at Progressive step `step`, whose ramp last changed at `changed`.
fn at_step(
    mut s: TemporalWorkerDeploymentStatus,
    step: i32,
    ramp: f32,
    changed: i64,
) -> TemporalWorkerDeploymentStatus {
    if let Some(rollout) = s.rollout.as_mut() {
        rollout.step = Some(step);
    }
    if let Some(target) = s.target_version.as_mut() {
        target.version.status = VersionState::Ramping;
        target.ramp_percentage = Some(ramp);
        target.ramp_last_modified_at = Some(Time(at(changed)));
    }
    s
}

/// `s` with its target's Deployment Available since `since`.
fn available(mut s: TemporalWorkerDeploymentStatus, since: i64) -> TemporalWorkerDeploymentStatus {
    if let Some(target) = s.target_version.as_mut() {
        target.version.healthy_since = Some(Time(at(since)));
    }
    s
}

/// `metrics` after every sequence of writes, each write given twice (as a retried activity or
/// a second replica would).
fn write_twice(metrics: &Metrics, strategy: &str, writes: &[TemporalWorkerDeploymentStatus]) {
    let mut previous: Option<&TemporalWorkerDeploymentStatus> = None;
    for (i, s) in writes.iter().enumerate() {
        let now = at(100_000 + i64::try_from(i).unwrap_or_default());
        metrics.status_written(strategy, previous, s, now);
        metrics.status_written(strategy, Some(s), s, now);
        previous = Some(s);
    }
}

/// A Metrics with at least one series in every family.
fn with_samples() -> Metrics {
    let metrics = Metrics::new();
    metrics.rollout_started("Progressive");
    metrics.rollout_completed("Progressive", Some(Duration::from_secs(42)));
    metrics.rollout_failed("Manual", "GateFailed");
    metrics.rollout_ended("Progressive", Outcome::Complete, Duration::from_secs(42));
    metrics.rollout_step_done("Progressive", 0, Duration::from_secs(20));
    metrics.became_current("Progressive", Duration::from_secs(30));
    metrics.twd_status(
        "demo",
        "hello",
        Some(&status(
            None,
            Some(("v2", VersionState::Ramping, Some(25.0))),
        )),
    );
    metrics.temporal_request("DescribeWorkerDeployment", "success");
    metrics.read_granted();
    metrics.kubernetes_request("get", "deployments", "success");
    metrics.waited_for_pollers(Duration::from_millis(700), true);
    metrics.watcher_signal("spec_changed", true);
    metrics
}

const ROLLOUT_LE: [&str; 13] = [
    "5.0", "15.0", "30.0", "60.0", "120.0", "300.0", "600.0", "1800.0", "3600.0", "7200.0",
    "21600.0", "86400.0", "+Inf",
];
const POLLER_LE: [&str; 13] = [
    "0.25", "0.5", "1.0", "2.5", "5.0", "10.0", "20.0", "30.0", "60.0", "120.0", "300.0", "600.0",
    "+Inf",
];
const STEP_LE: [&str; 13] = [
    "1.0", "5.0", "15.0", "30.0", "60.0", "120.0", "300.0", "600.0", "1800.0", "3600.0", "21600.0",
    "86400.0", "+Inf",
];

#[test]
fn every_family_is_exposed_with_its_type_labels_and_buckets() {
    // (family, type, label names, buckets of a histogram)
    let expected: [(&str, &str, &[&str], &[&str]); 16] = [
        ("twc_build_info", "gauge", &["version"], &[]),
        ("twc_controller_replicas", "gauge", &[], &[]),
        ("twc_rollouts_started", "counter", &["strategy"], &[]),
        ("twc_rollouts_completed", "counter", &["strategy"], &[]),
        (
            "twc_rollouts_failed",
            "counter",
            &["strategy", "reason"],
            &[],
        ),
        (
            "twc_rollout_duration_seconds",
            "histogram",
            &["strategy"],
            &ROLLOUT_LE,
        ),
        (
            "twc_rollout_outcome_duration_seconds",
            "histogram",
            &["strategy", "outcome"],
            &ROLLOUT_LE,
        ),
        (
            "twc_rollout_step_duration_seconds",
            "histogram",
            &["strategy", "step"],
            &STEP_LE,
        ),
        (
            "twc_time_to_current_seconds",
            "histogram",
            &["strategy"],
            &ROLLOUT_LE,
        ),
        ("twc_ramp_percentage", "gauge", &["namespace", "name"], &[]),
        ("twc_versions", "gauge", &["namespace", "name"], &[]),
        (
            "twc_temporal_requests",
            "counter",
            &["operation", "outcome"],
            &[],
        ),
        ("twc_temporal_read_grants", "counter", &[], &[]),
        (
            "twc_kubernetes_requests",
            "counter",
            &["verb", "resource", "outcome"],
            &[],
        ),
        (
            "twc_wait_for_pollers_seconds",
            "histogram",
            &["outcome"],
            &POLLER_LE,
        ),
        (
            "twc_watcher_signals",
            "counter",
            &["signal", "outcome"],
            &[],
        ),
    ];
    let page = with_samples().render();
    assert!(page.ends_with("# EOF\n"), "{page}");
    let exposed = families(&page);
    assert_eq!(
        exposed.keys().map(String::as_str).collect::<BTreeSet<_>>(),
        expected.iter().map(|e| e.0).collect::<BTreeSet<_>>(),
        "{page}"
    );
    for (name, kind, labels, buckets) in expected {
        let family = &exposed[name];
        assert_eq!(family.kind, kind, "{name}");
        assert!(
            family.help.ends_with('.') && !family.help.ends_with(".."),
            "{name}: {}",
            family.help
        );
        assert!(!family.samples.is_empty(), "{name} has no sample");
        for (sample, sample_labels, value) in &family.samples {
            assert!(value.parse::<f64>().is_ok(), "{sample}: {value}");
            let names: Vec<&str> = sample_labels.iter().map(|(k, _)| k.as_str()).collect();
            match kind {
                "counter" => {
                    assert_eq!(*sample, format!("{name}_total"));
                    assert_eq!(names, labels, "{sample}");
                }
                "gauge" => {
                    assert_eq!(sample, name);
                    assert_eq!(names, labels, "{sample}");
                }
                _ if *sample == format!("{name}_bucket") => {
                    assert_eq!(names.first().copied(), Some("le"), "{sample}");
                    assert_eq!(names[1..], *labels, "{sample}");
                }
                _ => {
                    assert!(
                        [format!("{name}_sum"), format!("{name}_count")].contains(sample),
                        "{sample} in {name}"
                    );
                    assert_eq!(names, labels, "{sample}");
                }
            }
        }
        if kind == "histogram" {
            let le: Vec<&str> = family
                .samples
                .iter()
                .filter(|(s, _, _)| *s == format!("{name}_bucket"))
                .filter_map(|(_, l, _)| l.first().map(|(_, v)| v.as_str()))
                .collect();
            assert_eq!(le, buckets, "{name}");
        }
    }
}

#[test]
fn counters_count_and_label_values_are_escaped() {
    let metrics = Metrics::new();
    metrics.kubernetes_request("get", "deployments", "success");
    metrics.kubernetes_request("get", "deployments", "success");
    metrics.temporal_request("Describe\"x\"\\\n", "success");
    let page = metrics.render();
    assert!(page.contains(
        "# HELP twc_kubernetes_requests Kubernetes API requests made by the controller, by verb, resource and outcome (success, not_found, conflict, error).\n"
    ), "{page}");
    assert!(
        page.contains("# TYPE twc_kubernetes_requests counter\n"),
        "{page}"
    );
    assert_eq!(
        sample(
            &page,
            r#"twc_kubernetes_requests_total{verb="get",resource="deployments",outcome="success"}"#
        )
        .as_deref(),
        Some("2")
    );
    assert_eq!(
        sample(
            &page,
            r#"twc_temporal_requests_total{operation="Describe\"x\"\\\n",outcome="success"}"#
        )
        .as_deref(),
        Some("1")
    );
    assert_eq!(
        sample(
            &page,
            &format!(
                "twc_build_info{{version=\"{}\"}}",
                env!("CARGO_PKG_VERSION")
            )
        )
        .as_deref(),
        Some("1")
    );
}

#[test]
fn histograms_are_cumulative_with_inf_sum_and_count() {
    let metrics = Metrics::new();
    for secs in [0.1, 0.7, 3.0, 3.0, 10_000.0] {
        metrics.waited_for_pollers(Duration::from_secs_f64(secs), true);
    }
    let page = metrics.render();
    let bucket = |le: &str| {
        sample(
            &page,
            &format!("twc_wait_for_pollers_seconds_bucket{{le=\"{le}\",outcome=\"ready\"}}"),
        )
    };
    assert_eq!(bucket("0.25").as_deref(), Some("1"));
    assert_eq!(bucket("0.5").as_deref(), Some("1"));
    assert_eq!(bucket("1.0").as_deref(), Some("2"));
    assert_eq!(bucket("2.5").as_deref(), Some("2"));
    assert_eq!(bucket("5.0").as_deref(), Some("4"));
    assert_eq!(bucket("600.0").as_deref(), Some("4"));
    assert_eq!(bucket("+Inf").as_deref(), Some("5"));
    assert_eq!(
        sample(
            &page,
            r#"twc_wait_for_pollers_seconds_count{outcome="ready"}"#
        )
        .as_deref(),
        Some("5")
    );
    let sum = value(
        &page,
        r#"twc_wait_for_pollers_seconds_sum{outcome="ready"}"#,
    );
    assert!((sum - 10_006.8).abs() < 1e-6, "{sum}");
}

#[test]
fn status_transitions_count_each_rollout_start_completion_and_failure_once() {
    let metrics = Metrics::new();
    let mut first = status(
        Some("rollout/demo/hello/v1"),
        Some(("v1", VersionState::NotRegistered, None)),
    );
    if let Some(rollout) = first.rollout.as_mut() {
        rollout.started_at = Some(Time(at(1000)));
    }
    ready(&mut first, "WaitingForPollers");
    // First write, then the same status again (a retried write or a resync).
    metrics.status_written("AllAtOnce", None, &first, at(1001));
    metrics.status_written("AllAtOnce", Some(&first), &first, at(1002));
    let mut done = first.clone();
    ready(&mut done, COMPLETE_REASON);
    metrics.status_written("AllAtOnce", Some(&first), &done, at(1042));
    metrics.status_written("AllAtOnce", Some(&done), &done, at(1100));
    // A new rollout whose gate fails, written twice, then retried and failing again.
    let mut second = status(
        Some("rollout/demo/hello/v2"),
        Some(("v2", VersionState::Inactive, None)),
    );
    ready(&mut second, "GateFailed");
    metrics.status_written("Progressive", Some(&done), &second, at(1200));
    metrics.status_written("Progressive", Some(&second), &second, at(1300));
    let mut retried = second.clone();
    ready(&mut retried, "WaitingForPromotion");
    metrics.status_written("Progressive", Some(&second), &retried, at(1400));
    metrics.status_written("Progressive", Some(&retried), &second, at(1500));
    // A status without a rollout counts nothing.
    metrics.status_written("Manual", None, &status(None, None), at(1600));

    let page = metrics.render();
    let value = |series: &str| sample(&page, series);
    assert_eq!(
        value(r#"twc_rollouts_started_total{strategy="AllAtOnce"}"#).as_deref(),
        Some("1")
    );
    assert_eq!(
        value(r#"twc_rollouts_completed_total{strategy="AllAtOnce"}"#).as_deref(),
        Some("1")
    );
    assert_eq!(
        value(r#"twc_rollout_duration_seconds_sum{strategy="AllAtOnce"}"#).as_deref(),
        Some("42.0")
    );
    assert_eq!(
        value(r#"twc_rollout_duration_seconds_bucket{le="60.0",strategy="AllAtOnce"}"#).as_deref(),
        Some("1")
    );
    assert_eq!(
        value(r#"twc_rollouts_started_total{strategy="Progressive"}"#).as_deref(),
        Some("1")
    );
    assert_eq!(
        value(r#"twc_rollouts_failed_total{strategy="Progressive",reason="GateFailed"}"#)
            .as_deref(),
        Some("2")
    );
    assert!(!page.contains(r#"strategy="Manual""#), "{page}");
    assert!(
        !page.contains(r#"twc_rollouts_completed_total{strategy="Progressive"}"#),
        "{page}"
    );
}

#[test]
fn outcome_durations_are_recorded_once_per_rollout_outcome() {
    let metrics = Metrics::new();
    // v1 completes (AllAtOnce): 60 s from its start to the status showing it Current.
    let waiting = rollout_status(
        "v1",
        VersionState::NotRegistered,
        "WaitingForPollers",
        0,
        10,
    );
    let done = rollout_status("v1", VersionState::Current, COMPLETE_REASON, 0, 60);
    // v2 is superseded by v3 after 30 s: first by a status naming no rollout yet, then v3's.
    let ramping = rollout_status("v2", VersionState::Ramping, "Ramping", 100, 120);
    let mut between = status(None, Some(("v3", VersionState::NotRegistered, None)));
    between.rollout = Some(RolloutStatus {
        updated_at: Some(Time(at(130))),
        ..Default::default()
    });
    let v3 = rollout_status(
        "v3",
        VersionState::NotRegistered,
        "WaitingForPollers",
        130,
        131,
    );
    // v3's gate fails after 20 s; a retry is aborted by an operator 10 s after the retry.
    let failed = rollout_status("v3", VersionState::Inactive, "GateFailed", 130, 150);
    let retried = rollout_status(
        "v3",
        VersionState::Inactive,
        "WaitingForPromotion",
        200,
        201,
    );
    let aborted = rollout_status("v3", VersionState::Inactive, "Aborted", 200, 210);
    write_twice(
        &metrics,
        "Progressive",
        &[
            waiting, done, ramping, between, v3, failed, retried, aborted,
        ],
    );
    let page = metrics.render();
    let outcome = |o: &str, suffix: &str| {
        value(
            &page,
            &format!(
                r#"twc_rollout_outcome_duration_seconds_{suffix}{{strategy="Progressive",outcome="{o}"}}"#
            ),
        )
    };
    for (o, seconds) in [
        ("complete", 60.0),
        ("superseded", 30.0),
        ("failed", 20.0),
        ("aborted", 10.0),
    ] {
        assert_eq!(outcome(o, "count"), 1.0, "{o}: {page}");
        assert_eq!(outcome(o, "sum"), seconds, "{o}: {page}");
    }
    // The counters agree: one start each for v1, v2 and v3, and v3's two failures.
    assert_eq!(
        value(
            &page,
            r#"twc_rollouts_started_total{strategy="Progressive"}"#
        ),
        3.0
    );
    assert_eq!(
        value(
            &page,
            r#"twc_rollouts_failed_total{strategy="Progressive",reason="Aborted"}"#
        ),
        1.0
    );
}

#[test]
fn a_finished_rollout_replaced_by_a_newer_build_is_not_superseded() {
    let metrics = Metrics::new();
    let done = rollout_status("v1", VersionState::Current, COMPLETE_REASON, 0, 60);
    let failed = rollout_status("v2", VersionState::Inactive, "GateFailed", 100, 120);
    let next = rollout_status(
        "v3",
        VersionState::NotRegistered,
        "WaitingForPollers",
        200,
        201,
    );
    write_twice(&metrics, "AllAtOnce", &[done, failed, next]);
    let page = metrics.render();
    assert!(!page.contains(r#"outcome="superseded""#), "{page}");
}

#[test]
fn superseded_is_recorded_once_whichever_status_shows_the_new_build_first() {
    let metrics = Metrics::new();
    let waiting = rollout_status("v1", VersionState::Inactive, "WaitingForPromotion", 0, 10);
    // The spec names v2 while v1's report is still the last one, then v2's rollout reports.
    let mut retargeted = rollout_status(
        "v1",
        VersionState::NotRegistered,
        "WaitingForPollers",
        0,
        40,
    );
    if let Some(target) = retargeted.target_version.as_mut() {
        target.version.build_id = "v2".to_owned();
    }
    let v2 = rollout_status(
        "v2",
        VersionState::NotRegistered,
        "WaitingForPollers",
        45,
        50,
    );
    write_twice(&metrics, "Manual", &[waiting, retargeted, v2]);
    let page = metrics.render();
    let series =
        r#"twc_rollout_outcome_duration_seconds_count{strategy="Manual",outcome="superseded"}"#;
    assert_eq!(value(&page, series), 1.0, "{page}");
    assert_eq!(
        value(
            &page,
            r#"twc_rollout_outcome_duration_seconds_sum{strategy="Manual",outcome="superseded"}"#
        ),
        50.0
    );
}

#[test]
fn step_durations_are_recorded_once_per_step_left() {
    let metrics = Metrics::new();
    let start = rollout_status("v2", VersionState::Inactive, "WaitingForPromotion", 0, 5);
    // Step 0 from 10 s to 40 s (the next step's ramp change), step 1 from 40 s until the
    // status shows the build Current at 100 s.
    let step0 = at_step(
        rollout_status("v2", VersionState::Ramping, "Ramping", 0, 10),
        0,
        10.0,
        10,
    );
    let paused = at_step(
        rollout_status("v2", VersionState::Ramping, "Paused", 0, 20),
        0,
        10.0,
        10,
    );
    let step1 = at_step(
        rollout_status("v2", VersionState::Ramping, "Ramping", 0, 41),
        1,
        50.0,
        40,
    );
    let done = rollout_status("v2", VersionState::Current, COMPLETE_REASON, 0, 100);
    write_twice(
        &metrics,
        "Progressive",
        &[start, step0, paused, step1, done],
    );
    let page = metrics.render();
    let step = |s: &str, suffix: &str| {
        value(
            &page,
            &format!(
                r#"twc_rollout_step_duration_seconds_{suffix}{{strategy="Progressive",step="{s}"}}"#
            ),
        )
    };
    assert_eq!(
        (step("0", "count"), step("0", "sum")),
        (1.0, 30.0),
        "{page}"
    );
    assert_eq!(
        (step("1", "count"), step("1", "sum")),
        (1.0, 60.0),
        "{page}"
    );
}

#[test]
fn a_step_left_by_a_failure_is_not_recorded_and_late_steps_share_a_label() {
    let metrics = Metrics::new();
    let step0 = at_step(
        rollout_status("v2", VersionState::Ramping, "Ramping", 0, 10),
        0,
        10.0,
        10,
    );
    let failed = rollout_status("v2", VersionState::Inactive, "AnalysisFailed", 0, 50);
    let retried = at_step(
        rollout_status("v2", VersionState::Ramping, "Ramping", 60, 61),
        0,
        10.0,
        60,
    );
    write_twice(&metrics, "Progressive", &[step0, failed, retried]);
    metrics.rollout_step_done("Progressive", 12, Duration::from_secs(5));
    let page = metrics.render();
    assert!(!page.contains(r#"step="0""#), "{page}");
    assert_eq!(
        value(
            &page,
            r#"twc_rollout_step_duration_seconds_count{strategy="Progressive",step="10+"}"#
        ),
        1.0
    );
    assert_eq!(
        value(
            &page,
            r#"twc_rollouts_failed_total{strategy="Progressive",reason="AnalysisFailed"}"#
        ),
        1.0
    );
    assert_eq!(
        value(
            &page,
            r#"twc_rollout_outcome_duration_seconds_count{strategy="Progressive",outcome="failed"}"#
        ),
        1.0
    );
}

#[test]
fn time_to_current_is_recorded_once_from_the_deployment_becoming_available() {
    let metrics = Metrics::new();
    // v1: rollout started at 0, Deployment Available at 25, Current at 100: 75 s.
    let waiting = available(
        rollout_status("v1", VersionState::Inactive, "WaitingForPromotion", 0, 30),
        25,
    );
    let current = available(
        rollout_status("v1", VersionState::Current, COMPLETE_REASON, 0, 100),
        25,
    );
    // Later writes of the same Current build (a resync, a spec change of replicas) count
    // nothing; nor does a fresh run for the same Current build.
    let rerun = available(
        rollout_status("v1", VersionState::Current, COMPLETE_REASON, 500, 501),
        25,
    );
    // v0 again (a rollback to a Deployment Available for long): from the rollout's start.
    let mut rollback = available(
        rollout_status("v0", VersionState::Current, COMPLETE_REASON, 1000, 1040),
        3,
    );
    rollback.current_version = Some(version("v0", VersionState::Current));
    write_twice(&metrics, "Manual", &[waiting, current, rerun, rollback]);
    let page = metrics.render();
    assert_eq!(
        value(
            &page,
            r#"twc_time_to_current_seconds_count{strategy="Manual"}"#
        ),
        2.0,
        "{page}"
    );
    assert_eq!(
        value(
            &page,
            r#"twc_time_to_current_seconds_sum{strategy="Manual"}"#
        ),
        115.0,
        "{page}"
    );
    assert_eq!(
        value(
            &page,
            r#"twc_time_to_current_seconds_bucket{le="60.0",strategy="Manual"}"#
        ),
        1.0
    );
}

#[test]
fn time_to_current_shown_from_a_report_before_availability_was_read_is_recorded_once_it_is() {
    let metrics = Metrics::new();
    // The TWD workflow shows the rollout's report (Current at 100) on an observation made
    // before the Deployment was Available, so that status does not know since when it is; the
    // observation that follows (written at 101) does: Available at 25, so 75 s.
    let waiting = rollout_status("v2", VersionState::Inactive, "WaitingForPollers", 0, 10);
    let reported = rollout_status("v2", VersionState::Current, COMPLETE_REASON, 0, 100);
    let observed = available(
        rollout_status("v2", VersionState::Current, COMPLETE_REASON, 0, 101),
        25,
    );
    let resync = available(
        rollout_status("v2", VersionState::Current, COMPLETE_REASON, 0, 131),
        25,
    );
    write_twice(
        &metrics,
        "Progressive",
        &[waiting, reported, observed, resync],
    );
    let page = metrics.render();
    assert_eq!(
        value(
            &page,
            r#"twc_time_to_current_seconds_count{strategy="Progressive"}"#
        ),
        1.0,
        "{page}"
    );
    assert_eq!(
        value(
            &page,
            r#"twc_time_to_current_seconds_sum{strategy="Progressive"}"#
        ),
        75.0,
        "{page}"
    );
}

#[test]
fn per_twd_gauges_follow_the_status_and_go_with_the_twd() {
    let metrics = Metrics::new();
    let ramping = status(
        Some("rollout/demo/hello/v2"),
        Some(("v2", VersionState::Ramping, Some(25.0))),
    );
    metrics.twd_status("demo", "hello", Some(&ramping));
    metrics.twd_status("demo", "other", None);
    let page = metrics.render();
    assert_eq!(
        value(
            &page,
            r#"twc_ramp_percentage{namespace="demo",name="hello"}"#
        ),
        25.0
    );
    assert_eq!(
        sample(&page, r#"twc_versions{namespace="demo",name="hello"}"#).as_deref(),
        Some("1")
    );
    assert_eq!(
        sample(&page, r#"twc_versions{namespace="demo",name="other"}"#).as_deref(),
        Some("0")
    );
    metrics.forget_twd("demo", "hello");
    let page = metrics.render();
    assert!(!page.contains("name=\"hello\""), "{page}");
    assert!(page.contains("name=\"other\""), "{page}");
}

#[test]
fn ramp_and_version_count_follow_the_status() {
    let mut s = status(None, Some(("v2", VersionState::Ramping, Some(10.0))));
    assert_eq!(ramp_percentage(&s), 10.0);
    s.current_version = Some(version("v1", VersionState::Current));
    let deprecated = |build: &str| DeprecatedVersion {
        version: version(build, VersionState::Draining),
        drained_since: None,
        eligible_for_deletion: false,
        open_pinned_workflows: None,
        oldest_pinned_workflow_started_at: None,
        next_drain_action: None,
        next_drain_action_at: None,
        drain_steps_done: Vec::new(),
    };
    s.deprecated_versions = vec![deprecated("v0"), deprecated("v1")];
    assert_eq!(version_count(&s), 3);
    if let Some(target) = s.target_version.as_mut() {
        target.version.status = VersionState::Current;
    }
    assert_eq!(ramp_percentage(&s), 100.0);
    if let Some(target) = s.target_version.as_mut() {
        target.version.status = VersionState::Inactive;
    }
    assert_eq!(ramp_percentage(&s), 0.0);
    assert_eq!(
        ramp_percentage(&TemporalWorkerDeploymentStatus::default()),
        0.0
    );
}

/// The Grafana dashboard shipped in `deploy/grafana/`, and its copy in the Helm chart.
const DASHBOARD: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../deploy/grafana/twc-dashboard.json"
));
const CHART_DASHBOARD: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../deploy/helm/twc/files/twc-dashboard.json"
));

/// Every PromQL expression of a dashboard (panel targets, nested rows, template queries).
fn expressions(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, v) in map {
                match (key.as_str(), v) {
                    ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                    ("query", serde_json::Value::String(q)) => out.push(q.clone()),
                    ("query", serde_json::Value::Object(q)) => {
                        if let Some(serde_json::Value::String(q)) = q.get("query") {
                            out.push(q.clone());
                        }
                    }
                    _ => expressions(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| expressions(v, out)),
        _ => {}
    }
}

/// The `twc_...` metric names an expression uses.
fn metric_names(expression: &str) -> Vec<&str> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut names = Vec::new();
    let mut rest = expression;
    while let Some(start) = rest.find("twc_") {
        let preceded = rest[..start].chars().next_back().is_some_and(is_name);
        let tail = &rest[start..];
        let end = tail.find(|c: char| !is_name(c)).unwrap_or(tail.len());
        if !preceded {
            names.push(&tail[..end]);
        }
        rest = &tail[end..];
    }
    names
}

#[test]
fn the_grafana_dashboard_uses_only_metrics_the_controller_exposes() {
    let dashboard: serde_json::Value = match serde_json::from_str(DASHBOARD) {
        Ok(d) => d,
        Err(e) => panic!("deploy/grafana/twc-dashboard.json is not JSON: {e}"),
    };
    assert_eq!(
        DASHBOARD, CHART_DASHBOARD,
        "deploy/helm/twc/files/twc-dashboard.json must be a copy of deploy/grafana/twc-dashboard.json"
    );
    assert!(
        dashboard["schemaVersion"].as_u64().unwrap_or_default() >= 38,
        "Grafana 10+ schema"
    );
    assert!(dashboard["uid"].is_string() && dashboard["title"].is_string());
    let variables = dashboard["templating"]["list"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        variables
            .iter()
            .any(|v| v["name"] == "datasource" && v["query"] == "prometheus"),
        "a Prometheus datasource variable named datasource"
    );
    let panels = dashboard["panels"].as_array().cloned().unwrap_or_default();
    for panel in &panels {
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(
            panel["datasource"]["uid"], "${datasource}",
            "panel {} uses the datasource variable",
            panel["title"]
        );
        assert!(panel["gridPos"].is_object(), "{}", panel["title"]);
    }
    let exposed: BTreeSet<String> = families(&with_samples().render())
        .into_values()
        .flat_map(|f| f.samples.into_iter().map(|(name, _, _)| name))
        .collect();
    let mut expressions_found = Vec::new();
    expressions(&dashboard, &mut expressions_found);
    let mut used = BTreeSet::new();
    for expression in &expressions_found {
        for name in metric_names(expression) {
            assert!(
                exposed.contains(name),
                "the dashboard uses {name}, which /metrics does not expose: {expression}"
            );
            used.insert(name.to_owned());
        }
    }
    // Each family the controller exports has a panel.
    let families_used: BTreeSet<&str> = used
        .iter()
        .map(|n| {
            ["_bucket", "_sum", "_count", "_total"]
                .iter()
                .find_map(|s| n.strip_suffix(s))
                .unwrap_or(n)
        })
        .collect();
    for family in families(&with_samples().render()).keys() {
        if family != "twc_build_info" {
            assert!(
                families_used.contains(family.as_str()),
                "no panel shows {family}"
            );
        }
    }
}
