#!/usr/bin/env bash
# What jobs cost the primary while they wait for the provider: CPU of the
# PostgreSQL processes, WAL per second and transactions per second, with
# JOBS jobs in flight (claimed, their provider call running) and nothing
# else happening.
#
# Usage:
#   bench/jobs_in_flight.sh [--jobs N] [--accounts A] [--replicas R] [--window S] [--latency-ms MS]
# Defaults: 2,000 jobs from 200 accounts on 2 replicas (one replica runs at
# most 1,024 workers, WORKER_CONCURRENCY), a 240 s simulated provider (±50 %:
# none ends before 120 s), a 90 s measuring window; release build (cargo build --release; BIN names
# another directory). JOB_LEASE_SECONDS (default 30: a heartbeat tick every
# 15 s) comes from the environment like the service's other settings.
#
# A private cluster (initdb in a temporary directory, port
# IN_FLIGHT_PORT, default 5474; the main cluster is not touched). The
# replicas start, the jobs are created as fast as the replicas take them
# (a burst, not a closed loop: with a closed loop of 200 kiosks at most 200
# jobs are ever in flight), and once every job is `running` the window
# opens: the cluster's CPU (user + system time of the postmaster and all
# its children, from /proc), the WAL position and the database's
# transaction counters are read at its start and end. The provider's
# latency is longer than creating the jobs plus the window, so nothing
# finishes inside it. Everything it made is removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

jobs=2000 accounts=200 replicas=2 window=90 latency=240000
while [ $# -gt 0 ]; do
  case "$1" in
    --jobs) jobs="$2"; shift ;;
    --accounts) accounts="$2"; shift ;;
    --replicas) replicas="$2"; shift ;;
    --window) window="$2"; shift ;;
    --latency-ms) latency="$2"; shift ;;
    *) sed -n '8,9p' "$0" >&2; exit 2 ;;
  esac
  shift
done

bin="${BIN:-${CARGO_TARGET_DIR:-target}/release}"
binary="$bin/token-billing"
[ -x "$binary" ] || { echo "build first ($binary missing)" >&2; exit 1; }
. bench/private_cluster.sh
port="${IN_FLIGHT_PORT:-5474}"
key="in-flight-admin-key-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
dir="$(mktemp -d /tmp/tb-in-flight.XXXXXX)"
services=()
cleanup() {
  for service in "${services[@]}"; do kill -TERM "$service" 2> /dev/null || true; done
  for service in "${services[@]}"; do wait "$service" 2> /dev/null || true; done
  private_cluster_stop "$dir"
  rm -rf "$dir"
}
trap cleanup EXIT

private_cluster_start "$dir" "$port" "max_connections = 200"
psql_db() { psql -h 127.0.0.1 -p "$port" -U postgres -v ON_ERROR_STOP=1 -qtA -d tb_in_flight -c "$1"; }
database_url="postgres://postgres@127.0.0.1:$port/tb_in_flight"
"$binary" --database-url "$database_url" migrate > /dev/null 2>&1

urls=()
for replica in $(seq 1 "$replicas"); do
  service_port=$((18110 + replica))
  DATABASE_URL="$database_url" BIND_ADDR="127.0.0.1:$service_port" ADMIN_API_KEY="$key" \
    RATE_LIMIT_PER_SECOND=0 WORKER_CONCURRENCY=1024 SIMULATED_LATENCY_MS="$latency" \
    PROVIDER_TIMEOUT_SECONDS=$((latency / 1000 + 30)) \
    RESERVATION_TTL_SECONDS=$((3 * (latency / 1000 + 30))) RUST_LOG=warn \
    "$binary" serve > "$dir/service-$replica.log" 2>&1 &
  services+=($!)
  urls+=("http://127.0.0.1:$service_port")
done
for url in "${urls[@]}"; do
  for _ in $(seq 1 600); do
    curl -fsS "$url/readyz" > /dev/null 2>&1 && break
    sleep 0.1
  done
  curl -fsS "$url/readyz" > /dev/null || { cat "$dir"/service-*.log >&2; exit 1; }
done

# Accounts, funded, and the burst of jobs: each account's jobs alternate
# between the replicas; 64 requests at a time.
created_at="$(date +%s.%N)"
python3 - "$key" "$jobs" "$accounts" "${urls[@]}" <<'PY'
import json, sys, uuid, urllib.request
from concurrent.futures import ThreadPoolExecutor

key, jobs, accounts, urls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]

def post(url, path, body):
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as answer:
        return json.load(answer)

def account(n):
    made = post(urls[0], "/v1/accounts", {"name": f"in-flight kiosk {n}"})
    post(urls[0], f"/v1/accounts/{made['account_id']}/credits",
         {"amount": jobs, "external_ref": f"in-flight-{made['account_id']}"})
    return made["account_id"]

with ThreadPoolExecutor(16) as pool:
    ids = list(pool.map(account, range(accounts)))

def job(n):
    url = urls[n % len(urls)]
    post(url, f"/v1/accounts/{ids[n % len(ids)]}/jobs",
         {"request_id": str(uuid.uuid4()), "kind": "standard", "params": {}})

with ThreadPoolExecutor(64) as pool:
    list(pool.map(job, range(jobs)))
PY
for _ in $(seq 1 1200); do
  running="$(psql_db "SELECT count(*) FROM generation_jobs WHERE status = 'running'")"
  [ "$running" -ge "$jobs" ] && break
  sleep 0.1
done
[ "$running" -ge "$jobs" ] || { echo "only $running of $jobs jobs running" >&2; exit 1; }
ready_after="$(awk -v a="$created_at" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')"

postmaster="$(head -n 1 "$dir/data/postmaster.pid")"
ticks="$(getconf CLK_TCK)"
# User + system CPU ticks of the postmaster and its children (live ones;
# the replicas' pooled connections live through the window).
cluster_ticks() {
  local total=0 pid fields
  for pid in "$postmaster" $(pgrep -P "$postmaster"); do
    fields="$(cut -d ')' -f 2- "/proc/$pid/stat" 2> /dev/null)" || continue
    total=$((total + $(awk '{ print $12 + $13 }' <<< "$fields")))
  done
  echo "$total"
}
sample() { private_cluster_sample "$port" tb_in_flight; }
read -r t0 x0 w0 <<< "$(sample)"
c0="$(cluster_ticks)"
began="$(date +%s.%N)"
sleep "$window"
c1="$(cluster_ticks)"
ended="$(date +%s.%N)"
read -r t1 x1 w1 <<< "$(sample)"
wal="$(psql_db "SELECT pg_wal_lsn_diff('$w1', '$w0')::bigint")"
finished="$(psql_db "SELECT count(*) FROM generation_jobs WHERE status IN ('succeeded', 'failed')")"
still="$(psql_db "SELECT count(*) FROM generation_jobs WHERE status = 'running'")"
[ "$finished" = 0 ] || echo "warning: $finished jobs finished inside the window" >&2

awk -v jobs="$jobs" -v still="$still" -v replicas="$replicas" -v ready="$ready_after" \
    -v c="$((c1 - c0))" -v hz="$ticks" -v b="$began" -v e="$ended" \
    -v t="$((t1 - t0))" -v x="$((x1 - x0))" -v w="$wal" 'BEGIN {
  s = e - b
  printf "in flight: %d jobs (%d running through the window) on %d replicas, all claimed %.1f s after the first create\n", jobs, still, replicas, ready
  printf "window %.1f s: primary CPU %.1f %% of one core; WAL %.1f kB/s; %.1f transactions/s (%.1f with a transaction id)\n",
    s, 100 * c / hz / s, w / s / 1000, t / s, x / s
  printf "per job in flight: %.1f bytes of WAL/s, %.4f write transactions/s, %.3f ms of primary CPU/s\n",
    w / s / jobs, x / s / jobs, 1000 * c / hz / s / jobs
}'
# Where the WAL of the window went (the record types writing the most).
echo "WAL of the window by record type (pg_waldump --stats=record), the largest:"
as_postgres "$pg_bin/pg_waldump" --stats=record -p "$dir/data/pg_wal" -s "$w0" -e "$w1" 2> /dev/null \
  | sed 's/([^)]*)//g' | awk 'NR > 2 && $1 != "Total" && NF == 5 {
      printf "  %-28s %8d records %10d bytes (full-page images %d)\n", $1, $2, $5, $4 }' \
  | sort -k4 -rn | head -n 6 || true
