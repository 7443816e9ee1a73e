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
