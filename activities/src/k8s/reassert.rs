//! What every turn of a TWD's workflow re-asserts on the Kubernetes side (SPEC §10): the
//! delete-protection finalizers, the TemporalConnection's current settings on every live
//! versioned Deployment, and under `unsafeCustomBuildID` the current pod template on the target
//! build's Deployment (Go controller reference §2.7, without its connection-drift gap).
//!
//! Called every few seconds during rollouts, so when nothing needs changing it only reads: the
//! TWD, the namespace's connections (and the ClusterConnections, unless restricted to
//! namespaces; with the watcher's view of the connections, [`KnownConnections`], only the one
//! the TWD uses, unless another may be left to release), the connection and its Secret, and
//! the TWD's Deployments.
//! What to change is decided by pure functions over the objects read ([`bring_up_to_date`]).

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::PodSpec;
use kube::{Client, ResourceExt};
use twc_crds::labels::{self, DELETE_PROTECTION_FINALIZER};
use twc_crds::{BuildId, TemporalConnectionSpec, TemporalWorkerDeployment, WorkerObject, build_id};
use twc_workflows::contract::{ReassertOutcome, ResourceChange};
use twc_workflows::model::{SpecView, TwdRef};
use twc_workflows::plan::spec_view::spec_view;

use super::adoption::{
    ADOPTED_CONNECTION_HASH, ADOPTED_TEMPLATE_HASH, runs_template, stamp_deployment,
};
use super::claims::settle_others;
use super::connection::{ClusterAccess, ResolvedConnection, resolve_connection};
use super::deployment_builder::{build_deployment, selector_labels};
use super::deployments::{apply_connection, list_owned_deployments, update_deployment};
use super::error::{K8sError, ObjectName, ResolveError};
use super::finalizers::{KnownConnections, restore_finalizers};
use super::injection::connection_spec_hash;
use super::injection::{ServerCa, TLS_VOLUME};
use super::twd::{Claim, read_claim};

/// Why `reassert_resources` changed something: the reason of the Normal event it becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeReason {
    /// The delete-protection finalizer was missing from the TWD or its connection (first
    /// added, removed by hand, or a new `connectionRef`).
    FinalizerRestored,
    /// A versioned Deployment was brought up to date with its TemporalConnection.
    ConnectionUpdated,
    /// The target build's Deployment was rolled in place to the TWD's pod template.
    TemplateUpdated,
}

impl ChangeReason {
    /// The event reason.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FinalizerRestored => "FinalizerRestored",
            Self::ConnectionUpdated => "ConnectionUpdated",
            Self::TemplateUpdated => "TemplateUpdated",
        }
    }

    fn change(self, message: String) -> ResourceChange {
        ResourceChange {
            reason: self.as_str().to_owned(),
            message,
        }
    }
}

/// Re-asserts what the TWD needs and returns what it changed. Nothing for a TWD that is gone
/// or being deleted. The Deployments are left alone when the connection or its Secret is
/// missing or unusable (the TWD's conditions say why); Kubernetes errors, including a
/// connection the API server could not serve now, are returned for the caller to retry.
/// `known` spares the finalizers' lists ([`restore_finalizers`]).
pub async fn reassert_resources(
    client: &Client,
    access: ClusterAccess,
    twd: &TwdRef,
    known: Option<&dyn KnownConnections>,
) -> Result<ReassertOutcome, K8sError> {
    let claim = read_claim(client, twd).await?;
    Ok(reassert_claimed(client, access, twd, claim, known)
        .await?
        .outcome)
}

/// What [`reassert_claimed`] did, and the connection it resolved on the way (for an
/// observation that follows, when nothing changed).
#[derive(Debug, Default)]
pub struct Reasserted {
    /// What was changed.
    pub outcome: ReassertOutcome,
    /// The TWD's connection and the config to reach Temporal with, when both were read and
    /// usable.
    pub resolved: Option<ResolvedConnection>,
    /// The TWD's versioned Deployments as listed for the re-assertion (with the stamps it
    /// added), when it got that far: what an observation right after reads, when nothing was
    /// changed.
    pub deployments: Option<Vec<Deployment>>,
}

/// [`reassert_resources`] of the claim just read (`None`: no object of either kind has the
/// name), so a caller that goes on to observe reads it once.
pub async fn reassert_claimed(
    client: &Client,
    access: ClusterAccess,
    twd: &TwdRef,
    claim: Option<Claim>,
    known: Option<&dyn KnownConnections>,
) -> Result<Reasserted, K8sError> {
    let Some(claim) = claim else {
        return Ok(Reasserted::default());
    };
    // Objects of the other kind of this name: refused, or handed over from (their Deployments
    // are the holder's from here on).
    let mut changes = settle_others(client, &claim).await?;
    let resource = claim.holder;
    if resource.metadata.deletion_timestamp.is_some() {
        return Ok(Reasserted {
            outcome: ReassertOutcome { changes },
            resolved: None,
            deployments: None,
        });
    }
    let view = spec_view(&resource);
    let reference = &resource.spec.worker_options.connection_ref;
    // Resolved first: the connection just read spares the finalizers' own read of it.
    let resolved = resolve_connection(
        client,
        access,
        &twd.namespace,
        reference,
        &view.temporal_namespace,
    )
    .await;
    let used = resolved.as_ref().ok().map(|r| &r.connection);
    changes.extend(
        restore_finalizers(client, access, &resource, known, used)
            .await?
            .into_iter()
            .map(|object| {
                ChangeReason::FinalizerRestored.change(format!(
                    "added finalizer {DELETE_PROTECTION_FINALIZER} to {object}"
                ))
            }),
    );
    let resolved = match resolved {
        Ok(resolved) => resolved,
        Err(ResolveError::Blocked(blocked)) => {
            tracing::debug!(twd = %twd.key(), reason = blocked.reason.as_str(), "Deployments not re-asserted: {}", blocked.message);
            return Ok(Reasserted {
                outcome: ReassertOutcome { changes },
                resolved: None,
                deployments: None,
            });
        }
        Err(ResolveError::Transient(error)) => return Err(*error),
    };
    let ca = ServerCa::of(&resolved.config);
    let desired = Desired {
        twd: &resource,
        connection: resolved.connection.spec(),
        ca,
        in_place: in_place_build(&resource, &view),
    };
    let mut listed = list_owned_deployments(client, twd, &view.uid).await?;
    for deployment in &mut listed {
        if deployment.metadata.deletion_timestamp.is_some() {
            continue;
        }
        // A Deployment another controller made whose pods already run what this one would
        // write is stamped as such, not rewritten (which would restart its pods).
        let stamps = adoption_stamps(client, deployment, &desired).await?;
        if !stamps.is_empty() {
            stamp_deployment(client, deployment, &stamps).await?;
            deployment
                .metadata
                .annotations
                .get_or_insert_default()
                .extend(stamps);
        }
        // Decided on the copy just listed, so an up-to-date Deployment costs no further read.
        if bring_up_to_date(&mut deployment.clone(), &desired).is_none() {
            continue;
        }
        let name = deployment.name_any();
        let object = ObjectName::new("Deployment", &twd.namespace, &name);
        let updated = update_deployment(client, &twd.namespace, &name, |d| {
            bring_up_to_date(d, &desired)
        })
        .await?;
        if let Some(change) = updated {
            let connection = format!("{} {}", reference.kind, reference.name);
            changes.push(change.describe(&object, &connection));
        }
    }
    for change in &changes {
        tracing::info!(twd = %twd.key(), reason = %change.reason, "{}", change.message);
    }
    Ok(Reasserted {
        outcome: ReassertOutcome { changes },
        resolved: Some(resolved),
        deployments: Some(listed),
    })
}

/// What the TWD and its connection want of its versioned Deployments.
#[derive(Debug, Clone)]
pub struct Desired<'a> {
    /// The TWD as just read.
    pub twd: &'a WorkerObject,
    /// Its TemporalConnection's spec.
    pub connection: &'a TemporalConnectionSpec,
    /// Whether the connection's mutual-TLS Secret carries the server CA.
    pub ca: ServerCa,
    /// The build whose Deployment follows template edits in place (see [`in_place_build`]).
    pub in_place: Option<BuildId>,
}

/// The stamps (Deployment annotations) a Deployment another controller made gets because its
/// pods already run what `desired` asks: the connection's settings
/// ([`ADOPTED_CONNECTION_HASH`]) and, for the in-place build, the pod template
/// ([`ADOPTED_TEMPLATE_HASH`], checked by a dry run).
async fn adoption_stamps(
    client: &Client,
    deployment: &Deployment,
    desired: &Desired<'_>,
) -> Result<BTreeMap<String, String>, K8sError> {
    let mut stamps = BTreeMap::new();
    let made_here = deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.labels.as_ref())
        .and_then(|l| l.get(labels::MANAGED_BY))
        .is_some_and(|v| v == labels::MANAGED_BY_VALUE);
    if made_here {
        return Ok(stamps);
    }
    if let Some(hash) = adopted_connection(deployment, desired) {
        stamps.insert(ADOPTED_CONNECTION_HASH.to_owned(), hash);
    }
    let in_place = desired.in_place.as_ref().is_some_and(|build| {
        deployment.labels().get(labels::BUILD_ID)
            == selector_labels(&desired.twd.name_any(), build).get(labels::BUILD_ID)
    });
    let wanted = build_id::template_hash(&desired.twd.spec.template);
    let stamped = deployment.annotations().get(ADOPTED_TEMPLATE_HASH) == Some(&wanted);
    if in_place && !stamped && runs_template(client, deployment, desired.twd).await? {
        stamps.insert(ADOPTED_TEMPLATE_HASH.to_owned(), wanted);
    }
    Ok(stamps)
}

/// The connection hash to stamp on `deployment` when its pods carry exactly the settings
/// `desired` would inject, under another controller's annotation.
fn adopted_connection(deployment: &Deployment, desired: &Desired<'_>) -> Option<String> {
    let hash = connection_spec_hash(desired.connection, desired.ca);
    let pod_hash = deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get(labels::CONNECTION_SPEC_HASH));
    if pod_hash == Some(&hash)
        || deployment.annotations().get(ADOPTED_CONNECTION_HASH) == Some(&hash)
    {
        return None;
    }
    let build = BuildId::new(deployment.labels().get(labels::BUILD_ID)?.clone());
    let built = build_deployment(desired.twd, desired.connection, &build, desired.ca);
    (pod_connection(deployment) == pod_connection(&built)).then_some(hash)
}

/// The build rolled in place on template edits: the target build under `unsafeCustomBuildID`
/// (a template edit does not change the build ID, so no new Deployment comes), unless the spec
/// is invalid (nothing is built from an invalid spec).
pub fn in_place_build(twd: &TemporalWorkerDeployment, view: &SpecView) -> Option<BuildId> {
    let custom = twd.spec.worker_options.unsafe_custom_build_id.is_some();
    (custom && view.invalid.is_empty()).then(|| BuildId::new(view.target_build_id.clone()))
}

/// What [`bring_up_to_date`] changed in a Deployment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeploymentChange {
    /// The pod template was rebuilt from the TWD's (connection included); the connection
    /// settings that changed with it, in words.
    TemplateRolled {
        /// Connection settings that changed too.
        connection: Vec<String>,
    },
    /// The connection settings were rewritten; what changed, in words.
    ConnectionUpdated(Vec<String>),
}

impl DeploymentChange {
    /// The change as an event, naming the Deployment and the connection (`connection`, e.g.
    /// `TemporalConnection dev`).
    pub fn describe(&self, deployment: &ObjectName, connection: &str) -> ResourceChange {
        let settings = |changes: &[String]| {
            if changes.is_empty() {
                "settings re-applied".to_owned()
            } else {
                changes.join(", ")
            }
        };
        match self {
            Self::TemplateRolled { connection: none } if none.is_empty() => {
                ChangeReason::TemplateUpdated.change(format!(
                    "{deployment} rolled in place to the current pod template; its build ID is kept (unsafeCustomBuildID)"
                ))
            }
            Self::TemplateRolled { connection: changes } => {
                ChangeReason::TemplateUpdated.change(format!(
                    "{deployment} rolled in place to the current pod template and {connection} ({}); its build ID is kept (unsafeCustomBuildID)",
                    settings(changes)
                ))
            }
            Self::ConnectionUpdated(changes) => ChangeReason::ConnectionUpdated.change(format!(
                "{deployment} follows {connection}: {} (rolling restart)",
                settings(changes)
            )),
        }
    }
}

/// Brings one versioned Deployment up to date, at most one change: the target build's pod
/// template under `unsafeCustomBuildID` when its template hash differs (a Deployment without
/// the hash annotation is never rolled), else the connection settings when the connection hash
/// differs. Replicas, selector and build-ID labels are kept. `None` when nothing changed.
pub fn bring_up_to_date(
    deployment: &mut Deployment,
    desired: &Desired<'_>,
) -> Option<DeploymentChange> {
    let before = pod_connection(deployment);
    let changed = if roll_template(deployment, desired) {
        DeploymentChange::TemplateRolled {
            connection: before.changes_to(&pod_connection(deployment)),
        }
    } else if apply_connection(deployment, desired.connection, desired.ca) {
        DeploymentChange::ConnectionUpdated(before.changes_to(&pod_connection(deployment)))
    } else {
        return None;
    };
    Some(changed)
}

/// Rebuilds the pod template as `create_deployment` would, when this is the in-place build's
/// Deployment and its template hash is stale; returns whether it did.
fn roll_template(deployment: &mut Deployment, desired: &Desired<'_>) -> bool {
    let Some(build) = &desired.in_place else {
        return false;
    };
    let build_label = selector_labels(&desired.twd.name_any(), build).remove(labels::BUILD_ID);
    if deployment.labels().get(labels::BUILD_ID) != build_label.as_ref() {
        return false;
    }
    let wanted = build_id::template_hash(&desired.twd.spec.template);
    if deployment.annotations().get(ADOPTED_TEMPLATE_HASH) == Some(&wanted) {
        return false;
    }
    let Some(spec) = deployment.spec.as_mut() else {
        return false;
    };
    let stale = spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get(labels::POD_TEMPLATE_HASH))
        .is_some_and(|hash| *hash != wanted);
    if !stale {
        return false;
    }
    let Some(built) = build_deployment(desired.twd, desired.connection, build, desired.ca).spec
    else {
        return false;
    };
    let mut template = built.template;
    // The pods must keep matching the (immutable) selector.
    if let Some(selector) = &spec.selector.match_labels {
        template
            .metadata
            .get_or_insert_default()
            .labels
            .get_or_insert_default()
            .extend(selector.clone());
    }
    spec.template = template;
    spec.min_ready_seconds = built.min_ready_seconds;
    spec.progress_deadline_seconds = built.progress_deadline_seconds;
    true
}

/// The connection settings a pod template carries, read back from its first container's env
/// and its volumes (for saying what changed; never a secret value).
#[derive(Debug, Clone, PartialEq, Eq)]
struct PodConnection {
    address: Option<String>,
    server_name: Option<String>,
    auth: PodAuth,
    server_ca: bool,
}

/// How a pod authenticates to Temporal.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PodAuth {
    None,
    MutualTls { secret: String },
    ApiKey { secret: String, key: String },
}

impl fmt::Display for PodAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::None => f.write_str("none"),
            Self::MutualTls { secret } => write!(f, "mutual TLS (Secret {secret})"),
            Self::ApiKey { secret, key } => write!(f, "API key (Secret {secret}, key {key})"),
        }
    }
}

impl PodConnection {
    /// What differs from `after`, in words.
    fn changes_to(&self, after: &Self) -> Vec<String> {
        let shown = |v: &Option<String>| v.clone().unwrap_or_else(|| "(none)".to_owned());
        let mut changes = Vec::new();
        if self.address != after.address {
            changes.push(format!(
                "address {} -> {}",
                shown(&self.address),
                shown(&after.address)
            ));
        }
        if self.server_name != after.server_name {
            changes.push(format!(
                "TLS server name {} -> {}",
                shown(&self.server_name),
                shown(&after.server_name)
            ));
        }
        if self.auth != after.auth {
            changes.push(format!("auth {} -> {}", self.auth, after.auth));
        }
        if self.server_ca != after.server_ca {
            changes.push(
                if after.server_ca {
                    "server CA now read from the Secret's ca.crt"
                } else {
                    "server CA no longer read from the Secret"
                }
                .to_owned(),
            );
        }
        changes
    }
}

fn pod_connection(deployment: &Deployment) -> PodConnection {
    let pod = deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref());
    let Some(pod) = pod else {
        return PodConnection {
            address: None,
            server_name: None,
            auth: PodAuth::None,
            server_ca: false,
        };
    };
    read_pod_connection(pod)
}

fn read_pod_connection(pod: &PodSpec) -> PodConnection {
    let env = pod
        .containers
        .first()
        .and_then(|c| c.env.as_deref())
        .unwrap_or_default();
    let var = |name: &str| env.iter().find(|v| v.name == name);
    let value = |name: &str| var(name).and_then(|v| v.value.clone());
    let api_key = var("TEMPORAL_API_KEY")
        .and_then(|v| v.value_from.as_ref())
        .and_then(|from| from.secret_key_ref.as_ref());
    let tls_secret = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == TLS_VOLUME)
        .and_then(|v| v.secret.as_ref())
        .and_then(|s| s.secret_name.clone());
    let auth = match (api_key, tls_secret) {
        (Some(key), _) => PodAuth::ApiKey {
            secret: key.name.clone(),
            key: key.key.clone(),
        },
        (None, Some(secret)) => PodAuth::MutualTls { secret },
        (None, None) => PodAuth::None,
    };
    PodConnection {
        address: value("TEMPORAL_ADDRESS"),
        server_name: value("TEMPORAL_TLS_SERVER_NAME"),
        auth,
        server_ca: var("TEMPORAL_TLS_CA_CERT_PATH").is_some(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{EnvVar, SecretKeySelector};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use twc_crds::connection::{SecretReference, TlsSpec};
    use twc_crds::worker_deployment::test_support::spec_with_image;

    use super::*;

    const CUSTOM: &str = "my-build";

    fn plain(host_port: &str) -> TemporalConnectionSpec {
        TemporalConnectionSpec {
            host_port: host_port.into(),
            tls: None,
            mutual_tls_secret_ref: None,
            api_key_secret_ref: None,
            worker_credentials: None,
        }
    }

    fn api_key(secret: &str, key: &str) -> TemporalConnectionSpec {
        TemporalConnectionSpec {
            api_key_secret_ref: Some(SecretKeySelector {
                name: secret.into(),
                key: key.into(),
                optional: None,
            }),
            ..plain("temporal:7233")
        }
    }

    fn mtls(secret: &str) -> TemporalConnectionSpec {
        TemporalConnectionSpec {
            mutual_tls_secret_ref: Some(SecretReference {
                name: secret.into(),
            }),
            ..plain("temporal:7233")
        }
    }

    fn server_name(name: &str) -> TemporalConnectionSpec {
        TemporalConnectionSpec {
            tls: Some(TlsSpec {
                server_name: Some(name.into()),
                ca_secret_ref: None,
            }),
            ..plain("temporal:7233")
        }
    }

    /// A TWD running `image`, with `LEVEL=level` in its container, under the custom build ID
    /// when `custom`.
    fn twd(image: &str, level: &str, custom: bool) -> WorkerObject {
        let mut spec = spec_with_image(image);
        spec.replicas = Some(2);
        if let Some(pod) = spec.template.spec.as_mut() {
            pod.containers[0].env = Some(vec![EnvVar {
                name: "LEVEL".into(),
                value: Some(level.into()),
                value_from: None,
            }]);
        }
        spec.template.metadata = Some(ObjectMeta {
            labels: Some(BTreeMap::from([("team".to_owned(), "a".to_owned())])),
            ..Default::default()
        });
        if custom {
            spec.worker_options.unsafe_custom_build_id = Some(CUSTOM.into());
        }
        let mut twd = TemporalWorkerDeployment::new("worker", spec);
        twd.metadata.namespace = Some("demo".into());
        twd.metadata.uid = Some("uid-1".into());
        twd.into()
    }

    fn desired<'a>(twd: &'a WorkerObject, connection: &'a TemporalConnectionSpec) -> Desired<'a> {
        Desired {
            twd,
            connection,
            ca: ServerCa::SystemRoots,
            in_place: in_place_build(twd, &spec_view(twd)),
        }
    }

    /// The Deployment `create_deployment` made for `twd`'s target build with `connection`, as
    /// the API server returns it (replicas changed since by scaling).
    fn created(twd: &WorkerObject, connection: &TemporalConnectionSpec) -> Deployment {
        let build = BuildId::new(spec_view(twd).target_build_id);
        let mut deployment = build_deployment(twd, connection, &build, ServerCa::SystemRoots);
        if let Some(spec) = deployment.spec.as_mut() {
            spec.replicas = Some(5);
        }
        deployment
    }

    fn env(deployment: &Deployment, name: &str) -> Option<EnvVar> {
        deployment.spec.as_ref()?.template.spec.as_ref()?.containers[0]
            .env
            .iter()
            .flatten()
            .find(|v| v.name == name)
            .cloned()
    }

    #[test]
    fn connection_changes_are_described_without_secret_values() {
        let cases = [
            (
                "address",
                plain("127.0.0.1:7233"),
                plain("localhost:7233"),
                "address 127.0.0.1:7233 -> localhost:7233",
            ),
            (
                "API-key Secret renamed",
                api_key("key-a", "key"),
                api_key("key-b", "key"),
                "auth API key (Secret key-a, key key) -> API key (Secret key-b, key key)",
            ),
            (
                "auth mode switched",
                plain("temporal:7233"),
                api_key("cloud", "key"),
                "auth none -> API key (Secret cloud, key key)",
            ),
            (
                "mTLS Secret renamed",
                mtls("cert-a"),
                mtls("cert-b"),
                "auth mutual TLS (Secret cert-a) -> mutual TLS (Secret cert-b)",
            ),
            (
                "mTLS to API key",
                mtls("cert"),
                api_key("cloud", "key"),
                "auth mutual TLS (Secret cert) -> API key (Secret cloud, key key)",
            ),
            (
                "server name set",
                plain("temporal:7233"),
                server_name("temporal.example"),
                "TLS server name (none) -> temporal.example",
            ),
        ];
        for (case, before, after, expected) in cases {
            let spec = twd("worker:v1", "info", false);
            let mut deployment = created(&spec, &before);
            let change = bring_up_to_date(&mut deployment, &desired(&spec, &after));
            assert_eq!(
                change,
                Some(DeploymentChange::ConnectionUpdated(vec![
                    expected.to_owned()
                ])),
                "{case}"
            );
        }
    }

    #[test]
    fn a_connection_change_matches_a_fresh_build_and_keeps_replicas() {
        let spec = twd("worker:v1", "info", false);
        let after = api_key("key-b", "token");
        let mut deployment = created(&spec, &api_key("key-a", "token"));
        assert!(bring_up_to_date(&mut deployment, &desired(&spec, &after)).is_some());
        let mut fresh = created(&spec, &after);
        assert_eq!(deployment, fresh);
        let key_ref = env(&deployment, "TEMPORAL_API_KEY")
            .and_then(|v| v.value_from)
            .and_then(|f| f.secret_key_ref)
            .map(|r| (r.name, r.key));
        assert_eq!(key_ref, Some(("key-b".to_owned(), "token".to_owned())));
        // Back to plaintext: the key and TLS variables go.
        assert!(bring_up_to_date(&mut fresh, &desired(&spec, &plain("temporal:7233"))).is_some());
        assert_eq!(env(&fresh, "TEMPORAL_API_KEY"), None);
        assert_eq!(env(&fresh, "TEMPORAL_TLS"), None);
    }

    /// What a turn did to a Deployment, for tables.
    #[derive(Debug, PartialEq)]
    enum Did {
        Nothing,
        Rolled,
        RolledMoved,
        Moved,
    }

    fn did(change: Option<DeploymentChange>) -> Did {
        match change {
            None => Did::Nothing,
            Some(DeploymentChange::TemplateRolled { connection }) if connection.is_empty() => {
                Did::Rolled
            }
            Some(DeploymentChange::TemplateRolled { connection })
                if connection == ["address temporal:7233 -> localhost:7233"] =>
            {
                Did::RolledMoved
            }
            Some(DeploymentChange::ConnectionUpdated(changes))
                if changes == ["address temporal:7233 -> localhost:7233"] =>
            {
                Did::Moved
            }
            Some(other) => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn what_each_deployment_gets_on_a_turn() {
        use Did::{Moved, Nothing, Rolled, RolledMoved};
        let (c, moved) = (&plain("temporal:7233"), &plain("localhost:7233"));
        let custom = twd("worker:v1", "info", true);
        let custom_edited = twd("worker:v1", "debug", true);
        let computed = twd("worker:v1", "info", false);
        let computed_edited = twd("worker:v1", "debug", false);
        let mut without_hash = created(&custom, c);
        if let Some(a) = without_hash
            .spec
            .as_mut()
            .and_then(|s| s.template.metadata.as_mut())
            .and_then(|m| m.annotations.as_mut())
        {
            a.remove(labels::POD_TEMPLATE_HASH);
        }
        let mut other_build = created(&custom, c);
        other_build
            .metadata
            .labels
            .get_or_insert_default()
            .insert(labels::BUILD_ID.into(), "older".into());
        let mut invalid = custom_edited.clone();
        invalid.spec.progress_deadline_seconds = 0;
        let cases = [
            ("unchanged", created(&custom, c), &custom, c, Nothing),
            (
                "custom ID, template edited",
                created(&custom, c),
                &custom_edited,
                c,
                Rolled,
            ),
            (
                "custom ID, both edited",
                created(&custom, c),
                &custom_edited,
                moved,
                RolledMoved,
            ),
            (
                "custom ID, no hash (legacy)",
                without_hash,
                &custom_edited,
                c,
                Nothing,
            ),
            (
                "custom ID, another build",
                other_build,
                &custom_edited,
                c,
                Nothing,
            ),
            (
                "custom ID, invalid spec",
                created(&custom, c),
                &invalid,
                c,
                Nothing,
            ),
            (
                "computed ID, template edited",
                created(&computed, c),
                &computed_edited,
                c,
                Nothing,
            ),
            (
                "computed ID, address moved",
                created(&computed, c),
                &computed,
                moved,
                Moved,
            ),
        ];
        for (case, mut deployment, twd, connection, expected) in cases {
            let change = bring_up_to_date(&mut deployment, &desired(twd, connection));
            assert_eq!(did(change), expected, "{case}");
        }
    }

    #[test]
    fn an_in_place_roll_keeps_name_replicas_selector_and_build_id() {
        let before = twd("worker:v1", "info", true);
        let after = twd("worker:v2", "debug", true);
        let connection = plain("temporal:7233");
        let mut deployment = created(&before, &connection);
        let original = deployment.clone();
        let change = bring_up_to_date(&mut deployment, &desired(&after, &connection));
        assert!(
            matches!(change, Some(DeploymentChange::TemplateRolled { .. })),
            "{change:?}"
        );
        assert_eq!(deployment.metadata, original.metadata);
        let (spec, original_spec) = (
            deployment.spec.clone().unwrap_or_default(),
            original.spec.unwrap_or_default(),
        );
        assert_eq!(spec.replicas, Some(5));
        assert_eq!(spec.selector, original_spec.selector);
        let pod_labels = spec
            .template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.clone())
            .unwrap_or_default();
        assert_eq!(pod_labels[labels::BUILD_ID], CUSTOM);
        assert_eq!(pod_labels["team"], "a");
        let annotations = spec
            .template
            .metadata
            .and_then(|m| m.annotations)
            .unwrap_or_default();
        assert_eq!(
            annotations[labels::POD_TEMPLATE_HASH],
            build_id::template_hash(&after.spec.template)
        );
        let pod = spec.template.spec.unwrap_or_default();
        assert_eq!(pod.containers[0].image.as_deref(), Some("worker:v2"));
        assert_eq!(
            env(&deployment, "LEVEL").and_then(|v| v.value).as_deref(),
            Some("debug")
        );
        assert_eq!(
            env(&deployment, "TEMPORAL_WORKER_BUILD_ID")
                .and_then(|v| v.value)
                .as_deref(),
            Some(CUSTOM)
        );
        // Rolled once: the next turn finds nothing to do.
        assert_eq!(
            bring_up_to_date(&mut deployment, &desired(&after, &connection)),
            None
        );
    }

    #[test]
    fn events_name_the_deployment_and_what_changed() {
        let object = ObjectName::new("Deployment", "demo", "worker-v1");
        let cases = [
            (
                DeploymentChange::ConnectionUpdated(vec!["address a:1 -> b:1".into()]),
                "ConnectionUpdated",
                "Deployment demo/worker-v1 follows TemporalConnection dev: address a:1 -> b:1 (rolling restart)",
            ),
            (
                DeploymentChange::ConnectionUpdated(Vec::new()),
                "ConnectionUpdated",
                "Deployment demo/worker-v1 follows TemporalConnection dev: settings re-applied (rolling restart)",
            ),
            (
                DeploymentChange::TemplateRolled {
                    connection: Vec::new(),
                },
                "TemplateUpdated",
                "Deployment demo/worker-v1 rolled in place to the current pod template; its build ID is kept (unsafeCustomBuildID)",
            ),
            (
                DeploymentChange::TemplateRolled {
                    connection: vec!["address a:1 -> b:1".into()],
                },
                "TemplateUpdated",
                "Deployment demo/worker-v1 rolled in place to the current pod template and TemporalConnection dev (address a:1 -> b:1); its build ID is kept (unsafeCustomBuildID)",
            ),
        ];
        for (change, reason, message) in cases {
            let event = change.describe(&object, "TemporalConnection dev");
            assert_eq!(
                (event.reason.as_str(), event.message.as_str()),
                (reason, message)
            );
        }
    }
}
