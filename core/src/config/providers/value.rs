//! A configured value that is either written in the file or read at startup from an
//! environment variable or a file: how a provider's credentials reach its requests.
//!
//! Why the config holds only *where* a secret is, never the secret: the config is read
//! by every process (producers and admin tools included), shown by `--help`-style
//! commands and copied into bug reports, while credentials must reach only the process
//! that calls the provider. So a header written as `{ env = "STRIPE_KEY" }` stays a
//! variable name here; the worker reads the variable when it builds the adapter (a
//! missing one stops it at startup, naming the provider and the variable) and holds the
//! value as a sensitive header from then on.
//!
//! In a file:
//!
//! ```toml
//! [providers.mail.headers]
//! "X-Api-Version" = "2024-06-20"                              # literal (not a secret)
//! "X-Postmark-Server-Token" = { env = "POSTMARK_TOKEN" }      # from the environment
//! Authorization = { file = "/run/secrets/bank", prefix = "Bearer " }  # from a file
//! ```

use serde::de::{self, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::path::PathBuf;

/// Where a configured value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueSource {
    /// Written in the file as a plain string: for values that are not secrets (an API
    /// version, a tenant id). Secrets belong in `env` or `file`.
    Literal(String),
    /// `{ env = "NAME", prefix = "…" }`: the variable's value, after `prefix`.
    Env {
        /// The environment variable.
        var: String,
        /// Written before the value (e.g. `"Bearer "`).
        prefix: String,
    },
    /// `{ file = "PATH", prefix = "…" }`: the file's content without its trailing
    /// newline, after `prefix`.
    File {
        /// The file (read once, when the worker starts).
        path: PathBuf,
        /// Written before the value.
        prefix: String,
    },
}

impl ValueSource {
    /// Where it comes from, for error messages: never the value itself.
    pub fn describe(&self) -> String {
        match self {
            Self::Literal(_) => "the literal in the config".into(),
            Self::Env { var, .. } => format!("environment variable {var}"),
            Self::File { path, .. } => format!("file {}", path.display()),
        }
    }

    /// Whether the value is a secret (read from outside the config).
    pub fn is_secret(&self) -> bool {
        !matches!(self, Self::Literal(_))
    }

    /// The problem with this source's own fields, if any (names, not values).
    pub fn problem(&self) -> Option<String> {
        let prefix = match self {
            Self::Literal(v) => {
                return (!is_header_text(v))
                    .then(|| "must be visible ASCII text (no control characters)".into());
            }
            Self::Env { var, prefix } => {
                if var.is_empty() || var.contains(['=', '\0']) {
                    return Some(format!("{var:?} is not an environment variable name"));
                }
                prefix
            }
            Self::File { path, prefix } => {
                if path.as_os_str().is_empty() {
                    return Some("`file` must name a file".into());
                }
                prefix
            }
        };
        (!is_header_text(prefix))
            .then(|| "`prefix` must be visible ASCII text (no control characters)".into())
    }

    /// The value: the literal, the variable, or the file's content (trailing newline
    /// removed), after the prefix. Errors say which variable or file, never the value.
    pub fn resolve(&self) -> Result<String, String> {
        let (prefix, value) = match self {
            Self::Literal(v) => return Ok(v.clone()),
            Self::Env { var, prefix } => match std::env::var(var) {
                Ok(v) => (prefix, v),
                Err(std::env::VarError::NotPresent) => {
                    return Err(format!("environment variable {var} is not set"));
                }
                Err(std::env::VarError::NotUnicode(_)) => {
                    return Err(format!("environment variable {var} is not UTF-8"));
                }
            },
            Self::File { path, prefix } => match std::fs::read_to_string(path) {
                Ok(v) => (prefix, v.trim_end_matches(['\n', '\r']).to_owned()),
                Err(e) => return Err(format!("cannot read file {}: {e}", path.display())),
            },
        };
        if value.is_empty() {
            return Err(format!("{} is empty", self.describe()));
        }
        if !is_header_text(&value) {
            return Err(format!(
                "{} holds characters a header cannot carry (control characters or non-ASCII)",
                self.describe()
            ));
        }
        Ok(format!("{prefix}{value}"))
    }
}

/// Text a header value can carry: visible ASCII, spaces and tabs.
fn is_header_text(s: &str) -> bool {
    s.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
}

impl Serialize for ValueSource {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (key, value, prefix) = match self {
            Self::Literal(v) => return s.serialize_str(v),
            Self::Env { var, prefix } => ("env", var.clone(), prefix),
            Self::File { path, prefix } => ("file", path.display().to_string(), prefix),
        };
        let mut map = s.serialize_map(None)?;
        map.serialize_entry(key, &value)?;
        if !prefix.is_empty() {
            map.serialize_entry("prefix", prefix)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for ValueSource {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ValueSourceVisitor)
    }
}

struct ValueSourceVisitor;

impl<'de> Visitor<'de> for ValueSourceVisitor {
    type Value = ValueSource;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string, { env = \"VAR\" } or { file = \"PATH\" } (with an optional prefix)")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<ValueSource, E> {
        Ok(ValueSource::Literal(v.to_owned()))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ValueSource, A::Error> {
        let (mut env, mut file, mut prefix) = (None, None, None);
        while let Some(key) = map.next_key::<String>()? {
            let slot = match key.as_str() {
                "env" => &mut env,
                "file" => &mut file,
                "prefix" => &mut prefix,
                other => {
                    return Err(de::Error::unknown_field(other, &["env", "file", "prefix"]));
                }
            };
            if slot.replace(map.next_value::<String>()?).is_some() {
                return Err(de::Error::custom(format!("`{key}` given twice")));
            }
        }
        let prefix = prefix.unwrap_or_default();
        match (env, file) {
            (Some(var), None) => Ok(ValueSource::Env { var, prefix }),
            (None, Some(path)) => Ok(ValueSource::File {
                path: path.into(),
                prefix,
            }),
            _ => Err(de::Error::custom(
                "exactly one of `env` or `file` is needed",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn parse(text: &str) -> Result<BTreeMap<String, ValueSource>, String> {
        toml::from_str(text).map_err(|e: toml::de::Error| e.message().to_owned())
    }

    #[test]
    fn the_three_forms_read_and_write_back() {
        let text = "a = \"2024-06-20\"\nb = { env = \"TOKEN\", prefix = \"Bearer \" }\nc = { file = \"/run/s\" }\n";
        let map = parse(text).expect("parses");
        assert_eq!(map["a"], ValueSource::Literal("2024-06-20".into()));
        assert_eq!(
            map["b"],
            ValueSource::Env {
                var: "TOKEN".into(),
                prefix: "Bearer ".into()
            }
        );
        assert_eq!(
            map["c"],
            ValueSource::File {
                path: "/run/s".into(),
                prefix: String::new()
            }
        );
        let written = toml::to_string(&map).expect("serialize");
        assert_eq!(parse(&written).expect("round trip"), map);
        assert!(!map["a"].is_secret() && map["b"].is_secret() && map["c"].is_secret());
    }

    #[test]
    fn a_bad_table_says_what_is_wrong() {
        for (text, expected) in [
            (
                "a = { env = \"X\", file = \"/y\" }",
                "exactly one of `env` or `file`",
            ),
            (
                "a = { prefix = \"Bearer \" }",
                "exactly one of `env` or `file`",
            ),
            ("a = { vault = \"x\" }", "unknown field `vault`"),
            ("a = 3", "a string, { env"),
        ] {
            let err = parse(text).expect_err(text);
            assert!(err.contains(expected), "{text}: {err}");
        }
    }

    #[test]
    fn resolving_names_the_source_never_the_value() {
        let dir = std::env::temp_dir().join(format!("oncely-value-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("token");
        std::fs::write(&file, "s3cret-marker\n").expect("write");
        let from_file = ValueSource::File {
            path: file.clone(),
            prefix: "Bearer ".into(),
        };
        assert_eq!(from_file.resolve().as_deref(), Ok("Bearer s3cret-marker"));

        let missing = ValueSource::File {
            path: dir.join("absent"),
            prefix: String::new(),
        };
        let err = missing.resolve().expect_err("missing file");
        assert!(
            err.contains("cannot read file") && err.contains("absent"),
            "{err}"
        );

        std::fs::write(&file, "two\nlines-marker\n").expect("write");
        let err = from_file.resolve().expect_err("newline inside");
        assert!(!err.contains("marker") && err.contains("token"), "{err}");

        std::fs::write(&file, "\n").expect("write");
        assert!(from_file.resolve().expect_err("empty").contains("is empty"));

        let unset = ValueSource::Env {
            var: "ONCELY_TEST_SURELY_UNSET_VARIABLE".into(),
            prefix: String::new(),
        };
        assert_eq!(
            unset.resolve(),
            Err("environment variable ONCELY_TEST_SURELY_UNSET_VARIABLE is not set".into())
        );
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn problems_are_found_before_anything_is_read() {
        assert_eq!(ValueSource::Literal("v1".into()).problem(), None);
        assert!(ValueSource::Literal("a\nb".into()).problem().is_some());
        let env = |var: &str, prefix: &str| ValueSource::Env {
            var: var.into(),
            prefix: prefix.into(),
        };
        assert_eq!(env("TOKEN", "Bearer ").problem(), None);
        assert!(env("", "").problem().is_some());
        assert!(env("A=B", "").problem().is_some());
        assert!(env("TOKEN", "Bearer\r\n").problem().is_some());
        let no_file = ValueSource::File {
            path: PathBuf::new(),
            prefix: String::new(),
        };
        assert!(no_file.problem().is_some());
    }
}
