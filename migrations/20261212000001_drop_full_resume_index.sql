-- no-transaction
-- The index over every operation's (status, lease_until), replaced by
-- agent_operations_live_idx (20261212000000). CONCURRENTLY: no lock that would stop the
-- fleet's writes while it goes.
DROP INDEX CONCURRENTLY IF EXISTS agent_operations_resume_idx;
