#!/usr/bin/env bash
# End-to-end test of the console (/console) in a real headless Chromium:
# builds the service, starts it on a fresh database on the PostgreSQL at
# 127.0.0.1:5432 and a free port, runs tests/console/e2e.py (Selenium) against
# it, then stops the service and drops the database.
#
# Usage: tests/console/run.sh
#   CONSOLE_SCREENSHOTS  where the screenshots go (default ci-output/console)
#   CONSOLE_TEST_PROFILE release | debug (default debug, the build CI has)
# Needs: cargo, PostgreSQL, python3 with selenium, chromium, chromium-driver
# (Debian: apt-get install -y chromium chromium-driver; pip install selenium).
set -euo pipefail
cd "$(dirname "$0")/../.."
root="$PWD"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
profile="${CONSOLE_TEST_PROFILE:-debug}"
export CONSOLE_SCREENSHOTS="${CONSOLE_SCREENSHOTS:-$root/ci-output/console}"
mkdir -p "$CONSOLE_SCREENSHOTS"

if [ "$profile" = release ]; then
  cargo build --release --bin token-billing
else
  cargo build --bin token-billing
fi
binary="$CARGO_TARGET_DIR/$profile/token-billing"

scratch="$(mktemp -d)"
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
database="tb_console_e2e_$$"
database_url="postgres://postgres@127.0.0.1:5432/$database"
# A random admin key for this run only; never printed.
admin_key="console-e2e-$(python3 -c 'import secrets; print(secrets.token_hex(16))')"
server=""
cleanup() {
  if [ -n "$server" ] && kill -0 "$server" 2>/dev/null; then
    kill -TERM "$server"
    wait "$server" || true
  fi
  psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS $database WITH (FORCE)" || true
  rm -rf "$scratch"
}
trap cleanup EXIT

DATABASE_URL="$database_url" BIND_ADDR="127.0.0.1:$port" ADMIN_API_KEY="$admin_key" \
  SIMULATED_LATENCY_MS=200 RUST_LOG=warn \
  "$binary" serve > "$scratch/serve.log" 2>&1 &
server=$!
for _ in $(seq 1 150); do
  curl -fsS "http://127.0.0.1:$port/readyz" > /dev/null 2>&1 && break
  kill -0 "$server" 2>/dev/null || break
  sleep 0.2
done
if ! curl -fsS "http://127.0.0.1:$port/readyz" > /dev/null; then
  echo "console e2e: the service did not become ready" >&2
  cat "$scratch/serve.log" >&2
  exit 1
fi

status=0
TB_URL="http://127.0.0.1:$port" TB_ADMIN_KEY="$admin_key" CONSOLE_DOWNLOADS="$scratch/downloads" \
  python3 tests/console/e2e.py || status=$?
if [ "$status" != 0 ]; then
  echo "console e2e: failed; the service's log:" >&2
  tail -n 50 "$scratch/serve.log" >&2
fi
exit "$status"
