#!/usr/bin/env bash
# Reserve throughput with and without a flood of webhook deliveries.
#
# Each round runs the spread scenario (`token-billing-bench load`,
# 1,000 accounts) twice on a fresh database, alternating. In both, when the
# measured window opens, `events` credits land in one engine batch on a side
# account: that many credit.created events while the kiosks reserve.
#   without  no webhook endpoint: the events are written, nothing is sent;
#   flood    an endpoint subscribed to every event type, pointing at
#            `token-billing-bench webhook-sink` (answers 204 at once):
#            the relay and the senders deliver all of them meanwhile.
# So the ratio is the cost of delivering, not of writing, the events.
# Prints each run, then the medians and their ratio, and for the flood runs
# how long after the window opened the last event was delivered.
#
# Usage: bench/webhook_flood.sh [seconds, default 10] [concurrency, default 8] [rounds, default 3] [events, default 10000]
# Needs: a release build (cargo build --release), PostgreSQL on 127.0.0.1:5432.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-10}"
concurrency="${2:-8}"
rounds="${3:-3}"
events="${4:-10000}"
binary="${CARGO_TARGET_DIR:-target}/release/token-billing"
bench="${CARGO_TARGET_DIR:-target}/release/token-billing-bench"
[ -x "$binary" ] && [ -x "$bench" ] || { echo "build first: cargo build --release" >&2; exit 1; }
key="bench-admin-key-0123456789"
port=18091
sink_port=18099
database="tb_bench_webhooks"
database_url="postgres://postgres@127.0.0.1:5432/$database"
service_pid=""
sink_pid=""
results="$(mktemp)"

stop() {
  for pid in "$service_pid" "$sink_pid"; do
    [ -n "$pid" ] && { kill -TERM "$pid" 2> /dev/null || true; wait "$pid" 2> /dev/null || true; }
  done
  service_pid=""; sink_pid=""
}
trap 'stop; rm -f "$results"' EXIT

start() {
  psql -h 127.0.0.1 -U postgres -qtAc "DROP DATABASE IF EXISTS $database WITH (FORCE)" postgres > /dev/null
  DATABASE_URL="$database_url" BIND_ADDR="127.0.0.1:$port" ADMIN_API_KEY="$key" RATE_LIMIT_PER_SECOND=0 \
    WEBHOOK_ALLOW_PRIVATE_URLS=true RUST_LOG=warn "$binary" serve > /tmp/token-billing-webhook-bench.log 2>&1 &
  service_pid=$!
  for _ in $(seq 1 100); do
    curl -fsS "http://127.0.0.1:$port/readyz" > /dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "the service did not start" >&2; cat /tmp/token-billing-webhook-bench.log >&2; exit 1
}

api() { # method path body
  curl -fsS -X "$1" "http://127.0.0.1:$port$2" -H "Authorization: Bearer $key" \
    -H 'Content-Type: application/json' -d "$3"
}

field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p" <<< "$2"; }

for round in $(seq 1 "$rounds"); do
  for mode in without flood; do
    start
    if [ "$mode" = flood ]; then
      "$bench" webhook-sink --bind "127.0.0.1:$sink_port" > /dev/null 2>&1 &
      sink_pid=$!
      for _ in $(seq 1 50); do curl -fsS "http://127.0.0.1:$sink_port/count" > /dev/null 2>&1 && break; sleep 0.1; done
      api POST /v1/webhook-endpoints "{\"url\": \"http://127.0.0.1:$sink_port/hook\", \"events\": [\"credit.created\", \"adjustment.created\", \"reservation.expired\", \"job.succeeded\", \"job.failed\", \"account.balance_low\", \"account.balance_recovered\", \"account.balance_depleted\"]}" > /dev/null
    fi
    side="$(api POST /v1/accounts '{"name": "flood"}' | sed -n 's/.*"account_id":"\([^"]*\)".*/\1/p')"
    # $events credits of 1 token in one engine batch (one engine_request
    # per credit; see src/engine/sql/70_apply.sql), through the schema of
    # the engine the service installed.
    flood_sql="SELECT set_config('search_path', 'public, ' || (SELECT name FROM engine_schemas ORDER BY last_started_at DESC LIMIT 1), false); \
      SELECT count(*) FROM engine_apply(ARRAY(SELECT ROW('credit', '$side'::uuid, 'bench', NULL, NULL, true, \
        NULL, 1, NULL, NULL, gen_random_uuid(), NULL, NULL, NULL, NULL, NULL, 'flood-' || g, NULL, NULL, NULL, \
        NULL, NULL, NULL, NULL, 50, NULL, NULL, NULL)::engine_request FROM generate_series(1, $events) g))"
    on_measure=(--on-measure "date +%s.%N > /tmp/token-billing-flood-start; psql -h 127.0.0.1 -U postgres -qtAc \"$flood_sql\" $database > /dev/null")
    line="$("$bench" load --url "http://127.0.0.1:$port" --admin-key "$key" --scenario spread \
      --accounts 1000 --concurrency "$concurrency" --seconds "$seconds" --service-pid "$service_pid" "${on_measure[@]}")"
    grep -q 'books=ok' <<< "$line" || { echo "books did not balance: $line" >&2; exit 1; }
    drained="-"
    if [ "$mode" = flood ]; then
      for _ in $(seq 1 1200); do
        distinct="$(curl -fsS "http://127.0.0.1:$sink_port/count" | sed -n 's/.*"distinct":\([0-9]*\).*/\1/p')"
        [ "${distinct:-0}" -ge "$events" ] && break
        sleep 0.1
      done
      [ "${distinct:-0}" -ge "$events" ] || { echo "only ${distinct:-0} of $events events delivered" >&2; exit 1; }
      drained="$(python3 -c "import sys,time; print(f'{time.time() - float(open(\"/tmp/token-billing-flood-start\").read()):.1f}')")"
    fi
    echo "$mode round=$round cycles_per_s=$(field cycles_per_s "$line") p99_ms=$(field p99_ms "$line") delivered_all_after_s=$drained"
    echo "$mode $(field cycles_per_s "$line") $(field p99_ms "$line") $drained" >> "$results"
    stop
  done
done
psql -h 127.0.0.1 -U postgres -qtAc "DROP DATABASE IF EXISTS $database WITH (FORCE)" postgres > /dev/null

python3 - "$results" "$events" "$seconds" << 'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
def median(mode, column):
    return statistics.median(float(row[column]) for row in rows if row[0] == mode)
without, flood = median("without", 1), median("flood", 1)
print(f"spread reserve→commit cycles/s while {sys.argv[2]} events are written, medians: "
      f"no endpoint {without:.0f}, all delivered to an endpoint meanwhile {flood:.0f}: "
      f"ratio {flood / without:.2f}")
print(f"p99 ms: {median('without', 2):.2f} vs {median('flood', 2):.2f}; all events delivered "
      f"{median('flood', 3):.1f} s (median) after the window opened ({sys.argv[3]} s window)")
PY
