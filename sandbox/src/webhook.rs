//! The controller's WorkerResourceTemplate admission webhook in the sandbox: a serving
//! certificate from a CA of its own, and a ValidatingWebhookConfiguration that makes the
//! sandbox's kube-apiserver call the controller at `https://127.0.0.1:<port>` (as a cluster's
//! would call the chart's Service).

use std::path::{Path, PathBuf};

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    RuleWithOperations, ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use kube::api::{Api, ObjectMeta, Patch, PatchParams};

use crate::apiserver::FIELD_MANAGER;
use crate::production::pki::{Authority, PkiError};

/// Kinds the sandbox's controller lets WorkerResourceTemplates render.
pub const ALLOWED_KINDS: &str = "HorizontalPodAutoscaler,PodDisruptionBudget,ScaledObject";
/// Path the controller serves the webhook on.
pub const PATH: &str = "/validate-temporal-io-v1alpha1-workerresourcetemplate";
/// Name of the ValidatingWebhookConfiguration.
pub const CONFIGURATION_NAME: &str = "twc-sandbox-workerresourcetemplates";

/// The webhook's certificate could not be made or registered.
#[derive(Debug, thiserror::Error)]
pub enum WebhookSetupError {
    /// The certificate could not be made.
    #[error(transparent)]
    Pki(#[from] PkiError),
    /// A file could not be written.
    #[error("writing {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The configuration could not be applied.
    #[error("registering the ValidatingWebhookConfiguration {CONFIGURATION_NAME}: {0}")]
    Register(#[source] kube::Error),
}

/// Writes a CA (`ca.crt`) and a serving certificate for 127.0.0.1 and `localhost` signed by it
/// (`tls.crt`, `tls.key`, what `twc run --webhook-cert-dir` reads) into `dir`; returns the CA.
pub fn write_certificates(dir: &Path) -> Result<String, WebhookSetupError> {
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|source| WebhookSetupError::Write { path, source })
    };
    std::fs::create_dir_all(dir).map_err(|source| WebhookSetupError::Write {
        path: dir.to_owned(),
        source,
    })?;
    let authority = Authority::new("twc-sandbox webhook CA")?;
    let (cert, key) = authority.server_cert(&["localhost"])?;
    write("ca.crt", &authority.cert_pem)?;
    write("tls.crt", &cert)?;
    write("tls.key", &key)?;
    Ok(authority.cert_pem)
}

/// Applies the ValidatingWebhookConfiguration for WorkerResourceTemplates (create and update,
/// failure policy Fail, no side effects), calling `url` and trusting `ca_pem`.
pub async fn register(
    client: &kube::Client,
    url: &str,
    ca_pem: &str,
) -> Result<(), WebhookSetupError> {
    let configuration = ValidatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(CONFIGURATION_NAME.to_owned()),
            ..Default::default()
        },
        webhooks: Some(vec![ValidatingWebhook {
            name: "workerresourcetemplates.temporal.io".to_owned(),
            admission_review_versions: vec!["v1".to_owned()],
            client_config: WebhookClientConfig {
                url: Some(url.to_owned()),
                ca_bundle: Some(ByteString(ca_pem.as_bytes().to_vec())),
                service: None,
            },
            failure_policy: Some("Fail".to_owned()),
            side_effects: "None".to_owned(),
            timeout_seconds: Some(10),
            rules: Some(vec![RuleWithOperations {
                api_groups: Some(vec![twc_crds::GROUP.to_owned()]),
                api_versions: Some(vec![twc_crds::VERSION.to_owned()]),
                operations: Some(vec!["CREATE".to_owned(), "UPDATE".to_owned()]),
                resources: Some(vec!["workerresourcetemplates".to_owned()]),
                scope: Some("Namespaced".to_owned()),
            }]),
            ..Default::default()
        }]),
    };
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .patch(
            CONFIGURATION_NAME,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&configuration),
        )
        .await
        .map_err(WebhookSetupError::Register)?;
    Ok(())
}
