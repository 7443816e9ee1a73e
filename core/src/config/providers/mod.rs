//! `[providers.NAME]`: one table per outside system, its adapter chosen by `kind`.
//!
//! Why an enum by `kind`, each variant holding the adapter's own config type: adapters
//! differ in what they need (an HTTP base URL and JSON pointers, an SMTP relay and
//! credentials), and each type validates its own fields. What the rest of oncely needs
//! from any provider — how long one call may take, how long it remembers keys — is
//! asked of the enum ([`ProviderConfig::timeout`], [`ProviderConfig::key_retention`]),
//! never of a particular adapter.
//!
//! `kind` may be left out and then means `http`: files written before there was a
//! choice keep working.

use super::error::ConfigError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

pub mod http;
mod mapping;
pub mod rate_limit;
pub mod smtp;
pub mod template;
pub mod value;

pub use http::{BasicAuth, Encoding, HttpProviderConfig};
pub use rate_limit::RateLimitConfig;
pub use smtp::{ImapArchive, Security, SmtpProviderConfig};
pub use value::ValueSource;

/// The adapter that reaches a provider, and that adapter's settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ProviderConfig {
    /// `kind = "http"` (the default): the generic HTTP/JSON adapter.
    Http(HttpProviderConfig),
    /// `kind = "smtp"`: email through a mail server, looked up in an IMAP archive.
    Smtp(SmtpProviderConfig),
}

impl ProviderConfig {
    /// Every `kind` a file may name, as written in the file.
    pub const KINDS: &'static [&'static str] = &["http", "smtp"];
    /// The `kind` of a table that does not name one.
    pub const DEFAULT_KIND: &'static str = "http";

    /// The `kind` this config is written with.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Http(_) => "http",
            Self::Smtp(_) => "smtp",
        }
    }

    /// The longest one call to this provider may take (leases must outlast it).
    pub fn timeout(&self) -> Duration {
        match self {
            Self::Http(c) => c.timeout,
            Self::Smtp(c) => c.timeout,
        }
    }

    /// How long the provider remembers idempotency keys (`None`: not known).
    pub fn key_retention(&self) -> Option<Duration> {
        match self {
            Self::Http(c) => c.key_retention,
            Self::Smtp(c) => c.key_retention,
        }
    }

    /// What the provider allows the whole fleet (`[providers.NAME.rate_limit]`).
    pub fn rate_limit(&self) -> Option<&RateLimitConfig> {
        match self {
            Self::Http(c) => c.rate_limit.as_ref(),
            Self::Smtp(c) => c.rate_limit.as_ref(),
        }
    }

    /// The adapter's own checks; errors name the field under `at` (`providers.NAME`).
    pub fn validate(&self, at: &str) -> Result<(), ConfigError> {
        if let Some(limit) = self.rate_limit() {
            limit.validate(at)?;
        }
        match self {
            Self::Http(c) => c.validate(at),
            Self::Smtp(c) => c.validate(at),
        }
    }

    /// One `[providers.NAME]` table, read by the config type of its `kind` (`http`
    /// when absent). Errors name the field as `providers.NAME.FIELD`.
    ///
    /// Why not serde's derived tagged-enum reading: it buffers the table and loses the
    /// path of a bad field inside it; reading the variant's type straight from the
    /// table keeps it.
    fn from_table(name: &str, mut table: toml::Table) -> Result<Self, String> {
        let kind = match table.remove("kind") {
            None => Self::DEFAULT_KIND.to_owned(),
            Some(toml::Value::String(kind)) => kind,
            Some(other) => other.to_string(),
        };
        let at = format!("providers.{name}");
        match kind.as_str() {
            "http" => adapter_config(&at, table).map(Self::Http),
            "smtp" => adapter_config(&at, table).map(Self::Smtp),
            _ => Err(format!(
                "{at}.kind: unknown adapter kind {kind:?}; supported: {}",
                Self::KINDS
                    .iter()
                    .map(|k| format!("{k:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }
}

/// An adapter's config type read from its table; errors as `AT.FIELD: problem`.
fn adapter_config<T: serde::de::DeserializeOwned>(
    at: &str,
    table: toml::Table,
) -> Result<T, String> {
    toml::Value::Table(table)
        .try_into()
        .map_err(|e: toml::de::Error| {
            // The field's path is only in the error's display, as a last line "in `a.b`".
            let shown = e.to_string();
            let field = shown
                .lines()
                .rev()
                .find_map(|l| l.strip_prefix("in `")?.strip_suffix('`'));
            match field {
                Some(field) => format!("{at}.{field}: {}", e.message()),
                None => format!("{at}: {}", e.message()),
            }
        })
}

/// `#[serde(deserialize_with)]` of `Config::providers`: each table through
/// [`ProviderConfig::from_table`], so a missing `kind` means `http`.
pub(crate) fn deserialize_map<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, ProviderConfig>, D::Error> {
    BTreeMap::<String, toml::Table>::deserialize(d)?
        .into_iter()
        .map(|(name, table)| {
            let config =
                ProviderConfig::from_table(&name, table).map_err(serde::de::Error::custom)?;
            Ok((name, config))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> toml::Table {
        toml::from_str(text).expect("toml")
    }

    #[test]
    fn kind_defaults_to_http_and_is_written_out() {
        let plain = "base_url = \"http://x\"\nexecute_path = \"/e\"\n";
        let p = ProviderConfig::from_table("p", table(plain)).expect("no kind");
        assert_eq!(p.kind(), ProviderConfig::DEFAULT_KIND);
        let named = format!("kind = \"http\"\n{plain}");
        assert_eq!(
            ProviderConfig::from_table("p", table(&named)),
            Ok(p.clone())
        );
        let written = toml::to_string(&p).expect("serialize");
        assert!(written.starts_with("kind = \"http\"\n"), "{written}");
        assert!(ProviderConfig::KINDS.contains(&p.kind()));
    }

    #[test]
    fn every_listed_kind_has_an_adapter_config() {
        for kind in ProviderConfig::KINDS {
            // An empty table: the adapter's own type complains, not the kind dispatch.
            let err = ProviderConfig::from_table("p", table(&format!("kind = {kind:?}\n")))
                .expect_err("required fields are missing");
            assert!(!err.contains("unknown adapter kind"), "{kind}: {err}");
        }
    }

    #[test]
    fn an_unknown_kind_or_field_names_the_provider() {
        let err = ProviderConfig::from_table("p", table("kind = \"fax\"\n")).expect_err("fax");
        assert!(
            err.contains("providers.p.kind") && err.contains("\"http\""),
            "{err}"
        );
        let err = ProviderConfig::from_table("p", table("kind = 3\n")).expect_err("3");
        assert!(err.contains("providers.p.kind"), "{err}");
        let err = ProviderConfig::from_table(
            "p",
            table("base_url = \"http://x\"\nexecute_path = \"/e\"\nbase_ur = \"x\"\n"),
        )
        .expect_err("typo");
        assert!(
            err.starts_with("providers.p: unknown field `base_ur`"),
            "{err}"
        );
        let err = ProviderConfig::from_table(
            "p",
            table("base_url = \"http://x\"\nexecute_path = \"/e\"\ntimeout = \"5\"\n"),
        )
        .expect_err("no unit");
        assert!(err.starts_with("providers.p.timeout: "), "{err}");
    }
}
