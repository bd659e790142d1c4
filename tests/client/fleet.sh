#!/usr/bin/env bash
# A README's kiosk loop, as written, in a fleet: BOOTHS booths (default 6)
# run the block marked `<!-- readme-test: fleet -->` at once, each in its
# own directory (its own journal), with one kiosk key of one account that
# allows 1 held reservation at a time and has fewer tokens than the guests'
# presses. Every booth must end with exit 0 (no uncaught refusal or
# transport error), the fleet must have met the limit (a booth said "One
# moment"), and the books must agree: nothing left reserved, every
# succeeded job charged once.
#
# Usage: tests/client/fleet.sh README LANGUAGE RUNNER...
#   LANGUAGE: python | typescript (the fence of the block); RUNNER: the
#   command that runs the block's file (e.g. .venv/bin/python, or node).
# Needs TB_URL, TB_ADMIN_KEY (a running service), python3, curl.
set -euo pipefail
readme="$1"
language="$2"
shift 2
booths="${BOOTHS:-6}"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
case "$language" in
  python) extension=py ;;
  typescript) extension=mts ;;
  *) echo "fleet: unknown language $language" >&2; exit 2 ;;
esac

python3 - "$readme" "$language" "$scratch/booth.$extension" <<'PY'
import re, sys
path, fence, out = sys.argv[1:4]
lines = open(path, encoding="utf-8").read().split("\n")
for i, line in enumerate(lines):
    if re.match(r"\s*<!--\s*readme-test:\s*fleet\s*-->\s*$", line):
        assert lines[i + 1].strip() == "```" + fence, f"{path}:{i + 2}: not a {fence} block"
        end = next(j for j in range(i + 2, len(lines)) if lines[j].startswith("```"))
        open(out, "w", encoding="utf-8").write("\n".join(lines[i + 2 : end]) + "\n")
        break
else:
    sys.exit(f"{path}: no block marked readme-test: fleet")
PY

admin=(-H "Authorization: Bearer $TB_ADMIN_KEY" -H "Content-Type: application/json")
TB_ACCOUNT="$(curl -fsS "${admin[@]}" -d '{"name":"fleet '"$language $$"'","max_active_reservations":1}' \
  "$TB_URL/v1/accounts" | python3 -c 'import json,sys; print(json.load(sys.stdin)["account_id"])')"
tokens=$((booths + 2))
curl -fsS "${admin[@]}" -d "{\"amount\":$tokens,\"external_ref\":\"fleet-$language-$$\"}" \
  "$TB_URL/v1/accounts/$TB_ACCOUNT/credits" > /dev/null
TB_KIOSK_KEY="$(curl -fsS "${admin[@]}" -d '{"scope":"kiosk","label":"fleet"}' \
  "$TB_URL/v1/accounts/$TB_ACCOUNT/api-keys" | python3 -c 'import json,sys; print(json.load(sys.stdin)["key"])')"
export TB_ACCOUNT TB_KIOSK_KEY

pids=()
for booth in $(seq 1 "$booths"); do
  mkdir -p "$scratch/booth-$booth"
  cp "$scratch/booth.$extension" "$scratch/booth-$booth/"
  (cd "$scratch/booth-$booth" && exec "$@" "booth.$extension" > output.txt 2>&1) &
  pids+=("$!")
done
failed=0
for booth in $(seq 1 "$booths"); do
  status=0
  wait "${pids[$((booth - 1))]}" || status=$?
  if [ "$status" != 0 ]; then
    echo "fleet: booth $booth exited $status:" >&2
    tail -n 30 "$scratch/booth-$booth/output.txt" >&2
    failed=1
  fi
done
[ "$failed" = 0 ] || exit 1

cat "$scratch"/booth-*/output.txt | grep '^guest sees:' | sort | uniq -c | sed 's/^/fleet: /'
waits="$(cat "$scratch"/booth-*/output.txt | grep -c '^guest sees: One moment' || true)"
pictures="$(cat "$scratch"/booth-*/output.txt | grep -c '^guest sees: Here is your picture' || true)"
if [ "$waits" = 0 ]; then
  echo "fleet: no booth met the account's limit; the test did not test a fleet" >&2
  exit 1
fi
python3 - "$TB_URL" "$TB_ADMIN_KEY" "$TB_ACCOUNT" "$tokens" "$pictures" <<'PY'
import json, sys, urllib.request
url, key, account, tokens, pictures = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
def get(path):
    request = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)
balances = get(f"/v1/accounts/{account}")
jobs = get(f"/v1/accounts/{account}/jobs?limit=500")["jobs"]
succeeded = [job for job in jobs if job["status"] == "succeeded"]
problems = []
if balances["reserved"] != 0:
    problems.append(f"{balances['reserved']} tokens still reserved")
if balances["used"] != sum(job["cost"] for job in succeeded):
    problems.append(f"used {balances['used']} != the succeeded jobs' costs")
if balances["available"] + balances["used"] != tokens:
    problems.append(f"available {balances['available']} + used {balances['used']} != {tokens}")
if len(succeeded) != pictures:
    problems.append(f"{len(succeeded)} succeeded jobs, {pictures} pictures shown")
if problems:
    sys.exit("fleet: " + "; ".join(problems))
print(f"fleet: ok: {len(jobs)} jobs, {len(succeeded)} pictures, used {balances['used']} of {tokens}")
PY
