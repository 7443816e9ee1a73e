#!/usr/bin/env bash
# DEMO ONLY: a stand-in for AI agents. Enqueues sample-intents.jsonl in rounds, forever,
# so the dashboard has traffic. Every `__ROUND__` in the file is replaced by a fresh tag,
# so each round is new work (new keys); the file itself holds one exact repeat (a
# duplicate) and one changed payload under an existing key (a conflict, refused: exit 3).
# Every 4th round also replays the previous round: all duplicates, no new effects.
#
# Env: ONCELY_DEMO_FILE (default: the file next to this script),
#      ONCELY_DEMO_INTERVAL seconds between rounds (default 5), plus the producer's own
#      DATABASE_URL, ONCELY_AMQP_URL, ONCELY_KEY_SECRET_FILE, ONCELY_CONFIG.
set -uo pipefail

file="${ONCELY_DEMO_FILE:-$(dirname "$0")/sample-intents.jsonl}"
interval="${ONCELY_DEMO_INTERVAL:-5}"
stopping=0
trap 'stopping=1' TERM INT

enqueue() {
    sed "s/__ROUND__/$1/g" "$file" | oncely-producer enqueue --jsonl
    local rc=$?
    # 0: all recorded; 3: a conflict was refused (expected: the sample file has one).
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 3 ]; then
        echo "demo producer: round $1: oncely-producer exited $rc" >&2
    fi
}

round=0
previous=""
while [ "$stopping" -eq 0 ]; do
    round=$((round + 1))
    tag="$(date +%s)-${round}"
    enqueue "$tag"
    if [ -n "$previous" ] && [ $((round % 4)) -eq 0 ]; then
        enqueue "$previous"
    fi
    previous="$tag"
    sleep "$interval" &
    wait $! || true
done
echo "demo producer: stopped after ${round} rounds"
