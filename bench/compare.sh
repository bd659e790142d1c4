#!/usr/bin/env bash
# The service against FIXED hand-written SQL, side by side in one run.
#
# Usage:
#   bench/compare.sh [--seconds S] [--rounds N] [--spread "2 8 32 64"] [--hot "8 32"] [OPTIONS]
#   bench/compare.sh --jobs [--seconds S] [--rounds N] [--kiosks "8 32"] [--accounts A] [OPTIONS]
# OPTIONS: [--dry-run] [--pg-port P] [--http-port P] [--private-cluster] [--pinned BINDIR]
#          [--gate] [--this BINDIR] [--services-only]
#   e.g. bench/compare.sh --private-cluster --pinned "$(bench/pinned_build.sh)" --gate
# Defaults: 8 s per run (after a 2 s warm-up), 3 rounds. Needs PostgreSQL on
# 127.0.0.1:5432 (user postgres, trust), pgbench, and a release build
# (cargo build --release: token-billing and token-billing-bench).
#
# Cycles (default). For each load and kiosk count, `rounds` times, one after
# the other on fresh databases:
#   - the service: `token-billing-bench load --scenario spread|hot`
#     against the release service (kiosks over real HTTP, a key per account,
#     one cycle = reserve 1 token, then commit it; the books are checked
#     with GET /v1/reconciliation and a run that does not balance stops the
#     script);
#   - bench/reference_cycle.pgbench.sql: the same cycle as hand-written SQL,
#     one request per transaction (pgbench -M prepared -j 2, same kiosk
#     count as clients; cycles/s = tps);
#   - spread only, bench/reference_cycle_batched8.pgbench.sql: the same
#     cycles set-based, 8 accounts per statement (cycles/s = tps × 8).
# spread = 1,000 accounts, kiosks 2 8 32 64; hot = 1 account, kiosks 8 32.
# The table shows medians of the rounds and ratios of the medians
# (service / reference; above 1 = the service is faster).
#
# Jobs (--jobs). `load --scenario jobs` (create a job, long-poll it to
# succeeded, simulated provider at zero delay) against
# bench/reference_job.pgbench.sql: one job as three transactions (create,
# claim, finish; jobs/s = tps), at 8 and 32 kiosks. The reference runs on as
# many accounts as the service's run reports (`accounts=` of its line;
# --accounts is passed to the service and used as such with --dry-run).
#
# Why fixed: the references are hand-written files that are never edited
# (a change is a new file). They must not move with the service's code, or
# the ratio measures nothing; they were once printed from the service's own
# statements, and slowed down with it. They run on a database migrated by
# the service under test (`token-billing migrate`: its tables), seeded by
# bench/reference_seed.sql, which disables the user triggers of the tables
# the references write (triggers run the service's functions; the
# references write what the books need themselves). After every reference
# run bench/reference_books.sql checks the books from the tables alone
# (conservation, ledger replay, reservations, jobs); a mismatch or an
# aborted pgbench client stops the script.
#
# --dry-run: no service and no build. The references run for real, on a
# database migrated with psql -f of this checkout's migrations/*/up.sql in
# order; the service's lines are placeholders (cycles_per_s=1000 …), so the
# table's service columns and ratios are placeholders too: it tests the
# references on today's schema and the script, not the service (CI runs it).
#
# --pg-port P: the PostgreSQL to use is on 127.0.0.1:P (default 5432); every
# psql, pgbench and DATABASE_URL of the run uses it.
#
# --http-port P: the services listen on the first free port from P (default
# 18090; up to 99 above it), so that two runs at once can be kept apart.
#
# --private-cluster: a fresh throwaway cluster of its own (initdb in a
# temporary directory, bench/private_cluster.sh, autovacuum off like the
# main cluster) on a spare port from 5491 (or --pg-port's), removed at
# exit; the main cluster is not touched at all. Needs root (runuser).
#
# --pinned BINDIR: a fixed build as the speed reference of the service, in
# the same run: BINDIR holds token-billing and the load generator of a
# pinned commit (bench/pinned_build.sh [COMMIT] builds them once, 8d85f2e
# by default, and prints BINDIR; the load generator is token-billing-bench,
# or in a build from before it `token-billing-tools bench`:
# bench/load_generator.sh). Every round runs the service twice, the
# pinned build and this one, in alternating order (odd rounds pinned
# first, even rounds this build first), then the references, each on a
# fresh database. Both services are driven by the SAME load generator, the
# pinned BINDIR's (its flags are checked first). The
# table adds the pinned build's cycles/s (jobs/s) and p99, and the ratio
# main / pinned; the references' ratios stay main / reference. The
# references still run on the schema of this build (`migrate`).
#
# --this BINDIR: the service under test is BINDIR's token-billing (another
# build: bench/pinned_build.sh COMMIT prints its BINDIR) instead of this
# checkout's release build; the references' databases are migrated by it
# too. bench/bisect.sh runs the commits between two builds this way.
#
# --services-only: the references are not run (their columns show –): the
# run compares the service with the pinned build alone, as a bisection
# does (an older build's schema may lack what the references' seed
# writes). Not with --gate.
#
# --gate: after the table, each gated cell's ratio main / reference (the
# one-request-per-transaction reference; jobs: one job = 3 transactions)
# is compared with its threshold; prints "gate: ok", or "gate: FAILED"
# with the cells below their threshold (or not measured), and exits 1.
# The thresholds, half of the targets (spread@8 1.0, hot@8 1.5, jobs@8
# 0.4), are set in one place below and can be overridden from the
# environment: GATE_SPREAD_8 (0.5), GATE_HOT_8 (0.75), GATE_JOBS_8 (0.2).
# Cycles mode gates spread@8 and hot@8, --jobs gates jobs@8.
set -euo pipefail
cd "$(dirname "$0")/.."

# --gate thresholds: the lowest ratio main / reference per cell ("load
# kiosks" → threshold), half of the targets 1.0 / 1.5 / 0.4.
gate_cells="spread:8:${GATE_SPREAD_8:-0.5} hot:8:${GATE_HOT_8:-0.75} jobs:8:${GATE_JOBS_8:-0.2}"

mode=cycles seconds=8 rounds=3 spread_kiosks="2 8 32 64" hot_kiosks="8 32" job_kiosks="8 32"
job_accounts=1000 dry_run=false pg_port="" http_port=18090 private_cluster=false pinned=""
gate=false this="" services_only=false
while [ $# -gt 0 ]; do
  case "$1" in
    --jobs) mode=jobs ;;
    --dry-run) dry_run=true ;;
    --seconds) seconds="$2"; shift ;;
    --rounds) rounds="$2"; shift ;;
    --spread) spread_kiosks="$2"; shift ;;
    --hot) hot_kiosks="$2"; shift ;;
    --kiosks) job_kiosks="$2"; shift ;;
    --accounts) job_accounts="$2"; shift ;;
    --pg-port) pg_port="$2"; shift ;;
    --http-port) http_port="$2"; shift ;;
    --private-cluster) private_cluster=true ;;
    --pinned) pinned="$2"; shift ;;
    --gate) gate=true ;;
    --this) this="$2"; shift ;;
    --services-only) services_only=true ;;
    *) sed -n '2,12p' "$0" >&2; exit 2 ;;
  esac
  shift
done

if $gate && $services_only; then
  echo "--gate needs the references: not with --services-only" >&2
  exit 2
fi
. bench/load_generator.sh
this_dir="${this:-${CARGO_TARGET_DIR:-target}/release}"
binary="$this_dir/token-billing"
if ! $dry_run && ! { [ -x "$binary" ] && load_generator "$this_dir"; }; then
  echo "build first: cargo build --release (or --dry-run; --this: bench/pinned_build.sh COMMIT)" >&2
  exit 1
fi
pinned_binary=""
if [ -n "$pinned" ]; then
  pinned_binary="$pinned/token-billing"
  if ! $dry_run; then
    [ -x "$pinned_binary" ] || { echo "--pinned: $pinned_binary missing (bench/pinned_build.sh builds it)" >&2; exit 1; }
    # One load generator for both services: the pinned build's.
    load_generator "$pinned" || { echo "--pinned: bench/pinned_build.sh builds it" >&2; exit 1; }
  fi
fi
if [ -n "$pinned" ] && ! $dry_run; then
  # The flags and scenarios this script gives `load`, in its --help.
  help="$("${bench[@]}" load --help)"
  for flag in --url --admin-key --scenario --accounts --concurrency --seconds --service-pid spread hot jobs; do
    grep -q -- "$flag" <<< "$help" || { echo "${bench[*]} load does not know $flag:" >&2; echo "$help" >&2; exit 1; }
  done
fi

# A port nobody listens on, from the first one given.
spare_port() { # first last
  local candidate
  for candidate in $(seq "$1" "$2"); do
    (echo > "/dev/tcp/127.0.0.1/$candidate") 2> /dev/null || { echo "$candidate"; return 0; }
  done
  echo "no free port in $1-$2" >&2
  exit 1
}

key="bench-admin-key-0123456789"
port="$(spare_port "$http_port" $((http_port + 99)))"
service_db="tb_bench_service"
reference_db="tb_bench_reference"
service_pid=""
results="$(mktemp)"
service_line="$(mktemp)"
service_log="$(mktemp /tmp/token-billing-bench.XXXXXX.log)"
templates=""
cluster_dir=""

if $private_cluster; then
  . bench/private_cluster.sh
  [ -n "$pg_port" ] || pg_port="$(spare_port 5491 5599)"
  cluster_dir="$(mktemp -d /tmp/tb-compare-cluster.XXXXXX)"
fi
pg_port="${pg_port:-5432}"
server_url="postgres://postgres@127.0.0.1:$pg_port"
pg=(-h 127.0.0.1 -p "$pg_port" -U postgres)
psql_admin() { PGOPTIONS="-c client_min_messages=warning" psql "${pg[@]}" -v ON_ERROR_STOP=1 -qtAc "$1" postgres > /dev/null; }

start_service() { # binary
  psql_admin "DROP DATABASE IF EXISTS $service_db WITH (FORCE)"
  if (echo > "/dev/tcp/127.0.0.1/$port") 2> /dev/null; then
    echo "port $port is taken: another service would answer" >&2
    exit 1
  fi
  # One kiosk key drives hundreds of requests per second here: no rate limit.
  DATABASE_URL="$server_url/$service_db" BIND_ADDR="127.0.0.1:$port" ADMIN_API_KEY="$key" \
    RATE_LIMIT_PER_SECOND=0 RUST_LOG=warn "$1" serve > "$service_log" 2>&1 &
  service_pid=$!
  for _ in $(seq 1 600); do # up to a minute: it migrates a fresh database first
    kill -0 "$service_pid" 2> /dev/null || break
    curl -fsS "http://127.0.0.1:$port/readyz" > /dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "the service did not start ($1)" >&2
  cat "$service_log" >&2
  exit 1
}

stop_service() {
  [ -n "$service_pid" ] || return 0
  kill -TERM "$service_pid" 2> /dev/null || true
  wait "$service_pid" 2> /dev/null || true
  service_pid=""
}

cleanup() {
  stop_service
  rm -f "$results" "$service_line" "$service_log"
  if [ -n "$cluster_dir" ]; then
    private_cluster_stop "$cluster_dir"
    rm -rf "$cluster_dir"
    return 0
  fi
  for template in $templates; do
    psql_admin "DROP DATABASE IF EXISTS $template WITH (FORCE)" || true
  done
  psql_admin "DROP DATABASE IF EXISTS $service_db WITH (FORCE)" || true
  psql_admin "DROP DATABASE IF EXISTS $reference_db WITH (FORCE)" || true
}
trap cleanup EXIT

if $private_cluster; then
  private_cluster_start "$cluster_dir" "$pg_port" "autovacuum = off"
  echo "private cluster on 127.0.0.1:$pg_port ($cluster_dir)" >&2
fi

# One service run: prints the load generator's line (key=value pairs). Called
# with its output redirected to a file, not in $(…): it runs in the main
# shell, so that the EXIT trap knows the service's pid and stops it.
service_run() { # binary scenario accounts kiosks
  if $dry_run; then
    echo "scenario=$2 concurrency=$4 accounts=$3 cycles_per_s=1000 requests=0 p50_ms=1.00 p99_ms=2.00 max_ms=3.00 peak_rss_mib=n/a books=ok (dry run: placeholder)"
    return
  fi
  start_service "$1"
  local line
  line="$("${bench[@]}" load --url "http://127.0.0.1:$port" --admin-key "$key" --scenario "$2" \
    --accounts "$3" --concurrency "$4" --seconds "$seconds" --service-pid "$service_pid")" \
    || { stop_service; echo "the load generator failed ($1: $2, $4 kiosks): $line" >&2; cat "$service_log" >&2; exit 1; }
  stop_service
  grep -q 'books=ok' <<< "$line" || { echo "the books of $1 did not balance: $line" >&2; exit 1; }
  echo "$line"
}

# This build, and with --pinned the pinned one too, in alternating order
# (odd rounds pinned first): sets `line` (this build's) and `pinned_line`.
services_run() { # round scenario accounts kiosks
  local order="main" which
  pinned_line=""
  if [ -n "$pinned" ]; then
    order="pinned main"
    [ $(($1 % 2)) -eq 0 ] && order="main pinned"
    echo "$2 $4 kiosks, round $1: $order" >&2
  fi
  for which in $order; do
    if [ "$which" = pinned ]; then
      service_run "$pinned_binary" "$2" "$3" "$4" > "$service_line"
      pinned_line="$(cat "$service_line")"
    else
      service_run "$binary" "$2" "$3" "$4" > "$service_line"
      line="$(cat "$service_line")"
    fi
  done
}

field() { # name line → the value, or nan
  local value
  value="$(sed -n "s/.*$1=\([0-9.]*\).*/\1/p" <<< "$2")"
  echo "${value:-nan}"
}

# A migrated, seeded database to copy for each reference run (one per
# account count): CREATE DATABASE … TEMPLATE is faster than migrating again.
# Called in the main shell (not in $(…)), so that `templates` is kept.
ensure_template() { # accounts
  local template="tb_bench_reference_template_$1"
  grep -qw "$template" <<< "$templates" && return 0
  psql_admin "DROP DATABASE IF EXISTS $template WITH (FORCE)"
  if ! $dry_run; then
    "$binary" --database-url "$server_url/$template" migrate > /dev/null
  else
    psql_admin "CREATE DATABASE $template"
    for migration in migrations/*/up.sql; do
      psql "${pg[@]}" -d "$template" -v ON_ERROR_STOP=1 -1 -qf "$migration" > /dev/null
    done
  fi
  psql "${pg[@]}" -d "$template" -v ON_ERROR_STOP=1 -v accounts="$1" \
    -qf bench/reference_seed.sql > /dev/null
  templates="$templates $template"
}

# One reference run on a fresh copy of the seeded database: prints its tps.
reference_run() { # script accounts kiosks
  local script="$1" accounts="$2" kiosks="$3" output
  psql_admin "DROP DATABASE IF EXISTS $reference_db WITH (FORCE)"
  psql_admin "CREATE DATABASE $reference_db TEMPLATE tb_bench_reference_template_$accounts"
  local threads=2
  [ "$kiosks" -lt 2 ] && threads=1
  # The same 2 s warm-up as the load generator's (a fresh database's first
  # seconds pay for full-page writes), then the measured run.
  for duration in 2 "$seconds"; do
    if ! output="$(pgbench "${pg[@]}" -n -M prepared -c "$kiosks" -j "$threads" \
      -T "$duration" -D accounts="$accounts" -f "$script" "$reference_db" 2>&1)" \
      || grep -q 'aborted' <<< "$output"; then
      echo "pgbench failed on $script ($accounts accounts, $kiosks kiosks):" >&2
      echo "$output" >&2
      exit 1
    fi
  done
  local books
  books="$(psql "${pg[@]}" -d "$reference_db" -v ON_ERROR_STOP=1 -qtA -f bench/reference_books.sql)"
  grep -q '^books=ok' <<< "$books" || { echo "the books of $script did not balance: $books" >&2; exit 1; }
  sed -n 's/^tps = \([0-9.]*\).*/\1/p' <<< "$output"
}

# Each result line: load kiosks round, then this build's figure, the
# references' (cycles: one, batched; jobs: reference, accounts), this
# build's p50 p99 max RSS, and the pinned build's figure and p99 (nan
# without --pinned).
if [ "$mode" = cycles ]; then
  if ! $services_only; then
    ensure_template 1000
    ensure_template 1
  fi
  for load in spread hot; do
    accounts=1000 kiosk_counts="$spread_kiosks"
    [ "$load" = hot ] && accounts=1 kiosk_counts="$hot_kiosks"
    for kiosks in $kiosk_counts; do
      for round in $(seq 1 "$rounds"); do
        services_run "$round" "$load" "$accounts" "$kiosks"
        one=0 batched=0
        $services_only || one="$(reference_run bench/reference_cycle.pgbench.sql "$accounts" "$kiosks")"
        if [ "$load" = spread ] && ! $services_only; then
          batched="$(reference_run bench/reference_cycle_batched8.pgbench.sql "$accounts" "$kiosks")"
          batched="$(python3 -c "print($batched * 8)")"
        fi
        echo "$load $kiosks $round $(field cycles_per_s "$line") $one $batched $(field p50_ms "$line") $(field p99_ms "$line") $(field max_ms "$line") $(field peak_rss_mib "$line") $(field cycles_per_s "$pinned_line") $(field p99_ms "$pinned_line")" | tee -a "$results" >&2
      done
    done
  done
else
  for kiosks in $job_kiosks; do
    for round in $(seq 1 "$rounds"); do
      services_run "$round" jobs "$job_accounts" "$kiosks"
      accounts="$(field accounts "$line")"
      [ "$accounts" = nan ] && accounts="$job_accounts"
      jobs=0
      if ! $services_only; then
        ensure_template "$accounts"
        jobs="$(reference_run bench/reference_job.pgbench.sql "$accounts" "$kiosks")"
      fi
      echo "jobs $kiosks $round $(field cycles_per_s "$line") $jobs $accounts $(field p50_ms "$line") $(field p99_ms "$line") $(field max_ms "$line") $(field peak_rss_mib "$line") $(field cycles_per_s "$pinned_line") $(field p99_ms "$pinned_line")" | tee -a "$results" >&2
    done
  done
fi

python3 - "$results" "$rounds" "$seconds" "$mode" "$dry_run" "$pinned" "$gate" "$gate_cells" "$this" << 'EOF'
import statistics, sys
path, rounds, seconds, mode, dry_run, pinned, gate, gate_cells, this = sys.argv[1:]
groups = {}
for line in open(path):
    load, kiosks, _round, *values = line.split()
    groups.setdefault((load, int(kiosks)), []).append([float(v) for v in values])
median = lambda runs, i: statistics.median(run[i] for run in runs)
number = lambda v: f"{v:,.0f}" if v else "–"
ratio = lambda a, b: f"**{a / b:.2f}**" if b else "–"
def ms(runs, i):
    return f"{median(runs, i):.2f}"
def rss(runs, i):
    values = [run[i] for run in runs if run[i] == run[i]]
    return f"{max(values):.1f}" if values else "n/a"
# With --pinned: the pinned build's figure, main / pinned, and its p99.
def pinned_cells(runs, service):
    if not pinned:
        return ""
    figure = median(runs, 7)
    return f" {number(figure)} | {ratio(service, figure)} | {ms(runs, 8)} |"
pinned_head = " pinned {unit} | main / pinned | pinned p99 ms |" if pinned else ""
pinned_rule = "---|---|---|" if pinned else ""
print(f"Medians of {rounds} round{'' if rounds == '1' else 's'} of {seconds} s; ratio = service / reference.")
if pinned:
    print(f"Service = {this or 'this build (main)'}; pinned = {pinned}, in alternating order each round; "
          "load generator: the pinned build's for both.")
if dry_run == "true":
    print("DRY RUN: no service ran; its columns and the ratios are placeholders.")
print()
if mode == "cycles":
    print("| load | kiosks | service cycles/s |" + pinned_head.format(unit="cycles/s")
          + " hand-written SQL, one request per transaction | ratio "
          "| the same cycles set-based, 8 accounts per statement | ratio | service p50 ms | p99 ms | max ms | peak RSS MiB |")
    print("|---|---|---|" + pinned_rule + "---|---|---|---|---|---|---|---|")
    for (load, kiosks), runs in groups.items():
        service, one, batched = median(runs, 0), median(runs, 1), median(runs, 2)
        name = "spread (1,000 accounts)" if load == "spread" else "hot (1 account)"
        batched_cells = f"{number(batched)} | {ratio(service, batched)}" if batched else "– | –"
        print(f"| {name} | {kiosks} | {number(service)} |{pinned_cells(runs, service)} {number(one)} | {ratio(service, one)} "
              f"| {batched_cells} | {ms(runs, 3)} | {ms(runs, 4)} | {ms(runs, 5)} | {rss(runs, 6)} |")
else:
    print("| kiosks | accounts | service jobs/s |" + pinned_head.format(unit="jobs/s")
          + " hand-written SQL, one job = 3 transactions | ratio "
          "| service p50 create → succeeded ms | p99 ms | max ms | peak RSS MiB |")
    print("|---|---|---|" + pinned_rule + "---|---|---|---|---|---|")
    for (_load, kiosks), runs in groups.items():
        service, reference = median(runs, 0), median(runs, 1)
        accounts = int(median(runs, 2))
        print(f"| {kiosks} | {accounts:,} | {number(service)} |{pinned_cells(runs, service)} {number(reference)} | {ratio(service, reference)} "
              f"| {ms(runs, 3)} | {ms(runs, 4)} | {ms(runs, 5)} | {rss(runs, 6)} |")

if gate == "true":
    # Column 1 is the reference the ratio is taken against (cycles: one
    # request per transaction; jobs: one job = 3 transactions).
    failed, checked = [], []
    for cell in gate_cells.split():
        load, kiosks, threshold = cell.split(":")
        if (load == "jobs") != (mode == "jobs"):
            continue
        runs = groups.get((load, int(kiosks)))
        if not runs:
            failed.append(f"{load}@{kiosks} not measured (threshold {threshold})")
            continue
        service, reference = median(runs, 0), median(runs, 1)
        value = service / reference if reference else 0.0
        cell_text = f"{load}@{kiosks} main/reference {value:.2f} (threshold {float(threshold):.2f})"
        (checked if value >= float(threshold) else failed).append(cell_text)
    print()
    if failed:
        print("gate: FAILED " + "; ".join(failed) + ("; passed: " + "; ".join(checked) if checked else ""))
        sys.exit(1)
    print("gate: ok " + "; ".join(checked))
EOF
