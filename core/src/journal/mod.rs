//! The operations journal: the only module with SQL.
//!
//! Postgres is the source of truth; RabbitMQ only delivers and wakes. Every write here is
//! one statement that commits at once (no transaction is ever held across a provider
//! call), works on a batch of operations, and takes its clock from the database
//! (`now()`), so lease arithmetic does not depend on any worker's clock. Every status
//! change is compare-and-set on the expected status and attempt, checked first against
//! the transition table in [`crate::status`]; the trigger in the migration writes one
//! event row per transition, with the actor and reason the statement set.
//!
//! # Layout
//! - [`operation`]: the row type and the journal's error.
//! - [`record`]: record intents (`planned`), telling duplicates from conflicts.
//! - [`claim`]: the one-statement insert-or-claim with a lease.
//! - [`complete`]: compare-and-set outcomes.
//! - [`conflict`]: the audit row for a refused conflicting intent.
//! - [`inspect`]: reads — by key, by workflow, events, the article's queries.
//! - [`budget`]: the fleet's shared budget per provider (rate, burst, pauses, calls in flight).
//! - [`deferred`]: deferred operations that are due (republish) or out of patience (give up).
//! - [`sweep`]: what the sweeper and reconciler take: expired leases, republishing, due unknowns.
//! - [`review`]: human reviews and purging.
//! - [`recheck`]: background re-checks of reviews a lookup may still settle; review figures.
//! - [`stats`]: aggregate reads (counts by status, the database clock, latencies).

pub mod budget;
pub mod claim;
pub mod complete;
pub mod conflict;
pub mod control;
pub mod deferred;
pub mod desk;
pub mod inspect;
pub mod operation;
pub mod recheck;
pub mod record;
pub mod review;
pub mod statement;
pub mod stats;
pub mod sweep;

pub use budget::{BudgetRow, BudgetState, Grant, Limit};
pub use claim::{Claim, ClaimOutcome, ClaimRequest, NotClaimed};
pub use complete::{Applied, Completion, LATE_REASON, Verdict};
pub use control::{Approval, Cancelled, Decided};
pub use desk::{DeskFilter, DeskRow};
pub use operation::{Event, JournalError, Operation, PayloadUnavailable};
pub use recheck::{ClosedReview, DueReview, LookupSeen, OpenReviews};
pub use record::{Control, Recorded};
pub use review::{NewReview, Resolution, ResolveError, Review};
pub use statement::{StatementCandidate, StatementVerdict};
pub use stats::Latencies;
pub use sweep::{Expired, OpsFilter};

use sqlx::PgPool;

/// A handle on the journal (cheap to clone: it is a pool).
#[derive(Debug, Clone)]
pub struct Journal {
    db: crate::Db,
    data_keys: Option<std::sync::Arc<crate::sealing::DataKeys>>,
}

impl Journal {
    /// A journal over a connected, migrated pool; payloads are stored in plain text
    /// unless [`Journal::with_data_keys`] gives it keys.
    pub fn new(pool: PgPool) -> Self {
        Self::on(crate::Db::direct(pool))
    }

    /// A journal over `db`: Postgres directly or through a transaction pooler
    /// ([`crate::pooler`]).
    pub fn on(db: crate::Db) -> Self {
        Self {
            db,
            data_keys: None,
        }
    }

    /// Seal the payloads this journal writes with the current data key (and open them
    /// with any of the keys); `None` keeps them in plain text.
    pub fn with_data_keys(mut self, keys: Option<crate::sealing::DataKeys>) -> Self {
        self.data_keys = keys.map(std::sync::Arc::new);
        self
    }

    /// The data keys, when payloads are sealed.
    pub fn data_keys(&self) -> Option<&crate::sealing::DataKeys> {
        self.data_keys.as_deref()
    }

    /// An operation's envelope (its payload opened with this journal's data keys).
    pub fn envelope_of(
        &self,
        op: &Operation,
    ) -> Result<crate::intent::Envelope, PayloadUnavailable> {
        op.envelope(self.data_keys())
    }

    /// The raw pool (tests, explicit transactions). A statement run on it bypasses pooler
    /// mode: run statements on [`Journal::db`] instead ([`crate::pooler`]).
    pub fn pool(&self) -> &PgPool {
        self.db.pool()
    }

    /// What its statements run on (directly, or through a pooler).
    pub fn db(&self) -> &crate::Db {
        &self.db
    }
}
