//! The generic HTTP/JSON adapter: one configured `[providers.NAME]` reached over
//! HTTP/1.1, or over HTTP/2 where its config says `http2 = true` (then every call in
//! flight is a stream of one shared connection, so losing that connection turns all of
//! them unknown at once — each is still classified by the rules below).
//!
//! Why it is careful about *where* a call failed: "the request never left" (connect
//! refused, DNS, connect timeout) may be retried blindly, while "it may have been
//! written and we got no answer" (timeout, reset, closed, 5xx) must go to the
//! reconciler — a blind retry there is how payments happen twice. So the transport
//! error is classified from what hyper can prove ([`Error::is_connect`], and whether a
//! connection was ever handed to the request, via [`capture_connection`]), never from
//! guesses; when in doubt the answer is [`Outcome::Unknown`].
//!
//! Payloads and response bodies are never logged and never end up in codes.
//!
//! [`Error::is_connect`]: hyper_util::client::legacy::Error::is_connect

use std::error::Error as StdError;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Bytes;
use hyper::header::{ACCEPT, CONTENT_TYPE, HeaderName, HeaderValue};
use hyper::{Method, Request, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::capture_connection;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use oncely_core::config::{ConfigError, HttpProviderConfig};
use serde_json::Value;

use super::mapping::{LookupBy, Mapping};
use super::transport::{ConnectFailure, Connector, Tls};
use super::{BoxFuture, Call, Capabilities, Outcome, Provider, Pushback, Remote};

/// Largest response body read; a bigger one is treated as unreadable.
const MAX_BODY_BYTES: usize = 1 << 20;
/// Idle keep-alive connections are closed after this.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// A provider behind the generic HTTP/JSON adapter (see the module docs).
#[derive(Debug)]
pub struct HttpProvider {
    name: String,
    client: Client<Connector, Full<Bytes>>,
    /// Configured headers (credentials included), resolved and marked sensitive.
    headers: Vec<(HeaderName, HeaderValue)>,
    /// Whether a refusal of our credentials (401/403) was already logged.
    auth_reported: AtomicBool,
    /// Whether a failed TLS handshake was already logged.
    tls_reported: AtomicBool,
    /// `base_url` without a trailing `/`.
    base: String,
    /// The requests: method, paths, body.
    mapping: Mapping,
    /// The idempotency key's header (`None`: the key travels in the body only).
    key_header: Option<HeaderName>,
    /// The config, for reading answers (pointers, values, status lists).
    config: HttpProviderConfig,
    capabilities: Capabilities,
}

/// What one HTTP exchange came to, before classification.
#[derive(Debug)]
enum Exchange {
    /// A status line and a complete body, and what its fields said about limits.
    Answered {
        status: u16,
        body: Bytes,
        pushback: Pushback,
    },
    /// A status line, then the body could not be read (reset, closed, too large).
    BodyFailed { status: u16 },
    /// Provably never written: no connection was ever handed to the request.
    NotSent(&'static str),
    /// It may have been written; no (complete) answer.
    Lost(&'static str),
}

impl HttpProvider {
    /// An adapter for `[providers.NAME]`; errors name the field.
    ///
    /// The field checks are [`HttpProviderConfig::validate`]'s, run when the config is
    /// loaded; this only converts what needs the HTTP stack (URLs, the header name).
    /// Built directly from a config that skipped them, an adapter still never panics.
    pub fn new(name: &str, config: &HttpProviderConfig) -> Result<Self, ConfigError> {
        let field = |f: &str| format!("providers.{name}.{f}");
        let invalid = |f: &str, problem: String| ConfigError::Invalid {
            field: field(f),
            problem,
        };

        let base = config.base_url.trim().trim_end_matches('/').to_owned();
        let base_uri: Uri = base
            .parse()
            .map_err(|e| invalid("base_url", format!("not a URL: {e}")))?;
        let tls = match (base_uri.scheme_str(), base_uri.host()) {
            (Some("https"), Some(host)) => Some(
                if config.http2 {
                    Tls::offering_h2(host, config.ca_file.as_deref().map(Path::new))
                } else {
                    Tls::new(host, config.ca_file.as_deref().map(Path::new))
                }
                .map_err(|e| {
                    let at = if config.ca_file.is_some() {
                        "ca_file"
                    } else {
                        "base_url"
                    };
                    invalid(at, e)
                })?,
            ),
            (Some("http"), Some(_)) => None,
            _ => {
                return Err(invalid(
                    "base_url",
                    "must be https://host[:port] (or http://)".into(),
                ));
            }
        };
        if base_uri.query().is_some() {
            return Err(invalid("base_url", "must not carry a query".into()));
        }
        let mapping = Mapping::new(config).map_err(|(f, e)| invalid(f, e))?;
        let header = config.idempotency_header.trim();
        let key_header = (!header.is_empty())
            .then(|| HeaderName::from_bytes(header.as_bytes()))
            .transpose()
            .map_err(|_| {
                invalid(
                    "idempotency_header",
                    format!("{header:?} is not a valid header name"),
                )
            })?;

        let headers = super::credentials::resolve(name, config)?;
        let tls_none = tls.is_none();
        let connector = Connector::new(tls, config.connect_timeout);
        // HTTP/2 over TLS is chosen in the handshake (ALPN); without TLS only by prior
        // knowledge, so `http://` with `http2` speaks nothing else.
        let h2c = config.http2 && tls_none;
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .http2_only(h2c)
            .build(connector);

        let lookup = !config.lookup_path.is_empty() || !config.lookup_by_reference_path.is_empty();
        Ok(HttpProvider {
            name: name.to_owned(),
            client,
            headers,
            auth_reported: AtomicBool::new(false),
            tls_reported: AtomicBool::new(false),
            base,
            mapping,
            key_header,
            config: config.clone(),
            capabilities: Capabilities {
                honours_key: config.honours_key,
                key_retention: config.key_retention,
                lookup,
                absence_authoritative: config.absence_authoritative,
            },
        })
    }

    /// One request with the whole-call timeout around it (body read included).
    async fn exchange(&self, mut request: Request<Full<Bytes>>) -> Exchange {
        request.headers_mut().extend(self.headers.iter().cloned());
        let captured = capture_connection(&mut request);
        match tokio::time::timeout(self.config.timeout, self.round_trip(request)).await {
            Ok(exchange) => {
                if let Exchange::Answered {
                    status: status @ (401 | 403),
                    ..
                } = exchange
                {
                    self.report_auth_refused(status);
                }
                exchange
            }
            // No connection was ever handed to the request: nothing was written.
            Err(_) if captured.connection_metadata().is_none() => {
                Exchange::NotSent("connect_timeout")
            }
            // Conservative: the request may have been (partly) written.
            Err(_) => Exchange::Lost("timeout"),
        }
    }

    async fn round_trip(&self, request: Request<Full<Bytes>>) -> Exchange {
        let response = match self.client.request(request).await {
            Ok(r) => r,
            Err(e) if e.is_connect() => {
                let failure = ConnectFailure::find(&e);
                let code = failure.map_or("connect_failed", ConnectFailure::code);
                if let Some(tls @ ConnectFailure::Tls(_)) = failure {
                    self.report_tls_failure(code, tls);
                }
                return Exchange::NotSent(code);
            }
            Err(e) => return Exchange::Lost(lost_code(&e)),
        };
        let status = response.status().as_u16();
        let pushback = Pushback::from_headers(response.headers(), std::time::SystemTime::now());
        match Limited::new(response.into_body(), MAX_BODY_BYTES)
            .collect()
            .await
        {
            Ok(body) => Exchange::Answered {
                status,
                body: body.to_bytes(),
                pushback,
            },
            Err(_) => Exchange::BodyFailed { status },
        }
    }

    /// 401/403: our credentials are wrong or lack a permission. Every call fails the
    /// same way until a person fixes them, so it is logged once per provider (the
    /// counter counts each refusal) instead of once per operation.
    fn report_auth_refused(&self, status: u16) {
        let reason = "auth";
        metrics::counter!(oncely_core::metrics::PROVIDER_REFUSALS, "provider" => self.name.clone(), "reason" => reason).increment(1);
        if !self.auth_reported.swap(true, Ordering::Relaxed) {
            tracing::error!(
                provider = %self.name,
                status,
                "the provider refused oncely's credentials: its operations fail until the \
                 headers or basic_auth of this provider are fixed (logged once)",
            );
        }
    }

    /// A failed handshake (a certificate the CA does not vouch for, an expired or
    /// mismatched one, no common protocol): nothing was sent; logged once per provider.
    fn report_tls_failure(&self, code: &'static str, failure: &ConnectFailure) {
        metrics::counter!(oncely_core::metrics::PROVIDER_REFUSALS, "provider" => self.name.clone(), "reason" => code).increment(1);
        if !self.tls_reported.swap(true, Ordering::Relaxed) {
            tracing::error!(
                provider = %self.name,
                code,
                error = %failure,
                "TLS handshake with the provider failed; nothing was sent (logged once)",
            );
        } else {
            tracing::debug!(provider = %self.name, code, error = %failure, "TLS handshake failed");
        }
    }

    /// The execute request, or the outcome when it cannot be built (nothing is sent).
    fn execute_request(&self, call: &Call<'_>) -> Result<Request<Full<Bytes>>, Outcome> {
        let rendered = self
            .mapping
            .execute(call.key.as_str(), call.action_type, call.payload)
            .map_err(|e| {
                // The payload never changes: no later attempt can do better.
                tracing::warn!(
                    provider = %self.name,
                    key = %call.key,
                    field = %e.pointer(),
                    code = e.code(),
                    "the provider's request cannot be built from the operation's payload (a missing field, or a path value `.`, `..` or empty); nothing was sent",
                );
                Outcome::Rejected {
                    code: e.code().into(),
                }
            })?;
        let invalid = || Outcome::NotSent {
            code: "invalid_request".into(),
        };
        let uri: Uri = format!("{}{}", self.base, rendered.path)
            .parse()
            .map_err(|_| invalid())?;
        let mut builder = Request::builder()
            .method(rendered.method)
            .uri(uri)
            .header(CONTENT_TYPE, rendered.content_type)
            .header(ACCEPT, "application/json");
        if let Some(header) = &self.key_header {
            let key = HeaderValue::from_str(call.key.as_str()).map_err(|_| invalid())?;
            builder = builder.header(header, key);
        }
        builder
            .body(Full::new(Bytes::from(rendered.body)))
            .map_err(|_| invalid())
    }

    fn get_request(&self, path: &str) -> Option<Request<Full<Bytes>>> {
        let uri: Uri = format!("{}{path}", self.base).parse().ok()?;
        Request::builder()
            .method(Method::GET)
            .uri(uri)
            .header(ACCEPT, "application/json")
            .body(Full::new(Bytes::new()))
            .ok()
    }

    fn classify_execute(&self, exchange: Exchange) -> Outcome {
        let c = &self.config;
        match exchange {
            Exchange::Answered {
                status: 200..=299,
                body,
                ..
            } => self.classify_accepted(&body),
            Exchange::Answered { status, .. } if c.in_flight_statuses.contains(&status) => {
                Outcome::InFlight
            }
            // A throttle: listed, or a 503 that says when to come back (RFC 9110, 15.6.4).
            Exchange::Answered {
                status, pushback, ..
            } if c.throttle_statuses.contains(&status)
                || (status == 503 && pushback.retry_after) =>
            {
                Outcome::Throttled {
                    code: http_code(status),
                    retry_after: pushback.wait,
                }
            }
            Exchange::Answered { status, .. } if c.retry_statuses.contains(&status) => {
                Outcome::NotSent {
                    code: http_code(status),
                }
            }
            Exchange::Answered {
                status: status @ 400..=499,
                ..
            } => Outcome::Rejected {
                code: http_code(status),
            },
            Exchange::Answered { status, .. } => Outcome::Unknown {
                code: http_code(status),
            },
            Exchange::BodyFailed { .. } => Outcome::Unknown {
                code: "body_read_failed".into(),
            },
            Exchange::NotSent(code) => Outcome::NotSent { code: code.into() },
            Exchange::Lost(code) => Outcome::Unknown { code: code.into() },
        }
    }

    /// A 2xx answer: succeeded with the provider's id, unless its status (when it
    /// carries one) is a rejection (a declined payment answered 200).
    fn classify_accepted(&self, body: &[u8]) -> Outcome {
        let Ok(json) = serde_json::from_slice::<Value>(body) else {
            return Outcome::Unknown {
                code: "unparsable_body".into(),
            };
        };
        let status = json
            .pointer(&self.config.status_pointer)
            .and_then(Value::as_str);
        if let Some(s) = status.filter(|s| self.config.rejected_values.iter().any(|v| v == s)) {
            return Outcome::Rejected {
                code: format!("remote_{s}"),
            };
        }
        match id_at(&json, &self.config.id_pointer) {
            Some(provider_operation_id) => Outcome::Succeeded {
                provider_operation_id,
                result: json,
            },
            None => Outcome::Unknown {
                code: "no_provider_id".into(),
            },
        }
    }

    /// Classifies a lookup answer. A list answer (`lookup_list_pointer`) is searched for
    /// the record that echoes our key; none is absence. `by_reference`: the record must
    /// echo our key, since another operation may share the reference.
    fn classify_found(&self, body: &[u8], key: &str, by_reference: bool) -> Remote {
        let Ok(json) = serde_json::from_slice::<Value>(body) else {
            return Remote::Failed {
                code: "unparsable_body".into(),
            };
        };
        let echo = &self.config.key_echo_pointer;
        if self.config.lookup_list_pointer.is_empty() {
            return self.classify_record(json, key, by_reference);
        }
        let Some(items) = json
            .pointer(&self.config.lookup_list_pointer)
            .and_then(Value::as_array)
        else {
            return Remote::Failed {
                code: "no_list".into(),
            };
        };
        let ours = items
            .iter()
            .find(|item| item.pointer(echo).and_then(Value::as_str) == Some(key));
        match ours {
            Some(record) => self.classify_record(record.clone(), key, by_reference),
            None if items.is_empty() || items.iter().all(|i| i.pointer(echo).is_some()) => {
                Remote::Absent
            }
            // Records that do not say whose they are prove nothing either way.
            None => Remote::Failed {
                code: "reference_unverified".into(),
            },
        }
    }

    /// Classifies one found record.
    fn classify_record(&self, json: Value, key: &str, by_reference: bool) -> Remote {
        let c = &self.config;
        let echoed = json.pointer(&c.key_echo_pointer).and_then(Value::as_str);
        match echoed {
            Some(k) if k != key => {
                let code = if by_reference {
                    "reference_other_key"
                } else {
                    "key_mismatch"
                };
                return Remote::Failed { code: code.into() };
            }
            // A record found by reference that does not say whose it is proves nothing.
            None if by_reference => {
                return Remote::Failed {
                    code: "reference_unverified".into(),
                };
            }
            _ => {}
        }
        let status = json.pointer(&c.status_pointer).and_then(Value::as_str);
        match status {
            Some(s) if c.succeeded_values.iter().any(|v| v == s) => {
                match id_at(&json, &c.id_pointer) {
                    Some(provider_operation_id) => Remote::Succeeded {
                        provider_operation_id,
                        result: json,
                    },
                    None => Remote::Failed {
                        code: "no_provider_id".into(),
                    },
                }
            }
            Some(s) if c.rejected_values.iter().any(|v| v == s) => Remote::Rejected {
                code: format!("remote_{s}"),
            },
            _ => Remote::Pending,
        }
    }

    /// One lookup: `Ok(None)` when the provider has no such record (404).
    async fn lookup_one(&self, by: LookupBy, call: &Call<'_>) -> Result<Option<Remote>, Remote> {
        let key = call.key.as_str();
        let path = match self
            .mapping
            .lookup_path(by, key, call.action_type, call.payload)
        {
            Some(Ok(path)) => path,
            Some(Err(_)) | None => return Err(Remote::Unsupported),
        };
        let Some(request) = self.get_request(&path) else {
            return Err(Remote::Failed {
                code: "invalid_request".into(),
            });
        };
        match self.exchange(request).await {
            Exchange::Answered {
                status: 200..=299,
                body,
                ..
            } => match self.classify_found(&body, key, by == LookupBy::Reference) {
                Remote::Absent => Ok(None),
                found => Ok(Some(found)),
            },
            Exchange::Answered { status: 404, .. } => Ok(None),
            other => Err(lookup_failure(other)),
        }
    }

    /// By key first (when configured), then by reference; absent only when every lookup
    /// that could be asked said so.
    async fn lookup_inner(&self, call: &Call<'_>) -> Remote {
        let mut asked = false;
        for by in [LookupBy::Key, LookupBy::Reference] {
            if !self.mapping.has_lookup(by) {
                continue;
            }
            match self.lookup_one(by, call).await {
                Ok(Some(found)) => return found,
                Ok(None) => asked = true,
                // No reference in the payload: nothing to ask by it.
                Err(Remote::Unsupported) => {}
                Err(failed) => return failed,
            }
        }
        if asked {
            Remote::Absent
        } else {
            Remote::Unsupported
        }
    }
}

impl Provider for HttpProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    fn execute<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Outcome> {
        Box::pin(async move { self.execute_with_pushback(call).await.0 })
    }

    fn execute_with_pushback<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, (Outcome, Pushback)> {
        Box::pin(async move {
            let started = Instant::now();
            let (status, pushback, outcome) = match self.execute_request(&call) {
                Ok(request) => {
                    let exchange = self.exchange(request).await;
                    let pushback = match &exchange {
                        Exchange::Answered { pushback, .. } => *pushback,
                        _ => Pushback::default(),
                    };
                    (
                        exchange_status(&exchange),
                        pushback,
                        self.classify_execute(exchange),
                    )
                }
                Err(outcome) => (None, Pushback::default(), outcome),
            };
            tracing::debug!(
                provider = %self.name,
                key = %call.key,
                action_type = call.action_type,
                status,
                outcome = crate::decide::outcome_label(&outcome),
                code = outcome_code(&outcome),
                elapsed_ms = started.elapsed().as_millis() as u64,
                "provider execute",
            );
            (outcome, pushback)
        })
    }

    fn lookup<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Remote> {
        Box::pin(async move {
            if !self.capabilities.lookup {
                return Remote::Unsupported;
            }
            let started = Instant::now();
            let remote = self.lookup_inner(&call).await;
            tracing::debug!(
                provider = %self.name,
                key = %call.key,
                action_type = call.action_type,
                remote = remote.label(),
                code = remote.code(),
                elapsed_ms = started.elapsed().as_millis() as u64,
                "provider lookup",
            );
            remote
        })
    }
}

fn lookup_failure(exchange: Exchange) -> Remote {
    let code = match exchange {
        Exchange::Answered { status, .. } => http_code(status),
        Exchange::BodyFailed { .. } => "body_read_failed".into(),
        Exchange::NotSent(code) | Exchange::Lost(code) => code.into(),
    };
    Remote::Failed { code }
}

fn http_code(status: u16) -> String {
    format!("http_{status}")
}

fn exchange_status(exchange: &Exchange) -> Option<u16> {
    match exchange {
        Exchange::Answered { status, .. } | Exchange::BodyFailed { status } => Some(*status),
        Exchange::NotSent(_) | Exchange::Lost(_) => None,
    }
}

fn outcome_code(outcome: &Outcome) -> &str {
    match outcome {
        Outcome::Rejected { code }
        | Outcome::NotSent { code }
        | Outcome::Throttled { code, .. }
        | Outcome::Unknown { code } => code,
        Outcome::Succeeded { .. } | Outcome::InFlight => "",
    }
}

/// A short code for a transport error after a connection was obtained.
fn lost_code(error: &hyper_util::client::legacy::Error) -> &'static str {
    let mut current: Option<&(dyn StdError + 'static)> = error.source();
    while let Some(e) = current {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return match io.kind() {
                std::io::ErrorKind::ConnectionReset => "connection_reset",
                std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::BrokenPipe => {
                    "connection_closed"
                }
                _ => "connection_lost",
            };
        }
        if let Some(h) = e.downcast_ref::<hyper::Error>() {
            if h.is_incomplete_message() || h.is_closed() || h.is_canceled() {
                return "connection_closed";
            }
            if h.is_parse() {
                return "invalid_response";
            }
        }
        current = e.source();
    }
    "connection_lost"
}

/// The provider id at `pointer`: a non-empty string, or a number as text.
fn id_at(json: &Value, pointer: &str) -> Option<String> {
    match json.pointer(pointer)? {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ids_are_strings_or_numbers() {
        assert_eq!(id_at(&json!({"id": "po_1"}), "/id"), Some("po_1".into()));
        assert_eq!(id_at(&json!({"id": 42}), "/id"), Some("42".into()));
        assert_eq!(id_at(&json!({"id": ""}), "/id"), None);
        assert_eq!(id_at(&json!({"id": null}), "/id"), None);
        assert_eq!(
            id_at(&json!({"data": {"id": "x"}}), "/data/id"),
            Some("x".into())
        );
    }
}
