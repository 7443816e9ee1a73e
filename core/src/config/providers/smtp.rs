//! `kind = "smtp"`: email through a mail server, with an optional IMAP archive to ask.
//!
//! Why SMTP needs its own adapter: the article's first example is an email, and most
//! mail leaves through a relay (Postfix, a provider's submission port), not an HTTP API.
//! SMTP has no idempotency key, so the adapter makes one the receiving side can see: a
//! `Message-ID` derived from the key (`<v1-…@message_id_domain>`) and the key itself in
//! `X-Oncely-Key`. Whether a message went out after an unknown outcome is asked of an
//! archive mailbox the relay copies every message to (Postfix `always_bcc`, a provider's
//! "BCC to archive"), over IMAP: `SEARCH HEADER Message-ID …`.

use super::template::Template;
use super::value::ValueSource;
use crate::config::duration::{human, human_opt};
use crate::config::error::{ConfigError, invalid};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// How a connection is secured.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Security {
    /// Plain connection upgraded with STARTTLS, which the server must offer (no fallback).
    #[default]
    Starttls,
    /// TLS from the first byte (SMTPS port 465, IMAPS port 993).
    Implicit,
    /// No TLS: only for a relay on the same host or a private network.
    None,
}

/// `[providers.NAME] kind = "smtp"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SmtpProviderConfig {
    /// The relay's host name (also the name its certificate must carry).
    pub host: String,
    /// Its port (587 submission, 465 implicit TLS, 25).
    pub port: u16,
    /// `starttls` (default), `implicit` or `none`.
    #[serde(default)]
    pub security: Security,
    /// PEM CA bundle to trust instead of the system roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// AUTH user name (absent: no AUTH).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<ValueSource>,
    /// AUTH password (with `username`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<ValueSource>,
    /// The name this client greets with (EHLO).
    #[serde(default = "default_hello")]
    pub hello_name: String,
    /// The sender, a template (`"Billing <billing@example.com>"`).
    pub from: String,
    /// The recipient, a template (default `{/to}`).
    #[serde(default = "default_to")]
    pub to: String,
    /// The subject, a template (default `{/subject}`).
    #[serde(default = "default_subject")]
    pub subject: String,
    /// The plain-text body, a template (default `{/body}`).
    #[serde(default = "default_text")]
    pub text: String,
    /// The domain of the derived `Message-ID` (`<v1-…@DOMAIN>`).
    pub message_id_domain: String,
    /// TCP connect (+ TLS) timeout: a failure here is "not sent".
    #[serde(default = "default_connect_timeout", with = "human")]
    pub connect_timeout: Duration,
    /// The whole call.
    #[serde(default = "default_timeout", with = "human")]
    pub timeout: Duration,
    /// How long the archive keeps messages (lookups cannot see further back).
    #[serde(default, with = "human_opt", skip_serializing_if = "Option::is_none")]
    pub key_retention: Option<Duration>,
    /// The archive mailbox to ask whether a message went out (absent: no lookup).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archive: Option<ImapArchive>,
    /// What the mail server allows the whole fleet: see [`super::RateLimitConfig`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<super::RateLimitConfig>,
}

/// `[providers.NAME.archive]`: an IMAP mailbox that receives a copy of every message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImapArchive {
    /// IMAP host.
    pub host: String,
    /// IMAP port (993 implicit TLS, 143 STARTTLS).
    pub port: u16,
    /// `implicit` (default for IMAP), `starttls` or `none`.
    #[serde(default = "default_imap_security")]
    pub security: Security,
    /// PEM CA bundle to trust instead of the system roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// Login user.
    pub username: ValueSource,
    /// Login password.
    pub password: ValueSource,
    /// The mailbox to search.
    #[serde(default = "default_mailbox")]
    pub mailbox: String,
    /// How long after sending a message may take to reach the archive: not found
    /// within it is "pending", after it "absent".
    #[serde(default = "default_grace", with = "human")]
    pub grace: Duration,
}

fn default_hello() -> String {
    "localhost".into()
}
fn default_to() -> String {
    "{/to}".into()
}
fn default_subject() -> String {
    "{/subject}".into()
}
fn default_text() -> String {
    "{/body}".into()
}
fn default_connect_timeout() -> Duration {
    Duration::from_secs(5)
}
fn default_timeout() -> Duration {
    Duration::from_secs(30)
}
fn default_imap_security() -> Security {
    Security::Implicit
}
fn default_mailbox() -> String {
    "INBOX".into()
}
fn default_grace() -> Duration {
    Duration::from_secs(60)
}

impl SmtpProviderConfig {
    /// Every field is usable; errors name the field under `at` (`providers.NAME`).
    pub fn validate(&self, at: &str) -> Result<(), ConfigError> {
        let f = |x: &str| format!("{at}.{x}");
        if self.host.trim().is_empty() {
            return Err(invalid(f("host"), "must name the mail server"));
        }
        if self.port == 0 {
            return Err(invalid(f("port"), "must be a port number"));
        }
        if self.ca_file.is_some() && self.security == Security::None {
            return Err(invalid(f("ca_file"), "is only used with TLS"));
        }
        if self.username.is_some() != self.password.is_some() {
            return Err(invalid(f("password"), "username and password go together"));
        }
        for (field, source) in [("username", &self.username), ("password", &self.password)] {
            if let Some(problem) = source.as_ref().and_then(ValueSource::problem) {
                return Err(invalid(f(field), problem));
            }
        }
        for (field, text) in [
            ("from", &self.from),
            ("to", &self.to),
            ("subject", &self.subject),
            ("text", &self.text),
        ] {
            Template::parse(text).map_err(|e| invalid(f(field), e))?;
        }
        let domain = &self.message_id_domain;
        if domain.is_empty()
            || !domain
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || ".-".contains(c))
        {
            return Err(invalid(f("message_id_domain"), "must be a domain name"));
        }
        if self.connect_timeout.is_zero() || self.timeout < self.connect_timeout {
            return Err(invalid(
                f("timeout"),
                "must be at least connect_timeout, and both above zero",
            ));
        }
        if let Some(archive) = &self.archive {
            archive.validate(&f("archive"))?;
        }
        Ok(())
    }
}

impl ImapArchive {
    fn validate(&self, at: &str) -> Result<(), ConfigError> {
        let f = |x: &str| format!("{at}.{x}");
        if self.host.trim().is_empty() || self.port == 0 {
            return Err(invalid(
                f("host"),
                "host and port must name the IMAP server",
            ));
        }
        if self.ca_file.is_some() && self.security == Security::None {
            return Err(invalid(f("ca_file"), "is only used with TLS"));
        }
        for (field, source) in [("username", &self.username), ("password", &self.password)] {
            if let Some(problem) = source.problem() {
                return Err(invalid(f(field), problem));
            }
        }
        if self.mailbox.is_empty() || self.mailbox.contains(['"', '\\', '\r', '\n']) {
            return Err(invalid(f("mailbox"), "must be a plain mailbox name"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> SmtpProviderConfig {
        toml::from_str(
            "host = \"smtp.example.com\"\nport = 587\nfrom = \"Billing <b@example.com>\"\n\
             message_id_domain = \"mail.example.com\"\n\
             username = { env = \"SMTP_USER\" }\npassword = { file = \"/run/secrets/smtp\" }\n\
             [archive]\nhost = \"imap.example.com\"\nport = 993\n\
             username = \"archive\"\npassword = { env = \"IMAP_PASSWORD\" }\n",
        )
        .expect("parses")
    }

    #[test]
    fn defaults_and_each_bad_field_named() {
        let c = good();
        c.validate("providers.m").expect("valid");
        assert_eq!(c.security, Security::Starttls);
        assert_eq!(c.to, "{/to}");
        let archive = c.archive.as_ref().expect("archive");
        assert_eq!(
            (archive.security, archive.mailbox.as_str()),
            (Security::Implicit, "INBOX")
        );
        type Break = fn(&mut SmtpProviderConfig);
        let cases: &[(Break, &str)] = &[
            (|c| c.host = " ".into(), "host"),
            (|c| c.port = 0, "port"),
            (
                |c| {
                    c.security = Security::None;
                    c.ca_file = Some("/ca.pem".into());
                },
                "ca_file",
            ),
            (|c| c.password = None, "password"),
            (|c| c.subject = "{/subj".into(), "subject"),
            (|c| c.from = "{sender}".into(), "from"),
            (|c| c.message_id_domain = "a b".into(), "message_id_domain"),
            (|c| c.timeout = Duration::from_secs(1), "timeout"),
            (
                |c| {
                    if let Some(a) = c.archive.as_mut() {
                        a.mailbox = "In\"box".into();
                    }
                },
                "archive.mailbox",
            ),
        ];
        for (i, (break_it, field)) in cases.iter().enumerate() {
            let mut c = good();
            break_it(&mut c);
            let err = c.validate("providers.m").expect_err(field).to_string();
            assert!(
                err.contains(&format!("`providers.m.{field}`")),
                "case {i}: {err:?} should name {field}"
            );
        }
    }
}
