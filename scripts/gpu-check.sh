#!/usr/bin/env bash
# GPU delivery, checked and measured on a machine with a GPU, in one go.
#
#   scripts/gpu-check.sh prepare   on the build machine (Debian 12, CUDA at
#                                  /usr/local/cuda, no GPU needed): builds
#                                  build-gpu/ (Release, CUDA on, RADOS and
#                                  Python off) and copies the binaries and
#                                  the shared libraries they need that a
#                                  stock CUDA image lacks into .gpu-carry/
#                                  (git-ignored through .git/info/exclude).
#   scripts/gpu-check.sh run       on the GPU machine, from the repository
#                                  root, with .gpu-carry/ beside it: GPU
#                                  tests, the same under compute-sanitizer
#                                  (memcheck, racecheck, synccheck), `bench
#                                  h2d`, and `bench gpu-loader` on raw shards
#                                  hot in the page cache. Logs and JSON go to
#                                  /tmp/gpu-check/, packed at the end into
#                                  $OUT/gpu-check.tar.gz (the device tool
#                                  brings back at most 8 files), with
#                                  h2d.json and summary.txt beside it.
#
# With the device tool of this workplace, one call does the run:
#   run(command="bash scripts/gpu-check.sh run", carry=[".gpu-carry"])
#
# Environment for `run`: STOKER_GPU_DATA_GIB (dataset size, default 8),
# STOKER_GPU_SAMPLE_KIB (raw sample size, default 128), STOKER_GPU_STEPS
# (which steps, default "tests,sanitizer,loader_test,h2d,python,loader";
# "ckpt" adds bench/ckpt_bench.py on this machine's disk, for the sizes in
# STOKER_GPU_CKPT_SIZES, default "1 8", each within STOKER_GPU_CKPT_TIMEOUT
# seconds, default 540).
set -uo pipefail
cd "$(dirname "$0")/.."
carry=.gpu-carry

prepare() {
  set -e
  ex=$(git rev-parse --git-path info/exclude); grep -qx '/.gpu-carry/' "$ex" 2>/dev/null || echo '/.gpu-carry/' >>"$ex"
  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DSTOKER_WITH_CUDA=ON \
    -DSTOKER_WITH_RADOS=OFF -DSTOKER_WITH_PYTHON=OFF -DSTOKER_BUILD_TESTS=ON \
    -DSTOKER_BUILD_PROBES=ON >/dev/null
  cmake --build build-gpu -j"$(nproc)" --target stoker gpu_test loader_test pagecache_dma_probe \
    copy_paths_probe gpu_decode_test token_index_bench
  rm -rf "$carry"
  mkdir -p "$carry/bin" "$carry/lib" "$carry/lib-static"
  # The modules, for building the Python binding there against its python3.
  cp build-gpu/libstoker_*.a "$carry/lib-static/"
  rm -f "$carry/lib-static/libstoker_bench.a"
  for b in build-gpu/stoker build-gpu/tests/gpu_test build-gpu/tests/loader_test \
    build-gpu/pagecache_dma_probe build-gpu/copy_paths_probe build-gpu/tests/gpu_decode_test \
    build-gpu/token_index_bench; do
    strip -o "$carry/bin/$(basename "$b")" "$b"
  done
  # `stoker bench comm` with a fault injected, for comm.sh's corruption step
  # (tests/comm/comm_faults.cc; the product's stoker has no fault hooks).
  cmake --build build-gpu -j"$(nproc)" --target stoker_comm_faults
  strip -o "$carry/bin/stoker_comm_faults" build-gpu/tests/stoker_comm_faults
  # Libraries outside glibc, libstdc++ and the driver: the GPU machine's
  # image is another distribution and lacks these Debian packages.
  bash scripts/gpu/copy-libs.sh "$carry/lib" "$carry"/bin/*
  # ICU's data (31 MB, needed through libarchive -> libxml2) travels
  # compressed, 7.5 MB, so the carry fits the device tool's 64 MiB; `run`
  # (and scripts/gpu/run.sh) unpack it.
  for big in "$carry"/lib/libicudata.so.*; do
    [[ -f $big && $big != *.xz ]] && xz -T2 -6 -f "$big"
  done
  ls -la "$carry"/bin "$carry"/lib
  du -sh "$carry"
}

# Builds the binding (python/*.cc) against this machine's python3 and pybind11,
# linked to the carried static modules, into /tmp/stoker-py (once). Returns
# 2 where there is no pybind11.
py=/tmp/stoker-py
build_binding() {
  local suffix inc
  [[ -f $py/stoker/built ]] && return 0
  if ! inc=$(python3 -m pybind11 --includes 2>/dev/null); then
    echo "python: no pybind11 for $(command -v python3)"
    return 2
  fi
  suffix=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  rm -rf "$py"
  mkdir -p "$py/stoker"
  cp python/stoker/*.py "$py/stoker/"
  # One compiler a file, all at once, then the link.
  mkdir -p "$py/obj"
  # shellcheck disable=SC2086
  if ! { ls python/*.cc | xargs -P "$(nproc)" -I{} sh -c \
    'timeout 300 c++ -O2 -std=c++20 -fPIC '"$inc"' -Iinclude -Isrc -DSTOKER_VERSION="\"gpu-check\"" -c {} -o '"$py"'/obj/$(basename {} .cc).o' &&
    timeout 120 c++ -shared "$py"/obj/*.o -o "$py/stoker/_stoker$suffix" \
      -Wl,--start-group "$carry"/lib-static/*.a -Wl,--end-group \
      "$carry"/lib/*.so* /usr/local/cuda/lib64/libcudart_static.a -ldl -lrt -lpthread; } \
    >"$out/python_build.log" 2>&1; then
    tail -20 "$out/python_build.log"
    return 1
  fi
  touch "$py/stoker/built"
}

# The GPU Python tests, through the binding built here.
python_binding() {
  build_binding
  case $? in
    0) ;;
    2) echo "python: skipped"; return 0 ;;
    *) return 1 ;;
  esac
  PYTHONPATH=$py STOKER_SOURCE_DIR=$PWD timeout 300 python3 -m pytest -q -p no:cacheprovider \
    tests/python/test_gpu.py tests/python/test_torch.py 2>&1 | tee "$out/python_test.log" | tail -15
  return "${PIPESTATUS[0]}"
}

# Unpacks what prepare compressed (python3's lzma: the image may lack xz).
unpack_carry() {
  local f
  for f in "$carry"/lib/*.xz; do
    [[ -f $f ]] || continue
    python3 -c 'import lzma, shutil, sys
with lzma.open(sys.argv[1]) as i, open(sys.argv[1][:-3], "wb") as o: shutil.copyfileobj(i, o)' "$f" &&
      rm -f "$f"
  done
}

run() {
  unpack_carry
  out=/tmp/gpu-check
  rm -rf "$out"
  mkdir -p "$out"
  export LD_LIBRARY_PATH=$PWD/$carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  local bin=$PWD/$carry/bin fail=0
  local steps=${STOKER_GPU_STEPS:-tests,sanitizer,loader_test,h2d,python,loader}
  step() { echo; echo "==== $* ===="; }
  want() { [[ ",$steps," == *",$1,"* ]]; }

  step "machine"
  {
    date -u
    uname -a
    nproc
    free -g | head -2
    nvidia-smi --query-gpu=name,pci.bus_id,driver_version,memory.total,clocks.sm,clocks.mem \
      --format=csv
    echo "/tmp is $(stat -f -c %T /tmp)"
    ldd "$bin/stoker" | grep -i 'not found' || echo "ldd: all libraries found"
  } 2>&1 | tee "$out/machine.txt"

  if want tests; then
    step "GPU tests"
    "$bin/gpu_test" 2>&1 | tee "$out/gpu_test.log" | grep -E '^\[ +(OK|FAILED|SKIPPED) ' | tail -25
    ((PIPESTATUS[0] == 0)) || fail=1
  fi

  if want sanitizer; then
    step "GPU tests under compute-sanitizer"
    # The copy, reuse and error paths; not the out-of-memory test (it takes
    # the device's memory, the sanitizer's too) nor the 40-epoch one (time).
    local filter='GpuLoader.Bytes*:GpuLoader.NoDevice*:GpuStager.*:GpuLoader.CudaError*'
    filter+=':GpuLoader.ConsumerHolding*'
    for tool in memcheck racecheck synccheck; do
      compute-sanitizer --tool "$tool" --error-exitcode 99 \
        "$bin/gpu_test" --gtest_filter="$filter" >"$out/sanitizer-$tool.log" 2>&1
      rc=$?
      echo "compute-sanitizer --tool $tool: exit $rc; $(grep -E 'ERROR SUMMARY|PASSED|FAILED' \
        "$out/sanitizer-$tool.log" | tr '\n' ' ')"
      ((rc == 0)) || fail=1
    done
  fi

  if want loader_test; then
    step "loader tests (host path, this machine)"
    "$bin/loader_test" --gtest_brief=1 >"$out/loader_test.log" 2>&1 && echo "loader_test: passed" ||
      { tail -20 "$out/loader_test.log"; fail=1; }
  fi

  if want h2d; then
    step "bench h2d"
    "$bin/stoker" bench h2d --json >"$out/h2d.json" 2>"$out/h2d.err" || fail=1
    "$bin/stoker" bench h2d --sizes 1M,16M,64M,256M --repeats 3 --min-gbps 10 || fail=1
  fi

  if want python; then
    step "Python: the binding built here for this python3; batches into torch via DLPack"
    python_binding || fail=1
  fi

  if want ckpt; then
    # Not in the default steps (it takes minutes): the checkpoint bench on
    # this machine's disk, one run per size so that a size cut short by the
    # time limit leaves the others. dd stands in for fio where it is missing.
    step "checkpoints: stoker.save/load vs the disk and torch.save/load"
    df -h /var/tmp | tail -1
    echo "/var/tmp is $(stat -f -c %T /var/tmp); fio: $(command -v fio || echo 'not installed')"
    if build_binding; then
      local size
      for size in ${STOKER_GPU_CKPT_SIZES:-1 8}; do
        PYTHONPATH=$py:$PWD/bench PYTHONUNBUFFERED=1 timeout "${STOKER_GPU_CKPT_TIMEOUT:-540}" \
          python3 bench/ckpt_bench.py --dir /var/tmp/ckbench --sizes "$size" \
          --repeats "${STOKER_GPU_CKPT_REPEATS:-3}" --json "$out/ckpt_bench_$size.json" 2>&1 |
          tee "$out/ckpt_bench_$size.log"
        ((PIPESTATUS[0] == 0)) || fail=1
      done
    else
      fail=1
    fi
  fi

  want loader || return "$fail"

  step "dataset: raw samples packed into shards, hot in the page cache"
  local gib=${STOKER_GPU_DATA_GIB:-8} kib=${STOKER_GPU_SAMPLE_KIB:-128}
  local data=/tmp/stoker-gpu-data src ds
  src=$data/src
  ds=$data/ds
  if [[ ! -f $ds/manifest.stoker ]]; then
    rm -rf "$data"
    python3 - "$src" "$gib" "$kib" <<'EOF'
import os, sys
from concurrent.futures import ThreadPoolExecutor
import numpy as np
src, gib, kib = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
size = kib << 10
count = int(gib * (1 << 30)) // size
def write(part):
    rng = np.random.default_rng(part)
    d = os.path.join(src, "c%02d" % part)
    os.makedirs(d, exist_ok=True)
    for i in range(part, count, 16):
        with open(os.path.join(d, "s%08d.bin" % i), "wb") as f:
            f.write(rng.bytes(size))
with ThreadPoolExecutor(16) as pool:
    list(pool.map(write, range(16)))
print(f"{count} samples of {kib} KiB in {src}")
EOF
    /usr/bin/time -f "pack: %e s" "$bin/stoker" pack --quiet "$src" "$ds" || return 1
    rm -rf "$src"
  fi
  du -sh "$ds"
  find "$ds" -type f -exec cat {} + >/dev/null  # hot: every shard in the page cache

  step "bench gpu-loader: into HBM vs host delivery"
  local threads
  threads=$(nproc)
  # engine | flags. The threads engine for whole-shard reads: io_uring is at
  # 0.86 of it for page-cache hits (run of 2026-12-03). Each read unit is
  # run in the same session, on the same data, for a same-machine A/B; the
  # row without --read-unit shows what "auto" picks.
  local t=$threads t15=$((threads * 3 / 2)) t2=$((threads * 2))
  local configs=(
    "threads|--read-unit shard --threads $t15 --batch-size 256 --reads-in-flight 64 --prefetch 16 --budget-mib 4096"
    "threads|--read-unit sample --threads $t --batch-size 256 --reads-in-flight 32 --prefetch 16 --budget-mib 4096"
    "threads|--read-unit sample --threads $t15 --batch-size 256 --reads-in-flight 32 --prefetch 16 --budget-mib 4096"
    "threads|--threads $t --batch-size 256 --reads-in-flight 32 --prefetch 16 --budget-mib 4096"
    "threads|--read-unit shard --threads $t2 --batch-size 256 --reads-in-flight 128 --prefetch 16 --budget-mib 8192"
    "threads|--read-unit sample --threads $t15 --batch-size 256 --reads-in-flight 32 --prefetch 16 --budget-mib 4096 --compute-us 2500"
  )
  local i=0 engine cfg
  for entry in "${configs[@]}"; do
    engine=${entry%%|*}
    cfg=${entry#*|}
    i=$((i + 1))
    # shellcheck disable=SC2086
    STOKER_POSIX_ENGINE=$engine "$bin/stoker" bench gpu-loader "$ds" --epochs 2 --repeats 3 \
      --json $cfg >"$out/gpu_loader_$i.json" 2>"$out/gpu_loader_$i.err" || fail=1
      python3 - "$out/gpu_loader_$i.json" "$engine" "$cfg" <<'EOF' || fail=1
import json, sys
j = json.load(open(sys.argv[1]))
h, c = j["host"], j["cuda"]
print(f"{sys.argv[2]:8} {sys.argv[3]:90}\n         [{j.get('read_unit', '?')}] host {h['gb_per_s']:6.2f} GB/s  cuda {c['gb_per_s']:6.2f} GB/s "
      f"{c['samples_per_s']:9.0f} samples/s  h2d busy {c['h2d_seconds']:.2f}s  "
      f"time cuda/host {j['cuda_vs_host_time']:.3f}  wait host {j['host_median_wait_seconds']:.2f}s "
      f"cuda {j['cuda_median_wait_seconds']:.2f}s  hidden {100 * j['h2d_hidden_share']:.1f}%")
for m in ("host", "cuda"):
    x = j[m]
    print(f"         {m}: next() {x.get('consumer_next_seconds', 0):.3f}s  wait_on "
          f"{x.get('consumer_wait_on_seconds', 0):.3f}s  release {x.get('consumer_release_seconds', 0):.3f}s")
EOF
  done
  return "$fail"
}

case "${1:-}" in
  prepare) prepare ;;
  unpack) unpack_carry ;;
  binding)
    # The binding alone, for the other GPU scripts (scripts/gpu/loader.sh).
    unpack_carry
    out=${OUT:-/tmp/gpu-check}
    mkdir -p "$out"
    build_binding
    ;;
  run)
    dest=${OUT:-$PWD/gpu-out}
    mkdir -p "$dest"
    run 2>&1 | tee "$dest/summary.txt"
    rc=${PIPESTATUS[0]}
    tar czf "$dest/gpu-check.tar.gz" -C /tmp gpu-check
    cp /tmp/gpu-check/h2d.json "$dest/" 2>/dev/null
    echo
    echo "gpu-check: $([[ $rc == 0 ]] && echo OK || echo 'SOME STEPS FAILED') (logs in $dest)" |
      tee -a "$dest/summary.txt"
    exit "$rc"
    ;;
  *)
    echo "usage: $0 prepare|run|binding|unpack" >&2
    exit 2
    ;;
esac
