//! Commit: finished calls are written in batches with one compare-and-set statement, and
//! each delivery is then settled by what its row did (on time, late, or stale).
//!
//! Why a separate loop: commits batch across calls that finish at different times (one
//! fsync for many outcomes), and a call never waits for another's commit. The statement
//! is retried through database trouble for up to the shortest lease; past that the
//! deliveries are handed back to their queue (the claim turns the redelivery into an
//! ack, the lease expires into `unknown`, the reconciler asks the provider) — never
//! dropped to hold prefetch slots until the channel dies.

use super::acks::{Acks, Refuse};
use super::effects;
use super::intake::{self, Incoming};
use crate::context::Context;
use crate::outcome;
use crate::retry;
use futures_util::future::join_all;
use oncely_core::journal::{Completion, Verdict};
use oncely_core::metrics as m;
use oncely_core::publish::Publisher;
use oncely_core::{Envelope, Status};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// A provider call that finished and waits for its commit.
pub(super) struct Finished {
    pub inc: Incoming,
    pub env: Envelope,
    pub attempt: i32,
    pub verdict: Verdict,
}

impl Finished {
    /// The compare-and-set for this call: `executing` at its attempt (the journal also
    /// accepts a definitive answer late, from `unknown` at the same attempt).
    fn completion(&self) -> Completion {
        Completion {
            key: self.env.key.clone(),
            expected: Status::Executing,
            attempt: self.attempt,
            verdict: self.verdict.clone(),
            reason: reason(&self.verdict).into(),
        }
    }
}

/// Commit finished calls in batches until every sender is gone.
pub(super) async fn commit_loop(
    ctx: Context,
    publisher: Publisher,
    acks: Arc<Acks>,
    mut rx: mpsc::Receiver<Finished>,
) {
    let max = ctx.config.worker.batch.max(1);
    let give_up = ctx
        .config
        .actions
        .values()
        .map(|p| p.lease)
        .min()
        .unwrap_or(Duration::from_secs(60));
    let linger = ctx.config.worker.linger;
    while let Some(first) = rx.recv().await {
        let batch = intake::fill_batch(&mut rx, first, max, linger).await;
        commit_batch(&ctx, &publisher, &acks, batch, give_up).await;
    }
}

/// One statement for the batch, then settle each delivery, ack them together (one
/// `multiple` ack per channel where the tags allow), and flush the outcomes.
async fn commit_batch(
    ctx: &Context,
    publisher: &Publisher,
    acks: &Acks,
    batch: Vec<Finished>,
    give_up: Duration,
) {
    let completions: Vec<Completion> = batch.iter().map(Finished::completion).collect();
    let started = Instant::now();
    let mut first = true;
    let applied = match retry::journal("complete", give_up, || {
        // Chaos and tests: the first answer is lost after the completion committed.
        let lose = std::mem::take(&mut first) && crate::failpoint::fires("complete_reply_lost");
        let completions = &completions;
        async move {
            let applied = ctx
                .journal
                .complete_batch(completions, &ctx.owner)
                .await?;
            if lose {
                tracing::warn!("fail point complete_reply_lost: the completion committed, its answer is dropped");
                return Err(oncely_core::journal::JournalError::Unavailable(
                    sqlx::Error::PoolTimedOut,
                ));
            }
            Ok(applied)
        }
    })
    .await
    {
        Ok(a) => a,
        Err(e) => {
            tracing::error!(error = %e, n = batch.len(), "cannot commit outcomes; handing the deliveries back to the queue (leases expire into unknown, then reconciliation)");
            for f in &batch {
                acks.refuse(&f.inc.action, &f.inc.delivery, Refuse::Requeue)
                    .await;
            }
            return;
        }
    };
    metrics::histogram!(m::JOURNAL_STATEMENT_SECONDS, "statement" => "complete")
        .record(started.elapsed().as_secs_f64());
    // Committed (or refused as stale): these leases are settled. A batch that could not
    // be committed keeps its keys, so no redelivery can take up their leases.
    {
        let mut in_flight = super::claim::lock(&ctx.in_flight);
        for f in &batch {
            in_flight.remove(&f.env.key);
        }
    }
    crate::failpoint::hit("after_commit");
    // Settled together, not one after another: each outcome event's publish waits until
    // its frames are written (on lapin's I/O thread); started together, a batch's events
    // leave in a few writes instead of one write and two thread wake-ups each.
    let settled = batch
        .iter()
        .zip(applied)
        .map(|(f, applied)| effects::settle(ctx, publisher, f, applied));
    let pending: Vec<_> = join_all(settled).await.into_iter().flatten().collect();
    let delivered: Vec<_> = batch
        .iter()
        .map(|f| (&f.inc.action, &f.inc.delivery))
        .collect();
    acks.ack_all(&delivered).await;
    outcome::flush(pending).await;
}

/// The event reason of a worker's commit.
fn reason(v: &Verdict) -> &'static str {
    match v {
        Verdict::Succeeded { .. } => "provider_succeeded",
        Verdict::FailedFinal { .. } => "provider_rejected",
        Verdict::FailedRetryable { .. } => "provider_not_sent",
        Verdict::Deferred { .. } => "provider_throttled",
        Verdict::Unknown { .. } => "provider_unknown",
    }
}
