//! Support for oncely's integration tests: each test gets a fresh, migrated database
//! (dropped when the test ends) and a unique name prefix for its RabbitMQ objects, so
//! tests run in parallel against the one Postgres and the one RabbitMQ of the machine.
//!
//! Set `ONCELY_TEST_DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`)
//! and `ONCELY_TEST_AMQP_URL` (default `amqp://guest:guest@127.0.0.1:5672/%2f`) to point
//! elsewhere. `TEST_LOG=1` turns on logs.

use oncely_core::db::{PoolSettings, prepare};
use oncely_core::journal::Journal;
use sqlx::PgPool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Base URL of the server tests create their databases on.
pub fn server_url() -> String {
    std::env::var("ONCELY_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// AMQP URL of the broker tests use.
pub fn amqp_url() -> String {
    std::env::var("ONCELY_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// The Python interpreter of the tests: `ONCELY_TEST_PYTHON` (`scripts/test` sets it to the
/// project-local venv it fills from `tests/python/requirements.txt`), else `.venv/bin/python`
/// at the workspace root if it exists, else `python3`.
pub fn python() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("ONCELY_TEST_PYTHON") {
        return p.into();
    }
    let venv = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    if venv.exists() {
        return venv;
    }
    "python3".into()
}

/// Intent `n` of the built-in config's `action` (`email.send`, `ticket.create` or
/// `payment_order.create`): its own business object, a payload its schema accepts.
pub fn sample_intent(action: &str, n: usize) -> oncely_core::Intent {
    let payload = match action {
        "email.send" => {
            serde_json::json!({"to": format!("user-{n}@example.test"), "subject": "Approved"})
        }
        "ticket.create" => serde_json::json!({"title": format!("ticket {n}"), "queue": "ops"}),
        _ => serde_json::json!({"account_id": "acc", "amount_minor": 100 + n, "currency": "EUR",
            "business_reference": format!("app-{n}")}),
    };
    oncely_core::Intent::from_json(serde_json::json!({"action_type": action,
        "workflow_id": format!("case-{}", n / 10), "step": "s", "business_object": format!("obj-{n}"),
        "revision": 1, "payload": payload}))
    .unwrap_or_else(|e| panic!("intent {n}: {e}"))
}

/// A name no other test (in this or another process) uses: `<tag>_<pid>_<n>_<nanos>`.
pub fn unique_name(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{tag}_{}_{}_{nanos}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A fresh, migrated database, dropped (with its connections) when this is dropped.
#[derive(Debug)]
pub struct TestDb {
    /// Its name.
    pub name: String,
    /// Its URL (give it to spawned processes as `DATABASE_URL`).
    pub url: String,
    /// A pool on it.
    pub pool: PgPool,
}

impl TestDb {
    /// Create and migrate a new database on the tests' server ([`server_url`]).
    pub async fn new() -> TestDb {
        Self::on(&server_url()).await
    }

    /// Create and migrate a new database on the server of `server` (a URL whose query,
    /// e.g. `sslmode=verify-full&sslrootcert=…`, the database's URL keeps).
    pub async fn on(server: &str) -> TestDb {
        let name = unique_name("oncely_t");
        let url = oncely_core::db::database_url(server, &name);
        let pool = prepare(
            &url,
            &PoolSettings {
                max_connections: 16,
                ..PoolSettings::default()
            },
        )
        .await
        .unwrap_or_else(|e| panic!("test database: {e}"));
        TestDb { name, url, pool }
    }

    /// A new database on the tests' server with the migrations up to `version` applied and
    /// no later one: the schema an older release left, for testing what a migration does to
    /// its rows. Apply the rest with `oncely_core::db::migrate`.
    pub async fn migrated_to(version: i64) -> TestDb {
        let name = unique_name("oncely_t");
        let url = oncely_core::db::database_url(&server_url(), &name);
        oncely_core::db::create_if_missing(&url)
            .await
            .unwrap_or_else(|e| panic!("test database: {e}"));
        let pool = oncely_core::db::connect(&url, &PoolSettings::default())
            .await
            .unwrap_or_else(|e| panic!("test database: {e}"));
        oncely_core::db::MIGRATOR
            .run_to(version, &pool)
            .await
            .unwrap_or_else(|e| panic!("migrations up to {version}: {e}"));
        TestDb { name, url, pool }
    }

    /// The maintenance database (`postgres`) of this database's server, with the same
    /// user and TLS settings: where roles are created and databases dropped.
    pub fn server_url(&self) -> String {
        oncely_core::db::database_url(&self.url, "postgres")
    }

    /// A journal over this database.
    pub fn journal(&self) -> Journal {
        Journal::new(self.pool.clone())
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        let server = self.server_url();
        // Drop runs outside any runtime guarantee: use a private one on its own thread.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async move {
                let pool = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(1)
                    .acquire_timeout(Duration::from_secs(10))
                    .connect(&server)
                    .await
                    .ok()?;
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
                )))
                .execute(&pool)
                .await
                .ok()
            })
        })
        .join();
    }
}

/// Poll `check` every 20 ms until it returns `Some`, or panic after `deadline` with
/// `what` — the way tests wait for something, instead of sleeping.
pub async fn eventually<T, F, Fut>(what: &str, deadline: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    within(deadline, check)
        .await
        .unwrap_or_else(|| panic!("timed out after {deadline:?} waiting for {what}"))
}

/// Poll `check` every 20 ms until it returns `Some`; `None` once `deadline` has passed
/// (for a caller that has something else to do then).
pub async fn within<T, F, Fut>(deadline: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return Some(v);
        }
        if start.elapsed() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Why one start of a server on ports chosen free did not come up.
#[derive(Debug)]
pub enum StartFailed {
    /// Another process bound one of its ports between the choice and the server's bind.
    PortTaken(String),
    /// Anything else (fatal).
    Other(String),
}

/// Start a server on ports chosen free and released for it to bind a moment later:
/// `start` makes one attempt on new ports. Another test's process may take a port in
/// between (seen in CI with a private RabbitMQ node and with nginx); such an attempt is
/// made again on other ports, at most three times. Panics on any other failure.
pub async fn on_free_ports<T, F, Fut>(what: &str, mut start: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StartFailed>>,
{
    const ATTEMPTS: u32 = 3;
    for attempt in 1.. {
        match start().await {
            Ok(started) => return started,
            Err(StartFailed::PortTaken(e)) if attempt < ATTEMPTS => {
                eprintln!("{e}\n{what}: a port was taken meanwhile; again on others");
            }
            Err(StartFailed::PortTaken(e) | StartFailed::Other(e)) => {
                panic!("{what} did not start: {e}")
            }
        }
    }
    unreachable!("the attempts end in a return or a panic")
}

pub mod chaos;
pub mod failpoint_worker;
pub mod fleet;
pub mod gateway;
pub mod localstripe;
pub mod mail;
pub mod nginx;
pub mod pgbouncer;
pub mod private_broker;
pub mod private_cluster;
pub mod private_pg;
pub mod proxy;
pub mod rate_limiter;
pub mod roles;
pub mod tls;

/// A TCP port free right now on 127.0.0.1 (for a process that binds it next).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("free port: {e}"))
}

/// GET `http://127.0.0.1:{port}{path}` with a plain HTTP/1.0 request: the body, if 200.
pub async fn http_get(port: u16, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.ok()?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200")
        .then(|| body.to_owned())
        .or_else(|| head.starts_with("HTTP/1.0 200").then(|| body.to_owned()))
}
