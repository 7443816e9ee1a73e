//! The message on the reconcile queue: which operation to check, at which attempt.
//!
//! The runner sends one after it wrote `unknown`, the sweeper after it turned an expired
//! lease into `unknown`; the reconciler reads them. One type with one builder and one
//! parser keeps the three in step (the reconciler takes the operation by key and
//! re-reads its state from the journal, so the attempt is informative).

use oncely_core::IdempotencyKey;
use oncely_core::publish::{PublishError, PublishOptions, Publisher};
use oncely_core::topology::Topology;
use serde::{Deserialize, Serialize};

/// `{"idempotency_key": "v1:…", "attempt": 1}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconcileRequest {
    /// The operation to reconcile (validated when parsed).
    pub idempotency_key: IdempotencyKey,
    /// The attempt that became `unknown`.
    pub attempt: i32,
}

impl ReconcileRequest {
    /// A request for `key` at `attempt`.
    pub fn new(key: &IdempotencyKey, attempt: i32) -> Self {
        Self {
            idempotency_key: key.clone(),
            attempt,
        }
    }

    /// The message body (JSON).
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Read a message body; an unreadable one (not JSON, no valid key) is an error.
    pub fn parse(body: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(body)
    }

    /// Publish it to the reconcile queue, through its exchange (mandatory), and wait for
    /// the confirm.
    pub async fn publish(
        &self,
        publisher: &Publisher,
        topology: &Topology,
    ) -> Result<(), PublishError> {
        publisher
            .publish_confirmed(
                &topology.reconcile_exchange(),
                "",
                &self.to_bytes(),
                PublishOptions::mandatory(),
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key() -> IdempotencyKey {
        IdempotencyKey::parse(&format!("v1:{}", "ab".repeat(32))).expect("key")
    }

    #[test]
    fn round_trips_in_the_documented_shape() {
        let r = ReconcileRequest::new(&key(), 3);
        let body = r.to_bytes();
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&body).expect("json"),
            json!({"idempotency_key": key().as_str(), "attempt": 3})
        );
        assert_eq!(ReconcileRequest::parse(&body).expect("parse"), r);
    }

    #[test]
    fn unreadable_messages_are_errors() {
        for body in [
            &b"not json"[..],
            br#"{"attempt": 1}"#,
            br#"{"idempotency_key": "v1:nothex", "attempt": 1}"#,
            br#"{"idempotency_key": 7, "attempt": 1}"#,
        ] {
            assert!(ReconcileRequest::parse(body).is_err(), "{body:?}");
        }
    }
}
