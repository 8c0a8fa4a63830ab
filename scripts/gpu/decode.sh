#!/usr/bin/env bash
# Issue 34 on the GPU machine: the GPU decode's tests and benchmark, in one
# go (about 5 minutes). Prints its results; logs and JSON go to $OUT (or
# ./gpu-out): decode-summary.txt, gpu_decode.json, decode-logs.tar.gz.
#
#   scripts/gpu/decode.sh prepare   on the build machine: what gpu-check.sh
#                                   prepare does (build-gpu/ with nvcc, so
#                                   with the fused kernel; .gpu-carry/ with
#                                   stoker, the tests, gpu_decode_test and the
#                                   static modules for the Python binding)
#   scripts/gpu/decode.sh run       on the GPU machine, from the repository
#                                   root, with .gpu-carry/ beside it:
#     1. where libnvjpeg is (find), and STOKER_NVJPEG_PATH set to it
#        (stoker also looks in $CUDA_HOME/lib64, /usr/local/cuda/lib64 and
#        $VIRTUAL_ENV's site-packages/nvidia/*/lib by itself)
#     2. gpu_decode_test: routing, crops, the kernel against its CPU
#        reference on the GPU, the loader decoding on the GPU (pixels within
#        3 grey levels of the CPU path, device memory flat over 50 epochs)
#     3. the Python binding built there (as gpu-check.sh), then
#        bench/gpu_decode_bench.py on 6000 JPEGs: DataLoader (16 workers),
#        torchvision's decode_jpeg(device="cuda"), stoker CPU, stoker GPU,
#        stoker CPU+GPU (cpu_share from the two);
#        medians of 3 epochs
#     4. the GPU tests again under compute-sanitizer memcheck (last: it is
#        the slowest; each step has a timeout, the whole fits in ~9 min)
#
# Environment: STOKER_DECODE_STEPS (default "tests,sanitizer,bench"),
# STOKER_DECODE_BENCH_ARGS (extra bench flags), STOKER_DECODE_IMAGES (the bench's JPEGs,
# default 24000: at 6000 an epoch of the fastest way lasted 0.2 s and its
# start and drain weighed on the ratios).
#
# With the device tool: run(command="bash scripts/gpu/decode.sh run",
# carry=[".gpu-carry"]).
set -uo pipefail
cd "$(dirname "$0")/../.."
carry=.gpu-carry

if [[ ${1:-} == prepare ]]; then
  exec bash scripts/gpu-check.sh prepare
fi
[[ ${1:-} == run ]] || { echo "usage: $0 prepare|run" >&2; exit 2; }

dest=${OUT:-$PWD/gpu-out}
log=/tmp/stoker-decode
rm -rf "$log"
mkdir -p "$dest" "$log"
export LD_LIBRARY_PATH=$PWD/$carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
bin=$PWD/$carry/bin
steps=${STOKER_DECODE_STEPS:-tests,sanitizer,bench}
want() { [[ ",$steps," == *",$1,"* ]]; }
step() { echo; echo "==== $* ===="; }

main() {
  local fail=0
  step machine
  date -u
  nproc
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  python3 -c 'import torch, torchvision; print("torch", torch.__version__, "torchvision", torchvision.__version__)' 2>&1

  step "where libnvjpeg is"
  local found
  found=$(timeout 30 find / \( -path /proc -o -path /sys -o -path /dev \) -prune -o \
    -name 'libnvjpeg.so*' -print 2>/dev/null | sort)
  echo "${found:-none found}"
  if [[ -z ${STOKER_NVJPEG_PATH:-} ]]; then
    local pick
    pick=$(grep -E 'libnvjpeg\.so\.13$' <<<"$found" | head -1)
    [[ -n $pick ]] || pick=$(grep -E 'libnvjpeg\.so\.12$' <<<"$found" | head -1)
    [[ -n $pick ]] || pick=$(grep -E 'libnvjpeg\.so\.1[23]' <<<"$found" | head -1)
    if [[ -n $pick ]]; then
      export STOKER_NVJPEG_PATH=$pick
      echo "STOKER_NVJPEG_PATH=$pick"
    else
      echo "no libnvjpeg on this machine: the GPU decode will report it and run on the CPU"
    fi
  fi

  if want tests; then
    step "gpu_decode_test"
    # A test still running after 70 s has its threads' stacks and CPU times
    # written to the log (gdb or cuda-gdb, where the image has one), so a
    # slow test shows where it spends its time.
    timeout 120 "$bin/gpu_decode_test" >"$log/gpu_decode_test.log" 2>&1 &
    local pid=$! k
    for ((k = 0; k < 70; ++k)); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    if kill -0 "$pid" 2>/dev/null; then
      local t
      t=$(pgrep -P "$pid" -x gpu_decode_test || echo "$pid")
      echo "gpu_decode_test still running after 70 s: stacks in stacks.log"
      top -H -b -n 1 -p "$t" 2>&1 | head -20 | tee "$log/top.log"
      local dbg
      dbg=$(command -v gdb || command -v cuda-gdb || ls /usr/local/cuda*/bin/cuda-gdb 2>/dev/null | head -1)
      [[ -n $dbg ]] && timeout 40 "$dbg" -p "$t" -batch -ex 'thread apply all bt 25' >"$log/stacks.log" 2>&1
      grep -E '^#[0-9]+ ' "$log/stacks.log" 2>/dev/null | grep -v -E 'pthread_cond|futex|epoll|poll \(|nanosleep|clock_nanosleep' |
        head -40
    fi
    wait "$pid"
    local trc=$?
    grep -E '^\[ +(OK|FAILED|SKIPPED) |Skipped|decode path|GPU vs CPU|GPU reference|nvJPEG |^epoch |device memory' \
      "$log/gpu_decode_test.log" | tail -50
    ((trc == 0)) || fail=1
  fi

  if want bench; then
    step "Python binding"
    OUT=$log bash scripts/gpu-check.sh binding || return 1
    step "bench/gpu_decode_bench.py"
    # shellcheck disable=SC2086
    PYTHONPATH=/tmp/stoker-py PYTHONUNBUFFERED=1 timeout 240 python3 bench/gpu_decode_bench.py \
      --dir /tmp/stoker-gpu-decode --images ${STOKER_DECODE_IMAGES:-24000} --json "$dest/gpu_decode.json" \
      ${STOKER_DECODE_BENCH_ARGS:-} 2>&1 | tee "$log/gpu_decode_bench.log"
    ((PIPESTATUS[0] == 0)) || fail=1
  fi
  if want sanitizer; then
    step "the GPU tests under compute-sanitizer memcheck"
    timeout 90 compute-sanitizer --tool memcheck --error-exitcode 99 "$bin/gpu_decode_test" \
      --gtest_filter='FusedResizeKernel.*:GpuDecodeLoader.ACorruptJpeg*' >"$log/sanitizer.log" 2>&1
    local rc=$?
    echo "compute-sanitizer memcheck: exit $rc; $(grep -E 'ERROR SUMMARY|PASSED|FAILED' \
      "$log/sanitizer.log" | tr '\n' ' ')"
    ((rc == 0)) || fail=1
  fi

  return "$fail"
}

main 2>&1 | tee "$dest/decode-summary.txt"
rc=${PIPESTATUS[0]}
tar czf "$dest/decode-logs.tar.gz" -C /tmp stoker-decode
echo "decode.sh: $([[ $rc == 0 ]] && echo OK || echo 'SOME STEPS FAILED') (logs in $dest)" |
  tee -a "$dest/decode-summary.txt"
exit "$rc"
