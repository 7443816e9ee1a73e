-- Flow control (docs/providers.md, "Rate limits"): a throttled attempt is *deferred*, not
-- failed, and a provider's budget is shared by the whole fleet.
--
-- `deferred`: the provider said "not now" (429, 503 with Retry-After, SMTP 421/45x) or the
-- fleet's own budget for the provider had no slot for it. Nothing was sent. The row waits
-- with its due time in `lease_until` (like `failed_retryable`'s not-before time); a claim
-- takes it once due, the sweeper republishes it when due. `throttled_attempts` counts the
-- attempts the provider refused that way: they do not count against `max_attempts`
-- (attempts spent = attempt_count - throttled_attempts), while `attempt_count` stays the
-- fencing token and still grows with every claim. `deferred_since`: when this operation was
-- first deferred, the start of its patience (`max_defer`, after which it ends failed_final
-- with `deferred_too_long`).
--
-- The checks are added NOT VALID (no scan while ACCESS EXCLUSIVE is held: every existing row
-- passes them) and validated by the next migration without blocking writes.
ALTER TABLE agent_operations
    DROP CONSTRAINT status_set,
    ADD CONSTRAINT status_set CHECK (status IN ('planned', 'executing', 'succeeded', 'failed_retryable',
                                              'failed_final', 'unknown', 'deferred')) NOT VALID,
    ADD COLUMN throttled_attempts integer NOT NULL DEFAULT 0,
    ADD COLUMN deferred_since timestamptz,
    ADD CONSTRAINT throttled_within_attempts CHECK (throttled_attempts >= 0 AND throttled_attempts <= attempt_count) NOT VALID,
    -- `planned` has no attempt (as before); an operation without an attempt is `planned`,
    -- or `deferred` before its first attempt (the budget had no slot for it).
    DROP CONSTRAINT planned_iff_no_attempt,
    ADD CONSTRAINT planned_iff_no_attempt
        CHECK ((status = 'planned') <= (attempt_count = 0)
               AND (attempt_count <> 0 OR status IN ('planned', 'deferred'))) NOT VALID,
    ADD CONSTRAINT deferred_has_due CHECK (status <> 'deferred' OR (lease_until IS NOT NULL AND deferred_since IS NOT NULL)) NOT VALID;

-- One row per provider: the fleet's shared budget (core/src/journal/budget.rs). A token
-- bucket whose state is its `tat` (GCRA's theoretical arrival time: the bucket is full when
-- tat <= now()), the rate in force (the configured one, or less while the provider pushes
-- back), and a pause that the provider's `Retry-After` sets for everyone at once.
CREATE TABLE provider_budgets (
    provider        text PRIMARY KEY,
    -- The configured rate and burst (NULL: no configured limit; the row then only carries
    -- pauses and what the provider's own headers taught).
    configured_rate double precision CONSTRAINT configured_rate_positive CHECK (configured_rate > 0),
    burst           integer NOT NULL DEFAULT 1 CONSTRAINT burst_positive CHECK (burst >= 1),
    -- The rate in force (NULL: unlimited), lowered by throttling, raised back while clean.
    rate            double precision CONSTRAINT rate_positive CHECK (rate > 0),
    tat             timestamptz NOT NULL DEFAULT now(),
    -- Nobody calls the provider before this (its Retry-After, fleet-wide).
    paused_until    timestamptz NOT NULL DEFAULT 'epoch',
    -- The last multiplicative decrease (at most one a second), the rate it left, and the
    -- last increase. Increases add a tenth of the configured rate (or, without one, of
    -- the rate the last decrease left) per clean second.
    decreased_at    timestamptz NOT NULL DEFAULT 'epoch',
    decreased_to    double precision,
    increased_at    timestamptz NOT NULL DEFAULT now(),
    throttles       bigint NOT NULL DEFAULT 0,
    updated_at      timestamptz NOT NULL DEFAULT now()
);
-- ('epoch', not '-infinity': Postgres 15 cannot subtract an infinite time from now().)
