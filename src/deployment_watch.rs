//! The Deployment watch: tells a rollout in a hold when one of its build's Deployments changes
//! in a way the rollout decides on (replicas, availability, a failing rollout, deletion), so a
//! held rollout needs no polling to see a lost pod or a Deployment edited by hand: it sleeps
//! until this signal, a control, a spec change, its step's end or the slow resync.
//!
//! One watch for every versioned Deployment (label `temporal.io/build-id`) of the watched
//! namespaces. What it remembers is one small fingerprint per Deployment, dropped when the
//! Deployment is (a re-list replaces it all). It signals only on a change of a fingerprint it
//! knew: the initial list of a (re)started controller signals nothing, and neither does a
//! Deployment's creation (its creator is the engine). A re-list after the watch was down
//! signals what changed or went while it was. The signals go out from their own task, at most
//! [`MAX_SIGNALS_IN_FLIGHT`] at once, so a slow Temporal never holds up the watch; a signal
//! that fails is not retried (the rollout's resync looks anyway).

use std::collections::HashMap;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use temporalio_client::errors::WorkflowInteractionError;
use temporalio_client::{Client, WorkflowSignalOptions};
use twc_activities::k8s::deployment_view::deployment_view;
use twc_activities::metrics::Metrics;
use twc_crds::{WorkerKind, labels};
use twc_workflows::model::TwdRef;
use twc_workflows::rollout_workflow::RolloutWorkflow;

/// Most `deployment_changed` signals in flight at once.
const MAX_SIGNALS_IN_FLIGHT: usize = 16;

/// A Deployment, by namespace and name.
type Key = (String, String);

/// What a rollout decides on of one Deployment: `spec.replicas`, whether it is Available, the
/// message of a failing rollout, whether it is being deleted.
type Fingerprint = (Option<i32>, bool, Option<String>, bool);

/// The rollout to tell about a Deployment's change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The worker deployment the Deployment is a version of.
    pub twd: TwdRef,
    /// Its build.
    pub build_id: String,
    /// The Deployment.
    pub deployment: String,
}

impl Target {
    /// The workflow ID of the rollout of this build.
    fn workflow_id(&self) -> String {
        self.twd.rollout_workflow_id(&self.build_id)
    }
}

/// A Deployment as the watch remembers it.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    fingerprint: Fingerprint,
    target: Target,
}

/// Which Deployment changes a held rollout must hear of: the watch's events in, targets out.
#[derive(Debug, Default)]
pub struct Changes {
    known: HashMap<Key, Seen>,
    /// What the re-list in progress reported so far.
    relisted: Option<HashMap<Key, Seen>>,
    /// Whether a list has completed (the first one signals nothing).
    listed_once: bool,
}

impl Changes {
    /// Takes one watch event; returns the rollouts to signal.
    pub fn on(&mut self, event: Event<Deployment>) -> Vec<Target> {
        match event {
            Event::Init => {
                self.relisted = Some(HashMap::new());
                Vec::new()
            }
            Event::InitApply(deployment) => {
                if let (Some(seen), Some(relisted)) = (seen(&deployment), self.relisted.as_mut()) {
                    relisted.insert(key(&deployment), seen);
                }
                Vec::new()
            }
            Event::InitDone => {
                let relisted = self.relisted.take().unwrap_or_default();
                let old = std::mem::replace(&mut self.known, relisted);
                if !std::mem::replace(&mut self.listed_once, true) {
                    return Vec::new();
                }
                let mut targets: Vec<Target> = self
                    .known
                    .iter()
                    .filter(|(key, seen)| {
                        old.get(*key)
                            .is_some_and(|before| before.fingerprint != seen.fingerprint)
                    })
                    .map(|(_, seen)| seen.target.clone())
                    .collect();
                targets.extend(
                    old.into_iter()
                        .filter(|(key, _)| !self.known.contains_key(key))
                        .map(|(_, seen)| seen.target),
                );
                targets
            }
            Event::Apply(deployment) => {
                let Some(seen) = seen(&deployment) else {
                    return Vec::new();
                };
                let target = seen.target.clone();
                let fingerprint = seen.fingerprint.clone();
                match self.known.insert(key(&deployment), seen) {
                    Some(before) if before.fingerprint != fingerprint => vec![target],
                    _ => Vec::new(),
                }
            }
            Event::Delete(deployment) => self
                .known
                .remove(&key(&deployment))
                .map(|seen| seen.target)
                .into_iter()
                .collect(),
        }
    }

    /// How many Deployments it remembers.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.known.len()
    }
}

fn key(deployment: &Deployment) -> Key {
    (
        deployment.namespace().unwrap_or_default(),
        deployment.name_any(),
    )
}

/// The fingerprint and rollout of a versioned Deployment controlled by a worker deployment
/// object (either kind); `None` for any other Deployment.
fn seen(deployment: &Deployment) -> Option<Seen> {
    let view = deployment_view(deployment)?;
    let owner = deployment.owner_references().iter().find(|o| {
        o.controller == Some(true)
            && WorkerKind::ALL.iter().any(|kind| kind.as_str() == o.kind)
            && o.api_version.starts_with("temporal.io/")
    })?;
    let twd = TwdRef {
        namespace: deployment.namespace()?,
        name: owner.name.clone(),
    };
    Some(Seen {
        fingerprint: (view.replicas, view.available, view.problem, view.deleting),
        target: Target {
            twd,
            build_id: view.build_id,
            deployment: view.name,
        },
    })
}

/// Watches until `shutdown` completes.
pub async fn run(
    kube: kube::Client,
    engine: Client,
    namespaces: Vec<String>,
    metrics: std::sync::Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let config = watcher::Config::default().labels(labels::BUILD_ID);
    let apis: Vec<Api<Deployment>> = if namespaces.is_empty() {
        vec![Api::all(kube)]
    } else {
        namespaces
            .iter()
            .map(|ns| Api::namespaced(kube.clone(), ns))
            .collect()
    };
    let (send, receive) = futures::channel::mpsc::unbounded::<Target>();
    let signaller = tokio::spawn(signal_all(engine, receive, std::sync::Arc::clone(&metrics)));
    let watches: Vec<_> = apis
        .into_iter()
        .map(|api| {
            let config = config.clone();
            let send = send.clone();
            async move {
                let mut changes = Changes::default();
                let mut events = std::pin::pin!(watcher::watcher(api, config).default_backoff());
                while let Some(event) = events.next().await {
                    match event {
                        Ok(event) => {
                            for target in changes.on(event) {
                                if send.unbounded_send(target).is_err() {
                                    return;
                                }
                            }
                        }
                        Err(e) => tracing::warn!("watching versioned Deployments: {e}"),
                    }
                }
            }
        })
        .collect();
    drop(send);
    tokio::select! {
        () = shutdown => {}
        _ = futures::future::join_all(watches) => {}
    }
    signaller.abort();
}

/// Sends each target's `deployment_changed` signal, [`MAX_SIGNALS_IN_FLIGHT`] at once.
async fn signal_all(
    engine: Client,
    targets: futures::channel::mpsc::UnboundedReceiver<Target>,
    metrics: std::sync::Arc<Metrics>,
) {
    targets
        .for_each_concurrent(MAX_SIGNALS_IN_FLIGHT, |target| {
            let (engine, metrics) = (engine.clone(), std::sync::Arc::clone(&metrics));
            async move { signal(&engine, &metrics, &target).await }
        })
        .await;
}

async fn signal(engine: &Client, metrics: &Metrics, target: &Target) {
    let workflow_id = target.workflow_id();
    let handle = engine.get_workflow_handle::<RolloutWorkflow>(workflow_id.clone());
    let sent = handle
        .signal(
            RolloutWorkflow::deployment_changed,
            target.deployment.clone(),
            WorkflowSignalOptions::default(),
        )
        .await;
    let outcome = match &sent {
        Ok(()) => "success",
        // No rollout of that build runs (it completed, or the build is an old one): nothing to
        // tell.
        Err(WorkflowInteractionError::NotFound(_)) => "not_found",
        Err(_) => "error",
    };
    metrics.temporal_request("SignalWorkflowExecution", outcome);
    match sent {
        Ok(()) => {
            metrics.watcher_signal("deployment_changed", true);
            tracing::debug!(rollout = %workflow_id, deployment = %target.deployment, "told the rollout its Deployment changed");
        }
        Err(WorkflowInteractionError::NotFound(_)) => {}
        Err(e) => {
            metrics.watcher_signal("deployment_changed", false);
            tracing::warn!(rollout = %workflow_id, deployment = %target.deployment, "telling the rollout its Deployment changed failed (its resync looks anyway): {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::{DeploymentCondition, DeploymentSpec, DeploymentStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

    use super::*;

    /// A versioned Deployment of `hello`'s build `v2` with `replicas`, Available or not.
    fn deployment(name: &str, replicas: i32, available: bool) -> Deployment {
        Deployment {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("demo".into()),
                generation: Some(1),
                labels: Some([(labels::BUILD_ID.to_owned(), "v2".to_owned())].into()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "temporal.io/v1alpha1".into(),
                    kind: "WorkerDeployment".into(),
                    name: "hello".into(),
                    uid: "u1".into(),
                    controller: Some(true),
                    ..Default::default()
                }]),
                ..Default::default()
            },
            spec: Some(DeploymentSpec {
                replicas: Some(replicas),
                ..Default::default()
            }),
            status: Some(DeploymentStatus {
                observed_generation: Some(1),
                ready_replicas: Some(if available { replicas } else { 0 }),
                conditions: Some(vec![DeploymentCondition {
                    type_: "Available".into(),
                    status: if available { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    fn unowned(name: &str) -> Deployment {
        let mut d = deployment(name, 1, true);
        d.metadata.owner_references = None;
        d
    }

    fn with_ready(mut d: Deployment, ready: i32) -> Deployment {
        if let Some(status) = d.status.as_mut() {
            status.ready_replicas = Some(ready);
        }
        d
    }

    fn target(name: &str) -> Target {
        Target {
            twd: TwdRef {
                namespace: "demo".into(),
                name: "hello".into(),
            },
            build_id: "v2".into(),
            deployment: name.into(),
        }
    }

    #[test]
    fn only_a_change_of_what_a_rollout_decides_on_is_signalled() {
        let d = |name, replicas, available| deployment(name, replicas, available);
        // (events, Deployments signalled after the last event).
        type Case = (&'static str, Vec<Event<Deployment>>, Vec<&'static str>);
        let cases: Vec<Case> = vec![
            (
                "the first list signals nothing",
                vec![
                    Event::Init,
                    Event::InitApply(d("a", 2, true)),
                    Event::InitDone,
                ],
                vec![],
            ),
            (
                "a new Deployment (its creator knows) signals nothing",
                vec![Event::Init, Event::InitDone, Event::Apply(d("a", 2, false))],
                vec![],
            ),
            (
                "a lost pod: Available no more",
                vec![
                    Event::Init,
                    Event::InitApply(d("a", 2, true)),
                    Event::InitDone,
                    Event::Apply(d("a", 2, false)),
                ],
                vec!["a"],
            ),
            (
                "replicas edited by hand",
                vec![
                    Event::Init,
                    Event::InitApply(d("a", 2, true)),
                    Event::InitDone,
                    Event::Apply(d("a", 0, true)),
                ],
                vec!["a"],
            ),
            (
                "a status write that changes nothing decided on (one more pod ready)",
                vec![
                    Event::Init,
                    Event::InitApply(d("a", 3, false)),
                    Event::InitDone,
                    Event::Apply(with_ready(d("a", 3, false), 2)),
                ],
                vec![],
            ),
            (
                "deleted by hand",
                vec![
                    Event::Init,
                    Event::InitApply(d("a", 2, true)),
                    Event::InitDone,
                    Event::Delete(d("a", 2, true)),
                ],
                vec!["a"],
            ),
            (
                "not a worker deployment's version",
                vec![
                    Event::Init,
                    Event::InitApply(unowned("x")),
                    Event::InitDone,
                    Event::Apply({
                        let mut x = unowned("x");
                        x.spec = Some(DeploymentSpec {
                            replicas: Some(0),
                            ..Default::default()
                        });
                        x
                    }),
                ],
                vec![],
            ),
            (
                "a re-list signals what changed or went while the watch was down",
                vec![
                    Event::Init,
                    Event::InitApply(d("a", 2, true)),
                    Event::InitApply(d("b", 2, true)),
                    Event::InitApply(d("c", 2, true)),
                    Event::InitDone,
                    Event::Init,
                    Event::InitApply(d("a", 2, true)),
                    Event::InitApply(d("b", 2, false)),
                    Event::InitDone,
                ],
                vec!["b", "c"],
            ),
        ];
        for (case, events, expected) in cases {
            let mut changes = Changes::default();
            let mut last = Vec::new();
            for event in events {
                last = changes.on(event);
            }
            let mut names: Vec<String> = last.iter().map(|t| t.deployment.clone()).collect();
            names.sort();
            assert_eq!(names, expected, "{case}");
            for signalled in &last {
                assert_eq!(signalled, &target(&signalled.deployment), "{case}");
            }
        }
    }

    #[test]
    fn what_it_remembers_goes_with_the_deployment() {
        let mut changes = Changes::default();
        for event in [
            Event::Init,
            Event::InitApply(deployment("a", 1, true)),
            Event::InitDone,
            Event::Apply(deployment("b", 1, true)),
        ] {
            changes.on(event);
        }
        assert_eq!(changes.len(), 2);
        changes.on(Event::Delete(deployment("a", 1, true)));
        assert_eq!(changes.len(), 1);
        for event in [Event::Init, Event::InitDone] {
            changes.on(event);
        }
        assert_eq!(changes.len(), 0, "a re-list without it forgets b");
        assert_eq!(
            target("a").workflow_id(),
            "rollout/demo/hello/v2",
            "the rollout of the Deployment's build"
        );
    }
}
