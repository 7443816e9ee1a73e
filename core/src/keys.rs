//! Idempotency keys, payload hashes and the key ring that signs keys.
//!
//! A key is `v1:` + hex HMAC-SHA256 (secret, canonical JSON of the business identity).
//! The HMAC (rather than a bare hash) means a key reveals nothing about the identity and
//! cannot be forged by someone without the secret; the `v1` prefix leaves room to change
//! the scheme. The secret itself rotates through a [`KeyRing`] (one current secret,
//! older or newer ones verify-only); see docs/security.md for the procedure. A payload hash is `sha256:` + hex SHA-256 of the canonical payload; it is
//! what tells a repeated intent (same hash) from a conflicting one (same key, new body).
//! Both are parsed once at the edge into newtypes so the inside never re-checks strings.

use crate::canonical::{CanonicalError, canonical_json};
use crate::identity::BusinessIdentity;
use hmac::{Hmac, KeyInit, Mac};
use secrecy::{ExposeSecret, SecretSlice};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::fmt;
use std::path::PathBuf;

/// Env var naming a key-ring file: several secrets with ids, one current (see [`KeyRing`]).
pub const SECRETS_FILE_ENV: &str = "ONCELY_KEY_SECRETS_FILE";
/// Env var naming a file that holds the one key secret (a ring of one).
pub const SECRET_FILE_ENV: &str = "ONCELY_KEY_SECRET_FILE";
/// Env var holding the one key secret itself (fallback).
pub const SECRET_ENV: &str = "ONCELY_KEY_SECRET";

/// Why a key, hash or secret was refused.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// Not `v1:` followed by 64 lowercase hex digits.
    #[error(
        "idempotency key {0:?} is malformed: expected \"v1:\" followed by 64 lowercase hex digits"
    )]
    MalformedKey(String),
    /// Not `sha256:` followed by 64 lowercase hex digits.
    #[error(
        "payload hash {0:?} is malformed: expected \"sha256:\" followed by 64 lowercase hex digits"
    )]
    MalformedHash(String),
    /// No secret variable is set.
    #[error(
        "no key secret: set {SECRETS_FILE_ENV} to a key-ring file, or {SECRET_FILE_ENV} to a file holding the secret, or {SECRET_ENV}"
    )]
    MissingSecret,
    /// Both a ring and a single secret are set: which one counts would be a guess.
    #[error(
        "both {SECRETS_FILE_ENV} and {0} are set: use the key ring alone (put the old secret in it with its own id)"
    )]
    Ambiguous(&'static str),
    /// The secret is empty.
    #[error("the key secret from {0} is empty")]
    EmptySecret(&'static str),
    /// The current secret is shorter than [`MIN_SECRET_BYTES`].
    #[error(
        "the key secret from {0} is {1} bytes: new keys need at least 16 (e.g. `head -c 32 /dev/urandom | base64`); \
         an older, shorter secret may stay in a key ring as `verify-only`"
    )]
    ShortSecret(String, usize),
    /// The secret file could not be read.
    #[error("cannot read the key secret file {path}: {source}")]
    SecretFile {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The key-ring file is not a valid ring.
    #[error("key ring {path}: {problem}")]
    Ring {
        /// The ring file.
        path: PathBuf,
        /// What is wrong, naming the entry.
        problem: String,
    },
    /// The payload cannot be put in canonical form.
    #[error("payload cannot be hashed: {0}")]
    Canonical(#[from] CanonicalError),
}

impl KeyError {
    /// Name where a refused secret came from (an environment variable).
    fn naming_source(self, source: &str) -> Self {
        match self {
            KeyError::ShortSecret(_, n) => KeyError::ShortSecret(source.to_owned(), n),
            other => other,
        }
    }
}

/// The shortest current secret accepted (bytes): 128 bits, above NIST SP 800-107's
/// 112-bit floor for HMAC keys. Verify-only secrets may be shorter (a ring can keep an
/// old short secret while its keys are still in flight).
pub const MIN_SECRET_BYTES: usize = 16;

/// One HMAC secret of the ring, with its id.
#[derive(Clone)]
struct RingSecret {
    id: String,
    bytes: SecretSlice<u8>,
}

impl RingSecret {
    fn mac(&self, canonical_identity: &[u8]) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(self.bytes.expose_secret())
            .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"));
        mac.update(canonical_identity);
        mac
    }

    fn key_for(&self, canonical_identity: &[u8]) -> IdempotencyKey {
        let mac = self.mac(canonical_identity);
        IdempotencyKey(format!("v1:{}", hex::encode(mac.finalize().into_bytes())))
    }

    /// Whether `tag` (the key's 32 bytes) is this secret's HMAC of the identity, compared
    /// in constant time (`verify_slice`): how long a forged key takes to refuse does not
    /// tell a forger how many of its leading bytes were right.
    fn verifies(&self, canonical_identity: &[u8], tag: &[u8]) -> bool {
        self.mac(canonical_identity).verify_slice(tag).is_ok()
    }
}

/// The fleet's key secrets: one *current* secret that new keys are made with, and any
/// number of *verify-only* secrets (an older one being retired, or a newer one being
/// rolled out) under which an envelope's key is still accepted.
///
/// Rotation never executes an intent twice, because the journal recognises a repeated
/// intent by its business identity (a unique index), not only by its key: an intent
/// first recorded under the old secret is a duplicate of that row whatever secret its
/// repetition was keyed with. The ring decides only which keys are *authentic*.
/// Never printed: `Debug` shows the ids, not the secrets.
#[derive(Clone)]
pub struct KeyRing {
    current: RingSecret,
    verify_only: Vec<RingSecret>,
}

impl fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyRing")
            .field("current", &self.current.id)
            .field(
                "verify_only",
                &self.verify_only.iter().map(|s| &s.id).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// The key-ring file: `[[secret]]` tables.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RingFile {
    #[serde(default)]
    secret: Vec<RingEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RingEntry {
    id: String,
    state: String,
    value: Option<String>,
    file: Option<PathBuf>,
}

impl KeyRing {
    /// A ring of one secret (id `default`) from raw bytes. Empty secrets and secrets
    /// shorter than [`MIN_SECRET_BYTES`] are refused.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self, KeyError> {
        let bytes: Vec<u8> = bytes.into();
        if bytes.is_empty() {
            return Err(KeyError::EmptySecret("the caller"));
        }
        if bytes.len() < MIN_SECRET_BYTES {
            return Err(KeyError::ShortSecret("the caller".into(), bytes.len()));
        }
        Ok(Self {
            current: RingSecret {
                id: "default".into(),
                bytes: SecretSlice::from(bytes),
            },
            verify_only: Vec::new(),
        })
    }

    /// Read the ring: `ONCELY_KEY_SECRETS_FILE` (a key-ring file, see
    /// [`KeyRing::parse_ring`]), else a ring of one from `ONCELY_KEY_SECRET_FILE` (one
    /// trailing newline is dropped, as editors add one) or `ONCELY_KEY_SECRET`.
    pub fn from_env() -> Result<Self, KeyError> {
        Self::from_lookup(|name| std::env::var_os(name))
    }

    /// [`KeyRing::from_env`] over any variable lookup (testable without touching the env).
    pub fn from_lookup(get: impl Fn(&str) -> Option<std::ffi::OsString>) -> Result<Self, KeyError> {
        let set = |name: &str| get(name).filter(|v| !v.is_empty());
        if let Some(path) = set(SECRETS_FILE_ENV) {
            for single in [SECRET_FILE_ENV, SECRET_ENV] {
                if set(single).is_some() {
                    return Err(KeyError::Ambiguous(single));
                }
            }
            let path = PathBuf::from(path);
            let text = std::fs::read_to_string(&path).map_err(|source| KeyError::SecretFile {
                path: path.clone(),
                source,
            })?;
            return Self::parse_ring(&text, &path);
        }
        if let Some(path) = set(SECRET_FILE_ENV) {
            let path = PathBuf::from(path);
            let bytes = read_secret_file(&path)?;
            if bytes.is_empty() {
                return Err(KeyError::EmptySecret(SECRET_FILE_ENV));
            }
            return Self::new(bytes).map_err(|e| e.naming_source(SECRET_FILE_ENV));
        }
        match get(SECRET_ENV) {
            Some(v) if v.is_empty() => Err(KeyError::EmptySecret(SECRET_ENV)),
            Some(v) => Self::new(v.into_encoded_bytes()).map_err(|e| e.naming_source(SECRET_ENV)),
            None => Err(KeyError::MissingSecret),
        }
    }

    /// Parse a key-ring file (TOML; `path` is for messages):
    ///
    /// ```toml
    /// [[secret]]
    /// id = "2026-12"           # letters, digits, '.', '_', '-'
    /// state = "current"        # exactly one entry is current
    /// file = "/run/secrets/oncely-key-2026-12"   # or: value = "…"
    ///
    /// [[secret]]
    /// id = "2026-06"
    /// state = "verify-only"    # keys made with it are still accepted
    /// file = "/run/secrets/oncely-key-2026-06"
    /// ```
    ///
    /// Refused: no current secret, two current secrets, a repeated id or secret, an
    /// empty secret, an entry with both or neither of `value` and `file`, an unknown state.
    pub fn parse_ring(text: &str, path: &std::path::Path) -> Result<Self, KeyError> {
        let bad = |problem: String| KeyError::Ring {
            path: path.to_owned(),
            problem,
        };
        let file: RingFile = toml::from_str(text).map_err(|e| bad(e.message().to_owned()))?;
        let mut current: Option<RingSecret> = None;
        let mut verify_only = Vec::new();
        let mut ids = std::collections::HashSet::new();
        let mut seen: Vec<Vec<u8>> = Vec::new();
        for (n, e) in file.secret.into_iter().enumerate() {
            let at = format!("secret #{} (id {:?})", n + 1, e.id);
            let id_ok = !e.id.is_empty()
                && e.id.len() <= 64
                && e.id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
            if !id_ok {
                return Err(bad(format!(
                    "{at}: the id must be 1..=64 letters, digits, '.', '_' or '-'"
                )));
            }
            if !ids.insert(e.id.clone()) {
                return Err(bad(format!("{at}: the id is used twice")));
            }
            let bytes = match (e.value, e.file) {
                (Some(v), None) => v.into_bytes(),
                (None, Some(f)) => read_secret_file(&f)?,
                _ => {
                    return Err(bad(format!("{at}: give exactly one of `value` and `file`")));
                }
            };
            if bytes.is_empty() {
                return Err(bad(format!("{at}: the secret is empty")));
            }
            if seen.contains(&bytes) {
                return Err(bad(format!("{at}: the same secret appears under two ids")));
            }
            seen.push(bytes.clone());
            let secret = RingSecret {
                id: e.id,
                bytes: SecretSlice::from(bytes),
            };
            match e.state.as_str() {
                "current" if current.is_some() => {
                    return Err(bad(format!(
                        "{at}: two secrets are `current`; exactly one must be (make the other `verify-only`)"
                    )));
                }
                "current" => current = Some(secret),
                "verify-only" => verify_only.push(secret),
                other => {
                    return Err(bad(format!(
                        "{at}: state {other:?} is unknown: use \"current\" or \"verify-only\""
                    )));
                }
            }
        }
        let current = current.ok_or_else(|| {
            bad("no secret is `current`; exactly one must be (new keys are made with it)".into())
        })?;
        let len = current.bytes.expose_secret().len();
        if len < MIN_SECRET_BYTES {
            return Err(bad(format!(
                "the current secret (id {:?}) is {len} bytes: new keys need at least \
                 {MIN_SECRET_BYTES} (e.g. `head -c 32 /dev/urandom | base64`); a shorter old secret may stay `verify-only`",
                current.id
            )));
        }
        Ok(Self {
            current,
            verify_only,
        })
    }

    /// The idempotency key of `identity` under the current secret.
    pub fn key_for(&self, identity: &BusinessIdentity) -> IdempotencyKey {
        self.current.key_for(&canonical_identity(identity))
    }

    /// The id of the secret under which `key` is the key of `identity` (the current one
    /// first), or `None`: the key is forged, or made with a secret not in this ring.
    pub fn verify(&self, identity: &BusinessIdentity, key: &IdempotencyKey) -> Option<&str> {
        let tag = key
            .as_str()
            .strip_prefix("v1:")
            .and_then(|h| hex::decode(h).ok())?;
        let bytes = canonical_identity(identity);
        std::iter::once(&self.current)
            .chain(&self.verify_only)
            .find(|s| s.verifies(&bytes, &tag))
            .map(|s| s.id.as_str())
    }

    /// The current secret's id (logged at start; never the secret).
    pub fn current_id(&self) -> &str {
        &self.current.id
    }

    /// The verify-only secrets' ids.
    pub fn verify_only_ids(&self) -> impl Iterator<Item = &str> {
        self.verify_only.iter().map(|s| s.id.as_str())
    }

    /// The keys of `identity` under every secret of the ring, the current one first.
    pub fn all_keys_for(&self, identity: &BusinessIdentity) -> Vec<IdempotencyKey> {
        let bytes = canonical_identity(identity);
        std::iter::once(&self.current)
            .chain(&self.verify_only)
            .map(|s| s.key_for(&bytes))
            .collect()
    }
}

/// The identity holds only strings and integers, so canonical form cannot fail.
fn canonical_identity(identity: &BusinessIdentity) -> Vec<u8> {
    canonical_json(&identity.to_json()).unwrap_or_default()
}

/// A secret file's bytes, one trailing newline dropped (editors add one).
fn read_secret_file(path: &std::path::Path) -> Result<Vec<u8>, KeyError> {
    let mut bytes = std::fs::read(path).map_err(|source| KeyError::SecretFile {
        path: path.to_owned(),
        source,
    })?;
    if bytes.ends_with(b"\n") {
        bytes.pop();
        if bytes.ends_with(b"\r") {
            bytes.pop();
        }
    }
    Ok(bytes)
}

fn is_lower_hex_64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A parsed idempotency key: `v1:` + 64 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// Parse a key; anything else is [`KeyError::MalformedKey`].
    pub fn parse(s: &str) -> Result<Self, KeyError> {
        match s.strip_prefix("v1:") {
            Some(hex) if is_lower_hex_64(hex) => Ok(Self(s.to_owned())),
            _ => Err(KeyError::MalformedKey(truncate(s))),
        }
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for IdempotencyKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        IdempotencyKey::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// A parsed payload hash: `sha256:` + 64 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct PayloadHash(String);

impl PayloadHash {
    /// Parse a hash; anything else is [`KeyError::MalformedHash`].
    pub fn parse(s: &str) -> Result<Self, KeyError> {
        match s.strip_prefix("sha256:") {
            Some(hex) if is_lower_hex_64(hex) => Ok(Self(s.to_owned())),
            _ => Err(KeyError::MalformedHash(truncate(s))),
        }
    }

    /// The hash of a payload's canonical JSON.
    pub fn of(payload: &Value) -> Result<Self, KeyError> {
        let bytes = canonical_json(payload)?;
        Ok(Self(format!(
            "sha256:{}",
            hex::encode(Sha256::digest(&bytes))
        )))
    }

    /// The hash as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PayloadHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for PayloadHash {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        PayloadHash::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// Error messages quote bad input, but never more than a short prefix of it.
fn truncate(s: &str) -> String {
    s.chars().take(80).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn secret() -> KeyRing {
        KeyRing::new(b"test-secret-do-not-use".to_vec()).expect("secret")
    }

    fn identity(v: Value) -> BusinessIdentity {
        BusinessIdentity::from_json(v.as_object().expect("object")).expect("identity")
    }

    #[test]
    fn design_test_vector_key() {
        let id = identity(
            json!({"action_type":"email.send","workflow_id":"case-1842","step":"send_approval_notice","business_object":"application-731","revision":2}),
        );
        assert_eq!(
            crate::canonical::canonical_string(&id.to_json()).expect("canonical"),
            r#"{"action_type":"email.send","business_object":"application-731","revision":2,"step":"send_approval_notice","workflow_id":"case-1842"}"#
        );
        assert_eq!(
            secret().key_for(&id).as_str(),
            "v1:df776990f0466ed1f9862063fe0aa224ea08f78c7ecc6e1e8a2786867fbf3ede"
        );
    }

    #[test]
    fn design_test_vector_payload_hash() {
        let payload = json!({"account_id":"example-account","amount_minor":125000,"currency":"RUB","business_reference":"application-731"});
        assert_eq!(
            PayloadHash::of(&payload).expect("hash").as_str(),
            "sha256:003e1cb47a383bcc76345f2954cfd442841bb6af6063b76d1c925eb0433ab80e"
        );
    }

    #[test]
    fn parse_accepts_only_the_exact_format() {
        let good = "v1:df776990f0466ed1f9862063fe0aa224ea08f78c7ecc6e1e8a2786867fbf3ede";
        assert!(IdempotencyKey::parse(good).is_ok());
        for bad in [
            "",
            "v1:",
            "v2:df776990f0466ed1f9862063fe0aa224ea08f78c7ecc6e1e8a2786867fbf3ede",
            &good.to_uppercase(),
            &format!("{good}0"),
            &good[..good.len() - 1],
        ] {
            assert!(IdempotencyKey::parse(bad).is_err(), "{bad}");
        }
        assert!(
            PayloadHash::parse(
                "sha256:003e1cb47a383bcc76345f2954cfd442841bb6af6063b76d1c925eb0433ab80e"
            )
            .is_ok()
        );
        assert!(PayloadHash::parse("sha256:xyz").is_err());
    }

    #[test]
    fn secret_never_appears_in_debug() {
        let shown = format!("{:?}", secret());
        assert!(
            shown.contains("default") && !shown.contains("test-secret"),
            "{shown}"
        );
    }

    #[test]
    fn secret_from_file_then_env_then_error() {
        let dir = std::env::temp_dir().join(format!("oncely-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("secret");
        std::fs::write(&file, "test-secret-do-not-use\n").expect("write");
        let id = identity(
            json!({"action_type":"email.send","workflow_id":"case-1842","step":"send_approval_notice","business_object":"application-731","revision":2}),
        );
        let from_file =
            KeyRing::from_lookup(|n| (n == SECRET_FILE_ENV).then(|| file.clone().into_os_string()))
                .expect("file");
        assert_eq!(
            from_file.key_for(&id),
            secret().key_for(&id),
            "trailing newline is dropped"
        );
        let from_env =
            KeyRing::from_lookup(|n| (n == SECRET_ENV).then(|| "test-secret-do-not-use".into()))
                .expect("env");
        assert_eq!(from_env.key_for(&id), secret().key_for(&id));
        assert!(matches!(
            KeyRing::from_lookup(|_| None),
            Err(KeyError::MissingSecret)
        ));
        assert!(matches!(
            KeyRing::from_lookup(|n| (n == SECRET_ENV).then(|| "".into())),
            Err(KeyError::EmptySecret(_))
        ));
        let missing = dir.join("nope");
        let err = KeyRing::from_lookup(|n| {
            (n == SECRET_FILE_ENV).then(|| missing.clone().into_os_string())
        })
        .expect_err("missing file");
        assert!(
            err.to_string().contains("cannot read the key secret file"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    fn ring(text: &str) -> Result<KeyRing, KeyError> {
        KeyRing::parse_ring(text, std::path::Path::new("ring.toml"))
    }

    #[test]
    fn ring_makes_keys_with_the_current_secret_and_verifies_under_all() {
        let id = identity(
            json!({"action_type":"email.send","workflow_id":"case-1842","step":"send_approval_notice","business_object":"application-731","revision":2}),
        );
        let old = secret();
        let new = KeyRing::new(b"the-new-secret-of-this-test".to_vec()).expect("secret");
        let rotated = ring(
            "[[secret]]\nid = \"new\"\nstate = \"current\"\nvalue = \"the-new-secret-of-this-test\"\n\n\
             [[secret]]\nid = \"old\"\nstate = \"verify-only\"\nvalue = \"test-secret-do-not-use\"\n",
        )
        .expect("ring");
        assert_eq!(rotated.key_for(&id), new.key_for(&id));
        assert_eq!(rotated.verify(&id, &old.key_for(&id)), Some("old"));
        assert_eq!(rotated.verify(&id, &new.key_for(&id)), Some("new"));
        let stranger = KeyRing::new(b"someone-else-entirely".to_vec()).expect("secret");
        assert_eq!(rotated.verify(&id, &stranger.key_for(&id)), None);
        assert_eq!(rotated.all_keys_for(&id).len(), 2);
        let shown = format!("{rotated:?}");
        assert!(
            shown.contains("\"new\"") && !shown.contains("the-new-secret"),
            "{shown}"
        );
    }

    #[test]
    fn bad_rings_are_refused_with_the_entry_named() {
        let cases = [
            ("", "no secret is `current`"),
            (
                "[[secret]]\nid = \"a\"\nstate = \"verify-only\"\nvalue = \"x\"\n",
                "no secret is `current`",
            ),
            (
                "[[secret]]\nid = \"a\"\nstate = \"current\"\nvalue = \"x\"\n[[secret]]\nid = \"b\"\nstate = \"current\"\nvalue = \"y\"\n",
                "secret #2 (id \"b\"): two secrets are `current`",
            ),
            (
                "[[secret]]\nid = \"a\"\nstate = \"current\"\nvalue = \"x\"\n[[secret]]\nid = \"a\"\nstate = \"verify-only\"\nvalue = \"y\"\n",
                "the id is used twice",
            ),
            (
                "[[secret]]\nid = \"a\"\nstate = \"current\"\nvalue = \"x\"\n[[secret]]\nid = \"b\"\nstate = \"verify-only\"\nvalue = \"x\"\n",
                "the same secret appears under two ids",
            ),
            (
                "[[secret]]\nid = \"a\"\nstate = \"current\"\nvalue = \"\"\n",
                "the secret is empty",
            ),
            (
                "[[secret]]\nid = \"a\"\nstate = \"current\"\n",
                "exactly one of `value` and `file`",
            ),
            (
                "[[secret]]\nid = \"a\"\nstate = \"retired\"\nvalue = \"x\"\n",
                "state \"retired\" is unknown",
            ),
            (
                "[[secret]]\nid = \"a b\"\nstate = \"current\"\nvalue = \"x\"\n",
                "the id must be",
            ),
            (
                "[[secret]]\nid = \"a\"\nstate = \"current\"\nvalue = \"fifteen-bytes!!\"\n",
                "the current secret (id \"a\") is 15 bytes: new keys need at least 16",
            ),
        ];
        for (text, expected) in cases {
            let err = ring(text).expect_err(expected).to_string();
            assert!(err.contains(expected), "{err} (wanted {expected})");
            assert!(err.starts_with("key ring ring.toml: "), "{err}");
        }
    }

    /// Issue 43: any non-empty secret was accepted (`ONCELY_KEY_SECRET=x`).
    #[test]
    fn short_current_secrets_are_refused_and_short_old_ones_may_verify() {
        let err =
            KeyRing::from_lookup(|n| (n == SECRET_ENV).then(|| "x".into())).expect_err("one byte");
        assert_eq!(
            err.to_string().split(':').next(),
            Some("the key secret from ONCELY_KEY_SECRET is 1 bytes")
        );
        assert!(KeyRing::new(b"0123456789abcdef".to_vec()).is_ok());
        let ring = ring(
            "[[secret]]\nid = \"new\"\nstate = \"current\"\nvalue = \"a-long-enough-secret\"\n\
             [[secret]]\nid = \"old\"\nstate = \"verify-only\"\nvalue = \"short\"\n",
        )
        .expect("a short verify-only secret is accepted");
        assert_eq!(ring.verify_only_ids().collect::<Vec<_>>(), ["old"]);
    }

    #[test]
    fn a_ring_and_a_single_secret_together_are_refused() {
        let err = KeyRing::from_lookup(|n| match n {
            SECRETS_FILE_ENV => Some("/nonexistent/ring.toml".into()),
            SECRET_ENV => Some("x".into()),
            _ => None,
        })
        .expect_err("ambiguous");
        assert!(matches!(err, KeyError::Ambiguous(SECRET_ENV)), "{err}");
    }
}
