//! Postgres through a transaction-pooling connection pooler (pgbouncer
//! `pool_mode = transaction`), or directly: [`Db`], the executor every process's
//! statements go through.
//!
//! What breaks behind a transaction pooler, and why this module exists: sqlx runs every
//! statement with the extended protocol in **two round trips** — `Parse` (+ `Describe`)
//! and `Sync`, then `Bind` + `Execute` and `Sync` — and by default under a **named**
//! prepared statement (`sqlx_s_N`) that it caches per connection. A transaction pooler
//! hands a client's next transaction to whichever server connection is free, and outside
//! an explicit transaction every `Sync` ends one. So behind pgbouncer (1.18, Debian 12's,
//! has no prepared-statement support):
//! - a cached statement is looked for on another server: `prepared statement "sqlx_s_3"
//!   does not exist` (26000);
//! - two clients that share a server create the same name: `prepared statement "sqlx_s_1"
//!   already exists` (42P05) — statements are never closed when the cache is off;
//! - worst, an *unnamed* statement's `Bind` can reach another server, whose unnamed
//!   statement is another client's.
//!
//! [`Db`] in pooler mode therefore runs each statement in an explicit transaction of its
//! own (`BEGIN`, the statement, `COMMIT`: the pooler keeps one server for all of it) as an
//! unnamed statement (nothing outlives the transaction), with the connection's statement
//! cache off ([`crate::db::PoolSettings::pooler`]). Statements that are already in an
//! explicit transaction (`Journal::resolve_review`, `purge`, `settle_reviewed`) are written
//! unnamed (`.persistent(false)`) in every mode. Nothing oncely runs there keeps session state:
//! its one setting is `SET LOCAL` (transaction-scoped), it takes no advisory locks and
//! uses no `LISTEN` — but `oncely-worker migrate` does (sqlx's migration lock is a
//! session advisory lock), so migrations go to Postgres directly (docs/scaling.md).
//! Directly (the default), [`Db`] is the pool itself: no extra statement, cached named
//! statements, each connection started with `SET plan_cache_mode = force_custom_plan`
//! (`crate::db`: a generic plan made while the journal was young scans the table).

use futures_util::future::BoxFuture;
use futures_util::stream::{self, BoxStream};
use futures_util::{StreamExt, TryStreamExt};
use sqlx::postgres::{PgQueryResult, PgRow, PgStatement, PgTypeInfo};
use sqlx::{Either, Error, Execute, Executor, PgPool, Postgres, SqlStr};

/// The pool, and whether it reaches Postgres through a transaction pooler.
#[derive(Debug, Clone)]
pub struct Db {
    pool: PgPool,
    through_pooler: bool,
}

impl Db {
    /// Postgres directly.
    pub fn direct(pool: PgPool) -> Self {
        Self {
            pool,
            through_pooler: false,
        }
    }

    /// Through a transaction pooler when `through_pooler` (see the module docs).
    pub fn new(pool: PgPool, through_pooler: bool) -> Self {
        Self {
            pool,
            through_pooler,
        }
    }

    /// The pool (for explicit transactions: write their statements `.persistent(false)`).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Whether statements go through a transaction pooler.
    pub fn through_pooler(&self) -> bool {
        self.through_pooler
    }
}

/// A statement run unnamed (see the module docs).
struct Unnamed<E>(E);

impl<'q, E: Execute<'q, Postgres>> Execute<'q, Postgres> for Unnamed<E> {
    fn sql(self) -> SqlStr {
        self.0.sql()
    }

    fn statement(&self) -> Option<&PgStatement> {
        self.0.statement()
    }

    fn take_arguments(
        &mut self,
    ) -> Result<Option<sqlx::postgres::PgArguments>, sqlx::error::BoxDynError> {
        self.0.take_arguments()
    }

    fn persistent(&self) -> bool {
        false
    }
}

impl<'p> Executor<'p> for &'_ Db {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, Result<Either<PgQueryResult, PgRow>, Error>>
    where
        'p: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if !self.through_pooler {
            return (&self.pool).fetch_many(query);
        }
        let pool = self.pool.clone();
        stream::once(async move {
            let mut tx = pool.begin().await?;
            let items: Vec<_> = (&mut *tx).fetch_many(Unnamed(query)).try_collect().await?;
            tx.commit().await?;
            Ok::<_, Error>(stream::iter(items.into_iter().map(Ok)))
        })
        .try_flatten()
        .boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(self, query: E) -> BoxFuture<'e, Result<Option<PgRow>, Error>>
    where
        'p: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if !self.through_pooler {
            return (&self.pool).fetch_optional(query);
        }
        let pool = self.pool.clone();
        Box::pin(async move {
            let mut tx = pool.begin().await?;
            let row = (&mut *tx).fetch_optional(Unnamed(query)).await?;
            tx.commit().await?;
            Ok(row)
        })
    }

    fn prepare_with<'e>(
        self,
        sql: SqlStr,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement, Error>>
    where
        'p: 'e,
    {
        (&self.pool).prepare_with(sql, parameters)
    }

    // sqlx's `offline` feature is on in this workspace (through `macros`).
    fn describe<'e>(self, sql: SqlStr) -> BoxFuture<'e, Result<sqlx::Describe<Postgres>, Error>>
    where
        'p: 'e,
    {
        (&self.pool).describe(sql)
    }
}
