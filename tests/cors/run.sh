#!/usr/bin/env bash
# CORS in a real headless Chromium: the service with CORS_ALLOWED_ORIGINS
# naming one origin (tests/lib/service.sh), kiosk.html served by a static
# server on that origin and on another port (another origin), and
# browser.py (Selenium) loading both: the allowed page runs a kiosk flow,
# the other is refused by the browser and spends nothing.
#
# Usage: tests/cors/run.sh
# Needs: python3 with selenium, chromium, chromium-driver (Debian), plus
# what tests/lib/service.sh needs.
set -euo pipefail
cd "$(dirname "$0")/../.."
root="$PWD"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
source tests/lib/service.sh
pages=()
cleanup() {
  for page in "${pages[@]}"; do kill "$page" 2>/dev/null || true; done
  stop_service
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
allowed_port="$(free_port)"
other_port="$(free_port)"
export ALLOWED_ORIGIN="http://localhost:$allowed_port"
export OTHER_ORIGIN="http://localhost:$other_port"
for port in "$allowed_port" "$other_port"; do
  python3 -m http.server "$port" --bind 127.0.0.1 --directory tests/cors > /dev/null 2>&1 &
  pages+=("$!")
done
for port in "$allowed_port" "$other_port"; do
  for _ in $(seq 1 50); do
    curl -fsS "http://127.0.0.1:$port/kiosk.html" > /dev/null 2>&1 && break
    sleep 0.1
  done
done

start_service cors CORS_ALLOWED_ORIGINS="$ALLOWED_ORIGIN" SIMULATED_LATENCY_MS=100
funded_kiosk 5

status=0
python3 tests/cors/browser.py || status=$?
if [ "$status" != 0 ]; then
  echo "cors: failed; the service's log:" >&2
  tail -n 50 "$service_log" >&2
fi
exit "$status"
