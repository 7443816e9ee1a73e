//! The `oncely-gateway` command.

use crate::service::Service;
use crate::tokens::{self, Tokens};
use clap::{Parser, Subcommand};
use oncely_core::KeyRing;
use oncely_core::config::{Config, parse_duration};
use std::io::Read;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The agents' front door: an HTTP API and an MCP tool server in front of oncely.
#[derive(Debug, Parser)]
#[command(
    name = "oncely-gateway",
    version,
    about,
    long_about = "The agents' front door: an HTTP API (POST /v1/actions/{action_type}) and an MCP tool server \
(/mcp, or stdio) in front of oncely. Agents hold a bearer token, never the fleet's HMAC secret.\n\n\
The key secret comes from ONCELY_KEY_SECRETS_FILE (a key ring), ONCELY_KEY_SECRET_FILE (a file) or ONCELY_KEY_SECRET; \
payloads are sealed with ONCELY_DATA_KEYS_FILE's current key when set (docs/security.md); Postgres from DATABASE_URL; \
RabbitMQ from ONCELY_AMQP_URL; the action types (and their payload schemas) from the config. \
See docs/gateway.md and docs/mcp.md."
)]
pub struct Cli {
    /// Config file (TOML); default: the built-in config.
    #[arg(long, global = true, env = "ONCELY_CONFIG")]
    pub config: Option<PathBuf>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the HTTP API and /mcp, and the ops listener (/healthz, /readyz, /metrics).
    Serve(Box<ServeArgs>),
    /// Serve the MCP tools on stdin/stdout for a desktop agent host.
    Mcp {
        /// Speak MCP on stdio (the only transport of this subcommand; /mcp is on `serve`).
        #[arg(long)]
        stdio: bool,
        /// The tokens file.
        #[arg(long, env = "ONCELY_GATEWAY_TOKENS_FILE")]
        tokens_file: PathBuf,
        /// The agent's token (from the environment, so it is not in `ps`).
        #[arg(long = "token-env", default_value = "ONCELY_GATEWAY_TOKEN")]
        token_env: String,
    },
    /// Print the OpenAPI document of the HTTP API for the config's action types (what
    /// `/openapi.json` serves).
    Openapi,
    /// Make and hash tokens for the tokens file.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Make reviewer tokens for the review desk's reviewers file.
    #[command(subcommand)]
    Reviewer(ReviewerCommand),
}

/// `reviewer` subcommands.
#[derive(Debug, Subcommand)]
pub enum ReviewerCommand {
    /// Generate a reviewer token: print it on stdout (give it to the person) and its
    /// reviewers-file entry on stderr (`2>>reviewers.toml` appends it).
    New {
        /// The reviewer's id: recorded as who decided (1..=64 of A-Z a-z 0-9 . _ @ -).
        #[arg(long)]
        id: String,
        /// `decide` (read and decide) or `view` (read only).
        #[arg(long, value_parser = ["decide", "view"])]
        role: String,
        /// A tenant whose reviews this reviewer sees (repeat; none = every tenant).
        #[arg(long = "tenant")]
        tenants: Vec<String>,
    },
}

/// `serve` options.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address of the API (and /mcp).
    #[arg(long, env = "ONCELY_GATEWAY_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Address of /healthz, /readyz and /metrics (no auth: keep it private).
    #[arg(
        long,
        env = "ONCELY_GATEWAY_OPS_LISTEN",
        default_value = "127.0.0.1:9465"
    )]
    pub ops_listen: SocketAddr,
    /// The tokens file (hashed tokens, tenants, allowed action types; see docs/gateway.md).
    #[arg(long, env = "ONCELY_GATEWAY_TOKENS_FILE")]
    pub tokens_file: PathBuf,
    /// Largest request body, in bytes (the API and /mcp).
    #[arg(long, default_value_t = crate::http::DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
    /// Connections the API listener serves at once; more wait in the kernel's backlog.
    #[arg(long, env = "ONCELY_GATEWAY_MAX_CONNECTIONS", default_value_t = 4096)]
    pub max_connections: usize,
    /// Time a client has to send a request's headers, counted from when its connection
    /// is ready for the next request (so also how long a keep-alive connection may idle).
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub header_read_timeout: Duration,
    /// Time to read a /v1 request's body and answer it (a long-poll's `?wait=` is added):
    /// otherwise `408 request_timeout`.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub request_timeout: Duration,
    /// Long-polls (`?wait=`, MCP `action_wait`) one token may have open at once; more
    /// get `429 too_many_waits`.
    #[arg(long, default_value_t = crate::limits::Caps::default().waits_per_token)]
    pub max_waits_per_token: usize,
    /// Long-polls open at once, all tokens together.
    #[arg(long, default_value_t = crate::limits::Caps::default().waits)]
    pub max_waits: usize,
    /// The longest long-poll (`?wait=`, MCP `action_wait`): a longer wait is cut to this.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub max_wait: Duration,
    /// Live MCP sessions per token; more initializations get `429 too_many_sessions`.
    #[arg(long, default_value_t = crate::limits::Caps::default().mcp_sessions_per_token)]
    pub max_mcp_sessions_per_token: usize,
    /// A `Host` name /mcp accepts besides loopback (repeat; e.g. the gateway's public
    /// name). Others are refused with 403 (DNS-rebinding protection of the MCP SDK).
    #[arg(long = "mcp-allowed-host")]
    pub mcp_allowed_hosts: Vec<String>,
    /// How long a client's Idempotency-Key header value is remembered.
    #[arg(long, default_value = "24h", value_parser = parse_duration)]
    pub client_key_ttl: Duration,
    /// Serve the review desk at /desk for the reviewers in this file (hashed tokens with
    /// a role; `oncely-gateway reviewer new` makes entries; see docs/reconcile.md).
    #[arg(long, env = "ONCELY_DESK_REVIEWERS_FILE")]
    pub desk_reviewers_file: Option<PathBuf>,
    /// Postgres URL of the review desk's own pool; its role needs the desk's grants
    /// (`oncely_desk` from `migrate --roles`). Default: DATABASE_URL.
    #[arg(long, env = "ONCELY_DESK_DATABASE_URL", hide_env_values = true)]
    pub desk_database_url: Option<String>,
    /// A file with the key (at least 32 bytes) that signs the desk's session cookies:
    /// give every gateway behind one address the same file. Default: a random key per
    /// process (signed-in reviewers sign in again after a restart).
    #[arg(long, env = "ONCELY_DESK_SESSION_KEY_FILE")]
    pub desk_session_key_file: Option<PathBuf>,
    /// How long a desk session lasts.
    #[arg(long, default_value = "12h", value_parser = parse_duration)]
    pub desk_session_ttl: Duration,
    /// Send the session cookie without `Secure`, for a desk reached over plain HTTP from
    /// a machine other than this one (never in production: serve the desk over HTTPS).
    #[arg(long)]
    pub desk_insecure_cookie: bool,
}

/// `token` subcommands.
#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Generate a token: print it on stdout (give it to the agent) and its tokens-file
    /// entry on stderr (`2>>tokens.toml` appends it).
    New {
        /// The entry's id (for logs).
        #[arg(long)]
        id: String,
        /// The tenant.
        #[arg(long)]
        tenant: String,
        /// An allowed action type (repeat; none = all).
        #[arg(long = "action")]
        actions: Vec<String>,
    },
    /// Read a token on stdin, print its SHA-256 for the tokens file.
    Hash,
}

/// Run; returns the exit code.
pub async fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Openapi => {
            let config = Config::load(cli.config.as_deref())?;
            let types = crate::contract::action_type_infos(&config);
            println!(
                "{}",
                serde_json::to_string_pretty(&crate::contract::document(&types))?
            );
            Ok(0)
        }
        Command::Token(TokenCommand::Hash) => {
            let mut t = String::new();
            std::io::stdin().read_to_string(&mut t)?;
            println!("{}", tokens::hash_hex(t.trim()));
            Ok(0)
        }
        Command::Token(TokenCommand::New {
            id,
            tenant,
            actions,
        }) => {
            let token = tokens::generate()?;
            // stdout: the token alone; stderr: the tokens-file entry, whose other lines are
            // TOML comments, so `2>>tokens.toml` appends a valid entry.
            println!("{token}");
            eprintln!(
                "# token {id:?}: the token was printed on stdout; give it to the agent (it is not stored)"
            );
            let mut entry = format!(
                "[[token]]\nid = {id:?}\ntenant = {tenant:?}\nsha256 = \"{}\"\n",
                tokens::hash_hex(&token)
            );
            if !actions.is_empty() {
                entry.push_str(&format!("actions = {actions:?}\n"));
            }
            eprint!("{entry}");
            Ok(0)
        }
        Command::Reviewer(ReviewerCommand::New { id, role, tenants }) => {
            let token = crate::desk::auth::generate()?;
            let mut entry = format!(
                "[[reviewer]]\nid = {id:?}\nsha256 = \"{}\"\nrole = {role:?}\n",
                tokens::hash_hex(&token)
            );
            if !tenants.is_empty() {
                entry.push_str(&format!("tenants = {tenants:?}\n"));
            }
            // Check the entry as the gateway will read it, before anyone relies on it.
            crate::desk::auth::Reviewers::parse(&entry).map_err(anyhow::Error::msg)?;
            println!("{token}");
            eprintln!(
                "# reviewer {id:?}: the token was printed on stdout; give it to the person (it is not stored)"
            );
            eprint!("{entry}");
            Ok(0)
        }
        Command::Mcp {
            stdio,
            tokens_file,
            token_env,
        } => {
            // stdout is the MCP channel: logs go to stderr (telemetry::init writes there).
            oncely_core::telemetry::init_quieting("warn", &["rmcp"]);
            if !stdio {
                anyhow::bail!(
                    "`oncely-gateway mcp` serves stdio only: pass --stdio (the HTTP transport is /mcp on `oncely-gateway serve`)"
                );
            }
            let config = Config::load(cli.config.as_deref())?;
            let tokens = load_tokens(&config, &tokens_file)?;
            let token = std::env::var(&token_env)
                .map_err(|_| anyhow::anyhow!("set {token_env} to the agent's gateway token"))?;
            let caller = tokens.authenticate(&token).ok_or_else(|| {
                anyhow::anyhow!(
                    "the token in {token_env} is not in {}",
                    tokens_file.display()
                )
            })?;
            let service = Service::connect(config, secret()?, tokens).await?;
            crate::mcp::serve_stdio(service, caller).await?;
            Ok(0)
        }
        Command::Serve(args) => serve(cli.config, *args).await,
    }
}

fn secret() -> anyhow::Result<KeyRing> {
    KeyRing::from_env().map_err(|e| anyhow::anyhow!("{e}"))
}

fn load_tokens(config: &Config, path: &std::path::Path) -> anyhow::Result<Tokens> {
    let known = config.actions.keys().cloned().collect();
    Ok(Tokens::load(path, &known)?)
}

async fn serve(config_path: Option<PathBuf>, args: ServeArgs) -> anyhow::Result<i32> {
    // rmcp logs whole JSON-RPC messages (tool arguments: payloads) at debug and trace.
    oncely_core::telemetry::init_quieting("info", &["rmcp"]);
    let metrics = oncely_core::metrics::install_handle().map_err(anyhow::Error::msg)?;
    let config = Config::load(config_path.as_deref())?;
    let tokens = load_tokens(&config, &args.tokens_file)?;
    let desk = match &args.desk_reviewers_file {
        None => None,
        Some(path) => Some(connect_desk(&config, &args, path).await?),
    };
    let service = Service::connect(config, secret()?, tokens).await?;
    let api = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", args.listen))?;
    let ops = tokio::net::TcpListener::bind(args.ops_listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", args.ops_listen))?;
    tracing::info!(listen = %api.local_addr()?, ops = %ops.local_addr()?, desk = desk.is_some(), "gateway ready");
    expire_client_keys(service.clone(), args.client_key_ttl);
    let ops_app = crate::http::ops(service.clone(), metrics);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(ops, ops_app).await {
            tracing::error!(error = %e, "ops listener stopped");
        }
    });
    let settings = crate::http::ApiSettings {
        max_body_bytes: args.max_body_bytes,
        request_timeout: args.request_timeout,
        mcp_hosts: args.mcp_allowed_hosts.clone(),
        caps: crate::limits::Caps {
            waits_per_token: args.max_waits_per_token,
            waits: args.max_waits,
            mcp_sessions_per_token: args.max_mcp_sessions_per_token,
            max_wait: args.max_wait,
        },
    };
    let app = crate::http::api(service, &settings, desk);
    let limits = crate::listener::Limits {
        max_connections: args.max_connections,
        header_read_timeout: args.header_read_timeout,
    };
    crate::listener::serve(api, app, limits, shutdown()).await;
    Ok(0)
}

/// The review desk, from `serve`'s options.
async fn connect_desk(
    config: &Config,
    args: &ServeArgs,
    reviewers_file: &std::path::Path,
) -> anyhow::Result<std::sync::Arc<crate::desk::Desk>> {
    use crate::desk::auth::{Reviewers, Sessions};
    let reviewers = Reviewers::load(reviewers_file).map_err(anyhow::Error::msg)?;
    let sessions = match &args.desk_session_key_file {
        Some(path) => {
            let key = std::fs::read(path)
                .map_err(|e| anyhow::anyhow!("desk session key file {}: {e}", path.display()))?;
            Sessions::new(key, args.desk_session_ttl)
                .map_err(|e| anyhow::anyhow!("desk session key file {}: {e}", path.display()))?
        }
        None => Sessions::random(args.desk_session_ttl)?,
    };
    let database_url = args
        .desk_database_url
        .clone()
        .unwrap_or_else(|| config.database_url.clone());
    crate::desk::Desk::connect(
        config,
        crate::desk::DeskSettings {
            database_url,
            reviewers,
            sessions,
            secure_cookie: !args.desk_insecure_cookie,
        },
    )
    .await
}

/// Delete old Idempotency-Key rows every minute.
fn expire_client_keys(service: std::sync::Arc<Service>, ttl: Duration) {
    tokio::spawn(async move {
        loop {
            let pool = service.producer().await.journal().db().clone();
            match crate::client_keys::expire(&pool, ttl).await {
                Ok(n) if n > 0 => tracing::info!(deleted = n, "expired Idempotency-Key values"),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "could not expire Idempotency-Key values"),
            }
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
    });
}

async fn shutdown() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
    tracing::info!("shutting down");
}
