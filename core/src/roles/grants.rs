//! What each process kind needs from Postgres, derived from the statements it runs.
//!
//! This table is the one source for both the grants `oncely-worker migrate --roles`
//! writes ([`super::sql`]) and the check every process makes when it starts
//! ([`super::check`]), so the two cannot drift. Each entry names the journal statements
//! that need it; a statement that starts reading or writing another column must add it
//! here, and the least-privilege test (`tests/tests/it/roles.rs`) fails until it does.
//!
//! Column lists may name columns a database does not have yet: a column is granted and
//! checked only where it exists. That is how the sealed-payload columns
//! (`payload_sealed`, `payload_key_id`, added by a migration of their own) are handled
//! before and after that migration alike.

use super::Process;

/// A table privilege.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Privilege {
    /// `SELECT` (also what `RETURNING`, `WHERE` and `ON CONFLICT … DO UPDATE` read).
    Select,
    /// `INSERT`.
    Insert,
    /// `UPDATE` (also what `SELECT … FOR UPDATE` needs on at least one column).
    Update,
    /// `DELETE` (table-level only in Postgres).
    Delete,
}

impl Privilege {
    /// The SQL keyword.
    pub fn as_sql(self) -> &'static str {
        match self {
            Privilege::Select => "SELECT",
            Privilege::Insert => "INSERT",
            Privilege::Update => "UPDATE",
            Privilege::Delete => "DELETE",
        }
    }
}

/// Which columns a table privilege covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Columns {
    /// The whole table (a table-level grant: new columns are covered too).
    Table,
    /// These columns, where they exist.
    Only(&'static [&'static str]),
    /// Every column the table has when the grants are written, except these.
    AllBut(&'static [&'static str]),
}

/// One privilege a process needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// A privilege on a table or on some of its columns.
    Table {
        /// The privilege.
        privilege: Privilege,
        /// The table.
        table: &'static str,
        /// The columns.
        columns: Columns,
    },
    /// `USAGE` on the sequence behind a serial column: inserting a row that takes its id
    /// from it calls `nextval`.
    Serial {
        /// The table.
        table: &'static str,
        /// Its serial column.
        column: &'static str,
    },
    /// `EXECUTE` on one of oncely's functions (where it exists): a `SECURITY DEFINER`
    /// function that is a narrow door to something the role may not read itself.
    Function {
        /// The function's name (`oncely_…`).
        name: &'static str,
        /// Its argument types, as `to_regprocedure` reads them (`text`).
        args: &'static str,
    },
}

const fn table(privilege: Privilege, table: &'static str, columns: Columns) -> Need {
    Need::Table {
        privilege,
        table,
        columns,
    }
}

use Columns::{AllBut, Only, Table};
use Privilege::{Delete, Insert, Select, Update};

/// The journal's main table.
pub const OPERATIONS: &str = "agent_operations";
/// The audit trail.
pub const EVENTS: &str = "operation_events";
/// Human reviews.
pub const REVIEWS: &str = "operation_reviews";
/// The gateway's `Idempotency-Key` header values.
pub const GATEWAY_REQUESTS: &str = "gateway_requests";
/// The fleet's budget per provider (journal/budget.rs).
pub const BUDGETS: &str = "provider_budgets";
/// Approvals and rejections of held operations (journal/control.rs).
pub const APPROVALS: &str = "operation_approvals";
/// sqlx's record of applied migrations (every process reads the schema version).
pub const MIGRATIONS: &str = "_sqlx_migrations";

/// The columns that hold an operation's payload: plain (`payload`) or sealed
/// (`payload_sealed` with its `payload_key_id`). The producer's role may not read them.
pub const PAYLOAD_COLUMNS: &[&str] = &["payload", "payload_sealed", "payload_key_id"];

/// The schema version check at every start (`db::check_schema`).
const SCHEMA_VERSION: Need = table(Select, MIGRATIONS, Table);

/// `record` (journal/record.rs): `INSERT … 'planned' … ON CONFLICT DO NOTHING`.
const RECORD_INSERT: &[&str] = &[
    "idempotency_key",
    "action_type",
    "tenant",
    "workflow_id",
    "step",
    "business_object",
    "revision",
    "payload_hash",
    "payload",
    "payload_sealed",
    "payload_key_id",
    "status",
    "last_actor",
    "last_reason",
    "lease_until",
    "deferred_since",
    "not_before",
    "expires_at",
    "hold_rule",
    "approvals_needed",
    "approval_deadline",
    "requested_by",
    "subject_hash",
];

/// The claim (journal/claim.rs): the columns its `INSERT` names.
const CLAIM_INSERT: &[&str] = &[
    "idempotency_key",
    "action_type",
    "tenant",
    "workflow_id",
    "step",
    "business_object",
    "revision",
    "payload_hash",
    "payload",
    "payload_sealed",
    "payload_key_id",
    "status",
    "attempt_count",
    "lease_until",
    "lease_owner",
    "first_attempt_at",
    "last_actor",
    "last_reason",
    "deferred_since",
    // A held delivery published without the SDK is recorded by the worker (held) before
    // its claim: the record's columns.
    "not_before",
    "expires_at",
    "hold_rule",
    "approvals_needed",
    "approval_deadline",
    "requested_by",
    "subject_hash",
];

/// The worker's updates: the claim's `ON CONFLICT DO UPDATE SET` and the completion
/// (journal/complete.rs). Not the identity, the hash, the reconcile count or the times
/// of creation: a worker cannot rewrite what an operation *is*.
const WORKER_UPDATE: &[&str] = &[
    "status",
    "attempt_count",
    "throttled_attempts",
    "deferred_since",
    "lease_until",
    "lease_owner",
    "first_attempt_at",
    "provider_operation_id",
    "result_json",
    "last_error_code",
    "payload",
    "payload_sealed",
    "payload_key_id",
    "last_actor",
    "last_reason",
    "updated_at",
];

/// The reconciler's updates: completions from `unknown` (journal/complete.rs) and the
/// sweeper's expiry, republish, take and defer statements (journal/sweep.rs). Never the
/// attempt count: only a claim starts an attempt.
const RECONCILER_UPDATE: &[&str] = &[
    "status",
    "lease_until",
    "lease_owner",
    "reconcile_checks",
    "provider_operation_id",
    "result_json",
    "last_error_code",
    "payload",
    "payload_sealed",
    "payload_key_id",
    "last_actor",
    "last_reason",
    "updated_at",
];

/// A person's or a statement's settlement of an `unknown` (journal/review.rs,
/// `settle_unknown`).
const SETTLE_UPDATE: &[&str] = &[
    "status",
    "provider_operation_id",
    "result_json",
    "last_error_code",
    "lease_owner",
    "lease_until",
    "payload",
    "payload_sealed",
    "payload_key_id",
    "last_actor",
    "last_reason",
    "updated_at",
];

/// Cancel, approve, reject (journal/control.rs): the gateway's API, the desk, the CLI.
const CONTROL_UPDATE: &[&str] = &[
    "status",
    "lease_until",
    "deferred_since",
    "approved_at",
    "payload",
    "payload_sealed",
    "payload_key_id",
    "last_error_code",
    "last_actor",
    "last_reason",
    "updated_at",
];

/// Recording a person's decision on a held operation (journal/control.rs).
const APPROVAL_INSERT: &[&str] = &["idempotency_key", "approver", "decision", "note"];

/// What cancelling and deciding approvals need: the move (its event comes from the
/// trigger) and the decision's row (its id is an identity column: no sequence grant).
const CONTROL: &[Need] = &[
    table(Update, OPERATIONS, Only(CONTROL_UPDATE)),
    table(Select, APPROVALS, Table),
    table(Insert, APPROVALS, Only(APPROVAL_INSERT)),
];

/// The audit rows written directly, not by the trigger: a refused conflict
/// (journal/conflict.rs, worker) and an opened review (journal/review.rs, reconciler).
/// Not `id` or `at`: they come from their defaults, so a writer cannot backdate a row.
const EVENT_INSERT: &[&str] = &[
    "op_seq",
    "idempotency_key",
    "from_status",
    "to_status",
    "attempt",
    "actor",
    "reason",
    "error_code",
];

/// Opening a review (journal/review.rs, `open_review`).
const REVIEW_INSERT: &[&str] = &[
    "idempotency_key",
    "reason",
    "opened_by",
    "evidence",
    "recheck_at",
];

/// Re-checking a review and counting closed ones (journal/recheck.rs). Not the
/// resolution: a review closes itself when its operation settles (a trigger, as its
/// owner), so the reconciler never writes a decision.
const REVIEW_RECHECK: &[&str] = &["evidence", "recheck_at", "rechecks", "counted_at"];

/// Resolving a review (journal/review.rs, `resolve_review`). A statement import settles
/// operations only; their reviews close themselves.
const REVIEW_RESOLVE: &[&str] = &[
    "resolution",
    "resolved_by",
    "resolved_at",
    "note",
    "recheck_at",
];

/// gateway/src/client_keys.rs `begin` (insert, take over an abandoned row) and `finish`.
const GATEWAY_REQUESTS_INSERT: &[&str] = &["tenant", "client_key", "fingerprint", "state"];
const GATEWAY_REQUESTS_UPDATE: &[&str] = &["created_at", "state", "idempotency_key"];

/// The fleet's budget (journal/budget.rs): workers and reconcilers write their
/// providers' limits at start (`ensure_budgets`), take slots, report pushback. Every
/// column: the row is nothing but the budget's state.
const BUDGET_READ: Need = table(Select, BUDGETS, Table);
const BUDGET_INSERT: Need = table(Insert, BUDGETS, Table);
const BUDGET_UPDATE: Need = table(Update, BUDGETS, Table);

/// The action worker: claim (insert-or-take, then read the rows it did not claim),
/// complete, and the audit row of a refused conflict. The transition events are
/// written by the trigger as the owner, so the worker needs no other event rights, and
/// none at all on reviews.
const WORKER: &[Need] = &[
    SCHEMA_VERSION,
    table(Select, OPERATIONS, Table),
    table(Insert, OPERATIONS, Only(CLAIM_INSERT)),
    table(Update, OPERATIONS, Only(WORKER_UPDATE)),
    BUDGET_READ,
    BUDGET_INSERT,
    BUDGET_UPDATE,
    table(Insert, EVENTS, Only(EVENT_INSERT)),
    Need::Serial {
        table: EVENTS,
        column: "id",
    },
];

/// The reconciler and its sweeper: take and check unknowns, settle them, expire leases,
/// republish, open reviews (with their audit row), re-check transient reviews (their
/// evidence and next lookup), count for the metrics. It reads reviews (a key with an
/// open one is not taken) but cannot write a decision: a review it settles by a lookup
/// closes itself (the trigger of migration 20261209000000_review_evidence.sql).
const RECONCILER: &[Need] = &[
    SCHEMA_VERSION,
    table(Select, OPERATIONS, Table),
    table(Update, OPERATIONS, Only(RECONCILER_UPDATE)),
    BUDGET_READ,
    BUDGET_INSERT,
    BUDGET_UPDATE,
    table(Select, REVIEWS, Table),
    table(Insert, REVIEWS, Only(REVIEW_INSERT)),
    table(Update, REVIEWS, Only(REVIEW_RECHECK)),
    Need::Serial {
        table: REVIEWS,
        column: "id",
    },
    table(Insert, EVENTS, Only(EVENT_INSERT)),
    Need::Serial {
        table: EVENTS,
        column: "id",
    },
];

/// The producer SDK (and CLI): record intents, read their state back (duplicates,
/// status, waits) — every column but the payload's, which it wrote itself and never
/// needs again.
const PRODUCER: &[Need] = &[
    SCHEMA_VERSION,
    table(Select, OPERATIONS, AllBut(PAYLOAD_COLUMNS)),
    table(Insert, OPERATIONS, Only(RECORD_INSERT)),
];

/// What the gateway needs beyond the producer's: its own table of header values.
const GATEWAY_ONLY: &[Need] = &[
    table(Select, GATEWAY_REQUESTS, Table),
    table(Insert, GATEWAY_REQUESTS, Only(GATEWAY_REQUESTS_INSERT)),
    table(Update, GATEWAY_REQUESTS, Only(GATEWAY_REQUESTS_UPDATE)),
    table(Delete, GATEWAY_REQUESTS, Table),
];

/// `oncely-worker admin`: inspect (operations with their payload, events, reviews),
/// resolve reviews, import statements, purge. It inserts nothing: settling moves rows,
/// the trigger writes the events.
const ADMIN: &[Need] = &[
    SCHEMA_VERSION,
    table(Select, OPERATIONS, Table),
    table(Update, OPERATIONS, Only(SETTLE_UPDATE)),
    table(Delete, OPERATIONS, Table),
    table(Select, EVENTS, Table),
    table(Delete, EVENTS, Table),
    table(Select, REVIEWS, Table),
    table(Update, REVIEWS, Only(REVIEW_RESOLVE)),
    table(Delete, REVIEWS, Table),
];

/// The payload of a held operation, for the desk's approvers: a `SECURITY DEFINER`
/// function (migration 20261215000002_held_payload_for_approvers.sql) that returns it only
/// while the operation is `awaiting_approval`.
pub const HELD_PAYLOAD: Need = Need::Function {
    name: "oncely_held_payload",
    args: "text",
};

/// The review desk (gateway/src/desk): list open reviews with their operations, show
/// one operation's timeline and evidence, and apply a person's decision — the same
/// statements as the CLI's `resolve_review`. It never reads a payload column (the decision
/// rests on the timeline, the evidence and the saved result), deletes nothing, inserts
/// nothing: the move's event and `review_closed` come from the triggers. An approver
/// deciding on a held action sees its payload through [`HELD_PAYLOAD`] only: never the
/// payload of anything already decided, running or settled.
const DESK: &[Need] = &[
    SCHEMA_VERSION,
    table(Select, OPERATIONS, AllBut(PAYLOAD_COLUMNS)),
    table(Update, OPERATIONS, Only(SETTLE_UPDATE)),
    table(Select, EVENTS, Table),
    table(Select, REVIEWS, Table),
    table(Update, REVIEWS, Only(REVIEW_RESOLVE)),
    HELD_PAYLOAD,
];

/// Everything `process` needs.
pub fn needs(process: Process) -> Vec<Need> {
    match process {
        Process::Worker => WORKER.to_vec(),
        Process::Reconciler => RECONCILER.to_vec(),
        Process::Producer => PRODUCER.to_vec(),
        Process::Gateway => [PRODUCER, GATEWAY_ONLY, CONTROL].concat(),
        Process::Admin => [ADMIN, CONTROL].concat(),
        Process::Desk => [DESK, CONTROL].concat(),
    }
}

/// Every column any entry names explicitly, by table (for the test that they exist).
pub fn named_columns() -> Vec<(&'static str, &'static str)> {
    let mut out = Vec::new();
    for p in Process::ALL {
        for n in needs(p) {
            match n {
                Need::Table {
                    table,
                    columns: Only(cols) | AllBut(cols),
                    ..
                } => out.extend(cols.iter().map(|c| (table, *c))),
                Need::Serial { table, column } => out.push((table, column)),
                Need::Table { .. } | Need::Function { .. } => {}
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grants_on(p: Process, privilege: Privilege, t: &str) -> Vec<Columns> {
        needs(p)
            .into_iter()
            .filter_map(|n| match n {
                Need::Table {
                    privilege: q,
                    table,
                    columns,
                } if q == privilege && table == t => Some(columns),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn only_the_admin_deletes_and_only_people_resolve() {
        // The desk resolves (a person's decision) and reads no payload.
        let desk = Process::Desk;
        for t in [OPERATIONS, EVENTS, REVIEWS] {
            assert!(
                grants_on(desk, Delete, t).is_empty(),
                "the desk deletes {t}"
            );
            assert!(
                grants_on(desk, Insert, t).is_empty(),
                "the desk inserts {t}"
            );
        }
        assert_eq!(grants_on(desk, Update, REVIEWS), vec![Only(REVIEW_RESOLVE)]);
        assert_eq!(
            grants_on(desk, Select, OPERATIONS),
            vec![AllBut(PAYLOAD_COLUMNS)]
        );
        for p in [
            Process::Worker,
            Process::Reconciler,
            Process::Producer,
            Process::Gateway,
        ] {
            for t in [OPERATIONS, EVENTS, REVIEWS] {
                assert!(grants_on(p, Delete, t).is_empty(), "{p:?} deletes {t}");
            }
            // Only the reconciler updates reviews, and never their decision columns.
            for columns in grants_on(p, Update, REVIEWS) {
                assert_eq!(p, Process::Reconciler, "{p:?} updates reviews");
                assert_eq!(columns, Only(REVIEW_RECHECK));
                for decision in ["resolution", "resolved_by", "resolved_at", "note"] {
                    assert!(!REVIEW_RECHECK.contains(&decision), "{p:?} resolves");
                }
            }
            assert!(
                grants_on(p, Update, EVENTS).is_empty(),
                "{p:?} updates events"
            );
        }
        assert_eq!(grants_on(Process::Admin, Delete, EVENTS), vec![Table]);
    }

    #[test]
    fn only_the_desk_reads_held_payloads_and_only_through_the_function() {
        for p in Process::ALL {
            assert_eq!(
                needs(p).contains(&HELD_PAYLOAD),
                p == Process::Desk,
                "{p:?}"
            );
        }
    }

    #[test]
    fn the_producer_reads_no_payload_column() {
        for p in [Process::Producer, Process::Gateway] {
            assert_eq!(
                grants_on(p, Select, OPERATIONS),
                vec![AllBut(PAYLOAD_COLUMNS)]
            );
            assert!(grants_on(p, Insert, EVENTS).is_empty());
        }
    }

    #[test]
    fn no_process_may_rewrite_an_operations_identity() {
        for p in Process::ALL {
            for cols in grants_on(p, Update, OPERATIONS) {
                let Only(cols) = cols else {
                    panic!("{p:?}: UPDATE on the whole table")
                };
                for frozen in [
                    "idempotency_key",
                    "action_type",
                    "tenant",
                    "workflow_id",
                    "step",
                    "business_object",
                    "revision",
                    "payload_hash",
                    "created_at",
                ] {
                    assert!(!cols.contains(&frozen), "{p:?} may update {frozen}");
                }
            }
        }
    }
}
