//! The fleet's budget per provider: one row of `provider_budgets`, shared by every worker
//! and reconciler, so a provider that takes 50 requests a second gets 50 from the whole
//! fleet, not 50 from each process.
//!
//! Why a row in Postgres and not a coordinator: the journal is already the one thing
//! every process reaches, its clock is the fleet's clock (`now()`), and a worker that dies
//! holding nothing cannot leak budget — the row holds a *time* (GCRA's theoretical arrival
//! time, `tat`), not tokens handed out. Why it costs no round trip per action: a worker
//! takes slots for a whole claim batch in one statement ([`Journal::take_slots`]), and a
//! provider without a configured limit that has not pushed back is never asked at all
//! (the worker reads the row's state at most every [`STATE_TTL`]).
//!
//! The bucket (GCRA): at rate `r` (interval `T = 1/r`) and burst `b`, request `i` of a
//! take is due at `max(tat, now, paused_until) + i·T − (b−1)·T`. The take grants every
//! request due within `horizon` of now — the worker waits for each one's slot, at most
//! `horizon` — and advances `tat` by `T` for each; the rest get a *due time* (the next free
//! slot, or the pause's end) and wait in the journal as `deferred`, holding no worker, no
//! delivery and no slot. The sweeper's deferred pass hands due rows back at the rate in
//! force (worker/src/deferred.rs), so a backlog drains at the provider's pace in due order
//! without any row being promised a slot a later change of rate would break.
//!
//! Pushback (AIMD): a throttled answer ([`Journal::throttled`]) pauses the provider for
//! everyone until its `Retry-After` and lowers the rate in force (at most once a second,
//! so one burst of 429s lowers it once). With a configured rate, the provider is mostly
//! right and the throttle mostly jitter: × 0.8, and each take raises it again by a tenth
//! of the configured rate per clean second, up to the configured rate. Without one, the
//! rate is a guess: halved, and raised by a fifth per clean second (compounding, so an
//! early guess far too low is outgrown in seconds); it starts at the first throttle as
//! what the reporting worker achieved in the last second, and at ten times the rate its
//! last decrease left, with no throttle since, the provider is unlimited again. The
//! `RateLimit-Policy` field, where a provider sends it, sets the rate directly
//! ([`Journal::learned_rate`]).
//!
//! Calls in flight (`max_in_flight`): a take grants no more than the limit less the
//! provider's live `executing` rows. The count is read in the take's snapshot, so takes
//! racing each other may overshoot by what another worker was granted and had not yet
//! claimed — bounded by one batch per worker, never a leak: a crashed worker's leases end.

use super::{Journal, JournalError};
use chrono::{DateTime, Utc};
use std::time::Duration;

/// How long a worker trusts what it read of a provider without a configured limit
/// (paused? a learned rate?) before reading it again.
pub const STATE_TTL: Duration = Duration::from_millis(250);

/// The longest a worker waits for a slot in memory; later slots are deferred.
pub const DEFAULT_HORIZON: Duration = Duration::from_secs(1);

/// A provider's configured limit (`[providers.NAME.rate_limit]`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limit {
    /// Requests per second across the fleet (`None`: no configured rate).
    pub per_second: Option<f64>,
    /// Requests that may go at once after a quiet period.
    pub burst: u32,
    /// Calls in flight across the fleet (`None`: no limit).
    pub max_in_flight: Option<u32>,
}

/// What a take granted: slots for the first `slots.len()` requests, due times for the rest.
#[derive(Debug, Clone, PartialEq)]
pub struct Grant {
    /// For each granted request, in order: how long to wait before calling (database
    /// clock, as an offset from the statement's `now()`).
    pub slots: Vec<Duration>,
    /// For each request not granted, in order: how long from now it is due.
    pub deferred: Vec<Duration>,
    /// The rate in force after the take (`None`: unlimited).
    pub rate: Option<f64>,
}

/// What a worker reads of a provider to know whether it must take slots at all.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BudgetState {
    /// The rate in force (`None`: unlimited).
    pub rate: Option<f64>,
    /// How long the provider is paused for still (zero: not paused).
    pub paused_for: Duration,
}

impl BudgetState {
    /// Whether calls must take slots (a rate in force, or a pause).
    pub fn limited(&self) -> bool {
        self.rate.is_some() || !self.paused_for.is_zero()
    }
}

/// One row of `provider_budgets` as the operator sees it (`admin`, gauges).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct BudgetRow {
    /// The provider.
    pub provider: String,
    /// The configured rate.
    pub configured_rate: Option<f64>,
    /// The rate in force.
    pub rate: Option<f64>,
    /// Paused until (database clock).
    pub paused_until: DateTime<Utc>,
    /// Throttled answers reported so far.
    pub throttles: i64,
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn duration(s: f64) -> Duration {
    Duration::try_from_secs_f64(s.max(0.0)).unwrap_or(Duration::ZERO)
}

impl Journal {
    /// Make sure every provider has its row, with the configured limit written into it
    /// (a changed limit takes effect at once; the rate in force is reset to it).
    pub async fn ensure_budgets(&self, limits: &[(String, Limit)]) -> Result<(), JournalError> {
        if limits.is_empty() {
            return Ok(());
        }
        let names: Vec<&str> = limits.iter().map(|(n, _)| n.as_str()).collect();
        let rates: Vec<Option<f64>> = limits.iter().map(|(_, l)| l.per_second).collect();
        let bursts: Vec<i32> = limits
            .iter()
            .map(|(_, l)| i32::try_from(l.burst.max(1)).unwrap_or(i32::MAX))
            .collect();
        sqlx::query(
            "INSERT INTO provider_budgets AS b (provider, configured_rate, burst, rate) \
             SELECT p, r, bu, r FROM unnest($1::text[], $2::float8[], $3::int4[]) AS x(p, r, bu) \
             ORDER BY p \
             ON CONFLICT (provider) DO UPDATE SET configured_rate = EXCLUDED.configured_rate, \
                 burst = EXCLUDED.burst, \
                 rate = CASE WHEN b.configured_rate IS DISTINCT FROM EXCLUDED.configured_rate \
                             THEN EXCLUDED.configured_rate ELSE b.rate END, \
                 updated_at = now() \
             WHERE b.configured_rate IS DISTINCT FROM EXCLUDED.configured_rate OR b.burst <> EXCLUDED.burst",
        )
        .bind(&names)
        .bind(&rates)
        .bind(&bursts)
        .execute(&self.db)
        .await?;
        Ok(())
    }

    /// The rate in force and the pause of `provider` (`None`: no row yet).
    pub async fn budget_state(&self, provider: &str) -> Result<Option<BudgetState>, JournalError> {
        let row: Option<(Option<f64>, f64)> = sqlx::query_as(
            "SELECT rate, greatest(extract(epoch FROM paused_until - now()), 0)::float8 \
             FROM provider_budgets WHERE provider = $1",
        )
        .bind(provider)
        .fetch_optional(&self.db)
        .await?;
        Ok(row.map(|(rate, paused)| BudgetState {
            rate,
            paused_for: duration(paused),
        }))
    }

    /// Every provider's row, by name.
    pub async fn budgets(&self) -> Result<Vec<BudgetRow>, JournalError> {
        Ok(sqlx::query_as(
            "SELECT provider, configured_rate, rate, paused_until, throttles FROM provider_budgets ORDER BY provider",
        )
        .fetch_all(&self.db)
        .await?)
    }

    /// Take slots for `n` requests to `provider` in one statement: the first ones that
    /// fall within `horizon` are granted (each with its wait), the rest get due times.
    /// `action_types`: the provider's action types, whose live `executing` rows count
    /// against `limit.max_in_flight`. A provider without a row is unlimited.
    pub async fn take_slots(
        &self,
        provider: &str,
        action_types: &[&str],
        max_in_flight: Option<u32>,
        n: usize,
        horizon: Duration,
    ) -> Result<Grant, JournalError> {
        let n = i32::try_from(n).unwrap_or(i32::MAX);
        let in_flight_cap = max_in_flight.map(i64::from);
        // `k`: how many of the n fall within the horizon (GCRA, see the module's docs),
        // never more than the calls in flight allow. The rate first rises (additive
        // increase, once a second has passed without a throttle; see the module's docs).
        let row: Option<(i32, f64, f64, Option<f64>, f64, f64)> = sqlx::query_as(
            "WITH cur AS ( \
                 SELECT provider, burst, paused_until, decreased_to, configured_rate, \
                        CASE WHEN rate IS NULL THEN NULL::float8 \
                             WHEN decreased_at > now() - interval '1 second' THEN rate \
                             WHEN configured_rate IS NULL THEN rate * (1 + 0.2 * \
                                        extract(epoch FROM now() - greatest(increased_at, decreased_at))) \
                             ELSE least(configured_rate, rate + 0.1 * configured_rate \
                                        * extract(epoch FROM now() - greatest(increased_at, decreased_at))) \
                        END AS r, \
                        greatest(tat, now(), paused_until) AS base \
                 FROM provider_budgets WHERE provider = $1 FOR UPDATE), \
             room AS (SELECT CASE WHEN $5::int8 IS NULL THEN $2::int8 ELSE greatest(0, $5::int8 - ( \
                     SELECT count(*) FROM agent_operations \
                     WHERE status = 'executing' AND lease_until > now() AND action_type = ANY($4::text[]))) END AS free), \
             calc AS ( \
                 SELECT cur.provider, cur.burst, cur.paused_until, cur.base, \
                        CASE WHEN cur.configured_rate IS NULL AND cur.r >= 10 * cur.decreased_to \
                             THEN NULL ELSE cur.r END AS r \
                 FROM cur), \
             grant_ AS ( \
                 SELECT calc.*, least($2::int8, room.free, CASE \
                     WHEN calc.r IS NULL THEN CASE WHEN calc.paused_until <= now() + make_interval(secs => $3) THEN $2::int8 ELSE 0 END \
                     ELSE greatest(0, floor(( extract(epoch FROM now() - calc.base) + $3 ) * calc.r + (calc.burst - 1))::int8 + 1) \
                 END)::int4 AS k FROM calc, room) \
             UPDATE provider_budgets b SET \
                 rate = g.r, \
                 increased_at = CASE WHEN g.r IS DISTINCT FROM b.rate THEN now() ELSE b.increased_at END, \
                 tat = CASE WHEN g.r IS NULL THEN b.tat ELSE g.base + make_interval(secs => g.k / g.r) END, \
                 updated_at = now() \
             FROM grant_ g WHERE b.provider = g.provider \
             RETURNING g.k, extract(epoch FROM g.base - now())::float8, \
                 extract(epoch FROM greatest(g.base + make_interval(secs => (g.k - g.burst + 1) / coalesce(g.r, 'infinity')), g.paused_until) - now())::float8, \
                 g.r, extract(epoch FROM g.paused_until - now())::float8, g.burst::float8",
        )
        .bind(provider)
        .bind(i64::from(n))
        .bind(secs(horizon))
        .bind(action_types)
        .bind(in_flight_cap)
        .fetch_optional(&self.db)
        .await?;
        let Some((k, base, first_due, rate, paused, burst)) = row else {
            return Ok(Grant {
                slots: vec![Duration::ZERO; n.max(0) as usize],
                deferred: Vec::new(),
                rate: None,
            });
        };
        Ok(grant(n, k, base, first_due, rate, paused, burst))
    }

    /// A throttled answer from `provider`: pause it for everyone until `retry_after` from
    /// now, and halve the rate in force (at most once a second). A provider with no rate
    /// in force gets `observed` (what the reporting worker saw the fleet achieve, per
    /// second), or stays unlimited when nothing was observed.
    pub async fn throttled(
        &self,
        provider: &str,
        retry_after: Duration,
        observed: Option<f64>,
        count: u32,
    ) -> Result<(), JournalError> {
        sqlx::query(
            "INSERT INTO provider_budgets AS b (provider, paused_until, rate, decreased_to, decreased_at, throttles) \
             VALUES ($1, now() + make_interval(secs => $2), $3, $3, now(), $4) \
             ON CONFLICT (provider) DO UPDATE SET \
                 paused_until = greatest(b.paused_until, EXCLUDED.paused_until), \
                 rate = CASE WHEN b.decreased_at > now() - interval '1 second' THEN b.rate \
                             WHEN b.rate IS NULL THEN EXCLUDED.rate \
                             WHEN b.configured_rate IS NOT NULL THEN greatest(0.1, b.rate * 0.8) \
                             ELSE greatest(0.1, b.rate / 2) END, \
                 decreased_to = CASE WHEN b.decreased_at > now() - interval '1 second' THEN b.decreased_to \
                             WHEN b.rate IS NULL THEN EXCLUDED.rate \
                             WHEN b.configured_rate IS NOT NULL THEN greatest(0.1, b.rate * 0.8) \
                             ELSE greatest(0.1, b.rate / 2) END, \
                 decreased_at = CASE WHEN b.decreased_at > now() - interval '1 second' THEN b.decreased_at ELSE now() END, \
                 increased_at = now(), \
                 tat = greatest(b.tat, EXCLUDED.paused_until), \
                 throttles = b.throttles + EXCLUDED.throttles, updated_at = now()",
        )
        .bind(provider)
        .bind(secs(retry_after))
        .bind(observed.filter(|r| *r > 0.0))
        .bind(i64::from(count))
        .execute(&self.db)
        .await?;
        Ok(())
    }

    /// The provider announced its limit (`RateLimit-Policy`): use
    /// it as the rate in force when none is configured and it is lower than the one in
    /// force.
    pub async fn learned_rate(&self, provider: &str, per_second: f64) -> Result<(), JournalError> {
        if !(per_second.is_finite() && per_second > 0.0) {
            return Ok(());
        }
        sqlx::query(
            "INSERT INTO provider_budgets AS b (provider, rate) VALUES ($1, $2) \
             ON CONFLICT (provider) DO UPDATE SET rate = EXCLUDED.rate, updated_at = now() \
             WHERE b.configured_rate IS NULL AND (b.rate IS NULL OR b.rate > EXCLUDED.rate)",
        )
        .bind(provider)
        .bind(per_second)
        .execute(&self.db)
        .await?;
        Ok(())
    }
}

/// The grant of a take, from what the statement returned: `k` granted of `n`; `base`
/// (seconds from now) the bucket's next arrival time; `first_due` the first deferred
/// request's due time; `paused` how long the provider is paused for still.
fn grant(
    n: i32,
    k: i32,
    base: f64,
    first_due: f64,
    rate: Option<f64>,
    paused: f64,
    burst: f64,
) -> Grant {
    let k = k.clamp(0, n.max(0));
    let slots = (0..k)
        .map(|i| match rate {
            Some(r) => duration((base + (f64::from(i) - (burst - 1.0)) / r).max(paused)),
            None => duration(paused),
        })
        .collect();
    // Every request without a slot is due when the next slot is free (or the pause ends):
    // the sweeper's deferred pass hands them back at the provider's rate, in due order
    // (worker/src/deferred.rs), so no due time promises a slot that a later change of
    // rate would break.
    let deferred = vec![duration(first_due.max(paused)); (n - k) as usize];
    Grant {
        slots,
        deferred,
        rate,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_bucket_grants_the_burst_at_once_then_one_interval_apart() {
        // Rate 10/s, burst 3, bucket full (base = now), all 5 within the horizon.
        let g = grant(5, 5, 0.0, 0.0, Some(10.0), -1.0, 3.0);
        let ms: Vec<u128> = g.slots.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [0, 0, 0, 100, 200]);
        assert!(g.deferred.is_empty());
    }

    #[test]
    fn what_falls_outside_the_horizon_is_due_at_the_next_free_slot() {
        let g = grant(4, 1, 0.5, 0.6, Some(10.0), -1.0, 1.0);
        assert_eq!(g.slots, [Duration::from_millis(500)]);
        assert_eq!(g.deferred, [Duration::from_millis(600); 3]);
    }

    #[test]
    fn an_unlimited_provider_waits_only_for_a_pause() {
        let g = grant(2, 2, 0.0, 0.0, None, 0.3, 1.0);
        assert_eq!(g.slots, [Duration::from_millis(300); 2]);
        let g = grant(2, 0, 0.0, 4.0, None, 4.0, 1.0);
        assert_eq!(g.deferred, [Duration::from_secs(4); 2]);
    }
}
