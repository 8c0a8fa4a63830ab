#!/usr/bin/env bash
# Collectives on the one-GPU H200 machine (issue 18): `stoker bench comm
# --backend nccl` with world size 1, every op x dtype checked and timed; the
# same once under compute-sanitizer; torch.distributed's NCCL all_reduce in
# the same run for the busbw ratio; `tune comm` at DDP's 25 MiB; `topo`.
#
#   scripts/gpu/comm.sh prepare   on the build machine: builds build-gpu-comm/
#                                 (Release, CUDA on, MPI/RADOS/Python off,
#                                 hwloc on) and puts the binary and the
#                                 shared libraries a stock image lacks into
#                                 build-gpu-comm/carry/ (git-ignored).
#   scripts/gpu/comm.sh run       on the GPU machine, from the repository
#                                 root: prints the results; logs and JSON in
#                                 $OUT (or /tmp/gpu-comm).
#
# With the device tool of this workplace:
#   run(command="bash scripts/gpu/comm.sh run", carry=["build-gpu-comm/carry"])
# STOKER_COMM_STEPS picks steps (default "bench,sanitizer,torch,tune"), e.g.
# two calls of under 10 minutes each: "bench,sanitizer,torch" then "tune".
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
    -DSTOKER_BUILD_TESTS=OFF >/dev/null
  cmake --build build-gpu-comm -j"$(nproc)" --target stoker
  rm -rf "$carry"
  mkdir -p "$carry/bin" "$carry/lib"
  strip -o "$carry/bin/stoker" build-gpu-comm/stoker
  ldd "$carry/bin/stoker" | awk '/=> \// {print $3}' | sort -u |
    grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux|libdl|librt|libpthread)\.so' |
    while read -r lib; do cp -L "$lib" "$carry/lib/"; done
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

run() {
  local out=${OUT:-/tmp/gpu-comm} fail=0
  mkdir -p "$out"
  export LD_LIBRARY_PATH=$PWD/$carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  local stoker=$PWD/$carry/bin/stoker
  local tr=(torchrun --standalone --nproc-per-node=1)
  step() { echo; echo "==== $* ===="; }
  local steps=${STOKER_COMM_STEPS:-bench,sanitizer,torch,tune}
  want() { [[ ",$steps," == *",$1,"* ]]; }

  step "machine"
  {
    date -u
    nproc
    nvidia-smi --query-gpu=name,pci.bus_id,driver_version,memory.total --format=csv
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())'
    ldd "$stoker" | grep -i 'not found' || echo "ldd: all libraries found"
  } 2>&1 | tee "$out/machine.txt"
  find_nccl
  echo "NCCL library: ${STOKER_NCCL_LIBRARY:-libnccl.so.2 on the library path}"

  step "outside a launcher: the error that says how to launch"
  "$stoker" bench comm --backend nccl --max-bytes 1K; echo "exit $? (want 11)"

  step "topo"
  "$stoker" topo | tee "$out/topo.txt"
  "$stoker" topo --json >"$out/topo.json" || fail=1

  if want bench; then
  step "bench comm --backend nccl: every op x dtype, 8 B - 1 GiB, checked (world size 1)"
  timeout 540 "${tr[@]}" --no-python "$stoker" bench comm --backend nccl --dtypes all \
    --max-bytes "${STOKER_COMM_MAX:-1G}" --json >"$out/bench_all.json" 2>"$out/bench_all.err"
  rc=$?
  echo "exit $rc"
  ((rc == 0)) || { tail -20 "$out/bench_all.err"; fail=1; }
  python3 - "$out/bench_all.json" <<'PY' || fail=1
import json, sys
r = json.load(open(sys.argv[1]))
print("library:", r["environment"]["library_version"], "| binding:", r["bindings"][0])
res = r["results"]
print(f"{len(res)} results, every one checked; by op x dtype at 1 GiB (or the largest):")
for op in ["allreduce", "allgather", "reducescatter", "broadcast", "alltoall", "sendrecv"]:
    for dt in ["float32", "bfloat16", "float16", "int32"]:
        rows = [x for x in res if x["op"] == op and x["dtype"] == dt]
        if not rows:
            print(f"  {op} {dt}: MISSING"); sys.exit(1)
        small, big = rows[0], rows[-1]
        print(f"  {op:13} {dt:8} {small['bytes']:>10} B {small['time_us']:9.2f} us | "
              f"{big['bytes']:>10} B {big['time_us']:9.1f} us algbw {big['algbw_gbps']:7.1f} GB/s")
PY

  step "the corruption hook is caught on the GPU path"
  STOKER_COMM_TEST_CORRUPT=0 timeout 120 "${tr[@]}" --no-python "$stoker" bench comm \
    --backend nccl --ops allreduce --max-bytes 1M 2>&1 | grep -m1 "Corruption" || fail=1

  fi

  if want sanitizer; then
  step "compute-sanitizer (memcheck) over every op, float32 and bfloat16, to 4 MiB"
  # API errors are not reported: NCCL's own init probes kernels the driver has
  # no image for (cudaFuncGetAttributes -> cudaErrorNoKernelImageForDevice,
  # 8 of them, all inside ncclInitKernelsForDevice, handled by NCCL); memcheck
  # still checks every memory access of the collectives' kernels.
  RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29611 \
    timeout 540 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 99 "$stoker" bench comm \
    --backend nccl --dtypes float32,bfloat16 --max-bytes 4M --iters 2 --warmup 1 \
    >"$out/sanitizer.log" 2>&1
  rc=$?
  echo "compute-sanitizer: exit $rc; $(grep -E 'ERROR SUMMARY' "$out/sanitizer.log" | tail -1)"
  ((rc == 0)) || { tail -15 "$out/sanitizer.log"; fail=1; }

  fi

  if want torch; then
  step "stoker nccl allreduce vs torch.distributed nccl all_reduce (same run, 5 rounds)"
  timeout 540 python3 bench/comm_bench.py --backend nccl --np 1 --stoker "$stoker" \
    --min 1048576 --max "${STOKER_COMM_TORCH_MAX:-1073741824}" --step 4 --repeats "${STOKER_COMM_REPEATS:-5}" \
    --torchrun "torchrun --standalone" --json "$out/vs_torch.json" 2>"$out/vs_torch.err" ||
    { tail -20 "$out/vs_torch.err"; fail=1; }

  fi

  if want tune; then
  step "tune comm at 25 MiB (Ring/Tree x Simple/LL/LL128; NVLS off)"
  timeout 540 "$stoker" tune comm --backend nccl --launcher "torchrun --standalone --nproc-per-node=1 --no-python" \
    --bucket-mib 25 --only Ring/Simple,Ring/LL,Ring/LL128,Tree/Simple,Tree/LL,Tree/LL128 \
    --write "$out/nccl.env" 2>&1 | tee "$out/tune.txt" || fail=1
  cat "$out/nccl.env"
  fi

  echo
  echo "comm.sh: $([[ $fail == 0 ]] && echo ALL PASSED || echo SOME FAILED)"
  return "$fail"
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  *) echo "usage: $0 prepare|run" >&2; exit 2 ;;
esac
