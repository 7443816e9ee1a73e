//! `[worker]`: how much one worker process takes on at once.
//!
//! Why every limit must be at least 1: a zero here does not fail loudly, it stalls the
//! fleet (no prefetch, no permits, empty batches), so it is refused at startup.

use super::duration::human;
use super::error::{ConfigError, invalid};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The longest [`WorkerConfig::linger`] accepted: a linger is a batching window, not a
/// delay line; past a second it only adds latency.
pub const MAX_LINGER: Duration = Duration::from_secs(1);

/// Worker tuning.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerConfig {
    /// Unacked deliveries RabbitMQ may push per consumer.
    pub prefetch: u16,
    /// Provider calls in flight at once in this process. A claim takes a slot per
    /// delivery before its statement (a lease must not wait for a slot), so with this
    /// equal to `batch` a full claim waits until every call of the one before has ended;
    /// the default, twice the batch, lets the next claim go while calls run (measured in
    /// docs/performance.md, "Claims in waves": commits carry ~60 actions instead of ~38).
    pub max_in_flight: usize,
    /// Most deliveries claimed (and completions committed) per statement.
    pub batch: usize,
    /// Largest accepted message (bytes).
    pub max_message_bytes: usize,
    /// Postgres connections of this process.
    pub db_connections: u32,
    /// How long a claim or commit batch waits for more work after its first item before
    /// its statement is sent (`0s`: send what is buffered at once). A few milliseconds
    /// trade that much latency for fuller batches, and so fewer statements per action,
    /// at partial load; at full load batches fill without waiting. At most 1s. Measured
    /// in docs/performance.md ("Linger").
    #[serde(with = "human")]
    pub linger: Duration,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            prefetch: 128,
            max_in_flight: 128,
            batch: 64,
            max_message_bytes: crate::intent::DEFAULT_MAX_ENVELOPE_BYTES,
            db_connections: 8,
            linger: Duration::ZERO,
        }
    }
}

impl WorkerConfig {
    /// Every limit is at least 1; the linger is at most [`MAX_LINGER`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.linger > MAX_LINGER {
            return Err(invalid(
                "worker.linger",
                format!("must be at most {MAX_LINGER:?} (it is a batching window)"),
            ));
        }
        for (field, v) in [
            ("worker.prefetch", usize::from(self.prefetch)),
            ("worker.max_in_flight", self.max_in_flight),
            ("worker.batch", self.batch),
            ("worker.db_connections", self.db_connections as usize),
        ] {
            if v == 0 {
                return Err(invalid(field, "must be at least 1"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linger_reads_as_a_duration_and_is_bounded() {
        let w: WorkerConfig = toml::from_str("linger = \"2ms\"").expect("parse");
        assert_eq!(w.linger, Duration::from_millis(2));
        w.validate().expect("2ms is fine");
        assert_eq!(WorkerConfig::default().linger, Duration::ZERO);
        let long: WorkerConfig = toml::from_str("linger = \"2s\"").expect("parse");
        let err = long.validate().expect_err("2s is refused").to_string();
        assert!(err.contains("worker.linger"), "{err}");
    }

    #[test]
    fn the_shipped_config_states_the_defaults_and_claims_do_not_wait_in_waves() {
        let shipped = crate::config::Config::builtin()
            .expect("built-in config")
            .worker;
        assert_eq!(
            shipped,
            WorkerConfig::default(),
            "config/oncely.toml [worker]"
        );
        // A claim takes a call slot per delivery before its statement: with room for
        // fewer than two batches in flight, a full claim waits for the calls before it.
        assert!(shipped.max_in_flight >= 2 * shipped.batch, "{shipped:?}");
    }
}
