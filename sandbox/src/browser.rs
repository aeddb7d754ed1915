//! A real browser and `twc dashboard` for the dashboard's tests and benchmark: Debian's
//! headless Chromium driven through its chromedriver with the `fantoccini` WebDriver client, and
//! the dashboard run as a person runs it (a kubeconfig, the engine's Temporal, a free port).
//! Both processes die with their handles. `make chromium` installs the browser.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use fantoccini::wd::{Capabilities, WebDriverCompatibleCommand};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::env::SandboxEnv;
use crate::ports::free_port;
use crate::wait::wait_until;

/// Chromium's flags: headless, no GPU, nothing fetched from the network on its own.
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

/// How long chromedriver and the dashboard may take to start.
pub const START: Duration = Duration::from_secs(30);

/// A headless Chromium session.
pub struct Browser {
    /// The WebDriver session.
    pub client: Client,
    _driver: Child,
    _profile: TempDir,
}

impl Browser {
    /// Starts chromedriver on a free port and a Chromium session with a fresh profile.
    pub async fn start() -> anyhow::Result<Self> {
        let port = free_port().context("finding a free port for chromedriver")?;
        // A process group of its own: Chromium runs as chromedriver's child and would outlive
        // a killed chromedriver; dropping the browser kills the whole group.
        let driver = Command::new(chromedriver())
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {} (make chromium installs it)", chromedriver()))?;
        let profile = TempDir::new("chromium-profile")?;
        let mut args: Vec<String> = CHROMIUM_FLAGS.iter().map(|f| (*f).to_owned()).collect();
        args.push(format!("--user-data-dir={}", profile.0.display()));
        let mut capabilities = Capabilities::new();
        capabilities.insert(
            "goog:chromeOptions".to_owned(),
            json!({ "binary": chromium(), "args": args }),
        );
        capabilities.insert("goog:loggingPrefs".to_owned(), json!({ "browser": "ALL" }));
        let url = format!("http://127.0.0.1:{port}");
        let last = std::sync::Mutex::new(String::new());
        let client = wait_until("chromedriver to start a session", START, || async {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector)
                .capabilities(capabilities.clone())
                .connect(&url)
                .await
            {
                Ok(client) => Some(client),
                Err(e) => {
                    if let Ok(mut last) = last.lock() {
                        *last = e.to_string();
                    }
                    None
                }
            }
        })
        .await
        .map_err(|e| {
            let last = last.lock().map(|l| l.clone()).unwrap_or_default();
            anyhow!("{e}: {last}")
        })?;
        Ok(Self {
            client,
            _driver: driver,
            _profile: profile,
        })
    }

    /// The text of the element matching `css`, if there is one.
    pub async fn text(&self, css: &str) -> anyhow::Result<String> {
        let element = self
            .client
            .find(Locator::Css(css))
            .await
            .with_context(|| format!("finding {css}"))?;
        element
            .text()
            .await
            .with_context(|| format!("reading the text of {css}"))
    }

    /// Runs `script` in the page and returns its value.
    pub async fn eval(&self, script: &str) -> anyhow::Result<Value> {
        self.client
            .execute(script, Vec::new())
            .await
            .with_context(|| format!("running {script:?}"))
    }

    /// The page's console messages of level SEVERE since the last call (chromedriver's log).
    pub async fn console_errors(&self) -> anyhow::Result<Vec<String>> {
        let entries = self
            .client
            .issue_cmd(SessionPost::browser_log())
            .await
            .context("reading the browser log")?;
        Ok(entries
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["level"] == "SEVERE")
            .map(|e| e["message"].as_str().unwrap_or_default().to_owned())
            .collect())
    }

    /// Sends a Chrome DevTools Protocol command through chromedriver (for example
    /// `Page.addScriptToEvaluateOnNewDocument`, which runs a script in every page before the
    /// page's own).
    pub async fn devtools(&self, cmd: &str, params: Value) -> anyhow::Result<Value> {
        self.client
            .issue_cmd(SessionPost::devtools(cmd, params))
            .await
            .with_context(|| format!("DevTools {cmd}"))
    }
}

impl Drop for Browser {
    /// Kills chromedriver's process group: chromedriver, Chromium and its helpers.
    fn drop(&mut self) {
        if let Some(pid) = self
            ._driver
            .id()
            .and_then(|p| libc::pid_t::try_from(p).ok())
        {
            // SAFETY: a plain syscall on the process group this handle started (its leader is
            // not reaped while `_driver` lives, so the group ID is not reused).
            unsafe {
                libc::kill(-pid, libc::SIGKILL);
            }
        }
    }
}

/// A chromedriver command of its own (not in the WebDriver standard): `POST
/// /session/{id}/<path>` with a JSON body.
#[derive(Debug)]
struct SessionPost {
    path: &'static str,
    body: Value,
}

impl SessionPost {
    /// The page's console log (`se/log`, type `browser`).
    fn browser_log() -> Self {
        Self {
            path: "se/log",
            body: json!({ "type": "browser" }),
        }
    }

    /// A Chrome DevTools Protocol command (`goog/cdp/execute`).
    fn devtools(cmd: &str, params: Value) -> Self {
        Self {
            path: "goog/cdp/execute",
            body: json!({ "cmd": cmd, "params": params }),
        }
    }
}

impl WebDriverCompatibleCommand for SessionPost {
    fn endpoint(
        &self,
        base_url: &url::Url,
        session_id: Option<&str>,
    ) -> Result<url::Url, url::ParseError> {
        base_url.join(&format!(
            "session/{}/{}",
            session_id.unwrap_or_default(),
            self.path
        ))
    }

    fn method_and_body(&self, _request_url: &url::Url) -> (http::Method, Option<String>) {
        (http::Method::POST, Some(self.body.to_string()))
    }
}

/// `twc dashboard` on a free port.
pub struct DashboardProcess {
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    _child: Child,
}

impl DashboardProcess {
    /// Starts `twc` (the binary at `twc`) as `twc dashboard` with `env`'s kubeconfig and
    /// engine, for `namespaces` (every namespace when empty), and waits for its address.
    pub async fn start(twc: &Path, env: &SandboxEnv, namespaces: &[&str]) -> anyhow::Result<Self> {
        let mut command = Command::new(twc);
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
            .with_context(|| format!("starting {} dashboard", twc.display()))?;
        let stdout = child.stdout.take().context("twc dashboard has no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(START, lines.next_line())
            .await
            .map_err(|_| anyhow!("twc dashboard printed no address within {START:?}"))?
            .context("reading twc dashboard's output")?
            .context("twc dashboard exited before printing its address")?;
        let Some(url) = first
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .map(|u| u.trim_end_matches('/').to_owned())
        else {
            bail!("no address in {first:?}");
        };
        Ok(Self { url, _child: child })
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

/// A folder removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(prefix: &str) -> anyhow::Result<Self> {
        static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("twc-{prefix}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
