#!/usr/bin/env bash
# The release binaries of a fixed commit, built once and kept: the pinned
# speed reference of bench/compare.sh --pinned.
#
# Usage:
#   bench/pinned_build.sh [COMMIT]        # default 8d85f2e; prints the bin dir
#   bench/compare.sh --pinned "$(bench/pinned_build.sh)" ...
#
# Makes a git worktree of COMMIT (detached) at
# ${PINNED_DIR:-$HOME/.cache/token-billing-pinned}/<commit>/src, builds it
# with `cargo build --release --locked` (niced) in the target directory
# shared with the main build (CARGO_TARGET_DIR, default
# $HOME/.cache/token-billing-target), so the dependencies already built are
# reused, and copies token-billing and its load generator to
# .../<commit>/bin/: token-billing-bench (bench/src/main.rs), or in a
# commit from before that crate (8d85f2e, 19d87d7) token-billing-tools,
# whose `bench …` commands they were (bench/load_generator.sh runs either).
# When both copies exist it does nothing but print the directory. Progress
# goes to stderr, the bin dir alone to stdout.
#
# The shared target directory: cargo's lock on it serialises this build
# with any other. The binaries are copied from target/release/ under that
# lock, once their dep-info (target/release/<name>.d) shows they are this
# worktree's (another build may have come in between; then cargo runs
# again, which only links them again); then target/release/<name> is put
# back as it was before (a copy taken just before cargo), so that
# target/release/token-billing stays the main build's. (The crate itself
# is compiled again by the next build of the other checkout: cargo keeps
# one build of a package per target directory and profile, only its
# dependencies are shared.)
set -euo pipefail
cd "$(dirname "$0")/.."

commit="$(git rev-parse --short "${1:-8d85f2e}^{commit}")"
root="${PINNED_DIR:-$HOME/.cache/token-billing-pinned}/$commit"
src="$root/src"
bin="$root/bin"
target="${CARGO_TARGET_DIR:-$HOME/.cache/token-billing-target}"
# The load generator's binary of that commit, and every binary a build of
# it may link into target/release (each put back as it was).
generator=token-billing-tools
git cat-file -e "$commit:bench/Cargo.toml" 2> /dev/null && generator=token-billing-bench
names="token-billing $generator"
uplifted="token-billing token-billing-tools token-billing-bench"

if [ -x "$bin/token-billing" ] && [ -x "$bin/$generator" ]; then
  echo "$bin"
  exit 0
fi

mkdir -p "$root"
if [ ! -e "$src/Cargo.toml" ]; then
  git worktree add -f --detach "$src" "$commit" >&2
fi
[ "$(git -C "$src" rev-parse --short HEAD)" = "$commit" ] \
  || { echo "$src is not at $commit" >&2; exit 1; }

release="$target/release"
mkdir -p "$release"
touch "$release/.cargo-lock" # cargo's own lock on the release dir (flock)
# Copies of target/release/<name> and its dep-info before this build (not
# a hard link: this build may rewrite the very deps file it links to).
backup="$root/uplifted-before"
remember_uplifted() {
  local name
  rm -rf "$backup"
  mkdir -p "$backup"
  for name in $uplifted; do
    [ -f "$release/$name.d" ] && cp -p "$release/$name.d" "$backup/$name.d"
    [ -f "$release/$name" ] && cp -p "$release/$name" "$backup/$name"
  done
  return 0
}
restore_uplifted() { # name: unlinked first, so that the deps file stays
  rm -f "$release/$1" "$release/$1.d"
  [ -f "$backup/$1" ] && cp -p "$backup/$1" "$release/$1"
  [ -f "$backup/$1.d" ] && cp -p "$backup/$1.d" "$release/$1.d"
  return 0
}
# The uplifted binary is this build's if its dep-info names our sources.
ours() { # name main-source
  [ -f "$release/$1.d" ] && grep -qF " $src/$2" "$release/$1.d"
}

mkdir -p "$bin"
for attempt in 1 2 3; do
  flock "$release/.cargo-lock" true # wait for a build running now, then look
  remember_uplifted
  echo "building $commit in $src (target dir $target) ..." >&2
  status=0
  (cd "$src" && CARGO_TARGET_DIR="$target" nice -n 10 cargo build --release --locked --bins >&2) || status=$?
  exec 9> "$release/.cargo-lock"
  flock 9 # no cargo writes there while the binaries are copied and put back
  copied=0
  for name in $uplifted; do
    case "$name" in
      # The tools' binary: tools/src/main.rs since the workspace, before it
      # src/bin/token-billing-tools.rs.
      token-billing-tools)
        ours "$name" tools/src/main.rs || ours "$name" src/bin/token-billing-tools.rs || continue ;;
      token-billing-bench) ours "$name" bench/src/main.rs || continue ;;
      *) ours "$name" src/main.rs || continue ;;
    esac
    # Copied if wanted and the build succeeded; put back in any case.
    if [ "$status" -eq 0 ] && [[ " $names " == *" $name "* ]]; then
      cp "$release/$name" "$bin/$name.tmp"
      mv "$bin/$name.tmp" "$bin/$name"
      copied=$((copied + 1))
    fi
    restore_uplifted "$name"
  done
  exec 9>&-
  [ "$status" -eq 0 ] || { echo "cargo build of $commit failed ($status)" >&2; exit 1; }
  [ "$copied" -eq 2 ] && break
  # Another build came in between cargo and the lock: cargo again (fresh,
  # it only links the binaries into target/release again).
  echo "target/release was rebuilt by another build meanwhile; again ($attempt)" >&2
  rm -f "$bin/token-billing" "$bin/$generator"
done
rm -rf "$backup"
[ -x "$bin/token-billing" ] && [ -x "$bin/$generator" ] \
  || { echo "could not copy the binaries of $commit" >&2; exit 1; }
"$bin/token-billing" --version >&2
echo "$bin"
