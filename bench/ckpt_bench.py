#!/usr/bin/python3
"""Checkpoints: stoker.save/stoker.load against the disk's limit (fio) and
against torch.save/torch.load, on the same disk, in one run.

For each state size (default 1 GiB and 8 GiB: a model-like state dict of
float32 layers, 16 MiB weight + small bias and norm tensors each, filled
with random values):

  limit     fio sequential write (end_fsync=1: durable at the end, as a
            checkpoint must be) and sequential read (--readonly, page cache
            dropped first), of one file of the state's size, in --dir; 1 job
            and --fio-jobs jobs, each through the page cache (direct=0) and
            past it (direct=1): the fastest of the four counts as the limit
  stoker    stoker.save (sync, durable: every chunk fsynced and committed),
            then stoker.load with the page cache dropped first (cold): into
            new memory, and into an existing state of the same tensors
            (load(into=...), as a job resuming into its model does)
  torch     torch.save of the same state dict to a file in --dir (as users
            call it: no fsync; and with an fsync after it, durable), then
            torch.load, cold; and torch.load followed by copying it into the
            existing state (what model.load_state_dict does)
  new proc  stoker.load and torch.load of the same state, each in a new
            process after a cache drop (a resuming job: nothing of the state
            in its memory), alternating; only the load itself is timed
  touch     the first touch of new memory of the state's size right after
            the page cache is dropped (what a load into new memory pays on
            top of its reads)
  stall     how long the training loop stops: stoker.save(async_=True) until
            it returns (the snapshot into the reused staging area; the first
            async save, which also allocates it, is reported apart), a sync
            stoker.save, torch.save; the reference is copying the state once
            in memory (a torch clone of every tensor)

Where fio is not installed (or with --peer dd), the limit comes from dd
instead: the same files, jobs and block size, `conv=fsync` for writes and
`oflag/iflag=direct` for direct=1; dd writes zeros.

With --rados URI also: `rados bench write` and `seq` on the URI's pool (4 MiB
objects, 8 in flight, as many objects as the state holds) as the limit, and
stoker.save/stoker.load to the URI (reads not cold: the OSDs keep data in
their own memory).

Every figure is the median of --repeats runs. The page cache is dropped
(`echo 3 > /proc/sys/vm/drop_caches`, root only) before each cold read; without
root the reads are warm and the table says so. GB/s are 10^9 bytes/s; sizes
are GiB.

    PYTHONPATH=build/python /usr/bin/python3 bench/ckpt_bench.py --dir /var/tmp/ckbench \\
        [--sizes 1,8] [--repeats 3] [--rados 'rados://checkpoint/bench?id=stoker-train'] \\
        [--json out.json]
"""

import argparse
import gc
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid
from pathlib import Path

import torch

import stoker
from core_bench import drop_caches  # True if it could (root)

GiB = 1 << 30
LAYER_IN, LAYER_OUT = 1024, 4096  # a 16 MiB float32 weight per layer


# ---- the state -------------------------------------------------------------------


def make_state(nbytes):
    """A model-like state dict of about `nbytes` (float32 layers of ~16 MiB)."""
    per_layer = 4 * (LAYER_IN * LAYER_OUT + LAYER_OUT + 2 * LAYER_IN)
    layers = max(1, round(nbytes / per_layer))
    gen = torch.Generator().manual_seed(0)
    state = {}
    for i in range(layers):
        state[f"layers.{i}.weight"] = torch.empty(LAYER_OUT, LAYER_IN).uniform_(generator=gen)
        state[f"layers.{i}.bias"] = torch.empty(LAYER_OUT).uniform_(generator=gen)
        state[f"layers.{i}.norm.weight"] = torch.ones(LAYER_IN)
        state[f"layers.{i}.norm.bias"] = torch.zeros(LAYER_IN)
    state["step"] = 1000
    return state


def state_bytes(state):
    return sum(t.numel() * t.element_size() for t in state.values() if isinstance(t, torch.Tensor))


# ---- helpers ---------------------------------------------------------------------


def timed(fn):
    t0 = time.perf_counter()
    result = fn()
    return time.perf_counter() - t0, result


def median(values):
    return statistics.median(values) if values else None


def gbps(nbytes, seconds):
    return nbytes / seconds / 1e9 if seconds else None


def log(*args):
    print(*args, file=sys.stderr, flush=True)


# ---- peers -----------------------------------------------------------------------


def fio(directory, rw, nbytes, jobs, direct):
    """fio's sequential bandwidth (bytes/s) over `jobs` files that sum to nbytes."""
    cmd = ["fio", "--name=ckpt", f"--directory={directory}", f"--rw={rw}", "--bs=4M",
           f"--size={nbytes // jobs}", f"--numjobs={jobs}", "--group_reporting",
           "--ioengine=psync", f"--direct={int(direct)}", "--output-format=json"]
    if rw == "write":
        cmd += ["--end_fsync=1"]
    else:
        cmd += ["--readonly"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    job = json.loads(out[out.index("{"):])["jobs"][0]
    return job["write" if rw == "write" else "read"]["bw_bytes"]


def dd(directory, rw, nbytes, jobs, direct):
    """The same measurement as fio() with coreutils' dd, for machines without
    fio: `jobs` dd processes at once, each streaming its own file of
    nbytes/jobs in 4 MiB blocks (writes of zeros, fsynced at the end;
    reads with --readonly's effect). Bytes/s over the wall clock of all."""
    count = max(1, nbytes // jobs // (4 << 20))
    flag = ["oflag=direct"] if direct and rw == "write" else []
    flag += ["iflag=direct"] if direct and rw == "read" else []
    cmds = []
    for j in range(jobs):
        f = Path(directory, f"dd-{j}")
        if rw == "write":
            cmds.append(["dd", "if=/dev/zero", f"of={f}", "bs=4M", f"count={count}",
                         "conv=fsync"] + flag)
        else:
            cmds.append(["dd", f"if={f}", "of=/dev/null", "bs=4M"] + flag)
    t0 = time.perf_counter()
    procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for c in cmds]
    for p, c in zip(procs, cmds):
        _, err = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(c)}: {err.decode(errors='replace').strip()}")
    return count * (4 << 20) * jobs / (time.perf_counter() - t0)


PEERS = {"fio": fio, "dd": dd}


def fio_limits(directory, nbytes, repeats, jobs_options, cold, peer=fio):
    """Median write and read bandwidth for each job count, through the page
    cache and past it (O_DIRECT); the best of them counts. `peer` is fio or,
    where fio is not installed, dd."""
    best = {"write": 0.0, "read": 0.0}
    detail = {}
    for jobs in jobs_options:
        for direct in (False, True):
            runs = {"write": [], "read": []}
            for _ in range(repeats):
                d = Path(directory, f"fio-{jobs}")
                d.mkdir()
                runs["write"].append(peer(d, "write", nbytes, jobs, direct))
                if cold:
                    drop_caches()
                runs["read"].append(peer(d, "read", nbytes, jobs, direct))
                shutil.rmtree(d)
            key = f"{jobs} job(s), direct={int(direct)}"
            detail[key] = {k: median(v) for k, v in runs.items()}
            for k in best:
                best[k] = max(best[k], detail[key][k])
            log(f"  {peer.__name__} {key}: write {detail[key]['write'] / 1e9:.3f} GB/s, "
                f"read {detail[key]['read'] / 1e9:.3f} GB/s")
    return best, detail


def rados_args(uri):
    """(pool, ['--id', ID, '--conf', CONF]) from a rados:// URI."""
    u = urllib.parse.urlsplit(uri)
    q = dict(urllib.parse.parse_qsl(u.query))
    args = []
    if "id" in q:
        args += ["--id", q["id"]]
    if "conf" in q:
        args += ["--conf", q["conf"]]
    elif os.environ.get("CEPH_CONF"):
        args += ["--conf", os.environ["CEPH_CONF"]]
    if "keyring" in q:
        args += ["--keyring", q["keyring"]]
    return u.netloc, args


def rados_bench(uri, nbytes, repeats):
    pool, args = rados_args(uri)
    objects = max(1, nbytes // (4 << 20))
    runs = {"write": [], "seq": []}
    for _ in range(repeats):
        run = f"ckbench-{uuid.uuid4().hex[:8]}"
        base = ["rados", *args, "-p", pool]
        w = subprocess.run(base + ["bench", "600", "write", "-b", "4M", "-t", "8", "--no-cleanup",
                                   "--max-objects", str(objects), "--run-name", run,
                                   "--format", "json"],
                           check=True, capture_output=True, text=True).stdout
        runs["write"].append(float(json.loads(w[w.index("{"):])["bandwidth"]) * 2**20)
        r = subprocess.run(base + ["bench", "600", "seq", "-t", "8", "--run-name", run,
                                   "--format", "json"],
                           check=True, capture_output=True, text=True).stdout
        runs["seq"].append(float(json.loads(r[r.index("{"):])["bandwidth"]) * 2**20)
        subprocess.run(base + ["cleanup", "--run-name", run], check=True, capture_output=True)
    return {k: median(v) for k, v in runs.items()}


# ---- the measurements --------------------------------------------------------------


def bench_clone(state, repeats):
    times = []
    for _ in range(repeats):
        t, copy = timed(lambda: {k: v.clone() if isinstance(v, torch.Tensor) else v
                                 for k, v in state.items()})
        times.append(t)
        del copy
        gc.collect()
    return median(times)


def available_memory():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def existing_state(state):
    """A state of the same tensors in memory already in use (zeros, every page
    touched): what a resuming job holds before it loads."""
    return {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else v
            for k, v in state.items()}


def bench_stoker(state, root, repeats, cold, into):
    """Sync save, (cold) load and (cold) load into `into` times, medians."""
    c = stoker.Checkpointer(root)
    saves, loads, loads_into = [], [], []
    for i in range(repeats):
        name = f"sync-{i}"
        t, _ = timed(lambda: c.save(state, name))
        saves.append(t)
        if cold:
            drop_caches()
        t, back = timed(lambda: c.load(name))
        loads.append(t)
        assert torch.equal(back["layers.0.weight"], state["layers.0.weight"])
        del back
        gc.collect()
        if into is not None:
            into["layers.0.weight"].zero_()
            if cold:
                drop_caches()
            t, _ = timed(lambda: c.load(name, into=into))
            loads_into.append(t)
            assert torch.equal(into["layers.0.weight"], state["layers.0.weight"])
        c.remove(name)
    c.close()
    return median(saves), median(loads), median(loads_into)


# Run in a new process: imports first, then the timed load, then a check that
# the bytes came back (a digest of one tensor against the parent's).
_FRESH_LOAD = r"""
import hashlib, sys, time, torch
kind, path, key, want = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
if kind == "stoker":
    import stoker
    c = stoker.Checkpointer(path)
    t0 = time.perf_counter()
    state = c.load("fresh")
else:
    t0 = time.perf_counter()
    state = torch.load(path)
t = time.perf_counter() - t0
got = hashlib.sha256(state[key].numpy().tobytes()).hexdigest()
assert got == want, (kind, key, got, want)
print(t)
"""


def bench_fresh_process(state, work, repeats, cold):
    """A resuming job's load: a new process (new memory, nothing of the state
    in it) loads the checkpoint after a cache drop; stoker.load and
    torch.load alternate, one process each. Medians of the timed load alone
    (imports excluded)."""
    key = "layers.0.weight"
    want = hashlib.sha256(state[key].numpy().tobytes()).hexdigest()
    root = str(Path(work, "stoker-fresh"))
    c = stoker.Checkpointer(root)
    c.save(state, "fresh")
    c.close()
    pt = Path(work, "torch-fresh.pt")
    torch.save(state, pt)
    os.sync()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    times = {"stoker": [], "torch": []}
    for _ in range(repeats):
        for kind, path in (("stoker", root), ("torch", str(pt))):
            if cold:
                drop_caches()
            out = subprocess.run([sys.executable, "-c", _FRESH_LOAD, kind, path, key, want],
                                 check=True, capture_output=True, text=True, env=env).stdout
            times[kind].append(float(out.split()[-1]))
    shutil.rmtree(root, ignore_errors=True)
    pt.unlink()
    return median(times["stoker"]), median(times["torch"])


def bench_fresh_touch(nbytes, repeats, cold):
    """Seconds to fault in `nbytes` of new memory right after the page cache is
    dropped, as a load into new memory meets it: on VMs that hand freed
    memory back to the host (free page reporting), each fresh page is a host
    fault too. Written from as many threads as torch uses."""
    times = []
    for _ in range(repeats):
        if cold:
            drop_caches()
        t, m = timed(lambda: torch.empty(nbytes, dtype=torch.uint8).fill_(1))
        times.append(t)
        del m
    return median(times)


def bench_async(state, root, repeats):
    """First async stall, steady-state stall and time to durable, medians."""
    c = stoker.Checkpointer(root)
    first, handle = timed(lambda: c.save(state, "async-warmup", async_=True))
    stalls, totals = [], []
    for i in range(repeats):
        # A save waits for the previous one (they share the staging area):
        # wait outside the timed part, as a training loop would have by now.
        handle.wait()
        t0 = time.perf_counter()
        handle = c.save(state, f"async-{i}", async_=True)
        stalls.append(time.perf_counter() - t0)
        handle.wait()
        totals.append(time.perf_counter() - t0)
    for entry in c.list():
        c.remove(entry["name"])
    c.close()
    return first, median(stalls), median(totals)


def bench_torch(state, directory, repeats, cold, into):
    """torch.save (no fsync), torch.save + fsync, torch.load (cold), torch.load
    copied into `into` (cold), medians."""
    saves, durable, loads, loads_into = [], [], [], []
    path = Path(directory, "torch-state.pt")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.save(state, path)
        saves.append(time.perf_counter() - t0)
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        durable.append(time.perf_counter() - t0)
        if cold:
            drop_caches()
        t, back = timed(lambda: torch.load(path))
        loads.append(t)
        del back
        gc.collect()
        if cold:
            drop_caches()
        if into is None:
            path.unlink()
            os.sync()
            continue
        t0 = time.perf_counter()
        back = torch.load(path)
        with torch.no_grad():  # as load_state_dict copies into the parameters
            for k, v in back.items():
                if isinstance(v, torch.Tensor):
                    into[k].copy_(v)
        loads_into.append(time.perf_counter() - t0)
        del back
        gc.collect()
        path.unlink()
        os.sync()
    return median(saves), median(durable), median(loads), median(loads_into)


def run_size(size_gib, args, cold):
    log(f"state of {size_gib} GiB: making it")
    state = make_state(int(size_gib * GiB))
    nbytes = state_bytes(state)
    work = Path(args.dir, f"ckbench-{os.getpid()}")
    work.mkdir(parents=True)
    r = {"size_gib": size_gib, "bytes": nbytes, "tensors": len(state) - 1}
    try:
        log("  clone (reference)")
        r["clone_s"] = bench_clone(state, args.repeats)
        log(f"  {args.peer}")
        limits, detail = fio_limits(work, nbytes, args.repeats, sorted({1, args.fio_jobs}), cold,
                                    PEERS[args.peer])
        r["fio_write_Bps"], r["fio_read_Bps"] = limits["write"], limits["read"]
        r["fio_by_jobs"] = detail
        r["peer"] = args.peer  # the fio_* figures are this tool's
        # The existing state lives only while a load into it is measured, and
        # only where the state, it and a loaded copy fit in memory at once.
        fits = 3.5 * nbytes < available_memory()
        into = existing_state(state) if fits else None
        log("  stoker sync save + load")
        r["stoker_save_s"], r["stoker_load_s"], r["stoker_load_into_s"] = bench_stoker(
            state, str(work / "stoker"), args.repeats, cold, into)
        del into
        gc.collect()
        log("  stoker.load and torch.load, each in a new process")
        r["fresh_stoker_load_s"], r["fresh_torch_load_s"] = bench_fresh_process(
            state, work, args.repeats, cold)
        log("  first touch of new memory after a cache drop")
        r["fresh_touch_s"] = bench_fresh_touch(nbytes, args.repeats, cold)
        log("  stoker async save")
        r["async_first_stall_s"], r["async_stall_s"], r["async_total_s"] = bench_async(
            state, str(work / "stoker-async"), args.repeats)
        log("  torch.save + torch.load")
        into = existing_state(state) if fits else None
        r["torch_save_s"], r["torch_save_fsync_s"], r["torch_load_s"], r["torch_load_into_s"] = \
            bench_torch(state, work, args.repeats, cold, into)
        if args.rados:
            log("  rados bench")
            rb = rados_bench(args.rados, nbytes, args.repeats)
            r["rados_write_Bps"], r["rados_seq_Bps"] = rb["write"], rb["seq"]
            log("  stoker on RADOS")
            uri = _rados_root(args.rados, f"ckbench-{uuid.uuid4().hex[:8]}")
            r["rados_save_s"], r["rados_load_s"], r["rados_load_into_s"] = bench_stoker(
                state, uri, args.repeats, False, into)
        del into
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return r


def _rados_root(uri, leaf):
    u = urllib.parse.urlsplit(uri)
    path = u.path.rstrip("/") + "/" + leaf
    return urllib.parse.urlunsplit((u.scheme, u.netloc, path, u.query, ""))


# ---- the report ------------------------------------------------------------------


def report(results, cold):
    read_kind = "cold" if cold else "WARM (page cache not dropped: not root)"
    peer = results[0].get("peer", "fio") if results else "fio"
    lines = [f"reads: {read_kind}; medians; GB/s = 10^9 B/s; the disk's limit from {peer}", ""]
    lines.append("| state | fio write | stoker save | ratio | fio read | stoker load | ratio | "
                 "torch.save | torch.save+fsync | torch.load | save vs torch.save |")
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        n = r["bytes"]
        lines.append(
            f"| {r['size_gib']} GiB | {r['fio_write_Bps'] / 1e9:.3f} | "
            f"{gbps(n, r['stoker_save_s']):.3f} | "
            f"{gbps(n, r['stoker_save_s']) * 1e9 / r['fio_write_Bps']:.0%} | "
            f"{r['fio_read_Bps'] / 1e9:.3f} | {gbps(n, r['stoker_load_s']):.3f} | "
            f"{gbps(n, r['stoker_load_s']) * 1e9 / r['fio_read_Bps']:.0%} | "
            f"{gbps(n, r['torch_save_s']):.3f} | {gbps(n, r['torch_save_fsync_s']):.3f} | "
            f"{gbps(n, r['torch_load_s']):.3f} | "
            f"{r['torch_save_s'] / r['stoker_save_s']:.2f}× "
            f"({r['torch_save_fsync_s'] / r['stoker_save_s']:.2f}× with fsync) |")
    lines += ["", "A load into new memory also faults that memory in; right after the "
              "cache drop it took (seconds, one pass over new memory of the state's size): " +
              ", ".join(f"{r['size_gib']} GiB {r['fresh_touch_s']:.2f} s "
                        f"(the state at fio's read rate: {r['bytes'] / r['fio_read_Bps']:.2f} s)"
                        for r in results if "fresh_touch_s" in r)]
    lines += ["", "Loading into an existing state (load(into=...) vs torch.load + copy, as "
              "load_state_dict does):", ""]
    lines.append("| state | fio read | stoker load into | ratio | torch.load + copy | "
                 "stoker vs torch |")
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        n = r["bytes"]
        if r["stoker_load_into_s"] is None:
            lines.append(f"| {r['size_gib']} GiB | not measured: three copies of the state do "
                         "not fit in memory | | | | |")
            continue
        li = gbps(n, r["stoker_load_into_s"])
        lines.append(
            f"| {r['size_gib']} GiB | {r['fio_read_Bps'] / 1e9:.3f} | {li:.3f} | "
            f"{li * 1e9 / r['fio_read_Bps']:.0%} | {gbps(n, r['torch_load_into_s']):.3f} | "
            f"{r['torch_load_into_s'] / r['stoker_load_into_s']:.2f}× |")
    lines += ["", "Loading in a new process, as a resuming job does (new memory; stoker.load vs "
              "torch.load, one process each, alternating):", ""]
    lines.append("| state | fio read | stoker load | ratio | torch.load | stoker vs torch |")
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        if "fresh_stoker_load_s" not in r:
            continue
        n = r["bytes"]
        fl = gbps(n, r["fresh_stoker_load_s"])
        lines.append(
            f"| {r['size_gib']} GiB | {r['fio_read_Bps'] / 1e9:.3f} | {fl:.3f} | "
            f"{fl * 1e9 / r['fio_read_Bps']:.0%} | {gbps(n, r['fresh_torch_load_s']):.3f} | "
            f"{r['fresh_torch_load_s'] / r['fresh_stoker_load_s']:.2f}× |")
    lines += ["", "Training stall (seconds the caller waits):", ""]
    lines.append("| state | clone once | async save | ratio to clone | first async save | "
                 "async until durable | sync save | torch.save | async vs torch.save |")
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        lines.append(
            f"| {r['size_gib']} GiB | {r['clone_s']:.3f} | {r['async_stall_s']:.3f} | "
            f"{r['async_stall_s'] / r['clone_s']:.2f}× | {r['async_first_stall_s']:.3f} | "
            f"{r['async_total_s']:.3f} | {r['stoker_save_s']:.3f} | {r['torch_save_s']:.3f} | "
            f"{r['torch_save_s'] / r['async_stall_s']:.1f}× |")
    if any("rados_write_Bps" in r for r in results):
        lines += ["", "RADOS:", ""]
        lines.append("| state | rados bench write | stoker save | ratio | rados bench seq | "
                     "stoker load | ratio | stoker load into | ratio |")
        lines.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in results:
            if "rados_write_Bps" not in r:
                continue
            n = r["bytes"]
            s, l_ = gbps(n, r["rados_save_s"]), gbps(n, r["rados_load_s"])
            lines.append(
                f"| {r['size_gib']} GiB | {r['rados_write_Bps'] / 1e9:.3f} | {s:.3f} | "
                f"{s * 1e9 / r['rados_write_Bps']:.0%} | {r['rados_seq_Bps'] / 1e9:.3f} | "
                f"{l_:.3f} | {l_ * 1e9 / r['rados_seq_Bps']:.0%} | "
                + (f"{gbps(n, r['rados_load_into_s']):.3f} | "
                   f"{gbps(n, r['rados_load_into_s']) * 1e9 / r['rados_seq_Bps']:.0%} |"
                   if r["rados_load_into_s"] else "| |"))
    text = "\n".join(lines)
    return text if peer == "fio" else text.replace("fio", peer)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", default=None,
                   help="where to write (default: a new folder under /var/tmp); one disk")
    p.add_argument("--sizes", default="1,8", help="state sizes in GiB, comma-separated")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--fio-jobs", type=int, default=4,
                   help="fio is also run with this many jobs; the faster counts")
    p.add_argument("--peer", choices=["auto", "fio", "dd"], default="auto",
                   help="the disk's limit from fio, or from dd where fio is not installed "
                        "(auto: fio if on PATH)")
    p.add_argument("--rados", default=None, help="a rados:// root to measure as well")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args()
    sizes = [float(s) for s in args.sizes.split(",") if s]
    if args.peer == "auto":
        args.peer = "fio" if shutil.which("fio") else "dd"
        if args.peer == "dd":
            log("fio is not installed: the disk's limit comes from dd (the tables say fio)")
    own_dir = args.dir is None
    if own_dir:
        args.dir = tempfile.mkdtemp(prefix="stoker-ckbench-", dir="/var/tmp")
    cold = drop_caches()
    if not cold:
        log("not root: cannot drop the page cache, reads will be warm")
    results = []
    try:
        for size in sizes:
            results.append(run_size(size, args, cold))
            gc.collect()
    finally:
        if own_dir:
            shutil.rmtree(args.dir, ignore_errors=True)
    text = report(results, cold)
    print(text)
    if args.json:
        machine = {"cpus": os.cpu_count(), "platform": platform.platform(),
                   "torch": torch.__version__, "stoker": stoker.__version__,
                   "load_average": os.getloadavg()}
        Path(args.json).write_text(json.dumps({"machine": machine, "cold_reads": cold,
                                               "args": vars(args), "results": results},
                                              indent=2, default=str))


if __name__ == "__main__":
    main()
