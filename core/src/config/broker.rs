//! `[broker]`: where RabbitMQ is, how the fleet's queues are named and declared, and
//! `[broker.tls]`: which CA vouches for it and which client certificate we show.
//!
//! Why the prefix is checked so strictly: it becomes part of every exchange and queue
//! name, and two fleets on one broker are kept apart by it alone.
//!
//! Why TLS settings with an `amqp://` URL are refused: the URL's scheme decides whether
//! TLS is used, and a CA file next to a plain-text URL means someone believes the
//! connection is protected when it is not. The files themselves are read when a process
//! connects ([`crate::amqp::AmqpConnector::new`]), once at start and again at every
//! reconnect (so renewed certificates are picked up).

use super::error::{ConfigError, invalid};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Broker settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BrokerConfig {
    /// AMQP URL (env `ONCELY_AMQP_URL`): `amqp://` (plain text) or `amqps://` (TLS,
    /// certificate checked against [`BrokerTls::ca_file`] and the URL's host name).
    pub url: String,
    /// Prefix of every exchange and queue name (env `ONCELY_PREFIX`).
    pub prefix: String,
    /// `quorum` (default) or `classic`.
    pub queue_type: String,
    /// `x-delivery-limit` of the action queues: deliveries before dead-lettering.
    pub delivery_limit: i64,
    /// TLS for `amqps://` URLs (env `ONCELY__BROKER__TLS__CA_FILE`, `…__CERT_FILE`,
    /// `…__KEY_FILE`).
    #[serde(skip_serializing_if = "BrokerTls::is_empty")]
    pub tls: BrokerTls,
}

/// `[broker.tls]`: the files of an `amqps://` connection.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BrokerTls {
    /// PEM file with the CA certificates that vouch for the broker, trusted *instead of*
    /// the system's roots. Without it the system's CA bundle is used (managed brokers with
    /// publicly issued certificates).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// PEM file with this process's client certificate (and its intermediates), for a
    /// broker that requires one (`ssl_options.verify = verify_peer`). Needs `key_file`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<PathBuf>,
    /// PEM file with the client certificate's private key (not encrypted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
}

impl BrokerTls {
    /// Nothing set.
    pub fn is_empty(&self) -> bool {
        self == &BrokerTls::default()
    }
}

impl Default for BrokerConfig {
    fn default() -> Self {
        Self {
            url: "amqp://guest:guest@127.0.0.1:5672/%2f".into(),
            prefix: "oncely".into(),
            queue_type: "quorum".into(),
            delivery_limit: 20,
            tls: BrokerTls::default(),
        }
    }
}

impl BrokerConfig {
    /// The default settings with another URL and no TLS files (an `amqps://` URL then
    /// trusts the system's CAs): for tools given a bare URL (the bench).
    pub fn at(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            ..Self::default()
        }
    }

    /// The prefix is a safe name part, the queue type known, the limit positive; TLS
    /// files only with an `amqps://` URL, a client certificate only with its key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.prefix.is_empty()
            || !self
                .prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        {
            return Err(invalid(
                "broker.prefix",
                "must be non-empty ASCII letters, digits, '.', '_' or '-'",
            ));
        }
        if !matches!(self.queue_type.as_str(), "quorum" | "classic") {
            return Err(invalid(
                "broker.queue_type",
                "must be \"quorum\" or \"classic\"",
            ));
        }
        if self.delivery_limit < 1 {
            return Err(invalid("broker.delivery_limit", "must be at least 1"));
        }
        self.validate_tls()
    }

    fn validate_tls(&self) -> Result<(), ConfigError> {
        let scheme = self.url.split_once("://").map(|(s, _)| s);
        let tls = match scheme {
            Some(s) if s.eq_ignore_ascii_case("amqps") => true,
            Some(s) if s.eq_ignore_ascii_case("amqp") => false,
            _ => {
                return Err(invalid(
                    "broker.url",
                    "must start with amqp:// (plain text) or amqps:// (TLS)",
                ));
            }
        };
        let t = &self.tls;
        if !tls {
            let set = [
                ("ca_file", t.ca_file.is_some()),
                ("cert_file", t.cert_file.is_some()),
                ("key_file", t.key_file.is_some()),
            ];
            if let Some((field, _)) = set.iter().find(|(_, on)| *on) {
                return Err(invalid(
                    format!("broker.tls.{field}"),
                    "is set but broker.url is amqp:// (plain text, no TLS): use amqps:// \
                     (usually port 5671) or remove [broker.tls]",
                ));
            }
        }
        match (&t.cert_file, &t.key_file) {
            (Some(_), None) => Err(invalid(
                "broker.tls.key_file",
                "is needed with broker.tls.cert_file (the client certificate's private key)",
            )),
            (None, Some(_)) => Err(invalid(
                "broker.tls.cert_file",
                "is needed with broker.tls.key_file (the client certificate)",
            )),
            _ => Ok(()),
        }
    }
}
