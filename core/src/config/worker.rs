//! `[worker]`: how much one worker process takes on at once.
//!
//! Why every limit must be at least 1: a zero here does not fail loudly, it stalls the
//! fleet (no prefetch, no permits, empty batches), so it is refused at startup.

use super::error::{ConfigError, invalid};
use serde::{Deserialize, Serialize};

/// Worker tuning.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerConfig {
    /// Unacked deliveries RabbitMQ may push per consumer.
    pub prefetch: u16,
    /// Provider calls in flight at once in this process.
    pub max_in_flight: usize,
    /// Most deliveries claimed (and completions committed) per statement.
    pub batch: usize,
    /// Largest accepted message (bytes).
    pub max_message_bytes: usize,
    /// Postgres connections of this process.
    pub db_connections: u32,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            prefetch: 128,
            max_in_flight: 64,
            batch: 64,
            max_message_bytes: crate::intent::DEFAULT_MAX_ENVELOPE_BYTES,
            db_connections: 8,
        }
    }
}

impl WorkerConfig {
    /// Every limit is at least 1.
    pub fn validate(&self) -> Result<(), ConfigError> {
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
