//! The `oncely-worker` command: migrate, run workers and reconcilers, admin.

use crate::context::Context;
use crate::shutdown::Shutdown;
use clap::{Parser, Subcommand};
use oncely_core::KeySecret;
use oncely_core::config::Config;
use oncely_core::db::{self, PoolSettings};
use oncely_core::journal::Journal;
use std::net::SocketAddr;
use std::path::PathBuf;

/// oncely workers: execute AI agents' actions once, settle the unknowns.
#[derive(Debug, Parser)]
#[command(
    name = "oncely-worker",
    version,
    about,
    long_about = "oncely workers: execute AI agents' actions once, settle the unknowns.\n\n\
Postgres comes from DATABASE_URL (or `database_url` in the config), RabbitMQ from ONCELY_AMQP_URL, the key secret from \
ONCELY_KEY_SECRET_FILE or ONCELY_KEY_SECRET (without it, keys are checked for format only). Logs: RUST_LOG, ONCELY_LOG_FORMAT=json|pretty."
)]
pub struct Cli {
    /// Config file (TOML); default: the built-in config (sandbox providers on localhost:8085).
    #[arg(long, global = true, env = "ONCELY_CONFIG")]
    pub config: Option<PathBuf>,
    /// Serve Prometheus metrics on this address (e.g. 0.0.0.0:9464); off when absent.
    #[arg(long, global = true, env = "ONCELY_METRICS_ADDR")]
    pub metrics_addr: Option<SocketAddr>,
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create the database if missing and apply migrations, then exit.
    Migrate,
    /// Run an action worker: consume, claim, call providers, commit, ack. Stops on SIGTERM/SIGINT.
    Run {
        /// Only these action types (repeatable); default: every configured one.
        #[arg(long = "action")]
        actions: Vec<String>,
    },
    /// Run a reconciler (with the sweeper): settle unknown outcomes by asking providers
    /// first, open reviews when nobody can tell, heal lost messages. Several may run.
    Reconcile,
    /// Inspect operations, resolve reviews, purge (tables; `--json` for scripts).
    #[command(subcommand)]
    Admin(crate::admin::AdminCommand),
}

/// Load the config, restricted to `only` action types when given.
pub fn load_config(path: Option<&std::path::Path>, only: &[String]) -> anyhow::Result<Config> {
    let mut config = Config::load(path)?;
    if !only.is_empty() {
        for a in only {
            if !config.actions.contains_key(a) {
                anyhow::bail!(
                    "--action {a}: not configured (configured: {})",
                    config
                        .actions
                        .keys()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
        }
        config.actions.retain(|k, _| only.contains(k));
    }
    Ok(config)
}

/// Connect, check that the database is at this binary's schema version (only `migrate`
/// changes it), and build a process context.
pub async fn context(config: Config, role: &str) -> anyhow::Result<Context> {
    let settings = PoolSettings {
        max_connections: config.worker.db_connections,
        ..PoolSettings::default()
    };
    // The database may be starting: retry for a while rather than exit on the first
    // hiccup.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let pool = loop {
        match db::connect_checked(&config.database_url, &settings).await {
            Ok(pool) => break pool,
            // A bad URL, TLS settings or certificate, or a schema at another version will
            // not fix itself in a minute: fail at once.
            Err(
                e @ (db::DbError::BadUrl(_)
                | db::DbError::Schema { .. }
                | db::DbError::TlsSettings { .. }
                | db::DbError::Tls { .. }),
            ) => return Err(e.into()),
            Err(e) if std::time::Instant::now() < deadline => {
                tracing::warn!(error = %e, "database not ready; retrying");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            Err(e) => return Err(e.into()),
        }
    };
    let secret = match KeySecret::from_env() {
        Ok(s) => Some(s),
        Err(oncely_core::keys::KeyError::MissingSecret) => {
            tracing::warn!(
                "no key secret: idempotency keys are checked for format only, not recomputed"
            );
            None
        }
        Err(e) => return Err(e.into()),
    };
    Context::new(config, Journal::new(pool), secret, role)
}

/// Run the CLI.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Migrate => {
            let config = Config::load(cli.config.as_deref())?;
            let created = db::create_if_missing(&config.database_url).await?;
            let pool = db::connect(
                &config.database_url,
                &PoolSettings {
                    max_connections: 1,
                    ..PoolSettings::default()
                },
            )
            .await?;
            db::migrate(&pool, &config.database_url).await?;
            println!(
                "{} {} migrated",
                if created { "created and" } else { "database" },
                db::describe(&config.database_url)
            );
            Ok(())
        }
        Command::Run { actions } => {
            oncely_core::metrics::install(cli.metrics_addr).map_err(anyhow::Error::msg)?;
            let config = load_config(cli.config.as_deref(), &actions)?;
            let ctx = context(config, "worker").await?;
            oncely_core::metrics::init_series(&ctx.action_types());
            crate::runner::run(ctx, Shutdown::on_signals()).await
        }
        Command::Reconcile => {
            oncely_core::metrics::install(cli.metrics_addr).map_err(anyhow::Error::msg)?;
            let config = load_config(cli.config.as_deref(), &[])?;
            let ctx = context(config, "reconciler").await?;
            oncely_core::metrics::init_series(&ctx.action_types());
            crate::reconciler::run(ctx, Shutdown::on_signals()).await
        }
        Command::Admin(cmd) => {
            let config = Config::load(cli.config.as_deref())?;
            let code = crate::admin::run(&config, cmd).await?;
            if code != 0 {
                std::process::exit(code);
            }
            Ok(())
        }
    }
}
