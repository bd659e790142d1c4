#!/usr/bin/env bash
# What credit grants cost reserve→commit: the same load, side by side in one
# run, on
#   - base: a build from before grants (BASE_BIN; fixed, built once from
#     the commit before grants landed, so it never moves with the code);
#   - 1 grant: this build, each account credited once (one grant);
#   - 3 grants: this build, each account credited three times (priorities
#     0, 50, 100; the first two expire in 30 and 60 days), so spending
#     draws from one grant after another, and every spend looks for lapsed
#     grants among two that will lapse.
# Scenarios spread (1,000 accounts) and hot (one account), 8 and 32 kiosks,
# ROUNDS rounds (default 2) in turn, SECONDS_EACH of load each (default 10);
# prints the medians and each one's ratio to base.
#
# Usage:
#   BASE_BIN=/path/to/old/release bench/grants_compare.sh
# Build the base once (any directory outside this checkout):
#   git worktree add /tmp/tb-base 3498948   # main before grants (BENCHMARKS.md)
#   (cd /tmp/tb-base && cargo build --release)
#   BASE_BIN=/tmp/tb-base/target/release bench/grants_compare.sh
# BIN names this build's directory (default $CARGO_TARGET_DIR/release or
# target/release). Uses PostgreSQL at 127.0.0.1:5432 (database
# tb_bench_grants, dropped before each run and at the end).
set -euo pipefail
cd "$(dirname "$0")/.."

rounds="${ROUNDS:-2}"
seconds="${SECONDS_EACH:-10}"
bin="${BIN:-${CARGO_TARGET_DIR:-target}/release}"
base="${BASE_BIN:?BASE_BIN: the release directory of a build from before grants}"
for file in "$bin/token-billing" "$base/token-billing"; do
  [ -x "$file" ] || { echo "build first ($file missing)" >&2; exit 1; }
done
. bench/load_generator.sh
load_generator "$bin" || exit 1
port=18190
key="grants-bench-key-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
database="tb_bench_grants"
server_url="postgres://postgres@127.0.0.1:5432"
service_pid=""
results="$(mktemp)"
psql_admin() { PGOPTIONS="-c client_min_messages=warning" psql -h 127.0.0.1 -U postgres -v ON_ERROR_STOP=1 -qtAc "$1" postgres > /dev/null; }

start_service() { # binary directory
  psql_admin "DROP DATABASE IF EXISTS $database WITH (FORCE)"
  DATABASE_URL="$server_url/$database" BIND_ADDR="127.0.0.1:$port" ADMIN_API_KEY="$key" \
    RATE_LIMIT_PER_SECOND=0 RUST_LOG=warn "$1/token-billing" serve > /tmp/token-billing-grants-bench.log 2>&1 &
  service_pid=$!
  for _ in $(seq 1 600); do
    curl -fsS "http://127.0.0.1:$port/readyz" > /dev/null 2>&1 && return 0
    sleep 0.1
  done
  cat /tmp/token-billing-grants-bench.log >&2
  exit 1
}
stop_service() {
  [ -n "$service_pid" ] || return 0
  kill -TERM "$service_pid" 2> /dev/null || true
  wait "$service_pid" 2> /dev/null || true
  service_pid=""
}
cleanup() {
  stop_service
  rm -f "$results"
  psql_admin "DROP DATABASE IF EXISTS $database WITH (FORCE)" || true
}
trap cleanup EXIT

run() { # label binary-directory grants scenario kiosks
  start_service "$2"
  local line
  # The load generator of this build for all three (it knows --grants; with
  # 1 it sends what an older service understands).
  line="$("${bench[@]}" load --url "http://127.0.0.1:$port" --admin-key "$key" \
    --scenario "$4" --accounts 1000 --concurrency "$5" --seconds "$seconds" --grants "$3")" \
    || { stop_service; echo "the load generator failed ($1 $4 $5): $line" >&2; exit 1; }
  stop_service
  grep -q 'books=ok' <<< "$line" || { echo "the books did not balance: $line" >&2; exit 1; }
  echo "$1 $4 $5 $(sed -n 's/.*cycles_per_s=\([0-9.]*\).*/\1/p' <<< "$line") $(sed -n 's/.*p99_ms=\([0-9.]*\).*/\1/p' <<< "$line")" >> "$results"
  echo "$1 $4 $5 kiosks: $line"
}

for round in $(seq 1 "$rounds"); do
  for scenario in spread hot; do
    for kiosks in 8 32; do
      run base "$base" 1 "$scenario" "$kiosks"
      run grants1 "$bin" 1 "$scenario" "$kiosks"
      run grants3 "$bin" 3 "$scenario" "$kiosks"
    done
  done
done

python3 - "$results" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
runs = {}
for label, scenario, kiosks, cycles, p99 in rows:
    runs.setdefault((scenario, int(kiosks), label), []).append((float(cycles), float(p99)))
print("| scenario | kiosks | base cycles/s | 1 grant | ratio | 3 grants | ratio | p99 ms base / 1 / 3 |")
print("|---|---|---|---|---|---|---|---|")
for scenario in ("spread", "hot"):
    for kiosks in (8, 32):
        med = {label: statistics.median(c for c, _ in runs[(scenario, kiosks, label)])
               for label in ("base", "grants1", "grants3")}
        p99 = {label: statistics.median(p for _, p in runs[(scenario, kiosks, label)])
               for label in ("base", "grants1", "grants3")}
        print(f"| {scenario} | {kiosks} | {med['base']:.0f} | {med['grants1']:.0f} | "
              f"{med['grants1'] / med['base']:.2f} | {med['grants3']:.0f} | "
              f"{med['grants3'] / med['base']:.2f} | "
              f"{p99['base']:.1f} / {p99['grants1']:.1f} / {p99['grants3']:.1f} |")
PY
