#!/usr/bin/env bash
# Service vs PostgreSQL on the same SQL, side by side in one run.
#
# For each scenario (spread: 1,000 accounts; hot: one account) and each
# concurrency, runs `token-billing bench load` against a release build of
# the service, then pgbench -M prepared with the script printed by
# `token-billing bench pgbench-script` (written from the very statements the
# service executes for one reserve→commit cycle) at the same concurrency, and prints cycles/s of both and their ratio. The
# jobs scenario has no pgbench twin; it is reported on its own.
#
# Usage: bench/compare.sh [seconds per run, default 10] [concurrencies, default "8 32 64"]
# Needs: a release build (cargo build --release), PostgreSQL on 127.0.0.1:5432.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-10}"
concurrencies="${2:-8 32 64}"
binary="${CARGO_TARGET_DIR:-target}/release/token-billing"
[ -x "$binary" ] || { echo "build first: cargo build --release" >&2; exit 1; }
server_url="postgres://postgres@127.0.0.1:5432"
key="bench-admin-key-0123456789"
port=18090
service_db="tb_bench_service"
pgbench_db="tb_bench_pgbench"
service_pid=""
script="$(mktemp)"
"$binary" bench pgbench-script > "$script"
psql_admin() { psql -h 127.0.0.1 -U postgres -qtAc "$1" postgres; }

start_service() {
  psql_admin "DROP DATABASE IF EXISTS $service_db WITH (FORCE)"
  # One kiosk key drives hundreds of requests per second here: no rate limit.
  DATABASE_URL="$server_url/$service_db" BIND_ADDR="127.0.0.1:$port" ADMIN_API_KEY="$key" RATE_LIMIT_PER_SECOND=0 \
    RUST_LOG=warn "$binary" serve > /tmp/token-billing-bench.log 2>&1 &
  service_pid=$!
  for _ in $(seq 1 100); do
    curl -fsS "http://127.0.0.1:$port/readyz" > /dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "the service did not start" >&2; cat /tmp/token-billing-bench.log >&2; exit 1
}

stop_service() {
  kill -TERM "$service_pid" 2> /dev/null || true
  wait "$service_pid" 2> /dev/null || true
}
trap 'stop_service; rm -f "$script"' EXIT

seed_pgbench() {
  psql_admin "DROP DATABASE IF EXISTS $pgbench_db WITH (FORCE)"
  "$binary" --database-url "$server_url/$pgbench_db" migrate > /dev/null 2>&1
  psql -h 127.0.0.1 -U postgres -d "$pgbench_db" -v accounts="$1" -qf bench/seed.sql
}

printf '%-8s %-5s %12s %12s %7s %9s %9s %9s %8s\n' scenario conc service/s pgbench/s ratio p50_ms p99_ms max_ms rss_mib
for scenario in spread hot; do
  accounts=1000; [ "$scenario" = hot ] && accounts=1
  for concurrency in $concurrencies; do
    start_service
    line="$("$binary" bench load --url "http://127.0.0.1:$port" --admin-key "$key" --scenario "$scenario" \
      --accounts "$accounts" --concurrency "$concurrency" --seconds "$seconds" --service-pid "$service_pid")"
    stop_service
    service_rate="$(sed -n 's/.*cycles_per_s=\([0-9.]*\).*/\1/p' <<< "$line")"
    p50="$(sed -n 's/.*p50_ms=\([0-9.]*\).*/\1/p' <<< "$line")"
    p99="$(sed -n 's/.*p99_ms=\([0-9.]*\).*/\1/p' <<< "$line")"
    max="$(sed -n 's/.*max_ms=\([0-9.]*\).*/\1/p' <<< "$line")"
    rss="$(sed -n 's/.*peak_rss_mib=\([0-9.a-z/]*\).*/\1/p' <<< "$line")"
    seed_pgbench "$accounts"
    pgbench_rate="$(pgbench -h 127.0.0.1 -U postgres -n -M prepared -c "$concurrency" -j 2 -T "$seconds" \
      -D accounts="$accounts" -f "$script" "$pgbench_db" 2> /dev/null \
      | sed -n 's/^tps = \([0-9.]*\).*/\1/p')"
    ratio="$(python3 -c "print(f'{$service_rate / $pgbench_rate:.2f}')")"
    printf '%-8s %-5s %12.0f %12.0f %7s %9s %9s %9s %8s\n' "$scenario" "$concurrency" "$service_rate" "$pgbench_rate" "$ratio" "$p50" "$p99" "$max" "$rss"
  done
done
for concurrency in $concurrencies; do
  start_service
  line="$("$binary" bench load --url "http://127.0.0.1:$port" --admin-key "$key" --scenario jobs \
    --concurrency "$concurrency" --seconds "$seconds" --service-pid "$service_pid")"
  stop_service
  echo "jobs: $line"
done
psql_admin "DROP DATABASE IF EXISTS $service_db WITH (FORCE)"
psql_admin "DROP DATABASE IF EXISTS $pgbench_db WITH (FORCE)"
