//! The verdict: a pure function from the [`Facts`] to typed [`Finding`]s, and the "four
//! zeros" (duplicates, lost, unexpected, mismatches) counted from them, with a fifth:
//! cancelled or expired actions with an effect.
//!
//! `rejected`, `cancelled` and `expired` are legitimate ends for an intent — never sent,
//! no effect — but only when someone asked: `cancelled` needs the canceller's
//! `Cancelled` answer, `expired` an `expires_at`, `rejected` the approval rule's hold.
//! One without a reason is a lost intent; one with an effect, or a cancel whose answer
//! the row contradicts, counts in the fifth zero.
//!
//! Pure so it can be tested without a fleet: the unit tests below forge the same bad
//! cases as `--self-test` does in a live run (and one of each other kind), and a clean
//! set of facts must give no finding. A run passes only with no finding at all — the four
//! zeros are the headline, the other checks (payment orders retried blindly, conflicting
//! payloads recorded or sent, a producer that misbehaved, a heal that never settled) fail
//! it too.

use super::control::CancelAnswer;
use super::facts::{Facts, Lookup, NotSettled};
use oncely_core::Status;
use oncely_sandbox::Provider;
use serde_json::{Value, json};
use std::fmt;
use std::time::Duration;

/// One thing the run found wrong.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Finding {
    /// The provider performed one key's effect more than once.
    Duplicate {
        /// The key.
        key: String,
        /// The provider.
        provider: Provider,
        /// How many times.
        effects: u64,
    },
    /// A recorded intent with no journal row.
    LostNoRow {
        /// The key.
        key: String,
    },
    /// A recorded intent that is neither settled nor waiting for a person.
    LostUnsettled {
        /// The key.
        key: String,
        /// Where it stopped.
        status: Status,
    },
    /// The journal holds another payload under an intent's key.
    ConflictRecorded {
        /// The key.
        key: String,
        /// The journal's payload hash.
        journal: String,
        /// The intent's.
        intent: String,
    },
    /// A recorded intent stopped (`rejected`, `cancelled`, `expired`) with nobody asking.
    StoppedUnasked {
        /// The key.
        key: String,
        /// Where it stopped.
        status: Status,
    },
    /// A journal row for a key no intent has.
    UnexpectedRow {
        /// The key.
        key: String,
    },
    /// An effect at the provider for a key the journal does not hold.
    UnexpectedEffect {
        /// The key.
        key: String,
        /// The provider.
        provider: Provider,
        /// How many times.
        effects: u64,
    },
    /// The journal says succeeded, the provider has no effect.
    SucceededWithoutEffect {
        /// The key.
        key: String,
        /// Its attempt count.
        attempts: i32,
    },
    /// The journal says failed_final, the provider has an effect.
    FailedFinalWithEffect {
        /// The key.
        key: String,
        /// How many.
        effects: u64,
    },
    /// The provider's record of a succeeded operation does not carry the journal's id.
    ProviderRecord {
        /// The key.
        key: String,
        /// The id the journal holds.
        journal_id: String,
        /// The provider's answer, or why there was none.
        answer: Result<(u16, Value), String>,
    },
    /// A `rejected`, `cancelled` or `expired` operation — never to be sent — with an
    /// effect at the provider.
    StoppedWithEffect {
        /// The key.
        key: String,
        /// Its status.
        status: Status,
        /// How many effects.
        effects: u64,
    },
    /// A cancel's answer the journal or the provider contradicts: `Cancelled` for a row
    /// that is not `cancelled` at the end (or has an effect), `TooLate` for one that is.
    CancelContradicted {
        /// The key.
        key: String,
        /// What the cancel answered.
        answer: CancelAnswer,
        /// The row's status at the end (`None`: no row).
        status: Option<Status>,
        /// Effects at the provider.
        effects: u64,
    },
    /// An operation the approval rule holds was claimed without an approval.
    RanUnapproved {
        /// The key.
        key: String,
        /// Its status.
        status: Status,
        /// Its attempts.
        attempts: i32,
    },
    /// The approver had an answer it never should.
    Control {
        /// What.
        what: String,
    },
    /// A payment order left `unknown` by something else than a lookup, a late answer or
    /// a person (a blind retry could pay twice).
    PaymentBlindRetry {
        /// The key.
        key: String,
        /// The event's reason.
        reason: String,
        /// Where it went.
        to: Status,
    },
    /// Requests reached the provider with a reused key and another body.
    ConflictAtProvider {
        /// How many.
        requests: u64,
    },
    /// The producer saw something it never should, or gave up.
    Producer {
        /// What.
        what: String,
    },
    /// Intents the producer never got recorded.
    NotEnqueued {
        /// How many.
        intents: usize,
    },
    /// The fleet did not settle after the faults.
    NotHealed {
        /// How long healing was allowed.
        after: Duration,
        /// What was left.
        state: String,
    },
}

/// The check a finding belongs to (the report groups and counts by it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum Check {
    /// An effect more than once.
    Duplicate,
    /// An intent not accounted for.
    Lost,
    /// Another payload recorded under a key.
    ConflictRecorded,
    /// Something nobody asked for.
    Unexpected,
    /// The journal and the provider disagree.
    Mismatch,
    /// A never-sent action with an effect, or a cancel's answer contradicted.
    Stopped,
    /// A held action run without an approval.
    Unapproved,
    /// The approver had an answer it never should.
    Control,
    /// A payment order retried blindly.
    PaymentBlindRetry,
    /// Another payload sent under a key.
    ConflictAtProvider,
    /// The producer misbehaved.
    Producer,
    /// Intents never recorded.
    NotEnqueued,
    /// No settling.
    NotHealed,
}

impl Check {
    /// The name printed in a finding's `[…]`.
    pub fn name(self) -> &'static str {
        match self {
            Check::Duplicate => "duplicate",
            Check::Lost => "lost",
            Check::ConflictRecorded => "conflict_recorded",
            Check::Unexpected => "unexpected",
            Check::Mismatch => "mismatch",
            Check::Stopped => "stopped_with_effect",
            Check::Unapproved => "unapproved",
            Check::Control => "control",
            Check::PaymentBlindRetry => "payment_blind_retry",
            Check::ConflictAtProvider => "conflict_at_provider",
            Check::Producer => "producer",
            Check::NotEnqueued => "not_enqueued",
            Check::NotHealed => "not_healed",
        }
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Finding {
    /// Its check.
    pub fn check(&self) -> Check {
        match self {
            Finding::Duplicate { .. } => Check::Duplicate,
            Finding::LostNoRow { .. }
            | Finding::LostUnsettled { .. }
            | Finding::StoppedUnasked { .. } => Check::Lost,
            Finding::ConflictRecorded { .. } => Check::ConflictRecorded,
            Finding::UnexpectedRow { .. } | Finding::UnexpectedEffect { .. } => Check::Unexpected,
            Finding::SucceededWithoutEffect { .. }
            | Finding::FailedFinalWithEffect { .. }
            | Finding::ProviderRecord { .. } => Check::Mismatch,
            Finding::StoppedWithEffect { .. } | Finding::CancelContradicted { .. } => {
                Check::Stopped
            }
            Finding::RanUnapproved { .. } => Check::Unapproved,
            Finding::Control { .. } => Check::Control,
            Finding::PaymentBlindRetry { .. } => Check::PaymentBlindRetry,
            Finding::ConflictAtProvider { .. } => Check::ConflictAtProvider,
            Finding::Producer { .. } => Check::Producer,
            Finding::NotEnqueued { .. } => Check::NotEnqueued,
            Finding::NotHealed { .. } => Check::NotHealed,
        }
    }

    /// The key it is about, if it is about one.
    pub fn key(&self) -> Option<&str> {
        match self {
            Finding::Duplicate { key, .. }
            | Finding::LostNoRow { key }
            | Finding::LostUnsettled { key, .. }
            | Finding::StoppedUnasked { key, .. }
            | Finding::StoppedWithEffect { key, .. }
            | Finding::CancelContradicted { key, .. }
            | Finding::RanUnapproved { key, .. }
            | Finding::ConflictRecorded { key, .. }
            | Finding::UnexpectedRow { key }
            | Finding::UnexpectedEffect { key, .. }
            | Finding::SucceededWithoutEffect { key, .. }
            | Finding::FailedFinalWithEffect { key, .. }
            | Finding::ProviderRecord { key, .. }
            | Finding::PaymentBlindRetry { key, .. } => Some(key),
            Finding::ConflictAtProvider { .. }
            | Finding::Control { .. }
            | Finding::Producer { .. }
            | Finding::NotEnqueued { .. }
            | Finding::NotHealed { .. } => None,
        }
    }
}

/// What was found, in words (the report's line after the key).
impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Finding::Duplicate {
                provider, effects, ..
            } => write!(f, "{effects} effects at {}", provider.name()),
            Finding::LostNoRow { .. } => f.write_str("no journal row"),
            Finding::LostUnsettled { status, .. } => write!(f, "status {status}, no open review"),
            Finding::StoppedUnasked { status, .. } => write!(
                f,
                "{status} without a reason (no cancel answered cancelled, no expires_at, not held)"
            ),
            Finding::StoppedWithEffect {
                status, effects, ..
            } => write!(f, "{status} (never to be sent) with {effects} effect(s)"),
            Finding::CancelContradicted {
                answer,
                status,
                effects,
                ..
            } => write!(
                f,
                "cancel answered {answer:?}; the row ends {}, with {effects} effect(s)",
                status.map_or("missing", Status::as_str)
            ),
            Finding::RanUnapproved {
                status, attempts, ..
            } => write!(
                f,
                "held by the approval rule, yet {status} after {attempts} attempt(s) without an approval"
            ),
            Finding::Control { what } => f.write_str(what),
            Finding::ConflictRecorded {
                journal, intent, ..
            } => write!(
                f,
                "journal holds payload hash {journal}, the intent's is {intent}"
            ),
            Finding::UnexpectedRow { .. } => f.write_str("journal row for a key no intent has"),
            Finding::UnexpectedEffect {
                provider, effects, ..
            } => write!(
                f,
                "{effects} effects at {}, no journal row",
                provider.name()
            ),
            Finding::SucceededWithoutEffect { attempts, .. } => {
                write!(f, "succeeded (attempt {attempts}) without an effect")
            }
            Finding::FailedFinalWithEffect { effects, .. } => {
                write!(f, "failed_final with {effects} effect(s)")
            }
            Finding::ProviderRecord {
                journal_id, answer, ..
            } => match answer {
                Ok((status, body)) => write!(
                    f,
                    "journal: succeeded with id {journal_id}; provider lookup: {status} {body}"
                ),
                Err(e) => write!(
                    f,
                    "journal: succeeded with id {journal_id}; provider lookup failed: {e}"
                ),
            },
            Finding::PaymentBlindRetry { reason, to, .. } => {
                write!(f, "unknown → {to} by {reason}")
            }
            Finding::ConflictAtProvider { requests } => write!(
                f,
                "{requests} requests reached the sandbox with a reused key and another body"
            ),
            Finding::Producer { what } => f.write_str(what),
            Finding::NotEnqueued { intents } => {
                write!(f, "{intents} intents were never recorded by the producer")
            }
            Finding::NotHealed { after, state } => {
                write!(f, "not settled after {after:?}: {state}")
            }
        }
    }
}

/// The zeros a run must end with: the four, and the fifth (never-sent actions).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Zeros {
    /// Effects performed more than once.
    pub duplicates: usize,
    /// Intents not accounted for.
    pub lost: usize,
    /// Rows or effects nobody asked for.
    pub unexpected: usize,
    /// Journal and provider disagreeing.
    pub mismatches: usize,
    /// Cancelled, expired or rejected actions with an effect; cancel answers contradicted.
    pub stopped_with_effect: usize,
}

impl Zeros {
    /// Count them in `findings`.
    pub fn of(findings: &[Finding]) -> Zeros {
        let mut z = Zeros::default();
        for f in findings {
            match f.check() {
                Check::Duplicate => z.duplicates += 1,
                Check::Lost => z.lost += 1,
                Check::Unexpected => z.unexpected += 1,
                Check::Mismatch => z.mismatches += 1,
                Check::Stopped => z.stopped_with_effect += 1,
                _ => {}
            }
        }
        z
    }
}

/// The checks' conclusion.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Verdict {
    /// Everything found wrong, check by check.
    pub findings: Vec<Finding>,
    /// The zeros (if the run passed).
    pub zeros: Zeros,
    /// Intents the producer got recorded: the ones the fleet answers for.
    pub distinct: usize,
    /// Succeeded operations whose provider record carries the journal's id.
    pub ids_verified: usize,
}

impl Verdict {
    /// No finding at all.
    pub fn passed(&self) -> bool {
        self.findings.is_empty()
    }

    /// Findings of one check.
    pub fn count(&self, check: Check) -> usize {
        self.findings.iter().filter(|f| f.check() == check).count()
    }
}

/// Judge the facts.
pub(super) fn check(facts: &Facts) -> Verdict {
    let mut findings = duplicates(facts);
    findings.extend(intents(facts));
    findings.extend(unexpected(facts));
    findings.extend(mismatches(facts));
    findings.extend(stopped(facts));
    findings.extend(unapproved(facts));
    findings.extend(facts.lookups.iter().filter_map(provider_record));
    findings.extend(blind_retries(facts));
    findings.extend(run_wide(facts));
    Verdict {
        zeros: Zeros::of(&findings),
        findings,
        distinct: facts.intents.iter().filter(|i| i.recorded).count(),
        ids_verified: facts.lookups.iter().filter(|l| verified(l)).count(),
    }
}

/// Keys with more than one effect.
fn duplicates(facts: &Facts) -> Vec<Finding> {
    facts
        .effects
        .duplicates()
        .map(|(key, e)| Finding::Duplicate {
            key: key.to_owned(),
            provider: e.provider,
            effects: e.count,
        })
        .collect()
}

/// Every recorded intent has a row with its payload, settled or waiting for a person.
fn intents(facts: &Facts) -> Vec<Finding> {
    let mut out = Vec::new();
    for i in facts.intents.iter().filter(|i| i.recorded) {
        let Some(op) = facts.operations.get(&i.key) else {
            out.push(Finding::LostNoRow { key: i.key.clone() });
            continue;
        };
        if op.payload_hash != i.payload_hash {
            out.push(Finding::ConflictRecorded {
                key: i.key.clone(),
                journal: op.payload_hash.clone(),
                intent: i.payload_hash.clone(),
            });
        }
        let in_review = op.status == Status::Unknown && facts.open_reviews.contains_key(&i.key);
        if !op.status.is_terminal() && !in_review {
            out.push(Finding::LostUnsettled {
                key: i.key.clone(),
                status: op.status,
            });
        }
        if op.status.is_stopped() && !stop_asked(facts, i, op.status) {
            out.push(Finding::StoppedUnasked {
                key: i.key.clone(),
                status: op.status,
            });
        }
    }
    out
}

/// Whether someone asked for intent `i` to end `status` (one of the never-sent three):
/// the canceller got `Cancelled` (or no answer at all: its call may have done it), the
/// intent asked for an `expires_at`, the approval rule held it (the approver rejects).
fn stop_asked(facts: &Facts, i: &super::facts::IntentFact, status: Status) -> bool {
    match status {
        Status::Cancelled => matches!(
            facts.cancels.get(&i.key),
            Some(CancelAnswer::Cancelled | CancelAnswer::Unanswered)
        ),
        Status::Expired => i.expires,
        Status::Rejected => i.held,
        _ => true,
    }
}

/// The fifth zero: a never-sent operation (`rejected`, `cancelled`, `expired`) has no
/// effect; a cancel answered `Cancelled` ends `cancelled` with no effect, one answered
/// `TooLate` never ends `cancelled`.
fn stopped(facts: &Facts) -> Vec<Finding> {
    let mut out: Vec<Finding> = facts
        .operations
        .iter()
        .filter(|(k, o)| o.status.is_stopped() && facts.effects.count(k) > 0)
        .map(|(k, o)| Finding::StoppedWithEffect {
            key: k.clone(),
            status: o.status,
            effects: facts.effects.count(k),
        })
        .collect();
    for (key, answer) in &facts.cancels {
        let status = facts.operations.get(key).map(|o| o.status);
        let contradicted = match answer {
            // Its effects, if any, are a `StoppedWithEffect` above when the row says so.
            CancelAnswer::Cancelled => status != Some(Status::Cancelled),
            CancelAnswer::TooLate(_) => status == Some(Status::Cancelled),
            CancelAnswer::NotFound | CancelAnswer::Unanswered => false,
        };
        if contradicted {
            out.push(Finding::CancelContradicted {
                key: key.clone(),
                answer: *answer,
                status,
                effects: facts.effects.count(key),
            });
        }
    }
    out
}

/// An operation the approval rule holds is claimed only once approved.
fn unapproved(facts: &Facts) -> Vec<Finding> {
    facts
        .intents
        .iter()
        .filter(|i| i.held && !facts.approved.contains(&i.key))
        .filter_map(|i| {
            let op = facts.operations.get(&i.key)?;
            (op.attempts > 0).then(|| Finding::RanUnapproved {
                key: i.key.clone(),
                status: op.status,
                attempts: op.attempts,
            })
        })
        .collect()
}

/// Rows no intent has, effects no row has.
fn unexpected(facts: &Facts) -> Vec<Finding> {
    let intent_keys: std::collections::BTreeSet<&str> =
        facts.intents.iter().map(|i| i.key.as_str()).collect();
    let rows = facts
        .operations
        .keys()
        .filter(|k| !intent_keys.contains(k.as_str()))
        .map(|k| Finding::UnexpectedRow { key: k.clone() });
    let effects = facts
        .effects
        .keys
        .iter()
        .filter(|(k, _)| !facts.operations.contains_key(*k))
        .map(|(k, e)| Finding::UnexpectedEffect {
            key: k.clone(),
            provider: e.provider,
            effects: e.count,
        });
    rows.chain(effects).collect()
}

/// A row's status against the provider's effects: succeeded has one (unless a person
/// said so), failed_final has none.
fn mismatches(facts: &Facts) -> Vec<Finding> {
    let mut out = Vec::new();
    for (key, op) in &facts.operations {
        let n = facts.effects.count(key);
        if op.status == Status::Succeeded && n == 0 && !facts.review_succeeded.contains(key) {
            out.push(Finding::SucceededWithoutEffect {
                key: key.clone(),
                attempts: op.attempts,
            });
        }
        if op.status == Status::FailedFinal && n > 0 {
            out.push(Finding::FailedFinalWithEffect {
                key: key.clone(),
                effects: n,
            });
        }
    }
    out
}

/// The provider's record says succeeded, with the journal's id.
fn verified(l: &Lookup) -> bool {
    matches!(&l.answer, Ok((200, body)) if body["status"] == "succeeded" && body["id"] == json!(l.journal_id))
}

/// A lookup that does not verify.
fn provider_record(l: &Lookup) -> Option<Finding> {
    (!verified(l)).then(|| Finding::ProviderRecord {
        key: l.key.clone(),
        journal_id: l.journal_id.clone(),
        answer: l.answer.clone(),
    })
}

/// Payment orders leave `unknown` only by a lookup, a late answer or a person (a
/// transition the reconciler made while a review is open is the review's business).
fn blind_retries(facts: &Facts) -> Vec<Finding> {
    facts
        .payment_moves
        .iter()
        .filter(|m| {
            let allowed = m.reason.starts_with("reconcile_found_")
                || m.reason == "late_answer"
                || m.reason.starts_with("review_");
            m.reason == "reconcile_absent_retry"
                || (!allowed && !facts.open_reviews.contains_key(&m.key))
        })
        .map(|m| Finding::PaymentBlindRetry {
            key: m.key.clone(),
            reason: m.reason.clone(),
            to: m.to,
        })
        .collect()
}

/// Findings about the run as a whole.
fn run_wide(facts: &Facts) -> Vec<Finding> {
    let mut out = Vec::new();
    if facts.conflicts_422 > 0 {
        out.push(Finding::ConflictAtProvider {
            requests: facts.conflicts_422,
        });
    }
    let producer = facts.producer_anomalies.iter().chain(&facts.producer_fatal);
    out.extend(producer.map(|what| Finding::Producer { what: what.clone() }));
    out.extend(
        facts
            .control_anomalies
            .iter()
            .map(|what| Finding::Control { what: what.clone() }),
    );
    let not_recorded = facts.intents.iter().filter(|i| !i.recorded).count();
    if not_recorded > 0 {
        out.push(Finding::NotEnqueued {
            intents: not_recorded,
        });
    }
    if let Some(NotSettled { limit, state }) = &facts.not_settled {
        out.push(Finding::NotHealed {
            after: *limit,
            state: state.clone(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chaos::facts::{IntentFact, Operation, PaymentMove};
    use oncely_sandbox::{Effects, KeyEffects};

    fn key(n: u32) -> String {
        format!("v1:key{n}")
    }

    fn effects(list: &[(String, u64)]) -> Effects {
        let mut e = Effects::default();
        for (k, n) in list {
            let ke = KeyEffects {
                provider: Provider::Mail,
                count: *n,
            };
            e.keys.insert(k.clone(), ke);
            e.total += n;
        }
        e
    }

    fn op(status: Status, id: &str) -> Operation {
        Operation {
            action: "email.send".into(),
            status,
            attempts: 1,
            payload_hash: format!("hash-{id}"),
            provider_id: (status == Status::Succeeded).then(|| id.to_owned()),
        }
    }

    fn found(id: &str) -> Result<(u16, Value), String> {
        Ok((200, json!({"status": "succeeded", "id": id})))
    }

    /// A healthy run's facts: three emails succeeded with one effect each, whose
    /// provider records carry the journal's ids, and one unknown in review.
    fn clean() -> Facts {
        let mut f = Facts::default();
        for n in 0..4 {
            let id = format!("em_{n}");
            f.intents.push(IntentFact {
                key: key(n),
                payload_hash: format!("hash-{id}"),
                recorded: true,
                expires: false,
                held: false,
            });
            let status = if n == 3 {
                Status::Unknown
            } else {
                Status::Succeeded
            };
            f.operations.insert(key(n), op(status, &id));
            if status == Status::Succeeded {
                f.lookups.push(Lookup {
                    key: key(n),
                    journal_id: id.clone(),
                    answer: found(&id),
                });
            }
        }
        f.open_reviews.insert(key(3), "reconcile_exhausted".into());
        f.effects = effects(&[(key(0), 1), (key(1), 1), (key(2), 1)]);
        f
    }

    #[test]
    fn a_clean_run_has_four_zeros_and_passes() {
        let v = check(&clean());
        assert_eq!(v.findings, Vec::<Finding>::new());
        assert_eq!(v.zeros, Zeros::default());
        assert!(v.passed());
        assert_eq!((v.distinct, v.ids_verified), (4, 3));
    }

    /// `--self-test`'s forgeries, as facts: an effect under a key nobody has (unexpected);
    /// a succeeded email sent again after the provider forgot its key (duplicate, and its
    /// record now carries another id: mismatch); a journal id overwritten (mismatch); an
    /// open review closed without a decision (lost).
    #[test]
    fn the_self_tests_forgeries_are_each_found() {
        let mut f = clean();
        let stranger = format!("v1:{}", "0".repeat(64));
        f.effects = effects(&[(key(0), 2), (key(1), 1), (key(2), 1), (stranger.clone(), 1)]);
        f.lookups[0].answer = found("em_999");
        f.lookups[1].journal_id = "em_forged".into();
        f.open_reviews.clear();
        let v = check(&f);
        let mail = Provider::Mail;
        let expected = vec![
            Finding::Duplicate {
                key: key(0),
                provider: mail,
                effects: 2,
            },
            Finding::LostUnsettled {
                key: key(3),
                status: Status::Unknown,
            },
            Finding::UnexpectedEffect {
                key: stranger,
                provider: mail,
                effects: 1,
            },
            Finding::ProviderRecord {
                key: key(0),
                journal_id: "em_0".into(),
                answer: found("em_999"),
            },
            Finding::ProviderRecord {
                key: key(1),
                journal_id: "em_forged".into(),
                answer: found("em_1"),
            },
        ];
        assert_eq!(v.findings, expected);
        let zeros = Zeros {
            duplicates: 1,
            lost: 1,
            unexpected: 1,
            mismatches: 2,
            stopped_with_effect: 0,
        };
        assert_eq!(v.zeros, zeros);
        assert!(!v.passed());
        assert_eq!(v.ids_verified, 1);
    }

    #[test]
    fn lost_intents_and_stray_rows_are_found() {
        let mut f = clean();
        f.operations.remove(&key(2));
        f.lookups.remove(2);
        f.effects = effects(&[(key(0), 1), (key(1), 1)]);
        if let Some(o) = f.operations.get_mut(&key(1)) {
            o.status = Status::Executing;
        }
        f.lookups.remove(1);
        f.operations.insert(key(9), op(Status::FailedFinal, "x"));
        let v = check(&f);
        assert_eq!(
            v.findings,
            vec![
                Finding::LostUnsettled {
                    key: key(1),
                    status: Status::Executing
                },
                Finding::LostNoRow { key: key(2) },
                Finding::UnexpectedRow { key: key(9) },
            ]
        );
        assert_eq!(
            Zeros::of(&v.findings),
            Zeros {
                duplicates: 0,
                lost: 2,
                unexpected: 1,
                mismatches: 0,
                stopped_with_effect: 0,
            }
        );
    }

    #[test]
    fn unrecorded_intents_are_not_held_against_the_fleet_but_fail_the_run() {
        let mut f = clean();
        f.intents[2].recorded = false;
        f.operations.remove(&key(2));
        f.lookups.remove(2);
        f.effects = effects(&[(key(0), 1), (key(1), 1)]);
        let v = check(&f);
        assert_eq!(v.findings, vec![Finding::NotEnqueued { intents: 1 }]);
        assert_eq!(v.zeros, Zeros::default());
        assert!(!v.passed());
    }

    #[test]
    fn status_and_effects_must_agree() {
        let mut f = clean();
        f.effects = effects(&[(key(0), 1), (key(2), 1), (key(3), 1)]);
        f.operations.insert(key(3), op(Status::FailedFinal, "em_3"));
        f.open_reviews.clear();
        f.review_succeeded.insert(key(2));
        f.effects.keys.remove(&key(2));
        let v = check(&f);
        assert_eq!(
            v.findings,
            vec![
                Finding::SucceededWithoutEffect {
                    key: key(1),
                    attempts: 1
                },
                Finding::FailedFinalWithEffect {
                    key: key(3),
                    effects: 1
                },
            ]
        );
        assert_eq!(v.zeros.mismatches, 2);
    }

    /// Adds four intents to `clean()`: key 4 cancelled (answered `Cancelled`), key 5
    /// expired (it asked for an `expires_at`), key 6 rejected (held by the rule), key 7
    /// held, approved and succeeded; a cancel of key 0 answered `TooLate(succeeded)`.
    fn with_control() -> Facts {
        let mut f = clean();
        for (n, status) in [
            (4, Status::Cancelled),
            (5, Status::Expired),
            (6, Status::Rejected),
            (7, Status::Succeeded),
        ] {
            let id = format!("em_{n}");
            f.intents.push(IntentFact {
                key: key(n),
                payload_hash: format!("hash-{id}"),
                recorded: true,
                expires: n == 5,
                held: n == 6 || n == 7,
            });
            let mut o = op(status, &id);
            if status.is_stopped() {
                o.attempts = 0;
            }
            f.operations.insert(key(n), o);
        }
        f.lookups.push(Lookup {
            key: key(7),
            journal_id: "em_7".into(),
            answer: found("em_7"),
        });
        f.approved.insert(key(7));
        f.effects = effects(&[(key(0), 1), (key(1), 1), (key(2), 1), (key(7), 1)]);
        f.cancels.insert(key(4), CancelAnswer::Cancelled);
        f.cancels
            .insert(key(0), CancelAnswer::TooLate(Status::Succeeded));
        f
    }

    #[test]
    fn cancelled_expired_and_rejected_are_legitimate_ends_without_effects() {
        let v = check(&with_control());
        assert_eq!(v.findings, Vec::<Finding>::new());
        assert_eq!(v.zeros, Zeros::default());
        assert!(v.passed());
    }

    #[test]
    fn never_sent_actions_with_an_effect_and_contradicted_cancels_are_found() {
        let mut f = with_control();
        // A cancelled, an expired and a rejected operation with an effect each.
        f.effects = effects(&[
            (key(0), 1),
            (key(1), 1),
            (key(2), 1),
            (key(7), 1),
            (key(4), 1),
            (key(5), 1),
            (key(6), 1),
        ]);
        // `Cancelled` for a row that ran; `TooLate` for a row that ends cancelled.
        f.cancels.insert(key(1), CancelAnswer::Cancelled);
        f.cancels
            .insert(key(4), CancelAnswer::TooLate(Status::Executing));
        let v = check(&f);
        let stopped: Vec<&Finding> = v
            .findings
            .iter()
            .filter(|x| x.check() == Check::Stopped)
            .collect();
        assert_eq!(
            stopped,
            vec![
                &Finding::StoppedWithEffect {
                    key: key(4),
                    status: Status::Cancelled,
                    effects: 1
                },
                &Finding::StoppedWithEffect {
                    key: key(5),
                    status: Status::Expired,
                    effects: 1
                },
                &Finding::StoppedWithEffect {
                    key: key(6),
                    status: Status::Rejected,
                    effects: 1
                },
                &Finding::CancelContradicted {
                    key: key(1),
                    answer: CancelAnswer::Cancelled,
                    status: Some(Status::Succeeded),
                    effects: 1
                },
                &Finding::CancelContradicted {
                    key: key(4),
                    answer: CancelAnswer::TooLate(Status::Executing),
                    status: Some(Status::Cancelled),
                    effects: 1
                },
            ]
        );
        // Key 4 ends cancelled with no `Cancelled` answer: lost as well.
        assert_eq!(
            v.zeros,
            Zeros {
                lost: 1,
                stopped_with_effect: 5,
                ..Zeros::default()
            }
        );
        assert!(!v.passed());
        assert_eq!(
            stopped[4].to_string(),
            "cancel answered TooLate(Executing); the row ends cancelled, with 1 effect(s)"
        );
    }

    #[test]
    fn stops_nobody_asked_for_are_lost_and_held_actions_run_only_once_approved() {
        let mut f = with_control();
        // Nobody cancelled 4 (no answer), 5 asked no expiry, 6 was not held.
        f.cancels.remove(&key(4));
        f.intents[5].expires = false;
        f.intents[6].held = false;
        // 7 held, claimed, never approved; a held operation still waiting is unsettled.
        f.approved.clear();
        f.intents[0].held = true;
        f.approved.insert(key(0));
        let mut waiting = op(Status::AwaitingApproval, "em_8");
        waiting.attempts = 0;
        f.operations.insert(key(8), waiting);
        f.intents.push(IntentFact {
            key: key(8),
            payload_hash: "hash-em_8".into(),
            recorded: true,
            expires: false,
            held: true,
        });
        let v = check(&f);
        assert_eq!(
            v.findings,
            vec![
                Finding::StoppedUnasked {
                    key: key(4),
                    status: Status::Cancelled
                },
                Finding::StoppedUnasked {
                    key: key(5),
                    status: Status::Expired
                },
                Finding::StoppedUnasked {
                    key: key(6),
                    status: Status::Rejected
                },
                Finding::LostUnsettled {
                    key: key(8),
                    status: Status::AwaitingApproval
                },
                Finding::RanUnapproved {
                    key: key(7),
                    status: Status::Succeeded,
                    attempts: 1
                },
            ]
        );
        assert_eq!(v.zeros.lost, 4);
        assert_eq!(v.count(Check::Unapproved), 1);
        // An unanswered cancel (every call failed) may have cancelled it.
        f.cancels.insert(key(4), CancelAnswer::Unanswered);
        assert_eq!(check(&f).zeros.lost, 3);
    }

    #[test]
    fn a_lookup_that_fails_is_a_mismatch() {
        let mut f = clean();
        f.lookups[2].answer = Err("connection refused".into());
        let v = check(&f);
        assert_eq!(v.zeros.mismatches, 1);
        assert_eq!(
            v.findings[0].to_string(),
            "journal: succeeded with id em_2; provider lookup failed: connection refused"
        );
    }

    #[test]
    fn a_recorded_conflicting_payload_is_found() {
        let mut f = clean();
        if let Some(o) = f.operations.get_mut(&key(0)) {
            o.payload_hash = "other".into();
        }
        let v = check(&f);
        assert_eq!(v.findings.len(), 1);
        assert_eq!(v.findings[0].check(), Check::ConflictRecorded);
        assert_eq!(v.zeros, Zeros::default());
    }

    #[test]
    fn payment_orders_leave_unknown_only_by_lookup_late_answer_or_a_person() {
        let mut f = clean();
        let mv = |n: u32, reason: &str| PaymentMove {
            key: key(n),
            reason: reason.into(),
            to: Status::FailedRetryable,
        };
        f.payment_moves = vec![
            mv(0, "reconcile_found_succeeded"),
            mv(1, "late_answer"),
            mv(2, "review_failed"),
            mv(3, "reconcile_absent_retry"),
            mv(0, "lease_expired"),
        ];
        let v = check(&f);
        let blind: Vec<&str> = v.findings.iter().filter_map(Finding::key).collect();
        assert_eq!(blind, vec![key(3).as_str(), key(0).as_str()]);
        assert_eq!(v.count(Check::PaymentBlindRetry), 2);
        // An open review covers a move the reconciler made meanwhile, but never a blind retry.
        f.open_reviews.insert(key(0), "x".into());
        assert_eq!(check(&f).count(Check::PaymentBlindRetry), 1);
    }

    #[test]
    fn run_wide_failures_fail_the_run_without_touching_the_zeros() {
        let mut f = clean();
        f.conflicts_422 = 2;
        f.producer_anomalies
            .push("Repeat(3) answered … by the producer".into());
        f.producer_fatal = Some("producer cannot connect".into());
        f.not_settled = Some(NotSettled {
            limit: Duration::from_secs(180),
            state: "live 3".into(),
        });
        let v = check(&f);
        let checks: Vec<Check> = v.findings.iter().map(Finding::check).collect();
        assert_eq!(
            checks,
            vec![
                Check::ConflictAtProvider,
                Check::Producer,
                Check::Producer,
                Check::NotHealed
            ]
        );
        assert_eq!(v.zeros, Zeros::default());
        assert!(!v.passed());
        assert_eq!(v.findings[3].to_string(), "not settled after 180s: live 3");
    }

    #[test]
    fn findings_read_as_before() {
        let d = Finding::Duplicate {
            key: key(1),
            provider: Provider::Bank,
            effects: 2,
        };
        assert_eq!(
            (d.check().name(), d.to_string()),
            ("duplicate", "2 effects at bank".into())
        );
        let l = Finding::LostUnsettled {
            key: key(1),
            status: Status::FailedRetryable,
        };
        assert_eq!(l.to_string(), "status failed_retryable, no open review");
        assert_eq!(Finding::NotEnqueued { intents: 3 }.key(), None);
    }
}
