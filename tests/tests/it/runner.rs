//! The runner's commit path when the journal misbehaves: a commit that gives up must give
//! its deliveries back (or they hold prefetch slots until the channel dies), a late
//! definitive answer must survive a retryable journal error (not be acked as "stale"),
//! and a completion row that cannot be decoded must be an error, never a silent result.
//! Faults are injected with test-only triggers in the test's own database. Also: the
//! completion statement's one answer per item (on time, late, stale).

use oncely_core::journal::{
    Applied, ClaimOutcome, ClaimRequest, Completion, JournalError, Verdict,
};
use oncely_core::{Envelope, IdempotencyKey, Intent, Status};
use oncely_tests::fleet::{Fleet, secret};
use oncely_tests::{TestDb, eventually};
use serde_json::json;
use std::time::Duration;

/// Liveness deadline (not a speed target).
const DEADLINE: Duration = Duration::from_secs(30);

fn email(workflow: &str, n: usize) -> Intent {
    Intent::from_json(json!({
        "action_type": "email.send", "workflow_id": workflow, "step": "notify",
        "business_object": format!("obj-{n}"), "revision": 1,
        "payload": {"to": format!("user-{n}@example.test"), "subject": "s", "body": "b"}
    }))
    .expect("intent")
}

async fn status(fleet: &Fleet, key: &IdempotencyKey) -> Option<Status> {
    fleet
        .db
        .journal()
        .get(key)
        .await
        .ok()
        .flatten()
        .map(|op| op.status)
}

/// Every completion of workflow `refused` fails for good (a non-retryable error), so the
/// worker's commit gives up at once. Before the fix the two deliveries were neither acked
/// nor nacked: with a prefetch of 2 the worker then never received a third message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_that_gives_up_hands_its_deliveries_back() {
    let fleet = Fleet::new().await;
    sqlx::raw_sql(
        "CREATE FUNCTION test_refuse_commit() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN RAISE EXCEPTION 'commit refused by the test'; END $$; \
         CREATE TRIGGER test_refuse_commit BEFORE UPDATE ON agent_operations FOR EACH ROW \
         WHEN (OLD.status = 'executing' AND NEW.workflow_id = 'refused') \
         EXECUTE FUNCTION test_refuse_commit();",
    )
    .execute(&fleet.db.pool)
    .await
    .expect("trigger");
    let worker = fleet.spawn_with_env(&["run"], &[("ONCELY__WORKER__PREFETCH", "2")]);
    let producer = fleet.producer().await;
    let mut refused = Vec::new();
    for n in 0..2 {
        let env = producer.seal(email("refused", n)).expect("seal");
        producer
            .enqueue(email("refused", n))
            .await
            .expect("enqueue");
        refused.push(env.key);
    }
    eventually(
        "both refused calls to reach the provider",
        DEADLINE,
        || async { (fleet.sandbox.effects().total == 2).then_some(()) },
    )
    .await;

    let fine = producer.seal(email("fine", 9)).expect("seal").key;
    producer.enqueue(email("fine", 9)).await.expect("enqueue");
    eventually(
        "a third message to get a prefetch slot and succeed",
        DEADLINE,
        || async { (status(&fleet, &fine).await == Some(Status::Succeeded)).then_some(()) },
    )
    .await;
    // Handed back and redelivered, the refused ones were deduplicated by the claim.
    for key in &refused {
        assert_eq!(status(&fleet, key).await, Some(Status::Executing));
        assert_eq!(fleet.sandbox.effects().count(key.as_str()), 1, "{key}");
    }
    let log = worker.logs();
    assert!(log.contains("cannot commit outcomes"), "{log}");
}

/// A provider answers after the operation was moved to `unknown` (as the sweeper does
/// when a lease runs out): the answer is a late one for the same attempt and is accepted.
/// The first try to write it meets a retryable error (a serialization failure, once).
/// Before the fix the error was taken for "not applied": acked as a stale attempt, and
/// the operation stayed `unknown`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_answer_is_retried_through_a_journal_error_not_called_stale() {
    let fleet = Fleet::new().await;
    sqlx::raw_sql(
        "CREATE SEQUENCE test_once; \
         CREATE FUNCTION test_fail_once() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN IF nextval('test_once') = 1 THEN \
           RAISE EXCEPTION 'test: could not serialize' USING ERRCODE = '40001'; END IF; \
         RETURN NEW; END $$; \
         CREATE TRIGGER test_fail_once BEFORE UPDATE ON agent_operations FOR EACH ROW \
         WHEN (OLD.status = 'unknown' AND NEW.status = 'succeeded') \
         EXECUTE FUNCTION test_fail_once();",
    )
    .execute(&fleet.db.pool)
    .await
    .expect("trigger");
    let worker = fleet.worker();
    let producer = fleet.producer().await;
    let key = producer.seal(email("late", 1)).expect("seal").key;
    fleet
        .sandbox
        .control()
        .set_faults_json(
            &json!({"rules": [{"mode": "latency", "key": key.as_str(), "latency_ms": 3000}]}),
        )
        .await
        .expect("faults");
    producer.enqueue(email("late", 1)).await.expect("enqueue");
    eventually("the call to be under way", DEADLINE, || async {
        (status(&fleet, &key).await == Some(Status::Executing)).then_some(())
    })
    .await;
    // What the sweeper does to an expired lease, while the provider still holds the call.
    let moved = sqlx::query(
        "UPDATE agent_operations SET status = 'unknown', lease_until = now() + interval '1 hour', \
         lease_owner = NULL, last_actor = 'test', last_reason = 'lease_expired' \
         WHERE idempotency_key = $1 AND status = 'executing'",
    )
    .bind(key.as_str())
    .execute(&fleet.db.pool)
    .await
    .expect("to unknown")
    .rows_affected();
    assert_eq!(
        moved, 1,
        "the provider answered before the test moved the row"
    );

    eventually("the late answer to be accepted", DEADLINE, || async {
        (status(&fleet, &key).await == Some(Status::Succeeded)).then_some(())
    })
    .await;
    let events = fleet.db.journal().events(&key).await.expect("events");
    let last = events.last().expect("events");
    assert_eq!(
        (
            last.from_status.as_deref(),
            last.to_status.as_str(),
            last.reason.as_str()
        ),
        (Some("unknown"), "succeeded", "late_answer")
    );
    assert_eq!(
        events.iter().filter(|e| e.to_status == "succeeded").count(),
        1,
        "one event per transition"
    );
    let log = worker.logs();
    assert!(!log.contains("stale attempt"), "{log}");
}

/// A returned row that cannot be decoded (here: an operation without a creation time,
/// so its age is NULL) is an error the caller sees — before the fix it was quietly
/// counted as applied with age 0 (and an unreadable key as "not applied").
#[tokio::test]
async fn a_completion_row_that_does_not_decode_is_an_error() {
    let db = TestDb::new().await;
    let j = db.journal();
    let env: Envelope = email("decode", 1).seal(&secret()).expect("seal");
    j.record(&env, "producer").await.expect("record");
    let claim = j
        .claim(
            &[ClaimRequest {
                envelope: &env,
                lease: Duration::from_secs(60),
            }],
            "w1",
        )
        .await
        .expect("claim")
        .remove(0);
    let ClaimOutcome::Claimed(claim) = claim else {
        panic!("claimed: {claim:?}")
    };
    sqlx::raw_sql(
        "ALTER TABLE agent_operations ALTER COLUMN created_at DROP NOT NULL; \
         UPDATE agent_operations SET created_at = NULL;",
    )
    .execute(&db.pool)
    .await
    .expect("break the row");
    let done = Completion {
        key: env.key.clone(),
        expected: Status::Executing,
        attempt: claim.attempt,
        verdict: Verdict::Succeeded {
            provider_operation_id: "po_1".into(),
            result: json!({}),
        },
        reason: "provider_succeeded".into(),
    };
    let result = j.complete(&done, "w1").await;
    assert!(
        matches!(result, Err(JournalError::Database(_))),
        "a row that does not decode is an error, got {result:?}"
    );
}

/// One statement, one answer per item: on time from `executing`, late from `unknown`
/// at the same attempt (definitive answers only), stale otherwise; one event per move.
#[tokio::test]
async fn one_completion_statement_answers_on_time_late_or_stale_per_item() {
    let db = TestDb::new().await;
    let j = db.journal();
    let envs: Vec<Envelope> = (0..4)
        .map(|n| email("batch", n).seal(&secret()).expect("seal"))
        .collect();
    for env in &envs {
        j.record(env, "producer").await.expect("record");
    }
    let requests: Vec<ClaimRequest<'_>> = envs
        .iter()
        .map(|envelope| ClaimRequest {
            envelope,
            lease: Duration::from_secs(60),
        })
        .collect();
    let claims = j.claim(&requests, "w1").await.expect("claim");
    assert!(claims.iter().all(|c| matches!(c, ClaimOutcome::Claimed(_))));
    // 1 and 3 were moved to unknown meanwhile, as the sweeper does.
    sqlx::query(
        "UPDATE agent_operations SET status = 'unknown', lease_until = now(), lease_owner = NULL, \
         last_actor = 'test', last_reason = 'lease_expired' WHERE idempotency_key = ANY($1)",
    )
    .bind(vec![envs[1].key.as_str(), envs[3].key.as_str()])
    .execute(&db.pool)
    .await
    .expect("to unknown");
    let complete = |env: &Envelope, attempt, verdict| Completion {
        key: env.key.clone(),
        expected: Status::Executing,
        attempt,
        verdict,
        reason: "provider_succeeded".into(),
    };
    let ok = || Verdict::Succeeded {
        provider_operation_id: "po".into(),
        result: json!({}),
    };
    let maybe = Verdict::Unknown {
        error_code: "timeout".into(),
        check_in: Duration::ZERO,
    };
    let applied = j
        .complete_batch(
            &[
                complete(&envs[0], 1, ok()),
                complete(&envs[1], 1, ok()),
                complete(&envs[2], 2, ok()),
                complete(&envs[3], 1, maybe),
            ],
            "w1",
        )
        .await
        .expect("complete");
    assert!(
        matches!(
            applied.as_slice(),
            [
                Applied::OnTime { .. },
                Applied::Late { .. },
                Applied::Stale,
                Applied::Stale
            ]
        ),
        "{applied:?}"
    );
    let last = |events: Vec<oncely_core::journal::Event>| {
        let e = events.last().expect("events").clone();
        (e.from_status, e.to_status, e.reason)
    };
    let s = |v: &str| v.to_owned();
    assert_eq!(
        last(j.events(&envs[0].key).await.expect("events")),
        (
            Some(s("executing")),
            s("succeeded"),
            s("provider_succeeded")
        )
    );
    assert_eq!(
        last(j.events(&envs[1].key).await.expect("events")),
        (Some(s("unknown")), s("succeeded"), s("late_answer"))
    );
    // Stale: no event (recorded, claimed; and for 3 the move to unknown).
    for (env, events) in [(&envs[2], 2), (&envs[3], 3)] {
        let got = j.events(&env.key).await.expect("events");
        assert_eq!(got.len(), events, "{got:?}");
    }
}
