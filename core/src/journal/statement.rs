//! Reconciliation from a provider's statement (the article's "сверка по выписке"): the
//! journal side — which operations a statement can speak about, and settling one.
//!
//! A statement says, per effect, what the provider did (its id, succeeded or failed),
//! naming the operation by our key or by the business reference. It can settle an
//! `unknown` operation — with or without an open review — and nothing else: a live
//! operation is still being driven, a terminal one is already decided (a statement that
//! disagrees with it is a conflict for a person, never an overwrite).

use super::review::{Settle, settle_unknown};
use super::{Journal, JournalError};
use crate::keys::IdempotencyKey;
use crate::status::Status;

/// An operation a statement may speak about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatementCandidate {
    /// Its key.
    pub key: IdempotencyKey,
    /// Its status now.
    pub status: Status,
    /// Its attempt count (the compare-and-set token).
    pub attempt: i32,
    /// The provider's id, once known.
    pub provider_operation_id: Option<String>,
    /// The business reference in its payload, while the payload is kept (live states).
    pub reference: Option<String>,
}

/// What a statement row says happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatementVerdict<'a> {
    /// The effect happened, with this provider id.
    Succeeded(&'a str),
    /// The provider refused or reversed it: nothing happened.
    Failed,
}

/// `value #>> path` as Postgres computes it: object keys or array indices, a string as
/// itself, any other JSON as its text.
fn text_at(value: &serde_json::Value, path: &[String]) -> Option<String> {
    let mut v = value;
    for token in path {
        v = match v {
            serde_json::Value::Object(m) => m.get(token)?,
            serde_json::Value::Array(a) => a.get(token.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    match v {
        serde_json::Value::Null => None,
        serde_json::Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

impl Journal {
    /// The operations of `action_types` a statement can be matched against: every
    /// `unknown` one, and any whose key, provider id or business reference (the payload
    /// at `reference_path`, JSON-path tokens) is among those given.
    pub async fn statement_candidates(
        &self,
        action_types: &[String],
        reference_path: &[String],
        keys: &[String],
        provider_ids: &[String],
        references: &[String],
    ) -> Result<Vec<StatementCandidate>, JournalError> {
        type Row = (
            String,
            String,
            i32,
            Option<String>,
            Option<String>,
            Option<Vec<u8>>,
            Option<String>,
        );
        // A sealed payload is opened here, so the reference of a sealed row is known for
        // the rows the query returns by status, key or provider id (not for a live row
        // named by its reference alone, which the statement leaves alone anyway).
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT idempotency_key, status, attempt_count, provider_operation_id, payload #>> $2, \
                    payload_sealed, payload_key_id \
             FROM agent_operations \
             WHERE action_type = ANY($1) AND (status = 'unknown' OR idempotency_key = ANY($3) \
                   OR provider_operation_id = ANY($4) \
                   OR (payload IS NOT NULL AND payload #>> $2 = ANY($5)))",
        )
        .bind(action_types)
        .bind(reference_path)
        .bind(keys)
        .bind(provider_ids)
        .bind(references)
        .fetch_all(&self.db)
        .await?;
        rows.into_iter()
            .map(
                |(key, status, attempt, provider_operation_id, reference, sealed, key_id)| {
                    let decode = |e: String| JournalError::from(sqlx::Error::Decode(e.into()));
                    let reference = match (reference, sealed, key_id, self.data_keys()) {
                        (Some(r), ..) => Some(r),
                        (None, Some(bytes), Some(key_id), Some(keys)) => keys
                            .open(&key, &crate::sealing::Sealed { key_id, bytes })
                            .ok()
                            .and_then(|p| text_at(&serde_json::Value::Object(p), reference_path)),
                        _ => None,
                    };
                    Ok(StatementCandidate {
                        key: IdempotencyKey::parse(&key).map_err(|e| decode(e.to_string()))?,
                        status: status.parse().map_err(|e| decode(format!("{e}")))?,
                        attempt,
                        provider_operation_id,
                        reference,
                    })
                },
            )
            .collect()
    }

    /// Settles an `unknown` operation at `attempt` as the statement says — one
    /// compare-and-set, the event's actor `actor` (`statement:<file>`). An open review on
    /// it closes itself in the same statement (resolution `auto:statement`, with an
    /// event: the trigger of migration `20261209000000_review_evidence.sql`). Returns
    /// whether it moved (false: it changed meanwhile).
    pub async fn settle_from_statement(
        &self,
        key: &IdempotencyKey,
        attempt: i32,
        verdict: StatementVerdict<'_>,
        actor: &str,
    ) -> Result<bool, JournalError> {
        let settle = match verdict {
            StatementVerdict::Succeeded(provider_operation_id) => Settle::Succeeded {
                provider_operation_id,
                reason: "statement_succeeded",
            },
            StatementVerdict::Failed => Settle::Failed {
                code: "statement_failed",
                reason: "statement_failed",
            },
        };
        // A transaction of its own, so that a transaction pooler keeps one server for it
        // (crate::pooler).
        let mut tx = self.db().pool().begin().await?;
        let moved = settle_unknown(&mut tx, key, attempt, &settle, actor).await?;
        tx.commit().await?;
        Ok(moved)
    }
}
