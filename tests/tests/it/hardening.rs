//! Issue 43: the front door under hostile traffic and the hot path's remaining risks.
//! Each test here failed on the code before its fix (the failures are quoted in the
//! issue's note).

use oncely_sandbox::http::Conn;
use oncely_tests::fleet::{Fleet, FleetOptions};
use oncely_tests::gateway::{Gateway, TOKEN_A, with_email_schema};
use std::net::SocketAddr;

async fn fleet() -> Fleet {
    Fleet::with(FleetOptions {
        configure: Some(with_email_schema),
        ..FleetOptions::default()
    })
    .await
}

/// A small deterministic generator (xorshift64*): the same hostile traffic every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn token(&mut self, alphabet: &[u8], len: usize) -> String {
        (0..len)
            .map(|_| alphabet[(self.next() % alphabet.len() as u64) as usize] as char)
            .collect()
    }
}

fn gateway_series(metrics: &str) -> usize {
    metrics
        .lines()
        .filter(|l| l.starts_with("oncely_gateway_"))
        .count()
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Unauthenticated requests with made-up methods, paths and headers: `n` of them over 8
/// connections.
async fn hostile(port: u16, rng: &mut Rng, n: usize) {
    const UPPER: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    const PATH: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789-._~%2F";
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut conns = Vec::new();
    for _ in 0..8 {
        conns.push(Conn::connect(addr, None).await.expect("connect"));
    }
    for i in 0..n {
        let method = match rng.next() % 4 {
            0 => "GET".to_owned(),
            1 => "POST".to_owned(),
            _ => {
                let len = 3 + (rng.next() % 6) as usize;
                rng.token(UPPER, len)
            }
        };
        let path = match rng.next() % 3 {
            0 => format!("/v1/actions/{}", rng.token(PATH, 12)),
            1 => format!("/{}", rng.token(PATH, 20)),
            _ => "/v1/actions/email.send".to_owned(),
        };
        let (hname, hvalue) = (
            format!("x-{}", rng.token(b"abcdefgh", 8)),
            rng.token(UPPER, 16),
        );
        let conn = &mut conns[i % 8];
        // An answer or a closed connection: either is fine; the next request reconnects.
        let _ = conn
            .request(&method, &path, &[(&hname, &hvalue)], b"{}".to_vec())
            .await;
    }
}

/// 10,000 unauthenticated requests with random methods, paths and headers leave the
/// gateway's metric series and its memory flat. Before the fix the request method was a
/// label: every made-up method was a new series, kept forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_unauthenticated_traffic_leaves_metrics_and_memory_flat() {
    let fleet = fleet().await;
    let gw = Gateway::start(&fleet, &[TOKEN_A]).await;
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    // Warm up: every route, status and method class the traffic can reach, and the
    // allocator's arenas.
    hostile(gw.port, &mut rng, 2_000).await;
    let metrics = oncely_tests::http_get(gw.ops_port, "/metrics")
        .await
        .expect("metrics");
    let (series, rss) = (gateway_series(&metrics), rss_kib(gw.proc.pid()));
    hostile(gw.port, &mut rng, 10_000).await;
    let metrics = oncely_tests::http_get(gw.ops_port, "/metrics")
        .await
        .expect("metrics");
    let (series_after, rss_after) = (gateway_series(&metrics), rss_kib(gw.proc.pid()));
    println!(
        "gateway series {series} → {series_after}; RSS {rss} KiB → {rss_after} KiB after 10,000 hostile requests"
    );
    assert_eq!(
        series, series_after,
        "new metric series from unauthenticated traffic:\n{metrics}"
    );
    assert!(
        rss_after < rss + 8 * 1024,
        "the gateway's RSS grew from {rss} KiB to {rss_after} KiB"
    );
}

/// `oncely-worker run` without a key secret: before, it only warned and then accepted any
/// well-formed key (forged intents from anyone who can publish to the queue). Now it
/// refuses to start, naming the variables and the flag; the loudly named flag starts it
/// with an error-level line saying what it gives up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_without_a_key_secret_refuses_to_start() {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let fleet = Fleet::new().await;
    let worker = |extra: &[&str]| {
        let mut c = tokio::process::Command::new(oncely_tests::fleet::binary("oncely-worker"));
        c.arg("--config")
            .arg(&fleet.config_path)
            .arg("run")
            .args(extra)
            .env_remove("ONCELY_KEY_SECRET")
            .env_remove("ONCELY_KEY_SECRET_FILE")
            .env_remove("ONCELY_KEY_SECRETS_FILE")
            .env("ONCELY_LOG_FORMAT", "json")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        c
    };
    let out = tokio::time::timeout(std::time::Duration::from_secs(60), worker(&[]).output())
        .await
        .expect("the worker exits by itself")
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started without a secret: {err}");
    assert!(
        err.contains("ONCELY_KEY_SECRET_FILE") && err.contains("--insecure-accept-unverified-keys"),
        "{err}"
    );
    let mut insecure = worker(&["--insecure-accept-unverified-keys"])
        .spawn()
        .expect("spawn");
    let mut lines = BufReader::new(insecure.stderr.take().expect("stderr")).lines();
    let said = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        while let Ok(Some(l)) = lines.next_line().await {
            if l.contains("INSECURE") && l.contains("\"ERROR\"") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(said, Ok(true), "no error-level INSECURE line");
    assert!(
        insecure.try_wait().expect("wait").is_none(),
        "it should run"
    );
}

/// One raw HTTP/1.1 exchange (`Connection: close`): the head of the answer.
async fn raw_head(port: u16, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    s.write_all(request.as_bytes()).await.expect("write");
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.expect("read");
    let text = String::from_utf8_lossy(&buf).into_owned();
    text.split("\r\n\r\n").next().unwrap_or_default().to_owned()
}

/// The desk's session cookie is `__Host-` (Secure, `Path=/`, no Domain: a sibling
/// subdomain or a plain-HTTP page cannot plant or overwrite it) and its pages say HSTS.
/// Before: `oncely_desk=…; Path=/desk; …; Secure`, no `Strict-Transport-Security`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_desk_cookie_is_host_prefixed_and_pages_say_hsts() {
    let fleet = fleet().await;
    let reviewers = fleet.dir.join("reviewers.toml");
    std::fs::write(
        &reviewers,
        format!(
            "[[reviewer]]\nid = \"alice\"\nsha256 = \"{}\"\nrole = \"decide\"\n",
            oncely_gateway::tokens::hash_hex("ocr_alice-decides")
        ),
    )
    .expect("reviewers file");
    let reviewers = reviewers.to_string_lossy().into_owned();
    let gw = Gateway::start_with(
        &fleet,
        &[TOKEN_A],
        &[],
        &["--desk-reviewers-file", &reviewers],
    )
    .await;
    let form = "token=ocr_alice-decides";
    let head = raw_head(
        gw.port,
        &format!(
            "POST /desk/login HTTP/1.1\r\nHost: 127.0.0.1:{p}\r\nOrigin: http://127.0.0.1:{p}\r\n\
             Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{form}",
            form.len(),
            p = gw.port
        ),
    )
    .await;
    let lower = head.to_ascii_lowercase();
    let cookie = lower
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .unwrap_or_else(|| panic!("no cookie:\n{head}"));
    assert!(
        cookie.starts_with("__host-oncely_desk=")
            && cookie.contains("path=/;")
            && cookie.contains("secure")
            && !cookie.contains("domain="),
        "{head}"
    );
    assert!(
        lower.contains("strict-transport-security: max-age=31536000"),
        "{head}"
    );
}

/// Consumers of `queue` (passive declare on a fresh channel: a missing queue closes it).
async fn consumers_of(fleet: &Fleet, queue: &str) -> Option<u32> {
    let ch = fleet.conn.create_channel().await.ok()?;
    let q = ch
        .queue_declare(
            queue.into(),
            lapin::options::QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            lapin::types::FieldTable::default(),
        )
        .await
        .ok()?;
    let _ = ch.close(200, "done".into()).await;
    Some(q.consumer_count())
}

/// A consumer whose stream ends (here: its queue deleted, as docs/operations.md tells
/// operators to do with a quorum queue that answers 541) ended that action type silently
/// before: the worker's other consumers kept the session alive, nothing consumed the
/// queue again. Now the session starts again, declares the queue and consumes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_that_ends_restarts_the_session_instead_of_going_quiet() {
    use oncely_tests::eventually;
    use std::time::Duration;
    let fleet = Fleet::new().await;
    let _w = fleet.worker();
    let queue = fleet.topology().action_queue("ticket.create");
    eventually("the worker consumes", Duration::from_secs(30), || async {
        consumers_of(&fleet, &queue).await.filter(|n| *n >= 1)
    })
    .await;
    fleet
        .channel
        .queue_delete(queue.as_str().into(), Default::default())
        .await
        .expect("delete");
    eventually(
        "the worker declares the queue again and consumes it",
        Duration::from_secs(30),
        || async { consumers_of(&fleet, &queue).await.filter(|n| *n >= 1) },
    )
    .await;
    let producer = fleet.producer().await;
    producer
        .enqueue(oncely_tests::sample_intent("ticket.create", 1))
        .await
        .expect("enqueue");
    eventually("the ticket is created", Duration::from_secs(30), || async {
        (fleet.count("succeeded").await == 1).then_some(())
    })
    .await;
}

/// Workers take messages of at most 4 KiB here (the HTTP body limit stays 64 KiB).
fn with_small_messages(config: &mut oncely_core::config::Config) {
    with_email_schema(config);
    config.worker.max_message_bytes = 4096;
}

/// A body the gateway accepts can grow when it is written back as the envelope (`9e15`
/// is `9000000000000000.0`). Before: `202`, recorded `planned`, dead-lettered `too_large`
/// by every worker and republished by the sweeper forever. Now `413 payload_too_large`
/// and nothing recorded. MCP bodies had rmcp's 4 MiB limit instead of `--max-body-bytes`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_that_grow_past_the_message_limit_are_refused_before_recording() {
    let fleet = Fleet::with(FleetOptions {
        configure: Some(with_small_messages),
        ..FleetOptions::default()
    })
    .await;
    let gw = Gateway::start(&fleet, &[TOKEN_A]).await;
    let mut agent = gw.client(TOKEN_A.token).await;
    let numbers = vec!["9e15"; 300].join(",");
    let body = format!(
        r#"{{"workflow_id":"w","step":"s","business_object":"o","revision":1,"payload":{{"title":"t","n":[{numbers}]}}}}"#
    );
    assert!(
        body.len() < 4096,
        "the body itself is small: {}",
        body.len()
    );
    let r = agent
        .request("POST", "/v1/actions/ticket.create", &[], body.into_bytes())
        .await;
    assert_eq!(
        (r.status, r.code()),
        (413, "payload_too_large"),
        "{}",
        r.body
    );
    assert_eq!(fleet.count("planned").await, 0, "nothing recorded");
    // MCP: the same --max-body-bytes (65536 in these tests), not rmcp's 4 MiB.
    let big = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":"2025-06-18","capabilities":{{}},"clientInfo":{{"name":"x","version":"1","pad":"{}"}}}}}}"#,
        "x".repeat(100_000)
    );
    let r = agent.request("POST", "/mcp", &[], big.into_bytes()).await;
    assert_eq!(r.status, 413, "{:?}", r.body);
}

/// An authentic message over the limit (an older producer, a raw publisher) is claimed
/// and settled `failed_final` (`too_large`), never sent; before, it was dead-lettered
/// without touching the journal, so a `planned` row stayed to be republished forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authentic_oversized_message_is_settled_not_dead_lettered_forever() {
    use oncely_tests::eventually;
    use std::time::Duration;
    let fleet = Fleet::with(FleetOptions {
        configure: Some(with_small_messages),
        ..FleetOptions::default()
    })
    .await;
    let _w = fleet.worker();
    let intent = oncely_core::Intent::from_json(serde_json::json!({
        "action_type": "ticket.create", "workflow_id": "w", "step": "s",
        "business_object": "big", "revision": 1,
        "payload": {"title": "x".repeat(6000)}
    }))
    .expect("intent");
    let env = intent.seal(&oncely_tests::fleet::secret()).expect("seal");
    let key = env.key.clone();
    fleet.publish_raw("ticket.create", &env.to_bytes()).await;
    let op = eventually("the row is settled", Duration::from_secs(30), || async {
        fleet
            .op(&key)
            .await
            .filter(|o| o.status == oncely_core::Status::FailedFinal)
    })
    .await;
    assert_eq!(op.last_error_code.as_deref(), Some("too_large"));
    assert_eq!(fleet.sandbox.effects().count(key.as_str()), 0, "never sent");
}

/// Whether the server closed `s` (EOF or reset) by `until`.
async fn closed_by(s: &mut tokio::net::TcpStream, until: tokio::time::Instant) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout_at(until, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            // An answer (e.g. 408) before the close: read on.
            Ok(Ok(_)) => {}
        }
    }
}

/// 1,000 idle connections and ten slowloris clients (a header byte every 300 ms) are
/// closed by the header-read timeout, and the gateway still answers. Before: no timeout
/// at all (axum::serve sets no timer), every one of them stayed open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_and_slowloris_headers_are_closed_by_timeouts() {
    use tokio::io::AsyncWriteExt;
    let fleet = fleet().await;
    let gw = Gateway::start_with(&fleet, &[TOKEN_A], &[], &["--header-read-timeout", "2s"]).await;
    let mut idle = Vec::new();
    for _ in 0..1000 {
        idle.push(
            tokio::net::TcpStream::connect(("127.0.0.1", gw.port))
                .await
                .expect("connect"),
        );
    }
    let mut slow = Vec::new();
    for _ in 0..10 {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", gw.port))
            .await
            .expect("connect");
        s.write_all(b"GET /v1/action-types HTTP/1.1\r\n")
            .await
            .expect("write");
        slow.push(s);
    }
    let trickle = tokio::spawn(async move {
        let mut closed = 0;
        for _ in 0..40 {
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            closed = 0;
            for s in &mut slow {
                if s.write_all(b"X").await.is_err() {
                    closed += 1;
                }
            }
            if closed == slow.len() {
                break;
            }
        }
        closed
    });
    let mut closed = 0;
    let until = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    for s in &mut idle {
        if closed_by(s, until).await {
            closed += 1;
        }
    }
    assert_eq!(
        closed, 1000,
        "idle connections closed by the header-read timeout"
    );
    assert_eq!(trickle.await.expect("join"), 10, "slowloris clients closed");
    let mut agent = gw.client(TOKEN_A.token).await;
    assert_eq!(agent.get("/v1/action-types").await.status, 200);
}

/// The first line of the answer on `s` (within 10 s).
async fn first_line(s: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(std::time::Duration::from_secs(10), s.read(&mut buf))
        .await
        .expect("an answer before the body")
        .expect("read");
    String::from_utf8_lossy(&buf[..n])
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// The token is checked before the body is read: a request without one gets `401` at
/// once, while its announced body never comes. And a body that trickles is cut off by
/// `--request-timeout` (`408`). Before: the gateway waited for the whole body first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_token_is_refused_before_the_body_and_slow_bodies_time_out() {
    use tokio::io::AsyncWriteExt;
    let fleet = fleet().await;
    let gw = Gateway::start_with(&fleet, &[TOKEN_A], &[], &["--request-timeout", "2s"]).await;
    let head = |token: Option<&str>| {
        format!(
            "POST /v1/actions/email.send HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{}Content-Length: 60000\r\n\r\n{{\"workflow_id\":",
            token
                .map(|t| format!("Authorization: Bearer {t}\r\n"))
                .unwrap_or_default()
        )
    };
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", gw.port))
        .await
        .expect("connect");
    s.write_all(head(None).as_bytes()).await.expect("write");
    assert_eq!(first_line(&mut s).await, "HTTP/1.1 401 Unauthorized");
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", gw.port))
        .await
        .expect("connect");
    s.write_all(head(Some(TOKEN_A.token)).as_bytes())
        .await
        .expect("write");
    assert_eq!(first_line(&mut s).await, "HTTP/1.1 408 Request Timeout");
}

/// One token's long-polls are capped (`--max-waits-per-token`): the excess gets `429
/// too_many_waits` at once, and another tenant's submits go on while they are open.
/// MCP sessions are capped per token too. Before: no cap on either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_polls_and_mcp_sessions_are_capped_per_token() {
    use oncely_tests::gateway::TOKEN_B;
    let fleet = fleet().await;
    let gw = Gateway::start_with(
        &fleet,
        &[TOKEN_A, TOKEN_B],
        &[],
        &[
            "--max-waits-per-token",
            "20",
            "--max-mcp-sessions-per-token",
            "2",
        ],
    )
    .await;
    // Scheduled an hour ahead: waits on it stay open.
    let later = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let mut a = gw.client(TOKEN_A.token).await;
    let r = a
        .submit(
            "ticket.create",
            &serde_json::json!({"workflow_id": "w", "step": "s", "business_object": "later",
                "revision": 1, "payload": {"title": "t"}, "not_before": later}),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.body);
    let key = r.body["key"].as_str().expect("key").to_owned();
    // 25 long-polls: 20 stay open, 5 are refused at once.
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut open = Vec::new();
    for _ in 0..25 {
        let port = gw.port;
        let key = key.clone();
        let done = done_tx.clone();
        open.push(tokio::spawn(async move {
            let mut c = oncely_tests::gateway::Client::connect(port, Some(TOKEN_A.token)).await;
            let r = c.action(&key, Some("50s")).await;
            let _ = done.send((r.status, r.code().to_owned()));
        }));
    }
    for _ in 0..5 {
        let refused = tokio::time::timeout(std::time::Duration::from_secs(20), done_rx.recv())
            .await
            .expect("five are refused at once");
        assert_eq!(refused, Some((429, "too_many_waits".to_owned())));
    }
    let mut b = gw.client(TOKEN_B.token).await;
    for n in 0..20 {
        let r = b
            .submit(
                "ticket.create",
                &serde_json::json!({"workflow_id": "w", "step": "s", "business_object": format!("b-{n}"),
                    "revision": 1, "payload": {"title": "t"}}),
            )
            .await;
        assert_eq!(r.status, 202, "another tenant's submit: {}", r.body);
    }
    assert!(
        done_rx.try_recv().is_err(),
        "the twenty long-polls are still open"
    );
    for w in open {
        w.abort();
    }
    let init = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let r = a
            .request("POST", "/mcp", &[], init.to_string().into_bytes())
            .await;
        statuses.push(r.status);
    }
    assert_eq!(statuses, [200, 200, 429]);
}

/// Submit latency percentiles (ms): `n` new `ticket.create`s, one after another, from
/// `client`; every one must be recorded (`202`).
async fn submit_latencies(
    client: &mut oncely_tests::gateway::Client,
    tag: &str,
    n: usize,
) -> (f64, f64) {
    let mut ms = Vec::with_capacity(n);
    for i in 0..n {
        let started = std::time::Instant::now();
        let r = client
            .submit(
                "ticket.create",
                &serde_json::json!({"workflow_id": "w", "step": "s", "business_object": format!("{tag}-{i}"),
                    "revision": 1, "payload": {"title": "t"}}),
            )
            .await;
        ms.push(started.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(r.status, 202, "another tenant's submit: {}", r.body);
    }
    ms.sort_by(f64::total_cmp);
    let at = |p: f64| ms[((p * n as f64).ceil() as usize).clamp(1, n) - 1];
    (at(0.5), at(0.99))
}

/// One tenant holds 500 long-polls open at once (its cap raised to allow them all);
/// another tenant's submits go on. The figure — its submit p50/p99 without and with
/// them — is printed for docs/security.md, never asserted (a shared machine is noisy);
/// what is asserted: every submit is recorded and all 500 long-polls stay open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenants_500_long_polls_leave_another_tenants_submits_alone() {
    use oncely_tests::gateway::TOKEN_B;
    const POLLS: usize = 500;
    let fleet = fleet().await;
    let _worker = fleet.worker();
    let gw = Gateway::start_with(
        &fleet,
        &[TOKEN_A, TOKEN_B],
        &[],
        &["--max-waits-per-token", "500"],
    )
    .await;
    let mut b = gw.client(TOKEN_B.token).await;
    // Warm up, then the baseline.
    submit_latencies(&mut b, "warm", 50).await;
    let before = submit_latencies(&mut b, "before", 300).await;
    let later = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let mut a = gw.client(TOKEN_A.token).await;
    let r = a
        .submit(
            "ticket.create",
            &serde_json::json!({"workflow_id": "w", "step": "s", "business_object": "later",
                "revision": 1, "payload": {"title": "t"}, "not_before": later}),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.body);
    let key = r.body["key"].as_str().expect("key").to_owned();
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut polls = Vec::new();
    for _ in 0..POLLS {
        let (port, key, done) = (gw.port, key.clone(), done_tx.clone());
        polls.push(tokio::spawn(async move {
            let mut c = oncely_tests::gateway::Client::connect(port, Some(TOKEN_A.token)).await;
            let r = c.action(&key, Some("60s")).await;
            let _ = done.send((r.status, r.code().to_owned()));
        }));
    }
    // All of them open: the gateway's gauge of open long-polls says so.
    oncely_tests::eventually(
        "500 long-polls open",
        std::time::Duration::from_secs(60),
        || async {
            let m = oncely_tests::http_get(gw.ops_port, "/metrics").await?;
            let open = m
                .lines()
                .find(|l| l.starts_with("oncely_gateway_long_polls_open"))
                .and_then(|l| l.split_whitespace().last()?.parse::<f64>().ok())
                .unwrap_or(0.0);
            (open as usize >= POLLS).then_some(())
        },
    )
    .await;
    let during = submit_latencies(&mut b, "during", 300).await;
    assert!(
        done_rx.try_recv().is_err(),
        "the long-polls are still open while the other tenant submits"
    );
    eprintln!(
        "figure: another tenant's submit p50/p99 {:.2}/{:.2} ms alone, {:.2}/{:.2} ms beside {POLLS} open long-polls (p99 ×{:.2})",
        before.0,
        before.1,
        during.0,
        during.1,
        during.1 / before.1
    );
    for p in polls {
        p.abort();
    }
}

/// A claim whose answer is lost (it committed; the worker saw an error and retried)
/// meets the worker's own fresh leases on the retry. Before: each delivery was acked as
/// `in_flight`, its lease ran out into `unknown`, and an action nobody had sent went to the
/// reconciler. Now the worker takes up its own lease (none of its calls holds the key) and
/// calls once. The fail-point worker drops the first answer of every claim statement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_claim_answer_is_taken_up_not_left_to_expire() {
    use oncely_tests::eventually;
    use std::time::Duration;
    let fleet = Fleet::new().await;
    let worker = oncely_tests::failpoint_worker::path().expect("fail-point worker");
    let w = fleet.spawn_program(
        &worker,
        &["run"],
        &[("ONCELY_FAILPOINTS", "claim_reply_lost=1.0")],
    );
    let producer = fleet.producer().await;
    let mut keys = Vec::new();
    for n in 0..20 {
        let intent = oncely_tests::sample_intent("ticket.create", n);
        match producer.enqueue(intent).await.expect("enqueue") {
            oncely_producer::Enqueued::Enqueued { key, .. } => keys.push(key),
            other => panic!("{other:?}"),
        }
    }
    eventually(
        "every ticket is created",
        Duration::from_secs(60),
        || async { (fleet.count("succeeded").await == 20).then_some(()) },
    )
    .await;
    assert_eq!(fleet.count("unknown").await, 0);
    let effects = fleet.sandbox.effects();
    for k in &keys {
        assert_eq!(effects.count(k.as_str()), 1, "{k}");
    }
    let logs = w.logs();
    assert!(
        logs.contains("claim_reply_lost") && logs.contains("own lease is taken up"),
        "the fail point fired and the leases were taken up"
    );
}

/// A completion whose answer is lost (it committed; the worker retried the statement)
/// found its rows already moved on: `Stale`, and no outcome event was published — the
/// agents listening never heard that their tickets were created. Now the journal reports
/// a completion this worker already applied (same attempt, status and reason) as applied,
/// and the events go out. The fail-point worker drops the first answer of every
/// completion statement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_completion_answer_still_publishes_the_outcome() {
    use oncely_tests::eventually;
    use std::time::Duration;
    let fleet = Fleet::new().await;
    let mut outcomes = fleet.listen_outcomes("ticket.create.*").await;
    let worker = oncely_tests::failpoint_worker::path().expect("fail-point worker");
    let _w = fleet.spawn_program(
        &worker,
        &["run"],
        &[("ONCELY_FAILPOINTS", "complete_reply_lost=1.0")],
    );
    let producer = fleet.producer().await;
    let mut keys = std::collections::BTreeSet::new();
    for n in 0..10 {
        match producer
            .enqueue(oncely_tests::sample_intent("ticket.create", n))
            .await
            .expect("enqueue")
        {
            oncely_producer::Enqueued::Enqueued { key, .. } => {
                keys.insert(key.as_str().to_owned());
            }
            other => panic!("{other:?}"),
        }
    }
    eventually(
        "every ticket is created",
        Duration::from_secs(60),
        || async { (fleet.count("succeeded").await == 10).then_some(()) },
    )
    .await;
    let mut heard = std::collections::BTreeSet::new();
    while heard.len() < keys.len() {
        let (_, event) = oncely_tests::fleet::next_outcome(&mut outcomes).await;
        assert_eq!(event["status"], "succeeded", "{event}");
        heard.insert(
            event["idempotency_key"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        );
    }
    assert_eq!(heard, keys);
}
