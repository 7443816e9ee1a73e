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
//! live in the journal ([`oncely_core::journal::article`]), the only module with SQL.

use super::sys::{CpuSampler, CpuUse};
use oncely_core::Envelope;
use oncely_core::db::{self, PoolSettings};
use oncely_core::journal::Journal;
use oncely_core::journal::article::{ArticleAction, ArticleTable};
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

/// Run it on the (fresh, migrated) database at `url`, on `table`.
pub async fn run(
    url: &str,
    envelopes: &[Envelope],
    tasks: usize,
    table: Table,
) -> anyhow::Result<JournalResult> {
    let tasks = tasks.max(1);
    let pool = db::prepare(
        url,
        &PoolSettings {
            max_connections: u32::try_from(tasks).unwrap_or(u32::MAX),
            acquire_timeout: Duration::from_secs(30),
            pooler: false,
        },
    )
    .await?;
    if table == Table::Plain {
        Journal::new(pool.clone()).create_article_table().await?;
    }
    // Open every connection before the clock starts.
    let mut warm = Vec::with_capacity(tasks);
    for _ in 0..tasks {
        warm.push(pool.acquire().await?);
    }
    drop(warm);

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
    if done as usize != rows.len() {
        anyhow::bail!(
            "journal ceiling: {done} of {} operations succeeded",
            rows.len()
        );
    }
    Ok(JournalResult {
        actions: rows.len(),
        tasks,
        seconds,
        actions_per_s: rows.len() as f64 / seconds,
        cpu,
    })
}
