//! Refused conflicts: the audit row written when an intent reuses a key with another
//! payload or action type.
//!
//! A conflict is not a transition (the operation keeps its status, attempt and payload),
//! so the trigger does not record it; this write adds the event itself, so that the
//! audit trail shows every refusal next to the moves of the operation it collided with.

use super::{Journal, JournalError};
use crate::keys::{IdempotencyKey, PayloadHash};

impl Journal {
    /// Record that an intent with this key but another payload (or action type) was
    /// refused: an audit row with `reason = 'conflict'` and the offered hash as error
    /// detail; the operation itself is unchanged.
    pub async fn record_conflict(
        &self,
        key: &IdempotencyKey,
        offered: &PayloadHash,
        actor: &str,
    ) -> Result<(), JournalError> {
        sqlx::query(
            "INSERT INTO operation_events (op_seq, idempotency_key, from_status, to_status, attempt, actor, reason, error_code) \
             SELECT seq, idempotency_key, status, status, attempt_count, $2, 'conflict', $3 \
             FROM agent_operations WHERE idempotency_key = $1",
        )
        .bind(key.as_str())
        .bind(actor)
        .bind(format!("conflicting_payload {}", offered.as_str()))
        .execute(&self.db)
        .await?;
        Ok(())
    }
}
