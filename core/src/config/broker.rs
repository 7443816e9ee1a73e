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
//!
//! A cluster is `urls = ["amqp://…@node1…", "amqp://…@node2…", …]` (env
//! `ONCELY_AMQP_URLS`, comma-separated): every connect and reconnect tries the nodes in
//! turn ([`crate::amqp::AmqpConnector::connect`]). All of them must use the same scheme —
//! a list mixing `amqps://` and `amqp://` would let a failover silently drop TLS.

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
    /// The nodes of a RabbitMQ cluster (env `ONCELY_AMQP_URLS`, comma-separated), tried in
    /// turn on every connect; when set, `url` must be left at its default. Empty: `url`
    /// alone.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub urls: Vec<String>,
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

/// `broker.url` when nothing is configured: the local broker as guest.
const DEFAULT_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

impl Default for BrokerConfig {
    fn default() -> Self {
        Self {
            url: DEFAULT_URL.into(),
            urls: Vec::new(),
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

    /// The URLs of the nodes to try, in order: `urls` when set, otherwise `url`.
    pub fn node_urls(&self) -> Vec<&str> {
        if self.urls.is_empty() {
            vec![self.url.as_str()]
        } else {
            self.urls.iter().map(String::as_str).collect()
        }
    }

    /// The field the node URLs come from, for messages.
    pub fn urls_field(&self) -> &'static str {
        if self.urls.is_empty() {
            "broker.url"
        } else {
            "broker.urls"
        }
    }

    /// The prefix is a safe name part, the queue type known, the limit positive; `url` or
    /// `urls` (not both), no URL twice, one scheme for all; TLS files only with
    /// `amqps://` URLs, a client certificate only with its key.
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
        if !self.urls.is_empty() && self.url != DEFAULT_URL {
            return Err(invalid(
                "broker.urls",
                "is set together with broker.url (or ONCELY_AMQP_URL): give the nodes in \
                 broker.urls alone",
            ));
        }
        let field = self.urls_field();
        let mut schemes = Vec::new();
        for (i, url) in self.node_urls().into_iter().enumerate() {
            let scheme = url.split_once("://").map(|(s, _)| s);
            let tls = match scheme {
                Some(s) if s.eq_ignore_ascii_case("amqps") => true,
                Some(s) if s.eq_ignore_ascii_case("amqp") => false,
                _ => {
                    return Err(invalid(
                        field,
                        format!(
                            "{} must start with amqp:// (plain text) or amqps:// (TLS)",
                            nth(i, field)
                        ),
                    ));
                }
            };
            if self.urls[..i.min(self.urls.len())]
                .iter()
                .any(|earlier| earlier == url)
            {
                return Err(invalid(
                    field,
                    format!("{} repeats an earlier URL", nth(i, field)),
                ));
            }
            schemes.push(tls);
        }
        if schemes.windows(2).any(|w| w[0] != w[1]) {
            return Err(invalid(
                field,
                "mixes amqps:// and amqp://: a failover must not drop TLS, use one scheme \
                 for every node",
            ));
        }
        let tls = schemes[0];
        let t = &self.tls;
        if !tls {
            let set = [
                ("ca_file", t.ca_file.is_some()),
                ("cert_file", t.cert_file.is_some()),
                ("key_file", t.key_file.is_some()),
            ];
            if let Some((file, _)) = set.iter().find(|(_, on)| *on) {
                return Err(invalid(
                    format!("broker.tls.{file}"),
                    format!(
                        "is set but {field} is amqp:// (plain text, no TLS): use amqps:// \
                         (usually port 5671) or remove [broker.tls]"
                    ),
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

/// "the URL" or "URL 2 of broker.urls", for messages.
fn nth(i: usize, field: &str) -> String {
    if field == "broker.url" {
        "the URL".into()
    } else {
        format!("URL {} of {field}", i + 1)
    }
}
