#!/usr/bin/env bash
# How a replica should learn that a job another replica finished: one
# query per tick for all its parked waiters (what it does,
# `jobs::terminal_among` every JOB_WATCH_POLL = 250 ms), or LISTEN/NOTIFY
# (each finish notifies; every replica listens). Both measured on the
# database, side by side in one run:
#   - poll: the watcher's own query over W parked job ids, one client, its
#     mean latency = the primary's time per tick (a read, CPU-bound);
#     × 4 ticks/s = its cost per replica per second, whatever the finishes;
#   - notify: a finish-like write transaction (one job row updated), by C
#     clients, with and without `pg_notify('job_finished', id)` in it, and
#     LISTENERS sessions listening: what notifying costs the writes (a
#     notifying commit takes PostgreSQL's notification queue lock until it
#     ends, so notifying commits are serialised across the cluster).
#
# Usage: bench/notify_vs_poll.sh [ROUNDS]   (default 3; medians)
# Needs a release build (token-billing migrates the scratch database) and
# PostgreSQL at 127.0.0.1:5432; uses and drops the database
# tb_bench_notify.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}"
bin="${BIN:-${CARGO_TARGET_DIR:-target}/release}"
database=tb_bench_notify
url="postgres://postgres@127.0.0.1:5432"
psql_db() { psql "$url/$database" -v ON_ERROR_STOP=1 -qtAc "$1"; }
work="$(mktemp -d)"
listeners=()
cleanup() {
  for pid in "${listeners[@]}"; do kill "$pid" 2> /dev/null || true; done
  psql "$url/postgres" -qc "DROP DATABASE IF EXISTS $database WITH (FORCE)" > /dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

psql "$url/postgres" -qc "DROP DATABASE IF EXISTS $database WITH (FORCE)" > /dev/null 2>&1
DATABASE_URL="$url/$database" "$bin/token-billing" migrate > /dev/null
# 20,000 running jobs on 1,000 accounts (each with its held reservation).
psql_db "
INSERT INTO accounts (id, name, max_active_reservations)
SELECT ('00000000-0000-4000-8000-' || lpad(to_hex(n), 12, '0'))::uuid, 'notify ' || n, 0
FROM generate_series(1, 1000) n;
INSERT INTO reservations (id, account_id, request_id, amount, state, expires_at)
SELECT ('00000000-0000-4000-9000-' || lpad(to_hex(n), 12, '0'))::uuid,
       ('00000000-0000-4000-8000-' || lpad(to_hex(1 + n % 1000), 12, '0'))::uuid,
       gen_random_uuid(), 1, 'held', now() + interval '1 day'
FROM generate_series(1, 20000) n;
INSERT INTO generation_jobs (id, account_id, request_id, request_hash, kind, params, cost,
    reservation_id, status, lease_expires_at, lease_token)
SELECT ('00000000-0000-4000-a000-' || lpad(to_hex(n), 12, '0'))::uuid,
       ('00000000-0000-4000-8000-' || lpad(to_hex(1 + n % 1000), 12, '0'))::uuid,
       gen_random_uuid(), sha256(n::text::bytea), 'standard', '{}', 1,
       ('00000000-0000-4000-9000-' || lpad(to_hex(n), 12, '0'))::uuid,
       'running', now() + interval '1 day', 1
FROM generate_series(1, 20000) n;
ANALYZE;"

# The watcher's query (diesel's eq_any binds one array) over W ids.
cat > "$work/poll.sql" << 'EOF'
\set first random(1, 20000 - :w)
SELECT id FROM generation_jobs
WHERE id = ANY (ARRAY(SELECT ('00000000-0000-4000-a000-' || lpad(to_hex(n), 12, '0'))::uuid
                      FROM generate_series(:first::int, (:first::int + :w::int - 1)) n))
  AND status IN ('succeeded', 'failed');
EOF
# A finish-like write (one running job's row, as a finish updates it),
# with and without the notification.
cat > "$work/finish_notify.sql" << 'EOF'
\set n random(1, 20000)
BEGIN;
UPDATE generation_jobs SET updated_at = now()
WHERE id = ('00000000-0000-4000-a000-' || lpad(to_hex(:n::int), 12, '0'))::uuid;
SELECT pg_notify('job_finished', ('00000000-0000-4000-a000-' || lpad(to_hex(:n::int), 12, '0')));
COMMIT;
EOF
# The same write without it, so the two differ by the notification alone.
grep -v pg_notify "$work/finish_notify.sql" > "$work/finish_plain.sql"

# Two replicas listening. A session reading its notifications: psql
# repeats a trivial query every 100 ms, which hands it what has arrived.
for _ in 1 2; do
  (echo "LISTEN job_finished;"; while true; do echo "SELECT 1;"; sleep 0.1; done) \
    | psql "$url/$database" -qtA > /dev/null 2>&1 &
  listeners+=($!)
done

run() { # script clients seconds [defines…] → tps and mean latency (ms)
  local script=$1 clients=$2 seconds=$3; shift 3
  pgbench -h 127.0.0.1 -U postgres -n -M prepared -c "$clients" -j "$((clients < 2 ? 1 : 2))" \
    -T "$seconds" "$@" -f "$script" "$database" 2> /dev/null \
    | awk '/^latency average/ {lat = $4} /^tps/ {tps = $3} END {printf "%.1f %.3f\n", tps, lat}'
}
median() { sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }

echo "rounds: $rounds; medians"
for w in 100 500 2000; do
  lat=$(for _ in $(seq "$rounds"); do run "$work/poll.sql" 1 5 -D w="$w" | cut -d' ' -f2; done | median)
  awk -v w="$w" -v lat="$lat" 'BEGIN {printf "poll, %5d parked waiters: %.3f ms per tick; at 4 ticks/s %.1f ms/s (%.2f %% of a core) per replica\n", w, lat, 4 * lat, 0.4 * lat}'
done
for clients in 8 32; do
  plain="" notify=""
  for _ in $(seq "$rounds"); do
    plain+="$(run "$work/finish_plain.sql" "$clients" 6 | cut -d' ' -f1)"$'\n'
    notify+="$(run "$work/finish_notify.sql" "$clients" 6 | cut -d' ' -f1)"$'\n'
  done
  p=$(printf '%s' "$plain" | median)
  n=$(printf '%s' "$notify" | median)
  awk -v c="$clients" -v p="$p" -v n="$n" 'BEGIN {printf "finishes, %2d clients: %.0f/s plain, %.0f/s notifying (%.2f)\n", c, p, n, n / p}'
done
