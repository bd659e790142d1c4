#!/usr/bin/env bash
# The OpenAPI document as a TypeScript integrator uses it: starts the
# service (tests/lib/service.sh), generates clients from its /openapi.json
# with openapi-typescript and @hey-api/openapi-ts (from the npm registry,
# versions locked in package-lock.json; no flag), compiles it with a small kiosk (kiosk.ts,
# openapi-fetch as the transport) and type-level assertions (types.ts:
# always-sent members required and nullable, Retry-After a string, events
# a union by `type` with their `data` typed, problems typed by status and
# code; client_events.ts: the TypeScript client's `Event` union has each
# type's `data` members as the document has them; hey_api.ts: the same
# document through @hey-api/openapi-ts, its event union and job members) under
# `tsc --strict`, checks the `servers` entry, runs that kiosk
# against the service (one guest action, charged once, its retry a replay),
# and checks that each line of misspelled.ts marked MISSPELLED fails to
# compile, and that the file compiles once the misspelling is corrected.
#
# Usage: tests/openapi_ts/run.sh        Needs: node and npm, plus what
# tests/lib/service.sh needs.
set -euo pipefail
cd "$(dirname "$0")/../.."
root="$PWD"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
source tests/lib/service.sh
trap stop_service EXIT

start_service openapi_ts PRICE_LIST="standard=1,hd=2" SIMULATED_LATENCY_MS=50
funded_kiosk 5

cd tests/openapi_ts
npm ci --no-audit --no-fund --loglevel=error
rm -rf generated build
mkdir -p generated
curl -fsS "$TB_URL/openapi.json" -o generated/openapi.json
npx --no-install openapi-typescript generated/openapi.json -o generated/schema.d.ts
echo "openapi_ts: generated $(wc -l < generated/schema.d.ts) lines of types"

npx --no-install tsc --strict -p tsconfig.json
echo "openapi_ts: the generated client, kiosk.ts and the type assertions of types.ts compile under tsc --strict"
npx --no-install tsc --strict -p tsconfig.client.json
echo "openapi_ts: the TypeScript client's Event union matches the generated one, type by type (client_events.ts)"
# The second generator: @hey-api/openapi-ts (types, SDK and its fetch client).
npx --no-install openapi-ts -i ./generated/openapi.json -o ./generated/hey-api > "$service_scratch/hey-api.log" 2>&1 \
  || { cat "$service_scratch/hey-api.log" >&2; exit 1; }
npx --no-install tsc --strict -p tsconfig.hey-api.json
echo "openapi_ts: the @hey-api/openapi-ts client and hey_api.ts (events a union by type) compile under tsc --strict"
# hey-api and others type the client's base URL from `servers`.
node -e 'const d = require("./generated/openapi.json");
  if (!Array.isArray(d.servers) || d.servers.length === 0 || typeof d.servers[0].url !== "string") {
    console.error("openapi_ts: the document has no servers entry"); process.exit(1);
  }'
echo "openapi_ts: servers entry present"
node build/kiosk.js

# Every MISSPELLED line fails, with an error on that very line.
expected="$(grep -n '// MISSPELLED$' misspelled.ts | cut -d: -f1 | sort -n | tr '\n' ' ')"
if npx --no-install tsc -p tsconfig.misspelled.json > "$service_scratch/misspelled.txt" 2>&1; then
  echo "openapi_ts: misspelled.ts compiled; a misspelled status must not" >&2
  exit 1
fi
cat "$service_scratch/misspelled.txt"
failed="$(grep -o '^misspelled.ts([0-9]*' "$service_scratch/misspelled.txt" | cut -d'(' -f2 | sort -un | tr '\n' ' ')"
if [ "$failed" != "$expected" ]; then
  echo "openapi_ts: errors on lines '$failed', expected exactly on '$expected'" >&2
  exit 1
fi
# The control: spelled right, the same file compiles.
sed -e 's/sucseeded/succeeded/' -e 's/balanse_low/balance_low/' -e 's/balanses/balances/' \
  -e 's/"account.balance_low" ? event.data.credit/"credit.created" ? event.data.credit/' misspelled.ts > corrected.ts
sed 's/misspelled.ts/corrected.ts/' tsconfig.misspelled.json > tsconfig.corrected.json
status=0
npx --no-install tsc -p tsconfig.corrected.json || status=$?
rm -f corrected.ts tsconfig.corrected.json
if [ "$status" != 0 ]; then
  echo "openapi_ts: misspelled.ts, spelled right, does not compile" >&2
  exit 1
fi
echo "openapi_ts: ok (each misspelled status refused on its line: $expected)"
