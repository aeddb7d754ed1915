//! `dashboard`: `kubectl twc dashboard` in headless Chromium over the sandbox's whole fleet,
//! grown to at least `BENCH_DASHBOARD_TWDS` (200) worker deployments.
//!
//! - **First paint**: the overview is loaded `BENCH_DASHBOARD_LOADS` (5) times, the first right
//!   after the dashboard started (its lists of the cluster still cold). Each load gives the
//!   browser's `first-contentful-paint` and the moment every worker deployment has its row:
//!   a script the browser runs in the page before the page's own (DevTools
//!   `Page.addScriptToEvaluateOnNewDocument`) watches the rows with a MutationObserver and
//!   stamps the next animation frame once they are all there (milliseconds from the
//!   navigation's start, the page's `performance.now()`).
//! - **Update latency**: one of the fleet's worker deployments is given a new image
//!   `BENCH_DASHBOARD_UPDATES` (10) times, one rollout after the other, with the overview open.
//!   For each, the benchmark's own watch of the TWD sees its status name the new target build,
//!   and the open page (a MutationObserver, no polling) shows it in the row's Target cell; the
//!   figure is the page's moment minus the watch's (both wall clocks of this machine).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, anyhow, bail};
use futures::StreamExt;
use kube::api::{Api, ListParams};
use kube::runtime::watcher;
use serde::Serialize;
use serde_json::{Value, json};
use twc_crds::TemporalWorkerDeployment;
use twc_sandbox::browser::{Browser, DashboardProcess};

use crate::cluster::{Cluster, worker};
use crate::fleet::grow;
use crate::stats::Summary;

/// How long one load or one update may take to show.
const SHOW: Duration = Duration::from_secs(60);
/// How long a rollout of the updated worker deployment may take.
const ROLLOUT: Duration = Duration::from_secs(180);

/// The dashboard's results.
#[derive(Debug, Clone, Serialize)]
pub struct Dashboard {
    /// Worker deployments in the sandbox when the overview was loaded (rows waited for).
    pub worker_deployments: usize,
    /// Worker deployments this scenario added to reach its size.
    pub added: usize,
    /// Each load of the overview, the first one cold.
    pub loads: Vec<Load>,
    /// The first load: `first-contentful-paint`, ms.
    pub cold_first_paint_ms: Option<f64>,
    /// The first load: navigation start → every row shown, ms.
    pub cold_all_rows_ms: Option<f64>,
    /// The later loads: `first-contentful-paint`, ms.
    pub first_paint_ms: Option<Summary>,
    /// The later loads: navigation start → every row shown, ms.
    pub all_rows_ms: Option<Summary>,
    /// Each update: status seen by the benchmark's watch → the open page shows it, ms.
    pub update_latency_ms: Option<Summary>,
    /// The updates' samples, in order, ms.
    pub updates: Vec<f64>,
}

/// One load of the overview.
#[derive(Debug, Clone, Serialize)]
pub struct Load {
    /// `first-contentful-paint`, ms after the navigation started.
    pub first_paint_ms: Option<f64>,
    /// The animation frame after the last row appeared, ms after the navigation started.
    pub all_rows_ms: f64,
}

/// Stamps `window.__twcRowsShown` at the animation frame after the overview holds `ROWS`
/// rows. Runs before the page's own script, on every page the browser opens.
const STAMP_ROWS: &str = r#"
(() => {
  const want = ROWS;
  window.__twcRowsShown = null;
  const seen = () => document.querySelectorAll('#rows tr').length >= want;
  const observer = new MutationObserver(() => {
    if (window.__twcRowsShown === null && seen()) {
      observer.disconnect();
      requestAnimationFrame(() => { window.__twcRowsShown = performance.now(); });
    }
  });
  observer.observe(document, { subtree: true, childList: true });
})();
"#;

/// Resolves with the page's clock (Unix ms) when the row of `arguments[0]` shows a build
/// starting with `arguments[1]` as its target, or already as its current build: the overview
/// hides the target once it is Current, and a page that re-reads the rows (after a reconnection
/// or a `reload`) while an AllAtOnce rollout promotes fast sees only that. Waiting for the target
/// cell alone, the 2026-11-28 run's script timed out at update 8.
const WAIT_FOR_TARGET: &str = r#"
const key = arguments[0], prefix = arguments[1], done = arguments[arguments.length - 1];
const shows = () => {
  const row = 'tr[data-key="' + CSS.escape(key) + '"] ';
  return [row + 'td.target', row + 'td.current'].some((cell) => {
    const found = document.querySelector(cell);
    return !!found && found.textContent.startsWith(prefix);
  });
};
if (shows()) { done(Date.now()); return; }
const observer = new MutationObserver(() => { if (shows()) { observer.disconnect(); done(Date.now()); } });
observer.observe(document.getElementById('app'), { subtree: true, childList: true, characterData: true });
"#;

/// Runs the scenario in `namespace` (the TWDs it adds, and the one it updates).
pub async fn run(
    cluster: &Cluster,
    namespace: &str,
    fleet_size: usize,
    loads: usize,
    updates: usize,
) -> anyhow::Result<Dashboard> {
    let existing = count_twds(cluster).await?;
    // The updated worker deployment is one of the added ones: at least one is added.
    let added = fleet_size.saturating_sub(existing).max(1);
    tracing::info!(existing, added, "dashboard: growing the fleet");
    grow(cluster, namespace, "d", "dash", added).await?;
    let worker_deployments = count_twds(cluster).await?;

    let twc = cluster.env.bin_dir.join("twc");
    let dashboard = DashboardProcess::start(&twc, &cluster.env, &[]).await?;
    let browser = Browser::start().await?;
    let script = STAMP_ROWS.replace("ROWS", &worker_deployments.to_string());
    browser
        .devtools(
            "Page.addScriptToEvaluateOnNewDocument",
            json!({ "source": script }),
        )
        .await?;
    let overview = format!("{}/", dashboard.url);
    let mut measured = Vec::new();
    for i in 0..loads.max(1) {
        let load = load(&browser, &overview).await?;
        tracing::info!(
            load = i,
            first_paint_ms = ?load.first_paint_ms,
            all_rows_ms = load.all_rows_ms,
            "dashboard: overview loaded"
        );
        measured.push(load);
    }

    // The page stays open on the overview while one worker deployment rolls out again and again.
    let name = "d000";
    let key = format!("{namespace}/{name}");
    let mut samples = Vec::new();
    for round in 1..=updates {
        let tag = format!("dash{round}");
        let prefix = format!("{tag}-");
        let page = browser
            .client
            .execute_async(WAIT_FOR_TARGET, vec![json!(key), json!(prefix)]);
        let manifest = worker(
            namespace,
            namespace,
            name,
            &tag,
            json!({ "strategy": "AllAtOnce" }),
        );
        let status = applied_then_shown(cluster, namespace, name, &prefix, &manifest);
        let (page, status) = tokio::time::timeout(SHOW, async { tokio::join!(page, status) })
            .await
            .map_err(|_| anyhow!("update {round}: not shown within {SHOW:?}"))?;
        let status_ms = status?;
        let page_ms = page
            .with_context(|| format!("update {round}: waiting in the page"))?
            .as_f64()
            .context("the page's clock")?;
        let latency = page_ms - status_ms;
        tracing::info!(round, latency_ms = latency, "dashboard: update shown");
        samples.push(latency);
        let expected = [(name.to_owned(), prefix)].into_iter().collect();
        cluster
            .wait_all_ready(namespace, &expected, ROLLOUT)
            .await?;
    }
    let errors = browser.console_errors().await?;
    if !errors.is_empty() {
        bail!("the dashboard logged console errors: {errors:#?}");
    }

    let later: Vec<&Load> = measured.iter().skip(1).collect();
    let first_paints: Vec<f64> = later.iter().filter_map(|l| l.first_paint_ms).collect();
    let all_rows: Vec<f64> = later.iter().map(|l| l.all_rows_ms).collect();
    Ok(Dashboard {
        worker_deployments,
        added,
        cold_first_paint_ms: measured.first().and_then(|l| l.first_paint_ms),
        cold_all_rows_ms: measured.first().map(|l| l.all_rows_ms),
        first_paint_ms: Summary::of(&first_paints),
        all_rows_ms: Summary::of(&all_rows),
        update_latency_ms: Summary::of(&samples),
        updates: samples,
        loads: measured,
    })
}

/// TWDs in every namespace.
async fn count_twds(cluster: &Cluster) -> anyhow::Result<usize> {
    let api: Api<TemporalWorkerDeployment> = Api::all(cluster.kube.clone());
    Ok(api.list_metadata(&ListParams::default()).await?.items.len())
}

/// Opens `url` and reads the page's paint and rows stamps.
async fn load(browser: &Browser, url: &str) -> anyhow::Result<Load> {
    browser
        .client
        .goto(url)
        .await
        .with_context(|| format!("opening {url}"))?;
    let deadline = tokio::time::Instant::now() + SHOW;
    let mut interval = Duration::from_millis(50);
    loop {
        let stamps = browser
            .eval(
                "const paint = performance.getEntriesByName('first-contentful-paint')[0];
                 return { paint: paint ? paint.startTime : null, rows: window.__twcRowsShown };",
            )
            .await?;
        if let Some(rows) = stamps["rows"].as_f64() {
            return Ok(Load {
                first_paint_ms: stamps["paint"].as_f64(),
                all_rows_ms: rows,
            });
        }
        if tokio::time::Instant::now() >= deadline {
            let shown = browser
                .eval("return document.querySelectorAll('#rows tr').length;")
                .await
                .unwrap_or(Value::Null);
            bail!("the overview showed {shown} rows after {SHOW:?}");
        }
        tokio::time::sleep(interval).await;
        interval = (interval * 3 / 2).min(Duration::from_millis(500));
    }
}

/// Applies `manifest` once a watch of the TWD has its initial list, and returns when (Unix ms,
/// this machine's clock) that watch first sees the status name a target build starting with
/// `prefix`.
async fn applied_then_shown(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
    prefix: &str,
    manifest: &Value,
) -> anyhow::Result<f64> {
    let api: Api<TemporalWorkerDeployment> = Api::namespaced(cluster.kube.clone(), namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = std::pin::pin!(watcher(api, config));
    let shows = |twd: &TemporalWorkerDeployment| {
        twd.status
            .as_ref()
            .and_then(|s| s.target_version.as_ref())
            .is_some_and(|t| t.version.build_id.starts_with(prefix))
    };
    let mut applied = false;
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::InitDone) if !applied => {
                cluster.apply(manifest).await?;
                applied = true;
            }
            Ok(watcher::Event::Apply(twd) | watcher::Event::InitApply(twd))
                if applied && shows(&twd) =>
            {
                return Ok(unix_ms(SystemTime::now()));
            }
            Ok(watcher::Event::InitApply(twd)) if shows(&twd) => {
                bail!("{namespace}/{name} already targets {prefix}* before its apply")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("watching {namespace}/{name}: {e}"),
        }
    }
    bail!("the watch of {namespace}/{name} ended")
}

fn unix_ms(at: SystemTime) -> f64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}
