#!/usr/bin/env bash
# Instructions a PostgreSQL backend executes per reserve → commit cycle of
# the engine, counted by valgrind (callgrind): the same for the same
# binary, schema and inputs whatever else the machine is doing, where CPU
# time swings by 10–30 % between rounds on this shared machine.
#
# Usage:
#   bench/engine_instructions.sh [--cycles "N1 N2"] [--batch B] [--keep DIR] [--base COMMIT]
#                                [--reference] [NAME=FILE.sql]...
# Defaults: 100 and 300 cycles, lone operations (B = 1). --keep: callgrind's
# files are copied to DIR (callgrind_annotate --inclusive=yes DIR/this.300.callgrind
# says where the instructions go). --base COMMIT: one more database,
# "base", with the engine of COMMIT (its src/engine/sql) instead of this
# checkout's, on this build's schema: what a change of the engine's SQL
# saved. --reference: one more database, "reference", set up and given
# the same history as "this", whose cycles are the fixed hand-written
# reference's two statements (bench/reference_cycle.pgbench.sql, read from
# that file by reference_cycle_plpgsql, as bench/engine_cpu.sh does; lone
# cycles only): the engine's price counted instead of timed.
#
# Each NAME gets a database of its own on a private cluster (port
# ENGINE_INSTRUCTIONS_PORT, default 5482; initdb in a temporary directory,
# removed at the end; the main cluster is not touched), migrated by this
# build (cargo build --release first) and seeded like the references
# (bench/seed.sql), with this checkout's engine (src/engine/sql) in a
# schema of its own, then FILE.sql applied: a schema as an earlier
# migration left it (a migration's down.sql), say. A database "this" with
# nothing applied is always measured first; the ratios are to it. Each
# database gets a history (3,000 batches of 8 reserves and their commits)
# and VACUUM ANALYZE; then the cluster stops, and `postgres --single` runs under
# callgrind twice per database, each time from a copy of that state: 30
# warm-up cycles, then N1 (or N2) cycles, each B reserves on one account,
# COMMIT, their B commit_all, COMMIT (synchronous_commit off), through the
# entry point the service uses for a batch of that size (below). The
# instructions per cycle are (total at N2 - total at N1) / (N2 - N1): the
# start-up and the warm-up cancel out. Every id and account is derived
# from the cycle's number (no random value), so two databases given the
# same SQL count the same to within a fraction of a per cent.
set -euo pipefail
cd "$(dirname "$0")/.."

counts="100 300" batch=1 keep="" base="" reference=0 experiments=()
while [ $# -gt 0 ]; do
  case "$1" in
    --cycles) counts="$2"; shift ;;
    --batch) batch="$2"; shift ;;
    --keep) keep="$2"; shift ;;
    --base) base="$(git rev-parse --verify "$2^{commit}")"; shift ;;
    --reference) reference=1 ;;
    *=*) experiments+=("$1") ;;
    *) sed -n '7,20p' "$0" >&2; exit 2 ;;
  esac
  shift
done
# Each NAME is a database of its own: a new one, never "this" or "base"
# (which would be installed twice) or a NAME given before.
taken=" this base reference "
for experiment in "${experiments[@]}"; do
  name="${experiment%%=*}"
  [[ "$name" =~ ^[a-z_][a-z0-9_]*$ ]] \
    || { echo "$name: a NAME is a lowercase identifier (the database's name)" >&2; exit 2; }
  [[ "$taken" != *" $name "* ]] || { echo "$name: NAME taken (this, base, reference, or given twice)" >&2; exit 2; }
  taken+="$name "
  [ -f "${experiment#*=}" ] || { echo "${experiment#*=}: no such file" >&2; exit 2; }
done
read -r n1 n2 <<< "$counts"
command -v valgrind > /dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 1; }
binary="${CARGO_TARGET_DIR:-target}/release/token-billing"
[ -x "$binary" ] || { echo "build first: cargo build --release ($binary missing)" >&2; exit 1; }

. bench/private_cluster.sh
port="${ENGINE_INSTRUCTIONS_PORT:-5482}"
dir="$(mktemp -d /tmp/tb-engine-instructions.XXXXXX)"
cleanup() {
  private_cluster_stop "$dir"
  if [ -n "$keep" ]; then mkdir -p "$keep" && cp "$dir"/*.callgrind "$keep"/ 2> /dev/null || true; fi
  rm -rf "$dir"
}
trap cleanup EXIT
private_cluster_start "$dir" "$port"

# The cycles as a DO block: `n` cycles of batches of `b`, numbered from
# `first` (the ids and the account follow from the number). Every batch,
# one operation or more, calls engine_apply with one engine_request per
# operation, as the service does: its 26 fields named here, and `pad`
# (", NULL" per field a later engine added) after them.
block() { # n b first pad
  local key="sha256('pgbench-secret'::bytea), false" pad="${4:-}"
  cat <<SQL
DO \$\$
DECLARE ids uuid[]; acc uuid[]; answered integer;
BEGIN
  FOR i IN $3 .. $3 + $1 - 1 LOOP
    acc := array_fill(bench_uuid(1 + (i::bigint * 7919) % 1000), ARRAY[$2]);
    SELECT array_agg((object->>'id')::uuid ORDER BY op_position) INTO ids
    FROM engine_apply(ARRAY(SELECT ROW('reserve', acc[k], 'bench', acc[k], $key,
        md5('request ' || i || ' ' || k)::uuid, 1, NULL, 300,
        md5('reservation ' || i || ' ' || k)::uuid, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
        NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL$pad)::engine_request
      FROM generate_subscripts(acc, 1) k ORDER BY k));
    IF cardinality(ids) IS DISTINCT FROM $2 THEN RAISE 'reserves answered: %', ids; END IF;
    COMMIT;
    SELECT count(*) INTO answered
    FROM engine_apply(ARRAY(SELECT ROW('commit_all', acc[k], 'bench', acc[k], $key, NULL,
        NULL, NULL, NULL, NULL, NULL, ids[k], NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
        NULL, NULL, NULL, NULL, NULL$pad)::engine_request
      FROM generate_subscripts(acc, 1) k ORDER BY k))
    WHERE outcome = 'committed';
    IF answered <> $2 THEN RAISE 'commits answered: %', answered; END IF;
    COMMIT;
  END LOOP;
END \$\$;
SQL
}

# The reference's two statements in a DO block (`acc` the account, `r`
# the reservation), on the accounts the engine's cycles use.
reference_sql="$(reference_cycle_plpgsql)"
reference_block() { # n first
  cat <<SQL
DO \$\$
DECLARE r uuid; acc uuid; c integer;
BEGIN
  FOR i IN $2 .. $2 + $1 - 1 LOOP
    acc := bench_uuid(1 + (i::bigint * 7919) % 1000);
    r := NULL;
    $(sed -n 1p <<< "$reference_sql")
    IF r IS NULL THEN RAISE 'reference reserve refused'; END IF;
    COMMIT;
    $(sed -n 2p <<< "$reference_sql")
    IF c <> 1 THEN RAISE 'reference commit answered %', c; END IF;
    COMMIT;
  END LOOP;
END \$\$;
SQL
}

declare -A pad
names=(this)
files=("")
if [ -n "$base" ]; then
  names+=(base)
  files+=("")
fi
if [ "$reference" = 1 ]; then
  [ "$batch" = 1 ] || { echo "--reference: lone cycles only (no --batch)" >&2; exit 2; }
  names+=(reference)
  files+=("")
fi
for experiment in "${experiments[@]}"; do
  names+=("${experiment%%=*}")
  files+=("${experiment#*=}")
done
sql() { psql -X -q -h 127.0.0.1 -p "$port" -U postgres -v ON_ERROR_STOP=1 "$@" > /dev/null; }
for i in "${!names[@]}"; do
  name="${names[$i]}"
  sql -d postgres -c "CREATE DATABASE \"$name\""
  RUST_LOG=warn "$binary" --database-url "postgres://postgres@127.0.0.1:$port/$name" migrate > /dev/null
  sql -d "$name" -v accounts=1000 -f bench/seed.sql
  if [ "$name" = base ]; then
    private_cluster_install_engine "$port" "$name" engine_bench "$base"
  else
    private_cluster_install_engine "$port" "$name" engine_bench
  fi
  # (In the engine's schema: a FILE names no schema.)
  [ -z "${files[$i]}" ] || PGOPTIONS="-c search_path=engine_bench,public" sql -d "$name" -f "${files[$i]}"
  fields="$(psql -X -qAt -h 127.0.0.1 -p "$port" -U postgres -d "$name" -c \
    "SELECT count(*) FROM pg_attribute WHERE attrelid = 'engine_bench.engine_request'::regclass
       AND attnum > 0 AND NOT attisdropped")"
  pad[$name]=""
  for _ in $(seq 27 "$fields"); do pad[$name]+=", NULL"; done
  { echo "SET search_path TO engine_bench, public; SET synchronous_commit = off;"
    block 3000 8 1000000 "${pad[$name]}"
    # A key's last use is written at most once a minute
    # (engine_key_use_stale): which cycles write it would depend on how
    # long the runs under valgrind take, and the counts would differ
    # between two runs of one database. Every key is marked as used
    # later than the runs end, so no cycle writes it.
    echo "UPDATE api_keys SET last_used_at = now() + interval '1 day';"
    # Vacuumed, not only analysed: with dead rows and hint bits left to
    # the runs, two runs of one database differed by 1-5 %; vacuumed,
    # they count the same to the instruction.
    echo "VACUUM ANALYZE;"
  } | sql -d "$name"
done
as_postgres "$pg_bin/pg_ctl" stop -w -D "$dir/data" > /dev/null
# Every run starts from this state.
cp -a "$dir/data" "$dir/data.start"

# One line per statement for the single-user backend. The DO block's own
# statements (the batch's array, built from the cycle's number) use their
# generic plan: with the default plan_cache_mode one of them was planned
# anew at every cycle (about 0.45 M instructions, counted as the engine's).
# The engine's statements are planned as in the service's sessions, which
# use their generic plans after the fifth call.
for name in "${names[@]}"; do
  for n in "$n1" "$n2"; do
    { echo "SET search_path TO engine_bench, public;"
      echo "SET synchronous_commit = off;"
      echo "SET plan_cache_mode = force_generic_plan;"
      if [ "$name" = reference ]; then
        reference_block 30 1 | tr '\n' ' '; echo
        reference_block "$n" 31 | tr '\n' ' '; echo
      else
        block 30 "$batch" 1 "${pad[$name]}" | tr '\n' ' '; echo
        block "$n" "$batch" 31 "${pad[$name]}" | tr '\n' ' '; echo
      fi
    } > "$dir/cycles_${name}_$n.sql"
  done
done
declare -A total
for name in "${names[@]}"; do
  for n in "$n1" "$n2"; do
    out="$dir/$name.$n"
    rm -rf "$dir/data"
    cp -a "$dir/data.start" "$dir/data"
    as_postgres valgrind --tool=callgrind --callgrind-out-file="$out.callgrind" \
      "$pg_bin/postgres" --single -D "$dir/data" "$name" < "$dir/cycles_${name}_$n.sql" > "$out.log" 2>&1 \
      || { tail -n 20 "$out.log" >&2; exit 1; }
    if grep -q 'ERROR' "$out.log"; then grep -m 3 'ERROR' "$out.log" >&2; exit 1; fi
    total[$name.$n]="$(awk '/^(summary|totals):/ { print $2; exit }' "$out.callgrind")"
  done
done

echo "Instructions per reserve → commit cycle (batches of $batch; callgrind, ($n2 - $n1) cycles):"
echo "| database | M instructions per cycle | / this |"
echo "|---|---|---|"
# Each database's instructions per cycle, once: the difference of its two runs.
declare -A per
for name in "${names[@]}"; do
  per[$name]=$(( (total[$name.$n2] - total[$name.$n1]) / (n2 - n1) ))
done
for name in "${names[@]}"; do
  awk -v name="$name" -v per="${per[$name]}" -v this="${per[this]}" \
    'BEGIN { printf "| %s | %.3f | **%.3f** |\n", name, per / 1e6, per / this }'
done
if [ "$reference" = 1 ]; then
  awk -v this="${per[this]}" -v ref="${per[reference]}" \
    'BEGIN { printf "\nA lone cycle of this engine costs **%.2fx** the fixed reference'"'"'s instructions.\n", this / ref }'
  if [ -n "$base" ]; then
    awk -v base="${per[base]}" -v ref="${per[reference]}" \
      'BEGIN { printf "The base'"'"'s lone cycle costs %.2fx them.\n", base / ref }'
  fi
fi
