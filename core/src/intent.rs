//! Intents (what an agent wants done) and envelopes (an intent on the wire).
//!
//! An [`Intent`] is parsed from an agent's JSON: the business identity plus a payload
//! object. Sealing it with the secret gives an [`Envelope`]: the intent plus its
//! idempotency key and payload hash, serialised as the `oncely.intent.v1` message that
//! goes through RabbitMQ (schema: `schemas/intent-envelope.v1.json`).
//!
//! [`Envelope::parse`] is the worker's edge: it turns untrusted bytes into a checked
//! envelope or an [`EnvelopeError`] whose [`reason`](EnvelopeError::reason) is a short,
//! stable code for the dead-letter header and the metric label. It never panics and
//! never echoes the payload.

use crate::identity::{BusinessIdentity, IdentityError};
use crate::keys::{IdempotencyKey, KeyError, KeyRing, PayloadHash};
use serde_json::{Map, Value};

/// The envelope schema name this version writes and accepts.
pub const ENVELOPE_SCHEMA: &str = "oncely.intent.v1";
/// Default size limit of one envelope (bytes).
pub const DEFAULT_MAX_ENVELOPE_BYTES: usize = 256 * 1024;

const IDENTITY_FIELDS: [&str; 6] = [
    "action_type",
    "tenant",
    "workflow_id",
    "step",
    "business_object",
    "revision",
];
const ENVELOPE_FIELDS: [&str; 4] = ["schema", "idempotency_key", "payload_hash", "payload"];

/// An agent's request: the business identity and the payload to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Intent {
    /// Who/what/which revision — the key is derived from this alone.
    pub identity: BusinessIdentity,
    /// The body for the provider (a JSON object). Never logged.
    pub payload: Map<String, Value>,
}

/// Why an intent or envelope was refused.
#[derive(Debug, thiserror::Error)]
pub enum EnvelopeError {
    /// Larger than the configured limit.
    #[error("message is {size} bytes, over the limit of {limit}")]
    TooLarge {
        /// Its size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// Not UTF-8.
    #[error("message is not valid UTF-8 (at byte {0})")]
    NotUtf8(usize),
    /// Not JSON, or not a JSON object.
    #[error("message is not a JSON object: {0}")]
    NotJson(String),
    /// `schema` is missing or another version.
    #[error("unsupported schema {0:?}: expected \"oncely.intent.v1\"")]
    Schema(String),
    /// A field nobody defined (a typo would otherwise be silently ignored).
    #[error("unknown field `{0}`")]
    UnknownField(String),
    /// A required field is absent or has the wrong type.
    #[error("field `{field}`: {problem}")]
    Field {
        /// The field.
        field: &'static str,
        /// What is wrong.
        problem: &'static str,
    },
    /// The business identity is invalid.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// Key or hash malformed, or the payload cannot be hashed.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// The key is not the HMAC of the identity (forged, or another secret).
    #[error(
        "idempotency_key does not match the business identity under any secret of this fleet's key ring"
    )]
    KeyMismatch,
    /// The payload hash is not the hash of the payload.
    #[error("payload_hash does not match the payload")]
    HashMismatch,
}

impl EnvelopeError {
    /// A short, stable code: the `x-oncely-reject-reason` header and the metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::TooLarge { .. } => "too_large",
            Self::NotUtf8(_) => "not_utf8",
            Self::NotJson(_) => "not_json",
            Self::Schema(_) => "schema_version",
            Self::UnknownField(_) | Self::Field { .. } => "schema",
            Self::Identity(IdentityError::ActionType(_)) => "action_type",
            Self::Identity(_) => "identity",
            Self::Key(KeyError::MalformedKey(_)) => "key_format",
            Self::Key(KeyError::MalformedHash(_)) => "hash_format",
            Self::Key(_) => "payload",
            Self::KeyMismatch => "key_mismatch",
            Self::HashMismatch => "hash_mismatch",
        }
    }
}

impl Intent {
    /// Parse an agent's intent JSON: identity fields plus `payload` (an object).
    /// Envelope fields (`schema`, `idempotency_key`, `payload_hash`) are tolerated and
    /// ignored, so an envelope can be fed back as an intent.
    pub fn from_json(value: Value) -> Result<Self, EnvelopeError> {
        let Value::Object(mut obj) = value else {
            return Err(EnvelopeError::NotJson("expected an object".into()));
        };
        if let Some(unknown) = obj.keys().find(|k| {
            !IDENTITY_FIELDS.contains(&k.as_str()) && !ENVELOPE_FIELDS.contains(&k.as_str())
        }) {
            return Err(EnvelopeError::UnknownField(
                unknown.chars().take(64).collect(),
            ));
        }
        let identity = BusinessIdentity::from_json(&obj)?;
        let payload = match obj.remove("payload") {
            Some(Value::Object(p)) => p,
            None => {
                return Err(EnvelopeError::Field {
                    field: "payload",
                    problem: "is missing",
                });
            }
            Some(_) => {
                return Err(EnvelopeError::Field {
                    field: "payload",
                    problem: "must be a JSON object",
                });
            }
        };
        Ok(Self { identity, payload })
    }

    /// Parse an intent from bytes (a file, stdin, one JSONL line).
    pub fn from_slice(bytes: &[u8]) -> Result<Self, EnvelopeError> {
        let text =
            std::str::from_utf8(bytes).map_err(|e| EnvelopeError::NotUtf8(e.valid_up_to()))?;
        let value: Value =
            serde_json::from_str(text).map_err(|e| EnvelopeError::NotJson(e.to_string()))?;
        Self::from_json(value)
    }

    /// Compute key and payload hash: the intent becomes a sendable envelope.
    pub fn seal(self, secret: &KeyRing) -> Result<Envelope, EnvelopeError> {
        let payload_hash = PayloadHash::of(&Value::Object(self.payload.clone()))?;
        let key = secret.key_for(&self.identity);
        Ok(Envelope {
            key,
            payload_hash,
            intent: self,
        })
    }
}

/// An intent with its key and payload hash: the unit the journal and the broker carry.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope {
    /// The idempotency key.
    pub key: IdempotencyKey,
    /// The payload hash.
    pub payload_hash: PayloadHash,
    /// Identity and payload.
    pub intent: Intent,
}

impl Envelope {
    /// The `oncely.intent.v1` JSON object.
    pub fn to_json(&self) -> Value {
        let id = &self.intent.identity;
        let mut m = Map::new();
        m.insert("schema".into(), ENVELOPE_SCHEMA.into());
        m.insert("idempotency_key".into(), self.key.as_str().into());
        m.insert("action_type".into(), id.action_type.as_str().into());
        m.insert(
            "tenant".into(),
            id.tenant.clone().map_or(Value::Null, Value::String),
        );
        m.insert("workflow_id".into(), id.workflow_id.clone().into());
        m.insert("step".into(), id.step.clone().into());
        m.insert("business_object".into(), id.business_object.clone().into());
        m.insert("revision".into(), id.revision.into());
        m.insert("payload".into(), Value::Object(self.intent.payload.clone()));
        m.insert("payload_hash".into(), self.payload_hash.as_str().into());
        Value::Object(m)
    }

    /// The envelope as message bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(&self.to_json()).unwrap_or_default()
    }

    /// Parse and check untrusted message bytes. With `secret`, the key must be the HMAC
    /// of the identity under one of the ring's secrets (current or verify-only); without it (a worker that does not hold the secret) only its
    /// format is checked. The payload hash is always recomputed and compared. Over 60
    /// lines because it is one check per envelope field, in the envelope's order, each
    /// with its own error.
    pub fn parse(
        bytes: &[u8],
        max_bytes: usize,
        secret: Option<&KeyRing>,
    ) -> Result<Self, EnvelopeError> {
        if bytes.len() > max_bytes {
            return Err(EnvelopeError::TooLarge {
                size: bytes.len(),
                limit: max_bytes,
            });
        }
        let text =
            std::str::from_utf8(bytes).map_err(|e| EnvelopeError::NotUtf8(e.valid_up_to()))?;
        let value: Value = serde_json::from_str(text)
            .map_err(|e| EnvelopeError::NotJson(short(&e.to_string())))?;
        let Value::Object(obj) = &value else {
            return Err(EnvelopeError::NotJson("expected an object".into()));
        };
        match obj.get("schema") {
            Some(Value::String(s)) if s == ENVELOPE_SCHEMA => {}
            Some(Value::String(s)) => return Err(EnvelopeError::Schema(short(s))),
            _ => {
                return Err(EnvelopeError::Field {
                    field: "schema",
                    problem: "must be the string \"oncely.intent.v1\"",
                });
            }
        }
        let key = match obj.get("idempotency_key") {
            Some(Value::String(s)) => IdempotencyKey::parse(s)?,
            _ => {
                return Err(EnvelopeError::Field {
                    field: "idempotency_key",
                    problem: "must be a string",
                });
            }
        };
        let claimed_hash = match obj.get("payload_hash") {
            Some(Value::String(s)) => PayloadHash::parse(s)?,
            _ => {
                return Err(EnvelopeError::Field {
                    field: "payload_hash",
                    problem: "must be a string",
                });
            }
        };
        let intent = Intent::from_json(value)?;
        if let Some(secret) = secret
            && secret.verify(&intent.identity, &key).is_none()
        {
            return Err(EnvelopeError::KeyMismatch);
        }
        let payload_hash = PayloadHash::of(&Value::Object(intent.payload.clone()))?;
        if payload_hash != claimed_hash {
            return Err(EnvelopeError::HashMismatch);
        }
        Ok(Self {
            key,
            payload_hash,
            intent,
        })
    }
}

fn short(s: &str) -> String {
    s.chars().take(120).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn secret() -> KeyRing {
        KeyRing::new(b"test-secret-do-not-use".to_vec()).expect("secret")
    }

    fn sample() -> Value {
        json!({"action_type":"payment_order.create","workflow_id":"case-1842","step":"pay_grant",
               "business_object":"application-731","revision":1,"tenant":null,
               "payload":{"account_id":"example-account","amount_minor":125000,"currency":"RUB","business_reference":"application-731"}})
    }

    #[test]
    fn seal_then_parse_round_trips() {
        let env = Intent::from_json(sample())
            .expect("intent")
            .seal(&secret())
            .expect("seal");
        let back = Envelope::parse(&env.to_bytes(), DEFAULT_MAX_ENVELOPE_BYTES, Some(&secret()))
            .expect("parse");
        assert_eq!(back, env);
        assert_eq!(
            env.payload_hash.as_str(),
            "sha256:003e1cb47a383bcc76345f2954cfd442841bb6af6063b76d1c925eb0433ab80e"
        );
    }

    #[test]
    fn each_kind_of_bad_envelope_has_its_reason() {
        let env = Intent::from_json(sample())
            .expect("intent")
            .seal(&secret())
            .expect("seal");
        let good = env.to_json();
        let with = |f: &dyn Fn(&mut Map<String, Value>)| {
            let mut v = good.clone();
            f(v.as_object_mut().expect("object"));
            serde_json::to_vec(&v).expect("json")
        };
        let check = |bytes: &[u8], reason: &str| {
            let err = Envelope::parse(bytes, 4096, Some(&secret())).expect_err(reason);
            assert_eq!(err.reason(), reason, "{err}");
        };
        check(&vec![b' '; 5000], "too_large");
        check(b"\xff\xfe", "not_utf8");
        check(b"{not json", "not_json");
        check(b"[1,2]", "not_json");
        check(
            &with(&|m| drop(m.insert("schema".into(), json!("oncely.intent.v2")))),
            "schema_version",
        );
        check(&with(&|m| drop(m.remove("schema"))), "schema");
        check(
            &with(&|m| drop(m.insert("extra".into(), json!(1)))),
            "schema",
        );
        check(
            &with(&|m| drop(m.insert("action_type".into(), json!("Not A Type")))),
            "action_type",
        );
        check(
            &with(&|m| drop(m.insert("revision".into(), json!(1.5)))),
            "identity",
        );
        check(
            &with(&|m| drop(m.insert("idempotency_key".into(), json!("v1:abc")))),
            "key_format",
        );
        check(
            &with(&|m| drop(m.insert("payload_hash".into(), json!("md5:x")))),
            "hash_format",
        );
        check(
            &with(&|m| drop(m.insert("revision".into(), json!(2)))),
            "key_mismatch",
        );
        check(
            &with(&|m| drop(m.insert("payload".into(), json!({"amount_minor": 1})))),
            "hash_mismatch",
        );
        check(
            &with(&|m| drop(m.insert("payload".into(), json!("text")))),
            "schema",
        );
    }

    #[test]
    fn without_secret_only_the_key_format_is_checked() {
        let env = Intent::from_json(sample())
            .expect("intent")
            .seal(&secret())
            .expect("seal");
        let other = KeyRing::new(b"another-secret-entirely".to_vec()).expect("secret");
        assert!(matches!(
            Envelope::parse(&env.to_bytes(), 4096, Some(&other)),
            Err(EnvelopeError::KeyMismatch)
        ));
        assert!(Envelope::parse(&env.to_bytes(), 4096, None).is_ok());
    }
}
