-- no-transaction
-- The sweeper's republish scan takes `planned` operations untouched for a while, oldest
-- `updated_at` first (core/src/journal/sweep.rs). The sweeper's index (status, lease_until)
-- cannot give them in that order, so the scan read and sorted every `planned` row, and on
-- a journal of months, every scan grew with the live rows (docs/performance.md, "The journal
-- at scale"). A partial index holds only the `planned` rows: a few thousand entries on any
-- journal, and a row leaves it when it is claimed.
--
-- CONCURRENTLY (hence no transaction, and one statement alone): on a journal of millions of
-- rows a plain CREATE INDEX would block the fleet's writes for the whole table scan. If the
-- build is interrupted it leaves an INVALID index and this migration is not recorded; the
-- next `oncely-worker migrate` then fails with "already exists" (rather than skipping over a
-- useless index): drop it with `DROP INDEX CONCURRENTLY agent_operations_planned_idx;` and
-- migrate again (docs/operations.md, "Migrations on a big journal").
CREATE INDEX CONCURRENTLY agent_operations_planned_idx
    ON agent_operations (updated_at) WHERE status = 'planned';
