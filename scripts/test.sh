#!/usr/bin/env bash
# The README's second command, and what .ci/run runs: install everything,
# build everything (RADOS and Python included), start the real components the
# tests need (a Ceph cluster on 127.0.0.1), run every test. Debian 12, as
# root. Exits non-zero if anything fails.
#
#   STOKER_FUZZ_SECONDS   seconds per fuzz target (default 30)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

scripts/install-deps.sh --all

cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTOKER_BUILD_TESTS=ON \
  -DSTOKER_WITH_RADOS=ON -DSTOKER_WITH_PYTHON=ON
cmake --build build -j"$(nproc)"

# One Ceph cluster for the suites that only use it; the fault-injection
# suites run after the rest, alone, on the same cluster.
ceph_dir=$(mktemp -d /tmp/stoker-ci-ceph.XXXXXX)
rmdir "$ceph_dir"
cleanup() { scripts/ceph-cluster.sh stop "$ceph_dir" >/dev/null 2>&1 || true; }
trap cleanup EXIT
eval "$(scripts/ceph-cluster.sh start "$ceph_dir")"
export STOKER_CEPH_DIR=$ceph_dir
# The store conformance suite runs against RADOS too.
export STOKER_TEST_STORE_URI="rados://checkpoint/conformance?id=stoker-train"

failed=0
step() { echo; echo "==== $* ===="; }

step "unit, integration and Python tests (ctest)"
(cd build && ctest --output-on-failure -j2 -LE ceph-faults) || failed=1

step "fault injection against the real Ceph cluster (ctest, serial)"
(cd build && ctest --output-on-failure -j1 -L ceph-faults) || failed=1

step "fuzz: manifest and shard parsers (bounded)"
scripts/fuzz.sh "${STOKER_FUZZ_SECONDS:-30}" || failed=1

if ((failed)); then
  echo "stoker: some tests FAILED" >&2
  exit 1
fi
echo "stoker: all tests passed"
