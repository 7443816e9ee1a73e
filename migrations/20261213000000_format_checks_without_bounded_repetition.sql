-- The key's and the payload hash's format checks, written so that Postgres can afford them.
--
-- A CHECK constraint is evaluated on every row an INSERT or UPDATE writes, whether or not
-- its column changed, so these two ran on each of an operation's three writes (record,
-- claim, completion). Written as `~ '^v1:[0-9a-f]{64}$'`, each cost ~13 µs a row here:
-- Postgres's regex engine expands the bounded repetition `{64}` into 64 copies of the
-- bracket. `perf` put regex matching under these checks at 14 % of all the CPU of a
-- full-load bench run, more than a third of Postgres's share (docs/performance.md, "The
-- format checks"). The same language without the bound: the characters after the prefix
-- are all lowercase hex (`[0-9a-f]*`, which a small automaton matches) and the whole value
-- is 67 (71) bytes long — every one of them ASCII once the pattern matched, so 64 hex
-- digits exactly. ~1 µs a row.
--
-- Swapped under the same names, NOT VALID: no scan while ACCESS EXCLUSIVE is held (every
-- existing row passed the old, equivalent check). The next migration validates them
-- without blocking writes.
ALTER TABLE agent_operations
    DROP CONSTRAINT key_format,
    DROP CONSTRAINT payload_hash_format,
    ADD CONSTRAINT key_format
        CHECK (octet_length(idempotency_key) = 67 AND idempotency_key ~ '^v1:[0-9a-f]*$') NOT VALID,
    ADD CONSTRAINT payload_hash_format
        CHECK (octet_length(payload_hash) = 71 AND payload_hash ~ '^sha256:[0-9a-f]*$') NOT VALID;
