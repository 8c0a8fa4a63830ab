#!/usr/bin/env bash
# What an operator would try first when Open MPI's allreduce is slower than
# torch.distributed's gloo on one machine: each setting's MPI_Allreduce loop
# (bench/comm_mpi_peer.c) against gloo (bench/comm_peer.py), the same ranks,
# sizes and launcher, rounds interleaved; then the page faults per call that
# come with Open MPI's per-call scratch buffer (and go with glibc told to
# keep freed memory: MALLOC_MMAP_MAX_=0, a huge MALLOC_TRIM_THRESHOLD_). "cma" is
# Open MPI's default here; stoker's own ring is measured by comm_bench.py.
#
#   bash bench/comm_mpi_settings.sh [NP_LIST [SIZES [REPEATS [FAULT_ENV]]]]
#   defaults: "2 4", 8388608,67108864, 3, none; FAULT_ENV, e.g.
#   "-x MALLOC_MMAP_MAX_=0", is added to the page-fault count's mpirun
# Prints one line per run: round, ranks, setting, busbw GB/s per size; then
# the medians. Every setting runs with its own mpirun and
# mpi_yield_when_idle 1 unless it says otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
nps=${1:-2 4}
sizes=${2:-8388608,67108864}
repeats=${3:-3}
fault_env=${4:-}
# The Python with torch: Debian's on the build VM (PYTHON overrides).
python=${PYTHON:-$([[ -x /usr/bin/python3 ]] && echo /usr/bin/python3 || echo python3)}
peer=/tmp/stoker_comm_mpi_peer
mpicc -O2 -o "$peer" bench/comm_mpi_peer.c
mpirun=(mpirun --allow-run-as-root --oversubscribe)
log=$(mktemp)
busbw() {
  python3 -c 'import json,sys; t=sys.stdin.read(); print(" ".join("%.3f" % r["busbw_gbps"] for r in json.loads(t[t.index("{"):])["results"]))'
}
y="--mca mpi_yield_when_idle 1"
settings=(
  "cma|$y --mca btl_vader_single_copy_mechanism cma"
  "none (no single copy)|$y --mca btl_vader_single_copy_mechanism none"
  "cma, no yield|--mca mpi_yield_when_idle 0 --mca btl_vader_single_copy_mechanism cma"
  "tcp|$y --mca btl tcp,self"
  "cma, glibc keeps freed memory|$y -x MALLOC_MMAP_MAX_=0 -x MALLOC_TRIM_THRESHOLD_=4294967295"
)
for a in 1 2 3 4 5 6; do
  settings+=("cma, allreduce algorithm $a|$y --mca btl_vader_single_copy_mechanism cma --mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm $a")
done
for rep in $(seq "$repeats"); do
  for np in $nps; do
    echo "$rep|$np|torch gloo|$("${mpirun[@]}" -np "$np" "$python" bench/comm_peer.py --backend gloo \
      --sizes "$sizes" --warmup 2 --iters 5 2>/dev/null </dev/null | busbw)" | tee -a "$log"
    for s in "${settings[@]}"; do
      # shellcheck disable=SC2086 # the setting's MCA arguments split on purpose
      echo "$rep|$np|${s%%|*}|$("${mpirun[@]}" ${s#*|} -np "$np" "$peer" \
        "$sizes" 2 5 2>/dev/null </dev/null | busbw)" | tee -a "$log"
    done
  done
done
echo
echo "medians of $repeats, busbw GB/s at $sizes B; ratio to gloo at the largest size"
python3 - "$log" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    _, np, name, vals = line.rstrip("\n").split("|")
    runs.setdefault((int(np), name), []).append([float(v) for v in vals.split()])
for (np, name), rs in sorted(runs.items(), key=lambda kv: kv[0][0]):
    med = [statistics.median(col) for col in zip(*rs)]
    gloo = statistics.median(r[-1] for r in runs[(np, "torch gloo")])
    print(f"  {np} ranks  {name:34} " + " ".join(f"{m:7.3f}" for m in med) +
          f"   {med[-1] / gloo:5.2f}x gloo")
PY
echo
echo "page faults per MPI_Allreduce of the largest size, 2 ranks (minor faults at 12 - at 2 calls, / 10):"
big=${sizes##*,}
for it in 2 12; do
  # time writes a file per rank: its output on stderr can be lost when mpirun ends.
  # shellcheck disable=SC2086 # FAULT_ENV's arguments split on purpose
  "${mpirun[@]}" $y $fault_env -np 2 sh -c "/usr/bin/time -f %R -o $log.\$OMPI_COMM_WORLD_RANK.$it $peer $big 0 $it" \
    </dev/null >/dev/null 2>&1
done
echo "  rank 0: $((($(cat "$log.0.12") - $(cat "$log.0.2")) / 10)) per call" \
  "($((($(cat "$log.0.12") - $(cat "$log.0.2")) * 4 / 10 / 1024)) MiB of fresh pages)"
rm -f "$log" "$log".*
