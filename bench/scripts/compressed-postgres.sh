#!/usr/bin/env bash
# A private PostgreSQL 15 cluster whose data directory is on a zstd-compressed btrfs
# (a loop-mounted image file), for `oncely-bench --journal-rows 50000000` on a machine
# whose disk cannot hold the ~76 GB such a journal takes uncompressed (docs/performance.md,
# "50 million operations"). WAL stays on the ordinary disk. Settings as the machine's own
# cluster: shared_buffers 128MB, max_wal_size 1GB, autovacuum off, fsync on.
#
#   sudo bench/scripts/compressed-postgres.sh start [SIZE]   # SIZE of the image, default 68G
#   ./target/release/oncely-bench --journal-rows 50000000 \
#       --database-url postgres://postgres@127.0.0.1:5450/postgres
#   sudo bench/scripts/compressed-postgres.sh usage          # logical vs physical bytes
#   sudo bench/scripts/compressed-postgres.sh stop           # stops, unmounts, deletes all
#
# Needs root (loop mount), btrfs in the kernel, btrfs-progs and PostgreSQL 15's binaries.
set -euo pipefail
IMG=${ONCELY_PG50_IMAGE:-/work/pg50.img}
MNT=${ONCELY_PG50_MOUNT:-/mnt/pg50}
WAL=${ONCELY_PG50_WAL:-/var/lib/postgresql/pg50wal}
PORT=${ONCELY_PG50_PORT:-5450}
BIN=/usr/lib/postgresql/15/bin
as_pg() { runuser -u postgres -- "$@"; }

case "${1:-}" in
start)
    command -v mkfs.btrfs >/dev/null || { apt-get update -qq && apt-get install -y -qq btrfs-progs; }
    truncate -s "${2:-68G}" "$IMG"
    mkfs.btrfs -q "$IMG"
    mkdir -p "$MNT"
    # A loop device with direct I/O: the image file's pages are not cached a second time
    # beside the filesystem's (without it, the filled journal had less RAM for its cache).
    dev=$(losetup --direct-io=on --find --show "$IMG")
    mount -o compress-force=zstd:1,noatime,discard=async "$dev" "$MNT"
    mkdir -p "$MNT/data" "$WAL"
    chown postgres:postgres "$MNT" "$MNT/data" "$WAL"
    chmod 700 "$MNT/data"
    as_pg "$BIN/initdb" -D "$MNT/data" --waldir="$WAL/wal" -U postgres -A trust >/dev/null
    { echo "port = $PORT"; cat "$(dirname "$0")/bench-postgres.conf"; } >>"$MNT/data/postgresql.conf"
    as_pg "$BIN/pg_ctl" -D "$MNT/data" -l "$MNT/postgres.log" -w start >/dev/null
    echo "DATABASE_URL=postgres://postgres@127.0.0.1:$PORT/postgres"
    ;;
usage)
    echo "logical (databases): $(psql -h 127.0.0.1 -p "$PORT" -U postgres -Atc \
        "SELECT pg_size_pretty(sum(pg_database_size(datname))) FROM pg_database")"
    echo "physical (btrfs):    $(df -h --output=used "$MNT" | tail -1)"
    echo "image file on disk:  $(du -sh "$IMG" | cut -f1)"
    ;;
stop)
    as_pg "$BIN/pg_ctl" -D "$MNT/data" -m fast -w stop >/dev/null || true
    dev=$(findmnt -n -o SOURCE "$MNT" || true)
    umount "$MNT"
    if [ -n "$dev" ]; then losetup -d "$dev" 2>/dev/null || true; fi
    rm -f "$IMG"
    rm -rf "$WAL"
    ;;
*)
    sed -n '2,15p' "$0"
    exit 2
    ;;
esac
