//! Effects: everything the broker sees of a delivery's fate — ack, requeue,
//! dead-letter, the conflict notice, the hand-off of an `unknown` to the reconcile
//! queue, outcome events.
//!
//! Why together: these are the only places a delivery's fate is decided, so the rules
//! "ack only after the journal says so" and "never drop a delivery unsettled" can be
//! read in one file (the frames themselves go through the session's ack ledger,
//! `acks`; a committed batch is acked there at once, by the commit loop). The journal
//! writes that decide *what* to do happen before these are called (claim, commit); the
//! conflict record is the one journal write made here, because it is part of refusing a
//! message, not of executing one.

use super::acks::{Acks, Refuse};
use super::commit::Finished;
use super::intake::{Incoming, Valid};
use crate::context::Context;
use crate::decide::Disposition;
use crate::outcome::{self, OutcomeEvent};
use crate::reconcile_request::ReconcileRequest;
use oncely_core::Status;
use oncely_core::journal::{Applied, Operation};
use oncely_core::metrics as m;
use oncely_core::publish::{Pending, PublishOptions, Publisher};
use oncely_core::topology::{REJECT_DETAIL_HEADER, REJECT_REASON_HEADER};

/// A delivery that was not claimed: settle it as the journal's row decides.
pub(super) async fn not_claimed(
    ctx: &Context,
    publisher: &Publisher,
    acks: &Acks,
    v: Valid,
    disposition: Disposition,
    op: &Operation,
) {
    let action = v.inc.action.to_string();
    match disposition {
        Disposition::Ack(verdict) => {
            metrics::counter!(m::DELIVERIES, "action_type" => action, "verdict" => verdict)
                .increment(1);
            tracing::debug!(key = %v.env.key, status = %op.status, verdict, "not claimed; acked without a provider call");
            acks.ack(&v.inc.action, &v.inc.delivery).await;
        }
        Disposition::Requeue => {
            metrics::counter!(m::DELIVERIES, "action_type" => action, "verdict" => "requeued")
                .increment(1);
            acks.refuse(&v.inc.action, &v.inc.delivery, Refuse::Requeue)
                .await;
        }
        Disposition::Conflict => conflict(ctx, publisher, acks, v, op).await,
        Disposition::Expire => {
            metrics::counter!(m::DELIVERIES, "action_type" => action, "verdict" => "expired")
                .increment(1);
            let keys = [v.env.key.as_str().to_owned()];
            match ctx.journal.expire_due(Some(&keys), 1, &ctx.owner).await {
                Ok(rows) => {
                    for op in &rows {
                        stopped(ctx, publisher, op).await;
                    }
                    acks.ack(&v.inc.action, &v.inc.delivery).await;
                }
                Err(e) => {
                    // The sweeper expires it all the same; deliver again meanwhile.
                    tracing::warn!(key = %v.env.key, error = %e, "could not expire; delivering again");
                    acks.refuse(&v.inc.action, &v.inc.delivery, Refuse::Requeue)
                        .await;
                }
            }
        }
    }
}

/// An operation stopped before it was sent (`expired`, `rejected`, `cancelled`): count
/// it, log it (no payload) and tell the agents.
pub(crate) async fn stopped(ctx: &Context, publisher: &Publisher, op: &Operation) {
    metrics::counter!(m::CONTROL_DECISIONS, "action_type" => op.action_type.clone(), "decision" => op.status.as_str()).increment(1);
    metrics::counter!(m::TRANSITIONS, "action_type" => op.action_type.clone(), "status" => op.status.as_str()).increment(1);
    tracing::info!(key = %op.key, action_type = %op.action_type, status = %op.status, reason = %op.last_reason, "stopped before it was sent");
    let ev = OutcomeEvent::decided(op);
    outcome::publish_one(publisher, &ctx.config, &ctx.topology, &ev).await;
}

/// A delivery deferred by its claim (no slot in the provider's budget): the journal holds
/// it with its due time, the sweeper republishes it then; ack.
pub(super) async fn deferred(acks: &Acks, v: &Valid, provider: &str) {
    let action = v.inc.action.to_string();
    metrics::counter!(m::DELIVERIES, "action_type" => action.clone(), "verdict" => "deferred")
        .increment(1);
    metrics::counter!(m::TRANSITIONS, "action_type" => action, "status" => "deferred").increment(1);
    metrics::counter!(m::DEFERRALS, "provider" => provider.to_owned(), "reason" => "no_budget")
        .increment(1);
    acks.ack(&v.inc.action, &v.inc.delivery).await;
}

/// Same key, another payload or action type: record the refusal, tell the agents, ack.
async fn conflict(ctx: &Context, publisher: &Publisher, acks: &Acks, v: Valid, op: &Operation) {
    metrics::counter!(m::DELIVERIES, "action_type" => v.inc.action.to_string(), "verdict" => "conflict").increment(1);
    tracing::warn!(key = %v.env.key, action_type = %v.inc.action, "conflicting payload for an existing key refused");
    if let Err(e) = ctx
        .journal
        .record_conflict(&v.env.key, &v.env.payload_hash, &ctx.owner)
        .await
    {
        tracing::warn!(key = %v.env.key, error = %e, "could not record the conflict");
    }
    let ev = OutcomeEvent::conflict(&v.env, op.attempt_count);
    outcome::publish_one(publisher, &ctx.config, &ctx.topology, &ev).await;
    acks.ack(&v.inc.action, &v.inc.delivery).await;
}

/// What follows a commit, decided from the verdict's status and what the row did.
#[derive(Debug, Clone, Copy, PartialEq)]
enum AfterCommit {
    /// The row had moved on: nothing to tell anyone; ack.
    Stale,
    /// The row changed.
    Applied {
        /// Accepted from `unknown` (the sweeper had moved the attempt on).
        late: bool,
        /// The operation's age, for the end-to-end histogram when terminal.
        age_secs: f64,
        /// `unknown`: hand the key to the reconcile queue (after the write, never before).
        reconcile: bool,
        /// Publish an outcome event (all but `failed_retryable` and `deferred`, which are
        /// not outcomes: the operation is still on its way).
        outcome: bool,
    },
}

fn after_commit(status: Status, applied: Applied) -> AfterCommit {
    let (late, age_secs) = match applied {
        Applied::Stale => return AfterCommit::Stale,
        Applied::OnTime { age_secs } => (false, age_secs),
        Applied::Late { age_secs } => (true, age_secs),
    };
    AfterCommit::Applied {
        late,
        age_secs,
        reconcile: status == Status::Unknown,
        outcome: !matches!(status, Status::FailedRetryable | Status::Deferred),
    }
}

/// Everything a committed call needs before its ack: metrics, hand-off, outcome event
/// (returned unconfirmed, to flush with the batch). The caller acks the batch at once.
pub(super) async fn settle(
    ctx: &Context,
    publisher: &Publisher,
    f: &Finished,
    applied: Applied,
) -> Option<Pending> {
    let status = f.verdict.status();
    let AfterCommit::Applied {
        late,
        age_secs,
        reconcile,
        outcome,
    } = after_commit(status, applied)
    else {
        tracing::warn!(key = %f.env.key, attempt = f.attempt, "completion refused: the operation moved on (stale attempt)");
        return None;
    };
    let action = f.env.intent.identity.action_type.as_str();
    if late {
        tracing::info!(key = %f.env.key, attempt = f.attempt, status = %status, "late answer accepted from unknown (same attempt)");
    }
    if status.is_terminal() {
        metrics::histogram!(m::TIME_TO_TERMINAL_SECONDS, "action_type" => action.to_owned(), "status" => status.as_str()).record(age_secs);
    }
    metrics::counter!(m::TRANSITIONS, "action_type" => action.to_owned(), "status" => status.as_str()).increment(1);
    if reconcile {
        hand_to_reconcile(ctx, publisher, f).await;
    }
    if outcome {
        let ev = OutcomeEvent::for_envelope(&f.env, f.attempt, &f.verdict);
        outcome::publish(publisher, &ctx.config, &ctx.topology, &ev).await
    } else {
        None
    }
}

/// Publish the key of an `unknown` (already written) to the reconcile queue.
async fn hand_to_reconcile(ctx: &Context, publisher: &Publisher, f: &Finished) {
    let result = ReconcileRequest::new(&f.env.key, f.attempt)
        .publish(publisher, &ctx.topology)
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

/// Publish an invalid message to the dead-letter exchange with its reason, then ack; if
/// that fails, reject it to the queue's own dead-lettering (no reason header, not lost).
pub(super) async fn dead_letter(
    ctx: &Context,
    publisher: &Publisher,
    acks: &Acks,
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
    let published = publisher
        .publish_confirmed(
            &ctx.topology.dead_exchange(),
            reason,
            &inc.delivery.data,
            PublishOptions::mandatory().with_headers(headers),
        )
        .await;
    match published {
        Ok(()) => {
            metrics::counter!(m::PUBLISHES, "kind" => "dead_letter", "result" => "confirmed")
                .increment(1);
            acks.ack(&inc.action, &inc.delivery).await;
        }
        Err(e) => {
            tracing::warn!(error = %e, "dead-letter publish failed; rejecting to the queue's DLX");
            acks.refuse(&inc.action, &inc.delivery, Refuse::DeadLetter)
                .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_follows_a_commit() {
        let on_time = Applied::OnTime { age_secs: 1.5 };
        let late = Applied::Late { age_secs: 2.0 };
        let applied = |late, age_secs, reconcile, outcome| AfterCommit::Applied {
            late,
            age_secs,
            reconcile,
            outcome,
        };
        let cases = [
            (Status::Succeeded, on_time, applied(false, 1.5, false, true)),
            (
                Status::FailedFinal,
                on_time,
                applied(false, 1.5, false, true),
            ),
            (Status::Unknown, on_time, applied(false, 1.5, true, true)),
            (
                Status::FailedRetryable,
                on_time,
                applied(false, 1.5, false, false),
            ),
            (Status::Deferred, on_time, applied(false, 1.5, false, false)),
            (Status::Succeeded, late, applied(true, 2.0, false, true)),
            (Status::Succeeded, Applied::Stale, AfterCommit::Stale),
            (Status::Unknown, Applied::Stale, AfterCommit::Stale),
        ];
        for (status, applied, want) in cases {
            assert_eq!(
                after_commit(status, applied),
                want,
                "{status:?} {applied:?}"
            );
        }
    }
}
