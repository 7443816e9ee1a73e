//! Approval rules (`[[actions."TYPE".approval]]`), compiled: which operations are held
//! for people before anything is published to a worker (docs/approvals.md).
//!
//! Expressions are CEL (the Common Expression Language of Kubernetes' admission rules
//! and Hatchet), parsed once at start by the `cel` crate; a rule that does not parse is
//! a start-up error naming it ([`crate::config::ActionPolicy::validate`]). An expression
//! that fails when evaluated (a missing field, a wrong type) *holds* the operation and
//! logs the rule's name (never the payload): a rule that cannot decide never lets an
//! action through.
//!
//! Rules are evaluated where an operation is first recorded: the producer SDK (and so
//! the gateway and its MCP tools), and a worker's claim of a message published without
//! the SDK — no path to a provider skips them. The database keeps the promise too: a
//! held row cannot be claimed or settled as sent before it is approved (CHECK
//! `held_until_approved`).

use crate::config::{Config, FirstContact};
use crate::intent::Envelope;
use cel::{Context, Program};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

/// Parse a CEL expression (the error is the parser's, with a caret under the spot).
pub fn compile(expr: &str) -> Result<Program, String> {
    Program::compile(expr).map_err(|e| e.to_string())
}

/// A rule or approver name: 1..=64 of `a-z A-Z 0-9 . _ -` (and `@` for people).
pub fn valid_rule_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

struct Rule {
    name: String,
    when: Option<Program>,
    four_eyes: Option<Program>,
    first_contact: Option<FirstContact>,
    timeout: Duration,
}

/// Every action type's compiled rules (and `max_age`s: what recording needs to know
/// beyond the intent).
pub struct Approvals {
    by_type: HashMap<String, Vec<Rule>>,
    max_age: HashMap<String, Duration>,
}

/// What a caller asks beyond the intent itself: the gateway's and the SDK's options.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Asked {
    /// Deliver no earlier than this.
    pub not_before: Option<chrono::DateTime<chrono::Utc>>,
    /// Not started by then → `expired`.
    pub expires_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Who asks (a gateway token's id); `None`: the producer's actor.
    pub caller: Option<String>,
}

impl fmt::Debug for Approvals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Approvals")
            .field(
                "rules",
                &self
                    .by_type
                    .iter()
                    .map(|(t, r)| (t, r.iter().map(|r| &r.name).collect::<Vec<_>>()))
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// Who asks: the tenant (from the identity) and the caller (a gateway token's id, or
/// the SDK's actor).
#[derive(Debug, Clone, Copy)]
pub struct Asker<'a> {
    /// The token id or actor (`token` in expressions; never an approver of its own).
    pub token: &'a str,
}

/// What recording must do for one envelope beyond `planned`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Control {
    /// Hold it (the matched rule; `None`: not held).
    pub hold: Option<Hold>,
    /// Deliver it no earlier than this (recorded `deferred`, reason `scheduled`).
    pub not_before: Option<chrono::DateTime<chrono::Utc>>,
    /// Not started by then → `expired` (the earlier of this and `max_age` from now).
    pub expires_at: Option<chrono::DateTime<chrono::Utc>>,
    /// The action type's `max_age`.
    pub max_age: Option<Duration>,
    /// Who asked (recorded: never its approver).
    pub requested_by: Option<String>,
    /// The first-contact subject of the operation (recorded for every operation of a
    /// type with a `first_contact` rule: its succeeded rows are what "written to
    /// before" looks up).
    pub subject_hash: Option<String>,
}

/// Why an operation is held.
#[derive(Debug, Clone, PartialEq)]
pub struct Hold {
    /// The first matching rule's name.
    pub rule: String,
    /// Different people who must approve (1, or 2 for four eyes).
    pub approvals_needed: i16,
    /// Until it is rejected (`approval_timed_out`).
    pub timeout: Duration,
}

/// A rule matched by its expression whose first-contact condition needs the journal:
/// held unless the subject was written to within `days`.
#[derive(Debug, Clone, PartialEq)]
pub struct Pending {
    /// The hold if the subject is new.
    pub hold: Hold,
    /// The subject.
    pub subject_hash: String,
    /// How far back.
    pub days: u32,
}

/// The rules' verdict on one envelope before the journal is asked.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Verdict {
    /// Held whatever the journal says (an expression-only rule matched).
    pub hold: Option<Hold>,
    /// Held if the subject is new (first-contact rules that matched otherwise), in order.
    pub if_new: Vec<Pending>,
    /// The operation's subject, to record.
    pub subject_hash: Option<String>,
}

impl Approvals {
    /// Compile every action type's rules (the config was validated: an error here names
    /// the rule all the same).
    pub fn from_config(config: &Config) -> Result<Self, String> {
        let mut by_type = HashMap::new();
        for (action, policy) in &config.actions {
            let mut rules = Vec::new();
            for r in &policy.approval {
                let c = |e: &Option<String>| {
                    e.as_deref()
                        .map(compile)
                        .transpose()
                        .map_err(|e| format!("actions.\"{action}\".approval {:?}: {e}", r.name))
                };
                rules.push(Rule {
                    name: r.name.clone(),
                    when: c(&r.when)?,
                    four_eyes: c(&r.four_eyes)?,
                    first_contact: r.first_contact.clone(),
                    timeout: r.timeout,
                });
            }
            if !rules.is_empty() {
                by_type.insert(action.clone(), rules);
            }
        }
        let max_age = config
            .actions
            .iter()
            .filter_map(|(a, p)| p.max_age.map(|d| (a.clone(), d)))
            .collect();
        Ok(Self { by_type, max_age })
    }

    /// What recording must do for each envelope (`asked[i]` for `envs[i]`; missing:
    /// nothing asked): the rules' verdicts, with one journal statement for every
    /// first-contact subject of the batch. `actor` stands for a caller not named.
    pub async fn controls(
        &self,
        journal: &crate::journal::Journal,
        envs: &[&Envelope],
        asked: &[Asked],
        actor: &str,
    ) -> Result<Vec<Control>, crate::journal::JournalError> {
        let none = Asked::default();
        let verdicts: Vec<(Verdict, &Asked)> = envs
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let a = asked.get(i).unwrap_or(&none);
                let token = a.caller.as_deref().unwrap_or(actor);
                (self.evaluate(e, Asker { token }), a)
            })
            .collect();
        let pending: Vec<&Pending> = verdicts.iter().flat_map(|(v, _)| &v.if_new).collect();
        let known = journal.known_subjects(&pending).await?;
        Ok(envs
            .iter()
            .zip(verdicts)
            .map(|(e, (v, a))| {
                let mut hold = v.hold;
                for p in v.if_new {
                    if !known.contains(&p.subject_hash) {
                        merge(&mut hold, p.hold);
                    }
                }
                // Who asked matters only to a held operation: never its own approver.
                let requested_by = hold
                    .is_some()
                    .then(|| a.caller.clone().unwrap_or_else(|| actor.to_owned()));
                Control {
                    hold,
                    not_before: a.not_before,
                    expires_at: a.expires_at,
                    max_age: self
                        .max_age
                        .get(e.intent.identity.action_type.as_str())
                        .copied(),
                    requested_by,
                    subject_hash: v.subject_hash,
                }
            })
            .collect())
    }

    /// Whether no action type has rules or a `max_age`.
    pub fn is_empty(&self) -> bool {
        self.by_type.is_empty() && self.max_age.is_empty()
    }

    /// Whether `action_type` has rules.
    pub fn governs(&self, action_type: &str) -> bool {
        self.by_type.contains_key(action_type)
    }

    /// The rules' verdict on `env`, asked by `asker`.
    pub fn evaluate(&self, env: &Envelope, asker: Asker<'_>) -> Verdict {
        let action_type = env.intent.identity.action_type.as_str();
        let Some(rules) = self.by_type.get(action_type) else {
            return Verdict::default();
        };
        let payload = Value::Object(env.intent.payload.clone());
        let tenant = env.intent.identity.tenant.as_deref();
        let mut ctx = Context::default();
        let vars = [
            ("payload", payload.clone()),
            ("tenant", tenant.map_or(Value::Null, Value::from)),
            ("token", Value::from(asker.token)),
            ("action_type", Value::from(action_type)),
        ];
        for (name, value) in vars {
            if let Err(e) = ctx.add_variable(name, value) {
                tracing::warn!(%action_type, variable = name, error = %e, "approval rules: variable not bound");
            }
        }
        let mut verdict = Verdict::default();
        for rule in rules {
            let subject = rule.first_contact.as_ref().map(|fc| {
                (
                    fc,
                    subject_hash(tenant, action_type, payload.pointer(&fc.field)),
                )
            });
            if let Some((_, Some(h))) = &subject {
                verdict.subject_hash.get_or_insert_with(|| h.clone());
            }
            if !holds(rule.when.as_ref(), &ctx, action_type, &rule.name, true) {
                continue;
            }
            let hold = Hold {
                rule: rule.name.clone(),
                approvals_needed: if holds(
                    rule.four_eyes.as_ref(),
                    &ctx,
                    action_type,
                    &rule.name,
                    false,
                ) {
                    2
                } else {
                    1
                },
                timeout: rule.timeout,
            };
            match subject {
                // No recipient to look up: it cannot be shown to be known → held.
                None | Some((_, None)) => merge(&mut verdict.hold, hold),
                Some((fc, Some(h))) => verdict.if_new.push(Pending {
                    hold,
                    subject_hash: h,
                    days: fc.days,
                }),
            }
        }
        verdict
    }
}

/// Fold a second matched rule into a hold: the first rule's name, the most approvals,
/// the shortest deadline.
pub fn merge(into: &mut Option<Hold>, hold: Hold) {
    match into {
        None => *into = Some(hold),
        Some(h) => {
            h.approvals_needed = h.approvals_needed.max(hold.approvals_needed);
            h.timeout = h.timeout.min(hold.timeout);
        }
    }
}

/// An expression's value as a decision: absent → `absent`; true → hold; an error or a
/// non-boolean → hold (logged by rule name, never with the payload).
fn holds(
    p: Option<&Program>,
    ctx: &Context<'_, '_>,
    action_type: &str,
    rule: &str,
    absent: bool,
) -> bool {
    let Some(p) = p else { return absent };
    match p.execute(ctx) {
        Ok(cel::Value::Bool(b)) => b,
        Ok(other) => {
            tracing::warn!(%action_type, rule, value_type = ?other.type_of(), "approval rule is not a boolean: treated as true (held)");
            true
        }
        Err(e) => {
            tracing::warn!(%action_type, rule, error = %e, "approval rule failed: treated as true (held)");
            true
        }
    }
}

/// `sha256:` of tenant, action type and the field's canonical JSON (`None` when the
/// field is absent or null).
pub fn subject_hash(
    tenant: Option<&str>,
    action_type: &str,
    value: Option<&Value>,
) -> Option<String> {
    let value = value.filter(|v| !v.is_null())?;
    let canon = crate::canonical::canonical_json(value).ok()?;
    let mut h = Sha256::new();
    h.update(tenant.unwrap_or("").as_bytes());
    h.update([0]);
    h.update(action_type.as_bytes());
    h.update([0]);
    h.update(&canon);
    Some(format!("sha256:{}", hex::encode(h.finalize())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ApprovalRule;
    use crate::{Intent, KeyRing};

    fn rules(rules: Vec<ApprovalRule>) -> Approvals {
        let mut config = Config::builtin().expect("builtin");
        let mut p = config.actions["payment_order.create"].clone();
        p.approval = rules;
        config.actions.insert("payment_order.create".into(), p);
        Approvals::from_config(&config).expect("compiles")
    }

    fn rule(name: &str, when: Option<&str>, four_eyes: Option<&str>) -> ApprovalRule {
        ApprovalRule {
            name: name.into(),
            when: when.map(Into::into),
            first_contact: None,
            four_eyes: four_eyes.map(Into::into),
            timeout: Duration::from_secs(3600),
        }
    }

    fn env(payload: Value) -> Envelope {
        Intent::from_json(serde_json::json!({
            "action_type": "payment_order.create", "tenant": "acme", "workflow_id": "w",
            "step": "s", "business_object": "b", "revision": 1, "payload": payload,
        }))
        .expect("intent")
        .seal(&KeyRing::new(b"0123456789abcdef0123456789abcdef".to_vec()).expect("ring"))
        .expect("seal")
    }

    #[test]
    fn thresholds_four_eyes_and_failures_hold() {
        let a = rules(vec![rule(
            "large",
            Some("payload.amount_minor > 100000 || payload.currency != 'EUR'"),
            Some("payload.amount_minor > 1000000"),
        )]);
        let asker = Asker { token: "agent" };
        let small = a.evaluate(
            &env(serde_json::json!({"amount_minor": 500, "currency": "EUR"})),
            asker,
        );
        assert_eq!(small.hold, None);
        let large = a.evaluate(
            &env(serde_json::json!({"amount_minor": 200000, "currency": "EUR"})),
            asker,
        );
        assert_eq!(
            large
                .hold
                .as_ref()
                .map(|h| (h.rule.as_str(), h.approvals_needed)),
            Some(("large", 1))
        );
        let usd = a.evaluate(
            &env(serde_json::json!({"amount_minor": 5, "currency": "USD"})),
            asker,
        );
        assert!(usd.hold.is_some());
        let huge = a.evaluate(
            &env(serde_json::json!({"amount_minor": 2000000, "currency": "EUR"})),
            asker,
        );
        assert_eq!(huge.hold.map(|h| h.approvals_needed), Some(2));
        // A field the rule needs is missing: held, not waved through.
        let missing = a.evaluate(&env(serde_json::json!({"currency": "EUR"})), asker);
        assert!(missing.hold.is_some());
    }

    #[test]
    fn the_caller_and_the_tenant_are_in_scope() {
        let a = rules(vec![rule(
            "new-agent",
            Some("tenant == 'acme' && token == 'new-agent'"),
            None,
        )]);
        let p = serde_json::json!({"amount_minor": 1, "currency": "EUR"});
        assert!(
            a.evaluate(&env(p.clone()), Asker { token: "new-agent" })
                .hold
                .is_some()
        );
        assert!(
            a.evaluate(&env(p), Asker { token: "old-agent" })
                .hold
                .is_none()
        );
    }

    #[test]
    fn first_contact_asks_the_journal_with_a_subject_per_recipient() {
        let mut r = rule("first", None, None);
        r.first_contact = Some(FirstContact {
            field: "/creditor".into(),
            days: 30,
        });
        let a = rules(vec![r]);
        let v = a.evaluate(
            &env(serde_json::json!({"creditor": "DE02"})),
            Asker { token: "t" },
        );
        assert_eq!(v.hold, None);
        assert_eq!(v.if_new.len(), 1);
        assert_eq!(Some(&v.if_new[0].subject_hash), v.subject_hash.as_ref());
        let other = a.evaluate(
            &env(serde_json::json!({"creditor": "DE03"})),
            Asker { token: "t" },
        );
        assert_ne!(other.subject_hash, v.subject_hash);
        // No recipient at all: held.
        assert!(
            a.evaluate(&env(serde_json::json!({})), Asker { token: "t" })
                .hold
                .is_some()
        );
    }

    #[test]
    fn a_rule_that_does_not_parse_is_named() {
        let mut config = Config::builtin().expect("builtin");
        let mut p = config.actions["payment_order.create"].clone();
        p.approval = vec![rule("broken", Some("payload.amount >"), None)];
        config.actions.insert("payment_order.create".into(), p);
        let e = config.validate().expect_err("refused").to_string();
        assert!(
            e.contains("approval[0].when") && e.contains("broken"),
            "{e}"
        );
    }
}
