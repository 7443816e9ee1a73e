//! Compare-and-set completion: commit what the provider said, for the attempt we own.
//!
//! `UPDATE … FROM unnest(…) WHERE key = k AND status = expected AND attempt_count = a`:
//! a worker whose lease expired and whose operation has since moved on (to `unknown` by
//! the sweeper, then to a new attempt) presents a stale attempt and changes nothing. The
//! same statement serves the reconciler and reviews (`unknown` → …): the caller names
//! the status it expects. Terminal statuses drop the payload and the lease.
//!
//! A definitive answer (`succeeded`, `failed_final`) that arrives after the sweeper moved
//! the same attempt from `executing` to `unknown` is a *late* answer, and the same
//! statement accepts it from `unknown` (event reason `late_answer`): one statement, one
//! [`Applied`] per item, retried as a whole, so a late answer is never lost to a second
//! round trip. An answer for another attempt is [`Applied::Stale`]. A returned row that
//! does not decode is an error, never a silent "not applied".

use super::{Journal, JournalError};
use crate::keys::IdempotencyKey;
use crate::status::{Status, transition};
use serde_json::Value;
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
    /// Throttled: the provider said "not now" and did nothing. `deferred` until
    /// `retry_in`; the attempt is not spent (`throttled_attempts` + 1).
    Deferred {
        /// A short technical code (`throttled:http_429`, `throttled:smtp_421`).
        error_code: String,
        /// Due at now + this (database clock).
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
            Verdict::Deferred { .. } => Status::Deferred,
            Verdict::Unknown { .. } => Status::Unknown,
        }
    }
}

/// The event reason of a late answer accepted from `unknown`. Callers never pass it as
/// their own reason (it is how the statement tells a late row from an on-time one).
pub const LATE_REASON: &str = "late_answer";

/// What one completion did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Applied {
    /// Applied from the expected status. `age_secs`: creation to now (database clock).
    OnTime {
        /// The operation's age in seconds: its end-to-end latency when terminal.
        age_secs: f64,
    },
    /// A definitive answer accepted from `unknown` for the same attempt (the sweeper had
    /// moved the attempt on while the provider was answering).
    Late {
        /// The operation's age in seconds.
        age_secs: f64,
    },
    /// Nothing changed: the row is at another attempt or status.
    Stale,
}

impl Applied {
    /// Whether the row changed (on time or late).
    pub fn is_applied(self) -> bool {
        !matches!(self, Applied::Stale)
    }

    /// The operation's age, when it applied.
    pub fn age_secs(self) -> Option<f64> {
        match self {
            Applied::OnTime { age_secs } | Applied::Late { age_secs } => Some(age_secs),
            Applied::Stale => None,
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

impl Completion {
    /// Whether this completion may also be accepted as a late answer from `unknown`: a
    /// definitive verdict for an attempt that was expected to be `executing`.
    fn accepts_late(&self) -> bool {
        self.expected == Status::Executing
            && matches!(
                self.verdict,
                Verdict::Succeeded { .. } | Verdict::FailedFinal { .. }
            )
    }
}

/// The statement's columns, one array per field (`unnest` turns them back into rows).
#[derive(Default)]
struct Batch {
    keys: Vec<String>,
    expected: Vec<&'static str>,
    attempts: Vec<i32>,
    to: Vec<&'static str>,
    pids: Vec<Option<String>>,
    results: Vec<Option<String>>,
    errors: Vec<Option<String>>,
    delays: Vec<Option<f64>>,
    reasons: Vec<String>,
    late_ok: Vec<bool>,
}

impl Batch {
    /// Check every move against the transition table, then lay the batch out in columns.
    fn build(cs: &[Completion]) -> Result<Self, JournalError> {
        let mut b = Batch::default();
        for c in cs {
            let target = c.verdict.status();
            if transition(Some(c.expected), target).is_none() {
                return Err(JournalError::InvalidTransition {
                    from: c.expected.to_string(),
                    to: target,
                });
            }
            let (pid, result, err, delay) = match &c.verdict {
                Verdict::Succeeded {
                    provider_operation_id,
                    result,
                } => (
                    Some(storable(provider_operation_id)),
                    Some(storable_json(result)),
                    None,
                    None,
                ),
                Verdict::FailedFinal { error_code } => {
                    (None, None, Some(storable(error_code)), None)
                }
                Verdict::FailedRetryable {
                    error_code,
                    retry_in: delay,
                }
                | Verdict::Deferred {
                    error_code,
                    retry_in: delay,
                }
                | Verdict::Unknown {
                    error_code,
                    check_in: delay,
                } => (
                    None,
                    None,
                    Some(storable(error_code)),
                    Some(delay.as_secs_f64()),
                ),
            };
            b.keys.push(c.key.as_str().to_owned());
            b.expected.push(c.expected.as_str());
            b.attempts.push(c.attempt);
            b.to.push(target.as_str());
            b.pids.push(pid);
            b.results.push(result);
            b.errors.push(err);
            b.delays.push(delay);
            b.reasons.push(c.reason.clone());
            b.late_ok.push(c.accepts_late());
        }
        Ok(b)
    }
}

/// A provider's text as Postgres can store it: `text` and `jsonb` refuse U+0000, which an
/// outside answer may well contain (an echoed field, a C string). Without this, one such
/// answer failed its whole completion batch; it becomes U+FFFD instead.
fn storable(text: &str) -> String {
    text.replace('\0', "\u{FFFD}")
}

/// [`storable`] for every string (keys included) of a JSON answer, serialized.
fn storable_json(value: &Value) -> String {
    fn clean(v: &Value) -> Value {
        match v {
            Value::String(s) => Value::String(storable(s)),
            Value::Array(items) => Value::Array(items.iter().map(clean).collect()),
            Value::Object(map) => {
                Value::Object(map.iter().map(|(k, v)| (storable(k), clean(v))).collect())
            }
            other => other.clone(),
        }
    }
    let text = value.to_string();
    // Fast path: serde_json writes U+0000 as `\u0000`; without that text there is none.
    if text.contains("\\u0000") {
        clean(value).to_string()
    } else {
        text
    }
}

/// One result per input key, in input order: a key the statement did not return is stale.
fn per_item(keys: &[String], rows: Vec<(String, f64, bool)>) -> Vec<Applied> {
    let applied: HashMap<String, Applied> = rows
        .into_iter()
        .map(|(k, age_secs, late)| {
            let a = if late {
                Applied::Late { age_secs }
            } else {
                Applied::OnTime { age_secs }
            };
            (k, a)
        })
        .collect();
    keys.iter()
        .map(|k| applied.get(k).copied().unwrap_or(Applied::Stale))
        .collect()
}

impl Journal {
    /// Apply one completion; `true` if it applied (on time or late), `false` if the row
    /// had moved on.
    pub async fn complete(&self, c: &Completion, actor: &str) -> Result<bool, JournalError> {
        Ok(self
            .complete_batch(std::slice::from_ref(c), actor)
            .await?
            .first()
            .is_some_and(|a| a.is_applied()))
    }

    /// [`Journal::complete_batch`] as one `applied` flag per input.
    pub async fn complete_many(
        &self,
        cs: &[Completion],
        actor: &str,
    ) -> Result<Vec<bool>, JournalError> {
        Ok(self
            .complete_batch(cs, actor)
            .await?
            .into_iter()
            .map(Applied::is_applied)
            .collect())
    }

    /// Apply a batch of completions in one statement; one [`Applied`] per input, in
    /// order. Keys must be distinct within a batch (one operation has one outcome).
    ///
    /// A completion this very `actor` already applied — the same attempt, status and
    /// reason, i.e. an earlier try of this batch committed and its answer was lost — is
    /// reported as applied again, not [`Applied::Stale`]: the caller still owes its
    /// outcome event and hand-off (before, a retried commit skipped them).
    pub async fn complete_batch(
        &self,
        cs: &[Completion],
        actor: &str,
    ) -> Result<Vec<Applied>, JournalError> {
        let mut applied = complete_batch_on(&self.db, cs, actor, true).await?;
        let stale: Vec<String> = cs
            .iter()
            .zip(&applied)
            .filter(|(_, a)| !a.is_applied())
            .map(|(c, _)| c.key.as_str().to_owned())
            .collect();
        if stale.is_empty() {
            return Ok(applied);
        }
        type Row = (
            String,
            String,
            i32,
            String,
            String,
            f64,
            Option<String>,
            Option<String>,
        );
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT idempotency_key, status, attempt_count, last_actor, last_reason, \
             extract(epoch FROM now() - created_at)::float8, provider_operation_id, last_error_code \
             FROM agent_operations WHERE idempotency_key = ANY($1)",
        )
        .bind(&stale)
        .fetch_all(&self.db)
        .await?;
        for (c, a) in cs.iter().zip(applied.iter_mut()) {
            if a.is_applied() {
                continue;
            }
            // Exactly this completion: its attempt, status, actor, and its provider id or
            // error code (a second, different answer for the same attempt stays refused).
            let (pid, err) = match &c.verdict {
                Verdict::Succeeded {
                    provider_operation_id,
                    ..
                } => (Some(storable(provider_operation_id)), None),
                Verdict::FailedFinal { error_code }
                | Verdict::FailedRetryable { error_code, .. }
                | Verdict::Deferred { error_code, .. }
                | Verdict::Unknown { error_code, .. } => (None, Some(storable(error_code))),
            };
            let mine = rows.iter().find(|r| {
                r.0 == c.key.as_str()
                    && r.1 == c.verdict.status().as_str()
                    && r.2 == c.attempt
                    && r.3 == actor
                    && (pid.is_none() || r.6 == pid)
                    && r.7 == err
            });
            *a = match mine {
                Some(r) if r.4 == c.reason => Applied::OnTime { age_secs: r.5 },
                Some(r) if r.4 == LATE_REASON => Applied::Late { age_secs: r.5 },
                _ => Applied::Stale,
            };
        }
        Ok(applied)
    }
}

/// The completion statement, with `$extra` assignments (ending in `, `) before the rest.
/// `o.status` in SET and WHERE is the row before the update: on time when it is the
/// expected status, late when the alternative (`unknown`, same attempt) matched.
macro_rules! complete_sql {
    ($extra:literal) => {
        concat!(
            "UPDATE agent_operations AS o SET \
             status = c.to_status, \
             provider_operation_id = coalesce(c.pid, o.provider_operation_id), \
             result_json = coalesce(c.result::jsonb, o.result_json), \
             last_error_code = c.err, \
             lease_until = CASE WHEN c.delay IS NULL THEN NULL ELSE now() + make_interval(secs => c.delay) END, \
             lease_owner = NULL, \
             payload = CASE WHEN c.to_status IN ('succeeded', 'failed_final') THEN NULL ELSE o.payload END, \
             payload_sealed = CASE WHEN c.to_status IN ('succeeded', 'failed_final') THEN NULL ELSE o.payload_sealed END, \
             payload_key_id = CASE WHEN c.to_status IN ('succeeded', 'failed_final') THEN NULL ELSE o.payload_key_id END, ",
            $extra,
            "last_actor = $9, \
             last_reason = CASE WHEN o.status = c.expected THEN c.reason ELSE $12 END, \
             updated_at = now() \
         FROM unnest($1::text[], $2::text[], $3::int4[], $4::text[], $5::text[], $6::text[], $7::text[], \
                     $8::float8[], $10::text[], $11::bool[]) \
              AS c(k, expected, attempt, to_status, pid, result, err, delay, reason, late_ok) \
         WHERE o.idempotency_key = c.k AND o.attempt_count = c.attempt \
           AND (o.status = c.expected OR (c.late_ok AND o.status = 'unknown')) \
         RETURNING o.idempotency_key, extract(epoch FROM now() - o.created_at)::float8, \
                   o.last_reason = $12 AND c.reason <> $12"
        )
    };
}

/// [`Journal::complete_batch`] on any executor: a pool, or a transaction that writes
/// something else with it (a review's evidence, journal/recheck.rs).
/// `persistent`: `false` inside an explicit transaction (the statement is unnamed; see
/// [`crate::pooler`]), `true` on the journal's [`crate::Db`] (which decides for itself).
pub(crate) async fn complete_batch_on<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    cs: &[Completion],
    actor: &str,
    persistent: bool,
) -> Result<Vec<Applied>, JournalError> {
    if cs.is_empty() {
        return Ok(Vec::new());
    }
    let b = Batch::build(cs)?;
    // Only a worker's throttled verdict writes the flow-control columns: every other
    // completion (the reconciler's, a person's) names none of them, as its role's grants
    // say (core/src/roles/grants.rs).
    let deferring = cs
        .iter()
        .any(|c| matches!(c.verdict, Verdict::Deferred { .. }));
    let sql = if deferring {
        complete_sql!(
            "throttled_attempts = o.throttled_attempts + CASE WHEN c.to_status = 'deferred' THEN 1 ELSE 0 END, \
             deferred_since = CASE WHEN c.to_status = 'deferred' THEN coalesce(o.deferred_since, now()) ELSE o.deferred_since END, "
        )
    } else {
        complete_sql!("")
    };
    let rows: Vec<(String, f64, bool)> = sqlx::query_as(sql)
        .persistent(persistent)
        .bind(&b.keys)
        .bind(&b.expected)
        .bind(&b.attempts)
        .bind(&b.to)
        .bind(&b.pids)
        .bind(&b.results)
        .bind(&b.errors)
        .bind(&b.delays)
        .bind(actor)
        .bind(&b.reasons)
        .bind(&b.late_ok)
        .bind(LATE_REASON)
        .fetch_all(executor)
        .await?;
    Ok(per_item(&b.keys, rows))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn completion(expected: Status, verdict: Verdict) -> Completion {
        Completion {
            key: IdempotencyKey::parse(&format!("v1:{}", "a".repeat(64))).expect("key"),
            expected,
            attempt: 1,
            verdict,
            reason: "r".into(),
        }
    }

    #[test]
    fn only_definitive_answers_for_an_executing_attempt_may_land_late() {
        let ok = Verdict::Succeeded {
            provider_operation_id: "p".into(),
            result: json!({}),
        };
        let rejected = Verdict::FailedFinal {
            error_code: "x".into(),
        };
        let retry = Verdict::FailedRetryable {
            error_code: "x".into(),
            retry_in: Duration::ZERO,
        };
        let unknown = Verdict::Unknown {
            error_code: "x".into(),
            check_in: Duration::ZERO,
        };
        let cases = [
            (Status::Executing, ok.clone(), true),
            (Status::Executing, rejected.clone(), true),
            (Status::Executing, retry, false),
            (Status::Executing, unknown, false),
            (Status::Unknown, ok, false),
            (Status::Unknown, rejected, false),
        ];
        for (expected, verdict, late) in cases {
            let c = completion(expected, verdict.clone());
            assert_eq!(c.accepts_late(), late, "{expected:?} {verdict:?}");
        }
    }

    #[test]
    fn one_result_per_input_in_order() {
        let keys = ["a", "b", "c"].map(String::from);
        let rows = vec![("c".into(), 2.0, true), ("a".into(), 1.0, false)];
        assert_eq!(
            per_item(&keys, rows),
            vec![
                Applied::OnTime { age_secs: 1.0 },
                Applied::Stale,
                Applied::Late { age_secs: 2.0 }
            ]
        );
    }

    #[test]
    fn a_move_outside_the_table_is_refused_before_any_sql() {
        let c = completion(
            Status::Planned,
            Verdict::FailedFinal {
                error_code: "x".into(),
            },
        );
        assert!(matches!(
            Batch::build(&[c]),
            Err(JournalError::InvalidTransition { .. })
        ));
    }
}
