#!/usr/bin/env bash
# Schemathesis (PyPI) against the service's own /openapi.json: generated
# requests, with an admin and with a kiosk key, checked for server errors
# and for answers that break the document (status, content type, headers,
# body schema), for schema-violating requests that are accepted, and for
# schema-valid requests that are refused as malformed (positive data
# acceptance: the document is as strict as the validation). Business
# refusals that no schema can state (402, 404, 409, 422, 429) are expected
# answers; schemathesis.toml beside this script says which and why.
#
# Usage: tests/schemathesis/run.sh [max examples per operation, default 30]
# Needs: a debug build (cargo build) and PostgreSQL on 127.0.0.1:5432.
set -euo pipefail
cd "$(dirname "$0")/../.."
examples="${1:-30}"
binary="${CARGO_TARGET_DIR:-target}/debug/token-billing"
command -v schemathesis > /dev/null || pip install --quiet schemathesis
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
database="tb_schemathesis_$$"
admin="schemathesis-admin-key-0123456789"
DATABASE_URL="postgres://postgres@127.0.0.1:5432/$database" BIND_ADDR="127.0.0.1:$port" ADMIN_API_KEY="$admin" \
  RATE_LIMIT_PER_SECOND=0 RUST_LOG=warn "$binary" serve > /tmp/token-billing-schemathesis.log 2>&1 &
server=$!
cleanup() {
  kill -TERM "$server" 2> /dev/null || true
  wait "$server" 2> /dev/null || true
  psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS $database WITH (FORCE)" postgres || true
}
trap cleanup EXIT
for _ in $(seq 1 100); do
  curl -fsS "http://127.0.0.1:$port/readyz" > /dev/null 2>&1 && break
  sleep 0.2
done
base="http://127.0.0.1:$port"
account="$(curl -fsS -H "Authorization: Bearer $admin" -H 'content-type: application/json' \
  -d '{"name":"schemathesis","max_active_reservations":0}' "$base/v1/accounts" \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["account_id"])')"
# Tokens enough for every generated reservation and job, so that they are
# created (and their links followed) rather than refused with 402.
for invoice in $(seq 1 20); do
  curl -fsS -o /dev/null -H "Authorization: Bearer $admin" -H 'content-type: application/json' \
    -d "{\"amount\":1000000,\"external_ref\":\"schemathesis-$invoice\"}" "$base/v1/accounts/$account/credits"
done
# schemathesis.toml sends this account's id as every `account_id` in a path:
# the kiosk key reaches its own account instead of 404s.
export SCHEMATHESIS_ACCOUNT_ID="$account"
kiosk="$(curl -fsS -H "Authorization: Bearer $admin" -H 'content-type: application/json' \
  -d '{"scope":"kiosk","label":"schemathesis"}' "$base/v1/accounts/$account/api-keys" \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["key"])')"
checks="not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance,negative_data_rejection,positive_data_acceptance,unsupported_method,allow_header_conformance"
# One worker: with two, Hypothesis (on CPython 3.11) now and then fails
# inside its own ast.parse ("AST constructor recursion depth mismatch"), a
# runtime error of the tool that says nothing about the service.
for key in "$admin" "$kiosk"; do
  schemathesis --config-file tests/schemathesis/schemathesis.toml \
    run "$base/openapi.json" -H "Authorization: Bearer $key" \
    --checks "$checks" --max-examples "$examples" --workers 1 --seed 20261129 --no-color
done
