//! What one reconcile of a WorkerResourceTemplate does, decided from what was read (reference
//! §3.17): which copies to apply, keep or delete, and the status that describes the result. Pure
//! functions over plain data, `now` passed in; [`super::controller`] reads and executes.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use twc_crds::WorkerResourceTemplate;
use twc_crds::resource_template::render::{self, Owner, Rendered, VersionFacts, WorkerFacts};
use twc_crds::resource_template::{
    TemplateReason, TemplateVersionStatus, WorkerResourceTemplateStatus,
};

/// The worker deployment a template references, as the claim holder of its name shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerView {
    /// `<Kind> <name>`, for messages.
    pub describe: String,
    /// Its name.
    pub name: String,
    /// Temporal namespace its workers poll.
    pub temporal_namespace: String,
    /// Whether it has `spec.autoscaling` (twc scales each version itself).
    pub autoscaling: bool,
}

/// A version with a Deployment that is not being deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveVersion {
    /// Its build ID.
    pub build_id: String,
    /// Its Deployment's name.
    pub deployment_name: String,
    /// Its Deployment's `spec.selector.matchLabels`.
    pub selector: BTreeMap<String, String>,
}

/// A copy that exists (or may), by name and kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyRef {
    /// Its name.
    pub name: String,
    /// Its `apiVersion`.
    pub api_version: String,
    /// Its `kind`.
    pub kind: String,
}

/// What to do about one version (or one former version).
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Apply this copy: new, changed, last attempt failed, or due for the periodic full apply.
    /// `replaces` is a copy of another kind under the same name, to delete first.
    Apply {
        /// The version.
        build_id: String,
        /// The copy.
        copy: Rendered,
        /// A copy of the kind the template rendered before.
        replaces: Option<CopyRef>,
    },
    /// The last copy applied is the one rendered now: nothing to do.
    Keep {
        /// Its status entry, with the template's generation.
        entry: TemplateVersionStatus,
    },
    /// The template cannot be rendered for this version.
    Unrenderable {
        /// The version.
        build_id: String,
        /// The copy's name.
        name: String,
        /// Why.
        error: String,
    },
    /// Delete the copy: its version has no live Deployment, or the template may not apply.
    Delete {
        /// The version.
        build_id: String,
        /// The copy.
        copy: CopyRef,
    },
}

/// Why nothing is applied (the `Ready` condition's reason and message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    /// The reason.
    pub reason: TemplateReason,
    /// What is wrong and what to do.
    pub message: String,
}

/// One reconcile's decisions.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Per version, in build ID order.
    pub steps: Vec<Step>,
    /// Set when the template applies nothing.
    pub blocked: Option<Blocked>,
}

/// What the plan is made from.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// The template.
    pub template: &'a WorkerResourceTemplate,
    /// Its worker deployment, when one of either kind exists.
    pub worker: Option<&'a WorkerView>,
    /// The worker's versions with a live Deployment.
    pub versions: &'a [LiveVersion],
    /// Why the template's kind may not be rendered, if it may not.
    pub kind_refused: Option<&'a str>,
    /// Apply every copy even when its hash says it is unchanged (the periodic full apply that
    /// repairs copies edited or deleted by hand).
    pub full: bool,
}

/// The steps of one reconcile: a copy per live version (unless blocked), a deletion per copy
/// whose version has no live Deployment, or of every copy when the worker deployment's
/// `spec.autoscaling` wins over a scaler template.
pub fn plan(inputs: Inputs<'_>) -> Plan {
    let template = inputs.template;
    let namespace = template.metadata.namespace.as_deref().unwrap_or_default();
    let previous = entries_by_build(template);
    let worker_name = template.spec.worker_name().unwrap_or_default();
    let blocked = match inputs.worker {
        None => Some(Blocked {
            reason: TemplateReason::WorkerDeploymentNotFound,
            message: format!(
                "no WorkerDeployment (or TemporalWorkerDeployment) {worker_name:?} in namespace {namespace}"
            ),
        }),
        Some(worker)
            if worker.autoscaling && render::scales_deployment(&template.spec.template) =>
        {
            Some(Blocked {
                reason: TemplateReason::ConflictsWithAutoscaling,
                message: format!(
                    "{} has spec.autoscaling, which scales each version's Deployment and wins over spec.template.spec.scaleTargetRef: no copy is applied (and earlier ones are deleted) until spec.autoscaling is removed",
                    worker.describe
                ),
            })
        }
        Some(_) => inputs.kind_refused.map(|message| Blocked {
            reason: TemplateReason::KindNotAllowed,
            message: message.to_owned(),
        }),
    };
    let live: BTreeMap<&str, &LiveVersion> = inputs
        .versions
        .iter()
        .map(|v| (v.build_id.as_str(), v))
        .collect();
    let mut steps = Vec::new();
    // A conflict with spec.autoscaling takes every scaler copy away; a refused kind leaves the
    // copies of live versions alone (the controller may have lost the right to touch them).
    let delete_all = blocked
        .as_ref()
        .is_some_and(|b| b.reason == TemplateReason::ConflictsWithAutoscaling);
    if let (None, Some(worker)) = (&blocked, inputs.worker) {
        for version in live.values() {
            steps.push(version_step(
                inputs,
                worker,
                version,
                previous.get(version.build_id.as_str()).copied(),
            ));
        }
    } else if !delete_all {
        for version in live.values() {
            if let Some(entry) = previous.get(version.build_id.as_str()) {
                steps.push(Step::Keep {
                    entry: (*entry).clone(),
                });
            }
        }
    }
    for (build_id, entry) in &previous {
        if delete_all || !live.contains_key(build_id) {
            steps.push(Step::Delete {
                build_id: (*build_id).to_owned(),
                copy: copy_of(entry, template),
            });
        }
    }
    steps.sort_by(|a, b| build_of(a).cmp(build_of(b)));
    Plan { steps, blocked }
}

/// The template's status entries by build ID.
pub fn entries_by_build(
    template: &WorkerResourceTemplate,
) -> BTreeMap<&str, &TemplateVersionStatus> {
    template
        .status
        .iter()
        .flat_map(|s| &s.versions)
        .map(|e| (e.build_id.as_str(), e))
        .collect()
}

fn version_step(
    inputs: Inputs<'_>,
    worker: &WorkerView,
    version: &LiveVersion,
    previous: Option<&TemplateVersionStatus>,
) -> Step {
    let template = inputs.template;
    let namespace = template.metadata.namespace.as_deref().unwrap_or_default();
    let owner = Owner {
        name: template.metadata.name.as_deref().unwrap_or_default(),
        uid: template.metadata.uid.as_deref().unwrap_or_default(),
    };
    let facts = WorkerFacts {
        namespace,
        name: &worker.name,
        temporal_namespace: &worker.temporal_namespace,
    };
    let version_facts = VersionFacts {
        build_id: &version.build_id,
        deployment_name: &version.deployment_name,
        selector: &version.selector,
    };
    let copy = match render::render(&template.spec.template, owner, facts, version_facts) {
        Ok(copy) => copy,
        Err(error) => {
            return Step::Unrenderable {
                build_id: version.build_id.clone(),
                name: render::copy_name(&worker.name, owner.name, &version.build_id),
                error: error.to_string(),
            };
        }
    };
    let replaces = previous
        .map(|entry| copy_of(entry, template))
        .filter(|old| old.name == copy.name && group_kind(old) != group_kind_of(&copy));
    let unchanged = previous.is_some_and(|entry| {
        entry.apply_error.is_none()
            && entry.last_applied_hash.as_deref() == Some(copy.hash.as_str())
            && entry.resource_name == copy.name
    });
    if unchanged && replaces.is_none() && !inputs.full {
        let mut entry = previous.cloned().unwrap_or_default();
        entry.last_applied_generation = template.metadata.generation.unwrap_or_default();
        return Step::Keep { entry };
    }
    Step::Apply {
        build_id: version.build_id.clone(),
        copy,
        replaces,
    }
}

/// The copy a status entry describes (of the template's current kind when the entry does not
/// say).
fn copy_of(entry: &TemplateVersionStatus, template: &WorkerResourceTemplate) -> CopyRef {
    CopyRef {
        name: entry.resource_name.clone(),
        api_version: entry
            .api_version
            .clone()
            .or_else(|| template.spec.template_api_version().map(str::to_owned))
            .unwrap_or_default(),
        kind: entry
            .kind
            .clone()
            .or_else(|| template.spec.template_kind().map(str::to_owned))
            .unwrap_or_default(),
    }
}

/// `(group, kind)` of a copy: one resource whatever its version.
fn group_kind(copy: &CopyRef) -> (&str, &str) {
    (group_of(&copy.api_version), &copy.kind)
}

fn group_kind_of(copy: &Rendered) -> (&str, &str) {
    (group_of(&copy.api_version), &copy.kind)
}

fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(group, _)| group)
}

fn build_of(step: &Step) -> &str {
    match step {
        Step::Apply { build_id, .. }
        | Step::Unrenderable { build_id, .. }
        | Step::Delete { build_id, .. } => build_id,
        Step::Keep { entry } => &entry.build_id,
    }
}

/// The entry of a copy applied now.
pub fn applied_entry(
    build_id: &str,
    copy: &Rendered,
    generation: i64,
    previous: Option<&TemplateVersionStatus>,
    now: &Time,
) -> TemplateVersionStatus {
    stamped(
        TemplateVersionStatus {
            build_id: build_id.to_owned(),
            resource_name: copy.name.clone(),
            last_applied_generation: generation,
            apply_error: None,
            last_applied_hash: Some(copy.hash.clone()),
            last_transition_time: None,
            api_version: Some(copy.api_version.clone()),
            kind: Some(copy.kind.clone()),
        },
        previous,
        now,
    )
}

/// The entry of a copy that could not be rendered, applied or deleted: never applied (as far as
/// the hash goes), with the error.
pub fn failed_entry(
    build_id: &str,
    copy: Option<&CopyRef>,
    name: &str,
    error: &str,
    previous: Option<&TemplateVersionStatus>,
    now: &Time,
) -> TemplateVersionStatus {
    stamped(
        TemplateVersionStatus {
            build_id: build_id.to_owned(),
            resource_name: name.to_owned(),
            last_applied_generation: 0,
            apply_error: Some(error.to_owned()),
            last_applied_hash: None,
            last_transition_time: None,
            api_version: copy.map(|c| c.api_version.clone()),
            kind: copy.map(|c| c.kind.clone()),
        },
        previous,
        now,
    )
}

/// `entry` with the previous entry's transition time when nothing but the time changed.
fn stamped(
    mut entry: TemplateVersionStatus,
    previous: Option<&TemplateVersionStatus>,
    now: &Time,
) -> TemplateVersionStatus {
    let same = previous.is_some_and(|p| {
        let mut p = p.clone();
        p.last_transition_time = None;
        p == entry
    });
    entry.last_transition_time = match (same, previous) {
        (true, Some(p)) => p.last_transition_time.clone(),
        _ => Some(now.clone()),
    };
    entry
}

/// The status after a reconcile: `entries` sorted by build ID, `Ready` from `blocked` or the
/// first failed entry, the transition time kept while `Ready` does not change.
pub fn status(
    previous: Option<&WorkerResourceTemplateStatus>,
    generation: i64,
    mut entries: Vec<TemplateVersionStatus>,
    blocked: Option<&Blocked>,
    now: &Time,
) -> WorkerResourceTemplateStatus {
    entries.sort_by(|a, b| a.build_id.cmp(&b.build_id));
    let failed = entries
        .iter()
        .find_map(|e| e.apply_error.as_ref().map(|error| (e, error)));
    let (reason, message) = match (blocked, failed) {
        (Some(blocked), _) => (blocked.reason, blocked.message.clone()),
        (None, Some((entry, error))) => (
            TemplateReason::ApplyFailed,
            format!("version {}: {error}", entry.build_id),
        ),
        (None, None) if entries.is_empty() => (
            TemplateReason::AllVersionsApplied,
            "no version has a Deployment yet".to_owned(),
        ),
        (None, None) => (
            TemplateReason::AllVersionsApplied,
            format!(
                "applied to {} version{}: {}",
                entries.len(),
                if entries.len() == 1 { "" } else { "s" },
                entries
                    .iter()
                    .map(|e| e.build_id.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
    };
    let mut ready = Condition {
        type_: "Ready".to_owned(),
        status: if reason.ready() { "True" } else { "False" }.to_owned(),
        reason: reason.as_str().to_owned(),
        message,
        observed_generation: Some(generation),
        last_transition_time: now.clone(),
    };
    if let Some(old) = previous
        .into_iter()
        .flat_map(|s| &s.conditions)
        .find(|c| c.type_ == ready.type_ && c.status == ready.status)
    {
        ready.last_transition_time = old.last_transition_time.clone();
    }
    WorkerResourceTemplateStatus {
        versions: entries,
        conditions: vec![ready],
        observed_generation: Some(generation),
    }
}

/// Whether writing `desired` over `current` changes more than timestamps.
pub fn status_changed(
    current: Option<&WorkerResourceTemplateStatus>,
    desired: &WorkerResourceTemplateStatus,
) -> bool {
    let normalize = |status: &WorkerResourceTemplateStatus| {
        let mut status = status.clone();
        for condition in &mut status.conditions {
            condition.last_transition_time = Time(Timestamp::UNIX_EPOCH);
        }
        for entry in &mut status.versions {
            entry.last_transition_time = None;
        }
        status
    };
    current.map(normalize) != Some(normalize(desired))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use serde_json::json;
    use twc_crds::WorkerResourceTemplateSpec;

    use super::*;

    fn template(
        spec: serde_json::Value,
        versions: Vec<TemplateVersionStatus>,
    ) -> WorkerResourceTemplate {
        let spec: WorkerResourceTemplateSpec = serde_json::from_value(json!({
            "workerDeploymentRef": { "name": "hello" },
            "template": spec,
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        WorkerResourceTemplate {
            metadata: ObjectMeta {
                name: Some("scaler".into()),
                namespace: Some("demo".into()),
                uid: Some("uid-1".into()),
                generation: Some(3),
                ..Default::default()
            },
            spec,
            status: Some(WorkerResourceTemplateStatus {
                versions,
                ..Default::default()
            }),
        }
    }

    fn hpa() -> serde_json::Value {
        json!({ "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                "spec": { "scaleTargetRef": {}, "minReplicas": 1, "maxReplicas": 3 } })
    }

    fn pdb() -> serde_json::Value {
        json!({ "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "spec": { "minAvailable": 1, "selector": { "matchLabels": {} } } })
    }

    fn worker(autoscaling: bool) -> WorkerView {
        WorkerView {
            describe: "WorkerDeployment hello".into(),
            name: "hello".into(),
            temporal_namespace: "default".into(),
            autoscaling,
        }
    }

    fn live(build: &str) -> LiveVersion {
        LiveVersion {
            build_id: build.into(),
            deployment_name: format!("hello-{build}"),
            selector: BTreeMap::from([("temporal.io/build-id".to_owned(), build.to_owned())]),
        }
    }

    /// The status entry of `build`'s copy as rendered from `spec`, applied.
    fn applied(spec: &serde_json::Value, build: &str) -> TemplateVersionStatus {
        let t = template(spec.clone(), vec![]);
        let w = worker(false);
        let version = live(build);
        match version_step(
            Inputs {
                template: &t,
                worker: Some(&w),
                versions: &[],
                kind_refused: None,
                full: false,
            },
            &w,
            &version,
            None,
        ) {
            Step::Apply { copy, .. } => {
                applied_entry(build, &copy, 2, None, &Time(Timestamp::UNIX_EPOCH))
            }
            other => panic!("{other:?}"),
        }
    }

    /// A plan summarized as (step kind, build ID) pairs.
    fn summary(plan: &Plan) -> Vec<(&'static str, String)> {
        plan.steps
            .iter()
            .map(|s| match s {
                Step::Apply {
                    build_id, replaces, ..
                } => (
                    if replaces.is_some() {
                        "replace"
                    } else {
                        "apply"
                    },
                    build_id.clone(),
                ),
                Step::Keep { entry } => ("keep", entry.build_id.clone()),
                Step::Unrenderable { build_id, .. } => ("unrenderable", build_id.clone()),
                Step::Delete { build_id, .. } => ("delete", build_id.clone()),
            })
            .collect()
    }

    /// One row of the planning table.
    struct Case {
        what: &'static str,
        template: serde_json::Value,
        /// The template's status entries.
        entries: Vec<TemplateVersionStatus>,
        worker: Option<WorkerView>,
        /// Build IDs with a live Deployment.
        live: Vec<&'static str>,
        kind_refused: Option<&'static str>,
        full: bool,
        /// (step, build ID) in order.
        steps: Vec<(&'static str, &'static str)>,
        blocked: Option<TemplateReason>,
    }

    impl Case {
        /// A scaler template, a worker without autoscaling, its kind allowed, no full apply.
        fn new(what: &'static str) -> Self {
            Self {
                what,
                template: hpa(),
                entries: vec![],
                worker: Some(worker(false)),
                live: vec![],
                kind_refused: None,
                full: false,
                steps: vec![],
                blocked: None,
            }
        }
    }

    #[test]
    fn each_live_version_gets_a_copy_and_gone_versions_lose_theirs() {
        let (v1, v2, v3) = (
            applied(&hpa(), "v1"),
            applied(&hpa(), "v2"),
            applied(&pdb(), "v3"),
        );
        let mut stale = applied(&hpa(), "v2");
        stale.last_applied_hash = Some("0000000000000000".into());
        let mut failed = applied(&hpa(), "v2");
        failed.apply_error = Some("forbidden".into());
        let cases = [
            Case {
                live: vec!["v1", "v2"],
                steps: vec![("apply", "v1"), ("apply", "v2")],
                ..Case::new("first copies")
            },
            Case {
                entries: vec![v1.clone(), v2.clone()],
                live: vec!["v1", "v2"],
                steps: vec![("keep", "v1"), ("keep", "v2")],
                ..Case::new("unchanged copies are kept")
            },
            Case {
                entries: vec![v1.clone()],
                live: vec!["v1"],
                full: true,
                steps: vec![("apply", "v1")],
                ..Case::new("the periodic full apply applies them anyway")
            },
            Case {
                entries: vec![stale, failed],
                live: vec!["v2"],
                steps: vec![("apply", "v2")],
                ..Case::new("a changed template, or a failed apply, is applied again")
            },
            Case {
                entries: vec![v1.clone(), v2.clone()],
                live: vec!["v2", "v3"],
                steps: vec![("delete", "v1"), ("keep", "v2"), ("apply", "v3")],
                ..Case::new("a rollout: the new version's copy, the retired one's deleted")
            },
            Case {
                entries: vec![v3],
                live: vec!["v3"],
                steps: vec![("replace", "v3")],
                ..Case::new("a template that changed kind replaces the copy")
            },
            Case {
                entries: vec![v1.clone()],
                worker: None,
                steps: vec![("delete", "v1")],
                blocked: Some(TemplateReason::WorkerDeploymentNotFound),
                ..Case::new(
                    "no worker deployment: copies of gone versions deleted, nothing applied",
                )
            },
            Case {
                entries: vec![v1.clone(), v2.clone()],
                worker: Some(worker(true)),
                live: vec!["v1", "v2"],
                steps: vec![("delete", "v1"), ("delete", "v2")],
                blocked: Some(TemplateReason::ConflictsWithAutoscaling),
                ..Case::new("spec.autoscaling wins over a scaler: every copy deleted")
            },
            Case {
                template: pdb(),
                worker: Some(worker(true)),
                live: vec!["v1"],
                steps: vec![("apply", "v1")],
                ..Case::new("spec.autoscaling leaves a PDB alone")
            },
            Case {
                entries: vec![v1, v2],
                live: vec!["v2"],
                kind_refused: Some("not allowed"),
                steps: vec![("delete", "v1"), ("keep", "v2")],
                blocked: Some(TemplateReason::KindNotAllowed),
                ..Case::new("a kind no longer allowed: live copies left alone, gone ones deleted")
            },
            Case {
                template: json!({ "apiVersion": "v1", "kind": "X" }),
                live: vec!["v1"],
                steps: vec![("unrenderable", "v1")],
                ..Case::new("a template without spec cannot be rendered")
            },
        ];
        for case in cases {
            let t = template(case.template, case.entries);
            let versions: Vec<LiveVersion> = case.live.into_iter().map(live).collect();
            let plan = plan(Inputs {
                template: &t,
                worker: case.worker.as_ref(),
                versions: &versions,
                kind_refused: case.kind_refused,
                full: case.full,
            });
            let expected: Vec<(&str, String)> = case
                .steps
                .into_iter()
                .map(|(s, b)| (s, b.to_owned()))
                .collect();
            assert_eq!(summary(&plan), expected, "{}", case.what);
            assert_eq!(
                plan.blocked.map(|b| b.reason),
                case.blocked,
                "{}",
                case.what
            );
        }
    }

    #[test]
    fn a_kept_copy_records_the_generation_it_stands_for() {
        let t = template(hpa(), vec![applied(&hpa(), "v1")]);
        let plan = plan(Inputs {
            template: &t,
            worker: Some(&worker(false)),
            versions: &[live("v1")],
            kind_refused: None,
            full: false,
        });
        match &plan.steps[..] {
            [Step::Keep { entry }] => assert_eq!(entry.last_applied_generation, 3),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn status_reports_each_version_and_ready_from_the_first_problem() {
        let at = |s: i64| Time(Timestamp::from_second(s).unwrap_or(Timestamp::UNIX_EPOCH));
        let ok = applied(&hpa(), "v1");
        let mut bad = applied(&hpa(), "v2");
        bad.apply_error = Some("forbidden".into());
        let cases = [
            (
                vec![],
                None,
                (
                    "True",
                    "AllVersionsApplied",
                    "no version has a Deployment yet",
                ),
            ),
            (
                vec![ok.clone()],
                None,
                ("True", "AllVersionsApplied", "applied to 1 version: v1"),
            ),
            (
                vec![bad.clone(), ok.clone()],
                None,
                ("False", "ApplyFailed", "version v2: forbidden"),
            ),
            (
                vec![ok.clone()],
                Some(Blocked {
                    reason: TemplateReason::WorkerDeploymentNotFound,
                    message: "gone".into(),
                }),
                ("False", "WorkerDeploymentNotFound", "gone"),
            ),
        ];
        for (entries, blocked, (ready, reason, message)) in cases {
            let status = status(None, 3, entries, blocked.as_ref(), &at(10));
            let condition = &status.conditions[0];
            assert_eq!(
                (
                    condition.status.as_str(),
                    condition.reason.as_str(),
                    condition.message.as_str()
                ),
                (ready, reason, message)
            );
            assert_eq!(status.observed_generation, Some(3));
            let builds: Vec<_> = status
                .versions
                .iter()
                .map(|e| e.build_id.as_str())
                .collect();
            let mut sorted = builds.clone();
            sorted.sort();
            assert_eq!(builds, sorted);
        }
        // Written again later with nothing new: the same status, times kept.
        let first = status(None, 3, vec![ok.clone()], None, &at(10));
        let again = status(Some(&first), 3, vec![ok.clone()], None, &at(20));
        assert_eq!(again.conditions[0].last_transition_time, at(10));
        assert!(!status_changed(Some(&first), &again));
        let failing = status(Some(&first), 3, vec![bad], None, &at(20));
        assert!(status_changed(Some(&first), &failing));
        assert_eq!(failing.conditions[0].last_transition_time, at(20));
    }

    #[test]
    fn an_entry_moves_its_transition_time_only_when_it_changes() {
        let at = |s: i64| Time(Timestamp::from_second(s).unwrap_or(Timestamp::UNIX_EPOCH));
        let copy = CopyRef {
            name: "c".into(),
            api_version: "policy/v1".into(),
            kind: "PodDisruptionBudget".into(),
        };
        let first = failed_entry("v1", Some(&copy), "c", "boom", None, &at(1));
        assert_eq!(first.last_transition_time, Some(at(1)));
        let same = failed_entry("v1", Some(&copy), "c", "boom", Some(&first), &at(2));
        assert_eq!(same.last_transition_time, Some(at(1)));
        let other = failed_entry("v1", Some(&copy), "c", "bang", Some(&first), &at(3));
        assert_eq!(other.last_transition_time, Some(at(3)));
        assert_eq!(other.last_applied_generation, 0);
        assert_eq!(other.last_applied_hash, None);
    }
}
