#!/usr/bin/env bash
# two-nodes.sh — two simulated nodes × 4 ranks, each with its own node cache,
# reading one dataset from the project's Ceph cluster over shaped links.
#
# Usage (root): scripts/two-nodes.sh [STOKER] [EPOCHS]
#   STOKER  the binary (default build/stoker); EPOCHS default 2.
#
# Network namespaces, all made here and removed at exit (with everything in
# them): stk2n-ceph holds the Ceph cluster (scripts/ceph-cluster.sh, its
# daemons on 10.231.0.1, a veth address in that namespace) and a bridge;
# stk2n-node0 and stk2n-node1 are the nodes (10.231.0.10, .11), each joined to
# the bridge by a veth pair shaped with netem on both ends (rate 10gbit,
# delay 0.2ms: a 10 GbE link, 0.4 ms round trip; tbf at the same rate where
# the kernel has no netem). No other address is used.
#
# Runs, per node at once: `stoker bench node rados://training_data/two-nodes
# --ranks 4 --world-size 8 --rank-offset 0|4 --ranks-per-node 4 --cache
# DIR/cache-nodeK`, first with the global shuffle (fresh caches), then with
# node affinity (fresh caches). Prints each epoch's remote bytes per node and
# the sum next to the dataset's size: 2x for the global shuffle (every node
# needs every shard), 1x with node affinity. Exit 1 when epoch 1 is not
# within 2% of that, 77 when not root.
set -euo pipefail

stoker=$(realpath "${1:-build/stoker}")
epochs=${2:-2}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/stoker-two-nodes.XXXXXX)
ns_ceph=stk2n-ceph
nodes=(stk2n-node0 stk2n-node1)
addr_ceph=10.231.0.1

cleanup() {
  set +e
  ip netns exec "$ns_ceph" env STOKER_CEPH_ADDR=$addr_ceph "$here/ceph-cluster.sh" stop \
    "$work/ceph" >/dev/null 2>&1
  for ns in "${nodes[@]}" "$ns_ceph"; do
    # Whatever still runs in it, then the namespace (its veths go with it).
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
  done
  rm -rf "$work"
}
trap cleanup EXIT

[ "$(id -u)" = 0 ] || { echo "two-nodes.sh: needs root (ip netns)" >&2; exit 77; }

# netem where the kernel has it; a kernel without sch_netem (some VM kernels)
# gets the rate alone from tbf, and the run says so.
shaping="netem rate 10gbit delay 0.2ms each way"
shape() {  # namespace, device
  if ! ip netns exec "$1" tc qdisc add dev "$2" root netem rate 10gbit delay 0.2ms 2>/dev/null; then
    ip netns exec "$1" tc qdisc add dev "$2" root tbf rate 10gbit burst 1mb latency 10ms
    shaping="tbf rate 10gbit each way (no sch_netem in this kernel: no added delay)"
  fi
}

command -v ceph-mon >/dev/null || { echo "two-nodes.sh: Ceph is not installed" >&2; exit 77; }
if ! ip netns add "$ns_ceph"; then
  echo "two-nodes.sh: cannot make network namespaces here (ip netns add failed)" >&2
  exit 77
fi
ip -n "$ns_ceph" link set lo up
ip -n "$ns_ceph" link add br0 type bridge
ip -n "$ns_ceph" addr add $addr_ceph/24 dev br0
ip -n "$ns_ceph" link set br0 up
for i in 0 1; do
  ns=${nodes[$i]}
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  # The pair is made inside the node's namespace, one end moved to Ceph's.
  ip -n "$ns" link add eth0 type veth peer name n$i netns "$ns_ceph"
  ip -n "$ns" addr add 10.231.0.$((10 + i))/24 dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns_ceph" link set n$i master br0
  ip -n "$ns_ceph" link set n$i up
  shape "$ns" eth0
  shape "$ns_ceph" n$i
done

echo "starting Ceph in $ns_ceph on $addr_ceph" >&2
ip netns exec "$ns_ceph" env STOKER_CEPH_ADDR=$addr_ceph "$here/ceph-cluster.sh" start \
  "$work/ceph" >"$work/ceph.env"
export CEPH_CONF=$work/ceph/ceph.conf
mon_port=$(sed -n 's/^mon host = v2:[0-9.]*:\([0-9]*\).*/\1/p' "$CEPH_CONF")
for i in 0 1; do
  ip netns exec "${nodes[$i]}" timeout 5 bash -c "exec 3<>/dev/tcp/$addr_ceph/$mon_port" ||
    { echo "two-nodes.sh: node $i cannot reach the monitor at $addr_ceph:$mon_port" >&2; exit 1; }
done

# A dataset of 1200 random files of 80-120 KB in 1 MiB shards (~115 MiB).
python3 - "$work/src" <<'EOF'
import os, random, sys
rng = random.Random(2)
for i in range(1200):
    d = os.path.join(sys.argv[1], f"c{i % 10}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"f{i:05d}.bin"), "wb") as f:
        f.write(rng.randbytes(rng.randint(80000, 120000)))
EOF
ip netns exec "${nodes[0]}" "$stoker" pack "$work/src" \
  "rados://training_data/two-nodes?id=stoker-pack" --shard-mib 1 --quiet >&2
uri="rados://training_data/two-nodes?id=stoker-train"

run() {  # label, extra flags...
  local label=$1
  shift
  local pids=()
  for i in 0 1; do
    rm -rf "$work/cache-node$i"
    ip netns exec "${nodes[$i]}" "$stoker" bench node "$uri" --ranks 4 --world-size 8 \
      --rank-offset $((4 * i)) --ranks-per-node 4 --cache "$work/cache-node$i" \
      --epochs "$epochs" --batch-size 64 --window 8 --json "$@" >"$work/$label-$i.json" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  python3 - "$label" "$work/$label-0.json" "$work/$label-1.json" <<'EOF'
import json, sys
label, a, b = sys.argv[1], json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
d = a["dataset_bytes"]
# The claim: epoch 1 reads the dataset once per node (global shuffle) or once
# in all (node affinity), within 2%.
want = 2.0 if label == "global" else 1.0
first = (a["epochs"][0]["remote_bytes"] + b["epochs"][0]["remote_bytes"]) / d
status = 0
if abs(first - want) > 0.02 * want or a["failed_ranks"] or b["failed_ranks"]:
    print(f"{label}: epoch 1 read {first:.3f} x the dataset, expected {want:.0f}x within 2%"
          f" (failed ranks: {a['failed_ranks']} + {b['failed_ranks']})", file=sys.stderr)
    status = 1
for ea, eb in zip(a["epochs"], b["epochs"]):
    total = ea["remote_bytes"] + eb["remote_bytes"]
    print(f"{label:9s} epoch {ea['epoch']}: node0 {ea['remote_bytes']:>11d}  node1 "
          f"{eb['remote_bytes']:>11d}  sum {total:>11d} = {total / d:.3f} x dataset {d}  "
          f"(node MB/s {ea['node_mb_per_s']:.0f}, {eb['node_mb_per_s']:.0f})")
sys.exit(status)
EOF
}

echo "two nodes x 4 ranks, $shaping, $(date -u '+%F %H:%M UTC')"
run global
run affinity --node-affinity
