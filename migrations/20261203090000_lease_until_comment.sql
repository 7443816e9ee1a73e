-- `lease_until` is "the next time something is due" and means one thing per status.
-- The table of meanings lives in one place, the doc comment of `Operation::lease_until`
-- in core/src/journal/operation.rs; this comment repeats it for whoever reads the schema.
COMMENT ON COLUMN agent_operations.lease_until IS
    'When the next thing is due, by status: executing = end of the worker''s lease (then the sweeper '
    'makes it unknown); failed_retryable = not before this time (then the sweeper republishes it); '
    'unknown = next reconcile check (a reconciler takes it then; pushed by check_lease per check); '
    'planned, succeeded, failed_final = NULL. Documented at Operation::lease_until '
    '(core/src/journal/operation.rs).';
