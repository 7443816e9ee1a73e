//! Aggregate reads over the whole journal: counts by status, the database clock, and the
//! latency split of succeeded operations. The demo, the bench and the tests read the
//! journal through these instead of writing their own SQL, so a schema change has one
//! place to follow. They scan the table: fine for a demo or a measurement, not for a hot
//! path (the workers never call them).

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

    /// The latest `updated_at` of any operation (`None` on an empty journal).
    pub async fn last_update(&self) -> Result<Option<DateTime<Utc>>, JournalError> {
        Ok(
            sqlx::query_scalar("SELECT max(updated_at) FROM agent_operations")
                .fetch_one(&self.db)
                .await?,
        )
    }

    /// The latency split of every succeeded operation recorded at or after `since` (all
    /// of them with `None`).
    pub async fn succeeded_latencies(
        &self,
        since: Option<DateTime<Utc>>,
    ) -> Result<Latencies, JournalError> {
        let rows: Vec<(f64, Option<f64>, Option<f64>)> = sqlx::query_as(
            "SELECT (extract(epoch FROM updated_at - created_at) * 1000)::float8, \
                    (extract(epoch FROM first_attempt_at - created_at) * 1000)::float8, \
                    (extract(epoch FROM updated_at - first_attempt_at) * 1000)::float8 \
             FROM agent_operations WHERE status = 'succeeded' \
               AND ($1::timestamptz IS NULL OR created_at >= $1)",
        )
        .bind(since)
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
