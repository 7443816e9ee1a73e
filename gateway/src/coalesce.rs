//! Group commit for the front door: requests that arrive together are recorded together.
//!
//! Why: an HTTP or MCP request carries one intent, and recording it alone costs one
//! Postgres statement, one commit (a WAL flush) and one publisher-confirm wait — the same
//! fixed cost the SDK's `enqueue_many` spreads over a whole batch. So requests are not
//! recorded one by one: each hands its intent to a [`Coalescer`], which sends what is
//! waiting as one batch (one `enqueue_many`: one record statement, one commit, the
//! confirms awaited together) and answers each request from its own slot of the result.
//!
//! There is no timer: a batch is what queued up while earlier batches were being recorded
//! (at most [`IN_FLIGHT`] at once, each of at most [`MAX_BATCH`]), so a lone request goes
//! out at once and a busy gateway fills its batches by itself. What a request is told is
//! exactly what it would be told alone: `record_many` reports a key repeated inside a
//! batch as a duplicate of its first occurrence, and a failure of the whole batch (the
//! journal unreachable) is every request's failure — none of them was recorded.

use std::future::Future;
use std::sync::Arc;
use tokio::sync::{Semaphore, mpsc, oneshot};

/// Most intents per batch.
pub const MAX_BATCH: usize = 256;
/// Batches being recorded at once; further requests queue up into the next batch.
pub const IN_FLIGHT: usize = 4;
/// Requests waiting for a batch before a sender waits (backpressure).
const QUEUE: usize = 4 * MAX_BATCH;

/// Hands items to a batch function and each answer back to its caller.
#[derive(Debug)]
pub struct Coalescer<In, Out> {
    tx: mpsc::Sender<(In, oneshot::Sender<Out>)>,
}

impl<In: Send + 'static, Out: Send + 'static> Coalescer<In, Out> {
    /// Start the batching task. `flush` gets a batch and must return one answer per
    /// item, in order; it runs at most `in_flight` times at once. The task ends when the
    /// coalescer is dropped (batches under way still finish).
    pub fn start<F, Fut>(in_flight: usize, max_batch: usize, flush: F) -> Self
    where
        F: Fn(Vec<In>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<Out>> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(batches(rx, in_flight.max(1), max_batch.max(1), flush));
        Self { tx }
    }

    /// Submit one item and wait for its answer; `None` when the batch it went into was
    /// lost (the flush panicked, or the runtime is shutting down).
    pub async fn submit(&self, item: In) -> Option<Out> {
        let (reply, answer) = oneshot::channel();
        self.tx.send((item, reply)).await.ok()?;
        answer.await.ok()
    }
}

async fn batches<In, Out, F, Fut>(
    mut rx: mpsc::Receiver<(In, oneshot::Sender<Out>)>,
    in_flight: usize,
    max_batch: usize,
    flush: F,
) where
    In: Send + 'static,
    Out: Send + 'static,
    F: Fn(Vec<In>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Vec<Out>> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(in_flight));
    while let Some(first) = rx.recv().await {
        // Wait for a free slot first: what queues up meanwhile joins this batch.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut batch = vec![first];
        while batch.len() < max_batch {
            match rx.try_recv() {
                Ok(item) => batch.push(item),
                Err(_) => break,
            }
        }
        let (items, replies): (Vec<In>, Vec<oneshot::Sender<Out>>) = batch.into_iter().unzip();
        let run = flush(items);
        tokio::spawn(async move {
            let answers = run.await;
            debug_assert_eq!(answers.len(), replies.len(), "one answer per item");
            for (answer, reply) in answers.into_iter().zip(replies) {
                // The caller may have gone (its request was dropped): nothing to tell.
                let _ = reply.send(answer);
            }
            drop(slot);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[tokio::test]
    async fn what_queues_up_behind_a_batch_goes_out_as_one_batch() {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let (open_tx, open_rx) = tokio::sync::watch::channel(false);
        let seen = sizes.clone();
        let c = Arc::new(Coalescer::start(1, 8, move |items: Vec<u32>| {
            seen.lock().expect("lock").push(items.len());
            let mut open = open_rx.clone();
            async move {
                // Hold every batch until the test opens the gate.
                let _ = open.wait_for(|o| *o).await;
                items.into_iter().map(|i| i * 10).collect()
            }
        }));
        // The first item goes out alone and holds the only slot.
        let first = tokio::spawn({
            let c = c.clone();
            async move { c.submit(1).await }
        });
        tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while sizes.lock().expect("lock").is_empty() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the first batch started");
        // Ten more queue up behind it (sent straight into the queue, so that all ten are
        // there before the gate opens): the next batches are 8 (the most) and 2.
        let rest: Vec<_> = (2..=11)
            .map(|i| {
                let (reply, answer) = oneshot::channel();
                c.tx.try_send((i, reply)).expect("room in the queue");
                (i, answer)
            })
            .collect();
        open_tx.send(true).expect("open");
        assert_eq!(first.await.expect("join"), Some(10));
        for (i, answer) in rest {
            assert_eq!(answer.await.ok(), Some(i * 10), "each gets its own answer");
        }
        assert_eq!(*sizes.lock().expect("lock"), [1, 8, 2]);
    }
}
