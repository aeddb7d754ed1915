//! Cache of clients for the workers' Temporal servers, one per TemporalConnection version and
//! namespace, plus the per-namespace read budgets.

use std::{
    collections::{HashMap, HashSet},
    fmt,
    sync::{Arc, Mutex, PoisonError, Weak},
    time::Duration,
};

use temporalio_client::{
    Client, ClientOptions, ClientTlsOptions, Connection, ConnectionOptions, TlsOptions, Url,
};
use tokio::{sync::OnceCell, time::Instant};
use tracing::{debug, info, warn};
use twc_workflows::model::{BlockReason, Blocked};

use crate::{
    connection::{ConnectionAuth, ConnectionConfig},
    metrics::Metrics,
    temporal::{
        budget::{DEFAULT_READ_BURST, DEFAULT_READ_RATE, Replicas, TokenBucket},
        error::{StatusClass, TemporalError},
    },
};

/// Settings of a [`ClientPool`].
#[derive(Debug, Clone)]
pub struct PoolOptions {
    /// Identity of the controller: client identity on every call and the manager identity it
    /// claims on worker deployments.
    pub identity: String,
    /// Worker-deployment reads per second per Temporal namespace (default 40; the server's
    /// default limit is 50).
    pub read_rate_per_sec: f64,
    /// Reads allowed at once after an idle period (default 10).
    pub read_burst: u32,
    /// The live replicas the read rate and burst are divided between (default one).
    pub replicas: Replicas,
    /// Limit for establishing a connection (TCP + TLS + first call), default 10 s.
    pub connect_timeout: Duration,
    /// Clients unused for this long are dropped from the cache (default 1 h).
    pub idle_ttl: Duration,
    /// Where every call to Temporal is counted (default: a registry of its own).
    pub metrics: Arc<Metrics>,
}

impl PoolOptions {
    /// Defaults with the given controller identity.
    pub fn new(identity: impl Into<String>) -> Self {
        Self {
            identity: identity.into(),
            read_rate_per_sec: DEFAULT_READ_RATE,
            read_burst: DEFAULT_READ_BURST,
            replicas: Replicas::one(),
            connect_timeout: Duration::from_secs(10),
            idle_ttl: Duration::from_secs(3600),
            metrics: Arc::new(Metrics::new()),
        }
    }
}

/// Cache key: the connection's `cache_key` (changes on any spec or Secret change) and the
/// Temporal namespace.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PoolKey {
    /// [`ConnectionConfig::cache_key`].
    pub cache_key: String,
    /// Temporal namespace.
    pub namespace: String,
}

impl PoolKey {
    /// The key of a connection config.
    pub fn of(config: &ConnectionConfig) -> Self {
        Self {
            cache_key: config.cache_key.clone(),
            namespace: config.temporal_namespace.clone(),
        }
    }
}

/// How long a failed connection attempt is remembered: callers queued behind it (and calls in
/// this window) get the same error at once instead of each waiting for their own timeout.
const FAILURE_TTL: Duration = Duration::from_secs(5);

/// A query feature some Temporal servers or visibility stores refuse. A refusal is remembered
/// on the client's pool entry, so it is asked once per connection and forgotten with it (on
/// eviction, idle expiry, or a changed connection spec).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QueryFeature {
    /// `ORDER BY` in a list query (the SQL visibility stores refuse it).
    OrderBy,
    /// The `TemporalReportedProblems` search attribute (older servers do not know it).
    ReportedProblems,
}

struct Entry {
    client: OnceCell<Client>,
    last_used: Mutex<Instant>,
    failure: Mutex<Option<(Instant, TemporalError)>>,
    refused: Mutex<HashSet<QueryFeature>>,
}

impl Entry {
    fn touch(&self) {
        *self
            .last_used
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }

    /// Connects unless an attempt failed less than [`FAILURE_TTL`] ago.
    async fn connect(
        &self,
        options: &PoolOptions,
        config: &ConnectionConfig,
    ) -> Result<Client, TemporalError> {
        if let Some((at, err)) = self
            .failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            && at.elapsed() < FAILURE_TTL
        {
            return Err(err.clone());
        }
        let result = connect(options, config).await;
        let mut failure = self.failure.lock().unwrap_or_else(PoisonError::into_inner);
        *failure = result.as_ref().err().map(|e| (Instant::now(), e.clone()));
        result
    }

    fn idle_for(&self, now: Instant) -> Duration {
        now.saturating_duration_since(
            *self
                .last_used
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }
}

struct PoolInner {
    options: PoolOptions,
    entries: Mutex<HashMap<PoolKey, Arc<Entry>>>,
    /// Read budgets by (host:port, namespace).
    budgets: Mutex<HashMap<(String, String), Arc<TokenBucket>>>,
}

/// Shared cache of Temporal clients. Cheap to clone; [`ClientPool::get`] is cheap on a hit
/// (a map lookup and an `Arc` clone), so call it in every activity.
#[derive(Clone)]
pub struct ClientPool {
    inner: Arc<PoolInner>,
}

impl fmt::Debug for ClientPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientPool")
            .field("identity", &self.inner.options.identity)
            .field("clients", &self.len())
            .finish()
    }
}

impl ClientPool {
    /// An empty pool.
    pub fn new(options: PoolOptions) -> Self {
        Self {
            inner: Arc::new(PoolInner {
                options,
                entries: Mutex::new(HashMap::new()),
                budgets: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The controller identity.
    pub fn identity(&self) -> &str {
        &self.inner.options.identity
    }

    /// Number of cached clients (connected or connecting).
    pub fn len(&self) -> usize {
        self.inner.lock_entries().len()
    }

    /// Whether no client is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The client for a connection, connecting on first use. Concurrent callers for the same key
    /// share one connection attempt. Failures are not cached: the next call tries again.
    /// A server that refuses the credentials (a rejected API key or client certificate) is
    /// `AuthSecretInvalid` with the server's words; anything else `TemporalClientCreationFailed`.
    pub async fn get(&self, config: &ConnectionConfig) -> Result<TemporalClient, Blocked> {
        self.try_get(config)
            .await
            .map_err(|err| creation_failed(config, &err))
    }

    /// Like [`ClientPool::get`], with the typed error.
    pub async fn try_get(
        &self,
        config: &ConnectionConfig,
    ) -> Result<TemporalClient, TemporalError> {
        let key = PoolKey::of(config);
        let entry = self.inner.entry(&key);
        let client = entry
            .client
            .get_or_try_init(|| entry.connect(&self.inner.options, config))
            .await?
            .clone();
        entry.touch();
        Ok(TemporalClient {
            client,
            key,
            budget: self.budget(&config.host_port, &config.temporal_namespace),
            identity: self.inner.options.identity.clone(),
            metrics: Arc::clone(&self.inner.options.metrics),
            pool: Arc::downgrade(&self.inner),
            entry: Arc::downgrade(&entry),
        })
    }

    /// Drops the cached client of a key; the next [`ClientPool::get`] reconnects. Call on
    /// Unauthenticated/PermissionDenied (operations of this module do it themselves).
    pub fn evict(&self, key: &PoolKey) {
        if self.inner.lock_entries().remove(key).is_some() {
            info!(cache_key = %key.cache_key, namespace = %key.namespace, "evicted Temporal client");
        }
    }

    /// The read budget of a Temporal namespace on a server, shared by every client of it.
    pub fn budget(&self, host_port: &str, namespace: &str) -> Arc<TokenBucket> {
        let mut budgets = self
            .inner
            .budgets
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let key = (host_port.to_owned(), namespace.to_owned());
        if !budgets.contains_key(&key) {
            // A bucket nobody holds that has refilled is the same as a new one: forget it, so
            // the map holds only the servers and namespaces in use.
            budgets.retain(|_, bucket| Arc::strong_count(bucket) > 1 || !bucket.is_full());
        }
        Arc::clone(budgets.entry(key).or_insert_with(|| {
            Arc::new(TokenBucket::shared(
                self.inner.options.read_rate_per_sec,
                self.inner.options.read_burst,
                self.inner.options.replicas.clone(),
            ))
        }))
    }
}

impl PoolInner {
    fn lock_entries(&self) -> std::sync::MutexGuard<'_, HashMap<PoolKey, Arc<Entry>>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The entry of a key, created if missing; drops entries idle for longer than the TTL.
    fn entry(&self, key: &PoolKey) -> Arc<Entry> {
        let mut entries = self.lock_entries();
        if let Some(entry) = entries.get(key) {
            return Arc::clone(entry);
        }
        let now = Instant::now();
        let ttl = self.options.idle_ttl;
        entries.retain(|k, e| {
            let keep = e.idle_for(now) < ttl;
            if !keep {
                debug!(cache_key = %k.cache_key, namespace = %k.namespace, "dropping idle Temporal client");
            }
            keep
        });
        let entry = Arc::new(Entry {
            client: OnceCell::new(),
            last_used: Mutex::new(now),
            failure: Mutex::new(None),
            refused: Mutex::new(HashSet::new()),
        });
        entries.insert(key.clone(), Arc::clone(&entry));
        entry
    }

    /// Removes `entry` if it is still the cached one for `key` (a stale handle never evicts a
    /// client that was rebuilt since).
    fn evict_entry(&self, key: &PoolKey, entry: &Weak<Entry>) {
        let mut entries = self.lock_entries();
        let current = entries
            .get(key)
            .is_some_and(|e| std::ptr::eq(Arc::as_ptr(e), entry.as_ptr()));
        if current {
            entries.remove(key);
            info!(cache_key = %key.cache_key, namespace = %key.namespace, "evicted Temporal client after an authentication failure");
        }
    }
}

/// A client of the workers' Temporal, handed out by [`ClientPool`]. Cheap to clone.
#[derive(Clone)]
pub struct TemporalClient {
    client: Client,
    key: PoolKey,
    budget: Arc<TokenBucket>,
    identity: String,
    metrics: Arc<Metrics>,
    pool: Weak<PoolInner>,
    entry: Weak<Entry>,
}

impl fmt::Debug for TemporalClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TemporalClient")
            .field("key", &self.key)
            .field("identity", &self.identity)
            .finish()
    }
}

impl TemporalClient {
    /// The SDK client (clone it for raw `WorkflowService` calls, which take `&mut self`).
    pub fn raw(&self) -> &Client {
        &self.client
    }

    /// The pool key of this client.
    pub fn key(&self) -> &PoolKey {
        &self.key
    }

    /// The controller identity the client was created with.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Waits for a token of the namespace's worker-deployment read budget, and counts the read
    /// as sent (`twc_temporal_read_grants_total`). Every read of this module calls it right
    /// before its call; call it before other worker-deployment reads too (e.g.
    /// DescribeTaskQueue).
    pub async fn acquire_read(&self) {
        self.budget.acquire().await;
        self.metrics.read_granted();
    }

    /// Awaits one `WorkflowService` call and counts it in `twc_temporal_requests_total` under
    /// `operation` (the RPC name), with its outcome (`success` or the gRPC status code).
    pub async fn observe<T>(
        &self,
        operation: &'static str,
        call: impl Future<Output = Result<T, temporalio_client::tonic::Status>>,
    ) -> Result<T, temporalio_client::tonic::Status> {
        let result = call.await;
        let outcome = match &result {
            Ok(_) => "success",
            Err(status) => code_label(status.code()),
        };
        self.metrics.temporal_request(operation, outcome);
        result
    }

    /// Whether the server of this connection refused `feature` before.
    pub fn refuses(&self, feature: QueryFeature) -> bool {
        self.entry.upgrade().is_some_and(|entry| {
            entry
                .refused
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .contains(&feature)
        })
    }

    /// Remembers that the server of this connection refused `feature`, for as long as the
    /// connection is cached.
    pub fn mark_refused(&self, feature: QueryFeature) {
        if let Some(entry) = self.entry.upgrade() {
            entry
                .refused
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(feature);
        }
    }

    /// Drops this client from its pool, so the next `get` reconnects with fresh credentials.
    pub fn evict(&self) {
        if let Some(pool) = self.pool.upgrade() {
            pool.evict_entry(&self.key, &self.entry);
        }
    }

    /// Turns a failed call into a [`TemporalError`], evicting the client when the credentials
    /// were rejected.
    pub(crate) fn rpc_error(
        &self,
        op: &'static str,
        target: impl Into<String>,
        status: &temporalio_client::tonic::Status,
    ) -> TemporalError {
        let err = TemporalError::rpc(op, target, status);
        if err.needs_eviction() {
            warn!(error = %err, "Temporal rejected the credentials; evicting the client");
            self.evict();
        }
        err
    }
}

/// How a failed connection attempt is shown: the server's refusal of the credentials blames
/// them, anything else the client creation.
pub(crate) fn creation_failed(config: &ConnectionConfig, err: &TemporalError) -> Blocked {
    if err.needs_eviction() {
        let credential = match &config.auth {
            ConnectionAuth::MutualTls { .. } => "client certificate",
            ConnectionAuth::ApiKey { .. } => "API key",
            ConnectionAuth::None => "connection (it has no credentials)",
        };
        Blocked {
            reason: BlockReason::AuthSecretInvalid,
            message: format!(
                "Temporal refused the {credential} for namespace '{}': {err}",
                config.temporal_namespace
            ),
        }
    } else {
        Blocked {
            reason: BlockReason::TemporalClientCreationFailed,
            message: format!(
                "cannot create a Temporal client for namespace '{}': {err}",
                config.temporal_namespace
            ),
        }
    }
}

/// The `outcome` label of a failed call: its gRPC status code in snake case (`not_found`,
/// `unavailable`, ...).
pub fn code_label(code: temporalio_client::tonic::Code) -> &'static str {
    use temporalio_client::tonic::Code;
    match code {
        Code::Ok => "success",
        Code::Cancelled => "cancelled",
        Code::Unknown => "unknown",
        Code::InvalidArgument => "invalid_argument",
        Code::DeadlineExceeded => "deadline_exceeded",
        Code::NotFound => "not_found",
        Code::AlreadyExists => "already_exists",
        Code::PermissionDenied => "permission_denied",
        Code::ResourceExhausted => "resource_exhausted",
        Code::FailedPrecondition => "failed_precondition",
        Code::Aborted => "aborted",
        Code::OutOfRange => "out_of_range",
        Code::Unimplemented => "unimplemented",
        Code::Internal => "internal",
        Code::Unavailable => "unavailable",
        Code::DataLoss => "data_loss",
        Code::Unauthenticated => "unauthenticated",
    }
}

/// The URL and TLS settings for a connection: TLS when a server name, client certificate or API
/// key is configured; system roots unless a CA is given.
pub(crate) fn endpoint(
    config: &ConnectionConfig,
) -> Result<(Url, Option<TlsOptions>), TemporalError> {
    let invalid = |message: String| TemporalError::InvalidConfig {
        host_port: config.host_port.clone(),
        message,
    };
    let host_port = config
        .host_port
        .trim()
        .trim_start_matches("http://")
        .trim_start_matches("https://")
        .trim_end_matches('/');
    if host_port.is_empty() {
        return Err(invalid("empty hostPort".to_owned()));
    }
    let server_name = config
        .server_name
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned);
    let explicit_ca = config.server_ca_pem.clone();
    let tls = match &config.auth {
        ConnectionAuth::None if server_name.is_none() && explicit_ca.is_none() => None,
        ConnectionAuth::None | ConnectionAuth::ApiKey { .. } => Some(
            TlsOptions::builder()
                .maybe_domain(server_name)
                .maybe_server_root_ca_cert(explicit_ca)
                .build(),
        ),
        ConnectionAuth::MutualTls {
            cert_pem,
            key_pem,
            ca_pem,
        } => Some(
            TlsOptions::builder()
                .maybe_domain(server_name)
                .maybe_server_root_ca_cert(explicit_ca.or_else(|| ca_pem.clone()))
                .client_tls_options(
                    ClientTlsOptions::builder()
                        .client_cert(cert_pem.clone())
                        .client_private_key(key_pem.clone())
                        .build(),
                )
                .build(),
        ),
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let url = Url::parse(&format!("{scheme}://{host_port}"))
        .map_err(|e| invalid(format!("'{host_port}' is not a valid host:port: {e}")))?;
    Ok((url, tls))
}

async fn connect(
    options: &PoolOptions,
    config: &ConnectionConfig,
) -> Result<Client, TemporalError> {
    let (url, tls) = endpoint(config)?;
    let api_key = match &config.auth {
        ConnectionAuth::ApiKey { key } => Some(key.clone()),
        _ => None,
    };
    debug!(
        url = %url,
        namespace = %config.temporal_namespace,
        tls = tls.is_some(),
        auth = ?config.auth,
        "connecting to Temporal"
    );
    let connection_options = ConnectionOptions::new(url)
        .identity(options.identity.clone())
        .maybe_tls_options(tls)
        .maybe_api_key(api_key)
        .connect_timeout(options.connect_timeout)
        .build();
    let connecting = Connection::connect(connection_options);
    // The connect timeout covers TCP/TLS only; bound the first call (get_system_info) too.
    let connected = tokio::time::timeout(options.connect_timeout * 2, connecting).await;
    let outcome = match &connected {
        Ok(Ok(_)) => "success",
        Ok(Err(_)) => "error",
        Err(_) => "timeout",
    };
    options.metrics.temporal_request("Connect", outcome);
    let connection = match connected {
        Ok(Ok(connection)) => connection,
        Ok(Err(err)) => {
            let mut error = TemporalError::connect(&config.host_port, &err);
            // A closed connection right after the handshake (with or without a gRPC status of
            // the first call) may be the server refusing the client certificate: ask it.
            if error.class() == StatusClass::Transient
                && let Some(alert) = super::tls_probe::refused_certificate(config).await
                && let TemporalError::Connect {
                    message,
                    refused_certificate,
                    ..
                } = &mut error
            {
                message.push_str(&format!(
                    "; the server refused the client certificate: received fatal alert: {alert:?}"
                ));
                *refused_certificate = Some(alert);
            }
            return Err(error);
        }
        Err(_) => {
            return Err(TemporalError::Connect {
                host_port: config.host_port.clone(),
                message: format!("timed out after {:?}", options.connect_timeout * 2),
                code: None,
                refused_certificate: None,
            });
        }
    };
    let client = Client::new(
        connection,
        ClientOptions::new(config.temporal_namespace.clone()).build(),
    )
    .map_err(|err| TemporalError::InvalidConfig {
        host_port: config.host_port.clone(),
        message: err.to_string(),
    })?;
    info!(host_port = %config.host_port, namespace = %config.temporal_namespace, "connected to Temporal");
    Ok(client)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(auth: ConnectionAuth, server_name: Option<&str>) -> ConnectionConfig {
        ConnectionConfig {
            host_port: "temporal.example:7233".to_owned(),
            server_name: server_name.map(str::to_owned),
            temporal_namespace: "ns".to_owned(),
            auth,
            cache_key: "k1".to_owned(),
            server_ca_pem: None,
            worker_ca_in_secret: false,
        }
    }

    #[test]
    fn a_ca_bundle_turns_tls_on_and_wins_over_the_secrets_ca() {
        let mut plain = config(ConnectionAuth::None, None);
        plain.server_ca_pem = Some(b"explicit".to_vec());
        let (url, tls) = endpoint(&plain).expect("valid");
        assert_eq!(url.scheme(), "https");
        assert_eq!(
            tls.expect("tls on").server_root_ca_cert,
            Some(b"explicit".to_vec())
        );
        let mut mtls = config(
            ConnectionAuth::MutualTls {
                cert_pem: b"c".to_vec(),
                key_pem: b"k".to_vec(),
                ca_pem: Some(b"in-secret".to_vec()),
            },
            None,
        );
        let (_, tls) = endpoint(&mtls).expect("valid");
        assert_eq!(
            tls.expect("tls on").server_root_ca_cert,
            Some(b"in-secret".to_vec())
        );
        mtls.server_ca_pem = Some(b"explicit".to_vec());
        let (_, tls) = endpoint(&mtls).expect("valid");
        assert_eq!(
            tls.expect("tls on").server_root_ca_cert,
            Some(b"explicit".to_vec())
        );
        let mut key = config(ConnectionAuth::ApiKey { key: "k".into() }, None);
        key.server_ca_pem = Some(b"explicit".to_vec());
        let (_, tls) = endpoint(&key).expect("valid");
        assert_eq!(
            tls.expect("tls on").server_root_ca_cert,
            Some(b"explicit".to_vec())
        );
    }

    #[test]
    fn plaintext_by_default() {
        let (url, tls) = endpoint(&config(ConnectionAuth::None, None)).expect("valid");
        assert_eq!(url.as_str(), "http://temporal.example:7233/");
        assert!(tls.is_none());
    }

    #[test]
    fn server_name_alone_turns_tls_on() {
        let (url, tls) =
            endpoint(&config(ConnectionAuth::None, Some("tls.example"))).expect("valid");
        assert_eq!(url.scheme(), "https");
        let tls = tls.expect("tls on");
        assert_eq!(tls.domain.as_deref(), Some("tls.example"));
        assert!(tls.server_root_ca_cert.is_none());
        assert!(tls.client_tls_options.is_none());
    }

    #[test]
    fn mutual_tls_with_and_without_ca() {
        let auth = ConnectionAuth::MutualTls {
            cert_pem: b"cert".to_vec(),
            key_pem: b"key".to_vec(),
            ca_pem: Some(b"ca".to_vec()),
        };
        let (url, tls) = endpoint(&config(auth, Some("name"))).expect("valid");
        assert_eq!(url.scheme(), "https");
        let tls = tls.expect("tls on");
        assert_eq!(tls.server_root_ca_cert.as_deref(), Some(&b"ca"[..]));
        let client = tls.client_tls_options.expect("client cert");
        assert_eq!(client.client_cert, b"cert");
        assert_eq!(client.client_private_key, b"key");

        let auth = ConnectionAuth::MutualTls {
            cert_pem: b"cert".to_vec(),
            key_pem: b"key".to_vec(),
            ca_pem: None,
        };
        let (_, tls) = endpoint(&config(auth, None)).expect("valid");
        let tls = tls.expect("tls on");
        assert!(tls.server_root_ca_cert.is_none(), "system roots");
        assert!(tls.domain.is_none());
    }

    #[test]
    fn api_key_turns_tls_on() {
        let auth = ConnectionAuth::ApiKey {
            key: "k".to_owned(),
        };
        let (url, tls) = endpoint(&config(auth, None)).expect("valid");
        assert_eq!(url.scheme(), "https");
        assert!(tls.is_some());
    }

    #[test]
    fn bad_host_port_is_invalid_config() {
        let mut cfg = config(ConnectionAuth::None, None);
        cfg.host_port = "bad host:port".to_owned();
        assert!(matches!(
            endpoint(&cfg),
            Err(TemporalError::InvalidConfig { .. })
        ));
        cfg.host_port = String::new();
        assert!(matches!(
            endpoint(&cfg),
            Err(TemporalError::InvalidConfig { .. })
        ));
    }

    #[tokio::test]
    async fn unreachable_server_is_client_creation_failed_and_not_cached() {
        // A port that was just free: nothing listens there.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("free port");
        let mut cfg = config(ConnectionAuth::None, None);
        cfg.host_port = format!("127.0.0.1:{port}");
        let mut options = PoolOptions::new("test-controller");
        options.connect_timeout = Duration::from_secs(2);
        let pool = ClientPool::new(options);
        let err = pool.get(&cfg).await.expect_err("nothing listens");
        assert_eq!(err.reason, BlockReason::TemporalClientCreationFailed);
        assert!(err.message.contains(&cfg.host_port), "{}", err.message);
        // A second call within the failure TTL gets the same error at once.
        let started = Instant::now();
        assert!(pool.try_get(&cfg).await.is_err());
        assert!(started.elapsed() < Duration::from_millis(100));
        assert_eq!(
            pool.len(),
            1,
            "the failed entry stays, empty, to be retried later"
        );
    }

    #[test]
    fn budgets_are_shared_per_server_and_namespace() {
        let pool = ClientPool::new(PoolOptions::new("id"));
        let a = pool.budget("h:1", "ns");
        let b = pool.budget("h:1", "ns");
        let c = pool.budget("h:1", "other");
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &c));
    }

    #[tokio::test(start_paused = true)]
    async fn budgets_nobody_holds_are_forgotten_once_refilled() {
        let mut options = PoolOptions::new("id");
        options.read_rate_per_sec = 10.0;
        options.read_burst = 2;
        let pool = ClientPool::new(options);
        let count = || pool.inner.budgets.lock().map(|b| b.len()).unwrap_or(0);
        let held = pool.budget("h:1", "held");
        pool.budget("h:1", "spent").acquire().await;
        pool.budget("h:1", "untouched");
        assert_eq!(count(), 3);
        // A new key sweeps: the held bucket and the one still refilling stay.
        pool.budget("h:1", "new");
        assert_eq!(count(), 3, "only the untouched, unheld bucket goes");
        // Surely refilled 200 ms after its grant (a burst of 2 at 10/s): the spent bucket goes
        // too, the held one stays.
        tokio::time::advance(Duration::from_millis(200)).await;
        pool.budget("h:1", "newer");
        let keys: HashSet<String> = pool
            .inner
            .budgets
            .lock()
            .map(|b| b.keys().map(|k| k.1.clone()).collect())
            .unwrap_or_default();
        assert_eq!(
            keys,
            ["held", "newer"].map(str::to_owned).into(),
            "held stays; the refilled and unheld go"
        );
        // The held bucket is the one handed out again.
        assert!(Arc::ptr_eq(&held, &pool.budget("h:1", "held")));
    }
}
