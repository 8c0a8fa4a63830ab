#!/usr/bin/env bash
# Collectives on the one-GPU H200 machine (issue 18): `stoker bench comm
# --backend nccl` with world size 1, every op x dtype checked and timed; the
# same once under compute-sanitizer; torch.distributed's NCCL all_reduce in
# the same run for the busbw ratio; `tune comm` at DDP's 25 MiB; `topo`.
#
#   scripts/gpu/comm.sh prepare   on the build machine: builds build-gpu-comm/
#                                 (Release, CUDA on, MPI/RADOS/Python off,
#                                 hwloc on) and puts the binaries (stoker, and
#                                 stoker_comm_faults for the corruption step)
#                                 and the shared libraries a stock image lacks
#                                 into build-gpu-comm/carry/ (git-ignored).
#   scripts/gpu/comm.sh run       on the GPU machine, from the repository
#                                 root: prints the results; logs and JSON in
#                                 $OUT (or /tmp/gpu-comm).
#
# With the device tool of this workplace:
#   run(command="bash scripts/gpu/comm.sh run", carry=["build-gpu-comm/carry"])
# STOKER_COMM_STEPS picks steps (default "bench,corrupt,torch,tune,sanitizer":
# every GPU step issue 18 asks for); each runs under a limit of its own, cut
# to what is left of STOKER_COMM_BUDGET (default 560 s, one call of 10
# minutes), and the run ends with a summary, one line a step: PASS, FAIL or
# SKIPPED (no time left) with its figure. The bench step runs twice, 8 B -
# 64 MiB and 128 MiB - STOKER_COMM_MAX (default 1G), so that a slow large
# end cannot take the rest along; STOKER_COMM_TORCH_MAX (bytes, default
# 1 GiB) is the largest size of the comparison with torch.
#
# NCCL comes from the machine (libnccl.so.2 on the loader's path) or from
# torch's wheel (nvidia/nccl/lib), found through python3; STOKER_NCCL_LIBRARY
# overrides. NVLink multicast stays off (NCCL_NVLS_ENABLE=0): the lent hosts
# forbid it.
set -uo pipefail
cd "$(dirname "$0")/../.."
carry=build-gpu-comm/carry
export NCCL_NVLS_ENABLE=0

prepare() {
  set -e
  cmake -S . -B build-gpu-comm -DCMAKE_BUILD_TYPE=Release -DSTOKER_WITH_CUDA=ON \
    -DSTOKER_WITH_RADOS=OFF -DSTOKER_WITH_PYTHON=OFF -DSTOKER_WITH_MPI=OFF \
    -DSTOKER_BUILD_TESTS=ON >/dev/null
  cmake --build build-gpu-comm -j"$(nproc)" --target stoker stoker_comm_faults
  rm -rf "$carry"
  mkdir -p "$carry/bin" "$carry/lib"
  strip -o "$carry/bin/stoker" build-gpu-comm/stoker
  strip -o "$carry/bin/stoker_comm_faults" build-gpu-comm/tests/stoker_comm_faults
  bash scripts/gpu/copy-libs.sh "$carry/lib" "$carry/bin/stoker" "$carry/bin/stoker_comm_faults"
  ls -la "$carry"/bin "$carry"/lib
}

find_nccl() {
  [[ -n ${STOKER_NCCL_LIBRARY:-} ]] && return 0
  local lib
  lib=$(python3 - <<'PY' 2>/dev/null
import glob, os
try:
    import nvidia.nccl
    d = os.path.join(list(nvidia.nccl.__path__)[0], "lib")
except Exception:
    import torch
    d = os.path.join(os.path.dirname(torch.__file__), "lib")
hits = sorted(glob.glob(os.path.join(d, "libnccl.so*")))
print(hits[0] if hits else "")
PY
)
  if [[ -z $lib ]]; then
    lib=$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 /{print $NF; exit}')
  fi
  if [[ -n $lib ]]; then export STOKER_NCCL_LIBRARY=$lib; fi
}

# Seconds a step may take: its own limit, cut to what is left of the run's
# budget (STOKER_COMM_BUDGET, default 560 s: one device call of 10 minutes
# less start-up); 0 when under 20 s are left.
limit() {
  local left=$((deadline - $(date +%s) - 10))
  ((left < 20)) && { echo 0; return; }
  echo $(($1 < left ? $1 : left))
}

# Records a step's outcome for the summary: STEP STATUS NOTE...
note() {
  local name=$1 status=$2
  shift 2
  summary+=("$(printf '%-40s %-7s %s' "$name" "$status" "$*")")
  [[ $status == FAIL ]] && fail=1
  return 0
}

# Starts a step: NAME SECONDS HEADER. Prints the header and sets t to the
# step's limit; false, with NAME SKIPPED in the summary, when no time is left.
begin() {
  name=$1
  echo
  echo "==== $3 (at $(($(date +%s) - started)) s) ===="
  t=$(limit "$2")
  ((t > 0)) && return 0
  note "$name" SKIPPED "no time left"
  return 1
}

# Ends the step begun: PASS if OK is 0, else FAIL. OK NOTE
verdict() {
  if (($1 == 0)); then note "$name" PASS "$2"; else note "$name" FAIL "$2"; fi
}

# The bench step: every op x dtype from MIN to MAX bytes, checked; the JSON
# in $out/FILE.json. MIN MAX FILE (begin has set t).
bench_sweep() {
  timeout "$t" "${tr[@]}" --no_python "$stoker" bench comm --backend nccl --ops all --dtypes all \
    --min-bytes "$1" --max-bytes "$2" --warmup 2 --iters 10 --json >"$out/$3.json" 2>"$out/$3.err"
  rc=$?
  echo "exit $rc"
  ((rc == 0)) || tail -20 "$out/$3.err"
  line=$(python3 - "$out/$3.json" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"no JSON ({e})")
    sys.exit(1)
print("library:", r["environment"]["library_version"], "| binding:", r["bindings"][0], file=sys.stderr)
res = r["results"]
print(f"{len(res)} results, every one checked; by op x dtype, smallest | largest:", file=sys.stderr)
missing, top = [], 0
for op in ["allreduce", "allgather", "reducescatter", "broadcast", "alltoall", "sendrecv"]:
    for dt in ["float32", "bfloat16", "float16", "int32"]:
        rows = [x for x in res if x["op"] == op and x["dtype"] == dt]
        if not rows:
            missing.append(f"{op}/{dt}")
            continue
        small, big = rows[0], rows[-1]
        top = max(top, big["bytes"])
        print(f"  {op:13} {dt:8} {small['bytes']:>10} B {small['time_us']:9.2f} us | "
              f"{big['bytes']:>10} B {big['time_us']:9.1f} us algbw {big['algbw_gbps']:7.1f} GB/s",
              file=sys.stderr)
if missing:
    print(f"missing: {' '.join(missing)}")
    sys.exit(1)
print(f"{len(res)} results (24 op x dtype, {res[0]['bytes']} B - {top} B), every element checked, 0 wrong")
PY
  ) && ((rc == 0))
  verdict $? "exit $rc; $line"
}

run() {
  local out=${OUT:-/tmp/gpu-comm} budget=${STOKER_COMM_BUDGET:-560}
  fail=0
  summary=()
  started=$(date +%s)
  deadline=$((started + budget))
  mkdir -p "$out"
  export LD_LIBRARY_PATH=$PWD/$carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  local stoker=$PWD/$carry/bin/stoker
  # `stoker bench comm` with a fault injected (tests/comm/comm_faults.cc).
  local faults=$PWD/$carry/bin/stoker_comm_faults
  local tr=(torchrun --standalone --nproc_per_node=1)
  local max=${STOKER_COMM_MAX:-1G} rc line
  local steps=${STOKER_COMM_STEPS:-bench,corrupt,torch,tune,sanitizer}
  want() { [[ ",$steps," == *",$1,"* ]]; }

  begin machine 30 "machine"
  {
    date -u
    nproc
    nvidia-smi --query-gpu=name,pci.bus_id,driver_version,memory.total --format=csv
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())'
    ldd "$stoker" | grep -i 'not found' || echo "ldd: all libraries found"
  } 2>&1 | tee "$out/machine.txt"
  if [[ ! -x $stoker ]]; then
    echo "comm.sh: no $stoker: run 'scripts/gpu/comm.sh prepare' on the build machine (or" \
      "scripts/gpu/run.sh comm, which copies .gpu-carry) and carry $carry"
    return 1
  fi
  find_nccl
  echo "NCCL library: ${STOKER_NCCL_LIBRARY:-libnccl.so.2 on the library path}"

  begin "outside a launcher: InvalidArgument" 30 "outside a launcher: the error that says how to launch"
  "$stoker" bench comm --backend nccl --max-bytes 1K
  rc=$?
  echo "exit $rc (want 11)"
  ((rc == 11))
  verdict $? "exit $rc"

  begin topo 30 "topo"
  "$stoker" topo | tee "$out/topo.txt"
  "$stoker" topo --json >"$out/topo.json" || fail=1

  # Two runs, so that a slow 1 GiB end cannot take the rest's results along.
  if want bench && begin "bench: every op x dtype, 8 B - 64 MiB" 80 \
    "bench comm --backend nccl: every op x dtype, 8 B - 64 MiB, checked (world size 1)"; then
    bench_sweep 8 64M bench_all
  fi
  if want bench && begin "bench: every op x dtype, 128 MiB - $max" 150 \
    "bench comm --backend nccl: every op x dtype, 128 MiB - $max, checked (world size 1)"; then
    bench_sweep 128M "$max" bench_large
  fi

  if want corrupt && begin "corruption hook on the GPU" 40 \
    "the corruption hook is caught on the GPU path"; then
    timeout "$t" "${tr[@]}" --no_python "$faults" --corrupt 0 bench comm \
      --backend nccl --ops allreduce,reducescatter --dtypes float16 --max-bytes 1M \
      >"$out/corrupt.log" 2>&1
    rc=$?
    line=$(grep -m1 -o "rank 0: [a-z]* float16 [0-9]* B: element [0-9]* of [0-9]*: got 0.*" "$out/corrupt.log")
    echo "exit $rc: ${line:-no corruption reported}"
    [[ -n $line ]] || tail -10 "$out/corrupt.log"
    [[ -n $line ]] && ((rc != 0))
    verdict $? "exit $rc, ${line:-not named}"
  fi

  if want torch && begin "vs torch.distributed nccl" 150 \
    "stoker nccl allreduce vs torch.distributed nccl all_reduce (same run, interleaved)"; then
    timeout "$t" python3 bench/comm_bench.py --backend nccl --np 1 --stoker "$stoker" \
      --min 1048576 --max "${STOKER_COMM_TORCH_MAX:-1073741824}" --step 4 \
      --repeats "${STOKER_COMM_REPEATS:-3}" --iters 20 --warmup 5 \
      --torchrun "torchrun --standalone" --json "$out/vs_torch.json" 2>"$out/vs_torch.err"
    rc=$?
    ((rc == 0)) || tail -20 "$out/vs_torch.err"
    line=$(python3 - "$out/vs_torch.json" <<'PY'
import json, sys
try:
    t = json.load(open(sys.argv[1]))["table"][-1]
except Exception as e:
    print(f"no JSON ({e})")
    sys.exit(1)
r = ", ".join(f"stoker/{k} {v:.3f}" for k, v in t["ratio"].items())
print(f"at {t['bytes']} B ({t['metric'][:5]}, one GPU): {r} (target >= 0.98)")
PY
    ) && ((rc == 0))
    verdict $? "exit $rc; $line"
  fi

  if want tune && begin "tune comm, nccl, 25 MiB" 150 \
    "tune comm at 25 MiB (Ring and Tree, Simple/LL/LL128; NVLS off)"; then
    # 5 settings x 3 runs, a torchrun job each. With one GPU NCCL has no
    # ring or tree to choose; the step shows the tool's path on the GPU.
    timeout "$t" "$stoker" tune comm --backend nccl \
      --launcher "torchrun --standalone --nproc_per_node=1 --no_python" --bucket-mib 25 \
      --iters 10 --timeout 60 \
      --only "${STOKER_COMM_TUNE_ONLY:-Ring/Simple,Ring/LL,Ring/LL128,Tree/Simple}" \
      --write "$out/nccl.env" >"$out/tune.txt" 2>&1
    rc=$?
    cat "$out/tune.txt"
    [[ -f $out/nccl.env ]] && cat "$out/nccl.env"
    line=$(grep -m1 -E "recommended:|nothing beats the default" "$out/tune.txt")
    ((rc == 0)) && [[ -n $line && -f $out/nccl.env ]]
    verdict $? "exit $rc; $line"
  fi

  local sdt=${STOKER_COMM_SANITIZER_DTYPES:-float16,int32}
  if want sanitizer && begin "compute-sanitizer, $sdt" 90 \
    "compute-sanitizer (memcheck) over every op, $sdt, to 1 MiB"; then
    # float32 and bfloat16 ran clean to 4 MiB on 2026-12-04 (docs/benchmarks.md).
    # API errors are not reported: NCCL's own init probes kernels the driver has
    # no image for (cudaFuncGetAttributes -> cudaErrorNoKernelImageForDevice,
    # 8 of them, all inside ncclInitKernelsForDevice, handled by NCCL); memcheck
    # still checks every memory access of the collectives' kernels.
    RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29611 \
      timeout "$t" compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 99 \
      "$stoker" bench comm --backend nccl --ops all --dtypes "$sdt" --max-bytes 1M --iters 2 \
      --warmup 1 >"$out/sanitizer.log" 2>&1
    rc=$?
    line=$(grep -E 'ERROR SUMMARY' "$out/sanitizer.log" | tail -1)
    echo "compute-sanitizer: exit $rc; $line"
    ((rc == 0)) || tail -15 "$out/sanitizer.log"
    ((rc == 0))
    verdict $? "exit $rc; $line"
  fi

  echo
  echo "==== comm.sh summary (steps: $steps; logs and JSON in $out) ===="
  printf '%s\n' "${summary[@]}"
  echo "comm.sh: $([[ $fail == 0 ]] && echo ALL PASSED || echo SOME FAILED)"
  return "$fail"
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  *) echo "usage: $0 prepare|run" >&2; exit 2 ;;
esac
