-- The journal at scale (docs/performance.md, "The journal at scale"): the audit trail is
-- indexed by an operation sequence number, not by the idempotency key.
--
-- An idempotency key is an HMAC: uniformly random. The events' index on
-- (idempotency_key, id) was the largest index of the journal (15.8 GB at 50 million
-- operations, 150 million events) and every event went to a random leaf of it, so once the
-- journal outgrew RAM nearly every recording, claim and completion waited for a leaf to be
-- read from disk. An operation now gets a number when it is recorded (`seq`, from an
-- identity sequence: increasing in recording order), its events carry it (`op_seq`), and the
-- events are indexed by (op_seq, id): a new operation's events go to the right edge of that
-- index, and an operation's later events land next to its first ones, a few seconds later,
-- among the pages that are hot anyway. The events keep `idempotency_key` (what people and
-- queries look them up by; the operation's primary key turns a key into its `seq`).
--
-- What an event holds and when one is written is unchanged; the three trigger functions
-- that write events (20261208000000, 20261209000000) now also write `op_seq`, and so do the
-- two audit rows written directly (a refused conflict, an opened review).
--
-- On an existing journal this migration rewrites both tables (the new identity column
-- numbers the existing operations; every existing event gets its operation's number) and
-- holds them locked while it does: stop the fleet, migrate, start the new binaries
-- (docs/operations.md, "Migrations on a big journal", with the time it took here).

ALTER TABLE agent_operations ADD COLUMN seq bigint GENERATED ALWAYS AS IDENTITY;

-- The old index goes first, so the backfill below does not maintain it for every event.
DROP INDEX operation_events_key_idx;
ALTER TABLE operation_events ADD COLUMN op_seq bigint;
ALTER TABLE operation_events DISABLE TRIGGER operation_events_append_only;
UPDATE operation_events e SET op_seq = o.seq FROM agent_operations o
 WHERE o.idempotency_key = e.idempotency_key;
ALTER TABLE operation_events ENABLE TRIGGER operation_events_append_only;
-- An event whose operation is gone cannot exist (purge deletes events first, in the same
-- transaction); if one did, this refuses the migration rather than keep an orphan unfindable.
ALTER TABLE operation_events ALTER COLUMN op_seq SET NOT NULL;

CREATE INDEX operation_events_op_seq_idx ON operation_events (op_seq, id);

CREATE OR REPLACE FUNCTION oncely_record_inserts() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO operation_events (op_seq, idempotency_key, from_status, to_status, attempt, actor, reason,
                                  error_code, provider_operation_id)
    SELECT n.seq, n.idempotency_key, NULL, n.status, n.attempt_count, n.last_actor, n.last_reason,
           n.last_error_code, n.provider_operation_id
    FROM inserted n;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION oncely_record_updates() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO operation_events (op_seq, idempotency_key, from_status, to_status, attempt, actor, reason,
                                  error_code, provider_operation_id)
    SELECT n.seq, n.idempotency_key, o.status, n.status, n.attempt_count, n.last_actor, n.last_reason,
           n.last_error_code, n.provider_operation_id
    FROM after_update n JOIN before_update o USING (idempotency_key)
    WHERE o.status IS DISTINCT FROM n.status OR o.attempt_count IS DISTINCT FROM n.attempt_count;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION oncely_close_reviews_on_settle() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    WITH settled AS (
        SELECT n.seq, n.idempotency_key, n.status, n.attempt_count, n.last_actor, n.provider_operation_id,
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
    INSERT INTO operation_events (op_seq, idempotency_key, from_status, to_status, attempt, actor, reason,
                                  error_code, provider_operation_id)
    SELECT s.seq, s.idempotency_key, s.status, s.status, s.attempt_count, s.last_actor,
           'review_closed', s.how, s.provider_operation_id
      FROM closed c JOIN settled s USING (idempotency_key);
    RETURN NULL;
END $$;

-- CREATE OR REPLACE resets a function's attributes: run them as their owner again, with
-- the search path pinned (as 20261206000000 set first).
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION oncely_record_inserts() SECURITY DEFINER SET search_path = %I, pg_temp',
                   current_schema());
    EXECUTE format('ALTER FUNCTION oncely_record_updates() SECURITY DEFINER SET search_path = %I, pg_temp',
                   current_schema());
    EXECUTE format('ALTER FUNCTION oncely_close_reviews_on_settle() SECURITY DEFINER SET search_path = %I, pg_temp',
                   current_schema());
END $$;
