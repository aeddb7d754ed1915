//! The browser and `twc dashboard` of [`twc_sandbox::browser`] for the dashboard's tests:
//! every call that fails fails the test, and waits are on what the page shows.

use std::time::Duration;

use fantoccini::Client;
use serde_json::Value;
use twc_sandbox::browser;
use twc_sandbox::env::SandboxEnv;

use super::env;
use super::wait::wait_for;

/// How long a page may take to show what a test waits for.
pub const PAGE: Duration = Duration::from_secs(30);

/// A headless Chromium session ([`twc_sandbox::browser::Browser`]) whose calls fail the test.
pub struct Browser {
    pub client: Client,
    inner: browser::Browser,
}

impl Browser {
    /// Starts chromedriver on a free port and a Chromium session with a fresh profile.
    pub async fn start() -> Self {
        let inner = browser::Browser::start()
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
        Self {
            client: inner.client.clone(),
            inner,
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
            let shown = self.inner.text(css).await.map_err(|e| format!("{e:#}"))?;
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
            .find(fantoccini::Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css}: {e}"));
        if let Err(e) = element.click().await {
            panic!("clicking {css}: {e}");
        }
    }

    /// Runs `script` in the page and returns its value.
    pub async fn eval(&self, script: &str) -> Value {
        self.inner
            .eval(script)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"))
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
        self.inner
            .console_errors()
            .await
            .unwrap_or_else(|e| panic!("{e:#}"))
    }
}

/// `twc dashboard` ([`twc_sandbox::browser::DashboardProcess`]) of the build under test.
pub struct DashboardProcess(browser::DashboardProcess);

impl std::ops::Deref for DashboardProcess {
    type Target = browser::DashboardProcess;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl DashboardProcess {
    /// Starts it for `namespaces` (every namespace when empty) and waits for its address.
    pub async fn start(namespaces: &[&str]) -> Self {
        Self::start_in(env(), namespaces).await
    }

    /// [`Self::start`] against the servers of `env` (a private sandbox's).
    pub async fn start_in(env: &SandboxEnv, namespaces: &[&str]) -> Self {
        let twc = env.bin_dir.join("twc");
        match browser::DashboardProcess::start(&twc, env, namespaces).await {
            Ok(dashboard) => Self(dashboard),
            Err(e) => panic!("{e:#}"),
        }
    }
}
