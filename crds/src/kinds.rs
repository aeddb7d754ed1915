//! The two names of a worker deployment resource, and how one name in one namespace is claimed.
//!
//! `WorkerDeployment` (the Go controller's GA name) and `TemporalWorkerDeployment` (its older
//! name, which `twc` keeps serving) have the same spec and status. Both kinds of one name in one
//! namespace stand for the same Temporal Worker Deployment (`<namespace>/<name>`), so at most one
//! of them drives it: the claim holder ([`claim_holder`]). The other is refused until the holder
//! is deleted, when it takes over what the holder had (versions, routing, Deployments).

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::core::{ApiResource, GroupVersionKind};
use serde::{Deserialize, Serialize};

use crate::{TemporalWorkerDeployment, WorkerDeployment};

/// Which name a worker deployment resource was written under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum WorkerKind {
    /// `WorkerDeployment` (`wd`): the current name.
    WorkerDeployment,
    /// `TemporalWorkerDeployment` (`twd`): the older name.
    TemporalWorkerDeployment,
}

impl WorkerKind {
    /// Both kinds, the current one first.
    pub const ALL: [WorkerKind; 2] = [Self::WorkerDeployment, Self::TemporalWorkerDeployment];

    /// The kind's name, as in `kind:`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::WorkerDeployment => "WorkerDeployment",
            Self::TemporalWorkerDeployment => "TemporalWorkerDeployment",
        }
    }

    /// The resource's plural name, as in its API path.
    pub fn plural(self) -> &'static str {
        match self {
            Self::WorkerDeployment => "workerdeployments",
            Self::TemporalWorkerDeployment => "temporalworkerdeployments",
        }
    }

    /// What the Kubernetes client needs to address objects of this kind.
    pub fn api_resource(self) -> ApiResource {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(crate::GROUP, crate::VERSION, self.as_str()),
            self.plural(),
        )
    }

    /// The default kind of a `connectionRef` without one.
    pub fn default_connection_kind(self) -> crate::worker_deployment::ConnectionKind {
        match self {
            Self::WorkerDeployment => crate::worker_deployment::ConnectionKind::Connection,
            Self::TemporalWorkerDeployment => {
                crate::worker_deployment::ConnectionKind::TemporalConnection
            }
        }
    }

    /// The kind named `kind`, if it is one of the two.
    pub fn from_kind(kind: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == kind)
    }
}

impl fmt::Display for WorkerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A worker deployment resource of either kind, read into the one type the controller works
/// with (the spec of a `WorkerDeployment` has its connection's kind made explicit).
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerObject {
    /// The name it was written under.
    pub kind: WorkerKind,
    /// The object.
    pub object: TemporalWorkerDeployment,
}

impl WorkerObject {
    /// `<Kind> <namespace>/<name>`, for messages.
    pub fn describe(&self) -> String {
        format!(
            "{} {}/{}",
            self.kind,
            self.object
                .metadata
                .namespace
                .as_deref()
                .unwrap_or_default(),
            self.object.metadata.name.as_deref().unwrap_or_default()
        )
    }

    /// Whether the object is being deleted.
    pub fn deleting(&self) -> bool {
        self.object.metadata.deletion_timestamp.is_some()
    }

    /// The object's UID.
    pub fn object_uid(&self) -> &str {
        self.object.metadata.uid.as_deref().unwrap_or_default()
    }

    /// A reference to the object (for events and owner references).
    pub fn object_reference(&self) -> k8s_openapi::api::core::v1::ObjectReference {
        let meta = &self.object.metadata;
        k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some(format!("{}/{}", crate::GROUP, crate::VERSION)),
            kind: Some(self.kind.as_str().to_owned()),
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            uid: meta.uid.clone(),
            resource_version: meta.resource_version.clone(),
            field_path: None,
        }
    }
}

impl std::ops::Deref for WorkerObject {
    type Target = TemporalWorkerDeployment;

    fn deref(&self) -> &TemporalWorkerDeployment {
        &self.object
    }
}

impl std::ops::DerefMut for WorkerObject {
    fn deref_mut(&mut self) -> &mut TemporalWorkerDeployment {
        &mut self.object
    }
}

impl From<WorkerDeployment> for WorkerObject {
    fn from(object: WorkerDeployment) -> Self {
        Self {
            kind: WorkerKind::WorkerDeployment,
            object: object.into(),
        }
    }
}

impl From<TemporalWorkerDeployment> for WorkerObject {
    fn from(object: TemporalWorkerDeployment) -> Self {
        Self {
            kind: WorkerKind::TemporalWorkerDeployment,
            object,
        }
    }
}

/// What the claim rule needs of one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimantFacts<'a> {
    /// Its kind.
    pub kind: WorkerKind,
    /// When it was created.
    pub created: Option<&'a Time>,
    /// Its UID.
    pub uid: &'a str,
    /// Whether it is being deleted.
    pub deleting: bool,
}

impl<'a> ClaimantFacts<'a> {
    /// The facts of `object`.
    pub fn of(object: &'a WorkerObject) -> Self {
        Self {
            kind: object.kind,
            created: object.object.metadata.creation_timestamp.as_ref(),
            uid: object.object_uid(),
            deleting: object.deleting(),
        }
    }
}

/// Index of the object that holds the claim on the Temporal Worker Deployment among the objects
/// of both kinds with one name in one namespace: an object that is not being deleted before one
/// that is (so deleting the holder hands the claim to the other), then the older, then (created
/// in the same second) the `TemporalWorkerDeployment`, which existed first, then the UID.
pub fn claim_holder(claimants: &[ClaimantFacts<'_>]) -> Option<usize> {
    claimants
        .iter()
        .enumerate()
        .min_by(|(_, a), (_, b)| {
            a.deleting
                .cmp(&b.deleting)
                .then_with(|| a.created.map(|t| t.0).cmp(&b.created.map(|t| t.0)))
                .then_with(|| b.kind.cmp(&a.kind))
                .then_with(|| a.uid.cmp(b.uid))
        })
        .map(|(index, _)| index)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::Timestamp;

    use super::*;

    fn at(seconds: i64) -> Time {
        Time(Timestamp::from_second(seconds).unwrap_or(Timestamp::UNIX_EPOCH))
    }

    #[test]
    fn the_older_live_object_holds_the_claim_and_a_deleted_holder_hands_it_over() {
        use WorkerKind::{TemporalWorkerDeployment as Twd, WorkerDeployment as Wd};
        let (t1, t2) = (at(100), at(200));
        // (objects as (kind, created, uid, deleting), index of the holder)
        type Object<'a> = (WorkerKind, Option<&'a Time>, &'a str, bool);
        let cases: Vec<(Vec<Object<'_>>, Option<usize>)> = vec![
            (vec![], None),
            (vec![(Wd, Some(&t1), "a", false)], Some(0)),
            // A lone object being deleted still holds it: its deletion cleans Temporal up.
            (vec![(Twd, Some(&t1), "a", true)], Some(0)),
            // The older one holds; the later one is refused.
            (
                vec![(Twd, Some(&t1), "a", false), (Wd, Some(&t2), "b", false)],
                Some(0),
            ),
            (
                vec![(Twd, Some(&t2), "a", false), (Wd, Some(&t1), "b", false)],
                Some(1),
            ),
            // Deleting the holder hands the claim to the live one (the move to the new kind).
            (
                vec![(Twd, Some(&t1), "a", true), (Wd, Some(&t2), "b", false)],
                Some(1),
            ),
            // Both being deleted: the older one cleans up.
            (
                vec![(Twd, Some(&t1), "a", true), (Wd, Some(&t2), "b", true)],
                Some(0),
            ),
            // Created in the same second: the older kind, which existed first.
            (
                vec![(Wd, Some(&t1), "a", false), (Twd, Some(&t1), "b", false)],
                Some(1),
            ),
        ];
        for (objects, holder) in cases {
            let facts: Vec<ClaimantFacts<'_>> = objects
                .iter()
                .map(|(kind, created, uid, deleting)| ClaimantFacts {
                    kind: *kind,
                    created: *created,
                    uid,
                    deleting: *deleting,
                })
                .collect();
            assert_eq!(claim_holder(&facts), holder, "{objects:?}");
        }
    }

    #[test]
    fn both_kinds_address_their_own_resource() {
        for kind in WorkerKind::ALL {
            let resource = kind.api_resource();
            assert_eq!(resource.kind, kind.as_str());
            assert_eq!(resource.plural, kind.plural());
            assert_eq!(resource.api_version, "temporal.io/v1alpha1");
            assert_eq!(WorkerKind::from_kind(kind.as_str()), Some(kind));
        }
    }
}
