#!/usr/bin/env bash
# The kiosk client (clients/python) against the real service: starts
# `token-billing serve` (the debug build in $CARGO_TARGET_DIR, built when
# missing) on a scratch database and a free port, makes a virtual
# environment with `pip install ./clients/python` + pytest + mypy, then:
#
#   1. mypy --strict on the package (it ships py.typed: its types are a promise);
#   2. pytest tests/client: models against /openapi.json, webhook signatures
#      (the service's deliveries and the standardwebhooks package), every typed
#      refusal, connection cuts by a proxy of the test's own, and kiosk
#      processes SIGKILLed at seeded points (KILL_RUNS, KILL_SEED);
#   3. clients/python/README.md as written: its ```sh and ```python blocks in
#      order, in one bash (a reader's terminal), in a scratch directory
#      where ./clients points to this repository's clients/;
#   4. its kiosk loop in a fleet (tests/client/fleet.sh): 6 booths at once
#      on an account that allows 1 held reservation, none may crash.
#
# Then drops the database and stops what it started. Needs python3 with
# venv, PostgreSQL on 127.0.0.1:5432 (user postgres), curl, jq, and the
# network for pip the first time.
#
# Usage: tests/client/run.sh [pytest arguments]
set -euo pipefail
cd "$(dirname "$0")/../.."
root="$PWD"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
python="${PYTHON:-python3}"
binary="$CARGO_TARGET_DIR/debug/token-billing"
if [ ! -x "$binary" ]; then
  cargo build --bin token-billing
fi

scratch="$(mktemp -d)"
port="$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
database="tb_client_$$"
admin_key="client-test-admin-$("$python" -c 'import secrets; print(secrets.token_hex(16))')"
export TB_URL="http://127.0.0.1:$port"
export TB_DATABASE_URL="postgres://postgres@127.0.0.1:5432/$database"
export TB_BINARY="$binary"
export TB_SCRATCH="$scratch"

server=""
cleanup() {
  status=$?
  if [ -n "$server" ]; then
    kill -TERM -- "-$server" 2> /dev/null || true
    for _ in $(seq 1 50); do kill -0 -- "-$server" 2> /dev/null || break; sleep 0.1; done
    kill -KILL -- "-$server" 2> /dev/null || true
  fi
  psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS $database WITH (FORCE)" postgres > /dev/null || true
  if [ "$status" != 0 ] && [ -f "$scratch/serve.log" ]; then
    echo "client: the service's last log lines:" >&2
    tail -n 30 "$scratch/serve.log" >&2
  fi
  rm -rf "$scratch"
  exit "$status"
}
trap cleanup EXIT

# Its own process group, so that cleanup stops it and nothing else.
DATABASE_URL="$TB_DATABASE_URL" BIND_ADDR="127.0.0.1:$port" ADMIN_API_KEY="$admin_key" \
  SIMULATED_LATENCY_MS=300 WEBHOOK_ALLOW_PRIVATE_URLS=true RUST_LOG=warn \
  setsid "$binary" serve > "$scratch/serve.log" 2>&1 &
server=$!
for _ in $(seq 1 150); do
  curl -fsS "$TB_URL/readyz" > /dev/null 2>&1 && break
  kill -0 "$server" 2> /dev/null || break
  sleep 0.2
done
curl -fsS "$TB_URL/readyz" > /dev/null
echo "client: service ready on $TB_URL"

"$python" -m venv "$scratch/venv"
"$scratch/venv/bin/pip" install --quiet --disable-pip-version-check ./clients/python pytest mypy standardwebhooks
echo "client: installed $("$scratch/venv/bin/pip" list --disable-pip-version-check 2> /dev/null \
  | awk '$1 == "token-billing-kiosk" || $1 == "httpx" || $1 == "mypy" { printf "%s %s  ", $1, $2 }')"

echo "client: mypy --strict clients/python/src (${SECONDS}s so far)"
"$scratch/venv/bin/mypy" --config-file clients/python/pyproject.toml --cache-dir "$scratch/mypy" \
  clients/python/src

echo "client: pytest tests/client (${SECONDS}s so far)"
set +e
if [ "$#" = 0 ]; then set -- tests/client; fi
TB_ADMIN_KEY="$admin_key" "$scratch/venv/bin/python" -m pytest -p no:cacheprovider -rfEs -s --durations=5 "$@" 2>&1 | tee "$scratch/pytest.out"
status=${PIPESTATUS[0]}
set -e
if [ "$status" = 5 ]; then
  echo "client: pytest collected no tests" >&2
  exit 1
fi
[ "$status" = 0 ] || exit "$status"
grep -Eq '^=+ [0-9]+ passed' "$scratch/pytest.out" || {
  echo "client: no pytest summary line with passed tests" >&2
  exit 1
}
if grep -Eq '^=+ .*(skipped|xfailed|deselected)' "$scratch/pytest.out"; then
  echo "client: some tests did not run (see the summary line)" >&2
  exit 1
fi

echo "client: clients/python/README.md, as written (${SECONDS}s so far)"
"$python" - "$scratch/readme-session.sh" clients/python/README.md <<'PY'
import re, sys
out, path = sys.argv[1], sys.argv[2]
lines = open(path, encoding="utf-8").read().split("\n")
session = ["set -euo pipefail"]
marker, count, i = None, 0, 0
while i < len(lines):
    line = lines[i]
    m = re.match(r"\s*<!--\s*readme-test:\s*(\w+)\s*-->\s*$", line)
    if m:
        marker = m.group(1)
    elif line.startswith("```"):
        fence = line[3:].strip()
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        body = "\n".join(lines[i + 1 : j])
        if marker != "skip" and fence in ("sh", "python"):
            count += 1
            session.append(f'echo "readme: --- block {count} ({fence}, line {i + 1})"')
            if fence == "sh":
                session.append(body)
            else:
                session.append("python - <<'README_PYTHON_BLOCK'\n" + body + "\nREADME_PYTHON_BLOCK")
        marker = None
        i = j
    elif line.strip():
        marker = None
    i += 1
if count < 3:
    sys.exit(f"{path}: only {count} runnable blocks")
open(out, "w", encoding="utf-8").write("\n".join(session) + "\n")
PY
mkdir -p "$scratch/reader"
ln -s "$root/clients" "$scratch/reader/clients"
(
  cd "$scratch/reader"
  export ADMIN_KEY="$admin_key" CURL_HOME="$scratch"
  printf -- '--fail\n--show-error\n--silent\n' > "$scratch/.curlrc"
  bash "$scratch/readme-session.sh"
) 2>&1 | tee "$scratch/readme-session.out"
# The README's logging set-up logs each request once (the client's line),
# not a second time through httpx's own INFO line.
if grep -n "HTTP Request:" "$scratch/readme-session.out"; then
  echo "client: the README's logging example logs each request twice (httpx's lines above)" >&2
  exit 1
fi
grep -q " -> 2[0-9][0-9] in " "$scratch/readme-session.out" \
  || { echo "client: the README's logging example logged no request" >&2; exit 1; }
echo "client: README blocks ran as written (${SECONDS}s so far)"

echo "client: the README's kiosk loop in a fleet of 6 booths, 1 reservation at a time"
TB_ADMIN_KEY="$admin_key" tests/client/fleet.sh clients/python/README.md python "$scratch/venv/bin/python"
echo "client: ok; ${SECONDS}s in all"
