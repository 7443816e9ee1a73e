//! `--throttled`: a burst of N `email.send` actions to a mail provider that allows R
//! requests a second and answers `429` with `Retry-After` above that (the sandbox's
//! `rate_limits` fault), through W real workers and a reconciler. One row per worker
//! count and mode: with the limit configured (`[providers.mail.rate_limit]`) and without
//! (the fleet learns it from the 429s alone).
//!
//! What a row says: how long the burst took to drain against `N / R` (the best any
//! client could do), how many ended `succeeded` (all of them, or the row failed), how
//! many 429s the provider answered per action, how many keys the provider saw twice
//! (must be 0), and the CPU the workers and the reconciler spent per action — throttling
//! must not cost CPU per *waiting* action, so this stays near the unthrottled figure.

use super::fleet::{self, FleetEnv, Worker};
use super::intents::{ACTIONS, Workload};
use super::sys::CpuSampler;
use oncely_core::config::{ProviderConfig, RateLimitConfig};
use oncely_core::db::{self, PoolSettings};
use oncely_core::journal::Journal;
use oncely_core::topology::{self, Topology};
use oncely_core::{Intent, KeyRing};
use oncely_producer::Producer;
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A run fails when no operation reaches a terminal state for this long.
const STALL: Duration = Duration::from_secs(90);

/// One row.
#[derive(Debug, Clone, Serialize)]
pub struct ThrottledRow {
    /// `configured` (the limit in the provider's config) or `429s only`.
    pub mode: &'static str,
    /// Worker processes (plus one reconciler).
    pub workers: usize,
    /// Actions in the burst.
    pub intents: usize,
    /// The provider's limit (requests/s).
    pub limit_per_s: f64,
    /// Seconds from the first enqueue to the last terminal state (database clock).
    pub seconds: f64,
    /// `seconds / (N / R)`: 1.0 is the provider's own pace.
    pub drain_ratio: f64,
    /// Operations `succeeded`.
    pub succeeded: i64,
    /// Operations `failed_final`.
    pub failed_final: i64,
    /// 429s the provider answered.
    pub answered_429: u64,
    /// 429s per action.
    pub share_429: f64,
    /// Keys with more than one effect at the provider (must be 0).
    pub duplicates: usize,
    /// Worker and reconciler CPU per action (ms).
    pub cpu_ms_per_action: f64,
}

/// Settings of the `--throttled` table.
#[derive(Debug, Clone)]
pub struct ThrottledSpec {
    /// Actions per burst.
    pub intents: usize,
    /// The provider's limit.
    pub limit: f64,
    /// Worker counts.
    pub workers: Vec<usize>,
}

/// Every row: for each worker count, configured then 429s only.
pub async fn run(env: &FleetEnv, spec: &ThrottledSpec) -> anyhow::Result<Vec<ThrottledRow>> {
    let mut rows = Vec::new();
    let mut seq = 0;
    for &w in &spec.workers {
        for configured in [true, false] {
            seq += 1;
            eprintln!(
                "throttled: {} email.send to a provider limited at {}/s, {w} workers, {}",
                spec.intents,
                spec.limit,
                if configured {
                    "limit configured"
                } else {
                    "429s only"
                }
            );
            rows.push(one(env, spec, w, configured, seq).await?);
        }
    }
    Ok(rows)
}

/// The provider's burst: a tenth of a second's worth (a strict limiter, like nginx's
/// `limit_req … burst=`), at least 1.
fn provider_burst(limit: f64) -> u32 {
    ((limit / 10.0).ceil() as u32).max(1)
}

async fn one(
    env: &FleetEnv,
    spec: &ThrottledSpec,
    workers: usize,
    configured: bool,
    seq: usize,
) -> anyhow::Result<ThrottledRow> {
    let db_name = format!("oncely_bench_{}_throttled_{seq}", env.run_id);
    let prefix = format!("oncely-bench-{}-throttled-{seq}", env.run_id);
    let dir = std::env::temp_dir().join(&prefix);
    super::sys::registry(|r| {
        r.databases.push(db_name.clone());
        r.prefixes.push(prefix.clone());
        r.dirs.push(dir.clone());
    });
    let mut procs: Vec<Worker> = Vec::new();
    let mut sandbox = None;
    let result = measure(
        env,
        spec,
        workers,
        configured,
        &db_name,
        &prefix,
        &dir,
        &mut procs,
        &mut sandbox,
    )
    .await;
    for w in procs {
        fleet::stop(w).await;
    }
    if let Some(s) = sandbox {
        s.shutdown().await;
    }
    let _ = super::delete_topology(&env.amqp_url, &prefix).await;
    let _ = super::drop_database(&env.server_url, &db_name).await;
    if result.is_ok() {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        eprintln!("logs kept in {}", dir.display());
    }
    result
}

#[allow(clippy::too_many_arguments)]
async fn measure(
    env: &FleetEnv,
    spec: &ThrottledSpec,
    workers: usize,
    configured: bool,
    db_name: &str,
    prefix: &str,
    dir: &std::path::Path,
    procs: &mut Vec<Worker>,
    sandbox_slot: &mut Option<oncely_sandbox::Sandbox>,
) -> anyhow::Result<ThrottledRow> {
    let n = spec.intents;
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
    sandbox.set_faults(oncely_sandbox::Faults {
        rate_limits: vec![oncely_sandbox::RateLimitFault {
            provider: Some(oncely_sandbox::Provider::Mail),
            per_second: spec.limit,
            burst: provider_burst(spec.limit),
            retry_after_s: None,
        }],
        ..Default::default()
    })?;
    let base = sandbox.base_url();
    *sandbox_slot = Some(sandbox);

    std::fs::create_dir_all(dir)?;
    let mut config = fleet::fleet_config(env, None, &db_url, prefix, &base)?;
    if configured && let Some(ProviderConfig::Http(mail)) = config.providers.get_mut("mail") {
        mail.rate_limit = Some(RateLimitConfig {
            burst: Some(provider_burst(spec.limit)),
            ..RateLimitConfig::per_second(spec.limit)
        });
    }
    let config_path = dir.join("oncely.toml");
    std::fs::write(&config_path, config.to_toml()?)?;
    let conn = topology::connect(&config.broker, "oncely-bench").await?;
    let channel = conn.create_channel().await?;
    let topo = Topology::new(&config.broker);
    topo.declare(&channel, &ACTIONS).await?;
    for i in 0..workers {
        procs.push(fleet::spawn(env, &config_path, dir, i)?);
    }
    fleet::wait_consuming(&channel, &topo, workers, procs).await?;
    procs.push(fleet::spawn_program(
        env,
        &env.worker_bin,
        &config_path,
        &dir.join("reconciler.log"),
        &["reconcile"],
    )?);

    let secret = KeyRing::new(env.secret.clone().into_bytes())?;
    let producer = Arc::new(Producer::connect(&config, secret).await?);
    let workload = Workload::natural();
    // Every third intent of the workload is an email.
    let intents: Vec<Intent> = (0..n).map(|i| workload.intent(3 * i)).collect();
    let cpu = CpuSampler::start();
    let cpu_started = Instant::now();
    let journal = Journal::new(pool.clone());
    let t0 = journal.clock().await?;
    fleet::enqueue(producer.clone(), intents, None, 4).await?;
    let mut last = (0i64, Instant::now());
    let mut shown = Instant::now();
    let (succeeded, failed_final) = loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let counts = journal.count_by_status().await?;
        let get = |s: &str| counts.iter().find(|(k, _)| k == s).map_or(0, |(_, c)| *c);
        let (ok, failed) = (get("succeeded"), get("failed_final"));
        if shown.elapsed() >= Duration::from_secs(5) {
            shown = Instant::now();
            let budget = journal.budgets().await?;
            let mail = budget.iter().find(|b| b.provider == "mail");
            eprintln!(
                "  {:>5.1} s: {}; mail rate in force {}",
                cpu_started.elapsed().as_secs_f64(),
                fleet::statuses(&journal).await,
                mail.and_then(|b| b.rate)
                    .map_or("unlimited".into(), |r| format!("{r:.1}/s"))
            );
        }
        if (ok + failed) as usize >= n {
            break (ok, failed);
        }
        if ok + failed > last.0 {
            last = (ok + failed, Instant::now());
        } else if last.1.elapsed() > STALL {
            anyhow::bail!(
                "no progress for {} s (journal: {})",
                STALL.as_secs(),
                fleet::statuses(&journal).await
            );
        }
        for w in procs.iter_mut() {
            if let Some(status) = w.child.try_wait()? {
                anyhow::bail!(
                    "process {} exited ({status}):\n{}",
                    w.pid,
                    fleet::tail(&w.log)
                );
            }
        }
    };
    let pids: Vec<u32> = procs.iter().map(|w| w.pid).collect();
    let cpu = cpu.finish(&pids);
    let t_end: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT max(updated_at) FROM agent_operations")
            .fetch_one(&pool)
            .await?;
    let seconds = (t_end - t0).num_microseconds().unwrap_or(0) as f64 / 1e6;
    let sandbox = sandbox_slot
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("sandbox"))?;
    let effects = sandbox.effects();
    let stats = sandbox.stats();
    drop(producer);
    pool.close().await;
    oncely_core::amqp::close(&conn, "bench", "bench done").await;
    Ok(ThrottledRow {
        mode: if configured {
            "configured"
        } else {
            "429s only"
        },
        workers,
        intents: n,
        limit_per_s: spec.limit,
        seconds,
        drain_ratio: seconds / (n as f64 / spec.limit),
        succeeded,
        failed_final,
        answered_429: stats.rate_limited_429,
        share_429: stats.rate_limited_429 as f64 / n as f64,
        duplicates: effects.duplicates().count(),
        cpu_ms_per_action: cpu.workers * seconds * 1000.0 / n as f64,
    })
}

/// The table.
pub fn print(rows: &[ThrottledRow]) {
    println!(
        "{:<11} {:>7} {:>7} {:>8} {:>9} {:>7} {:>7} {:>9} {:>6} {:>8} {:>6} {:>9}",
        "mode",
        "workers",
        "N",
        "limit/s",
        "drain s",
        "N/R s",
        "ratio",
        "succeeded",
        "failed",
        "429s",
        "429/N",
        "cpu ms/a"
    );
    for r in rows {
        println!(
            "{:<11} {:>7} {:>7} {:>8.0} {:>9.1} {:>7.1} {:>7.2} {:>9} {:>6} {:>8} {:>6.3} {:>9.3}",
            r.mode,
            r.workers,
            r.intents,
            r.limit_per_s,
            r.seconds,
            r.intents as f64 / r.limit_per_s,
            r.drain_ratio,
            r.succeeded,
            r.failed_final,
            r.answered_429,
            r.share_429,
            r.cpu_ms_per_action
        );
    }
    let dups: usize = rows.iter().map(|r| r.duplicates).sum();
    println!("keys with more than one effect at the provider: {dups}");
}
