//! The action worker: consume, validate, claim in batches, call, commit, then ack.
//!
//! ```text
//! consumers (one channel per action queue, prefetch) ─▶ batch loop ─▶ claim (1 statement)
//!    ├─ invalid ─▶ dead-letter with a reason header, ack
//!    ├─ not claimed ─▶ decide from the journal (ack / conflict / requeue), nobody called
//!    └─ claimed ─▶ provider call (≤ max_in_flight) ─▶ commit loop: CAS (1 statement per
//!                  batch) ─▶ outcome events, unknown → reconcile queue ─▶ ack (one
//!                  `multiple` ack per channel for the batch where the tags allow)
//! ```
//! Acks come only after the commit, and each ack's `bool` is checked. Every settlement
//! goes through the session's ack ledger (`acks`), which knows which deliveries one
//! `multiple` ack may cover. A session ends
//! when the connection does; [`run`] supervises sessions and rebuilds them with backoff
//! until shutdown, so a broker restart is survived. Deliveries of a dead session are
//! never acked on a new one (their ackers belong to the old channel): RabbitMQ
//! redelivers them and the claim turns the repeats into acks without provider calls.
//!
//! Shutdown: consumers are cancelled, buffered deliveries are nacked back to the queue,
//! in-flight calls finish and commit (bounded by the provider timeout), outcomes are
//! flushed, the connection is closed. The steps that wait on the broker (cancel, close)
//! give up after [`oncely_core::amqp::STOP_TIMEOUT`] each.
//!
//! # Layout
//! One file per step of a delivery's life, and the ledger they settle through:
//! - `intake`: consumers to one stream, batches, decode and validate.
//! - `claim`: the batch claim and the provider calls it dispatches.
//! - `commit`: the compare-and-set commit of finished calls (on time, late or stale).
//! - `effects`: what the broker sees: ack, requeue, dead-letter, conflict, hand-off to
//!   the reconcile queue, outcome events.
//! - `acks`: the held deliveries per channel; acks (batched into `multiple` acks where
//!   that settles nothing else), nacks and rejects, written one at a time.

mod acks;
mod claim;
mod commit;
mod effects;
pub(crate) use effects::stopped;
mod intake;

use crate::broker::Session;
use crate::context::Context;
use crate::shutdown::Shutdown;
use oncely_core::amqp::STOP_TIMEOUT;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;

/// Run the worker until `shutdown`, reconnecting as needed.
pub async fn run(ctx: Context, shutdown: Shutdown) -> anyhow::Result<()> {
    ctx.flow.ensure_with_retry(&ctx.journal).await;
    crate::shutdown::supervise("worker", shutdown, |s| session(&ctx, s)).await
}

/// One connection's life. `Ok` on shutdown, `Err` when the connection is lost.
async fn session(ctx: &Context, mut shutdown: Shutdown) -> anyhow::Result<()> {
    let broker = Session::open(ctx).await?;
    let acks = Arc::new(acks::Acks::default());
    let (consumers, mut rx, mut ended) = intake::consume(ctx, &broker, &acks).await?;
    let w = &ctx.config.worker;
    let batch_max = w.batch.min(w.max_in_flight).max(1);
    let sem = Arc::new(Semaphore::new(w.max_in_flight));
    let (commit_tx, commit_rx) = mpsc::channel(w.max_in_flight * 2);
    let publisher = broker.publisher().clone();
    let committer = tokio::spawn(commit::commit_loop(
        ctx.clone(),
        publisher.clone(),
        acks.clone(),
        commit_rx,
    ));
    let lost = loop {
        tokio::select! {
            biased;
            _ = shutdown.wait() => break false,
            Some(action) = ended.recv() => {
                // Its queue was deleted or its channel closed: start the session again
                // (it declares the topology and consumes every queue anew).
                tracing::error!(action = %action, "the consumer of this action type ended; reconnecting");
                break true;
            }
            first = rx.recv() => {
                let Some(first) = first else { break true };
                let batch = intake::fill_batch(&mut rx, first, batch_max, w.linger).await;
                let valid = intake::validate(ctx, &publisher, &acks, batch).await;
                claim::claim_and_dispatch(ctx, &publisher, &acks, valid, &sem, &commit_tx).await;
            }
        }
    };
    // Stop intake, hand back what is buffered, let in-flight calls finish and commit.
    // Each step that waits on the broker is bounded (STOP_TIMEOUT): a broker that stops
    // answering must not keep the worker from stopping. Deliveries not handed back are
    // redelivered when the connection ends.
    tracing::debug!(lost, "worker session ending: stopping intake");
    if tokio::time::timeout(STOP_TIMEOUT, intake::stop(consumers, &acks, rx))
        .await
        .is_err()
    {
        tracing::warn!(
            timeout = ?STOP_TIMEOUT,
            "RabbitMQ did not answer the consumers' cancel in time; what this worker holds is redelivered when its connection ends"
        );
    }
    drain(ctx, &sem, commit_tx, committer).await;
    tracing::debug!("in-flight calls drained; closing the connection");
    broker.close(&ctx.owner, "worker stopping").await;
    tracing::debug!("worker session ended");
    if lost {
        Err(anyhow::anyhow!("connection to RabbitMQ lost"))
    } else {
        Ok(())
    }
}

/// Wait (bounded) for in-flight calls to finish and for their commits.
async fn drain(
    ctx: &Context,
    sem: &Semaphore,
    commit_tx: mpsc::Sender<commit::Finished>,
    committer: JoinHandle<()>,
) {
    let grace = ctx
        .config
        .providers
        .values()
        .map(|p| p.timeout())
        .max()
        .unwrap_or(Duration::from_secs(5))
        + Duration::from_secs(2);
    let all = u32::try_from(ctx.config.worker.max_in_flight).unwrap_or(u32::MAX);
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
}
