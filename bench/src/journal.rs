//! The journal ceilings: the article's flow, three autocommit statements per action, on
//! oncely's real migrated schema (CHECK constraints and the events trigger included) and
//! on the article's own plain table, from C concurrent tasks, with no broker and no
//! provider.
//!
//! Per action: (a) `INSERT … 'planned' … ON CONFLICT DO NOTHING`; (b) the claim
//! `UPDATE … SET status = 'executing', attempt_count + 1, lease …  WHERE key = $1 AND
//! status IN ('planned', 'failed_retryable') AND (lease_until IS NULL OR lease_until <
//! now()) RETURNING …`; (c) `UPDATE … SET status = 'succeeded', provider id, result,
//! lease and payload cleared WHERE key = $1 AND status = 'executing'`. The statements
//! live in [`crate::article`].
//!
//! And the journal floor ([`run_batched`]): oncely's own statements — the producer's
//! record, the worker's claim and its completion — on oncely's schema, in the batches a
//! full-load fleet sends, with no broker and no provider: what Postgres costs per action
//! when every statement is as full as the fleet ever makes it.

use super::sys::{CpuSampler, CpuUse};
use crate::article::{ArticleAction, ArticleJournal, ArticleTable};
use oncely_core::Envelope;
use oncely_core::db::{self, PoolSettings};
use oncely_core::journal::Journal;
use oncely_core::journal::claim::{ClaimOutcome, ClaimRequest};
use oncely_core::journal::complete::{Completion, Verdict};
use oncely_core::status::Status;
use serde::Serialize;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the journal did.
#[derive(Debug, Clone, Serialize)]
pub struct JournalResult {
    /// Actions through the three statements.
    pub actions: usize,
    /// Concurrent tasks (one connection each).
    pub tasks: usize,
    /// Seconds from the first statement to the last commit.
    pub seconds: f64,
    /// Actions per second.
    pub actions_per_s: f64,
    /// Where the CPUs' time went.
    pub cpu: CpuUse,
}

/// Which table the flow runs on.
pub type Table = ArticleTable;

/// What `--floor-parts` removes from the migrated schema before a journal floor run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaPart {
    /// Nothing removed.
    AsMigrated,
    /// The two statement-level triggers that write the events.
    NoEvents,
    /// The business-identity unique index.
    NoIdentityIndex,
    /// The sweeper's partial indexes (planned, live states).
    NoSweeperIndexes,
    /// All three.
    NoneOfThem,
}

impl SchemaPart {
    /// Every variant, in the order they run.
    pub const ALL: [SchemaPart; 5] = [
        SchemaPart::AsMigrated,
        SchemaPart::NoEvents,
        SchemaPart::NoIdentityIndex,
        SchemaPart::NoSweeperIndexes,
        SchemaPart::NoneOfThem,
    ];

    /// What the table calls it.
    pub fn label(self) -> &'static str {
        match self {
            SchemaPart::AsMigrated => "as migrated",
            SchemaPart::NoEvents => "without the events triggers",
            SchemaPart::NoIdentityIndex => "without the identity index",
            SchemaPart::NoSweeperIndexes => "without the sweeper's partial indexes",
            SchemaPart::NoneOfThem => "without all three",
        }
    }

    /// The statements that remove it from a migrated database.
    pub fn removes(self) -> &'static [&'static str] {
        const EVENTS: [&str; 2] = [
            "DROP TRIGGER agent_operations_insert_events ON agent_operations",
            "DROP TRIGGER agent_operations_update_events ON agent_operations",
        ];
        const IDENTITY: [&str; 1] = ["DROP INDEX agent_operations_identity_idx"];
        const SWEEPER: [&str; 3] = [
            "DROP INDEX agent_operations_planned_idx",
            "DROP INDEX agent_operations_clocks_idx",
            "DROP INDEX agent_operations_deferred_since_idx",
        ];
        const ALL: [&str; 6] = [
            EVENTS[0],
            EVENTS[1],
            IDENTITY[0],
            SWEEPER[0],
            SWEEPER[1],
            SWEEPER[2],
        ];
        match self {
            SchemaPart::AsMigrated => &[],
            SchemaPart::NoEvents => &EVENTS,
            SchemaPart::NoIdentityIndex => &IDENTITY,
            SchemaPart::NoSweeperIndexes => &SWEEPER,
            SchemaPart::NoneOfThem => &ALL,
        }
    }
}

/// A pool of `tasks` connections on the (fresh, migrated) database at `url`, every
/// connection opened before the clock starts.
async fn open(url: &str, tasks: usize) -> anyhow::Result<sqlx::PgPool> {
    let pool = db::prepare(
        url,
        &PoolSettings {
            max_connections: u32::try_from(tasks).unwrap_or(u32::MAX),
            acquire_timeout: Duration::from_secs(30),
            pooler: false,
        },
    )
    .await?;
    let mut warm = Vec::with_capacity(tasks);
    for _ in 0..tasks {
        warm.push(pool.acquire().await?);
    }
    drop(warm);
    Ok(pool)
}

/// The journal floor: `tasks` connections, each taking the next `batch` envelopes and
/// sending the three statements a fleet sends for them — `record_many` (the producer),
/// `claim` (a worker's intake), `complete_batch` with a success (its commit loop) — until
/// all are done. Every statement carries `batch` actions; the fleet's carry at most that
/// (its records carry up to 1,000, [`crate::fleet::ENQUEUE_CHUNK`]).
pub async fn run_batched(
    url: &str,
    envelopes: &[Envelope],
    tasks: usize,
    batch: usize,
) -> anyhow::Result<JournalResult> {
    let (tasks, batch) = (tasks.max(1), batch.max(1));
    let pool = open(url, tasks).await?;
    let chunks: Arc<Vec<Vec<Envelope>>> =
        Arc::new(envelopes.chunks(batch).map(<[Envelope]>::to_vec).collect());
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let cpu = CpuSampler::start();
    let started = Instant::now();
    let mut handles = Vec::with_capacity(tasks);
    for t in 0..tasks {
        let (journal, chunks, next) = (Journal::new(pool.clone()), chunks.clone(), next.clone());
        handles.push(tokio::spawn(async move {
            let actor = format!("bench-journal-floor-{t}");
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(chunk) = chunks.get(i) else {
                    return anyhow::Ok(());
                };
                journal.record_many(chunk, &actor).await?;
                let requests: Vec<ClaimRequest<'_>> = chunk
                    .iter()
                    .map(|envelope| ClaimRequest {
                        envelope,
                        lease: Duration::from_secs(60),
                    })
                    .collect();
                let mut completions = Vec::with_capacity(chunk.len());
                for (e, outcome) in chunk.iter().zip(journal.claim(&requests, &actor).await?) {
                    let ClaimOutcome::Claimed(claim) = outcome else {
                        anyhow::bail!("journal floor: {} was not claimed: {outcome:?}", e.key);
                    };
                    let provider_id = format!("bx_{}_{}", i, completions.len());
                    completions.push(Completion {
                        key: claim.key,
                        expected: Status::Executing,
                        attempt: claim.attempt,
                        verdict: Verdict::Succeeded {
                            result: json!({"id": provider_id, "status": "succeeded",
                                           "idempotency_key": e.key.as_str()}),
                            provider_operation_id: provider_id,
                        },
                        reason: "provider_succeeded".into(),
                    });
                }
                let applied = journal.complete_batch(&completions, &actor).await?;
                if !applied.iter().all(|a| a.is_applied()) {
                    anyhow::bail!("journal floor: a completion did not apply");
                }
            }
        }));
    }
    for h in handles {
        h.await??;
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu = cpu.finish(&[]);
    let done = Journal::new(pool.clone())
        .count_in(Status::Succeeded)
        .await?;
    pool.close().await;
    checked("journal floor", done, envelopes.len(), tasks, seconds, cpu)
}

/// The result, once every one of the `actions` operations is seen `succeeded` (`done`).
fn checked(
    what: &str,
    done: i64,
    actions: usize,
    tasks: usize,
    seconds: f64,
    cpu: CpuUse,
) -> anyhow::Result<JournalResult> {
    if usize::try_from(done).ok() != Some(actions) {
        anyhow::bail!("{what}: {done} of {actions} operations succeeded");
    }
    Ok(JournalResult {
        actions,
        tasks,
        seconds,
        actions_per_s: actions as f64 / seconds,
        cpu,
    })
}

/// Run it on the (fresh, migrated) database at `url`, on `table`.
pub async fn run(
    url: &str,
    envelopes: &[Envelope],
    tasks: usize,
    table: Table,
) -> anyhow::Result<JournalResult> {
    let tasks = tasks.max(1);
    let pool = open(url, tasks).await?;
    if table == Table::Plain {
        Journal::new(pool.clone()).create_article_table().await?;
    }

    let rows: Vec<ArticleAction> = envelopes
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let id = &e.intent.identity;
            let provider_id = format!("bx_{i:06}");
            ArticleAction {
                key: e.key.as_str().to_owned(),
                action_type: id.action_type.as_str().to_owned(),
                workflow: id.workflow_id.clone(),
                step: id.step.clone(),
                object: id.business_object.clone(),
                revision: id.revision,
                hash: e.payload_hash.as_str().to_owned(),
                payload: serde_json::Value::Object(e.intent.payload.clone()).to_string(),
                result: json!({"id": provider_id, "status": "succeeded",
                               "idempotency_key": e.key.as_str()})
                .to_string(),
                provider_id,
            }
        })
        .collect();
    let rows = Arc::new(rows);

    let cpu = CpuSampler::start();
    let started = Instant::now();
    let mut handles = Vec::with_capacity(tasks);
    for t in 0..tasks {
        let (journal, rows) = (Journal::new(pool.clone()), rows.clone());
        handles.push(tokio::spawn(async move {
            let actor = format!("bench-journal-{t}");
            let mut i = t;
            while i < rows.len() {
                journal.article_action(&rows[i], &actor, table).await?;
                i += tasks;
            }
            anyhow::Ok(())
        }));
    }
    for h in handles {
        h.await??;
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu = cpu.finish(&[]);
    let journal = Journal::new(pool.clone());
    let done = match table {
        Table::Oncely => journal.count_in(Status::Succeeded).await?,
        Table::Plain => journal.article_succeeded().await?,
    };
    pool.close().await;
    checked("journal ceiling", done, rows.len(), tasks, seconds, cpu)
}
