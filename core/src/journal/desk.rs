//! The review desk's reads: open reviews with their operations, filtered the way a person
//! works through them. Without payloads (the desk's role may not read them); a person
//! decides on the timeline, the evidence and the saved result.

use super::{Journal, JournalError, Review};
use chrono::{DateTime, Utc};
use std::time::Duration;

/// Which open reviews to list.
#[derive(Debug, Clone, Default)]
pub struct DeskFilter {
    /// Only these action types (`None`: any).
    pub action_types: Option<Vec<String>>,
    /// Only these tenants (`None`: any; an operation without a tenant is `""`).
    pub tenants: Option<Vec<String>>,
    /// Only reviews opened at least this long ago.
    pub older_than: Option<Duration>,
    /// `Some(true)`: only those waiting for a person; `Some(false)`: only those still
    /// being re-checked; `None`: both.
    pub for_person: Option<bool>,
    /// At most this many rows.
    pub limit: i64,
}

/// An open review with what the list shows of its operation.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct DeskRow {
    /// The review.
    #[sqlx(flatten)]
    pub review: Review,
    /// The operation's action type.
    pub action_type: String,
    /// Its tenant, if any.
    pub tenant: Option<String>,
    /// Its status now.
    pub status: String,
    /// Its attempts.
    pub attempt_count: i32,
    /// The database's clock when read (for ages).
    pub read_at: DateTime<Utc>,
}

impl Journal {
    /// Open reviews matching `filter`, oldest first.
    pub async fn desk_reviews(&self, filter: &DeskFilter) -> Result<Vec<DeskRow>, JournalError> {
        // The review's columns are those of `review_columns!`, prefixed.
        Ok(sqlx::query_as(
            "SELECT r.id, r.idempotency_key, r.reason, r.opened_by, r.opened_at, r.resolution, r.resolved_by, \
             r.resolved_at, r.note, r.evidence, r.recheck_at, r.rechecks, \
             o.action_type, o.tenant, o.status, o.attempt_count, now() AS read_at \
             FROM operation_reviews r JOIN agent_operations o USING (idempotency_key) \
             WHERE r.resolved_at IS NULL \
               AND ($1::text[] IS NULL OR o.action_type = ANY($1)) \
               AND ($2::text[] IS NULL OR coalesce(o.tenant, '') = ANY($2)) \
               AND ($3::float8 IS NULL OR r.opened_at <= now() - make_interval(secs => $3)) \
               AND ($4::bool IS NULL OR $4 = (r.recheck_at IS NULL)) \
             ORDER BY r.opened_at, r.id LIMIT $5",
        )
        .bind(filter.action_types.as_deref())
        .bind(filter.tenants.as_deref())
        .bind(filter.older_than.map(|d| d.as_secs_f64()))
        .bind(filter.for_person)
        .bind(filter.limit)
        .fetch_all(&self.db)
        .await?)
    }

    /// The tenants with open reviews, among `allowed` (`None`: all), for the desk's
    /// filter (`""` for operations without a tenant).
    pub async fn desk_tenants(
        &self,
        allowed: Option<&[String]>,
    ) -> Result<Vec<String>, JournalError> {
        Ok(sqlx::query_scalar(
            "SELECT DISTINCT coalesce(o.tenant, '') AS t FROM operation_reviews r \
             JOIN agent_operations o USING (idempotency_key) \
             WHERE r.resolved_at IS NULL AND ($1::text[] IS NULL OR coalesce(o.tenant, '') = ANY($1)) ORDER BY t",
        )
        .bind(allowed)
        .fetch_all(&self.db)
        .await?)
    }
}
