//! The notification workflow of a TWD (`notify/<ns>/<name>`): the `emit_event` activity of
//! the TWD's workflows signals-with-start it for each event the TWD's webhook targets want; it
//! sends them one at a time, in the order they came, through the `send_notification`
//! activity. An event is queued once whatever crashes happen (a retried `emit_event` sends the
//! same idempotency key, which is dropped). A target that fails in a way a retry may fix gets
//! a lane of its own: it is tried again with backoff for up to an hour per event, and later
//! events wait in its lane behind the one it failed, so it gets them in order; every other
//! target gets them at once. The TWD's workflow is told which targets are failing (its
//! `NotificationsDelivered` condition). Nothing here is on a rollout's path: the rollout never
//! waits for a webhook.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use temporalio_macros::{workflow, workflow_methods};
use temporalio_sdk::{SyncWorkflowContext, WorkflowContext, WorkflowContextView, WorkflowResult};

use crate::contract::{
    Notification, NotificationFailure, NotificationRequest, SendNotification, TargetFailure,
    TargetResult,
};
use crate::model::TwdRef;
use crate::plan::notify;
use crate::support::{self, history_full, now_millis, own_token};
use crate::twd_workflow::TwdWorkflow;

/// Keys of delivered notifications remembered (a retried `emit_event` comes within minutes).
const KEYS_KEPT: usize = 500;
/// The workflow ends after this long with nothing to send (the next event starts it again).
const IDLE: Duration = Duration::from_secs(3600);

/// Input of the notification workflow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotifyInput {
    /// The TWD.
    pub twd: TwdRef,
    /// State carried over a continue-as-new.
    #[serde(default)]
    pub carried: Option<CarriedNotify>,
}

/// What survives a continue-as-new.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CarriedNotify {
    /// Notifications not sent yet, oldest first.
    pub queue: VecDeque<Notification>,
    /// Keys of the latest notifications sent or given up.
    pub done: VecDeque<String>,
    /// Targets failing now.
    pub failing: Vec<TargetFailure>,
    /// What each target that failed still owes, in order.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub lanes: notify::Lanes,
}

/// The notification workflow's state.
#[workflow]
pub struct NotifyWorkflow {
    twd: TwdRef,
    state: CarriedNotify,
    received: u64,
}

#[workflow_methods]
impl NotifyWorkflow {
    /// Builds the initial state from the input.
    #[init]
    pub fn new(_ctx: &WorkflowContextView, input: NotifyInput) -> Self {
        Self {
            twd: input.twd,
            state: input.carried.unwrap_or_default(),
            received: 0,
        }
    }

    /// Sends queued notifications in order until idle for an hour: each first to every target
    /// that wants it and owes nothing, then through the lanes of the targets that failed.
    #[run(name = "notify")]
    pub async fn run(ctx: &mut WorkflowContext<Self>) -> WorkflowResult<()> {
        loop {
            let now = now_millis(ctx);
            if let Some(next) = ctx.state(|s| s.state.queue.front().cloned()) {
                first_try(ctx, next).await;
                ctx.state_mut(|s| {
                    if let Some(sent) = s.state.queue.pop_front() {
                        s.state.done.push_back(sent.key);
                    }
                    while s.state.done.len() > KEYS_KEPT {
                        s.state.done.pop_front();
                    }
                });
            } else if let Some(target) = ctx.state(|s| notify::due_lane(&s.state.lanes, now)) {
                lane_try(ctx, &target).await;
            } else {
                // Nothing due: wait for the next notification, the next lane's retry, or an
                // hour with nothing to send.
                let seen = ctx.state(|s| s.received);
                let wait = ctx
                    .state(|s| notify::next_due(&s.state.lanes))
                    .map_or(IDLE, |at| {
                        Duration::from_millis(u64::try_from(at.saturating_sub(now)).unwrap_or(0))
                    });
                let timer = ctx.timer(support::timer(wait));
                let received = move |s: &Self| s.received != seen;
                let woken = support::unless(ctx, timer, received, |_| true)
                    .await
                    .is_none();
                let idle = ctx.state(|s| s.state.queue.is_empty() && s.state.lanes.is_empty());
                if !woken && idle {
                    return Ok(());
                }
                continue;
            }
            if history_full(ctx, None) {
                let input = ctx.state(|s| NotifyInput {
                    twd: s.twd.clone(),
                    carried: Some(s.state.clone()),
                });
                ctx.continue_as_new(input, Default::default())?;
                return Ok(());
            }
        }
    }

    /// Queues a notification unless its key was queued or sent already.
    #[signal(name = "notify")]
    pub fn notify(&mut self, _ctx: &mut SyncWorkflowContext<Self>, notification: Notification) {
        let known = self.state.done.contains(&notification.key)
            || self.state.queue.iter().any(|n| n.key == notification.key);
        if !known {
            self.state.queue.push_back(notification);
            self.received += 1;
        }
    }
}

/// The workflow ID of the notification workflow of `twd`.
pub fn notify_workflow_id(twd: &TwdRef) -> String {
    format!("notify/{}/{}", twd.namespace, twd.name)
}

/// The first try of `notification`: every target that wants it but those that owe earlier
/// ones (they get it through their lanes, in order). Targets that fail in a way a retry may fix
/// get a lane. An activity that could not run at all (the TWD could not be read after its
/// retries) is tried again with backoff, for up to [`notify::GIVE_UP_AFTER`].
async fn first_try(ctx: &mut WorkflowContext<NotifyWorkflow>, notification: Notification) {
    let give_up_at = now_millis(ctx)
        .saturating_add(i64::try_from(notify::GIVE_UP_AFTER.as_millis()).unwrap_or(0));
    let mut tries = 0u32;
    loop {
        let except: Vec<String> = ctx.state(|s| s.state.lanes.keys().cloned().collect());
        let sent = send(ctx, &notification, None, except).await;
        let now = now_millis(ctx);
        if let Some(results) = sent {
            ctx.state_mut(|s| {
                notify::after_first_try(&mut s.state.lanes, &notification, &results, now);
            });
            return;
        }
        if now >= give_up_at {
            return;
        }
        let _ = ctx.timer(support::timer(notify::retry_delay(tries))).await;
        tries = tries.saturating_add(1);
    }
}

/// One try of the oldest notification `target` owes (an activity that could not run counts as
/// a failure a retry may fix).
async fn lane_try(ctx: &mut WorkflowContext<NotifyWorkflow>, target: &str) {
    let Some(owed) = ctx.state(|s| {
        s.state
            .lanes
            .get(target)
            .and_then(|lane| lane.pending.front().cloned())
    }) else {
        return;
    };
    let only = Some(vec![target.to_owned()]);
    let line = match send(ctx, &owed.notification, only, Vec::new()).await {
        Some(results) => results.into_iter().find(|r| r.target == target),
        None => Some(TargetResult {
            target: target.to_owned(),
            failure: Some(TargetFailure {
                target: target.to_owned(),
                reason: NotificationFailure::NotificationDeliveryFailed,
                message: "not sent: the worker deployment could not be read".to_owned(),
            }),
        }),
    };
    let now = now_millis(ctx);
    ctx.state_mut(|s| notify::after_lane_try(&mut s.state.lanes, target, line.as_ref(), now));
}

/// Sends `notification` to the targets that want it (only `only` when given, none of
/// `except`) and reports their health; the results of the targets tried, `None` when the
/// activity could not run at all.
async fn send(
    ctx: &mut WorkflowContext<NotifyWorkflow>,
    notification: &Notification,
    only: Option<Vec<String>>,
    except: Vec<String>,
) -> Option<Vec<TargetResult>> {
    let twd = ctx.state(|s| s.twd.clone());
    let request = NotificationRequest {
        twd: twd.clone(),
        notification: notification.clone(),
        only,
        except,
    };
    let summary = format!("notify {}", notification.event.as_str());
    let outcome = ctx
        .execute_activity(
            SendNotification,
            request,
            support::with_summary(send_options(), &summary),
        )
        .await
        .ok()?;
    report_health(ctx, &twd, &outcome.results).await;
    Some(outcome.results)
}

/// Tells the TWD's workflow which targets are failing when that changed.
async fn report_health(
    ctx: &mut WorkflowContext<NotifyWorkflow>,
    twd: &TwdRef,
    results: &[TargetResult],
) {
    let before = ctx.state(|s| s.state.failing.clone());
    let after = notify::failing_after(&before, results);
    if after == before {
        return;
    }
    ctx.state_mut(|s| s.state.failing = after.clone());
    let _ = ctx
        .external_workflow(twd.twd_workflow_id(), None)
        .signal(
            TwdWorkflow::notification_health,
            after,
            support::signal_options(),
        )
        .await;
}

/// One try of a notification: a webhook gets 10 s per target; the activity is retried only
/// when it could not run at all (reading the TWD failed).
fn send_options() -> temporalio_sdk::ActivityOptions {
    let retry = temporalio_common::RetryPolicy::builder()
        .initial_interval(Duration::from_secs(1))
        .maximum_interval(Duration::from_secs(10))
        .maximum_attempts(5)
        .build();
    temporalio_sdk::ActivityOptions::with_start_to_close_timeout(Duration::from_secs(120))
        .heartbeat_timeout(Duration::from_secs(20))
        .retry_policy(retry)
        .cancellation_token(own_token())
        .build()
}
