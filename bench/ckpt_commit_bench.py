#!/usr/bin/python3
"""Checkpoint commit cost against the number of checkpoints already under
the root: the same small save (one 64 KiB tensor, sync, durable, committed)
timed with 10 checkpoints under the root and with --count (default 5,000),
in one run; the ratio is the figure (1.0: a commit costs the same however
much history the root keeps).

  fill      the root is filled with tiny checkpoints by the stoker on
            PYTHONPATH (a root's format is the same for every stoker since
            format v1; the index of docs/checkpoint.md §7 is extra objects)
  at 10     --samples saves timed after 10 checkpoints
  at N      --samples saves timed after --count checkpoints
  retention the same with keep_last = --count (retention walks from the
            commit to the oldest kept one, §7.2)

Each figure is the median of the samples, in milliseconds.

    PYTHONPATH=build/python /usr/bin/python3 bench/ckpt_commit_bench.py \\
        --uri /var/tmp/commit-bench [--count 5000] [--samples 20] [--json out.json]
    ... --uri 'rados://checkpoint/commit-bench?id=stoker-train'

With --fill-only the root is filled and nothing is timed; with --no-fill
an existing root is timed as it is (to time another stoker on a root that
this one filled: it must hold exactly --count checkpoints).
"""

import argparse
import json
import statistics
import time

import numpy as np

import stoker


def save(c, name, keep_last=None):
    state = {"w": np.full(16384, 1.0, dtype=np.float32)}
    start = time.perf_counter()
    c.save(state, name, rank=0, world_size=1, keep_last=keep_last)
    return (time.perf_counter() - start) * 1000


def fill(c, start, stop):
    for i in range(start, stop):
        save(c, f"fill-{i:07d}")


def timed(c, tag, samples, keep_last=None):
    return statistics.median(save(c, f"{tag}-{i:04d}", keep_last) for i in range(samples))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--uri", required=True)
    p.add_argument("--count", type=int, default=5000)
    p.add_argument("--samples", type=int, default=20)
    p.add_argument("--fill-only", action="store_true")
    p.add_argument("--no-fill", action="store_true")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    c = stoker.Checkpointer(a.uri)
    out = {"uri": a.uri, "count": a.count, "samples": a.samples, "stoker": stoker.__file__}
    if not a.no_fill:
        fill(c, 0, 10)
    if a.fill_only:
        fill(c, 10, a.count)
        return
    if not a.no_fill:
        out["at_10_ms"] = timed(c, "small", a.samples)
        # Back to exactly --count before the second figure.
        fill(c, 10 + a.samples, a.count)
    out["at_count_ms"] = timed(c, "large", a.samples)
    out["retention_at_count_ms"] = timed(c, "keep", a.samples, keep_last=a.count)
    if "at_10_ms" in out:
        out["ratio"] = out["at_count_ms"] / out["at_10_ms"]
    print(json.dumps(out, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
