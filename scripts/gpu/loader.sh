#!/usr/bin/env bash
# Issue 16 on the 16-core H200 machine: how the loader scales with cores, and
# what it delivers into HBM. Prints its results; logs and JSON go to $OUT
# (or ./gpu-out).
#
#   scripts/gpu/loader.sh prepare   on the build machine: what gpu-check.sh
#                                   prepare does (build-gpu/, .gpu-carry/:
#                                   stoker, the tests and the static modules
#                                   for the Python binding)
#   scripts/gpu/loader.sh run       on the GPU machine, from the repository
#                                   root, with .gpu-carry/ beside it:
#     1. the Python binding built there for its python3 (as gpu-check.sh)
#     2. bench/scaling.py: stoker.Loader vs torch's DataLoader at 1..16
#        workers, raw / decode / decode+augment (JSON: scaling.json)
#     3. stoker bench loader on the same data: raw --epochs 3 (epoch over
#        epoch), and decode at --threads 16 with --prefetch 4 and 32 (the
#        cores, not the prefetch depth, should set the speed)
#     4. stoker bench gpu-loader on raw 128 KiB samples hot in the page
#        cache, default options (target: >= 40 GB/s into HBM)
#
# Environment: STOKER_SCALING_ARGS (extra bench/scaling.py flags, e.g.
# "--images 2000 --repeats 2 --modes raw,decode"), STOKER_LOADER_STEPS
# (default "scaling,bench,gpu"), STOKER_GPU_DATA_GIB (default 4).
#
# With the device tool: run(command="bash scripts/gpu/loader.sh run",
# carry=[".gpu-carry"]).
set -uo pipefail
cd "$(dirname "$0")/../.."
carry=.gpu-carry

if [[ ${1:-} == prepare ]]; then
  exec bash scripts/gpu-check.sh prepare
fi
[[ ${1:-} == run ]] || { echo "usage: $0 prepare|run" >&2; exit 2; }

out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/$carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
bin=$PWD/$carry/bin
steps=${STOKER_LOADER_STEPS:-scaling,bench,gpu}
want() { [[ ",$steps," == *",$1,"* ]]; }
step() { echo; echo "==== $* ===="; }
fail=0

step machine
{
  date -u
  nproc
  free -g | head -2
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null
  python3 -c 'import torch, torchvision; print("torch", torch.__version__, "torchvision", torchvision.__version__)'
} 2>&1 | tee "$out/machine.txt"

# The binding, as scripts/gpu-check.sh builds it: python/stoker_ext.cc for
# this python3, linked to the carried static modules.
py=/tmp/stoker-py
if [[ ! -f $py/stoker/built ]]; then
  step "Python binding"
  inc=$(python3 -m pybind11 --includes) || { echo "no pybind11 for python3"; exit 1; }
  suffix=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  rm -rf "$py" && mkdir -p "$py/stoker" && cp python/stoker/*.py "$py/stoker/"
  # shellcheck disable=SC2086
  time c++ -O2 -std=c++20 -shared -fPIC $inc -Iinclude -Isrc -DSTOKER_VERSION='"gpu-loader"' \
    python/stoker_ext.cc -o "$py/stoker/_stoker$suffix" -Wl,--start-group "$carry"/lib-static/*.a \
    -Wl,--end-group "$carry"/lib/*.so* /usr/local/cuda/lib64/libcudart_static.a -ldl -lrt \
    -lpthread >"$out/python_build.log" 2>&1 || { tail -20 "$out/python_build.log"; exit 1; }
  touch "$py/stoker/built"
fi

data=/tmp/stoker-scaling
if want scaling; then
  step "bench/scaling.py"
  # shellcheck disable=SC2086
  PYTHONPATH=$py PYTHONUNBUFFERED=1 python3 bench/scaling.py --dir "$data" \
    --json "$out/scaling.json" ${STOKER_SCALING_ARGS:-} 2>&1 | tee "$out/scaling.log"
  ((PIPESTATUS[0] == 0)) || fail=1
fi

if want bench && [[ -f $data/raw-ds/manifest.stoker ]]; then
  step "stoker bench loader: raw, 3 epochs (epoch over epoch)"
  "$bin/stoker" bench loader "$data/raw-ds" --epochs 3 --batch-size 64 | tee "$out/bench_raw.txt"
  if [[ -f $data/jpg-ds/manifest.stoker ]]; then
    for pf in 4 32; do
      step "stoker bench loader: decode, --threads $(nproc) --prefetch $pf"
      "$bin/stoker" bench loader "$data/jpg-ds" --decode --threads "$(nproc)" --prefetch "$pf" \
        --epochs 2 --batch-size 64 | tee "$out/bench_decode_prefetch$pf.txt"
    done
  fi
fi

if want gpu; then
  step "stoker bench gpu-loader: raw 128 KiB hot, default options"
  gib=${STOKER_GPU_DATA_GIB:-4}
  ds=/tmp/stoker-gpu-data-$gib/ds
  if [[ ! -f $ds/manifest.stoker ]]; then
    src=/tmp/stoker-gpu-data-$gib/src
    python3 - "$src" "$gib" <<'PY'
import os, sys
from concurrent.futures import ThreadPoolExecutor
import numpy as np
src, gib = sys.argv[1], float(sys.argv[2])
count = int(gib * (1 << 30)) // (128 << 10)
def write(part):
    rng = np.random.default_rng(part)
    d = os.path.join(src, "c%02d" % part)
    os.makedirs(d, exist_ok=True)
    for i in range(part, count, 16):
        with open(os.path.join(d, "s%08d.bin" % i), "wb") as f:
            f.write(rng.bytes(128 << 10))
with ThreadPoolExecutor(16) as pool:
    list(pool.map(write, range(16)))
PY
    "$bin/stoker" pack --quiet "$src" "$ds" && rm -rf "$src"
  fi
  find "$ds" -type f -exec cat {} + >/dev/null  # hot
  for flags in "" "--threads $(($(nproc) * 3 / 2)) --prefetch 16"; do
    echo "-- flags: ${flags:-(defaults)}"
    # shellcheck disable=SC2086
    "$bin/stoker" bench gpu-loader "$ds" --epochs 2 --repeats 3 $flags 2>&1 |
      tee -a "$out/gpu_loader.txt" | tail -12
    ((PIPESTATUS[0] == 0)) || fail=1
  done
fi
exit "$fail"
