# Sourced by the test drivers that need a running service (tests/cors,
# tests/openapi_ts, tests/typescript): builds the debug binary, starts it
# on a fresh database on the PostgreSQL at 127.0.0.1:5432 and a free port,
# and stops it and drops the database on exit.
#
#   source tests/lib/service.sh
#   start_service NAME [VAR=value ...]   # extra environment for `serve`
#   → TB_URL, TB_ADMIN_KEY (random, never printed), service_log
#
# Needs: cargo, curl, psql, python3. CARGO_TARGET_DIR as the caller set it.

service_pid=""
service_database=""
service_scratch="$(mktemp -d)"
service_log="$service_scratch/serve.log"

stop_service() {
  if [ -n "$service_pid" ] && kill -0 "$service_pid" 2>/dev/null; then
    kill -TERM "$service_pid"
    wait "$service_pid" || true
  fi
  if [ -n "$service_database" ]; then
    psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS $service_database WITH (FORCE)" || true
  fi
  rm -rf "$service_scratch"
}

start_service() {
  local name="$1"
  shift
  cargo build --bin token-billing
  local binary="$CARGO_TARGET_DIR/debug/token-billing"
  local port
  port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  service_database="tb_${name}_$$"
  TB_ADMIN_KEY="$name-$(python3 -c 'import secrets; print(secrets.token_hex(16))')"
  TB_URL="http://127.0.0.1:$port"
  export TB_URL TB_ADMIN_KEY
  env DATABASE_URL="postgres://postgres@127.0.0.1:5432/$service_database" \
    BIND_ADDR="127.0.0.1:$port" ADMIN_API_KEY="$TB_ADMIN_KEY" RUST_LOG=warn "$@" \
    "$binary" serve > "$service_log" 2>&1 &
  service_pid=$!
  for _ in $(seq 1 150); do
    curl -fsS "$TB_URL/readyz" > /dev/null 2>&1 && return 0
    kill -0 "$service_pid" 2>/dev/null || break
    sleep 0.2
  done
  echo "$name: the service did not become ready" >&2
  cat "$service_log" >&2
  return 1
}

# An account with TOKENS tokens and a kiosk key: sets TB_ACCOUNT_ID, TB_KIOSK_KEY.
# A new account on each call (its credit's external_ref is a new one).
funded_kiosk() {
  local tokens="$1" max_active="${2:-10}"
  local admin=(-H "Authorization: Bearer $TB_ADMIN_KEY" -H "Content-Type: application/json")
  TB_ACCOUNT_ID="$(curl -fsS "${admin[@]}" \
    -d "{\"name\":\"test kiosk $$\",\"max_active_reservations\":$max_active}" \
    "$TB_URL/v1/accounts" | python3 -c 'import json,sys; print(json.load(sys.stdin)["account_id"])')"
  curl -fsS "${admin[@]}" -d "{\"amount\":$tokens,\"external_ref\":\"test-topup-$$-$RANDOM$RANDOM\"}" \
    "$TB_URL/v1/accounts/$TB_ACCOUNT_ID/credits" > /dev/null
  TB_KIOSK_KEY="$(curl -fsS "${admin[@]}" -d '{"scope":"kiosk","label":"test booth"}' \
    "$TB_URL/v1/accounts/$TB_ACCOUNT_ID/api-keys" | python3 -c 'import json,sys; print(json.load(sys.stdin)["key"])')"
  export TB_ACCOUNT_ID TB_KIOSK_KEY
}
