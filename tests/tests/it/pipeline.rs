//! The pipeline end to end: SDK producers and raw AMQP publishers → RabbitMQ → real
//! `oncely-worker` processes → the sandbox → the journal. Ground truth for "once" is the
//! sandbox's per-key effect count.

use oncely_core::Intent;
use oncely_tests::eventually;
use oncely_tests::fleet::{Fleet, secret};
use serde_json::{Value, json};
use std::collections::HashSet;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(90);

fn intent(action: &str, n: usize) -> Intent {
    let payload = match action {
        "email.send" => {
            json!({"to": format!("user-{n}@example.test"), "subject": "Your application", "body": "Approved."})
        }
        "ticket.create" => {
            json!({"title": format!("Review application {n}"), "queue": "ops", "business_reference": format!("app-{n}")})
        }
        _ => {
            json!({"account_id": "example-account", "amount_minor": 1000 + n, "currency": "RUB", "business_reference": format!("application-{n}")})
        }
    };
    Intent::from_json(json!({
        "action_type": action, "workflow_id": format!("case-{}", n / 10), "step": "step", "business_object": format!("obj-{n}"),
        "revision": 1, "payload": payload
    }))
    .expect("intent")
}

async fn wait_all_succeeded(fleet: &Fleet, expected: i64) {
    eventually("every distinct key succeeded", DEADLINE, || async {
        (fleet.count("succeeded").await == expected).then_some(())
    })
    .await;
}

/// 1,000 intents, 30% of them repeats, from two producers at once; three workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_intents_with_repeats_execute_once_each() {
    let fleet = Fleet::new().await;
    let workers: Vec<_> = (0..3).map(|_| fleet.worker()).collect();
    let actions = ["email.send", "ticket.create", "payment_order.create"];
    // 700 distinct intents; 300 repeats of earlier ones, split between two producers.
    let mut all: Vec<Intent> = (0..700).map(|n| intent(actions[n % 3], n)).collect();
    all.extend((0..300).map(|n| intent(actions[(n * 7 % 700) % 3], n * 7 % 700)));
    let (a, b): (Vec<_>, Vec<_>) = all.into_iter().enumerate().partition(|(i, _)| i % 2 == 0);
    let strip = |v: Vec<(usize, Intent)>| v.into_iter().map(|(_, i)| i).collect::<Vec<_>>();
    let new = fleet.enqueue_from_two(strip(a), strip(b)).await;
    assert_eq!(
        new, 700,
        "each distinct intent is recorded once, whichever producer came first"
    );

    wait_all_succeeded(&fleet, 700).await;
    let effects = fleet.sandbox.effects();
    assert_eq!(effects.total, 700, "one effect per distinct key");
    let dups: Vec<&str> = effects.duplicates().map(|(k, _)| k).collect();
    assert!(dups.is_empty(), "no key with two effects: {dups:?}");
    let keys: HashSet<String> = sqlx::query_scalar("SELECT idempotency_key FROM agent_operations")
        .fetch_all(&fleet.db.pool)
        .await
        .expect("keys")
        .into_iter()
        .collect();
    assert_eq!(keys.len(), 700);
    for k in &keys {
        assert_eq!(effects.count(k), 1, "{k}");
    }
    for q in actions.map(|a| fleet.topology().action_queue(a)) {
        eventually("action queues drained and acked", DEADLINE, || async {
            (fleet.depth(&q) == (0, 0)).then_some(())
        })
        .await;
    }
    drop(workers);
}

/// The same envelope published 20 times at once (no SDK, no planned row) → one call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_envelope_twenty_times_is_one_provider_call() {
    let fleet = Fleet::new().await;
    let _w1 = fleet.worker();
    let _w2 = fleet.worker();
    let env = intent("payment_order.create", 1)
        .seal(&secret())
        .expect("seal");
    let bytes = env.to_bytes();
    let publishes = (0..20).map(|_| fleet.publish_raw("payment_order.create", &bytes));
    futures_util::future::join_all(publishes).await;
    wait_all_succeeded(&fleet, 1).await;
    let q = fleet.topology().action_queue("payment_order.create");
    eventually("all 20 deliveries settled", DEADLINE, || async {
        (fleet.depth(&q) == (0, 0)).then_some(())
    })
    .await;
    let stats = fleet.sandbox.control().stats().await.expect("stats");
    assert_eq!(
        stats["executes"]["bank"],
        json!(1),
        "one provider call: {stats}"
    );
    assert_eq!(fleet.sandbox.effects().count(env.key.as_str()), 1);
}

/// A worker SIGKILLed after the provider accepted, before it committed: the redelivery
/// finds a live lease, so no other worker calls the provider again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_call_causes_no_second_call() {
    let fleet = Fleet::new().await;
    let control = fleet.sandbox.control();
    // The bank commits the effect and then never answers (the worker waits up to 5s).
    control
        .set_faults_json(&json!({"rules": [{"provider": "bank", "mode": "accept_then_timeout", "rate": 1.0, "times": 1, "hold_ms": 60000}]}))
        .await
        .expect("faults");
    let victim = fleet.worker();
    let env = intent("payment_order.create", 42)
        .seal(&secret())
        .expect("seal");
    fleet
        .publish_raw("payment_order.create", &env.to_bytes())
        .await;
    eventually("the bank to accept the order", DEADLINE, || async {
        (fleet.sandbox.effects().count(env.key.as_str()) == 1).then_some(())
    })
    .await;
    victim.kill().await;

    let _other = fleet.worker();
    let q = fleet.topology().action_queue("payment_order.create");
    eventually(
        "the redelivery to be settled by the other worker",
        DEADLINE,
        || async { (fleet.depth(&q) == (0, 0)).then_some(()) },
    )
    .await;
    let op = fleet
        .producer()
        .await
        .status(&env.key)
        .await
        .expect("status")
        .expect("row");
    assert_eq!(
        op.status,
        oncely_core::Status::Executing,
        "left for the sweeper/reconciler, not re-executed"
    );
    assert_eq!(op.attempt_count, 1, "one attempt, never a second claim");
    let stats = control.stats().await.expect("stats");
    assert_eq!(
        stats["executes"]["bank"],
        json!(1),
        "exactly one provider call: {stats}"
    );
    assert_eq!(fleet.sandbox.effects().count(env.key.as_str()), 1);
}

/// Invalid deliveries are dead-lettered with a reason; the worker keeps going; nothing is
/// written to the journal for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_deliveries_are_dead_lettered_with_a_reason() {
    let fleet = Fleet::new().await;
    let worker = fleet.worker();
    let good = intent("email.send", 1).seal(&secret()).expect("seal");
    let mut v2 = good.to_json();
    v2["schema"] = json!("oncely.intent.v2");
    let mut forged = good.to_json();
    forged["revision"] = json!(99);
    let mut wrong_type = intent("ticket.create", 2)
        .seal(&secret())
        .expect("seal")
        .to_json();
    wrong_type["action_type"] = json!("email.send"); // key no longer matches
    let big = {
        let mut e = good.to_json();
        e["payload"]["body"] = Value::String("x".repeat(2 * 1024 * 1024));
        serde_json::to_vec(&e).expect("json")
    };
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("not_json", b"this is not json".to_vec()),
        ("schema_version", serde_json::to_vec(&v2).expect("json")),
        ("key_mismatch", serde_json::to_vec(&forged).expect("json")),
        (
            "key_mismatch",
            serde_json::to_vec(&wrong_type).expect("json"),
        ),
        ("too_large", big),
    ];
    for (_, body) in &cases {
        fleet.publish_raw("email.send", body).await;
    }
    // An action type the fleet has no policy for, published straight into a queue.
    let dead = fleet.topology().dead_queue();
    eventually(
        "all invalid messages in the dead-letter queue",
        DEADLINE,
        || async { (fleet.ready(&dead).await as usize == cases.len()).then_some(()) },
    )
    .await;

    let mut reasons = Vec::new();
    for _ in 0..cases.len() {
        let msg = fleet
            .channel
            .basic_get(
                dead.as_str().into(),
                lapin::options::BasicGetOptions { no_ack: true },
            )
            .await
            .expect("get")
            .expect("a message");
        let headers = msg.delivery.properties.headers().clone().expect("headers");
        let reason = match headers.inner().get("x-oncely-reject-reason") {
            Some(lapin::types::AMQPValue::LongString(s)) => {
                String::from_utf8_lossy(s.as_bytes()).into_owned()
            }
            other => panic!("reason header missing or not a string: {other:?}"),
        };
        reasons.push(reason);
    }
    for (want, _) in &cases {
        assert!(
            reasons.iter().any(|r| r == want),
            "{want} not among {reasons:?}"
        );
    }
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM agent_operations")
        .fetch_one(&fleet.db.pool)
        .await
        .expect("count");
    assert_eq!(rows, 0, "nothing written half-way");

    // The worker is still alive and working.
    fleet.publish_raw("email.send", &good.to_bytes()).await;
    wait_all_succeeded(&fleet, 1).await;
    assert!(
        !worker.logs().contains(&"x".repeat(64)),
        "no payload in logs"
    );
}

/// A Python agent publishes with pika, following only docs/ and the JSON Schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_agent_can_publish_with_pika() {
    let fleet = Fleet::new().await;
    let _w = fleet.worker();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/publish_intent.py");
    let out = tokio::process::Command::new(oncely_tests::python())
        .arg(script)
        .env("ONCELY_KEY_SECRET", oncely_tests::fleet::SECRET)
        .env("ONCELY_AMQP_URL", oncely_tests::amqp_url())
        .env("ONCELY_PREFIX", &fleet.prefix)
        .output()
        .await
        .expect("the test venv's python (run scripts/test)");
    assert!(
        out.status.success(),
        "python publisher failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let key = String::from_utf8(out.stdout)
        .expect("utf-8")
        .trim()
        .to_owned();
    let key = oncely_core::IdempotencyKey::parse(&key).expect("the script prints the key");
    wait_all_succeeded(&fleet, 1).await;
    assert_eq!(fleet.sandbox.effects().count(key.as_str()), 1);
    // Publishing the same intent again from Python changes nothing.
    let again = tokio::process::Command::new(oncely_tests::python())
        .arg(script)
        .env("ONCELY_KEY_SECRET", oncely_tests::fleet::SECRET)
        .env("ONCELY_AMQP_URL", oncely_tests::amqp_url())
        .env("ONCELY_PREFIX", &fleet.prefix)
        .output()
        .await
        .expect("the test venv's python (run scripts/test)");
    assert!(again.status.success());
    let q = fleet.topology().action_queue("email.send");
    eventually("the repeat settled", DEADLINE, || async {
        (fleet.depth(&q) == (0, 0)).then_some(())
    })
    .await;
    assert_eq!(fleet.sandbox.effects().count(key.as_str()), 1);
}

/// `[actions."TYPE"] outcome_events = false`: that type's settlements publish no outcome
/// event (the effect and the journal are as usual); other types' events still go out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_type_with_outcome_events_off_publishes_none() {
    use oncely_tests::fleet::{FleetOptions, next_outcome};
    fn emails_silent(c: &mut oncely_core::config::Config) {
        c.actions
            .get_mut("email.send")
            .expect("email.send")
            .outcome_events = false;
    }
    let fleet = Fleet::with(FleetOptions {
        configure: Some(emails_silent),
        ..FleetOptions::default()
    })
    .await;
    let mut outcomes = fleet.listen_outcomes("#").await;
    let _w = fleet.worker();
    let email = intent("email.send", 1).seal(&secret()).expect("seal");
    let ticket = intent("ticket.create", 2).seal(&secret()).expect("seal");
    fleet.publish_raw("email.send", &email.to_bytes()).await;
    eventually("the email to succeed", DEADLINE, || async {
        fleet
            .op(&email.key)
            .await
            .filter(|op| op.status == oncely_core::Status::Succeeded)
    })
    .await;
    assert_eq!(fleet.sandbox.effects().count(email.key.as_str()), 1);
    // One worker publishes its events in order on one channel: had the email's event been
    // published, it would arrive before the ticket's.
    fleet.publish_raw("ticket.create", &ticket.to_bytes()).await;
    let (routing_key, event) = next_outcome(&mut outcomes).await;
    assert_eq!(routing_key, "ticket.create.succeeded");
    assert_eq!(event["idempotency_key"], ticket.key.as_str());
}

/// oncely asks RabbitMQ for 16 KiB frames unless the URL names a size (lapin keeps 64
/// frames of buffer per connection: 1 MiB instead of 8 with the broker's 128 KiB), and an
/// intent of ~200 kB — a body split over a dozen frames — goes through an SDK producer
/// and a worker intact and executes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_are_16_kib_unless_the_url_says_and_a_larger_intent_executes_once() {
    use oncely_core::amqp::DEFAULT_FRAME_MAX;
    let fleet = Fleet::new().await;
    let conn = oncely_core::topology::connect(&fleet.config.broker, "oncely-test-frames")
        .await
        .expect("connect");
    assert_eq!(DEFAULT_FRAME_MAX, 16 * 1024);
    assert_eq!(conn.configuration().frame_max(), DEFAULT_FRAME_MAX);
    let mut asked = fleet.config.broker.clone();
    asked.url = format!("{}?frame_max=65536", asked.url);
    let conn64 = oncely_core::topology::connect(&asked, "oncely-test-frames")
        .await
        .expect("connect with frame_max in the URL");
    assert_eq!(conn64.configuration().frame_max(), 65536);

    let _w = fleet.worker();
    let body = "Approved. ".repeat(20_000);
    let big = Intent::from_json(json!({
        "action_type": "email.send", "workflow_id": "case-big", "step": "step",
        "business_object": "obj-big", "revision": 1,
        "payload": {"to": "big@example.test", "subject": "Your application", "body": body}
    }))
    .expect("intent");
    let producer = fleet.producer().await;
    let enqueued = producer.enqueue(big.clone()).await.expect("enqueue");
    assert!(matches!(
        enqueued,
        oncely_producer::Enqueued::Enqueued { .. }
    ));
    let key = big.seal(&secret()).expect("seal").key;
    eventually("the large intent to succeed", DEADLINE, || async {
        fleet
            .op(&key)
            .await
            .filter(|op| op.status == oncely_core::Status::Succeeded)
    })
    .await;
    assert_eq!(fleet.sandbox.effects().count(key.as_str()), 1);
}

/// The acks of a committed batch travel as `multiple` acks where nothing below them is
/// still held, and singly above a call still in flight. With a third of the calls slowed
/// by 300 ms (so calls finish out of order and `multiple` acks must stop below them),
/// every delivery is acked exactly once: the queue ends with nothing ready or unacked, the
/// worker saw no delivery twice (an ack covering a delivery it must not, or naming a
/// settled tag, closes the channel and redelivers: `duplicate` verdicts), no ack was
/// refused, and fewer ack frames than deliveries were written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_travel_in_runs_and_calls_finishing_out_of_order_are_acked_once() {
    let fleet = Fleet::new().await;
    fleet
        .sandbox
        .control()
        .set_faults_json(
            &json!({"seed": 7, "rules": [{"mode": "latency", "rate": 0.3, "latency_ms": 300}]}),
        )
        .await
        .expect("faults");
    let port = oncely_tests::free_port();
    let worker = fleet.spawn(&["run", "--metrics-addr", &format!("127.0.0.1:{port}")]);
    let producer = fleet.producer().await;
    let n = 400;
    for i in 0..n {
        producer
            .enqueue(intent("email.send", i))
            .await
            .expect("enqueue");
    }
    wait_all_succeeded(&fleet, n as i64).await;
    let q = fleet.topology().action_queue("email.send");
    eventually(
        "the queue drained and every delivery acked",
        DEADLINE,
        || async { (fleet.depth(&q) == (0, 0)).then_some(()) },
    )
    .await;
    let effects = fleet.sandbox.effects();
    assert_eq!(effects.total, n as u64, "one effect per key");
    assert_eq!(effects.duplicates().count(), 0);

    let text = oncely_tests::http_get(port, "/metrics")
        .await
        .expect("worker metrics");
    let value = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} not in the worker's metrics"))
    };
    let frames = value("oncely_ack_batch_size_count");
    let acked = value("oncely_ack_batch_size_sum");
    assert_eq!(
        acked, n as f64,
        "every delivery acked once, through the ledger"
    );
    assert!(
        frames < acked,
        "acks batched: {frames} frames for {acked} deliveries"
    );
    // Series start at 0: every verdict but `claimed` must still be there.
    let others: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("oncely_deliveries_total{"))
        .filter(|l| !l.contains("verdict=\"claimed\"") && !l.ends_with(" 0"))
        .collect();
    assert!(
        others.is_empty(),
        "every delivery claimed on its first delivery, none redelivered: {others:?}"
    );
    assert_eq!(
        value("oncely_deliveries_total{action_type=\"email.send\",verdict=\"claimed\"}"),
        n as f64
    );
    let logs = worker.logs();
    assert!(!logs.contains("ack refused"), "{logs}");
    assert!(!logs.contains("ack failed"), "{logs}");
}
