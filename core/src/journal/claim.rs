//! The claim: one statement that inserts-or-takes the lease, for a whole batch.
//!
//! ```sql
//! INSERT … SELECT … 'executing', attempt 1, now() + lease FROM unnest(…)
//! ON CONFLICT (idempotency_key) DO UPDATE SET status = 'executing', attempt_count + 1, …
//!   WHERE o.status IN ('planned', 'failed_retryable', 'deferred') AND (lease_until IS NULL OR lease_until <= now())
//!     AND (expires_at IS NULL OR expires_at > now())
//!     AND o.payload_hash = EXCLUDED.payload_hash AND o.action_type = EXCLUDED.action_type
//! RETURNING …
//! ```
//! Why one statement: a separate insert and update would each need a round trip and
//! (a known trap) `WITH ins AS (INSERT … DO NOTHING) UPDATE …` does not
//! work, because both parts see the same snapshot. `ON CONFLICT DO UPDATE` locks the
//! existing row and re-checks the `WHERE` on its latest version, so two workers racing
//! for one key cannot both win. Postgres refuses to update one row twice in one
//! statement, so a key repeated in a batch is folded first; its later occurrences are
//! reported as not claimed (the row is then `executing` under this very claim).
//!
//! `executing` is deliberately absent from the claimable statuses: an expired lease
//! means a worker may have died mid-call, which is an *unknown*, and only the sweeper
//! (via `unknown` and the reconciler) may move it on.
//!
//! A delivery keyed with another secret of the key ring than the row's (the intent was
//! recorded before a rotation, and repeated after it) makes the insert meet the
//! business-identity index instead of the key: the statement fails before anything is
//! committed, and the batch is claimed again with such deliveries re-keyed to their
//! rows' keys ([`Journal::claim_with`]) — the same operation, never a second one.
//!
//! A row that a purge deletes between the statement and the read of the rows it did not
//! claim is claimed again, like a delivery arriving after the purge (the rule is written
//! once, at [`super::record::PURGE_RACE_ROUNDS`]).

use super::operation::Operation;
use super::record::{Columns, PURGE_RACE_ROUNDS, bind_columns, purged_meanwhile};
use super::{Journal, JournalError};
use crate::intent::Envelope;
use crate::keys::IdempotencyKey;
use crate::status::{Move, Status, transition};
use chrono::{DateTime, Utc};
use sqlx::Row;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// One delivery to claim.
#[derive(Debug, Clone, Copy)]
pub struct ClaimRequest<'a> {
    /// The checked envelope (the row is inserted from it if the producer did not).
    pub envelope: &'a Envelope,
    /// The lease length (from the action's policy).
    pub lease: Duration,
}

/// A won claim: this worker may call the provider for `attempt` until `lease_until`.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    /// The key.
    pub key: IdempotencyKey,
    /// The attempt number: present it when completing.
    pub attempt: i32,
    /// Attempts the provider throttled (nothing sent): they do not count against
    /// `max_attempts`, so the attempts spent are `attempt - throttled`.
    pub throttled: i32,
    /// The lease's end (database clock).
    pub lease_until: DateTime<Utc>,
    /// When the first attempt of this operation started.
    pub first_attempt_at: DateTime<Utc>,
}

/// Why a delivery was not claimed: the worker decides from this without calling anyone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotClaimed {
    /// `succeeded` / `failed_final` (or stopped: `rejected`, `cancelled`, `expired`): a
    /// redelivery; the saved result stands.
    Terminal,
    /// `executing` under a live lease: its owner (maybe this very batch) has it.
    LeaseLive,
    /// `executing` with an expired lease: the sweeper turns it into `unknown`.
    LeaseExpired,
    /// `unknown`: the reconciler owns it.
    Unknown,
    /// `failed_retryable` or `deferred`, not yet due.
    NotDue,
    /// Same key, different action type or payload: refused, never executed.
    Conflict,
    /// Claimable by its status but not claimed (a concurrent change): deliver again.
    Raced,
    /// `awaiting_approval`: published again when approved; this delivery is dropped.
    Held,
    /// Claimable by its status, but its `expires_at` passed: to be `expired`, never sent.
    Expired,
}

/// The result of claiming one delivery.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimOutcome {
    /// This worker holds the lease.
    Claimed(Claim),
    /// Someone or something else owns the operation; the row as it is now.
    NotClaimed {
        /// Why.
        why: NotClaimed,
        /// The current row.
        op: Box<Operation>,
    },
    /// The journal failed after other claims of the same call had committed, before this
    /// delivery's fate was known: deliver it again (the won claims stand; see
    /// [`Journal::claim_with`]).
    Undecided,
    /// Asked to defer (no slot in the provider's budget) and deferred: `deferred` until
    /// `due` (database clock), nobody called.
    Deferred {
        /// When it is due.
        due: DateTime<Utc>,
    },
}

/// What the statement did to one first occurrence of a key.
enum Taken {
    Claimed(Claim),
    Deferred(DateTime<Utc>),
}

impl Journal {
    /// Claim a batch in one statement; one outcome per request, in order.
    pub async fn claim(
        &self,
        requests: &[ClaimRequest<'_>],
        owner: &str,
    ) -> Result<Vec<ClaimOutcome>, JournalError> {
        self.claim_with(requests, owner, || async {}).await
    }

    /// [`Journal::claim`], but the requests with `Some(wait)` in `defer` are deferred
    /// instead (`deferred`, due in `wait`; nobody calls the provider): the claim of a
    /// batch for which the provider's budget had slots for only some. The same rules as
    /// a claim decide whether a row may be taken at all; one statement does both.
    pub async fn claim_or_defer(
        &self,
        requests: &[ClaimRequest<'_>],
        defer: &[Option<Duration>],
        owner: &str,
    ) -> Result<Vec<ClaimOutcome>, JournalError> {
        self.claim_deferring(requests, defer, owner, || async {})
            .await
    }

    /// [`Journal::claim`], awaiting `between` after each claim statement and before the
    /// read of the rows it did not claim: the one window in which a purge can delete such
    /// a row. A key whose row vanished there is claimed again, as if the delivery had
    /// arrived after the purge (see [`PURGE_RACE_ROUNDS`]). Tests pass a purge as
    /// `between` to provoke that race; `claim` passes nothing.
    ///
    /// An error is returned only while no claim of this call has committed: once one
    /// has, a later failure (the read, a rerun) makes the deliveries still open
    /// [`ClaimOutcome::Undecided`] and the won claims are returned — thrown away, they
    /// would come back on a retry as this worker's own live lease and never be executed.
    pub async fn claim_with<F, Fut>(
        &self,
        requests: &[ClaimRequest<'_>],
        owner: &str,
        between: F,
    ) -> Result<Vec<ClaimOutcome>, JournalError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        self.claim_deferring(requests, &[], owner, between).await
    }

    /// [`Journal::claim_with`] with deferrals ([`Journal::claim_or_defer`]).
    async fn claim_deferring<F, Fut>(
        &self,
        requests: &[ClaimRequest<'_>],
        defer: &[Option<Duration>],
        owner: &str,
        mut between: F,
    ) -> Result<Vec<ClaimOutcome>, JournalError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        match self
            .claim_rounds(requests, defer, owner, &mut between)
            .await
        {
            Err(e) if e.is_identity_clash() => {
                // Some delivery's identity is recorded under another key (an older or
                // newer secret of the ring): claim those rows, under their own keys.
                let rows = self
                    .rows_by_identity(requests.iter().map(|r| r.envelope))
                    .await?;
                let rekeyed: Vec<Envelope> = requests
                    .iter()
                    .map(|r| match rows.get(r.envelope.key.as_str()) {
                        Some(op) => Envelope {
                            key: op.key.clone(),
                            ..r.envelope.clone()
                        },
                        None => r.envelope.clone(),
                    })
                    .collect();
                let again: Vec<ClaimRequest<'_>> = rekeyed
                    .iter()
                    .zip(requests)
                    .map(|(envelope, r)| ClaimRequest {
                        envelope,
                        lease: r.lease,
                    })
                    .collect();
                self.claim_rounds(&again, defer, owner, &mut between).await
            }
            other => other,
        }
    }

    /// The claim proper: [`PURGE_RACE_ROUNDS`] rounds of statement and read.
    async fn claim_rounds<F, Fut>(
        &self,
        requests: &[ClaimRequest<'_>],
        defer: &[Option<Duration>],
        owner: &str,
        between: &mut F,
    ) -> Result<Vec<ClaimOutcome>, JournalError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        debug_assert!(transition(Some(Status::Planned), Status::Executing) == Some(Move::Claim));
        debug_assert!(
            transition(Some(Status::FailedRetryable), Status::Executing) == Some(Move::Claim)
        );
        debug_assert!(transition(Some(Status::Deferred), Status::Executing) == Some(Move::Claim));
        debug_assert!(transition(Some(Status::Planned), Status::Deferred) == Some(Move::Defer));
        let mut out: Vec<Option<ClaimOutcome>> = vec![None; requests.len()];
        let mut todo: Vec<usize> = (0..requests.len()).collect();
        let mut won = false;
        for _ in 0..PURGE_RACE_ROUNDS {
            if todo.is_empty() {
                break;
            }
            let claimed = match self.claim_statement(requests, defer, &todo, owner).await {
                Ok(claimed) => claimed,
                Err(e) if !won => return Err(e),
                Err(e) => return Ok(undecided_after(e, out)),
            };
            // Committed: from here on these claims are reported whatever fails next.
            won |= !claimed.is_empty();
            for (i, taken) in claimed {
                out[i] = Some(match taken {
                    Taken::Claimed(claim) => ClaimOutcome::Claimed(claim),
                    Taken::Deferred(due) => ClaimOutcome::Deferred { due },
                });
            }
            between().await;
            todo = match self.read_not_claimed(requests, todo, &mut out).await {
                Ok(vanished) => vanished,
                Err(e) if !won => return Err(e),
                Err(e) => return Ok(undecided_after(e, out)),
            };
        }
        if won {
            return Ok(undecided_after(purged_meanwhile(), out));
        }
        out.into_iter()
            .collect::<Option<Vec<_>>>()
            .ok_or_else(purged_meanwhile)
    }

    /// The one statement, for the first occurrence of each key among `todo`; returns the
    /// won claims by index (into `requests`).
    async fn claim_statement(
        &self,
        requests: &[ClaimRequest<'_>],
        defer: &[Option<Duration>],
        todo: &[usize],
        owner: &str,
    ) -> Result<HashMap<usize, Taken>, JournalError> {
        let (cols, first, order) =
            Columns::first_of_each_key(todo, |i| requests[i].envelope, self.data_keys());
        let leases: Vec<f64> = order
            .iter()
            .map(|&i| requests[i].lease.as_secs_f64())
            .collect();
        let defers: Vec<Option<f64>> = order
            .iter()
            .map(|&i| defer.get(i).copied().flatten().map(|d| d.as_secs_f64()))
            .collect();
        // `ORDER BY k`: rows are locked in key order, so two workers claiming the same keys
        // (redeliveries come in any order) wait for each other instead of deadlocking.
        // A deferred row (`d` set) takes no attempt, no lease and no owner: it is `deferred`,
        // due at `now() + d`, and keeps (or starts) its `deferred_since`. A batch with
        // nothing to defer runs the plain claim, which names no flow-control column.
        let deferring = defers.iter().any(Option::is_some);
        let sql = if deferring { CLAIM_OR_DEFER } else { CLAIM };
        let query = bind_columns!(sqlx::query(sql), cols)
            .bind(&leases)
            .bind(owner);
        let query = if deferring {
            query.bind(&defers)
        } else {
            query
        };
        let rows = query.fetch_all(&self.db).await?;
        let mut claimed: HashMap<usize, Taken> = HashMap::with_capacity(rows.len());
        for row in rows {
            let key: String = row.try_get(0)?;
            let lease_until: DateTime<Utc> = row.try_get(2)?;
            let taken = if row.try_get::<bool, _>(4)? {
                Taken::Claimed(Claim {
                    key: IdempotencyKey::parse(&key).map_err(|e| sqlx::Error::Decode(e.into()))?,
                    attempt: row.try_get(1)?,
                    throttled: row.try_get(5)?,
                    lease_until,
                    first_attempt_at: row.try_get(3)?,
                })
            } else {
                Taken::Deferred(lease_until)
            };
            if let Some(&i) = first.get(key.as_str()) {
                claimed.insert(i, taken);
            }
        }
        Ok(claimed)
    }

    /// Fill `out` for the deliveries of `todo` this round did not claim (their `out` is
    /// still empty): the row as it is now, with why it was not claimed (one read for all
    /// of them). Returns the indices whose row vanished before the read (purged
    /// meanwhile), to be claimed again.
    async fn read_not_claimed(
        &self,
        requests: &[ClaimRequest<'_>],
        todo: Vec<usize>,
        out: &mut [Option<ClaimOutcome>],
    ) -> Result<Vec<usize>, JournalError> {
        let open: Vec<usize> = todo.into_iter().filter(|&i| out[i].is_none()).collect();
        let to_read: Vec<String> = open
            .iter()
            .map(|&i| requests[i].envelope.key.as_str().to_owned())
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        let current = self.get_many_by_text(&to_read).await?;
        let mut vanished = Vec::new();
        for i in open {
            let envelope = requests[i].envelope;
            match current.get(envelope.key.as_str()) {
                Some(op) => {
                    out[i] = Some(ClaimOutcome::NotClaimed {
                        why: classify(op, envelope),
                        op: Box::new(op.clone()),
                    })
                }
                None => vanished.push(i),
            }
        }
        Ok(vanished)
    }
}

/// The claim: insert-or-take the lease (see the module's docs).
const CLAIM: &str = "INSERT INTO agent_operations AS o (idempotency_key, action_type, tenant, workflow_id, step, business_object, \
         revision, payload_hash, payload, status, attempt_count, lease_until, lease_owner, first_attempt_at, \
         last_actor, last_reason, payload_sealed, payload_key_id) \
     SELECT k, a, t, w, s, b, r, h, p::jsonb, 'executing', 1, now() + make_interval(secs => l), $13, now(), $13, 'claim', ps, pk \
     FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::int8[], \
                 $8::text[], $9::text[], $10::bytea[], $11::text[], $12::float8[]) AS x(k, a, t, w, s, b, r, h, p, ps, pk, l) \
     ORDER BY k \
     ON CONFLICT (idempotency_key) DO UPDATE SET \
         status = 'executing', attempt_count = o.attempt_count + 1, lease_until = EXCLUDED.lease_until, \
         lease_owner = EXCLUDED.lease_owner, first_attempt_at = coalesce(o.first_attempt_at, EXCLUDED.first_attempt_at), \
         last_actor = EXCLUDED.last_actor, last_reason = 'claim', updated_at = now() \
     WHERE o.status IN ('planned', 'failed_retryable', 'deferred') \
       AND (o.lease_until IS NULL OR o.lease_until <= now()) \
       AND (o.expires_at IS NULL OR o.expires_at > now()) \
       AND o.payload_hash = EXCLUDED.payload_hash AND o.action_type = EXCLUDED.action_type \
     RETURNING idempotency_key, attempt_count, lease_until, first_attempt_at, true, throttled_attempts";

/// The claim of a batch some of whose deliveries are deferred instead (`$14`: seconds
/// until due, `NULL` to claim): the same rules decide whether a row may be taken.
const CLAIM_OR_DEFER: &str = "INSERT INTO agent_operations AS o (idempotency_key, action_type, tenant, workflow_id, step, business_object, \
         revision, payload_hash, payload, status, attempt_count, lease_until, lease_owner, first_attempt_at, \
         last_actor, last_reason, payload_sealed, payload_key_id, deferred_since) \
     SELECT k, a, t, w, s, b, r, h, p::jsonb, CASE WHEN d IS NULL THEN 'executing' ELSE 'deferred' END, \
         CASE WHEN d IS NULL THEN 1 ELSE 0 END, now() + make_interval(secs => coalesce(d, l)), \
         CASE WHEN d IS NULL THEN $13 END, CASE WHEN d IS NULL THEN now() END, $13, \
         CASE WHEN d IS NULL THEN 'claim' ELSE 'no_budget' END, ps, pk, CASE WHEN d IS NOT NULL THEN now() END \
     FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::int8[], \
                 $8::text[], $9::text[], $10::bytea[], $11::text[], $12::float8[], $14::float8[]) \
          AS x(k, a, t, w, s, b, r, h, p, ps, pk, l, d) \
     ORDER BY k \
     ON CONFLICT (idempotency_key) DO UPDATE SET \
         status = EXCLUDED.status, attempt_count = o.attempt_count + EXCLUDED.attempt_count, \
         lease_until = EXCLUDED.lease_until, lease_owner = EXCLUDED.lease_owner, \
         first_attempt_at = coalesce(o.first_attempt_at, EXCLUDED.first_attempt_at), \
         deferred_since = CASE WHEN EXCLUDED.status = 'deferred' THEN coalesce(o.deferred_since, now()) ELSE o.deferred_since END, \
         last_actor = EXCLUDED.last_actor, last_reason = EXCLUDED.last_reason, updated_at = now() \
     WHERE o.status IN ('planned', 'failed_retryable', 'deferred') \
       AND (o.lease_until IS NULL OR o.lease_until <= now()) \
       AND (o.expires_at IS NULL OR o.expires_at > now()) \
       AND o.payload_hash = EXCLUDED.payload_hash AND o.action_type = EXCLUDED.action_type \
     RETURNING idempotency_key, attempt_count, lease_until, first_attempt_at, status = 'executing', throttled_attempts";

/// The outcomes once a claim of the call has committed and `error` stopped the rest:
/// every delivery not yet decided is [`ClaimOutcome::Undecided`].
fn undecided_after(error: JournalError, out: Vec<Option<ClaimOutcome>>) -> Vec<ClaimOutcome> {
    let open = out.iter().filter(|o| o.is_none()).count();
    if open > 0 {
        tracing::warn!(error = %error, open, "journal failed after a committed claim; the won claims stand, the rest are delivered again");
    }
    out.into_iter()
        .map(|o| o.unwrap_or(ClaimOutcome::Undecided))
        .collect()
}

/// Why an existing row was not claimed for this envelope.
fn classify(op: &Operation, envelope: &Envelope) -> NotClaimed {
    if op.payload_hash != envelope.payload_hash.as_str()
        || op.action_type != envelope.intent.identity.action_type.as_str()
    {
        return NotClaimed::Conflict;
    }
    match op.status {
        s if s.is_terminal() => NotClaimed::Terminal,
        Status::AwaitingApproval => NotClaimed::Held,
        Status::Planned | Status::FailedRetryable | Status::Deferred
            if op.expires_at.is_some_and(|t| t <= op.read_at) =>
        {
            NotClaimed::Expired
        }
        Status::Executing if op.lease_live => NotClaimed::LeaseLive,
        Status::Executing => NotClaimed::LeaseExpired,
        Status::Unknown => NotClaimed::Unknown,
        Status::FailedRetryable | Status::Deferred if op.lease_live => NotClaimed::NotDue,
        _ => NotClaimed::Raced,
    }
}
