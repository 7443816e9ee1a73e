//! A real rate limiter in front of the sandbox: Debian's nginx with `limit_req`, as a
//! provider's API gateway would be. Above `per_second` (with `burst` let through at once,
//! `nodelay`) it answers `429` with `Retry-After` and `{"error":"rate_limited"}`, and the
//! sandbox never sees the request; below it, it proxies to the sandbox (keep-alive).
//!
//! Its access log has one line per request: nginx's clock when it answered (`$msec`,
//! seconds with milliseconds), the status and the idempotency key — what the tests read
//! to check that the fleet stayed under the limit and how often it was refused.

use crate::{StartFailed, free_port, on_free_ports, unique_name};
use std::path::PathBuf;
use std::process::Child;
use std::time::Duration;

/// One logged request.
#[derive(Debug, Clone, PartialEq)]
pub struct Logged {
    /// When nginx answered (seconds since the epoch, millisecond resolution).
    pub at: f64,
    /// The status it answered.
    pub status: u16,
    /// The idempotency key (`-` when absent).
    pub key: String,
}

/// A running nginx rate limiter.
#[derive(Debug)]
pub struct RateLimiter {
    child: Child,
    dir: PathBuf,
    /// `http://127.0.0.1:PORT`: the limited front of the sandbox.
    pub base_url: String,
    /// The limit.
    pub per_second: u32,
    /// The burst let through at once.
    pub burst: u32,
}

impl RateLimiter {
    /// Start one in front of `upstream` (`http://127.0.0.1:PORT`, the sandbox).
    pub async fn start(upstream: &str, per_second: u32, burst: u32, retry_after: u32) -> Self {
        on_free_ports("nginx rate limiter", || async {
            let mut me = Self::spawn(upstream, per_second, burst, retry_after);
            match me.started().await {
                Ok(()) => Ok(me),
                Err(e) if e.contains("Address already in use") => Err(StartFailed::PortTaken(e)),
                Err(e) => Err(StartFailed::Other(format!("{e} ({})", me.dir.display()))),
            }
        })
        .await
    }

    fn spawn(upstream: &str, per_second: u32, burst: u32, retry_after: u32) -> Self {
        let dir = std::env::temp_dir().join(unique_name("nginx-limit"));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let port = free_port();
        let upstream = upstream.trim_start_matches("http://");
        // One zone for every client (the key is the listener's port): the provider's
        // limit is for its whole customer, not per connection.
        let config = format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\npid nginx.pid;\n\
             error_log error.log warn;\nevents {{ worker_connections 1024; }}\n\
             http {{\n  \
               log_format oncely '$msec $status $http_idempotency_key';\n  \
               access_log access.log oncely;\n  \
               client_body_temp_path body;\n  proxy_temp_path proxy;\n  fastcgi_temp_path fastcgi;\n  \
               uwsgi_temp_path uwsgi;\n  scgi_temp_path scgi;\n  \
               limit_req_zone $server_port zone=provider:1m rate={per_second}r/s;\n  \
               upstream sandbox {{ server {upstream}; keepalive 64; }}\n  \
               server {{\n    listen 127.0.0.1:{port};\n    \
                 location / {{\n      limit_req zone=provider burst={burst} nodelay;\n      \
                   limit_req_status 429;\n      \
                   proxy_pass http://sandbox;\n      proxy_http_version 1.1;\n      \
                   proxy_set_header Connection \"\";\n    }}\n    \
                 error_page 429 = @throttled;\n    \
                 location @throttled {{\n      default_type application/json;\n      \
                   add_header Retry-After {retry_after} always;\n      \
                   return 429 '{{\"error\": \"rate_limited\"}}';\n    }}\n  }}\n}}\n",
        );
        let child = crate::nginx::launch(&dir, &config);
        RateLimiter {
            child,
            base_url: format!("http://127.0.0.1:{port}"),
            dir,
            per_second,
            burst,
        }
    }

    /// Waits for the pid file (written after every listener is bound) or the exit.
    async fn started(&mut self) -> Result<(), String> {
        crate::nginx::started(&mut self.child, &self.dir).await
    }

    /// Every request logged so far, in the order nginx answered them.
    pub fn requests(&self) -> Vec<Logged> {
        let text = std::fs::read_to_string(self.dir.join("access.log")).unwrap_or_default();
        text.lines()
            .map(|line| {
                let f: Vec<&str> = line.split(' ').collect();
                assert_eq!(f.len(), 3, "an access.log line: {line:?}");
                Logged {
                    at: f[0].parse().unwrap_or_else(|e| panic!("{line:?}: {e}")),
                    status: f[1].parse().unwrap_or_else(|e| panic!("{line:?}: {e}")),
                    key: f[2].to_owned(),
                }
            })
            .collect()
    }

    /// The most requests nginx let through (not 429) within any `window`: what the
    /// provider behind it saw at its busiest.
    pub fn busiest(&self, window: Duration) -> usize {
        let mut passed: Vec<f64> = self
            .requests()
            .into_iter()
            .filter(|l| l.status != 429)
            .map(|l| l.at)
            .collect();
        passed.sort_by(f64::total_cmp);
        let w = window.as_secs_f64();
        let mut most = 0;
        let mut start = 0;
        for end in 0..passed.len() {
            while passed[end] - passed[start] >= w {
                start += 1;
            }
            most = most.max(end - start + 1);
        }
        most
    }
}

impl Drop for RateLimiter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
