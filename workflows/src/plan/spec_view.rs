//! Reduces a TemporalWorkerDeployment to what the engine decides on ([`SpecView`]), and checks
//! the rules the CRD schema cannot express (`InvalidSpec`).
//!
//! The schema already rejects most bad specs at `kubectl apply`; the rules here are either
//! beyond it (the gate's schemaless `input`) or cheap to re-check for objects stored before a
//! schema change. Nothing here panics on bad input: a value that cannot be used is replaced by a
//! safe one and reported in [`SpecView::invalid`], which blocks the rollout.

use std::time::Duration;

use twc_crds::TemporalWorkerDeployment;
use twc_crds::build_id::{adopted_build, target_build_id};
use twc_crds::duration::parse_duration;
use twc_crds::naming::versioned_deployment_name;
use twc_crds::worker_deployment::{
    AnalysisSpec, AutoscalingSpec, DrainSpec, GateSpec, MAX_DRAIN_RATE, PROMQL_PLACEHOLDERS,
    ReplicasMode, RolloutStep, RolloutStrategy,
};

use crate::model::{
    AnalysisView, AutoscalePolicy, BacklogTarget, CheckProvider, CheckView, DrainPolicy,
    ReplayCheckView, SpecView, StepView,
};

/// `spec.sunset.scaledownDelay` used when the stored value cannot be parsed (the CRD default).
const FALLBACK_SCALEDOWN_DELAY_MS: i64 = 60 * 60 * 1000;
/// `spec.sunset.deleteDelay` used when the stored value cannot be parsed (the CRD default).
const FALLBACK_DELETE_DELAY_MS: i64 = 24 * 60 * 60 * 1000;

/// The engine's view of a TWD; `invalid` lists rule violations (empty when valid).
pub fn spec_view(twd: &TemporalWorkerDeployment) -> SpecView {
    let spec = &twd.spec;
    let meta = &twd.metadata;
    let mut invalid = Vec::new();

    let build_id = target_build_id(twd);
    let name = meta.name.as_deref().unwrap_or_default();

    let steps = step_views(
        spec.rollout.steps.as_deref().unwrap_or_default(),
        &mut invalid,
    );
    if spec.rollout.strategy == RolloutStrategy::Progressive {
        check_progressive_steps(&steps, &mut invalid);
    }
    if let Some(gate) = &spec.rollout.gate {
        check_gate(gate, "spec.rollout.gate", &mut invalid);
    }

    // An unparseable rollback window disables rollback: promoting without the gate is the
    // riskier choice. Unparseable sunset delays fall back to the defaults rather than to zero,
    // so a typo never scales a version down early.
    let rollback_window_ms = duration_ms(
        "spec.rollout.rollbackWindow",
        &spec.rollout.rollback_window,
        &mut invalid,
    )
    .unwrap_or(0);
    let scaledown_delay_ms = duration_ms(
        "spec.sunset.scaledownDelay",
        &spec.sunset.scaledown_delay,
        &mut invalid,
    )
    .unwrap_or(FALLBACK_SCALEDOWN_DELAY_MS);
    let delete_delay_ms = duration_ms(
        "spec.sunset.deleteDelay",
        &spec.sunset.delete_delay,
        &mut invalid,
    )
    .unwrap_or(FALLBACK_DELETE_DELAY_MS);

    let drain = spec
        .sunset
        .drain
        .as_ref()
        .and_then(|drain| drain_policy(drain, &mut invalid));

    let analysis = analysis_view(
        spec.rollout.analysis.as_ref(),
        spec.rollout.steps.as_deref().unwrap_or_default(),
        spec.rollout.strategy,
        &mut invalid,
    );

    let replay_check = spec.rollout.replay_check.as_ref().map(|check| {
        let timeout_ms = duration_ms(
            "spec.rollout.replayCheck.timeout",
            &check.timeout,
            &mut invalid,
        )
        .unwrap_or(600_000);
        ReplayCheckView {
            command: check.command.clone(),
            args: check.args.clone(),
            max_histories: u32::try_from(check.max_histories.max(1)).unwrap_or(1),
            max_history_events: u32::try_from(check.max_history_events.max(1)).unwrap_or(1),
            timeout_seconds: (timeout_ms / 1000).max(1),
            dry_run: check.dry_run,
        }
    });

    let mut autoscaling = spec
        .autoscaling
        .as_ref()
        .map(|a| autoscale_policy(a, &mut invalid));
    if autoscaling.is_some() && spec.replicas.is_some() {
        invalid.push(
            "spec.replicas and spec.autoscaling cannot both be set: autoscaling decides the replicas of every version".to_owned(),
        );
    }
    // `Shared`: the total is split by role as autoscaling does, from a fixed count.
    let mut replicas = spec.replicas;
    if spec.replicas_mode == ReplicasMode::Shared
        && autoscaling.is_none()
        && let Some(total) = spec.replicas
    {
        let total = u32::try_from(total.max(0)).unwrap_or(0);
        autoscaling = Some(AutoscalePolicy {
            min_replicas: total,
            max_replicas: total,
            target: BacklogTarget::PerReplica(1),
            up_window_ms: 0,
            down_window_ms: 0,
            draining_min: 0,
            draining_max: 0,
            shared_total: true,
        });
        replicas = None;
    }

    if spec.progress_deadline_seconds < 1 {
        invalid.push(format!(
            "spec.progressDeadlineSeconds: must be at least 1, got {}",
            spec.progress_deadline_seconds
        ));
    }

    SpecView {
        generation: meta.generation.unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        namespace: meta.namespace.clone().unwrap_or_default(),
        deleting: meta.deletion_timestamp.is_some(),
        target_deployment_name: versioned_deployment_name(name, &build_id),
        target_build_id: build_id.to_string(),
        strategy: spec.rollout.strategy,
        steps,
        gate_workflow_type: spec.rollout.gate.as_ref().map(|g| g.workflow_type.clone()),
        paused: spec.rollout.paused,
        rollback_window_ms,
        progress_deadline_ms: i64::from(spec.progress_deadline_seconds.max(0)).saturating_mul(1000),
        replicas,
        scaledown_delay_ms,
        delete_delay_ms,
        connection_name: spec.worker_options.connection_ref.name.clone(),
        temporal_namespace: spec.worker_options.temporal_namespace.clone(),
        invalid,
        drain,
        analysis,
        autoscaling,
        adopted_build: adopted_build(twd).cloned(),
        replay_check,
    }
}

/// Converts `spec.autoscaling`; problems are reported and replaced by safe values.
fn autoscale_policy(a: &AutoscalingSpec, invalid: &mut Vec<String>) -> AutoscalePolicy {
    let count = |field: &str, value: i32, low: i32, invalid: &mut Vec<String>| {
        if value < low {
            invalid.push(format!(
                "spec.autoscaling.{field}: must be at least {low}, got {value}"
            ));
        }
        u32::try_from(value.max(low)).unwrap_or(1)
    };
    let min_replicas = count("minReplicas", a.min_replicas, 1, invalid);
    let max_replicas = count("maxReplicas", a.max_replicas, 1, invalid);
    if min_replicas > max_replicas {
        invalid.push(format!(
            "spec.autoscaling: minReplicas ({min_replicas}) must not be above maxReplicas ({max_replicas})"
        ));
    }
    let draining_min = count("draining.minReplicas", a.draining.min_replicas, 0, invalid);
    let draining_max = count("draining.maxReplicas", a.draining.max_replicas, 1, invalid);
    if draining_min > draining_max {
        invalid.push(format!(
            "spec.autoscaling.draining: minReplicas ({draining_min}) must not be above maxReplicas ({draining_max})"
        ));
    }
    let target = match (a.backlog_per_replica, a.backlog_age_seconds) {
        (Some(per), None) if per >= 1 => BacklogTarget::PerReplica(u64::try_from(per).unwrap_or(1)),
        (None, Some(age)) if age >= 1 => BacklogTarget::AgeMs(i64::from(age) * 1000),
        _ => {
            invalid.push(
                "spec.autoscaling: set exactly one target, backlogPerReplica or backlogAgeSeconds, at least 1".to_owned(),
            );
            BacklogTarget::PerReplica(1)
        }
    };
    let window = |field: &str, text: &str, invalid: &mut Vec<String>| {
        duration_ms(&format!("spec.autoscaling.{field}"), text, invalid).unwrap_or(0)
    };
    AutoscalePolicy {
        min_replicas,
        max_replicas: max_replicas.max(min_replicas),
        target,
        up_window_ms: window("scaleUpWindow", &a.scale_up_window, invalid),
        down_window_ms: window("scaleDownWindow", &a.scale_down_window, invalid),
        draining_min,
        draining_max: draining_max.max(draining_min),
        shared_total: false,
    }
}

/// Converts `spec.rollout.analysis` and the step gates; None when neither is configured.
fn analysis_view(
    analysis: Option<&AnalysisSpec>,
    steps: &[RolloutStep],
    strategy: RolloutStrategy,
    invalid: &mut Vec<String>,
) -> Option<AnalysisView> {
    for (i, step) in steps.iter().enumerate() {
        if let Some(gate) = &step.gate {
            check_gate(gate, &format!("spec.rollout.steps[{i}].gate"), invalid);
        }
    }
    let step_gates: Vec<Option<String>> = steps
        .iter()
        .map(|s| s.gate.as_ref().map(|g| g.workflow_type.clone()))
        .collect();
    if analysis.is_none() && step_gates.iter().all(Option::is_none) {
        return None;
    }
    if strategy != RolloutStrategy::Progressive {
        invalid.push(
            "spec.rollout.analysis: analysis and step gates need the Progressive strategy"
                .to_owned(),
        );
    }
    let mut checks = Vec::new();
    for (i, check) in analysis
        .map(|a| a.checks.as_slice())
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let field = format!("spec.rollout.analysis.checks[{i}]");
        if checks.iter().any(|c: &CheckView| c.name == check.name) {
            invalid.push(format!(
                "{field}.name: check names must be unique ({})",
                check.name
            ));
        }
        let interval_ms =
            duration_ms(&format!("{field}.interval"), &check.interval, invalid).unwrap_or(30_000);
        if interval_ms < 1000 {
            invalid.push(format!("{field}.interval: must be at least 1s"));
        }
        let limit = |name: &str, value: i32, invalid: &mut Vec<String>| {
            u32::try_from(value).unwrap_or_else(|_| {
                invalid.push(format!("{field}.{name}: must not be negative, got {value}"));
                0
            })
        };
        let failure_limit = limit("failureLimit", check.failure_limit, invalid);
        let inconclusive_limit = limit("inconclusiveLimit", check.inconclusive_limit, invalid);
        let provider = match (&check.temporal, &check.prometheus) {
            (Some(t), None) => {
                let percent = |name: &str, v: Option<f64>, invalid: &mut Vec<String>| {
                    if let Some(v) = v
                        && !(0.0..=100.0).contains(&v)
                    {
                        invalid.push(format!(
                            "{field}.temporal.{name}: must be between 0 and 100, got {v}"
                        ));
                    }
                    v
                };
                let max_failure_percent =
                    percent("maxFailurePercent", t.max_failure_percent, invalid);
                let max_increase_over_current = percent(
                    "maxIncreaseOverCurrent",
                    t.max_increase_over_current,
                    invalid,
                );
                if max_failure_percent.is_none() && max_increase_over_current.is_none() {
                    invalid.push(format!(
                        "{field}.temporal: a temporal check needs maxFailurePercent or maxIncreaseOverCurrent"
                    ));
                }
                if t.min_samples < 1 {
                    invalid.push(format!(
                        "{field}.temporal.minSamples: must be at least 1, got {}",
                        t.min_samples
                    ));
                }
                let types = t.workflow_types.clone().unwrap_or_default();
                CheckProvider::Temporal {
                    max_failure_percent,
                    max_increase_over_current,
                    min_samples: u64::try_from(t.min_samples.max(1)).unwrap_or(1),
                    include_types: types.include,
                    exclude_types: types.exclude,
                }
            }
            (None, Some(p)) => {
                if p.max_value.is_none() && p.min_value.is_none() {
                    invalid.push(format!(
                        "{field}.prometheus: a prometheus check needs maxValue or minValue"
                    ));
                }
                if let (Some(min), Some(max)) = (p.min_value, p.max_value)
                    && min > max
                {
                    invalid.push(format!(
                        "{field}.prometheus: minValue ({min}) must not be above maxValue ({max})"
                    ));
                }
                if !(p.address.starts_with("http://") || p.address.starts_with("https://")) {
                    invalid.push(format!(
                        "{field}.prometheus.address: must be an http:// or https:// URL, got {:?}",
                        p.address
                    ));
                }
                for unknown in unknown_placeholders(&p.query) {
                    invalid.push(format!(
                        "{field}.prometheus.query: unknown placeholder {unknown} (known: {})",
                        PROMQL_PLACEHOLDERS.join(", ")
                    ));
                }
                CheckProvider::Prometheus {
                    address: p.address.clone(),
                    query: p.query.clone(),
                    max_value: p.max_value,
                    min_value: p.min_value,
                }
            }
            _ => {
                invalid.push(format!(
                    "{field}: a check needs exactly one provider: temporal or prometheus"
                ));
                continue;
            }
        };
        checks.push(CheckView {
            name: check.name.clone(),
            interval_ms: interval_ms.max(1000),
            failure_limit,
            inconclusive_limit,
            dry_run: check.dry_run,
            provider,
        });
    }
    Some(AnalysisView { checks, step_gates })
}

/// `{{...}}` placeholders of a query that are not in [`PROMQL_PLACEHOLDERS`].
fn unknown_placeholders(query: &str) -> Vec<String> {
    let mut unknown = Vec::new();
    let mut rest = query;
    while let Some(start) = rest.find("{{") {
        let after = &rest[start..];
        let Some(end) = after.find("}}") else {
            break;
        };
        let placeholder = &after[..end + 2];
        if !PROMQL_PLACEHOLDERS.contains(&placeholder) {
            unknown.push(placeholder.to_owned());
        }
        rest = &after[end + 2..];
    }
    unknown
}

/// Converts the steps, reporting percentages outside 1..=99 and unparseable pauses.
fn step_views(steps: &[RolloutStep], invalid: &mut Vec<String>) -> Vec<StepView> {
    steps
        .iter()
        .enumerate()
        .map(|(i, step)| {
            let ramp_percentage = match u8::try_from(step.ramp_percentage) {
                Ok(p) if (1..=99).contains(&p) => p,
                _ => {
                    invalid.push(format!(
                        "spec.rollout.steps[{i}].rampPercentage: must be between 1 and 99, got {}",
                        step.ramp_percentage
                    ));
                    if step.ramp_percentage < 1 { 1 } else { 99 }
                }
            };
            let pause_ms = duration_ms(
                &format!("spec.rollout.steps[{i}].pauseDuration"),
                &step.pause_duration,
                invalid,
            )
            .unwrap_or(0);
            StepView {
                ramp_percentage,
                pause_ms,
            }
        })
        .collect()
}

fn check_progressive_steps(steps: &[StepView], invalid: &mut Vec<String>) {
    if steps.is_empty() {
        invalid.push("spec.rollout.steps: steps are required for Progressive rollout".to_owned());
    }
    for (i, pair) in steps.windows(2).enumerate() {
        if let [previous, step] = pair
            && step.ramp_percentage <= previous.ramp_percentage
        {
            invalid.push(format!(
                "spec.rollout.steps[{}].rampPercentage: rampPercentage must increase between each step ({} after {})",
                i + 1,
                step.ramp_percentage,
                previous.ramp_percentage
            ));
        }
    }
}

fn check_gate(gate: &GateSpec, field: &str, invalid: &mut Vec<String>) {
    if gate.input.is_some() && gate.input_from.is_some() {
        invalid.push(format!(
            "{field}: only one of input or inputFrom may be set"
        ));
    }
    if let Some(input) = &gate.input
        && !input.is_object()
    {
        invalid.push(format!("{field}.input: must be a JSON object"));
    }
    if let Some(from) = &gate.input_from
        && from.config_map_key_ref.is_some() == from.secret_key_ref.is_some()
    {
        invalid.push(format!(
            "{field}.inputFrom: exactly one of configMapKeyRef or secretKeyRef must be set"
        ));
    }
}

/// Converts `spec.sunset.drain`. Any problem is reported and turns the whole policy off, so a
/// typo never signals, cancels or terminates workflows other than as the user meant.
fn drain_policy(drain: &DrainSpec, invalid: &mut Vec<String>) -> Option<DrainPolicy> {
    let problems_before = invalid.len();
    let mut delay = |field: &str, text: &Option<String>| {
        text.as_deref()
            .and_then(|text| duration_ms(&format!("spec.sunset.drain.{field}"), text, invalid))
    };
    let signal_after_ms = delay("signalAfter", &drain.signal_after);
    let cancel_after_ms = delay("cancelAfter", &drain.cancel_after);
    let terminate_after_ms = delay("terminateAfter", &drain.terminate_after);

    if drain.signal_after.is_none()
        && drain.cancel_after.is_none()
        && drain.terminate_after.is_none()
        && drain.move_to_current.is_none()
    {
        invalid.push(
            "spec.sunset.drain: drain must set at least one of signalAfter, cancelAfter, terminateAfter or moveToCurrent"
                .to_owned(),
        );
    }
    let ordered = [
        ("signalAfter", signal_after_ms),
        ("cancelAfter", cancel_after_ms),
        ("terminateAfter", terminate_after_ms),
    ];
    for (i, (later, later_ms)) in ordered.iter().enumerate() {
        for (earlier, earlier_ms) in &ordered[..i] {
            if let (Some(later_ms), Some(earlier_ms)) = (later_ms, earlier_ms)
                && later_ms < earlier_ms
            {
                invalid.push(format!(
                    "spec.sunset.drain.{later}: {later} must not be shorter than {earlier}"
                ));
            }
        }
    }
    if drain.signal_name.is_empty() {
        invalid.push("spec.sunset.drain.signalName: must not be empty".to_owned());
    }
    let rate = match u32::try_from(drain.rate) {
        Ok(rate) if (1..=MAX_DRAIN_RATE).contains(&drain.rate) => rate,
        _ => {
            invalid.push(format!(
                "spec.sunset.drain.rate: must be between 1 and {MAX_DRAIN_RATE}, got {}",
                drain.rate
            ));
            1
        }
    };
    let types = drain.workflow_types.clone().unwrap_or_default();
    if let Some(both) = types.include.iter().find(|t| types.exclude.contains(t)) {
        invalid.push(format!(
            "spec.sunset.drain.workflowTypes: a workflow type cannot be both included and excluded ({both})"
        ));
    }
    let move_to_current = drain
        .move_to_current
        .as_ref()
        .map(|m| m.build_ids.clone())
        .unwrap_or_default();
    if drain.move_to_current.is_some() && move_to_current.is_empty() {
        invalid.push(
            "spec.sunset.drain.moveToCurrent.buildIDs: must list at least one build ID".to_owned(),
        );
    }

    (invalid.len() == problems_before).then(|| DrainPolicy {
        signal_after_ms,
        signal_name: drain.signal_name.clone(),
        cancel_after_ms,
        terminate_after_ms,
        include_types: types.include,
        exclude_types: types.exclude,
        rate,
        dry_run: drain.dry_run,
        move_to_current,
    })
}

/// Parses a Go-style duration into milliseconds (saturating), reporting it when it does not parse.
fn duration_ms(field: &str, text: &str, invalid: &mut Vec<String>) -> Option<i64> {
    match parse_duration(text) {
        Ok(duration) => Some(millis(duration)),
        Err(err) => {
            invalid.push(format!("{field}: {err}"));
            None
        }
    }
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ConfigMapKeySelector, SecretKeySelector};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;
    use twc_crds::worker_deployment::GateInputSource;
    use twc_crds::worker_deployment::test_support::spec_with_image;

    use super::*;

    fn twd(edit: impl FnOnce(&mut TemporalWorkerDeployment)) -> TemporalWorkerDeployment {
        let mut twd = TemporalWorkerDeployment::new("hello", spec_with_image("worker:v1"));
        twd.metadata.namespace = Some("demo".into());
        twd.metadata.uid = Some("uid-1".into());
        twd.metadata.generation = Some(7);
        edit(&mut twd);
        twd
    }

    fn step(ramp: i32, pause: &str) -> RolloutStep {
        RolloutStep {
            ramp_percentage: ramp,
            pause_duration: pause.into(),
            gate: None,
        }
    }

    fn progressive(steps: Vec<RolloutStep>) -> impl FnOnce(&mut TemporalWorkerDeployment) {
        move |t| {
            t.spec.rollout.strategy = RolloutStrategy::Progressive;
            t.spec.rollout.steps = Some(steps);
        }
    }

    fn gate(
        input: Option<serde_json::Value>,
        from: Option<GateInputSource>,
    ) -> impl FnOnce(&mut TemporalWorkerDeployment) {
        move |t| {
            t.spec.rollout.gate = Some(GateSpec {
                workflow_type: "Smoke".into(),
                input,
                input_from: from,
            });
        }
    }

    fn config_map_source() -> GateInputSource {
        GateInputSource {
            config_map_key_ref: Some(ConfigMapKeySelector {
                name: "cm".into(),
                key: "k".into(),
                optional: None,
            }),
            secret_key_ref: None,
        }
    }

    #[test]
    fn a_valid_spec_fills_every_field() {
        let twd = twd(|t| {
            t.spec.replicas = Some(3);
            t.spec.progress_deadline_seconds = 120;
            t.spec.rollout.paused = true;
            t.spec.rollout.rollback_window = "30m".into();
            t.spec.sunset.scaledown_delay = "2h".into();
            t.spec.sunset.delete_delay = "1h30m".into();
            t.spec.worker_options.temporal_namespace = "orders".into();
            t.spec.rollout.gate = Some(GateSpec {
                workflow_type: "Smoke".into(),
                input: None,
                input_from: None,
            });
        });
        let view = spec_view(&twd);
        let build = twc_crds::build_id::compute_build_id(&twd.spec);

        assert_eq!(view.invalid, Vec::<String>::new());
        assert_eq!(view.generation, 7);
        assert_eq!(view.uid, "uid-1");
        assert_eq!(view.namespace, "demo");
        assert!(!view.deleting);
        assert_eq!(view.target_build_id, build.as_str());
        assert_eq!(
            view.target_deployment_name,
            versioned_deployment_name("hello", &build)
        );
        assert_eq!(view.strategy, RolloutStrategy::AllAtOnce);
        assert_eq!(view.gate_workflow_type.as_deref(), Some("Smoke"));
        assert!(view.paused);
        assert_eq!(view.rollback_window_ms, 30 * 60 * 1000);
        assert_eq!(view.progress_deadline_ms, 120_000);
        assert_eq!(view.replicas, Some(3));
        assert_eq!(view.scaledown_delay_ms, 2 * 3600 * 1000);
        assert_eq!(view.delete_delay_ms, 90 * 60 * 1000);
        assert_eq!(view.connection_name, "dev");
        assert_eq!(view.temporal_namespace, "orders");
    }

    #[test]
    fn deletion_timestamp_marks_the_view_deleting() {
        let twd = twd(|t| t.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH)));
        assert!(spec_view(&twd).deleting);
    }

    #[test]
    fn progressive_steps_carry_their_pauses_in_milliseconds() {
        let view = spec_view(&twd(progressive(vec![
            step(25, "5s"),
            step(50, "1m30s"),
            step(75, "1h"),
        ])));
        assert_eq!(view.invalid, Vec::<String>::new());
        assert_eq!(
            view.steps,
            vec![
                StepView {
                    ramp_percentage: 25,
                    pause_ms: 5_000
                },
                StepView {
                    ramp_percentage: 50,
                    pause_ms: 90_000
                },
                StepView {
                    ramp_percentage: 75,
                    pause_ms: 3_600_000
                },
            ]
        );
    }

    #[test]
    fn invalid_specs_are_reported_with_the_offending_field() {
        let cases: Vec<(&str, TemporalWorkerDeployment, &[&str])> = vec![
            (
                "equal ramps",
                twd(progressive(vec![step(10, "1s"), step(10, "1s")])),
                &[
                    "spec.rollout.steps[1].rampPercentage: rampPercentage must increase between each step",
                ],
            ),
            (
                "decreasing ramps name every offending step",
                twd(progressive(vec![
                    step(50, "1s"),
                    step(20, "1s"),
                    step(30, "1s"),
                    step(25, "1s"),
                ])),
                &[
                    "spec.rollout.steps[1].rampPercentage: rampPercentage must increase between each step",
                    "spec.rollout.steps[3].rampPercentage: rampPercentage must increase between each step",
                ],
            ),
            (
                "progressive without steps",
                twd(progressive(vec![])),
                &["steps are required for Progressive rollout"],
            ),
            (
                "input and inputFrom",
                twd(gate(Some(json!({"a": 1})), Some(config_map_source()))),
                &["only one of input or inputFrom may be set"],
            ),
            (
                "input is an array",
                twd(gate(Some(json!([1, 2])), None)),
                &["spec.rollout.gate.input: must be a JSON object"],
            ),
            (
                "input is a string",
                twd(gate(Some(json!("x")), None)),
                &["spec.rollout.gate.input: must be a JSON object"],
            ),
            (
                "inputFrom with both refs",
                twd(gate(
                    None,
                    Some(GateInputSource {
                        secret_key_ref: Some(SecretKeySelector {
                            name: "s".into(),
                            key: "k".into(),
                            optional: None,
                        }),
                        ..config_map_source()
                    }),
                )),
                &["exactly one of configMapKeyRef or secretKeyRef must be set"],
            ),
            (
                "unparseable pause",
                twd(progressive(vec![step(10, "5 minutes")])),
                &["spec.rollout.steps[0].pauseDuration: invalid duration"],
            ),
            (
                "unparseable rollback window",
                twd(|t| t.spec.rollout.rollback_window = "1d".into()),
                &["spec.rollout.rollbackWindow: invalid duration"],
            ),
            (
                "unparseable sunset delays",
                twd(|t| {
                    t.spec.sunset.scaledown_delay = "soon".into();
                    t.spec.sunset.delete_delay = "".into();
                }),
                &[
                    "spec.sunset.scaledownDelay: invalid duration",
                    "spec.sunset.deleteDelay: invalid duration",
                ],
            ),
            (
                "ramp out of range",
                twd(progressive(vec![step(0, "1s"), step(300, "1s")])),
                &[
                    "spec.rollout.steps[0].rampPercentage: must be between 1 and 99",
                    "spec.rollout.steps[1].rampPercentage: must be between 1 and 99",
                ],
            ),
            (
                "zero progress deadline",
                twd(|t| t.spec.progress_deadline_seconds = 0),
                &["spec.progressDeadlineSeconds: must be at least 1"],
            ),
        ];
        for (name, twd, expected) in cases {
            let invalid = spec_view(&twd).invalid;
            assert_eq!(invalid.len(), expected.len(), "{name}: {invalid:?}");
            for (message, fragment) in invalid.iter().zip(expected) {
                assert!(
                    message.contains(fragment),
                    "{name}: {message:?} should contain {fragment:?}"
                );
            }
        }
    }

    #[test]
    fn steps_of_other_strategies_need_not_increase() {
        let view = spec_view(&twd(|t| {
            progressive(vec![step(50, "1s"), step(10, "1s")])(t);
            t.spec.rollout.strategy = RolloutStrategy::AllAtOnce;
        }));
        assert_eq!(view.invalid, Vec::<String>::new());
    }

    #[test]
    fn a_json_object_gate_input_is_valid() {
        assert_eq!(
            spec_view(&twd(gate(Some(json!({"orders": 3})), None))).invalid,
            Vec::<String>::new()
        );
        assert_eq!(
            spec_view(&twd(gate(None, Some(config_map_source())))).invalid,
            Vec::<String>::new()
        );
    }

    #[test]
    fn unusable_values_fall_back_to_safe_ones() {
        let view = spec_view(&twd(|t| {
            progressive(vec![step(10, "nope")])(t);
            t.spec.rollout.rollback_window = "nope".into();
            t.spec.sunset.scaledown_delay = "nope".into();
            t.spec.sunset.delete_delay = "nope".into();
        }));
        assert_eq!(
            view.steps,
            vec![StepView {
                ramp_percentage: 10,
                pause_ms: 0
            }]
        );
        assert_eq!(view.rollback_window_ms, 0, "rollback disabled");
        assert_eq!(view.scaledown_delay_ms, FALLBACK_SCALEDOWN_DELAY_MS);
        assert_eq!(view.delete_delay_ms, FALLBACK_DELETE_DELAY_MS);
    }

    #[test]
    fn a_zero_rollback_window_disables_rollback_without_error() {
        let view = spec_view(&twd(|t| t.spec.rollout.rollback_window = "0s".into()));
        assert_eq!(view.rollback_window_ms, 0);
        assert!(view.invalid.is_empty());
    }

    /// A TWD whose `spec.sunset.drain` is `drain` as a user would write it (serde defaults apply).
    fn with_drain(drain: serde_json::Value) -> TemporalWorkerDeployment {
        twd(|t| t.spec.sunset.drain = Some(serde_json::from_value(drain).expect("drain manifest")))
    }

    fn policy(edit: impl FnOnce(&mut DrainPolicy)) -> DrainPolicy {
        let mut policy = DrainPolicy {
            signal_name: "twc-drain".into(),
            rate: 50,
            ..DrainPolicy::default()
        };
        edit(&mut policy);
        policy
    }

    #[test]
    fn no_drain_policy_means_no_drain() {
        let view = spec_view(&twd(|_| {}));
        assert_eq!(view.drain, None);
        assert!(view.invalid.is_empty());
    }

    #[test]
    fn drain_policy_converts_durations_to_milliseconds_and_keeps_defaults() {
        let cases: Vec<(&str, serde_json::Value, DrainPolicy)> = vec![
            (
                "signal only, defaults for name and rate",
                json!({ "signalAfter": "1h" }),
                policy(|p| p.signal_after_ms = Some(3_600_000)),
            ),
            (
                "signal, cancel and terminate",
                json!({ "signalAfter": "30m", "cancelAfter": "1h30m", "terminateAfter": "1.5h" }),
                policy(|p| {
                    p.signal_after_ms = Some(1_800_000);
                    p.cancel_after_ms = Some(5_400_000);
                    p.terminate_after_ms = Some(5_400_000);
                }),
            ),
            (
                "zero delays are allowed",
                json!({ "signalAfter": "0s", "cancelAfter": "0s" }),
                policy(|p| {
                    p.signal_after_ms = Some(0);
                    p.cancel_after_ms = Some(0);
                }),
            ),
            (
                "cancel without a signal",
                json!({ "cancelAfter": "10m" }),
                policy(|p| p.cancel_after_ms = Some(600_000)),
            ),
            (
                "every option",
                json!({
                    "signalAfter": "5s",
                    "signalName": "please-continue-as-new",
                    "terminateAfter": "1m",
                    "workflowTypes": { "include": ["Subscription", "Saga"], "exclude": ["Billing"] },
                    "rate": 1000,
                    "dryRun": true,
                    "moveToCurrent": { "buildIDs": ["v1-0123456789"] },
                }),
                policy(|p| {
                    p.signal_after_ms = Some(5_000);
                    p.signal_name = "please-continue-as-new".into();
                    p.terminate_after_ms = Some(60_000);
                    p.include_types = vec!["Subscription".into(), "Saga".into()];
                    p.exclude_types = vec!["Billing".into()];
                    p.rate = 1000;
                    p.dry_run = true;
                    p.move_to_current = vec!["v1-0123456789".into()];
                }),
            ),
            (
                "moveToCurrent alone",
                json!({ "moveToCurrent": { "buildIDs": ["v1-a", "v2-b"] } }),
                policy(|p| p.move_to_current = vec!["v1-a".into(), "v2-b".into()]),
            ),
        ];
        for (name, drain, expected) in cases {
            let view = spec_view(&with_drain(drain));
            assert_eq!(view.invalid, Vec::<String>::new(), "{name}");
            assert_eq!(view.drain, Some(expected), "{name}");
        }
    }

    #[test]
    fn an_invalid_drain_policy_is_reported_and_turned_off() {
        let cases: Vec<(&str, serde_json::Value, &[&str])> = vec![
            (
                "empty drain",
                json!({}),
                &[
                    "spec.sunset.drain: drain must set at least one of signalAfter, cancelAfter, terminateAfter or moveToCurrent",
                ],
            ),
            (
                "only options, no action",
                json!({ "dryRun": true, "rate": 5 }),
                &["drain must set at least one of"],
            ),
            (
                "unparseable signalAfter",
                json!({ "signalAfter": "soon" }),
                &["spec.sunset.drain.signalAfter: invalid duration \"soon\""],
            ),
            (
                "negative cancelAfter",
                json!({ "cancelAfter": "-1s" }),
                &["spec.sunset.drain.cancelAfter: invalid duration \"-1s\""],
            ),
            (
                "out of range terminateAfter",
                json!({ "terminateAfter": "9999999999999h" }),
                &["spec.sunset.drain.terminateAfter: invalid duration"],
            ),
            (
                "cancel before the signal",
                json!({ "signalAfter": "2h", "cancelAfter": "1h30m" }),
                &[
                    "spec.sunset.drain.cancelAfter: cancelAfter must not be shorter than signalAfter",
                ],
            ),
            (
                "terminate before cancel and signal",
                json!({ "signalAfter": "1h", "cancelAfter": "2h", "terminateAfter": "30m" }),
                &[
                    "spec.sunset.drain.terminateAfter: terminateAfter must not be shorter than signalAfter",
                    "spec.sunset.drain.terminateAfter: terminateAfter must not be shorter than cancelAfter",
                ],
            ),
            (
                "rate 0",
                json!({ "signalAfter": "1h", "rate": 0 }),
                &["spec.sunset.drain.rate: must be between 1 and 1000, got 0"],
            ),
            (
                "rate above the maximum",
                json!({ "signalAfter": "1h", "rate": 5000 }),
                &["spec.sunset.drain.rate: must be between 1 and 1000, got 5000"],
            ),
            (
                "empty signal name",
                json!({ "signalAfter": "1h", "signalName": "" }),
                &["spec.sunset.drain.signalName: must not be empty"],
            ),
            (
                "a type both included and excluded",
                json!({ "signalAfter": "1h", "workflowTypes": { "include": ["A", "B"], "exclude": ["B"] } }),
                &[
                    "spec.sunset.drain.workflowTypes: a workflow type cannot be both included and excluded (B)",
                ],
            ),
            (
                "moveToCurrent without builds",
                json!({ "moveToCurrent": { "buildIDs": [] } }),
                &["spec.sunset.drain.moveToCurrent.buildIDs: must list at least one build ID"],
            ),
        ];
        for (name, drain, expected) in cases {
            let view = spec_view(&with_drain(drain));
            assert_eq!(view.drain, None, "{name}: an invalid policy must not act");
            assert_eq!(
                view.invalid.len(),
                expected.len(),
                "{name}: {:?}",
                view.invalid
            );
            for (message, fragment) in view.invalid.iter().zip(expected) {
                assert!(
                    message.contains(fragment),
                    "{name}: {message:?} should contain {fragment:?}"
                );
            }
        }
    }

    #[test]
    fn out_of_range_durations_are_reported_instead_of_panicking() {
        let view = spec_view(&twd(|t| {
            t.spec.sunset.delete_delay = "9999999999999h".into()
        }));
        assert_eq!(view.delete_delay_ms, FALLBACK_DELETE_DELAY_MS);
        assert_eq!(view.invalid.len(), 1, "{:?}", view.invalid);
    }
}
