//! Outcome events for agents: `<action_type>.<status>` on the outcomes exchange.
//!
//! Published for every terminal state, for unknowns handed to reconciliation, for
//! conflicts and for reviews. They are notifications — the journal is the truth — so
//! they are published without `mandatory` (nobody may be listening) and a failure is
//! logged and counted, never allowed to undo a commit.

use oncely_core::metrics as m;
use oncely_core::publish::{Pending, Publisher};
use oncely_core::topology::Topology;
use serde::Serialize;

/// The schema name of outcome events.
pub const OUTCOME_SCHEMA: &str = "oncely.outcome.v1";

/// One outcome event (no payload, no personal data).
#[derive(Debug, Clone, Serialize)]
pub struct OutcomeEvent<'a> {
    /// Always [`OUTCOME_SCHEMA`].
    pub schema: &'static str,
    /// The key.
    pub idempotency_key: &'a str,
    /// The action type.
    pub action_type: &'a str,
    /// `succeeded`, `failed_final`, `unknown`, `conflict`, `review_opened`, …
    pub status: &'a str,
    /// The attempt.
    pub attempt: i32,
    /// The workflow.
    pub workflow_id: &'a str,
    /// The provider's id, when succeeded.
    pub provider_operation_id: Option<&'a str>,
    /// The error code, when failed or unknown.
    pub error_code: Option<&'a str>,
}

/// Publish an outcome; returns the pending confirm (await it to flush) or `None` if the
/// publish could not even be sent (logged and counted).
pub async fn publish(
    publisher: &Publisher,
    topology: &Topology,
    ev: &OutcomeEvent<'_>,
) -> Option<Pending> {
    let body = serde_json::to_vec(ev).unwrap_or_default();
    let rk = format!("{}.{}", ev.action_type, ev.status);
    match publisher
        .publish(&topology.outcomes_exchange(), &rk, &body, false, None, None)
        .await
    {
        Ok(p) => Some(p),
        Err(e) => {
            tracing::warn!(key = ev.idempotency_key, status = ev.status, error = %e, "outcome event not published");
            metrics::counter!(m::PUBLISHES, "kind" => "outcome", "result" => "failed").increment(1);
            None
        }
    }
}

/// Await a batch of outcome confirms (flush), counting the results.
pub async fn flush(pending: Vec<Pending>) {
    for p in pending {
        let result = if p.confirmed().await.is_ok() {
            "confirmed"
        } else {
            "failed"
        };
        metrics::counter!(m::PUBLISHES, "kind" => "outcome", "result" => result).increment(1);
    }
}
