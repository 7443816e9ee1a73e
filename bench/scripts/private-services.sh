#!/usr/bin/env bash
# A private PostgreSQL 15 cluster and a private RabbitMQ node with all their files under
# DIR, for comparing where durable writes land (docs/performance.md, "Where the half-load
# latency goes"): DIR on the machine's disk, or on tmpfs (/dev/shm), where fsync returns
# at once. A DIAGNOSTIC: on tmpfs a crash loses every committed operation and every
# confirmed message — never a place to run oncely.
#
#   sudo bench/scripts/private-services.sh start DIR      # e.g. /var/tmp/oncely-disk, /dev/shm/oncely-tmpfs
#   ./target/release/oncely-bench --quick \
#       --database-url 'postgres://postgres@127.0.0.1:5460/postgres?sslmode=disable' \
#       --amqp-url amqp://guest:guest@127.0.0.1:5680/%2f
#   sudo bench/scripts/private-services.sh fsync DIR      # pg_test_fsync in DIR (5 s per test)
#   sudo bench/scripts/private-services.sh stop DIR       # stops both, deletes DIR
#
# Postgres as the machine's own cluster (synchronous_commit on, fdatasync, shared_buffers
# 128MB, max_wal_size 1GB, autovacuum off, max_connections 100; no TLS). RabbitMQ with its
# defaults (quorum queues fsync their log). Ports: Postgres 5460, AMQP 5680, Erlang
# distribution 25680 (ONCELY_PRIVATE_PG_PORT, ONCELY_PRIVATE_AMQP_PORT to change).
# Needs root (it runs each server as its own system user) and both servers' Debian packages.
set -euo pipefail
DIR=${2:-}
PG_PORT=${ONCELY_PRIVATE_PG_PORT:-5460}
AMQP_PORT=${ONCELY_PRIVATE_AMQP_PORT:-5680}
DIST_PORT=$((AMQP_PORT + 20000))
NODE=oncely_private_${AMQP_PORT}@localhost
BIN=/usr/lib/postgresql/15/bin
as_pg() { runuser -u postgres -- "$@"; }
rabbit_env() {
    env RABBITMQ_NODENAME="$NODE" RABBITMQ_NODE_PORT="$AMQP_PORT" RABBITMQ_DIST_PORT="$DIST_PORT" \
        RABBITMQ_MNESIA_BASE="$DIR/rabbitmq/mnesia" RABBITMQ_LOG_BASE="$DIR/rabbitmq/log" \
        RABBITMQ_ENABLED_PLUGINS_FILE="$DIR/rabbitmq/enabled_plugins" \
        RABBITMQ_PID_FILE="$DIR/rabbitmq/pid" RABBITMQ_FEATURE_FLAGS_FILE="$DIR/rabbitmq/feature_flags" \
        RABBITMQ_CONFIG_FILE="$DIR/rabbitmq/rabbitmq.conf" "$@"
}
usage() {
    sed -n '2,20p' "$0"
    exit 2
}
[ -n "$DIR" ] || usage

case "${1:-}" in
start)
    mkdir -p "$DIR/pg" "$DIR/rabbitmq"
    chown postgres:postgres "$DIR/pg"
    chmod 700 "$DIR/pg"
    as_pg "$BIN/initdb" -D "$DIR/pg/data" -U postgres -A trust >/dev/null
    { echo "port = $PG_PORT"; cat "$(dirname "$0")/bench-postgres.conf"; } >>"$DIR/pg/data/postgresql.conf"
    as_pg "$BIN/pg_ctl" -D "$DIR/pg/data" -l "$DIR/pg/postgres.log" -w start >/dev/null
    echo "[]." >"$DIR/rabbitmq/enabled_plugins"
    echo "listeners.tcp.default = 127.0.0.1:$AMQP_PORT" >"$DIR/rabbitmq/rabbitmq.conf"
    chown -R rabbitmq:rabbitmq "$DIR/rabbitmq"
    rabbit_env rabbitmq-server -detached
    # await_startup fails at once while the node is not yet known to epmd: retry it.
    for _ in $(seq 60); do
        rabbitmqctl -q -n "$NODE" await_startup --timeout 120 >/dev/null 2>&1 && break
        sleep 2
    done
    rabbitmqctl -q -n "$NODE" await_startup --timeout 5
    echo "DATABASE_URL=postgres://postgres@127.0.0.1:$PG_PORT/postgres?sslmode=disable"
    echo "AMQP_URL=amqp://guest:guest@127.0.0.1:$AMQP_PORT/%2f"
    ;;
fsync)
    mkdir -p "$DIR/fsync"
    chown postgres:postgres "$DIR/fsync"
    as_pg "$BIN/pg_test_fsync" -s 5 -f "$DIR/fsync/test.out"
    rm -rf "$DIR/fsync"
    ;;
stop)
    as_pg "$BIN/pg_ctl" -D "$DIR/pg/data" -m fast -w stop >/dev/null || true
    rabbitmqctl -q -n "$NODE" stop >/dev/null 2>&1 || true
    rm -rf "$DIR"
    ;;
*)
    usage
    ;;
esac
