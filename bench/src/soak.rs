//! `--soak MINUTES`: the fleet through the gateway at a steady pace for a long time, and
//! once a minute every process's resident memory and the minute's latencies — to show
//! that nothing grows with time (docs/performance.md "Soak").
//!
//! One run: a fresh database, the in-process sandbox, `--fleet` workers and one gateway.
//! Agents on [`HTTP_CONNECTIONS`] keep-alive connections send intent *i* at
//! `start + i / rate` (open loop: a slow answer delays only its own connection's next
//! request, and the connection catches up). The pace is `--paced-at`, or half of the
//! full-load rate measured first through the gateway. Each minute's intents are looked
//! up in the journal one minute later: recorded → succeeded p50 / p99 of the intents
//! *sent* in that minute. At the end: one effect per key at the sandbox, or the run fails.

use super::fleet::{self, FleetEnv, FleetSpec, HTTP_CONNECTIONS};
use super::intents::ACTIONS;
use super::sys;
use oncely_core::db::{self, PoolSettings};
use oncely_core::journal::Journal;
use oncely_core::topology::{self, Topology};
use serde::Serialize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One minute's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Minute {
    /// Minutes since the start (1 = the first minute).
    pub minute: u32,
    /// Intents sent in that minute.
    pub sent: usize,
    /// Of those, not `succeeded` a minute after their minute ended.
    pub late: usize,
    /// Recorded → succeeded of that minute's intents (ms).
    pub p50_ms: f64,
    /// 99th percentile (ms).
    pub p99_ms: f64,
    /// `VmRSS` of the gateway at the minute's end (MiB).
    pub gateway_rss_mib: f64,
    /// `VmRSS` of each worker (MiB).
    pub worker_rss_mib: Vec<f64>,
    /// `VmRSS` of the reconciler (MiB).
    pub reconciler_rss_mib: f64,
    /// `VmRSS` of the bench process: the agents' connections and the sandbox, whose
    /// ledger keeps every key by design (MiB).
    pub bench_rss_mib: f64,
}

/// The soak's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Soak {
    /// Offered rate (intents/s).
    pub rate: f64,
    /// The full-load rate it was derived from, when measured here.
    pub full_load_per_s: Option<f64>,
    /// Workers.
    pub workers: usize,
    /// Per minute.
    pub minutes: Vec<Minute>,
    /// Intents sent in all.
    pub intents: usize,
    /// Provider effects (= intents; no key twice, or the run failed).
    pub effects: u64,
    /// The journal's statuses at the end (`status=count, …`).
    pub statuses: String,
}

/// Least-squares slope of `ys` over their index (per step), and the mean.
fn slope(ys: &[f64]) -> (f64, f64) {
    let n = ys.len() as f64;
    if ys.len() < 2 {
        return (0.0, ys.first().copied().unwrap_or(f64::NAN));
    }
    let mx = (n - 1.0) / 2.0;
    let my = ys.iter().sum::<f64>() / n;
    let (mut num, mut den) = (0.0, 0.0);
    for (i, y) in ys.iter().enumerate() {
        num += (i as f64 - mx) * (y - my);
        den += (i as f64 - mx).powi(2);
    }
    (num / den, my)
}

/// Run the soak for `minutes` and print its table (and JSON with `--json`).
pub(crate) async fn soak(
    args: &super::BenchArgs,
    env: FleetEnv,
    minutes: u32,
) -> anyhow::Result<()> {
    let machine = sys::Machine::read();
    let s = args.settings();
    let (rate, full) = match args.paced_at {
        Some(r) => (r, None),
        None => {
            let n = 10_000;
            eprintln!(
                "full load through the gateway: {n} intents, {} workers",
                s.fleet
            );
            let full = fleet::run(
                &FleetEnv {
                    intents: n,
                    ..env.clone()
                },
                FleetSpec {
                    workers: s.fleet,
                    latency_ms: 0,
                    pace: None,
                    paced_percent: None,
                    in_flight: None,
                    gateway: true,
                    vacuumed_sweeps: false,
                },
                0,
            )
            .await?;
            eprintln!("      {:.0} actions/s", full.actions_per_s);
            (full.actions_per_s / 2.0, Some(full.actions_per_s))
        }
    };
    eprintln!(
        "soak: {minutes} min through the gateway at {rate:.0} intents/s, {} workers",
        s.fleet
    );
    let db_name = format!("oncely_bench_{}_soak", env.run_id);
    let prefix = format!("oncely-bench-{}-soak", env.run_id);
    let dir = std::env::temp_dir().join(&prefix);
    sys::registry(|r| {
        r.databases.push(db_name.clone());
        r.prefixes.push(prefix.clone());
        r.dirs.push(dir.clone());
    });
    let mut procs = Vec::new();
    let mut sandbox = None;
    let result = run(
        &env,
        s.fleet,
        rate,
        minutes,
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
    if let Err(e) = super::delete_topology(&env.amqp_url, &prefix).await {
        eprintln!("warning: could not delete the queues of {prefix}: {e}");
    }
    match &result {
        Ok(_) => {
            if let Err(e) = super::drop_database(&env.server_url, &db_name).await {
                eprintln!("warning: could not drop database {db_name}: {e}");
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
        Err(_) => eprintln!(
            "logs kept in {}, the database {db_name} kept",
            dir.display()
        ),
    }
    sys::registry(|r| {
        r.databases.retain(|d| d != &db_name);
        r.prefixes.retain(|p| p != &prefix);
        r.dirs.retain(|d| d != &dir);
    });
    let mut soak = result?;
    soak.full_load_per_s = full;
    print(&soak, &machine);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&soak)?);
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn run(
    env: &FleetEnv,
    workers: usize,
    rate: f64,
    minutes: u32,
    db_name: &str,
    prefix: &str,
    dir: &std::path::Path,
    procs: &mut Vec<fleet::Worker>,
    sandbox_slot: &mut Option<oncely_sandbox::Sandbox>,
) -> anyhow::Result<Soak> {
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
    let base = sandbox.base_url();
    *sandbox_slot = Some(sandbox);
    std::fs::create_dir_all(dir)?;
    let config = fleet::fleet_config(env, None, &db_url, prefix, &base)?;
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
    // The reconciler (and its sweeper), as a real fleet runs one: what the first pass
    // leaves (a publish to retry, an `unknown` to look up) it settles.
    let reconciler = fleet::spawn_program(
        env,
        &env.worker_bin,
        &config_path,
        &dir.join("reconciler.log"),
        &["reconcile"],
    )?;
    let reconciler_pid = reconciler.pid;
    procs.push(reconciler);
    let (addr, gw) = fleet::start_gateway(env, &config_path, dir).await?;
    let gateway_pid = gw.pid;
    procs.push(gw);

    // Keys by the minute they were sent in.
    let by_minute: Arc<Mutex<Vec<Vec<String>>>> = Arc::new(Mutex::new(Vec::new()));
    let total = (rate * 60.0 * f64::from(minutes)).round() as usize;
    let started = Instant::now();
    let mut lanes = tokio::task::JoinSet::<anyhow::Result<()>>::new();
    for lane in 0..HTTP_CONNECTIONS {
        let (workload, first, by_minute) = (env.workload, env.first_intent, by_minute.clone());
        lanes.spawn(async move {
            let mut c =
                oncely_sandbox::http::Conn::connect(addr, Some(fleet::GATEWAY_TOKEN)).await?;
            for i in (lane..total).step_by(HTTP_CONNECTIONS) {
                let at = Duration::from_secs_f64(i as f64 / rate);
                tokio::time::sleep_until((started + at).into()).await;
                let a = fleet::post_intent(&mut c, &workload.intent(first + i)).await?;
                let key = a.json["key"].as_str().unwrap_or_default().to_owned();
                let minute = (at.as_secs() / 60) as usize;
                let mut m = by_minute.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
                if m.len() <= minute {
                    m.resize(minute + 1, Vec::new());
                }
                m[minute].push(key);
            }
            Ok(())
        });
    }

    let journal = Journal::new(pool.clone());
    let mut out = Vec::new();
    let self_pid = std::process::id();
    let worker_pids: Vec<u32> = procs
        .iter()
        .map(|w| w.pid)
        .filter(|p| *p != gateway_pid && *p != reconciler_pid)
        .collect();
    let mut memory = None;
    for minute in 1..=minutes + 1 {
        tokio::time::sleep_until((started + Duration::from_secs(60 * u64::from(minute))).into())
            .await;
        for w in procs.iter_mut() {
            if let Some(status) = w.child.try_wait()? {
                anyhow::bail!(
                    "process {} exited ({status}) during the soak:\n{}",
                    w.pid,
                    fleet::tail(&w.log)
                );
            }
        }
        if let Some(done) = lanes.try_join_next() {
            done??;
        }
        // Memory at the end of each minute; the latencies of the minute before, whose
        // intents have had a minute since.
        let rss = |pid: u32| sys::rss_mib(pid).unwrap_or(f64::NAN);
        let now = (
            rss(gateway_pid),
            worker_pids.iter().map(|p| rss(*p)).collect::<Vec<f64>>(),
            rss(reconciler_pid),
            rss(self_pid),
        );
        let Some((gateway_rss_mib, worker_rss_mib, reconciler_rss_mib, bench_rss_mib)) =
            memory.replace(now)
        else {
            continue;
        };
        let keys = by_minute
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?
            .get(minute as usize - 2)
            .cloned()
            .unwrap_or_default();
        let lat = journal.succeeded_latencies(&keys).await?;
        let row = Minute {
            minute: minute - 1,
            sent: keys.len(),
            late: keys.len() - lat.total_ms.len(),
            p50_ms: fleet::percentile(&lat.total_ms, 0.5),
            p99_ms: fleet::percentile(&lat.total_ms, 0.99),
            gateway_rss_mib,
            worker_rss_mib,
            reconciler_rss_mib,
            bench_rss_mib,
        };
        eprintln!(
            "  min {:>3}: {} sent, {} late, p50 {:.1} ms, p99 {:.1} ms, RSS gateway {:.1} workers {} reconciler {:.1} bench {:.1} MiB",
            row.minute,
            row.sent,
            row.late,
            row.p50_ms,
            row.p99_ms,
            row.gateway_rss_mib,
            row.worker_rss_mib
                .iter()
                .map(|r| format!("{r:.1}"))
                .collect::<Vec<_>>()
                .join(" "),
            row.reconciler_rss_mib,
            row.bench_rss_mib
        );
        out.push(row);
    }
    while let Some(done) = lanes.join_next().await {
        done??;
    }
    // Everything sent has its effect, once.
    let deadline = Instant::now() + Duration::from_secs(120);
    let effects = loop {
        let e = sandbox_slot
            .as_ref()
            .map_or(0, |s| s.distinct_effect_keys());
        if e >= total || Instant::now() > deadline {
            break sandbox_slot
                .as_ref()
                .map(|s| s.effects())
                .unwrap_or_default();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let dups = effects.duplicates().count();
    if dups > 0 || effects.keys.len() != total {
        // What became of the intents without an effect: their rows and events, from the
        // database (kept, with the logs, for a closer look).
        let sent: Vec<String> = by_minute
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?
            .iter()
            .flatten()
            .filter(|k| !effects.keys.contains_key(*k))
            .take(20)
            .cloned()
            .collect();
        for k in &sent {
            let key = oncely_core::IdempotencyKey::parse(k)?;
            eprintln!("no effect for {k}: {:?}", journal.get(&key).await?);
            for e in journal.events(&key).await? {
                eprintln!("    {e:?}");
            }
        }
        anyhow::bail!(
            "the sandbox saw {} keys with an effect ({dups} with more than one) for {total} intents \
             (statuses: {}; the database {db_name} is kept)",
            effects.keys.len(),
            fleet::statuses(&journal).await
        );
    }
    let statuses = fleet::statuses(&journal).await;
    pool.close().await;
    oncely_core::amqp::close(&conn, "bench", "soak done").await;
    Ok(Soak {
        statuses,
        rate,
        full_load_per_s: None,
        workers,
        minutes: out,
        intents: total,
        effects: effects.total,
    })
}

/// The table: one row per minute, then each series' slope and mean (minutes 6 onward:
/// the first five are warm-up — allocator arenas, connection pools, the journal's pages —
/// when there are more than ten).
fn print(s: &Soak, machine: &sys::Machine) {
    println!("oncely soak — {}", machine.describe());
    println!(
        "through the gateway at {:.0} intents/s{}, {} workers, {} intents, {} effects (one per key)\n",
        s.rate,
        s.full_load_per_s
            .map(|f| format!(" (half of the full-load {f:.0}/s)"))
            .unwrap_or_default(),
        s.workers,
        s.intents,
        s.effects
    );
    println!("journal at the end: {}\n", s.statuses);
    let workers = s.workers;
    let mut head = format!(
        "{:>4} {:>7} {:>5} {:>8} {:>8} {:>9}",
        "min", "sent", "late", "p50 ms", "p99 ms", "gateway"
    );
    for i in 0..workers {
        head.push_str(&format!(" {:>9}", format!("worker{i}")));
    }
    println!("{head} {:>10} {:>9}   (RSS in MiB)", "reconciler", "bench");
    for m in &s.minutes {
        let mut line = format!(
            "{:>4} {:>7} {:>5} {:>8.1} {:>8.1} {:>9.1}",
            m.minute, m.sent, m.late, m.p50_ms, m.p99_ms, m.gateway_rss_mib
        );
        for r in &m.worker_rss_mib {
            line.push_str(&format!(" {r:>9.1}"));
        }
        println!(
            "{line} {:>10.1} {:>9.1}",
            m.reconciler_rss_mib, m.bench_rss_mib
        );
    }
    // Short soaks (a try-out) keep every minute.
    let warm_up = if s.minutes.len() > 10 { 5 } else { 0 };
    let steady: Vec<&Minute> = s.minutes.iter().filter(|m| m.minute > warm_up).collect();
    let per_hour = |ys: Vec<f64>| {
        let (k, mean) = slope(&ys);
        format!("mean {mean:.1}, slope {:+.2}/h", k * 60.0)
    };
    println!(
        "\nminutes {}–{} (after {warm_up} of warm-up):",
        warm_up + 1,
        s.minutes.last().map_or(0, |m| m.minute)
    );
    println!(
        "  p99 ms:        {}",
        per_hour(steady.iter().map(|m| m.p99_ms).collect())
    );
    println!(
        "  gateway MiB:   {}",
        per_hour(steady.iter().map(|m| m.gateway_rss_mib).collect())
    );
    for i in 0..workers {
        println!(
            "  worker{i} MiB:   {}",
            per_hour(
                steady
                    .iter()
                    .map(|m| m.worker_rss_mib.get(i).copied().unwrap_or(f64::NAN))
                    .collect()
            )
        );
    }
    println!(
        "  reconciler MiB: {}",
        per_hour(steady.iter().map(|m| m.reconciler_rss_mib).collect())
    );
    println!(
        "  bench MiB:     {}  (holds the sandbox's ledger: grows with keys by design)",
        per_hour(steady.iter().map(|m| m.bench_rss_mib).collect())
    );
}

#[cfg(test)]
mod tests {
    #[test]
    fn slope_of_a_line_and_of_a_constant() {
        let (k, mean) = super::slope(&[1.0, 3.0, 5.0, 7.0]);
        assert!((k - 2.0).abs() < 1e-9 && (mean - 4.0).abs() < 1e-9);
        let (k, _) = super::slope(&[5.0; 10]);
        assert_eq!(k, 0.0);
    }
}
