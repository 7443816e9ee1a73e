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

/// Design targets (ratios to the two ceilings, and two absolute limits; see
/// `docs/performance.md`).
pub const TARGET_VS_BROKER: f64 = 0.6;
/// oncely ≥ this × the article's journal flow.
pub const TARGET_VS_JOURNAL: f64 = 1.5;
/// p99 at half load (ms).
pub const TARGET_P99_HALF_MS: f64 = 50.0;
/// Worker peak RSS (MiB).
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
        let (version, sync) = db::server_facts(&pool).await?;
        pool.close().await;
        // The error names the broker (never the password).
        let conn = topology::connect(&BrokerConfig::at(amqp_url), "oncely-bench-probe").await?;
        let _ = conn.close(200, "probe".into()).await;
        Ok(Services {
            postgres: db::describe(database_url),
            postgres_version: version,
            synchronous_commit: sync,
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
    /// Workers of the headline runs.
    pub fleet: usize,
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
    /// Journal ceiling (the article's flow).
    pub journal: JournalResult,
    /// oncely, full load.
    pub full_load: FleetResult,
    /// oncely, full load, enqueued over HTTP through the gateway.
    pub via_gateway: FleetResult,
    /// via_gateway / full_load throughput.
    pub ratio_gateway: f64,
    /// oncely, half load.
    pub half_load: FleetResult,
    /// Scaling by workers (sandbox latency 0).
    pub scaling_workers: Vec<FleetResult>,
    /// Scaling by sandbox latency (headline workers).
    pub scaling_latency: Vec<FleetResult>,
    /// oncely / broker ceiling.
    pub ratio_broker: f64,
    /// oncely / journal ceiling.
    pub ratio_journal: f64,
    /// The design targets.
    pub targets: Vec<Target>,
}

impl Report {
    /// Assemble, computing ratios and targets.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        started: chrono::DateTime<chrono::Utc>,
        command: String,
        machine: Machine,
        services: Services,
        workload: Workload,
        broker: BrokerResult,
        journal: JournalResult,
        full_load: FleetResult,
        via_gateway: FleetResult,
        half_load: FleetResult,
        scaling_workers: Vec<FleetResult>,
        scaling_latency: Vec<FleetResult>,
    ) -> Report {
        let ratio_gateway = via_gateway.actions_per_s / full_load.actions_per_s;
        let ratio_broker = full_load.actions_per_s / broker.msg_per_s;
        let ratio_journal = full_load.actions_per_s / journal.actions_per_s;
        let rss = full_load.max_rss_mib();
        let targets = vec![
            Target {
                name: "oncely / broker ceiling".into(),
                target: format!("≥ {TARGET_VS_BROKER:.2}"),
                value: ratio_broker,
                reached: ratio_broker >= TARGET_VS_BROKER,
            },
            Target {
                name: "oncely / journal flow".into(),
                target: format!("≥ {TARGET_VS_JOURNAL:.2}"),
                value: ratio_journal,
                reached: ratio_journal >= TARGET_VS_JOURNAL,
            },
            Target {
                name: "p99 at half load (ms)".into(),
                target: format!("≤ {TARGET_P99_HALF_MS:.0} ms"),
                value: half_load.p99_ms,
                reached: half_load.p99_ms <= TARGET_P99_HALF_MS,
            },
            Target {
                name: "worker peak RSS (MiB)".into(),
                target: format!("≤ {TARGET_RSS_MIB:.0} MiB"),
                value: rss,
                reached: rss <= TARGET_RSS_MIB,
            },
        ];
        Report {
            date: started.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
            command,
            machine,
            services,
            workload,
            broker,
            journal,
            full_load,
            via_gateway,
            ratio_gateway,
            half_load,
            scaling_workers,
            scaling_latency,
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
        let _ = writeln!(
            o,
            "machine:  {} CPUs ({}), {:.1} GiB RAM, Linux {}, load {} at start",
            m.nproc,
            m.cpu_model,
            m.memory_mib as f64 / 1024.0,
            m.kernel,
            m.load_at_start
        );
        let _ = writeln!(
            o,
            "services: PostgreSQL {} (synchronous_commit={}) {}, RabbitMQ {}",
            sv.postgres_version, sv.synchronous_commit, sv.postgres, sv.rabbitmq
        );
        let _ = writeln!(
            o,
            "workload: {} operations per measurement (email.send, ticket.create, payment_order.create in turn), \
             {:.0}-byte messages, C = {}",
            w.intents, w.message_bytes, w.concurrency
        );
        let _ = writeln!(o);

        let mut t = Table::new(&["measurement", "figure", "design target", ""]);
        t.row(&[
            format!(
                "broker ceiling: quorum queue, confirms (window {}) + acks, prefetch {}",
                w.confirm_window, w.concurrency
            ),
            format!("{} msg/s", thousands(self.broker.msg_per_s)),
            String::new(),
            String::new(),
        ]);
        t.row(&[
            format!(
                "journal ceiling: the article's 3 statements/action, {} connections, oncely's schema",
                self.journal.tasks
            ),
            format!("{} actions/s", thousands(self.journal.actions_per_s)),
            String::new(),
            String::new(),
        ]);
        t.row(&[
            format!(
                "oncely end to end: {} workers, full load (prefetch = in-flight = batch = {})",
                self.full_load.workers, w.concurrency
            ),
            format!("{} actions/s", thousands(self.full_load.actions_per_s)),
            String::new(),
            String::new(),
        ]);
        let verdict = |i: usize| {
            if self.targets[i].reached {
                "reached".to_owned()
            } else {
                "not reached".to_owned()
            }
        };
        t.row(&[
            "  oncely / broker ceiling".into(),
            format!("{:.2}", self.ratio_broker),
            self.targets[0].target.clone(),
            verdict(0),
        ]);
        t.row(&[
            "  oncely / journal ceiling".into(),
            format!("{:.2}", self.ratio_journal),
            self.targets[1].target.clone(),
            verdict(1),
        ]);
        t.row(&[
            "latency p50 / p95 / p99, full load".into(),
            format!(
                "{} / {} / {} ms",
                ms(self.full_load.p50_ms),
                ms(self.full_load.p95_ms),
                ms(self.full_load.p99_ms)
            ),
            String::new(),
            String::new(),
        ]);
        t.row(&[
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
            String::new(),
            String::new(),
        ]);
        t.row(&[
            "  gateway / SDK throughput".into(),
            format!("{:.2}", self.ratio_gateway),
            String::new(),
            String::new(),
        ]);
        t.row(&[
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
            format!("p99 {}", self.targets[2].target),
            verdict(2),
        ]);
        t.row(&[
            "  half load: recorded → claimed, claimed → succeeded (p50 / p99)".into(),
            format!(
                "{} / {} ms, {} / {} ms",
                ms(self.half_load.to_claim_ms[0]),
                ms(self.half_load.to_claim_ms[1]),
                ms(self.half_load.claim_to_done_ms[0]),
                ms(self.half_load.claim_to_done_ms[1])
            ),
            String::new(),
            String::new(),
        ]);
        t.row(&[
            format!(
                "worker peak RSS (VmHWM, largest of {})",
                self.full_load.peak_rss_mib.len()
            ),
            format!("{:.1} MiB", self.full_load.max_rss_mib()),
            self.targets[3].target.clone(),
            verdict(3),
        ]);
        o.push_str(&t.render());
        let _ = writeln!(
            o,
            "The journal ceiling is the article's journal flow (insert planned, claim, complete: \
             3 autocommit statements per action) run on oncely's real schema with its checks and events trigger."
        );
        let _ = writeln!(
            o,
            "Latency = updated_at − created_at of each operation (recorded → succeeded, database clock)."
        );
        let _ = writeln!(o);

        let _ = writeln!(
            o,
            "scaling (full load, C = {} per worker; latencies in ms: recorded → succeeded, recorded → claimed, claimed → succeeded)",
            w.concurrency
        );
        let mut t = Table::new(&[
            "workers",
            "sandbox latency",
            "actions/s",
            "p50 / p99 ms",
            "to claim p50 / p99",
            "claim → done p50 / p99",
            "peak RSS",
            "enqueue s",
        ]);
        let mut rows: Vec<&FleetResult> = self.scaling_workers.iter().collect();
        for r in &self.scaling_latency {
            if !rows
                .iter()
                .any(|x| x.workers == r.workers && x.sandbox_latency_ms == r.sandbox_latency_ms)
            {
                rows.push(r);
            }
        }
        for r in &rows {
            t.row(&[
                r.workers.to_string(),
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
        ]);
        let mut cpu_row = |name: String, c: &CpuUse| {
            t.row(&[
                name,
                format!("{:.2}", c.postgres),
                format!("{:.2}", c.rabbitmq),
                format!("{:.2}", c.workers),
                format!("{:.2}", c.bench),
                format!("{:.2}", c.other),
                format!("{:.2}", c.iowait),
                format!("{:.2}", c.idle),
            ]);
        };
        cpu_row("broker ceiling".into(), &self.broker.cpu);
        cpu_row("journal ceiling".into(), &self.journal.cpu);
        cpu_row(
            format!("oncely, {} workers, half load", self.half_load.workers),
            &self.half_load.cpu,
        );
        for r in &rows {
            cpu_row(
                format!(
                    "oncely, {} workers, latency {} ms",
                    r.workers, r.sandbox_latency_ms
                ),
                &r.cpu,
            );
        }
        o.push_str(&t.render());
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
    fn tables_align() {
        let mut t = Table::new(&["a", "b"]);
        t.row(&["long name".into(), "1".into()]);
        let s = t.render();
        assert!(s.contains("long name  1"));
    }
}
