//! `kubectl twc dashboard` in a real browser (headless Chromium through chromedriver) against
//! the sandbox's real servers: the overview lists the worker deployments, a ramp change shows
//! on an open page within a second without reloading, the buttons go through the CLI's
//! validated control path (Promote accepted and Current in Temporal, Pause of a complete
//! rollout rejected), an aborted canary's chart shows the failing measurement above its limit,
//! and no page logs a console error; an open page keeps working while the controller and
//! Temporal restart under it. The tests take screenshots (`dashboard-*.png`; with
//! `TWC_DASHBOARD_SCREENSHOTS=docs` they refresh the README's).

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::runtime::watcher;
use serde_json::{Value, json};
use twc_crds::WorkerKind;

use twc_sandbox::up::StopMode;

use crate::analysis::{analysed_worker, load};
use crate::chaos::cluster::Private;
use crate::harness::browser::{Browser, DashboardProcess};
use crate::harness::twd::{
    apply, connection, routing, target_build, wait_ready, wait_reason, worker,
};
use crate::harness::wait::wait_for;
use crate::harness::{env, kube_client, test_namespace};

const ROLLOUT: Duration = Duration::from_secs(180);

/// Where the screenshots go: `TWC_DASHBOARD_SCREENSHOTS` (`docs` refreshes the README's),
/// else the tests' scratch folder in the target dir, so a test run leaves the checkout alone.
fn screenshot(name: &str) -> PathBuf {
    std::env::var_os("TWC_DASHBOARD_SCREENSHOTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")))
        .join(format!("dashboard-{name}.png"))
}

fn unix_millis(at: SystemTime) -> i64 {
    at.duration_since(UNIX_EPOCH)
        .ok()
        .and_then(|d| i64::try_from(d.as_millis()).ok())
        .unwrap_or_default()
}

async fn no_console_errors(browser: &Browser, page: &str) {
    let errors = browser.console_errors().await;
    assert!(errors.is_empty(), "console errors on {page}: {errors:#?}");
}

/// When the WorkerDeployment `ns/name` first shows its target ramping at `percent` (a watch of
/// its own, as the dashboard's), in Unix milliseconds, with its `rampLastModifiedAt`.
async fn status_shows_ramp(ns: &str, name: &str, percent: f64) -> (i64, Option<String>) {
    let client = kube_client().await;
    let api: Api<DynamicObject> =
        Api::namespaced_with(client, ns, &WorkerKind::WorkerDeployment.api_resource());
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut stream = std::pin::pin!(watcher::watcher(api, config));
    while let Some(event) = stream.next().await {
        let objects = match event {
            Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => vec![o],
            _ => continue,
        };
        for object in objects {
            let target = &object.data["status"]["targetVersion"];
            if target["rampPercentage"].as_f64() == Some(percent) {
                let modified = target["rampLastModifiedAt"].as_str().map(str::to_owned);
                return (unix_millis(SystemTime::now()), modified);
            }
        }
    }
    panic!("the watch of {ns}/{name} ended");
}

/// In the open page: resolves with the page's clock when the summary's routing shows
/// `percent`% (a MutationObserver, no polling).
const WAIT_FOR_RAMP: &str = r#"
const percent = arguments[0], done = arguments[arguments.length - 1];
const shows = () => { const n = document.querySelector('#summary .ramp'); return !!n && n.textContent.startsWith(percent + '%'); };
if (shows()) { done(Date.now()); return; }
const observer = new MutationObserver(() => { if (shows()) { observer.disconnect(); done(Date.now()); } });
observer.observe(document.getElementById('app'), { subtree: true, childList: true, characterData: true });
"#;

#[tokio::test]
async fn the_overview_lists_worker_deployments_and_an_open_page_shows_a_ramp_change_within_a_second()
 {
    let client = kube_client().await;
    let ns = test_namespace(&client, "dash-live").await;
    let steps = |first: &str| {
        json!({ "strategy": "Progressive", "steps": [
            { "rampPercentage": 10, "pauseDuration": first },
            { "rampPercentage": 50, "pauseDuration": "10m" }
        ] })
    };
    apply(&connection(&ns)).await;
    apply(&worker(&ns, "hello", "v1", steps("15s"))).await;
    apply(&worker(
        &ns,
        "other",
        "v1",
        json!({ "strategy": "AllAtOnce" }),
    ))
    .await;
    let v1 = target_build(&wait_ready(&client, &ns, "hello", ROLLOUT).await).unwrap_or_default();
    wait_ready(&client, &ns, "other", ROLLOUT).await;

    let dashboard = DashboardProcess::start(&[]).await;
    let browser = Browser::start().await;

    // The overview: every worker deployment of the sandbox, ours with its Current build.
    browser
        .open(&format!("{}/", dashboard.url), "#overview")
        .await;
    let row = browser
        .wait_text(&format!("tr[data-key='{ns}/hello']"), &v1)
        .await;
    assert!(row.contains("Complete"), "{row}");
    browser
        .wait_text(&format!("tr[data-key='{ns}/other']"), "100% Current")
        .await;
    let listed = kube_listed().await;
    let shown = browser
        .eval("return [...document.querySelectorAll('#rows tr')].map(r => r.dataset.key);")
        .await;
    let shown: Vec<String> = serde_json::from_value(shown).unwrap_or_default();
    for key in [format!("{ns}/hello"), format!("{ns}/other")] {
        assert!(shown.contains(&key), "{key} in {shown:?}");
    }
    assert!(
        listed.iter().filter(|k| shown.contains(k)).count() * 10 >= listed.len() * 9,
        "the overview shows the sandbox's worker deployments: {} of {} listed",
        shown.len(),
        listed.len()
    );
    browser.screenshot(&screenshot("overview")).await;
    no_console_errors(&browser, "the overview").await;

    // A new build ramps at 10%; the open page shows the step to 50% as it happens.
    apply(&worker(&ns, "hello", "v2", steps("15s"))).await;
    let deployment_name = format!("{ns}/hello");
    wait_for("v2 ramps at 10%", ROLLOUT, || async {
        let r = routing(&deployment_name).await?;
        (r.ramping.is_some() && r.percentage.round() as i64 == 10)
            .then_some(())
            .ok_or_else(|| format!("{r:?}"))
    })
    .await;
    browser
        .open(&dashboard.page(&ns, "hello"), "#summary")
        .await;
    browser.wait_text("#summary .ramp", "10%").await;
    browser.wait_text("#timeline", "10%").await;
    let (page, status) = tokio::join!(
        browser.client.execute_async(WAIT_FOR_RAMP, vec![json!(50)]),
        status_shows_ramp(&ns, "hello", 50.0)
    );
    let page_ms = page
        .unwrap_or_else(|e| panic!("waiting in the page: {e}"))
        .as_i64()
        .unwrap_or_default();
    let (status_ms, modified) = status;
    let latency = page_ms - status_ms;
    println!(
        "ramp 10% -> 50%: status seen at {status_ms}, page at {page_ms} ({latency} ms later); Temporal's rampLastModifiedAt {modified:?}"
    );
    assert!(
        latency < 1000,
        "the open page showed the ramp change {latency} ms after the status"
    );
    browser.wait_text("#versions", "50%").await;
    browser.wait_text("#timeline", "now").await;
    browser.screenshot(&screenshot("rollout")).await;
    no_console_errors(&browser, "the rollout's page").await;
}

/// Every worker deployment of the sandbox (`<namespace>/<name>`), listed through the API.
async fn kube_listed() -> Vec<String> {
    let client = kube_client().await;
    let listed = twc_activities::k8s::twd::list_workers(&client, None, &Default::default())
        .await
        .unwrap_or_else(|e| panic!("listing worker deployments: {e}"));
    listed
        .iter()
        .map(|w| {
            format!(
                "{}/{}",
                w.metadata.namespace.as_deref().unwrap_or_default(),
                w.metadata.name.as_deref().unwrap_or_default()
            )
        })
        .collect()
}

#[tokio::test]
async fn the_promote_button_makes_a_manual_rollout_current_and_pause_of_a_complete_one_is_rejected()
{
    let client = kube_client().await;
    let ns = test_namespace(&client, "dash-ctl").await;
    apply(&connection(&ns)).await;
    // The first version becomes Current at once; the second waits for a person.
    apply(&worker(
        &ns,
        "hello",
        "v1",
        json!({ "strategy": "AllAtOnce" }),
    ))
    .await;
    wait_ready(&client, &ns, "hello", ROLLOUT).await;
    apply(&worker(&ns, "hello", "v2", json!({ "strategy": "Manual" }))).await;
    wait_reason(
        &client,
        &ns,
        "hello",
        "Progressing",
        "WaitingForPromotion",
        ROLLOUT,
    )
    .await;

    let dashboard = DashboardProcess::start(&[&ns]).await;
    let browser = Browser::start().await;
    browser
        .open(&dashboard.page(&ns, "hello"), "#summary")
        .await;
    browser.wait_text("#summary", "WaitingForPromotion").await;

    browser.click("button[data-action='promote']").await;
    let answer = browser.wait_text("#answer", "accepted:").await;
    println!("promote: {answer}");
    let twd = wait_ready(&client, &ns, "hello", ROLLOUT).await;
    let v2 = target_build(&twd).unwrap_or_default();
    assert!(v2.starts_with("v2-"), "{v2}");
    wait_for("v2 Current in Temporal", ROLLOUT, || async {
        let r = routing(&format!("{ns}/hello")).await?;
        (r.current.as_deref() == Some(v2.as_str()) && r.ramping.is_none())
            .then_some(())
            .ok_or_else(|| format!("{r:?}"))
    })
    .await;
    browser.wait_text("#summary .badge", "Complete").await;

    browser.click("button[data-action='pause']").await;
    let answer = browser.wait_text("#answer", "rejected:").await;
    println!("pause: {answer}");
    assert_eq!(
        browser
            .eval("return document.getElementById('answer').className;")
            .await,
        json!("rejected")
    );
    no_console_errors(&browser, "the Manual rollout's page").await;
}

#[tokio::test]
async fn the_analysis_chart_of_an_aborted_canary_shows_the_failing_measurement_above_its_limit() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "dash-canary").await;
    let tq = format!("dash-{ns}");
    let steps = json!([{ "rampPercentage": 50, "pauseDuration": "1m" }]);
    let analysis = json!({ "checks": [ {
        "name": "failures", "interval": "3s", "inconclusiveLimit": 20,
        "temporal": { "maxFailurePercent": 10, "minSamples": 10 }
    } ] });
    let manifest = |tag: &str, fail: u32| {
        analysed_worker(
            &ns,
            "hello",
            tag,
            &tq,
            fail,
            steps.clone(),
            Some(analysis.clone()),
        )
    };
    apply(&connection(&ns)).await;
    apply(&manifest("v1", 0)).await;
    wait_ready(&client, &ns, "hello", ROLLOUT).await;
    let _load = load(env(), &tq, &format!("{ns}-load-")).await;
    apply(&manifest("v2", 60)).await;
    wait_reason(
        &client,
        &ns,
        "hello",
        "Progressing",
        "AnalysisFailed",
        ROLLOUT,
    )
    .await;

    let dashboard = DashboardProcess::start(&[&ns]).await;
    let browser = Browser::start().await;
    browser
        .open(&dashboard.page(&ns, "hello"), "#summary")
        .await;
    browser.wait_text("#summary", "AnalysisFailed").await;
    browser.wait_text("#analysis", "failures").await;
    let chart: Value = wait_for("the failing measurement on the chart", Duration::from_secs(30), || async {
        let found = browser
            .eval(
                "const svg = document.getElementById('analysis-failures');
                 if (!svg) return null;
                 const limit = svg.querySelector('line.limit');
                 const failed = [...svg.querySelectorAll('circle.point.Failed')];
                 if (!limit || !failed.length) return null;
                 const y = Number(limit.getAttribute('y1'));
                 return { limit: Number(limit.dataset.limit), limitY: y,
                          failed: failed.map(c => ({ value: Number(c.dataset.value), y: Number(c.getAttribute('cy')) })) };",
            )
            .await;
        if found.is_null() {
            Err("no failed point and limit yet".to_owned())
        } else {
            Ok(found)
        }
    })
    .await;
    println!("analysis chart: {chart}");
    assert_eq!(chart["limit"].as_f64(), Some(10.0), "{chart}");
    let above = chart["failed"].as_array().into_iter().flatten().any(|p| {
        p["value"].as_f64().unwrap_or_default() > 10.0
            && p["y"].as_f64().unwrap_or(f64::MAX) < chart["limitY"].as_f64().unwrap_or_default()
    });
    assert!(above, "a failed measurement drawn above the limit: {chart}");
    browser.screenshot(&screenshot("analysis")).await;
    no_console_errors(&browser, "the aborted canary's page").await;
}

/// Clears the answer of the last control, so the next one is told apart.
async fn clear_answer(browser: &Browser) {
    browser
        .eval("document.getElementById('answer').textContent = ''; return null;")
        .await;
}

#[tokio::test]
async fn an_open_page_keeps_working_after_the_controller_and_temporal_restart() {
    let mut private = Private::start("dash-restart").await;
    let ns = private.cluster.namespace("dash-restart").await;
    let cluster = &private.cluster;
    cluster.apply(&cluster.connection(&ns, "dev")).await;
    let manual = json!({ "strategy": "Manual" });
    cluster
        .apply(&worker(
            &ns,
            "hello",
            "v1",
            json!({ "strategy": "AllAtOnce" }),
        ))
        .await;
    cluster.wait_ready(&ns, "hello", "v1", ROLLOUT).await;
    cluster
        .apply(&worker(&ns, "hello", "v2", manual.clone()))
        .await;
    cluster
        .wait_reason(&ns, "hello", "Progressing", "WaitingForPromotion", ROLLOUT)
        .await;

    let dashboard = DashboardProcess::start_in(&private.sandbox.env, &[&ns]).await;
    let browser = Browser::start().await;
    browser
        .open(&dashboard.page(&ns, "hello"), "#summary")
        .await;
    browser.wait_text("#summary", "WaitingForPromotion").await;

    // The controller restarts under the open page: its button still goes through, and the
    // page shows the outcome without a reload.
    private
        .sandbox
        .restart_controller_with_env(&[])
        .await
        .unwrap_or_else(|e| panic!("restarting the controller: {e}"));
    let cluster = &private.cluster;
    browser.click("button[data-action='promote']").await;
    browser.wait_text("#answer", "accepted:").await;
    cluster.wait_ready(&ns, "hello", "v2", ROLLOUT).await;
    browser.wait_text("#summary .badge", "Complete").await;

    // Temporal is killed and comes back: the page follows the next rollout as it happens, and
    // its button reaches the restarted server.
    if let Err(e) = private
        .sandbox
        .restart_temporal(StopMode::Kill, Duration::from_secs(2))
        .await
    {
        panic!("restarting Temporal: {e:#}");
    }
    let cluster = &private.cluster;
    cluster.apply(&worker(&ns, "hello", "v3", manual)).await;
    cluster
        .wait_reason(&ns, "hello", "Progressing", "WaitingForPromotion", ROLLOUT)
        .await;
    browser.wait_text("#summary", "WaitingForPromotion").await;
    clear_answer(&browser).await;
    browser.click("button[data-action='promote']").await;
    let answer = browser.wait_text("#answer", "accepted:").await;
    println!("promote after Temporal's restart: {answer}");
    let twd = cluster.wait_ready(&ns, "hello", "v3", ROLLOUT).await;
    let v3 = target_build(&twd).unwrap_or_default();
    let deployment_name = format!("{ns}/hello");
    cluster
        .wait("v3 Current in Temporal", ROLLOUT, || async {
            let r = cluster.routing(&deployment_name).await?;
            (r.current.as_deref() == Some(v3.as_str()) && r.ramping.is_none())
                .then_some(())
                .ok_or_else(|| format!("{r:?}"))
        })
        .await;
    browser.wait_text("#summary .badge", "Complete").await;
    browser
        .wait_text(&format!("#versions tr[data-build='{v3}']"), "Current")
        .await;
    no_console_errors(&browser, "the page across restarts").await;
    drop(browser);
    drop(dashboard);
    private.sandbox.stop().await;
}
