//! What the sweeper's deferred pass asks of the journal: `deferred` operations that are
//! due (republished, so a worker claims them), and those whose patience ran out (given up).
//!
//! Why a pass of its own, on a short timer: a deferred operation is due at the slot the
//! provider's budget promised it; republished five seconds late (the sweeper's interval),
//! a provider limited to 50 requests a second would see bursts and gaps instead of its
//! rate. The scans read the clocks index (`status, lease_until`), so a pass costs the rows
//! that are due, not the backlog: a million deferred rows for one slow provider are a
//! million index entries that no pass reads before they are due.

use super::operation::Operation;
use super::{Journal, JournalError};
use crate::status::{Move, Status, transition};
use std::time::Duration;

impl Journal {
    /// `deferred` rows of `action_types` that are due, oldest due first, at most `limit`:
    /// their `updated_at` is bumped, so a row already republished since it became due is
    /// taken again only after `after` (a lost message heals; a delivered one is not
    /// published twice).
    pub async fn take_due_deferred(
        &self,
        action_types: &[String],
        after: Duration,
        limit: i64,
    ) -> Result<Vec<Operation>, JournalError> {
        let keys: Vec<String> = sqlx::query_scalar(
            "WITH due AS (SELECT idempotency_key FROM agent_operations \
                 WHERE status = 'deferred' AND lease_until <= now() AND action_type = ANY($3::text[]) \
                   AND (updated_at <= lease_until OR updated_at < now() - make_interval(secs => $1)) \
                 ORDER BY lease_until LIMIT $2 FOR UPDATE SKIP LOCKED) \
             UPDATE agent_operations o SET updated_at = now() FROM due \
             WHERE o.idempotency_key = due.idempotency_key RETURNING o.idempotency_key",
        )
        .bind(after.as_secs_f64())
        .bind(limit)
        .bind(action_types)
        .fetch_all(&self.db)
        .await?;
        Ok(self
            .get_many_by_text(&keys)
            .await?
            .into_values()
            .filter(|op| op.status == Status::Deferred)
            .collect())
    }

    /// Give up the `deferred` rows deferred for longer than their action type's
    /// `max_defer` (`patience`: action type → max_defer; `default` for the others), due
    /// or not: `failed_final` with `deferred_too_long`, payload dropped. Never sent, so
    /// never unknown. At most `limit`, the longest-deferred first (read on the partial
    /// index of deferred rows by `deferred_since`); returns the rows as they are now.
    pub async fn give_up_deferred(
        &self,
        patience: &[(String, Duration)],
        default: Duration,
        limit: i64,
        actor: &str,
    ) -> Result<Vec<Operation>, JournalError> {
        debug_assert!(
            transition(Some(Status::Deferred), Status::FailedFinal) == Some(Move::GiveUp)
        );
        let types: Vec<&str> = patience.iter().map(|(t, _)| t.as_str()).collect();
        let limits: Vec<f64> = patience.iter().map(|(_, d)| d.as_secs_f64()).collect();
        let keys: Vec<String> = sqlx::query_scalar(
            "WITH due AS (SELECT o.idempotency_key FROM agent_operations o \
                 LEFT JOIN unnest($1::text[], $2::float8[]) AS p(a, m) ON p.a = o.action_type \
                 WHERE o.status = 'deferred' \
                   AND o.deferred_since < now() - make_interval(secs => $6) \
                   AND o.deferred_since < now() - make_interval(secs => coalesce(p.m, $3)) \
                 ORDER BY o.deferred_since LIMIT $4 FOR UPDATE OF o SKIP LOCKED) \
             UPDATE agent_operations o SET status = 'failed_final', last_error_code = 'deferred_too_long', \
                 lease_until = NULL, payload = NULL, payload_sealed = NULL, payload_key_id = NULL, \
                 last_actor = $5, last_reason = 'deferred_too_long', updated_at = now() \
             FROM due WHERE o.idempotency_key = due.idempotency_key AND o.status = 'deferred' \
             RETURNING o.idempotency_key",
        )
        .bind(&types)
        .bind(&limits)
        .bind(default.as_secs_f64())
        .bind(limit)
        .bind(actor)
        // The shortest patience: the index's range; each row is then held to its own.
        .bind(limits.iter().copied().fold(default.as_secs_f64(), f64::min))
        .fetch_all(&self.db)
        .await?;
        Ok(self.get_many_by_text(&keys).await?.into_values().collect())
    }

    /// Per action type: how many operations are `deferred`, and how long the oldest has
    /// been waiting since it was first deferred (seconds). Read on the partial index of
    /// deferred rows: the cost is the backlog's size, counted every sweep.
    pub async fn deferred_backlog(&self) -> Result<Vec<(String, i64, f64)>, JournalError> {
        Ok(sqlx::query_as(
            "SELECT action_type, count(*), coalesce(extract(epoch FROM now() - min(deferred_since)), 0)::float8 \
             FROM agent_operations WHERE status = 'deferred' GROUP BY action_type",
        )
        .fetch_all(&self.db)
        .await?)
    }
}
