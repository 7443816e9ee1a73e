//! A private nginx standing in for a provider's HTTP front (Debian's `nginx`): a
//! real HTTP/2 server, over TLS (ALPN `h2`) and without (h2c, prior knowledge), and the
//! same over HTTP/1.1 only, so the HTTP adapter's `http2` switch is checked against a
//! server that is not oncely's own.
//!
//! Every listener answers any request with `200 {"id": "po_<request id>", "status":
//! "succeeded"}` (the built-in `bank` provider's mapping reads that as succeeded) and
//! logs one line per request to `access.log`: the listener's port, the protocol
//! (`HTTP/2.0`, `HTTP/1.1`), the connection's serial number, the method, the path and the
//! idempotency-key header — what the tests assert on. One process (`master_process off`, in the foreground), its own
//! directory and free ports; dropping it kills it.

use crate::tls::TestCa;
use crate::{StartFailed, eventually, free_port, on_free_ports, unique_name, within};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// One logged request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Logged {
    /// The listener's port.
    pub port: u16,
    /// `HTTP/2.0` or `HTTP/1.1`.
    pub protocol: String,
    /// nginx's connection serial number: requests on one connection share it.
    pub connection: u64,
    /// The method.
    pub method: String,
    /// The path.
    pub path: String,
    /// The `Idempotency-Key` header (`-` when absent).
    pub key: String,
}

/// A running private nginx.
#[derive(Debug)]
pub struct Nginx {
    child: Child,
    dir: PathBuf,
    /// `https://localhost:PORT`, offering `h2` and `http/1.1` in the handshake.
    pub tls_h2: String,
    /// `https://localhost:PORT`, HTTP/1.1 only (no `h2` in its ALPN).
    pub tls_h1: String,
    /// `http://127.0.0.1:PORT`, HTTP/2 by prior knowledge (h2c) only.
    pub h2c: String,
    /// `http://127.0.0.1:PORT`, HTTP/1.1 only.
    pub plain_h1: String,
}

/// Debian installs it in /usr/sbin, which a non-root user's `PATH` may lack.
fn program() -> &'static str {
    if Path::new("/usr/sbin/nginx").exists() {
        "/usr/sbin/nginx"
    } else {
        "nginx"
    }
}

impl Nginx {
    /// Start one with a certificate for `localhost` from `ca`.
    ///
    /// Its ports are chosen free and released for nginx to bind ([`on_free_ports`]: when
    /// one was taken, nginx exits "Address already in use", and a new one is started).
    pub async fn start(ca: &TestCa) -> Nginx {
        on_free_ports("nginx", || async {
            let mut me = Self::spawn(ca);
            match me.started().await {
                Ok(()) => Ok(me),
                Err(e) if e.contains("Address already in use") => Err(StartFailed::PortTaken(e)),
                Err(e) => Err(StartFailed::Other(format!("{e} ({})", me.dir.display()))),
            }
        })
        .await
    }

    /// Waits until nginx has written its pid file — after it bound every listener — or
    /// has exited (`Err`: what it logged).
    async fn started(&mut self) -> Result<(), String> {
        started(&mut self.child, &self.dir).await?;
        for base in [&self.tls_h2, &self.tls_h1, &self.h2c, &self.plain_h1] {
            let port = port_of(base);
            eventually(
                &format!("nginx to listen on {port} ({})", self.dir.display()),
                Duration::from_secs(30),
                || async move {
                    tokio::net::TcpStream::connect(("127.0.0.1", port))
                        .await
                        .ok()
                        .map(|_| ())
                },
            )
            .await;
        }
        Ok(())
    }

    /// A new nginx on ports free right now.
    fn spawn(ca: &TestCa) -> Nginx {
        let dir = std::env::temp_dir().join(unique_name("nginx"));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let (cert, key) = ca.server_pem(&["localhost"]);
        std::fs::write(dir.join("server.pem"), cert).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(dir.join("server.key"), key).unwrap_or_else(|e| panic!("{e}"));
        let ports = [free_port(), free_port(), free_port(), free_port()];
        let answer = "location / {\n      default_type application/json;\n      \
                      return 200 '{\"id\": \"po_$request_id\", \"status\": \"succeeded\"}';\n    }";
        let tls = "ssl_certificate server.pem;\n    ssl_certificate_key server.key;";
        let config = format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\npid nginx.pid;\n\
             error_log error.log info;\nevents {{ worker_connections 1024; }}\n\
             http {{\n  \
               log_format oncely '$server_port $server_protocol $connection $request_method $uri $http_idempotency_key';\n  \
               access_log access.log oncely;\n  \
               client_body_temp_path body;\n  proxy_temp_path proxy;\n  fastcgi_temp_path fastcgi;\n  \
               uwsgi_temp_path uwsgi;\n  scgi_temp_path scgi;\n  \
               http2_max_concurrent_streams 256;\n  \
               server {{\n    listen 127.0.0.1:{p0} ssl http2;\n    {tls}\n    {answer}\n  }}\n  \
               server {{\n    listen 127.0.0.1:{p1} ssl;\n    {tls}\n    {answer}\n  }}\n  \
               server {{\n    listen 127.0.0.1:{p2} http2;\n    {answer}\n  }}\n  \
               server {{\n    listen 127.0.0.1:{p3};\n    {answer}\n  }}\n}}\n",
            p0 = ports[0],
            p1 = ports[1],
            p2 = ports[2],
            p3 = ports[3],
        );
        let child = launch(&dir, &config);
        Nginx {
            child,
            tls_h2: format!("https://localhost:{}", ports[0]),
            tls_h1: format!("https://localhost:{}", ports[1]),
            h2c: format!("http://127.0.0.1:{}", ports[2]),
            plain_h1: format!("http://127.0.0.1:{}", ports[3]),
            dir,
        }
    }

    /// Every request the listener of `base_url` logged so far (nginx writes a line when
    /// it has answered).
    pub fn requests(&self, base_url: &str) -> Vec<Logged> {
        let port = port_of(base_url);
        let text = std::fs::read_to_string(self.dir.join("access.log")).unwrap_or_default();
        text.lines()
            .map(|line| {
                let f: Vec<&str> = line.split(' ').collect();
                assert_eq!(f.len(), 6, "an access.log line: {line:?}");
                Logged {
                    port: f[0].parse().unwrap_or_else(|e| panic!("{line:?}: {e}")),
                    protocol: f[1].to_owned(),
                    connection: f[2].parse().unwrap_or_else(|e| panic!("{line:?}: {e}")),
                    method: f[3].to_owned(),
                    path: f[4].to_owned(),
                    key: f[5].to_owned(),
                }
            })
            .filter(|l| l.port == port)
            .collect()
    }
}

/// Write `config` into `dir` and start nginx on it, in the foreground, its output in
/// `stderr.log` (shared with [`crate::rate_limiter`]).
pub(crate) fn launch(dir: &Path, config: &str) -> Child {
    std::fs::write(dir.join("nginx.conf"), config).unwrap_or_else(|e| panic!("{e}"));
    let log = std::fs::File::create(dir.join("stderr.log")).unwrap_or_else(|e| panic!("{e}"));
    Command::new(program())
        .arg("-p")
        .arg(dir)
        .arg("-c")
        .arg(dir.join("nginx.conf"))
        .arg("-e")
        .arg(dir.join("error.log"))
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap_or_else(|e| panic!("{e}")))
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("nginx (Debian package nginx): {e}"))
}

/// Waits until nginx has written its pid file — after it bound every listener — or has
/// exited (`Err`: what it logged).
pub(crate) async fn started(child: &mut Child, dir: &Path) -> Result<(), String> {
    let came_up = within(Duration::from_secs(30), || {
        let up = match child.try_wait() {
            Err(e) => Some(Err(e.to_string())),
            Ok(Some(status)) => {
                let log = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
                let logs = format!("{}{}", log("error.log"), log("stderr.log"));
                Some(Err(format!("{status}: {logs}")))
            }
            Ok(None) => dir.join("nginx.pid").exists().then_some(Ok(())),
        };
        std::future::ready(up)
    });
    came_up
        .await
        .unwrap_or(Err("no pid file after 30 s".into()))
}

/// The port at the end of `base_url`.
fn port_of(base_url: &str) -> u16 {
    base_url
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("a port in {base_url}"))
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
