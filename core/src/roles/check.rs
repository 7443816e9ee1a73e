//! The start-up checks: does the connected role hold what this process needs
//! ([`check_grants`]), and may it apply migrations ([`check_can_migrate`])?
//!
//! Without the first, a process with a missing grant starts, consumes a message, and
//! fails its first claim with `permission denied for column …` — redelivered, retried,
//! logged over and over — instead of refusing to start with one sentence that says what
//! to grant. One query per start (not per request), built from the same needs table
//! the grants are written from. A superuser or the tables' owner passes (Postgres'
//! `has_*_privilege` functions say yes to them), so single-role set-ups work as before.
//! Tables that do not exist yet are skipped here: the schema version check that follows
//! says "run migrate", which is the better advice then.

use super::grants::{Columns, Need, needs};
use super::{DEFAULT_PREFIX, Process};
use crate::db::{DbError, describe};
use sqlx::PgPool;
use std::fmt;

/// One privilege (on some columns, or a whole table or sequence) the role lacks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Missing {
    /// `SELECT`, `INSERT`, `UPDATE`, `DELETE`, `USAGE`, `EXECUTE`.
    pub privilege: String,
    /// `agent_operations`, or `sequence of operation_events.id`.
    pub object: String,
    /// The missing columns, when only some of the needed ones are missing (empty: the
    /// privilege is missing altogether).
    pub columns: Vec<String>,
}

impl fmt::Display for Missing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 6;
        write!(f, "{}", self.privilege)?;
        if !self.columns.is_empty() {
            let shown: Vec<&str> = self
                .columns
                .iter()
                .take(SHOWN)
                .map(String::as_str)
                .collect();
            write!(f, " ({}", shown.join(", "))?;
            if self.columns.len() > SHOWN {
                write!(f, ", and {} more", self.columns.len() - SHOWN)?;
            }
            write!(f, ")")?;
        }
        write!(f, " on {}", self.object)
    }
}

/// The connected role lacks privileges its process needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingGrants {
    /// The role (`current_user`).
    pub role: String,
    /// The process kind that needs them.
    pub process: Process,
    /// What is missing.
    pub missing: Vec<Missing>,
}

impl fmt::Display for MissingGrants {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what: Vec<String> = self.missing.iter().map(ToString::to_string).collect();
        let group = self.process.role().suffix();
        write!(
            f,
            "role {:?} lacks {} (needed by the {}); run \"oncely-worker migrate --roles\" and grant \
             {DEFAULT_PREFIX}{group} (or <role prefix>{group}) to {}",
            self.role,
            what.join(", "),
            self.process.name(),
            self.role
        )
    }
}

impl std::error::Error for MissingGrants {}

/// The connected role may not apply migrations.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "role {role:?} cannot apply migrations: {why}. Migrations are applied by the owner of the schema \
     objects: a superuser, or a login that is a member of {DEFAULT_PREFIX}migrate (created by \
     \"oncely-worker migrate --roles\"); runtime roles never change the schema"
)]
pub struct MigrateRefused {
    /// The role (`current_user`).
    pub role: String,
    /// What it lacks.
    pub why: String,
}

/// Fail with [`DbError::Grants`] unless the connected role holds everything `process`
/// needs (on the tables that exist).
pub async fn check_grants<'c>(
    pool: impl sqlx::PgExecutor<'c>,
    process: Process,
    url_for_messages: &str,
) -> Result<(), DbError> {
    let mut kinds: Vec<&str> = Vec::new();
    let mut tables: Vec<&str> = Vec::new();
    let mut cols: Vec<String> = Vec::new();
    let mut privileges: Vec<&str> = Vec::new();
    for need in needs(process) {
        let (kind, table, c, p) = match need {
            Need::Table {
                privilege,
                table,
                columns,
            } => {
                let (kind, c) = match columns {
                    Columns::Table => ("table", String::new()),
                    Columns::Only(c) => ("only", c.join(",")),
                    Columns::AllBut(c) => ("all_but", c.join(",")),
                };
                (kind, table, c, privilege.as_sql())
            }
            Need::Serial { table, column } => ("serial", table, column.to_owned(), "USAGE"),
            Need::Function { name, args } => ("function", name, args.to_owned(), "EXECUTE"),
        };
        kinds.push(kind);
        tables.push(table);
        cols.push(c);
        privileges.push(p);
    }
    // One row per needed (table, column, privilege), with whether the role has it. The
    // privilege functions run only on rows whose table (and column) exist: they raise
    // on a missing one.
    let rows: Vec<(String, String, Option<String>, String, bool, i32)> = sqlx::query_as(
        "WITH need AS ( \
             SELECT row_number() OVER () AS i, n.* \
             FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS n(kind, tbl, cols, priv)), \
         expanded AS ( \
             SELECT n.i, n.tbl, a.attname::text AS col, n.priv FROM need n \
             JOIN pg_attribute a ON a.attrelid = to_regclass(n.tbl) AND a.attnum > 0 AND NOT a.attisdropped \
             WHERE (n.kind = 'only' AND a.attname::text = ANY (string_to_array(n.cols, ','))) \
                OR (n.kind = 'all_but' AND NOT a.attname::text = ANY (string_to_array(n.cols, ',')))) \
         SELECT current_user::text, tbl, col, priv, has_column_privilege(tbl, col, priv), i::int4 FROM expanded \
         UNION ALL \
         SELECT current_user::text, tbl, NULL, priv, has_table_privilege(tbl, priv), i::int4 FROM need \
         WHERE kind = 'table' AND to_regclass(tbl) IS NOT NULL \
         UNION ALL \
         SELECT current_user::text, 'sequence of ' || tbl || '.' || cols, NULL, 'USAGE', \
                coalesce(has_sequence_privilege(pg_get_serial_sequence(tbl, cols), 'USAGE'), true), i::int4 \
         FROM need WHERE kind = 'serial' AND to_regclass(tbl) IS NOT NULL \
         UNION ALL \
         SELECT current_user::text, 'function ' || tbl || '(' || cols || ')', NULL, 'EXECUTE', \
                has_function_privilege(to_regprocedure(tbl || '(' || cols || ')')::oid, 'EXECUTE'), i::int4 \
         FROM need WHERE kind = 'function' AND to_regprocedure(tbl || '(' || cols || ')') IS NOT NULL \
         ORDER BY 6",
    )
    .bind(&kinds)
    .bind(&tables)
    .bind(&cols)
    .bind(&privileges)
    .fetch_all(pool)
    .await
    .map_err(|source| DbError::Connect {
        target: describe(url_for_messages),
        source,
    })?;
    let Some(role) = rows.first().map(|r| r.0.clone()) else {
        return Ok(());
    };
    // Group by need (its index `i`): all of its columns missing reads "INSERT on t".
    let mut missing: Vec<Missing> = Vec::new();
    let mut i = 0;
    while i < rows.len() {
        let need = rows[i].5;
        let group: Vec<_> = rows[i..].iter().take_while(|r| r.5 == need).collect();
        i += group.len();
        let lacking: Vec<String> = group
            .iter()
            .filter(|r| !r.4)
            .filter_map(|r| r.2.clone())
            .collect();
        let whole = group.iter().any(|r| r.2.is_none() && !r.4);
        if whole || !lacking.is_empty() {
            let all = lacking.len() == group.len();
            missing.push(Missing {
                privilege: group[0].3.clone(),
                object: group[0].1.clone(),
                columns: if all { Vec::new() } else { lacking },
            });
        }
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(DbError::Grants(MissingGrants {
            role,
            process,
            missing,
        }))
    }
}

/// Fail with [`DbError::CannotMigrate`] unless the connected role can create objects in
/// the schema and owns (directly or through membership) every table already there.
pub async fn check_can_migrate(pool: &PgPool, url_for_messages: &str) -> Result<(), DbError> {
    let (role, schema, create, not_owned): (String, Option<String>, bool, String) =
        sqlx::query_as(
            "SELECT current_user::text, current_schema()::text, \
                    coalesce(has_schema_privilege(current_schema(), 'CREATE'), false), \
                    coalesce((SELECT string_agg(c.relname::text, ', ' ORDER BY c.relname) FROM pg_class c \
                              WHERE c.relnamespace = to_regnamespace(current_schema()) \
                                AND c.relkind IN ('r', 'p') AND NOT pg_has_role(c.relowner, 'USAGE')), '')",
        )
        .fetch_one(pool)
        .await
        .map_err(|source| DbError::Connect {
            target: describe(url_for_messages),
            source,
        })?;
    let mut why = Vec::new();
    match &schema {
        None => why.push("no schema on its search_path exists".to_owned()),
        Some(s) if !create => why.push(format!("it lacks CREATE on schema {s}")),
        Some(_) => {}
    }
    if !not_owned.is_empty() {
        why.push(format!("it does not own {not_owned}"));
    }
    if why.is_empty() {
        Ok(())
    } else {
        Err(DbError::CannotMigrate(MigrateRefused {
            role,
            why: why.join(" and "),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_the_grant_the_process_and_what_to_run() {
        let m = MissingGrants {
            role: "alice".into(),
            process: Process::Worker,
            missing: vec![Missing {
                privilege: "INSERT".into(),
                object: "agent_operations".into(),
                columns: vec![],
            }],
        };
        assert_eq!(
            m.to_string(),
            "role \"alice\" lacks INSERT on agent_operations (needed by the worker); run \
             \"oncely-worker migrate --roles\" and grant oncely_worker (or <role prefix>worker) to alice"
        );
        let some = Missing {
            privilege: "SELECT".into(),
            object: "agent_operations".into(),
            columns: (0..8).map(|i| format!("c{i}")).collect(),
        };
        assert_eq!(
            some.to_string(),
            "SELECT (c0, c1, c2, c3, c4, c5, and 2 more) on agent_operations"
        );
        let gateway = MissingGrants {
            process: Process::Gateway,
            ..m
        };
        assert!(gateway.to_string().contains("grant oncely_producer"));
    }
}
