//! The connections' watches: a change of a Connection's, TemporalConnection's or
//! ClusterConnection's spec (its generation; for a ClusterConnection also its deletion, which its
//! users' turns release) nudges the claim holders that use it. Status writes do not, and neither
//! does the first list after a (re)start: the workflows of the TWDs have seen their connections.
//! A connection first seen later (created, or while the watch was down) does.
//!
//! Each watch feeds a reflector store of its own (which drops what a re-list no longer shows,
//! and keeps no `managedFields`: [`super::slim`]); an event is compared with the store before
//! the store takes it. The activities read the stores too, through [`super::known`]. Nothing
//! here waits on Temporal: a nudge is a mark in the name's memory and a reconcile request to its
//! holder's controller.

use std::fmt::Debug;
use std::future::Future;

use futures::StreamExt;
use kube::Resource;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;
use twc_crds::worker_deployment::ConnectionKind;
use twc_crds::{ClusterConnection, Connection, TemporalConnection};

use super::lists::Watch;
use super::reconcile::Context;
use super::slim;

/// What the users of a connection act on: its generation, and whether it is being deleted.
pub type Fingerprint = (i64, bool);

/// A kind of connection the worker deployments reference.
pub trait ConnectionResource:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
    /// Its kind in a `connectionRef`.
    const KIND: ConnectionKind;

    /// What its users act on.
    fn fingerprint(&self) -> Fingerprint {
        (self.meta().generation.unwrap_or_default(), false)
    }
}

impl ConnectionResource for TemporalConnection {
    const KIND: ConnectionKind = ConnectionKind::TemporalConnection;
}

impl ConnectionResource for Connection {
    const KIND: ConnectionKind = ConnectionKind::Connection;
}

impl ConnectionResource for ClusterConnection {
    const KIND: ConnectionKind = ConnectionKind::ClusterConnection;

    /// Its deletion too: the users' turns release it.
    fn fingerprint(&self) -> Fingerprint {
        let meta = self.meta();
        (
            meta.generation.unwrap_or_default(),
            meta.deletion_timestamp.is_some(),
        )
    }
}

/// Whether an applied connection nudges its users: a change of what they act on, or first sight
/// once the first list is done.
pub fn nudges(before: Option<Fingerprint>, now: Fingerprint, listed_once: bool) -> bool {
    match before {
        Some(before) => before != now,
        None => listed_once,
    }
}

/// Watches the connections of `api` into the store of `writer` until the watch ends (the
/// future returned); marks `counted`, if any, once the first list ends.
pub fn watch<C: ConnectionResource>(
    api: Api<C>,
    mut writer: reflector::store::Writer<C>,
    context: std::sync::Arc<Context>,
    counted: Option<Watch>,
) -> impl Future<Output = ()> + Send {
    let reader = writer.as_reader();
    async move {
        let mut events = std::pin::pin!(
            watcher::watcher(api, watcher::Config::default())
                .default_backoff()
                .modify(|connection: &mut C| slim::metadata(connection.meta_mut()))
        );
        let mut listed_once = false;
        while let Some(event) = events.next().await {
            let event = match event {
                Ok(event) => event,
                Err(e) => {
                    tracing::warn!("watching {}s: {e}", C::KIND.as_str());
                    continue;
                }
            };
            let changed = match &event {
                Event::Apply(connection) | Event::InitApply(connection) => {
                    let before = reader
                        .get(&ObjectRef::from_obj(connection))
                        .map(|b| b.fingerprint());
                    nudges(before, connection.fingerprint(), listed_once)
                        .then(|| connection.meta().clone())
                }
                Event::InitDone => {
                    if !std::mem::replace(&mut listed_once, true)
                        && let Some(counted) = counted
                    {
                        context.workers.lists.mark(counted);
                    }
                    None
                }
                Event::Init | Event::Delete(_) => None,
            };
            writer.apply_watcher_event(&event);
            if let Some(meta) = changed {
                let name = meta.name.unwrap_or_default();
                context.nudge_users(C::KIND, meta.namespace.as_deref(), &name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_spec_change_or_a_first_sight_after_the_first_list_nudges() {
        // (case, before, now, first list done, nudges)
        let cases = [
            ("first list", None, (1, false), false, false),
            ("created later", None, (1, false), true, true),
            ("a status write", Some((1, false)), (1, false), true, false),
            ("a spec change", Some((1, false)), (2, false), true, true),
            (
                "changed while the watch was down (a re-list)",
                Some((1, false)),
                (3, false),
                true,
                true,
            ),
            (
                "a ClusterConnection being deleted",
                Some((2, false)),
                (2, true),
                true,
                true,
            ),
        ];
        for (case, before, now, listed, expected) in cases {
            assert_eq!(nudges(before, now, listed), expected, "{case}");
        }
    }
}
