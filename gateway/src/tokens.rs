//! Bearer tokens: who is calling, for which tenant, allowed which action types.
//!
//! The file (`--tokens-file`, TOML) holds only SHA-256 hashes of the tokens:
//!
//! ```toml
//! [[token]]
//! id = "billing-agent"                 # for logs and metrics; never the token
//! tenant = "acme"                      # part of every key this token creates
//! sha256 = "9f86d08…"                  # `oncely-gateway token hash` prints it
//! actions = ["payment_order.create"]   # optional; absent = every configured type
//! quota = { per_second = 5, burst = 20 }  # optional: submits this token may make
//! approve = true                       # optional: may approve/reject its tenant's held
//!                                      # actions (never one it asked for itself)
//!
//! [[tenant]]                           # optional: a quota shared by every token of a tenant
//! name = "acme"
//! quota = { per_second = 50, burst = 100 }
//! ```
//!
//! A presented token is hashed and compared with *every* entry in constant time (no early
//! exit, no map lookup keyed by the secret), so the answer's timing says nothing about
//! how much of a hash matched.

use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::path::Path;

/// Who is calling (from a valid token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The tenant: part of the business identity of everything this caller enqueues.
    pub tenant: String,
    /// The token's id (for logs; never the token).
    pub token_id: String,
    /// The action types this token may enqueue; `None` = all configured ones.
    pub allowed: Option<BTreeSet<String>>,
    /// This token's quota of submits.
    pub quota: Option<crate::quota::Quota>,
    /// Its tenant's quota, shared by every token of the tenant.
    pub tenant_quota: Option<crate::quota::Quota>,
    /// May approve and reject its tenant's held actions (docs/approvals.md).
    pub approve: bool,
}

impl Caller {
    /// Whether this caller may enqueue `action_type`.
    pub fn may(&self, action_type: &str) -> bool {
        self.allowed
            .as_ref()
            .is_none_or(|a| a.contains(action_type))
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    token: Vec<Entry>,
    #[serde(default)]
    tenant: Vec<TenantEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantEntry {
    name: String,
    quota: crate::quota::Quota,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    id: String,
    tenant: String,
    sha256: String,
    #[serde(default)]
    actions: Option<Vec<String>>,
    #[serde(default)]
    quota: Option<crate::quota::Quota>,
    #[serde(default)]
    approve: bool,
}

/// The loaded tokens.
#[derive(Debug, Default)]
pub struct Tokens {
    entries: Vec<([u8; 32], Caller)>,
}

/// Why the tokens file was refused.
#[derive(Debug, thiserror::Error)]
#[error("tokens file {path}: {problem}")]
pub struct TokensError {
    path: String,
    problem: String,
}

/// The SHA-256 of a token, as the file stores it (hex).
pub fn hash_hex(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

impl Tokens {
    /// Load and check a tokens file; every action type named must be in `known`.
    pub fn load(path: &Path, known: &BTreeSet<String>) -> Result<Self, TokensError> {
        let err = |problem: String| TokensError {
            path: path.display().to_string(),
            problem,
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        Self::parse(&text, known).map_err(err)
    }

    /// Parse a tokens file's text.
    pub fn parse(text: &str, known: &BTreeSet<String>) -> Result<Self, String> {
        let file: File = toml::from_str(text).map_err(|e| e.to_string())?;
        if file.token.is_empty() {
            return Err("no [[token]] entries: nobody could call the gateway".into());
        }
        let mut tenant_quotas = std::collections::BTreeMap::new();
        for (i, t) in file.tenant.into_iter().enumerate() {
            let at = format!("tenant[{i}] ({:?})", t.name);
            if let Some(problem) = t.quota.problem() {
                return Err(format!("{at}: {problem}"));
            }
            if tenant_quotas.insert(t.name, t.quota).is_some() {
                return Err(format!("{at}: a tenant may have one [[tenant]] entry"));
            }
        }
        let mut ids = BTreeSet::new();
        let mut entries = Vec::new();
        for (i, e) in file.token.into_iter().enumerate() {
            let at = format!("token[{i}] ({:?})", e.id);
            if e.id.is_empty() || !ids.insert(e.id.clone()) {
                return Err(format!("{at}: id must be non-empty and unique"));
            }
            if e.tenant.is_empty() || e.tenant.len() > 256 {
                return Err(format!("{at}: tenant must be 1..=256 characters"));
            }
            let mut hash = [0u8; 32];
            hex::decode_to_slice(e.sha256.trim(), &mut hash).map_err(|_| {
                format!(
                    "{at}: sha256 must be 64 hex digits (`oncely-gateway token hash` prints it)"
                )
            })?;
            if let Some((_, other)) = entries
                .iter()
                .find(|(h, _): &&([u8; 32], Caller)| *h == hash)
            {
                return Err(format!(
                    "{at}: the same sha256 as token {:?}: one token cannot be two callers (which \
                     tenant and rights would it get?); give each its own token",
                    other.token_id
                ));
            }
            let allowed = match e.actions {
                None => None,
                Some(list) => {
                    if let Some(unknown) = list.iter().find(|a| !known.contains(*a)) {
                        return Err(format!(
                            "{at}: action type {unknown:?} is not configured (known: {})",
                            known.iter().cloned().collect::<Vec<_>>().join(", ")
                        ));
                    }
                    Some(list.into_iter().collect())
                }
            };
            if let Some(problem) = e.quota.and_then(|q| q.problem()) {
                return Err(format!("{at}: {problem}"));
            }
            entries.push((
                hash,
                Caller {
                    tenant_quota: tenant_quotas.get(&e.tenant).copied(),
                    tenant: e.tenant,
                    token_id: e.id,
                    allowed,
                    quota: e.quota,
                    approve: e.approve,
                },
            ));
        }
        Ok(Self { entries })
    }

    /// The caller a bearer token belongs to; `None` for an unknown token.
    pub fn authenticate(&self, token: &str) -> Option<Caller> {
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for (hash, caller) in &self.entries {
            // Every entry is compared, whatever matched before.
            if constant_time_eq(hash, &presented) && found.is_none() {
                found = Some(caller);
            }
        }
        found.cloned()
    }
}

/// Compare two hashes without a data-dependent branch or early exit.
pub(crate) fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// A new random token (32 bytes from the OS, hex): for `oncely-gateway token new`.
pub fn generate() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(format!("onc_{}", hex::encode(bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known() -> BTreeSet<String> {
        ["email.send", "ticket.create"].map(String::from).into()
    }

    fn file() -> String {
        format!(
            "[[token]]\nid = \"a\"\ntenant = \"acme\"\nsha256 = \"{}\"\n\n[[token]]\nid = \"b\"\ntenant = \"globex\"\nsha256 = \"{}\"\nactions = [\"ticket.create\"]\n",
            hash_hex("token-a"),
            hash_hex("token-b")
        )
    }

    #[test]
    fn a_token_maps_to_its_tenant_and_actions() {
        let t = Tokens::parse(&file(), &known()).expect("parse");
        let a = t.authenticate("token-a").expect("a");
        assert_eq!((a.tenant.as_str(), a.token_id.as_str()), ("acme", "a"));
        assert!(a.may("email.send"));
        let b = t.authenticate("token-b").expect("b");
        assert_eq!(b.tenant, "globex");
        assert!(b.may("ticket.create") && !b.may("email.send"));
        assert_eq!(t.authenticate("token-c"), None);
        assert_eq!(t.authenticate(""), None);
    }

    #[test]
    fn bad_files_are_refused_with_the_entry_named() {
        let e = Tokens::parse("", &known()).expect_err("empty");
        assert!(e.contains("no [[token]]"), "{e}");
        let bad_hash = "[[token]]\nid = \"a\"\ntenant = \"t\"\nsha256 = \"xyz\"\n";
        let e = Tokens::parse(bad_hash, &known()).expect_err("hash");
        assert!(e.contains("token[0]") && e.contains("64 hex"), "{e}");
        let unknown = format!(
            "[[token]]\nid = \"a\"\ntenant = \"t\"\nsha256 = \"{}\"\nactions = [\"nope.x\"]\n",
            hash_hex("x")
        );
        let e = Tokens::parse(&unknown, &known()).expect_err("action");
        assert!(e.contains("\"nope.x\" is not configured"), "{e}");
        let dup = format!(
            "{}{}",
            file(),
            file().replace("tenant = \"acme\"", "tenant = \"x\"")
        );
        assert!(
            Tokens::parse(&dup, &known())
                .expect_err("dup")
                .contains("unique")
        );
    }

    /// Issue 43: two entries with one hash were accepted, the first silently winning.
    #[test]
    fn one_token_hash_under_two_entries_is_refused() {
        let twice = format!(
            "[[token]]\nid = \"a\"\ntenant = \"acme\"\nsha256 = \"{h}\"\n\n\
             [[token]]\nid = \"b\"\ntenant = \"globex\"\nsha256 = \"{h}\"\n",
            h = hash_hex("token-a")
        );
        let e = Tokens::parse(&twice, &known()).expect_err("one hash, two callers");
        assert!(
            e.contains("token[1] (\"b\")") && e.contains("the same sha256 as token \"a\""),
            "{e}"
        );
    }

    #[test]
    fn generated_tokens_differ() {
        let (a, b) = (generate().expect("a"), generate().expect("b"));
        assert_ne!(a, b);
        assert!(a.starts_with("onc_") && a.len() == 68);
    }
}
