//! Aggregate reads over the whole journal: counts by status, the database clock, and the
//! latency split of succeeded operations. The demo, the bench and the tests read the
//! journal through these instead of writing their own SQL, so a schema change has one
//! place to follow. The counts scan the table: fine for a demo or a test, not for a hot
//! path (the workers never call them). The reads of a given list of keys
//! ([`Journal::succeeded_among`], [`Journal::last_update`],
//! [`Journal::succeeded_latencies`]) go through the primary key, so the bench reads only
//! its own run's operations and costs the same on a journal of any size.

use super::{Journal, JournalError};
use crate::status::Status;
use chrono::{DateTime, Utc};

/// How long succeeded operations took, in milliseconds, each list sorted ascending.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Latencies {
    /// Recorded (`created_at`) → succeeded (`updated_at`).
    pub total_ms: Vec<f64>,
    /// Recorded → first claimed (`first_attempt_at`).
    pub to_claim_ms: Vec<f64>,
    /// First claimed → succeeded.
    pub claim_to_done_ms: Vec<f64>,
}

impl Journal {
    /// How many operations are in `status`.
    pub async fn count_in(&self, status: Status) -> Result<i64, JournalError> {
        Ok(
            sqlx::query_scalar("SELECT count(*) FROM agent_operations WHERE status = $1")
                .bind(status.as_str())
                .fetch_one(&self.db)
                .await?,
        )
    }

    /// `(status, count)` for every status that has operations, in status order.
    pub async fn count_by_status(&self) -> Result<Vec<(String, i64)>, JournalError> {
        Ok(sqlx::query_as(
            "SELECT status, count(*) FROM agent_operations GROUP BY status ORDER BY status",
        )
        .fetch_all(&self.db)
        .await?)
    }

    /// The database's clock (`clock_timestamp()`), the clock every journal time is on.
    pub async fn clock(&self) -> Result<DateTime<Utc>, JournalError> {
        Ok(sqlx::query_scalar("SELECT clock_timestamp()")
            .fetch_one(&self.db)
            .await?)
    }

    /// Of `keys`, those whose operation is `succeeded` (a primary-key lookup each).
    pub async fn succeeded_among(&self, keys: &[String]) -> Result<Vec<String>, JournalError> {
        Ok(sqlx::query_scalar(
            "SELECT idempotency_key FROM agent_operations \
             WHERE idempotency_key = ANY($1) AND status = 'succeeded'",
        )
        .bind(keys)
        .fetch_all(&self.db)
        .await?)
    }

    /// The latest `updated_at` of the operations of `keys` (`None` if none is recorded).
    pub async fn last_update(
        &self,
        keys: &[String],
    ) -> Result<Option<DateTime<Utc>>, JournalError> {
        Ok(sqlx::query_scalar(
            "SELECT max(updated_at) FROM agent_operations WHERE idempotency_key = ANY($1)",
        )
        .bind(keys)
        .fetch_one(&self.db)
        .await?)
    }

    /// The latency split of the succeeded operations among `keys`.
    pub async fn succeeded_latencies(&self, keys: &[String]) -> Result<Latencies, JournalError> {
        let rows: Vec<(f64, Option<f64>, Option<f64>)> = sqlx::query_as(
            "SELECT (extract(epoch FROM updated_at - created_at) * 1000)::float8, \
                    (extract(epoch FROM first_attempt_at - created_at) * 1000)::float8, \
                    (extract(epoch FROM updated_at - first_attempt_at) * 1000)::float8 \
             FROM agent_operations WHERE idempotency_key = ANY($1) AND status = 'succeeded'",
        )
        .bind(keys)
        .fetch_all(&self.db)
        .await?;
        let mut l = Latencies::default();
        for (total, to_claim, to_done) in rows {
            l.total_ms.push(total);
            l.to_claim_ms.extend(to_claim);
            l.claim_to_done_ms.extend(to_done);
        }
        for v in [&mut l.total_ms, &mut l.to_claim_ms, &mut l.claim_to_done_ms] {
            v.sort_by(f64::total_cmp);
        }
        Ok(l)
    }
}
