//! Settings: per-action policies and providers from a TOML file, with env overrides.
//!
//! ```toml
//! [broker]
//! url = "amqp://guest:guest@127.0.0.1:5672/%2f"
//! prefix = "oncely"
//!
//! [actions."payment_order.create"]
//! provider = "bank"
//! lease = "2m"
//! max_attempts = 5
//! on_unknown = "reconcile_then_review"     # never a blind retry
//!
//! [providers.bank]
//! kind = "http"
//! base_url = "http://127.0.0.1:8085"
//! execute_path = "/v1/payment-orders"
//! lookup_path = "/v1/payment-orders?idempotency_key={key}"
//! key_retention = "24h"
//! timeout = "5s"
//! ```
//! Every field has a default except an action's `provider` and a provider's `base_url`
//! and `execute_path`. Env overrides: `DATABASE_URL`, `ONCELY_AMQP_URL`,
//! `ONCELY_PREFIX`, and generically `ONCELY__SECTION__NAME__FIELD=value` (for example
//! `ONCELY__PROVIDERS__BANK__BASE_URL=http://sandbox:8085`; `.` in an action type is
//! written `_DOT_`… or simply keep actions in the file). A bad file is a startup error
//! that names the field — never a panic at the first message.

use crate::identity::ActionType;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// A config error, naming the field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// TOML syntax or a field of the wrong shape.
    #[error("config {origin}: {message}")]
    Parse {
        /// The file (or "env").
        origin: String,
        /// The parser's message (it names the field and line).
        message: String,
    },
    /// A value that parses but makes no sense.
    #[error("config field `{field}`: {problem}")]
    Invalid {
        /// Dotted path of the field.
        field: String,
        /// What is wrong.
        problem: String,
    },
}

fn invalid(field: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        problem: problem.into(),
    }
}

/// What to do with an operation whose outcome is unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
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

/// Broker settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BrokerConfig {
    /// AMQP URL (env `ONCELY_AMQP_URL`).
    pub url: String,
    /// Prefix of every exchange and queue name (env `ONCELY_PREFIX`).
    pub prefix: String,
    /// `quorum` (default) or `classic`.
    pub queue_type: String,
    /// `x-delivery-limit` of the action queues: deliveries before dead-lettering.
    pub delivery_limit: i64,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        Self {
            url: "amqp://guest:guest@127.0.0.1:5672/%2f".into(),
            prefix: "oncely".into(),
            queue_type: "quorum".into(),
            delivery_limit: 20,
        }
    }
}

/// Worker tuning.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerConfig {
    /// Unacked deliveries RabbitMQ may push per consumer.
    pub prefetch: u16,
    /// Provider calls in flight at once in this process.
    pub max_in_flight: usize,
    /// Most deliveries claimed (and completions committed) per statement.
    pub batch: usize,
    /// Largest accepted message (bytes).
    pub max_message_bytes: usize,
    /// Postgres connections of this process.
    pub db_connections: u32,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            prefetch: 128,
            max_in_flight: 64,
            batch: 64,
            max_message_bytes: crate::intent::DEFAULT_MAX_ENVELOPE_BYTES,
            db_connections: 8,
        }
    }
}

/// Reconciler and sweeper tuning.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReconcilerConfig {
    /// How often the sweeper runs.
    #[serde(deserialize_with = "de_duration")]
    pub sweep_interval: Duration,
    /// `planned` rows untouched this long are republished (lost publishes heal).
    #[serde(deserialize_with = "de_duration")]
    pub republish_after: Duration,
    /// `unknown` rows due this long without a check are checked by the sweeper itself.
    #[serde(deserialize_with = "de_duration")]
    pub stale_unknown_after: Duration,
    /// How long one check holds an unknown (another reconciler may take it after).
    #[serde(deserialize_with = "de_duration")]
    pub check_lease: Duration,
    /// First delay before re-checking a pending / failed lookup (doubles per check).
    #[serde(deserialize_with = "de_duration")]
    pub recheck_delay: Duration,
    /// Longest delay between checks.
    #[serde(deserialize_with = "de_duration")]
    pub max_recheck_delay: Duration,
    /// Rows per sweep statement.
    pub batch: i64,
    /// Reconcile messages handled at once.
    pub concurrency: usize,
}

impl Default for ReconcilerConfig {
    fn default() -> Self {
        Self {
            sweep_interval: Duration::from_secs(5),
            republish_after: Duration::from_secs(30),
            stale_unknown_after: Duration::from_secs(30),
            check_lease: Duration::from_secs(30),
            recheck_delay: Duration::from_secs(5),
            max_recheck_delay: Duration::from_secs(300),
            batch: 200,
            concurrency: 16,
        }
    }
}

/// The policy for one action type.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActionPolicy {
    /// Name of the provider (a key of `[providers]`).
    pub provider: String,
    /// How long a worker holds an operation (must exceed the provider timeout).
    #[serde(default = "default_lease", deserialize_with = "de_duration")]
    pub lease: Duration,
    /// Attempts before a not-sent failure becomes final.
    #[serde(default = "default_max_attempts")]
    pub max_attempts: i32,
    /// First retry delay after a not-sent failure (doubles per attempt).
    #[serde(default = "default_retry_delay", deserialize_with = "de_duration")]
    pub retry_delay: Duration,
    /// What to do with unknowns.
    #[serde(default = "default_on_unknown")]
    pub on_unknown: OnUnknown,
    /// Lookups that fail (or say "pending") before a person is asked.
    #[serde(default = "default_max_checks")]
    pub max_reconcile_checks: i32,
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

/// A provider behind the generic HTTP/JSON adapter.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// Adapter kind: `http`.
    #[serde(default = "default_kind")]
    pub kind: String,
    /// `http://host:port` of the provider.
    pub base_url: String,
    /// Path to POST the payload to.
    pub execute_path: String,
    /// Lookup by key: a path with `{key}` (percent-encoded). Empty: no lookup by key.
    #[serde(default)]
    pub lookup_path: String,
    /// Lookup by business reference: a path with `{reference}`.
    #[serde(default)]
    pub lookup_by_reference_path: String,
    /// JSON pointer to the business reference inside the payload.
    #[serde(default = "default_reference_pointer")]
    pub reference_pointer: String,
    /// Header carrying the idempotency key.
    #[serde(default = "default_key_header")]
    pub idempotency_header: String,
    /// JSON pointer to the provider's id in its answers.
    #[serde(default = "default_id_pointer")]
    pub id_pointer: String,
    /// JSON pointer to the status in lookup answers.
    #[serde(default = "default_status_pointer")]
    pub status_pointer: String,
    /// Lookup status strings meaning "done".
    #[serde(default = "default_succeeded_values")]
    pub succeeded_values: Vec<String>,
    /// Lookup status strings meaning "rejected".
    #[serde(default = "default_rejected_values")]
    pub rejected_values: Vec<String>,
    /// TCP connect timeout (a failure here is "not sent").
    #[serde(default = "default_connect_timeout", deserialize_with = "de_duration")]
    pub connect_timeout: Duration,
    /// Whole-request timeout (a timeout after connecting is "unknown").
    #[serde(default = "default_timeout", deserialize_with = "de_duration")]
    pub timeout: Duration,
    /// Whether the provider deduplicates by the idempotency key.
    #[serde(default = "default_true")]
    pub honours_key: bool,
    /// How long the provider remembers keys (from the first attempt).
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub key_retention: Option<Duration>,
    /// Whether a 404 from lookup proves the effect never happened.
    #[serde(default)]
    pub absence_authoritative: bool,
}

fn default_kind() -> String {
    "http".into()
}
fn default_reference_pointer() -> String {
    "/business_reference".into()
}
fn default_key_header() -> String {
    "Idempotency-Key".into()
}
fn default_id_pointer() -> String {
    "/id".into()
}
fn default_status_pointer() -> String {
    "/status".into()
}
fn default_succeeded_values() -> Vec<String> {
    vec!["succeeded".into()]
}
fn default_rejected_values() -> Vec<String> {
    vec!["rejected".into(), "failed".into()]
}
fn default_connect_timeout() -> Duration {
    Duration::from_secs(1)
}
fn default_timeout() -> Duration {
    Duration::from_secs(5)
}
fn default_true() -> bool {
    true
}

/// The whole configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Postgres URL (env `DATABASE_URL`).
    #[serde(default = "default_db")]
    pub database_url: String,
    /// Broker.
    #[serde(default)]
    pub broker: BrokerConfig,
    /// Worker tuning.
    #[serde(default)]
    pub worker: WorkerConfig,
    /// Reconciler and sweeper tuning.
    #[serde(default)]
    pub reconciler: ReconcilerConfig,
    /// Policies by action type.
    #[serde(default)]
    pub actions: BTreeMap<String, ActionPolicy>,
    /// Providers by name.
    #[serde(default)]
    pub providers: BTreeMap<String, ProviderConfig>,
}

fn default_db() -> String {
    "postgres://postgres@127.0.0.1:5432/oncely".into()
}

/// The built-in configuration: the three sandbox providers and their actions.
pub const DEFAULT_CONFIG: &str = include_str!("../../config/oncely.toml");

impl Config {
    /// Load `path` (or the built-in default) and apply env overrides from the process env.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        let (text, origin) = match path {
            Some(p) => (
                std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                    path: p.display().to_string(),
                    source,
                })?,
                p.display().to_string(),
            ),
            None => (DEFAULT_CONFIG.to_owned(), "(built-in default)".to_owned()),
        };
        Self::from_toml(&text, &origin, std::env::vars())
    }

    /// Parse TOML text and apply overrides from `env` (testable without the process env).
    pub fn from_toml(
        text: &str,
        origin: &str,
        env: impl Iterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let mut doc: toml::Table = toml::from_str(text).map_err(|e| ConfigError::Parse {
            origin: origin.into(),
            message: e.to_string(),
        })?;
        for (name, value) in env {
            let path: Vec<String> = match name.as_str() {
                "DATABASE_URL" => vec!["database_url".into()],
                "ONCELY_AMQP_URL" => vec!["broker".into(), "url".into()],
                "ONCELY_PREFIX" => vec!["broker".into(), "prefix".into()],
                _ => match name.strip_prefix("ONCELY__") {
                    Some(rest) => rest
                        .split("__")
                        .map(|s| s.to_lowercase().replace("_dot_", "."))
                        .collect(),
                    None => continue,
                },
            };
            set_path(&mut doc, &path, &value)
                .map_err(|problem| invalid(format!("{name} (env)"), problem))?;
        }
        let config: Config = doc
            .try_into()
            .map_err(|e: toml::de::Error| ConfigError::Parse {
                origin: origin.into(),
                message: e.to_string(),
            })?;
        config.validate()?;
        Ok(config)
    }

    /// The policy for an action type, if configured.
    pub fn policy(&self, action: &ActionType) -> Option<&ActionPolicy> {
        self.actions.get(action.as_str())
    }

    /// Cross-field checks: every reference resolves and the numbers make sense.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.broker.prefix.is_empty()
            || !self
                .broker
                .prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        {
            return Err(invalid(
                "broker.prefix",
                "must be non-empty ASCII letters, digits, '.', '_' or '-'",
            ));
        }
        if !matches!(self.broker.queue_type.as_str(), "quorum" | "classic") {
            return Err(invalid(
                "broker.queue_type",
                "must be \"quorum\" or \"classic\"",
            ));
        }
        if self.broker.delivery_limit < 1 {
            return Err(invalid("broker.delivery_limit", "must be at least 1"));
        }
        let w = &self.worker;
        for (field, v) in [
            ("worker.prefetch", w.prefetch as usize),
            ("worker.max_in_flight", w.max_in_flight),
            ("worker.batch", w.batch),
            ("worker.db_connections", w.db_connections as usize),
        ] {
            if v == 0 {
                return Err(invalid(field, "must be at least 1"));
            }
        }
        let r = &self.reconciler;
        if r.sweep_interval.is_zero() || r.check_lease.is_zero() || r.recheck_delay.is_zero() {
            return Err(invalid(
                "reconciler",
                "sweep_interval, check_lease and recheck_delay must be above zero",
            ));
        }
        if r.batch < 1 || r.concurrency == 0 {
            return Err(invalid(
                "reconciler.batch",
                "batch and concurrency must be at least 1",
            ));
        }
        for (name, p) in &self.providers {
            let f = |x: &str| format!("providers.{name}.{x}");
            if p.kind != "http" {
                return Err(invalid(
                    f("kind"),
                    format!("unknown adapter kind {:?}; supported: \"http\"", p.kind),
                ));
            }
            if !p.base_url.starts_with("http://") {
                return Err(invalid(
                    f("base_url"),
                    "must start with http:// (TLS is terminated by a sidecar)",
                ));
            }
            if !p.execute_path.starts_with('/') {
                return Err(invalid(f("execute_path"), "must start with '/'"));
            }
            if !p.lookup_path.is_empty() && !p.lookup_path.contains("{key}") {
                return Err(invalid(f("lookup_path"), "must contain {key}"));
            }
            if !p.lookup_by_reference_path.is_empty()
                && !p.lookup_by_reference_path.contains("{reference}")
            {
                return Err(invalid(
                    f("lookup_by_reference_path"),
                    "must contain {reference}",
                ));
            }
            if p.connect_timeout.is_zero() || p.timeout < p.connect_timeout {
                return Err(invalid(
                    f("timeout"),
                    "must be at least connect_timeout, and both above zero",
                ));
            }
        }
        for (action, a) in &self.actions {
            let f = |x: &str| format!("actions.\"{action}\".{x}");
            ActionType::parse(action)
                .map_err(|e| invalid(format!("actions.\"{action}\""), e.to_string()))?;
            let Some(p) = self.providers.get(&a.provider) else {
                return Err(invalid(
                    f("provider"),
                    format!("no provider named {:?} in [providers]", a.provider),
                ));
            };
            if a.lease <= p.timeout + Duration::from_secs(1) {
                return Err(invalid(
                    f("lease"),
                    format!(
                        "must exceed the provider timeout ({:?}) by more than 1s",
                        p.timeout
                    ),
                ));
            }
            if a.max_attempts < 1 {
                return Err(invalid(f("max_attempts"), "must be at least 1"));
            }
        }
        Ok(())
    }
}

fn set_path(doc: &mut toml::Table, path: &[String], raw: &str) -> Result<(), String> {
    let (last, parents) = path.split_last().ok_or("empty override path")?;
    let mut table = doc;
    for p in parents {
        let entry = table
            .entry(p.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        table = entry
            .as_table_mut()
            .ok_or_else(|| format!("`{p}` is not a table"))?;
    }
    // A number or boolean if it reads as one, otherwise a string.
    let value = raw
        .parse::<i64>()
        .map(toml::Value::Integer)
        .or_else(|_| raw.parse::<bool>().map(toml::Value::Boolean))
        .unwrap_or_else(|_| toml::Value::String(raw.to_owned()));
    table.insert(last.clone(), value);
    Ok(())
}

/// Parse `500ms`, `5s`, `2m`, `24h`, `7d` (an integer and a unit).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().map_err(|_| {
        format!("{s:?} is not a duration like \"500ms\", \"5s\", \"2m\", \"24h\", \"7d\"")
    })?;
    let secs = match unit.trim() {
        "ms" => return Ok(Duration::from_millis(n)),
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86400,
        _ => return Err(format!("{s:?} has no unit: use ms, s, m, h or d")),
    };
    Ok(Duration::from_secs(secs))
}

fn de_duration<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    parse_duration(&s).map_err(serde::de::Error::custom)
}

fn de_opt_duration<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let s = Option::<String>::deserialize(d)?;
    s.map(|s| parse_duration(&s).map_err(serde::de::Error::custom))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        Config::from_toml(
            text,
            "test.toml",
            env.iter().map(|(k, v)| (k.to_string(), v.to_string())),
        )
    }

    #[test]
    fn the_default_config_is_valid() {
        let c = load(DEFAULT_CONFIG, &[]).expect("default config");
        assert_eq!(c.actions.len(), 3);
        assert_eq!(
            c.actions["payment_order.create"].on_unknown,
            OnUnknown::ReconcileThenReview
        );
    }

    #[test]
    fn env_overrides_apply() {
        let c = load(
            DEFAULT_CONFIG,
            &[
                ("ONCELY__PROVIDERS__BANK__BASE_URL", "http://sandbox:9999"),
                ("ONCELY_PREFIX", "t1"),
                ("ONCELY__WORKER__PREFETCH", "7"),
                ("DATABASE_URL", "postgres://x@y/z"),
            ],
        )
        .expect("config");
        assert_eq!(c.providers["bank"].base_url, "http://sandbox:9999");
        assert_eq!(c.broker.prefix, "t1");
        assert_eq!(c.worker.prefetch, 7);
        assert_eq!(c.database_url, "postgres://x@y/z");
    }

    #[test]
    fn errors_name_the_field() {
        let cases: &[(&str, &str)] = &[
            (
                "[actions.\"email.send\"]\nprovider = \"nope\"\n",
                "actions.\"email.send\".provider",
            ),
            (
                "[actions.\"Bad Type\"]\nprovider = \"x\"\n",
                "actions.\"Bad Type\"",
            ),
            (
                "[providers.p]\nbase_url = \"http://x\"\nexecute_path = \"/e\"\ntimeout = \"5 parsecs\"\n",
                "timeout",
            ),
            (
                "[providers.p]\nbase_url = \"ftp://x\"\nexecute_path = \"/e\"\n",
                "providers.p.base_url",
            ),
            (
                "[providers.p]\nbase_url = \"http://x\"\nexecute_path = \"/e\"\n[actions.\"a.b\"]\nprovider = \"p\"\nlease = \"3s\"\n",
                "actions.\"a.b\".lease",
            ),
            ("[worker]\nprefetch = 0\n", "worker.prefetch"),
            ("[worker]\nprefech = 1\n", "prefech"),
        ];
        for (text, field) in cases {
            let err = load(text, &[]).expect_err(text).to_string();
            assert!(err.contains(field), "{err:?} should name {field}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86400)));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("m").is_err());
    }
}
