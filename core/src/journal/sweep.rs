//! What the sweeper and the reconciler ask of the journal.
//!
//! Every scan takes rows with `FOR UPDATE SKIP LOCKED` in bounded batches, so several
//! reconcilers sweep side by side without waiting on or colliding with each other, and
//! every forced transition goes through the trigger's event row with a reason code.
//!
//! For an `unknown` operation, `lease_until` is the time its next check is due. A
//! reconciler *takes* an unknown (one statement: due, no open review → push the due time
//! by a check lease and count the check) before asking the provider, so two reconcilers
//! never decide the same operation: the second finds it not due and moves on.

use super::operation::{Operation, select_operations};
use super::{Journal, JournalError};
use crate::keys::IdempotencyKey;
use crate::status::{Move, Status, transition};
use sqlx::Row;
use std::time::Duration;

// The row selections of the three scans, as macros so that each statement below is one
// literal (`concat!`) and the bench can time the very same text ([`SCANS`]).

/// `executing` with an expired lease, oldest first. `$1`: limit; `$3`: seconds back from
/// now that the lease expired at most (`NULL`: any time — a full pass; see [`Since`]).
macro_rules! expired_leases {
    () => {
        "SELECT idempotency_key FROM agent_operations \
         WHERE status = 'executing' AND lease_until < now() \
           AND lease_until >= COALESCE(now() - make_interval(secs => $3), '-infinity') \
         ORDER BY lease_until LIMIT $1 FOR UPDATE SKIP LOCKED"
    };
}

/// Due for republishing. Two ordered, limited scans, each on its own index — `planned` by
/// `updated_at` on the partial index `agent_operations_planned_idx`, `failed_retryable` by
/// `lease_until` on `agent_operations_clocks_idx` — so the cost is the rows taken, not the
/// live rows sorted (one `OR` over both needed a bitmap scan and a sort of every candidate).
/// The second runs only if the first brought fewer than `$2` (the outer `LIMIT` stops the
/// `Append`), so at most `$2` rows are locked. `$1`: seconds untouched, `$2`: limit, `$3`:
/// for `planned`, seconds back from when it became due at most (`NULL`: any time; see
/// [`Since`]). `failed_retryable` is always read whole: few rows ever pass through it.
macro_rules! republish {
    () => {
        "WITH p AS (SELECT idempotency_key FROM agent_operations \
             WHERE status = 'planned' AND updated_at < now() - make_interval(secs => $1) \
               AND updated_at >= COALESCE(now() - make_interval(secs => $1 + $3), '-infinity') \
             ORDER BY updated_at LIMIT $2 FOR UPDATE SKIP LOCKED), \
         r AS (SELECT idempotency_key FROM agent_operations \
             WHERE status = 'failed_retryable' AND lease_until <= now() \
               AND (updated_at <= lease_until OR updated_at < now() - make_interval(secs => $1)) \
             ORDER BY lease_until LIMIT $2 FOR UPDATE SKIP LOCKED) \
         SELECT idempotency_key FROM (SELECT idempotency_key FROM p \
             UNION ALL SELECT idempotency_key FROM r) u LIMIT $2"
    };
}

/// `unknown` due for a check for longer than `$1` seconds, without an open review.
/// `$3`: limit (`$2` is the check lease, used by the update).
macro_rules! stale_unknowns {
    () => {
        "SELECT o.idempotency_key FROM agent_operations o \
         WHERE o.status = 'unknown' AND o.lease_until <= now() - make_interval(secs => $1) \
           AND NOT EXISTS (SELECT 1 FROM operation_reviews r WHERE r.idempotency_key = o.idempotency_key AND r.resolved_at IS NULL) \
         ORDER BY o.lease_until LIMIT $3 FOR UPDATE OF o SKIP LOCKED"
    };
}

/// [`Journal::live_status_counts`]: `planned` on its partial index, the other three live
/// statuses on theirs (each predicate implies its index's, so neither reads a terminal row).
/// `$1`: seconds back that a `planned` row was stamped at most, `$2`: that an `executing`
/// lease expired at most (`NULL`: any time, a full count) — the same bounds as the scans'
/// ([`Since`]), so a count between full passes does not walk the dead entries either.
pub const LIVE_STATUS_COUNTS: &str = "SELECT 'planned'::text AS status, count(*) FROM agent_operations \
     WHERE status = 'planned' AND updated_at >= COALESCE(now() - make_interval(secs => $1), '-infinity') \
     HAVING count(*) > 0 \
     UNION ALL SELECT 'executing', count(*) FROM agent_operations \
     WHERE status = 'executing' AND lease_until >= COALESCE(now() - make_interval(secs => $2), '-infinity') \
     HAVING count(*) > 0 \
     UNION ALL SELECT status, count(*) FROM agent_operations \
     WHERE status IN ('failed_retryable', 'unknown', 'deferred') GROUP BY status";

/// The three scans' row selections, `(name, sql)`, for timing them on a big journal
/// (`oncely-bench --journal-rows`). Their parameters: expired leases `$1` limit, `$2`
/// unused, `$3` window (`NULL`: a full pass); republish `$1` seconds untouched, `$2` limit,
/// `$3` window; stale unknowns `$1` seconds stale, `$2` unused, `$3` limit.
pub const SCANS: [(&str, &str); 3] = [
    ("expired leases", expired_leases!()),
    ("republish", republish!()),
    ("stale unknowns", stale_unknowns!()),
];

/// How far back a bounded pass reads below the start of the last pass that saw every due
/// row: a transaction stamps its row with its own start (`now()`), so a row stamped before
/// that pass may have been committed after it, and the sweeper's clock and the
/// statement's start differ by a round trip. Any row stamped earlier still is found by the
/// next full pass ([`Since`]).
pub const SINCE_OVERLAP: Duration = Duration::from_secs(30);

/// Which rows a pass of a scan over a busy status reads (`executing` leases, `planned`
/// rows to republish).
///
/// Every operation passes through both statuses, and each row that leaves one leaves a dead
/// entry in that status's index until a vacuum cleans the indexes (docs/operations.md,
/// "Autovacuum on a big journal"). A scan for rows due *before now* walks all of those
/// entries first, so a full scan costs what has passed through the status since the last
/// index cleanup — hours of traffic. A pass after one that saw every due row (it took fewer
/// than its batch) need only read rows that became due since that pass started, less
/// [`SINCE_OVERLAP`]: that costs what passed through in one interval. Every
/// `full_every` (and on the first pass, and until a full pass is not cut short by its
/// batch) a pass reads everything again, which finds the rows a bounded pass cannot: one
/// skipped (`SKIP LOCKED`) by a pass while another transaction held it that then rolled
/// back, or one stamped by a transaction older than the overlap. The windows are measured
/// on the process's monotonic clock, which on Linux stops while the machine is suspended:
/// what became due during a suspension is left to the next full pass too.
#[derive(Debug, Clone)]
pub struct Since {
    full_every: Duration,
    last_full: Option<std::time::Instant>,
    last_complete: Option<std::time::Instant>,
}

impl Since {
    /// A full pass at least every `full_every` (zero: every pass is full).
    pub fn new(full_every: Duration) -> Self {
        Self {
            full_every,
            last_full: None,
            last_complete: None,
        }
    }

    /// The window of a pass starting at `now`: how far back from now its rows became due at
    /// most; `None` for a full pass.
    pub fn window(&self, now: std::time::Instant) -> Option<Duration> {
        match (self.last_full, self.last_complete) {
            (Some(full), Some(complete))
                if now.saturating_duration_since(full) < self.full_every =>
            {
                Some(now.saturating_duration_since(complete) + SINCE_OVERLAP)
            }
            _ => None,
        }
    }

    /// Record a pass that started at `started` with `window`: `complete` when it took fewer
    /// rows than its batch, so it saw every row due in its window.
    pub fn passed(
        &mut self,
        started: std::time::Instant,
        window: Option<Duration>,
        complete: bool,
    ) {
        if complete {
            self.last_complete = Some(started);
            if window.is_none() {
                self.last_full = Some(started);
            }
        }
    }
}

/// What [`Journal::take_for_republish`] took.
#[derive(Debug, Clone)]
pub struct Republish {
    /// Rows taken (their `updated_at` bumped): the batch was full when this is its limit.
    pub taken: usize,
    /// Those still `planned` or `failed_retryable` when read back, to publish (a worker may
    /// have claimed one in between).
    pub operations: Vec<Operation>,
}

/// An operation the sweeper moved from `executing` to `unknown`.
#[derive(Debug, Clone, PartialEq)]
pub struct Expired {
    /// The key.
    pub key: IdempotencyKey,
    /// Its attempt.
    pub attempt: i32,
    /// Its action type.
    pub action_type: String,
}

impl Journal {
    /// `executing` with an expired lease → `unknown` (due now), a batch at a time; only
    /// leases that expired within `window` of now, or any (`None`, a full pass: [`Since`]).
    pub async fn expire_leases(
        &self,
        limit: i64,
        actor: &str,
        window: Option<Duration>,
    ) -> Result<Vec<Expired>, JournalError> {
        debug_assert!(transition(Some(Status::Executing), Status::Unknown).is_some());
        let rows = sqlx::query(
            concat!("WITH due AS (", expired_leases!(), ") \
             UPDATE agent_operations o SET status = 'unknown', lease_owner = NULL, lease_until = now(), \
                 last_error_code = 'lease_expired', last_actor = $2, last_reason = 'lease_expired', updated_at = now() \
             FROM due WHERE o.idempotency_key = due.idempotency_key AND o.status = 'executing' \
             RETURNING o.idempotency_key, o.attempt_count, o.action_type"),
        )
        .bind(limit)
        .bind(actor)
        .bind(window.map(|w| w.as_secs_f64()))
        .fetch_all(&self.db)
        .await?;
        rows.into_iter()
            .map(|r| {
                let key: String = r.try_get(0)?;
                Ok(Expired {
                    key: IdempotencyKey::parse(&key).map_err(|e| sqlx::Error::Decode(e.into()))?,
                    attempt: r.try_get(1)?,
                    action_type: r.try_get(2)?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(Into::into)
    }

    /// Rows to publish again: `planned` not touched for `after` (a lost publish, a
    /// producer crash), and `failed_retryable` past its not-before time — at once when it
    /// has not been republished since it became due (`updated_at <= lease_until`), else
    /// every `after`. `updated_at` is bumped, so the next sweep skips them for `after`.
    /// At most `limit`: the longest-untouched `planned` first, then the longest-due
    /// `failed_retryable` (a full batch makes the sweeper go again at once, and the
    /// `planned` it took are not due again for `after`, so neither kind waits for long).
    /// `window`: only `planned` rows that became due within it (`None`: any; [`Since`]).
    pub async fn take_for_republish(
        &self,
        after: Duration,
        limit: i64,
        window: Option<Duration>,
    ) -> Result<Republish, JournalError> {
        let keys: Vec<String> = sqlx::query_scalar(concat!(
            "WITH due AS (",
            republish!(),
            ") \
                 UPDATE agent_operations o SET updated_at = now() FROM due \
                 WHERE o.idempotency_key = due.idempotency_key RETURNING o.idempotency_key"
        ))
        .bind(after.as_secs_f64())
        .bind(limit)
        .bind(window.map(|w| w.as_secs_f64()))
        .fetch_all(&self.db)
        .await?;
        let operations = self
            .get_many_by_text(&keys)
            .await?
            .into_values()
            .filter(|op| matches!(op.status, Status::Planned | Status::FailedRetryable))
            .collect();
        Ok(Republish {
            taken: keys.len(),
            operations,
        })
    }

    /// Take the `unknown` operations due for a check for longer than `stale_after`, with
    /// no open review (reconcile messages lost, a reconciler died mid-check, a pending
    /// provider), at most `limit`, in one statement: like [`Journal::take_unknown`] for
    /// each, their due time is pushed by `check_lease` and the check counted, so no other
    /// sweep (here or in another reconciler) takes them while they are being checked.
    pub async fn take_stale_unknowns(
        &self,
        stale_after: Duration,
        check_lease: Duration,
        limit: i64,
    ) -> Result<Vec<Operation>, JournalError> {
        let keys: Vec<String> = sqlx::query_scalar(concat!(
            "WITH due AS (",
            stale_unknowns!(),
            ") \
                 UPDATE agent_operations o SET lease_until = now() + make_interval(secs => $2), \
                     reconcile_checks = o.reconcile_checks + 1 \
                 FROM due WHERE o.idempotency_key = due.idempotency_key AND o.status = 'unknown' \
                 RETURNING o.idempotency_key"
        ))
        .bind(stale_after.as_secs_f64())
        .bind(check_lease.as_secs_f64())
        .bind(limit)
        .fetch_all(&self.db)
        .await?;
        Ok(self
            .get_many_by_text(&keys)
            .await?
            .into_values()
            .filter(|op| op.status == Status::Unknown)
            .collect())
    }

    /// Take an `unknown` operation for one check: only if due and without an open review.
    /// Pushes its due time by `check_lease` and counts the check. `None`: not ours to check.
    pub async fn take_unknown(
        &self,
        key: &IdempotencyKey,
        check_lease: Duration,
    ) -> Result<Option<Operation>, JournalError> {
        let taken: Option<String> = sqlx::query_scalar(
            "UPDATE agent_operations o SET lease_until = now() + make_interval(secs => $2), \
                 reconcile_checks = reconcile_checks + 1 \
             WHERE o.idempotency_key = $1 AND o.status = 'unknown' AND (o.lease_until IS NULL OR o.lease_until <= now()) \
               AND NOT EXISTS (SELECT 1 FROM operation_reviews r WHERE r.idempotency_key = o.idempotency_key AND r.resolved_at IS NULL) \
             RETURNING o.idempotency_key",
        )
        .bind(key.as_str())
        .bind(check_lease.as_secs_f64())
        .fetch_optional(&self.db)
        .await?;
        match taken {
            Some(_) => self.get(key).await,
            None => Ok(None),
        }
    }

    /// Check again after `delay` (pending at the provider, or the lookup failed).
    pub async fn defer_unknown(
        &self,
        key: &IdempotencyKey,
        attempt: i32,
        delay: Duration,
    ) -> Result<bool, JournalError> {
        self.next_check(key, attempt, delay, 0).await
    }

    /// Check again after `delay` without counting the check just taken (the provider's
    /// budget had no slot for the lookup: nobody was asked, so `max_reconcile_checks` is
    /// not spent).
    pub async fn postpone_unknown(
        &self,
        key: &IdempotencyKey,
        attempt: i32,
        delay: Duration,
    ) -> Result<bool, JournalError> {
        self.next_check(key, attempt, delay, 1).await
    }

    /// An unknown's next check in `delay`, giving back `refund` counted checks.
    async fn next_check(
        &self,
        key: &IdempotencyKey,
        attempt: i32,
        delay: Duration,
        refund: i32,
    ) -> Result<bool, JournalError> {
        let n = sqlx::query(
            "UPDATE agent_operations SET lease_until = now() + make_interval(secs => $3), \
                 reconcile_checks = greatest(reconcile_checks - $4, 0) \
             WHERE idempotency_key = $1 AND status = 'unknown' AND attempt_count = $2",
        )
        .bind(key.as_str())
        .bind(attempt)
        .bind(delay.as_secs_f64())
        .bind(refund)
        .execute(&self.db)
        .await?
        .rows_affected();
        Ok(n == 1)
    }

    /// Live operations per status — `planned`, `executing`, `failed_retryable`,
    /// `unknown`; a status without operations is absent — for the gauges every sweep. Each
    /// is counted on a partial index that holds only live rows (`agent_operations_planned_idx`,
    /// `agent_operations_clocks_idx`), so the cost follows the live work, not the journal's
    /// history: see [`Journal::status_counts`] for what counting everything costs.
    /// `planned` and `executing` are counted within the windows of the sweeper's passes
    /// (`None`: all), the windows [`Since`] gives the scans: exact after a full pass, and
    /// between full passes short only of the rows that a full pass alone would take.
    pub async fn live_status_counts(
        &self,
        planned: Option<Duration>,
        leases: Option<Duration>,
    ) -> Result<Vec<(String, i64)>, JournalError> {
        Ok(sqlx::query_as(LIVE_STATUS_COUNTS)
            .bind(planned.map(|w| w.as_secs_f64()))
            .bind(leases.map(|w| w.as_secs_f64()))
            .fetch_all(&self.db)
            .await?)
    }

    /// Operations per status over the whole journal (for the terminal statuses' gauges,
    /// every `reconciler.totals_interval`). This reads every operation, a scan of the
    /// table: 2.3–2.6 s on ten million from memory (docs/operations.md, "The gauges on a
    /// big journal") — never run it on every sweep.
    pub async fn status_counts(&self) -> Result<Vec<(String, i64)>, JournalError> {
        Ok(
            sqlx::query_as("SELECT status, count(*) FROM agent_operations GROUP BY status")
                .fetch_all(&self.db)
                .await?,
        )
    }

    /// Operations matching a filter, newest first.
    pub async fn list(&self, f: &OpsFilter) -> Result<Vec<Operation>, JournalError> {
        Ok(sqlx::query_as(select_operations!(
            "WHERE ($1::text IS NULL OR status = $1) AND ($2::text IS NULL OR action_type = $2) \
               AND ($3::text IS NULL OR workflow_id = $3) \
               AND ($4::float8 IS NULL OR created_at < now() - make_interval(secs => $4)) \
             ORDER BY created_at DESC, idempotency_key LIMIT $5"
        ))
        .bind(f.status.map(Status::as_str))
        .bind(f.action_type.as_deref())
        .bind(f.workflow_id.as_deref())
        .bind(f.older_than.map(|d| d.as_secs_f64()))
        .bind(f.limit)
        .fetch_all(&self.db)
        .await?)
    }
}

/// Filters for [`Journal::list`].
#[derive(Debug, Clone, Default)]
pub struct OpsFilter {
    /// Only this status.
    pub status: Option<Status>,
    /// Only this action type.
    pub action_type: Option<String>,
    /// Only this workflow.
    pub workflow_id: Option<String>,
    /// Only operations created longer ago than this.
    pub older_than: Option<Duration>,
    /// At most this many.
    pub limit: i64,
}

const _: () = assert!(matches!(
    transition(Some(Status::Unknown), Status::FailedRetryable),
    Some(Move::Settle)
));

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_pass_is_full_first_then_bounded_by_the_last_complete_pass_until_the_interval() {
        let t0 = Instant::now();
        let mut since = Since::new(300 * S);
        assert_eq!(since.window(t0), None, "the first pass is full");
        // A full pass cut short by its batch: the next is full again.
        since.passed(t0, None, false);
        assert_eq!(since.window(t0 + S), None);
        since.passed(t0 + S, None, true);
        // Bounded: back to the start of the last complete pass, and the overlap.
        assert_eq!(since.window(t0 + 6 * S), Some(5 * S + SINCE_OVERLAP));
        // A bounded pass cut short does not move the bound: the window grows.
        since.passed(t0 + 6 * S, Some(5 * S + SINCE_OVERLAP), false);
        assert_eq!(since.window(t0 + 7 * S), Some(6 * S + SINCE_OVERLAP));
        since.passed(t0 + 7 * S, Some(6 * S + SINCE_OVERLAP), true);
        assert_eq!(since.window(t0 + 12 * S), Some(5 * S + SINCE_OVERLAP));
        // The interval since the last full pass has passed: full again.
        assert_eq!(since.window(t0 + 301 * S), None);
    }

    #[test]
    fn a_zero_interval_makes_every_pass_full() {
        let t0 = Instant::now();
        let mut since = Since::new(Duration::ZERO);
        since.passed(t0, None, true);
        assert_eq!(since.window(t0 + S), None);
    }
}
