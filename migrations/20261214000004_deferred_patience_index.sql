-- no-transaction
-- The deferred pass gives up an operation once it has been deferred for longer than its
-- action type's `max_defer` — whether or not it is due (core/src/journal/deferred.rs). Its
-- scan reads deferred rows by `deferred_since`, oldest first; this partial index holds only
-- the `deferred` rows, so the scan costs the rows out of patience, not the backlog.
CREATE INDEX CONCURRENTLY agent_operations_deferred_since_idx
    ON agent_operations (deferred_since) WHERE status = 'deferred';
