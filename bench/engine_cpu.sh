#!/usr/bin/env bash
# The engine alone, two versions side by side: PostgreSQL backend CPU time
# per reserve → commit cycle, for lone operations and for batches.
#
# Usage:
#   bench/engine_cpu.sh [--base COMMIT] [--cycles N] [--batches "1 8"] [--rounds R]
#                       [--armed | --priced | --budgeted]
# Defaults: base 0b47600 (the lean path of one statement per operation),
# 1,000 cycles, batches of 1 and of 8, 3 rounds. Needs a release build
# (cargo build --release: it migrates the scratch database) and the
# PostgreSQL server packages.
#
# Why CPU time: on this shared 2-core machine wall time swings 2x between
# runs, while the CPU time a backend spends on the same statements moves by
# a few per cent (it counts its own work, not its waiting for the CPU).
# Both versions' engine SQL (src/engine/sql of this checkout, and of the
# base commit, `git show`) are installed side by side in schemas of one
# scratch database on a private cluster (port ENGINE_CPU_PORT, default
# 5481; initdb in a temporary directory, removed at the end; the main
# cluster is not touched), seeded like the references (bench/seed.sql,
# 2,000 accounts each with one grant and a kiosk key: the engines use the
# first 1,000, the hand-written reference below the others, whose balances
# it moves without the grants), given a history of
# 24,000 reservations and then analysed. Each round runs,
# in alternating order, a DO block per version in one session: N cycles on
# random accounts, each a call of engine_apply with B reserves on one
# account, COMMIT, a call with their B commit_all, COMMIT
# (synchronous_commit off: the commit's flush is the same for both and not
# the engine's). Printed: per version and batch size the median over the
# rounds of the backend's CPU ms per cycle (utime + stime from
# /proc/<pid>/stat) and per operation, and the ratio this / base.
# ENGINE_CPU_ROUNDS_FILE=PATH writes every round's figure there too
# (a line per version and batch size), to see a run's spread.
#
# Beside them, in the same rounds, the fixed hand-written reference: the
# two statements of bench/reference_cycle.pgbench.sql (read from that file,
# never copied: `:n` becomes the account, `:r_id` the reservation), run the
# same way (a DO block, the reserve then the commit, each committed). Its
# line says what a cycle costs PostgreSQL when nothing but the statement a
# kiosk needs is run; the ratio engine / reference is the engine's price.
#
# --armed: accounts 501–1,000 get an armed threshold top-up rule
# (docs/topups.md; threshold 1, which no cycle crosses), and a third line,
# "this, armed", runs this checkout's engine on them beside the plain one
# on accounts 1–500 (the base too runs on 1–500): what an armed rule costs
# a reserve → commit that does not cross it (issue 38: within 10 %).
#
# --priced: the same, with the grants of accounts 501–1,000 priced
# (amount_paid 100,000 EUR cents each; docs/finance.md, "Money") and the
# line "this, priced": what a price costs a reserve → commit (issue 60:
# within 5 %; the engine values nothing on this path, the revenue report
# does at read time).
#
# --budgeted: the same, with the kiosk keys of accounts 501–1,000 given a
# budget (10^9 tokens in total: never refused, always counted): what a key
# budget costs a reserve → commit (issue 61: within 10 %).
#
# The base must be a commit whose engine installs on this checkout's
# migrated schema (no migration since that changes what its engine reads
# or writes): 0b47600's does.
set -euo pipefail
cd "$(dirname "$0")/.."

base=0b47600 cycles=1000 batches="1 8" rounds=3 armed=0
while [ $# -gt 0 ]; do
  case "$1" in
    --base) base="$2"; shift ;;
    --cycles) cycles="$2"; shift ;;
    --batches) batches="$2"; shift ;;
    --rounds) rounds="$2"; shift ;;
    --armed) armed=1 ;;
    --priced) armed=priced ;;
    --budgeted) armed=budgeted ;;
    *) sed -n '5,10p' "$0" >&2; exit 2 ;;
  esac
  shift
done

binary="${CARGO_TARGET_DIR:-target}/release/token-billing"
[ -x "$binary" ] || { echo "build first: cargo build --release ($binary missing)" >&2; exit 1; }
base="$(git rev-parse --short "$base^{commit}")"
. bench/private_cluster.sh
port="${ENGINE_CPU_PORT:-5481}"
dir="$(mktemp -d /tmp/tb-engine-cpu.XXXXXX)"
cleanup() {
  private_cluster_stop "$dir"
  rm -rf "$dir"
}
trap cleanup EXIT
private_cluster_start "$dir" "$port"

database=tb_engine_cpu
url="postgres://postgres@127.0.0.1:$port/$database"
RUST_LOG=warn "$binary" --database-url "$url" migrate > /dev/null
psql -X -q -h 127.0.0.1 -p "$port" -U postgres -d "$database" -v ON_ERROR_STOP=1 \
  -v accounts=2000 -f bench/seed.sql

private_cluster_install_engine "$port" "$database" engine_this
private_cluster_install_engine "$port" "$database" engine_base "$base"

if [ "$armed" = budgeted ]; then
  psql -X -q -h 127.0.0.1 -p "$port" -U postgres -d "$database" -v ON_ERROR_STOP=1 -c \
    "UPDATE api_keys SET budget_tokens = 1000000000, budget_period = 'total'
     WHERE account_id IN (SELECT bench_uuid(n) FROM generate_series(501, 1000) n)" > /dev/null
fi
if [ "$armed" = priced ]; then
  psql -X -q -h 127.0.0.1 -p "$port" -U postgres -d "$database" -v ON_ERROR_STOP=1 -c \
    "UPDATE credit_grants SET amount_paid = 100000, currency = 'EUR'
     WHERE account_id IN (SELECT bench_uuid(n) FROM generate_series(501, 1000) n)" > /dev/null
fi
if [ "$armed" = 1 ]; then
  # Through the engine's own entry point for a rule's change (it arms the
  # rule and judges it: 5,000 tokens are far above the threshold).
  psql -X -q -h 127.0.0.1 -p "$port" -U postgres -d "$database" -v ON_ERROR_STOP=1 <<'SQL' > /dev/null
SET search_path TO engine_this, public;
INSERT INTO topup_rules (id, account_id, trigger, threshold_tokens, method, tokens, mode)
SELECT gen_random_uuid(), bench_uuid(n), 'threshold', 1, 'fixed', 10, 'grant'
FROM generate_series(501, 1000) n;
SELECT count(engine_topup_rule_changed(bench_uuid(n), true)) FROM generate_series(501, 1000) n;
SQL
  [ "$(psql -X -qAt -h 127.0.0.1 -p "$port" -U postgres -d "$database" \
        -c "SELECT count(*) FROM accounts WHERE topup_armed AND topup_threshold = 1")" = 500 ] \
    || { echo "--armed: the rules did not arm" >&2; exit 1; }
fi

# The reference's two statements as PL/pgSQL: account `acc`, reservation `r`.
reference_cycle_plpgsql > "$dir/reference.sql"

python3 - "$port" "$database" "$cycles" "$rounds" "$base" "$dir/reference.sql" "$armed" $batches <<'PY'
import os, statistics, subprocess, sys

port, database, cycles, rounds, base, reference_file, variant = sys.argv[1:8]
# "armed" or "priced": the line of this engine on accounts 501–1,000.
variant = {"1": "armed", "priced": "priced", "budgeted": "budgeted"}.get(variant)
armed = variant is not None
batches = [int(b) for b in sys.argv[8:]]
reserve_sql, commit_sql = [line for line in open(reference_file).read().splitlines() if line.strip()]
cycles, rounds = int(cycles), int(rounds)

def typed(schema):
    """The fields of the engine_request type in `schema` when its engine takes
    its batch as one engine_request[] (since the composite type; 26 then, more
    as fields were added), 0 when it takes 26 arrays (its earlier editions)."""
    out = subprocess.run(
        ["psql", "-X", "-qAt", "-h", "127.0.0.1", "-p", port, "-U", "postgres", "-d", database,
         "-c", "SELECT count(*) FROM pg_attribute WHERE attnum > 0 AND NOT attisdropped "
               f"AND attrelid = (SELECT typrelid FROM pg_type WHERE oid = to_regtype('{schema}.engine_request'))"],
        check=True, capture_output=True, text=True).stdout.strip()
    return int(out or 0)

TYPED = {schema: typed(schema) for schema in ("engine_this", "engine_base")}

def call_typed(op, ids, count):
    """engine_apply with B engine_requests (of `count` fields: the 26 named
    here, the later ones NULL) on account `acc[k]`."""
    if op == "reserve":
        fields = "gen_random_uuid(), 1, NULL, 300, gen_random_uuid(), NULL, NULL"
    else:
        fields = f"NULL, NULL, NULL, NULL, NULL, NULL, {ids}[k]"
    return ("engine_apply(ARRAY(SELECT ROW("
            f"'{op}', acc[k], 'bench', acc[k], sha256('pgbench-secret'::bytea), false, {fields}, "
            "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL"
            + ", NULL" * (count - 26) + ")"
            "::engine_request FROM generate_subscripts(acc, 1) k ORDER BY k))")

def call(op, ids, composite=0):
    """engine_apply with B operations on account `a` (reserves: new ids)."""
    if composite:
        return call_typed(op, ids, composite)
    fill = lambda value, kind: f"array_fill({value}::{kind}, ARRAY[b])"
    request = "ARRAY(SELECT gen_random_uuid() FROM generate_series(1, b))"
    if op == "reserve":
        request_ids, amount, ttl, new_ids, reservations = (
            request, fill(1, "bigint"), fill(300, "integer"), request, fill("NULL", "uuid"))
    else:
        request_ids, amount, ttl, new_ids, reservations = (
            fill("NULL", "uuid"), fill("NULL", "bigint"), fill("NULL", "integer"),
            fill("NULL", "uuid"), ids)
    return ("engine_apply(" + ", ".join([
        fill(f"'{op}'", "text"), "acc", fill("'bench'", "text"), "acc",
        fill("sha256('pgbench-secret'::bytea)", "bytea"), fill("false", "boolean"),
        request_ids, amount, fill("NULL", "integer"), ttl, new_ids, fill("NULL", "uuid"),
        reservations, fill("NULL", "bytea"), fill("NULL", "text"), fill("NULL", "jsonb"),
        fill("NULL", "text"), fill("NULL", "text"), fill("NULL", "text"), fill("NULL", "text"),
        fill("NULL", "bigint"), fill("NULL", "text"), fill("NULL", "jsonb"),
        fill("NULL", "jsonb"), fill("NULL", "integer"), fill("NULL", "timestamptz")]) + ")")

def block(n, b, first=1, count=1000, composite=0):
    return f"""DO $$
DECLARE ids uuid[]; acc uuid[]; b integer := {b}; answered integer;
BEGIN
  FOR i IN 1 .. {n} LOOP
    acc := array_fill(bench_uuid({first} + floor(random() * {count})::integer), ARRAY[b]);
    SELECT array_agg((object->>'id')::uuid ORDER BY op_position) INTO ids
    FROM {call('reserve', None, composite)};
    IF cardinality(ids) IS DISTINCT FROM b THEN RAISE 'reserves answered: %', ids; END IF;
    COMMIT;
    SELECT count(*) INTO answered FROM {call('commit_all', 'ids', composite)} WHERE outcome = 'committed';
    IF answered <> b THEN RAISE 'commits answered: %', answered; END IF;
    COMMIT;
  END LOOP;
END $$;"""

def reference_block(n):
    return f"""DO $$
DECLARE r uuid; acc uuid; c integer;
BEGIN
  FOR i IN 1 .. {n} LOOP
    acc := bench_uuid(1001 + floor(random() * 1000)::integer);
    r := NULL;
    {reserve_sql}
    IF r IS NULL THEN RAISE 'reference reserve refused'; END IF;
    COMMIT;
    {commit_sql}
    IF c <> 1 THEN RAISE 'reference commit answered %', c; END IF;
    COMMIT;
  END LOOP;
END $$;"""

def session(schema):
    environment = dict(os.environ, PGOPTIONS=f"-c search_path={schema},public -c synchronous_commit=off")
    return subprocess.Popen(
        ["psql", "-X", "-qAt", "-h", "127.0.0.1", "-p", port, "-U", "postgres", "-d", database,
         "-v", "ON_ERROR_STOP=1"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=environment)

def run(process, sql):
    process.stdin.write(sql + "\n\\echo __done__\n")
    process.stdin.flush()
    out = []
    while True:
        line = process.stdout.readline()
        if line == "":
            sys.exit(f"psql ended: {out}")
        if line.strip() == "__done__":
            return out
        out.append(line.strip())

def cpu_ms(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")

# A history first (24,000 reservations and their entries), then ANALYZE:
# statistics taken on empty tables would plan scans of whole tables (the
# private cluster runs without autovacuum), which is no service's state.
history = session("engine_this")
run(history, block(3000, 8, composite=TYPED["engine_this"]))
run(history, "ANALYZE;")
history.stdin.close()
history.wait()

results = {}
for b in batches:
    sessions = {}
    # The reference beside the lone operations (one cycle = its two
    # statements, whatever the batch size).
    names = ("engine_base", "engine_this", "reference") if b == 1 else ("engine_base", "engine_this")
    if armed:
        names += (variant,)
    def work(name, n):
        if name == "reference":
            return reference_block(n)
        if name == variant:
            return block(n, b, 501, 500, TYPED["engine_this"])
        composite = TYPED[name]
        return block(n, b, 1, 500, composite) if armed else block(n, b, composite=composite)
    for schema in names:
        process = session({"reference": "public", variant: "engine_this"}.get(schema, schema))
        pid = run(process, "SELECT pg_backend_pid();")[0]
        run(process, work(schema, 50))  # warm-up: plans cached, pages read
        sessions[schema] = (process, pid)
    for r in range(rounds):
        order = names if r % 2 == 0 else tuple(reversed(names))
        for schema in order:
            process, pid = sessions[schema]
            before = cpu_ms(pid)
            run(process, work(schema, cycles))
            results.setdefault((schema, b), []).append((cpu_ms(pid) - before) / cycles)
    for process, _ in sessions.values():
        process.stdin.close()
        process.wait()

if os.environ.get("ENGINE_CPU_ROUNDS_FILE"):
    with open(os.environ["ENGINE_CPU_ROUNDS_FILE"], "w") as f:
        for key, values in results.items():
            f.write(f"{key[0]} {key[1]} " + " ".join(f"{v:.4f}" for v in values) + "\n")

print(f"Backend CPU per reserve → commit cycle, medians of {rounds} rounds of {cycles} cycles "
      f"(this checkout's engine vs {base}'s, alternating):")
print("| operations per call | this ms/cycle | base ms/cycle | this ms/op | base ms/op | this / base |")
print("|---|---|---|---|---|---|")
for b in batches:
    this = statistics.median(results[("engine_this", b)])
    that = statistics.median(results[("engine_base", b)])
    print(f"| {b} | {this:.2f} | {that:.2f} | {this / b:.3f} | {that / b:.3f} | **{this / that:.2f}** |")
if armed:
    print({"armed": "\nAn armed threshold top-up rule that the cycles do not cross (accounts 501–1,000) "
                    "against none (1–500), this engine, same rounds:",
           "priced": "\nPriced grants (accounts 501–1,000) against unpriced ones (1–500), "
                     "this engine, same rounds:",
           "budgeted": "\nKiosk keys with a budget (accounts 501–1,000) against keys without "
                       "(1–500), this engine, same rounds:"}[variant])
    print(f"| operations per call | {variant} ms/cycle | plain ms/cycle | {variant} / plain |")
    print("|---|---|---|---|")
    for b in batches:
        with_rule = statistics.median(results[(variant, b)])
        plain = statistics.median(results[("engine_this", b)])
        print(f"| {b} | {with_rule:.2f} | {plain:.2f} | **{with_rule / plain:.2f}** |")
if ("reference", 1) in results:
    reference = statistics.median(results[("reference", 1)])
    this = statistics.median(results[("engine_this", 1)])
    that = statistics.median(results[("engine_base", 1)])
    print(f"\nThe fixed hand-written reference (bench/reference_cycle.pgbench.sql), same rounds: "
          f"{reference:.2f} ms/cycle; a lone cycle of this engine costs **{this / reference:.2f}x** it, "
          f"{base}'s {that / reference:.2f}x.")
PY
