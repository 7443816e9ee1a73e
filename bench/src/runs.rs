//! The runs behind flags: the journal at scale (`--journal-rows`), throttled providers
//! (`--throttled`), the floor's parts (`--floor-parts`), dead entries (`--dead-entries`),
//! and the scale table they print.

use super::*;

/// `--journal-rows N`: the end-to-end runs (full load, then paced at 50 % of it) and the
/// sweeper's scans, on an empty journal and on one filled with `rows` operations; one
/// table with the ratios (filled ÷ empty).
pub(crate) async fn journal_at_scale(args: &BenchArgs, env: FleetEnv) -> anyhow::Result<()> {
    let machine = sys::Machine::read();
    let s = args.settings();
    let n = s.intents;
    let spec = FleetSpec {
        workers: s.fleet,
        latency_ms: 0,
        pace: None,
        paced_percent: None,
        in_flight: None,
        gateway: false,
        vacuumed_sweeps: false,
    };
    let mut seq = 0usize;
    let mut checkpoints = Vec::new();
    let mut pair = async |env: &FleetEnv, what: &str| -> anyhow::Result<[FleetResult; 2]> {
        seq += 1;
        checkpoints.push(scale::checkpoint(&args.database_url).await);
        eprintln!("{what}: full load, {n} intents, {} workers", s.fleet);
        let full = fleet::run(env, spec, seq).await?;
        eprintln!("      {:.0} actions/s", full.actions_per_s);
        seq += 1;
        let rate = args.paced_at.unwrap_or(full.actions_per_s / 2.0);
        checkpoints.push(scale::checkpoint(&args.database_url).await);
        eprintln!("{what}: paced at {rate:.0}/s");
        // Other intents than the full-load run's: both may run on one journal.
        let env = FleetEnv {
            first_intent: env.first_intent + n,
            ..env.clone()
        };
        let half = fleet::run(
            &env,
            FleetSpec {
                pace: Some(rate),
                paced_percent: args.paced_at.is_none().then_some(50),
                vacuumed_sweeps: true,
                ..spec
            },
            seq,
        )
        .await?;
        eprintln!("      p50 / p99 {:.1} / {:.1} ms", half.p50_ms, half.p99_ms);
        Ok([full, half])
    };
    let empty = pair(&env, "empty journal").await?;

    if let Some(db_name) = &args.filled_journal {
        let url = database_url(&args.database_url, db_name);
        eprintln!("reading what {db_name} holds");
        let (filled, next) = scale::describe(&url, db_name).await?;
        let env = FleetEnv {
            journal_db: Some(db_name.clone()),
            first_intent: next,
            ..env.clone()
        };
        let rows = filled.operations;
        warm(args, &url).await?;
        let runs = pair(&env, &format!("journal of {rows} operations")).await?;
        let live_only = live_only(args, &env.run_id, &url).await?;
        let full = FilledRuns { runs, live_only };
        return print_scale(args, &machine, n, &filled, &empty, &full, &checkpoints);
    }
    let rows = args.journal_rows.unwrap_or_default();
    let db_name = format!("oncely_bench_{}_scale", env.run_id);
    let (filled, full) = scratch_database(args, &db_name, args.keep_journal, async |url, pool| {
        eprintln!(
            "filling {db_name} with {rows} operations ({} per statement)",
            scale::CHUNK
        );
        let started = std::time::Instant::now();
        pool.close().await;
        let filled = scale::fill(&url, rows, |done| {
            eprintln!(
                "      {done} of {rows} ({:.0} s)",
                started.elapsed().as_secs_f64()
            )
        })
        .await?;
        let env = FleetEnv {
            journal_db: Some(db_name.clone()),
            ..env.clone()
        };
        warm(args, &url).await?;
        let runs = pair(&env, &format!("journal of {rows} operations")).await?;
        let live_only = live_only(args, &env.run_id, &url).await?;
        anyhow::Ok((filled, FilledRuns { runs, live_only }))
    })
    .await?;
    print_scale(args, &machine, n, &filled, &empty, &full, &checkpoints)
}

/// The filled journal's two runs, and the scans on a journal of its live operations alone.
pub(crate) struct FilledRuns {
    runs: [FleetResult; 2],
    live_only: LiveOnly,
}

/// The scans after `VACUUM` on a new journal holding only the filled one's live operations
/// (copied): the same live work without the history, the like-with-like baseline for
/// scans whose cost follows the live rows (the gauges count them; an empty journal has none).
#[derive(Debug, serde::Serialize)]
pub(crate) struct LiveOnly {
    /// Live operations copied.
    rows: u64,
    /// The scans, after `steady_state` and `VACUUM (INDEX_CLEANUP ON)`, as on the others.
    scans: Vec<scale::ScanTime>,
}

/// [`LiveOnly`] for the filled journal at `filled_url` (a scratch database, dropped after).
pub(crate) async fn live_only(
    args: &BenchArgs,
    run_id: &str,
    filled_url: &str,
) -> anyhow::Result<LiveOnly> {
    let db_name = format!("oncely_bench_{run_id}_live");
    scratch_database(args, &db_name, false, async |_url, pool| {
        let rows = scale::copy_live_rows(filled_url, &pool).await?;
        eprintln!("its {rows} live operations alone, copied into {db_name}: the scans");
        scale::steady_state(&pool).await?;
        scale::vacuum(&pool).await?;
        let scans = scale::sweep_times(&pool).await?;
        pool.close().await;
        anyhow::Ok(LiveOnly { rows, scans })
    })
    .await
}

/// A new, migrated database `name` on the bench's server for `f` (its URL, a pool of two
/// connections), registered for the clean-up on Ctrl-C meanwhile, and dropped afterwards
/// — also when `f` fails — unless `keep` (`--keep-journal`: its name is printed).
pub(crate) async fn scratch_database<T>(
    args: &BenchArgs,
    name: &str,
    keep: bool,
    f: impl AsyncFnOnce(String, sqlx::PgPool) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    sys::registry(|r| r.databases.push(name.to_owned()));
    let url = database_url(&args.database_url, name);
    let result = async {
        let pool = db::prepare(
            &url,
            &db::PoolSettings {
                max_connections: 2,
                ..db::PoolSettings::default()
            },
        )
        .await?;
        f(url.clone(), pool).await
    }
    .await;
    if keep {
        eprintln!("kept the filled journal: database {name} (--keep-journal; drop it yourself)");
    } else if let Err(e) = drop_database(&args.database_url, name).await {
        eprintln!("warning: could not drop database {name}: {e}");
    }
    sys::registry(|r| r.databases.retain(|d| d != name));
    result
}

/// `--floor-parts`: the journal floor with parts of the schema removed, in turn.
/// `--throttled N`: the rate-limited provider's table ([`throttle`]).
pub(crate) async fn throttled(args: &BenchArgs, n: u64) -> anyhow::Result<()> {
    let s = args.settings();
    let machine = sys::Machine::read();
    let run_id = format!("{}_{}", std::process::id(), chrono::Utc::now().timestamp());
    let worker_bin = worker_binary()?;
    let env = FleetEnv {
        server_url: args.database_url.clone(),
        amqp_url: args.amqp_url.clone(),
        amqp_urls: args.amqp_urls.clone(),
        concurrency: s.concurrency,
        workload: Workload::natural(),
        intents: usize::try_from(n)?,
        secret: format!("oncely-bench-secret-{run_id}"),
        gateway_bin: worker_bin.with_file_name("oncely-gateway"),
        worker_bin,
        run_id,
        journal_db: None,
        first_intent: 0,
        time_sweeps: false,
        linger: std::time::Duration::from_millis(args.linger_ms),
        outcome_events: !args.no_outcome_events,
        agents: args.agents.into(),
        worker_batch: args.worker_batch,
        worker_in_flight: args.worker_in_flight,
        provider_http2: args.provider_http2,
    };
    let spec = throttle::ThrottledSpec {
        intents: env.intents,
        limit: args.throttle_limit,
        workers: s.workers.clone(),
    };
    let rows = throttle::run(&env, &spec).await;
    let rows = match rows {
        Ok(rows) => rows,
        Err(e) => {
            cleanup_all(&args.database_url, &args.amqp_url).await;
            return Err(e);
        }
    };
    println!("oncely-bench — a burst to a rate-limited provider");
    println!(
        "command:  {}",
        std::env::args().collect::<Vec<_>>().join(" ")
    );
    println!("machine:  {}", machine.describe());
    throttle::print(&rows);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    }
    Ok(())
}

pub(crate) async fn floor_parts(args: &BenchArgs, rounds: u32) -> anyhow::Result<()> {
    use std::fmt::Write as _;
    let s = args.settings();
    let machine = sys::Machine::read();
    let run_id = format!("{}_{}", std::process::id(), chrono::Utc::now().timestamp());
    let secret = KeyRing::new(format!("oncely-bench-secret-{run_id}").into_bytes())?;
    let envelopes = Workload::natural().envelopes(s.intents, &secret)?;
    let (tasks, batch) = (2 * s.fleet, usize::from(s.concurrency));
    let mut runs: Vec<(journal::SchemaPart, journal::JournalResult)> = Vec::new();
    for round in 1..=rounds.max(1) {
        for part in journal::SchemaPart::ALL {
            let name = format!("oncely_bench_{run_id}_floor");
            let result = scratch_database(args, &name, false, async |url, pool| {
                for statement in part.removes() {
                    sqlx::raw_sql(*statement).execute(&pool).await?;
                }
                pool.close().await;
                journal::run_batched(&url, &envelopes, tasks, batch).await
            })
            .await?;
            eprintln!(
                "[{round}/{rounds}] {}: {:.0} actions/s, Postgres {:.3} ms per action",
                part.label(),
                result.actions_per_s,
                result.cpu.postgres * 1000.0 / result.actions_per_s
            );
            runs.push((part, result));
        }
    }
    let mut t = String::new();
    writeln!(t, "oncely-bench — the journal floor by schema part")?;
    writeln!(
        t,
        "command:  {}",
        std::env::args().collect::<Vec<_>>().join(" ")
    )?;
    writeln!(t, "machine:  {}", machine.describe())?;
    writeln!(
        t,
        "workload: {} operations per run, {batch} per statement, {tasks} connections, {rounds} rounds (the parts in turn)\n",
        s.intents
    )?;
    writeln!(
        t,
        "{:<44} {:>22} {:>28} {:>16}",
        "schema", "Postgres ms/action", "median − as migrated (ms)", "actions/s"
    )?;
    let per = |r: &journal::JournalResult| r.cpu.postgres * 1000.0 / r.actions_per_s;
    let median = |part: journal::SchemaPart| {
        let mut v: Vec<f64> = runs
            .iter()
            .filter(|(p, _)| *p == part)
            .map(|(_, r)| per(r))
            .collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let base = median(journal::SchemaPart::AsMigrated);
    for part in journal::SchemaPart::ALL {
        let figures: Vec<String> = runs
            .iter()
            .filter(|(p, _)| *p == part)
            .map(|(_, r)| format!("{:.3}", per(r)))
            .collect();
        let rates: Vec<String> = runs
            .iter()
            .filter(|(p, _)| *p == part)
            .map(|(_, r)| format!("{:.0}", r.actions_per_s))
            .collect();
        writeln!(
            t,
            "{:<44} {:>22} {:>28} {:>16}",
            part.label(),
            figures.join(" "),
            format!("{:.3}", median(part) - base),
            rates.join(" ")
        )?;
    }
    print!("{t}");
    if args.json {
        let json: Vec<serde_json::Value> = runs
            .iter()
            .map(|(p, r)| serde_json::json!({"schema": p.label(), "result": r}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&json)?);
    }
    Ok(())
}

/// `--dead-entries`: the sweeper's scans against the dead index entries of N completed
/// operations, for each N, on a new database each (dropped after).
pub(crate) async fn dead_entries(args: &BenchArgs) -> anyhow::Result<()> {
    use std::fmt::Write as _;
    let machine = sys::Machine::read();
    let run_id = format!("{}_{}", std::process::id(), chrono::Utc::now().timestamp());
    let rate = args.churn_rate;
    anyhow::ensure!(rate > 0.0, "--churn-rate must be above zero");
    let mut results = Vec::new();
    for &n in &args.dead_entries {
        let db_name = format!("oncely_bench_{run_id}_dead_{n}");
        let (churned, scans) = scratch_database(args, &db_name, false, async |url, pool| {
            // No vacuum may clean the indexes while they are measured (where autovacuum runs).
            sqlx::raw_sql("ALTER TABLE agent_operations SET (autovacuum_enabled = false)")
                .execute(&pool)
                .await?;
            eprintln!("{n} operations through planned and executing at {rate:.0}/s into {db_name}");
            let started = std::time::Instant::now();
            scale::churn(&url, n, rate, |done| {
                if done % 500_000 == 0 {
                    eprintln!("      {done} ({:.0} s)", started.elapsed().as_secs_f64());
                }
            })
            .await?;
            let churned = started.elapsed().as_secs_f64();
            let scans = scale::sweep_times(&pool).await?;
            pool.close().await;
            anyhow::Ok((churned, scans))
        })
        .await?;
        results.push((n, churned, scans));
    }
    let mut t = String::new();
    let _ = writeln!(
        t,
        "oncely-bench --dead-entries — {}",
        chrono::Utc::now().format("%Y-%m-%d %H:%M:%S UTC")
    );
    let _ = writeln!(
        t,
        "command:  {}",
        std::env::args().collect::<Vec<_>>().join(" ")
    );
    let _ = writeln!(t, "machine:  {}", machine.describe());
    let _ = writeln!(
        t,
        "journals: N operations recorded, claimed (60-s lease) and completed at {rate:.0}/s up to now, no vacuum since\n"
    );
    let _ = writeln!(
        t,
        "{:<40} {:>12} {:>22} {:>10} {:>10}",
        "scan", "N", "median ms (first run)", "buffers", "ms / 1e5 N"
    );
    let _ = writeln!(t, "{}", "-".repeat(98));
    for (n, _, scans) in &results {
        for scan in scans.iter().filter(|s| s.scan != "stale unknowns") {
            let per = if *n > 0 {
                format!("{:.3}", scan.median_ms / (*n as f64 / 1e5))
            } else {
                "-".to_owned()
            };
            let _ = writeln!(
                t,
                "{:<40} {:>12} {:>22} {:>10} {:>10}",
                scan.scan,
                n,
                format!("{:.3} ({:.1})", scan.median_ms, scan.first_ms),
                scan.buffers,
                per
            );
        }
    }
    for (n, churned, scans) in &results {
        let _ = writeln!(t, "N = {n}: churned in {churned:.0} s");
        for scan in scans {
            let _ = writeln!(t, "  plan of {}: {}", scan.scan, scan.plan);
        }
    }
    let _ = writeln!(
        t,
        "\nEXPLAIN (ANALYZE, BUFFERS) of each scan's row selection, {} runs each, rolled back; the first run \
         reads the table for entries no scan read before, the rest find them marked dead in the index. \
         \"since the last pass\": the window of a pass between full ones (sweep_interval 5 s + 30 s overlap).",
        scale::REPEATS
    );
    println!("{t}");
    if args.json {
        let v: Vec<_> = results
            .iter()
            .map(|(n, churned, scans)| serde_json::json!({"n": n, "rate": rate, "churn_seconds": churned, "scans": scans}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
    }
    Ok(())
}

/// `--warm-indexes`: read the filled journal's operation indexes into the OS cache.
pub(crate) async fn warm(args: &BenchArgs, url: &str) -> anyhow::Result<()> {
    if !args.warm_indexes {
        return Ok(());
    }
    eprintln!("reading the operations' indexes into the OS cache (--warm-indexes)");
    for (index, mb, secs) in scale::warm_indexes(url).await? {
        eprintln!("      {index}: {mb:.0} MB in {secs:.0} s");
    }
    Ok(())
}

/// Print the `--journal-rows` table (and the JSON with `--json`).
pub(crate) fn print_scale(
    args: &BenchArgs,
    machine: &sys::Machine,
    n: usize,
    filled: &scale::Filled,
    empty: &[FleetResult; 2],
    full: &FilledRuns,
    checkpoints: &[bool],
) -> anyhow::Result<()> {
    let checkpointed = checkpoints.iter().all(|c| *c);
    println!(
        "{}",
        scale_table(args, machine, n, filled, empty, full, checkpointed)
    );
    if args.json {
        let v = serde_json::json!({"filled": filled, "empty": empty, "full": full.runs,
            "live_only": full.live_only});
        println!("{}", serde_json::to_string_pretty(&v)?);
    }
    Ok(())
}

/// The `--journal-rows` table.
pub(crate) fn scale_table(
    args: &BenchArgs,
    machine: &sys::Machine,
    n: usize,
    filled: &scale::Filled,
    empty: &[FleetResult; 2],
    filled_runs: &FilledRuns,
    checkpointed: bool,
) -> String {
    use std::fmt::Write as _;
    let full = &filled_runs.runs;
    let mut t = String::new();
    let rows = filled.operations;
    let _ = writeln!(
        t,
        "oncely-bench --journal-rows {rows} — {}",
        chrono::Utc::now().format("%Y-%m-%d %H:%M:%S UTC")
    );
    let _ = writeln!(
        t,
        "command:  {}",
        std::env::args().collect::<Vec<_>>().join(" ")
    );
    let _ = writeln!(t, "machine:  {}", machine.describe());
    match &filled.reused {
        None => writeln!(
            t,
            "fill:     {rows} operations {:?}, {} events; insert {:.0} s, indexes {:.0} s, VACUUM ANALYZE {:.0} s",
            filled.by_status,
            filled.events,
            filled.seconds[0],
            filled.seconds[1],
            filled.seconds[2]
        ),
        Some(db) => writeln!(
            t,
            "journal:  {db}, filled earlier: {rows} operations {:?}, ~{} events (Postgres's estimate)",
            filled.by_status, filled.events
        ),
    }
    .ok();
    let total: i64 = filled.sizes.iter().map(|(_, b)| b).sum();
    let sizes: Vec<String> = filled
        .sizes
        .iter()
        .map(|(r, b)| format!("{r} {:.0} MB", *b as f64 / 1e6))
        .collect();
    let _ = writeln!(
        t,
        "sizes:    {:.1} GB in all: {}",
        total as f64 / 1e9,
        sizes.join(", ")
    );
    let _ = writeln!(
        t,
        "runs:     {n} intents each, {} workers, on the empty journal then on the filled one{}; {}",
        args.settings().fleet,
        if args.warm_indexes {
            " (its operation indexes read into the OS cache first: --warm-indexes)"
        } else {
            ""
        },
        if checkpointed {
            "each right after a CHECKPOINT"
        } else {
            "CHECKPOINT refused (not superuser or pg_checkpoint): runs may overlap a checkpoint"
        }
    );
    let _ = writeln!(t);
    let _ = writeln!(
        t,
        "{:<86} {:>12} {:>12} {:>9}",
        "figure", "empty", "filled", "ratio"
    );
    let _ = writeln!(t, "{}", "-".repeat(122));
    let mut row = |what: String, a: f64, b: f64| {
        let prec = if a.abs().max(b.abs()) < 10.0 { 3 } else { 1 };
        let _ = writeln!(t, "{what:<86} {a:>12.prec$} {b:>12.prec$} {:>9.2}", b / a);
    };
    let paced = match args.paced_at {
        Some(rate) => format!("paced {rate:.0}/s"),
        None => "50 % load".to_owned(),
    };
    for (i, load) in ["full load", paced.as_str()].iter().enumerate() {
        let (e, f) = (&empty[i], &full[i]);
        row(
            format!("{load}: actions/s"),
            e.actions_per_s,
            f.actions_per_s,
        );
        row(
            format!("{load}: recorded → claimed p50 (ms)"),
            e.to_claim_ms[0],
            f.to_claim_ms[0],
        );
        row(
            format!("{load}: recorded → claimed p99 (ms)"),
            e.to_claim_ms[1],
            f.to_claim_ms[1],
        );
        row(
            format!("{load}: claimed → succeeded p50 (ms)"),
            e.claim_to_done_ms[0],
            f.claim_to_done_ms[0],
        );
        row(
            format!("{load}: claimed → succeeded p99 (ms)"),
            e.claim_to_done_ms[1],
            f.claim_to_done_ms[1],
        );
        row(
            format!("{load}: Postgres ms CPU per action"),
            e.cpu.postgres * 1000.0 / e.actions_per_s,
            f.cpu.postgres * 1000.0 / f.actions_per_s,
        );
    }
    let (e, f) = (&empty[1], &full[1]);
    let live = &filled_runs.live_only;
    // (label, first column's scans, the filled journal's): the third compares the filled
    // journal with its live rows alone instead of with the empty journal.
    let sets = [
        (String::new(), &e.sweep, &f.sweep),
        (
            " [after VACUUM]".to_owned(),
            &e.sweep_vacuumed,
            &f.sweep_vacuumed,
        ),
        (
            format!(" [after VACUUM, {} live rows alone]", live.rows),
            &live.scans,
            &f.sweep_vacuumed,
        ),
    ];
    for (when, es, fs) in &sets {
        for (scan, other) in es.iter().zip(fs.iter()) {
            row(
                format!(
                    "sweeper scan{when}: {} (ms, median of {})",
                    scan.scan,
                    scale::REPEATS
                ),
                scan.median_ms,
                other.median_ms,
            );
            row(
                format!("sweeper scan{when}: {} (buffers)", scan.scan),
                scan.buffers as f64,
                other.buffers as f64,
            );
        }
    }
    for (when, es, fs) in &sets[..2] {
        for (scan, other) in es.iter().zip(fs.iter()) {
            let _ = writeln!(
                t,
                "plan of {}{when}: empty: {}; filled: {}",
                scan.scan, scan.plan, other.plan
            );
        }
    }
    let _ = writeln!(
        t,
        "\nratio = filled ÷ empty (the issue's bound: latencies and scan times within 1.5×). \
         Scans: EXPLAIN (ANALYZE, BUFFERS) of each sweeper scan's row selection after the paced run, rolled back; \
         [after VACUUM]: the same once `VACUUM (INDEX_CLEANUP ON) agent_operations` ({:.1} s empty, {:.1} s filled) \
         removed the dead index entries — the runs' and those the bench's own clock update (steady_state) left \
         on the filled journal's live rows. [after VACUUM, N live rows alone]: the first column is a new journal \
         holding only the filled one's N live operations (copied), steady_state and VACUUM as on the others — the \
         same live work without the history.",
        e.vacuum_seconds, f.vacuum_seconds
    );
    t
}
