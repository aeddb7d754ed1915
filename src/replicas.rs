//! Replicas share Temporal's limits: each replica of an installation keeps a Lease of its own
//! (`coordination.k8s.io/v1`, in the controller's namespace, labelled with the engine task
//! queue) renewed every [`RENEW_EVERY`], and counts the installation's Leases renewed within
//! their duration. That count divides each Temporal namespace's read budget
//! (`--temporal-read-rate` is the installation's total), so two replicas read at most what one
//! did, and a replica that stops (its Lease deleted on shutdown, or expired after a crash)
//! gives its share back within [`LEASE_SECONDS`].
//!
//! A replica that cannot read or write Leases (RBAC without them) keeps the last count it had
//! (one at the start) and says so in a warning.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use twc_activities::metrics::Metrics;
use twc_activities::temporal::budget::Replicas;

/// How often a replica renews its Lease and counts the others.
pub const RENEW_EVERY: Duration = Duration::from_secs(10);
/// How long a Lease counts after its last renewal.
pub const LEASE_SECONDS: i32 = 30;
/// Label of every replica Lease: the installation's engine task queue.
const TASK_QUEUE_LABEL: &str = "twc.temporal.io/replica-of";
const FIELD_MANAGER: &str = "twc-replicas";

/// This replica's Lease: its name, where it lives, the installation it belongs to.
#[derive(Debug, Clone)]
pub struct ReplicaLease {
    /// The controller's namespace.
    pub namespace: String,
    /// `twc-replica-<pod name, or host and process>`.
    pub name: String,
    /// The engine task queue, as a label value.
    pub installation: String,
    /// The controller's identity (`holderIdentity`).
    pub identity: String,
}

impl ReplicaLease {
    /// The Lease of this process: named after `POD_NAME` (the chart sets it), else the host
    /// name and process ID.
    pub fn of_this_process(namespace: &str, task_queue: &str, identity: &str) -> Self {
        let replica = std::env::var("POD_NAME")
            .ok()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| {
                let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .map(|h| h.trim().to_owned())
                    .unwrap_or_default();
                format!("{host}-{}", std::process::id())
            });
        Self {
            namespace: namespace.to_owned(),
            name: dns_label(&format!("twc-replica-{replica}"), 253),
            installation: dns_label(task_queue, 63),
            identity: identity.to_owned(),
        }
    }
}

/// `text` as a DNS-1123 name of at most `max` characters: lower case, runs of anything but
/// letters and digits as one `-`, no `-` at either end.
fn dns_label(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_alphanumeric() {
            out.push(c);
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    let out: String = out.trim_matches('-').chars().take(max).collect();
    let out = out.trim_end_matches('-').to_owned();
    if out.is_empty() {
        "twc".to_owned()
    } else {
        out
    }
}

/// How many of `leases` count at `now`: renewed (or acquired) within their duration.
fn live(leases: &[Lease], now: Timestamp) -> u32 {
    let count = leases
        .iter()
        .filter(|lease| {
            let Some(spec) = lease.spec.as_ref() else {
                return false;
            };
            let Some(renewed) = spec.renew_time.as_ref().or(spec.acquire_time.as_ref()) else {
                return false;
            };
            let seconds = i64::from(spec.lease_duration_seconds.unwrap_or(LEASE_SECONDS));
            renewed.0.as_second().saturating_add(seconds) > now.as_second()
        })
        .count();
    u32::try_from(count).unwrap_or(u32::MAX)
}

/// Renews this replica's Lease and counts the installation's live ones every [`RENEW_EVERY`]
/// until `shutdown`; then deletes the Lease.
pub async fn run(
    kube: kube::Client,
    lease: ReplicaLease,
    replicas: Replicas,
    metrics: std::sync::Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let api: Api<Lease> = Api::namespaced(kube, &lease.namespace);
    let mut ticks = tokio::time::interval(RENEW_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    metrics.replicas(replicas.count());
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            _ = ticks.tick() => {}
        }
        match renew_and_count(&api, &lease).await {
            Ok(count) => {
                if count != replicas.count() {
                    tracing::info!(
                        replicas = count,
                        "live replicas changed: each reads its share of Temporal's limits"
                    );
                }
                replicas.set(count);
                metrics.replicas(replicas.count());
                failing = false;
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(lease = %lease.name, namespace = %lease.namespace, replicas = replicas.count(),
                        "renewing this replica's Lease or counting the others failed; the read budget stays divided by the last count: {e}");
                }
                failing = true;
            }
        }
    }
    if let Err(e) = api.delete(&lease.name, &DeleteParams::default()).await {
        tracing::debug!(lease = %lease.name, "deleting this replica's Lease: {e}");
    }
}

async fn renew_and_count(api: &Api<Lease>, lease: &ReplicaLease) -> Result<u32, kube::Error> {
    let now = Timestamp::now();
    let object = Lease {
        metadata: ObjectMeta {
            name: Some(lease.name.clone()),
            namespace: Some(lease.namespace.clone()),
            labels: Some(
                [
                    (TASK_QUEUE_LABEL.to_owned(), lease.installation.clone()),
                    ("app.kubernetes.io/managed-by".to_owned(), "twc".to_owned()),
                ]
                .into(),
            ),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(lease.identity.clone()),
            lease_duration_seconds: Some(LEASE_SECONDS),
            renew_time: Some(MicroTime(now)),
            ..Default::default()
        }),
    };
    api.patch(
        &lease.name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&object),
    )
    .await?;
    let selector = format!("{TASK_QUEUE_LABEL}={}", lease.installation);
    let leases = api.list(&ListParams::default().labels(&selector)).await?;
    Ok(live(&leases.items, Timestamp::now()).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(renewed_seconds_ago: i64, duration: Option<i32>) -> Lease {
        let now = Timestamp::from_second(1_000_000).unwrap_or(Timestamp::UNIX_EPOCH);
        let renewed = Timestamp::from_second(now.as_second() - renewed_seconds_ago)
            .unwrap_or(Timestamp::UNIX_EPOCH);
        Lease {
            spec: Some(LeaseSpec {
                renew_time: Some(MicroTime(renewed)),
                lease_duration_seconds: duration,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_lease_counts_while_it_is_within_its_duration() {
        let now = Timestamp::from_second(1_000_000).unwrap_or(Timestamp::UNIX_EPOCH);
        // (leases as (renewed seconds ago, duration), live count).
        type Case = (&'static [(i64, Option<i32>)], u32);
        let cases: [Case; 5] = [
            (&[], 0),
            (&[(1, Some(30))], 1),
            (&[(1, Some(30)), (29, Some(30))], 2),
            (&[(1, Some(30)), (30, Some(30)), (300, None)], 1),
            (&[(5, None), (25, None), (31, None)], 2),
        ];
        for (leases, expected) in cases {
            let leases: Vec<Lease> = leases.iter().map(|(ago, d)| lease(*ago, *d)).collect();
            assert_eq!(live(&leases, now), expected, "{leases:?}");
        }
        let unrenewed = Lease::default();
        assert_eq!(live(&[unrenewed], now), 0, "no times, not live");
    }

    #[test]
    fn lease_names_are_dns_names() {
        let cases = [
            ("twc-replica-twc-7d9f-abc12", "twc-replica-twc-7d9f-abc12"),
            (
                "twc-replica-My_Host.local-4242",
                "twc-replica-my-host-local-4242",
            ),
            ("--x--", "x"),
            ("", "twc"),
        ];
        for (text, expected) in cases {
            assert_eq!(dns_label(text, 253), expected, "{text:?}");
        }
        assert_eq!(dns_label("twc-engine-queue-", 63), "twc-engine-queue");
        assert_eq!(dns_label(&"a".repeat(70), 63).len(), 63);
    }
}
