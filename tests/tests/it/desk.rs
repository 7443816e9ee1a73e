//! The review desk in a real headless Chromium: reviews made by a real run (an agent's
//! requests through the gateway, a bank that loses answers and forgets keys, a worker, a
//! reconciler), a person signing in, refusals (wrong token, view role, no note, bad CSRF,
//! another site's post, a second decision), and a decision that moves the operation to
//! `succeeded` with the audit trail and the outcome event an agent hears.

use oncely_core::Status;
use oncely_core::journal::Review;
use oncely_core::roles::Role;
use oncely_tests::eventually;
use oncely_tests::fleet::{FAST_RECONCILER, Fleet, FleetOptions, next_outcome};
use oncely_tests::gateway::{Gateway, TOKEN_A};
use oncely_tests::roles::DbRoles;
use serde_json::{Value, json};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(60);
const ALICE: &str = "ocr_alice-decides";
const VICTOR: &str = "ocr_victor-views";
const GINA: &str = "ocr_gina-globex";

fn payment(n: usize) -> Value {
    json!({"workflow_id": "case-desk", "step": "pay_grant", "business_object": format!("application-{n}"), "revision": 1,
        "payload": {"account_id": "example-account", "amount_minor": 100 * n, "currency": "EUR", "business_reference": format!("application-{n}")}})
}

async fn open_review(fleet: &Fleet, key: &str) -> Review {
    let key = oncely_core::IdempotencyKey::parse(key).expect("key");
    eventually("a review for a person", DEADLINE, || async {
        fleet
            .db
            .journal()
            .reviews_of(&key)
            .await
            .expect("reviews")
            .pop()
            .filter(|r| r.waits_for_person())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_resolves_a_review_in_a_real_browser() {
    let fleet = Fleet::with(FleetOptions {
        timeout: "1s".into(),
        lease: "3s".into(),
        reconciler: Some(FAST_RECONCILER),
        max_reconcile_checks: Some(2),
        ..FleetOptions::default()
    })
    .await;
    let mut outcomes = fleet.listen_outcomes("payment_order.create.*").await;
    // The bank executes A but its answer is lost and it forgets the key (lookups say
    // absent: money is never retried on absence, a person decides from the statement);
    // B fails before the bank commits (also absent, also a person's).
    fleet
        .sandbox
        .control()
        .set_faults_json(&json!({"forget_keys_after_ms": 200, "rules": [
            {"provider": "bank", "mode": "accept_then_timeout", "times": 1, "hold_ms": 30000}]}))
        .await
        .expect("faults");
    let reviewers = fleet.dir.join("reviewers.toml");
    std::fs::write(
        &reviewers,
        format!(
            "[[reviewer]]\nid = \"alice\"\nsha256 = \"{}\"\nrole = \"decide\"\n\n\
             [[reviewer]]\nid = \"victor\"\nsha256 = \"{}\"\nrole = \"view\"\ntenants = [\"acme\"]\n\n\
             [[reviewer]]\nid = \"gina\"\nsha256 = \"{}\"\nrole = \"decide\"\ntenants = [\"globex\"]\n",
            oncely_gateway::tokens::hash_hex(ALICE),
            oncely_gateway::tokens::hash_hex(VICTOR),
            oncely_gateway::tokens::hash_hex(GINA)
        ),
    )
    .expect("reviewers file");
    let reviewers = reviewers.to_string_lossy().into_owned();
    // Least privilege: the gateway's API on a producer login, the desk on a desk login
    // (reads no payload, may resolve reviews).
    let roles = DbRoles::create(&fleet.db).await;
    let (_, producer_url) = roles.login("producer", &[Role::Producer]).await;
    let (_, desk_url) = roles.login("desk", &[Role::Desk]).await;
    let gw = Gateway::start_with(
        &fleet,
        &[TOKEN_A],
        &[
            ("DATABASE_URL", &producer_url),
            ("ONCELY_DESK_DATABASE_URL", &desk_url),
        ],
        &["--desk-reviewers-file", &reviewers],
    )
    .await;
    let _w = fleet.worker();
    let _r = fleet.reconciler();
    let mut agent = gw.client(TOKEN_A.token).await;
    let a = agent.submit("payment_order.create", &payment(1)).await;
    assert_eq!(a.status, 202, "{}", a.body);
    let key_a = a.body["key"].as_str().expect("key").to_owned();
    let ra = open_review(&fleet, &key_a).await;
    fleet
        .sandbox
        .control()
        .set_faults_json(&json!({"forget_keys_after_ms": 200, "rules": [
            {"provider": "bank", "mode": "error_before_commit", "times": 1}]}))
        .await
        .expect("faults");
    let b = agent.submit("payment_order.create", &payment(2)).await;
    assert_eq!(b.status, 202, "{}", b.body);
    let key_b = b.body["key"].as_str().expect("key").to_owned();
    let rb = open_review(&fleet, &key_b).await;
    assert_eq!(
        (ra.reason.as_str(), rb.reason.as_str()),
        (
            "absent_policy_requires_review",
            "absent_policy_requires_review"
        )
    );
    assert_eq!(fleet.sandbox.effects().count(&key_a), 1, "the bank has A");
    assert_eq!(fleet.sandbox.effects().count(&key_b), 0, "and not B");

    let shots = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/screenshots/desk");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/desk_browser.py");
    let out = tokio::process::Command::new(oncely_tests::python())
        .arg(script)
        .env("DESK_URL", format!("http://127.0.0.1:{}", gw.port))
        .env("DESK_DECIDER", ALICE)
        .env("DESK_VIEWER", VICTOR)
        .env("DESK_OTHER_TENANT", GINA)
        .env("DESK_KEY_A", &key_a)
        .env("DESK_PROVIDER_ID", "PO-2026-12-04-0017")
        .env("DESK_KEY_B", &key_b)
        .env("DESK_SHOTS", &shots)
        .kill_on_drop(true)
        .output()
        .await
        .expect("python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "desk_browser.py failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("\"ok\": true"), "{stdout}");
    for shot in ["desk-list.png", "desk-operation.png", "desk-list-phone.png"] {
        let len = std::fs::metadata(shots.join(shot)).map_or(0, |m| m.len());
        assert!(len > 10_000, "{shot}: {len} bytes");
    }

    // What the browser did, as the journal has it: A succeeded with the id the person
    // typed, by alice, with her note, in one audited move; B untouched.
    let ka = oncely_core::IdempotencyKey::parse(&key_a).expect("key");
    let op = fleet.op(&ka).await.expect("A");
    assert_eq!(
        (op.status, op.provider_operation_id.as_deref()),
        (Status::Succeeded, Some("PO-2026-12-04-0017"))
    );
    let review = fleet
        .db
        .journal()
        .reviews_of(&ka)
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
            Some("Seen in the bank statement of 2026-12-04, line 17")
        )
    );
    let events = fleet.db.journal().events(&ka).await.expect("events");
    let decided: Vec<_> = events
        .iter()
        .filter(|e| e.actor == "review:alice")
        .collect();
    assert_eq!(decided.len(), 1, "one audited move: {events:?}");
    assert_eq!(
        (decided[0].reason.as_str(), decided[0].to_status.as_str()),
        ("review_succeeded", "succeeded")
    );
    let kb = oncely_core::IdempotencyKey::parse(&key_b).expect("key");
    assert_eq!(fleet.op(&kb).await.expect("B").status, Status::Unknown);
    assert!(
        fleet.db.journal().reviews_of(&kb).await.expect("reviews")[0]
            .resolved_at
            .is_none(),
        "no refused decision touched B"
    );
    // The agent hears the outcome (published by the reconciler that counts the closing).
    let mut heard = Value::Null;
    for _ in 0..50 {
        let (rk, body) = next_outcome(&mut outcomes).await;
        if rk == "payment_order.create.succeeded" && body["idempotency_key"] == json!(key_a) {
            heard = body;
            break;
        }
    }
    assert_eq!(heard["provider_operation_id"], json!("PO-2026-12-04-0017"));
    assert_eq!(
        fleet.sandbox.effects().count(&key_a),
        1,
        "deciding sends nothing"
    );
    assert_eq!(fleet.sandbox.effects().count(&key_b), 0);
}
