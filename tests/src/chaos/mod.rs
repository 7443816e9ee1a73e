//! The chaos run (`oncely-chaos`, see `docs/chaos.md`): a whole fleet of real processes
//! — the producer SDK, ≥ 3 `oncely-worker run`, ≥ 2 `oncely-worker reconcile`, the
//! sandbox — under a seeded fault schedule (SIGKILL, fail points, SIGSTOP past the lease,
//! broker connection closes, Postgres backend terminations, provider faults, lookup
//! outages, repeated and conflicting intents) — while an approval rule holds a tenth of
//! the payment orders for an approver, a canceller cancels intents at random moments and
//! some intents expire; then healed and checked against the sandbox's ground truth and
//! the journal's event trail.
//!
//! Everything random is drawn from [`Rng`] streams derived from one seed, so a run's
//! workload and fault schedule are repeatable (the processes' timing is not).
//!
//! # Layout
//!
//! This file holds the options and the run from start to end; each step lives in its own
//! module:
//!
//! - `workload`: the intents, the batches they are submitted in, and the producer task;
//! - `crew`: the worker and reconciler processes (spawn, kill, stop, exit accounting);
//! - `control`: the approval rule, the approver and the canceller (docs/approvals.md);
//! - `faults`: broker, Postgres and provider faults;
//! - `outages`: whole servers lost (`--cluster`: RabbitMQ nodes; `--failover`: the
//!   Postgres primary);
//! - `schedule`: what is done when — the fault phase, then the heal;
//! - `facts`: what is read once the fleet has stopped, as plain data;
//! - `checks`: the verdict, a pure function from the facts to typed findings;
//! - `report`: the printed figures and findings, and what is kept for reading;
//! - `self_test`: `--self-test`'s forged faults, the guard that the checks can fail;
//! - `logs`, `http`, `rng`: the processes' logs, a bare HTTP client, the seeded draws.

mod checks;
mod control;
mod crew;
mod facts;
mod faults;
mod http;
mod logs;
mod outages;
mod report;
mod rng;
mod schedule;
mod self_test;
mod workload;

pub use rng::Rng;

use crate::fleet::{FAST_RECONCILER, Fleet, FleetOptions};
use crate::private_broker::PrivateBroker;
use crate::private_cluster::PrivateCluster;
use crate::private_pg::PrivatePg;
use crew::{Binaries, Crew};
use facts::{Facts, Figures};
use faults::Faults;
use schedule::Timeline;
use serde_json::Value;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};
use workload::Workload;

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
/// The main loop's tick.
const TICK: Duration = Duration::from_millis(100);

/// Providers the fleet reaches over HTTPS (the sandbox's TLS listener, a test CA), with
/// faults at the TLS layer too (handshakes dropped or stalled: *not sent*).
const TLS_PROVIDERS: &[&str] = &["bank"];

/// The action types, with the provider each goes to.
const ACTIONS: [(&str, &str); 3] = [
    ("email.send", "mail"),
    ("ticket.create", "tickets"),
    ("payment_order.create", "bank"),
];

/// Usage text.
pub const USAGE: &str = "\
oncely-chaos: real processes under a seeded fault schedule, healed, then checked against
the sandbox's ground truth (duplicates, lost, unexpected, mismatches, and cancelled or
expired actions with an effect must all be 0).

USAGE: oncely-chaos [--seed N] [--intents N] [--min-kills N] [--duration-secs N]
                    [--heal-secs N] [--workers N] [--reconcilers N] [--nightly]
                    [--no-broker-faults | --private-broker] [--secure | --pooler]
                    [--cluster] [--failover] [--no-build]
                    [--keep-logs]
                    [--self-test]

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
  --secure            production security (implies --private-broker): a private TLS-only
                      Postgres (sslmode=verify-full) and a private RabbitMQ node on amqps://
                      with client certificates; every process on its own least-privilege
                      Postgres login and RabbitMQ user; payloads sealed (docs/security.md)
  --pooler            every process and producer through a private pgbouncer in transaction
                      pooling mode (10 server connections for the whole fleet;
                      database_pooler = \"transaction\"; docs/scaling.md)
  --cluster           a private three-node RabbitMQ cluster (every process gets the three
                      URLs, broker.urls); the node leading the email action queue is
                      SIGKILLed at 20 % of the fault phase and restarted 8 s later, then
                      another node at 60 %; connection closes hit a random node
  --failover          a private Postgres primary with a synchronous streaming standby,
                      every process on the two-host DATABASE_URL; at 45 % of the fault
                      phase the primary crashes (pg_ctl stop -m immediate) and the standby
                      is promoted (docs/scaling.md)
  --no-build          do not build the workers first (`cargo build -p oncely-worker`, and
                      the fail-point worker into target/failpoints)
  --keep-logs         keep the logs, schedule and report even when the run passes
  --self-test         after healing, forge one duplicate, one lost intent, one unexpected
                      effect and one mismatch: the checks must report them (exit 1)

Exit code: 0 all checks passed; 1 a check failed (details printed, logs kept);
2 the run could not be carried out.";

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
    /// Least-privilege logins and broker users for every process (a private broker).
    pub secure: bool,
    /// Every process through a private pgbouncer (transaction pooling).
    pub pooler: bool,
    /// A private three-node RabbitMQ cluster whose nodes are killed.
    pub cluster: bool,
    /// A private primary and standby; the primary crashes, the standby is promoted.
    pub failover: bool,
}

/// The command line as given, before defaults and limits.
#[derive(Debug)]
struct Flags {
    seed: Option<u64>,
    intents: Option<usize>,
    min_kills: Option<u64>,
    duration: Option<u64>,
    heal: Option<u64>,
    workers: usize,
    reconcilers: usize,
    nightly: bool,
    broker: BrokerFaults,
    build: bool,
    self_test: bool,
    keep_logs: bool,
    secure: bool,
    pooler: bool,
    cluster: bool,
    failover: bool,
}

impl Default for Flags {
    fn default() -> Self {
        Flags {
            seed: None,
            intents: None,
            min_kills: None,
            duration: None,
            heal: None,
            workers: 5,
            reconcilers: 2,
            nightly: false,
            broker: BrokerFaults::Shared,
            build: true,
            self_test: false,
            keep_logs: false,
            secure: false,
            pooler: false,
            cluster: false,
            failover: false,
        }
    }
}

/// The value after `flag`, parsed.
fn num<T: std::str::FromStr>(flag: &str, v: Option<&String>) -> Result<T, String> {
    v.ok_or_else(|| format!("{flag} needs a value"))?
        .parse()
        .map_err(|_| format!("{flag}: not a number"))
}

impl Flags {
    /// Read the flags; `Ok(None)`: `--help`.
    fn parse(args: &[String]) -> Result<Option<Flags>, String> {
        let mut f = Flags::default();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            match a.as_str() {
                "--seed" => f.seed = Some(num(a, it.next())?),
                "--intents" => f.intents = Some(num(a, it.next())?),
                "--min-kills" => f.min_kills = Some(num(a, it.next())?),
                "--duration-secs" => f.duration = Some(num(a, it.next())?),
                "--heal-secs" => f.heal = Some(num(a, it.next())?),
                "--workers" => f.workers = num(a, it.next())?,
                "--reconcilers" => f.reconcilers = num(a, it.next())?,
                "--nightly" => f.nightly = true,
                "--no-broker-faults" => f.broker = BrokerFaults::Off,
                "--private-broker" => f.broker = BrokerFaults::Private,
                "--no-build" => f.build = false,
                "--self-test" => f.self_test = true,
                "--keep-logs" => f.keep_logs = true,
                "--secure" => f.secure = true,
                "--pooler" => f.pooler = true,
                "--cluster" => f.cluster = true,
                "--failover" => f.failover = true,
                "-h" | "--help" => return Ok(None),
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        Ok(Some(f))
    }

    /// Apply the limits and the (CI or nightly) defaults.
    fn resolve(self) -> Result<Options, String> {
        if self.workers < 3 {
            return Err("--workers must be at least 3".into());
        }
        if self.reconcilers < 2 {
            return Err("--reconcilers must be at least 2".into());
        }
        if self.secure && self.pooler {
            return Err("--pooler runs on the machine's Postgres users: not with --secure".into());
        }
        if self.secure && (self.cluster || self.failover) {
            return Err("--cluster and --failover run without TLS: not with --secure".into());
        }
        if self.pooler && self.failover {
            return Err("--failover gives every process both hosts: not with --pooler".into());
        }
        let seed = self.seed.unwrap_or_else(|| {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            (nanos ^ (u64::from(std::process::id()) << 32)) % 1_000_000_000
        });
        let (d_intents, d_kills, d_duration, d_heal) = if self.nightly {
            (50_000, 300, 900, 900)
        } else {
            (2_000, 20, 60, 180)
        };
        let intents = self.intents.unwrap_or(d_intents);
        if intents < 20 {
            return Err("--intents must be at least 20".into());
        }
        Ok(Options {
            seed,
            intents,
            min_kills: self.min_kills.unwrap_or(d_kills),
            duration: Duration::from_secs(self.duration.unwrap_or(d_duration)),
            heal: Duration::from_secs(self.heal.unwrap_or(d_heal)),
            workers: self.workers,
            reconcilers: self.reconcilers,
            broker: if self.secure || (self.cluster && self.broker == BrokerFaults::Shared) {
                BrokerFaults::Private
            } else {
                self.broker
            },
            nightly: self.nightly,
            build: self.build,
            self_test: self.self_test,
            keep_logs: self.keep_logs,
            secure: self.secure,
            pooler: self.pooler,
            cluster: self.cluster,
            failover: self.failover,
        })
    }
}

impl Options {
    /// Parse the command line (without the program name). `Ok(None)`: `--help`.
    pub fn from_args(args: &[String]) -> Result<Option<Options>, String> {
        match Flags::parse(args)? {
            Some(flags) => flags.resolve().map(Some),
            None => Ok(None),
        }
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

/// Aborts a task when dropped.
#[derive(Debug)]
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Carry out one chaos run.
pub async fn run(opts: Options) -> anyhow::Result<Outcome> {
    let wall = Instant::now();
    let bins = Binaries::prepare(opts.build)?;
    let seed = opts.seed;
    eprintln!(
        "chaos: seed {seed}, {} intents, fault phase ≥ {:?} and ≥ {} random kills, broker faults {:?}",
        opts.intents, opts.duration, opts.min_kills, opts.broker
    );
    // --secure: TLS to both (a private TLS-only Postgres cluster with `verify-full`, a
    // private RabbitMQ node on `amqps://` that requires a client certificate), then a
    // least-privilege login and broker user per kind of process.
    let secure = if opts.secure {
        eprintln!("chaos: starting a private TLS-only Postgres cluster");
        Some(Secure::start().await)
    } else {
        None
    };
    // --cluster: three private nodes; --failover: a primary and its synchronous standby.
    let cluster = if opts.cluster {
        eprintln!("chaos: starting a private three-node RabbitMQ cluster");
        Some(Arc::new(PrivateCluster::start().await))
    } else {
        None
    };
    let postgres = if opts.failover {
        eprintln!("chaos: starting a private Postgres primary and a synchronous standby");
        let primary = PrivatePg::start_primary().await;
        let standby = PrivatePg::start_replica(&primary).await;
        Some(Arc::new((primary, standby)))
    } else {
        None
    };
    let private = if cluster.is_some() {
        None
    } else if let Some(secure) = &secure {
        eprintln!("chaos: starting a private RabbitMQ node with a TLS listener");
        Some(secure.broker().await)
    } else if opts.broker == BrokerFaults::Private {
        eprintln!("chaos: starting a private RabbitMQ node");
        Some(PrivateBroker::start().await)
    } else {
        None
    };
    let node = match (&private, &cluster) {
        (Some(b), _) => Some(b.node().to_owned()),
        (None, Some(c)) => Some(c.nodes()[0].node().to_owned()),
        (None, None) => None,
    };
    let mut fleet_options = FleetOptions {
        timeout: PROVIDER_TIMEOUT.into(),
        lease: LEASE.into(),
        max_reconcile_checks: Some(MAX_RECONCILE_CHECKS as i32),
        reconciler: Some(FAST_RECONCILER),
        amqp_url: private.as_ref().map(PrivateBroker::url),
        tls: TLS_PROVIDERS,
        seal_payloads: true,
        amqp_urls: cluster.as_ref().map(|c| c.urls()).unwrap_or_default(),
        database_server: postgres.as_ref().map(|p| p.0.url("127.0.0.1", "")),
        configure: Some(control::configure),
        ..FleetOptions::default()
    };
    if let (Some(secure), Some(broker)) = (&secure, &private) {
        secure.connect(&mut fleet_options, broker);
    }
    let mut fleet = Fleet::with(fleet_options).await;
    if opts.secure {
        eprintln!(
            "chaos: least privilege: a Postgres login and a RabbitMQ user per process kind, \
             over verify-full TLS and amqps:// with a client certificate"
        );
        fleet.least_privilege(private.as_ref()).await;
    }
    let bouncer = if opts.pooler {
        eprintln!(
            "chaos: every process through a private pgbouncer (transaction pooling, 10 server connections)"
        );
        let b = crate::pgbouncer::Pgbouncer::start(&crate::server_url(), 10, &["postgres"]).await;
        fleet.through_pooler(&b);
        Some(b)
    } else {
        None
    };
    let mut servers = outages::Servers::default();
    let mut pg_servers = Vec::new();
    if let Some(pair) = &postgres {
        let (primary, standby) = &**pair;
        eprintln!(
            "chaos: every process on the two-host URL (primary :{}, standby :{})",
            primary.port(),
            standby.port()
        );
        fleet
            .on_hosts(primary.with_standby(&fleet.db.url, standby))
            .await;
        pg_servers = vec![primary.url("127.0.0.1", ""), standby.url("127.0.0.1", "")];
        servers.postgres = Some(pair.clone());
    }
    let mut nodes = Vec::new();
    if let Some(cluster) = &cluster {
        nodes = cluster
            .nodes()
            .iter()
            .map(|n| n.node().to_owned())
            .collect();
        servers.cluster = Some((cluster.clone(), fleet.topology().action_queue("email.send")));
    }
    let setup = wall.elapsed();
    let on = Servers {
        node: node.as_deref(),
        nodes,
        pg_servers,
        outages: servers,
    };
    let result = drive(&opts, &fleet, &bins, on, setup, wall).await;
    let outcome = match result {
        Ok(o) => o,
        Err(e) => {
            let kept = report::keep(&fleet, seed);
            eprintln!("chaos: run failed: {e:#}; logs kept in {}", kept.display());
            return Err(e);
        }
    };
    drop(fleet);
    drop(bouncer);
    drop(private);
    drop(cluster);
    drop(postgres);
    drop(secure);
    Ok(outcome)
}

/// The servers of a run beyond the machine's own: the private node (or cluster) that
/// `rabbitmqctl` asks, the nodes and Postgres servers faults go to, and the outages.
struct Servers<'a> {
    node: Option<&'a str>,
    nodes: Vec<String>,
    pg_servers: Vec<String>,
    outages: outages::Servers,
}

/// The TLS side of `--secure`: a test CA, a private TLS-only Postgres cluster (its
/// `pg_hba.conf` rejects plain connections) and the files of the fleet's client
/// certificate for RabbitMQ.
struct Secure {
    dir: PathBuf,
    ca: crate::tls::TestCa,
    pg: crate::private_pg::PrivatePg,
}

impl Secure {
    async fn start() -> Secure {
        let dir = std::env::temp_dir().join(crate::unique_name("oncely_chaos_tls"));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let ca = crate::tls::TestCa::new(&dir, "ca");
        let pg = crate::private_pg::PrivatePg::start(crate::private_pg::PgTls::On {
            ca: &ca,
            names: &["localhost"],
        })
        .await;
        Secure { dir, ca, pg }
    }

    /// A private RabbitMQ node whose TLS listener requires a client certificate.
    async fn broker(&self) -> PrivateBroker {
        PrivateBroker::start_tls(crate::private_broker::BrokerTls {
            ca: &self.ca,
            names: &["localhost"],
            require_client_cert: true,
        })
        .await
    }

    /// Point the fleet at the TLS endpoints: Postgres with `sslmode=verify-full`, the
    /// broker at `amqps://localhost` with the CA and a client certificate.
    fn connect(&self, o: &mut FleetOptions, broker: &PrivateBroker) {
        let (cert_file, key_file) = self.ca.client_files(&self.dir, "fleet", "oncely-chaos");
        o.database_server = Some(self.pg.verify_full_url("localhost", self.ca.ca_file()));
        o.amqp_url = Some(broker.tls_url("localhost"));
        o.broker_tls = oncely_core::config::BrokerTls {
            ca_file: Some(self.ca.ca_file().to_owned()),
            cert_file: Some(cert_file),
            key_file: Some(key_file),
        };
    }
}

impl Drop for Secure {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The run's steps: workload and crew started, the fault phase, the heal, the fleet
/// stopped, the facts gathered and checked, the report.
async fn drive(
    opts: &Options,
    fleet: &Fleet,
    bins: &Binaries,
    on: Servers<'_>,
    setup: Duration,
    wall: Instant,
) -> anyhow::Result<Outcome> {
    let node = on.node;
    let workload = Arc::new(Workload::new(opts.seed, opts.intents)?);
    let timeline = Timeline::default();
    let mut crew = Crew::new(fleet, bins, opts.seed, timeline.clone());
    crew.maintain(opts.workers, opts.reconcilers, true)?;
    let progress = Arc::new(AtomicU64::new(0));
    let span = opts.duration.mul_f64(0.85);
    let producer = tokio::spawn(workload::produce(
        fleet.producer_config(),
        fleet.data_keys(),
        opts.seed,
        workload.clone(),
        span,
        progress.clone(),
    ));
    // If the run ends early (an error), the producer must not outlive it.
    let _stop_producer = AbortOnDrop(producer.abort_handle());
    // The approver and the canceller, on the fleet's own journal pool.
    let phase = control::Phase::default();
    let approver = tokio::spawn(control::approver(
        fleet.db.journal(),
        opts.seed,
        phase.clone(),
        timeline.clone(),
    ));
    let _stop_approver = AbortOnDrop(approver.abort_handle());
    let pace = span.div_f64(workload.batches.len().max(1) as f64);
    let canceller = tokio::spawn(control::canceller(
        fleet.db.journal(),
        workload.clone(),
        control::cancel_plan(opts.seed, opts.intents, pace),
        phase.clone(),
        timeline.clone(),
    ));
    let _stop_canceller = AbortOnDrop(canceller.abort_handle());
    let mut faults =
        Faults::new(fleet, node, opts, timeline.clone()).on_servers(on.nodes, on.pg_servers);
    let outages = outages::Outages::start(on.outages, opts.duration, timeline.clone());
    let fault_phase =
        schedule::fault_phase(opts, fleet, &mut crew, &mut faults, &producer, &progress).await?;
    let outage_tally = outages.finish().await?;
    let produced = producer.await?;
    // Every intent is submitted: the approver decides every held operation now, the
    // canceller sends the rest of its cancels; healing waits for the held ones too.
    phase.drain();
    let healed = schedule::heal(opts, fleet, &mut crew, &mut faults, node).await?;
    phase.stop();
    let approved = approver.await?;
    let cancels = canceller.await?;
    crew.stop_all(Duration::from_secs(20)).await;
    if opts.self_test {
        self_test::forge(fleet).await?;
    }
    // The sandbox's counters before the checks' own lookups, which it counts too.
    let stats = fleet.sandbox.control().stats().await.unwrap_or(Value::Null);
    let ran = facts::Ran {
        workload: &workload,
        produced: &produced,
        approver: &approved,
        cancels: &cancels,
    };
    let facts = Facts::gather(fleet, ran, &healed, opts.heal, &stats).await?;
    let verdict = checks::check(&facts);
    let figures = Figures::gather(fleet, node, stats).await?;
    let logs = logs::read_all(&fleet.dir);
    let run = report::Run {
        opts,
        times: report::Times {
            setup,
            faults: fault_phase,
            producer: produced.seconds,
            heal: healed.took,
            wall,
        },
        workload: &workload,
        produced: &produced,
        crew: &crew.tally,
        faults: &faults.tally,
        outages: &outage_tally,
        approver: &approved,
        cancels: &cancels,
        facts: &facts,
        figures: &figures,
        verdict: &verdict,
        logs: &logs,
        log_figures: &logs::figures(&logs),
    };
    report::finish(&run, fleet, &timeline).await
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let o = Options::from_args(&args(&["--cluster", "--failover"]))
            .expect("parse")
            .expect("options");
        assert!(o.cluster && o.failover);
        assert_eq!(
            o.broker,
            BrokerFaults::Private,
            "a cluster's nodes are private"
        );
        let o = Options::from_args(&args(&["--cluster", "--no-broker-faults"]))
            .expect("parse")
            .expect("options");
        assert_eq!(
            o.broker,
            BrokerFaults::Off,
            "node kills without connection closes"
        );
        for bad in [
            &["--failover", "--pooler"][..],
            &["--cluster", "--secure"],
            &["--failover", "--secure"],
        ] {
            assert!(Options::from_args(&args(bad)).is_err(), "{bad:?}");
        }
        assert!(
            Options::from_args(&["--help".into()])
                .expect("parse")
                .is_none()
        );
    }
}
