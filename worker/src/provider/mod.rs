//! Providers: the outside systems whose side effects the worker performs exactly once.
//!
//! Why a narrow trait: the worker's correctness hinges on *classifying* what a provider
//! answered — did the effect happen ([`Outcome::Succeeded`]), definitely not and never
//! will ([`Outcome::Rejected`]), definitely not *yet* ([`Outcome::NotSent`]), or nobody
//! knows ([`Outcome::Unknown`], [`Outcome::InFlight`])? — and on asking the provider
//! afterwards what became of a key ([`Provider::lookup`]). Everything the worker,
//! the reconciler and the policies need is in [`Call`], [`Outcome`], [`Remote`] and
//! [`Capabilities`]; how a provider is reached (HTTP, SMTP, a test double) stays behind
//! the trait. The generic HTTP/JSON adapter is [`HttpProvider`]; [`build`] makes one
//! per `[providers.NAME]` of the config.
//!
//! # Writing a custom adapter
//!
//! Implement [`Provider`]. Rules of the road:
//! - send the idempotency key with every call, the same key on every retry;
//! - return [`Outcome::NotSent`] only when you can prove the request never left the
//!   process (connect refused, DNS, connect timeout) or the provider said it did not act
//!   (429 and friends); anything else that is not a clear answer is
//!   [`Outcome::Unknown`];
//! - never log the payload or the provider's answer body; codes are short technical
//!   strings (`http_503`, `timeout`), never text from the payload.
//!
//! The example compiles and runs as a doc test (its `ledger_sdk` is a stand-in, hidden
//! from the rendered docs, for whatever client your provider ships):
//!
//! ```
//! # mod ledger_sdk {
//! #     pub struct Entry { pub id: String }
//! #     pub enum Error { Invalid(String), Unreachable, Other }
//! #     #[derive(Debug)]
//! #     pub struct Client;
//! #     type Payload = serde_json::Map<String, serde_json::Value>;
//! #     impl Client {
//! #         pub async fn post_entry(&self, key: &str, p: &Payload) -> Result<Entry, Error> {
//! #             match p.get("amount_minor") {
//! #                 Some(_) => Ok(Entry { id: format!("entry-{}", &key[3..11]) }),
//! #                 None => Err(Error::Invalid("amount_minor".into())),
//! #             }
//! #         }
//! #         pub async fn entry_by_key(&self, key: &str) -> Result<Option<Entry>, Error> {
//! #             Ok(Some(Entry { id: format!("entry-{}", &key[3..11]) }))
//! #         }
//! #     }
//! # }
//! use oncely_worker::provider::{BoxFuture, Call, Capabilities, Outcome, Provider, Remote};
//!
//! /// An in-house ledger reached through some client of its own.
//! #[derive(Debug)]
//! struct Ledger {
//!     client: ledger_sdk::Client,
//! }
//!
//! impl Provider for Ledger {
//!     fn name(&self) -> &str {
//!         "ledger"
//!     }
//!
//!     fn capabilities(&self) -> Capabilities {
//!         Capabilities {
//!             honours_key: true,
//!             key_retention: Some(std::time::Duration::from_secs(7 * 86_400)),
//!             lookup: true,
//!             absence_authoritative: true,
//!         }
//!     }
//!
//!     fn execute<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Outcome> {
//!         Box::pin(async move {
//!             match self.client.post_entry(call.key.as_str(), call.payload).await {
//!                 Ok(entry) => Outcome::Succeeded {
//!                     provider_operation_id: entry.id.clone(),
//!                     result: serde_json::json!({ "id": entry.id }),
//!                 },
//!                 Err(ledger_sdk::Error::Invalid(_)) => {
//!                     Outcome::Rejected { code: "invalid".into() }
//!                 }
//!                 // Provably never sent: safe to retry later.
//!                 Err(ledger_sdk::Error::Unreachable) => {
//!                     Outcome::NotSent { code: "connect_failed".into() }
//!                 }
//!                 // The request may have reached the ledger: let the reconciler find out.
//!                 Err(_) => Outcome::Unknown { code: "ledger_error".into() },
//!             }
//!         })
//!     }
//!
//!     fn lookup<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Remote> {
//!         Box::pin(async move {
//!             match self.client.entry_by_key(call.key.as_str()).await {
//!                 Ok(Some(entry)) => Remote::Succeeded {
//!                     provider_operation_id: entry.id.clone(),
//!                     result: serde_json::json!({ "id": entry.id }),
//!                 },
//!                 Ok(None) => Remote::Absent,
//!                 Err(_) => Remote::Failed { code: "ledger_error".into() },
//!             }
//!         })
//!     }
//! }
//!
//! // What the worker does with it, in short: one call with the operation's key.
//! # let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
//! let ledger = Ledger { client: ledger_sdk::Client };
//! let key = oncely_core::IdempotencyKey::parse(&format!("v1:{}", "ab".repeat(32)))
//!     .expect("a well-formed key");
//! let payload = serde_json::json!({ "amount_minor": 125_000 });
//! let call = Call {
//!     key: &key,
//!     action_type: "ledger.post",
//!     payload: payload.as_object().expect("an object"),
//!     first_attempt_at: None,
//! };
//! let outcome = rt.block_on(ledger.execute(call));
//! assert!(matches!(outcome, Outcome::Succeeded { .. }));
//! ```
//!
//! Register it next to the configured ones: `providers.insert("ledger".into(), Arc::new(ledger))`
//! on the map [`build`] returns.

use std::collections::BTreeMap;
use std::sync::Arc;

use oncely_core::config::{Config, ConfigError, ProviderConfig};

mod credentials;
mod http;
mod imap;
mod mapping;
pub mod pushback;
mod smtp;
mod transport;

pub use http::HttpProvider;
pub use pushback::Pushback;
pub use smtp::SmtpProvider;

/// A boxed, sendable future (the trait is object safe without `async fn`).
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// What the worker hands a provider: the key and the payload (never logged).
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    /// The idempotency key; the same on every attempt of one operation.
    pub key: &'a oncely_core::IdempotencyKey,
    /// The action type (`payment_order.create`), for adapters serving several.
    pub action_type: &'a str,
    /// The payload to send; never logged.
    pub payload: &'a serde_json::Map<String, serde_json::Value>,
    /// When the operation was first attempted (`None` before its first attempt): how
    /// long ago an effect could have happened, for lookups that must wait for one to
    /// show (an email reaching its archive).
    pub first_attempt_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// The classified answer of an execute call (the classification table in
/// `docs/architecture.md`).
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// 2xx with an id: the effect happened.
    Succeeded {
        /// The provider's id of the effect.
        provider_operation_id: String,
        /// The provider's whole answer.
        result: serde_json::Value,
    },
    /// Definite rejection: 400, 401, 402, 403, 404, 422 and other 4xx not listed below →
    /// `failed_final`.
    Rejected {
        /// Short technical code, e.g. `http_422`.
        code: String,
    },
    /// 409 "same key in flight" → unknown, reconcile.
    InFlight,
    /// DNS / connect refused / TLS handshake failed / connect timeout (before the request
    /// was written), 408 → `failed_retryable`.
    NotSent {
        /// Short technical code, e.g. `connect_failed`, `http_408`.
        code: String,
    },
    /// The provider said "slow down" and did nothing (429, 503 with `Retry-After`, SMTP
    /// 421/450/451/452 before the message) → `deferred`; the attempt is not spent and the
    /// whole fleet backs off from this provider.
    Throttled {
        /// Short technical code, e.g. `http_429`, `smtp_421`.
        code: String,
        /// How long the provider asked us to wait (`Retry-After`), if it said.
        retry_after: Option<std::time::Duration>,
    },
    /// Anything after the request may have been written: timeout, reset, closed, 5xx,
    /// 2xx without an id, unparsable 2xx body.
    Unknown {
        /// Short technical code, e.g. `timeout`, `http_503`, `no_provider_id`.
        code: String,
    },
}

/// What a lookup found.
#[derive(Debug, Clone, PartialEq)]
pub enum Remote {
    /// The provider has the effect, done.
    Succeeded {
        /// The provider's id of the effect.
        provider_operation_id: String,
        /// The provider's whole lookup answer.
        result: serde_json::Value,
    },
    /// The provider has the key, rejected.
    Rejected {
        /// Short technical code, e.g. `remote_rejected`.
        code: String,
    },
    /// The provider knows the key but has no final state yet.
    Pending,
    /// 404: the provider says it never saw it.
    Absent,
    /// This provider offers no lookup.
    Unsupported,
    /// The lookup itself failed (timeout, 5xx, 503 "lookup_unavailable", unparsable,
    /// reference found but for another key).
    Failed {
        /// Short technical code, e.g. `http_503`, `reference_other_key`.
        code: String,
    },
}

impl Remote {
    /// A bounded label for logs, metrics and a review's evidence.
    pub fn label(&self) -> &'static str {
        match self {
            Remote::Succeeded { .. } => "succeeded",
            Remote::Rejected { .. } => "rejected",
            Remote::Pending => "pending",
            Remote::Absent => "absent",
            Remote::Unsupported => "unsupported",
            Remote::Failed { .. } => "failed",
        }
    }

    /// The short code of a rejection or a failed lookup (`""` for the other answers).
    pub fn code(&self) -> &str {
        match self {
            Remote::Rejected { code } | Remote::Failed { code } => code,
            Remote::Succeeded { .. } | Remote::Pending | Remote::Absent | Remote::Unsupported => "",
        }
    }
}

/// What a provider promises; the policies decide with it (retry after absence, …).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// The provider deduplicates by the idempotency key.
    pub honours_key: bool,
    /// How long it remembers keys (`None`: unknown / forever as far as we know).
    pub key_retention: Option<std::time::Duration>,
    /// [`Provider::lookup`] can answer something other than [`Remote::Unsupported`].
    pub lookup: bool,
    /// A [`Remote::Absent`] proves the effect never happened.
    pub absence_authoritative: bool,
}

/// An outside system the worker performs side effects at.
pub trait Provider: Send + Sync + std::fmt::Debug {
    /// The name under `[providers]`.
    fn name(&self) -> &str;
    /// What the provider promises.
    fn capabilities(&self) -> Capabilities;
    /// Performs the call once and classifies the answer. Never panics, never retries
    /// on its own.
    fn execute<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Outcome>;
    /// [`Provider::execute`], with what the answer said about the provider's limits
    /// (`Retry-After`, `RateLimit` fields; see [`Pushback`]) — the worker's flow control
    /// reads it on every answer, not only on a throttle. Adapters that read no such
    /// fields keep the default (nothing said).
    fn execute_with_pushback<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, (Outcome, Pushback)> {
        Box::pin(async move { (self.execute(call).await, Pushback::default()) })
    }
    /// Asks the provider what became of `call.key`.
    fn lookup<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Remote>;
}

/// Providers by name, built from the config: one adapter per `[providers.NAME]`, chosen
/// by its `kind` (errors name the field, e.g. "providers.bank.base_url: …").
pub fn build(config: &Config) -> Result<BTreeMap<String, Arc<dyn Provider>>, ConfigError> {
    build_where(config, |_| true)
}

/// [`build`], but only the providers some configured action uses: what a worker or a
/// reconciler needs. A worker started for some actions (`run --action …`) then needs
/// only their providers' credentials.
pub fn build_used(config: &Config) -> Result<BTreeMap<String, Arc<dyn Provider>>, ConfigError> {
    let used: std::collections::BTreeSet<&str> = config
        .actions
        .values()
        .map(|a| a.provider.as_str())
        .collect();
    build_where(config, |name| used.contains(name))
}

fn build_where(
    config: &Config,
    wanted: impl Fn(&str) -> bool,
) -> Result<BTreeMap<String, Arc<dyn Provider>>, ConfigError> {
    let mut providers: BTreeMap<String, Arc<dyn Provider>> = BTreeMap::new();
    for (name, p) in config.providers.iter().filter(|(name, _)| wanted(name)) {
        let provider: Arc<dyn Provider> = match p {
            ProviderConfig::Http(http) => Arc::new(HttpProvider::new(name, http)?),
            ProviderConfig::Smtp(smtp) => Arc::new(SmtpProvider::new(name, smtp)?),
        };
        providers.insert(name.clone(), provider);
    }
    Ok(providers)
}
