#!/usr/bin/env bash
# What a read replica takes off the primary: the primary's CPU while
# finance runs reconciliation reports over 1,000,000 ledger entries under
# kiosk load, with DATABASE_READ_URL unset (the reports read the primary)
# and set to a streaming standby. Private clusters on ports 5445 / 5446
# (never the main cluster), one service, `token-billing-bench load`
# as the kiosks.
#
# Usage: bench/read_replica.sh [seconds of load, default 20] [reports, default 3]
# Needs: root (PostgreSQL's tools run as the postgres user), a build of the
# service and the load generators (BENCH_PROFILE=release for release figures), curl, jq.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-20}"
reports="${2:-3}"
build="${CARGO_TARGET_DIR:-target}/${BENCH_PROFILE:-debug}"
[ -x "$build/token-billing" ] && [ -x "$build/token-billing-bench" ] || { echo "build first: cargo build" >&2; exit 1; }
pg_bin=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)}
primary_port=5445
standby_port=5446
mode=async
# shellcheck source=tests/failover/pair.sh
source tests/failover/pair.sh
service_pid=""
stop_service() {
  [ -n "$service_pid" ] || return 0
  kill -TERM "$service_pid" 2> /dev/null || true
  wait "$service_pid" 2> /dev/null || true
  service_pid=""
}
trap 'stop_service; cleanup' EXIT
build_pair
database=tb_bench_read_replica
primary_url="postgres://postgres@127.0.0.1:$primary_port/$database"
standby_url="postgres://postgres@127.0.0.1:$standby_port/$database"
"$build/token-billing-bench" --database-url "$primary_url" reconciliation \
  --accounts 10000 --entries-per-account 100 --runs 1
# The standby has replayed everything before the measurement starts.
for _ in $(seq 1 600); do
  behind=$(psql -h 127.0.0.1 -p "$primary_port" -U postgres -qtAc \
    "SELECT pg_current_wal_lsn() - replay_lsn FROM pg_stat_replication")
  [ "$behind" = "0" ] && break
  sleep 0.1
done

key="bench-admin-key-0123456789"
port=18097
# CPU seconds (user + system) of every process of the primary cluster.
primary_cpu_seconds() {
  local postmaster ticks=0
  postmaster=$(head -n 1 "$dir/primary/postmaster.pid")
  for pid in "$postmaster" $(pgrep -P "$postmaster"); do
    [ -r "/proc/$pid/stat" ] || continue
    ticks=$((ticks + $(awk '{print $14 + $15 + $16 + $17}' "/proc/$pid/stat")))
  done
  awk -v t="$ticks" -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "%.2f", t / hz}'
}

measure() { # label [DATABASE_READ_URL]
  local label=$1 read_url=${2:-}
  env ${read_url:+DATABASE_READ_URL="$read_url"} DATABASE_URL="$primary_url" \
    BIND_ADDR="127.0.0.1:$port" ADMIN_API_KEY="$key" RATE_LIMIT_PER_SECOND=0 RUST_LOG=warn \
    "$build/token-billing" serve > "$dir/serve-$label.log" 2>&1 &
  service_pid=$!
  for _ in $(seq 1 100); do
    curl -fsS "http://127.0.0.1:$port/readyz" > /dev/null 2>&1 && break
    sleep 0.1
  done
  local finance
  finance=$(curl -fsS -X POST "http://127.0.0.1:$port/v1/api-keys" -H "Authorization: Bearer $key" \
    -H 'Content-Type: application/json' -d '{"scope": "finance", "label": "bench"}' | jq -r .key)
  "$build/token-billing-bench" load --url "http://127.0.0.1:$port" --admin-key "$key" \
    --scenario spread --concurrency 8 --seconds "$seconds" --accounts 100 > "$dir/load-$label.txt" &
  local load=$!
  sleep 4   # the load generator's set-up and warm-up
  local before after started elapsed
  before=$(primary_cpu_seconds)
  started=$(date +%s.%N)
  for _ in $(seq 1 "$reports"); do
    curl -fsS -o /dev/null -H "Authorization: Bearer $finance" \
      "http://127.0.0.1:$port/v1/reconciliation?from=$(date -u -d '31 days ago' +%Y-%m-%dT%H:%M:%SZ)&to=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  done
  elapsed=$(awk -v s="$started" -v e="$(date +%s.%N)" 'BEGIN {printf "%.2f", e - s}')
  after=$(primary_cpu_seconds)
  wait "$load"
  stop_service
  local cycles
  cycles=$(sed -n 's/.*cycles_per_s=\([0-9.]*\).*/\1/p' "$dir/load-$label.txt" | head -n 1)
  awk -v l="$label" -v b="$before" -v a="$after" -v e="$elapsed" -v c="${cycles:-n/a}" -v r="$reports" \
    'BEGIN {printf "| %s | %d | %.1f | %.1f | %.2f | %s |\n", l, r, e, a - b, (a - b) / e, c}'
}

echo "| reports read from | reports | wall s | primary CPU s | primary cores busy | kiosk cycles/s (whole run) |"
echo "|---|---|---|---|---|---|"
measure primary
measure replica "$standby_url"
