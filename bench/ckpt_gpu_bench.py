#!/usr/bin/env python3
"""Checkpoints of GPU state: stoker against torch.save and torch.distributed.
checkpoint (DCP) on the same disk, with the ceilings measured in the same run
(issue 33; docs/checkpoint.md §9).

State: --gib GiB in GPU memory, model-like: per layer a bf16 weight and two
fp32 optimiser moments (exp_avg, exp_avg_sq) of the same element count.

Ceilings (medians of --repeats):
  d2h       one pinned cudaMemcpy of 1 GiB device -> host (torch, pinned)
  h2d       the same, host -> device
  write     O_DIRECT sequential write of a --ceiling-gib file in --dir, 64 MiB
            blocks, fsync at the end (durable, as a checkpoint must be)
  read      O_DIRECT sequential read of that file

Saves (one untimed warm-up each, then --repeats timed; files removed between):
  torch.save          torch.save(state, file) + fsync
  dcp.save            torch.distributed.checkpoint.save (sync_files: durable)
  dcp.async_save      default stager
  dcp.async_pinned    async_save with DefaultStager(StagingOptions(True, True, True,
                      True)): pinned, shared, cached staging, staged asynchronously
  stoker.save         sync
  stoker.async        snapshot mode: save(async_=True), wait_staged(), wait()
  stoker.bounded      bounded ring (256 MiB): the same calls
For each: stall (the call until it returns: the training loop is blocked),
staged (until the state may change), durable (until it is on disk), GB/s =
bytes / durable.

Restores into GPU memory (page cache dropped first where root):
  torch.load(map_location="cuda:0"), dcp.load into a CUDA state,
  stoker.load(map_location="cuda:0"), stoker.load(into=CUDA state).

    PYTHONPATH=/tmp/stoker-py python3 bench/ckpt_gpu_bench.py --dir /var/tmp/ckgpu \\
        [--gib 8] [--repeats 3] [--json out.json]
"""

import argparse
import json
import mmap
import os
import platform
import shutil
import statistics
import sys
import time
import traceback

import torch

import stoker

GB = 1e9


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


def make_state(gib, device):
    per_layer = 32 << 20  # elements: bf16 weight 64 MiB + two fp32 moments 256 MiB
    layers = max(1, round(gib * (1 << 30) / (per_layer * 10)))
    g = torch.Generator(device=device).manual_seed(1)
    model, optim = {}, {}
    for i in range(layers):
        model[f"layers.{i}.weight"] = torch.randn(per_layer, device=device, generator=g,
                                                  dtype=torch.float32).to(torch.bfloat16)
        optim[f"layers.{i}.exp_avg"] = torch.randn(per_layer, device=device, generator=g)
        optim[f"layers.{i}.exp_avg_sq"] = torch.rand(per_layer, device=device, generator=g)
    torch.cuda.synchronize()
    state = {"model": model, "optim": optim}
    nbytes = sum(t.numel() * t.element_size() for d in state.values() for t in d.values())
    return state, nbytes


def median(xs):
    return statistics.median(xs) if xs else None


def ceiling_copies(repeats):
    n = 1 << 30
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    out = {}
    for name, (dst, src) in {"d2h": (host, dev), "h2d": (dev, host)}.items():
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            t = now()
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            times.append(now() - t)
        out[name] = n / median(times) / GB
    del dev, host
    return out


def ceiling_disk(path, gib, repeats):
    block = 64 << 20
    buf = mmap.mmap(-1, block)
    buf.write(os.urandom(1 << 20) * 64)
    n = int(gib * (1 << 30)) // block
    writes, reads = [], []
    for _ in range(repeats):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
        t = now()
        for _ in range(n):
            os.write(fd, buf)
        os.fsync(fd)
        writes.append(now() - t)
        os.close(fd)
        drop_caches()
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        t = now()
        while os.readv(fd, [buf]) > 0:
            pass
        reads.append(now() - t)
        os.close(fd)
    os.unlink(path)
    return {"write": n * block / median(writes) / GB, "read": n * block / median(reads) / GB}


def disk_read_bytes():
    """Bytes this process (all its threads) had the block layer read."""
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return None


def slice_restore(root, state, repeats):
    """The middle half of every tensor, as a flat ShardedTensor range, loaded
    into GPU memory from a cold page cache: bytes the disk read / the slice's
    bytes (target <= 1.05), and the values checked against the state."""
    into, want = {}, 0
    for k, v in state.items():
        into[k] = {}
        for j, t in v.items():
            n = t.numel()
            local = torch.empty(n // 2, dtype=t.dtype, device=t.device)
            into[k][j] = stoker.ShardedTensor(local, (n,), flat_start=n // 4)
            want += local.numel() * local.element_size()
    ratios, times, cold = [], [], True
    for _ in range(repeats):
        cold = drop_caches() and cold
        before = disk_read_bytes()
        torch.cuda.synchronize()
        t = now()
        stoker.load(root, into=into)
        torch.cuda.synchronize()
        times.append(now() - t)
        ratios.append((disk_read_bytes() - before) / want)
    for k, v in state.items():
        for j, t in v.items():
            n = t.numel()
            if not torch.equal(into[k][j].local, t[n // 4:n // 4 + n // 2]):
                raise AssertionError(f"slice restore: {k}.{j} differs from the saved tensor")
    return {"slice_bytes": want, "read_vs_slice": median(ratios), "s": median(times),
            "GB/s": want / median(times) / GB, "cold": cold}


def fsync_tree(path):
    for root, _, files in os.walk(path):
        for f in files:
            fd = os.open(os.path.join(root, f), os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)


def clear(path):
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.unlink(path)


# DefaultStager's options, best first: (pinned, shared, async staging,
# non-blocking copy). The issue names the first; a torch whose stager fails
# with it (2.11's shared-memory staging raised KeyError: <class 'type'> on
# this state) is measured with the next that works, and the report says which.
STAGER_OPTIONS = [(True, True, True, True), (True, False, True, True), (True, False, False, True)]


def dcp_pinned(dcp_async, stager, options):
    """A save through DefaultStager, one stager kept across saves (its cache
    is what makes the second save onward cheap). Where a save with some
    options fails (torch 2.11's second save raised KeyError: <class 'type'>
    in the stager's deepcopy), the next options are tried with a new stager,
    and the report says which options the figures are for and why the
    others failed."""
    chosen = {"errors": [], "at": 0}

    def run(i):
        while chosen["at"] < len(STAGER_OPTIONS):
            o = STAGER_OPTIONS[chosen["at"]]
            if "fn" not in chosen:
                chosen.update(fn=dcp_async(stager(options(*o))), options=o)
                print(f"dcp.async_pinned: trying StagingOptions{o}", flush=True)
            try:
                return chosen["fn"](i)
            except Exception:  # noqa: BLE001 -- try the next options
                chosen["errors"].append(f"StagingOptions{o}, save {i}: " +
                                        traceback.format_exc(limit=-4))
                print(chosen["errors"][-1], flush=True)
                del chosen["fn"]
                chosen["at"] += 1
        raise RuntimeError("every StagingOptions failed:\n" + "\n".join(chosen["errors"]))
    run.chosen = chosen
    return run


def save_methods(d, state, dcp, stager_cls):
    """name -> fn(i) returning (stall, staged, durable) seconds; and name ->
    what to remove once its repeats are done (the disk holds only what the
    restores read: torch.pt, dcp/, stoker-async/)."""
    m, done = {}, {}

    def torch_save(i):
        p = f"{d}/torch.pt"
        clear(p)
        t = now()
        with open(p, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        e = now() - t
        return e, e, e
    m["torch.save"] = torch_save

    if dcp is not None:
        def dcp_save(i):
            p = f"{d}/dcp"
            clear(p)
            t = now()
            dcp.save(state, checkpoint_id=p)
            e = now() - t
            return e, e, e
        m["dcp.save"] = dcp_save

        def dcp_async(stager):
            def run(i):
                p = f"{d}/dcp-async"
                clear(p)
                t = now()
                r = (dcp.async_save(state, checkpoint_id=p) if stager is None else
                     dcp.async_save(state, checkpoint_id=p, async_stager=stager))
                stall = now() - t
                staging = getattr(r, "staging_completion", None)
                upload = getattr(r, "upload_completion", r)
                if staging is not None:
                    staging.result()
                staged = now() - t
                upload.result()
                return stall, staged, now() - t
            return run
        m["dcp.async_save"] = dcp_async(None)
        done["dcp.async_save"] = lambda: clear(f"{d}/dcp-async")
        if stager_cls is not None:
            m["dcp.async_pinned"] = dcp_pinned(dcp_async, *stager_cls)
            done["dcp.async_pinned"] = lambda: clear(f"{d}/dcp-async")

    def stoker_run(name, **opts):
        c = stoker.Checkpointer(f"{d}/stoker-{name}", **opts)

        def run(i):
            for n in c.list():
                c.remove(n["name"])
            t = now()
            if name == "sync":
                c.save(state, f"s-{i}")
                e = now() - t
                return e, e, e
            h = c.save(state, f"s-{i}", async_=True)
            stall = now() - t
            h.wait_staged()
            staged = now() - t
            h.wait()
            return stall, staged, now() - t
        return run, c
    for name, mode, opts in (("stoker.save", "sync", {}), ("stoker.async", "async", {}),
                             ("stoker.bounded", "bounded", {"device_staging": "bounded"})):
        m[name], c = stoker_run(mode, **opts)
        if mode != "async":  # its pinned staging freed, its files removed
            done[name] = (lambda c=c, mode=mode: (c.close(), clear(f"{d}/stoker-{mode}")))
    return m, done


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--gib", type=float, default=8)
    ap.add_argument("--ceiling-gib", type=float, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default="", help="comma-separated save methods")
    ap.add_argument("--json")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    report = {"machine": {"host": platform.node(), "gpu": torch.cuda.get_device_name(0),
                          "torch": torch.__version__, "python": sys.version.split()[0],
                          "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                          "cpus": os.cpu_count(), "gib": a.gib, "repeats": a.repeats}}
    try:
        import torch.distributed.checkpoint as dcp
    except Exception as e:  # noqa: BLE001
        dcp = None
        report["dcp_missing"] = str(e)
    stager_cls = None
    try:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
        stager_cls = (DefaultStager, StagingOptions)
    except Exception as e:  # noqa: BLE001
        report["stager_missing"] = str(e)

    report["ceilings"] = ceiling_copies(a.repeats)
    report["ceilings"].update(ceiling_disk(f"{a.dir}/ceiling.bin", a.ceiling_gib, a.repeats))
    print("ceilings GB/s:", json.dumps(report["ceilings"]), flush=True)

    state, nbytes = make_state(a.gib, "cuda:0")
    report["state_bytes"] = nbytes
    methods, cleanup = save_methods(a.dir, state, dcp, stager_cls)
    only = [x for x in a.only.split(",") if x]
    saves = {}
    for name, fn in methods.items():
        if only and name not in only:
            continue
        try:
            fn(0)  # warm-up: allocations, caches, staging
            runs = [fn(i + 1) for i in range(a.repeats)]
        except Exception as e:  # noqa: BLE001 -- a peer that fails is reported, not fatal
            cleanup.get(name, lambda: None)()
            saves[name] = {"error": f"{type(e).__name__}: {e}",
                           "traceback": traceback.format_exc(limit=-6)}
            print(f"{name}: {saves[name]['traceback']}", flush=True)
            continue
        cleanup.get(name, lambda: None)()
        r = {k: median([x[j] for x in runs]) for j, k in enumerate(("stall", "staged", "durable"))}
        r["GB/s"] = nbytes / r["durable"] / GB
        saves[name] = r
        print(f"{name:18s} stall {r['stall'] * 1e3:9.1f} ms  staged {r['staged']:7.3f} s  "
              f"durable {r['durable']:7.3f} s  {r['GB/s']:6.2f} GB/s", flush=True)
    report["saves"] = saves
    chosen = getattr(methods.get("dcp.async_pinned"), "chosen", {})
    if chosen:
        report["dcp_pinned_staging"] = {"options": chosen.get("options"),
                                        "failed": chosen.get("errors")}

    # Restores into GPU memory, from the last save of each.
    restores = {}
    target = {k: {j: torch.empty_like(t) for j, t in v.items()} for k, v in state.items()}

    def timed(fn):
        times = []
        for _ in range(a.repeats):
            cold = drop_caches()
            torch.cuda.synchronize()
            t = now()
            fn()
            torch.cuda.synchronize()
            times.append(now() - t)
        return {"s": median(times), "GB/s": nbytes / median(times) / GB, "cold": cold}
    jobs = {}
    if os.path.exists(f"{a.dir}/torch.pt"):
        jobs["torch.load"] = lambda: torch.load(f"{a.dir}/torch.pt", map_location="cuda:0")
    if dcp is not None and os.path.isdir(f"{a.dir}/dcp"):
        jobs["dcp.load"] = lambda: dcp.load(target, checkpoint_id=f"{a.dir}/dcp")
    stoker_root = f"{a.dir}/stoker-async"
    if os.path.isdir(stoker_root):
        jobs["stoker.load(cuda)"] = lambda: stoker.load(stoker_root, map_location="cuda:0")
        jobs["stoker.load(into)"] = lambda: stoker.load(stoker_root, into=target)
    for name, fn in jobs.items():
        try:
            restores[name] = timed(fn)
        except Exception as e:  # noqa: BLE001
            restores[name] = {"error": f"{type(e).__name__}: {e}"}
        print(f"{name:18s} {json.dumps(restores[name])}", flush=True)
    report["restores"] = restores
    if os.path.isdir(stoker_root):
        try:
            report["slice_restore"] = slice_restore(stoker_root, state, a.repeats)
        except Exception as e:  # noqa: BLE001
            report["slice_restore"] = {"error": f"{type(e).__name__}: {e}",
                                       "traceback": traceback.format_exc(limit=-6)}
        print("slice restore:", json.dumps(report["slice_restore"]), flush=True)

    # The targets, as ratios.
    c = report["ceilings"]
    t = {}
    s = saves
    if "stoker.async" in s and "stall" in s["stoker.async"]:
        t["stoker_async_stall_ms"] = s["stoker.async"]["stall"] * 1e3
        if "stall" in s.get("dcp.async_pinned", {}):
            t["stall_vs_dcp_pinned"] = s["stoker.async"]["stall"] / s["dcp.async_pinned"]["stall"]
        t["durable_vs_ceiling"] = s["stoker.async"]["GB/s"] / min(c["d2h"], c["write"])
    if "GB/s" in restores.get("stoker.load(into)", {}):
        t["restore_vs_ceiling"] = restores["stoker.load(into)"]["GB/s"] / min(c["read"], c["h2d"])
    if "read_vs_slice" in report.get("slice_restore", {}):
        t["slice_read_vs_slice_bytes"] = report["slice_restore"]["read_vs_slice"]
    report["targets"] = t
    print("targets:", json.dumps(t), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    stoker.checkpoint.release()
    for p in os.listdir(a.dir):
        clear(os.path.join(a.dir, p))


if __name__ == "__main__":
    main()
