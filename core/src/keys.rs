//! Idempotency keys, payload hashes and the secret that signs keys.
//!
//! A key is `v1:` + hex HMAC-SHA256 (secret, canonical JSON of the business identity).
//! The HMAC (rather than a bare hash) means a key reveals nothing about the identity and
//! cannot be forged by someone without the secret; the `v1` prefix leaves room to rotate
//! the scheme. A payload hash is `sha256:` + hex SHA-256 of the canonical payload; it is
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

/// Env var naming a file that holds the key secret (preferred).
pub const SECRET_FILE_ENV: &str = "ONCELY_KEY_SECRET_FILE";
/// Env var holding the key secret itself (fallback).
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
    /// Neither secret variable is set.
    #[error("no key secret: set {SECRET_FILE_ENV} to a file holding the secret, or {SECRET_ENV}")]
    MissingSecret,
    /// The secret is empty.
    #[error("the key secret from {0} is empty")]
    EmptySecret(&'static str),
    /// The secret file could not be read.
    #[error("cannot read the key secret file {path}: {source}")]
    SecretFile {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The payload cannot be put in canonical form.
    #[error("payload cannot be hashed: {0}")]
    Canonical(#[from] CanonicalError),
}

/// The HMAC secret for keys. Never printed: `Debug` shows `KeySecret(***)`.
#[derive(Clone)]
pub struct KeySecret(SecretSlice<u8>);

impl fmt::Debug for KeySecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeySecret(***)")
    }
}

impl KeySecret {
    /// A secret from raw bytes (tests, embedding). Empty secrets are refused.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self, KeyError> {
        let bytes: Vec<u8> = bytes.into();
        if bytes.is_empty() {
            return Err(KeyError::EmptySecret("the caller"));
        }
        Ok(Self(SecretSlice::from(bytes)))
    }

    /// Read the secret from `ONCELY_KEY_SECRET_FILE` (one trailing newline is dropped, as
    /// editors add one) or else `ONCELY_KEY_SECRET`.
    pub fn from_env() -> Result<Self, KeyError> {
        Self::from_lookup(|name| std::env::var_os(name))
    }

    /// [`KeySecret::from_env`] over any variable lookup (testable without touching the env).
    pub fn from_lookup(get: impl Fn(&str) -> Option<std::ffi::OsString>) -> Result<Self, KeyError> {
        if let Some(path) = get(SECRET_FILE_ENV).filter(|p| !p.is_empty()) {
            let path = PathBuf::from(path);
            let mut bytes =
                std::fs::read(&path).map_err(|source| KeyError::SecretFile { path, source })?;
            if bytes.ends_with(b"\n") {
                bytes.pop();
                if bytes.ends_with(b"\r") {
                    bytes.pop();
                }
            }
            if bytes.is_empty() {
                return Err(KeyError::EmptySecret(SECRET_FILE_ENV));
            }
            return Ok(Self(SecretSlice::from(bytes)));
        }
        match get(SECRET_ENV) {
            Some(v) if v.is_empty() => Err(KeyError::EmptySecret(SECRET_ENV)),
            Some(v) => Ok(Self(SecretSlice::from(v.into_encoded_bytes()))),
            None => Err(KeyError::MissingSecret),
        }
    }

    /// The idempotency key of `identity` under this secret.
    pub fn key_for(&self, identity: &BusinessIdentity) -> IdempotencyKey {
        // The identity holds only strings and integers, so canonical form cannot fail.
        let bytes = canonical_json(&identity.to_json()).unwrap_or_default();
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(self.0.expose_secret())
            .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"));
        mac.update(&bytes);
        IdempotencyKey(format!("v1:{}", hex::encode(mac.finalize().into_bytes())))
    }
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

    fn secret() -> KeySecret {
        KeySecret::new(b"test-secret-do-not-use".to_vec()).expect("secret")
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
        assert_eq!(format!("{:?}", secret()), "KeySecret(***)");
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
        let from_file = KeySecret::from_lookup(|n| {
            (n == SECRET_FILE_ENV).then(|| file.clone().into_os_string())
        })
        .expect("file");
        assert_eq!(
            from_file.key_for(&id),
            secret().key_for(&id),
            "trailing newline is dropped"
        );
        let from_env =
            KeySecret::from_lookup(|n| (n == SECRET_ENV).then(|| "test-secret-do-not-use".into()))
                .expect("env");
        assert_eq!(from_env.key_for(&id), secret().key_for(&id));
        assert!(matches!(
            KeySecret::from_lookup(|_| None),
            Err(KeyError::MissingSecret)
        ));
        assert!(matches!(
            KeySecret::from_lookup(|n| (n == SECRET_ENV).then(|| "".into())),
            Err(KeyError::EmptySecret(_))
        ));
        let missing = dir.join("nope");
        let err = KeySecret::from_lookup(|n| {
            (n == SECRET_FILE_ENV).then(|| missing.clone().into_os_string())
        })
        .expect_err("missing file");
        assert!(
            err.to_string().contains("cannot read the key secret file"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}
