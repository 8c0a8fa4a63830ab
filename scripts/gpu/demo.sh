#!/usr/bin/env bash
# `stoker demo` on the 16-core H200 machine: how many emulated H100s
# (ResNet-50, MLPerf Storage's compute time) the node keeps >= 90% busy with
# the per-file loader and with stoker, under the default emulated CephFS
# round trip and on the local disk, with PyTorch's DataLoader as the peer.
#
#   scripts/gpu/demo.sh prepare   on the build machine (Debian 12): builds
#                                 build-demo/ (Release, no tests, RADOS and
#                                 Python off) and copies `stoker` and the
#                                 shared libraries it needs that the GPU
#                                 machine's image lacks into .demo-carry/
#                                 (git-ignored through .git/info/exclude)
#   scripts/gpu/demo.sh run       on the GPU machine, from the repository
#                                 root, with .demo-carry/ beside it: the demo
#                                 with --storage network, then local; logs
#                                 and JSON in $OUT (or /tmp/stoker-demo-out)
#
# With the device tool of this workplace, one call does the run:
#   run(command="bash scripts/gpu/demo.sh run", carry=[".demo-carry"])
# The demo uses the python3 on PATH for its PyTorch peer there
# (STOKER_DEMO_PYTHON).
set -euo pipefail
cd "$(dirname "$0")/../.."
carry=.demo-carry

prepare() {
  grep -qx '/.demo-carry/' .git/info/exclude 2>/dev/null || echo '/.demo-carry/' >>.git/info/exclude
  cmake -S . -B build-demo -DCMAKE_BUILD_TYPE=Release -DSTOKER_BUILD_TESTS=OFF \
    -DSTOKER_WITH_RADOS=OFF -DSTOKER_WITH_PYTHON=OFF -DSTOKER_WITH_MPI=OFF >/dev/null
  cmake --build build-demo -j"$(nproc)" --target stoker
  rm -rf "$carry"
  mkdir -p "$carry/bin" "$carry/lib"
  strip -o "$carry/bin/stoker" build-demo/stoker
  bash scripts/gpu/copy-libs.sh "$carry/lib" "$carry/bin/stoker"
  ls -la "$carry"/bin "$carry"/lib
}

run() {
  [[ -x "$carry/bin/stoker" ]] || { echo "demo.sh: no $carry/bin/stoker; run 'demo.sh prepare' first" >&2; exit 2; }
  export LD_LIBRARY_PATH=$PWD/$carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export STOKER_DEMO_PYTHON=${STOKER_DEMO_PYTHON:-$(command -v python3 || echo /usr/bin/python3)}
  out=${OUT:-/tmp/stoker-demo-out}
  mkdir -p "$out"
  echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB; python: $STOKER_DEMO_PYTHON"
  for storage in network local; do
    echo "==== stoker demo --storage $storage"
    "$carry/bin/stoker" demo --dir "/tmp/stoker-demo-$storage" --storage "$storage" \
      --json "$out/demo-$storage.json" 2>&1 | tee "$out/demo-$storage.log"
  done
  echo "==== summary"
  grep -h 'this node, this storage' "$out"/demo-*.log
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  *) sed -n '2,22p' "$0"; exit 2 ;;
esac
