#!/usr/bin/python3
"""Core data-path benchmarks: each runs its peer in the same run, on the same data.

  1. loader MB/s vs fio reading the same shard files, same block size (one
     whole shard per I/O) and queue depth, io_uring on both sides:
     page cache hot, and cold (caches dropped before each run, where allowed)
     or O_DIRECT on both sides;
  2. samples/s of the loader vs the per-file loader (one open+read per sample,
     as ImageFolder + DataLoader) for 4 KiB, 16 KiB and 128 KiB raw samples,
     hot and cold, same threads and batch size;
  3. the same with JPEG decode + resize to 224x224 (~100 KB JPEGs);
  CPU seconds per GB and peak RSS of every loader run.

Every figure is the median of --repeats runs. Usage:

  bench/core_bench.py [--stoker build/stoker] [--dir /var/tmp/stoker-bench]
                      [--repeats 5] [--json out.json] [--quick]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def drop_caches():
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def warm(paths):
    for p in paths:
        with open(p, "rb") as f:
            while f.read(1 << 22):
                pass


def make_files(root, count, size, classes=10):
    """count files of exactly `size` random bytes in an ImageFolder tree."""
    if os.path.exists(os.path.join(root, ".done")):
        return
    shutil.rmtree(root, ignore_errors=True)
    for c in range(classes):
        os.makedirs(os.path.join(root, "c%02d" % c))
    for i in range(count):
        with open(os.path.join(root, "c%02d" % (i % classes), "f%07d.bin" % i), "wb") as f:
            f.write(os.urandom(size))
    open(os.path.join(root, ".done"), "w").close()


def pack(stoker, src, ds):
    if not os.path.exists(os.path.join(ds, "manifest.stoker")):
        shutil.rmtree(ds, ignore_errors=True)
        run([stoker, "pack", "--quiet", src, ds])


def stoker_json(cmd):
    return json.loads(run(cmd).stdout)


def fio(files, bs, depth, direct, hot, passes):
    size = bs * len(files)
    # --readonly: fio never writes (it would otherwise "lay out" files whose
    # size differs from --size, destroying the dataset). Names relative to
    # --directory keep the option under fio's length limit.
    cmd = ["fio", "--name=shards", "--readonly", "--rw=read", "--ioengine=io_uring",
           "--bs=%d" % bs, "--iodepth=%d" % depth, "--size=%d" % size,
           "--directory=" + os.path.dirname(files[0]),
           "--filename=" + ":".join(os.path.basename(f) for f in files),
           "--direct=%d" % int(direct), "--output-format=json", "--loops=%d" % passes,
           # fio drops the files' cached pages before it starts unless told
           # not to: the hot case must keep them.
           "--invalidate=%d" % (0 if hot else 1)]
    j = json.loads(run(cmd).stdout)["jobs"][0]
    secs = j["read"]["runtime"] / 1000.0
    cpu = (j["usr_cpu"] + j["sys_cpu"]) / 100.0 * secs
    return {"mb_per_s": j["read"]["bw_bytes"] / 1e6, "bytes": j["read"]["io_bytes"],
            "cpu_seconds_per_gb": cpu / (j["read"]["io_bytes"] / 1e9) if j["read"]["io_bytes"] else 0}


def med(xs, key):
    return statistics.median(x[key] for x in xs)


def bench_fio(args, results):
    root = os.path.join(args.dir, "fio-src")
    ds = os.path.join(args.dir, "fio-ds")
    count = 2000 if args.quick else 10000
    make_files(root, count, 100000)
    pack(args.stoker, root, ds)
    shard_dir = os.path.join(ds, "shards")
    shards = sorted(os.path.join(shard_dir, f) for f in os.listdir(shard_dir))
    sizes = [os.path.getsize(s) for s in shards]
    bs = max(set(sizes), key=sizes.count)
    same = [s for s, n in zip(shards, sizes) if n == bs]  # fio divides --size evenly
    depth = 8
    modes = [("hot", False)]
    if drop_caches():
        modes.append(("cold", False))
    modes.append(("direct", True))
    for mode, direct in modes:
        # Cold is one pass: a second would find the shards in the page cache.
        passes = 1 if mode == "cold" else args.passes
        f_runs, s_runs = [], []
        for _ in range(args.repeats):
            for side in ("fio", "stoker"):
                if mode == "hot":
                    warm(shards)
                elif mode == "cold":
                    drop_caches()
                if side == "fio":
                    f_runs.append(fio(same, bs, depth, direct, mode == "hot", passes))
                else:
                    cmd = [args.stoker, "bench", "loader", ds, "--json", "--batch-size", "256",
                           "--reads-in-flight", str(depth), "--epochs", str(passes)]
                    if direct:
                        cmd.append("--direct")
                    s_runs.append(stoker_json(cmd))
        r = {"mode": mode, "shard_bytes": bs, "depth": depth, "shards": len(shards),
             "passes": passes,
             "fio_mb_per_s": med(f_runs, "mb_per_s"),
             "fio_cpu_s_per_gb": med(f_runs, "cpu_seconds_per_gb"),
             "stoker_mb_per_s": med(s_runs, "mb_per_s"),
             "stoker_cpu_s_per_gb": med(s_runs, "cpu_seconds_per_gb"),
             "stoker_peak_rss_mib": med(s_runs, "peak_rss_bytes") / 2**20,
             "budget_mib": s_runs[0]["memory_budget_bytes"] / 2**20}
        r["ratio"] = r["stoker_mb_per_s"] / r["fio_mb_per_s"]
        results["fio"].append(r)
        print("fio %-6s fio %7.0f MB/s  stoker %7.0f MB/s  ratio %.2f  stoker %.2f CPU s/GB "
              "(fio %.2f), peak RSS %.0f MiB" % (mode, r["fio_mb_per_s"], r["stoker_mb_per_s"],
                                                r["ratio"], r["stoker_cpu_s_per_gb"],
                                                r["fio_cpu_s_per_gb"], r["stoker_peak_rss_mib"]),
              flush=True)


def bench_perfile(args, results):
    total = (64 if args.quick else 512) << 20
    modes = ["hot"] + (["cold"] if drop_caches() else [])
    for size in (4096, 16384, 131072):
        count = min(total // size, 20000 if args.quick else 131072)
        root = os.path.join(args.dir, "raw-%d" % size)
        ds = os.path.join(args.dir, "raw-%d-ds" % size)
        make_files(root, count, size)
        pack(args.stoker, root, ds)
        for mode in modes:
            runs = {"files": [], "stoker": []}
            # Hot: several epochs in one process, as a training job reads
            # (a one-pass run of these 512 MB is mostly the process's start
            # and its buffers' first touch); cold: one, from the disk.
            passes = 1 if mode == "cold" else args.passes
            if mode == "hot":  # one read of both copies puts them in the page cache
                run([args.stoker, "bench", "files", root, "--json"])
                run([args.stoker, "bench", "loader", ds, "--json"])
            for _ in range(args.repeats):
                for side in ("files", "stoker"):
                    if mode == "cold":
                        drop_caches()
                    what = root if side == "files" else ds
                    runs[side].append(stoker_json(
                        [args.stoker, "bench", "files" if side == "files" else "loader", what,
                         "--json", "--batch-size", "256", "--epochs", str(passes)]))
            r = {"sample_bytes": size, "samples": count, "mode": mode, "passes": passes,
                 "files_samples_per_s": med(runs["files"], "samples_per_s"),
                 "stoker_samples_per_s": med(runs["stoker"], "samples_per_s"),
                 "files_cpu_s_per_gb": med(runs["files"], "cpu_seconds_per_gb"),
                 "stoker_cpu_s_per_gb": med(runs["stoker"], "cpu_seconds_per_gb"),
                 "stoker_peak_rss_mib": med(runs["stoker"], "peak_rss_bytes") / 2**20}
            r["ratio"] = r["stoker_samples_per_s"] / r["files_samples_per_s"]
            results["perfile"].append(r)
            print("raw %6d B %-4s per-file %8.0f/s  stoker %8.0f/s  ratio %5.1fx  stoker %.2f CPU "
                  "s/GB, peak RSS %.0f MiB" % (size, mode, r["files_samples_per_s"],
                                              r["stoker_samples_per_s"], r["ratio"],
                                              r["stoker_cpu_s_per_gb"], r["stoker_peak_rss_mib"]),
                  flush=True)


def bench_decode(args, results):
    work = os.path.join(args.dir, "jpeg")
    images = os.path.join(work, "images")
    ds = os.path.join(work, "dataset")
    if not os.path.exists(os.path.join(ds, "manifest.stoker")):
        shutil.rmtree(work, ignore_errors=True)
        run([args.stoker, "demo", "--images", "600" if args.quick else "2000", "--raw",
             "--compute-ms", "0", "--keep", "--dir", work])
    runs = {"files": [], "stoker": []}
    for _ in range(args.repeats):
        for side, what in (("files", images), ("loader", ds)):
            runs["files" if side == "files" else "stoker"].append(stoker_json(
                [args.stoker, "bench", side, what, "--json", "--batch-size", "64", "--decode"]))
    r = {"decode": "JPEG -> 224x224x3", "files_samples_per_s": med(runs["files"], "samples_per_s"),
         "stoker_samples_per_s": med(runs["stoker"], "samples_per_s")}
    r["ratio"] = r["stoker_samples_per_s"] / r["files_samples_per_s"]
    results["decode"].append(r)
    print("decode ~100 KB JPEG -> 224x224: per-file %.0f/s  stoker %.0f/s  ratio %.2fx"
          % (r["files_samples_per_s"], r["stoker_samples_per_s"], r["ratio"]), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--stoker", default="build/stoker")
    p.add_argument("--dir", default="/var/tmp/stoker-bench")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json")
    p.add_argument("--quick", action="store_true", help="smaller data sets")
    p.add_argument("--passes", type=int, default=3,
                   help="hot runs: passes over the data in one process (stoker bench "
                        "loader/files --epochs, fio --loops), so that a process's start-up "
                        "(faulting in its buffers) weighs as it does in a training job")
    p.add_argument("--only", choices=["fio", "perfile", "decode"])
    args = p.parse_args()
    args.stoker = os.path.abspath(args.stoker)
    os.makedirs(args.dir, exist_ok=True)
    results = {"date": time.strftime("%Y-%m-%d"), "machine": os.uname().nodename,
               "cores": os.cpu_count(), "repeats": args.repeats, "fio": [], "perfile": [],
               "decode": []}
    for name, fn in (("fio", bench_fio), ("perfile", bench_perfile), ("decode", bench_decode)):
        if args.only in (None, name):
            fn(args, results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
