#!/usr/bin/env bash
# Failover without a person: three etcd members and three Patroni-managed
# PostgreSQL 15 nodes (one primary, one synchronous standby, one
# asynchronous) in a temporary directory on spare loopback ports — never
# the main cluster — with the chaos run's kiosk workload from two service
# replicas on the multi-host URL (target_session_attrs=read-write). One
# chaos run per step, each checking the books afterwards (every
# acknowledged reservation, commit, credit, job creation and job success on
# the primary of the moment; the invariants, the ledger replay and
# reconciliation; no 500) and timing the time from the fault to the first
# reservation accepted:
#
#   host-kill    SIGKILL of the primary's Patroni, postmaster and backends:
#                Patroni promotes the synchronous standby by itself; the
#                old primary's Patroni is started again and rejoins as a
#                standby (pg_rewind), and the cluster is synchronous again
#   host-stop    the same with SIGSTOP (a hung host that holds its
#                sockets), resumed with SIGCONT once another node leads
#   switchover   patronictl switchover to the synchronous standby
#   etcd-member  the etcd leader is killed for one ttl, then restarted:
#                the primary stays, kiosks see nothing
#   etcd-quorum  two of three etcd members are killed: the primary demotes
#                itself (no writes: 503), then the quorum comes back and
#                so do writes
#
#   tests/failover/patroni.sh [--runs N] [--seconds S] [--seed N] [--steps "host-kill …"]
#   tests/failover/patroni.sh --scale [--seconds S] [--seed N]   (chaos at scale, below)
#
# It fails unless every step's chaos run passes, the first reservation
# after a host loss is accepted within 30 s, a switchover costs at most 5 s
# of 503s and no other error, and losing one etcd member costs nothing.
# Patroni's configuration is tests/failover/patroni.yml, as
# docs/high-availability.md shows it. Needs root (the nodes run as the
# postgres user); installs Debian's etcd-server and etcd-client when
# missing, and Patroni 4.1.5 from PyPI (with psycopg 3) in a
# virtual environment outside the clone — not Debian's patroni 3.0.2, whose
# etcd3 client can write the leader key over a newer leader's
# (patroni/patroni#2689; docs/high-availability.md).
#
# Environment: TOOLS (token-billing-tools; default: beside
# CARGO_TARGET_DIR's debug build), PATRONI_PORT_BASE (5470: etcd clients
# base+1..3, etcd peers base+4..6, PostgreSQL base+11..13, Patroni's REST
# API base+21..23), PATRONI_VENV (where Patroni is installed; default
# /var/cache/token-billing/patroni-<version>: the postgres user must be
# able to run it, so not under root's home), PATRONI_LOGS (where a failed
# step's logs go; default ci-output/patroni), PATRONI_KEEP_LOGS (set: keep
# every step's logs, not only a failed one's).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
script="$here/patroni.sh"
pg_bin=/usr/lib/postgresql/15/bin
# Patroni from PyPI, pinned; psycopg 3 (binary wheel) is its driver.
patroni_version=4.1.5
psycopg_version=3.3.9
venv=${PATRONI_VENV:-/var/cache/token-billing/patroni-$patroni_version}
base=${PATRONI_PORT_BASE:-5470}
nodes=(1 2 3)

etcd_client() { echo $((base + $1)); }
etcd_peer() { echo $((base + 3 + $1)); }
pg_port() { echo $((base + 10 + $1)); }
rest_port() { echo $((base + 20 + $1)); }
etcd_hosts() { echo "127.0.0.1:$(etcd_client 1),127.0.0.1:$(etcd_client 2),127.0.0.1:$(etcd_client 3)"; }
now() { date +%s.%N; }
since() { awk -v start="$1" -v end="$(now)" 'BEGIN { printf "%.1f", end - start }'; }
say() { echo "patroni: $*" >&2; }

# The nodes run as postgres: setpriv execs (no fork, unlike runuser), so
# the $! of `setpriv … &` is the node's own process.

start_etcd() {
    local i=$1
    setpriv --reuid=postgres --regid=postgres --init-groups -- etcd --name "e$i" --data-dir "$dir/etcd$i" \
        --listen-client-urls "http://127.0.0.1:$(etcd_client "$i")" \
        --advertise-client-urls "http://127.0.0.1:$(etcd_client "$i")" \
        --listen-peer-urls "http://127.0.0.1:$(etcd_peer "$i")" \
        --initial-advertise-peer-urls "http://127.0.0.1:$(etcd_peer "$i")" \
        --initial-cluster "e1=http://127.0.0.1:$(etcd_peer 1),e2=http://127.0.0.1:$(etcd_peer 2),e3=http://127.0.0.1:$(etcd_peer 3)" \
        --initial-cluster-token token-billing --initial-cluster-state new \
        >>"$dir/etcd$i.log" 2>&1 &
    echo $! >"$dir/etcd$i.pid"
    disown
}

start_patroni() {
    local i=$1
    # shellcheck source=/dev/null
    source "$dir/secrets"
    env PATRONI_NAME="node$i" \
        PATRONI_RESTAPI_LISTEN="127.0.0.1:$(rest_port "$i")" \
        PATRONI_RESTAPI_CONNECT_ADDRESS="127.0.0.1:$(rest_port "$i")" \
        PATRONI_POSTGRESQL_LISTEN="127.0.0.1:$(pg_port "$i")" \
        PATRONI_POSTGRESQL_CONNECT_ADDRESS="127.0.0.1:$(pg_port "$i")" \
        PATRONI_POSTGRESQL_DATA_DIR="$dir/node$i" \
        PATRONI_POSTGRESQL_PGPASS="$dir/pgpass$i" \
        PATRONI_ETCD3_HOSTS="$(etcd_hosts)" \
        PATRONI_SUPERUSER_PASSWORD="$superuser_password" \
        PATRONI_REPLICATION_PASSWORD="$replication_password" \
        PATRONI_REWIND_PASSWORD="$rewind_password" \
        setpriv --reuid=postgres --regid=postgres --init-groups -- \
        "$venv/bin/patroni" "$dir/patroni.yml" >>"$dir/patroni$i.log" 2>&1 &
    echo $! >"$dir/patroni$i.pid"
    disown
}

# The HTTP status of Patroni's REST health check $2 on node $1 (000: none).
rest() { curl -s -o /dev/null -m 2 -w '%{http_code}' "http://127.0.0.1:$(rest_port "$1")/$2" || true; }

# The node that answers /primary with 200 (none: empty).
leader() {
    local i
    for i in "${nodes[@]}"; do
        [[ "$(rest "$i" primary)" == 200 ]] && { echo "$i"; return; }
    done
    true
}

# Polls `condition` every 0.2 s for at most $1 seconds.
wait_for() {
    local limit=$1 what=$2
    shift 2
    local deadline=$(( $(date +%s) + limit ))
    until "$@"; do
        if (( $(date +%s) > deadline )); then
            say "gave up after $limit s waiting for $what"
            patronictl_ list >&2 || true
            return 1
        fi
        sleep 0.2
    done
}

patronictl_() { PATRONI_ETCD3_HOSTS="$(etcd_hosts)" "$venv/bin/patronictl" -c "$dir/patroni.yml" "$@"; }

# One leader, one synchronous standby and one asynchronous replica, the
# replicas streaming, all on the leader's timeline (Patroni's /patroni:
# a node that answers /async may still be on its way back, before its
# pg_rewind).
synchronous() {
    local i states
    states=$(for i in "${nodes[@]}"; do
        curl -fsS -m 2 "http://127.0.0.1:$(rest_port "$i")/patroni" 2>/dev/null \
            | jq -r '[.role, .state, (.replication_state // "-"), (.sync_standby // false), .timeline] | @tsv' \
            || echo "none"
    done | sort)
    # shellcheck disable=SC2016
    awk -F '\t' '
        $1 == "primary" && $2 == "running" { primary++; timeline = $5 }
        $1 == "replica" && $2 == "running" && $3 == "streaming" && $4 == "true" { sync++; timelines[$5] }
        $1 == "replica" && $2 == "running" && $3 == "streaming" && $4 == "false" { async++; timelines[$5] }
        END {
            for (t in timelines) if (t != timeline) exit 1
            exit !(primary == 1 && sync == 1 && async == 1)
        }' <<<"$states"
}
new_leader_other_than() { local l; l=$(leader); [[ -n "$l" && "$l" != "$1" ]]; }
no_leader() { [[ -z "$(leader)" ]]; }
has_leader() { [[ -n "$(leader)" ]]; }
etcd_healthy() { ETCDCTL_API=3 etcdctl --endpoints "$(etcd_hosts)" endpoint health >/dev/null 2>&1; }

# The primary's Patroni, postmaster and backends (the whole "host").
host_pids() {
    local i=$1 postmaster
    postmaster=$(head -n 1 "$dir/node$i/postmaster.pid")
    echo "$(cat "$dir/patroni$i.pid") $postmaster $(pgrep -P "$postmaster" | tr '\n' ' ')"
}

# The etcd member that leads the etcd cluster (1, 2 or 3).
etcd_leader() {
    local endpoint
    endpoint=$(ETCDCTL_API=3 etcdctl --endpoints "$(etcd_hosts)" endpoint status -w json \
        | jq -r '.[] | select(.Status.header.member_id == .Status.leader) | .Endpoint')
    local i
    for i in "${nodes[@]}"; do
        [[ "$endpoint" == *":$(etcd_client "$i")" ]] && { echo "$i"; return; }
    done
    echo 1
}

# ---- the steps, run by the chaos run (--failover-command) at its moment.
step() {
    local name=$1 old started pids new
    case "$name" in
        host-kill | host-stop)
            old=$(leader)
            [[ -n "$old" ]] || { say "no leader before $name"; return 1; }
            pids=$(host_pids "$old")
            started=$(now)
            if [[ "$name" == host-kill ]]; then
                # shellcheck disable=SC2086
                kill -KILL $pids
                say "SIGKILL to node$old (Patroni, postmaster, backends)"
            else
                # shellcheck disable=SC2086
                kill -STOP $pids
                say "SIGSTOP to node$old (Patroni, postmaster, backends)"
            fi
            wait_for 90 "a new leader" new_leader_other_than "$old"
            new=$(leader)
            say "node$new leads $(since "$started") s after the fault (no command from the test)"
            if [[ "$name" == host-kill ]]; then
                start_patroni "$old"
            else
                # shellcheck disable=SC2086
                kill -CONT $pids
            fi
            wait_for 180 "node$old to rejoin, synchronous again" synchronous
            say "node$old rejoined as a standby and the cluster is synchronous again $(since "$started") s after the fault"
            ;;
        switchover)
            old=$(leader)
            new=""
            for i in "${nodes[@]}"; do [[ "$(rest "$i" sync)" == 200 ]] && new=$i; done
            started=$(now)
            patronictl_ switchover --leader "node$old" --candidate "node$new" --force >/dev/null
            wait_for 60 "node$new to lead" new_leader_other_than "$old"
            say "switchover node$old → node$(leader) in $(since "$started") s"
            wait_for 120 "a synchronous cluster after the switchover" synchronous
            ;;
        etcd-member)
            old=$(leader)
            local member
            member=$(etcd_leader)
            kill -KILL "$(cat "$dir/etcd$member.pid")"
            started=$(now)
            say "SIGKILL to etcd member e$member (the etcd leader), for one ttl (20 s)"
            sleep 20
            start_etcd "$member"
            wait_for 60 "etcd healthy" etcd_healthy
            [[ "$(leader)" == "$old" ]] || { say "the primary changed: node$old → node$(leader)"; return 1; }
            say "etcd member e$member back after $(since "$started") s; node$old led throughout"
            ;;
        etcd-quorum)
            old=$(leader)
            local members=() m
            for m in "${nodes[@]}"; do [[ ${#members[@]} -lt 2 ]] && members+=("$m"); done
            started=$(now)
            for m in "${members[@]}"; do kill -KILL "$(cat "$dir/etcd$m.pid")"; done
            say "SIGKILL to etcd members e${members[0]} and e${members[1]}: no quorum"
            wait_for 90 "the primary to demote itself" no_leader
            say "node$old stopped taking writes $(since "$started") s after the quorum's loss"
            # Kiosks meet a cluster without a primary for a while (503).
            sleep 10
            local demoted
            demoted=$(now)
            for m in "${members[@]}"; do start_etcd "$m"; done
            wait_for 90 "a leader after the quorum's return" has_leader
            say "node$(leader) leads again $(since "$demoted") s after the quorum came back"
            wait_for 120 "a synchronous cluster after the quorum's return" synchronous
            ;;
        pg-restart)
            # PostgreSQL restarted under Patroni on the primary (fast
            # shutdown; the leader key stays): the chaos run's restart fault.
            old=$(leader)
            [[ -n "$old" ]] || { say "no leader before $name"; return 1; }
            patronictl_ restart token-billing "node$old" --force >/dev/null
            wait_for 60 "a leader after the restart" has_leader
            wait_for 120 "a synchronous cluster after the restart" synchronous
            ;;
        *) say "unknown step $name"; return 2 ;;
    esac
}

if [[ "${1:-}" == "--step" ]]; then
    dir=$3
    step "$2"
    exit
fi

runs=1
seconds=50
seed=""
steps="host-kill host-stop switchover etcd-member etcd-quorum"
scale=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --scale) scale=1; shift ;;
        --runs) runs=$2; shift 2 ;;
        --seconds) seconds=$2; shift 2 ;;
        --seed) seed=$2; shift 2 ;;
        --steps) steps=$2; shift 2 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
tools=${TOOLS:-${CARGO_TARGET_DIR:-$here/../../target}/debug/token-billing-tools}
[[ -x "$tools" ]] || { echo "build the tools first (cargo build): $tools" >&2; exit 2; }

missing=()
for package in etcd-server etcd-client jq python3-venv; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' || missing+=("$package")
done
if (( ${#missing[@]} > 0 )); then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# Debian's python3 (not a python in root's home, which postgres cannot run).
if [[ "$("$venv/bin/patroni" --version 2>/dev/null)" != "patroni $patroni_version" ]]; then
    say "installing Patroni $patroni_version from PyPI in $venv"
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    /usr/bin/python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check \
        "patroni[etcd3]==$patroni_version" "psycopg[binary]==$psycopg_version" >/dev/null
    chmod -R a+rX "$venv"
fi

# The nodes' logs of a failed step, kept for a look afterwards.
logs=${PATRONI_LOGS:-$here/../../ci-output/patroni}
keep_logs() {
    mkdir -p "$logs/$1"
    cp "$dir"/*.log "$dir"/*.txt "$logs/$1/" 2>/dev/null || true
    say "the nodes' logs are in $logs/$1"
}

dir=""
cleanup() {
    [[ -n "$dir" && -d "$dir" ]] || return 0
    local pidfile
    for pidfile in "$dir"/patroni*.pid "$dir"/etcd*.pid; do
        [[ -f "$pidfile" ]] && kill -CONT "$(cat "$pidfile")" 2>/dev/null || true
    done
    for i in "${nodes[@]}"; do
        [[ -f "$dir/node$i/postmaster.pid" ]] && kill -CONT "$(head -n 1 "$dir/node$i/postmaster.pid")" 2>/dev/null || true
        [[ -f "$dir/patroni$i.pid" ]] && kill -KILL "$(cat "$dir/patroni$i.pid")" 2>/dev/null || true
        if [[ -f "$dir/node$i/postmaster.pid" ]]; then
            runuser -u postgres -- "$pg_bin/pg_ctl" stop -m immediate -D "$dir/node$i" >/dev/null 2>&1 || true
        fi
    done
    for pidfile in "$dir"/etcd*.pid; do
        [[ -f "$pidfile" ]] && kill -KILL "$(cat "$pidfile")" 2>/dev/null || true
    done
    rm -rf "$dir"
}
trap cleanup EXIT

build_cluster() {
    local port
    for port in $(etcd_client 1) $(etcd_client 3) $(etcd_peer 1) $(etcd_peer 3) $(pg_port 1) $(pg_port 3) $(rest_port 1) $(rest_port 3); do
        if (echo >"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            echo "port $port is taken: set PATRONI_PORT_BASE" >&2
            return 2
        fi
    done
    dir=$(mktemp -d /tmp/tb-patroni.XXXXXX)
    chown postgres "$dir"
    chmod 700 "$dir"
    install -o postgres -m 600 "$here/patroni.yml" "$dir/patroni.yml"
    umask 077
    {
        echo "superuser_password=$(head -c 18 /dev/urandom | base64 | tr -d '+/=')"
        echo "replication_password=$(head -c 18 /dev/urandom | base64 | tr -d '+/=')"
        echo "rewind_password=$(head -c 18 /dev/urandom | base64 | tr -d '+/=')"
    } >"$dir/secrets"
    umask 022
    local started i
    started=$(now)
    for i in "${nodes[@]}"; do start_etcd "$i"; done
    wait_for 60 "etcd" etcd_healthy
    for i in "${nodes[@]}"; do start_patroni "$i"; done
    wait_for 180 "a leader, a synchronous standby and an asynchronous replica" synchronous
    say "cluster up in $(since "$started") s: 3 etcd members, node$(leader) leads"
    patronictl_ list
    # The alerts read metrics this Patroni exports.
    local exported name
    exported=$(curl -fsS "http://127.0.0.1:$(rest_port "$(leader)")/metrics")
    for name in $(grep -o 'patroni_[a-z_]*' "$here/../../prometheus/patroni-alerts.yml" | sort -u); do
        grep -q "^$name{" <<<"$exported" || { say "Patroni exports no $name (prometheus/patroni-alerts.yml)"; return 1; }
    done
}

# Chaos at scale: one seeded chaos run on the cluster, with every fault
# at once — SIGKILL and SIGSTOP of three replicas (one with its clock 5
# minutes ahead), PostgreSQL restarts under Patroni, and a host loss of the
# primary every tenth fault — then its books checked. It fails unless the
# run passes with at least 10,000 operations, 50 faults and one failover.
if (( scale )); then
    build_cluster
    export CHAOS_REPLICA_LOGS="$dir"
    # shellcheck source=/dev/null
    source "$dir/secrets"
    hosts="127.0.0.1:$(pg_port 1),127.0.0.1:$(pg_port 2),127.0.0.1:$(pg_port 3)"
    url="postgres://postgres:$superuser_password@$hosts/tb_chaos_patroni?target_session_attrs=read-write&connect_timeout=2"
    set +e
    RUST_LOG=error "$tools" --database-url "$url" chaos --seed "${seed:-$RANDOM$RANDOM}" \
        --seconds "$seconds" --replicas 3 --kiosks 16 --accounts 4 --skewed-clock --fault-gap-ms 300 \
        --postgres-restart-command "$script --step pg-restart $dir" \
        --failover-command "$script --step host-kill $dir" --failover-among-faults \
        2>&1 | grep -v 'simulated drop after success' | tee "$dir/scale.txt"
    status=${PIPESTATUS[0]}
    set -e
    report=$(cat "$dir/scale.txt")
    operations=$(sed -n 's/^totals: \([0-9]*\) operations, \([0-9]*\) faults$/\1/p' <<<"$report")
    faults=$(sed -n 's/^totals: \([0-9]*\) operations, \([0-9]*\) faults$/\2/p' <<<"$report")
    failures=()
    (( status == 0 )) || failures+=("chaos run failed (exit $status, $(grep -c '^VIOLATION' <<<"$report" || true) violations)")
    (( ${operations:-0} >= 10000 )) || failures+=("only ${operations:-0} operations")
    (( ${faults:-0} >= 50 )) || failures+=("only ${faults:-0} faults")
    grep -q '"primary_failover": ' <<<"$report" || failures+=("no failover")
    verdict=ok
    (( ${#failures[@]} == 0 )) || verdict=$(IFS=';'; echo "${failures[*]}")
    echo "patroni: chaos at scale: ${operations:-?} operations, ${faults:-?} faults, $(grep '^faults: ' <<<"$report"), $(grep '^worst recovery: ' <<<"$report"); $verdict"
    [[ "$verdict" == ok ]] || { keep_logs scale; exit 1; }
    exit
fi

failed=0
summary=()
for run in $(seq 1 "$runs"); do
    build_cluster
    # shellcheck source=/dev/null
    source "$dir/secrets"
    hosts="127.0.0.1:$(pg_port 1),127.0.0.1:$(pg_port 2),127.0.0.1:$(pg_port 3)"
    url="postgres://postgres:$superuser_password@$hosts/tb_chaos_patroni?target_session_attrs=read-write&connect_timeout=2"
    # The replicas (which inherit it) read reports from a replica.
    export DATABASE_READ_URL="postgres://postgres:$superuser_password@$hosts/tb_chaos_patroni?target_session_attrs=prefer-standby&connect_timeout=2"
    # The service replicas' logs (errors only) beside the nodes'.
    export CHAOS_REPLICA_LOGS="$dir"
    for name in $steps; do
        run_seed=${seed:-$RANDOM$RANDOM}
        echo "== patroni run $run/$runs, step $name: seed=$run_seed"
        set +e
        RUST_LOG=error "$tools" --database-url "$url" chaos --seed "$run_seed" --seconds "$seconds" \
            --replicas 2 --kiosks 8 --accounts 3 \
            --failover-command "$script --step $name $dir" 2>&1 | grep -v 'simulated drop after success' \
            | tee "$dir/$name.txt"
        status=${PIPESTATUS[0]}
        set -e
        report=$(cat "$dir/$name.txt")
        gap=$(sed -n 's/^failover: longest time without an accepted reservation: \([0-9]*\) ms.*/\1/p' <<<"$report")
        others=$(sed -n 's/^failover: probe reservations: .*others {\([^}]*\)}.*/\1/p' <<<"$report")
        acknowledged=$(sed -n 's/^acknowledged \(.*\): \([0-9]*\), missing \([0-9]*\)$/\1 \2 (missing \3)/p' <<<"$report" | paste -sd ';' -)
        errors=$(sed -n 's/^answers 500: //p' <<<"$report")
        verdict=ok
        (( status == 0 )) || verdict="chaos run failed (exit $status)"
        [[ -n "$gap" ]] || { verdict="no reservation accepted after the fault"; gap=-1; }
        case "$name" in
            host-kill) (( gap <= 30000 )) || verdict="first reserve after $gap ms > 30 s" ;;
            switchover)
                (( gap <= 5000 )) || verdict="switchover: $gap ms without a reservation > 5 s"
                if [[ -n "$others" && -n "$(tr ',' '\n' <<<"$others" | grep -v '^ *503:')" ]]; then
                    verdict="switchover: answers other than 503: {$others}"
                fi
                ;;
            etcd-member)
                [[ -z "$others" ]] || verdict="one etcd member lost: kiosks saw {$others}"
                ;;
        esac
        if [[ "$verdict" != ok ]]; then
            failed=1
            keep_logs "run$run-$name"
        elif [[ -n "${PATRONI_KEEP_LOGS:-}" ]]; then
            keep_logs "run$run-$name"
        fi
        line="run $run $name: first reserve after the fault ${gap} ms; probe refusals {${others}}; 500s ${errors:-?}; $acknowledged; $verdict"
        summary+=("$line")
        echo "patroni: $line"
    done
    cleanup
    dir=""
done
echo "== patroni summary"
printf '%s\n' "${summary[@]}"
exit $failed
