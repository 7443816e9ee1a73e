//! Payloads encrypted at rest: AES-256-GCM with data keys from a file.
//!
//! The journal keeps an operation's payload while the operation may still be driven
//! (the sweeper republishes it, the reconciler's lookups may need its fields). With data
//! keys configured, that payload is stored *sealed*: `payload_sealed` holds a random
//! 12-byte nonce, the ciphertext of the payload's JSON and the 16-byte tag, and
//! `payload_key_id` the id of the data key that sealed it. The associated data binds the
//! ciphertext to its key id and its row's idempotency key, so a sealed payload copied
//! into another row does not open. The payload hash stays the hash of the canonical
//! *plaintext*: duplicates and conflicts are told apart exactly as before.
//!
//! The data-key file (`ONCELY_DATA_KEYS_FILE`, TOML):
//!
//! ```toml
//! [[key]]
//! id = "dk-2026-12"
//! state = "current"       # new payloads are sealed with it; exactly one
//! hex = "…64 hex digits…" # or: file = "/run/secrets/dk-2026-12" (holding the hex)
//!
//! [[key]]
//! id = "dk-2026-06"
//! state = "decrypt-only"  # payloads sealed with it still open
//! file = "/run/secrets/dk-2026-06"
//! ```
//!
//! Producers and gateways only seal (a file with the current key is all they need; their
//! database role cannot read the sealed column at all); workers and reconcilers open.

use aes_gcm::aead::{Aead, Generate, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Key, Nonce};
use secrecy::zeroize::Zeroize;
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// Env var naming the data-key file.
pub const DATA_KEYS_FILE_ENV: &str = "ONCELY_DATA_KEYS_FILE";

const NONCE_LEN: usize = 12;

/// Why the data keys could not be loaded, or a payload not sealed or opened.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    /// The data-key file (or a key file it names) could not be read.
    #[error("cannot read the data-key file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The data-key file is not valid.
    #[error("data-key file {path}: {problem}")]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the entry.
        problem: String,
    },
    /// A row was sealed with a key id this process does not hold.
    #[error(
        "the payload was sealed with data key {0:?}, which is not in this process's {DATA_KEYS_FILE_ENV} (add it back as decrypt-only)"
    )]
    UnknownKey(String),
    /// A row's sealed payload does not open with its key (altered, or moved from another row).
    #[error("the sealed payload does not open with data key {0:?}: altered or not this row's")]
    Corrupt(String),
    /// The sealed payload opened but is not a JSON object.
    #[error("the opened payload is not a JSON object")]
    NotAnObject,
}

/// A sealed payload as stored: the key id and `nonce || ciphertext || tag`.
#[derive(Clone, PartialEq, Eq)]
pub struct Sealed {
    /// The data key's id.
    pub key_id: String,
    /// Nonce, ciphertext and tag.
    pub bytes: Vec<u8>,
}

impl fmt::Debug for Sealed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Sealed {{ key_id: {:?}, {} bytes }}",
            self.key_id,
            self.bytes.len()
        )
    }
}

/// The data keys of one process: the current one seals, every one opens.
#[derive(Clone)]
pub struct DataKeys {
    current: String,
    keys: HashMap<String, Aes256Gcm>,
}

impl fmt::Debug for DataKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ids: Vec<&String> = self.keys.keys().collect();
        ids.sort();
        f.debug_struct("DataKeys")
            .field("current", &self.current)
            .field("ids", &ids)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeysFile {
    #[serde(default)]
    key: Vec<KeyEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyEntry {
    id: String,
    state: String,
    hex: Option<String>,
    file: Option<PathBuf>,
}

impl DataKeys {
    /// The keys from `ONCELY_DATA_KEYS_FILE`, or `None` when it is not set (payloads are
    /// then stored in plain text; processes say so at start).
    pub fn from_env() -> Result<Option<Self>, SealError> {
        match std::env::var_os(DATA_KEYS_FILE_ENV).filter(|v| !v.is_empty()) {
            Some(path) => Self::load(Path::new(&path)).map(Some),
            None => Ok(None),
        }
    }

    /// Read and check a data-key file.
    pub fn load(path: &Path) -> Result<Self, SealError> {
        let text = std::fs::read_to_string(path).map_err(|source| SealError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parse a data-key file (`path` is for messages). Refused: no current key, two
    /// current keys, a repeated id, a key that is not 32 bytes of hex, an entry with
    /// both or neither of `hex` and `file`, an unknown state.
    pub fn parse(text: &str, path: &Path) -> Result<Self, SealError> {
        let bad = |problem: String| SealError::File {
            path: path.to_owned(),
            problem,
        };
        let file: KeysFile = toml::from_str(text).map_err(|e| bad(e.message().to_owned()))?;
        let mut current = None;
        let mut keys = HashMap::new();
        for (n, e) in file.key.into_iter().enumerate() {
            let at = format!("key #{} (id {:?})", n + 1, e.id);
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
            let mut text = match (e.hex, e.file) {
                (Some(h), None) => h,
                (None, Some(f)) => std::fs::read_to_string(&f)
                    .map_err(|source| SealError::Read { path: f, source })?,
                _ => return Err(bad(format!("{at}: give exactly one of `hex` and `file`"))),
            };
            let decoded = hex::decode(text.trim());
            // The key's copies are wiped as they go out of use (the cipher keeps its own
            // expanded key, wiped on drop: aes-gcm's `zeroize` feature).
            text.zeroize();
            let mut bytes = decoded
                .ok()
                .filter(|b| b.len() == 32)
                .ok_or_else(|| {
                    bad(format!(
                        "{at}: a data key is 32 random bytes written as 64 hex digits (e.g. `openssl rand -hex 32`)"
                    ))
                })?;
            let key = Key::<Aes256Gcm>::try_from(bytes.as_slice());
            bytes.zeroize();
            let mut key = key.map_err(|_| bad(format!("{at}: a data key is 32 bytes")))?;
            let cipher = Aes256Gcm::new(&key);
            key.as_mut_slice().zeroize();
            match e.state.as_str() {
                "current" if current.is_some() => {
                    return Err(bad(format!(
                        "{at}: two keys are `current`; exactly one must be (make the other `decrypt-only`)"
                    )));
                }
                "current" => current = Some(e.id.clone()),
                "decrypt-only" => {}
                other => {
                    return Err(bad(format!(
                        "{at}: state {other:?} is unknown: use \"current\" or \"decrypt-only\""
                    )));
                }
            }
            if keys.insert(e.id.clone(), cipher).is_some() {
                return Err(bad(format!("{at}: the id is used twice")));
            }
        }
        let current = current.ok_or_else(|| {
            bad("no key is `current`; exactly one must be (new payloads are sealed with it)".into())
        })?;
        Ok(Self { current, keys })
    }

    /// The current key's id (logged at start; never the key).
    pub fn current_id(&self) -> &str {
        &self.current
    }

    /// Seal `payload` for the row of `idempotency_key` with the current key.
    pub fn seal(&self, idempotency_key: &str, payload: &Map<String, Value>) -> Sealed {
        let plain = serde_json::to_vec(payload).unwrap_or_default();
        let nonce = Nonce::generate();
        let aad = associated_data(&self.current, idempotency_key);
        let cipher = &self.keys[&self.current];
        // Encryption fails only for messages over ~64 GiB.
        let ct = cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: &plain,
                    aad: &aad,
                },
            )
            .unwrap_or_default();
        let mut bytes = Vec::with_capacity(NONCE_LEN + ct.len());
        bytes.extend_from_slice(nonce.as_slice());
        bytes.extend_from_slice(&ct);
        Sealed {
            key_id: self.current.clone(),
            bytes,
        }
    }

    /// Open the sealed payload of the row of `idempotency_key`.
    pub fn open(
        &self,
        idempotency_key: &str,
        sealed: &Sealed,
    ) -> Result<Map<String, Value>, SealError> {
        let cipher = self
            .keys
            .get(&sealed.key_id)
            .ok_or_else(|| SealError::UnknownKey(sealed.key_id.clone()))?;
        if sealed.bytes.len() < NONCE_LEN {
            return Err(SealError::Corrupt(sealed.key_id.clone()));
        }
        let (nonce, ct) = sealed.bytes.split_at(NONCE_LEN);
        let nonce =
            Nonce::try_from(nonce).map_err(|_| SealError::Corrupt(sealed.key_id.clone()))?;
        let aad = associated_data(&sealed.key_id, idempotency_key);
        let plain = cipher
            .decrypt(&nonce, Payload { msg: ct, aad: &aad })
            .map_err(|_| SealError::Corrupt(sealed.key_id.clone()))?;
        match serde_json::from_slice(&plain) {
            Ok(Value::Object(m)) => Ok(m),
            _ => Err(SealError::NotAnObject),
        }
    }
}

/// `oncely.payload.v1` NUL key id NUL idempotency key.
fn associated_data(key_id: &str, idempotency_key: &str) -> Vec<u8> {
    format!("oncely.payload.v1\0{key_id}\0{idempotency_key}").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const K1: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    const K2: &str = "1f1e1d1c1b1a191817161514131211100f0e0d0c0b0a09080706050403020100";

    fn keys(text: &str) -> Result<DataKeys, SealError> {
        DataKeys::parse(text, Path::new("keys.toml"))
    }

    fn payload() -> Map<String, Value> {
        json!({"to": "marker-7f3a@example.org", "amount_minor": 125000})
            .as_object()
            .cloned()
            .expect("object")
    }

    #[test]
    fn seal_then_open_round_trips_and_hides_the_plaintext() {
        let k = keys(&format!(
            "[[key]]\nid = \"a\"\nstate = \"current\"\nhex = \"{K1}\"\n"
        ))
        .expect("keys");
        let s = k.seal("v1:aa", &payload());
        assert_eq!(s.key_id, "a");
        assert!(!String::from_utf8_lossy(&s.bytes).contains("marker-7f3a"));
        assert_eq!(k.open("v1:aa", &s).expect("open"), payload());
        // A fresh nonce each time.
        assert_ne!(k.seal("v1:aa", &payload()).bytes, s.bytes);
        // Bound to its row: another key's row does not open it.
        assert!(matches!(k.open("v1:bb", &s), Err(SealError::Corrupt(_))));
        let mut flipped = s.clone();
        let last = flipped.bytes.len() - 1;
        flipped.bytes[last] ^= 1;
        assert!(matches!(
            k.open("v1:aa", &flipped),
            Err(SealError::Corrupt(_))
        ));
    }

    #[test]
    fn rotation_old_keys_open_new_key_seals() {
        let old = keys(&format!(
            "[[key]]\nid = \"a\"\nstate = \"current\"\nhex = \"{K1}\"\n"
        ))
        .expect("keys");
        let sealed_old = old.seal("v1:aa", &payload());
        let rotated = keys(&format!(
            "[[key]]\nid = \"b\"\nstate = \"current\"\nhex = \"{K2}\"\n\
             [[key]]\nid = \"a\"\nstate = \"decrypt-only\"\nhex = \"{K1}\"\n"
        ))
        .expect("keys");
        assert_eq!(rotated.open("v1:aa", &sealed_old).expect("open"), payload());
        assert_eq!(rotated.seal("v1:aa", &payload()).key_id, "b");
        let only_new = keys(&format!(
            "[[key]]\nid = \"b\"\nstate = \"current\"\nhex = \"{K2}\"\n"
        ))
        .expect("keys");
        let err = only_new.open("v1:aa", &sealed_old).expect_err("unknown");
        assert!(
            matches!(err, SealError::UnknownKey(ref id) if id == "a"),
            "{err}"
        );
        assert!(
            err.to_string()
                .contains("not in this process's ONCELY_DATA_KEYS_FILE")
        );
    }

    #[test]
    fn bad_files_are_refused_with_the_entry_named() {
        let cases = [
            (String::new(), "no key is `current`".to_owned()),
            (
                format!(
                    "[[key]]\nid = \"a\"\nstate = \"current\"\nhex = \"{K1}\"\n[[key]]\nid = \"b\"\nstate = \"current\"\nhex = \"{K2}\"\n"
                ),
                "key #2 (id \"b\"): two keys are `current`".to_owned(),
            ),
            (
                "[[key]]\nid = \"a\"\nstate = \"current\"\nhex = \"abcd\"\n".to_owned(),
                "32 random bytes".to_owned(),
            ),
            (
                format!(
                    "[[key]]\nid = \"a\"\nstate = \"current\"\nhex = \"{K1}\"\n[[key]]\nid = \"a\"\nstate = \"decrypt-only\"\nhex = \"{K2}\"\n"
                ),
                "the id is used twice".to_owned(),
            ),
            (
                format!("[[key]]\nid = \"a\"\nstate = \"old\"\nhex = \"{K1}\"\n"),
                "state \"old\" is unknown".to_owned(),
            ),
            (
                "[[key]]\nid = \"a\"\nstate = \"current\"\n".to_owned(),
                "exactly one of `hex` and `file`".to_owned(),
            ),
        ];
        for (text, expected) in cases {
            let err = keys(&text).expect_err(&expected).to_string();
            assert!(err.contains(&expected), "{err} (wanted {expected})");
            assert!(err.starts_with("data-key file keys.toml: "), "{err}");
        }
    }

    #[test]
    fn debug_never_shows_key_material() {
        let k = keys(&format!(
            "[[key]]\nid = \"a\"\nstate = \"current\"\nhex = \"{K1}\"\n"
        ))
        .expect("keys");
        let shown = format!("{k:?}");
        assert!(
            shown.contains("\"a\"") && !shown.contains("0001020304"),
            "{shown}"
        );
    }
}
