//! A keep-alive HTTP/1.1 connection for JSON requests, for the programs that drive
//! oncely over HTTP in tests, the demo and the bench (the gateway's API). One request
//! at a time per connection; open several for concurrency. Reconnects when the
//! connection closed.

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use std::net::SocketAddr;

/// An answer.
#[derive(Debug)]
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// The headers.
    pub headers: hyper::HeaderMap,
    /// The body, parsed as JSON — or, for an event stream, the first `data:` line that
    /// is a JSON-RPC answer; `Null` when neither.
    pub json: Value,
}

impl Answer {
    /// The error code of a gateway error answer (`""` when none).
    pub fn code(&self) -> &str {
        self.json["error"]["code"].as_str().unwrap_or("")
    }
}

/// One connection to `addr`, sending `Authorization: Bearer <token>` when given.
#[derive(Debug)]
pub struct Conn {
    addr: SocketAddr,
    token: Option<String>,
    sender: SendRequest<Full<Bytes>>,
}

impl Conn {
    /// Connect.
    pub async fn connect(addr: SocketAddr, token: Option<&str>) -> anyhow::Result<Conn> {
        Ok(Conn {
            addr,
            token: token.map(str::to_owned),
            sender: handshake(addr).await?,
        })
    }

    /// `POST path` with a JSON body.
    pub async fn post(
        &mut self,
        path: &str,
        body: &Value,
        headers: &[(&str, &str)],
    ) -> anyhow::Result<Answer> {
        self.request("POST", path, headers, body.to_string().into_bytes())
            .await
    }

    /// `GET path`.
    pub async fn get(&mut self, path: &str) -> anyhow::Result<Answer> {
        self.request("GET", path, &[], Vec::new()).await
    }

    /// Any request; the body is sent as `application/json`.
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> anyhow::Result<Answer> {
        if self.sender.ready().await.is_err() {
            self.sender = handshake(self.addr).await?;
        }
        let mut b = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", self.addr.to_string())
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if let Some(t) = &self.token {
            b = b.header("authorization", format!("Bearer {t}"));
        }
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let res = self
            .sender
            .send_request(b.body(Full::new(Bytes::from(body)))?)
            .await?;
        let (status, headers) = (res.status().as_u16(), res.headers().clone());
        let bytes = res.into_body().collect().await?.to_bytes();
        Ok(Answer {
            status,
            headers,
            json: parse(&bytes),
        })
    }
}

/// JSON, or the JSON-RPC answer inside an event stream.
fn parse(bytes: &[u8]) -> Value {
    if let Ok(v) = serde_json::from_slice(bytes) {
        return v;
    }
    String::from_utf8_lossy(bytes)
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(|v| v.get("result").is_some() || v.get("error").is_some())
        .unwrap_or(Value::Null)
}

async fn handshake(addr: SocketAddr) -> anyhow::Result<SendRequest<Full<Bytes>>> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_stream_yields_its_json_rpc_answer() {
        let sse = b"id: 0\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"ok\":true}}\n\n";
        assert_eq!(parse(sse)["result"]["ok"], Value::Bool(true));
        assert_eq!(parse(b"{\"a\":1}")["a"], 1);
        assert_eq!(parse(b"not json"), Value::Null);
    }
}
