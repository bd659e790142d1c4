#!/usr/bin/env bash
# History at scale (BENCHMARKS.md, "History at scale"):
#   bench/history.sh [ENTRIES] [ACCOUNTS] [EVENTS]
# 1. a history of ENTRIES ledger entries over ACCOUNTS accounts spanning 12
#    months, built through the engine (`token-billing-bench history`),
#    closed by day;
# 2. with the service on it and the same kiosk load running: as_of of one
#    account, the account list as_of, the ledger page, reconciliation of a
#    month and of the year (`token-billing-bench history --skip-build --url …`);
# 3. the kiosk load alone, PAIRS times (default 2) on an empty database and
#    then on the big one, back to back: reserve→commit throughput of each;
# 4. EVENTS expired events, then a retention pass that archives them
#    (`token-billing prune` with ARCHIVE_DIR) while the kiosk load runs:
#    its time, the WAL written, the kiosks' p99.
# SKIP_READS=1 skips step 2, SKIP_RETENTION=1 step 4.
# HISTORY_BUILT=1 skips step 1 and measures the tb_bench_history built by
# an earlier run (the build took 43 minutes here; the measurements want an
# idle machine, the build does not).
# Needs release binaries (cargo build --release; BIN names another build's,
# bench/load_generator.sh) and PostgreSQL at $PG; it
# drops and recreates the databases tb_bench_history and
# tb_bench_history_empty. Heavy: run it on an otherwise idle machine.
set -euo pipefail
ENTRIES=${1:-20000000}
ACCOUNTS=${2:-10000}
EVENTS=${3:-10000000}
PG=${PG:-postgres://postgres@127.0.0.1:5432}
BIN=${BIN:-target/release}
PORT=${PORT:-18180}
LOAD_SECONDS=${LOAD_SECONDS:-20}
KEY=bench-history-admin-key-0123
DB=tb_bench_history
EMPTY=tb_bench_history_empty
WORK=$(mktemp -d)
ARCHIVE=${ARCHIVE:-$WORK/archive}
URL=http://127.0.0.1:$PORT
SERVICE=
. "$(dirname "$0")/load_generator.sh"
load_generator "$BIN" || exit 1

psql_admin() { psql "$PG/postgres" -qAtc "$1"; }
sql() { psql "$PG/$DB" -qAtc "$1"; }

serve() {
  ADMIN_API_KEY=$KEY RATE_LIMIT_PER_SECOND=0 RETENTION_SCHEDULE="0 0 3 * * *" \
    DATABASE_URL="$PG/$1" "$BIN/token-billing" serve --bind-addr "127.0.0.1:$PORT" \
    >"$WORK/serve-$1.log" 2>&1 &
  SERVICE=$!
  for _ in $(seq 1 600); do
    curl -fs "$URL/readyz" >/dev/null && return 0
    sleep 0.1
  done
  echo "the service did not become ready" >&2
  return 1
}
stop() {
  if [ -n "$SERVICE" ]; then kill "$SERVICE" && wait "$SERVICE" || true; fi
  SERVICE=
}
trap stop EXIT
load() {
  "${bench[@]}" load --url "$URL" --admin-key "$KEY" --scenario spread \
    --concurrency 8 --accounts 1000 --seconds "$LOAD_SECONDS" --service-pid "$SERVICE" "$@"
}
wal() { sql "SELECT pg_current_wal_lsn()"; }
wal_since() { sql "SELECT pg_size_pretty(pg_wal_lsn_diff(pg_current_wal_lsn(), '$1'))"; }

if [ "${HISTORY_BUILT:-0}" = 1 ]; then
  echo "== 1. build: skipped (HISTORY_BUILT=1), $DB as it is: $(sql "SELECT count(*) FROM ledger_entries") entries"
else
  echo "== 1. build: $ENTRIES entries, $ACCOUNTS accounts, 12 months"
  psql_admin "DROP DATABASE IF EXISTS $DB WITH (FORCE)"
  DATABASE_URL="$PG/$DB" "${bench[@]}" history \
    --entries "$ENTRIES" --accounts "$ACCOUNTS" --months 12
fi

if [ "${SKIP_READS:-0}" != 1 ]; then
  echo "== 2. history reads under the kiosk load"
  serve "$DB"
  LOAD_SECONDS=$((LOAD_SECONDS * 6)) load >"$WORK/load-during-reads.txt" &
  LOADER=$!
  sleep 5
  DATABASE_URL="$PG/$DB" "${bench[@]}" history --skip-build \
    --url "$URL" --admin-key "$KEY"
  wait "$LOADER"
  echo "-- the kiosk load meanwhile:"
  cat "$WORK/load-during-reads.txt"

  stop
fi

echo "== 3. kiosk load alone: an empty database, then the big one, ${PAIRS:-2} times"
for round in $(seq 1 "${PAIRS:-2}"); do
  psql_admin "DROP DATABASE IF EXISTS $EMPTY WITH (FORCE)"
  serve "$EMPTY"
  echo -n "round $round empty:   "
  load
  stop
  psql_admin "DROP DATABASE IF EXISTS $EMPTY WITH (FORCE)"
  serve "$DB"
  START=$(wal)
  echo -n "round $round history: "
  load
  echo "WAL written by the kiosk load alone: $(wal_since "$START")"
  stop
done

if [ "${SKIP_RETENTION:-0}" != 1 ]; then
  serve "$DB"

  echo "== 4. retention pass over $EVENTS expired events, archived, under the kiosk load"
  sql "INSERT INTO events (type, account_id, data, created_at)
       SELECT 'credit.created', NULL, jsonb_build_object('bench', g), now() - interval '100 days'
       FROM generate_series(1, $EVENTS) g;
       UPDATE webhook_relay SET after_txid = 9223372036854775807;
       CHECKPOINT"
  START=$(wal)
  LOAD_SECONDS=$((LOAD_SECONDS * 3)) load >"$WORK/load-during-pass.txt" &
  LOADER=$!
  sleep 2
  BEGAN=$(date +%s.%N)
  ARCHIVE_DIR="$ARCHIVE" "$BIN/token-billing" --database-url "$PG/$DB" prune
  ENDED=$(date +%s.%N)
  echo "retention pass: $(awk "BEGIN {printf \"%.1f\", $ENDED - $BEGAN}") s; WAL during it (kiosks included): $(wal_since "$START")"
  echo "archive: $(du -sh "$ARCHIVE" | cut -f1) in $(find "$ARCHIVE" -name '*.jsonl.gz' | wc -l) files"
  wait "$LOADER"
  echo "-- the kiosk load meanwhile:"
  cat "$WORK/load-during-pass.txt"
  stop
fi
rm -rf "$WORK"
