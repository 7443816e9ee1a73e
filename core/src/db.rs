//! Connecting to Postgres, creating the database, applying migrations, checking the
//! schema version.
//!
//! Errors name the server and database but never echo the URL, which may hold a
//! password. The migrations in `migrations/` are embedded at compile time, so a binary
//! always carries exactly the schema it was written for. Only `oncely-worker migrate`
//! (and test, demo and bench set-up) applies them: a worker, reconciler or admin process
//! needs no DDL rights; it checks at start that its role holds what it needs and that the
//! database is at its version ([`connect_checked_as`]) and refuses to run otherwise.

use sqlx::migrate::{MigrateDatabase, Migrator};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Postgres};
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

/// Pool settings for a process.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    /// Most connections this process opens.
    pub max_connections: u32,
    /// How long to wait for a free connection before failing (retryable).
    pub acquire_timeout: Duration,
}

impl Default for PoolSettings {
    fn default() -> Self {
        Self {
            max_connections: 8,
            acquire_timeout: Duration::from_secs(10),
        }
    }
}

/// Connect a pool (the database must exist).
pub async fn connect(url: &str, settings: &PoolSettings) -> Result<PgPool, DbError> {
    let opts = PgConnectOptions::from_str(url).map_err(|e| DbError::BadUrl(e.to_string()))?;
    PgPoolOptions::new()
        .max_connections(settings.max_connections)
        .acquire_timeout(settings.acquire_timeout)
        .connect_with(opts)
        .await
        .map_err(|source| DbError::Connect {
            target: describe(url),
            source,
        })
}

/// Create the database named in `url` if it does not exist. Returns whether it created it.
pub async fn create_if_missing(url: &str) -> Result<bool, DbError> {
    PgConnectOptions::from_str(url).map_err(|e| DbError::BadUrl(e.to_string()))?;
    let exists = Postgres::database_exists(url)
        .await
        .map_err(|source| DbError::Connect {
            target: describe(url),
            source,
        })?;
    if exists {
        return Ok(false);
    }
    match Postgres::create_database(url).await {
        Ok(()) => Ok(true),
        // Another process created it between our check and our CREATE: fine.
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P04") => Ok(false),
        Err(source) => Err(DbError::Create {
            target: describe(url),
            source,
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
pub async fn schema_version(pool: &PgPool) -> Result<Option<i64>, sqlx::Error> {
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
pub async fn check_schema(pool: &PgPool, url_for_messages: &str) -> Result<(), DbError> {
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
/// version: how every process but `migrate` starts.
pub async fn connect_checked_as(
    url: &str,
    settings: &PoolSettings,
    process: crate::roles::Process,
) -> Result<PgPool, DbError> {
    let pool = connect(url, settings).await?;
    crate::roles::check_grants(&pool, process, url).await?;
    check_schema(&pool, url).await?;
    Ok(pool)
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

/// The server's version and its `synchronous_commit` setting (the bench prints both).
pub async fn server_facts(pool: &PgPool) -> Result<(String, String), sqlx::Error> {
    let version: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(pool)
        .await?;
    let sync: String = sqlx::query_scalar("SHOW synchronous_commit")
        .fetch_one(pool)
        .await?;
    Ok((version, sync))
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn describe_hides_the_password() {
        let d = describe("postgres://alice:hunter2@db.example:6543/oncely");
        assert_eq!(d, "alice@db.example:6543/oncely");
        assert!(!d.contains("hunter2"));
    }
}
