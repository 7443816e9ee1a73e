//! The report: the figures of a run (what the faults did, what the fleet did about them,
//! what the approver and the canceller did, the four zeros and the fifth) printed as fixed-width lines that CI logs and `docs/chaos.md` quote,
//! then the findings, each with its key's event trail, the timeline of its processes and
//! their log lines. A failed run (or `--keep-logs`) keeps the logs, the timeline, the
//! report and a dump of the journal for reading.

use super::checks::{Check, Verdict};
use super::control::{ApproverTally, CancelAnswer, CancelTally, Decision};
use super::crew::CrewTally;
use super::facts::{self, Facts, Figures, Groups};
use super::faults::FaultTally;
use super::logs::{self, LogFigures};
use super::outages::OutageTally;
use super::schedule::Timeline;
use super::workload::{ProducerReport, Workload, action_of};
use super::{
    ACTIONS, BrokerFaults, FAILPOINTS, LEASE, MAX_RECONCILE_CHECKS, Options, Outcome,
    PROVIDER_TIMEOUT,
};
use crate::fleet::Fleet;
use oncely_core::Status;
use sqlx::PgPool;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How long the phases took.
#[derive(Debug, Clone, Copy)]
pub(super) struct Times {
    /// Building, the private broker, the fleet.
    pub setup: Duration,
    /// The fault phase.
    pub faults: Duration,
    /// The producer's own time, in seconds.
    pub producer: f64,
    /// The heal.
    pub heal: Duration,
    /// When the run started.
    pub wall: Instant,
}

/// Everything the report is made of.
#[derive(Debug)]
pub(super) struct Run<'a> {
    /// The options.
    pub opts: &'a Options,
    /// The phases' times.
    pub times: Times,
    /// The workload.
    pub workload: &'a Workload,
    /// What the producer did.
    pub produced: &'a ProducerReport,
    /// What the crew went through.
    pub crew: &'a CrewTally,
    /// What the faults did.
    pub faults: &'a FaultTally,
    /// What the server outages did (`--cluster`, `--failover`).
    pub outages: &'a OutageTally,
    /// What the approver did.
    pub approver: &'a ApproverTally,
    /// What the canceller did.
    pub cancels: &'a CancelTally,
    /// The checked facts.
    pub facts: &'a Facts,
    /// The other figures.
    pub figures: &'a Figures,
    /// The checks' verdict.
    pub verdict: &'a Verdict,
    /// The processes' logs: (file name, text).
    pub logs: &'a [(String, String)],
    /// Figures from them.
    pub log_figures: &'a LogFigures,
}

/// Print the report, keep what a failed (or `--keep-logs`) run leaves for reading.
pub(super) async fn finish(
    run: &Run<'_>,
    fleet: &Fleet,
    timeline: &Timeline,
) -> anyhow::Result<Outcome> {
    let pool = &fleet.db.pool;
    let lines = timeline.lines();
    let passed = run.verdict.passed();
    let mut r = render(run);
    examples(&mut r, run, pool, &lines).await;
    if !passed {
        findings(&mut r, run, pool, &lines).await;
        facts::dump(pool, &fleet.dir).await;
    }
    let _ = std::fs::write(fleet.dir.join("chaos-report.txt"), &r);
    let _ = std::fs::write(fleet.dir.join("schedule.log"), lines.join("\n") + "\n");
    let mut kept = None;
    if !passed || run.opts.keep_logs {
        if passed {
            facts::dump(pool, &fleet.dir).await;
        }
        kept = Some(keep(fleet, run.opts.seed));
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

/// Move the fleet's directory out of the way of its cleanup.
pub(super) fn keep(fleet: &Fleet, seed: u64) -> PathBuf {
    let kept = std::env::temp_dir().join(format!("oncely-chaos-{seed}-{}", fleet.prefix));
    match std::fs::rename(&fleet.dir, &kept) {
        Ok(()) => kept,
        Err(_) => fleet.dir.clone(),
    }
}

/// The figures, section by section.
fn render(run: &Run<'_>) -> String {
    let mut r = String::new();
    header(&mut r, run);
    intents(&mut r, run);
    deliveries(&mut r, run);
    kills(&mut r, run);
    connections(&mut r, run);
    unknowns(&mut r, run);
    control(&mut r, run);
    checks(&mut r, run);
    let exits = &run.crew.unexpected;
    if !exits.is_empty() {
        let _ = writeln!(r, "processes that exited on their own");
        for u in exits.iter().take(20) {
            let _ = writeln!(r, "  {u}");
        }
    }
    r
}

fn header(r: &mut String, run: &Run<'_>) {
    let (opts, t) = (run.opts, run.times);
    let verdict = if run.verdict.passed() { "PASS" } else { "FAIL" };
    let _ = writeln!(r, "oncely chaos run — {verdict}");
    let _ = writeln!(r, "  seed               {}", opts.seed);
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
    let servers: Vec<&str> = [
        (
            opts.secure,
            "TLS-only private Postgres and RabbitMQ, least privilege",
        ),
        (opts.pooler, "through pgbouncer (transaction pooling)"),
        (opts.cluster, "a private three-node RabbitMQ cluster"),
        (
            opts.failover,
            "a private Postgres primary + synchronous standby",
        ),
    ]
    .into_iter()
    .filter_map(|(on, what)| on.then_some(what))
    .collect();
    if !servers.is_empty() {
        let _ = writeln!(r, "  servers            {}", servers.join("; "));
    }
    let _ = writeln!(
        r,
        "  time               setup {:.1}s, faults {:.1}s (producer {:.1}s), heal {:.1}s, wall {:.1}s",
        t.setup.as_secs_f64(),
        t.faults.as_secs_f64(),
        t.producer,
        t.heal.as_secs_f64(),
        t.wall.elapsed().as_secs_f64()
    );
}

fn intents(r: &mut String, run: &Run<'_>) {
    let p = run.produced;
    let mut per_action: BTreeMap<&str, u64> = BTreeMap::new();
    for (i, recorded) in p.recorded.iter().enumerate() {
        if *recorded {
            *per_action.entry(ACTIONS[action_of(i)].0).or_default() += 1;
        }
    }
    let _ = writeln!(r, "intents");
    let _ = writeln!(
        r,
        "  distinct           {} {:?}",
        run.verdict.distinct, per_action
    );
    let _ = writeln!(
        r,
        "  repeats            {} of {} planned, answered {:?}",
        p.repeats, run.workload.repeats, p.repeat_status
    );
    let _ = writeln!(
        r,
        "  conflicts          {} of {} planned: {} through the SDK (refused: {}), {} published raw (confirmed: {}, refused by workers: {} log lines)",
        p.conflicts_sdk + p.conflicts_raw,
        run.workload.conflicts,
        p.conflicts_sdk,
        p.conflicts_sdk_refused,
        p.conflicts_raw,
        p.conflicts_raw_published,
        run.log_figures.conflicts_refused
    );
    let _ = writeln!(
        r,
        "  producer           new {}, recorded on a retried batch {}, recorded but publish failed {} (left to the sweeper), batch errors {}, timeouts {}, reconnects {}",
        p.new, p.duplicate_after_retry, p.publish_failed, p.batch_errors, p.timeouts, p.reconnects
    );
}

fn deliveries(r: &mut String, run: &Run<'_>) {
    let (f, lf) = (run.figures, run.log_figures);
    let stats = &f.stats;
    let effects = &run.facts.effects;
    let _ = writeln!(r, "deliveries");
    let _ = writeln!(
        r,
        "  claims             {} (re-attempts {})",
        f.claims.0, f.claims.1
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
        f.dead_letters.map_or("?".into(), |n| n.to_string()),
        lf.dead_lettered
    );
}

fn kills(r: &mut String, run: &Run<'_>) {
    let t = run.crew;
    let late_answers = run
        .figures
        .other_reasons
        .iter()
        .find(|(k, _)| k == "late_answer")
        .map_or(0, |(_, v)| *v);
    let _ = writeln!(r, "kills");
    let _ = writeln!(
        r,
        "  SIGKILL (random)   {} (workers {}, reconcilers {})",
        t.killed_workers + t.killed_reconcilers,
        t.killed_workers,
        t.killed_reconcilers
    );
    let fp_total: u64 = t.failpoints.values().sum();
    let _ = writeln!(r, "  fail points        {fp_total} {:?}", t.failpoints);
    let _ = writeln!(
        r,
        "  SIGSTOP > lease    {} (workers {}, {} of them holding {} leases; reconcilers {}); late completions refused {}, late answers accepted {}",
        t.stops_workers + t.stops_reconcilers,
        t.stops_workers,
        t.stops_holding,
        t.stopped_leases,
        t.stops_reconcilers,
        run.log_figures.refused_completions,
        late_answers
    );
    let _ = writeln!(
        r,
        "  processes          spawned {}, min workers running {}, exited on their own {}",
        t.spawned,
        t.min_active_workers.unwrap_or(0),
        t.unexpected.len()
    );
}

fn connections(r: &mut String, run: &Run<'_>) {
    let t = run.faults;
    let _ = writeln!(r, "connections");
    let _ = writeln!(
        r,
        "  broker closes      {} rounds of close_all_connections ({}){}",
        t.broker_rounds.load(Ordering::Relaxed),
        match run.opts.broker {
            BrokerFaults::Shared => "machine's broker",
            BrokerFaults::Private if run.opts.cluster => "a random node of the private cluster",
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
    for (i, node) in run.outages.nodes.iter().enumerate() {
        let _ = writeln!(r, "  node killed {}      {node}", i + 1);
    }
    if run.opts.cluster {
        let _ = writeln!(
            r,
            "  other-node connects {} (connects that skipped a node that did not answer)",
            run.log_figures.other_node_connects
        );
    }
    if let Some(failover) = &run.outages.failover {
        let _ = writeln!(r, "  pg failover        {failover}");
        let _ = writeln!(
            r,
            "  followed it        {} processes logged \"Postgres failover: the primary moved\"",
            run.log_figures.followed_pg_failover
        );
    }
    let _ = writeln!(r, "provider faults");
    let _ = writeln!(
        r,
        "  applied            {} ({} configs, {} lookup toggles)",
        run.figures.stats["faults"], t.fault_configs, t.lookup_toggles
    );
}

/// `{a: 1, b: 2}`.
fn fmt_groups(g: &[(String, i64)]) -> String {
    if g.is_empty() {
        return "{}".into();
    }
    let parts: Vec<String> = g.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    format!("{{{}}}", parts.join(", "))
}

fn unknowns(r: &mut String, run: &Run<'_>) {
    let (f, facts) = (run.figures, run.facts);
    let with_effect = facts
        .open_reviews
        .keys()
        .filter(|k| facts.effects.count(k) > 0)
        .count();
    let _ = writeln!(r, "unknowns");
    let _ = writeln!(
        r,
        "  to unknown         {} {}",
        f.to_unknown.iter().map(|(_, v)| v).sum::<i64>(),
        fmt_groups(&f.to_unknown)
    );
    let _ = writeln!(r, "  out of unknown     {}", fmt_groups(&f.from_unknown));
    let auto: Groups = f
        .reviews_closed
        .iter()
        .filter(|(how, _)| how.starts_with("auto:"))
        .cloned()
        .collect();
    let people: Groups = f
        .reviews_closed
        .iter()
        .filter(|(how, _)| !how.starts_with("auto:"))
        .cloned()
        .collect();
    let sum = |g: &Groups| g.iter().map(|(_, v)| v).sum::<i64>();
    let _ = writeln!(
        r,
        "  reviews opened     {} {}",
        sum(&f.reviews),
        fmt_groups(&f.reviews)
    );
    let _ = writeln!(
        r,
        "  reviews closed     by themselves {} {}, by people {} {}",
        sum(&auto),
        fmt_groups(&auto),
        sum(&people),
        fmt_groups(&people)
    );
    let _ = writeln!(
        r,
        "  reviews left open  {}: for people {}, still re-checked {}; with an effect the provider can prove {} (target 0), on settled operations {}",
        facts.open_reviews.len(),
        facts.open_reviews.len() as i64 - f.reviews_rechecked,
        f.reviews_rechecked,
        with_effect,
        f.reviews_on_settled
    );
    payment_orders(r, run);
    let _ = writeln!(r, "  final journal      {:?}", f.final_status);
}

fn payment_orders(r: &mut String, run: &Run<'_>) {
    let facts = run.facts;
    let moves = &facts.payment_moves;
    let found = moves
        .iter()
        .filter(|m| m.reason.starts_with("reconcile_found_"))
        .count();
    let late = moves.iter().filter(|m| m.reason == "late_answer").count();
    let in_review = facts
        .operations
        .iter()
        .filter(|(k, o)| {
            o.action == "payment_order.create"
                && o.status == Status::Unknown
                && facts.open_reviews.contains_key(*k)
        })
        .count();
    let _ = writeln!(
        r,
        "  payment orders     {} went unknown: settled by lookup {found}, by late answer {late}, in review {in_review}; blind retries {}",
        run.figures.pay_unknown,
        run.verdict.count(Check::PaymentBlindRetry)
    );
}

/// Held, approved, rejected; cancels and their answers; expiries.
fn control(r: &mut String, run: &Run<'_>) {
    let (a, c, facts) = (run.approver, run.cancels, run.facts);
    let status = |k: &str| facts.operations.get(k).map(|o| o.status);
    let recorded = || facts.intents.iter().filter(|i| i.recorded);
    let held = recorded().filter(|i| i.held).count();
    let mut not_held: BTreeMap<&str, u64> = BTreeMap::new();
    for d in a.decided.values() {
        if let Decision::NotHeld(s) = d {
            *not_held.entry(s.as_str()).or_default() += 1;
        }
    }
    let _ = writeln!(r, "control");
    let _ = writeln!(
        r,
        "  held               {held} (rule {:?}): approved {}, rejected {}, no longer held when decided {} {:?}; approver rounds {}, failed calls {}, lost replies {}",
        super::control::RULE,
        a.count(Decision::Approved),
        a.count(Decision::Rejected),
        a.not_held(),
        not_held,
        a.rounds,
        a.errors,
        a.lost_replies
    );
    let _ = writeln!(
        r,
        "  cancels            {} of {} planned: cancelled {}, too late {} {:?}, not found {}, unanswered {}; sent again before recorded {}, failed calls {}, lost replies {}",
        c.answers.len(),
        c.planned,
        c.count(CancelAnswer::Cancelled),
        c.count(CancelAnswer::TooLate(Status::Planned)),
        c.too_late(),
        c.count(CancelAnswer::NotFound),
        c.count(CancelAnswer::Unanswered),
        c.not_yet_recorded,
        c.errors,
        c.lost_replies
    );
    let mut expiring: BTreeMap<&str, u64> = BTreeMap::new();
    for i in recorded().filter(|i| i.expires) {
        let s = status(&i.key).map_or("no row", Status::as_str);
        *expiring.entry(s).or_default() += 1;
    }
    let _ = writeln!(
        r,
        "  expiring           {} asked for expires_at (submitted {}), ended {:?}",
        recorded().filter(|i| i.expires).count(),
        run.produced.expiring,
        expiring
    );
    let ended = |s: Status| facts.operations.values().filter(|o| o.status == s).count();
    let _ = writeln!(
        r,
        "  never sent         rejected {}, cancelled {}, expired {}; held run without an approval {}",
        ended(Status::Rejected),
        ended(Status::Cancelled),
        ended(Status::Expired),
        run.verdict.count(Check::Unapproved)
    );
}

fn checks(r: &mut String, run: &Run<'_>) {
    let v = run.verdict;
    let z = v.zeros;
    let _ = writeln!(r, "checks");
    let _ = writeln!(r, "  duplicates         {}", z.duplicates);
    let _ = writeln!(r, "  lost               {}", z.lost);
    let _ = writeln!(r, "  unexpected         {}", z.unexpected);
    let _ = writeln!(
        r,
        "  mismatches         {} (provider ids verified by lookup: {})",
        z.mismatches, v.ids_verified
    );
    let _ = writeln!(
        r,
        "  cancelled or expired actions with an effect: {}",
        z.stopped_with_effect
    );
    let _ = writeln!(
        r,
        "  payment blind retries {}, conflicting payloads at the provider {}, intents accounted for {}/{}",
        v.count(Check::PaymentBlindRetry),
        run.facts.conflicts_422,
        v.distinct - z.lost.min(v.distinct),
        run.opts.intents
    );
}

/// Observations (not failures): examples worth reading, with their trails.
async fn examples(r: &mut String, run: &Run<'_>, pool: &PgPool, timeline: &[String]) {
    let examples = &run.figures.examples;
    if examples.is_empty() {
        return;
    }
    let _ = writeln!(r, "examples");
    for (what, key) in examples {
        let action = run
            .facts
            .operations
            .get(key)
            .map_or("?", |o| o.action.as_str());
        let _ = writeln!(
            r,
            "  {what}: {action} {key} (effects {})",
            run.facts.effects.count(key)
        );
        r.push_str(&facts::trail(pool, key).await);
        r.push_str(&facts::schedule_notes(pool, key, timeline).await);
    }
}

/// The findings, at most 10 per check, each with its key's trail, timeline and logs.
async fn findings(r: &mut String, run: &Run<'_>, pool: &PgPool, timeline: &[String]) {
    let all = &run.verdict.findings;
    let _ = writeln!(r, "findings ({})", all.len());
    let mut shown: BTreeMap<Check, usize> = BTreeMap::new();
    for f in all {
        let n = shown.entry(f.check()).or_default();
        *n += 1;
        if *n > 10 {
            continue;
        }
        let _ = writeln!(r, "  [{}] {}: {f}", f.check(), f.key().unwrap_or("-"));
        let Some(key) = f.key().filter(|k| k.starts_with("v1:")) else {
            continue;
        };
        let (action, status) = run
            .facts
            .operations
            .get(key)
            .map_or(("?", "no row"), |o| (o.action.as_str(), o.status.as_str()));
        let effects = run.facts.effects.count(key);
        let _ = writeln!(r, "    {action}, status {status}, effects {effects}");
        r.push_str(&facts::trail(pool, key).await);
        r.push_str(&facts::schedule_notes(pool, key, timeline).await);
        r.push_str(&logs::lines_about(run.logs, key, 25));
    }
    for (check, n) in &shown {
        if *n > 10 {
            let _ = writeln!(r, "  … and {} more {check}", n - 10);
        }
    }
}
