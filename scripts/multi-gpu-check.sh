#!/usr/bin/env bash
# Issue 22: one host with several GPUs, one rank per GPU, in one run:
#   1. stoker bench comm --backend nccl over all GPUs (torchrun), every op,
#      8 B - 1 GiB, checked; allreduce busbw against torch.distributed NCCL
#      (bench/comm_bench.py, same run) and the published 8xH200 anchor
#      (>= 431 GB/s busbw at large sizes, Azure's node health checks);
#   2. stoker tune comm at DDP's 25 MiB and over a sweep; the environment
#      file it writes, and a run with it against the default (3 each);
#   3. stoker topo --check under the launcher, unbound and bound as
#      `stoker topo` advises (numactl per local rank);
#   4. the loader, one rank per GPU (device cuda:LOCAL_RANK), raw 128 KiB
#      samples hot in the page cache: per-GPU GB/s and the node's total
#      against one rank alone;
#   5. a checkpoint saved by every rank at once (a few GiB each): aggregate
#      GB/s against N parallel dd writers on the same disk.
#
#   scripts/multi-gpu-check.sh prepare   build machine: scripts/gpu/comm.sh
#                                        prepare and scripts/gpu-check.sh
#                                        prepare (the carried binaries and
#                                        static modules for the binding)
#   scripts/multi-gpu-check.sh run       GPU host, from the repo root
#
# With the device tool: run(kind="nvidia-h200-x8", command="bash
# scripts/multi-gpu-check.sh run", carry=["build-gpu-comm/carry", ".gpu-carry"])
#
# Steps: STOKER_MGPU_STEPS (default "comm,tune,topo,loader,ckpt"). NVLink
# multicast stays off (NCCL_NVLS_ENABLE=0): the lent hosts forbid it, so NVLS
# is not among the settings tuned.
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0

prepare() {
  set -e
  bash scripts/gpu/comm.sh prepare
  bash scripts/gpu-check.sh prepare
}

run() {
  local out=${OUT:-/tmp/multi-gpu} fail=0
  mkdir -p "$out"
  export LD_LIBRARY_PATH=$PWD/build-gpu-comm/carry/lib:$PWD/.gpu-carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  local stoker=$PWD/build-gpu-comm/carry/bin/stoker
  local n
  n=$(nvidia-smi -L | wc -l)
  local tr=(torchrun --standalone "--nproc-per-node=$n")
  local steps=${STOKER_MGPU_STEPS:-comm,tune,topo,loader,ckpt}
  want() { [[ ",$steps," == *",$1,"* ]]; }
  step() { echo; echo "==== $* ===="; }
  # NCCL from the machine or torch's wheel (as scripts/gpu/comm.sh).
  source <(sed -n '/^find_nccl()/,/^}/p' scripts/gpu/comm.sh)
  find_nccl

  step "machine: $n GPUs"
  {
    date -u
    nproc
    nvidia-smi --query-gpu=index,name,pci.bus_id,memory.total --format=csv
    nvidia-smi topo -m
    python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'
    echo "NCCL library: ${STOKER_NCCL_LIBRARY:-loader path}"
  } 2>&1 | tee "$out/machine.txt"

  if want comm; then
    step "bench comm --backend nccl: every op, 8 B - 1 GiB, float32 and bfloat16, checked"
    timeout 580 "${tr[@]}" --no-python "$stoker" bench comm --backend nccl \
      --dtypes float32,bfloat16 --max-bytes 1G --json >"$out/bench_comm.json" 2>"$out/bench_comm.err" ||
      { tail -20 "$out/bench_comm.err"; fail=1; }
    python3 - "$out/bench_comm.json" <<'PY' || fail=1
import json, sys
r = json.load(open(sys.argv[1]))
print(r["environment"]["library_version"], "|", r["world_size"], "ranks")
for b in r["bindings"]:
    print(f"  rank {b['rank']}: gpu {b['gpu']} cpus {b['cpus']} numa {b['numa']} nic {b['nic']}")
big = [x for x in r["results"] if x["dtype"] == "float32" and x["bytes"] >= 256 << 20]
for x in big:
    print(f"  {x['op']:13} {x['bytes'] >> 20:5} MiB busbw {x['busbw_gbps']:7.1f} GB/s")
ar = max(x["busbw_gbps"] for x in big if x["op"] == "allreduce")
print(f"allreduce busbw at >= 256 MiB: {ar:.1f} GB/s; anchor 431 GB/s (8xH200): "
      f"{ar / 431:.2f}x")
PY
    step "allreduce: stoker vs torch.distributed nccl, same run, 5 rounds"
    timeout 580 python3 bench/comm_bench.py --backend nccl --np "$n" --stoker "$stoker" \
      --min 1048576 --max 1073741824 --step 4 --repeats 5 --json "$out/vs_torch.json" \
      2>"$out/vs_torch.err" || { tail -20 "$out/vs_torch.err"; fail=1; }
  fi

  if want tune; then
    step "tune comm: 25 MiB bucket (Ring/Tree x Simple/LL/LL128)"
    local only=Ring/Simple,Ring/LL,Ring/LL128,Tree/Simple,Tree/LL,Tree/LL128
    local launcher="torchrun --standalone --nproc-per-node=$n --no-python"
    timeout 580 "$stoker" tune comm --backend nccl --launcher "$launcher" --bucket-mib 25 \
      --only "$only" --write "$out/nccl.env" 2>&1 | tee "$out/tune_25m.txt" || fail=1
    cat "$out/nccl.env"
    step "tune comm: sweep 1 MiB - 1 GiB"
    timeout 580 "$stoker" tune comm --backend nccl --launcher "$launcher" --min 1048576 \
      --max 1073741824 --step 8 --only "$only" --write "$out/nccl_sweep.env" 2>&1 |
      tee "$out/tune_sweep.txt" || fail=1
    step "a run with nccl.env against the default (25 MiB allreduce, 3 each, interleaved)"
    for i in 1 2 3; do
      for mode in default tuned; do
        (
          unset NCCL_ALGO NCCL_PROTO
          # shellcheck disable=SC1091
          [[ $mode == tuned ]] && source "$out/nccl.env"
          "${tr[@]}" --no-python "$stoker" bench comm --backend nccl --ops allreduce \
            --min-bytes 25M --max-bytes 25M --json | python3 -c "import json,sys; \
print('$mode', json.load(sys.stdin)['results'][0]['busbw_gbps'])"
        )
      done
    done | tee "$out/tuned_vs_default.txt"
  fi

  if want topo; then
    step "topo and topo --check (unbound, then bound as advised)"
    "$stoker" topo --ranks "$n" | tee "$out/topo.txt"
    "${tr[@]}" --no-python "$stoker" topo --check | tee "$out/topo_check_unbound.txt"
    "$stoker" topo --ranks "$n" --json >"$out/topo.json"
    cat >"$out/bind.sh" <<'SH'
#!/usr/bin/env bash
# numactl as `stoker topo` advises for this local rank, then the command.
line=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['advice']['numactl'][int(sys.argv[2])])" "$TOPO_JSON" "$LOCAL_RANK")
exec $line "$@"
SH
    chmod +x "$out/bind.sh"
    if command -v numactl >/dev/null; then
      TOPO_JSON=$out/topo.json "${tr[@]}" --no-python "$out/bind.sh" "$stoker" topo --check |
        tee "$out/topo_check_bound.txt" || fail=1
    else
      echo "numactl: not installed; the bound check skipped"
    fi
  fi

  if want loader; then
    step "loader, one rank per GPU, raw 128 KiB samples hot in the page cache"
    # The dataset and the binding as scripts/gpu-check.sh makes them.
    if STOKER_GPU_STEPS=python bash scripts/gpu-check.sh run >"$out/binding.log" 2>&1 &&
      [[ -d /tmp/stoker-py/stoker ]]; then
      local ds=/tmp/stoker-gpu-data/ds
      if [[ ! -f $ds/manifest.stoker ]]; then
        STOKER_GPU_STEPS=loader STOKER_GPU_DATA_GIB=${STOKER_GPU_DATA_GIB:-16} \
          bash scripts/gpu-check.sh run >"$out/dataset.log" 2>&1
      fi
      cat >"$out/loader_rank.py" <<'PY'
import json, os, sys, time
import torch, stoker
rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
loader = stoker.Loader(sys.argv[1], batch_size=256, device=f"cuda:{local}", shuffle=True)
n = 0; start = time.perf_counter()
for batch in loader:
    for v in batch.values():
        if hasattr(v, "nbytes"): n += v.nbytes
torch.cuda.synchronize(local)
dt = time.perf_counter() - start
print(json.dumps({"rank": rank, "bytes": n, "seconds": dt, "gbps": n / dt / 1e9}))
PY
      PYTHONPATH=/tmp/stoker-py python3 "$out/loader_rank.py" "$ds" RANK=0 2>&1 |
        tail -1 | tee "$out/loader_one.json"
      PYTHONPATH=/tmp/stoker-py timeout 580 "${tr[@]}" "$out/loader_rank.py" "$ds" 2>&1 |
        grep '^{' | tee "$out/loader_all.json"
      python3 - "$out/loader_one.json" "$out/loader_all.json" "$n" <<'PY' || fail=1
import json, sys
one = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])["gbps"]
alls = [json.loads(l) for l in open(sys.argv[2]) if l.startswith("{")]
total = sum(r["gbps"] for r in alls)
n = int(sys.argv[3])
print(f"one rank {one:.1f} GB/s; {len(alls)} ranks total {total:.1f} GB/s = "
      f"{total / (n * one):.2f} x ranks x one rank's (target >= 0.9)")
PY
    else
      echo "loader: the binding did not build here (see $out/binding.log)"
      fail=1
    fi
  fi

  if want ckpt; then
    step "checkpoint saved by every rank at once vs $n parallel dd"
    local dir=/var/tmp/stoker-mgpu-ckpt gib=${STOKER_MGPU_CKPT_GIB:-4}
    rm -rf "$dir"
    mkdir -p "$dir"
    df -h "$dir" | tail -1
    cat >"$out/ckpt_rank.py" <<'PY'
import json, os, sys, time
import torch, stoker
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
gib = float(sys.argv[2])
state = {f"w{i}": torch.full((int(gib * (1 << 30)) // 4 // 8,), float(rank)) for i in range(8)}
torch.distributed.init_process_group("gloo")
torch.distributed.barrier()
start = time.perf_counter()
stoker.save(state, sys.argv[1], step=1)
torch.distributed.barrier()
dt = time.perf_counter() - start
if rank == 0:
    print(json.dumps({"ranks": world, "bytes": int(world * gib * (1 << 30)), "seconds": dt,
                      "gbps": world * gib * (1 << 30) / dt / 1e9}))
PY
    sync
    PYTHONPATH=/tmp/stoker-py timeout 580 "${tr[@]}" "$out/ckpt_rank.py" "$dir/ck" "$gib" 2>&1 |
      grep '^{' | tee "$out/ckpt.json" || fail=1
    rm -rf "$dir/ck"
    sync
    local start end
    start=$(date +%s.%N)
    for i in $(seq "$n"); do
      dd if=/dev/zero of="$dir/dd$i" bs=16M count=$((gib * 64)) conv=fsync status=none &
    done
    wait
    end=$(date +%s.%N)
    python3 -c "print(f'dd x $n: {$n * $gib * 2**30 / ($end - $start) / 1e9:.2f} GB/s')" |
      tee "$out/dd.txt"
    rm -rf "$dir"
  fi

  echo
  echo "multi-gpu-check.sh: $([[ $fail == 0 ]] && echo ALL PASSED || echo SOME FAILED)"
  return "$fail"
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  *) echo "usage: $0 prepare|run" >&2; exit 2 ;;
esac
