#!/usr/bin/env bash
# Runs the README's shell blocks as a newcomer would paste them, against a
# freshly started service on a fresh database.
#
# Blocks: every ```sh block of README.md, in order, and the ```sh blocks of
# docs/*.md marked `<!-- readme-test: run -->` (after the README's). A block
# marked `<!-- readme-test: skip -->` is not run (installing packages, the
# test command itself — CI runs it anyway); the block marked
# `<!-- readme-test: serve -->` is started in the background, exactly as
# written, and waited for on /readyz.
#
# The README's text leaves where the service listens and which database it
# uses to the environment, so this script, without touching the text, sets:
#   DATABASE_URL  a scratch database, dropped at the end
#   BIND_ADDR     a free port;  TB_URL  the same address for the session
#   PATH          the release build directory first, as `cargo install` would
# Every block runs in one bash (variables carry over, as in one terminal),
# with `set -euo pipefail`, and curl configured to fail on any non-2xx answer
# (a ~/.curlrc with --fail, whatever the block says). A `null` printed
# anywhere fails the run: the session prints only fields that must be set.
#
# Usage: tests/readme/run.sh
#   README_TEST_PROFILE=debug  a developer shortcut: `cargo run` instead of
#   `cargo run --release` (CI runs the README's exact text).
# Needs: cargo, PostgreSQL on 127.0.0.1:5432, curl, jq, uuidgen, python3.
set -euo pipefail
cd "$(dirname "$0")/../.."
root="$PWD"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
profile="${README_TEST_PROFILE:-release}"

scratch="$(mktemp -d)"
blocks="$scratch/blocks"
mkdir -p "$blocks"
python3 - "$blocks" README.md docs/*.md <<'PY'
import os, re, sys
out = sys.argv[1]
count = 0
for path in sys.argv[2:]:
    readme = os.path.basename(path) == "README.md"
    marker = None
    lines = open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"\s*<!--\s*readme-test:\s*(\w+)\s*-->\s*$", line)
        if m:
            marker = m.group(1)
            i += 1
            continue
        if line.startswith("```"):
            fence_info = line[3:].strip()
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            body = "\n".join(lines[i + 1 : j]) + "\n"
            kind = None
            if fence_info == "sh":
                if marker == "skip":
                    kind = None
                elif marker == "serve":
                    kind = "serve"
                elif readme or marker == "run":
                    kind = "run"
            if kind:
                count += 1
                name = f"{count:02d}-{kind}-{os.path.basename(path)}.sh"
                open(os.path.join(out, name), "w", encoding="utf-8").write(body)
            marker = None
            i = j + 1
            continue
        if line.strip():
            marker = None
        i += 1
if count == 0:
    sys.exit("no shell blocks found")
PY

serve_blocks=("$blocks"/*-serve-*.sh)
[ "${#serve_blocks[@]}" = 1 ] && [ -f "${serve_blocks[0]}" ] || {
  echo "README.md must have exactly one block marked readme-test: serve" >&2
  exit 1
}
serve_command="$(cat "${serve_blocks[0]}")"
if [ "$profile" = debug ]; then
  serve_command="${serve_command//cargo run --release/cargo run}"
fi

port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
database="tb_readme_$$"
export DATABASE_URL="postgres://postgres@127.0.0.1:5432/$database"
# psql and the other libpq tools connect by these (the docs never put a
# connection string on their command lines).
export PGHOST=127.0.0.1 PGPORT=5432 PGUSER=postgres PGDATABASE="$database"
export BIND_ADDR="127.0.0.1:$port"
export TB_URL="http://127.0.0.1:$port"
export PATH="$CARGO_TARGET_DIR/$profile:$PATH"
export CURL_HOME="$scratch"
printf -- '--fail\n--show-error\n--silent\n' > "$scratch/.curlrc"

server=""
cleanup() {
  status=$?
  if [ -n "$server" ]; then
    kill -TERM -- "-$server" 2> /dev/null || true
    for _ in $(seq 1 50); do kill -0 -- "-$server" 2> /dev/null || break; sleep 0.1; done
    kill -KILL -- "-$server" 2> /dev/null || true
  fi
  psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS $database WITH (FORCE)" postgres > /dev/null || true
  rm -rf "$scratch"
  exit "$status"
}
trap cleanup EXIT

echo "readme: starting the service as written: $serve_command"
setsid bash -c "$serve_command" > "$scratch/serve.log" 2>&1 &
server=$!
# A cold release build takes minutes: wait while the command is alive.
until curl -fsS "$TB_URL/readyz" > /dev/null 2>&1; do
  if ! kill -0 "$server" 2> /dev/null; then
    echo "readme: the serve command ended before the service was ready:" >&2
    tail -n 40 "$scratch/serve.log" >&2
    exit 1
  fi
  sleep 0.5
done
echo "readme: service ready on $TB_URL"

session="$scratch/session.sh"
{
  echo 'set -euo pipefail'
  for block in "$blocks"/*-run-*.sh; do
    printf 'echo "readme: --- block %s"\n' "$(basename "$block")"
    cat "$block"
  done
} > "$session"
output="$scratch/session.out"
if ! bash "$session" 2>&1 | tee "$output"; then
  echo "readme: a block failed (see above)" >&2
  exit 1
fi
if grep -nw null "$output"; then
  echo "readme: a block printed null (see the lines above)" >&2
  exit 1
fi
echo "readme: $(ls "$blocks"/*-run-*.sh | wc -l) blocks ran as written, no error, no null"
