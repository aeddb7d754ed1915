//! Mutual TLS in front of the plaintext Temporal dev server: a CA, a server and a client
//! certificate made with `openssl`, and a TLS-terminating proxy that forwards to the dev
//! server, so TWDs whose TemporalConnection has a `mutualTLSSecretRef` (and their workers) reach
//! a real Temporal in the tests. A proxy started with [`TlsFront::start_verifying`] checks
//! client certificates against its CA, as a server that refuses unknown clients does.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::Command;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::RootCertStore;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::crypto::ring::default_provider;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;

/// The name the proxy's certificate is issued for (`spec.tls.serverName` of the connection).
pub const SERVER_NAME: &str = "temporal.test";

/// PEM files of one test CA, the proxy's certificate and a client certificate.
pub struct Certificates {
    /// CA that issued both certificates (`ca.crt` of the Secret).
    pub ca: String,
    /// Client certificate (`tls.crt`).
    pub client_cert: String,
    /// Client key (`tls.key`).
    pub client_key: String,
    server_cert: String,
    server_key: String,
}

/// A TLS-terminating proxy to a plaintext Temporal, running until dropped.
pub struct TlsFront {
    /// `127.0.0.1:<port>` to connect to.
    pub address: String,
    /// The certificates it serves and accepts.
    pub certificates: Certificates,
    proxy: JoinHandle<()>,
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.proxy.abort();
    }
}

/// What the proxy does with client certificates.
#[derive(Clone, Copy)]
enum ClientCerts {
    /// Accepts any client (or none).
    Ignored,
    /// Refuses clients without a certificate of its CA.
    Verified,
}

impl TlsFront {
    /// Fresh certificates and a proxy to `upstream` (`host:port` of a plaintext Temporal).
    pub async fn start(upstream: &str) -> Self {
        Self::start_with(upstream, ClientCerts::Ignored).await
    }

    /// [`TlsFront::start`], refusing clients whose certificate its CA did not issue.
    pub async fn start_verifying(upstream: &str) -> Self {
        Self::start_with(upstream, ClientCerts::Verified).await
    }

    async fn start_with(upstream: &str, clients: ClientCerts) -> Self {
        let certificates = Certificates::issue("twc test CA").await;
        let acceptor = acceptor(&certificates, clients);
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("binding the TLS proxy: {e}"));
        let address = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("address of the TLS proxy: {e}"))
            .to_string();
        let upstream = upstream.to_owned();
        let proxy = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                tokio::spawn(forward(acceptor.clone(), client, upstream.clone()));
            }
        });
        Self {
            address,
            certificates,
            proxy,
        }
    }

    /// A `kubernetes.io/tls` Secret `name` with the client certificate, its key and the CA.
    pub fn secret(&self, namespace: &str, name: &str) -> Value {
        let c = &self.certificates;
        json!({
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": { "name": name, "namespace": namespace },
            "stringData": { "tls.crt": c.client_cert, "tls.key": c.client_key, "ca.crt": c.ca }
        })
    }

    /// A Secret like [`TlsFront::secret`] whose client certificate a CA unknown to this proxy
    /// issued: a proxy started with [`TlsFront::start_verifying`] refuses it (TLS alert
    /// `UnknownCA`, which the controller reads as a refused credential).
    pub async fn foreign_secret(&self, namespace: &str, name: &str) -> Value {
        let foreign = Certificates::issue("twc foreign CA").await;
        json!({
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": { "name": name, "namespace": namespace },
            "stringData": {
                "tls.crt": foreign.client_cert,
                "tls.key": foreign.client_key,
                "ca.crt": self.certificates.ca
            }
        })
    }

    /// A TemporalConnection `name` to this proxy, authenticating with the Secret `secret`.
    pub fn connection(&self, namespace: &str, name: &str, secret: &str) -> Value {
        json!({
            "apiVersion": "temporal.io/v1alpha1",
            "kind": "TemporalConnection",
            "metadata": { "name": name, "namespace": namespace },
            "spec": {
                "hostPort": self.address,
                "tls": { "serverName": SERVER_NAME },
                "mutualTLSSecretRef": { "name": secret }
            }
        })
    }
}

/// One client connection: TLS off, bytes copied both ways to the upstream.
async fn forward(acceptor: TlsAcceptor, client: TcpStream, upstream: String) {
    let Ok(mut client) = acceptor.accept(client).await else {
        return;
    };
    let Ok(mut server) = TcpStream::connect(&upstream).await else {
        return;
    };
    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
}

fn acceptor(certificates: &Certificates, clients: ClientCerts) -> TlsAcceptor {
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(certificates.server_cert.as_bytes())
            .collect::<Result<_, _>>()
            .unwrap_or_else(|e| panic!("server certificate PEM: {e}"));
    let key = PrivateKeyDer::from_pem_slice(certificates.server_key.as_bytes())
        .unwrap_or_else(|e| panic!("server key PEM: {e}"));
    let provider = Arc::new(default_provider());
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .unwrap_or_else(|e| panic!("TLS proxy protocol versions: {e}"));
    let builder = match clients {
        ClientCerts::Ignored => builder.with_no_client_auth(),
        ClientCerts::Verified => {
            let mut roots = RootCertStore::empty();
            for ca in CertificateDer::pem_slice_iter(certificates.ca.as_bytes()) {
                let ca = ca.unwrap_or_else(|e| panic!("CA certificate PEM: {e}"));
                roots
                    .add(ca)
                    .unwrap_or_else(|e| panic!("CA certificate: {e}"));
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .unwrap_or_else(|e| panic!("client certificate verifier: {e}"));
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .unwrap_or_else(|e| panic!("TLS proxy configuration: {e}"));
    // gRPC clients insist on HTTP/2 being negotiated.
    config.alpn_protocols = vec![b"h2".to_vec()];
    TlsAcceptor::from(Arc::new(config))
}

impl Certificates {
    /// A CA named `ca_name` valid for two days, and a server (for [`SERVER_NAME`]) and a client certificate
    /// it issued, made with `openssl` in a fresh temporary folder.
    async fn issue(ca_name: &str) -> Self {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "twc-tls-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        openssl(
            &dir,
            &[
                &["req", "-x509"][..],
                &ec,
                &[
                    "-keyout",
                    "ca.key",
                    "-out",
                    "ca.crt",
                    "-days",
                    "2",
                    "-subj",
                    &format!("/CN={ca_name}"),
                    "-addext",
                    "basicConstraints=critical,CA:TRUE",
                    "-addext",
                    "keyUsage=critical,keyCertSign,cRLSign",
                ],
            ]
            .concat(),
        )
        .await;
        for (name, usage) in [("server", "serverAuth"), ("client", "clientAuth")] {
            let san = if name == "server" {
                format!("subjectAltName=DNS:{SERVER_NAME}\n")
            } else {
                String::new()
            };
            let extensions = format!(
                "{san}basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage={usage}\n"
            );
            let ext_file = format!("{name}.ext");
            std::fs::write(dir.join(&ext_file), extensions)
                .unwrap_or_else(|e| panic!("writing {ext_file}: {e}"));
            let (key, csr, crt) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.crt"),
            );
            let subject = format!("/CN=twc test {name}");
            openssl(
                &dir,
                &[
                    &["req"][..],
                    &ec,
                    &["-keyout", &key, "-out", &csr, "-subj", &subject],
                ]
                .concat(),
            )
            .await;
            openssl(
                &dir,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &csr,
                    "-CA",
                    "ca.crt",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-out",
                    &crt,
                    "-days",
                    "2",
                    "-extfile",
                    &ext_file,
                ],
            )
            .await;
        }
        let read = |file: &str| {
            std::fs::read_to_string(dir.join(file))
                .unwrap_or_else(|e| panic!("reading {file}: {e}"))
        };
        let certificates = Self {
            ca: read("ca.crt"),
            client_cert: read("client.crt"),
            client_key: read("client.key"),
            server_cert: read("server.crt"),
            server_key: read("server.key"),
        };
        let _ = std::fs::remove_dir_all(&dir);
        certificates
    }
}

async fn openssl(dir: &Path, args: &[&str]) {
    let mut command = Command::new("openssl");
    command.current_dir(dir).args(args);
    let out = super::cli::run(command, None).await;
    assert!(
        out.success,
        "openssl {} failed (the mutual-TLS tests need the openssl CLI): {}",
        args.join(" "),
        out.stderr
    );
}
