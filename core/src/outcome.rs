//! Outcome events for agents: `<action_type>.<status>` on the outcomes exchange.
//!
//! Published for every terminal state, for unknowns handed to reconciliation, for
//! conflicts and for reviews. They are notifications — the journal is the truth — so
//! they are published without `mandatory` (nobody may be listening) and a failure is
//! logged and counted, never allowed to undo a commit. Every event is built by one of
//! the constructors on [`OutcomeEvent`], so the runner, the reconciler and the gateway
//! (cancels and approvals) cannot drift.

use crate::Envelope;
use crate::config::Config;
use crate::journal::{Operation, Verdict};
use crate::metrics as m;
use crate::publish::{Pending, PublishOptions, Publisher};
use crate::topology::Topology;
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

impl<'a> OutcomeEvent<'a> {
    /// An event about an envelope's operation, with no provider id or error code yet.
    fn about_envelope(env: &'a Envelope, attempt: i32, status: &'a str) -> Self {
        OutcomeEvent {
            schema: OUTCOME_SCHEMA,
            idempotency_key: env.key.as_str(),
            action_type: env.intent.identity.action_type.as_str(),
            status,
            attempt,
            workflow_id: &env.intent.identity.workflow_id,
            provider_operation_id: None,
            error_code: None,
        }
    }

    /// An event about a journal row, with no provider id or error code yet.
    fn about_operation(op: &'a Operation, status: &'a str) -> Self {
        OutcomeEvent {
            schema: OUTCOME_SCHEMA,
            idempotency_key: op.key.as_str(),
            action_type: &op.action_type,
            status,
            attempt: op.attempt_count,
            workflow_id: &op.workflow_id,
            provider_operation_id: None,
            error_code: None,
        }
    }

    /// The status, provider id and error code a verdict carries.
    fn with_verdict(self, v: &'a Verdict) -> Self {
        let (provider_operation_id, error_code) = verdict_fields(v);
        OutcomeEvent {
            status: v.status().as_str(),
            provider_operation_id,
            error_code,
            ..self
        }
    }

    /// A worker's committed verdict for an envelope's attempt.
    pub fn for_envelope(env: &'a Envelope, attempt: i32, verdict: &'a Verdict) -> Self {
        Self::about_envelope(env, attempt, "").with_verdict(verdict)
    }

    /// An intent refused because its key exists with another payload or action type;
    /// `attempt` is the existing operation's.
    pub fn conflict(env: &'a Envelope, attempt: i32) -> Self {
        OutcomeEvent {
            error_code: Some("payload_hash_mismatch"),
            ..Self::about_envelope(env, attempt, "conflict")
        }
    }

    /// A reconciler's committed verdict for an operation.
    pub fn for_operation(op: &'a Operation, verdict: &'a Verdict) -> Self {
        Self::about_operation(op, "").with_verdict(verdict)
    }

    /// An operation settled outside the fleet's processes — a person's decision on a
    /// review, a statement import — as the journal holds it now.
    pub fn decided(op: &'a Operation) -> Self {
        OutcomeEvent {
            provider_operation_id: op.provider_operation_id.as_deref(),
            error_code: op.last_error_code.as_deref(),
            ..Self::about_operation(op, op.status.as_str())
        }
    }

    /// A review was opened for an operation: a person must decide, for `reason`.
    pub fn review_opened(op: &'a Operation, reason: &'a str) -> Self {
        OutcomeEvent {
            error_code: Some(reason),
            ..Self::about_operation(op, "review_opened")
        }
    }
}

/// The provider id (when succeeded) and the error code (otherwise) of a verdict.
fn verdict_fields(v: &Verdict) -> (Option<&str>, Option<&str>) {
    match v {
        Verdict::Succeeded {
            provider_operation_id,
            ..
        } => (Some(provider_operation_id), None),
        Verdict::FailedFinal { error_code }
        | Verdict::FailedRetryable { error_code, .. }
        | Verdict::Deferred { error_code, .. }
        | Verdict::Unknown { error_code, .. } => (None, Some(error_code)),
    }
}

/// Whether `action_type`'s events are published (`[actions."TYPE"] outcome_events`; an
/// action type without a policy: yes).
pub fn wanted(config: &Config, action_type: &str) -> bool {
    config
        .actions
        .get(action_type)
        .is_none_or(|p| p.outcome_events)
}

/// Publish an outcome; returns the pending confirm (await it to flush) or `None` if the
/// publish could not even be sent (logged and counted) or its action type's events are
/// off ([`wanted`]).
pub async fn publish(
    publisher: &Publisher,
    config: &Config,
    topology: &Topology,
    ev: &OutcomeEvent<'_>,
) -> Option<Pending> {
    if !wanted(config, ev.action_type) {
        return None;
    }
    let body = serde_json::to_vec(ev).unwrap_or_default();
    let rk = format!("{}.{}", ev.action_type, ev.status);
    match publisher
        .publish(
            &topology.outcomes_exchange(),
            &rk,
            &body,
            PublishOptions::notification(),
        )
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

/// Publish one outcome and wait for its confirm (paths that settle one operation).
pub async fn publish_one(
    publisher: &Publisher,
    config: &Config,
    topology: &Topology,
    ev: &OutcomeEvent<'_>,
) {
    if let Some(p) = publish(publisher, config, topology, ev).await {
        flush(vec![p]).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Intent, KeyRing};
    use serde_json::json;

    fn env() -> Envelope {
        let secret = KeyRing::new(b"test-secret-do-not-use".to_vec()).expect("secret");
        Intent::from_json(json!({
            "action_type": "email.send", "workflow_id": "case-1", "step": "s",
            "business_object": "o", "revision": 1, "payload": {"to": "a@example.test"}
        }))
        .expect("intent")
        .seal(&secret)
        .expect("seal")
    }

    fn json_of(ev: &OutcomeEvent<'_>) -> serde_json::Value {
        serde_json::to_value(ev).expect("json")
    }

    #[test]
    fn verdicts_become_events_with_the_right_fields() {
        let e = env();
        let ok = Verdict::Succeeded {
            provider_operation_id: "po_1".into(),
            result: json!({}),
        };
        assert_eq!(
            json_of(&OutcomeEvent::for_envelope(&e, 2, &ok)),
            json!({"schema": OUTCOME_SCHEMA, "idempotency_key": e.key.as_str(),
                   "action_type": "email.send", "status": "succeeded", "attempt": 2,
                   "workflow_id": "case-1", "provider_operation_id": "po_1", "error_code": null})
        );
        let unknown = Verdict::Unknown {
            error_code: "timeout".into(),
            check_in: std::time::Duration::ZERO,
        };
        let ev = OutcomeEvent::for_envelope(&e, 1, &unknown);
        assert_eq!(
            (ev.status, ev.provider_operation_id, ev.error_code),
            ("unknown", None, Some("timeout"))
        );
    }

    #[test]
    fn a_conflict_names_the_existing_attempt_and_the_reason() {
        let e = env();
        assert_eq!(
            json_of(&OutcomeEvent::conflict(&e, 3)),
            json!({"schema": OUTCOME_SCHEMA, "idempotency_key": e.key.as_str(),
                   "action_type": "email.send", "status": "conflict", "attempt": 3,
                   "workflow_id": "case-1", "provider_operation_id": null,
                   "error_code": "payload_hash_mismatch"})
        );
    }
}
