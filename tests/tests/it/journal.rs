//! The journal against real Postgres: races, leases, compare-and-set, the audit trail,
//! the database's own constraints, and the article's inspection queries.

use oncely_core::journal::{
    ClaimOutcome, ClaimRequest, Completion, Journal, JournalError, NotClaimed, Recorded, Verdict,
};
use oncely_core::{Envelope, Intent, KeyRing, Status};
use oncely_tests::{TestDb, eventually};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

const LEASE: Duration = Duration::from_secs(120);

fn secret() -> KeyRing {
    KeyRing::new(b"test-secret-do-not-use".to_vec()).expect("secret")
}

fn envelope(workflow: &str, object: &str, payload: Value) -> Envelope {
    Intent::from_json(json!({
        "action_type": "payment_order.create", "workflow_id": workflow, "step": "pay_grant",
        "business_object": object, "revision": 1, "payload": payload
    }))
    .expect("intent")
    .seal(&secret())
    .expect("seal")
}

fn pay(amount: i64) -> Value {
    json!({"account_id": "example-account", "amount_minor": amount, "currency": "RUB", "business_reference": "application-731"})
}

async fn claim_one(j: &Journal, e: &Envelope, owner: &str, lease: Duration) -> ClaimOutcome {
    j.claim(&[ClaimRequest { envelope: e, lease }], owner)
        .await
        .expect("claim")
        .remove(0)
}

fn claimed(o: &ClaimOutcome) -> i32 {
    match o {
        ClaimOutcome::Claimed(c) => c.attempt,
        other => panic!("expected a claim, got {other:?}"),
    }
}

fn not_claimed(o: &ClaimOutcome) -> NotClaimed {
    match o {
        ClaimOutcome::NotClaimed { why, .. } => *why,
        other => panic!("expected no claim, got {other:?}"),
    }
}

fn success(e: &Envelope, attempt: i32, id: &str) -> Completion {
    Completion {
        key: e.key.clone(),
        expected: Status::Executing,
        attempt,
        verdict: Verdict::Succeeded {
            provider_operation_id: id.into(),
            result: json!({"id": id}),
        },
        reason: "provider_succeeded".into(),
    }
}

async fn row_count(db: &TestDb) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM agent_operations")
        .fetch_one(&db.pool)
        .await
        .expect("count")
}

/// Two workers race for the same key, 50 times (25 on a `planned` row, 25 where the
/// claim must insert the row itself): exactly one wins every time, one row per key.
#[tokio::test]
async fn two_concurrent_claims_one_winner_fifty_times() {
    let db = TestDb::new().await;
    let j = db.journal();
    for round in 0..50 {
        let e = Arc::new(envelope("race", &format!("obj-{round}"), pay(round)));
        if round % 2 == 0 {
            assert_eq!(
                j.record(&e, "producer").await.expect("record"),
                Recorded::New
            );
        }
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let tasks: Vec<_> = ["worker-a", "worker-b"]
            .into_iter()
            .map(|owner| {
                let (j, e, barrier) = (j.clone(), e.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    claim_one(&j, &e, owner, LEASE).await
                })
            })
            .collect();
        let mut wins = 0;
        for t in tasks {
            match t.await.expect("task") {
                ClaimOutcome::Claimed(c) => {
                    assert_eq!(c.attempt, 1);
                    wins += 1;
                }
                ClaimOutcome::NotClaimed { why, .. } => assert_eq!(why, NotClaimed::LeaseLive),
                ClaimOutcome::Undecided => panic!("a one-delivery claim is never undecided"),
                ClaimOutcome::Deferred { .. } => panic!("nothing asked to defer"),
            }
        }
        assert_eq!(wins, 1, "round {round}: exactly one claim wins");
    }
    assert_eq!(row_count(&db).await, 50);
    let events: i64 =
        sqlx::query_scalar("SELECT count(*) FROM operation_events WHERE reason = 'claim'")
            .fetch_one(&db.pool)
            .await
            .expect("events");
    assert_eq!(events, 50, "one claim event per key");
}

#[tokio::test]
async fn claim_after_success_returns_the_saved_result_without_a_claim() {
    let db = TestDb::new().await;
    let j = db.journal();
    let e = envelope("case-1842", "application-731", pay(125000));
    j.record(&e, "producer").await.expect("record");
    let attempt = claimed(&claim_one(&j, &e, "w1", LEASE).await);
    assert!(
        j.complete(&success(&e, attempt, "po_1"), "w1")
            .await
            .expect("complete")
    );

    match claim_one(&j, &e, "w2", LEASE).await {
        ClaimOutcome::NotClaimed {
            why: NotClaimed::Terminal,
            op,
        } => {
            assert_eq!(op.status, Status::Succeeded);
            assert_eq!(op.provider_operation_id.as_deref(), Some("po_1"));
            assert_eq!(op.result_json, Some(json!({"id": "po_1"})));
            assert_eq!(op.payload, None, "payload is cleared at a terminal state");
            assert_eq!(op.attempt_count, 1);
        }
        other => panic!("expected terminal, got {other:?}"),
    }
    // Recording the same intent again reports a duplicate with the saved result.
    match j.record(&e, "producer").await.expect("record") {
        Recorded::Duplicate(op) => assert_eq!(op.result_json, Some(json!({"id": "po_1"}))),
        other => panic!("expected duplicate, got {other:?}"),
    }
}

#[tokio::test]
async fn same_key_with_another_payload_is_a_conflict_and_changes_nothing() {
    let db = TestDb::new().await;
    let j = db.journal();
    let original = envelope("case-1842", "application-731", pay(125000));
    let changed = envelope("case-1842", "application-731", pay(999));
    assert_eq!(
        original.key, changed.key,
        "the key comes from the identity only"
    );
    j.record(&original, "producer").await.expect("record");
    let before = j.get(&original.key).await.expect("get").expect("row");

    assert!(matches!(
        j.record(&changed, "producer").await.expect("record"),
        Recorded::Conflict(_)
    ));
    assert_eq!(
        not_claimed(&claim_one(&j, &changed, "w1", LEASE).await),
        NotClaimed::Conflict
    );
    j.record_conflict(&changed.key, &changed.payload_hash, "w1")
        .await
        .expect("conflict event");

    let mut after = j.get(&original.key).await.expect("get").expect("row");
    after.read_at = before.read_at;
    assert_eq!(after, before, "row unchanged");
    let events = j.events(&original.key).await.expect("events");
    assert_eq!(events.iter().filter(|e| e.reason == "conflict").count(), 1);
    // The original can still be claimed.
    assert_eq!(claimed(&claim_one(&j, &original, "w1", LEASE).await), 1);
}

#[tokio::test]
async fn a_live_lease_is_never_stolen_and_an_expired_one_is_not_reclaimed() {
    let db = TestDb::new().await;
    let j = db.journal();
    let live = envelope("leases", "live", pay(1));
    assert_eq!(claimed(&claim_one(&j, &live, "w1", LEASE).await), 1);
    assert_eq!(
        not_claimed(&claim_one(&j, &live, "w2", LEASE).await),
        NotClaimed::LeaseLive
    );

    let short = envelope("leases", "short", pay(2));
    assert_eq!(
        claimed(&claim_one(&j, &short, "w1", Duration::from_millis(50)).await),
        1
    );
    eventually(
        "the short lease to expire (database clock)",
        Duration::from_secs(10),
        || async {
            let op = j.get(&short.key).await.expect("get").expect("row");
            (!op.lease_live).then_some(())
        },
    )
    .await;
    assert_eq!(
        not_claimed(&claim_one(&j, &short, "w2", LEASE).await),
        NotClaimed::LeaseExpired
    );
    let op = j.get(&short.key).await.expect("get").expect("row");
    assert_eq!(
        (op.status, op.attempt_count, op.lease_owner.as_deref()),
        (Status::Executing, 1, Some("w1"))
    );
}

#[tokio::test]
async fn a_stale_attempt_cannot_complete_and_every_transition_is_an_event() {
    let db = TestDb::new().await;
    let j = db.journal();
    let e = envelope("stale", "obj", pay(5));
    j.record(&e, "producer").await.expect("record");
    let first = claimed(&claim_one(&j, &e, "w1", LEASE).await);
    let retry = Completion {
        key: e.key.clone(),
        expected: Status::Executing,
        attempt: first,
        verdict: Verdict::FailedRetryable {
            error_code: "connect_refused".into(),
            retry_in: Duration::ZERO,
        },
        reason: "provider_not_sent".into(),
    };
    assert!(j.complete(&retry, "w1").await.expect("retryable"));
    let op = j.get(&e.key).await.expect("get").expect("row");
    assert!(
        op.payload.is_some(),
        "a retryable operation keeps its payload"
    );
    let second = claimed(&claim_one(&j, &e, "w2", LEASE).await);
    assert_eq!(second, 2);

    assert!(
        !j.complete(&success(&e, first, "po_stale"), "w1")
            .await
            .expect("stale"),
        "stale attempt refused"
    );
    assert!(
        j.complete(&success(&e, second, "po_2"), "w2")
            .await
            .expect("current")
    );
    assert!(
        !j.complete(&success(&e, second, "po_again"), "w2")
            .await
            .expect("again"),
        "no second completion"
    );

    let trail: Vec<(Option<String>, String, i32, String)> = j
        .events(&e.key)
        .await
        .expect("events")
        .into_iter()
        .map(|ev| (ev.from_status, ev.to_status, ev.attempt, ev.actor))
        .collect();
    let s = |x: &str| x.to_owned();
    assert_eq!(
        trail,
        vec![
            (None, s("planned"), 0, s("producer")),
            (Some(s("planned")), s("executing"), 1, s("w1")),
            (Some(s("executing")), s("failed_retryable"), 1, s("w1")),
            (Some(s("failed_retryable")), s("executing"), 2, s("w2")),
            (Some(s("executing")), s("succeeded"), 2, s("w2")),
        ]
    );
    let op = j.get(&e.key).await.expect("get").expect("row");
    assert_eq!(op.provider_operation_id.as_deref(), Some("po_2"));
}

#[tokio::test]
async fn unknown_settles_only_from_the_same_attempt_and_moves_outside_the_table_are_refused() {
    let db = TestDb::new().await;
    let j = db.journal();
    let e = envelope("unknown", "obj", pay(7));
    let attempt = claimed(&claim_one(&j, &e, "w1", LEASE).await);
    let unknown = Completion {
        key: e.key.clone(),
        expected: Status::Executing,
        attempt,
        verdict: Verdict::Unknown {
            error_code: "timeout_after_send".into(),
            check_in: Duration::ZERO,
        },
        reason: "provider_unknown".into(),
    };
    assert!(j.complete(&unknown, "w1").await.expect("unknown"));
    assert_eq!(
        not_claimed(&claim_one(&j, &e, "w2", LEASE).await),
        NotClaimed::Unknown,
        "unknown is never re-claimed"
    );

    // A late answer for an older attempt is refused; for the current attempt accepted.
    let late = |attempt| Completion {
        expected: Status::Unknown,
        attempt,
        ..success(&e, attempt, "po_late")
    };
    assert!(
        !j.complete(&late(attempt + 1), "w1")
            .await
            .expect("wrong attempt")
    );
    assert!(j.complete(&late(attempt), "w1").await.expect("late answer"));

    // planned -> succeeded is not in the table: refused before any SQL runs.
    let other = envelope("unknown", "other", pay(8));
    j.record(&other, "producer").await.expect("record");
    let bad = Completion {
        expected: Status::Planned,
        ..success(&other, 0, "x")
    };
    assert!(matches!(
        j.complete(&bad, "w1").await,
        Err(JournalError::InvalidTransition { .. })
    ));
    assert_eq!(
        j.get(&other.key).await.expect("get").expect("row").status,
        Status::Planned
    );
}

#[tokio::test]
async fn batches_fold_repeated_keys_and_answer_in_order() {
    let db = TestDb::new().await;
    let j = db.journal();
    let a = envelope("batch", "a", pay(1));
    let b = envelope("batch", "b", pay(2));
    let b_conflict = envelope("batch", "b", pay(3));
    let recorded = j
        .record_many(
            &[a.clone(), b.clone(), a.clone(), b_conflict.clone()],
            "producer",
        )
        .await
        .expect("record");
    assert_eq!(recorded[0], Recorded::New);
    assert_eq!(recorded[1], Recorded::New);
    assert!(matches!(recorded[2], Recorded::Duplicate(_)));
    assert!(matches!(recorded[3], Recorded::Conflict(_)));

    let reqs: Vec<ClaimRequest<'_>> = [&a, &a, &b, &b_conflict]
        .into_iter()
        .map(|envelope| ClaimRequest {
            envelope,
            lease: LEASE,
        })
        .collect();
    let out = j.claim(&reqs, "w1").await.expect("claim");
    assert_eq!(claimed(&out[0]), 1);
    assert_eq!(
        not_claimed(&out[1]),
        NotClaimed::LeaseLive,
        "the repeat sees this batch's own lease"
    );
    assert_eq!(claimed(&out[2]), 1);
    assert_eq!(not_claimed(&out[3]), NotClaimed::Conflict);
    assert_eq!(row_count(&db).await, 2);

    let done = j
        .complete_many(&[success(&a, 1, "po_a"), success(&b, 7, "po_b")], "w1")
        .await
        .expect("complete");
    assert_eq!(done, vec![true, false]);
}

#[tokio::test]
async fn the_articles_inspection_queries() {
    let db = TestDb::new().await;
    let j = db.journal();
    for obj in ["application-731", "application-732", "application-733"] {
        j.record(&envelope("case-1842", obj, pay(1)), "producer")
            .await
            .expect("record");
    }
    j.record(&envelope("case-9", "application-1", pay(1)), "producer")
        .await
        .expect("record");
    let ops = j.by_workflow("case-1842").await.expect("by workflow");
    assert_eq!(ops.len(), 3);
    assert!(ops.windows(2).all(|w| w[0].created_at <= w[1].created_at));
    assert!(
        j.keys_with_several_rows()
            .await
            .expect("duplicates")
            .is_empty()
    );
}

#[tokio::test]
async fn the_database_enforces_statuses_states_and_an_append_only_trail() {
    let db = TestDb::new().await;
    let j = db.journal();
    let e = envelope("constraints", "obj", pay(1));
    j.record(&e, "producer").await.expect("record");
    let refused = |sql: &'static str| {
        let pool = db.pool.clone();
        let key = e.key.as_str().to_owned();
        async move {
            let err = sqlx::query(sql)
                .bind(key)
                .execute(&pool)
                .await
                .expect_err(sql);
            err.to_string()
        }
    };
    assert!(refused("UPDATE agent_operations SET status = 'done', attempt_count = 1, first_attempt_at = now() WHERE idempotency_key = $1").await.contains("status_set"));
    assert!(refused("UPDATE agent_operations SET status = 'executing', attempt_count = 1, first_attempt_at = now() WHERE idempotency_key = $1").await.contains("executing_has_lease"));
    assert!(refused("UPDATE agent_operations SET status = 'succeeded', attempt_count = 1, first_attempt_at = now(), payload = NULL WHERE idempotency_key = $1").await.contains("succeeded_has_provider_id"));
    assert!(
        refused("UPDATE agent_operations SET payload = NULL WHERE idempotency_key = $1")
            .await
            .contains("payload_iff_live")
    );
    assert!(
        refused("UPDATE operation_events SET actor = 'mallory' WHERE idempotency_key = $1")
            .await
            .contains("append-only")
    );
    assert!(
        refused("DELETE FROM operation_events WHERE idempotency_key = $1")
            .await
            .contains("append-only")
    );
    let bad_key = sqlx::query("INSERT INTO agent_operations (idempotency_key, action_type, workflow_id, step, business_object, revision, payload_hash, payload, status, last_actor, last_reason) VALUES ('v1:nothex', 'x', 'w', 's', 'b', 1, 'sha256:00', '{}', 'planned', 'a', 'r')")
        .execute(&db.pool)
        .await
        .expect_err("bad key");
    assert!(bad_key.to_string().contains("key_format"), "{bad_key}");
    // Every status the Rust enum knows is accepted by the CHECK (the two lists agree).
    for s in Status::ALL {
        let ok: bool = sqlx::query_scalar("SELECT $1 = ANY (ARRAY['planned','executing','succeeded','failed_retryable','failed_final','unknown','deferred','awaiting_approval','rejected','cancelled','expired'])")
            .bind(s.as_str())
            .fetch_one(&db.pool)
            .await
            .expect("check");
        assert!(ok, "{s}");
    }
    let def: String = sqlx::query_scalar(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'status_set'",
    )
    .fetch_one(&db.pool)
    .await
    .expect("constraint");
    for s in Status::ALL {
        assert!(
            def.contains(&format!("'{}'", s.as_str())),
            "{def} lacks {s}"
        );
    }
}

/// A connection plans each completion for its own parameters. Under Postgres's default
/// a named statement turns generic after five executions, and a generic plan made while
/// the journal is young joins the batch to a sequential scan of the table — kept while the
/// table grows, until autovacuum analyzes it (docs/performance.md, "Generic plans of a
/// young journal").
#[tokio::test]
async fn completions_on_a_young_journal_are_never_planned_generically() {
    let db = TestDb::new().await;
    let settings = oncely_core::db::PoolSettings {
        max_connections: 1,
        ..Default::default()
    };
    let pool = oncely_core::db::connect(&db.url, &settings)
        .await
        .expect("pool");
    let j = Journal::new(pool.clone());
    for i in 0..8 {
        let e = envelope("young", &format!("obj{i}"), pay(i));
        j.record(&e, "producer").await.expect("record");
        let attempt = claimed(&claim_one(&j, &e, "w", LEASE).await);
        assert!(
            j.complete(&success(&e, attempt, "po_young"), "w")
                .await
                .expect("complete")
        );
    }
    // One connection: the pool's statements are this session's prepared statements.
    let plans: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements \
         WHERE statement LIKE 'UPDATE agent_operations AS o SET%'",
    )
    .fetch_all(&pool)
    .await
    .expect("plans");
    assert_eq!(
        plans.len(),
        1,
        "the completion statement, prepared once: {plans:?}"
    );
    let (generic, custom) = plans[0];
    assert_eq!(
        generic, 0,
        "a generic plan was used ({custom} custom plans)"
    );
    assert_eq!(custom, 8);
}

#[tokio::test]
async fn an_unreachable_database_is_a_clear_error() {
    let err = oncely_core::db::connect(
        "postgres://nobody:sekrit@127.0.0.1:1/nowhere",
        &oncely_core::db::PoolSettings {
            max_connections: 1,
            acquire_timeout: Duration::from_secs(2),
            ..Default::default()
        },
    )
    .await
    .expect_err("port 1 has no Postgres");
    let msg = err.to_string();
    assert!(
        msg.contains("cannot connect to Postgres database nobody@127.0.0.1:1/nowhere"),
        "{msg}"
    );
    assert!(!msg.contains("sekrit"), "password leaked: {msg}");
}

/// Record, claim and settle `e` as succeeded: a terminal operation a purge may delete.
async fn settle_succeeded(j: &Journal, e: &Envelope) {
    j.record(e, "producer").await.expect("record");
    assert_eq!(claimed(&claim_one(j, e, "w1", LEASE).await), 1);
    assert!(
        j.complete(&success(e, 1, "po_old"), "w1")
            .await
            .expect("complete")
    );
}

/// What an older release's claim and completion did to an envelope, on a journal migrated
/// only so far: raw statements naming only the columns every schema has (today's claim
/// names the flow-control columns of 20261214000000), the same three transitions through
/// the trigger — planned, executing, succeeded.
async fn settle_succeeded_on_an_old_schema(j: &Journal, e: &Envelope) {
    j.record(e, "producer").await.expect("record");
    for statement in [
        "UPDATE agent_operations SET status = 'executing', attempt_count = 1, first_attempt_at = now(), \
             lease_until = now() + interval '1 minute', lease_owner = 'w1', last_actor = 'w1', last_reason = 'claim' \
         WHERE idempotency_key = $1",
        "UPDATE agent_operations SET status = 'succeeded', provider_operation_id = 'po_old', result_json = '{}', \
             lease_until = NULL, lease_owner = NULL, payload = NULL, payload_sealed = NULL, payload_key_id = NULL, \
             last_actor = 'w1', last_reason = 'provider_succeeded' \
         WHERE idempotency_key = $1",
    ] {
        sqlx::query(statement)
            .bind(e.key.as_str())
            .execute(j.pool())
            .await
            .expect("an older release's transition");
    }
}

/// A hook that purges every terminal payment order, once, and checks it deleted one.
fn purge_once(j: &Journal) -> impl FnMut() -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> {
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let j = j.clone();
    move || {
        let (j, done) = (j.clone(), done.clone());
        Box::pin(async move {
            if !done.swap(true, std::sync::atomic::Ordering::SeqCst) {
                let cutoff = [("payment_order.create".to_owned(), Duration::ZERO)];
                assert_eq!(j.purge(&cutoff, false).await.expect("purge"), 1);
            }
        })
    }
}

/// A purge landing between the insert (which met the old, terminal row) and the read
/// (which no longer finds it) is the same as an intent arriving after the purge: it is
/// recorded anew, and no `New` is reported for a row that does not exist.
#[tokio::test]
async fn a_purge_between_insert_and_read_records_the_intent_anew() {
    let db = TestDb::new().await;
    let j = db.journal();
    let old = envelope("purge", "record", pay(1));
    settle_succeeded(&j, &old).await;
    let fresh = envelope("purge", "record-fresh", pay(2));
    let out = j
        .record_many_with(
            &[old.clone(), fresh.clone(), old.clone()],
            "producer",
            purge_once(&j),
        )
        .await
        .expect("record");
    assert_eq!(out[0], Recorded::New);
    assert_eq!(out[1], Recorded::New);
    assert!(matches!(&out[2], Recorded::Duplicate(op) if op.status == Status::Planned));
    let op = j
        .get(&old.key)
        .await
        .expect("get")
        .expect("a row for the new intent");
    assert_eq!((op.status, op.attempt_count), (Status::Planned, 0));
    assert_eq!(row_count(&db).await, 2);
}

/// The same race in the claim: the delivery is claimed as a new operation (attempt 1),
/// and the batch does not fail.
#[tokio::test]
async fn a_purge_between_claim_and_read_claims_the_delivery_anew() {
    let db = TestDb::new().await;
    let j = db.journal();
    let old = envelope("purge", "claim", pay(1));
    settle_succeeded(&j, &old).await;
    let fresh = envelope("purge", "claim-fresh", pay(2));
    let reqs = [
        ClaimRequest {
            envelope: &old,
            lease: LEASE,
        },
        ClaimRequest {
            envelope: &fresh,
            lease: LEASE,
        },
    ];
    let out = j
        .claim_with(&reqs, "w2", purge_once(&j))
        .await
        .expect("claim");
    assert_eq!(claimed(&out[0]), 1, "a new operation, first attempt");
    assert_eq!(claimed(&out[1]), 1);
    let op = j.get(&old.key).await.expect("get").expect("row");
    assert_eq!(
        (op.status, op.lease_owner.as_deref()),
        (Status::Executing, Some("w2"))
    );
    let events = j.events(&old.key).await.expect("events");
    assert_eq!(
        events.len(),
        1,
        "the old trail went with the purge: {events:?}"
    );
}

/// `lease_until` means one thing per status; the schema says where that is written down.
#[tokio::test]
async fn the_lease_until_column_points_to_its_one_definition() {
    let db = TestDb::new().await;
    let comment: Option<String> = sqlx::query_scalar(
        "SELECT col_description('agent_operations'::regclass, attnum) FROM pg_attribute \
         WHERE attrelid = 'agent_operations'::regclass AND attname = 'lease_until'",
    )
    .fetch_one(&db.pool)
    .await
    .expect("catalog");
    let comment = comment.expect("a comment on agent_operations.lease_until");
    assert!(comment.contains("Operation::lease_until"), "{comment}");
    for status in ["executing", "failed_retryable", "unknown"] {
        assert!(comment.contains(status), "{status} missing: {comment}");
    }
}

/// Two workers claiming the same keys in opposite orders (redeliveries arrive in any
/// order) must not deadlock: the claim takes its row locks in key order. Before it did,
/// Postgres answered `deadlock detected` here, which the workers retried, at a cost of
/// a second's wait (`deadlock_timeout`) each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_of_the_same_keys_in_opposite_orders_do_not_deadlock() {
    let db = TestDb::new().await;
    let j = db.journal();
    for round in 0..10 {
        let envs: Arc<Vec<Envelope>> = Arc::new(
            (0..40)
                .map(|i| envelope(&format!("order-{round}"), &format!("obj-{i}"), pay(i)))
                .collect(),
        );
        for e in envs.iter() {
            j.record(e, "producer").await.expect("record");
        }
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let tasks: Vec<_> = [false, true]
            .into_iter()
            .map(|reversed| {
                let (j, envs, barrier) = (j.clone(), envs.clone(), barrier.clone());
                tokio::spawn(async move {
                    let mut reqs: Vec<ClaimRequest<'_>> = envs
                        .iter()
                        .map(|e| ClaimRequest {
                            envelope: e,
                            lease: LEASE,
                        })
                        .collect();
                    if reversed {
                        reqs.reverse();
                    }
                    barrier.wait().await;
                    j.claim(&reqs, if reversed { "w-rev" } else { "w-fwd" })
                        .await
                        .map(|out| {
                            out.iter()
                                .filter(|o| matches!(o, ClaimOutcome::Claimed(_)))
                                .count()
                        })
                })
            })
            .collect();
        let mut claimed = 0;
        for t in tasks {
            match t.await.expect("task") {
                Ok(n) => claimed += n,
                Err(e) => panic!("round {round}: a claim failed: {e}"),
            }
        }
        assert_eq!(claimed, 40, "round {round}: every key claimed exactly once");
    }
}

/// Two producers recording the same new keys in opposite orders must not deadlock: a
/// unique-index insert waits for the other transaction's uncommitted row with the same
/// key, so without a fixed order each waits for the other and Postgres answers
/// `deadlock detected` (40P01) to one of them — an enqueue error for an agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_of_the_same_keys_in_opposite_orders_do_not_deadlock() {
    let db = TestDb::new().await;
    let j = db.journal();
    for round in 0..10 {
        let mut forward: Vec<Envelope> = (0..40)
            .map(|i| envelope(&format!("rec-order-{round}"), &format!("obj-{i}"), pay(i)))
            .collect();
        let reversed: Vec<Envelope> = forward.iter().rev().cloned().collect();
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let tasks: Vec<_> = [std::mem::take(&mut forward), reversed]
            .into_iter()
            .map(|envs| {
                let (j, barrier) = (j.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    j.record_many(&envs, "producer")
                        .await
                        .map(|out| out.iter().filter(|r| matches!(r, Recorded::New)).count())
                })
            })
            .collect();
        let mut new = 0;
        for t in tasks {
            match t.await.expect("task") {
                Ok(n) => new += n,
                Err(e) => panic!("round {round}: a record failed: {e}"),
            }
        }
        assert_eq!(
            new, 40,
            "round {round}: every key recorded as new exactly once"
        );
    }
}

/// A claim that committed must never be thrown away: when the journal fails *after* the
/// claim statement (here: the read of the rows it did not claim), the won claims still come
/// back and the rest are `Undecided` (deliver again). Before, the whole call failed; the
/// worker retried it, found its own live lease on the won rows (`LeaseLive`), acked them
/// without calling the provider, and each became an `unknown` for the reconciler.
#[tokio::test]
async fn a_journal_error_after_the_claim_keeps_the_won_claims() {
    let db = TestDb::new().await;
    let j = db.journal();
    let busy = envelope("keep-claims", "busy", pay(1));
    let fresh = envelope("keep-claims", "fresh", pay(2));
    j.record(&busy, "producer").await.expect("record");
    assert!(matches!(
        claim_one(&j, &busy, "other-worker", LEASE).await,
        ClaimOutcome::Claimed(_)
    ));
    // The journal of the worker under test has a pool of its own, closed in the one
    // window between the claim statement and the read.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&db.url)
        .await
        .expect("pool");
    let mine = Journal::new(pool.clone());
    let reqs = [
        ClaimRequest {
            envelope: &fresh,
            lease: LEASE,
        },
        ClaimRequest {
            envelope: &busy,
            lease: LEASE,
        },
    ];
    let out = mine
        .claim_with(&reqs, "w-under-test", || {
            let pool = pool.clone();
            async move { pool.close().await }
        })
        .await
        .expect("a committed claim is reported, not lost in an error");
    assert!(
        matches!(&out[0], ClaimOutcome::Claimed(c) if c.key == fresh.key),
        "{out:?}"
    );
    assert_eq!(out[1], ClaimOutcome::Undecided, "{out:?}");
    let op = j.get(&fresh.key).await.expect("get").expect("row");
    assert_eq!(
        (op.status, op.lease_owner.as_deref()),
        (Status::Executing, Some("w-under-test"))
    );
}

/// A provider answer holding U+0000 (which Postgres' `text` and `jsonb` refuse) is stored
/// with U+FFFD instead, and does not fail the other completions of its batch. Before, the
/// whole batch failed for good and every call in it ended as an `unknown`.
#[tokio::test]
async fn an_answer_with_a_nul_character_does_not_fail_its_batch() {
    let db = TestDb::new().await;
    let j = db.journal();
    let nul = envelope("nul-answer", "nul", pay(1));
    let plain = envelope("nul-answer", "plain", pay(2));
    let mut completions = Vec::new();
    for e in [&nul, &plain] {
        j.record(e, "producer").await.expect("record");
        let ClaimOutcome::Claimed(c) = claim_one(&j, e, "w", LEASE).await else {
            panic!("claimable")
        };
        completions.push(success(e, c.attempt, "po_1"));
    }
    completions[0].verdict = Verdict::Succeeded {
        provider_operation_id: "po\u{0}1".into(),
        result: json!({"id": "po\u{0}1", "echo\u{0}": ["a\u{0}b", {"n": 1}]}),
    };
    j.complete_batch(&completions, "w")
        .await
        .expect("one statement for both");
    let op = j.get(&nul.key).await.expect("get").expect("row");
    assert_eq!(op.status, Status::Succeeded);
    assert_eq!(op.provider_operation_id.as_deref(), Some("po\u{FFFD}1"));
    assert_eq!(
        op.result_json,
        Some(json!({"id": "po\u{FFFD}1", "echo\u{FFFD}": ["a\u{FFFD}b", {"n": 1}]}))
    );
    let op = j.get(&plain.key).await.expect("get").expect("row");
    assert_eq!(op.status, Status::Succeeded);
}

/// The republish scan takes at most its limit: the longest-untouched `planned` rows first,
/// then the `failed_retryable` ones past their not-before time (longest due first); a
/// `failed_retryable` row not yet due and rows it took moments ago stay where they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn republish_takes_planned_then_due_retries_and_never_more_than_its_limit() {
    let db = TestDb::new().await;
    let j = db.journal();
    let planned: Vec<Envelope> = (0..3)
        .map(|n| envelope("wf-rp", &format!("planned-{n}"), pay(100 + n)))
        .collect();
    for e in &planned {
        j.record(e, "producer").await.expect("record");
    }
    let retry = |e: &Envelope, attempt: i32, retry_in: Duration| Completion {
        key: e.key.clone(),
        expected: Status::Executing,
        attempt,
        verdict: Verdict::FailedRetryable {
            error_code: "http_503".into(),
            retry_in,
        },
        reason: "provider_retryable".into(),
    };
    let mut retries = Vec::new();
    for n in 0..3 {
        let e = envelope("wf-rp", &format!("retry-{n}"), pay(200 + n));
        let attempt = claimed(&claim_one(&j, &e, "w", Duration::from_secs(30)).await);
        assert!(
            j.complete(&retry(&e, attempt, Duration::ZERO), "w")
                .await
                .expect("retry")
        );
        retries.push(e);
    }
    let later = envelope("wf-rp", "retry-later", pay(300));
    let attempt = claimed(&claim_one(&j, &later, "w", Duration::from_secs(30)).await);
    assert!(
        j.complete(&retry(&later, attempt, Duration::from_secs(3600)), "w")
            .await
            .expect("retry later")
    );
    // Oldest first within each kind: age the rows in the order they were made.
    sqlx::query(
        "WITH o AS (SELECT idempotency_key, row_number() OVER (ORDER BY created_at) AS n FROM agent_operations) \
         UPDATE agent_operations a SET updated_at = now() - interval '1 hour' + make_interval(secs => o.n), \
             lease_until = CASE WHEN a.status = 'failed_retryable' AND a.lease_until < now() + interval '1 minute' \
                 THEN now() - interval '2 hours' + make_interval(secs => o.n) ELSE a.lease_until END \
         FROM o WHERE a.idempotency_key = o.idempotency_key",
    )
    .execute(&db.pool)
    .await
    .expect("age the rows");
    let sweep = async || {
        let mut k: Vec<String> = j
            .take_for_republish(Duration::from_secs(60), 4, None)
            .await
            .expect("sweep")
            .operations
            .into_iter()
            .map(|o| o.key.as_str().to_owned())
            .collect();
        k.sort();
        k
    };
    let sorted = |es: &[&Envelope]| {
        let mut k: Vec<String> = es.iter().map(|e| e.key.as_str().to_owned()).collect();
        k.sort();
        k
    };
    assert_eq!(
        sweep().await,
        sorted(&[&planned[0], &planned[1], &planned[2], &retries[0]])
    );
    assert_eq!(sweep().await, sorted(&[&retries[1], &retries[2]]));
    let third = sweep().await;
    assert!(third.is_empty(), "taken moments ago or not due: {third:?}");
}

/// Migration 20261211000000 on a journal an older release left: every existing event gets
/// its operation's number, the trails read the same after it, new transitions carry the
/// number, and a purge deletes the old events with the new ones.
#[tokio::test]
async fn events_recorded_before_the_sequence_migration_are_found_after_it() {
    let db = TestDb::migrated_to(20261210000000).await;
    let j = db.journal();
    let done = envelope("seq-migration", "done", pay(1));
    let live = envelope("seq-migration", "live", pay(2));
    settle_succeeded_on_an_old_schema(&j, &done).await;
    j.record(&live, "producer").await.expect("record");
    oncely_core::db::migrate(&db.pool, &db.url)
        .await
        .expect("the remaining migrations");

    let mismatched: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM operation_events e LEFT JOIN agent_operations o ON o.seq = e.op_seq \
         WHERE o.idempotency_key IS DISTINCT FROM e.idempotency_key",
    )
    .fetch_one(&db.pool)
    .await
    .expect("events against their operations");
    assert_eq!(
        mismatched, 0,
        "every old event carries its operation's number"
    );
    let statuses = |evs: Vec<oncely_core::journal::Event>| -> Vec<String> {
        evs.into_iter().map(|e| e.to_status).collect()
    };
    assert_eq!(
        statuses(j.events(&done.key).await.expect("events")),
        ["planned", "executing", "succeeded"]
    );
    assert_eq!(
        statuses(j.events(&live.key).await.expect("events")),
        ["planned"]
    );

    assert_eq!(claimed(&claim_one(&j, &live, "w2", LEASE).await), 1);
    assert!(
        j.complete(&success(&live, 1, "po_live"), "w2")
            .await
            .expect("complete")
    );
    assert_eq!(
        statuses(j.events(&live.key).await.expect("events")),
        ["planned", "executing", "succeeded"]
    );
    let later = envelope("seq-migration", "later", pay(3));
    j.record(&later, "producer").await.expect("record");
    let (first, last): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT seq FROM agent_operations WHERE idempotency_key = $1), \
                (SELECT seq FROM agent_operations WHERE idempotency_key = $2)",
    )
    .bind(done.key.as_str())
    .bind(later.key.as_str())
    .fetch_one(&db.pool)
    .await
    .expect("numbers");
    assert!(first < last, "operations are numbered in recording order");

    let cutoff = [("payment_order.create".to_owned(), Duration::ZERO)];
    assert_eq!(j.purge(&cutoff, false).await.expect("purge"), 2);
    let left: Vec<(String, String)> =
        sqlx::query_as("SELECT idempotency_key, to_status FROM operation_events")
            .fetch_all(&db.pool)
            .await
            .expect("events left");
    assert_eq!(
        left,
        [(later.key.as_str().to_owned(), "planned".to_owned())],
        "the purged operations' events went with them, old and new"
    );
}

/// A purge reads the operations table a few pages per transaction: with one page per step,
/// terminal operations spread over many pages all go, with their events, in several steps
/// that walk the table from its first page to its last; live and recent ones stay.
#[tokio::test]
async fn a_purge_in_steps_of_one_page_deletes_every_old_terminal_operation_and_only_those() {
    let db = TestDb::new().await;
    let j = db.journal();
    let old: Vec<Envelope> = (0..60)
        .map(|n| envelope("purge-steps", &format!("old-{n}"), pay(n)))
        .collect();
    for e in &old {
        settle_succeeded(&j, e).await;
    }
    let recent = envelope("purge-steps", "recent", pay(100));
    settle_succeeded(&j, &recent).await;
    let live = envelope("purge-steps", "live", pay(101));
    j.record(&live, "producer").await.expect("record");
    // The old ones and the live one last changed two days ago.
    let keys: Vec<&str> = old.iter().chain([&live]).map(|e| e.key.as_str()).collect();
    sqlx::query(
        "UPDATE agent_operations SET updated_at = now() - interval '2 days' WHERE idempotency_key = ANY($1)",
    )
    .bind(&keys)
    .execute(&db.pool)
    .await
    .expect("age them");
    let pages: i64 = sqlx::query_scalar(
        "SELECT pg_relation_size('agent_operations') / current_setting('block_size')::bigint",
    )
    .fetch_one(&db.pool)
    .await
    .expect("pages");
    assert!(pages >= 3, "the rows span several pages: {pages}");

    let cutoff = [(
        "payment_order.create".to_owned(),
        Duration::from_secs(86_400),
    )];
    let mut steps = Vec::new();
    let would = j
        .purge_in_steps(&cutoff, true, 1, |s| steps.push(*s))
        .await
        .expect("dry run");
    assert_eq!(would, 60);
    assert_eq!(steps.len() as i64, pages, "one step per page: {steps:?}");
    assert_eq!(row_count(&db).await, 62, "a dry run deletes nothing");
    let mut last = 0;
    let purged = j
        .purge_in_steps(&cutoff, false, 1, |s| {
            assert_eq!(s.next_block, last + 1, "the pages in order: {s:?}");
            last = s.next_block;
        })
        .await
        .expect("purge");
    assert_eq!(purged, 60);
    assert_eq!(last, pages);
    for e in &old {
        assert!(j.get(&e.key).await.expect("get").is_none());
        assert!(j.events(&e.key).await.expect("events").is_empty());
    }
    for e in [&recent, &live] {
        assert!(j.get(&e.key).await.expect("get").is_some());
        assert!(!j.events(&e.key).await.expect("events").is_empty());
    }
    // Nothing is left for a second purge.
    assert_eq!(j.purge(&cutoff, false).await.expect("again"), 0);
}

/// Migration 20261213000000 rewrote the key's and the payload hash's format checks without
/// the bounded repetition `{64}` (Postgres's regex engine expands it, ~13 µs a row on every
/// write): on a journal an older release left, its rows pass the new checks (validated),
/// and the new checks accept exactly the values the old patterns did.
#[tokio::test]
async fn the_format_checks_accept_exactly_what_the_bounded_patterns_did() {
    let db = TestDb::migrated_to(20261212000001).await;
    let j = db.journal();
    settle_succeeded_on_an_old_schema(&j, &envelope("format-checks", "old", pay(1))).await;
    oncely_core::db::migrate(&db.pool, &db.url)
        .await
        .expect("the remaining migrations");
    let validated: Vec<(String, bool)> = sqlx::query_as(
        "SELECT conname::text, convalidated FROM pg_constraint \
         WHERE conrelid = 'agent_operations'::regclass \
           AND conname IN ('key_format', 'payload_hash_format') ORDER BY conname",
    )
    .fetch_all(&db.pool)
    .await
    .expect("constraints");
    assert_eq!(
        validated,
        [
            ("key_format".to_owned(), true),
            ("payload_hash_format".to_owned(), true)
        ]
    );

    let hex = |n: usize| "0123456789abcdef".repeat(5)[..n].to_owned();
    let keys = [
        format!("v1:{}", hex(64)),
        format!("v1:{}", hex(63)),
        format!("v1:{}", hex(65)),
        format!("v1:{}", hex(64).to_uppercase()),
        format!("v1:{}é", hex(62)), // 67 bytes, 66 characters
        format!("v1:{}é", hex(63)), // 67 characters, 68 bytes
        format!("v1:{}\n", hex(64)),
        format!("v1:{}\n", hex(63)),
        format!("v2:{}", hex(64)),
        format!(" v1:{}", hex(63)),
        format!("v1:{}g", hex(63)),
        "v1:".to_owned(),
    ];
    let hashes = [
        format!("sha256:{}", hex(64)),
        format!("sha256:{}", hex(63)),
        format!("sha256:{}", hex(65)),
        format!("SHA256:{}", hex(64)),
        format!("sha256:{}é", hex(62)),
        format!("sha256:{}\n", hex(63)),
    ];
    let insert = "INSERT INTO agent_operations (idempotency_key, action_type, workflow_id, step, \
                  business_object, revision, payload_hash, payload, status, last_actor, last_reason) \
                  VALUES ($1, 'x', 'w', 's', $3, 1, $2, '{}', 'planned', 'a', 'r')";
    let cases = keys
        .iter()
        .map(|k| {
            (
                "key_format",
                k.as_str(),
                hashes[0].as_str(),
                k.as_str(),
                "v1",
            )
        })
        .chain(hashes.iter().map(|h| {
            (
                "payload_hash_format",
                keys[0].as_str(),
                h.as_str(),
                h.as_str(),
                "sha256",
            )
        }));
    for (n, (constraint, key, hash, value, prefix)) in cases.enumerate() {
        let old: bool = sqlx::query_scalar("SELECT $1 ~ $2")
            .bind(value)
            .bind(format!("^{prefix}:[0-9a-f]{{64}}$"))
            .fetch_one(&db.pool)
            .await
            .expect("the old pattern");
        let mut tx = db.pool.begin().await.expect("begin");
        let inserted = sqlx::query(insert)
            .bind(key)
            .bind(hash)
            .bind(format!("object-{n}"))
            .execute(&mut *tx)
            .await;
        tx.rollback().await.expect("rollback");
        match inserted {
            Ok(_) => assert!(old, "{value:?} accepted, the old pattern refuses it"),
            Err(e) => {
                assert!(!old, "{value:?} refused ({e}), the old pattern accepts it");
                assert!(e.to_string().contains(constraint), "{value:?}: {e}");
            }
        }
    }
}
