//! Reads: one operation, a workflow, the audit trail, and the article's two
//! inspection queries. Nothing here writes.

use super::operation::{Event, Operation, select_operations, select_operations_without_payload};
use super::{Journal, JournalError};
use crate::keys::IdempotencyKey;

impl Journal {
    /// The operation for `key`, if any.
    pub async fn get(&self, key: &IdempotencyKey) -> Result<Option<Operation>, JournalError> {
        Ok(
            sqlx::query_as(select_operations!("WHERE idempotency_key = $1"))
                .bind(key.as_str())
                .fetch_optional(&self.db)
                .await?,
        )
    }

    /// The operation for `key`, if any, without its payload (`payload` is `None`
    /// whatever the status): the read of the producer and the gateway, whose role may not
    /// read payloads.
    pub async fn get_without_payload(
        &self,
        key: &IdempotencyKey,
    ) -> Result<Option<Operation>, JournalError> {
        Ok(sqlx::query_as(select_operations_without_payload!(
            "WHERE idempotency_key = $1"
        ))
        .bind(key.as_str())
        .fetch_optional(&self.db)
        .await?)
    }

    /// The article's first query: a workflow's operations in creation order.
    pub async fn by_workflow(&self, workflow_id: &str) -> Result<Vec<Operation>, JournalError> {
        Ok(sqlx::query_as(select_operations!(
            "WHERE workflow_id = $1 ORDER BY created_at, idempotency_key"
        ))
        .bind(workflow_id)
        .fetch_all(&self.db)
        .await?)
    }

    /// The article's second query: keys with more than one row. Empty while the primary
    /// key holds — it is a check on the schema, not on the code.
    pub async fn keys_with_several_rows(&self) -> Result<Vec<(String, i64)>, JournalError> {
        Ok(sqlx::query_as(
            "SELECT idempotency_key, count(*) AS rows_per_key FROM agent_operations \
             GROUP BY idempotency_key HAVING count(*) > 1",
        )
        .fetch_all(&self.db)
        .await?)
    }

    /// The audit trail of one operation, oldest first.
    pub async fn events(&self, key: &IdempotencyKey) -> Result<Vec<Event>, JournalError> {
        Ok(sqlx::query_as(
            "SELECT id, idempotency_key, from_status, to_status, attempt, actor, reason, error_code, \
                 provider_operation_id, at FROM operation_events \
                 WHERE op_seq = (SELECT seq FROM agent_operations WHERE idempotency_key = $1) ORDER BY id",
        )
        .bind(key.as_str())
        .fetch_all(&self.db)
        .await?)
    }
}
