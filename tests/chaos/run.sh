#!/usr/bin/env bash
# The chaos run (`token-billing-tools chaos`) on a private PostgreSQL
# cluster: initdb as the postgres user in a temporary directory, on a spare
# loopback port — never the main cluster — which the run restarts with
# `pg_ctl restart -m immediate` (--postgres-restart-command). The cluster is
# removed on exit, however the run ends.
#
#   tests/chaos/run.sh [chaos arguments…]
#   tests/chaos/run.sh --seed 42 --seconds 60 --skewed-clock
#
# Environment: TOOLS (the token-billing-tools binary; default: beside
# CARGO_TARGET_DIR's debug build), PG_BIN (/usr/lib/postgresql/15/bin),
# CHAOS_PORT (5451). Needs root (PostgreSQL's tools run as postgres).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
pg_bin=${PG_BIN:-/usr/lib/postgresql/15/bin}
port=${CHAOS_PORT:-5451}
tools=${TOOLS:-${CARGO_TARGET_DIR:-$here/../../target}/debug/token-billing-tools}
[[ -x "$tools" ]] || { echo "build the tools first (cargo build): $tools" >&2; exit 2; }
if "$pg_bin/pg_isready" -q -h 127.0.0.1 -p "$port"; then
    echo "port $port is taken: set CHAOS_PORT to a free one" >&2
    exit 2
fi

dir=$(mktemp -d /tmp/tb-chaos.XXXXXX)
cleanup() {
    if [[ -f "$dir/data/postmaster.pid" ]]; then
        runuser -u postgres -- "$pg_bin/pg_ctl" stop -m immediate -D "$dir/data" >/dev/null 2>&1 || true
    fi
    rm -rf "$dir"
}
trap cleanup EXIT
chown postgres "$dir"
chmod 700 "$dir"
runuser -u postgres -- "$pg_bin/initdb" -D "$dir/data" -U postgres --auth=trust >/dev/null
cat >>"$dir/data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$dir'
max_connections = 100
CONF
runuser -u postgres -- "$pg_bin/pg_ctl" start -w -D "$dir/data" -l "$dir/postgres.log" >/dev/null

restart="runuser -u postgres -- $pg_bin/pg_ctl restart -m immediate -w -t 60 -D $dir/data -l $dir/postgres.log"
"$tools" --database-url "postgres://postgres@127.0.0.1:$port/tb_chaos" \
    chaos --postgres-restart-command "$restart" "$@"
