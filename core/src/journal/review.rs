//! Human review: opening, listing, resolving — and purging what retention allows.
//!
//! A review stops automation for its key (the reconciler's take and the sweeper's scan
//! skip keys with an open review). Resolving it is one transaction: the open review row is
//! locked, the operation is moved by compare-and-set from `unknown` at its current attempt,
//! and the resolution (who, when, note) is written. `retry` authorises exactly one more
//! attempt: the operation becomes `failed_retryable`, due now; the sweeper republishes it;
//! if that attempt ends unknown again, the policy applies again (for money: a new review).

use super::operation::Operation;
use super::{Journal, JournalError};
use crate::keys::IdempotencyKey;
use crate::review::{Evidence, ReviewReason};
use crate::status::Status;
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::time::Duration;

/// One review.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct Review {
    /// Sequence number.
    pub id: i64,
    /// The operation.
    pub idempotency_key: String,
    /// Why it was opened (`lookup_unsupported`, `absent_no_retry`, …).
    pub reason: String,
    /// Who opened it.
    pub opened_by: String,
    /// When.
    pub opened_at: DateTime<Utc>,
    /// `succeeded`, `failed` or `retry` once resolved.
    pub resolution: Option<String>,
    /// Who resolved it.
    pub resolved_by: Option<String>,
    /// When.
    pub resolved_at: Option<DateTime<Utc>>,
    /// The person's note (or what closed it, for `auto:*`).
    pub note: Option<String>,
    /// What the decision rests on: policy, key retention, attempts, every lookup.
    pub evidence: sqlx::types::Json<Evidence>,
    /// When the reconciler looks it up again; `None`: waiting for a person.
    pub recheck_at: Option<DateTime<Utc>>,
    /// Background lookups since it opened.
    pub rechecks: i32,
}

impl Review {
    /// The stored reason, classified ([`ReviewReason`]).
    pub fn reason(&self) -> ReviewReason {
        ReviewReason::parse(&self.reason)
    }

    /// Whether it is open and only a person can close it now: a definitive reason, or a
    /// transient one whose re-checks found something no lookup will change.
    pub fn waits_for_person(&self) -> bool {
        self.resolved_at.is_none() && self.recheck_at.is_none()
    }
}

/// The columns of [`Review`], in order.
macro_rules! review_columns {
    () => {
        "id, idempotency_key, reason, opened_by, opened_at, resolution, resolved_by, resolved_at, note, \
         evidence, recheck_at, rechecks"
    };
}
pub(crate) use review_columns;

/// Evidence with nothing in it (for [`NewReview::bare`]).
static NO_EVIDENCE: Evidence = Evidence {
    policy: None,
    max_reconcile_checks: None,
    provider: None,
    honours_key: None,
    key_retention_secs: None,
    attempts: 0,
    checks_before_review: 0,
    lookups: Vec::new(),
};

impl<'a> NewReview<'a> {
    /// A review for a person, with no evidence and no re-check (tests, tools).
    pub fn bare(reason: &'a ReviewReason) -> Self {
        Self {
            reason,
            evidence: &NO_EVIDENCE,
            lookup: None,
            recheck_in: None,
        }
    }
}

/// A review to open: why, what was seen, and when to look again (transient reasons).
#[derive(Debug, Clone)]
pub struct NewReview<'a> {
    /// Why.
    pub reason: &'a ReviewReason,
    /// What was seen so far (the lookup that opened it goes in `lookup`).
    pub evidence: &'a Evidence,
    /// The lookup that sent it here, if one was made: `(answer, code)`.
    pub lookup: Option<(&'a str, Option<&'a str>)>,
    /// First re-check after this (only for [`crate::review::ReviewClass::Transient`]
    /// reasons; `None` waits for a person).
    pub recheck_in: Option<Duration>,
}

/// A person's decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// The effect happened (e.g. found in the bank statement), with the provider's id.
    Succeeded {
        /// The provider's id.
        provider_operation_id: String,
    },
    /// It did not happen and must not: `failed_final`.
    Failed,
    /// It did not happen; try exactly once more.
    Retry,
}

impl Resolution {
    fn name(&self) -> &'static str {
        match self {
            Resolution::Succeeded { .. } => "succeeded",
            Resolution::Failed => "failed",
            Resolution::Retry => "retry",
        }
    }
}

/// Why a resolution was not applied.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// No open review for this key.
    #[error("no open review for {0}")]
    NoOpenReview(String),
    /// The operation is no longer `unknown` (settled meanwhile).
    #[error("operation {key} is {status}, not unknown: nothing to resolve")]
    NotUnknown {
        /// The key.
        key: String,
        /// Its status.
        status: Status,
    },
    /// The journal failed.
    #[error(transparent)]
    Journal(#[from] JournalError),
}

impl From<sqlx::Error> for ResolveError {
    fn from(e: sqlx::Error) -> Self {
        Self::Journal(e.into())
    }
}

/// Where an `unknown` operation goes when something settles it (a person, a statement).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Settle<'a> {
    /// The effect happened: `succeeded` with the provider's id.
    Succeeded {
        /// The provider's id.
        provider_operation_id: &'a str,
        /// The event's reason.
        reason: &'a str,
    },
    /// It did not and must not: `failed_final` with `code`.
    Failed {
        /// The error code recorded.
        code: &'a str,
        /// The event's reason.
        reason: &'a str,
    },
    /// One more attempt, due now.
    Retry,
}

/// Moves `key` from `unknown` at `attempt` by compare-and-set; `actor` is recorded with
/// the event (the trigger writes it). Returns whether the row moved.
pub(crate) async fn settle_unknown(
    conn: &mut sqlx::PgConnection,
    key: &IdempotencyKey,
    attempt: i32,
    settle: &Settle<'_>,
    actor: &str,
) -> Result<bool, sqlx::Error> {
    let (to, pid, err, reason) = match *settle {
        Settle::Succeeded {
            provider_operation_id,
            reason,
        } => ("succeeded", Some(provider_operation_id), None, reason),
        Settle::Failed { code, reason } => ("failed_final", None, Some(code), reason),
        Settle::Retry => (
            "failed_retryable",
            None,
            Some("review_retry"),
            "review_retry",
        ),
    };
    // Two statements rather than a CASE over the payload columns: an expression that
    // names a column reads it, and the review desk's role may not read payloads
    // (core/src/roles/grants.rs, DESK). A terminal move drops the payload; a retry keeps it.
    const TO_TERMINAL: &str = "UPDATE agent_operations SET status = $3, provider_operation_id = coalesce($4, provider_operation_id), \
             result_json = CASE WHEN $3 = 'succeeded' THEN jsonb_build_object('id', $4::text, 'resolved_by', $6::text) ELSE result_json END, \
             last_error_code = $5, lease_owner = NULL, lease_until = NULL, updated_at = now(), \
             payload = NULL, payload_sealed = NULL, payload_key_id = NULL, \
             last_actor = $6, last_reason = $7 \
         WHERE idempotency_key = $1 AND status = 'unknown' AND attempt_count = $2";
    const TO_RETRY: &str = "UPDATE agent_operations SET status = $3, provider_operation_id = coalesce($4, provider_operation_id), \
             last_error_code = $5, lease_owner = NULL, lease_until = now(), updated_at = now(), \
             last_actor = $6, last_reason = $7 \
         WHERE idempotency_key = $1 AND status = 'unknown' AND attempt_count = $2";
    let moved = sqlx::query(if to == "failed_retryable" {
        TO_RETRY
    } else {
        TO_TERMINAL
    })
    // Always in an explicit transaction: unnamed (crate::pooler).
    .persistent(false)
    .bind(key.as_str())
    .bind(attempt)
    .bind(to)
    .bind(pid)
    .bind(err)
    .bind(actor)
    .bind(reason)
    .execute(&mut *conn)
    .await?;
    Ok(moved.rows_affected() == 1)
}

impl Journal {
    /// Open a review for an `unknown` operation at `attempt` (no-op if one is open or
    /// the operation moved on), with its evidence and, for a transient reason, its first
    /// re-check. Records an audit event. Returns whether one was opened.
    pub async fn open_review(
        &self,
        key: &IdempotencyKey,
        attempt: i32,
        review: &NewReview<'_>,
        actor: &str,
    ) -> Result<bool, JournalError> {
        let (answer, code) = review.lookup.unzip();
        let opened: Option<i64> = sqlx::query_scalar(
            "WITH op AS (SELECT seq, idempotency_key, attempt_count FROM agent_operations \
                         WHERE idempotency_key = $1 AND status = 'unknown' AND attempt_count = $2 FOR UPDATE), \
                  ins AS (INSERT INTO operation_reviews (idempotency_key, reason, opened_by, evidence, recheck_at) \
                          SELECT idempotency_key, $3, $4, \
                                 $5::jsonb || jsonb_build_object('lookups', CASE WHEN $6::text IS NULL THEN '[]'::jsonb \
                                     ELSE jsonb_build_array(jsonb_strip_nulls(jsonb_build_object('at', now(), 'answer', $6::text, 'code', $7::text))) END), \
                                 now() + make_interval(secs => $8) \
                          FROM op ON CONFLICT DO NOTHING RETURNING id), \
                  ev AS (INSERT INTO operation_events (op_seq, idempotency_key, from_status, to_status, attempt, actor, reason, error_code) \
                         SELECT op.seq, op.idempotency_key, 'unknown', 'unknown', op.attempt_count, $4, 'review_opened', $3 FROM op, ins) \
             SELECT id FROM ins",
        )
        .bind(key.as_str())
        .bind(attempt)
        .bind(review.reason.to_string())
        .bind(actor)
        .bind(sqlx::types::Json(review.evidence))
        .bind(answer)
        .bind(code.flatten())
        .bind(review.recheck_in.map(|d| d.as_secs_f64()))
        .fetch_optional(&self.db)
        .await?;
        Ok(opened.is_some())
    }

    /// Reviews, oldest first; open ones only unless `all`.
    pub async fn reviews(&self, all: bool) -> Result<Vec<Review>, JournalError> {
        Ok(sqlx::query_as(concat!(
            "SELECT ",
            review_columns!(),
            " FROM operation_reviews WHERE $1 OR resolved_at IS NULL ORDER BY id"
        ))
        .bind(all)
        .fetch_all(&self.db)
        .await?)
    }

    /// Reviews of one operation.
    pub async fn reviews_of(&self, key: &IdempotencyKey) -> Result<Vec<Review>, JournalError> {
        Ok(sqlx::query_as(concat!(
            "SELECT ",
            review_columns!(),
            " FROM operation_reviews WHERE idempotency_key = $1 ORDER BY id"
        ))
        .bind(key.as_str())
        .fetch_all(&self.db)
        .await?)
    }

    /// Apply a person's decision (see the module docs). Returns the operation after it.
    pub async fn resolve_review(
        &self,
        key: &IdempotencyKey,
        resolution: &Resolution,
        by: &str,
        note: Option<&str>,
    ) -> Result<Operation, ResolveError> {
        let mut tx = self.db.pool().begin().await?;
        let review: Option<i64> = sqlx::query_scalar("SELECT id FROM operation_reviews WHERE idempotency_key = $1 AND resolved_at IS NULL FOR UPDATE")
            .persistent(false)
            .bind(key.as_str())
            .fetch_optional(&mut *tx)
            .await?;
        let Some(review) = review else {
            return Err(ResolveError::NoOpenReview(key.to_string()));
        };
        let (status, attempt): (String, i32) = sqlx::query_as("SELECT status, attempt_count FROM agent_operations WHERE idempotency_key = $1 FOR UPDATE")
            .persistent(false)
            .bind(key.as_str())
            .fetch_one(&mut *tx)
            .await?;
        let status: Status = status
            .parse()
            .map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
        if status != Status::Unknown {
            return Err(ResolveError::NotUnknown {
                key: key.to_string(),
                status,
            });
        }
        let actor = format!("review:{by}");
        let settle = match resolution {
            Resolution::Succeeded {
                provider_operation_id,
            } => Settle::Succeeded {
                provider_operation_id,
                reason: "review_succeeded",
            },
            Resolution::Failed => Settle::Failed {
                code: "review_failed",
                reason: "review_failed",
            },
            Resolution::Retry => Settle::Retry,
        };
        settle_unknown(&mut tx, key, attempt, &settle, &actor).await?;
        sqlx::query("UPDATE operation_reviews SET resolution = $2, resolved_by = $3, resolved_at = now(), note = $4, recheck_at = NULL WHERE id = $1")
            .persistent(false)
            .bind(review)
            .bind(resolution.name())
            .bind(by)
            .bind(note)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        self.get_without_payload(key)
            .await?
            .ok_or_else(|| ResolveError::NoOpenReview(key.to_string()))
    }

    /// Delete terminal operations (with their events and reviews) last changed before
    /// now − cutoff, where the cutoff is given per action type (callers pass at least the
    /// provider's key retention). Returns how many operations went (or would go). In
    /// steps of [`PURGE_BLOCKS`]: see [`Journal::purge_in_steps`].
    pub async fn purge(
        &self,
        cutoffs: &[(String, Duration)],
        dry_run: bool,
    ) -> Result<u64, JournalError> {
        self.purge_in_steps(cutoffs, dry_run, PURGE_BLOCKS, |_| {})
            .await
    }

    /// [`Journal::purge`], one transaction per `blocks` pages of the operations table, from
    /// its first page to its last (`progress` after each): each step reads only its pages
    /// (a TID range scan: no index says which operations are old, and none is kept for it —
    /// it would cost every action an entry), so a purge reads the table once, in small
    /// transactions that hold few locks and little memory, whatever it deletes. An
    /// operation that a concurrent update moves to a page already passed waits for the
    /// next purge; a terminal one is never updated again.
    pub async fn purge_in_steps(
        &self,
        cutoffs: &[(String, Duration)],
        dry_run: bool,
        blocks: i64,
        mut progress: impl FnMut(&PurgeStep),
    ) -> Result<u64, JournalError> {
        let blocks = blocks.max(1);
        let actions: Vec<String> = cutoffs.iter().map(|(a, _)| a.clone()).collect();
        let secs: Vec<f64> = cutoffs.iter().map(|(_, d)| d.as_secs_f64()).collect();
        let mut step = PurgeStep {
            purged: 0,
            next_block: 0,
            table_blocks: 0,
        };
        loop {
            step.table_blocks = sqlx::query_scalar(
                "SELECT pg_relation_size('agent_operations') / current_setting('block_size')::bigint",
            )
            .persistent(false)
            .fetch_one(self.db.pool())
            .await?;
            if step.next_block >= step.table_blocks {
                return Ok(step.purged);
            }
            let to = step.next_block + blocks;
            step.purged += self
                .purge_blocks((&actions, &secs), step.next_block, to, dry_run)
                .await?;
            step.next_block = to;
            progress(&step);
        }
    }

    /// One step of [`Journal::purge_in_steps`]: pages `[from, to)`.
    async fn purge_blocks(
        &self,
        (actions, secs): (&[String], &[f64]),
        from: i64,
        to: i64,
        dry_run: bool,
    ) -> Result<u64, JournalError> {
        let mut tx = self.db.pool().begin().await?;
        // Each row's place (`ctid`) too: the delete below finds the rows by it, not by a
        // descent of the primary key per row; the lock taken here keeps it from moving.
        let rows: Vec<(String, i64, String)> = sqlx::query_as(
            "SELECT o.idempotency_key, o.seq, o.ctid::text FROM agent_operations o JOIN unnest($1::text[], $2::float8[]) AS c(a, s) ON o.action_type = c.a \
             WHERE o.ctid >= format('(%s,0)', $3::bigint)::tid AND o.ctid < format('(%s,0)', $4::bigint)::tid \
               AND o.status IN ('succeeded', 'failed_final') AND o.updated_at < now() - make_interval(secs => c.s) FOR UPDATE OF o",
        )
        .persistent(false)
        .bind(actions)
        .bind(secs)
        .bind(from)
        .bind(to)
        .fetch_all(&mut *tx)
        .await?;
        if dry_run || rows.is_empty() {
            return Ok(rows.len() as u64);
        }
        let mut keys = Vec::with_capacity(rows.len());
        let mut seqs = Vec::with_capacity(rows.len());
        let mut places = Vec::with_capacity(rows.len());
        for (key, seq, place) in rows {
            keys.push(key);
            seqs.push(seq);
            places.push(place);
        }
        sqlx::query("SET LOCAL oncely.purge = 'on'")
            .persistent(false)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM operation_events WHERE op_seq = ANY($1)")
            .persistent(false)
            .bind(&seqs)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM operation_reviews WHERE idempotency_key = ANY($1)")
            .persistent(false)
            .bind(&keys)
            .execute(&mut *tx)
            .await?;
        let n = sqlx::query("DELETE FROM agent_operations WHERE ctid = ANY($1::text[]::tid[])")
            .persistent(false)
            .bind(&places)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(n)
    }
}

/// Pages of the operations table one purge transaction reads by default (8 MB; about
/// 20,000 operations at the journal's usual row size).
pub const PURGE_BLOCKS: i64 = 1_000;

/// Where a purge is ([`Journal::purge_in_steps`]).
#[derive(Debug, Clone, Copy)]
pub struct PurgeStep {
    /// Operations purged so far (with a dry run: that would be).
    pub purged: u64,
    /// The first page of the next step.
    pub next_block: i64,
    /// Pages of the operations table when this step began.
    pub table_blocks: i64,
}
