-- Control before the send (docs/approvals.md): a person deciding on a held action must
-- see what it would send, yet the review desk's role reads no payload column (a desk
-- compromised through its web pages must not be a way to read every payload in the
-- journal). This function is the one narrow door: it returns an operation's payload
-- (plain, or sealed with its key id) only while the operation is `awaiting_approval`,
-- i.e. only the payloads someone is being asked to approve right now. Once decided,
-- cancelled or expired the payload columns are NULL anyway.
--
-- It runs with its owner's rights (`oncely-worker migrate --roles` makes the owner the
-- group role `<prefix>migrate`, like every oncely_* function) and is callable by nobody
-- but the roles granted EXECUTE: `migrate --roles` grants it to `<prefix>desk` only
-- (core/src/roles/grants.rs, Need::Function). The desk still checks the reviewer's
-- tenants and the `approve` right before it calls it, and never logs what it returns.
--
-- A SECURITY DEFINER function must not resolve names through the caller's search_path:
-- it is pinned to the schema the journal lives in, with pg_temp last.
CREATE FUNCTION oncely_held_payload(key text)
RETURNS TABLE (payload jsonb, payload_sealed bytea, payload_key_id text)
LANGUAGE sql STABLE SECURITY DEFINER AS $$
    SELECT o.payload, o.payload_sealed, o.payload_key_id
    FROM agent_operations o
    WHERE o.idempotency_key = key AND o.status = 'awaiting_approval'
$$;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION oncely_held_payload(text) SET search_path = %I, pg_temp',
                   current_schema());
END $$;

REVOKE ALL ON FUNCTION oncely_held_payload(text) FROM PUBLIC;

COMMENT ON FUNCTION oncely_held_payload(text) IS
    'The payload of a held (awaiting_approval) operation, for the review desk''s approvers; nothing for any other status. EXECUTE: <prefix>desk only (migrate --roles).';
