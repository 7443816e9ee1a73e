//! A private pgbouncer in transaction pooling mode, in front of the machine's Postgres.
//!
//! Debian's `pgbouncer` (1.18 on Debian 12: no prepared-statement support). One per test,
//! on a free port of 127.0.0.1, with its own directory; it refuses to run as root, so on
//! a root test machine it runs through `runuser -u postgres` (like [`crate::private_pg`]).
//! `pool_mode = transaction` with a small `default_pool_size`, so that every client's
//! statements really are spread over a few shared server connections — what breaks a
//! driver that assumes a session. `ignore_startup_parameters = extra_float_digits`: sqlx
//! sends it at connect, and pgbouncer refuses startup parameters it does not track.
//! Authentication is `trust` (users named in its `auth_file`). Dropping it kills it.

use crate::{StartFailed, free_port, on_free_ports, unique_name, within};
use sqlx::Connection;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running private pgbouncer.
#[derive(Debug)]
pub struct Pgbouncer {
    child: Child,
    port: u16,
    dir: PathBuf,
}

/// Debian installs it in /usr/sbin, which a non-root user's `PATH` may lack.
fn program() -> &'static str {
    if Path::new("/usr/sbin/pgbouncer").exists() {
        "/usr/sbin/pgbouncer"
    } else {
        "pgbouncer"
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

impl Pgbouncer {
    /// Start one in front of the Postgres server of `server_url` (host and port taken
    /// from it), pooling each (database, user) pair into at most `pool_size` server
    /// connections; `users` may log in (trust).
    ///
    /// Its port is chosen free and released for pgbouncer to bind ([`on_free_ports`]: one
    /// that another process took meanwhile makes pgbouncer exit "Address already in use",
    /// and a new one is started on another).
    pub async fn start(server_url: &str, pool_size: u32, users: &[&str]) -> Pgbouncer {
        on_free_ports("pgbouncer", || {
            Self::try_start(server_url, pool_size, users)
        })
        .await
    }

    async fn try_start(
        server_url: &str,
        pool_size: u32,
        users: &[&str],
    ) -> Result<Pgbouncer, StartFailed> {
        let server = url::Url::parse(server_url).unwrap_or_else(|e| panic!("{server_url}: {e}"));
        let (host, pg_port) = (
            server.host_str().unwrap_or("127.0.0.1").to_owned(),
            server.port().unwrap_or(5432),
        );
        let dir = std::env::temp_dir().join(unique_name("pgbouncer"));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let port = free_port();
        let users_file = dir.join("users.txt");
        let mut users_text = String::new();
        for u in users {
            users_text.push_str(&format!("\"{u}\" \"\"\n"));
        }
        std::fs::write(&users_file, users_text).unwrap_or_else(|e| panic!("{e}"));
        let config = dir.join("pgbouncer.ini");
        std::fs::write(
            &config,
            format!(
                "[databases]\n* = host={host} port={pg_port}\n\n[pgbouncer]\n\
                 listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
                 auth_type = trust\nauth_file = {}\n\
                 pool_mode = transaction\ndefault_pool_size = {pool_size}\nmin_pool_size = 0\n\
                 max_client_conn = 2000\nmax_db_connections = 0\n\
                 ignore_startup_parameters = extra_float_digits\n\
                 server_lifetime = 3600\nserver_idle_timeout = 60\n\
                 log_connections = 0\nlog_disconnections = 0\nadmin_users = postgres\n",
                users_file.display()
            ),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let log =
            std::fs::File::create(dir.join("pgbouncer.log")).unwrap_or_else(|e| panic!("{e}"));
        let mut cmd = if is_root() {
            let status = Command::new("chown")
                .args(["-R", "postgres"])
                .arg(&dir)
                .status()
                .unwrap_or_else(|e| panic!("chown: {e}"));
            assert!(status.success(), "chown -R postgres {}", dir.display());
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", program()]);
            c
        } else {
            Command::new(program())
        };
        let child = cmd
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap_or_else(|e| panic!("{e}")))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("pgbouncer (Debian package pgbouncer): {e}"));
        let mut me = Pgbouncer { child, port, dir };
        let probe = me.url_for(&oncely_core::db::database_url(server_url, "postgres"));
        let child = &mut me.child;
        let came_up = within(Duration::from_secs(30), || {
            let exited = child.try_wait().ok().flatten();
            let probe = probe.clone();
            async move {
                if let Some(status) = exited {
                    return Some(Err(status));
                }
                // Bounded: a port another process took may accept and never answer.
                let answered = tokio::time::timeout(Duration::from_secs(2), async {
                    let mut c = sqlx::postgres::PgConnection::connect(&probe).await.ok()?;
                    sqlx::Executor::execute(&mut c, "SELECT 1").await.ok()
                });
                answered.await.ok().flatten().map(|_| Ok(()))
            }
        });
        let logged = |me: &Pgbouncer| {
            std::fs::read_to_string(me.dir.join("pgbouncer.log")).unwrap_or_default()
        };
        match came_up.await {
            Some(Ok(())) => Ok(me),
            Some(Err(status)) if logged(&me).contains("Address already in use") => Err(
                StartFailed::PortTaken(format!("pgbouncer: {status}: {}", logged(&me))),
            ),
            Some(Err(status)) => Err(StartFailed::Other(format!("{status}: {}", logged(&me)))),
            None => Err(StartFailed::Other(format!(
                "no connection through it after 30 s: {}",
                logged(&me)
            ))),
        }
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `url` (a database on the server behind it) with pgbouncer's host and port.
    pub fn url_for(&self, url: &str) -> String {
        let mut u = url::Url::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        let _ = u.set_host(Some("127.0.0.1"));
        let _ = u.set_port(Some(self.port));
        u.to_string()
    }

    /// Transactions pgbouncer has passed to `database` so far (`SHOW STATS` on its admin
    /// console).
    pub async fn transactions(&self, database: &str) -> i64 {
        use sqlx::Row;
        let url = format!("postgres://postgres@127.0.0.1:{}/pgbouncer", self.port);
        let mut c = sqlx::postgres::PgConnection::connect(&url)
            .await
            .unwrap_or_else(|e| panic!("pgbouncer admin console: {e}"));
        let rows = sqlx::raw_sql("SHOW STATS")
            .fetch_all(&mut c)
            .await
            .unwrap_or_else(|e| panic!("SHOW STATS: {e}"));
        rows.iter()
            .filter(|r| r.try_get::<String, _>("database").ok().as_deref() == Some(database))
            // NUMERIC, in text (the admin console speaks the simple protocol only).
            .map(|r| {
                r.try_get_unchecked::<String, _>("total_xact_count")
                    .ok()
                    .and_then(|v| v.parse::<i64>().ok())
                    .unwrap_or(0)
            })
            .sum()
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Pgbouncer {
    fn drop(&mut self) {
        // runuser forwards the signal to pgbouncer.
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
