//! The group roles and their grants as SQL: what `oncely-worker migrate --roles` runs
//! (in one transaction) and what `--print` shows a DBA to apply by hand.
//!
//! The statements are computed from the live schema ([`Schema::load`]) and the needs
//! table ([`super::grants`]): column lists are the columns the tables have now, so a
//! deny list ("every column but the payload's") stays a deny list after a migration
//! adds columns — once `migrate --roles` runs again, which is why it runs after the
//! migrations, every time. Running it again is harmless: roles are created only when
//! missing, every privilege of the runtime roles is revoked and granted afresh in the
//! same transaction, and ownership is (re)assigned to `<prefix>migrate`.
//!
//! What it also changes, and why:
//! - `REVOKE CREATE ON SCHEMA … FROM PUBLIC` (Postgres 15 already does that for new
//!   databases; older clusters and upgraded ones do not) and
//!   `REVOKE TEMPORARY ON DATABASE … FROM PUBLIC`: no runtime role creates anything,
//!   not even a temporary table.
//! - The tables, their sequences and oncely's functions are owned by `<prefix>migrate`:
//!   the transition trigger runs as its owner (`SECURITY DEFINER`), so its owner must be
//!   a role no process logs in as directly.

use super::grants::{Columns, Need, OPERATIONS, Privilege, needs};
use super::{Role, valid_prefix};
use sqlx::PgPool;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Why the roles could not be planned or applied.
#[derive(Debug, thiserror::Error)]
pub enum RolesError {
    /// The prefix would not make plain role names.
    #[error(
        "role prefix {0:?}: use lower-case letters, digits and '_', starting with a letter or '_' (at most 52 characters)"
    )]
    BadPrefix(String),
    /// The journal's tables are not there.
    #[error(
        "the database has no agent_operations table: run `oncely-worker migrate` first (the grants are computed from the migrated schema)"
    )]
    NotMigrated,
    /// Reading the schema failed.
    #[error("reading the schema failed: {0}")]
    Read(#[source] sqlx::Error),
    /// A statement failed (typically: the connected role may not create roles or change
    /// owners — run it as a superuser or the database owner with CREATEROLE).
    #[error("applying the roles failed at `{statement}`: {source}")]
    Apply {
        /// The first line of the statement.
        statement: String,
        /// The server's error.
        source: sqlx::Error,
    },
}

/// The facts about the live schema the grants are computed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schema {
    /// The database.
    pub database: String,
    /// The schema the journal lives in.
    pub schema: String,
    /// Its tables' columns, in column order, by table.
    pub columns: BTreeMap<String, Vec<String>>,
    /// The sequence behind each serial column the needs name, qualified.
    pub serials: HashMap<(String, String), String>,
    /// oncely's functions (`oncely_*`), qualified, with their argument types.
    pub functions: Vec<String>,
}

impl Schema {
    /// Read the facts from the database `pool` is connected to.
    pub async fn load(pool: &PgPool) -> Result<Schema, RolesError> {
        let located: Option<(String, String)> = sqlx::query_as(
            "SELECT current_database()::text, n.nspname::text FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)",
        )
        .bind(OPERATIONS)
        .fetch_optional(pool)
        .await
        .map_err(RolesError::Read)?;
        let Some((database, schema)) = located else {
            return Err(RolesError::NotMigrated);
        };
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SELECT c.relname::text, a.attname::text FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped \
             WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') ORDER BY c.relname, a.attnum",
        )
        .bind(&schema)
        .fetch_all(pool)
        .await
        .map_err(RolesError::Read)?;
        let mut columns: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (table, column) in rows {
            columns.entry(table).or_default().push(column);
        }
        let wanted: BTreeSet<(&str, &str)> = super::Process::ALL
            .iter()
            .flat_map(|p| needs(*p))
            .filter_map(|n| match n {
                Need::Serial { table, column } if columns.contains_key(table) => {
                    Some((table, column))
                }
                _ => None,
            })
            .collect();
        let (tables, cols): (Vec<&str>, Vec<&str>) = wanted.into_iter().unzip();
        let serials: Vec<(String, String, Option<String>)> = sqlx::query_as(
            "SELECT x.t, x.c, pg_get_serial_sequence(format('%I.%I', $1::text, x.t), x.c) \
             FROM unnest($2::text[], $3::text[]) AS x(t, c)",
        )
        .bind(&schema)
        .bind(&tables)
        .bind(&cols)
        .fetch_all(pool)
        .await
        .map_err(RolesError::Read)?;
        let functions: Vec<String> = sqlx::query_scalar(
            "SELECT format('%I.%I(%s)', n.nspname, p.proname, pg_get_function_identity_arguments(p.oid)) \
             FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
             WHERE n.nspname = $1 AND p.proname LIKE 'oncely\\_%' ORDER BY 1",
        )
        .bind(&schema)
        .fetch_all(pool)
        .await
        .map_err(RolesError::Read)?;
        Ok(Schema {
            database,
            schema,
            columns,
            serials: serials
                .into_iter()
                .filter_map(|(t, c, s)| s.map(|s| ((t, c), s)))
                .collect(),
            functions,
        })
    }

    fn table(&self, name: &str) -> String {
        format!("{}.{}", ident(&self.schema), ident(name))
    }

    /// The qualified signature of oncely's function `name`, if the schema has it.
    fn function(&self, name: &str) -> Option<&String> {
        self.functions.iter().find(|f| {
            f.split_once('(')
                .and_then(|(qualified, _)| qualified.rsplit_once('.'))
                .is_some_and(|(_, n)| n.trim_matches('"') == name)
        })
    }
}

/// `"name"`, quoted for SQL.
pub fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `'text'`, quoted for SQL.
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// What one role gets on one table for one privilege.
enum Cover {
    Whole,
    Some(BTreeSet<String>),
}

/// The statements for `prefix` on the schema `pool` is connected to.
pub async fn plan(pool: &PgPool, prefix: &str) -> Result<Vec<String>, RolesError> {
    if !valid_prefix(prefix) {
        return Err(RolesError::BadPrefix(prefix.to_owned()));
    }
    Ok(statements(&Schema::load(pool).await?, prefix))
}

/// Run [`plan`]'s statements in one transaction; returns them.
pub async fn apply(pool: &PgPool, prefix: &str) -> Result<Vec<String>, RolesError> {
    let statements = plan(pool, prefix).await?;
    let failed = |statement: &str| {
        let statement = statement.lines().next().unwrap_or_default().to_owned();
        move |source| RolesError::Apply { statement, source }
    };
    let mut tx = pool.begin().await.map_err(failed("BEGIN"))?;
    for s in &statements {
        sqlx::raw_sql(sqlx::AssertSqlSafe(s.clone()))
            .execute(&mut *tx)
            .await
            .map_err(failed(s))?;
    }
    tx.commit().await.map_err(failed("COMMIT"))?;
    Ok(statements)
}

/// The statements, for a psql session: a header, `BEGIN`, the statements, `COMMIT`.
pub fn script(statements: &[String], prefix: &str) -> String {
    let mut out = format!(
        "-- oncely group roles (prefix {prefix:?}): generated by `oncely-worker migrate --roles --print`.\n\
         -- Apply as a superuser (or the database owner with CREATEROLE), after the migrations,\n\
         -- and again after every migration. docs/security.md (Least privilege) explains each grant.\n\
         BEGIN;\n"
    );
    for s in statements {
        out.push_str(s);
        out.push_str(";\n");
    }
    out.push_str("COMMIT;\n");
    out
}

/// The statements (pure: the schema facts in, SQL out).
pub fn statements(schema: &Schema, prefix: &str) -> Vec<String> {
    let name = |r: Role| ident(&r.name(prefix));
    let runtime: Vec<Role> = Role::ALL
        .into_iter()
        .filter(|r| *r != Role::Migrate)
        .collect();
    let list = |roles: &[Role]| {
        roles
            .iter()
            .map(|r| name(*r))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let all = list(&Role::ALL);
    let runtime_list = list(&runtime);
    let (db, ns, owner) = (
        ident(&schema.database),
        ident(&schema.schema),
        name(Role::Migrate),
    );
    let mut out: Vec<String> = Role::ALL
        .iter()
        .map(|r| create_role(&r.name(prefix)))
        .collect();
    out.extend([
        format!("REVOKE CREATE ON SCHEMA {ns} FROM PUBLIC"),
        format!("REVOKE TEMPORARY ON DATABASE {db} FROM PUBLIC"),
        format!("REVOKE ALL ON DATABASE {db} FROM {all}"),
        format!("GRANT CONNECT ON DATABASE {db} TO {all}"),
        format!("REVOKE ALL ON SCHEMA {ns} FROM {runtime_list}"),
        format!("GRANT USAGE ON SCHEMA {ns} TO {runtime_list}"),
        format!("GRANT USAGE, CREATE ON SCHEMA {ns} TO {owner}"),
    ]);
    for table in schema.columns.keys() {
        out.push(format!(
            "ALTER TABLE {} OWNER TO {owner}",
            schema.table(table)
        ));
    }
    for f in &schema.functions {
        out.push(format!("ALTER FUNCTION {f} OWNER TO {owner}"));
    }
    out.extend([
        format!("REVOKE ALL ON ALL TABLES IN SCHEMA {ns} FROM PUBLIC, {runtime_list}"),
        format!("REVOKE ALL ON ALL SEQUENCES IN SCHEMA {ns} FROM PUBLIC, {runtime_list}"),
    ]);
    // The functions a role may call (the narrow doors of `Need::Function`): nobody calls
    // them but the roles granted below. Trigger functions need no EXECUTE to fire.
    let doors: BTreeSet<&String> = super::Process::ALL
        .iter()
        .flat_map(|p| needs(*p))
        .filter_map(|n| match n {
            Need::Function { name, .. } => schema.function(name),
            _ => None,
        })
        .collect();
    for f in doors {
        out.push(format!(
            "REVOKE ALL ON FUNCTION {f} FROM PUBLIC, {runtime_list}"
        ));
    }
    for role in runtime {
        out.extend(grants(schema, role, &name(role)));
    }
    out
}

/// `CREATE ROLE … NOLOGIN` unless it exists; a role that exists with more than a group
/// role should have (LOGIN, SUPERUSER, …) loses it. A concurrent creation is no error.
fn create_role(role: &str) -> String {
    let (q, l) = (ident(role), literal(role));
    format!(
        "DO $roles$\nBEGIN\n    \
         IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {l}) THEN\n        \
         BEGIN\n            CREATE ROLE {q} NOLOGIN;\n        \
         EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;\n        END;\n    \
         ELSIF EXISTS (SELECT FROM pg_roles WHERE rolname = {l} AND (rolcanlogin OR rolsuper OR rolcreatedb \
         OR rolcreaterole OR rolreplication OR rolbypassrls)) THEN\n        \
         ALTER ROLE {q} NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;\n    \
         END IF;\nEND\n$roles$"
    )
}

/// The `GRANT`s of one runtime role.
fn grants(schema: &Schema, role: Role, grantee: &str) -> Vec<String> {
    let mut cover: BTreeMap<(&str, Privilege), Cover> = BTreeMap::new();
    let mut sequences: BTreeSet<&str> = BTreeSet::new();
    let mut functions: BTreeSet<&String> = BTreeSet::new();
    for need in role.processes().iter().flat_map(|p| needs(*p)) {
        match need {
            Need::Table {
                privilege,
                table,
                columns,
            } => {
                let Some(existing) = schema.columns.get(table) else {
                    continue;
                };
                let wanted: Vec<&String> = match columns {
                    Columns::Table => {
                        cover.insert((table, privilege), Cover::Whole);
                        continue;
                    }
                    Columns::Only(cols) => existing
                        .iter()
                        .filter(|c| cols.contains(&c.as_str()))
                        .collect(),
                    Columns::AllBut(cols) => existing
                        .iter()
                        .filter(|c| !cols.contains(&c.as_str()))
                        .collect(),
                };
                match cover
                    .entry((table, privilege))
                    .or_insert_with(|| Cover::Some(BTreeSet::new()))
                {
                    Cover::Whole => {}
                    Cover::Some(set) => set.extend(wanted.into_iter().cloned()),
                }
            }
            Need::Serial { table, column } => {
                if let Some(s) = schema.serials.get(&(table.to_owned(), column.to_owned())) {
                    sequences.insert(s);
                }
            }
            Need::Function { name, .. } => {
                if let Some(f) = schema.function(name) {
                    functions.insert(f);
                }
            }
        }
    }
    let mut out = Vec::new();
    for ((table, privilege), c) in cover {
        let on = schema.table(table);
        let p = privilege.as_sql();
        match c {
            Cover::Whole => out.push(format!("GRANT {p} ON TABLE {on} TO {grantee}")),
            Cover::Some(set) if set.is_empty() => {}
            Cover::Some(set) => {
                // In the table's column order, so the SQL reads like the schema.
                let cols: Vec<String> = schema.columns[table]
                    .iter()
                    .filter(|c| set.contains(*c))
                    .map(|c| ident(c))
                    .collect();
                out.push(format!(
                    "GRANT {p} ({}) ON TABLE {on} TO {grantee}",
                    cols.join(", ")
                ));
            }
        }
    }
    for s in sequences {
        out.push(format!("GRANT USAGE ON SEQUENCE {s} TO {grantee}"));
    }
    for f in functions {
        out.push(format!("GRANT EXECUTE ON FUNCTION {f} TO {grantee}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(with_sealed: bool) -> Schema {
        let mut ops: Vec<String> = [
            "idempotency_key",
            "action_type",
            "payload_hash",
            "payload",
            "status",
            "attempt_count",
        ]
        .map(String::from)
        .to_vec();
        if with_sealed {
            ops.extend(["payload_sealed".into(), "payload_key_id".into()]);
        }
        Schema {
            database: "db".into(),
            schema: "public".into(),
            columns: [
                ("agent_operations".to_owned(), ops),
                (
                    "operation_events".to_owned(),
                    vec!["id".into(), "reason".into()],
                ),
            ]
            .into(),
            serials: [(
                ("operation_events".to_owned(), "id".to_owned()),
                "public.operation_events_id_seq".to_owned(),
            )]
            .into(),
            functions: vec![
                "public.oncely_held_payload(key text)".into(),
                "\"public\".\"oncely_record_updates\"()".into(),
            ],
        }
    }

    #[test]
    fn only_the_desk_may_call_the_held_payload_function() {
        let s = statements(&schema(true), "x_");
        let f = "public.oncely_held_payload(key text)";
        assert!(s.contains(&format!(
            "REVOKE ALL ON FUNCTION {f} FROM PUBLIC, \"x_worker\", \"x_reconciler\", \"x_producer\", \"x_admin\", \"x_desk\""
        )));
        let grants: Vec<&String> = s
            .iter()
            .filter(|s| s.starts_with("GRANT EXECUTE"))
            .collect();
        assert_eq!(
            grants,
            vec![&format!("GRANT EXECUTE ON FUNCTION {f} TO \"x_desk\"")]
        );
        assert!(
            !s.iter()
                .any(|s| s.contains("oncely_record_updates") && s.starts_with("GRANT")),
            "trigger functions are not granted"
        );
    }

    fn producer_select(s: &[String]) -> &String {
        s.iter()
            .find(|s| s.starts_with("GRANT SELECT (") && s.ends_with("TO \"x_producer\""))
            .expect("the producer's column SELECT")
    }

    #[test]
    fn the_producer_reads_every_column_but_the_payloads_sealed_or_not() {
        for sealed in [false, true] {
            let s = statements(&schema(sealed), "x_");
            let select = producer_select(&s);
            assert_eq!(
                select,
                "GRANT SELECT (\"idempotency_key\", \"action_type\", \"payload_hash\", \"status\", \"attempt_count\") \
                 ON TABLE \"public\".\"agent_operations\" TO \"x_producer\""
            );
        }
    }

    #[test]
    fn sealed_columns_are_granted_to_writers_once_they_exist() {
        let before = statements(&schema(false), "x_");
        let after = statements(&schema(true), "x_");
        let insert = |s: &[String]| {
            s.iter()
                .find(|s| s.starts_with("GRANT INSERT (") && s.ends_with("TO \"x_producer\""))
                .cloned()
                .expect("insert")
        };
        assert!(!insert(&before).contains("payload_sealed"));
        assert!(insert(&after).contains("\"payload_sealed\", \"payload_key_id\""));
    }

    #[test]
    fn owner_roles_schema_and_sequences() {
        let s = statements(&schema(false), "x_");
        assert!(s.contains(
            &"ALTER TABLE \"public\".\"agent_operations\" OWNER TO \"x_migrate\"".to_owned()
        ));
        assert!(
            s.contains(
                &"ALTER FUNCTION \"public\".\"oncely_record_updates\"() OWNER TO \"x_migrate\""
                    .to_owned()
            )
        );
        assert!(s.contains(&"REVOKE CREATE ON SCHEMA \"public\" FROM PUBLIC".to_owned()));
        assert!(s.contains(
            &"GRANT USAGE ON SEQUENCE public.operation_events_id_seq TO \"x_worker\"".to_owned()
        ));
        assert!(
            !s.iter()
                .any(|s| s.contains("SEQUENCE") && s.ends_with("\"x_producer\""))
        );
        assert_eq!(s.iter().filter(|s| s.contains("CREATE ROLE")).count(), 6);
        assert!(
            !s.iter()
                .any(|s| s.starts_with("GRANT DELETE") && !s.ends_with("\"x_admin\"")),
            "only the admin deletes"
        );
    }

    #[test]
    fn prefixes_are_plain_names() {
        assert!(valid_prefix("oncely_"));
        assert!(valid_prefix("t_123_"));
        for bad in ["", "1x", "X", "a-b", "a\"b", &"a".repeat(60)] {
            assert!(!valid_prefix(bad), "{bad:?}");
        }
    }
}
