//! The workload: which intents a run submits, in which batches, and the producer task that
//! enqueues them through the SDK while the faults go on.
//!
//! Every intent is submitted once; a tenth are submitted again in a later batch (an agent
//! re-running a step), and a few carry another payload under an existing key — half through
//! the SDK, which must refuse them at recording, half published straight to the broker,
//! which the workers must refuse. The producer survives broker and Postgres faults by
//! reconnecting and retrying a batch, and notes per intent whether the journal holds it:
//! the checks hold the fleet to exactly the recorded intents.
//!
//! A deterministic twentieth of the intents ask for an `expires_at` a few seconds after
//! their first submission (`enqueue_many_asked`): under load and faults some are not
//! started by then and end `expired`, never sent; the others run. A repeat carries no
//! options (it answers where the first submission stands), a retried batch the same.

use super::ACTIONS;
use super::rng::Rng;
use crate::fleet::secret;
use oncely_core::config::Config;
use oncely_core::{DataKeys, Intent};
use oncely_producer::{Asked, Enqueued, Producer, ProducerError};
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Intents per `enqueue_many` call.
const BATCH: usize = 20;

/// Share of the intents that ask for an `expires_at`.
const EXPIRING_SHARE: f64 = 0.05;

/// The batch intent `i` is first submitted in.
pub(super) fn batch_of(i: usize) -> usize {
    i / BATCH
}

/// Whether the chaos fleet's approval rule (`control::RULE_WHEN`) holds intent `i`'s real
/// payload: the payment orders whose `amount_minor` (100 + i) ends in 00–09.
pub(super) fn held_by_rule(i: usize) -> bool {
    action_of(i) == 2 && (100 + i) % 100 < 10
}

/// Per intent: how long after its first submission it expires (`None`: it does not ask).
fn expiries(n: usize, rng: &mut Rng) -> Vec<Option<Duration>> {
    (0..n)
        .map(|_| {
            let expiring = rng.chance(EXPIRING_SHARE);
            let after = rng.secs(1.0, 5.0);
            expiring.then_some(after)
        })
        .collect()
}

/// Which of [`ACTIONS`] intent `i` goes to: 40 % emails, 30 % tickets, 30 % payment orders.
pub(super) fn action_of(i: usize) -> usize {
    match i % 10 {
        0..=3 => 0,
        4..=6 => 1,
        _ => 2,
    }
}

/// Intent `i` of run `run`; `variant` 0 is the real one, 1 the conflicting payload.
pub(super) fn intent(run: u64, i: usize, variant: u64) -> Intent {
    let (action, _) = ACTIONS[action_of(i)];
    let payload = match action_of(i) {
        0 => {
            json!({"to": format!("user{i}@example.test"), "subject": format!("chaos {run}"), "n": i, "variant": variant})
        }
        1 => {
            json!({"title": format!("chaos ticket {i}"), "queue": "support", "n": i, "variant": variant})
        }
        _ => {
            json!({"account_id": format!("acct-{}", i % 97), "amount_minor": 100 + i as u64 + variant * 7,
                    "currency": "EUR", "business_reference": format!("chaos-{run}-{i}")})
        }
    };
    Intent::from_json(json!({
        "action_type": action,
        "workflow_id": format!("chaos-{run}-{}", i / 50),
        "step": action.replace('.', "_"),
        "business_object": format!("object-{i}"),
        "revision": 1,
        "payload": payload,
    }))
    .unwrap_or_else(|e| panic!("chaos intent {i}: {e}"))
}

/// One submission of the producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Item {
    /// The intent, first time.
    Original(usize),
    /// The same intent again (an agent re-running).
    Repeat(usize),
    /// Same key, another payload, through the SDK: must be refused at recording.
    ConflictSdk(usize),
    /// Same key, another payload, published straight to the broker: the worker must refuse it.
    ConflictRaw(usize),
}

impl Item {
    /// The intent this submission carries for run `run`.
    fn intent(self, run: u64) -> Intent {
        match self {
            Item::Original(i) | Item::Repeat(i) => intent(run, i, 0),
            Item::ConflictSdk(i) | Item::ConflictRaw(i) => intent(run, i, 1),
        }
    }
}

/// Batches of submissions: every intent once, 10% repeated in a later batch, a few
/// conflicting payloads under existing keys.
pub(super) fn plan(n: usize, rng: &mut Rng) -> (Vec<Vec<Item>>, usize, usize) {
    let nb = n.div_ceil(BATCH);
    let mut batches: Vec<Vec<Item>> = (0..nb)
        .map(|b| {
            (b * BATCH..((b + 1) * BATCH).min(n))
                .map(Item::Original)
                .collect()
        })
        .collect();
    let mut order: Vec<usize> = (0..n).collect();
    rng.shuffle(&mut order);
    let repeats = n / 10;
    let conflicts = (n / 250).max(6);
    let spread = (nb / 4).max(2);
    let later = |i: usize, rng: &mut Rng, batches: &mut Vec<Vec<Item>>, item: Item| {
        let target = i / BATCH + 1 + rng.below(spread);
        while batches.len() <= target {
            batches.push(Vec::new());
        }
        batches[target].push(item);
    };
    for &i in &order[..repeats] {
        later(i, rng, &mut batches, Item::Repeat(i));
    }
    for (k, &i) in order[repeats..repeats + conflicts].iter().enumerate() {
        let item = if k % 2 == 0 {
            Item::ConflictSdk(i)
        } else {
            Item::ConflictRaw(i)
        };
        later(i, rng, &mut batches, item);
    }
    (batches, repeats, conflicts)
}

/// An intent's key and payload hash: what the journal must hold for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Sealed {
    /// The idempotency key.
    pub key: String,
    /// The payload hash of the real (variant 0) payload.
    pub payload_hash: String,
}

/// The workload of one run.
#[derive(Debug)]
pub(super) struct Workload {
    /// The submissions, batch by batch.
    pub batches: Vec<Vec<Item>>,
    /// Repeats planned.
    pub repeats: usize,
    /// Conflicting payloads planned.
    pub conflicts: usize,
    /// Per intent (by index): its key and payload hash.
    pub sealed: Vec<Sealed>,
    /// Per intent (by index): how long after its first submission it expires, if it asks.
    pub expiry: Vec<Option<Duration>>,
}

impl Workload {
    /// The workload of seed `seed` with `n` distinct intents.
    pub fn new(seed: u64, n: usize) -> anyhow::Result<Workload> {
        let mut plan_rng = Rng::new(seed ^ 0x5EED_0001);
        let (batches, repeats, conflicts) = plan(n, &mut plan_rng);
        let expiry = expiries(n, &mut Rng::new(seed ^ 0x5EED_0004));
        let sealed = (0..n)
            .map(|i| {
                let env = intent(seed, i, 0).seal(&secret())?;
                Ok(Sealed {
                    key: env.key.as_str().to_owned(),
                    payload_hash: env.payload_hash.as_str().to_owned(),
                })
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Workload {
            batches,
            repeats,
            conflicts,
            sealed,
            expiry,
        })
    }
}

/// What the producer did.
#[derive(Debug, Default)]
pub(super) struct ProducerReport {
    /// Per intent: recorded in the journal (enqueued, duplicate, or recorded but unpublished).
    pub recorded: Vec<bool>,
    /// `Enqueued` answers to first submissions.
    pub new: u64,
    /// `Duplicate` answers to first submissions (a retried batch whose first try recorded it).
    pub duplicate_after_retry: u64,
    /// Recorded, but the publish failed (left to the sweeper).
    pub publish_failed: u64,
    /// `enqueue_many` calls that failed as a whole.
    pub batch_errors: u64,
    /// `enqueue_many` calls that took longer than 20 s.
    pub timeouts: u64,
    /// New SDK connections after a fault.
    pub reconnects: u64,
    /// Repeats answered.
    pub repeats: u64,
    /// Repeats by the status the duplicate reported.
    pub repeat_status: BTreeMap<String, u64>,
    /// Conflicting payloads through the SDK.
    pub conflicts_sdk: u64,
    /// … of which refused at recording.
    pub conflicts_sdk_refused: u64,
    /// First submissions answered `awaiting_approval` (held by the approval rule).
    pub held: u64,
    /// First submissions that asked for an `expires_at`.
    pub expiring: u64,
    /// Conflicting payloads published raw.
    pub conflicts_raw: u64,
    /// … of which the broker confirmed.
    pub conflicts_raw_published: u64,
    /// Answers the producer should never give.
    pub anomalies: Vec<String>,
    /// Why the producer gave up, if it did.
    pub fatal: Option<String>,
    /// How long producing took.
    pub seconds: f64,
}

/// The producer gave up; its report's `fatal` says why.
#[derive(Debug)]
struct GaveUp;

/// What one answer of `enqueue_many` asks of the producer.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    /// Nothing: the item is accounted for.
    Done,
    /// Submit the item again.
    Again,
    /// Accounted for, but the connection is suspect: reconnect after the batch.
    Reconnect,
}

/// Connect the SDK, retrying for up to two minutes.
async fn connect_producer(
    config: &Config,
    data_keys: &Option<DataKeys>,
    report: &mut ProducerReport,
) -> Option<Producer> {
    let start = Instant::now();
    loop {
        let connect = Producer::connect_with_data_keys(config, secret(), data_keys.clone());
        match tokio::time::timeout(Duration::from_secs(15), connect).await {
            Ok(Ok(p)) => return Some(p),
            Ok(Err(e)) if start.elapsed() > Duration::from_secs(120) => {
                report.fatal = Some(format!("producer cannot connect: {e}"));
                return None;
            }
            Err(_) if start.elapsed() > Duration::from_secs(120) => {
                report.fatal = Some("producer connect timed out".into());
                return None;
            }
            _ => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// Enqueue the plan, paced over `span`, surviving connection faults.
pub(super) async fn produce(
    config: Config,
    data_keys: Option<DataKeys>,
    run: u64,
    workload: Arc<Workload>,
    span: Duration,
    progress: Arc<AtomicU64>,
) -> ProducerReport {
    let (batches, n) = (&workload.batches, workload.sealed.len());
    let mut report = ProducerReport {
        recorded: vec![false; n],
        ..ProducerReport::default()
    };
    let start = Instant::now();
    let pace = span.div_f64(batches.len().max(1) as f64);
    let Some(producer) = connect_producer(&config, &data_keys, &mut report).await else {
        return report;
    };
    let mut p = Producing {
        config,
        data_keys,
        run,
        producer,
        report,
        start,
        expiry: workload.expiry.clone(),
    };
    for (b, batch) in batches.iter().enumerate() {
        tokio::time::sleep_until((start + pace.mul_f64(b as f64)).into()).await;
        if p.batch(b, batch, &progress).await.is_err() {
            return p.report;
        }
    }
    p.report.seconds = start.elapsed().as_secs_f64();
    p.report
}

/// The producer task's state: its SDK connection and its tally.
#[derive(Debug)]
struct Producing {
    config: Config,
    /// The fleet's data keys (payloads sealed), if any.
    data_keys: Option<DataKeys>,
    run: u64,
    producer: Producer,
    report: ProducerReport,
    start: Instant,
    /// Per intent: how long after its first submission it expires, if it asks.
    expiry: Vec<Option<Duration>>,
}

impl Producing {
    /// One batch: its SDK submissions, then its raw conflicting payloads.
    async fn batch(
        &mut self,
        b: usize,
        batch: &[Item],
        progress: &AtomicU64,
    ) -> Result<(), GaveUp> {
        let todo: Vec<Item> = batch
            .iter()
            .copied()
            .filter(|it| !matches!(it, Item::ConflictRaw(_)))
            .collect();
        let reconnect = self.enqueue(b, todo).await?;
        progress.store(
            self.report.recorded.iter().filter(|r| **r).count() as u64,
            Ordering::Relaxed,
        );
        // Conflicting payloads straight to the broker, for keys recorded by now.
        for item in batch {
            if let Item::ConflictRaw(i) = *item {
                self.publish_conflict(i).await?;
            }
        }
        if reconnect {
            self.report.reconnects += 1;
            self.reconnect().await?;
        }
        Ok(())
    }

    /// Submit `todo` until every item has an answer. True if a publish failed.
    async fn enqueue(&mut self, b: usize, mut todo: Vec<Item>) -> Result<bool, GaveUp> {
        let mut reconnect = false;
        let mut tries = 0u32;
        // Fixed at the batch's first try: a retry asks the same.
        let now = chrono::Utc::now();
        let deadlines: HashMap<usize, chrono::DateTime<chrono::Utc>> = todo
            .iter()
            .filter_map(|it| match *it {
                Item::Original(i) => self.expiry[i].map(|d| (i, now + d)),
                _ => None,
            })
            .collect();
        self.report.expiring += deadlines.len() as u64;
        while !todo.is_empty() {
            tries += 1;
            if tries > 200 {
                self.report.fatal = Some(format!("batch {b} could not be enqueued in 200 tries"));
                self.report.seconds = self.start.elapsed().as_secs_f64();
                return Err(GaveUp);
            }
            let intents: Vec<Intent> = todo.iter().map(|it| it.intent(self.run)).collect();
            let asked: Vec<Asked> = todo
                .iter()
                .map(|it| match *it {
                    Item::Original(i) => Asked {
                        expires_at: deadlines.get(&i).copied(),
                        ..Asked::default()
                    },
                    _ => Asked::default(),
                })
                .collect();
            let results = match tokio::time::timeout(
                Duration::from_secs(20),
                self.producer.enqueue_many_asked(intents, &asked),
            )
            .await
            {
                Ok(Ok(r)) => r,
                Ok(Err(_)) => {
                    self.report.batch_errors += 1;
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    self.report.reconnects += 1;
                    self.reconnect().await?;
                    continue;
                }
                Err(_) => {
                    self.report.timeouts += 1;
                    self.report.reconnects += 1;
                    self.reconnect().await?;
                    continue;
                }
            };
            let mut again = Vec::new();
            for (item, result) in todo.iter().zip(results) {
                match self.answer(*item, result) {
                    Next::Done => {}
                    Next::Again => again.push(*item),
                    Next::Reconnect => reconnect = true,
                }
            }
            todo = again;
            if !todo.is_empty() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        Ok(reconnect)
    }

    /// Account for one answer.
    fn answer(&mut self, item: Item, result: Result<Enqueued, ProducerError>) -> Next {
        let r = &mut self.report;
        match (item, result) {
            (Item::Original(i), Ok(Enqueued::Enqueued { status, .. })) => {
                r.new += 1;
                r.recorded[i] = true;
                if status == oncely_core::Status::AwaitingApproval {
                    r.held += 1;
                }
            }
            (Item::Original(i), Ok(Enqueued::Duplicate { .. })) => {
                // A retried batch whose first try recorded it.
                r.duplicate_after_retry += 1;
                r.recorded[i] = true;
            }
            (Item::Original(i), Err(ProducerError::Publish(_))) => {
                r.publish_failed += 1;
                r.recorded[i] = true;
                return Next::Reconnect;
            }
            (Item::Repeat(_), Err(ProducerError::Publish(_))) => {
                r.publish_failed += 1;
                r.repeats += 1;
                *r.repeat_status
                    .entry("recorded_publish_failed".into())
                    .or_default() += 1;
                return Next::Reconnect;
            }
            (Item::Repeat(_), Ok(Enqueued::Duplicate { status, .. })) => {
                r.repeats += 1;
                *r.repeat_status
                    .entry(status.as_str().to_owned())
                    .or_default() += 1;
            }
            (Item::ConflictSdk(_), Ok(Enqueued::Conflict { .. })) => {
                r.conflicts_sdk += 1;
                r.conflicts_sdk_refused += 1;
            }
            (Item::ConflictSdk(i), Err(ProducerError::Publish(_))) => {
                r.conflicts_sdk += 1;
                r.anomalies.push(format!(
                    "conflicting payload for intent {i} was recorded and published by the SDK"
                ));
            }
            (_, Err(_)) => return Next::Again,
            (item, Ok(other)) => {
                if let Item::ConflictSdk(_) = item {
                    r.conflicts_sdk += 1;
                }
                if let Item::Repeat(_) = item {
                    r.repeats += 1;
                }
                r.anomalies
                    .push(format!("{item:?} answered {other:?} by the producer"));
            }
        }
        Next::Done
    }

    /// Publish intent `i`'s conflicting payload straight to the broker (up to 10 tries).
    async fn publish_conflict(&mut self, i: usize) -> Result<(), GaveUp> {
        self.report.conflicts_raw += 1;
        let env = match intent(self.run, i, 1).seal(&secret()) {
            Ok(e) => e,
            Err(e) => {
                self.report
                    .anomalies
                    .push(format!("sealing conflict {i}: {e}"));
                return Ok(());
            }
        };
        for _ in 0..10 {
            let ok = match self.producer.publish_envelope(&env).await {
                Ok(p) => p.confirmed().await.is_ok(),
                Err(_) => false,
            };
            if ok {
                self.report.conflicts_raw_published += 1;
                break;
            }
            self.report.reconnects += 1;
            tokio::time::sleep(Duration::from_millis(200)).await;
            self.reconnect().await?;
        }
        Ok(())
    }

    /// A new SDK connection in place of the current one.
    async fn reconnect(&mut self) -> Result<(), GaveUp> {
        match connect_producer(&self.config, &self.data_keys, &mut self.report).await {
            Some(p) => {
                self.producer = p;
                Ok(())
            }
            None => Err(GaveUp),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_holds_every_intent_once_and_repeats_later() {
        let (batches, repeats, conflicts) = plan(2000, &mut Rng::new(7));
        let mut seen = vec![None; 2000];
        for (b, batch) in batches.iter().enumerate() {
            for item in batch {
                if let Item::Original(i) = item {
                    assert!(seen[*i].is_none());
                    seen[*i] = Some(b);
                }
            }
        }
        assert!(seen.iter().all(Option::is_some));
        let mut n_rep = 0;
        let mut n_conf = 0;
        for (b, batch) in batches.iter().enumerate() {
            for item in batch {
                match item {
                    Item::Repeat(i) => {
                        n_rep += 1;
                        assert!(seen[*i].is_some_and(|first| first < b));
                    }
                    Item::ConflictSdk(i) | Item::ConflictRaw(i) => {
                        n_conf += 1;
                        assert!(seen[*i].is_some_and(|first| first < b));
                    }
                    Item::Original(_) => {}
                }
            }
        }
        assert_eq!((n_rep, n_conf), (repeats, conflicts));
        assert_eq!(repeats, 200);
    }

    #[test]
    fn conflicting_intents_share_the_key_not_the_payload() {
        let s = secret();
        for i in [0, 5, 9] {
            let a = intent(1, i, 0).seal(&s).expect("seal");
            let b = intent(1, i, 1).seal(&s).expect("seal");
            assert_eq!(a.key, b.key);
            assert_ne!(a.payload_hash, b.payload_hash);
        }
    }
}
