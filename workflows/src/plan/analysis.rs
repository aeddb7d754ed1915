//! Canary analysis of a Progressive step: when to measure, when a step may advance, when the
//! rollout must stop. Pure; the rollout workflow runs the measurements and records them here.
//!
//! Each check is measured every `interval`, the first time one interval after the step's ramp
//! was set (Temporal's ramp-changed time, the step's clock). Records belong to one step clock:
//! a new step starts with none. A step advances when its pause is over, its gate (if any)
//! passed, and the latest measurement of every check that is not `dryRun` passed. A check
//! fails the rollout when its failed measurements in the step exceed `failureLimit`, or its
//! inconclusive measurements in a row exceed `inconclusiveLimit`.

use serde::{Deserialize, Serialize};
use twc_crds::worker_deployment::AnalysisCheckStatus;

use crate::contract::{Measurement, Verdict};
use crate::model::{AnalysisView, UnixMillis};

/// Look again this long after a step that cannot advance and has no measurement due.
const FALLBACK_RECHECK_MS: i64 = 10_000;

/// Name of the step gate's row in `status.rollout.analysis`.
pub const STEP_GATE_ROW: &str = "gate";

/// What the rollout remembers of the analysis of the step in force.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AnalysisMemory {
    /// Index of the step the records belong to.
    pub step: Option<u32>,
    /// Clock (ramp-changed time) of that step.
    pub step_clock: Option<UnixMillis>,
    /// One record per check measured in the step.
    pub checks: Vec<CheckRecord>,
    /// The step's gate.
    pub gate: StepGate,
    /// Why the rollout must stop (a check or a step gate failed); set once, never cleared.
    pub failed: Option<String>,
    /// A check its provider refused (PromQL it cannot parse), as it was configured: the
    /// rollout is held with `InvalidSpec` until the check is changed.
    #[serde(default)]
    pub refused: Option<RefusedCheck>,
}

/// A check its provider refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RefusedCheck {
    /// The check as configured when refused.
    pub check: crate::model::CheckView,
    /// The provider's message.
    pub message: String,
}

/// Measurements of one check in one step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckRecord {
    /// Check name.
    pub name: String,
    /// Measurements that passed.
    pub successful: u32,
    /// Measurements that failed.
    pub failed: u32,
    /// Inconclusive measurements in a row, up to the last one.
    pub inconclusive_in_row: u32,
    /// Recorded only.
    pub dry_run: bool,
    /// The last measurement.
    pub last: Measurement,
    /// When it was taken (workflow time).
    pub measured_at: UnixMillis,
}

/// Where the step's gate workflow stands.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum StepGate {
    /// Not started, or started and not finished.
    #[default]
    NotRun,
    /// Every gate run completed.
    Passed,
    /// A gate run did not complete.
    Failed {
        /// What failed.
        message: String,
    },
}

/// The analysis' part in the decision while a step is in force.
#[derive(Debug, Clone, PartialEq)]
pub enum StepAnalysis {
    /// Run the step's gate workflow.
    RunGate,
    /// Measure these checks now.
    Measure(Vec<String>),
    /// Nothing to do before `until` (the pause end or the next measurement, whichever first).
    Wait {
        /// When to look again.
        until: UnixMillis,
        /// Why the step does not advance although its pause is over (inconclusive checks).
        inconclusive: Option<String>,
    },
    /// The step may advance.
    Passed,
}

impl AnalysisMemory {
    /// Starts the records of `step` (with clock `step_clock`) unless they are already its.
    pub fn enter_step(&mut self, step: u32, step_clock: UnixMillis) {
        if self.step == Some(step) && self.step_clock == Some(step_clock) {
            return;
        }
        self.step = Some(step);
        self.step_clock = Some(step_clock);
        self.checks.clear();
        self.gate = StepGate::NotRun;
    }

    fn record(&self, name: &str) -> Option<&CheckRecord> {
        self.checks.iter().find(|r| r.name == name)
    }

    /// Records measurements taken at `now` in the step in force and returns the failure that
    /// stops the rollout, if one check went beyond a limit (also kept in `failed`).
    pub fn record_measurements(
        &mut self,
        view: &AnalysisView,
        measurements: &[Measurement],
        now: UnixMillis,
    ) -> Option<String> {
        for measurement in measurements {
            let Some(check) = view.checks.iter().find(|c| c.name == measurement.check) else {
                continue;
            };
            if measurement.verdict == Verdict::Invalid {
                self.refused = Some(RefusedCheck {
                    check: check.clone(),
                    message: measurement.message.clone(),
                });
                continue;
            }
            if self
                .refused
                .as_ref()
                .is_some_and(|r| r.check.name == check.name)
            {
                self.refused = None;
            }
            let index = match self.checks.iter().position(|r| r.name == check.name) {
                Some(index) => index,
                None => {
                    self.checks.push(CheckRecord {
                        name: check.name.clone(),
                        successful: 0,
                        failed: 0,
                        inconclusive_in_row: 0,
                        dry_run: check.dry_run,
                        last: measurement.clone(),
                        measured_at: now,
                    });
                    self.checks.len() - 1
                }
            };
            let Some(record) = self.checks.get_mut(index) else {
                continue;
            };
            record.last = measurement.clone();
            record.measured_at = now;
            record.dry_run = check.dry_run;
            match measurement.verdict {
                Verdict::Successful => {
                    record.successful += 1;
                    record.inconclusive_in_row = 0;
                }
                Verdict::Failed => {
                    record.failed += 1;
                    record.inconclusive_in_row = 0;
                }
                Verdict::Inconclusive | Verdict::Invalid => record.inconclusive_in_row += 1,
            }
            if check.dry_run || self.failed.is_some() {
                continue;
            }
            let step = self.step.map_or(1, |s| s + 1);
            if record.failed > check.failure_limit {
                self.failed = Some(format!(
                    "check {} failed {} time(s) in step {step} (failureLimit {}): {}",
                    check.name, record.failed, check.failure_limit, measurement.message
                ));
            } else if measurement.verdict == Verdict::Inconclusive
                && record.inconclusive_in_row > check.inconclusive_limit
            {
                self.failed = Some(format!(
                    "check {} was inconclusive {} time(s) in a row in step {step} (inconclusiveLimit {}): {}",
                    check.name,
                    record.inconclusive_in_row,
                    check.inconclusive_limit,
                    measurement.message
                ));
            }
        }
        self.failed.clone()
    }

    /// The refusal in force: a refused check still configured as it was when refused.
    pub fn refusal(&self, view: &AnalysisView) -> Option<String> {
        let refused = self.refused.as_ref()?;
        view.checks.contains(&refused.check).then(|| {
            format!(
                "spec.rollout.analysis check {} was refused by its provider: {}",
                refused.check.name, refused.message
            )
        })
    }

    /// Records the step gate's result; a failure stops the rollout.
    pub fn record_gate(&mut self, gate: StepGate) {
        if let StepGate::Failed { message } = &gate
            && self.failed.is_none()
        {
            let step = self.step.map_or(1, |s| s + 1);
            self.failed = Some(format!("gate of step {step} failed: {message}"));
        }
        self.gate = gate;
    }

    /// What the analysis asks for while step `step` (clock `step_clock`, pause ending at
    /// `pause_until`) is in force at `now`. Records of another step count as none.
    pub fn next(
        &self,
        view: &AnalysisView,
        step: u32,
        step_clock: UnixMillis,
        pause_until: UnixMillis,
        now: UnixMillis,
    ) -> StepAnalysis {
        let same_step = self.step == Some(step) && self.step_clock == Some(step_clock);
        let usize_step = usize::try_from(step).unwrap_or(usize::MAX);
        let gate_passed = match view.step_gate(usize_step) {
            None => true,
            Some(_) => {
                let gate = if same_step {
                    &self.gate
                } else {
                    &StepGate::NotRun
                };
                match gate {
                    StepGate::NotRun => return StepAnalysis::RunGate,
                    StepGate::Passed => true,
                    // Stopped by `failed` before this is asked; never passes.
                    StepGate::Failed { .. } => false,
                }
            }
        };
        let record = |name: &str| if same_step { self.record(name) } else { None };
        let mut due = Vec::new();
        // The pause end is a wake-up only while it lies ahead.
        let mut next_due = if pause_until > now {
            pause_until
        } else {
            UnixMillis::MAX
        };
        let mut waiting_for = Vec::new();
        for check in &view.checks {
            let last = record(&check.name);
            let due_at = last
                .map_or(step_clock, |r| r.measured_at)
                .saturating_add(check.interval_ms);
            if due_at <= now {
                due.push(check.name.clone());
            } else {
                next_due = next_due.min(due_at);
            }
            if check.dry_run {
                continue;
            }
            match last.map(|r| r.last.verdict) {
                Some(Verdict::Successful) => {}
                Some(_) => waiting_for.push(format!(
                    "{}: {}",
                    check.name,
                    last.map(|r| r.last.message.as_str()).unwrap_or_default()
                )),
                None => waiting_for.push(format!("{}: not measured yet", check.name)),
            }
        }
        if !due.is_empty() {
            return StepAnalysis::Measure(due);
        }
        if pause_until > now {
            return StepAnalysis::Wait {
                until: next_due,
                inconclusive: None,
            };
        }
        if waiting_for.is_empty() && gate_passed {
            return StepAnalysis::Passed;
        }
        if next_due == UnixMillis::MAX {
            next_due = now.saturating_add(FALLBACK_RECHECK_MS);
        }
        let inconclusive = waiting_for
            .iter()
            .any(|w| !w.ends_with("not measured yet"))
            .then(|| waiting_for.join("; "));
        StepAnalysis::Wait {
            until: next_due,
            inconclusive,
        }
    }

    /// `status.rollout.analysis`: one row per check measured in the step, and the step gate.
    pub fn status(&self) -> Vec<AnalysisCheckStatus> {
        let Some(step) = self.step else {
            return Vec::new();
        };
        let step = i32::try_from(step).unwrap_or(i32::MAX);
        let mut rows: Vec<AnalysisCheckStatus> = self
            .checks
            .iter()
            .map(|r| AnalysisCheckStatus {
                name: r.name.clone(),
                step,
                phase: Some(r.last.verdict.as_str().to_owned()),
                message: Some(r.last.message.clone()),
                successful: i32::try_from(r.successful).unwrap_or(i32::MAX),
                failed: i32::try_from(r.failed).unwrap_or(i32::MAX),
                inconclusive: i32::try_from(r.inconclusive_in_row).unwrap_or(i32::MAX),
                dry_run: r.dry_run,
                measured_at: Some(crate::plan::status::time(r.measured_at)),
            })
            .collect();
        match &self.gate {
            StepGate::NotRun => {}
            StepGate::Passed => rows.push(AnalysisCheckStatus {
                name: STEP_GATE_ROW.to_owned(),
                step,
                phase: Some("Successful".to_owned()),
                successful: 1,
                ..Default::default()
            }),
            StepGate::Failed { message } => rows.push(AnalysisCheckStatus {
                name: STEP_GATE_ROW.to_owned(),
                step,
                phase: Some("Failed".to_owned()),
                message: Some(message.clone()),
                failed: 1,
                ..Default::default()
            }),
        }
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{CheckProvider, CheckView};

    const CLOCK: UnixMillis = 1_000_000;
    const SEC: i64 = 1000;

    fn check(
        name: &str,
        interval_s: i64,
        failure_limit: u32,
        inconclusive_limit: u32,
    ) -> CheckView {
        CheckView {
            name: name.to_owned(),
            interval_ms: interval_s * SEC,
            failure_limit,
            inconclusive_limit,
            dry_run: false,
            provider: CheckProvider::Temporal {
                max_failure_percent: Some(5.0),
                max_increase_over_current: None,
                min_samples: 10,
                include_types: Vec::new(),
                exclude_types: Vec::new(),
            },
        }
    }

    fn view(checks: Vec<CheckView>, step_gates: Vec<Option<&str>>) -> AnalysisView {
        AnalysisView {
            checks,
            step_gates: step_gates
                .into_iter()
                .map(|g| g.map(str::to_owned))
                .collect(),
        }
    }

    fn measured(name: &str, verdict: Verdict) -> Measurement {
        Measurement {
            check: name.to_owned(),
            verdict,
            value: Some(1.0),
            baseline: None,
            samples: Some(20),
            message: format!("{name} {}", verdict.as_str()),
            queries: Vec::new(),
        }
    }

    fn in_step(step: u32) -> AnalysisMemory {
        let mut memory = AnalysisMemory::default();
        memory.enter_step(step, CLOCK);
        memory
    }

    #[test]
    fn checks_are_measured_one_interval_after_the_step_began_then_every_interval() {
        let v = view(
            vec![check("fail", 10, 0, 3), check("slow", 30, 0, 3)],
            vec![],
        );
        let mut memory = in_step(0);
        let pause_until = CLOCK + 60 * SEC;
        let cases = [
            (
                CLOCK,
                StepAnalysis::Wait {
                    until: CLOCK + 10 * SEC,
                    inconclusive: None,
                },
            ),
            (
                CLOCK + 9 * SEC,
                StepAnalysis::Wait {
                    until: CLOCK + 10 * SEC,
                    inconclusive: None,
                },
            ),
            (CLOCK + 10 * SEC, StepAnalysis::Measure(vec!["fail".into()])),
            (
                CLOCK + 31 * SEC,
                StepAnalysis::Measure(vec!["fail".into(), "slow".into()]),
            ),
        ];
        for (now, expected) in cases {
            assert_eq!(
                memory.next(&v, 0, CLOCK, pause_until, now),
                expected,
                "at +{}s",
                (now - CLOCK) / SEC
            );
        }
        memory.record_measurements(
            &v,
            &[measured("fail", Verdict::Successful)],
            CLOCK + 12 * SEC,
        );
        assert_eq!(
            memory.next(&v, 0, CLOCK, pause_until, CLOCK + 13 * SEC),
            StepAnalysis::Wait {
                until: CLOCK + 22 * SEC,
                inconclusive: None
            },
            "the next measurement counts from the last one"
        );
    }

    #[test]
    fn a_step_advances_only_after_its_pause_with_every_check_passing() {
        let v = view(vec![check("a", 10, 0, 3), check("b", 10, 0, 3)], vec![]);
        let pause_until = CLOCK + 20 * SEC;
        let mut memory = in_step(0);
        let at = CLOCK + 20 * SEC;
        memory.record_measurements(&v, &[measured("a", Verdict::Successful)], at);
        memory.record_measurements(&v, &[measured("b", Verdict::Inconclusive)], at);
        assert_eq!(
            memory.next(&v, 0, CLOCK, pause_until, at),
            StepAnalysis::Wait {
                until: at + 10 * SEC,
                inconclusive: Some("b: b Inconclusive".into())
            },
            "an inconclusive check holds the step past its pause, with its reason"
        );
        assert_eq!(
            memory.next(&v, 0, CLOCK, pause_until, at + 10 * SEC),
            StepAnalysis::Measure(vec!["a".into(), "b".into()])
        );
        let both = [
            measured("a", Verdict::Successful),
            measured("b", Verdict::Successful),
        ];
        memory.record_measurements(&v, &both, at + 10 * SEC);
        assert_eq!(
            memory.next(&v, 0, CLOCK, pause_until, at + 10 * SEC),
            StepAnalysis::Passed
        );
        // A step whose pause is over but that was never measured waits for its measurement.
        let fresh = in_step(0);
        assert_eq!(
            fresh.next(&v, 0, CLOCK, CLOCK + 5 * SEC, CLOCK + 6 * SEC),
            StepAnalysis::Wait {
                until: CLOCK + 10 * SEC,
                inconclusive: None
            }
        );
    }

    #[test]
    fn limits_decide_when_the_rollout_fails() {
        // (failureLimit, inconclusiveLimit, verdicts in order, failed after which measurement)
        use Verdict::{Failed as F, Inconclusive as I, Successful as S};
        let cases: [(u32, u32, &[Verdict], Option<usize>); 6] = [
            (0, 3, &[S, S, F], Some(2)),
            (1, 3, &[F, S, F], Some(2)),
            (1, 3, &[F, S, S], None),
            (0, 2, &[I, I, I], Some(2)),
            (0, 2, &[I, I, S, I, I], None),
            (0, 0, &[I], Some(0)),
        ];
        for (failure_limit, inconclusive_limit, verdicts, fails_at) in cases {
            let v = view(
                vec![check("c", 10, failure_limit, inconclusive_limit)],
                vec![],
            );
            let mut memory = in_step(1);
            let mut failed_at = None;
            for (i, verdict) in verdicts.iter().enumerate() {
                let now = CLOCK + (i as i64 + 1) * 10 * SEC;
                if memory
                    .record_measurements(&v, &[measured("c", *verdict)], now)
                    .is_some()
                    && failed_at.is_none()
                {
                    failed_at = Some(i);
                }
            }
            assert_eq!(
                failed_at, fails_at,
                "limits {failure_limit}/{inconclusive_limit} {verdicts:?}"
            );
            if let Some(message) = &memory.failed {
                assert!(message.contains("step 2"), "{message}");
            }
        }
    }

    #[test]
    fn dry_run_checks_are_recorded_and_never_hold_or_fail() {
        let mut dry = check("dry", 10, 0, 0);
        dry.dry_run = true;
        let v = view(vec![dry], vec![]);
        let mut memory = in_step(0);
        assert_eq!(
            memory.record_measurements(&v, &[measured("dry", Verdict::Failed)], CLOCK + 10 * SEC),
            None
        );
        assert_eq!(memory.checks[0].failed, 1);
        assert!(memory.checks[0].dry_run);
        assert_eq!(
            memory.next(&v, 0, CLOCK, CLOCK + 10 * SEC, CLOCK + 11 * SEC),
            StepAnalysis::Passed
        );
        let status = memory.status();
        assert_eq!(
            (
                status[0].phase.as_deref(),
                status[0].failed,
                status[0].dry_run
            ),
            (Some("Failed"), 1, true)
        );
    }

    #[test]
    fn a_new_step_starts_with_no_records_and_its_gate_runs_first() {
        let v = view(vec![check("c", 10, 0, 3)], vec![None, Some("Smoke")]);
        let mut memory = in_step(0);
        memory.record_measurements(&v, &[measured("c", Verdict::Successful)], CLOCK + 10 * SEC);
        let next_clock = CLOCK + 30 * SEC;
        assert_eq!(
            memory.next(&v, 1, next_clock, next_clock + 60 * SEC, next_clock + SEC),
            StepAnalysis::RunGate,
            "records of step 0 do not count in step 1, whose gate runs before anything"
        );
        memory.enter_step(1, next_clock);
        assert!(memory.checks.is_empty());
        memory.record_gate(StepGate::Passed);
        assert_eq!(
            memory.next(&v, 1, next_clock, next_clock + 60 * SEC, next_clock + SEC),
            StepAnalysis::Wait {
                until: next_clock + 10 * SEC,
                inconclusive: None
            }
        );
        memory.record_gate(StepGate::Failed {
            message: "Smoke on q: Failed".into(),
        });
        assert_eq!(
            memory.failed.as_deref(),
            Some("gate of step 2 failed: Smoke on q: Failed")
        );
        let rows = memory.status();
        assert_eq!(
            rows.last().map(|r| (r.name.as_str(), r.phase.as_deref())),
            Some((STEP_GATE_ROW, Some("Failed")))
        );
    }

    #[test]
    fn a_refused_check_holds_until_it_is_changed() {
        let v = view(vec![check("q", 10, 0, 0)], vec![]);
        let mut memory = in_step(0);
        let refused = Measurement {
            message: "bad_data: parse error".into(),
            ..measured("q", Verdict::Invalid)
        };
        assert_eq!(
            memory.record_measurements(&v, &[refused], CLOCK + 10 * SEC),
            None,
            "a refusal is not a failed measurement"
        );
        assert!(
            memory
                .refusal(&v)
                .is_some_and(|m| m.contains("bad_data: parse error"))
        );
        let fixed = view(vec![check("q", 20, 0, 0)], vec![]);
        assert_eq!(
            memory.refusal(&fixed),
            None,
            "a changed check is measured again"
        );
        memory.record_measurements(
            &fixed,
            &[measured("q", Verdict::Successful)],
            CLOCK + 20 * SEC,
        );
        assert_eq!(memory.refused, None);
    }

    #[test]
    fn a_measurement_of_an_unknown_check_is_ignored() {
        let v = view(vec![check("c", 10, 0, 3)], vec![]);
        let mut memory = in_step(0);
        assert_eq!(
            memory.record_measurements(&v, &[measured("gone", Verdict::Failed)], CLOCK),
            None
        );
        assert!(memory.checks.is_empty());
    }
}
