#!/usr/bin/env bash
# The floor under the engine: what the service reaches over HTTP when its
# engine costs nothing, beside the service itself and the fixed hand-written
# reference, in one run.
#
# Usage:
#   bench/http_floor.sh [--kiosks "2 8"] [--seconds S] [--rounds R] [--engine NAME=FILE]...
# Defaults: 2 and 8 kiosks, spread over 1,000 accounts, 4 s, 3 rounds.
# Needs a release build (cargo build --release) and the PostgreSQL server
# packages (initdb, pgbench).
#
# Each round runs, in alternating order, on a private cluster (initdb in a
# temporary directory, port HTTP_FLOOR_PORT, default 5493, autovacuum off;
# removed at the end; the main cluster is not touched):
#   - reference: bench/reference_cycle.pgbench.sql (the fixed hand-written
#     reserve → commit, one request per transaction) under pgbench, on a
#     fresh seeded database;
#   - service: the release service on a fresh database, driven by
#     `token-billing-bench load --scenario spread`;
#   - floor: the same, except that once the load generator has set up its
#     accounts (its first reservation is in the table), engine_apply in the
#     service's engine schema is replaced by bench/engine_noop.sql: every
#     operation answered as if applied, one row written per batch so the
#     commit still flushes WAL. What remains is HTTP, the load generator,
#     the service's Rust, the pool, the round trip and the commit: the
#     most any engine could reach on this stack. (Its books line means
#     nothing: nothing was booked.)
#   - handwritten: the same, except that the engine is replaced by the
#     reference's own two statements (generated here from
#     bench/reference_cycle.pgbench.sql, never copied: the account, the
#     key, the request_id, the new reservation's id and the reservation
#     committed become the request's values): a reserve or a commit runs
#     the hand-written statement and nothing else, a batch runs them one
#     operation after another in its one transaction (after locking its
#     accounts in id order, as the service's engine does). What an engine
#     as lean as the hand-written SQL reaches behind this service's HTTP.
#     (Its books line means nothing either: the statements move no grant.)
#   - NAME (--engine NAME=FILE, each): the same, except that FILE.sql is
#     run in the service's engine schema instead of the no-op engine: an
#     engine built another way (bench/one_statement_engine.sql), measured
#     through the same HTTP. Its books are checked as the service's are.
# Printed: cycles/s medians per cell, and service / reference,
# floor / reference, handwritten / reference, service / floor, service /
# handwritten, and NAME / handwritten and / service. When floor /
# reference is below a target for service / reference, no engine reaches
# that target on this stack and machine; when handwritten / reference
# is, no engine doing the reference's statements per operation does.
set -euo pipefail
cd "$(dirname "$0")/.."

kiosk_counts="2 8" seconds=4 rounds=3 engines=""
declare -A engine_file # NAME → FILE (--engine)
while [ $# -gt 0 ]; do
  case "$1" in
    --kiosks) kiosk_counts="$2"; shift ;;
    --seconds) seconds="$2"; shift ;;
    --rounds) rounds="$2"; shift ;;
    --engine)
      # (A NAME of its own: not a cell's above, nor one given before.)
      [[ "$2" =~ ^[a-z_][a-z0-9_]*=.+$ ]] && [ -f "${2#*=}" ] \
        && [[ ! " reference service floor handwritten$engines " =~ " ${2%%=*} " ]] \
        || { echo "--engine NAME=FILE (a new NAME, an existing FILE): $2" >&2; exit 2; }
      engines+=" ${2%%=*}"; engine_file[${2%%=*}]="${2#*=}"; shift ;;
    *) sed -n '5,10p' "$0" >&2; exit 2 ;;
  esac
  shift
done

target="${CARGO_TARGET_DIR:-target}/release"
binary="$target/token-billing" bench="$target/token-billing-bench"
[ -x "$binary" ] && [ -x "$bench" ] || { echo "build first: cargo build --release" >&2; exit 1; }
. bench/private_cluster.sh
port="${HTTP_FLOOR_PORT:-5493}" http=18093 key="bench-admin-key-0123456789"
dir="$(mktemp -d /tmp/tb-http-floor.XXXXXX)"
service=""
cleanup() {
  [ -z "$service" ] || { kill -TERM "$service" 2> /dev/null; wait "$service" 2> /dev/null || true; }
  private_cluster_stop "$dir"
  rm -rf "$dir"
}
trap cleanup EXIT
private_cluster_start "$dir" "$port" "autovacuum = off"
pg=(-X -q -h 127.0.0.1 -p "$port" -U postgres -v ON_ERROR_STOP=1)
admin() { PGOPTIONS="-c client_min_messages=warning" psql "${pg[@]}" -d postgres -c "$1" > /dev/null; }

# The reference's seeded template.
admin "CREATE DATABASE tb_floor_template"
"$binary" --database-url "postgres://postgres@127.0.0.1:$port/tb_floor_template" migrate > /dev/null
psql "${pg[@]}" -d tb_floor_template -v accounts=1000 -f bench/reference_seed.sql > /dev/null

# The reference's two statements as the engine ("handwritten" above),
# installed over engine_noop.sql's functions (whose object builder answers).
# Each function keeps the signature the installed engine gives it (read
# from the catalog: written once, in src/engine/sql); only its body is new.
# The statements, one per line, with the request's values for the
# reference's (a reserve's `request.id` and new id, the key, the account,
# the reservation committed):
grep -v '^--\|^\\' bench/reference_cycle.pgbench.sql \
  | sed -e 's/SELECT gen_random_uuid() AS id/SELECT p_request AS id/' \
        -e 's/SELECT gen_random_uuid(), bench_uuid(:n), request.id/SELECT p_new_id, bench_uuid(:n), request.id/' \
        -e "s/WHERE id = bench_uuid(:n) AND secret_hash = sha256('pgbench-secret'::bytea)/WHERE id = p_key_id AND secret_hash = p_key_hash/g" \
        -e 's/bench_uuid(:n)/p_account/g' -e 's/:r_id/p_reservation/g' \
        -e 's/ SELECT id FROM held \\gset r_$/ SELECT id INTO r FROM held;/' \
        -e 's/ SELECT count(\*) AS committed FROM settled \\gset c_$/ SELECT count(*) INTO c FROM settled;/' \
  > "$dir/reference.sql"
{
  cat <<'SQL'
CREATE FUNCTION pg_temp.bench_replace_body(p_name text, p_body text) RETURNS void
LANGUAGE plpgsql AS $replace$
BEGIN
    EXECUTE format('CREATE OR REPLACE FUNCTION %s(%s) RETURNS %s LANGUAGE plpgsql AS %L',
                   p_name, pg_get_function_arguments(p_name::regproc),
                   pg_get_function_result(p_name::regproc), p_body);
END;
$replace$;
CREATE FUNCTION bench_handwritten_one(p_op text, p_account uuid, p_key_id uuid,
    p_key_hash bytea, p_authorized boolean, p_request uuid, p_amount bigint, p_ttl integer,
    p_new_id uuid, p_reservation uuid) RETURNS jsonb
LANGUAGE plpgsql AS $handwritten$
DECLARE
    r uuid;
    c bigint;
BEGIN
    IF p_op = 'reserve' THEN
SQL
  sed -n 1p "$dir/reference.sql"
  cat <<'SQL'
        IF r IS NULL THEN
            RAISE EXCEPTION 'handwritten reserve refused on %', p_account;
        END IF;
    ELSIF p_op IN ('commit', 'commit_all') THEN
SQL
  sed -n 2p "$dir/reference.sql"
  cat <<'SQL'
        IF c <> 1 THEN
            RAISE EXCEPTION 'handwritten commit refused on % (key % authorized %)', p_reservation, p_key_id, p_authorized;
        END IF;
    ELSE
        RAISE EXCEPTION 'handwritten engine: % is not a reserve or a commit', p_op;
    END IF;
    RETURN bench_noop_object(p_op, p_account, p_request, p_amount, p_ttl, p_new_id, p_reservation);
END;
$handwritten$;
SELECT pg_temp.bench_replace_body('engine_apply', $handwritten$
DECLARE
    o engine_request;
BEGIN
    -- The batch's accounts locked in id order first, as the service's
    -- engine does: batches in flight side by side never deadlock.
    PERFORM 1 FROM accounts
    WHERE id = ANY (ARRAY(SELECT DISTINCT u.account FROM unnest(p_ops) u))
    ORDER BY id FOR NO KEY UPDATE;
    op_position := 0;
    FOREACH o IN ARRAY p_ops LOOP
        op_position := op_position + 1;
        outcome := CASE WHEN o.op = 'reserve' THEN 'created' ELSE 'committed' END;
        object := bench_handwritten_one(o.op, o.account, o.key_id, o.key_hash, o.authorized,
                                        o.request, o.amount, o.ttl, o.new_id, o.reservation);
        RETURN NEXT;
    END LOOP;
END;
$handwritten$);
SQL
} > "$dir/handwritten.sql"
[ "$(grep -c ' INTO [rc] FROM \(settled\|held\);' "$dir/handwritten.sql")" = 2 ] \
  && ! grep -q 'bench_uuid\|:r_id\|gen_random_uuid\|pgbench-secret\|gset' "$dir/handwritten.sql" \
  || { echo "bench/reference_cycle.pgbench.sql: not the two statements expected" >&2; exit 1; }

reference_run() { # kiosks
  admin "DROP DATABASE IF EXISTS tb_floor_reference WITH (FORCE)"
  admin "CREATE DATABASE tb_floor_reference TEMPLATE tb_floor_template"
  local output
  for duration in 2 "$seconds"; do # the load generator's 2 s warm-up, then the run
    output="$(pgbench -h 127.0.0.1 -p "$port" -U postgres -n -M prepared -c "$1" -j 2 -T "$duration" \
      -D accounts=1000 -f bench/reference_cycle.pgbench.sql tb_floor_reference 2>&1)"
  done
  sed -n 's/^tps = \([0-9.]*\).*/\1/p' <<< "$output"
}

service_run() { # kiosks engine(real|noop|handwritten|a FILE.sql)
  admin "DROP DATABASE IF EXISTS tb_floor_service WITH (FORCE)"
  local url="postgres://postgres@127.0.0.1:$port/tb_floor_service"
  DATABASE_URL="$url" BIND_ADDR="127.0.0.1:$http" ADMIN_API_KEY="$key" RATE_LIMIT_PER_SECOND=0 \
    RUST_LOG=warn "$binary" serve > "$dir/service.log" 2>&1 &
  service=$!
  for _ in $(seq 1 600); do
    curl -fsS "http://127.0.0.1:$http/readyz" > /dev/null 2>&1 && break
    sleep 0.1
  done
  "$bench" load --url "http://127.0.0.1:$http" --admin-key "$key" --scenario spread \
    --accounts 1000 --concurrency "$1" --seconds "$seconds" --service-pid "$service" \
    > "$dir/load.out" 2>&1 &
  local load=$!
  if [ "$2" != real ]; then
    local held=0
    for _ in $(seq 1 1200); do
      held="$(psql "${pg[@]}" -d tb_floor_service -tAc "SELECT count(*) FROM reservations" 2> /dev/null || echo 0)"
      [ "${held:-0}" -gt 0 ] && break
      sleep 0.05
    done
    local schema
    schema="$(psql "${pg[@]}" -d tb_floor_service -tAc \
      "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'engine\\_%'")"
    local files=(-f bench/engine_noop.sql)
    case "$2" in
      noop) ;;
      handwritten) files+=(-f "$dir/handwritten.sql") ;;
      *) files=(-f "$2") ;;
    esac
    # One transaction: no operation meets the no-op engine on its way to
    # the hand-written one.
    PGOPTIONS="-c search_path=$schema,public" psql "${pg[@]}" -d tb_floor_service -1 \
      "${files[@]}" > /dev/null
  fi
  wait "$load" || true
  kill -TERM "$service"; wait "$service" 2> /dev/null || true; service=""
  if [ "$2" = handwritten ]; then
    # Its books cannot reconcile (no grant moves), so the load generator
    # reports 0 cycles/s: cycles from the requests of the measured seconds
    # (a reserve and a commit each).
    grep -o 'requests=[0-9]*' "$dir/load.out" | cut -d= -f2 | awk -v s="$seconds" '{ print $1 / 2 / s }' \
      | grep . || { echo "the load generator failed:" >&2; cat "$dir/load.out" "$dir/service.log" >&2; exit 1; }
    return
  fi
  grep -o 'cycles_per_s=[0-9.]*' "$dir/load.out" | cut -d= -f2 \
    || { echo "the load generator failed:" >&2; cat "$dir/load.out" "$dir/service.log" >&2; exit 1; }
}

results="$dir/results"
for kiosks in $kiosk_counts; do
  for round in $(seq 1 "$rounds"); do
    order="reference service floor handwritten$engines"
    [ $((round % 2)) = 0 ] && order="$(tr ' ' '\n' <<< "$order" | tac | tr '\n' ' ')"
    for what in $order; do
      case "$what" in
        reference) figure="$(reference_run "$kiosks")" ;;
        service) figure="$(service_run "$kiosks" real)" ;;
        floor) figure="$(service_run "$kiosks" noop)" ;;
        handwritten) figure="$(service_run "$kiosks" handwritten)" ;;
        *) figure="$(service_run "$kiosks" "${engine_file[$what]}")" ;;
      esac
      echo "$kiosks $round $what $figure" | tee -a "$results" >&2
    done
  done
done

python3 - "$results" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
cells = {}
for kiosks, _, what, figure in rows:
    cells.setdefault(int(kiosks), {}).setdefault(what, []).append(float(figure))
print("| kiosks | reference | service | floor (engine costs nothing) | handwritten (the reference's statements as the engine) | service / reference | floor / reference | handwritten / reference | service / floor | service / handwritten |")
print("|---|---|---|---|---|---|---|---|---|---|")
for kiosks, cell in sorted(cells.items()):
    r, s, f, h = (statistics.median(cell[w]) for w in ("reference", "service", "floor", "handwritten"))
    print(f"| {kiosks} | {r:,.0f} | {s:,.0f} | {f:,.0f} | {h:,.0f} | **{s / r:.2f}** | **{f / r:.2f}** | **{h / r:.2f}** | {s / f:.2f} | {s / h:.2f} |")
others = sorted({w for cell in cells.values() for w in cell} - {"reference", "service", "floor", "handwritten"})
if others:
    print()
    print("| kiosks | engine | cycles/s | / handwritten | / service |")
    print("|---|---|---|---|---|")
    for kiosks, cell in sorted(cells.items()):
        h, s = statistics.median(cell["handwritten"]), statistics.median(cell["service"])
        for w in others:
            e = statistics.median(cell[w])
            print(f"| {kiosks} | {w} | {e:,.0f} | **{e / h:.2f}** | {e / s:.2f} |")
PY
