#!/usr/bin/python3
"""Checkpoint commit cost against the number of checkpoints already under
the root: the same small save (one 64 KiB tensor, sync, durable, committed)
timed on a root holding 10 checkpoints and on one holding --count (default
5,000), alternating between the two so that the machine's drift hits both
alike; the ratio large/small is the figure (1.0: a commit costs the same
however much history the root keeps).

  fill    ROOT-small gets 10 tiny checkpoints, ROOT-large --count, saved by
          the stoker on PYTHONPATH (a root's format is the same for every
          stoker since format v1; the index of docs/checkpoint.md §7 is
          extra objects that older ones ignore)
  timed   --samples saves on each root, alternating; medians in ms

    PYTHONPATH=build/python /usr/bin/python3 bench/ckpt_commit_bench.py \\
        --uri /var/tmp/commit-bench [--count 5000] [--samples 20] [--json out.json]
    ... --uri 'rados://checkpoint/commit-bench?id=stoker-train'

--no-fill times roots filled before (by another stoker: to time main's
build on the same roots, run this first with the new one).
"""

import argparse
import json
import statistics
import time

import numpy as np

import stoker


def save(c, name):
    state = {"w": np.full(16384, 1.0, dtype=np.float32)}
    start = time.perf_counter()
    c.save(state, name, rank=0, world_size=1)
    return (time.perf_counter() - start) * 1000


def with_suffix(uri, suffix):
    base, q, query = uri.partition("?")
    return base + suffix + q + query


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--uri", required=True)
    p.add_argument("--count", type=int, default=5000)
    p.add_argument("--samples", type=int, default=20)
    p.add_argument("--no-fill", action="store_true")
    p.add_argument("--tag", default="t", help="prefix of the timed saves' names")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    small = stoker.Checkpointer(with_suffix(a.uri, "-small"))
    large = stoker.Checkpointer(with_suffix(a.uri, "-large"))
    if not a.no_fill:
        for i in range(10):
            save(small, f"fill-{i:07d}")
        for i in range(a.count):
            save(large, f"fill-{i:07d}")
    at_small, at_large = [], []
    for i in range(a.samples):
        at_small.append(save(small, f"{a.tag}-{i:04d}"))
        at_large.append(save(large, f"{a.tag}-{i:04d}"))
    out = {"uri": a.uri, "count": a.count, "samples": a.samples, "stoker": stoker.__file__,
           "at_10_ms": statistics.median(at_small),
           "at_count_ms": statistics.median(at_large)}
    out["ratio"] = out["at_count_ms"] / out["at_10_ms"]
    print(json.dumps(out, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
