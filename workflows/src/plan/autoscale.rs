//! Backlog-driven replicas of each version (`spec.autoscaling`). Pure: the TWD workflow reads
//! the backlogs (`read_backlog`), asks [`plan`] and applies the changes it returns.
//!
//! Roles come from Temporal's routing: the Current and the Ramping version share one total
//! sized from their combined backlog (the Ramping one holds its ramp's share, rounded up, at
//! least one), and each Draining version is sized from its own backlog. Every recommendation is
//! remembered for the longer of the two stabilization windows: a higher count is applied once
//! every recommendation of the scale-up window asked for at least it, a lower one once none of
//! the scale-down window asked for more (the count in force when scaling began counts as a
//! recommendation, so a new version does not jump before its window). Versions whose backlog
//! could not be read are left as they are.

use serde::{Deserialize, Serialize};
use twc_crds::worker_deployment::VersionState;

use crate::contract::VersionBacklog;
use crate::model::{AutoscalePolicy, BacklogTarget, Observation, UnixMillis};

/// Look again this soon while any version has a backlog or a change is held by its window.
pub const BUSY_READ_MS: i64 = 5_000;
/// Look again this late when everything is idle and settled.
pub const IDLE_READ_MS: i64 = 30_000;
/// Memory key of the Current and Ramping versions' shared total.
const ACTIVE: &str = "";

/// What the autoscaler remembers between reads.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AutoscaleMemory {
    /// One entry for the active total (empty key) and one per Draining version.
    pub series: Vec<Series>,
    /// When to read the backlogs again.
    pub next_read_at: Option<UnixMillis>,
}

/// Recommendations for one total, with the count applied.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Series {
    /// Empty for the active total, else the Draining version's build ID.
    pub key: String,
    /// The count in force.
    pub applied: u32,
    /// `(time, recommended count)`, oldest first, within the longer window.
    pub recommendations: Vec<(UnixMillis, u32)>,
}

/// A version's role for scaling.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Role {
    /// Temporal's Current version.
    Current,
    /// The Ramping version, at this percentage.
    Ramping(f32),
    /// Out of routing with pinned workflows open.
    Draining,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Self::Current => "Current",
            Self::Ramping(_) => "Ramping",
            Self::Draining => "Draining",
        }
    }
}

/// A version the autoscaler sizes: its role and Deployment.
#[derive(Debug, Clone, PartialEq)]
pub struct Scaled {
    /// Build ID.
    pub build_id: String,
    /// Role.
    pub role: Role,
    /// Its Deployment.
    pub deployment: String,
    /// The Deployment's replicas now (`None`: unset).
    pub replicas: Option<i32>,
}

/// A Deployment to scale, with the numbers behind it (the event message).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScaleChange {
    /// Build ID.
    pub build_id: String,
    /// Deployment name.
    pub deployment: String,
    /// Replicas now.
    pub from: Option<i32>,
    /// Replicas wanted.
    pub to: i32,
    /// Why, in words.
    pub message: String,
}

/// The outcome of one plan.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AutoscalePlan {
    /// Deployments to scale.
    pub changes: Vec<ScaleChange>,
    /// Updated memory.
    pub memory: AutoscaleMemory,
}

/// The versions the autoscaler sizes: Temporal's Current and Ramping versions and Draining
/// ones, each with a live Deployment. Nothing while Temporal cannot be read.
pub fn scaled_versions(observation: &Observation) -> Vec<Scaled> {
    let Ok(temporal) = &observation.temporal else {
        return Vec::new();
    };
    let current = temporal
        .current_build_id
        .as_deref()
        .filter(|c| !c.is_empty());
    let ramping = temporal
        .ramping_build_id
        .as_deref()
        .filter(|r| !r.is_empty());
    observation
        .deployments
        .iter()
        .filter(|d| !d.deleting)
        .filter_map(|d| {
            let role = if Some(d.build_id.as_str()) == ramping {
                Role::Ramping(temporal.ramp_percentage.unwrap_or(0.0))
            } else if Some(d.build_id.as_str()) == current {
                Role::Current
            } else if temporal
                .version(&d.build_id)
                .is_some_and(|v| v.state == VersionState::Draining)
            {
                Role::Draining
            } else {
                return None;
            };
            Some(Scaled {
                build_id: d.build_id.clone(),
                role,
                deployment: d.name.clone(),
                replicas: d.replicas,
            })
        })
        .collect()
}

/// Whether the backlogs should be read now.
pub fn due(memory: &AutoscaleMemory, now: UnixMillis) -> bool {
    memory.next_read_at.is_none_or(|at| now >= at)
}

/// Replicas that `backlog` asks for, given `replicas` in force (before bounds).
fn wanted(target: BacklogTarget, backlog: &VersionBacklog, replicas: u32) -> u32 {
    match target {
        BacklogTarget::PerReplica(per) => {
            u32::try_from(backlog.backlog.div_ceil(per.max(1))).unwrap_or(u32::MAX)
        }
        BacklogTarget::AgeMs(age) if backlog.backlog_age_ms > 0 => {
            let scaled = (f64::from(replicas.max(1)) * backlog.backlog_age_ms as f64
                / age.max(1) as f64)
                .ceil();
            if scaled >= f64::from(u32::MAX) {
                u32::MAX
            } else {
                scaled as u32
            }
        }
        BacklogTarget::AgeMs(_) => 0,
    }
}

fn target_text(target: BacklogTarget) -> String {
    match target {
        BacklogTarget::PerReplica(per) => format!("target {per} waiting tasks per replica"),
        BacklogTarget::AgeMs(ms) => format!("target oldest waiting task {}s", ms / 1000),
    }
}

impl Series {
    /// Records `desired` at `now` and returns the count to apply under the windows.
    fn stabilize(&mut self, desired: u32, now: UnixMillis, up_ms: i64, down_ms: i64) -> u32 {
        let keep_from = now.saturating_sub(up_ms.max(down_ms));
        self.recommendations.retain(|(at, _)| *at >= keep_from);
        self.recommendations.push((now, desired));
        let within = |window: i64| {
            let from = now.saturating_sub(window);
            self.recommendations
                .iter()
                .filter(move |(at, _)| *at >= from)
                .map(|(_, r)| *r)
        };
        let next = if desired > self.applied {
            within(up_ms).min().unwrap_or(desired).max(self.applied)
        } else if desired < self.applied {
            within(down_ms).max().unwrap_or(desired).min(self.applied)
        } else {
            self.applied
        };
        self.applied = next;
        next
    }
}

fn series<'a>(
    memory: &'a mut AutoscaleMemory,
    key: &str,
    applied: u32,
    now: UnixMillis,
) -> &'a mut Series {
    let index = match memory.series.iter().position(|s| s.key == key) {
        Some(index) => index,
        None => {
            // What is in force counts as a recommendation made just before: a change waits
            // for its window (a zero window applies it at once).
            memory.series.push(Series {
                key: key.to_owned(),
                applied,
                recommendations: vec![(now.saturating_sub(1), applied)],
            });
            memory.series.len() - 1
        }
    };
    &mut memory.series[index]
}

/// Plans the replicas of `versions` from their `backlogs` at `now`.
pub fn plan(
    policy: &AutoscalePolicy,
    versions: &[Scaled],
    backlogs: &[VersionBacklog],
    memory: &AutoscaleMemory,
    now: UnixMillis,
) -> AutoscalePlan {
    let mut memory = memory.clone();
    let mut changes = Vec::new();
    let backlog_of = |build: &str| backlogs.iter().find(|b| b.build_id == build);
    let replicas_of = |v: &Scaled| u32::try_from(v.replicas.unwrap_or(1).max(0)).unwrap_or(0);
    let mut busy = false;

    // The Current and Ramping versions: one total.
    let active: Vec<&Scaled> = versions
        .iter()
        .filter(|v| matches!(v.role, Role::Current | Role::Ramping(_)))
        .collect();
    let readable = policy.shared_total
        || active
            .iter()
            .all(|v| backlog_of(&v.build_id).is_some_and(|b| b.error.is_none()));
    if !active.is_empty() && readable {
        let in_force: u32 = active.iter().map(|v| replicas_of(v)).sum();
        let mut combined = VersionBacklog::default();
        for b in active.iter().filter_map(|v| backlog_of(&v.build_id)) {
            combined.backlog += b.backlog;
            combined.backlog_age_ms = combined.backlog_age_ms.max(b.backlog_age_ms);
        }
        let desired = if policy.shared_total {
            policy.max_replicas
        } else {
            wanted(policy.target, &combined, in_force)
                .clamp(policy.min_replicas, policy.max_replicas)
        };
        let applied_before = in_force.clamp(policy.min_replicas, policy.max_replicas);
        let total = series(&mut memory, ACTIVE, applied_before, now).stabilize(
            desired,
            now,
            policy.up_window_ms,
            policy.down_window_ms,
        );
        busy |= combined.backlog > 0 || desired != total;
        let ramping = active.iter().find_map(|v| match v.role {
            Role::Ramping(pct) => Some((*v, pct)),
            _ => None,
        });
        let ramp_share = ramping.map_or(0, |(_, pct)| {
            let share = (f64::from(total) * f64::from(pct) / 100.0).ceil() as u32;
            share.clamp(1, total.saturating_sub(1).max(1))
        });
        let why = if policy.shared_total {
            format!(
                "spec.replicas {total} shared by the Current and Ramping versions (replicasMode Shared)"
            )
        } else {
            format!(
                "backlog {} (oldest {}s) on the Current and Ramping versions, {}; total {total} of {}..{}",
                combined.backlog,
                combined.backlog_age_ms / 1000,
                target_text(policy.target),
                policy.min_replicas,
                policy.max_replicas
            )
        };
        for v in &active {
            let to = match v.role {
                // A total of zero (scaled to zero through `/scale`) stops every version.
                _ if total == 0 => 0,
                Role::Ramping(_) => ramp_share,
                _ => total.saturating_sub(ramp_share).max(1),
            };
            push_change(&mut changes, v, to, &why);
        }
    }

    // Each Draining version: its own backlog (left alone with a shared fixed total).
    let draining = versions
        .iter()
        .filter(|v| v.role == Role::Draining && !policy.shared_total);
    for v in draining {
        let Some(backlog) = backlog_of(&v.build_id).filter(|b| b.error.is_none()) else {
            continue;
        };
        let in_force = replicas_of(v);
        let mut desired = wanted(policy.target, backlog, in_force)
            .clamp(policy.draining_min, policy.draining_max);
        if backlog.backlog > 0 {
            // Work for a version at zero revives it.
            desired = desired.max(1);
        }
        let applied_before = in_force.clamp(policy.draining_min, policy.draining_max);
        let series = series(&mut memory, &v.build_id, applied_before, now);
        let mut to = series.stabilize(desired, now, policy.up_window_ms, policy.down_window_ms);
        if to == 0 && backlog.backlog > 0 {
            // Nobody serves the work waiting for it: revived at once, not after the window.
            to = 1;
            series.applied = 1;
        }
        busy |= backlog.backlog > 0 || desired != to;
        let why = format!(
            "backlog {} (oldest {}s) on Draining version {}, {}; bounds {}..{}",
            backlog.backlog,
            backlog.backlog_age_ms / 1000,
            v.build_id,
            target_text(policy.target),
            policy.draining_min,
            policy.draining_max
        );
        push_change(&mut changes, v, to, &why);
    }

    // Forget versions no longer scaled here.
    memory.series.retain(|s| {
        s.key == ACTIVE
            || versions
                .iter()
                .any(|v| v.build_id == s.key && v.role == Role::Draining)
    });
    memory.next_read_at = Some(now.saturating_add(if busy { BUSY_READ_MS } else { IDLE_READ_MS }));
    AutoscalePlan { changes, memory }
}

fn push_change(changes: &mut Vec<ScaleChange>, v: &Scaled, to: u32, why: &str) {
    let to = i32::try_from(to).unwrap_or(i32::MAX);
    if v.replicas == Some(to) {
        return;
    }
    let from = v
        .replicas
        .map_or_else(|| "unset".to_owned(), |r| r.to_string());
    changes.push(ScaleChange {
        build_id: v.build_id.clone(),
        deployment: v.deployment.clone(),
        from: v.replicas,
        to,
        message: format!(
            "Scaled Deployment {} ({} version {}) from {from} to {to} replicas: {why}",
            v.deployment,
            v.role.name(),
            v.build_id
        ),
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: i64 = 1000;

    fn policy() -> AutoscalePolicy {
        AutoscalePolicy {
            min_replicas: 1,
            max_replicas: 6,
            target: BacklogTarget::PerReplica(10),
            up_window_ms: 10 * SEC,
            down_window_ms: 30 * SEC,
            draining_min: 0,
            draining_max: 2,
            shared_total: false,
        }
    }

    fn version(build: &str, role: Role, replicas: i32) -> Scaled {
        Scaled {
            build_id: build.to_owned(),
            role,
            deployment: format!("hello-{build}"),
            replicas: Some(replicas),
        }
    }

    fn backlog(build: &str, waiting: u64) -> VersionBacklog {
        VersionBacklog {
            build_id: build.to_owned(),
            backlog: waiting,
            backlog_age_ms: if waiting > 0 { 3 * SEC } else { 0 },
            ..VersionBacklog::default()
        }
    }

    fn targets(plan: &AutoscalePlan) -> Vec<(String, i32)> {
        plan.changes
            .iter()
            .map(|c| (c.build_id.clone(), c.to))
            .collect()
    }

    /// Runs reads every 5 s of the given backlogs for Current `v1` starting at 1 replica,
    /// applying each change; returns the replicas after each read.
    fn run(policy: &AutoscalePolicy, waiting: &[u64]) -> Vec<i32> {
        let mut replicas = 1;
        let mut memory = AutoscaleMemory::default();
        let mut seen = Vec::new();
        for (i, w) in waiting.iter().enumerate() {
            let now = i as i64 * 5 * SEC;
            let plan = plan(
                policy,
                &[version("v1", Role::Current, replicas)],
                &[backlog("v1", *w)],
                &memory,
                now,
            );
            if let Some(change) = plan.changes.first() {
                replicas = change.to;
            }
            memory = plan.memory;
            seen.push(replicas);
        }
        seen
    }

    #[test]
    fn a_backlog_scales_up_after_its_window_and_down_after_the_longer_one() {
        // 45 waiting → 5 replicas, held until 10 s of recommendations agree; then idle → back
        // to 1 only once 30 s of recommendations agree.
        let waiting = [45, 45, 45, 45, 0, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(
            run(&policy(), &waiting),
            vec![1, 1, 5, 5, 5, 5, 5, 5, 5, 5, 1, 1]
        );
    }

    #[test]
    fn bounds_and_targets_decide_the_count() {
        let cases: [(&str, BacklogTarget, u64, i64, u32, i32); 5] = [
            (
                "per replica, rounded up",
                BacklogTarget::PerReplica(10),
                21,
                0,
                1,
                3,
            ),
            (
                "capped at maxReplicas",
                BacklogTarget::PerReplica(10),
                500,
                0,
                1,
                6,
            ),
            (
                "idle: minReplicas",
                BacklogTarget::PerReplica(10),
                0,
                0,
                3,
                2,
            ),
            (
                "age twice the target doubles",
                BacklogTarget::AgeMs(5 * SEC),
                8,
                10 * SEC,
                2,
                4,
            ),
            (
                "age below target shrinks",
                BacklogTarget::AgeMs(10 * SEC),
                8,
                5 * SEC,
                4,
                2,
            ),
        ];
        for (name, target, waiting, age, replicas, expected) in cases {
            let policy = AutoscalePolicy {
                target,
                up_window_ms: 0,
                down_window_ms: 0,
                min_replicas: 2,
                ..policy()
            };
            let b = VersionBacklog {
                backlog_age_ms: age,
                ..backlog("v1", waiting)
            };
            let plan = plan(
                &policy,
                &[version(
                    "v1",
                    Role::Current,
                    i32::try_from(replicas).unwrap_or(1),
                )],
                &[b],
                &AutoscaleMemory::default(),
                0,
            );
            let got = plan
                .changes
                .first()
                .map_or(i32::try_from(replicas).unwrap_or(0), |c| c.to);
            assert_eq!(got, expected, "{name}");
        }
    }

    #[test]
    fn a_ramping_version_holds_its_share_and_takes_all_at_promotion() {
        let policy = AutoscalePolicy {
            up_window_ms: 0,
            down_window_ms: 0,
            min_replicas: 6,
            max_replicas: 10,
            ..policy()
        };
        let versions = [
            version("v1", Role::Current, 5),
            version("v2", Role::Ramping(20.0), 1),
        ];
        let plan = plan(
            &policy,
            &versions,
            &[backlog("v1", 0), backlog("v2", 0)],
            &AutoscaleMemory::default(),
            0,
        );
        // Idle: the minimum, 6; 20 % of 6 rounded up is 2, Current 4.
        assert_eq!(
            targets(&plan),
            vec![("v1".to_owned(), 4), ("v2".to_owned(), 2)]
        );
        // Promoted: v2 Current alone keeps the total.
        let promoted = [
            version("v2", Role::Current, 2),
            version("v1", Role::Draining, 4),
        ];
        let after = super::plan(
            &policy,
            &promoted,
            &[backlog("v2", 0), backlog("v1", 0)],
            &plan.memory,
            5 * SEC,
        );
        assert!(
            targets(&after).contains(&("v2".to_owned(), 6)),
            "{:?}",
            after.changes
        );
        assert!(
            targets(&after).contains(&("v1".to_owned(), 0)),
            "{:?}",
            after.changes
        );
        // A 1 % ramp still gets one replica.
        let tiny = [
            version("v1", Role::Current, 6),
            version("v2", Role::Ramping(1.0), 0),
        ];
        let plan = super::plan(
            &policy,
            &tiny,
            &[backlog("v1", 0), backlog("v2", 0)],
            &AutoscaleMemory::default(),
            0,
        );
        assert!(
            targets(&plan).contains(&("v2".to_owned(), 1)),
            "{:?}",
            plan.changes
        );
    }

    #[test]
    fn a_draining_version_at_zero_is_revived_by_work_and_goes_back_after_its_window() {
        let policy = policy();
        let mut memory = AutoscaleMemory::default();
        let mut replicas = 0;
        let mut seen = Vec::new();
        let waiting = [0, 3, 3, 3, 0, 0, 0, 0, 0, 0, 0, 0];
        for (i, w) in waiting.iter().enumerate() {
            let now = i as i64 * 5 * SEC;
            let versions = [
                version("v1", Role::Current, 1),
                version("v0", Role::Draining, replicas),
            ];
            let plan = plan(
                &policy,
                &versions,
                &[backlog("v1", 0), backlog("v0", *w)],
                &memory,
                now,
            );
            if let Some(c) = plan.changes.iter().find(|c| c.build_id == "v0") {
                replicas = c.to;
            }
            memory = plan.memory;
            seen.push(replicas);
        }
        // Revived at the first read that sees work, down again once 30 s of reads saw none.
        assert_eq!(seen, vec![0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0]);
    }

    #[test]
    fn an_unreadable_backlog_changes_nothing_and_reads_are_paced() {
        let policy = policy();
        let mut unreadable = backlog("v1", 0);
        unreadable.error = Some("rate limited".into());
        let plan = plan(
            &policy,
            &[version("v1", Role::Current, 3)],
            &[unreadable],
            &AutoscaleMemory::default(),
            0,
        );
        assert!(plan.changes.is_empty());
        assert_eq!(plan.memory.next_read_at, Some(IDLE_READ_MS));
        let busy = super::plan(
            &policy,
            &[version("v1", Role::Current, 1)],
            &[backlog("v1", 50)],
            &AutoscaleMemory::default(),
            0,
        );
        assert_eq!(busy.memory.next_read_at, Some(BUSY_READ_MS));
        assert!(due(&busy.memory, BUSY_READ_MS) && !due(&busy.memory, BUSY_READ_MS - 1));
    }

    #[test]
    fn a_shared_total_is_split_by_ramp_without_backlogs() {
        let policy = AutoscalePolicy {
            min_replicas: 6,
            max_replicas: 6,
            up_window_ms: 0,
            down_window_ms: 0,
            draining_min: 0,
            draining_max: 0,
            shared_total: true,
            ..policy()
        };
        let versions = [
            version("v1", Role::Current, 6),
            version("v2", Role::Ramping(20.0), 6),
            version("v0", Role::Draining, 3),
        ];
        let plan = plan(&policy, &versions, &[], &AutoscaleMemory::default(), 0);
        // 20 % of 6 rounded up is 2; the Draining version keeps its pods.
        assert_eq!(
            targets(&plan),
            vec![("v1".to_owned(), 4), ("v2".to_owned(), 2)]
        );
        assert!(
            plan.changes[0].message.contains("replicasMode Shared"),
            "{}",
            plan.changes[0].message
        );
        let zero = AutoscalePolicy {
            min_replicas: 0,
            max_replicas: 0,
            ..policy
        };
        let stopped = super::plan(&zero, &versions[..2], &[], &AutoscaleMemory::default(), 0);
        assert_eq!(
            targets(&stopped),
            vec![("v1".to_owned(), 0), ("v2".to_owned(), 0)]
        );
    }

    #[test]
    fn the_event_message_has_the_numbers() {
        let plan = plan(
            &AutoscalePolicy {
                up_window_ms: 0,
                ..policy()
            },
            &[version("v1", Role::Current, 1)],
            &[backlog("v1", 35)],
            &AutoscaleMemory::default(),
            0,
        );
        let message = &plan.changes[0].message;
        assert!(
            message.contains("from 1 to 4")
                && message.contains("backlog 35")
                && message.contains("10 waiting tasks per replica"),
            "{message}"
        );
    }
}
