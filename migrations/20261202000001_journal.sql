-- oncely journal: one row per idempotency key, an append-only event per transition,
-- and human reviews. The status set and the rules that hold in every state live here,
-- in the database, so no code path (or hand-written SQL) can break them.

CREATE TABLE agent_operations (
    idempotency_key       text PRIMARY KEY
                          CONSTRAINT key_format CHECK (idempotency_key ~ '^v1:[0-9a-f]{64}$'),
    action_type           text NOT NULL
                          CONSTRAINT action_type_format CHECK (action_type ~ '^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$' AND length(action_type) <= 64),
    tenant                text,
    workflow_id           text NOT NULL,
    step                  text NOT NULL,
    business_object       text NOT NULL,
    revision              bigint NOT NULL,
    payload_hash          text NOT NULL
                          CONSTRAINT payload_hash_format CHECK (payload_hash ~ '^sha256:[0-9a-f]{64}$'),
    -- The body to (re)send. Needed while the operation may still be driven; cleared at a
    -- terminal state so the journal keeps no personal data longer than it must.
    payload               jsonb,
    status                text NOT NULL
                          CONSTRAINT status_set CHECK (status IN ('planned', 'executing', 'succeeded',
                                                                  'failed_retryable', 'failed_final', 'unknown')),
    -- Attempts so far; also the fencing token a completion must present.
    attempt_count         integer NOT NULL DEFAULT 0 CONSTRAINT attempts_non_negative CHECK (attempt_count >= 0),
    provider_operation_id text,
    result_json           jsonb,
    last_error_code       text,
    -- executing: the lease's end; failed_retryable: not before this time; unknown: next
    -- reconcile check; otherwise NULL.
    lease_until           timestamptz,
    lease_owner           text,
    -- When the first attempt started: a provider's key retention is measured from it.
    first_attempt_at      timestamptz,
    reconcile_checks      integer NOT NULL DEFAULT 0,
    -- Who made the last transition and why: copied into its event by the trigger below.
    last_actor            text NOT NULL,
    last_reason           text NOT NULL,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT planned_iff_no_attempt CHECK ((status = 'planned') = (attempt_count = 0)),
    CONSTRAINT first_attempt_iff_attempted CHECK ((attempt_count = 0) = (first_attempt_at IS NULL)),
    CONSTRAINT executing_has_lease CHECK (status <> 'executing' OR (lease_until IS NOT NULL AND lease_owner IS NOT NULL)),
    CONSTRAINT owner_only_when_executing CHECK (status = 'executing' OR lease_owner IS NULL),
    CONSTRAINT retryable_has_not_before CHECK (status <> 'failed_retryable' OR lease_until IS NOT NULL),
    CONSTRAINT terminal_has_no_lease CHECK (status NOT IN ('succeeded', 'failed_final', 'planned') OR lease_until IS NULL),
    CONSTRAINT succeeded_has_provider_id CHECK (status <> 'succeeded' OR provider_operation_id IS NOT NULL),
    CONSTRAINT payload_iff_live CHECK ((status IN ('succeeded', 'failed_final')) = (payload IS NULL))
);

-- The sweeper's index (the article's): expired leases, due retries, stale unknowns.
CREATE INDEX agent_operations_resume_idx ON agent_operations (status, lease_until);
-- The article's first inspection query: by workflow, in order.
CREATE INDEX agent_operations_workflow_idx ON agent_operations (workflow_id, created_at);

-- Append-only audit trail: one row per transition (and per refused conflict).
CREATE TABLE operation_events (
    id              bigserial PRIMARY KEY,
    idempotency_key text NOT NULL REFERENCES agent_operations (idempotency_key),
    from_status     text,
    to_status       text NOT NULL,
    attempt         integer NOT NULL,
    actor           text NOT NULL,
    reason          text NOT NULL,
    error_code      text,
    provider_operation_id text,
    at              timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX operation_events_key_idx ON operation_events (idempotency_key, id);

CREATE FUNCTION oncely_record_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO operation_events (idempotency_key, from_status, to_status, attempt, actor, reason,
                                      error_code, provider_operation_id)
        VALUES (NEW.idempotency_key, NULL, NEW.status, NEW.attempt_count, NEW.last_actor, NEW.last_reason,
                NEW.last_error_code, NEW.provider_operation_id);
    ELSIF OLD.status IS DISTINCT FROM NEW.status OR OLD.attempt_count IS DISTINCT FROM NEW.attempt_count THEN
        INSERT INTO operation_events (idempotency_key, from_status, to_status, attempt, actor, reason,
                                      error_code, provider_operation_id)
        VALUES (NEW.idempotency_key, OLD.status, NEW.status, NEW.attempt_count, NEW.last_actor, NEW.last_reason,
                NEW.last_error_code, NEW.provider_operation_id);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER agent_operations_events
    AFTER INSERT OR UPDATE ON agent_operations
    FOR EACH ROW EXECUTE FUNCTION oncely_record_transition();

-- Events are never changed; they are deleted only by `purge`, which says so explicitly.
CREATE FUNCTION oncely_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND current_setting('oncely.purge', true) = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'operation_events is append-only (% refused)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END $$;

CREATE TRIGGER operation_events_append_only
    BEFORE UPDATE OR DELETE ON operation_events
    FOR EACH ROW EXECUTE FUNCTION oncely_events_append_only();

-- Human decisions for what reconciliation cannot settle. At most one open per key.
CREATE TABLE operation_reviews (
    id              bigserial PRIMARY KEY,
    idempotency_key text NOT NULL REFERENCES agent_operations (idempotency_key),
    reason          text NOT NULL,
    opened_by       text NOT NULL,
    opened_at       timestamptz NOT NULL DEFAULT now(),
    resolution      text CONSTRAINT resolution_set CHECK (resolution IN ('succeeded', 'failed', 'retry')),
    resolved_by     text,
    resolved_at     timestamptz,
    note            text,
    CONSTRAINT resolved_together CHECK ((resolution IS NULL) = (resolved_at IS NULL)
                                        AND (resolution IS NULL) = (resolved_by IS NULL))
);
CREATE UNIQUE INDEX operation_reviews_one_open ON operation_reviews (idempotency_key) WHERE resolved_at IS NULL;
