//! `kind = "smtp"`: one email per operation through a mail server (lettre), and the
//! optional IMAP archive as its lookup.
//!
//! Where "not sent" ends: SMTP hands a message over in steps — connect (and TLS), EHLO,
//! AUTH, MAIL FROM, RCPT TO, DATA, then the message and its final `.`. Until the first
//! byte of the message is written the server has nothing it could deliver, so every
//! failure up to and including the DATA command's reply is *not sent* (a 5xx reply
//! there is *rejected*: the server refused the sender or the recipient for good).
//! After that, the server's reply to the final `.` is the only proof: `250` is
//! succeeded, 5xx rejected, 4xx not sent (the server said it did not take the message);
//! a lost connection or a timeout is *unknown* — RFC 1047's classic duplicate — and goes
//! to the reconciler, which asks the archive.
//!
//! The message carries its key twice: as a `Message-ID` derived from it
//! (`<v1-…@message_id_domain>`, so every attempt of one operation has the same id and an
//! archive can be searched for it) and as `X-Oncely-Key`.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use lettre::message::header::{ContentType, Header, HeaderName, HeaderValue};
use lettre::message::{Mailbox, Message};
use lettre::transport::smtp::authentication::{Credentials, Mechanism};
use lettre::transport::smtp::client::{
    AsyncSmtpConnection, Certificate, CertificateStore, TlsParameters,
};
use lettre::transport::smtp::commands::{Data, Mail, Rcpt};
use lettre::transport::smtp::extension::ClientId;
use oncely_core::config::providers::template::{MissingField, Template, Values};
use oncely_core::config::{ConfigError, Security, SmtpProviderConfig};
use serde_json::json;

use super::imap::Archive;
use super::{BoxFuture, Call, Capabilities, Outcome, Provider, Remote};

/// The phases of one delivery, for a timeout to know which side of DATA it fired on.
const PHASE_BEFORE_MESSAGE: u8 = 0;
const PHASE_MESSAGE: u8 = 1;

/// `X-Oncely-Key: v1:…`.
#[derive(Debug, Clone)]
struct OncelyKey(String);

impl Header for OncelyKey {
    fn name() -> HeaderName {
        HeaderName::new_from_ascii_str("X-Oncely-Key")
    }

    fn parse(s: &str) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        Ok(OncelyKey(s.to_owned()))
    }

    fn display(&self) -> HeaderValue {
        HeaderValue::new(Self::name(), self.0.clone())
    }
}

/// A mail server behind `kind = "smtp"`.
pub struct SmtpProvider {
    name: String,
    config: SmtpProviderConfig,
    tls: Option<TlsParameters>,
    credentials: Option<Credentials>,
    from: Template,
    to: Template,
    subject: Template,
    text: Template,
    archive: Option<Arc<Archive>>,
    auth_reported: AtomicBool,
}

impl std::fmt::Debug for SmtpProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmtpProvider")
            .field("name", &self.name)
            .field("host", &self.config.host)
            .field("port", &self.config.port)
            .field("archive", &self.archive)
            .finish_non_exhaustive()
    }
}

/// A rendered email: the message and its `Message-ID`.
struct Email {
    message: Message,
    message_id: String,
}

impl SmtpProvider {
    /// The adapter for `[providers.NAME]`; credentials are read now, errors name the
    /// field and the variable or file.
    pub fn new(name: &str, config: &SmtpProviderConfig) -> Result<Self, ConfigError> {
        let invalid = |field: &str, problem: String| ConfigError::Invalid {
            field: format!("providers.{name}.{field}"),
            problem,
        };
        let tls = match config.security {
            Security::None => None,
            _ => Some(
                tls_parameters(&config.host, config.ca_file.as_deref()).map_err(|e| {
                    invalid(
                        if config.ca_file.is_some() {
                            "ca_file"
                        } else {
                            "host"
                        },
                        e,
                    )
                })?,
            ),
        };
        let credentials = match (&config.username, &config.password) {
            (Some(user), Some(password)) => Some(Credentials::new(
                user.resolve().map_err(|e| invalid("username", e))?,
                password.resolve().map_err(|e| invalid("password", e))?,
            )),
            _ => None,
        };
        let template =
            |field: &str, text: &str| Template::parse(text).map_err(|e| invalid(field, e));
        let archive = config
            .archive
            .as_ref()
            .map(|a| Archive::new(a, config.connect_timeout))
            .transpose()
            .map_err(|(field, e)| invalid(&format!("archive.{field}"), e))?;
        Ok(SmtpProvider {
            name: name.to_owned(),
            tls,
            credentials,
            from: template("from", &config.from)?,
            to: template("to", &config.to)?,
            subject: template("subject", &config.subject)?,
            text: template("text", &config.text)?,
            archive: archive.map(Arc::new),
            config: config.clone(),
            auth_reported: AtomicBool::new(false),
        })
    }

    /// `<v1-HEX@domain>` for `v1:HEX`: the same for every attempt of one operation.
    fn message_id(&self, key: &str) -> String {
        format!(
            "<{}@{}>",
            key.replace(':', "-"),
            self.config.message_id_domain
        )
    }

    fn render(&self, call: &Call<'_>) -> Result<Email, Outcome> {
        let values = Values {
            key: call.key.as_str(),
            action_type: call.action_type,
            payload: call.payload,
            reference_pointer: "/business_reference",
        };
        let text = |t: &Template| {
            t.render_text(&values, str::to_owned).map_err(|MissingField(pointer)| {
                tracing::warn!(provider = %self.name, key = %call.key, field = %pointer,
                    "the email needs a payload field the operation does not have; nothing was sent");
                rejected("template_missing_field")
            })
        };
        let mailbox = |t: &Template| {
            text(t)?
                .parse::<Mailbox>()
                .map_err(|_| rejected("invalid_address"))
        };
        let message_id = self.message_id(call.key.as_str());
        let message = Message::builder()
            .message_id(Some(message_id.clone()))
            .from(mailbox(&self.from)?)
            .to(mailbox(&self.to)?)
            .subject(text(&self.subject)?)
            .header(OncelyKey(call.key.to_string()))
            .header(ContentType::TEXT_PLAIN)
            .body(text(&self.text)?)
            .map_err(|_| rejected("invalid_message"))?;
        Ok(Email {
            message,
            message_id,
        })
    }

    /// Connect, secure, authenticate: all *not sent* when they fail.
    async fn open(&self) -> Result<AsyncSmtpConnection, Outcome> {
        let c = &self.config;
        let hello = ClientId::Domain(c.hello_name.clone());
        let implicit = match c.security {
            Security::Implicit => self.tls.clone(),
            _ => None,
        };
        let mut conn = AsyncSmtpConnection::connect_tokio1(
            (c.host.as_str(), c.port),
            Some(c.connect_timeout),
            &hello,
            implicit,
            None,
        )
        .await
        .map_err(|e| before_data(&e, "connect_failed"))?;
        if let (Security::Starttls, Some(tls)) = (c.security, &self.tls) {
            if !conn.can_starttls() {
                conn.abort().await;
                return Err(not_sent("starttls_not_offered"));
            }
            conn.starttls(tls.clone(), &hello)
                .await
                .map_err(|e| before_data(&e, "tls_handshake"))?;
        }
        if let Some(credentials) = &self.credentials {
            let auth = conn
                .auth(&[Mechanism::Plain, Mechanism::Login], credentials)
                .await;
            if let Err(e) = auth {
                if e.is_permanent() {
                    self.report_auth_refused();
                }
                conn.abort().await;
                return Err(before_data(&e, "auth_failed"));
            }
        }
        Ok(conn)
    }

    /// The whole exchange; `phase` says whether the message was started.
    async fn deliver(&self, email: &Email, phase: &AtomicU8) -> Outcome {
        let mut conn = match self.open().await {
            Ok(conn) => conn,
            Err(outcome) => return outcome,
        };
        let envelope = email.message.envelope();
        let mut steps = vec![
            conn.command(Mail::new(envelope.from().cloned(), vec![]))
                .await,
        ];
        for to in envelope.to() {
            if steps.last().is_some_and(Result::is_ok) {
                steps.push(conn.command(Rcpt::new(to.clone(), vec![])).await);
            }
        }
        if steps.last().is_some_and(Result::is_ok) {
            steps.push(conn.command(Data).await);
        }
        if let Some(Err(e)) = steps.into_iter().find(Result::is_err) {
            conn.abort().await;
            return before_data(&e, "connection_lost");
        }
        phase.store(PHASE_MESSAGE, Ordering::SeqCst);
        let reply = conn.message(&email.message.formatted()).await;
        let outcome = match reply {
            Ok(reply) => Outcome::Succeeded {
                provider_operation_id: email.message_id.clone(),
                result: json!({
                    "message_id": email.message_id,
                    "reply": reply.first_line().unwrap_or_default(),
                }),
            },
            Err(e) if e.is_permanent() => rejected(&smtp_code(&e)),
            // A transient reply to the final dot: the server did not take the message.
            Err(e) if e.is_transient() => transient(&e),
            // No reply to the final dot: the server may have taken the message.
            Err(e) if e.is_timeout() => unknown("timeout_after_data"),
            Err(_) => unknown("connection_lost_after_data"),
        };
        let _ = conn.quit().await;
        outcome
    }

    /// A refused AUTH: our credentials. Logged once per provider, counted each time.
    fn report_auth_refused(&self) {
        metrics::counter!(oncely_core::metrics::PROVIDER_REFUSALS, "provider" => self.name.clone(), "reason" => "auth").increment(1);
        if !self.auth_reported.swap(true, Ordering::Relaxed) {
            tracing::error!(
                provider = %self.name,
                "the mail server refused oncely's credentials: its emails fail until the \
                 username or password of this provider are fixed (logged once)",
            );
        }
    }

    async fn lookup_in(&self, archive: &Archive, call: &Call<'_>) -> Remote {
        let message_id = self.message_id(call.key.as_str());
        match tokio::time::timeout(self.config.timeout, archive.contains(&message_id)).await {
            Ok(Ok(true)) => Remote::Succeeded {
                provider_operation_id: message_id.clone(),
                result: json!({ "message_id": message_id, "found_in": "archive" }),
            },
            // Not there yet may still mean on its way: absent only after the grace.
            Ok(Ok(false)) => match call.first_attempt_at {
                Some(first)
                    if chrono::Utc::now() - first
                        > chrono::Duration::from_std(archive.grace).unwrap_or_default() =>
                {
                    Remote::Absent
                }
                _ => Remote::Pending,
            },
            Ok(Err(code)) => Remote::Failed { code: code.into() },
            Err(_) => Remote::Failed {
                code: "imap_timeout".into(),
            },
        }
    }
}

impl Provider for SmtpProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            // Mail servers do not deduplicate: the journal alone keeps it to one.
            honours_key: false,
            key_retention: self.config.key_retention,
            lookup: self.archive.is_some(),
            // Mail can reach the archive late: absence is for a person to judge.
            absence_authoritative: false,
        }
    }

    fn execute<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            let email = match self.render(&call) {
                Ok(email) => email,
                Err(outcome) => return outcome,
            };
            let phase = AtomicU8::new(PHASE_BEFORE_MESSAGE);
            let outcome =
                match tokio::time::timeout(self.config.timeout, self.deliver(&email, &phase)).await
                {
                    Ok(outcome) => outcome,
                    Err(_) if phase.load(Ordering::SeqCst) == PHASE_BEFORE_MESSAGE => {
                        not_sent("timeout_before_data")
                    }
                    Err(_) => unknown("timeout_after_data"),
                };
            tracing::debug!(provider = %self.name, key = %call.key,
                outcome = crate::decide::outcome_label(&outcome), "provider execute");
            outcome
        })
    }

    fn lookup<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Remote> {
        Box::pin(async move {
            match &self.archive {
                Some(archive) => self.lookup_in(archive, &call).await,
                None => Remote::Unsupported,
            }
        })
    }
}

/// TLS for the relay: `ca_file`'s CAs only, or the system's roots.
fn tls_parameters(host: &str, ca_file: Option<&Path>) -> Result<TlsParameters, String> {
    let mut builder = TlsParameters::builder(host.to_owned());
    if let Some(path) = ca_file {
        let pem =
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let cert = Certificate::from_pem(&pem)
            .map_err(|e| format!("{}: not a PEM certificate: {e}", path.display()))?;
        builder = builder
            .certificate_store(CertificateStore::None)
            .add_root_certificate(cert);
    }
    builder
        .build_rustls()
        .map_err(|e| format!("TLS setup failed: {e}"))
}

/// A failure before the message was started: rejected on a permanent reply, else not
/// sent (`fallback` names a failure without a reply).
fn before_data(e: &lettre::transport::smtp::Error, fallback: &str) -> Outcome {
    if e.is_permanent() {
        rejected(&smtp_code(e))
    } else if e.is_transient() {
        transient(e)
    } else if e.is_timeout() {
        not_sent("connect_timeout")
    } else if e.is_tls() {
        not_sent("tls_handshake")
    } else {
        not_sent(fallback)
    }
}

/// 421 (service closing), 450 (mailbox busy), 451 (local error, and the greylisting and
/// rate-limit answer of most servers), 452 (insufficient storage, and "too many
/// recipients/messages"): the server asks us to come back later and took nothing. Before
/// the message was started, so nothing was sent (RFC 5321, 4.2.1).
fn is_throttle(e: &lettre::transport::smtp::Error) -> bool {
    matches!(
        e.status().map(|c| c.to_string()).as_deref(),
        Some("421" | "450" | "451" | "452")
    )
}

/// A transient (4xx) reply: a throttle ([`is_throttle`]) or another not-sent.
fn transient(e: &lettre::transport::smtp::Error) -> Outcome {
    if is_throttle(e) {
        Outcome::Throttled {
            code: smtp_code(e),
            retry_after: None,
        }
    } else {
        not_sent(&smtp_code(e))
    }
}

fn smtp_code(e: &lettre::transport::smtp::Error) -> String {
    e.status()
        .map_or_else(|| "smtp_error".into(), |code| format!("smtp_{code}"))
}

fn rejected(code: &str) -> Outcome {
    Outcome::Rejected { code: code.into() }
}

fn not_sent(code: &str) -> Outcome {
    Outcome::NotSent { code: code.into() }
}

fn unknown(code: &str) -> Outcome {
    Outcome::Unknown { code: code.into() }
}
