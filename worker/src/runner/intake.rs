//! Intake: deliveries from every action queue into one stream, taken in batches, decoded
//! and validated before anything touches the journal.
//!
//! Why validation sits before the claim: a message that is not a valid envelope, was
//! routed to another action's queue, or names an action this fleet has no policy for can
//! never be executed, so it goes to the dead-letter queue with a reason (and is never
//! retried), instead of taking a lease or a provider call slot.

use super::acks::{Acks, Refuse};
use super::effects;
use crate::broker::Session;
use crate::context::Context;
use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::BasicCancelOptions;
use lapin::{Channel, Consumer};
use oncely_core::publish::Publisher;
use oncely_core::{ActionType, Envelope, KeyRing};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// A delivery and the action type of the queue it came from.
pub(super) struct Incoming {
    pub action: Arc<str>,
    pub delivery: Delivery,
}

/// A delivery whose envelope passed every check.
pub(super) struct Valid {
    pub inc: Incoming,
    pub env: Envelope,
    /// Over `worker.max_message_bytes`, but authentic: claimed and settled
    /// `failed_final` (`too_large`), never sent — so its journal row is closed instead of
    /// being republished by the sweeper and dead-lettered again forever.
    pub oversize: bool,
}

/// How large an over-limit message may be for the worker still to read its key and
/// settle its row (RabbitMQ already holds it in memory; beyond this it is only
/// dead-lettered).
const OVERSIZE_READ_LIMIT: usize = 16 * 1024 * 1024;

/// Why a delivery cannot be executed: the dead-letter reason header and its detail.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Invalid {
    pub reason: &'static str,
    pub detail: String,
}

/// The consumers of a session (channel and tag), to cancel at shutdown.
pub(super) struct Consumers(Vec<(Channel, String)>);

/// One consumer per action queue, all feeding one bounded stream; and a stream that
/// names each action type whose consumer ended (its queue deleted, its channel closed,
/// a `basic.cancel` from the broker) — the session must end then and start again, or that
/// action type would silently stop being consumed while the others go on.
pub(super) async fn consume(
    ctx: &Context,
    broker: &Session,
    acks: &Arc<Acks>,
) -> anyhow::Result<(
    Consumers,
    mpsc::Receiver<Incoming>,
    mpsc::Receiver<Arc<str>>,
)> {
    let prefetch = ctx.config.worker.prefetch;
    let (tx, rx) = mpsc::channel(usize::from(prefetch) * ctx.config.actions.len().max(1));
    let (ended_tx, ended_rx) = mpsc::channel(ctx.config.actions.len().max(1));
    let mut consumers = Vec::new();
    for action in ctx.action_types() {
        let tag = format!("{}#{action}", ctx.owner);
        let queue = ctx.topology.action_queue(action);
        let (ch, consumer) = broker.consume(&queue, &tag, prefetch).await?;
        let forwarding = forward(consumer, action.into(), acks.clone(), tx.clone());
        let ended = ended_tx.clone();
        tokio::spawn(async move {
            let action = forwarding.await;
            // Nobody listens once the session is ending: that is fine.
            let _ = ended.try_send(action);
        });
        consumers.push((ch, tag));
    }
    tracing::info!(owner = %ctx.owner, queues = consumers.len(), "worker consuming");
    Ok((Consumers(consumers), rx, ended_rx))
}

/// Forward one queue's deliveries until the consumer or the stream ends; each is held
/// in the ledger before it is handed on (in tag order, which `multiple` acks rely on).
/// Returns the action type, when it ends.
async fn forward(
    mut consumer: Consumer,
    action: Arc<str>,
    acks: Arc<Acks>,
    tx: mpsc::Sender<Incoming>,
) -> Arc<str> {
    while let Some(d) = consumer.next().await {
        match d {
            Ok(delivery) => {
                acks.hold(&action, delivery.delivery_tag);
                let inc = Incoming {
                    action: action.clone(),
                    delivery,
                };
                if tx.send(inc).await.is_err() {
                    break;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, queue = %action, "consumer stopped");
                break;
            }
        }
    }
    action
}

/// A batch that starts with `first`: what is already buffered, up to `max`, and, for a
/// non-zero `linger`, what arrives within `linger` of now. Returns early when the batch
/// is full or every sender is gone. The caller receives `first` itself, so that only
/// that wait races shutdown: once a batch has started it is always handed on whole.
pub(super) async fn fill_batch<T>(
    rx: &mut mpsc::Receiver<T>,
    first: T,
    max: usize,
    linger: Duration,
) -> Vec<T> {
    let mut batch = vec![first];
    take_buffered(rx, &mut batch, max);
    if linger.is_zero() || batch.len() >= max {
        return batch;
    }
    let deadline = tokio::time::Instant::now() + linger;
    while batch.len() < max {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(item)) => {
                batch.push(item);
                take_buffered(rx, &mut batch, max);
            }
            Ok(None) | Err(_) => break,
        }
    }
    batch
}

/// Move what `rx` already holds into `batch`, up to `max` items in all.
fn take_buffered<T>(rx: &mut mpsc::Receiver<T>, batch: &mut Vec<T>, max: usize) {
    while batch.len() < max {
        match rx.try_recv() {
            Ok(item) => batch.push(item),
            Err(_) => break,
        }
    }
}

/// Keep the valid deliveries; dead-letter the others.
pub(super) async fn validate(
    ctx: &Context,
    publisher: &Publisher,
    acks: &Acks,
    batch: Vec<Incoming>,
) -> Vec<Valid> {
    let max_bytes = ctx.config.worker.max_message_bytes;
    let known = |a: &ActionType| ctx.route(a).is_some();
    let mut valid = Vec::with_capacity(batch.len());
    for inc in batch {
        let checked = check(
            &inc.delivery.data,
            &inc.action,
            max_bytes,
            ctx.secret.as_ref(),
            known,
        );
        let checked = match checked {
            Err(why) if why.reason == "too_large" => check(
                &inc.delivery.data,
                &inc.action,
                OVERSIZE_READ_LIMIT,
                ctx.secret.as_ref(),
                known,
            )
            .map(|env| (env, true))
            .map_err(|_| why),
            other => other.map(|env| (env, false)),
        };
        match checked {
            Ok((env, oversize)) => valid.push(Valid { inc, env, oversize }),
            Err(why) => {
                effects::dead_letter(ctx, publisher, acks, inc, why.reason, &why.detail).await
            }
        }
    }
    valid
}

/// Decode and check one message from the queue of `queue_action`.
fn check(
    data: &[u8],
    queue_action: &str,
    max_bytes: usize,
    secret: Option<&KeyRing>,
    known: impl Fn(&ActionType) -> bool,
) -> Result<Envelope, Invalid> {
    let env = Envelope::parse(data, max_bytes, secret).map_err(|e| Invalid {
        reason: e.reason(),
        detail: e.to_string(),
    })?;
    let action = &env.intent.identity.action_type;
    if action.as_str() != queue_action {
        return Err(Invalid {
            reason: "action_type_mismatch",
            detail: "the envelope's action_type is not this queue's".into(),
        });
    }
    if !known(action) {
        return Err(Invalid {
            reason: "unknown_action_type",
            detail: "no policy for this action type".into(),
        });
    }
    Ok(env)
}

/// Cancel the consumers and hand every buffered delivery back to its queue.
pub(super) async fn stop(consumers: Consumers, acks: &Acks, mut rx: mpsc::Receiver<Incoming>) {
    for (ch, tag) in &consumers.0 {
        let cancelled = ch
            .basic_cancel(tag.as_str().into(), BasicCancelOptions::default())
            .await;
        tracing::debug!(tag, ok = cancelled.is_ok(), "consumer cancelled");
    }
    rx.close();
    let mut requeued = 0usize;
    while let Some(inc) = rx.recv().await {
        acks.refuse(&inc.action, &inc.delivery, Refuse::Requeue)
            .await;
        requeued += 1;
    }
    tracing::debug!(requeued, "buffered deliveries handed back");
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncely_core::Intent;
    use serde_json::json;

    fn secret() -> KeyRing {
        KeyRing::new(b"test-secret-do-not-use".to_vec()).expect("secret")
    }

    fn body(action: &str) -> Vec<u8> {
        Intent::from_json(json!({
            "action_type": action, "workflow_id": "w", "step": "s",
            "business_object": "o", "revision": 1, "payload": {"to": "a@example.test"}
        }))
        .expect("intent")
        .seal(&secret())
        .expect("seal")
        .to_bytes()
    }

    fn run(data: &[u8], queue: &str, known: bool) -> Result<Envelope, Invalid> {
        check(data, queue, 64 * 1024, Some(&secret()), |_| known)
    }

    #[test]
    fn a_valid_envelope_for_this_queue_passes() {
        let env = run(&body("email.send"), "email.send", true).expect("valid");
        assert_eq!(env.intent.identity.action_type.as_str(), "email.send");
    }

    #[test]
    fn each_refusal_carries_its_reason() {
        let reason = |r: Result<Envelope, Invalid>| r.err().map(|i| i.reason);
        assert_eq!(
            reason(run(&body("email.send"), "ticket.create", true)),
            Some("action_type_mismatch")
        );
        assert_eq!(
            reason(run(&body("email.send"), "email.send", false)),
            Some("unknown_action_type")
        );
        assert_eq!(
            reason(run(&vec![b'x'; 70 * 1024], "email.send", true)),
            Some("too_large")
        );
        assert!(reason(run(b"{not json", "email.send", true)).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_takes_what_is_buffered_then_lingers_for_more() {
        let (tx, mut rx) = mpsc::channel(16);
        for i in 1..=3 {
            tx.send(i).await.expect("send");
        }
        // No linger: what is buffered, capped at max.
        assert_eq!(fill_batch(&mut rx, 0, 3, Duration::ZERO).await, [0, 1, 2]);
        assert_eq!(fill_batch(&mut rx, 9, 8, Duration::ZERO).await, [9, 3]);
        // A linger waits for items that arrive within it, and no longer.
        let late = tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1)).await;
            late.send(4).await.expect("send");
            tokio::time::sleep(Duration::from_millis(10)).await;
            late.send(5).await.expect("send");
        });
        let start = tokio::time::Instant::now();
        let batch = fill_batch(&mut rx, 0, 8, Duration::from_millis(5)).await;
        assert_eq!(batch, [0, 4]);
        assert_eq!(start.elapsed(), Duration::from_millis(5));
        // A full batch does not wait.
        tx.send(6).await.expect("send");
        let start = tokio::time::Instant::now();
        assert_eq!(
            fill_batch(&mut rx, 0, 2, Duration::from_secs(1)).await,
            [0, 6]
        );
        assert_eq!(start.elapsed(), Duration::ZERO);
        // Senders gone: the batch ends at once.
        drop(tx);
        let start = tokio::time::Instant::now();
        assert_eq!(
            fill_batch(&mut rx, 0, 8, Duration::from_secs(1)).await,
            [0, 5]
        );
        assert!(start.elapsed() < Duration::from_secs(1));
    }
}
