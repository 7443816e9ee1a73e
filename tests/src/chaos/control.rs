//! Control before the send (docs/approvals.md) under the faults: an approval rule holds a
//! deterministic tenth of the payment orders, an **approver** decides the held ones while
//! the faults go on (most approved, some rejected, the choice drawn from the key and the
//! seed), and a **canceller** cancels a deterministic share of the intents at random
//! moments after their submission — some while they wait (`cancelled`), some too late
//! (a worker claimed them first). Expiring intents (`expires_at` a few seconds after
//! submission) are the workload's (`workload`).
//!
//! Both tasks read and write the journal through `oncely_core`'s own calls, the way an
//! operator's tools do, and survive Postgres outages like the rest of the harness: a call
//! that fails is logged on the timeline and tried again. A reply lost with its connection
//! is accounted for: the canceller is the only one who cancels, so a retried cancel that
//! finds the row `cancelled` was its own; the approver likewise.
//!
//! Every answer is kept: the checks hold the journal and the provider to them (a
//! `Cancelled` answer is never sent, a `TooLate` one never ends `cancelled`).

use super::rng::Rng;
use super::schedule::Timeline;
use super::workload::{self, Workload};
use oncely_core::config::{ApprovalRule, Config};
use oncely_core::journal::{Cancelled, Decided, Journal};
use oncely_core::{IdempotencyKey, Status};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

/// The approval rule's name.
pub(super) const RULE: &str = "chaos-hold";
/// The rule: a deterministic tenth of the payment orders (`workload::held_by_rule`
/// says which; a unit test holds the two together). `int()`: a JSON number may reach
/// CEL as an unsigned integer, and CEL does no mixed arithmetic.
pub(super) const RULE_WHEN: &str = "int(payload.amount_minor) % 100 < 10";
/// How long people have to decide: longer than any run (nightly included), so a held
/// operation ends `rejected` only because the approver said so.
pub(super) const APPROVAL_TIMEOUT: Duration = Duration::from_secs(4 * 3600);
/// The approver's name (`approver:chaos-approver` on its events).
pub(super) const APPROVER: &str = "chaos-approver";
/// The canceller's actor.
pub(super) const CANCELLER: &str = "chaos-canceller";
/// Share of the held operations the approver rejects.
const REJECT_SHARE: f64 = 0.2;
/// Share of the intents the canceller cancels.
pub(super) const CANCEL_SHARE: f64 = 0.05;
/// Longest a single journal call may take before it counts as failed.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Failed calls noted on the timeline (the rest are only counted).
const NOTED_ERRORS: u64 = 40;

/// The fleet's config for a chaos run: the approval rule on payment orders.
pub(super) fn configure(config: &mut Config) {
    if let Some(policy) = config.actions.get_mut("payment_order.create") {
        policy.approval.push(ApprovalRule {
            name: RULE.into(),
            when: Some(RULE_WHEN.into()),
            first_contact: None,
            four_eyes: None,
            timeout: APPROVAL_TIMEOUT,
        });
    }
}

/// Where the run is (the fault phase, 0, until [`Phase::drain`]): the tasks below look
/// at it between calls.
#[derive(Debug, Clone, Default)]
pub(super) struct Phase(Arc<AtomicU8>);

impl Phase {
    const DRAIN: u8 = 1;
    const STOP: u8 = 2;

    /// The fault phase is over (the producer is done): drain — decide every held
    /// operation, send the remaining cancels now.
    pub fn drain(&self) {
        self.0.store(Self::DRAIN, Ordering::Relaxed);
    }

    /// Healed: stop.
    pub fn stop(&self) {
        self.0.store(Self::STOP, Ordering::Relaxed);
    }

    fn draining(&self) -> bool {
        self.0.load(Ordering::Relaxed) >= Self::DRAIN
    }

    fn stopped(&self) -> bool {
        self.0.load(Ordering::Relaxed) >= Self::STOP
    }
}

/// FNV-1a of a key, mixed with the seed: a per-key draw that does not depend on the
/// order in which the approver meets the keys.
fn key_rng(seed: u64, salt: u64, key: &str) -> Rng {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    Rng::new(seed ^ salt ^ h)
}

/// Whether the approver rejects `key` (else it approves it): deterministic from the seed.
pub(super) fn rejects(seed: u64, key: &str) -> bool {
    key_rng(seed, 0x5EED_0005, key).chance(REJECT_SHARE)
}

/// What the approver decided about a key (as the journal took it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Decision {
    /// Approved: due for a worker.
    Approved,
    /// Rejected: never sent.
    Rejected,
    /// Not held any more when the approver came (cancelled, expired): the row's status.
    NotHeld(Status),
}

/// What the approver did.
#[derive(Debug, Default)]
pub(super) struct ApproverTally {
    /// Rounds in which it read the held list.
    pub rounds: u64,
    /// Its decisions, by key.
    pub decided: BTreeMap<String, Decision>,
    /// Decisions whose reply was lost (a failed call) and whose retry found them made.
    pub lost_replies: u64,
    /// Journal calls that failed (Postgres faults); each was tried again.
    pub errors: u64,
    /// Answers it should never get (`OwnRequest`, `NeedsMore`, `NotFound`).
    pub anomalies: Vec<String>,
}

impl ApproverTally {
    /// Decisions of one kind.
    pub fn count(&self, d: Decision) -> usize {
        self.decided.values().filter(|x| **x == d).count()
    }

    /// Held operations that were not held any more when the approver came.
    pub fn not_held(&self) -> usize {
        self.decided
            .values()
            .filter(|x| matches!(x, Decision::NotHeld(_)))
            .count()
    }
}

/// A failed call: counted, noted on the timeline (the first few), then a short pause.
async fn failed(errors: &mut u64, timeline: &Timeline, who: &str, what: String) {
    *errors += 1;
    if *errors <= NOTED_ERRORS {
        timeline.note(format_args!("{who}: {what} (retrying)"));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
}

/// The approver: every 1–4 s (every 300 ms once draining) it reads the held list and
/// decides a random part of it (all of it once draining); until [`Phase::stop`].
pub(super) async fn approver(
    journal: Journal,
    seed: u64,
    phase: Phase,
    timeline: Timeline,
) -> ApproverTally {
    let mut t = ApproverTally::default();
    let mut rng = Rng::new(seed ^ 0x5EED_0006);
    while !phase.stopped() {
        let pause = if phase.draining() {
            Duration::from_millis(300)
        } else {
            rng.secs(1.0, 4.0)
        };
        tokio::time::sleep(pause).await;
        let held = match tokio::time::timeout(CALL_TIMEOUT, journal.held(None, 500)).await {
            Ok(Ok(h)) => h,
            Ok(Err(e)) => {
                failed(&mut t.errors, &timeline, "approver", format!("held: {e}")).await;
                continue;
            }
            Err(_) => {
                failed(
                    &mut t.errors,
                    &timeline,
                    "approver",
                    "held: timed out".into(),
                )
                .await;
                continue;
            }
        };
        t.rounds += 1;
        for op in held {
            if phase.stopped() {
                break;
            }
            // Leave some for later rounds while the faults go on: held for a while,
            // some meet their deadline or a cancel first.
            if !phase.draining() && rng.chance(0.4) {
                continue;
            }
            decide(&journal, seed, &op.key, &mut t, &phase, &timeline).await;
        }
    }
    t
}

/// Decide one held operation, trying again through failed calls.
async fn decide(
    journal: &Journal,
    seed: u64,
    key: &IdempotencyKey,
    t: &mut ApproverTally,
    phase: &Phase,
    timeline: &Timeline,
) {
    let reject = rejects(seed, key.as_str());
    let mut lost = false;
    loop {
        let call = journal.decide_approval(key, APPROVER, !reject, Some("chaos"), None);
        let answer = match tokio::time::timeout(CALL_TIMEOUT, call).await {
            Ok(Ok(a)) => a,
            Ok(Err(e)) => {
                lost = true;
                let what = format!("decide {key}: {e}");
                failed(&mut t.errors, timeline, "approver", what).await;
                if phase.stopped() {
                    return;
                }
                continue;
            }
            Err(_) => {
                lost = true;
                let what = format!("decide {key}: timed out");
                failed(&mut t.errors, timeline, "approver", what).await;
                if phase.stopped() {
                    return;
                }
                continue;
            }
        };
        let decision = match answer {
            Decided::Approved(_) => Decision::Approved,
            Decided::Rejected(_) => Decision::Rejected,
            // Our own decision, made by a call whose reply was lost.
            Decided::AlreadyDecided if lost => {
                t.lost_replies += 1;
                if reject {
                    Decision::Rejected
                } else {
                    Decision::Approved
                }
            }
            Decided::NotHeld(op) if lost && op.status == Status::Rejected && reject => {
                t.lost_replies += 1;
                Decision::Rejected
            }
            Decided::NotHeld(op) if lost && !reject && !op.status.is_stopped() => {
                t.lost_replies += 1;
                Decision::Approved
            }
            Decided::NotHeld(op) => Decision::NotHeld(op.status),
            other => {
                t.anomalies
                    .push(format!("approver: {key} answered {other:?}"));
                return;
            }
        };
        t.decided.insert(key.as_str().to_owned(), decision);
        return;
    }
}

/// A cancel's answer, as the canceller took it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CancelAnswer {
    /// Cancelled: it must never be sent and must end `cancelled`.
    Cancelled,
    /// Too late: the row's status then (it must not end `cancelled`).
    TooLate(Status),
    /// The key was never found (never recorded).
    NotFound,
    /// Every call failed until the run stopped: no answer (the row may be `cancelled`).
    Unanswered,
}

/// One cancel the canceller will send: intent `index` at `at` after the start.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct PlannedCancel {
    /// When, from the start of the workload.
    pub at: Duration,
    /// The intent.
    pub index: usize,
}

/// The cancels of a run: a deterministic [`CANCEL_SHARE`] of the intents, each some time
/// after its batch is due (`pace` apart): a few right away, most within seconds — under
/// load and faults some meet the intent still waiting, some after a worker took it.
pub(super) fn cancel_plan(seed: u64, n: usize, pace: Duration) -> Vec<PlannedCancel> {
    let mut rng = Rng::new(seed ^ 0x5EED_0007);
    let mut plan: Vec<PlannedCancel> = (0..n)
        .filter_map(|i| {
            let chosen = rng.chance(CANCEL_SHARE);
            let soon = rng.chance(0.4);
            let delay = if soon {
                rng.secs(0.0, 0.3)
            } else {
                rng.secs(0.3, 8.0)
            };
            chosen.then(|| PlannedCancel {
                at: pace.mul_f64(workload::batch_of(i) as f64) + delay,
                index: i,
            })
        })
        .collect();
    plan.sort_by_key(|c| c.at);
    plan
}

/// What the canceller did.
#[derive(Debug, Default)]
pub(super) struct CancelTally {
    /// Cancels planned.
    pub planned: usize,
    /// Every answer, by key.
    pub answers: BTreeMap<String, CancelAnswer>,
    /// Cancels that found no row yet and were sent again later.
    pub not_yet_recorded: u64,
    /// Cancels whose reply was lost and whose retry found the row `cancelled`: its own.
    pub lost_replies: u64,
    /// Journal calls that failed (Postgres faults); each was tried again.
    pub errors: u64,
}

impl CancelTally {
    /// Answers of one kind (`TooLate` of any status: `TooLate(Status::Planned)`).
    pub fn count(&self, what: CancelAnswer) -> usize {
        self.answers
            .values()
            .filter(|a| match (a, what) {
                (CancelAnswer::TooLate(_), CancelAnswer::TooLate(_)) => true,
                _ => **a == what,
            })
            .count()
    }

    /// The statuses `TooLate` answers found.
    pub fn too_late(&self) -> BTreeMap<&'static str, u64> {
        let mut m = BTreeMap::new();
        for a in self.answers.values() {
            if let CancelAnswer::TooLate(s) = a {
                *m.entry(s.as_str()).or_default() += 1;
            }
        }
        m
    }
}

/// The canceller: sends the planned cancels at their times (at once when draining);
/// one whose key has no row yet is sent again later while the fault phase lasts.
pub(super) async fn canceller(
    journal: Journal,
    workload: Arc<Workload>,
    plan: Vec<PlannedCancel>,
    phase: Phase,
    timeline: Timeline,
) -> CancelTally {
    let t0 = Instant::now();
    let mut t = CancelTally {
        planned: plan.len(),
        ..CancelTally::default()
    };
    let mut queue: std::collections::VecDeque<PlannedCancel> = plan.into();
    while let Some(next) = queue.pop_front() {
        if phase.stopped() {
            break;
        }
        if !phase.draining() {
            let due = t0 + next.at;
            tokio::select! {
                _ = tokio::time::sleep_until(due.into()) => {}
                _ = wait_drain(&phase) => {}
            }
        }
        let key = &workload.sealed[next.index].key;
        let Ok(parsed) = IdempotencyKey::parse(key) else {
            continue;
        };
        match cancel_one(&journal, &parsed, &mut t, &phase, &timeline).await {
            Some(CancelAnswer::NotFound) if !phase.draining() => {
                // Not recorded yet (the producer retries a batch): later.
                t.not_yet_recorded += 1;
                let again = PlannedCancel {
                    at: t0.elapsed() + Duration::from_millis(500),
                    index: next.index,
                };
                let pos = queue.partition_point(|c| c.at <= again.at);
                queue.insert(pos, again);
            }
            Some(answer) => {
                t.answers.insert(key.clone(), answer);
            }
            None => {
                t.answers.insert(key.clone(), CancelAnswer::Unanswered);
            }
        }
    }
    t
}

/// Until the drain starts.
async fn wait_drain(phase: &Phase) {
    while !phase.draining() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One cancel, tried again through failed calls; `None`: no answer before the stop.
async fn cancel_one(
    journal: &Journal,
    key: &IdempotencyKey,
    t: &mut CancelTally,
    phase: &Phase,
    timeline: &Timeline,
) -> Option<CancelAnswer> {
    let mut lost = false;
    loop {
        let call = journal.cancel(key, None, CANCELLER);
        let what = match tokio::time::timeout(CALL_TIMEOUT, call).await {
            Ok(Ok(Cancelled::Cancelled(_))) => return Some(CancelAnswer::Cancelled),
            Ok(Ok(Cancelled::TooLate(op))) => {
                // Nobody else cancels: a `cancelled` row after a lost reply is ours.
                if lost && op.status == Status::Cancelled {
                    t.lost_replies += 1;
                    return Some(CancelAnswer::Cancelled);
                }
                return Some(CancelAnswer::TooLate(op.status));
            }
            Ok(Ok(Cancelled::NotFound)) => return Some(CancelAnswer::NotFound),
            Ok(Err(e)) => format!("cancel {key}: {e}"),
            Err(_) => format!("cancel {key}: timed out"),
        };
        lost = true;
        failed(&mut t.errors, timeline, "canceller", what).await;
        if phase.stopped() {
            return None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::secret;
    use oncely_core::approval::{Approvals, Asker};

    #[test]
    fn the_rule_holds_exactly_the_intents_the_checks_expect() {
        let mut config = Config::builtin().expect("built-in config");
        configure(&mut config);
        let approvals = Approvals::from_config(&config).expect("rules compile");
        let mut held = 0;
        let n = 1000;
        for i in 0..n {
            let env = workload::intent(3, i, 0).seal(&secret()).expect("seal");
            let verdict = approvals.evaluate(&env, Asker { token: "chaos" });
            assert_eq!(
                verdict.hold.is_some(),
                workload::held_by_rule(i),
                "intent {i}"
            );
            held += usize::from(verdict.hold.is_some());
        }
        let payments = (0..n).filter(|i| workload::action_of(*i) == 2).count();
        assert_eq!(held * 10, payments, "a tenth of the payment orders is held");
    }

    #[test]
    fn decisions_and_cancels_are_deterministic_and_in_proportion() {
        let keys: Vec<String> = (0..2000).map(|i| format!("v1:{i:064x}")).collect();
        let rejected = keys.iter().filter(|k| rejects(11, k)).count();
        assert!((250..550).contains(&rejected), "{rejected}");
        assert!(keys.iter().all(|k| rejects(11, k) == rejects(11, k)));
        let plan = cancel_plan(11, 2000, Duration::from_millis(500));
        assert_eq!(plan, cancel_plan(11, 2000, Duration::from_millis(500)));
        assert!((60..150).contains(&plan.len()), "{}", plan.len());
        assert!(plan.windows(2).all(|w| w[0].at <= w[1].at));
        for c in &plan {
            let due = Duration::from_millis(500).mul_f64(workload::batch_of(c.index) as f64);
            assert!(c.at >= due && c.at < due + Duration::from_secs(8));
        }
    }
}
