#!/usr/bin/env bash
# Service vs PostgreSQL on the same SQL, side by side in one run.
#
# For each scenario (spread: 1,000 accounts; hot: one account) and each
# concurrency, runs `token-billing-tools bench load` against a release build of
# the service, then pgbench -M prepared with the script printed by
# `token-billing-tools bench pgbench-script` (written from the very statements the
# service executes for one reserve→commit cycle) at the same concurrency.
# Each pair runs `rounds` times, alternating; the table shows medians and
# the ratio of the medians (the machine is shared and noisy). On the hot
# account the service runs twice per round: as configured (group commit,
# COALESCE_MAX_BATCH=32) and one by one (COALESCE_MAX_BATCH=1), the latter
# executing exactly pgbench's statements. The jobs scenario has no pgbench
# twin; it is reported on its own.
#
# Usage: bench/compare.sh [seconds per run, default 8] [concurrencies, default "8 32 64"] [rounds, default 3]
# Needs: a release build (cargo build --release), PostgreSQL on 127.0.0.1:5432.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-8}"
concurrencies="${2:-8 32 64}"
rounds="${3:-3}"
binary="${CARGO_TARGET_DIR:-target}/release/token-billing"
tools="${CARGO_TARGET_DIR:-target}/release/token-billing-tools"
[ -x "$binary" ] && [ -x "$tools" ] || { echo "build first: cargo build --release" >&2; exit 1; }
server_url="postgres://postgres@127.0.0.1:5432"
key="bench-admin-key-0123456789"
port=18090
service_db="tb_bench_service"
pgbench_db="tb_bench_pgbench"
service_pid=""
script="$(mktemp)"
results="$(mktemp)"
"$tools" bench pgbench-script > "$script"
psql_admin() { psql -h 127.0.0.1 -U postgres -qtAc "$1" postgres > /dev/null 2>&1; }

start_service() { # extra environment, e.g. COALESCE_MAX_BATCH=1
  psql_admin "DROP DATABASE IF EXISTS $service_db WITH (FORCE)"
  # One kiosk key drives hundreds of requests per second here: no rate limit.
  env "$@" DATABASE_URL="$server_url/$service_db" BIND_ADDR="127.0.0.1:$port" ADMIN_API_KEY="$key" \
    RATE_LIMIT_PER_SECOND=0 RUST_LOG=warn "$binary" serve > /tmp/token-billing-bench.log 2>&1 &
  service_pid=$!
  for _ in $(seq 1 100); do
    curl -fsS "http://127.0.0.1:$port/readyz" > /dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "the service did not start" >&2; cat /tmp/token-billing-bench.log >&2; exit 1
}

stop_service() {
  [ -n "$service_pid" ] || return 0
  kill -TERM "$service_pid" 2> /dev/null || true
  wait "$service_pid" 2> /dev/null || true
  service_pid=""
}
trap 'stop_service; rm -f "$script" "$results"' EXIT

# One service run: prints the load generator's line (key=value pairs).
service_run() { # scenario accounts concurrency [extra environment]
  local scenario="$1" accounts="$2" concurrency="$3"
  shift 3
  start_service "$@"
  "$tools" bench load --url "http://127.0.0.1:$port" --admin-key "$key" --scenario "$scenario" \
    --accounts "$accounts" --concurrency "$concurrency" --seconds "$seconds" --service-pid "$service_pid"
  stop_service
}

pgbench_run() { # accounts concurrency
  psql_admin "DROP DATABASE IF EXISTS $pgbench_db WITH (FORCE)"
  "$binary" --database-url "$server_url/$pgbench_db" migrate > /dev/null 2>&1
  psql -h 127.0.0.1 -U postgres -d "$pgbench_db" -v accounts="$1" -qf bench/seed.sql > /dev/null
  # The same 2 s warm-up as the load generator's (a fresh database's first
  # seconds pay for full-page writes), then the measured run.
  pgbench -h 127.0.0.1 -U postgres -n -M prepared -c "$2" -j 2 -T 2 \
    -D accounts="$1" -f "$script" "$pgbench_db" > /dev/null 2>&1
  pgbench -h 127.0.0.1 -U postgres -n -M prepared -c "$2" -j 2 -T "$seconds" \
    -D accounts="$1" -f "$script" "$pgbench_db" 2> /dev/null | sed -n 's/^tps = \([0-9.]*\).*/\1/p'
}

field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p" <<< "$2"; }

for scenario in spread hot; do
  accounts=1000; [ "$scenario" = hot ] && accounts=1
  for concurrency in $concurrencies; do
    for round in $(seq 1 "$rounds"); do
      line="$(service_run "$scenario" "$accounts" "$concurrency")"
      grep -q 'books=ok' <<< "$line" || { echo "books did not balance: $line" >&2; exit 1; }
      one_by_one=""
      if [ "$scenario" = hot ]; then
        single="$(service_run "$scenario" "$accounts" "$concurrency" COALESCE_MAX_BATCH=1)"
        grep -q 'books=ok' <<< "$single" || { echo "books did not balance: $single" >&2; exit 1; }
        one_by_one="$(field cycles_per_s "$single")"
      fi
      echo "$scenario $concurrency $round $(field cycles_per_s "$line") ${one_by_one:-0} $(pgbench_run "$accounts" "$concurrency") $(field p50_ms "$line") $(field p99_ms "$line") $(field max_ms "$line") $(field peak_rss_mib "$line")" >> "$results"
    done
  done
done

python3 - "$results" "$rounds" << 'EOF'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
print(f"{'scenario':8} {'conc':>4} {'service/s':>10} {'pgbench/s':>10} {'ratio':>6} {'1-by-1/s':>9} {'ratio':>6} "
      f"{'p50_ms':>7} {'p99_ms':>7} {'max_ms':>7} {'rss_mib':>7}   (medians of {sys.argv[2]} rounds)")
groups = {}
for row in rows:
    groups.setdefault((row[0], int(row[1])), []).append([float(v) for v in row[3:]])
for (scenario, concurrency), runs in groups.items():
    median = lambda i: statistics.median(run[i] for run in runs)
    service, single, pgbench = median(0), median(1), median(2)
    single_text = f"{single:9.0f} {single / pgbench:6.2f}" if single else f"{'-':>9} {'-':>6}"
    print(f"{scenario:8} {concurrency:4} {service:10.0f} {pgbench:10.0f} {service / pgbench:6.2f} {single_text} "
          f"{median(3):7.2f} {median(4):7.2f} {median(5):7.2f} {max(run[6] for run in runs):7.1f}")
EOF

for concurrency in $concurrencies; do
  echo "jobs: $(service_run jobs 1 "$concurrency")"
done
psql_admin "DROP DATABASE IF EXISTS $service_db WITH (FORCE)"
psql_admin "DROP DATABASE IF EXISTS $pgbench_db WITH (FORCE)"
