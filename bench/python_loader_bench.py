#!/usr/bin/python3
"""stoker.Loader against PyTorch's own DataLoader, on the same images, in one run.

The peer is what a PyTorch user writes: torchvision's ImageFolder in a
torch.utils.data.DataLoader with num_workers = the cores this process may use,
shuffle=True and pin_memory=False (there is no GPU to pin for here; on a GPU
node a user would set pin_memory=True, which adds a copy to both sides).
Two workloads:

  raw     each sample's file bytes (ImageFolder with a loader that returns the
          bytes; stoker without decode)
  decode  JPEG decode + resize to 224x224, uint8 (torchvision's default PIL
          loader + transforms.Resize((224, 224)) + PILToTensor, N x 3 x H x W;
          stoker with decode="image", N x H x W x 3, threads = the same cores)

For each: samples/s over whole epochs (first and second: the second has the
workers/threads and the page cache warm), and time to first batch (from
creating the loader to holding its first batch, DataLoader worker start-up
included). Both read the same files' bytes from the page cache (the images
were just written; dropping the cache needs root on the host).

Then stoker's Python overhead per batch: the time a batch costs in Python
(binding, arrays, dict) beyond what the C++ loader spends waiting for it,
measured on a dataset of tiny samples so that the data itself costs nothing
(best of 3 runs of 500 batches of 64).

    PYTHONPATH=build/python /usr/bin/python3 bench/python_loader_bench.py \
        [--images 2000] [--batch-size 64] [--epochs 2] [--json out.json]
"""

import argparse
import io
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path

import numpy as np
import torch
import torch.utils.data
import torchvision
from PIL import Image
from torchvision import datasets, transforms

import stoker


# ---- data ------------------------------------------------------------------------


def _make_jpeg(args):
    path, seed, width, height = args
    rng = np.random.default_rng(seed)
    # Smooth colour fields plus grain: compresses like a photo (tens of KB).
    small = rng.integers(0, 256, (height // 16, width // 16, 3), dtype=np.uint8)
    img = np.asarray(Image.fromarray(small).resize((width, height), Image.BICUBIC), np.int16)
    img = np.clip(img + rng.integers(-12, 13, img.shape), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=90)
    Path(path).write_bytes(buf.getvalue())
    return len(buf.getvalue())


def make_images(root, count, classes, workers):
    jobs = []
    rng = np.random.default_rng(0)
    for i in range(count):
        folder = root / f"class{i % classes:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        # ImageNet-like sizes: around 500 x 375.
        w, h = int(rng.integers(400, 560)), int(rng.integers(300, 420))
        jobs.append((folder / f"{i:06d}.jpg", i, w, h))
    with Pool(workers) as pool:
        sizes = pool.map(_make_jpeg, jobs, chunksize=32)
    return sum(sizes)


def _read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


# ---- runs ---------------------------------------------------------------------------


def run_epochs(make_loader, epochs, set_epoch=None):
    """Times `epochs` epochs; returns time to first batch and samples/s per epoch."""
    t0 = time.perf_counter()
    loader = make_loader()
    ttfb = None
    per_epoch = []
    for epoch in range(epochs):
        if set_epoch:
            set_epoch(loader, epoch)
        start = time.perf_counter()
        samples = 0
        for batch in loader:
            if ttfb is None:
                ttfb = time.perf_counter() - t0
            samples += batch_len(batch)
        per_epoch.append(samples / (time.perf_counter() - start))
    del loader
    return {"ttfb_s": ttfb, "samples_per_s": per_epoch, "samples": samples}


def batch_len(batch):
    if isinstance(batch, dict):
        return len(batch["sample_ids"])
    return len(batch[1])  # (images, labels)


def torch_raw(root, batch, workers):
    ds = datasets.ImageFolder(str(root), loader=_read_bytes)
    return torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers,
                                       pin_memory=False, persistent_workers=True)


def torch_decode(root, batch, workers):
    tf = transforms.Compose([transforms.Resize((224, 224)), transforms.PILToTensor()])
    ds = datasets.ImageFolder(str(root), transform=tf)
    return torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers,
                                       pin_memory=False, persistent_workers=True)


def python_overhead(tmp, fmt, samples=6400, batch_size=64, epochs=5):
    """Per batch: time in next() beyond the C++ wait, on tiny (8-byte) samples."""
    uri = tmp / "tiny-ds"
    if not (uri / "manifest.stoker").exists():
        src = tmp / "tiny"
        for c in range(4):
            (src / f"c{c}").mkdir(parents=True, exist_ok=True)
        for i in range(samples):
            (src / f"c{i % 4}" / f"{i:06d}.bin").write_bytes(i.to_bytes(8, "little"))
        stoker.pack(src, uri)
        shutil.rmtree(src)
    loader = stoker.Loader(uri, batch_size, format=fmt, rank=0, world_size=1, prefetch=16)
    for _ in loader:  # warm up (threads, buffer pool)
        pass
    wait0 = loader.stats()["wait_seconds"]
    in_next, n = 0.0, 0
    for epoch in range(1, epochs + 1):
        loader.set_epoch(epoch)
        it = iter(loader)
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break  # the epoch's end (and the next epoch's read-ahead) is not a batch
            in_next += time.perf_counter() - t0
            n += 1
        del batch
    waited = loader.stats()["wait_seconds"] - wait0
    return {"batches": n, "next_us_per_batch": in_next / n * 1e6,
            "cxx_wait_us_per_batch": waited / n * 1e6,
            "python_overhead_us_per_batch": (in_next - waited) / n * 1e6}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)),
                   help="DataLoader num_workers and stoker threads (default: the cores)")
    p.add_argument("--dir", help="working folder (default: a temporary one, removed after)")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--skip-decode", action="store_true")
    args = p.parse_args()

    tmp = Path(args.dir or tempfile.mkdtemp(prefix="stoker-pybench-"))
    root, uri = tmp / "images", tmp / "dataset"
    try:
        t = time.perf_counter()
        if not root.exists():
            total_bytes = make_images(root, args.images, args.classes, args.workers)
        else:
            total_bytes = sum(f.stat().st_size for f in root.rglob("*.jpg"))
        made = time.perf_counter() - t
        if not (uri / "manifest.stoker").exists():
            t = time.perf_counter()
            stoker.pack(root, uri)
            pack_s = time.perf_counter() - t
        else:
            pack_s = None
        info = stoker.inspect(uri)
        print(f"{info['samples']} JPEGs, {total_bytes / info['samples'] / 1e3:.0f} KB average, "
              f"{info['shards']} shards; made in {made:.1f} s"
              + (f", packed in {pack_s:.1f} s" if pack_s else ""), flush=True)

        w, b, e = args.workers, args.batch_size, args.epochs

        def stoker_loader(**kw):
            return lambda: stoker.Loader(uri, b, threads=w, rank=0, world_size=1, format="torch",
                                         **kw)

        def set_epoch(loader, epoch):
            if hasattr(loader, "set_epoch"):
                loader.set_epoch(epoch)

        results = {}
        workloads = [("raw", lambda: torch_raw(root, b, w), stoker_loader())]
        if not args.skip_decode:
            workloads.append(("decode", lambda: torch_decode(root, b, w),
                              stoker_loader(decode={"field": "image", "size": (224, 224)})))
        for name, peer, mine in workloads:
            for who, make in (("torch_dataloader", peer), ("stoker", mine)):
                r = run_epochs(make, e, set_epoch)
                results[f"{name}/{who}"] = r
                print(f"  {name:6s} {who:17s} ttfb {r['ttfb_s']:.3f} s   samples/s "
                      + "  ".join(f"{x:9.0f}" for x in r["samples_per_s"]), flush=True)

        # Best of 3: the machine may be shared, and a descheduled thread is not overhead.
        overhead = {fmt: min((python_overhead(tmp, fmt) for _ in range(3)),
                             key=lambda o: o["python_overhead_us_per_batch"])
                    for fmt in ("numpy", "torch")}

        ratios = {}
        for name, _, _ in workloads:
            s, t = results[f"{name}/stoker"], results[f"{name}/torch_dataloader"]
            ratios[name] = {
                "samples_per_s_ratio_epoch1": s["samples_per_s"][0] / t["samples_per_s"][0],
                "samples_per_s_ratio_last": s["samples_per_s"][-1] / t["samples_per_s"][-1],
                "ttfb_ratio": s["ttfb_s"] / t["ttfb_s"],
            }
        report = {
            "command": " ".join([sys.executable] + sys.argv),
            "machine": {"cores": w, "cpu_count": os.cpu_count(), "loadavg": os.getloadavg(),
                        "python": platform.python_version(), "torch": torch.__version__,
                        "torchvision": torchvision.__version__, "stoker": stoker.__version__},
            "dataset": {"images": info["samples"], "avg_bytes": total_bytes / info["samples"],
                        "shards": info["shards"], "batch_size": b, "epochs": e},
            "results": results, "ratios": ratios, "python_overhead": overhead,
        }

        print()
        print(f"{'workload':8s} {'loader':17s} {'ttfb s':>8s} "
              + " ".join(f"{'epoch ' + str(i + 1) + ' sa/s':>14s}" for i in range(e)))
        for key, r in results.items():
            name, who = key.split("/")
            print(f"{name:8s} {who:17s} {r['ttfb_s']:8.3f} "
                  + " ".join(f"{x:14.0f}" for x in r["samples_per_s"]))
        for name, ratio in ratios.items():
            print(f"{name}: stoker/DataLoader samples/s x{ratio['samples_per_s_ratio_epoch1']:.2f}"
                  f" (epoch 1), x{ratio['samples_per_s_ratio_last']:.2f} (epoch {e}); "
                  f"time to first batch x{ratio['ttfb_ratio']:.2f}")
        for fmt, o in overhead.items():
            print(f"python overhead per batch ({fmt}): {o['python_overhead_us_per_batch']:.1f} us "
                  f"(next() {o['next_us_per_batch']:.1f} us, of which C++ wait "
                  f"{o['cxx_wait_us_per_batch']:.1f} us)")
        print(f"load average during the run: {os.getloadavg()}")
        print(json.dumps(report, indent=2))
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2))
    finally:
        if not args.dir:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
