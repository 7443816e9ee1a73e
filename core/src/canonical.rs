//! Canonical JSON: the exact bytes the article's Python produces.
//!
//! Keys and payload hashes are a cross-language contract: an agent in Python computes
//! `json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")`
//! and must get the same bytes we do, or the same intent gets two keys. So this module
//! re-implements that encoder rather than trusting `serde_json`'s output, which differs
//! in string escaping (Python escapes `\u007f`-free control characters the same way but
//! never escapes `/`) and, above all, in how floats are printed (`1e16` vs `1e+16`).
//!
//! Object keys sort by code point, which for UTF-8 strings is byte order — the order of
//! `serde_json::Map` (a `BTreeMap` without the `preserve_order` feature). Integers print
//! as decimals; floats as Python's `repr` (shortest round-trip digits, scientific form
//! when the exponent is below -4 or at least 16, exponent with a sign and two digits).

use serde_json::Value;
use std::fmt::Write as _;

/// Errors a value can raise on its way to canonical bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CanonicalError {
    /// NaN and infinities have no JSON form that other languages agree on.
    #[error("non-finite number {0} has no canonical JSON form")]
    NonFinite(String),
}

/// Canonical JSON bytes of `value` (see the module docs for the exact rules).
pub fn canonical_json(value: &Value) -> Result<Vec<u8>, CanonicalError> {
    let mut out = String::with_capacity(128);
    write_value(&mut out, value)?;
    Ok(out.into_bytes())
}

/// Canonical JSON as a `String` (the same bytes as [`canonical_json`]).
pub fn canonical_string(value: &Value) -> Result<String, CanonicalError> {
    let mut out = String::with_capacity(128);
    write_value(&mut out, value)?;
    Ok(out)
}

fn write_value(out: &mut String, value: &Value) -> Result<(), CanonicalError> {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                let _ = write!(out, "{i}");
            } else if let Some(u) = n.as_u64() {
                let _ = write!(out, "{u}");
            } else {
                let f = n.as_f64().unwrap_or(f64::NAN);
                write_python_float(out, f)?;
            }
        }
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item)?;
            }
            out.push(']');
        }
        Value::Object(map) => {
            // serde_json's Map is a BTreeMap here: iteration is already in byte order,
            // which equals Python's code-point order for `sort_keys=True`.
            out.push('{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, k);
                out.push(':');
                write_value(out, v)?;
            }
            out.push('}');
        }
    }
    Ok(())
}

/// Python's `encode_basestring` (the `ensure_ascii=False` path).
fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `float.__repr__`: shortest digits that round-trip, positional notation for
/// decimal exponents in [-4, 16), scientific (`1e+16`, `1.5e-05`) outside.
fn write_python_float(out: &mut String, f: f64) -> Result<(), CanonicalError> {
    if !f.is_finite() {
        return Err(CanonicalError::NonFinite(f.to_string()));
    }
    if f == 0.0 {
        out.push_str(if f.is_sign_negative() { "-0.0" } else { "0.0" });
        return Ok(());
    }
    // Rust's `{:e}` prints the shortest round-trip digits: "1.2345e-7", "1e16".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (negative, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if negative {
        out.push('-');
    }
    if (-4..16).contains(&exp) {
        // Positional: place the decimal point `exp + 1` digits from the left.
        let point = exp + 1;
        if point <= 0 {
            out.push_str("0.");
            for _ in 0..(-point) {
                out.push('0');
            }
            out.push_str(&digits);
        } else {
            let point = point as usize;
            if digits.len() <= point {
                out.push_str(&digits);
                for _ in digits.len()..point {
                    out.push('0');
                }
                out.push_str(".0");
            } else {
                out.push_str(&digits[..point]);
                out.push('.');
                out.push_str(&digits[point..]);
            }
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(out, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn canon(v: Value) -> String {
        canonical_string(&v).expect("canonical")
    }

    #[test]
    fn sorts_keys_and_uses_compact_separators() {
        assert_eq!(
            canon(json!({"b": 1, "a": [1, 2, {"d": null, "c": true}]})),
            r#"{"a":[1,2,{"c":true,"d":null}],"b":1}"#
        );
    }

    #[test]
    fn strings_escape_like_python_without_ensure_ascii() {
        // Checked against CPython 3.11: json.dumps("é\"\\\n\t\x01/\u2028", ensure_ascii=False)
        assert_eq!(
            canon(json!("é\"\\\n\t\u{1}/\u{2028}")),
            "\"é\\\"\\\\\\n\\t\\u0001/\u{2028}\""
        );
        assert_eq!(canon(json!("\u{7f}\u{8}\u{c}\r")), "\"\u{7f}\\b\\f\\r\"");
    }

    #[test]
    fn keys_sort_by_code_point() {
        // Python: sorted(["é", "z", "Z", "a", "😀", "\uffff"]) == ['Z', 'a', 'z', 'é', '\uffff', '😀']
        let v = json!({"é": 1, "z": 2, "Z": 3, "a": 4, "😀": 5, "\u{ffff}": 6});
        assert_eq!(
            canon(v),
            "{\"Z\":3,\"a\":4,\"z\":2,\"é\":1,\"\u{ffff}\":6,\"😀\":5}"
        );
    }

    #[test]
    fn floats_print_like_python_repr() {
        // Each right-hand side is CPython 3.11's repr() of the left-hand float.
        let cases: &[(f64, &str)] = &[
            (1.0, "1.0"),
            (-2.5, "-2.5"),
            (0.1, "0.1"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (123456789012345.0, "123456789012345.0"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.25e16, "1.25e+16"),
            (1e100, "1e+100"),
            (5e-324, "5e-324"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (0.30000000000000004, "0.30000000000000004"),
            (-0.0, "-0.0"),
            (12.0, "12.0"),
        ];
        for (f, want) in cases {
            let mut s = String::new();
            write_python_float(&mut s, *f).expect("finite");
            assert_eq!(&s, want, "repr of {f:?}");
        }
    }

    #[test]
    fn integers_keep_full_range() {
        assert_eq!(
            canon(json!([i64::MIN, u64::MAX, 0, -1])),
            format!("[{},{},0,-1]", i64::MIN, u64::MAX)
        );
    }
}
