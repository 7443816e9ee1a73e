//! Recording intents: the producer's first write, before anything is published.
//!
//! `INSERT … 'planned' … ON CONFLICT DO NOTHING` for the whole batch in one statement,
//! then one read of the keys that already existed: the same action type and payload
//! hash is a *duplicate* (report its status and saved result); anything else is a
//! *conflict* — an error, never a retry, and the row is left untouched. The insert meets
//! either unique index: the key, or the business identity (a row recorded under another
//! secret of the key ring, before a rotation); a row found only by its identity is the
//! operation, reported under its own (older) key. A row a purge
//! deletes between the two statements is recorded again ([`PURGE_RACE_ROUNDS`]).

use super::operation::{
    Operation, select_operations, select_operations_by_identity, select_operations_without_payload,
};
use super::{Journal, JournalError};
use crate::intent::Envelope;
use crate::sealing::DataKeys;
use crate::status::{Move, Status, transition};
use std::collections::HashMap;

/// How many times a statement is repeated for keys whose row a purge deleted between
/// the insert (which met the row) and the read (which no longer finds it).
///
/// A purge deletes only terminal operations older than their provider's key retention:
/// after it the journal has forgotten the key, and an intent with that key is a new
/// operation (recorded `planned`, claimed at attempt 1), exactly as if it had arrived a
/// moment after the purge. Recording and claiming both treat the race that way: the
/// statement is run again for those keys, which then insert a fresh row (or meet the one
/// another process inserted meanwhile). Neither reports a row that does not exist, and
/// neither fails the batch. A second purge of the same key within one call would need a
/// fresh row to become terminal and old between two statements; past this many rounds
/// the call fails with a retryable error rather than loop.
pub const PURGE_RACE_ROUNDS: usize = 3;

/// The error when [`PURGE_RACE_ROUNDS`] did not settle every key: retryable.
pub(crate) fn purged_meanwhile() -> JournalError {
    JournalError::Unavailable(sqlx::Error::RowNotFound)
}

/// What recording one intent found.
#[derive(Debug, Clone, PartialEq)]
pub enum Recorded {
    /// A new `planned` row: publish it.
    New,
    /// A new row that is not for a worker yet: `awaiting_approval` (held by a rule) or
    /// `deferred` (scheduled for later). Not published; an approval or the due time does.
    Waiting(Status),
    /// The key exists with the same action type and payload (the row, read without
    /// its payload).
    Duplicate(Box<Operation>),
    /// The key exists with a different action type or payload: refused (the row, read
    /// without its payload).
    Conflict(Box<Operation>),
}

impl Journal {
    /// Record one intent as `planned` (see [`Journal::record_many`]).
    pub async fn record(&self, envelope: &Envelope, actor: &str) -> Result<Recorded, JournalError> {
        let mut out = self
            .record_many(std::slice::from_ref(envelope), actor)
            .await?;
        Ok(out.pop().unwrap_or(Recorded::New))
    }

    /// Record a batch of intents in one statement; one result per input, in order. A key
    /// repeated inside the batch is recorded once and reported as a duplicate (or a
    /// conflict) of itself for its later occurrences.
    pub async fn record_many(
        &self,
        envelopes: &[Envelope],
        actor: &str,
    ) -> Result<Vec<Recorded>, JournalError> {
        self.record_many_with(envelopes, actor, || async {}).await
    }

    /// [`Journal::record_many`] with what each intent asks beyond `planned`
    /// (`controls[i]` for `envelopes[i]`; empty: nothing): held by an approval rule
    /// (`awaiting_approval`), scheduled (`deferred` until `not_before`), a deadline
    /// (`expires_at`, or `max_age` from now, the earlier). A batch without any of it runs
    /// the plain statement.
    pub async fn record_controlled(
        &self,
        envelopes: &[Envelope],
        controls: &[Control],
        actor: &str,
    ) -> Result<Vec<Recorded>, JournalError> {
        debug_assert!(transition(None, Status::AwaitingApproval) == Some(Move::Hold));
        debug_assert!(transition(None, Status::Deferred) == Some(Move::Defer));
        let controls = if controls.iter().all(Control::is_plain) {
            &[]
        } else {
            controls
        };
        self.record_rounds(envelopes, controls, actor, || async {})
            .await
    }

    /// [`Journal::record_many`], awaiting `between` after each insert and before the read
    /// of the rows that already existed: the one window in which a purge can delete such
    /// a row. A key whose row vanished there is recorded again, as if the intent had
    /// arrived after the purge (see [`PURGE_RACE_ROUNDS`]). Tests pass a purge as
    /// `between` to provoke that race; `record_many` passes nothing.
    pub async fn record_many_with<F, Fut>(
        &self,
        envelopes: &[Envelope],
        actor: &str,
        between: F,
    ) -> Result<Vec<Recorded>, JournalError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        self.record_rounds(envelopes, &[], actor, between).await
    }

    /// [`PURGE_RACE_ROUNDS`] rounds of insert and read (`controls`: empty, or one per
    /// envelope).
    async fn record_rounds<F, Fut>(
        &self,
        envelopes: &[Envelope],
        controls: &[Control],
        actor: &str,
        mut between: F,
    ) -> Result<Vec<Recorded>, JournalError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        debug_assert!(transition(None, Status::Planned) == Some(Move::Record));
        let mut out: Vec<Option<Recorded>> = vec![None; envelopes.len()];
        let mut todo: Vec<usize> = (0..envelopes.len()).collect();
        for _ in 0..PURGE_RACE_ROUNDS {
            if todo.is_empty() {
                break;
            }
            let inserted = self.insert_new(envelopes, controls, &todo, actor).await?;
            between().await;
            todo = self
                .read_existing(envelopes, todo, &inserted, &mut out)
                .await?;
        }
        out.into_iter()
            .collect::<Option<Vec<_>>>()
            .ok_or_else(purged_meanwhile)
    }

    /// `INSERT … 'planned' … ON CONFLICT DO NOTHING` for the first occurrence of each key
    /// among `todo` (with `controls`, when not empty: held, scheduled, deadlines);
    /// returns the indices (into `envelopes`) whose row this inserted, with its status.
    async fn insert_new(
        &self,
        envelopes: &[Envelope],
        controls: &[Control],
        todo: &[usize],
        actor: &str,
    ) -> Result<HashMap<usize, Status>, JournalError> {
        let (cols, first, order) =
            Columns::first_of_each_key(todo, |i| &envelopes[i], self.data_keys());
        if !controls.is_empty() {
            let c = ControlColumns::of(order.iter().map(|&i| &controls[i]));
            let rows: Vec<(String, String)> =
                bind_columns!(sqlx::query_as(RECORD_CONTROLLED), cols)
                    .bind(actor)
                    .bind(&c.not_before)
                    .bind(&c.expires_at)
                    .bind(&c.max_age)
                    .bind(&c.hold_rule)
                    .bind(&c.approvals_needed)
                    .bind(&c.timeout)
                    .bind(&c.requested_by)
                    .bind(&c.subject_hash)
                    .fetch_all(&self.db)
                    .await?;
            let mut inserted = HashMap::with_capacity(rows.len());
            for (k, status) in rows {
                if let Some(&i) = first.get(k.as_str()) {
                    let status = status
                        .parse()
                        .map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
                    inserted.insert(i, status);
                }
            }
            return Ok(inserted);
        }
        // `ORDER BY k`: a unique-index insert waits for another transaction's uncommitted
        // row with the same key, so two producers inserting the same keys in opposite
        // orders would wait for each other (deadlock, 40P01) without one fixed order.
        let inserted: Vec<String> = bind_columns!(sqlx::query_scalar(
            "INSERT INTO agent_operations (idempotency_key, action_type, tenant, workflow_id, step, business_object, \
                 revision, payload_hash, payload, status, last_actor, last_reason, payload_sealed, payload_key_id) \
             SELECT k, a, t, w, s, b, r, h, p::jsonb, 'planned', $12, 'recorded', ps, pk \
             FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::int8[], \
                         $8::text[], $9::text[], $10::bytea[], $11::text[]) AS x(k, a, t, w, s, b, r, h, p, ps, pk) \
             ORDER BY k \
             ON CONFLICT DO NOTHING \
             RETURNING idempotency_key",
        ), cols)
        .bind(actor)
        .fetch_all(&self.db)
        .await?;
        Ok(inserted
            .iter()
            .filter_map(|k| first.get(k.as_str()).map(|&i| (i, Status::Planned)))
            .collect())
    }

    /// Fill `out` for `todo`: the inserted ones are new, the others are told apart by
    /// the row that already existed (one read for all of them). Returns the indices whose
    /// row vanished before the read (purged meanwhile), to be recorded again.
    async fn read_existing(
        &self,
        envelopes: &[Envelope],
        todo: Vec<usize>,
        inserted: &HashMap<usize, Status>,
        out: &mut [Option<Recorded>],
    ) -> Result<Vec<usize>, JournalError> {
        let to_read: Vec<String> = todo
            .iter()
            .filter(|i| !inserted.contains_key(*i))
            .map(|&i| envelopes[i].key.as_str().to_owned())
            .collect();
        // Without the payload: the producer's role may not read it, and telling a
        // duplicate from a conflict needs only the action type and the payload hash.
        let mut rows = self.get_many_without_payload(&to_read).await?;
        let by_identity = self
            .rows_by_identity(
                todo.iter()
                    .filter(|i| {
                        !inserted.contains_key(*i)
                            && !rows.contains_key(envelopes[**i].key.as_str())
                    })
                    .map(|&i| &envelopes[i]),
            )
            .await?;
        rows.extend(by_identity);
        let mut vanished = Vec::new();
        for i in todo {
            let e = &envelopes[i];
            out[i] = if let Some(&status) = inserted.get(&i) {
                Some(if status == Status::Planned {
                    Recorded::New
                } else {
                    Recorded::Waiting(status)
                })
            } else {
                match rows.get(e.key.as_str()) {
                    Some(op)
                        if op.action_type == e.intent.identity.action_type.as_str()
                            && op.payload_hash == e.payload_hash.as_str() =>
                    {
                        Some(Recorded::Duplicate(Box::new(op.clone())))
                    }
                    Some(op) => Some(Recorded::Conflict(Box::new(op.clone()))),
                    None => {
                        vanished.push(i);
                        None
                    }
                }
            };
        }
        Ok(vanished)
    }

    /// The rows recorded for these envelopes' business identities under *another* key
    /// (a secret of the key ring other than the one that made the envelope's key), by
    /// the envelope's key. One statement, served by the identity index.
    pub(crate) async fn rows_by_identity<'e>(
        &self,
        envelopes: impl Iterator<Item = &'e Envelope>,
    ) -> Result<HashMap<String, Operation>, JournalError> {
        let mut cols = IdentityColumns::default();
        for e in envelopes {
            cols.push(e);
        }
        if cols.keys.is_empty() {
            return Ok(HashMap::new());
        }
        let rows = sqlx::query(select_operations_by_identity!())
            .bind(&cols.keys)
            .bind(&cols.workflows)
            .bind(&cols.steps)
            .bind(&cols.objects)
            .bind(&cols.revisions)
            .bind(&cols.action_types)
            .bind(&cols.tenants)
            .fetch_all(&self.db)
            .await?;
        let mut out = HashMap::with_capacity(rows.len());
        for row in rows {
            use sqlx::{FromRow, Row};
            let asked: String = row.try_get("asked_key")?;
            out.insert(asked, Operation::from_row(&row)?);
        }
        Ok(out)
    }

    /// Rows for a set of keys (as text), by key.
    pub(crate) async fn get_many_by_text(
        &self,
        keys: &[String],
    ) -> Result<HashMap<String, Operation>, JournalError> {
        if keys.is_empty() {
            return Ok(HashMap::new());
        }
        let rows: Vec<Operation> =
            sqlx::query_as(select_operations!("WHERE idempotency_key = ANY($1)"))
                .bind(keys)
                .fetch_all(&self.db)
                .await?;
        Ok(rows
            .into_iter()
            .map(|op| (op.key.as_str().to_owned(), op))
            .collect())
    }
}

impl Journal {
    /// [`Journal::get_many_by_text`] without the payload (`payload` is `None`).
    async fn get_many_without_payload(
        &self,
        keys: &[String],
    ) -> Result<HashMap<String, Operation>, JournalError> {
        if keys.is_empty() {
            return Ok(HashMap::new());
        }
        let rows: Vec<Operation> = sqlx::query_as(select_operations_without_payload!(
            "WHERE idempotency_key = ANY($1)"
        ))
        .bind(keys)
        .fetch_all(&self.db)
        .await?;
        Ok(rows
            .into_iter()
            .map(|op| (op.key.as_str().to_owned(), op))
            .collect())
    }
}

/// What a new operation asks beyond `planned` (see [`crate::approval::Control`]).
pub use crate::approval::Control;

impl Control {
    /// Nothing beyond `planned`.
    pub fn is_plain(&self) -> bool {
        self.hold.is_none()
            && self.not_before.is_none()
            && self.expires_at.is_none()
            && self.max_age.is_none()
            && self.requested_by.is_none()
            && self.subject_hash.is_none()
    }
}

/// The insert with control columns (`$12` actor, `$13…$20`: not_before, expires_at,
/// max_age seconds, hold rule, approvals needed, approval timeout seconds, requested by,
/// subject hash). Held wins over scheduled: an approval then waits for `not_before`.
const RECORD_CONTROLLED: &str = "INSERT INTO agent_operations (idempotency_key, action_type, tenant, workflow_id, step, business_object, \
         revision, payload_hash, payload, status, last_actor, last_reason, payload_sealed, payload_key_id, \
         lease_until, deferred_since, not_before, expires_at, hold_rule, approvals_needed, approval_deadline, \
         requested_by, subject_hash) \
     SELECT k, a, t, w, s, b, r, h, p::jsonb, \
         CASE WHEN hr IS NOT NULL THEN 'awaiting_approval' WHEN nb > now() THEN 'deferred' ELSE 'planned' END, $12, \
         CASE WHEN hr IS NOT NULL THEN 'held' WHEN nb > now() THEN 'scheduled' ELSE 'recorded' END, ps, pk, \
         CASE WHEN hr IS NULL AND nb > now() THEN nb END, CASE WHEN hr IS NULL AND nb > now() THEN nb END, nb, \
         least(ex, now() + make_interval(secs => ma)), hr, coalesce(an, 0), \
         CASE WHEN hr IS NOT NULL THEN now() + make_interval(secs => ht) END, rb, sh \
     FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::int8[], \
                 $8::text[], $9::text[], $10::bytea[], $11::text[], $13::timestamptz[], $14::timestamptz[], \
                 $15::float8[], $16::text[], $17::int2[], $18::float8[], $19::text[], $20::text[]) \
          AS x(k, a, t, w, s, b, r, h, p, ps, pk, nb, ex, ma, hr, an, ht, rb, sh) \
     ORDER BY k \
     ON CONFLICT DO NOTHING \
     RETURNING idempotency_key, status";

/// [`Control`]s as `unnest` arrays, in column order.
#[derive(Default)]
struct ControlColumns {
    not_before: Vec<Option<chrono::DateTime<chrono::Utc>>>,
    expires_at: Vec<Option<chrono::DateTime<chrono::Utc>>>,
    max_age: Vec<Option<f64>>,
    hold_rule: Vec<Option<String>>,
    approvals_needed: Vec<Option<i16>>,
    timeout: Vec<Option<f64>>,
    requested_by: Vec<Option<String>>,
    subject_hash: Vec<Option<String>>,
}

impl ControlColumns {
    fn of<'c>(controls: impl Iterator<Item = &'c Control>) -> Self {
        let mut c = Self::default();
        for x in controls {
            c.not_before.push(x.not_before);
            c.expires_at.push(x.expires_at);
            c.max_age.push(x.max_age.map(|d| d.as_secs_f64()));
            c.hold_rule.push(x.hold.as_ref().map(|h| h.rule.clone()));
            c.approvals_needed
                .push(x.hold.as_ref().map(|h| h.approvals_needed));
            c.timeout
                .push(x.hold.as_ref().map(|h| h.timeout.as_secs_f64()));
            c.requested_by.push(x.requested_by.clone());
            c.subject_hash.push(x.subject_hash.clone());
        }
        c
    }
}

/// The identity columns of envelopes, with the key each was asked under.
#[derive(Default)]
struct IdentityColumns {
    keys: Vec<String>,
    workflows: Vec<String>,
    steps: Vec<String>,
    objects: Vec<String>,
    revisions: Vec<i64>,
    action_types: Vec<String>,
    tenants: Vec<Option<String>>,
}

impl IdentityColumns {
    fn push(&mut self, e: &Envelope) {
        let id = &e.intent.identity;
        self.keys.push(e.key.as_str().to_owned());
        self.workflows.push(id.workflow_id.clone());
        self.steps.push(id.step.clone());
        self.objects.push(id.business_object.clone());
        self.revisions.push(id.revision);
        self.action_types.push(id.action_type.as_str().to_owned());
        self.tenants.push(id.tenant.clone());
    }
}

/// Column arrays for `unnest`: one statement, any batch size.
#[derive(Default)]
pub(crate) struct Columns {
    pub keys: Vec<String>,
    pub action_types: Vec<String>,
    pub tenants: Vec<Option<String>>,
    pub workflows: Vec<String>,
    pub steps: Vec<String>,
    pub objects: Vec<String>,
    pub revisions: Vec<i64>,
    pub hashes: Vec<String>,
    pub payloads: Vec<Option<String>>,
    pub sealed: Vec<Option<Vec<u8>>>,
    pub sealed_key_ids: Vec<Option<String>>,
}

/// Bind a [`Columns`] as `$1…$11` (keys, action types, tenants, workflows, steps,
/// objects, revisions, hashes, plain payloads, sealed payloads, their data-key ids), the
/// order both batched inserts use.
macro_rules! bind_columns {
    ($query:expr, $cols:expr) => {
        $query
            .bind(&$cols.keys)
            .bind(&$cols.action_types)
            .bind(&$cols.tenants)
            .bind(&$cols.workflows)
            .bind(&$cols.steps)
            .bind(&$cols.objects)
            .bind(&$cols.revisions)
            .bind(&$cols.hashes)
            .bind(&$cols.payloads)
            .bind(&$cols.sealed)
            .bind(&$cols.sealed_key_ids)
    };
}
pub(crate) use bind_columns;

impl Columns {
    /// The columns of the first occurrence of each key among `todo` (Postgres refuses to
    /// touch one row twice in a statement), where each key first occurred, and those
    /// indices in column order.
    pub fn first_of_each_key<'e>(
        todo: &[usize],
        envelope: impl Fn(usize) -> &'e Envelope,
        keys: Option<&DataKeys>,
    ) -> (Columns, HashMap<&'e str, usize>, Vec<usize>) {
        let mut first: HashMap<&str, usize> = HashMap::with_capacity(todo.len());
        let mut cols = Columns::default();
        let mut order = Vec::with_capacity(todo.len());
        for &i in todo {
            let e = envelope(i);
            if let std::collections::hash_map::Entry::Vacant(v) = first.entry(e.key.as_str()) {
                v.insert(i);
                cols.push(e, keys);
                order.push(i);
            }
        }
        (cols, first, order)
    }

    fn push(&mut self, e: &Envelope, keys: Option<&DataKeys>) {
        let id = &e.intent.identity;
        self.keys.push(e.key.as_str().to_owned());
        self.action_types.push(id.action_type.as_str().to_owned());
        self.tenants.push(id.tenant.clone());
        self.workflows.push(id.workflow_id.clone());
        self.steps.push(id.step.clone());
        self.objects.push(id.business_object.clone());
        self.revisions.push(id.revision);
        self.hashes.push(e.payload_hash.as_str().to_owned());
        match keys {
            Some(keys) => {
                let sealed = keys.seal(e.key.as_str(), &e.intent.payload);
                self.payloads.push(None);
                self.sealed.push(Some(sealed.bytes));
                self.sealed_key_ids.push(Some(sealed.key_id));
            }
            None => {
                self.payloads.push(Some(
                    serde_json::Value::Object(e.intent.payload.clone()).to_string(),
                ));
                self.sealed.push(None);
                self.sealed_key_ids.push(None);
            }
        }
    }
}
