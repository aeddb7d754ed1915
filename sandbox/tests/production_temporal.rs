//! The production-like Temporal (`twc_sandbox::production`): the real server on PostgreSQL,
//! mutual TLS and JWT authorization, and what it refuses. Each test starts its own server.
//!
//! Needs `make temporal-server postgres` (part of `make tools`) and, for the worker test, the
//! sample worker (`cargo build -p twc-sample-worker`; `TWC_SAMPLE_WORKER` names it, default
//! next to this test's binary). `TWC_TOOLS_DIR` names the tools folder (default `.tools`).

use std::path::PathBuf;
use std::time::Duration;

use temporalio_client::Client;
use temporalio_client::grpc::WorkflowService;
use temporalio_client::tonic::{Code, IntoRequest, Status};
use temporalio_common::protos::temporal::api::common::v1::WorkflowType;
use temporalio_common::protos::temporal::api::taskqueue::v1::TaskQueue;
use temporalio_common::protos::temporal::api::workflowservice::v1::{
    DescribeNamespaceRequest, DescribeWorkerDeploymentRequest, ListWorkflowExecutionsRequest,
    SetWorkerDeploymentCurrentVersionRequest, StartWorkflowExecutionRequest,
};
use twc_sandbox::process::{Supervised, spawn_logged, tail};
use twc_sandbox::production::{
    CertPair, PreviousKey, ProductionTemporal, ProductionTemporalOptions,
};
use twc_sandbox::wait::wait_until;

const HOUR: Duration = Duration::from_secs(3600);

/// The message of the PermissionDenied the default authorizer answers with.
const UNAUTHORIZED: &str = "Request unauthorized.";

fn tools_dir() -> PathBuf {
    std::env::var_os("TWC_TOOLS_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.tools"),
        PathBuf::from,
    )
}

/// Starts a server with state in a fresh temporary folder named for `test`.
async fn start(test: &str) -> ProductionTemporal {
    let state = std::env::temp_dir().join(format!("twc-production-{test}-{}", std::process::id()));
    let options = ProductionTemporalOptions::new(&state, tools_dir());
    let server = ProductionTemporal::start(&options)
        .await
        .unwrap_or_else(|e| panic!("starting the production-like Temporal: {e}"));
    let t = server.timings;
    eprintln!(
        "{test}: server up at {} in {:.1}s (postgres {:.1}s, schema {:.1}s, server {:.1}s)",
        server.address,
        t.total.as_secs_f64(),
        t.postgres.as_secs_f64(),
        t.schema.as_secs_f64(),
        t.server.as_secs_f64()
    );
    server
}

/// Stops the server and removes its state folder (kept when a test fails, for its logs).
async fn stop(server: ProductionTemporal) {
    let state = server.state_dir.clone();
    server.stop().await;
    let _ = std::fs::remove_dir_all(state);
}

async fn connect(
    server: &ProductionTemporal,
    cert: Option<&CertPair>,
    api_key: Option<&str>,
) -> Client {
    server
        .connect("default", cert, api_key)
        .await
        .unwrap_or_else(|e| panic!("connecting: {e}"))
}

/// A client that opens the TLS handshake with `cert` and then calls with API key `key`. (The
/// connection's first call, GetSystemInfo, is open to anyone authenticated; a key the server
/// cannot verify would fail it, so the key is set afterwards.)
async fn with_api_key(server: &ProductionTemporal, cert: &CertPair, key: &str) -> Client {
    let client = connect(server, Some(cert), None).await;
    client.connection().set_api_key(Some(key.to_owned()));
    client
}

fn cert(result: Result<CertPair, twc_sandbox::production::ProductionError>) -> CertPair {
    result.unwrap_or_else(|e| panic!("making a certificate: {e}"))
}

fn key(result: Result<String, twc_sandbox::production::ProductionError>) -> String {
    result.unwrap_or_else(|e| panic!("minting an API key: {e}"))
}

async fn describe_namespace(client: &Client) -> Result<(), Status> {
    let request = DescribeNamespaceRequest {
        namespace: "default".to_owned(),
        ..Default::default()
    };
    WorkflowService::describe_namespace(&mut client.clone(), request.into_request())
        .await
        .map(|_| ())
}

async fn list_workflows(client: &Client) -> Result<(), Status> {
    let request = ListWorkflowExecutionsRequest {
        namespace: "default".to_owned(),
        page_size: 10,
        ..Default::default()
    };
    WorkflowService::list_workflow_executions(&mut client.clone(), request.into_request())
        .await
        .map(|_| ())
}

async fn start_workflow(client: &Client, id: &str) -> Result<(), Status> {
    let request = StartWorkflowExecutionRequest {
        namespace: "default".to_owned(),
        workflow_id: id.to_owned(),
        workflow_type: Some(WorkflowType {
            name: "HelloWorld".to_owned(),
        }),
        task_queue: Some(TaskQueue {
            name: "nobody-polls".to_owned(),
            ..Default::default()
        }),
        request_id: id.to_owned(),
        ..Default::default()
    };
    WorkflowService::start_workflow_execution(&mut client.clone(), request.into_request())
        .await
        .map(|_| ())
}

#[track_caller]
fn assert_denied(result: Result<(), Status>, what: &str) {
    match result {
        Err(status) => {
            assert_eq!(status.code(), Code::PermissionDenied, "{what}: {status}");
            assert_eq!(status.message(), UNAUTHORIZED, "{what}");
        }
        Ok(()) => panic!("{what}: allowed, expected PermissionDenied"),
    }
}

/// What the server answers a TLS handshake with `cert` (none: no certificate): `Ok` when it
/// speaks HTTP/2 afterwards, else the error, e.g. the alert it sent. A gRPC client often sees
/// only a closed connection instead, as it writes before reading the alert.
async fn handshake(server: &ProductionTemporal, cert: Option<&CertPair>) -> Result<(), String> {
    handshake_as(server, &server.server_name, cert).await
}

/// [`handshake`] under TLS name `server_name`.
async fn handshake_as(
    server: &ProductionTemporal,
    server_name: &str,
    cert: Option<&CertPair>,
) -> Result<(), String> {
    use std::sync::Arc;
    use tokio::io::AsyncReadExt;
    use tokio_rustls::rustls::crypto::ring::default_provider;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use tokio_rustls::rustls::{ClientConfig, RootCertStore};

    let pem_certs = |pem: &str| -> Vec<CertificateDer<'static>> {
        CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<_, _>>()
            .unwrap_or_else(|e| panic!("PEM: {e}"))
    };
    let mut roots = RootCertStore::empty();
    for ca in pem_certs(&server.ca_pem) {
        roots.add(ca).unwrap_or_else(|e| panic!("CA: {e}"));
    }
    let builder = ClientConfig::builder_with_provider(Arc::new(default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap_or_else(|e| panic!("{e}"))
        .with_root_certificates(roots);
    let mut config = match cert {
        Some(c) => {
            let key = PrivateKeyDer::from_pem_slice(c.key_pem.as_bytes())
                .unwrap_or_else(|e| panic!("key PEM: {e}"));
            builder
                .with_client_auth_cert(pem_certs(&c.cert_pem), key)
                .unwrap_or_else(|e| panic!("client certificate: {e}"))
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    let name = ServerName::try_from(server_name.to_owned()).unwrap_or_else(|e| panic!("{e}"));
    let tcp = tokio::net::TcpStream::connect(&server.address)
        .await
        .unwrap_or_else(|e| panic!("connecting to {}: {e}", server.address));
    let exchange = async {
        let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .map_err(|e| e.to_string())?;
        // TLS 1.3: the server judges the certificate after the client finished; its verdict is
        // the first thing to read (an alert, or its HTTP/2 settings).
        let mut first = [0u8; 1];
        tls.read(&mut first).await.map_err(|e| e.to_string())?;
        Ok(())
    };
    tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .unwrap_or_else(|_| Err("no answer within 10 s".to_owned()))
}

#[track_caller]
fn assert_refused(verdict: Result<(), String>, alert: &str, what: &str) {
    match verdict {
        Err(e) => assert!(
            e.contains(&format!("received fatal alert: {alert}")),
            "{what}: expected alert {alert}, got: {e}"
        ),
        Ok(()) => panic!("{what}: the TLS handshake was accepted"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_admits_current_certificates_of_the_sandbox_ca_with_their_permissions() {
    let server = start("mtls").await;

    let metrics = twc_sandbox::http::get(&server.metrics_url)
        .await
        .unwrap_or_else(|e| panic!("metrics: {e}"));
    assert_eq!(metrics.status, 200, "{}", metrics.head);
    assert!(
        metrics.body.contains("persistence_requests"),
        "no persistence metrics"
    );

    let admin = cert(server.client_cert("controller", &["system:admin"]));
    let client = connect(&server, Some(&admin), None).await;
    describe_namespace(&client)
        .await
        .unwrap_or_else(|e| panic!("admin: {e}"));
    list_workflows(&client)
        .await
        .unwrap_or_else(|e| panic!("admin: {e}"));

    // Refused in the TLS handshake: no certificate, an expired one, one of another CA.
    handshake(&server, Some(&admin))
        .await
        .unwrap_or_else(|e| panic!("handshake with a valid certificate: {e}"));
    assert_refused(
        handshake(&server, None).await,
        "CertificateRequired",
        "no certificate",
    );
    let expired = cert(server.expired_client_cert("controller", &["system:admin"]));
    assert_refused(
        handshake(&server, Some(&expired)).await,
        "CertificateExpired",
        "expired certificate",
    );
    let foreign = cert(server.foreign_client_cert("controller", &["system:admin"]));
    assert_refused(
        handshake(&server, Some(&foreign)).await,
        "UnknownCA",
        "certificate of another CA",
    );
    // A gRPC client gets no further than the first call.
    for (cert, what) in [
        (None, "no certificate"),
        (Some(&expired), "expired"),
        (Some(&foreign), "foreign"),
    ] {
        if let Ok(client) = server.connect("default", cert, None).await {
            let result = describe_namespace(&client).await;
            assert!(result.is_err(), "{what}: a call succeeded");
        }
    }

    // Admitted, then authorized by the permissions the certificate names.
    let nobody = connect(
        &server,
        Some(&cert(server.client_cert("nobody", &[]))),
        None,
    )
    .await;
    assert_denied(
        describe_namespace(&nobody).await,
        "certificate without permissions",
    );
    let reader = connect(
        &server,
        Some(&cert(server.client_cert("reader", &["default:read"]))),
        None,
    )
    .await;
    describe_namespace(&reader)
        .await
        .unwrap_or_else(|e| panic!("reader: {e}"));
    assert_denied(
        start_workflow(&reader, "by-reader").await,
        "reader starting a workflow",
    );
    let writer = connect(
        &server,
        Some(&cert(server.client_cert("writer", &["default:write"]))),
        None,
    )
    .await;
    start_workflow(&writer, "by-writer")
        .await
        .unwrap_or_else(|e| panic!("writer: {e}"));
    let other = connect(
        &server,
        Some(&cert(server.client_cert("other", &["other:admin"]))),
        None,
    )
    .await;
    assert_denied(
        describe_namespace(&other).await,
        "admin of another namespace",
    );
    let both = cert(server.client_cert("both", &["other:admin", "default:read"]));
    let both = connect(&server, Some(&both), None).await;
    describe_namespace(&both)
        .await
        .unwrap_or_else(|e| panic!("second permission of a certificate: {e}"));

    stop(server).await;
}

/// The sample worker, polling `default` with versioning as `deployment`/`build_id`.
fn start_worker(
    server: &ProductionTemporal,
    cert: &CertPair,
    deployment: &str,
    build_id: &str,
) -> Supervised {
    let bin = std::env::var_os("TWC_SAMPLE_WORKER").map_or_else(
        || {
            std::env::current_exe()
                .ok()
                .and_then(|exe| Some(exe.parent()?.parent()?.join("sample-worker")))
                .unwrap_or_default()
        },
        PathBuf::from,
    );
    assert!(
        bin.exists(),
        "{} is missing: cargo build -p twc-sample-worker",
        bin.display()
    );
    let mut command = tokio::process::Command::new(&bin);
    command
        .env("TEMPORAL_ADDRESS", &server.address)
        .env("TEMPORAL_NAMESPACE", "default")
        .env("TEMPORAL_DEPLOYMENT_NAME", deployment)
        .env("TEMPORAL_WORKER_BUILD_ID", build_id)
        .env("TEMPORAL_TLS_CLIENT_CERT_PATH", &cert.cert_path)
        .env("TEMPORAL_TLS_CLIENT_KEY_PATH", &cert.key_path)
        .env("TEMPORAL_TLS_CA_CERT_PATH", &server.ca_path)
        .env("TEMPORAL_TLS_SERVER_NAME", &server.server_name)
        .env("RUST_LOG", "info");
    let log = server.log.with_file_name("sample-worker.log");
    spawn_logged("sample-worker", command, &log).unwrap_or_else(|e| panic!("{e}"))
}

async fn set_current(client: &Client, deployment: &str, build_id: &str) -> Result<(), Status> {
    let request = SetWorkerDeploymentCurrentVersionRequest {
        namespace: "default".to_owned(),
        deployment_name: deployment.to_owned(),
        build_id: build_id.to_owned(),
        identity: "production-temporal-test".to_owned(),
        ignore_missing_task_queues: true,
        ..Default::default()
    };
    WorkflowService::set_worker_deployment_current_version(
        &mut client.clone(),
        request.into_request(),
    )
    .await
    .map(|_| ())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_grant_their_permissions_and_only_write_may_set_the_current_version() {
    let server = start("api-keys").await;
    // The certificate opens the TLS handshake; it grants nothing itself.
    let bare = cert(server.client_cert("api-key-client", &[]));
    let without_key = connect(&server, Some(&bare), None).await;
    assert_denied(
        list_workflows(&without_key).await,
        "certificate without permissions",
    );

    let writer_key = key(server.api_key(&["default:write"], HOUR));
    let writer = with_api_key(&server, &bare, &writer_key).await;
    list_workflows(&writer)
        .await
        .unwrap_or_else(|e| panic!("write key: {e}"));
    start_workflow(&writer, "by-write-key")
        .await
        .unwrap_or_else(|e| panic!("write key: {e}"));
    // Under the API-key name the frontend asks for no certificate: the key alone is enough.
    let key_alone = connect(&server, None, Some(&writer_key)).await;
    list_workflows(&key_alone)
        .await
        .unwrap_or_else(|e| panic!("write key without a certificate: {e}"));
    assert_eq!(
        handshake_as(&server, twc_sandbox::production::API_SERVER_NAME, None).await,
        Ok(()),
        "no certificate asked for under the API-key name"
    );

    // A worker credential reads and polls (authorizer.go) but may not start workflows.
    let worker_key = key(server.api_key(&["default:worker"], HOUR));
    let worker_only = with_api_key(&server, &bare, &worker_key).await;
    list_workflows(&worker_only)
        .await
        .unwrap_or_else(|e| panic!("worker key reading: {e}"));
    assert_denied(
        start_workflow(&worker_only, "by-worker-key").await,
        "worker key starting a workflow",
    );

    let unknown = key(server.unknown_signer_api_key(&["system:admin"], HOUR));
    let unknown = with_api_key(&server, &bare, &unknown).await;
    assert_denied(list_workflows(&unknown).await, "key of an unknown signer");
    let expired = key(server.expired_api_key(&["system:admin"]));
    let expired = with_api_key(&server, &bare, &expired).await;
    assert_denied(list_workflows(&expired).await, "expired key");

    // A version to set current: a real worker polling with versioning, over mutual TLS with
    // a certificate granting only the worker role.
    let (deployment, build_id) = ("auth-test", "v1");
    let worker_cert = cert(server.client_cert("worker", &["default:worker"]));
    let mut worker = start_worker(&server, &worker_cert, deployment, build_id);
    let admin = connect(&server, Some(&server.admin_cert), None).await;
    let version_exists = wait_until("the worker's version", Duration::from_secs(60), || {
        let mut admin = admin.clone();
        async move {
            let request = DescribeWorkerDeploymentRequest {
                namespace: "default".to_owned(),
                deployment_name: deployment.to_owned(),
            };
            let info =
                WorkflowService::describe_worker_deployment(&mut admin, request.into_request())
                    .await
                    .ok()?
                    .into_inner()
                    .worker_deployment_info?;
            info.version_summaries
                .iter()
                .any(|v| {
                    v.deployment_version
                        .as_ref()
                        .is_some_and(|d| d.build_id == build_id)
                })
                .then_some(())
        }
    })
    .await;
    if let Err(e) = version_exists {
        panic!("{e}; worker log:\n{}", tail(&worker.log, 30));
    }

    for (permissions, what) in [
        (&["default:worker"][..], "worker key"),
        (&["default:read"][..], "read key"),
        (&["other:admin"][..], "admin key of another namespace"),
    ] {
        let key = key(server.api_key(permissions, HOUR));
        let client = with_api_key(&server, &bare, &key).await;
        assert_denied(set_current(&client, deployment, build_id).await, what);
    }
    set_current(&writer, deployment, build_id)
        .await
        .unwrap_or_else(|e| panic!("write key setting the current version: {e}"));

    worker.stop(Duration::from_secs(10)).await;
    stop(server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_signing_key_is_picked_up_and_a_retired_one_refused() {
    let server = start("rotation").await;
    let bare = cert(server.client_cert("rotation-client", &[]));
    let a = with_api_key(
        &server,
        &bare,
        &key(server.api_key(&["default:read"], HOUR)),
    )
    .await;
    list_workflows(&a)
        .await
        .unwrap_or_else(|e| panic!("key A: {e}"));

    let kid = server
        .rotate_signing_key(PreviousKey::Retire)
        .unwrap_or_else(|e| panic!("rotating: {e}"));
    let b = with_api_key(
        &server,
        &bare,
        &key(server.api_key(&["default:read"], HOUR)),
    )
    .await;
    let rotated = std::time::Instant::now();
    wait_until(
        &format!("key B ({kid}) accepted"),
        Duration::from_secs(30),
        || async { list_workflows(&b).await.ok() },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "key B accepted {:.1}s after the rotation",
        rotated.elapsed().as_secs_f64()
    );
    // The server swaps whole key sets: once B verifies, A's key is gone.
    assert_denied(
        list_workflows(&a).await,
        "key A after its signing key was retired",
    );

    // Kept on rotation, the previous key keeps verifying.
    server
        .rotate_signing_key(PreviousKey::Keep)
        .unwrap_or_else(|e| panic!("rotating: {e}"));
    let c = with_api_key(
        &server,
        &bare,
        &key(server.api_key(&["default:read"], HOUR)),
    )
    .await;
    wait_until("key C accepted", Duration::from_secs(30), || async {
        list_workflows(&c).await.ok()
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    list_workflows(&b)
        .await
        .unwrap_or_else(|e| panic!("key B after a rotation that kept it: {e}"));

    stop(server).await;
}
