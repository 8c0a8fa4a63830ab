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
#                                  two rounds: `bench node` from the warm cache
#                                  with 8 ranks and with 1 rank (2 epochs), and
#                                  fio reading the cache files (buffered, 1 MiB
#                                  reads, 8 jobs and 1 job). Prints the ratios.
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
  ldd "$carry/bin/stoker" | awk '/=> \// {print $3}' | sort -u |
    grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux|libdl|librt|libpthread)\.so' |
    while read -r lib; do cp -L "$lib" "$carry/lib/"; done
  du -sh "$carry"
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
  local common=(--batch-size 256 --threads 1 --read-unit shard)
  "$stoker" bench node "$work/ds" --ranks 1 --cache "$work/cache" --epochs 1 "${common[@]}" \
    --json >"$work/fill.json"
  local dsdir files
  dsdir=$(ls -d "$work"/cache/*/ | head -1)
  for round in 1 2; do
    for n in 8 1; do
      "$stoker" bench node "$work/ds" --ranks $n --cache "$work/cache" --epochs 2 \
        "${common[@]}" --json >"$work/warm$n-$round.json"
      if command -v fio >/dev/null; then
        (cd "$dsdir" && fio --name=warm$n --filename="$(ls ./*.stks | head -400 | paste -sd:)" \
          --rw=read --bs=1M --ioengine=psync --numjobs=$n --group_reporting --loops=2 \
          --invalidate=0 --output-format=json 2>/dev/null | sed -n '/^{/,$p') >"$work/fio$n-$round.json"
      else
        # No fio here: the same reads (4 MiB reads of every cache file, n
        # processes, each reading all files twice, as fio's numjobs do) from
        # Python, in fio's JSON shape, labelled as such.
        python3 - "$dsdir" $n >"$work/fio$n-$round.json" <<'PEER'
import json, os, sys, time
from multiprocessing import Pool
d, n = sys.argv[1], int(sys.argv[2])
files = sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".stks"))
def job(_):
    total = 0
    for _ in range(2):
        for p in files:
            fd = os.open(p, os.O_RDONLY)
            while True:
                b = os.read(fd, 4 << 20)
                if not b:
                    break
                total += len(b)
            os.close(fd)
    return total
t = time.time()
with Pool(n) as pool:
    total = sum(pool.map(job, range(n)))
print(json.dumps({"peer": "python os.read (no fio)",
                  "jobs": [{"read": {"bw_bytes": total / (time.time() - t)}}]}))
PEER
      fi
    done
  done
  python3 - "$work" <<'EOF'
import json, sys
w = sys.argv[1]
for r in (1, 2):
    for n in (8, 1):
        b = json.load(open(f"{w}/warm{n}-{r}.json"))
        f = json.load(open(f"{w}/fio{n}-{r}.json"))
        fio = f["jobs"][0]["read"]["bw_bytes"] / 1e6
        ep = [e["node_mb_per_s"] for e in b["epochs"]]
        remote = [e["remote_bytes"] for e in b["epochs"]]
        peer = f.get("peer", "fio")
        print(f"round {r}, {n} rank(s): stoker {', '.join(f'{x:.0f}' for x in ep)} MB/s "
              f"(remote bytes {remote}); {peer} {n} job(s) {fio:.0f} MB/s; ratio "
              f"{', '.join(f'{x / fio:.2f}' for x in ep)}")
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
