-- no-transaction
-- The sweeper's index of live clocks (20261212000000), now with `deferred` (its due time):
-- the republish scan and the claim of due deferred rows read it. Built CONCURRENTLY beside
-- the old one, which the next migration drops.
CREATE INDEX CONCURRENTLY agent_operations_clocks_idx
    ON agent_operations (status, lease_until)
    WHERE status IN ('executing', 'failed_retryable', 'unknown', 'deferred');
