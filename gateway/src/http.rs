//! The HTTP API (`/v1`), its OpenAPI document, and the ops listener (`/healthz`,
//! `/readyz`, `/metrics`).
//!
//! `/openapi.json` is generated from the handlers' own annotations and types (utoipa);
//! the integration tests request every documented path and method from a running
//! gateway, so a route the document names but the router lacks fails CI.

use crate::contract;
use crate::service::{ActionTypeInfo, ActionView, Allow, ApiError, Caller, Service, Submitted};
use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{
    DefaultBodyLimit, FromRequestParts, MatchedPath, Path, RawQuery, Request, State,
};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header, request::Parts};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use oncely_core::config::parse_duration;
use serde::Serialize;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

/// Default request body limit (bytes): leaves room for the envelope around the payload
/// within the worker's 256 KiB message limit.
pub const DEFAULT_MAX_BODY_BYTES: usize = 192 * 1024;
/// Default time to read a `/v1` request and answer it (`--request-timeout`).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The response header that marks a replay (a duplicate's saved answer).
pub const REPLAYED: &str = "idempotent-replayed";

type AppState = Arc<Service>;

/// The body of `POST /v1/actions/{action_type}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ActionBody {
    /// The business process instance: the conversation's or case's stable id.
    pub workflow_id: String,
    /// The plan step that decided this action (stable across retries).
    pub step: String,
    /// The business object acted on.
    pub business_object: String,
    /// The object's revision: a new revision is a new action.
    pub revision: i64,
    /// The payload for the provider (checked against the action type's schema).
    #[schema(value_type = Object)]
    pub payload: Value,
    /// Optional: record now, deliver no earlier than this (RFC 3339). Not part of the
    /// action's identity.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_before: Option<String>,
    /// Optional: not started by then → `expired`, never sent (RFC 3339; the action type's
    /// `max_age` may set an earlier deadline). A call already started is not affected.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
}

/// The optional body of an approval or a rejection.
#[derive(Debug, Default, serde::Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DecisionBody {
    /// Why (kept in the audit trail; at most 2,000 characters).
    #[serde(default)]
    pub note: Option<String>,
}

/// The answer to a cancel.
#[derive(Debug, Serialize, ToSchema)]
pub struct CancelAnswer {
    /// `cancelled`: it will never be sent. (A cancel that comes too late is a `409
    /// too_late` error with the operation's status.)
    pub outcome: String,
    /// The operation now.
    pub action: ActionView,
}

/// Where to find an operation.
#[derive(Debug, Serialize, ToSchema)]
pub struct Links {
    /// `GET` this for the status.
    #[serde(rename = "self")]
    pub self_: String,
    /// `GET` this to wait for the end.
    pub wait: String,
}

/// The answer to an accepted submit (202 new, 200 duplicate).
#[derive(Debug, Serialize, ToSchema)]
pub struct SubmitAnswer {
    /// `enqueued` (new) or `duplicate` (requested before; nothing new happens).
    pub outcome: String,
    /// The idempotency key.
    pub key: String,
    /// The status now.
    pub status: String,
    /// Links.
    pub links: Links,
    /// For a duplicate: the operation as it stands, with its saved result.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<ActionView>,
}

/// An error answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorAnswer {
    /// The error.
    pub error: ErrorDetail,
}

/// What went wrong.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable code: `invalid_request`, `malformed_json`, `schema_violation`, `unauthorized`,
    /// `forbidden_action_type`, `unknown_action_type`, `not_found`, `request_in_progress`,
    /// `conflict`, `idempotency_key_reused`, `payload_too_large`, `database_unavailable`,
    /// `broker_unavailable`, `method_not_allowed`, `internal`.
    pub code: String,
    /// For people.
    pub message: String,
    /// JSON Pointer of the offending field of the request body.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The key concerned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// The configured action types.
#[derive(Debug, Serialize, ToSchema)]
pub struct ActionTypes {
    /// Those the caller may enqueue.
    pub action_types: Vec<ActionTypeInfo>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = ErrorAnswer {
            error: ErrorDetail {
                code: self.code.to_owned(),
                message: self.message,
                field: self.field,
                key: self.key,
            },
        };
        let mut r = (status, Json(body)).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        // Over a quota: the IETF RateLimit fields (draft-ietf-httpapi-ratelimit-headers),
        // so a client library can pace itself without parsing the message.
        if let (Some((scope, quota)), Some(s)) = (self.quota.map(|q| *q), self.retry_after) {
            let policy = format!("\"{scope}\";q={};w=1", quota.per_second);
            let now = format!("\"{scope}\";r=0;t={s}");
            for (name, value) in [("ratelimit-policy", policy), ("ratelimit", now)] {
                if let Ok(v) = HeaderValue::from_str(&value) {
                    r.headers_mut().insert(name, v);
                }
            }
        }
        if let Some(allow) = self.allow {
            r.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static(allow.header()));
        }
        if status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}

/// The bearer token from a header map.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        // Authenticated already by [`authenticate_first`] (the `/v1` routes).
        if let Some(caller) = parts.extensions.get::<Caller>() {
            return Ok(caller.clone());
        }
        bearer(&parts.headers)
            .and_then(|t| state.authenticate(t))
            .ok_or_else(|| {
                ApiError::new(
                    401,
                    "unauthorized",
                    "a valid `Authorization: Bearer <token>` header is required",
                )
            })
    }
}

#[derive(OpenApi)]
#[openapi(
    paths(submit, get_action, action_types, cancel, approve, reject),
    info(
        title = "oncely gateway",
        description = "Enqueue AI agents' side effects so they happen once. The idempotency key is derived from the business identity (tenant from the token, action type, workflow_id, step, business_object, revision); repeating a request is always safe."
    ),
    modifiers(&BearerAuth),
    tags((name = "actions", description = "Enqueue actions and follow them"))
)]
struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// How the API is served (`serve`'s flags).
#[derive(Debug, Clone)]
pub struct ApiSettings {
    /// Largest request body (the API and `/mcp`).
    pub max_body_bytes: usize,
    /// Time to read a `/v1` request and answer it (plus its `?wait=`).
    pub request_timeout: Duration,
    /// The `Host` names `/mcp` accepts besides loopback (rmcp refuses others: DNS
    /// rebinding).
    pub mcp_hosts: Vec<String>,
    /// What one token may hold open.
    pub caps: crate::limits::Caps,
}

impl Default for ApiSettings {
    fn default() -> Self {
        Self {
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            mcp_hosts: Vec::new(),
            caps: crate::limits::Caps::default(),
        }
    }
}

/// The `/v1` API, `/openapi.json` and the MCP endpoint (`/mcp`), served as `settings`
/// say.
pub fn api(
    service: AppState,
    settings: &ApiSettings,
    desk: Option<Arc<crate::desk::Desk>>,
) -> axum::Router {
    let ApiSettings {
        max_body_bytes,
        request_timeout,
        mcp_hosts,
        caps,
    } = settings;
    let (max_body_bytes, request_timeout) = (*max_body_bytes, *request_timeout);
    service.waits.set(caps.waits_per_token, caps.waits);
    service.waits.set_max_wait(caps.max_wait);
    use axum::routing::get;
    // The desk's approval decisions publish through the API's producer.
    if let Some(d) = &desk {
        d.attach(service.clone());
    }
    // One parameter name per position (the router's rule): `{id}` is the action type for
    // POST and the key for GET; the document names them `{action_type}` and `{key}`.
    let v1 = axum::Router::new()
        .route(
            "/v1/actions/{id}",
            axum::routing::post(submit)
                .get(get_action)
                .fallback(other_method),
        )
        .route("/v1/actions/{id}/cancel", axum::routing::post(cancel))
        .route("/v1/actions/{id}/approve", axum::routing::post(approve))
        .route("/v1/actions/{id}/reject", axum::routing::post(reject))
        .route("/v1/action-types", get(action_types))
        // The token before anything else: an unauthenticated body is never read.
        .route_layer(middleware::from_fn_with_state(
            service.clone(),
            authenticate_first,
        ))
        .route_layer(middleware::from_fn_with_state(
            (request_timeout, caps.max_wait),
            within_deadline,
        ));
    let document = Arc::new(contract::document(&service.all_action_types()));
    let api = v1
        .route(
            "/openapi.json",
            get(move || {
                let d = document.clone();
                async move { Json(d) }
            }),
        )
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(service.clone())
        .merge(crate::mcp::router_with_config(
            service,
            mcp_config(mcp_hosts, max_body_bytes),
            caps.mcp_sessions_per_token,
        ));
    match desk {
        Some(desk) => api.merge(crate::desk::router(desk)),
        None => api,
    }
    .layer(middleware::from_fn(count))
}

fn mcp_config(
    hosts: &[String],
    max_body_bytes: usize,
) -> rmcp::transport::StreamableHttpServerConfig {
    // The same body limit as the HTTP API (rmcp's own default is 4 MiB).
    let config = rmcp::transport::StreamableHttpServerConfig::default()
        .with_max_request_body_bytes(max_body_bytes);
    if hosts.is_empty() {
        return config;
    }
    let mut all: Vec<String> = ["localhost", "127.0.0.1", "::1"].map(String::from).into();
    all.extend(hosts.iter().cloned());
    config.with_allowed_hosts(all)
}

/// The OpenAPI document (what `/openapi.json` serves).
pub fn openapi() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// `405` with the methods `/v1/actions/{id}` has for this `id`: `POST` for an action
/// type, `GET` for a key (as the document lists them).
async fn other_method(State(service): State<AppState>, Path(id): Path<String>) -> ApiError {
    if service.is_action_type(&id) {
        wrong_method(Allow::Post)
    } else {
        wrong_method(Allow::GetHead)
    }
}

fn wrong_method(allow: Allow) -> ApiError {
    ApiError::new(
        405,
        "method_not_allowed",
        format!("this resource answers {} only", allow.header()),
    )
    .with_allow(allow)
}

/// 401 before the body is read (the handlers' own extractors would read it first), the
/// caller put where the [`Caller`] extractor finds it.
async fn authenticate_first(
    State(service): State<AppState>,
    mut req: Request,
    next: Next,
) -> Response {
    match bearer(req.headers()).and_then(|t| service.authenticate(t)) {
        Some(caller) => {
            req.extensions_mut().insert(caller);
            next.run(req).await
        }
        None => ApiError::new(
            401,
            "unauthorized",
            "a valid `Authorization: Bearer <token>` header is required",
        )
        .into_response(),
    }
}

/// A request must be read and answered within `timeout` — plus its `?wait=` (at most
/// `--max-wait`): a client that trickles its body holds a connection and
/// a task for no longer than that. `408 request_timeout`.
async fn within_deadline(
    State((timeout, max_wait)): State<(Duration, Duration)>,
    req: Request,
    next: Next,
) -> Response {
    let waits = req.uri().query().is_some_and(|q| q.contains("wait="));
    let deadline = if waits { timeout + max_wait } else { timeout };
    match tokio::time::timeout(deadline, next.run(req)).await {
        Ok(r) => r,
        Err(_) => ApiError::new(
            408,
            "request_timeout",
            format!("the request was not received and answered within {deadline:?}"),
        )
        .into_response(),
    }
}

/// Count requests by route and status, and time them.
async fn count(req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let method = method_label(req.method());
    let started = Instant::now();
    let r = next.run(req).await;
    let status = r.status().as_u16().to_string();
    metrics::counter!(oncely_core::metrics::GATEWAY_REQUESTS, "route" => route.clone(), "method" => method, "status" => status).increment(1);
    metrics::histogram!(oncely_core::metrics::GATEWAY_REQUEST_SECONDS, "route" => route, "method" => method)
        .record(started.elapsed().as_secs_f64());
    r
}

/// The `method` label: one of a closed set. A client can send any token as a method
/// (`X1Q / HTTP/1.1`); labelling by it made every new one a new series, kept forever —
/// unauthenticated memory growth.
fn method_label(m: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *m {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        _ => "other",
    }
}

fn links(key: &str) -> Links {
    let k = oncely_core::config::providers::template::percent_encode(key);
    Links {
        self_: format!("/v1/actions/{k}"),
        wait: format!("/v1/actions/{k}?wait=30s"),
    }
}

/// Enqueue an action.
///
/// Records the intent (`planned`) in Postgres, then publishes it; a worker runs it once.
/// The key is derived from the tenant (from the token) and the business identity, so
/// repeating the request is safe: it answers `200` with the saved status and result.
#[utoipa::path(
    post,
    path = "/v1/actions/{action_type}",
    tag = "actions",
    params(
        ("action_type" = String, Path, description = "A configured action type, e.g. `email.send`"),
        ("Idempotency-Key" = Option<String>, Header, description = "Optional client key (IETF draft): reuse with another request → 422, concurrent use → 409")
    ),
    request_body = ActionBody,
    responses(
        (status = 202, description = "Recorded: it will run once. `status` is `planned` (published), `awaiting_approval` (held by an approval rule until people approve it) or `deferred` (scheduled by `not_before`)", body = SubmitAnswer),
        (status = 200, description = "Requested before (header `Idempotent-Replayed: true`): nothing new happens", body = SubmitAnswer),
        (status = 400, description = "Bad input; `field` names it", body = ErrorAnswer),
        (status = 401, description = "No or bad token", body = ErrorAnswer),
        (status = 403, description = "The token may not enqueue this action type", body = ErrorAnswer),
        (status = 404, description = "No such action type", body = ErrorAnswer),
        (status = 409, description = "A request with this Idempotency-Key is still being recorded", body = ErrorAnswer),
        (status = 413, description = "`payload_too_large`: the body is over the limit, or the action as published would be over the workers' message limit; nothing was recorded", body = ErrorAnswer),
        (status = 422, description = "`conflict`: the same identity was requested with another payload (nothing executed); `idempotency_key_reused`", body = ErrorAnswer),
        (status = 429, description = "`rate_limited`: over the token's or the tenant's quota; nothing was recorded (headers `Retry-After`, `RateLimit`, `RateLimit-Policy`); retrying after the wait is safe", body = ErrorAnswer),
        (status = 503, description = "Postgres or RabbitMQ is down (header `Retry-After`); retrying is safe", body = ErrorAnswer)
    ),
    security(("bearer" = []))
)]
async fn submit(
    State(service): State<AppState>,
    caller: Result<Caller, ApiError>,
    Path(action_type): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let caller = caller?;
    let body = body.map_err(|r| {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                413,
                "payload_too_large",
                format!("the request body is over the limit ({r})"),
            )
        } else {
            ApiError::new(400, "invalid_request", r.body_text())
        }
    })?;
    if !service.is_action_type(&action_type) && contract::is_key(&action_type) {
        return Err(wrong_method(Allow::GetHead));
    }
    let client_key = match headers.get("idempotency-key") {
        None => None,
        Some(v) => match v.to_str().ok().and_then(contract::client_key) {
            Some(s) => Some(s.to_owned()),
            None => {
                return Err(ApiError::new(
                    400,
                    "invalid_request",
                    "Idempotency-Key must be 1..=255 visible ASCII characters other than `\"`, bare or in double quotes",
                )
                .at("Idempotency-Key"));
            }
        },
    };
    let value: Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::new(400, "malformed_json", format!("the body is not JSON: {e}")))?;
    let Value::Object(map) = value else {
        return Err(ApiError::new(
            400,
            "invalid_request",
            "the body must be a JSON object",
        ));
    };
    let submitted = service
        .submit_json(&caller, &action_type, map, client_key.as_deref())
        .await?;
    Ok(match submitted {
        Submitted::Enqueued { key, status } => (
            StatusCode::ACCEPTED,
            Json(SubmitAnswer {
                outcome: "enqueued".into(),
                links: links(&key),
                key,
                status: status.as_str().into(),
                action: None,
            }),
        )
            .into_response(),
        Submitted::Duplicate { view } => {
            let mut r = (
                StatusCode::OK,
                Json(SubmitAnswer {
                    outcome: "duplicate".into(),
                    key: view.key.clone(),
                    status: view.status.clone(),
                    links: links(&view.key),
                    action: Some(*view),
                }),
            )
                .into_response();
            r.headers_mut()
                .insert(REPLAYED, HeaderValue::from_static("true"));
            r
        }
        Submitted::Conflict { key } => {
            let mut e = ApiError::new(
                422,
                "conflict",
                "the same action (same workflow_id, step, business_object and revision) was already requested with a different payload; nothing was executed",
            );
            e.key = Some(key);
            e.into_response()
        }
    })
}

/// An operation's status and result (never its payload); with `?wait=30s`, waits
/// until it is terminal (woken by the outcome event) or the time is up.
#[utoipa::path(
    get,
    path = "/v1/actions/{key}",
    tag = "actions",
    params(
        ("key" = String, Path, description = "The idempotency key (`v1:…`, percent-encoded)"),
        ("wait" = Option<String>, Query, description = "Wait up to this long for a terminal status (`30s`, `1500ms`; at most 60s)")
    ),
    responses(
        (status = 200, description = "The operation (check `terminal`)", body = ActionView),
        (status = 400, description = "Bad `wait`", body = ErrorAnswer),
        (status = 401, description = "No or bad token", body = ErrorAnswer),
        (status = 404, description = "No such operation for this tenant", body = ErrorAnswer),
        (status = 503, description = "Postgres is down", body = ErrorAnswer)
    ),
    security(("bearer" = []))
)]
async fn get_action(
    State(service): State<AppState>,
    caller: Result<Caller, ApiError>,
    Path(key): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Json<ActionView>, ApiError> {
    let caller = caller?;
    if service.is_action_type(&key) {
        return Err(wrong_method(Allow::Post));
    }
    let wait = wait_param(query.as_deref(), service.waits.max_wait())?;
    let view = match wait {
        None => service.status(&caller, &key).await?,
        Some(t) => service.wait(&caller, &key, t).await?,
    };
    Ok(Json(view))
}

/// `wait=…` from the query string (at most `max`).
fn wait_param(query: Option<&str>, max: Duration) -> Result<Option<Duration>, ApiError> {
    let bad = |m: String| {
        let mut e = ApiError::new(400, "invalid_request", m);
        e.field = Some("wait".into());
        e
    };
    let Some(q) = query else { return Ok(None) };
    for pair in q.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "wait" if !contract::is_wait(v) => {
                return Err(bad(format!(
                    "wait={v:?} is not a duration such as 30s or 1500ms (digits, then ms, s, m, h or d)"
                )));
            }
            "wait" => return parse_duration(v).map(|d| Some(d.min(max))).map_err(bad),
            "" => {}
            other => {
                return Err(bad(format!(
                    "unknown query parameter {other:?} (only `wait`)"
                )));
            }
        }
    }
    Ok(None)
}

/// Cancel an action before it is sent.
///
/// Atomic against a worker's claim: `200 cancelled` means no worker can take it any more
/// and it will never be sent (repeating the cancel answers the same); `409 too_late`
/// means a worker took it first (or it already ended) — `error.message` names the status.
#[utoipa::path(
    post,
    path = "/v1/actions/{key}/cancel",
    tag = "actions",
    params(("key" = String, Path, description = "The idempotency key (`v1:…`, percent-encoded)")),
    responses(
        (status = 200, description = "Cancelled: it will never be sent", body = CancelAnswer),
        (status = 401, description = "No or bad token", body = ErrorAnswer),
        (status = 404, description = "No such operation for this tenant", body = ErrorAnswer),
        (status = 409, description = "`too_late`: it is executing, or already ended", body = ErrorAnswer),
        (status = 503, description = "Postgres is down; retrying is safe", body = ErrorAnswer)
    ),
    security(("bearer" = []))
)]
async fn cancel(
    State(service): State<AppState>,
    caller: Result<Caller, ApiError>,
    Path(key): Path<String>,
) -> Result<Json<CancelAnswer>, ApiError> {
    let caller = caller?;
    match service.cancel(&caller, &key).await? {
        (true, action) => Ok(Json(CancelAnswer {
            outcome: "cancelled".into(),
            action,
        })),
        (false, action) => Err(ApiError::new(
            409,
            "too_late",
            format!(
                "too late to cancel: the action is {} (it may run or have run)",
                action.status
            ),
        )
        .with_key(&action.key)),
    }
}

/// Approve a held action (a token with `approve = true`, of the action's tenant; never
/// the token that asked for it).
#[utoipa::path(
    post,
    path = "/v1/actions/{key}/approve",
    tag = "actions",
    params(("key" = String, Path, description = "The idempotency key (`v1:…`, percent-encoded)")),
    request_body(content = Option<DecisionBody>, description = "Optional note"),
    responses(
        (status = 200, description = "`approved` (due for a worker) or `approval_recorded` (four eyes: one more person must approve)", body = crate::service::Decision),
        (status = 400, description = "Bad body (not `{\"note\": …}` or `null`; a note over 2,000 characters)", body = ErrorAnswer),
        (status = 401, description = "No or bad token", body = ErrorAnswer),
        (status = 403, description = "`forbidden` (not an approver token) or `own_request`", body = ErrorAnswer),
        (status = 404, description = "No such operation for this tenant", body = ErrorAnswer),
        (status = 409, description = "`not_held` (not awaiting approval) or `already_decided`", body = ErrorAnswer)
    ),
    security(("bearer" = []))
)]
async fn approve(
    State(service): State<AppState>,
    caller: Result<Caller, ApiError>,
    Path(key): Path<String>,
    body: Bytes,
) -> Result<Json<crate::service::Decision>, ApiError> {
    decide(service, caller, key, body, true).await
}

/// Reject a held action: it ends `rejected` and is never sent.
#[utoipa::path(
    post,
    path = "/v1/actions/{key}/reject",
    tag = "actions",
    params(("key" = String, Path, description = "The idempotency key (`v1:…`, percent-encoded)")),
    request_body(content = Option<DecisionBody>, description = "Optional note"),
    responses(
        (status = 200, description = "`rejected`: never sent", body = crate::service::Decision),
        (status = 400, description = "Bad body (not `{\"note\": …}` or `null`; a note over 2,000 characters)", body = ErrorAnswer),
        (status = 401, description = "No or bad token", body = ErrorAnswer),
        (status = 403, description = "`forbidden`: not an approver token", body = ErrorAnswer),
        (status = 404, description = "No such operation for this tenant", body = ErrorAnswer),
        (status = 409, description = "`not_held` or `already_decided`", body = ErrorAnswer)
    ),
    security(("bearer" = []))
)]
async fn reject(
    State(service): State<AppState>,
    caller: Result<Caller, ApiError>,
    Path(key): Path<String>,
    body: Bytes,
) -> Result<Json<crate::service::Decision>, ApiError> {
    decide(service, caller, key, body, false).await
}

async fn decide(
    service: AppState,
    caller: Result<Caller, ApiError>,
    key: String,
    body: Bytes,
    approve: bool,
) -> Result<Json<crate::service::Decision>, ApiError> {
    let caller = caller?;
    crate::service::require_approver(&caller)?;
    let body: DecisionBody = if body.iter().all(u8::is_ascii_whitespace) {
        DecisionBody::default()
    } else {
        // An object or `null`, as documented (serde would also read a struct from an
        // array: `[]` was an approval with no note).
        let bad = |e: String| ApiError::new(400, "invalid_request", format!("body: {e}"));
        match serde_json::from_slice::<Value>(&body).map_err(|e| bad(e.to_string()))? {
            Value::Null => DecisionBody::default(),
            v @ Value::Object(_) => serde_json::from_value(v).map_err(|e| bad(e.to_string()))?,
            _ => {
                return Err(bad(
                    "expected an object such as {\"note\": \"…\"}, or null".into()
                ));
            }
        }
    };
    if body.note.as_ref().is_some_and(|n| n.chars().count() > 2000) {
        return Err(ApiError::new(
            400,
            "invalid_request",
            "note: at most 2,000 characters",
        ));
    }
    Ok(Json(
        service
            .decide(&caller, &key, approve, body.note.as_deref())
            .await?,
    ))
}

/// The action types the token may enqueue, each with the JSON Schema of its payload.
#[utoipa::path(
    get,
    path = "/v1/action-types",
    tag = "actions",
    responses(
        (status = 200, description = "The action types", body = ActionTypes),
        (status = 401, description = "No or bad token", body = ErrorAnswer)
    ),
    security(("bearer" = []))
)]
async fn action_types(
    State(service): State<AppState>,
    caller: Result<Caller, ApiError>,
) -> Result<Json<ActionTypes>, ApiError> {
    let caller = caller?;
    Ok(Json(ActionTypes {
        action_types: service.action_types(&caller),
    }))
}

/// The ops listener: `/healthz` (the process answers), `/readyz` (Postgres and RabbitMQ
/// answer), `/metrics` (Prometheus). No auth: bind it to a private address.
pub fn ops(
    service: AppState,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
) -> axum::Router {
    axum::Router::new()
        .route("/healthz", axum::routing::get(|| async { "ok\n" }))
        .route(
            "/readyz",
            axum::routing::get(move || {
                let service = service.clone();
                async move {
                    match service.ready().await {
                        Ok(()) => (StatusCode::OK, Json(json!({"ready": true}))),
                        Err(e) => (
                            StatusCode::SERVICE_UNAVAILABLE,
                            Json(json!({"ready": false, "reason": e})),
                        ),
                    }
                }
            }),
        )
        .route(
            "/metrics",
            axum::routing::get(move || {
                let h = metrics.clone();
                async move { h.render() }
            }),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_percent_encoded_in_links() {
        assert_eq!(links("v1:ab").self_, "/v1/actions/v1%3Aab");
        assert_eq!(links("v1:ab").wait, "/v1/actions/v1%3Aab?wait=30s");
    }

    #[test]
    fn the_wait_parameter_is_parsed_and_capped() {
        let max = Duration::from_secs(60);
        assert_eq!(wait_param(None, max).expect("none"), None);
        assert_eq!(
            wait_param(Some("wait=1500ms"), max).expect("ms"),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(wait_param(Some("wait=5m"), max).expect("cap"), Some(max));
        assert_eq!(
            wait_param(Some("wait=soon"), max)
                .expect_err("bad")
                .field
                .as_deref(),
            Some("wait")
        );
        assert!(wait_param(Some("watt=1s"), max).is_err());
    }

    #[test]
    fn bearer_tokens_are_read_case_insensitively() {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("bearer abc"),
        );
        assert_eq!(bearer(&h), Some("abc"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic abc"));
        assert_eq!(bearer(&h), None);
    }

    #[test]
    fn the_openapi_document_has_the_routes() {
        let doc = serde_json::to_value(openapi()).expect("json");
        let paths = doc["paths"].as_object().expect("paths");
        let mut names: Vec<&str> = paths.keys().map(String::as_str).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            [
                "/v1/action-types",
                "/v1/actions/{action_type}",
                "/v1/actions/{key}",
                "/v1/actions/{key}/approve",
                "/v1/actions/{key}/cancel",
                "/v1/actions/{key}/reject"
            ]
        );
        assert!(paths["/v1/actions/{action_type}"]["post"]["responses"]["422"].is_object());
    }
}
