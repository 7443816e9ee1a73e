//! Least privilege, from the outside: the group roles `oncely-worker migrate --roles`
//! writes hold what each process's statements need and nothing the tests below can
//! abuse; processes refuse to start without their grants and say which; only the
//! schema's owner migrates; the RabbitMQ users reach their own prefix only; and a whole
//! fleet — each process on its own Postgres login and RabbitMQ user — executes every
//! action once.
//!
//! Postgres roles are cluster-wide: every test uses its own role prefix
//! ([`DbRoles`]) and drops its roles at the end.

use lapin::BasicProperties;
use lapin::options::{BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::FieldTable;
use oncely_core::config::BrokerConfig;
use oncely_core::db::DbError;
use oncely_core::journal::{
    ClaimOutcome, ClaimRequest, Completion, DeskFilter, Journal, JournalError, NewReview, Recorded,
    Resolution, Verdict,
};
use oncely_core::review::{Evidence, ReviewReason};
use oncely_core::roles::{Process, Role, check_grants, grants, rabbitmq};
use oncely_core::topology::Topology;
use oncely_core::{Envelope, IdempotencyKey, Intent, Status};
use oncely_producer::{Enqueued, Producer};
use oncely_tests::fleet::{FAST_RECONCILER, Fleet, FleetOptions, binary, secret};
use oncely_tests::gateway::{Gateway, TOKEN_A};
use oncely_tests::private_broker::PrivateBroker;
use oncely_tests::roles::{DbRoles, Logins};
use oncely_tests::{TestDb, eventually, unique_name};
use serde_json::json;
use std::collections::HashMap;
use std::time::Duration;
use tokio::process::Command;

const DEADLINE: Duration = Duration::from_secs(90);

fn payment(object: &str, amount: i64) -> Envelope {
    Intent::from_json(
        json!({"action_type": "payment_order.create", "workflow_id": "case-roles",
        "step": "pay", "business_object": object, "revision": 1,
        "payload": {"account_id": "example-account", "amount_minor": amount, "currency": "RUB",
                    "business_reference": object}}),
    )
    .expect("intent")
    .seal(&secret())
    .expect("seal")
}

/// The statement failed because the role lacks a privilege (SQLSTATE 42501).
fn is_refused(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.code().as_deref() == Some("42501"))
}

/// A journal call failed because the role lacks a privilege.
fn journal_refused<T: std::fmt::Debug>(r: Result<T, JournalError>, what: &str) {
    match r {
        Err(JournalError::Database(e)) if is_refused(&e) => {}
        other => panic!("{what}: expected permission denied, got {other:?}"),
    }
}

/// `sql` run by `pool`'s role is refused for lack of a privilege.
async fn refused(pool: &sqlx::PgPool, sql: &str) {
    match sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(pool)
        .await
    {
        Err(e) if is_refused(&e) => {}
        other => panic!("{sql}: expected permission denied, got {other:?}"),
    }
}

async fn event_count(db: &TestDb) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM operation_events")
        .fetch_one(&db.pool)
        .await
        .expect("count")
}

/// Each role, through a login in it, can run its process's journal statements and is
/// refused the rest: the worker cannot change or delete the audit trail (not even with
/// the purge setting on), create or drop anything, or resolve reviews; the producer
/// cannot read payloads or write events; the reconciler cannot resolve; only the admin
/// resolves and purges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_role_can_run_its_statements_and_nothing_it_must_not() {
    let db = TestDb::new().await;
    let roles = DbRoles::create(&db).await;
    let owner = db.journal();
    let (_, worker) = roles.pool("worker", Role::Worker).await;
    let (_, reconciler) = roles.pool("reconciler", Role::Reconciler).await;
    let (_, producer) = roles.pool("producer", Role::Producer).await;
    let (_, admin) = roles.pool("admin", Role::Admin).await;
    let (_, desk) = roles.pool("desk", Role::Desk).await;

    // The start-up check: each passes for its own process kind, not for another's.
    for (pool, processes) in [
        (&worker, &[Process::Worker][..]),
        (&reconciler, &[Process::Reconciler]),
        (&producer, &[Process::Producer, Process::Gateway]),
        (&admin, &[Process::Admin]),
        (&desk, &[Process::Desk]),
    ] {
        for p in processes {
            check_grants(pool, *p, &db.url)
                .await
                .unwrap_or_else(|e| panic!("{p:?}: {e}"));
        }
    }
    match check_grants(&producer, Process::Worker, &db.url).await {
        Err(DbError::Grants(m)) => {
            let text = m.to_string();
            assert!(
                text.contains("SELECT on agent_operations")
                    && text.contains("(needed by the worker)"),
                "{text}"
            );
        }
        other => panic!("the producer's role passed the worker's check: {other:?}"),
    }

    // Producer: records (the trigger writes the event as the owner) and reads back
    // without the payload; never the payload itself, never an event.
    let pj = Journal::new(producer.clone());
    let (a, b, c) = (payment("a", 1), payment("b", 2), payment("c", 3));
    let changed = payment("a", 99);
    let recorded = pj
        .record_many(
            &[a.clone(), b.clone(), a.clone(), changed.clone()],
            "producer",
        )
        .await
        .expect("record as the producer");
    assert!(matches!(recorded[0], Recorded::New) && matches!(recorded[1], Recorded::New));
    assert!(
        matches!(&recorded[2], Recorded::Duplicate(op) if op.status == Status::Planned && op.payload.is_none())
    );
    assert!(matches!(recorded[3], Recorded::Conflict(_)));
    let seen = pj
        .get_without_payload(&a.key)
        .await
        .expect("status as the producer")
        .expect("row");
    assert_eq!((seen.status, seen.payload), (Status::Planned, None));
    assert_eq!(owner.events(&a.key).await.expect("events").len(), 1);
    journal_refused(pj.get(&a.key).await, "the producer reading a payload");
    refused(&producer, "SELECT payload FROM agent_operations").await;
    refused(
        &producer,
        &format!("INSERT INTO operation_events (idempotency_key, to_status, attempt, actor, reason) VALUES ('{}', 'succeeded', 1, 'forged', 'forged')", a.key),
    )
    .await;
    // The gateway's cancels and approvals move rows (status and the control columns), but
    // no producer login can forge what a provider said.
    refused(
        &producer,
        "UPDATE agent_operations SET status = 'succeeded', provider_operation_id = 'forged', result_json = '{}'",
    )
    .await;
    refused(
        &producer,
        "UPDATE agent_operations SET attempt_count = attempt_count + 1",
    )
    .await;
    refused(&producer, "SELECT * FROM operation_events").await;

    // Worker: claims (a recorded row, and one it inserts itself), completes, records a
    // conflict.
    let wj = Journal::new(worker.clone());
    let lease = Duration::from_secs(60);
    let claims = wj
        .claim(
            &[
                ClaimRequest {
                    envelope: &a,
                    lease,
                },
                ClaimRequest {
                    envelope: &c,
                    lease,
                },
            ],
            "worker",
        )
        .await
        .expect("claim as the worker");
    assert!(
        claims.iter().all(|o| matches!(o, ClaimOutcome::Claimed(_))),
        "{claims:?}"
    );
    let done = |e: &Envelope, verdict: Verdict, reason: &str| Completion {
        key: e.key.clone(),
        expected: Status::Executing,
        attempt: 1,
        verdict,
        reason: reason.into(),
    };
    let applied = wj
        .complete_many(
            &[
                done(
                    &a,
                    Verdict::Succeeded {
                        provider_operation_id: "po_a".into(),
                        result: json!({"id": "po_a"}),
                    },
                    "provider_succeeded",
                ),
                done(
                    &c,
                    Verdict::Unknown {
                        error_code: "timeout".into(),
                        check_in: Duration::ZERO,
                    },
                    "provider_unknown",
                ),
            ],
            "worker",
        )
        .await
        .expect("complete as the worker");
    assert_eq!(applied, vec![true, true]);
    wj.record_conflict(&a.key, &changed.payload_hash, "worker")
        .await
        .expect("conflict audit row as the worker");
    let events = event_count(&db).await;
    for sql in [
        "UPDATE operation_events SET reason = 'rewritten'",
        "DELETE FROM operation_events",
        "CREATE TABLE forbidden (i int)",
        "CREATE TEMP TABLE forbidden (i int)",
        "CREATE FUNCTION forbidden() RETURNS int LANGUAGE sql AS 'SELECT 1'",
        "DROP TABLE operation_events",
        "ALTER TABLE agent_operations DROP CONSTRAINT status_set",
        "DROP TRIGGER operation_events_append_only ON operation_events",
        "UPDATE operation_reviews SET resolution = 'retry', resolved_by = 'worker', resolved_at = now()",
        "INSERT INTO operation_reviews (idempotency_key, reason, opened_by) SELECT idempotency_key, 'x', 'worker' FROM agent_operations",
        "SELECT * FROM operation_reviews",
        "UPDATE agent_operations SET payload_hash = 'sha256:0000000000000000000000000000000000000000000000000000000000000000'",
        "UPDATE agent_operations SET reconcile_checks = 0",
        "DELETE FROM agent_operations",
        "SELECT * FROM gateway_requests",
        "TRUNCATE operation_events",
    ] {
        refused(&worker, sql).await;
    }
    // The purge setting is anybody's to set: what stops the worker is that it may not
    // DELETE at all.
    let mut tx = worker.begin().await.expect("begin");
    sqlx::query("SET LOCAL oncely.purge = 'on'")
        .execute(&mut *tx)
        .await
        .expect("any role may set a custom setting");
    match sqlx::query("DELETE FROM operation_events")
        .execute(&mut *tx)
        .await
    {
        Err(e) if is_refused(&e) => {}
        other => panic!("the worker deleted events with the purge setting on: {other:?}"),
    }
    drop(tx);
    assert_eq!(
        event_count(&db).await,
        events,
        "the audit trail is untouched"
    );

    // Reconciler: opens a review (with its audit row), republishes with the payload;
    // cannot resolve, delete, insert operations or start attempts.
    let rj = Journal::new(reconciler.clone());
    assert!(
        rj.open_review(
            &c.key,
            1,
            &NewReview::bare(&ReviewReason::LookupUnsupported),
            "reconciler"
        )
        .await
        .expect("open a review as the reconciler")
    );
    let republish = rj
        .take_for_republish(Duration::ZERO, 10, None)
        .await
        .expect("republish as the reconciler")
        .operations;
    assert!(
        republish
            .iter()
            .any(|op| op.key == b.key && op.payload.is_some()),
        "{republish:?}"
    );
    rj.expire_leases(10, "sweeper", None).await.expect("expire");
    journal_refused(
        rj.record(&payment("d", 4), "reconciler").await,
        "the reconciler recording",
    );
    for sql in [
        "UPDATE operation_reviews SET resolution = 'failed', resolved_by = 'reconciler', resolved_at = now()",
        "DELETE FROM operation_reviews",
        "DELETE FROM agent_operations",
        "UPDATE agent_operations SET attempt_count = attempt_count + 1",
        "UPDATE operation_events SET actor = 'someone else'",
        "CREATE TABLE forbidden (i int)",
    ] {
        refused(&reconciler, sql).await;
    }

    // Desk: lists open reviews with their operations, reads the timeline, resolves a
    // review (the admin's transaction); never reads a payload, deletes or inserts.
    let d = payment("d2", 6);
    claimed_then_unknown(&wj, &owner, &d).await;
    assert!(
        rj.open_review(
            &d.key,
            1,
            &NewReview::bare(&ReviewReason::AbsentPolicyRequiresReview),
            "reconciler"
        )
        .await
        .expect("open a review for the desk")
    );
    let dj = Journal::new(desk.clone());
    let listed = dj
        .desk_reviews(&DeskFilter {
            limit: 10,
            ..DeskFilter::default()
        })
        .await
        .expect("list as the desk");
    assert!(
        listed
            .iter()
            .any(|r| r.review.idempotency_key == d.key.as_str() && r.status == "unknown"),
        "{listed:?}"
    );
    assert!(
        !dj.events(&d.key)
            .await
            .expect("timeline as the desk")
            .is_empty()
    );
    let op = dj
        .resolve_review(
            &d.key,
            &Resolution::Failed,
            "alice",
            Some("not in the statement"),
        )
        .await
        .expect("resolve as the desk");
    assert_eq!(op.status, Status::FailedFinal);
    journal_refused(dj.get(&d.key).await, "the desk reading a payload");
    for sql in [
        "SELECT payload FROM agent_operations",
        "SELECT payload_sealed FROM agent_operations",
        "DELETE FROM operation_reviews",
        "DELETE FROM agent_operations",
        "UPDATE agent_operations SET attempt_count = attempt_count + 1",
        "UPDATE operation_events SET actor = 'someone else'",
        "INSERT INTO operation_reviews (idempotency_key, reason, opened_by) SELECT idempotency_key, 'x', 'desk' FROM agent_operations",
        "CREATE TABLE forbidden (i int)",
    ] {
        refused(&desk, sql).await;
    }

    // Admin: resolves the review and purges (events included); inserts nothing.
    let aj = Journal::new(admin.clone());
    refused(
        &admin,
        &format!("INSERT INTO operation_events (idempotency_key, to_status, attempt, actor, reason) VALUES ('{}', 'succeeded', 1, 'forged', 'forged')", a.key),
    )
    .await;
    journal_refused(
        aj.record(&payment("e", 5), "admin").await,
        "the admin recording",
    );
    refused(&admin, "CREATE TABLE forbidden (i int)").await;
    let op = aj
        .resolve_review(
            &c.key,
            &Resolution::Succeeded {
                provider_operation_id: "po_c".into(),
            },
            "alice",
            Some("seen in the statement"),
        )
        .await
        .expect("resolve as the admin");
    assert_eq!(op.status, Status::Succeeded);
    let purged = aj
        .purge(&[("payment_order.create".into(), Duration::ZERO)], false)
        .await
        .expect("purge as the admin");
    assert_eq!(purged, 3, "a, c and d, the terminal ones");
    assert!(owner.events(&a.key).await.expect("events").is_empty());
    assert!(owner.get(&b.key).await.expect("get").is_some());
}

/// Claims `e` as `journal`'s role (attempt 1), then, as the owner, makes it `unknown` the
/// way the sweeper does when the lease expires.
async fn claimed_then_unknown(journal: &Journal, owner: &Journal, e: &Envelope) {
    let claims = journal
        .claim(
            &[ClaimRequest {
                envelope: e,
                lease: Duration::from_secs(60),
            }],
            "worker",
        )
        .await
        .expect("claim");
    assert!(matches!(claims[0], ClaimOutcome::Claimed(_)), "{claims:?}");
    sqlx::query(
        "UPDATE agent_operations SET status = 'unknown', lease_owner = NULL, lease_until = now(), \
             last_actor = 'sweeper', last_reason = 'lease_expired' WHERE idempotency_key = $1",
    )
    .bind(e.key.as_str())
    .execute(owner.pool())
    .await
    .expect("expire");
}

/// Transient reviews under least privilege: the reconciler opens one, re-checks it,
/// settles it by a lookup (the review closes itself, `auto:lookup`) and counts closings,
/// without any right to write a decision; a worker's late answer closes a review
/// (`auto:late_answer`) with no right on reviews at all.
#[tokio::test]
async fn reviews_close_themselves_under_each_roles_grants() {
    let db = TestDb::new().await;
    let roles = DbRoles::create(&db).await;
    let owner = db.journal();
    let (_, worker) = roles.pool("worker", Role::Worker).await;
    let (_, reconciler) = roles.pool("reconciler", Role::Reconciler).await;
    let (wj, rj) = (
        Journal::new(worker.clone()),
        Journal::new(reconciler.clone()),
    );
    let (d, e) = (payment("d", 4), payment("e", 5));
    owner
        .record_many(&[d.clone(), e.clone()], "test")
        .await
        .expect("record");
    claimed_then_unknown(&wj, &owner, &d).await;
    claimed_then_unknown(&wj, &owner, &e).await;
    let failing = ReviewReason::LookupFailing("http_503".into());
    let evidence = Evidence::default();
    let transient = NewReview {
        reason: &failing,
        evidence: &evidence,
        lookup: Some(("failed", Some("http_503"))),
        recheck_in: Some(Duration::ZERO),
    };
    for env in [&d, &e] {
        let opened = rj
            .open_review(&env.key, 1, &transient, "reconciler")
            .await
            .expect("open as the reconciler");
        assert!(opened);
    }

    // The reconciler re-checks d twice: once still failing, then found.
    let due = rj
        .take_due_reviews(Duration::from_secs(30), 10)
        .await
        .expect("take as the reconciler");
    assert_eq!(due.len(), 2, "{due:?}");
    let rd = due.iter().find(|r| r.op.key == d.key).expect("d is due");
    assert!(
        rj.record_recheck(rd.review.id, ("failed", Some("http_503")), None)
            .await
            .expect("record as the reconciler")
    );
    let found = Completion {
        key: d.key.clone(),
        expected: Status::Unknown,
        attempt: 1,
        verdict: Verdict::Succeeded {
            provider_operation_id: "po_d".into(),
            result: json!({"id": "po_d"}),
        },
        reason: "reconcile_found_succeeded".into(),
    };
    assert!(
        rj.settle_reviewed(
            rd.review.id,
            ("succeeded", Some("po_d")),
            &found,
            "reconciler"
        )
        .await
        .expect("settle as the reconciler")
    );

    // The worker's late answer for e closes e's review.
    let late = Completion {
        key: e.key.clone(),
        expected: Status::Executing,
        attempt: 1,
        verdict: Verdict::Succeeded {
            provider_operation_id: "po_e".into(),
            result: json!({"id": "po_e"}),
        },
        reason: "provider_succeeded".into(),
    };
    assert!(
        wj.complete(&late, "worker")
            .await
            .expect("late answer as the worker")
    );

    for (env, how, actor) in [
        (&d, "auto:lookup", "reconciler"),
        (&e, "auto:late_answer", "worker"),
    ] {
        let review = owner
            .reviews_of(&env.key)
            .await
            .expect("reviews")
            .pop()
            .expect("one");
        assert_eq!(
            (
                review.resolution.as_deref(),
                review.resolved_by.as_deref(),
                review.recheck_at
            ),
            (Some(how), Some(actor), None),
            "{review:?}"
        );
        let closed = owner
            .events(&env.key)
            .await
            .expect("events")
            .pop()
            .expect("event");
        assert_eq!(
            (
                closed.reason.as_str(),
                closed.error_code.as_deref(),
                closed.to_status.as_str()
            ),
            ("review_closed", Some(how), "succeeded")
        );
    }
    let lookups: Vec<String> = owner.reviews_of(&d.key).await.expect("reviews")[0]
        .evidence
        .lookups
        .iter()
        .map(|l| l.answer.clone())
        .collect();
    assert_eq!(
        lookups,
        ["failed", "failed", "succeeded"],
        "every lookup is evidence"
    );

    let mut counted: Vec<String> = rj
        .count_closed_reviews(10)
        .await
        .expect("count as the reconciler")
        .into_iter()
        .map(|c| c.resolution)
        .collect();
    counted.sort();
    assert_eq!(counted, ["auto:late_answer", "auto:lookup"]);
    assert!(
        rj.count_closed_reviews(10).await.expect("count").is_empty(),
        "counted once"
    );
    assert_eq!(rj.open_reviews().await.expect("gauges").for_lookup, 0);
    for sql in [
        "UPDATE operation_reviews SET resolution = 'failed', resolved_by = 'reconciler', resolved_at = now()",
        "UPDATE operation_reviews SET note = 'rewritten'",
    ] {
        refused(&reconciler, sql).await;
    }
    for sql in [
        "UPDATE operation_reviews SET recheck_at = now()",
        "SELECT * FROM operation_reviews",
    ] {
        refused(&worker, sql).await;
    }
}

/// Every column the grants name exists, but for the sealed payload's (added by a
/// migration of their own; granted once they exist): a typo would silently grant
/// nothing.
#[tokio::test]
async fn every_column_the_grants_name_exists() {
    let db = TestDb::new().await;
    for (table, column) in grants::named_columns() {
        let exists: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_name = $1 AND column_name = $2)",
        )
        .bind(table)
        .bind(column)
        .fetch_one(&db.pool)
        .await
        .expect("catalog");
        let sealed = table == grants::OPERATIONS && grants::PAYLOAD_COLUMNS.contains(&column);
        assert!(
            exists || sealed,
            "{table}.{column} is named by the grants but does not exist"
        );
    }
}

/// Run a binary to completion with `DATABASE_URL` (and a broker nobody listens on: a
/// process that got past its checks would retry it, not exit).
async fn run(program: &str, args: &[&str], database_url: &str) -> (i32, String, String) {
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        Command::new(binary(program))
            .args(args)
            .env("DATABASE_URL", database_url)
            .env("ONCELY_AMQP_URL", "amqp://guest:guest@127.0.0.1:1/%2f")
            .env("ONCELY_KEY_SECRET", "test-secret-do-not-use")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{program} {args:?} kept running"))
    .unwrap_or_else(|e| panic!("{program}: {e}"));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Only the schema's owner migrates (a runtime role is refused, saying why; a member of
/// `<prefix>migrate` may); each process kind refuses to start without its grants and
/// names them; `--print` changes nothing; `--roles` again is harmless.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_owner_migrates_and_processes_name_the_grant_they_lack() {
    let db = TestDb::new().await;
    let roles = DbRoles::create(&db).await;
    let (worker, worker_url) = roles.login("worker", &[Role::Worker]).await;
    let (_, migrate_url) = roles.login("migrate", &[Role::Migrate]).await;
    let (producer, producer_url) = roles.login("producer", &[Role::Producer]).await;
    let (nobody, nobody_url) = roles.login("nobody", &[]).await;
    let tokens = std::env::temp_dir().join(format!("{}.toml", unique_name("tokens")));
    std::fs::write(
        &tokens,
        format!(
            "[[token]]\nid = \"t\"\ntenant = \"a\"\nsha256 = \"{}\"\n",
            oncely_gateway::tokens::hash_hex(TOKEN_A.token)
        ),
    )
    .expect("tokens file");
    let tokens = tokens.to_string_lossy().into_owned();

    let (code, _, err) = run("oncely-worker", &["migrate"], &worker_url).await;
    assert_ne!(code, 0, "the worker's role migrated");
    assert!(
        err.contains(&format!(
            "role \"{worker}\" cannot apply migrations: it lacks CREATE on schema public and it does not own"
        )),
        "{err}"
    );
    let (code, out, err) = run("oncely-worker", &["migrate"], &migrate_url).await;
    assert_eq!(code, 0, "a member of the owner role migrates: {out}{err}");

    for (program, args, url, role, process, lacks) in [
        (
            "oncely-worker",
            &["run"][..],
            &producer_url,
            &producer,
            "worker",
            "SELECT on agent_operations",
        ),
        (
            "oncely-worker",
            &["reconcile"],
            &worker_url,
            &worker,
            "reconciler",
            "SELECT on operation_reviews",
        ),
        (
            "oncely-worker",
            &["admin", "ops", "list"],
            &nobody_url,
            &nobody,
            "admin",
            "SELECT on _sqlx_migrations",
        ),
        (
            "oncely-producer",
            &[
                "status",
                "v1:0000000000000000000000000000000000000000000000000000000000000000",
            ],
            &nobody_url,
            &nobody,
            "producer",
            "INSERT on agent_operations",
        ),
        (
            "oncely-gateway",
            &["serve", "--tokens-file", &tokens],
            &worker_url,
            &worker,
            "gateway",
            "SELECT on gateway_requests",
        ),
    ] {
        let (code, _, err) = run(program, args, url).await;
        assert_ne!(code, 0, "{program} {args:?} started without its grants");
        let group = match process {
            "gateway" => "producer",
            p => p,
        };
        for want in [
            format!("role \"{role}\" lacks "),
            lacks.to_owned(),
            format!(
                "(needed by the {process}); run \"oncely-worker migrate --roles\" and grant oncely_{group}"
            ),
        ] {
            assert!(
                err.contains(&want),
                "{program} {args:?}: want {want:?} in {err}"
            );
        }
    }

    // `--print` shows the SQL and changes nothing.
    let other = format!("{}_", unique_name("p"));
    let (code, out, err) = run(
        "oncely-worker",
        &["migrate", "--roles", "--role-prefix", &other, "--print"],
        &db.url,
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("-- oncely group roles")
            && out.contains(&format!("CREATE ROLE \"{other}worker\" NOLOGIN"))
            && out.contains(&format!(
                "GRANT DELETE ON TABLE \"public\".\"operation_events\" TO \"{other}admin\""
            ))
            && out.trim_end().ends_with("COMMIT;"),
        "{out}"
    );
    let created: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_roles WHERE starts_with(rolname, $1)")
            .bind(&other)
            .fetch_one(&db.pool)
            .await
            .expect("catalog");
    assert_eq!(created, 0, "--print created roles");

    // Again: harmless, and the grants still serve.
    let (code, out, err) = run(
        "oncely-worker",
        &["migrate", "--roles", "--role-prefix", &roles.prefix],
        &db.url,
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    let pool = sqlx::PgPool::connect(&worker_url).await.expect("connect");
    check_grants(&pool, Process::Worker, &db.url)
        .await
        .expect("the worker's grants after a second --roles");
    let _ = std::fs::remove_file(&tokens);
}

/// Through a gateway on the producer's login and broker user: a request with a client
/// `Idempotency-Key`, a long-poll until it is done, a repeat. Returns the key.
async fn through_the_gateway(fleet: &Fleet, logins: &Logins) -> String {
    let gw = Gateway::start_with_env(fleet, &[TOKEN_A], &logins.env(Role::Producer)).await;
    let mut client = gw.client(TOKEN_A.token).await;
    let body =
        json!({"workflow_id": "case-roles", "step": "open", "business_object": "via-gateway",
        "revision": 1, "payload": {"title": "from an agent"}})
        .to_string()
        .into_bytes();
    let header = [("idempotency-key", "ck-roles")];
    let path = "/v1/actions/ticket.create";
    let first = client.request("POST", path, &header, body.clone()).await;
    assert_eq!(first.status, 202, "{}", first.body);
    let key = first.body["key"].as_str().expect("key").to_owned();
    let done = client.action(&key, Some("60s")).await;
    assert_eq!(
        (done.status, done.body["status"].as_str()),
        (200, Some("succeeded")),
        "{}",
        done.body
    );
    let again = client.request("POST", path, &header, body).await;
    assert_eq!(again.status, 200, "{}", again.body);
    key
}

/// The processes really are on their own logins and broker users (the test's own
/// connections are the superuser's and guest's).
async fn assert_connected_as_their_own(fleet: &Fleet, roles: &DbRoles, broker: &PrivateBroker) {
    let db_users: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT usename::text FROM pg_stat_activity \
         WHERE datname = current_database() AND usename IS NOT NULL ORDER BY 1",
    )
    .fetch_all(&fleet.db.pool)
    .await
    .expect("pg_stat_activity");
    for role in ["worker", "reconciler", "producer"] {
        let login = format!("{}login_{role}", roles.prefix);
        assert!(db_users.contains(&login), "{login} not among {db_users:?}");
    }
    let broker_users = broker.connection_users().await;
    for user in ["oncely_worker", "oncely_reconciler", "oncely_producer"] {
        assert!(
            broker_users.iter().any(|u| u == user),
            "{user} not among {broker_users:?}"
        );
    }
}

/// The whole fleet on least privilege: the worker, the reconciler, the SDK producer, the
/// gateway and the admin each connect to Postgres as a login in their own group role and
/// (but the admin) to a private RabbitMQ node as a user limited to the fleet's prefix.
/// Tickets, an email whose outcome was unknown until the reconciler's lookup, a payment
/// only a person could settle, and a request through the gateway all end `succeeded`,
/// each at its first attempt with exactly one effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_least_privilege_fleet_executes_each_action_once() {
    let broker = PrivateBroker::start().await;
    let fleet = Fleet::with(FleetOptions {
        amqp_url: Some(broker.url()),
        timeout: "1s".into(),
        lease: "3s".into(),
        reconciler: Some(FAST_RECONCILER),
        ..FleetOptions::default()
    })
    .await;
    let roles = DbRoles::create(&fleet.db).await;
    let logins = Logins::create(&roles, Some(&broker), &fleet.prefix, &broker.url()).await;
    let email = Intent::from_json(
        json!({"action_type": "email.send", "workflow_id": "case-roles",
        "step": "notify", "business_object": "email-1", "revision": 1,
        "payload": {"to": "a@example.test", "subject": "hello"}}),
    )
    .expect("intent")
    .seal(&secret())
    .expect("seal");
    let pay = payment("pay-1", 125_000);
    // The email: accepted, then no answer (unknown; the reconciler's lookup finds it).
    // The payment: the same, with lookups off at the bank (a person decides).
    fleet
        .sandbox
        .control()
        .set_faults_json(&json!({"lookup_disabled": ["bank"], "rules": [
            {"provider": "mail", "mode": "accept_then_timeout", "key": email.key.as_str(), "times": 1, "hold_ms": 30000},
            {"provider": "bank", "mode": "accept_then_timeout", "key": pay.key.as_str(), "times": 1, "hold_ms": 30000}]}))
        .await
        .expect("faults");
    let _w = fleet.spawn_with_env(&["run"], &logins.env(Role::Worker));
    let _r = fleet.spawn_with_env(&["reconcile"], &logins.env(Role::Reconciler));
    let mut config = fleet.config.clone();
    config.database_url = logins.db[&Role::Producer].clone();
    config.broker.url = logins.amqp[&Role::Producer].clone();
    let producer = Producer::connect(&config, secret())
        .await
        .expect("the producer on its own login and user");

    let tickets: Vec<Envelope> = (0..10)
        .map(|n| {
            Intent::from_json(
                json!({"action_type": "ticket.create", "workflow_id": "case-roles",
                "step": "open", "business_object": format!("ticket-{n}"), "revision": 1,
                "payload": {"title": format!("ticket {n}")}}),
            )
            .expect("intent")
            .seal(&secret())
            .expect("seal")
        })
        .collect();
    let intents = tickets
        .iter()
        .chain([&email, &pay])
        .map(|e| e.intent.clone());
    let results = producer
        .enqueue_many(intents.collect())
        .await
        .expect("enqueue");
    assert!(
        results
            .iter()
            .all(|r| matches!(r, Ok(Enqueued::Enqueued { .. }))),
        "{results:?}"
    );

    // The email: unknown → a reconcile request → the lookup; the producer hears of it.
    let settled = producer
        .wait(&email.key, Duration::from_secs(60))
        .await
        .expect("wait as the producer")
        .expect("the email settled");
    assert_eq!(settled.status, Status::Succeeded);
    // The payment: a review the reconciler opened; the admin's login resolves it.
    eventually("the payment's review", DEADLINE, || async {
        let reviews = fleet
            .db
            .journal()
            .reviews_of(&pay.key)
            .await
            .expect("reviews");
        (!reviews.is_empty()).then_some(())
    })
    .await;
    let resolve = ["review", "resolve", pay.key.as_str(), "--as", "succeeded"];
    let by = ["--provider-operation-id", "po_statement", "--by", "alice"];
    let (code, out, err) = fleet
        .admin_with_env(
            &[&resolve[..], &by].concat(),
            &[("DATABASE_URL", &logins.db[&Role::Admin])],
        )
        .await;
    assert_eq!(code, 0, "{out}{err}");
    let via_gateway = through_the_gateway(&fleet, &logins).await;
    assert_connected_as_their_own(&fleet, &roles, &broker).await;

    // Everything once.
    let mut keys: Vec<IdempotencyKey> = tickets.iter().map(|e| e.key.clone()).collect();
    keys.extend([email.key.clone(), pay.key.clone()]);
    keys.push(IdempotencyKey::parse(&via_gateway).expect("key"));
    for key in &keys {
        let op = eventually(&format!("{key} to succeed"), DEADLINE, || async {
            fleet
                .op(key)
                .await
                .filter(|op| op.status == Status::Succeeded)
        })
        .await;
        assert_eq!(op.attempt_count, 1, "{key}");
        assert_eq!(fleet.sandbox.effects().count(key.as_str()), 1, "{key}");
    }
    let repeat = producer
        .enqueue(email.intent.clone())
        .await
        .expect("a repeat");
    assert!(
        matches!(
            repeat,
            Enqueued::Duplicate {
                status: Status::Succeeded,
                ..
            }
        ),
        "{repeat:?}"
    );
}

/// Publish one message as `url`'s user, with confirms: the broker's refusal as text.
async fn publish_as(url: &str, exchange: &str, routing_key: &str) -> Result<(), String> {
    let conn = oncely_core::topology::connect(&BrokerConfig::at(url), "oncely-test-permissions")
        .await
        .map_err(|e| e.to_string())?;
    let result = async {
        let ch = conn.create_channel().await?;
        ch.confirm_select(ConfirmSelectOptions::default()).await?;
        ch.basic_publish(
            exchange.into(),
            routing_key.into(),
            BasicPublishOptions::default(),
            b"{}",
            BasicProperties::default(),
        )
        .await?
        .await
    }
    .await;
    let _ = conn.close(200, "done".into()).await;
    result.map(drop).map_err(|e| e.to_string())
}

/// Start consuming `queue` as `url`'s user.
async fn consume_as(url: &str, queue: &str) -> Result<(), String> {
    let conn = oncely_core::topology::connect(&BrokerConfig::at(url), "oncely-test-permissions")
        .await
        .map_err(|e| e.to_string())?;
    let result = async {
        let ch = conn.create_channel().await?;
        ch.basic_consume(
            queue.into(),
            "oncely-test".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
    }
    .await;
    let _ = conn.close(200, "done".into()).await;
    result.map(drop).map_err(|e| e.to_string())
}

/// Declare `topology` (with one action type) as `url`'s user.
async fn declare_as(url: &str, topology: &Topology) -> Result<(), String> {
    let conn = oncely_core::topology::connect(&BrokerConfig::at(url), "oncely-test-permissions")
        .await
        .map_err(|e| e.to_string())?;
    let result = async {
        let ch = conn.create_channel().await?;
        topology.declare(&ch, &["ticket.create"]).await
    }
    .await;
    let _ = conn.close(200, "done".into()).await;
    result.map_err(|e| e.to_string())
}

/// `what`, done as a user, is refused by the broker (403 ACCESS_REFUSED).
fn access_refused(what: &str, r: Result<(), String>) {
    match r {
        Err(e) if e.contains("ACCESS_REFUSED") => {}
        other => panic!("{what}: expected ACCESS_REFUSED, got {other:?}"),
    }
}

/// The broker users `oncely-worker rabbitmq-permissions` describes, on a private node
/// with two fleets: a user reaches its own prefix only (no publish, declare or consume on
/// the other's, not even through the default exchange); the worker publishes outcomes
/// but no intents; the producer cannot consume the action queues (their payloads); and
/// on a new prefix only the worker's user creates the queues, the others re-declare them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_users_reach_only_their_prefix_and_their_part_of_it() {
    let broker = PrivateBroker::start().await;
    let topology = |prefix: &str| {
        Topology::new(&BrokerConfig {
            prefix: prefix.to_owned(),
            ..BrokerConfig::default()
        })
    };
    let (a, b) = (unique_name("a"), unique_name("b"));
    let (own, other) = (topology(&a), topology(&b));
    let mut users = HashMap::new();
    for role in [Role::Worker, Role::Reconciler, Role::Producer] {
        let p = rabbitmq::permissions(role, &a).expect("a broker user");
        let user = role.suffix();
        broker
            .add_user(user, "pw", &p.configure, &p.write, &p.read)
            .await;
        users.insert(role, broker.url_as(user, "pw"));
    }
    let (w, r, p) = (
        &users[&Role::Worker],
        &users[&Role::Reconciler],
        &users[&Role::Producer],
    );

    // A new prefix: the producer's and the reconciler's users cannot create its queues;
    // the worker's can; then they re-declare them.
    access_refused(
        "the producer creating the queues",
        declare_as(p, &own).await,
    );
    access_refused(
        "the reconciler creating the queues",
        declare_as(r, &own).await,
    );
    declare_as(w, &own)
        .await
        .expect("the worker creates the topology");
    for (who, url) in [("worker", w), ("reconciler", r), ("producer", p)] {
        declare_as(url, &own)
            .await
            .unwrap_or_else(|e| panic!("the {who} re-declares the topology: {e}"));
    }
    // The other fleet's topology, declared by the node's administrator, so "not found"
    // cannot pass for "refused".
    declare_as(&broker.url(), &other)
        .await
        .expect("the other fleet's topology");

    let other_actions = other.actions_exchange();
    for (who, url) in [("worker", w), ("reconciler", r), ("producer", p)] {
        access_refused(
            &format!("the {who} publishing to another prefix's actions"),
            publish_as(url, &other_actions, "ticket.create").await,
        );
        access_refused(
            &format!("the {who} publishing through the default exchange"),
            publish_as(url, "", &other.action_queue("ticket.create")).await,
        );
        access_refused(
            &format!("the {who} consuming another prefix's actions"),
            consume_as(url, &other.action_queue("ticket.create")).await,
        );
        access_refused(
            &format!("the {who} declaring another prefix's topology"),
            declare_as(url, &other).await,
        );
    }
    access_refused(
        "the worker publishing an intent",
        publish_as(w, &own.actions_exchange(), "ticket.create").await,
    );
    publish_as(w, &own.outcomes_exchange(), "ticket.create.succeeded")
        .await
        .expect("the worker publishes outcomes");
    publish_as(r, &own.actions_exchange(), "ticket.create")
        .await
        .expect("the reconciler republishes intents");
    publish_as(p, &own.actions_exchange(), "ticket.create")
        .await
        .expect("the producer publishes intents");
    for queue in [
        own.action_queue("ticket.create"),
        own.reconcile_queue(),
        own.dead_queue(),
    ] {
        access_refused(
            &format!("the producer consuming {queue}"),
            consume_as(p, &queue).await,
        );
    }
    consume_as(w, &own.action_queue("ticket.create"))
        .await
        .expect("the worker consumes its actions");
    consume_as(r, &own.reconcile_queue())
        .await
        .expect("the reconciler consumes reconcile requests");
}
