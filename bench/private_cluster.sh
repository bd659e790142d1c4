# Sourced by the bench scripts that need a PostgreSQL of their own
# (bench/profile.sh, bench/job_writes.sh): a throwaway cluster in a
# temporary directory on a spare port; the main cluster is never touched.
#
#   private_cluster_start DIR PORT [postgresql.conf line]...
#   private_cluster_stop DIR
#   private_cluster_sample PORT DATABASE   # "transactions xids wal_lsn"
#   private_cluster_install_engine PORT DATABASE SCHEMA [COMMIT]
#   reference_cycle_plpgsql   # the fixed reference's two statements, for PL/pgSQL
#
# The cluster's data directory is DIR/data, its log DIR/postgres.log; it
# listens on 127.0.0.1:PORT (trust authentication, user postgres).

pg_bin="/usr/lib/postgresql/$(ls /usr/lib/postgresql | sort -n | tail -n 1)/bin"
as_postgres() { runuser -u postgres -- "$@"; }

private_cluster_start() {
  local dir="$1" port="$2"
  shift 2
  chown postgres "$dir"
  as_postgres "$pg_bin/initdb" -D "$dir/data" -U postgres --auth=trust > /dev/null
  {
    echo "listen_addresses = '127.0.0.1'"
    echo "port = $port"
    echo "unix_socket_directories = '$dir'"
    echo "max_connections = 100"
    echo "shared_buffers = 256MB"
    printf '%s\n' "$@"
  } >> "$dir/data/postgresql.conf"
  as_postgres "$pg_bin/pg_ctl" start -w -D "$dir/data" -l "$dir/postgres.log" > /dev/null
}

private_cluster_stop() {
  if [ -f "$1/data/postmaster.pid" ]; then
    as_postgres "$pg_bin/pg_ctl" stop -m immediate -D "$1/data" > /dev/null 2>&1 || true
  fi
}

# The database's write statistics, as one line "transactions xids wal_lsn":
# its committed and rolled-back transactions, the next transaction id (so
# the difference of two samples is the transactions that wrote), and the
# cluster's WAL position.
private_cluster_sample() {
  psql -h 127.0.0.1 -p "$1" -U postgres -v ON_ERROR_STOP=1 -qtA -d "$2" -c \
    "SELECT (SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()),
            pg_snapshot_xmax(pg_current_snapshot())::text::bigint, pg_current_wal_lsn()" | tr '|' ' '
}

# Installs an engine (the files of src/engine/sql: this checkout's, or
# COMMIT's) into a schema of its own of DATABASE, in one transaction.
private_cluster_install_engine() {
  local port="$1" database="$2" schema="$3" commit="${4:-}" name
  {
    echo "CREATE SCHEMA $schema; SET search_path TO $schema, public;"
    if [ -z "$commit" ]; then
      for name in $(ls src/engine/sql | sort); do
        cat "src/engine/sql/$name"
        echo
      done
    else
      for name in $(git ls-tree --name-only "$commit" src/engine/sql/ | xargs -n1 basename | sort); do
        git show "$commit:src/engine/sql/$name"
        echo
      done
    fi
  } | psql -X -q -h 127.0.0.1 -p "$port" -U postgres -d "$database" -v ON_ERROR_STOP=1 -1 \
      > /dev/null
}

# The two statements of the fixed reference (bench/reference_cycle.pgbench.sql,
# read from that file, never copied) as PL/pgSQL, one per line: `:n`'s
# account becomes the variable `acc`, `:r_id` the variable `r`, and the
# answers go INTO `r` (the reservation) and `c` (how many committed).
reference_cycle_plpgsql() {
  local sql
  sql="$(grep -v '^--\|^\\' bench/reference_cycle.pgbench.sql \
    | sed -e 's/bench_uuid(:n)/acc/g' -e 's/:r_id/r/g' \
          -e 's/ SELECT id FROM held \\gset r_$/ SELECT id INTO r FROM held;/' \
          -e 's/ SELECT count(\*) AS committed FROM settled \\gset c_$/ SELECT count(*) INTO c FROM settled;/')"
  [ "$(grep -c ' INTO [rc] FROM ' <<< "$sql")" = 2 ] \
    || { echo "bench/reference_cycle.pgbench.sql: not the two statements expected" >&2; return 1; }
  printf '%s\n' "$sql"
}
