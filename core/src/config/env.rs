//! Environment overrides, applied to the parsed TOML document before it is typed.
//!
//! Why on the document and not on the typed [`Config`](super::Config): an override goes
//! through the same deserializer and validation as the file, so a bad value in the
//! environment is the same clear startup error as a bad value in the file.
//!
//! Names: `DATABASE_URL`, `ONCELY_DATABASE_POOLER`, `ONCELY_AMQP_URL`, `ONCELY_AMQP_URLS`
//! (comma-separated, the nodes of a cluster), `ONCELY_PREFIX`, and generically
//! `ONCELY__SECTION__NAME__FIELD=value` (`.` in an action type is written `_DOT_`).

use super::error::{ConfigError, invalid};

/// Apply every override in `env` to `doc`; other variables are ignored.
pub(crate) fn apply(
    doc: &mut toml::Table,
    env: impl Iterator<Item = (String, String)>,
) -> Result<(), ConfigError> {
    for (name, value) in env {
        if name == "ONCELY_AMQP_URLS" {
            let urls: Vec<toml::Value> = value
                .split(',')
                .map(str::trim)
                .filter(|u| !u.is_empty())
                .map(|u| toml::Value::String(u.to_owned()))
                .collect();
            if urls.is_empty() {
                return Err(invalid(
                    "ONCELY_AMQP_URLS (env)",
                    "is empty: give the nodes' URLs, comma-separated",
                ));
            }
            let broker = doc
                .entry("broker")
                .or_insert_with(|| toml::Value::Table(toml::Table::new()))
                .as_table_mut()
                .ok_or_else(|| invalid("ONCELY_AMQP_URLS (env)", "`broker` is not a table"))?;
            broker.insert("urls".into(), toml::Value::Array(urls));
            continue;
        }
        let path: Vec<String> = match name.as_str() {
            "DATABASE_URL" => vec!["database_url".into()],
            "ONCELY_DATABASE_POOLER" => vec!["database_pooler".into()],
            "ONCELY_AMQP_URL" => vec!["broker".into(), "url".into()],
            "ONCELY_PREFIX" => vec!["broker".into(), "prefix".into()],
            _ => match name.strip_prefix("ONCELY__") {
                Some(rest) => rest
                    .split("__")
                    .map(|s| s.to_lowercase().replace("_dot_", "."))
                    .collect(),
                None => continue,
            },
        };
        set_path(doc, &path, &value)
            .map_err(|problem| invalid(format!("{name} (env)"), problem))?;
    }
    Ok(())
}

fn set_path(doc: &mut toml::Table, path: &[String], raw: &str) -> Result<(), String> {
    let (last, parents) = path.split_last().ok_or("empty override path")?;
    let mut table = doc;
    for p in parents {
        let entry = table
            .entry(p.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        table = entry
            .as_table_mut()
            .ok_or_else(|| format!("`{p}` is not a table"))?;
    }
    // A number or boolean if it reads as one, otherwise a string.
    let value = raw
        .parse::<i64>()
        .map(toml::Value::Integer)
        .or_else(|_| raw.parse::<bool>().map(toml::Value::Boolean))
        .unwrap_or_else(|_| toml::Value::String(raw.to_owned()));
    table.insert(last.clone(), value);
    Ok(())
}
