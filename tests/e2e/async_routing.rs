//! Rollouts on a Temporal whose worker-deployment system workflows run in their asynchronous
//! mode (dynamic config `matching.deploymentWorkflowVersion=2`; the dev server's default is the
//! synchronous 0). There a routing change returns once Temporal has recorded it and reaches the
//! task queues afterwards, and a change right after another waits for the first to reach
//! them. A private sandbox started with that setting: a first build made Current, a
//! Progressive rollout through each step to Current with the status following, and the old
//! build retired (Deployment and Temporal version deleted), as on the default server.

use std::time::Duration;

use serde_json::{Value, json};

use crate::chaos::cluster::{Private, status_text};
use crate::harness::twd::{deployments, get_twd, target_build, worker};

const NAME: &str = "hello";
const ASYNC_ROUTING: &str = "matching.deploymentWorkflowVersion=2";
const ROLLOUT: Duration = Duration::from_secs(150);

fn progressive() -> Value {
    json!({ "strategy": "Progressive", "steps": [
        { "rampPercentage": 30, "pauseDuration": "3s" },
        { "rampPercentage": 60, "pauseDuration": "3s" }
    ] })
}

/// The dev server's command line, from its PID file.
fn temporal_command_line(pid_file: &std::path::Path) -> String {
    let pid = std::fs::read_to_string(pid_file)
        .unwrap_or_else(|e| panic!("reading {}: {e}", pid_file.display()));
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", pid.trim()))
        .unwrap_or_else(|e| panic!("reading the command line of pid {pid}: {e}"));
    String::from_utf8_lossy(&cmdline).replace('\0', " ")
}

#[tokio::test]
async fn progressive_rollout_completes_and_retires_the_old_build_with_async_routing() {
    let private = Private::start_with("async-routing", None, &[ASYNC_ROUTING]).await;
    let cluster = &private.cluster;
    let pid_file = cluster
        .env
        .temporal_pid_file
        .clone()
        .unwrap_or_else(|| panic!("the private sandbox wrote no Temporal PID file"));
    let command_line = temporal_command_line(&pid_file);
    assert!(
        command_line.contains(&format!("--dynamic-config-value {ASYNC_ROUTING}")),
        "the dev server runs without {ASYNC_ROUTING}: {command_line}"
    );
    assert!(
        cluster
            .env
            .temporal_dynamic_config
            .iter()
            .any(|e| e == ASYNC_ROUTING),
        "env.json does not record {ASYNC_ROUTING}: {:?}",
        cluster.env.temporal_dynamic_config
    );

    let ns = cluster.namespace("async-routing").await;
    let deployment_name = format!("{ns}/{NAME}");
    cluster.apply(&cluster.connection(&ns, "dev")).await;
    cluster.apply(&worker(&ns, NAME, "v1", progressive())).await;
    // No Current yet: the first build becomes Current directly.
    let twd = cluster.wait_ready(&ns, NAME, "v1", ROLLOUT).await;
    let first = target_build(&twd).unwrap_or_default();
    cluster
        .wait("v1 Current in Temporal", ROLLOUT, || async {
            let r = cluster.routing(&deployment_name).await?;
            if r.current.as_deref() == Some(first.as_str()) {
                Ok(())
            } else {
                Err(format!("{r:?}"))
            }
        })
        .await;

    cluster.apply(&worker(&ns, NAME, "v2", progressive())).await;
    // Every step as Temporal has it and as the TWD's status shows it, in order.
    let routed = std::cell::RefCell::new(Vec::<i64>::new());
    let shown = std::cell::RefCell::new(Vec::<i64>::new());
    let second = cluster
        .wait(
            "v2 ramps 30% then 60% then becomes Current",
            ROLLOUT,
            || async {
                let r = cluster.routing(&deployment_name).await?;
                let twd = get_twd(&cluster.client, &ns, NAME).await?;
                let target = target_build(&twd).unwrap_or_default();
                if !target.starts_with("v2-") {
                    return Err(status_text(&twd));
                }
                if r.ramping.as_deref() == Some(target.as_str()) {
                    let pct = r.percentage.round() as i64;
                    let mut routed = routed.borrow_mut();
                    if routed.last() != Some(&pct) {
                        routed.push(pct);
                    }
                }
                let ramp = twd
                    .status
                    .as_ref()
                    .and_then(|s| s.target_version.as_ref())
                    .and_then(|t| t.ramp_percentage)
                    .map(|p| p.round() as i64);
                // Shown while Temporal still ramps or has not made it Current yet.
                if let Some(pct) = ramp.filter(|_| r.current.as_deref() != Some(target.as_str())) {
                    let mut shown = shown.borrow_mut();
                    if shown.last() != Some(&pct) {
                        shown.push(pct);
                    }
                }
                if r.current.as_deref() == Some(target.as_str()) {
                    Ok(target)
                } else {
                    Err(format!(
                        "routing {r:?}; steps routed {:?}, shown {:?}",
                        routed.borrow(),
                        shown.borrow()
                    ))
                }
            },
        )
        .await;
    assert_eq!(*routed.borrow(), vec![30, 60], "steps routed in Temporal");
    let shown = shown.into_inner();
    assert!(
        shown.iter().all(|p| [30, 60].contains(p)) && shown.last() == Some(&60),
        "the status showed {shown:?} of the steps [30, 60] before v2 was Current"
    );
    let twd = cluster.wait_ready(&ns, NAME, "v2", ROLLOUT).await;
    let current = twd
        .status
        .as_ref()
        .and_then(|s| s.current_version.as_ref())
        .map(|v| v.build_id.clone());
    assert_eq!(
        current.as_deref(),
        Some(second.as_str()),
        "{}",
        status_text(&twd)
    );

    cluster
        .wait(
            "v1's Deployment and Temporal version deleted",
            ROLLOUT,
            || async {
                let deps = deployments(&cluster.client, &ns, NAME).await;
                let r = cluster.routing(&deployment_name).await?;
                if deps.iter().all(|d| d.1 != first) && !r.versions.contains(&first) {
                    Ok(())
                } else {
                    Err(format!("deployments {deps:?}; versions {:?}", r.versions))
                }
            },
        )
        .await;
    let deps = deployments(&cluster.client, &ns, NAME).await;
    assert_eq!(
        deps.iter().map(|d| d.1.clone()).collect::<Vec<_>>(),
        vec![second],
        "only v2's Deployment is left"
    );
}
