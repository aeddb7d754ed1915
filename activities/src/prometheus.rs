//! The Prometheus provider of canary analysis: a PromQL instant query (`GET
//! <address>/api/v1/query`) whose single value must stay within bounds.
//!
//! The query's placeholders are replaced first ([`substitute`]). Prometheus's answer decides the
//! verdict ([`parse_answer`], [`judge`]): one value is compared with the bounds; no data, several
//! series, an unreachable server or a failed evaluation are inconclusive (the next measurement
//! may have a verdict); a query Prometheus cannot parse, or one that cannot give a single value
//! at all, is `Invalid` (a spec error). Plain HTTP and HTTPS over pooled clients (one verifying
//! with the system's CA certificates, one per private CA a check names); a query may carry a
//! bearer token or basic auth ([`PrometheusAccess`]), and a server that refuses them (HTTP 401
//! or 403) is named as such with the Secret they came from. Every query is bounded by a timeout.

use std::{
    collections::HashMap,
    sync::{Mutex, OnceLock, PoisonError},
    time::Duration,
};

use base64::{Engine as _, engine::general_purpose::STANDARD as BASE64};
use bytes::Bytes;
use http::{
    HeaderValue, Request, StatusCode, Uri,
    header::{ACCEPT, AUTHORIZATION, USER_AGENT},
};
use http_body_util::{BodyExt, Empty, LengthLimitError, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use serde::Deserialize;
use serde::de::IgnoredAny;
use sha2::{Digest, Sha256};
use tracing::{info, warn};
use twc_crds::worker_deployment::PROMQL_PLACEHOLDERS;
use twc_workflows::contract::{Measurement, Verdict};
use url::Url;

use crate::temporal::error::error_chain;

/// How long one query may take, connection and answer included.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest answer read: one value is a few hundred bytes.
const MAX_ANSWER_BYTES: usize = 1 << 20;
/// How much of an unexpected answer is quoted in a message.
const QUOTED_ANSWER_CHARS: usize = 200;

/// What the placeholders of a query stand for.
#[derive(Debug, Clone, Copy)]
pub struct Placeholders<'a> {
    /// `{{buildID}}`: the build under analysis.
    pub build_id: &'a str,
    /// `{{currentBuildID}}`: the Current build (empty when there is none).
    pub current_build_id: Option<&'a str>,
    /// `{{deploymentName}}`: the worker deployment (`<namespace>/<name>`); `{{version}}` is
    /// `<deploymentName>:<buildID>`.
    pub deployment_name: &'a str,
    /// `{{temporalNamespace}}`: the workers' Temporal namespace.
    pub temporal_namespace: &'a str,
    /// `{{namespace}}`: the TWD's Kubernetes namespace.
    pub namespace: &'a str,
    /// `{{name}}`: the TWD's name.
    pub name: &'a str,
}

impl Placeholders<'_> {
    fn value(&self, placeholder: &str) -> Option<String> {
        let value = match placeholder {
            "{{buildID}}" => self.build_id.to_owned(),
            "{{version}}" => format!("{}:{}", self.deployment_name, self.build_id),
            "{{currentBuildID}}" => self.current_build_id.unwrap_or_default().to_owned(),
            "{{deploymentName}}" => self.deployment_name.to_owned(),
            "{{temporalNamespace}}" => self.temporal_namespace.to_owned(),
            "{{namespace}}" => self.namespace.to_owned(),
            "{{name}}" => self.name.to_owned(),
            _ => return None,
        };
        Some(value)
    }
}

/// `query` with every placeholder of [`PROMQL_PLACEHOLDERS`] replaced, in one pass (a value
/// that contains a placeholder's text is not replaced again); other `{{...}}` text is kept.
pub fn substitute(query: &str, values: &Placeholders<'_>) -> String {
    let mut out = String::with_capacity(query.len());
    let mut rest = query;
    while let Some(at) = rest.find("{{") {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        let known = PROMQL_PLACEHOLDERS
            .iter()
            .find_map(|p| tail.starts_with(p).then(|| (p.len(), values.value(p))));
        match known {
            Some((len, Some(value))) => {
                out.push_str(&value);
                rest = &tail[len..];
            }
            _ => {
                out.push_str("{{");
                rest = &tail[2..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// What Prometheus answered to an instant query.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// Exactly one value.
    Value(f64),
    /// No data: an empty vector, or NaN.
    NoData,
    /// More than one series.
    Series(usize),
    /// A result type that never is one value (`matrix`, `string`).
    WrongType(String),
    /// Prometheus refused the query itself (`bad_data`: it cannot parse it).
    Refused(String),
    /// Prometheus could not evaluate it (`execution`, `timeout`, `internal`, ...).
    Failed {
        /// Prometheus's `errorType`.
        error_type: String,
        /// Prometheus's `error`.
        error: String,
    },
}

/// The envelope of every Prometheus HTTP API answer, by its `status`.
#[derive(Debug, Deserialize)]
#[serde(tag = "status", rename_all = "lowercase")]
enum Envelope {
    /// `"success"`, with the query's data.
    Success {
        #[serde(default)]
        data: Option<QueryData>,
    },
    /// `"error"`, with Prometheus's `errorType` and `error`.
    Error {
        #[serde(default, rename = "errorType")]
        error_type: String,
        #[serde(default)]
        error: String,
    },
}

/// The data of an instant query, by its `resultType`.
#[derive(Debug, Deserialize)]
#[serde(tag = "resultType", content = "result", rename_all = "lowercase")]
enum QueryData {
    Scalar(Sample),
    Vector(Vec<Series>),
    Matrix(IgnoredAny),
    String(IgnoredAny),
}

/// A `[<unix time>, "<value>"]` sample.
#[derive(Debug, Deserialize)]
struct Sample(IgnoredAny, String);

/// One series of a vector: a float sample, or a native histogram.
#[derive(Debug, Deserialize)]
struct Series {
    #[serde(default)]
    value: Option<Sample>,
    #[serde(default)]
    histogram: Option<IgnoredAny>,
}

/// Reads an answer of `/api/v1/query` (whatever its HTTP status: errors come with 400, 422 or
/// 503 and the same envelope); `Err` with the reason when it is not one.
pub fn parse_answer(body: &[u8]) -> Result<Answer, String> {
    let envelope: Envelope =
        serde_json::from_slice(body).map_err(|e| format!("not a Prometheus API answer ({e})"))?;
    match envelope {
        Envelope::Success { data: Some(data) } => query_result(data),
        Envelope::Success { data: None } => Err("a successful answer without data".to_owned()),
        Envelope::Error { error_type, error } if error_type == "bad_data" => {
            Ok(Answer::Refused(error))
        }
        Envelope::Error { error_type, error } => Ok(Answer::Failed { error_type, error }),
    }
}

fn query_result(data: QueryData) -> Result<Answer, String> {
    match data {
        QueryData::Scalar(sample) => sample_value(&sample),
        QueryData::Vector(series) => match series.as_slice() {
            [] => Ok(Answer::NoData),
            [one] => match (&one.value, &one.histogram) {
                (Some(sample), _) => sample_value(sample),
                (None, Some(_)) => Ok(Answer::WrongType("native histogram".to_owned())),
                (None, None) => Err("a vector element without a value".to_owned()),
            },
            many => Ok(Answer::Series(many.len())),
        },
        QueryData::Matrix(_) => Ok(Answer::WrongType("matrix".to_owned())),
        QueryData::String(_) => Ok(Answer::WrongType("string".to_owned())),
    }
}

/// The value of a sample; NaN is no data.
fn sample_value(Sample(_, text): &Sample) -> Result<Answer, String> {
    let value: f64 = text
        .parse()
        .map_err(|_| format!("a sample value that is not a number: {text:?}"))?;
    Ok(if value.is_nan() {
        Answer::NoData
    } else {
        Answer::Value(value)
    })
}

/// The verdict on an answer, the value and the message: a value within `[min, max]` (bounds
/// included) passes, outside fails.
pub fn judge(
    answer: &Answer,
    min: Option<f64>,
    max: Option<f64>,
) -> (Verdict, Option<f64>, String) {
    const ONE_VALUE: &str = "it must return one value (a scalar, or a vector of one series: aggregate it, e.g. with sum)";
    match answer {
        Answer::Value(value) => {
            let value = *value;
            let bounds = match (min, max) {
                (Some(min), Some(max)) => format!("between {min} and {max}"),
                (Some(min), None) => format!("at least {min}"),
                (None, Some(max)) => format!("at most {max}"),
                (None, None) => "none".to_owned(),
            };
            let failed = max.is_some_and(|m| value > m) || min.is_some_and(|m| value < m);
            let verdict = if failed {
                Verdict::Failed
            } else {
                Verdict::Successful
            };
            (
                verdict,
                Some(value),
                format!("value {value}; limit: {bounds}"),
            )
        }
        Answer::NoData => (
            Verdict::Inconclusive,
            None,
            "query returned no data".to_owned(),
        ),
        Answer::Series(n) => (
            Verdict::Inconclusive,
            None,
            format!("query returned {n} series; {ONE_VALUE}"),
        ),
        Answer::WrongType(kind) => (
            Verdict::Invalid,
            None,
            format!("query returned a {kind}; {ONE_VALUE}"),
        ),
        Answer::Refused(error) => (
            Verdict::Invalid,
            None,
            format!("Prometheus refused the query: {error}"),
        ),
        Answer::Failed { error_type, error } => (
            Verdict::Inconclusive,
            None,
            format!("Prometheus could not evaluate the query ({error_type}): {error}"),
        ),
    }
}

/// Why Prometheus could not be asked, or did not answer as its API does.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PrometheusError {
    /// The check's address cannot be used (a spec error).
    #[error("Prometheus address {address:?} cannot be used: {reason}")]
    InvalidAddress {
        /// The address (without credentials).
        address: String,
        /// Why.
        reason: String,
    },
    /// The check's credentials cannot be sent (characters a header cannot hold).
    #[error("cannot query Prometheus at {url}: {problem}")]
    Credentials {
        /// The query endpoint.
        url: String,
        /// What is wrong, and where the credentials come from (never their bytes).
        problem: String,
    },
    /// No HTTPS client could be set up (for a private CA: its bundle cannot be used).
    #[error("cannot query Prometheus at {url}: {message}")]
    Tls {
        /// The query endpoint.
        url: String,
        /// Why.
        message: String,
    },
    /// Connecting or reading failed.
    #[error("cannot query Prometheus at {url}: {message}")]
    Unreachable {
        /// The query endpoint.
        url: String,
        /// The error with its causes.
        message: String,
    },
    /// The server refused the check's credentials, or wants some: HTTP 401 or 403.
    #[error("Prometheus at {url} refused the query's credentials (HTTP {status}): {what}")]
    Refused {
        /// The query endpoint.
        url: String,
        /// HTTP status.
        status: u16,
        /// What the check sent, and what to fix.
        what: String,
    },
    /// No answer within the timeout.
    #[error("Prometheus at {url} did not answer within {}s", .timeout.as_secs_f64())]
    Timeout {
        /// The query endpoint.
        url: String,
        /// The timeout.
        timeout: Duration,
    },
    /// An answer that is not one of the API's.
    #[error("Prometheus at {url} answered HTTP {status} with {reason}: {quoted}")]
    Unexpected {
        /// The query endpoint.
        url: String,
        /// HTTP status.
        status: u16,
        /// What is wrong with it.
        reason: String,
        /// The start of the answer.
        quoted: String,
    },
}

/// The URI of an instant query of `query` at `address`, and the endpoint to name in messages
/// (no query string). The address is the base URL of the HTTP API (a path prefix is kept).
pub fn query_uri(address: &str, query: &str) -> Result<(Uri, String), PrometheusError> {
    let mut url = Url::parse(address.trim()).map_err(|e| PrometheusError::InvalidAddress {
        address: address.to_owned(),
        reason: e.to_string(),
    })?;
    let has_credentials = !url.username().is_empty() || url.password().is_some();
    // Never shown or sent: credentials in the address are not supported.
    let _ = url.set_username("");
    let _ = url.set_password(None);
    let invalid = |url: &Url, reason: String| PrometheusError::InvalidAddress {
        address: url.to_string(),
        reason,
    };
    if !matches!(url.scheme(), "http" | "https") {
        return Err(invalid(
            &url,
            format!("the scheme must be http or https, not {}", url.scheme()),
        ));
    }
    if url.host().is_none() {
        return Err(invalid(&url, "it has no host".to_owned()));
    }
    if has_credentials {
        return Err(invalid(
            &url,
            "credentials in the address (user:password@) are not supported".to_owned(),
        ));
    }
    let path = format!("{}/api/v1/query", url.path().trim_end_matches('/'));
    url.set_path(&path);
    url.set_query(None);
    url.set_fragment(None);
    let endpoint = url.to_string();
    url.query_pairs_mut().append_pair("query", query);
    let uri = url
        .as_str()
        .parse::<Uri>()
        .map_err(|e| invalid(&url, e.to_string()))?;
    Ok((uri, endpoint))
}

type HttpClient = Client<HttpsConnector<HttpConnector>, Empty<Bytes>>;

/// Credentials a query carries (never shown: `Debug` names the kind and the user only).
#[derive(Clone, PartialEq, Eq)]
pub enum Credentials {
    /// `Authorization: Bearer <token>`.
    Bearer(String),
    /// HTTP basic auth.
    Basic {
        /// User name.
        username: String,
        /// Password.
        password: String,
    },
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Bearer(_) => f.write_str("Bearer(..)"),
            Self::Basic { username, .. } => write!(f, "Basic({username:?}, ..)"),
        }
    }
}

impl Credentials {
    /// The `Authorization` header, marked sensitive (kept out of logs and HPACK tables).
    pub fn header(&self) -> Result<HeaderValue, String> {
        let text = match self {
            Self::Bearer(token) => format!("Bearer {token}"),
            Self::Basic { username, password } => {
                format!("Basic {}", BASE64.encode(format!("{username}:{password}")))
            }
        };
        let mut value = HeaderValue::from_str(&text)
            .map_err(|_| "the credentials hold characters an HTTP header cannot".to_owned())?;
        value.set_sensitive(true);
        Ok(value)
    }
}

/// Credentials and where they were read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authorization {
    /// Sent with each query.
    pub credentials: Credentials,
    /// Where they come from, for messages: `basic auth in Secret shop/prom`.
    pub source: String,
}

/// A private CA bundle and where it was read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaBundle {
    /// PEM certificates that replace the system's CA certificates.
    pub pem: Vec<u8>,
    /// Where it comes from, for messages: `key "ca.crt" of Secret shop/prom-ca`.
    pub source: String,
}

/// How a check reaches its Prometheus beyond the address: credentials and a private CA, read
/// from the Secrets its spec names (nothing of either by default).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrometheusAccess {
    /// The `Authorization` of each query.
    pub authorization: Option<Authorization>,
    /// The CA that verifies an `https://` address.
    pub ca: Option<CaBundle>,
}

/// Clients with a private CA kept at once; more are dropped and made again on use.
const MAX_CA_CLIENTS: usize = 32;

/// A client of Prometheus servers: one connection pool verifying HTTPS with the system's CA
/// certificates, and one per private CA. Cheap to share; set up on first use.
#[derive(Debug)]
pub struct PrometheusClient {
    http: OnceLock<Result<HttpClient, String>>,
    /// Clients by the SHA-256 of their CA bundle.
    with_ca: Mutex<HashMap<String, HttpClient>>,
    timeout: Duration,
}

impl Default for PrometheusClient {
    fn default() -> Self {
        Self::new(QUERY_TIMEOUT)
    }
}

impl PrometheusClient {
    /// A client whose queries time out after `timeout`.
    pub fn new(timeout: Duration) -> Self {
        Self {
            http: OnceLock::new(),
            with_ca: Mutex::new(HashMap::new()),
            timeout,
        }
    }

    /// The client that verifies HTTPS with `ca` (the system's CA certificates when `None`).
    fn http(&self, ca: Option<&CaBundle>) -> Result<HttpClient, String> {
        let Some(ca) = ca else {
            return self
                .http
                .get_or_init(|| crate::http::client("Prometheus addresses"))
                .clone();
        };
        let key = hex::encode(Sha256::digest(&ca.pem));
        let mut clients = self.with_ca.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(client) = clients.get(&key) {
            return Ok(client.clone());
        }
        let client = crate::http::client_with_ca(&ca.pem)
            .map_err(|problem| format!("{problem} (the CA in {})", ca.source))?;
        if clients.len() >= MAX_CA_CLIENTS {
            clients.clear();
        }
        clients.insert(key, client.clone());
        Ok(client)
    }

    /// Runs `query` as an instant query on the Prometheus at `address`, with `access`'s
    /// credentials and CA.
    pub async fn instant_query(
        &self,
        address: &str,
        query: &str,
        access: &PrometheusAccess,
    ) -> Result<Answer, PrometheusError> {
        let (uri, url) = query_uri(address, query)?;
        let http = self
            .http(access.ca.as_ref())
            .map_err(|message| PrometheusError::Tls {
                url: url.clone(),
                message,
            })?;
        let mut request = Request::get(uri)
            .header(ACCEPT, "application/json")
            .header(USER_AGENT, concat!("twc/", env!("CARGO_PKG_VERSION")));
        if let Some(authorization) = &access.authorization {
            let value = authorization.credentials.header().map_err(|problem| {
                PrometheusError::Credentials {
                    url: url.clone(),
                    problem: format!("{problem} (the {})", authorization.source),
                }
            })?;
            request = request.header(AUTHORIZATION, value);
        }
        let request = request
            .body(Empty::new())
            .map_err(|e| PrometheusError::InvalidAddress {
                address: url.clone(),
                reason: e.to_string(),
            })?;
        // A failed handshake with a private CA names it: the server's certificate may be of
        // another CA.
        let verified_with = access
            .ca
            .as_ref()
            .map(|ca| {
                format!(
                    " (server certificate verified with the CA in {})",
                    ca.source
                )
            })
            .unwrap_or_default();
        let unreachable = |message: String| PrometheusError::Unreachable {
            url: url.clone(),
            message: format!("{message}{verified_with}"),
        };
        let exchange = async {
            let response = http
                .request(request)
                .await
                .map_err(|e| unreachable(error_chain(&e)))?;
            let status = response.status();
            let body = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
                .collect()
                .await
                .map_err(|e| {
                    if e.downcast_ref::<LengthLimitError>().is_some() {
                        unreachable(format!(
                            "the answer is larger than {MAX_ANSWER_BYTES} bytes (the query must \
                             return one value)"
                        ))
                    } else {
                        unreachable(format!("reading the answer: {}", error_chain(&*e)))
                    }
                })?
                .to_bytes();
            Ok::<_, PrometheusError>((status, body))
        };
        let (status, body) = tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| PrometheusError::Timeout {
                url: url.clone(),
                timeout: self.timeout,
            })??;
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(PrometheusError::Refused {
                url,
                status: status.as_u16(),
                what: refusal_advice(access.authorization.as_ref()),
            });
        }
        parse_answer(&body).map_err(|reason| PrometheusError::Unexpected {
            url,
            status: status.as_u16(),
            reason,
            quoted: String::from_utf8_lossy(&body)
                .chars()
                .take(QUOTED_ANSWER_CHARS)
                .collect::<String>()
                .trim()
                .to_owned(),
        })
    }
}

/// A Prometheus check of a build, its query's placeholders replaced.
#[derive(Debug, Clone, Copy)]
pub struct PrometheusCheck<'a> {
    /// Check name.
    pub name: &'a str,
    /// Base URL of the HTTP API.
    pub address: &'a str,
    /// The query to send.
    pub query: &'a str,
    /// Lowest passing value.
    pub min_value: Option<f64>,
    /// Highest passing value.
    pub max_value: Option<f64>,
    /// Credentials and CA.
    pub access: &'a PrometheusAccess,
}

/// What to fix after a 401 or 403: the credentials sent and where they come from, or that none
/// were sent.
fn refusal_advice(authorization: Option<&Authorization>) -> String {
    match authorization {
        Some(authorization) => format!(
            "check the {} (spec.rollout.analysis.checks[].prometheus.auth)",
            authorization.source
        ),
        None => {
            "the check sends none; set spec.rollout.analysis.checks[].prometheus.auth".to_owned()
        }
    }
}

/// The measurement of a check whose credentials or CA could not be read: inconclusive (a
/// Secret created or fixed counts from the next measurement), with what is wrong.
pub fn unreadable_access(name: &str, query: &str, problem: &dyn std::fmt::Display) -> Measurement {
    warn!(check = %name, %problem, "cannot read the credentials of a Prometheus check");
    Measurement {
        check: name.to_owned(),
        verdict: Verdict::Inconclusive,
        value: None,
        baseline: None,
        samples: None,
        message: format!("cannot read the credentials of the check: {problem}"),
        queries: vec![query.to_owned()],
    }
}

/// Measures a Prometheus check: one instant query, [`judge`]d; an unusable address is
/// `Invalid`, a query that could not be run `Inconclusive` with the error.
pub async fn measure(client: &PrometheusClient, check: &PrometheusCheck<'_>) -> Measurement {
    let answer = client
        .instant_query(check.address, check.query, check.access)
        .await;
    let (verdict, value, message) = match answer {
        Ok(answer) => judge(&answer, check.min_value, check.max_value),
        Err(err @ PrometheusError::InvalidAddress { .. }) => {
            (Verdict::Invalid, None, err.to_string())
        }
        Err(err) => (Verdict::Inconclusive, None, err.to_string()),
    };
    info!(check = %check.name, verdict = verdict.as_str(), ?value, "measured Prometheus check");
    Measurement {
        check: check.name.to_owned(),
        verdict,
        value,
        baseline: None,
        samples: None,
        message,
        queries: vec![check.query.to_owned()],
    }
}

#[cfg(test)]
mod tests {
    use tokio::{
        io::{AsyncReadExt, AsyncWriteExt},
        net::TcpListener,
    };

    use super::*;

    fn placeholders(current: Option<&'static str>) -> Placeholders<'static> {
        Placeholders {
            build_id: "v2-abc",
            current_build_id: current,
            deployment_name: "shop/orders",
            temporal_namespace: "prod",
            namespace: "shop",
            name: "orders",
        }
    }

    #[test]
    fn placeholders_are_replaced_once_each_and_others_kept() {
        let cases = [
            (r#"up{build="{{buildID}}"}"#, None, r#"up{build="v2-abc"}"#),
            (
                "{{version}} {{currentBuildID}} {{deploymentName}}",
                Some("v1-xyz"),
                "shop/orders:v2-abc v1-xyz shop/orders",
            ),
            ("[{{currentBuildID}}]", None, "[]"),
            (
                "{{temporalNamespace}}/{{namespace}}/{{name}}",
                None,
                "prod/shop/orders",
            ),
            ("{{name}}{{name}}", None, "ordersorders"),
            ("{{unknown}} {{ name}} {{", None, "{{unknown}} {{ name}} {{"),
            ("sum(rate(x[5m]))", None, "sum(rate(x[5m]))"),
        ];
        for (query, current, expected) in cases {
            assert_eq!(
                substitute(query, &placeholders(current)),
                expected,
                "{query}"
            );
        }
        // A value that looks like a placeholder stays as it is.
        let tricky = Placeholders {
            build_id: "{{name}}",
            ..placeholders(None)
        };
        assert_eq!(substitute("{{buildID}}", &tricky), "{{name}}");
        // Every documented placeholder is replaced.
        for placeholder in PROMQL_PLACEHOLDERS {
            let replaced = substitute(placeholder, &placeholders(Some("v1")));
            assert!(!replaced.contains("{{"), "{placeholder} -> {replaced}");
        }
    }

    #[test]
    fn answers_are_one_value_no_data_many_series_or_errors() {
        let cases = [
            (
                r#"{"status":"success","data":{"resultType":"scalar","result":[1700000000.5,"0.25"]}}"#,
                Ok(Answer::Value(0.25)),
            ),
            (
                r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"job":"w"},"value":[1700000000,"42"]}]}}"#,
                Ok(Answer::Value(42.0)),
            ),
            (
                r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"+Inf"]}]}}"#,
                Ok(Answer::Value(f64::INFINITY)),
            ),
            (
                r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#,
                Ok(Answer::NoData),
            ),
            (
                r#"{"status":"success","data":{"resultType":"scalar","result":[1,"NaN"]}}"#,
                Ok(Answer::NoData),
            ),
            (
                r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"a":"1"},"value":[1,"1"]},{"metric":{"a":"2"},"value":[1,"2"]}]}}"#,
                Ok(Answer::Series(2)),
            ),
            (
                r#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#,
                Ok(Answer::WrongType("matrix".to_owned())),
            ),
            (
                r#"{"status":"error","errorType":"bad_data","error":"invalid parameter \"query\": 1:5: parse error: unexpected <EOF>"}"#,
                Ok(Answer::Refused(
                    "invalid parameter \"query\": 1:5: parse error: unexpected <EOF>".to_owned(),
                )),
            ),
            (
                r#"{"status":"error","errorType":"execution","error":"query processing would load too many samples"}"#,
                Ok(Answer::Failed {
                    error_type: "execution".to_owned(),
                    error: "query processing would load too many samples".to_owned(),
                }),
            ),
            (
                "<html>Bad Gateway</html>",
                Err("not a Prometheus API answer"),
            ),
            (
                r#"{"status":"success","data":{"resultType":"scalar","result":[1,"lots"]}}"#,
                Err("not a number"),
            ),
            (r#"{"status":"success"}"#, Err("without data")),
            (
                r#"{"status":"success","data":{"resultType":"string","result":[1,"text"]}}"#,
                Ok(Answer::WrongType("string".to_owned())),
            ),
            (
                r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"histogram":[1,{"count":"3"}]}]}}"#,
                Ok(Answer::WrongType("native histogram".to_owned())),
            ),
            (
                r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{}}]}}"#,
                Err("without a value"),
            ),
            (
                r#"{"status":"success","data":{"resultType":"scalar","result":{"v":1}}}"#,
                Err("not a Prometheus API answer"),
            ),
            (
                r#"{"status":"pending"}"#,
                Err("not a Prometheus API answer"),
            ),
        ];
        for (body, expected) in cases {
            match (parse_answer(body.as_bytes()), expected) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{body}"),
                (Err(got), Err(part)) => assert!(got.contains(part), "{body}: {got}"),
                (got, want) => panic!("{body}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn verdicts_compare_the_value_with_the_bounds() {
        use Verdict::{Failed, Inconclusive, Invalid, Successful};
        let cases = [
            (
                Answer::Value(0.04),
                None,
                Some(0.05),
                Successful,
                "value 0.04; limit: at most 0.05",
            ),
            (
                Answer::Value(0.05),
                None,
                Some(0.05),
                Successful,
                "value 0.05; limit: at most 0.05",
            ),
            (
                Answer::Value(0.2),
                None,
                Some(0.05),
                Failed,
                "value 0.2; limit: at most 0.05",
            ),
            (
                Answer::Value(0.8),
                Some(0.9),
                None,
                Failed,
                "value 0.8; limit: at least 0.9",
            ),
            (
                Answer::Value(0.95),
                Some(0.9),
                Some(1.0),
                Successful,
                "value 0.95; limit: between 0.9 and 1",
            ),
            (
                Answer::NoData,
                None,
                Some(1.0),
                Inconclusive,
                "query returned no data",
            ),
            (
                Answer::Series(3),
                None,
                Some(1.0),
                Inconclusive,
                "query returned 3 series; it must return one value",
            ),
            (
                Answer::WrongType("matrix".to_owned()),
                None,
                Some(1.0),
                Invalid,
                "query returned a matrix; it must return one value",
            ),
            (
                Answer::Refused("parse error: unexpected <EOF>".to_owned()),
                None,
                Some(1.0),
                Invalid,
                "Prometheus refused the query: parse error: unexpected <EOF>",
            ),
            (
                Answer::Failed {
                    error_type: "timeout".to_owned(),
                    error: "query timed out".to_owned(),
                },
                None,
                Some(1.0),
                Inconclusive,
                "Prometheus could not evaluate the query (timeout): query timed out",
            ),
        ];
        for (answer, min, max, verdict, message) in cases {
            let (got, value, text) = judge(&answer, min, max);
            assert_eq!(got, verdict, "{answer:?}");
            assert!(text.starts_with(message), "{answer:?}: {text}");
            match answer {
                Answer::Value(v) => assert_eq!(value, Some(v)),
                _ => assert_eq!(value, None),
            }
        }
    }

    #[test]
    fn the_query_goes_to_the_api_path_of_the_address_url_encoded() {
        let cases = [
            (
                "http://prometheus.monitoring:9090",
                "http://prometheus.monitoring:9090/api/v1/query",
            ),
            (
                "https://metrics.example/",
                "https://metrics.example/api/v1/query",
            ),
            (
                "http://gateway.example/prometheus/",
                "http://gateway.example/prometheus/api/v1/query",
            ),
        ];
        for (address, endpoint) in cases {
            let (uri, shown) = query_uri(address, r#"sum(up{job="a b"}) > 0"#).expect("valid");
            assert_eq!(shown, endpoint);
            assert_eq!(
                uri.to_string(),
                format!("{endpoint}?query=sum%28up%7Bjob%3D%22a+b%22%7D%29+%3E+0")
            );
        }
        let invalid = [
            ("prometheus:9090", "the scheme must be http or https"),
            ("ftp://prometheus", "the scheme must be http or https"),
            ("not a url", "relative URL without a base"),
            (
                "http://admin:hunter2@prometheus",
                "credentials in the address",
            ),
        ];
        for (address, reason) in invalid {
            let err = query_uri(address, "up").expect_err("invalid");
            let text = err.to_string();
            assert!(text.contains(reason), "{address}: {text}");
            assert!(!text.contains("hunter2"), "{text}");
        }
    }

    /// A one-connection HTTP server answering `status` with `body`; returns its address and
    /// the request head it received (request line and headers).
    async fn serve_once(
        status: &'static str,
        body: &'static str,
    ) -> (String, tokio::task::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = format!("http://{}", listener.local_addr().expect("address"));
        let served = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.expect("accept");
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = stream.read(&mut buf).await.expect("read");
                if n == 0 {
                    break;
                }
                request.extend_from_slice(&buf[..n]);
            }
            let response = format!(
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
                 connection: close\r\n\r\n{body}",
                body.len()
            );
            stream.write_all(response.as_bytes()).await.expect("write");
            String::from_utf8_lossy(&request).into_owned()
        });
        (address, served)
    }

    #[tokio::test]
    async fn a_value_is_measured_against_a_live_server() {
        let (address, served) = serve_once(
            "200 OK",
            r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"0.5"]}]}}"#,
        )
        .await;
        let client = PrometheusClient::default();
        let query = substitute(r#"avg(ok{build="{{buildID}}"})"#, &placeholders(None));
        let check = PrometheusCheck {
            name: "ok-ratio",
            address: &address,
            query: &query,
            min_value: Some(0.9),
            max_value: None,
            access: &PrometheusAccess::default(),
        };
        let measurement = measure(&client, &check).await;
        assert_eq!(
            (measurement.verdict, measurement.value),
            (Verdict::Failed, Some(0.5))
        );
        assert_eq!(measurement.message, "value 0.5; limit: at least 0.9");
        assert_eq!(
            measurement.queries,
            vec![r#"avg(ok{build="v2-abc"})"#.to_owned()]
        );
        let head = served.await.expect("served");
        assert_eq!(
            head.lines().next(),
            Some("GET /api/v1/query?query=avg%28ok%7Bbuild%3D%22v2-abc%22%7D%29 HTTP/1.1")
        );
        assert!(
            !head.to_ascii_lowercase().contains("authorization"),
            "{head}"
        );
    }

    fn basic(username: &str, password: &str) -> Credentials {
        Credentials::Basic {
            username: username.into(),
            password: password.into(),
        }
    }

    #[test]
    fn credentials_make_a_sensitive_authorization_header() {
        // (credentials, the header's value or part of the message)
        let cases = [
            (Credentials::Bearer("t0ken".into()), Ok("Bearer t0ken")),
            // base64("user:pass")
            (basic("user", "pass"), Ok("Basic dXNlcjpwYXNz")),
            // base64("user:p:ss w\u{f6}rd"): any password, even with a colon or non-ASCII.
            (
                basic("user", "p:ss w\u{f6}rd"),
                Ok("Basic dXNlcjpwOnNzIHfDtnJk"),
            ),
            (
                Credentials::Bearer("t0k\nen".into()),
                Err("the credentials hold characters an HTTP header cannot"),
            ),
        ];
        for (credentials, expected) in cases {
            match (credentials.header(), expected) {
                (Ok(value), Ok(text)) => {
                    assert_eq!(value.to_str().ok(), Some(text), "{credentials:?}");
                    assert!(value.is_sensitive(), "{credentials:?}");
                }
                (Err(message), Err(part)) => {
                    assert!(message.contains(part), "{message}");
                    assert!(!message.contains("t0k"), "{message}");
                }
                (got, want) => panic!("{credentials:?}: got {got:?}, want {want:?}"),
            }
        }
        let shown = format!("{:?}", basic("user", "hunter2"));
        assert!(
            !shown.contains("hunter2") && shown.contains("user"),
            "{shown}"
        );
        assert_eq!(
            format!("{:?}", Credentials::Bearer("t0ken".into())),
            "Bearer(..)"
        );
    }

    #[tokio::test]
    async fn credentials_go_in_the_authorization_header() {
        const ANSWER: &str =
            r#"{"status":"success","data":{"resultType":"scalar","result":[1,"1"]}}"#;
        let cases = [
            (
                Credentials::Bearer("t0ken".into()),
                "authorization: Bearer t0ken",
            ),
            (basic("user", "pass"), "authorization: Basic dXNlcjpwYXNz"),
        ];
        for (credentials, header) in cases {
            let (address, served) = serve_once("200 OK", ANSWER).await;
            let access = PrometheusAccess {
                authorization: Some(Authorization {
                    credentials: credentials.clone(),
                    source: "basic auth in Secret shop/prom".into(),
                }),
                ca: None,
            };
            let answer = PrometheusClient::default()
                .instant_query(&address, "up", &access)
                .await;
            assert_eq!(answer.ok(), Some(Answer::Value(1.0)), "{credentials:?}");
            let head = served.await.expect("served");
            assert!(head.lines().any(|l| l == header), "{head}");
        }
    }

    #[tokio::test]
    async fn refused_credentials_are_named_with_where_they_come_from() {
        // (status, where the credentials come from, part of the message)
        let cases = [
            (
                "401 Unauthorized",
                Some("basic auth in Secret shop/prom"),
                "refused the query's credentials (HTTP 401): check the basic auth in Secret \
                 shop/prom (spec.rollout.analysis.checks[].prometheus.auth)",
            ),
            (
                "403 Forbidden",
                Some("bearer token in key \"token\" of Secret shop/prom"),
                "refused the query's credentials (HTTP 403): check the bearer token in key \
                 \"token\" of Secret shop/prom",
            ),
            (
                "401 Unauthorized",
                None,
                "refused the query's credentials (HTTP 401): the check sends none; set \
                 spec.rollout.analysis.checks[].prometheus.auth",
            ),
        ];
        for (status, source, expected) in cases {
            let (address, _served) = serve_once(status, "Unauthorized").await;
            let access = PrometheusAccess {
                authorization: source.map(|source| Authorization {
                    credentials: basic("user", "wrong-password"),
                    source: source.to_owned(),
                }),
                ca: None,
            };
            let check = PrometheusCheck {
                name: "c",
                address: &address,
                query: "up",
                min_value: None,
                max_value: Some(1.0),
                access: &access,
            };
            let measurement = measure(&PrometheusClient::default(), &check).await;
            assert_eq!(measurement.verdict, Verdict::Inconclusive, "{status}");
            assert!(
                measurement.message.contains(expected),
                "{}",
                measurement.message
            );
            assert!(
                !measurement.message.contains("wrong-password"),
                "{}",
                measurement.message
            );
        }
    }

    #[tokio::test]
    async fn a_ca_bundle_that_holds_no_certificate_is_named_with_its_secret() {
        let access = PrometheusAccess {
            authorization: None,
            ca: Some(CaBundle {
                pem: b"not a certificate".to_vec(),
                source: "key \"ca.crt\" of Secret shop/prom-ca".into(),
            }),
        };
        let err = PrometheusClient::default()
            .instant_query("https://prometheus.example", "up", &access)
            .await
            .expect_err("no CA");
        assert!(
            err.to_string().contains(
                "the CA bundle holds no PEM certificate (the CA in key \"ca.crt\" of Secret \
                 shop/prom-ca)"
            ),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_server_certificate_the_private_ca_did_not_sign_names_the_ca() {
        // Plain HTTP where the address says https, verified with a private CA: the handshake
        // fails, and the message says which CA was used.
        let plain = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = format!("https://{}", plain.local_addr().expect("address"));
        let _plain = tokio::spawn(async move {
            if let Ok((mut stream, _)) = plain.accept().await {
                let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
            }
        });
        let access = PrometheusAccess {
            authorization: None,
            ca: Some(CaBundle {
                pem: include_bytes!("k8s/testdata/client.crt").to_vec(),
                source: "key \"ca.crt\" of Secret shop/prom-ca".into(),
            }),
        };
        let err = PrometheusClient::new(Duration::from_secs(5))
            .instant_query(&address, "up", &access)
            .await
            .expect_err("no TLS");
        let message = err.to_string();
        assert!(
            message.starts_with(&format!("cannot query Prometheus at {address}"))
                && message.ends_with(
                    "(server certificate verified with the CA in key \"ca.crt\" of Secret \
                     shop/prom-ca)"
                ),
            "{message}"
        );
    }

    #[tokio::test]
    async fn a_query_prometheus_cannot_parse_is_invalid_with_its_error() {
        let (address, _served) = serve_once(
            "400 Bad Request",
            r#"{"status":"error","errorType":"bad_data","error":"1:4: parse error: unclosed left parenthesis"}"#,
        )
        .await;
        let check = PrometheusCheck {
            name: "broken",
            address: &address,
            query: "sum(",
            min_value: None,
            max_value: Some(1.0),
            access: &PrometheusAccess::default(),
        };
        let measurement = measure(&PrometheusClient::default(), &check).await;
        assert_eq!(measurement.verdict, Verdict::Invalid);
        assert_eq!(
            measurement.message,
            "Prometheus refused the query: 1:4: parse error: unclosed left parenthesis"
        );
    }

    #[tokio::test]
    async fn unreachable_failing_or_silent_servers_are_inconclusive() {
        // Nothing listens on a port that was just free.
        let free = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port");
        let client = PrometheusClient::new(Duration::from_millis(300));
        let refused = format!("http://{free}");
        let (bad_gateway, _a) = serve_once("502 Bad Gateway", "upstream down").await;
        // Accepts, never answers.
        let silent = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let silent_address = format!("http://{}", silent.local_addr().expect("address"));
        // Plain HTTP where the address says https: the TLS handshake fails.
        let plain = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let plain_address = format!("https://{}", plain.local_addr().expect("address"));
        let _plain = tokio::spawn(async move {
            if let Ok((mut stream, _)) = plain.accept().await {
                let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
            }
        });
        let cases = [
            (refused.as_str(), "cannot query Prometheus at"),
            (
                plain_address.as_str(),
                "cannot query Prometheus at https://",
            ),
            (
                bad_gateway.as_str(),
                "answered HTTP 502 with not a Prometheus API answer",
            ),
            (silent_address.as_str(), "did not answer within 0.3s"),
        ];
        for (address, part) in cases {
            let check = PrometheusCheck {
                name: "c",
                address,
                query: "up",
                min_value: None,
                max_value: Some(1.0),
                access: &PrometheusAccess::default(),
            };
            let measurement = measure(&client, &check).await;
            assert_eq!(measurement.verdict, Verdict::Inconclusive, "{address}");
            assert!(
                measurement.message.contains(part),
                "{address}: {}",
                measurement.message
            );
        }
        drop(silent);
    }
}
