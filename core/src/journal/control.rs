//! Control before the send (docs/approvals.md): cancel, approve, reject, expire, and
//! the held list.
//!
//! Each is one compare-and-set on a state in which nothing runs and nothing was sent
//! ([`Status::STOPPABLE`], or `awaiting_approval`). A claim takes a row with the same
//! kind of statement (`ON CONFLICT DO UPDATE … WHERE status IN …`): Postgres locks the
//! row and re-checks each `WHERE` on its latest version, so when a cancel and a claim
//! race, exactly one of them changes the row and the other sees what it did. That is
//! why a cancel's answer is always true: `Cancelled` — no claim can take the row any
//! more; `TooLate` — a claim (or a settlement) got there first, and the row says how far
//! it got.

use super::operation::{Operation, select_operations, select_operations_without_payload};
use super::{Journal, JournalError};
use crate::approval::Pending;
use crate::keys::IdempotencyKey;
use crate::status::{Move, Status, transition};
use std::collections::HashSet;

/// What a cancel did.
#[derive(Debug, Clone, PartialEq)]
pub enum Cancelled {
    /// Cancelled now: it will never be sent (the row, as it is now).
    Cancelled(Box<Operation>),
    /// Too late (or already stopped): the row as it is — executing, unknown, or terminal.
    TooLate(Box<Operation>),
    /// No such operation (for this tenant).
    NotFound,
}

/// What an approval or a rejection did.
#[derive(Debug, Clone, PartialEq)]
pub enum Decided {
    /// Approved by everyone needed: due for a worker now (or at its `not_before`).
    Approved(Box<Operation>),
    /// One approval recorded; `more` different people must still approve.
    NeedsMore {
        /// The row (still `awaiting_approval`).
        op: Box<Operation>,
        /// How many more.
        more: i64,
    },
    /// Rejected: it will never be sent.
    Rejected(Box<Operation>),
    /// Not `awaiting_approval` (decided, cancelled, expired, never held): the row.
    NotHeld(Box<Operation>),
    /// The person asked for it: they may not approve it.
    OwnRequest,
    /// This person already decided on it.
    AlreadyDecided,
    /// No such operation (for this tenant).
    NotFound,
}

/// One decision on a held operation.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow, serde::Serialize)]
pub struct Approval {
    /// Who.
    pub approver: String,
    /// `approve` or `reject`.
    pub decision: String,
    /// Their note.
    pub note: Option<String>,
    /// When.
    pub at: chrono::DateTime<chrono::Utc>,
}

const STOP: &str =
    "status = ANY(ARRAY['planned', 'awaiting_approval', 'failed_retryable', 'deferred'])";

impl Journal {
    /// Cancel `key` (of `tenant`, when given) if nothing runs or was sent: see the
    /// module's docs for why the answer is always true.
    pub async fn cancel(
        &self,
        key: &IdempotencyKey,
        tenant: Option<&str>,
        actor: &str,
    ) -> Result<Cancelled, JournalError> {
        debug_assert!(transition(Some(Status::Planned), Status::Cancelled) == Some(Move::Cancel));
        debug_assert!(STOP.contains(Status::STOPPABLE[3].as_str()));
        let done: Option<String> = sqlx::query_scalar(
            "UPDATE agent_operations SET status = 'cancelled', lease_until = NULL, payload = NULL, \
                 payload_sealed = NULL, payload_key_id = NULL, last_error_code = 'cancelled', \
                 last_actor = $2, last_reason = 'cancelled', updated_at = now() \
             WHERE idempotency_key = $1 AND ($3::text IS NULL OR tenant = $3) \
               AND status = ANY(ARRAY['planned', 'awaiting_approval', 'failed_retryable', 'deferred']) \
             RETURNING idempotency_key",
        )
        .bind(key.as_str())
        .bind(actor)
        .bind(tenant)
        .fetch_optional(&self.db)
        .await?;
        let op = self.get_without_payload(key).await?;
        Ok(match op {
            Some(op) if tenant.is_none_or(|t| op.tenant.as_deref() == Some(t)) => {
                if done.is_some() {
                    Cancelled::Cancelled(Box::new(op))
                } else {
                    Cancelled::TooLate(Box::new(op))
                }
            }
            _ => Cancelled::NotFound,
        })
    }

    /// Record `approver`'s decision on a held operation, in one transaction with the
    /// move it makes: the last needed approval makes it `deferred`, due now (or at its
    /// `not_before`) — the deferred pass publishes it; a rejection makes it `rejected`.
    /// The person who asked for it may reject it, never approve it. `tenants`: the
    /// tenants the approver may decide for (`None`: all).
    pub async fn decide_approval(
        &self,
        key: &IdempotencyKey,
        approver: &str,
        approve: bool,
        note: Option<&str>,
        tenants: Option<&[String]>,
    ) -> Result<Decided, JournalError> {
        debug_assert!(
            transition(Some(Status::AwaitingApproval), Status::Deferred) == Some(Move::Approve)
        );
        debug_assert!(
            transition(Some(Status::AwaitingApproval), Status::Rejected) == Some(Move::Reject)
        );
        // Unnamed statements in an explicit transaction (crate::pooler).
        let mut tx = self.db.pool().begin().await?;
        let row: Option<(String, Option<String>, Option<String>, i16)> = sqlx::query_as(
            "SELECT status, tenant, requested_by, approvals_needed FROM agent_operations \
             WHERE idempotency_key = $1 FOR UPDATE",
        )
        .persistent(false)
        .bind(key.as_str())
        .fetch_optional(&mut *tx)
        .await?;
        let Some((status, tenant, requested_by, needed)) = row else {
            return Ok(Decided::NotFound);
        };
        let tenant = tenant.unwrap_or_default();
        if tenants.is_some_and(|t| !t.contains(&tenant)) {
            return Ok(Decided::NotFound);
        }
        if status != Status::AwaitingApproval.as_str() {
            drop(tx);
            return Ok(self
                .get_without_payload(key)
                .await?
                .map_or(Decided::NotFound, |op| Decided::NotHeld(Box::new(op))));
        }
        if approve && requested_by.as_deref() == Some(approver) {
            return Ok(Decided::OwnRequest);
        }
        let inserted = sqlx::query(
            "INSERT INTO operation_approvals (idempotency_key, approver, decision, note) \
             VALUES ($1, $2, $3, $4) ON CONFLICT (idempotency_key, approver) DO NOTHING",
        )
        .persistent(false)
        .bind(key.as_str())
        .bind(approver)
        .bind(if approve { "approve" } else { "reject" })
        .bind(note)
        .execute(&mut *tx)
        .await?;
        if inserted.rows_affected() == 0 {
            return Ok(Decided::AlreadyDecided);
        }
        let actor = format!("approver:{approver}");
        let approvals: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM operation_approvals WHERE idempotency_key = $1 AND decision = 'approve'",
        )
        .persistent(false)
        .bind(key.as_str())
        .fetch_one(&mut *tx)
        .await?;
        let more = i64::from(needed) - approvals;
        if !approve {
            sqlx::query(
                "UPDATE agent_operations SET status = 'rejected', payload = NULL, payload_sealed = NULL, \
                     payload_key_id = NULL, last_error_code = 'rejected', last_actor = $2, \
                     last_reason = 'rejected', updated_at = now() \
                 WHERE idempotency_key = $1 AND status = 'awaiting_approval'",
            )
            .persistent(false)
            .bind(key.as_str())
            .bind(&actor)
            .execute(&mut *tx)
            .await?;
        } else if more <= 0 {
            sqlx::query(
                "UPDATE agent_operations SET status = 'deferred', approved_at = now(), \
                     lease_until = greatest(now(), coalesce(not_before, now())), \
                     deferred_since = greatest(now(), coalesce(not_before, now())), \
                     last_actor = $2, last_reason = 'approved', updated_at = now() \
                 WHERE idempotency_key = $1 AND status = 'awaiting_approval'",
            )
            .persistent(false)
            .bind(key.as_str())
            .bind(&actor)
            .execute(&mut *tx)
            .await?;
        }
        // A first of two approvals moves nothing: its row above is its audit record.
        tx.commit().await?;
        let op = self
            .get_without_payload(key)
            .await?
            .ok_or(JournalError::Unavailable(sqlx::Error::RowNotFound))?;
        let op = Box::new(op);
        Ok(if !approve {
            Decided::Rejected(op)
        } else if more <= 0 {
            Decided::Approved(op)
        } else {
            Decided::NeedsMore { op, more }
        })
    }

    /// The decisions on an operation so far, oldest first.
    pub async fn approvals(&self, key: &IdempotencyKey) -> Result<Vec<Approval>, JournalError> {
        Ok(sqlx::query_as(
            "SELECT approver, decision, note, at FROM operation_approvals \
             WHERE idempotency_key = $1 ORDER BY id",
        )
        .bind(key.as_str())
        .fetch_all(&self.db)
        .await?)
    }

    /// Held operations (of `tenants`, when given), the oldest first, with their payload
    /// (for approvers; never logged).
    pub async fn held(
        &self,
        tenants: Option<&[String]>,
        limit: i64,
    ) -> Result<Vec<Operation>, JournalError> {
        Ok(sqlx::query_as(select_operations!(
            "WHERE status = 'awaiting_approval' AND ($1::text[] IS NULL OR coalesce(tenant, '') = ANY($1)) \
             ORDER BY created_at LIMIT $2"
        ))
        .bind(tenants)
        .bind(limit)
        .fetch_all(&self.db)
        .await?)
    }

    /// Held operations without their payload (the gateway's API, whose role reads none).
    pub async fn held_without_payload(
        &self,
        tenant: &str,
        limit: i64,
    ) -> Result<Vec<Operation>, JournalError> {
        Ok(sqlx::query_as(select_operations_without_payload!(
            "WHERE status = 'awaiting_approval' AND coalesce(tenant, '') = $1 \
             ORDER BY created_at LIMIT $2"
        ))
        .bind(tenant)
        .bind(limit)
        .fetch_all(&self.db)
        .await?)
    }

    /// `expired` for the live rows (among `keys`, or any) whose `expires_at` passed and
    /// that nothing runs: at most `limit`; the rows as they are now.
    pub async fn expire_due(
        &self,
        keys: Option<&[String]>,
        limit: i64,
        actor: &str,
    ) -> Result<Vec<Operation>, JournalError> {
        debug_assert!(transition(Some(Status::Deferred), Status::Expired) == Some(Move::Expire));
        let done: Vec<String> = sqlx::query_scalar(
            "WITH due AS (SELECT idempotency_key FROM agent_operations \
                 WHERE expires_at IS NOT NULL AND expires_at <= now() \
                   AND status IN ('planned', 'awaiting_approval', 'deferred', 'failed_retryable') \
                   AND ($1::text[] IS NULL OR idempotency_key = ANY($1)) \
                 ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED) \
             UPDATE agent_operations o SET status = 'expired', lease_until = NULL, payload = NULL, \
                 payload_sealed = NULL, payload_key_id = NULL, last_error_code = 'expired', \
                 last_actor = $3, last_reason = 'expired', updated_at = now() \
             FROM due WHERE o.idempotency_key = due.idempotency_key \
               AND o.status IN ('planned', 'awaiting_approval', 'deferred', 'failed_retryable') \
             RETURNING o.idempotency_key",
        )
        .bind(keys)
        .bind(limit)
        .bind(actor)
        .fetch_all(&self.db)
        .await?;
        Ok(self.get_many_by_text(&done).await?.into_values().collect())
    }

    /// `rejected` (`approval_timed_out`) for held rows whose deadline passed: at most
    /// `limit`; the rows as they are now.
    pub async fn time_out_approvals(
        &self,
        limit: i64,
        actor: &str,
    ) -> Result<Vec<Operation>, JournalError> {
        let done: Vec<String> = sqlx::query_scalar(
            "WITH due AS (SELECT idempotency_key FROM agent_operations \
                 WHERE status = 'awaiting_approval' AND approval_deadline <= now() \
                 ORDER BY approval_deadline LIMIT $1 FOR UPDATE SKIP LOCKED) \
             UPDATE agent_operations o SET status = 'rejected', payload = NULL, payload_sealed = NULL, \
                 payload_key_id = NULL, last_error_code = 'approval_timed_out', last_actor = $2, \
                 last_reason = 'approval_timed_out', updated_at = now() \
             FROM due WHERE o.idempotency_key = due.idempotency_key AND o.status = 'awaiting_approval' \
             RETURNING o.idempotency_key",
        )
        .bind(limit)
        .bind(actor)
        .fetch_all(&self.db)
        .await?;
        Ok(self.get_many_by_text(&done).await?.into_values().collect())
    }

    /// How many operations are held, and the age of the oldest (seconds), per action type.
    pub async fn held_backlog(&self) -> Result<Vec<(String, i64, f64)>, JournalError> {
        Ok(sqlx::query_as(
            "SELECT action_type, count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 \
             FROM agent_operations WHERE status = 'awaiting_approval' GROUP BY action_type",
        )
        .fetch_all(&self.db)
        .await?)
    }

    /// Of the first-contact subjects in `pending`, those written to (a succeeded
    /// operation with that subject within its rule's days): one statement for a batch.
    pub async fn known_subjects(
        &self,
        pending: &[&Pending],
    ) -> Result<HashSet<String>, JournalError> {
        if pending.is_empty() {
            return Ok(HashSet::new());
        }
        let hashes: Vec<&str> = pending.iter().map(|p| p.subject_hash.as_str()).collect();
        let days: Vec<i32> = pending
            .iter()
            .map(|p| i32::try_from(p.days).unwrap_or(i32::MAX))
            .collect();
        let known: Vec<String> = sqlx::query_scalar(
            "SELECT DISTINCT x.h FROM unnest($1::text[], $2::int4[]) AS x(h, d) \
             WHERE EXISTS (SELECT 1 FROM agent_operations o WHERE o.subject_hash = x.h \
                           AND o.status = 'succeeded' AND o.updated_at > now() - make_interval(days => x.d))",
        )
        .bind(&hashes)
        .bind(&days)
        .fetch_all(&self.db)
        .await?;
        Ok(known.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::STOP;
    use crate::status::Status;

    #[test]
    fn the_stoppable_states_are_the_status_machines() {
        for s in Status::ALL {
            assert_eq!(
                STOP.contains(&format!("'{}'", s.as_str())),
                Status::STOPPABLE.contains(&s),
                "{s}"
            );
        }
    }
}
