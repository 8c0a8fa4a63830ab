#!/usr/bin/python3
"""Metrics overhead: loader throughput with metrics on vs off, and a node scrape.

    PYTHONPATH=build/python /usr/bin/python3 bench/metrics_bench.py --stoker build/stoker

1. One dataset (raw samples, in /dev/shm so that storage is not what is
   measured), read by stoker.Loader epoch after epoch in one process,
   alternating metrics off (a plain Loader) and on (metering store, metered
   loader, the timeline, a file published every second): each round opens
   one loader per side that reads --epochs epochs, the first not timed;
   medians of --rounds rounds each, and their ratio (target >= 0.99).
2. --ranks processes with metrics on, each having loaded, stepped and saved
   a checkpoint (so each publishes every family), and `stoker exporter`
   serving them: the latency of --scrapes scrapes (median, max) and the
   series count (targets <= 50 ms, <= 2,000 series for 8 ranks).
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import stoker


def make_dataset(root, samples, sample_bytes):
    src = Path(root) / "src"
    for c in range(4):
        (src / f"c{c}").mkdir(parents=True)
    rnd = os.urandom(sample_bytes)
    for i in range(samples):
        (src / f"c{i % 4}" / f"{i:06d}.bin").write_bytes(rnd[i % 97:] + rnd[:i % 97])
    dst = Path(root) / "ds"
    stoker.pack(src, dst)
    shutil.rmtree(src)
    return str(dst)


def epoch_rate(uri, batch, threads, epochs=1):
    """(samples/s of wall time, samples per CPU second of the whole process):
    one loader reads `epochs` epochs; with more than one, the first is not
    timed (opening, thread start and the first allocations are a job's
    one-time costs) and the rest are timed together."""
    loader = stoker.Loader(uri, batch, threads=threads)
    n, dt, dc = 0, 0.0, 0.0
    for e in range(epochs):
        loader.set_epoch(e)
        t, c = time.perf_counter(), time.process_time()
        k = 0
        for b in loader:
            k += len(b["sample_ids"])
            if stoker.metrics._stoker._timeline_active():
                stoker.metrics.step()
        if e > 0 or epochs == 1:
            dt += time.perf_counter() - t
            dc += time.process_time() - c
            n += k
    loader.close()
    return n / dt, n / dc


CHILD = r"""
import sys, time, numpy as np, stoker
metrics_dir, uri, ckpt, rank = sys.argv[1:5]
stoker.metrics.enable(dir=metrics_dir, job="bench", rank=int(rank))
stoker.metrics.start()
for b in stoker.Loader(uri, 64, threads=1, rank=int(rank), world_size=8):
    with stoker.phase("compute"):
        pass
    stoker.metrics.step()
stoker.save({"w": np.ones(100)}, ckpt + rank, step=1)
print("ready", flush=True)
sys.stdin.read()
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--stoker", default="build/stoker")
    p.add_argument("--samples", type=int, default=20000)
    p.add_argument("--sample-bytes", type=int, default=16384)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--epochs", type=int, default=4,
                   help="epochs per loader and round; the first is not timed")
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--scrapes", type=int, default=20)
    p.add_argument("--json", help="write the results here too")
    args = p.parse_args()

    work = tempfile.mkdtemp(prefix="stoker-metrics-bench-", dir="/dev/shm")
    try:
        uri = make_dataset(work, args.samples, args.sample_bytes)
        mdir = os.path.join(work, "metrics")
        epoch_rate(uri, args.batch, args.threads)  # warm the page cache and the allocator
        off, on = [], []

        def metered():
            stoker.metrics.enable(dir=mdir, job="bench")
            stoker.metrics.start()
            r = epoch_rate(uri, args.batch, args.threads, args.epochs)
            stoker.metrics.stop()
            stoker.metrics.disable()
            return r

        for i in range(args.rounds):
            # Who goes first alternates, so that a drift in the machine's load
            # favours neither.
            if i % 2 == 0:
                off.append(epoch_rate(uri, args.batch, args.threads, args.epochs))
                on.append(metered())
            else:
                on.append(metered())
                off.append(epoch_rate(uri, args.batch, args.threads, args.epochs))
        med = lambda xs, k: statistics.median(x[k] for x in xs)  # noqa: E731
        result = {"samples_per_s_off": [x[0] for x in off], "samples_per_s_on": [x[0] for x in on],
                  "samples_per_cpu_s_off": [x[1] for x in off],
                  "samples_per_cpu_s_on": [x[1] for x in on],
                  "median_off": med(off, 0), "median_on": med(on, 0),
                  "median_cpu_off": med(off, 1), "median_cpu_on": med(on, 1)}
        result["ratio_on_off"] = result["median_on"] / result["median_off"]
        result["cpu_ratio_on_off"] = result["median_cpu_on"] / result["median_cpu_off"]
        print(f"loader, {args.samples} samples of {args.sample_bytes} B, batch {args.batch}: "
              f"off {result['median_off']:.0f} samples/s, on {result['median_on']:.0f} "
              f"samples/s (medians of {args.rounds} rounds of {args.epochs} epochs): on/off = {result['ratio_on_off']:.3f}; "
              f"per CPU second: off {result['median_cpu_off']:.0f}, on "
              f"{result['median_cpu_on']:.0f}: on/off = {result['cpu_ratio_on_off']:.3f}")

        port = free_port()
        exporter = subprocess.Popen([args.stoker, "exporter", "--listen", f"127.0.0.1:{port}",
                                     "--dir", mdir, "--watch", work], stderr=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL)
        children = [subprocess.Popen([sys.executable, "-c", CHILD, mdir, uri,
                                      os.path.join(work, "ckpt"), str(r)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                    for r in range(args.ranks)]
        try:
            for c in children:
                assert c.stdout.readline().strip() == "ready"
            time.sleep(1.5)  # each has published its final counts
            url = f"http://127.0.0.1:{port}/metrics"
            times, series = [], 0
            for _ in range(args.scrapes):
                t = time.perf_counter()
                text = urllib.request.urlopen(url, timeout=10).read().decode()
                times.append((time.perf_counter() - t) * 1000)
                lines = [x for x in text.splitlines() if x and not x.startswith("#")]
                series = len(lines)
                # Series by family (histogram buckets under their family's name).
                families = {}
                for x in lines:
                    name = x.split("{")[0].split(" ")[0]
                    for suffix in ("_bucket", "_sum", "_count"):
                        if name.endswith(suffix):
                            name = name[: -len(suffix)]
                            break
                    families[name] = families.get(name, 0) + 1
            procs = [x for x in text.splitlines() if x.startswith("stoker_exporter_processes ")]
            result["series_by_family"] = dict(sorted(families.items(), key=lambda kv: -kv[1]))
            result.update({"ranks": args.ranks, "scrape_ms_median": statistics.median(times),
                           "scrape_ms_max": max(times), "series": series,
                           "processes_line": procs[0] if procs else ""})
            print(f"scrape of {args.ranks} processes: median {result['scrape_ms_median']:.1f} ms, "
                  f"max {result['scrape_ms_max']:.1f} ms ({args.scrapes} scrapes), "
                  f"{series} series ({result['processes_line']})")
        finally:
            for c in children:
                c.stdin.close()
                c.wait()
            exporter.terminate()
            exporter.wait()
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
