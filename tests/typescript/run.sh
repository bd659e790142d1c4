#!/usr/bin/env bash
# The TypeScript kiosk client (clients/typescript) against the real service:
#
#   1. npm ci + tsc in clients/typescript (devDependencies from the npm
#      registry, locked), then `npm pack`: the tarball a user would install;
#   2. a scratch project installs it by the repository path, as its README
#      says (`npm install <repo>/clients/typescript`; no other package but
#      typescript and @types/node for compiling) and compiles a consumer
#      against its types with tsc --strict;
#   3. node --test clients/typescript/test/*.test.mjs: the journal, the retry rules
#      against a scripted server, the client against the service (starts it:
#      tests/lib/service.sh), and the kill points (KILL_RUNS, KILL_SEED);
#   4. the package as a web page on another origin loads it, in headless
#      Chromium (browser.py): IndexedDB journal, a guest action charged
#      once, an entry journaled but never sent resumed after a reload;
#   5. the README's kiosk loop, as written, in a fleet of 6 booths on an
#      account that allows 1 held reservation (tests/client/fleet.sh).
#
# Usage: tests/typescript/run.sh        Needs: node ≥ 20 and npm, chromium,
# chromium-driver and selenium (as tests/console), plus what
# tests/lib/service.sh needs.
set -euo pipefail
cd "$(dirname "$0")/../.."
root="$PWD"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
source tests/lib/service.sh
trap stop_service EXIT

echo "typescript: npm ci and build clients/typescript"
(cd clients/typescript && npm ci --no-audit --no-fund --loglevel=error && npx --no-install tsc -p tsconfig.json)
tarball="$(cd clients/typescript && npm pack --silent --pack-destination "$service_scratch")"
echo "typescript: packed $tarball ($(tar -tzf "$service_scratch/$tarball" | wc -l) files)"
if tar -tzf "$service_scratch/$tarball" | grep -Ev '^package/(dist/|README.md$|package.json$)'; then
  echo "typescript: the package ships files beyond dist/, README.md and package.json" >&2
  exit 1
fi

consumer="$service_scratch/consumer"
mkdir -p "$consumer"
typescript_version="$(node -p 'require("./clients/typescript/package-lock.json").packages["node_modules/typescript"].version')"
types_version="$(node -p 'require("./clients/typescript/package-lock.json").packages["node_modules/@types/node"].version')"
(
  cd "$consumer"
  printf '{"name":"consumer","private":true,"type":"module"}\n' > package.json
  # As the README says: by the repository path (the tarball's contents were
  # checked above).
  npm install --no-audit --no-fund --loglevel=error "$root/clients/typescript" \
    "typescript@$typescript_version" "@types/node@$types_version"
  deps="$(node -p 'Object.keys(require("./node_modules/token-billing-kiosk/package.json").dependencies ?? {}).join(",")')"
  if [ -n "$deps" ]; then
    echo "typescript: the package has runtime dependencies: $deps" >&2
    exit 1
  fi
)
cat > "$consumer/consumer.mts" <<'TS'
import { InsufficientTokens, Kiosk, MemoryJournalStore, type Job, type JobStatus } from "token-billing-kiosk";
import { FileJournalStore } from "token-billing-kiosk/node";
import { IndexedDbJournalStore } from "token-billing-kiosk/browser";

export async function demo(): Promise<JobStatus> {
  const kiosk = await Kiosk.open({ baseUrl: "http://x", apiKey: "k", accountId: crypto.randomUUID(), journal: new MemoryJournalStore() });
  const job: Job = await kiosk.generate("standard", { prompt: "p" });
  const stores = [FileJournalStore.open, IndexedDbJournalStore.open];
  void stores;
  try { await kiosk.balance(); } catch (error) { if (error instanceof InsufficientTokens) return "failed"; }
  return job.status;
}
TS
(cd "$consumer" && cp "$root/tests/typescript/consumer.tsconfig.json" tsconfig.json && node_modules/.bin/tsc -p tsconfig.json)
echo "typescript: a consumer compiles against the installed package under tsc --strict"

# A page origin for the browser step: clients/typescript/dist and browser.html.
www="$service_scratch/www"
mkdir -p "$www"
ln -s "$root/clients/typescript/dist" "$www/dist"
ln -s "$root/tests/typescript/browser.html" "$www/browser.html"
page_port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
export PAGE_ORIGIN="http://localhost:$page_port"
python3 -m http.server "$page_port" --bind 127.0.0.1 --directory "$www" > /dev/null 2>&1 &
page_server=$!
trap 'kill "$page_server" 2> /dev/null || true; stop_service' EXIT

start_service typescript SIMULATED_LATENCY_MS=300 CORS_ALLOWED_ORIGINS="$PAGE_ORIGIN"
echo "typescript: node --test clients/typescript/test/ (${SECONDS}s so far)"
set +e
(cd clients/typescript && node --test --test-reporter=spec test/*.test.mjs) 2>&1 | tee "$service_scratch/node-test.out"
status=${PIPESTATUS[0]}
set -e
if [ "$status" != 0 ] || ! grep -Eq ' pass [1-9][0-9]*$' "$service_scratch/node-test.out"; then
  echo "typescript: node --test failed; the service's last log lines:" >&2
  tail -n 30 "$service_log" >&2
  exit 1
fi

echo "typescript: the package in a web page, IndexedDB journal, headless Chromium"
funded_kiosk 5
python3 tests/typescript/browser.py

echo "typescript: the README's kiosk loop in a fleet of 6 booths, 1 reservation at a time"
tests/client/fleet.sh clients/typescript/README.md typescript "$root/tests/typescript/run-ts.sh" "$consumer"
echo "typescript: ok; ${SECONDS}s in all"
