-- Least privilege (docs/security-roles.md): the transition trigger writes its event row
-- with the rights of the function's owner, not of the role whose statement fired it.
-- So the roles that insert or update operations (producer, gateway, worker, reconciler,
-- admin) need no INSERT on operation_events for the audit trail of their own moves, and
-- the gateway's role — the one facing agents — cannot write the trail at all.
-- `oncely-worker migrate --roles` makes the owner the group role `<prefix>migrate`.
--
-- A SECURITY DEFINER function must not resolve names through the caller's search_path
-- (a caller could put its own `operation_events` first): it is pinned to the schema the
-- journal lives in, with pg_temp last. The function stays a trigger function: it cannot
-- be called directly, only fired by the trigger on agent_operations.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION oncely_record_transition() SECURITY DEFINER SET search_path = %I, pg_temp',
                   current_schema());
END $$;
