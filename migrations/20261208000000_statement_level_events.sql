-- Performance (docs/performance.md): the audit trail is written once per statement, not
-- once per row.
--
-- Until now a per-row PL/pgSQL trigger inserted each transition's event with its own
-- INSERT (one executor start-up per row) and the events foreign key checked every event
-- row with its own `SELECT … FOR KEY SHARE` on agent_operations. The journal's statements
-- move whole batches (a record of 1,000 intents, a claim or a completion of 64), so the
-- same rows are now written by two statement-level triggers that read the statement's
-- transition tables: one INSERT … SELECT per statement.
--
-- What an event holds, and when one is written, is unchanged: an inserted operation gets
-- one (from_status NULL); an updated one gets one when its status or its attempt changed;
-- actor, reason, error code and provider id come from the row's last_* columns. Both
-- functions run as their owner (SECURITY DEFINER, search_path pinned), like the function
-- they replace (20261206000000).
--
-- The foreign key from operation_events to agent_operations is dropped. Every event row
-- is written from a row of agent_operations that exists in the same statement (these
-- triggers, and the conflict audit row, which is an INSERT … SELECT from the operation's
-- row); nothing deletes an operation without its events (purge deletes both, events
-- first, in one transaction); operation_events is append-only (its own trigger). The
-- key check bought nothing those rules do not already give, at a row lock per event.

ALTER TABLE operation_events DROP CONSTRAINT operation_events_idempotency_key_fkey;

DROP TRIGGER agent_operations_events ON agent_operations;
DROP FUNCTION oncely_record_transition();

CREATE FUNCTION oncely_record_inserts() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO operation_events (idempotency_key, from_status, to_status, attempt, actor, reason,
                                  error_code, provider_operation_id)
    SELECT n.idempotency_key, NULL, n.status, n.attempt_count, n.last_actor, n.last_reason,
           n.last_error_code, n.provider_operation_id
    FROM inserted n;
    RETURN NULL;
END $$;

CREATE FUNCTION oncely_record_updates() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO operation_events (idempotency_key, from_status, to_status, attempt, actor, reason,
                                  error_code, provider_operation_id)
    SELECT n.idempotency_key, o.status, n.status, n.attempt_count, n.last_actor, n.last_reason,
           n.last_error_code, n.provider_operation_id
    FROM after_update n JOIN before_update o USING (idempotency_key)
    WHERE o.status IS DISTINCT FROM n.status OR o.attempt_count IS DISTINCT FROM n.attempt_count;
    RETURN NULL;
END $$;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION oncely_record_inserts() SECURITY DEFINER SET search_path = %I, pg_temp',
                   current_schema());
    EXECUTE format('ALTER FUNCTION oncely_record_updates() SECURITY DEFINER SET search_path = %I, pg_temp',
                   current_schema());
END $$;

-- An INSERT … ON CONFLICT DO UPDATE (the claim) fires both: its inserted rows are in the
-- first trigger's table, its updated rows in the second's.
CREATE TRIGGER agent_operations_insert_events
    AFTER INSERT ON agent_operations
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION oncely_record_inserts();

CREATE TRIGGER agent_operations_update_events
    AFTER UPDATE ON agent_operations
    REFERENCING OLD TABLE AS before_update NEW TABLE AS after_update
    FOR EACH STATEMENT EXECUTE FUNCTION oncely_record_updates();
