//! `[broker]`: where RabbitMQ is and how the fleet's queues are named and declared.
//!
//! Why the prefix is checked so strictly: it becomes part of every exchange and queue
//! name, and two fleets on one broker are kept apart by it alone.

use super::error::{ConfigError, invalid};
use serde::{Deserialize, Serialize};

/// Broker settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BrokerConfig {
    /// AMQP URL (env `ONCELY_AMQP_URL`).
    pub url: String,
    /// Prefix of every exchange and queue name (env `ONCELY_PREFIX`).
    pub prefix: String,
    /// `quorum` (default) or `classic`.
    pub queue_type: String,
    /// `x-delivery-limit` of the action queues: deliveries before dead-lettering.
    pub delivery_limit: i64,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        Self {
            url: "amqp://guest:guest@127.0.0.1:5672/%2f".into(),
            prefix: "oncely".into(),
            queue_type: "quorum".into(),
            delivery_limit: 20,
        }
    }
}

impl BrokerConfig {
    /// The prefix is a safe name part, the queue type known, the limit positive.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.prefix.is_empty()
            || !self
                .prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        {
            return Err(invalid(
                "broker.prefix",
                "must be non-empty ASCII letters, digits, '.', '_' or '-'",
            ));
        }
        if !matches!(self.queue_type.as_str(), "quorum" | "classic") {
            return Err(invalid(
                "broker.queue_type",
                "must be \"quorum\" or \"classic\"",
            ));
        }
        if self.delivery_limit < 1 {
            return Err(invalid("broker.delivery_limit", "must be at least 1"));
        }
        Ok(())
    }
}
