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
//! kind = "http"                            # the default
//! base_url = "http://127.0.0.1:8085"
//! execute_path = "/v1/payment-orders"
//! lookup_path = "/v1/payment-orders?idempotency_key={key}"
//! key_retention = "24h"
//! timeout = "5s"
//! ```
//! Every field has a default except an action's `provider` and what a provider's
//! adapter requires (for `http`: `base_url` and `execute_path`). Env overrides:
//! `DATABASE_URL`, `ONCELY_AMQP_URL`, `ONCELY_PREFIX`, and generically
//! `ONCELY__SECTION__NAME__FIELD=value` (for example
//! `ONCELY__PROVIDERS__BANK__BASE_URL=http://sandbox:8085`; `.` in an action type is
//! written `_DOT_`… or simply keep actions in the file). A bad file is a startup error
//! that names the field — never a panic at the first message.
//!
//! Why the config is also *written*: tests, the bench and the chaos run start real
//! worker processes, and they build those processes' config as a typed [`Config`]
//! (the built-in one, with fields changed) and hand it over with [`Config::to_toml`] —
//! never as TOML text put together by hand, which drifts from the types.
//!
//! # Layout
//! - [`error`]: [`ConfigError`], naming the field.
//! - [`duration`]: `500ms` / `2m` durations, read and written.
//! - [`broker`], [`worker`], [`reconciler`], [`action`]: one section each, each with
//!   its own defaults and checks.
//! - [`providers`]: `[providers.NAME]` as an enum by `kind`; each adapter's config type
//!   validates itself ([`providers::http`]).
//! - `env`: the environment overrides.

use crate::identity::ActionType;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

pub mod action;
pub mod broker;
pub mod duration;
mod env;
pub mod error;
pub mod providers;
pub mod reconciler;
pub mod worker;

pub use action::{ActionPolicy, ApprovalRule, FirstContact, OnUnknown};
pub use broker::{BrokerConfig, BrokerTls};
pub use duration::{format_duration, parse_duration};
pub use error::ConfigError;
pub use providers::{
    BasicAuth, Encoding, HttpProviderConfig, ImapArchive, ProviderConfig, RateLimitConfig,
    Security, SmtpProviderConfig, ValueSource,
};
pub use reconciler::ReconcilerConfig;
pub use worker::WorkerConfig;

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Postgres URL (env `DATABASE_URL`).
    #[serde(default = "default_db")]
    pub database_url: String,
    /// `"transaction"` when `database_url` is a transaction-pooling pooler (pgbouncer
    /// `pool_mode = transaction`), `"none"` (default) for Postgres itself (env
    /// `ONCELY_DATABASE_POOLER`; docs/scaling.md, "Through pgbouncer").
    #[serde(default, skip_serializing_if = "DatabasePooler::is_none")]
    pub database_pooler: DatabasePooler,
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
    #[serde(default, deserialize_with = "providers::deserialize_map")]
    pub providers: BTreeMap<String, ProviderConfig>,
}

/// How `database_url` reaches Postgres ([`crate::pooler`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DatabasePooler {
    /// Postgres itself (or a session-pooling pooler).
    #[default]
    None,
    /// A transaction-pooling pooler: each statement in a transaction of its own, unnamed.
    Transaction,
}

impl DatabasePooler {
    /// Whether statements go through a transaction pooler.
    pub fn is_transaction(&self) -> bool {
        *self == Self::Transaction
    }

    fn is_none(&self) -> bool {
        *self == Self::None
    }
}

fn default_db() -> String {
    "postgres://postgres@127.0.0.1:5432/oncely".into()
}

/// The built-in configuration: the three sandbox providers and their actions.
pub const DEFAULT_CONFIG: &str = include_str!("../../../config/oncely.toml");

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

    /// The built-in configuration ([`DEFAULT_CONFIG`]) without env overrides: the
    /// starting point of every config a program builds for processes it spawns.
    pub fn builtin() -> Result<Self, ConfigError> {
        Self::from_toml(DEFAULT_CONFIG, "(built-in default)", std::iter::empty())
    }

    /// Parse TOML text and apply overrides from `env` (testable without the process env).
    pub fn from_toml(
        text: &str,
        origin: &str,
        env: impl Iterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let parse_error = |message: String| ConfigError::Parse {
            origin: origin.into(),
            message,
        };
        let mut doc: toml::Table = toml::from_str(text).map_err(|e| parse_error(e.to_string()))?;
        env::apply(&mut doc, env)?;
        let config: Config = doc
            .try_into()
            .map_err(|e: toml::de::Error| parse_error(e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    /// This config as TOML that [`Config::from_toml`] reads back to an equal config
    /// (durations in their human form, every field written out).
    pub fn to_toml(&self) -> Result<String, ConfigError> {
        toml::to_string(self).map_err(|e| ConfigError::Write {
            message: e.to_string(),
        })
    }

    /// Points every HTTP provider at `base_url`: the sandbox serves all the built-in
    /// providers on their usual paths at one address, so this turns the built-in config
    /// into one for a sandbox started on any port. Other kinds are left as they are.
    pub fn point_at_sandbox(&mut self, base_url: &str) -> &mut Self {
        for p in self.providers.values_mut() {
            if let ProviderConfig::Http(http) = p {
                http.base_url = base_url.to_owned();
            }
        }
        self
    }

    /// The policy for an action type, if configured.
    pub fn policy(&self, action: &ActionType) -> Option<&ActionPolicy> {
        self.actions.get(action.as_str())
    }

    /// Every section's own checks, then the cross-references: each action's provider
    /// exists and its lease outlasts that provider's timeout.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.broker.validate()?;
        self.worker.validate()?;
        self.reconciler.validate()?;
        for (name, p) in &self.providers {
            p.validate(&format!("providers.{name}"))?;
        }
        for (action, a) in &self.actions {
            a.validate(action, &self.providers)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn load(text: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        Config::from_toml(
            text,
            "test.toml",
            env.iter().map(|(k, v)| (k.to_string(), v.to_string())),
        )
    }

    fn http(c: &Config, name: &str) -> HttpProviderConfig {
        match &c.providers[name] {
            ProviderConfig::Http(h) => h.clone(),
            other => panic!("{name} is {}, not http", other.kind()),
        }
    }

    #[test]
    fn the_default_config_is_valid() {
        let c = load(DEFAULT_CONFIG, &[]).expect("default config");
        assert_eq!(c.actions.len(), 3);
        assert_eq!(
            c.actions["payment_order.create"].on_unknown,
            OnUnknown::ReconcileThenReview
        );
        assert_eq!(c.providers["bank"].kind(), "http");
        assert_eq!(Config::builtin().expect("builtin"), c);
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
                ("ONCELY_DATABASE_POOLER", "transaction"),
            ],
        )
        .expect("config");
        assert!(c.database_pooler.is_transaction());
        assert_eq!(http(&c, "bank").base_url, "http://sandbox:9999");
        assert_eq!(c.broker.prefix, "t1");
        assert_eq!(c.worker.prefetch, 7);
        assert_eq!(c.database_url, "postgres://x@y/z");
    }

    #[test]
    fn errors_name_the_field() {
        let p = "[providers.p]\nbase_url = \"http://x\"\nexecute_path = \"/e\"\n";
        let cases: &[(String, &str)] = &[
            (
                "[actions.\"email.send\"]\nprovider = \"nope\"\n".into(),
                "actions.\"email.send\".provider",
            ),
            (
                "[actions.\"Bad Type\"]\nprovider = \"x\"\n".into(),
                "actions.\"Bad Type\"",
            ),
            (format!("{p}timeout = \"5 parsecs\"\n"), "timeout"),
            (
                "[providers.p]\nbase_url = \"ftp://x\"\nexecute_path = \"/e\"\n".into(),
                "providers.p.base_url",
            ),
            (
                format!("{p}[actions.\"a.b\"]\nprovider = \"p\"\nlease = \"3s\"\n"),
                "actions.\"a.b\".lease",
            ),
            ("[worker]\nprefetch = 0\n".into(), "worker.prefetch"),
            ("[worker]\nprefech = 1\n".into(), "prefech"),
            (format!("{p}kind = \"fax\"\n"), "providers.p.kind"),
            (format!("{p}bse_url = \"x\"\n"), "bse_url"),
            (
                "[providers.p]\nbase_url = \"http://x\"\n".into(),
                "execute_path",
            ),
            (
                format!("{p}id_pointer = \"id\"\n"),
                "providers.p.id_pointer",
            ),
            (
                format!("{p}idempotency_header = \"Bad Header\"\n"),
                "providers.p.idempotency_header",
            ),
            (
                format!("{p}connect_timeout = \"2s\"\ntimeout = \"1s\"\n"),
                "providers.p.timeout",
            ),
            (
                "[broker.tls]\nca_file = \"/ca.pem\"\n".into(),
                "broker.tls.ca_file",
            ),
            (
                "[broker]\nurl = \"amqps://h/%2f\"\n[broker.tls]\ncert_file = \"/c.pem\"\n".into(),
                "broker.tls.key_file",
            ),
            ("[broker]\nurl = \"http://h\"\n".into(), "broker.url"),
            ("[broker.tls]\ncafile = \"/ca.pem\"\n".into(), "cafile"),
        ];
        for (text, field) in cases {
            let err = load(text, &[]).expect_err(text).to_string();
            assert!(err.contains(field), "{err:?} should name {field}");
        }
    }

    #[test]
    fn broker_tls_comes_from_the_file_or_the_env_and_round_trips() {
        let c = load(
            "[broker]\nurl = \"amqps://mq.example/%2f\"\n[broker.tls]\nca_file = \"/etc/oncely/ca.pem\"\n",
            &[
                ("ONCELY__BROKER__TLS__CERT_FILE", "/run/secrets/client.pem"),
                ("ONCELY__BROKER__TLS__KEY_FILE", "/run/secrets/client.key"),
            ],
        )
        .expect("config");
        let tls = &c.broker.tls;
        assert_eq!(
            tls.ca_file.as_deref(),
            Some(Path::new("/etc/oncely/ca.pem"))
        );
        assert_eq!(
            tls.cert_file.as_deref(),
            Some(Path::new("/run/secrets/client.pem"))
        );
        assert_eq!(
            tls.key_file.as_deref(),
            Some(Path::new("/run/secrets/client.key"))
        );
        assert_eq!(round_trip(&c), c);
        // Without TLS files, no [broker.tls] table is written.
        let plain = Config::builtin().expect("builtin");
        assert!(!plain.to_toml().expect("toml").contains("broker.tls"));
    }

    #[test]
    fn broker_urls_come_from_the_file_or_the_env_and_round_trip() {
        let c = load(
            "[broker]\nurls = [\"amqp://u:p@a:5672/%2f\", \"amqp://u:p@b:5673/%2f\"]\n",
            &[],
        )
        .expect("config");
        assert_eq!(
            c.broker.node_urls(),
            ["amqp://u:p@a:5672/%2f", "amqp://u:p@b:5673/%2f"]
        );
        assert_eq!(round_trip(&c), c);
        let c = load(
            "",
            &[(
                "ONCELY_AMQP_URLS",
                "amqps://u:p@a:5671/%2f, amqps://u:p@b:5671/%2f,amqps://u:p@c:5671/%2f",
            )],
        )
        .expect("env");
        assert_eq!(c.broker.node_urls().len(), 3);
        assert_eq!(c.broker.node_urls()[1], "amqps://u:p@b:5671/%2f");
        // Without `urls`, `url` alone (the single-node configs keep working).
        let c = load("[broker]\nurl = \"amqp://u:p@one:5672/%2f\"\n", &[]).expect("url");
        assert_eq!(c.broker.node_urls(), ["amqp://u:p@one:5672/%2f"]);
        assert!(!c.to_toml().expect("toml").contains("urls"));
    }

    #[test]
    fn bad_broker_urls_are_refused_with_the_field_named() {
        let two = "urls = [\"amqp://a/%2f\", \"amqp://b/%2f\"]\n";
        // (file, env, field named, problem said)
        type Case<'a> = (String, Vec<(&'a str, &'a str)>, &'a str, &'a str);
        let cases: Vec<Case<'_>> = vec![
            (
                format!("[broker]\nurl = \"amqp://x/%2f\"\n{two}"),
                vec![],
                "broker.urls",
                "together with broker.url",
            ),
            (
                format!("[broker]\n{two}"),
                vec![("ONCELY_AMQP_URL", "amqp://x/%2f")],
                "broker.urls",
                "together with broker.url",
            ),
            (
                "[broker]\nurls = [\"amqps://a/%2f\", \"amqp://b/%2f\"]\n".into(),
                vec![],
                "broker.urls",
                "mixes amqps:// and amqp://",
            ),
            (
                "[broker]\nurls = [\"amqp://a/%2f\", \"http://b\"]\n".into(),
                vec![],
                "broker.urls",
                "URL 2 of broker.urls must start with",
            ),
            (
                "[broker]\nurls = [\"amqp://a/%2f\", \"amqp://a/%2f\"]\n".into(),
                vec![],
                "broker.urls",
                "URL 2 of broker.urls repeats",
            ),
            (
                format!("[broker]\n{two}[broker.tls]\nca_file = \"/ca.pem\"\n"),
                vec![],
                "broker.tls.ca_file",
                "broker.urls is amqp://",
            ),
            (
                String::new(),
                vec![("ONCELY_AMQP_URLS", " , ")],
                "ONCELY_AMQP_URLS",
                "is empty",
            ),
        ];
        for (text, env, field, problem) in cases {
            let err = load(&text, &env).expect_err(&text).to_string();
            assert!(
                err.contains(field) && err.contains(problem),
                "{err:?} should name {field} and say {problem:?}"
            );
        }
    }

    #[test]
    fn a_provider_without_kind_is_http() {
        let c = load(
            "[providers.p]\nbase_url = \"http://x\"\nexecute_path = \"/e\"\n",
            &[],
        )
        .expect("config");
        assert_eq!(
            c.providers["p"],
            ProviderConfig::Http(HttpProviderConfig::new("http://x", "/e"))
        );
    }

    fn round_trip(c: &Config) -> Config {
        let text = c.to_toml().expect("to_toml");
        load(&text, &[]).unwrap_or_else(|e| panic!("{e}\n{text}"))
    }

    #[test]
    fn the_default_config_round_trips() {
        let c = Config::builtin().expect("builtin");
        assert_eq!(round_trip(&c), c);
    }

    #[test]
    fn a_changed_config_round_trips_with_human_durations() {
        let mut c = Config::builtin().expect("builtin");
        c.database_url = "postgres://u@h:1/db".into();
        c.broker.prefix = "t-1".into();
        c.worker.prefetch = 3;
        c.reconciler.sweep_interval = Duration::from_millis(200);
        c.reconciler.republish_after = Duration::from_secs(3600);
        c.point_at_sandbox("http://127.0.0.1:1234");
        let mut tickets = http(&c, "tickets");
        tickets.key_retention = None;
        tickets.absence_authoritative = true;
        tickets.succeeded_values = vec!["done".into(), "ok".into()];
        tickets.lookup_by_reference_path = String::new();
        c.providers
            .insert("tickets".into(), ProviderConfig::Http(tickets));
        c.providers.insert(
            "ledger".into(),
            ProviderConfig::Http(HttpProviderConfig::new("http://ledger", "/entries")),
        );
        let mut policy = ActionPolicy::new("ledger");
        policy.on_unknown = OnUnknown::Review;
        policy.retry_delay = Duration::from_millis(1500);
        c.actions.insert("ledger_entry.post".into(), policy);
        for a in c.actions.values_mut() {
            a.lease = Duration::from_secs(120);
        }

        let text = c.to_toml().expect("to_toml");
        for line in [
            "sweep_interval = \"200ms\"",
            "republish_after = \"1h\"",
            "lease = \"2m\"",
            "retry_delay = \"1500ms\"",
            "key_retention = \"1d\"",
            "kind = \"http\"",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
        assert_eq!(round_trip(&c), c);
        assert_eq!(http(&c, "bank").base_url, "http://127.0.0.1:1234");
    }

    #[test]
    fn a_duration_finer_than_a_millisecond_cannot_be_written() {
        let mut c = Config::builtin().expect("builtin");
        c.reconciler.sweep_interval = Duration::from_micros(1500);
        let err = c.to_toml().expect_err("1.5ms").to_string();
        assert!(err.contains("1.5ms"), "{err}");
    }
}
