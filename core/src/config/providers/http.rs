//! `kind = "http"`: the config of the generic HTTP/JSON adapter, and its validation.
//!
//! Why the type lives in core while the adapter lives in the worker: the producer and
//! the admin tools load the same file and need the provider's timeout and key
//! retention, but must not link an HTTP client. Everything this adapter requires of its
//! fields is checked here, when the file is loaded, so that a fleet with a bad provider
//! refuses to start with a message naming the field; the adapter itself then only
//! converts (URLs, header names) what is already known to be well formed.

use super::value::ValueSource;
use crate::config::duration::{human, human_opt};
use crate::config::error::{ConfigError, invalid};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// Headers the adapter writes itself; a configured header may not replace them.
const RESERVED_HEADERS: &[&str] = &[
    "content-type",
    "content-length",
    "transfer-encoding",
    "host",
    "connection",
];

/// A provider behind the generic HTTP/JSON adapter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpProviderConfig {
    /// `https://host[:port]` (or `http://` for the sandbox and in-cluster providers).
    pub base_url: String,
    /// PEM file with the CA certificates to trust for this provider, instead of the
    /// system's roots (`https://` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// Extra headers on every request; values literal or read at startup from an env
    /// variable or a file (see [`ValueSource`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, ValueSource>,
    /// HTTP Basic credentials (`Authorization: Basic …`), each part a [`ValueSource`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basic_auth: Option<BasicAuth>,
    /// Path of the execute call, a template (`{key}`, `{reference}`, `{/payload/field}`;
    /// see [`super::template`]).
    pub execute_path: String,
    /// Method of the execute call: `POST` (default), `PUT` or `PATCH`.
    #[serde(default = "default_method")]
    pub method: String,
    /// How the execute body is written: `json` (default) or `form`
    /// (`application/x-www-form-urlencoded`, nested keys as `metadata[oncely_key]`).
    #[serde(default)]
    pub encoding: Encoding,
    /// The execute body as a template: the provider's fields, each value a template or a
    /// literal (tables nest). Absent: the payload as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<serde_json::Map<String, serde_json::Value>>,
    /// Lookup by key: a path template with `{key}`. Empty: no lookup by key.
    #[serde(default)]
    pub lookup_path: String,
    /// Lookup by business reference: a path template with `{reference}`. Empty: none.
    #[serde(default)]
    pub lookup_by_reference_path: String,
    /// Lookup answers that are lists: the pointer to the array (e.g. `/data`); the record
    /// is the item that echoes the key at `key_echo_pointer`. Empty: one record.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub lookup_list_pointer: String,
    /// Where a found record echoes the idempotency key it was created with.
    #[serde(default = "default_key_echo_pointer")]
    pub key_echo_pointer: String,
    /// HTTP statuses of an execute answer that mean "not done, retry" (besides
    /// connection failures). Every other 4xx is rejected for good; 5xx is unknown.
    /// A status in `throttle_statuses` is a throttle, whatever this list says.
    #[serde(default = "default_retry_statuses")]
    pub retry_statuses: Vec<u16>,
    /// HTTP statuses that mean "slow down, nothing was done": the attempt is deferred, not
    /// spent, and the whole fleet backs off from this provider (its `Retry-After`). A
    /// `503` with a `Retry-After` header is a throttle too, whatever this list says; a
    /// `503` without one is an unknown (the provider may have acted).
    #[serde(default = "default_throttle_statuses")]
    pub throttle_statuses: Vec<u16>,
    /// What the provider allows the whole fleet: see [`super::RateLimitConfig`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<super::RateLimitConfig>,
    /// HTTP statuses that mean "a request with this key is still in progress".
    #[serde(default = "default_in_flight_statuses")]
    pub in_flight_statuses: Vec<u16>,
    /// JSON pointer to the business reference inside the payload.
    #[serde(default = "default_reference_pointer")]
    pub reference_pointer: String,
    /// Header carrying the idempotency key; `""` for none (put `{key}` in the body).
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
    #[serde(default = "default_connect_timeout", with = "human")]
    pub connect_timeout: Duration,
    /// Whole-request timeout (a timeout after connecting is "unknown").
    #[serde(default = "default_timeout", with = "human")]
    pub timeout: Duration,
    /// HTTP/2: with `https://`, offer `h2` in the TLS handshake (ALPN) and use it when
    /// the provider picks it, HTTP/1.1 otherwise; with `http://`, speak HTTP/2 from the
    /// first byte (h2c, "prior knowledge": the provider must speak it). Every call in
    /// flight then shares one connection instead of holding one each. Off by default.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub http2: bool,
    /// Whether the provider deduplicates by the idempotency key.
    #[serde(default = "default_true")]
    pub honours_key: bool,
    /// How long the provider remembers keys (from the first attempt); absent: unknown.
    #[serde(default, with = "human_opt", skip_serializing_if = "Option::is_none")]
    pub key_retention: Option<Duration>,
    /// Whether a 404 from lookup proves the effect never happened.
    #[serde(default)]
    pub absence_authoritative: bool,
}

/// `basic_auth = { username = …, password = … }`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BasicAuth {
    /// The user name (Stripe: the secret key, with an empty password).
    pub username: ValueSource,
    /// The password; `""` for none.
    #[serde(default = "empty_literal")]
    pub password: ValueSource,
}

fn empty_literal() -> ValueSource {
    ValueSource::Literal(String::new())
}

/// How an execute body is written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    /// `application/json`.
    #[default]
    Json,
    /// `application/x-www-form-urlencoded`, nested keys Stripe-style (`a[b]=1`, `l[0]=x`).
    Form,
}

fn default_method() -> String {
    "POST".into()
}
fn default_key_echo_pointer() -> String {
    "/idempotency_key".into()
}
fn default_retry_statuses() -> Vec<u16> {
    vec![408]
}
fn default_throttle_statuses() -> Vec<u16> {
    vec![429]
}
fn default_in_flight_statuses() -> Vec<u16> {
    vec![409]
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

impl HttpProviderConfig {
    /// A provider at `base_url` that takes calls at `execute_path`, with no lookups and
    /// every other field at its default (the same defaults a file gets).
    pub fn new(base_url: impl Into<String>, execute_path: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            ca_file: None,
            headers: BTreeMap::new(),
            basic_auth: None,
            execute_path: execute_path.into(),
            method: default_method(),
            encoding: Encoding::Json,
            body: None,
            lookup_list_pointer: String::new(),
            key_echo_pointer: default_key_echo_pointer(),
            retry_statuses: default_retry_statuses(),
            in_flight_statuses: default_in_flight_statuses(),
            throttle_statuses: default_throttle_statuses(),
            rate_limit: None,
            lookup_path: String::new(),
            lookup_by_reference_path: String::new(),
            reference_pointer: default_reference_pointer(),
            idempotency_header: default_key_header(),
            id_pointer: default_id_pointer(),
            status_pointer: default_status_pointer(),
            succeeded_values: default_succeeded_values(),
            rejected_values: default_rejected_values(),
            connect_timeout: default_connect_timeout(),
            timeout: default_timeout(),
            http2: false,
            honours_key: default_true(),
            key_retention: None,
            absence_authoritative: false,
        }
    }

    /// Every field is usable by the adapter; errors name the field under `at`
    /// (`providers.NAME`).
    pub fn validate(&self, at: &str) -> Result<(), ConfigError> {
        let f = |x: &str| format!("{at}.{x}");
        let url = self.base_url.trim();
        let (tls, host) = match (url.strip_prefix("https://"), url.strip_prefix("http://")) {
            (Some(host), _) => (true, host),
            (None, Some(host)) => (false, host),
            (None, None) => (false, ""),
        };
        if host.trim_end_matches('/').is_empty() || host.contains(['?', '#']) {
            return Err(invalid(
                f("base_url"),
                "must be https://host[:port] (or http://) without a query",
            ));
        }
        if self.ca_file.is_some() && !tls {
            return Err(invalid(
                f("ca_file"),
                "is only used with an https:// base_url",
            ));
        }
        self.validate_credentials(at)?;
        self.validate_mapping(at)?;
        for (field, pointer) in [
            ("reference_pointer", &self.reference_pointer),
            ("id_pointer", &self.id_pointer),
            ("status_pointer", &self.status_pointer),
            ("key_echo_pointer", &self.key_echo_pointer),
        ] {
            if !pointer.starts_with('/') {
                return Err(invalid(
                    f(field),
                    format!("{pointer:?} is not a JSON pointer (it must start with '/')"),
                ));
            }
        }
        if !self.lookup_list_pointer.is_empty() && !self.lookup_list_pointer.starts_with('/') {
            return Err(invalid(
                f("lookup_list_pointer"),
                "is not a JSON pointer (it must start with '/')",
            ));
        }
        let header = self.idempotency_header.trim();
        if !header.is_empty() && !is_header_name(header) {
            return Err(invalid(
                f("idempotency_header"),
                format!("{:?} is not a valid header name", self.idempotency_header),
            ));
        }
        if self.succeeded_values.is_empty() {
            return Err(invalid(
                f("succeeded_values"),
                "must list at least one status",
            ));
        }
        if self.connect_timeout.is_zero() || self.timeout < self.connect_timeout {
            return Err(invalid(
                f("timeout"),
                "must be at least connect_timeout, and both above zero",
            ));
        }
        Ok(())
    }
}

impl HttpProviderConfig {
    fn validate_credentials(&self, at: &str) -> Result<(), ConfigError> {
        for (name, source) in &self.headers {
            let field = format!("{at}.headers.{name}");
            let lower = name.to_ascii_lowercase();
            if !is_header_name(name) {
                return Err(invalid(field, "is not a valid header name"));
            }
            if RESERVED_HEADERS.contains(&lower.as_str())
                || lower.eq_ignore_ascii_case(self.idempotency_header.trim())
            {
                return Err(invalid(field, "is written by the adapter itself"));
            }
            if lower == "authorization" && self.basic_auth.is_some() {
                return Err(invalid(field, "is also set by basic_auth; keep one"));
            }
            if let Some(problem) = source.problem() {
                return Err(invalid(field, problem));
            }
        }
        if let Some(basic) = &self.basic_auth {
            for (part, source) in [("username", &basic.username), ("password", &basic.password)] {
                if let Some(problem) = source.problem() {
                    return Err(invalid(format!("{at}.basic_auth.{part}"), problem));
                }
            }
        }
        Ok(())
    }
}

/// An HTTP field name: one or more token characters (RFC 9110 §5.1).
pub(super) fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_is_valid_and_each_bad_field_is_named() {
        let good = HttpProviderConfig::new("http://127.0.0.1:8085/", "/v1/x");
        good.validate("providers.p").expect("valid");
        let mut tls = HttpProviderConfig::new("https://api.example.com", "/v1/x");
        tls.ca_file = Some("/etc/oncely/ca.pem".into());
        tls.headers.insert(
            "Authorization".into(),
            ValueSource::Env {
                var: "TOKEN".into(),
                prefix: "Bearer ".into(),
            },
        );
        tls.validate("providers.p")
            .expect("https with a CA file and a token");
        type Break = fn(&mut HttpProviderConfig);
        let cases: &[(Break, &str)] = &[
            (|c| c.base_url = "ftp://x".into(), "base_url"),
            (|c| c.base_url = "https://".into(), "base_url"),
            (|c| c.ca_file = Some("/ca.pem".into()), "ca_file"),
            (
                |c| {
                    c.headers
                        .insert("Bad Name".into(), ValueSource::Literal("x".into()));
                },
                "headers.Bad Name",
            ),
            (
                |c| {
                    c.headers
                        .insert("Content-Type".into(), ValueSource::Literal("x".into()));
                },
                "headers.Content-Type",
            ),
            (
                |c| {
                    c.headers
                        .insert("idempotency-key".into(), ValueSource::Literal("x".into()));
                },
                "headers.idempotency-key",
            ),
            (
                |c| {
                    c.headers.insert(
                        "X-Api-Key".into(),
                        ValueSource::Env {
                            var: String::new(),
                            prefix: String::new(),
                        },
                    );
                },
                "headers.X-Api-Key",
            ),
            (
                |c| {
                    c.headers
                        .insert("Authorization".into(), ValueSource::Literal("x".into()));
                    c.basic_auth = Some(BasicAuth {
                        username: ValueSource::Literal("u".into()),
                        password: empty_literal(),
                    });
                },
                "headers.Authorization",
            ),
            (
                |c| {
                    c.basic_auth = Some(BasicAuth {
                        username: ValueSource::File {
                            path: PathBuf::new(),
                            prefix: String::new(),
                        },
                        password: empty_literal(),
                    });
                },
                "basic_auth.username",
            ),
            (|c| c.base_url = "http://".into(), "base_url"),
            (|c| c.base_url = "http://x/?a=1".into(), "base_url"),
            (|c| c.execute_path = "v1/x".into(), "execute_path"),
            (|c| c.lookup_path = "/v1/x".into(), "lookup_path"),
            (
                |c| c.lookup_by_reference_path = "v1/{reference}".into(),
                "lookup_by_reference_path",
            ),
            (|c| c.id_pointer = "id".into(), "id_pointer"),
            (|c| c.status_pointer = String::new(), "status_pointer"),
            (|c| c.reference_pointer = "ref".into(), "reference_pointer"),
            (
                |c| c.idempotency_header = "Bad Header".into(),
                "idempotency_header",
            ),
            (|c| c.succeeded_values.clear(), "succeeded_values"),
            (|c| c.connect_timeout = Duration::ZERO, "timeout"),
            (|c| c.timeout = Duration::from_millis(500), "timeout"),
        ];
        for (i, (break_it, field)) in cases.iter().enumerate() {
            let mut c = good.clone();
            break_it(&mut c);
            let err = c.validate("providers.p").expect_err(field).to_string();
            assert!(
                err.contains(&format!("`providers.p.{field}`")),
                "case {i}: {err:?} should name {field}"
            );
        }
    }
}
