#!/usr/bin/env bash
# Runs a TypeScript file the way a reader of clients/typescript/README.md
# would after `npm install ./clients/typescript`: compiled with tsc --strict
# in CONSUMER (a project with token-billing-kiosk installed), then run with
# node from the current directory (where its journal goes). Several booths
# may call it at once with the same file: it is compiled once (flock).
#
# Usage: tests/typescript/run-ts.sh CONSUMER FILE.mts
set -euo pipefail
consumer="$1"
file="$2"
hash="$(sha256sum "$file" | cut -c1-16)"
build="$consumer/readme-build/$hash"
(
  flock 9
  if [ ! -f "$build/program.mjs" ]; then
    mkdir -p "$build"
    cp "$file" "$build/program.mts"
    cat > "$build/tsconfig.json" <<'JSON'
{
  "compilerOptions": {
    "strict": true,
    "target": "ES2022",
    "module": "NodeNext",
    "moduleResolution": "NodeNext",
    "lib": ["ES2022", "DOM"],
    "types": ["node"],
    "skipLibCheck": false
  },
  "files": ["program.mts"]
}
JSON
    (cd "$build" && "$consumer/node_modules/.bin/tsc" -p tsconfig.json)
  fi
) 9> "$consumer/readme-build.lock"
exec node "$build/program.mjs"
