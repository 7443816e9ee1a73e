//! oncely end to end: a fresh database, an in-process sandbox, W real `oncely-worker run`
//! processes, and the producer SDK enqueueing N intents; measured until the journal
//! shows N `succeeded` (polled every 50 ms once the sandbox has seen N effects), from the
//! first enqueue to the last `updated_at`, both on the database clock.

use super::intents::{ACTIONS, Workload};
use super::sys::{self, CpuSampler, CpuUse};
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use oncely_core::config::{Config, ProviderConfig};
use oncely_core::db::{self, PoolSettings};
use oncely_core::journal::{Journal, Latencies};
use oncely_core::topology::{self, Topology};
use oncely_core::{Intent, KeyRing};
use oncely_producer::{Enqueued, Producer};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};

/// Intents per `enqueue_many` call at full load.
pub const ENQUEUE_CHUNK: usize = 1000;
/// How often the journal is polled for the `succeeded` count.
const POLL: Duration = Duration::from_millis(50);
/// A run fails when the `succeeded` count does not move for this long.
const STALL: Duration = Duration::from_secs(60);

/// What every end-to-end run shares.
#[derive(Debug, Clone)]
pub struct FleetEnv {
    /// Postgres server URL (the bench's databases are created on it).
    pub server_url: String,
    /// RabbitMQ URL.
    pub amqp_url: String,
    /// A cluster's nodes (`broker.urls`; empty: `amqp_url` alone).
    pub amqp_urls: Vec<String>,
    /// Every worker's `batch`; its `prefetch` = `max_in_flight` are twice that
    /// ([`in_flight_for`]; unless `worker_in_flight` or `worker_batch` set them).
    pub concurrency: u16,
    /// The workload.
    pub workload: Workload,
    /// Intents per run.
    pub intents: usize,
    /// The key secret (given to the workers too, so they verify keys).
    pub secret: String,
    /// The `oncely-worker` binary.
    pub worker_bin: PathBuf,
    /// The `oncely-gateway` binary.
    pub gateway_bin: PathBuf,
    /// Unique per bench invocation.
    pub run_id: String,
    /// Run on this existing database (a filled journal, `--journal-rows`) instead of a
    /// fresh one; it is left in place (its owner drops it).
    pub journal_db: Option<String>,
    /// The number of the run's first intent (0; runs that share a journal take
    /// different intents).
    pub first_intent: usize,
    /// Time the sweeper's scans once the run is done (`--journal-rows` only: the usual
    /// table does not print them).
    pub time_sweeps: bool,
    /// Every worker's `linger`.
    pub linger: Duration,
    /// Every action type's `outcome_events` (`--no-outcome-events`: false).
    pub outcome_events: bool,
    /// Agents enqueueing at once at full load (`--agents`).
    pub agents: usize,
    /// Every worker's `batch`, instead of C (`--worker-batch`).
    pub worker_batch: Option<u16>,
    /// Every worker's `prefetch` = `max_in_flight`, instead of 2 × C, where the run does
    /// not set its own (`--worker-in-flight`).
    pub worker_in_flight: Option<u16>,
    /// The workers speak HTTP/2 to the sandbox (`--provider-http2`).
    pub provider_http2: bool,
}

/// One run's settings.
#[derive(Debug, Clone, Copy)]
pub struct FleetSpec {
    /// Worker processes.
    pub workers: usize,
    /// Sandbox latency per new key (ms).
    pub latency_ms: u64,
    /// Enqueue at this rate (intents/s) instead of as fast as possible.
    pub pace: Option<f64>,
    /// The pace as a percentage of the full-load rate (for the report).
    pub paced_percent: Option<u32>,
    /// `prefetch` = `max_in_flight` of every worker, instead of the run's C (the claim
    /// batch stays C).
    pub in_flight: Option<u16>,
    /// Enqueue through an `oncely-gateway` process over HTTP (POST /v1/actions/…, one
    /// request per intent on [`HTTP_CONNECTIONS`] keep-alive connections) instead of the
    /// SDK; the gateway's CPU counts with the workers'.
    pub gateway: bool,
    /// With [`FleetEnv::time_sweeps`]: after the scans as the run left the journal,
    /// `VACUUM (INDEX_CLEANUP ON)` it and time them again ([`FleetResult::sweep_vacuumed`]).
    /// Only after a pair's last run: the vacuum changes what a next run would find.
    pub vacuumed_sweeps: bool,
}

/// Concurrent HTTP connections of a gateway run.
pub const HTTP_CONNECTIONS: usize = 32;
/// The bench's gateway token (tenant `bench`).
pub(crate) const GATEWAY_TOKEN: &str = "bench-token";

/// One run's figures.
#[derive(Debug, Clone, Serialize)]
pub struct FleetResult {
    /// Worker processes.
    pub workers: usize,
    /// Sandbox latency (ms).
    pub sandbox_latency_ms: u64,
    /// The paced enqueue rate, if paced (intents/s).
    pub offered_per_s: Option<f64>,
    /// The pace as a percentage of the full-load rate.
    pub paced_percent: Option<u32>,
    /// Operations.
    pub intents: usize,
    /// Seconds from the first enqueue to the last `succeeded` (database clock).
    pub seconds: f64,
    /// Operations per second.
    pub actions_per_s: f64,
    /// Seconds the producer took to enqueue everything.
    pub enqueue_seconds: f64,
    /// Per-operation latency, `updated_at - created_at` (ms): median.
    pub p50_ms: f64,
    /// 95th percentile (ms).
    pub p95_ms: f64,
    /// 99th percentile (ms).
    pub p99_ms: f64,
    /// Slowest (ms).
    pub max_ms: f64,
    /// Recorded → claimed (`first_attempt_at - created_at`): enqueue, broker, claim (ms),
    /// median and 99th percentile.
    pub to_claim_ms: [f64; 2],
    /// Claimed → succeeded (`updated_at - first_attempt_at`): provider call and commit
    /// (ms), median and 99th percentile.
    pub claim_to_done_ms: [f64; 2],
    /// `VmHWM` of each worker just before it was stopped (MiB).
    pub peak_rss_mib: Vec<f64>,
    /// Provider calls the sandbox counted (= effects; no key had two).
    pub effects: u64,
    /// Enqueued through the gateway (HTTP) rather than the SDK.
    pub via_gateway: bool,
    /// Where the CPUs' time went.
    pub cpu: CpuUse,
    /// The sweeper's scans timed on the journal once the run was done (empty unless
    /// [`FleetEnv::time_sweeps`]).
    pub sweep: Vec<super::scale::ScanTime>,
    /// The same scans after `VACUUM (INDEX_CLEANUP ON)` (empty unless
    /// [`FleetSpec::vacuumed_sweeps`]).
    pub sweep_vacuumed: Vec<super::scale::ScanTime>,
    /// How long that vacuum took (s; 0 without it).
    pub vacuum_seconds: f64,
}

impl FleetResult {
    /// The largest worker peak RSS (MiB).
    pub fn max_rss_mib(&self) -> f64 {
        self.peak_rss_mib.iter().copied().fold(0.0, f64::max)
    }
}

/// A spawned worker.
#[derive(Debug)]
pub(crate) struct Worker {
    pub(crate) child: Child,
    pub(crate) pid: u32,
    pub(crate) log: PathBuf,
}

/// What a run created, torn down whatever happened.
#[derive(Debug, Default)]
struct Resources {
    workers: Vec<Worker>,
    sandbox: Option<oncely_sandbox::Sandbox>,
}

/// Run once; everything it creates is removed at the end (logs are kept on failure).
pub async fn run(env: &FleetEnv, spec: FleetSpec, seq: usize) -> anyhow::Result<FleetResult> {
    let db_name = env
        .journal_db
        .clone()
        .unwrap_or_else(|| format!("oncely_bench_{}_{seq}", env.run_id));
    let prefix = format!("oncely-bench-{}-{seq}", env.run_id);
    let dir = std::env::temp_dir().join(&prefix);
    sys::registry(|r| {
        r.databases.push(db_name.clone());
        r.prefixes.push(prefix.clone());
        r.dirs.push(dir.clone());
    });
    let mut res = Resources::default();
    let result = measure(env, spec, &db_name, &prefix, &dir, &mut res).await;
    for w in std::mem::take(&mut res.workers) {
        stop(w).await;
    }
    if let Some(s) = res.sandbox.take() {
        s.shutdown().await;
    }
    if let Err(e) = super::delete_topology(&env.amqp_url, &prefix).await {
        eprintln!("warning: could not delete the queues of {prefix}: {e}");
    }
    if env.journal_db.is_none()
        && let Err(e) = super::drop_database(&env.server_url, &db_name).await
    {
        eprintln!("warning: could not drop database {db_name}: {e}");
    }
    if result.is_ok() {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        eprintln!("worker logs kept in {}", dir.display());
    }
    sys::registry(|r| {
        r.databases.retain(|d| d != &db_name);
        r.prefixes.retain(|p| p != &prefix);
        r.dirs.retain(|d| d != &dir);
    });
    result
}

/// Every worker's `prefetch` = `max_in_flight` for a claim batch of `c`, unless a flag
/// says otherwise: twice the batch, so the next claim need not wait for every call of
/// the one before to end (docs/performance.md "Claims in waves"; the worker's own
/// defaults have the same ratio: 128 calls in flight, batches of 64).
pub fn in_flight_for(c: u16) -> u16 {
    c.saturating_mul(2)
}

/// The config every worker of a run reads: the built-in one (the structure of the
/// tests' fleet) pointed at this run, with the run's concurrency (and `in_flight` calls
/// per worker, when given).
pub(crate) fn fleet_config(
    env: &FleetEnv,
    in_flight: Option<u16>,
    db_url: &str,
    prefix: &str,
    sandbox: &str,
) -> anyhow::Result<Config> {
    let c = env.concurrency;
    let mut config = Config::builtin()?;
    config.database_url = db_url.to_owned();
    config.broker.url = env.amqp_url.clone();
    if !env.amqp_urls.is_empty() {
        // `url` and `urls` together are refused: the default `url` with the list.
        config.broker.url = oncely_core::config::BrokerConfig::default().url;
        config.broker.urls = env.amqp_urls.clone();
    }
    config.broker.prefix = prefix.to_owned();
    config.broker.queue_type = "quorum".into();
    let in_flight = in_flight
        .or(env.worker_in_flight)
        .unwrap_or_else(|| in_flight_for(c));
    config.worker.prefetch = in_flight;
    config.worker.max_in_flight = in_flight.into();
    config.worker.batch = env.worker_batch.unwrap_or(c).into();
    config.worker.db_connections = 8;
    config.worker.linger = env.linger;
    config.point_at_sandbox(sandbox);
    for provider in config.providers.values_mut() {
        if let ProviderConfig::Http(http) = provider {
            http.http2 = env.provider_http2;
        }
    }
    for policy in config.actions.values_mut() {
        policy.lease = Duration::from_secs(60);
        policy.retry_delay = Duration::from_secs(2);
        policy.outcome_events = env.outcome_events;
    }
    config.validate()?;
    Ok(config)
}

async fn measure(
    env: &FleetEnv,
    spec: FleetSpec,
    db_name: &str,
    prefix: &str,
    dir: &Path,
    res: &mut Resources,
) -> anyhow::Result<FleetResult> {
    let n = env.intents;
    let db_url = super::database_url(&env.server_url, db_name);
    let pool = db::prepare(
        &db_url,
        &PoolSettings {
            max_connections: 2,
            ..PoolSettings::default()
        },
    )
    .await?;
    let sandbox = oncely_sandbox::spawn("127.0.0.1:0".parse()?).await?;
    if spec.latency_ms > 0 {
        sandbox.set_faults(oncely_sandbox::Faults {
            latency_ms: spec.latency_ms,
            ..Default::default()
        })?;
    }
    let base = sandbox.base_url();
    res.sandbox = Some(sandbox);

    std::fs::create_dir_all(dir)?;
    let config = fleet_config(env, spec.in_flight, &db_url, prefix, &base)?;
    let config_path = dir.join("oncely.toml");
    std::fs::write(&config_path, config.to_toml()?)?;

    // The topology exists before any worker or producer starts.
    let conn = topology::connect(&config.broker, "oncely-bench").await?;
    let channel = conn.create_channel().await?;
    let topo = Topology::new(&config.broker);
    topo.declare(&channel, &ACTIONS).await?;

    for i in 0..spec.workers {
        res.workers.push(spawn(env, &config_path, dir, i)?);
    }
    wait_consuming(&channel, &topo, spec.workers, &mut res.workers).await?;

    let secret = KeyRing::new(env.secret.clone().into_bytes())?;
    let producer = Arc::new(Producer::connect(&config, secret).await?);
    let intents = env.workload.intents(env.first_intent, n);
    let gateway = if spec.gateway {
        let (addr, w) = start_gateway(env, &config_path, dir).await?;
        res.workers.push(w);
        Some(addr)
    } else {
        None
    };

    let cpu = CpuSampler::start();
    let journal = Journal::new(pool.clone());
    let t0 = journal.clock().await?;
    let mut enqueuing = Some(match gateway {
        None => tokio::spawn(enqueue(producer.clone(), intents, spec.pace, env.agents)),
        Some(addr) => tokio::spawn(enqueue_http(addr, intents)),
    });
    let mut enqueue_seconds = None;
    let mut last = (0i64, Instant::now());
    // The bench reads only this run's operations, by primary key, so what it costs the
    // journal does not grow with the operations already there (`--journal-rows`). Their
    // keys are the ones the provider saw (the gateway path derives them with its token's
    // tenant, so they are taken from the sandbox, not computed here).
    let mut keys: Vec<String> = Vec::new();
    // The run's keys not yet seen succeeded: each poll looks up only these.
    let mut pending: std::collections::HashSet<String> = Default::default();
    loop {
        tokio::time::sleep(POLL).await;
        // The sandbox's ledger (in memory) gates the journal's lookups: the first one
        // reads every key of the run, too much to run 20 times a second beside the
        // system under test. The end time comes from the journal. Only the ledger's
        // count is read while the run goes on: a copy of it (one entry per key, taken
        // under the lock every provider request needs) 20 times a second cost the
        // bench process CPU counted as the producer's and sandbox's (docs/performance.md).
        let effects = res.sandbox.as_ref().map_or(0, |s| s.distinct_effect_keys());
        if effects >= n
            && keys.is_empty()
            && let Some(sandbox) = res.sandbox.as_ref()
        {
            keys = sandbox.effects().keys.into_keys().collect();
            pending = keys.iter().cloned().collect();
        }
        if !pending.is_empty() {
            let ask: Vec<String> = pending.iter().cloned().collect();
            for k in journal.succeeded_among(&ask).await? {
                pending.remove(&k);
            }
        }
        let done = if keys.is_empty() {
            0
        } else {
            (keys.len() - pending.len()) as i64
        };
        let progress = effects as i64 + done;
        if enqueuing.as_ref().is_some_and(|h| h.is_finished())
            && let Some(h) = enqueuing.take()
        {
            enqueue_seconds = Some(h.await??);
        }
        if done as usize >= n {
            break;
        }
        if progress > last.0 {
            last = (progress, Instant::now());
        } else if last.1.elapsed() > STALL {
            anyhow::bail!(
                "only {effects} of {n} operations reached the provider, no progress for {} s \
                 (journal: {}); see the worker logs",
                STALL.as_secs(),
                statuses(&journal).await
            );
        }
        for w in &mut res.workers {
            if let Some(status) = w.child.try_wait()? {
                anyhow::bail!(
                    "worker {} exited ({status}) during the run:\n{}",
                    w.pid,
                    tail(&w.log)
                );
            }
        }
    }
    let enqueue_seconds = match (enqueue_seconds, enqueuing.take()) {
        (Some(s), _) => s,
        (None, Some(h)) => h.await??,
        (None, None) => 0.0,
    };
    let pids: Vec<u32> = res.workers.iter().map(|w| w.pid).collect();
    let cpu = cpu.finish(&pids);
    let t_end = journal.last_update(&keys).await?.unwrap_or(t0);
    let seconds = (t_end - t0).num_microseconds().unwrap_or(0) as f64 / 1e6;
    let Latencies {
        total_ms: lat,
        to_claim_ms: to_claim,
        claim_to_done_ms: to_done,
    } = journal.succeeded_latencies(&keys).await?;
    let (mut sweep, mut sweep_vacuumed, mut vacuum_seconds) = (Vec::new(), Vec::new(), 0.0);
    if env.time_sweeps {
        super::scale::steady_state(&pool).await?;
        sweep = super::scale::sweep_times(&pool).await?;
        if spec.vacuumed_sweeps {
            vacuum_seconds = super::scale::vacuum(&pool).await?;
            sweep_vacuumed = super::scale::sweep_times(&pool).await?;
        }
    }
    let peak_rss_mib: Vec<f64> = pids
        .iter()
        .map(|p| sys::peak_rss_mib(*p).unwrap_or(f64::NAN))
        .collect();

    // Ground truth: one effect per key at the sandbox.
    let effects = res
        .sandbox
        .as_ref()
        .map(|s| s.effects())
        .unwrap_or_default();
    let dups = effects.duplicates().count();
    if dups > 0 || effects.keys.len() != n {
        anyhow::bail!(
            "the sandbox saw {} keys with an effect ({dups} with more than one) for {n} operations",
            effects.keys.len()
        );
    }
    drop(producer);
    pool.close().await;
    oncely_core::amqp::close(&conn, "bench", "bench done").await;
    Ok(FleetResult {
        workers: spec.workers,
        sandbox_latency_ms: spec.latency_ms,
        offered_per_s: spec.pace,
        paced_percent: spec.paced_percent,
        intents: n,
        seconds,
        actions_per_s: n as f64 / seconds,
        enqueue_seconds,
        p50_ms: percentile(&lat, 0.50),
        p95_ms: percentile(&lat, 0.95),
        p99_ms: percentile(&lat, 0.99),
        max_ms: lat.last().copied().unwrap_or(f64::NAN),
        to_claim_ms: [percentile(&to_claim, 0.5), percentile(&to_claim, 0.99)],
        claim_to_done_ms: [percentile(&to_done, 0.5), percentile(&to_done, 0.99)],
        peak_rss_mib,
        effects: effects.total,
        via_gateway: spec.gateway,
        cpu,
        sweep,
        sweep_vacuumed,
        vacuum_seconds,
    })
}

/// Start `oncely-gateway serve` for this run; its address once `/readyz` says ready.
pub(crate) async fn start_gateway(
    env: &FleetEnv,
    config: &Path,
    dir: &Path,
) -> anyhow::Result<(std::net::SocketAddr, Worker)> {
    use sha2::Digest;
    let tokens = dir.join("tokens.toml");
    std::fs::write(
        &tokens,
        format!(
            "[[token]]\nid = \"bench\"\ntenant = \"bench\"\nsha256 = \"{}\"\n",
            hex::encode(sha2::Sha256::digest(GATEWAY_TOKEN.as_bytes()))
        ),
    )?;
    let free = || -> anyhow::Result<std::net::SocketAddr> {
        Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
    };
    let (api, ops) = (free()?, free()?);
    let (api_s, ops_s, tokens_s) = (
        api.to_string(),
        ops.to_string(),
        tokens.to_string_lossy().into_owned(),
    );
    let w = spawn_program(
        env,
        &env.gateway_bin,
        config,
        &dir.join("gateway.log"),
        &[
            "serve",
            "--listen",
            &api_s,
            "--ops-listen",
            &ops_s,
            "--tokens-file",
            &tokens_s,
        ],
    )?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(mut c) = oncely_sandbox::http::Conn::connect(ops, None).await
            && c.get("/readyz").await.is_ok_and(|a| a.status == 200)
        {
            return Ok((api, w));
        }
        if Instant::now() > deadline {
            anyhow::bail!("the gateway did not become ready:\n{}", tail(&w.log));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Enqueue every intent with its own HTTP request through the gateway, on
/// [`HTTP_CONNECTIONS`] connections; returns the seconds it took.
async fn enqueue_http(addr: std::net::SocketAddr, intents: Vec<Intent>) -> anyhow::Result<f64> {
    let started = Instant::now();
    let mut lanes: Vec<Vec<Intent>> = (0..HTTP_CONNECTIONS).map(|_| Vec::new()).collect();
    for (i, intent) in intents.into_iter().enumerate() {
        lanes[i % HTTP_CONNECTIONS].push(intent);
    }
    let mut tasks = Vec::new();
    for lane in lanes {
        tasks.push(tokio::spawn(async move {
            let mut c = oncely_sandbox::http::Conn::connect(addr, Some(GATEWAY_TOKEN)).await?;
            for i in lane {
                post_intent(&mut c, &i).await?;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(started.elapsed().as_secs_f64())
}

/// `POST /v1/actions/{type}` of one intent; the gateway must answer `202` (a new
/// operation).
pub(crate) async fn post_intent(
    c: &mut oncely_sandbox::http::Conn,
    i: &Intent,
) -> anyhow::Result<oncely_sandbox::http::Answer> {
    let id = &i.identity;
    let body = serde_json::json!({"workflow_id": id.workflow_id, "step": id.step,
        "business_object": id.business_object, "revision": id.revision, "payload": i.payload});
    let a = c
        .post(
            &format!("/v1/actions/{}", id.action_type.as_str()),
            &body,
            &[],
        )
        .await?;
    if a.status != 202 {
        anyhow::bail!("gateway answered {} {}", a.status, a.json);
    }
    Ok(a)
}

/// Nearest-rank percentile of sorted values.
pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Enqueue everything (at full speed from `agents` tasks, or paced from one); returns
/// the seconds it took.
///
/// Why several agents at full load: one agent awaits each chunk's record and confirms
/// before it sends the next, so its rate falls with the database's and the broker's
/// latency; with four workers on this machine it fell to the fleet's rate and set it
/// (docs/performance.md "One agent set the pace"). Full load means a backlog, so at full
/// speed `agents` tasks each take the next chunk when their last one is confirmed, as a
/// fleet of agents would.
pub(crate) async fn enqueue(
    producer: Arc<Producer>,
    intents: Vec<Intent>,
    pace: Option<f64>,
    agents: usize,
) -> anyhow::Result<f64> {
    let started = Instant::now();
    if pace.is_none() {
        let mut chunks: Vec<Vec<Intent>> = Vec::new();
        let mut rest = intents;
        while !rest.is_empty() {
            let tail = rest.split_off(ENQUEUE_CHUNK.min(rest.len()));
            chunks.push(std::mem::replace(&mut rest, tail));
        }
        chunks.reverse();
        let queue = Arc::new(std::sync::Mutex::new(chunks));
        let mut tasks = tokio::task::JoinSet::<anyhow::Result<()>>::new();
        for _ in 0..agents.max(1) {
            let (producer, queue) = (producer.clone(), queue.clone());
            tasks.spawn(async move {
                loop {
                    let next = queue.lock().expect("chunk queue").pop();
                    let Some(chunk) = next else { return Ok(()) };
                    enqueue_chunk(&producer, chunk).await?;
                }
            });
        }
        while let Some(done) = tasks.join_next().await {
            done??;
        }
        return Ok(started.elapsed().as_secs_f64());
    }
    let (mut intents, rate) = (intents, pace.unwrap_or_default());
    let n = intents.len();
    let mut sent = 0usize;
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    while !intents.is_empty() {
        tick.tick().await;
        let due = ((started.elapsed().as_secs_f64() * rate) as usize).min(n);
        let take = due.saturating_sub(sent).min(ENQUEUE_CHUNK);
        if take == 0 {
            continue;
        }
        let rest = intents.split_off(take.min(intents.len()));
        let chunk = std::mem::replace(&mut intents, rest);
        sent += chunk.len();
        enqueue_chunk(&producer, chunk).await?;
    }
    Ok(started.elapsed().as_secs_f64())
}

/// One `enqueue_many`; every intent must come back as a new operation.
async fn enqueue_chunk(producer: &Producer, chunk: Vec<Intent>) -> anyhow::Result<()> {
    for r in producer.enqueue_many(chunk).await? {
        match r {
            Ok(Enqueued::Enqueued { .. }) => {}
            Ok(other) => anyhow::bail!("enqueue: expected a new operation, got {other:?}"),
            Err(e) => anyhow::bail!("enqueue failed: {e}"),
        }
    }
    Ok(())
}

/// Start `oncely-worker --config FILE run`, its stderr in a log file.
pub(crate) fn spawn(env: &FleetEnv, config: &Path, dir: &Path, i: usize) -> anyhow::Result<Worker> {
    spawn_program(
        env,
        &env.worker_bin,
        config,
        &dir.join(format!("worker-{i}.log")),
        &["run"],
    )
}

/// Start `PROGRAM --config FILE ARGS…`, its stderr in `log`.
pub(crate) fn spawn_program(
    env: &FleetEnv,
    program: &Path,
    config: &Path,
    log: &Path,
    args: &[&str],
) -> anyhow::Result<Worker> {
    let log = log.to_path_buf();
    let file = std::fs::File::create(&log)?;
    let mut cmd = Command::new(program);
    cmd.arg("--config").arg(config).args(args);
    // The config file says everything: no override from this shell may redirect a worker.
    for (k, _) in std::env::vars_os() {
        let name = k.to_string_lossy();
        if name.starts_with("ONCELY") || name == "DATABASE_URL" {
            cmd.env_remove(&k);
        }
    }
    let child = cmd
        .env("ONCELY_KEY_SECRET", &env.secret)
        .env("ONCELY_LOG_FORMAT", "json")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(file)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot start {}: {e}", program.display()))?;
    let pid = child.id().unwrap_or(0);
    sys::registry(|r| r.pids.push(pid));
    Ok(Worker { child, pid, log })
}

/// Wait until every action queue has `workers` consumers.
pub(crate) async fn wait_consuming(
    channel: &lapin::Channel,
    topo: &Topology,
    workers: usize,
    procs: &mut [Worker],
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut ready = true;
        for a in ACTIONS {
            let q = channel
                .queue_declare(
                    topo.action_queue(a).as_str().into(),
                    QueueDeclareOptions {
                        passive: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await?;
            ready &= q.consumer_count() as usize >= workers;
        }
        if ready {
            return Ok(());
        }
        for w in procs.iter_mut() {
            if let Some(status) = w.child.try_wait()? {
                anyhow::bail!(
                    "worker {} exited ({status}) at start:\n{}",
                    w.pid,
                    tail(&w.log)
                );
            }
        }
        if Instant::now() > deadline {
            anyhow::bail!("the workers did not start consuming within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// SIGTERM, wait for a graceful exit, SIGKILL after 30 s.
pub(crate) async fn stop(mut w: Worker) {
    sys::signal(w.pid, "TERM");
    if tokio::time::timeout(Duration::from_secs(30), w.child.wait())
        .await
        .is_err()
    {
        eprintln!(
            "warning: worker {} ignored SIGTERM for 30 s; killing it",
            w.pid
        );
        let _ = w.child.kill().await;
    }
    sys::registry(|r| r.pids.retain(|p| *p != w.pid));
}

/// `status=count, …` of the journal.
pub(crate) async fn statuses(journal: &Journal) -> String {
    let rows = journal.count_by_status().await.unwrap_or_default();
    rows.iter()
        .map(|(s, c)| format!("{s}={c}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The last lines of a log.
pub(crate) fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
