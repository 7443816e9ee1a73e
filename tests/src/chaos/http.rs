//! A bare HTTP/1.1 client for the sandbox's provider API. The checks read the provider's
//! own records through it, independently of the worker's adapter under test, and the
//! self-test forges effects with it.

use serde_json::Value;
use std::fmt::Write as _;
use std::time::Duration;

/// A bare HTTP/1.1 GET (the sandbox's lookup API, read independently of the adapter
/// under test): status and JSON body.
pub(super) async fn http_get(
    addr: std::net::SocketAddr,
    path: &str,
) -> anyhow::Result<(u16, Value)> {
    http(addr, "GET", path, None).await
}

/// A bare HTTP/1.1 request; `post`: (idempotency key, JSON body).
pub(super) async fn http(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    post: Option<(&str, &Value)>,
) -> anyhow::Result<(u16, Value)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some((key, body)) = post {
        let body = body.to_string();
        let _ = write!(
            req,
            "Idempotency-Key: {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
    } else {
        req.push_str("\r\n");
    }
    stream.write_all(req.as_bytes()).await?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut buf)).await??;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow::anyhow!("no HTTP header in {} bytes", buf.len()))?;
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no status line"))?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Ok((status, serde_json::from_str(&body).unwrap_or(Value::Null)))
}

/// A chunked body's data: chunks are "<hex size>\r\n<data>\r\n" … "0\r\n\r\n".
fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}
