#!/usr/bin/env bash
# Checkpoints of GPU state on the GPU machine, every pending step of issue 33
# in one go (~8 minutes at 8 GiB):
#   1. the Python binding, built there as scripts/gpu-check.sh builds it
#   2. tests/python/test_checkpoint_gpu.py (CUDA tensors: async snapshot and
#      bounded saves ordered after the current stream, wait_staged, restores
#      into device memory, ShardedTensors on the GPU, 100 saves without
#      growth) and tests/python/test_checkpoint_reshard.py (DTensor runs
#      there: torch 2.x)
#   3. bench/ckpt_gpu_bench.py: an 8 GiB GPU state (bf16 weights + fp32
#      moments) saved by torch.save, dcp.save, dcp.async_save (default and
#      pinned stager), stoker sync/async/bounded; restores into GPU; the
#      pinned D2H/H2D and O_DIRECT disk ceilings in the same run; medians of 3
#
# On the build machine first: scripts/gpu-check.sh prepare (builds build-gpu/
# and .gpu-carry/). Then, with the device tool:
#   run(command="bash scripts/gpu/ckpt_gpu.sh", carry=[".gpu-carry"])
# Results under $OUT: ckpt_gpu.json, summary.txt, ckpt_gpu.tar.gz (logs).
# Environment: STOKER_CKPT_GPU_GIB (default 8), STOKER_CKPT_GPU_REPEATS (3),
# STOKER_CKPT_GPU_DIR (default /var/tmp/ckgpu: the node's disk),
# STOKER_CKPT_GPU_STEPS (default "tests,bench"), STOKER_CKPT_GPU_BENCH_TIMEOUT
# (seconds, default 290: 4 GiB; 8 GiB with 3 repeats takes ~400 s, so run
# the bench alone for it: STOKER_CKPT_GPU_STEPS=bench ..._TIMEOUT=560).
set -uo pipefail
cd "$(dirname "$0")/../.."
# The binding links the libraries the carry brings (libarchive: the GPU
# image has none).
[[ -d .gpu-carry/lib ]] && export LD_LIBRARY_PATH=$PWD/.gpu-carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
out=/tmp/ckpt-gpu
rm -rf "$out"
mkdir -p "$out"
dest=${OUT:-$PWD/ckpt-gpu-out}
mkdir -p "$dest"
py=/tmp/stoker-py
fail=0
{
  echo "==== machine"
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
  nproc
  free -g | head -2
  df -h "${STOKER_CKPT_GPU_DIR:-/var/tmp}" 2>&1 | tail -1
  python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available())'

  echo "==== Python binding"
  if ! OUT=$out timeout 180 bash scripts/gpu-check.sh binding >"$out/binding.log" 2>&1; then
    tail -30 "$out/binding.log"
    echo "binding: FAILED"
    fail=1
  fi

  steps=${STOKER_CKPT_GPU_STEPS:-tests,bench}
  if [[ $fail == 0 && ",$steps," == *,tests,* ]]; then
    echo "==== tests: test_checkpoint_gpu.py, test_checkpoint_reshard.py"
    PYTHONPATH=$py STOKER_SOURCE_DIR=$PWD timeout 120 python3 -m pytest -q -p no:cacheprovider \
      tests/python/test_checkpoint_gpu.py tests/python/test_checkpoint_reshard.py 2>&1 |
      tee "$out/tests.log" | tail -25
    [[ ${PIPESTATUS[0]} == 0 ]] || fail=1
  fi
  if [[ $fail == 0 && ",$steps," == *,bench,* ]]; then
    echo "==== bench/ckpt_gpu_bench.py"
    PYTHONPATH=$py PYTHONUNBUFFERED=1 timeout "${STOKER_CKPT_GPU_BENCH_TIMEOUT:-290}" \
      python3 bench/ckpt_gpu_bench.py \
      --dir "${STOKER_CKPT_GPU_DIR:-/var/tmp/ckgpu}" --gib "${STOKER_CKPT_GPU_GIB:-8}" \
      --repeats "${STOKER_CKPT_GPU_REPEATS:-3}" --json "$out/ckpt_gpu.json" 2>&1 |
      tee "$out/bench.log"
    [[ ${PIPESTATUS[0]} == 0 ]] || fail=1
  fi
  echo "ckpt_gpu: $([[ $fail == 0 ]] && echo OK || echo 'SOME STEPS FAILED')"
} 2>&1 | tee "$out/summary.txt"
cp "$out/summary.txt" "$dest/"
cp "$out/ckpt_gpu.json" "$dest/" 2>/dev/null
tar czf "$dest/ckpt_gpu.tar.gz" -C /tmp ckpt-gpu
grep -q "ckpt_gpu: OK" "$out/summary.txt"
