//! What the gateway does, independent of how it is asked (HTTP or MCP): authenticate,
//! check, record + publish through the producer SDK, read status, wait.

use crate::client_keys::{self, Begin};
use crate::coalesce::{Coalescer, IN_FLIGHT, MAX_BATCH};
pub use crate::tokens::Caller;
use crate::tokens::Tokens;
use oncely_core::config::Config;
use oncely_core::intent::EnvelopeError;
use oncely_core::journal::{JournalError, Operation};
use oncely_core::roles::Process;
use oncely_core::schema::PayloadSchemas;
use oncely_core::{IdempotencyKey, Intent, KeyRing, Status};
use oncely_producer::{Asked, Enqueued, Producer, ProducerError};
use serde::Serialize;
use serde_json::{Map, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::RwLock;

/// The `Retry-After` the gateway asks for when Postgres or RabbitMQ is down.
pub const RETRY_AFTER_SECS: u64 = 2;
/// Longest `wait` a caller may ask for.
pub const MAX_WAIT: Duration = Duration::from_secs(60);

/// An agent's request, as the MCP tools take it (HTTP bodies go through
/// [`Service::submit_json`], which names the offending field).
#[derive(Debug, Clone)]
pub struct ActionRequest {
    /// The workflow (conversation, case).
    pub workflow_id: String,
    /// The plan step.
    pub step: String,
    /// The business object acted on.
    pub business_object: String,
    /// Its revision.
    pub revision: i64,
    /// The payload for the provider.
    pub payload: Value,
    /// Deliver no earlier than this (RFC 3339).
    pub not_before: Option<String>,
    /// Not started by then → `expired` (RFC 3339).
    pub expires_at: Option<String>,
}

/// An operation as agents see it: status and result, never the payload.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ActionView {
    /// The idempotency key.
    pub key: String,
    /// The action type.
    pub action_type: String,
    /// `planned`, `executing`, `succeeded`, `failed_retryable`, `failed_final`, `unknown`,
    /// `deferred`, `awaiting_approval`, `rejected`, `cancelled`, `expired`.
    pub status: String,
    /// Whether the status is final (`succeeded`, `failed_final`, `rejected`, `cancelled`,
    /// `expired`).
    pub terminal: bool,
    /// Attempts so far.
    pub attempt: i32,
    /// The provider's saved answer, once succeeded.
    pub result: Option<Value>,
    /// The provider's id of the effect, once succeeded.
    pub provider_operation_id: Option<String>,
    /// The last error code (`http_422`, `payload_schema`, `cancelled`, `expired`,
    /// `rejected`, `approval_timed_out`, …).
    pub error_code: Option<String>,
    /// Held: the approval rule that holds it (or held it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_by_rule: Option<String>,
    /// Held: how many different people must approve it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approvals_needed: Option<i16>,
    /// Held: rejected (`approval_timed_out`) if undecided by then (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approval_deadline: Option<String>,
    /// Delivered no earlier than this (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_before: Option<String>,
    /// Not started by then → `expired` (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
}

impl ActionView {
    /// The view of a row.
    pub fn of(op: &Operation) -> Self {
        let time = |t: Option<chrono::DateTime<chrono::Utc>>| {
            t.map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        };
        Self {
            key: op.key.as_str().to_owned(),
            action_type: op.action_type.clone(),
            status: op.status.as_str().to_owned(),
            terminal: op.status.is_terminal(),
            attempt: op.attempt_count,
            result: op.result_json.clone(),
            provider_operation_id: op.provider_operation_id.clone(),
            error_code: op.last_error_code.clone(),
            held_by_rule: op.hold_rule.clone(),
            approvals_needed: op.hold_rule.as_ref().map(|_| op.approvals_needed),
            approval_deadline: time(op.approval_deadline),
            not_before: time(op.not_before),
            expires_at: time(op.expires_at),
        }
    }
}

/// What submitting did.
#[derive(Debug, Clone)]
pub enum Submitted {
    /// Recorded (and published unless held or scheduled): it will run once.
    Enqueued {
        /// The key.
        key: String,
        /// `planned`, `awaiting_approval` (held for people) or `deferred` (scheduled).
        status: Status,
    },
    /// The same action was requested before: where it stands (nothing new happens).
    Duplicate {
        /// The operation (boxed: the other answers are a key).
        view: Box<ActionView>,
    },
    /// The same identity with another payload: refused, nothing executed.
    Conflict {
        /// The key.
        key: String,
    },
}

/// A configured action type, as callers see it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ActionTypeInfo {
    /// `email.send`.
    pub name: String,
    /// The MCP tool name (`email_send`).
    pub tool: String,
    /// What it does.
    pub description: String,
    /// The JSON Schema of its payload.
    pub payload_schema: Value,
}

/// A refusal or failure, with the HTTP status and a stable code.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// Stable code (`schema_violation`, `conflict`, `database_unavailable`, …).
    pub code: &'static str,
    /// For people.
    pub message: String,
    /// JSON Pointer of the offending field of the request body, when one is to blame.
    pub field: Option<String>,
    /// The key concerned, when there is one (conflicts, recorded-but-not-published).
    pub key: Option<String>,
    /// Seconds, for 503 and 429.
    pub retry_after: Option<u64>,
    /// For a 429 over a quota: the quota (`RateLimit-Policy`), by scope (boxed: every
    /// other error is returned without it).
    pub quota: Option<Box<(&'static str, crate::quota::Quota)>>,
    /// For a 405: the methods the resource has (the `Allow` header).
    pub allow: Option<Allow>,
}

/// The methods a `/v1/actions/{id}` resource has (a `405`'s `Allow` header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allow {
    /// An action type's path: submit.
    Post,
    /// A key's path: read.
    GetHead,
}

impl Allow {
    /// The header's value.
    pub fn header(self) -> &'static str {
        match self {
            Allow::Post => "POST",
            Allow::GetHead => "GET, HEAD",
        }
    }
}

impl ApiError {
    /// An error without field or key.
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            field: None,
            key: None,
            retry_after: None,
            quota: None,
            allow: None,
        }
    }

    /// `429 rate_limited`: over the caller's quota (nothing was recorded).
    fn over_quota(o: &crate::quota::OverQuota) -> Self {
        let secs = o.retry_after.as_secs();
        Self {
            retry_after: Some(secs),
            quota: Some(Box::new((o.scope, o.quota))),
            ..Self::new(
                429,
                "rate_limited",
                format!(
                    "over the {} quota ({} per second): nothing was recorded; try again in {secs} s",
                    o.scope, o.quota.per_second
                ),
            )
        }
    }

    /// A 405's `Allow` header.
    pub fn with_allow(mut self, allow: Allow) -> Self {
        self.allow = Some(allow);
        self
    }

    /// With the offending field (a JSON Pointer, or a header's name).
    pub fn at(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    /// With the key concerned.
    pub fn with_key(mut self, key: &str) -> Self {
        self.key = Some(key.to_owned());
        self
    }

    fn unavailable(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            retry_after: Some(RETRY_AFTER_SECS),
            ..Self::new(503, code, message)
        }
    }

    fn not_found() -> Self {
        Self::new(404, "not_found", "no such operation")
    }
}

fn journal_error(e: &JournalError) -> ApiError {
    if e.is_retryable() {
        tracing::warn!(error = %e, "journal unavailable");
        ApiError::unavailable(
            "database_unavailable",
            "Postgres is unavailable; nothing was recorded — retry later (retrying is safe)",
        )
    } else {
        tracing::error!(error = %e, "journal statement failed");
        ApiError::new(
            500,
            "internal",
            "the journal refused the statement (see the gateway's log)",
        )
    }
}

/// The gateway's state: config, tokens, the producer (reconnected when RabbitMQ drops).
#[derive(Debug)]
pub struct Service {
    me: Weak<Self>,
    config: Arc<Config>,
    secret: KeyRing,
    tokens: Tokens,
    quotas: crate::quota::Quotas,
    schemas: PayloadSchemas,
    producer: RwLock<Arc<Producer>>,
    /// Every enqueue goes through here, to be recorded with the requests beside it.
    enqueues: Coalescer<(Arc<Producer>, Intent, Asked), Answer>,
    reconnecting: AtomicBool,
    /// Long-polls open, per token and in total (`429 too_many_waits` beyond).
    pub waits: crate::limits::Gate,
}

impl Service {
    /// Connect the producer and build the service.
    pub async fn connect(
        config: Config,
        secret: KeyRing,
        tokens: Tokens,
    ) -> anyhow::Result<Arc<Self>> {
        let schemas = PayloadSchemas::from_config(&config).map_err(anyhow::Error::msg)?;
        let producer = Producer::connect_as(&config, secret.clone(), Process::Gateway).await?;
        // Start the outcomes consumer now, so the first wait does not pay for it.
        producer.watcher().await?;
        let service = Arc::new_cyclic(|me| Self {
            me: me.clone(),
            config: Arc::new(config),
            secret,
            tokens,
            quotas: crate::quota::Quotas::default(),
            schemas,
            producer: RwLock::new(Arc::new(producer)),
            enqueues: Coalescer::start(IN_FLIGHT, MAX_BATCH, enqueue_batch),
            reconnecting: AtomicBool::new(false),
            waits: {
                let caps = crate::limits::Caps::default();
                crate::limits::Gate::new(caps.waits_per_token, caps.waits)
            },
        });
        Self::monitor(Arc::downgrade(&service));
        Ok(service)
    }

    /// The caller a bearer token belongs to (`None`: refuse with 401).
    pub fn authenticate(&self, bearer_token: &str) -> Option<Caller> {
        self.tokens.authenticate(bearer_token)
    }

    /// Spend one submit of the caller's quotas (its token's and its tenant's), or refuse
    /// with 429 before anything is recorded.
    fn admit(&self, caller: &Caller) -> Result<(), ApiError> {
        let mut quotas = Vec::with_capacity(2);
        if let Some(q) = caller.quota {
            quotas.push(("token", caller.token_id.as_str(), q));
        }
        if let Some(q) = caller.tenant_quota {
            quotas.push(("tenant", caller.tenant.as_str(), q));
        }
        if quotas.is_empty() {
            return Ok(());
        }
        self.quotas.admit(&quotas).map_err(|o| {
            metrics::counter!(oncely_core::metrics::GATEWAY_QUOTA_REFUSALS, "scope" => o.scope)
                .increment(1);
            ApiError::over_quota(&o)
        })
    }

    /// The current producer.
    pub async fn producer(&self) -> Arc<Producer> {
        self.producer.read().await.clone()
    }

    /// The action types `caller` may enqueue.
    pub fn action_types(&self, caller: &Caller) -> Vec<ActionTypeInfo> {
        let mut all = crate::contract::action_type_infos(&self.config);
        all.retain(|t| caller.may(&t.name));
        all
    }

    /// Every configured action type.
    pub fn all_action_types(&self) -> Vec<ActionTypeInfo> {
        crate::contract::action_type_infos(&self.config)
    }

    /// Is `name` a configured action type?
    pub fn is_action_type(&self, name: &str) -> bool {
        self.config.actions.contains_key(name)
    }

    /// Submit from typed fields (MCP).
    pub async fn submit(
        &self,
        caller: &Caller,
        action_type: &str,
        req: ActionRequest,
        client_key: Option<&str>,
    ) -> Result<Submitted, ApiError> {
        let mut body = Map::new();
        body.insert("workflow_id".into(), Value::String(req.workflow_id));
        body.insert("step".into(), Value::String(req.step));
        body.insert("business_object".into(), Value::String(req.business_object));
        body.insert("revision".into(), Value::from(req.revision));
        body.insert("payload".into(), req.payload);
        for (name, t) in [
            ("not_before", req.not_before),
            ("expires_at", req.expires_at),
        ] {
            if let Some(t) = t {
                body.insert(name.into(), Value::String(t));
            }
        }
        self.submit_json(caller, action_type, body, client_key)
            .await
    }

    /// Submit an HTTP body: `{workflow_id, step, business_object, revision, payload}`.
    pub async fn submit_json(
        &self,
        caller: &Caller,
        action_type: &str,
        mut body: Map<String, Value>,
        client_key: Option<&str>,
    ) -> Result<Submitted, ApiError> {
        self.admit(caller)?;
        // The token's rights first: a restricted token learns nothing about the action
        // types it may not use (403 whether or not `action_type` is configured).
        if !caller.may(action_type) {
            return Err(ApiError::new(
                403,
                "forbidden_action_type",
                format!("this token may not enqueue {action_type:?}"),
            ));
        }
        if !self.config.actions.contains_key(action_type) {
            return Err(ApiError::new(
                404,
                "unknown_action_type",
                format!(
                    "no action type {action_type:?} is configured (GET /v1/action-types lists them)"
                ),
            ));
        }
        if let Some(unknown) = body.keys().find(|k| {
            !crate::contract::BODY_FIELDS.contains(&k.as_str())
                && !["tenant", "action_type"].contains(&k.as_str())
        }) {
            let field = format!("/{unknown}");
            return Err(ApiError::new(
                400,
                "invalid_request",
                format!(
                    "unknown field {:?} (a body has {})",
                    unknown.chars().take(64).collect::<String>(),
                    crate::contract::BODY_FIELDS.join(", ")
                ),
            )
            .at(field));
        }
        for reserved in ["tenant", "action_type"] {
            if body.contains_key(reserved) {
                let why = if reserved == "tenant" {
                    "the tenant comes from the token"
                } else {
                    "the action type comes from the path"
                };
                return Err(ApiError::new(
                    400,
                    "invalid_request",
                    format!("field `{reserved}` is not allowed: {why}"),
                )
                .at(format!("/{reserved}")));
            }
        }
        let asked = Asked {
            not_before: time_field(&mut body, "not_before")?,
            expires_at: time_field(&mut body, "expires_at")?,
            caller: Some(caller.token_id.clone()),
        };
        // JSON Schema (and so the document) counts `7.0` as an integer: so does the
        // revision, when it is one exactly (the key is derived from the integer).
        if let Some(Value::Number(n)) = body.get("revision")
            && let Some(f) = n
                .as_f64()
                .filter(|f| n.is_f64() && f.fract() == 0.0 && f.abs() < 2f64.powi(53))
        {
            body.insert("revision".into(), Value::from(f as i64));
        }
        if let Some(at) = crate::contract::nul_in(&body) {
            return Err(ApiError::new(
                400,
                "invalid_request",
                "text may not contain the NUL character (U+0000): the journal cannot store it",
            )
            .at(at));
        }
        body.insert("action_type".into(), Value::String(action_type.to_owned()));
        body.insert("tenant".into(), Value::String(caller.tenant.clone()));
        let intent = Intent::from_json(Value::Object(body)).map_err(|e| invalid_intent(&e))?;
        if let Err(v) = self.schemas.check(action_type, &intent.payload) {
            return Err(ApiError::new(400, "schema_violation", v.message).at(v.path));
        }
        let envelope = intent
            .clone()
            .seal(&self.secret)
            .map_err(|e| invalid_intent(&e))?;
        let key = envelope.key.as_str().to_owned();
        let pool = self.producer().await.journal().db().clone();
        let owner = match client_key {
            None => false,
            Some(ck) => {
                // One fingerprint per secret of the key ring (the current one first): a
                // request first seen before a rotation is still the same request after it.
                let fps: Vec<String> = self
                    .secret
                    .all_keys_for(&intent.identity)
                    .iter()
                    .map(|k| client_keys::fingerprint(k.as_str(), envelope.payload_hash.as_str()))
                    .collect();
                match client_keys::begin(&pool, &caller.tenant, ck, &fps)
                    .await
                    .map_err(|e| journal_error(&e.into()))?
                {
                    Begin::Proceed { owner } => owner,
                    Begin::InProgress => {
                        return Err(ApiError::new(
                            409,
                            "request_in_progress",
                            "a request with this Idempotency-Key is still being recorded; retry shortly",
                        ));
                    }
                    Begin::Reused => {
                        return Err(ApiError::new(
                            422,
                            "idempotency_key_reused",
                            "this Idempotency-Key was used for a different request",
                        ));
                    }
                }
            }
        };
        let result = self.enqueue(intent, asked, &key).await;
        if let Some(ck) = client_key.filter(|_| owner) {
            let done = match &result {
                Err(e) if e.code == "database_unavailable" || e.code == "internal" => {
                    client_keys::abort(&pool, &caller.tenant, ck).await
                }
                _ => client_keys::finish(&pool, &caller.tenant, ck, &key).await,
            };
            if let Err(e) = done {
                // Left `recording`: the same request takes it over after ABANDONED_AFTER.
                tracing::warn!(error = %e, "could not settle the Idempotency-Key row");
            }
        }
        result
    }

    /// Record and publish; map the producer's answer.
    async fn enqueue(
        &self,
        intent: Intent,
        asked: Asked,
        key: &str,
    ) -> Result<Submitted, ApiError> {
        let producer = self.producer().await;
        let answer = match self
            .enqueues
            .submit((producer.clone(), intent, asked))
            .await
        {
            Some(Ok(answer)) => answer,
            Some(Err(whole_batch)) => return Err(batch_error(&whole_batch)),
            None => {
                return Err(ApiError::new(
                    500,
                    "internal",
                    "the request's batch was lost (see the gateway's log); retrying is safe",
                ));
            }
        };
        match answer {
            Ok(Enqueued::Enqueued { key, status }) => Ok(Submitted::Enqueued {
                key: key.as_str().to_owned(),
                status,
            }),
            Ok(Enqueued::Duplicate { key, .. }) => {
                let op = producer
                    .journal()
                    .get_without_payload(&key)
                    .await
                    .map_err(|e| journal_error(&e))?;
                // A purge between the two reads: the key is forgotten; report it as planned.
                let view = op
                    .as_ref()
                    .map(ActionView::of)
                    .unwrap_or_else(|| ActionView {
                        key: key.as_str().to_owned(),
                        action_type: String::new(),
                        status: Status::Planned.as_str().to_owned(),
                        terminal: false,
                        attempt: 0,
                        result: None,
                        provider_operation_id: None,
                        error_code: None,
                        held_by_rule: None,
                        approvals_needed: None,
                        approval_deadline: None,
                        not_before: None,
                        expires_at: None,
                    });
                Ok(Submitted::Duplicate {
                    view: Box::new(view),
                })
            }
            Ok(Enqueued::Conflict { key, .. }) => Ok(Submitted::Conflict {
                key: key.as_str().to_owned(),
            }),
            Err(ProducerError::Publish(e)) => {
                tracing::warn!(%key, error = %e, "recorded, not published; the sweeper republishes it");
                self.reconnect_soon(producer);
                Err(ApiError::unavailable("broker_unavailable", "RabbitMQ is unavailable: the action is recorded and will be published when it is back (retrying is safe and reports it)").with_key(key))
            }
            Err(ProducerError::Journal(e)) => Err(journal_error(&e)),
            Err(ProducerError::Invalid(e)) => Err(invalid_intent(&e)),
            Err(ProducerError::Connect(e)) => {
                tracing::warn!(error = %e, "producer unavailable");
                Err(ApiError::unavailable(
                    "unavailable",
                    "the gateway cannot reach Postgres or RabbitMQ; retry later",
                ))
            }
        }
    }

    /// Replace a producer whose RabbitMQ connection dropped (once; in the background).
    fn reconnect_soon(&self, broken: Arc<Producer>) {
        if broken.broker_connected() || self.reconnecting.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::warn!("RabbitMQ connection lost; reconnecting");
        let me = self.me.clone();
        tokio::spawn(async move {
            let mut delay = Duration::from_millis(200);
            loop {
                let Some(this) = me.upgrade() else { return };
                match Producer::connect_as(&this.config, this.secret.clone(), Process::Gateway)
                    .await
                {
                    Ok(p) => {
                        if let Err(e) = p.watcher().await {
                            tracing::warn!(error = %e, "reconnected, but cannot watch outcomes yet");
                        }
                        *this.producer.write().await = Arc::new(p);
                        this.reconnecting.store(false, Ordering::Release);
                        tracing::info!("reconnected to RabbitMQ and Postgres");
                        return;
                    }
                    Err(e) => tracing::warn!(error = %e, retry_in = ?delay, "reconnect failed"),
                }
                drop(this);
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
        });
    }

    /// Watch the RabbitMQ connection and replace the producer when it drops.
    fn monitor(me: Weak<Self>) {
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let Some(this) = me.upgrade() else { return };
                let p = this.producer().await;
                this.reconnect_soon(p);
            }
        });
    }

    /// Status of a key the caller's tenant owns (404 otherwise).
    pub async fn status(&self, caller: &Caller, key: &str) -> Result<ActionView, ApiError> {
        let key = IdempotencyKey::parse(key).map_err(|_| ApiError::not_found())?;
        let op = self
            .producer()
            .await
            .journal()
            .get_without_payload(&key)
            .await
            .map_err(|e| journal_error(&e))?;
        owned(caller, op).map(|op| ActionView::of(&op))
    }

    /// Wait until terminal or `timeout` (at most `--max-wait`); the state then.
    pub async fn wait(
        &self,
        caller: &Caller,
        key: &str,
        timeout: Duration,
    ) -> Result<ActionView, ApiError> {
        let view = self.status(caller, key).await?;
        if view.terminal {
            return Ok(view);
        }
        let key = IdempotencyKey::parse(key).map_err(|_| ApiError::not_found())?;
        // Held while waiting: a long-poll costs no database connection, but a task, a
        // subscription and a timer each; one token cannot open them without bound.
        let _slot = self.waits.enter(&caller.token_id).map_err(|over| {
            let (scope, max) = match over {
                crate::limits::Over::Token(n) => ("this token", n),
                crate::limits::Over::Total(n) => ("the gateway", n),
            };
            ApiError {
                retry_after: Some(1),
                ..ApiError::new(
                    429,
                    "too_many_waits",
                    format!(
                        "{scope} has {max} long-polls open already; wait for one to end, or read the status without `wait`"
                    ),
                )
            }
        })?;
        let producer = self.producer().await;
        let watcher = producer.watcher().await.map_err(|_| {
            ApiError::unavailable(
                "broker_unavailable",
                "cannot watch outcomes: RabbitMQ is unavailable",
            )
        })?;
        let op = watcher
            .wait(producer.journal(), &key, timeout.min(self.waits.max_wait()))
            .await
            .map_err(|e| journal_error(&e))?;
        owned(caller, op).map(|op| ActionView::of(&op))
    }

    /// Cancel the caller's operation `key` if nothing runs or was sent (docs/approvals.md):
    /// `Ok((true, view))` — cancelled, it will never be sent (also when it already was
    /// cancelled); `Ok((false, view))` — too late, the view says how far it got.
    pub async fn cancel(&self, caller: &Caller, key: &str) -> Result<(bool, ActionView), ApiError> {
        use oncely_core::journal::Cancelled;
        let key = IdempotencyKey::parse(key).map_err(|_| ApiError::not_found())?;
        let producer = self.producer().await;
        let actor = format!("token:{}", caller.token_id);
        match producer
            .journal()
            .cancel(&key, Some(&caller.tenant), &actor)
            .await
            .map_err(|e| journal_error(&e))?
        {
            Cancelled::Cancelled(op) => {
                metrics::counter!(oncely_core::metrics::CONTROL_DECISIONS, "action_type" => op.action_type.clone(), "decision" => "cancelled").increment(1);
                tracing::info!(key = %op.key, action_type = %op.action_type, token = %caller.token_id, "cancelled before it was sent");
                producer.notify_decided(&op).await;
                Ok((true, ActionView::of(&op)))
            }
            Cancelled::TooLate(op) => Ok((op.status == Status::Cancelled, ActionView::of(&op))),
            Cancelled::NotFound => Err(ApiError::not_found()),
        }
    }

    /// An approver token's decision on its tenant's held operation `key`.
    pub async fn decide(
        &self,
        caller: &Caller,
        key: &str,
        approve: bool,
        note: Option<&str>,
    ) -> Result<Decision, ApiError> {
        require_approver(caller)?;
        let key = IdempotencyKey::parse(key).map_err(|_| ApiError::not_found())?;
        let producer = self.producer().await;
        let decided = producer
            .journal()
            .decide_approval(
                &key,
                &caller.token_id,
                approve,
                note,
                Some(std::slice::from_ref(&caller.tenant)),
            )
            .await
            .map_err(|e| journal_error(&e))?;
        decision(Some(&producer), decided, &caller.token_id).await
    }

    /// Readiness: Postgres answers and RabbitMQ is connected.
    pub async fn ready(&self) -> Result<(), String> {
        let producer = self.producer().await;
        sqlx::query("SELECT 1")
            .execute(producer.journal().db())
            .await
            .map_err(|e| format!("postgres: {e}"))?;
        if !producer.broker_connected() {
            return Err("rabbitmq: not connected".into());
        }
        Ok(())
    }
}

/// `403 forbidden` unless the caller's token may approve (checked before anything else
/// of the request is read).
pub fn require_approver(caller: &Caller) -> Result<(), ApiError> {
    if caller.approve {
        Ok(())
    } else {
        Err(ApiError::new(
            403,
            "forbidden",
            "this token may not approve or reject (the tokens file grants `approve = true`)",
        ))
    }
}

/// What an approval or a rejection did, as callers see it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Decision {
    /// `approved` (due for a worker now, or at its `not_before`), `approval_recorded`
    /// (four eyes: another person must approve too) or `rejected` (never sent).
    pub outcome: String,
    /// Approvals still needed (for `approval_recorded`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub more_approvals_needed: Option<i64>,
    /// The operation now.
    pub action: ActionView,
}

/// A journal's answer to a decision → the answer, or the error that says why not; the
/// outcome event (through `producer`, when there is one) and the metric for a decision
/// that moved the operation. Shared by the API and the desk.
pub async fn decision(
    producer: Option<&Producer>,
    decided: oncely_core::journal::Decided,
    who: &str,
) -> Result<Decision, ApiError> {
    use oncely_core::journal::Decided;
    let count = |op: &Operation, d: &'static str| {
        metrics::counter!(oncely_core::metrics::CONTROL_DECISIONS, "action_type" => op.action_type.clone(), "decision" => d).increment(1);
        tracing::info!(key = %op.key, action_type = %op.action_type, approver = %who, decision = d, "approval decision");
    };
    match decided {
        Decided::Approved(op) => {
            count(&op, "approved");
            Ok(Decision {
                outcome: "approved".into(),
                more_approvals_needed: None,
                action: ActionView::of(&op),
            })
        }
        Decided::NeedsMore { op, more } => {
            tracing::info!(key = %op.key, approver = %who, more, "approval recorded; more needed");
            Ok(Decision {
                outcome: "approval_recorded".into(),
                more_approvals_needed: Some(more),
                action: ActionView::of(&op),
            })
        }
        Decided::Rejected(op) => {
            count(&op, "rejected");
            if let Some(p) = producer {
                p.notify_decided(&op).await;
            }
            Ok(Decision {
                outcome: "rejected".into(),
                more_approvals_needed: None,
                action: ActionView::of(&op),
            })
        }
        Decided::NotHeld(op) => Err(ApiError::new(
            409,
            "not_held",
            format!("the action is not awaiting approval (status {})", op.status),
        )
        .with_key(op.key.as_str())),
        Decided::OwnRequest => Err(ApiError::new(
            403,
            "own_request",
            "the caller who asked for an action may not approve it",
        )),
        Decided::AlreadyDecided => Err(ApiError::new(
            409,
            "already_decided",
            "you already decided on this action (four eyes needs another person)",
        )),
        Decided::NotFound => Err(ApiError::not_found()),
    }
}

/// An optional RFC 3339 time field of a submit body, taken out of it (it is not part of
/// the intent: the same action asked for another time is the same action).
fn time_field(
    body: &mut Map<String, Value>,
    name: &'static str,
) -> Result<Option<chrono::DateTime<chrono::Utc>>, ApiError> {
    match body.remove(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => chrono::DateTime::parse_from_rfc3339(&s)
            .map(|t| Some(t.with_timezone(&chrono::Utc)))
            .map_err(|e| {
                ApiError::new(
                    400,
                    "invalid_request",
                    format!("`{name}` must be an RFC 3339 time such as 2026-12-08T09:00:00Z ({e})"),
                )
                .at(format!("/{name}"))
            }),
        Some(_) => Err(ApiError::new(
            400,
            "invalid_request",
            format!("`{name}` must be an RFC 3339 time string"),
        )
        .at(format!("/{name}"))),
    }
}

/// The row, if it belongs to the caller's tenant.
fn owned(caller: &Caller, op: Option<Operation>) -> Result<Operation, ApiError> {
    match op {
        Some(op) if op.tenant.as_deref() == Some(caller.tenant.as_str()) => Ok(op),
        _ => Err(ApiError::not_found()),
    }
}

/// `email.send` → `email_send`.
pub fn tool_name(action_type: &str) -> String {
    action_type.replace('.', "_")
}

/// One request's answer from a batch: its own result, or the whole batch's failure.
type Answer = Result<Result<Enqueued, ProducerError>, Arc<ProducerError>>;

/// Record and publish a batch of requests' intents (see [`crate::coalesce`]): one
/// `enqueue_many` per producer among them (two only around a reconnect).
async fn enqueue_batch(mut jobs: Vec<(Arc<Producer>, Intent, Asked)>) -> Vec<Answer> {
    let mut answers: Vec<Option<Answer>> = (0..jobs.len()).map(|_| None).collect();
    let mut index: Vec<usize> = (0..jobs.len()).collect();
    while let Some((producer, _, _)) = jobs.first() {
        let producer = producer.clone();
        let (same, rest): (Vec<_>, Vec<_>) = jobs
            .into_iter()
            .zip(index)
            .partition(|((p, _, _), _)| Arc::ptr_eq(p, &producer));
        (jobs, index) = rest.into_iter().unzip();
        let mut intents = Vec::with_capacity(same.len());
        let mut asked = Vec::with_capacity(same.len());
        let mut slots = Vec::with_capacity(same.len());
        for ((_, i, a), slot) in same {
            intents.push(i);
            asked.push(a);
            slots.push(slot);
        }
        match producer.enqueue_many_asked(intents, &asked).await {
            Ok(results) => {
                for (r, slot) in results.into_iter().zip(&slots) {
                    answers[*slot] = Some(Ok(r));
                }
            }
            Err(e) => {
                let e = Arc::new(e);
                for slot in &slots {
                    answers[*slot] = Some(Err(e.clone()));
                }
            }
        }
    }
    answers
        .into_iter()
        .map(|a| {
            a.unwrap_or_else(|| {
                Err(Arc::new(ProducerError::Connect(
                    "internal: no answer".into(),
                )))
            })
        })
        .collect()
}

/// A whole batch's failure, as each of its requests is told.
fn batch_error(e: &ProducerError) -> ApiError {
    match e {
        ProducerError::Journal(e) => journal_error(e),
        ProducerError::Invalid(e) => invalid_intent(e),
        ProducerError::Publish(_) | ProducerError::Connect(_) => {
            tracing::warn!(error = %e, "producer unavailable");
            ApiError::unavailable(
                "unavailable",
                "the gateway cannot reach Postgres or RabbitMQ; retry later",
            )
        }
    }
}

/// A refused intent → 400 naming the field.
fn invalid_intent(e: &EnvelopeError) -> ApiError {
    use oncely_core::identity::IdentityError as I;
    let field = match e {
        EnvelopeError::UnknownField(f) => Some(f.to_string()),
        EnvelopeError::Field { field, .. } => Some((*field).to_owned()),
        EnvelopeError::Identity(
            I::Missing(f)
            | I::WrongType { field: f, .. }
            | I::Float { field: f, .. }
            | I::Length { field: f, .. },
        ) => Some((*f).to_owned()),
        EnvelopeError::Key(_) => Some("payload".to_owned()),
        _ => None,
    };
    if let EnvelopeError::TooLarge { .. } = e {
        return ApiError::new(
            413,
            "payload_too_large",
            format!("the action's message would be too large for the workers: {e}"),
        )
        .at("/payload");
    }
    let err = ApiError::new(400, "invalid_request", e.to_string());
    match field {
        Some(f) => err.at(format!("/{f}")),
        None => err,
    }
}
