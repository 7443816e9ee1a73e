//! The chaos run (`oncely-chaos`, see `docs/chaos.md`): a whole fleet of real processes
//! — the producer SDK, ≥ 3 `oncely-worker run`, ≥ 2 `oncely-worker reconcile`, the
//! sandbox — under a seeded fault schedule (SIGKILL, fail points, SIGSTOP past the lease,
//! broker connection closes, Postgres backend terminations, provider faults, lookup
//! outages, repeated and conflicting intents); then healed and checked against the
//! sandbox's ground truth and the journal's event trail.
//!
//! Everything random is drawn from [`Rng`] streams derived from one seed, so a run's
//! workload and fault schedule are repeatable (the processes' timing is not).

use crate::fleet::{FAST_RECONCILER, Fleet, FleetOptions, Proc, SECRET, secret};
use crate::private_broker::PrivateBroker;
use futures_util::StreamExt;
use oncely_core::config::Config;
use oncely_core::{Envelope, Intent};
use oncely_producer::{Enqueued, Producer, ProducerError};
use oncely_sandbox::SplitMix64;
use serde_json::{Value, json};
use sqlx::{Connection, PgPool, Row};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::process::Command;

/// The fail points given to fail-point workers (`ONCELY_FAILPOINTS`).
pub const FAILPOINTS: &str = "after_claim=0.02,after_provider=0.02,after_commit=0.02";

/// Provider timeout of the chaos fleet.
const PROVIDER_TIMEOUT: &str = "1s";
/// Lease of every action of the chaos fleet.
const LEASE: &str = "3s";
/// The lease as a duration (SIGSTOP lasts longer than this).
const LEASE_DUR: Duration = Duration::from_secs(3);
/// Lookups that fail or say pending before a person is asked (small: outages end in
/// reviews or settle within seconds).
const MAX_RECONCILE_CHECKS: u32 = 4;
/// Intents per `enqueue_many` call.
const BATCH: usize = 20;
/// The main loop's tick.
const TICK: Duration = Duration::from_millis(100);
/// Log filter of the spawned processes: the runner's debug lines count deliveries.
const PROC_LOG: &str = "info,oncely_worker::runner=debug";

/// The action types, with the provider each goes to.
const ACTIONS: [(&str, &str); 3] = [
    ("email.send", "mail"),
    ("ticket.create", "tickets"),
    ("payment_order.create", "bank"),
];

/// Usage text.
pub const USAGE: &str = "\
oncely-chaos: real processes under a seeded fault schedule, healed, then checked against
the sandbox's ground truth (duplicates, lost, unexpected, mismatches must all be 0).

USAGE: oncely-chaos [--seed N] [--intents N] [--min-kills N] [--duration-secs N]
                    [--heal-secs N] [--workers N] [--reconcilers N] [--nightly]
                    [--no-broker-faults | --private-broker] [--no-build] [--keep-logs] [--self-test]

  --seed N            seed of every random choice (default: from the clock; printed)
  --intents N         distinct intents (default 2000; --nightly 50000)
  --min-kills N       keep SIGKILLing until at least N random kills (default 20; nightly 300)
  --duration-secs N   fault phase length (default 60; nightly 900)
  --heal-secs N       how long healing may take before the run fails (default 180; nightly 900)
  --workers N         `oncely-worker run` processes kept running (default 5, at least 3;
                      workers - 3 of them carry fail points during the fault phase)
  --reconcilers N     `oncely-worker reconcile` processes (default 2, at least 2)
  --nightly           nightly size (the defaults above marked nightly)
  --no-broker-faults  no `rabbitmqctl close_all_connections` (for runs alongside other tests)
  --private-broker    run on a private RabbitMQ node and close its connections only
  --no-build          do not run `cargo build --workspace --bins` first
  --keep-logs         keep the logs, schedule and report even when the run passes
  --self-test         after healing, forge one duplicate, one lost intent, one unexpected
                      effect and one mismatch: the checks must report them (exit 1)

Exit code: 0 all checks passed; 1 a check failed (details printed, logs kept);
2 the run could not be carried out.";

/// A seeded PRNG (SplitMix64, the sandbox's) with the draws the schedule needs.
#[derive(Debug, Clone)]
pub struct Rng(SplitMix64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(SplitMix64::new(seed))
    }

    /// 64 random bits.
    pub fn u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `[0, 1)`.
    pub fn f64(&mut self) -> f64 {
        self.0.next_f64()
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.f64() < p
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.u64() % n as u64) as usize
        }
    }

    /// Uniform in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.u64() % (hi.saturating_sub(lo) + 1)
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.f64()
    }

    /// A duration uniform in `[lo, hi)` seconds.
    pub fn secs(&mut self, lo: f64, hi: f64) -> Duration {
        Duration::from_secs_f64(self.uniform(lo, hi))
    }

    /// Fisher–Yates.
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }
}

/// Where connection faults go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerFaults {
    /// `rabbitmqctl close_all_connections` on the machine's broker (CI: the run is alone).
    Shared,
    /// A private RabbitMQ node for this run; only its connections are closed.
    Private,
    /// No broker faults.
    Off,
}

/// The run's settings.
#[derive(Debug, Clone)]
pub struct Options {
    /// Seed of every random choice.
    pub seed: u64,
    /// Distinct intents.
    pub intents: usize,
    /// Random SIGKILLs at least.
    pub min_kills: u64,
    /// Fault phase length (at least).
    pub duration: Duration,
    /// Longest healing.
    pub heal: Duration,
    /// Workers kept running.
    pub workers: usize,
    /// Reconcilers kept running.
    pub reconcilers: usize,
    /// Broker faults.
    pub broker: BrokerFaults,
    /// Nightly size.
    pub nightly: bool,
    /// Build the binaries first.
    pub build: bool,
    /// Forge one finding of each kind after healing (the checks must fail).
    pub self_test: bool,
    /// Keep the logs even when the run passes.
    pub keep_logs: bool,
}

impl Options {
    /// Parse the command line (without the program name). `Ok(None)`: `--help`.
    pub fn from_args(args: &[String]) -> Result<Option<Options>, String> {
        let mut seed = None;
        let mut intents = None;
        let mut min_kills = None;
        let mut duration = None;
        let mut heal = None;
        let mut workers = 5usize;
        let mut reconcilers = 2usize;
        let mut nightly = false;
        let mut broker = BrokerFaults::Shared;
        let mut build = true;
        let mut self_test = false;
        let mut keep_logs = false;
        let mut it = args.iter();
        fn num<T: std::str::FromStr>(flag: &str, v: Option<&String>) -> Result<T, String> {
            v.ok_or_else(|| format!("{flag} needs a value"))?
                .parse()
                .map_err(|_| format!("{flag}: not a number"))
        }
        while let Some(a) = it.next() {
            match a.as_str() {
                "--seed" => seed = Some(num::<u64>(a, it.next())?),
                "--intents" => intents = Some(num::<usize>(a, it.next())?),
                "--min-kills" => min_kills = Some(num::<u64>(a, it.next())?),
                "--duration-secs" => duration = Some(num::<u64>(a, it.next())?),
                "--heal-secs" => heal = Some(num::<u64>(a, it.next())?),
                "--workers" => workers = num(a, it.next())?,
                "--reconcilers" => reconcilers = num(a, it.next())?,
                "--nightly" => nightly = true,
                "--no-broker-faults" => broker = BrokerFaults::Off,
                "--private-broker" => broker = BrokerFaults::Private,
                "--no-build" => build = false,
                "--self-test" => self_test = true,
                "--keep-logs" => keep_logs = true,
                "-h" | "--help" => return Ok(None),
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        if workers < 3 {
            return Err("--workers must be at least 3".into());
        }
        if reconcilers < 2 {
            return Err("--reconcilers must be at least 2".into());
        }
        let seed = seed.unwrap_or_else(|| {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            (nanos ^ (u64::from(std::process::id()) << 32)) % 1_000_000_000
        });
        let (d_intents, d_kills, d_duration, d_heal) = if nightly {
            (50_000, 300, 900, 900)
        } else {
            (2_000, 20, 60, 180)
        };
        let intents = intents.unwrap_or(d_intents);
        if intents < 20 {
            return Err("--intents must be at least 20".into());
        }
        Ok(Some(Options {
            seed,
            intents,
            min_kills: min_kills.unwrap_or(d_kills),
            duration: Duration::from_secs(duration.unwrap_or(d_duration)),
            heal: Duration::from_secs(heal.unwrap_or(d_heal)),
            workers,
            reconcilers,
            broker,
            nightly,
            build,
            self_test,
            keep_logs,
        }))
    }
}

/// What a run concluded.
#[derive(Debug)]
pub struct Outcome {
    /// All checks passed.
    pub passed: bool,
    /// The printed figures.
    pub report: String,
    /// Where the logs were kept (failed runs).
    pub kept: Option<PathBuf>,
}

// ───────────────────────────── the workload ─────────────────────────────

fn action_of(i: usize) -> usize {
    match i % 10 {
        0..=3 => 0,
        4..=6 => 1,
        _ => 2,
    }
}

/// Intent `i` of run `run`; `variant` 0 is the real one, 1 the conflicting payload.
fn intent(run: u64, i: usize, variant: u64) -> Intent {
    let (action, _) = ACTIONS[action_of(i)];
    let payload = match action_of(i) {
        0 => {
            json!({"to": format!("user{i}@example.test"), "subject": format!("chaos {run}"), "n": i, "variant": variant})
        }
        1 => {
            json!({"title": format!("chaos ticket {i}"), "queue": "support", "n": i, "variant": variant})
        }
        _ => {
            json!({"account_id": format!("acct-{}", i % 97), "amount_minor": 100 + i as u64 + variant * 7,
                    "currency": "EUR", "business_reference": format!("chaos-{run}-{i}")})
        }
    };
    Intent::from_json(json!({
        "action_type": action,
        "workflow_id": format!("chaos-{run}-{}", i / 50),
        "step": action.replace('.', "_"),
        "business_object": format!("object-{i}"),
        "revision": 1,
        "payload": payload,
    }))
    .unwrap_or_else(|e| panic!("chaos intent {i}: {e}"))
}

/// One submission of the producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Item {
    /// The intent, first time.
    Original(usize),
    /// The same intent again (an agent re-running).
    Repeat(usize),
    /// Same key, another payload, through the SDK: must be refused at recording.
    ConflictSdk(usize),
    /// Same key, another payload, published straight to the broker: the worker must refuse it.
    ConflictRaw(usize),
}

/// Batches of submissions: every intent once, 10% repeated in a later batch, a few
/// conflicting payloads under existing keys.
fn plan(n: usize, rng: &mut Rng) -> (Vec<Vec<Item>>, usize, usize) {
    let nb = n.div_ceil(BATCH);
    let mut batches: Vec<Vec<Item>> = (0..nb)
        .map(|b| {
            (b * BATCH..((b + 1) * BATCH).min(n))
                .map(Item::Original)
                .collect()
        })
        .collect();
    let mut order: Vec<usize> = (0..n).collect();
    rng.shuffle(&mut order);
    let repeats = n / 10;
    let conflicts = (n / 250).max(6);
    let spread = (nb / 4).max(2);
    let later = |i: usize, rng: &mut Rng, batches: &mut Vec<Vec<Item>>, item: Item| {
        let target = i / BATCH + 1 + rng.below(spread);
        while batches.len() <= target {
            batches.push(Vec::new());
        }
        batches[target].push(item);
    };
    for &i in &order[..repeats] {
        later(i, rng, &mut batches, Item::Repeat(i));
    }
    for (k, &i) in order[repeats..repeats + conflicts].iter().enumerate() {
        let item = if k % 2 == 0 {
            Item::ConflictSdk(i)
        } else {
            Item::ConflictRaw(i)
        };
        later(i, rng, &mut batches, item);
    }
    (batches, repeats, conflicts)
}

/// What the producer did.
#[derive(Debug, Default)]
struct ProducerReport {
    /// Per intent: recorded in the journal (enqueued, duplicate, or recorded but unpublished).
    recorded: Vec<bool>,
    new: u64,
    duplicate_after_retry: u64,
    publish_failed: u64,
    batch_errors: u64,
    timeouts: u64,
    reconnects: u64,
    repeats: u64,
    repeat_status: BTreeMap<String, u64>,
    conflicts_sdk: u64,
    conflicts_sdk_refused: u64,
    conflicts_raw: u64,
    conflicts_raw_published: u64,
    anomalies: Vec<String>,
    fatal: Option<String>,
    seconds: f64,
}

async fn connect_producer(config: &Config, report: &mut ProducerReport) -> Option<Producer> {
    let start = Instant::now();
    loop {
        match tokio::time::timeout(Duration::from_secs(15), Producer::connect(config, secret()))
            .await
        {
            Ok(Ok(p)) => return Some(p),
            Ok(Err(e)) if start.elapsed() > Duration::from_secs(120) => {
                report.fatal = Some(format!("producer cannot connect: {e}"));
                return None;
            }
            Err(_) if start.elapsed() > Duration::from_secs(120) => {
                report.fatal = Some("producer connect timed out".into());
                return None;
            }
            _ => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// Enqueue the plan, paced over `span`, surviving connection faults.
async fn produce(
    config: Config,
    run: u64,
    n: usize,
    batches: Vec<Vec<Item>>,
    span: Duration,
    progress: Arc<AtomicU64>,
) -> ProducerReport {
    let mut report = ProducerReport {
        recorded: vec![false; n],
        ..ProducerReport::default()
    };
    let start = Instant::now();
    let pace = span.div_f64(batches.len().max(1) as f64);
    let Some(mut producer) = connect_producer(&config, &mut report).await else {
        return report;
    };
    for (b, batch) in batches.iter().enumerate() {
        tokio::time::sleep_until((start + pace.mul_f64(b as f64)).into()).await;
        let mut todo: Vec<Item> = batch
            .iter()
            .copied()
            .filter(|it| !matches!(it, Item::ConflictRaw(_)))
            .collect();
        let mut reconnect = false;
        let mut tries = 0u32;
        while !todo.is_empty() {
            tries += 1;
            if tries > 200 {
                report.fatal = Some(format!("batch {b} could not be enqueued in 200 tries"));
                report.seconds = start.elapsed().as_secs_f64();
                return report;
            }
            let intents: Vec<Intent> = todo
                .iter()
                .map(|it| match *it {
                    Item::Original(i) | Item::Repeat(i) => intent(run, i, 0),
                    Item::ConflictSdk(i) | Item::ConflictRaw(i) => intent(run, i, 1),
                })
                .collect();
            let results =
                match tokio::time::timeout(Duration::from_secs(20), producer.enqueue_many(intents))
                    .await
                {
                    Ok(Ok(r)) => r,
                    Ok(Err(_)) => {
                        report.batch_errors += 1;
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        report.reconnects += 1;
                        match connect_producer(&config, &mut report).await {
                            Some(p) => producer = p,
                            None => return report,
                        }
                        continue;
                    }
                    Err(_) => {
                        report.timeouts += 1;
                        report.reconnects += 1;
                        match connect_producer(&config, &mut report).await {
                            Some(p) => producer = p,
                            None => return report,
                        }
                        continue;
                    }
                };
            let mut again = Vec::new();
            for (item, result) in todo.iter().zip(results) {
                match (*item, result) {
                    (Item::Original(i), Ok(Enqueued::Enqueued { .. })) => {
                        report.new += 1;
                        report.recorded[i] = true;
                    }
                    (Item::Original(i), Ok(Enqueued::Duplicate { .. })) => {
                        // A retried batch whose first try recorded it.
                        report.duplicate_after_retry += 1;
                        report.recorded[i] = true;
                    }
                    (Item::Original(i) | Item::Repeat(i), Err(ProducerError::Publish(_))) => {
                        report.publish_failed += 1;
                        reconnect = true;
                        if matches!(item, Item::Original(_)) {
                            report.recorded[i] = true;
                        } else {
                            report.repeats += 1;
                            *report
                                .repeat_status
                                .entry("recorded_publish_failed".into())
                                .or_default() += 1;
                        }
                    }
                    (Item::Repeat(_), Ok(Enqueued::Duplicate { status, .. })) => {
                        report.repeats += 1;
                        *report
                            .repeat_status
                            .entry(status.as_str().to_owned())
                            .or_default() += 1;
                    }
                    (Item::ConflictSdk(_), Ok(Enqueued::Conflict { .. })) => {
                        report.conflicts_sdk += 1;
                        report.conflicts_sdk_refused += 1;
                    }
                    (Item::ConflictSdk(i), Err(ProducerError::Publish(_))) => {
                        report.conflicts_sdk += 1;
                        report.anomalies.push(format!(
                            "conflicting payload for intent {i} was recorded and published by the SDK"
                        ));
                    }
                    (_, Err(_)) => again.push(*item),
                    (item, Ok(other)) => {
                        if let Item::ConflictSdk(_) = item {
                            report.conflicts_sdk += 1;
                        }
                        if let Item::Repeat(_) = item {
                            report.repeats += 1;
                        }
                        report
                            .anomalies
                            .push(format!("{item:?} answered {other:?} by the producer"));
                    }
                }
            }
            todo = again;
            if !todo.is_empty() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        progress.store(
            report.recorded.iter().filter(|r| **r).count() as u64,
            Ordering::Relaxed,
        );
        // Conflicting payloads straight to the broker, for keys recorded by now.
        for item in batch {
            let Item::ConflictRaw(i) = *item else {
                continue;
            };
            report.conflicts_raw += 1;
            let env = match intent(run, i, 1).seal(&secret()) {
                Ok(e) => e,
                Err(e) => {
                    report.anomalies.push(format!("sealing conflict {i}: {e}"));
                    continue;
                }
            };
            for _ in 0..10 {
                let ok = match producer.publish_envelope(&env).await {
                    Ok(p) => p.confirmed().await.is_ok(),
                    Err(_) => false,
                };
                if ok {
                    report.conflicts_raw_published += 1;
                    break;
                }
                report.reconnects += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
                match connect_producer(&config, &mut report).await {
                    Some(p) => producer = p,
                    None => return report,
                }
            }
        }
        if reconnect {
            report.reconnects += 1;
            match connect_producer(&config, &mut report).await {
                Some(p) => producer = p,
                None => return report,
            }
        }
    }
    report.seconds = start.elapsed().as_secs_f64();
    report
}

// ───────────────────────────── the processes ─────────────────────────────

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Worker,
    Reconciler,
}

impl Role {
    fn arg(self) -> &'static str {
        match self {
            Role::Worker => "run",
            Role::Reconciler => "reconcile",
        }
    }
}

#[derive(Debug)]
struct Member {
    n: usize,
    pid: u32,
    role: Role,
    failpoints: bool,
    proc: Proc,
    stopped_until: Option<Instant>,
    killed: bool,
    terminating: bool,
}

impl Member {
    fn active(&self) -> bool {
        self.stopped_until.is_none() && !self.terminating
    }
}

/// Counters of what the schedule did (some shared with background tasks).
#[derive(Debug, Default)]
struct Tally {
    kills_sent: u64,
    killed_workers: u64,
    killed_reconcilers: u64,
    failpoints: BTreeMap<String, u64>,
    stops_workers: u64,
    stops_reconcilers: u64,
    stops_holding: u64,
    stopped_leases: u64,
    unexpected: Vec<String>,
    spawned: u64,
    clean_exits: u64,
    min_active_workers: Option<usize>,
    broker_rounds: Arc<AtomicU64>,
    broker_failed: Arc<AtomicU64>,
    pg_rounds: u64,
    pg_terminated: u64,
    pg_failed: u64,
    fault_configs: u64,
    fault_config_failed: u64,
    /// What the schedule did, when (UTC, as the journal's events): `schedule.log`.
    schedule: Vec<String>,
}

impl Tally {
    fn note(&mut self, what: impl std::fmt::Display) {
        self.schedule.push(format!(
            "{} {what}",
            chrono::Utc::now().format("%H:%M:%S%.3f")
        ));
    }
}

#[derive(Debug)]
struct Crew<'a> {
    fleet: &'a Fleet,
    bin: PathBuf,
    seed: u64,
    members: Vec<Member>,
    next: usize,
    tally: Tally,
}

/// Spawn `oncely-worker <role>` with the fleet's config (the harness's `Fleet::spawn`
/// looks for the binary next to a test executable, not next to this one).
fn spawn_proc(
    fleet: &Fleet,
    bin: &Path,
    role: Role,
    n: usize,
    env: &[(&str, String)],
) -> anyhow::Result<Proc> {
    let log = fleet.dir.join(format!("{}-{n}.log", role.arg()));
    let file = std::fs::File::create(&log)?;
    let child = Command::new(bin)
        .arg("--config")
        .arg(&fleet.config_path)
        .arg(role.arg())
        .env("ONCELY_KEY_SECRET", SECRET)
        .env("ONCELY_LOG_FORMAT", "json")
        .env("RUST_LOG", PROC_LOG)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(file)
        .kill_on_drop(true)
        .spawn()?;
    Ok(Proc { child, log })
}

/// The fail point a process's log says it aborted at.
fn failpoint_of(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let tag = "\"failpoint\":\"";
    text.rfind(tag)
        .map(|at| {
            text[at + tag.len()..]
                .chars()
                .take_while(|c| *c != '"')
                .collect()
        })
        .unwrap_or_else(|| "unknown_point".into())
}

fn last_line(log: &Path) -> String {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .chars()
        .take(400)
        .collect()
}

impl Crew<'_> {
    fn spawn(&mut self, role: Role, failpoints: bool) -> anyhow::Result<()> {
        let n = self.next;
        self.next += 1;
        let env: Vec<(&str, String)> = if failpoints {
            vec![
                ("ONCELY_FAILPOINTS", FAILPOINTS.to_owned()),
                (
                    "ONCELY_FAILPOINT_SEED",
                    (self.seed.wrapping_mul(1_000_003) ^ n as u64).to_string(),
                ),
            ]
        } else {
            Vec::new()
        };
        let proc = spawn_proc(self.fleet, &self.bin, role, n, &env)?;
        self.tally.spawned += 1;
        self.tally.note(format_args!(
            "spawn {}-{n} (pid {}){}",
            role.arg(),
            proc.pid(),
            if failpoints { " with fail points" } else { "" }
        ));
        self.members.push(Member {
            n,
            pid: proc.pid(),
            role,
            failpoints,
            proc,
            stopped_until: None,
            killed: false,
            terminating: false,
        });
        Ok(())
    }

    /// Collect exited processes and classify how they ended.
    fn reap(&mut self) {
        let mut i = 0;
        while i < self.members.len() {
            let status = match self.members[i].proc.child.try_wait() {
                Ok(Some(s)) => s,
                Ok(None) => {
                    i += 1;
                    continue;
                }
                Err(e) => {
                    self.tally.unexpected.push(format!(
                        "{}-{}: wait failed: {e}",
                        self.members[i].role.arg(),
                        self.members[i].n
                    ));
                    self.members.swap_remove(i);
                    continue;
                }
            };
            let m = self.members.swap_remove(i);
            let name = format!("{}-{} (pid {})", m.role.arg(), m.n, m.pid);
            self.tally.note(format_args!("exit {name}: {status}"));
            match (status.signal(), status.code()) {
                (Some(9), _) if m.killed => match m.role {
                    Role::Worker => self.tally.killed_workers += 1,
                    Role::Reconciler => self.tally.killed_reconcilers += 1,
                },
                (Some(6), _) if m.failpoints => {
                    let point = failpoint_of(&m.proc.log);
                    self.tally
                        .note(format_args!("fail point {point}: {name} aborted"));
                    *self.tally.failpoints.entry(point).or_default() += 1;
                }
                // SIGTERM before its handler was installed ends it by the signal.
                (None, Some(0)) | (Some(15), _) if m.terminating && !m.killed => {
                    self.tally.clean_exits += 1
                }
                (sig, code) => self.tally.unexpected.push(format!(
                    "{name} ended by itself (signal {sig:?}, code {code:?}); last log line: {}",
                    last_line(&m.proc.log)
                )),
            }
        }
    }

    fn active(&self, role: Role) -> usize {
        self.members
            .iter()
            .filter(|m| m.role == role && m.active())
            .count()
    }

    fn note_min(&mut self) {
        let a = self.active(Role::Worker);
        let min = self.tally.min_active_workers.get_or_insert(a);
        *min = (*min).min(a);
    }

    /// Keep `workers` workers and `reconcilers` reconcilers running (not stopped, not
    /// stopping); during the fault phase half the workers carry fail points.
    fn maintain(
        &mut self,
        workers: usize,
        reconcilers: usize,
        failpoints: bool,
    ) -> anyhow::Result<()> {
        while self.active(Role::Worker) < workers {
            let fp = self
                .members
                .iter()
                .filter(|m| m.role == Role::Worker && m.active() && m.failpoints)
                .count();
            // Fail-point workers abort on their own: at most `workers - 3` of them, so
            // at least 3 plain workers are always running.
            self.spawn(Role::Worker, failpoints && fp < (workers - 3).max(1))?;
        }
        while self.active(Role::Reconciler) < reconcilers {
            self.spawn(Role::Reconciler, false)?;
        }
        Ok(())
    }

    fn pick(&self, rng: &mut Rng, role: Role) -> Option<usize> {
        let candidates: Vec<usize> = self
            .members
            .iter()
            .enumerate()
            .filter(|(_, m)| m.role == role && m.active() && !m.killed)
            .map(|(i, _)| i)
            .collect();
        (!candidates.is_empty()).then(|| candidates[rng.below(candidates.len())])
    }

    /// SIGKILL a random worker (sometimes a reconciler). False if none could be spared.
    /// The replacement is started before the kill, so a kill never leaves fewer than
    /// `workers` running.
    fn kill_random(
        &mut self,
        rng: &mut Rng,
        workers: usize,
        reconcilers: usize,
    ) -> anyhow::Result<bool> {
        let role = if rng.chance(0.2) {
            Role::Reconciler
        } else {
            Role::Worker
        };
        let enough = match role {
            Role::Worker => self.active(Role::Worker) >= workers,
            Role::Reconciler => self.active(Role::Reconciler) >= reconcilers,
        };
        if !enough {
            return Ok(false);
        }
        let Some(i) = self.pick(rng, role) else {
            return Ok(false);
        };
        // No longer active: maintain() starts its replacement first.
        self.members[i].killed = true;
        self.members[i].terminating = true;
        self.maintain(workers, reconcilers, true)?;
        let _ = self.members[i].proc.child.start_kill();
        let m = &self.members[i];
        let what = format!("SIGKILL {}-{} (pid {})", m.role.arg(), m.n, m.pid);
        self.tally.note(what);
        self.tally.kills_sent += 1;
        Ok(true)
    }

    /// SIGSTOP a random worker (sometimes a reconciler) for longer than its lease;
    /// preferably a worker holding leases (`busy`: pid → executing operations).
    fn stop_random(&mut self, rng: &mut Rng, workers: usize, busy: &HashMap<u32, i64>) {
        if self.members.iter().any(|m| m.stopped_until.is_some()) {
            return;
        }
        let role = if rng.chance(0.25) {
            Role::Reconciler
        } else {
            Role::Worker
        };
        if role == Role::Worker && self.active(Role::Worker) < workers {
            return;
        }
        let holding: Vec<usize> = self
            .members
            .iter()
            .enumerate()
            .filter(|(_, m)| {
                m.role == role && m.active() && busy.get(&m.proc.pid()).is_some_and(|n| *n > 0)
            })
            .map(|(i, _)| i)
            .collect();
        let i = if role == Role::Worker && !holding.is_empty() {
            holding[rng.below(holding.len())]
        } else {
            let Some(i) = self.pick(rng, role) else {
                return;
            };
            i
        };
        let until = Instant::now() + LEASE_DUR + rng.secs(0.5, 3.0);
        let m = &mut self.members[i];
        m.proc.signal("STOP");
        m.stopped_until = Some(until);
        let held = busy.get(&m.proc.pid()).copied().unwrap_or(0);
        let what = format!(
            "SIGSTOP {}-{} (pid {}) holding {held} leases, until +{:.1}s",
            m.role.arg(),
            m.n,
            m.pid,
            (until - Instant::now()).as_secs_f64()
        );
        self.tally.note(what);
        match role {
            Role::Worker => {
                self.tally.stops_workers += 1;
                if held > 0 {
                    self.tally.stops_holding += 1;
                    self.tally.stopped_leases += held as u64;
                }
            }
            Role::Reconciler => self.tally.stops_reconcilers += 1,
        }
    }

    /// SIGCONT what is due (or everything).
    fn cont(&mut self, all: bool) {
        let now = Instant::now();
        for m in &mut self.members {
            if let Some(until) = m.stopped_until
                && (all || until <= now)
            {
                m.proc.signal("CONT");
                m.stopped_until = None;
                self.tally.note(format_args!(
                    "SIGCONT {}-{} (pid {})",
                    m.role.arg(),
                    m.n,
                    m.pid
                ));
            }
        }
    }

    /// Stop every process gracefully (SIGTERM), then SIGKILL what is left after `grace`.
    async fn stop_all(&mut self, grace: Duration) {
        self.cont(true);
        for m in &mut self.members {
            if !m.terminating {
                m.proc.signal("TERM");
                m.terminating = true;
            }
        }
        let deadline = Instant::now() + grace;
        while !self.members.is_empty() && Instant::now() < deadline {
            self.reap();
            tokio::time::sleep(TICK).await;
        }
        for m in &mut self.members {
            self.tally.unexpected.push(format!(
                "{}-{} did not stop within {grace:?} of SIGTERM; killed",
                m.role.arg(),
                m.n
            ));
            let _ = m.proc.child.start_kill();
            let _ = m.proc.child.wait().await;
        }
        self.members.clear();
    }
}

// ───────────────────────────── faults ─────────────────────────────

/// A random provider-fault rule set.
fn fault_rules(rng: &mut Rng) -> Vec<Value> {
    let providers = ["mail", "tickets", "bank"];
    let mut rules = Vec::new();
    let mut rule = |rng: &mut Rng, mut r: Value| {
        if rng.chance(0.5) {
            r["provider"] = json!(providers[rng.below(3)]);
        }
        rules.push(r);
    };
    if rng.chance(0.8) {
        let r = json!({"mode": "accept_then_timeout", "rate": rng.uniform(0.01, 0.05), "hold_ms": rng.between(1200, 3000)});
        rule(rng, r);
    }
    if rng.chance(0.8) {
        let r = json!({"mode": "accept_then_reset", "rate": rng.uniform(0.01, 0.05)});
        rule(rng, r);
    }
    if rng.chance(0.8) {
        let status = [500, 502, 503, 429][rng.below(4)];
        let r = json!({"mode": "error_before_commit", "rate": rng.uniform(0.02, 0.08), "status": status});
        rule(rng, r);
    }
    if rng.chance(0.3) {
        let r = json!({"mode": "reject", "rate": rng.uniform(0.002, 0.01)});
        rule(rng, r);
    }
    if rng.chance(0.6) {
        let r = json!({"mode": "latency", "rate": rng.uniform(0.02, 0.10), "latency_ms": rng.between(200, 1800)});
        rule(rng, r);
    }
    rng.shuffle(&mut rules);
    rules
}

/// The whole sandbox fault config.
fn fault_config(rng: &mut Rng, rules: &[Value], lookup_off: &[&str]) -> Value {
    let latency = if rng.chance(0.3) {
        rng.between(5, 60)
    } else {
        0
    };
    json!({"seed": rng.u64() >> 11, "latency_ms": latency, "lookup_disabled": lookup_off, "rules": rules})
}

/// `pg_terminate_backend` on every connection to the fleet's database (only that one).
async fn terminate_backends(db_name: &str) -> anyhow::Result<u64> {
    let mut conn = sqlx::PgConnection::connect(&crate::server_url()).await?;
    let n: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) AS t FROM pg_stat_activity \
         WHERE datname = $1 AND pid <> pg_backend_pid()) s WHERE t",
    )
    .bind(db_name)
    .fetch_one(&mut conn)
    .await?;
    let _ = conn.close().await;
    Ok(n as u64)
}

/// `rabbitmqctl close_all_connections` in the background (it takes a second or two).
fn close_connections(node: Option<String>, ok: Arc<AtomicU64>, failed: Arc<AtomicU64>) {
    tokio::spawn(async move {
        let mut cmd = Command::new("rabbitmqctl");
        cmd.arg("-q");
        if let Some(node) = &node {
            cmd.arg("-n").arg(node);
        }
        let out = cmd
            .args(["close_all_connections", "oncely chaos: connection fault"])
            .stdin(Stdio::null())
            .output()
            .await;
        if out.is_ok_and(|o| o.status.success()) {
            ok.fetch_add(1, Ordering::Relaxed);
        } else {
            failed.fetch_add(1, Ordering::Relaxed);
        }
    });
}

/// Ready and unacked messages of this fleet's queues (the broker's view).
async fn queue_depths(
    node: Option<&str>,
    prefix: &str,
) -> anyhow::Result<BTreeMap<String, (u64, u64)>> {
    let mut cmd = Command::new("rabbitmqctl");
    cmd.arg("-q");
    if let Some(node) = node {
        cmd.arg("-n").arg(node);
    }
    let out = cmd
        .args([
            "list_queues",
            "name",
            "messages_ready",
            "messages_unacknowledged",
        ])
        .stdin(Stdio::null())
        .output()
        .await?;
    anyhow::ensure!(
        out.status.success(),
        "rabbitmqctl list_queues: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut depths = BTreeMap::new();
    let own = format!("{prefix}.");
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.len() == 3 && cols[0].starts_with(&own) {
            depths.insert(
                cols[0].to_owned(),
                (
                    cols[1].parse().unwrap_or(u64::MAX),
                    cols[2].parse().unwrap_or(u64::MAX),
                ),
            );
        }
    }
    Ok(depths)
}

/// A bare HTTP/1.1 GET (the sandbox's lookup API, read independently of the adapter
/// under test): status and JSON body.
async fn http_get(addr: std::net::SocketAddr, path: &str) -> anyhow::Result<(u16, Value)> {
    http(addr, "GET", path, None).await
}

/// A bare HTTP/1.1 request; `post`: (idempotency key, JSON body).
async fn http(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    post: Option<(&str, &Value)>,
) -> anyhow::Result<(u16, Value)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some((key, body)) = post {
        let body = body.to_string();
        let _ = write!(
            req,
            "Idempotency-Key: {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
    } else {
        req.push_str("\r\n");
    }
    stream.write_all(req.as_bytes()).await?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut buf)).await??;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow::anyhow!("no HTTP header in {} bytes", buf.len()))?;
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no status line"))?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        // Chunks: "<hex size>\r\n<data>\r\n" … "0\r\n\r\n".
        let mut out = String::new();
        let mut rest = body;
        while let Some((size, after)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if n == 0 || after.len() < n {
                break;
            }
            out.push_str(&after[..n]);
            rest = after[n..].trim_start_matches("\r\n");
        }
        out
    } else {
        body.to_owned()
    };
    Ok((status, serde_json::from_str(&body).unwrap_or(Value::Null)))
}

// ───────────────────────────── journal reads ─────────────────────────────

/// Run a read, retrying through terminated connections.
async fn read<T, F, Fut>(what: &str, mut f: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, sqlx::Error>>,
{
    let mut last = None;
    for _ in 0..20 {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) => {
                last = Some(e);
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    }
    Err(anyhow::anyhow!("{what}: {:?}", last))
}

async fn status_counts(pool: &PgPool) -> anyhow::Result<BTreeMap<String, i64>> {
    let rows: Vec<(String, i64)> = read("status counts", || {
        sqlx::query_as("SELECT status, count(*) FROM agent_operations GROUP BY status")
            .fetch_all(pool)
    })
    .await?;
    Ok(rows.into_iter().collect())
}

/// (live: planned/executing/failed_retryable, unknown without an open review).
async fn unsettled(pool: &PgPool) -> anyhow::Result<(i64, i64)> {
    read("unsettled", || {
        sqlx::query_as(
            "SELECT count(*) FILTER (WHERE status IN ('planned', 'executing', 'failed_retryable')), \
                    count(*) FILTER (WHERE status = 'unknown' AND NOT EXISTS (SELECT 1 FROM operation_reviews r \
                        WHERE r.idempotency_key = o.idempotency_key AND r.resolved_at IS NULL)) \
             FROM agent_operations o",
        )
        .fetch_one(pool)
    })
    .await
}

/// Processes holding `executing` leases: pid (from the lease owner
/// `role@host:pid:nonce`) → operations.
async fn busy_pids(pool: &PgPool) -> anyhow::Result<HashMap<u32, i64>> {
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT lease_owner, count(*) FROM agent_operations \
         WHERE status = 'executing' AND lease_owner IS NOT NULL GROUP BY 1",
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .filter_map(|(owner, n)| {
            let mut parts = owner.rsplitn(3, ':');
            let _nonce = parts.next()?;
            parts.next()?.parse().ok().map(|pid: u32| (pid, n))
        })
        .collect())
}

async fn grouped(pool: &PgPool, sql: &'static str) -> anyhow::Result<Vec<(String, i64)>> {
    read(sql, || sqlx::query_as(sql).fetch_all(pool)).await
}

fn fmt_groups(g: &[(String, i64)]) -> String {
    if g.is_empty() {
        return "{}".into();
    }
    let parts: Vec<String> = g.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    format!("{{{}}}", parts.join(", "))
}

/// A key's event trail and reviews, for a finding.
async fn trail(pool: &PgPool, key: &str) -> String {
    let mut out = String::new();
    let rows = sqlx::query(
        "SELECT id, from_status, to_status, attempt, actor, reason, error_code, provider_operation_id, \
                to_char(at AT TIME ZONE 'UTC', 'HH24:MI:SS.MS') AS at \
         FROM operation_events WHERE idempotency_key = $1 ORDER BY id",
    )
    .bind(key)
    .fetch_all(pool)
    .await
    .unwrap_or_default();
    for r in rows {
        let _ = writeln!(
            out,
            "      {} {} → {} attempt {} by {} ({}{}{})",
            r.try_get::<String, _>("at").unwrap_or_default(),
            r.try_get::<Option<String>, _>("from_status")
                .ok()
                .flatten()
                .unwrap_or_else(|| "∅".into()),
            r.try_get::<String, _>("to_status").unwrap_or_default(),
            r.try_get::<i32, _>("attempt").unwrap_or_default(),
            r.try_get::<String, _>("actor").unwrap_or_default(),
            r.try_get::<String, _>("reason").unwrap_or_default(),
            r.try_get::<Option<String>, _>("error_code")
                .ok()
                .flatten()
                .map(|c| format!(", {c}"))
                .unwrap_or_default(),
            r.try_get::<Option<String>, _>("provider_operation_id")
                .ok()
                .flatten()
                .map(|c| format!(", id {c}"))
                .unwrap_or_default(),
        );
    }
    let reviews = sqlx::query(
        "SELECT reason, opened_by, resolution FROM operation_reviews WHERE idempotency_key = $1 ORDER BY id",
    )
    .bind(key)
    .fetch_all(pool)
    .await
    .unwrap_or_default();
    for r in reviews {
        let _ = writeln!(
            out,
            "      review: {} by {} ({})",
            r.try_get::<String, _>("reason").unwrap_or_default(),
            r.try_get::<String, _>("opened_by").unwrap_or_default(),
            r.try_get::<Option<String>, _>("resolution")
                .ok()
                .flatten()
                .unwrap_or_else(|| "open".into())
        );
    }
    out
}

/// The schedule's lines about the processes that acted on `key` (pids from the actors
/// `role@host:pid:nonce` of its events): was a worker stopped, killed, aborted meanwhile?
async fn schedule_notes(pool: &PgPool, key: &str, schedule: &[String]) -> String {
    let actors: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT actor FROM operation_events WHERE idempotency_key = $1",
    )
    .bind(key)
    .fetch_all(pool)
    .await
    .unwrap_or_default();
    let mut out = String::new();
    for pid in actors.iter().filter_map(|a| {
        let mut parts = a.rsplitn(3, ':');
        parts.next()?;
        parts.next()?.parse::<u32>().ok()
    }) {
        let tag = format!("(pid {pid})");
        for line in schedule
            .iter()
            .filter(|l| l.contains(&tag) && !l.contains(" spawn "))
        {
            let _ = writeln!(out, "      schedule: {line}");
        }
    }
    out
}

/// The processes' log lines that mention `key` (with the log's name).
fn log_lines(logs: &[(String, String)], key: &str, max: usize) -> String {
    let mut out = String::new();
    let mut n = 0;
    for (name, text) in logs {
        for line in text.lines().filter(|l| l.contains(key)) {
            if n >= max {
                return out;
            }
            let short: String = line.chars().take(500).collect();
            let _ = writeln!(out, "      {name}: {short}");
            n += 1;
        }
    }
    out
}

fn read_logs(dir: &Path) -> Vec<(String, String)> {
    let mut logs: Vec<(String, String)> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
                .map(|e| {
                    (
                        e.file_name().to_string_lossy().into_owned(),
                        std::fs::read_to_string(e.path()).unwrap_or_default(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    logs.sort();
    logs
}

/// Figures from the processes' logs: deliveries acked without a call (by verdict),
/// refused completions, refused conflicts.
#[derive(Debug, Default)]
struct LogFigures {
    not_claimed: BTreeMap<String, u64>,
    refused_completions: u64,
    conflicts_refused: u64,
    dead_lettered: u64,
}

fn log_figures(logs: &[(String, String)]) -> LogFigures {
    let mut f = LogFigures::default();
    for (_, text) in logs {
        for line in text.lines() {
            if line.contains("not claimed; acked without a provider call") {
                let verdict = serde_json::from_str::<Value>(line)
                    .ok()
                    .and_then(|v| v["verdict"].as_str().map(str::to_owned))
                    .unwrap_or_else(|| "?".into());
                *f.not_claimed.entry(verdict).or_default() += 1;
            } else if line.contains("completion refused: the operation moved on") {
                f.refused_completions += 1;
            } else if line.contains("conflicting payload for an existing key refused") {
                f.conflicts_refused += 1;
            } else if line.contains("invalid message dead-lettered") {
                f.dead_lettered += 1;
            }
        }
    }
    f
}

// ───────────────────────────── the run ─────────────────────────────

fn worker_binary(build: bool) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .ok_or_else(|| anyhow::anyhow!("no directory for {}", exe.display()))?
        .to_path_buf();
    if build {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .ok_or_else(|| anyhow::anyhow!("no workspace directory"))?;
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| env!("CARGO").to_owned());
        let mut cmd = std::process::Command::new(cargo);
        cmd.current_dir(workspace)
            .args(["build", "--workspace", "--bins"]);
        match dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") | None => {}
            Some("release") => {
                cmd.arg("--release");
            }
            Some(profile) => {
                cmd.args(["--profile", profile]);
            }
        }
        eprintln!("chaos: cargo build --workspace --bins (the fleet's binaries, with fail points)");
        let status = cmd.status()?;
        anyhow::ensure!(status.success(), "cargo build --workspace --bins failed");
    }
    let path = dir.join("oncely-worker");
    anyhow::ensure!(
        path.exists(),
        "{} not found: run `cargo build --workspace --bins`",
        path.display()
    );
    // The fail points must be compiled in (the tests crate's feature, unified only when
    // the worker binary is built together with the workspace).
    ensure_failpoints(&path)?;
    Ok(path)
}

fn ensure_failpoints(path: &Path) -> anyhow::Result<()> {
    let has = std::process::Command::new("grep")
        .args(["-q", "-a", "failpoint hit: aborting"])
        .arg(path)
        .status()?;
    anyhow::ensure!(
        has.success(),
        "{} was built without fail points: run `cargo build --workspace --bins`",
        path.display()
    );
    Ok(())
}

/// Aborts a task when dropped.
#[derive(Debug)]
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A private copy of the worker binary, removed when dropped.
#[derive(Debug)]
struct BinarySnapshot(PathBuf);

impl BinarySnapshot {
    fn of(path: &Path) -> anyhow::Result<Self> {
        let copy = std::env::temp_dir().join(format!(
            "oncely-chaos-worker-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0)
        ));
        std::fs::copy(path, &copy)?;
        Ok(BinarySnapshot(copy))
    }
}

impl Drop for BinarySnapshot {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Carry out one chaos run.
pub async fn run(opts: Options) -> anyhow::Result<Outcome> {
    let wall = Instant::now();
    let built = worker_binary(opts.build)?;
    // Spawn from a private copy: a concurrent `cargo build` may replace the file
    // (possibly without fail points) in the middle of the run.
    let snapshot = BinarySnapshot::of(&built)?;
    ensure_failpoints(&snapshot.0)?;
    let bin = snapshot.0.clone();
    let seed = opts.seed;
    eprintln!(
        "chaos: seed {seed}, {} intents, fault phase ≥ {:?} and ≥ {} random kills, broker faults {:?}",
        opts.intents, opts.duration, opts.min_kills, opts.broker
    );
    let private = if opts.broker == BrokerFaults::Private {
        eprintln!("chaos: starting a private RabbitMQ node");
        Some(PrivateBroker::start().await)
    } else {
        None
    };
    let node = private.as_ref().map(|b| b.node().to_owned());
    let fleet = Fleet::with(FleetOptions {
        timeout: PROVIDER_TIMEOUT.into(),
        lease: LEASE.into(),
        max_reconcile_checks: Some(MAX_RECONCILE_CHECKS as i32),
        reconciler: Some(FAST_RECONCILER),
        amqp_url: private.as_ref().map(PrivateBroker::url),
        ..FleetOptions::default()
    })
    .await;
    let setup = wall.elapsed();
    let result = drive(&opts, &fleet, &bin, node.as_deref(), setup, wall).await;
    let outcome = match result {
        Ok(o) => o,
        Err(e) => {
            let kept = keep(&fleet, seed);
            eprintln!("chaos: run failed: {e:#}; logs kept in {}", kept.display());
            return Err(e);
        }
    };
    drop(fleet);
    drop(private);
    Ok(outcome)
}

/// Move the fleet's directory out of the way of its cleanup.
fn keep(fleet: &Fleet, seed: u64) -> PathBuf {
    let kept = std::env::temp_dir().join(format!("oncely-chaos-{seed}-{}", fleet.prefix));
    match std::fs::rename(&fleet.dir, &kept) {
        Ok(()) => kept,
        Err(_) => fleet.dir.clone(),
    }
}

async fn drive(
    opts: &Options,
    fleet: &Fleet,
    bin: &Path,
    node: Option<&str>,
    setup: Duration,
    wall: Instant,
) -> anyhow::Result<Outcome> {
    let seed = opts.seed;
    let pool = &fleet.db.pool;
    let mut plan_rng = Rng::new(seed ^ 0x5EED_0001);
    let mut sched = Rng::new(seed ^ 0x5EED_0002);
    let mut faults_rng = Rng::new(seed ^ 0x5EED_0003);

    // The workload.
    let (batches, planned_repeats, planned_conflicts) = plan(opts.intents, &mut plan_rng);
    let mut keys: Vec<(String, String)> = Vec::with_capacity(opts.intents);
    for i in 0..opts.intents {
        let env: Envelope = intent(seed, i, 0).seal(&secret())?;
        keys.push((
            env.key.as_str().to_owned(),
            env.payload_hash.as_str().to_owned(),
        ));
    }

    let mut crew = Crew {
        fleet,
        bin: bin.to_path_buf(),
        seed,
        members: Vec::new(),
        next: 0,
        tally: Tally::default(),
    };
    crew.maintain(opts.workers, opts.reconcilers, true)?;

    let progress = Arc::new(AtomicU64::new(0));
    let producer = tokio::spawn(produce(
        fleet.config.clone(),
        seed,
        opts.intents,
        batches,
        opts.duration.mul_f64(0.85),
        progress.clone(),
    ));
    // If the run ends early (an error), the producer must not outlive it.
    let _stop_producer = AbortOnDrop(producer.abort_handle());

    // ── the fault phase ──
    let t0 = Instant::now();
    let mut next_kill = t0 + sched.secs(0.5, 2.5);
    let mut next_stop = t0 + sched.secs(3.0, 8.0);
    let mut next_broker = t0 + sched.secs(5.0, 15.0);
    let mut next_pg = t0 + sched.secs(3.0, 8.0);
    let mut next_rules = t0;
    let mut next_lookup = t0 + sched.secs(2.0, 5.0);
    let mut next_progress = t0 + Duration::from_secs(5);
    let mut rules: Vec<Value> = Vec::new();
    let mut lookup_off: Vec<&str> = Vec::new();
    let mut lookup_toggles = 0u64;
    let hard_stop = opts.duration * 3 + Duration::from_secs(120);
    let control = fleet.sandbox.control();
    loop {
        crew.reap();
        crew.note_min();
        crew.cont(false);
        crew.maintain(opts.workers, opts.reconcilers, true)?;
        let now = Instant::now();
        let elapsed = now - t0;
        if elapsed >= opts.duration
            && crew.tally.kills_sent >= opts.min_kills
            && producer.is_finished()
        {
            break;
        }
        if elapsed > hard_stop {
            anyhow::bail!(
                "the fault phase did not end within {hard_stop:?} (producer finished: {}, kills {})",
                producer.is_finished(),
                crew.tally.kills_sent
            );
        }
        if now >= next_kill {
            let fast = elapsed >= opts.duration;
            next_kill = if crew.kill_random(&mut sched, opts.workers, opts.reconcilers)? {
                now + if fast {
                    sched.secs(0.3, 0.8)
                } else {
                    sched.secs(1.0, 3.0)
                }
            } else {
                now + Duration::from_millis(200)
            };
        }
        if now >= next_stop {
            let busy = busy_pids(pool).await.unwrap_or_default();
            crew.stop_random(&mut sched, opts.workers, &busy);
            crew.maintain(opts.workers, opts.reconcilers, true)?;
            next_stop = now + sched.secs(6.0, 14.0);
        }
        if now >= next_broker {
            if opts.broker != BrokerFaults::Off {
                crew.tally.note("rabbitmqctl close_all_connections");
                close_connections(
                    node.map(str::to_owned),
                    crew.tally.broker_rounds.clone(),
                    crew.tally.broker_failed.clone(),
                );
            }
            next_broker = now + sched.secs(8.0, 20.0);
        }
        if now >= next_pg {
            crew.tally.pg_rounds += 1;
            match terminate_backends(&fleet.db.name).await {
                Ok(n) => {
                    crew.tally.pg_terminated += n;
                    crew.tally
                        .note(format_args!("pg_terminate_backend: {n} backends"));
                }
                Err(e) => {
                    crew.tally.pg_failed += 1;
                    crew.tally
                        .note(format_args!("pg_terminate_backend failed: {e}"));
                }
            }
            next_pg = now + sched.secs(4.0, 10.0);
        }
        let mut reconfigure = false;
        if now >= next_rules {
            rules = fault_rules(&mut faults_rng);
            next_rules = now + sched.secs(3.0, 7.0);
            reconfigure = true;
        }
        if now >= next_lookup {
            lookup_off = ACTIONS
                .iter()
                .map(|(_, p)| *p)
                .filter(|_| faults_rng.chance(0.35))
                .collect();
            lookup_toggles += 1;
            next_lookup = now + sched.secs(2.0, 6.0);
            reconfigure = true;
        }
        if reconfigure {
            let cfg = fault_config(&mut faults_rng, &rules, &lookup_off);
            crew.tally.note(format_args!("provider faults {cfg}"));
            match control.set_faults_json(&cfg).await {
                Ok(()) => crew.tally.fault_configs += 1,
                Err(_) => crew.tally.fault_config_failed += 1,
            }
        }
        if now >= next_progress {
            next_progress = now + Duration::from_secs(5);
            let counts = status_counts(pool).await.unwrap_or_default();
            eprintln!(
                "chaos [{:>6.1}s] faults: recorded {}/{}, ops {:?}, kills {} (+{} fail points), stops {}, closes {}, pg rounds {}",
                elapsed.as_secs_f64(),
                progress.load(Ordering::Relaxed),
                opts.intents,
                counts,
                crew.tally.kills_sent,
                crew.tally.failpoints.values().sum::<u64>(),
                crew.tally.stops_workers + crew.tally.stops_reconcilers,
                crew.tally.broker_rounds.load(Ordering::Relaxed),
                crew.tally.pg_rounds,
            );
        }
        tokio::time::sleep(TICK).await;
    }
    let fault_phase = t0.elapsed();
    let report_p = producer.await?;

    // ── heal ──
    let h0 = Instant::now();
    let mut healed = false;
    for attempt in 0..20 {
        if control.set_faults_json(&json!({})).await.is_ok() {
            healed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100 * (attempt + 1))).await;
    }
    anyhow::ensure!(healed, "could not remove the sandbox's faults");
    crew.tally
        .note("heal: provider faults removed, killing stopped");
    crew.cont(true);
    for m in &mut crew.members {
        if m.failpoints && !m.terminating {
            m.proc.signal("TERM");
            m.terminating = true;
        }
    }
    let mut stable = 0;
    let mut settled = false;
    let mut last_state = String::new();
    let mut next_progress = h0;
    crew.maintain(opts.workers, opts.reconcilers, false)?;
    while h0.elapsed() < opts.heal {
        crew.reap();
        crew.note_min();
        crew.maintain(opts.workers, opts.reconcilers, false)?;
        let (live, unknown_open) = unsettled(pool).await?;
        let mut queues_empty = false;
        let mut depth_text = String::from("(not read)");
        if live == 0 && unknown_open == 0 {
            match queue_depths(node, &fleet.prefix).await {
                Ok(d) => {
                    let dead = fleet.topology().dead_queue();
                    queues_empty = d
                        .iter()
                        .filter(|(q, _)| **q != dead)
                        .all(|(_, (r, u))| *r == 0 && *u == 0);
                    depth_text = format!("{d:?}");
                }
                Err(e) => depth_text = format!("{e}"),
            }
        }
        last_state = format!(
            "live (planned/executing/failed_retryable) {live}, unknown without review {unknown_open}, queues {depth_text}"
        );
        if Instant::now() >= next_progress {
            next_progress = Instant::now() + Duration::from_secs(5);
            eprintln!(
                "chaos [{:>6.1}s] heal: {last_state}",
                h0.elapsed().as_secs_f64()
            );
        }
        if queues_empty {
            stable += 1;
            if stable >= 2 {
                settled = true;
                break;
            }
        } else {
            stable = 0;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let heal_time = h0.elapsed();
    crew.stop_all(Duration::from_secs(20)).await;
    if opts.self_test {
        forge(fleet, pool).await?;
    }
    let dead_letters = queue_depths(node, &fleet.prefix)
        .await
        .ok()
        .and_then(|d| d.get(&fleet.topology().dead_queue()).copied())
        .map(|(r, u)| r + u);

    // ── checks ──
    let effects = fleet.sandbox.effects();
    let stats = control.stats().await.unwrap_or(Value::Null);
    let ops: Vec<(String, String, String, i32, String, Option<String>)> =
        read("operations", || {
            sqlx::query_as(
                "SELECT idempotency_key, action_type, status, attempt_count, payload_hash, provider_operation_id \
                 FROM agent_operations",
            )
            .fetch_all(pool)
        })
        .await?;
    let open_reviews: HashMap<String, String> = read("open reviews", || {
        sqlx::query_as(
            "SELECT idempotency_key, reason FROM operation_reviews WHERE resolved_at IS NULL",
        )
        .fetch_all(pool)
    })
    .await?
    .into_iter()
    .collect();
    let review_succeeded: HashSet<String> = read("review_succeeded", || {
        sqlx::query_scalar::<_, String>(
            "SELECT DISTINCT idempotency_key FROM operation_events WHERE reason = 'review_succeeded'",
        )
        .fetch_all(pool)
    })
    .await?
    .into_iter()
    .collect();
    let by_key: HashMap<&str, (&str, &str, i32, &str)> = ops
        .iter()
        .map(|(k, a, s, n, h, _)| (k.as_str(), (a.as_str(), s.as_str(), *n, h.as_str())))
        .collect();

    let mut findings: Vec<(String, String, String)> = Vec::new(); // (check, key, what)
    // duplicates
    for (key, e) in effects.duplicates() {
        findings.push((
            "duplicate".into(),
            key.to_owned(),
            format!("{} effects at {}", e.count, e.provider.name()),
        ));
    }
    // lost
    let mut distinct = 0u64;
    for (i, (key, hash)) in keys.iter().enumerate() {
        if !report_p.recorded[i] {
            continue;
        }
        distinct += 1;
        match by_key.get(key.as_str()) {
            None => findings.push(("lost".into(), key.clone(), "no journal row".into())),
            Some((_, status, _, h)) => {
                if *h != hash {
                    findings.push((
                        "conflict_recorded".into(),
                        key.clone(),
                        format!("journal holds payload hash {h}, the intent's is {hash}"),
                    ));
                }
                let terminal = matches!(*status, "succeeded" | "failed_final");
                let in_review = *status == "unknown" && open_reviews.contains_key(key);
                if !terminal && !in_review {
                    findings.push((
                        "lost".into(),
                        key.clone(),
                        format!("status {status}, no open review"),
                    ));
                }
            }
        }
    }
    let not_recorded = report_p.recorded.iter().filter(|r| !**r).count();
    let intent_keys: HashSet<&str> = keys.iter().map(|(k, _)| k.as_str()).collect();
    for (k, _) in by_key.iter().filter(|(k, _)| !intent_keys.contains(**k)) {
        findings.push((
            "unexpected".into(),
            (*k).to_owned(),
            "journal row for a key no intent has".into(),
        ));
    }
    // unexpected
    for (key, e) in &effects.keys {
        if !by_key.contains_key(key.as_str()) {
            findings.push((
                "unexpected".into(),
                key.clone(),
                format!(
                    "{} effects at {}, no journal row",
                    e.count,
                    e.provider.name()
                ),
            ));
        }
    }
    // mismatches
    for (key, (_, status, attempts, _)) in &by_key {
        let n = effects.count(key);
        if *status == "succeeded" && n == 0 && !review_succeeded.contains(*key) {
            findings.push((
                "mismatch".into(),
                (*key).to_owned(),
                format!("succeeded (attempt {attempts}) without an effect"),
            ));
        }
        if *status == "failed_final" && n > 0 {
            findings.push((
                "mismatch".into(),
                (*key).to_owned(),
                format!("failed_final with {n} effect(s)"),
            ));
        }
    }
    // The provider's own record of every succeeded operation carries the journal's id.
    let addr = fleet.sandbox.addr();
    let succeeded: Vec<(String, &'static str, String)> = ops
        .iter()
        .filter(|o| o.2 == "succeeded" && !review_succeeded.contains(&o.0))
        .filter_map(|o| {
            let resource = match o.1.as_str() {
                "email.send" => "emails",
                "ticket.create" => "tickets",
                "payment_order.create" => "payment-orders",
                _ => return None,
            };
            Some((o.0.clone(), resource, o.5.clone().unwrap_or_default()))
        })
        .collect();
    let checked =
        futures_util::stream::iter(succeeded.into_iter().map(|(key, resource, id)| async move {
            let path = format!(
                "/v1/{resource}?idempotency_key={}",
                oncely_sandbox::control::percent_encode(&key)
            );
            let answer = http_get(addr, &path).await;
            (key, id, answer)
        }))
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    let mut ids_verified = 0u64;
    for (key, id, answer) in checked {
        match answer {
            Ok((200, body)) if body["status"] == "succeeded" && body["id"] == json!(id) => {
                ids_verified += 1
            }
            Ok((status, body)) => findings.push((
                "mismatch".into(),
                key,
                format!("journal: succeeded with id {id}; provider lookup: {status} {body}"),
            )),
            Err(e) => findings.push((
                "mismatch".into(),
                key,
                format!("journal: succeeded with id {id}; provider lookup failed: {e}"),
            )),
        }
    }
    // payment orders: out of unknown only by lookup, late answer, or a person
    let payment_moves: Vec<(String, String, String)> = read("payment moves", || {
        sqlx::query_as(
            "SELECT e.idempotency_key, e.reason, e.to_status FROM operation_events e \
             JOIN agent_operations o USING (idempotency_key) \
             WHERE o.action_type = 'payment_order.create' AND e.from_status = 'unknown' AND e.to_status <> 'unknown'",
        )
        .fetch_all(pool)
    })
    .await?;
    let mut pay_found = 0u64;
    let mut pay_late = 0u64;
    for (key, reason, to) in &payment_moves {
        let allowed = reason.starts_with("reconcile_found_")
            || reason == "late_answer"
            || reason.starts_with("review_");
        if reason.starts_with("reconcile_found_") {
            pay_found += 1;
        }
        if reason == "late_answer" {
            pay_late += 1;
        }
        if reason == "reconcile_absent_retry" || (!allowed && !open_reviews.contains_key(key)) {
            findings.push((
                "payment_blind_retry".into(),
                key.clone(),
                format!("unknown → {to} by {reason}"),
            ));
        }
    }
    let pay_unknown: i64 = read("payments unknown", || {
        sqlx::query_scalar(
            "SELECT count(DISTINCT e.idempotency_key) FROM operation_events e JOIN agent_operations o USING (idempotency_key) \
             WHERE o.action_type = 'payment_order.create' AND e.to_status = 'unknown'",
        )
        .fetch_one(pool)
    })
    .await?;
    let pay_in_review = by_key
        .iter()
        .filter(|(k, (a, s, _, _))| {
            *a == "payment_order.create" && *s == "unknown" && open_reviews.contains_key(**k)
        })
        .count();
    let conflicts_422 = stats["conflicts_422"].as_u64().unwrap_or(0);
    if conflicts_422 > 0 {
        findings.push((
            "conflict_at_provider".into(),
            "-".into(),
            format!(
                "{conflicts_422} requests reached the sandbox with a reused key and another body"
            ),
        ));
    }
    for a in &report_p.anomalies {
        findings.push(("producer".into(), "-".into(), a.clone()));
    }
    if let Some(f) = &report_p.fatal {
        findings.push(("producer".into(), "-".into(), f.clone()));
    }
    if not_recorded > 0 {
        findings.push((
            "not_enqueued".into(),
            "-".into(),
            format!("{not_recorded} intents were never recorded by the producer"),
        ));
    }
    if !settled {
        findings.push((
            "not_healed".into(),
            "-".into(),
            format!("not settled after {:?}: {last_state}", opts.heal),
        ));
    }
    let count = |check: &str| findings.iter().filter(|f| f.0 == check).count();
    let duplicates = count("duplicate");
    let lost = count("lost");
    let unexpected = count("unexpected");
    let mismatches = count("mismatch");
    let passed = findings.is_empty();

    // ── figures ──
    let claims: (i64, i64) = read("claims", || {
        sqlx::query_as(
            "SELECT count(*), count(*) FILTER (WHERE attempt > 1) FROM operation_events WHERE reason = 'claim'",
        )
        .fetch_one(pool)
    })
    .await?;
    let to_unknown = grouped(
        pool,
        "SELECT reason, count(*) FROM operation_events WHERE to_status = 'unknown' \
         AND from_status IS DISTINCT FROM 'unknown' GROUP BY reason ORDER BY 2 DESC",
    )
    .await?;
    let from_unknown = grouped(
        pool,
        "SELECT reason || ' → ' || to_status, count(*) FROM operation_events WHERE from_status = 'unknown' \
         AND to_status <> 'unknown' GROUP BY 1 ORDER BY 2 DESC",
    )
    .await?;
    let reviews = grouped(
        pool,
        "SELECT reason, count(*) FROM operation_reviews GROUP BY reason ORDER BY 2 DESC",
    )
    .await?;
    let other_reasons = grouped(
        pool,
        "SELECT reason, count(*) FROM operation_events WHERE reason IN ('conflict', 'late_answer', 'reconcile_absent_retry', 'lease_expired') \
         GROUP BY reason ORDER BY 1",
    )
    .await?;
    let final_status = status_counts(pool).await?;
    let reviews_on_settled: i64 = read("reviews on settled", || {
        sqlx::query_scalar(
            "SELECT count(*) FROM operation_reviews r JOIN agent_operations o USING (idempotency_key) \
             WHERE r.resolved_at IS NULL AND o.status <> 'unknown'",
        )
        .fetch_one(pool)
    })
    .await?;
    let in_review_with_effect = open_reviews.keys().filter(|k| effects.count(k) > 0).count();
    let logs = read_logs(&fleet.dir);
    let lf = log_figures(&logs);
    let mut per_action: BTreeMap<&str, u64> = BTreeMap::new();
    for (i, r) in report_p.recorded.iter().enumerate() {
        if *r {
            *per_action.entry(ACTIONS[action_of(i)].0).or_default() += 1;
        }
    }
    let t = &crew.tally;
    let fp_total: u64 = t.failpoints.values().sum();
    let mut r = String::new();
    let _ = writeln!(
        r,
        "oncely chaos run — {}",
        if passed { "PASS" } else { "FAIL" }
    );
    let _ = writeln!(r, "  seed               {seed}");
    let _ = writeln!(
        r,
        "  size               {} intents, fault phase ≥ {}s, ≥ {} random kills{}",
        opts.intents,
        opts.duration.as_secs(),
        opts.min_kills,
        if opts.nightly { " (nightly)" } else { "" }
    );
    let _ = writeln!(
        r,
        "  fleet              {} workers ({} with ONCELY_FAILPOINTS={FAILPOINTS} during faults), {} reconcilers, provider timeout {PROVIDER_TIMEOUT}, lease {LEASE}, max_reconcile_checks {MAX_RECONCILE_CHECKS}",
        opts.workers,
        (opts.workers - 3).max(1),
        opts.reconcilers
    );
    let _ = writeln!(
        r,
        "  time               setup {:.1}s, faults {:.1}s (producer {:.1}s), heal {:.1}s, wall {:.1}s",
        setup.as_secs_f64(),
        fault_phase.as_secs_f64(),
        report_p.seconds,
        heal_time.as_secs_f64(),
        wall.elapsed().as_secs_f64()
    );
    let _ = writeln!(r, "intents");
    let _ = writeln!(r, "  distinct           {distinct} {:?}", per_action);
    let _ = writeln!(
        r,
        "  repeats            {} of {planned_repeats} planned, answered {:?}",
        report_p.repeats, report_p.repeat_status
    );
    let _ = writeln!(
        r,
        "  conflicts          {} of {planned_conflicts} planned: {} through the SDK (refused: {}), {} published raw (confirmed: {}, refused by workers: {} log lines)",
        report_p.conflicts_sdk + report_p.conflicts_raw,
        report_p.conflicts_sdk,
        report_p.conflicts_sdk_refused,
        report_p.conflicts_raw,
        report_p.conflicts_raw_published,
        lf.conflicts_refused
    );
    let _ = writeln!(
        r,
        "  producer           new {}, recorded on a retried batch {}, recorded but publish failed {} (left to the sweeper), batch errors {}, timeouts {}, reconnects {}",
        report_p.new,
        report_p.duplicate_after_retry,
        report_p.publish_failed,
        report_p.batch_errors,
        report_p.timeouts,
        report_p.reconnects
    );
    let _ = writeln!(r, "deliveries");
    let _ = writeln!(
        r,
        "  claims             {} (re-attempts {})",
        claims.0, claims.1
    );
    let _ = writeln!(
        r,
        "  acked, no call     {} {:?}",
        lf.not_claimed.values().sum::<u64>(),
        lf.not_claimed
    );
    let _ = writeln!(
        r,
        "  at the sandbox     executes {}, replays {}, in-flight 409 {}, reused-key 422 {}, lookups {}",
        stats["executes"],
        stats["replays"],
        stats["in_flight_409"],
        stats["conflicts_422"],
        stats["lookups"]
    );
    let _ = writeln!(
        r,
        "  effects            {} at {} keys",
        effects.total,
        effects.keys.len()
    );
    let _ = writeln!(
        r,
        "  dead-lettered      {} (queue), {} invalid (log lines)",
        dead_letters.map_or("?".into(), |n| n.to_string()),
        lf.dead_lettered
    );
    let _ = writeln!(r, "kills");
    let _ = writeln!(
        r,
        "  SIGKILL (random)   {} (workers {}, reconcilers {})",
        t.killed_workers + t.killed_reconcilers,
        t.killed_workers,
        t.killed_reconcilers
    );
    let _ = writeln!(r, "  fail points        {fp_total} {:?}", t.failpoints);
    let _ = writeln!(
        r,
        "  SIGSTOP > lease    {} (workers {}, {} of them holding {} leases; reconcilers {}); late completions refused {}, late answers accepted {}",
        t.stops_workers + t.stops_reconcilers,
        t.stops_workers,
        t.stops_holding,
        t.stopped_leases,
        t.stops_reconcilers,
        lf.refused_completions,
        other_reasons
            .iter()
            .find(|(k, _)| k == "late_answer")
            .map_or(0, |(_, v)| *v)
    );
    let _ = writeln!(
        r,
        "  processes          spawned {}, min workers running {}, exited on their own {}",
        t.spawned,
        t.min_active_workers.unwrap_or(0),
        t.unexpected.len()
    );
    let _ = writeln!(r, "connections");
    let _ = writeln!(
        r,
        "  broker closes      {} rounds of close_all_connections ({}){}",
        t.broker_rounds.load(Ordering::Relaxed),
        match opts.broker {
            BrokerFaults::Shared => "machine's broker",
            BrokerFaults::Private => "private node",
            BrokerFaults::Off => "off: --no-broker-faults",
        },
        match t.broker_failed.load(Ordering::Relaxed) {
            0 => String::new(),
            n => format!(", {n} failed"),
        }
    );
    let _ = writeln!(
        r,
        "  pg backends        {} terminated in {} rounds{}",
        t.pg_terminated,
        t.pg_rounds,
        if t.pg_failed > 0 {
            format!(" ({} rounds failed)", t.pg_failed)
        } else {
            String::new()
        }
    );
    let _ = writeln!(r, "provider faults");
    let _ = writeln!(
        r,
        "  applied            {} ({} configs, {} lookup toggles)",
        stats["faults"], t.fault_configs, lookup_toggles
    );
    let _ = writeln!(r, "unknowns");
    let _ = writeln!(
        r,
        "  to unknown         {} {}",
        to_unknown.iter().map(|(_, v)| v).sum::<i64>(),
        fmt_groups(&to_unknown)
    );
    let _ = writeln!(r, "  out of unknown     {}", fmt_groups(&from_unknown));
    let _ = writeln!(
        r,
        "  reviews opened     {} {}; open now {} (with an effect at the provider {}, on settled operations {})",
        reviews.iter().map(|(_, v)| v).sum::<i64>(),
        fmt_groups(&reviews),
        open_reviews.len(),
        in_review_with_effect,
        reviews_on_settled
    );
    let _ = writeln!(
        r,
        "  payment orders     {pay_unknown} went unknown: settled by lookup {pay_found}, by late answer {pay_late}, in review {pay_in_review}; blind retries {}",
        count("payment_blind_retry")
    );
    let _ = writeln!(r, "  final journal      {final_status:?}");
    let _ = writeln!(r, "checks");
    let _ = writeln!(r, "  duplicates         {duplicates}");
    let _ = writeln!(r, "  lost               {lost}");
    let _ = writeln!(r, "  unexpected         {unexpected}");
    let _ = writeln!(
        r,
        "  mismatches         {mismatches} (provider ids verified by lookup: {ids_verified})"
    );
    let _ = writeln!(
        r,
        "  payment blind retries {}, conflicting payloads at the provider {conflicts_422}, intents accounted for {}/{}",
        count("payment_blind_retry"),
        distinct as usize - lost.min(distinct as usize),
        opts.intents
    );
    if !t.unexpected.is_empty() {
        let _ = writeln!(r, "processes that exited on their own");
        for u in t.unexpected.iter().take(20) {
            let _ = writeln!(r, "  {u}");
        }
    }

    // ── observations (not failures): examples worth reading ──
    let examples: Vec<(String, String)> = read("examples", || {
        sqlx::query_as(
            "(SELECT 'open review on a settled operation', r.idempotency_key FROM operation_reviews r \
               JOIN agent_operations o USING (idempotency_key) \
               WHERE r.resolved_at IS NULL AND o.status <> 'unknown' ORDER BY r.id LIMIT 2) \
             UNION ALL \
             (SELECT 'late answer', e.idempotency_key FROM operation_events e \
               WHERE e.reason = 'late_answer' AND NOT EXISTS (SELECT 1 FROM operation_reviews r \
                 WHERE r.idempotency_key = e.idempotency_key AND r.resolved_at IS NULL) ORDER BY e.id LIMIT 1)",
        )
        .fetch_all(pool)
    })
    .await?;
    if !examples.is_empty() {
        let _ = writeln!(r, "examples");
        for (what, key) in &examples {
            let action = by_key.get(key.as_str()).map_or("?", |o| o.0);
            let _ = writeln!(
                r,
                "  {what}: {action} {key} (effects {})",
                effects.count(key)
            );
            let _ = write!(r, "{}", trail(pool, key).await);
            let _ = write!(r, "{}", schedule_notes(pool, key, &t.schedule).await);
        }
    }

    // ── findings ──
    let mut kept = None;
    if !passed {
        let _ = writeln!(r, "findings ({})", findings.len());
        let mut shown: HashMap<&str, usize> = HashMap::new();
        for (check, key, what) in &findings {
            let n = shown.entry(check.as_str()).or_default();
            *n += 1;
            if *n > 10 {
                continue;
            }
            let _ = writeln!(r, "  [{check}] {key}: {what}");
            if key.starts_with("v1:") {
                let (action, status) = by_key
                    .get(key.as_str())
                    .map_or(("?", "no row"), |(a, s, _, _)| (*a, *s));
                let _ = writeln!(
                    r,
                    "    {action}, status {status}, effects {}",
                    effects.count(key)
                );
                let _ = write!(r, "{}", trail(pool, key).await);
                let _ = write!(r, "{}", schedule_notes(pool, key, &t.schedule).await);
                let _ = write!(r, "{}", log_lines(&logs, key, 25));
            }
        }
        for (check, n) in &shown {
            if *n > 10 {
                let _ = writeln!(r, "  … and {} more {check}", n - 10);
            }
        }
        dump(pool, &fleet.dir).await;
    }
    let _ = std::fs::write(fleet.dir.join("chaos-report.txt"), &r);
    let _ = std::fs::write(fleet.dir.join("schedule.log"), t.schedule.join("\n") + "\n");
    if !passed || opts.keep_logs {
        if passed {
            dump(pool, &fleet.dir).await;
        }
        kept = Some(keep(fleet, seed));
    }
    println!("{r}");
    if let Some(k) = &kept {
        println!("logs, report and journal dump kept in {}", k.display());
    }
    Ok(Outcome {
        passed,
        report: r,
        kept,
    })
}

/// `--self-test`: forge one duplicate, one unexpected effect, one mismatch and one lost
/// intent after healing, so the checks must find exactly those (a negative control).
async fn forge(fleet: &Fleet, pool: &PgPool) -> anyhow::Result<()> {
    let addr = fleet.sandbox.addr();
    let control = fleet.sandbox.control();
    // Unexpected: an effect for a key the journal has never seen.
    let stranger = format!("v1:{}", "0".repeat(64));
    http(
        addr,
        "POST",
        "/v1/emails",
        Some((&stranger, &json!({"self_test": "unexpected"}))),
    )
    .await?;
    let succeeded: Vec<String> = sqlx::query_scalar(
        "SELECT idempotency_key FROM agent_operations WHERE status = 'succeeded' AND action_type = 'email.send' \
         ORDER BY idempotency_key LIMIT 2",
    )
    .fetch_all(pool)
    .await?;
    anyhow::ensure!(
        succeeded.len() == 2,
        "self-test: not enough succeeded emails"
    );
    // Duplicate: the provider forgets the key, then the same key is sent again.
    control
        .set_faults_json(&json!({"forget_keys_after_ms": 0}))
        .await?;
    tokio::time::sleep(Duration::from_millis(50)).await;
    http(
        addr,
        "POST",
        "/v1/emails",
        Some((&succeeded[0], &json!({"self_test": "duplicate"}))),
    )
    .await?;
    control.set_faults_json(&json!({})).await?;
    // Mismatch: the journal's provider id no longer matches the provider's record.
    sqlx::query("UPDATE agent_operations SET provider_operation_id = 'em_forged' WHERE idempotency_key = $1")
        .bind(&succeeded[1])
        .execute(pool)
        .await?;
    // Lost: an unknown whose review is closed without deciding anything.
    let closed = sqlx::query(
        "UPDATE operation_reviews SET resolution = 'failed', resolved_by = 'chaos-self-test', resolved_at = now() \
         WHERE id = (SELECT r.id FROM operation_reviews r JOIN agent_operations o USING (idempotency_key) \
                     WHERE r.resolved_at IS NULL AND o.status = 'unknown' ORDER BY r.id LIMIT 1)",
    )
    .execute(pool)
    .await?;
    eprintln!(
        "chaos: self-test forged an unexpected effect ({stranger}), a duplicate ({}), a mismatch ({}) and {} lost",
        succeeded[0],
        succeeded[1],
        closed.rows_affected()
    );
    Ok(())
}

/// Write the journal (operations, events, reviews) as TSV next to the logs.
async fn dump(pool: &PgPool, dir: &Path) {
    for (file, sql) in [
        (
            "operations.tsv",
            "SELECT concat_ws(E'\\t', idempotency_key, action_type, status, attempt_count, provider_operation_id, \
             last_error_code, reconcile_checks, created_at, updated_at) FROM agent_operations ORDER BY created_at",
        ),
        (
            "events.tsv",
            "SELECT concat_ws(E'\\t', id, idempotency_key, from_status, to_status, attempt, actor, reason, error_code, \
             provider_operation_id, at) FROM operation_events ORDER BY id",
        ),
        (
            "reviews.tsv",
            "SELECT concat_ws(E'\\t', id, idempotency_key, reason, opened_by, opened_at, resolution) FROM operation_reviews ORDER BY id",
        ),
    ] {
        if let Ok(rows) = sqlx::query_scalar::<_, String>(sql).fetch_all(pool).await {
            let _ = std::fs::write(dir.join(file), rows.join("\n") + "\n");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_holds_every_intent_once_and_repeats_later() {
        let (batches, repeats, conflicts) = plan(2000, &mut Rng::new(7));
        let mut seen = vec![None; 2000];
        for (b, batch) in batches.iter().enumerate() {
            for item in batch {
                if let Item::Original(i) = item {
                    assert!(seen[*i].is_none());
                    seen[*i] = Some(b);
                }
            }
        }
        assert!(seen.iter().all(Option::is_some));
        let mut n_rep = 0;
        let mut n_conf = 0;
        for (b, batch) in batches.iter().enumerate() {
            for item in batch {
                match item {
                    Item::Repeat(i) => {
                        n_rep += 1;
                        assert!(seen[*i].is_some_and(|first| first < b));
                    }
                    Item::ConflictSdk(i) | Item::ConflictRaw(i) => {
                        n_conf += 1;
                        assert!(seen[*i].is_some_and(|first| first < b));
                    }
                    Item::Original(_) => {}
                }
            }
        }
        assert_eq!((n_rep, n_conf), (repeats, conflicts));
        assert_eq!(repeats, 200);
    }

    #[test]
    fn conflicting_intents_share_the_key_not_the_payload() {
        let s = secret();
        for i in [0, 5, 9] {
            let a = intent(1, i, 0).seal(&s).expect("seal");
            let b = intent(1, i, 1).seal(&s).expect("seal");
            assert_eq!(a.key, b.key);
            assert_ne!(a.payload_hash, b.payload_hash);
        }
    }

    #[test]
    fn options_default_and_nightly() {
        let o = Options::from_args(&["--seed".into(), "5".into()])
            .expect("parse")
            .expect("options");
        assert_eq!((o.seed, o.intents, o.min_kills), (5, 2000, 20));
        let o = Options::from_args(&["--nightly".into()])
            .expect("parse")
            .expect("options");
        assert!(o.intents >= 50_000);
        assert!(Options::from_args(&["--workers".into(), "2".into()]).is_err());
        assert!(
            Options::from_args(&["--help".into()])
                .expect("parse")
                .is_none()
        );
    }
}
