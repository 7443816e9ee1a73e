//! A provider's configured headers, read once when the worker builds its adapters.
//!
//! Why here and not when the config is loaded: only the processes that call providers
//! may hold credentials, and a missing one must stop the worker at startup — naming the
//! provider and the variable or file — rather than fail every call later. Values are
//! marked sensitive (hyper never prints them; their `Debug` says `Sensitive`), are
//! never logged, never become metric labels and never reach the journal: the journal
//! records the provider's answer, not the request.

use hyper::header::{AUTHORIZATION, HeaderName, HeaderValue};
use oncely_core::config::{ConfigError, HttpProviderConfig};

/// The headers for `[providers.NAME]`, resolved; errors name the field and the source.
pub(crate) fn resolve(
    name: &str,
    config: &HttpProviderConfig,
) -> Result<Vec<(HeaderName, HeaderValue)>, ConfigError> {
    let invalid = |field: String, problem: String| ConfigError::Invalid {
        field: format!("providers.{name}.{field}"),
        problem,
    };
    let mut headers = Vec::with_capacity(config.headers.len() + 1);
    for (header, source) in &config.headers {
        let field = format!("headers.{header}");
        let header_name = HeaderName::from_bytes(header.as_bytes())
            .map_err(|_| invalid(field.clone(), "is not a valid header name".into()))?;
        let value = source.resolve().map_err(|e| invalid(field.clone(), e))?;
        headers.push((
            header_name,
            sensitive(&value).map_err(|e| invalid(field, e))?,
        ));
    }
    if let Some(basic) = &config.basic_auth {
        let part = |field: &str, source: &oncely_core::config::ValueSource| {
            source
                .resolve()
                .map_err(|e| invalid(format!("basic_auth.{field}"), e))
        };
        let user = part("username", &basic.username)?;
        let password = part("password", &basic.password)?;
        if user.contains(':') {
            return Err(invalid(
                "basic_auth.username".into(),
                format!("{} holds a ':'", basic.username.describe()),
            ));
        }
        let token = base64(format!("{user}:{password}").as_bytes());
        let value =
            sensitive(&format!("Basic {token}")).map_err(|e| invalid("basic_auth".into(), e))?;
        headers.push((AUTHORIZATION, value));
    }
    Ok(headers)
}

fn sensitive(value: &str) -> Result<HeaderValue, String> {
    let mut v = HeaderValue::from_str(value)
        .map_err(|_| "the value cannot be carried in a header".to_owned())?;
    v.set_sensitive(true);
    Ok(v)
}

/// Standard base64 with padding (RFC 4648 §4), for Basic credentials.
fn base64(input: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
    for chunk in input.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncely_core::config::{BasicAuth, ValueSource};

    #[test]
    fn base64_matches_rfc_4648() {
        for (input, expected) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
            ("sk_test_123:", "c2tfdGVzdF8xMjM6"),
        ] {
            assert_eq!(base64(input.as_bytes()), expected, "{input}");
        }
    }

    #[test]
    fn headers_resolve_sensitive_and_a_missing_source_names_provider_and_source() {
        let dir = std::env::temp_dir().join(format!("oncely-cred-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let key = dir.join("key");
        std::fs::write(&key, "sk_test_123\n").expect("write");

        let mut config = HttpProviderConfig::new("https://api.example.com", "/v1/x");
        config
            .headers
            .insert("X-Api-Version".into(), ValueSource::Literal("7".into()));
        config.basic_auth = Some(BasicAuth {
            username: ValueSource::File {
                path: key.clone(),
                prefix: String::new(),
            },
            password: ValueSource::Literal(String::new()),
        });
        let headers = resolve("bank", &config).expect("resolves");
        let auth = headers
            .iter()
            .find(|(n, _)| n == AUTHORIZATION)
            .map(|(_, v)| v)
            .expect("authorization");
        assert_eq!(auth, "Basic c2tfdGVzdF8xMjM6");
        assert!(headers.iter().all(|(_, v)| v.is_sensitive()));
        assert!(!format!("{headers:?}").contains("c2tf"));

        config.headers.insert(
            "X-Token".into(),
            ValueSource::Env {
                var: "ONCELY_TEST_NO_SUCH_TOKEN".into(),
                prefix: String::new(),
            },
        );
        let err = resolve("bank", &config).expect_err("unset").to_string();
        assert!(
            err.contains("providers.bank.headers.X-Token")
                && err.contains("ONCELY_TEST_NO_SUCH_TOKEN is not set"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
