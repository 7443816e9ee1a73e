//! What the run reads: the journal (operations, events, reviews), the broker's queue
//! depths, the sandbox's effects and its own records by key — during the run to steer the
//! schedule, and once the fleet has stopped as plain data for the checks ([`Facts`]) and
//! the report ([`Figures`]).
//!
//! The tests crate reads the journal's tables directly, not through the journal module:
//! the checks must not trust the code they check.

use super::control::{ApproverTally, CancelAnswer, CancelTally};
use super::http::http_get;
use super::schedule::Healed;
use super::workload::{self, ProducerReport, Workload};
use crate::fleet::Fleet;
use futures_util::StreamExt;
use oncely_core::Status;
use oncely_sandbox::Effects;
use serde_json::Value;
use sqlx::{PgPool, Row};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;
use tokio::process::Command;

/// One intent of the workload, as the producer left it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct IntentFact {
    /// Its idempotency key.
    pub key: String,
    /// The hash of its real payload.
    pub payload_hash: String,
    /// The producer got an answer saying the journal holds it.
    pub recorded: bool,
    /// It asked for an `expires_at`.
    pub expires: bool,
    /// The approval rule holds it (it runs only once approved).
    pub held: bool,
}

/// One journal row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Operation {
    /// Its action type.
    pub action: String,
    /// Its status.
    pub status: Status,
    /// Attempts made.
    pub attempts: i32,
    /// The payload hash recorded.
    pub payload_hash: String,
    /// The provider's id of the effect, once known.
    pub provider_id: Option<String>,
}

/// The provider's own record of a succeeded operation, read by key.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Lookup {
    /// The key.
    pub key: String,
    /// The provider id the journal holds.
    pub journal_id: String,
    /// The provider's answer (HTTP status, JSON body), or why there was none.
    pub answer: Result<(u16, Value), String>,
}

/// A payment order's move out of `unknown`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PaymentMove {
    /// The key.
    pub key: String,
    /// The event's reason.
    pub reason: String,
    /// Where it went.
    pub to: Status,
}

/// Healing did not settle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct NotSettled {
    /// How long healing was allowed.
    pub limit: Duration,
    /// What was still unsettled at the last look.
    pub state: String,
}

/// Everything the checks judge, as plain data.
#[derive(Debug, Clone, Default)]
pub(super) struct Facts {
    /// The workload's intents, by index.
    pub intents: Vec<IntentFact>,
    /// The journal, by key.
    pub operations: BTreeMap<String, Operation>,
    /// Open reviews: key → reason.
    pub open_reviews: BTreeMap<String, String>,
    /// Keys a person resolved as succeeded (they may have no effect).
    pub review_succeeded: BTreeSet<String>,
    /// The sandbox's effects: its ground truth.
    pub effects: Effects,
    /// The provider's records of the journal's succeeded operations.
    pub lookups: Vec<Lookup>,
    /// Payment orders' moves out of `unknown`.
    pub payment_moves: Vec<PaymentMove>,
    /// Requests that reached the sandbox with a reused key and another body.
    pub conflicts_422: u64,
    /// Answers the producer should never have had.
    pub producer_anomalies: Vec<String>,
    /// Why the producer gave up, if it did.
    pub producer_fatal: Option<String>,
    /// Healing did not settle.
    pub not_settled: Option<NotSettled>,
    /// The canceller's answers, by key.
    pub cancels: BTreeMap<String, CancelAnswer>,
    /// Keys an approval moved on (an `approved` event).
    pub approved: BTreeSet<String>,
    /// Answers the approver should never have had.
    pub control_anomalies: Vec<String>,
}

impl Facts {
    /// Read the facts once the fleet has stopped. `stats`: the sandbox's counters.
    pub async fn gather(
        fleet: &Fleet,
        run: Ran<'_>,
        healed: &Healed,
        heal_limit: Duration,
        stats: &Value,
    ) -> anyhow::Result<Facts> {
        let Ran {
            workload,
            produced,
            approver,
            cancels,
        } = run;
        let pool = &fleet.db.pool;
        let intents = workload
            .sealed
            .iter()
            .zip(&produced.recorded)
            .enumerate()
            .map(|(i, (s, recorded))| IntentFact {
                key: s.key.clone(),
                payload_hash: s.payload_hash.clone(),
                recorded: *recorded,
                expires: workload.expiry[i].is_some(),
                held: workload::held_by_rule(i),
            })
            .collect();
        let approved = read("approved", || {
            sqlx::query_scalar::<_, String>(
                "SELECT DISTINCT idempotency_key FROM operation_events WHERE reason = 'approved' \
                 AND from_status = 'awaiting_approval'",
            )
            .fetch_all(pool)
        })
        .await?
        .into_iter()
        .collect();
        let operations = operations(pool).await?;
        let review_succeeded = read("review_succeeded", || {
            sqlx::query_scalar::<_, String>(
                "SELECT DISTINCT idempotency_key FROM operation_events WHERE reason = 'review_succeeded'",
            )
            .fetch_all(pool)
        })
        .await?
        .into_iter()
        .collect();
        let lookups = lookups(fleet.sandbox.addr(), &operations, &review_succeeded).await;
        Ok(Facts {
            intents,
            open_reviews: open_reviews(pool).await?,
            review_succeeded,
            effects: fleet.sandbox.effects(),
            lookups,
            payment_moves: payment_moves(pool).await?,
            conflicts_422: stats["conflicts_422"].as_u64().unwrap_or(0),
            producer_anomalies: produced.anomalies.clone(),
            producer_fatal: produced.fatal.clone(),
            not_settled: (!healed.settled).then(|| NotSettled {
                limit: heal_limit,
                state: healed.last_state.clone(),
            }),
            operations,
            cancels: cancels.answers.clone(),
            approved,
            control_anomalies: approver.anomalies.clone(),
        })
    }
}

/// What the run's tasks did, for [`Facts::gather`].
#[derive(Debug, Clone, Copy)]
pub(super) struct Ran<'a> {
    /// The workload.
    pub workload: &'a Workload,
    /// What the producer did.
    pub produced: &'a ProducerReport,
    /// What the approver did.
    pub approver: &'a ApproverTally,
    /// What the canceller did.
    pub cancels: &'a CancelTally,
}

/// Run a read, retrying through terminated connections.
async fn read<T, F, Fut>(what: &str, mut f: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, sqlx::Error>>,
{
    let mut last = None;
    for _ in 0..20 {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) => {
                last = Some(e);
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    }
    Err(anyhow::anyhow!("{what}: {:?}", last))
}

/// Every journal row, by key.
async fn operations(pool: &PgPool) -> anyhow::Result<BTreeMap<String, Operation>> {
    let rows: Vec<(String, String, String, i32, String, Option<String>)> =
        read("operations", || {
            sqlx::query_as(
                "SELECT idempotency_key, action_type, status, attempt_count, payload_hash, provider_operation_id \
                 FROM agent_operations",
            )
            .fetch_all(pool)
        })
        .await?;
    rows.into_iter()
        .map(
            |(key, action, status, attempts, payload_hash, provider_id)| {
                let op = Operation {
                    action,
                    status: status.parse()?,
                    attempts,
                    payload_hash,
                    provider_id,
                };
                Ok((key, op))
            },
        )
        .collect()
}

/// Open reviews: key → reason.
async fn open_reviews(pool: &PgPool) -> anyhow::Result<BTreeMap<String, String>> {
    let rows: Vec<(String, String)> = read("open reviews", || {
        sqlx::query_as(
            "SELECT idempotency_key, reason FROM operation_reviews WHERE resolved_at IS NULL",
        )
        .fetch_all(pool)
    })
    .await?;
    Ok(rows.into_iter().collect())
}

/// Payment orders' moves out of `unknown` (they may leave it only by lookup, late
/// answer, or a person).
async fn payment_moves(pool: &PgPool) -> anyhow::Result<Vec<PaymentMove>> {
    let rows: Vec<(String, String, String)> = read("payment moves", || {
        sqlx::query_as(
            "SELECT e.idempotency_key, e.reason, e.to_status FROM operation_events e \
             JOIN agent_operations o USING (idempotency_key) \
             WHERE o.action_type = 'payment_order.create' AND e.from_status = 'unknown' AND e.to_status <> 'unknown'",
        )
        .fetch_all(pool)
    })
    .await?;
    rows.into_iter()
        .map(|(key, reason, to)| {
            Ok(PaymentMove {
                key,
                reason,
                to: to.parse()?,
            })
        })
        .collect()
}

/// The provider's record of every succeeded operation (not resolved by a person), read
/// by key, 16 at a time.
async fn lookups(
    addr: std::net::SocketAddr,
    operations: &BTreeMap<String, Operation>,
    review_succeeded: &BTreeSet<String>,
) -> Vec<Lookup> {
    let succeeded: Vec<(String, &'static str, String)> = operations
        .iter()
        .filter(|(k, o)| o.status == Status::Succeeded && !review_succeeded.contains(*k))
        .filter_map(|(k, o)| {
            let resource = match o.action.as_str() {
                "email.send" => "emails",
                "ticket.create" => "tickets",
                "payment_order.create" => "payment-orders",
                _ => return None,
            };
            Some((
                k.clone(),
                resource,
                o.provider_id.clone().unwrap_or_default(),
            ))
        })
        .collect();
    futures_util::stream::iter(succeeded.into_iter().map(|(key, resource, id)| async move {
        let path = format!(
            "/v1/{resource}?idempotency_key={}",
            oncely_sandbox::control::percent_encode(&key)
        );
        let answer = http_get(addr, &path).await.map_err(|e| e.to_string());
        Lookup {
            key,
            journal_id: id,
            answer,
        }
    }))
    .buffer_unordered(16)
    .collect()
    .await
}

/// Counts of the journal's statuses.
pub(super) async fn status_counts(pool: &PgPool) -> anyhow::Result<BTreeMap<String, i64>> {
    let rows: Vec<(String, i64)> = read("status counts", || {
        sqlx::query_as("SELECT status, count(*) FROM agent_operations GROUP BY status")
            .fetch_all(pool)
    })
    .await?;
    Ok(rows.into_iter().collect())
}

/// (live: planned/awaiting_approval/executing/failed_retryable/deferred — a held operation
/// waits for the approver, who decides every one once the faults are over —, unknown not
/// yet with a person: without an open review, or with one still re-checked by lookups —
/// automation may still settle it).
pub(super) async fn unsettled(pool: &PgPool) -> anyhow::Result<(i64, i64)> {
    read("unsettled", || {
        sqlx::query_as(
            "SELECT count(*) FILTER (WHERE status IN ('planned', 'awaiting_approval', 'executing', 'failed_retryable', 'deferred')), \
                    count(*) FILTER (WHERE status = 'unknown' AND NOT EXISTS (SELECT 1 FROM operation_reviews r \
                        WHERE r.idempotency_key = o.idempotency_key AND r.resolved_at IS NULL AND r.recheck_at IS NULL)) \
             FROM agent_operations o",
        )
        .fetch_one(pool)
    })
    .await
}

/// The pid in an actor or lease owner `role@host:pid:nonce`.
fn pid_of(actor: &str) -> Option<u32> {
    let mut parts = actor.rsplitn(3, ':');
    let _nonce = parts.next()?;
    parts.next()?.parse().ok()
}

/// Processes holding `executing` leases: pid → operations.
pub(super) async fn busy_pids(pool: &PgPool) -> anyhow::Result<HashMap<u32, i64>> {
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT lease_owner, count(*) FROM agent_operations \
         WHERE status = 'executing' AND lease_owner IS NOT NULL GROUP BY 1",
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .filter_map(|(owner, n)| pid_of(&owner).map(|pid| (pid, n)))
        .collect())
}

/// Ready and unacked messages of this fleet's queues (the broker's view).
pub(super) async fn queue_depths(
    node: Option<&str>,
    prefix: &str,
) -> anyhow::Result<BTreeMap<String, (u64, u64)>> {
    let mut cmd = Command::new("rabbitmqctl");
    cmd.arg("-q");
    if let Some(node) = node {
        cmd.arg("-n").arg(node);
    }
    let out = cmd
        .args([
            "list_queues",
            "name",
            "messages_ready",
            "messages_unacknowledged",
        ])
        .stdin(Stdio::null())
        .output()
        .await?;
    anyhow::ensure!(
        out.status.success(),
        "rabbitmqctl list_queues: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut depths = BTreeMap::new();
    let own = format!("{prefix}.");
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.len() == 3 && cols[0].starts_with(&own) {
            depths.insert(
                cols[0].to_owned(),
                (
                    cols[1].parse().unwrap_or(u64::MAX),
                    cols[2].parse().unwrap_or(u64::MAX),
                ),
            );
        }
    }
    Ok(depths)
}

/// Labelled counts, as a grouping query returns them.
pub(super) type Groups = Vec<(String, i64)>;

/// The report's figures from the journal, the broker and the sandbox's counters.
#[derive(Debug, Default)]
pub(super) struct Figures {
    /// The sandbox's counters (`GET /control/stats`).
    pub stats: Value,
    /// `claim` events: (all, re-attempts).
    pub claims: (i64, i64),
    /// Moves into `unknown`, by reason.
    pub to_unknown: Groups,
    /// Moves out of `unknown`, by reason and status.
    pub from_unknown: Groups,
    /// Reviews opened, by reason.
    pub reviews: Groups,
    /// Reviews closed, by resolution (`auto:*`: closed by themselves; the others by people).
    pub reviews_closed: Groups,
    /// Open reviews still re-checked by lookups (the rest wait for a person).
    pub reviews_rechecked: i64,
    /// Events of a few telling reasons.
    pub other_reasons: Groups,
    /// The journal's statuses at the end.
    pub final_status: BTreeMap<String, i64>,
    /// Open reviews on operations that settled meanwhile.
    pub reviews_on_settled: i64,
    /// Payment orders that went `unknown`.
    pub pay_unknown: i64,
    /// Keys worth reading: (why, key).
    pub examples: Vec<(String, String)>,
    /// Messages in the dead-letter queue, if it could be read.
    pub dead_letters: Option<u64>,
}

/// One grouping query.
async fn grouped(pool: &PgPool, sql: &'static str) -> anyhow::Result<Groups> {
    read(sql, || sqlx::query_as(sql).fetch_all(pool)).await
}

/// A count query.
async fn count(pool: &PgPool, sql: &'static str) -> anyhow::Result<i64> {
    read(sql, || sqlx::query_scalar(sql).fetch_one(pool)).await
}

impl Figures {
    /// Read the figures once the fleet has stopped.
    pub async fn gather(
        fleet: &Fleet,
        node: Option<&str>,
        stats: Value,
    ) -> anyhow::Result<Figures> {
        let pool = &fleet.db.pool;
        let dead_letters = queue_depths(node, &fleet.prefix)
            .await
            .ok()
            .and_then(|d| d.get(&fleet.topology().dead_queue()).copied())
            .map(|(r, u)| r + u);
        let claims = read("claims", || {
            sqlx::query_as(
                "SELECT count(*), count(*) FILTER (WHERE attempt > 1) FROM operation_events WHERE reason = 'claim'",
            )
            .fetch_one(pool)
        })
        .await?;
        let mut f = Figures {
            stats,
            claims,
            dead_letters,
            ..Figures::default()
        };
        f.unknowns(pool).await?;
        f.final_status = status_counts(pool).await?;
        f.reviews_on_settled = count(
            pool,
            "SELECT count(*) FROM operation_reviews r JOIN agent_operations o USING (idempotency_key) \
             WHERE r.resolved_at IS NULL AND o.status <> 'unknown'",
        )
        .await?;
        f.pay_unknown = count(
            pool,
            "SELECT count(DISTINCT e.idempotency_key) FROM operation_events e JOIN agent_operations o USING (idempotency_key) \
             WHERE o.action_type = 'payment_order.create' AND e.to_status = 'unknown'",
        )
        .await?;
        f.examples = examples(pool).await?;
        Ok(f)
    }

    /// The moves into and out of `unknown`, reviews, and a few telling reasons.
    async fn unknowns(&mut self, pool: &PgPool) -> anyhow::Result<()> {
        self.to_unknown = grouped(
            pool,
            "SELECT reason, count(*) FROM operation_events WHERE to_status = 'unknown' \
             AND from_status IS DISTINCT FROM 'unknown' GROUP BY reason ORDER BY 2 DESC",
        )
        .await?;
        self.from_unknown = grouped(
            pool,
            "SELECT reason || ' → ' || to_status, count(*) FROM operation_events WHERE from_status = 'unknown' \
             AND to_status <> 'unknown' GROUP BY 1 ORDER BY 2 DESC",
        )
        .await?;
        self.reviews = grouped(
            pool,
            "SELECT reason, count(*) FROM operation_reviews GROUP BY reason ORDER BY 2 DESC",
        )
        .await?;
        self.reviews_closed = grouped(
            pool,
            "SELECT resolution, count(*) FROM operation_reviews WHERE resolved_at IS NOT NULL \
             GROUP BY resolution ORDER BY 2 DESC",
        )
        .await?;
        self.reviews_rechecked = count(
            pool,
            "SELECT count(*) FROM operation_reviews WHERE resolved_at IS NULL AND recheck_at IS NOT NULL",
        )
        .await?;
        self.other_reasons = grouped(
            pool,
            "SELECT reason, count(*) FROM operation_events WHERE reason IN ('conflict', 'late_answer', 'reconcile_absent_retry', 'lease_expired') \
             GROUP BY reason ORDER BY 1",
        )
        .await?;
        Ok(())
    }
}

/// Observations (not failures) worth reading: open reviews on settled operations, and a
/// late answer.
async fn examples(pool: &PgPool) -> anyhow::Result<Vec<(String, String)>> {
    read("examples", || {
        sqlx::query_as(
            "(SELECT 'open review on a settled operation', r.idempotency_key FROM operation_reviews r \
               JOIN agent_operations o USING (idempotency_key) \
               WHERE r.resolved_at IS NULL AND o.status <> 'unknown' ORDER BY r.id LIMIT 2) \
             UNION ALL \
             (SELECT 'late answer', e.idempotency_key FROM operation_events e \
               WHERE e.reason = 'late_answer' AND NOT EXISTS (SELECT 1 FROM operation_reviews r \
                 WHERE r.idempotency_key = e.idempotency_key AND r.resolved_at IS NULL) ORDER BY e.id LIMIT 1)",
        )
        .fetch_all(pool)
    })
    .await
}

/// A key's event trail and reviews, for a finding.
pub(super) async fn trail(pool: &PgPool, key: &str) -> String {
    let mut out = String::new();
    let rows = sqlx::query(
        "SELECT id, from_status, to_status, attempt, actor, reason, error_code, provider_operation_id, \
                to_char(at AT TIME ZONE 'UTC', 'HH24:MI:SS.MS') AS at \
         FROM operation_events WHERE idempotency_key = $1 ORDER BY id",
    )
    .bind(key)
    .fetch_all(pool)
    .await
    .unwrap_or_default();
    for r in rows {
        let opt = |col: &str| r.try_get::<Option<String>, _>(col).ok().flatten();
        let _ = writeln!(
            out,
            "      {} {} → {} attempt {} by {} ({}{}{})",
            r.try_get::<String, _>("at").unwrap_or_default(),
            opt("from_status").unwrap_or_else(|| "∅".into()),
            r.try_get::<String, _>("to_status").unwrap_or_default(),
            r.try_get::<i32, _>("attempt").unwrap_or_default(),
            r.try_get::<String, _>("actor").unwrap_or_default(),
            r.try_get::<String, _>("reason").unwrap_or_default(),
            opt("error_code")
                .map(|c| format!(", {c}"))
                .unwrap_or_default(),
            opt("provider_operation_id")
                .map(|c| format!(", id {c}"))
                .unwrap_or_default(),
        );
    }
    out.push_str(&reviews_of(pool, key).await);
    out
}

/// A key's reviews, one line each.
async fn reviews_of(pool: &PgPool, key: &str) -> String {
    let mut out = String::new();
    let reviews = sqlx::query(
        "SELECT reason, opened_by, resolution FROM operation_reviews WHERE idempotency_key = $1 ORDER BY id",
    )
    .bind(key)
    .fetch_all(pool)
    .await
    .unwrap_or_default();
    for r in reviews {
        let _ = writeln!(
            out,
            "      review: {} by {} ({})",
            r.try_get::<String, _>("reason").unwrap_or_default(),
            r.try_get::<String, _>("opened_by").unwrap_or_default(),
            r.try_get::<Option<String>, _>("resolution")
                .ok()
                .flatten()
                .unwrap_or_else(|| "open".into())
        );
    }
    out
}

/// The timeline's lines about the processes that acted on `key` (pids from the actors
/// `role@host:pid:nonce` of its events): was a worker stopped, killed, aborted meanwhile?
pub(super) async fn schedule_notes(pool: &PgPool, key: &str, timeline: &[String]) -> String {
    let actors: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT actor FROM operation_events WHERE idempotency_key = $1",
    )
    .bind(key)
    .fetch_all(pool)
    .await
    .unwrap_or_default();
    let mut out = String::new();
    for pid in actors.iter().filter_map(|a| pid_of(a)) {
        let tag = format!("(pid {pid})");
        for line in timeline
            .iter()
            .filter(|l| l.contains(&tag) && !l.contains(" spawn "))
        {
            let _ = writeln!(out, "      schedule: {line}");
        }
    }
    out
}

/// Write the journal (operations, events, reviews) as TSV next to the logs.
pub(super) async fn dump(pool: &PgPool, dir: &Path) {
    for (file, sql) in [
        (
            "operations.tsv",
            "SELECT concat_ws(E'\\t', idempotency_key, action_type, status, attempt_count, provider_operation_id, \
             last_error_code, reconcile_checks, created_at, updated_at) FROM agent_operations ORDER BY created_at",
        ),
        (
            "events.tsv",
            "SELECT concat_ws(E'\\t', id, idempotency_key, from_status, to_status, attempt, actor, reason, error_code, \
             provider_operation_id, at) FROM operation_events ORDER BY id",
        ),
        (
            "reviews.tsv",
            "SELECT concat_ws(E'\\t', id, idempotency_key, reason, opened_by, opened_at, resolution) FROM operation_reviews ORDER BY id",
        ),
    ] {
        if let Ok(rows) = sqlx::query_scalar::<_, String>(sql).fetch_all(pool).await {
            let _ = std::fs::write(dir.join(file), rows.join("\n") + "\n");
        }
    }
}
