#!/usr/bin/env bash
# The restore drill (docs/backup.md): a backup counts once it has been
# restored and the books proved equal.
#
# On a private PostgreSQL cluster (initdb in a temporary directory, a spare
# port, as the postgres user; never the server on 5432), with pgBackRest and
# a local repository in the same directory:
#
#   1. the service (debug build) runs on it under kiosk load
#      (`token-billing-bench load`); a full backup is taken while the
#      load goes on, and WAL keeps archiving;
#   2. an admin posts a top-up and an adjustment; an instant T is noted
#      while the load runs, and only one with work in flight (held
#      reservations or unfinished jobs) is accepted: the money tables are
#      locked for a moment (EXCLUSIVE: readers go on, writers wait), so
#      every transaction that wrote them before T has committed and none
#      after; T is read from the database's clock, and the count and digest
#      of each table are taken in the same moment, with `token-billing
#      ledger-digest --until T`;
#   3. more load; `pgbackrest check` proves the WAL past T is archived;
#   4. the mistake: a superuser disables the append-only trigger and runs
#      DELETE FROM ledger_entries; the service and the cluster are stopped;
#   5. `pgbackrest restore --type=time --target=T` into a fresh data
#      directory, started on the same port, promoted at T;
#   6. proof: every table's count and digest equal those of step 2 (so what
#      was committed before T is there, identical, and nothing after T is),
#      the ledger digest equals, `token-billing reconcile` says ok; then the
#      service starts on the restored database, runs its start-up fix-ups,
#      serves, and reconciliation is still ok with no invariant violation.
#
# Prints one line with the counts and digests (and the time of each step),
# exits non-zero on any difference, and removes everything it made.
#
# To time the steps at a realistic size (docs/backup.md quotes those runs):
# DRILL_PADDING_MB=1024 adds that much filler data (a table in a database of
# its own, written set-based: about a minute per GB here) before the backup; DRILL_WAL_MB=1024 adds that much after it,
# which the restore must then replay from the archived WAL. DRILL_PORT
# (default 5461) is the cluster's port.
set -euo pipefail
cd "$(dirname "$0")/../.."

target_dir="${CARGO_TARGET_DIR:-${HOME:-/root}/.cache/token-billing-target}"
service_bin="$target_dir/debug/token-billing"
bench_bin="$target_dir/debug/token-billing-bench"
for binary in "$service_bin" "$bench_bin"; do
    [[ -x "$binary" ]] || { echo "drill: $binary missing: run cargo build first" >&2; exit 2; }
done
command -v pgbackrest >/dev/null || { echo "drill: pgbackrest missing (apt-get install pgbackrest)" >&2; exit 2; }
command -v promtool >/dev/null || { echo "drill: promtool missing (apt-get install prometheus)" >&2; exit 2; }
pg_bin="/usr/lib/postgresql/$(ls /usr/lib/postgresql | sort -n | tail -n 1)/bin"
port="${DRILL_PORT:-5461}"
padding_mb="${DRILL_PADDING_MB:-0}"
wal_mb="${DRILL_WAL_MB:-0}"
admin_key="drill-admin-key-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
export BENCH_ADMIN_KEY="$admin_key"

dir=""
service=""
load=""
cleanup() {
    local status=$?
    for pid in "$load" "$service"; do
        if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
        fi
    done
    if [[ -n "$dir" ]]; then
        for data in "$dir/data" "$dir/damaged"; do
            if [[ -f "$data/postmaster.pid" ]]; then
                runuser -u postgres -- "$pg_bin/pg_ctl" stop -m immediate -D "$data" >/dev/null 2>&1 || true
            fi
        done
        if [[ $status -ne 0 ]]; then
            for log in "$dir"/*.log "$dir"/log/*.log; do
                [[ -f "$log" ]] && { echo "--- $log (tail)" >&2; tail -n 30 "$log" >&2; }
            done
        fi
        rm -rf "$dir"
    fi
    exit $status
}
trap cleanup EXIT INT TERM

as_postgres() { runuser -u postgres -- "$@"; }
psql_at() { as_postgres psql -X -q -v ON_ERROR_STOP=1 -h "$dir" -p "$port" -U postgres -At "$@"; }
backrest() { as_postgres pgbackrest --config="$dir/pgbackrest.conf" --stanza=drill "$@"; }
now_ms() { date +%s%3N; }
seconds_since() { awk -v start="$1" -v end="$(now_ms)" 'BEGIN { printf "%.1f", (end - start) / 1000 }'; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

dir="$(mktemp -d /tmp/tb-backup-drill.XXXXXX)"
chown postgres "$dir"
chmod 700 "$dir"
database_url="postgres://postgres@127.0.0.1:$port/token_billing"

# --- the cluster and its pgBackRest stanza (the configuration of docs/backup.md,
# with the repository, logs and locks in the temporary directory)
as_postgres "$pg_bin/initdb" -D "$dir/data" -U postgres --auth=trust --data-checksums >/dev/null
cat >"$dir/pgbackrest.conf" <<CONF
[global]
repo1-path=$dir/repo
repo1-retention-full=2
repo1-cipher-type=aes-256-cbc
repo1-cipher-pass=$(head -c 24 /dev/urandom | base64)
log-path=$dir/log
lock-path=$dir/lock
spool-path=$dir/spool
log-level-console=warn
log-level-file=info
start-fast=y
compress-type=lz4
process-max=2

[drill]
pg1-path=$dir/data
pg1-port=$port
pg1-socket-path=$dir
CONF
chown postgres "$dir/pgbackrest.conf"
chmod 600 "$dir/pgbackrest.conf"
as_postgres mkdir "$dir/log"
cat >>"$dir/data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$dir'
max_connections = 60
wal_level = replica
archive_mode = on
archive_timeout = 300
archive_command = 'pgbackrest --config=$dir/pgbackrest.conf --stanza=drill archive-push %p'
CONF
as_postgres "$pg_bin/pg_ctl" start -w -D "$dir/data" -l "$dir/postgres.log" >/dev/null
backrest stanza-create
backrest check

# The load is four kiosks on one key as fast as the service answers, far above
# a kiosk's per-key rate limit: the limit is off here, as in every benchmark.
start_service() {
    local service_port
    service_port="$(free_port)"
    service_url="http://127.0.0.1:$service_port"
    DATABASE_URL="$database_url" BIND_ADDR="127.0.0.1:$service_port" ADMIN_API_KEY="$admin_key" RATE_LIMIT_PER_SECOND=0 \
        RUST_LOG=warn "$service_bin" serve >>"$dir/service.log" 2>&1 &
    service=$!
    for _ in $(seq 1 300); do
        curl -fsS "$service_url/readyz" >/dev/null 2>&1 && return 0
        kill -0 "$service" 2>/dev/null || { echo "drill: the service exited" >&2; return 1; }
        sleep 0.1
    done
    echo "drill: the service never became ready" >&2
    return 1
}
stop_service() {
    kill -TERM "$service"
    wait "$service" || true
    service=""
}
# Kiosk load in the background: reserve/commit cycles over 20 accounts, or
# the whole job pipeline with the simulated provider.
start_load() {
    RUST_LOG=error "$bench_bin" load --url "$service_url" --scenario "$1" \
        --accounts 20 --concurrency 4 --seconds "$2" >>"$dir/load.log" 2>&1 &
    load=$!
}
finish_load() {
    wait "$load"
    load=""
}
ledger_count() { psql_at -d token_billing -c "SELECT count(*) FROM ledger_entries"; }
wait_for_ledger_growth() {
    local floor=$(($(ledger_count) + $1))
    for _ in $(seq 1 1800); do
        (($(ledger_count) >= floor)) && return 0
        sleep 0.1
    done
    echo "drill: the load did not write $1 ledger entries in 180 s" >&2
    return 1
}

# The tables whose rows must come back exactly: count and md5 of the rows'
# text in id order, one "table=count:digest" word each.
tables="accounts ledger_entries reservations generation_jobs credits adjustments credit_grants"
table_digests_sql() {
    local select="" table
    for table in $tables; do
        select+="${select:+, }(SELECT '$table=' || count(*) || ':' || left(coalesce(md5(string_agg(t::text, E'\\n' ORDER BY t.id)), '-'), 16) FROM $table t)"
    done
    echo "SELECT concat_ws(' ', $select)"
}

start_service

# Filler data in a database of its own, of text that compresses about as
# well as the ledger's: one row per 110 bytes asked for, which is about its
# heap; with its primary key a row takes about 130 bytes, so
# DRILL_PADDING_MB=N gives a database of about 1.2 N MB (4096: 4.9 GB).
# Set-based, straight into PostgreSQL (not through the service): chunks of
# 2 million rows, INSERT ... SELECT from generate_series, two sessions at a
# time, the primary key built once at the end.
#
# The filler before the backup is written with archiving turned into a no-op
# (archive_command '/bin/true', then back): no restore from the full backup
# taken afterwards needs WAL from before it (a database that grew over months
# has had that WAL expired too), and archiving 20 GB of it would double the
# disk and time of a 20 GB run. `pgbackrest check` then proves archiving
# reaches the repository again before the backup. The filler after the
# backup (DRILL_WAL_MB) is archived: the restore replays it.
pad() {
    local table="$1" megabytes="$2" archived="$3" step lsn rows chunk=2000000
    (( megabytes > 0 )) || return 0
    step="$(now_ms)"
    lsn="$(psql_at -d postgres -c "SELECT pg_current_wal_lsn()")"
    rows=$((megabytes * 1024 * 1024 / 110))
    if [[ "$archived" == unarchived ]]; then
        psql_at -d postgres -c "ALTER SYSTEM SET archive_command = '/bin/true'" -c "SELECT pg_reload_conf()" >/dev/null
    fi
    psql_at -d postgres -c "SELECT 1 FROM pg_database WHERE datname = 'padding'" | grep -q 1 \
        || psql_at -d postgres -c "CREATE DATABASE padding"
    psql_at -d padding -c "CREATE TABLE $table (id bigint, account_id uuid, amount bigint,
            note text, created_at timestamptz) WITH (autovacuum_enabled = false)"
    seq 0 $(((rows - 1) / chunk)) | xargs -P 2 -I{} runuser -u postgres -- psql -X -q -v ON_ERROR_STOP=1 \
        -h "$dir" -p "$port" -U postgres -d padding -c "INSERT INTO $table
            SELECT g, gen_random_uuid(), (random() * 1000)::bigint, md5(random()::text), clock_timestamp()
            FROM generate_series({}::bigint * $chunk + 1, least(({}::bigint + 1) * $chunk, $rows)) g"
    psql_at -d padding -c "ALTER TABLE $table ADD PRIMARY KEY (id)"
    if [[ "$archived" == unarchived ]]; then
        psql_at -d postgres -c "ALTER SYSTEM RESET archive_command" -c "SELECT pg_reload_conf()" >/dev/null
        backrest check
    fi
    echo "drill: $megabytes MB of $table in $(seconds_since "$step") s, WAL written" \
        "($archived): $(psql_at -d postgres -c "SELECT pg_size_pretty(pg_current_wal_lsn() - '$lsn')")," \
        "database padding: $(psql_at -d postgres -c "SELECT pg_size_pretty(pg_database_size('padding'))")"
}
pad filler_before_backup "$padding_mb" unarchived
database_size="$(psql_at -d postgres -c "SELECT pg_size_pretty(sum(pg_database_size(datname))::bigint) FROM pg_database")"

# 1. Load, and a full backup taken while it goes on.
start_load spread 6
wait_for_ledger_growth 50
step="$(now_ms)"
backrest backup --type=full
backup_seconds="$(seconds_since "$step")"
backup_sizes="$(backrest info --output=json | jq -r '.[0].backup[-1].info
    | "\(.size / 1048576 | floor) MB, \(.repository.size / 1048576 | floor) MB in the repository"')"
finish_load

pad filler_after_backup "$wal_mb" archived

# 2. The instant T, under load (the job pipeline this time).
start_load jobs 8
wait_for_ledger_growth 30
# A top-up and an adjustment through the admin API before T, so the credits
# and adjustments that must come back include ones posted by an admin (the
# adjustments table is otherwise empty and its digest proves nothing).
# The key reaches curl on its standard input (`--config -`), never on its
# command line, which every user of the host sees in `ps`.
admin_post() {
    printf 'header = "Authorization: Bearer %s"\n' "$admin_key" \
        | curl -fsS --config - -H "Content-Type: application/json" \
            -d "$2" "$service_url$1" >/dev/null
}
drill_account="$(psql_at -d token_billing -c "SELECT id FROM accounts ORDER BY id LIMIT 1")"
admin_post "/v1/accounts/$drill_account/credits" '{"amount":500,"external_ref":"drill-credit-before-t"}'
admin_post "/v1/accounts/$drill_account/adjustments" \
    '{"amount":-3,"reason":"drill: a correction before T","external_ref":"drill-adjustment-before-t"}'
# T must catch work in flight (reservations held, jobs queued or running), or
# the restored service's fix-ups have nothing to do and the drill proves
# nothing about them. The lock waits for the transactions that hold these
# tables; should it deadlock with one of them (PostgreSQL then cancels one
# side), or find nothing in flight, T is taken again once the load has
# written more, at most 8 times.
in_flight_sql="SELECT (SELECT count(*) FROM reservations WHERE state = 'held')
    || ' ' || (SELECT count(*) FROM generation_jobs WHERE status IN ('queued', 'running'))"
at_t=""
t_instant=""
for attempt in 1 2 3 4 5 6 7 8; do
    if at_t="$(psql_at -d token_billing <<SQL
BEGIN;
SET LOCAL lock_timeout = '10s';
LOCK TABLE $(echo "$tables" | tr ' ' ',') IN EXCLUSIVE MODE;
SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"');
$(table_digests_sql);
$in_flight_sql;
COMMIT;
SQL
)"; then
        read -r held_at_t unfinished_at_t <<<"$(sed -n 3p <<<"$at_t")"
        if (( held_at_t + unfinished_at_t > 0 )); then
            t_instant="$(sed -n 1p <<<"$at_t")"
            break
        fi
        echo "drill: nothing in flight at $(sed -n 1p <<<"$at_t") (attempt $attempt), T again" >&2
    else
        echo "drill: taking T failed (attempt $attempt), again" >&2
    fi
    if ! kill -0 "$load" 2>/dev/null; then
        finish_load
        start_load jobs 8
    fi
    wait_for_ledger_growth 5
done
[[ -n "$t_instant" ]] || { echo "drill: no instant T with work in flight in 8 attempts: $at_t" >&2; exit 1; }
digests_at_t="$(sed -n 2p <<<"$at_t")"
[[ "$t_instant" == 20* && "$digests_at_t" == accounts=* ]] || { echo "drill: no instant T: $at_t" >&2; exit 1; }
[[ "$digests_at_t" != *" adjustments=0:"* ]] || { echo "drill: no adjustment before T: $digests_at_t" >&2; exit 1; }
ledger_digest_at_t="$("$service_bin" --database-url "$database_url" ledger-digest --until "$t_instant")"

# 3. More load after T, then proof that the WAL past T is in the repository
# (check switches to a new WAL segment and waits for it to be archived).
finish_load
start_load spread 4
finish_load
backrest check
entries_before_mistake="$(ledger_count)"

# The backup metrics (prometheus/backup-metrics.sh) on this cluster: the
# full backup is listed, and the last archived WAL is recent.
cp prometheus/backup-metrics.sh "$dir/backup-metrics.sh"
metrics="$(as_postgres env PGHOST="$dir" PGPORT="$port" PGUSER=postgres \
    "$dir/backup-metrics.sh" --config "$dir/pgbackrest.conf" --stanza drill)"
promtool check metrics <<<"$metrics"
metric() { awk -v name="$1" 'index($1, name) == 1 { print $2 }' <<<"$metrics"; }
now="$(date +%s)"
full_backup_at="$(metric 'token_billing_backup_last_success_timestamp_seconds{stanza="drill",type="full"}')"
wal_archived_at="$(metric 'token_billing_backup_wal_last_archived_timestamp_seconds{')"
if ! (( now - full_backup_at < 600 && now - wal_archived_at < 60 )) \
    || [[ "$(metric 'token_billing_backup_repository_ok{')" != 1 ]]; then
    echo "drill: implausible backup metrics (now $now):" >&2
    echo "$metrics" >&2
    exit 1
fi

# 4. The mistake, by a superuser who can disable the append-only trigger.
psql_at -d token_billing \
    -c "ALTER TABLE ledger_entries DISABLE TRIGGER ledger_entries_no_update_delete" \
    -c "DELETE FROM ledger_entries" >/dev/null
[[ "$(ledger_count)" == 0 ]]
stop_service
as_postgres "$pg_bin/pg_ctl" stop -w -m fast -D "$dir/data" >/dev/null

# 5. Restore to T into a fresh data directory, as docs/backup.md says: the
# damaged one moved aside (kept until the books are proved), an empty one
# at the configured path; PostgreSQL replays the archived WAL up to T and
# promotes, on the same port.
mv "$dir/data" "$dir/damaged"
step="$(now_ms)"
# pgBackRest takes the instant as "YYYY-MM-DD HH:MM:SS.ffffff+00".
backrest restore --type=time --target="$(sed 's/T/ /; s/Z$/+00/' <<<"$t_instant")" \
    --target-action=promote
restore_seconds="$(seconds_since "$step")"
step="$(now_ms)"
as_postgres "$pg_bin/pg_ctl" start -w -t 600 -D "$dir/data" -l "$dir/restored.log" >/dev/null
for _ in $(seq 1 3000); do
    [[ "$(psql_at -d postgres -c "SELECT pg_is_in_recovery()")" == f ]] && break
    sleep 0.1
done
[[ "$(psql_at -d postgres -c "SELECT pg_is_in_recovery()")" == f ]] || { echo "drill: the restored cluster never promoted" >&2; exit 1; }
recovery_seconds="$(seconds_since "$step")"

# 6. The proof, before the service touches the restored database...
digests_restored="$(psql_at -d token_billing -c "$(table_digests_sql)")"
ledger_digest_restored="$("$service_bin" --database-url "$database_url" ledger-digest --until "$t_instant")"
if [[ "$digests_restored" != "$digests_at_t" ]]; then
    echo "drill: the restored tables differ from T's:" >&2
    echo "  at T:     $digests_at_t" >&2
    echo "  restored: $digests_restored" >&2
    exit 1
fi
if [[ "$ledger_digest_restored" != "$ledger_digest_at_t" ]]; then
    echo "drill: the ledger digest differs: $ledger_digest_at_t / $ledger_digest_restored" >&2
    exit 1
fi
# The same chain recomputed without the service's code, as an auditor
# would (docs/backup.md, "The ledger digest").
recomputed="$(psql_at -d token_billing -c "SELECT row_to_json(e) FROM ledger_entries e
    WHERE created_at <= '$t_instant' ORDER BY id" | python3 tests/backup/ledger_digest.py)"
if [[ "$(jq -r .digest <<<"$recomputed")" != "$(jq -r .digest <<<"$ledger_digest_at_t")" ]]; then
    echo "drill: the independent recomputation differs: $recomputed / $ledger_digest_at_t" >&2
    exit 1
fi
entries_at_t="$(jq -r .entries <<<"$ledger_digest_at_t")"
(( entries_before_mistake > entries_at_t )) || { echo "drill: no load after T" >&2; exit 1; }
"$service_bin" --database-url "$database_url" reconcile >"$dir/reconcile-restored.json" \
    || { echo "drill: reconciliation of the restored database is not ok" >&2; cat "$dir/reconcile-restored.json" >&2; exit 1; }

# ...then the service on it: start-up fix-ups, serving, books balanced.
# Work in flight at T comes back in flight: its reservations stay held
# (their kiosks are gone: they expire after their TTL), its jobs are
# resumed once the dead replica's leases run out.
unfinished_jobs_sql="SELECT count(*) FROM generation_jobs WHERE status IN ('queued', 'running')"
[[ "$(psql_at -d token_billing -c "$in_flight_sql")" == "$held_at_t $unfinished_at_t" ]] \
    || { echo "drill: the restored database's work in flight differs from T's ($held_at_t $unfinished_at_t)" >&2; exit 1; }
step="$(now_ms)"
start_service
service_start_seconds="$(seconds_since "$step")"
for _ in $(seq 1 1200); do
    [[ "$(psql_at -d token_billing -c "$unfinished_jobs_sql")" == 0 ]] && break
    sleep 0.1
done
[[ "$(psql_at -d token_billing -c "$unfinished_jobs_sql")" == 0 ]] \
    || { echo "drill: the restored service did not finish the jobs in flight at T within 120 s" >&2; exit 1; }
jobs_done_seconds="$(seconds_since "$step")"
"$service_bin" --database-url "$database_url" reconcile >"$dir/reconcile-served.json" \
    || { echo "drill: reconciliation after the service's start-up is not ok" >&2; cat "$dir/reconcile-served.json" >&2; exit 1; }
violations="$(curl -fsS "$service_url/metrics" | awk '$1 == "token_billing_invariant_violations" { print $2 }')"
[[ "$violations" == 0 ]] || { echo "drill: invariant violations after start-up: '$violations'" >&2; exit 1; }
stop_service

echo "drill: T=$t_instant database=$database_size backup=${backup_seconds}s ($backup_sizes) restore=${restore_seconds}s" \
    "replay+promote=${recovery_seconds}s service-ready=${service_start_seconds}s" \
    "ledger-digest=$(jq -r .digest <<<"$ledger_digest_at_t" | cut -c1-16)… entries=$entries_at_t" \
    "(restored: same, recomputed by tests/backup/ledger_digest.py: same; before the DELETE: $entries_before_mistake, after it: 0)" \
    "in flight at T: $held_at_t held reservations, $unfinished_at_t unfinished jobs (finished ${jobs_done_seconds}s after start-up)" \
    "tables at T = restored: $digests_at_t; reconcile=ok invariant_violations=0"
