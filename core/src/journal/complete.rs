//! Compare-and-set completion: commit what the provider said, for the attempt we own.
//!
//! `UPDATE … FROM unnest(…) WHERE key = k AND status = expected AND attempt_count = a`:
//! a worker whose lease expired and whose operation has since moved on (to `unknown` by
//! the sweeper, then to a new attempt) presents a stale attempt and changes nothing. The
//! same statement serves the reconciler and reviews (`unknown` → …): the caller names
//! the status it expects. Terminal statuses drop the payload and the lease.

use super::{Journal, JournalError};
use crate::keys::IdempotencyKey;
use crate::status::{Status, transition};
use serde_json::Value;
use sqlx::Row;
use std::collections::HashMap;
use std::time::Duration;

/// What happened, as the journal records it.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// The provider confirmed the effect.
    Succeeded {
        /// The provider's id.
        provider_operation_id: String,
        /// The result to return to anyone who asks again.
        result: Value,
    },
    /// Definitely rejected; never retried.
    FailedFinal {
        /// A short technical code (no payload, no personal data).
        error_code: String,
    },
    /// Definitely not done; may be claimed again after `retry_in`.
    FailedRetryable {
        /// A short technical code.
        error_code: String,
        /// Not before now + this (database clock).
        retry_in: Duration,
    },
    /// Maybe done: hand to the reconciler, first check after `check_in`.
    Unknown {
        /// A short technical code.
        error_code: String,
        /// Next reconcile check at now + this (database clock).
        check_in: Duration,
    },
}

impl Verdict {
    /// The status this verdict moves to.
    pub fn status(&self) -> Status {
        match self {
            Verdict::Succeeded { .. } => Status::Succeeded,
            Verdict::FailedFinal { .. } => Status::FailedFinal,
            Verdict::FailedRetryable { .. } => Status::FailedRetryable,
            Verdict::Unknown { .. } => Status::Unknown,
        }
    }
}

/// One compare-and-set.
#[derive(Debug, Clone)]
pub struct Completion {
    /// The operation.
    pub key: IdempotencyKey,
    /// The status it must still be in (`executing` for workers, `unknown` for settling).
    pub expected: Status,
    /// The attempt it must still be at.
    pub attempt: i32,
    /// The outcome.
    pub verdict: Verdict,
    /// The reason code recorded in the event (`provider_succeeded`, `lease_expired`, …).
    pub reason: String,
}

impl Journal {
    /// Apply one completion; `true` if it applied, `false` if the row had moved on.
    pub async fn complete(&self, c: &Completion, actor: &str) -> Result<bool, JournalError> {
        Ok(self
            .complete_many(std::slice::from_ref(c), actor)
            .await?
            .first()
            .copied()
            .unwrap_or(false))
    }

    /// Apply a batch of completions in one statement; one `applied` flag per input.
    /// Keys must be distinct within a batch (one operation has one outcome).
    pub async fn complete_many(
        &self,
        cs: &[Completion],
        actor: &str,
    ) -> Result<Vec<bool>, JournalError> {
        Ok(self
            .complete_many_aged(cs, actor)
            .await?
            .into_iter()
            .map(|a| a.is_some())
            .collect())
    }

    /// [`Journal::complete_many`], returning for each applied completion the operation's
    /// age in seconds (creation to now, database clock) — the end-to-end latency.
    pub async fn complete_many_aged(
        &self,
        cs: &[Completion],
        actor: &str,
    ) -> Result<Vec<Option<f64>>, JournalError> {
        if cs.is_empty() {
            return Ok(Vec::new());
        }
        let n = cs.len();
        let (mut keys, mut expected, mut attempts, mut to) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        let (mut pids, mut results, mut errors, mut delays, mut reasons) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        for c in cs {
            let target = c.verdict.status();
            if transition(Some(c.expected), target).is_none() {
                return Err(JournalError::InvalidTransition {
                    from: c.expected.to_string(),
                    to: target,
                });
            }
            keys.push(c.key.as_str().to_owned());
            expected.push(c.expected.as_str());
            attempts.push(c.attempt);
            to.push(target.as_str());
            reasons.push(c.reason.clone());
            let (pid, result, err, delay): (
                Option<&str>,
                Option<String>,
                Option<&str>,
                Option<f64>,
            ) = match &c.verdict {
                Verdict::Succeeded {
                    provider_operation_id,
                    result,
                } => (
                    Some(provider_operation_id),
                    Some(result.to_string()),
                    None,
                    None,
                ),
                Verdict::FailedFinal { error_code } => (None, None, Some(error_code), None),
                Verdict::FailedRetryable {
                    error_code,
                    retry_in,
                } => (None, None, Some(error_code), Some(retry_in.as_secs_f64())),
                Verdict::Unknown {
                    error_code,
                    check_in,
                } => (None, None, Some(error_code), Some(check_in.as_secs_f64())),
            };
            pids.push(pid.map(str::to_owned));
            results.push(result);
            errors.push(err.map(str::to_owned));
            delays.push(delay);
        }
        let rows = sqlx::query(
            "UPDATE agent_operations AS o SET \
                 status = c.to_status, \
                 provider_operation_id = coalesce(c.pid, o.provider_operation_id), \
                 result_json = coalesce(c.result::jsonb, o.result_json), \
                 last_error_code = c.err, \
                 lease_until = CASE WHEN c.delay IS NULL THEN NULL ELSE now() + make_interval(secs => c.delay) END, \
                 lease_owner = NULL, \
                 payload = CASE WHEN c.to_status IN ('succeeded', 'failed_final') THEN NULL ELSE o.payload END, \
                 last_actor = $9, last_reason = c.reason, updated_at = now() \
             FROM unnest($1::text[], $2::text[], $3::int4[], $4::text[], $5::text[], $6::text[], $7::text[], \
                         $8::float8[], $10::text[]) AS c(k, expected, attempt, to_status, pid, result, err, delay, reason) \
             WHERE o.idempotency_key = c.k AND o.status = c.expected AND o.attempt_count = c.attempt \
             RETURNING o.idempotency_key, extract(epoch FROM now() - o.created_at)::float8",
        )
        .bind(&keys)
        .bind(&expected)
        .bind(&attempts)
        .bind(&to)
        .bind(&pids)
        .bind(&results)
        .bind(&errors)
        .bind(&delays)
        .bind(actor)
        .bind(&reasons)
        .fetch_all(&self.pool)
        .await?;
        let applied: HashMap<String, f64> = rows
            .iter()
            .filter_map(|r| {
                Some((
                    r.try_get::<String, _>(0).ok()?,
                    r.try_get::<f64, _>(1).unwrap_or(0.0),
                ))
            })
            .collect();
        Ok(keys.iter().map(|k| applied.get(k).copied()).collect())
    }
}
