//! The report: one table (figures, design targets, where the CPU went, scaling) and the
//! same figures as JSON.

use super::broker::BrokerResult;
use super::fleet::FleetResult;
use super::journal::JournalResult;
use super::sys::{CpuUse, Machine};
use oncely_core::config::BrokerConfig;
use oncely_core::db::{self, PoolSettings};
use oncely_core::topology;
use serde::Serialize;
use std::fmt::Write as _;

/// The design targets (issue 13, `docs/performance.md`): end-to-end actions/s at full load.
pub const TARGET_ACTIONS_PER_S: f64 = 5000.0;
/// CPU time per action summed over every process of the system under test (ms).
pub const TARGET_CPU_MS_PER_ACTION: f64 = 0.4;
/// p99 recorded → succeeded at half load (ms).
pub const TARGET_P99_HALF_MS: f64 = 50.0;
/// Throughput with more workers ÷ with fewer (1 → 2 → 4): at least this (5 % of noise).
pub const TARGET_SCALING: f64 = 0.95;
/// Slow provider: throughput ÷ min(in-flight bound, CPU bound).
pub const TARGET_SLOW_VS_BOUND: f64 = 0.9;
/// Worker peak RSS with the slow provider's calls in flight (MiB).
pub const TARGET_RSS_MIB: f64 = 64.0;

/// The servers measured against.
#[derive(Debug, Clone, Serialize)]
pub struct Services {
    /// `user@host:port/db` of Postgres.
    pub postgres: String,
    /// `SHOW server_version`.
    pub postgres_version: String,
    /// `SHOW synchronous_commit` (each commit waits for its WAL fsync when `on`).
    pub synchronous_commit: String,
    /// The TLS version of the bench's connection (`TLSv1.3`) or `off`; workers use the
    /// same URL, so the same `sslmode`.
    pub postgres_tls: String,
    /// `user@host:port/vhost` of RabbitMQ.
    pub rabbitmq: String,
}

impl Services {
    /// Ask Postgres for its version and commit setting; check RabbitMQ answers.
    pub async fn probe(database_url: &str, amqp_url: &str) -> anyhow::Result<Services> {
        let pool = db::connect(
            database_url,
            &PoolSettings {
                max_connections: 1,
                ..Default::default()
            },
        )
        .await?;
        let facts = db::server_facts(&pool).await?;
        pool.close().await;
        // The error names the broker (never the password).
        let conn = topology::connect(&BrokerConfig::at(amqp_url), "oncely-bench-probe").await?;
        oncely_core::amqp::close(&conn, "bench", "probe").await;
        Ok(Services {
            postgres: db::describe(database_url),
            postgres_version: facts.version,
            synchronous_commit: facts.synchronous_commit,
            postgres_tls: facts.tls,
            rabbitmq: topology::describe_amqp(amqp_url),
        })
    }
}

/// The workload's settings.
#[derive(Debug, Clone, Serialize)]
pub struct Workload {
    /// Operations per measurement.
    pub intents: usize,
    /// C.
    pub concurrency: u16,
    /// Mean message (envelope) size in bytes.
    pub message_bytes: f64,
    /// Confirms awaited together (broker ceiling; the producer awaits per `enqueue_many`).
    pub confirm_window: usize,
    /// Intents per `enqueue_many` at full load.
    pub enqueue_chunk: usize,
    /// Agents enqueueing at once at full load (`--agents`).
    pub agents: usize,
    /// Every worker's `prefetch` = `max_in_flight` in the end-to-end rows (2 × C unless
    /// `--worker-in-flight`).
    pub worker_in_flight: u16,
    /// Every worker's `batch` (C unless `--worker-batch`).
    pub worker_batch: u16,
    /// How the workers reach the sandbox provider (`--provider-http2`).
    pub provider_http: &'static str,
    /// Workers of the headline runs.
    pub fleet: usize,
    /// Every worker's `linger` (ms).
    pub linger_ms: u64,
}

/// A design target and whether this run reached it.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    /// What is compared.
    pub name: String,
    /// The target, as text (`≥ 0.6 × broker`).
    pub target: String,
    /// The measured value.
    pub value: f64,
    /// Reached?
    pub reached: bool,
}

/// The slow-provider run: every worker holding many calls in flight against a provider
/// that answers after a fixed latency, next to what queueing predicts.
#[derive(Debug, Clone, Serialize)]
pub struct SlowProvider {
    /// The run.
    pub result: FleetResult,
    /// Calls in flight per worker (`prefetch` = `max_in_flight`).
    pub in_flight: u16,
    /// The provider's latency (ms).
    pub latency_ms: u64,
    /// workers × in-flight ÷ latency: the most the in-flight limit allows (actions/s).
    pub inflight_bound: f64,
    /// The same fleet's full-load throughput with an instant provider: the CPU bound.
    pub cpu_bound: f64,
    /// Measured ÷ min(the two bounds).
    pub vs_bound: f64,
    /// Queueing's prediction for the median latency (ms), from the measured throughput X
    /// and recording rate R: every intent is enqueued at once, so operation i waits
    /// i·(1/X − 1/R) behind the backlog, plus the provider's latency.
    pub expected_p50_ms: f64,
    /// The same prediction for the 99th percentile (ms).
    pub expected_p99_ms: f64,
}

impl SlowProvider {
    /// The figures around a measured slow-provider run.
    pub fn new(result: FleetResult, in_flight: u16, latency_ms: u64, cpu_bound: f64) -> Self {
        let latency_s = latency_ms as f64 / 1000.0;
        let inflight_bound = result.workers as f64 * f64::from(in_flight) / latency_s.max(1e-9);
        let bound = inflight_bound.min(cpu_bound);
        let x = result.actions_per_s;
        let r = result.intents as f64 / result.enqueue_seconds.max(1e-9);
        let backlog_per_op = (1.0 / x - 1.0 / r).max(0.0);
        let at = |q: f64| (q * result.intents as f64 * backlog_per_op + latency_s) * 1000.0;
        SlowProvider {
            vs_bound: x / bound,
            expected_p50_ms: at(0.5),
            expected_p99_ms: at(0.99),
            result,
            in_flight,
            latency_ms,
            inflight_bound,
            cpu_bound,
        }
    }
}

/// Everything measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// When the run started (UTC).
    pub date: String,
    /// The command line.
    pub command: String,
    /// The machine.
    pub machine: Machine,
    /// The servers.
    pub services: Services,
    /// The workload.
    pub workload: Workload,
    /// Broker ceiling.
    pub broker: BrokerResult,
    /// Journal ceiling: the article's flow on oncely's schema.
    pub journal: JournalResult,
    /// Journal ceiling: the article's flow on the article's plain table.
    pub journal_plain: JournalResult,
    /// The journal floor: oncely's own record, claim and completion statements, as
    /// batched as at full load (no broker, no provider).
    pub journal_batched: JournalResult,
    /// oncely, full load.
    pub full_load: FleetResult,
    /// oncely, full load, enqueued over HTTP through the gateway.
    pub via_gateway: FleetResult,
    /// via_gateway / full_load throughput.
    pub ratio_gateway: f64,
    /// oncely, half load (the 50 % point of [`Report::paced`]).
    pub half_load: FleetResult,
    /// The latency curve: runs paced at fractions of the full-load rate.
    pub paced: Vec<FleetResult>,
    /// Scaling by workers (sandbox latency 0).
    pub scaling_workers: Vec<FleetResult>,
    /// Scaling by sandbox latency (headline workers).
    pub scaling_latency: Vec<FleetResult>,
    /// The slow provider with many calls in flight, if run.
    pub slow: Option<SlowProvider>,
    /// oncely / broker ceiling.
    pub ratio_broker: f64,
    /// oncely / journal ceiling (oncely's schema).
    pub ratio_journal: f64,
    /// The design targets.
    pub targets: Vec<Target>,
}

/// The measurements a [`Report`] is made of.
#[derive(Debug, Clone)]
pub struct Measured {
    /// Broker ceiling.
    pub broker: BrokerResult,
    /// Journal ceiling on oncely's schema.
    pub journal: JournalResult,
    /// Journal ceiling on the article's plain table.
    pub journal_plain: JournalResult,
    /// The journal floor (oncely's statements, batched).
    pub journal_batched: JournalResult,
    /// Full load.
    pub full_load: FleetResult,
    /// Through the gateway.
    pub via_gateway: FleetResult,
    /// The paced runs (one of them at 50 %).
    pub paced: Vec<FleetResult>,
    /// Scaling by workers.
    pub scaling_workers: Vec<FleetResult>,
    /// Scaling by latency.
    pub scaling_latency: Vec<FleetResult>,
    /// The slow provider.
    pub slow: Option<SlowProvider>,
}

/// CPU time per action over oncely's processes (ms).
pub fn cpu_ms_per_action(r: &FleetResult) -> f64 {
    r.cpu.oncely() / r.actions_per_s * 1000.0
}

/// The smallest ratio of throughput with more workers to throughput with fewer, from
/// `(workers, actions/s)` runs; a worker count run more than once counts with its mean
/// (the scaling rows run there and back, 1, 2, 4 then 4, 2, 1, so that a machine
/// getting slower or faster during the rows weighs on every count alike).
pub fn scaling_ratio(runs: impl IntoIterator<Item = (usize, f64)>) -> Option<f64> {
    let mut by_workers: std::collections::BTreeMap<usize, (f64, f64)> = Default::default();
    for (w, rate) in runs {
        let e = by_workers.entry(w).or_default();
        *e = (e.0 + rate, e.1 + 1.0);
    }
    let means: Vec<f64> = by_workers.values().map(|(sum, n)| sum / n).collect();
    means.windows(2).map(|w| w[1] / w[0]).reduce(f64::min)
}

/// "run k of n" for each worker-count run, in order, when a count ran more than once.
fn run_labels(rows: &[FleetResult]) -> Vec<String> {
    rows.iter()
        .enumerate()
        .map(|(i, r)| {
            let same = |x: &&FleetResult| x.workers == r.workers;
            let n = rows.iter().filter(same).count();
            let k = rows[..=i].iter().filter(same).count();
            if n > 1 {
                format!("{k} of {n}")
            } else {
                String::new()
            }
        })
        .collect()
}

fn target(name: &str, text: String, value: f64, reached: bool) -> Target {
    Target {
        name: name.into(),
        target: text,
        value,
        reached,
    }
}

impl Report {
    /// Assemble, computing ratios and targets.
    pub fn new(
        started: chrono::DateTime<chrono::Utc>,
        command: String,
        machine: Machine,
        services: Services,
        workload: Workload,
        m: Measured,
    ) -> Report {
        let full_load = m.full_load;
        let half_load = m
            .paced
            .iter()
            .find(|r| r.paced_percent == Some(50))
            .or(m.paced.first())
            .cloned()
            .unwrap_or_else(|| full_load.clone());
        let ratio_gateway = m.via_gateway.actions_per_s / full_load.actions_per_s;
        let ratio_broker = full_load.actions_per_s / m.broker.msg_per_s;
        let ratio_journal = full_load.actions_per_s / m.journal.actions_per_s;
        let cpu = cpu_ms_per_action(&full_load);
        let mut targets = vec![
            target(
                "oncely end to end, full load (actions/s)",
                format!("≥ {TARGET_ACTIONS_PER_S:.0}"),
                full_load.actions_per_s,
                full_load.actions_per_s >= TARGET_ACTIONS_PER_S,
            ),
            target(
                "CPU per action, every process (ms)",
                format!("≤ {TARGET_CPU_MS_PER_ACTION:.1}"),
                cpu,
                cpu <= TARGET_CPU_MS_PER_ACTION,
            ),
            target(
                "p99 at half load (ms)",
                format!("≤ {TARGET_P99_HALF_MS:.0}"),
                half_load.p99_ms,
                half_load.p99_ms <= TARGET_P99_HALF_MS,
            ),
        ];
        let runs = m
            .scaling_workers
            .iter()
            .map(|r| (r.workers, r.actions_per_s));
        if let Some(r) = scaling_ratio(runs) {
            targets.push(target(
                "more workers ÷ fewer, smallest step (throughput)",
                format!("≥ {TARGET_SCALING:.2}"),
                r,
                r >= TARGET_SCALING,
            ));
        }
        let rss_row = m.slow.as_ref().map_or(&full_load, |s| &s.result);
        if let Some(slow) = &m.slow {
            targets.push(target(
                "slow provider: throughput ÷ min(in-flight bound, CPU bound)",
                format!("≥ {TARGET_SLOW_VS_BOUND:.1}"),
                slow.vs_bound,
                slow.vs_bound >= TARGET_SLOW_VS_BOUND,
            ));
        }
        let rss = rss_row.max_rss_mib();
        targets.push(target(
            &match &m.slow {
                Some(s) => format!("worker peak RSS, {} calls in flight (MiB)", s.in_flight),
                None => "worker peak RSS (MiB)".to_owned(),
            },
            format!("≤ {TARGET_RSS_MIB:.0}"),
            rss,
            rss <= TARGET_RSS_MIB,
        ));
        Report {
            date: started.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
            command,
            machine,
            services,
            workload,
            broker: m.broker,
            journal: m.journal,
            journal_plain: m.journal_plain,
            journal_batched: m.journal_batched,
            full_load,
            via_gateway: m.via_gateway,
            ratio_gateway,
            half_load,
            paced: m.paced,
            scaling_workers: m.scaling_workers,
            scaling_latency: m.scaling_latency,
            slow: m.slow,
            ratio_broker,
            ratio_journal,
            targets,
        }
    }

    /// The human table.
    pub fn table(&self) -> String {
        let mut o = String::new();
        let m = &self.machine;
        let w = &self.workload;
        let sv = &self.services;
        let _ = writeln!(o, "oncely-bench — {}", self.date);
        let _ = writeln!(o, "command:  {}", self.command);
        let _ = writeln!(o, "machine:  {}", m.describe());
        let _ = writeln!(
            o,
            "services: PostgreSQL {} (synchronous_commit={}, TLS {}) {}, RabbitMQ {}",
            sv.postgres_version, sv.synchronous_commit, sv.postgres_tls, sv.postgres, sv.rabbitmq
        );
        let _ = writeln!(
            o,
            "workload: {} operations per measurement (email.send, ticket.create, payment_order.create in turn), \
             {:.0}-byte messages, C = {}, worker linger {} ms, {} agents at full load",
            w.intents, w.message_bytes, w.concurrency, w.linger_ms, w.agents
        );
        let _ = writeln!(o);

        let mut t = Table::new(&["measurement", "figure"]);
        let mut row = |name: String, figure: String| t.row(&[name, figure]);
        row(
            format!(
                "broker ceiling: quorum queue, confirms (window {}) + acks in runs, prefetch {}",
                w.confirm_window, w.concurrency
            ),
            format!("{} msg/s", thousands(self.broker.msg_per_s)),
        );
        row(
            format!(
                "journal ceiling: the article's 3 statements/action, {} connections, oncely's schema",
                self.journal.tasks
            ),
            format!("{} actions/s", thousands(self.journal.actions_per_s)),
        );
        row(
            format!(
                "journal ceiling: the same on the article's plain table, {} connections",
                self.journal_plain.tasks
            ),
            format!("{} actions/s", thousands(self.journal_plain.actions_per_s)),
        );
        row(
            format!(
                "journal floor: oncely's record, claim, completion, {} per statement, {} connections",
                w.concurrency, self.journal_batched.tasks
            ),
            format!(
                "{} actions/s",
                thousands(self.journal_batched.actions_per_s)
            ),
        );
        row(
            format!(
                "oncely end to end: {} workers, full load (prefetch = in-flight = {}, batch = {}, provider over {})",
                self.full_load.workers, w.worker_in_flight, w.worker_batch, w.provider_http
            ),
            format!("{} actions/s", thousands(self.full_load.actions_per_s)),
        );
        row(
            "  CPU per action, every process (ms)".into(),
            format!("{:.3}", cpu_ms_per_action(&self.full_load)),
        );
        row(
            "  oncely / broker ceiling, oncely / journal ceiling".into(),
            format!("{:.2}, {:.2}", self.ratio_broker, self.ratio_journal),
        );
        row(
            "  latency p50 / p95 / p99, full load".into(),
            format!(
                "{} / {} / {} ms",
                ms(self.full_load.p50_ms),
                ms(self.full_load.p95_ms),
                ms(self.full_load.p99_ms)
            ),
        );
        row(
            format!(
                "oncely through the gateway: HTTP request per action, {} connections, full load",
                crate::fleet::HTTP_CONNECTIONS
            ),
            format!(
                "{} actions/s, p50 / p99 {} / {} ms",
                thousands(self.via_gateway.actions_per_s),
                ms(self.via_gateway.p50_ms),
                ms(self.via_gateway.p99_ms)
            ),
        );
        row(
            "  gateway / SDK throughput".into(),
            format!("{:.2}", self.ratio_gateway),
        );
        row(
            format!(
                "latency p50 / p95 / p99, half load (paced at {}/s, got {}/s)",
                thousands(self.half_load.offered_per_s.unwrap_or(f64::NAN)),
                thousands(self.half_load.actions_per_s)
            ),
            format!(
                "{} / {} / {} ms",
                ms(self.half_load.p50_ms),
                ms(self.half_load.p95_ms),
                ms(self.half_load.p99_ms)
            ),
        );
        row(
            "  half load: recorded → claimed, claimed → succeeded (p50 / p99)".into(),
            format!(
                "{} / {} ms, {} / {} ms",
                ms(self.half_load.to_claim_ms[0]),
                ms(self.half_load.to_claim_ms[1]),
                ms(self.half_load.claim_to_done_ms[0]),
                ms(self.half_load.claim_to_done_ms[1])
            ),
        );
        if let Some(sl) = &self.slow {
            let r = &sl.result;
            row(
                format!(
                    "slow provider: {} ms, {} workers × {} in flight",
                    sl.latency_ms, r.workers, sl.in_flight
                ),
                format!("{} actions/s", thousands(r.actions_per_s)),
            );
            row(
                "  in-flight bound, CPU bound (full load), measured ÷ the smaller".into(),
                format!(
                    "{} / {} actions/s, {:.2}",
                    thousands(sl.inflight_bound),
                    thousands(sl.cpu_bound),
                    sl.vs_bound
                ),
            );
            row(
                "  latency p50 / p99: queueing's prediction, measured".into(),
                format!(
                    "{} / {} ms, {} / {} ms",
                    ms(sl.expected_p50_ms),
                    ms(sl.expected_p99_ms),
                    ms(r.p50_ms),
                    ms(r.p99_ms)
                ),
            );
            row(
                "  worker peak RSS (largest)".into(),
                format!("{:.1} MiB", r.max_rss_mib()),
            );
        }
        row(
            format!(
                "worker peak RSS, full load (VmHWM, largest of {})",
                self.full_load.peak_rss_mib.len()
            ),
            format!("{:.1} MiB", self.full_load.max_rss_mib()),
        );
        o.push_str(&t.render());
        let _ = writeln!(
            o,
            "The journal ceilings are the article's journal flow (insert planned, claim, complete: \
             3 autocommit statements per action), on oncely's real schema (checks, events) and on the article's plain table."
        );
        let _ = writeln!(
            o,
            "Latency = updated_at − created_at of each operation (recorded → succeeded, database clock). \
             CPU per action = cores busy in Postgres, RabbitMQ, workers and bench ÷ actions/s."
        );
        let _ = writeln!(o);

        let mut t = Table::new(&["design target", "measured", "target", ""]);
        for tg in &self.targets {
            t.row(&[
                tg.name.clone(),
                if tg.value >= 100.0 {
                    thousands(tg.value)
                } else {
                    format!("{:.3}", tg.value)
                },
                tg.target.clone(),
                if tg.reached { "reached" } else { "not reached" }.to_owned(),
            ]);
        }
        o.push_str(&t.render());
        let _ = writeln!(o);

        if !self.paced.is_empty() {
            let _ = writeln!(
                o,
                "latency curve ({} workers, paced at a share of the full-load rate; ms)",
                self.half_load.workers
            );
            let mut t = Table::new(&[
                "load",
                "offered/s",
                "got/s",
                "p50 / p99",
                "to claim p50 / p99",
                "claim → done p50 / p99",
            ]);
            for r in &self.paced {
                t.row(&[
                    r.paced_percent.map_or("-".into(), |p| format!("{p} %")),
                    thousands(r.offered_per_s.unwrap_or(f64::NAN)),
                    thousands(r.actions_per_s),
                    format!("{} / {}", ms(r.p50_ms), ms(r.p99_ms)),
                    format!("{} / {}", ms(r.to_claim_ms[0]), ms(r.to_claim_ms[1])),
                    format!(
                        "{} / {}",
                        ms(r.claim_to_done_ms[0]),
                        ms(r.claim_to_done_ms[1])
                    ),
                ]);
            }
            o.push_str(&t.render());
            let _ = writeln!(o);
        }

        let _ = writeln!(
            o,
            "scaling (full load, each worker in-flight = {}, batch = {}; each worker count run there and back, the ratio from their means; latencies in ms: recorded → succeeded, recorded → claimed, claimed → succeeded)",
            w.worker_in_flight, w.worker_batch
        );
        let mut t = Table::new(&[
            "workers",
            "run",
            "sandbox latency",
            "actions/s",
            "p50 / p99 ms",
            "to claim p50 / p99",
            "claim → done p50 / p99",
            "peak RSS",
            "enqueue s",
        ]);
        let mut rows: Vec<&FleetResult> = self.scaling_workers.iter().collect();
        let mut labels = run_labels(&self.scaling_workers);
        for r in &self.scaling_latency {
            if !rows
                .iter()
                .any(|x| x.workers == r.workers && x.sandbox_latency_ms == r.sandbox_latency_ms)
            {
                rows.push(r);
                labels.push(String::new());
            }
        }
        for (r, run) in rows.iter().zip(&labels) {
            t.row(&[
                r.workers.to_string(),
                run.clone(),
                format!("{} ms", r.sandbox_latency_ms),
                thousands(r.actions_per_s),
                format!("{} / {}", ms(r.p50_ms), ms(r.p99_ms)),
                format!("{} / {}", ms(r.to_claim_ms[0]), ms(r.to_claim_ms[1])),
                format!(
                    "{} / {}",
                    ms(r.claim_to_done_ms[0]),
                    ms(r.claim_to_done_ms[1])
                ),
                format!("{:.1} MiB", r.max_rss_mib()),
                format!("{:.2}", r.enqueue_seconds),
            ]);
        }
        o.push_str(&t.render());
        let _ = writeln!(o);

        let _ = writeln!(
            o,
            "where the CPU time went (cores busy, {} = all; bench = producer SDK + in-process sandbox)",
            m.nproc
        );
        let mut t = Table::new(&[
            "measurement",
            "postgres",
            "rabbitmq",
            "workers",
            "bench",
            "other",
            "iowait",
            "idle",
            "CPU wait",
            "ms CPU/action: pg",
            "mq",
            "workers",
            "bench",
            "total",
        ]);
        // Per action (or message): cores ÷ rate; `total` is what oncely's parts spent,
        // without "other" (the machine's other users) and without idle or iowait.
        let mut cpu_row = |name: String, c: &CpuUse, per_s: f64| {
            let per = |cores: f64| {
                if per_s > 0.0 {
                    format!("{:.3}", cores / per_s * 1000.0)
                } else {
                    "-".to_owned()
                }
            };
            t.row(&[
                name,
                format!("{:.2}", c.postgres),
                format!("{:.2}", c.rabbitmq),
                format!("{:.2}", c.workers),
                format!("{:.2}", c.bench),
                format!("{:.2}", c.other),
                format!("{:.2}", c.iowait),
                format!("{:.2}", c.idle),
                format!("{:.0} %", c.cpu_wait * 100.0),
                per(c.postgres),
                per(c.rabbitmq),
                per(c.workers),
                per(c.bench),
                per(c.oncely()),
            ]);
        };
        cpu_row(
            "broker ceiling (per message)".into(),
            &self.broker.cpu,
            self.broker.msg_per_s,
        );
        cpu_row(
            "journal ceiling".into(),
            &self.journal.cpu,
            self.journal.actions_per_s,
        );
        cpu_row(
            "journal ceiling, plain table".into(),
            &self.journal_plain.cpu,
            self.journal_plain.actions_per_s,
        );
        cpu_row(
            "journal floor (batched)".into(),
            &self.journal_batched.cpu,
            self.journal_batched.actions_per_s,
        );
        cpu_row(
            format!("oncely, {} workers, full load", self.full_load.workers),
            &self.full_load.cpu,
            self.full_load.actions_per_s,
        );
        for r in &self.paced {
            cpu_row(
                format!(
                    "oncely, {} workers, {} % load",
                    r.workers,
                    r.paced_percent.unwrap_or(0)
                ),
                &r.cpu,
                r.actions_per_s,
            );
        }
        cpu_row(
            format!("oncely via gateway, {} workers", self.via_gateway.workers),
            &self.via_gateway.cpu,
            self.via_gateway.actions_per_s,
        );
        for (r, run) in rows.iter().zip(&labels) {
            let run = if run.is_empty() {
                String::new()
            } else {
                format!(", run {run}")
            };
            cpu_row(
                format!(
                    "oncely, {} workers, latency {} ms{run}",
                    r.workers, r.sandbox_latency_ms
                ),
                &r.cpu,
                r.actions_per_s,
            );
        }
        if let Some(sl) = &self.slow {
            cpu_row(
                format!(
                    "oncely, slow provider {} ms, {} in flight",
                    sl.latency_ms, sl.in_flight
                ),
                &sl.result.cpu,
                sl.result.actions_per_s,
            );
        }
        o.push_str(&t.render());
        let _ = writeln!(
            o,
            "CPU wait: share of the run's wall time in which some runnable task waited for a CPU (/proc/pressure/cpu, \"some\")"
        );
        o
    }
}

/// `12,345`.
fn thousands(v: f64) -> String {
    if !v.is_finite() {
        return "n/a".into();
    }
    let s = format!("{:.0}", v);
    let (sign, digits) = s.strip_prefix('-').map_or(("", s.as_str()), |d| ("-", d));
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    format!("{sign}{out}")
}

/// Milliseconds with one decimal below 100, none above.
fn ms(v: f64) -> String {
    if !v.is_finite() {
        "n/a".into()
    } else if v < 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

/// A plain text table, columns padded to their widest cell; the first column is
/// left-aligned, the others right-aligned except the last.
struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(head: &[&str]) -> Table {
        Table {
            rows: vec![head.iter().map(|h| (*h).to_owned()).collect()],
        }
    }

    fn row(&mut self, cells: &[String]) {
        self.rows.push(cells.to_vec());
    }

    fn render(&self) -> String {
        let cols = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let width: Vec<usize> = (0..cols)
            .map(|c| {
                self.rows
                    .iter()
                    .map(|r| r.get(c).map_or(0, |s| s.chars().count()))
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for (i, r) in self.rows.iter().enumerate() {
            let mut line = String::new();
            for (c, w) in width.iter().enumerate() {
                let cell = r.get(c).map_or("", String::as_str);
                let pad = w - cell.chars().count();
                if c > 0 {
                    line.push_str("  ");
                }
                if c == 0 || c == cols - 1 {
                    line.push_str(cell);
                    line.push_str(&" ".repeat(pad));
                } else {
                    line.push_str(&" ".repeat(pad));
                    line.push_str(cell);
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
            if i == 0 {
                let total: usize = width.iter().sum::<usize>() + 2 * cols.saturating_sub(1);
                out.push_str(&"-".repeat(total));
                out.push('\n');
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_well() {
        assert_eq!(thousands(1234567.4), "1,234,567");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(thousands(f64::NAN), "n/a");
        assert_eq!(ms(12.345), "12.3");
        assert_eq!(ms(1234.5), "1234");
    }

    #[test]
    fn scaling_compares_the_means_of_each_worker_count() {
        // There and back: 1, 2, 4, then 4, 2, 1; means 100, 200, 300.
        let runs = [
            (1, 120.0),
            (2, 300.0),
            (4, 200.0),
            (4, 400.0),
            (2, 100.0),
            (1, 80.0),
        ];
        assert_eq!(scaling_ratio(runs), Some(1.5));
        // A fall shows: 4 workers' mean below 2 workers'.
        assert_eq!(
            scaling_ratio([(2, 400.0), (4, 300.0), (4, 300.0), (2, 400.0)]),
            Some(0.75)
        );
        assert_eq!(scaling_ratio([(2, 400.0)]), None);
    }

    #[test]
    fn tables_align() {
        let mut t = Table::new(&["a", "b"]);
        t.row(&["long name".into(), "1".into()]);
        let s = t.render();
        assert!(s.contains("long name  1"));
    }
}
