#!/usr/bin/python3
"""WebDataset import and export rate against the disk, peers in the same run.

    /usr/bin/python3 bench/import_rate.py --stoker build/stoker [--tars 4]
        [--samples-per-tar 10000] [--jpeg-kib 28] [--dir D] [--repeat 3] [--json]

Makes DataComp-style tars (10,000 samples each of a random ~28 KiB .jpg, a
.txt caption and a .json of metadata; written once), then, each step cold
(the page cache dropped before it: all of it where /proc/sys/vm/drop_caches
can be written, else the benchmark's own files by POSIX_FADV_DONTNEED) and
each timed to durable (a `sync` inside the time where the step writes):

  read       cat TARS > /dev/null                the source's sequential read rate
  write      cat TARS > D/copy; sync             the destination's write rate
  tar -xf    tar -xf each tar into D/x; sync     what users run to unpack them
  import     stoker pack TARS D/ds; sync         the importer (WebDataset detected)
  export     stoker export D/ds --webdataset D/out; sync

Rates are the tars' bytes per second. The runs repeat `--repeat` times in
turn (the order rotated), and the medians are reported with the ratios
import / min(read, write) (issue 32's target: >= 0.8) and export / write.
"""
import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import tarfile
import tempfile
import time


def drop_caches(base):
    """Empties the page cache: all of it where /proc/sys/vm/drop_caches can be
    written, else every file under `base` (written back first, then
    POSIX_FADV_DONTNEED, which drops a file's clean pages on Linux).
    Returns how."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches"
    except OSError:
        pass
    for root, _, files in os.walk(base):
        for name in files:
            try:
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    return "fadvise"


def make_tars(folder, tars, per_tar, jpeg_kib):
    os.makedirs(folder, exist_ok=True)
    paths = []
    rnd = os.urandom(jpeg_kib * 1024 * 2)
    for t in range(tars):
        path = os.path.join(folder, "%05d.tar" % t)
        paths.append(path)
        if os.path.exists(path):
            continue
        with tarfile.open(path + ".tmp", "w", format=tarfile.USTAR_FORMAT) as tf:
            for i in range(per_tar):
                key = "%05d%04d" % (t, i)
                n = jpeg_kib * 1024 // 2 + (i * 7919) % (jpeg_kib * 1024)
                off = (i * 104729) % (len(rnd) - n)
                body = b"\xff\xd8\xff\xe0" + rnd[off:off + n - 4]
                members = [("jpg", body),
                           ("txt", ("a photo of item %d in tar %d" % (i, t)).encode()),
                           ("json", json.dumps({"key": key, "width": 500, "height": 375,
                                                "similarity": (i % 100) / 100}).encode())]
                for ext, data in members:
                    info = tarfile.TarInfo("%s.%s" % (key, ext))
                    info.size = len(data)
                    info.mtime = 1700000000
                    tf.addfile(info, io.BytesIO(data))
        os.rename(path + ".tmp", path)
    return paths


def timed(cmd, **kw):
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, **kw)
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stoker", default="build/stoker")
    ap.add_argument("--tars", type=int, default=4)
    ap.add_argument("--samples-per-tar", type=int, default=10000)
    ap.add_argument("--jpeg-kib", type=int, default=28)
    ap.add_argument("--dir", default=None, help="where the tars and outputs go (one disk)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    stoker = os.path.abspath(a.stoker)
    base = tempfile.mkdtemp(dir=a.dir, prefix="stoker-import-bench-")
    try:
        tars = make_tars(os.path.join(base, "src"), a.tars, a.samples_per_tar, a.jpeg_kib)
        total = sum(os.path.getsize(p) for p in tars)
        cold = drop_caches(base)
        work = os.path.join(base, "work")

        def step_read():
            with open(os.devnull, "wb") as null:
                return timed(["cat"] + tars, stdout=null)

        def step_write():
            # The destination's write rate, from a source read at the same time
            # (as the importer's): the copy then sync.
            t0 = time.perf_counter()
            with open(os.path.join(work, "copy"), "wb") as out:
                subprocess.run(["cat"] + tars, stdout=out, check=True)
            os.sync()
            return time.perf_counter() - t0

        def step_tar():
            d = os.path.join(work, "x")
            os.makedirs(d)
            t0 = time.perf_counter()
            for p in tars:
                subprocess.run(["tar", "-xf", p, "-C", d], check=True)
            os.sync()
            return time.perf_counter() - t0

        def step_import():
            t0 = time.perf_counter()
            subprocess.run([stoker, "pack"] + tars + [os.path.join(work, "ds")], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            os.sync()
            return time.perf_counter() - t0

        def step_export():
            # Needs a dataset: imported (untimed) when the import did not run first.
            ds = os.path.join(work, "ds")
            if not os.path.exists(os.path.join(ds, "manifest.stoker")):
                step_import()
                drop_caches(base)
            t0 = time.perf_counter()
            subprocess.run([stoker, "export", ds, "--webdataset", os.path.join(work, "out"),
                            "--samples-per-tar", str(a.samples_per_tar)], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            os.sync()
            return time.perf_counter() - t0

        steps = [("read", step_read), ("write", step_write), ("tar -xf", step_tar),
                 ("import", step_import), ("export", step_export)]
        rates = {name: [] for name, _ in steps}
        for r in range(a.repeat):
            shutil.rmtree(work, ignore_errors=True)
            os.makedirs(work)
            order = steps[r % len(steps):] + steps[:r % len(steps)]
            # Export after import within a round, so it reads the round's dataset.
            order = [s for s in order if s[0] != "export"] + [s for s in order if s[0] == "export"]
            for name, fn in order:
                if name in ("tar -xf",):
                    shutil.rmtree(os.path.join(work, "x"), ignore_errors=True)
                drop_caches(base)
                rates[name].append(total / fn() / 1e6)
                if name == "write":
                    os.remove(os.path.join(work, "copy"))
                if name == "tar -xf":
                    shutil.rmtree(os.path.join(work, "x"))
        med = {k: statistics.median(v) for k, v in rates.items()}
        out = {
            "tars": a.tars, "samples_per_tar": a.samples_per_tar, "bytes": total,
            "cold": cold, "repeat": a.repeat,
            "mb_s": med, "runs_mb_s": rates,
            "import_vs_min_read_write": med["import"] / min(med["read"], med["write"]),
            "import_vs_tar_xf": med["import"] / med["tar -xf"],
            "export_vs_write": med["export"] / med["write"],
        }
        if a.json:
            print(json.dumps(out, indent=1))
        else:
            print("%d tars x %d samples, %.2f GB, %s, medians of %d (MB/s):"
                  % (a.tars, a.samples_per_tar, total / 1e9,
                     "cold cache (%s)" % cold,
                     a.repeat))
            for k in rates:
                print("  %-8s %8.0f   runs %s" % (k, med[k], " ".join("%.0f" % x for x in rates[k])))
            print("  import / min(read, write) = %.2f   import / tar -xf = %.2f   "
                  "export / write = %.2f" % (out["import_vs_min_read_write"],
                                             out["import_vs_tar_xf"], out["export_vs_write"]))
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
