//! One provider's idempotency store: what it remembers about each key.
//!
//! Why: this is the behaviour of a careful provider that the rest of oncely
//! relies on — a key is bound to one request body, a key being processed
//! answers 409, a finished key replays its saved answer, and records can be
//! found again by key or by business reference. Forgetting (the
//! `forget_keys_after_ms` fault) is applied here, lazily, whenever a key or a
//! reference is touched.

use std::collections::HashMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use crate::provider::Provider;

/// The state of a record as a lookup reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordStatus {
    /// The effect happened.
    Succeeded,
    /// The provider refused the request; no effect.
    Rejected,
    /// A request with this key is still being processed.
    Pending,
}

/// The body of a successful lookup (`GET /v1/<resource>?…`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordView {
    /// Provider id (`po_000001`); `None` while pending.
    pub id: Option<String>,
    /// Where the request stands.
    pub status: RecordStatus,
    /// The idempotency key it was sent with.
    pub idempotency_key: String,
    /// The body's `business_reference`, if it had one.
    pub business_reference: Option<String>,
}

/// An answer saved with a finished key and replayed for later requests.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SavedResponse {
    pub status: u16,
    pub body: Value,
}

#[derive(Debug)]
struct Record {
    id: String,
    status: RecordStatus,
    created: Instant,
    response: SavedResponse,
}

#[derive(Debug)]
struct Entry {
    ordinal: u64,
    body_hash: String,
    business_reference: Option<String>,
    /// `None` while in flight.
    record: Option<Record>,
}

impl Entry {
    fn view(&self, key: &str) -> RecordView {
        RecordView {
            id: self.record.as_ref().map(|r| r.id.clone()),
            status: self
                .record
                .as_ref()
                .map_or(RecordStatus::Pending, |r| r.status),
            idempotency_key: key.to_owned(),
            business_reference: self.business_reference.clone(),
        }
    }
}

/// What the store says about a newly arrived execute request.
#[derive(Debug, PartialEq)]
pub(crate) enum Arrival {
    /// Same key, different body.
    Conflict,
    /// Same key, still being processed.
    InFlight,
    /// Same key and body, finished: replay this.
    Replay(SavedResponse),
    /// New key: it is now in flight under this ordinal.
    Admitted(u64),
}

/// How an admitted request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Completion {
    Succeeded,
    Rejected,
}

/// Identity of a request body: SHA-256 (hex) of its JSON with object keys
/// sorted at every level, so key order and whitespace do not matter.
pub(crate) fn body_hash(body: &Value) -> String {
    fn canonical(v: &Value) -> Value {
        match v {
            Value::Object(map) => {
                let mut pairs: Vec<_> = map.iter().collect();
                pairs.sort_by(|a, b| a.0.cmp(b.0));
                Value::Object(
                    pairs
                        .into_iter()
                        .map(|(k, v)| (k.clone(), canonical(v)))
                        .collect(),
                )
            }
            Value::Array(items) => Value::Array(items.iter().map(canonical).collect()),
            other => other.clone(),
        }
    }
    let bytes = serde_json::to_vec(&canonical(body)).expect("a JSON value always serializes");
    hex::encode(Sha256::digest(&bytes))
}

/// One provider's records, keyed by idempotency key.
#[derive(Debug)]
pub(crate) struct Store {
    provider: Provider,
    entries: HashMap<String, Entry>,
    /// business reference -> (ordinal, key), oldest first.
    by_reference: HashMap<String, Vec<(u64, String)>>,
    /// Last id handed out (ids are `prefix` + zero-padded sequence).
    last_seq: u64,
    /// Never reset, so a request admitted before a reset cannot finish into
    /// an entry created after it.
    next_ordinal: u64,
}

impl Store {
    pub fn new(provider: Provider) -> Self {
        Store {
            provider,
            entries: HashMap::new(),
            by_reference: HashMap::new(),
            last_seq: 0,
            next_ordinal: 1,
        }
    }

    /// Forgets everything except the ordinal counter.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.by_reference.clear();
        self.last_seq = 0;
    }

    fn remove(&mut self, key: &str) {
        if let Some(entry) = self.entries.remove(key)
            && let Some(reference) = entry.business_reference
            && let Some(list) = self.by_reference.get_mut(&reference)
        {
            list.retain(|(ordinal, _)| *ordinal != entry.ordinal);
            if list.is_empty() {
                self.by_reference.remove(&reference);
            }
        }
    }

    /// Drops `key` if it is a finished record older than `forget_after`.
    fn expire(&mut self, key: &str, now: Instant, forget_after: Option<Duration>) {
        let Some(window) = forget_after else { return };
        let expired = self
            .entries
            .get(key)
            .and_then(|e| e.record.as_ref())
            .is_some_and(|r| now.saturating_duration_since(r.created) >= window);
        if expired {
            self.remove(key);
        }
    }

    /// Classifies an execute request and, for a new key, marks it in flight.
    pub fn arrive(
        &mut self,
        key: &str,
        body_hash: &str,
        business_reference: Option<&str>,
        now: Instant,
        forget_after: Option<Duration>,
    ) -> Arrival {
        self.expire(key, now, forget_after);
        if let Some(entry) = self.entries.get(key) {
            return if entry.body_hash != body_hash {
                Arrival::Conflict
            } else {
                match &entry.record {
                    None => Arrival::InFlight,
                    Some(record) => Arrival::Replay(record.response.clone()),
                }
            };
        }
        let ordinal = self.next_ordinal;
        self.next_ordinal += 1;
        self.entries.insert(
            key.to_owned(),
            Entry {
                ordinal,
                body_hash: body_hash.to_owned(),
                business_reference: business_reference.map(str::to_owned),
                record: None,
            },
        );
        if let Some(reference) = business_reference {
            self.by_reference
                .entry(reference.to_owned())
                .or_default()
                .push((ordinal, key.to_owned()));
        }
        Arrival::Admitted(ordinal)
    }

    fn admitted(&mut self, key: &str, ordinal: u64) -> Option<&mut Entry> {
        self.entries
            .get_mut(key)
            .filter(|e| e.ordinal == ordinal && e.record.is_none())
    }

    /// Releases an admitted key without a trace (`error_before_commit`).
    pub fn release(&mut self, key: &str, ordinal: u64) {
        if self.admitted(key, ordinal).is_some() {
            self.remove(key);
        }
    }

    /// Finishes an admitted key; returns the saved answer, or `None` when the
    /// entry is gone (a reset happened while it was in flight).
    pub fn complete(
        &mut self,
        key: &str,
        ordinal: u64,
        completion: Completion,
        now: Instant,
    ) -> Option<SavedResponse> {
        self.admitted(key, ordinal)?;
        self.last_seq += 1;
        let id = format!("{}{:06}", self.provider.id_prefix(), self.last_seq);
        let entry = self.admitted(key, ordinal)?;
        let (status, response) = match completion {
            Completion::Succeeded => (
                RecordStatus::Succeeded,
                SavedResponse {
                    status: 201,
                    body: serde_json::json!({
                        "id": id,
                        "status": "succeeded",
                        "idempotency_key": key,
                        "business_reference": entry.business_reference,
                    }),
                },
            ),
            Completion::Rejected => (
                RecordStatus::Rejected,
                SavedResponse {
                    status: 422,
                    body: serde_json::json!({"error": "rejected", "reason": "sandbox_fault"}),
                },
            ),
        };
        entry.record = Some(Record {
            id,
            status,
            created: now,
            response: response.clone(),
        });
        Some(response)
    }

    /// The record for `key`, if any (pending when in flight).
    pub fn by_key(
        &mut self,
        key: &str,
        now: Instant,
        forget_after: Option<Duration>,
    ) -> Option<RecordView> {
        self.expire(key, now, forget_after);
        self.entries.get(key).map(|e| e.view(key))
    }

    /// The newest record carrying `reference`, if any.
    pub fn by_reference(
        &mut self,
        reference: &str,
        now: Instant,
        forget_after: Option<Duration>,
    ) -> Option<RecordView> {
        let keys: Vec<String> = self
            .by_reference
            .get(reference)?
            .iter()
            .map(|(_, key)| key.clone())
            .collect();
        for key in &keys {
            self.expire(key, now, forget_after);
        }
        let (_, key) = self.by_reference.get(reference)?.last()?;
        self.entries.get(key).map(|e| e.view(key))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn hash_ignores_key_order_but_not_values() {
        let a = body_hash(&json!({"a": 1, "b": {"x": [1, 2], "y": null}}));
        let b: Value = serde_json::from_str(r#"{ "b": {"y": null, "x": [1,2]}, "a": 1 }"#).unwrap();
        assert_eq!(a, body_hash(&b));
        assert_ne!(
            a,
            body_hash(&json!({"a": 2, "b": {"x": [1, 2], "y": null}}))
        );
        assert_eq!(a.len(), 64);
    }

    #[test]
    fn lifecycle_conflict_inflight_replay() {
        let now = Instant::now();
        let mut s = Store::new(Provider::Bank);
        let Arrival::Admitted(ord) = s.arrive("k", "h1", Some("r"), now, None) else {
            panic!("new key must be admitted")
        };
        assert_eq!(s.arrive("k", "h2", None, now, None), Arrival::Conflict);
        assert_eq!(s.arrive("k", "h1", Some("r"), now, None), Arrival::InFlight);
        assert_eq!(
            s.by_reference("r", now, None).unwrap().status,
            RecordStatus::Pending
        );
        let saved = s.complete("k", ord, Completion::Succeeded, now).unwrap();
        assert_eq!(saved.status, 201);
        assert_eq!(saved.body["id"], "po_000001");
        assert_eq!(
            s.arrive("k", "h1", Some("r"), now, None),
            Arrival::Replay(saved)
        );
        assert!(s.complete("k", ord, Completion::Succeeded, now).is_none());
    }

    #[test]
    fn release_forget_and_newest_reference() {
        let t0 = Instant::now();
        let mut s = Store::new(Provider::Mail);
        let Arrival::Admitted(o1) = s.arrive("a", "h", Some("r"), t0, None) else {
            panic!()
        };
        s.complete("a", o1, Completion::Succeeded, t0).unwrap();
        let Arrival::Admitted(o2) = s.arrive("b", "h", Some("r"), t0, None) else {
            panic!()
        };
        s.complete("b", o2, Completion::Rejected, t0).unwrap();
        let newest = s.by_reference("r", t0, None).unwrap();
        assert_eq!(
            (newest.idempotency_key.as_str(), newest.status),
            ("b", RecordStatus::Rejected)
        );
        assert_eq!(newest.id.as_deref(), Some("em_000002"));

        let Arrival::Admitted(o3) = s.arrive("c", "h", None, t0, None) else {
            panic!()
        };
        s.release("c", o3);
        assert!(s.by_key("c", t0, None).is_none());

        let window = Some(Duration::from_millis(50));
        let later = t0 + Duration::from_millis(50);
        assert!(s.by_key("a", t0, window).is_some());
        assert!(s.by_reference("r", later, window).is_none());
        assert!(s.by_key("a", later, window).is_none());
        assert!(matches!(
            s.arrive("a", "h", None, later, window),
            Arrival::Admitted(_)
        ));
    }
}
