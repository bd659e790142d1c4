#!/usr/bin/env bash
# Failover test: a private PostgreSQL primary and standby (initdb and
# pg_basebackup as the postgres user, in a temporary directory, on spare
# ports — never the main cluster), the chaos run's kiosk workload from two
# service replicas, SIGKILL of the primary at a random moment, promotion of
# the standby, then the books checked on the new primary.
#
#   tests/failover/run.sh [--mode sync|async] [--runs N] [--seconds S] [--seed N]
#                         [--standby-lag-ms N]
#
# --mode sync (default): synchronous_standby_names names the standby and
# synchronous_commit is on, so every acknowledged commit is on both; the
# run fails on any acknowledged movement missing. --mode async: the same
# with asynchronous replication; lost acknowledged work is reported (and
# does not fail the run). --standby-lag-ms N stops the primary's WAL
# sender for N ms just before the kill, as a slow network would: the
# asynchronous primary goes on acknowledging what the standby never gets.
#
# Environment: TOOLS (the token-billing-tools binary; default: beside
# CARGO_TARGET_DIR's debug build), PG_BIN (/usr/lib/postgresql/15/bin),
# FAILOVER_PRIMARY_PORT / FAILOVER_STANDBY_PORT (5441 / 5442; 5441–5449).
set -euo pipefail

# The kill-and-promote step, run by the chaos run at its random moment.
if [[ "${1:-}" == "--kill-and-promote" ]]; then
    dir=$2
    pg_bin=$3
    lag_ms=${4:-0}
    sender=""
    if (( lag_ms > 0 )); then
        # A standby falling behind (a slow network): the primary's WAL sender
        # stops for lag_ms before the primary dies, so what the primary
        # commits meanwhile never leaves it. (Stopping the standby's receiver
        # instead would not do: the WAL already sent waits in the socket and
        # is read after the primary's death.)
        primary=$(head -n 1 "$dir/primary/postmaster.pid")
        for child in $(pgrep -P "$primary"); do
            if grep -q "walsender" "/proc/$child/cmdline" 2>/dev/null; then sender=$child; fi
        done
        [[ -n "$sender" ]] && kill -STOP "$sender"
        echo "failover: the primary's WAL sender ($sender) stopped for $lag_ms ms" >&2
        sleep "$(awk "BEGIN {print $lag_ms / 1000}")"
    fi
    pid=$(head -n 1 "$dir/primary/postmaster.pid")
    # The machine is gone: the postmaster and every backend at once.
    children=$(pgrep -P "$pid" || true)
    kill -KILL "$pid" $children 2>/dev/null || true
    echo "failover: SIGKILL to the primary (postmaster $pid)" >&2
    runuser -u postgres -- "$pg_bin/pg_ctl" promote -w -t 30 -D "$dir/standby" >/dev/null
    echo "failover: standby promoted" >&2
    exit 0
fi

mode=sync
runs=1
seconds=30
seed=""
lag_ms=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --mode) mode=$2; shift 2 ;;
        --runs) runs=$2; shift 2 ;;
        --seconds) seconds=$2; shift 2 ;;
        --seed) seed=$2; shift 2 ;;
        --standby-lag-ms) lag_ms=$2; shift 2 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
[[ "$mode" == sync || "$mode" == async ]] || { echo "--mode is sync or async" >&2; exit 2; }

pg_bin=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)}
primary_port=${FAILOVER_PRIMARY_PORT:-5441}
standby_port=${FAILOVER_STANDBY_PORT:-5442}
for port in "$primary_port" "$standby_port"; do
    if (( port < 5441 || port > 5449 )); then
        echo "ports must be in 5441–5449 (got $port)" >&2
        exit 2
    fi
done
here=$(cd "$(dirname "$0")" && pwd)
tools=${TOOLS:-${CARGO_TARGET_DIR:-$here/../../target}/debug/token-billing-tools}
[[ -x "$tools" ]] || { echo "build the tools first (cargo build): $tools" >&2; exit 2; }
script="$here/run.sh"

# shellcheck source=tests/failover/pair.sh
source "$here/pair.sh"

url="postgres://postgres@127.0.0.1:$primary_port,127.0.0.1:$standby_port/tb_chaos_failover?target_session_attrs=read-write&connect_timeout=2"
failed=0
for run in $(seq 1 "$runs"); do
    build_pair
    run_seed=${seed:-$RANDOM$RANDOM}
    echo "== failover run $run/$runs: mode=$mode seed=$run_seed"
    set +e
    "$tools" --database-url "$url" chaos --seed "$run_seed" --seconds "$seconds" \
        --replicas 2 --kiosks 8 --accounts 3 \
        --failover-command "$script --kill-and-promote $dir $pg_bin $lag_ms" | tee "$dir/report.txt"
    status=${PIPESTATUS[0]}
    set -e
    if [[ "$mode" == sync && $status -ne 0 ]]; then
        failed=1
    fi
    if [[ "$mode" == async && $status -ne 0 ]]; then
        echo "(asynchronous replication: acknowledged work may be lost; see the missing counts above)"
    fi
done
cleanup
dir=""
exit $failed
