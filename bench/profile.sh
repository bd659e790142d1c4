#!/usr/bin/env bash
# Where the service's time goes inside PostgreSQL, under kiosk load.
#
# Usage:
#   bench/profile.sh [--scenario spread|hot|jobs] [--kiosks N] [--seconds S] [--accounts A] [--build release|debug]
# Defaults: spread, 32 kiosks, 10 s, 1,000 accounts, release (cargo build
# --release first; debug: cargo build). Needs the PostgreSQL server packages.
#
# A private cluster (initdb in a temporary directory, port PROFILE_PORT,
# default 5471; the main cluster is not touched) with pg_stat_statements
# (track = all: statements inside the engine's functions too) and
# track_functions = pl. The release service runs on it;
# `token-billing-bench load` drives it; the statistics are reset when
# the load's measured window opens (after its warm-up). Printed: the load's
# line, then the statements by total time (calls, mean ms, share of the
# total, time per cycle) and the engine's functions by their own time
# (self_time: without the functions they call), and the CPU a cycle cost
# each process (the service, PostgreSQL, the rest of the machine: the load
# generator). Everything it made is
# removed at the end. PROFILE_URL_SUFFIX is appended to the service's
# DATABASE_URL, to try a setting on its sessions, e.g.
# PROFILE_URL_SUFFIX='?options=-c%20plan_cache_mode%3Dforce_generic_plan'.
set -euo pipefail
cd "$(dirname "$0")/.."

scenario=spread kiosks=32 seconds=10 accounts=1000 build=release
while [ $# -gt 0 ]; do
  case "$1" in
    --scenario) scenario="$2"; shift ;;
    --kiosks) kiosks="$2"; shift ;;
    --seconds) seconds="$2"; shift ;;
    --accounts) accounts="$2"; shift ;;
    --build) build="$2"; shift ;;
    *) sed -n '2,7p' "$0" >&2; exit 2 ;;
  esac
  shift
done

target_dir="${CARGO_TARGET_DIR:-target}"
# BIN_DIR: another build's binaries (e.g. the pinned reference's, from
# bench/pinned_build.sh) instead of this checkout's.
binary="${BIN_DIR:-$target_dir/$build}/token-billing"
[ -x "$binary" ] || { echo "build first: cargo build --release ($binary missing)" >&2; exit 1; }
. bench/load_generator.sh
load_generator "${BIN_DIR:-$target_dir/$build}" || exit 1
. bench/private_cluster.sh
port="${PROFILE_PORT:-5471}"
service_port=18095
key="profile-admin-key-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
dir="$(mktemp -d /tmp/tb-profile.XXXXXX)"
service=""
cleanup() {
  [ -n "$service" ] && { kill -TERM "$service" 2> /dev/null || true; wait "$service" 2> /dev/null || true; }
  private_cluster_stop "$dir"
  rm -rf "$dir"
}
trap cleanup EXIT

private_cluster_start "$dir" "$port" \
  "shared_preload_libraries = 'pg_stat_statements'" \
  "pg_stat_statements.track = all" \
  "track_functions = pl"
psql_db() { psql -h 127.0.0.1 -p "$port" -U postgres -v ON_ERROR_STOP=1 -qtA "$@"; }

database_url="postgres://postgres@127.0.0.1:$port/tb_profile${PROFILE_URL_SUFFIX:-}"
DATABASE_URL="$database_url" BIND_ADDR="127.0.0.1:$service_port" ADMIN_API_KEY="$key" \
  RATE_LIMIT_PER_SECOND=0 RUST_LOG=warn "$binary" serve > "$dir/service.log" 2>&1 &
service=$!
for _ in $(seq 1 600); do
  curl -fsS "http://127.0.0.1:$service_port/readyz" > /dev/null 2>&1 && break
  sleep 0.1
done
curl -fsS "http://127.0.0.1:$service_port/readyz" > /dev/null || { cat "$dir/service.log" >&2; exit 1; }
psql_db -d tb_profile -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" > /dev/null

# CPU by process (clock ticks of user + system time from /proc): the
# service, every process of the private cluster (postmaster and its
# children: the backends), and the whole machine (/proc/stat: the load
# generator and anything else is the rest), sampled when the measured
# window opens and again when it closes (the hook below runs through it).
postmaster="$(head -n 1 "$dir/data/postmaster.pid")"
cat > "$dir/cpu_sample.sh" << SAMPLE
#!/bin/bash
pg=0
for pid in $postmaster \$(pgrep -P $postmaster); do
  pg=\$((pg + \$(awk '{ print \$14 + \$15 }' "/proc/\$pid/stat" 2> /dev/null || echo 0)))
done
echo "\$(awk '{ print \$14 + \$15 }' /proc/$service/stat) \$pg \$(awk '/^cpu / { print \$2 + \$3 + \$4 + \$7 + \$8 }' /proc/stat)"
SAMPLE
chmod +x "$dir/cpu_sample.sh"
reset="psql -h 127.0.0.1 -p $port -U postgres -qtA -d tb_profile -c 'SELECT pg_stat_statements_reset()' -c 'SELECT pg_stat_reset()' > /dev/null; $dir/cpu_sample.sh > $dir/cpu.start; sleep $seconds; $dir/cpu_sample.sh > $dir/cpu.end"
line="$("${bench[@]}" load --url "http://127.0.0.1:$service_port" --admin-key "$key" \
  --scenario "$scenario" --accounts "$accounts" --concurrency "$kiosks" --seconds "$seconds" \
  --service-pid "$service" --on-measure "$reset")"
echo "$line"
cycles_per_s="$(sed -n 's/.*cycles_per_s=\([0-9.]*\).*/\1/p' <<< "$line")"
cycles="$(awk -v r="${cycles_per_s:-0}" -v s="$seconds" 'BEGIN { printf "%d", r * s }')"
[ "$cycles" -gt 0 ] || { echo "no cycles measured" >&2; exit 1; }

echo
read -r s0 p0 m0 < "$dir/cpu.start"
read -r s1 p1 m1 < "$dir/cpu.end"
awk -v s=$((s1 - s0)) -v p=$((p1 - p0)) -v m=$((m1 - m0)) -v c="$cycles" -v hz="$(getconf CLK_TCK)" \
  'BEGIN { f = 1000 / hz / c;
           printf "CPU per cycle (ms): service %.3f, PostgreSQL %.3f, the rest (load generator, other) %.3f, machine %.3f\n",
                  s * f, p * f, (m - s - p) * f, m * f }'
echo
echo "statements by total time ($cycles cycles measured; 'top' = called by the service, not from inside a function)"
psql_db -d tb_profile -F ' | ' -c "
  SELECT to_char(total_exec_time / sum(total_exec_time) OVER () * 100, 'FM990.0') || ' %',
         calls, to_char(mean_exec_time, 'FM990.000') || ' ms',
         to_char(total_exec_time / $cycles, 'FM990.000') || ' ms/cycle',
         CASE WHEN toplevel THEN 'top' ELSE 'nested' END,
         left(regexp_replace(query, '\s+', ' ', 'g'), 110)
  FROM pg_stat_statements
  WHERE dbid = (SELECT oid FROM pg_database WHERE datname = 'tb_profile')
  ORDER BY total_exec_time DESC LIMIT 15"
echo
# Statements per batch: every statement the engine ran inside PostgreSQL
# (pg_stat_statements, track = all) per top-level engine_apply call (older
# builds called their lone path, engine_lean_one, directly for a batch of
# one), with
# the foreign-key checks PostgreSQL runs on its own (`SELECT 1 FROM ONLY …
# FOR KEY SHARE`) counted apart. With one kiosk every batch is one request.
echo "statements inside the engine, per batch (engine_apply; one request per batch at 1 kiosk)"
psql_db -d tb_profile -F ' | ' -c "
  WITH s AS (
    SELECT sum(calls) FILTER (WHERE toplevel AND (query LIKE '%engine_apply(%'
                                                  OR query LIKE '%engine_lean_one(%')) AS batches,
           sum(calls) FILTER (WHERE NOT toplevel AND query NOT LIKE 'SELECT 1 FROM ONLY %FOR KEY SHARE%'
                                AND query NOT LIKE '%FOR KEY SHARE OF x') AS statements,
           sum(calls) FILTER (WHERE NOT toplevel AND (query LIKE 'SELECT 1 FROM ONLY %FOR KEY SHARE%'
                                OR query LIKE '%FOR KEY SHARE OF x')) AS key_checks
    FROM pg_stat_statements
    WHERE dbid = (SELECT oid FROM pg_database WHERE datname = 'tb_profile'))
  SELECT 'batches ' || batches, 'statements/batch ' || to_char(statements / batches, 'FM990.00'),
         'foreign-key checks/batch ' || to_char(key_checks / batches, 'FM990.00')
  FROM s"
echo
echo "engine functions by own time (self_time excludes the functions they call)"
psql_db -d tb_profile -F ' | ' -c "
  SELECT funcname, calls, to_char(self_time / calls, 'FM990.000') || ' ms self',
         to_char(total_time / calls, 'FM990.000') || ' ms total',
         to_char(self_time / $cycles, 'FM990.000') || ' ms/cycle self'
  FROM pg_stat_user_functions WHERE calls > 0 ORDER BY self_time DESC LIMIT 15"
echo
echo "transactions and WAL per cycle"
psql_db -d tb_profile -F ' | ' -c "
  SELECT 'commits/cycle ' || to_char(xact_commit::numeric / $cycles, 'FM990.00'),
         'rollbacks ' || xact_rollback
  FROM pg_stat_database WHERE datname = 'tb_profile'"
