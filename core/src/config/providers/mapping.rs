//! The checks of an HTTP provider's request and answer mapping: paths and body are
//! templates that parse, the method is one the adapter sends, status lists make sense.
//! Everything here runs when the config is loaded, so that a bad mapping stops the fleet
//! at startup with the field named (`providers.bank.body.metadata.oncely_key: unknown
//! placeholder {kee}`) instead of failing calls.

use super::http::HttpProviderConfig;
use super::template::Template;
use crate::config::error::{ConfigError, invalid};
use serde_json::Value;

/// Methods an execute call may use.
pub const METHODS: &[&str] = &["POST", "PUT", "PATCH"];

impl HttpProviderConfig {
    pub(super) fn validate_mapping(&self, at: &str) -> Result<(), ConfigError> {
        let f = |x: &str| format!("{at}.{x}");
        if !METHODS.contains(&self.method.as_str()) {
            return Err(invalid(
                f("method"),
                format!("{:?}: use one of {}", self.method, METHODS.join(", ")),
            ));
        }
        path_template(&f("execute_path"), &self.execute_path, None)?;
        // A list lookup may fetch recent records without naming the key: the record is
        // then picked by the key it echoes (`key_echo_pointer`).
        let by_key_must_use = self.lookup_list_pointer.is_empty().then_some("{key}");
        path_template(&f("lookup_path"), &self.lookup_path, by_key_must_use)?;
        path_template(
            &f("lookup_by_reference_path"),
            &self.lookup_by_reference_path,
            Some("{reference}"),
        )?;
        if let Some(body) = &self.body {
            for (name, value) in body {
                body_value(&format!("{at}.body.{name}"), value)?;
            }
        }
        for (field, statuses) in [
            ("retry_statuses", &self.retry_statuses),
            ("in_flight_statuses", &self.in_flight_statuses),
            ("throttle_statuses", &self.throttle_statuses),
        ] {
            if let Some(bad) = statuses.iter().find(|s| !(400..=599).contains(*s)) {
                return Err(invalid(
                    f(field),
                    format!("{bad} is not an error status (400..=599)"),
                ));
            }
        }
        // A status in both retry_statuses and throttle_statuses is a throttle (files that
        // listed 429 as a retry status, the old default, keep working).
        for (other, statuses) in [
            ("retry_statuses", &self.retry_statuses),
            ("throttle_statuses", &self.throttle_statuses),
        ] {
            if let Some(both) = statuses
                .iter()
                .find(|s| self.in_flight_statuses.contains(s))
            {
                return Err(invalid(
                    f("in_flight_statuses"),
                    format!("{both} is also in {other}"),
                ));
            }
        }
        Ok(())
    }
}

/// A path template: starts with '/', parses, and (for lookups) uses `must_use`.
fn path_template(field: &str, text: &str, must_use: Option<&str>) -> Result<(), ConfigError> {
    if text.is_empty() && !field.ends_with("execute_path") {
        return Ok(());
    }
    if !text.starts_with('/') {
        return Err(invalid(field, "must start with '/'"));
    }
    Template::parse(text).map_err(|e| invalid(field, e))?;
    if let Some(placeholder) = must_use
        && !text.contains(placeholder)
    {
        return Err(invalid(field, format!("must contain {placeholder}")));
    }
    Ok(())
}

/// A body value: strings are templates; tables and arrays nest.
fn body_value(field: &str, value: &Value) -> Result<(), ConfigError> {
    match value {
        Value::String(text) => Template::parse(text)
            .map(|_| ())
            .map_err(|e| invalid(field, e)),
        Value::Object(map) => map
            .iter()
            .try_for_each(|(k, v)| body_value(&format!("{field}.{k}"), v)),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .try_for_each(|(i, v)| body_value(&format!("{field}[{i}]"), v)),
        Value::Null | Value::Bool(_) | Value::Number(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::super::http::Encoding;
    use super::*;
    use serde_json::json;

    fn stripe() -> HttpProviderConfig {
        let mut c = HttpProviderConfig::new("https://api.stripe.example", "/v1/payment_intents");
        c.encoding = Encoding::Form;
        let Value::Object(body) = json!({
            "amount": "{/amount_minor}", "currency": "{/currency}", "confirm": true,
            "metadata": {"oncely_key": "{key}", "reference": "{reference}"},
            "description": "Order {reference} ({{oncely}})"
        }) else {
            unreachable!()
        };
        c.body = Some(body);
        c.lookup_path = "/v1/payment_intents/search?query=metadata['oncely_key']:'{key}'".into();
        c
    }

    #[test]
    fn a_stripe_shaped_mapping_is_valid_and_each_bad_field_is_named() {
        stripe().validate("providers.p").expect("valid");
        type Break = fn(&mut HttpProviderConfig);
        let cases: &[(Break, &str)] = &[
            (|c| c.method = "GET".into(), "method"),
            (|c| c.execute_path = "/v1/{kee}".into(), "execute_path"),
            (|c| c.execute_path = "v1".into(), "execute_path"),
            (|c| c.lookup_path = "/v1/x/{/id".into(), "lookup_path"),
            (
                |c| c.lookup_path = "/v1/x/{reference}".into(),
                "lookup_path",
            ),
            (
                |c| {
                    if let Some(b) = c.body.as_mut() {
                        b.insert("metadata".into(), json!({"oncely_key": "{kee}"}));
                    }
                },
                "body.metadata.oncely_key",
            ),
            (
                |c| {
                    if let Some(b) = c.body.as_mut() {
                        b.insert("items".into(), json!([{"price": "{/p"}]));
                    }
                },
                "body.items[0].price",
            ),
            (|c| c.retry_statuses = vec![200], "retry_statuses"),
            (|c| c.in_flight_statuses = vec![429], "in_flight_statuses"),
            (|c| c.in_flight_statuses = vec![408], "in_flight_statuses"),
            (|c| c.throttle_statuses = vec![200], "throttle_statuses"),
            (
                |c| c.lookup_list_pointer = "data".into(),
                "lookup_list_pointer",
            ),
            (
                |c| c.key_echo_pointer = "metadata".into(),
                "key_echo_pointer",
            ),
        ];
        for (i, (break_it, field)) in cases.iter().enumerate() {
            let mut c = stripe();
            break_it(&mut c);
            let err = c.validate("providers.p").expect_err(field).to_string();
            assert!(
                err.contains(&format!("`providers.p.{field}`")),
                "case {i}: {err:?} should name {field}"
            );
        }
    }
}
