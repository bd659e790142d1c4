#!/usr/bin/env bash
# What a synchronous standby costs: the fixed reserve→commit reference
# (bench/reference_cycle.pgbench.sql, hand-written SQL, one request per
# transaction; seeded by bench/reference_seed.sql) on a private primary with a
# streaming standby (ports 5443 / 5444, never the main cluster), once with
# the primary waiting for the standby on every commit
# (synchronous_standby_names = standby1) and once without, alternating.
#
# With BENCH_PROFILE=release it then measures the service itself the same
# way: `token-billing-bench load --scenario spread` (1,000 accounts)
# against a release build serving from the same primary, synchronous
# standby vs none, alternating.
#
# Usage: bench/replication.sh [seconds per run, default 8] [concurrencies, default "8 32"] [rounds, default 3]
# Needs: root (PostgreSQL's tools run as the postgres user), a build of the
# service and the load generators (debug is enough for the pgbench part: the work
# measured is PostgreSQL's; release for the service part), pgbench.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-8}"
concurrencies="${2:-8 32}"
rounds="${3:-3}"
build="${CARGO_TARGET_DIR:-target}/${BENCH_PROFILE:-debug}"
[ -x "$build/token-billing" ] && [ -x "$build/token-billing-bench" ] || { echo "build first: cargo build" >&2; exit 1; }
pg_bin=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)}
primary_port=5443
standby_port=5444
mode=async   # the pair starts without; each run sets synchronous_standby_names itself
# shellcheck source=tests/failover/pair.sh
source tests/failover/pair.sh
build_pair
database=tb_bench_replication
url="postgres://postgres@127.0.0.1:$primary_port/$database"
"$build/token-billing" --database-url "$url" migrate > /dev/null 2>&1
psql -h 127.0.0.1 -p "$primary_port" -U postgres -d "$database" -v accounts=1000 -qf bench/reference_seed.sql > /dev/null
script="$dir/cycle.sql"
cp bench/reference_cycle.pgbench.sql "$script"
chmod 644 "$script"

set_sync() { # standby name or ''
  psql -h 127.0.0.1 -p "$primary_port" -U postgres -qtAc "ALTER SYSTEM SET synchronous_standby_names = '$1'" \
    -c "SELECT pg_reload_conf()" > /dev/null
  local expected=async
  [ -n "$1" ] && expected=sync
  for _ in $(seq 1 50); do
    [ "$(psql -h 127.0.0.1 -p "$primary_port" -U postgres -qtAc \
      "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby1'")" = "$expected" ] && return 0
    sleep 0.1
  done
  echo "the standby did not become $expected" >&2; exit 1
}

run() { # concurrency → cycles/s
  pgbench -h 127.0.0.1 -p "$primary_port" -U postgres -n -M prepared -c "$1" -j 2 -T 2 -D accounts=1000 \
    -f "$script" "$database" > /dev/null 2>&1
  pgbench -h 127.0.0.1 -p "$primary_port" -U postgres -n -M prepared -c "$1" -j 2 -T "$seconds" -D accounts=1000 \
    -f "$script" "$database" 2>/dev/null | sed -n 's/^tps = \([0-9.]*\).*/\1/p'
}

# One table: for each concurrency, `rounds` alternating runs of the runner
# with and without the synchronous standby; medians and their ratio.
compare() { # what runner
  echo "| concurrency | $1, synchronous standby, cycles/s | $1, no synchronous standby, cycles/s | ratio |"
  echo "|---|---|---|---|"
  for concurrency in $concurrencies; do
    sync_runs=""
    async_runs=""
    for _ in $(seq 1 "$rounds"); do
      set_sync standby1
      sync_runs="$sync_runs $("$2" "$concurrency")"
      set_sync ""
      async_runs="$async_runs $("$2" "$concurrency")"
    done
    python3 - "$concurrency" "$sync_runs" "$async_runs" <<'PY'
import statistics, sys
c, s, a = sys.argv[1], [float(x) for x in sys.argv[2].split()], [float(x) for x in sys.argv[3].split()]
ms, ma = statistics.median(s), statistics.median(a)
print(f"| {c} | {ms:,.0f} | {ma:,.0f} | {ms / ma:.2f} |")
PY
  done
}

compare pgbench run

[ "${BENCH_PROFILE:-debug}" = release ] || exit 0
port=18092
key="bench-admin-key-0123456789"
service_pid=""
stop_service() {
  [ -n "$service_pid" ] && { kill -TERM "$service_pid" 2> /dev/null || true; wait "$service_pid" 2> /dev/null || true; }
  service_pid=""
}
trap 'stop_service; cleanup' EXIT
# Its own database: the pgbench one is seeded without ledger entries, which
# the load generator's closing reconciliation would rightly call a mismatch.
DATABASE_URL="postgres://postgres@127.0.0.1:$primary_port/tb_bench_replication_service" BIND_ADDR="127.0.0.1:$port" ADMIN_API_KEY="$key" RATE_LIMIT_PER_SECOND=0 RUST_LOG=warn \
  "$build/token-billing" serve > "$dir/service.log" 2>&1 &
service_pid=$!
for _ in $(seq 1 100); do curl -fsS "http://127.0.0.1:$port/readyz" > /dev/null 2>&1 && break; sleep 0.1; done
service_run() { # concurrency → cycles/s
  "$build/token-billing-bench" load --url "http://127.0.0.1:$port" --admin-key "$key" --scenario spread \
    --accounts 1000 --concurrency "$1" --seconds "$seconds" | sed -n 's/.*cycles_per_s=\([0-9.]*\).*/\1/p'
}
echo
compare service service_run
