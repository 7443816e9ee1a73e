//! The journal's row type, its event type, and its error.

use crate::keys::IdempotencyKey;
use crate::sealing::{DataKeys, SealError, Sealed};
use crate::status::Status;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::{FromRow, Row};

/// One operation (a row of `agent_operations`), as read with the database's clock.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Operation {
    /// The idempotency key.
    pub key: IdempotencyKey,
    /// The action type.
    pub action_type: String,
    /// The tenant, if any.
    pub tenant: Option<String>,
    /// The workflow.
    pub workflow_id: String,
    /// The step.
    pub step: String,
    /// The business object.
    pub business_object: String,
    /// The revision.
    pub revision: i64,
    /// `sha256:…` of the payload.
    pub payload_hash: String,
    /// The payload in plain text, while the operation is live (NULL once terminal, and
    /// NULL when the fleet seals payloads: see `sealed_payload`).
    #[serde(skip)]
    pub payload: Option<Value>,
    /// The sealed payload, while the operation is live, when the fleet seals payloads
    /// (never serialized: ciphertext is of no use outside the journal).
    #[serde(skip)]
    pub sealed_payload: Option<Sealed>,
    /// The status.
    pub status: Status,
    /// Attempts so far (the fencing token).
    pub attempt_count: i32,
    /// The provider's id for the effect.
    pub provider_operation_id: Option<String>,
    /// The saved result.
    pub result_json: Option<Value>,
    /// The last error code.
    pub last_error_code: Option<String>,
    /// When the next thing is due for this operation; what that is depends on the status.
    /// This is the one place that says so (the column's SQL comment points here):
    ///
    /// | status | `lease_until` means | set by | acted on by |
    /// | --- | --- | --- | --- |
    /// | `executing` | end of the worker's lease: nobody else may act before it | the claim (`now() + lease`) | the sweeper, after it: → `unknown` (never a re-claim) |
    /// | `failed_retryable` | not before: the earliest time of the next attempt | the completion (`now() + retry_in`), a review's `retry` (`now()`) | the claim (refused before it); the sweeper republishes after it |
    /// | `unknown` | next reconcile check | the sweeper's expiry (`now()`), a completion (`now() + check_in`), each check (`now() + check_lease`), a deferral (`now() + delay`) | the reconciler takes it only once due; the sweeper re-checks it when overdue by `stale_unknown_after` |
    /// | `deferred` | due: not before (the provider's `Retry-After`, or the slot the fleet's budget gives it) | a claim with no slot (`now() + wait`), a throttled completion (`now() + retry_after`) | the claim (refused before it); the sweeper's deferred pass republishes it after it, or gives it up after `max_defer` |
    /// | `planned`, `succeeded`, `failed_final` | nothing: always `NULL` (a database constraint) | — | — |
    ///
    /// All times are the database's clock. One index, `(status, lease_until)`, serves
    /// every sweep because of this.
    pub lease_until: Option<DateTime<Utc>>,
    /// The worker holding the lease.
    pub lease_owner: Option<String>,
    /// When the first attempt started.
    pub first_attempt_at: Option<DateTime<Utc>>,
    /// How many times the reconciler asked the provider.
    pub reconcile_checks: i32,
    /// Who made the last transition.
    pub last_actor: String,
    /// Why.
    pub last_reason: String,
    /// Created.
    pub created_at: DateTime<Utc>,
    /// Last changed.
    pub updated_at: DateTime<Utc>,
    /// `lease_until > now()` by the database's clock at read time.
    pub lease_live: bool,
    /// The database's clock when this row was read.
    pub read_at: DateTime<Utc>,
    /// Not started by then → `expired` (docs/approvals.md).
    pub expires_at: Option<DateTime<Utc>>,
    /// Delivered no earlier than this (a scheduled operation).
    pub not_before: Option<DateTime<Utc>>,
    /// The approval rule that held it (`None`: not held).
    pub hold_rule: Option<String>,
    /// How many different people must approve it.
    pub approvals_needed: i16,
    /// A held operation still undecided then ends `rejected` (`approval_timed_out`).
    pub approval_deadline: Option<DateTime<Utc>>,
    /// When its last needed approval came.
    pub approved_at: Option<DateTime<Utc>>,
    /// Who asked for it (a token id or the SDK's actor): never its approver.
    pub requested_by: Option<String>,
}

/// `SELECT <every column> FROM agent_operations <rest>` as a static string (sqlx wants
/// SQL it can see is not built from input), with `lease_live` computed by the server.
macro_rules! select_operations {
    ($rest:literal) => {
        concat!("SELECT idempotency_key, action_type, tenant, workflow_id, step, business_object, revision, \
     payload_hash, payload, payload_sealed, payload_key_id, status, attempt_count, provider_operation_id, result_json, last_error_code, \
     lease_until, lease_owner, first_attempt_at, reconcile_checks, last_actor, last_reason, created_at, updated_at, \
     coalesce(lease_until > now(), false) AS lease_live, now() AS read_at, \
     expires_at, not_before, hold_rule, approvals_needed, approval_deadline, approved_at, requested_by FROM agent_operations ", $rest)
    };
}
pub(crate) use select_operations;

/// The rows whose business identity is one of `$2…$7` (arrays: workflows, steps,
/// objects, revisions, action types, tenants) under a key other than the one asked
/// (`$1`, returned as `asked_key`); the identity index serves it. Without the payload,
/// like [`select_operations_without_payload!`]: the producer reads it too.
macro_rules! select_operations_by_identity {
    () => {
        "SELECT o.idempotency_key, o.action_type, o.tenant, o.workflow_id, o.step, o.business_object, o.revision, \
     o.payload_hash, NULL::jsonb AS payload, NULL::bytea AS payload_sealed, NULL::text AS payload_key_id, o.status, o.attempt_count, o.provider_operation_id, \
     o.result_json, o.last_error_code, o.lease_until, o.lease_owner, o.first_attempt_at, o.reconcile_checks, \
     o.last_actor, o.last_reason, o.created_at, o.updated_at, \
     coalesce(o.lease_until > now(), false) AS lease_live, now() AS read_at, x.k AS asked_key, \
     o.expires_at, o.not_before, o.hold_rule, o.approvals_needed, o.approval_deadline, o.approved_at, o.requested_by \
     FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int8[], $6::text[], $7::text[]) \
          AS x(k, w, s, b, r, a, t) \
     JOIN agent_operations o ON o.workflow_id = x.w AND o.step = x.s AND o.business_object = x.b \
          AND o.revision = x.r AND o.action_type = x.a AND coalesce(o.tenant, '') = coalesce(x.t, '') \
     WHERE o.idempotency_key <> x.k"
    };
}
pub(crate) use select_operations_by_identity;

/// [`select_operations!`] with every payload column read as `NULL`: what the producer
/// and the gateway read (duplicates, status, waits). Their database role may not read
/// payloads (docs/security.md, "Least privilege"), and they never need one back: they wrote it. The
/// sealed payload's columns (`payload_sealed`, `payload_key_id`, added by their own
/// migration) are `NULL` too, so the row decodes the same before and after it.
/// Keep the other columns in step with [`select_operations!`].
macro_rules! select_operations_without_payload {
    ($rest:literal) => {
        concat!("SELECT idempotency_key, action_type, tenant, workflow_id, step, business_object, revision, \
     payload_hash, NULL::jsonb AS payload, NULL::bytea AS payload_sealed, NULL::text AS payload_key_id, \
     status, attempt_count, provider_operation_id, result_json, last_error_code, \
     lease_until, lease_owner, first_attempt_at, reconcile_checks, last_actor, last_reason, created_at, updated_at, \
     coalesce(lease_until > now(), false) AS lease_live, now() AS read_at, \
     expires_at, not_before, hold_rule, approvals_needed, approval_deadline, approved_at, requested_by FROM agent_operations ", $rest)
    };
}
pub(crate) use select_operations_without_payload;

fn decode<T: std::fmt::Display>(col: &str, e: T) -> sqlx::Error {
    sqlx::Error::ColumnDecode {
        index: col.into(),
        source: e.to_string().into(),
    }
}

impl<'r> FromRow<'r, PgRow> for Operation {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        let key: String = row.try_get("idempotency_key")?;
        let status: String = row.try_get("status")?;
        Ok(Self {
            key: IdempotencyKey::parse(&key).map_err(|e| decode("idempotency_key", e))?,
            action_type: row.try_get("action_type")?,
            tenant: row.try_get("tenant")?,
            workflow_id: row.try_get("workflow_id")?,
            step: row.try_get("step")?,
            business_object: row.try_get("business_object")?,
            revision: row.try_get("revision")?,
            payload_hash: row.try_get("payload_hash")?,
            payload: row.try_get("payload")?,
            sealed_payload: match (
                row.try_get::<Option<Vec<u8>>, _>("payload_sealed")?,
                row.try_get::<Option<String>, _>("payload_key_id")?,
            ) {
                (Some(bytes), Some(key_id)) => Some(Sealed { key_id, bytes }),
                _ => None,
            },
            status: status.parse().map_err(|e| decode("status", e))?,
            attempt_count: row.try_get("attempt_count")?,
            provider_operation_id: row.try_get("provider_operation_id")?,
            result_json: row.try_get("result_json")?,
            last_error_code: row.try_get("last_error_code")?,
            lease_until: row.try_get("lease_until")?,
            lease_owner: row.try_get("lease_owner")?,
            first_attempt_at: row.try_get("first_attempt_at")?,
            reconcile_checks: row.try_get("reconcile_checks")?,
            last_actor: row.try_get("last_actor")?,
            last_reason: row.try_get("last_reason")?,
            created_at: row.try_get("created_at")?,
            updated_at: row.try_get("updated_at")?,
            lease_live: row.try_get("lease_live")?,
            read_at: row.try_get("read_at")?,
            expires_at: row.try_get("expires_at")?,
            not_before: row.try_get("not_before")?,
            hold_rule: row.try_get("hold_rule")?,
            approvals_needed: row.try_get("approvals_needed")?,
            approval_deadline: row.try_get("approval_deadline")?,
            approved_at: row.try_get("approved_at")?,
            requested_by: row.try_get("requested_by")?,
        })
    }
}

impl Operation {
    /// The payload while it is held: in plain text, or opened with `keys` when sealed.
    pub fn open_payload(
        &self,
        keys: Option<&DataKeys>,
    ) -> Result<serde_json::Map<String, Value>, PayloadUnavailable> {
        match (&self.payload, &self.sealed_payload) {
            (Some(Value::Object(m)), _) => Ok(m.clone()),
            (_, Some(sealed)) => {
                let keys = keys.ok_or_else(|| PayloadUnavailable::NoKeys(sealed.key_id.clone()))?;
                keys.open(self.key.as_str(), sealed)
                    .map_err(PayloadUnavailable::Sealing)
            }
            _ => Err(PayloadUnavailable::Missing),
        }
    }

    /// Rebuild the envelope to (re)publish, while the payload is still held.
    pub fn envelope(
        &self,
        keys: Option<&DataKeys>,
    ) -> Result<crate::intent::Envelope, PayloadUnavailable> {
        use crate::identity::{ActionType, BusinessIdentity};
        let payload = self.open_payload(keys)?;
        let bad = |_| PayloadUnavailable::Missing;
        Ok(crate::intent::Envelope {
            key: self.key.clone(),
            payload_hash: crate::keys::PayloadHash::parse(&self.payload_hash).map_err(bad)?,
            intent: crate::intent::Intent {
                identity: BusinessIdentity {
                    action_type: ActionType::parse(&self.action_type)
                        .map_err(|_| PayloadUnavailable::Missing)?,
                    tenant: self.tenant.clone(),
                    workflow_id: self.workflow_id.clone(),
                    step: self.step.clone(),
                    business_object: self.business_object.clone(),
                    revision: self.revision,
                },
                payload,
            },
        })
    }
}

/// Why an operation's payload cannot be had; `reason()` is what a review records.
#[derive(Debug, thiserror::Error)]
pub enum PayloadUnavailable {
    /// The row holds no payload (terminal, or a broken row).
    #[error("the operation holds no payload")]
    Missing,
    /// The payload is sealed and this process holds no data keys.
    #[error(
        "the payload is sealed with data key {0:?} and this process has no ONCELY_DATA_KEYS_FILE"
    )]
    NoKeys(String),
    /// The payload does not open (unknown key id, altered).
    #[error("{0}")]
    Sealing(SealError),
}

impl PayloadUnavailable {
    /// A short code for reviews, logs and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Missing => "payload_missing",
            Self::NoKeys(_) | Self::Sealing(SealError::UnknownKey(_)) => "payload_key_unknown",
            Self::Sealing(_) => "payload_unreadable",
        }
    }
}

/// One row of the audit trail.
#[derive(Debug, Clone, PartialEq, Serialize, FromRow)]
pub struct Event {
    /// Sequence number.
    pub id: i64,
    /// The operation.
    pub idempotency_key: String,
    /// Status before (NULL for the row's creation).
    pub from_status: Option<String>,
    /// Status after.
    pub to_status: String,
    /// The attempt number after the move.
    pub attempt: i32,
    /// Who: a worker id, `reconciler@…`, `sweeper@…`, or a person.
    pub actor: String,
    /// Why: a reason code (`claim`, `provider_succeeded`, `lease_expired`, …).
    pub reason: String,
    /// The error code at the time, if any.
    pub error_code: Option<String>,
    /// The provider id at the time, if any.
    pub provider_operation_id: Option<String>,
    /// When (database clock).
    pub at: DateTime<Utc>,
}

/// What went wrong talking to the journal; [`JournalError::is_retryable`] is the decision.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The database could not be reached or dropped the connection: retry with backoff.
    #[error("journal unavailable (retryable): {0}")]
    Unavailable(#[source] sqlx::Error),
    /// The database refused the statement: a bug or a schema mismatch, not retryable.
    #[error("journal statement failed: {0}")]
    Database(#[source] sqlx::Error),
    /// The caller asked for a move the transition table does not have.
    #[error("transition {from} -> {to} does not exist")]
    InvalidTransition {
        /// From.
        from: String,
        /// To.
        to: Status,
    },
}

impl JournalError {
    /// Whether the same call may succeed later (connection trouble, not a refusal).
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable(_))
    }

    /// An insert met the business-identity index: the identity is recorded under
    /// another key (a rotated secret), or another process is inserting it under one.
    pub fn is_identity_clash(&self) -> bool {
        let (Self::Unavailable(sqlx::Error::Database(db))
        | Self::Database(sqlx::Error::Database(db))) = self
        else {
            return false;
        };
        db.constraint() == Some(IDENTITY_INDEX)
    }
}

/// The unique index over the business identity (see the migration that creates it).
pub const IDENTITY_INDEX: &str = "agent_operations_identity_idx";

impl From<sqlx::Error> for JournalError {
    fn from(e: sqlx::Error) -> Self {
        let transient = match &e {
            sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
            | sqlx::Error::Protocol(_) => true,
            // 08xxx connection exceptions, 57P01..03 admin/crash shutdown (pg_terminate_backend),
            // 53xxx insufficient resources, 40001/40P01 serialization failure / deadlock.
            sqlx::Error::Database(db) => db.code().is_some_and(|c| {
                c.starts_with("08")
                    || c.starts_with("57P")
                    || c.starts_with("53")
                    || c == "40001"
                    || c == "40P01"
                    // Two processes inserting one identity under keys of different
                    // secrets at once (mid-rotation): the retry meets the winner's row.
                    || (c == "23505" && db.constraint() == Some(IDENTITY_INDEX))
            }),
            _ => false,
        };
        if transient {
            Self::Unavailable(e)
        } else {
            Self::Database(e)
        }
    }
}
