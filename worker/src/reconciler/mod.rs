//! The reconciler: settles `unknown` operations by asking the provider first, and the
//! sweeper that heals lost messages, dead workers and forgotten unknowns.
//!
//! A timeout is "result unknown", not "failed". For each unknown the reconciler *takes*
//! the operation (so no other reconciler decides it at the same time), looks it up at
//! the provider by key / business reference, and decides per the action's policy:
//!
//! | lookup says | decision |
//! | --- | --- |
//! | succeeded | `succeeded` with the provider's id |
//! | rejected | `failed_final` |
//! | pending, or the lookup failed | check again later (doubling delay); past `max_reconcile_checks` → review |
//! | absent | retry with the same key only if the policy is `reconcile_then_retry_if_absent` **and** (the provider honours keys and we are inside its key retention, measured from the first attempt, with a lease to spare, **or** its absence is authoritative); otherwise → review |
//! | lookup unsupported | review |
//!
//! Policy `reconcile_then_review` (payment orders) never goes back to execution without
//! a positive lookup or a person; policy `review` skips the lookup.
//!
//! A review opened for a transient reason (pending, lookup failing: see
//! [`oncely_core::review`]) is looked up again in the background with a doubling delay
//! (`recheck_delay` … `max_recheck_delay`), taken like an unknown so two reconcilers never
//! re-check it at once. A re-check only looks up: a definite answer settles the
//! operation (the review closes itself as `auto:lookup` and the outcome is published), an
//! absence or contradicting evidence leaves it to a person. Every lookup is appended to
//! the review's evidence.
//!
//! The sweeper runs in every reconciler on a timer, in `SKIP LOCKED` batches: expired
//! leases → `unknown` → reconcile queue; `planned` rows nobody claimed and due
//! `failed_retryable` rows → published again; unknowns with no check for a while →
//! taken and checked here, in background tasks beside the passes, so a slow provider
//! never delays lease expiry; transient reviews likewise. It also counts closed reviews
//! (once each, across the fleet) and sets the backlog and review gauges.

use crate::broker::Session;
use crate::context::Context;
use crate::decide::{self, Recheck};
use crate::outcome::{self, OutcomeEvent};
use crate::provider::{Call, Provider, Remote};
use crate::reconcile_request::ReconcileRequest;
use crate::shutdown::Shutdown;
use futures_util::StreamExt;
use lapin::options::BasicAckOptions;
use oncely_core::config::{ActionPolicy, OnUnknown};
use oncely_core::journal::sweep::Since;
use oncely_core::journal::{Completion, DueReview, NewReview, Operation, Verdict};
use oncely_core::metrics as m;
use oncely_core::publish::{PublishOptions, Publisher};
use oncely_core::review::{Evidence, ReviewClass, ReviewReason};
use oncely_core::{Envelope, IdempotencyKey, Status};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

mod gauges;
mod sweeper;

use sweeper::sweep_loop;

/// What one reconcile attempt decided (the metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Someone else has it, it is not due, or it was settled meanwhile.
    NotTaken,
    /// Found done at the provider.
    FoundSucceeded,
    /// Found rejected at the provider.
    FoundRejected,
    /// Proven absent and allowed: one more attempt with the same key.
    RetryAbsent,
    /// Pending or lookup failed: check again later.
    Deferred,
    /// A person must decide.
    Review,
    /// The decision lost a compare-and-set (the operation moved on meanwhile).
    Raced,
}

impl Decision {
    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            Decision::NotTaken => "not_taken",
            Decision::FoundSucceeded => "found_succeeded",
            Decision::FoundRejected => "found_rejected",
            Decision::RetryAbsent => "retry_absent",
            Decision::Deferred => "deferred",
            Decision::Review => "review",
            Decision::Raced => "raced",
        }
    }
}

/// Run a reconciler (with its sweeper) until `shutdown`, reconnecting as needed.
pub async fn run(ctx: Context, shutdown: Shutdown) -> anyhow::Result<()> {
    ctx.flow.ensure_with_retry(&ctx.journal).await;
    crate::shutdown::supervise("reconciler", shutdown, |s| session(&ctx, s)).await
}

async fn session(ctx: &Context, mut shutdown: Shutdown) -> anyhow::Result<()> {
    let broker = Session::open(ctx).await?;
    let publisher = broker.publisher().clone();
    let rc = &ctx.config.reconciler;
    let prefetch = u16::try_from(rc.concurrency).unwrap_or(u16::MAX);
    let (_channel, mut consumer) = broker
        .consume(&ctx.topology.reconcile_queue(), &ctx.owner, prefetch)
        .await?;
    tracing::info!(owner = %ctx.owner, "reconciler consuming");
    let sweeper = tokio::spawn(sweep_loop(ctx.clone(), publisher.clone(), shutdown.clone()));
    let deferred = tokio::spawn(crate::deferred::run(
        ctx.clone(),
        publisher.clone(),
        shutdown.clone(),
    ));
    let sem = Arc::new(Semaphore::new(rc.concurrency));
    let lost = loop {
        tokio::select! {
            biased;
            _ = shutdown.wait() => break false,
            d = consumer.next() => {
                let Some(Ok(delivery)) = d else { break true };
                let Ok(permit) = sem.clone().acquire_owned().await else { break false };
                let (ctx, publisher) = (ctx.clone(), publisher.clone());
                tokio::spawn(async move {
                    match ReconcileRequest::parse(&delivery.data) {
                        Ok(ReconcileRequest { idempotency_key: key, .. }) => {
                            if let Err(e) = reconcile(&ctx, &publisher, &key).await {
                                // Leave it: the sweeper re-checks unknowns that stay due.
                                tracing::warn!(key = %key, error = %e, "reconcile failed; the sweeper will retry");
                            }
                        }
                        Err(_) => tracing::warn!(bytes = delivery.data.len(), "unreadable reconcile message dropped"),
                    }
                    let _ = delivery.acker.ack(BasicAckOptions::default()).await;
                    drop(permit);
                });
            }
        }
    };
    sweeper.abort();
    deferred.abort();
    let all = u32::try_from(rc.concurrency).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(rc.check_lease, sem.acquire_many(all)).await;
    broker.close(&ctx.owner, "reconciler stopping").await;
    if lost {
        Err(anyhow::anyhow!("connection to RabbitMQ lost"))
    } else {
        Ok(())
    }
}

/// Check one operation, if it is an unknown that is due and ours to take.
pub async fn reconcile(
    ctx: &Context,
    publisher: &Publisher,
    key: &IdempotencyKey,
) -> anyhow::Result<Decision> {
    let rc = &ctx.config.reconciler;
    let Some(op) = ctx.journal.take_unknown(key, rc.check_lease).await? else {
        return Ok(Decision::NotTaken);
    };
    check(ctx, publisher, &op).await
}

/// Decide an unknown this reconciler has taken (asking the provider), and count it.
async fn check(ctx: &Context, publisher: &Publisher, op: &Operation) -> anyhow::Result<Decision> {
    let decision = decide_one(ctx, publisher, op).await?;
    metrics::counter!(m::RECONCILE_DECISIONS, "action_type" => op.action_type.clone(), "decision" => decision.label()).increment(1);
    tracing::info!(key = %op.key, action_type = %op.action_type, workflow = %op.workflow_id, attempt = op.attempt_count, checks = op.reconcile_checks, decision = decision.label(), "reconciled");
    Ok(decision)
}

/// Ask the provider about one unknown and act on its answer (see the module docs for the
/// rules); anything that cannot be settled by a lookup goes to a person.
async fn decide_one(
    ctx: &Context,
    publisher: &Publisher,
    op: &Operation,
) -> anyhow::Result<Decision> {
    let (policy, provider, env) = match route(ctx, op) {
        Ok(routed) => routed,
        Err(why) => {
            let routed = oncely_core::ActionType::parse(&op.action_type)
                .ok()
                .and_then(|a| ctx.route(&a));
            let evidence = review_evidence(op, routed.map(|(p, v)| (p, v.as_ref())));
            return review(ctx, publisher, op, why, &evidence, None).await;
        }
    };
    let call = Call {
        key: &op.key,
        action_type: &op.action_type,
        payload: &env.intent.payload,
        first_attempt_at: op.first_attempt_at,
    };
    let remote = match lookup_in_budget(ctx, provider.as_ref(), call).await? {
        Ok(remote) => remote,
        Err(due) => {
            // No slot in the provider's budget: ask when there is one; not a spent check.
            ctx.journal
                .postpone_unknown(&op.key, op.attempt_count, due)
                .await?;
            return Ok(Decision::Deferred);
        }
    };
    let settle = |verdict: Verdict, reason: &str| Completion {
        key: op.key.clone(),
        expected: Status::Unknown,
        attempt: op.attempt_count,
        verdict,
        reason: reason.into(),
    };
    let evidence = review_evidence(op, Some((policy, provider.as_ref())));
    match remote {
        Remote::Succeeded {
            provider_operation_id,
            result,
        } => {
            let verdict = Verdict::Succeeded {
                provider_operation_id,
                result,
            };
            let c = settle(verdict, "reconcile_found_succeeded");
            commit(ctx, publisher, op, c, Decision::FoundSucceeded).await
        }
        Remote::Rejected { code } => {
            let verdict = Verdict::FailedFinal { error_code: code };
            let c = settle(verdict, "reconcile_found_rejected");
            commit(ctx, publisher, op, c, Decision::FoundRejected).await
        }
        Remote::Pending => {
            let why = ReviewReason::StillPending;
            recheck_later(ctx, publisher, op, policy, why, &evidence, &remote).await
        }
        Remote::Failed { ref code } => {
            let why = ReviewReason::lookup_failed(code);
            recheck_later(ctx, publisher, op, policy, why, &evidence, &remote).await
        }
        Remote::Unsupported => {
            let why = ReviewReason::LookupUnsupported;
            review(ctx, publisher, op, why, &evidence, Some(&remote)).await
        }
        Remote::Absent => {
            let caps = provider.capabilities();
            if let Err(why) =
                decide::absent_retry_allowed(policy, &caps, op.first_attempt_at, op.read_at)
            {
                let why = ReviewReason::parse(why);
                return review(ctx, publisher, op, why, &evidence, Some(&remote)).await;
            }
            let verdict = Verdict::FailedRetryable {
                error_code: "reconcile_absent".into(),
                retry_in: Duration::ZERO,
            };
            let c = settle(verdict, "reconcile_absent_retry");
            let d = commit(ctx, publisher, op, c, Decision::RetryAbsent).await?;
            if d == Decision::RetryAbsent {
                republish_now(ctx, publisher, op, &env).await;
            }
            Ok(d)
        }
    }
}

/// A lookup within the provider's budget (lookups spend the same budget as executes,
/// docs/providers.md "Rate limits"): `Err(due)` when the budget has no slot for it within
/// the horizon (ask again then), else the answer, after waiting for its slot. A `429` to
/// the lookup is reported as pushback like an execute's.
async fn lookup_in_budget(
    ctx: &Context,
    provider: &dyn Provider,
    call: Call<'_>,
) -> anyhow::Result<Result<Remote, Duration>> {
    match ctx
        .flow
        .plan(&ctx.journal, provider.name(), 1)
        .await?
        .first()
    {
        Some(crate::flow::Slot::Defer(due)) => return Ok(Err(*due)),
        Some(crate::flow::Slot::Call(wait)) if !wait.is_zero() => tokio::time::sleep(*wait).await,
        _ => {}
    }
    let remote = provider.lookup(call).await;
    ctx.flow
        .observe_lookup(&ctx.journal, provider.name(), &remote);
    Ok(Ok(remote))
}

/// The policy, provider and envelope an unknown needs before anyone is asked; the review
/// reason when one is missing (or the policy sends every unknown to a person).
fn route<'c>(
    ctx: &'c Context,
    op: &Operation,
) -> Result<(&'c ActionPolicy, &'c Arc<dyn Provider>, Envelope), ReviewReason> {
    let action = oncely_core::ActionType::parse(&op.action_type)
        .map_err(|_| ReviewReason::InvalidActionType)?;
    let (policy, provider) = ctx
        .route(&action)
        .ok_or(ReviewReason::NoPolicyForActionType)?;
    if policy.on_unknown == OnUnknown::Review {
        return Err(ReviewReason::PolicyRequiresReview);
    }
    let env = ctx.journal.envelope_of(op).map_err(|e| {
        tracing::error!(key = %op.key, error = %e, "the payload cannot be had; a person decides");
        ReviewReason::parse(e.reason())
    })?;
    Ok((policy, provider, env))
}

/// The provider could not say yet: check again after a backoff, or ask a person once the
/// policy's checks are used up (a transient reason: the review keeps being re-checked).
async fn recheck_later(
    ctx: &Context,
    publisher: &Publisher,
    op: &Operation,
    policy: &ActionPolicy,
    why: ReviewReason,
    evidence: &Evidence,
    remote: &Remote,
) -> anyhow::Result<Decision> {
    if op.reconcile_checks >= policy.max_reconcile_checks {
        return review(ctx, publisher, op, why, evidence, Some(remote)).await;
    }
    let delay = recheck_delay(ctx, op.reconcile_checks);
    ctx.journal
        .defer_unknown(&op.key, op.attempt_count, delay)
        .await?;
    Ok(Decision::Deferred)
}

/// The wait before check `n + 1`: `recheck_delay` doubling, at most `max_recheck_delay`.
fn recheck_delay(ctx: &Context, n: i32) -> Duration {
    let rc = &ctx.config.reconciler;
    decide::retry_delay(rc.recheck_delay, n).min(rc.max_recheck_delay)
}

/// Publish an absent operation's retry now rather than at the next sweep (best effort:
/// the sweeper republishes due retries anyway).
async fn republish_now(ctx: &Context, publisher: &Publisher, op: &Operation, env: &Envelope) {
    let published = publisher
        .publish(
            &ctx.topology.actions_exchange(),
            &op.action_type,
            &env.to_bytes(),
            PublishOptions::mandatory().with_message_id(op.key.as_str()),
        )
        .await;
    let confirmed = match published {
        Ok(p) => p.confirmed().await,
        Err(e) => Err(e),
    };
    let label = if confirmed.is_ok() {
        "confirmed"
    } else {
        "failed"
    };
    metrics::counter!(m::PUBLISHES, "kind" => "republish", "result" => label).increment(1);
    if let Err(e) = confirmed {
        // Not lost: the row is due, and the sweeper republishes due retries.
        tracing::warn!(key = %op.key, error = %e, "the retry was not republished now; the sweeper will");
    }
}

async fn commit(
    ctx: &Context,
    publisher: &Publisher,
    op: &Operation,
    c: Completion,
    decision: Decision,
) -> anyhow::Result<Decision> {
    if !ctx.journal.complete(&c, &ctx.owner).await? {
        return Ok(Decision::Raced);
    }
    settled(ctx, publisher, op, &c.verdict).await;
    Ok(decision)
}

/// After a settlement committed: count it and publish the outcome of a terminal status.
async fn settled(ctx: &Context, publisher: &Publisher, op: &Operation, verdict: &Verdict) {
    let status = verdict.status();
    metrics::counter!(m::TRANSITIONS, "action_type" => op.action_type.clone(), "status" => status.as_str()).increment(1);
    if status.is_terminal() {
        let secs = (op.read_at - op.created_at).num_milliseconds() as f64 / 1000.0;
        metrics::histogram!(m::TIME_TO_TERMINAL_SECONDS, "action_type" => op.action_type.clone(), "status" => status.as_str()).record(secs.max(0.0));
        let ev = OutcomeEvent::for_operation(op, verdict);
        outcome::publish_one(publisher, &ctx.config, &ctx.topology, &ev).await;
    }
}

/// What a review records about the operation and, when known, the policy and provider
/// that sent it to review.
fn review_evidence(op: &Operation, routed: Option<(&ActionPolicy, &dyn Provider)>) -> Evidence {
    let bare = Evidence {
        attempts: op.attempt_count,
        checks_before_review: op.reconcile_checks,
        ..Evidence::default()
    };
    let Some((policy, provider)) = routed else {
        return bare;
    };
    let caps = provider.capabilities();
    let on_unknown = serde_json::to_value(policy.on_unknown)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned));
    Evidence {
        policy: on_unknown,
        max_reconcile_checks: Some(policy.max_reconcile_checks),
        provider: Some(provider.name().to_owned()),
        honours_key: Some(caps.honours_key),
        key_retention_secs: caps.key_retention.map(|d| d.as_secs()),
        ..bare
    }
}

/// The lookup as a review's evidence records it: its label and its code (the provider's
/// id when found).
fn lookup_seen(remote: &Remote) -> (&'static str, Option<&str>) {
    let code = match remote {
        Remote::Succeeded {
            provider_operation_id,
            ..
        } => Some(provider_operation_id.as_str()),
        other => Some(other.code()).filter(|c| !c.is_empty()),
    };
    (remote.label(), code)
}

/// Open a review (a transient reason also gets its first background re-check) and
/// publish `review_opened`.
async fn review(
    ctx: &Context,
    publisher: &Publisher,
    op: &Operation,
    reason: ReviewReason,
    evidence: &Evidence,
    lookup: Option<&Remote>,
) -> anyhow::Result<Decision> {
    let class = reason.class();
    let new = NewReview {
        reason: &reason,
        evidence,
        lookup: lookup.map(lookup_seen),
        recheck_in: (class == ReviewClass::Transient).then(|| recheck_delay(ctx, 0)),
    };
    if ctx
        .journal
        .open_review(&op.key, op.attempt_count, &new, &ctx.owner)
        .await?
    {
        metrics::counter!(m::REVIEWS_OPENED, "action_type" => op.action_type.clone(), "reason" => reason.label()).increment(1);
        let reason = reason.to_string();
        tracing::warn!(key = %op.key, action_type = %op.action_type, workflow = %op.workflow_id, reason, class = class.as_str(), "review opened");
        let ev = OutcomeEvent::review_opened(op, &reason);
        outcome::publish_one(publisher, &ctx.config, &ctx.topology, &ev).await;
    }
    Ok(Decision::Review)
}
