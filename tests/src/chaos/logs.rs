//! The processes' logs (JSON lines, one file per process): how a process ended (its fail
//! point, its last line), figures the journal does not hold (deliveries acked without a
//! call, refused completions and conflicts), and the lines about one key for a finding.

use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// The fail point a process's log says it aborted at.
pub(super) fn failpoint_of(log: &Path) -> String {
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

/// A log's last non-empty line (at most 400 characters).
pub(super) fn last_line(log: &Path) -> String {
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

/// Every `*.log` in `dir`: (file name, text), by name.
pub(super) fn read_all(dir: &Path) -> Vec<(String, String)> {
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
/// refused completions, refused conflicts, dead-lettered invalid messages.
#[derive(Debug, Default)]
pub(super) struct LogFigures {
    /// Deliveries acked without a provider call, by verdict.
    pub not_claimed: BTreeMap<String, u64>,
    /// Completions refused because the operation moved on.
    pub refused_completions: u64,
    /// Conflicting payloads refused by workers.
    pub conflicts_refused: u64,
    /// Invalid messages dead-lettered.
    pub dead_lettered: u64,
    /// Processes that logged following a Postgres failover (`--failover`).
    pub followed_pg_failover: u64,
    /// Connects that went to another RabbitMQ node because one did not answer
    /// (`--cluster`).
    pub other_node_connects: u64,
}

/// Count the lines [`LogFigures`] is made of.
pub(super) fn figures(logs: &[(String, String)]) -> LogFigures {
    let mut f = LogFigures::default();
    for (_, text) in logs {
        if text.contains("Postgres failover: the primary moved") {
            f.followed_pg_failover += 1;
        }
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
            } else if line.contains("connected to another RabbitMQ node of broker.urls") {
                f.other_node_connects += 1;
            }
        }
    }
    f
}

/// The processes' log lines that mention `key` (with the log's name), at most `max`.
pub(super) fn lines_about(logs: &[(String, String)], key: &str, max: usize) -> String {
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
