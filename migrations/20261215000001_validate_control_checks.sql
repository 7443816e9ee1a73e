-- Validates the checks added by 20261215000000 without blocking writes.
ALTER TABLE agent_operations VALIDATE CONSTRAINT status_set;
ALTER TABLE agent_operations VALIDATE CONSTRAINT approvals_needed_range;
ALTER TABLE agent_operations VALIDATE CONSTRAINT held_has_rule;
ALTER TABLE agent_operations VALIDATE CONSTRAINT held_until_approved;
ALTER TABLE agent_operations VALIDATE CONSTRAINT planned_iff_no_attempt;
ALTER TABLE agent_operations VALIDATE CONSTRAINT terminal_has_no_lease;
ALTER TABLE agent_operations VALIDATE CONSTRAINT payload_iff_live;
