//! Control before the send, end to end with real processes (gateway, workers, reconciler):
//! approval gates over the HTTP API (threshold, four eyes, the requester, a deadline),
//! cancels racing claims, scheduled delivery under load, and expiry — in a backlog, and
//! behind a throttled provider. What must hold: a held, rejected, cancelled or expired
//! action never reaches the provider, an approved one reaches it exactly once, and every
//! cancel answer is true.

use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use oncely_core::Intent;
use oncely_core::config::{ApprovalRule, Config, ProviderConfig, RateLimitConfig};
use oncely_producer::{Asked, Enqueued};
use oncely_tests::eventually;
use oncely_tests::fleet::{FAST_RECONCILER, Fleet, FleetOptions};
use oncely_tests::gateway::{Client, Gateway, TOKEN_A, TokenSpec};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(90);

const APPROVER_1: TokenSpec = TokenSpec {
    token: "token-acme-approver-1",
    tenant: "acme",
    actions: None,
    quota: None,
    approve: true,
};
const APPROVER_2: TokenSpec = TokenSpec {
    token: "token-acme-approver-2",
    tenant: "acme",
    actions: None,
    quota: None,
    approve: true,
};
const GLOBEX_APPROVER: TokenSpec = TokenSpec {
    token: "token-globex-approver",
    tenant: "globex",
    actions: None,
    quota: None,
    approve: true,
};

/// Payments above 1,000.00 wait for a person, above 10,000.00 for two; any other
/// currency than EUR waits too, and only two seconds.
fn payment_rules(c: &mut Config) {
    let p = c
        .actions
        .get_mut("payment_order.create")
        .expect("payments are configured");
    p.approval = vec![
        ApprovalRule {
            name: "large-payments".into(),
            when: Some("payload.amount_minor > 100000".into()),
            first_contact: None,
            four_eyes: Some("payload.amount_minor > 1000000".into()),
            timeout: Duration::from_secs(3600),
        },
        ApprovalRule {
            name: "foreign-currency".into(),
            when: Some("payload.currency != 'EUR'".into()),
            first_contact: None,
            four_eyes: None,
            timeout: Duration::from_secs(2),
        },
    ];
}

fn payment(n: usize, amount_minor: u64, currency: &str) -> Value {
    json!({"workflow_id": "case-control", "step": "pay", "business_object": format!("invoice-{n}"), "revision": 1,
        "payload": {"account_id": "example-account", "amount_minor": amount_minor, "currency": currency,
                    "business_reference": format!("invoice-{n}")}})
}

async fn submit(agent: &mut Client, body: &Value, status: &str) -> String {
    let r = agent.submit("payment_order.create", body).await;
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(r.body["status"], status, "{}", r.body);
    r.body["key"].as_str().expect("key").to_owned()
}

async fn status_of(agent: &mut Client, key: &str) -> Value {
    let r = agent.action(key, None).await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.body
}

async fn until_status(agent: &mut Client, key: &str, want: &str) -> Value {
    for _ in 0..6 {
        let r = agent.action(key, Some("15s")).await;
        if r.body["status"] == want {
            return r.body;
        }
    }
    panic!("{key} never became {want}: {}", status_of(agent, key).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_payments_run_once_when_approved_and_never_otherwise() {
    let fleet = Fleet::with(FleetOptions {
        reconciler: Some(FAST_RECONCILER),
        configure: Some(payment_rules),
        ..FleetOptions::default()
    })
    .await;
    let gw = Gateway::start(&fleet, &[TOKEN_A, APPROVER_1, APPROVER_2, GLOBEX_APPROVER]).await;
    let _w = fleet.worker();
    let _r = fleet.reconciler();
    let mut agent = gw.client(TOKEN_A.token).await;
    let mut one = gw.client(APPROVER_1.token).await;
    let mut two = gw.client(APPROVER_2.token).await;
    let mut other = gw.client(GLOBEX_APPROVER.token).await;
    let effects = |key: &str| fleet.sandbox.effects().count(key);

    // Below the threshold: not held.
    let small = submit(&mut agent, &payment(1, 5_000, "EUR"), "planned").await;
    until_status(&mut agent, &small, "succeeded").await;

    // Above it: held, not sent, whatever the workers do meanwhile.
    let large = submit(&mut agent, &payment(2, 250_000, "EUR"), "awaiting_approval").await;
    let held = status_of(&mut agent, &large).await;
    assert_eq!(
        (
            held["held_by_rule"].as_str(),
            held["approvals_needed"].as_i64()
        ),
        (Some("large-payments"), Some(1)),
        "{held}"
    );
    assert!(!held["terminal"].as_bool().expect("terminal"));
    // The agent's token may not approve; another tenant's approver does not see it.
    let r = agent.control(&large, "approve", &json!({})).await;
    assert_eq!((r.status, r.code()), (403, "forbidden"), "{}", r.body);
    let r = other.control(&large, "approve", &json!({})).await;
    assert_eq!((r.status, r.code()), (404, "not_found"), "{}", r.body);
    assert_eq!(effects(&large), 0, "held: nothing sent");
    let r = one
        .control(&large, "approve", &json!({"note": "invoice checked"}))
        .await;
    assert_eq!(
        (r.status, r.body["outcome"].as_str()),
        (200, Some("approved")),
        "{}",
        r.body
    );
    until_status(&mut agent, &large, "succeeded").await;
    assert_eq!(effects(&large), 1, "approved: sent once");
    let r = two.control(&large, "approve", &json!({})).await;
    assert_eq!((r.status, r.code()), (409, "not_held"), "{}", r.body);

    // Rejected: never sent, and terminal for the agent's wait.
    let rejected = submit(&mut agent, &payment(3, 300_000, "EUR"), "awaiting_approval").await;
    let r = one
        .control(&rejected, "reject", &json!({"note": "not our supplier"}))
        .await;
    assert_eq!(r.body["outcome"], "rejected", "{}", r.body);
    let v = until_status(&mut agent, &rejected, "rejected").await;
    assert_eq!(
        (v["terminal"].as_bool(), v["error_code"].as_str()),
        (Some(true), Some("rejected"))
    );

    // Four eyes: two different people.
    let huge = submit(
        &mut agent,
        &payment(4, 2_000_000, "EUR"),
        "awaiting_approval",
    )
    .await;
    let r = one.control(&huge, "approve", &json!({})).await;
    assert_eq!(
        (
            r.body["outcome"].as_str(),
            r.body["more_approvals_needed"].as_i64()
        ),
        (Some("approval_recorded"), Some(1)),
        "{}",
        r.body
    );
    let r = one.control(&huge, "approve", &json!({})).await;
    assert_eq!((r.status, r.code()), (409, "already_decided"), "{}", r.body);
    assert_eq!(
        status_of(&mut agent, &huge).await["status"],
        "awaiting_approval"
    );
    assert_eq!(effects(&huge), 0);
    let r = two.control(&huge, "approve", &json!({})).await;
    assert_eq!(r.body["outcome"], "approved", "{}", r.body);
    until_status(&mut agent, &huge, "succeeded").await;
    assert_eq!(effects(&huge), 1);

    // Whoever asked never approves their own request.
    let own = submit(&mut one, &payment(5, 200_000, "EUR"), "awaiting_approval").await;
    let r = one.control(&own, "approve", &json!({})).await;
    assert_eq!((r.status, r.code()), (403, "own_request"), "{}", r.body);

    // Nobody decides in time: rejected by the deadline, never sent.
    let foreign = submit(&mut agent, &payment(6, 10, "USD"), "awaiting_approval").await;
    let v = until_status(&mut agent, &foreign, "rejected").await;
    assert_eq!(v["error_code"], "approval_timed_out", "{v}");

    // A held action can be cancelled; its approval then comes too late.
    let cancelled = submit(&mut agent, &payment(7, 400_000, "EUR"), "awaiting_approval").await;
    let r = agent.control(&cancelled, "cancel", &json!({})).await;
    assert_eq!(
        (r.status, r.body["outcome"].as_str()),
        (200, Some("cancelled")),
        "{}",
        r.body
    );
    let r = one.control(&cancelled, "approve", &json!({})).await;
    assert_eq!((r.status, r.code()), (409, "not_held"), "{}", r.body);

    for key in [&rejected, &foreign, &cancelled, &own] {
        assert_eq!(effects(key), 0, "{key}: never sent");
    }
    // The audit trail: who decided, with the note, and the moves as events.
    let decisions: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT approver, decision, note FROM operation_approvals WHERE idempotency_key = $1 ORDER BY id",
    )
    .bind(&large)
    .fetch_all(&fleet.db.pool)
    .await
    .expect("approvals");
    assert_eq!(
        decisions,
        [(
            "t1".to_owned(),
            "approve".to_owned(),
            Some("invoice checked".to_owned())
        )]
    );
    let moves: Vec<(Option<String>, String, String)> = sqlx::query_as(
        "SELECT from_status, to_status, actor FROM operation_events e JOIN agent_operations o ON o.seq = e.op_seq \
         WHERE o.idempotency_key = $1 ORDER BY e.id",
    )
    .bind(&large)
    .fetch_all(&fleet.db.pool)
    .await
    .expect("events");
    assert_eq!(moves[0].1, "awaiting_approval");
    assert_eq!(
        (
            moves[1].0.as_deref(),
            moves[1].1.as_str(),
            moves[1].2.as_str()
        ),
        (Some("awaiting_approval"), "deferred", "approver:t1")
    );
    assert_eq!(moves.last().map(|m| m.1.as_str()), Some("succeeded"));
    // Operators: the CLI approves (and cancels only what has not started).
    let via_cli = submit(&mut agent, &payment(8, 500_000, "EUR"), "awaiting_approval").await;
    let (code, out, err) = fleet
        .admin(&[
            "approve",
            &via_cli,
            "--by",
            "carol",
            "--note",
            "called the supplier",
        ])
        .await;
    assert_eq!(code, 0, "{out}{err}");
    until_status(&mut agent, &via_cli, "succeeded").await;
    let (code, out, _) = fleet.admin(&["cancel", &via_cli, "--by", "carol"]).await;
    assert_eq!(code, 3, "{out}");
    assert!(
        out.contains("too late") && out.contains("succeeded"),
        "{out}"
    );
    assert_eq!(effects(&via_cli), 1);

    // A message published straight to the broker, bypassing the SDK and the gateway,
    // is held all the same (the worker applies the rules before its claim).
    let raw = Intent::from_json(json!({
        "action_type": "payment_order.create", "tenant": "acme", "workflow_id": "case-control",
        "step": "pay", "business_object": "invoice-raw", "revision": 1,
        "payload": {"account_id": "example-account", "amount_minor": 900_000, "currency": "EUR",
                    "business_reference": "invoice-raw"}
    }))
    .expect("intent")
    .seal(&oncely_tests::fleet::secret())
    .expect("seal");
    fleet
        .publish_raw("payment_order.create", &raw.to_bytes())
        .await;
    let raw_key = raw.key.as_str().to_owned();
    let v = until_status(&mut agent, &raw_key, "awaiting_approval").await;
    assert_eq!(v["held_by_rule"], "large-payments");
    assert_eq!(effects(&raw_key), 0, "a raw message is held too");
}

/// 1,000 actions, each cancelled while two workers claim them at full speed: every
/// action ends either `cancelled` with no effect or executed with exactly one, and every
/// cancel's answer says which.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancels_racing_claims_are_always_true() {
    let fleet = Fleet::with(FleetOptions {
        reconciler: Some(FAST_RECONCILER),
        ..FleetOptions::default()
    })
    .await;
    let _w1 = fleet.worker();
    let _w2 = fleet.worker();
    let _r = fleet.reconciler();
    let producer = fleet.producer().await;
    let journal = fleet.db.journal();
    let n = 1000;
    // All recorded and published at once; then, while the two workers work through the
    // queue, every key is cancelled — in an order unlike the queue's (a stride through
    // it), eight at a time — so some cancels meet `planned` and some meet a claim.
    let keys = keys_of(
        producer
            .enqueue_many((0..n).map(email).collect())
            .await
            .expect("enqueue"),
    );
    let order: Vec<&String> = (0..n).map(|i| &keys[(i * 7919) % n]).collect();
    let answers: HashMap<String, bool> = futures_util::stream::iter(order)
        .map(|key| {
            let journal = &journal;
            async move {
                let k = oncely_core::IdempotencyKey::parse(key).expect("key");
                let said = match journal.cancel(&k, None, "test").await.expect("cancel") {
                    oncely_core::journal::Cancelled::Cancelled(_) => true,
                    oncely_core::journal::Cancelled::TooLate(op) => {
                        assert!(
                            matches!(
                                op.status.as_str(),
                                "executing"
                                    | "succeeded"
                                    | "unknown"
                                    | "failed_retryable"
                                    | "failed_final"
                            ),
                            "too late for {key} in {}",
                            op.status
                        );
                        false
                    }
                    oncely_core::journal::Cancelled::NotFound => panic!("{key} not found"),
                };
                (key.clone(), said)
            }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    assert_eq!(answers.len(), n);
    eventually("every action ends", DEADLINE, || async {
        (fleet.count("succeeded").await + fleet.count("cancelled").await == n as i64).then_some(())
    })
    .await;
    let effects = fleet.sandbox.effects();
    let (mut cancelled, mut sent) = (0, 0);
    for (key, said_cancelled) in &answers {
        let op = op(&fleet, key).await;
        if *said_cancelled {
            cancelled += 1;
            assert_eq!(op.status.as_str(), "cancelled", "{key}");
            assert_eq!(effects.count(key), 0, "{key}: cancelled but sent");
        } else {
            sent += 1;
            assert_eq!(op.status.as_str(), "succeeded", "{key}");
            assert_eq!(effects.count(key), 1, "{key}: too late, so sent once");
        }
    }
    eprintln!("cancel race: {cancelled} cancelled, {sent} too late (executed once each)");
    // The race was run, not avoided: both answers happened.
    assert!(
        cancelled > 0 && sent > 0,
        "{cancelled} cancelled, {sent} too late"
    );
    assert_eq!(effects.duplicates().count(), 0);
}

fn email(n: usize) -> Intent {
    Intent::from_json(json!({
        "action_type": "email.send", "workflow_id": format!("control-{n}"), "step": "notify",
        "business_object": format!("applicant-{n}"), "revision": 1,
        "payload": {"to": format!("user-{n}@example.test"), "subject": "Hello", "body": "Yes."}
    }))
    .expect("intent")
}

async fn op(fleet: &Fleet, key: &str) -> oncely_core::journal::Operation {
    let k = oncely_core::IdempotencyKey::parse(key).expect("key");
    fleet.op(&k).await.expect("the operation exists")
}

async fn db_now(fleet: &Fleet) -> DateTime<Utc> {
    sqlx::query_scalar("SELECT now()")
        .fetch_one(&fleet.db.pool)
        .await
        .expect("now")
}

/// Scheduled actions are recorded at once and delivered within a second of their time,
/// never before it, while other actions keep the workers busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_actions_run_on_time_under_load() {
    let fleet = Fleet::with(FleetOptions {
        reconciler: Some(FAST_RECONCILER),
        ..FleetOptions::default()
    })
    .await;
    let _w1 = fleet.worker();
    let _w2 = fleet.worker();
    let _r = fleet.reconciler();
    let producer = fleet.producer().await;
    let due = db_now(&fleet).await + chrono::Duration::seconds(4);
    let scheduled: Vec<Intent> = (0..50).map(|i| email(10_000 + i)).collect();
    let asked = vec![
        Asked {
            not_before: Some(due),
            ..Asked::default()
        };
        scheduled.len()
    ];
    let keys: Vec<String> = producer
        .enqueue_many_asked(scheduled, &asked)
        .await
        .expect("enqueue")
        .into_iter()
        .map(|r| match r.expect("ok") {
            Enqueued::Enqueued { key, status } => {
                assert_eq!(status.as_str(), "deferred");
                key.as_str().to_owned()
            }
            other => panic!("{other:?}"),
        })
        .collect();
    // The load: 600 immediate actions at once.
    let load = producer
        .enqueue_many((0..600).map(email).collect())
        .await
        .expect("load");
    assert_eq!(load.len(), 600);
    eventually("every action done", DEADLINE, || async {
        (fleet.count("succeeded").await == 650).then_some(())
    })
    .await;
    let mut late = Vec::new();
    for key in &keys {
        let op = op(&fleet, key).await;
        let started = op.first_attempt_at.expect("started");
        let after = (started - due).num_milliseconds();
        assert!(after >= 0, "{key} ran {after} ms before its time");
        late.push(after);
    }
    late.sort_unstable();
    eprintln!(
        "scheduled: ran {} ms (median) / {} ms (max) after the due time",
        late[late.len() / 2],
        late[late.len() - 1]
    );
    assert!(
        late[late.len() - 1] < 1000,
        "delivered within a second of the due time: {late:?}"
    );
}

/// `expires_at` in the past when a worker meets the action — in a backlog no worker
/// served in time, and behind a throttled provider — ends it `expired`, never sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_actions_are_never_sent() {
    let mut fleet = Fleet::with(FleetOptions {
        reconciler: Some(FAST_RECONCILER),
        ..FleetOptions::default()
    })
    .await;
    let producer = fleet.producer().await;
    // A backlog: no worker runs while the deadline passes.
    let deadline = db_now(&fleet).await + chrono::Duration::milliseconds(500);
    let stale = expiring(&producer, 0..20, deadline).await;
    let fresh = keys_of(
        producer
            .enqueue_many((20..40).map(email).collect())
            .await
            .expect("enqueue"),
    );
    eventually("the deadline passed", DEADLINE, || async {
        (db_now(&fleet).await > deadline).then_some(())
    })
    .await;
    // A worker (no sweeper yet): it meets the expired ones in the queue.
    let w = fleet.worker();
    eventually("the backlog is done", DEADLINE, || async {
        (fleet.count("succeeded").await == 20 && fleet.count("expired").await == 20).then_some(())
    })
    .await;
    for key in &stale {
        let op = op(&fleet, key).await;
        assert_eq!(op.status.as_str(), "expired");
        assert!(
            op.last_actor.starts_with("worker"),
            "expired by the worker's claim: {}",
            op.last_actor
        );
        assert_eq!(
            fleet.sandbox.effects().count(key),
            0,
            "{key}: expired but sent"
        );
    }
    for key in &fresh {
        assert_eq!(fleet.sandbox.effects().count(key), 1);
    }
    drop(w);

    // Behind a provider limited to 2 a second: whatever waits past its deadline in
    // `deferred` expires there.
    fleet.reconfigure(|c| {
        if let Some(ProviderConfig::Http(mail)) = c.providers.get_mut("mail") {
            mail.rate_limit = Some(RateLimitConfig {
                burst: Some(1),
                ..RateLimitConfig::per_second(2.0)
            });
        }
    });
    let _w = fleet.worker();
    let _r = fleet.reconciler();
    let deadline = db_now(&fleet).await + chrono::Duration::seconds(3);
    let throttled = expiring(&producer, 100..130, deadline).await;
    eventually("every throttled action ended", DEADLINE, || async {
        let mut done = 0;
        for key in &throttled {
            if op(&fleet, key).await.status.is_terminal() {
                done += 1;
            }
        }
        (done == throttled.len()).then_some(())
    })
    .await;
    let (mut expired, mut sent) = (0, 0);
    for key in &throttled {
        let op = op(&fleet, key).await;
        let effects = fleet.sandbox.effects().count(key);
        match op.status.as_str() {
            "expired" => {
                expired += 1;
                assert_eq!(effects, 0, "{key}: expired but sent");
            }
            "succeeded" => {
                sent += 1;
                assert_eq!(effects, 1, "{key}");
                assert!(
                    op.first_attempt_at.expect("started") <= deadline,
                    "{key} started after its deadline"
                );
            }
            other => panic!("{key}: {other}"),
        }
    }
    eprintln!("behind 2/s: {sent} sent before the deadline, {expired} expired");
    assert!(expired > 0, "30 actions at 2/s cannot all start within 3 s");
}

/// A first contact is held, a later one to the same recipient is not; `max_age` expires a
/// backlog; the SDK's cancel is the journal's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_contacts_are_held_max_age_expires_and_the_sdk_cancels() {
    fn rules(c: &mut Config) {
        let mail = c.actions.get_mut("email.send").expect("email");
        mail.approval = vec![ApprovalRule {
            name: "first-contact".into(),
            when: None,
            first_contact: Some(oncely_core::config::FirstContact {
                field: "/to".into(),
                days: 30,
            }),
            four_eyes: None,
            timeout: Duration::from_secs(3600),
        }];
        c.actions.get_mut("ticket.create").expect("tickets").max_age =
            Some(Duration::from_millis(500));
    }
    let fleet = Fleet::with(FleetOptions {
        reconciler: Some(FAST_RECONCILER),
        configure: Some(rules),
        ..FleetOptions::default()
    })
    .await;
    let producer = fleet.producer().await;
    let to = |n: usize, to: &str| {
        Intent::from_json(json!({
            "action_type": "email.send", "workflow_id": "first-contact", "step": "notify",
            "business_object": format!("letter-{n}"), "revision": 1,
            "payload": {"to": to, "subject": "Hello", "body": "Yes."}
        }))
        .expect("intent")
    };
    let status_of = |r: Enqueued| match r {
        Enqueued::Enqueued { key, status } => (key.as_str().to_owned(), status),
        other => panic!("{other:?}"),
    };
    // Tickets recorded while no worker runs grow older than max_age.
    let ticket = Intent::from_json(json!({
        "action_type": "ticket.create", "workflow_id": "first-contact", "step": "ticket",
        "business_object": "case-1", "revision": 1, "payload": {"title": "Call back", "queue": "support"}
    }))
    .expect("ticket");
    let (stale_ticket, _) = status_of(producer.enqueue(ticket).await.expect("ticket"));
    let (first, status) = status_of(
        producer
            .enqueue(to(1, "new@example.test"))
            .await
            .expect("1"),
    );
    assert_eq!(
        status.as_str(),
        "awaiting_approval",
        "never written to: held"
    );
    let k = oncely_core::IdempotencyKey::parse(&first).expect("key");
    let journal = fleet.db.journal();
    assert!(matches!(
        journal
            .decide_approval(&k, "carol", true, None, None)
            .await
            .expect("approve"),
        oncely_core::journal::Decided::Approved(_)
    ));
    let recorded = op(&fleet, &stale_ticket).await.created_at;
    eventually("the ticket is older than max_age", DEADLINE, || async {
        (db_now(&fleet).await > recorded + chrono::Duration::milliseconds(600)).then_some(())
    })
    .await;
    let _w = fleet.worker();
    let _r = fleet.reconciler();
    eventually("the approved first contact is sent", DEADLINE, || async {
        (op(&fleet, &first).await.status.as_str() == "succeeded").then_some(())
    })
    .await;
    // Written to now: the next letter to the same address is not held; another address is.
    let (second, status) = status_of(
        producer
            .enqueue(to(2, "new@example.test"))
            .await
            .expect("2"),
    );
    assert_eq!(status.as_str(), "planned", "written to before: not held");
    let (other, status) = status_of(
        producer
            .enqueue(to(3, "other@example.test"))
            .await
            .expect("3"),
    );
    assert_eq!(status.as_str(), "awaiting_approval");
    eventually("the second letter is sent", DEADLINE, || async {
        (op(&fleet, &second).await.status.as_str() == "succeeded").then_some(())
    })
    .await;
    let t = op(&fleet, &stale_ticket).await;
    assert_eq!(
        (t.status.as_str(), t.last_error_code.as_deref()),
        ("expired", Some("expired"))
    );
    assert_eq!(
        fleet.sandbox.effects().count(&stale_ticket),
        0,
        "expired by max_age: never sent"
    );
    // The SDK cancels the held one; the answer is the journal's.
    let k = oncely_core::IdempotencyKey::parse(&other).expect("key");
    assert!(matches!(
        producer.cancel(&k).await.expect("cancel"),
        oncely_core::journal::Cancelled::Cancelled(_)
    ));
    assert_eq!(op(&fleet, &other).await.status.as_str(), "cancelled");
    let k = oncely_core::IdempotencyKey::parse(&second).expect("key");
    assert!(matches!(
        producer.cancel(&k).await.expect("cancel"),
        oncely_core::journal::Cancelled::TooLate(op) if op.status.as_str() == "succeeded"
    ));
    assert_eq!(fleet.sandbox.effects().count(&other), 0);
    assert_eq!(fleet.sandbox.effects().count(&second), 1);
}

/// Enqueue the emails `range`, each expiring at `deadline`; their keys.
async fn expiring(
    producer: &oncely_producer::Producer,
    range: std::ops::Range<usize>,
    deadline: DateTime<Utc>,
) -> Vec<String> {
    let asked = vec![
        Asked {
            expires_at: Some(deadline),
            ..Asked::default()
        };
        range.len()
    ];
    keys_of(
        producer
            .enqueue_many_asked(range.map(email).collect(), &asked)
            .await
            .expect("enqueue"),
    )
}

fn keys_of(results: Vec<Result<Enqueued, oncely_producer::ProducerError>>) -> Vec<String> {
    results
        .into_iter()
        .map(|r| match r.expect("ok") {
            Enqueued::Enqueued { key, .. } => key.as_str().to_owned(),
            other => panic!("{other:?}"),
        })
        .collect()
}
