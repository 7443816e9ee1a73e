-- no-transaction
-- Replaced by agent_operations_clocks_idx (20261214000002).
DROP INDEX CONCURRENTLY IF EXISTS agent_operations_live_idx;
