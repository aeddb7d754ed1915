//! Webhook notifications: which targets want an event (the worker deployment's
//! `spec.notifications` and the controller's cluster-wide targets), the payload each format
//! gets, the URL read from its Secret, and one POST per target. The notification workflow
//! (`twc_workflows::notify_workflow`) decides what to send when and what to retry; this module
//! only sends.

use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http::header::{CONTENT_TYPE, USER_AGENT};
use http_body_util::Full;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use k8s_openapi::api::core::v1::{Secret, SecretKeySelector};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use serde_json::{Value, json};
use twc_crds::notifications::{NotificationEvent, NotificationFormat, NotificationSpec};
use twc_workflows::contract::{Notification, NotificationFailure, TargetFailure};
use twc_workflows::model::TwdRef;

use crate::k8s::gate_input::secret_value;
use crate::k8s::lookup::get_if_exists;
use crate::k8s::{K8sError, ObjectName};
use crate::temporal::error::error_chain;

/// How long one POST may take, connection and answer included.
pub const POST_TIMEOUT: Duration = Duration::from_secs(10);
/// Prefix of the names of cluster-wide targets in results and conditions.
pub const CLUSTER_PREFIX: &str = "cluster/";
/// Header carrying the notification's idempotency key (both formats).
pub const IDEMPOTENCY_HEADER: &str = "idempotency-key";

/// A target to send one notification to.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// Its name in results and conditions (`cluster/<name>` for a cluster-wide target).
    pub name: String,
    /// Payload format.
    pub format: NotificationFormat,
    /// Namespace of the Secret holding its URL.
    pub secret_namespace: String,
    /// The Secret key holding its URL.
    pub url: SecretKeySelector,
}

/// Where the controller's cluster-wide targets come from (`--cluster-notifications`): the
/// targets, their Secrets in the controller's own namespace.
#[derive(Debug, Clone, Default)]
pub struct ClusterTargets {
    /// The targets (`None`: no cluster-wide targets).
    pub spec: Option<NotificationSpec>,
    /// Namespace of their Secrets.
    pub secret_namespace: String,
}

/// The targets of a worker deployment in `namespace` with `own` notifications that want
/// `event`, its own first, then the cluster-wide ones; limited to `only` when given.
pub fn targets_for(
    own: Option<&NotificationSpec>,
    namespace: &str,
    cluster: &ClusterTargets,
    event: NotificationEvent,
    only: Option<&[String]>,
) -> Vec<Target> {
    let own = own
        .into_iter()
        .flat_map(|spec| spec.targets.iter())
        .map(|t| (t.name.clone(), t, namespace));
    let cluster = cluster
        .spec
        .iter()
        .flat_map(|spec| spec.targets.iter())
        .map(|t| {
            (
                format!("{CLUSTER_PREFIX}{}", t.name),
                t,
                cluster.secret_namespace.as_str(),
            )
        });
    own.chain(cluster)
        .filter(|(name, target, _)| {
            target.wants(event) && only.is_none_or(|only| only.contains(name))
        })
        .map(|(name, target, secret_namespace)| Target {
            name,
            format: target.format,
            secret_namespace: secret_namespace.to_owned(),
            url: target.url_secret_ref.clone(),
        })
        .collect()
}

/// The body `format` gets for `notification` about `twd`.
pub fn payload(format: NotificationFormat, twd: &TwdRef, notification: &Notification) -> Value {
    let at = Timestamp::from_millisecond(notification.at)
        .map(|t| t.to_string())
        .unwrap_or_default();
    match format {
        NotificationFormat::Generic => json!({
            "idempotencyKey": notification.key,
            "event": notification.event.as_str(),
            "reason": notification.reason,
            "message": notification.message,
            "workerDeployment": { "namespace": twd.namespace, "name": twd.name },
            "workflowId": notification.workflow_id,
            "time": at,
        }),
        NotificationFormat::Slack => json!({
            "text": format!(
                "*{}* {}: {}",
                notification.event.as_str(),
                twd.key(),
                notification.message
            ),
        }),
    }
}

/// Reads a target's URL from its Secret; `Ok(Err(..))` when the Secret or key is missing or
/// does not hold an `http(s)://` URL (the message never quotes the value).
pub async fn read_url(
    kube: &kube::Client,
    target: &Target,
) -> Result<Result<String, TargetFailure>, K8sError> {
    let name = &target.url.name;
    let object = ObjectName::new("Secret", &target.secret_namespace, name);
    let api: Api<Secret> = Api::namespaced(kube.clone(), &target.secret_namespace);
    let secret = get_if_exists(&api, name)
        .await
        .map_err(K8sError::api("get", &object))?;
    let failure = |message: String| TargetFailure {
        target: target.name.clone(),
        reason: NotificationFailure::NotificationSecretNotFound,
        message,
    };
    let Some(secret) = secret else {
        return Ok(Err(failure(format!(
            "{object} not found: create it with the webhook URL under key {:?}",
            target.url.key
        ))));
    };
    let Some(bytes) = secret_value(&secret, &target.url.key) else {
        return Ok(Err(failure(format!(
            "{object} has no key {:?}: add the webhook URL under it",
            target.url.key
        ))));
    };
    let url = String::from_utf8_lossy(&bytes).trim().to_owned();
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Ok(Err(failure(format!(
            "key {:?} of {object} does not hold an http:// or https:// URL",
            target.url.key
        ))));
    }
    Ok(Ok(url))
}

type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// A client of webhooks: one connection pool, HTTPS verified with the system's CA
/// certificates; set up on first use.
#[derive(Debug, Default)]
pub struct WebhookClient {
    http: OnceLock<Result<HttpClient, String>>,
}

impl WebhookClient {
    /// POSTs `body` (JSON) to `url` with `key` as its idempotency header; `Err` says why it was
    /// not delivered (no answer, or an answer other than 2xx). The message never quotes the
    /// URL, which may hold a token.
    pub async fn post(&self, url: &str, key: &str, body: &Value) -> Result<(), String> {
        let http = self
            .http
            .get_or_init(|| crate::http::client("webhooks"))
            .as_ref()
            .map_err(Clone::clone)?;
        let request = Request::post(url)
            .header(CONTENT_TYPE, "application/json")
            .header(USER_AGENT, concat!("twc/", env!("CARGO_PKG_VERSION")))
            .header(IDEMPOTENCY_HEADER, key)
            .body(Full::new(Bytes::from(body.to_string())))
            .map_err(|_| "the URL is not a valid URL".to_owned())?;
        let response = tokio::time::timeout(POST_TIMEOUT, http.request(request))
            .await
            .map_err(|_| format!("no answer within {}s", POST_TIMEOUT.as_secs()))?
            .map_err(|e| format!("not reachable: {}", error_chain(&e)))?;
        let status = response.status();
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("the webhook answered {status}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use twc_crds::notifications::NotificationTarget;

    fn target(name: &str, events: Vec<NotificationEvent>) -> NotificationTarget {
        NotificationTarget {
            name: name.to_owned(),
            format: NotificationFormat::Generic,
            url_secret_ref: SecretKeySelector {
                name: format!("{name}-hook"),
                key: "url".to_owned(),
                optional: None,
            },
            events,
        }
    }

    fn notification() -> Notification {
        Notification {
            key: "rollout/ns/hello/v2#run#7".to_owned(),
            event: NotificationEvent::StepReached,
            reason: "Ramped".to_owned(),
            message: "Build v2 ramped to 10%".to_owned(),
            workflow_id: "rollout/ns/hello/v2".to_owned(),
            at: 1_700_000_000_000,
        }
    }

    #[test]
    fn own_targets_come_first_then_cluster_ones_each_if_it_wants_the_event() {
        let own = NotificationSpec {
            targets: vec![
                target("all", vec![]),
                target("done-only", vec![NotificationEvent::RolloutComplete]),
            ],
        };
        let cluster = ClusterTargets {
            spec: Some(NotificationSpec {
                targets: vec![target("ops", vec![NotificationEvent::StepReached])],
            }),
            secret_namespace: "twc-system".to_owned(),
        };
        let found = targets_for(
            Some(&own),
            "team",
            &cluster,
            NotificationEvent::StepReached,
            None,
        );
        let names: Vec<(&str, &str)> = found
            .iter()
            .map(|t| (t.name.as_str(), t.secret_namespace.as_str()))
            .collect();
        assert_eq!(names, vec![("all", "team"), ("cluster/ops", "twc-system")]);
        let retried = targets_for(
            Some(&own),
            "team",
            &cluster,
            NotificationEvent::StepReached,
            Some(&["cluster/ops".to_owned()]),
        );
        assert_eq!(retried.len(), 1);
        assert_eq!(retried[0].name, "cluster/ops");
        assert!(
            targets_for(
                None,
                "team",
                &ClusterTargets::default(),
                NotificationEvent::Paused,
                None
            )
            .is_empty()
        );
    }

    #[test]
    fn the_generic_payload_carries_the_idempotency_key_and_slack_gets_text() {
        let twd = TwdRef {
            namespace: "ns".to_owned(),
            name: "hello".to_owned(),
        };
        let generic = payload(NotificationFormat::Generic, &twd, &notification());
        assert_eq!(generic["idempotencyKey"], "rollout/ns/hello/v2#run#7");
        assert_eq!(generic["event"], "StepReached");
        assert_eq!(generic["reason"], "Ramped");
        assert_eq!(generic["workerDeployment"]["name"], "hello");
        assert_eq!(generic["time"], "2023-11-14T22:13:20Z");
        let slack = payload(NotificationFormat::Slack, &twd, &notification());
        assert_eq!(
            slack,
            json!({"text": "*StepReached* ns/hello: Build v2 ramped to 10%"})
        );
    }
}
