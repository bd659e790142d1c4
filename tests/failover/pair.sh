# Sourced by tests/failover/run.sh and bench/replication.sh: builds a
# private PostgreSQL primary and streaming standby in a temporary directory,
# as the postgres user, and removes them on exit (trap).
#
# Needs: pg_bin, primary_port, standby_port and mode (sync: the primary
# waits for the standby, named standby1, on every commit; async: it does
# not) set by the caller. Sets dir.
dir=""
cleanup() {
    if [[ -n "$dir" ]]; then
        for node in primary standby; do
            if [[ -f "$dir/$node/postmaster.pid" ]]; then
                runuser -u postgres -- "$pg_bin/pg_ctl" stop -m immediate -D "$dir/$node" >/dev/null 2>&1 || true
            fi
        done
        rm -rf "$dir"
    fi
}
trap cleanup EXIT

pg() { runuser -u postgres -- "$@"; }

# One pair: primary on $primary_port, standby streaming from it.
build_pair() {
    cleanup
    dir=$(mktemp -d /tmp/tb-failover.XXXXXX)
    chown postgres "$dir"
    chmod 700 "$dir"
    pg "$pg_bin/initdb" -D "$dir/primary" -U postgres --auth=trust >/dev/null
    # Only the test's settings differ from a production primary's:
    # loopback, a private socket directory, fsync kept on.
    cat >>"$dir/primary/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $primary_port
unix_socket_directories = '$dir'
wal_level = replica
max_wal_senders = 4
max_connections = 60
CONF
    echo "host replication postgres 127.0.0.1/32 trust" >>"$dir/primary/pg_hba.conf"
    local sync_names=""
    if [[ "$mode" == sync ]]; then
        # On the command line, not in postgresql.conf: the standby's copy of
        # the configuration must not wait for a standby of its own once
        # promoted (see docs/high-availability.md).
        sync_names="-c synchronous_standby_names=standby1 -c synchronous_commit=on"
    fi
    pg "$pg_bin/pg_ctl" start -w -D "$dir/primary" -l "$dir/primary.log" -o "$sync_names" >/dev/null
    pg "$pg_bin/pg_basebackup" -h 127.0.0.1 -p "$primary_port" -U postgres \
        -D "$dir/standby" -R -X stream >/dev/null
    # The standby's name (for synchronous_standby_names) and its own port.
    sed -i "s/^primary_conninfo = '/primary_conninfo = 'application_name=standby1 /" \
        "$dir/standby/postgresql.auto.conf"
    pg "$pg_bin/pg_ctl" start -w -D "$dir/standby" -l "$dir/standby.log" \
        -o "-p $standby_port" >/dev/null
    local expected=async
    [[ "$mode" == sync ]] && expected=sync
    for _ in $(seq 1 100); do
        state=$(pg psql -h 127.0.0.1 -p "$primary_port" -U postgres -Atc \
            "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby1'" 2>/dev/null || true)
        [[ "$state" == "$expected" ]] && return 0
        sleep 0.1
    done
    echo "the standby never reached sync_state=$expected (got '$state')" >&2
    return 1
}

