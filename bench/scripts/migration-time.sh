#!/usr/bin/env bash
# Time migration 20261211000000 (events by operation number) on a journal of N operations
# left by the previous release (docs/operations.md, "Migrations on a big journal"): a new
# database on the machine's own Postgres, migrations before it applied by psql, filled with
# that release's bench/sql/fill_journal.sql (from git, commit 5e04298), then the migration
# in one transaction with per-statement timing. Run from the repository root:
#   bench/scripts/migration-time.sh 1000000
set -euo pipefail
N=${1:-1000000}
DB=oncely_migtime
cd "$(git rev-parse --show-toplevel)"
psql -q -h 127.0.0.1 -U postgres -d postgres -c "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB"
for f in migrations/*.sql; do
  case $f in *20261211000000*) continue;; esac
  psql -q -X -v ON_ERROR_STOP=1 -h 127.0.0.1 -U postgres -d $DB -f $f >/dev/null
done
git show 5e04298:bench/sql/fill_journal.sql > /tmp/oldfill.sql
CH=500000
start=1
while [ $start -le $N ]; do
  end=$((start+CH-1)); [ $end -gt $N ] && end=$N
  sed -e "s/\$1::bigint/${start}::bigint/; s/\$2::bigint/${end}::bigint/; s/\$3/${N}/g; s/\$4/1000000/g" /tmp/oldfill.sql > /tmp/fillchunk.sql
  psql -q -X -v ON_ERROR_STOP=1 -h 127.0.0.1 -U postgres -d $DB -c "ALTER TABLE agent_operations DISABLE TRIGGER agent_operations_insert_events" -f /tmp/fillchunk.sql -c "ALTER TABLE agent_operations ENABLE TRIGGER agent_operations_insert_events" >/dev/null
  start=$((end+1))
done
psql -q -X -h 127.0.0.1 -U postgres -d $DB -c "VACUUM ANALYZE" -c "CHECKPOINT"
psql -X -h 127.0.0.1 -U postgres -d $DB -Atc "SELECT count(*) FROM agent_operations" -c "SELECT count(*) FROM operation_events" -c "SELECT pg_size_pretty(pg_database_size('$DB'))"
/usr/bin/time -f "migration: %e s wall" psql -X -1 -c "\\timing on" -v ON_ERROR_STOP=1 -h 127.0.0.1 -U postgres -d $DB -f migrations/20261211000000_events_by_operation_sequence.sql
psql -X -h 127.0.0.1 -U postgres -d $DB -Atc "SELECT pg_size_pretty(pg_database_size('$DB'))" -c "SELECT count(*) FROM operation_events e JOIN agent_operations o ON o.seq = e.op_seq AND o.idempotency_key = e.idempotency_key"
psql -q -h 127.0.0.1 -U postgres -d postgres -c "DROP DATABASE $DB"
