//! `[actions."TYPE"]`: the policy of one action type — its provider, its lease, its
//! retries, and what to do when nobody knows whether the effect happened.
//!
//! Why the lease is checked against the provider: a worker must be able to finish a
//! call (plus a margin to commit) before its lease ends, or the sweeper declares the
//! attempt unknown while the call is still running.

use super::duration::human;
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
        if let Some(schema) = &self.payload_schema {
            crate::schema::compile(schema).map_err(|e| invalid(f("payload_schema"), e))?;
        }
        Ok(())
    }
}
