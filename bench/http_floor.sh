#!/usr/bin/env bash
# The floor under the engine: what the service reaches over HTTP when its
# engine costs nothing, beside the service itself and the fixed hand-written
# reference, in one run.
#
# Usage:
#   bench/http_floor.sh [--kiosks "2 8"] [--seconds S] [--rounds R]
# Defaults: 2 and 8 kiosks, spread over 1,000 accounts, 4 s, 3 rounds.
# Needs a release build (cargo build --release) and the PostgreSQL server
# packages (initdb, pgbench).
#
# Each round runs, in alternating order, on a private cluster (initdb in a
# temporary directory, port HTTP_FLOOR_PORT, default 5493, autovacuum off;
# removed at the end; the main cluster is not touched):
#   - reference: bench/reference_cycle.pgbench.sql (the fixed hand-written
#     reserve → commit, one request per transaction) under pgbench, on a
#     fresh seeded database;
#   - service: the release service on a fresh database, driven by
#     `token-billing-tools bench load --scenario spread`;
#   - floor: the same, except that once the load generator has set up its
#     accounts (its first reservation is in the table), engine_apply in the
#     service's engine schema is replaced by bench/engine_noop.sql: every
#     operation answered as if applied, one row written per batch so the
#     commit still flushes WAL. What remains is HTTP, the load generator,
#     the service's Rust, the pool, the round trip and the commit: the
#     most any engine could reach on this stack. (Its books line means
#     nothing: nothing was booked.)
# Printed: cycles/s medians per cell, and service / reference,
# floor / reference, service / floor. When floor / reference is below a
# target for service / reference, no engine reaches that target on this
# stack and machine.
set -euo pipefail
cd "$(dirname "$0")/.."

kiosk_counts="2 8" seconds=4 rounds=3
while [ $# -gt 0 ]; do
  case "$1" in
    --kiosks) kiosk_counts="$2"; shift ;;
    --seconds) seconds="$2"; shift ;;
    --rounds) rounds="$2"; shift ;;
    *) sed -n '5,10p' "$0" >&2; exit 2 ;;
  esac
  shift
done

target="${CARGO_TARGET_DIR:-target}/release"
binary="$target/token-billing" tools="$target/token-billing-tools"
[ -x "$binary" ] && [ -x "$tools" ] || { echo "build first: cargo build --release" >&2; exit 1; }
. bench/private_cluster.sh
port="${HTTP_FLOOR_PORT:-5493}" http=18093 key="bench-admin-key-0123456789"
dir="$(mktemp -d /tmp/tb-http-floor.XXXXXX)"
service=""
cleanup() {
  [ -z "$service" ] || { kill -TERM "$service" 2> /dev/null; wait "$service" 2> /dev/null || true; }
  private_cluster_stop "$dir"
  rm -rf "$dir"
}
trap cleanup EXIT
private_cluster_start "$dir" "$port" "autovacuum = off"
pg=(-X -q -h 127.0.0.1 -p "$port" -U postgres -v ON_ERROR_STOP=1)
admin() { PGOPTIONS="-c client_min_messages=warning" psql "${pg[@]}" -d postgres -c "$1" > /dev/null; }

# The reference's seeded template.
admin "CREATE DATABASE tb_floor_template"
"$binary" --database-url "postgres://postgres@127.0.0.1:$port/tb_floor_template" migrate > /dev/null
psql "${pg[@]}" -d tb_floor_template -v accounts=1000 -f bench/reference_seed.sql > /dev/null

reference_run() { # kiosks
  admin "DROP DATABASE IF EXISTS tb_floor_reference WITH (FORCE)"
  admin "CREATE DATABASE tb_floor_reference TEMPLATE tb_floor_template"
  local output
  for duration in 2 "$seconds"; do # the load generator's 2 s warm-up, then the run
    output="$(pgbench -h 127.0.0.1 -p "$port" -U postgres -n -M prepared -c "$1" -j 2 -T "$duration" \
      -D accounts=1000 -f bench/reference_cycle.pgbench.sql tb_floor_reference 2>&1)"
  done
  sed -n 's/^tps = \([0-9.]*\).*/\1/p' <<< "$output"
}

service_run() { # kiosks noop(0|1)
  admin "DROP DATABASE IF EXISTS tb_floor_service WITH (FORCE)"
  local url="postgres://postgres@127.0.0.1:$port/tb_floor_service"
  DATABASE_URL="$url" BIND_ADDR="127.0.0.1:$http" ADMIN_API_KEY="$key" RATE_LIMIT_PER_SECOND=0 \
    RUST_LOG=warn "$binary" serve > "$dir/service.log" 2>&1 &
  service=$!
  for _ in $(seq 1 600); do
    curl -fsS "http://127.0.0.1:$http/readyz" > /dev/null 2>&1 && break
    sleep 0.1
  done
  "$tools" bench load --url "http://127.0.0.1:$http" --admin-key "$key" --scenario spread \
    --accounts 1000 --concurrency "$1" --seconds "$seconds" --service-pid "$service" \
    > "$dir/load.out" 2>&1 &
  local load=$!
  if [ "$2" = 1 ]; then
    local held=0
    for _ in $(seq 1 1200); do
      held="$(psql "${pg[@]}" -d tb_floor_service -tAc "SELECT count(*) FROM reservations" 2> /dev/null || echo 0)"
      [ "${held:-0}" -gt 0 ] && break
      sleep 0.05
    done
    local schema
    schema="$(psql "${pg[@]}" -d tb_floor_service -tAc \
      "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'engine\\_%'")"
    PGOPTIONS="-c search_path=$schema,public" psql "${pg[@]}" -d tb_floor_service \
      -f bench/engine_noop.sql > /dev/null
  fi
  wait "$load" || true
  kill -TERM "$service"; wait "$service" 2> /dev/null || true; service=""
  grep -o 'cycles_per_s=[0-9.]*' "$dir/load.out" | cut -d= -f2 \
    || { echo "bench load failed:" >&2; cat "$dir/load.out" "$dir/service.log" >&2; exit 1; }
}

results="$dir/results"
for kiosks in $kiosk_counts; do
  for round in $(seq 1 "$rounds"); do
    order="reference service floor"
    [ $((round % 2)) = 0 ] && order="floor service reference"
    for what in $order; do
      case "$what" in
        reference) figure="$(reference_run "$kiosks")" ;;
        service) figure="$(service_run "$kiosks" 0)" ;;
        floor) figure="$(service_run "$kiosks" 1)" ;;
      esac
      echo "$kiosks $round $what $figure" | tee -a "$results" >&2
    done
  done
done

python3 - "$results" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
cells = {}
for kiosks, _, what, figure in rows:
    cells.setdefault(int(kiosks), {}).setdefault(what, []).append(float(figure))
print("| kiosks | reference | service | floor (engine costs nothing) | service / reference | floor / reference | service / floor |")
print("|---|---|---|---|---|---|---|")
for kiosks, cell in sorted(cells.items()):
    r, s, f = (statistics.median(cell[w]) for w in ("reference", "service", "floor"))
    print(f"| {kiosks} | {r:,.0f} | {s:,.0f} | {f:,.0f} | **{s / r:.2f}** | **{f / r:.2f}** | {s / f:.2f} |")
PY
