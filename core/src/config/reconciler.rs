//! `[reconciler]`: the pace of the sweeper and of the checks on unknown outcomes.
//!
//! Why these are settings and not constants: production wants slow, cheap sweeps;
//! tests and the chaos run want sweeps in milliseconds so that they can wait on them.

use super::duration::human;
use super::error::{ConfigError, invalid};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Reconciler and sweeper tuning.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReconcilerConfig {
    /// How often the sweeper runs.
    #[serde(with = "human")]
    pub sweep_interval: Duration,
    /// `planned` rows untouched this long are republished (lost publishes heal).
    #[serde(with = "human")]
    pub republish_after: Duration,
    /// `unknown` rows due this long without a check are checked by the sweeper itself.
    #[serde(with = "human")]
    pub stale_unknown_after: Duration,
    /// How long one check holds an unknown (another reconciler may take it after).
    #[serde(with = "human")]
    pub check_lease: Duration,
    /// First delay before re-checking a pending / failed lookup (doubles per check).
    #[serde(with = "human")]
    pub recheck_delay: Duration,
    /// Longest delay between checks.
    #[serde(with = "human")]
    pub max_recheck_delay: Duration,
    /// Rows per sweep statement.
    pub batch: i64,
    /// Reconcile messages handled at once.
    pub concurrency: usize,
    /// How often the gauges of the terminal statuses (`succeeded`, `failed_final`) are
    /// counted: that count reads every operation of the journal, unlike the live statuses'
    /// (counted every sweep on their own indexes). `"0s"`: never (those gauges stay unset).
    #[serde(with = "human")]
    pub totals_interval: Duration,
    /// How often a pass of the sweeper reads every expired lease and every `planned` row
    /// due for republishing; the passes between read only what became due since the last
    /// pass (their cost does not grow with the dead index entries a vacuum has not cleaned
    /// yet). `"0s"`: every pass reads everything.
    #[serde(with = "human")]
    pub full_sweep_interval: Duration,
    /// How often the sweeper republishes `deferred` operations that became due (and
    /// gives up those past their `max_defer`): short, so that a rate-limited provider
    /// sees its rate, not bursts one sweep apart.
    #[serde(with = "human")]
    pub deferred_interval: Duration,
}

impl Default for ReconcilerConfig {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl ReconcilerConfig {
    /// The defaults, as a constant so that tuned variants can be constants too
    /// (`ReconcilerConfig { sweep_interval: …, ..ReconcilerConfig::DEFAULT }`).
    pub const DEFAULT: Self = Self {
        sweep_interval: Duration::from_secs(5),
        republish_after: Duration::from_secs(30),
        stale_unknown_after: Duration::from_secs(30),
        check_lease: Duration::from_secs(30),
        recheck_delay: Duration::from_secs(5),
        max_recheck_delay: Duration::from_secs(300),
        batch: 200,
        concurrency: 16,
        totals_interval: Duration::from_secs(600),
        full_sweep_interval: Duration::from_secs(300),
        deferred_interval: Duration::from_millis(200),
    };

    /// Intervals above zero (a zero interval is a busy loop), sizes at least 1.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.sweep_interval.is_zero()
            || self.deferred_interval.is_zero()
            || self.check_lease.is_zero()
            || self.recheck_delay.is_zero()
        {
            return Err(invalid(
                "reconciler",
                "sweep_interval, deferred_interval, check_lease and recheck_delay must be above zero",
            ));
        }
        if self.batch < 1 || self.concurrency == 0 {
            return Err(invalid(
                "reconciler.batch",
                "batch and concurrency must be at least 1",
            ));
        }
        Ok(())
    }
}
