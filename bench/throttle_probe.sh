#!/usr/bin/env bash
# The attacker model of docs/security.md, measured: the release service at
# its default throttle settings (and, where said, a smaller failure table)
# against `token-billing-bench throttle-probe`, one fresh service and
# database per run. Every client is named in X-Forwarded-For by a trusted
# proxy (TRUSTED_PROXIES=127.0.0.1/32), so one machine can be 100,000
# clients. Prints each run's summary line.
#
# Usage: bench/throttle_probe.sh [seconds a run, default 60]
# Needs: a release build (cargo build --release), PostgreSQL on 127.0.0.1:5432.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
binary="${CARGO_TARGET_DIR:-target}/release/token-billing"
bench="${CARGO_TARGET_DIR:-target}/release/token-billing-bench"
[ -x "$binary" ] && [ -x "$bench" ] || { echo "build first: cargo build --release" >&2; exit 1; }
key="bench-admin-key-0123456789"
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
database="tb_bench_throttle_$$"
service_pid=""
log="$(mktemp)"

stop() {
  if [ -n "$service_pid" ]; then
    kill -TERM "$service_pid" 2> /dev/null || true
    wait "$service_pid" 2> /dev/null || true
  fi
  service_pid=""
  psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS $database WITH (FORCE)" > /dev/null
}
trap 'stop; rm -f "$log"' EXIT

# run NAME [VAR=value ...] -- [probe flags ...]
run() {
  local name="$1"
  shift
  local environment=()
  while [ "$1" != "--" ]; do environment+=("$1"); shift; done
  shift
  stop
  env DATABASE_URL="postgres://postgres@127.0.0.1:5432/$database" BIND_ADDR="127.0.0.1:$port" \
    ADMIN_API_KEY="$key" TRUSTED_PROXIES=127.0.0.1/32 RUST_LOG=warn "${environment[@]}" \
    "$binary" serve > "$log" 2>&1 &
  service_pid=$!
  for _ in $(seq 1 150); do
    curl -fsS "http://127.0.0.1:$port/readyz" > /dev/null 2>&1 && break
    sleep 0.2
  done
  echo "== $name ${environment[*]}"
  local length=(--seconds "$seconds")
  case " $* " in *" --seconds "*) length=() ;; esac
  BENCH_ADMIN_KEY="$key" "$bench" throttle-probe --url "http://127.0.0.1:$port" \
    "${length[@]}" "$@" | tail -n 1
}

# (a) Guessing keys.
run "one IPv4 address" -- --addresses 1
run "10,000 addresses of one /64" -- --addresses 10000 --spread one-64
run "1,000 IPv4 addresses" -- --addresses 1000
run "1,000 IPv4 addresses, 3 minutes" -- --addresses 1000 --seconds 180
run "1,000 /64s" -- --addresses 1000 --spread many-64
run "1,100 addresses, a table of 1,000" AUTH_FAILURE_TRACKED_MAX=1000 -- --addresses 1100
run "110 addresses for 10 s, a table of 100" AUTH_FAILURE_TRACKED_MAX=100 -- \
  --addresses 110 --seconds 10
# (b) Locking out a kiosk.
run "a web page at the venue (60/s)" -- --kiosks --anonymous-per-second 60 --addresses 0
run "a web page at the venue (1,000/s)" -- --kiosks --anonymous-per-second 1000 --addresses 0
run "a guesser at the venue" -- --kiosks --from-the-venue
run "the table held full (1,000), the venue not in it" AUTH_FAILURE_TRACKED_MAX=1000 -- \
  --kiosks --addresses 1100
