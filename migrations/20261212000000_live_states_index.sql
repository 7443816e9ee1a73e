-- no-transaction
-- The sweeper's index, (status, lease_until), held every operation: each recording added a
-- ('planned', NULL) entry and each settlement a ('succeeded', NULL) one that no query ever
-- reads — the terminal rows are reached by key, and the gauges now count only live states
-- (core/src/journal/sweep.rs). This index holds only the three states whose clocks the
-- sweeper reads: `executing` (lease expiry), `failed_retryable` (not-before time) and
-- `unknown` (next check). `planned` rows have their own index (20261210000000). So a
-- recording and a settlement no longer write an entry here (two of an operation's three),
-- and the index stays the size of the live work, not of the journal's history.
--
-- CONCURRENTLY, one statement alone, for the reasons given in 20261210000000 (an interrupted
-- build leaves an INVALID index: `DROP INDEX CONCURRENTLY agent_operations_live_idx;` and
-- migrate again). The old index is dropped by the next migration, after this one is built,
-- so the sweeper always has one of the two.
CREATE INDEX CONCURRENTLY agent_operations_live_idx
    ON agent_operations (status, lease_until)
    WHERE status IN ('executing', 'failed_retryable', 'unknown');
