-- One chunk of the journal-at-scale fill (oncely-bench --journal-rows): operations
-- $1 .. $2 (1-based, inclusive) of $3 in all, in realistic states, with their events.
-- Run by bench/src/scale.rs inside one transaction per chunk, with the insert-events
-- trigger disabled for the transaction (the events are written here, one per transition).
--
-- The mix, by n mod 10000 (n = the operation's number):
--   < 9700  succeeded        3 events: → planned, planned → executing, executing → succeeded
--   < 9950  failed_final     3 events: → planned, planned → executing, executing → failed_final
--   otherwise                the live states, only among the newest operations (n > $3 - $4):
--                            planned / executing / failed_retryable / unknown in turn; older
--                            ones are succeeded (a live operation does not stay live for months).
-- created_at spreads the operations over the 180 days before now (newest = highest n).
WITH ops AS (
    SELECT n,
           'v1:' || encode(sha256(('oncely-scale:' || n)::bytea), 'hex') AS key,
           (ARRAY['email.send', 'ticket.create', 'payment_order.create'])[1 + n % 3] AS action_type,
           CASE
               WHEN n % 10000 < 9700 THEN 'succeeded'
               WHEN n % 10000 < 9950 THEN 'failed_final'
               WHEN n <= $3 - $4 THEN 'succeeded'
               ELSE (ARRAY['planned', 'executing', 'failed_retryable', 'unknown'])[1 + n % 4]
           END AS status,
           now() - make_interval(secs => 180 * 86400 * ($3 - n)::float8 / $3) AS created_at
    FROM generate_series($1::bigint, $2::bigint) AS n
), inserted AS (
    INSERT INTO agent_operations (
        idempotency_key, action_type, tenant, workflow_id, step, business_object, revision,
        payload_hash, payload, status, attempt_count, provider_operation_id, result_json,
        last_error_code, lease_until, lease_owner, first_attempt_at, reconcile_checks,
        last_actor, last_reason, created_at, updated_at)
    SELECT key, action_type,
           CASE WHEN n % 4 = 0 THEN NULL ELSE 'tenant-' || (n % 50) END,
           'wf-' || (n / 3),
           'step-' || (n % 3),
           'order-' || n,
           1,
           'sha256:' || encode(sha256(('payload:' || n)::bytea), 'hex'),
           CASE WHEN status IN ('succeeded', 'failed_final') THEN NULL
                ELSE jsonb_build_object('to', 'customer-' || n || '@example.com', 'subject', 'Order ' || n) END,
           status,
           CASE WHEN status = 'planned' THEN 0 ELSE 1 END,
           CASE WHEN status = 'succeeded' THEN 'prov-' || n END,
           CASE WHEN status = 'succeeded' THEN jsonb_build_object('id', 'prov-' || n) END,
           CASE status WHEN 'failed_final' THEN 'rejected' WHEN 'failed_retryable' THEN 'http_503'
                       WHEN 'unknown' THEN 'timeout' END,
           CASE status WHEN 'executing' THEN now() + interval '1 hour'
                       WHEN 'failed_retryable' THEN now() + interval '1 hour'
                       WHEN 'unknown' THEN now() + interval '1 hour' END,
           CASE WHEN status = 'executing' THEN 'worker@scale-fill' END,
           CASE WHEN status = 'planned' THEN NULL ELSE created_at + interval '20 milliseconds' END,
           0,
           CASE WHEN status = 'planned' THEN 'producer@scale-fill' ELSE 'worker@scale-fill' END,
           CASE status WHEN 'succeeded' THEN 'provider_succeeded' WHEN 'failed_final' THEN 'provider_rejected'
                       WHEN 'planned' THEN 'recorded' WHEN 'executing' THEN 'claim'
                       WHEN 'failed_retryable' THEN 'provider_retryable' ELSE 'provider_unknown' END,
           created_at,
           created_at + interval '150 milliseconds'
    FROM ops
    RETURNING seq, idempotency_key, status, created_at, provider_operation_id, last_error_code, last_reason
)
INSERT INTO operation_events (op_seq, idempotency_key, from_status, to_status, attempt, actor, reason,
                              error_code, provider_operation_id, at)
SELECT i.seq, e.idempotency_key, e.from_status, e.to_status, e.attempt, e.actor, e.reason,
       e.error_code, e.provider_operation_id, e.at
FROM inserted i, LATERAL (VALUES
    (1, i.idempotency_key, NULL, 'planned', 0, 'producer@scale-fill', 'recorded', NULL::text, NULL::text,
     i.created_at),
    (2, i.idempotency_key, 'planned', 'executing', 1, 'worker@scale-fill', 'claim', NULL, NULL,
     i.created_at + interval '20 milliseconds'),
    (3, i.idempotency_key, 'executing', i.status, 1, 'worker@scale-fill', i.last_reason, i.last_error_code,
     i.provider_operation_id, i.created_at + interval '150 milliseconds')
) AS e(k, idempotency_key, from_status, to_status, attempt, actor, reason, error_code, provider_operation_id, at)
WHERE e.k <= CASE i.status WHEN 'planned' THEN 1 WHEN 'executing' THEN 2 ELSE 3 END;
