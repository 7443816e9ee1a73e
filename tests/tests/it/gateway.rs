//! The gateway as agents meet it: a real `oncely-gateway` process in front of real
//! workers, Postgres, RabbitMQ and the sandbox.

use oncely_tests::eventually;
use oncely_tests::fleet::{Fleet, FleetOptions};
use oncely_tests::gateway::{
    Client, Gateway, TOKEN_A, TOKEN_B, TOKEN_LIMITED, TOKEN_QUOTA, with_email_schema,
};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(90);

async fn fleet() -> Fleet {
    Fleet::with(FleetOptions {
        configure: Some(with_email_schema),
        ..FleetOptions::default()
    })
    .await
}

fn body(n: usize, action: &str) -> Value {
    let payload = match action {
        "email.send" => json!({"to": format!("user{n}@example.test"), "subject": "Approved"}),
        "ticket.create" => json!({"title": format!("ticket {n}")}),
        _ => json!({"amount": 100 + n, "currency": "EUR", "account": format!("acc-{n}")}),
    };
    json!({"workflow_id": format!("case-{n}"), "step": "notify", "business_object": format!("obj-{n}"), "revision": 1, "payload": payload})
}

/// 1,000 requests, 30% repeats, from 8 concurrent clients → one effect per distinct key;
/// same identity with another payload → 422 and no effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_http_requests_with_repeats_run_each_action_once() {
    let fleet = fleet().await;
    let _workers: Vec<_> = (0..2).map(|_| fleet.worker()).collect();
    let gw = Gateway::start(&fleet, &[TOKEN_A]).await;
    // 700 distinct + 300 repeats of earlier ones, shuffled deterministically over 8 clients.
    let mut work: Vec<usize> = (0..700).collect();
    work.extend((0..300).map(|n| n * 7 % 700));
    let mut lanes: Vec<Vec<usize>> = vec![Vec::new(); 8];
    for (i, n) in work.into_iter().enumerate() {
        lanes[(i * 5) % 8].push(n);
    }
    let mut tasks = Vec::new();
    for lane in lanes {
        let mut c = gw.client(TOKEN_A.token).await;
        tasks.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            for n in lane {
                let a = ["email.send", "ticket.create", "payment_order.create"][n % 3];
                let r = c.submit(a, &body(n, a)).await;
                assert!(
                    matches!(r.status, 200 | 202),
                    "{n}: {} {}",
                    r.status,
                    r.body
                );
                let replayed = r.headers.get("idempotent-replayed").is_some();
                assert_eq!(replayed, r.status == 200, "{}", r.body);
                seen.push((
                    n,
                    r.status,
                    r.body["key"].as_str().unwrap_or_default().to_owned(),
                ));
            }
            seen
        }));
    }
    let mut keys: HashMap<usize, String> = HashMap::new();
    let mut accepted = 0;
    for t in tasks {
        for (n, status, key) in t.await.expect("client") {
            if status == 202 {
                accepted += 1;
            }
            let prev = keys.insert(n, key.clone());
            assert!(prev.is_none_or(|p| p == key), "one key per identity");
        }
    }
    assert_eq!(accepted, 700, "each distinct action is new exactly once");
    // Conflicts: the same identity, another payload → 422, nothing executed.
    let mut c = gw.client(TOKEN_A.token).await;
    for n in 0..10 {
        let mut b = body(n * 3, "email.send");
        b["payload"]["subject"] = json!("Rejected");
        let r = c.submit("email.send", &b).await;
        assert_eq!((r.status, r.code()), (422, "conflict"), "{}", r.body);
        assert_eq!(
            r.body["error"]["key"].as_str(),
            keys.get(&(n * 3)).map(String::as_str)
        );
    }
    eventually("every distinct action succeeded", DEADLINE, || async {
        (fleet.count("succeeded").await == 700).then_some(())
    })
    .await;
    let effects = fleet.sandbox.effects();
    assert_eq!(effects.total, 700, "one effect per distinct key");
    let distinct: HashSet<&String> = keys.values().collect();
    assert_eq!(distinct.len(), 700);
    for k in distinct {
        assert_eq!(effects.count(k), 1, "{k}");
    }
    // The tenant came from the token.
    let tenants: Vec<Option<String>> =
        sqlx::query_scalar("SELECT DISTINCT tenant FROM agent_operations")
            .fetch_all(&fleet.db.pool)
            .await
            .expect("tenants");
    assert_eq!(tenants, [Some("acme".to_owned())]);
}

/// Status, long-poll, replays, tenants, tokens, bad input, Idempotency-Key, OpenAPI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_answers_each_case_with_its_status_and_code() {
    let fleet = fleet().await;
    let gw = Gateway::start(&fleet, &[TOKEN_A, TOKEN_B, TOKEN_LIMITED]).await;
    let (mut a, mut b) = (
        gw.client(TOKEN_A.token).await,
        gw.client(TOKEN_B.token).await,
    );

    // New, then the long-poll returns as soon as a worker (started now) finishes it.
    let r = a.submit("email.send", &body(1, "email.send")).await;
    assert_eq!(
        (r.status, r.body["outcome"].as_str()),
        (202, Some("enqueued")),
        "{}",
        r.body
    );
    let key = r.body["key"].as_str().expect("key").to_owned();
    assert_eq!(
        r.body["links"]["self"],
        json!(format!("/v1/actions/{}", key.replace(':', "%3A")))
    );
    let s = a.action(&key, None).await;
    assert_eq!(
        (
            s.status,
            s.body["status"].as_str(),
            s.body["terminal"].as_bool()
        ),
        (200, Some("planned"), Some(false))
    );
    assert!(
        s.body.get("payload").is_none(),
        "never the payload: {}",
        s.body
    );
    let _worker = fleet.worker();
    let started = std::time::Instant::now();
    let w = a.action(&key, Some("30s")).await;
    assert_eq!(
        (w.status, w.body["status"].as_str()),
        (200, Some("succeeded")),
        "{}",
        w.body
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "returned on the outcome, not the timeout"
    );
    assert!(
        w.body["provider_operation_id"].is_string() && w.body["result"].is_object(),
        "{}",
        w.body
    );

    // A repeat: 200, replayed, with the saved result.
    let d = a.submit("email.send", &body(1, "email.send")).await;
    assert_eq!(
        (d.status, d.body["outcome"].as_str()),
        (200, Some("duplicate"))
    );
    assert_eq!(
        d.headers.get("idempotent-replayed").map(|v| v.as_bytes()),
        Some(&b"true"[..])
    );
    assert_eq!(d.body["action"]["result"], w.body["result"]);

    // Tenants: B cannot read or wait on A's key; the same identity under B is B's own.
    assert_eq!(b.action(&key, None).await.status, 404);
    assert_eq!(b.action(&key, Some("1s")).await.status, 404);
    let rb = b.submit("email.send", &body(1, "email.send")).await;
    assert_eq!(
        rb.status, 202,
        "another tenant's identical request is its own action"
    );
    assert_ne!(rb.body["key"], json!(key));

    // Tokens.
    let mut limited = gw.client(TOKEN_LIMITED.token).await;
    let f = limited.submit("email.send", &body(2, "email.send")).await;
    assert_eq!((f.status, f.code()), (403, "forbidden_action_type"));
    // Issue 43: a restricted token learns nothing about the action types it may not use
    // (it got 404 `unknown_action_type` here, 403 for a configured one).
    let f = limited.submit("nope.nope", &body(2, "email.send")).await;
    assert_eq!((f.status, f.code()), (403, "forbidden_action_type"));
    assert_eq!(
        limited
            .submit("ticket.create", &body(2, "ticket.create"))
            .await
            .status,
        202
    );
    let types = limited.get("/v1/action-types").await;
    assert_eq!(
        types.body["action_types"].as_array().map(Vec::len),
        Some(1),
        "{}",
        types.body
    );
    let mut nobody = Client::connect(gw.port, None).await;
    let u = nobody.submit("email.send", &body(3, "email.send")).await;
    assert_eq!((u.status, u.code()), (401, "unauthorized"));
    assert!(u.headers.get("www-authenticate").is_some());
    let mut wrong = Client::connect(gw.port, Some("token-nobody")).await;
    assert_eq!(wrong.get("/v1/action-types").await.status, 401);

    // Bad input, each with its code and field.
    type Case<'a> = (&'a str, Vec<u8>, u16, &'a str, Option<&'a str>);
    let cases: Vec<Case<'_>> = vec![
        ("email.send", b"{not json".to_vec(), 400, "malformed_json", None),
        ("email.send", b"[1,2]".to_vec(), 400, "invalid_request", None),
        ("email.send", json!({"workflow_id": "w", "step": "s", "business_object": "o", "revision": 1, "payload": {"to": "abc@x"}}).to_string().into_bytes(), 400, "schema_violation", Some("/payload")),
        ("email.send", json!({"workflow_id": "w", "step": "s", "business_object": "o", "revision": 1, "payload": {"to": "a", "subject": "x"}}).to_string().into_bytes(), 400, "schema_violation", Some("/payload/to")),
        ("email.send", json!({"step": "s", "business_object": "o", "revision": 1, "payload": {}}).to_string().into_bytes(), 400, "invalid_request", Some("/workflow_id")),
        ("email.send", json!({"workflow_id": "w", "step": "s", "business_object": "o", "revision": 1.5, "payload": {}}).to_string().into_bytes(), 400, "invalid_request", Some("/revision")),
        ("email.send", json!({"workflow_id": "w", "step": "s", "business_object": "o", "revision": 1, "tenant": "globex", "payload": {}}).to_string().into_bytes(), 400, "invalid_request", Some("/tenant")),
        ("email.send", json!({"workflow_id": "w", "step": "s", "business_object": "o", "revision": 1, "run_id": "r1", "payload": {}}).to_string().into_bytes(), 400, "invalid_request", Some("/run_id")),
        ("nope.nope", body(4, "ticket.create").to_string().into_bytes(), 404, "unknown_action_type", None),
        ("ticket.create", json!({"workflow_id": "w", "step": "s", "business_object": "o", "revision": 1, "payload": {"blob": "x".repeat(70_000)}}).to_string().into_bytes(), 413, "payload_too_large", None),
    ];
    for (action, bytes, status, code, field) in cases {
        let r = a
            .request("POST", &format!("/v1/actions/{action}"), &[], bytes)
            .await;
        assert_eq!((r.status, r.code()), (status, code), "{action}: {}", r.body);
        assert_eq!(r.body["error"]["field"].as_str(), field, "{}", r.body);
    }
    assert_eq!(a.get("/v1/actions/v1%3Anot-a-key").await.status, 404);
    let bad_wait = a
        .get(&format!(
            "/v1/actions/{}?wait=soon",
            key.replace(':', "%3A")
        ))
        .await;
    assert_eq!(
        (bad_wait.status, bad_wait.body["error"]["field"].as_str()),
        (400, Some("wait"))
    );

    // Idempotency-Key: a repeat proceeds, reuse with another request → 422; a request
    // while the first is still being recorded → 409.
    let first = body(10, "ticket.create").to_string().into_bytes();
    let r1 = a
        .request(
            "POST",
            "/v1/actions/ticket.create",
            &[("idempotency-key", "ck-1")],
            first.clone(),
        )
        .await;
    assert_eq!(r1.status, 202);
    let r2 = a
        .request(
            "POST",
            "/v1/actions/ticket.create",
            &[("idempotency-key", "ck-1")],
            first,
        )
        .await;
    assert_eq!(r2.status, 200);
    let other = body(11, "ticket.create").to_string().into_bytes();
    let r3 = a
        .request(
            "POST",
            "/v1/actions/ticket.create",
            &[("idempotency-key", "ck-1")],
            other.clone(),
        )
        .await;
    assert_eq!((r3.status, r3.code()), (422, "idempotency_key_reused"));
    // B may use the same header value: keys are per tenant.
    assert_eq!(
        b.request(
            "POST",
            "/v1/actions/ticket.create",
            &[("idempotency-key", "ck-1")],
            other.clone()
        )
        .await
        .status,
        202
    );
    let fp = oncely_gateway::client_keys::fingerprint(
        &key_of(&mut a, 12).await,
        &oncely_core::PayloadHash::of(&body(12, "ticket.create")["payload"])
            .expect("hash")
            .to_string(),
    );
    sqlx::query("INSERT INTO gateway_requests (tenant, client_key, fingerprint, state) VALUES ('acme', 'ck-busy', $1, 'recording')")
        .bind(&fp)
        .execute(&fleet.db.pool)
        .await
        .expect("insert");
    let busy = a
        .request(
            "POST",
            "/v1/actions/ticket.create",
            &[("idempotency-key", "ck-busy")],
            body(12, "ticket.create").to_string().into_bytes(),
        )
        .await;
    assert_eq!(
        (busy.status, busy.code()),
        (409, "request_in_progress"),
        "{}",
        busy.body
    );

    // Every documented route answers (it exists in the router), and /openapi.json is the
    // document the binary prints.
    let doc = a.get("/openapi.json").await.body;
    let mut checked = 0;
    for (path, methods) in doc["paths"].as_object().expect("paths") {
        let concrete = path.replace("{key}", &key.replace(':', "%3A"));
        // One submit path per configured action type.
        let action = path
            .strip_prefix("/v1/actions/")
            .filter(|a| !a.contains('{'));
        for method in methods.as_object().expect("methods").keys() {
            let body = match (method.as_str(), action) {
                ("post", Some(a)) => body(20, a).to_string().into_bytes(),
                _ => Vec::new(),
            };
            let r = a
                .request(&method.to_uppercase(), &concrete, &[], body)
                .await;
            // The control routes answer for the key's state and the token's rights: a
            // finished action is too late to cancel, and this token is no approver.
            let expected: &[(u16, &str)] = if path.ends_with("/cancel") {
                &[(409, "too_late")]
            } else if path.ends_with("/approve") || path.ends_with("/reject") {
                &[(403, "forbidden")]
            } else {
                &[(200, ""), (202, "")]
            };
            assert!(
                expected.contains(&(r.status, r.code())),
                "{method} {path}: {} {}",
                r.status,
                r.body
            );
            checked += 1;
        }
    }
    assert_eq!(
        checked, 8,
        "action types, three submits, status, cancel, approve, reject"
    );
    let printed = std::process::Command::new(oncely_tests::fleet::binary("oncely-gateway"))
        .arg("--config")
        .arg(&fleet.config_path)
        .arg("openapi")
        .output()
        .expect("openapi");
    let printed: Value = serde_json::from_slice(&printed.stdout).expect("json");
    assert_eq!(printed, doc);
    // The ops listener.
    let metrics = oncely_tests::http_get(gw.ops_port, "/metrics")
        .await
        .expect("metrics");
    assert!(
        metrics.contains("oncely_gateway_requests_total"),
        "{metrics}"
    );
    assert!(
        oncely_tests::http_get(gw.ops_port, "/healthz")
            .await
            .is_some()
    );
}

/// The key the gateway derives for `body(n, "ticket.create")` under tenant acme (the
/// Idempotency-Key fingerprint needs it).
async fn key_of(_a: &mut Client, n: usize) -> String {
    let mut obj = body(n, "ticket.create")
        .as_object()
        .cloned()
        .expect("object");
    obj.insert("action_type".into(), json!("ticket.create"));
    obj.insert("tenant".into(), json!("acme"));
    let intent = oncely_core::Intent::from_json(Value::Object(obj)).expect("intent");
    intent
        .seal(&oncely_tests::fleet::secret())
        .expect("seal")
        .key
        .as_str()
        .to_owned()
}

/// A payload that came another way (the SDK) is checked by the worker too: refused as
/// `failed_final` / `payload_schema` before anything is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_refuses_a_payload_that_breaks_the_schema() {
    let fleet = fleet().await;
    let _worker = fleet.worker();
    let producer = fleet.producer().await;
    let mut obj = body(1, "email.send").as_object().cloned().expect("object");
    obj.insert("action_type".into(), json!("email.send"));
    obj["payload"] = json!({"to": "someone@example.test"});
    let intent = oncely_core::Intent::from_json(Value::Object(obj)).expect("intent");
    let key = match producer.enqueue(intent).await.expect("enqueue") {
        oncely_producer::Enqueued::Enqueued { key, .. } => key,
        other => panic!("{other:?}"),
    };
    let op = producer
        .wait(&key, DEADLINE)
        .await
        .expect("wait")
        .expect("terminal");
    assert_eq!(op.status, oncely_core::Status::FailedFinal);
    assert_eq!(op.last_error_code.as_deref(), Some("payload_schema"));
    assert_eq!(fleet.sandbox.effects().total, 0, "nothing was sent");
}

/// Postgres unreachable from the gateway: 503 + Retry-After and nothing recorded; once it
/// is back, the retried request is new and runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_down_answers_503_and_recovers_without_loss() {
    let fleet = fleet().await;
    let _worker = fleet.worker();
    let proxy = oncely_tests::proxy::Proxy::start(5432).await;
    let url = fleet.db.url.replace(":5432/", &format!(":{}/", proxy.port));
    assert_ne!(url, fleet.db.url, "the test database is on port 5432");
    let gw = Gateway::start_with_env(&fleet, &[TOKEN_A], &[("DATABASE_URL", &url)]).await;
    let mut a = gw.client(TOKEN_A.token).await;
    assert_eq!(
        a.submit("ticket.create", &body(1, "ticket.create"))
            .await
            .status,
        202
    );

    proxy.cut();
    let r = a.submit("ticket.create", &body(2, "ticket.create")).await;
    assert_eq!(
        (r.status, r.code()),
        (503, "database_unavailable"),
        "{}",
        r.body
    );
    assert!(r.headers.get("retry-after").is_some());
    assert!(
        oncely_tests::http_get(gw.ops_port, "/readyz")
            .await
            .is_none(),
        "not ready"
    );
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM agent_operations")
        .fetch_one(&fleet.db.pool)
        .await
        .expect("count");
    assert_eq!(rows, 1, "nothing half-written");

    proxy.restore();
    let port = gw.port;
    let key = eventually("the retried request is accepted", DEADLINE, || async move {
        let mut a = Client::connect(port, Some(TOKEN_A.token)).await;
        let r = a.submit("ticket.create", &body(2, "ticket.create")).await;
        (r.status == 202)
            .then(|| r.body["key"].as_str().map(str::to_owned))
            .flatten()
    })
    .await;
    let w = a.action(&key, Some("30s")).await;
    assert_eq!(w.body["status"].as_str(), Some("succeeded"), "{}", w.body);
    eventually("both ran", DEADLINE, || async {
        (fleet.count("succeeded").await == 2).then_some(())
    })
    .await;
    assert_eq!(fleet.sandbox.effects().total, 2);
    assert_eq!(fleet.sandbox.effects().count(&key), 1);
}

/// RabbitMQ down: the action is recorded (`planned`) and the answer is 503 with its key;
/// after the broker is back the sweeper publishes it, it runs once, and a retry reports
/// it as a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_down_keeps_the_recorded_action_and_runs_it_once_after() {
    let broker = oncely_tests::private_broker::PrivateBroker::start().await;
    let fleet = Fleet::with(FleetOptions {
        amqp_url: Some(broker.url()),
        reconciler: Some(oncely_tests::fleet::FAST_RECONCILER),
        configure: Some(with_email_schema),
        ..FleetOptions::default()
    })
    .await;
    let _worker = fleet.worker();
    let _reconciler = fleet.reconciler();
    let gw = Gateway::start(&fleet, &[TOKEN_A]).await;
    let mut a = gw.client(TOKEN_A.token).await;
    assert_eq!(
        a.submit("email.send", &body(1, "email.send")).await.status,
        202
    );

    broker.stop().await;
    let r = a.submit("email.send", &body(2, "email.send")).await;
    assert_eq!(
        (r.status, r.code()),
        (503, "broker_unavailable"),
        "{}",
        r.body
    );
    assert!(r.headers.get("retry-after").is_some());
    let key = r.body["error"]["key"].as_str().expect("key").to_owned();
    let status: String =
        sqlx::query_scalar("SELECT status FROM agent_operations WHERE idempotency_key = $1")
            .bind(&key)
            .fetch_one(&fleet.db.pool)
            .await
            .expect("the row exists");
    assert_eq!(status, "planned");

    broker.boot().await;
    eventually("the gateway is ready again", DEADLINE, || async {
        oncely_tests::http_get(gw.ops_port, "/readyz")
            .await
            .map(|_| ())
    })
    .await;
    let port = gw.port;
    let w = eventually("it ran", DEADLINE, || {
        let key = key.clone();
        async move {
            let mut a = Client::connect(port, Some(TOKEN_A.token)).await;
            let w = a.action(&key, Some("5s")).await;
            (w.body["status"].as_str() == Some("succeeded")).then_some(w)
        }
    })
    .await;
    assert!(w.body["result"].is_object());
    let d = a.submit("email.send", &body(2, "email.send")).await;
    assert_eq!(
        (d.status, d.body["status"].as_str()),
        (200, Some("succeeded"))
    );
    assert_eq!(fleet.sandbox.effects().count(&key), 1, "one effect");
    assert_eq!(fleet.sandbox.effects().total, 2);
}

/// The same request from 24 agents at once: the gateway records requests that arrive
/// together as one batch, and each is still told what it would have been told alone —
/// one `202`, the others `200` duplicates with the same key — and one email is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_request_from_many_agents_at_once_is_recorded_once() {
    let fleet = fleet().await;
    let _worker = fleet.worker();
    let gw = Gateway::start(&fleet, &[TOKEN_A]).await;
    let mut clients = Vec::new();
    for _ in 0..24 {
        clients.push(gw.client(TOKEN_A.token).await);
    }
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(clients.len()));
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|mut c| {
            let start = start.clone();
            tokio::spawn(async move {
                start.wait().await;
                let r = c.submit("email.send", &body(7, "email.send")).await;
                (
                    r.status,
                    r.body["key"].as_str().unwrap_or_default().to_owned(),
                )
            })
        })
        .collect();
    let mut statuses = Vec::new();
    let mut keys = HashSet::new();
    for t in tasks {
        let (status, key) = t.await.expect("client");
        statuses.push(status);
        keys.insert(key);
    }
    statuses.sort_unstable();
    assert_eq!(statuses[0], 200, "{statuses:?}");
    assert_eq!(
        statuses.iter().filter(|s| **s == 202).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        23,
        "{statuses:?}"
    );
    assert_eq!(keys.len(), 1, "one key: {keys:?}");
    let key = keys.into_iter().next().expect("key");
    eventually("the action succeeded", DEADLINE, || async {
        (fleet.count("succeeded").await == 1).then_some(())
    })
    .await;
    assert_eq!(fleet.sandbox.effects().count(&key), 1, "one email");
    assert_eq!(fleet.sandbox.effects().total, 1);
}

/// A token over its quota gets `429` with `Retry-After` and the `RateLimit` fields, and
/// nothing is recorded; another token is not held back by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_over_its_quota_gets_429_and_nothing_is_recorded() {
    let fleet = fleet().await;
    let gw = Gateway::start(&fleet, &[TOKEN_QUOTA, TOKEN_B]).await;
    let mut c = gw.client(TOKEN_QUOTA.token).await;
    for n in 0..2 {
        let r = c.submit("email.send", &body(n, "email.send")).await;
        assert_eq!(r.status, 202, "within the burst: {}", r.body);
    }
    let r = c.submit("email.send", &body(2, "email.send")).await;
    assert_eq!(r.status, 429, "{}", r.body);
    assert_eq!(r.code(), "rate_limited");
    let retry_after: u64 = r.headers["retry-after"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    assert!((1..=10).contains(&retry_after), "{retry_after}");
    assert_eq!(r.headers["ratelimit-policy"], "\"token\";q=0.1;w=1");
    assert_eq!(
        r.headers["ratelimit"].to_str().expect("ascii"),
        format!("\"token\";r=0;t={retry_after}")
    );
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM agent_operations")
        .fetch_one(&fleet.db.pool)
        .await
        .expect("count");
    assert_eq!(rows, 2, "the refused submit recorded nothing");
    let mut other = gw.client(TOKEN_B.token).await;
    let r = other.submit("email.send", &body(3, "email.send")).await;
    assert_eq!(
        r.status, 202,
        "another tenant's token has its own quota: {}",
        r.body
    );
}
