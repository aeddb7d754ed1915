//! A production-like Temporal next to the dev server: the real server built from its Go module
//! (`twc-temporal-server`, `make temporal-server`), on a private PostgreSQL, its frontend
//! serving TLS to clients that present a certificate of the sandbox CA (mutual TLS), and
//! authorizing every call with the default authorizer: by the permissions of an API key (a JWT
//! the sandbox signs and whose key set it serves), or else of the client certificate's
//! organizational unit. The server's own system workers reach it through the
//! `internal-frontend` service, which the authorizer does not guard.
//!
//! Permissions are `<namespace>:<role>` (`system:<role>` for every namespace), roles `read`,
//! `write`, `worker`, `admin`. The default authorizer of Temporal 1.32 grants a role what it
//! names and every role below it (read < write < admin) and ranks `worker` lowest, granting
//! nothing; the server here adds (`sandbox/temporal-server/authorizer.go`) that `worker` may
//! read and do what a worker process does (poll, respond, heartbeat), never more: routing
//! changes such as `SetWorkerDeploymentCurrentVersion` need `write`.

pub mod jwt;
pub mod pki;
pub mod postgres;

use std::path::{Path, PathBuf};
use std::sync::PoisonError;
use std::time::{Duration, Instant};

use serde_json::json;
use temporalio_client::grpc::{OperatorService, WorkflowService};
use temporalio_client::tonic::{Code, IntoRequest};
use temporalio_client::{
    Client, ClientOptions, ClientTlsOptions, Connection, ConnectionOptions, TlsOptions, Url,
};
use temporalio_common::protos::temporal::api::enums::v1::IndexedValueType;
use temporalio_common::protos::temporal::api::operatorservice::v1::AddSearchAttributesRequest;
use temporalio_common::protos::temporal::api::workflowservice::v1::{
    DescribeWorkerDeploymentRequest, RegisterNamespaceRequest,
};
use tokio::process::Command;
use tokio::task::JoinHandle;

pub use jwt::PreviousKey;
pub use pki::{CertPair, Validity};

use crate::ports::free_port;
use crate::process::{Supervised, spawn_logged, tail};
use crate::temporal::SEARCH_ATTRIBUTES;
use crate::wait::wait_until;

/// The name the frontend's certificate is issued for (with `localhost` and 127.0.0.1).
pub const SERVER_NAME: &str = "temporal.test";
/// A second TLS name of the same frontend that asks for no client certificate, so API keys
/// alone authenticate (as on Temporal Cloud's API-key endpoint); every call still needs the
/// key's permissions.
pub const API_SERVER_NAME: &str = "api.temporal.test";
/// The server binary in the tools folder.
pub const SERVER_BIN: &str = "bin/twc-temporal-server";
/// Common name and permissions of the certificate the sandbox itself uses (namespaces,
/// search attributes); [`ProductionTemporal::admin_cert`].
const ADMIN_CN: &str = "twc-sandbox";
/// Attempts of the server start when a port it picked was taken in the meantime.
const PORT_ATTEMPTS: usize = 3;
/// How long the server may take to serve its namespaces.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// How to start the production-like Temporal.
#[derive(Debug, Clone)]
pub struct ProductionTemporalOptions {
    /// Folder for its configuration, certificates, keys and logs (created; emptied first).
    pub state_dir: PathBuf,
    /// Folder with installed tools (`<tools>/bin/twc-temporal-server`).
    pub tools_dir: PathBuf,
    /// Namespaces registered besides `default`.
    pub namespaces: Vec<String>,
    /// Drainage refreshed every second and pollers forgotten after 5 s, as the dev server of
    /// `twc-sandbox exec` does.
    pub fast_drainage: bool,
    /// How often the server fetches the key set again (so a rotation shows after about this).
    pub jwks_refresh_interval: Duration,
}

impl ProductionTemporalOptions {
    /// Defaults: only `default`, fast drainage, key set refreshed every second.
    pub fn new(state_dir: impl Into<PathBuf>, tools_dir: impl Into<PathBuf>) -> Self {
        Self {
            state_dir: state_dir.into(),
            tools_dir: tools_dir.into(),
            namespaces: Vec::new(),
            fast_drainage: true,
            jwks_refresh_interval: Duration::from_secs(1),
        }
    }
}

/// The production-like Temporal could not be started or used.
#[derive(Debug, thiserror::Error)]
pub enum ProductionError {
    /// The server binary is missing.
    #[error("{0} is missing: run `make temporal-server` (part of `make tools`)")]
    NotBuilt(PathBuf),
    /// A file or folder could not be written.
    #[error("writing {path}: {source}")]
    Io {
        /// Path.
        path: PathBuf,
        /// I/O error.
        source: std::io::Error,
    },
    /// No free port.
    #[error("finding a free port: {0}")]
    Port(std::io::Error),
    /// PostgreSQL failed.
    #[error(transparent)]
    Postgres(#[from] postgres::PostgresError),
    /// A certificate failed.
    #[error(transparent)]
    Pki(#[from] pki::PkiError),
    /// A signing key or token failed.
    #[error(transparent)]
    Jwt(#[from] jwt::JwtError),
    /// A process could not start.
    #[error(transparent)]
    Process(#[from] crate::process::ProcessError),
    /// The schema tool failed.
    #[error("setting up the Temporal schemas failed ({status}); log {log}:\n{tail}")]
    Schema {
        /// Exit status.
        status: String,
        /// Log file.
        log: PathBuf,
        /// Its last lines.
        tail: String,
    },
    /// The server exited or did not serve its namespaces in time.
    #[error("Temporal server did not become ready ({why}); log {log}:\n{tail}")]
    NotReady {
        /// What was seen.
        why: String,
        /// Log file.
        log: PathBuf,
        /// Its last lines.
        tail: String,
    },
    /// A client could not connect.
    #[error("connecting to the production-like Temporal at {address}: {message}")]
    Connect {
        /// Frontend address.
        address: String,
        /// What failed.
        message: String,
    },
}

/// How long each step of [`ProductionTemporal::start`] took.
#[derive(Debug, Clone, Copy, Default)]
pub struct StartTimings {
    /// `initdb` and PostgreSQL accepting connections.
    pub postgres: Duration,
    /// Databases and schemas.
    pub schema: Duration,
    /// Server start to namespaces served (with search attributes).
    pub server: Duration,
    /// All of it, certificates and key set included.
    pub total: Duration,
}

/// Loopback ports of one server (frontend, internal frontend, history, matching, worker:
/// gRPC and membership each; frontend HTTP; metrics).
#[derive(Debug, Clone, Copy)]
struct ServerPorts {
    frontend: u16,
    frontend_http: u16,
    metrics: u16,
    /// (gRPC, membership) of frontend, internal-frontend, history, matching, worker.
    services: [(u16, u16); 5],
}

impl ServerPorts {
    fn free() -> Result<Self, ProductionError> {
        let port = || free_port().map_err(ProductionError::Port);
        let mut services = [(0, 0); 5];
        for service in &mut services {
            *service = (port()?, port()?);
        }
        Ok(Self {
            frontend: services[0].0,
            frontend_http: port()?,
            metrics: port()?,
            services,
        })
    }
}

/// A running production-like Temporal; everything stops on [`Self::stop`] or drop.
#[derive(Debug)]
pub struct ProductionTemporal {
    /// Frontend gRPC `127.0.0.1:<port>` (TLS; a client certificate is required).
    pub address: String,
    /// TLS server name to verify (`temporal.test`; `localhost` and 127.0.0.1 are valid too).
    pub server_name: String,
    /// TLS server name under which the frontend asks for no client certificate
    /// (`api.temporal.test`): for clients with an API key alone.
    pub api_server_name: String,
    /// The sandbox CA (PEM): issued the server's and the clients' certificates.
    pub ca_pem: String,
    /// File holding [`Self::ca_pem`].
    pub ca_path: PathBuf,
    /// Prometheus metrics of the server.
    pub metrics_url: String,
    /// Where the server fetches the API keys' key set (JWKS).
    pub jwks_url: String,
    /// Its state folder (configuration, certificates, logs); kept after [`Self::stop`].
    pub state_dir: PathBuf,
    /// Registered namespaces (`default` first).
    pub namespaces: Vec<String>,
    /// A client certificate with `system:admin` (what the sandbox itself uses).
    pub admin_cert: CertPair,
    /// The server's log.
    pub log: PathBuf,
    /// PostgreSQL's log.
    pub postgres_log: PathBuf,
    /// How long the start took.
    pub timings: StartTimings,
    certs_dir: PathBuf,
    authority: pki::Authority,
    foreign_authority: pki::Authority,
    issuer: jwt::Issuer,
    server: Supervised,
    postgres: postgres::Postgres,
    jwks_server: JoinHandle<()>,
}

impl Drop for ProductionTemporal {
    fn drop(&mut self) {
        // The server and PostgreSQL are killed by their own drops.
        self.jwks_server.abort();
    }
}

impl ProductionTemporal {
    /// Starts PostgreSQL, sets up the schemas, serves the key set, starts the server and waits
    /// until it serves every namespace (registered, with the engine's search attributes).
    pub async fn start(options: &ProductionTemporalOptions) -> Result<Self, ProductionError> {
        let started = Instant::now();
        let bin = options.tools_dir.join(SERVER_BIN);
        if !bin.exists() {
            return Err(ProductionError::NotBuilt(bin));
        }
        let state = &options.state_dir;
        let certs_dir = state.join("certs");
        let logs_dir = state.join("logs");
        if state.exists() {
            std::fs::remove_dir_all(state).map_err(io(state))?;
        }
        for dir in [state, &certs_dir, &logs_dir] {
            std::fs::create_dir_all(dir).map_err(io(dir))?;
        }
        let log = logs_dir.join("temporal-server.log");
        let postgres_log = logs_dir.join("postgres.log");
        let mut timings = StartTimings::default();

        let step = Instant::now();
        let postgres = postgres::Postgres::start(state, &postgres_log).await?;
        timings.postgres = step.elapsed();
        let step = Instant::now();
        setup_schema(&bin, postgres.port, &log).await?;
        timings.schema = step.elapsed();

        let authority = pki::Authority::new("twc sandbox CA")?;
        let foreign_authority = pki::Authority::new("unknown CA")?;
        let ca_path = certs_dir.join("ca.pem");
        std::fs::write(&ca_path, &authority.cert_pem).map_err(io(&ca_path))?;
        let server_cert = pki::write_pair(
            &certs_dir,
            "server",
            authority.server_cert(&[SERVER_NAME, API_SERVER_NAME, "localhost"])?,
        )?;
        let admin_cert = pki::write_pair(
            &certs_dir,
            ADMIN_CN,
            authority.client_cert(ADMIN_CN, &["system:admin"], Validity::Current)?,
        )?;
        let issuer = jwt::Issuer::new()?;
        let (jwks_url, jwks_server) = issuer.serve_jwks().await?;

        let step = Instant::now();
        let mut namespaces = vec!["default".to_owned()];
        namespaces.extend(
            options
                .namespaces
                .iter()
                .filter(|n| *n != "default")
                .cloned(),
        );
        let files = ConfigFiles {
            config: state.join("temporal.yaml"),
            dynamic_config: state.join("dynamicconfig.yaml"),
        };
        write_dynamic_config(&files.dynamic_config, options.fast_drainage)?;
        let mut attempt = 1;
        let (server, ports) = loop {
            let ports = ServerPorts::free()?;
            let config = server_config(&ServerConfigInput {
                ports,
                postgres_port: postgres.port,
                server_cert: &server_cert,
                ca_path: &ca_path,
                jwks_url: &jwks_url,
                jwks_refresh: options.jwks_refresh_interval,
                dynamic_config: &files.dynamic_config,
            });
            std::fs::write(&files.config, config.to_string()).map_err(io(&files.config))?;
            let mut command = Command::new(&bin);
            command.arg("start").arg("--config-file").arg(&files.config);
            let mut server = spawn_logged("temporal-server", command, &log)?;
            let address = format!("127.0.0.1:{}", ports.frontend);
            let outcome = {
                let ready = serve_namespaces(&address, &ca_path, &admin_cert, &namespaces);
                let exited = async {
                    loop {
                        if let Some(status) = server.exited() {
                            return status;
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                };
                tokio::select! {
                    result = ready => result,
                    status = exited => Err(format!("exited ({status})")),
                }
            };
            let why = match outcome {
                Ok(()) => break (server, ports),
                Err(why) => why,
            };
            let port_taken = tail(&log, 50).contains("address already in use");
            server.stop(Duration::from_secs(5)).await;
            if attempt < PORT_ATTEMPTS && port_taken {
                tracing::warn!("Temporal server: {why}; retrying on other ports");
                attempt += 1;
                continue;
            }
            return Err(ProductionError::NotReady {
                why,
                log: log.clone(),
                tail: tail(&log, 40),
            });
        };
        timings.server = step.elapsed();
        timings.total = started.elapsed();
        tracing::info!(?timings, "production-like Temporal started");
        Ok(Self {
            address: format!("127.0.0.1:{}", ports.frontend),
            server_name: SERVER_NAME.to_owned(),
            api_server_name: API_SERVER_NAME.to_owned(),
            ca_pem: authority.cert_pem.clone(),
            ca_path,
            metrics_url: format!("http://127.0.0.1:{}/metrics", ports.metrics),
            jwks_url,
            state_dir: state.clone(),
            namespaces,
            admin_cert,
            log,
            postgres_log,
            timings,
            certs_dir,
            authority,
            foreign_authority,
            issuer,
            server,
            postgres,
            jwks_server,
        })
    }

    /// A client certificate of the sandbox CA with common name `cn`, granting `permissions`
    /// (`<namespace>:<role>`; none: every call but health checks is refused). Also written to
    /// `<state>/certs/<cn>.pem` and `.key`.
    pub fn client_cert(&self, cn: &str, permissions: &[&str]) -> Result<CertPair, ProductionError> {
        let pair = self
            .authority
            .client_cert(cn, permissions, Validity::Current)?;
        Ok(pki::write_pair(&self.certs_dir, cn, pair)?)
    }

    /// Like [`Self::client_cert`], but expired (valid during 2000 only): the TLS handshake
    /// fails.
    pub fn expired_client_cert(
        &self,
        cn: &str,
        permissions: &[&str],
    ) -> Result<CertPair, ProductionError> {
        let pair = self
            .authority
            .client_cert(cn, permissions, Validity::Expired)?;
        Ok(pki::write_pair(
            &self.certs_dir,
            &format!("{cn}-expired"),
            pair,
        )?)
    }

    /// Like [`Self::client_cert`], but issued by a CA the server does not trust: the TLS
    /// handshake fails.
    pub fn foreign_client_cert(
        &self,
        cn: &str,
        permissions: &[&str],
    ) -> Result<CertPair, ProductionError> {
        let pair = self
            .foreign_authority
            .client_cert(cn, permissions, Validity::Current)?;
        Ok(pki::write_pair(
            &self.certs_dir,
            &format!("{cn}-foreign"),
            pair,
        )?)
    }

    /// An API key (JWT, ES256, signed by the current key of the served key set) with
    /// `permissions`, valid for `ttl`. Clients reach the frontend with it under
    /// [`API_SERVER_NAME`] without a certificate, or under [`SERVER_NAME`] with one for the TLS
    /// handshake; the API key's permissions replace the certificate's.
    pub fn api_key(&self, permissions: &[&str], ttl: Duration) -> Result<String, ProductionError> {
        Ok(self.issuer.mint("twc-sandbox-api-key", permissions, ttl)?)
    }

    /// An API key like [`Self::api_key`]'s, signed by a key that was never in the key set.
    pub fn unknown_signer_api_key(
        &self,
        permissions: &[&str],
        ttl: Duration,
    ) -> Result<String, ProductionError> {
        Ok(self
            .issuer
            .mint_unknown("twc-sandbox-api-key", permissions, ttl)?)
    }

    /// An API key like [`Self::api_key`]'s that expired a minute ago.
    pub fn expired_api_key(&self, permissions: &[&str]) -> Result<String, ProductionError> {
        Ok(self
            .issuer
            .mint_expired("twc-sandbox-api-key", permissions)?)
    }

    /// Replaces the signing key by a new one (returns its key ID); `previous` says whether the
    /// old key stays in the key set. The server sees the change at its next refresh
    /// ([`ProductionTemporalOptions::jwks_refresh_interval`]).
    pub fn rotate_signing_key(&self, previous: PreviousKey) -> Result<String, ProductionError> {
        Ok(self.issuer.rotate(previous)?)
    }

    /// Key ID of the key that signs new API keys.
    pub fn signing_key_id(&self) -> String {
        self.issuer.current_kid()
    }

    /// The published key set (JWKS JSON).
    pub fn jwks(&self) -> String {
        self.issuer.jwks()
    }

    /// Connection options for this server: TLS with the sandbox CA, `client_cert` if any, and
    /// `api_key` if any.
    pub fn connection_options(
        &self,
        client_cert: Option<&CertPair>,
        api_key: Option<&str>,
    ) -> Result<ConnectionOptions, ProductionError> {
        connection_options(&self.address, &self.ca_pem, client_cert, api_key)
    }

    /// A client of `namespace` connected with `client_cert` and `api_key` (see
    /// [`Self::connection_options`]).
    pub async fn connect(
        &self,
        namespace: &str,
        client_cert: Option<&CertPair>,
        api_key: Option<&str>,
    ) -> Result<Client, ProductionError> {
        connect(
            &self.address,
            namespace,
            self.connection_options(client_cert, api_key)?,
        )
        .await
    }

    /// The name and exit status of a process that died (server or PostgreSQL), if any.
    pub fn dead_process(&mut self) -> Option<(String, String)> {
        [&mut self.server, &mut self.postgres.process]
            .into_iter()
            .find_map(|p| p.exited().map(|status| (p.name.clone(), status)))
    }

    /// Log files (server, PostgreSQL).
    pub fn logs(&self) -> Vec<PathBuf> {
        vec![self.log.clone(), self.postgres_log.clone()]
    }

    /// Stops the server, then PostgreSQL, and the key set endpoint.
    pub async fn stop(mut self) {
        self.server.stop(Duration::from_secs(10)).await;
        self.jwks_server.abort();
        self.postgres.stop().await;
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ProductionError {
    let path = path.to_owned();
    move |source| ProductionError::Io { path, source }
}

/// Runs `command` to its end with its output appended to `log`.
async fn run_logged(mut command: Command, log: &Path) -> std::io::Result<std::process::ExitStatus> {
    let open = || {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
    };
    command
        .stdin(std::process::Stdio::null())
        .stdout(open()?)
        .stderr(open()?)
        .kill_on_drop(true)
        .status()
        .await
}

/// Creates both databases and applies the embedded schemas (`twc-temporal-server setup-schema`).
async fn setup_schema(bin: &Path, postgres_port: u16, log: &Path) -> Result<(), ProductionError> {
    let mut command = Command::new(bin);
    command
        .arg("setup-schema")
        .args([
            "--endpoint",
            "127.0.0.1",
            "--port",
            &postgres_port.to_string(),
        ])
        .args(["--user", postgres::USER, "--plugin", "postgres12"]);
    let status = run_logged(command, log).await.map_err(io(bin))?;
    if !status.success() {
        return Err(ProductionError::Schema {
            status: status.to_string(),
            log: log.to_owned(),
            tail: tail(log, 30),
        });
    }
    Ok(())
}

/// Paths of the generated configuration.
struct ConfigFiles {
    config: PathBuf,
    dynamic_config: PathBuf,
}

/// What the server configuration depends on.
struct ServerConfigInput<'a> {
    ports: ServerPorts,
    postgres_port: u16,
    server_cert: &'a CertPair,
    ca_path: &'a Path,
    jwks_url: &'a str,
    jwks_refresh: Duration,
    dynamic_config: &'a Path,
}

/// The server configuration (JSON, which the server reads as the YAML it is).
fn server_config(input: &ServerConfigInput<'_>) -> serde_json::Value {
    let datastore = |database: &str, max_conns: u32| {
        json!({ "sql": {
            "pluginName": "postgres12",
            "databaseName": database,
            "connectAddr": format!("127.0.0.1:{}", input.postgres_port),
            "connectProtocol": "tcp",
            "user": postgres::USER,
            "password": "",
            "maxConns": max_conns,
            "maxIdleConns": max_conns,
            "maxConnLifetime": "1h",
        }})
    };
    let names = [
        "frontend",
        "internal-frontend",
        "history",
        "matching",
        "worker",
    ];
    let mut services = serde_json::Map::new();
    for (name, (grpc, membership)) in names.iter().zip(input.ports.services) {
        let mut rpc = json!({
            "grpcPort": grpc, "membershipPort": membership, "bindOnLocalHost": true,
        });
        if *name == "frontend" {
            rpc["httpPort"] = json!(input.ports.frontend_http);
        }
        services.insert((*name).to_owned(), json!({ "rpc": rpc }));
    }
    let ca = input.ca_path.display().to_string();
    json!({
        "log": { "stdout": true, "level": "warn" },
        "persistence": {
            "defaultStore": "default",
            "visibilityStore": "visibility",
            "numHistoryShards": 4,
            "datastores": {
                "default": datastore("temporal", 10),
                "visibility": datastore("temporal_visibility", 5),
            },
        },
        "global": {
            "membership": { "maxJoinDuration": "30s", "broadcastAddress": "127.0.0.1" },
            "metrics": { "prometheus": {
                "framework": "tally",
                "timerType": "histogram",
                "listenAddress": format!("127.0.0.1:{}", input.ports.metrics),
            }},
            "tls": { "frontend": {
                "server": {
                    "certFile": input.server_cert.cert_path.display().to_string(),
                    "keyFile": input.server_cert.key_path.display().to_string(),
                    "requireClientAuth": true,
                    "clientCaFiles": [ca],
                },
                "hostOverrides": { API_SERVER_NAME: {
                    "certFile": input.server_cert.cert_path.display().to_string(),
                    "keyFile": input.server_cert.key_path.display().to_string(),
                    "requireClientAuth": false,
                }},
                "client": { "serverName": SERVER_NAME, "rootCaFiles": [ca] },
            }},
            "authorization": {
                "authorizer": "default",
                "claimMapper": "default",
                "jwtKeyProvider": {
                    "keySourceURIs": [input.jwks_url],
                    "refreshInterval": format!("{}ms", input.jwks_refresh.as_millis().max(1)),
                },
            },
        },
        "services": services,
        "clusterMetadata": {
            "enableGlobalNamespace": false,
            "failoverVersionIncrement": 10,
            "masterClusterName": "active",
            "currentClusterName": "active",
            "clusterInformation": { "active": {
                "enabled": true,
                "initialFailoverVersion": 1,
                "rpcName": "frontend",
                "rpcAddress": format!("127.0.0.1:{}", input.ports.frontend),
                "httpAddress": format!("127.0.0.1:{}", input.ports.frontend_http),
            }},
        },
        "dcRedirectionPolicy": { "policy": "noop" },
        "dynamicConfigClient": {
            "filepath": input.dynamic_config.display().to_string(),
            "pollInterval": "10s",
        },
    })
}

/// Dynamic configuration: what the sandbox's dev server gets on its command line.
fn write_dynamic_config(path: &Path, fast_drainage: bool) -> Result<(), ProductionError> {
    let mut values = vec![
        (
            "system.forceSearchAttributesCacheRefreshOnRead",
            json!(true),
        ),
        (
            "system.numConsecutiveWorkflowTaskProblemsToTriggerSearchAttribute",
            json!(2),
        ),
        ("system.enableActivityEagerExecution", json!(true)),
    ];
    if fast_drainage {
        values.extend([
            (
                "matching.wv.VersionDrainageStatusVisibilityGracePeriod",
                json!("1s"),
            ),
            (
                "matching.wv.VersionDrainageStatusRefreshInterval",
                json!("1s"),
            ),
            ("matching.PollerHistoryTTL", json!("5s")),
        ]);
    }
    let config: serde_json::Map<String, serde_json::Value> = values
        .into_iter()
        .map(|(key, value)| (key.to_owned(), json!([{ "value": value }])))
        .collect();
    std::fs::write(path, serde_json::Value::Object(config).to_string()).map_err(io(path))
}

/// Connection options for a TLS frontend at `address` verified with `ca_pem`: server name
/// [`SERVER_NAME`], or [`API_SERVER_NAME`] for an API key without a client certificate.
pub fn connection_options(
    address: &str,
    ca_pem: &str,
    client_cert: Option<&CertPair>,
    api_key: Option<&str>,
) -> Result<ConnectionOptions, ProductionError> {
    let url = Url::parse(&format!("https://{address}")).map_err(|e| ProductionError::Connect {
        address: address.to_owned(),
        message: e.to_string(),
    })?;
    let tls = TlsOptions::builder()
        .server_root_ca_cert(ca_pem.as_bytes().to_vec())
        .domain(
            if client_cert.is_none() && api_key.is_some() {
                API_SERVER_NAME
            } else {
                SERVER_NAME
            }
            .to_owned(),
        )
        .maybe_client_tls_options(client_cert.map(|c| {
            ClientTlsOptions::builder()
                .client_cert(c.cert_pem.as_bytes().to_vec())
                .client_private_key(c.key_pem.as_bytes().to_vec())
                .build()
        }))
        .build();
    Ok(ConnectionOptions::new(url)
        .identity("twc-sandbox".to_owned())
        .tls_options(tls)
        .maybe_api_key(api_key.map(str::to_owned))
        .connect_timeout(Duration::from_secs(10))
        .build())
}

async fn connect(
    address: &str,
    namespace: &str,
    options: ConnectionOptions,
) -> Result<Client, ProductionError> {
    let error = |message: String| ProductionError::Connect {
        address: address.to_owned(),
        message,
    };
    let connection = Connection::connect(options)
        .await
        .map_err(|e| error(e.to_string()))?;
    Client::new(connection, ClientOptions::new(namespace.to_owned()).build())
        .map_err(|e| error(e.to_string()))
}

/// Registers `namespaces` and the engine's search attributes in each with the admin
/// certificate, and waits until the frontend serves worker-deployment calls in all of them.
/// The error says what was last seen.
async fn serve_namespaces(
    address: &str,
    ca_path: &Path,
    admin: &CertPair,
    namespaces: &[String],
) -> Result<(), String> {
    let ca_pem = std::fs::read_to_string(ca_path).map_err(|e| e.to_string())?;
    let options =
        connection_options(address, &ca_pem, Some(admin), None).map_err(|e| e.to_string())?;
    let last = std::sync::Mutex::new(String::from("not connected yet"));
    let remember = |e: String| *last.lock().unwrap_or_else(PoisonError::into_inner) = e;
    let last_seen = || last.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let client = wait_until("the Temporal frontend", READY_TIMEOUT, || {
        let options = options.clone();
        async move {
            connect(address, "default", options)
                .await
                .map_err(|e| remember(e.to_string()))
                .ok()
        }
    })
    .await
    .map_err(|e| format!("{e}; last: {}", last_seen()))?;
    for namespace in namespaces {
        let what = format!("namespace {namespace} registered and served");
        wait_until(&what, READY_TIMEOUT, || {
            let mut client = client.clone();
            async move {
                register(&mut client, namespace)
                    .await
                    .map_err(remember)
                    .ok()
            }
        })
        .await
        .map_err(|e| format!("{e}; last: {}", last_seen()))?;
    }
    Ok(())
}

/// One attempt to register `namespace` (already registered is fine), add the search
/// attributes and see a worker-deployment call served in it.
async fn register(client: &mut Client, namespace: &str) -> Result<(), String> {
    let request = RegisterNamespaceRequest {
        namespace: namespace.to_owned(),
        workflow_execution_retention_period: Some(prost_duration(86_400)),
        ..Default::default()
    };
    match WorkflowService::register_namespace(client, request.into_request()).await {
        Ok(_) => {}
        Err(status) if status.code() == Code::AlreadyExists => {}
        Err(status) => return Err(format!("registering {namespace}: {status}")),
    }
    let request = AddSearchAttributesRequest {
        namespace: namespace.to_owned(),
        search_attributes: SEARCH_ATTRIBUTES
            .iter()
            .map(|(name, kind)| {
                let kind = IndexedValueType::from_str_name(&format!(
                    "INDEXED_VALUE_TYPE_{}",
                    kind.to_uppercase()
                ))
                .unwrap_or(IndexedValueType::Keyword);
                ((*name).to_owned(), kind as i32)
            })
            .collect(),
    };
    match OperatorService::add_search_attributes(client, request.into_request()).await {
        Ok(_) => {}
        Err(status) if status.code() == Code::AlreadyExists => {}
        Err(status) => return Err(format!("adding search attributes to {namespace}: {status}")),
    }
    let probe = DescribeWorkerDeploymentRequest {
        namespace: namespace.to_owned(),
        deployment_name: "twc-sandbox-probe".to_owned(),
    };
    match WorkflowService::describe_worker_deployment(client, probe.into_request()).await {
        Ok(_) => Ok(()),
        // The deployment is unknown, the namespace is not.
        Err(status)
            if status.code() == Code::NotFound
                && !status.message().to_ascii_lowercase().contains("namespace") =>
        {
            Ok(())
        }
        Err(status) => Err(format!("probing {namespace}: {status}")),
    }
}

fn prost_duration(seconds: i64) -> prost_wkt_types::Duration {
    prost_wkt_types::Duration { seconds, nanos: 0 }
}
