-- Reviews only for the unverifiable (docs/reconcile.md, "What reaches a person").
--
-- A review opened for a transient reason (the provider's lookup failing or pending) keeps
-- being looked up by the reconciler in the background; when something settles its
-- operation — a later lookup, the worker's late answer, a statement import — the review
-- closes itself. The classification of reasons lives in oncely_core::review; this
-- migration only stores what it decided (`recheck_at` set or not) and what was seen.

ALTER TABLE operation_reviews
    -- What the decision rests on: the policy, the provider's key retention, the attempts,
    -- every lookup (when, answer). Appended on each re-check (oncely_core::review::Evidence).
    ADD COLUMN evidence   jsonb       NOT NULL DEFAULT '{}'::jsonb,
    -- When the reconciler looks the operation up again; NULL: only a person can settle it.
    ADD COLUMN recheck_at timestamptz,
    -- Background lookups made since the review opened (the backoff grows with them).
    ADD COLUMN rechecks   integer     NOT NULL DEFAULT 0 CONSTRAINT rechecks_non_negative CHECK (rechecks >= 0),
    -- When a reconciler counted the review's closing in its metrics (each closing is
    -- counted once across the fleet, whoever closed it: a person's CLI, a statement
    -- import, a worker's late answer). NULL while open or not yet counted.
    ADD COLUMN counted_at timestamptz;

-- Reviews closed before this migration were never counted; they are not news now.
UPDATE operation_reviews SET counted_at = resolved_at WHERE resolved_at IS NOT NULL;

ALTER TABLE operation_reviews DROP CONSTRAINT resolution_set;
ALTER TABLE operation_reviews
    ADD CONSTRAINT resolution_set
        CHECK (resolution IN ('succeeded', 'failed', 'retry',
                              'auto:lookup', 'auto:late_answer', 'auto:statement')),
    ADD CONSTRAINT closed_reviews_are_not_rechecked CHECK (resolved_at IS NULL OR recheck_at IS NULL),
    ADD CONSTRAINT counted_only_when_closed CHECK (counted_at IS NULL OR resolved_at IS NOT NULL);

-- The reconciler's re-check scan and the metrics' count of closings.
CREATE INDEX operation_reviews_recheck_idx ON operation_reviews (recheck_at)
    WHERE resolved_at IS NULL AND recheck_at IS NOT NULL;
CREATE INDEX operation_reviews_uncounted_idx ON operation_reviews (id)
    WHERE resolved_at IS NOT NULL AND counted_at IS NULL;

-- An operation that leaves `unknown` because the provider's evidence settled it closes
-- its open review in the same statement, with an event: `auto:lookup` (a reconciler's
-- lookup), `auto:late_answer` (the worker's answer for the same attempt, accepted late),
-- `auto:statement` (a statement import). A person's resolution (`review_*` reasons)
-- closes the review itself, in its own transaction. Done here, not in each caller, so no
-- path that settles an operation can leave its review open, and so the worker's role
-- needs no right on reviews at all (SECURITY DEFINER, like the transition triggers).
--
-- Statement-level over the statement's transition tables, like the events triggers of
-- 20261208000000, and named to fire after `agent_operations_update_events` (triggers of
-- one event and timing fire in name order): the move's event comes first, then the
-- review's `review_closed`.
CREATE FUNCTION oncely_close_reviews_on_settle() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    WITH settled AS (
        SELECT n.idempotency_key, n.status, n.attempt_count, n.last_actor, n.provider_operation_id,
               CASE
                   WHEN n.last_reason = 'late_answer' THEN 'auto:late_answer'
                   WHEN n.last_reason IN ('reconcile_found_succeeded', 'reconcile_found_rejected') THEN 'auto:lookup'
                   WHEN n.last_reason IN ('statement_succeeded', 'statement_failed') THEN 'auto:statement'
               END AS how
          FROM after_update n JOIN before_update o USING (idempotency_key)
         WHERE o.status = 'unknown' AND n.status <> 'unknown'),
    closed AS (
        UPDATE operation_reviews r
           SET resolution = s.how, resolved_by = s.last_actor, resolved_at = now(), recheck_at = NULL,
               note = CASE s.how WHEN 'auto:lookup' THEN 'settled by the provider''s lookup'
                                 WHEN 'auto:late_answer' THEN 'settled by the provider''s late answer'
                                 ELSE 'settled by the provider''s statement' END
          FROM settled s
         WHERE r.idempotency_key = s.idempotency_key AND r.resolved_at IS NULL AND s.how IS NOT NULL
        RETURNING r.idempotency_key)
    INSERT INTO operation_events (idempotency_key, from_status, to_status, attempt, actor, reason,
                                  error_code, provider_operation_id)
    SELECT s.idempotency_key, s.status, s.status, s.attempt_count, s.last_actor,
           'review_closed', s.how, s.provider_operation_id
      FROM closed c JOIN settled s USING (idempotency_key);
    RETURN NULL;
END $$;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION oncely_close_reviews_on_settle() SECURITY DEFINER SET search_path = %I, pg_temp',
                   current_schema());
END $$;

CREATE TRIGGER agent_operations_update_reviews
    AFTER UPDATE ON agent_operations
    REFERENCING OLD TABLE AS before_update NEW TABLE AS after_update
    FOR EACH STATEMENT EXECUTE FUNCTION oncely_close_reviews_on_settle();
