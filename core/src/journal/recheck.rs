//! Reviews that a lookup may still settle: the reconciler's background re-checks, and the
//! review figures its metrics report.
//!
//! A review opened for a transient reason ([`crate::review::ReviewClass::Transient`])
//! has a `recheck_at`. A reconciler *takes* due ones the way it takes unknowns — one
//! statement, `FOR UPDATE SKIP LOCKED`, pushing `recheck_at` by a check lease — so two
//! reconcilers never look the same review up at once, and a reconciler that dies
//! mid-lookup leaves the review due again after the lease. A re-check only looks up:
//! it either settles the operation (the review then closes itself, `auto:lookup`, by the
//! trigger of migration `20261209000000_review_evidence.sql`), schedules the next
//! lookup, or stops re-checking (`recheck_at` NULL) and leaves the review to a person.
//! Every lookup is appended to the review's evidence.

use super::complete::{Completion, complete_batch_on};
use super::operation::Operation;
use super::review::review_columns;
use super::{Journal, JournalError, Review};
use crate::review::ReviewReason;
use std::time::Duration;

/// Appends one lookup (`$2` answer, `$3` code, database clock) to a review's evidence.
macro_rules! append_lookup {
    () => {
        "evidence = jsonb_set(evidence, '{lookups}', coalesce(evidence -> 'lookups', '[]'::jsonb) \
             || jsonb_build_array(jsonb_strip_nulls(jsonb_build_object('at', now(), 'answer', $2::text, 'code', $3::text))))"
    };
}

/// One lookup's answer as a review records it: `(answer, code)`, e.g.
/// `("failed", Some("http_503"))`.
pub type LookupSeen<'a> = (&'a str, Option<&'a str>);

/// A review taken for a re-check, with its operation.
#[derive(Debug, Clone)]
pub struct DueReview {
    /// The review.
    pub review: Review,
    /// Its operation (`unknown`).
    pub op: Operation,
}

impl DueReview {
    /// Why it was opened.
    pub fn reason(&self) -> ReviewReason {
        self.review.reason()
    }
}

/// A closed review counted for the metrics.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct ClosedReview {
    /// The operation.
    pub idempotency_key: String,
    /// Why it had been opened (stored text).
    pub reason: String,
    /// How it closed (`auto:lookup`, `succeeded`, …).
    pub resolution: String,
}

/// The open reviews' figures for the gauges.
#[derive(Debug, Clone, Copy, PartialEq, Default, sqlx::FromRow)]
pub struct OpenReviews {
    /// Open and waiting for a person.
    pub for_person: i64,
    /// Open and still re-checked by lookups.
    pub for_lookup: i64,
    /// Age in seconds of the oldest waiting for a person (0 when none).
    pub oldest_for_person_secs: f64,
    /// Age in seconds of the oldest still re-checked (0 when none).
    pub oldest_for_lookup_secs: f64,
}

impl Journal {
    /// Take open reviews whose re-check is due, at most `limit`, in one statement: each
    /// gets `recheck_at` pushed by `check_lease` and its `rechecks` counted, so no other
    /// reconciler takes it meanwhile. Reviews whose operation is no longer `unknown` are
    /// left out (the trigger closes a review when its operation settles, so there are
    /// none unless someone edited rows by hand).
    pub async fn take_due_reviews(
        &self,
        check_lease: Duration,
        limit: i64,
    ) -> Result<Vec<DueReview>, JournalError> {
        let reviews: Vec<Review> = sqlx::query_as(concat!(
            "WITH due AS ( \
                 SELECT id AS due_id FROM operation_reviews \
                 WHERE resolved_at IS NULL AND recheck_at <= now() \
                 ORDER BY recheck_at LIMIT $2 FOR UPDATE SKIP LOCKED) \
             UPDATE operation_reviews r SET recheck_at = now() + make_interval(secs => $1), \
                 rechecks = r.rechecks + 1 \
             FROM due WHERE r.id = due.due_id AND r.resolved_at IS NULL \
             RETURNING ",
            review_columns!()
        ))
        .bind(check_lease.as_secs_f64())
        .bind(limit)
        .fetch_all(&self.db)
        .await?;
        let keys: Vec<String> = reviews.iter().map(|r| r.idempotency_key.clone()).collect();
        let mut ops = self.get_many_by_text(&keys).await?;
        Ok(reviews
            .into_iter()
            .filter_map(|review| {
                let op = ops.remove(&review.idempotency_key)?;
                (op.status == crate::Status::Unknown).then_some(DueReview { review, op })
            })
            .collect())
    }

    /// Record a re-check's lookup that did not settle the operation: look again after
    /// `next_in`, or (`None`) stop re-checking — the review waits for a person. Returns
    /// whether the review was still open.
    pub async fn record_recheck(
        &self,
        review_id: i64,
        seen: LookupSeen<'_>,
        next_in: Option<Duration>,
    ) -> Result<bool, JournalError> {
        let n = sqlx::query(concat!(
            "UPDATE operation_reviews SET ",
            append_lookup!(),
            ", recheck_at = now() + make_interval(secs => $4) \
             WHERE id = $1 AND resolved_at IS NULL"
        ))
        .bind(review_id)
        .bind(seen.0)
        .bind(seen.1)
        .bind(next_in.map(|d| d.as_secs_f64()))
        .execute(&self.db)
        .await?
        .rows_affected();
        Ok(n == 1)
    }

    /// A re-check's lookup settled the operation: in one transaction, append the lookup
    /// to the review's evidence and apply `c` (compare-and-set from `unknown` at its
    /// attempt), which closes the review (`auto:lookup`, with its event). Returns whether
    /// the operation moved; if it did not (settled meanwhile), nothing is written.
    pub async fn settle_reviewed(
        &self,
        review_id: i64,
        seen: LookupSeen<'_>,
        c: &Completion,
        actor: &str,
    ) -> Result<bool, JournalError> {
        let mut tx = self.db.pool().begin().await?;
        let open = sqlx::query(concat!(
            "UPDATE operation_reviews SET ",
            append_lookup!(),
            " WHERE id = $1 AND resolved_at IS NULL"
        ))
        .persistent(false)
        .bind(review_id)
        .bind(seen.0)
        .bind(seen.1)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        let moved = open
            && complete_batch_on(&mut *tx, std::slice::from_ref(c), actor, false)
                .await?
                .first()
                .is_some_and(|a| a.is_applied());
        if moved {
            tx.commit().await?;
        }
        Ok(moved)
    }

    /// Closed reviews no reconciler has counted yet, at most `limit`, marked counted in
    /// the same statement (`SKIP LOCKED`): each closing — by a person (CLI or review
    /// desk), a statement import, a worker's late answer or a lookup — is counted once
    /// across the fleet, and the closings nobody published an outcome for (a person's,
    /// a statement's) are published by the reconciler that counted them.
    pub async fn count_closed_reviews(
        &self,
        limit: i64,
    ) -> Result<Vec<ClosedReview>, JournalError> {
        Ok(sqlx::query_as(
            "WITH due AS ( \
                 SELECT id FROM operation_reviews WHERE resolved_at IS NOT NULL AND counted_at IS NULL \
                 ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED) \
             UPDATE operation_reviews r SET counted_at = now() FROM due WHERE r.id = due.id \
             RETURNING r.idempotency_key, r.reason, r.resolution",
        )
        .bind(limit)
        .fetch_all(&self.db)
        .await?)
    }

    /// How many reviews are open, for whom, and how old the oldest of each are.
    pub async fn open_reviews(&self) -> Result<OpenReviews, JournalError> {
        Ok(sqlx::query_as(
            "SELECT count(*) FILTER (WHERE recheck_at IS NULL) AS for_person, \
                    count(*) FILTER (WHERE recheck_at IS NOT NULL) AS for_lookup, \
                    coalesce(extract(epoch FROM now() - min(opened_at) FILTER (WHERE recheck_at IS NULL)), 0)::float8 \
                        AS oldest_for_person_secs, \
                    coalesce(extract(epoch FROM now() - min(opened_at) FILTER (WHERE recheck_at IS NOT NULL)), 0)::float8 \
                        AS oldest_for_lookup_secs \
             FROM operation_reviews WHERE resolved_at IS NULL",
        )
        .fetch_one(&self.db)
        .await?)
    }
}
