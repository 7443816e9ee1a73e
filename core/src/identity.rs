//! The business identity of an action, and the action type.
//!
//! Two intents are "the same action" exactly when their identities are equal, so the
//! identity holds only the fields that define the business act (`action_type`,
//! `workflow_id`, `step`, `business_object`, `revision`, optional `tenant`) — never run
//! ids, attempt numbers, timestamps or model wording (see the article, step 1).
//! Values are strings and integers only: floats print differently across languages, so
//! they would make the key unstable, and are refused with an error that says so.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::fmt;

/// Longest accepted action type (it becomes part of a queue name).
pub const MAX_ACTION_TYPE_LEN: usize = 64;
/// Longest accepted text field of the identity.
pub const MAX_IDENTITY_FIELD_LEN: usize = 256;

/// Why an identity (or one of its fields) was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// A required field is absent.
    #[error("business identity: field `{0}` is missing")]
    Missing(&'static str),
    /// A field has the wrong JSON type.
    #[error("business identity: field `{field}` must be {expected}, got {got}")]
    WrongType {
        /// The field.
        field: &'static str,
        /// What it must be.
        expected: &'static str,
        /// What it was.
        got: String,
    },
    /// A float where an integer was required.
    #[error(
        "business identity: field `{field}` is the float {value}; floats are not allowed in the identity (their text form differs between languages) — use an integer or a string"
    )]
    Float {
        /// The field.
        field: &'static str,
        /// Its value as text.
        value: String,
    },
    /// A text field that is empty or too long.
    #[error("business identity: field `{field}` must be 1..={max} characters, got {len}")]
    Length {
        /// The field.
        field: &'static str,
        /// The maximum length.
        max: usize,
        /// The actual length.
        len: usize,
    },
    /// An action type that is not `lower_snake.segments`.
    #[error(
        "action type {0:?} is invalid: use 1..=64 characters of lowercase letters, digits and '_', in dot-separated segments that start with a letter (e.g. \"payment_order.create\")"
    )]
    ActionType(String),
}

/// An action type such as `email.send` or `payment_order.create`; it names the queue.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct ActionType(String);

impl ActionType {
    /// Parse an action type: dot-separated segments of `[a-z][a-z0-9_]*`, at most 64 bytes.
    pub fn parse(s: &str) -> Result<Self, IdentityError> {
        let ok = !s.is_empty()
            && s.len() <= MAX_ACTION_TYPE_LEN
            && s.split('.').all(|seg| {
                let mut chars = seg.chars();
                matches!(chars.next(), Some('a'..='z'))
                    && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_'))
            });
        if ok {
            Ok(Self(s.to_owned()))
        } else {
            Err(IdentityError::ActionType(s.to_owned()))
        }
    }

    /// The action type as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ActionType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for ActionType {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        ActionType::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// The fields that make two intents the same action.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct BusinessIdentity {
    /// What kind of action (`email.send`).
    pub action_type: ActionType,
    /// The tenant, when the deployment is multi-tenant; absent from the key when `None`.
    pub tenant: Option<String>,
    /// The business process instance (`case-1842`).
    pub workflow_id: String,
    /// The step within the workflow (`send_approval_notice`).
    pub step: String,
    /// The business object acted upon (`application-731`).
    pub business_object: String,
    /// The revision of that object: a changed application is a new action.
    pub revision: i64,
}

impl BusinessIdentity {
    /// Parse the identity fields out of a JSON object (other fields are ignored here).
    pub fn from_json(obj: &Map<String, Value>) -> Result<Self, IdentityError> {
        let action_type = ActionType::parse(required_str(obj, "action_type")?)?;
        let tenant = match obj.get("tenant") {
            None | Some(Value::Null) => None,
            Some(_) => Some(text_field(obj, "tenant")?),
        };
        Ok(Self {
            action_type,
            tenant,
            workflow_id: text_field(obj, "workflow_id")?,
            step: text_field(obj, "step")?,
            business_object: text_field(obj, "business_object")?,
            revision: int_field(obj, "revision")?,
        })
    }

    /// The identity as the JSON object that is hashed: `tenant` only when set.
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert(
            "action_type".into(),
            Value::String(self.action_type.0.clone()),
        );
        m.insert(
            "workflow_id".into(),
            Value::String(self.workflow_id.clone()),
        );
        m.insert("step".into(), Value::String(self.step.clone()));
        m.insert(
            "business_object".into(),
            Value::String(self.business_object.clone()),
        );
        m.insert("revision".into(), Value::from(self.revision));
        if let Some(t) = &self.tenant {
            m.insert("tenant".into(), Value::String(t.clone()));
        }
        Value::Object(m)
    }
}

fn type_name(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(_) => "a boolean".into(),
        Value::Number(n) if n.is_f64() => format!("the float {n}"),
        Value::Number(_) => "an integer".into(),
        Value::String(_) => "a string".into(),
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
    }
}

fn required_str<'a>(
    obj: &'a Map<String, Value>,
    field: &'static str,
) -> Result<&'a str, IdentityError> {
    match obj.get(field) {
        None => Err(IdentityError::Missing(field)),
        Some(Value::String(s)) => Ok(s),
        Some(Value::Number(n)) if n.is_f64() => Err(IdentityError::Float {
            field,
            value: n.to_string(),
        }),
        Some(other) => Err(IdentityError::WrongType {
            field,
            expected: "a string",
            got: type_name(other),
        }),
    }
}

fn text_field(obj: &Map<String, Value>, field: &'static str) -> Result<String, IdentityError> {
    let s = required_str(obj, field)?;
    let len = s.chars().count();
    if len == 0 || len > MAX_IDENTITY_FIELD_LEN {
        return Err(IdentityError::Length {
            field,
            max: MAX_IDENTITY_FIELD_LEN,
            len,
        });
    }
    Ok(s.to_owned())
}

fn int_field(obj: &Map<String, Value>, field: &'static str) -> Result<i64, IdentityError> {
    match obj.get(field) {
        None => Err(IdentityError::Missing(field)),
        Some(Value::Number(n)) => match n.as_i64() {
            Some(i) => Ok(i),
            None if n.is_f64() => Err(IdentityError::Float {
                field,
                value: n.to_string(),
            }),
            None => Err(IdentityError::WrongType {
                field,
                expected: "an integer in the 64-bit signed range",
                got: n.to_string(),
            }),
        },
        Some(other) => Err(IdentityError::WrongType {
            field,
            expected: "an integer",
            got: type_name(other),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => panic!("not an object"),
        }
    }

    #[test]
    fn action_type_rules() {
        for ok in ["email.send", "payment_order.create", "a", "x1.y_2"] {
            assert!(ActionType::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "Email.send",
            "email..send",
            ".x",
            "x.",
            "1x",
            "email send",
            "e-mail",
            &"a".repeat(65),
        ] {
            assert!(ActionType::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn floats_are_refused_with_a_clear_error() {
        let err = BusinessIdentity::from_json(&obj(json!({
            "action_type": "email.send", "workflow_id": "w", "step": "s",
            "business_object": "b", "revision": 2.0
        })))
        .expect_err("float revision");
        assert!(
            matches!(
                err,
                IdentityError::Float {
                    field: "revision",
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("floats are not allowed"), "{err}");
    }

    #[test]
    fn wrong_types_and_missing_fields_name_the_field() {
        let base = json!({"action_type": "email.send", "workflow_id": "w", "step": "s", "business_object": "b", "revision": 1});
        let mut m = obj(base.clone());
        m.remove("step");
        assert_eq!(
            BusinessIdentity::from_json(&m),
            Err(IdentityError::Missing("step"))
        );
        let mut m = obj(base.clone());
        m.insert("workflow_id".into(), json!(5));
        assert!(
            BusinessIdentity::from_json(&m)
                .expect_err("int workflow")
                .to_string()
                .contains("`workflow_id` must be a string")
        );
        let mut m = obj(base);
        m.insert("tenant".into(), json!(""));
        assert!(matches!(
            BusinessIdentity::from_json(&m),
            Err(IdentityError::Length {
                field: "tenant",
                ..
            })
        ));
    }

    #[test]
    fn tenant_only_in_json_when_set() {
        let m = obj(
            json!({"action_type": "email.send", "workflow_id": "w", "step": "s", "business_object": "b", "revision": 1, "tenant": null}),
        );
        let id = BusinessIdentity::from_json(&m).expect("valid");
        assert!(id.to_json().get("tenant").is_none());
        let id = BusinessIdentity {
            tenant: Some("acme".into()),
            ..id
        };
        assert_eq!(id.to_json()["tenant"], json!("acme"));
    }
}
