//! The journal floor (`oncely-bench`'s "journal floor" row) on a fresh, migrated
//! database: every envelope goes through the fleet's own three statements — recorded,
//! claimed, completed — with one event row per transition, and a second pass over the
//! same envelopes fails (they are settled: nothing is claimed twice).

use oncely_bench::intents::Workload;
use oncely_bench::journal;
use oncely_core::KeyRing;
use oncely_tests::TestDb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_floor_records_claims_and_completes_every_envelope_once() {
    let db = TestDb::new().await;
    let secret = KeyRing::new(b"journal-floor-test-secret".to_vec()).expect("a key ring");
    let n = 150; // three tasks, batches of 64: full and partial batches
    let envelopes = Workload::natural()
        .envelopes(n, &secret)
        .expect("envelopes");
    let result = journal::run_batched(&db.url, &envelopes, 3, 64)
        .await
        .expect("the floor runs");
    assert_eq!((result.actions, result.tasks), (n, 3));
    assert!(result.actions_per_s > 0.0);
    let succeeded: i64 =
        sqlx::query_scalar("SELECT count(*) FROM agent_operations WHERE status = 'succeeded'")
            .fetch_one(&db.pool)
            .await
            .expect("count");
    assert_eq!(succeeded, n as i64);
    // recorded (planned), claimed (executing), completed (succeeded): three events each.
    let events: Vec<(String, i64)> = sqlx::query_as(
        "SELECT to_status, count(*) FROM operation_events GROUP BY to_status ORDER BY to_status",
    )
    .fetch_all(&db.pool)
    .await
    .expect("events");
    assert_eq!(
        events,
        vec![
            ("executing".to_owned(), n as i64),
            ("planned".to_owned(), n as i64),
            ("succeeded".to_owned(), n as i64)
        ]
    );
    let again = journal::run_batched(&db.url, &envelopes, 3, 64).await;
    let err = again.expect_err("settled operations are not claimed again");
    assert!(err.to_string().contains("was not claimed"), "{err:#}");
}

/// `--floor-parts`: each variant's statements apply to the schema as migrated (an index or
/// trigger renamed by a later migration fails here), and the floor runs on the result;
/// without the events triggers it writes no events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_schema_part_can_be_removed_and_the_floor_still_runs() {
    let secret = KeyRing::new(b"journal-floor-test-secret".to_vec()).expect("a key ring");
    let envelopes = Workload::natural()
        .envelopes(70, &secret)
        .expect("envelopes");
    for part in journal::SchemaPart::ALL {
        let db = TestDb::new().await;
        for statement in part.removes() {
            sqlx::raw_sql(*statement)
                .execute(&db.pool)
                .await
                .unwrap_or_else(|e| panic!("{}: {statement}: {e}", part.label()));
        }
        let result = journal::run_batched(&db.url, &envelopes, 2, 64)
            .await
            .unwrap_or_else(|e| panic!("{}: {e:#}", part.label()));
        assert_eq!(result.actions, 70, "{}", part.label());
        let events: i64 = sqlx::query_scalar("SELECT count(*) FROM operation_events")
            .fetch_one(&db.pool)
            .await
            .expect("count events");
        let without_events = matches!(
            part,
            journal::SchemaPart::NoEvents | journal::SchemaPart::NoneOfThem
        );
        assert_eq!(
            events,
            if without_events { 0 } else { 3 * 70 },
            "{}",
            part.label()
        );
    }
}
