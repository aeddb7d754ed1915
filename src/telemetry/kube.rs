//! The controller's Kubernetes client, with a layer that counts every API request in
//! `twc_kubernetes_requests_total{verb,resource,outcome}`: the watcher's lists and watches and
//! every activity's reads and writes go through it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Method, Request, Response, StatusCode};
use kube::client::ClientBuilder;
use tower::{Layer, Service};
use twc_activities::metrics::Metrics;

/// A client from the inferred configuration (in-cluster or `KUBECONFIG`), as
/// [`kube::Client::try_default`] builds it, counting its requests in `metrics`.
pub async fn client(metrics: Arc<Metrics>) -> Result<kube::Client, kube::Error> {
    let config = kube::Config::infer()
        .await
        .map_err(kube::Error::InferConfig)?;
    Ok(ClientBuilder::try_from(config)?
        .with_layer(&CountRequests { metrics })
        .build())
}

/// Counts requests by verb, resource and outcome.
#[derive(Clone)]
pub struct CountRequests {
    metrics: Arc<Metrics>,
}

impl<S> Layer<S> for CountRequests {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Counted {
            inner,
            metrics: Arc::clone(&self.metrics),
        }
    }
}

/// The service of [`CountRequests`].
pub struct Counted<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S, B, R> Service<Request<B>> for Counted<S>
where
    S: Service<Request<B>, Response = Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let (verb, resource) = classify(
            request.method(),
            request.uri().path(),
            request.uri().query(),
        );
        let metrics = Arc::clone(&self.metrics);
        let response = self.inner.call(request);
        Box::pin(async move {
            let result = response.await;
            let outcome = match &result {
                Ok(response) => outcome(response.status()),
                Err(_) => "error",
            };
            metrics.kubernetes_request(verb, &resource, outcome);
            result
        })
    }
}

/// The `outcome` label of a response.
fn outcome(status: StatusCode) -> &'static str {
    match status {
        s if s.is_success() => "success",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::CONFLICT => "conflict",
        _ => "error",
    }
}

/// The Kubernetes verb (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
/// `deletecollection`) and resource (plural, with `/subresource`) of a request path
/// (`/api/v1/namespaces/ns/pods/name/status`, `/apis/group/version/...`); `get` of resource
/// `other` for paths outside the resource API (`/version`, discovery).
fn classify(method: &Method, path: &str, query: Option<&str>) -> (&'static str, String) {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let rest = match segments.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => &[][..],
    };
    let rest = match rest {
        ["namespaces", _namespace, tail @ ..] if !tail.is_empty() => tail,
        other => other,
    };
    let (resource, named) = match rest {
        [] => ("other".to_owned(), true),
        [resource] => ((*resource).to_owned(), false),
        [resource, _name] => ((*resource).to_owned(), true),
        [resource, _name, subresource, ..] => (format!("{resource}/{subresource}"), true),
    };
    let watching = query.is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
    let verb = match *method {
        Method::GET if watching => "watch",
        Method::GET if named => "get",
        Method::GET => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if named => "delete",
        Method::DELETE => "deletecollection",
        _ => "other",
    };
    (verb, resource)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_classified_like_the_apiserver_audits_them() {
        let cases: &[(Method, &str, Option<&str>, &str, &str)] = &[
            (
                Method::GET,
                "/apis/temporal.io/v1alpha1/namespaces/demo/temporalworkerdeployments/hello",
                None,
                "get",
                "temporalworkerdeployments",
            ),
            (
                Method::GET,
                "/apis/temporal.io/v1alpha1/temporalworkerdeployments",
                Some("watch=true&resourceVersion=10&timeoutSeconds=290"),
                "watch",
                "temporalworkerdeployments",
            ),
            (
                Method::GET,
                "/apis/apps/v1/namespaces/demo/deployments",
                Some("labelSelector=a%3Db"),
                "list",
                "deployments",
            ),
            (
                Method::PATCH,
                "/apis/temporal.io/v1alpha1/namespaces/demo/temporalworkerdeployments/hello/status",
                None,
                "patch",
                "temporalworkerdeployments/status",
            ),
            (
                Method::PUT,
                "/apis/apps/v1/namespaces/demo/deployments/hello-v1/scale",
                None,
                "update",
                "deployments/scale",
            ),
            (
                Method::POST,
                "/apis/events.k8s.io/v1/namespaces/demo/events",
                None,
                "create",
                "events",
            ),
            (
                Method::DELETE,
                "/apis/apps/v1/namespaces/demo/deployments/hello-v1",
                None,
                "delete",
                "deployments",
            ),
            (
                Method::GET,
                "/api/v1/namespaces/demo/secrets/tls",
                None,
                "get",
                "secrets",
            ),
            (
                Method::GET,
                "/api/v1/namespaces/demo",
                None,
                "get",
                "namespaces",
            ),
            (
                Method::GET,
                "/api/v1/namespaces",
                None,
                "list",
                "namespaces",
            ),
            (Method::GET, "/version", None, "get", "other"),
        ];
        for (method, path, query, verb, resource) in cases {
            assert_eq!(
                classify(method, path, *query),
                (*verb, (*resource).to_owned()),
                "{method} {path}"
            );
        }
    }

    #[test]
    fn outcomes_separate_expected_misses_from_errors() {
        assert_eq!(outcome(StatusCode::OK), "success");
        assert_eq!(outcome(StatusCode::CREATED), "success");
        assert_eq!(outcome(StatusCode::NOT_FOUND), "not_found");
        assert_eq!(outcome(StatusCode::CONFLICT), "conflict");
        assert_eq!(outcome(StatusCode::UNPROCESSABLE_ENTITY), "error");
        assert_eq!(outcome(StatusCode::INTERNAL_SERVER_ERROR), "error");
    }

    #[tokio::test]
    async fn the_layer_counts_each_response() {
        let metrics = Arc::new(Metrics::new());
        let inner = tower::service_fn(|request: Request<()>| async move {
            let status = if request.uri().path().ends_with("/missing") {
                StatusCode::NOT_FOUND
            } else {
                StatusCode::OK
            };
            let mut response = Response::new(());
            *response.status_mut() = status;
            Ok::<_, std::convert::Infallible>(response)
        });
        let mut service = CountRequests {
            metrics: Arc::clone(&metrics),
        }
        .layer(inner);
        for path in [
            "/api/v1/namespaces/a/configmaps/x",
            "/api/v1/namespaces/a/configmaps/x",
            "/api/v1/namespaces/a/configmaps/missing",
        ] {
            let request = Request::get(path).body(()).map_err(|e| e.to_string());
            let Ok(request) = request else {
                panic!("{request:?}");
            };
            let _ = service.call(request).await;
        }
        let page = metrics.render();
        assert!(
            page.contains(
                r#"twc_kubernetes_requests_total{verb="get",resource="configmaps",outcome="success"} 2"#
            ),
            "{page}"
        );
        assert!(
            page.contains(
                r#"twc_kubernetes_requests_total{verb="get",resource="configmaps",outcome="not_found"} 1"#
            ),
            "{page}"
        );
    }
}
