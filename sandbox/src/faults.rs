//! The fault configuration: what can go wrong, where, and how often.
//!
//! Why its own parser: a fault config is written by hand in tests, the demo
//! and benchmarks, and a mistake there (a rate of `1.5`, a provider called
//! `banks`, a field called `rat`) must fail loudly with the name of the field,
//! not quietly produce a run that injects nothing. `serde` alone reports
//! "unknown variant at line 1 column 57"; [`Faults::from_json`] reports
//! `rules[0].provider: unknown provider "banks" …`.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::provider::Provider;

/// Default `status` of an `error_before_commit` rule.
pub const DEFAULT_ERROR_STATUS: u16 = 503;
/// Default `hold_ms` of an `accept_then_timeout` rule.
pub const DEFAULT_HOLD_MS: u64 = 60_000;

/// What an applying rule does to an execute request whose key is new.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultMode {
    /// Commit the effect, then never answer: hold the request `hold_ms`, then
    /// close the connection without a response.
    AcceptThenTimeout,
    /// Commit the effect, then drop the TCP connection abruptly (RST), no response.
    AcceptThenReset,
    /// Answer `status` (`{"error":"unavailable"}`) without any effect; the key is released.
    ErrorBeforeCommit,
    /// No effect; store and answer a rejection (422), replayed for the same key.
    Reject,
    /// Only the rule's extra `latency_ms`, then a normal commit.
    Latency,
}

impl FaultMode {
    /// Every mode, in a fixed order.
    pub const ALL: [FaultMode; 5] = [
        FaultMode::AcceptThenTimeout,
        FaultMode::AcceptThenReset,
        FaultMode::ErrorBeforeCommit,
        FaultMode::Reject,
        FaultMode::Latency,
    ];

    /// The name used in JSON (`accept_then_timeout`, …).
    pub fn name(self) -> &'static str {
        match self {
            FaultMode::AcceptThenTimeout => "accept_then_timeout",
            FaultMode::AcceptThenReset => "accept_then_reset",
            FaultMode::ErrorBeforeCommit => "error_before_commit",
            FaultMode::Reject => "reject",
            FaultMode::Latency => "latency",
        }
    }
}

fn default_rate() -> f64 {
    1.0
}
fn default_status() -> u16 {
    DEFAULT_ERROR_STATUS
}
fn default_hold_ms() -> u64 {
    DEFAULT_HOLD_MS
}

/// One fault rule. Build with [`FaultRule::new`] and the chained setters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultRule {
    /// Only this provider; `None` = every provider.
    #[serde(default)]
    pub provider: Option<Provider>,
    /// What happens when the rule applies.
    pub mode: FaultMode,
    /// Chance in `[0, 1]` that the rule applies to a matching request (default 1).
    #[serde(default = "default_rate")]
    pub rate: f64,
    /// Apply at most this many times, then the rule is exhausted; `None` = unlimited.
    #[serde(default)]
    pub times: Option<u64>,
    /// Only requests with this exact idempotency key; `None` = every key.
    #[serde(default)]
    pub key: Option<String>,
    /// Extra delay before the outcome when the rule applies (any mode; default 0).
    #[serde(default)]
    pub latency_ms: u64,
    /// Status answered by `error_before_commit` (default 503).
    #[serde(default = "default_status")]
    pub status: u16,
    /// How long `accept_then_timeout` holds the request before closing (default 60000).
    #[serde(default = "default_hold_ms")]
    pub hold_ms: u64,
}

impl FaultRule {
    /// A rule for `mode` with every other field at its default
    /// (all providers, all keys, rate 1, unlimited times).
    pub fn new(mode: FaultMode) -> Self {
        FaultRule {
            provider: None,
            mode,
            rate: default_rate(),
            times: None,
            key: None,
            latency_ms: 0,
            status: default_status(),
            hold_ms: default_hold_ms(),
        }
    }

    /// Only `provider`.
    pub fn provider(mut self, provider: Provider) -> Self {
        self.provider = Some(provider);
        self
    }

    /// Apply with probability `rate`.
    pub fn rate(mut self, rate: f64) -> Self {
        self.rate = rate;
        self
    }

    /// Apply at most `times` times.
    pub fn times(mut self, times: u64) -> Self {
        self.times = Some(times);
        self
    }

    /// Only requests carrying idempotency key `key`.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Extra delay when the rule applies.
    pub fn latency_ms(mut self, ms: u64) -> Self {
        self.latency_ms = ms;
        self
    }

    /// Status for `error_before_commit`.
    pub fn status(mut self, status: u16) -> Self {
        self.status = status;
        self
    }

    /// Hold time for `accept_then_timeout`.
    pub fn hold_ms(mut self, ms: u64) -> Self {
        self.hold_ms = ms;
        self
    }

    /// Whether this rule is about `provider` and `key` (ignores rate and times).
    pub(crate) fn matches(&self, provider: Provider, key: &str) -> bool {
        self.provider.is_none_or(|p| p == provider) && self.key.as_deref().is_none_or(|k| k == key)
    }
}

/// A provider that rate-limits (`rate_limits[]`): above `per_second` (with `burst` at
/// once after a quiet spell) its requests — executes and lookups — are answered `429`
/// with a `Retry-After` header and `{"error":"rate_limited"}`, and nothing is done.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitFault {
    /// The provider limited (`None`: each provider, each with its own bucket).
    #[serde(default)]
    pub provider: Option<Provider>,
    /// Requests per second allowed.
    pub per_second: f64,
    /// Requests allowed at once after a quiet spell (default 1).
    #[serde(default = "default_burst")]
    pub burst: u32,
    /// The `Retry-After` answered, in seconds (default: until the next request would be
    /// allowed, rounded up; at least 1).
    #[serde(default)]
    pub retry_after_s: Option<u64>,
}

fn default_burst() -> u32 {
    1
}

/// The whole fault configuration (`PUT /control/faults`). `Default` = no faults.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Faults {
    /// Seed of the SplitMix64 generator that decides `rate`.
    pub seed: u64,
    /// Delay added to every execute request whose key is new.
    pub latency_ms: u64,
    /// Providers whose lookups answer 503 `lookup_unavailable`.
    pub lookup_disabled: Vec<Provider>,
    /// Completed records older than this are forgotten (absent for idempotency
    /// and lookup); effect counts stay. `None` = remember forever.
    pub forget_keys_after_ms: Option<u64>,
    /// Rules checked in order; the first one that applies wins.
    pub rules: Vec<FaultRule>,
    /// On the TLS listener: the share of connections closed before the handshake is
    /// answered (the client's handshake fails; nothing was sent).
    pub tls_drop_rate: f64,
    /// On the TLS listener: the share of connections held without answering the
    /// handshake (the client's connect times out; nothing was sent).
    pub tls_stall_rate: f64,
    /// Providers that answer 429 above a rate (see [`RateLimitFault`]).
    pub rate_limits: Vec<RateLimitFault>,
}

/// A fault config that was refused; `field` names the offending field
/// (`rules[0].rate`), or is empty when the whole document is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", if .field.is_empty() { .message.clone() } else { format!("{}: {}", .field, .message) })]
pub struct FaultConfigError {
    /// Path of the offending field, e.g. `rules[1].provider`.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl FaultConfigError {
    fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        FaultConfigError {
            field: field.into(),
            message: message.into(),
        }
    }
}

const FAULT_FIELDS: [&str; 8] = [
    "rate_limits",
    "seed",
    "latency_ms",
    "lookup_disabled",
    "forget_keys_after_ms",
    "rules",
    "tls_drop_rate",
    "tls_stall_rate",
];
const RULE_FIELDS: [&str; 8] = [
    "provider",
    "mode",
    "rate",
    "times",
    "key",
    "latency_ms",
    "status",
    "hold_ms",
];

/// Deserializes one field of `obj`; `Ok(None)` when absent or null.
fn field<T: DeserializeOwned>(
    obj: &Map<String, Value>,
    name: &str,
    path: &str,
    expected: &str,
) -> Result<Option<T>, FaultConfigError> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => serde_json::from_value(v.clone()).map(Some).map_err(|e| {
            FaultConfigError::new(path, format!("expected {expected}, got {v} ({e})"))
        }),
    }
}

fn reject_unknown(
    obj: &Map<String, Value>,
    known: &[&str],
    prefix: &str,
) -> Result<(), FaultConfigError> {
    match obj.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(FaultConfigError::new(
            format!("{prefix}{k}"),
            format!("unknown field (known: {})", known.join(", ")),
        )),
        None => Ok(()),
    }
}

fn provider_at(v: &Value, path: &str) -> Result<Provider, FaultConfigError> {
    match v {
        Value::String(s) => s
            .parse()
            .map_err(|e: String| FaultConfigError::new(path, e)),
        other => Err(FaultConfigError::new(
            path,
            format!("expected a provider name (mail, tickets or bank), got {other}"),
        )),
    }
}

impl Faults {
    /// Parses and validates a fault config document, naming the bad field on error.
    pub fn from_json(value: &Value) -> Result<Faults, FaultConfigError> {
        let obj = value
            .as_object()
            .ok_or_else(|| FaultConfigError::new("", "the fault config must be a JSON object"))?;
        reject_unknown(obj, &FAULT_FIELDS, "")?;
        let mut faults = Faults {
            seed: field(obj, "seed", "seed", "a non-negative integer")?.unwrap_or(0),
            latency_ms: field(obj, "latency_ms", "latency_ms", "a non-negative integer")?
                .unwrap_or(0),
            forget_keys_after_ms: field(
                obj,
                "forget_keys_after_ms",
                "forget_keys_after_ms",
                "a non-negative integer or null",
            )?,
            tls_drop_rate: field(obj, "tls_drop_rate", "tls_drop_rate", "a number")?.unwrap_or(0.0),
            tls_stall_rate: field(obj, "tls_stall_rate", "tls_stall_rate", "a number")?
                .unwrap_or(0.0),
            ..Faults::default()
        };
        match obj.get("lookup_disabled") {
            None | Some(Value::Null) => {}
            Some(Value::Array(items)) => {
                for (i, item) in items.iter().enumerate() {
                    let p = provider_at(item, &format!("lookup_disabled[{i}]"))?;
                    faults.lookup_disabled.push(p);
                }
            }
            Some(other) => {
                return Err(FaultConfigError::new(
                    "lookup_disabled",
                    format!("expected an array of provider names, got {other}"),
                ));
            }
        }
        match obj.get("rules") {
            None | Some(Value::Null) => {}
            Some(Value::Array(items)) => {
                for (i, item) in items.iter().enumerate() {
                    faults.rules.push(parse_rule(item, &format!("rules[{i}]"))?);
                }
            }
            Some(other) => {
                return Err(FaultConfigError::new(
                    "rules",
                    format!("expected an array of rules, got {other}"),
                ));
            }
        }
        if let Some(limits) = field(obj, "rate_limits", "rate_limits", "an array of rate limits")? {
            faults.rate_limits = limits;
        }
        faults.validate()?;
        Ok(faults)
    }

    /// Checks the ranges that types cannot express (rates, statuses, keys).
    pub fn validate(&self) -> Result<(), FaultConfigError> {
        for (name, rate) in [
            ("tls_drop_rate", self.tls_drop_rate),
            ("tls_stall_rate", self.tls_stall_rate),
        ] {
            if !(rate.is_finite() && (0.0..=1.0).contains(&rate)) {
                return Err(FaultConfigError::new(
                    name,
                    format!("must be a number in [0, 1], got {rate}"),
                ));
            }
        }
        if self.tls_drop_rate + self.tls_stall_rate > 1.0 {
            return Err(FaultConfigError::new(
                "tls_stall_rate",
                "tls_drop_rate + tls_stall_rate must be at most 1",
            ));
        }
        for (i, limit) in self.rate_limits.iter().enumerate() {
            if !(limit.per_second.is_finite() && limit.per_second > 0.0) {
                return Err(FaultConfigError::new(
                    format!("rate_limits[{i}].per_second"),
                    format!("must be above 0, got {}", limit.per_second),
                ));
            }
            if limit.burst == 0 {
                return Err(FaultConfigError::new(
                    format!("rate_limits[{i}].burst"),
                    "must be at least 1",
                ));
            }
        }
        for (i, rule) in self.rules.iter().enumerate() {
            let at = |f: &str| format!("rules[{i}].{f}");
            if !(rule.rate.is_finite() && (0.0..=1.0).contains(&rule.rate)) {
                return Err(FaultConfigError::new(
                    at("rate"),
                    format!("must be a number in [0, 1], got {}", rule.rate),
                ));
            }
            if !(400..=599).contains(&rule.status) {
                return Err(FaultConfigError::new(
                    at("status"),
                    format!("must be an error status in 400..=599, got {}", rule.status),
                ));
            }
            if rule.key.as_deref() == Some("") {
                return Err(FaultConfigError::new(
                    at("key"),
                    "must be a non-empty idempotency key (or null for every key)",
                ));
            }
        }
        Ok(())
    }
}

fn parse_rule(value: &Value, path: &str) -> Result<FaultRule, FaultConfigError> {
    let obj = value.as_object().ok_or_else(|| {
        FaultConfigError::new(path, format!("expected a rule object, got {value}"))
    })?;
    let prefix = format!("{path}.");
    reject_unknown(obj, &RULE_FIELDS, &prefix)?;
    let at = |f: &str| format!("{prefix}{f}");
    let mode = match obj.get("mode") {
        None | Some(Value::Null) => {
            return Err(FaultConfigError::new(
                at("mode"),
                format!(
                    "missing (one of {})",
                    FaultMode::ALL.map(FaultMode::name).join(", ")
                ),
            ));
        }
        Some(v) => serde_json::from_value::<FaultMode>(v.clone()).map_err(|_| {
            FaultConfigError::new(
                at("mode"),
                format!(
                    "unknown mode {v} (one of {})",
                    FaultMode::ALL.map(FaultMode::name).join(", ")
                ),
            )
        })?,
    };
    let provider = match obj.get("provider") {
        None | Some(Value::Null) => None,
        Some(v) => Some(provider_at(v, &at("provider"))?),
    };
    let rate = match obj.get("rate") {
        None | Some(Value::Null) => default_rate(),
        Some(v) => v.as_f64().ok_or_else(|| {
            FaultConfigError::new(at("rate"), format!("must be a number in [0, 1], got {v}"))
        })?,
    };
    Ok(FaultRule {
        provider,
        mode,
        rate,
        times: field(obj, "times", &at("times"), "a non-negative integer or null")?,
        key: field(obj, "key", &at("key"), "a string or null")?,
        latency_ms: field(
            obj,
            "latency_ms",
            &at("latency_ms"),
            "a non-negative integer",
        )?
        .unwrap_or(0),
        status: field(obj, "status", &at("status"), "an HTTP status code")?
            .unwrap_or_else(default_status),
        hold_ms: field(obj, "hold_ms", &at("hold_ms"), "a non-negative integer")?
            .unwrap_or_else(default_hold_ms),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn brief_example_parses_with_defaults() {
        let f = Faults::from_json(&json!({"seed": 42, "latency_ms": 0,
            "lookup_disabled": ["bank"], "forget_keys_after_ms": null,
            "rules": [{"provider": "bank", "mode": "accept_then_timeout", "rate": 0.3,
                       "times": null, "key": null, "latency_ms": 50, "status": 503,
                       "hold_ms": 60000}]}))
        .unwrap();
        assert_eq!(f.seed, 42);
        assert_eq!(f.lookup_disabled, vec![Provider::Bank]);
        assert_eq!(
            f.rules,
            vec![
                FaultRule::new(FaultMode::AcceptThenTimeout)
                    .provider(Provider::Bank)
                    .rate(0.3)
                    .latency_ms(50)
            ]
        );
        assert_eq!(Faults::from_json(&json!({})).unwrap(), Faults::default());
        let rule = &Faults::from_json(&json!({"rules": [{"mode": "reject"}]}))
            .unwrap()
            .rules[0];
        assert_eq!(rule, &FaultRule::new(FaultMode::Reject));
    }

    #[test]
    fn serde_round_trip_matches_parser() {
        let f = Faults {
            seed: 7,
            forget_keys_after_ms: Some(50),
            rules: vec![
                FaultRule::new(FaultMode::ErrorBeforeCommit)
                    .key("k:1")
                    .times(2)
                    .status(500),
            ],
            ..Faults::default()
        };
        let v = serde_json::to_value(&f).unwrap();
        assert_eq!(Faults::from_json(&v).unwrap(), f);
        assert_eq!(serde_json::from_value::<Faults>(v).unwrap(), f);
    }

    fn err(v: Value) -> FaultConfigError {
        Faults::from_json(&v).unwrap_err()
    }

    #[test]
    fn errors_name_the_field() {
        assert_eq!(
            err(json!({"rules": [{"mode": "reject", "rate": 1.5}]})).field,
            "rules[0].rate"
        );
        assert_eq!(
            err(json!({"rules": [{"mode": "reject"}, {"mode": "reject", "provider": "banks"}]}))
                .field,
            "rules[1].provider"
        );
        assert_eq!(
            err(json!({"rules": [{"mode": "explode"}]})).field,
            "rules[0].mode"
        );
        assert_eq!(err(json!({"rules": [{}]})).field, "rules[0].mode");
        assert_eq!(
            err(json!({"rules": [{"mode": "reject", "rat": 1}]})).field,
            "rules[0].rat"
        );
        assert_eq!(err(json!({"seed": -1})).field, "seed");
        assert_eq!(
            err(json!({"lookup_disabled": ["x"]})).field,
            "lookup_disabled[0]"
        );
        assert_eq!(
            err(json!({"rules": [{"mode": "error_before_commit", "status": 200}]})).field,
            "rules[0].status"
        );
        assert_eq!(err(json!({"latency": 5})).field, "latency");
        assert_eq!(err(json!([])).field, "");
        let msg = err(json!({"rules": [{"mode": "reject", "rate": "high"}]})).to_string();
        assert!(msg.starts_with("rules[0].rate: "), "{msg}");
    }
}
