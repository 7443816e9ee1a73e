//! A private RabbitMQ node for one test, for faults that must never touch the machine's
//! shared broker (closing every connection, restarting the node).
//!
//! Each node gets a unique name (`oncely_t_<pid>_<n>_<nanos>@localhost`), free ports for
//! AMQP and Erlang distribution, and its own directory (data, logs, pid file, feature
//! flags, no plugins, a config file that listens only on its own port — the machine's
//! `/etc/rabbitmq/rabbitmq.conf` would otherwise make it listen on 5672 as well). The
//! directory is owned by `rabbitmq`: the server drops to that user.
//!
//! The Erlang cookie: `/usr/sbin/rabbitmq-server` and `/usr/sbin/rabbitmqctl` are wrappers
//! that, run as root, `su rabbitmq` (keeping the `RABBITMQ_*` environment, setting `HOME`
//! to `/var/lib/rabbitmq`), so the server and the CLI both read
//! `/var/lib/rabbitmq/.erlang.cookie` and agree without any cookie handling here.
//!
//! `rabbitmqctl` is itself an Erlang node that listens on a port from a range shared by
//! every CLI call on the machine (35672–35682 by default, so at most 11 at once); the
//! calls here get a free port of their own (`RABBITMQ_CTL_DIST_PORT_MIN/MAX`) instead.
//!
//! Restarts are graceful (`rabbitmqctl stop` and a new `rabbitmq-server` on the same
//! directories): a quorum queue declared about a second before a SIGKILL of the node can
//! come back unusable (`541 INTERNAL_ERROR`, leader not known; measured on RabbitMQ
//! 3.10.8), and a test should declare its queues well before a
//! restart anyway ([`PrivateBroker::kill`] is there for tests of exactly that, and for
//! [`crate::private_cluster`]). Dropping the broker stops the node and removes its
//! directory.
//!
//! With [`PrivateBroker::start_tls`] the node also listens for `amqps://` on a port of
//! its own (`listeners.ssl.default`), presenting a certificate signed by the test's CA,
//! and, if asked, requires a client certificate signed by that CA (`verify_peer`,
//! `fail_if_no_peer_cert`). The plain listener stays (the boot check and the restart
//! logic use it); a test that wants TLS connects to [`PrivateBroker::tls_url`] and can
//! check with [`PrivateBroker::connections`] that every client did. The certificate
//! files live in the node's directory, owned by `rabbitmq` like the rest.

use crate::tls::TestCa;
use crate::{StartFailed, eventually, on_free_ports, unique_name, within};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command as StdCommand;
use std::time::Duration;
use tokio::process::Command;

/// How long a node may take to boot (it usually takes 5–10 s; the machine may be busy).
const BOOT_DEADLINE: Duration = Duration::from_secs(120);
/// How long a node may take to stop.
const STOP_DEADLINE: Duration = Duration::from_secs(60);

/// A running private RabbitMQ node, stopped (and its directory removed) when dropped.
#[derive(Debug)]
pub struct PrivateBroker {
    node: String,
    port: u16,
    dist_port: u16,
    tls_port: Option<u16>,
    dir: PathBuf,
}

/// The TLS listener of a private node.
#[derive(Debug, Clone, Copy)]
pub struct BrokerTls<'a> {
    /// The CA that signs the server certificate (and vouches for client certificates).
    pub ca: &'a TestCa,
    /// The names (DNS names or IPs) in the server certificate.
    pub names: &'a [&'a str],
    /// Refuse clients without a certificate signed by `ca`.
    pub require_client_cert: bool,
}

/// `N` distinct free TCP ports on 127.0.0.1 (all listeners are held while choosing).
fn free_ports<const N: usize>() -> [u16; N] {
    let listeners: Vec<TcpListener> = (0..N)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("free port: {e}")))
        .collect();
    std::array::from_fn(|i| {
        listeners[i]
            .local_addr()
            .unwrap_or_else(|e| panic!("free port: {e}"))
            .port()
    })
}

impl PrivateBroker {
    /// Start a new node and wait until it accepts AMQP connections.
    pub async fn start() -> PrivateBroker {
        Self::start_with(None).await
    }

    /// Start a new node with a TLS listener as well (see the module docs).
    pub async fn start_tls(tls: BrokerTls<'_>) -> PrivateBroker {
        Self::start_with(Some(tls)).await
    }

    /// Ports are chosen free, then released for the node to bind a second or two later
    /// ([`on_free_ports`]: a node that lost one is stopped, and one started on others).
    async fn start_with(tls: Option<BrokerTls<'_>>) -> PrivateBroker {
        let tls = tls.as_ref();
        on_free_ports("a private RabbitMQ node", || async move {
            let broker = Self::prepare(tls);
            match broker.try_boot().await {
                Ok(()) => Ok(broker),
                Err(e) if broker.lost_a_port().await => {
                    Err(StartFailed::PortTaken(format!("{e} ({})", broker.node)))
                }
                Err(e) => Err(StartFailed::Other(e)),
            }
        })
        .await
    }

    /// A new node's directory and config, on ports free right now.
    fn prepare(tls: Option<&BrokerTls<'_>>) -> PrivateBroker {
        let name = unique_name("oncely_t");
        let node = format!("{name}@localhost");
        let dir = std::env::temp_dir().join(format!("{name}_rabbitmq"));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let [port, dist_port, tls_port] = free_ports::<3>();
        std::fs::write(dir.join("enabled_plugins"), "[].\n").unwrap_or_else(|e| panic!("{e}"));
        let mut conf = format!("listeners.tcp.default = 127.0.0.1:{port}\n");
        if let Some(tls) = tls {
            let (cert, key) = tls.ca.server_pem(tls.names);
            let files = [
                ("ca.pem", tls.ca.ca_pem()),
                ("server.pem", cert),
                ("server.key", key),
            ];
            for (file, text) in &files {
                std::fs::write(dir.join(file), text).unwrap_or_else(|e| panic!("{e}"));
            }
            let verify = if tls.require_client_cert {
                "verify_peer\nssl_options.fail_if_no_peer_cert = true"
            } else {
                "verify_none"
            };
            conf.push_str(&format!(
                "listeners.ssl.default = 127.0.0.1:{tls_port}\n\
                 ssl_options.cacertfile = {d}/ca.pem\n\
                 ssl_options.certfile = {d}/server.pem\n\
                 ssl_options.keyfile = {d}/server.key\n\
                 ssl_options.verify = {verify}\n",
                d = dir.display()
            ));
        }
        std::fs::write(dir.join("rabbitmq.conf"), conf).unwrap_or_else(|e| panic!("{e}"));
        let status = StdCommand::new("chown")
            .args(["-R", "rabbitmq:rabbitmq"])
            .arg(&dir)
            .status()
            .unwrap_or_else(|e| panic!("chown: {e}"));
        assert!(status.success(), "chown -R rabbitmq {}", dir.display());
        PrivateBroker {
            node,
            port,
            dist_port,
            tls_port: tls.map(|_| tls_port),
            dir,
        }
    }

    /// Whether the node's log says (within 30 s) that one of its listeners found its port
    /// taken. The other process's listener makes the AMQP port answer at once, so
    /// `await_startup` may fail before the node has logged why.
    async fn lost_a_port(&self) -> bool {
        let log = self.dir.join("log").join(format!("{}.log", self.node));
        within(Duration::from_secs(30), || {
            let seen = std::fs::read_to_string(&log).is_ok_and(|t| t.contains("eaddrinuse"));
            std::future::ready(seen.then_some(()))
        })
        .await
        .is_some()
    }

    /// The node's name (`rabbitmqctl -n <node>`).
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Its AMQP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its AMQP URL.
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    /// Its `amqps://` URL with `host` (`localhost` or `127.0.0.1`, whichever name the
    /// test wants the certificate checked against). Panics without a TLS listener.
    pub fn tls_url(&self, host: &str) -> String {
        let port = self
            .tls_port
            .unwrap_or_else(|| panic!("{} has no TLS listener", self.node));
        format!("amqps://guest:guest@{host}:{port}/%2f")
    }

    /// Every client connection: its name (the process's, e.g. `oncely-producer`) and
    /// whether it uses TLS (`rabbitmqctl list_connections client_properties ssl`).
    pub async fn connections(&self) -> Vec<(String, bool)> {
        let out = self
            .ctl(&[
                "list_connections",
                "client_properties",
                "ssl",
                "--formatter",
                "json",
            ])
            .await;
        assert!(
            out.status.success(),
            "list_connections on {}: {}",
            self.node,
            String::from_utf8_lossy(&out.stderr)
        );
        let list: Vec<serde_json::Value> =
            serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
                panic!(
                    "list_connections output ({e}): {}",
                    String::from_utf8_lossy(&out.stdout)
                )
            });
        list.iter()
            .map(|c| {
                let name = connection_name(&c["client_properties"]).unwrap_or_default();
                (name, c["ssl"].as_bool().unwrap_or(false))
            })
            .collect()
    }

    /// Its directory (data, logs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its AMQP URL for `user` (on the default vhost).
    pub fn url_as(&self, user: &str, password: &str) -> String {
        format!("amqp://{user}:{password}@127.0.0.1:{}/%2f", self.port)
    }

    /// The users of the node's client connections right now (`rabbitmqctl
    /// list_connections user`), sorted, without repeats.
    pub async fn connection_users(&self) -> Vec<String> {
        let out = self.ctl(&["list_connections", "user"]).await;
        assert!(
            out.status.success(),
            "list_connections on {}: {}",
            self.node,
            String::from_utf8_lossy(&out.stderr)
        );
        let mut users: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && *l != "user")
            .map(str::to_owned)
            .collect();
        users.sort();
        users.dedup();
        users
    }

    /// Add a user with a password and set its permissions on the default vhost (three
    /// regular expressions: configure, write, read).
    pub async fn add_user(
        &self,
        user: &str,
        password: &str,
        configure: &str,
        write: &str,
        read: &str,
    ) {
        for args in [
            vec!["add_user", user, password],
            vec!["set_permissions", "-p", "/", user, configure, write, read],
        ] {
            let out = self.ctl(&args).await;
            assert!(
                out.status.success(),
                "rabbitmqctl {args:?} on {}: {}",
                self.node,
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    /// Close every client connection (`rabbitmqctl close_all_connections`).
    pub async fn close_all_connections(&self) {
        let out = self
            .ctl(&["close_all_connections", "oncely test: connection fault"])
            .await;
        assert!(
            out.status.success(),
            "close_all_connections on {}: {}",
            self.node,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Stop the node gracefully and start it again on the same data, waiting until it
    /// accepts connections again.
    pub async fn restart(&self) {
        self.stop().await;
        self.boot().await;
    }

    /// Stop the node gracefully (`rabbitmqctl stop <pid file>`, which waits for the
    /// process to end) and wait until its port refuses connections.
    pub async fn stop(&self) {
        let pid_file = self.pid_file();
        let out = self.ctl(&["stop", &pid_file.to_string_lossy()]).await;
        assert!(
            out.status.success(),
            "stopping {}: {}",
            self.node,
            String::from_utf8_lossy(&out.stderr)
        );
        let port = self.port;
        eventually(
            &format!("{} to stop listening", self.node),
            STOP_DEADLINE,
            || async move {
                tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .is_err()
                    .then_some(())
            },
        )
        .await;
    }

    /// Start the node (`rabbitmq-server -detached` with this node's environment) and
    /// wait until it has booted and accepts AMQP connections.
    pub async fn boot(&self) {
        if let Err(e) = self.try_boot().await {
            panic!("{e}");
        }
    }

    /// [`Self::boot`], with a node that started but did not finish booting as an error.
    async fn try_boot(&self) -> Result<(), String> {
        let status = self
            .server_env(Command::new("rabbitmq-server"))
            .arg("-detached")
            .status()
            .await
            .unwrap_or_else(|e| panic!("rabbitmq-server: {e}"));
        assert!(status.success(), "rabbitmq-server -detached: {status}");
        let port = self.port;
        let log = self.dir.join("log").join(format!("{}.log", self.node));
        eventually(
            &format!(
                "{} to accept AMQP connections on {port} (log: {})",
                self.node,
                log.display()
            ),
            BOOT_DEADLINE,
            || async move {
                tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .ok()
                    .map(drop)
            },
        )
        .await;
        let out = self.ctl(&["await_startup", "--timeout", "120"]).await;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "await_startup on {}: {}",
                self.node,
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    fn pid_file(&self) -> PathBuf {
        self.dir.join("pid")
    }

    /// The pid of the node's Erlang VM, if its pid file names a live process that is this
    /// node's VM (checked in its environment).
    fn vm_pid(&self) -> Option<u32> {
        let pid = std::fs::read_to_string(self.pid_file())
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())?;
        let ours = std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
            env.split(|b| *b == 0)
                .any(|var| var == format!("RABBITMQ_NODENAME={}", self.node).as_bytes())
        });
        ours.then_some(pid)
    }

    /// End the node's VM with SIGKILL (no goodbye to clients or peers) and wait until its
    /// port refuses connections. [`PrivateBroker::boot`] starts it again on its data.
    pub async fn kill(&self) {
        let pid = self.vm_pid().unwrap_or_else(|| {
            panic!("{} is not running (no live pid in its pid file)", self.node)
        });
        let status = StdCommand::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .unwrap_or_else(|e| panic!("kill: {e}"));
        assert!(status.success(), "kill -KILL {pid} ({})", self.node);
        let port = self.port;
        eventually(
            &format!("{} to be gone after SIGKILL", self.node),
            STOP_DEADLINE,
            || async move {
                let gone = !std::path::Path::new(&format!("/proc/{pid}")).exists()
                    || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                        .is_ok_and(|s| s.contains(") Z "));
                let refused = tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .is_err();
                (gone && refused).then_some(())
            },
        )
        .await;
    }

    fn server_env(&self, mut cmd: Command) -> Command {
        let d = &self.dir;
        cmd.env("RABBITMQ_NODENAME", &self.node)
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("RABBITMQ_MNESIA_BASE", d.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", d.join("log"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", d.join("enabled_plugins"))
            .env("RABBITMQ_PID_FILE", self.pid_file())
            .env("RABBITMQ_FEATURE_FLAGS_FILE", d.join("feature_flags"))
            .env("RABBITMQ_CONFIG_FILE", d.join("rabbitmq.conf"))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        cmd
    }

    /// Run `rabbitmqctl -q -n <node> ARGS` (on a CLI distribution port of its own).
    pub async fn ctl(&self, args: &[&str]) -> std::process::Output {
        self.cli("rabbitmqctl", args).await
    }

    /// Run `rabbitmq-queues -q -n <node> ARGS`.
    pub async fn queues_ctl(&self, args: &[&str]) -> std::process::Output {
        self.cli("rabbitmq-queues", args).await
    }

    async fn cli(&self, program: &str, args: &[&str]) -> std::process::Output {
        let [cli_port] = free_ports::<1>();
        let cli_port = cli_port.to_string();
        Command::new(program)
            .env("RABBITMQ_CTL_DIST_PORT_MIN", &cli_port)
            .env("RABBITMQ_CTL_DIST_PORT_MAX", &cli_port)
            .arg("-q")
            .arg("-n")
            .arg(&self.node)
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .await
            .unwrap_or_else(|e| panic!("{program}: {e}"))
    }
}

/// The `connection_name` client property, wherever the JSON formatter put it (a
/// `[key, type, value]` triple, or an object).
fn connection_name(props: &serde_json::Value) -> Option<String> {
    match props {
        serde_json::Value::Array(items) => {
            if items.first().and_then(|k| k.as_str()) == Some("connection_name") {
                return items.last().and_then(|v| v.as_str()).map(str::to_owned);
            }
            items.iter().find_map(connection_name)
        }
        serde_json::Value::Object(map) => match map.get("connection_name") {
            Some(v) if v.is_string() => v.as_str().map(str::to_owned),
            _ => map.values().find_map(connection_name),
        },
        _ => None,
    }
}

impl Drop for PrivateBroker {
    fn drop(&mut self) {
        let pid_file = self.pid_file();
        let [cli_port] = free_ports::<1>();
        let cli_port = cli_port.to_string();
        let _ = StdCommand::new("rabbitmqctl")
            .env("RABBITMQ_CTL_DIST_PORT_MIN", &cli_port)
            .env("RABBITMQ_CTL_DIST_PORT_MAX", &cli_port)
            .args(["-q", "-n", &self.node, "stop"])
            .arg(&pid_file)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
        // If the node did not answer (hung, or half-booted), end its VM by its own pid
        // (checked to still be this node's VM).
        if let Some(pid) = self.vm_pid() {
            let _ = StdCommand::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
        if std::thread::panicking() {
            eprintln!("private RabbitMQ logs kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
