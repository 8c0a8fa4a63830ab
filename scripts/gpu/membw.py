#!/usr/bin/env python3
"""Does a host-to-device copy compete with the CPUs' memory copies?

The loader's device path moves each byte through host memory three times:
the kernel copies it from the page cache into a pinned batch buffer (a read
and a write), and the GPU's DMA reads it again. When `bench gpu-loader`
delivers less into HBM than the host path and the copy engine could each
give alone, this says whether memory bandwidth is where it goes: it times
N threads copying 64 MiB buffers (numpy, which lets go of the GIL) with and
without a pinned H2D copy loop running at the same time on the GPU.

    python3 scripts/gpu/membw.py [--threads 0,4,8,16] [--seconds 3] [--json F]

Prints one row per thread count: host copy GB/s (bytes copied; the memory
traffic is about twice that) alone and with H2D running, and H2D GB/s alone
and beside the threads.

Then (--pipeline) the question that decides how the loader's device stage
should copy: N threads each copy from a source of their own (4 GiB in all,
past any cache) into pinned 32 MiB buffers (a batch of 256 x 128 KiB) and
send them to the GPU, either the whole buffer once it is full (what the
loader does: `late`) or each piece right after it is written, while it is
still in the CPU's caches (`early`, 1 and 4 MiB pieces). GB/s delivered into
HBM, median of --repeats.
"""
import argparse
import json
import threading
import time

import numpy as np
import torch


def host_copies(n, seconds, stop_at, counts, i):
    src = np.full(64 << 20, i + 1, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # touch both
    done = 0
    while time.perf_counter() < stop_at:
        np.copyto(dst, src)
        done += src.nbytes
    counts[i] = done


def h2d_loop(stop_at, out):
    src = torch.empty(1 << 30, dtype=torch.uint8).pin_memory()
    dst = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.Stream()
    chunk = 32 << 20  # a loader batch of 256 x 128 KiB
    with torch.cuda.stream(stream):
        dst.copy_(src, non_blocking=True)
        stream.synchronize()
        done = 0
        t0 = time.perf_counter()
        while time.perf_counter() < stop_at:
            for off in range(0, src.numel(), chunk):
                dst[off:off + chunk].copy_(src[off:off + chunk], non_blocking=True)
            stream.synchronize()
            done += src.numel()
        out["h2d"] = done / (time.perf_counter() - t0) / 1e9


def measure(threads, with_h2d, seconds):
    counts = [0] * threads
    out = {}
    start = time.perf_counter() + 1.0  # buffers made before the clock
    stop_at = start + seconds
    ts = [threading.Thread(target=host_copies, args=(threads, seconds, stop_at, counts, i))
          for i in range(threads)]
    if with_h2d:
        ts.append(threading.Thread(target=h2d_loop, args=(stop_at, out)))
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    # Each copier started counting once its buffers were made (about
    # `start`): its rate over the whole window is a slight underestimate.
    host = sum(counts) / seconds / 1e9 if threads else 0.0
    return host, out.get("h2d", 0.0)


def pipeline(threads, piece, late, seconds):
    """GB/s into HBM: `threads` producers, each with two pinned 32 MiB
    buffers and a stream, copying from its own source into a buffer and
    sending it to the device whole (`late`) or piece by piece."""
    batch = 32 << 20
    src_bytes = (4 << 30) // threads // batch * batch
    done = [0] * threads
    start_at = [0.0]
    # Every producer has its buffers when the clock starts.
    barrier = threading.Barrier(threads + 1, action=lambda: start_at.__setitem__(0, time.perf_counter()))

    def producer(i):
        src = np.full(src_bytes, i + 1, dtype=np.uint8)
        bufs = [torch.empty(batch, dtype=torch.uint8).pin_memory() for _ in range(2)]
        views = [b.numpy() for b in bufs]
        dev = torch.empty(2 * batch, dtype=torch.uint8, device="cuda")
        stream = torch.cuda.Stream()
        events = [None, None]
        barrier.wait()
        stop_at = start_at[0] + seconds
        k = 0
        off = 0
        n = 0
        with torch.cuda.stream(stream):
            while time.perf_counter() < stop_at:
                j = k % 2
                if events[j] is not None:
                    events[j].synchronize()  # the buffer's last copy has landed
                for p in range(0, batch, piece):
                    np.copyto(views[j][p:p + piece], src[off + p:off + p + piece])
                    if not late:
                        dev[j * batch + p:j * batch + p + piece].copy_(
                            bufs[j][p:p + piece], non_blocking=True)
                if late:
                    dev[j * batch:(j + 1) * batch].copy_(bufs[j], non_blocking=True)
                events[j] = torch.cuda.Event()
                events[j].record(stream)
                off = (off + batch) % src_bytes
                k += 1
                n += batch
            stream.synchronize()
        done[i] = n

    ts = [threading.Thread(target=producer, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    barrier.wait()
    for t in ts:
        t.join()
    return sum(done) / (time.perf_counter() - start_at[0]) / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="0,4,8,16")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--json")
    ap.add_argument("--pipeline", default="8,16",
                    help="thread counts for the late/early comparison ('' for none)")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    print(f"{'threads':>7} {'host GB/s alone':>16} {'host GB/s + H2D':>16} "
          f"{'H2D GB/s alone':>15} {'H2D GB/s + host':>16}")
    h2d_alone = measure(0, True, a.seconds)[1]
    for n in [int(x) for x in a.threads.split(",")]:
        host_alone = measure(n, False, a.seconds)[0] if n else 0.0
        host_with, h2d_with = measure(n, True, a.seconds)
        rows.append({"threads": n, "host_alone": host_alone, "host_with_h2d": host_with,
                     "h2d_alone": h2d_alone, "h2d_with_host": h2d_with})
        print(f"{n:>7} {host_alone:>16.1f} {host_with:>16.1f} {h2d_alone:>15.1f} {h2d_with:>16.1f}",
              flush=True)
    piped = []
    if a.pipeline:
        print(f"\n{'threads':>7} {'late (whole 32 MiB)':>20} {'early 4 MiB':>12} {'early 1 MiB':>12}"
              "   GB/s into HBM, median of %d" % a.repeats)
        for n in [int(x) for x in a.pipeline.split(",")]:
            res = {"late": [], "early4": [], "early1": []}
            for _ in range(a.repeats):  # interleaved
                res["late"].append(pipeline(n, 4 << 20, True, a.seconds))
                res["early4"].append(pipeline(n, 4 << 20, False, a.seconds))
                res["early1"].append(pipeline(n, 1 << 20, False, a.seconds))
            med = {k: sorted(v)[len(v) // 2] for k, v in res.items()}
            piped.append({"threads": n, **{k: v for k, v in res.items()}})
            print(f"{n:>7} {med['late']:>20.1f} {med['early4']:>12.1f} {med['early1']:>12.1f}",
                  flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"contention": rows, "pipeline": piped}, f, indent=1)


if __name__ == "__main__":
    main()
