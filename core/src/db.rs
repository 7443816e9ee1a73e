//! Connecting to Postgres, creating the database, applying migrations, checking the
//! schema version.
//!
//! Errors name the server and database but never echo the URL, which may hold a
//! password. The migrations in `migrations/` are embedded at compile time, so a binary
//! always carries exactly the schema it was written for. Only `oncely-worker migrate`
//! (and test, demo and bench set-up) applies them: a worker, reconciler or admin process
//! needs no DDL rights; it checks at start that its role holds what it needs and that the
//! database is at its version ([`connect_checked_as`]) and refuses to run otherwise.
//!
//! # TLS
//! sqlx does the TLS (rustls on ring, the system's CA bundle) from the URL's `sslmode`,
//! `sslrootcert`, `sslcert` and `sslkey` (or the `PGSSL…` environment). Before any
//! connection, [`connect`] refuses the combinations where the URL promises more than the
//! driver does ([`check_tls_settings`]): certificate files with `sslmode=disable`/`prefer`
//! (never checked; `prefer` also falls back to plain text), `sslrootcert` with
//! `sslmode=require` (libpq would check the CA, sqlx does not), and `sslmode=allow`
//! (sqlx treats it as `disable`). Files named in the URL must be readable at start. A
//! failed handshake is a [`DbError::Tls`] that says why in words. Production uses
//! `sslmode=verify-full` (CA *and* host name); a warning is logged for a remote server
//! reached any other way.

use crate::tls::{self, TlsFailure};
use sqlx::migrate::{MigrateDatabase, Migrator};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};
use sqlx::{PgPool, Postgres};
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

/// The embedded migrations.
pub static MIGRATOR: Migrator = sqlx::migrate!("../migrations");

/// Why the database could not be reached or prepared.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// `DATABASE_URL` is not a valid Postgres URL.
    #[error("DATABASE_URL is not a valid postgres:// URL: {0}")]
    BadUrl(String),
    /// A multi-host URL none of whose hosts accepts writes (yet).
    #[error("no host of {0} is a writable primary (each is down or a standby in recovery)")]
    NoPrimary(String),
    /// The URL's TLS settings contradict each other or name a file that cannot be read:
    /// fix the URL (retrying will not help).
    #[error("DATABASE_URL's TLS settings for {target}: {problem}")]
    TlsSettings {
        /// `user@host:port/db`, without password.
        target: String,
        /// What is wrong and what to write instead.
        problem: String,
    },
    /// The TLS handshake failed: the certificate, the host name, or no TLS at all.
    #[error("cannot connect to Postgres database {target} over TLS: {failure}{}", pg_hint(.failure))]
    Tls {
        /// `user@host:port/db`, without password.
        target: String,
        /// What went wrong, in words.
        failure: TlsFailure,
    },
    /// The server refused or could not be reached.
    #[error("cannot connect to Postgres database {target}: {source}")]
    Connect {
        /// `user@host:port/db`, without password.
        target: String,
        /// The driver's error.
        source: sqlx::Error,
    },
    /// Creating the database failed.
    #[error("cannot create database {target}: {source}")]
    Create {
        /// `user@host:port/db`, without password.
        target: String,
        /// The driver's error.
        source: sqlx::Error,
    },
    /// Dropping the database failed.
    #[error("cannot drop database {target}: {source}")]
    Drop {
        /// `user@host:port/db`, without password.
        target: String,
        /// The driver's error.
        source: sqlx::Error,
    },
    /// The database's schema is not the one this binary was built for.
    #[error("{}", schema_message(.found, .needed))]
    Schema {
        /// The newest migration applied, if any.
        found: Option<i64>,
        /// The newest migration this binary carries.
        needed: i64,
    },
    /// The connected role lacks privileges its process needs (see [`crate::roles`]).
    #[error("{0}")]
    Grants(crate::roles::MissingGrants),
    /// The connected role may not apply migrations (only the schema's owner may).
    #[error("{0}")]
    CannotMigrate(crate::roles::MigrateRefused),
    /// A migration failed.
    #[error("migrating {target} failed: {source}")]
    Migrate {
        /// `user@host:port/db`, without password.
        target: String,
        /// The migrator's error.
        source: sqlx::migrate::MigrateError,
    },
}

/// `user@host:port/db` for messages: enough to find the server, no secret.
pub fn describe(url: &str) -> String {
    let hosts = split_hosts(url);
    if hosts.len() > 1 {
        return hosts
            .iter()
            .map(|u| describe(u))
            .collect::<Vec<_>>()
            .join(" | ");
    }
    match PgConnectOptions::from_str(url) {
        Ok(o) => format!(
            "{}@{}:{}/{}",
            o.get_username(),
            o.get_host(),
            o.get_port(),
            o.get_database().unwrap_or("(default)")
        ),
        Err(_) => "(unparseable URL)".into(),
    }
}

/// What to check next, for the operator reading a [`DbError::Tls`].
fn pg_hint(failure: &TlsFailure) -> &'static str {
    match failure {
        TlsFailure::NotTrusted => {
            " (trusted: the CA in the URL's sslrootcert, and the system's CA bundle)"
        }
        TlsFailure::NameMismatch { .. } => {
            " (sslmode=verify-full checks the URL's host name: use a name the certificate carries)"
        }
        TlsFailure::NotTls => " (the URL's sslmode requires TLS: turn on ssl at the server)",
        TlsFailure::ClientCertificateRequired
        | TlsFailure::ClientCertificateRejected
        | TlsFailure::Closed => " (the client certificate is the URL's sslcert and sslkey)",
        _ => "",
    }
}

/// The TLS parameters of a URL as sqlx will use them: the URL's, else the `PGSSL…`
/// environment (sqlx's own fallback). sqlx has no getters for the file parameters.
#[derive(Debug, Clone)]
struct TlsParams {
    mode: PgSslMode,
    root_cert: Option<String>,
    cert: Option<String>,
    key: Option<String>,
}

impl TlsParams {
    fn of(url: &str, opts: &PgConnectOptions) -> Self {
        let env = |name: &str| std::env::var(name).ok();
        let mut p = TlsParams {
            mode: opts.get_ssl_mode(),
            root_cert: env("PGSSLROOTCERT"),
            cert: env("PGSSLCERT"),
            key: env("PGSSLKEY"),
        };
        if let Ok(u) = url::Url::parse(url) {
            for (k, v) in u.query_pairs() {
                // The same spellings sqlx accepts.
                let slot = match &*k {
                    "sslrootcert" | "ssl-root-cert" | "ssl-ca" => &mut p.root_cert,
                    "sslcert" | "ssl-cert" => &mut p.cert,
                    "sslkey" | "ssl-key" => &mut p.key,
                    _ => continue,
                };
                *slot = Some(v.into_owned());
            }
        }
        p
    }
}

fn mode_name(mode: PgSslMode) -> &'static str {
    match mode {
        PgSslMode::Disable => "disable",
        PgSslMode::Allow => "allow",
        PgSslMode::Prefer => "prefer",
        PgSslMode::Require => "require",
        PgSslMode::VerifyCa => "verify-ca",
        PgSslMode::VerifyFull => "verify-full",
    }
}

/// Refuse TLS settings that promise more than the driver does, and files that cannot
/// be read (sqlx would read them at the first connection, with an error that names no
/// file). Why each rule: see the module docs.
fn check_tls_params(p: &TlsParams) -> Result<(), String> {
    let mode = mode_name(p.mode);
    let files = [
        ("sslrootcert", &p.root_cert),
        ("sslcert", &p.cert),
        ("sslkey", &p.key),
    ];
    let named: Vec<&str> = files
        .iter()
        .filter(|(_, v)| v.is_some())
        .map(|(n, _)| *n)
        .collect();
    match p.mode {
        PgSslMode::Allow => {
            return Err(
                "sslmode=allow never uses TLS with this driver (sqlx treats it as \
                        disable): use sslmode=verify-full, or sslmode=disable if plain text \
                        is really meant"
                    .into(),
            );
        }
        PgSslMode::Disable | PgSslMode::Prefer if !named.is_empty() => {
            return Err(format!(
                "{} set, but sslmode={mode} never checks a certificate{}: use sslmode=verify-full",
                named.join(", "),
                if matches!(p.mode, PgSslMode::Prefer) {
                    " and falls back to plain text (sslmode=prefer is the default when the \
                     URL has none)"
                } else {
                    ""
                }
            ));
        }
        PgSslMode::Require if p.root_cert.is_some() => {
            return Err(
                "sslrootcert is set, but sslmode=require does not check the server's \
                        certificate with it (libpq would; sqlx does not): use \
                        sslmode=verify-full (or verify-ca)"
                    .into(),
            );
        }
        _ => {}
    }
    match (&p.cert, &p.key) {
        (Some(_), None) => return Err("sslcert is set without sslkey (its private key)".into()),
        (None, Some(_)) => return Err("sslkey is set without sslcert".into()),
        _ => {}
    }
    for (name, value) in files {
        let Some(value) = value else { continue };
        // sqlx also takes the PEM text itself instead of a path.
        if value.trim_start().starts_with("-----BEGIN") {
            continue;
        }
        tls::check_readable(Path::new(value)).map_err(|e| {
            let hint = if name == "sslrootcert" && value == "system" {
                " (libpq's sslrootcert=system is not supported: leave sslrootcert out to \
                 trust the system's CA bundle)"
            } else {
                ""
            };
            format!("{name}: {e}{hint}")
        })?;
    }
    Ok(())
}

/// Parse `url` and check its TLS settings ([`check_tls_params`]); log a warning when a
/// remote server is reached without `sslmode=verify-full`/`verify-ca`.
pub fn check_tls_settings(url: &str) -> Result<PgConnectOptions, DbError> {
    let opts = PgConnectOptions::from_str(url).map_err(|e| DbError::BadUrl(e.to_string()))?;
    let params = TlsParams::of(url, &opts);
    check_tls_params(&params).map_err(|problem| DbError::TlsSettings {
        target: describe(url),
        problem,
    })?;
    let verified = matches!(params.mode, PgSslMode::VerifyFull | PgSslMode::VerifyCa);
    if !verified && !is_local(&opts) {
        tracing::warn!(
            target = %describe(url),
            sslmode = mode_name(params.mode),
            "the connection to Postgres is not verified (and may be plain text): use sslmode=verify-full"
        );
    }
    Ok(opts)
}

/// A Unix socket or a loopback address: no network to listen on.
fn is_local(opts: &PgConnectOptions) -> bool {
    let host = opts.get_host();
    opts.get_socket().is_some()
        || host.starts_with('/')
        || host == "localhost"
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The TLS failure in a driver error, if it is one. `tls_required`: the URL's sslmode
/// is `require` or `verify-…`, so a connection closed before the server said anything
/// in the Postgres protocol (which sqlx reports as a bare I/O error) is put down to TLS.
fn tls_failure(err: &sqlx::Error, tls_required: bool) -> Option<TlsFailure> {
    match err {
        sqlx::Error::Tls(inner) => {
            let inner: &(dyn std::error::Error + 'static) = inner.as_ref();
            Some(TlsFailure::find(inner).unwrap_or_else(|| {
                let text = inner.to_string();
                // sqlx's words when the server answers "N" to the SSLRequest.
                if text.contains("does not support TLS") {
                    TlsFailure::NotTls
                } else {
                    TlsFailure::Other(text)
                }
            }))
        }
        sqlx::Error::Io(io) => {
            TlsFailure::find(io).or_else(|| tls_required.then(|| TlsFailure::closed(io)).flatten())
        }
        _ => None,
    }
}

/// A failed connection as a [`DbError`]: [`DbError::Tls`] when TLS is why.
fn connect_error(url: &str, source: sqlx::Error) -> DbError {
    let tls_required = PgConnectOptions::from_str(url).is_ok_and(|o| {
        matches!(
            o.get_ssl_mode(),
            PgSslMode::Require | PgSslMode::VerifyCa | PgSslMode::VerifyFull
        )
    });
    match tls_failure(&source, tls_required) {
        Some(failure) => DbError::Tls {
            target: describe(url),
            failure,
        },
        None => DbError::Connect {
            target: describe(url),
            source,
        },
    }
}

/// Pool settings for a process.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    /// Most connections this process opens.
    pub max_connections: u32,
    /// How long to wait for a free connection before failing (retryable).
    pub acquire_timeout: Duration,
    /// Postgres is reached through a transaction-pooling pooler (pgbouncer
    /// `pool_mode = transaction`): no statement cache, and [`crate::Db`] runs each
    /// statement unnamed in a transaction of its own ([`crate::pooler`]).
    pub pooler: bool,
}

impl Default for PoolSettings {
    fn default() -> Self {
        Self {
            max_connections: 8,
            acquire_timeout: Duration::from_secs(10),
            pooler: false,
        }
    }
}

impl PoolSettings {
    /// The defaults, through a pooler when the config says so.
    pub fn for_config(config: &crate::config::Config) -> Self {
        Self {
            pooler: config.database_pooler.is_transaction(),
            ..Self::default()
        }
    }
}

/// The URLs of a libpq-style multi-host URL, one per host, in order
/// (`postgres://u@h1:5432,h2:5432/db?…` → `postgres://u@h1:5432/db?…`,
/// `postgres://u@h2:5432/db?…`), without `target_session_attrs` (oncely always wants the
/// writable one). A single-host URL comes back as it is.
pub fn split_hosts(url: &str) -> Vec<String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return vec![url.to_owned()];
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(i) => (&authority[..=i], &authority[i + 1..]),
        None => ("", authority),
    };
    if !hosts.contains(',') {
        return vec![url.to_owned()];
    }
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let kept: Vec<&str> = query
                .split('&')
                .filter(|p| !p.is_empty() && !p.starts_with("target_session_attrs="))
                .collect();
            if kept.is_empty() {
                path.to_owned()
            } else {
                format!("{path}?{}", kept.join("&"))
            }
        }
        None => tail.to_owned(),
    };
    hosts
        .split(',')
        .map(|h| format!("{scheme}://{userinfo}{h}{tail}"))
        .collect()
}

/// Whether the server of `conn` accepts writes (not a standby in recovery). Simple
/// protocol: no prepared statement, so it is safe behind any pooler.
async fn is_writable(conn: &mut sqlx::PgConnection) -> Result<bool, sqlx::Error> {
    use sqlx::Row;
    let rows = sqlx::raw_sql("SELECT pg_is_in_recovery()::text")
        .fetch_all(&mut *conn)
        .await?;
    Ok(rows
        .first()
        .and_then(|r| r.try_get::<String, _>(0).ok())
        .is_some_and(|v| v == "false"))
}

/// The first of `candidates` that accepts a connection and writes.
async fn find_primary(candidates: &[(String, PgConnectOptions)]) -> Option<usize> {
    use sqlx::ConnectOptions;
    for (i, (_, opts)) in candidates.iter().enumerate() {
        let probe = async {
            let mut c = opts.connect().await.ok()?;
            let writable = is_writable(&mut c).await.ok();
            let _ = sqlx::Connection::close(c).await;
            writable
        };
        if tokio::time::timeout(Duration::from_secs(3), probe).await == Ok(Some(true)) {
            return Some(i);
        }
    }
    None
}

/// The statement cache: off behind a pooler (every statement unnamed, [`crate::pooler`]).
fn session_options(opts: PgConnectOptions, settings: &PoolSettings) -> PgConnectOptions {
    if settings.pooler {
        opts.statement_cache_capacity(0)
    } else {
        opts
    }
}

/// Set at the start of every direct connection (not behind a pooler, where every statement
/// is unnamed and so planned each time already): plan each statement for its own
/// parameters on every execution.
///
/// Why: with Postgres's default (`plan_cache_mode = auto`) a named statement switches to a
/// *generic* plan after five executions and keeps it until the table's statistics change.
/// A worker's connections make their first statements while the journal is young — a new
/// journal, or the first minute of a fleet — and a generic plan made against a table of a
/// few rows joins a completion batch (`UPDATE … FROM unnest(…)`) to a **sequential scan**
/// of `agent_operations` with a hash, which it then repeats while the table grows, until
/// autovacuum's first `ANALYZE` invalidates it. Measured in the bench, whose journals are
/// seconds old (docs/performance.md, "Generic plans of a young journal"): at half load the
/// completions read 60 buffers per row instead of 24 and took 11.6 s to execute instead of
/// 5.0 s for 20,000 operations. A custom plan costs one planning per statement, i.e. per
/// batch (the completion's: ~0.25 ms; 7.6 % of Postgres's CPU at half load in the bench).
/// A `SET` rather than a startup option: proxies in front of
/// Postgres (pgbouncer in session mode) refuse unknown startup parameters.
const CUSTOM_PLANS: &str = "SET plan_cache_mode = force_custom_plan";

/// [`CUSTOM_PLANS`] on a new direct connection.
async fn start_session(conn: &mut sqlx::PgConnection) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(CUSTOM_PLANS).execute(conn).await.map(|_| ())
}

/// Connect a pool (the database must exist), after checking the URL's TLS settings. A
/// multi-host URL ([`split_hosts`]: a primary and its standbys) connects to the one that
/// accepts writes, refuses connections to a server in recovery, and follows a failover:
/// a watcher checks the current server every second and, when it stops answering or
/// turns read-only, points the pool at whichever host is writable now (docs/scaling.md,
/// "Postgres failover").
pub async fn connect(url: &str, settings: &PoolSettings) -> Result<PgPool, DbError> {
    let urls = split_hosts(url);
    if urls.len() > 1 {
        return connect_failover(url, urls, settings).await;
    }
    let opts = session_options(check_tls_settings(url)?, settings);
    let pooler = settings.pooler;
    PgPoolOptions::new()
        .max_connections(settings.max_connections)
        .acquire_timeout(settings.acquire_timeout)
        .after_connect(move |conn, _| {
            Box::pin(async move {
                if !pooler {
                    start_session(conn).await?;
                }
                Ok(())
            })
        })
        .connect_with(opts)
        .await
        .map_err(|source| connect_error(url, source))
}

async fn connect_failover(
    url: &str,
    urls: Vec<String>,
    settings: &PoolSettings,
) -> Result<PgPool, DbError> {
    let mut candidates = Vec::new();
    for u in urls {
        let opts = session_options(check_tls_settings(&u)?, settings);
        candidates.push((u, opts));
    }
    let Some(first) = find_primary(&candidates).await else {
        return Err(DbError::NoPrimary(describe(url)));
    };
    let pooler = settings.pooler;
    let pool = PgPoolOptions::new()
        .max_connections(settings.max_connections)
        .acquire_timeout(settings.acquire_timeout)
        // A connection to a standby (an old primary back in recovery) is refused here, so
        // the pool never hands one out.
        .after_connect(move |conn, _| {
            Box::pin(async move {
                if is_writable(conn).await? {
                    if !pooler {
                        start_session(conn).await?;
                    }
                    Ok(())
                } else {
                    Err(sqlx::Error::Protocol(
                        "this Postgres server is in recovery (a standby): not the primary".into(),
                    ))
                }
            })
        })
        .connect_with(candidates[first].1.clone())
        .await
        .map_err(|source| connect_error(&candidates[first].0, source))?;
    tracing::info!(primary = %describe(&candidates[first].0), hosts = candidates.len(), "Postgres: connected to the primary");
    tokio::spawn(follow_failover(pool.clone(), candidates, first));
    Ok(pool)
}

/// The failover watcher of a multi-host pool (see [`connect`]); ends with the pool.
async fn follow_failover(
    pool: PgPool,
    candidates: Vec<(String, PgConnectOptions)>,
    mut current: usize,
) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if pool.is_closed() {
            return;
        }
        let healthy = tokio::time::timeout(Duration::from_secs(3), async {
            let mut c = pool.acquire().await.ok()?;
            is_writable(&mut c).await.ok()
        })
        .await;
        if healthy == Ok(Some(true)) {
            continue;
        }
        match find_primary(&candidates).await {
            Some(i) if i != current => {
                tracing::warn!(
                    from = %describe(&candidates[current].0),
                    to = %describe(&candidates[i].0),
                    "Postgres failover: the primary moved; new connections go to the new one"
                );
                metrics::counter!(crate::metrics::DB_FAILOVERS).increment(1);
                pool.set_connect_options(candidates[i].1.clone());
                current = i;
            }
            Some(_) => {}
            None => tracing::warn!("Postgres: no host of the URL accepts writes; looking again"),
        }
    }
}

/// Create the database named in `url` if it does not exist. Returns whether it created it.
pub async fn create_if_missing(url: &str) -> Result<bool, DbError> {
    check_tls_settings(url)?;
    let exists = Postgres::database_exists(url)
        .await
        .map_err(|source| connect_error(url, source))?;
    if exists {
        return Ok(false);
    }
    match Postgres::create_database(url).await {
        Ok(()) => Ok(true),
        // Another process created it between our check and our CREATE: fine.
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P04") => Ok(false),
        Err(source) => Err(match tls_failure(&source, false) {
            Some(_) => connect_error(url, source),
            None => DbError::Create {
                target: describe(url),
                source,
            },
        }),
    }
}

/// Apply every pending migration (idempotent; concurrent callers serialise on a lock).
pub async fn migrate(pool: &PgPool, url_for_messages: &str) -> Result<(), DbError> {
    MIGRATOR.run(pool).await.map_err(|source| DbError::Migrate {
        target: describe(url_for_messages),
        source,
    })
}

/// The newest migration embedded in this binary (0 if it carries none).
pub fn needed_version() -> i64 {
    MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0)
}

fn schema_message(found: &Option<i64>, needed: &i64) -> String {
    let at = found.map_or_else(|| "none".to_owned(), |v| v.to_string());
    match found {
        Some(f) if f > needed => format!(
            "database schema is at version {at}, newer than this binary's {needed}: run a binary built for it"
        ),
        _ => format!(
            "database schema is at version {at}, this binary needs {needed}: run `oncely-worker migrate`"
        ),
    }
}

/// The newest successfully applied migration (`None`: none, or no migrations table).
pub async fn schema_version<'c>(
    pool: impl sqlx::PgExecutor<'c> + Copy,
) -> Result<Option<i64>, sqlx::Error> {
    let table: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
        .fetch_one(pool)
        .await?;
    if !table {
        return Ok(None);
    }
    sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations WHERE success")
        .fetch_one(pool)
        .await
}

/// Fail with [`DbError::Schema`] unless the database is at this binary's version.
pub async fn check_schema<'c>(
    pool: impl sqlx::PgExecutor<'c> + Copy,
    url_for_messages: &str,
) -> Result<(), DbError> {
    let found = schema_version(pool)
        .await
        .map_err(|source| DbError::Connect {
            target: describe(url_for_messages),
            source,
        })?;
    let needed = needed_version();
    if found == Some(needed) {
        Ok(())
    } else {
        Err(DbError::Schema { found, needed })
    }
}

/// Connect a pool and check the schema version (tests, demo and bench tools; every
/// shipped process uses [`connect_checked_as`]).
pub async fn connect_checked(url: &str, settings: &PoolSettings) -> Result<PgPool, DbError> {
    let pool = connect(url, settings).await?;
    check_schema(&pool, url).await?;
    Ok(pool)
}

/// Connect a pool, check that the connected role holds what `process` needs
/// ([`crate::roles::check_grants`], one query) and that the schema is at this binary's
/// version: how every process but `migrate` starts. Returns the [`crate::Db`] its
/// statements go through (directly, or through a pooler as `settings` say).
pub async fn connect_checked_as(
    url: &str,
    settings: &PoolSettings,
    process: crate::roles::Process,
) -> Result<crate::Db, DbError> {
    let db = crate::Db::new(connect(url, settings).await?, settings.pooler);
    crate::roles::check_grants(&db, process, url).await?;
    check_schema(&db, url).await?;
    Ok(db)
}

/// Create if missing, connect and migrate: what `oncely-worker migrate` does, and what
/// test, demo and bench set-up do on their throwaway databases.
pub async fn prepare(url: &str, settings: &PoolSettings) -> Result<PgPool, DbError> {
    create_if_missing(url).await?;
    let pool = connect(url, settings).await?;
    migrate(&pool, url).await?;
    Ok(pool)
}

/// The URL of database `name` on the server of `server_url` (its user, host, port and
/// query kept; its path replaced).
pub fn database_url(server_url: &str, name: &str) -> String {
    let (base, query) = match server_url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (server_url, None),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let base = match base[scheme_end..].find('/') {
        Some(i) => &base[..scheme_end + i],
        None => base,
    };
    match query {
        Some(q) => format!("{base}/{name}?{q}"),
        None => format!("{base}/{name}"),
    }
}

/// Drop the database named in `url` if it exists, ending its sessions first
/// (`DROP DATABASE … WITH (FORCE)`): for throwaway databases (tests, demo, bench).
pub async fn drop_database(url: &str) -> Result<(), DbError> {
    let opts = PgConnectOptions::from_str(url).map_err(|e| DbError::BadUrl(e.to_string()))?;
    let name = opts
        .get_database()
        .ok_or_else(|| DbError::BadUrl("no database name in the URL".into()))?
        .to_owned();
    // From the server's maintenance database; `WITH (FORCE)` ends the sessions and drops
    // in one statement, so a pool still reconnecting cannot slip in between.
    let server = connect(
        &database_url(url, "postgres"),
        &PoolSettings {
            max_connections: 1,
            ..PoolSettings::default()
        },
    )
    .await?;
    let dropped = sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
        name.replace('"', "\"\"")
    )))
    .execute(&server)
    .await;
    server.close().await;
    dropped.map(|_| ()).map_err(|source| DbError::Drop {
        target: describe(url),
        source,
    })
}

/// What the bench prints of the server it measured.
#[derive(Debug, Clone)]
pub struct ServerFacts {
    /// `SHOW server_version`.
    pub version: String,
    /// `SHOW synchronous_commit`.
    pub synchronous_commit: String,
    /// This connection's TLS version (`TLSv1.3`), or `off`: with the URL's `sslmode`
    /// (`prefer` when unset) a server with `ssl = on` — Debian's default — is reached
    /// over TLS, which costs CPU on both sides of every statement.
    pub tls: String,
}

/// The server's version, its `synchronous_commit` setting and whether this pool's
/// connections use TLS (the bench prints all three).
pub async fn server_facts(pool: &PgPool) -> Result<ServerFacts, sqlx::Error> {
    let version: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(pool)
        .await?;
    let synchronous_commit: String = sqlx::query_scalar("SHOW synchronous_commit")
        .fetch_one(pool)
        .await?;
    let tls: String = sqlx::query_scalar(
        "SELECT coalesce((SELECT version FROM pg_stat_ssl \
         WHERE pid = pg_backend_pid() AND ssl), 'off')",
    )
    .fetch_one(pool)
    .await?;
    Ok(ServerFacts {
        version,
        synchronous_commit,
        tls,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multi_host_urls_split_into_one_url_per_host() {
        assert_eq!(
            split_hosts(
                "postgres://u:pw@a:5432,b:5433/db?target_session_attrs=read-write&sslmode=verify-full"
            ),
            vec![
                "postgres://u:pw@a:5432/db?sslmode=verify-full",
                "postgres://u:pw@b:5433/db?sslmode=verify-full"
            ]
        );
        assert_eq!(
            split_hosts("postgres://a,b/db?target_session_attrs=read-write"),
            vec!["postgres://a/db", "postgres://b/db"]
        );
        assert_eq!(
            split_hosts("postgres://u@a:1/db"),
            vec!["postgres://u@a:1/db"]
        );
        assert_eq!(describe("postgres://u@a:1,b:2/db"), "u@a:1/db | u@b:2/db");
    }

    #[test]
    fn database_url_replaces_only_the_path() {
        assert_eq!(
            database_url("postgres://u@h:5/postgres", "x"),
            "postgres://u@h:5/x"
        );
        assert_eq!(
            database_url("postgres://u@h:5/postgres?sslmode=require", "x"),
            "postgres://u@h:5/x?sslmode=require"
        );
        assert_eq!(database_url("postgres://u@h:5", "x"), "postgres://u@h:5/x");
    }

    #[test]
    fn schema_errors_say_what_to_do() {
        let needed = needed_version();
        let none = DbError::Schema {
            found: None,
            needed,
        };
        assert_eq!(
            none.to_string(),
            format!(
                "database schema is at version none, this binary needs {needed}: run `oncely-worker migrate`"
            )
        );
        let newer = DbError::Schema {
            found: Some(needed + 1),
            needed,
        };
        assert!(newer.to_string().contains("newer than this binary"));
    }

    fn tls_problem(url: &str) -> Option<String> {
        let opts = PgConnectOptions::from_str(url).expect("url");
        check_tls_params(&TlsParams::of(url, &opts)).err()
    }

    #[test]
    fn tls_settings_that_promise_more_than_the_driver_does_are_refused() {
        let ca = "/etc/ssl/certs/ca-certificates.crt";
        let base = "postgres://u:hunter2@db.example/oncely";
        for (query, words) in [
            (
                format!("sslmode=prefer&sslrootcert={ca}"),
                "sslmode=prefer never checks",
            ),
            (format!("sslrootcert={ca}"), "sslmode=prefer never checks"),
            (
                format!("sslmode=disable&sslrootcert={ca}"),
                "sslmode=disable never checks",
            ),
            (
                format!("sslmode=require&sslrootcert={ca}"),
                "sslmode=require does not check",
            ),
            ("sslmode=allow".to_owned(), "sslmode=allow never uses TLS"),
            (
                format!("sslmode=verify-full&sslcert={ca}"),
                "sslcert is set without sslkey",
            ),
            (
                "sslmode=verify-full&sslrootcert=/nonexistent/ca.pem".to_owned(),
                "sslrootcert: cannot read /nonexistent/ca.pem",
            ),
            (
                "sslmode=verify-full&sslrootcert=system".to_owned(),
                "sslrootcert=system is not supported",
            ),
        ] {
            let problem = tls_problem(&format!("{base}?{query}"))
                .unwrap_or_else(|| panic!("{query} should be refused"));
            assert!(problem.contains(words), "{query}: {problem}");
        }
        for query in [
            String::new(),
            "?sslmode=disable".into(),
            "?sslmode=require".into(),
            format!("?sslmode=verify-ca&sslrootcert={ca}"),
            format!("?sslmode=verify-full&sslrootcert={ca}&sslcert={ca}&sslkey={ca}"),
        ] {
            assert_eq!(tls_problem(&format!("{base}{query}")), None, "{query}");
        }
    }

    #[test]
    fn tls_settings_errors_name_the_server_not_the_password() {
        let err = check_tls_settings(
            "postgres://u:hunter2@db.example:6543/oncely?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
        )
        .expect_err("missing CA")
        .to_string();
        assert!(err.contains("u@db.example:6543/oncely"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
    }

    #[test]
    fn describe_hides_the_password() {
        let d = describe("postgres://alice:hunter2@db.example:6543/oncely");
        assert_eq!(d, "alice@db.example:6543/oncely");
        assert!(!d.contains("hunter2"));
    }
}
