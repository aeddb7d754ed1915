use twc_crds::worker_deployment::{RolloutStrategy, VersionState};

use super::*;
use crate::model::{AutoscalePolicy, BacklogTarget, BlockReason, Blocked, TemporalState};
use crate::plan::conditions::deletion_condition;
use crate::plan::fixtures::{
    NEW, OLD, deployment, observation, spec, temporal_with_old_current, version,
};

type Change = fn(&mut TwdState);

fn report(workflow_id: &str, build: &str, progress: RolloutProgress) -> RolloutReport {
    RolloutReport {
        build_id: build.to_owned(),
        workflow_id: workflow_id.to_owned(),
        run_id: "run".to_owned(),
        progress,
        step: None,
        ramp_percentage: None,
        next_step_at: None,
        blocked: None,
        message: String::new(),
        started_at: 0,
        gate_runs: Vec::new(),
        analysis: Vec::new(),
        sequence: 1,
        routing: None,
        control: None,
    }
}

fn signal(generation: i64, build: &str) -> SpecSignal {
    SpecSignal {
        generation,
        build_id: build.to_owned(),
        deleting: false,
        uid: Some("uid-1".to_owned()),
        nudge: false,
    }
}

fn routing(current: &str, ramping: Option<(&str, u8)>) -> AppliedRouting {
    AppliedRouting {
        current_build_id: Some(current.to_owned()),
        ramping_build_id: ramping.map(|(b, _)| b.to_owned()),
        ramp_percentage: ramping.map(|(_, p)| p),
    }
}

/// A run that has observed once (v1 Current, the spec targeting v2), with rollout `r2` of v2
/// in flight and waiting for pollers.
fn rolling() -> TwdState {
    TwdState {
        spec: Some(signal(3, NEW)),
        active: Some(ActiveRollout {
            build_id: NEW.to_owned(),
            workflow_id: "r2".to_owned(),
            notified_generation: 3,
            started_generation: Some(3),
            started_at: None,
        }),
        last_report: Some(report("r2", NEW, RolloutProgress::WaitingForPollers)),
        reasserted_at: Some(0),
        last_observation: Some(observation(
            spec(RolloutStrategy::AllAtOnce),
            vec![deployment(OLD), deployment(NEW)],
            temporal_with_old_current(),
        )),
        ..TwdState::default()
    }
}

fn progress(state: &mut TwdState, progress: RolloutProgress) {
    if let Some(r) = state.last_report.as_mut() {
        r.progress = progress;
    }
}

fn reported_routing(state: &mut TwdState, routed: AppliedRouting) {
    if let Some(r) = state.last_report.as_mut() {
        r.routing = Some(routed);
    }
}

fn temporal_mut(state: &mut TwdState) -> &mut TemporalState {
    let observation = state.last_observation.as_mut().expect("observed");
    observation.temporal.as_mut().expect("readable")
}

#[test]
fn a_resync_falls_due_within_ten_percent_of_its_period() {
    let period = Duration::from_secs(300);
    // (draw, seconds)
    let cases = [
        (0.0, 270.0),
        (0.5, 300.0),
        (0.999, 329.94),
        (-1.0, 270.0),
        (7.0, 330.0),
    ];
    for (draw, seconds) in cases {
        let got = jittered(period, draw).as_secs_f64();
        assert!((got - seconds).abs() < 0.01, "{draw}: {got}");
    }
}

/// What a decision is, without the data it carries.
#[derive(Debug, PartialEq)]
enum Kind {
    AwaitSpec,
    Delete,
    /// With the sequence of the report whose routing it shows.
    ShowReport(Option<u64>),
    /// `(show_reported_routing, reassert_first, quiet)`.
    Turn(bool, bool, bool),
}

fn kind(decision: &TwdDecision) -> Kind {
    match decision {
        TwdDecision::AwaitSpec => Kind::AwaitSpec,
        TwdDecision::Delete => Kind::Delete,
        TwdDecision::ShowReport(shown) => Kind::ShowReport(shown.routing_of),
        TwdDecision::Turn(turn) => {
            Kind::Turn(turn.show_reported_routing, turn.reassert_first, turn.quiet)
        }
    }
}

#[test]
fn a_turn_is_decided_on_what_woke_it_and_what_the_workflow_holds() {
    let cases: [(&str, Change, Woke, Kind); 11] = [
        (
            "no spec yet",
            |s| s.spec = None,
            Woke::Signal,
            Kind::AwaitSpec,
        ),
        (
            "the TWD is being deleted",
            |s| {
                if let Some(spec) = s.spec.as_mut() {
                    spec.deleting = true;
                }
            },
            Woke::Signal,
            Kind::Delete,
        ),
        (
            "a report without routing: shown, nothing read",
            |_| {},
            Woke::Signal,
            Kind::ShowReport(None),
        ),
        (
            "a report with routing: shown on the latest observation",
            |s| reported_routing(s, routing(OLD, Some((NEW, 10)))),
            Woke::Signal,
            Kind::ShowReport(Some(1)),
        ),
        (
            "routing already considered: shown as it was",
            |s| {
                reported_routing(s, routing(OLD, Some((NEW, 10))));
                s.routing_shown = 1;
            },
            Woke::Signal,
            Kind::ShowReport(None),
        ),
        (
            "routing of a deployment nobody manages yet: read in a full turn",
            |s| {
                reported_routing(s, routing(OLD, Some((NEW, 10))));
                temporal_mut(s).manager_identity.clear();
            },
            Woke::Signal,
            Kind::Turn(false, false, false),
        ),
        (
            "a control came too: a full turn",
            |s| s.controls.push(ControlAction::Pause),
            Woke::Signal,
            Kind::Turn(true, false, false),
        ),
        (
            "the timer: a quiet full turn",
            |_| {},
            Woke::Timer,
            Kind::Turn(true, false, true),
        ),
        (
            "at once: a full turn",
            |_| {},
            Woke::AtOnce,
            Kind::Turn(true, false, false),
        ),
        (
            "a run's first turn re-asserts first",
            |s| s.reasserted_at = None,
            Woke::AtOnce,
            Kind::Turn(true, true, false),
        ),
        (
            "a run's first turn woken by its timer (no spec at first)",
            |s| s.reasserted_at = None,
            Woke::Timer,
            Kind::Turn(true, true, true),
        ),
    ];
    for (case, change, woke, expected) in cases {
        let mut state = rolling();
        change(&mut state);
        assert_eq!(kind(&decide(&state, woke, 900)), expected, "{case}");
    }
}

#[test]
fn only_reports_of_a_rollout_still_under_way_skip_the_observation() {
    let cases: [(&str, Change, bool); 13] = [
        ("waiting for pollers", |_| {}, true),
        (
            "waiting for promotion",
            |s| progress(s, RolloutProgress::WaitingForPromotion),
            true,
        ),
        ("ramping", |s| progress(s, RolloutProgress::Ramping), true),
        ("paused", |s| progress(s, RolloutProgress::Paused), true),
        (
            "complete: retire and observe",
            |s| progress(s, RolloutProgress::Complete),
            false,
        ),
        ("blocked", |s| progress(s, RolloutProgress::Blocked), false),
        ("aborted", |s| progress(s, RolloutProgress::Aborted), false),
        (
            "a report of another rollout",
            |s| s.last_report = Some(report("r1", OLD, RolloutProgress::Ramping)),
            false,
        ),
        ("a spec signal too", |s| s.spec_signalled = true, false),
        ("a duplicate spec signal too", |s| s.poked = true, false),
        (
            "a control too",
            |s| s.controls.push(ControlAction::Pause),
            false,
        ),
        (
            "nothing observed yet in this run",
            |s| s.last_observation = None,
            false,
        ),
        (
            "the latest observation could not read Temporal",
            |s| {
                if let Some(o) = s.last_observation.as_mut() {
                    o.temporal = Err(Blocked {
                        reason: BlockReason::TemporalClientCreationFailed,
                        message: String::new(),
                    });
                }
            },
            false,
        ),
    ];
    for (case, change, expected) in cases {
        let mut state = rolling();
        change(&mut state);
        assert_eq!(state.only_a_report_came(), expected, "{case}");
    }
}

#[test]
fn a_report_only_turn_keeps_the_routing_it_shows_as_the_latest_observation() {
    let mut state = rolling();
    reported_routing(&mut state, routing(OLD, Some((NEW, 10))));
    let TwdDecision::ShowReport(report) = decide(&state, Woke::Signal, 900) else {
        panic!("a report-only turn");
    };
    let shown = state.show_report(*report).expect("a spec was read");
    let temporal = shown.observation.temporal.as_ref().expect("readable");
    assert_eq!(temporal.ramping_build_id.as_deref(), Some(NEW));
    assert_eq!(
        temporal.ramp_changed_at,
        Some(900),
        "stamped with the report's time"
    );
    assert_eq!(shown.generation, 3);
    assert_eq!(state.routing_shown, 1);
    // A later report without routing is shown on it, not on the routing read before.
    state.last_report = Some(RolloutReport {
        sequence: 2,
        ..report_with(RolloutProgress::Ramping)
    });
    let TwdDecision::ShowReport(next) = decide(&state, Woke::Signal, 1000) else {
        panic!("a report-only turn");
    };
    let next = next.observation.temporal.expect("readable");
    assert_eq!(next.ramping_build_id.as_deref(), Some(NEW));
}

fn report_with(progress: RolloutProgress) -> RolloutReport {
    report("r2", NEW, progress)
}

#[test]
fn reported_routing_stamps_the_ramp_with_the_report_time_where_it_changed() {
    let observed = |ramping: Option<&str>, percentage: Option<f32>| Observation {
        spec: None,
        deployments: Vec::new(),
        temporal: Ok(TemporalState {
            current_build_id: Some("v1".to_owned()),
            ramping_build_id: ramping.map(str::to_owned),
            ramp_percentage: percentage,
            ramping_since: ramping.map(|_| 100),
            ramp_changed_at: ramping.map(|_| 200),
            manager_identity: "twc".to_owned(),
            ..TemporalState::default()
        }),
        observed_at: 0,
    };
    // (case, before, reported, expected ramping_since, expected ramp_changed_at)
    let cases = [
        (
            "a new ramp",
            observed(None, None),
            routing("v1", Some(("v2", 10))),
            Some(900),
            Some(900),
        ),
        (
            "the next step",
            observed(Some("v2"), Some(10.0)),
            routing("v1", Some(("v2", 40))),
            Some(100),
            Some(900),
        ),
        (
            "the same step again",
            observed(Some("v2"), Some(40.0)),
            routing("v1", Some(("v2", 40))),
            Some(100),
            Some(200),
        ),
        (
            "the ramp cleared",
            observed(Some("v2"), Some(40.0)),
            routing("v1", None),
            None,
            None,
        ),
    ];
    for (case, before, reported, since, changed) in cases {
        let applied = reported.applied_at(&before, 900).expect(case);
        let temporal = applied.temporal.expect(case);
        assert_eq!(
            (temporal.ramping_since, temporal.ramp_changed_at),
            (since, changed),
            "{case}"
        );
    }
    let mut unmanaged = observed(None, None);
    if let Ok(t) = unmanaged.temporal.as_mut() {
        t.manager_identity.clear();
    }
    assert_eq!(
        routing("v1", Some(("v2", 10))).applied_at(&unmanaged, 900),
        None,
        "no manager yet: not shown from the report"
    );
}

#[test]
fn reports_are_shown_during_an_observation_only_on_a_reading_of_their_builds_spec() {
    fn reading(s: &mut TwdState, target: &str) {
        if let Some(spec) = s.last_observation.as_mut().and_then(|o| o.spec.as_mut()) {
            spec.target_build_id = target.to_owned();
        }
    }
    let cases: [(&str, Change, bool); 6] = [
        ("routing on a reading of v2's spec", |_| {}, true),
        (
            "a reading of the previous spec (v1)",
            |s| reading(s, OLD),
            false,
        ),
        ("nothing read yet", |s| s.last_observation = None, false),
        ("already shown", |s| s.routing_shown = 1, false),
        (
            "a report of another rollout",
            |s| {
                if let Some(r) = s.last_report.as_mut() {
                    r.workflow_id = "r1".to_owned();
                }
            },
            false,
        ),
        (
            "a report without routing",
            |s| {
                if let Some(r) = s.last_report.as_mut() {
                    r.routing = None;
                }
            },
            false,
        ),
    ];
    for (case, change, expected) in cases {
        let mut state = rolling();
        reported_routing(&mut state, routing(OLD, Some((NEW, 10))));
        change(&mut state);
        assert_eq!(state.routing_to_show(), expected, "{case}");
    }
}

#[test]
fn reported_routing_is_shown_on_the_latest_observation_once_per_report() {
    // (case, change, expected routing shown before and after, expected routing_shown after)
    type Expected = Option<(AppliedRouting, AppliedRouting)>;
    let ramp = routing(OLD, Some((NEW, 10)));
    let cases: [(&str, Change, Expected, u64); 4] = [
        (
            "the rollout in flight ramped",
            |s| reported_routing(s, routing(OLD, Some((NEW, 10)))),
            Some((routing(OLD, None), ramp.clone())),
            1,
        ),
        ("no routing in the report", |_| {}, None, 0),
        (
            "a report of another rollout: considered, not shown",
            |s| {
                reported_routing(s, routing(OLD, Some((NEW, 10))));
                s.active = None;
            },
            None,
            1,
        ),
        (
            "nothing observed yet: considered, not shown",
            |s| {
                reported_routing(s, routing(OLD, Some((NEW, 10))));
                s.last_observation = None;
            },
            None,
            1,
        ),
    ];
    for (case, change, expected, considered) in cases {
        let mut state = rolling();
        change(&mut state);
        let shown = state.show_reported_routing();
        assert_eq!(
            shown.as_ref().map(|(_, b, a)| (b.clone(), a.clone())),
            expected,
            "{case}"
        );
        assert_eq!(state.routing_shown, considered, "{case}");
        if let Some((shown, _, _)) = shown {
            let temporal = shown.observation.temporal.expect(case);
            assert_eq!(temporal.ramping_build_id.as_deref(), Some(NEW), "{case}");
            assert_eq!(
                temporal.version(NEW).map(|v| v.state),
                Some(VersionState::Ramping)
            );
            assert!(state.show_reported_routing().is_none(), "{case}: once");
            assert_eq!(
                state
                    .last_observation
                    .as_ref()
                    .and_then(|o| o.temporal.as_ref().ok())
                    .and_then(|t| t.ramping_build_id.clone()),
                None,
                "{case}: the latest observation stays as read"
            );
        }
    }
}

#[test]
fn an_observation_read_before_the_reported_write_is_settled_on_the_reported_routing() {
    let observed = |current: &str, ramping: Option<(&str, f32)>| Observation {
        spec: None,
        deployments: Vec::new(),
        temporal: Ok(TemporalState {
            current_build_id: Some(current.to_owned()),
            ramping_build_id: ramping.map(|(b, _)| b.to_owned()),
            ramp_percentage: ramping.map(|(_, p)| p),
            versions: vec![
                version(
                    "v1",
                    if current == "v1" {
                        VersionState::Current
                    } else {
                        VersionState::Draining
                    },
                ),
                version(
                    "v2",
                    if current == "v2" {
                        VersionState::Current
                    } else {
                        VersionState::Inactive
                    },
                ),
            ],
            manager_identity: "twc".to_owned(),
            ..TemporalState::default()
        }),
        observed_at: 0,
    };
    // (case, read, routing shown during the reading (before, after) in order, expected current,
    // expected ramp)
    let cases = [
        (
            "read before the write: the report's routing",
            observed("v1", None),
            vec![(routing("v1", None), routing("v2", None))],
            "v2",
            None,
        ),
        (
            "read after the write: as read",
            observed("v2", None),
            vec![(routing("v1", None), routing("v2", None))],
            "v2",
            None,
        ),
        (
            "changed again after the write (an operator): as read",
            observed("v1", Some(("v2", 5.0))),
            vec![(routing("v1", None), routing("v2", None))],
            "v1",
            Some(("v2".to_owned(), 5.0)),
        ),
        (
            "a ramp step read before its write: the step",
            observed("v1", Some(("v2", 10.0))),
            vec![(
                routing("v1", Some(("v2", 10))),
                routing("v1", Some(("v2", 40))),
            )],
            "v1",
            Some(("v2".to_owned(), 40.0)),
        ),
        (
            "two reports during the reading: settled from the first's before on the last",
            observed("v1", None),
            vec![
                (routing("v1", None), routing("v1", Some(("v2", 10)))),
                (routing("v1", None), routing("v2", None)),
            ],
            "v2",
            None,
        ),
        (
            "nothing shown during the reading: as read",
            observed("v1", None),
            vec![],
            "v1",
            None,
        ),
    ];
    for (case, read, shown, current, ramp) in cases {
        let mut during = RoutingDuringReading::default();
        for (before, after) in shown {
            during.shown(before, after);
        }
        let settled = during.settle(read);
        let temporal = settled.temporal.expect(case);
        assert_eq!(
            temporal.current_build_id.as_deref(),
            Some(current),
            "{case}"
        );
        assert_eq!(
            temporal
                .ramping_build_id
                .clone()
                .zip(temporal.ramp_percentage),
            ramp,
            "{case}"
        );
        let state = |build: &str| temporal.version(build).map(|v| v.state);
        if current == "v2" {
            assert_eq!(state("v2"), Some(VersionState::Current), "{case}");
            assert_eq!(state("v1"), Some(VersionState::Draining), "{case}");
        }
    }
    let mut unreadable = observed("v1", None);
    unreadable.temporal = Err(Blocked {
        reason: BlockReason::PlanExecutionFailed,
        message: "unreachable".to_owned(),
    });
    let mut during = RoutingDuringReading::default();
    during.shown(routing("v1", None), routing("v2", None));
    assert_eq!(
        during.settle(unreadable.clone()),
        unreadable,
        "an unreadable Temporal stays unreadable"
    );
}

#[test]
fn rollouts_are_started_superseded_restarted_or_told_from_the_spec_and_the_last_report() {
    fn target(s: &mut TwdState, build: &str) {
        if let Some(spec) = s.spec.as_mut() {
            spec.build_id = build.to_owned();
        }
    }
    fn generation(s: &mut TwdState, generation: i64) {
        if let Some(spec) = s.spec.as_mut() {
            spec.generation = generation;
        }
    }
    let start = |superseded: Option<&str>| Dispatch::StartNew {
        room: true,
        superseded: superseded.map(str::to_owned),
    };
    let cases: [(&str, Change, Dispatch); 17] = [
        (
            "no rollout yet: the build is started",
            |s| {
                s.active = None;
                s.last_report = None;
            },
            start(None),
        ),
        (
            "no rollout yet, nothing observed: no room known",
            |s| {
                s.active = None;
                s.last_report = None;
                s.last_observation = None;
            },
            Dispatch::StartNew {
                room: false,
                superseded: None,
            },
        ),
        (
            "no rollout yet, the build was aborted",
            |s| {
                s.active = None;
                s.aborted.push(NEW.to_owned());
            },
            Dispatch::Nothing,
        ),
        (
            "a new build while the old rollout runs: started, the old one nudged",
            |s| target(s, "v3-cccccccccc"),
            start(Some("r2")),
        ),
        (
            "a new build after the old rollout completed",
            |s| {
                target(s, "v3-cccccccccc");
                progress(s, RolloutProgress::Complete);
            },
            start(None),
        ),
        (
            "a new build the operator aborted, the old rollout still running",
            |s| {
                target(s, "v3-cccccccccc");
                s.aborted.push("v3-cccccccccc".to_owned());
            },
            Dispatch::NudgeSuperseded("r2".to_owned()),
        ),
        (
            "a new build the operator aborted, the old rollout ended",
            |s| {
                target(s, "v3-cccccccccc");
                s.aborted.push("v3-cccccccccc".to_owned());
                progress(s, RolloutProgress::Superseded);
            },
            Dispatch::Nothing,
        ),
        (
            "a new build, no room under the version limit",
            |s| {
                target(s, "v3-cccccccccc");
                if let Some(o) = s.last_observation.as_mut() {
                    o.temporal = Err(Blocked {
                        reason: BlockReason::TemporalStateFetchFailed,
                        message: String::new(),
                    });
                }
            },
            Dispatch::StartNew {
                room: false,
                superseded: Some("r2".to_owned()),
            },
        ),
        ("running, nothing new", |_| {}, Dispatch::Nothing),
        (
            "running, the spec changed",
            |s| generation(s, 4),
            Dispatch::NotifySpecChange {
                workflow_id: "r2".to_owned(),
                generation: 4,
            },
        ),
        (
            "running, something around the TWD changed",
            |s| s.poked = true,
            Dispatch::NotifySpecChange {
                workflow_id: "r2".to_owned(),
                generation: 3,
            },
        ),
        (
            "superseded while its build became the target again",
            |s| progress(s, RolloutProgress::Superseded),
            Dispatch::RestartIfStillTarget(NEW.to_owned()),
        ),
        (
            "superseded, and aborted",
            |s| {
                progress(s, RolloutProgress::Superseded);
                s.aborted.push(NEW.to_owned());
            },
            Dispatch::Nothing,
        ),
        (
            "complete, the spec changed since",
            |s| {
                progress(s, RolloutProgress::Complete);
                generation(s, 4);
            },
            Dispatch::Restart,
        ),
        (
            "complete, told of a change its last observation missed",
            |s| {
                progress(s, RolloutProgress::Complete);
                generation(s, 4);
                if let Some(a) = s.active.as_mut() {
                    a.notified_generation = 4;
                }
            },
            Dispatch::Restart,
        ),
        (
            "complete, nothing new",
            |s| progress(s, RolloutProgress::Complete),
            Dispatch::Nothing,
        ),
        (
            "aborted: not restarted until retried",
            |s| {
                progress(s, RolloutProgress::Aborted);
                generation(s, 4);
            },
            Dispatch::Nothing,
        ),
    ];
    for (case, change, expected) in cases {
        let mut state = rolling();
        change(&mut state);
        let spec = state.spec.clone().expect("a spec");
        assert_eq!(state.take_dispatch(&spec), expected, "{case}");
        assert!(!state.poked, "{case}: the nudge asked for is taken");
    }
}

#[test]
fn a_started_rollout_is_the_one_in_flight_and_its_reports_are_shown_from_the_first() {
    let mut state = rolling();
    state.routing_shown = 7;
    let spec = signal(5, "v3-cccccccccc");
    state.started(&spec, "r3".to_owned(), Some("run"), true, None);
    assert_eq!(
        state.active,
        Some(ActiveRollout {
            build_id: "v3-cccccccccc".to_owned(),
            workflow_id: "r3".to_owned(),
            notified_generation: 5,
            started_generation: Some(5),
            started_at: None,
        })
    );
    assert_eq!((state.last_report.clone(), state.routing_shown), (None, 0));
    state.notified(6);
    assert_eq!(state.active.map(|a| a.notified_generation), Some(6));
}

/// Temporal delivers the signals of one workflow task before the start result of a child: a
/// rollout that runs to its end while the TWD workflow's task waits (its worker was killed)
/// reports before `started` records it. Under `keep-early-reports` the started run's reports
/// are kept and shown once it is the one in flight, whatever was in flight before (another
/// rollout, none, or an earlier run of the same workflow); nobody else's are.
#[test]
fn reports_of_a_rollout_arriving_before_its_start_is_recorded_are_shown_once_it_is() {
    let gate = crate::contract::GateRun {
        workflow_id: "gate/r3/hello-world/1".to_owned(),
        run_id: "gate-run".to_owned(),
        task_queue: "gates".to_owned(),
        status: "Completed".to_owned(),
    };
    let early = |workflow_id: &str, run_id: &str, sequence, progress| RolloutReport {
        run_id: run_id.to_owned(),
        sequence,
        ..report(workflow_id, "v3-cccccccccc", progress)
    };
    let complete = RolloutReport {
        gate_runs: vec![gate.clone()],
        ..early("r3", "new", 3, RolloutProgress::Complete)
    };
    let v3 = signal(5, "v3-cccccccccc");
    let no_rollout = |s: &mut TwdState| {
        s.active = None;
        s.last_report = None;
    };
    let same_workflow = |s: &mut TwdState| {
        s.active = s.active.take().map(|a| ActiveRollout {
            workflow_id: "r3".to_owned(),
            ..a
        });
        s.last_report = Some(RolloutReport {
            run_id: "old".to_owned(),
            sequence: 7,
            ..report("r3", "v3-cccccccccc", RolloutProgress::Aborted)
        });
    };
    // (case, state before, reports arriving while the start is awaited, the started run (None:
    // it was already running), patched, the report shown after)
    type Case = (
        &'static str,
        Change,
        Vec<RolloutReport>,
        Option<&'static str>,
        bool,
    );
    let cases: Vec<(Case, Option<RolloutReport>)> = vec![
        (
            (
                "another rollout in flight",
                |_| {},
                vec![
                    early("r3", "new", 1, RolloutProgress::WaitingForPollers),
                    complete.clone(),
                    early("r3", "new", 2, RolloutProgress::WaitingForPromotion),
                ],
                Some("new"),
                true,
            ),
            Some(complete.clone()),
        ),
        (
            (
                "no rollout in flight yet",
                no_rollout,
                vec![
                    early("r3", "new", 1, RolloutProgress::WaitingForPollers),
                    complete.clone(),
                ],
                Some("new"),
                true,
            ),
            Some(complete.clone()),
        ),
        (
            (
                "an earlier run of the same workflow in flight (a retry)",
                same_workflow,
                vec![complete.clone()],
                Some("new"),
                true,
            ),
            Some(complete.clone()),
        ),
        (
            (
                "an earlier run's last words arriving during the launch",
                |_| {},
                vec![
                    complete.clone(),
                    early("r3", "old", 9, RolloutProgress::Superseded),
                ],
                Some("new"),
                true,
            ),
            Some(complete.clone()),
        ),
        (
            (
                "already running: its run is not known",
                |_| {},
                vec![complete.clone()],
                None,
                true,
            ),
            Some(complete.clone()),
        ),
        (
            (
                "a superseded rollout's last words are not the started one's",
                |_| {},
                vec![RolloutReport {
                    sequence: 9,
                    ..report("r1", OLD, RolloutProgress::Superseded)
                }],
                Some("new"),
                true,
            ),
            None,
        ),
        (
            (
                "histories from before the patch drop them",
                |_| {},
                vec![complete.clone()],
                Some("new"),
                false,
            ),
            None,
        ),
    ];
    for ((case, before, arriving, run_id, patched), shown) in cases {
        let mut state = rolling();
        before(&mut state);
        let unpatched = |state: &TwdState| (state.active.clone(), state.last_report.clone());
        let mut reference = state.clone();
        state.launching("r3");
        for report in arriving {
            let wakes = state.receive_report(report.clone());
            assert_eq!(
                wakes,
                reference.receive_report(report),
                "{case}: whether a report wants a turn is as before the patch"
            );
            assert_eq!(unpatched(&state), unpatched(&reference), "{case}");
        }
        state.started(&v3, "r3".to_owned(), run_id, patched, None);
        assert_eq!(state.last_report, shown, "{case}");
        assert_eq!(state.launching, None, "{case}");
        assert!(state.early_reports.is_empty(), "{case}");
    }

    let mut state = rolling();
    state.receive_report(complete.clone());
    state.launching("r3");
    state.started(&v3, "r3".to_owned(), Some("new"), true, None);
    assert_eq!(
        state.last_report, None,
        "a report received before the launch is not shown"
    );
}

#[test]
fn controls_are_forwarded_to_the_rollout_in_flight_or_answered() {
    let answer = |reason: &'static str, message: &str| ControlStep::Answer {
        reason,
        message: message.to_owned(),
    };
    let cases: [(&str, Change, ControlAction, ControlStep); 6] = [
        (
            "under way: forwarded",
            |_| {},
            ControlAction::Pause,
            ControlStep::Forward("r2".to_owned()),
        ),
        (
            "no rollout at all",
            |s| s.active = None,
            ControlAction::Promote,
            answer(
                control::REASON_IGNORED,
                "promote: no rollout of ns/w is in progress",
            ),
        ),
        (
            "not reported yet: forwarded",
            |s| s.last_report = None,
            ControlAction::Abort,
            ControlStep::Forward("r2".to_owned()),
        ),
        (
            "retry after an abort of the build the spec asks for",
            |s| progress(s, RolloutProgress::Aborted),
            ControlAction::Retry,
            ControlStep::Retry(
                control::effect(
                    ControlAction::Retry,
                    &ControlState {
                        build_id: NEW.to_owned(),
                        progress: Some(RolloutProgress::Aborted),
                        blocked: None,
                        operator_paused: false,
                        spec_paused: false,
                        promote_requested: false,
                    },
                )
                .message()
                .to_owned(),
            ),
        ),
        (
            "a second abort",
            |s| progress(s, RolloutProgress::Aborted),
            ControlAction::Abort,
            answer(
                control::REASON_UNCHANGED,
                &format!("abort: the rollout of build {NEW} is already aborted"),
            ),
        ),
        (
            "retry after an abort, the spec asks for another build",
            |s| {
                progress(s, RolloutProgress::Aborted);
                if let Some(spec) = s.spec.as_mut() {
                    spec.build_id = "v3-cccccccccc".to_owned();
                }
            },
            ControlAction::Retry,
            ControlStep::Answer {
                reason: control::REASON_IGNORED,
                message: String::new(),
            },
        ),
    ];
    for (case, change, action, expected) in cases {
        let mut state = rolling();
        change(&mut state);
        let spec = state.spec.clone().expect("a spec");
        let step = state.control_step(action, &spec, "ns/w");
        match (&step, &expected) {
            // The exact words are control.rs's; here only that it is answered, not retried.
            (ControlStep::Answer { reason, .. }, ControlStep::Answer { reason: r, message })
                if message.is_empty() =>
            {
                assert_eq!(reason, r, "{case}");
            }
            _ => assert_eq!(step, expected, "{case}"),
        }
    }
    let mut state = rolling();
    state.aborted.push(NEW.to_owned());
    state.retried(NEW);
    assert!(
        state.aborted.is_empty(),
        "a retried build may roll out again"
    );
}

#[test]
fn signals_and_reports_record_what_they_bring() {
    // (case, state change, what arrives, wants a turn, check of the state after)
    type Arrives = fn(&mut TwdState) -> bool;
    type Check = fn(&TwdState) -> bool;
    let cases: [(&str, Change, Arrives, bool, Check); 10] = [
        (
            "a newer generation",
            |_| {},
            |s| s.receive_spec(signal(4, NEW)),
            true,
            |s| s.spec_signalled && s.spec.as_ref().is_some_and(|x| x.generation == 4),
        ),
        (
            "the spec held, sent again",
            |_| {},
            |s| s.receive_spec(signal(3, NEW)),
            false,
            |s| !s.spec_signalled && !s.poked,
        ),
        (
            "the spec held, with a nudge: the rollout is told",
            |_| {},
            |s| {
                s.receive_spec(SpecSignal {
                    nudge: true,
                    ..signal(3, NEW)
                })
            },
            true,
            |s| s.spec_signalled && s.poked,
        ),
        (
            "an older generation",
            |_| {},
            |s| s.receive_spec(signal(2, OLD)),
            false,
            |s| s.spec.as_ref().is_some_and(|x| x.generation == 3),
        ),
        (
            "another object of the name: its status is written afresh",
            |s| s.last_status = Some(TemporalWorkerDeploymentStatus::default()),
            |s| {
                s.receive_spec(SpecSignal {
                    uid: Some("uid-2".to_owned()),
                    ..signal(1, NEW)
                })
            },
            true,
            |s| s.last_status.is_none(),
        ),
        (
            "the spec moved on from an aborted build",
            |s| s.aborted.push(NEW.to_owned()),
            |s| s.receive_spec(signal(4, "v3-cccccccccc")),
            true,
            |s| s.aborted.is_empty(),
        ),
        (
            "a newer report of the rollout in flight",
            |_| {},
            |s| {
                s.receive_report(RolloutReport {
                    sequence: 2,
                    ..report_with(RolloutProgress::Ramping)
                })
            },
            true,
            |s| s.last_report.as_ref().is_some_and(|r| r.sequence == 2),
        ),
        (
            "a report delivered late",
            |s| progress(s, RolloutProgress::Ramping),
            |s| s.receive_report(report_with(RolloutProgress::WaitingForPollers)),
            false,
            |s| {
                s.last_report
                    .as_ref()
                    .is_some_and(|r| r.progress == RolloutProgress::Ramping)
            },
        ),
        (
            "the last words of a superseded rollout",
            |_| {},
            |s| {
                s.receive_report(RolloutReport {
                    sequence: 9,
                    ..report("r1", OLD, RolloutProgress::Superseded)
                })
            },
            false,
            |s| {
                s.last_report
                    .as_ref()
                    .is_some_and(|r| r.workflow_id == "r2")
            },
        ),
        (
            "an abort",
            |_| {},
            |s| {
                s.receive_report(RolloutReport {
                    sequence: 2,
                    ..report_with(RolloutProgress::Aborted)
                })
            },
            true,
            |s| s.aborted == [NEW.to_owned()],
        ),
    ];
    for (case, change, arrives, wakes, check) in cases {
        let mut state = rolling();
        change(&mut state);
        assert_eq!(arrives(&mut state), wakes, "{case}");
        assert!(check(&state), "{case}: {state:?}");
    }
}

#[test]
fn resources_are_reasserted_after_a_spec_signal_and_at_least_every_thirty_seconds() {
    // (case, last re-assertion, a spec signal came, now, due)
    let cases = [
        ("a run's first turn", None, false, 0, true),
        ("a spec signal came", Some(10_000), true, 11_000, true),
        (
            "nothing came, 29 s later",
            Some(10_000),
            false,
            39_000,
            false,
        ),
        (
            "nothing came, 30 s later",
            Some(10_000),
            false,
            40_000,
            true,
        ),
    ];
    for (case, last, signalled, now, due) in cases {
        let mut state = TwdState {
            reasserted_at: last,
            spec_signalled: signalled,
            ..TwdState::default()
        };
        assert_eq!(state.take_reassert_due(now), due, "{case}");
        assert!(!state.spec_signalled, "{case}: the signal is taken");
        let expected = if due { Some(now) } else { last };
        assert_eq!(state.reasserted_at, expected, "{case}");
    }
}

#[test]
fn the_reading_follows_from_the_reassertion_and_what_woke_the_turn() {
    // (re-assertion due, quiet, reading, reports shown meanwhile)
    let cases = [
        (true, false, Reading::Recheck { local: false }, true),
        (true, true, Reading::Recheck { local: true }, true),
        (false, true, Reading::LocalObserve, false),
        (false, false, Reading::Observe, true),
    ];
    for (reassert, quiet, reading, shows) in cases {
        assert_eq!(Reading::of(reassert, quiet), reading, "{reassert} {quiet}");
        assert_eq!(reading.shows_reports(), shows, "{reading:?}");
    }
}

#[test]
fn a_reading_of_a_newer_spec_is_taken_and_acted_on_at_once() {
    let held = signal(3, NEW);
    let read = |generation: i64, deleting: bool| {
        let mut spec = spec(RolloutStrategy::AllAtOnce);
        spec.generation = generation;
        spec.deleting = deleting;
        observation(spec, Vec::new(), temporal_with_old_current())
    };
    // (case, observation, shown with generation, spec held after)
    let cases = [
        ("the spec held: shown", read(3, false), Some(3), 3),
        (
            "a newer spec: taken, nothing shown",
            read(4, false),
            None,
            4,
        ),
        ("its deletion: taken", read(3, true), None, 3),
        (
            "an older reading: shown as the held spec's",
            read(2, false),
            Some(3),
            3,
        ),
    ];
    for (case, observation, shown, held_after) in cases {
        let mut state = rolling();
        let got = state.observed(observation.clone(), &held);
        assert_eq!(got.map(|s| s.generation), shown, "{case}");
        assert_eq!(state.last_observation, Some(observation), "{case}");
        assert_eq!(
            state.spec.as_ref().map(|s| s.generation),
            Some(held_after),
            "{case}"
        );
    }
}

/// The status written between a rollout's start and its first report (the metrics count a
/// rollout by the workflow a status names): under `show-starting-rollout` it names the rollout
/// and shows it waiting for pollers, even when Temporal already holds its build (registered
/// by pods that came up first); without the patch it showed no workflow and a
/// `WaitingForPromotion` derived from that build's state.
#[test]
fn a_rollout_started_and_not_reported_is_named_and_waits_for_pollers() {
    let mut temporal = temporal_with_old_current();
    temporal.versions.push(version(NEW, VersionState::Inactive));
    let shown = Shown::of(
        observation(
            spec(RolloutStrategy::Manual),
            vec![deployment(OLD), deployment(NEW)],
            temporal,
        ),
        3,
    );
    let shows = |state: &TwdState| {
        let status = state.status(&shown, "hello", 900);
        let ready = status.conditions.iter().find(|c| c.type_ == "Ready");
        let rollout = status.rollout.unwrap_or_default();
        (
            ready.map(|c| c.reason.clone()).unwrap_or_default(),
            rollout.workflow_id,
            rollout.started_at.map(|t| t.0.as_millisecond()),
        )
    };
    let started = |at| {
        let mut state = rolling();
        state.launching("r2");
        state.started(&signal(3, NEW), "r2".to_owned(), Some("run"), true, at);
        state
    };

    let mut patched = started(Some(800));
    assert_eq!(
        shows(&patched),
        (
            "WaitingForPollers".to_owned(),
            Some("r2".to_owned()),
            Some(800)
        )
    );
    let first = RolloutReport {
        started_at: 810,
        ..report("r2", NEW, RolloutProgress::WaitingForPromotion)
    };
    assert!(patched.receive_report(first));
    assert_eq!(
        shows(&patched),
        (
            "WaitingForPromotion".to_owned(),
            Some("r2".to_owned()),
            Some(810)
        ),
        "its first report takes over"
    );
    assert_eq!(
        shows(&started(None)),
        ("WaitingForPromotion".to_owned(), None, None),
        "a history before the patch shows what it showed"
    );
}

#[test]
fn the_status_is_one_projection_of_what_is_shown() {
    let state = rolling();
    let observation = state.last_observation.clone().expect("observed");
    let shown = Shown::of(observation.clone(), 3);
    let status = state.status(&shown, "hello", 900);
    assert_eq!(status.observed_generation, Some(3));
    assert_eq!(
        status.current_version.as_ref().map(|v| v.build_id.as_str()),
        Some(OLD)
    );
    assert_eq!(
        status
            .target_version
            .as_ref()
            .map(|v| v.version.build_id.as_str()),
        Some(NEW)
    );
    assert!(!state.shows(&status), "nothing written yet");
    let written = TwdState {
        last_status: Some(status.clone()),
        ..state.clone()
    };
    assert!(
        written.shows(&state.status(&shown, "hello", 5_000)),
        "the same status later: only its timestamps moved"
    );
    let deleting = Shown {
        deleting: Some(deletion_condition(None, "waiting for Temporal")),
        ..shown
    };
    let status = state.status(&deleting, "hello", 900);
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.type_ == crate::plan::conditions::DELETING),
        "the deletion's condition: {:?}",
        status.conditions
    );
    assert!(!written.shows(&status));
}

#[test]
fn an_aborted_target_is_retired_like_any_other_version() {
    let obs = observation(
        spec(RolloutStrategy::AllAtOnce),
        vec![deployment(OLD), deployment(NEW)],
        TemporalState {
            versions: vec![
                version(OLD, VersionState::Current),
                version(NEW, VersionState::Inactive),
            ],
            ..temporal_with_old_current()
        },
    );
    let retired = |state: &TwdState| {
        state
            .sunset_plan(&obs, 1_000)
            .memory
            .into_iter()
            .map(|m| m.build_id)
            .collect::<Vec<_>>()
    };
    let mut state = rolling();
    assert!(retired(&state).is_empty(), "the target is kept");
    state.aborted.push(NEW.to_owned());
    assert_eq!(retired(&state), vec![NEW.to_owned()]);
}

#[test]
fn autoscaling_reads_backlogs_when_due_and_sizes_a_shared_total_every_turn() {
    let policy = |shared_total: bool| AutoscalePolicy {
        min_replicas: 1,
        max_replicas: 3,
        target: BacklogTarget::PerReplica(3),
        up_window_ms: 0,
        down_window_ms: 5_000,
        draining_min: 0,
        draining_max: 3,
        shared_total,
    };
    let read = |autoscaling: Option<AutoscalePolicy>, deployments| {
        let mut spec = spec(RolloutStrategy::AllAtOnce);
        spec.autoscaling = autoscaling;
        observation(spec, deployments, temporal_with_old_current())
    };
    /// `(read first, versions sized)` of a `Size` step.
    fn sized(step: &AutoscaleStep) -> Option<(bool, usize)> {
        match step {
            AutoscaleStep::Size { read, versions, .. } => Some((*read, versions.len())),
            _ => None,
        }
    }
    // (case, policy, Deployments, next read at, expected step, expected (read, sized))
    let cases = [
        (
            "no autoscaling",
            None,
            vec![deployment(OLD)],
            None,
            Some(AutoscaleStep::Off),
            None,
        ),
        (
            "not due",
            Some(policy(false)),
            vec![deployment(OLD)],
            Some(5_000),
            Some(AutoscaleStep::NotDue(Some(5_000))),
            None,
        ),
        (
            "due, nothing to size",
            Some(policy(false)),
            vec![],
            Some(500),
            Some(AutoscaleStep::Idle),
            None,
        ),
        (
            "due: read",
            Some(policy(false)),
            vec![deployment(OLD)],
            Some(500),
            None,
            Some((true, 1)),
        ),
        (
            "a shared total: sized every turn without reading",
            Some(policy(true)),
            vec![deployment(OLD)],
            Some(5_000),
            None,
            Some((false, 1)),
        ),
    ];
    for (case, autoscaling, deployments, next_read_at, step, size) in cases {
        let state = TwdState {
            autoscale: AutoscaleMemory {
                series: Vec::new(),
                next_read_at,
            },
            ..rolling()
        };
        let got = state.autoscale_step(&read(autoscaling, deployments), 1_000);
        if let Some(step) = step {
            assert_eq!(got, step, "{case}");
        }
        assert_eq!(sized(&got), size, "{case}");
    }
}

#[test]
fn a_continued_run_resumes_with_its_memory_and_inbox_and_reads_afresh() {
    let mut state = rolling();
    state.controls.push(ControlAction::Promote);
    state.poked = true;
    state.aborted.push(OLD.to_owned());
    let resumed = TwdState::resumed(Some(state.carried(None)));
    assert_eq!(
        resumed,
        TwdState {
            reasserted_at: None,
            last_observation: None,
            ..state
        },
        "carried: spec, rollout, report, sunset, aborted, controls, nudge"
    );
    assert_eq!(TwdState::resumed(None), TwdState::default());
}

#[test]
fn a_failing_notification_target_shows_in_the_status_until_it_delivers_and_is_carried() {
    use crate::contract::NotificationFailure;
    let mut state = rolling();
    let observation = state.last_observation.clone().expect("observed");
    let shown = Shown::of(observation, 3);
    let delivered = |status: &TemporalWorkerDeploymentStatus| {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == notify::CONDITION_TYPE)
            .map(|c| (c.status.clone(), c.reason.clone()))
    };
    assert_eq!(delivered(&state.status(&shown, "hello", 900)), None);
    let failing = vec![TargetFailure {
        target: "ops".to_owned(),
        reason: NotificationFailure::NotificationDeliveryFailed,
        message: "the webhook answered 500".to_owned(),
    }];
    assert!(state.receive_notification_health(failing.clone()));
    assert!(
        !state.receive_notification_health(failing.clone()),
        "the same report again changes nothing"
    );
    assert_eq!(
        delivered(&state.status(&shown, "hello", 900)),
        Some(("False".to_owned(), "NotificationDeliveryFailed".to_owned()))
    );
    let resumed = TwdState::resumed(Some(state.carried(None)));
    assert_eq!(resumed.notification_failures, failing, "carried over");
    assert!(state.receive_notification_health(Vec::new()));
    assert_eq!(delivered(&state.status(&shown, "hello", 900)), None);
    assert!(
        serde_json::to_value(state.carried(None))
            .is_ok_and(|v| v.get("notification_failures").is_none()),
        "nothing carried when every target delivers (the same input as before notifications)"
    );
}

#[test]
fn a_run_continues_as_new_at_its_event_bound_or_from_before_the_patch_its_turn_limit() {
    let run = |turns, history_length, suggested, bound, short_runs| RunLength {
        turns,
        history_length,
        suggested,
        bound,
        short_runs,
        settled_after_work: false,
    };
    let settled = |history_length| RunLength {
        settled_after_work: true,
        ..run(
            3,
            history_length,
            false,
            crate::DEFAULT_HISTORY_EVENT_BOUND,
            true,
        )
    };
    let default = crate::DEFAULT_HISTORY_EVENT_BOUND;
    let cases = [
        (
            "short: a young run goes on",
            run(10, 80, false, default, true),
            false,
        ),
        (
            "short: one event under the bound",
            run(60, 399, false, default, true),
            false,
        ),
        (
            "short: at the bound",
            run(61, 400, false, default, true),
            true,
        ),
        (
            "short: turns do not count",
            run(900, 120, false, default, true),
            false,
        ),
        (
            "short: a lower controller bound wins",
            run(5, 100, false, 100, true),
            true,
        ),
        (
            "short: Temporal suggests it",
            run(1, 20, true, default, true),
            true,
        ),
        (
            "old: 400 events are not the end",
            run(66, 400, false, default, false),
            false,
        ),
        (
            "old: the 500th turn",
            run(500, 3_000, false, default, false),
            true,
        ),
        (
            "old: the controller's bound",
            run(80, 100, false, 100, false),
            true,
        ),
        (
            "old: Temporal suggests it",
            run(1, 20, true, default, false),
            true,
        ),
        (
            "settled after its rollout: a young run ends too",
            settled(60),
            true,
        ),
    ];
    for (case, length, over) in cases {
        assert_eq!(length.is_over(), over, "{case}");
    }
}

#[test]
fn a_run_has_settled_after_work_once_the_rollout_it_worked_on_has_ended_and_nothing_waits() {
    fn ended(s: &mut TwdState, to: RolloutProgress) {
        s.worked = true;
        progress(s, to);
    }
    let cases: [(&str, Change, bool); 11] = [
        ("a rollout waiting for pollers", |_| {}, false),
        (
            "its Complete report, in a run that worked on it",
            |s| ended(s, RolloutProgress::Complete),
            true,
        ),
        (
            "aborted: the rollout has ended, its build retires",
            |s| ended(s, RolloutProgress::Aborted),
            true,
        ),
        (
            "blocked: a retry can resume it",
            |s| ended(s, RolloutProgress::Blocked),
            false,
        ),
        ("paused", |s| ended(s, RolloutProgress::Paused), false),
        (
            "complete, but this run neither started it nor took a report of it (a run continued idle)",
            |s| progress(s, RolloutProgress::Complete),
            false,
        ),
        (
            "complete, a control waiting",
            |s| {
                ended(s, RolloutProgress::Complete);
                s.controls.push(ControlAction::Retry);
            },
            false,
        ),
        (
            "complete, a spec signal since",
            |s| {
                ended(s, RolloutProgress::Complete);
                s.spec_signalled = true;
            },
            false,
        ),
        (
            "complete, a newer build being started",
            |s| {
                ended(s, RolloutProgress::Complete);
                s.launching = Some("r3".to_owned());
            },
            false,
        ),
        (
            "complete, the TWD being deleted",
            |s| {
                ended(s, RolloutProgress::Complete);
                if let Some(spec) = s.spec.as_mut() {
                    spec.deleting = true;
                }
            },
            false,
        ),
        (
            "no rollout in flight, in a run that worked",
            |s| {
                s.worked = true;
                s.active = None;
            },
            true,
        ),
    ];
    for (case, change, settled) in cases {
        let mut state = rolling();
        change(&mut state);
        assert_eq!(state.settled_after_work(), settled, "{case}");
    }

    // What makes a run one that worked: starting a rollout, or a report of one, even when the
    // rollout ends before the turn that started it does.
    let mut quiet = rolling();
    progress(&mut quiet, RolloutProgress::Complete);
    assert!(
        !quiet.settled_after_work(),
        "only quiet turns: the run goes on"
    );
    let mut launched = quiet.clone();
    launched.launching("r3");
    assert!(launched.worked && !launched.settled(), "being started");
    let mut reported = quiet.clone();
    let mut done = report("r2", NEW, RolloutProgress::Complete);
    done.sequence = 2;
    assert!(reported.receive_report(done.clone()));
    assert!(reported.settled_after_work(), "its Complete report");
    let mut stale = quiet;
    done.sequence = 1;
    assert!(!stale.receive_report(done), "a report already held");
    assert!(!stale.settled_after_work(), "changes nothing");
}

#[test]
fn a_run_continued_with_nothing_pending_starts_with_the_resync_it_was_due() {
    let mut state = rolling();
    progress(&mut state, RolloutProgress::Complete);
    state.reasserted_at = Some(1_000);
    let shown = Shown::of(state.last_observation.clone().expect("observed"), 3);
    state.last_status = Some(state.status(&shown, "hello", 1_000));

    let carried = state.carried(Some(301_000));
    assert_eq!(
        carried.quiet_start,
        Some(QuietStart {
            turn_at: 301_000,
            reasserted_at: Some(1_000),
            status: state.last_status.clone(),
        })
    );
    let resumed = TwdState::resumed(Some(carried.clone()));
    assert_eq!(resumed.reasserted_at, Some(1_000), "not a first turn");
    assert!(
        state
            .last_status
            .as_ref()
            .is_some_and(|status| resumed.shows(status)),
        "the status written is not written again"
    );
    assert_eq!(
        QuietStart::first_wait(Some(&carried), 2_000),
        Duration::from_millis(299_000),
        "the first turn at the time the previous run chose"
    );
    assert_eq!(
        QuietStart::first_wait(Some(&carried), 400_000),
        Duration::ZERO,
        "its time passed (the first task came late): at once"
    );
    assert_eq!(
        decide(&resumed, Woke::Timer, 301_000),
        TwdDecision::Turn(Turn {
            spec: signal(3, NEW),
            show_reported_routing: true,
            reassert_first: false,
            quiet: true,
        }),
        "a quiet resync"
    );

    let pending: [(&str, Change); 3] = [
        ("a control", |s| s.controls.push(ControlAction::Pause)),
        ("a nudge", |s| s.poked = true),
        ("a spec signal", |s| s.spec_signalled = true),
    ];
    for (case, change) in pending {
        let mut waiting = state.clone();
        change(&mut waiting);
        let carried = waiting.carried(Some(301_000));
        assert_eq!(carried.quiet_start, None, "{case}: the first turn at once");
        assert_eq!(
            QuietStart::first_wait(Some(&carried), 2_000),
            Duration::ZERO
        );
    }
    let at_once = state.carried(None);
    assert_eq!(at_once.quiet_start, None, "no time given: at once");
    assert_eq!(
        QuietStart::first_wait(Some(&at_once), 2_000),
        Duration::ZERO
    );
    assert_eq!(QuietStart::first_wait(None, 2_000), Duration::ZERO);
    assert!(
        serde_json::to_value(&at_once).is_ok_and(|v| v.get("quiet_start").is_none()),
        "nothing carried without it (the same input as before)"
    );
}

#[test]
fn a_run_continued_with_nothing_pending_does_not_write_the_status_it_carried_again() {
    // A rollout started between two seconds: its status shows `startedAt` at the second, as
    // Kubernetes times are written, while the projection holds the millisecond.
    let mut state = rolling();
    progress(&mut state, RolloutProgress::Complete);
    if let Some(report) = state.last_report.as_mut() {
        report.started_at = 1_796_666_493_247;
    }
    let shown = Shown::of(state.last_observation.clone().expect("observed"), 3);
    let now = 1_796_666_529_144;
    let status = state.status(&shown, "hello", now);
    state.last_status = Some(status);

    // The next run's input travels as JSON, as every workflow input does.
    let carried = state.carried(Some(now + 300_000));
    let input = serde_json::to_vec(&carried).expect("serializes");
    let carried: CarriedTwd = serde_json::from_slice(&input).expect("deserializes");
    let resumed = TwdState::resumed(Some(carried));

    let projected = resumed.status(&shown, "hello", now + 300_000);
    assert!(
        resumed.shows(&projected),
        "the first turn's projection is the status written before the continue-as-new"
    );
    let mut moved = projected.clone();
    moved.observed_generation = Some(4);
    assert!(!resumed.shows(&moved), "a change is still written");
}

#[test]
fn a_run_this_build_continued_has_the_short_runs_bound_without_asking_the_patch() {
    let carried = rolling().carried(None);
    assert!(carried.short_runs, "every run this build continues");
    let mut input = serde_json::to_value(&carried).expect("serializes");
    assert_eq!(input["short_runs"], true);
    if let Some(fields) = input.as_object_mut() {
        fields.remove("short_runs");
    }
    let from_before: CarriedTwd = serde_json::from_value(input).expect("deserializes");
    assert!(
        !from_before.short_runs,
        "a run continued by v0.1.0 asks the patch, as before"
    );
}
