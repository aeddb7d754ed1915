//! Observability of the sandbox's controller: `/healthz` and `/readyz` answer 200 once it is
//! up, and its Prometheus `/metrics` page follows real rollouts: the rollout counters by
//! strategy move, the per-TWD ramp and version gauges follow the status (and go with the TWD),
//! the outcome, step and time-to-Current histograms get one sample per rollout event, and the
//! Temporal, Kubernetes, poller-wait and watcher-signal metrics count.
//!
//! The controller is shared with the other tests of the run, so counters are compared with a
//! scrape taken before this test's rollouts (they may move more, never less).

use std::collections::HashMap;
use std::time::Duration;

use kube::api::{Api, DeleteParams};
use serde_json::{Value, json};
use twc_crds::TemporalWorkerDeployment;

use crate::harness::twd::{apply, legacy, wait_ready, wait_reason};
use crate::harness::wait::wait_for;
use crate::harness::{env, kube_client, test_namespace};

const ROLLOUT: Duration = Duration::from_secs(120);

/// Status, head and body of `GET url`.
async fn get(url: &str) -> Result<(u16, String, String), String> {
    let response = twc_sandbox::http::get(url).await?;
    Ok((response.status, response.head, response.body))
}

fn metrics_url() -> String {
    match &env().controller_metrics_url {
        Some(url) => url.clone(),
        None => {
            panic!("the sandbox env names no controller metrics URL (is a controller running?)")
        }
    }
}

fn health_url(path: &str) -> String {
    match &env().controller_health_url {
        Some(url) => format!("{url}{path}"),
        None => panic!("the sandbox env names no controller health URL (is a controller running?)"),
    }
}

/// One scrape: every sample line, `name{labels}` to value.
#[derive(Debug, Clone, Default)]
pub(crate) struct Scrape(HashMap<String, f64>);

impl Scrape {
    async fn take() -> Result<Self, String> {
        Self::take_from(&metrics_url()).await
    }

    /// A scrape of the metrics page at `url` (a private sandbox's controller, say).
    pub(crate) async fn take_from(url: &str) -> Result<Self, String> {
        let (status, head, body) = get(url).await?;
        if status != 200 {
            return Err(format!("{url}: {head}\n{body}"));
        }
        Ok(Self::parse(&body))
    }

    fn parse(page: &str) -> Self {
        Self(
            page.lines()
                .filter(|l| !l.starts_with('#') && !l.is_empty())
                .filter_map(|l| {
                    let (series, value) = l.rsplit_once(' ')?;
                    Some((series.to_owned(), value.parse().ok()?))
                })
                .collect(),
        )
    }

    /// A sample's value; 0 when the series does not exist (yet).
    fn value(&self, series: &str) -> f64 {
        self.0.get(series).copied().unwrap_or_default()
    }

    fn has(&self, series: &str) -> bool {
        self.0.contains_key(series)
    }

    /// Sum of the samples of a family whose labels contain every `label="value"` given.
    pub(crate) fn sum(&self, name: &str, labels: &[&str]) -> f64 {
        self.0
            .iter()
            .filter(|(series, _)| {
                series.split('{').next() == Some(name) && labels.iter().all(|l| series.contains(l))
            })
            .map(|(_, v)| v)
            .sum()
    }
}

/// Waits until a scrape satisfies `check` (which says what it saw otherwise).
async fn wait_metrics(what: &str, check: impl Fn(&Scrape) -> Result<(), String>) -> Scrape {
    wait_for(what, ROLLOUT, || async {
        let scrape = Scrape::take().await?;
        check(&scrape).map(|()| scrape)
    })
    .await
}

/// `counter >= at least`, or what it is.
fn at_least(scrape: &Scrape, series: &str, least: f64) -> Result<(), String> {
    let value = scrape.value(series);
    if value >= least {
        Ok(())
    } else {
        Err(format!("{series} = {value}, want >= {least}"))
    }
}

fn equals(scrape: &Scrape, series: &str, want: f64) -> Result<(), String> {
    match scrape.0.get(series) {
        Some(value) if *value == want => Ok(()),
        other => Err(format!("{series} = {other:?}, want {want}")),
    }
}

/// These tests run on the older kinds (TemporalWorkerDeployment, TemporalConnection), which
/// `twc` keeps serving; the rest of the suite uses WorkerDeployment and Connection.
fn worker(ns: &str, name: &str, tag: &str, rollout: Value) -> Value {
    legacy(crate::harness::twd::worker(ns, name, tag, rollout))
}

/// The older kind of connection (see [`worker`]).
fn connection(ns: &str) -> Value {
    legacy(crate::harness::twd::connection(ns))
}

#[tokio::test]
async fn probes_answer_200_and_metrics_are_openmetrics_text() {
    for path in ["/healthz", "/readyz"] {
        let url = health_url(path);
        // The controller may still be listing or starting its worker: readiness can lag.
        let body = wait_for(&format!("{url} answers 200"), ROLLOUT, || async {
            let (status, head, body) = get(&url).await?;
            if status == 200 {
                Ok(body)
            } else {
                Err(format!("{head}\n{body}"))
            }
        })
        .await;
        assert_eq!(body, "ok\n", "{url}");
    }
    // The probes are not on the metrics port, nor the metrics on the probe port.
    let (status, _, _) = get(&health_url("/metrics"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(status, 404);

    let url = metrics_url();
    let (status, head, page) = get(&url).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(status, 200, "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/openmetrics-text; version=1.0.0"),
        "{head}"
    );
    assert!(page.ends_with("# EOF\n"), "{page}");
    // A family shows once it has a series: these have one as soon as the watcher listed.
    for family in ["twc_build_info gauge", "twc_kubernetes_requests counter"] {
        assert!(
            page.contains(&format!("# TYPE {family}\n")),
            "no {family}:\n{page}"
        );
    }
    // The watcher's list and watch already went through the counted client.
    let scrape = Scrape::parse(&page);
    assert!(
        scrape.sum(
            "twc_kubernetes_requests_total",
            &[
                r#"resource="temporalworkerdeployments""#,
                r#"outcome="success""#
            ]
        ) >= 1.0,
        "{page}"
    );
}

#[tokio::test]
async fn rollout_metrics_move_with_real_rollouts() {
    let client = kube_client().await;
    let ns = test_namespace(&client, "metrics").await;
    let before = Scrape::take().await.unwrap_or_else(|e| panic!("{e}"));
    let twd_labels = format!(r#"{{namespace="{ns}",name="hello"}}"#);
    let ramp = format!("twc_ramp_percentage{twd_labels}");
    let versions = format!("twc_versions{twd_labels}");
    assert!(!before.has(&ramp), "{ramp} before the TWD exists");
    let started = |s: &str| format!(r#"twc_rollouts_started_total{{strategy="{s}"}}"#);
    let completed = |s: &str| format!(r#"twc_rollouts_completed_total{{strategy="{s}"}}"#);
    let durations = |s: &str| format!(r#"twc_rollout_duration_seconds_count{{strategy="{s}"}}"#);
    let outcomes = |s: &str, o: &str| {
        format!(r#"twc_rollout_outcome_duration_seconds_count{{strategy="{s}",outcome="{o}"}}"#)
    };
    let to_current = |s: &str| format!(r#"twc_time_to_current_seconds_count{{strategy="{s}"}}"#);
    let step = |s: &str, i: u32| {
        format!(r#"twc_rollout_step_duration_seconds_count{{strategy="{s}",step="{i}"}}"#)
    };
    let moved_by_one = |s: &Scrape, series: &str| at_least(s, series, before.value(series) + 1.0);

    // 1. AllAtOnce: started, completed with a duration, the build Current (ramp 100).
    apply(&connection(&ns)).await;
    apply(&worker(
        &ns,
        "hello",
        "v1",
        json!({ "strategy": "AllAtOnce" }),
    ))
    .await;
    wait_ready(&client, &ns, "hello", ROLLOUT).await;
    wait_metrics("the AllAtOnce rollout counted and its gauges set", |s| {
        at_least(
            s,
            &started("AllAtOnce"),
            before.value(&started("AllAtOnce")) + 1.0,
        )?;
        at_least(
            s,
            &completed("AllAtOnce"),
            before.value(&completed("AllAtOnce")) + 1.0,
        )?;
        at_least(
            s,
            &durations("AllAtOnce"),
            before.value(&durations("AllAtOnce")) + 1.0,
        )?;
        moved_by_one(s, &outcomes("AllAtOnce", "complete"))?;
        moved_by_one(s, &to_current("AllAtOnce"))?;
        equals(s, &ramp, 100.0)?;
        equals(s, &versions, 1.0)
    })
    .await;

    // 2. Progressive: the ramp gauge shows the step while it holds, with both versions.
    let progressive = json!({ "strategy": "Progressive", "steps": [ { "rampPercentage": 40, "pauseDuration": "20s" } ] });
    apply(&worker(&ns, "hello", "v2", progressive)).await;
    wait_metrics("the ramp gauge at the 40% step", |s| {
        at_least(
            s,
            &started("Progressive"),
            before.value(&started("Progressive")) + 1.0,
        )?;
        equals(s, &ramp, 40.0)?;
        equals(s, &versions, 2.0)
    })
    .await;
    wait_ready(&client, &ns, "hello", ROLLOUT).await;
    wait_metrics("the Progressive rollout completed", |s| {
        at_least(
            s,
            &completed("Progressive"),
            before.value(&completed("Progressive")) + 1.0,
        )?;
        // The one 40% step was held for its 20 s pause, then the build became Current.
        moved_by_one(s, &step("Progressive", 0))?;
        moved_by_one(s, &outcomes("Progressive", "complete"))?;
        moved_by_one(s, &to_current("Progressive"))?;
        equals(s, &ramp, 100.0)
    })
    .await;

    // 3. A failing gate counts a failure with its reason.
    let failing = json!({ "strategy": "AllAtOnce", "gate": { "workflowType": "RolloutGate", "input": { "fail": true } } });
    apply(&worker(&ns, "hello", "v3", failing)).await;
    wait_reason(&client, &ns, "hello", "Ready", "GateFailed", ROLLOUT).await;
    let failed = r#"twc_rollouts_failed_total{strategy="AllAtOnce",reason="GateFailed"}"#;
    wait_metrics("the gate failure counted", |s| {
        at_least(s, failed, before.value(failed) + 1.0)?;
        moved_by_one(s, &outcomes("AllAtOnce", "failed"))?;
        equals(s, &ramp, 0.0)
    })
    .await;

    // 4. A Manual rollout waiting for promotion is superseded by a newer build. The outcome is
    //    labeled with the TWD's strategy when the superseding status is written (v5's).
    apply(&worker(&ns, "hello", "v4", json!({ "strategy": "Manual" }))).await;
    wait_reason(
        &client,
        &ns,
        "hello",
        "Ready",
        "WaitingForPromotion",
        ROLLOUT,
    )
    .await;
    apply(&worker(
        &ns,
        "hello",
        "v5",
        json!({ "strategy": "AllAtOnce" }),
    ))
    .await;
    wait_ready(&client, &ns, "hello", ROLLOUT).await;
    let superseded = [r#"outcome="superseded""#];
    let after = wait_metrics("the superseded rollout recorded", |s| {
        let (was, is) = (
            before.sum("twc_rollout_outcome_duration_seconds_count", &superseded),
            s.sum("twc_rollout_outcome_duration_seconds_count", &superseded),
        );
        if is < was + 1.0 {
            return Err(format!("superseded outcomes {was} -> {is}"));
        }
        equals(s, &ramp, 100.0)
    })
    .await;
    // Every series of the new histograms is labeled as documented.
    for (series, _) in after.0.iter().filter(|(k, _)| {
        k.starts_with("twc_rollout_outcome_duration_seconds_count")
            || k.starts_with("twc_rollout_step_duration_seconds_count")
    }) {
        let outcome_ok = ["complete", "failed", "aborted", "superseded"]
            .iter()
            .any(|o| series.contains(&format!(r#"outcome="{o}""#)));
        assert!(
            series.contains(r#"strategy=""#) && (outcome_ok || series.contains(r#"step=""#)),
            "{series}"
        );
    }

    // Every family is on the page now, with its type. OpenMetrics names a counter family
    // without `_total`; its samples carry the suffix.
    let (_, _, page) = get(&metrics_url()).await.unwrap_or_else(|e| panic!("{e}"));
    for family in [
        "twc_build_info gauge",
        "twc_rollouts_started counter",
        "twc_rollouts_completed counter",
        "twc_rollouts_failed counter",
        "twc_rollout_duration_seconds histogram",
        "twc_rollout_outcome_duration_seconds histogram",
        "twc_rollout_step_duration_seconds histogram",
        "twc_time_to_current_seconds histogram",
        "twc_ramp_percentage gauge",
        "twc_versions gauge",
        "twc_temporal_requests counter",
        "twc_temporal_read_grants counter",
        "twc_kubernetes_requests counter",
        "twc_wait_for_pollers_seconds histogram",
        "twc_watcher_signals counter",
    ] {
        assert!(
            page.contains(&format!("# TYPE {family}\n")),
            "no {family}:\n{page}"
        );
    }

    // 5. What the rollouts did through the clients and the watcher was counted too.
    let moved = |name: &str, labels: &[&str]| {
        let (was, is) = (before.sum(name, labels), after.sum(name, labels));
        assert!(is > was, "{name} {labels:?}: {was} -> {is}");
    };
    moved(
        "twc_temporal_requests_total",
        &[
            r#"operation="DescribeWorkerDeployment""#,
            r#"outcome="success""#,
        ],
    );
    moved(
        "twc_temporal_requests_total",
        &[
            r#"operation="SetWorkerDeploymentCurrentVersion""#,
            r#"outcome="success""#,
        ],
    );
    moved(
        "twc_temporal_requests_total",
        &[
            r#"operation="SetWorkerDeploymentRampingVersion""#,
            r#"outcome="success""#,
        ],
    );
    // Every worker-deployment read is counted as granted when it is sent, before its answer is
    // counted: the grants never trail the answered reads.
    moved("twc_temporal_read_grants_total", &[]);
    let answered_reads = [
        r#"operation="DescribeWorkerDeployment""#,
        r#"operation="DescribeWorkerDeploymentVersion""#,
    ]
    .iter()
    .map(|op| after.sum("twc_temporal_requests_total", &[op]))
    .sum::<f64>();
    let grants = after.value("twc_temporal_read_grants_total");
    assert!(
        grants >= answered_reads,
        "{grants} read grants, {answered_reads} worker-deployment reads answered"
    );
    moved(
        "twc_kubernetes_requests_total",
        &[
            r#"verb="patch""#,
            r#"resource="temporalworkerdeployments/status""#,
            r#"outcome="success""#,
        ],
    );
    moved(
        "twc_kubernetes_requests_total",
        &[
            r#"verb="create""#,
            r#"resource="deployments""#,
            r#"outcome="success""#,
        ],
    );
    moved(
        "twc_wait_for_pollers_seconds_count",
        &[r#"outcome="ready""#],
    );
    let signals = r#"twc_watcher_signals_total{signal="spec_changed",outcome="success"}"#;
    assert!(
        after.value(signals) >= before.value(signals) + 3.0,
        "{signals}: {} -> {}",
        before.value(signals),
        after.value(signals)
    );

    // 6. The per-TWD series go with the TWD.
    let api: Api<TemporalWorkerDeployment> = Api::namespaced(client.clone(), &ns);
    if let Err(e) = api.delete("hello", &DeleteParams::default()).await {
        panic!("deleting TWD: {e}");
    }
    wait_metrics("the TWD's gauges dropped after its deletion", |s| {
        if s.has(&ramp) || s.has(&versions) {
            Err(format!(
                "{ramp} = {:?}, {versions} = {:?}",
                s.0.get(&ramp),
                s.0.get(&versions)
            ))
        } else {
            Ok(())
        }
    })
    .await;
}
