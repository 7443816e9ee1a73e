-- Key rotation and payloads encrypted at rest (docs/security.md).
--
-- 1. One operation per business identity, whatever secret its key was made with. Under
--    one secret the key is a function of the identity, so this index refuses nothing the
--    primary key did not; across a rotation of the key secret it is what makes an intent
--    first recorded under the old secret a duplicate (not a second operation) when it is
--    repeated under the new one. It also serves lookups by workflow, so it replaces the
--    workflow index (no extra index to maintain per insert). `coalesce(tenant, '')`:
--    a tenant is never empty (identity fields are 1..=256 characters), and NULLs would
--    otherwise never collide.
CREATE UNIQUE INDEX agent_operations_identity_idx
    ON agent_operations (workflow_id, step, business_object, revision, action_type, (coalesce(tenant, '')));
DROP INDEX agent_operations_workflow_idx;

-- 2. Sealed payloads: AES-256-GCM of the payload's JSON (12-byte nonce || ciphertext ||
--    tag), the data key's id beside it. `payload` (plain jsonb) is used only by a fleet
--    that runs without data keys; a row holds one or the other, never both.
ALTER TABLE agent_operations
    ADD COLUMN payload_sealed bytea,
    ADD COLUMN payload_key_id text;
ALTER TABLE agent_operations DROP CONSTRAINT payload_iff_live;
ALTER TABLE agent_operations
    ADD CONSTRAINT payload_iff_live
        CHECK ((status IN ('succeeded', 'failed_final')) = (payload IS NULL AND payload_sealed IS NULL)),
    ADD CONSTRAINT payload_plain_or_sealed CHECK (payload IS NULL OR payload_sealed IS NULL),
    ADD CONSTRAINT sealed_has_key_id CHECK ((payload_sealed IS NULL) = (payload_key_id IS NULL));
COMMENT ON COLUMN agent_operations.payload_sealed IS
    'AES-256-GCM sealed payload (nonce || ciphertext || tag), associated data = key id and idempotency key; '
    'opened only by workers and reconcilers holding ONCELY_DATA_KEYS_FILE. NULL when terminal or when the fleet runs without data keys.';
