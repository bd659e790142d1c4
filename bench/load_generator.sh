# Sourced by the bench scripts that may drive a service with another
# build's load generator (bench/compare.sh --pinned / --this, profile.sh
# BIN_DIR, history.sh BIN, grants_compare.sh BIN, job_writes.sh
# LOAD_GENERATOR_DIR): the load generator of a directory of release
# binaries, as the command to run before a load generator's name.
#
#   load_generator DIR    sets the array `bench`, then: "${bench[@]}" load …
#
# The load generators are the binary token-billing-bench (this directory's
# crate, bench/src/); builds from before it was one (the pinned 8d85f2e and
# 19d87d7 among them) have them as `token-billing-tools bench …`, with the
# same commands and flags. A database URL goes in DATABASE_URL, which both
# read (the flag's place differs: `token-billing-tools --database-url …
# bench history`).

load_generator() { # dir
  if [ -x "$1/token-billing-bench" ]; then
    bench=("$1/token-billing-bench")
  elif [ -x "$1/token-billing-tools" ]; then
    bench=("$1/token-billing-tools" bench)
  else
    echo "$1/token-billing-bench missing: cargo build --release (another commit: bench/pinned_build.sh COMMIT)" >&2
    return 1
  fi
}
