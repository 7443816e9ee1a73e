//! The sweeper's deferred pass: every `reconciler.deferred_interval`, republish the
//! `deferred` operations that became due (a worker's claim then takes them, with a slot
//! of the provider's budget, or defers them again), and give up those deferred for
//! longer than their action type's `max_defer` (`failed_final`, `deferred_too_long`, an
//! outcome event — never sent).
//!
//! Why not in the sweep itself: the sweep runs every few seconds and a provider paced at
//! 50 requests a second must get its rows back as they come due, not in bursts one sweep
//! apart. The pass reads only due rows on the clocks index, so running it five times a
//! second costs next to nothing while nothing is deferred.
//!
//! Metered: a provider with a rate in force gets back no more rows than that rate allows
//! (a credit that grows at the rate, up to what the workers can take within their
//! horizon), the longest-due first. So a backlog of a million deferred rows for a slow
//! provider costs a pass the rows it hands back, never the backlog, and other providers'
//! rows are not held behind it. Several reconcilers each meter on their own: together they
//! may hand back more than the rate, and the surplus is deferred again by the workers'
//! claims (the budget, not this pass, is what keeps the provider within its limit).

use crate::context::Context;
use crate::outcome::{self, OutcomeEvent};
use crate::shutdown::Shutdown;
use oncely_core::Status;
use oncely_core::journal::Operation;
use oncely_core::metrics as m;
use oncely_core::publish::{PublishOptions, Publisher};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Per provider: how many rows may be handed back now.
#[derive(Debug)]
struct Credit {
    rows: f64,
    at: Instant,
}

/// Run the deferred pass until `shutdown`.
pub async fn run(ctx: Context, publisher: Publisher, mut shutdown: Shutdown) {
    let interval = ctx.config.reconciler.deferred_interval;
    let mut credits: BTreeMap<String, Credit> = BTreeMap::new();
    loop {
        let full = match pass(&ctx, &publisher, &mut credits).await {
            Ok(full) => full,
            Err(e) => {
                tracing::warn!(error = %e, "deferred pass failed; trying again next interval");
                false
            }
        };
        if shutdown.is_triggered() {
            return;
        }
        if !full {
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = shutdown.wait() => return,
            }
        }
    }
}

/// One pass: give up the rows out of patience, republish the due ones (metered per
/// provider). Returns whether a batch was full (more is due: go again at once).
async fn pass(
    ctx: &Context,
    publisher: &Publisher,
    credits: &mut BTreeMap<String, Credit>,
) -> anyhow::Result<bool> {
    let rc = &ctx.config.reconciler;
    let patience: Vec<(String, Duration)> = ctx
        .config
        .actions
        .iter()
        .map(|(t, p)| (t.clone(), p.max_defer))
        .collect();
    let default = oncely_core::config::ActionPolicy::new("").max_defer;
    let given_up = ctx
        .journal
        .give_up_deferred(
            &patience,
            default,
            rc.batch,
            &format!("sweeper:{}", ctx.owner),
        )
        .await?;
    let mut full = given_up.len() as i64 == rc.batch;
    for op in &given_up {
        give_up(ctx, publisher, op).await;
    }
    // Control before the send (docs/approvals.md): deadlines passed while waiting — not
    // started by `expires_at`, not approved by `approval_deadline`. Both read partial
    // indexes of the rows still waiting: nothing to do costs nothing.
    let actor = format!("sweeper:{}", ctx.owner);
    let expired = ctx.journal.expire_due(None, rc.batch, &actor).await?;
    let timed_out = ctx.journal.time_out_approvals(rc.batch, &actor).await?;
    full |= expired.len() as i64 == rc.batch || timed_out.len() as i64 == rc.batch;
    for op in expired.iter().chain(&timed_out) {
        crate::runner::stopped(ctx, publisher, op).await;
    }
    let rates: BTreeMap<String, Option<f64>> = ctx
        .journal
        .budgets()
        .await?
        .into_iter()
        .map(|b| (b.provider, b.rate))
        .collect();
    let lookahead = rc.deferred_interval + oncely_core::journal::budget::DEFAULT_HORIZON;
    for (provider, action_types, limit) in ctx.flow.routes() {
        if action_types.is_empty() {
            continue;
        }
        let rate = rates.get(provider).copied().flatten();
        let now = Instant::now();
        let credit = credits
            .entry(provider.to_owned())
            .or_insert(Credit { rows: 0.0, at: now });
        let take = match rate {
            Some(r) => {
                let burst = f64::from(limit.map_or(1, |l| l.burst));
                let cap = r * lookahead.as_secs_f64() + burst;
                credit.rows =
                    (credit.rows + r * now.duration_since(credit.at).as_secs_f64()).min(cap);
                credit.at = now;
                (credit.rows.floor() as i64).min(rc.batch)
            }
            None => rc.batch,
        };
        if take < 1 {
            continue;
        }
        let due = ctx
            .journal
            .take_due_deferred(action_types, rc.republish_after, take)
            .await?;
        if rate.is_some() {
            credit.rows -= due.len() as f64;
        } else {
            full |= due.len() as i64 == rc.batch;
        }
        republish(ctx, publisher, &due).await;
    }
    Ok(full)
}

async fn give_up(ctx: &Context, publisher: &Publisher, op: &Operation) {
    metrics::counter!(m::DEFERRED_GIVEN_UP, "action_type" => op.action_type.clone()).increment(1);
    metrics::counter!(m::TRANSITIONS, "action_type" => op.action_type.clone(), "status" => "failed_final").increment(1);
    tracing::warn!(key = %op.key, action_type = %op.action_type, "deferred for longer than max_defer: failed_final (deferred_too_long), never sent");
    let ev = OutcomeEvent::decided(op);
    outcome::publish_one(publisher, &ctx.config, &ctx.topology, &ev).await;
}

/// Publish operations (`planned`, `failed_retryable`, `deferred` rows the sweeper took)
/// to their action queues, together, then wait for the confirms; each counted by what it
/// was. A failure is logged: the row is taken again after `republish_after`.
pub(crate) async fn republish(ctx: &Context, publisher: &Publisher, ops: &[Operation]) {
    let mut pending = Vec::with_capacity(ops.len());
    for op in ops {
        let env = match ctx.journal.envelope_of(op) {
            Ok(env) => env,
            Err(e) => {
                // Not unknown: no review can be opened from here; the operator adds the
                // data key back.
                metrics::counter!(m::SWEEPER_ACTIONS, "action" => "payload_unavailable")
                    .increment(1);
                tracing::error!(key = %op.key, status = %op.status, reason = e.reason(), error = %e, "cannot republish: the payload cannot be opened");
                continue;
            }
        };
        let label = match op.status {
            Status::Planned => "republished_planned",
            Status::Deferred => "republished_deferred",
            _ => "republished_retry",
        };
        metrics::counter!(m::SWEEPER_ACTIONS, "action" => label).increment(1);
        if op.status == Status::Deferred {
            // Due rows of a paced provider come back many a second: not one line each.
            tracing::debug!(key = %op.key, status = %op.status, "republishing");
        } else {
            tracing::info!(key = %op.key, status = %op.status, "republishing");
        }
        match publisher
            .publish(
                &ctx.topology.actions_exchange(),
                &op.action_type,
                &env.to_bytes(),
                PublishOptions::mandatory().with_message_id(op.key.as_str()),
            )
            .await
        {
            Ok(p) => pending.push((op.key.clone(), p)),
            Err(e) => {
                tracing::warn!(key = %op.key, error = %e, "republish failed; taken again after republish_after")
            }
        }
    }
    for (key, p) in pending {
        let result = p.confirmed().await;
        metrics::counter!(m::PUBLISHES, "kind" => "republish", "result" => if result.is_ok() { "confirmed" } else { "failed" }).increment(1);
        if let Err(e) = result {
            tracing::warn!(key = %key, error = %e, "republish not confirmed; taken again after republish_after");
        }
    }
}
