//! Acks: every delivery of a session is settled through one ledger, so that the acks
//! of a commit batch travel as one `multiple` ack per channel instead of one frame each.
//!
//! Why: an ack is a frame the worker writes (an internal RPC, a task and a socket write
//! in lapin) and the broker reads and applies; a commit batch of 30 settles 30
//! deliveries. AMQP's `basic.ack` with `multiple` settles every unacknowledged delivery
//! of the channel up to a tag — *every* one, so it may only be sent when each held
//! delivery at or below that tag is being acked now. The ledger knows which those are:
//! it holds the tag of every delivery the session's consumers received and has not yet
//! settled, per channel (one channel per action queue).
//!
//! The rules that keep a `multiple` ack from settling a delivery it must not:
//! - a tag is held before its delivery is handed on (in the consumer's forwarding task,
//!   in tag order), so any delivery below a tag being acked is already in the ledger;
//! - the run of tags acked with one `multiple` ack stops below the lowest held tag that
//!   is not being acked now (a call still in flight, a delivery in a batch not yet
//!   claimed); the tags above it get single acks — an ack is never held back to wait;
//! - a tag leaves the ledger only after its frame was written (lapin resolves the
//!   promise when the frame is sent), and frames are written one at a time under one
//!   lock, so a `multiple` ack never overtakes the nack or reject of a tag below it, and
//!   two `multiple` acks never cross (the later one would name a tag already settled:
//!   a channel error).
//!
//! Deliveries of an ended session are never settled on a new one: the ledger is the
//! session's, and so are the channels its tags belong to.

use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicNackOptions, BasicRejectOptions};
use oncely_core::metrics as m;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

/// The session's ledger of held deliveries (see the module docs).
#[derive(Default)]
pub(super) struct Acks {
    /// Unsettled delivery tags per channel, named by the action queue's action type.
    held: Mutex<HashMap<Arc<str>, BTreeSet<u64>>>,
    /// Held while frames are written: settlements reach the wire one at a time.
    order: tokio::sync::Mutex<()>,
}

/// One ack frame: the delivery whose tag it names, and whether it settles the run below.
#[derive(Debug, PartialEq, Eq)]
struct Frame {
    tag: u64,
    multiple: bool,
}

/// How a delivery is handed back.
#[derive(Debug, Clone, Copy)]
pub(super) enum Refuse {
    /// Back to its queue (nack with requeue).
    Requeue,
    /// To the queue's own dead-lettering (reject, no requeue).
    DeadLetter,
}

impl Acks {
    /// Record a delivery as held: before it is handed on, in the order of its channel.
    pub(super) fn hold(&self, queue: &Arc<str>, tag: u64) {
        self.lock().entry(queue.clone()).or_default().insert(tag);
    }

    /// Ack one delivery.
    pub(super) async fn ack(&self, queue: &Arc<str>, d: &Delivery) {
        self.ack_all(&[(queue, d)]).await;
    }

    /// Ack deliveries (each at most once, all held): per channel one `multiple` ack for
    /// the run below the lowest held tag not among them, single acks above it.
    pub(super) async fn ack_all(&self, items: &[(&Arc<str>, &Delivery)]) {
        if items.is_empty() {
            return;
        }
        let mut by_queue: HashMap<&Arc<str>, Vec<&Delivery>> = HashMap::new();
        for (q, d) in items {
            by_queue.entry(*q).or_default().push(*d);
        }
        let _order = self.order.lock().await;
        for (queue, mut deliveries) in by_queue {
            deliveries.sort_by_key(|d| d.delivery_tag);
            let tags: Vec<u64> = deliveries.iter().map(|d| d.delivery_tag).collect();
            let frames = {
                let held = self.lock();
                plan(held.get(queue.as_ref()), &tags)
            };
            for f in frames {
                // Deliveries this frame settles: the run up to its tag (a `multiple`
                // frame is always the first), or itself.
                let n = if f.multiple {
                    tags.partition_point(|t| *t <= f.tag)
                } else {
                    1
                };
                metrics::histogram!(m::ACK_BATCH_SIZE).record(n as f64);
                // `plan` names only tags it was given; were that ever broken, this frame
                // is skipped (RabbitMQ redelivers what stays unacked when the channel
                // ends, and the journal dedupes) rather than killing the commit loop.
                let Some(d) = deliveries.iter().find(|d| d.delivery_tag == f.tag) else {
                    tracing::error!(
                        tag = f.tag,
                        multiple = f.multiple,
                        "an ack frame names no delivery of this batch; skipped (a bug: please report it)"
                    );
                    continue;
                };
                let result = d
                    .acker
                    .ack(BasicAckOptions {
                        multiple: f.multiple,
                    })
                    .await;
                match result {
                    Ok(true) => {}
                    Ok(false) => tracing::warn!(
                        tag = f.tag,
                        multiple = f.multiple,
                        "ack refused: the delivery was already settled or its channel is gone"
                    ),
                    Err(e) => {
                        tracing::warn!(tag = f.tag, multiple = f.multiple, error = %e, "ack failed; RabbitMQ will redeliver and the journal will dedupe")
                    }
                }
            }
            self.release(queue, &tags);
        }
    }

    /// Hand one delivery back (never `multiple`: only this delivery is refused).
    pub(super) async fn refuse(&self, queue: &Arc<str>, d: &Delivery, how: Refuse) {
        let _order = self.order.lock().await;
        let result = match how {
            Refuse::Requeue => {
                d.acker
                    .nack(BasicNackOptions {
                        requeue: true,
                        multiple: false,
                    })
                    .await
            }
            Refuse::DeadLetter => d.acker.reject(BasicRejectOptions { requeue: false }).await,
        };
        if let Err(e) = result {
            tracing::warn!(tag = d.delivery_tag, error = %e, ?how, "could not hand the delivery back; RabbitMQ redelivers it when the channel ends");
        }
        self.release(queue, &[d.delivery_tag]);
    }

    fn release(&self, queue: &Arc<str>, tags: &[u64]) {
        if let Some(held) = self.lock().get_mut(queue.as_ref()) {
            for t in tags {
                held.remove(t);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, BTreeSet<u64>>> {
        // A panic while holding this lock leaves the sets as they were: keep going.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The frames that ack `tags` (sorted, distinct) on a channel whose held tags are
/// `held`: one `multiple` frame for the tags below the lowest held tag not being acked
/// (when there are two or more), single frames for the rest.
fn plan(held: Option<&BTreeSet<u64>>, tags: &[u64]) -> Vec<Frame> {
    let lowest_other = held
        .into_iter()
        .flatten()
        .find(|t| tags.binary_search(t).is_err())
        .copied()
        .unwrap_or(u64::MAX);
    // Tags that are not held (never the case when every delivery went through `hold`)
    // are acked singly, and stop the run: a `multiple` ack must cover held tags only.
    let is_held = |t: &u64| held.is_some_and(|h| h.contains(t));
    let run = tags
        .iter()
        .take_while(|t| **t < lowest_other && is_held(t))
        .count();
    let mut frames = Vec::with_capacity(tags.len() - run + 1);
    match run {
        0 => {}
        1 => frames.push(Frame {
            tag: tags[0],
            multiple: false,
        }),
        n => frames.push(Frame {
            tag: tags[n - 1],
            multiple: true,
        }),
    }
    frames.extend(tags[run..].iter().map(|&tag| Frame {
        tag,
        multiple: false,
    }));
    frames
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn set(tags: &[u64]) -> BTreeSet<u64> {
        tags.iter().copied().collect()
    }

    fn single(tag: u64) -> Frame {
        Frame {
            tag,
            multiple: false,
        }
    }

    #[test]
    fn a_run_from_the_bottom_is_one_frame() {
        let held = set(&[3, 4, 5, 6, 9]);
        assert_eq!(
            plan(Some(&held), &[3, 4, 5]),
            [Frame {
                tag: 5,
                multiple: true
            }]
        );
    }

    #[test]
    fn tags_above_a_delivery_still_held_are_acked_singly() {
        // 4 is in flight: 3 alone below it, 5 and 9 above it.
        let held = set(&[3, 4, 5, 9]);
        assert_eq!(
            plan(Some(&held), &[3, 5, 9]),
            [single(3), single(5), single(9)]
        );
        let held = set(&[1, 2, 3, 4, 5, 9]);
        assert_eq!(
            plan(Some(&held), &[1, 2, 3, 5, 9]),
            [
                Frame {
                    tag: 3,
                    multiple: true
                },
                single(5),
                single(9)
            ]
        );
    }

    #[test]
    fn a_tag_not_held_is_never_inside_a_multiple_ack() {
        assert_eq!(plan(None, &[1, 2]), [single(1), single(2)]);
        let held = set(&[1, 3]);
        assert_eq!(
            plan(Some(&held), &[1, 2, 3]),
            [single(1), single(2), single(3)]
        );
    }

    /// Apply the frames as RabbitMQ does (a `multiple` ack settles every unsettled tag
    /// of the channel up to its tag; an ack of a tag not unsettled is a channel error).
    fn broker(mut unsettled: BTreeSet<u64>, frames: &[Frame]) -> Result<BTreeSet<u64>, u64> {
        for f in frames {
            if !unsettled.contains(&f.tag) {
                return Err(f.tag);
            }
            if f.multiple {
                unsettled.retain(|t| *t > f.tag);
            } else {
                unsettled.remove(&f.tag);
            }
        }
        Ok(unsettled)
    }

    proptest! {
        /// Whatever is held and whatever is acked: exactly the acked tags are settled,
        /// no frame names a settled tag, and a run from the bottom costs one frame.
        #[test]
        fn exactly_the_acked_deliveries_are_settled(
            held in proptest::collection::btree_set(1u64..64, 0..40),
            pick in proptest::collection::vec(any::<bool>(), 64),
        ) {
            let tags: Vec<u64> = held.iter().copied().filter(|t| pick[*t as usize]).collect();
            let frames = plan(Some(&held), &tags);
            let left = broker(held.clone(), &frames).map_err(|t| TestCaseError::fail(format!("frame names settled tag {t}")))?;
            let want: BTreeSet<u64> = held.iter().copied().filter(|t| !pick[*t as usize]).collect();
            prop_assert_eq!(left, want);
            let bottom = held.iter().take_while(|t| pick[**t as usize]).count();
            if bottom >= 2 {
                prop_assert_eq!(frames.len(), tags.len() - bottom + 1);
            } else {
                prop_assert_eq!(frames.len(), tags.len());
            }
        }
    }
}
