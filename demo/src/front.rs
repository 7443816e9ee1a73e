//! The demo's front door: the same kind of mix through the gateway's HTTP API, and an
//! MCP session that calls one tool five times — all of it must end in one effect per key.

use oncely_core::KeyRing;
use oncely_core::config::Config;
use oncely_gateway::tokens::{Tokens, hash_hex};
use oncely_sandbox::http::Conn;
use serde_json::{Value, json};

const TOKEN: &str = "demo-agent-token";

/// What went through the front door.
#[derive(Debug, Default)]
pub struct FrontDoor {
    /// Requests sent over HTTP.
    pub http_requests: usize,
    /// `202` answers: new actions.
    pub accepted: usize,
    /// `200` + `Idempotent-Replayed`: repeats.
    pub replayed: usize,
    /// `422 conflict`.
    pub conflicts: usize,
    /// Anything else.
    pub other: usize,
    /// MCP tool calls made.
    pub mcp_calls: usize,
    /// How many of them answered "queued".
    pub mcp_queued: usize,
    /// The keys the front door created.
    pub keys: Vec<String>,
}

/// Start an in-process gateway; returns its address.
pub async fn start(config: &Config, secret: &KeyRing) -> anyhow::Result<std::net::SocketAddr> {
    let known = config.actions.keys().cloned().collect();
    let tokens = Tokens::parse(
        &format!(
            "[[token]]\nid = \"demo\"\ntenant = \"demo-tenant\"\nsha256 = \"{}\"\n",
            hash_hex(TOKEN)
        ),
        &known,
    )
    .map_err(anyhow::Error::msg)?;
    let service = oncely_gateway::Service::connect(config.clone(), secret.clone(), tokens).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let app =
        oncely_gateway::http::api(service, &oncely_gateway::http::ApiSettings::default(), None);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(addr)
}

/// Send `distinct` actions over HTTP with 20% repeats and 3 conflicts, then an MCP session.
pub async fn run(
    addr: std::net::SocketAddr,
    distinct: usize,
    body: impl Fn(&str, usize, u64) -> Value,
) -> anyhow::Result<FrontDoor> {
    let actions = ["email.send", "ticket.create", "payment_order.create"];
    let mut plan: Vec<(usize, u64)> = (0..distinct).map(|n| (n, 0)).collect();
    plan.extend((0..distinct / 5).map(|n| (n * 5, 0)));
    plan.extend((0..3).map(|n| (n, 1)));
    let mut out = FrontDoor::default();
    let mut http = Conn::connect(addr, Some(TOKEN)).await?;
    for (n, variant) in plan {
        let action = actions[n % 3];
        let a = http
            .post(
                &format!("/v1/actions/{action}"),
                &body(action, n, variant),
                &[],
            )
            .await?;
        out.http_requests += 1;
        match a.status {
            202 => {
                out.accepted += 1;
                out.keys
                    .push(a.json["key"].as_str().unwrap_or_default().to_owned());
            }
            200 => out.replayed += 1,
            422 => out.conflicts += 1,
            _ => out.other += 1,
        }
    }
    mcp_session(&mut http, &mut out, &body).await?;
    Ok(out)
}

/// An MCP session over streamable HTTP (JSON-RPC, the `initialize` handshake): the
/// `email_send` tool called five times with the same arguments, as a model that timed
/// out would.
async fn mcp_session(
    http: &mut Conn,
    out: &mut FrontDoor,
    body: &impl Fn(&str, usize, u64) -> Value,
) -> anyhow::Result<()> {
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "oncely-demo", "version": "1"}}});
    let a = http.post("/mcp", &init, &[]).await?;
    anyhow::ensure!(a.status == 200, "MCP initialize: HTTP {}", a.status);
    let session = a
        .headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .ok_or_else(|| anyhow::anyhow!("MCP initialize: no session id"))?;
    let s = [("mcp-session-id", session.as_str())];
    http.post(
        "/mcp",
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        &s,
    )
    .await?;
    let mut args = body("email.send", 100_000, 0);
    if let Some(o) = args.as_object_mut() {
        o.insert("workflow_id".into(), json!("case-mcp-demo"));
    }
    for id in 1..=5 {
        let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "email_send", "arguments": args}});
        let a = http.post("/mcp", &call, &s).await?;
        anyhow::ensure!(a.status == 200, "MCP tools/call: HTTP {}", a.status);
        out.mcp_calls += 1;
        let result = &a.json["result"];
        if result["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("queued:"))
        {
            out.mcp_queued += 1;
            out.keys.push(
                result["structuredContent"]["key"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            );
        }
    }
    Ok(())
}
