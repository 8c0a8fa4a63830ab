#!/usr/bin/env bash
# rados_vs_rados_bench.sh — stoker's loader reading from RADOS vs `rados bench
# seq`, in one run, on the same cluster, pool, object size and concurrency.
#
#   bench/rados_vs_rados_bench.sh [--concurrency N] [--objects N] [--reps N] [--passes N]
#
# The peer: `rados bench write --no-cleanup -b 4M --max-objects OBJECTS`
# writes OBJECTS 4 MiB objects into training_data, and `rados bench seq -t N`
# reads each of them once; a run is PASSES such reads back to back (bytes
# over the sum of rados bench's own times). stoker: a dataset of OBJECTS
# 4 MiB shards (random 100 KB samples) packed into the same pool, read for
# PASSES epochs by `stoker bench loader ... --reads-in-flight N --epochs
# PASSES` (which checks every sample's checksum and collates batches of 256;
# rados bench only moves bytes). Each pair is run REPS times, alternating
# which goes first; the medians and their ratio are printed last (target:
# loader >= 0.9 x rados bench).
#
# The cluster: the running one in $STOKER_CEPH_DIR, else one started here
# (scripts/ceph-cluster.sh, memstore, OSDs of 3 GiB) and stopped at exit.
# The binary: $STOKER_BIN, else build/stoker. Output: progress on stderr, a
# summary on stdout, and the raw numbers in $OUT (default
# rados_vs_rados_bench.json in the current folder).
#
# Defaults: N=8 (the loader's default reads_in_flight), 256 objects (1 GiB),
# 3 passes, 3 repetitions: about 2 minutes on 2 cores.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
conc=8
objects=256
reps=3
passes=3
while (($#)); do
  case "$1" in
    --concurrency) conc="$2"; shift 2 ;;
    --objects) objects="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --passes) passes="$2"; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
stoker="${STOKER_BIN:-$root/build/stoker}"
[[ -x "$stoker" ]] || { echo "no stoker binary at $stoker (build it, or set STOKER_BIN)" >&2; exit 1; }
out_json="${OUT:-$PWD/rados_vs_rados_bench.json}"

say() { printf '[%4ds] %s\n' "$SECONDS" "$*" >&2; }
tmp="$(mktemp -d "${TMPDIR:-/tmp}/stoker-radosbench.XXXXXX")"
started=0
run_name="stoker_cmp_$$"
dataset="bench-$$"
cleanup() {
  set +e
  if [[ -n "${CEPH_CONF:-}" ]]; then
    rados --id admin -p training_data cleanup --run-name "$run_name" >/dev/null 2>&1
    rados --id admin -p training_data ls 2>/dev/null | grep "^$dataset/" |
      xargs -r -n 64 rados --id admin -p training_data rm 2>/dev/null
  fi
  ((started)) && "$root/scripts/ceph-cluster.sh" stop "$tmp/cluster" >/dev/null 2>&1
  rm -rf -- "$tmp"
}
trap cleanup EXIT

if [[ -n "${STOKER_CEPH_DIR:-}" ]] && "$root/scripts/ceph-cluster.sh" osd-pid 0 "$STOKER_CEPH_DIR" >/dev/null 2>&1; then
  export CEPH_CONF="$STOKER_CEPH_DIR/ceph.conf"
  say "using the running cluster in $STOKER_CEPH_DIR"
else
  say "starting a cluster in $tmp/cluster"
  eval "$(STOKER_CEPH_OSD_BYTES="${STOKER_CEPH_OSD_BYTES:-3G}" "$root/scripts/ceph-cluster.sh" start "$tmp/cluster")"
  started=1
fi
unset CEPH_ARGS

# ---- the data -----------------------------------------------------------------
say "writing the rados bench objects: $objects x 4 MiB, -t $conc"
rados --id admin -p training_data bench 600 write --no-cleanup -b 4M -t "$conc" \
  --max-objects "$objects" --run-name "$run_name" >"$tmp/write.txt"
grep -E "^Bandwidth|^Total writes" "$tmp/write.txt" | sed 's/^/    /' >&2

say "making $objects x 4 MiB of 100 KB samples and packing them (stoker-pack)"
python3 - "$tmp/src" "$objects" <<'EOF'
import os, sys
root, objects = sys.argv[1], int(sys.argv[2])
# 100,000-byte samples: 41 fit in a 4 MiB shard with its index, so OBJECTS
# shards hold OBJECTS * 41 samples.
n = objects * 41
with open(os.path.join(os.path.dirname(root), "list.txt"), "w") as lst:
    for i in range(n):
        d = os.path.join(root, "c%d" % (i % 10))
        os.makedirs(d, exist_ok=True)
        p = os.path.join(d, "s%06d.bin" % i)
        with open(p, "wb") as f:
            f.write(os.urandom(100000))
        lst.write("%s %d\n" % (p, i % 10))
EOF
"$stoker" pack "$tmp/list.txt" "rados://training_data/$dataset?id=stoker-pack" --quiet >&2
"$stoker" inspect "rados://training_data/$dataset?id=stoker-train" | grep -E "^(samples|shards|bytes)" | sed 's/^/    /' >&2
rm -rf -- "$tmp/src"

# ---- the runs -------------------------------------------------------------------
rados_seq() { # prints MB/s (10^6 bytes, as stoker counts) over PASSES reads of every object
  local p secs=0 t
  for ((p = 0; p < passes; p++)); do
    rados --id stoker-train -p training_data bench 300 seq -t "$conc" --run-name "$run_name" >"$tmp/seq.txt"
    grep -q "^Total reads made: *$objects\$" "$tmp/seq.txt" ||
      { echo "rados bench seq did not read all $objects objects:" >&2; cat "$tmp/seq.txt" >&2; exit 1; }
    t="$(awk '/^Total time run:/ { print $4 }' "$tmp/seq.txt")"
    secs="$(awk -v a="$secs" -v b="$t" 'BEGIN { print a + b }')"
  done
  awk -v n="$objects" -v p="$passes" -v s="$secs" 'BEGIN { printf "%.1f\n", n * 4194304 * p / s / 1e6 }'
}
stoker_loader() { # prints MB/s over PASSES epochs
  "$stoker" bench loader "rados://training_data/$dataset?id=stoker-train" \
    --reads-in-flight "$conc" --epochs "$passes" --json >"$tmp/loader.json"
  python3 -c 'import json,sys; print("%.1f" % json.load(open(sys.argv[1]))["mb_per_s"])' "$tmp/loader.json"
}
rados_runs=()
stoker_runs=()
for ((r = 1; r <= reps; r++)); do
  if ((r % 2)); then
    a="$(rados_seq)"; b="$(stoker_loader)"
  else
    b="$(stoker_loader)"; a="$(rados_seq)"
  fi
  rados_runs+=("$a")
  stoker_runs+=("$b")
  say "run $r: rados bench seq $a MB/s, stoker loader $b MB/s"
done

median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
rm_med="$(median "${rados_runs[@]}")"
st_med="$(median "${stoker_runs[@]}")"
ratio="$(awk -v s="$st_med" -v r="$rm_med" 'BEGIN { printf "%.2f", s / r }')"
python3 - "$out_json" "$conc" "$objects" "$passes" "$rm_med" "$st_med" "$ratio" "${rados_runs[*]}" "${stoker_runs[*]}" <<'EOF'
import json, sys, platform, os
path, conc, objects, passes, rm, st, ratio, rr, sr = sys.argv[1:]
json.dump({"concurrency": int(conc), "objects": int(objects), "object_bytes": 4 << 20,
           "passes_per_run": int(passes),
           "rados_bench_seq_mb_per_s": [float(x) for x in rr.split()],
           "stoker_loader_mb_per_s": [float(x) for x in sr.split()],
           "rados_bench_seq_median": float(rm), "stoker_loader_median": float(st),
           "ratio": float(ratio), "cores": os.cpu_count(), "kernel": platform.release()},
          open(path, "w"), indent=2)
EOF
echo "objects: $objects x 4 MiB, concurrency $conc, $reps runs of $passes passes each (MB = 10^6 bytes)"
echo "rados bench seq:  ${rados_runs[*]} MB/s  median $rm_med"
echo "stoker loader:    ${stoker_runs[*]} MB/s  median $st_med"
echo "ratio stoker / rados bench: $ratio"
