//! The small template language of provider mappings: text with `{…}` placeholders.
//!
//! Why our own instead of a template engine: a mapping only ever needs to pick values
//! (the idempotency key, a payload field) and put them in a path or a body field; no
//! loops, no conditions, no filters. A general engine would let a config do far more
//! than that, and its errors would come at call time. This one is parsed when the config
//! is loaded — a bad placeholder stops the fleet at startup with the field named — and
//! rendering can only fail one way: a payload field that is not there.
//!
//! Placeholders:
//!
//! | placeholder | value |
//! | --- | --- |
//! | `{key}` | the operation's idempotency key |
//! | `{action_type}` | its action type (`payment_order.create`) |
//! | `{reference}` | the business reference: the payload's field at the provider's `reference_pointer` |
//! | `{/a/b}` | the payload's field at JSON pointer `/a/b` |
//!
//! `{{` and `}}` are literal braces. A template that is exactly one placeholder keeps the
//! value's JSON type (`"{/amount_minor}"` renders the number `1250`); anywhere else a
//! value is written as text (strings as they are, numbers and booleans as JSON writes
//! them, objects and arrays as compact JSON).

use serde_json::{Map, Value};
use std::borrow::Cow;

/// One piece of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// Literal text.
    Text(String),
    /// `{key}`.
    Key,
    /// `{action_type}`.
    ActionType,
    /// `{reference}`.
    Reference,
    /// `{/pointer}` into the payload.
    Field(String),
}

/// A parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part>,
}

/// What a template is rendered with.
#[derive(Debug, Clone, Copy)]
pub struct Values<'a> {
    /// The idempotency key.
    pub key: &'a str,
    /// The action type.
    pub action_type: &'a str,
    /// The payload.
    pub payload: &'a Map<String, Value>,
    /// Where the business reference is in the payload.
    pub reference_pointer: &'a str,
}

/// Rendering failed: the payload has no field at this pointer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingField(pub String);

/// A request path could not be rendered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathError {
    /// The payload has no field at this pointer.
    MissingField(String),
    /// The value at this pointer is `.`, `..` or empty: in a path it would change which
    /// resource is called (`/v1/customers/{/id}/refunds` with `..` is `/v1/refunds`),
    /// with oncely's credentials. Percent-encoding does not help: `%2E%2E` is `..` to a
    /// server that normalises after decoding.
    UnsafeSegment(String),
}

impl From<MissingField> for PathError {
    fn from(MissingField(pointer): MissingField) -> Self {
        PathError::MissingField(pointer)
    }
}

impl PathError {
    /// The payload pointer concerned (for the log; never the value).
    pub fn pointer(&self) -> &str {
        match self {
            PathError::MissingField(p) | PathError::UnsafeSegment(p) => p,
        }
    }

    /// The outcome code: `template_missing_field` or `template_unsafe_path_value`.
    pub fn code(&self) -> &'static str {
        match self {
            PathError::MissingField(_) => "template_missing_field",
            PathError::UnsafeSegment(_) => "template_unsafe_path_value",
        }
    }
}

/// Percent-encode a value for a URL path or query: everything but RFC 3986's unreserved
/// characters.
pub fn percent_encode(value: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0x0F)]));
        }
    }
    out
}

impl Template {
    /// Parses `text`; the error says what is wrong (unknown placeholder, unbalanced
    /// brace), for a message naming the field.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut chars = text.char_indices().peekable();
        while let Some((at, c)) = chars.next() {
            match c {
                '{' if chars.peek().map(|&(_, n)| n) == Some('{') => {
                    chars.next();
                    literal.push('{');
                }
                '}' if chars.peek().map(|&(_, n)| n) == Some('}') => {
                    chars.next();
                    literal.push('}');
                }
                '}' => {
                    return Err(format!(
                        "a lone '}}' at byte {at} (write '}}}}' for a brace)"
                    ));
                }
                '{' => {
                    let rest = &text[at + 1..];
                    let Some(end) = rest.find('}') else {
                        return Err(format!("'{{' at byte {at} is not closed"));
                    };
                    let name = &rest[..end];
                    for _ in 0..=name.chars().count() {
                        chars.next();
                    }
                    if !literal.is_empty() {
                        parts.push(Part::Text(std::mem::take(&mut literal)));
                    }
                    parts.push(placeholder(name)?);
                }
                c => literal.push(c),
            }
        }
        if !literal.is_empty() {
            parts.push(Part::Text(literal));
        }
        Ok(Template { parts })
    }

    /// The pieces, in order.
    pub fn parts(&self) -> &[Part] {
        &self.parts
    }

    /// Whether the template uses `{reference}`.
    pub fn uses_reference(&self) -> bool {
        self.parts.contains(&Part::Reference)
    }

    /// The value: typed when the template is one placeholder, else text.
    pub fn render(&self, v: &Values<'_>) -> Result<Value, MissingField> {
        if let [only] = self.parts.as_slice()
            && !matches!(only, Part::Text(_))
        {
            return value_of(only, v).map(Cow::into_owned);
        }
        self.render_text(v, |s| s.to_owned()).map(Value::String)
    }

    /// The text, each placeholder's value passed through `escape` (e.g. percent-encoding
    /// for a path); literal text is kept as written.
    pub fn render_text(
        &self,
        v: &Values<'_>,
        escape: impl Fn(&str) -> String,
    ) -> Result<String, MissingField> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(t) => out.push_str(t),
                other => out.push_str(&escape(&as_text(value_of(other, v)?.as_ref()))),
            }
        }
        Ok(out)
    }

    /// A request path (with its query): each value percent-encoded; a value in the path
    /// part (before the first `?` of the literal text) that is `.`, `..` or empty is
    /// refused ([`PathError::UnsafeSegment`]).
    pub fn render_path(&self, v: &Values<'_>) -> Result<String, PathError> {
        let mut out = String::new();
        let mut in_query = false;
        for part in &self.parts {
            match part {
                Part::Text(t) => {
                    in_query |= t.contains('?');
                    out.push_str(t);
                }
                other => {
                    let value = value_of(other, v)?;
                    let text = as_text(value.as_ref());
                    if !in_query && matches!(text.as_ref(), "" | "." | "..") {
                        let pointer = match other {
                            Part::Field(p) => p.as_str(),
                            Part::Reference => v.reference_pointer,
                            Part::Key => "{key}",
                            _ => "{action_type}",
                        };
                        return Err(PathError::UnsafeSegment(pointer.to_owned()));
                    }
                    out.push_str(&percent_encode(&text));
                }
            }
        }
        Ok(out)
    }
}

fn placeholder(name: &str) -> Result<Part, String> {
    match name {
        "key" => Ok(Part::Key),
        "action_type" => Ok(Part::ActionType),
        "reference" => Ok(Part::Reference),
        pointer if pointer.starts_with('/') => Ok(Part::Field(pointer.to_owned())),
        other => Err(format!(
            "unknown placeholder {{{other}}}: use {{key}}, {{action_type}}, {{reference}} or a payload pointer like {{/amount_minor}}"
        )),
    }
}

fn value_of<'v>(part: &Part, v: &Values<'v>) -> Result<Cow<'v, Value>, MissingField> {
    let field = |pointer: &str| {
        pointer_in(v.payload, pointer)
            .filter(|value| !value.is_null())
            .map(Cow::Borrowed)
            .ok_or_else(|| MissingField(pointer.to_owned()))
    };
    match part {
        Part::Key => Ok(Cow::Owned(Value::String(v.key.to_owned()))),
        Part::ActionType => Ok(Cow::Owned(Value::String(v.action_type.to_owned()))),
        Part::Reference => field(v.reference_pointer),
        Part::Field(pointer) => field(pointer),
        Part::Text(t) => Ok(Cow::Owned(Value::String(t.clone()))),
    }
}

/// A value as text: strings as they are, everything else as compact JSON.
pub fn as_text(value: &Value) -> Cow<'_, str> {
    match value {
        Value::String(s) => Cow::Borrowed(s),
        other => Cow::Owned(other.to_string()),
    }
}

/// [`Value::pointer`] on an object held as a `Map` (no clone of the payload).
pub fn pointer_in<'v>(map: &'v Map<String, Value>, pointer: &str) -> Option<&'v Value> {
    let rest = pointer.strip_prefix('/')?;
    let (token, tail) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let token = token.replace("~1", "/").replace("~0", "~");
    map.get(&token)?.pointer(tail)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn payload() -> Map<String, Value> {
        let Value::Object(map) = json!({
            "amount_minor": 1250, "currency": "eur", "to": {"email": "a@b.test"},
            "business_reference": "inv-7", "tags": ["x"], "none": null
        }) else {
            unreachable!()
        };
        map
    }

    fn values(payload: &Map<String, Value>) -> Values<'_> {
        Values {
            key: "v1:abc",
            action_type: "payment_order.create",
            payload,
            reference_pointer: "/business_reference",
        }
    }

    #[test]
    fn one_placeholder_keeps_its_type_and_text_mixes_as_text() {
        let p = payload();
        let v = values(&p);
        let render = |t: &str| Template::parse(t).expect(t).render(&v);
        assert_eq!(render("{/amount_minor}"), Ok(json!(1250)));
        assert_eq!(render("{/to/email}"), Ok(json!("a@b.test")));
        assert_eq!(render("{/to}"), Ok(json!({"email": "a@b.test"})));
        assert_eq!(render("{key}"), Ok(json!("v1:abc")));
        assert_eq!(render("{reference}"), Ok(json!("inv-7")));
        assert_eq!(
            render("Invoice {reference}: {/amount_minor} {/currency} {{x}}"),
            Ok(json!("Invoice inv-7: 1250 eur {x}"))
        );
        assert_eq!(render("{/tags}!"), Ok(json!("[\"x\"]!")));
        assert_eq!(render("plain"), Ok(json!("plain")));
        assert_eq!(render(""), Ok(json!("")));
    }

    #[test]
    fn a_missing_or_null_field_is_named() {
        let p = payload();
        let v = values(&p);
        for (t, missing) in [
            ("{/absent}", "/absent"),
            ("x {/to/name}", "/to/name"),
            ("{/none}", "/none"),
        ] {
            let got = Template::parse(t).expect(t).render(&v);
            assert_eq!(got, Err(MissingField(missing.into())), "{t}");
        }
        let no_ref = Map::new();
        let got = Template::parse("{reference}")
            .expect("parses")
            .render(&values(&no_ref));
        assert_eq!(got, Err(MissingField("/business_reference".into())));
    }

    #[test]
    fn paths_escape_values_not_literals() {
        let p = payload();
        let v = values(&p);
        let t = Template::parse("/v1/x/{key}?ref={reference}").expect("parses");
        let out = t
            .render_text(&v, |s| s.replace(':', "%3A"))
            .expect("renders");
        assert_eq!(out, "/v1/x/v1%3Aabc?ref=inv-7");
        assert!(t.uses_reference());
    }

    #[test]
    fn bad_templates_say_why() {
        for (t, why) in [
            ("{kee}", "unknown placeholder {kee}"),
            ("{/a", "is not closed"),
            ("a}", "lone '}'"),
            ("{}", "unknown placeholder {}"),
        ] {
            let err = Template::parse(t).expect_err(t);
            assert!(err.contains(why), "{t}: {err}");
        }
        assert_eq!(
            Template::parse("é{key}ü").expect("unicode").parts(),
            &[Part::Text("é".into()), Part::Key, Part::Text("ü".into())]
        );
    }
}
