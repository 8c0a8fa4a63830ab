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

# CUDA where the toolkit is installed (the build machines have it, without a
# GPU): the GPU code is compiled and its tests skip, saying why.
cuda=OFF
[[ -x /usr/local/cuda/bin/nvcc ]] && cuda=ON
# The probes of bench/*.cc too, so that they keep compiling.
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTOKER_BUILD_TESTS=ON -DSTOKER_BUILD_PROBES=ON \
  -DSTOKER_WITH_RADOS=ON -DSTOKER_WITH_PYTHON=ON -DSTOKER_WITH_MPI=ON -DSTOKER_WITH_CUDA="$cuda"
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
# run_ctest LOG ARGS...: ctest in build/, its output also kept in LOG.
run_ctest() {
  local log=$1 rc
  shift
  set +e
  (cd build && ctest --output-on-failure "$@") 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  set -e
  ((rc == 0)) || failed=1
}

step "unit, integration and Python tests (ctest)"
run_ctest build/ctest-main.log -j2 -LE ceph-faults

step "fault injection against the real Ceph cluster (ctest, serial)"
run_ctest build/ctest-faults.log -j1 -L ceph-faults

step "fuzz: manifest and shard parsers (bounded)"
# libFuzzer's progress goes to a log; its verdict and final stats are shown.
if scripts/fuzz.sh "${STOKER_FUZZ_SECONDS:-30}" >build/fuzz.log 2>&1; then
  grep -E '^(== |fuzz:|Done )' build/fuzz.log || true
else
  tail -n 60 build/fuzz.log
  failed=1
fi

# One closing line over both ctest runs ("N passed, N failed, N skipped");
# ctest counts a skipped test in its total, so skips are taken out of passed.
read -r total bad < <(cat build/ctest-main.log build/ctest-faults.log |
  sed -n 's/.*tests passed, \([0-9]*\) tests failed out of \([0-9]*\).*/\2 \1/p' |
  awk '{t += $1; f += $2} END {print t + 0, f + 0}')
skipped=$(cat build/ctest-main.log build/ctest-faults.log | grep -c '(Skipped)$' || true)
echo
if ((failed)); then
  # Repeat the names of the failed tests last, where a CI log's tail shows them.
  cat build/ctest-main.log build/ctest-faults.log |
    sed -n '/The following tests FAILED/,/^Errors while running/p' >&2 || true
  echo "stoker: some tests FAILED (details: build/ctest-main.log, build/ctest-faults.log, build/fuzz.log)" >&2
fi
echo "ctest: $((total - bad - skipped)) passed, $bad failed, $skipped skipped"
exit "$failed"
