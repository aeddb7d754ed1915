//! What the watcher's reflector stores keep of an object: everything but what no reader of the
//! stores uses, dropped before a store takes the object (`WatchStreamExt::modify`).
//!
//! Dropped from every object: `metadata.managedFields` (the server-side apply bookkeeping,
//! often as large as the rest of the object, and as a JSON tree costly in memory) and the
//! annotation of client-side `kubectl apply` (a JSON copy of the whole applied object). From the
//! worker kinds also `status.conditions` (written by the TWD workflow, read by nobody here).
//!
//! Kept, because the watcher reads them: the name, namespace, UID, generation, creation and
//! deletion timestamps (claim rule, spec signal), the other annotations (the rollout-action
//! annotation), the finalizers (the connections' release check, `known.rs`), the whole spec
//! (build ID, adoption, `connectionRef`) and the rest of the status (`rollout`,
//! `observedGeneration` and `adoptedBuild` for the spec signal, the versions for the per-TWD
//! gauges). kube-runtime's stores need the rest of the metadata (resourceVersion among it).

use kube::api::ObjectMeta;
use twc_crds::worker_deployment::TemporalWorkerDeploymentStatus;

/// The annotation client-side `kubectl apply` writes: the whole applied object, as JSON.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops `managedFields` and kubectl's last-applied copy from `meta`.
pub fn metadata(meta: &mut ObjectMeta) {
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
}

/// Drops what the watcher does not read of a worker object's status: its conditions.
pub fn status(status: Option<&mut TemporalWorkerDeploymentStatus>) {
    if let Some(status) = status {
        status.conditions = Vec::new();
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ManagedFieldsEntry, Time};
    use twc_crds::TemporalWorkerDeployment;
    use twc_crds::worker_deployment::{RolloutStatus, TemporalWorkerDeploymentStatus};
    use twc_workflows::control::ROLLOUT_ACTION_ANNOTATION;

    use super::*;
    use crate::watcher::reconcile::WorkerResource;

    #[test]
    fn a_stored_worker_object_keeps_what_the_watcher_reads_and_nothing_else() {
        let mut twd = TemporalWorkerDeployment {
            metadata: ObjectMeta {
                namespace: Some("demo".to_owned()),
                name: Some("hello".to_owned()),
                uid: Some("u1".to_owned()),
                generation: Some(3),
                resource_version: Some("42".to_owned()),
                finalizers: Some(vec!["temporal.io/delete-protection".to_owned()]),
                annotations: Some(BTreeMap::from([
                    (LAST_APPLIED.to_owned(), "{\"spec\":{}}".to_owned()),
                    (ROLLOUT_ACTION_ANNOTATION.to_owned(), "promote".to_owned()),
                ])),
                managed_fields: Some(vec![ManagedFieldsEntry {
                    manager: Some("kubectl".to_owned()),
                    ..Default::default()
                }]),
                ..Default::default()
            },
            spec: twc_crds::worker_deployment::test_support::spec_with_image("w:v1"),
            status: Some(TemporalWorkerDeploymentStatus {
                observed_generation: Some(3),
                rollout: Some(RolloutStatus::default()),
                conditions: vec![Condition {
                    type_: "Ready".to_owned(),
                    status: "True".to_owned(),
                    reason: "RolloutComplete".to_owned(),
                    message: "build v1 is Current".to_owned(),
                    observed_generation: Some(3),
                    last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
                }],
                ..Default::default()
            }),
        };
        let mut expected = twd.clone();
        expected.metadata.managed_fields = None;
        if let Some(status) = expected.status.as_mut() {
            status.conditions.clear();
        }
        expected.metadata.annotations = Some(BTreeMap::from([(
            ROLLOUT_ACTION_ANNOTATION.to_owned(),
            "promote".to_owned(),
        )]));
        twd.slim();
        assert_eq!(twd, expected);
    }
}
