#!/usr/bin/env bash
# The TypeScript kiosk client (clients/typescript) against the real service:
#
#   1. the README's pack block as written (npm ci, then `npm pack`, whose
#      prepack compiles dist): the tarball holds dist/, src/*.ts, README.md
#      and package.json only, and every source map resolves inside it
#      (sourcemaps.mjs);
#   2. a fresh directory outside the clone runs the README's install block
#      as written (`npm install ./token-billing-kiosk-<version>.tgz`; no
#      runtime dependency may come with it) and compiles a consumer
#      against its types with tsc --strict;
#   3. node --test clients/typescript/test/*.test.mjs: the journal, the retry rules
#      against a scripted server, the client against the service (starts it:
#      tests/lib/service.sh), and the kill points (KILL_RUNS, KILL_SEED);
#   4. the package as a web page on another origin loads it, in headless
#      Chromium (browser.py): IndexedDB journal, a guest action charged
#      once, an entry journaled but never sent resumed after a reload;
#   5. the README's web page (its copy block, index.html and booth.js as
#      written, in the fresh directory) under the console's CSP, in
#      headless Chromium (webpage.py): a press makes one job, charged once,
#      and nothing violates the policy;
#   6. the README's kiosk loop, as written, in a fleet of 6 booths on an
#      account that allows 1 held reservation (tests/client/fleet.sh).
#   7. a fleet of 20 booths on an account whose top-up rule is in mode
#      request (topup-fleet.mjs, the host's billing system answering each
#      request 1.5 s late): every sold-out booth learns within 1 s (p99)
#      that a top-up is on its way.
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

readme=clients/typescript/README.md
block() { python3 tests/typescript/readme_block.py "$readme" "$1"; }

echo "typescript: the README's pack block, as written, in the clone (npm ci, npm pack: prepack builds dist)"
rm -f clients/typescript/token-billing-kiosk-*.tgz
bash -euo pipefail -c "$(block pack)"
tarballs=(clients/typescript/token-billing-kiosk-*.tgz)
[ "${#tarballs[@]}" = 1 ] && [ -f "${tarballs[0]}" ] || { echo "typescript: npm pack made ${tarballs[*]}" >&2; exit 1; }
tarball="$(basename "${tarballs[0]}")"
mv "${tarballs[0]}" "$service_scratch/$tarball"
echo "typescript: packed $tarball ($(tar -tzf "$service_scratch/$tarball" | wc -l) files)"
if tar -tzf "$service_scratch/$tarball" | grep -Ev '^package/(dist/|src/[a-z]+\.ts$|README.md$|package.json$)'; then
  echo "typescript: the package ships files beyond dist/, src/*.ts, README.md and package.json" >&2
  exit 1
fi
mkdir -p "$service_scratch/unpacked"
tar -xzf "$service_scratch/$tarball" -C "$service_scratch/unpacked"
node tests/typescript/sourcemaps.mjs "$service_scratch/unpacked/package"

# A fresh directory outside the clone, as a kiosk's project: the README's
# install block as written, next to the tarball (a name other than the
# README's, such as a new version, fails here).
consumer="$service_scratch/consumer"
mkdir -p "$consumer"
cp "$service_scratch/$tarball" "$consumer/"
typescript_version="$(node -p 'require("./clients/typescript/package-lock.json").packages["node_modules/typescript"].version')"
types_version="$(node -p 'require("./clients/typescript/package-lock.json").packages["node_modules/@types/node"].version')"
(
  cd "$consumer"
  printf '{"name":"consumer","private":true,"type":"module"}\n' > package.json
  echo "typescript: the README's install block, as written, in $consumer"
  bash -euo pipefail -c "$(cd "$root" && block install)"
  [ ! -L node_modules/token-billing-kiosk ] || { echo "typescript: the package was linked, not installed" >&2; exit 1; }
  # For compiling the consumers and the README's loop (not the package's).
  npm install --no-audit --no-fund --loglevel=error "typescript@$typescript_version" "@types/node@$types_version"
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
# The README's reservations block, as written, on a kiosk it declares.
{
  printf 'import type { Kiosk } from "token-billing-kiosk";\ndeclare const kiosk: Kiosk;\n'
  block reservations
} > "$consumer/reservations.mts"
# The README's webhooks block, as written, with the names it assumes.
{
  printf 'declare const secret: string;\ndeclare function showLowTokens(available: number): void;\n'
  block webhooks
} > "$consumer/webhooks.mts"
(cd "$consumer" && cp "$root/tests/typescript/consumer.tsconfig.json" tsconfig.json && node_modules/.bin/tsc -p tsconfig.json)
echo "typescript: a consumer compiles against the installed package under tsc --strict"

# A page origin for the browser step: clients/typescript/dist and browser.html.
www="$service_scratch/www"
mkdir -p "$www"
ln -s "$root/clients/typescript/dist" "$www/dist"
ln -s "$root/tests/typescript/browser.html" "$www/browser.html"
page_port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
export PAGE_ORIGIN="http://localhost:$page_port"
web_port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
export WEB_ORIGIN="http://localhost:$web_port"
python3 -m http.server "$page_port" --bind 127.0.0.1 --directory "$www" > /dev/null 2>&1 &
page_server=$!
trap 'kill "$page_server" 2> /dev/null || true; stop_service' EXIT

start_service typescript SIMULATED_LATENCY_MS=300 WEBHOOK_ALLOW_PRIVATE_URLS=true CORS_ALLOWED_ORIGINS="$PAGE_ORIGIN,$WEB_ORIGIN"
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

echo "typescript: the README's web page, as written, under the console's CSP in headless Chromium"
(
  cd "$consumer"
  bash -euo pipefail -c "$(cd "$root" && block web-copy)"
  for file in www/index.html www/booth.js; do
    (cd "$root" && block "web-page $file") > "$file"
  done
)
funded_kiosk 5
WWW="$consumer/www" python3 tests/typescript/webpage.py

echo "typescript: the README's kiosk loop in a fleet of 6 booths, 1 reservation at a time"
tests/client/fleet.sh clients/typescript/README.md typescript "$root/tests/typescript/run-ts.sh" "$consumer"

echo "typescript: a request-mode fleet of 20 booths: every sold-out booth learns of the open top-up (p99 ≤ 1 s)"
node tests/typescript/topup-fleet.mjs
echo "typescript: ok; ${SECONDS}s in all"
