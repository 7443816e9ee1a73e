//! Claim and dispatch: one statement claims a whole batch, and each won claim becomes a
//! provider call on its own task, within `max_in_flight`.
//!
//! Why the permits are taken before the claim: a lease starts ticking when the claim
//! commits, so a claim must never wait for a call slot. A batch that cannot be claimed
//! (journal unavailable past the retry budget) goes back to the queue whole; deliveries
//! that were not claimed are settled without calling anyone (see `effects`).

use super::acks::{Acks, Refuse};
use super::commit::Finished;
use super::effects;
use super::intake::Valid;
use crate::context::Context;
use crate::decide;
use crate::provider::{Call, Outcome};
use crate::retry;
use oncely_core::journal::{Claim, ClaimOutcome, ClaimRequest, JournalError};
use oncely_core::metrics as m;
use oncely_core::publish::Publisher;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

/// Claim the valid deliveries of a batch and start a call for each won claim.
pub(super) async fn claim_and_dispatch(
    ctx: &Context,
    publisher: &Publisher,
    acks: &Acks,
    valid: Vec<Valid>,
    sem: &Arc<Semaphore>,
    commit_tx: &mpsc::Sender<Finished>,
) {
    if valid.is_empty() {
        return;
    }
    let Ok(mut permits) = sem.clone().acquire_many_owned(valid.len() as u32).await else {
        return;
    };
    let started = Instant::now();
    let outcomes = match claim_batch(ctx, &valid, started).await {
        Ok(o) => {
            crate::failpoint::hit("after_claim");
            o
        }
        Err(e) => {
            tracing::error!(error = %e, n = valid.len(), "claim failed; deliveries go back to the queue");
            for v in &valid {
                acks.refuse(&v.inc.action, &v.inc.delivery, Refuse::Requeue)
                    .await;
            }
            return;
        }
    };
    for (v, outcome) in valid.into_iter().zip(outcomes) {
        match outcome {
            ClaimOutcome::Claimed(claim) => {
                metrics::counter!(m::DELIVERIES, "action_type" => v.inc.action.to_string(), "verdict" => "claimed").increment(1);
                dispatch(ctx, v, claim, permits.split(1), started, commit_tx);
            }
            ClaimOutcome::NotClaimed { why, op } => {
                effects::not_claimed(ctx, publisher, acks, v, decide::disposition(why), &op).await
            }
            ClaimOutcome::Undecided => {
                acks.refuse(&v.inc.action, &v.inc.delivery, Refuse::Requeue)
                    .await
            }
        }
    }
}

/// The claim statement for a batch (retried through database trouble), one outcome per
/// delivery, in order.
async fn claim_batch(
    ctx: &Context,
    valid: &[Valid],
    started: Instant,
) -> Result<Vec<ClaimOutcome>, JournalError> {
    let requests: Vec<ClaimRequest<'_>> = valid
        .iter()
        .map(|v| ClaimRequest {
            envelope: &v.env,
            lease: ctx
                .route(&v.env.intent.identity.action_type)
                .map_or(Duration::from_secs(60), |(p, _)| p.lease),
        })
        .collect();
    metrics::histogram!(m::CLAIM_BATCH_SIZE).record(requests.len() as f64);
    let outcomes = retry::journal("claim", Duration::from_secs(30), || {
        ctx.journal.claim(&requests, &ctx.owner)
    })
    .await;
    metrics::histogram!(m::JOURNAL_STATEMENT_SECONDS, "statement" => "claim")
        .record(started.elapsed().as_secs_f64());
    outcomes
}

/// Call the provider on a task of its own; its permit (split from the batch's, so always
/// there) is released when the call ends,
/// and the result goes to the commit loop.
fn dispatch(
    ctx: &Context,
    v: Valid,
    claim: Claim,
    permit: Option<OwnedSemaphorePermit>,
    claimed_at: Instant,
    commit_tx: &mpsc::Sender<Finished>,
) {
    let (ctx, tx) = (ctx.clone(), commit_tx.clone());
    tokio::spawn(async move {
        let finished = call(&ctx, v, claim, claimed_at).await;
        drop(permit);
        let _ = tx.send(finished).await;
    });
}

/// Call the provider for a won claim and classify the answer.
async fn call(ctx: &Context, v: Valid, claim: Claim, claimed_at: Instant) -> Finished {
    let Valid { inc, mut env } = v;
    if env.key != claim.key {
        // The row was recorded under another secret of the key ring: the provider must
        // see the key of the first attempt.
        env.key = claim.key.clone();
    }
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
    let outcome = if let Err(v) = ctx.schemas.check(
        env.intent.identity.action_type.as_str(),
        &env.intent.payload,
    ) {
        // The payload never changes: no later attempt can do better. The path and the
        // keyword only — the message may quote the payload.
        tracing::warn!(key = %env.key, action_type = %env.intent.identity.action_type, path = %v.path, keyword = %v.keyword, "the payload does not match the action type's payload_schema; nothing was sent");
        Outcome::Rejected {
            code: "payload_schema".into(),
        }
    } else if claimed_at.elapsed() + timeout + Duration::from_secs(1) >= policy.lease {
        tracing::warn!(key = %env.key, attempt = claim.attempt, "lease too close to its end to call the provider; not sent");
        Outcome::NotSent {
            code: "lease_too_short".into(),
        }
    } else {
        let started = Instant::now();
        let outcome = provider
            .execute(Call {
                key: &env.key,
                action_type: env.intent.identity.action_type.as_str(),
                payload: &env.intent.payload,
                first_attempt_at: None,
            })
            .await;
        crate::failpoint::hit("after_provider");
        let label = decide::outcome_label(&outcome);
        metrics::histogram!(m::PROVIDER_CALL_SECONDS, "provider" => provider.name().to_owned(), "outcome" => label).record(started.elapsed().as_secs_f64());
        tracing::debug!(key = %env.key, action_type = %env.intent.identity.action_type, workflow = %env.intent.identity.workflow_id, attempt = claim.attempt, outcome = label, "provider answered");
        outcome
    };
    Finished {
        verdict: decide::verdict(outcome, claim.attempt, policy),
        inc,
        attempt: claim.attempt,
        env,
    }
}
