//! Operation statuses and the one table of allowed transitions.
//!
//! ```text
//! planned ──claim──▶ executing ──▶ succeeded
//!                     │  ▲  ├────▶ failed_final
//!                     │  │  ├────▶ failed_retryable ──claim (when due)──▶ executing
//!                     │  │  └────▶ unknown ──▶ succeeded | failed_final | failed_retryable
//!  (lease expired) ───┘  │            (reconcile or review; never straight back to executing)
//!  (none) ──claim────────┘  (a message published without the SDK: the claim inserts the row)
//!
//! planned | failed_retryable | (none) ──no slot in the provider's budget──▶ deferred
//! executing ──throttled (429, 503 + Retry-After, SMTP 421/45x: nothing sent)──▶ deferred
//! deferred ──claim (when due)──▶ executing
//! deferred ──max_defer passed──▶ failed_final (deferred_too_long)
//!
//! (none) ──an approval rule matched──▶ awaiting_approval ──approved──▶ deferred (due now,
//!                                                     │             or at its not_before)
//!                                                     └─rejected / timed out──▶ rejected
//! (none) ──not_before in the future──▶ deferred (reason `scheduled`)
//! planned | awaiting_approval | failed_retryable | deferred ──cancel──▶ cancelled
//! planned | awaiting_approval | failed_retryable | deferred ──expires_at passed──▶ expired
//! ```
//!
//! `cancelled`, `expired` and `rejected` are terminal and were never sent: each is reached
//! only from a state in which no attempt is running and none sent anything, by a
//! compare-and-set on that state — so a cancel racing a claim is decided by the row lock,
//! and exactly one of them wins.
//!
//! Who moves rows: the producer inserts `planned`; a worker's claim moves `planned` /
//! due `failed_retryable` (or nothing) to `executing` and then commits the outcome; the
//! sweeper moves `executing` with an expired lease to `unknown`; the reconciler and
//! review move `unknown` on; a claim that finds no slot in the provider's budget, or a
//! commit of a throttled answer, moves a row to `deferred`, and the sweeper gives up on
//! one whose patience (`max_defer`) ran out. [`transition`] is the only place that says which moves
//! exist; the journal asks it before every write and the SQL compare-and-sets on the
//! expected status and attempt. The database enforces the status set (CHECK) and the
//! cross-column rules of each state (see `migrations/`).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The status of an operation (the `status` column).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Recorded by the producer; no attempt yet. Moved on by a worker's claim.
    Planned,
    /// One worker holds the lease and may be calling the provider now.
    Executing,
    /// The provider confirmed the effect. Terminal.
    Succeeded,
    /// Definitely not sent (or refused before acting); may be claimed again once due.
    FailedRetryable,
    /// The provider rejected it, or attempts ran out, or a person said so. Terminal.
    FailedFinal,
    /// The provider may or may not have acted. Only reconcile or review move it on.
    Unknown,
    /// Not sent, waiting for the provider's budget: it throttled us (the attempt is not
    /// spent) or the fleet had no slot for it. Claimed again once due; given up
    /// (`failed_final`, `deferred_too_long`) by the sweeper after `max_defer`.
    Deferred,
    /// Held by an approval rule: published to no worker until approved. Live (keeps its
    /// payload), never attempted.
    AwaitingApproval,
    /// A person rejected it, or its approval deadline passed. Terminal, never sent.
    Rejected,
    /// Cancelled before any attempt could send it. Terminal, never sent.
    Cancelled,
    /// Not started before its `expires_at`. Terminal, never sent.
    Expired,
}

impl Status {
    /// Every status, in the order of the status machine.
    pub const ALL: [Status; 11] = [
        Status::Planned,
        Status::Executing,
        Status::Succeeded,
        Status::FailedRetryable,
        Status::FailedFinal,
        Status::Unknown,
        Status::Deferred,
        Status::AwaitingApproval,
        Status::Rejected,
        Status::Cancelled,
        Status::Expired,
    ];

    /// The states a cancel or an expiry may end: nothing is running and nothing was sent
    /// (the database spelling, for `status IN (…)`).
    pub const STOPPABLE: [Status; 4] = [
        Status::Planned,
        Status::AwaitingApproval,
        Status::FailedRetryable,
        Status::Deferred,
    ];

    /// The database spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            Status::Planned => "planned",
            Status::Executing => "executing",
            Status::Succeeded => "succeeded",
            Status::FailedRetryable => "failed_retryable",
            Status::FailedFinal => "failed_final",
            Status::Unknown => "unknown",
            Status::Deferred => "deferred",
            Status::AwaitingApproval => "awaiting_approval",
            Status::Rejected => "rejected",
            Status::Cancelled => "cancelled",
            Status::Expired => "expired",
        }
    }

    /// Terminal statuses keep their result and lose their payload.
    pub const fn is_terminal(self) -> bool {
        matches!(
            self,
            Status::Succeeded
                | Status::FailedFinal
                | Status::Rejected
                | Status::Cancelled
                | Status::Expired
        )
    }

    /// Terminal and never sent: stopped before the provider was called (`rejected`,
    /// `cancelled`, `expired`).
    pub const fn is_stopped(self) -> bool {
        matches!(self, Status::Rejected | Status::Cancelled | Status::Expired)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unrecognised status string (from the database or a CLI flag).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown status {0:?}: expected one of planned, executing, succeeded, failed_retryable, failed_final, unknown, deferred, awaiting_approval, rejected, cancelled, expired"
)]
pub struct ParseStatusError(pub String);

impl FromStr for Status {
    type Err = ParseStatusError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Status::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| ParseStatusError(s.to_owned()))
    }
}

/// What kind of move a transition is; the reason recorded in its event is chosen from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Move {
    /// A new operation is recorded (`planned`).
    Record,
    /// A worker takes the lease (inserting the row if the producer did not).
    Claim,
    /// A worker commits the provider's answer.
    Complete,
    /// The sweeper declares an expired lease unknown.
    ExpireLease,
    /// The reconciler or a person settles an unknown.
    Settle,
    /// A claim finds no slot in the provider's budget: not sent, due later.
    Defer,
    /// The sweeper gives up on a deferred operation whose patience ran out.
    GiveUp,
    /// An approval rule holds a new operation.
    Hold,
    /// The last approval it needed came: due for a worker.
    Approve,
    /// A person rejected a held operation, or its deadline passed.
    Reject,
    /// The caller or an operator cancelled it before it was sent.
    Cancel,
    /// Its `expires_at` passed before it started.
    Expire,
}

/// The transition table: `Some(kind)` when `from → to` exists (`from = None` is a new row).
pub const fn transition(from: Option<Status>, to: Status) -> Option<Move> {
    use Status::*;
    match (from, to) {
        (None, Planned) => Some(Move::Record),
        (None | Some(Planned) | Some(FailedRetryable) | Some(Deferred), Executing) => {
            Some(Move::Claim)
        }
        (None | Some(Planned) | Some(FailedRetryable), Deferred) => Some(Move::Defer),
        (Some(Deferred), FailedFinal) => Some(Move::GiveUp),
        // A throttled answer (nothing sent) is a worker's verdict too.
        (Some(Executing), Succeeded | FailedFinal | FailedRetryable | Deferred) => {
            Some(Move::Complete)
        }
        // Unknown is both a worker's verdict and the sweeper's: the kind is the caller's.
        (Some(Executing), Unknown) => Some(Move::Complete),
        (Some(Unknown), Succeeded | FailedFinal | FailedRetryable) => Some(Move::Settle),
        (None, AwaitingApproval) => Some(Move::Hold),
        (Some(AwaitingApproval), Deferred) => Some(Move::Approve),
        (Some(AwaitingApproval), Rejected) => Some(Move::Reject),
        (Some(Planned | AwaitingApproval | FailedRetryable | Deferred), Cancelled) => {
            Some(Move::Cancel)
        }
        (Some(Planned | AwaitingApproval | FailedRetryable | Deferred), Expired) => {
            Some(Move::Expire)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for s in Status::ALL {
            assert_eq!(s.as_str().parse::<Status>(), Ok(s));
            assert_eq!(
                serde_json::to_value(s).expect("json"),
                serde_json::json!(s.as_str())
            );
        }
        assert!("done".parse::<Status>().is_err());
    }

    #[test]
    fn the_table_is_exactly_the_design() {
        use Status::*;
        let allowed: &[(Option<Status>, Status)] = &[
            (None, Planned),
            (None, Executing),
            (Some(Planned), Executing),
            (Some(FailedRetryable), Executing),
            (Some(Executing), Succeeded),
            (Some(Executing), FailedFinal),
            (Some(Executing), FailedRetryable),
            (Some(Executing), Unknown),
            (Some(Unknown), Succeeded),
            (Some(Unknown), FailedFinal),
            (Some(Unknown), FailedRetryable),
            (None, Deferred),
            (Some(Planned), Deferred),
            (Some(FailedRetryable), Deferred),
            (Some(Executing), Deferred),
            (Some(Deferred), Executing),
            (Some(Deferred), FailedFinal),
            (None, AwaitingApproval),
            (Some(AwaitingApproval), Deferred),
            (Some(AwaitingApproval), Rejected),
        ];
        let mut allowed = allowed.to_vec();
        for from in Status::STOPPABLE {
            allowed.push((Some(from), Cancelled));
            allowed.push((Some(from), Expired));
        }
        let froms = std::iter::once(None).chain(Status::ALL.into_iter().map(Some));
        for from in froms {
            for to in Status::ALL {
                assert_eq!(
                    transition(from, to).is_some(),
                    allowed.contains(&(from, to)),
                    "{from:?} -> {to:?}"
                );
            }
        }
        // The article's rules, spelled out: nothing leaves a terminal state, and an
        // unknown never goes straight back to execution.
        for to in Status::ALL {
            for from in Status::ALL.into_iter().filter(|s| s.is_terminal()) {
                assert!(transition(Some(from), to).is_none(), "{from:?} -> {to:?}");
            }
        }
        // A held operation reaches a worker only through an approval, and nothing that
        // may be running (or may have sent) can be cancelled or expired.
        assert!(transition(Some(AwaitingApproval), Executing).is_none());
        for from in [Executing, Unknown] {
            assert!(transition(Some(from), Cancelled).is_none());
            assert!(transition(Some(from), Expired).is_none());
        }
        assert!(transition(Some(Unknown), Executing).is_none());
        // A deferred operation was never sent: it never becomes unknown or succeeded
        // without a claim and a provider's answer.
        assert!(transition(Some(Deferred), Unknown).is_none());
        assert!(transition(Some(Deferred), Succeeded).is_none());
        assert!(transition(Some(Executing), Executing).is_none());
    }
}
