//! Which watches of a scope have finished their first list: reconciles wait for both worker
//! kinds (a claim decided without the older object of a name would be wrong), readiness for
//! both worker kinds and both namespaced connection kinds, each counted on its own. The
//! activities' view of the connections ([`super::known`]) answers only for watches listed once
//! (ClusterConnections too, which readiness does not count).
//!
//! Marked by the watches themselves when their first list ends, and read through a
//! `tokio::sync::watch` channel, which wakes every waiter: a reflector store's
//! `wait_until_ready` wakes only the last of several concurrent waiters (its one-shot receiver
//! keeps one waker), so reconciles waiting on it together could wait forever.

use tokio::sync::watch;

/// A watch of a scope that readiness counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watch {
    /// `TemporalWorkerDeployment`s.
    TemporalWorkerDeployments,
    /// `WorkerDeployment`s.
    WorkerDeployments,
    /// `TemporalConnection`s.
    TemporalConnections,
    /// `Connection`s.
    Connections,
    /// `ClusterConnection`s (not counted by readiness).
    ClusterConnections,
}

/// The watches of a scope whose first list has ended.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FirstLists {
    twds: bool,
    wds: bool,
    temporal_connections: bool,
    connections: bool,
    cluster_connections: bool,
}

impl FirstLists {
    /// Records that `watch` finished its first list.
    pub fn mark(&mut self, watch: Watch) {
        match watch {
            Watch::TemporalWorkerDeployments => self.twds = true,
            Watch::WorkerDeployments => self.wds = true,
            Watch::TemporalConnections => self.temporal_connections = true,
            Watch::Connections => self.connections = true,
            Watch::ClusterConnections => self.cluster_connections = true,
        }
    }

    /// Both worker kinds are listed: a name's claim can be decided.
    pub fn workers(&self) -> bool {
        self.twds && self.wds
    }

    /// Every watch readiness counts is listed.
    pub fn all(&self) -> bool {
        self.workers() && self.temporal_connections && self.connections
    }

    /// Both worker kinds and the ClusterConnections are listed.
    pub fn cluster(&self) -> bool {
        self.workers() && self.cluster_connections
    }
}

/// The first lists of a scope, as the watches mark them and everyone else waits for them.
#[derive(Debug, Clone)]
pub struct Lists {
    sender: watch::Sender<FirstLists>,
}

impl Default for Lists {
    fn default() -> Self {
        Self {
            sender: watch::Sender::new(FirstLists::default()),
        }
    }
}

impl Lists {
    /// Records that `watch` finished its first list.
    pub fn mark(&self, watch: Watch) {
        self.sender.send_modify(|lists| lists.mark(watch));
    }

    /// The first lists ended so far.
    pub fn now(&self) -> FirstLists {
        *self.sender.borrow()
    }

    /// Waits until `done` holds of the first lists.
    pub async fn wait_for(&self, done: impl FnMut(&FirstLists) -> bool) {
        let mut lists = self.sender.subscribe();
        // The sender lives as long as `self`: this does not fail.
        let _ = lists.wait_for(done).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_once_both_worker_kinds_and_both_connection_kinds_hold_their_first_list() {
        use Watch::*;
        // (case, watches listed, claims decidable, ready)
        let cases = [
            ("nothing listed", vec![], false, false),
            (
                "worker kinds only",
                vec![TemporalWorkerDeployments, WorkerDeployments],
                true,
                false,
            ),
            (
                "TemporalConnections do not stand for Connections",
                vec![
                    TemporalWorkerDeployments,
                    WorkerDeployments,
                    TemporalConnections,
                ],
                true,
                false,
            ),
            (
                "Connections do not stand for TemporalConnections",
                vec![TemporalWorkerDeployments, WorkerDeployments, Connections],
                true,
                false,
            ),
            (
                "one worker kind missing",
                vec![WorkerDeployments, TemporalConnections, Connections],
                false,
                false,
            ),
            (
                "every kind, one listed twice",
                vec![
                    Connections,
                    TemporalWorkerDeployments,
                    Connections,
                    WorkerDeployments,
                    TemporalConnections,
                ],
                true,
                true,
            ),
        ];
        for (case, listed, workers, all) in cases {
            let mut lists = FirstLists::default();
            for watch in listed {
                lists.mark(watch);
            }
            assert_eq!(lists.workers(), workers, "{case}");
            assert_eq!(lists.all(), all, "{case}");
        }
    }

    #[tokio::test]
    async fn every_waiter_wakes_when_the_lists_end() {
        let lists = Lists::default();
        let waiters: Vec<_> = (0..8)
            .map(|_| {
                let lists = lists.clone();
                tokio::spawn(async move { lists.wait_for(FirstLists::workers).await })
            })
            .collect();
        tokio::task::yield_now().await;
        lists.mark(Watch::TemporalWorkerDeployments);
        lists.mark(Watch::WorkerDeployments);
        for waiter in waiters {
            let woke = tokio::time::timeout(std::time::Duration::from_secs(5), waiter).await;
            assert!(matches!(woke, Ok(Ok(()))), "a waiter was not woken");
        }
    }
}
