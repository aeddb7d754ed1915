//! Optimistic concurrency: read, modify, write with the read's resourceVersion, and start over
//! when someone else wrote in between.

use std::future::Future;

use super::error::{K8sError, ObjectName, is_conflict};

/// Writes tried before giving up on an object others keep changing.
pub const MAX_ATTEMPTS: u32 = 5;

/// Runs `attempt` again while it fails with a 409 Conflict, at most [`MAX_ATTEMPTS`] times.
pub async fn retry_on_conflict<T, F, Fut>(
    verb: &'static str,
    object: &ObjectName,
    mut attempt: F,
) -> Result<T, K8sError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, K8sError>>,
{
    for number in 1..=MAX_ATTEMPTS {
        match attempt().await {
            Err(K8sError::Api { source, .. }) if is_conflict(&source) => {
                tracing::debug!(%object, verb, attempt = number, "write conflicted; re-reading");
            }
            other => return other,
        }
    }
    Err(K8sError::Conflict {
        verb,
        object: object.clone(),
        attempts: MAX_ATTEMPTS,
    })
}
