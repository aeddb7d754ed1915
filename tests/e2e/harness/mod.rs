//! Shared machinery of the end-to-end tests: the sandbox started by `twc-sandbox exec` (once per
//! test run), per-test Kubernetes namespaces (which also isolate Temporal deployment names),
//! kubectl and temporal CLI calls, and waits with deadlines that dump server logs on failure.

pub mod browser;
pub mod cli;
pub mod controls;
pub mod tls;
pub mod twd;
pub mod wait;
pub mod webhook;

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ObjectMeta, PostParams};
use twc_sandbox::env::SandboxEnv;

/// The sandbox of this test run.
pub fn env() -> &'static SandboxEnv {
    static ENV: OnceLock<SandboxEnv> = OnceLock::new();
    ENV.get_or_init(|| match SandboxEnv::from_env_var() {
        Ok(env) => env,
        Err(e) => panic!("{e}"),
    })
}

/// An admin client of the sandbox's API server.
pub async fn kube_client() -> kube::Client {
    match twc_sandbox::apiserver::client(&env().kubeconfig).await {
        Ok(client) => client,
        Err(e) => panic!("kube client: {e}"),
    }
}

/// A fresh namespace for one test: `<prefix>-<unique suffix>`.
pub async fn test_namespace(client: &kube::Client, prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    let suffix = format!(
        "{:x}{:x}",
        (nanos ^ std::process::id()) & 0xfffff,
        COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    let name = format!("{prefix}-{suffix}");
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        ..Default::default()
    };
    if let Err(e) = Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
    {
        panic!("creating namespace {name}: {e}");
    }
    name
}
