//! A private PostgreSQL cluster for one test, for what the machine's shared server must
//! not be changed for: TLS only (or no TLS at all), a server certificate from the test's
//! own CA, client certificates.
//!
//! Each cluster gets its own directory (owned by `postgres`: the server refuses to run as
//! root, so `initdb` and `pg_ctl` run through `runuser -u postgres`), a free port on
//! 127.0.0.1, its Unix socket in that directory (not `/var/run/postgresql`, where the
//! shared server's lives), and trust authentication (or `cert`). With TLS, `pg_hba.conf`
//! has only `hostssl` lines and rejects `hostnossl`, so a client that did not negotiate
//! TLS cannot get in at all: a connection that works is a TLS connection. `pg_ctl -w`
//! waits until the server accepts connections. Dropping the cluster stops it
//! (`-m immediate`) and removes its directory (kept, with the server log, when the test
//! failed).

use crate::tls::TestCa;
use crate::{StartFailed, on_free_ports, unique_name};
use std::path::{Path, PathBuf};
use std::process::Command as StdCommand;
use tokio::process::Command;

/// The binaries of the PostgreSQL major version installed on the machine.
const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// How the cluster speaks to clients.
#[derive(Debug, Clone, Copy)]
pub enum PgTls<'a> {
    /// `ssl = off`: the server answers "no" to a TLS request; plain `host` lines.
    Off,
    /// `ssl = on` with a certificate for `names` (DNS names or IPs) signed by `ca`; only
    /// `hostssl` connections are accepted.
    On {
        /// The CA that signs the server certificate.
        ca: &'a TestCa,
        /// The names in the server certificate.
        names: &'a [&'a str],
    },
    /// As [`PgTls::On`], and every client must show a certificate signed by `ca` whose
    /// CN is its user name (`cert` authentication).
    ClientCert {
        /// The CA that signs the server certificate and vouches for clients.
        ca: &'a TestCa,
        /// The names in the server certificate.
        names: &'a [&'a str],
    },
}

/// A running private cluster, stopped and removed when dropped.
#[derive(Debug)]
pub struct PrivatePg {
    dir: PathBuf,
    port: u16,
}

fn run_as_postgres(program: &str) -> Command {
    let mut cmd = Command::new("runuser");
    cmd.args(["-u", "postgres", "--"])
        .arg(Path::new(PG_BIN).join(program))
        .stdin(std::process::Stdio::null());
    cmd
}

async fn check(what: &str, cmd: &mut Command) {
    let out = cmd.output().await.unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn chown_postgres(path: &Path) {
    let status = StdCommand::new("chown")
        .args(["-R", "postgres:postgres"])
        .arg(path)
        .status()
        .unwrap_or_else(|e| panic!("chown: {e}"));
    assert!(status.success(), "chown -R postgres {}", path.display());
}

impl PrivatePg {
    /// `initdb` a new cluster, configure it for `tls`, start it and wait until it
    /// accepts connections.
    pub async fn start(tls: PgTls<'_>) -> PrivatePg {
        let dir = std::env::temp_dir().join(unique_name("oncely_pg"));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        chown_postgres(&dir);
        Self::init(dir, tls).await
    }

    /// A primary whose commits wait for a synchronous standby once one is attached
    /// ([`PrivatePg::start_replica`]): no TLS, replication connections trusted.
    pub async fn start_primary() -> PrivatePg {
        Self::start(PgTls::Off).await
    }

    /// A streaming replica of `primary` (`pg_basebackup -R`), started, and made its
    /// synchronous standby: from now on a commit the primary acknowledges is on both.
    pub async fn start_replica(primary: &PrivatePg) -> PrivatePg {
        let dir = std::env::temp_dir().join(unique_name("oncely_pg_replica"));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        chown_postgres(&dir);
        let data = dir.join("data");
        check(
            "pg_basebackup",
            run_as_postgres("pg_basebackup")
                .arg("-D")
                .arg(&data)
                .args(["-h", "127.0.0.1", "-U", "postgres", "-R", "-X", "stream"])
                .args(["--no-sync", "--checkpoint=fast", "-p"])
                .arg(primary.port.to_string()),
        )
        .await;
        let mut conf = std::fs::read_to_string(data.join("postgresql.conf"))
            .unwrap_or_else(|e| panic!("postgresql.conf: {e}"));
        conf.push_str(&format!(
            "\n# oncely test replica\nunix_socket_directories = '{}'\nhot_standby = on\n",
            dir.display()
        ));
        std::fs::write(data.join("postgresql.conf"), conf).unwrap_or_else(|e| panic!("{e}"));
        chown_postgres(&dir);
        let replica = Self::start_on_a_free_port(dir, "a private Postgres replica").await;
        // Synchronous from now on (postgresql.auto.conf of the primary only: a promoted
        // replica must not wait for a standby it does not have).
        let mut c =
            <sqlx::PgConnection as sqlx::Connection>::connect(&primary.url("127.0.0.1", ""))
                .await
                .unwrap_or_else(|e| panic!("primary: {e}"));
        // Two statements: ALTER SYSTEM refuses to run in a (multi-statement) transaction.
        // The test clusters' base config has synchronous_commit = off (they are never
        // crashed): a primary whose commits must be on the standby turns it back on.
        for sql in [
            "ALTER SYSTEM SET synchronous_standby_names = '*'",
            "ALTER SYSTEM SET synchronous_commit = 'on'",
            "SELECT pg_reload_conf()",
        ] {
            sqlx::raw_sql(sql)
                .execute(&mut c)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
        crate::eventually("the replica to be the synchronous standby", std::time::Duration::from_secs(60), || {
            let url = primary.url("127.0.0.1", "");
            async move {
                let mut c = <sqlx::PgConnection as sqlx::Connection>::connect(&url).await.ok()?;
                let n: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync' AND state = 'streaming'",
                )
                .fetch_one(&mut c)
                .await
                .ok()?;
                (n == 1).then_some(())
            }
        })
        .await;
        replica
    }

    /// Crash it: `pg_ctl stop -m immediate` (every server process quits at once, no
    /// shutdown checkpoint).
    pub async fn kill(&self) {
        check(
            "pg_ctl stop -m immediate",
            run_as_postgres("pg_ctl")
                .arg("-D")
                .arg(self.dir.join("data"))
                .args(["-m", "immediate", "-w", "stop"]),
        )
        .await;
    }

    /// `url` (a database URL on this cluster, `…@127.0.0.1:PORT/db`) as a multi-host URL
    /// that lists this cluster first and `standby` second: what a fleet that must follow
    /// a failover is given (`oncely_core::db::connect`).
    pub fn with_standby(&self, url: &str, standby: &PrivatePg) -> String {
        let (one, two) = (self.port, standby.port);
        let multi = url.replacen(
            &format!("127.0.0.1:{one}/"),
            &format!("127.0.0.1:{one},127.0.0.1:{two}/"),
            1,
        );
        assert_ne!(multi, url, "{url} is not a URL of 127.0.0.1:{one}");
        multi
    }

    /// Promote a standby to primary and wait until it accepts writes.
    pub async fn promote(&self) {
        check(
            "pg_ctl promote",
            run_as_postgres("pg_ctl")
                .arg("-D")
                .arg(self.dir.join("data"))
                .args(["-w", "-t", "60", "promote"]),
        )
        .await;
    }

    async fn init(dir: PathBuf, tls: PgTls<'_>) -> PrivatePg {
        let data = dir.join("data");
        check(
            "initdb",
            run_as_postgres("initdb").arg("-D").arg(&data).args([
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
                "--no-instructions",
            ]),
        )
        .await;
        let (ssl, hba) = match tls {
            PgTls::Off => (
                "ssl = off\n".to_owned(),
                "local all all trust\nhost all all 127.0.0.1/32 trust\n\
                 local replication all trust\nhost replication all 127.0.0.1/32 trust\n",
            ),
            PgTls::On { ca, names } | PgTls::ClientCert { ca, names } => {
                let (cert, key) = ca.server_pem(names);
                std::fs::write(data.join("server.crt"), cert).unwrap_or_else(|e| panic!("{e}"));
                std::fs::write(data.join("server.key"), key).unwrap_or_else(|e| panic!("{e}"));
                std::fs::write(data.join("ca.crt"), ca.ca_pem()).unwrap_or_else(|e| panic!("{e}"));
                let hba = match tls {
                    PgTls::ClientCert { .. } => {
                        "local all all trust\nhostssl all all 127.0.0.1/32 cert\nhostnossl all all 0.0.0.0/0 reject\n"
                    }
                    _ => {
                        "local all all trust\nhostssl all all 127.0.0.1/32 trust\nhostnossl all all 0.0.0.0/0 reject\n"
                    }
                };
                (
                    "ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\nssl_ca_file = 'ca.crt'\n"
                        .to_owned(),
                    hba,
                )
            }
        };
        let conf = format!(
            "\n# oncely test cluster\nlisten_addresses = '127.0.0.1'\n\
             unix_socket_directories = '{dir}'\nmax_connections = 200\nshared_buffers = 16MB\n\
             fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n{ssl}",
            dir = dir.display()
        );
        let mut postgresql_conf = std::fs::read_to_string(data.join("postgresql.conf"))
            .unwrap_or_else(|e| panic!("postgresql.conf: {e}"));
        postgresql_conf.push_str(&conf);
        std::fs::write(data.join("postgresql.conf"), postgresql_conf)
            .unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(data.join("pg_hba.conf"), hba).unwrap_or_else(|e| panic!("{e}"));
        chown_postgres(&dir);
        // The server refuses a key file others can read.
        if data.join("server.key").exists() {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(
                data.join("server.key"),
                std::fs::Permissions::from_mode(0o600),
            )
            .unwrap_or_else(|e| panic!("{e}"));
        }
        Self::start_on_a_free_port(dir, "a private Postgres").await
    }

    /// Start the cluster in `dir` on a port chosen free ([`on_free_ports`]): each attempt
    /// appends its `port` to postgresql.conf (the last setting wins); one whose port
    /// another process took meanwhile ("Address already in use" in the server's log) is
    /// made again on another.
    async fn start_on_a_free_port(dir: PathBuf, what: &str) -> PrivatePg {
        let data = dir.join("data");
        let log = dir.join("server.log");
        let port = on_free_ports(what, || async {
            let port = crate::free_port();
            let conf_file = data.join("postgresql.conf");
            let mut conf = std::fs::read_to_string(&conf_file)
                .unwrap_or_else(|e| panic!("postgresql.conf: {e}"));
            conf.push_str(&format!("port = {port}\n"));
            std::fs::write(&conf_file, conf).unwrap_or_else(|e| panic!("{e}"));
            let logged_before = std::fs::read_to_string(&log).map_or(0, |t| t.len());
            let out = run_as_postgres("pg_ctl")
                .arg("-D")
                .arg(&data)
                .arg("-l")
                .arg(&log)
                .args(["-w", "-t", "120", "start"])
                .output()
                .await
                .unwrap_or_else(|e| panic!("pg_ctl start: {e}"));
            if out.status.success() {
                return Ok(port);
            }
            let logged = std::fs::read_to_string(&log).unwrap_or_default();
            let logged = logged.get(logged_before..).unwrap_or_default();
            let text = format!(
                "pg_ctl start: {}\n{}{}{logged}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            if logged.contains("Address already in use") {
                Err(StartFailed::PortTaken(text))
            } else {
                Err(StartFailed::Other(text))
            }
        })
        .await;
        PrivatePg { dir, port }
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its directory (data, server log).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn log(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    /// What the server logged so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(self.log()).unwrap_or_default()
    }

    /// `postgres://postgres@HOST:PORT/postgres?QUERY` (no `?` when `query` is empty):
    /// the cluster's maintenance database, reached by `host` (`localhost` or
    /// `127.0.0.1`, whichever the test wants the certificate checked against).
    pub fn url(&self, host: &str, query: &str) -> String {
        let base = format!("postgres://postgres@{host}:{}/postgres", self.port);
        if query.is_empty() {
            base
        } else {
            format!("{base}?{query}")
        }
    }

    /// [`PrivatePg::url`] with `sslmode=verify-full` and `sslrootcert` = `ca_file`: how
    /// production connects.
    pub fn verify_full_url(&self, host: &str, ca_file: &Path) -> String {
        self.url(
            host,
            &format!("sslmode=verify-full&sslrootcert={}", ca_file.display()),
        )
    }
}

impl Drop for PrivatePg {
    fn drop(&mut self) {
        let _ = StdCommand::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(Path::new(PG_BIN).join("pg_ctl"))
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", "immediate", "-w", "stop"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
        if std::thread::panicking() {
            eprintln!("private Postgres kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
