//! The `oncely-worker` command: migrate, run workers and reconcilers, admin.

use crate::context::Context;
use crate::shutdown::Shutdown;
use clap::{Parser, Subcommand};
use oncely_core::KeyRing;
use oncely_core::config::Config;
use oncely_core::db::{self, PoolSettings};
use oncely_core::journal::Journal;
use oncely_core::roles::{self, Process};
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
ONCELY_KEY_SECRETS_FILE (a key ring), ONCELY_KEY_SECRET_FILE or ONCELY_KEY_SECRET (`run` refuses to start without one: \
it could not tell a forged key from a real one); \
data keys for sealing payloads from ONCELY_DATA_KEYS_FILE (without it, payloads are stored in plain text). See docs/security.md. Logs: RUST_LOG, ONCELY_LOG_FORMAT=json|pretty."
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
    /// Create the database if missing and apply migrations, then exit. Run it as the
    /// owner of the schema (a superuser, or a member of `<prefix>migrate`).
    Migrate {
        /// Then create or update the group roles (`<prefix>migrate`, `worker`,
        /// `reconciler`, `producer`, `admin`) and their grants: see
        /// docs/security.md ("Least privilege"). Needs a superuser (or the database owner with CREATEROLE).
        #[arg(long)]
        roles: bool,
        /// The group roles' name prefix.
        #[arg(long, default_value = oncely_core::roles::DEFAULT_PREFIX, requires = "roles")]
        role_prefix: String,
        /// Print the roles' SQL instead, for a DBA to apply by hand; changes nothing
        /// (the database must already be migrated: the grants name its columns).
        #[arg(long, requires = "roles")]
        print: bool,
    },
    /// Run an action worker: consume, claim, call providers, commit, ack. Stops on SIGTERM/SIGINT.
    Run {
        /// Only these action types (repeatable); default: every configured one.
        #[arg(long = "action")]
        actions: Vec<String>,
        /// Start without a key secret and accept any well-formed idempotency key: anyone
        /// who can publish to the action queues can then forge intents. Only for trying
        /// oncely out; never in production.
        #[arg(long, env = "ONCELY_INSECURE_ACCEPT_UNVERIFIED_KEYS")]
        insecure_accept_unverified_keys: bool,
    },
    /// Run a reconciler (with the sweeper): settle unknown outcomes by asking providers
    /// first, open reviews when nobody can tell, heal lost messages. Several may run.
    Reconcile,
    /// Inspect operations, resolve reviews, purge (tables; `--json` for scripts).
    #[command(subcommand)]
    Admin(crate::admin::AdminCommand),
    /// Print the `rabbitmqctl` commands that create one RabbitMQ user per process kind
    /// (worker, reconciler, producer/gateway), each limited to the fleet's prefix.
    RabbitmqPermissions {
        /// The broker prefix (default: the config's `broker.prefix`).
        #[arg(long)]
        prefix: Option<String>,
        /// The vhost.
        #[arg(long, default_value = "/")]
        vhost: String,
        /// The users' name prefix (`<users>worker`, …).
        #[arg(long, default_value = oncely_core::roles::DEFAULT_PREFIX)]
        users: String,
    },
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

/// Connect, check that the connected role holds what `process` needs and that the
/// database is at this binary's schema version (only `migrate` changes it), and build a
/// process context.
/// `verify_keys`: this process checks envelopes' keys, so it needs the key ring unless
/// `insecure` (the worker's `--insecure-accept-unverified-keys`) says otherwise.
pub async fn context(
    config: Config,
    process: Process,
    verify_keys: KeyCheck,
) -> anyhow::Result<Context> {
    // Before the database: a missing secret is a configuration error, not a wait.
    let secret = match (KeyRing::from_env(), verify_keys) {
        (Ok(s), _) => Some(s),
        (Err(oncely_core::keys::KeyError::MissingSecret), KeyCheck::Required) => {
            anyhow::bail!(
                "no key secret: set ONCELY_KEY_SECRETS_FILE, ONCELY_KEY_SECRET_FILE or ONCELY_KEY_SECRET \
                 (the producers' secret). Without it a worker cannot tell a forged idempotency key from \
                 a real one; to try oncely out anyway, pass --insecure-accept-unverified-keys"
            )
        }
        (Err(oncely_core::keys::KeyError::MissingSecret), KeyCheck::Insecure) => {
            tracing::error!(
                "INSECURE: --insecure-accept-unverified-keys: no key secret, so any well-formed \
                 idempotency key is accepted; anyone who can publish to the action queues can forge intents"
            );
            None
        }
        (Err(oncely_core::keys::KeyError::MissingSecret), KeyCheck::NotUsed) => None,
        (Err(e), _) => return Err(e.into()),
    };
    let settings = PoolSettings {
        max_connections: config.worker.db_connections,
        ..PoolSettings::for_config(&config)
    };
    // The database may be starting: retry for a while rather than exit on the first
    // hiccup.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let pool = loop {
        match db::connect_checked_as(&config.database_url, &settings, process).await {
            Ok(pool) => break pool,
            // A bad URL, TLS settings or certificate, missing grants or a schema at another
            // version will not fix itself in a minute: fail at once.
            Err(
                e @ (db::DbError::BadUrl(_)
                | db::DbError::Schema { .. }
                | db::DbError::Grants(_)
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
    if let Some(s) = &secret {
        tracing::info!(current = s.current_id(), verify_only = ?s.verify_only_ids().collect::<Vec<_>>(), "key ring");
    }
    let data_keys = oncely_core::DataKeys::from_env()?;
    match &data_keys {
        Some(k) => tracing::info!(
            current = k.current_id(),
            "payloads are sealed (AES-256-GCM)"
        ),
        None => tracing::warn!(
            "ONCELY_DATA_KEYS_FILE is not set: payloads of live operations are stored in plain text"
        ),
    }
    Context::new(
        config,
        Journal::on(pool).with_data_keys(data_keys),
        secret,
        process.name(),
    )
}

/// Whether a process needs the key ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyCheck {
    /// It verifies envelopes' keys: no ring, no start.
    Required,
    /// It would, but the operator said `--insecure-accept-unverified-keys`.
    Insecure,
    /// It never verifies a key (the reconciler): the ring is used when given.
    NotUsed,
}

/// Run the CLI.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Migrate {
            roles: with_roles,
            role_prefix,
            print,
        } => migrate(cli.config.as_deref(), with_roles, &role_prefix, print).await,
        Command::Run {
            actions,
            insecure_accept_unverified_keys,
        } => {
            oncely_core::metrics::install(cli.metrics_addr).map_err(anyhow::Error::msg)?;
            let config = load_config(cli.config.as_deref(), &actions)?;
            let keys = if insecure_accept_unverified_keys {
                KeyCheck::Insecure
            } else {
                KeyCheck::Required
            };
            let ctx = context(config, Process::Worker, keys).await?;
            oncely_core::metrics::init_series(&ctx.action_types());
            oncely_core::metrics::init_provider_series(&ctx.flow.provider_series());
            crate::runner::run(ctx, Shutdown::on_signals()).await
        }
        Command::Reconcile => {
            oncely_core::metrics::install(cli.metrics_addr).map_err(anyhow::Error::msg)?;
            let config = load_config(cli.config.as_deref(), &[])?;
            let ctx = context(config, Process::Reconciler, KeyCheck::NotUsed).await?;
            oncely_core::metrics::init_series(&ctx.action_types());
            oncely_core::metrics::init_provider_series(&ctx.flow.provider_series());
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
        Command::RabbitmqPermissions {
            prefix,
            vhost,
            users,
        } => {
            let prefix = match prefix {
                Some(p) => p,
                None => Config::load(cli.config.as_deref())?.broker.prefix,
            };
            print!("{}", roles::rabbitmq::commands(&prefix, &vhost, &users));
            Ok(())
        }
    }
}

/// `migrate [--roles [--role-prefix P] [--print]]`: apply the migrations as the schema's
/// owner (refused, with the reason, for any other role), then create or update the group
/// roles; or only print the roles' SQL.
async fn migrate(
    config: Option<&std::path::Path>,
    with_roles: bool,
    prefix: &str,
    print: bool,
) -> anyhow::Result<()> {
    let config = Config::load(config)?;
    let url = &config.database_url;
    if config.database_pooler.is_transaction() {
        anyhow::bail!(
            "migrate connects to Postgres itself, not through a transaction pooler (its lock is a \
             session advisory lock): run it with DATABASE_URL set to the server and \
             ONCELY_DATABASE_POOLER=none (docs/scaling.md)"
        );
    }
    if db::split_hosts(url).len() > 1 {
        anyhow::bail!(
            "migrate takes the primary's URL (one host), not a multi-host failover URL: set DATABASE_URL to the primary"
        );
    }
    let one = PoolSettings {
        max_connections: 1,
        ..PoolSettings::default()
    };
    if print {
        let pool = db::connect(url, &one).await?;
        db::check_schema(&pool, url).await?;
        let statements = roles::plan(&pool, prefix).await?;
        print!("{}", roles::sql::script(&statements, prefix));
        return Ok(());
    }
    let created = db::create_if_missing(url).await?;
    let pool = db::connect(url, &one).await?;
    roles::check_can_migrate(&pool, url).await?;
    db::migrate(&pool, url).await?;
    println!(
        "{} {} migrated",
        if created { "created and" } else { "database" },
        db::describe(url)
    );
    if with_roles {
        let statements = roles::apply(&pool, prefix).await?;
        let names: Vec<String> = roles::Role::ALL.iter().map(|r| r.name(prefix)).collect();
        println!(
            "roles {} up to date ({} statements; `--print` shows them)",
            names.join(", "),
            statements.len()
        );
    }
    Ok(())
}
