//! `localstripe` (PyPI: a stateful fake Stripe server none of us wrote), started for one
//! test from the tests' Python venv (`scripts/test` installs it from
//! `tests/python/requirements.txt`), killed when dropped. Plus the few raw HTTP/1.0 calls
//! the tests make to it themselves: a card payment method to pay with, and the list of
//! payment intents — its ground truth of what was charged.

use serde_json::Value;
use std::time::Duration;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::process::{Child, Command};

/// A running localstripe.
#[derive(Debug)]
pub struct Localstripe {
    child: Child,
    port: u16,
    /// The secret key the tests send (localstripe accepts any `sk_test_…`).
    pub secret_key: String,
}

impl Localstripe {
    /// Starts it on a free port and waits until it answers.
    pub async fn start() -> Localstripe {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or_else(|e| panic!("free port: {e}"));
        let child = Command::new(crate::python())
            // It reloads /tmp/localstripe.pickle (every earlier run's objects) unless told.
            .args([
                "-m",
                "localstripe",
                "--from-scratch",
                "--port",
                &port.to_string(),
            ])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("starting localstripe (scripts/test installs it): {e}"));
        let ls = Localstripe {
            child,
            port,
            secret_key: "sk_test_oncely_localstripe".into(),
        };
        crate::eventually("localstripe answers", Duration::from_secs(60), || async {
            ls.call("GET", "/v1/payment_intents?limit=1", "")
                .await
                .ok()
                .filter(|(status, _)| *status == 200)
        })
        .await;
        ls
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Whether the process still runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// One HTTP/1.0 call with the secret key: (status, JSON body).
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        form: &str,
    ) -> std::io::Result<(u16, Value)> {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await?;
        let request = format!(
            "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {}\r\n\
             Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{form}",
            self.secret_key,
            form.len()
        );
        stream.write_all(request.as_bytes()).await?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await?;
        let text = String::from_utf8_lossy(&raw);
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        Ok((status, serde_json::from_str(body).unwrap_or(Value::Null)))
    }

    /// A card payment method (Visa test number) to pay with; its id.
    pub async fn card(&self) -> String {
        let form = "type=card&card%5Bnumber%5D=4242424242424242&card%5Bexp_month%5D=12\
                    &card%5Bexp_year%5D=2030&card%5Bcvc%5D=123";
        let (status, body) = self
            .call("POST", "/v1/payment_methods", form)
            .await
            .unwrap_or_else(|e| panic!("localstripe: {e}"));
        assert_eq!(status, 200, "creating a payment method: {body}");
        body["id"].as_str().unwrap_or_default().to_owned()
    }

    /// Every payment intent it holds.
    pub async fn payment_intents(&self) -> Vec<Value> {
        let (status, body) = self
            .call("GET", "/v1/payment_intents?limit=100", "")
            .await
            .unwrap_or_else(|e| panic!("localstripe: {e}"));
        assert_eq!(status, 200, "listing payment intents: {body}");
        assert_eq!(body["has_more"], Value::Bool(false), "more than 100");
        body["data"].as_array().cloned().unwrap_or_default()
    }
}
