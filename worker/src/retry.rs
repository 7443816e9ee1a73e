//! Retrying journal calls through database trouble (backon), without losing work.
//!
//! Only errors the journal marks retryable (connection lost, pool timeout, backend
//! terminated) are retried, with exponential backoff capped at a few seconds, until
//! `give_up_after` passes. What a caller does when it gives up keeps work safe: deliveries
//! go back to the queue (the claim dedupes the redelivery), leases expire into `unknown`.

use backon::{ExponentialBuilder, Retryable};
use oncely_core::journal::JournalError;
use std::future::Future;
use std::time::Duration;

/// Call `f` until it succeeds, fails for good, or `give_up_after` has passed.
pub async fn journal<T, F, Fut>(
    what: &'static str,
    give_up_after: Duration,
    f: F,
) -> Result<T, JournalError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, JournalError>>,
{
    let backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(50))
        .with_max_delay(Duration::from_secs(3))
        .with_jitter()
        .with_total_delay(Some(give_up_after))
        .without_max_times();
    f.retry(backoff)
        .when(JournalError::is_retryable)
        .notify(|e, d| tracing::warn!(statement = what, error = %e, retry_in = ?d, "journal unavailable; retrying"))
        .await
}
