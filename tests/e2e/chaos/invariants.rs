//! What must hold once a TWD's last rollout is over, however rough the way there was: status,
//! Deployments, Temporal routing and versions, and the engine's workflows all agree, and nothing
//! is left twice or behind.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, ListParams};

use super::cluster::{Cluster, WorkflowRow, fresh};
use crate::harness::twd::{condition, deployments, get_twd, target_build};

/// How long the sunset of the older builds and the closing of workflows may take.
const SETTLE: Duration = Duration::from_secs(240);

/// A TWD and the build it must end on.
#[derive(Debug, Clone)]
pub struct Expected {
    /// Kubernetes namespace.
    pub namespace: String,
    /// TWD name.
    pub name: String,
    /// Build ID that must be Current.
    pub build: String,
    /// Whether its rollouts run a gate.
    pub gated: bool,
}

/// Waits until the TWD has settled on its expected build (see [`settled`]); panics with the
/// last violation and the logs otherwise.
pub async fn assert_settled(cluster: &Cluster, expected: &Expected) {
    let started = std::time::Instant::now();
    cluster
        .wait(
            &format!(
                "{}/{} settled on {}",
                expected.namespace, expected.name, expected.build
            ),
            SETTLE,
            || settled(cluster, expected),
        )
        .await;
    eprintln!(
        "{}/{} settled on {} in {:.1}s",
        expected.namespace,
        expected.name,
        expected.build,
        started.elapsed().as_secs_f64()
    );
}

/// One TWD's end state:
/// - `Ready` is True (`RolloutComplete`) for the current generation; status targets the build
///   and shows it Current with no ramp;
/// - Temporal routes to it (Current, nothing ramping) and knows no other version (older ones
///   were deleted);
/// - exactly one Deployment, the build's, with the TWD's replicas;
/// - one run (or one chain of continued runs) per rollout workflow ID, none still running, the
///   build's ended `Complete`;
/// - one run per gate workflow ID, all completed, and for a gated TWD exactly the gate runs its
///   status lists;
/// - one running TWD workflow.
pub async fn settled(cluster: &Cluster, expected: &Expected) -> Result<(), String> {
    let Expected {
        namespace,
        name,
        build,
        gated,
    } = expected;
    let twd = get_twd(&cluster.client, namespace, name).await?;
    let status = twd.status.clone().unwrap_or_default();
    let ready = condition(&twd, "Ready");
    if !fresh(&twd)
        || !ready
            .as_ref()
            .is_some_and(|(s, r, _)| s == "True" && r == "RolloutComplete")
    {
        return Err(format!(
            "not Ready: {ready:?}, generation {:?}/{:?}",
            status.observed_generation, twd.metadata.generation
        ));
    }
    let target = target_build(&twd);
    let current = status.current_version.as_ref().map(|v| v.build_id.clone());
    let ramp = status
        .target_version
        .as_ref()
        .and_then(|t| t.ramp_percentage)
        .filter(|p| *p > 0.0);
    if target.as_deref() != Some(build) || current.as_deref() != Some(build) || ramp.is_some() {
        return Err(format!(
            "status target {target:?}, current {current:?}, ramp {ramp:?}; want {build}"
        ));
    }

    let routing = cluster
        .routing_in(
            &twd.spec.worker_options.temporal_namespace,
            &format!("{namespace}/{name}"),
        )
        .await?;
    if routing.current.as_deref() != Some(build) || routing.ramping.is_some() {
        return Err(format!(
            "routing {routing:?} does not match status (current {build})"
        ));
    }
    if routing.versions != [build.clone()] {
        let deps = deployments(&cluster.client, namespace, name).await;
        return Err(format!(
            "Temporal still knows versions {:?}; status deprecatedVersions {}; Deployments {deps:?}",
            routing.versions,
            serde_json::to_string(&status.deprecated_versions).unwrap_or_default()
        ));
    }

    let deps = deployments(&cluster.client, namespace, name).await;
    let replicas = twd.spec.replicas.or(Some(1));
    if deps.len() != 1 || deps[0].1 != *build || deps[0].2 != replicas {
        return Err(format!(
            "Deployments {deps:?}; want one of {build} with {replicas:?} replicas"
        ));
    }

    let rollouts = cluster
        .workflows(&format!(
            "WorkflowId STARTS_WITH 'rollout/{namespace}/{name}/'"
        ))
        .await?;
    one_run_each(&rollouts, "rollout")?;
    if let Some(open) = rollouts.iter().find(|r| r.status == "RUNNING") {
        return Err(format!("rollout {} still running", open.id));
    }
    let complete = cluster
        .workflows(&format!(
            "WorkflowId = 'rollout/{namespace}/{name}/{build}' AND TwcOutcome = 'Complete'"
        ))
        .await?;
    if complete.len() != 1 {
        return Err(format!(
            "rollout of {build} not recorded as Complete: {complete:?}"
        ));
    }

    let gates = cluster
        .workflows_in(
            &twd.spec.worker_options.temporal_namespace,
            &format!("WorkflowId STARTS_WITH 'gate/{namespace}/{name}/'"),
        )
        .await?;
    one_run_each(&gates, "gate")?;
    if let Some(open) = gates.iter().find(|r| r.status != "COMPLETED") {
        return Err(format!("gate {} is {}", open.id, open.status));
    }
    let listed: Vec<String> = status
        .target_version
        .as_ref()
        .map(|t| {
            t.test_workflows
                .iter()
                .map(|w| w.workflow_id.clone())
                .collect()
        })
        .unwrap_or_default();
    let of_build: Vec<String> = gates
        .iter()
        .filter(|g| {
            g.id.starts_with(&format!("gate/{namespace}/{name}/{build}/"))
        })
        .map(|g| g.id.clone())
        .collect();
    if *gated && (of_build.is_empty() || sorted(&of_build) != sorted(&listed)) {
        return Err(format!(
            "gate runs of {build} {of_build:?}; status lists {listed:?}"
        ));
    }
    if !*gated && !gates.is_empty() {
        return Err(format!("gates ran without a gate: {gates:?}"));
    }

    let twd_runs = cluster
        .workflows(&format!("WorkflowId = 'twd/{namespace}/{name}'"))
        .await?;
    let running = twd_runs.iter().filter(|r| r.status == "RUNNING").count();
    if running != 1 {
        return Err(format!("{running} running TWD workflows: {twd_runs:?}"));
    }
    Ok(())
}

/// Every Deployment in the namespace belongs to one of the TWDs of `expected` and is the one of
/// its expected build: nothing orphaned, nothing doubled.
pub async fn assert_no_orphans(cluster: &Cluster, namespace: &str, expected: &[Expected]) {
    let api: Api<Deployment> = Api::namespaced(cluster.client.clone(), namespace);
    let all = api
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_else(|e| panic!("listing Deployments in {namespace}: {e}"));
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    for deployment in &all {
        let name = deployment.metadata.name.clone().unwrap_or_default();
        let owner = deployment
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| {
                twc_crds::WorkerKind::from_kind(&o.kind).is_some() && o.controller == Some(true)
            })
            .map(|o| o.name.clone());
        let build = deployment
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(twc_crds::labels::BUILD_ID).cloned())
            .unwrap_or_default();
        let Some(owner) = owner else {
            panic!("Deployment {namespace}/{name} has no owning TWD");
        };
        let wanted = expected.iter().find(|e| e.name == owner);
        assert!(
            wanted.is_some_and(|e| e.build == build),
            "Deployment {namespace}/{name} (owner {owner}, build {build}) is not the expected one of its TWD"
        );
        assert!(
            seen.insert(owner.clone(), name.clone()).is_none(),
            "TWD {owner} has two Deployments: {name} and {:?}",
            seen.get(&owner)
        );
    }
    assert_eq!(seen.len(), expected.len(), "Deployments: {seen:?}");
}

/// No two runs share a gate workflow ID anywhere in Temporal namespace `temporal_ns`.
pub async fn assert_no_duplicate_gates(cluster: &Cluster, temporal_ns: &str) {
    let gates = cluster
        .workflows_in(temporal_ns, "WorkflowId STARTS_WITH 'gate/'")
        .await
        .unwrap_or_else(|e| panic!("listing gate workflows: {e}"));
    if let Err(e) = one_run_each(&gates, "gate") {
        panic!("{e}");
    }
}

/// Every workflow ID of `rows` ran once: as one run, or as one chain of runs that continued as
/// new (a rollout held long enough continues at `RUN_EVENT_BOUND` events), where only the newest
/// run ended otherwise. Two runs that did not continue as new are the same work started twice.
fn one_run_each(rows: &[WorkflowRow], what: &str) -> Result<(), String> {
    let mut runs: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for row in rows {
        runs.entry(&row.id).or_default().push(&row.status);
    }
    let started_twice = |statuses: &Vec<&str>| {
        statuses
            .iter()
            .filter(|status| **status != "CONTINUED_AS_NEW")
            .count()
            > 1
    };
    match runs.iter().find(|(_, r)| started_twice(r)) {
        Some((id, statuses)) => Err(format!(
            "{what} {id} ran {} times, not as one chain of continued runs: {statuses:?}",
            statuses.len()
        )),
        None => Ok(()),
    }
}

fn sorted(ids: &[String]) -> Vec<String> {
    let mut ids = ids.to_vec();
    ids.sort();
    ids
}
