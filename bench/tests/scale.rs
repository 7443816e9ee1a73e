//! The journal-at-scale generator (`oncely-bench --journal-rows`) on a fresh, migrated
//! database: every row it writes passes the journal's CHECK constraints (the insert would
//! fail otherwise), the state mix and the events are what bench/sql/fill_journal.sql
//! says, the indexes are the migrations' again afterwards (checked by `fill` itself), and
//! the sweeper's scans run on the result.

use oncely_bench::scale;
use oncely_tests::TestDb;
use std::collections::BTreeMap;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filled_journal_has_the_documented_mix_and_passes_the_schema() {
    let db = TestDb::new().await;
    let rows = 2 * scale::CHUNK / 25; // 40,000: more than one 10,000-cycle of the mix
    let filled = scale::fill(&db.url, rows, |_| {}).await.expect("fill");
    let by: BTreeMap<String, i64> = filled.by_status.iter().cloned().collect();
    assert_eq!(by.values().sum::<i64>(), rows as i64, "{by:?}");
    // n mod 10,000: < 9,700 succeeded, < 9,950 failed_final, the rest live (all within
    // the live window at this size), split over the four live states by n mod 4.
    let cycles = rows as i64 / 10_000;
    assert_eq!(by["failed_final"], 250 * cycles, "{by:?}");
    let live: i64 = ["planned", "executing", "failed_retryable", "unknown"]
        .iter()
        .map(|s| by.get(*s).copied().unwrap_or(0))
        .sum();
    assert_eq!(live, 50 * cycles, "{by:?}");
    for s in ["planned", "executing", "failed_retryable", "unknown"] {
        assert!(by.get(s).copied().unwrap_or(0) > 0, "no {s}: {by:?}");
    }
    assert_eq!(by["succeeded"], rows as i64 - 250 * cycles - live);
    // One event per transition: planned 1, executing 2, every other state 3.
    let expected = 3 * rows as i64 - 2 * by["planned"] - by["executing"];
    assert_eq!(filled.events as i64, expected);
    let in_table: i64 = sqlx::query_scalar("SELECT count(*) FROM operation_events")
        .fetch_one(&db.pool)
        .await
        .expect("count events");
    assert_eq!(in_table, expected);
    // A planned operation's trail is its one recorded event.
    let journal = db.journal();
    let key: String = sqlx::query_scalar(
        "SELECT idempotency_key FROM agent_operations WHERE status = 'planned' LIMIT 1",
    )
    .fetch_one(&db.pool)
    .await
    .expect("a planned operation");
    let trail = journal
        .events(&oncely_core::IdempotencyKey::parse(&key).expect("a valid key"))
        .await
        .expect("events");
    assert_eq!(trail.len(), 1, "{trail:?}");
    let triggers: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_trigger WHERE tgname = 'agent_operations_insert_events' AND tgenabled = 'O'",
    )
    .fetch_one(&db.pool)
    .await
    .expect("trigger state");
    assert_eq!(triggers, 1, "the insert-events trigger is enabled again");
    // The primary key the fill dropped is back and holds: a second row of a key is refused.
    let again = sqlx::query(
        "INSERT INTO agent_operations OVERRIDING USER VALUE SELECT * FROM agent_operations LIMIT 1",
    )
    .execute(&db.pool)
    .await
    .expect_err("a duplicate key");
    assert_eq!(
        again.as_database_error().and_then(|e| e.code()).as_deref(),
        Some("23505"),
        "{again}"
    );
    // And so are the foreign keys that refer to it (a review of an unknown key is refused).
    let orphan = sqlx::query(
        "INSERT INTO operation_reviews (idempotency_key, reason, opened_by) \
         VALUES ('v1:' || repeat('0', 64), 'test', 'test')",
    )
    .execute(&db.pool)
    .await
    .expect_err("a review of no operation");
    assert_eq!(
        orphan.as_database_error().and_then(|e| e.code()).as_deref(),
        Some("23503"),
        "{orphan}"
    );
    // The fill dates live rows with their operation's age: the planned ones are overdue
    // for republishing until the steady state is set, and the scan takes them in order.
    let overdue = journal
        .take_for_republish(std::time::Duration::from_secs(5), 10, None)
        .await
        .expect("republish scan")
        .operations;
    assert_eq!(overdue.len(), 10, "{overdue:?}");
    assert!(
        overdue
            .iter()
            .all(|op| op.status == oncely_core::Status::Planned)
    );
    let touched = scale::steady_state(&db.pool).await.expect("steady state");
    assert_eq!(touched as i64, live);
    let none = journal
        .take_for_republish(std::time::Duration::from_secs(5), 10, None)
        .await
        .expect("republish scan")
        .operations;
    assert!(
        none.is_empty(),
        "nothing overdue in the steady state: {none:?}"
    );
    drop(journal);
    let scans = scale::sweep_times(&db.pool).await.expect("scans");
    assert_eq!(scans.len(), 7);
    assert!(scans.iter().all(|s| s.median_ms.is_finite()), "{scans:?}");
    let republish = &scans[1];
    assert_eq!(republish.scan, "republish");
    assert!(
        republish.plan.contains("agent_operations_planned_idx"),
        "the republish scan reads the planned rows' own index: {republish:?}"
    );
    let gauges = &scans[3];
    assert_eq!(gauges.scan, "live gauges");
    assert!(
        gauges.plan.contains("agent_operations_planned_idx")
            && gauges.plan.contains("agent_operations_clocks_idx")
            && !gauges.plan.contains("Seq Scan"),
        "the live gauges count on the live rows' indexes only: {gauges:?}"
    );

    // The live rows alone (`[after VACUUM, N live rows alone]`): a new journal gets exactly
    // the filled one's live operations, column for column, and nothing else.
    let alone = TestDb::new().await;
    let copied = scale::copy_live_rows(&db.url, &alone.pool)
        .await
        .expect("copy the live rows");
    assert_eq!(copied, live as u64);
    let source_live: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM agent_operations WHERE status IN ('planned', 'executing', 'failed_retryable', 'unknown')",
    )
    .fetch_one(&db.pool)
    .await
    .expect("count the source's live rows");
    let here: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT idempotency_key, status, seq FROM agent_operations ORDER BY seq")
            .fetch_all(&alone.pool)
            .await
            .expect("read the copy");
    assert_eq!(here.len() as i64, source_live);
    let there: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT idempotency_key, status, seq FROM agent_operations \
         WHERE status IN ('planned', 'executing', 'failed_retryable', 'unknown') ORDER BY seq",
    )
    .fetch_all(&db.pool)
    .await
    .expect("read the source");
    assert_eq!(here, there, "the same rows, keys, states and numbers");

    // --warm-indexes reads every index of the operations, each as large as Postgres says.
    let warmed = scale::warm_indexes(&db.url).await.expect("warm indexes");
    let names: Vec<&str> = warmed.iter().map(|(n, _, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "agent_operations_clocks_idx",
            "agent_operations_deferred_since_idx",
            "agent_operations_expiry_idx",
            "agent_operations_held_idx",
            "agent_operations_identity_idx",
            "agent_operations_pkey",
            "agent_operations_planned_idx",
            "agent_operations_subject_idx"
        ]
    );
    assert!(warmed.iter().all(|(_, mb, _)| *mb > 0.0), "{warmed:?}");
}

/// `--dead-entries`: the churn leaves the operations `succeeded` with their three events,
/// and a scan of a full pass walks their dead entries while one between full passes reads
/// only the window's (buffers, not times: a count that does not depend on the machine).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churned_operations_leave_dead_entries_that_only_a_full_pass_walks() {
    let db = TestDb::new().await;
    // 40,000 at 100/s: recorded over the last 400 s, the bounded window holds ~35 s of them.
    scale::churn(&db.url, 40_000, 100.0, |_| {})
        .await
        .expect("churn");
    let by: Vec<(String, i64)> =
        sqlx::query_as("SELECT status, count(*) FROM agent_operations GROUP BY 1")
            .fetch_all(&db.pool)
            .await
            .expect("count");
    assert_eq!(by, [("succeeded".to_owned(), 40_000)]);
    let events: i64 = sqlx::query_scalar("SELECT count(*) FROM operation_events")
        .fetch_one(&db.pool)
        .await
        .expect("events");
    assert_eq!(events, 3 * 40_000);
    let scans = scale::sweep_times(&db.pool).await.expect("scans");
    let by_name = |name: &str| {
        scans
            .iter()
            .find(|s| s.scan == name)
            .unwrap_or_else(|| panic!("no scan {name}: {scans:?}"))
    };
    for (full, bounded) in [
        ("expired leases", "expired leases, since the last pass"),
        ("republish", "republish, since the last pass"),
        ("live gauges", "live gauges, since the last pass"),
    ] {
        let (full, bounded) = (by_name(full), by_name(bounded));
        // A third at most (measured: live gauges 399 vs 94 buffers before the control
        // columns of 20261215000000, 353 vs 96 after; expired leases 194 vs 29, republish
        // 113 vs 15).
        assert!(
            bounded.buffers * 3 < full.buffers,
            "a bounded pass reads a fraction of a full one's entries: {full:?} vs {bounded:?}"
        );
        assert_eq!(
            full.plan, bounded.plan,
            "the same index, only a narrower range"
        );
    }

    // `--journal-rows`' [after VACUUM] rows: the index cleanup removes those dead entries,
    // and a full pass's scans read a fraction of what they read before it.
    let seconds = scale::vacuum(&db.pool).await.expect("vacuum");
    assert!(seconds.is_finite() && seconds >= 0.0);
    let after = scale::sweep_times(&db.pool)
        .await
        .expect("scans after vacuum");
    for name in ["expired leases", "republish"] {
        let (before, after) = (by_name(name), after.iter().find(|s| s.scan == name));
        let after = after.unwrap_or_else(|| panic!("no scan {name} after vacuum: {after:?}"));
        assert!(
            after.buffers * 4 < before.buffers,
            "{name}: no dead entries left to walk after the vacuum: {before:?} vs {after:?}"
        );
    }
}
