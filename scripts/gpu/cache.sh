#!/usr/bin/env bash
# The node cache on a GPU node's disk: warm-cache reads vs fio, 1 and 8 ranks.
#
#   scripts/gpu/cache.sh prepare   on the build machine: builds build-gpu/stoker
#                                  (Release, no RADOS or Python) and copies it
#                                  with the shared libraries a stock image lacks
#                                  into .gpu-carry-cache/ (git-ignored).
#   scripts/gpu/cache.sh run       on the GPU machine, from the repository root:
#                                  packs a dataset of random 100 KB samples in
#                                  4 MiB shards (STOKER_CACHE_DATA_MIB, default
#                                  2048) on local disk, fills a cache folder from
#                                  it (`bench node`, 1 rank, 1 epoch), then for
#                                  two rounds, cold (page cache dropped before
#                                  each side: the cache folder's disk) and hot:
#                                  `bench node` from the warm cache with 8 ranks
#                                  and with 1 rank (1 epoch, default threads),
#                                  and fio reading every cache file once
#                                  (buffered, 1 MiB reads, 8 jobs and 1 job).
#                                  Prints the ratios.
#
# With the device tool: run(command="bash scripts/gpu/cache.sh run",
#                           carry=[".gpu-carry-cache"])
set -euo pipefail
carry=${STOKER_CACHE_CARRY:-.gpu-carry-cache}
[[ -d $carry || ${1:-} != run ]] || carry=.gpu-carry

prepare() {
  grep -qx "/$carry/" .git/info/exclude 2>/dev/null || echo "/$carry/" >>"$(git rev-parse --git-path info/exclude)"
  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DSTOKER_WITH_CUDA=ON \
    -DSTOKER_WITH_RADOS=OFF -DSTOKER_WITH_PYTHON=OFF -DSTOKER_BUILD_TESTS=OFF >/dev/null
  cmake --build build-gpu -j"$(nproc)" --target stoker
  rm -rf "$carry"
  mkdir -p "$carry/bin" "$carry/lib"
  strip -o "$carry/bin/stoker" build-gpu/stoker
  bash "$(dirname "$0")/copy-libs.sh" "$carry/lib" "$carry/bin/stoker"
  du -sh "$carry"
}

# The peer: every cache file read once, 1 MiB reads, by N jobs that split
# the files between them (fio, or the same reads from Python where fio is
# missing), in fio's JSON shape.
peer() {
  local dir=$1 n=$2
  if command -v fio >/dev/null; then
    # N jobs, each reading its own N-th of the files: the dataset once, as
    # the N ranks read it (numjobs would read every file N times, all but
    # the first from the page cache).
    local i jobs
    jobs=$(mktemp)
    printf '[global]\nrw=read\nbs=1M\nioengine=psync\ninvalidate=0\ngroup_reporting=1\ndirectory=%s\n' \
      "$dir" >"$jobs"
    for ((i = 0; i < n; i++)); do
      printf '[part%d]\nfilename=%s\n' "$i" \
        "$(cd "$dir" && ls ./*.stks | sed 's|^\./||' | awk -v n="$n" -v i="$i" 'NR % n == i' | paste -sd:)" >>"$jobs"
    done
    fio --output-format=json "$jobs" 2>/dev/null | sed -n '/^{/,$p'
    rm -f "$jobs"
    return
  fi
  python3 - "$dir" "$n" <<'PEER'
import json, os, sys, time
from multiprocessing import Pool
d, n = sys.argv[1], int(sys.argv[2])
files = sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".stks"))
def job(i):
    total = 0
    for p in files[i::n]:
        fd = os.open(p, os.O_RDONLY)
        while True:
            b = os.read(fd, 1 << 20)
            if not b:
                break
            total += len(b)
        os.close(fd)
    return total
t = time.time()
with Pool(n) as pool:
    total = sum(pool.map(job, range(n)))
print(json.dumps({"peer": "python os.read, 1 MiB (no fio)",
                  "jobs": [{"read": {"bw_bytes": total / (time.time() - t)}}]}))
PEER
}

run() {
  export LD_LIBRARY_PATH=$PWD/$carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  local stoker=$PWD/$carry/bin/stoker mib=${STOKER_CACHE_DATA_MIB:-2048}
  local work=${STOKER_CACHE_WORK:-/tmp/stoker-gpu-cache}
  rm -rf "$work"
  mkdir -p "$work"
  echo "machine: $(nproc) cores, $(free -g | awk '/Mem/ {print $2}') GiB, disk of $work:" \
    "$(df -h "$work" | awk 'NR == 2 {print $1, $2}'), $(date -u '+%F %H:%M UTC')"
  python3 - "$work/src" "$mib" <<'EOF'
import os, sys
root, mib = sys.argv[1], int(sys.argv[2])
n = mib * 1024 * 1024 // 100000
block = os.urandom(1 << 20)
for i in range(n):
    d = os.path.join(root, f"c{i % 10}")
    os.makedirs(d, exist_ok=True)
    off = (i * 7919) % ((1 << 20) - 100000)
    with open(os.path.join(d, f"f{i:07d}.bin"), "wb") as f:
        f.write(i.to_bytes(8, "little") + block[off:off + 99992])
EOF
  "$stoker" pack "$work/src" "$work/ds" --quiet
  rm -rf "$work/src"
  # The read unit the loader picks (auto: per-sample reads for these 100 KB
  # samples, so each rank reads its own records and the node the dataset
  # once an epoch; with whole shards every rank reads every shard).
  local common=(--batch-size 256)
  "$stoker" bench node "$work/ds" --ranks 1 --cache "$work/cache" --epochs 1 "${common[@]}" \
    --json >"$work/fill.json"
  local dsdir
  dsdir=$(ls -d "$work"/cache/*/ | head -1)
  # Cold: the page cache dropped before each side, so both read the cache
  # folder's disk (what the issue's target is about); hot: both read the
  # same files from the page cache. Where the page cache cannot be dropped,
  # this says so and the cold rows read from memory too.
  local can_drop=1
  { sync && echo 3 >/proc/sys/vm/drop_caches; } 2>/dev/null || can_drop=0
  echo "page cache can be dropped: $([[ $can_drop == 1 ]] && echo yes || echo no)"
  drop() { sync; [[ $can_drop == 1 ]] && echo 3 >/proc/sys/vm/drop_caches; return 0; }
  for round in 1 2; do
    for temp in cold hot; do
      for n in 8 1; do
        [[ $temp == cold ]] && drop
        "$stoker" bench node "$work/ds" --ranks $n --cache "$work/cache" --epochs 1 \
          "${common[@]}" --json >"$work/$temp$n-$round.json"
        [[ $temp == cold ]] && drop
        peer "$dsdir" "$n" >"$work/peer-$temp$n-$round.json"
      done
    done
  done
  python3 - "$work" <<'EOF'
import json, sys
w = sys.argv[1]
for temp in ("cold", "hot"):
    for n in (8, 1):
        rows = []
        for r in (1, 2):
            b = json.load(open(f"{w}/{temp}{n}-{r}.json"))
            f = json.load(open(f"{w}/peer-{temp}{n}-{r}.json"))
            e = b["epochs"][0]
            # The epoch's dataset delivered by all ranks together, per
            # second of the slowest rank, against the peer reading the
            # dataset once.
            rows.append((e["dataset_bytes"] / e["seconds"] / 1e6, e["bytes_read"] / e["dataset_bytes"],
                         e["remote_bytes"], f["jobs"][0]["read"]["bw_bytes"] / 1e6, f.get("peer", "fio")))
        print(f"{temp}, {n} rank(s) / job(s): " + "; ".join(
            f"stoker {s:.0f} MB/s of dataset (read {rd:.2f}x it, remote bytes {rb}), {p} {x:.0f} MB/s, "
            f"ratio {s / x:.2f}" for s, rd, rb, x, p in rows))
EOF
  if [[ -n ${OUT:-} ]]; then cp "$work"/*.json "$OUT/" 2>/dev/null || true; fi
}

case ${1:-} in
  prepare) prepare ;;
  run) run ;;
  *)
    echo "usage: $0 prepare|run" >&2
    exit 2
    ;;
esac
