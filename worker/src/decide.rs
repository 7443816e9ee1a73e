//! From a provider's answer to a journal verdict (the classification table in
//! `docs/architecture.md`),
//! and from a not-claimed row to what to do with the delivery.
//!
//! Pure functions, so the rules are unit-tested without a broker or a database.

use crate::provider::{Capabilities, Outcome, Remote};
use chrono::{DateTime, Utc};
use oncely_core::config::{ActionPolicy, OnUnknown};
use oncely_core::journal::{NotClaimed, Verdict};
use std::time::Duration;

/// The longest a not-sent retry waits.
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(3600);

/// How long a throttled attempt waits when the provider did not say (no `Retry-After`).
pub const DEFAULT_THROTTLE_WAIT: Duration = Duration::from_secs(1);

/// The journal verdict for an execute outcome under `policy`; `attempt` counts the
/// attempts *spent* (a throttled one is not: [`oncely_core::journal::Claim::throttled`]).
pub fn verdict(outcome: Outcome, attempt: i32, policy: &ActionPolicy) -> Verdict {
    match outcome {
        Outcome::Succeeded {
            provider_operation_id,
            result,
        } => Verdict::Succeeded {
            provider_operation_id,
            result,
        },
        Outcome::Rejected { code } => Verdict::FailedFinal { error_code: code },
        Outcome::InFlight => Verdict::Unknown {
            error_code: "provider_in_flight".into(),
            check_in: Duration::ZERO,
        },
        Outcome::Unknown { code } => Verdict::Unknown {
            error_code: code,
            check_in: Duration::ZERO,
        },
        // Never against max_attempts: the provider did nothing. Its patience is max_defer.
        Outcome::Throttled { code, retry_after } => Verdict::Deferred {
            error_code: format!("throttled:{code}"),
            retry_in: retry_after.unwrap_or(DEFAULT_THROTTLE_WAIT),
        },
        Outcome::NotSent { code } if attempt >= policy.max_attempts => Verdict::FailedFinal {
            error_code: format!("attempts_exhausted:{code}"),
        },
        Outcome::NotSent { code } => Verdict::FailedRetryable {
            error_code: code,
            retry_in: retry_delay(policy.retry_delay, attempt),
        },
    }
}

/// A bounded metric label for an outcome.
pub fn outcome_label(o: &Outcome) -> &'static str {
    match o {
        Outcome::Succeeded { .. } => "succeeded",
        Outcome::Rejected { .. } => "rejected",
        Outcome::InFlight => "in_flight",
        Outcome::NotSent { .. } => "not_sent",
        Outcome::Throttled { .. } => "throttled",
        Outcome::Unknown { .. } => "unknown",
    }
}

/// `base * 2^(attempt-1)`, capped at [`MAX_RETRY_DELAY`].
pub fn retry_delay(base: Duration, attempt: i32) -> Duration {
    let exp = attempt.clamp(1, 20) as u32 - 1;
    base.saturating_mul(1u32 << exp).min(MAX_RETRY_DELAY)
}

/// May a provider's "absent" answer for an unknown send it back to execution? `Ok(())`
/// when the policy retries absent operations and the absence can be trusted — the
/// provider honours the key and the first attempt is still inside its key retention
/// (less one lease, so the retry lands inside it too), or the provider's absence is
/// authoritative. Otherwise the reason a person must decide.
pub fn absent_retry_allowed(
    policy: &ActionPolicy,
    caps: &Capabilities,
    first_attempt_at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Result<(), &'static str> {
    let within_retention = caps.honours_key
        && match (caps.key_retention, first_attempt_at) {
            (Some(retention), Some(first)) => {
                let spare = chrono::Duration::from_std(retention.saturating_sub(policy.lease))
                    .unwrap_or_default();
                first + spare > now
            }
            _ => false,
        };
    match policy.on_unknown {
        OnUnknown::ReconcileThenRetryIfAbsent if within_retention || caps.absence_authoritative => {
            Ok(())
        }
        OnUnknown::ReconcileThenReview => Err("absent_policy_requires_review"),
        _ => Err("absent_outside_key_retention"),
    }
}

/// What a background re-check of a review does with the lookup's answer. A re-check
/// only looks up: it never sends the operation back to execution, so an absence (even
/// one the policy would retry) is for a person.
#[derive(Debug, Clone, PartialEq)]
pub enum Recheck {
    /// The provider settled it: apply this verdict from `unknown` (event reason given;
    /// the review closes itself as `auto:lookup`).
    Settle(Verdict, &'static str),
    /// Still no answer (pending, lookup failing): look again later.
    Again,
    /// No lookup will settle it after all: stop re-checking, a person decides.
    Stop(&'static str),
}

/// The re-check rule (docs/reconcile.md, "What reaches a person").
pub fn recheck(remote: Remote) -> Recheck {
    match remote {
        Remote::Succeeded {
            provider_operation_id,
            result,
        } => Recheck::Settle(
            Verdict::Succeeded {
                provider_operation_id,
                result,
            },
            "reconcile_found_succeeded",
        ),
        Remote::Rejected { code } => Recheck::Settle(
            Verdict::FailedFinal { error_code: code },
            "reconcile_found_rejected",
        ),
        Remote::Pending => Recheck::Again,
        Remote::Failed { code } if oncely_core::review::lookup_failure_is_conflict(&code) => {
            Recheck::Stop("conflicting_evidence")
        }
        Remote::Failed { .. } => Recheck::Again,
        Remote::Absent => Recheck::Stop("absent"),
        Remote::Unsupported => Recheck::Stop("lookup_unsupported"),
    }
}

/// What to do with a delivery whose operation was not claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Ack: the journal already says who owns it (metric verdict given).
    Ack(&'static str),
    /// Ack, record the conflict and publish a `conflict` outcome.
    Conflict,
    /// Nack with requeue: it may be claimable on the next delivery.
    Requeue,
    /// Its `expires_at` passed before it started: make it `expired` (never sent), ack.
    Expire,
}

/// Decide without calling anyone (`docs/architecture.md`, "Execute", step 3).
pub fn disposition(why: NotClaimed) -> Disposition {
    match why {
        NotClaimed::Terminal => Disposition::Ack("duplicate"),
        NotClaimed::LeaseLive => Disposition::Ack("in_flight"),
        // The sweeper turns it into unknown; the reconciler owns it from there.
        NotClaimed::LeaseExpired => Disposition::Ack("lease_expired"),
        NotClaimed::Unknown => Disposition::Ack("unknown"),
        // The sweeper republishes it when due.
        NotClaimed::NotDue => Disposition::Ack("not_due"),
        NotClaimed::Conflict => Disposition::Conflict,
        NotClaimed::Raced => Disposition::Requeue,
        // Published again when approved.
        NotClaimed::Held => Disposition::Ack("held"),
        NotClaimed::Expired => Disposition::Expire,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncely_core::config::OnUnknown;
    use serde_json::json;

    fn policy() -> ActionPolicy {
        ActionPolicy {
            provider: "p".into(),
            lease: Duration::from_secs(60),
            max_attempts: 3,
            retry_delay: Duration::from_secs(2),
            on_unknown: OnUnknown::ReconcileThenReview,
            max_reconcile_checks: 5,
            ..ActionPolicy::new("p")
        }
    }

    #[test]
    fn a_recheck_settles_on_a_definite_answer_and_never_executes() {
        let found = recheck(Remote::Succeeded {
            provider_operation_id: "po_1".into(),
            result: json!({}),
        });
        assert!(matches!(
            found,
            Recheck::Settle(Verdict::Succeeded { .. }, "reconcile_found_succeeded")
        ));
        let rejected = recheck(Remote::Rejected {
            code: "remote_rejected".into(),
        });
        assert!(matches!(
            rejected,
            Recheck::Settle(Verdict::FailedFinal { .. }, "reconcile_found_rejected")
        ));
        let failed = |code: &str| {
            recheck(Remote::Failed {
                code: code.to_owned(),
            })
        };
        assert_eq!(recheck(Remote::Pending), Recheck::Again);
        assert_eq!(failed("http_503"), Recheck::Again);
        assert_eq!(failed("timeout"), Recheck::Again);
        assert_eq!(
            failed("key_mismatch"),
            Recheck::Stop("conflicting_evidence")
        );
        assert_eq!(recheck(Remote::Absent), Recheck::Stop("absent"));
        assert_eq!(
            recheck(Remote::Unsupported),
            Recheck::Stop("lookup_unsupported")
        );
    }

    #[test]
    fn the_classification_table() {
        let p = policy();
        assert!(matches!(
            verdict(
                Outcome::Succeeded {
                    provider_operation_id: "x".into(),
                    result: json!({})
                },
                1,
                &p
            ),
            Verdict::Succeeded { .. }
        ));
        assert!(matches!(
            verdict(
                Outcome::Rejected {
                    code: "http_422".into()
                },
                1,
                &p
            ),
            Verdict::FailedFinal { .. }
        ));
        assert!(matches!(
            verdict(Outcome::InFlight, 1, &p),
            Verdict::Unknown { .. }
        ));
        assert!(matches!(
            verdict(
                Outcome::Unknown {
                    code: "timeout".into()
                },
                1,
                &p
            ),
            Verdict::Unknown { .. }
        ));
        assert_eq!(
            verdict(
                Outcome::NotSent {
                    code: "connect_failed".into()
                },
                2,
                &p
            ),
            Verdict::FailedRetryable {
                error_code: "connect_failed".into(),
                retry_in: Duration::from_secs(4)
            }
        );
        assert_eq!(
            verdict(
                Outcome::NotSent {
                    code: "http_408".into()
                },
                3,
                &p
            ),
            Verdict::FailedFinal {
                error_code: "attempts_exhausted:http_408".into()
            }
        );
    }

    #[test]
    fn a_throttle_is_deferred_whatever_the_attempts() {
        let p = policy();
        let throttled = |retry_after| Outcome::Throttled {
            code: "http_429".into(),
            retry_after,
        };
        // Past max_attempts (3) it is still deferred, never attempts_exhausted.
        assert_eq!(
            verdict(throttled(Some(Duration::from_secs(30))), 7, &p),
            Verdict::Deferred {
                error_code: "throttled:http_429".into(),
                retry_in: Duration::from_secs(30)
            }
        );
        assert_eq!(
            verdict(throttled(None), 1, &p),
            Verdict::Deferred {
                error_code: "throttled:http_429".into(),
                retry_in: DEFAULT_THROTTLE_WAIT
            }
        );
    }

    #[test]
    fn retry_delay_doubles_and_caps() {
        assert_eq!(
            retry_delay(Duration::from_secs(1), 1),
            Duration::from_secs(1)
        );
        assert_eq!(
            retry_delay(Duration::from_secs(1), 4),
            Duration::from_secs(8)
        );
        assert_eq!(retry_delay(Duration::from_secs(1), 1000), MAX_RETRY_DELAY);
    }

    #[test]
    fn unclaimed_deliveries_never_call_anyone() {
        for why in [
            NotClaimed::Terminal,
            NotClaimed::LeaseLive,
            NotClaimed::LeaseExpired,
            NotClaimed::Unknown,
            NotClaimed::NotDue,
        ] {
            assert!(matches!(disposition(why), Disposition::Ack(_)), "{why:?}");
        }
        assert_eq!(disposition(NotClaimed::Conflict), Disposition::Conflict);
        assert_eq!(disposition(NotClaimed::Raced), Disposition::Requeue);
    }

    #[test]
    fn absence_sends_back_to_execution_only_when_it_can_be_trusted() {
        use crate::provider::Capabilities;
        let now = chrono::Utc::now();
        let caps = |honours_key, retention_h: Option<u64>, authoritative| Capabilities {
            honours_key,
            key_retention: retention_h.map(|h| Duration::from_secs(h * 3600)),
            lookup: true,
            absence_authoritative: authoritative,
        };
        let with = |on_unknown| ActionPolicy {
            on_unknown,
            ..policy()
        };
        let retry = with(OnUnknown::ReconcileThenRetryIfAbsent);
        let review = with(OnUnknown::ReconcileThenReview);
        let hour_ago = Some(now - chrono::Duration::hours(1));
        let two_days_ago = Some(now - chrono::Duration::hours(48));
        // (policy, capabilities, first attempt) → allowed or the review reason
        let table: Vec<(&ActionPolicy, Capabilities, _, Result<(), &str>)> = vec![
            (&retry, caps(true, Some(24), false), hour_ago, Ok(())),
            (
                &retry,
                caps(true, Some(24), false),
                two_days_ago,
                Err("absent_outside_key_retention"),
            ),
            (
                &retry,
                caps(true, None, false),
                hour_ago,
                Err("absent_outside_key_retention"),
            ),
            (
                &retry,
                caps(false, Some(24), false),
                hour_ago,
                Err("absent_outside_key_retention"),
            ),
            (
                &retry,
                caps(true, Some(24), false),
                None,
                Err("absent_outside_key_retention"),
            ),
            (&retry, caps(false, None, true), two_days_ago, Ok(())),
            (
                &review,
                caps(true, Some(24), true),
                hour_ago,
                Err("absent_policy_requires_review"),
            ),
        ];
        for (i, (policy, caps, first, want)) in table.into_iter().enumerate() {
            assert_eq!(
                absent_retry_allowed(policy, &caps, first, now),
                want,
                "row {i}"
            );
        }
        // The retention is counted less one lease, so the retry still lands inside it.
        let edge = Some(now - chrono::Duration::hours(24) + chrono::Duration::seconds(30));
        assert_eq!(
            absent_retry_allowed(&retry, &caps(true, Some(24), false), edge, now),
            Err("absent_outside_key_retention")
        );
    }
}
