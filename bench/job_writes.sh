#!/usr/bin/env bash
# Database writes per job: transactions, write transactions (transaction
# ids assigned) and WAL bytes per job from create to `succeeded`.
#
# Usage:
#   bench/job_writes.sh [--kiosks N] [--seconds S] [--accounts A] [--latency-ms MS] [--profile release|debug]
# Defaults: 8 kiosks, 5 s, 0 ms simulated provider per job, release (build
# first: cargo build --release, or --bins for debug). The service's other
# settings come from the environment (JOB_LEASE_SECONDS,
# WORKER_CONCURRENCY, …); LOAD_GENERATOR_DIR names another build's
# directory whose load generator to use (one that knows --job-delay-ms, for
# an older service; bench/load_generator.sh).
#
# A private cluster (initdb in a temporary directory, port
# JOB_WRITES_PORT, default 5473; the main cluster is not touched). The
# database is migrated first; then the statistics are read (the database's
# xact_commit + xact_rollback, the next transaction id, the WAL position),
# the service started, `token-billing-bench load --scenario jobs`
# run (its 2 s warm-up included) and the service stopped (its connections
# close, so their statistics are flushed), and the statistics read again.
# The same is done once with the service idle for as long, without load,
# which shows what the service costs while nobody creates jobs. Everything
# it made is removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

kiosks=8 seconds=5 accounts=8 latency=0 profile=release
while [ $# -gt 0 ]; do
  case "$1" in
    --kiosks) kiosks="$2"; shift ;;
    --seconds) seconds="$2"; shift ;;
    --accounts) accounts="$2"; shift ;;
    --latency-ms) latency="$2"; shift ;;
    --profile) profile="$2"; shift ;;
    *) sed -n '4,7p' "$0" >&2; exit 2 ;;
  esac
  shift
done

target_dir="${CARGO_TARGET_DIR:-target}"
binary="$target_dir/$profile/token-billing"
[ -x "$binary" ] || { echo "build first ($binary missing)" >&2; exit 1; }
. bench/load_generator.sh
load_generator "${LOAD_GENERATOR_DIR:-$target_dir/$profile}" || exit 1
. bench/private_cluster.sh
port="${JOB_WRITES_PORT:-5473}"
service_port=18097
key="writes-admin-key-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
dir="$(mktemp -d /tmp/tb-job-writes.XXXXXX)"
service=""
stop_service() {
  [ -n "$service" ] || return 0
  kill -TERM "$service" 2> /dev/null || true
  wait "$service" 2> /dev/null || true
  service=""
}
cleanup() {
  stop_service
  private_cluster_stop "$dir"
  rm -rf "$dir"
}
trap cleanup EXIT

private_cluster_start "$dir" "$port" "autovacuum = off"
psql_db() { psql -h 127.0.0.1 -p "$port" -U postgres -v ON_ERROR_STOP=1 -qtA -d tb_writes -c "$1"; }
database_url="postgres://postgres@127.0.0.1:$port/tb_writes"
"$binary" --database-url "$database_url" migrate > /dev/null

# transactions xids wal_lsn
sample() { private_cluster_sample "$port" tb_writes; }
start_service() {
  DATABASE_URL="$database_url" BIND_ADDR="127.0.0.1:$service_port" ADMIN_API_KEY="$key" \
    RATE_LIMIT_PER_SECOND=0 SIMULATED_LATENCY_MS="$latency" RUST_LOG=warn \
    "$binary" serve > "$dir/service.log" 2>&1 &
  service=$!
  for _ in $(seq 1 600); do
    curl -fsS "http://127.0.0.1:$service_port/readyz" > /dev/null 2>&1 && return 0
    sleep 0.1
  done
  cat "$dir/service.log" >&2
  exit 1
}
delta() { # before after → "transactions xids wal_bytes"
  read -r t0 x0 w0 <<< "$1"
  read -r t1 x1 w1 <<< "$2"
  echo "$((t1 - t0)) $((x1 - x0)) $(psql_db "SELECT pg_wal_lsn_diff('$w1', '$w0')::bigint")"
}

# Idle: as long as the load runs (warm-up included), nobody creating jobs.
before="$(sample)"
start_service
sleep "$((seconds + 2))"
stop_service
idle="$(delta "$before" "$(sample)")"

before="$(sample)"
start_service
line="$("${bench[@]}" load --url "http://127.0.0.1:$service_port" --admin-key "$key" \
  --scenario jobs --accounts "$accounts" --concurrency "$kiosks" --seconds "$seconds" \
  --job-delay-ms "$latency")"
stop_service
load="$(delta "$before" "$(sample)")"
grep -q 'books=ok' <<< "$line" || { echo "the books did not balance: $line" >&2; exit 1; }
jobs="$(psql_db "SELECT count(*) FROM generation_jobs WHERE status = 'succeeded'")"
open="$(psql_db "SELECT count(*) FROM generation_jobs WHERE status <> 'succeeded'")"

echo "$line"
read -r it ix iw <<< "$idle"
read -r lt lx lw <<< "$load"
echo "idle $((seconds + 2)) s: transactions=$it xids=$ix wal_bytes=$iw"
echo "load: jobs=$jobs (not succeeded: $open) transactions=$lt xids=$lx wal_bytes=$lw"
awk -v j="$jobs" -v t="$lt" -v x="$lx" -v w="$lw" -v it="$it" -v ix="$ix" -v iw="$iw" 'BEGIN {
  printf "per job: transactions=%.2f xids=%.2f wal_bytes=%.0f\n", t / j, x / j, w / j
  printf "per job, less the idle run: transactions=%.2f xids=%.2f wal_bytes=%.0f\n",
    (t - it) / j, (x - ix) / j, (w - iw) / j
}'
