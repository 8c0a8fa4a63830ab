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
#        cache, default options (target: >= 40 GB/s into HBM), then
#        --read-unit map (checked in the page cache, copied once with
#        streaming stores: a crossing of host memory fewer per byte), each
#        also at half and three quarters of the cores as workers
#     4b. (dma) bench/pagecache_dma.cc on the files of step 4's data set:
#        the DMA reading records straight from the registered page cache
#        against models of read_unit sample (pread into pinned, checksum,
#        one copy a batch) and map (checksum in the mapping, streaming copy
#        into pinned, one copy a batch), and what registering costs; nproc
#        and nproc/2 threads. Then bench/copy_paths.cc on one shard: do the
#        kernel's copy and memcpy read each line in before writing it on
#        this CPU (streaming stores do not)?
#     4c. (units) stoker bench loader, host delivery, --read-unit shard,
#        sample, map and map with each shard mapped anew at every use
#        (--keep-mapped-mib 1) taking turns over 3 rounds, on 50,000 raw
#        records of 4-12 KiB and on step 4's 128 KiB set, with page faults
#        and the kernel's share of the CPU (JSON: units-*.json)
#     5. (membw) scripts/gpu/membw.py: host memory copies with and without
#        an H2D copy running beside them (does the DMA take the workers'
#        memory bandwidth?)
#     6. (reads) the 128 KiB set, host delivery, --reads-in-flight 8, 16,
#        32, 64 against the automatic default
#     7. (profile) a CPU profile (perf record -e cpu-clock, flat, by
#        symbol) of `bench loader` at 16 threads: decode, raw 4-12 KiB and
#        raw 128 KiB. perf is not on the image: carried in .gpu-carry-perf/
#        (perf, its libraries, and stoker with its symbols), made by
#        `scripts/gpu/loader.sh perf-carry` here.
#
# Environment: STOKER_UNITS_SMALL (step 4c's small records, default 50000),
# STOKER_SCALING_ARGS (extra bench/scaling.py flags, e.g.
# "--images 2000 --repeats 2 --modes raw,decode"), STOKER_LOADER_STEPS
# (default "scaling,bench,gpu,dma"), STOKER_GPU_DATA_GIB (default 4),
# STOKER_GPU_LOADER_FLAGS (step 4's runs, ';'-separated flag sets; an empty
# set is the defaults).
#
# With the device tool: run(command="bash scripts/gpu/loader.sh run",
# carry=[".gpu-carry"]).
set -uo pipefail
cd "$(dirname "$0")/../.."
carry=.gpu-carry

if [[ ${1:-} == prepare ]]; then
  exec bash scripts/gpu-check.sh prepare
fi
if [[ ${1:-} == perf-carry ]]; then
  set -e
  pc=.gpu-carry-perf
  ex=$(git rev-parse --git-path info/exclude); grep -qx "/$pc/" "$ex" || echo "/$pc/" >>"$ex"
  rm -rf "$pc" && mkdir -p "$pc/lib"
  cp "$(readlink -f "$(command -v perf)")" "$pc/perf"
  bash scripts/gpu/copy-libs.sh "$pc/lib" "$pc/perf"
  cp build-gpu/stoker "$pc/stoker"  # unstripped: perf names its functions
  du -sh "$pc"
  exit 0
fi
[[ ${1:-} == run ]] || { echo "usage: $0 prepare|run" >&2; exit 2; }

out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/$carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
bin=$PWD/$carry/bin
steps=${STOKER_LOADER_STEPS:-scaling,bench,gpu,dma}
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

# The binding, as scripts/gpu-check.sh builds it (python/*.cc for this
# python3, linked to the carried static modules), into /tmp/stoker-py.
py=/tmp/stoker-py
if [[ ! -f $py/stoker/built ]]; then
  step "Python binding"
  OUT=$out bash scripts/gpu-check.sh binding || exit 1
fi

data=/tmp/stoker-scaling
# Step 4's raw 128 KiB data set, which the dma, reads and profile steps reuse.
gib=${STOKER_GPU_DATA_GIB:-4}
big=/tmp/stoker-gpu-data-$gib
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
  ds=$big/ds
  if [[ ! -f $ds/manifest.stoker ]]; then
    src=$big/src
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
  # Fewer workers than cores too: 16 copying threads leave the DMA 38.9 of
  # its 54.6 GB/s on the H200 VM, 8 leave it 51.2 (docs/benchmarks.md, "Into
  # HBM"), so the best worker count into HBM may be below the core count.
  # Each count with per-sample reads (auto) and mapped reads, side by side.
  n=$(nproc)
  IFS=';' read -r -a sweep <<<"${STOKER_GPU_LOADER_FLAGS:-;--read-unit map;--threads $((n / 2));--threads $((n / 2)) --read-unit map;--threads $((n * 3 / 4));--threads $((n * 3 / 4)) --read-unit map}"
  for flags in "${sweep[@]}"; do
    echo "-- flags: ${flags:-(defaults)}"
    # shellcheck disable=SC2086
    "$bin/stoker" bench gpu-loader "$ds" --epochs 2 --repeats 3 $flags 2>&1 |
      tee -a "$out/gpu_loader.txt" | tail -12
    ((PIPESTATUS[0] == 0)) || fail=1
  done
fi
if want units; then
  # Read units at host delivery on this machine's cores, 3 rounds taking
  # turns: does "map" keep its 2-core lead (1.80x "sample" at 128 KiB, 1.43x
  # at 4-12 KiB, mappings kept across epochs) with 16 workers faulting pages
  # in? And do small records read faster per sample than in whole shards?
  small=/tmp/stoker-units-small
  if [[ ! -f $small/ds/manifest.stoker ]]; then
    python3 - "$small/src" "${STOKER_UNITS_SMALL:-50000}" <<'PY'
import os, sys
from concurrent.futures import ThreadPoolExecutor
import numpy as np
src, count = sys.argv[1], int(sys.argv[2])
def write(part):
    rng = np.random.default_rng(100 + part)
    d = os.path.join(src, "c%02d" % part)
    os.makedirs(d, exist_ok=True)
    for i in range(part, count, 16):
        with open(os.path.join(d, "s%08d.bin" % i), "wb") as f:
            f.write(rng.bytes(int(rng.integers(4096, 12289))))
with ThreadPoolExecutor(16) as pool:
    list(pool.map(write, range(16)))
PY
    "$bin/stoker" pack --quiet "$small/src" "$small/ds" && rm -rf "$small/src"
  fi
  for ds in "$small/ds" "$big/ds"; do
    if [[ ! -f $ds/manifest.stoker ]]; then
      echo "units: no data set at $ds (step gpu makes the 128 KiB one)"
      fail=1
      continue
    fi
    name=$(basename "$(dirname "$ds")")
    for r in 1 2 3; do
      # "mapeach": map, each shard mapped anew at every use (what kept
      # mappings save at 16 workers).
      for u in shard sample map mapeach; do
        unit_flags=(--read-unit "$u")
        [[ $u == mapeach ]] && unit_flags=(--read-unit map --keep-mapped-mib 1)
        "$bin/stoker" bench loader "$ds" --epochs 3 "${unit_flags[@]}" --json \
          >"$out/units-$name-$u-$r.json" || fail=1
      done
    done
  done
  step "read units, host delivery (median of epochs 2-3 per run, median of 3 runs)"
  python3 - "$out" <<'PY' | tee "$out/units.txt"
import glob, json, os, statistics as st, sys
runs = {}
for f in sorted(glob.glob(os.path.join(sys.argv[1], "units-*.json"))):
    name, unit, _ = os.path.basename(f)[len("units-"):-len(".json")].rsplit("-", 2)
    try:
        d = json.load(open(f))
    except ValueError:
        continue
    runs.setdefault((name, unit), []).append(
        (st.median(d["epoch_samples_per_s"][1:]), d["cpu_seconds_per_gb"],
         d.get("kernel_cpu_seconds", 0) / max(d["cpu_seconds"], 1e-9), d.get("page_faults", 0)))
for (name, unit), v in sorted(runs.items()):
    print(f"{name:28} {unit:7} samples/s {st.median(x[0] for x in v):>12,.0f}  "
          f"CPU s/GB (all 3 epochs) {st.median(x[1] for x in v):.3f}  "
          f"kernel {st.median(x[2] for x in v):.0%}  "
          f"page faults {st.median(x[3] for x in v):,.0f}  ({len(v)} runs)")
PY
fi

if want membw; then
  step "host memory copies beside an H2D copy (scripts/gpu/membw.py)"
  python3 scripts/gpu/membw.py --json "$out/membw.json" 2>&1 | tee "$out/membw.txt"
fi

if want dma; then
  ds=$big/ds
  if [[ -f $ds/manifest.stoker && -x $bin/pagecache_dma_probe ]]; then
    echo "kernel $(uname -r)" | tee -a "$out/dma.txt"
    for t in "$(nproc)" "$(($(nproc) / 2))"; do
      step "DMA from the registered page cache against the loader's copy path, $t threads"
      "$bin/pagecache_dma_probe" "$ds" --threads "$t" 2>&1 | tee -a "$out/dma.txt"
      ((PIPESTATUS[0] == 0)) || fail=1
    done
    # The same files on tmpfs, whose pages the kernel lets a driver pin for
    # writing where a disk file system's page cache may be refused.
    shm=/dev/shm/stoker-dma
    rm -rf "$shm" && mkdir -p "$shm" && cp -r "$ds"/. "$shm"/
    step "the same from tmpfs (/dev/shm), $(nproc) threads"
    "$bin/pagecache_dma_probe" "$shm" --threads "$(nproc)" 2>&1 | tee -a "$out/dma.txt"
    ((PIPESTATUS[0] == 0)) || fail=1
    rm -rf "$shm"
    step "stores into memory not in cache, and the record paths, one thread"
    "$bin/copy_paths_probe" "$ds" --max-mib 512 2>&1 | tee -a "$out/dma.txt"
    ((PIPESTATUS[0] == 0)) || fail=1
  else
    echo "dma: needs the gpu step's data set and $bin/pagecache_dma_probe (scripts/gpu-check.sh prepare)"
    fail=1
  fi
fi

if want reads; then
  ds=$big/ds
  if [[ -f $ds/manifest.stoker ]]; then
    step "reads in flight: raw 128 KiB, host delivery"
    for r in 0 8 16 32 64 0; do
      printf 'reads_in_flight %-3s ' "$r"
      "$bin/stoker" bench loader "$ds" --epochs 2 --reads-in-flight "$r" --json 2>&1 |
        python3 -c 'import json, sys; j = json.load(sys.stdin)
print("%.2f GB/s, epochs %s samples/s" % (j["mb_per_s"] / 1e3, [round(x) for x in j["epoch_samples_per_s"]]))' 2>&1 |
        tee -a "$out/reads.txt"
    done
  fi
fi

if want profile; then
  pc=$PWD/.gpu-carry-perf
  if [[ -x $pc/perf ]]; then
    perf() { LD_LIBRARY_PATH=$pc/lib:$LD_LIBRARY_PATH "$pc/perf" "$@"; }
    for what in jpg raw raw128; do
      case $what in
        jpg) ds=$data/jpg-ds flags=(--decode --epochs 3 --batch-size 64) ;;
        raw) ds=$data/raw-ds flags=(--epochs 3 --batch-size 64) ;;
        raw128) ds=$big/ds flags=(--epochs 2) ;;
      esac
      [[ -f $ds/manifest.stoker ]] || continue
      step "CPU profile: bench loader $what, --threads $(nproc)"
      perf record -e cpu-clock -F 999 -o "$out/$what.perf" -- "$pc/stoker" bench loader "$ds" \
        --threads "$(nproc)" "${flags[@]}" 2>&1 | tail -6
      perf report -i "$out/$what.perf" --stdio --sort sym --percent-limit 0.7 2>/dev/null |
        grep -v '^#' | grep -v '^$' | head -40 | tee "$out/profile_$what.txt"
      perf report -i "$out/$what.perf" --stdio --sort dso --percent-limit 1 2>/dev/null |
        grep -v '^#' | grep -v '^$' | head -8 | tee -a "$out/profile_$what.txt"
      rm -f "$out/$what.perf"
    done
  else
    echo "profile: no .gpu-carry-perf (scripts/gpu/loader.sh perf-carry here)"
  fi
fi
exit "$fail"
