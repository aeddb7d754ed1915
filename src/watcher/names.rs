//! The worker deployment objects of one name, read from the reflector stores of both kinds, and
//! what the watcher remembers about each name between reconciles: the last spec signal it
//! delivered, the objects of the name that do not hold its claim, nudges owed, the
//! rollout-action annotation handled. Every entry goes with the name's last object
//! ([`Names::prune`]). The decisions on that memory are pure functions, table-tested below.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use kube::api::ObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use twc_crds::kinds::{ClaimantFacts, claim_holder};
use twc_crds::worker_deployment::{
    ConnectionKind, TemporalWorkerDeploymentSpec, TemporalWorkerDeploymentStatus,
};
use twc_crds::{TemporalWorkerDeployment, WorkerDeployment, WorkerKind, WorkerObject};
use twc_workflows::model::{ControlAction, TwdRef};

use super::lists::{FirstLists, Lists};

/// An object of either worker kind as its reflector store holds it (cheap to clone).
#[derive(Debug, Clone)]
pub enum Stored {
    /// A `TemporalWorkerDeployment`.
    Twd(Arc<TemporalWorkerDeployment>),
    /// A `WorkerDeployment`.
    Wd(Arc<WorkerDeployment>),
}

impl Stored {
    /// The kind it was written under.
    pub fn kind(&self) -> WorkerKind {
        match self {
            Self::Twd(_) => WorkerKind::TemporalWorkerDeployment,
            Self::Wd(_) => WorkerKind::WorkerDeployment,
        }
    }

    /// Its metadata.
    pub fn meta(&self) -> &ObjectMeta {
        match self {
            Self::Twd(o) => &o.metadata,
            Self::Wd(o) => &o.metadata,
        }
    }

    /// Its spec (a `WorkerDeployment`'s with its connection's kind made explicit).
    pub fn spec(&self) -> &TemporalWorkerDeploymentSpec {
        match self {
            Self::Twd(o) => &o.spec,
            Self::Wd(o) => &o.spec.0,
        }
    }

    /// Its status.
    pub fn status(&self) -> Option<&TemporalWorkerDeploymentStatus> {
        match self {
            Self::Twd(o) => o.status.as_ref(),
            Self::Wd(o) => o.status.as_ref(),
        }
    }

    /// The TWD (namespace and name) it stands for.
    pub fn twd(&self) -> TwdRef {
        TwdRef {
            namespace: self.meta().namespace.clone().unwrap_or_default(),
            name: self.meta().name.clone().unwrap_or_default(),
        }
    }

    /// What a spec signal carries of it, and what tells its changes apart.
    pub fn seen(&self) -> Seen {
        let meta = self.meta();
        Seen {
            uid: meta.uid.clone().unwrap_or_default(),
            generation: meta.generation.unwrap_or_default(),
            deleting: meta.deletion_timestamp.is_some(),
        }
    }

    /// The same object as the activities read it (a copy).
    pub fn to_object(&self) -> WorkerObject {
        match self {
            Self::Twd(o) => WorkerObject::from(TemporalWorkerDeployment::clone(o)),
            Self::Wd(o) => WorkerObject::from(WorkerDeployment::clone(o)),
        }
    }

    /// Whether its `connectionRef` names the connection of `kind` called `name` (in its own
    /// namespace, unless a ClusterConnection).
    pub fn uses(&self, kind: ConnectionKind, namespace: Option<&str>, name: &str) -> bool {
        let reference = &self.spec().worker_options.connection_ref;
        reference.kind == kind
            && reference.name == name
            && (namespace.is_none() || self.meta().namespace.as_deref() == namespace)
    }

    fn facts(&self) -> ClaimantFacts<'_> {
        let meta = self.meta();
        ClaimantFacts {
            kind: self.kind(),
            created: meta.creation_timestamp.as_ref(),
            uid: meta.uid.as_deref().unwrap_or_default(),
            deleting: meta.deletion_timestamp.is_some(),
        }
    }
}

/// The claim holder among the objects of one name ([`claim_holder`]).
pub fn holder(objects: &[Stored]) -> Option<&Stored> {
    let facts: Vec<ClaimantFacts<'_>> = objects.iter().map(Stored::facts).collect();
    claim_holder(&facts).and_then(|index| objects.get(index))
}

/// The reflector stores of both worker kinds of one watch scope.
#[derive(Clone)]
pub struct Workers {
    /// `TemporalWorkerDeployment`s.
    pub twd: Store<TemporalWorkerDeployment>,
    /// `WorkerDeployment`s.
    pub wd: Store<WorkerDeployment>,
    /// Which watches of the scope have finished their first list.
    pub lists: Lists,
}

impl Workers {
    /// Waits until both stores hold their first list: before that, a claim could be decided
    /// without the older object of a name.
    pub async fn ready(&self) {
        self.lists.wait_for(FirstLists::workers).await;
    }

    /// The objects of both kinds named `twd`.
    pub fn of_name(&self, twd: &TwdRef) -> Vec<Stored> {
        let twds = self
            .twd
            .get(&ObjectRef::new(&twd.name).within(&twd.namespace))
            .map(Stored::Twd);
        let wds = self
            .wd
            .get(&ObjectRef::new(&twd.name).within(&twd.namespace))
            .map(Stored::Wd);
        twds.into_iter().chain(wds).collect()
    }

    /// The claim holders whose `connectionRef` names the connection of `kind` called `name`
    /// (in `namespace`; any namespace for a ClusterConnection).
    pub fn users_of(
        &self,
        kind: ConnectionKind,
        namespace: Option<&str>,
        name: &str,
    ) -> Vec<Stored> {
        let twds = self.twd.state().into_iter().map(Stored::Twd);
        let wds = self.wd.state().into_iter().map(Stored::Wd);
        twds.chain(wds)
            .filter(|o| o.uses(kind, namespace, name))
            .filter(|o| {
                holder(&self.of_name(&o.twd())).is_some_and(|h| h.seen().uid == o.seen().uid)
            })
            .collect()
    }
}

/// What a spec signal carries of an object, and what a change of it is measured by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.generation`.
    pub generation: i64,
    /// Whether it is being deleted.
    pub deleting: bool,
}

/// What the watcher remembers of one name.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct NameMemory {
    /// The holder as the last delivered spec signal carried it.
    sent: Option<Seen>,
    /// The objects of the name that do not hold its claim, as last seen, by kind.
    others: BTreeMap<WorkerKind, Seen>,
    /// A nudge is owed: something around the TWD changed (its connection, another object of
    /// its name) and its workflow has not been told yet.
    nudge: bool,
    /// Its workflow ran when the watcher started (and the name has not been reconciled since).
    running_at_start: bool,
    /// The rollout-action annotation handled, as (uid, value), until the holder is seen
    /// without one: an older copy of the object must not act on it again.
    action: Option<(String, String)>,
    /// A control this replica took from the annotation and could not send yet.
    unsent: Option<ControlAction>,
}

/// What the holder's reconcile does about the spec signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecPlan {
    /// Its workflow has this spec already: no signal.
    Unchanged,
    /// A TWD whose workflow ran when the watcher started and whose status shows it handled this
    /// generation: recorded as signalled, and left alone.
    HandledBefore,
    /// Signal it; `nudge` when the spec may be the one held but something around it changed,
    /// `fresh` when this generation (or deletion) was not signalled before.
    Signal {
        /// [`twc_workflows::twd_workflow::SpecSignal::nudge`].
        nudge: bool,
        /// This generation is new to this replica.
        fresh: bool,
    },
}

impl NameMemory {
    /// What to do about the holder `seen`, whose status says its workflow handled its
    /// generation (`handled`) or not. Takes the nudge owed and the start-up mark.
    pub fn plan(&mut self, seen: &Seen, kind: WorkerKind, handled: bool) -> SpecPlan {
        self.others.remove(&kind);
        let running_at_start = std::mem::take(&mut self.running_at_start);
        let fresh = self.sent.as_ref() != Some(seen);
        if std::mem::take(&mut self.nudge) {
            return SpecPlan::Signal { nudge: true, fresh };
        }
        if !fresh {
            return SpecPlan::Unchanged;
        }
        if running_at_start && handled {
            self.sent = Some(seen.clone());
            return SpecPlan::HandledBefore;
        }
        SpecPlan::Signal {
            nudge: false,
            fresh,
        }
    }

    /// Records a delivered signal of `seen`.
    pub fn signalled(&mut self, seen: Seen) {
        self.sent = Some(seen);
    }

    /// Records that a nudge is owed (again, when sending it failed).
    pub fn owe_nudge(&mut self) {
        self.nudge = true;
    }

    /// Records `seen`, an object of the name of `kind` that does not hold its claim; whether it
    /// changed (or is new), which its name's workflow must hear of.
    pub fn other_changed(&mut self, kind: WorkerKind, seen: Seen) -> bool {
        self.others.insert(kind, seen.clone()) != Some(seen)
    }

    /// Whether the holder's annotation (`uid`, `value`) is still to be taken; `None` forgets
    /// the one handled (the holder was seen without it).
    pub fn action_pending(&mut self, annotation: Option<(&str, &str)>) -> bool {
        match annotation {
            None => {
                self.action = None;
                false
            }
            Some((uid, value)) => self
                .action
                .as_ref()
                .is_none_or(|(u, v)| u != uid || v != value),
        }
    }

    /// Records the annotation (`uid`, `value`) handled.
    pub fn action_handled(&mut self, uid: &str, value: &str) {
        self.action = Some((uid.to_owned(), value.to_owned()));
    }

    /// Takes the control not sent yet.
    pub fn take_unsent(&mut self) -> Option<ControlAction> {
        self.unsent.take()
    }

    /// Keeps a control to send later.
    pub fn keep_unsent(&mut self, action: ControlAction) {
        self.unsent = Some(action);
    }
}

/// The memory of every name of one watch scope.
#[derive(Debug, Default)]
pub struct Names {
    names: Mutex<HashMap<TwdRef, NameMemory>>,
}

impl Names {
    /// Memory that knows the TWD workflows running when the watcher started.
    pub fn with_running(running: impl IntoIterator<Item = TwdRef>) -> Self {
        let names = running
            .into_iter()
            .map(|twd| {
                let memory = NameMemory {
                    running_at_start: true,
                    ..NameMemory::default()
                };
                (twd, memory)
            })
            .collect();
        Self {
            names: Mutex::new(names),
        }
    }

    /// Runs `f` on the memory of `twd` (created if new). Never held across an await.
    pub fn with<T>(&self, twd: &TwdRef, f: impl FnOnce(&mut NameMemory) -> T) -> T {
        f(self.lock().entry(twd.clone()).or_default())
    }

    /// Drops the memory of `twd` (its last object was deleted).
    pub fn forget(&self, twd: &TwdRef) {
        self.lock().remove(twd);
    }

    /// Drops the memory of every name `exists` says has no object left; returns those names.
    pub fn prune(&self, exists: impl Fn(&TwdRef) -> bool) -> Vec<TwdRef> {
        let mut names = self.lock();
        let gone: Vec<TwdRef> = names.keys().filter(|t| !exists(t)).cloned().collect();
        for twd in &gone {
            names.remove(twd);
        }
        gone
    }

    /// How many names it remembers.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<TwdRef, NameMemory>> {
        self.names.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn seen(uid: &str, generation: i64, deleting: bool) -> Seen {
        Seen {
            uid: uid.to_owned(),
            generation,
            deleting,
        }
    }

    /// A stored object of `kind` named demo/hello, created at `created` seconds.
    fn stored(kind: WorkerKind, created: i64, deleting: bool) -> Stored {
        let time = |s: i64| Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap_or_default());
        let metadata = ObjectMeta {
            namespace: Some("demo".to_owned()),
            name: Some("hello".to_owned()),
            uid: Some(format!("{kind}")),
            creation_timestamp: Some(time(created)),
            deletion_timestamp: deleting.then(|| time(created + 1)),
            ..Default::default()
        };
        let spec = twc_crds::worker_deployment::test_support::spec_with_image("w:v1");
        match kind {
            WorkerKind::TemporalWorkerDeployment => {
                Stored::Twd(Arc::new(TemporalWorkerDeployment {
                    metadata,
                    spec,
                    status: None,
                }))
            }
            WorkerKind::WorkerDeployment => Stored::Wd(Arc::new(WorkerDeployment {
                metadata,
                spec: twc_crds::worker_deployment::WorkerDeploymentSpec(spec),
                status: None,
            })),
        }
    }

    #[test]
    fn the_older_live_object_of_a_name_holds_it_and_a_deleted_one_hands_it_over() {
        use WorkerKind::{TemporalWorkerDeployment as Twd, WorkerDeployment as Wd};
        // (case, objects as (kind, created, deleting), holder's kind)
        type Case = (
            &'static str,
            Vec<(WorkerKind, i64, bool)>,
            Option<WorkerKind>,
        );
        let cases: Vec<Case> = vec![
            ("no object", vec![], None),
            ("one object", vec![(Wd, 20, false)], Some(Wd)),
            (
                "the older one",
                vec![(Twd, 10, false), (Wd, 20, false)],
                Some(Twd),
            ),
            (
                "the older one, listed second",
                vec![(Wd, 20, false), (Twd, 10, false)],
                Some(Twd),
            ),
            (
                "a deleted holder hands over",
                vec![(Twd, 10, true), (Wd, 20, false)],
                Some(Wd),
            ),
            (
                "created in the same second: the TemporalWorkerDeployment",
                vec![(Wd, 10, false), (Twd, 10, false)],
                Some(Twd),
            ),
        ];
        for (case, objects, expected) in cases {
            let objects: Vec<Stored> = objects
                .into_iter()
                .map(|(kind, created, deleting)| stored(kind, created, deleting))
                .collect();
            assert_eq!(holder(&objects).map(Stored::kind), expected, "{case}");
        }
    }

    #[test]
    fn a_holder_is_signalled_once_per_generation_unless_nudged_or_handled_before_a_restart() {
        let v1 = seen("u", 1, false);
        let kind = WorkerKind::WorkerDeployment;
        let signal = |nudge, fresh| SpecPlan::Signal { nudge, fresh };
        // (case, memory before, seen, status says handled, plan, memory after)
        type Case = (&'static str, NameMemory, Seen, bool, SpecPlan, Option<Seen>);
        let sent = |s: &Seen| NameMemory {
            sent: Some(s.clone()),
            ..NameMemory::default()
        };
        let at_start = NameMemory {
            running_at_start: true,
            ..NameMemory::default()
        };
        let cases: Vec<Case> = vec![
            (
                "first sight",
                NameMemory::default(),
                v1.clone(),
                false,
                signal(false, true),
                None,
            ),
            (
                "a status write: the generation was signalled",
                sent(&v1),
                v1.clone(),
                false,
                SpecPlan::Unchanged,
                Some(v1.clone()),
            ),
            (
                "a new generation",
                sent(&v1),
                seen("u", 2, false),
                false,
                signal(false, true),
                Some(v1.clone()),
            ),
            (
                "deletion",
                sent(&v1),
                seen("u", 1, true),
                false,
                signal(false, true),
                Some(v1.clone()),
            ),
            (
                "the other kind took over",
                sent(&v1),
                seen("other", 1, false),
                false,
                signal(false, true),
                Some(v1.clone()),
            ),
            (
                "a nudge owed, generation signalled",
                NameMemory {
                    nudge: true,
                    ..sent(&v1)
                },
                v1.clone(),
                false,
                signal(true, false),
                Some(v1.clone()),
            ),
            (
                "running at the start with its generation in the status",
                at_start.clone(),
                v1.clone(),
                true,
                SpecPlan::HandledBefore,
                Some(v1.clone()),
            ),
            (
                "running at the start, its status behind",
                at_start.clone(),
                v1.clone(),
                false,
                signal(false, true),
                None,
            ),
            (
                "a status showing the generation, but no workflow ran at the start",
                NameMemory::default(),
                v1.clone(),
                true,
                signal(false, true),
                None,
            ),
            (
                "running at the start, nudged",
                NameMemory {
                    nudge: true,
                    ..at_start
                },
                v1.clone(),
                true,
                signal(true, true),
                None,
            ),
        ];
        for (case, mut memory, seen, handled, plan, sent_after) in cases {
            assert_eq!(memory.plan(&seen, kind, handled), plan, "{case}");
            assert_eq!(memory.sent, sent_after, "{case}");
            assert!(!memory.nudge, "{case}: the nudge is taken");
            assert!(!memory.running_at_start, "{case}: only the first reconcile");
        }
    }

    #[test]
    fn an_object_that_does_not_hold_its_name_nudges_once_per_change() {
        use WorkerKind::{TemporalWorkerDeployment as Twd, WorkerDeployment as Wd};
        let mut memory = NameMemory::default();
        // (case, kind, seen, nudges)
        let cases = [
            ("first sight", Wd, seen("w", 1, false), true),
            ("its status written", Wd, seen("w", 1, false), false),
            ("its spec changed", Wd, seen("w", 2, false), true),
            ("being deleted", Wd, seen("w", 2, true), true),
            (
                "the other kind, first sight",
                Twd,
                seen("t", 1, false),
                true,
            ),
            ("the first again, unchanged", Wd, seen("w", 2, true), false),
        ];
        for (case, kind, seen, nudges) in cases {
            assert_eq!(memory.other_changed(kind, seen), nudges, "{case}");
        }
        // Once it holds the name, a later refusal counts as a change again.
        memory.plan(&seen("w", 2, true), Wd, false);
        assert!(memory.other_changed(Wd, seen("w", 2, true)));
    }

    #[test]
    fn a_rollout_action_is_taken_once_per_value_until_the_annotation_goes() {
        let mut memory = NameMemory::default();
        // (case, annotation on the holder, to take, then handled)
        let cases = [
            ("no annotation", None, false, false),
            ("promote", Some(("u", "promote")), true, true),
            (
                "an older copy still shows it",
                Some(("u", "promote")),
                false,
                false,
            ),
            ("another value", Some(("u", "pause")), true, true),
            ("gone", None, false, false),
            (
                "the same value set again",
                Some(("u", "pause")),
                true,
                false,
            ),
            (
                "another object of the name",
                Some(("v", "pause")),
                true,
                false,
            ),
        ];
        for (case, annotation, pending, handle) in cases {
            assert_eq!(memory.action_pending(annotation), pending, "{case}");
            if let (true, Some((uid, value))) = (handle, annotation) {
                memory.action_handled(uid, value);
            }
        }
    }

    #[test]
    fn memory_goes_with_the_last_object_of_its_name() {
        let twd = |name: &str| TwdRef {
            namespace: "demo".to_owned(),
            name: name.to_owned(),
        };
        let names = Names::with_running([twd("ran-at-start-and-gone")]);
        for name in ["a", "b", "c"] {
            names.with(&twd(name), NameMemory::owe_nudge);
        }
        assert_eq!(names.len(), 4);
        let mut gone = names.prune(|t| t.name == "b");
        gone.sort_by(|x, y| x.name.cmp(&y.name));
        assert_eq!(gone, vec![twd("a"), twd("c"), twd("ran-at-start-and-gone")]);
        assert_eq!(names.len(), 1);
    }
}
