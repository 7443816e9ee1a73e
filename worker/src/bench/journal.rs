//! The journal ceiling: the article's flow, three autocommit statements per action, on
//! oncely's real migrated schema (CHECK constraints and the events trigger included),
//! from C concurrent tasks, with no broker and no provider.
//!
//! Per action: (a) `INSERT … 'planned' … ON CONFLICT DO NOTHING`; (b) the claim
//! `UPDATE … SET status = 'executing', attempt_count + 1, lease …  WHERE key = $1 AND
//! status IN ('planned', 'failed_retryable') AND (lease_until IS NULL OR lease_until <
//! now()) RETURNING …`; (c) `UPDATE … SET status = 'succeeded', provider id, result,
//! lease and payload cleared WHERE key = $1 AND status = 'executing'`. The schema's
//! constraints add what the article's statements leave out: the claim sets the lease
//! owner, the first attempt time, the actor and reason; the completion clears the owner.

use super::sys::{CpuSampler, CpuUse};
use oncely_core::Envelope;
use oncely_core::db::{self, PoolSettings};
use serde::Serialize;
use serde_json::json;
use sqlx::PgPool;
use std::sync::Arc;
use std::time::{Duration, Instant};

const INSERT: &str = "INSERT INTO agent_operations (idempotency_key, action_type, workflow_id, step, \
     business_object, revision, payload_hash, payload, status, last_actor, last_reason) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb, 'planned', $9, 'recorded') \
     ON CONFLICT (idempotency_key) DO NOTHING";

const CLAIM: &str = "UPDATE agent_operations SET status = 'executing', \
     attempt_count = attempt_count + 1, lease_until = now() + interval '2 minutes', \
     lease_owner = $2, first_attempt_at = coalesce(first_attempt_at, now()), \
     last_actor = $2, last_reason = 'claim', updated_at = now() \
     WHERE idempotency_key = $1 AND status IN ('planned', 'failed_retryable') \
       AND (lease_until IS NULL OR lease_until < now()) \
     RETURNING attempt_count";

const COMPLETE: &str = "UPDATE agent_operations SET status = 'succeeded', \
     provider_operation_id = $2, result_json = $3::jsonb, lease_until = NULL, \
     lease_owner = NULL, payload = NULL, last_actor = $4, \
     last_reason = 'provider_succeeded', updated_at = now() \
     WHERE idempotency_key = $1 AND status = 'executing'";

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

/// One action's data, prepared before the clock starts.
struct Row {
    key: String,
    action_type: String,
    workflow: String,
    step: String,
    object: String,
    revision: i64,
    hash: String,
    payload: String,
    provider_id: String,
    result: String,
}

/// Run it on the (fresh, migrated) database at `url`.
pub async fn run(url: &str, envelopes: &[Envelope], tasks: usize) -> anyhow::Result<JournalResult> {
    let tasks = tasks.max(1);
    let pool = db::prepare(
        url,
        &PoolSettings {
            max_connections: u32::try_from(tasks).unwrap_or(u32::MAX),
            acquire_timeout: Duration::from_secs(30),
        },
    )
    .await?;
    // Open every connection before the clock starts.
    let mut warm = Vec::with_capacity(tasks);
    for _ in 0..tasks {
        warm.push(pool.acquire().await?);
    }
    drop(warm);

    let rows: Vec<Row> = envelopes
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let id = &e.intent.identity;
            let provider_id = format!("bx_{i:06}");
            Row {
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
        let (pool, rows) = (pool.clone(), rows.clone());
        handles.push(tokio::spawn(async move {
            let actor = format!("bench-journal-{t}");
            let mut i = t;
            while i < rows.len() {
                one_action(&pool, &rows[i], &actor).await?;
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
    let done: i64 =
        sqlx::query_scalar("SELECT count(*) FROM agent_operations WHERE status = 'succeeded'")
            .fetch_one(&pool)
            .await?;
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

async fn one_action(pool: &PgPool, r: &Row, actor: &str) -> anyhow::Result<()> {
    sqlx::query(INSERT)
        .bind(&r.key)
        .bind(&r.action_type)
        .bind(&r.workflow)
        .bind(&r.step)
        .bind(&r.object)
        .bind(r.revision)
        .bind(&r.hash)
        .bind(&r.payload)
        .bind(actor)
        .execute(pool)
        .await?;
    let claimed: Option<i32> = sqlx::query_scalar(CLAIM)
        .bind(&r.key)
        .bind(actor)
        .fetch_optional(pool)
        .await?;
    if claimed.is_none() {
        anyhow::bail!("journal ceiling: the claim of {} found nothing", r.key);
    }
    let done = sqlx::query(COMPLETE)
        .bind(&r.key)
        .bind(&r.provider_id)
        .bind(&r.result)
        .bind(actor)
        .execute(pool)
        .await?;
    if done.rows_affected() != 1 {
        anyhow::bail!(
            "journal ceiling: the completion of {} changed nothing",
            r.key
        );
    }
    Ok(())
}
