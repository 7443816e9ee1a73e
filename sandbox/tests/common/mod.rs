//! Shared helpers for the sandbox's integration tests: a bare HTTP/1 client
//! (so tests see exactly what a worker would: statuses, headers, connection
//! errors) and a poll-until helper (tests never sleep to wait for a condition).

#![allow(dead_code)]

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper::{HeaderMap, Method, Request};
use hyper_util::rt::TokioIo;
use oncely_sandbox::{Provider, Sandbox};
use serde_json::Value;
use tokio::net::TcpStream;

/// A response as a client sees it.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Value,
}

impl Resp {
    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }
}

pub async fn start() -> Sandbox {
    oncely_sandbox::spawn("127.0.0.1:0".parse().unwrap())
        .await
        .expect("sandbox starts")
}

/// One request on a fresh connection; `Err` is a transport error (no response).
pub async fn send(
    addr: SocketAddr,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Result<Resp, hyper::Error> {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Full::new(Bytes::from(body.unwrap_or("").to_owned())))
        .unwrap();
    let resp = sender.send_request(req).await?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let bytes = resp.into_body().collect().await?.to_bytes();
    let body = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    Ok(Resp {
        status,
        headers,
        body,
    })
}

/// `POST /v1/<resource>` with `key` and a JSON body.
pub async fn execute_raw(
    sb: &Sandbox,
    provider: Provider,
    key: &str,
    body: &Value,
) -> Result<Resp, hyper::Error> {
    let body = body.to_string();
    send(
        sb.addr(),
        Method::POST,
        &provider.path(),
        &[
            ("idempotency-key", key),
            ("content-type", "application/json"),
        ],
        Some(&body),
    )
    .await
}

/// Like [`execute_raw`], but a transport error fails the test.
pub async fn execute(sb: &Sandbox, provider: Provider, key: &str, body: &Value) -> Resp {
    execute_raw(sb, provider, key, body)
        .await
        .expect("execute gets an answer")
}

/// `GET /v1/<resource>?<query>` (query already encoded).
pub async fn lookup(sb: &Sandbox, provider: Provider, query: &str) -> Resp {
    let path = format!("{}?{query}", provider.path());
    send(sb.addr(), Method::GET, &path, &[], None)
        .await
        .expect("lookup gets an answer")
}

pub async fn lookup_key(sb: &Sandbox, provider: Provider, key: &str) -> Resp {
    let q = format!(
        "idempotency_key={}",
        oncely_sandbox::control::percent_encode(key)
    );
    lookup(sb, provider, &q).await
}

/// Polls `check` every few milliseconds until it yields `Some`, failing after 10 s.
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
