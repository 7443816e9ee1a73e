//! A real `oncely-gateway` process for a [`Fleet`], and a small HTTP client for it.

use crate::fleet::{Fleet, Proc, binary};
use crate::{eventually, free_port, http_get};
use oncely_sandbox::http::Conn;
use serde_json::Value;
use std::time::Duration;

/// One token of the tokens file.
#[derive(Debug, Clone, Copy)]
pub struct TokenSpec {
    /// The token (the tests know it; the file holds its hash).
    pub token: &'static str,
    /// Its tenant.
    pub tenant: &'static str,
    /// Allowed action types (`None`: all).
    pub actions: Option<&'static [&'static str]>,
    /// Its quota: `(per_second, burst)`.
    pub quota: Option<(f64, u32)>,
    /// May approve and reject its tenant's held actions.
    pub approve: bool,
}

/// Tenant `acme` with every action type.
pub const TOKEN_A: TokenSpec = TokenSpec {
    token: "token-acme",
    tenant: "acme",
    actions: None,
    quota: None,
    approve: false,
};
/// Tenant `globex` with every action type.
pub const TOKEN_B: TokenSpec = TokenSpec {
    token: "token-globex",
    tenant: "globex",
    actions: None,
    quota: None,
    approve: false,
};
/// Tenant `acme`, `ticket.create` only.
pub const TOKEN_LIMITED: TokenSpec = TokenSpec {
    token: "token-acme-tickets",
    tenant: "acme",
    actions: Some(&["ticket.create"]),
    quota: None,
    approve: false,
};
/// Tenant `initech`, every action type, at most 2 submits at once and 1 every 10 s.
pub const TOKEN_QUOTA: TokenSpec = TokenSpec {
    token: "token-initech",
    tenant: "initech",
    actions: None,
    quota: Some((0.1, 2)),
    approve: false,
};

/// The payload schema the gateway tests declare for `email.send`.
pub fn email_schema() -> Value {
    serde_json::json!({
        "type": "object",
        "required": ["to", "subject"],
        "properties": {
            "to": {"type": "string", "minLength": 3},
            "subject": {"type": "string"},
            "body": {"type": "string"}
        }
    })
}

/// A config hook: declare [`email_schema`] for `email.send`.
pub fn with_email_schema(config: &mut oncely_core::config::Config) {
    if let Some(p) = config.actions.get_mut("email.send") {
        p.payload_schema = Some(email_schema());
        p.description = Some("Send one email.".into());
    }
}

/// Tenant `acme`, may approve and reject its held actions.
pub const TOKEN_APPROVER: TokenSpec = TokenSpec {
    token: "token-acme-approver",
    tenant: "acme",
    actions: None,
    quota: None,
    approve: true,
};

/// A config hook: [`with_email_schema`], and every `payment_order.create` held for
/// approval (rule `every-payment`, an hour to decide).
pub fn with_held_payments(config: &mut oncely_core::config::Config) {
    with_email_schema(config);
    if let Some(p) = config.actions.get_mut("payment_order.create") {
        p.approval = vec![oncely_core::config::ApprovalRule {
            name: "every-payment".into(),
            when: None,
            first_contact: None,
            four_eyes: None,
            timeout: Duration::from_secs(3600),
        }];
    }
}

/// A running gateway.
#[derive(Debug)]
pub struct Gateway {
    /// The process.
    pub proc: Proc,
    /// The API port.
    pub port: u16,
    /// The ops port.
    pub ops_port: u16,
    /// The tokens file.
    pub tokens_file: std::path::PathBuf,
}

impl Gateway {
    /// Start a gateway for `fleet` with `tokens`; returns once `/readyz` says ready.
    pub async fn start(fleet: &Fleet, tokens: &[TokenSpec]) -> Gateway {
        Self::start_with_env(fleet, tokens, &[]).await
    }

    /// [`Gateway::start`] with extra environment (e.g. `DATABASE_URL` through a proxy).
    pub async fn start_with_env(
        fleet: &Fleet,
        tokens: &[TokenSpec],
        env: &[(&str, &str)],
    ) -> Gateway {
        Self::start_with(fleet, tokens, env, &[]).await
    }

    /// [`Gateway::start_with_env`] with extra `serve` arguments (e.g. the review desk's).
    pub async fn start_with(
        fleet: &Fleet,
        tokens: &[TokenSpec],
        env: &[(&str, &str)],
        extra_args: &[&str],
    ) -> Gateway {
        let tokens_file = write_tokens(fleet, tokens);
        let (port, ops_port) = (free_port(), free_port());
        let (listen, ops) = (format!("127.0.0.1:{port}"), format!("127.0.0.1:{ops_port}"));
        let file = tokens_file.to_string_lossy().into_owned();
        let mut args = vec![
            "serve",
            "--listen",
            &listen,
            "--ops-listen",
            &ops,
            "--tokens-file",
            &file,
            "--max-body-bytes",
            "65536",
        ];
        args.extend_from_slice(extra_args);
        let proc = fleet.spawn_program(&binary("oncely-gateway"), &args, env);
        let gw = Gateway {
            proc,
            port,
            ops_port,
            tokens_file,
        };
        eventually("the gateway is ready", Duration::from_secs(30), || async {
            http_get(ops_port, "/readyz").await.map(|_| ())
        })
        .await;
        gw
    }

    /// A client with one keep-alive connection, sending `token`.
    pub async fn client(&self, token: &str) -> Client {
        Client::connect(self.port, Some(token)).await
    }
}

/// Write a tokens file for `tokens` into the fleet's directory.
pub fn write_tokens(fleet: &Fleet, tokens: &[TokenSpec]) -> std::path::PathBuf {
    let mut text = String::new();
    for (i, t) in tokens.iter().enumerate() {
        text.push_str(&format!(
            "[[token]]\nid = \"t{i}\"\ntenant = \"{}\"\nsha256 = \"{}\"\n",
            t.tenant,
            oncely_gateway::tokens::hash_hex(t.token)
        ));
        if let Some(a) = t.actions {
            text.push_str(&format!("actions = {a:?}\n"));
        }
        if t.approve {
            text.push_str("approve = true\n");
        }
        if let Some((per_second, burst)) = t.quota {
            text.push_str(&format!(
                "quota = {{ per_second = {per_second:?}, burst = {burst} }}\n"
            ));
        }
        text.push('\n');
    }
    let path = fleet.dir.join("tokens.toml");
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("{e}"));
    path
}

/// An answer.
#[derive(Debug)]
pub struct Resp {
    /// Status.
    pub status: u16,
    /// Headers.
    pub headers: axum::http::HeaderMap,
    /// Body as JSON (`Null` when not JSON).
    pub body: Value,
}

impl Resp {
    /// The error code of an error answer.
    pub fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("")
    }
}

/// An HTTP/1.1 client on one connection (the sandbox crate's [`Conn`]).
#[derive(Debug)]
pub struct Client {
    conn: Conn,
}

impl Client {
    /// Connect to `127.0.0.1:port`.
    pub async fn connect(port: u16, token: Option<&str>) -> Client {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let conn = Conn::connect(addr, token)
            .await
            .unwrap_or_else(|e| panic!("connect {port}: {e}"));
        Client { conn }
    }

    /// `POST /v1/actions/{action}` with a JSON body.
    pub async fn submit(&mut self, action: &str, body: &Value) -> Resp {
        self.request(
            "POST",
            &format!("/v1/actions/{action}"),
            &[],
            body.to_string().into_bytes(),
        )
        .await
    }

    /// `POST /v1/actions/{key}/{verb}` (`cancel`, `approve`, `reject`) with a JSON body.
    pub async fn control(&mut self, key: &str, verb: &str, body: &Value) -> Resp {
        let k = key.replace(':', "%3A");
        self.request(
            "POST",
            &format!("/v1/actions/{k}/{verb}"),
            &[],
            body.to_string().into_bytes(),
        )
        .await
    }

    /// `GET path`.
    pub async fn get(&mut self, path: &str) -> Resp {
        self.request("GET", path, &[], Vec::new()).await
    }

    /// `GET /v1/actions/{key}` (with `?wait=…` when given).
    pub async fn action(&mut self, key: &str, wait: Option<&str>) -> Resp {
        let k = key.replace(':', "%3A");
        let path = match wait {
            Some(w) => format!("/v1/actions/{k}?wait={w}"),
            None => format!("/v1/actions/{k}"),
        };
        self.get(&path).await
    }

    /// Any request.
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> Resp {
        let a = self
            .conn
            .request(method, path, headers, body)
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        Resp {
            status: a.status,
            headers: a.headers,
            body: a.json,
        }
    }
}
