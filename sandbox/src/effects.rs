//! The ground-truth ledger of side effects that really happened.
//!
//! Why separate from the idempotency store: the store is what the provider
//! *remembers* (and can forget); the ledger is what *happened*. A test asks
//! the ledger "how many emails were really sent for this key?" — the count a
//! correct oncely keeps at exactly one. Only `/control/reset` clears it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::provider::Provider;

/// Effects recorded for one idempotency key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyEffects {
    /// The provider that performed them. Keys are expected to be unique
    /// across providers; if one is reused, counts add up and this stays the
    /// first provider.
    pub provider: Provider,
    /// How many times the side effect happened for this key.
    pub count: u64,
}

/// Body of `GET /control/effects`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Effects {
    /// Sum of all counts.
    pub total: u64,
    /// Per idempotency key.
    pub keys: BTreeMap<String, KeyEffects>,
}

impl Effects {
    /// Effects recorded for `key` (0 when never).
    pub fn count(&self, key: &str) -> u64 {
        self.keys.get(key).map_or(0, |e| e.count)
    }

    /// Keys whose effect happened more than once — the duplicates oncely exists to prevent.
    pub fn duplicates(&self) -> impl Iterator<Item = (&str, &KeyEffects)> {
        self.keys
            .iter()
            .filter(|(_, e)| e.count > 1)
            .map(|(k, e)| (k.as_str(), e))
    }
}

/// Body of `GET /control/effects?key=K`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EffectCount {
    /// The key asked about.
    pub key: String,
    /// Effects recorded for it (0 when never).
    pub count: u64,
}

/// The ledger itself (server side).
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    effects: Effects,
}

impl Ledger {
    pub fn record(&mut self, provider: Provider, key: &str) {
        self.effects.total += 1;
        self.effects
            .keys
            .entry(key.to_owned())
            .or_insert(KeyEffects { provider, count: 0 })
            .count += 1;
    }

    pub fn snapshot(&self) -> Effects {
        self.effects.clone()
    }

    pub fn count(&self, key: &str) -> u64 {
        self.effects.count(key)
    }

    /// How many keys have had an effect (no copy of the ledger).
    pub fn distinct_keys(&self) -> usize {
        self.effects.keys.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_key_and_total() {
        let mut l = Ledger::default();
        l.record(Provider::Bank, "a");
        l.record(Provider::Bank, "a");
        l.record(Provider::Mail, "b");
        let e = l.snapshot();
        assert_eq!(
            (e.total, e.count("a"), e.count("b"), e.count("c")),
            (3, 2, 1, 0)
        );
        assert_eq!(l.distinct_keys(), e.keys.len());
        assert_eq!(l.distinct_keys(), 2);
        assert_eq!(
            e.duplicates().map(|(k, _)| k).collect::<Vec<_>>(),
            vec!["a"]
        );
        assert_eq!(
            serde_json::to_value(&e).unwrap()["keys"]["a"],
            serde_json::json!({"provider": "bank", "count": 2})
        );
    }
}
