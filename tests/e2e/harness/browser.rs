//! A real browser for the dashboard's tests: Debian's headless Chromium driven through its
//! chromedriver with the `fantoccini` WebDriver client, and `twc dashboard` itself run as a
//! person runs it (the sandbox's kubeconfig, a free port). Both processes die with their
//! handles.

use std::process::Stdio;
use std::time::Duration;

use fantoccini::wd::{Capabilities, WebDriverCompatibleCommand};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use twc_sandbox::env::SandboxEnv;

use super::env;
use super::wait::wait_for;

/// Chromium's flags: headless, and nothing that reaches out of this machine (without the
/// background-networking ones, a closed network makes it misbehave).
const CHROMIUM_FLAGS: [&str; 9] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
];

/// How long a page may take to show what a test waits for.
pub const PAGE: Duration = Duration::from_secs(30);

/// A headless Chromium session.
pub struct Browser {
    pub client: Client,
    _driver: Child,
    _profile: TempDir,
}

impl Browser {
    /// Starts chromedriver on a free port and a Chromium session with a fresh profile.
    pub async fn start() -> Self {
        let port = free_port();
        let driver = Command::new(chromedriver())
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("starting chromedriver (make chromium installs it): {e}"));
        let profile = TempDir::new("chromium-profile");
        let mut args: Vec<String> = CHROMIUM_FLAGS.iter().map(|f| (*f).to_owned()).collect();
        args.push(format!("--user-data-dir={}", profile.0.display()));
        let mut capabilities = Capabilities::new();
        capabilities.insert(
            "goog:chromeOptions".to_owned(),
            json!({ "binary": chromium(), "args": args }),
        );
        capabilities.insert("goog:loggingPrefs".to_owned(), json!({ "browser": "ALL" }));
        let url = format!("http://127.0.0.1:{port}");
        let client = wait_for("chromedriver to start a session", PAGE, || async {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            ClientBuilder::new(connector)
                .capabilities(capabilities.clone())
                .connect(&url)
                .await
                .map_err(|e| e.to_string())
        })
        .await;
        Self {
            client,
            _driver: driver,
            _profile: profile,
        }
    }

    /// Opens `url` and waits for `css` to be on it.
    pub async fn open(&self, url: &str, css: &str) {
        if let Err(e) = self.client.goto(url).await {
            panic!("opening {url}: {e}");
        }
        self.wait_text(css, "").await;
    }

    /// Waits until an element matching `css` contains `text`; returns its whole text.
    pub async fn wait_text(&self, css: &str, text: &str) -> String {
        wait_for(&format!("{css} to show {text:?}"), PAGE, || async {
            let element = self
                .client
                .find(Locator::Css(css))
                .await
                .map_err(|e| format!("{css}: {e}"))?;
            let shown = element.text().await.map_err(|e| e.to_string())?;
            if shown.contains(text) {
                Ok(shown)
            } else {
                Err(format!("{css} shows {shown:?}"))
            }
        })
        .await
    }

    /// Clicks the element matching `css`.
    pub async fn click(&self, css: &str) {
        let element = self
            .client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css}: {e}"));
        if let Err(e) = element.click().await {
            panic!("clicking {css}: {e}");
        }
    }

    /// Runs `script` in the page and returns its value.
    pub async fn eval(&self, script: &str) -> Value {
        self.client
            .execute(script, Vec::new())
            .await
            .unwrap_or_else(|e| panic!("running {script:?}: {e}"))
    }

    /// Writes a screenshot of the page to `path`.
    pub async fn screenshot(&self, path: &std::path::Path) {
        let png = self
            .client
            .screenshot()
            .await
            .unwrap_or_else(|e| panic!("screenshot: {e}"));
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        std::fs::write(path, png).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }

    /// The page's console messages of level SEVERE since the last call (chromedriver's log).
    pub async fn console_errors(&self) -> Vec<String> {
        let entries = self
            .client
            .issue_cmd(BrowserLog)
            .await
            .unwrap_or_else(|e| panic!("reading the browser log: {e}"));
        entries
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["level"] == "SEVERE")
            .map(|e| e["message"].as_str().unwrap_or_default().to_owned())
            .collect()
    }
}

/// chromedriver's log endpoint (`POST /session/{id}/se/log`, type `browser`).
#[derive(Debug)]
struct BrowserLog;

impl WebDriverCompatibleCommand for BrowserLog {
    fn endpoint(
        &self,
        base_url: &url::Url,
        session_id: Option<&str>,
    ) -> Result<url::Url, url::ParseError> {
        base_url.join(&format!(
            "session/{}/se/log",
            session_id.unwrap_or_default()
        ))
    }

    fn method_and_body(&self, _request_url: &url::Url) -> (http::Method, Option<String>) {
        (
            http::Method::POST,
            Some(json!({ "type": "browser" }).to_string()),
        )
    }
}

/// `twc dashboard` on a free port, run with the sandbox's kubeconfig and engine.
pub struct DashboardProcess {
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    _child: Child,
}

impl DashboardProcess {
    /// Starts it for `namespaces` (every namespace when empty) and waits for its address.
    pub async fn start(namespaces: &[&str]) -> Self {
        Self::start_in(env(), namespaces).await
    }

    /// [`Self::start`] against the servers of `env` (a private sandbox's).
    pub async fn start_in(env: &SandboxEnv, namespaces: &[&str]) -> Self {
        let mut command = Command::new(env.bin_dir.join("twc"));
        command
            .args(["dashboard", "--port", "0"])
            .env("KUBECONFIG", &env.kubeconfig)
            .env("TWC_ENGINE_ADDRESS", &env.temporal_address)
            .env("TWC_ENGINE_NAMESPACE", &env.temporal_namespace)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if let Some(ui) = &env.temporal_ui_url {
            command.env("TWC_UI_URL", ui);
        }
        if !namespaces.is_empty() {
            command.args(["--namespace", &namespaces.join(",")]);
        }
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("starting twc dashboard: {e}"));
        let Some(stdout) = child.stdout.take() else {
            panic!("twc dashboard has no stdout");
        };
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(PAGE, lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("twc dashboard printed no address within {PAGE:?}"))
            .unwrap_or_else(|e| panic!("reading twc dashboard's output: {e}"))
            .unwrap_or_else(|| panic!("twc dashboard exited before printing its address"));
        let url = first
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .map(|u| u.trim_end_matches('/').to_owned())
            .unwrap_or_else(|| panic!("no address in {first:?}"));
        Self { url, _child: child }
    }

    /// The page of the worker deployment `namespace/name`.
    pub fn page(&self, namespace: &str, name: &str) -> String {
        format!("{}/w/{namespace}/{name}", self.url)
    }
}

fn chromium() -> String {
    std::env::var("TWC_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".to_owned())
}

fn chromedriver() -> String {
    std::env::var("TWC_CHROMEDRIVER").unwrap_or_else(|_| "/usr/bin/chromedriver".to_owned())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("finding a free port: {e}"))
}

/// A folder removed when dropped.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(prefix: &str) -> Self {
        static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("twc-{prefix}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
