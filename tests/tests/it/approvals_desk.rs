//! Held actions at the review desk, in a real headless Chromium: an agent's payments held
//! by an approval rule (through the gateway, payloads sealed), a view-only reviewer who
//! sees them without payload or buttons (and whose forged decision is refused), an
//! approver who sees what each would send and approves one (sent exactly once) and
//! rejects another (never sent), and a four-eyes payment that needs two different people
//! (the same one twice, and the person who asked, are refused).
//!
//! The desk connects with the least-privilege desk login: it reads the held payload only
//! through `oncely_held_payload` (migration 20261215000002), never the payload columns.

use oncely_core::config::{ApprovalRule, Config};
use oncely_core::roles::Role;
use oncely_core::{IdempotencyKey, Status};
use oncely_tests::eventually;
use oncely_tests::fleet::{FAST_RECONCILER, Fleet, FleetOptions};
use oncely_tests::gateway::{Client, Gateway, TOKEN_A};
use oncely_tests::roles::DbRoles;
use serde_json::{Value, json};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(60);
/// decide + approve, every tenant.
const ALICE: &str = "ocr_alice-approves";
/// view + approve, tenant acme: the second pair of eyes.
const CAROL: &str = "ocr_carol-approves-too";
/// view only, tenant acme.
const VICTOR: &str = "ocr_victor-views";
/// approve, with the id of the agent's token (`t0`): the requester, who may not approve.
const REQUESTER: &str = "ocr_t0-asked-for-it";

/// Payments above 1,000.00 wait for a person, above 10,000.00 for two.
fn payment_rules(c: &mut Config) {
    c.actions
        .get_mut("payment_order.create")
        .expect("payments are configured")
        .approval = vec![ApprovalRule {
        name: "large-payments".into(),
        when: Some("payload.amount_minor > 100000".into()),
        first_contact: None,
        four_eyes: Some("payload.amount_minor > 1000000".into()),
        timeout: Duration::from_secs(3600),
    }];
}

fn payment(n: usize, amount_minor: u64) -> Value {
    json!({"workflow_id": "case-approvals-desk", "step": "pay", "business_object": format!("invoice-{n}"), "revision": 1,
        "payload": {"account_id": "example-account", "amount_minor": amount_minor, "currency": "EUR",
                    "business_reference": format!("invoice-{n}")}})
}

async fn held(agent: &mut Client, body: &Value) -> String {
    let r = agent.submit("payment_order.create", body).await;
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(r.body["status"], "awaiting_approval", "{}", r.body);
    r.body["key"].as_str().expect("key").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn people_approve_and_reject_held_actions_in_a_real_browser() {
    let fleet = Fleet::with(FleetOptions {
        reconciler: Some(FAST_RECONCILER),
        configure: Some(payment_rules),
        seal_payloads: true,
        ..FleetOptions::default()
    })
    .await;
    let reviewers = fleet.dir.join("reviewers.toml");
    let entry = |id: &str, token: &str, role: &str, extra: &str| {
        format!(
            "[[reviewer]]\nid = \"{id}\"\nsha256 = \"{}\"\nrole = \"{role}\"\n{extra}\n",
            oncely_gateway::tokens::hash_hex(token)
        )
    };
    std::fs::write(
        &reviewers,
        [
            entry("alice", ALICE, "decide", "approve = true"),
            entry(
                "carol",
                CAROL,
                "view",
                "tenants = [\"acme\"]\napprove = true",
            ),
            entry("victor", VICTOR, "view", "tenants = [\"acme\"]"),
            entry("t0", REQUESTER, "view", "approve = true"),
        ]
        .concat(),
    )
    .expect("reviewers file");
    let reviewers = reviewers.to_string_lossy().into_owned();
    // Least privilege: the API on a producer login, the desk on a desk login (no payload
    // column; the held payload through the function only).
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
    let approve = held(&mut agent, &payment(1, 250_000)).await;
    let reject = held(&mut agent, &payment(2, 300_000)).await;
    let four_eyes = held(&mut agent, &payment(3, 2_000_000)).await;
    let key = |k: &str| IdempotencyKey::parse(k).expect("key");
    let op = fleet.op(&key(&four_eyes)).await.expect("held");
    assert_eq!(
        (
            op.status,
            op.approvals_needed,
            op.hold_rule.as_deref(),
            op.requested_by.as_deref()
        ),
        (
            Status::AwaitingApproval,
            2,
            Some("large-payments"),
            Some("t0")
        )
    );
    assert!(
        op.payload.is_none() && op.sealed_payload.is_some(),
        "the payload is sealed in the journal"
    );

    let shots =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/screenshots/approvals");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/desk_approvals.py");
    let out = tokio::process::Command::new(oncely_tests::python())
        .arg(script)
        .env("DESK_URL", format!("http://127.0.0.1:{}", gw.port))
        .env("DESK_APPROVER", ALICE)
        .env("DESK_SECOND_APPROVER", CAROL)
        .env("DESK_VIEWER", VICTOR)
        .env("DESK_REQUESTER", REQUESTER)
        .env("DESK_KEY_APPROVE", &approve)
        .env("DESK_KEY_REJECT", &reject)
        .env("DESK_KEY_FOUR_EYES", &four_eyes)
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
        "desk_approvals.py failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("\"ok\": true"), "{stdout}");
    for shot in [
        "approvals-list.png",
        "approvals-detail.png",
        "approvals-approved.png",
    ] {
        let len = std::fs::metadata(shots.join(shot)).map_or(0, |m| m.len());
        assert!(len > 10_000, "{shot}: {len} bytes");
    }

    // What the browser did, as the journal and the bank have it.
    for k in [&approve, &four_eyes] {
        let done = eventually("the approved payment is sent", DEADLINE, || async {
            fleet
                .op(&key(k))
                .await
                .filter(|op| op.status == Status::Succeeded)
        })
        .await;
        assert!(done.approved_at.is_some());
        assert_eq!(fleet.sandbox.effects().count(k), 1, "sent exactly once");
    }
    let rejected = fleet.op(&key(&reject)).await.expect("rejected");
    assert_eq!(
        (rejected.status, rejected.last_actor.as_str()),
        (Status::Rejected, "approver:alice")
    );
    assert_eq!(fleet.sandbox.effects().count(&reject), 0, "never sent");
    let decisions = |k: String| {
        let fleet = &fleet;
        async move {
            fleet
                .db
                .journal()
                .approvals(&key(&k))
                .await
                .expect("approvals")
                .into_iter()
                .map(|a| (a.approver, a.decision, a.note))
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        decisions(reject.clone()).await,
        vec![(
            "alice".into(),
            "reject".into(),
            Some("No invoice-2 in the ledger".into())
        )]
    );
    assert_eq!(
        decisions(four_eyes.clone()).await,
        vec![
            ("alice".into(), "approve".into(), None),
            (
                "carol".into(),
                "approve".into(),
                Some("Second pair of eyes".into())
            ),
        ],
        "one row per person: the refused second click and the requester left none"
    );
    let events = fleet
        .db
        .journal()
        .events(&key(&four_eyes))
        .await
        .expect("events");
    assert!(
        events
            .iter()
            .any(|e| e.actor == "approver:carol" && e.to_status == "deferred"),
        "the second approval released it: {events:?}"
    );
    // The narrow door, at the database: the desk's login reads a held payload only through
    // the function, and only while it is held; no other role may call it.
    let still_held = held(&mut agent, &payment(4, 400_000)).await;
    let desk_db = sqlx::PgPool::connect(&desk_url).await.expect("desk login");
    let producer_db = sqlx::PgPool::connect(&producer_url)
        .await
        .expect("producer login");
    let door = "SELECT payload, payload_sealed, payload_key_id FROM oncely_held_payload($1)";
    type PayloadRow = (Option<Value>, Option<Vec<u8>>, Option<String>);
    let row: Option<PayloadRow> = sqlx::query_as(door)
        .bind(&still_held)
        .fetch_optional(&desk_db)
        .await
        .expect("the desk calls the function");
    assert!(
        row.is_some_and(|(plain, sealed, id)| plain.is_none() && sealed.is_some() && id.is_some()),
        "a held action's (sealed) payload"
    );
    let gone: Vec<(Option<Value>,)> = sqlx::query_as("SELECT payload FROM oncely_held_payload($1)")
        .bind(&approve)
        .fetch_all(&desk_db)
        .await
        .expect("the desk calls the function");
    assert!(gone.is_empty(), "nothing for an action no longer held");
    for (who, pool, sql) in [
        ("producer", &producer_db, door),
        (
            "desk",
            &desk_db,
            "SELECT payload FROM agent_operations WHERE idempotency_key = $1",
        ),
        (
            "desk",
            &desk_db,
            "SELECT payload_sealed FROM agent_operations WHERE idempotency_key = $1",
        ),
    ] {
        let e = sqlx::query(sql)
            .bind(&still_held)
            .fetch_all(pool)
            .await
            .expect_err(who);
        assert_eq!(
            e.as_database_error().and_then(|e| e.code()).as_deref(),
            Some("42501"),
            "{who}: {sql}: {e}"
        );
    }

    // One attempt, one effect each; nothing for the rejected one.
    let settled = fleet.op(&key(&approve)).await.expect("op");
    assert_eq!(settled.attempt_count, 1);
    assert_eq!(fleet.sandbox.effects().count(&approve), 1);
    assert_eq!(fleet.sandbox.effects().count(&four_eyes), 1);
    assert_eq!(fleet.sandbox.effects().count(&reject), 0);
}
