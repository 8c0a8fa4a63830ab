#!/usr/bin/env bash
# The README's second command, and what .ci/run runs: install everything,
# build everything, start the real components the tests need, run every
# test. Debian 12, as root. Exits non-zero if anything fails.
#
#   STOKER_FUZZ_SECONDS   seconds per fuzz target (default 30)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

scripts/install-deps.sh --all

cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTOKER_BUILD_TESTS=ON
cmake --build build -j"$(nproc)"

failed=0
step() { echo; echo "==== $* ===="; }

step "unit and integration tests (ctest)"
(cd build && ctest --output-on-failure -j2) || failed=1

step "fuzz: manifest and shard parsers (bounded)"
scripts/fuzz.sh "${STOKER_FUZZ_SECONDS:-30}" || failed=1

if ((failed)); then
  echo "stoker: some tests FAILED" >&2
  exit 1
fi
echo "stoker: all tests passed"
