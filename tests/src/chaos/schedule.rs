//! The schedule: what is done when. The fault phase runs a set of timers — kill, stop,
//! broker close, Postgres terminations, provider fault rules, lookup outages — each
//! re-armed at a random interval from the schedule's own seeded stream, until the phase
//! has lasted long enough, enough kills were sent and the producer is done. The heal then
//! removes the faults, replaces the fail-point workers by plain ones, and waits for the
//! journal and the queues to settle.
//!
//! Everything done is written to a [`Timeline`] with UTC times that match the journal's
//! events (`schedule.log`), so a finding can be read next to what happened to its worker.

use super::crew::Crew;
use super::facts::{busy_pids, queue_depths, status_counts, unsettled};
use super::faults::Faults;
use super::rng::Rng;
use super::workload::ProducerReport;
use super::{Options, TICK};
use crate::fleet::Fleet;
use sqlx::PgPool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

/// What the run did, when: one line per action, shared by the crew and the faults.
#[derive(Debug, Clone, Default)]
pub(super) struct Timeline(Arc<Mutex<Vec<String>>>);

impl Timeline {
    /// Add a line, stamped with the UTC time.
    pub fn note(&self, what: impl std::fmt::Display) {
        let line = format!("{} {what}", chrono::Utc::now().format("%H:%M:%S%.3f"));
        if let Ok(mut lines) = self.0.lock() {
            lines.push(line);
        }
    }

    /// Every line so far.
    pub fn lines(&self) -> Vec<String> {
        self.0.lock().map(|l| l.clone()).unwrap_or_default()
    }
}

/// When each kind of fault is next due.
#[derive(Debug)]
struct Timers {
    rng: Rng,
    kill: Instant,
    stop: Instant,
    broker: Instant,
    pg: Instant,
    rules: Instant,
    lookup: Instant,
    progress: Instant,
}

impl Timers {
    /// The first due times, from the schedule's stream of `seed`.
    fn start(t0: Instant, seed: u64) -> Timers {
        let mut rng = Rng::new(seed ^ 0x5EED_0002);
        let kill = t0 + rng.secs(0.5, 2.5);
        let stop = t0 + rng.secs(3.0, 8.0);
        let broker = t0 + rng.secs(5.0, 15.0);
        let pg = t0 + rng.secs(3.0, 8.0);
        let lookup = t0 + rng.secs(2.0, 5.0);
        Timers {
            rng,
            kill,
            stop,
            broker,
            pg,
            rules: t0,
            lookup,
            progress: t0 + Duration::from_secs(5),
        }
    }

    /// Kills and stops that are due. After the fault phase's duration (`fast`) kills come
    /// quicker, so the minimum number is reached soon.
    async fn processes(
        &mut self,
        now: Instant,
        fast: bool,
        opts: &Options,
        crew: &mut Crew<'_>,
        pool: &PgPool,
    ) -> anyhow::Result<()> {
        if now >= self.kill {
            self.kill = if crew.kill_random(&mut self.rng, opts.workers, opts.reconcilers)? {
                now + if fast {
                    self.rng.secs(0.3, 0.8)
                } else {
                    self.rng.secs(1.0, 3.0)
                }
            } else {
                now + Duration::from_millis(200)
            };
        }
        if now >= self.stop {
            let busy = busy_pids(pool).await.unwrap_or_default();
            crew.stop_random(&mut self.rng, opts.workers, &busy);
            crew.maintain(opts.workers, opts.reconcilers, true)?;
            self.stop = now + self.rng.secs(6.0, 14.0);
        }
        Ok(())
    }

    /// Broker closes and Postgres terminations that are due.
    async fn connections(&mut self, now: Instant, faults: &mut Faults<'_>) {
        if now >= self.broker {
            faults.close_broker_connections();
            self.broker = now + self.rng.secs(8.0, 20.0);
        }
        if now >= self.pg {
            faults.terminate_backends().await;
            self.pg = now + self.rng.secs(4.0, 10.0);
        }
    }

    /// New provider fault rules and lookup outages that are due, applied together.
    async fn provider(&mut self, now: Instant, faults: &mut Faults<'_>) {
        let mut reconfigure = false;
        if now >= self.rules {
            faults.new_rules();
            self.rules = now + self.rng.secs(3.0, 7.0);
            reconfigure = true;
        }
        if now >= self.lookup {
            faults.toggle_lookups();
            self.lookup = now + self.rng.secs(2.0, 6.0);
            reconfigure = true;
        }
        if reconfigure {
            faults.apply().await;
        }
    }
}

/// The fault phase: until it has lasted `opts.duration`, `opts.min_kills` kills were sent
/// and the producer is done (or it overruns: an error). How long it took.
pub(super) async fn fault_phase(
    opts: &Options,
    fleet: &Fleet,
    crew: &mut Crew<'_>,
    faults: &mut Faults<'_>,
    producer: &JoinHandle<ProducerReport>,
    progress: &AtomicU64,
) -> anyhow::Result<Duration> {
    let t0 = Instant::now();
    let mut timers = Timers::start(t0, opts.seed);
    let hard_stop = opts.duration * 3 + Duration::from_secs(120);
    let pool = &fleet.db.pool;
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
            return Ok(t0.elapsed());
        }
        if elapsed > hard_stop {
            anyhow::bail!(
                "the fault phase did not end within {hard_stop:?} (producer finished: {}, kills {})",
                producer.is_finished(),
                crew.tally.kills_sent
            );
        }
        let fast = elapsed >= opts.duration;
        timers.processes(now, fast, opts, crew, pool).await?;
        timers.connections(now, faults).await;
        timers.provider(now, faults).await;
        if now >= timers.progress {
            timers.progress = now + Duration::from_secs(5);
            let recorded = progress.load(Ordering::Relaxed);
            print_progress(elapsed, recorded, opts, crew, faults, pool).await;
        }
        tokio::time::sleep(TICK).await;
    }
}

/// The fault phase's progress line (stderr).
async fn print_progress(
    elapsed: Duration,
    recorded: u64,
    opts: &Options,
    crew: &Crew<'_>,
    faults: &Faults<'_>,
    pool: &PgPool,
) {
    let counts = status_counts(pool).await.unwrap_or_default();
    eprintln!(
        "chaos [{:>6.1}s] faults: recorded {}/{}, ops {:?}, kills {} (+{} fail points), stops {}, closes {}, pg rounds {}",
        elapsed.as_secs_f64(),
        recorded,
        opts.intents,
        counts,
        crew.tally.kills_sent,
        crew.tally.failpoints.values().sum::<u64>(),
        crew.tally.stops_workers + crew.tally.stops_reconcilers,
        faults.tally.broker_rounds.load(Ordering::Relaxed),
        faults.tally.pg_rounds,
    );
}

/// How healing ended.
#[derive(Debug, Clone)]
pub(super) struct Healed {
    /// The journal and the queues settled.
    pub settled: bool,
    /// How long it took (or the limit, if it did not settle).
    pub took: Duration,
    /// What was still unsettled at the last look.
    pub last_state: String,
}

/// Heal: no provider faults, no stopped processes, plain workers only; then wait (up to
/// `opts.heal`) until nothing is live, every unknown has a review and the queues are empty
/// twice in a row.
pub(super) async fn heal(
    opts: &Options,
    fleet: &Fleet,
    crew: &mut Crew<'_>,
    faults: &mut Faults<'_>,
    node: Option<&str>,
) -> anyhow::Result<Healed> {
    let h0 = Instant::now();
    faults.remove_provider_faults().await?;
    crew.cont(true);
    crew.retire_failpoint_workers();
    let mut stable = 0;
    let mut last_state = String::new();
    let mut next_progress = h0;
    crew.maintain(opts.workers, opts.reconcilers, false)?;
    while h0.elapsed() < opts.heal {
        crew.reap();
        crew.note_min();
        crew.maintain(opts.workers, opts.reconcilers, false)?;
        let (quiet, state) = settle_state(fleet, node).await?;
        last_state = state;
        if Instant::now() >= next_progress {
            next_progress = Instant::now() + Duration::from_secs(5);
            let at = h0.elapsed().as_secs_f64();
            eprintln!("chaos [{at:>6.1}s] heal: {last_state}");
        }
        stable = if quiet { stable + 1 } else { 0 };
        if stable >= 2 {
            let took = h0.elapsed();
            return Ok(Healed {
                settled: true,
                took,
                last_state,
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(Healed {
        settled: false,
        took: h0.elapsed(),
        last_state,
    })
}

/// Whether the fleet is quiet (nothing live, every unknown in a review for a person — a
/// review still re-checked by lookups may yet settle — the queues but the dead-letter
/// queue empty), and a line saying what is not.
async fn settle_state(fleet: &Fleet, node: Option<&str>) -> anyhow::Result<(bool, String)> {
    let (live, unknown_open) = unsettled(&fleet.db.pool).await?;
    let mut quiet = false;
    let mut depth_text = String::from("(not read)");
    if live == 0 && unknown_open == 0 {
        match queue_depths(node, &fleet.prefix).await {
            Ok(d) => {
                let dead = fleet.topology().dead_queue();
                quiet = d
                    .iter()
                    .filter(|(q, _)| **q != dead)
                    .all(|(_, (r, u))| *r == 0 && *u == 0);
                depth_text = format!("{d:?}");
            }
            Err(e) => depth_text = format!("{e}"),
        }
    }
    let state = format!(
        "live (planned/awaiting_approval/executing/failed_retryable/deferred) {live}, unknown not with a person {unknown_open}, queues {depth_text}"
    );
    Ok((quiet, state))
}
