//! Claim and dispatch: one statement claims a whole batch, and each won claim becomes a
//! provider call on its own task, within `max_in_flight`.
//!
//! Before the claim, each provider's share of the batch asks the fleet's budget for slots
//! (one statement per provider, and none for a provider that is neither limited nor
//! pushing back: see `crate::flow`). A delivery with a slot is claimed and called when its
//! slot comes (at most a second away); one without is *deferred* by the same claim
//! statement — `deferred` in the journal with its due time, acked, republished by the
//! sweeper when due — so waiting for a slow provider holds no worker, no delivery and no
//! queue.
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
use crate::flow::Slot;
use crate::provider::{Call, Outcome};
use crate::retry;
use oncely_core::journal::{Claim, ClaimOutcome, ClaimRequest, JournalError, Operation};
use oncely_core::metrics as m;
use oncely_core::publish::Publisher;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

/// Approval rules hold no matter how an intent arrives: a delivery of an action type
/// with rules that one of them matches is recorded `awaiting_approval` before the claim
/// (`ON CONFLICT DO NOTHING`: an intent the SDK or the gateway recorded keeps its row, held
/// or approved). The claim then meets the held row and leaves it; an approval publishes
/// it. Costs nothing for action types without rules.
async fn hold_unrecorded(ctx: &Context, valid: &[Valid]) -> Result<(), JournalError> {
    if ctx.approvals.is_empty() {
        return Ok(());
    }
    let governed: Vec<&oncely_core::Envelope> = valid
        .iter()
        .map(|v| &v.env)
        .filter(|e| {
            ctx.approvals
                .governs(e.intent.identity.action_type.as_str())
        })
        .collect();
    if governed.is_empty() {
        return Ok(());
    }
    let controls = ctx
        .approvals
        .controls(&ctx.journal, &governed, &[], &ctx.owner)
        .await?;
    let (envs, controls): (Vec<oncely_core::Envelope>, Vec<_>) = governed
        .into_iter()
        .zip(controls)
        .filter(|(_, c)| c.hold.is_some())
        .map(|(e, c)| (e.clone(), c))
        .unzip();
    if !envs.is_empty() {
        ctx.journal
            .record_controlled(&envs, &controls, &ctx.owner)
            .await?;
    }
    Ok(())
}

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
    if let Err(e) = hold_unrecorded(ctx, &valid).await {
        tracing::error!(error = %e, n = valid.len(), "approval rules cannot be applied; deliveries go back to the queue");
        for v in &valid {
            acks.refuse(&v.inc.action, &v.inc.delivery, Refuse::Requeue)
                .await;
        }
        return;
    }
    let started = Instant::now();
    // Slots are offsets from the budget's statement: waiting from when it answered, not
    // from after the claim, keeps two workers' calls in the order their slots were given.
    let slots = plan(ctx, &valid).await;
    let planned_at = Instant::now();
    let slots = match slots {
        Ok(slots) => slots,
        Err(e) => {
            tracing::error!(error = %e, n = valid.len(), "the providers' budgets cannot be read; deliveries go back to the queue");
            for v in &valid {
                acks.refuse(&v.inc.action, &v.inc.delivery, Refuse::Requeue)
                    .await;
            }
            return;
        }
    };
    let outcomes = match claim_batch(ctx, &valid, &slots, started).await {
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
    // Won claims first: their leases are ticking. What was not claimed is settled after
    // (a conflict written, a publish confirmed, an ack), never before a call starts.
    let mut later = Vec::new();
    for ((v, outcome), slot) in valid.into_iter().zip(outcomes).zip(slots) {
        let claim = match outcome {
            ClaimOutcome::Claimed(claim) => claim,
            // In order: an earlier won claim of the same key is in flight by now.
            ClaimOutcome::NotClaimed { why, op } => match adopt(ctx, why, &op) {
                Some(claim) => {
                    tracing::warn!(key = %claim.key, attempt = claim.attempt, "a claim's answer was lost and the claim retried: this worker's own lease is taken up");
                    claim
                }
                None => {
                    later.push((v, ClaimOutcome::NotClaimed { why, op }));
                    continue;
                }
            },
            other => {
                later.push((v, other));
                continue;
            }
        };
        metrics::counter!(m::DELIVERIES, "action_type" => v.inc.action.to_string(), "verdict" => "claimed").increment(1);
        let at = match slot {
            Slot::Call(wait) => planned_at + wait,
            Slot::Defer(_) => planned_at,
        };
        dispatch(ctx, v, claim, at, permits.split(1), started, commit_tx);
    }
    // The permits of deliveries that make no call go back before they are settled.
    drop(permits);
    for (v, outcome) in later {
        match outcome {
            ClaimOutcome::Deferred { .. } => {
                let provider = provider_of(ctx, &v);
                effects::deferred(acks, &v, provider).await;
            }
            ClaimOutcome::NotClaimed { why, op } => {
                effects::not_claimed(ctx, publisher, acks, v, decide::disposition(why), &op).await
            }
            ClaimOutcome::Undecided | ClaimOutcome::Claimed(_) => {
                acks.refuse(&v.inc.action, &v.inc.delivery, Refuse::Requeue)
                    .await
            }
        }
    }
}

/// A live lease of this very process on a key none of its calls holds: the claim that
/// took it committed, but its answer was lost and the statement retried (the retry meets
/// the lease). Nobody can have called the provider under it, so this delivery takes it
/// up — before, it was acked as `in_flight`, the lease ran out into `unknown`, and an
/// action nobody sent went to the reconciler (and to a person, for providers without a
/// lookup). A key in [`Context::in_flight`] is a real duplicate: left alone.
fn adopt(ctx: &Context, why: oncely_core::journal::NotClaimed, op: &Operation) -> Option<Claim> {
    if why != oncely_core::journal::NotClaimed::LeaseLive
        || op.lease_owner.as_deref() != Some(ctx.owner.as_str())
    {
        return None;
    }
    let key = op.key.clone();
    if lock(&ctx.in_flight).contains(&key) {
        return None;
    }
    Some(Claim {
        key,
        attempt: op.attempt_count,
        // Not on the row as read here: counting none spends the attempt budget sooner,
        // never calls more often.
        throttled: 0,
        lease_until: op.lease_until?,
        first_attempt_at: op.first_attempt_at?,
    })
}

pub(super) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The provider a delivery's action type is routed to (checked before claiming).
fn provider_of<'c>(ctx: &'c Context, v: &Valid) -> &'c str {
    ctx.route(&v.env.intent.identity.action_type)
        .map_or("", |(p, _)| p.provider.as_str())
}

/// A slot for each delivery: each provider's share of the batch asks its budget once.
async fn plan(ctx: &Context, valid: &[Valid]) -> Result<Vec<Slot>, JournalError> {
    let mut by_provider: std::collections::BTreeMap<&str, Vec<usize>> = Default::default();
    for (i, v) in valid.iter().enumerate() {
        by_provider.entry(provider_of(ctx, v)).or_default().push(i);
    }
    let mut slots = vec![Slot::Call(Duration::ZERO); valid.len()];
    for (provider, indices) in by_provider {
        let planned = retry::journal("take_slots", Duration::from_secs(30), || {
            ctx.flow.plan(&ctx.journal, provider, indices.len())
        })
        .await?;
        for (i, slot) in indices.into_iter().zip(planned) {
            slots[i] = slot;
        }
    }
    Ok(slots)
}

/// The claim statement for a batch (retried through database trouble), one outcome per
/// delivery, in order; deliveries without a slot are deferred by it.
async fn claim_batch(
    ctx: &Context,
    valid: &[Valid],
    slots: &[Slot],
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
    let defer: Vec<Option<Duration>> = slots
        .iter()
        .map(|s| match s {
            Slot::Defer(due) => Some(*due),
            Slot::Call(_) => None,
        })
        .collect();
    metrics::histogram!(m::CLAIM_BATCH_SIZE).record(requests.len() as f64);
    let mut first = true;
    let outcomes = retry::journal("claim", Duration::from_secs(30), || {
        // Chaos and tests: the first answer is lost after the claim committed.
        let lose = std::mem::take(&mut first) && crate::failpoint::fires("claim_reply_lost");
        let (requests, defer) = (&requests, &defer);
        async move {
            let outcomes = ctx
                .journal
                .claim_or_defer(requests, defer, &ctx.owner)
                .await?;
            if lose {
                tracing::warn!(
                    "fail point claim_reply_lost: the claim committed, its answer is dropped"
                );
                return Err(JournalError::Unavailable(sqlx::Error::PoolTimedOut));
            }
            Ok(outcomes)
        }
    })
    .await;
    metrics::histogram!(m::JOURNAL_STATEMENT_SECONDS, "statement" => "claim")
        .record(started.elapsed().as_secs_f64());
    outcomes
}

/// Call the provider on a task of its own, at `at` (its slot in the provider's budget);
/// its permit (split from the batch's, so always there) is released when the call ends,
/// and the result goes to the commit loop.
fn dispatch(
    ctx: &Context,
    v: Valid,
    claim: Claim,
    at: Instant,
    permit: Option<OwnedSemaphorePermit>,
    claimed_at: Instant,
    commit_tx: &mpsc::Sender<Finished>,
) {
    lock(&ctx.in_flight).insert(claim.key.clone());
    let (ctx, tx) = (ctx.clone(), commit_tx.clone());
    tokio::spawn(async move {
        let wait = at.saturating_duration_since(Instant::now());
        if !wait.is_zero() {
            metrics::histogram!(m::SLOT_WAIT_SECONDS).record(wait.as_secs_f64());
            tokio::time::sleep_until(at.into()).await;
        }
        let finished = call(&ctx, v, claim, claimed_at).await;
        drop(permit);
        let _ = tx.send(finished).await;
    });
}

/// Call the provider for a won claim and classify the answer.
async fn call(ctx: &Context, v: Valid, claim: Claim, claimed_at: Instant) -> Finished {
    let Valid {
        inc,
        mut env,
        oversize,
    } = v;
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
    let outcome = if oversize {
        tracing::warn!(key = %env.key, action_type = %env.intent.identity.action_type, limit = ctx.config.worker.max_message_bytes, "the message is over worker.max_message_bytes; nothing was sent");
        Outcome::Rejected {
            code: "too_large".into(),
        }
    } else if let Err(v) = ctx.schemas.check(
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
        let (outcome, pushback) = provider
            .execute_with_pushback(Call {
                key: &env.key,
                action_type: env.intent.identity.action_type.as_str(),
                payload: &env.intent.payload,
                first_attempt_at: None,
            })
            .await;
        crate::failpoint::hit("after_provider");
        ctx.flow
            .observe(&ctx.journal, &policy.provider, &outcome, &pushback);
        let label = decide::outcome_label(&outcome);
        metrics::histogram!(m::PROVIDER_CALL_SECONDS, "provider" => provider.name().to_owned(), "outcome" => label).record(started.elapsed().as_secs_f64());
        tracing::debug!(key = %env.key, action_type = %env.intent.identity.action_type, workflow = %env.intent.identity.workflow_id, attempt = claim.attempt, outcome = label, "provider answered");
        outcome
    };
    Finished {
        verdict: decide::verdict(outcome, claim.attempt - claim.throttled, policy),
        inc,
        attempt: claim.attempt,
        env,
    }
}
