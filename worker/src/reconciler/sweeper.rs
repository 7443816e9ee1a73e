//! The sweeper, in every reconciler on a timer (see the parent module's docs): expired
//! leases → `unknown` → the reconcile queue; `planned` rows nobody claimed and due
//! retries → published again; stale unknowns and transient reviews → checked in the
//! background; closed reviews counted once across the fleet.

use super::gauges::{Totals, set_gauges};
use super::*;

/// The sweeper's loop: one pass every `sweep_interval`, at once again while batches are
/// full. The provider lookups of stale unknowns run beside the passes, in `checks`, never
/// inside one: a slow provider must not hold back lease expiry or republishing. Aborting
/// the loop aborts them (a taken unknown is due again after `check_lease`).
pub(super) async fn sweep_loop(ctx: Context, publisher: Publisher, mut shutdown: Shutdown) {
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
pub(super) struct Bounds {
    pub(super) leases: Since,
    pub(super) planned: Since,
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
    }
    // Published together and confirmed together (one confirm window), not one round trip
    // each: a sweep after a worker crash can expire a whole batch of leases at once.
    let published = futures_util::future::join_all(expired.iter().map(|e| async move {
        (
            e,
            ReconcileRequest::new(&e.key, e.attempt)
                .publish(publisher, &ctx.topology)
                .await,
        )
    }))
    .await;
    for (e, result) in published {
        let label = if result.is_ok() {
            "confirmed"
        } else {
            "failed"
        };
        metrics::counter!(m::PUBLISHES, "kind" => "reconcile", "result" => label).increment(1);
        if let Err(err) = result {
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
