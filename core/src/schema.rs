//! Payload schemas: a JSON Schema per action type, declared in the config
//! (`[actions."TYPE"].payload_schema`), checked by the gateway before an intent is
//! recorded and by the worker before the provider is called.
//!
//! Why both: the gateway refuses a bad payload while the agent is still listening (400
//! with the path); the worker refuses one that came another way (SDK, raw AMQP) as
//! `failed_final` with `payload_schema` before anything is sent — a payload never
//! changes, so no later attempt could do better. Neither logs the payload: a violation
//! names the path in the payload and the schema keyword, not the value.

use crate::config::Config;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// The schema of an action type without a declared one: any JSON object.
pub fn any_object() -> Value {
    serde_json::json!({ "type": "object" })
}

/// Compile one schema; the error is a sentence for a config error.
pub fn compile(schema: &Value) -> Result<jsonschema::Validator, String> {
    if !schema.is_object() {
        return Err("must be a table (a JSON Schema object)".into());
    }
    jsonschema::validator_for(schema).map_err(|e| format!("not a valid JSON Schema: {e}"))
}

/// Why a payload was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// JSON Pointer of the offending value, from the request body: `/payload/to`
    /// (`/payload` for the payload itself).
    pub path: String,
    /// The schema keyword that failed (`required`, `type`, `maxLength`, …).
    pub keyword: String,
    /// What is wrong, for the caller (may quote the caller's own value: never logged).
    pub message: String,
}

/// The compiled schemas of every configured action type.
#[derive(Debug, Default)]
pub struct PayloadSchemas {
    by_action: BTreeMap<String, jsonschema::Validator>,
}

impl PayloadSchemas {
    /// Compile the schemas the config declares (the config was validated, so they compile;
    /// an error here names the action anyway).
    pub fn from_config(config: &Config) -> Result<Self, String> {
        let mut by_action = BTreeMap::new();
        for (action, policy) in &config.actions {
            if let Some(schema) = &policy.payload_schema {
                let v = compile(schema)
                    .map_err(|e| format!("actions.\"{action}\".payload_schema: {e}"))?;
                by_action.insert(action.clone(), v);
            }
        }
        Ok(Self { by_action })
    }

    /// Check a payload against its action type's schema (none declared: any object
    /// passes). The first violation, in the validator's order.
    pub fn check(&self, action: &str, payload: &Map<String, Value>) -> Result<(), Violation> {
        let Some(v) = self.by_action.get(action) else {
            return Ok(());
        };
        // The validator works on a `Value`; the payload is an object by construction.
        let value = Value::Object(payload.clone());
        match v.iter_errors(&value).next() {
            None => Ok(()),
            Some(e) => {
                let at = e.instance_path().to_string();
                let keyword = e
                    .schema_path()
                    .as_str()
                    .rsplit('/')
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                Err(Violation {
                    path: format!("/payload{at}"),
                    keyword,
                    message: e.to_string(),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schemas() -> PayloadSchemas {
        let mut config = Config::builtin().expect("builtin");
        let p = config.actions.get_mut("email.send").expect("email");
        p.payload_schema = Some(json!({
            "type": "object",
            "required": ["to", "subject"],
            "properties": {
                "to": {"type": "string", "maxLength": 5},
                "subject": {"type": "string"}
            }
        }));
        config.validate().expect("valid");
        PayloadSchemas::from_config(&config).expect("compile")
    }

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().expect("object").clone()
    }

    #[test]
    fn a_declared_schema_names_the_path_and_keyword() {
        let s = schemas();
        assert_eq!(
            s.check("email.send", &obj(json!({"to": "a@b", "subject": "x"}))),
            Ok(())
        );
        let missing = s
            .check("email.send", &obj(json!({"to": "a@b"})))
            .expect_err("missing");
        assert_eq!(
            (missing.path.as_str(), missing.keyword.as_str()),
            ("/payload", "required")
        );
        assert!(missing.message.contains("subject"), "{}", missing.message);
        let long = s
            .check(
                "email.send",
                &obj(json!({"to": "toolong@x", "subject": "x"})),
            )
            .expect_err("long");
        assert_eq!(
            (long.path.as_str(), long.keyword.as_str()),
            ("/payload/to", "maxLength")
        );
        // No schema declared: any object passes.
        assert_eq!(s.check("ticket.create", &obj(json!({"n": 1}))), Ok(()));
    }

    #[test]
    fn a_bad_schema_is_a_config_error_naming_the_field() {
        let mut config = Config::builtin().expect("builtin");
        config
            .actions
            .get_mut("email.send")
            .expect("email")
            .payload_schema = Some(json!({"type": "no-such-type"}));
        let e = config.validate().expect_err("invalid").to_string();
        assert!(e.contains("actions.\"email.send\".payload_schema"), "{e}");
    }
}
