//! `[providers.NAME.rate_limit]`: what the provider allows, for the whole fleet.
//!
//! ```toml
//! [providers.mail.rate_limit]
//! per_second = 50      # requests a second across every worker and reconciler
//! burst = 10           # requests at once after a quiet spell (default: one second's worth)
//! max_in_flight = 20   # calls in flight across the fleet (default: no limit)
//! ```
//! Enforced through one row per provider in the journal (core/src/journal/budget.rs);
//! see docs/providers.md, "Rate limits". Without this table a provider is unlimited until
//! it pushes back (429, 503 with `Retry-After`, SMTP 421/45x), and then it is paced at
//! what it allows.

use crate::config::error::{ConfigError, invalid};
use serde::{Deserialize, Serialize};

/// A provider's limits (every field optional, at least one set).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitConfig {
    /// Requests per second across the fleet (fractions allowed: `0.5` is one every two
    /// seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_second: Option<f64>,
    /// Requests that may start together after a quiet spell (default: `per_second`
    /// rounded up, at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
    /// Calls in flight at once across the fleet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u32>,
}

// Every rate a config holds is a finite, positive number (validated): equal as bits.
impl Eq for RateLimitConfig {}

impl RateLimitConfig {
    /// `per_second` requests a second, the default burst, no in-flight limit.
    pub fn per_second(per_second: f64) -> Self {
        Self {
            per_second: Some(per_second),
            burst: None,
            max_in_flight: None,
        }
    }

    /// The burst in force: the configured one, or one second's worth.
    pub fn burst(&self) -> u32 {
        self.burst.unwrap_or_else(|| {
            self.per_second
                .map_or(1, |r| r.ceil().clamp(1.0, f64::from(u32::MAX)) as u32)
        })
    }

    /// Each field in range; errors name it under `at` (`providers.NAME`).
    pub fn validate(&self, at: &str) -> Result<(), ConfigError> {
        let f = |x: &str| format!("{at}.rate_limit.{x}");
        if let Some(r) = self.per_second
            && !(r.is_finite() && r > 0.0 && r <= 1_000_000.0)
        {
            return Err(invalid(
                f("per_second"),
                "must be above 0 (and at most 1000000)",
            ));
        }
        if self.burst == Some(0) {
            return Err(invalid(f("burst"), "must be at least 1"));
        }
        if self.burst.is_some() && self.per_second.is_none() {
            return Err(invalid(f("burst"), "needs per_second"));
        }
        if self.max_in_flight == Some(0) {
            return Err(invalid(f("max_in_flight"), "must be at least 1"));
        }
        if self.per_second.is_none() && self.max_in_flight.is_none() {
            return Err(invalid(
                format!("{at}.rate_limit"),
                "set per_second, max_in_flight or both",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_burst_defaults_to_a_seconds_worth() {
        assert_eq!(RateLimitConfig::per_second(50.0).burst(), 50);
        assert_eq!(RateLimitConfig::per_second(0.5).burst(), 1);
        let c = RateLimitConfig {
            burst: Some(5),
            ..RateLimitConfig::per_second(50.0)
        };
        assert_eq!(c.burst(), 5);
    }

    #[test]
    fn bad_fields_are_named() {
        let bad = |c: RateLimitConfig| {
            c.validate("providers.mail")
                .expect_err("invalid")
                .to_string()
        };
        assert!(
            bad(RateLimitConfig::per_second(0.0)).contains("providers.mail.rate_limit.per_second")
        );
        assert!(bad(RateLimitConfig::per_second(f64::NAN)).contains("per_second"));
        let burst0 = RateLimitConfig {
            burst: Some(0),
            ..RateLimitConfig::per_second(1.0)
        };
        assert!(bad(burst0).contains("rate_limit.burst"));
        let empty = RateLimitConfig {
            per_second: None,
            burst: None,
            max_in_flight: None,
        };
        assert!(bad(empty).contains("providers.mail.rate_limit"));
        assert!(RateLimitConfig::per_second(50.0).validate("p").is_ok());
    }
}
