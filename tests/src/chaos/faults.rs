//! Faults outside the processes: broker connection closes, Postgres backend terminations,
//! and the sandbox's provider faults (timeouts after accepting, resets, 5xx, rejections,
//! latency, lookup outages, and on the HTTPS provider handshakes dropped or stalled). Each is something production sees; the run throws them at
//! the fleet at random times (the schedule decides when) with random parameters drawn
//! from the provider-fault stream of the run's seed (decided here).

use super::rng::Rng;
use super::schedule::Timeline;
use super::{ACTIONS, BrokerFaults, Options};
use crate::fleet::Fleet;
use serde_json::{Value, json};
use sqlx::Connection;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::process::Command;

/// What the faults did.
#[derive(Debug, Default)]
pub(super) struct FaultTally {
    /// `close_all_connections` rounds that succeeded (counted by background tasks).
    pub broker_rounds: Arc<AtomicU64>,
    /// … that failed.
    pub broker_failed: Arc<AtomicU64>,
    /// Rounds of Postgres backend terminations.
    pub pg_rounds: u64,
    /// Backends terminated.
    pub pg_terminated: u64,
    /// Rounds that failed.
    pub pg_failed: u64,
    /// Provider fault configurations applied.
    pub fault_configs: u64,
    /// … that the sandbox refused.
    pub fault_config_failed: u64,
    /// Lookup outage changes.
    pub lookup_toggles: u64,
}

/// The faults of a run, and the provider faults in force.
#[derive(Debug)]
pub(super) struct Faults<'a> {
    fleet: &'a Fleet,
    control: oncely_sandbox::control::Client,
    /// The private nodes whose connections are closed (one, or the cluster's three: a
    /// random one each round); empty: the machine's broker.
    nodes: Vec<String>,
    /// The maintenance URLs of the Postgres servers whose backends are terminated (the
    /// fleet's; with `--failover` the primary and the standby, whichever answers).
    pg_servers: Vec<String>,
    broker: BrokerFaults,
    rng: Rng,
    rules: Vec<Value>,
    lookup_off: Vec<&'static str>,
    /// What the faults did.
    pub tally: FaultTally,
    timeline: Timeline,
}

impl<'a> Faults<'a> {
    /// No faults yet; `node` is the private broker's, if the run has one.
    pub fn new(fleet: &'a Fleet, node: Option<&str>, opts: &Options, timeline: Timeline) -> Self {
        Faults {
            fleet,
            control: fleet.sandbox.control(),
            nodes: node.map(str::to_owned).into_iter().collect(),
            pg_servers: vec![fleet.db.server_url()],
            broker: opts.broker,
            rng: Rng::new(opts.seed ^ 0x5EED_0003),
            rules: Vec::new(),
            lookup_off: Vec::new(),
            tally: FaultTally::default(),
            timeline,
        }
    }

    /// Close connections on any of `nodes` (a private cluster's), and terminate backends
    /// on each of `pg_servers` that answers (a primary and its standby).
    pub fn on_servers(mut self, nodes: Vec<String>, pg_servers: Vec<String>) -> Self {
        if !nodes.is_empty() {
            self.nodes = nodes;
        }
        if !pg_servers.is_empty() {
            self.pg_servers = pg_servers;
        }
        self
    }

    /// `rabbitmqctl close_all_connections`, in the background (it takes a second or two);
    /// nothing with `--no-broker-faults`.
    pub fn close_broker_connections(&mut self) {
        if self.broker == BrokerFaults::Off {
            return;
        }
        let node = match self.nodes.len() {
            0 => None,
            1 => Some(self.nodes[0].clone()),
            n => Some(self.nodes[self.rng.below(n)].clone()),
        };
        self.timeline.note(format_args!(
            "rabbitmqctl close_all_connections{}",
            node.as_deref()
                .map(|n| format!(" on {n}"))
                .unwrap_or_default()
        ));
        let ok = self.tally.broker_rounds.clone();
        let failed = self.tally.broker_failed.clone();
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

    /// `pg_terminate_backend` on every connection to the fleet's database (only that one).
    pub async fn terminate_backends(&mut self) {
        self.tally.pg_rounds += 1;
        // A server that does not answer (a crashed primary) is skipped; the round fails
        // only if none answers.
        let mut terminated = None;
        let mut last_error = None;
        for server in &self.pg_servers {
            match terminate_backends(server, &self.fleet.db.name).await {
                Ok(n) => *terminated.get_or_insert(0) += n,
                Err(e) => last_error = Some(e),
            }
        }
        match terminated.ok_or_else(|| last_error.unwrap_or_else(|| anyhow::anyhow!("no server"))) {
            Ok(n) => {
                self.tally.pg_terminated += n;
                self.timeline
                    .note(format_args!("pg_terminate_backend: {n} backends"));
            }
            Err(e) => {
                self.tally.pg_failed += 1;
                self.timeline
                    .note(format_args!("pg_terminate_backend failed: {e}"));
            }
        }
    }

    /// Draw a new provider-fault rule set (applied by [`Faults::apply`]).
    pub fn new_rules(&mut self) {
        self.rules = fault_rules(&mut self.rng);
    }

    /// Draw which providers' lookups are down (applied by [`Faults::apply`]).
    pub fn toggle_lookups(&mut self) {
        let rng = &mut self.rng;
        self.lookup_off = ACTIONS
            .iter()
            .map(|(_, p)| *p)
            .filter(|_| rng.chance(0.35))
            .collect();
        self.tally.lookup_toggles += 1;
    }

    /// Give the sandbox the current rules and lookup outages.
    pub async fn apply(&mut self) {
        let cfg = fault_config(&mut self.rng, &self.rules, &self.lookup_off);
        self.timeline.note(format_args!("provider faults {cfg}"));
        match self.control.set_faults_json(&cfg).await {
            Ok(()) => self.tally.fault_configs += 1,
            Err(_) => self.tally.fault_config_failed += 1,
        }
    }

    /// Healing: no provider faults any more (retried: the sandbox must hear it).
    pub async fn remove_provider_faults(&mut self) -> anyhow::Result<()> {
        for attempt in 0..20 {
            if self.control.set_faults_json(&json!({})).await.is_ok() {
                self.timeline
                    .note("heal: provider faults removed, killing stopped");
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100 * (attempt + 1))).await;
        }
        anyhow::bail!("could not remove the sandbox's faults")
    }
}

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
    // On the TLS listener (the HTTPS providers): handshakes dropped or left unanswered.
    let tls_drop = if rng.chance(0.7) {
        rng.uniform(0.05, 0.25)
    } else {
        0.0
    };
    let tls_stall = if rng.chance(0.5) {
        rng.uniform(0.02, 0.08)
    } else {
        0.0
    };
    // A provider that rate-limits (429 with Retry-After above its rate): the fleet has no
    // limit configured for it, so it learns the pace from the 429s alone, and every
    // throttled attempt is deferred, never spent (docs/providers.md, "Rate limits").
    let rate_limits = if rng.chance(0.5) {
        let providers = ["mail", "tickets", "bank"];
        json!([{"provider": providers[rng.below(3)], "per_second": rng.between(40, 150) as f64,
                "burst": rng.between(5, 20)}])
    } else {
        json!([])
    };
    json!({"seed": rng.u64() >> 11, "latency_ms": latency, "lookup_disabled": lookup_off, "rules": rules,
           "tls_drop_rate": tls_drop, "tls_stall_rate": tls_stall, "rate_limits": rate_limits})
}

/// `pg_terminate_backend` on every connection to database `db_name` of `server`: how many.
async fn terminate_backends(server: &str, db_name: &str) -> anyhow::Result<u64> {
    let mut conn = sqlx::PgConnection::connect(server).await?;
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
