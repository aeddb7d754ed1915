//! Retiring versions that lost their traffic (reference §3.5 deprecated rows and §3.10, with
//! SPEC §4.6's changes: Temporal versions are deleted too, Inactive superseded versions are
//! deleted after `deleteDelay`, a just-demoted version waits for a known drainage status).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use twc_crds::worker_deployment::VersionState;

use crate::contract::DrainAction;
use crate::model::{
    DeploymentView, Observation, SpecView, TemporalState, TemporalVersion, UnixMillis,
};
use crate::plan::drain::{self, DrainMemory, DrainStep};

/// How often to look again while a retired version drains or awaits its drainage status.
/// Temporal refreshes drainage every few minutes, so polling faster gains nothing.
pub const DRAINAGE_RECHECK_INTERVAL_MS: i64 = 30_000;

/// Default number of retired versions not yet eligible for deletion above which no new version
/// is created (reference §3.11: 75% of Temporal's default 100-version cap).
pub const DEFAULT_MAX_VERSIONS_INELIGIBLE_FOR_DELETION: usize = 75;

/// What the TWD workflow remembers about a version it is retiring.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SunsetMemory {
    /// Build ID.
    pub build_id: String,
    /// When the engine first saw it as neither target nor current.
    pub retired_at: UnixMillis,
    /// When its Deployment was scaled to zero by the sunset.
    pub scaled_down_at: Option<UnixMillis>,
    /// Its drain so far (absent in memory carried from before drains existed).
    #[serde(default)]
    pub drain: DrainMemory,
}

/// One sunset action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SunsetAction {
    /// Scale the version's Deployment to zero.
    ScaleToZero {
        /// Build ID.
        build_id: String,
        /// Deployment name.
        deployment: String,
    },
    /// Delete the version's Deployment.
    DeleteDeployment {
        /// Build ID.
        build_id: String,
        /// Deployment name.
        deployment: String,
    },
    /// Delete the version from Temporal.
    DeleteVersion {
        /// Build ID.
        build_id: String,
    },
    /// Count the open workflows pinned to the version (drain policy set).
    CountPinned {
        /// Build ID.
        build_id: String,
    },
    /// A step of the version's drain (`spec.sunset.drain`).
    Drain {
        /// Build ID.
        build_id: String,
        /// Which step.
        step: DrainStep,
        /// What it does.
        action: DrainAction,
    },
}

/// The sunset plan for now.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SunsetPlan {
    /// Actions to take now.
    pub actions: Vec<SunsetAction>,
    /// Updated memory (entries for versions still being retired).
    pub memory: Vec<SunsetMemory>,
    /// When to look again (earliest pending delay, or a drainage re-check), if ever.
    pub next_check_at: Option<UnixMillis>,
}

/// Plans the retirement of every version that is neither the target nor Current.
///
/// Per retired Deployment (the target, Temporal's Current and Ramping builds, and Deployments
/// being deleted are never touched):
/// - Drained: scale to zero once `scaledownDelay` has passed since it drained;
/// - Draining, or just out of routing with no drainage status yet: wait (bug #573);
/// - Inactive and never in routing (superseded before promotion): scale to zero at once;
/// - unknown to Temporal (NotRegistered): scale to zero at once, unless Temporal has no worker
///   deployment at all (its state may be lost or not created yet, as the Go controller);
/// - at zero replicas for `deleteDelay`: delete the Deployment and the Temporal version.
///
/// A version whose Deployment is gone but which Temporal still lists is deleted again on later
/// plans (deletion can be refused while pollers linger). Nothing is done while Temporal cannot
/// be read; everything is dropped when the TWD is gone or being deleted (its own clean-up
/// deletes all versions).
pub fn plan(observation: &Observation, memory: &[SunsetMemory], now: UnixMillis) -> SunsetPlan {
    let Some(spec) = observation.spec.as_ref().filter(|s| !s.deleting) else {
        return SunsetPlan::default();
    };
    let temporal = match &observation.temporal {
        Ok(temporal) => temporal,
        Err(_) => {
            return SunsetPlan {
                actions: Vec::new(),
                memory: memory.to_vec(),
                next_check_at: Some(now.saturating_add(DRAINAGE_RECHECK_INTERVAL_MS)),
            };
        }
    };
    let mut planner = Planner {
        now,
        spec,
        temporal,
        plan: SunsetPlan::default(),
    };

    for deployment in observation
        .deployments
        .iter()
        .filter(|d| !d.deleting && !is_active(spec, temporal, &d.build_id))
    {
        let remembered = find(&planner.plan.memory, &deployment.build_id)
            .or_else(|| find(memory, &deployment.build_id))
            .cloned()
            .unwrap_or_else(|| SunsetMemory {
                build_id: deployment.build_id.clone(),
                retired_at: now,
                scaled_down_at: None,
                drain: DrainMemory::default(),
            });
        let updated = planner.retire(deployment, remembered);
        planner.remember(updated);
    }

    for entry in memory {
        let has_deployment = observation.deployment(&entry.build_id).is_some();
        if has_deployment || is_active(spec, temporal, &entry.build_id) {
            continue;
        }
        if registered(temporal, &entry.build_id).is_some() {
            planner.retry_version_deletion(entry);
        }
    }

    planner
        .plan
        .memory
        .sort_by(|a, b| a.build_id.cmp(&b.build_id));
    planner.plan
}

/// `memory` with an entry for every version Temporal lists that nothing else would retire: not
/// the target, not Current or Ramping, without a Deployment and not remembered. Such a version
/// is left behind when its Deployment went away first: a superseded rollout's routing write
/// that landed late made it Current after its sunset, or its Deployment was deleted by hand.
/// It is taken as retired and scaled down now, so [`plan`] deletes it after the delete delay.
/// Unchanged while Temporal is unreadable or the TWD is gone or being deleted.
pub fn adopt_orphans(
    observation: &Observation,
    memory: &[SunsetMemory],
    now: UnixMillis,
) -> Vec<SunsetMemory> {
    let mut adopted = memory.to_vec();
    let (Some(spec), Ok(temporal)) = (
        observation.spec.as_ref().filter(|s| !s.deleting),
        observation.temporal.as_ref(),
    ) else {
        return adopted;
    };
    for version in &temporal.versions {
        let build = version.build_id.as_str();
        let orphan = version.state != VersionState::NotRegistered
            && !is_active(spec, temporal, build)
            && observation.deployment(build).is_none()
            && find(memory, build).is_none();
        if orphan {
            adopted.push(SunsetMemory {
                build_id: build.to_owned(),
                retired_at: now,
                scaled_down_at: Some(now),
                drain: DrainMemory::default(),
            });
        }
    }
    adopted
}

/// Whether so many retired versions are not yet eligible for deletion that creating another
/// version could hit Temporal's version cap (reference §3.11). False while Temporal is unreadable.
pub fn version_limit_reached(observation: &Observation, max_ineligible: usize) -> bool {
    let (Some(spec), Ok(temporal)) = (observation.spec.as_ref(), observation.temporal.as_ref())
    else {
        return false;
    };
    let ineligible: BTreeSet<&str> = observation
        .deployments
        .iter()
        .filter(|d| !d.deleting && !is_active(spec, temporal, &d.build_id))
        .filter(|d| !eligible_for_deletion(temporal.version(&d.build_id), d))
        .map(|d| d.build_id.as_str())
        .collect();
    ineligible.len() >= max_ineligible
}

/// Whether an earlier observation shows room for a new build's Deployment under
/// `max_ineligible`, so it can be created without reading Temporal and the TWD again: the
/// observation read both, and stays below the limit even when the build it saw targeted becomes
/// ineligible once the target moves on. Only the TWD's own rollouts add Deployments and a
/// version only becomes more eligible over time, so an older observation errs on the safe side.
pub fn room_for_a_new_version(observation: &Observation, max_ineligible: usize) -> bool {
    observation.spec.is_some()
        && observation.temporal.is_ok()
        && !version_limit_reached(observation, max_ineligible.saturating_sub(1))
}

/// A retired version may be deleted: Temporal reports it Drained and no pod of it is running
/// (reference §1.1.2 `eligibleForDeletion`). Versions unknown to Temporal never are.
pub fn eligible_for_deletion(
    version: Option<&TemporalVersion>,
    deployment: &DeploymentView,
) -> bool {
    version.is_some_and(|v| v.state == VersionState::Drained) && deployment.status_replicas == 0
}

/// The target, or a build Temporal routes new work to.
fn is_active(spec: &SpecView, temporal: &TemporalState, build_id: &str) -> bool {
    build_id == spec.target_build_id
        || temporal.current_build_id.as_deref() == Some(build_id)
        || temporal.ramping_build_id.as_deref() == Some(build_id)
}

fn registered<'a>(temporal: &'a TemporalState, build_id: &str) -> Option<&'a TemporalVersion> {
    temporal
        .version(build_id)
        .filter(|v| v.state != VersionState::NotRegistered)
}

fn find<'a>(memory: &'a [SunsetMemory], build_id: &str) -> Option<&'a SunsetMemory> {
    memory.iter().find(|m| m.build_id == build_id)
}

/// When a retired version's Deployment may be scaled to zero, if that is known yet.
enum ScaleDown {
    /// From this time on.
    At(UnixMillis),
    /// Not until Temporal reports the version Drained: look again later.
    AwaitDrainage,
    /// Never decided here (Temporal does not know the worker deployment yet).
    Never,
}

struct Planner<'a> {
    now: UnixMillis,
    spec: &'a SpecView,
    temporal: &'a TemporalState,
    plan: SunsetPlan,
}

impl Planner<'_> {
    fn retire(&mut self, deployment: &DeploymentView, mut memory: SunsetMemory) -> SunsetMemory {
        let version = registered(self.temporal, &deployment.build_id);
        self.drain(version, &memory);
        let scale_down = self.scale_down(version, &memory);
        let build_id = deployment.build_id.clone();

        if deployment.replicas != Some(0) {
            match scale_down {
                ScaleDown::At(at) if self.now >= at => {
                    self.plan.actions.push(SunsetAction::ScaleToZero {
                        build_id,
                        deployment: deployment.name.clone(),
                    });
                    memory.scaled_down_at = Some(self.now);
                    self.check_at(self.now.saturating_add(self.spec.delete_delay_ms));
                }
                ScaleDown::At(at) => self.check_at(at),
                ScaleDown::AwaitDrainage => {
                    self.check_at(self.now.saturating_add(DRAINAGE_RECHECK_INTERVAL_MS))
                }
                ScaleDown::Never => {}
            }
            return memory;
        }

        // At zero already: by this sunset, or by someone else (then the clock starts now).
        if matches!(scale_down, ScaleDown::AwaitDrainage | ScaleDown::Never) {
            if matches!(scale_down, ScaleDown::AwaitDrainage) {
                self.check_at(self.now.saturating_add(DRAINAGE_RECHECK_INTERVAL_MS));
            }
            return memory;
        }
        let scaled_down_at = *memory.scaled_down_at.get_or_insert(self.now);
        let delete_at = scaled_down_at.saturating_add(self.spec.delete_delay_ms);
        if self.now < delete_at {
            self.check_at(delete_at);
            return memory;
        }
        self.plan.actions.push(SunsetAction::DeleteDeployment {
            build_id: build_id.clone(),
            deployment: deployment.name.clone(),
        });
        if version.is_some() {
            self.plan
                .actions
                .push(SunsetAction::DeleteVersion { build_id });
            self.check_at(self.now.saturating_add(DRAINAGE_RECHECK_INTERVAL_MS));
        }
        memory
    }

    fn scale_down(&self, version: Option<&TemporalVersion>, memory: &SunsetMemory) -> ScaleDown {
        let Some(version) = version else {
            return if self.temporal.exists {
                ScaleDown::At(memory.retired_at)
            } else {
                ScaleDown::Never
            };
        };
        match version.state {
            VersionState::Drained => ScaleDown::At(
                version
                    .drained_since
                    .unwrap_or(memory.retired_at)
                    .saturating_add(self.spec.scaledown_delay_ms),
            ),
            VersionState::Inactive if just_left_routing(version) => ScaleDown::AwaitDrainage,
            VersionState::Inactive | VersionState::NotRegistered => {
                ScaleDown::At(memory.retired_at)
            }
            // Draining keeps its pods for its pinned workflows; Current/Ramping here means the
            // routing read and the version list disagree: wait for them to agree.
            VersionState::Draining | VersionState::Current | VersionState::Ramping => {
                ScaleDown::AwaitDrainage
            }
        }
    }

    /// Plans the drain steps of a retired version under the TWD's drain policy, if any.
    fn drain(&mut self, version: Option<&TemporalVersion>, memory: &SunsetMemory) {
        let (Some(policy), Some(version)) = (self.spec.drain.as_ref(), version) else {
            return;
        };
        let plan = drain::plan(
            policy,
            &memory.build_id,
            version.state,
            self.temporal.current_build_id.as_deref(),
            memory.retired_at,
            &memory.drain,
            self.now,
        );
        if plan.count {
            self.plan.actions.push(SunsetAction::CountPinned {
                build_id: memory.build_id.clone(),
            });
        }
        for (step, action) in plan.due {
            self.plan.actions.push(SunsetAction::Drain {
                build_id: memory.build_id.clone(),
                step,
                action,
            });
        }
        if let Some(at) = plan.check_at {
            self.check_at(at);
        }
    }

    /// Deletes a version whose Deployment is gone once its delete delay has passed, again on
    /// every plan until Temporal no longer lists it.
    fn retry_version_deletion(&mut self, entry: &SunsetMemory) {
        let Some(scaled_down_at) = entry.scaled_down_at else {
            return;
        };
        let delete_at = scaled_down_at.saturating_add(self.spec.delete_delay_ms);
        if self.now >= delete_at {
            self.plan.actions.push(SunsetAction::DeleteVersion {
                build_id: entry.build_id.clone(),
            });
            self.check_at(self.now.saturating_add(DRAINAGE_RECHECK_INTERVAL_MS));
        } else {
            self.check_at(delete_at);
        }
        self.remember(entry.clone());
    }

    fn remember(&mut self, entry: SunsetMemory) {
        match self
            .plan
            .memory
            .iter_mut()
            .find(|m| m.build_id == entry.build_id)
        {
            Some(existing) => *existing = entry,
            None => self.plan.memory.push(entry),
        }
    }

    fn check_at(&mut self, at: UnixMillis) {
        self.plan.next_check_at = Some(self.plan.next_check_at.map_or(at, |next| next.min(at)));
    }
}

/// An Inactive version that was Current or Ramping and whose drainage status Temporal has not
/// computed yet (it maps UNSPECIFIED drainage to Inactive). Scaling it down would strand its
/// pinned workflows (Go controller bug #573).
fn just_left_routing(version: &TemporalVersion) -> bool {
    version.last_current_at.is_some()
        || (version.deactivated_at.is_some() && !version.drainage_known)
}

#[cfg(test)]
mod tests {
    use twc_crds::worker_deployment::RolloutStrategy;

    use super::*;
    use crate::model::{BlockReason, Blocked};
    use crate::plan::fixtures::*;

    /// The retired build of these tests.
    const RETIRED: &str = "v0-rrrrrrrrrr";
    const HOUR: i64 = secs(3600);
    const DAY: i64 = 24 * HOUR;
    const RECHECK: i64 = DRAINAGE_RECHECK_INTERVAL_MS;

    /// NEW targeted and ramping nowhere, OLD Current, RETIRED as given.
    fn with_retired(
        retired_version: Option<TemporalVersion>,
        retired_deployment: DeploymentView,
    ) -> Observation {
        let mut temporal = temporal_with_old_current();
        temporal.versions.push(version(NEW, VersionState::Inactive));
        temporal.versions.extend(retired_version);
        observation(
            spec(RolloutStrategy::AllAtOnce),
            vec![deployment(NEW), deployment(OLD), retired_deployment],
            temporal,
        )
    }

    fn drained(since: UnixMillis) -> Option<TemporalVersion> {
        Some(TemporalVersion {
            drained_since: Some(since),
            last_current_at: Some(since - HOUR),
            deactivated_at: Some(since - HOUR),
            ..version(RETIRED, VersionState::Drained)
        })
    }

    fn state(
        state: VersionState,
        edit: impl FnOnce(&mut TemporalVersion),
    ) -> Option<TemporalVersion> {
        let mut version = version(RETIRED, state);
        edit(&mut version);
        Some(version)
    }

    fn up() -> DeploymentView {
        deployment(RETIRED)
    }

    fn zero() -> DeploymentView {
        scaled_to_zero(RETIRED)
    }

    fn remembered(retired_at: UnixMillis, scaled_down_at: Option<UnixMillis>) -> Vec<SunsetMemory> {
        vec![SunsetMemory {
            build_id: RETIRED.into(),
            retired_at,
            scaled_down_at,
            drain: DrainMemory::default(),
        }]
    }

    fn scale() -> SunsetAction {
        SunsetAction::ScaleToZero {
            build_id: RETIRED.into(),
            deployment: deployment_name(RETIRED),
        }
    }

    fn delete_deployment() -> SunsetAction {
        SunsetAction::DeleteDeployment {
            build_id: RETIRED.into(),
            deployment: deployment_name(RETIRED),
        }
    }

    fn delete_version() -> SunsetAction {
        SunsetAction::DeleteVersion {
            build_id: RETIRED.into(),
        }
    }

    struct Case {
        name: &'static str,
        observation: Observation,
        memory: Vec<SunsetMemory>,
        now: UnixMillis,
        actions: Vec<SunsetAction>,
        /// `scaled_down_at` remembered for RETIRED afterwards (outer None: no entry at all).
        scaled_down_at: Option<Option<UnixMillis>>,
        next_check_at: Option<UnixMillis>,
    }

    #[test]
    fn retired_versions_follow_the_sunset_rules() {
        let t0 = secs(1_000_000);
        let cases = vec![
            Case {
                name: "Drained: waits for scaledownDelay",
                observation: with_retired(drained(t0), up()),
                memory: remembered(t0 - HOUR, None),
                now: t0 + HOUR - 1,
                actions: vec![],
                scaled_down_at: Some(None),
                next_check_at: Some(t0 + HOUR),
            },
            Case {
                name: "Drained: scaled to zero once scaledownDelay has passed",
                observation: with_retired(drained(t0), up()),
                memory: remembered(t0 - HOUR, None),
                now: t0 + HOUR,
                actions: vec![scale()],
                scaled_down_at: Some(Some(t0 + HOUR)),
                next_check_at: Some(t0 + HOUR + DAY),
            },
            Case {
                name: "Drained at zero: waits for deleteDelay after the scale-down",
                observation: with_retired(drained(t0), zero()),
                memory: remembered(t0 - HOUR, Some(t0 + HOUR)),
                now: t0 + HOUR + DAY - 1,
                actions: vec![],
                scaled_down_at: Some(Some(t0 + HOUR)),
                next_check_at: Some(t0 + HOUR + DAY),
            },
            Case {
                name: "Drained at zero: Deployment and version deleted after deleteDelay",
                observation: with_retired(drained(t0), zero()),
                memory: remembered(t0 - HOUR, Some(t0 + HOUR)),
                now: t0 + HOUR + DAY,
                actions: vec![delete_deployment(), delete_version()],
                scaled_down_at: Some(Some(t0 + HOUR)),
                next_check_at: Some(t0 + HOUR + DAY + RECHECK),
            },
            Case {
                name: "Drained, scaled to zero by someone else: deleteDelay counts from now",
                observation: with_retired(drained(t0), zero()),
                memory: vec![],
                now: t0 + 2 * HOUR,
                actions: vec![],
                scaled_down_at: Some(Some(t0 + 2 * HOUR)),
                next_check_at: Some(t0 + 2 * HOUR + DAY),
            },
            Case {
                name: "Drained without a drained time: scaledownDelay counts from retirement",
                observation: with_retired(state(VersionState::Drained, |_| {}), up()),
                memory: remembered(t0, None),
                now: t0 + 10,
                actions: vec![],
                scaled_down_at: Some(None),
                next_check_at: Some(t0 + HOUR),
            },
            Case {
                name: "Drained with autoscaled (unset) replicas is scaled to zero",
                observation: with_retired(
                    drained(t0),
                    DeploymentView {
                        replicas: None,
                        ..up()
                    },
                ),
                memory: vec![],
                now: t0 + HOUR,
                actions: vec![scale()],
                scaled_down_at: Some(Some(t0 + HOUR)),
                next_check_at: Some(t0 + HOUR + DAY),
            },
            Case {
                name: "Draining: never scaled down, drainage re-checked",
                observation: with_retired(
                    state(VersionState::Draining, |v| v.deactivated_at = Some(0)),
                    up(),
                ),
                memory: remembered(0, None),
                now: t0 + 30 * DAY,
                actions: vec![],
                scaled_down_at: Some(None),
                next_check_at: Some(t0 + 30 * DAY + RECHECK),
            },
            Case {
                name: "Draining at zero (scaled by someone else): left alone",
                observation: with_retired(
                    state(VersionState::Draining, |v| v.deactivated_at = Some(0)),
                    zero(),
                ),
                memory: remembered(0, None),
                now: t0,
                actions: vec![],
                scaled_down_at: Some(None),
                next_check_at: Some(t0 + RECHECK),
            },
            Case {
                name: "just demoted from Current (Inactive, drainage unknown): waits, bug #573",
                observation: with_retired(
                    state(VersionState::Inactive, |v| {
                        v.last_current_at = Some(t0 - 5);
                        v.deactivated_at = Some(t0 - 5);
                        v.drainage_known = false;
                    }),
                    up(),
                ),
                memory: vec![],
                now: t0,
                actions: vec![],
                scaled_down_at: Some(None),
                next_check_at: Some(t0 + RECHECK),
            },
            Case {
                name: "once Current, now Inactive: waits even if drainage is said to be known",
                observation: with_retired(
                    state(VersionState::Inactive, |v| v.last_current_at = Some(t0 - 5)),
                    up(),
                ),
                memory: vec![],
                now: t0,
                actions: vec![],
                scaled_down_at: Some(None),
                next_check_at: Some(t0 + RECHECK),
            },
            Case {
                name: "just stopped ramping (Inactive, drainage unknown): waits",
                observation: with_retired(
                    state(VersionState::Inactive, |v| {
                        v.deactivated_at = Some(t0 - 5);
                        v.drainage_known = false;
                    }),
                    up(),
                ),
                memory: vec![],
                now: t0,
                actions: vec![],
                scaled_down_at: Some(None),
                next_check_at: Some(t0 + RECHECK),
            },
            Case {
                name: "superseded before promotion (Inactive, never routed): scaled to zero at once",
                observation: with_retired(
                    state(VersionState::Inactive, |v| v.drainage_known = false),
                    up(),
                ),
                memory: vec![],
                now: t0,
                actions: vec![scale()],
                scaled_down_at: Some(Some(t0)),
                next_check_at: Some(t0 + DAY),
            },
            Case {
                name: "superseded before promotion: deleted with its version after deleteDelay",
                observation: with_retired(state(VersionState::Inactive, |_| {}), zero()),
                memory: remembered(t0, Some(t0)),
                now: t0 + DAY,
                actions: vec![delete_deployment(), delete_version()],
                scaled_down_at: Some(Some(t0)),
                next_check_at: Some(t0 + DAY + RECHECK),
            },
            Case {
                name: "NotRegistered: scaled to zero at once",
                observation: with_retired(None, up()),
                memory: vec![],
                now: t0,
                actions: vec![scale()],
                scaled_down_at: Some(Some(t0)),
                next_check_at: Some(t0 + DAY),
            },
            Case {
                name: "listed as NotRegistered: scaled to zero at once",
                observation: with_retired(state(VersionState::NotRegistered, |_| {}), up()),
                memory: vec![],
                now: t0,
                actions: vec![scale()],
                scaled_down_at: Some(Some(t0)),
                next_check_at: Some(t0 + DAY),
            },
            Case {
                name: "NotRegistered: Deployment deleted after deleteDelay, no version to delete",
                observation: with_retired(None, zero()),
                memory: remembered(t0, Some(t0)),
                now: t0 + DAY,
                actions: vec![delete_deployment()],
                scaled_down_at: Some(Some(t0)),
                next_check_at: None,
            },
            Case {
                name: "NotRegistered while Temporal has no worker deployment: left alone",
                observation: {
                    let mut obs = with_retired(None, up());
                    obs.temporal = Ok(TemporalState::default());
                    obs
                },
                memory: vec![],
                now: t0,
                actions: vec![],
                scaled_down_at: Some(None),
                next_check_at: None,
            },
            Case {
                name: "a Deployment being deleted is ignored",
                observation: with_retired(
                    None,
                    DeploymentView {
                        deleting: true,
                        ..up()
                    },
                ),
                memory: vec![],
                now: t0,
                actions: vec![],
                scaled_down_at: None,
                next_check_at: None,
            },
            Case {
                name: "version still listed after its Deployment went: deleted again",
                observation: {
                    let mut obs = with_retired(drained(t0), zero());
                    obs.deployments.retain(|d| d.build_id != RETIRED);
                    obs
                },
                memory: remembered(t0, Some(t0 + HOUR)),
                now: t0 + HOUR + DAY + 5,
                actions: vec![delete_version()],
                scaled_down_at: Some(Some(t0 + HOUR)),
                next_check_at: Some(t0 + HOUR + DAY + 5 + RECHECK),
            },
            Case {
                name: "Deployment deleted by someone else before deleteDelay: version deleted on time",
                observation: with_retired(
                    drained(t0),
                    DeploymentView {
                        deleting: true,
                        ..zero()
                    },
                ),
                memory: remembered(t0, Some(t0 + HOUR)),
                now: t0 + 2 * HOUR,
                actions: vec![],
                scaled_down_at: Some(Some(t0 + HOUR)),
                next_check_at: Some(t0 + HOUR + DAY),
            },
            Case {
                name: "memory of a version gone from Kubernetes and Temporal is dropped",
                observation: {
                    let mut obs = with_retired(None, zero());
                    obs.deployments.retain(|d| d.build_id != RETIRED);
                    obs
                },
                memory: remembered(t0, Some(t0)),
                now: t0 + DAY,
                actions: vec![],
                scaled_down_at: None,
                next_check_at: None,
            },
        ];
        for case in cases {
            let plan = plan(&case.observation, &case.memory, case.now);
            assert_eq!(plan.actions, case.actions, "{}: actions", case.name);
            let entry = plan.memory.iter().find(|m| m.build_id == RETIRED);
            assert_eq!(
                entry.map(|m| m.scaled_down_at),
                case.scaled_down_at,
                "{}: memory {:?}",
                case.name,
                plan.memory
            );
            assert_eq!(
                plan.next_check_at, case.next_check_at,
                "{}: next check",
                case.name
            );
        }
    }

    #[test]
    fn a_drain_policy_counts_and_drains_a_draining_version_while_the_sunset_waits() {
        let t0 = secs(1_000_000);
        let mut observation = with_retired(state(VersionState::Draining, |_| {}), up());
        if let Some(spec) = observation.spec.as_mut() {
            spec.drain = Some(crate::model::DrainPolicy {
                signal_after_ms: Some(secs(60)),
                signal_name: "twc-drain".into(),
                cancel_after_ms: Some(secs(600)),
                rate: 50,
                ..Default::default()
            });
        }
        let count = SunsetAction::CountPinned {
            build_id: RETIRED.into(),
        };
        let signal = SunsetAction::Drain {
            build_id: RETIRED.into(),
            step: DrainStep::Signal,
            action: DrainAction::Signal {
                name: "twc-drain".into(),
            },
        };
        // Just retired: counted; the signal falls due in a minute.
        let first = plan(&observation, &remembered(t0, None), t0);
        assert_eq!(first.actions, vec![count.clone()]);
        assert_eq!(
            first.next_check_at,
            Some(t0 + secs(30)),
            "drainage recheck first"
        );
        // A minute later: counted again and signalled; the scale-down still waits for drainage.
        let later = plan(&observation, &remembered(t0, None), t0 + secs(60));
        assert_eq!(later.actions, vec![count, signal]);
        // Without a policy nothing of the drain is planned.
        if let Some(spec) = observation.spec.as_mut() {
            spec.drain = None;
        }
        assert!(
            plan(&observation, &remembered(t0, None), t0 + secs(60))
                .actions
                .is_empty()
        );
    }

    /// A version Temporal lists that is neither targeted nor routed to, with no Deployment and
    /// nothing remembered (a superseded rollout's late SetCurrent made it Current after its
    /// Deployment was deleted, and a newer build then replaced it): it is deleted like any
    /// retired version, once its delete delay has passed.
    #[test]
    fn a_version_without_deployment_or_memory_is_still_deleted() {
        let t0 = secs(1_000_000);
        let mut observation = with_retired(drained(t0), up());
        observation.deployments.retain(|d| d.build_id != RETIRED);
        // What the TWD workflow does each turn: adopt, then plan.
        let retire = |memory: &[SunsetMemory], now: UnixMillis| {
            let memory = adopt_orphans(&observation, memory, now);
            plan(&observation, &memory, now)
        };
        let first = retire(&[], t0);
        assert!(first.actions.is_empty(), "{first:?}");
        assert_eq!(
            find(&first.memory, RETIRED).map(|m| (m.retired_at, m.scaled_down_at)),
            Some((t0, Some(t0)))
        );
        assert_eq!(first.next_check_at, Some(t0 + DAY));
        let later = retire(&first.memory, t0 + DAY);
        assert_eq!(later.actions, vec![delete_version()]);
        // Active builds, versions with a Deployment, remembered ones and unregistered ones
        // are not adopted.
        for build in [NEW, OLD] {
            let mut observation = observation.clone();
            observation.deployments.retain(|d| d.build_id != build);
            let adopted = adopt_orphans(&observation, &[], t0);
            assert!(adopted.iter().all(|m| m.build_id != build), "{build}");
        }
        assert_eq!(
            adopt_orphans(&with_retired(drained(t0), up()), &[], t0),
            Vec::new()
        );
        assert_eq!(
            adopt_orphans(&observation, &remembered(t0 - HOUR, None), t0),
            remembered(t0 - HOUR, None)
        );
        let mut unregistered = observation.clone();
        if let Ok(t) = unregistered.temporal.as_mut() {
            t.versions.retain(|v| v.build_id != RETIRED);
        }
        assert_eq!(adopt_orphans(&unregistered, &[], t0), Vec::new());
    }

    #[test]
    fn a_new_retirement_is_remembered_from_now() {
        let plan = plan(
            &with_retired(state(VersionState::Draining, |_| {}), up()),
            &[],
            secs(50),
        );
        assert_eq!(plan.memory, remembered(secs(50), None));
    }

    #[test]
    fn target_current_and_ramping_builds_are_never_touched() {
        let t0 = secs(1_000_000);
        let mut temporal = TemporalState {
            exists: true,
            current_build_id: Some(OLD.into()),
            ramping_build_id: Some(RETIRED.into()),
            ramp_percentage: Some(10.0),
            versions: vec![
                TemporalVersion {
                    drained_since: Some(0),
                    ..version(NEW, VersionState::Drained)
                },
                version(OLD, VersionState::Current),
                version(RETIRED, VersionState::Ramping),
            ],
            ..TemporalState::default()
        };
        let deployments = vec![scaled_to_zero(NEW), deployment(OLD), deployment(RETIRED)];
        let obs = observation(
            spec(RolloutStrategy::AllAtOnce),
            deployments.clone(),
            temporal.clone(),
        );
        let memory = vec![
            SunsetMemory {
                build_id: NEW.into(),
                retired_at: 0,
                scaled_down_at: Some(0),
                drain: DrainMemory::default(),
            },
            SunsetMemory {
                build_id: OLD.into(),
                retired_at: 0,
                scaled_down_at: Some(0),
                drain: DrainMemory::default(),
            },
        ];
        let result = plan(&obs, &memory, t0);
        assert_eq!(
            result,
            SunsetPlan::default(),
            "a rolled-back target's old sunset memory is dropped too"
        );

        // Routing says RETIRED is Current while the version list still says OLD: wait for them
        // to agree rather than scale down either.
        temporal.ramping_build_id = None;
        temporal.current_build_id = Some(RETIRED.into());
        let obs = observation(spec(RolloutStrategy::AllAtOnce), deployments, temporal);
        let result = plan(&obs, &[], t0);
        assert_eq!(result.actions, vec![]);
        assert_eq!(result.next_check_at, Some(t0 + RECHECK));
    }

    #[test]
    fn nothing_is_retired_while_temporal_is_unreadable() {
        let mut obs = with_retired(None, up());
        obs.temporal = Err(Blocked {
            reason: BlockReason::TemporalStateFetchFailed,
            message: "rate limited".into(),
        });
        let memory = remembered(0, Some(0));
        let result = plan(&obs, &memory, DAY * 10);
        assert_eq!(result.actions, vec![]);
        assert_eq!(result.memory, memory);
        assert_eq!(result.next_check_at, Some(DAY * 10 + RECHECK));
    }

    #[test]
    fn nothing_is_retired_when_the_twd_is_gone_or_deleting() {
        let mut gone = with_retired(None, up());
        gone.spec = None;
        let mut deleting = with_retired(None, up());
        if let Some(spec) = deleting.spec.as_mut() {
            spec.deleting = true;
        }
        for obs in [gone, deleting] {
            assert_eq!(plan(&obs, &remembered(0, None), DAY), SunsetPlan::default());
        }
    }

    #[test]
    fn next_check_is_the_earliest_pending_time() {
        let t0 = secs(1_000_000);
        let mut obs = with_retired(drained(t0), up());
        if let Ok(temporal) = obs.temporal.as_mut() {
            temporal.versions.push(TemporalVersion {
                drained_since: Some(t0 - HOUR + 10),
                ..version("v-other", VersionState::Drained)
            });
        }
        obs.deployments.push(deployment("v-other"));
        let result = plan(&obs, &[], t0);
        assert_eq!(result.actions, vec![]);
        assert_eq!(result.next_check_at, Some(t0 + 10));
        assert_eq!(result.memory.len(), 2);
        assert!(
            result
                .memory
                .windows(2)
                .all(|w| w[0].build_id < w[1].build_id),
            "memory is sorted"
        );
    }

    #[test]
    fn version_limit_counts_retired_versions_not_yet_eligible_for_deletion() {
        let drained_at_zero = |build: &str| {
            (
                TemporalVersion {
                    drained_since: Some(0),
                    ..version(build, VersionState::Drained)
                },
                scaled_to_zero(build),
            )
        };
        let retired_versions = vec![
            (version("a", VersionState::Draining), deployment("a")),
            (
                TemporalVersion {
                    drained_since: Some(0),
                    ..version("b", VersionState::Drained)
                },
                deployment("b"),
            ),
            (version("c", VersionState::Inactive), scaled_to_zero("c")),
            drained_at_zero("d"),
            drained_at_zero("e"),
        ];
        let mut temporal = temporal_with_old_current();
        temporal.versions.push(version(NEW, VersionState::Inactive));
        let mut deployments = vec![deployment(NEW), deployment(OLD)];
        for (version, deployment) in retired_versions {
            temporal.versions.push(version);
            deployments.push(deployment);
        }
        // A NotRegistered retired version is never eligible; one being deleted is not counted.
        deployments.push(deployment("f"));
        deployments.push(DeploymentView {
            deleting: true,
            ..deployment("g")
        });
        let obs = observation(spec(RolloutStrategy::AllAtOnce), deployments, temporal);

        let ineligible = 4; // a (Draining), b (pods running), c (Inactive), f (NotRegistered)
        let cases = [
            (ineligible - 1, true),
            (ineligible, true),
            (ineligible + 1, false),
            (DEFAULT_MAX_VERSIONS_INELIGIBLE_FOR_DELETION, false),
        ];
        for (max, expected) in cases {
            assert_eq!(version_limit_reached(&obs, max), expected, "max {max}");
        }
        let mut unreadable = obs.clone();
        unreadable.temporal = Err(Blocked {
            reason: BlockReason::TemporalStateFetchFailed,
            message: "x".into(),
        });
        assert!(
            !version_limit_reached(&unreadable, 1),
            "unknown state does not block"
        );

        // Room for one more without reading again: the target it saw may become ineligible too.
        let room_cases = [
            (ineligible + 1, false),
            (ineligible + 2, true),
            (DEFAULT_MAX_VERSIONS_INELIGIBLE_FOR_DELETION, true),
        ];
        for (max, expected) in room_cases {
            assert_eq!(
                room_for_a_new_version(&obs, max),
                expected,
                "room under {max}"
            );
        }
        assert!(
            !room_for_a_new_version(&unreadable, DEFAULT_MAX_VERSIONS_INELIGIBLE_FOR_DELETION),
            "unknown state: read again"
        );
        let no_twd = Observation {
            spec: None,
            ..obs.clone()
        };
        assert!(
            !room_for_a_new_version(&no_twd, DEFAULT_MAX_VERSIONS_INELIGIBLE_FOR_DELETION),
            "no TWD read: read again"
        );
    }

    #[test]
    fn eligibility_needs_drained_and_no_running_pods() {
        let drained = version(RETIRED, VersionState::Drained);
        let draining = version(RETIRED, VersionState::Draining);
        let terminating = DeploymentView {
            status_replicas: 1,
            ..zero()
        };
        assert!(eligible_for_deletion(Some(&drained), &zero()));
        assert!(!eligible_for_deletion(Some(&drained), &terminating));
        assert!(!eligible_for_deletion(Some(&draining), &zero()));
        assert!(!eligible_for_deletion(None, &zero()));
    }
}
