//! The workload: a mix of the three action types, shaped like the demo's intents, so
//! every measurement carries the bytes a real envelope has.

use oncely_core::{Envelope, Intent, KeyRing};
use serde_json::{Value, json};

/// The action types of the mix, in rotation.
pub const ACTIONS: [&str; 3] = ["email.send", "ticket.create", "payment_order.create"];

/// A field added to payloads to reach `--message-bytes` when it exceeds the natural size.
const PAD_FIELD: &str = "note";

/// The workload's shape.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    /// Filler characters added to every payload (0: real envelopes as they are).
    pub pad: usize,
}

impl Workload {
    /// Envelopes as they come (no filler).
    pub fn natural() -> Workload {
        Workload { pad: 0 }
    }

    /// The workload whose mean envelope is about `target` bytes (never below the
    /// natural size: envelopes are not truncated).
    pub fn sized(target: usize, secret: &KeyRing) -> anyhow::Result<Workload> {
        let natural = Workload::natural().mean_bytes(secret, 300)?;
        if target as f64 <= natural {
            return Ok(Workload::natural());
        }
        // `,"note":"…"` adds the filler plus its fixed overhead; measure that overhead.
        let with_one = Workload { pad: 1 }.mean_bytes(secret, 300)?;
        let overhead = with_one - natural - 1.0;
        let pad = (target as f64 - natural - overhead).round().max(1.0) as usize;
        Ok(Workload { pad })
    }

    /// Intent number `n` (distinct identity per `n`).
    pub fn intent(&self, n: usize) -> Intent {
        let action = ACTIONS[n % ACTIONS.len()];
        let mut payload = match action {
            "email.send" => json!({
                "to": format!("applicant-{n}@example.test"),
                "subject": "Your application was approved",
                "template": "approval_notice",
                "locale": "en",
                "business_reference": format!("application-{n}")
            }),
            "ticket.create" => json!({
                "title": format!("Verify documents of application {n}"),
                "queue": "back-office",
                "priority": "normal",
                "business_reference": format!("application-{n}")
            }),
            _ => json!({
                "account_id": "example-account",
                "amount_minor": 125_000 + n as u64,
                "currency": "RUB",
                "business_reference": format!("application-{n}")
            }),
        };
        if self.pad > 0
            && let Value::Object(m) = &mut payload
        {
            m.insert(PAD_FIELD.into(), Value::String("x".repeat(self.pad)));
        }
        let step = match action {
            "email.send" => "send_approval_notice",
            "ticket.create" => "open_verification_ticket",
            _ => "pay_grant",
        };
        Intent::from_json(json!({
            "action_type": action,
            "workflow_id": format!("case-{}", 100_000 + n),
            "step": step,
            "business_object": format!("application-{n}"),
            "revision": 1,
            "payload": payload
        }))
        .unwrap_or_else(|e| unreachable!("bench intents are valid: {e}"))
    }

    /// Intents `first..first + n`.
    pub fn intents(&self, first: usize, n: usize) -> Vec<Intent> {
        (first..first + n).map(|i| self.intent(i)).collect()
    }

    /// Intents `0..n`, keyed and hashed.
    pub fn envelopes(&self, n: usize, secret: &KeyRing) -> anyhow::Result<Vec<Envelope>> {
        (0..n).map(|i| Ok(self.intent(i).seal(secret)?)).collect()
    }

    /// Mean size of the first `n` envelopes as message bytes.
    pub fn mean_bytes(&self, secret: &KeyRing, n: usize) -> anyhow::Result<f64> {
        let envs = self.envelopes(n.max(1), secret)?;
        Ok(envs.iter().map(|e| e.to_bytes().len()).sum::<usize>() as f64 / envs.len() as f64)
    }
}
