//! Waiting on conditions with deadlines; a timeout fails the test with the server logs attached.

use std::future::Future;
use std::time::Duration;

use super::env;

/// Polls `probe` until it returns `Some`; panics after `timeout` with `what`, the last
/// observation and the tails of the server logs.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    wait_for_with_logs(what, timeout, || server_logs(80), probe).await
}

/// [`wait_for`] with other logs on timeout (e.g. of servers a test started itself).
pub async fn wait_for_with_logs<T, F, Fut>(
    what: &str,
    timeout: Duration,
    logs: impl Fn() -> String,
    mut probe: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut interval = Duration::from_millis(100);
    loop {
        let last = match probe().await {
            Ok(value) => return value,
            Err(observed) => observed,
        };
        if tokio::time::Instant::now() >= deadline {
            panic!(
                "timed out after {timeout:?} waiting for {what}\nlast observed: {last}\n{}",
                logs()
            );
        }
        tokio::time::sleep(interval).await;
        interval = (interval * 3 / 2).min(Duration::from_secs(1));
    }
}

/// Tails of every log the sandbox keeps (servers and pods), for failure messages.
pub fn server_logs(lines: usize) -> String {
    let env = env();
    let mut logs: Vec<std::path::PathBuf> = std::fs::read_dir(&env.logs_dir)
        .map(|dir| dir.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    logs.sort();
    logs.iter()
        .map(|log| {
            format!(
                "===== {} =====\n{}\n",
                log.display(),
                twc_sandbox::process::tail(log, lines)
            )
        })
        .collect()
}
