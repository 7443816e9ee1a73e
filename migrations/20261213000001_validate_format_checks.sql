-- Validate the two format checks swapped by the previous migration: a scan of the table
-- under SHARE UPDATE EXCLUSIVE, which lets reads and writes go on (a migration of its own,
-- so that the previous one's ACCESS EXCLUSIVE lock is not held during the scan).
ALTER TABLE agent_operations VALIDATE CONSTRAINT key_format;
ALTER TABLE agent_operations VALIDATE CONSTRAINT payload_hash_format;
