-- Control before the send (docs/approvals.md): approval gates, cancel, schedule, expiry.
--
-- New statuses:
--   awaiting_approval  held by an approval rule: nothing is published to workers until a
--                      person (or two) approves; live (keeps its payload), no attempt.
--   rejected           a person rejected it, or nobody decided before its deadline. Terminal.
--   cancelled          the caller (or an operator) cancelled it before any attempt could
--                      send it. Terminal.
--   expired            not started before its `expires_at`. Terminal.
-- None of the three new terminal states was ever sent: they keep no payload and no lease.
-- A scheduled action (`not_before`) is recorded `deferred`, due at its time (reason
-- `scheduled`); it needs no status of its own.
--
-- The checks are added NOT VALID (no scan under ACCESS EXCLUSIVE: every existing row passes
-- them) and validated by the next migration without blocking writes.
ALTER TABLE agent_operations
    DROP CONSTRAINT status_set,
    ADD CONSTRAINT status_set CHECK (status IN ('planned', 'executing', 'succeeded', 'failed_retryable',
                                              'failed_final', 'unknown', 'deferred', 'awaiting_approval',
                                              'rejected', 'cancelled', 'expired')) NOT VALID,
    -- The caller's deadline (the intent's `expires_at`, or `created_at + max_age` of its
    -- action type, the earlier): not started by then → `expired`, never sent.
    ADD COLUMN expires_at timestamptz,
    -- The caller's `not_before`: a scheduled operation is recorded `deferred`, due then
    -- (kept here too, so an approval that comes earlier still waits for it).
    ADD COLUMN not_before timestamptz,
    -- The approval rule that held it (NULL: not held), how many different people must
    -- approve, until when, and when the last needed approval came.
    ADD COLUMN hold_rule text,
    ADD COLUMN approvals_needed smallint NOT NULL DEFAULT 0,
    ADD COLUMN approval_deadline timestamptz,
    ADD COLUMN approved_at timestamptz,
    -- Who asked for it (the gateway's token id, or the SDK's actor): never its approver.
    ADD COLUMN requested_by text,
    -- A first-contact rule's subject (sha256 of tenant, action type and the field's value):
    -- "has this tenant written to this recipient before" is a lookup of succeeded rows.
    ADD COLUMN subject_hash text,
    ADD CONSTRAINT approvals_needed_range CHECK (approvals_needed BETWEEN 0 AND 2) NOT VALID,
    ADD CONSTRAINT held_has_rule CHECK (status <> 'awaiting_approval' OR (hold_rule IS NOT NULL AND approvals_needed >= 1 AND approved_at IS NULL)) NOT VALID,
    -- The guarantee, in the database: a held operation is never claimed, sent, or settled
    -- as sent unless it was approved.
    ADD CONSTRAINT held_until_approved
        CHECK (hold_rule IS NULL OR approved_at IS NOT NULL
               OR status IN ('awaiting_approval', 'rejected', 'cancelled', 'expired')) NOT VALID,
    DROP CONSTRAINT planned_iff_no_attempt,
    ADD CONSTRAINT planned_iff_no_attempt
        CHECK ((status IN ('planned', 'awaiting_approval')) <= (attempt_count = 0)
               AND (attempt_count <> 0 OR status IN ('planned', 'deferred', 'awaiting_approval',
                                                     'rejected', 'cancelled', 'expired'))) NOT VALID,
    DROP CONSTRAINT terminal_has_no_lease,
    ADD CONSTRAINT terminal_has_no_lease
        CHECK (status NOT IN ('succeeded', 'failed_final', 'planned', 'awaiting_approval',
                              'rejected', 'cancelled', 'expired') OR lease_until IS NULL) NOT VALID,
    DROP CONSTRAINT payload_iff_live,
    ADD CONSTRAINT payload_iff_live
        CHECK ((status IN ('succeeded', 'failed_final', 'rejected', 'cancelled', 'expired'))
               = (payload IS NULL AND payload_sealed IS NULL)) NOT VALID;

-- Every approval and rejection, one row per person and operation (four eyes: two rows by
-- two different people): the audit trail of decisions. The operation's move (and so its
-- event, by the trigger) is written in the same transaction (journal/control.rs); a first
-- of two approvals moves nothing and is recorded here only. `id` is an identity column:
-- inserting needs no grant on a sequence.
CREATE TABLE operation_approvals (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    idempotency_key text NOT NULL REFERENCES agent_operations (idempotency_key) ON DELETE CASCADE,
    approver        text NOT NULL CONSTRAINT approver_format CHECK (length(approver) BETWEEN 1 AND 80),
    decision        text NOT NULL CONSTRAINT decision_set CHECK (decision IN ('approve', 'reject')),
    note            text CONSTRAINT note_length CHECK (length(note) <= 2000),
    at              timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT one_decision_per_person UNIQUE (idempotency_key, approver)
);

-- The held list (desk, metrics) and the approval deadlines (sweeper).
CREATE INDEX agent_operations_held_idx ON agent_operations (approval_deadline, created_at)
    WHERE status = 'awaiting_approval';
-- Expiry: the sweeper's scan of live rows whose deadline passed.
CREATE INDEX agent_operations_expiry_idx ON agent_operations (expires_at)
    WHERE expires_at IS NOT NULL AND status IN ('planned', 'awaiting_approval', 'deferred', 'failed_retryable');
-- First contact: "a succeeded operation with this subject in the last N days".
CREATE INDEX agent_operations_subject_idx ON agent_operations (subject_hash, updated_at)
    WHERE subject_hash IS NOT NULL AND status = 'succeeded';
