//! Why an operation went to review, whether one more lookup could still settle it, and
//! the evidence a review keeps — the one place the reasons are classified.
//!
//! A review stops automation for its key, and before this module every review waited
//! for a person, even one opened because a provider's lookup API was down for a minute:
//! one more lookup would have settled it. So each reason is either
//!
//! - [`ReviewClass::Transient`]: the provider could not answer *yet* (its lookup failed
//!   with a 5xx, timed out, was unreachable, or said "pending"). The reconciler keeps
//!   looking the operation up in the background, with a growing delay, and the review
//!   closes itself (`auto:lookup`, `auto:late_answer`, `auto:statement`) once something
//!   settles the operation; or
//! - [`ReviewClass::Definitive`]: no lookup will ever settle it — an absence the policy
//!   will not retry, a provider past its key retention, a provider without a lookup,
//!   evidence that contradicts itself (a record echoing another key), a payload nobody
//!   can open, a policy that always asks a person. Those wait for a person.
//!
//! An unknown reason (a row written by a newer version) is definitive: when in doubt, a
//! person decides. The reason is stored as text (`operation_reviews.reason`); the
//! classification is never stored, so it can only be computed here.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Lookup failure codes that are contradicting evidence rather than a provider that could
/// not answer: a record echoing another key (`key_mismatch`, `reference_other_key`), a
/// record found by reference that does not say whose it is (`reference_unverified`), and a
/// lookup request that cannot even be built (`invalid_request`). Asking again returns the
/// same record.
pub const CONFLICTING_LOOKUP_CODES: &[&str] = &[
    "key_mismatch",
    "reference_other_key",
    "reference_unverified",
    "invalid_request",
];

/// Whether a failed lookup's code is contradicting evidence (see
/// [`CONFLICTING_LOOKUP_CODES`]) rather than a provider that could not answer yet.
pub fn lookup_failure_is_conflict(code: &str) -> bool {
    CONFLICTING_LOOKUP_CODES.contains(&code)
}

/// Why a review was opened. Stored as its [`fmt::Display`] text; read back with
/// [`ReviewReason::parse`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReviewReason {
    /// The provider kept saying "pending" for all the policy's checks.
    StillPending,
    /// The lookup kept failing (5xx, timeout, unreachable, unparsable) for all the
    /// policy's checks: `lookup_failing:<code>`.
    LookupFailing(String),
    /// The lookup answered with a record that contradicts the operation:
    /// `conflicting_evidence:<code>` (one of [`CONFLICTING_LOOKUP_CODES`]).
    ConflictingEvidence(String),
    /// The provider offers no lookup.
    LookupUnsupported,
    /// Absent, and the first attempt is past the provider's key retention (or the
    /// provider does not honour keys): a retry could execute twice.
    AbsentOutsideKeyRetention,
    /// Absent, and the policy (money) never retries without a positive lookup.
    AbsentPolicyRequiresReview,
    /// The policy sends every unknown to a person.
    PolicyRequiresReview,
    /// No policy is configured for the action type.
    NoPolicyForActionType,
    /// The stored action type does not parse.
    InvalidActionType,
    /// The payload is gone (a broken row).
    PayloadMissing,
    /// The payload is sealed with a data key this process does not hold.
    PayloadKeyUnknown,
    /// The sealed payload does not open (altered).
    PayloadUnreadable,
    /// A reason this version does not know.
    Other(String),
}

/// Whether one more lookup could settle a review (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReviewClass {
    /// The provider could not answer yet: re-checked in the background.
    Transient,
    /// No lookup will settle it: a person decides.
    Definitive,
}

impl ReviewClass {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            ReviewClass::Transient => "transient",
            ReviewClass::Definitive => "definitive",
        }
    }
}

impl ReviewReason {
    /// Every label [`ReviewReason::label`] can return (to create metric series at 0).
    pub const LABELS: &'static [&'static str] = &[
        "still_pending",
        "lookup_failing",
        "conflicting_evidence",
        "lookup_unsupported",
        "absent_outside_key_retention",
        "absent_policy_requires_review",
        "policy_requires_review",
        "no_policy_for_action_type",
        "invalid_action_type",
        "payload_missing",
        "payload_key_unknown",
        "payload_unreadable",
        "other",
    ];

    /// The reason of a lookup that kept failing with `code`: conflicting evidence or a
    /// provider that could not answer.
    pub fn lookup_failed(code: &str) -> Self {
        if lookup_failure_is_conflict(code) {
            ReviewReason::ConflictingEvidence(code.to_owned())
        } else {
            ReviewReason::LookupFailing(code.to_owned())
        }
    }

    /// Reads a stored reason. Total: text it does not know is [`ReviewReason::Other`].
    pub fn parse(text: &str) -> Self {
        if let Some(code) = text.strip_prefix("lookup_failing:") {
            return ReviewReason::lookup_failed(code);
        }
        if let Some(code) = text.strip_prefix("conflicting_evidence:") {
            return ReviewReason::ConflictingEvidence(code.to_owned());
        }
        match text {
            "still_pending" => ReviewReason::StillPending,
            "lookup_unsupported" => ReviewReason::LookupUnsupported,
            "absent_outside_key_retention" => ReviewReason::AbsentOutsideKeyRetention,
            "absent_policy_requires_review" => ReviewReason::AbsentPolicyRequiresReview,
            "policy_requires_review" => ReviewReason::PolicyRequiresReview,
            "no_policy_for_action_type" => ReviewReason::NoPolicyForActionType,
            "invalid_action_type" => ReviewReason::InvalidActionType,
            "payload_missing" => ReviewReason::PayloadMissing,
            "payload_key_unknown" => ReviewReason::PayloadKeyUnknown,
            "payload_unreadable" => ReviewReason::PayloadUnreadable,
            other => ReviewReason::Other(other.to_owned()),
        }
    }

    /// Whether one more lookup could settle it. The one classification (module docs).
    pub fn class(&self) -> ReviewClass {
        match self {
            ReviewReason::StillPending | ReviewReason::LookupFailing(_) => ReviewClass::Transient,
            ReviewReason::ConflictingEvidence(_)
            | ReviewReason::LookupUnsupported
            | ReviewReason::AbsentOutsideKeyRetention
            | ReviewReason::AbsentPolicyRequiresReview
            | ReviewReason::PolicyRequiresReview
            | ReviewReason::NoPolicyForActionType
            | ReviewReason::InvalidActionType
            | ReviewReason::PayloadMissing
            | ReviewReason::PayloadKeyUnknown
            | ReviewReason::PayloadUnreadable
            | ReviewReason::Other(_) => ReviewClass::Definitive,
        }
    }

    /// A bounded metric label (the reason without its lookup code).
    pub fn label(&self) -> &'static str {
        match self {
            ReviewReason::StillPending => "still_pending",
            ReviewReason::LookupFailing(_) => "lookup_failing",
            ReviewReason::ConflictingEvidence(_) => "conflicting_evidence",
            ReviewReason::LookupUnsupported => "lookup_unsupported",
            ReviewReason::AbsentOutsideKeyRetention => "absent_outside_key_retention",
            ReviewReason::AbsentPolicyRequiresReview => "absent_policy_requires_review",
            ReviewReason::PolicyRequiresReview => "policy_requires_review",
            ReviewReason::NoPolicyForActionType => "no_policy_for_action_type",
            ReviewReason::InvalidActionType => "invalid_action_type",
            ReviewReason::PayloadMissing => "payload_missing",
            ReviewReason::PayloadKeyUnknown => "payload_key_unknown",
            ReviewReason::PayloadUnreadable => "payload_unreadable",
            ReviewReason::Other(_) => "other",
        }
    }
}

impl fmt::Display for ReviewReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReviewReason::LookupFailing(code) => write!(f, "lookup_failing:{code}"),
            ReviewReason::ConflictingEvidence(code) => write!(f, "conflicting_evidence:{code}"),
            ReviewReason::Other(text) => f.write_str(text),
            other => f.write_str(other.label()),
        }
    }
}

/// How a review was closed without a person: the `auto:<how>` resolution the database
/// writes when something else settles the operation (migration
/// `20261209000000_review_evidence.sql`, trigger `agent_operations_update_reviews`).
pub const AUTO_RESOLUTIONS: &[&str] = &["auto:lookup", "auto:late_answer", "auto:statement"];

/// What a review knows: the evidence a person (or the next re-check) decides with.
/// Stored as `operation_reviews.evidence` (jsonb); lookups are appended on each re-check.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    /// The action's `on_unknown` policy that sent it here (`reconcile_then_review`, …),
    /// when the action type has a policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// The policy's `max_reconcile_checks`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_reconcile_checks: Option<i32>,
    /// The provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Whether the provider deduplicates by our key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub honours_key: Option<bool>,
    /// How long the provider remembers keys, in seconds (`None`: not configured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_retention_secs: Option<u64>,
    /// The operation's attempts when the review opened.
    #[serde(default)]
    pub attempts: i32,
    /// Reconcile checks (lookups) made before the review opened.
    #[serde(default)]
    pub checks_before_review: i32,
    /// The lookups: the one that opened the review, then one per re-check.
    #[serde(default)]
    pub lookups: Vec<Lookup>,
}

/// One lookup a review saw.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Lookup {
    /// When (database clock).
    pub at: DateTime<Utc>,
    /// What it answered: `succeeded`, `rejected`, `pending`, `absent`, `unsupported`,
    /// `failed`.
    pub answer: String,
    /// The answer's code (`http_503`, `remote_rejected`, the provider's id when found).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_classification_table() {
        use ReviewClass::*;
        let cases = [
            ("still_pending", Transient),
            ("lookup_failing:http_503", Transient),
            ("lookup_failing:timeout", Transient),
            ("lookup_failing:connect_failed", Transient),
            ("lookup_failing:unparsable_body", Transient),
            ("lookup_failing:key_mismatch", Definitive),
            ("lookup_failing:reference_other_key", Definitive),
            ("conflicting_evidence:reference_unverified", Definitive),
            ("lookup_unsupported", Definitive),
            ("absent_outside_key_retention", Definitive),
            ("absent_policy_requires_review", Definitive),
            ("policy_requires_review", Definitive),
            ("no_policy_for_action_type", Definitive),
            ("invalid_action_type", Definitive),
            ("payload_missing", Definitive),
            ("payload_key_unknown", Definitive),
            ("payload_unreadable", Definitive),
            ("something_new", Definitive),
        ];
        for (text, class) in cases {
            assert_eq!(ReviewReason::parse(text).class(), class, "{text}");
        }
    }

    #[test]
    fn reasons_read_back_as_written_and_labels_are_bounded() {
        let reasons = [
            ReviewReason::StillPending,
            ReviewReason::LookupFailing("http_503".into()),
            ReviewReason::ConflictingEvidence("key_mismatch".into()),
            ReviewReason::LookupUnsupported,
            ReviewReason::AbsentOutsideKeyRetention,
            ReviewReason::AbsentPolicyRequiresReview,
            ReviewReason::PolicyRequiresReview,
            ReviewReason::NoPolicyForActionType,
            ReviewReason::InvalidActionType,
            ReviewReason::PayloadMissing,
            ReviewReason::PayloadKeyUnknown,
            ReviewReason::PayloadUnreadable,
            ReviewReason::Other("x".into()),
        ];
        for r in &reasons {
            assert_eq!(&ReviewReason::parse(&r.to_string()), r, "{r}");
            assert!(ReviewReason::LABELS.contains(&r.label()), "{r}");
        }
        assert_eq!(reasons.len(), ReviewReason::LABELS.len());
    }

    #[test]
    fn a_conflicting_lookup_failure_is_named_for_what_it_is() {
        assert_eq!(
            ReviewReason::lookup_failed("reference_other_key").to_string(),
            "conflicting_evidence:reference_other_key"
        );
        assert_eq!(
            ReviewReason::lookup_failed("http_503").to_string(),
            "lookup_failing:http_503"
        );
    }
}
