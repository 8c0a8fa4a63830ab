#!/usr/bin/env bash
# Per-file reads through CephFS against stoker's shards in RADOS, on the same
# cluster: the case stoker is for (every small file an MDS round trip).
#
#   bench/cephfs_vs_rados.sh [--files N] [--reps R]
#
# Starts a cluster with scripts/ceph-cluster.sh in a fresh folder, adds one
# MDS and a file system (pools cephfs_metadata, cephfs_data: size 2), mounts
# it with ceph-fuse (the VMs here have no kernel ceph module), writes N
# random files of 4 KiB and of 16 KiB into it as an ImageFolder tree, packs
# each tree from the mount into rados://training_data, then R times, for each
# size: `stoker bench files` on the tree right after a fresh mount (a new
# job's client: no caps, no cache), again on the same mount (warm client),
# and `stoker bench loader` on the packed shards; one epoch each, batch 256.
# Prints every run and the medians. Needs ceph-mds and ceph-fuse (installed
# by scripts/install-deps.sh --all) and root (FUSE mount, drop_caches).
set -euo pipefail
cd "$(dirname "$0")/.."
files=8200 reps=3
while (($#)); do
  case $1 in
    --files) files=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    *) echo "usage: $0 [--files N] [--reps R]" >&2; exit 2 ;;
  esac
done
bin=${STOKER_BIN:-build/stoker}
dir=$(mktemp -d /tmp/stoker-cephfs.XXXXXX)
mnt=$dir/mnt
rmdir "$dir"
cleanup() {
  fusermount -u "$mnt" 2>/dev/null || umount "$mnt" 2>/dev/null || true
  scripts/ceph-cluster.sh stop "$dir/ceph" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT
export STOKER_CEPH_OSD_BYTES=${STOKER_CEPH_OSD_BYTES:-3G}
eval "$(scripts/ceph-cluster.sh start "$dir/ceph")"
ceph_() { timeout 60 ceph --conf "$CEPH_CONF" --name client.admin "$@"; }
ceph_ osd pool create cephfs_metadata 16 >/dev/null 2>&1
ceph_ osd pool create cephfs_data 32 >/dev/null 2>&1
for p in cephfs_metadata cephfs_data; do ceph_ osd pool set "$p" size 2 >/dev/null; done
ceph_ fs new bench cephfs_metadata cephfs_data >/dev/null
mkdir -p "$dir/ceph/mds.a" "$mnt"
ceph_ auth get-or-create mds.a mon 'allow profile mds' osd 'allow rwx' mds 'allow *' \
  mgr 'allow profile mds' >"$dir/ceph/mds.a/keyring"
ceph-mds --conf "$CEPH_CONF" -i a --keyring "$dir/ceph/mds.a/keyring" 2>/dev/null
for _ in $(seq 60); do ceph_ fs status bench 2>/dev/null | grep -q active && break; sleep 1; done

mount_fresh() { # unmount, drop every cache, mount a new client
  if mountpoint -q "$mnt"; then fusermount -u "$mnt"; fi
  # The old client must be gone: a mount while it closes its session fails.
  for _ in $(seq 100); do pgrep -f "ceph-fuse .*$mnt" >/dev/null || break; sleep 0.1; done
  sync
  echo 3 >/proc/sys/vm/drop_caches
  for _ in 1 2 3; do
    if timeout 60 ceph-fuse --conf "$CEPH_CONF" --name client.admin "$mnt" >/dev/null 2>&1 &&
      mountpoint -q "$mnt"; then
      return 0
    fi
    sleep 1
  done
  echo "ceph-fuse did not mount $mnt" >&2
  return 1
}
mount_fresh
for size in 4096 16384; do
  /usr/bin/python3 - "$mnt/raw-$size" "$files" "$size" <<'PY'
import os, sys
root, count, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(count):
    d = os.path.join(root, "c%02d" % (i % 10))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "f%07d.bin" % i), "wb") as f:
        f.write(os.urandom(size))
PY
  "$bin" pack --quiet "$mnt/raw-$size" "rados://training_data/cephfs-$size?id=stoker-pack" >/dev/null
done
echo "# $files files per size, ceph-fuse on $(ceph --version | cut -d' ' -f1-3)"
run() { # LABEL ARGS...: one run, "LABEL samples/s"
  local label=$1 out
  shift
  out=$("$bin" "$@" --json --batch-size 256)
  /usr/bin/python3 -c "import json,sys; d=json.loads(sys.argv[2]); print(sys.argv[1], round(d['samples_per_s']))" \
    "$label" "$out"
}
results=$dir/results
for size in 4096 16384; do
  for r in $(seq "$reps"); do
    mount_fresh
    run "$size files-fresh" bench files "$mnt/raw-$size"
    run "$size files-warm" bench files "$mnt/raw-$size"
    run "$size stoker" bench loader "rados://training_data/cephfs-$size?id=stoker-train"
  done
done | tee "$results"
/usr/bin/python3 - "$results" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    size, side, rate = line.split()
    runs.setdefault((int(size), side), []).append(float(rate))
for size in sorted({s for s, _ in runs}):
    m = {side: statistics.median(runs[(size, side)]) for _, side in runs if _ == size}
    print(f"{size // 1024} KiB: per-file via CephFS {m['files-fresh']:.0f}/s (fresh mount), "
          f"{m['files-warm']:.0f}/s (warm); stoker from RADOS {m['stoker']:.0f}/s: "
          f"{m['stoker'] / m['files-fresh']:.1f}x / {m['stoker'] / m['files-warm']:.1f}x")
PY
