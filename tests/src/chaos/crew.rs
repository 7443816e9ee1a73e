//! The crew: the `oncely-worker run` and `oncely-worker reconcile` processes of a run.
//!
//! The crew keeps the wanted number of each running (a replacement starts before a kill,
//! so a kill never leaves fewer), sends them SIGKILL, SIGSTOP/SIGCONT and SIGTERM, and
//! accounts for every exit: killed by the schedule, aborted at a fail point, stopped
//! cleanly — or ended on its own, which the report lists, since a worker that dies by
//! itself is a bug the faults found. Fail-point workers are spawned from a separate
//! fail-point build, every other process from the plain worker the workspace ships.

use super::rng::Rng;
use super::schedule::Timeline;
use super::{FAILPOINTS, LEASE_DUR, TICK, logs};
use crate::failpoint_worker;
use crate::fleet::{Fleet, Proc};
use std::collections::{BTreeMap, HashMap};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};
use tokio::process::Command;

/// Log filter of the spawned processes: the runner's debug lines count deliveries.
const PROC_LOG: &str = "info,oncely_worker::runner=debug";

/// A private copy of a binary, removed when dropped: a concurrent `cargo build` may
/// replace the original in the middle of a run.
#[derive(Debug)]
struct Snapshot(PathBuf);

impl Snapshot {
    fn of(path: &Path, tag: &str) -> anyhow::Result<Self> {
        let copy = std::env::temp_dir().join(format!(
            "oncely-chaos-{tag}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0)
        ));
        std::fs::copy(path, &copy)?;
        Ok(Snapshot(copy))
    }
}

impl Drop for Snapshot {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The two worker binaries a run spawns from (private copies).
#[derive(Debug)]
pub(super) struct Binaries {
    plain: Snapshot,
    failpoints: Snapshot,
}

impl Binaries {
    /// Build (unless `build` is false) and copy the plain worker and the fail-point worker.
    pub fn prepare(build: bool) -> anyhow::Result<Binaries> {
        let exe = std::env::current_exe()?;
        let dir = exe
            .parent()
            .ok_or_else(|| anyhow::anyhow!("no directory for {}", exe.display()))?;
        if build {
            eprintln!("chaos: cargo build -p oncely-worker (the fleet's plain workers)");
            failpoint_worker::cargo_build_worker(&[])?;
        }
        let plain = dir.join("oncely-worker");
        anyhow::ensure!(
            plain.exists(),
            "{} not found: run `cargo build -p oncely-worker`",
            plain.display()
        );
        let fp = if build {
            failpoint_worker::path()?
        } else {
            failpoint_worker::location()?
        };
        anyhow::ensure!(
            fp.exists(),
            "{} not found: run without --no-build to build the fail-point worker",
            fp.display()
        );
        let failpoints = Snapshot::of(&fp, "failpoint-worker")?;
        ensure_failpoints(&failpoints.0)?;
        Ok(Binaries {
            plain: Snapshot::of(&plain, "worker")?,
            failpoints,
        })
    }
}

/// Refuse a fail-point worker that was built without them.
fn ensure_failpoints(path: &Path) -> anyhow::Result<()> {
    let has = std::process::Command::new("grep")
        .args(["-q", "-a", "failpoint hit: aborting"])
        .arg(path)
        .status()?;
    anyhow::ensure!(
        has.success(),
        "{} was built without fail points",
        path.display()
    );
    Ok(())
}

/// What a process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    /// `oncely-worker run`.
    Worker,
    /// `oncely-worker reconcile`.
    Reconciler,
}

impl Role {
    /// Its subcommand.
    pub fn arg(self) -> &'static str {
        match self {
            Role::Worker => "run",
            Role::Reconciler => "reconcile",
        }
    }
}

/// One process of the crew.
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
    /// Running and expected to go on running.
    fn active(&self) -> bool {
        self.stopped_until.is_none() && !self.terminating
    }

    /// `role-n (pid p)`, as the timeline names it.
    fn name(&self) -> String {
        format!("{}-{} (pid {})", self.role.arg(), self.n, self.pid)
    }
}

/// What the crew went through.
#[derive(Debug, Default)]
pub(super) struct CrewTally {
    /// SIGKILLs sent by the schedule.
    pub kills_sent: u64,
    /// Workers that ended by one of them.
    pub killed_workers: u64,
    /// Reconcilers that ended by one of them.
    pub killed_reconcilers: u64,
    /// Fail-point aborts, by fail point.
    pub failpoints: BTreeMap<String, u64>,
    /// Workers stopped past their lease.
    pub stops_workers: u64,
    /// Reconcilers stopped.
    pub stops_reconcilers: u64,
    /// Stopped workers that held leases.
    pub stops_holding: u64,
    /// Leases they held.
    pub stopped_leases: u64,
    /// Processes that ended on their own (what, and their last log line).
    pub unexpected: Vec<String>,
    /// Processes spawned.
    pub spawned: u64,
    /// Processes that stopped cleanly on SIGTERM.
    pub clean_exits: u64,
    /// The fewest workers running at any tick.
    pub min_active_workers: Option<usize>,
}

/// The crew of a run.
#[derive(Debug)]
pub(super) struct Crew<'a> {
    fleet: &'a Fleet,
    bins: &'a Binaries,
    seed: u64,
    members: Vec<Member>,
    next: usize,
    /// What the crew went through.
    pub tally: CrewTally,
    timeline: Timeline,
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
        .envs(fleet.secrets_env())
        .envs(fleet.role_env(role.arg()))
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

impl<'a> Crew<'a> {
    /// An empty crew; `seed` seeds the fail points' draws.
    pub fn new(fleet: &'a Fleet, bins: &'a Binaries, seed: u64, timeline: Timeline) -> Self {
        Crew {
            fleet,
            bins,
            seed,
            members: Vec::new(),
            next: 0,
            tally: CrewTally::default(),
            timeline,
        }
    }

    fn spawn(&mut self, role: Role, failpoints: bool) -> anyhow::Result<()> {
        let n = self.next;
        self.next += 1;
        let (bin, env): (&Path, Vec<(&str, String)>) = if failpoints {
            let seed = self.seed.wrapping_mul(1_000_003) ^ n as u64;
            (
                &self.bins.failpoints.0,
                vec![
                    ("ONCELY_FAILPOINTS", FAILPOINTS.to_owned()),
                    ("ONCELY_FAILPOINT_SEED", seed.to_string()),
                ],
            )
        } else {
            (&self.bins.plain.0, Vec::new())
        };
        let proc = spawn_proc(self.fleet, bin, role, n, &env)?;
        self.tally.spawned += 1;
        self.timeline.note(format_args!(
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
    pub fn reap(&mut self) {
        let mut i = 0;
        while i < self.members.len() {
            match self.members[i].proc.child.try_wait() {
                Ok(None) => i += 1,
                Ok(Some(status)) => {
                    let m = self.members.swap_remove(i);
                    self.account(&m, status);
                }
                Err(e) => {
                    let m = self.members.swap_remove(i);
                    let what = format!("{}-{}: wait failed: {e}", m.role.arg(), m.n);
                    self.tally.unexpected.push(what);
                }
            }
        }
    }

    /// Count how `m` ended.
    fn account(&mut self, m: &Member, status: ExitStatus) {
        let name = m.name();
        self.timeline.note(format_args!("exit {name}: {status}"));
        match (status.signal(), status.code()) {
            (Some(9), _) if m.killed => match m.role {
                Role::Worker => self.tally.killed_workers += 1,
                Role::Reconciler => self.tally.killed_reconcilers += 1,
            },
            (Some(6), _) if m.failpoints => {
                let point = logs::failpoint_of(&m.proc.log);
                self.timeline
                    .note(format_args!("fail point {point}: {name} aborted"));
                *self.tally.failpoints.entry(point).or_default() += 1;
            }
            // SIGTERM before its handler was installed ends it by the signal.
            (None, Some(0)) | (Some(15), _) if m.terminating && !m.killed => {
                self.tally.clean_exits += 1
            }
            (sig, code) => self.tally.unexpected.push(format!(
                "{name} ended by itself (signal {sig:?}, code {code:?}); last log line: {}",
                logs::last_line(&m.proc.log)
            )),
        }
    }

    fn active(&self, role: Role) -> usize {
        self.members
            .iter()
            .filter(|m| m.role == role && m.active())
            .count()
    }

    /// Note the number of running workers, for the fewest at any tick.
    pub fn note_min(&mut self) {
        let a = self.active(Role::Worker);
        let min = self.tally.min_active_workers.get_or_insert(a);
        *min = (*min).min(a);
    }

    /// Keep `workers` workers and `reconcilers` reconcilers running (not stopped, not
    /// stopping); during the fault phase (`failpoints`) some workers carry fail points.
    pub fn maintain(
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
    pub fn kill_random(
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
        let what = format!("SIGKILL {}", self.members[i].name());
        self.timeline.note(what);
        self.tally.kills_sent += 1;
        Ok(true)
    }

    /// SIGSTOP a random worker (sometimes a reconciler) for longer than its lease;
    /// preferably a worker holding leases (`busy`: pid → executing operations).
    pub fn stop_random(&mut self, rng: &mut Rng, workers: usize, busy: &HashMap<u32, i64>) {
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
        self.stop(i, until, busy);
    }

    /// SIGSTOP member `i` until `until`, and count it.
    fn stop(&mut self, i: usize, until: Instant, busy: &HashMap<u32, i64>) {
        let m = &mut self.members[i];
        m.proc.signal("STOP");
        m.stopped_until = Some(until);
        let held = busy.get(&m.proc.pid()).copied().unwrap_or(0);
        self.timeline.note(format_args!(
            "SIGSTOP {} holding {held} leases, until +{:.1}s",
            m.name(),
            (until - Instant::now()).as_secs_f64()
        ));
        match m.role {
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
    pub fn cont(&mut self, all: bool) {
        let now = Instant::now();
        for m in &mut self.members {
            if let Some(until) = m.stopped_until
                && (all || until <= now)
            {
                m.proc.signal("CONT");
                m.stopped_until = None;
                self.timeline.note(format_args!("SIGCONT {}", m.name()));
            }
        }
    }

    /// SIGTERM the fail-point workers (healing: they are replaced by plain ones).
    pub fn retire_failpoint_workers(&mut self) {
        for m in &mut self.members {
            if m.failpoints && !m.terminating {
                m.proc.signal("TERM");
                m.terminating = true;
            }
        }
    }

    /// Stop every process gracefully (SIGTERM), then SIGKILL what is left after `grace`.
    pub async fn stop_all(&mut self, grace: Duration) {
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
