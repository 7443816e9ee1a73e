//! A client for the sandbox's control API (`/control/*`).
//!
//! Why a hand-rolled hyper client: tests in other crates need to set faults
//! and read effect counts without pulling an HTTP client crate into the
//! workspace; one HTTP/1 connection per call over a `TcpStream` is plenty.

use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::net::TcpStream;

use crate::effects::{EffectCount, Effects};
use crate::faults::Faults;

/// Upper bound on one control call, so a wedged server fails a test instead of hanging it.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Percent-encodes a query value (everything but RFC 3986 unreserved characters).
pub fn percent_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Control API client; cheap to create, one connection per call.
#[derive(Debug, Clone)]
pub struct Client {
    /// `host:port`, as given in the base URL.
    authority: String,
}

impl Client {
    /// A client for `http://host:port` (a trailing `/` is fine).
    pub fn new(base_url: &str) -> Self {
        let authority = base_url
            .trim()
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned();
        Client { authority }
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> anyhow::Result<(StatusCode, Bytes)> {
        let what = format!("{method} {path}");
        tokio::time::timeout(CALL_TIMEOUT, self.call_inner(method, path, body))
            .await
            .map_err(|_| anyhow!("{what}: no answer within {CALL_TIMEOUT:?}"))?
            .with_context(|| format!("sandbox control call {what}"))
    }

    async fn call_inner(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> anyhow::Result<(StatusCode, Bytes)> {
        let stream = TcpStream::connect(&self.authority)
            .await
            .with_context(|| format!("connecting to {}", self.authority))?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        let driver = tokio::spawn(conn);
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, &self.authority);
        if body.is_some() {
            req = req.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        let req = req.body(Full::new(Bytes::from(body.unwrap_or_default())))?;
        let resp = sender.send_request(req).await?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await?.to_bytes();
        drop(sender);
        let _ = driver.await;
        Ok((status, bytes))
    }

    async fn json<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> anyhow::Result<T> {
        let (status, bytes) = self.call(method.clone(), path, body).await?;
        if !status.is_success() {
            bail!(
                "{method} {path}: {status}: {}",
                String::from_utf8_lossy(&bytes)
            );
        }
        serde_json::from_slice(&bytes)
            .with_context(|| format!("{method} {path}: decoding the answer"))
    }

    /// Installs a fault config (`PUT /control/faults`); the server's 400
    /// message, which names the bad field, becomes the error.
    pub async fn set_faults(&self, faults: &Faults) -> anyhow::Result<()> {
        let body = serde_json::to_vec(faults)?;
        let _: Value = self
            .json(Method::PUT, "/control/faults", Some(body))
            .await?;
        Ok(())
    }

    /// Installs a fault config given as raw JSON (for configs Rust types cannot express).
    pub async fn set_faults_json(&self, faults: &Value) -> anyhow::Result<()> {
        let body = serde_json::to_vec(faults)?;
        let _: Value = self
            .json(Method::PUT, "/control/faults", Some(body))
            .await?;
        Ok(())
    }

    /// The current fault config.
    pub async fn faults(&self) -> anyhow::Result<Faults> {
        self.json(Method::GET, "/control/faults", None).await
    }

    /// The whole effect ledger.
    pub async fn effects(&self) -> anyhow::Result<Effects> {
        self.json(Method::GET, "/control/effects", None).await
    }

    /// How many times the effect for `key` really happened (0 when never).
    pub async fn effect_count(&self, key: &str) -> anyhow::Result<u64> {
        let path = format!("/control/effects?key={}", percent_encode(key));
        let c: EffectCount = self.json(Method::GET, &path, None).await?;
        Ok(c.count)
    }

    /// The counters (`GET /control/stats`); decode into [`crate::Stats`] if wanted.
    pub async fn stats(&self) -> anyhow::Result<Value> {
        self.json(Method::GET, "/control/stats", None).await
    }

    /// Clears records, effects, stats and faults.
    pub async fn reset(&self) -> anyhow::Result<()> {
        let _: Value = self.json(Method::POST, "/control/reset", None).await?;
        Ok(())
    }

    /// `GET /healthz` answered 200.
    pub async fn healthy(&self) -> anyhow::Result<()> {
        let (status, _) = self.call(Method::GET, "/healthz", None).await?;
        if status != StatusCode::OK {
            bail!("GET /healthz: {status}");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_reserved_characters() {
        assert_eq!(percent_encode("intent:42:bank"), "intent%3A42%3Abank");
        assert_eq!(percent_encode("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
        assert_eq!(percent_encode("Az09-._~"), "Az09-._~");
    }

    #[test]
    fn base_url_forms() {
        assert_eq!(
            Client::new("http://127.0.0.1:8085/").authority,
            "127.0.0.1:8085"
        );
        assert_eq!(Client::new("127.0.0.1:1").authority, "127.0.0.1:1");
    }
}
