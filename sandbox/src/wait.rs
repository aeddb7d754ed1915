//! Waiting on a condition with a deadline (never a bare sleep).

use std::future::Future;
use std::time::Duration;

/// The condition did not hold before the deadline.
#[derive(Debug, thiserror::Error)]
#[error("timed out after {timeout:?} waiting for {what}")]
pub struct WaitError {
    /// What was awaited.
    pub what: String,
    /// The deadline.
    pub timeout: Duration,
}

/// Polls `probe` (every 100 ms, backing off to 1 s) until it returns `Some`, or fails at `timeout`.
pub async fn wait_until<T, F, Fut>(
    what: &str,
    timeout: Duration,
    mut probe: F,
) -> Result<T, WaitError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut interval = Duration::from_millis(100);
    loop {
        if let Some(value) = probe().await {
            return Ok(value);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(WaitError {
                what: what.to_owned(),
                timeout,
            });
        }
        tokio::time::sleep(interval).await;
        interval = (interval * 3 / 2).min(Duration::from_secs(1));
    }
}
