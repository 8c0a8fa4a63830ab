#!/usr/bin/python3
"""Token windows from RADOS, 8 ranks at once (issue 36's target: each rank
>= 200k tokens/s from RADOS, cold, reading <= 1.5 x the dataset's bytes per
epoch; docs/benchmarks.md, "Token windows from RADOS").

    bench/token_rados.py [--mib 128] [--runs 3] [--ranks 8] [--sequence-length 2048]
                         [--batch 8] [--objectstore memstore|bluestore] [--no-verify]
                         [--token-block-bytes 512]

What it does:
  1. The cluster: the running one in $STOKER_CEPH_DIR, else one started here
     (scripts/ceph-cluster.sh, --objectstore) and stopped at exit.
  2. Writes a Megatron pair of --mib MiB of uint16 tokens (documents of
     1..2047 tokens, random ids) and packs it with `stoker pack` into
     rados://training_data/tokbench-PID (4 MiB shards: Ceph's object size),
     the tokens checksummed in blocks of --token-block-bytes (docs/format.md
     §3.5; 0: whole records only, as packed before block checksums).
  3. --runs times: --ranks reader processes of distinct ranks (world =
     --ranks), each stoker.Loader(uri, batch_size, sequence_length, shuffle on,
     seed = the run), opened first; once all are open they read their share
     of one epoch together. Each reports its windows, tokens (windows x L: the
     one-token overlap is not counted twice), seconds from its first next()
     to the epoch's end, and the loader's bytes_read (all of it, and what of it
     the open read: the shards' headers and indexes).
  4. Prints per rank the median over the runs of tokens/s, the slowest
     rank's median, and total bytes read / dataset bytes (the packed
     objects' bytes, and the token bytes of the .bin).

"Cold": every run is fresh processes, so no client-side cache (librados has
none; the loader's node cache is off). With memstore (default) the OSDs hold
every object in their own memory: there is no disk and no page cache to be
cold, so a run measures the OSD and messenger path over loopback. With
--objectstore bluestore the OSDs read a block file with O_DIRECT (no page
cache), and all OSDs are restarted before each run, which empties
BlueStore's own cache: the reads then come from the VM's disk.
"""

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER = os.path.join(ROOT, "scripts", "ceph-cluster.sh")

# One reader: opens, says so, waits for "go" on stdin, reads its epoch share.
READER = r"""
import json, sys, time, stoker
uri, rank, world, L, batch, seed, verify = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
    int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), sys.argv[7] == "1"
t0 = time.perf_counter()
loader = stoker.Loader(uri, batch_size=batch, sequence_length=L, seed=seed, rank=rank,
                       world_size=world, shuffle=True, sequence_verify=verify)
opened = time.perf_counter() - t0
open_bytes = loader.stats()["bytes_read"]
print("open", flush=True)
sys.stdin.readline()
windows = 0
t0 = time.perf_counter()
for b in loader:
    windows += b["tokens"].shape[0]
secs = time.perf_counter() - t0
s = loader.stats()
print(json.dumps({"rank": rank, "windows": windows, "tokens": windows * L, "seconds": secs,
                  "open_seconds": opened, "open_bytes": open_bytes,
                  "bytes_read": s["bytes_read"]}), flush=True)
"""


def say(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, file=sys.stderr, flush=True)


def write_megatron(prefix, mib, seed=1):
    """megatron/core/datasets/indexed_dataset.py's layout, uint16 (dtype code 8)."""
    rng = np.random.default_rng(seed)
    want = mib << 20 >> 1  # tokens
    lengths = rng.integers(1, 2048, size=want // 1024 + 1000, dtype=np.int64)
    cum = np.cumsum(lengths)
    n = int(np.searchsorted(cum, want)) + 1
    lengths = lengths[:n].astype(np.int32)
    pointers = np.concatenate([[0], np.cumsum(lengths[:-1], dtype=np.int64) * 2])
    with open(prefix + ".bin", "wb") as f:
        left = int(lengths.sum(dtype=np.int64))
        while left:
            k = min(left, 1 << 24)
            f.write(rng.integers(0, 50000, size=k, dtype=np.uint16).tobytes())
            left -= k
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 8))
        f.write(struct.pack("<Q", n) + struct.pack("<Q", n + 1))
        f.write(lengths.tobytes())
        f.write(pointers.astype(np.int64).tobytes())
        f.write(np.arange(n + 1, dtype=np.int64).tobytes())
    return n, int(lengths.sum(dtype=np.int64))


def cluster(*args, env=None):
    r = subprocess.run([CLUSTER, *args], capture_output=True, text=True, env=env)
    if r.returncode:
        raise SystemExit(f"{CLUSTER} {' '.join(args)}: exit {r.returncode}\n{r.stderr[-3000:]}")
    return r.stdout


def restart_osd(osd, cdir):
    """restart-osd, once more if the first start fails: a SIGKILLed BlueStore
    OSD can hold its pid file's lock a moment after it is gone (the restarted
    daemon then exits 250, "failed to lock pidfile"; seen on the build VM)."""
    try:
        cluster("restart-osd", str(osd), cdir)
    except SystemExit as e:
        if "did not start" not in str(e):
            raise
        time.sleep(2)
        cluster("restart-osd", str(osd), cdir)


def pool_bytes(prefix):
    """The dataset's objects' bytes, from `rados ls` and `rados stat`."""
    names = subprocess.run(["rados", "--id", "admin", "-p", "training_data", "ls"], check=True,
                           capture_output=True, text=True).stdout.split()
    total = 0
    for name in (x for x in names if x.startswith(prefix + "/")):
        out = subprocess.run(["rados", "--id", "admin", "-p", "training_data", "stat", name],
                             check=True, capture_output=True, text=True).stdout
        total += int(out.rsplit("size", 1)[1].split()[0])
    return total


def one_run(uri, args, seed):
    env = dict(os.environ)
    procs = [subprocess.Popen(["/usr/bin/python3", "-c", READER, uri, str(r), str(args.ranks),
                               str(args.sequence_length), str(args.batch), str(seed),
                               "0" if args.no_verify else "1"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
             for r in range(args.ranks)]
    for p in procs:
        line = p.stdout.readline()
        if line.strip() != "open":
            raise SystemExit(f"a reader did not open: {line!r}")
    t0 = time.perf_counter()
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    results = []
    for p in procs:
        out = p.stdout.readline()
        p.wait(timeout=600)
        if p.returncode:
            raise SystemExit(f"a reader failed (exit {p.returncode})")
        results.append(json.loads(out))
    return results, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--sequence-length", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--objectstore", choices=("memstore", "bluestore"), default="memstore")
    ap.add_argument("--no-verify", action="store_true",
                    help="sequence_verify=False: read only the windows' token bytes")
    ap.add_argument("--token-block-bytes", type=int, default=512,
                    help="stoker pack --token-block-bytes (0: whole-record checksums only)")
    args = ap.parse_args()
    stoker = os.environ.get("STOKER_BIN", os.path.join(ROOT, "build", "stoker"))
    tmp = tempfile.mkdtemp(prefix="stoker-tokrados.")
    started = None
    running = os.environ.get("STOKER_CEPH_DIR")
    if running and subprocess.run([CLUSTER, "osd-pid", "0", running],
                                  capture_output=True).returncode == 0:
        os.environ["CEPH_CONF"] = os.path.join(running, "ceph.conf")
        say(f"using the running cluster in {running}")
        if args.objectstore == "bluestore":
            say("(--objectstore applies only to a cluster started here)")
            args.objectstore = "given"
        cdir = running
    else:
        cdir = started = os.path.join(tmp, "cluster")
        env = dict(os.environ, STOKER_CEPH_OBJECTSTORE=args.objectstore,
                   STOKER_CEPH_OSD_BYTES=os.environ.get("STOKER_CEPH_OSD_BYTES", "3G"))
        say(f"starting a {args.objectstore} cluster in {cdir}")
        for line in cluster("start", cdir, env=env).splitlines():
            if line.startswith("export "):
                k, v = line[len("export "):].split("=", 1)
                os.environ[k] = v.strip("'\"")
    os.environ.pop("CEPH_ARGS", None)
    name = f"tokbench-{os.getpid()}"
    try:
        prefix = os.path.join(tmp, "corpus")
        docs, tokens = write_megatron(prefix, args.mib)
        say(f"Megatron pair: {docs} documents, {tokens} uint16 tokens ({tokens * 2} bytes)")
        t0 = time.perf_counter()
        subprocess.run([stoker, "pack", "--quiet",
                        f"--token-block-bytes={args.token_block_bytes}", prefix + ".idx",
                        f"rados://training_data/{name}?id=stoker-pack"], check=True)
        say(f"packed into rados://training_data/{name} in {time.perf_counter() - t0:.1f} s")
        for ext in (".bin", ".idx"):
            os.remove(prefix + ext)
        dataset_bytes = pool_bytes(name)
        uri = f"rados://training_data/{name}?id=stoker-train"
        runs = []
        for run in range(args.runs):
            if args.objectstore == "bluestore":
                for osd in range(3):  # one at a time: each rejoins before the next goes
                    restart_osd(osd, cdir)
                    cluster("wait-clean", cdir)
                say("OSDs restarted: BlueStore's cache is empty")
            results, wall = one_run(uri, args, seed=run + 1)
            rates = [r["tokens"] / r["seconds"] for r in results]
            read = sum(r["bytes_read"] for r in results)
            at_open = sum(r["open_bytes"] for r in results)
            runs.append({"ranks": results, "wall_seconds": wall, "bytes_read": read,
                         "open_bytes": at_open})
            say(f"run {run + 1}: per rank {min(rates) / 1e3:.0f}k..{max(rates) / 1e3:.0f}k "
                f"tokens/s, {wall:.1f} s, bytes read {read / dataset_bytes:.3f} x the dataset "
                f"({at_open / dataset_bytes:.3f} x of it at open)")
        per_rank = [statistics.median(run["ranks"][r]["tokens"] / run["ranks"][r]["seconds"]
                                      for run in runs) for r in range(args.ranks)]
        read = statistics.median(run["bytes_read"] for run in runs)
        at_open = statistics.median(run["open_bytes"] for run in runs)
        summary = {
            "objectstore": args.objectstore, "ranks": args.ranks,
            "sequence_length": args.sequence_length, "batch": args.batch,
            "documents": docs, "tokens": tokens, "token_bytes": tokens * 2,
            "dataset_bytes": dataset_bytes, "runs": runs,
            "per_rank_tokens_per_s_median": per_rank,
            "aggregate_tokens_per_s_median": statistics.median(
                sum(r["tokens"] for r in run["ranks"]) / run["wall_seconds"] for run in runs),
            "bytes_read_median": read, "open_bytes_median": at_open,
            "verify": not args.no_verify, "token_block_bytes": args.token_block_bytes,
            "cores": os.cpu_count(),
        }
        json.dump(summary, open(os.environ.get("OUT", "token_rados.json"), "w"), indent=1)
        print(f"{args.ranks} ranks, L = {args.sequence_length}, batch {args.batch}, shuffle on, "
              f"{args.objectstore}, sequence_verify {not args.no_verify}, "
              f"token blocks {args.token_block_bytes or 'none'}, "
              f"medians of {args.runs} runs")
        print("per-rank tokens/s: " + " ".join(f"{x / 1e3:.0f}k" for x in per_rank)
              + f"  (slowest {min(per_rank) / 1e3:.0f}k)")
        print(f"aggregate: {summary['aggregate_tokens_per_s_median'] / 1e6:.2f} M tokens/s")
        print(f"bytes read per epoch: {read / dataset_bytes:.3f} x the dataset's objects "
              f"({dataset_bytes} B), {read / (tokens * 2):.3f} x its token bytes; "
              f"at open (all ranks) {at_open / dataset_bytes:.3f} x")
    finally:
        if started:
            cluster("stop", started)
        else:
            names = subprocess.run(["rados", "--id", "admin", "-p", "training_data", "ls"],
                                   capture_output=True, text=True).stdout.split()
            for n in (x for x in names if x.startswith(name + "/")):
                subprocess.run(["rados", "--id", "admin", "-p", "training_data", "rm", n])
        subprocess.run(["rm", "-rf", tmp])


if __name__ == "__main__":
    main()
