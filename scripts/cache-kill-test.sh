#!/usr/bin/env bash
# cache-kill-test.sh — kill -9 random ranks while they fill a shared node cache.
#
# Usage: scripts/cache-kill-test.sh [COUNT] [STOKER] [SHARDS]
#   COUNT   rounds (default 200); each starts 4 rank processes (`stoker bench
#           node-rank`, one epoch, a new seed each round) on one cache folder
#           limited to half the dataset, and SIGKILLs one of them at a random
#           moment (10-400 ms in: during fetches, evictions, writes).
#   STOKER  the binary (default build/stoker)
#   SHARDS  "few" (default: ~60 shards, the eviction ranking is built at every
#           fetch) or "many" (~1,200 shards of 16 KiB: the ranking is kept
#           between fetches, cache/ranking.h)
#
# Checks, every round: no surviving rank failed (a bad byte from the cache
# would fail the loader's checksum: "Corruption"), and the cache folder holds
# no more than its limit (shard files and temporary files together). At the
# end, a round without kills completes on the cache as the kills left it.
# Prints one line per 20 rounds and a summary; exit 0 iff every check held.
set -euo pipefail

count=${1:-200}
stoker=$(realpath "${2:-build/stoker}")
shards=${3:-few}
work=$(mktemp -d /tmp/stoker-cache-kill.XXXXXX)
trap 'rm -rf "$work"' EXIT

# A dataset of 400 random files of 20-60 KB in 256 KiB shards (~60 shards),
# or 2,400 files of 2-10 KB in 16 KiB shards (~1,200).
if [ "$shards" = many ]; then files=2400 low=2000 high=10000 mib=0.015625
else files=400 low=20000 high=60000 mib=0.25; fi
python3 - "$work/src" "$files" "$low" "$high" <<'EOF'
import os, random, sys
rng = random.Random(1)
for i in range(int(sys.argv[2])):
    d = os.path.join(sys.argv[1], f"c{i % 4}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"f{i:05d}.bin"), "wb") as f:
        f.write(rng.randbytes(rng.randint(int(sys.argv[3]), int(sys.argv[4]))))
EOF
"$stoker" pack "$work/src" "$work/ds" --shard-mib "$mib" --quiet >/dev/null
dataset_bytes=$(du -cb "$work"/ds/shards/* | tail -1 | cut -f1)
limit=$((dataset_bytes / 2))
gib=$(python3 -c "print($limit / 2**30)")
cache="$work/cache"

folder_bytes() {
  find "$cache" -type f \( -name '*.stks' -o -name '.tmp-*' \) -printf '%s\n' 2>/dev/null |
    awk '{s += $1} END {print s + 0}'
}

run_ranks() {  # seed kill(0/1) -> prints the failed survivors' count
  local seed=$1 kill_one=$2 pids=() r
  for r in 0 1 2 3; do
    "$stoker" bench node-rank "$work/ds" --rank "$r" --world-size 4 --epochs 1 \
      --cache "$cache" --cache-gib "$gib" --seed "$seed" --batch-size 16 --window 4 \
      --read-unit shard </dev/null >/dev/null 2>"$work/err.$r" &
    pids+=($!)
  done
  local victim=-1
  if [ "$kill_one" = 1 ]; then
    victim=$((RANDOM % 4))
    sleep "0.$(printf '%03d' $((10 + RANDOM % 390)))"
    kill -9 "${pids[$victim]}" 2>/dev/null || true
  fi
  local failed=0
  for r in 0 1 2 3; do
    if ! wait "${pids[$r]}" && [ "$r" != "$victim" ]; then
      failed=$((failed + 1))
      echo "round seed $seed: rank $r failed: $(tail -c 300 "$work/err.$r")" >&2
    fi
  done
  echo "$failed"
}

bad=0 over=0 peak=0
for ((i = 1; i <= count; i++)); do
  failed=$(run_ranks "$i" 1)
  bytes=$(folder_bytes)
  ((bytes > peak)) && peak=$bytes
  if ((bytes > limit)); then
    over=$((over + 1))
    echo "round $i: the cache holds $bytes bytes, over its limit $limit" >&2
  fi
  bad=$((bad + failed))
  if ((i % 20 == 0)); then
    echo "round $i/$count: failed survivors $bad, over the limit $over, peak $peak of $limit bytes"
  fi
done
final=$(run_ranks 100000 0)
echo "summary: $count kill -9 rounds; surviving ranks that failed: $bad; rounds over the" \
  "limit: $over (peak $peak of $limit bytes); final run without kills: $([ "$final" = 0 ] &&
    echo completed || echo "$final ranks failed")"
[ "$bad" = 0 ] && [ "$over" = 0 ] && [ "$final" = 0 ]
