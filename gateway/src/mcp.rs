//! MCP (Model Context Protocol) front end of the gateway, built on the official
//! Rust SDK `rmcp`.
//!
//! Every action type the caller may use becomes one tool (named
//! [`ActionTypeInfo::tool`]), plus the two built-in tools `action_status` and
//! `action_wait`. Tools are computed per caller, so [`OncelyMcp`] implements
//! [`ServerHandler::list_tools`] / [`ServerHandler::call_tool`] by hand instead
//! of using rmcp's `#[tool]` macros.
//!
//! Two transports:
//! * Streamable HTTP: [`router`] returns an axum `Router` serving [`MCP_PATH`]
//!   (`/mcp`), guarded by the same bearer tokens as the REST API (401 before any
//!   MCP handling). The middleware stores the resolved [`Caller`] in the HTTP
//!   request extensions; rmcp copies the request's `http::request::Parts` into
//!   the MCP `RequestContext::extensions` of *every* JSON-RPC request (stateful
//!   session or not), and the handler reads the `Caller` from there. The caller
//!   is therefore resolved per HTTP request, never per session.
//! * stdio: [`serve_stdio`] with a fixed caller resolved at start-up.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header, request::Parts};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock,
    Implementation, JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities,
    ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Map, Value, json};

use crate::service::{
    ActionRequest, ActionTypeInfo, ActionView, ApiError, Caller, Service, Submitted,
};

/// Path at which [`router`] serves the MCP endpoint.
pub const MCP_PATH: &str = "/mcp";

/// Name of the built-in status tool.
pub const TOOL_STATUS: &str = "action_status";
/// Name of the built-in wait tool.
pub const TOOL_WAIT: &str = "action_wait";
/// Name of the built-in cancel tool.
pub const TOOL_CANCEL: &str = "action_cancel";

/// Default `timeout_seconds` of `action_wait`.
const WAIT_DEFAULT_SECS: f64 = 30.0;
/// Maximum `timeout_seconds` of `action_wait` (larger values are clamped).
const WAIT_MAX_SECS: f64 = 60.0;

const INSTRUCTIONS: &str = "oncely runs side effects (emails, payments, ...) exactly once. \
Each action tool takes an identity (workflow_id, step, business_object, revision) and a payload. \
Repeating a call with the same identity and payload never runs the action twice; it returns the \
earlier outcome. Action tools return a key at once; call action_wait with it to get the result. \
Some actions are held for approval by a person before anything is sent: then action_wait returns once \
a person decided and it ran (or was rejected). action_cancel stops an action that has not started.";

/// The MCP server handler.
///
/// For HTTP one instance is built per session by rmcp; it holds no caller and
/// reads it from each request. For stdio it holds the fixed caller.
#[derive(Debug, Clone)]
pub struct OncelyMcp {
    service: Arc<Service>,
    fixed_caller: Option<Caller>,
}

impl OncelyMcp {
    /// Handler for the HTTP transport: the caller comes from each request.
    pub fn http(service: Arc<Service>) -> Self {
        Self {
            service,
            fixed_caller: None,
        }
    }

    /// Handler with a fixed caller (stdio).
    pub fn with_caller(service: Arc<Service>, caller: Caller) -> Self {
        Self {
            service,
            fixed_caller: Some(caller),
        }
    }

    /// The caller of this request: the fixed one (stdio), else the one the
    /// auth middleware put into the HTTP request extensions, else (defence in
    /// depth, if mounted without the middleware) the request's bearer token.
    fn caller(&self, ctx: &RequestContext<RoleServer>) -> Result<Caller, McpError> {
        if let Some(caller) = &self.fixed_caller {
            return Ok(caller.clone());
        }
        let parts = ctx.extensions.get::<Parts>();
        parts
            .and_then(|p| p.extensions.get::<Caller>().cloned())
            .or_else(|| {
                parts
                    .and_then(|p| crate::http::bearer(&p.headers))
                    .and_then(|t| self.service.authenticate(t))
            })
            .ok_or_else(|| McpError::invalid_request("not authenticated", None))
    }

    fn action_types(&self, caller: &Caller) -> Vec<ActionTypeInfo> {
        self.service
            .action_types(caller)
            .into_iter()
            .filter(|t| {
                let builtin = [TOOL_STATUS, TOOL_WAIT, TOOL_CANCEL].contains(&t.tool.as_str());
                if builtin {
                    tracing::warn!(action_type = %t.name, tool = %t.tool, "action type tool name collides with a built-in tool; not offered over MCP");
                }
                !builtin
            })
            .collect()
    }

    async fn run_action(
        &self,
        caller: &Caller,
        info: &ActionTypeInfo,
        args: &JsonObject,
    ) -> CallToolResult {
        let req = match parse_action_args(args) {
            Ok(req) => req,
            Err(e) => return api_error_result(&e),
        };
        match self.service.submit(caller, &info.name, req, None).await {
            Ok(Submitted::Enqueued { key, status }) => {
                tracing::info!(tenant = %caller.tenant, token = %caller.token_id, action_type = %info.name, %key, %status, "mcp: enqueued");
                let (text, outcome) = match status {
                    oncely_core::Status::AwaitingApproval => (
                        format!(
                            "held for approval by a person: nothing is sent until it is approved. key: {key}; \
                             call {TOOL_WAIT} with this key: it returns when a person decided and the action ran \
                             (or was rejected). Do not ask again: asking again changes nothing."
                        ),
                        "awaiting_approval",
                    ),
                    oncely_core::Status::Deferred => (
                        format!(
                            "scheduled: recorded now, it will run once at its not_before time. key: {key}; \
                             call {TOOL_WAIT} with this key later for the result"
                        ),
                        "scheduled",
                    ),
                    _ => (
                        format!(
                            "queued: this action will run once. key: {key}; call {TOOL_WAIT} with this key for the result"
                        ),
                        "queued",
                    ),
                };
                ok_result(
                    text,
                    json!({"outcome": outcome, "key": key, "status": status}),
                )
            }
            Ok(Submitted::Duplicate { view }) => ok_result(
                format!(
                    "already requested earlier (not run again). key: {}; {}",
                    view.key,
                    describe(&view)
                ),
                json!({"outcome": "duplicate", "action": view}),
            ),
            Ok(Submitted::Conflict { key }) => error_result(
                format!(
                    "refused: the same action (same workflow_id/step/business_object/revision) was already \
                     requested with different content; nothing was executed. key: {key}. If you really mean a \
                     new, different action for the same business object, increase revision."
                ),
                json!({"outcome": "conflict", "key": key}),
            ),
            Err(e) => api_error_result(&e),
        }
    }

    async fn run_cancel(&self, caller: &Caller, args: &JsonObject) -> CallToolResult {
        let key = match required_str(args, "key") {
            Ok(k) => k,
            Err(e) => return api_error_result(&e),
        };
        match self.service.cancel(caller, &key).await {
            Ok((true, view)) => ok_result(
                format!("cancelled: it will never be sent. key: {}", view.key),
                json!({"outcome": "cancelled", "action": view}),
            ),
            Ok((false, view)) => error_result(
                format!(
                    "too late to cancel: the action is {} — it may run or have run. key: {}; {}",
                    view.status,
                    view.key,
                    describe(&view)
                ),
                json!({"outcome": "too_late", "action": view}),
            ),
            Err(e) => api_error_result(&e),
        }
    }

    async fn run_status(&self, caller: &Caller, args: &JsonObject) -> CallToolResult {
        let key = match required_str(args, "key") {
            Ok(k) => k,
            Err(e) => return api_error_result(&e),
        };
        match self.service.status(caller, &key).await {
            Ok(view) => view_result(&view),
            Err(e) => api_error_result(&e),
        }
    }

    async fn run_wait(
        &self,
        caller: &Caller,
        args: &JsonObject,
        ctx: &RequestContext<RoleServer>,
    ) -> CallToolResult {
        let key = match required_str(args, "key") {
            Ok(k) => k,
            Err(e) => return api_error_result(&e),
        };
        let secs = match args.get("timeout_seconds") {
            None | Some(Value::Null) => WAIT_DEFAULT_SECS,
            Some(v) => match v.as_f64() {
                Some(s) if s >= 0.0 => s.min(WAIT_MAX_SECS),
                _ => {
                    return api_error_result(&schema_violation(
                        "/timeout_seconds",
                        "timeout_seconds must be a non-negative number (max 60)",
                    ));
                }
            },
        };
        let wait = self
            .service
            .wait(caller, &key, Duration::from_secs_f64(secs));
        let res = tokio::select! {
            res = wait => res,
            () = ctx.ct.cancelled() => return error_result("cancelled by the client".to_owned(), json!({"outcome": "cancelled"})),
        };
        match res {
            Ok(view) if view.terminal => view_result(&view),
            Ok(view) => ok_result(
                format!(
                    "not finished yet after {secs:.0}s. key: {}; {}. Call {TOOL_WAIT} again with the same key.",
                    view.key,
                    describe(&view)
                ),
                json!({"outcome": "pending", "action": view}),
            ),
            Err(e) => api_error_result(&e),
        }
    }
}

impl ServerHandler for OncelyMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("oncely", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let caller = self.caller(&ctx)?;
        let mut tools: Vec<Tool> = self.action_types(&caller).iter().map(action_tool).collect();
        tools.push(status_tool());
        tools.push(wait_tool());
        tools.push(cancel_tool());
        // The list depends on the caller: never let it be cached for others.
        Ok(ListToolsResult::with_all_items(tools).with_cache_scope(CacheScope::Private))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let caller = self.caller(&ctx)?;
        let args = request.arguments.unwrap_or_default();
        let name = request.name.as_ref();
        let result = match name {
            TOOL_STATUS => self.run_status(&caller, &args).await,
            TOOL_WAIT => self.run_wait(&caller, &args, &ctx).await,
            TOOL_CANCEL => self.run_cancel(&caller, &args).await,
            _ => {
                let Some(info) = self
                    .action_types(&caller)
                    .into_iter()
                    .find(|t| t.tool == name)
                else {
                    // MCP spec: unknown tool is a JSON-RPC error -32602.
                    return Err(McpError::invalid_params(
                        format!("Unknown tool: {name}"),
                        None,
                    ));
                };
                self.run_action(&caller, &info, &args).await
            }
        };
        Ok(result.into())
    }
}

/// The MCP endpoint as an axum router serving [`MCP_PATH`], with bearer auth.
///
/// Merge it into the gateway's router: `app.merge(mcp::router(service))`.
/// Uses rmcp's default config, whose DNS-rebinding protection accepts only
/// loopback `Host` headers; use [`router_with_config`] in deployments.
pub fn router(service: Arc<Service>) -> axum::Router {
    router_with_config(
        service,
        StreamableHttpServerConfig::default(),
        crate::limits::Caps::default().mcp_sessions_per_token,
    )
}

/// [`router`] with rmcp's config (allowed hosts, body limit) and at most
/// `sessions_per_token` live MCP sessions per token (`429 too_many_sessions` beyond).
pub fn router_with_config(
    service: Arc<Service>,
    config: StreamableHttpServerConfig,
    sessions_per_token: usize,
) -> axum::Router {
    let factory_service = service.clone();
    let manager = Arc::new(LocalSessionManager::default());
    let cap = Arc::new(SessionCap {
        manager: manager.clone(),
        max: sessions_per_token,
        per_token: std::sync::Mutex::new(std::collections::HashMap::new()),
    });
    let mcp = StreamableHttpService::new(
        move || Ok(OncelyMcp::http(factory_service.clone())),
        manager,
        config,
    );
    axum::Router::new()
        .route_service(MCP_PATH, mcp)
        .layer(middleware::from_fn_with_state(cap, cap_sessions))
        .layer(middleware::from_fn_with_state(service, require_bearer))
}

/// Live MCP sessions per token: ids seen in `Mcp-Session-Id` answers, pruned of those
/// the session manager no longer has (closed, or idle past rmcp's keep-alive), plus
/// initializations in flight (so a burst of them cannot slip past the cap).
struct SessionCap {
    manager: Arc<LocalSessionManager>,
    max: usize,
    per_token: std::sync::Mutex<std::collections::HashMap<String, TokenSessions>>,
}

#[derive(Default)]
struct TokenSessions {
    ids: Vec<Arc<str>>,
    starting: usize,
}

impl SessionCap {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, TokenSessions>> {
        self.per_token.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A request without `Mcp-Session-Id` starts a session: refused with 429 when the token
/// has `max` alive already.
async fn cap_sessions(State(cap): State<Arc<SessionCap>>, req: Request, next: Next) -> Response {
    use rmcp::transport::streamable_http_server::session::SessionManager;
    const SESSION_HEADER: &str = "mcp-session-id";
    if req.method() != axum::http::Method::POST || req.headers().contains_key(SESSION_HEADER) {
        return next.run(req).await;
    }
    let Some(token) = req.extensions().get::<Caller>().map(|c| c.token_id.clone()) else {
        return next.run(req).await;
    };
    let known = cap
        .lock()
        .get(&token)
        .map(|t| t.ids.clone())
        .unwrap_or_default();
    let mut alive = Vec::with_capacity(known.len());
    for id in known {
        if cap.manager.has_session(&id).await.unwrap_or(false) {
            alive.push(id);
        }
    }
    {
        let mut map = cap.lock();
        let entry = map.entry(token.clone()).or_default();
        entry.ids.retain(|id| alive.contains(id));
        if entry.ids.len() + entry.starting >= cap.max {
            let max = cap.max;
            drop(map);
            return (
                StatusCode::TOO_MANY_REQUESTS,
                [(header::RETRY_AFTER, "5")],
                axum::Json(json!({"error": {"code": "too_many_sessions", "message": format!(
                    "this token has {max} MCP sessions open already: reuse one, or end one (DELETE /mcp with its Mcp-Session-Id)"
                )}})),
            )
                .into_response();
        }
        entry.starting += 1;
    }
    let response = next.run(req).await;
    let id = response
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(std::sync::Arc::<str>::from);
    let mut map = cap.lock();
    let entry = map.entry(token).or_default();
    entry.starting = entry.starting.saturating_sub(1);
    if let Some(id) = id {
        entry.ids.push(id);
    }
    response
}

/// Serve MCP over stdin/stdout for `caller` until the client disconnects.
pub async fn serve_stdio(service: Arc<Service>, caller: Caller) -> anyhow::Result<()> {
    let running = OncelyMcp::with_caller(service, caller)
        .serve(rmcp::transport::stdio())
        .await?;
    running.waiting().await?;
    Ok(())
}

/// axum middleware: 401 unless `Authorization: Bearer <valid token>`; on
/// success the [`Caller`] is added to the request extensions.
async fn require_bearer(
    State(service): State<Arc<Service>>,
    mut req: Request,
    next: Next,
) -> Response {
    match crate::http::bearer(req.headers()).and_then(|t| service.authenticate(t)) {
        Some(caller) => {
            req.extensions_mut().insert(caller);
            next.run(req).await
        }
        None => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "missing or invalid bearer token",
        )
            .into_response(),
    }
}

// ---- tool definitions -------------------------------------------------------

fn object_schema(value: Value) -> Arc<JsonObject> {
    match value {
        Value::Object(map) => Arc::new(map),
        _ => Arc::new(Map::new()),
    }
}

fn action_tool(info: &ActionTypeInfo) -> Tool {
    let description = format!(
        "{desc}\n\nRuns the action `{name}` exactly once. Identify it with workflow_id (the conversation's or \
         case's stable id), step (the plan step that decided this, stable across retries), business_object \
         (what it acts on) and revision (default 1). Calling again with the same identity and payload is safe: \
         nothing runs again and you get the earlier outcome. The same identity with a different payload is \
         refused; to deliberately act again on the same business object, increase revision. Returns a key \
         immediately; call {TOOL_WAIT} with it for the result.",
        desc = info.description.trim_end(),
        name = info.name,
    );
    let schema = json!({
        "type": "object",
        "properties": {
            "workflow_id": {
                "type": "string",
                "minLength": 1,
                "description": "The conversation's or case's stable id, never a run id or timestamp."
            },
            "step": {
                "type": "string",
                "minLength": 1,
                "description": "The plan step that decided this action, stable across retries (e.g. 'notify-customer')."
            },
            "business_object": {
                "type": "string",
                "minLength": 1,
                "description": "The business object the action is about (e.g. 'invoice:INV-42', 'customer:c_17')."
            },
            "revision": {
                "type": "integer",
                "minimum": 1,
                "default": 1,
                "description": "1 unless you deliberately want to perform this action again for the same business object; then increase it."
            },
            "payload": info.payload_schema,
            "not_before": {
                "type": "string",
                "format": "date-time",
                "description": "Optional: run no earlier than this time (RFC 3339, e.g. 2026-12-08T09:00:00Z)."
            },
            "expires_at": {
                "type": "string",
                "format": "date-time",
                "description": "Optional: if it has not started by this time (RFC 3339), it is never sent (status expired)."
            },
        },
        "required": ["workflow_id", "step", "business_object", "payload"],
        "additionalProperties": false
    });
    Tool::new(info.tool.clone(), description, object_schema(schema)).with_annotations(
        ToolAnnotations::new()
            .read_only(false)
            .destructive(true)
            .idempotent(true)
            .open_world(true),
    )
}

fn status_tool() -> Tool {
    let schema = json!({
        "type": "object",
        "properties": {
            "key": {"type": "string", "description": "The key returned when the action was requested."}
        },
        "required": ["key"],
        "additionalProperties": false
    });
    Tool::new(
        TOOL_STATUS,
        "Current status of an action requested earlier (does not wait).",
        object_schema(schema),
    )
    .with_annotations(ToolAnnotations::new().read_only(true).open_world(false))
}

fn cancel_tool() -> Tool {
    let schema = json!({
        "type": "object",
        "properties": {
            "key": {"type": "string", "description": "The key returned when the action was requested."}
        },
        "required": ["key"],
        "additionalProperties": false
    });
    Tool::new(
        TOOL_CANCEL,
        "Cancel an action requested earlier, if it has not started: the answer is either 'cancelled' (it will \
         never be sent) or 'too late' (it is running or finished; the status says which). Always true.",
        object_schema(schema),
    )
    .with_annotations(
        ToolAnnotations::new()
            .read_only(false)
            .destructive(false)
            .idempotent(true)
            .open_world(false),
    )
}

fn wait_tool() -> Tool {
    let schema = json!({
        "type": "object",
        "properties": {
            "key": {"type": "string", "description": "The key returned when the action was requested."},
            "timeout_seconds": {
                "type": "integer", "minimum": 0, "maximum": 60, "default": 30,
                "description": "How long to wait at most (default 30, max 60)."
            }
        },
        "required": ["key"],
        "additionalProperties": false
    });
    Tool::new(
        TOOL_WAIT,
        "Wait until an action requested earlier has finished (or the timeout passes) and return its status and result.",
        object_schema(schema),
    )
    .with_annotations(ToolAnnotations::new().read_only(true).open_world(false))
}

// ---- argument parsing --------------------------------------------------------

fn schema_violation(field: &str, message: impl Into<String>) -> ApiError {
    let mut e = ApiError::new(400, "schema_violation", message);
    e.field = Some(field.to_owned());
    e
}

fn required_str(args: &JsonObject, name: &str) -> Result<String, ApiError> {
    match args.get(name) {
        Some(Value::String(s)) if !s.trim().is_empty() => Ok(s.clone()),
        Some(Value::String(_)) => Err(schema_violation(
            &format!("/{name}"),
            format!("{name} must not be empty"),
        )),
        Some(_) => Err(schema_violation(
            &format!("/{name}"),
            format!("{name} must be a string"),
        )),
        None => Err(schema_violation(
            &format!("/{name}"),
            format!("missing required argument {name}"),
        )),
    }
}

fn parse_action_args(args: &JsonObject) -> Result<ActionRequest, ApiError> {
    if let Some(extra) = args
        .keys()
        .find(|k| !crate::contract::BODY_FIELDS.contains(&k.as_str()))
    {
        return Err(schema_violation(
            &format!("/{extra}"),
            format!(
                "unknown argument {extra}; allowed: workflow_id, step, business_object, revision, payload, \
                 not_before, expires_at \
                 (action fields go inside payload)"
            ),
        ));
    }
    let revision = match args.get("revision") {
        None | Some(Value::Null) => 1,
        Some(v) => v
            .as_i64()
            .filter(|r| *r >= 1)
            .ok_or_else(|| schema_violation("/revision", "revision must be an integer >= 1"))?,
    };
    let payload = match args.get("payload") {
        Some(p @ Value::Object(_)) => p.clone(),
        Some(_) => return Err(schema_violation("/payload", "payload must be an object")),
        None => {
            return Err(schema_violation(
                "/payload",
                "missing required argument payload",
            ));
        }
    };
    let time = |name: &str| match args.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(schema_violation(
            &format!("/{name}"),
            format!("{name} must be an RFC 3339 time string"),
        )),
    };
    Ok(ActionRequest {
        workflow_id: required_str(args, "workflow_id")?,
        step: required_str(args, "step")?,
        business_object: required_str(args, "business_object")?,
        revision,
        payload,
        not_before: time("not_before")?,
        expires_at: time("expires_at")?,
    })
}

// ---- results -------------------------------------------------------------------

fn ok_result(text: String, structured: Value) -> CallToolResult {
    let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
    r.structured_content = Some(structured);
    r
}

fn error_result(text: String, structured: Value) -> CallToolResult {
    let mut r = CallToolResult::error(vec![ContentBlock::text(text)]);
    r.structured_content = Some(structured);
    r
}

fn api_error_result(e: &ApiError) -> CallToolResult {
    if let (429, Some(secs)) = (e.status, e.retry_after) {
        return error_result(
            format!(
                "rate limited, try again in {secs} s (nothing was recorded: call the tool again then, with the same arguments)"
            ),
            json!({"outcome": "error", "error": {"status": 429, "code": e.code, "message": e.message, "retry_after": secs}}),
        );
    }
    let field = e
        .field
        .as_deref()
        .map(|f| format!(" (field {f})"))
        .unwrap_or_default();
    error_result(
        format!("error {}: {}{field}", e.code, e.message),
        json!({"outcome": "error", "error": {"status": e.status, "code": e.code, "message": e.message, "field": e.field}}),
    )
}

fn describe(view: &ActionView) -> String {
    let mut s = format!("status: {}", view.status);
    match view.status.as_str() {
        "awaiting_approval" => s.push_str(" (held for approval by a person; nothing sent yet)"),
        "rejected" => s.push_str(" (a person rejected it, or nobody decided in time: never sent)"),
        "cancelled" => s.push_str(" (cancelled: never sent)"),
        "expired" => s.push_str(" (not started before its deadline: never sent)"),
        _ => {}
    }
    match &view.result {
        Some(r) => s.push_str(&format!(", result: {r}")),
        None if !view.terminal => s.push_str(", result: not available yet"),
        None => {}
    }
    if let Some(code) = &view.error_code {
        s.push_str(&format!(", error_code: {code}"));
    }
    s
}

fn view_result(view: &ActionView) -> CallToolResult {
    let text = format!(
        "key: {}; action_type: {}; {}; attempt: {}",
        view.key,
        view.action_type,
        describe(view),
        view.attempt
    );
    ok_result(
        text,
        json!({"outcome": if view.terminal { "finished" } else { "pending" }, "action": view}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_parsing() {
        let mut h = axum::http::HeaderMap::new();
        assert_eq!(crate::http::bearer(&h), None);
        h.insert(header::AUTHORIZATION, "Bearer abc".parse().expect("header"));
        assert_eq!(crate::http::bearer(&h), Some("abc"));
        h.insert(header::AUTHORIZATION, "basic abc".parse().expect("header"));
        assert_eq!(crate::http::bearer(&h), None);
    }

    #[test]
    fn revision_defaults_to_one_and_unknown_args_rejected() {
        let args = json!({"workflow_id": "w", "step": "s", "business_object": "b", "payload": {}});
        let Value::Object(args) = args else { panic!() };
        assert_eq!(parse_action_args(&args).expect("ok").revision, 1);
        let mut extra = args.clone();
        extra.insert("to".into(), json!("x"));
        assert_eq!(
            parse_action_args(&extra).expect_err("err").field.as_deref(),
            Some("/to")
        );
    }
}
