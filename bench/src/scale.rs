//! The journal at scale (`--journal-rows N`): a generator that fills a migrated journal with
//! N operations in realistic states and their events, and the sweeper's scans timed on a
//! journal (`EXPLAIN ANALYZE` of each scan's row selection, rolled back).
//!
//! The fill is set-based (`bench/sql/fill_journal.sql`, chunks of [`CHUNK`] operations per
//! statement and transaction). While it runs, the secondary indexes, the operations'
//! primary key and the foreign keys that depend on it are dropped, and the insert-events
//! trigger is off (the fill writes the events itself, one per transition); afterwards the
//! key and the indexes are created again from their own definitions, so the schema is
//! exactly the migrations' — checked by comparing `pg_indexes` and the constraints before
//! and after — and both tables are `VACUUM ANALYZE`d, as autovacuum would leave them.
//! (With the primary key kept, each insert went to a random leaf of a btree larger than
//! memory: the first 50M fill slowed from 25 s to 100–200 s per chunk past ~30 million.)

use serde::Serialize;
use sqlx::ConnectOptions as _;
use sqlx::{PgPool, Row};
use std::str::FromStr as _;
use std::time::Instant;

/// Operations per fill statement.
pub const CHUNK: u64 = 500_000;

/// The fill of one chunk (`$1..=$2` of `$3`; the newest `$4` may be live).
const FILL_SQL: &str = include_str!("../sql/fill_journal.sql");

/// Live operations among the newest: n mod 10,000 ≥ 9,950 (0.5 %) of the newest
/// `live_window(rows)` operations are live — 5,000 live operations for 1,000,000 or more.
pub fn live_window(rows: u64) -> u64 {
    rows.min(1_000_000)
}

/// What the fill did (or, for a journal filled earlier, what it holds).
#[derive(Debug, Clone, Serialize)]
pub struct Filled {
    /// The database, when the journal was filled by an earlier run (`--filled-journal`):
    /// then `events` is Postgres's estimate and `seconds` are zero.
    pub reused: Option<String>,
    /// Operations written.
    pub operations: u64,
    /// Events written.
    pub events: u64,
    /// Operations per status.
    pub by_status: Vec<(String, i64)>,
    /// Seconds: inserting, creating the indexes, `VACUUM ANALYZE`.
    pub seconds: [f64; 3],
    /// Bytes of each relation of the two tables, largest first.
    pub sizes: Vec<(String, i64)>,
}

/// Fill the (migrated, empty) journal at `url` with `rows` operations; `progress` hears
/// the operations written so far.
pub async fn fill(url: &str, rows: u64, progress: impl Fn(u64)) -> anyhow::Result<Filled> {
    // Each chunk runs for seconds by design: not a slow statement worth a log line.
    let options = sqlx::postgres::PgConnectOptions::from_str(url)?.disable_statement_logging();
    let pool = &sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await?;
    let existing: i64 = sqlx::query_scalar("SELECT count(*) FROM agent_operations")
        .fetch_one(pool)
        .await?;
    anyhow::ensure!(existing == 0, "the journal to fill is not empty");
    let indexes = secondary_indexes(pool).await?;
    let keys = key_constraints(pool).await?;
    let t0 = Instant::now();
    // Foreign keys first, then the primary key they depend on.
    for (table, name, _) in keys.iter().rev() {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "ALTER TABLE \"{table}\" DROP CONSTRAINT \"{name}\""
        )))
        .execute(pool)
        .await?;
    }
    for (name, _) in &indexes {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP INDEX \"{name}\"")))
            .execute(pool)
            .await?;
    }
    let live = live_window(rows) as i64;
    let mut events = 0u64;
    let mut lo = 1u64;
    while lo <= rows {
        let hi = (lo + CHUNK - 1).min(rows);
        let mut tx = pool.begin().await?;
        sqlx::query("ALTER TABLE agent_operations DISABLE TRIGGER agent_operations_insert_events")
            .execute(&mut *tx)
            .await?;
        let done = sqlx::query(FILL_SQL)
            .bind(lo as i64)
            .bind(hi as i64)
            .bind(rows as i64)
            .bind(live)
            .execute(&mut *tx)
            .await?;
        events += done.rows_affected();
        sqlx::query("ALTER TABLE agent_operations ENABLE TRIGGER agent_operations_insert_events")
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        progress(hi);
        lo = hi + 1;
    }
    let inserting = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    // The primary key first (it also proves the fill's keys unique), then what refers to
    // it, then the secondary indexes.
    let statements = keys
        .iter()
        .map(|(table, name, def)| {
            format!("ALTER TABLE \"{table}\" ADD CONSTRAINT \"{name}\" {def}")
        })
        .chain(indexes.iter().map(|(_, def)| def.clone()));
    for statement in statements {
        let mut conn = pool.acquire().await?;
        sqlx::raw_sql("SET maintenance_work_mem = '1GB'")
            .execute(&mut *conn)
            .await?;
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&mut *conn)
            .await?;
        sqlx::raw_sql("RESET maintenance_work_mem")
            .execute(&mut *conn)
            .await?;
    }
    let after = secondary_indexes(pool).await?;
    anyhow::ensure!(
        after == indexes,
        "the indexes after the fill differ from the migrations': {after:?} vs {indexes:?}"
    );
    let keys_after = key_constraints(pool).await?;
    anyhow::ensure!(
        keys_after == keys,
        "the keys after the fill differ from the migrations': {keys_after:?} vs {keys:?}"
    );
    let indexing = t1.elapsed().as_secs_f64();
    let t2 = Instant::now();
    for table in ["agent_operations", "operation_events"] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("VACUUM ANALYZE {table}")))
            .execute(pool)
            .await?;
    }
    let vacuuming = t2.elapsed().as_secs_f64();
    let by_status = sqlx::query_as(
        "SELECT status, count(*) FROM agent_operations GROUP BY status ORDER BY status",
    )
    .fetch_all(pool)
    .await?;
    Ok(Filled {
        reused: None,
        operations: rows,
        events,
        by_status,
        seconds: [inserting, indexing, vacuuming],
        sizes: sizes(pool).await?,
    })
}

/// What the journal at `url` — filled by an earlier `--journal-rows … --keep-journal` —
/// holds, and the first bench intent number no earlier run used there (the journal
/// refuses a second operation of one business identity, whatever its key). Scans the
/// table, before any run.
pub async fn describe(url: &str, name: &str) -> anyhow::Result<(Filled, usize)> {
    let options = sqlx::postgres::PgConnectOptions::from_str(url)?.disable_statement_logging();
    let pool = &sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await?;
    let by_status: Vec<(String, i64)> = sqlx::query_as(
        "SELECT status, count(*) FROM agent_operations GROUP BY status ORDER BY status",
    )
    .fetch_all(pool)
    .await?;
    anyhow::ensure!(!by_status.is_empty(), "the journal in {name} is empty");
    // The bench's intents are `application-N` (bench/src/intents.rs); the fill's `order-N`.
    let used: Option<i64> = sqlx::query_scalar(
        "SELECT max(substring(business_object FROM 13)::bigint) FROM agent_operations \
         WHERE business_object ~ '^application-[0-9]+$'",
    )
    .fetch_one(pool)
    .await?;
    let next = used.map_or(0, |m| m as usize + 1);
    let events: f32 = sqlx::query_scalar(
        "SELECT reltuples FROM pg_class WHERE oid = 'operation_events'::regclass",
    )
    .fetch_one(pool)
    .await?;
    let filled = Filled {
        reused: Some(name.to_owned()),
        operations: by_status.iter().map(|(_, n)| *n as u64).sum(),
        events: events.max(0.0) as u64,
        by_status,
        seconds: [0.0; 3],
        sizes: sizes(pool).await?,
    };
    Ok((filled, next))
}

/// `(table, name, definition)` of the operations' primary key, then of the foreign keys
/// that refer to it (sorted by name).
async fn key_constraints(pool: &PgPool) -> anyhow::Result<Vec<(String, String, String)>> {
    Ok(sqlx::query_as(
        "SELECT conrelid::regclass::text, conname::text, pg_get_constraintdef(oid) \
         FROM pg_constraint \
         WHERE (contype = 'p' AND conrelid = 'agent_operations'::regclass) \
            OR (contype = 'f' AND confrelid = 'agent_operations'::regclass) \
         ORDER BY contype = 'f', conname",
    )
    .fetch_all(pool)
    .await?)
}

/// `(name, definition)` of the journal tables' indexes that are not primary keys, sorted.
async fn secondary_indexes(pool: &PgPool) -> anyhow::Result<Vec<(String, String)>> {
    Ok(sqlx::query_as(
        "SELECT indexname::text, indexdef FROM pg_indexes \
         WHERE schemaname = current_schema() \
           AND tablename IN ('agent_operations', 'operation_events') \
           AND indexname NOT LIKE '%\\_pkey' ORDER BY indexname",
    )
    .fetch_all(pool)
    .await?)
}

/// Bytes of every table and index of the journal's two big tables, largest first.
pub async fn sizes(pool: &PgPool) -> anyhow::Result<Vec<(String, i64)>> {
    Ok(sqlx::query_as(
        "SELECT c.relname::text, pg_relation_size(c.oid) FROM pg_class c \
         JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'i') \
           AND (c.relname LIKE 'agent\\_operations%' OR c.relname LIKE 'operation\\_events%') \
         ORDER BY 2 DESC",
    )
    .fetch_all(pool)
    .await?)
}

/// Seconds a row must be untouched to be due, as the scans are timed: the republish
/// scan's `after` and the stale-unknown scan's `stale_after` (the worker's defaults are
/// longer; shorter here finds more candidates, not fewer).
const SCAN_SECONDS: [f64; 3] = [0.0, 5.0, 30.0];

/// Rows per scan, as the sweeper takes them.
const SCAN_LIMIT: i64 = 100;

/// The live operations' clocks as a running fleet keeps them: a `planned` row was just
/// recorded or republished, a lease, a not-before time and a check are ahead. The fill
/// dates live rows with their operation's age and nothing republishes them in the bench,
/// so without this every timed scan would find a backlog of overdue rows on the filled
/// journal and none on the empty one. Run before the scans on both journals alike (the
/// empty one has no live rows after a run). A `planned` row is stamped ten minutes ahead
/// of the clock: [`vacuum`] runs between this and the last scans and takes seconds on a
/// big journal, after which a row stamped `now()` would be due for republishing (the
/// bench's republish delay is 5 s) — a backlog on one journal and none on the other, the
/// very inequality this step exists to avoid. Returns the rows touched.
pub async fn steady_state(pool: &PgPool) -> anyhow::Result<u64> {
    Ok(sqlx::query(
        "UPDATE agent_operations SET \
             updated_at = CASE WHEN status = 'planned' THEN now() + interval '10 minutes' ELSE now() END, \
             lease_until = CASE WHEN status = 'planned' THEN lease_until ELSE now() + interval '1 hour' END \
         WHERE status IN ('planned', 'executing', 'failed_retryable', 'unknown')",
    )
    .execute(pool)
    .await?
    .rows_affected())
}

/// `VACUUM (INDEX_CLEANUP ON) agent_operations`: the scans timed after it find no dead
/// index entries, on an empty and on a filled journal alike. Without them the two are
/// not compared like with like: [`steady_state`] leaves one dead entry per live operation
/// of the filled journal, dated in the past (its clocks before the update), right where
/// the expired-leases and republish scans look, while the empty journal's dead entries
/// (one per action of the run) still lie ahead of those scans' cut-off (a 60-s lease, the
/// republish delay) when they are timed. `INDEX_CLEANUP ON` because a plain vacuum skips
/// the indexes when so few of a large table's pages have dead rows (Postgres 14+) —
/// which is also why autovacuum leaves such entries for long (docs/performance.md, "The
/// sweeper's scans between index cleanups"). Returns the seconds it took.
pub async fn vacuum(pool: &PgPool) -> anyhow::Result<f64> {
    let started = Instant::now();
    sqlx::raw_sql("VACUUM (INDEX_CLEANUP ON) agent_operations")
        .execute(pool)
        .await?;
    Ok(started.elapsed().as_secs_f64())
}

/// Copy the live operations (`planned`, `executing`, `failed_retryable`, `unknown`) of the
/// journal at `from` into the migrated, empty journal of `pool`, every column as it is
/// (`COPY`; the insert-events trigger writes their `recorded` events): a journal with the
/// same live work and none of the history, to time the scans against like with like.
/// Returns the rows copied.
pub async fn copy_live_rows(from: &str, pool: &PgPool) -> anyhow::Result<u64> {
    use futures_util::StreamExt as _;
    use sqlx::postgres::PgPoolCopyExt as _;
    let source = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(sqlx::postgres::PgConnectOptions::from_str(from)?.disable_statement_logging())
        .await?;
    let copied = {
        let mut rows = source
            .copy_out_raw(
                "COPY (SELECT * FROM agent_operations \
                 WHERE status IN ('planned', 'executing', 'failed_retryable', 'unknown')) TO STDOUT",
            )
            .await?;
        let mut sink = pool.copy_in_raw("COPY agent_operations FROM STDIN").await?;
        while let Some(chunk) = rows.next().await {
            sink.send(chunk?).await?;
        }
        sink.finish().await?
    };
    source.close().await;
    Ok(copied)
}

/// One scan's timing.
#[derive(Debug, Clone, Serialize)]
pub struct ScanTime {
    /// Which scan.
    pub scan: &'static str,
    /// Median execution time of [`REPEATS`] runs (ms, as `EXPLAIN ANALYZE` reports it).
    pub median_ms: f64,
    /// Buffers the median run touched (shared hit + read).
    pub buffers: i64,
    /// The first run's time (ms): it alone visits the table for entries no scan has read
    /// since their rows died, and marks them dead in the index for the runs after it.
    pub first_ms: f64,
    /// The plan's nodes, top down along the first child (`Limit > LockRows > …`).
    pub plan: String,
}

/// `CHECKPOINT` (superuser, or the `pg_checkpoint` role): each measured run then starts
/// right after one, not part-way into a checkpoint that the fill (or the previous run)
/// started — on an empty and on a filled journal alike. Whether it could, for the report.
pub async fn checkpoint(url: &str) -> bool {
    let Ok(options) = sqlx::postgres::PgConnectOptions::from_str(url) else {
        return false;
    };
    let Ok(mut conn) = options.connect().await else {
        return false;
    };
    let done = sqlx::raw_sql("CHECKPOINT").execute(&mut conn).await.is_ok();
    let _ = sqlx::Connection::close(conn).await;
    done
}

/// `--warm-indexes`: read every index of `agent_operations` once (`pg_prewarm(…, 'read')`:
/// into the operating system's cache, not into `shared_buffers`), as a journal that has been
/// running keeps them — each recording and claim touches a random leaf of the primary key
/// and of the identity index — where a freshly filled one has them on disk. Returns
/// `(index, MB, seconds)` per index; fails without the `pg_prewarm` extension (contrib) or
/// the right to create it.
pub async fn warm_indexes(url: &str) -> anyhow::Result<Vec<(String, f64, f64)>> {
    let options = sqlx::postgres::PgConnectOptions::from_str(url)?.disable_statement_logging();
    let mut conn = options.connect().await?;
    sqlx::raw_sql("CREATE EXTENSION IF NOT EXISTS pg_prewarm")
        .execute(&mut conn)
        .await?;
    let indexes: Vec<(String, i64)> = sqlx::query_as(
        "SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) FROM pg_index \
         WHERE indrelid = 'agent_operations'::regclass ORDER BY 1",
    )
    .fetch_all(&mut conn)
    .await?;
    let mut out = Vec::new();
    for (index, bytes) in indexes {
        let started = std::time::Instant::now();
        sqlx::query("SELECT pg_prewarm($1::regclass, 'read')")
            .bind(&index)
            .execute(&mut conn)
            .await?;
        out.push((index, bytes as f64 / 1e6, started.elapsed().as_secs_f64()));
    }
    let _ = sqlx::Connection::close(conn).await;
    Ok(out)
}

/// Runs per scan.
pub const REPEATS: usize = 7;

/// Time each sweeper scan on `pool`'s journal: `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)`
/// in a transaction that is rolled back (the row locks are released, nothing changes).
///
/// The first three are the scans of a full pass, the fourth the live gauges' count after
/// one; the last three the expired-leases and republish scans and the count of a pass
/// between full ones, which read only what became due within the default `sweep_interval`
/// and [`SINCE_OVERLAP`](oncely_core::journal::sweep::SINCE_OVERLAP) (`Since`).
pub async fn sweep_times(pool: &PgPool) -> anyhow::Result<Vec<ScanTime>> {
    use oncely_core::journal::sweep::{LIVE_STATUS_COUNTS, SCANS, SINCE_OVERLAP};
    let window = (oncely_core::config::ReconcilerConfig::DEFAULT.sweep_interval + SINCE_OVERLAP)
        .as_secs_f64();
    // (name, statement, its parameters: which scan's, the window).
    let all = [
        (SCANS[0].0, SCANS[0].1, 0, None),
        (SCANS[1].0, SCANS[1].1, 1, None),
        (SCANS[2].0, SCANS[2].1, 2, None),
        ("live gauges", LIVE_STATUS_COUNTS, 3, None),
        (
            "expired leases, since the last pass",
            SCANS[0].1,
            0,
            Some(window),
        ),
        (
            "republish, since the last pass",
            SCANS[1].1,
            1,
            Some(window),
        ),
        (
            "live gauges, since the last pass",
            LIVE_STATUS_COUNTS,
            3,
            Some(window),
        ),
    ];
    let after = oncely_core::config::ReconcilerConfig::DEFAULT
        .republish_after
        .as_secs_f64();
    let mut out = Vec::new();
    for (scan, sql, i, window) in all {
        let mut runs: Vec<(f64, i64, String)> = Vec::with_capacity(REPEATS);
        for _ in 0..REPEATS {
            let mut tx = pool.begin().await?;
            let explain = sqlx::query(sqlx::AssertSqlSafe(format!(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}"
            )));
            // Each scan's own parameters (see `SCANS`).
            let explain = match i {
                0 => explain.bind(SCAN_LIMIT).bind("bench").bind(window),
                1 => explain.bind(SCAN_SECONDS[i]).bind(SCAN_LIMIT).bind(window),
                2 => explain.bind(SCAN_SECONDS[i]).bind(0.0f64).bind(SCAN_LIMIT),
                _ => explain.bind(window.map(|w| w + after)).bind(window),
            };
            let row = explain.fetch_one(&mut *tx).await?;
            tx.rollback().await?;
            let plan: serde_json::Value = row.try_get(0)?;
            let top = &plan[0];
            let ms = top["Execution Time"].as_f64().unwrap_or(f64::NAN)
                + top["Planning Time"].as_f64().unwrap_or(0.0);
            let p = &top["Plan"];
            let buffers = p["Shared Hit Blocks"].as_i64().unwrap_or(0)
                + p["Shared Read Blocks"].as_i64().unwrap_or(0);
            runs.push((ms, buffers, plan_shape(p)));
        }
        let first_ms = runs[0].0;
        runs.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (median_ms, buffers, plan) = runs.swap_remove(REPEATS / 2);
        out.push(ScanTime {
            scan,
            median_ms,
            buffers,
            first_ms,
            plan,
        });
    }
    Ok(out)
}

/// `--dead-entries`: `n` operations that passed through `planned` and `executing` to
/// `succeeded` at `rate` per second, the last one now — what a fleet leaves in the
/// sweeper's indexes between two index cleanups (a dead entry per row version that left
/// `planned`, and one per version that left `executing`). Real transitions: recorded,
/// claimed under a 60-s lease and completed by three statements per chunk, with the event
/// triggers on; stamped as they would have been (`updated_at` of the recording, the
/// lease from the claim), so the dead entries sit where a running fleet leaves them.
pub async fn churn(url: &str, n: u64, rate: f64, progress: impl Fn(u64)) -> anyhow::Result<()> {
    use sqlx::Connection as _;
    // Its own connection, without the slow-statement log (each statement takes ~1 s).
    let mut conn = sqlx::postgres::PgConnectOptions::from_str(url)?
        .disable_statement_logging()
        .connect()
        .await?;
    // Op i (1..=n) was recorded (n - i) / rate seconds ago, claimed 10 ms after, completed
    // 150 ms after; keys of the real format.
    const KEY: &str = "'v1:' || encode(sha256(('oncely-churn:' || i)::bytea), 'hex')";
    let record = format!(
        "INSERT INTO agent_operations (idempotency_key, action_type, workflow_id, step, \
             business_object, revision, payload_hash, payload, status, attempt_count, \
             last_actor, last_reason, created_at, updated_at) \
         SELECT {KEY}, 'email.send', 'wf-' || i, 'notify', 'order-' || i, 1, \
             'sha256:' || encode(sha256(('payload:' || i)::bytea), 'hex'), \
             jsonb_build_object('to', 'customer-' || i || '@example.com', 'subject', 'Order ' || i), \
             'planned', 0, 'producer@churn', 'recorded', t, t \
         FROM (SELECT i, now() - make_interval(secs => ($3 - i)::float8 / $4) AS t \
               FROM generate_series($1::bigint, $2::bigint) AS i) s"
    );
    let claim = format!(
        "UPDATE agent_operations SET status = 'executing', attempt_count = 1, \
             first_attempt_at = created_at + interval '10 ms', lease_owner = 'worker@churn', \
             lease_until = created_at + interval '60 s', last_actor = 'worker@churn', \
             last_reason = 'claim', updated_at = created_at + interval '10 ms' \
         WHERE idempotency_key IN (SELECT {KEY} FROM generate_series($1::bigint, $2::bigint) AS i)"
    );
    let complete = format!(
        "UPDATE agent_operations SET status = 'succeeded', lease_owner = NULL, lease_until = NULL, \
             payload = NULL, provider_operation_id = 'prov-' || seq, \
             result_json = jsonb_build_object('id', 'prov-' || seq), \
             last_reason = 'provider_succeeded', updated_at = created_at + interval '150 ms' \
         WHERE idempotency_key IN (SELECT {KEY} FROM generate_series($1::bigint, $2::bigint) AS i)"
    );
    const STEP: u64 = 20_000;
    let mut lo = 1u64;
    while lo <= n {
        let hi = (lo + STEP - 1).min(n);
        let mut tx = conn.begin().await?;
        for sql in [&record, &claim, &complete] {
            let done = sqlx::query(sqlx::AssertSqlSafe(sql.as_str()))
                .bind(lo as i64)
                .bind(hi as i64)
                .bind(n as i64)
                .bind(rate)
                .execute(&mut *tx)
                .await?;
            anyhow::ensure!(
                done.rows_affected() == hi - lo + 1,
                "churn: {} of {} rows",
                done.rows_affected(),
                hi - lo + 1
            );
        }
        tx.commit().await?;
        progress(hi);
        lo = hi + 1;
    }
    sqlx::raw_sql("ANALYZE agent_operations")
        .execute(&mut conn)
        .await?;
    conn.close().await?;
    Ok(())
}

/// A plan's nodes, top down: `Limit > LockRows > Index Scan (index)`; a node with several
/// children lists them in brackets, `Append [A; B]`.
fn plan_shape(node: &serde_json::Value) -> String {
    let Some(kind) = node["Node Type"].as_str() else {
        return String::new();
    };
    let mut out = match node["Index Name"].as_str() {
        Some(index) => format!("{kind} ({index})"),
        None => kind.to_owned(),
    };
    let children: Vec<String> = node["Plans"]
        .as_array()
        .map(|c| c.iter().map(plan_shape).collect())
        .unwrap_or_default();
    match children.len() {
        0 => {}
        1 => out = format!("{out} > {}", children[0]),
        _ => out = format!("{out} [{}]", children.join("; ")),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_live_window_is_the_newest_million_at_most() {
        assert_eq!(live_window(20_000), 20_000);
        assert_eq!(live_window(50_000_000), 1_000_000);
    }
}
