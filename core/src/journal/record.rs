//! Recording intents: the producer's first write, before anything is published.
//!
//! `INSERT … 'planned' … ON CONFLICT DO NOTHING` for the whole batch in one statement,
//! then one read of the keys that already existed: the same action type and payload
//! hash is a *duplicate* (report its status and saved result); anything else is a
//! *conflict* — an error, never a retry, and the row is left untouched.

use super::operation::{Operation, select_operations};
use super::{Journal, JournalError};
use crate::intent::Envelope;
use crate::status::{Move, Status, transition};
use std::collections::HashMap;

/// What recording one intent found.
#[derive(Debug, Clone, PartialEq)]
pub enum Recorded {
    /// A new `planned` row: publish it.
    New,
    /// The key exists with the same action type and payload.
    Duplicate(Box<Operation>),
    /// The key exists with a different action type or payload: refused.
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
        debug_assert!(transition(None, Status::Planned) == Some(Move::Record));
        if envelopes.is_empty() {
            return Ok(Vec::new());
        }
        let mut first: HashMap<&str, usize> = HashMap::with_capacity(envelopes.len());
        let mut cols = Columns::default();
        for (i, e) in envelopes.iter().enumerate() {
            if let std::collections::hash_map::Entry::Vacant(v) = first.entry(e.key.as_str()) {
                v.insert(i);
                cols.push(e);
            }
        }
        let inserted: Vec<String> = sqlx::query_scalar(
            "INSERT INTO agent_operations (idempotency_key, action_type, tenant, workflow_id, step, business_object, \
                 revision, payload_hash, payload, status, last_actor, last_reason) \
             SELECT k, a, t, w, s, b, r, h, p::jsonb, 'planned', $10, 'recorded' \
             FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::int8[], \
                         $8::text[], $9::text[]) AS x(k, a, t, w, s, b, r, h, p) \
             ON CONFLICT (idempotency_key) DO NOTHING \
             RETURNING idempotency_key",
        )
        .bind(&cols.keys)
        .bind(&cols.action_types)
        .bind(&cols.tenants)
        .bind(&cols.workflows)
        .bind(&cols.steps)
        .bind(&cols.objects)
        .bind(&cols.revisions)
        .bind(&cols.hashes)
        .bind(&cols.payloads)
        .bind(actor)
        .fetch_all(&self.pool)
        .await?;
        let inserted: std::collections::HashSet<String> = inserted.into_iter().collect();

        // Every key that was not inserted by this statement at its first occurrence
        // needs its row read (one statement for all of them).
        let to_read: Vec<String> = envelopes
            .iter()
            .enumerate()
            .filter(|(i, e)| !(inserted.contains(e.key.as_str()) && first[e.key.as_str()] == *i))
            .map(|(_, e)| e.key.as_str().to_owned())
            .collect();
        let rows = self.get_many_by_text(&to_read).await?;
        Ok(envelopes
            .iter()
            .enumerate()
            .map(|(i, e)| {
                if inserted.contains(e.key.as_str()) && first[e.key.as_str()] == i {
                    return Recorded::New;
                }
                match rows.get(e.key.as_str()) {
                    Some(op)
                        if op.action_type == e.intent.identity.action_type.as_str()
                            && op.payload_hash == e.payload_hash.as_str() =>
                    {
                        Recorded::Duplicate(Box::new(op.clone()))
                    }
                    Some(op) => Recorded::Conflict(Box::new(op.clone())),
                    // Purged between the insert and the read: it was there, so not new.
                    None => Recorded::New,
                }
            })
            .collect())
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
                .fetch_all(&self.pool)
                .await?;
        Ok(rows
            .into_iter()
            .map(|op| (op.key.as_str().to_owned(), op))
            .collect())
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
    pub payloads: Vec<String>,
}

impl Columns {
    pub fn push(&mut self, e: &Envelope) {
        let id = &e.intent.identity;
        self.keys.push(e.key.as_str().to_owned());
        self.action_types.push(id.action_type.as_str().to_owned());
        self.tenants.push(id.tenant.clone());
        self.workflows.push(id.workflow_id.clone());
        self.steps.push(id.step.clone());
        self.objects.push(id.business_object.clone());
        self.revisions.push(id.revision);
        self.hashes.push(e.payload_hash.as_str().to_owned());
        self.payloads
            .push(serde_json::Value::Object(e.intent.payload.clone()).to_string());
    }
}
