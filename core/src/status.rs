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
//! ```
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
}

impl Status {
    /// Every status, in the order of the status machine.
    pub const ALL: [Status; 7] = [
        Status::Planned,
        Status::Executing,
        Status::Succeeded,
        Status::FailedRetryable,
        Status::FailedFinal,
        Status::Unknown,
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
        }
    }

    /// Terminal statuses keep their result and lose their payload.
    pub const fn is_terminal(self) -> bool {
        matches!(self, Status::Succeeded | Status::FailedFinal)
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
    "unknown status {0:?}: expected one of planned, executing, succeeded, failed_retryable, failed_final, unknown, deferred"
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
        ];
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
            assert!(transition(Some(Succeeded), to).is_none());
            assert!(transition(Some(FailedFinal), to).is_none());
        }
        assert!(transition(Some(Unknown), Executing).is_none());
        // A deferred operation was never sent: it never becomes unknown or succeeded
        // without a claim and a provider's answer.
        assert!(transition(Some(Deferred), Unknown).is_none());
        assert!(transition(Some(Deferred), Succeeded).is_none());
        assert!(transition(Some(Executing), Executing).is_none());
    }
}
