//! A provider's requests, built from its mapping: the execute call's method, path and
//! body (JSON or form-encoded), and the lookup paths — all templates over the key and
//! the payload (see `oncely_core::config::providers::template`).
//!
//! Why rendering can fail only with a payload problem, and why that is a *rejection*: the
//! templates were parsed when the config was loaded, so what is left is a payload
//! without a field the mapping needs (`template_missing_field`), or a path value that
//! would change which resource is called — `.`, `..` or empty
//! (`template_unsafe_path_value`). Nothing is sent then, and sending later cannot help —
//! the payload of an operation never changes — so the operation fails for good, naming
//! the field (never its value) in the worker's log.

use hyper::Method;
use oncely_core::config::providers::template::{
    MissingField, PathError, Template, Values, as_text, percent_encode,
};
use oncely_core::config::{Encoding, HttpProviderConfig};
use serde_json::{Map, Value};

/// A body template, parsed.
#[derive(Debug)]
enum Body {
    Object(Vec<(String, Body)>),
    Array(Vec<Body>),
    Template(Template),
    Literal(Value),
}

/// Which lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LookupBy {
    /// `lookup_path`.
    Key,
    /// `lookup_by_reference_path`.
    Reference,
}

/// An execute request, rendered.
#[derive(Debug)]
pub(crate) struct Rendered {
    pub method: Method,
    /// Path and query (after the base URL).
    pub path: String,
    pub content_type: &'static str,
    pub body: Vec<u8>,
}

/// A provider's mapping, parsed.
#[derive(Debug)]
pub(crate) struct Mapping {
    method: Method,
    encoding: Encoding,
    execute_path: Template,
    body: Option<Body>,
    lookup_path: Option<Template>,
    lookup_by_reference_path: Option<Template>,
    reference_pointer: String,
}

impl Mapping {
    /// Parses the mapping of `config`; errors name the field (normally caught earlier,
    /// by the config's own validation).
    pub(crate) fn new(config: &HttpProviderConfig) -> Result<Self, (&'static str, String)> {
        let method =
            Method::from_bytes(config.method.as_bytes()).map_err(|e| ("method", e.to_string()))?;
        let template =
            |field: &'static str, text: &str| Template::parse(text).map_err(|e| (field, e));
        let optional = |field: &'static str, text: &str| {
            (!text.is_empty())
                .then(|| template(field, text))
                .transpose()
        };
        Ok(Mapping {
            method,
            encoding: config.encoding,
            execute_path: template("execute_path", &config.execute_path)?,
            body: config
                .body
                .as_ref()
                .map(|b| parse_body(&Value::Object(b.clone())))
                .transpose()
                .map_err(|e| ("body", e))?,
            lookup_path: optional("lookup_path", &config.lookup_path)?,
            lookup_by_reference_path: optional(
                "lookup_by_reference_path",
                &config.lookup_by_reference_path,
            )?,
            reference_pointer: config.reference_pointer.clone(),
        })
    }

    fn values<'a>(
        &'a self,
        key: &'a str,
        action_type: &'a str,
        payload: &'a Map<String, Value>,
    ) -> Values<'a> {
        Values {
            key,
            action_type,
            payload,
            reference_pointer: &self.reference_pointer,
        }
    }

    /// The execute request for one call.
    pub(crate) fn execute(
        &self,
        key: &str,
        action_type: &str,
        payload: &Map<String, Value>,
    ) -> Result<Rendered, PathError> {
        let values = self.values(key, action_type, payload);
        let path = self.execute_path.render_path(&values)?;
        let rendered;
        let body = match &self.body {
            Some(template) => {
                rendered = render_body(template, &values)?;
                &rendered
            }
            None => &Value::Object(payload.clone()),
        };
        let (content_type, body) = match self.encoding {
            Encoding::Json => (
                "application/json",
                serde_json::to_vec(body).unwrap_or_default(),
            ),
            Encoding::Form => (
                "application/x-www-form-urlencoded",
                form_encode(body).into_bytes(),
            ),
        };
        Ok(Rendered {
            method: self.method.clone(),
            path,
            content_type,
            body,
        })
    }

    /// Whether this lookup is configured.
    pub(crate) fn has_lookup(&self, by: LookupBy) -> bool {
        self.lookup(by).is_some()
    }

    fn lookup(&self, by: LookupBy) -> Option<&Template> {
        match by {
            LookupBy::Key => self.lookup_path.as_ref(),
            LookupBy::Reference => self.lookup_by_reference_path.as_ref(),
        }
    }

    /// The path of a lookup (`None`: not configured).
    pub(crate) fn lookup_path(
        &self,
        by: LookupBy,
        key: &str,
        action_type: &str,
        payload: &Map<String, Value>,
    ) -> Option<Result<String, PathError>> {
        let values = self.values(key, action_type, payload);
        self.lookup(by).map(|t| t.render_path(&values))
    }
}

fn parse_body(value: &Value) -> Result<Body, String> {
    Ok(match value {
        Value::String(text) => Body::Template(Template::parse(text)?),
        Value::Object(map) => Body::Object(
            map.iter()
                .map(|(k, v)| Ok((k.clone(), parse_body(v)?)))
                .collect::<Result<_, String>>()?,
        ),
        Value::Array(items) => Body::Array(items.iter().map(parse_body).collect::<Result<_, _>>()?),
        other => Body::Literal(other.clone()),
    })
}

fn render_body(body: &Body, values: &Values<'_>) -> Result<Value, MissingField> {
    Ok(match body {
        Body::Template(t) => t.render(values)?,
        Body::Literal(v) => v.clone(),
        Body::Object(fields) => Value::Object(
            fields
                .iter()
                .map(|(k, b)| Ok((k.clone(), render_body(b, values)?)))
                .collect::<Result<_, MissingField>>()?,
        ),
        Body::Array(items) => Value::Array(
            items
                .iter()
                .map(|b| render_body(b, values))
                .collect::<Result<_, _>>()?,
        ),
    })
}

/// `application/x-www-form-urlencoded` with nested keys written Stripe-style:
/// `{"metadata": {"k": "v"}, "l": ["a"]}` → `metadata[k]=v&l[0]=a`. Nulls are left out.
fn form_encode(value: &Value) -> String {
    let mut pairs = Vec::new();
    form_pairs(String::new(), value, &mut pairs);
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", percent_encode(k), percent_encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

fn form_pairs(name: String, value: &Value, out: &mut Vec<(String, String)>) {
    let nested = |key: &str| {
        if name.is_empty() {
            key.to_owned()
        } else {
            format!("{name}[{key}]")
        }
    };
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                form_pairs(nested(k), v, out);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                form_pairs(nested(&i.to_string()), v, out);
            }
        }
        Value::Null => {}
        other => out.push((name, as_text(other).into_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn payload() -> Map<String, Value> {
        let Value::Object(map) = json!({
            "amount_minor": 1250, "currency": "eur", "business_reference": "inv 7/8",
            "to": "a@b.test"
        }) else {
            unreachable!()
        };
        map
    }

    fn config(body: Value, encoding: Encoding) -> HttpProviderConfig {
        let mut c = HttpProviderConfig::new("https://x", "/v1/payment_intents");
        c.encoding = encoding;
        let Value::Object(body) = body else {
            unreachable!()
        };
        c.body = Some(body);
        c.lookup_path = "/v1/orders?key={key}".into();
        c.lookup_by_reference_path = "/v1/orders/{reference}".into();
        c
    }

    #[test]
    fn percent_encoding_keeps_only_unreserved() {
        assert_eq!(percent_encode("v1:ab"), "v1%3Aab");
        assert_eq!(
            percent_encode("a b&c=d/é?#%"),
            "a%20b%26c%3Dd%2F%C3%A9%3F%23%25"
        );
        assert_eq!(percent_encode("Az09-._~"), "Az09-._~");
    }

    #[test]
    fn a_form_body_is_stripe_shaped() {
        let body = json!({
            "amount": "{/amount_minor}", "currency": "{/currency}", "confirm": true,
            "metadata": {"oncely_key": "{key}"}, "tags": ["a", "{/to}"],
            "description": "Order {reference}"
        });
        let m = Mapping::new(&config(body, Encoding::Form)).expect("mapping");
        let r = m
            .execute("v1:k", "payment_order.create", &payload())
            .expect("renders");
        assert_eq!(r.method, Method::POST);
        assert_eq!(r.path, "/v1/payment_intents");
        assert_eq!(r.content_type, "application/x-www-form-urlencoded");
        assert_eq!(
            String::from_utf8(r.body).expect("utf-8"),
            "amount=1250&confirm=true&currency=eur&description=Order%20inv%207%2F8\
             &metadata%5Boncely_key%5D=v1%3Ak&tags%5B0%5D=a&tags%5B1%5D=a%40b.test"
        );
    }

    #[test]
    fn a_json_body_keeps_types_and_no_body_sends_the_payload() {
        let body = json!({"Amount": "{/amount_minor}", "To": "{/to}", "Meta": {"Key": "{key}"}});
        let m = Mapping::new(&config(body, Encoding::Json)).expect("mapping");
        let r = m.execute("v1:k", "a", &payload()).expect("renders");
        assert_eq!(r.content_type, "application/json");
        let sent: Value = serde_json::from_slice(&r.body).expect("json");
        assert_eq!(
            sent,
            json!({"Amount": 1250, "To": "a@b.test", "Meta": {"Key": "v1:k"}})
        );

        let plain = HttpProviderConfig::new("https://x", "/v1/x");
        let r = Mapping::new(&plain)
            .expect("mapping")
            .execute("v1:k", "a", &payload())
            .expect("renders");
        let sent: Value = serde_json::from_slice(&r.body).expect("json");
        assert_eq!(sent, Value::Object(payload()));
    }

    #[test]
    fn a_missing_field_renders_nothing_and_lookup_paths_are_encoded() {
        let m = Mapping::new(&config(json!({"x": "{/absent}"}), Encoding::Form)).expect("m");
        assert_eq!(
            m.execute("v1:k", "a", &payload()).map(|r| r.path),
            Err(PathError::MissingField("/absent".into()))
        );
        assert_eq!(
            m.lookup_path(LookupBy::Key, "v1:k", "a", &payload()),
            Some(Ok("/v1/orders?key=v1%3Ak".into()))
        );
        assert_eq!(
            m.lookup_path(LookupBy::Reference, "v1:k", "a", &payload()),
            Some(Ok("/v1/orders/inv%207%2F8".into()))
        );
        assert_eq!(
            m.lookup_path(LookupBy::Reference, "v1:k", "a", &Map::new()),
            Some(Err(PathError::MissingField("/business_reference".into())))
        );
    }

    /// A payload value `..` in a path segment turned `/v1/customers/{/id}/refunds` into
    /// `/v1/customers/../refunds` — `/v1/refunds` to the provider, called with oncely's
    /// credentials. Now `.`, `..` and empty path values are refused; in the query they
    /// are only values.
    #[test]
    fn dot_segments_in_a_path_are_refused() {
        let mut c =
            HttpProviderConfig::new("https://x", "/v1/customers/{/id}/refunds?note={/note}");
        c.lookup_path = "/v1/refunds/{/id}".into();
        let m = Mapping::new(&c).expect("m");
        let with = |id: &str| {
            let Value::Object(map) = json!({"id": id, "note": ".."}) else {
                unreachable!()
            };
            map
        };
        for bad in ["..", ".", ""] {
            assert_eq!(
                m.execute("v1:k", "a", &with(bad)).map(|r| r.path),
                Err(PathError::UnsafeSegment("/id".into())),
                "{bad:?}"
            );
            assert_eq!(
                m.lookup_path(LookupBy::Key, "v1:k", "a", &with(bad)),
                Some(Err(PathError::UnsafeSegment("/id".into())))
            );
        }
        assert_eq!(
            m.execute("v1:k", "a", &with("..x")).map(|r| r.path),
            Ok("/v1/customers/..x/refunds?note=..".into())
        );
        assert_eq!(
            PathError::UnsafeSegment("/id".into()).code(),
            "template_unsafe_path_value"
        );
    }
}
