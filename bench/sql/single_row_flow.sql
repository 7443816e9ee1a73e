-- One action as three single-row autocommit statements on oncely's schema (record, claim,
-- completion), for pgbench: docs/performance.md, "Where a small statement's cost goes".
-- pgbench -n -M prepared -c 8 -j 2 -T 12 -f bench/sql/single_row_flow.sql <a migrated database>
\set n random(1, 2000000000)
INSERT INTO agent_operations (idempotency_key, action_type, workflow_id, step, business_object, revision, payload_hash, payload, status, last_actor, last_reason) VALUES ('v1:' || md5(:n::text || 'a') || md5(:n::text || 'b'), 'email.send', 'w' || :n, 's', 'o', 1, 'sha256:' || md5(:n::text) || md5(:n::text), '{"to":"a@example.test","subject":"hello there"}', 'planned', 'producer', 'recorded') ON CONFLICT DO NOTHING;
UPDATE agent_operations SET status = 'executing', attempt_count = 1, lease_until = now() + interval '1 minute', lease_owner = 'w1', first_attempt_at = now(), last_actor = 'w1', last_reason = 'claimed', updated_at = now() WHERE idempotency_key = 'v1:' || md5(:n::text || 'a') || md5(:n::text || 'b') AND status = 'planned';
UPDATE agent_operations SET status = 'succeeded', lease_until = NULL, lease_owner = NULL, provider_operation_id = 'p1', payload = NULL, result_json = '{}', last_actor = 'w1', last_reason = 'provider', updated_at = now() WHERE idempotency_key = 'v1:' || md5(:n::text || 'a') || md5(:n::text || 'b') AND status = 'executing';
