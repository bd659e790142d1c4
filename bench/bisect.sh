#!/usr/bin/env bash
# What each step between two builds cost: every commit given, run beside a
# fixed base build in one private cluster, alternating rounds.
#
# Usage:
#   bench/bisect.sh [--base COMMIT] [--seconds S] [--rounds N] [--spread "2 8"] [--hot "8"] COMMIT...
# Defaults: base 8d85f2e (the last fast build), 4 s, 3 rounds, spread at 2
# and 8 kiosks, hot at 8. Needs root (a private cluster), the PostgreSQL
# server packages and a toolchain; each build is made once and kept
# (bench/pinned_build.sh).
#
# For each commit, in the order given: bench/pinned_build.sh builds its
# release binaries, then bench/compare.sh --private-cluster --pinned BASE
# --this COMMIT --services-only runs it beside the base build (a fresh
# cluster per commit, odd rounds base first, the base build's load
# generator for both; no references: an older schema may lack what their
# seed writes). Every compare.sh table is printed as it comes; at the end
# one table: per commit its subject and, per cell, the ratio of the
# medians commit / base. A step's cost is the change of that ratio from
# the commit before it — read across rows measured in the same way, each
# against the same base in its own rounds, never against a figure of
# another day.
set -euo pipefail
cd "$(dirname "$0")/.."

base=8d85f2e seconds=4 rounds=3 spread="2 8" hot="8" commits=()
while [ $# -gt 0 ]; do
  case "$1" in
    --base) base="$2"; shift ;;
    --seconds) seconds="$2"; shift ;;
    --rounds) rounds="$2"; shift ;;
    --spread) spread="$2"; shift ;;
    --hot) hot="$2"; shift ;;
    -*) sed -n '5,6p' "$0" >&2; exit 2 ;;
    *) commits+=("$1") ;;
  esac
  shift
done
[ "${#commits[@]}" -gt 0 ] || { sed -n '5,6p' "$0" >&2; exit 2; }

base_bin="$(bench/pinned_build.sh "$base")"
summary="$(mktemp)" tablefile="$(mktemp)"
trap 'rm -f "$summary" "$tablefile"' EXIT
for commit in "${commits[@]}"; do
  bin="$(bench/pinned_build.sh "$commit")"
  echo "== $commit: $(git log -1 --format=%s "$commit" | cut -c1-100)"
  table="$(bench/compare.sh --private-cluster --pinned "$base_bin" --this "$bin" --services-only \
    --seconds "$seconds" --rounds "$rounds" --spread "$spread" --hot "$hot")"
  echo "$table" | tee "$tablefile"
  # The table's rows: | load | kiosks | service | pinned | **ratio** | ...
  python3 - "$commit" "$(git log -1 --format=%s "$commit")" "$tablefile" << 'PY' >> "$summary"
import sys
commit, subject, path = sys.argv[1:]
cells = []
for line in open(path):
    parts = [p.strip() for p in line.strip().strip("|").split("|")]
    if len(parts) > 5 and parts[0].startswith(("spread", "hot")):
        cells.append(f"{parts[0].split()[0]}@{parts[1]} {parts[2]}/{parts[3]} {parts[4].strip('*')}")
print(commit + "\t" + subject[:70] + "\t" + "\t".join(cells))
PY
done

echo
echo "Each commit against $base in its own run (medians of $rounds rounds of $seconds s): cycles/s commit / base and the ratio."
echo
python3 - "$summary" << 'PY'
import sys
rows = [line.rstrip("\n").split("\t") for line in open(sys.argv[1])]
names = [cell.split()[0] for cell in rows[0][2:]] if rows else []
print("| commit | what it did | " + " | ".join(names) + " |")
print("|---|---|" + "---|" * len(names))
for commit, subject, *cells in rows:
    print(f"| {commit} | {subject} | " + " | ".join(f"{c.split()[1]} = **{c.split()[2]}**" for c in cells) + " |")
PY
