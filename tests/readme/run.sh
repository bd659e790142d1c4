#!/usr/bin/env bash
# Runs the README's shell blocks as a newcomer would paste them, against a
# freshly started service on a fresh database.
#
# Blocks: every ```sh block of README.md, in order, and the ```sh blocks of
# docs/*.md marked `<!-- readme-test: run -->` (after the README's; a block
# inside a list item is read dedented; tests/repository/docs_blocks.rs holds
# every block of docs/ to a marker, run or skip). A block
# marked `<!-- readme-test: skip -->` is not run (installing packages, the
# test command itself — CI runs it anyway); the block marked
# `<!-- readme-test: serve -->` is started in the background, exactly as
# written, and waited for on /readyz. A ```crontab block marked
# `<!-- readme-test: cron -->` (docs/backup.md) is run after the session as
# cron would run it: its `NAME=value` lines are its environment (PATH with
# the build directory first), each schedule line's command runs once, in
# order, with /bin/sh, `\%` read as `%`, HOME a scratch directory and
# DATABASE_URL the session's (the line a crontab adds for it).
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
        stripped = line.lstrip(" ")
        if stripped.startswith("```"):
            # A block inside a list item is indented: read it dedented.
            indent = len(line) - len(stripped)
            fence_info = stripped[3:].strip()
            j = i + 1
            while j < len(lines) and not lines[j].lstrip(" ").startswith("```"):
                j += 1
            body = "\n".join(
                l[indent:] if l[:indent].strip() == "" else l for l in lines[i + 1 : j]
            ) + "\n"
            kind = None
            if fence_info == "crontab" and marker == "cron":
                kind = "cron"
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
# The blocks run in a directory of their own, as a reader's shell would be
# anywhere: files they write (a month-end CSV) stay out of the checkout.
# The repository's scripts a block names (tests/backup/…) are linked in.
workdir="$scratch/work"
mkdir -p "$workdir"
ln -s "$root/tests" "$workdir/tests"
if ! (cd "$workdir" && bash "$session") 2>&1 | tee "$output"; then
  echo "readme: a block failed (see above)" >&2
  exit 1
fi
if grep -nw null "$output"; then
  echo "readme: a block printed null (see the lines above)" >&2
  exit 1
fi

cron_blocks=0
for block in "$blocks"/*-cron-*.sh; do
  [ -f "$block" ] || continue
  cron_blocks=$((cron_blocks + 1))
  cron_home="$scratch/cron-home-$cron_blocks"
  mkdir -p "$cron_home"
  # One script per crontab: its variables, then each command as cron's
  # /bin/sh would get it (a schedule of five fields, `\%` → `%`).
  python3 - "$block" "$CARGO_TARGET_DIR/$profile" > "$scratch/cron-$cron_blocks.sh" <<'PY'
import re, shlex, sys
block, build = sys.argv[1], sys.argv[2]
commands = 0
for line in open(block, encoding="utf-8").read().split("\n"):
    line = line.strip()
    if not line or line.startswith("#"):
        continue
    variable = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)$", line)
    if variable:
        name, value = variable.groups()
        if name == "PATH":
            value = f"{build}:{value}"
        print(f"export {name}={shlex.quote(value)}")
        continue
    fields = line.split(None, 5)
    if len(fields) < 6 or not all(re.match(r"^[0-9*/,-]+$", f) for f in fields[:5]):
        sys.exit(f"not a crontab line (five schedule fields and a command): {line}")
    command = fields[5].replace("\\%", "%")
    print(f"echo {shlex.quote('readme: cron: ' + command)}")
    print(f"/bin/sh -c {shlex.quote(command)} || {{ echo \"readme: the cron line failed: exit $?\" >&2; exit 1; }}")
    commands += 1
if commands == 0:
    sys.exit("a cron block without a schedule line")
PY
  env -i HOME="$cron_home" DATABASE_URL="$DATABASE_URL" LOGNAME=root SHELL=/bin/sh \
    bash -euo pipefail "$scratch/cron-$cron_blocks.sh"
  records="$cron_home/token-billing-records"
  [ -s "$records/ledger-digests.jsonl" ] \
    && jq -e '.format == "sha256-chain-v2"' "$records/ledger-digests.jsonl" > /dev/null \
    || { echo "readme: the cron block kept no ledger digest" >&2; exit 1; }
  # JSON Lines: as many lines as digests.
  [ "$(wc -l < "$records/ledger-digests.jsonl")" = "$(jq -c . "$records/ledger-digests.jsonl" | wc -l)" ] \
    || { echo "readme: ledger-digests.jsonl is not one digest per line" >&2; exit 1; }
  csv="$(ls "$records"/reconciliation-*.csv)"
  head -n 1 "$csv" | grep -q '^account_id,name,status,' && tail -n 1 "$csv" | grep -q '^totals,' \
    || { echo "readme: the cron block's reconciliation CSV is not one: $csv" >&2; exit 1; }
  echo "readme: cron block $cron_blocks ran as cron would: $(ls "$records" | tr '\n' ' ')"
done
[ "$cron_blocks" -ge 1 ] || { echo "readme: no cron block (docs/backup.md has one)" >&2; exit 1; }

echo "readme: $(ls "$blocks"/*-run-*.sh | wc -l) blocks ran as written, no error, no null"
