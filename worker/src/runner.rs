//! The action worker: consume, validate, claim in batches, call, commit, then ack.
//!
//! ```text
//! consumers (one channel per action queue, prefetch) ─▶ batch loop ─▶ claim (1 statement)
//!    ├─ invalid ─▶ dead-letter with a reason header, ack
//!    ├─ not claimed ─▶ decide from the journal (ack / conflict / requeue), nobody called
//!    └─ claimed ─▶ provider call (≤ max_in_flight) ─▶ commit loop: CAS (1 statement per
//!                  batch) ─▶ outcome events, unknown → reconcile queue ─▶ ack
//! ```
//! Acks come only after the commit, and each ack's `bool` is checked. A session ends
//! when the connection does; [`run`] supervises sessions and rebuilds them with backoff
//! until shutdown, so a broker restart is survived. Deliveries of a dead session are
//! never acked on a new one (their ackers belong to the old channel): RabbitMQ
//! redelivers them and the claim turns the repeats into acks without provider calls.
//!
//! Shutdown: consumers are cancelled, buffered deliveries are nacked back to the queue,
//! in-flight calls finish and commit (bounded by the provider timeout), outcomes are
//! flushed, the connection is closed.

use crate::context::Context;
use crate::decide::{self, Disposition};
use crate::outcome::{self, OutcomeEvent};
use crate::provider::Call;
use crate::retry;
use crate::shutdown::Shutdown;
use futures_util::StreamExt;
use lapin::Channel;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions,
    BasicRejectOptions,
};
use lapin::types::FieldTable;
use oncely_core::journal::{Claim, ClaimOutcome, ClaimRequest, Completion, Verdict};
use oncely_core::metrics as m;
use oncely_core::publish::Publisher;
use oncely_core::topology::{self, REJECT_DETAIL_HEADER, REJECT_REASON_HEADER};
use oncely_core::{Envelope, Status};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{Semaphore, mpsc};

/// A delivery and the action type of the queue it came from.
struct Incoming {
    action: Arc<str>,
    delivery: Delivery,
}

/// A provider call that finished and waits for its commit.
struct Finished {
    delivery: Delivery,
    env: Envelope,
    attempt: i32,
    verdict: Verdict,
}

/// Run the worker until `shutdown`, reconnecting as needed.
pub async fn run(ctx: Context, shutdown: Shutdown) -> anyhow::Result<()> {
    crate::shutdown::supervise("worker", shutdown, |s| session(&ctx, s)).await
}

/// One connection's life. `Ok` on shutdown, `Err` when the connection is lost.
async fn session(ctx: &Context, mut shutdown: Shutdown) -> anyhow::Result<()> {
    let conn = topology::connect(&ctx.config.broker.url, &ctx.owner).await?;
    let publisher = Publisher::open(&conn).await?;
    ctx.topology
        .declare(publisher.channel(), &ctx.action_types())
        .await?;
    metrics::counter!(m::CONNECTIONS, "kind" => "amqp", "result" => "established").increment(1);
    let w = &ctx.config.worker;
    let (tx, mut rx) =
        mpsc::channel::<Incoming>(usize::from(w.prefetch) * ctx.config.actions.len().max(1));
    let mut consumers: Vec<(Channel, String)> = Vec::new();
    for action in ctx.action_types() {
        let ch = conn.create_channel().await?;
        ch.basic_qos(w.prefetch, BasicQosOptions::default()).await?;
        let tag = format!("{}#{action}", ctx.owner);
        let mut consumer = ch
            .basic_consume(
                ctx.topology.action_queue(action).into(),
                tag.as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        consumers.push((ch, tag));
        let (tx, action): (_, Arc<str>) = (tx.clone(), action.into());
        tokio::spawn(async move {
            while let Some(d) = consumer.next().await {
                match d {
                    Ok(delivery) => {
                        if tx
                            .send(Incoming {
                                action: action.clone(),
                                delivery,
                            })
                            .await
                            .is_err()
                        {
                            break;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, queue = %action, "consumer stopped");
                        break;
                    }
                }
            }
        });
    }
    drop(tx);
    tracing::info!(owner = %ctx.owner, queues = consumers.len(), "worker consuming");

    let batch_max = w.batch.min(w.max_in_flight).max(1);
    let sem = Arc::new(Semaphore::new(w.max_in_flight));
    let (commit_tx, commit_rx) = mpsc::channel::<Finished>(w.max_in_flight * 2);
    let committer = tokio::spawn(commit_loop(ctx.clone(), publisher.clone(), commit_rx));
    let lost = loop {
        tokio::select! {
            biased;
            _ = shutdown.wait() => break false,
            first = rx.recv() => {
                let Some(first) = first else { break true };
                let mut batch = vec![first];
                while batch.len() < batch_max {
                    match rx.try_recv() {
                        Ok(d) => batch.push(d),
                        Err(_) => break,
                    }
                }
                handle_batch(ctx, &publisher, batch, &sem, &commit_tx).await;
            }
        }
    };

    // Stop intake, hand back what is buffered, let in-flight calls finish and commit.
    for (ch, tag) in &consumers {
        let _ = ch
            .basic_cancel(tag.as_str().into(), BasicCancelOptions::default())
            .await;
    }
    rx.close();
    while let Some(inc) = rx.recv().await {
        let _ = inc
            .delivery
            .acker
            .nack(BasicNackOptions {
                requeue: true,
                multiple: false,
            })
            .await;
    }
    let grace = ctx
        .config
        .providers
        .values()
        .map(|p| p.timeout())
        .max()
        .unwrap_or(Duration::from_secs(5))
        + Duration::from_secs(2);
    let all = u32::try_from(w.max_in_flight).unwrap_or(u32::MAX);
    if tokio::time::timeout(grace, sem.acquire_many(all))
        .await
        .is_err()
    {
        tracing::warn!(
            ?grace,
            "in-flight provider calls did not finish in time; their leases will expire into unknown"
        );
    }
    drop(commit_tx);
    let _ = tokio::time::timeout(grace, committer).await;
    let _ = conn.close(200, "worker stopping".into()).await;
    if lost {
        Err(anyhow::anyhow!("connection to RabbitMQ lost"))
    } else {
        Ok(())
    }
}

async fn handle_batch(
    ctx: &Context,
    publisher: &Publisher,
    batch: Vec<Incoming>,
    sem: &Arc<Semaphore>,
    commit_tx: &mpsc::Sender<Finished>,
) {
    let max_bytes = ctx.config.worker.max_message_bytes;
    let mut valid: Vec<(Incoming, Envelope)> = Vec::with_capacity(batch.len());
    for inc in batch {
        match Envelope::parse(&inc.delivery.data, max_bytes, ctx.secret.as_ref()) {
            Err(e) => dead_letter(ctx, publisher, inc, e.reason(), &e.to_string()).await,
            Ok(env) if env.intent.identity.action_type.as_str() != &*inc.action => {
                dead_letter(
                    ctx,
                    publisher,
                    inc,
                    "action_type_mismatch",
                    "the envelope's action_type is not this queue's",
                )
                .await
            }
            Ok(env) if ctx.route(&env.intent.identity.action_type).is_none() => {
                dead_letter(
                    ctx,
                    publisher,
                    inc,
                    "unknown_action_type",
                    "no policy for this action type",
                )
                .await
            }
            Ok(env) => valid.push((inc, env)),
        }
    }
    if valid.is_empty() {
        return;
    }
    let Ok(mut permits) = sem.clone().acquire_many_owned(valid.len() as u32).await else {
        return;
    };
    let requests: Vec<ClaimRequest<'_>> = valid
        .iter()
        .map(|(_, env)| ClaimRequest {
            envelope: env,
            lease: ctx
                .route(&env.intent.identity.action_type)
                .map_or(Duration::from_secs(60), |(p, _)| p.lease),
        })
        .collect();
    metrics::histogram!(m::CLAIM_BATCH_SIZE).record(requests.len() as f64);
    let started = Instant::now();
    let outcomes = retry::journal("claim", Duration::from_secs(30), || {
        ctx.journal.claim(&requests, &ctx.owner)
    })
    .await;
    metrics::histogram!(m::JOURNAL_STATEMENT_SECONDS, "statement" => "claim")
        .record(started.elapsed().as_secs_f64());
    drop(requests);
    let outcomes = match outcomes {
        Ok(o) => {
            crate::failpoint::hit("after_claim");
            o
        }
        Err(e) => {
            tracing::error!(error = %e, n = valid.len(), "claim failed; deliveries go back to the queue");
            for (inc, _) in valid {
                let _ = inc
                    .delivery
                    .acker
                    .nack(BasicNackOptions {
                        requeue: true,
                        multiple: false,
                    })
                    .await;
            }
            return;
        }
    };
    for ((inc, env), outcome) in valid.into_iter().zip(outcomes) {
        match outcome {
            ClaimOutcome::Claimed(claim) => {
                metrics::counter!(m::DELIVERIES, "action_type" => inc.action.to_string(), "verdict" => "claimed").increment(1);
                let permit = permits.split(1);
                let (ctx, tx) = (ctx.clone(), commit_tx.clone());
                tokio::spawn(async move {
                    let finished = call(&ctx, inc.delivery, env, claim, started).await;
                    drop(permit);
                    let _ = tx.send(finished).await;
                });
            }
            ClaimOutcome::NotClaimed { why, op } => match decide::disposition(why) {
                Disposition::Ack(verdict) => {
                    metrics::counter!(m::DELIVERIES, "action_type" => inc.action.to_string(), "verdict" => verdict).increment(1);
                    tracing::debug!(key = %env.key, status = %op.status, verdict, "not claimed; acked without a provider call");
                    ack(&inc.delivery).await;
                }
                Disposition::Requeue => {
                    metrics::counter!(m::DELIVERIES, "action_type" => inc.action.to_string(), "verdict" => "requeued").increment(1);
                    let _ = inc
                        .delivery
                        .acker
                        .nack(BasicNackOptions {
                            requeue: true,
                            multiple: false,
                        })
                        .await;
                }
                Disposition::Conflict => {
                    metrics::counter!(m::DELIVERIES, "action_type" => inc.action.to_string(), "verdict" => "conflict").increment(1);
                    tracing::warn!(key = %env.key, action_type = %inc.action, "conflicting payload for an existing key refused");
                    if let Err(e) = ctx
                        .journal
                        .record_conflict(&env.key, &env.payload_hash, &ctx.owner)
                        .await
                    {
                        tracing::warn!(key = %env.key, error = %e, "could not record the conflict");
                    }
                    let ev = OutcomeEvent {
                        schema: outcome::OUTCOME_SCHEMA,
                        idempotency_key: env.key.as_str(),
                        action_type: &inc.action,
                        status: "conflict",
                        attempt: op.attempt_count,
                        workflow_id: &env.intent.identity.workflow_id,
                        provider_operation_id: None,
                        error_code: Some("payload_hash_mismatch"),
                    };
                    if let Some(p) = outcome::publish(publisher, &ctx.topology, &ev).await {
                        outcome::flush(vec![p]).await;
                    }
                    ack(&inc.delivery).await;
                }
            },
        }
    }
}

/// Call the provider for a won claim and classify the answer.
async fn call(
    ctx: &Context,
    delivery: Delivery,
    env: Envelope,
    claim: Claim,
    claimed_at: Instant,
) -> Finished {
    let Some((policy, provider)) = ctx.route(&env.intent.identity.action_type) else {
        unreachable!("routes are checked before claiming");
    };
    // Never start a call that could outlive the lease (a process paused or starved between
    // claim and call): the sweeper may already have declared the attempt unknown, and a
    // call sent now would be the "late effect" no lookup could have seen. Not sent, so
    // retryable; the compare-and-set refuses it if the attempt has moved on.
    let timeout = ctx
        .config
        .providers
        .get(&policy.provider)
        .map_or(Duration::from_secs(5), |p| p.timeout());
    if claimed_at.elapsed() + timeout + Duration::from_secs(1) >= policy.lease {
        tracing::warn!(key = %env.key, attempt = claim.attempt, "lease too close to its end to call the provider; not sent");
        let verdict = decide::verdict(
            crate::provider::Outcome::NotSent {
                code: "lease_too_short".into(),
            },
            claim.attempt,
            policy,
        );
        return Finished {
            delivery,
            env,
            attempt: claim.attempt,
            verdict,
        };
    }
    let started = Instant::now();
    let outcome = provider
        .execute(Call {
            key: &env.key,
            action_type: env.intent.identity.action_type.as_str(),
            payload: &env.intent.payload,
        })
        .await;
    crate::failpoint::hit("after_provider");
    let label = decide::outcome_label(&outcome);
    metrics::histogram!(m::PROVIDER_CALL_SECONDS, "provider" => provider.name().to_owned(), "outcome" => label).record(started.elapsed().as_secs_f64());
    tracing::debug!(key = %env.key, action_type = %env.intent.identity.action_type, workflow = %env.intent.identity.workflow_id, attempt = claim.attempt, outcome = label, "provider answered");
    let verdict = decide::verdict(outcome, claim.attempt, policy);
    Finished {
        delivery,
        env,
        attempt: claim.attempt,
        verdict,
    }
}

/// Commit finished calls in batches (compare-and-set), then publish and ack.
async fn commit_loop(ctx: Context, publisher: Publisher, mut rx: mpsc::Receiver<Finished>) {
    let max = ctx.config.worker.batch.max(1);
    let give_up = ctx
        .config
        .actions
        .values()
        .map(|p| p.lease)
        .min()
        .unwrap_or(Duration::from_secs(60));
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < max {
            match rx.try_recv() {
                Ok(f) => batch.push(f),
                Err(_) => break,
            }
        }
        let completions: Vec<Completion> = batch
            .iter()
            .map(|f| Completion {
                key: f.env.key.clone(),
                expected: Status::Executing,
                attempt: f.attempt,
                verdict: f.verdict.clone(),
                reason: reason(&f.verdict).into(),
            })
            .collect();
        let started = Instant::now();
        let aged = match retry::journal("complete", give_up, || {
            ctx.journal.complete_many_aged(&completions, &ctx.owner)
        })
        .await
        {
            Ok(a) => a,
            Err(e) => {
                // Leave the deliveries unacked: leases expire into unknown and the
                // reconciler asks the provider. Nothing is retried blindly.
                tracing::error!(error = %e, n = batch.len(), "cannot commit outcomes; leaving them to lease expiry and reconciliation");
                continue;
            }
        };
        metrics::histogram!(m::JOURNAL_STATEMENT_SECONDS, "statement" => "complete")
            .record(started.elapsed().as_secs_f64());
        crate::failpoint::hit("after_commit");
        let applied: Vec<bool> = aged.iter().map(Option::is_some).collect();
        for (f, age) in batch.iter().zip(&aged) {
            let status = f.verdict.status();
            if let Some(age) = age
                && status.is_terminal()
            {
                metrics::histogram!(m::TIME_TO_TERMINAL_SECONDS, "action_type" => f.env.intent.identity.action_type.as_str().to_owned(), "status" => status.as_str())
                    .record(*age);
            }
        }

        // A definitive answer that lost the race against the sweeper (executing → unknown)
        // is a late answer for the same attempt: accept it from unknown.
        let late: Vec<Completion> = completions
            .iter()
            .zip(&applied)
            .filter(|(c, ok)| {
                !**ok
                    && matches!(
                        c.verdict,
                        Verdict::Succeeded { .. } | Verdict::FailedFinal { .. }
                    )
            })
            .map(|(c, _)| Completion {
                expected: Status::Unknown,
                reason: "late_answer".into(),
                ..c.clone()
            })
            .collect();
        let late_applied: std::collections::HashSet<String> = if late.is_empty() {
            Default::default()
        } else {
            let flags = ctx
                .journal
                .complete_many(&late, &ctx.owner)
                .await
                .unwrap_or_else(|_| vec![false; late.len()]);
            late.iter()
                .zip(flags)
                .filter(|(_, ok)| *ok)
                .map(|(c, _)| c.key.as_str().to_owned())
                .collect()
        };

        let mut pending = Vec::new();
        for (f, ok) in batch.iter().zip(applied) {
            let status = f.verdict.status();
            let ok = ok || late_applied.contains(f.env.key.as_str());
            if !ok {
                tracing::warn!(key = %f.env.key, attempt = f.attempt, "completion refused: the operation moved on (stale attempt)");
                ack(&f.delivery).await;
                continue;
            }
            let action = f.env.intent.identity.action_type.as_str();
            metrics::counter!(m::TRANSITIONS, "action_type" => action.to_owned(), "status" => status.as_str()).increment(1);
            let (pid, err) = match &f.verdict {
                Verdict::Succeeded {
                    provider_operation_id,
                    ..
                } => (Some(provider_operation_id.as_str()), None),
                Verdict::FailedFinal { error_code }
                | Verdict::FailedRetryable { error_code, .. }
                | Verdict::Unknown { error_code, .. } => (None, Some(error_code.as_str())),
            };
            if status == Status::Unknown {
                // Unknown is written first (above); only now is the key handed over.
                send_to_reconcile(&ctx, &publisher, f).await;
            }
            if status != Status::FailedRetryable {
                let ev = OutcomeEvent {
                    schema: outcome::OUTCOME_SCHEMA,
                    idempotency_key: f.env.key.as_str(),
                    action_type: action,
                    status: status.as_str(),
                    attempt: f.attempt,
                    workflow_id: &f.env.intent.identity.workflow_id,
                    provider_operation_id: pid,
                    error_code: err,
                };
                if let Some(p) = outcome::publish(&publisher, &ctx.topology, &ev).await {
                    pending.push(p);
                }
            }
            ack(&f.delivery).await;
        }
        outcome::flush(pending).await;
    }
}

fn reason(v: &Verdict) -> &'static str {
    match v {
        Verdict::Succeeded { .. } => "provider_succeeded",
        Verdict::FailedFinal { .. } => "provider_rejected",
        Verdict::FailedRetryable { .. } => "provider_not_sent",
        Verdict::Unknown { .. } => "provider_unknown",
    }
}

async fn send_to_reconcile(ctx: &Context, publisher: &Publisher, f: &Finished) {
    let body = serde_json::json!({"idempotency_key": f.env.key.as_str(), "attempt": f.attempt})
        .to_string();
    let result = publisher
        .publish_confirmed(
            "",
            &ctx.topology.reconcile_queue(),
            body.as_bytes(),
            true,
            None,
        )
        .await;
    let label = if result.is_ok() {
        "confirmed"
    } else {
        "failed"
    };
    metrics::counter!(m::PUBLISHES, "kind" => "reconcile", "result" => label).increment(1);
    if let Err(e) = result {
        // The sweeper finds unknowns with no reconcile activity; nothing is lost.
        tracing::warn!(key = %f.env.key, error = %e, "unknown not handed to the reconcile queue; the sweeper will find it");
    }
}

async fn ack(d: &Delivery) {
    match d.acker.ack(BasicAckOptions::default()).await {
        Ok(true) => {}
        Ok(false) => tracing::warn!(
            tag = d.delivery_tag,
            "ack refused: the delivery was already settled or its channel is gone"
        ),
        Err(e) => {
            tracing::warn!(tag = d.delivery_tag, error = %e, "ack failed; RabbitMQ will redeliver and the journal will dedupe")
        }
    }
}

async fn dead_letter(
    ctx: &Context,
    publisher: &Publisher,
    inc: Incoming,
    reason: &str,
    detail: &str,
) {
    metrics::counter!(m::INVALID_MESSAGES, "reason" => reason.to_owned()).increment(1);
    metrics::counter!(m::DELIVERIES, "action_type" => inc.action.to_string(), "verdict" => "invalid").increment(1);
    let queue = ctx.topology.action_queue(&inc.action);
    tracing::warn!(reason, detail, queue = %queue, bytes = inc.delivery.data.len(), "invalid message dead-lettered");
    let headers = oncely_core::publish::headers(&[
        (REJECT_REASON_HEADER, reason),
        (REJECT_DETAIL_HEADER, detail),
        ("x-oncely-source-queue", &queue),
    ]);
    match publisher
        .publish_confirmed(
            &ctx.topology.dead_exchange(),
            reason,
            &inc.delivery.data,
            true,
            Some(headers),
        )
        .await
    {
        Ok(()) => {
            metrics::counter!(m::PUBLISHES, "kind" => "dead_letter", "result" => "confirmed")
                .increment(1);
            ack(&inc.delivery).await;
        }
        Err(e) => {
            // Fall back to the broker's own dead-lettering (no reason header, not lost).
            tracing::warn!(error = %e, "dead-letter publish failed; rejecting to the queue's DLX");
            let _ = inc
                .delivery
                .acker
                .reject(BasicRejectOptions { requeue: false })
                .await;
        }
    }
}
