#!/usr/bin/env bash
# stoker doctor on a GPU node, read-only: every check's verdict and evidence
# as JSON and text, and `stoker tune node`'s derived settings (printed, not
# applied). Nothing here changes a GPU setting, a sysctl or a limit; the
# folder read tests write a temporary file under /tmp and /var/tmp, unlinked
# at once.
#
#   scripts/gpu/doctor.sh prepare   on the build machine (Debian 12, CUDA at
#                                   /usr/local/cuda, no GPU needed): builds
#                                   build-gpu/ (Release, CUDA on, RADOS off)
#                                   and copies the stoker binary and the
#                                   shared libraries it needs into .gpu-carry/
#                                   (as scripts/gpu-check.sh prepare does;
#                                   either one's carry works)
#   scripts/gpu/doctor.sh run       on the GPU machine, from the repository
#                                   root: writes doctor.json, doctor.txt,
#                                   tune-node.txt and machine.txt to
#                                   $OUT (or /tmp/gpu-doctor) and prints them
#
# With the device tool of this workplace, one call does the run:
#   run(command="bash scripts/gpu/doctor.sh run", carry=[".gpu-carry"])
#
# Exit status: doctor's (0 all PASS/SKIP, 1 a WARN, 2 a FAIL), or 3 when the
# binary is missing or crashed.
set -uo pipefail
cd "$(dirname "$0")/../.."
carry=.gpu-carry

prepare() {
  set -e
  local exclude
  exclude=$(git rev-parse --git-path info/exclude) # a worktree's .git is a file
  mkdir -p "$(dirname "$exclude")"
  grep -qx '/.gpu-carry/' "$exclude" 2>/dev/null || echo '/.gpu-carry/' >>"$exclude"
  # An existing build-gpu/ (scripts/gpu-check.sh prepare makes one) is reused.
  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DSTOKER_WITH_CUDA=ON \
    -DSTOKER_WITH_RADOS=OFF -DSTOKER_WITH_PYTHON=OFF -DSTOKER_BUILD_TESTS=OFF >/dev/null
  cmake --build build-gpu -j"$(nproc)" --target stoker
  mkdir -p "$carry/bin" "$carry/lib"
  strip -o "$carry/bin/stoker" build-gpu/stoker
  # Libraries outside glibc, libstdc++ and the driver: the GPU machine's
  # image is another distribution and lacks these Debian packages.
  bash scripts/gpu/copy-libs.sh "$carry/lib" "$carry/bin/stoker"
  ls -la "$carry/bin" "$carry/lib"
}

run() {
  local out=${OUT:-/tmp/gpu-doctor} bin=$PWD/$carry/bin/stoker rc
  mkdir -p "$out"
  export LD_LIBRARY_PATH=$PWD/$carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  [[ -x $bin ]] || { echo "no $bin: run 'scripts/gpu/doctor.sh prepare' on the build machine"; return 3; }
  {
    date -u
    uname -a
    nproc
    free -g | head -2
    nvidia-smi --query-gpu=name,pci.bus_id,driver_version,persistence_mode,ecc.mode.current,compute_mode,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max \
      --format=csv 2>&1
    id
  } >"$out/machine.txt" 2>&1
  cat "$out/machine.txt"
  local dirs=(--cache-dir /tmp --ckpt-dir /var/tmp)
  echo; echo "==== stoker doctor --json (read-only) ===="
  local t0=$SECONDS
  "$bin" doctor --json "${dirs[@]}" >"$out/doctor.json" 2>"$out/doctor.err"
  rc=$?
  echo "exit $rc in $((SECONDS - t0)) s (wall, including the GPU's start)"
  "$bin" doctor -v "${dirs[@]}" >"$out/doctor.txt" 2>&1
  cat "$out/doctor.txt"
  echo; echo "==== stoker tune node (printed, nothing applied) ===="
  "$bin" tune node >"$out/tune-node.txt" 2>&1
  cat "$out/tune-node.txt"
  # Doctor's exit status, unless it crashed (a signal: 128 + N).
  ((rc < 128)) || return 3
  return "$rc"
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  *)
    sed -n '2,/^set -uo/{/^set -uo/d;s/^# \{0,1\}//;p}' "$0" >&2
    exit 2
    ;;
esac
