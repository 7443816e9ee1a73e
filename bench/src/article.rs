//! The article's journal flow, kept as a yardstick: three autocommit statements per
//! action (record `planned`, claim, complete), one action at a time, on oncely's real
//! schema (its CHECK constraints and events trigger included). The workers never use it;
//! `oncely-bench` runs it to measure what the article's design costs on this schema next
//! to oncely's batched statements. It lived in core's journal (the only module with SQL)
//! until issue 43: shipped code carries no bench-only DDL, so it is here, on the
//! journal's pool.
//!
//! The schema's constraints add what the article's statements leave out: the claim sets
//! the lease owner, the first attempt time, the actor and reason; the completion clears
//! the owner and the payload.
//!
//! [`ArticleTable::Plain`] runs the same flow on the article's own table, verbatim
//! (`article_operations`: its columns, its one CHECK and its `(status, lease_until)`
//! index; no events, no payload): what the three statements cost without oncely's
//! schema around them.

use oncely_core::journal::{Journal, JournalError};

const INSERT: &str = "INSERT INTO agent_operations (idempotency_key, action_type, workflow_id, step, \
     business_object, revision, payload_hash, payload, status, last_actor, last_reason) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb, 'planned', $9, 'recorded') \
     ON CONFLICT (idempotency_key) DO NOTHING";

const CLAIM: &str = "UPDATE agent_operations SET status = 'executing', \
     attempt_count = attempt_count + 1, lease_until = now() + interval '2 minutes', \
     lease_owner = $2, first_attempt_at = coalesce(first_attempt_at, now()), \
     last_actor = $2, last_reason = 'claim', updated_at = now() \
     WHERE idempotency_key = $1 AND status IN ('planned', 'failed_retryable') \
       AND (lease_until IS NULL OR lease_until < now()) \
     RETURNING attempt_count";

const COMPLETE: &str = "UPDATE agent_operations SET status = 'succeeded', \
     provider_operation_id = $2, result_json = $3::jsonb, lease_until = NULL, \
     lease_owner = NULL, payload = NULL, last_actor = $4, \
     last_reason = 'provider_succeeded', updated_at = now() \
     WHERE idempotency_key = $1 AND status = 'executing'";

const PLAIN_TABLE: &str = "CREATE TABLE IF NOT EXISTS article_operations ( \
     idempotency_key text PRIMARY KEY, action_type text NOT NULL, workflow_id text NOT NULL, \
     payload_hash text NOT NULL, status text NOT NULL CHECK (status IN ('planned', 'executing', \
     'succeeded', 'failed_retryable', 'failed_final', 'unknown')), \
     attempt_count integer NOT NULL DEFAULT 0, provider_operation_id text, result_json jsonb, \
     last_error_code text, lease_until timestamptz, created_at timestamptz NOT NULL DEFAULT now(), \
     updated_at timestamptz NOT NULL DEFAULT now())";

const PLAIN_INDEX: &str = "CREATE INDEX IF NOT EXISTS article_operations_resume_idx \
     ON article_operations (status, lease_until)";

const PLAIN_INSERT: &str = "INSERT INTO article_operations (idempotency_key, action_type, workflow_id, \
     payload_hash, status) VALUES ($1, $2, $3, $4, 'planned') ON CONFLICT (idempotency_key) DO NOTHING";

const PLAIN_CLAIM: &str = "UPDATE article_operations SET status = 'executing', \
     attempt_count = attempt_count + 1, lease_until = now() + interval '2 minutes', updated_at = now() \
     WHERE idempotency_key = $1 AND status IN ('planned', 'failed_retryable') \
       AND (lease_until IS NULL OR lease_until < now()) \
     RETURNING attempt_count";

const PLAIN_COMPLETE: &str = "UPDATE article_operations SET status = 'succeeded', \
     provider_operation_id = $2, result_json = $3::jsonb, lease_until = NULL, updated_at = now() \
     WHERE idempotency_key = $1 AND status = 'executing'";

/// Which table the article's flow runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArticleTable {
    /// oncely's `agent_operations` (constraints, identity index, events trigger).
    Oncely,
    /// The article's `article_operations`, created by [`Journal::create_article_table`].
    Plain,
}

/// One action of the article's flow, its values prepared as text.
#[derive(Debug, Clone)]
pub struct ArticleAction {
    /// The idempotency key.
    pub key: String,
    /// The action type.
    pub action_type: String,
    /// The workflow id.
    pub workflow: String,
    /// The step.
    pub step: String,
    /// The business object.
    pub object: String,
    /// The revision.
    pub revision: i64,
    /// The payload hash (`sha256:…`).
    pub hash: String,
    /// The payload as JSON text.
    pub payload: String,
    /// The provider's id saved on completion.
    pub provider_id: String,
    /// The provider's answer saved on completion, as JSON text.
    pub result: String,
}

/// Where the article's flow found the journal in an unexpected state.
#[derive(Debug)]
pub enum ArticleFlowError {
    /// The claim matched no row (someone else holds it, or it is not claimable).
    NotClaimed(String),
    /// The completion's compare-and-set matched no row.
    NotCompleted(String),
    /// The database failed.
    Journal(JournalError),
}

impl std::fmt::Display for ArticleFlowError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotClaimed(k) => write!(f, "the claim of {k} found nothing"),
            Self::NotCompleted(k) => write!(f, "the completion of {k} changed nothing"),
            Self::Journal(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for ArticleFlowError {}

impl From<JournalError> for ArticleFlowError {
    fn from(e: JournalError) -> Self {
        Self::Journal(e)
    }
}

/// The article's flow on the journal's pool.
#[allow(async_fn_in_trait)]
pub trait ArticleJournal {
    /// Create the article's plain table (and its index) if missing.
    async fn create_article_table(&self) -> Result<(), JournalError>;
    /// Run one action through the article's three statements, each its own transaction,
    /// on `table`.
    async fn article_action(
        &self,
        a: &ArticleAction,
        actor: &str,
        table: ArticleTable,
    ) -> Result<(), ArticleFlowError>;
    /// Operations of the plain table in `succeeded`.
    async fn article_succeeded(&self) -> Result<i64, JournalError>;
}

impl ArticleJournal for Journal {
    async fn create_article_table(&self) -> Result<(), JournalError> {
        sqlx::query(PLAIN_TABLE).execute(self.pool()).await?;
        sqlx::query(PLAIN_INDEX).execute(self.pool()).await?;
        Ok(())
    }

    async fn article_action(
        &self,
        a: &ArticleAction,
        actor: &str,
        table: ArticleTable,
    ) -> Result<(), ArticleFlowError> {
        let inserted = match table {
            ArticleTable::Oncely => sqlx::query(INSERT)
                .bind(&a.key)
                .bind(&a.action_type)
                .bind(&a.workflow)
                .bind(&a.step)
                .bind(&a.object)
                .bind(a.revision)
                .bind(&a.hash)
                .bind(&a.payload)
                .bind(actor),
            ArticleTable::Plain => sqlx::query(PLAIN_INSERT)
                .bind(&a.key)
                .bind(&a.action_type)
                .bind(&a.workflow)
                .bind(&a.hash),
        };
        inserted
            .execute(self.pool())
            .await
            .map_err(JournalError::from)?;
        let claim = match table {
            ArticleTable::Oncely => sqlx::query_scalar(CLAIM).bind(&a.key).bind(actor),
            ArticleTable::Plain => sqlx::query_scalar(PLAIN_CLAIM).bind(&a.key),
        };
        let claimed: Option<i32> = claim
            .fetch_optional(self.pool())
            .await
            .map_err(JournalError::from)?;
        if claimed.is_none() {
            return Err(ArticleFlowError::NotClaimed(a.key.clone()));
        }
        let complete = match table {
            ArticleTable::Oncely => sqlx::query(COMPLETE)
                .bind(&a.key)
                .bind(&a.provider_id)
                .bind(&a.result)
                .bind(actor),
            ArticleTable::Plain => sqlx::query(PLAIN_COMPLETE)
                .bind(&a.key)
                .bind(&a.provider_id)
                .bind(&a.result),
        };
        let done = complete
            .execute(self.pool())
            .await
            .map_err(JournalError::from)?;
        if done.rows_affected() != 1 {
            return Err(ArticleFlowError::NotCompleted(a.key.clone()));
        }
        Ok(())
    }

    async fn article_succeeded(&self) -> Result<i64, JournalError> {
        Ok(
            sqlx::query_scalar(
                "SELECT count(*) FROM article_operations WHERE status = 'succeeded'",
            )
            .fetch_one(self.pool())
            .await?,
        )
    }
}
