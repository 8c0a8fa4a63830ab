#!/usr/bin/python3
"""One build's cost of walking and rebuilding a state of many small tensors
(what the Python layer of stoker.save/stoker.load adds to the I/O): an
optimizer-like state of N parameters, each a 1 KiB weight with its Adam
exp_avg, exp_avg_sq and step, plus param_groups, saved and loaded on tmpfs
(/dev/shm: little I/O, so the walk shows). Prints the medians of --repeats
of sync save, load into new memory, and load(into=) the same state. Run
alternately with two builds' PYTHONPATH to compare them:

    for i in 1 2 3; do
      PYTHONPATH=/work/main/build/python /usr/bin/python3 bench/ckpt_state_ab.py --tag main
      PYTHONPATH=build/python /usr/bin/python3 bench/ckpt_state_ab.py --tag new
    done
"""
import argparse
import shutil
import statistics
import time

import torch

import stoker

p = argparse.ArgumentParser()
p.add_argument("--root", default="/dev/shm/stoker-state-ab")
p.add_argument("--params", type=int, default=2000)
p.add_argument("--repeats", type=int, default=7)
p.add_argument("--tag", default="")
a = p.parse_args()
shutil.rmtree(a.root, ignore_errors=True)
torch.manual_seed(0)
state = {
    "model": {f"layer{i}.weight": torch.randn(256) for i in range(a.params)},
    "optim": {
        "state": {i: {"step": torch.tensor(5.0), "exp_avg": torch.randn(256),
                      "exp_avg_sq": torch.rand(256)} for i in range(a.params)},
        "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8,
                          "params": list(range(a.params))}],
    },
    "epoch": 3,
}
c = stoker.Checkpointer(a.root, direct_io=False)
times = {"save": [], "load": [], "load_into": []}
c.save(state, "warm", rank=0, world_size=1)
for k in range(a.repeats):
    t = time.perf_counter()
    c.save(state, f"s{k}", rank=0, world_size=1)
    times["save"].append(time.perf_counter() - t)
    t = time.perf_counter()
    back = c.load(f"s{k}", rank=0, world_size=1)
    times["load"].append(time.perf_counter() - t)
    t = time.perf_counter()
    c.load(f"s{k}", rank=0, world_size=1, into=state)
    times["load_into"].append(time.perf_counter() - t)
    del back
    c.remove(f"s{k}")
tensors = a.params * 4
print(f"{a.tag} {tensors} tensors: " + ", ".join(
    f"{k} {statistics.median(v) * 1e3:.1f} ms" for k, v in times.items()))
c.close()
shutil.rmtree(a.root, ignore_errors=True)
