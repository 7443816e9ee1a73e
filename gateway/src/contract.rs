//! The OpenAPI document as served: exact for this gateway's config.
//!
//! The handlers' annotations ([`crate::http::openapi`]) describe the API in general;
//! [`document`] makes it exact for the configured action types, so a generator
//! (schemathesis, `openapi-typescript`) produces only requests the gateway accepts and
//! knows every answer it can give:
//! - one `POST /v1/actions/<type>` per configured action type, its body's `payload` the
//!   type's own JSON Schema (the generic `{action_type}` path is not served);
//! - the rules the gateway enforces, as schema: identity fields 1..=256 characters, no
//!   other body fields, RFC 3339 times, `wait` a duration (`30s`, `1500ms`), keys
//!   `v1:` + 64 hex digits, `Idempotency-Key` 1..=255 visible ASCII (optionally quoted);
//! - links from a submit's answer to the status, the wait, the cancel and the decisions
//!   of the same key (stateful testing, and clients that follow links).

use crate::service::ActionTypeInfo;
use oncely_core::config::Config;
use serde_json::{Map, Value, json};

/// A key as the API spells it.
pub const KEY_PATTERN: &str = "^v1:[0-9a-f]{64}$";
/// `wait` as the API reads it (at most 60 s are waited).
pub const WAIT_PATTERN: &str = "^[0-9]{1,9}(ms|s|m|h|d)$";
/// `Idempotency-Key`: 1..=255 visible ASCII characters other than `"`, bare or as a
/// structured-field string (`"…"`, the IETF draft's form).
pub const CLIENT_KEY_PATTERN: &str = "^(\"[!#-~]{1,255}\"|[!#-~]{1,255})$";

/// The fields of a submit's body (`ActionBody`, and the MCP submit tools' arguments);
/// any other is refused.
pub const BODY_FIELDS: [&str; 7] = [
    "workflow_id",
    "step",
    "business_object",
    "revision",
    "payload",
    "not_before",
    "expires_at",
];

/// The JSON Pointer of the first string (or object key) of `body` holding U+0000, if
/// any: Postgres stores neither in text nor in jsonb.
pub fn nul_in(body: &Map<String, Value>) -> Option<String> {
    nul_in_object(body, "")
}

fn nul_in_object(m: &Map<String, Value>, at: &str) -> Option<String> {
    m.iter().find_map(|(k, x)| {
        let here = format!("{at}/{}", k.replace('~', "~0").replace('/', "~1"));
        if k.contains('\0') {
            Some(here)
        } else {
            nul_at(x, &here)
        }
    })
}

fn nul_at(v: &Value, at: &str) -> Option<String> {
    match v {
        Value::String(s) if s.contains('\0') => Some(at.to_owned()),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .find_map(|(i, x)| nul_at(x, &format!("{at}/{i}"))),
        Value::Object(m) => nul_in_object(m, at),
        _ => None,
    }
}

/// Is `s` a `wait` value ([`WAIT_PATTERN`])?
pub fn is_wait(s: &str) -> bool {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    (1..=9).contains(&digits) && matches!(&s[digits..], "ms" | "s" | "m" | "h" | "d")
}

/// The client key inside an `Idempotency-Key` value ([`CLIENT_KEY_PATTERN`]), if valid.
pub fn client_key(value: &str) -> Option<&str> {
    let inner = match value.strip_prefix('"') {
        Some(rest) => rest.strip_suffix('"')?,
        None => value,
    };
    let ok = (1..=255).contains(&inner.len())
        && inner
            .bytes()
            .all(|b| (0x21..=0x7e).contains(&b) && b != b'"');
    ok.then_some(inner)
}

/// Is `s` a key as the API spells it ([`KEY_PATTERN`])?
pub fn is_key(s: &str) -> bool {
    s.strip_prefix("v1:").is_some_and(|h| {
        h.len() == 64
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// Every action type of `config`, as the API and the MCP tools describe it.
pub fn action_type_infos(config: &Config) -> Vec<ActionTypeInfo> {
    config
        .actions
        .iter()
        .map(|(name, p)| ActionTypeInfo {
            name: name.clone(),
            tool: crate::service::tool_name(name),
            description: p.description.clone().unwrap_or_else(|| {
                format!(
                    "Run the action `{name}` exactly once (provider `{}`).",
                    p.provider
                )
            }),
            payload_schema: p
                .payload_schema
                .clone()
                .unwrap_or_else(oncely_core::schema::any_object),
        })
        .collect()
}

/// The document for `types` (every configured action type).
pub fn document(types: &[ActionTypeInfo]) -> Value {
    let mut doc = serde_json::to_value(crate::http::openapi()).unwrap_or(Value::Null);
    let generic_path = "/v1/actions/{action_type}";
    let generic = doc["paths"][generic_path]["post"].take();
    if let Some(paths) = doc["paths"].as_object_mut() {
        paths.remove(generic_path);
    }
    let body = doc["components"]["schemas"]["ActionBody"].clone();
    for t in types {
        let mut op = generic.clone();
        op["operationId"] = json!(format!("submit_{}", t.tool));
        op["summary"] = json!(format!("Enqueue `{}`", t.name));
        op["description"] = json!(format!(
            "{}\n\n{}",
            t.description,
            op["description"].as_str().unwrap_or_default()
        ));
        if let Some(params) = op["parameters"].as_array_mut() {
            params.retain(|p| p["in"] != "path");
        }
        op["requestBody"]["content"]["application/json"]["schema"] = body_schema(&body, t);
        for status in ["200", "202"] {
            if let Some(r) = op["responses"].get_mut(status) {
                r["links"] = links();
            }
        }
        doc["paths"][format!("/v1/actions/{}", t.name)] = json!({ "post": op });
    }
    for_each_operation(&mut doc, |op| {
        if let Some(params) = op.get_mut("parameters").and_then(Value::as_array_mut) {
            for p in params {
                let schema = match (p["in"].as_str(), p["name"].as_str()) {
                    (Some("path"), Some("key")) => {
                        json!({"type": "string", "pattern": KEY_PATTERN})
                    }
                    (Some("query"), Some("wait")) => {
                        json!({"type": "string", "pattern": WAIT_PATTERN})
                    }
                    (Some("header"), Some("Idempotency-Key")) => {
                        json!({"type": "string", "pattern": CLIENT_KEY_PATTERN})
                    }
                    _ => continue,
                };
                p["schema"] = schema;
            }
        }
    });
    doc
}

/// `ActionBody` with `t`'s payload schema and the gateway's rules.
fn body_schema(generic: &Value, t: &ActionTypeInfo) -> Value {
    let mut s = generic.clone();
    s["description"] = json!(format!("The body of `POST /v1/actions/{}`.", t.name));
    s["additionalProperties"] = json!(false);
    let max = oncely_core::identity::MAX_IDENTITY_FIELD_LEN;
    for field in ["workflow_id", "step", "business_object"] {
        s["properties"][field]["minLength"] = json!(1);
        s["properties"][field]["maxLength"] = json!(max);
    }
    for field in ["not_before", "expires_at"] {
        s["properties"][field]["format"] = json!("date-time");
    }
    let mut payload = t.payload_schema.clone();
    if let Value::Object(m) = &mut payload {
        m.entry("description")
            .or_insert_with(|| json!(format!("The payload of `{}`.", t.name)));
    }
    s["properties"]["payload"] = payload;
    s
}

/// Where a submit's answer leads: the same key's status, wait, cancel and decisions.
fn links() -> Value {
    let key = json!({"key": "$response.body#/key"});
    let mut m = Map::new();
    for (name, op, extra) in [
        ("status", "get_action", None),
        ("wait", "get_action", Some(("wait", "5s"))),
        ("cancel", "cancel", None),
        ("approve", "approve", None),
        ("reject", "reject", None),
    ] {
        let mut params = key.clone();
        if let Some((k, v)) = extra {
            params[k] = json!(v);
        }
        m.insert(
            name.into(),
            json!({"operationId": op, "parameters": params}),
        );
    }
    Value::Object(m)
}

fn for_each_operation(doc: &mut Value, mut f: impl FnMut(&mut Value)) {
    if let Some(paths) = doc["paths"].as_object_mut() {
        for item in paths.values_mut() {
            if let Some(ops) = item.as_object_mut() {
                ops.values_mut().for_each(&mut f);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_and_client_keys_follow_their_patterns() {
        for ok in ["1s", "30s", "1500ms", "2m", "999999999d", "0s"] {
            assert!(is_wait(ok), "{ok}");
        }
        for bad in [
            "",
            "s",
            " 5s",
            "5 s",
            "5",
            "5sec",
            "1234567890s",
            "-1s",
            "5S",
        ] {
            assert!(!is_wait(bad), "{bad}");
        }
        assert_eq!(client_key("abc"), Some("abc"));
        assert_eq!(client_key("\"abc\""), Some("abc"));
        for bad in ["", "\"\"", "\"abc", "a\"b", "a b", "é", &"x".repeat(256)] {
            assert_eq!(client_key(bad), None, "{bad}");
        }
        assert!(client_key(&format!("\"{}\"", "x".repeat(255))).is_some());
        assert!(is_key(&format!("v1:{}", "a".repeat(64))));
        assert!(!is_key(&format!("v1:{}", "A".repeat(64))));
        assert!(!is_key("email.send"));
    }

    #[test]
    fn every_action_type_has_its_own_exact_submit() {
        let types = vec![ActionTypeInfo {
            name: "email.send".into(),
            tool: "email_send".into(),
            description: "Send one email.".into(),
            payload_schema: json!({"type": "object", "required": ["to"], "properties": {"to": {"type": "string"}}}),
        }];
        let doc = document(&types);
        let paths = doc["paths"].as_object().expect("paths");
        assert!(!paths.contains_key("/v1/actions/{action_type}"));
        let op = &doc["paths"]["/v1/actions/email.send"]["post"];
        assert_eq!(op["operationId"], "submit_email_send");
        let body = &op["requestBody"]["content"]["application/json"]["schema"];
        assert_eq!(body["properties"]["payload"]["required"], json!(["to"]));
        assert_eq!(body["additionalProperties"], json!(false));
        assert_eq!(
            op["responses"]["202"]["links"]["wait"]["parameters"]["wait"],
            "5s"
        );
        let get = &doc["paths"]["/v1/actions/{key}"]["get"]["parameters"];
        let wait = get
            .as_array()
            .expect("params")
            .iter()
            .find(|p| p["name"] == "wait")
            .expect("wait");
        assert_eq!(wait["schema"]["pattern"], WAIT_PATTERN);
    }
}
