#!/usr/bin/python3
"""CPU state: stoker against torch.save (and DCP where this torch has it), and
resharding: a state saved by 4 rank processes, loaded on 2, 3 and 8 (issue 33).

State: --gib GiB, model-like (per layer a bf16 weight and two fp32 moments).
  save      stoker.save (sync, durable), stoker.save(async_=True) until it
            returns (the stall), torch.save + fsync, dcp.save (if present)
  load      stoker.load, torch.load (page cache dropped first where root)
  reshard   4 processes each save a quarter of every tensor's rows as
            stoker.ShardedTensor; then, for W' in 2, 3, 8, every rank of W'
            loads its rows (one process loads each rank in turn): the time of
            all of W' loads, bytes read checked equal in the test suite
Medians of --repeats.

    PYTHONPATH=build/python /usr/bin/python3 bench/ckpt_cpu_compare.py --dir /var/tmp/ckcpu \\
        [--gib 1] [--repeats 3]
"""

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

import torch

import stoker


def now():
    return time.perf_counter()


def drop_caches():
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def make_state(gib):
    per_layer = 8 << 20
    layers = max(1, round(gib * (1 << 30) / (per_layer * 10)))
    g = torch.Generator().manual_seed(1)
    s = {}
    for i in range(layers):
        s[f"layers.{i}.weight"] = torch.randn(per_layer // 1024, 1024, generator=g).to(
            torch.bfloat16)
        s[f"layers.{i}.exp_avg"] = torch.randn(per_layer // 1024, 1024, generator=g)
        s[f"layers.{i}.exp_avg_sq"] = torch.rand(per_layer // 1024, 1024, generator=g)
    return s


def split(n, parts, i):
    base, extra = divmod(n, parts)
    lo = i * base + min(i, extra)
    return lo, lo + base + (1 if i < extra else 0)


RANK = """
import sys, torch, stoker
sys.path.insert(0, {bench!r})
from ckpt_cpu_compare import make_state, split
uri, world, rank, gib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
s = {{}}
for k, t in make_state(gib).items():
    lo, hi = split(t.shape[0], world, rank)
    s[k] = stoker.ShardedTensor(t[lo:hi].clone(), t.shape, (lo, 0))
stoker.save(s, uri, step=1, rank=rank, world_size=world)
"""


def median(f, repeats):
    times = []
    for _ in range(repeats):
        times.append(f())
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--gib", type=float, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    state = make_state(a.gib)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    print(f"# {platform.node()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, state {nbytes / 2**30:.2f} GiB, "
          f"medians of {a.repeats}; page cache dropped before loads: {drop_caches()}")
    try:
        import torch.distributed.checkpoint as dcp
    except ImportError:
        dcp = None
        print(f"# torch {torch.__version__} has no torch.distributed.checkpoint: no DCP figures")
    rows = []
    c = stoker.Checkpointer(f"{a.dir}/stoker")
    n = [0]

    def stoker_save():
        n[0] += 1
        t = now()
        c.save(state, f"s-{n[0]}", keep_last=1)
        return now() - t

    def stoker_async_stall():
        n[0] += 1
        t = now()
        h = c.save(state, f"s-{n[0]}", async_=True, keep_last=1)
        e = now() - t
        h.wait()
        return e

    def torch_save():
        t = now()
        with open(f"{a.dir}/t.pt", "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        return now() - t

    def stoker_load():
        drop_caches()
        t = now()
        c.load()
        return now() - t

    def torch_load():
        drop_caches()
        t = now()
        torch.load(f"{a.dir}/t.pt")
        return now() - t

    stoker_async_stall()  # the first allocates the staging area
    jobs = [("stoker.save (durable)", stoker_save), ("stoker.save async: stall", stoker_async_stall),
            ("torch.save + fsync", torch_save)]
    if dcp is not None:
        def dcp_save():
            shutil.rmtree(f"{a.dir}/dcp", ignore_errors=True)
            t = now()
            dcp.save(state, checkpoint_id=f"{a.dir}/dcp")
            return now() - t
        jobs.append(("dcp.save", dcp_save))
    jobs += [("stoker.load", stoker_load), ("torch.load", torch_load)]
    for name, f in jobs:
        s = median(f, a.repeats)
        rows.append((name, s, nbytes / s / 1e9))

    uri = f"{a.dir}/reshard"
    code = RANK.format(bench=os.path.dirname(os.path.abspath(__file__)))
    # Not timed: each process also builds the whole state to cut its rows.
    procs = [subprocess.Popen([sys.executable, "-c", code, uri, "4", str(r), str(a.gib)])
             for r in range(4)]
    assert all(p.wait() == 0 for p in procs)
    for world in (2, 3, 8):
        def load_all():
            drop_caches()
            t = now()
            for rank in range(world):
                into = {}
                for k, v in state.items():
                    lo, hi = split(v.shape[0], world, rank)
                    into[k] = stoker.ShardedTensor(torch.empty(hi - lo, v.shape[1], dtype=v.dtype),
                                                   v.shape, (lo, 0))
                stoker.load(uri, rank=rank, world_size=world, into=into)
            return now() - t
        s = median(load_all, a.repeats)
        rows.append((f"reshard: load 4 -> {world} (all ranks)", s, nbytes / s / 1e9))
    print("| what | seconds | GB/s |\n| --- | --- | --- |")
    for name, s, r in rows:
        print(f"| {name} | {s:.3f} | {r:.2f} |")
    stoker.checkpoint.release()
    shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
