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
    if let Ok(p) = published {
        let _ = p.confirmed().await;
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

/// The sweeper's loop: one pass every `sweep_interval`, at once again while batches are
/// full. The provider lookups of stale unknowns run beside the passes, in `checks`, never
/// inside one: a slow provider must not hold back lease expiry or republishing. Aborting
/// the loop aborts them (a taken unknown is due again after `check_lease`).
async fn sweep_loop(ctx: Context, publisher: Publisher, mut shutdown: Shutdown) {
    let interval = ctx.config.reconciler.sweep_interval;
    let mut checks = StaleChecks::new(ctx.config.reconciler.concurrency);
    let mut totals = Totals::new(ctx.config.reconciler.totals_interval);
    let mut since = Bounds::new(ctx.config.reconciler.full_sweep_interval);
    loop {
        let full = match sweep_once(&ctx, &publisher, &mut checks, &mut totals, &mut since).await {
            Ok(full) => full,
            Err(e) => {
                tracing::warn!(error = %e, "sweep failed; trying again next interval");
                false
            }
        };
        if !full {
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = shutdown.wait() => return,
            }
        } else if shutdown.is_triggered() {
            return;
        }
    }
}

/// What the two busy scans of the next pass read ([`Since`]): expired leases, `planned`
/// rows to republish.
struct Bounds {
    leases: Since,
    planned: Since,
}

impl Bounds {
    fn new(full_every: std::time::Duration) -> Self {
        Self {
            leases: Since::new(full_every),
            planned: Since::new(full_every),
        }
    }
}

/// Stale unknowns being checked by the sweeper, at most `most` at once (beside the
/// reconcile queue's own `concurrency`).
struct StaleChecks {
    running: tokio::task::JoinSet<()>,
    most: usize,
}

impl StaleChecks {
    fn new(most: usize) -> Self {
        Self {
            running: tokio::task::JoinSet::new(),
            most,
        }
    }

    /// How many more checks may start now (finished ones are reaped first).
    fn room(&mut self) -> usize {
        while self.running.try_join_next().is_some() {}
        self.most.saturating_sub(self.running.len())
    }

    /// How many to take in one statement now: the room left, at most `batch`; `None`
    /// when there is no room.
    fn take_limit(&mut self, batch: i64) -> Option<i64> {
        let room = i64::try_from(self.room()).unwrap_or(i64::MAX).min(batch);
        (room > 0).then_some(room)
    }

    /// Take as many stale unknowns as there is room for (one statement) and start their
    /// checks. Returns whether the batch was full.
    async fn take_and_start(
        &mut self,
        ctx: &Context,
        publisher: &Publisher,
    ) -> anyhow::Result<bool> {
        let rc = &ctx.config.reconciler;
        let Some(room) = self.take_limit(rc.batch) else {
            return Ok(false);
        };
        let stale = ctx
            .journal
            .take_stale_unknowns(rc.stale_unknown_after, rc.check_lease, room)
            .await?;
        let full = stale.len() as i64 == rc.batch;
        for op in stale {
            self.start(ctx, publisher, op);
        }
        Ok(full)
    }

    /// Ask the provider about a taken unknown and decide, in the background.
    fn start(&mut self, ctx: &Context, publisher: &Publisher, op: Operation) {
        let (ctx, publisher) = (ctx.clone(), publisher.clone());
        self.running.spawn(async move {
            metrics::counter!(m::SWEEPER_ACTIONS, "action" => "unknown_rechecked").increment(1);
            if let Err(e) = check(&ctx, &publisher, &op).await {
                tracing::warn!(key = %op.key, error = %e, "re-check failed");
            }
        });
    }

    /// Take as many reviews due for a re-check as there is room for (one statement) and
    /// start their lookups. Returns whether the batch was full.
    async fn take_and_start_reviews(
        &mut self,
        ctx: &Context,
        publisher: &Publisher,
    ) -> anyhow::Result<bool> {
        let rc = &ctx.config.reconciler;
        let Some(room) = self.take_limit(rc.batch) else {
            return Ok(false);
        };
        let due = ctx.journal.take_due_reviews(rc.check_lease, room).await?;
        let full = due.len() as i64 == rc.batch;
        for review in due {
            let (ctx, publisher) = (ctx.clone(), publisher.clone());
            self.running.spawn(async move {
                metrics::counter!(m::SWEEPER_ACTIONS, "action" => "review_rechecked").increment(1);
                if let Err(e) = recheck_review(&ctx, &publisher, &review).await {
                    tracing::warn!(key = %review.op.key, error = %e, "review re-check failed; due again after the check lease");
                }
            });
        }
        Ok(full)
    }
}

/// Look a transient review's operation up again — only look up, never execute: settle
/// it on a definite answer (the review closes itself, `auto:lookup`, and the outcome is
/// published), look again after a growing delay, or stop and leave it to a person.
async fn recheck_review(
    ctx: &Context,
    publisher: &Publisher,
    due: &DueReview,
) -> anyhow::Result<()> {
    let (op, id) = (&due.op, due.review.id);
    let (_, provider, env) = match route(ctx, op) {
        Ok(routed) => routed,
        Err(why) => {
            ctx.journal
                .record_recheck(id, ("not_asked", Some(&why.to_string())), None)
                .await?;
            tracing::warn!(key = %op.key, reason = %why, "review re-check cannot ask the provider; left to a person");
            return Ok(());
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
            let seen = ("not_asked", Some("no_budget"));
            ctx.journal.record_recheck(id, seen, Some(due)).await?;
            return Ok(());
        }
    };
    let (answer, code) = lookup_seen(&remote);
    let code = code.map(str::to_owned);
    let seen = (answer, code.as_deref());
    match decide::recheck(remote) {
        Recheck::Settle(verdict, reason) => {
            let c = Completion {
                key: op.key.clone(),
                expected: Status::Unknown,
                attempt: op.attempt_count,
                verdict,
                reason: reason.into(),
            };
            if ctx
                .journal
                .settle_reviewed(id, seen, &c, &ctx.owner)
                .await?
            {
                tracing::info!(key = %op.key, action_type = %op.action_type, review = id, rechecks = due.review.rechecks, answer, "review closed by a lookup");
                settled(ctx, publisher, op, &c.verdict).await;
            }
        }
        Recheck::Again => {
            let next = recheck_delay(ctx, due.review.rechecks);
            ctx.journal.record_recheck(id, seen, Some(next)).await?;
        }
        Recheck::Stop(why) => {
            ctx.journal.record_recheck(id, seen, None).await?;
            tracing::warn!(key = %op.key, action_type = %op.action_type, review = id, why, "review re-check found what no lookup will change; left to a person");
        }
    }
    Ok(())
}

/// One sweep: expire leases, republish, take stale unknowns and start their checks
/// (without waiting for them), set the gauges. Returns whether any batch was full (more
/// work is waiting). About 70 lines: the expiry and republish passes stay inline until
/// the reconcile message and `publish`'s arguments get their types.
async fn sweep_once(
    ctx: &Context,
    publisher: &Publisher,
    checks: &mut StaleChecks,
    totals: &mut Totals,
    since: &mut Bounds,
) -> anyhow::Result<bool> {
    let rc = &ctx.config.reconciler;
    let mut full = false;

    let started = std::time::Instant::now();
    let window = since.leases.window(started);
    let expired = ctx
        .journal
        .expire_leases(rc.batch, &format!("sweeper:{}", ctx.owner), window)
        .await?;
    full |= expired.len() as i64 == rc.batch;
    since
        .leases
        .passed(started, window, (expired.len() as i64) < rc.batch);
    for e in &expired {
        metrics::counter!(m::SWEEPER_ACTIONS, "action" => "lease_expired").increment(1);
        metrics::counter!(m::TRANSITIONS, "action_type" => e.action_type.clone(), "status" => "unknown").increment(1);
        tracing::warn!(key = %e.key, action_type = %e.action_type, attempt = e.attempt, "lease expired while executing: now unknown, reconciling");
        let request = ReconcileRequest::new(&e.key, e.attempt);
        if let Err(err) = request.publish(publisher, &ctx.topology).await {
            tracing::warn!(key = %e.key, error = %err, "could not queue for reconcile; the sweeper re-checks stale unknowns");
        }
    }

    let started = std::time::Instant::now();
    let window = since.planned.window(started);
    let republish = ctx
        .journal
        .take_for_republish(rc.republish_after, rc.batch, window)
        .await?;
    full |= republish.taken as i64 == rc.batch;
    since
        .planned
        .passed(started, window, (republish.taken as i64) < rc.batch);
    crate::deferred::republish(ctx, publisher, &republish.operations).await;

    full |= checks.take_and_start(ctx, publisher).await?;
    full |= checks.take_and_start_reviews(ctx, publisher).await?;
    count_closed_reviews(ctx, publisher).await?;
    set_gauges(ctx, totals, since).await?;
    Ok(full)
}

/// Count the reviews closed since the last count, whoever closed them (a person, a
/// statement import, a late answer, a lookup): each is counted by exactly one reconciler.
/// A closing by a person (the CLI or the review desk, which talk to Postgres only) or by a
/// statement import published nothing, so the counting reconciler publishes the
/// operation's outcome now when it ended terminal (a `retry` decision publishes nothing:
/// the attempt it authorises will). The other closings were published by whoever settled
/// the operation. Like every outcome event this is a notification after the commit: a
/// reconciler killed between the count and the publish loses that one event, never the
/// decision (docs/reconcile.md, "The review desk").
async fn count_closed_reviews(ctx: &Context, publisher: &Publisher) -> anyhow::Result<()> {
    let mut unpublished = Vec::new();
    for closed in ctx
        .journal
        .count_closed_reviews(ctx.config.reconciler.batch)
        .await?
    {
        let reason = ReviewReason::parse(&closed.reason).label();
        match closed.resolution.strip_prefix("auto:") {
            Some(how) => metrics::counter!(m::REVIEWS_AUTO_CLOSED, "reason" => reason, "how" => how.to_owned()).increment(1),
            None => metrics::counter!(m::REVIEWS_RESOLVED, "reason" => reason, "resolution" => closed.resolution.clone()).increment(1),
        }
        if matches!(
            closed.resolution.as_str(),
            "succeeded" | "failed" | "auto:statement"
        ) {
            unpublished.push(closed.idempotency_key);
        }
    }
    for key in unpublished {
        let Ok(key) = IdempotencyKey::parse(&key) else {
            continue;
        };
        let Some(op) = ctx.journal.get_without_payload(&key).await? else {
            continue;
        };
        if op.status.is_terminal() {
            let ev = OutcomeEvent::decided(&op);
            outcome::publish_one(publisher, &ctx.config, &ctx.topology, &ev).await;
        }
    }
    Ok(())
}

/// The count of the terminal statuses for their gauges: it reads the whole journal
/// (seconds at tens of millions of operations), so it runs every `totals_interval`
/// (never when zero), beside the sweeps, never inside one — a pass must not wait for it.
struct Totals {
    every: std::time::Duration,
    due: Option<tokio::time::Instant>,
    running: Option<tokio::task::JoinHandle<()>>,
}

impl Totals {
    fn new(every: std::time::Duration) -> Self {
        Self {
            every,
            due: (!every.is_zero()).then(tokio::time::Instant::now),
            running: None,
        }
    }

    /// Start the count if it is due and the last one has ended.
    fn start_if_due(&mut self, ctx: &Context) {
        if self.running.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        self.running = None;
        let now = tokio::time::Instant::now();
        if self.due.is_none_or(|due| now < due) {
            return;
        }
        self.due = Some(now + self.every);
        let journal = ctx.journal.clone();
        self.running = Some(tokio::spawn(async move {
            let started = std::time::Instant::now();
            match journal.status_counts().await {
                Ok(counts) => {
                    set_status_gauges(counts, |s| s.is_terminal());
                    tracing::debug!(
                        seconds = started.elapsed().as_secs_f64(),
                        "counted the operations by status"
                    );
                }
                Err(e) => {
                    tracing::warn!(error = %e, "counting the operations by status failed; next interval")
                }
            }
        }));
    }
}

impl Drop for Totals {
    fn drop(&mut self) {
        if let Some(t) = self.running.take() {
            t.abort();
        }
    }
}

/// Set `oncely_operations{status}` of each status `which` picks from `counts`, 0 for one
/// that has no operations (absent from `counts`), or it would keep its last value.
fn set_status_gauges(counts: Vec<(String, i64)>, which: impl Fn(&Status) -> bool) {
    let counts: std::collections::HashMap<String, i64> = counts.into_iter().collect();
    for s in Status::ALL.iter().filter(|s| which(s)) {
        metrics::gauge!(m::OPERATIONS, "status" => s.as_str())
            .set(counts.get(s.as_str()).copied().unwrap_or(0) as f64);
    }
}

/// Per provider: the deferred backlog and its oldest's age, the rate in force and the
/// configured one, the pause left — what the dashboard's "Rate limits" row and the
/// alert "backlog will not drain" read.
async fn set_flow_gauges(ctx: &Context) -> anyhow::Result<()> {
    let mut backlog: std::collections::BTreeMap<&str, (i64, f64)> = ctx
        .flow
        .routes()
        .map(|(provider, _, _)| (provider, (0, 0.0)))
        .collect();
    for (action_type, n, age) in ctx.journal.deferred_backlog().await? {
        let provider = ctx
            .config
            .actions
            .get(&action_type)
            .map_or("", |p| p.provider.as_str());
        if let Some(entry) = backlog.get_mut(provider) {
            entry.0 += n;
            entry.1 = entry.1.max(age);
        }
    }
    for (provider, (n, age)) in backlog {
        metrics::gauge!(m::DEFERRED_BACKLOG, "provider" => provider.to_owned()).set(n as f64);
        metrics::gauge!(m::DEFERRED_OLDEST_AGE, "provider" => provider.to_owned()).set(age);
    }
    // Held for approval: every action type shows, at zero when none wait.
    let mut held: std::collections::BTreeMap<String, (i64, f64)> = ctx
        .config
        .actions
        .keys()
        .map(|a| (a.clone(), (0, 0.0)))
        .collect();
    for (action_type, n, age) in ctx.journal.held_backlog().await? {
        held.insert(action_type, (n, age));
    }
    for (action_type, (n, age)) in held {
        metrics::gauge!(m::HELD, "action_type" => action_type.clone()).set(n as f64);
        metrics::gauge!(m::HELD_OLDEST_AGE, "action_type" => action_type).set(age);
    }
    let now = chrono::Utc::now();
    for b in ctx.journal.budgets().await? {
        let p = b.provider.clone();
        match b.rate {
            Some(r) => metrics::gauge!(m::PROVIDER_RATE, "provider" => p.clone()).set(r),
            None => metrics::gauge!(m::PROVIDER_RATE, "provider" => p.clone()).set(f64::NAN),
        }
        metrics::gauge!(m::PROVIDER_RATE_CONFIGURED, "provider" => p.clone())
            .set(b.configured_rate.unwrap_or(f64::NAN));
        let paused = (b.paused_until - now).num_milliseconds().max(0) as f64 / 1000.0;
        metrics::gauge!(m::PROVIDER_PAUSED_SECONDS, "provider" => p).set(paused);
    }
    Ok(())
}

/// The backlog gauges. Every live status gets a value each sweep (0 too, or an emptied
/// status would keep its last one), counted on the live rows' own indexes, `planned` and
/// `executing` within the passes' windows ([`Since`]); the terminal statuses when
/// [`Totals`] says so.
async fn set_gauges(ctx: &Context, totals: &mut Totals, since: &Bounds) -> anyhow::Result<()> {
    let now = std::time::Instant::now();
    let planned = since
        .planned
        .window(now)
        .map(|w| w + ctx.config.reconciler.republish_after);
    let live = ctx
        .journal
        .live_status_counts(planned, since.leases.window(now))
        .await?;
    set_status_gauges(live, |s| !s.is_terminal());
    set_flow_gauges(ctx).await?;
    totals.start_if_due(ctx);
    let open = ctx.journal.open_reviews().await?;
    metrics::gauge!(m::REVIEWS_OPEN).set((open.for_person + open.for_lookup) as f64);
    metrics::gauge!(m::REVIEWS_WAITING, "waiting_on" => "person").set(open.for_person as f64);
    metrics::gauge!(m::REVIEWS_WAITING, "waiting_on" => "lookup").set(open.for_lookup as f64);
    metrics::gauge!(m::REVIEW_OLDEST_OPEN_SECONDS, "waiting_on" => "person")
        .set(open.oldest_for_person_secs);
    metrics::gauge!(m::REVIEW_OLDEST_OPEN_SECONDS, "waiting_on" => "lookup")
        .set(open.oldest_for_lookup_secs);
    Ok(())
}
