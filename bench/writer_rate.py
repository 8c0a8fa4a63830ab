#!/usr/bin/python3
"""Python stoker.Writer against the C++ DatasetWriter, same records, same run.

    PYTHONPATH=build/python /usr/bin/python3 bench/writer_rate.py [--records N] [--size B] [--dir D]

Writes N records of B bytes (+ an int64 label) with each, 3 times
alternating, into a local folder; prints the medians (MB/s) and the ratio
python/C++ (issue 32's target: >= 0.8 for 100 KB records).
"""
import argparse
import os
import shutil
import statistics
import tempfile
import time

import stoker
from stoker import _stoker


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=5000)
    ap.add_argument("--size", type=int, default=100_000)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    base = tempfile.mkdtemp(dir=a.dir, prefix="stoker-writer-bench-")
    payload = os.urandom(a.size)
    mb = a.records * a.size / 1e6
    rates = {"cpp": [], "python": []}
    try:
        for r in range(a.repeat):
            for kind in (("cpp", "python") if r % 2 == 0 else ("python", "cpp")):
                uri = os.path.join(base, "%s-%d" % (kind, r))
                t0 = time.perf_counter()
                if kind == "cpp":
                    _stoker._write_repeated(uri, payload, a.records)
                else:
                    with stoker.Writer(uri, fields={"image": "bytes", "label": "int64"}) as w:
                        for i in range(a.records):
                            w.write({"image": payload, "label": i})
                rates[kind].append(mb / (time.perf_counter() - t0))
                shutil.rmtree(uri)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    cpp, py = statistics.median(rates["cpp"]), statistics.median(rates["python"])
    print("records %d x %d B, %d runs: C++ %.0f MB/s, Python %.0f MB/s, ratio %.2f"
          % (a.records, a.size, a.repeat, cpp, py, py / cpp))


if __name__ == "__main__":
    main()
