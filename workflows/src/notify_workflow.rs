//! The notification workflow of a TWD (`notify/<ns>/<name>`): the `emit_event` activity of
//! the TWD's workflows signals-with-start it for each event the TWD's webhook targets want; it
//! sends them one at a time, in the order they came, through the `send_notification`
//! activity. An event is queued once whatever crashes happen (a retried `emit_event` sends the
//! same idempotency key, which is dropped), a target that fails is tried again with backoff
//! for up to an hour (later events wait behind it, so they still arrive in order), and the TWD's
//! workflow is told which targets are failing (its `NotificationsDelivered` condition). Nothing
//! here is on a rollout's path: the rollout never waits for a webhook.

use std::collections::VecDeque;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use temporalio_macros::{workflow, workflow_methods};
use temporalio_sdk::workflows::select;
use temporalio_sdk::{SyncWorkflowContext, WorkflowContext, WorkflowContextView, WorkflowResult};

use crate::contract::{Notification, NotificationRequest, SendNotification, TargetFailure};
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

    /// Sends queued notifications in order until idle for an hour.
    #[run(name = "notify")]
    pub async fn run(ctx: &mut WorkflowContext<Self>) -> WorkflowResult<()> {
        loop {
            if ctx.state(|s| s.state.queue.is_empty()) {
                let seen = ctx.state(|s| s.received);
                let woken = select! {
                    _ = ctx.timer(support::timer(IDLE)) => false,
                    _ = ctx.wait_condition_with_options(move |s: &Self| s.received != seen, support::condition_options()) => true,
                };
                if !woken && ctx.state(|s| s.state.queue.is_empty()) {
                    return Ok(());
                }
                continue;
            }
            let Some(next) = ctx.state(|s| s.state.queue.front().cloned()) else {
                continue;
            };
            deliver(ctx, next).await;
            ctx.state_mut(|s| {
                if let Some(sent) = s.state.queue.pop_front() {
                    s.state.done.push_back(sent.key);
                }
                while s.state.done.len() > KEYS_KEPT {
                    s.state.done.pop_front();
                }
            });
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

/// Sends `notification` to every target that wants it, then again to those that failed in a
/// way a retry may fix, with backoff, for up to [`notify::GIVE_UP_AFTER`].
async fn deliver(ctx: &mut WorkflowContext<NotifyWorkflow>, notification: Notification) {
    let twd = ctx.state(|s| s.twd.clone());
    let started = now_millis(ctx);
    let give_up_at =
        started.saturating_add(i64::try_from(notify::GIVE_UP_AFTER.as_millis()).unwrap_or(0));
    let mut only = None;
    let mut tries = 0u32;
    loop {
        let request = NotificationRequest {
            twd: twd.clone(),
            notification: notification.clone(),
            only: only.clone(),
        };
        let summary = format!("notify {}", notification.event.as_str());
        let outcome = ctx
            .execute_activity(
                SendNotification,
                request,
                support::with_summary(send_options(), &summary),
            )
            .await;
        let next = match outcome {
            Ok(outcome) => {
                report_health(ctx, &twd, &outcome.results).await;
                let retry = notify::retry_targets(&outcome.results);
                if retry.is_empty() {
                    return;
                }
                Some(retry)
            }
            // The activity itself failed after its retries (the TWD could not be read): the
            // same targets again later.
            Err(_) => only.clone(),
        };
        if now_millis(ctx) >= give_up_at {
            return;
        }
        let _ = ctx.timer(support::timer(notify::retry_delay(tries))).await;
        tries += 1;
        only = next;
    }
}

/// Tells the TWD's workflow which targets are failing when that changed.
async fn report_health(
    ctx: &mut WorkflowContext<NotifyWorkflow>,
    twd: &TwdRef,
    results: &[crate::contract::TargetResult],
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
