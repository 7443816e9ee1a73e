//! The machine: what it is, how busy its CPUs were during a measurement, a process's
//! peak RSS (all from `/proc`, Linux only), and the names the bench created, so that an
//! interrupted run still removes them.

use serde::Serialize;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

/// What the bench ran on.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// Logical CPUs available to this process (`nproc`).
    pub nproc: usize,
    /// `uname -r`.
    pub kernel: String,
    /// The CPU model.
    pub cpu_model: String,
    /// Total memory (MiB).
    pub memory_mib: u64,
    /// `/proc/loadavg`'s 1-, 5- and 15-minute load at the start.
    pub load_at_start: String,
}

impl Machine {
    /// One line: CPUs, model, memory, kernel, load at the start.
    pub fn describe(&self) -> String {
        format!(
            "{} CPUs ({}), {:.1} GiB RAM, Linux {}, load {} at start",
            self.nproc,
            self.cpu_model,
            self.memory_mib as f64 / 1024.0,
            self.kernel,
            self.load_at_start
        )
    }

    /// Read it from `/proc`.
    pub fn read() -> Machine {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let cpuinfo = read("/proc/cpuinfo");
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_owned())
            .unwrap_or_else(|| "unknown CPU".into());
        let memory_mib = read("/proc/meminfo")
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .map_or(0, |kib| kib / 1024);
        let load = read("/proc/loadavg");
        Machine {
            nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
            kernel: read("/proc/sys/kernel/osrelease").trim().to_owned(),
            cpu_model,
            memory_mib,
            load_at_start: load
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" "),
        }
    }
}

/// `VmHWM` (peak resident set) of a process, in MiB.
pub fn peak_rss_mib(pid: u32) -> Option<f64> {
    status_mib(pid, "VmHWM:")
}

/// `VmRSS` (resident set now) of a process, in MiB.
pub fn rss_mib(pid: u32) -> Option<f64> {
    status_mib(pid, "VmRSS:")
}

/// A `… kB` line of `/proc/PID/status`, in MiB.
fn status_mib(pid: u32, field: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib / 1024.0)
}

/// CPU time of one process (user + system, in clock ticks), and its command name.
fn proc_ticks(pid: &str) -> Option<(String, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state …`: comm may contain spaces and parentheses; it ends at the last ')'.
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?.to_owned();
    let fields: Vec<&str> = stat.get(close + 2..)?.split_whitespace().collect();
    // After comm: state(0) ppid(1) … utime(11) stime(12).
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((comm, utime + stime))
}

/// Every process's CPU ticks, by pid.
fn all_procs() -> HashMap<u32, (String, u64)> {
    let mut out = HashMap::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let Ok(pid) = name.parse::<u32>() else {
                continue;
            };
            if let Some(v) = proc_ticks(name) {
                out.insert(pid, v);
            }
        }
    }
    out
}

/// The first line of `/proc/stat`: (busy, iowait, idle, total) ticks over all CPUs.
fn cpu_totals() -> (u64, u64, u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    let get = |i: usize| v.get(i).copied().unwrap_or(0);
    let total: u64 = (0..8).map(get).sum();
    let (idle, iowait) = (get(3), get(4));
    (total - idle - iowait, iowait, idle, total)
}

/// Where the CPUs' time went during a measurement, in cores (1.0 = one CPU fully busy).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct CpuUse {
    /// Postgres (every `postgres` process: backends, WAL writer, checkpointer…).
    pub postgres: f64,
    /// RabbitMQ (`beam.smp`).
    pub rabbitmq: f64,
    /// The spawned `oncely-worker` processes.
    pub workers: f64,
    /// This process: producer SDK, in-process sandbox, bench loops.
    pub bench: f64,
    /// Everything else that was busy (other users of the machine, the kernel).
    pub other: f64,
    /// CPU time spent waiting for I/O (fsync).
    pub iowait: f64,
    /// Idle CPU.
    pub idle: f64,
    /// The share of the measurement's wall time during which at least one runnable task
    /// waited for a CPU (`/proc/pressure/cpu`, "some"; 0–1; NaN without PSI): how much of
    /// the latency can be queueing for the CPUs rather than work.
    pub cpu_wait: f64,
}

impl CpuUse {
    /// Cores busy in the system under test: Postgres, RabbitMQ, the workers and the bench
    /// process (producer SDK, sandbox, gateway client); not other users, idle or iowait.
    pub fn oncely(&self) -> f64 {
        self.postgres + self.rabbitmq + self.workers + self.bench
    }
}

/// `/proc/pressure/cpu`'s "some" total: µs during which some runnable task waited for a CPU
/// (Linux 4.20+ with pressure stall information; `None` without it).
fn cpu_pressure_us() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/pressure/cpu").ok()?;
    text.lines()
        .find(|l| l.starts_with("some "))?
        .split_whitespace()
        .find_map(|f| f.strip_prefix("total="))?
        .parse()
        .ok()
}

/// A CPU snapshot taken at the start of a measurement.
#[derive(Debug)]
pub struct CpuSampler {
    procs: HashMap<u32, (String, u64)>,
    totals: (u64, u64, u64, u64),
    pressure: Option<(u64, std::time::Instant)>,
}

impl CpuSampler {
    /// Snapshot now.
    pub fn start() -> CpuSampler {
        CpuSampler {
            procs: all_procs(),
            totals: cpu_totals(),
            pressure: cpu_pressure_us().map(|us| (us, std::time::Instant::now())),
        }
    }

    /// What happened since the snapshot. `workers` are the pids of spawned workers.
    pub fn finish(&self, workers: &[u32]) -> CpuUse {
        let now = all_procs();
        let totals = cpu_totals();
        let ncpu = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let dt = totals.3.saturating_sub(self.totals.3).max(1) as f64;
        let cores = |ticks: u64| ticks as f64 / dt * ncpu;
        let me = std::process::id();
        let (mut pg, mut mq, mut wk, mut bench) = (0u64, 0u64, 0u64, 0u64);
        for (pid, (comm, ticks)) in &now {
            // A process started after the snapshot counts in full.
            let before = self
                .procs
                .get(pid)
                .filter(|(c, _)| c == comm)
                .map_or(0, |(_, t)| *t);
            let d = ticks.saturating_sub(before);
            if workers.contains(pid) {
                wk += d;
            } else if *pid == me {
                bench += d;
            } else if comm == "postgres" {
                pg += d;
            } else if comm == "beam.smp" {
                mq += d;
            }
        }
        let cpu_wait = match (self.pressure, cpu_pressure_us()) {
            (Some((before, at)), Some(now)) => {
                now.saturating_sub(before) as f64 / (at.elapsed().as_secs_f64() * 1e6).max(1.0)
            }
            _ => f64::NAN,
        };
        let busy = totals.0.saturating_sub(self.totals.0);
        let other = busy.saturating_sub(pg + mq + wk + bench);
        CpuUse {
            postgres: cores(pg),
            rabbitmq: cores(mq),
            workers: cores(wk),
            bench: cores(bench),
            other: cores(other),
            iowait: cores(totals.1.saturating_sub(self.totals.1)),
            idle: cores(totals.2.saturating_sub(self.totals.2)),
            cpu_wait,
        }
    }
}

/// Names created on the servers and processes started, removed by [`Registry::cleanup`]
/// when a measurement ends early (Ctrl-C, an error).
#[derive(Debug, Default)]
pub struct Registry {
    /// Databases (names) on the server.
    pub databases: Vec<String>,
    /// Broker prefixes whose oncely topology exists.
    pub prefixes: Vec<String>,
    /// Bare queues (the broker ceiling's).
    pub queues: Vec<String>,
    /// Temporary directories.
    pub dirs: Vec<PathBuf>,
    /// Worker processes still running.
    pub pids: Vec<u32>,
}

/// The process-wide registry.
pub static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    databases: Vec::new(),
    prefixes: Vec::new(),
    queues: Vec::new(),
    dirs: Vec::new(),
    pids: Vec::new(),
});

/// Run `f` on the registry.
pub fn registry<T>(f: impl FnOnce(&mut Registry) -> T) -> T {
    let mut guard = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    f(&mut guard)
}

/// Send a signal (`TERM`, `KILL`) to a process with `kill`.
pub fn signal(pid: u32, sig: &str) {
    let _ = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
}
