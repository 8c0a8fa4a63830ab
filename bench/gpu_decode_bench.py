#!/usr/bin/python3
"""JPEG decode + RandomResizedCrop + flip into GPU memory: four ways, one run.

Issue 34's benchmark. The script makes ImageNet-like JPEGs (500x375, ~110 KB,
photo-like colour fields with grain, quality 95, 4:2:0 baseline as PIL writes
them), packs them, and measures images/s delivered into GPU memory as
224x224 crops (RandomResizedCrop(224) + RandomHorizontalFlip, uint8) for:

  dataloader  torch DataLoader over an ImageFolder, PIL decode +
              torchvision's RandomResizedCrop/RandomHorizontalFlip/PILToTensor
              in --workers processes, pinned, copied to the GPU
  tv_gpu      torchvision.io.decode_jpeg(list, device="cuda") per batch (the
              file bytes read by a DataLoader of 4 workers), then each image's
              RandomResizedCrop box, resized_crop(antialias=True) and flip on
              the GPU, stacked
  stoker_cpu  stoker.Loader(decode={... "crop": "random_resized", "flip":
              0.5}, device="cuda:0"): libjpeg-turbo in --workers threads
  stoker_gpu  the same with decode["device"] = "cuda:0" (nvJPEG: hardware
              engines, CUDA, CPU for the rest) at --gpu-threads threads
  stoker_both CPU and GPU together: decode["device"] = "cuda:0", the CPU
              path taking cpu_share of the images (routed by a hash of
              (seed, epoch, sample), so deterministic). The GPU path's own
              host work (reads, header parses, the batched nvJPEG calls)
              keeps g of the --workers cores busy (stoker_gpu's "cores"), so
              the CPU path runs at t = workers - round(g) threads and is
              expected at C' = cpu x t / workers: cpu_share = C' / (C' + gpu),
              the split at which both finish an epoch together. Target:
              >= 0.9 x (stoker_cpu + stoker_gpu)
  stoker_balanced  stoker_both's threads and starting split with
              decode["cpu_share_balance"] = True: the loader moves the share
              at run time (up while built batches wait for the GPU stage,
              down while it waits for the workers); the share it ended at
              is reported
  stoker_balanced_all  the balance at all --workers threads, starting from
              stoker_both_naive's split
  stoker_balanced_nice0, stoker_balanced_all_nice0  the same two with
              decode["worker_nice"] = 0: the workers at the copier's
              priority (the default puts them 5 behind it), for comparison
  stoker_balanced_deep  stoker_balanced with prefetch=--deep-prefetch
              batches built ahead (the default is 4): a deeper queue
              between the workers and the copier, for comparison
  stoker_both_naive  the same at --workers threads with cpu_share = cpu /
              (cpu + gpu), ignoring the GPU path's cores (the first
              measurement's split: 0.84 of the sum), for comparison

With --rounds N the stoker ways run N times in turn (the peers once), and
each CPU+GPU ratio is the median of the rounds' own ratios. Each way runs
1 + --repeats epochs on one loader; the first warms up and is
not counted; the figure is the median images/s of the others, each epoch
ending with a torch.cuda.synchronize(). Also: CPU cores used (CPU seconds of
this process and its children, /proc, over wall seconds), GPU memory used
(cudaMemGetInfo's used bytes above the start, at each epoch's end, the
most), and for stoker the share of images each backend took and its
decode_path. Prints a table and ratios; --json writes everything.

    PYTHONPATH=build/python python3 bench/gpu_decode_bench.py \\
        [--images 8000] [--repeats 3] [--workers 16] [--gpu-threads 4] \\
        [--batch 256] [--rounds 3] [--ways dataloader,tv_gpu,stoker_cpu,stoker_gpu,...] \\
        [--dir DIR] [--json out.json]
"""

import argparse
import json
import os
import resource
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.utils.data
import torchvision
from torchvision import datasets, transforms
from torchvision.transforms import functional as TF

import stoker

sys.path.insert(0, str(Path(__file__).resolve().parent))
import scaling  # noqa: E402  (its JPEG maker)

SIZE = 224
SCALE = (0.08, 1.0)
RATIO = (3 / 4, 4 / 3)


def make_jpegs(root, count, workers):
    """500x375 colour fields plus grain: ~110 KB at quality 95 (measured: 111 KB)."""
    return scaling.make_jpegs(root, count, workers, size=(500, 375), grain=9)


def cpu_seconds():
    """User + system CPU seconds of this process and every live descendant
    (DataLoader workers are long-lived children: getrusage would miss them)."""
    tick = os.sysconf("SC_CLK_TCK")
    parents = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(pid)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    me = os.getpid()
    total, todo = 0.0, [me]
    while todo:
        p = todo.pop()
        total += parents.get(p, (0, 0.0))[1]
        todo.extend(c for c, (pp, _) in parents.items() if pp == p)
    # Children that exited (a DataLoader's workers at shutdown) are in getrusage.
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return total + r.ru_utime + r.ru_stime


def gpu_used():
    free, total = torch.cuda.mem_get_info()
    return total - free


class Bytes(torch.utils.data.Dataset):
    """The files' bytes (made tensors in the main process: a tensor per file
    through the workers' queues costs a shared-memory file each)."""

    def __init__(self, root):
        self.files = sorted(str(p) for p in Path(root).rglob("*.jpg"))

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        return bytearray(Path(self.files[i]).read_bytes())


def _list_collate(batch):
    return batch


def way_dataloader(root, args):
    ds = datasets.ImageFolder(str(root), transform=transforms.Compose([
        transforms.RandomResizedCrop(SIZE, scale=SCALE, ratio=RATIO, antialias=True),
        transforms.RandomHorizontalFlip(), transforms.PILToTensor()]))
    dl = torch.utils.data.DataLoader(ds, batch_size=args.batch, shuffle=True,
                                     num_workers=args.workers, pin_memory=True,
                                     persistent_workers=True, prefetch_factor=4)

    def epoch(_):
        n = 0
        for x, _y in dl:
            x = x.cuda(non_blocking=True)
            n += x.shape[0]
        return n
    return epoch, None


def way_tv_gpu(root, args):
    dl = torch.utils.data.DataLoader(Bytes(root), batch_size=args.batch, shuffle=True,
                                     num_workers=4, collate_fn=_list_collate,
                                     persistent_workers=True, prefetch_factor=4)
    crop = transforms.RandomResizedCrop(SIZE, scale=SCALE, ratio=RATIO, antialias=True)

    def epoch(_):
        n = 0
        for raw in dl:
            imgs = torchvision.io.decode_jpeg([torch.frombuffer(b, dtype=torch.uint8) for b in raw],
                                              device="cuda")
            out = []
            for img in imgs:
                i, j, h, w = crop.get_params(img, SCALE, RATIO)
                t = TF.resized_crop(img, i, j, h, w, [SIZE, SIZE], antialias=True)
                if torch.rand(1).item() < 0.5:
                    t = TF.hflip(t)
                out.append(t)
            n += torch.stack(out).shape[0]
        return n
    return epoch, None


def way_stoker(uri, args, gpu, cpu_share=None, both_threads=None, balance=False, nice=None,
               prefetch=None):
    decode = {"field": "image", "size": (SIZE, SIZE), "crop": "random_resized",
              "scale": SCALE, "ratio": RATIO, "flip": 0.5}
    if gpu:
        decode["device"] = "cuda:0"
    if nice is not None:
        decode["worker_nice"] = nice
    threads = args.gpu_threads if gpu else args.workers
    if cpu_share is not None:
        decode["cpu_share"] = cpu_share
        if balance:
            decode["cpu_share_balance"] = True
        threads = both_threads or args.workers
    loader = stoker.Loader(uri, args.batch, threads=threads, rank=0, world_size=1,
                           decode=decode, device="cuda:0", format="torch", prefetch=prefetch)

    def epoch(e):
        loader.set_epoch(e)
        n = 0
        for b in loader:
            n += b["image"].shape[0]
        return n
    return epoch, loader


def set_blocking_sync():
    """CU_CTX_SCHED_BLOCKING_SYNC on device 0's primary context, through the
    driver (every CUDA runtime in the process shares that context), before
    anything creates it."""
    import ctypes
    cu = ctypes.CDLL("libcuda.so.1")
    dev = ctypes.c_int()
    for what, rc in (("cuInit", cu.cuInit(0)), ("cuDeviceGet", cu.cuDeviceGet(ctypes.byref(dev), 0)),
                     ("cuDevicePrimaryCtxSetFlags",
                      cu.cuDevicePrimaryCtxSetFlags(dev, 0x04))):  # CU_CTX_SCHED_BLOCKING_SYNC
        if rc != 0:
            sys.exit(f"gpu_decode_bench: --blocking-sync: {what} returned {rc}")
    print("primary context of GPU 0: CU_CTX_SCHED_BLOCKING_SYNC", flush=True)


def measure(name, make, repeats):
    torch.cuda.synchronize()
    base_mem = gpu_used()
    epoch, loader = make()
    rates, cores, walls, mem = [], [], [], 0
    for e in range(1 + repeats):
        c0, t0 = cpu_seconds(), time.perf_counter()
        n = epoch(e)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        walls.append(wall)
        rates.append(n / wall)
        cores.append((cpu_seconds() - c0) / wall)
        mem = max(mem, gpu_used() - base_mem)
    r = {"images_per_s": statistics.median(rates[1:]), "epochs": rates,
         "cpu_cores": statistics.median(cores[1:]), "gpu_memory_bytes": mem}
    if loader is not None:
        s = loader.stats()
        total = s["decoded_hardware"] + s["decoded_cuda"] + s["decoded_cpu"]
        r["backend_share"] = {k: (s["decoded_" + k] / total if total else 0.0)
                              for k in ("hardware", "cuda", "cpu")}
        r["decode_path"] = s["decode_path"]
        r["stats"] = {k: v for k, v in s.items() if isinstance(v, (int, float, str))}
        if s.get("gpu_decode_seconds"):
            # The copier thread's time, over every epoch's wall time (the
            # warm-up's too: the counters are the loader's).
            all_wall = sum(walls)
            r["copier"] = {k: s[k + "_seconds"] / all_wall
                           for k in ("copier_wait", "gpu_decode", "gpu_decode_wait", "copier_cpu")}
        loader.close()
    print(f"             epochs: {', '.join(f'{x:,.0f}' for x in rates)} images/s", flush=True)
    print(f"  {name:10} {r['images_per_s']:9,.0f} images/s  {r['cpu_cores']:5.1f} cores  "
          f"GPU {r['gpu_memory_bytes'] / 2**20:7.0f} MiB"
          + (f"  hw/cuda/cpu {r['backend_share']['hardware']:.2f}/"
             f"{r['backend_share']['cuda']:.2f}/{r['backend_share']['cpu']:.2f}"
             if "backend_share" in r else ""), flush=True)
    if "decode_path" in r:
        print(f"             decode_path: {r['decode_path']}", flush=True)
    if "copier" in r:
        c = r["copier"]
        print(f"             copier, of the wall time: waiting for the workers "
              f"{c['copier_wait']:.0%}, in the GPU decode {c['gpu_decode']:.0%} (waiting for "
              f"the GPU {c['gpu_decode_wait']:.0%}), on a CPU {c['copier_cpu']:.0%}", flush=True)
    if r.get("stats", {}).get("decode_cpu_share"):
        print(f"             cpu share at the end: {r['stats']['decode_cpu_share']:.3f}", flush=True)
    return r


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=8000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--gpu-threads", type=int, default=4)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--deep-prefetch", type=int, default=12,
                   help="stoker_balanced_deep's prefetch (batches built ahead)")
    p.add_argument("--ways", default="dataloader,tv_gpu,stoker_cpu,stoker_gpu,stoker_both,"
                   "stoker_balanced,stoker_both_naive")
    p.add_argument("--rounds", type=int, default=1,
                   help="run the stoker ways this many times, interleaved; each figure and "
                        "ratio is the median over the rounds (the peers run once)")
    p.add_argument("--blocking-sync", action="store_true",
                   help="set CU_CTX_SCHED_BLOCKING_SYNC on GPU 0's primary context first, so "
                        "that host threads waiting for the GPU sleep instead of spinning (tells "
                        "a spin inside nvJPEG from its host work in the copier's CPU time)")
    p.add_argument("--dir", default=None, help="where to make the data (default: a temp folder)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if args.blocking_sync:
        set_blocking_sync()
    if not torch.cuda.is_available():
        sys.exit("gpu_decode_bench: needs a CUDA GPU (torch.cuda.is_available() is False)")
    tmp = Path(args.dir or tempfile.mkdtemp(prefix="stoker-gpu-decode-"))
    cores = len(os.sched_getaffinity(0))
    out = {"machine": {"cores": cores, "cpu": platform.processor(),
                       "gpu": torch.cuda.get_device_name(0), "python": sys.version.split()[0],
                       "torch": torch.__version__, "torchvision": torchvision.__version__},
           "batch": args.batch, "workers": args.workers, "gpu_threads": args.gpu_threads,
           "images": args.images, "ways": {}}
    print(f"{cores} cores, {out['machine']['gpu']}, torch {torch.__version__}, "
          f"torchvision {torchvision.__version__}", flush=True)
    root, uri = tmp / "jpg", tmp / "jpg-ds"
    if not (uri / "manifest.stoker").exists():
        t = time.perf_counter()
        nbytes = make_jpegs(root, args.images, cores)
        stoker.pack(root, uri)
        print(f"{args.images} JPEGs 500x375, {nbytes / args.images / 1000:.0f} KB each, made and "
              f"packed in {time.perf_counter() - t:.1f} s", flush=True)
        out["mean_jpeg_bytes"] = nbytes / args.images
    makers = {
        "dataloader": lambda: way_dataloader(root, args),
        "tv_gpu": lambda: way_tv_gpu(root, args),
        "stoker_cpu": lambda: way_stoker(str(uri), args, gpu=False),
        "stoker_gpu": lambda: way_stoker(str(uri), args, gpu=True),
    }

    def both(name, naive, balance=False, nice=None, prefetch=None):
        c = out["ways"].get("stoker_cpu", {}).get("images_per_s")
        g = out["ways"].get("stoker_gpu", {}).get("images_per_s")
        if not c or not g:
            raise RuntimeError(f"{name} needs stoker_cpu and stoker_gpu measured first")
        threads = args.workers
        if not naive:
            gpu_cores = out["ways"]["stoker_gpu"].get("cpu_cores", 0.0)
            threads = max(1, args.workers - round(gpu_cores))
            c = c * threads / args.workers
        key = {"stoker_both": "cpu_share", "stoker_both_naive": "cpu_share_naive",
               "stoker_balanced": "cpu_share_balanced_start",
               "stoker_balanced_all": "cpu_share_balanced_all_start",
               "stoker_balanced_nice0": "cpu_share_balanced_nice0_start",
               "stoker_balanced_all_nice0": "cpu_share_balanced_all_nice0_start",
               "stoker_balanced_deep": "cpu_share_balanced_deep_start"}[name]
        out[key] = c / (c + g)
        out[key.replace("cpu_share", "both_threads")] = threads
        print(f"  {name}: cpu_share {out[key]:.3f} at {threads} threads", flush=True)
        return way_stoker(str(uri), args, gpu=True, cpu_share=out[key], both_threads=threads,
                          balance=balance, nice=nice, prefetch=prefetch)
    makers["stoker_both"] = lambda: both("stoker_both", False)
    makers["stoker_both_naive"] = lambda: both("stoker_both_naive", True)
    makers["stoker_balanced"] = lambda: both("stoker_balanced", False, balance=True)
    # The balance at every thread, from the naive split: no cores set aside.
    makers["stoker_balanced_all"] = lambda: both("stoker_balanced_all", True, balance=True)
    makers["stoker_balanced_nice0"] = lambda: both("stoker_balanced_nice0", False, balance=True,
                                                   nice=0)
    makers["stoker_balanced_all_nice0"] = lambda: both("stoker_balanced_all_nice0", True,
                                                       balance=True, nice=0)
    makers["stoker_balanced_deep"] = lambda: both("stoker_balanced_deep", False, balance=True,
                                                  prefetch=args.deep_prefetch)
    print(f"images/s into GPU memory, {SIZE}x{SIZE} RandomResizedCrop + flip, batch "
          f"{args.batch}, median of {args.repeats} epochs after a warm-up:", flush=True)
    ways = args.ways.split(",")
    peers = [n for n in ways if not n.startswith("stoker")]
    mine = [n for n in ways if n.startswith("stoker")]
    both_ways = ("stoker_both", "stoker_balanced", "stoker_balanced_all", "stoker_both_naive",
                 "stoker_balanced_nice0", "stoker_balanced_all_nice0", "stoker_balanced_deep")

    def run(name):
        try:
            out["ways"][name] = measure(name, makers[name], args.repeats)
        except Exception as e:  # one way failing must not lose the others
            print(f"  {name:10} FAILED: {type(e).__name__}: {e}", flush=True)
            out["ways"][name] = {"error": f"{type(e).__name__}: {e}"}
    for name in peers:
        run(name)
    # The stoker ways in rounds: the machine drifts (the GPU path alone
    # varied by 15% between epochs), so each round's CPU+GPU figure is set
    # against that round's CPU and GPU figures, and the median taken.
    rounds = []
    for r in range(max(1, args.rounds)):
        if args.rounds > 1:
            print(f"  round {r + 1} of {args.rounds}", flush=True)
        for name in mine:
            run(name)
        rounds.append({n: dict(out["ways"][n]) for n in mine})
        rw = rounds[-1]
        for b in both_ways:
            if all(rw.get(k, {}).get("images_per_s") for k in (b, "stoker_cpu", "stoker_gpu")):
                rw[b]["of_sum"] = rw[b]["images_per_s"] / (
                    rw["stoker_cpu"]["images_per_s"] + rw["stoker_gpu"]["images_per_s"])
    out["rounds"] = rounds
    for name in mine:
        got = [rw[name] for rw in rounds if rw.get(name, {}).get("images_per_s")]
        if got:
            out["ways"][name] = dict(out["ways"][name],
                                     images_per_s=statistics.median(g["images_per_s"] for g in got),
                                     rounds=[g["images_per_s"] for g in got])
            if len(got) > 1:
                print(f"  {name:10} median of {len(got)} rounds: "
                      f"{out['ways'][name]['images_per_s']:9,.0f} images/s "
                      "(" + ", ".join(f"{g['images_per_s']:,.0f}" for g in got) + ")", flush=True)
    w = out["ways"]

    def rate(k):
        return w.get(k, {}).get("images_per_s")
    ratios = {}
    for a, b in (("stoker_gpu", "tv_gpu"), ("stoker_gpu", "dataloader"),
                 ("stoker_gpu", "stoker_cpu"), ("stoker_cpu", "dataloader")):
        if rate(a) and rate(b):
            ratios[f"{a}/{b}"] = rate(a) / rate(b)
            print(f"  {a} / {b}: {ratios[f'{a}/{b}']:.2f}x", flush=True)
    for both_way in both_ways:
        per_round = [rw[both_way]["of_sum"] for rw in rounds if "of_sum" in rw.get(both_way, {})]
        if per_round:
            k = f"{both_way}/(stoker_cpu+stoker_gpu)"
            ratios[k] = statistics.median(per_round)
            print(f"  {k}: {ratios[k]:.2f}"
                  + (f" (median of rounds: {', '.join(f'{x:.2f}' for x in per_round)})"
                     if len(per_round) > 1 else ""), flush=True)
    out["ratios"] = ratios
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
