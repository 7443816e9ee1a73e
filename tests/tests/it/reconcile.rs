//! Unknown never becomes a blind retry: the reconciler asks first, the sweeper heals,
//! a person decides when nobody can tell. Real workers, reconcilers and admin commands.

use oncely_core::journal::Review;
use oncely_core::review::ReviewClass;
use oncely_core::{Envelope, Intent, Status};
use oncely_producer::Enqueued;
use oncely_tests::eventually;
use oncely_tests::fleet::{FAST_RECONCILER, Fleet, FleetOptions, next_outcome, secret};
use serde_json::{Value, json};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(60);

fn payment(n: usize, amount: u64) -> Intent {
    Intent::from_json(json!({"action_type": "payment_order.create", "workflow_id": "case-1842", "step": "pay_grant",
        "business_object": format!("application-{n}"), "revision": 1,
        "payload": {"account_id": "example-account", "amount_minor": amount, "currency": "RUB", "business_reference": format!("application-{n}")}}))
    .expect("intent")
}

fn email(n: usize) -> Intent {
    Intent::from_json(json!({"action_type": "email.send", "workflow_id": "case-7", "step": "notify",
        "business_object": format!("application-{n}"), "revision": 1, "payload": {"to": "a@example.test", "subject": "hello"}}))
    .expect("intent")
}

fn quick() -> FleetOptions {
    FleetOptions {
        timeout: "1s".into(),
        lease: "3s".into(),
        reconciler: Some(FAST_RECONCILER),
        ..FleetOptions::default()
    }
}

async fn wait_status(
    fleet: &Fleet,
    env: &Envelope,
    status: Status,
) -> oncely_core::journal::Operation {
    eventually(&format!("{} to be {status}", env.key), DEADLINE, || async {
        fleet.op(&env.key).await.filter(|op| op.status == status)
    })
    .await
}

async fn events(fleet: &Fleet, env: &Envelope) -> Vec<oncely_core::journal::Event> {
    fleet.db.journal().events(&env.key).await.expect("events")
}

/// The article's check, step by step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_articles_check_step_by_step() {
    let fleet = Fleet::with(quick()).await;
    let control = fleet.sandbox.control();
    // 1. One intent, its key.
    let env = payment(731, 125_000).seal(&secret()).expect("seal");
    // 4. The bank accepts the request and then never answers (the worker times out at 1s).
    control
        .set_faults_json(&json!({"rules": [{"provider": "bank", "mode": "accept_then_timeout", "key": env.key.as_str(), "times": 1, "hold_ms": 30000}]}))
        .await
        .expect("faults");
    // 2. Two handlers at once with the same key.
    let _w1 = fleet.worker();
    let _w2 = fleet.worker();
    futures_util::future::join(
        fleet.publish_raw("payment_order.create", &env.to_bytes()),
        fleet.publish_raw("payment_order.create", &env.to_bytes()),
    )
    .await;
    let op = wait_status(&fleet, &env, Status::Unknown).await;
    // 3. One journal row, one claim.
    assert_eq!(op.attempt_count, 1);
    let claims = events(&fleet, &env)
        .await
        .iter()
        .filter(|e| e.reason == "claim")
        .count();
    assert_eq!(claims, 1, "one worker got the right to call");
    assert_eq!(fleet.sandbox.effects().count(env.key.as_str()), 1);
    // 5–6. Restart (a reconciler comes up): it looks up before anything is resent.
    let _r = fleet.reconciler();
    let op = wait_status(&fleet, &env, Status::Succeeded).await;
    assert!(
        op.provider_operation_id
            .as_deref()
            .is_some_and(|id| id.starts_with("po_"))
    );
    let stats = control.stats().await.expect("stats");
    assert_eq!(
        stats["executes"]["bank"],
        json!(1),
        "nothing was resent: {stats}"
    );
    assert_eq!(fleet.sandbox.effects().count(env.key.as_str()), 1);
    let decision = events(&fleet, &env)
        .await
        .into_iter()
        .find(|e| e.from_status.as_deref() == Some("unknown"))
        .expect("decision event");
    assert_eq!(
        (decision.to_status.as_str(), decision.reason.as_str()),
        ("succeeded", "reconcile_found_succeeded")
    );
    // The agent re-runs with the same business context: the saved result, no new call.
    let producer = fleet.producer().await;
    match producer
        .enqueue(payment(731, 125_000))
        .await
        .expect("enqueue")
    {
        Enqueued::Duplicate {
            status,
            provider_operation_id,
            ..
        } => {
            assert_eq!(status, Status::Succeeded);
            assert_eq!(provider_operation_id, op.provider_operation_id);
        }
        other => panic!("expected a duplicate, got {other:?}"),
    }
    // 7. Change the payload, keep the key: a conflict.
    assert!(matches!(
        producer
            .enqueue(payment(731, 999_999))
            .await
            .expect("enqueue"),
        Enqueued::Conflict { .. }
    ));
    assert_eq!(fleet.sandbox.effects().count(env.key.as_str()), 1);
}

/// A worker SIGKILLed mid-call: its lease expires, the sweeper makes it unknown, the
/// reconciler finds the effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_is_swept_to_unknown_and_reconciled() {
    let fleet = Fleet::with(quick()).await;
    fleet
        .sandbox
        .control()
        .set_faults_json(&json!({"rules": [{"provider": "bank", "mode": "latency", "latency_ms": 600, "times": 1}]}))
        .await
        .expect("faults");
    let victim = fleet.worker();
    let env = payment(1, 500).seal(&secret()).expect("seal");
    fleet
        .publish_raw("payment_order.create", &env.to_bytes())
        .await;
    wait_status(&fleet, &env, Status::Executing).await;
    // Killed only once the request has reached the bank (executing is committed before
    // the call is sent; on a busy machine the kill could otherwise come first).
    eventually("the request to reach the bank", DEADLINE, || async {
        let stats = fleet.sandbox.control().stats().await.expect("stats");
        (stats["executes"]["bank"] == json!(1)).then_some(())
    })
    .await;
    victim.kill().await;
    // The bank finishes the order after the worker died.
    eventually("the bank to commit", DEADLINE, || async {
        (fleet.sandbox.effects().count(env.key.as_str()) == 1).then_some(())
    })
    .await;
    let _r = fleet.reconciler();
    let _w = fleet.worker();
    let op = wait_status(&fleet, &env, Status::Succeeded).await;
    assert_eq!(op.attempt_count, 1, "never re-executed");
    let trail = events(&fleet, &env).await;
    assert!(
        trail.iter().any(|e| e.reason == "lease_expired"
            && e.to_status == "unknown"
            && e.actor.starts_with("sweeper:")),
        "{trail:?}"
    );
    assert_eq!(fleet.sandbox.effects().count(env.key.as_str()), 1);
    assert_eq!(
        fleet.sandbox.control().stats().await.expect("stats")["executes"]["bank"],
        json!(1)
    );
}

/// Lookup disabled for the bank: unknown → review, no second call; a person resolves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_lookup_a_person_decides_and_retry_means_one_more_attempt() {
    let fleet = Fleet::with(FleetOptions {
        max_reconcile_checks: Some(2),
        ..quick()
    })
    .await;
    let a = payment(10, 100).seal(&secret()).expect("seal");
    let b = payment(11, 200).seal(&secret()).expect("seal");
    fleet
        .sandbox
        .control()
        .set_faults_json(&json!({"lookup_disabled": ["bank"], "rules": [
            {"provider": "bank", "mode": "accept_then_timeout", "key": a.key.as_str(), "times": 1, "hold_ms": 30000},
            {"provider": "bank", "mode": "error_before_commit", "key": b.key.as_str(), "times": 1}]}))
        .await
        .expect("faults");
    let _w = fleet.worker();
    let _r = fleet.reconciler();
    fleet
        .publish_raw("payment_order.create", &a.to_bytes())
        .await;
    fleet
        .publish_raw("payment_order.create", &b.to_bytes())
        .await;
    for env in [&a, &b] {
        eventually("a review to open", DEADLINE, || async {
            let reviews = fleet
                .db
                .journal()
                .reviews_of(&env.key)
                .await
                .expect("reviews");
            (!reviews.is_empty()).then_some(())
        })
        .await;
        assert_eq!(
            fleet.op(&env.key).await.expect("row").status,
            Status::Unknown
        );
    }
    let (code, out, _) = fleet.admin(&["review", "list"]).await;
    assert_eq!(code, 0);
    assert!(
        out.contains(a.key.as_str()) && out.contains(b.key.as_str()),
        "{out}"
    );
    assert_eq!(
        fleet.sandbox.control().stats().await.expect("stats")["executes"]["bank"],
        json!(2),
        "no second call for either"
    );

    // A: the bank statement shows the order: resolve as succeeded, with the audit record.
    let (code, _, err) = fleet
        .admin(&[
            "review",
            "resolve",
            a.key.as_str(),
            "--as",
            "succeeded",
            "--by",
            "alice",
        ])
        .await;
    assert_ne!(code, 0, "succeeded needs the provider's id");
    assert!(err.contains("--provider-operation-id"), "{err}");
    let (code, out, err) = fleet
        .admin(&[
            "review",
            "resolve",
            a.key.as_str(),
            "--as",
            "succeeded",
            "--provider-operation-id",
            "po_from_statement",
            "--by",
            "alice",
            "--note",
            "seen in statement 2026-12-02",
        ])
        .await;
    assert_eq!(code, 0, "{out}{err}");
    let op = fleet.op(&a.key).await.expect("row");
    assert_eq!(
        (op.status, op.provider_operation_id.as_deref()),
        (Status::Succeeded, Some("po_from_statement"))
    );
    let review = fleet
        .db
        .journal()
        .reviews_of(&a.key)
        .await
        .expect("reviews")
        .pop()
        .expect("review");
    assert_eq!(
        (
            review.resolution.as_deref(),
            review.resolved_by.as_deref(),
            review.note.as_deref()
        ),
        (
            Some("succeeded"),
            Some("alice"),
            Some("seen in statement 2026-12-02")
        )
    );
    let last = events(&fleet, &a).await.pop().expect("event");
    assert_eq!(
        (last.actor.as_str(), last.reason.as_str()),
        ("review:alice", "review_succeeded")
    );

    // B: the bank never got it (5xx before commit): retry authorises exactly one more attempt.
    let (code, out, err) = fleet
        .admin(&[
            "review",
            "resolve",
            b.key.as_str(),
            "--as",
            "retry",
            "--by",
            "bob",
        ])
        .await;
    assert_eq!(code, 0, "{out}{err}");
    let op = wait_status(&fleet, &b, Status::Succeeded).await;
    assert_eq!(op.attempt_count, 2, "exactly one more attempt");
    assert_eq!(
        events(&fleet, &b)
            .await
            .iter()
            .filter(|e| e.reason == "claim")
            .count(),
        2
    );
    assert_eq!(fleet.sandbox.effects().count(b.key.as_str()), 1);
    assert_eq!(fleet.sandbox.effects().count(a.key.as_str()), 1);
    let (code, out, _) = fleet.admin(&["ops", "show", b.key.as_str()]).await;
    assert_eq!(code, 0);
    assert!(
        out.contains("review_retry")
            && out.contains("review:bob")
            && !out.contains("example-account"),
        "{out}"
    );
}

/// A provider that forgets keys: an absent lookup after its retention is not retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absence_after_the_key_retention_window_goes_to_review_not_retry() {
    let fleet = Fleet::with(FleetOptions {
        key_retention: "4s".into(),
        ..quick()
    })
    .await;
    let forgotten = email(1).seal(&secret()).expect("seal");
    let fresh = email(2).seal(&secret()).expect("seal");
    fleet
        .sandbox
        .control()
        .set_faults_json(&json!({"forget_keys_after_ms": 300, "rules": [
            {"provider": "mail", "mode": "accept_then_timeout", "key": forgotten.key.as_str(), "times": 1, "hold_ms": 30000},
            {"provider": "mail", "mode": "error_before_commit", "key": fresh.key.as_str(), "times": 1}]}))
        .await
        .expect("faults");
    let _w = fleet.worker();
    fleet.publish_raw("email.send", &forgotten.to_bytes()).await;
    fleet.publish_raw("email.send", &fresh.to_bytes()).await;
    let op = wait_status(&fleet, &forgotten, Status::Unknown).await;
    wait_status(&fleet, &fresh, Status::Unknown).await;
    // Wait (on the database clock) until the first attempt is older than retention − lease.
    let first = op.first_attempt_at.expect("first attempt");
    eventually("the key-retention window to pass", DEADLINE, || async {
        let now = fleet.op(&forgotten.key).await.expect("row").read_at;
        (now > first + chrono::Duration::seconds(2)).then_some(())
    })
    .await;
    let _r = fleet.reconciler();
    eventually("a review for the forgotten key", DEADLINE, || async {
        let r = fleet
            .db
            .journal()
            .reviews_of(&forgotten.key)
            .await
            .expect("reviews");
        r.first()
            .filter(|r| r.reason == "absent_outside_key_retention")
            .map(|_| ())
    })
    .await;
    assert_eq!(
        fleet.op(&forgotten.key).await.expect("row").status,
        Status::Unknown
    );
    assert_eq!(
        fleet.sandbox.effects().count(forgotten.key.as_str()),
        1,
        "a retry would have made a second email"
    );
    // The 5xx-before-commit email was absent too, also outside the window here.
    assert_eq!(fleet.sandbox.effects().count(fresh.key.as_str()), 0);
}

/// Absent inside the retention window (and a key-honouring provider): retried once, with
/// the same key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absence_inside_the_window_is_retried_with_the_same_key() {
    let fleet = Fleet::with(quick()).await;
    let env = email(3).seal(&secret()).expect("seal");
    fleet
        .sandbox
        .control()
        .set_faults_json(&json!({"rules": [{"provider": "mail", "mode": "error_before_commit", "key": env.key.as_str(), "times": 1}]}))
        .await
        .expect("faults");
    let _w = fleet.worker();
    let _r = fleet.reconciler();
    fleet.publish_raw("email.send", &env.to_bytes()).await;
    let op = wait_status(&fleet, &env, Status::Succeeded).await;
    assert_eq!(op.attempt_count, 2);
    assert!(
        events(&fleet, &env)
            .await
            .iter()
            .any(|e| e.reason == "reconcile_absent_retry")
    );
    assert_eq!(fleet.sandbox.effects().count(env.key.as_str()), 1);
}

/// A planned row whose message was never published is republished and executed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_row_never_published_is_republished_once() {
    let fleet = Fleet::with(quick()).await;
    let env = payment(77, 7700).seal(&secret()).expect("seal");
    fleet
        .db
        .journal()
        .record(&env, "crashed-producer")
        .await
        .expect("record");
    let _w = fleet.worker();
    let _r = fleet.reconciler();
    let op = wait_status(&fleet, &env, Status::Succeeded).await;
    assert_eq!(op.attempt_count, 1);
    assert_eq!(fleet.sandbox.effects().count(env.key.as_str()), 1);
    // And the SDK's wait() sees it.
    let producer = fleet.producer().await;
    let done = producer
        .wait(&env.key, Duration::from_secs(5))
        .await
        .expect("wait")
        .expect("terminal");
    assert_eq!(done.status, Status::Succeeded);
}

/// Two reconcilers at once, duplicate reconcile messages: each operation decided once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_reconcilers_never_decide_twice() {
    let fleet = Fleet::with(quick()).await;
    let envs: Vec<Envelope> = (0..20)
        .map(|n| {
            payment(100 + n, 1000 + n as u64)
                .seal(&secret())
                .expect("seal")
        })
        .collect();
    fleet
        .sandbox
        .control()
        .set_faults_json(&json!({"rules": [{"provider": "bank", "mode": "accept_then_timeout", "hold_ms": 30000}]}))
        .await
        .expect("faults");
    let w = fleet.worker();
    for e in &envs {
        fleet
            .publish_raw("payment_order.create", &e.to_bytes())
            .await;
    }
    eventually("all unknown", DEADLINE, || async {
        (fleet.count("unknown").await == 20).then_some(())
    })
    .await;
    drop(w);
    fleet
        .sandbox
        .control()
        .set_faults_json(&json!({}))
        .await
        .expect("faults");
    // Extra copies of the reconcile messages.
    let q = fleet.topology().reconcile_queue();
    for e in &envs {
        let body = json!({"idempotency_key": e.key.as_str(), "attempt": 1}).to_string();
        let ch = &fleet.channel;
        ch.basic_publish(
            "".into(),
            q.as_str().into(),
            Default::default(),
            body.as_bytes(),
            Default::default(),
        )
        .await
        .expect("publish");
    }
    let _r1 = fleet.reconciler();
    let _r2 = fleet.reconciler();
    eventually("all settled", DEADLINE, || async {
        (fleet.count("succeeded").await == 20).then_some(())
    })
    .await;
    for e in &envs {
        let decisions = events(&fleet, e)
            .await
            .into_iter()
            .filter(|ev| ev.from_status.as_deref() == Some("unknown"))
            .count();
        assert_eq!(decisions, 1, "{} decided {decisions} times", e.key);
        assert_eq!(fleet.sandbox.effects().count(e.key.as_str()), 1);
    }
}

/// A provider whose lookups hang until released: counts the requests it holds.
struct HangingLookups {
    port: u16,
    seen: tokio::sync::watch::Receiver<usize>,
    release: tokio::sync::watch::Sender<bool>,
}

impl HangingLookups {
    async fn start() -> HangingLookups {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let (seen_tx, seen) = tokio::sync::watch::channel(0usize);
        let (release, released) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let (seen_tx, mut released) = (seen_tx.clone(), released.clone());
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    seen_tx.send_modify(|n| *n += 1);
                    let _ = released.wait_for(|r| *r).await;
                    let _ = s
                        .write_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                        .await;
                });
            }
        });
        HangingLookups {
            port,
            seen,
            release,
        }
    }
}

/// A slow provider does not hold back lease expiry: while the sweeper's lookups of stale
/// unknowns hang (they cannot finish before the test releases them), leases that expire
/// meanwhile are still turned into `unknown` by the next sweeps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hanging_lookups_do_not_hold_back_lease_expiry() {
    let fleet = Fleet::with(FleetOptions {
        timeout: "10m".into(),
        lease: "11m".into(),
        reconciler: Some(FAST_RECONCILER),
        ..FleetOptions::default()
    })
    .await;
    let j = fleet.db.journal();
    let past = |key: &oncely_core::IdempotencyKey, secs_ago: f64| {
        sqlx::query(
            "UPDATE agent_operations SET lease_until = now() - make_interval(secs => $2) WHERE idempotency_key = $1",
        )
        .bind(key.as_str().to_owned())
        .bind(secs_ago)
    };
    let claim = |e: &Envelope| {
        let j = j.clone();
        let e = e.clone();
        async move {
            let req = oncely_core::journal::ClaimRequest {
                envelope: &e,
                lease: Duration::from_secs(600),
            };
            let out = j.claim(&[req], "dead-worker").await.expect("claim");
            assert!(matches!(
                out[0],
                oncely_core::journal::ClaimOutcome::Claimed(_)
            ));
        }
    };
    // Two unknowns nobody has checked for an hour: the sweeper looks them up itself.
    let stale: Vec<Envelope> = (0..2)
        .map(|n| payment(500 + n, 1).seal(&secret()).expect("seal"))
        .collect();
    for e in &stale {
        claim(e).await;
        let unknown = oncely_core::journal::Completion {
            key: e.key.clone(),
            expected: Status::Executing,
            attempt: 1,
            verdict: oncely_core::journal::Verdict::Unknown {
                error_code: "timeout".into(),
                check_in: Duration::ZERO,
            },
            reason: "provider_timeout".into(),
        };
        assert!(j.complete(&unknown, "dead-worker").await.expect("unknown"));
        past(&e.key, 3600.0)
            .execute(&fleet.db.pool)
            .await
            .expect("age");
    }
    let bank = HangingLookups::start().await;
    let bank_url = format!("http://127.0.0.1:{}", bank.port);
    let _r = fleet.spawn_with_env(
        &["reconcile"],
        &[("ONCELY__PROVIDERS__BANK__BASE_URL", bank_url.as_str())],
    );
    let mut seen = bank.seen.clone();
    tokio::time::timeout(DEADLINE, seen.wait_for(|n| *n >= 1))
        .await
        .expect("the sweeper to start a lookup")
        .expect("lookup server");

    // Now three workers die: their leases are over.
    let expired: Vec<Envelope> = (0..3)
        .map(|n| payment(600 + n, 1).seal(&secret()).expect("seal"))
        .collect();
    for e in &expired {
        claim(e).await;
        past(&e.key, 1.0)
            .execute(&fleet.db.pool)
            .await
            .expect("expire");
    }
    for e in &expired {
        let op = wait_status(&fleet, e, Status::Unknown).await;
        assert_eq!(op.last_reason, "lease_expired");
    }
    // The lookups were still hanging all along: nothing was decided for the stale ones.
    assert!(!*bank.release.borrow());
    for e in &stale {
        let op = fleet.op(&e.key).await.expect("row");
        assert_eq!(op.status, Status::Unknown);
        assert_eq!(op.last_reason, "provider_timeout");
    }
    let _ = bank.release.send(true);
}

/// The operation's latest review, if any.
async fn review_of(fleet: &Fleet, env: &Envelope) -> Option<Review> {
    fleet
        .db
        .journal()
        .reviews_of(&env.key)
        .await
        .expect("reviews")
        .pop()
}

/// Outcomes heard until `key`'s with this routing key (a bounded number of them).
async fn hear(consumer: &mut lapin::Consumer, routing_key: &str, key: &str) -> Value {
    for _ in 0..20 {
        let (rk, body) = next_outcome(consumer).await;
        if rk == routing_key && body["idempotency_key"] == json!(key) {
            return body;
        }
    }
    panic!("no {routing_key} outcome for {key}");
}

/// Lookups down: a payment order whose answer was lost goes to a person only because
/// its lookups answered 503 — a transient reason, so the reconciler keeps looking it up
/// in the background (and records each lookup). Once lookups are back, the review closes
/// itself (`auto:lookup`) in the same transaction as the operation's move to `succeeded`
/// with the bank's id, the outcome is published, and the bank holds one effect. A
/// definitive review (money proven absent: never retried without a person) is never
/// re-checked and stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_review_for_unavailable_lookups_closes_itself_once_they_return() {
    let fleet = Fleet::with(FleetOptions {
        max_reconcile_checks: Some(2),
        ..quick()
    })
    .await;
    let mut outcomes = fleet.listen_outcomes("payment_order.create.*").await;
    let control = fleet.sandbox.control();
    let a = payment(40, 400).seal(&secret()).expect("seal");
    let b = payment(41, 410).seal(&secret()).expect("seal");
    // B: a 5xx before the bank committed: the bank has nothing, and money is never
    // retried on absence alone.
    control
        .set_faults_json(&json!({"rules": [
            {"provider": "bank", "mode": "error_before_commit", "key": b.key.as_str(), "times": 1}]}))
        .await
        .expect("faults");
    let _w = fleet.worker();
    let _r = fleet.reconciler();
    fleet
        .publish_raw("payment_order.create", &b.to_bytes())
        .await;
    let rb = eventually("b's review", DEADLINE, || review_of(&fleet, &b)).await;
    assert_eq!(rb.reason, "absent_policy_requires_review");
    assert_eq!(rb.reason().class(), ReviewClass::Definitive);
    assert!(rb.waits_for_person(), "{rb:?}");

    // A: the bank accepts and never answers, and its lookups are down.
    control
        .set_faults_json(&json!({"lookup_disabled": ["bank"], "rules": [
            {"provider": "bank", "mode": "accept_then_timeout", "key": a.key.as_str(), "times": 1, "hold_ms": 30000}]}))
        .await
        .expect("faults");
    fleet
        .publish_raw("payment_order.create", &a.to_bytes())
        .await;
    let ra = eventually(
        "a's review, re-checked while lookups are down",
        DEADLINE,
        // Two lookups by re-checks recorded, besides the one that opened it (`rechecks`
        // counts a re-check when it is taken, before its lookup is recorded).
        || async {
            review_of(&fleet, &a)
                .await
                .filter(|r| r.evidence.lookups.len() >= 3)
        },
    )
    .await;
    assert_eq!(ra.reason, "lookup_failing:http_503");
    assert_eq!(ra.reason().class(), ReviewClass::Transient);
    assert!(ra.resolution.is_none() && ra.recheck_at.is_some(), "{ra:?}");
    let ev = &ra.evidence;
    assert_eq!(
        (
            ev.policy.as_deref(),
            ev.provider.as_deref(),
            ev.key_retention_secs,
            ev.attempts,
            ev.checks_before_review
        ),
        (
            Some("reconcile_then_review"),
            Some("bank"),
            Some(86_400),
            1,
            2
        )
    );
    assert!(ra.rechecks >= 2, "{ra:?}");
    assert!(
        ev.lookups
            .iter()
            .all(|l| (l.answer.as_str(), l.code.as_deref()) == ("failed", Some("http_503"))),
        "{ev:?}"
    );
    assert_eq!(fleet.op(&a.key).await.expect("row").status, Status::Unknown);
    hear(
        &mut outcomes,
        "payment_order.create.review_opened",
        a.key.as_str(),
    )
    .await;

    // Lookups are back: the next re-check settles it.
    control.set_faults_json(&json!({})).await.expect("faults");
    let op = wait_status(&fleet, &a, Status::Succeeded).await;
    let id = op.provider_operation_id.clone().expect("the bank's id");
    assert!(id.starts_with("po_"), "{id}");
    let ra = review_of(&fleet, &a).await.expect("review");
    assert_eq!(ra.resolution.as_deref(), Some("auto:lookup"), "{ra:?}");
    assert!(ra.recheck_at.is_none());
    let last = ra.evidence.lookups.last().expect("lookups");
    assert_eq!(
        (last.answer.as_str(), last.code.as_deref()),
        ("succeeded", Some(id.as_str()))
    );
    // The move and then the review's closing, both from the same statement (the newest
    // event first here).
    let trail: Vec<(String, String, Option<String>)> = events(&fleet, &a)
        .await
        .into_iter()
        .rev()
        .take(2)
        .map(|e| (e.to_status, e.reason, e.error_code))
        .collect();
    assert_eq!(
        trail,
        [
            (
                "succeeded".into(),
                "review_closed".into(),
                Some("auto:lookup".into())
            ),
            ("succeeded".into(), "reconcile_found_succeeded".into(), None),
        ]
    );
    let heard = hear(
        &mut outcomes,
        "payment_order.create.succeeded",
        a.key.as_str(),
    )
    .await;
    assert_eq!(heard["provider_operation_id"], json!(id));
    assert_eq!(fleet.sandbox.effects().count(a.key.as_str()), 1);
    assert_eq!(
        control.stats().await.expect("stats")["executes"]["bank"],
        json!(2),
        "a re-check never executes: one call each"
    );

    // B, definitive, was never looked up again and still waits for a person.
    let rb = review_of(&fleet, &b).await.expect("review");
    assert!(rb.waits_for_person() && rb.rechecks == 0, "{rb:?}");
    assert_eq!(fleet.op(&b.key).await.expect("row").status, Status::Unknown);
    let (code, out, _) = fleet.admin(&["review", "list", "--json"]).await;
    assert_eq!(code, 0);
    let listed: Value = serde_json::from_str(&out).expect("json");
    let listed_b = listed
        .as_array()
        .expect("array")
        .iter()
        .find(|r| r["idempotency_key"] == json!(b.key.as_str()))
        .expect("b listed");
    assert_eq!(
        (
            &listed_b["class"],
            &listed_b["waiting_on"],
            &listed_b["evidence"]["lookups"][0]["answer"]
        ),
        (&json!("definitive"), &json!("person"), &json!("absent")),
        "{listed_b}"
    );
    assert!(
        !listed
            .as_array()
            .expect("array")
            .iter()
            .any(|r| r["idempotency_key"] == json!(a.key.as_str())),
        "a closed review is not listed as open: {out}"
    );
}

/// Two reconcilers re-checking the same transient reviews: each closes once, each
/// operation is decided once, each effect happens once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_reconcilers_never_close_a_review_twice() {
    let fleet = Fleet::with(FleetOptions {
        max_reconcile_checks: Some(1),
        ..quick()
    })
    .await;
    let envs: Vec<Envelope> = (0..10)
        .map(|n| payment(500 + n, 5000).seal(&secret()).expect("seal"))
        .collect();
    fleet
        .sandbox
        .control()
        .set_faults_json(&json!({"lookup_disabled": ["bank"], "rules": [
            {"provider": "bank", "mode": "accept_then_timeout", "hold_ms": 30000}]}))
        .await
        .expect("faults");
    let w = fleet.worker();
    let _r1 = fleet.reconciler();
    for e in &envs {
        fleet
            .publish_raw("payment_order.create", &e.to_bytes())
            .await;
    }
    let open = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM operation_reviews WHERE resolved_at IS NULL AND recheck_at IS NOT NULL",
        )
        .fetch_one(&fleet.db.pool)
        .await
        .expect("count")
    };
    eventually("ten transient reviews", DEADLINE, || async {
        (open().await == 10).then_some(())
    })
    .await;
    drop(w);
    let _r2 = fleet.reconciler();
    fleet
        .sandbox
        .control()
        .set_faults_json(&json!({}))
        .await
        .expect("faults");
    eventually("all settled", DEADLINE, || async {
        (fleet.count("succeeded").await == 10).then_some(())
    })
    .await;
    for e in &envs {
        let trail = events(&fleet, e).await;
        let decided = trail
            .iter()
            .filter(|ev| ev.from_status.as_deref() == Some("unknown") && ev.to_status != "unknown")
            .count();
        let closed = trail
            .iter()
            .filter(|ev| ev.reason == "review_closed")
            .count();
        assert_eq!((decided, closed), (1, 1), "{}: {trail:?}", e.key);
        let reviews = fleet
            .db
            .journal()
            .reviews_of(&e.key)
            .await
            .expect("reviews");
        assert_eq!(reviews.len(), 1);
        assert_eq!(reviews[0].resolution.as_deref(), Some("auto:lookup"));
        assert_eq!(fleet.sandbox.effects().count(e.key.as_str()), 1);
    }
}

/// The value of `oncely_operations{status="<status>"}` in a reconciler's /metrics, if set.
async fn gauge(port: u16, status: &str) -> Option<f64> {
    let text = oncely_tests::http_get(port, "/metrics").await?;
    let prefix = format!("oncely_operations{{status=\"{status}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}

/// The gauges `oncely_operations{status}`: the live statuses every sweep (counted on their
/// own indexes), the terminal ones from a count of the whole journal every
/// `totals_interval` — and never with `"0s"`, where only the live ones are set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_gauges_count_live_states_every_sweep_and_totals_on_their_interval() {
    use oncely_core::config::ReconcilerConfig;
    use oncely_core::journal::ClaimRequest;
    for totals in [Duration::from_secs(1), Duration::ZERO] {
        let fleet = Fleet::with(FleetOptions {
            reconciler: Some(ReconcilerConfig {
                totals_interval: totals,
                ..FAST_RECONCILER
            }),
            ..quick()
        })
        .await;
        // Three succeed through a worker that then stops.
        let done: Vec<Envelope> = (0..3)
            .map(|n| email(500 + n).seal(&secret()).expect("seal"))
            .collect();
        {
            let _w = fleet.worker();
            for env in &done {
                fleet
                    .publish_raw(env.intent.identity.action_type.as_str(), &env.to_bytes())
                    .await;
            }
            for env in &done {
                wait_status(&fleet, env, Status::Succeeded).await;
            }
        }
        // Two recorded and never claimed (republished to a queue nobody consumes now), one
        // of them claimed under a lease that outlives the test: planned 1, executing 1.
        let journal = fleet.db.journal();
        let live: Vec<Envelope> = (0..2)
            .map(|n| email(600 + n).seal(&secret()).expect("seal"))
            .collect();
        for env in &live {
            journal.record(env, "test").await.expect("record");
        }
        journal
            .claim(
                &[ClaimRequest {
                    envelope: &live[0],
                    lease: Duration::from_secs(3600),
                }],
                "worker@test",
            )
            .await
            .expect("claim");

        let port = oncely_tests::free_port();
        let _r = fleet.spawn(&["reconcile", "--metrics-addr", &format!("127.0.0.1:{port}")]);
        let expected_live = [
            ("planned", 1.0),
            ("executing", 1.0),
            ("failed_retryable", 0.0),
            ("unknown", 0.0),
        ];
        eventually("the live gauges", DEADLINE, || async {
            for (status, n) in expected_live {
                if gauge(port, status).await != Some(n) {
                    return None;
                }
            }
            Some(())
        })
        .await;
        if totals.is_zero() {
            // Later sweeps (they see one more planned row) still set no totals.
            let third = email(602).seal(&secret()).expect("seal");
            journal.record(&third, "test").await.expect("record");
            eventually("a later sweep's planned gauge", DEADLINE, || async {
                (gauge(port, "planned").await == Some(2.0)).then_some(())
            })
            .await;
            assert_eq!(gauge(port, "succeeded").await, None, "totals_interval = 0s");
            assert_eq!(
                gauge(port, "failed_final").await,
                None,
                "totals_interval = 0s"
            );
        } else {
            eventually("the terminal gauges", DEADLINE, || async {
                (gauge(port, "succeeded").await == Some(3.0)
                    && gauge(port, "failed_final").await == Some(0.0))
                .then_some(())
            })
            .await;
            // One more succeeds (the claimed one, completed by hand): the live gauges follow
            // at the next sweep, the total at the next interval.
            let op = fleet.op(&live[0].key).await.expect("row");
            let completion = oncely_core::journal::Completion {
                key: live[0].key.clone(),
                expected: Status::Executing,
                attempt: op.attempt_count,
                verdict: oncely_core::journal::Verdict::Succeeded {
                    provider_operation_id: "prov-1".into(),
                    result: json!({"id": "prov-1"}),
                },
                reason: "provider_succeeded".into(),
            };
            assert!(
                journal
                    .complete(&completion, "test")
                    .await
                    .expect("complete")
            );
            eventually("the gauges after one more success", DEADLINE, || async {
                (gauge(port, "executing").await == Some(0.0)
                    && gauge(port, "succeeded").await == Some(4.0))
                .then_some(())
            })
            .await;
        }
    }
}

/// Between full passes the sweeper reads only leases and `planned` rows that became due
/// since its last pass; a row stamped behind that bound is left to the next full pass —
/// here the first pass of the next reconciler (every process starts with a full one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn between_full_passes_the_sweeper_reads_only_what_became_due_since_its_last_pass() {
    use oncely_core::config::ReconcilerConfig;
    use oncely_core::journal::ClaimRequest;
    let fleet = Fleet::with(FleetOptions {
        reconciler: Some(ReconcilerConfig {
            full_sweep_interval: Duration::from_secs(3600),
            ..FAST_RECONCILER
        }),
        ..quick()
    })
    .await;
    let journal = fleet.db.journal();
    let port = oncely_tests::free_port();
    let metrics = format!("127.0.0.1:{port}");
    let first = fleet.spawn(&["reconcile", "--metrics-addr", &metrics]);
    // The gauges are set at the end of a pass: the first, full one has run.
    eventually("the first pass", DEADLINE, || async {
        gauge(port, "planned").await.map(|_| ())
    })
    .await;

    let envs: Vec<Envelope> = (0..4)
        .map(|n| email(700 + n).seal(&secret()).expect("seal"))
        .collect();
    let [hidden_planned, hidden_lease, planned, lease] = [0, 1, 2, 3].map(|i| &envs[i]);
    for env in &envs {
        journal.record(env, "test").await.expect("record");
    }
    for (env, secs) in [(hidden_lease, 3600), (lease, 1)] {
        journal
            .claim(
                &[ClaimRequest {
                    envelope: env,
                    lease: Duration::from_secs(secs),
                }],
                "worker@test",
            )
            .await
            .expect("claim");
    }
    // Stamped an hour back, behind any bounded pass's window (as a transaction that began
    // long before the last pass and committed after it would leave them).
    for (env, sql) in [
        (
            hidden_planned,
            "UPDATE agent_operations SET updated_at = now() - interval '1 hour' WHERE idempotency_key = $1",
        ),
        (
            hidden_lease,
            "UPDATE agent_operations SET lease_until = now() - interval '1 hour' WHERE idempotency_key = $1",
        ),
    ] {
        let done = sqlx::query(sql)
            .bind(env.key.as_str())
            .execute(&fleet.db.pool)
            .await
            .expect("stamp");
        assert_eq!(done.rows_affected(), 1);
    }
    let hidden_stamp = fleet.op(&hidden_planned.key).await.expect("row").updated_at;
    let recorded = fleet.op(&planned.key).await.expect("row").updated_at;

    // The rows that became due after the last pass are taken...
    eventually("the planned row republished", DEADLINE, || async {
        (fleet.op(&planned.key).await?.updated_at > recorded).then_some(())
    })
    .await;
    eventually("the expired lease taken", DEADLINE, || async {
        (fleet.op(&lease.key).await?.status != Status::Executing).then_some(())
    })
    .await;
    // ...by passes that did not read the older ones, though those were due first: each
    // scan takes the longest-due rows first.
    assert_eq!(
        fleet.op(&hidden_planned.key).await.expect("row").updated_at,
        hidden_stamp,
        "a bounded pass republished a row stamped before its window"
    );
    assert_eq!(
        fleet.op(&hidden_lease.key).await.expect("row").status,
        Status::Executing,
        "a bounded pass expired a lease that ended before its window"
    );

    // A new reconciler's first pass is full: it finds both.
    first.kill().await;
    let _second = fleet.reconciler();
    eventually("the hidden planned row republished", DEADLINE, || async {
        (fleet.op(&hidden_planned.key).await?.updated_at > hidden_stamp).then_some(())
    })
    .await;
    eventually("the hidden lease expired", DEADLINE, || async {
        (fleet.op(&hidden_lease.key).await?.status != Status::Executing).then_some(())
    })
    .await;
}
