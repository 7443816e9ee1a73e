-- Validates the checks swapped in by 20261214000000 without blocking writes (SHARE UPDATE
-- EXCLUSIVE): every existing row passed the old, narrower ones.
ALTER TABLE agent_operations VALIDATE CONSTRAINT status_set;
ALTER TABLE agent_operations VALIDATE CONSTRAINT planned_iff_no_attempt;
ALTER TABLE agent_operations VALIDATE CONSTRAINT throttled_within_attempts;
ALTER TABLE agent_operations VALIDATE CONSTRAINT deferred_has_due;
