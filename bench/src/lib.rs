//! `oncely-bench`: oncely's throughput and latency next to the two ceilings it is built
//! on, measured in one run on one machine, printed as a table (see `docs/performance.md`).
//!
//! 1. **Broker ceiling** ([`broker`]): publish with confirms (windows of 1000) and
//!    consume with acks (what has arrived acked in one `multiple` ack, as a worker acks a
//!    committed batch) through one quorum queue; same bodies, same prefetch.
//! 2. **Journal ceiling** ([`journal`]): the article's three autocommit statements per
//!    action on oncely's real schema, from C concurrent connections.
//! 3. **oncely end to end** ([`fleet`]): real `oncely-worker run` processes, the
//!    in-process sandbox, the producer SDK; full load, then half load (paced at half the
//!    full-load rate), then the scaling runs (workers, sandbox latency).
//!
//! Every measurement gets its own database and broker prefix and removes them at the
//! end. Design targets are printed next to the figures and never asserted: the bench
//! fails (exit 1) only when something broke.
//!
//! # Layout
//! - [`intents`]: the workload (the three action types, real envelopes).
//! - [`broker`], [`journal`], [`fleet`]: the measurements.
//! - [`report`]: the table and the JSON.
//! - [`sys`]: `/proc` readings and the cleanup registry.
//! - `runs`: the runs behind flags (journal at scale, throttled, floor parts, dead entries).

pub mod article;
pub mod broker;
pub mod fleet;
pub mod intents;
pub mod journal;
pub mod report;
mod runs;
pub mod scale;
pub mod soak;
pub mod sys;
pub mod throttle;

use fleet::{FleetEnv, FleetResult, FleetSpec};
use intents::{ACTIONS, Workload};
use oncely_core::KeyRing;
use oncely_core::config::BrokerConfig;
use oncely_core::db;
use oncely_core::topology::{self, Topology};
use runs::*;
use std::path::PathBuf;

/// `oncely-bench` options.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "oncely-bench",
    version,
    about = "Benchmark oncely against its two ceilings (RabbitMQ alone, the article's journal flow alone), in one run.",
    long_about = "Benchmark oncely against its two ceilings, in one run on this machine, and print one table.\n\n\
1. broker ceiling: publish with confirms + consume with acks in runs through a quorum queue (no journal, no provider);\n\
2. journal ceiling: the article's three statements per action (insert planned, claim, complete) on oncely's schema;\n\
3. oncely end to end: real `oncely-worker run` processes (found next to this binary), the in-process sandbox and the\n\
   producer SDK, at full load and at half load, then the scaling runs (workers, sandbox latency).\n\n\
Each measurement creates its own database and broker prefix and removes them at the end. Design targets are printed\n\
next to the figures, never asserted: the exit status is 1 only when something broke.\n\n\
Build first: `cargo build --release -p oncely-worker -p oncely-bench`, then `./target/release/oncely-bench`."
)]
pub struct BenchArgs {
    /// Operations per measurement [default: 20000; with --quick: 1000].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub intents: Option<u64>,
    /// Concurrency C used by all three measurements alike: the broker ceiling's prefetch,
    /// the journal ceiling's connections, and each worker's batch (its prefetch and
    /// max_in_flight are 2 × C, as the worker's defaults are twice its batch).
    #[arg(long, value_name = "C", default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrency: u16,
    /// Message size in bytes for all measurements (payloads are padded to reach it)
    /// [default: a real envelope's size, about 500].
    #[arg(long, value_name = "BYTES")]
    pub message_bytes: Option<usize>,
    /// Worker processes of the scaling rows (sandbox latency 0), each run twice, there and
    /// back (1, 2, 4, then 4, 2, 1) [default: 1,2,4; with --quick: 1,2].
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = clap::value_parser!(u64).range(1..))]
    pub workers: Option<Vec<u64>>,
    /// Sandbox latencies (ms) of the scaling rows, with --fleet workers [default: 0,50; with --quick: 0].
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub latency_ms: Option<Vec<u64>>,
    /// Worker processes of the headline end-to-end runs (full and half load) and of the
    /// latency rows.
    #[arg(long, value_name = "W", default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..))]
    pub fleet: u64,
    /// The latency curve: runs paced at these percentages of the full-load rate (50 is
    /// always run: it is the half-load row) [default: 25,50,75; with --quick: 50].
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=100))]
    pub paced: Option<Vec<u32>>,
    /// The slow-provider row: the sandbox answers after this many ms while every worker
    /// holds --slow-in-flight calls; 0 skips it [default: 200; with --quick: 0].
    #[arg(long, value_name = "MS")]
    pub slow_provider_ms: Option<u64>,
    /// Calls in flight per worker (`prefetch` = `max_in_flight`) in the slow-provider row.
    #[arg(long, value_name = "N", default_value_t = 1000, value_parser = clap::value_parser!(u16).range(1..))]
    pub slow_in_flight: u16,
    /// Every worker's `linger` in ms: how long a claim or commit batch waits for more work
    /// after its first item (docs/performance.md "Linger").
    #[arg(long, value_name = "MS", default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=1000))]
    pub linger_ms: u64,
    /// Agents enqueueing at once at full load, each a loop of `enqueue_many` over
    /// 1,000 intents awaiting its confirms before its next (docs/performance.md "One
    /// agent set the pace"); paced runs enqueue from one.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub agents: u16,
    /// Every worker's claim and commit batch (`batch`) in the end-to-end rows, instead of C
    /// (docs/performance.md "Claims in waves").
    #[arg(long, value_name = "B", value_parser = clap::value_parser!(u16).range(1..))]
    pub worker_batch: Option<u16>,
    /// Every worker's `prefetch` = `max_in_flight` in the end-to-end rows but the
    /// slow-provider one, instead of 2 × C (docs/performance.md "Claims in waves").
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub worker_in_flight: Option<u16>,
    /// Every action type's `outcome_events = false` in the workers' config: no outcome
    /// event is published (the bench listens to none), to measure what they cost
    /// (docs/performance.md "Outcome events off").
    #[arg(long)]
    pub no_outcome_events: bool,
    /// The workers reach the sandbox provider over HTTP/2 (`http2 = true`: h2c by prior
    /// knowledge, every call in flight a stream of one connection) instead of one
    /// HTTP/1.1 connection per call in flight (docs/performance.md "HTTP/2 to providers").
    #[arg(long)]
    pub provider_http2: bool,
    /// CI smoke test: 1000 intents, workers 1,2, latency 0, the 50 % point only, no
    /// slow-provider row (explicit flags still win).
    #[arg(long)]
    pub quick: bool,
    /// Postgres server URL; the bench creates and drops its own databases on it.
    #[arg(
        long,
        env = "DATABASE_URL",
        hide_env_values = true,
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    pub database_url: String,
    /// RabbitMQ URL; the bench uses its own queue prefix and deletes its queues.
    #[arg(
        long,
        env = "ONCELY_AMQP_URL",
        hide_env_values = true,
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f"
    )]
    pub amqp_url: String,
    /// A RabbitMQ cluster's nodes, comma-separated (`broker.urls` of every worker and
    /// producer; the broker ceiling and the clean-up use the first). Replaces --amqp-url.
    /// Start a private three-node cluster on this machine with
    /// `cargo run -p oncely-tests --bin oncely-cluster` (docs/scaling.md).
    #[arg(
        long,
        env = "ONCELY_AMQP_URLS",
        hide_env_values = true,
        value_delimiter = ',',
        value_name = "LIST"
    )]
    pub amqp_urls: Vec<String>,
    /// The journal at scale instead of the usual table: the end-to-end runs (full load and
    /// 50 % load, --fleet workers) and the sweeper's scans on an empty journal, then on one
    /// filled with N operations in realistic states and their events (bench/sql/
    /// fill_journal.sql; ~1.5 GB and ~50 s per million here, indexes included), with the ratios.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub journal_rows: Option<u64>,
    /// With --journal-rows: keep the filled database when the bench ends (its name is
    /// printed), to look at it afterwards with psql; drop it yourself.
    #[arg(long, requires = "journal_rows")]
    pub keep_journal: bool,
    /// The journal at scale on a database filled earlier (`--journal-rows N
    /// --keep-journal`) instead of filling one: the same runs and table, without the fill;
    /// the database is kept.
    #[arg(long, value_name = "DB", conflicts_with = "journal_rows")]
    pub filled_journal: Option<String>,
    /// With --journal-rows or --filled-journal: pace the second run on both journals at
    /// RATE intents/s, instead of at half of each journal's own full-load rate — the same
    /// offered load on both, for latencies compared like with like. With --soak: the
    /// soak's pace, instead of half of the full-load rate measured first.
    #[arg(long, value_name = "RATE")]
    pub paced_at: Option<f64>,
    /// With --journal-rows or --filled-journal: before the filled journal's runs, read the
    /// operations' indexes into the OS cache (`pg_prewarm`, contrib), as a journal that has
    /// been running keeps them; without it a freshly filled journal's indexes start cold.
    #[arg(long)]
    pub warm_indexes: bool,
    /// Instead of the usual table: the sweeper's scans on journals that hold N operations
    /// completed since the last index cleanup (a new database per N, comma-separated, e.g.
    /// `0,100000,1000000`), passed through `planned` and `executing` at --churn-rate per
    /// second up to now, real transitions with their events — a full pass's scans beside
    /// the bounded ones of the passes between (`[reconciler] full_sweep_interval`). No
    /// fleet, no broker; ~1 minute per million here.
    #[arg(long, value_name = "LIST", value_delimiter = ',', conflicts_with_all = ["journal_rows", "filled_journal"])]
    pub dead_entries: Vec<u64>,
    /// With --dead-entries: the rate the operations passed at (actions/s).
    #[arg(long, value_name = "RATE", default_value_t = 1000.0)]
    pub churn_rate: f64,
    /// Instead of the usual table: the journal floor (oncely's record, claim and
    /// completion statements, C per statement, 2 × --fleet connections) on oncely's schema
    /// as migrated and with parts of it removed — the events triggers, the identity index,
    /// the sweeper's partial indexes, all three — each on a new database, in turn,
    /// this many rounds: what each part costs Postgres per action. A diagnostic: oncely
    /// never runs without them.
    #[arg(long, value_name = "ROUNDS", conflicts_with_all = ["journal_rows", "filled_journal", "dead_entries"])]
    pub floor_parts: Option<u32>,
    /// Instead of the usual table: N `email.send` actions at once to a mail provider that
    /// allows --throttle-limit requests/s and answers 429 with Retry-After above it, for
    /// each --workers count, with the limit configured and from the 429s alone: drain time
    /// against N / limit, 429s, duplicates, CPU per action (docs/performance.md, "Rate
    /// limits").
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..), conflicts_with_all = ["journal_rows", "filled_journal", "dead_entries", "floor_parts"])]
    pub throttled: Option<u64>,
    /// With --throttled: the provider's limit (requests/s).
    #[arg(long, value_name = "RATE", default_value_t = 200.0)]
    pub throttle_limit: f64,
    /// Instead of the usual table: a soak of MINUTES through the gateway, paced at
    /// --paced-at or at half of the full-load rate measured first, with every process's
    /// RSS and the minute's p50/p99 printed each minute, and the slopes at the end
    /// (docs/performance.md "Soak").
    #[arg(long, value_name = "MINUTES", value_parser = clap::value_parser!(u32).range(2..), conflicts_with_all = ["journal_rows", "filled_journal", "dead_entries", "floor_parts", "throttled"])]
    pub soak: Option<u32>,
    /// Also print the figures as JSON (after the table).
    #[arg(long)]
    pub json: bool,
}

impl BenchArgs {
    /// `--amqp-urls`' first node as `--amqp-url` (the broker ceiling, the probe and the
    /// clean-up connect to one node; the fleets get the whole list).
    pub fn with_cluster_first(mut self) -> BenchArgs {
        if let Some(first) = self.amqp_urls.first() {
            self.amqp_url = first.clone();
        }
        self
    }
}

/// The settings after `--quick` and the defaults are applied.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Operations per measurement.
    pub intents: usize,
    /// C.
    pub concurrency: u16,
    /// `--message-bytes`, if given.
    pub message_bytes: Option<usize>,
    /// Scaling rows: workers.
    pub workers: Vec<usize>,
    /// Scaling rows: sandbox latency (ms).
    pub latency_ms: Vec<u64>,
    /// Headline workers.
    pub fleet: usize,
    /// The latency curve's points (% of the full-load rate; includes 50).
    pub paced: Vec<u32>,
    /// The slow-provider row: latency (ms) and calls in flight per worker.
    pub slow: Option<(u64, u16)>,
}

impl BenchArgs {
    /// Resolve `--quick` and the defaults.
    pub fn settings(&self) -> Settings {
        let dedup = |mut v: Vec<u64>| {
            let mut seen = Vec::new();
            v.retain(|x| {
                let new = !seen.contains(x);
                seen.push(*x);
                new
            });
            v
        };
        let (n, workers, latency, paced, slow_ms) = if self.quick {
            (1000, vec![1, 2], vec![0], vec![50], 0)
        } else {
            (20_000, vec![1, 2, 4], vec![0, 50], vec![25, 50, 75], 200)
        };
        let mut paced: Vec<u32> = self.paced.clone().unwrap_or(paced);
        paced.push(50);
        paced.sort_unstable();
        paced.dedup();
        let slow_ms = self.slow_provider_ms.unwrap_or(slow_ms);
        Settings {
            intents: self.intents.map_or(n, |v| v as usize),
            concurrency: self.concurrency,
            message_bytes: self.message_bytes,
            workers: dedup(self.workers.clone().unwrap_or(workers))
                .into_iter()
                .map(|w| w as usize)
                .collect(),
            latency_ms: dedup(self.latency_ms.clone().unwrap_or(latency)),
            fleet: self.fleet as usize,
            paced,
            slow: (slow_ms > 0).then_some((slow_ms, self.slow_in_flight)),
        }
    }
}

/// The URL of database `name` on the server of `server_url`.
pub fn database_url(server_url: &str, name: &str) -> String {
    db::database_url(server_url, name)
}

/// `DROP DATABASE … WITH (FORCE)`.
pub async fn drop_database(server_url: &str, name: &str) -> anyhow::Result<()> {
    Ok(db::drop_database(&db::database_url(server_url, name)).await?)
}

/// Delete the oncely queues and exchanges of `prefix`.
pub async fn delete_topology(amqp_url: &str, prefix: &str) -> anyhow::Result<()> {
    let conn = topology::connect(&BrokerConfig::at(amqp_url), "oncely-bench-cleanup").await?;
    let ch = conn.create_channel().await?;
    let topo = Topology::new(&BrokerConfig {
        prefix: prefix.to_owned(),
        ..BrokerConfig::default()
    });
    topo.delete(&ch, &ACTIONS).await?;
    oncely_core::amqp::close(&conn, "bench", "bench cleanup").await;
    Ok(())
}

/// Remove whatever an interrupted run left (databases, queues, processes, directories).
pub async fn cleanup_all(server_url: &str, amqp_url: &str) {
    let reg = sys::registry(std::mem::take);
    for pid in &reg.pids {
        sys::signal(*pid, "KILL");
    }
    for d in &reg.databases {
        if let Err(e) = drop_database(server_url, d).await {
            eprintln!("warning: could not drop database {d}: {e}");
        }
    }
    for p in &reg.prefixes {
        if let Err(e) = delete_topology(amqp_url, p).await {
            eprintln!("warning: could not delete the queues of {p}: {e}");
        }
    }
    for q in &reg.queues {
        if let Err(e) = broker::delete_queue(amqp_url, q).await {
            eprintln!("warning: could not delete queue {q}: {e}");
        }
    }
    for d in &reg.dirs {
        let _ = std::fs::remove_dir_all(d);
    }
}

/// The `oncely-worker` binary next to this executable. When launched by `cargo run`,
/// build it first (a no-op when fresh) so the workers run the same code as the bench.
pub fn worker_binary() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .ok_or_else(|| anyhow::anyhow!("{} has no directory", exe.display()))?;
    let path = dir.join("oncely-worker");
    if let Some(cargo) = std::env::var_os("CARGO") {
        let profile = match dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") => "dev".to_owned(),
            Some(p) => p.to_owned(),
            None => "dev".to_owned(),
        };
        eprintln!(
            "building oncely-worker (cargo build --profile {profile} -p oncely-worker --bin oncely-worker)"
        );
        let status = std::process::Command::new(cargo)
            .args(["build", "--profile", &profile, "-p", "oncely-worker"])
            .args([
                "--bin",
                "oncely-worker",
                "-p",
                "oncely-gateway",
                "--bin",
                "oncely-gateway",
            ])
            .status()?;
        if !status.success() {
            anyhow::bail!("building oncely-worker failed");
        }
    }
    if !path.exists() {
        let hint = if dir.ends_with("release") {
            "cargo build --release -p oncely-worker"
        } else {
            "cargo build -p oncely-worker"
        };
        anyhow::bail!(
            "{} not found: the bench runs real worker processes; build them first with `{hint}`",
            path.display()
        );
    }
    Ok(path)
}

/// Run the whole bench and print the report.
pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if !args.dead_entries.is_empty() {
        return dead_entries(&args).await;
    }
    if let Some(n) = args.throttled {
        return throttled(&args, n).await;
    }
    if let Some(rounds) = args.floor_parts {
        return floor_parts(&args, rounds).await;
    }
    let s = args.settings();
    let started = chrono::Utc::now();
    let machine = sys::Machine::read();
    let worker_bin = worker_binary()?;
    let gateway_bin = worker_bin.with_file_name("oncely-gateway");
    let mut services = report::Services::probe(&args.database_url, &args.amqp_url).await?;
    if args.amqp_urls.len() > 1 {
        let nodes: Vec<String> = args
            .amqp_urls
            .iter()
            .map(|u| topology::describe_amqp(u))
            .collect();
        services.rabbitmq = format!(
            "a cluster of {} nodes ({}); the broker ceiling's queue declared on the first",
            nodes.len(),
            nodes.join(", ")
        );
    }
    let run_id = format!("{}_{}", std::process::id(), started.timestamp());
    let secret_text = format!("oncely-bench-secret-{run_id}");
    let secret = KeyRing::new(secret_text.clone().into_bytes())?;
    let workload = match s.message_bytes {
        Some(t) => Workload::sized(t, &secret)?,
        None => Workload::natural(),
    };
    let envelopes = workload.envelopes(s.intents, &secret)?;
    let bodies: Vec<(String, Vec<u8>)> = envelopes
        .iter()
        .map(|e| (e.key.as_str().to_owned(), e.to_bytes()))
        .collect();
    let message_bytes =
        bodies.iter().map(|(_, b)| b.len()).sum::<usize>() as f64 / bodies.len().max(1) as f64;

    // The plan: headline full + half, then the worker-count rows there and back (1, 2, 4,
    // then 4, 2, 1: fresh runs, so that drift of the machine during them weighs on every
    // count alike), then the latency rows not already measured.
    let mut there_and_back: Vec<usize> = s.workers.clone();
    if s.workers.len() > 1 {
        there_and_back.extend(s.workers.iter().rev());
    }
    let mut seen = vec![(s.fleet, 0u64)];
    let extra: Vec<(usize, u64)> = s
        .latency_ms
        .iter()
        .map(|l| (s.fleet, *l))
        .filter(|r| {
            let new = !seen.contains(r);
            seen.push(*r);
            new
        })
        .collect();
    let steps = 5
        + (s.paced.len() - 1)
        + there_and_back.len()
        + extra.len()
        + usize::from(s.slow.is_some());
    let c = s.concurrency;
    let n = s.intents;
    let step = |i: usize, what: &str| eprintln!("[{i}/{steps}] {what}");

    let env = FleetEnv {
        server_url: args.database_url.clone(),
        amqp_url: args.amqp_url.clone(),
        amqp_urls: args.amqp_urls.clone(),
        concurrency: c,
        workload,
        intents: n,
        secret: secret_text,
        worker_bin,
        gateway_bin,
        run_id: run_id.clone(),
        journal_db: None,
        first_intent: 0,
        time_sweeps: args.journal_rows.is_some() || args.filled_journal.is_some(),
        linger: std::time::Duration::from_millis(args.linger_ms),
        outcome_events: !args.no_outcome_events,
        agents: args.agents.into(),
        worker_batch: args.worker_batch,
        worker_in_flight: args.worker_in_flight,
        provider_http2: args.provider_http2,
    };
    if args.journal_rows.is_some() || args.filled_journal.is_some() {
        return journal_at_scale(&args, env).await;
    }
    if let Some(minutes) = args.soak {
        return soak::soak(&args, env, minutes).await;
    }

    step(
        1,
        &format!("broker ceiling: {n} messages through a quorum queue, prefetch {c}"),
    );
    let broker = broker::run(
        &args.amqp_url,
        &format!("oncely-bench-{run_id}"),
        &bodies,
        c,
    )
    .await?;
    eprintln!("      {:.0} msg/s", broker.msg_per_s);

    step(
        2,
        &format!(
            "journal ceilings: {n} actions × 3 statements, {c} connections, on oncely's schema and on the article's plain table; then oncely's own statements, {c} actions each"
        ),
    );
    let jdb = format!("oncely_bench_{run_id}_journal");
    let envelopes_ref = &envelopes;
    let mut ceilings = Vec::new();
    for table in [journal::Table::Oncely, journal::Table::Plain] {
        let result = scratch_database(&args, &jdb, false, async |url, pool| {
            pool.close().await;
            journal::run(&url, envelopes_ref, usize::from(c), table).await
        })
        .await?;
        eprintln!("      {table:?}: {:.0} actions/s", result.actions_per_s);
        ceilings.push(result);
    }
    // The journal floor: the fleet's own statements, as full as the fleet makes them.
    let journal_batched = scratch_database(&args, &jdb, false, async |url, pool| {
        pool.close().await;
        journal::run_batched(&url, envelopes_ref, 2 * s.fleet, usize::from(c)).await
    })
    .await?;
    eprintln!(
        "      oncely's statements, {c} per statement: {:.0} actions/s",
        journal_batched.actions_per_s
    );
    let journal_plain = ceilings.pop().expect("two ceilings");
    let journal = ceilings.pop().expect("two ceilings");

    let mut seq = 0usize;
    let mut fleet_run = |spec: FleetSpec| {
        seq += 1;
        let env = env.clone();
        let this = seq;
        async move { fleet::run(&env, spec, this).await }
    };
    let show = |r: &FleetResult| {
        eprintln!(
            "      {:.0} actions/s, p50 {:.1} ms, p99 {:.1} ms",
            r.actions_per_s, r.p50_ms, r.p99_ms
        )
    };

    step(
        3,
        &format!(
            "oncely end to end, full load: {n} intents, {} workers",
            s.fleet
        ),
    );
    let spec = |workers: usize, latency_ms: u64| FleetSpec {
        workers,
        latency_ms,
        pace: None,
        paced_percent: None,
        in_flight: None,
        gateway: false,
        vacuumed_sweeps: false,
    };
    let full = fleet_run(spec(s.fleet, 0)).await?;
    show(&full);

    step(
        4,
        &format!(
            "oncely end to end through the gateway: {n} HTTP requests on {} connections, {} workers",
            fleet::HTTP_CONNECTIONS,
            s.fleet
        ),
    );
    let via_gateway = fleet_run(FleetSpec {
        gateway: true,
        ..spec(s.fleet, 0)
    })
    .await?;
    show(&via_gateway);

    let mut paced = Vec::with_capacity(s.paced.len());
    for (i, percent) in s.paced.iter().enumerate() {
        let rate = full.actions_per_s * f64::from(*percent) / 100.0;
        step(
            5 + i,
            &format!("oncely end to end, {percent} % load: {n} intents paced at {rate:.0}/s"),
        );
        let r = fleet_run(FleetSpec {
            pace: Some(rate),
            paced_percent: Some(*percent),
            ..spec(s.fleet, 0)
        })
        .await?;
        show(&r);
        paced.push(r);
    }
    let mut next = 5 + s.paced.len();

    let mut scaling_workers: Vec<FleetResult> = Vec::with_capacity(there_and_back.len());
    for w in &there_and_back {
        step(next, &format!("scaling: {w} workers, sandbox latency 0 ms"));
        next += 1;
        let r = fleet_run(spec(*w, 0)).await?;
        show(&r);
        scaling_workers.push(r);
    }
    let mut measured: Vec<FleetResult> = vec![full.clone()];
    for (w, l) in &extra {
        step(
            next,
            &format!("scaling: {w} workers, sandbox latency {l} ms"),
        );
        next += 1;
        let r = fleet_run(spec(*w, *l)).await?;
        show(&r);
        measured.push(r);
    }
    let slow = match s.slow {
        Some((latency, in_flight)) => {
            step(
                next,
                &format!(
                    "slow provider: sandbox latency {latency} ms, {} workers × {in_flight} calls in flight",
                    s.fleet
                ),
            );
            let r = fleet_run(FleetSpec {
                in_flight: Some(in_flight),
                ..spec(s.fleet, latency)
            })
            .await?;
            show(&r);
            Some(report::SlowProvider::new(
                r,
                in_flight,
                latency,
                full.actions_per_s,
            ))
        }
        None => None,
    };
    let pick = |w: usize, l: u64| {
        measured
            .iter()
            .find(|r| r.workers == w && r.sandbox_latency_ms == l)
            .cloned()
    };
    let scaling_latency: Vec<FleetResult> = s
        .latency_ms
        .iter()
        .filter_map(|l| pick(s.fleet, *l))
        .collect();

    let report = report::Report::new(
        started,
        std::env::args().collect::<Vec<_>>().join(" "),
        machine,
        services,
        report::Workload {
            intents: n,
            concurrency: c,
            message_bytes,
            confirm_window: broker::CONFIRM_WINDOW,
            enqueue_chunk: fleet::ENQUEUE_CHUNK,
            agents: args.agents.into(),
            worker_in_flight: args
                .worker_in_flight
                .unwrap_or_else(|| fleet::in_flight_for(c)),
            worker_batch: args.worker_batch.unwrap_or(c),
            provider_http: if args.provider_http2 {
                "HTTP/2 (h2c)"
            } else {
                "HTTP/1.1"
            },
            fleet: s.fleet,
            linger_ms: args.linger_ms,
        },
        report::Measured {
            broker,
            journal,
            journal_plain,
            journal_batched,
            full_load: full,
            via_gateway,
            paced,
            scaling_workers,
            scaling_latency,
            slow,
        },
    );
    println!("{}", report.table());
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn database_urls_keep_the_server() {
        assert_eq!(
            database_url("postgres://postgres@127.0.0.1:5432/postgres", "b1"),
            "postgres://postgres@127.0.0.1:5432/b1"
        );
        assert_eq!(
            database_url("postgres://u:p@db:6543", "b1"),
            "postgres://u:p@db:6543/b1"
        );
        assert_eq!(
            database_url("postgres://u@db/x?sslmode=disable", "b1"),
            "postgres://u@db/b1?sslmode=disable"
        );
    }

    #[test]
    fn quick_sets_defaults_and_flags_win() {
        let s = BenchArgs::parse_from(["oncely-bench", "--quick"]).settings();
        assert_eq!(
            (s.intents, s.workers, s.latency_ms),
            (1000, vec![1, 2], vec![0])
        );
        let s = BenchArgs::parse_from(["oncely-bench", "--quick", "--workers", "3,3,1"]).settings();
        assert_eq!(s.workers, vec![3, 1]);
        let s = BenchArgs::parse_from(["oncely-bench"]).settings();
        assert_eq!(
            (s.intents, s.workers, s.latency_ms, s.concurrency),
            (20_000, vec![1, 2, 4], vec![0, 50], 64)
        );
        assert_eq!((s.paced, s.slow), (vec![25, 50, 75], Some((200, 1000))));
        let s = BenchArgs::parse_from(["oncely-bench", "--quick", "--paced", "80,10"]).settings();
        assert_eq!((s.paced, s.slow), (vec![10, 50, 80], None));
        assert!(BenchArgs::try_parse_from(["oncely-bench", "--workers", "0"]).is_err());
    }
}
