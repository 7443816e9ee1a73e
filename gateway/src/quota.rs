//! Quotas at the front door: a rate and a burst per token and per tenant, over which a
//! submit is refused with `429`, `Retry-After` and the IETF `RateLimit` fields — before
//! anything is recorded. A runaway agent loop (the same tool called ten thousand times
//! with new identities) is stopped by its own budget, not by the provider behind it, and
//! one tenant's burst cannot take every other tenant's turn.
//!
//! Why in memory: the quota guards this process's front door against one caller, and a
//! check must cost nothing next to the submit it guards (no statement). With several
//! gateway processes behind a load balancer each enforces its own share, so the fleet
//! admits up to N × the quota: divide it by the number of gateways (docs/gateway.md,
//! "Quotas"). A GCRA per bucket: one instant per token or tenant, no timer, no task.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A rate and a burst (`quota = { per_second = 10, burst = 20 }` in the tokens file).
#[derive(Debug, Clone, Copy, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Quota {
    /// Submits per second.
    pub per_second: f64,
    /// Submits at once after a quiet spell (default: one second's worth, at least 1).
    #[serde(default)]
    pub burst: Option<u32>,
}

// Every quota in force is a finite, positive number (checked when the file is read).
impl Eq for Quota {}

impl Quota {
    /// The burst in force.
    pub fn burst(&self) -> u32 {
        self.burst
            .unwrap_or_else(|| self.per_second.ceil().clamp(1.0, f64::from(u32::MAX)) as u32)
    }

    /// A problem with the numbers, if any.
    pub fn problem(&self) -> Option<&'static str> {
        if !(self.per_second.is_finite() && self.per_second > 0.0) {
            Some("quota.per_second must be above 0")
        } else if self.burst == Some(0) {
            Some("quota.burst must be at least 1")
        } else {
            None
        }
    }
}

/// A refusal: which bucket, and when to come back.
#[derive(Debug, Clone, PartialEq)]
pub struct OverQuota {
    /// `token` or `tenant`.
    pub scope: &'static str,
    /// Come back after this long (a whole number of seconds, at least 1, for `Retry-After`).
    pub retry_after: Duration,
    /// The quota that refused.
    pub quota: Quota,
}

/// The buckets of one gateway process.
#[derive(Debug, Default)]
pub struct Quotas {
    tat: Mutex<HashMap<String, Instant>>,
}

impl Quotas {
    /// Admit one submit under every quota given (`(scope, bucket name, quota)`), or
    /// refuse it with the longest wait. A refused submit spends nothing; an admitted one
    /// spends its place in every bucket.
    pub fn admit(&self, quotas: &[(&'static str, &str, Quota)]) -> Result<(), OverQuota> {
        self.admit_at(quotas, Instant::now())
    }

    fn admit_at(
        &self,
        quotas: &[(&'static str, &str, Quota)],
        now: Instant,
    ) -> Result<(), OverQuota> {
        let mut tat = self.tat.lock().unwrap_or_else(PoisonError::into_inner);
        let mut refused: Option<OverQuota> = None;
        let mut next = Vec::with_capacity(quotas.len());
        for &(scope, name, quota) in quotas {
            let key = format!("{scope}:{name}");
            let interval = Duration::from_secs_f64(1.0 / quota.per_second);
            let tolerance = interval.saturating_mul(quota.burst().saturating_sub(1));
            let at = tat.get(&key).map_or(now, |t| (*t).max(now));
            if at > now + tolerance {
                let wait = at - tolerance - now;
                let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
                let retry_after = Duration::from_secs(secs.max(1));
                if refused.as_ref().is_none_or(|r| r.retry_after < retry_after) {
                    refused = Some(OverQuota {
                        scope,
                        retry_after,
                        quota,
                    });
                }
            } else {
                next.push((key, at + interval));
            }
        }
        if let Some(r) = refused {
            return Err(r);
        }
        for (key, t) in next {
            tat.insert(key, t);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const Q: Quota = Quota {
        per_second: 2.0,
        burst: Some(3),
    };

    #[test]
    fn the_burst_then_one_per_interval_then_refused_with_a_wait() {
        let quotas = Quotas::default();
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        for _ in 0..3 {
            assert!(quotas.admit_at(&[("token", "a", Q)], t0).is_ok());
        }
        let refused = quotas.admit_at(&[("token", "a", Q)], t0).expect_err("over");
        assert_eq!(
            (refused.scope, refused.retry_after),
            ("token", Duration::from_secs(1))
        );
        // Half a second later one more place is free.
        assert!(quotas.admit_at(&[("token", "a", Q)], at(500)).is_ok());
        assert!(quotas.admit_at(&[("token", "a", Q)], at(500)).is_err());
        // Another token has its own bucket.
        assert!(quotas.admit_at(&[("token", "b", Q)], at(500)).is_ok());
    }

    #[test]
    fn a_tenant_quota_binds_every_token_of_the_tenant_and_a_refusal_spends_nothing() {
        let quotas = Quotas::default();
        let t0 = Instant::now();
        let tenant = Quota {
            per_second: 1.0,
            burst: Some(2),
        };
        let both = |token| [("token", token, Q), ("tenant", "acme", tenant)];
        assert!(quotas.admit_at(&both("a"), t0).is_ok());
        assert!(quotas.admit_at(&both("b"), t0).is_ok());
        let refused = quotas.admit_at(&both("c"), t0).expect_err("tenant spent");
        assert_eq!(refused.scope, "tenant");
        // Token c spent nothing: its own burst is whole once the tenant has room again.
        let later = t0 + Duration::from_secs(5);
        for _ in 0..2 {
            assert!(quotas.admit_at(&both("c"), later).is_ok());
        }
    }
}
