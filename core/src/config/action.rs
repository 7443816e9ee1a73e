//! `[actions."TYPE"]`: the policy of one action type — its provider, its lease, its
//! retries, and what to do when nobody knows whether the effect happened.
//!
//! Why the lease is checked against the provider: a worker must be able to finish a
//! call (plus a margin to commit) before its lease ends, or the sweeper declares the
//! attempt unknown while the call is still running.

use super::duration::{human, human_opt};
use super::error::{ConfigError, invalid};
use super::providers::ProviderConfig;
use crate::identity::ActionType;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// What to do with an operation whose outcome is unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnUnknown {
    /// Ask the provider; if it proves absence and honours keys within retention (or its
    /// absence is authoritative), retry with the same key; otherwise a person decides.
    ReconcileThenRetryIfAbsent,
    /// Ask the provider; settle only on a positive answer; anything else → review.
    /// The policy for money.
    ReconcileThenReview,
    /// No automation at all: straight to review.
    Review,
}

/// The policy for one action type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActionPolicy {
    /// Name of the provider (a key of `[providers]`).
    pub provider: String,
    /// How long a worker holds an operation (must exceed the provider timeout).
    #[serde(default = "default_lease", with = "human")]
    pub lease: Duration,
    /// Attempts before a not-sent failure becomes final.
    #[serde(default = "default_max_attempts")]
    pub max_attempts: i32,
    /// First retry delay after a not-sent failure (doubles per attempt).
    #[serde(default = "default_retry_delay", with = "human")]
    pub retry_delay: Duration,
    /// What to do with unknowns.
    #[serde(default = "default_on_unknown")]
    pub on_unknown: OnUnknown,
    /// Lookups that fail (or say "pending") before a person is asked.
    #[serde(default = "default_max_checks")]
    pub max_reconcile_checks: i32,
    /// What the action does, in a sentence for people and models (the gateway's action
    /// list and the MCP tool's description).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// A JSON Schema (draft 2020-12 unless `$schema` says otherwise) the payload must
    /// satisfy; checked by the gateway before recording and by the worker before calling
    /// the provider. `None`: any JSON object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_schema: Option<serde_json::Value>,
    /// Publish outcome events for this action type (`<prefix>.outcomes`, routing key
    /// `<action_type>.<status>`), from every process that settles one. `false`: none —
    /// for action types nobody listens to, where each event is a confirmed publish to an
    /// exchange that routes it nowhere (docs/performance.md, "Outcome events off"). Agents
    /// waiting through the SDK's `wait` or the gateway then learn the outcome from their
    /// periodic read of the journal (every 5 s) instead of at once.
    #[serde(default = "default_outcome_events")]
    pub outcome_events: bool,
    /// How long an operation may stay `deferred` (throttled by its provider, or waiting
    /// for a slot in the fleet's budget for it) before it ends `failed_final` with
    /// `deferred_too_long` — never sent. Counted from its first deferral.
    #[serde(default = "default_max_defer", with = "human")]
    pub max_defer: Duration,
    /// How old an operation of this type may get before it starts: one not started
    /// `max_age` after it was recorded ends `expired`, never sent (an intent's own
    /// `expires_at` may set an earlier deadline). `None`: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "human_opt")]
    pub max_age: Option<Duration>,
    /// Approval rules (`[[actions."TYPE".approval]]`, docs/approvals.md): an operation any
    /// of them matches is held (`awaiting_approval`) until people approve it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approval: Vec<ApprovalRule>,
}

/// One approval rule: hold the operations it matches until a person approves.
///
/// A rule matches when `when` (a CEL expression over `payload`, `tenant`, `token`,
/// `action_type`; absent: true) is true **and**, with `first_contact`, the tenant has no
/// succeeded operation of this action type with the same value of that payload field in
/// the last `days` days. An expression that fails at run time (a missing field, a wrong
/// type) holds the operation: a rule that cannot decide never lets an action through.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalRule {
    /// The rule's name: recorded on the held operation, shown to approvers, in metrics.
    pub name: String,
    /// CEL: hold when true (e.g. `payload.amount_minor > 100000 || payload.currency != "EUR"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
    /// Hold only a first contact: a recipient this tenant never wrote to (recently).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_contact: Option<FirstContact>,
    /// CEL: when true, two different people must approve (four eyes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub four_eyes: Option<String>,
    /// How long people have to decide; then the operation ends `rejected`
    /// (`approval_timed_out`), never sent.
    #[serde(default = "default_approval_timeout", with = "human")]
    pub timeout: Duration,
}

/// `first_contact = { field = "/to", days = 30 }`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FirstContact {
    /// A JSON Pointer into the payload (`/to`, `/creditor/iban`).
    pub field: String,
    /// How far back a succeeded operation counts as "written to before".
    #[serde(default = "default_first_contact_days")]
    pub days: u32,
}

fn default_approval_timeout() -> Duration {
    Duration::from_secs(24 * 3600)
}

fn default_first_contact_days() -> u32 {
    90
}

fn default_max_defer() -> Duration {
    Duration::from_secs(6 * 3600)
}

fn default_outcome_events() -> bool {
    true
}
fn default_lease() -> Duration {
    Duration::from_secs(120)
}
fn default_max_attempts() -> i32 {
    5
}
fn default_retry_delay() -> Duration {
    Duration::from_secs(5)
}
fn default_on_unknown() -> OnUnknown {
    OnUnknown::ReconcileThenReview
}
fn default_max_checks() -> i32 {
    10
}

impl ActionPolicy {
    /// A policy for `provider` with every other field at its default.
    pub fn new(provider: impl Into<String>) -> Self {
        Self {
            provider: provider.into(),
            lease: default_lease(),
            max_attempts: default_max_attempts(),
            retry_delay: default_retry_delay(),
            on_unknown: default_on_unknown(),
            max_reconcile_checks: default_max_checks(),
            description: None,
            payload_schema: None,
            outcome_events: default_outcome_events(),
            max_defer: default_max_defer(),
            max_age: None,
            approval: Vec::new(),
        }
    }

    /// The action type is well formed, its provider exists, and the lease outlasts
    /// the provider's timeout by more than a second.
    pub fn validate(
        &self,
        action: &str,
        providers: &BTreeMap<String, ProviderConfig>,
    ) -> Result<(), ConfigError> {
        let f = |x: &str| format!("actions.\"{action}\".{x}");
        ActionType::parse(action)
            .map_err(|e| invalid(format!("actions.\"{action}\""), e.to_string()))?;
        let Some(p) = providers.get(&self.provider) else {
            return Err(invalid(
                f("provider"),
                format!("no provider named {:?} in [providers]", self.provider),
            ));
        };
        if self.lease <= p.timeout() + Duration::from_secs(1) {
            return Err(invalid(
                f("lease"),
                format!(
                    "must exceed the provider timeout ({:?}) by more than 1s",
                    p.timeout()
                ),
            ));
        }
        if self.max_defer.is_zero() {
            return Err(invalid(f("max_defer"), "must be above zero"));
        }
        if self.max_attempts < 1 {
            return Err(invalid(f("max_attempts"), "must be at least 1"));
        }
        if self.max_age.is_some_and(|d| d.is_zero()) {
            return Err(invalid(f("max_age"), "must be above zero"));
        }
        let mut names = std::collections::BTreeSet::new();
        for (i, rule) in self.approval.iter().enumerate() {
            let at = |x: &str| f(&format!("approval[{i}].{x}"));
            if !crate::approval::valid_rule_name(&rule.name) {
                return Err(invalid(at("name"), "must be 1..=64 of a-z A-Z 0-9 . _ -"));
            }
            if !names.insert(rule.name.as_str()) {
                return Err(invalid(
                    at("name"),
                    format!("{:?} is used twice", rule.name),
                ));
            }
            for (what, expr) in [("when", &rule.when), ("four_eyes", &rule.four_eyes)] {
                if let Some(expr) = expr {
                    crate::approval::compile(expr)
                        .map_err(|e| invalid(at(what), format!("rule {:?}: {e}", rule.name)))?;
                }
            }
            if let Some(fc) = &rule.first_contact
                && !(fc.field.starts_with('/') && fc.days >= 1)
            {
                return Err(invalid(
                    at("first_contact"),
                    format!(
                        "rule {:?}: field must be a JSON Pointer (\"/to\") and days at least 1",
                        rule.name
                    ),
                ));
            }
            if rule.timeout.is_zero() {
                return Err(invalid(at("timeout"), "must be above zero"));
            }
        }
        if let Some(schema) = &self.payload_schema {
            crate::schema::compile(schema).map_err(|e| invalid(f("payload_schema"), e))?;
        }
        Ok(())
    }
}
