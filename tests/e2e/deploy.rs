//! `deploy/`: the Helm charts, the plain manifests and the CD recipes of the README.
//!
//! The RBAC proof installs the chart restricted to one namespace and runs the controller as the
//! chart's ServiceAccount, with the command line of the chart's Deployment, through a whole
//! rollout, a promotion by annotation, a sunset and a deletion. It does so in a second sandbox
//! of its own: the suite's controller watches every namespace of the suite's sandbox and would
//! run the same workflows (`twd/<ns>/<name>`) with admin rights.
//!
//! The chart and manifest checks need only the tools (`helm`, `kubectl`), no servers.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};
use tokio::process::Command;
use twc_crds::{TemporalConnection, TemporalWorkerDeployment};
use twc_sandbox::env::{ENV_FILE_NAME, SandboxEnv};

use crate::harness::cli::{CliOutput, kubectl, run};
use crate::harness::controls::{Via, send};
use crate::harness::twd::{apply, condition, deployments, get_twd, legacy, wait_ready};
use crate::harness::wait::{wait_for, wait_for_with_logs};
use crate::harness::{env, kube_client, test_namespace};

const REPO: &str = env!("CARGO_MANIFEST_DIR");
const CHART: &str = "deploy/helm/twc";
const CRD_CHART: &str = "deploy/helm/twc-crds";
const MANIFESTS: &str = "deploy/manifests";
const ROLLOUT: Duration = Duration::from_secs(150);
/// Namespace the chart is installed in, in the RBAC proof and the manifest comparison.
const RELEASE_NAMESPACE: &str = "twc-system";
/// ServiceAccount (and Deployment) of release `twc`.
const CONTROLLER: &str = "twc";

// ---- tools ------------------------------------------------------------------------------------

/// Where `make tools` installs things.
fn tools_dir() -> PathBuf {
    std::env::var_os("TWC_TOOLS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(REPO).join(".tools"))
}

/// A tool: `$<var>` if set, else its place under the tools dir.
fn tool(var: &str, relative: &str) -> PathBuf {
    std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| tools_dir().join(relative))
}

fn command(program: &Path, args: &[&str]) -> Command {
    assert!(
        program.exists(),
        "{} is missing: run `make tools`",
        program.display()
    );
    let mut command = Command::new(program);
    command.args(args).current_dir(REPO);
    command
}

/// Runs a tool and returns its standard output; panics with its error output on failure.
async fn succeed(program: &Path, args: &[&str], stdin: Option<&str>) -> String {
    let out = run(command(program, args), stdin).await;
    assert!(
        out.success,
        "{} {} failed:\n{}{}",
        program.display(),
        args.join(" "),
        out.stdout,
        out.stderr
    );
    out.stdout
}

async fn helm(args: &[&str]) -> String {
    succeed(&tool("TWC_HELM", "venv/bin/helm"), args, None).await
}

/// The documents of a YAML stream (e.g. `helm template` output), as JSON values.
fn documents(yaml: &str) -> Vec<Value> {
    match serde_saphyr::from_multiple::<Value>(yaml) {
        Ok(docs) => docs.into_iter().filter(|d| !d.is_null()).collect(),
        Err(e) => panic!("parsing YAML: {e}\n{yaml}"),
    }
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn only<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    match of_kind(docs, kind).as_slice() {
        [one] => one,
        other => panic!("expected one {kind}, found {}", other.len()),
    }
}

/// `helm template twc deploy/helm/twc -n twc-system` with extra flags, parsed.
async fn render_chart(extra: &[&str]) -> Vec<Value> {
    let mut args = vec!["template", "twc", CHART, "--namespace", RELEASE_NAMESPACE];
    args.extend_from_slice(extra);
    documents(&helm(&args).await)
}

/// The controller's own rules (the ClusterRole or Role that grants Deployments), as opposed to
/// the roles for people.
fn is_controller_role(role: &Value) -> bool {
    role["rules"].as_array().into_iter().flatten().any(|r| {
        r["resources"]
            .as_array()
            .is_some_and(|rs| rs.contains(&json!("deployments")))
    })
}

fn container_args(deployment: &Value) -> Vec<String> {
    deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str().map(str::to_owned))
        .collect()
}

// ---- charts and manifests (no servers) ---------------------------------------------------------

/// These tests run on the older kinds (TemporalWorkerDeployment, TemporalConnection), which
/// `twc` keeps serving and whose RBAC the chart grants beside the new kinds'.
fn worker(ns: &str, name: &str, tag: &str, rollout: Value) -> Value {
    legacy(crate::harness::twd::worker(ns, name, tag, rollout))
}

/// The older kind of connection (see [`worker`]).
fn connection(ns: &str) -> Value {
    legacy(crate::harness::twd::connection(ns))
}

#[tokio::test]
async fn charts_pass_helm_lint_with_default_and_restricted_values() {
    helm(&["lint", "--strict", CHART, CRD_CHART]).await;
    helm(&[
        "lint",
        "--strict",
        CHART,
        "--set-json",
        r#"rbac.watchNamespaces=["a","b"]"#,
        "--set",
        "engine.apiKey.secretName=engine-api-key,engine.tls.serverName=engine.example.com",
    ])
    .await;
}

/// Helm re-encodes the CRDs (fromYaml/toYaml), so `minimum: 1.0` comes out as `1`; OpenAPI
/// numbers are floats either way.
fn numbers_as_floats(value: &Value) -> Value {
    match value {
        Value::Number(n) => n.as_f64().map_or(Value::Null, |f| json!(f)),
        Value::Array(items) => items.iter().map(numbers_as_floats).collect(),
        Value::Object(fields) => fields
            .iter()
            .map(|(k, v)| (k.clone(), numbers_as_floats(v)))
            .collect(),
        other => other.clone(),
    }
}

#[tokio::test]
async fn crd_chart_renders_exactly_the_generated_crds_and_keeps_them_on_uninstall() {
    let rendered = documents(&helm(&["template", "twc-crds", CRD_CHART]).await);
    let mut generated = Vec::new();
    for entry in std::fs::read_dir(Path::new(REPO).join("crds"))
        .into_iter()
        .flatten()
        .flatten()
    {
        if entry.path().extension().is_some_and(|x| x == "yaml") {
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            generated.extend(documents(&text));
        }
    }
    assert_eq!(
        generated.len(),
        twc_crds::crd_yaml::crd_manifests().len(),
        "crds/*.yaml: one per CRD"
    );
    assert_eq!(
        rendered.len(),
        generated.len(),
        "one rendered CRD per crds/*.yaml"
    );
    for crd in &generated {
        let name = &crd["metadata"]["name"];
        let Some(chart) = rendered.iter().find(|r| &r["metadata"]["name"] == name) else {
            panic!("the CRD chart lacks {name}");
        };
        assert!(
            numbers_as_floats(&chart["spec"]) == numbers_as_floats(&crd["spec"]),
            "the CRD chart's {name} differs from crds/: run `make crds`"
        );
        assert_eq!(
            chart["metadata"]["annotations"]["helm.sh/resource-policy"], "keep",
            "{name}"
        );
    }
}

#[tokio::test]
async fn plain_manifests_match_what_the_chart_renders_without_the_webhook() {
    let chart = render_chart(&["--set", "webhook.enabled=false"]).await;
    let kubectl_bin = tool("TWC_KUBECTL", "venv/bin/kubectl");
    let plain = documents(&succeed(&kubectl_bin, &["kustomize", MANIFESTS], None).await);

    for kind in [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Deployment",
        "Service",
    ] {
        assert_eq!(
            of_kind(&chart, kind).len(),
            of_kind(&plain, kind).len(),
            "number of {kind} objects"
        );
    }
    let role_key = |role: &Value| {
        let name = role["metadata"]["name"].as_str().unwrap_or_default();
        if is_controller_role(role) {
            "controller"
        } else if name.ends_with("-edit") {
            "edit"
        } else {
            "view"
        }
    };
    for role in of_kind(&chart, "ClusterRole") {
        let key = role_key(role);
        let twin = of_kind(&plain, "ClusterRole")
            .into_iter()
            .find(|r| role_key(r) == key);
        assert_eq!(
            twin.map(|r| &r["rules"]),
            Some(&role["rules"]),
            "rules of the {key} ClusterRole"
        );
    }
    // The replicas' Lease Role in the controller's namespace.
    let (chart_role, plain_role) = (only(&chart, "Role"), only(&plain, "Role"));
    assert_eq!(
        chart_role["rules"], plain_role["rules"],
        "rules of the Role"
    );
    assert_eq!(
        only(&chart, "RoleBinding")["subjects"],
        only(&plain, "RoleBinding")["subjects"]
    );
    let (chart_binding, plain_binding) = (
        only(&chart, "ClusterRoleBinding"),
        only(&plain, "ClusterRoleBinding"),
    );
    assert_eq!(chart_binding["subjects"], plain_binding["subjects"]);
    for (docs, binding) in [(&chart, chart_binding), (&plain, plain_binding)] {
        let controller_role = of_kind(docs, "ClusterRole")
            .into_iter()
            .find(|r| is_controller_role(r))
            .map(|r| r["metadata"]["name"].clone());
        assert_eq!(Some(binding["roleRef"]["name"].clone()), controller_role);
    }
    let (chart_deployment, plain_deployment) =
        (only(&chart, "Deployment"), only(&plain, "Deployment"));
    for field in ["replicas", "selector"] {
        assert_eq!(
            plain_deployment["spec"][field], chart_deployment["spec"][field],
            "Deployment spec.{field}"
        );
    }
    // Helm's bookkeeping labels are the only intended difference in the pod template.
    let template = |deployment: &Value| {
        let mut template = deployment["spec"]["template"].clone();
        if let Some(labels) = template["metadata"]["labels"].as_object_mut() {
            labels
                .retain(|k, _| k == "app.kubernetes.io/name" || k == "app.kubernetes.io/instance");
        }
        template
    };
    assert_eq!(
        template(plain_deployment),
        template(chart_deployment),
        "Deployment spec.template"
    );
    assert_eq!(
        only(&chart, "Service")["spec"],
        only(&plain, "Service")["spec"]
    );
    assert_eq!(
        only(&plain, "ServiceAccount")["metadata"]["name"],
        only(&chart, "ServiceAccount")["metadata"]["name"]
    );
}

#[tokio::test]
async fn chart_binds_metrics_and_probes_to_the_ports_it_declares() {
    for (extra, metrics, health) in [
        (None, 8080, 8081),
        (Some("metrics.port=9090,probes.port=9091"), 9090, 9091),
    ] {
        let docs = match extra {
            Some(values) => render_chart(&["--set", values]).await,
            None => render_chart(&[]).await,
        };
        let deployment = only(&docs, "Deployment");
        let args = container_args(deployment);
        assert!(
            args.contains(&format!("--metrics-bind-address=:{metrics}")),
            "{args:?}"
        );
        assert!(
            args.contains(&format!("--health-bind-address=:{health}")),
            "{args:?}"
        );
        let container = &deployment["spec"]["template"]["spec"]["containers"][0];
        let port = |name: &str| {
            container["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|p| p["name"] == json!(name))
                .and_then(|p| p["containerPort"].as_u64())
        };
        assert_eq!(port("metrics"), Some(metrics));
        assert_eq!(port("http-health"), Some(health));
        assert_eq!(
            container["livenessProbe"]["httpGet"]["path"],
            json!("/healthz")
        );
        assert_eq!(
            container["readinessProbe"]["httpGet"]["path"],
            json!("/readyz")
        );
    }
}

/// The rules of the controller's (Cluster)Role that grant `resource`.
fn rules_for<'a>(role: &'a Value, resource: &str) -> Vec<&'a Value> {
    role["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| {
            r["resources"]
                .as_array()
                .is_some_and(|rs| rs.contains(&json!(resource)))
        })
        .collect()
}

#[tokio::test]
async fn chart_renders_the_webhook_and_grants_the_allowed_kinds() {
    // Default: the webhook with a generated certificate, HorizontalPodAutoscalers only.
    let docs = render_chart(&[]).await;
    let secret = only(&docs, "Secret");
    for key in ["ca.crt", "tls.crt", "tls.key"] {
        assert!(
            secret["data"][key].as_str().is_some_and(|v| !v.is_empty()),
            "the webhook Secret has {key}"
        );
    }
    let configuration = only(&docs, "ValidatingWebhookConfiguration");
    let webhook = &configuration["webhooks"][0];
    assert_eq!(
        webhook["clientConfig"]["caBundle"],
        secret["data"]["ca.crt"]
    );
    let service = of_kind(&docs, "Service")
        .into_iter()
        .find(|s| s["metadata"]["name"] == webhook["clientConfig"]["service"]["name"]);
    let Some(service) = service else {
        panic!("no Service named by the webhook configuration: {webhook}");
    };
    assert_eq!(service["spec"]["ports"][0]["port"], json!(443));
    assert_eq!(service["spec"]["ports"][0]["targetPort"], json!("webhook"));
    assert_eq!(
        webhook["clientConfig"]["service"]["path"],
        json!("/validate-temporal-io-v1alpha1-workerresourcetemplate")
    );
    assert_eq!(webhook["failurePolicy"], json!("Fail"));
    assert_eq!(webhook["sideEffects"], json!("None"));
    assert_eq!(
        webhook["rules"],
        json!([{ "apiGroups": ["temporal.io"], "apiVersions": ["v1alpha1"],
            "operations": ["CREATE", "UPDATE"], "resources": ["workerresourcetemplates"], "scope": "Namespaced" }])
    );
    assert!(webhook.get("namespaceSelector").is_none());
    let deployment = only(&docs, "Deployment");
    let args = container_args(deployment);
    for arg in [
        "--wrt-allowed-kinds=HorizontalPodAutoscaler",
        "--webhook-bind-address=:9443",
        "--webhook-cert-dir=/etc/twc/webhook",
    ] {
        assert!(args.contains(&arg.to_owned()), "{arg} in {args:?}");
    }
    let volumes = &deployment["spec"]["template"]["spec"]["volumes"];
    assert!(
        volumes
            .as_array()
            .into_iter()
            .flatten()
            .any(|v| v["secret"]["secretName"] == secret["metadata"]["name"]),
        "the webhook Secret is mounted: {volumes}"
    );
    let role = of_kind(&docs, "ClusterRole")
        .into_iter()
        .find(|r| is_controller_role(r));
    let Some(role) = role else {
        panic!("no controller ClusterRole");
    };
    assert_eq!(
        rules_for(role, "horizontalpodautoscalers"),
        [
            &json!({ "apiGroups": ["autoscaling"], "resources": ["horizontalpodautoscalers"],
            "verbs": ["create", "delete", "get", "list", "patch", "update"] })
        ]
    );
    assert!(rules_for(role, "poddisruptionbudgets").is_empty());

    // More kinds: each is allowed and granted; restricted to namespaces, the webhook is too.
    let docs = render_chart(&[
        "--set-json",
        r#"workerResourceTemplate.allowedResources=[{"kinds":["HorizontalPodAutoscaler"],"apiGroups":["autoscaling"],"resources":["horizontalpodautoscalers"]},{"kinds":["PodDisruptionBudget"],"apiGroups":["policy"],"resources":["poddisruptionbudgets"]},{"kinds":["ScaledObject"],"apiGroups":["keda.sh"],"resources":["scaledobjects"]}]"#,
        "--set-json",
        r#"rbac.watchNamespaces=["team-a"]"#,
    ])
    .await;
    let args = container_args(only(&docs, "Deployment"));
    assert!(
        args.contains(
            &"--wrt-allowed-kinds=HorizontalPodAutoscaler,PodDisruptionBudget,ScaledObject"
                .to_owned()
        ),
        "{args:?}"
    );
    let role = of_kind(&docs, "Role")
        .into_iter()
        .find(|r| is_controller_role(r))
        .unwrap_or_else(|| panic!("no controller Role"));
    for resource in [
        "poddisruptionbudgets",
        "scaledobjects",
        "localsubjectaccessreviews",
    ] {
        assert_eq!(rules_for(role, resource).len(), 1, "{resource}");
    }
    assert_eq!(
        only(&docs, "ValidatingWebhookConfiguration")["webhooks"][0]["namespaceSelector"],
        json!({ "matchExpressions": [{ "key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a"] }] })
    );

    // Without the webhook: no Secret, Service or configuration, the kinds still allowed.
    let docs = render_chart(&["--set", "webhook.enabled=false"]).await;
    assert!(of_kind(&docs, "ValidatingWebhookConfiguration").is_empty());
    assert!(of_kind(&docs, "Secret").is_empty());
    assert_eq!(
        of_kind(&docs, "Service").len(),
        1,
        "only the metrics Service"
    );
    let args = container_args(only(&docs, "Deployment"));
    assert!(
        args.contains(&"--wrt-allowed-kinds=HorizontalPodAutoscaler".to_owned()),
        "{args:?}"
    );
    assert!(!args.iter().any(|a| a.starts_with("--webhook")), "{args:?}");
}

#[tokio::test]
async fn restricted_chart_binds_roles_only_in_the_watched_namespaces() {
    let docs = render_chart(&["--set-json", r#"rbac.watchNamespaces=["team-a","team-b"]"#]).await;
    assert!(
        !of_kind(&docs, "ClusterRole")
            .into_iter()
            .any(is_controller_role),
        "no cluster-wide rules for the controller"
    );
    assert!(of_kind(&docs, "ClusterRoleBinding").is_empty());
    let namespaces = |kind, controller: bool| -> Vec<Value> {
        of_kind(&docs, kind)
            .iter()
            .filter(|r| (r["metadata"]["name"] == json!(CONTROLLER)) == controller)
            .map(|r| r["metadata"]["namespace"].clone())
            .collect()
    };
    let watched = vec![json!("team-a"), json!("team-b")];
    assert_eq!(namespaces("Role", true), watched);
    assert_eq!(namespaces("RoleBinding", true), watched);
    // In its own namespace the controller may only record events (about TWDs of a namespace
    // being deleted, which refuses them) and keep its replica Lease.
    let release = vec![json!(RELEASE_NAMESPACE), json!(RELEASE_NAMESPACE)];
    assert_eq!(namespaces("Role", false), release);
    assert_eq!(namespaces("RoleBinding", false), release);
    let own_role = |suffix: &str| {
        of_kind(&docs, "Role")
            .into_iter()
            .find(|r| r["metadata"]["name"] == json!(format!("{CONTROLLER}-{suffix}")))
            .map(|r| r["rules"].clone())
    };
    assert_eq!(
        own_role("replicas"),
        Some(
            json!([{ "apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "list", "create", "patch", "delete"] }])
        )
    );
    let events_role = own_role("events");
    assert_eq!(
        events_role,
        Some(
            json!([{ "apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create"] }])
        )
    );
    for binding in of_kind(&docs, "RoleBinding") {
        assert_eq!(
            binding["subjects"],
            json!([{ "kind": "ServiceAccount", "name": CONTROLLER, "namespace": RELEASE_NAMESPACE }])
        );
    }
    let args = container_args(only(&docs, "Deployment"));
    assert!(
        args.contains(&"--watch-namespaces=team-a,team-b".to_owned()),
        "{args:?}"
    );
}

// ---- the shipped RBAC suffices, in a sandbox of its own -----------------------------------------

/// A second sandbox run by this test: `twc-sandbox exec --no-controller -- cat`, which lives
/// as long as `cat` reads its standard input, i.e. until this struct is dropped or the test
/// process ends, however it ends.
struct NestedSandbox {
    process: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    log: PathBuf,
    env: SandboxEnv,
}

impl NestedSandbox {
    /// Starts it under the suite's state dir and waits for its `env.json`.
    async fn start(name: &str) -> Self {
        let outer = env();
        let base = outer
            .logs_dir
            .parent()
            .unwrap_or(&outer.logs_dir)
            .to_owned();
        let state_dir = base.join(format!("nested-{name}"));
        let log = base.join(format!("nested-{name}.log"));
        let env_file = state_dir.join(ENV_FILE_NAME);
        let output = match std::fs::File::create(&log) {
            Ok(file) => file,
            Err(e) => panic!("creating {}: {e}", log.display()),
        };
        let stderr = match output.try_clone() {
            Ok(file) => file,
            Err(e) => panic!("{}: {e}", log.display()),
        };
        let process = std::process::Command::new(outer.bin_dir.join("twc-sandbox"))
            .arg("exec")
            .arg("--state-dir")
            .arg(&state_dir)
            .arg("--tools-dir")
            .arg(tools_dir())
            .arg("--repo-dir")
            .arg(REPO)
            .args(["--no-controller", "--", "cat"])
            .stdin(Stdio::piped())
            .stdout(output)
            .stderr(stderr)
            .spawn();
        let mut process = match process {
            Ok(process) => process,
            Err(e) => panic!("starting the nested sandbox: {e}"),
        };
        let tail = log.clone();
        let loaded = wait_for_with_logs(
            "the nested sandbox's env.json",
            Duration::from_secs(300),
            || twc_sandbox::process::tail(&tail, 60),
            || {
                let exited = process.try_wait().ok().flatten();
                let loaded = SandboxEnv::load(&env_file);
                async move {
                    if let Some(status) = exited {
                        return Ok(Err(format!("the nested sandbox exited ({status})")));
                    }
                    loaded.map(Ok).map_err(|e| e.to_string())
                }
            },
        )
        .await;
        let stdin = process.stdin.take();
        match loaded {
            Ok(env) => Self {
                process,
                stdin,
                log,
                env,
            },
            Err(message) => panic!("{message}\n{}", twc_sandbox::process::tail(&log, 60)),
        }
    }

    fn kubectl(&self, args: &[&str]) -> Command {
        let mut command = Command::new(&self.env.kubectl);
        command
            .arg("--kubeconfig")
            .arg(&self.env.kubeconfig)
            .args(args);
        command
    }

    async fn kubectl_ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = run(self.kubectl(args), stdin).await;
        assert!(out.success, "kubectl {}: {}", args.join(" "), out.stderr);
        out.stdout
    }

    async fn apply(&self, manifest: &Value) {
        self.kubectl_ok(
            &["apply", "--server-side", "--force-conflicts", "-f", "-"],
            Some(&manifest.to_string()),
        )
        .await;
    }

    /// Whether `account` may do `verb` on `resource` (`kind.group[/subresource]`) within
    /// `scope` (`kubectl auth can-i --as`).
    async fn can_i(&self, account: &str, verb: &str, resource: &str, scope: &[&str]) -> bool {
        let (resource, subresource) = match resource.split_once('/') {
            Some((resource, sub)) => (resource, Some(format!("--subresource={sub}"))),
            None => (resource, None),
        };
        let mut args = vec!["auth", "can-i", verb, resource, "--as", account];
        args.extend(subresource.as_deref());
        args.extend_from_slice(scope);
        let out: CliOutput = run(self.kubectl(&args), None).await;
        match out.stdout.trim() {
            "yes" => true,
            "no" => false,
            other => panic!("kubectl {}: {other} {}", args.join(" "), out.stderr),
        }
    }

    /// Tails of the nested sandbox's logs and of `extra` (e.g. the restricted controller's).
    fn logs(&self, extra: &Path) -> String {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&self.env.logs_dir)
            .map(|dir| dir.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        files.sort();
        files.push(self.log.clone());
        files.push(extra.to_owned());
        files
            .iter()
            .map(|f| {
                format!(
                    "===== {} =====\n{}\n",
                    f.display(),
                    twc_sandbox::process::tail(f, 60)
                )
            })
            .collect()
    }
}

impl Drop for NestedSandbox {
    fn drop(&mut self) {
        // End of input ends `cat`; the sandbox then stops its servers and pods and exits.
        drop(self.stdin.take());
        let _ = self.process.wait();
    }
}

/// A kubeconfig for the nested API server that authenticates as `namespace/account` with a
/// fresh token, written next to the nested sandbox's log.
async fn service_account_kubeconfig(
    nested: &NestedSandbox,
    namespace: &str,
    account: &str,
) -> PathBuf {
    let token = nested
        .kubectl_ok(
            &[
                "create",
                "token",
                account,
                "-n",
                namespace,
                "--duration",
                "2h",
            ],
            None,
        )
        .await;
    let admin = nested
        .kubectl_ok(&["config", "view", "--raw", "-o", "json"], None)
        .await;
    let mut config: Value = match serde_json::from_str(&admin) {
        Ok(config) => config,
        Err(e) => panic!("admin kubeconfig: {e}"),
    };
    for user in config["users"].as_array_mut().into_iter().flatten() {
        user["user"] = json!({ "token": token.trim() });
    }
    let path = nested.log.with_extension("sa-kubeconfig");
    if let Err(e) = std::fs::write(&path, config.to_string()) {
        panic!("writing {}: {e}", path.display());
    }
    path
}

/// Waits until the TWD is Ready for its current generation, with the nested logs on timeout.
async fn wait_ready_in(
    client: &kube::Client,
    ns: &str,
    name: &str,
    logs: &dyn Fn() -> String,
) -> TemporalWorkerDeployment {
    wait_for_with_logs(&format!("TWD {ns}/{name} Ready"), ROLLOUT, logs, || async {
        let twd = get_twd(client, ns, name).await?;
        let ready =
            condition(&twd, "Ready").is_some_and(|(s, r, _)| s == "True" && r == "RolloutComplete");
        let fresh =
            twd.status.as_ref().and_then(|s| s.observed_generation) == twd.metadata.generation;
        if ready && fresh {
            Ok(twd)
        } else {
            Err(serde_json::to_string(&twd.status).unwrap_or_default())
        }
    })
    .await
}

/// The chart's controller, run here as its ServiceAccount (killed on drop).
struct ChartController {
    /// Its command-line arguments (the chart's, with loopback ports and a local copy of the
    /// webhook's certificate).
    args: Vec<String>,
    /// Its admission webhook, serving the certificate of the chart's Secret.
    webhook: ChartWebhook,
    _process: tokio::process::Child,
}

/// Where the chart's controller serves its admission webhook, and how to trust it.
#[derive(Debug, Clone)]
struct ChartWebhook {
    /// `https://127.0.0.1:<port>`.
    url: String,
    /// The CA of the chart's Secret (PEM).
    ca_pem: String,
    /// The name the API server would call it by (`<service>.<namespace>.svc`).
    server_name: String,
}

impl ChartWebhook {
    /// Sends `review` (an AdmissionReview) as the API server would and returns the answer's
    /// `response`.
    async fn review(&self, review: &Value) -> Value {
        let url = match self.url.parse() {
            Ok(url) => url,
            Err(e) => panic!("{}: {e}", self.url),
        };
        let mut config = kube::Config::new(url);
        config.root_cert = Some(vec![pem_der(&self.ca_pem)]);
        config.tls_server_name = Some(self.server_name.clone());
        let client = match kube::Client::try_from(config) {
            Ok(client) => client,
            Err(e) => panic!("a client of the webhook: {e}"),
        };
        let request = http::Request::post("/validate-temporal-io-v1alpha1-workerresourcetemplate")
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(review.to_string().into_bytes());
        let request = match request {
            Ok(request) => request,
            Err(e) => panic!("{e}"),
        };
        match client.request::<Value>(request).await {
            Ok(answer) => answer["response"].clone(),
            Err(e) => panic!("calling the chart's webhook at {}: {e}", self.url),
        }
    }
}

/// The DER bytes of the first PEM block of `pem`.
fn pem_der(pem: &str) -> Vec<u8> {
    use base64::Engine;
    let body: String = pem
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN"))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END"))
        .collect();
    match base64::engine::general_purpose::STANDARD.decode(body) {
        Ok(der) => der,
        Err(e) => panic!("not PEM: {e}"),
    }
}

/// An AdmissionReview of creating `object` (a WorkerResourceTemplate) in `namespace`, as
/// `user` in `groups`.
fn admission_review(object: &Value, namespace: &str, user: &str, groups: &[&str]) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0d3e8a7c-1f0b-4a7e-9f37-6f1d2b9c5e11",
            "kind": { "group": "temporal.io", "version": "v1alpha1", "kind": "WorkerResourceTemplate" },
            "resource": { "group": "temporal.io", "version": "v1alpha1", "resource": "workerresourcetemplates" },
            "name": object["metadata"]["name"],
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": { "username": user, "groups": groups },
            "object": object,
            "dryRun": false
        }
    })
}

/// Runs the container of the chart's Deployment (as applied in the nested sandbox) here: its
/// arguments, its plain env values, and the ServiceAccount's token instead of the in-cluster
/// one; logs to `<nested log>.<name>.log`, returned with it.
async fn run_chart_controller(
    nested: &NestedSandbox,
    admin: &kube::Client,
    name: &str,
) -> (ChartController, PathBuf) {
    let deployment = match Api::<Deployment>::namespaced(admin.clone(), RELEASE_NAMESPACE)
        .get(CONTROLLER)
        .await
    {
        Ok(d) => d,
        Err(e) => panic!("the chart's Deployment: {e}"),
    };
    let container = deployment
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.containers.into_iter().next());
    let Some(container) = container else {
        panic!("the chart's Deployment has no container");
    };
    let mut args = container.args.unwrap_or_default();
    // The chart's probe and metrics ports (8080, 8081 on every interface) would collide with
    // other controllers on this machine: any free loopback port instead.
    // The webhook: on a free loopback port, with the chart's certificate copied out of its
    // Secret (in a cluster, mounted from it).
    let webhook_port = match twc_sandbox::ports::free_port() {
        Ok(port) => port,
        Err(e) => panic!("a free port: {e}"),
    };
    let cert_dir = nested.log.with_extension(format!("{name}.webhook"));
    let (ca_pem, server_name) = copy_webhook_certificate(admin, &cert_dir).await;
    for (flag, value) in [
        ("--metrics-bind-address", "127.0.0.1:0".to_owned()),
        ("--health-bind-address", "127.0.0.1:0".to_owned()),
        (
            "--webhook-bind-address",
            format!("127.0.0.1:{webhook_port}"),
        ),
        ("--webhook-cert-dir", cert_dir.display().to_string()),
    ] {
        let Some(arg) = args.iter_mut().find(|a| a.starts_with(&format!("{flag}="))) else {
            panic!("the chart passes no {flag}: {args:?}");
        };
        *arg = format!("{flag}={value}");
    }
    let kubeconfig = service_account_kubeconfig(nested, RELEASE_NAMESPACE, CONTROLLER).await;
    let controller_log = nested.log.with_extension(format!("{name}.log"));
    let log_file = match std::fs::File::create(&controller_log) {
        Ok(f) => f,
        Err(e) => panic!("creating {}: {e}", controller_log.display()),
    };
    let log_err = match log_file.try_clone() {
        Ok(f) => f,
        Err(e) => panic!("{e}"),
    };
    let mut controller = Command::new(env().bin_dir.join("twc"));
    controller.args(&args);
    for (key, _) in
        std::env::vars().filter(|(k, _)| k.starts_with("TWC_") || k == "TEMPORAL_ADDRESS")
    {
        controller.env_remove(key);
    }
    for var in container.env.unwrap_or_default() {
        if let Some(value) = var.value {
            controller.env(var.name, value);
        }
    }
    let process = match controller
        .env("KUBECONFIG", &kubeconfig)
        // What the downward API gives the chart's pod.
        .env("POD_NAME", "twc-rbac-test")
        .env("POD_NAMESPACE", RELEASE_NAMESPACE)
        .stdin(Stdio::null())
        .stdout(log_file)
        .stderr(log_err)
        .kill_on_drop(true)
        .spawn()
    {
        Ok(child) => child,
        Err(e) => panic!("starting the chart's controller: {e}"),
    };
    (
        ChartController {
            args,
            webhook: ChartWebhook {
                url: format!("https://127.0.0.1:{webhook_port}"),
                ca_pem,
                server_name,
            },
            _process: process,
        },
        controller_log,
    )
}

/// Writes `tls.crt` and `tls.key` of the chart's webhook Secret into `dir`; returns its CA and
/// the name its certificate is for (the webhook Service's, as the configuration names it).
async fn copy_webhook_certificate(admin: &kube::Client, dir: &Path) -> (String, String) {
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    use k8s_openapi::api::core::v1::Secret;
    let secret = match Api::<Secret>::namespaced(admin.clone(), RELEASE_NAMESPACE)
        .get("twc-webhook-tls")
        .await
    {
        Ok(secret) => secret,
        Err(e) => panic!("the chart's webhook Secret: {e}"),
    };
    let data = secret.data.unwrap_or_default();
    if let Err(e) = std::fs::create_dir_all(dir) {
        panic!("creating {}: {e}", dir.display());
    }
    for key in ["tls.crt", "tls.key"] {
        let Some(value) = data.get(key) else {
            panic!("the chart's webhook Secret has no {key}");
        };
        if let Err(e) = std::fs::write(dir.join(key), &value.0) {
            panic!("writing {key}: {e}");
        }
    }
    let ca = data
        .get("ca.crt")
        .map(|v| String::from_utf8_lossy(&v.0).into_owned())
        .unwrap_or_default();
    let configuration = match Api::<ValidatingWebhookConfiguration>::all(admin.clone())
        .get("twc-twc-system")
        .await
    {
        Ok(configuration) => configuration,
        Err(e) => panic!("the chart's ValidatingWebhookConfiguration: {e}"),
    };
    let webhook = configuration
        .webhooks
        .unwrap_or_default()
        .into_iter()
        .next();
    let Some(webhook) = webhook else {
        panic!("the chart's ValidatingWebhookConfiguration has no webhook");
    };
    let configured_ca = webhook
        .client_config
        .ca_bundle
        .map(|b| String::from_utf8_lossy(&b.0).into_owned());
    assert_eq!(
        configured_ca.as_deref(),
        Some(ca.as_str()),
        "the configuration trusts the Secret's CA"
    );
    let Some(service) = webhook.client_config.service else {
        panic!("the chart's webhook names no Service");
    };
    (ca, format!("{}.{}.svc", service.name, service.namespace))
}

#[tokio::test]
async fn restricted_install_rolls_out_with_only_the_verbs_the_chart_grants() {
    const WATCHED: &str = "workers";
    const OTHER: &str = "elsewhere";
    let nested = NestedSandbox::start("rbac").await;
    let admin = match twc_sandbox::apiserver::client(&nested.env.kubeconfig).await {
        Ok(client) => client,
        Err(e) => panic!("nested kube client: {e}"),
    };
    for ns in [RELEASE_NAMESPACE, WATCHED, OTHER] {
        nested.kubectl_ok(&["create", "namespace", ns], None).await;
    }

    // Install what the chart renders for one watched namespace.
    let suffix = format!("{:x}", std::process::id());
    let task_queue = format!("twc-rbac-{suffix}");
    let rendered = helm(&[
        "template",
        "twc",
        CHART,
        "--namespace",
        RELEASE_NAMESPACE,
        "--set",
        &format!(
            "engine.address={},engine.taskQueue={task_queue},logFormat=text",
            nested.env.temporal_address
        ),
        "--set-json",
        &format!(r#"rbac.watchNamespaces=["{WATCHED}"]"#),
    ])
    .await;
    nested
        .kubectl_ok(&["apply", "--server-side", "-f", "-"], Some(&rendered))
        .await;

    // Run the container of the chart's Deployment here: its arguments, its plain env values,
    // and the ServiceAccount's token instead of the in-cluster one.
    let (controller, controller_log) = run_chart_controller(&nested, &admin, "controller").await;
    let args = controller.args.clone();
    assert!(
        args.contains(&format!("--watch-namespaces={WATCHED}")),
        "{args:?}"
    );
    assert!(
        args.contains(&format!("--task-queue={task_queue}")),
        "{args:?}"
    );
    let logs = || nested.logs(&controller_log);

    // A rollout whose gate reads a ConfigMap, then one whose gate reads a Secret, held by its
    // ramp until promoted by annotation, then scaled, then the TWD deleted.
    nested
        .apply(&json!({
            "apiVersion": "temporal.io/v1alpha1", "kind": "TemporalConnection",
            "metadata": { "name": "dev", "namespace": WATCHED },
            "spec": { "hostPort": nested.env.temporal_address }
        }))
        .await;
    let payload = r#"{"checks":["smoke"],"fail":false}"#;
    nested
        .apply(&json!({ "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": "gate-input", "namespace": WATCHED }, "data": { "input.json": payload } }))
        .await;
    nested
        .apply(&json!({ "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": "gate-input", "namespace": WATCHED }, "stringData": { "input.json": payload } }))
        .await;
    let gate = |source: &str| {
        json!({ "workflowType": "RolloutGate",
            "inputFrom": { source: { "name": "gate-input", "key": "input.json" } } })
    };
    nested
        .apply(&worker(
            WATCHED,
            "hello",
            "v1",
            json!({ "strategy": "AllAtOnce", "gate": gate("configMapKeyRef") }),
        ))
        .await;
    // Ready: the gate input was read (a missing read blocks as PlanGenerationFailed).
    wait_ready_in(&admin, WATCHED, "hello", &logs).await;

    // A TWD that references a ClusterConnection is told why a controller restricted to
    // namespaces cannot use it (condition and Warning event); the connection is never read.
    nested
        .apply(&json!({
            "apiVersion": "temporal.io/v1alpha1", "kind": "ClusterConnection",
            "metadata": { "name": "shared" },
            "spec": { "hostPort": nested.env.temporal_address }
        }))
        .await;
    let mut clustered = worker(
        WATCHED,
        "clustered",
        "v1",
        json!({ "strategy": "AllAtOnce" }),
    );
    clustered["spec"]["workerOptions"]["connectionRef"] =
        json!({ "name": "shared", "kind": "ClusterConnection" });
    nested.apply(&clustered).await;
    wait_for_with_logs("ClusterConnectionUnsupported", ROLLOUT, &logs, || async {
        let twd = get_twd(&admin, WATCHED, "clustered").await?;
        match condition(&twd, "Progressing") {
            Some((status, reason, message))
                if status == "False"
                    && reason == "ClusterConnectionUnsupported"
                    && message.contains("--watch-namespaces") =>
            {
                Ok(())
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let events: Api<Event> = Api::namespaced(admin.clone(), WATCHED);
    // Waits for an event of `WATCHED` that `wanted` accepts.
    let wait_event = |what: &'static str, wanted: fn(&Event) -> bool| {
        let events = events.clone();
        let logs = &logs;
        async move {
            wait_for_with_logs(what, ROLLOUT, logs, || async {
                let recorded = events
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?
                    .items;
                recorded
                    .iter()
                    .any(wanted)
                    .then_some(())
                    .ok_or_else(|| format!("{} events", recorded.len()))
            })
            .await
        }
    };
    wait_event("a ClusterConnectionUnsupported event", |e| {
        e.reason.as_deref() == Some("ClusterConnectionUnsupported")
            && e.type_.as_deref() == Some("Warning")
            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("clustered")
    })
    .await;

    // Replay-checked: v1's closed gate workflows are replayed on v2 by a Job, which the role
    // must allow (create and get Jobs, list their Pods).
    let held = json!({ "strategy": "Progressive", "gate": gate("secretKeyRef"),
        "steps": [ { "rampPercentage": 50, "pauseDuration": "1h" } ],
        "replayCheck": { "args": ["replay"], "timeout": "120s" } });
    nested
        .apply(&worker(WATCHED, "hello", "v2", held.clone()))
        .await;
    wait_for_with_logs("v2 ramping", ROLLOUT, &logs, || async {
        let twd = get_twd(&admin, WATCHED, "hello").await?;
        match condition(&twd, "Ready") {
            Some((_, reason, _)) if reason == "Ramping" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    wait_event(
        "a ReplayCheckPassed event for histories replayed by a Job",
        |e| {
            e.reason.as_deref() == Some("ReplayCheckPassed")
                && e.note.as_deref().is_some_and(|n| n.contains(" replayed ("))
        },
    )
    .await;
    nested
        .kubectl_ok(
            &[
                "annotate",
                "twd",
                "hello",
                "-n",
                WATCHED,
                "temporal.io/rollout-action=promote",
            ],
            None,
        )
        .await;
    let twd = wait_ready_in(&admin, WATCHED, "hello", &logs).await;
    assert!(
        !twd.metadata
            .annotations
            .unwrap_or_default()
            .contains_key("temporal.io/rollout-action"),
        "the watcher removed the control annotation"
    );
    // A replica change scales the active version through the scale subresource. (Sunsetting the
    // first version would too, but this sandbox refreshes drainage at Temporal's pace: minutes.)
    let mut scaled = worker(WATCHED, "hello", "v2", held);
    scaled["spec"]["replicas"] = json!(2);
    nested.apply(&scaled).await;
    wait_for_with_logs("v2 scaled to 2 replicas", ROLLOUT, &logs, || async {
        let versions = deployments(&admin, WATCHED, "hello").await;
        let second = versions
            .iter()
            .find(|(_, build, _)| build.starts_with("v2-"));
        match second {
            Some((_, _, Some(2))) => Ok(()),
            _ => Err(format!("{versions:?}")),
        }
    })
    .await;

    // WorkerResourceTemplates. The chart's webhook, called as the API server would (the nested
    // API server cannot reach a Service), admits an HPA template of the admin and refuses one of
    // a user who may not create HPAs and one of a kind the chart does not allow: its
    // LocalSubjectAccessReviews and discovery work with the chart's grant. Then, with the
    // configuration removed (nothing here would answer the API server), the controller renders
    // the template's copy as the ServiceAccount.
    let template = |kind: &str| {
        let (api_version, spec) = match kind {
            "HorizontalPodAutoscaler" => (
                "autoscaling/v2",
                json!({ "scaleTargetRef": {}, "minReplicas": 1, "maxReplicas": 2 }),
            ),
            _ => (
                "policy/v1",
                json!({ "minAvailable": 1, "selector": { "matchLabels": {} } }),
            ),
        };
        json!({
            "apiVersion": "temporal.io/v1alpha1", "kind": "WorkerResourceTemplate",
            "metadata": { "name": "scaler", "namespace": WATCHED },
            "spec": { "workerDeploymentRef": { "name": "hello" },
                "template": { "apiVersion": api_version, "kind": kind, "spec": spec } }
        })
    };
    let hpa = template("HorizontalPodAutoscaler");
    let admitted = controller
        .webhook
        .review(&admission_review(
            &hpa,
            WATCHED,
            "twc-admin",
            &["system:masters", "system:authenticated"],
        ))
        .await;
    assert_eq!(admitted["allowed"], json!(true), "{admitted}");
    let refused = controller
        .webhook
        .review(&admission_review(
            &hpa,
            WATCHED,
            "alice",
            &["system:authenticated"],
        ))
        .await;
    assert_eq!(refused["allowed"], json!(false), "{refused}");
    let message = refused["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(
            "alice may not create horizontalpodautoscalers.autoscaling in namespace workers"
        ),
        "{refused}"
    );
    let not_allowed = controller
        .webhook
        .review(&admission_review(
            &template("PodDisruptionBudget"),
            WATCHED,
            "twc-admin",
            &["system:masters", "system:authenticated"],
        ))
        .await;
    assert!(
        not_allowed["status"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("spec.template.kind PodDisruptionBudget is not allowed")),
        "{not_allowed}"
    );
    nested
        .kubectl_ok(
            &["delete", "validatingwebhookconfiguration", "twc-twc-system"],
            None,
        )
        .await;
    nested.apply(&hpa).await;
    wait_for_with_logs("the HPA copy of v2, Ready", ROLLOUT, &logs, || async {
        let templates: Api<twc_crds::WorkerResourceTemplate> =
            Api::namespaced(admin.clone(), WATCHED);
        let status = templates
            .get("scaler")
            .await
            .map_err(|e| e.to_string())?
            .status
            .unwrap_or_default();
        let ready = status
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        let hpas: Api<k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler> =
            Api::namespaced(admin.clone(), WATCHED);
        let copies = hpas
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?
            .items;
        let targets: Vec<String> = copies
            .iter()
            .map(|h| h.spec.scale_target_ref.name.clone())
            .collect();
        if ready && targets.iter().any(|t| t.starts_with("hello-v2-")) {
            Ok(())
        } else {
            Err(format!(
                "ready: {ready}; copies target {targets:?}; status: {status:?}"
            ))
        }
    })
    .await;

    // Events went through events.k8s.io as the ServiceAccount.
    let events: Api<Event> = Api::namespaced(admin.clone(), WATCHED);
    let recorded = events
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    assert!(
        recorded
            .iter()
            .any(|e| e.reason.as_deref() == Some("RolloutComplete")
                && e.reporting_controller.as_deref() == Some("twc")
                && e.reporting_instance.as_deref() == Some("twc-rbac-test")),
        "a RolloutComplete event by the restricted controller: {:?}",
        recorded
            .iter()
            .map(|e| (&e.reason, &e.reporting_controller))
            .collect::<Vec<_>>()
    );

    // Deletion: Deployments deleted, finalizers released on the TWD and its connection.
    nested
        .kubectl_ok(
            &["delete", "twd", "hello", "-n", WATCHED, "--wait=false"],
            None,
        )
        .await;
    let twds: Api<TemporalWorkerDeployment> = Api::namespaced(admin.clone(), WATCHED);
    let connections: Api<TemporalConnection> = Api::namespaced(admin.clone(), WATCHED);
    wait_for_with_logs("the TWD is cleaned up and gone", ROLLOUT, &logs, || async {
        let twd = twds.get_opt("hello").await.map_err(|e| e.to_string())?;
        let left = deployments(&admin, WATCHED, "hello").await.len();
        let connection = connections.get("dev").await.map_err(|e| e.to_string())?;
        let held = connection.metadata.finalizers.unwrap_or_default();
        if twd.is_none() && left == 0 && held.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "twd present: {}; deployments: {left}; connection finalizers: {held:?}",
                twd.is_some()
            ))
        }
    })
    .await;

    // Nothing was refused along the way, and the grant is no wider than the code needs.
    let log = std::fs::read_to_string(&controller_log).unwrap_or_default();
    assert!(
        !log.to_lowercase().contains("forbidden"),
        "a request was refused:\n{}",
        logs()
    );
    let account = format!("system:serviceaccount:{RELEASE_NAMESPACE}:{CONTROLLER}");
    let here: &[&str] = &["-n", WATCHED];
    let all: &[&str] = &["--all-namespaces"];
    let other: &[&str] = &["-n", OTHER];
    let release: &[&str] = &["-n", RELEASE_NAMESPACE];
    let granted = [
        ("get temporalworkerdeployments.temporal.io", here),
        ("watch temporalworkerdeployments.temporal.io", here),
        ("patch temporalworkerdeployments.temporal.io", here),
        ("patch temporalworkerdeployments.temporal.io/status", here),
        (
            "update temporalworkerdeployments.temporal.io/finalizers",
            here,
        ),
        ("list temporalconnections.temporal.io", here),
        ("patch temporalconnections.temporal.io/status", here),
        ("get workerdeployments.temporal.io", here),
        ("watch workerdeployments.temporal.io", here),
        ("patch workerdeployments.temporal.io/status", here),
        ("update workerdeployments.temporal.io/finalizers", here),
        ("list connections.temporal.io", here),
        ("patch connections.temporal.io", here),
        ("create deployments.apps", here),
        ("watch deployments.apps", here),
        ("update deployments.apps", here),
        // Owner references on a hand-over between kinds, stamps on a take-over.
        ("patch deployments.apps", here),
        ("delete deployments.apps", here),
        ("patch deployments.apps/scale", here),
        ("get secrets", here),
        ("get configmaps", here),
        ("create events.events.k8s.io", here),
        ("create events.events.k8s.io", release),
        // Each replica's Lease (its share of Temporal's read limits).
        ("patch leases.coordination.k8s.io", release),
        ("list leases.coordination.k8s.io", release),
        ("watch workerresourcetemplates.temporal.io", here),
        ("patch workerresourcetemplates.temporal.io/status", here),
        (
            "create localsubjectaccessreviews.authorization.k8s.io",
            here,
        ),
        ("patch horizontalpodautoscalers.autoscaling", here),
        ("delete horizontalpodautoscalers.autoscaling", here),
    ];
    let refused = [
        ("list secrets", all),
        ("list secrets", here),
        ("watch secrets", here),
        ("get secrets", other),
        ("get secrets", release),
        ("list configmaps", here),
        ("list temporalworkerdeployments.temporal.io", all),
        ("get temporalworkerdeployments.temporal.io", other),
        ("create temporalworkerdeployments.temporal.io", here),
        ("delete temporalworkerdeployments.temporal.io", here),
        ("update temporalworkerdeployments.temporal.io", here),
        ("update temporalworkerdeployments.temporal.io/status", here),
        ("update deployments.apps/scale", here),
        ("create workerdeployments.temporal.io", here),
        ("get workerdeployments.temporal.io", other),
        ("create deployments.apps", other),
        ("create events", here),
        ("patch events.events.k8s.io", here),
        ("create pods", here),
        ("list leases.coordination.k8s.io", here),
        ("get namespaces", all),
        ("get clusterconnections.temporal.io", all),
        ("list clusterconnections.temporal.io", all),
        ("create workerresourcetemplates.temporal.io", here),
        ("patch workerresourcetemplates.temporal.io", here),
        ("create poddisruptionbudgets.policy", here),
        ("create horizontalpodautoscalers.autoscaling", other),
        ("create subjectaccessreviews.authorization.k8s.io", all),
    ];
    let mut wrong = Vec::new();
    for (expected, table) in [(true, &granted[..]), (false, &refused[..])] {
        for &(request, scope) in table {
            let (verb, resource) = request.split_once(' ').unwrap_or((request, ""));
            if nested.can_i(&account, verb, resource, scope).await != expected {
                let answer = if expected { "yes" } else { "no" };
                wrong.push(format!("{request} {}: should be {answer}", scope.join(" ")));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "kubectl auth can-i:\n{}",
        wrong.join("\n")
    );

    // The chart for every namespace (its ClusterRole, the Roles gone): the same TWD now rolls
    // out through the ClusterConnection, which is protected and Ready while used and released
    // when the TWD is deleted; again nothing is refused.
    drop(controller);
    nested
        .kubectl_ok(
            &["delete", "role,rolebinding", CONTROLLER, "-n", WATCHED],
            None,
        )
        .await;
    let rendered = helm(&[
        "template",
        "twc",
        CHART,
        "--namespace",
        RELEASE_NAMESPACE,
        "--set",
        &format!(
            "engine.address={},engine.taskQueue={task_queue},logFormat=text",
            nested.env.temporal_address
        ),
    ])
    .await;
    nested
        .kubectl_ok(
            &["apply", "--server-side", "--force-conflicts", "-f", "-"],
            Some(&rendered),
        )
        .await;
    let (controller, controller_log) =
        run_chart_controller(&nested, &admin, "cluster-controller").await;
    assert!(
        !controller
            .args
            .iter()
            .any(|a| a.starts_with("--watch-namespaces")),
        "{:?}",
        controller.args
    );
    let logs = || nested.logs(&controller_log);
    wait_ready_in(&admin, WATCHED, "clustered", &logs).await;
    let shared: Api<twc_crds::ClusterConnection> = Api::all(admin.clone());
    let finalizers_and_ready = || async {
        let connection = shared.get("shared").await.map_err(|e| e.to_string())?;
        let ready = connection.status.as_ref().and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == "Ready")
                .map(|c| c.reason.clone())
        });
        Ok::<_, String>((connection.metadata.finalizers.unwrap_or_default(), ready))
    };
    wait_for_with_logs(
        "the ClusterConnection protected and Ready",
        ROLLOUT,
        &logs,
        || async {
            match finalizers_and_ready().await? {
                (held, Some(ready)) if !held.is_empty() && ready == "Connected" => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    nested
        .kubectl_ok(
            &["delete", "twd", "clustered", "-n", WATCHED, "--wait=false"],
            None,
        )
        .await;
    wait_for_with_logs(
        "the TWD gone and the ClusterConnection released",
        ROLLOUT,
        &logs,
        || async {
            let twd = twds.get_opt("clustered").await.map_err(|e| e.to_string())?;
            let (held, _) = finalizers_and_ready().await?;
            if twd.is_none() && held.is_empty() {
                Ok(())
            } else {
                Err(format!(
                    "twd present: {}; connection finalizers: {held:?}",
                    twd.is_some()
                ))
            }
        },
    )
    .await;
    let log = std::fs::read_to_string(&controller_log).unwrap_or_default();
    assert!(
        !log.to_lowercase().contains("forbidden"),
        "a request was refused:\n{}",
        logs()
    );
    for request in [
        "watch clusterconnections.temporal.io",
        "patch clusterconnections.temporal.io",
        "patch clusterconnections.temporal.io/status",
        "list temporalworkerdeployments.temporal.io",
    ] {
        let (verb, resource) = request.split_once(' ').unwrap_or((request, ""));
        assert!(
            nested.can_i(&account, verb, resource, all).await,
            "{request} --all-namespaces: should be yes"
        );
    }
}

// ---- CD recipes: kstatus (Flux, Helm 4), Argo CD's health check, kubectl wait ---------------------

/// One line of `twc-kstatus` output.
#[derive(Debug, serde::Deserialize)]
struct Verdict {
    status: String,
    message: String,
}

/// The kstatus verdict on the TWD as it is now, and the TWD as JSON.
async fn kstatus(namespace: &str, name: &str) -> Result<(Verdict, Value), String> {
    let object = kubectl(&["get", "twd", name, "-n", namespace, "-o", "json"], None).await;
    if !object.success {
        return Err(object.stderr);
    }
    let twd: Value = serde_json::from_str(&object.stdout).map_err(|e| e.to_string())?;
    let kstatus = tool("TWC_KSTATUS", "bin/twc-kstatus");
    let out = run(command(&kstatus, &[]), Some(&object.stdout)).await;
    if !out.success {
        return Err(out.stderr);
    }
    let verdict =
        serde_json::from_str(out.stdout.trim()).map_err(|e| format!("{e}: {}", out.stdout))?;
    Ok((verdict, twd))
}

/// The Lua health check of the README's Argo CD recipe, as written there.
fn argo_health_script() -> String {
    const KEY: &str = "resource.customizations.health.temporal.io_TemporalWorkerDeployment";
    let readme = std::fs::read_to_string(Path::new(REPO).join("README.md")).unwrap_or_default();
    let block = readme
        .split("```yaml\n")
        .skip(1)
        .filter_map(|rest| rest.split("```").next())
        .find(|block| block.contains(KEY));
    let Some(block) = block else {
        panic!("README.md has no yaml block with {KEY}");
    };
    let config: Value = match serde_saphyr::from_str(block) {
        Ok(config) => config,
        Err(e) => panic!("the README's argocd-cm snippet: {e}"),
    };
    match config["data"][KEY].as_str() {
        Some(script) => script.to_owned(),
        None => panic!("no {KEY} in the README's argocd-cm snippet"),
    }
}

/// Runs the health check on `object` the way Argo CD does (Lua 5.1, the object as the global
/// `obj`, absent fields nil); returns (status, message).
fn argo_health(object: &Value) -> (String, String) {
    use mlua::LuaSerdeExt;
    let lua = mlua::Lua::new();
    let options = mlua::SerializeOptions::new()
        .serialize_none_to_null(false)
        .serialize_unit_to_null(false);
    let result = lua
        .to_value_with(object, options)
        .and_then(|obj| lua.globals().set("obj", obj))
        .and_then(|()| lua.load(argo_health_script()).eval::<mlua::Table>())
        .and_then(|health| Ok((health.get("status")?, health.get("message")?)));
    match result {
        Ok(health) => health,
        Err(e) => panic!("the Argo CD health check failed on {object}: {e}"),
    }
}

#[test]
fn argo_health_check_maps_conditions_to_health() {
    let twd = |generation: i64, observed: i64, ready: (&str, &str), progressing: (&str, &str)| {
        json!({
            "metadata": { "name": "hello", "generation": generation },
            "status": { "observedGeneration": observed, "conditions": [
                { "type": "Ready", "status": ready.0, "reason": ready.1, "message": "ready says" },
                { "type": "Progressing", "status": progressing.0, "reason": progressing.1, "message": "progressing says" },
            ] }
        })
    };
    let cases = [
        (json!({ "metadata": { "generation": 1 } }), "Progressing"),
        (
            twd(
                2,
                1,
                ("True", "RolloutComplete"),
                ("False", "RolloutComplete"),
            ),
            "Progressing",
        ),
        (
            twd(
                2,
                2,
                ("True", "RolloutComplete"),
                ("False", "RolloutComplete"),
            ),
            "Healthy",
        ),
        (
            twd(2, 2, ("False", "Ramping"), ("True", "Ramping")),
            "Progressing",
        ),
        (
            twd(
                2,
                2,
                ("False", "WaitingForPollers"),
                ("True", "WaitingForPollers"),
            ),
            "Progressing",
        ),
        (
            twd(
                2,
                2,
                ("False", "WaitingForPromotion"),
                ("True", "WaitingForPromotion"),
            ),
            "Suspended",
        ),
        (
            twd(2, 2, ("False", "Paused"), ("False", "Paused")),
            "Suspended",
        ),
        (
            twd(2, 2, ("False", "GateFailed"), ("False", "GateFailed")),
            "Degraded",
        ),
        (
            twd(2, 2, ("False", "Aborted"), ("False", "Aborted")),
            "Degraded",
        ),
    ];
    for (object, expected) in cases {
        let (status, message) = argo_health(&object);
        assert_eq!(status, expected, "{object}: {message}");
    }
}

#[tokio::test]
async fn cd_health_checks_see_a_held_rollout_in_progress_then_current() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "cdhealth").await;
    apply(&connection(&ns)).await;
    apply(&worker(
        &ns,
        "hello",
        "v1",
        json!({ "strategy": "AllAtOnce" }),
    ))
    .await;
    wait_ready(&client, &ns, "hello", ROLLOUT).await;
    let (verdict, twd) = kstatus(&ns, "hello")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(verdict.status, "Current", "{verdict:?}");
    assert_eq!(argo_health(&twd).0, "Healthy");

    // v2 ramps to 50% and holds there for an hour, until promoted.
    let held = json!({ "strategy": "Progressive", "steps": [ { "rampPercentage": 50, "pauseDuration": "1h" } ] });
    apply(&worker(&ns, "hello", "v2", held)).await;
    let generation = get_twd(&client, &ns, "hello")
        .await
        .ok()
        .and_then(|t| t.metadata.generation)
        .unwrap_or_default();
    let seen = kubectl(
        &[
            "wait",
            "twd/hello",
            "-n",
            &ns,
            &format!("--for=jsonpath={{.status.observedGeneration}}={generation}"),
            "--timeout=60s",
        ],
        None,
    )
    .await;
    assert!(
        seen.success,
        "kubectl wait for observedGeneration: {seen:?}"
    );
    let (in_progress, twd) = wait_for("kstatus InProgress while v2 ramps", ROLLOUT, || async {
        let (verdict, twd) = kstatus(&ns, "hello").await?;
        let ramping = twd["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["reason"] == "Ramping");
        if ramping && verdict.status == "InProgress" {
            Ok((verdict, twd))
        } else {
            Err(format!("{verdict:?}; status: {}", twd["status"]))
        }
    })
    .await;
    assert!(!in_progress.message.is_empty(), "{in_progress:?}");
    assert_eq!(argo_health(&twd).0, "Progressing");

    let wait_ready_cli = |timeout: &'static str| {
        let ns = ns.clone();
        async move {
            let args = [
                "wait",
                "--for=condition=Ready",
                "twd/hello",
                "-n",
                &ns,
                timeout,
            ];
            kubectl(&args, None).await
        }
    };
    let held_back = wait_ready_cli("--timeout=1s").await;
    assert!(
        !held_back.success,
        "kubectl wait returned while the rollout is held: {held_back:?}"
    );
    let (finished, ()) = tokio::join!(
        wait_ready_cli("--timeout=150s"),
        send(Via::Annotation, "promote", &ns, "hello")
    );
    assert!(
        finished.success,
        "kubectl wait after promotion: {finished:?}"
    );
    let (verdict, twd) = kstatus(&ns, "hello")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(verdict.status, "Current", "{verdict:?}");
    assert_eq!(argo_health(&twd).0, "Healthy");
}
