#!/usr/bin/python3
"""How stoker.Loader and PyTorch's DataLoader scale with workers, in one run.

For each worker count (default 1, 2, 4, 8, 16: DataLoader num_workers and
stoker threads alike), batch 64, shuffled, three workloads on data this
script makes itself:

  raw      --raw-samples files of 4-12 KiB random bytes (ImageFolder with a
           loader that returns the bytes; stoker without decode)
  decode   --images JPEGs of 400x300 (~100 KB) decoded and resized to 224x224
           uint8 (ImageFolder + Resize((224, 224)) + PILToTensor; stoker
           decode={"field": "image", "size": (224, 224)})
  augment  the same JPEGs through ImageNet training augmentation:
           RandomResizedCrop(224) + RandomHorizontalFlip() + ToTensor() +
           Normalize(mean, std) against stoker's decode={..., "crop":
           "random_resized", "flip": 0.5, "normalize": (mean, std), "dtype":
           "float32", "layout": "NCHW"}; "unsupported" where this build of
           stoker does not know those options

Each (workload, workers, loader) gets one loader that runs 1 + --repeats
epochs; the first warms up (worker start-up, page cache) and is not counted;
the figure is the median samples/s of the others. For stoker on raw data all
epochs are reported too: throughput must not fall from epoch to epoch.

Prints one table per workload (workers, DataLoader, stoker, ratio) and a
summary (stoker at the most workers against the DataLoader's best count;
stoker's scaling efficiency from the fewest to the most workers), and with
--json writes everything.

    PYTHONPATH=build/python /usr/bin/python3 bench/scaling.py \
        [--workers 1,2,4,8,16] [--images 4000] [--raw-samples 50000] \
        [--modes raw,decode,augment] [--repeats 3] [--json out.json]
"""

import argparse
import io
import json
import os
import platform
import shutil
import statistics
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from python_loader_bench import _read_bytes  # noqa: E402

import stoker  # noqa: E402

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
BATCH = 64


def _make_jpeg(args):
    """400x300 (or w x h): colour fields plus grain, ~90-100 KB at quality 95
    (as the issue's 109 KB photos); bench/gpu_decode_bench.py makes 500x375."""
    path, seed, (w, h), grain = args
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (-(-h // 8), -(-w // 8), 3), dtype=np.uint8)
    img = np.asarray(Image.fromarray(small).resize((w, h), Image.BICUBIC), np.int16)
    img = np.clip(img + rng.integers(-grain, grain + 1, img.shape), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=95)
    Path(path).write_bytes(buf.getvalue())
    return len(buf.getvalue())


def make_jpegs(root, count, workers, size=(400, 300), grain=26):
    jobs = []
    for i in range(count):
        folder = root / f"class{i % 10:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        jobs.append((folder / f"{i:06d}.jpg", i, size, grain))
    with Pool(workers) as pool:
        return sum(pool.map(_make_jpeg, jobs, chunksize=32))


def _write_raw(args):
    root, start, count, step = args
    rng = np.random.default_rng(start)
    total = 0
    for i in range(start, count, step):
        folder = root / f"class{i % 10:02d}"
        size = int(rng.integers(4096, 12289))
        (folder / f"{i:07d}.bin").write_bytes(rng.bytes(size))
        total += size
    return total


def make_raw(root, count, workers):
    for c in range(10):
        (root / f"class{c:02d}").mkdir(parents=True, exist_ok=True)
    with Pool(workers) as pool:
        return sum(pool.map(_write_raw, [(root, k, count, workers) for k in range(workers)]))


def dataloader(mode, root, workers):
    if mode == "raw":
        ds = datasets.DatasetFolder(str(root), loader=_read_bytes, extensions=(".bin",))
    elif mode == "decode":
        ds = datasets.ImageFolder(str(root), transform=transforms.Compose(
            [transforms.Resize((224, 224)), transforms.PILToTensor()]))
    else:
        ds = datasets.ImageFolder(str(root), transform=transforms.Compose([
            transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
            transforms.ToTensor(), transforms.Normalize(MEAN, STD)]))
    return torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=workers,
                                       pin_memory=False, persistent_workers=True)


def stoker_decode(mode):
    if mode == "raw":
        return None
    if mode == "decode":
        return {"field": "image", "size": (224, 224)}
    return {"field": "image", "size": (224, 224), "crop": "random_resized", "flip": 0.5,
            "normalize": (MEAN, STD), "dtype": "float32", "layout": "NCHW"}


def batch_len(batch):
    return len(batch["sample_ids"]) if isinstance(batch, dict) else len(batch[1])


def epochs(loader, count):
    """samples/s of `count` epochs of one loader."""
    rates = []
    for epoch in range(count):
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        start, samples = time.perf_counter(), 0
        for batch in loader:
            samples += batch_len(batch)
        rates.append(samples / (time.perf_counter() - start))
    return rates


def measure(mode, side, root, uri, workers, repeats):
    if side == "dataloader":
        loader = dataloader(mode, root, workers)
    else:
        try:
            loader = stoker.Loader(uri, BATCH, threads=workers, rank=0, world_size=1,
                                   format="torch", decode=stoker_decode(mode))
        except (ValueError, TypeError) as e:
            if mode != "augment":
                raise
            return {"unsupported": str(e)}
    rates = epochs(loader, 1 + repeats)
    del loader
    return {"samples_per_s": statistics.median(rates[1:]), "epochs": rates}


def table(mode, rows):
    print(f"\n{mode}: samples/s, batch {BATCH}, median of the epochs after the first")
    print(f"  {'workers':>7}  {'DataLoader':>11}  {'stoker':>11}  {'ratio':>6}")
    for w, r in rows.items():
        dl, st = r["dataloader"], r["stoker"]
        if "unsupported" in st:
            print(f"  {w:>7}  {dl['samples_per_s']:>11,.0f}  {'unsupported':>11}")
            continue
        ratio = st["samples_per_s"] / dl["samples_per_s"]
        print(f"  {w:>7}  {dl['samples_per_s']:>11,.0f}  {st['samples_per_s']:>11,.0f}  "
              f"{ratio:>6.2f}")
    counts = list(rows)
    best_w = max(counts, key=lambda w: rows[w]["dataloader"]["samples_per_s"])
    best = rows[best_w]["dataloader"]["samples_per_s"]
    top = rows[counts[-1]]["stoker"]
    if "unsupported" in top:
        return {"unsupported": top["unsupported"]}
    lo = rows[counts[0]]["stoker"]["samples_per_s"]
    eff = top["samples_per_s"] / (lo * counts[-1] / counts[0])
    print(f"  stoker at {counts[-1]} / DataLoader's best ({best_w} workers): "
          f"{top['samples_per_s'] / best:.2f}x; stoker's scaling efficiency "
          f"{counts[0]}->{counts[-1]}: {eff:.2f}")
    if mode == "raw":
        ep = " -> ".join(f"{x:,.0f}" for x in top["epochs"])
        print(f"  stoker epochs at {counts[-1]} workers: {ep}")
    return {"vs_best_dataloader": top["samples_per_s"] / best, "best_dataloader_workers": best_w,
            "scaling_efficiency": eff}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", default="1,2,4,8,16")
    p.add_argument("--modes", default="raw,decode,augment")
    p.add_argument("--images", type=int, default=4000)
    p.add_argument("--raw-samples", type=int, default=50000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", default=None, help="where to make the data (default: a temp folder)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    counts = [int(w) for w in args.workers.split(",")]
    modes = args.modes.split(",")
    tmp = Path(args.dir or tempfile.mkdtemp(prefix="stoker-scaling-"))
    cores = len(os.sched_getaffinity(0))
    out = {"machine": {"cores": cores, "cpu": platform.processor(), "python": sys.version.split()[0],
                       "torch": torch.__version__, "torchvision": torchvision.__version__},
           "batch_size": BATCH, "workers": counts, "modes": {}}
    print(f"{cores} cores, torch {torch.__version__}, torchvision {torchvision.__version__}",
          flush=True)
    try:
        data = {}
        if "raw" in modes:
            t = time.perf_counter()
            nbytes = make_raw(tmp / "raw", args.raw_samples, cores)
            stoker.pack(tmp / "raw", tmp / "raw-ds")
            data["raw"] = (tmp / "raw", str(tmp / "raw-ds"))
            print(f"raw: {args.raw_samples} files, {nbytes / 2**20:.0f} MiB, made and packed in "
                  f"{time.perf_counter() - t:.1f} s", flush=True)
        if "decode" in modes or "augment" in modes:
            t = time.perf_counter()
            nbytes = make_jpegs(tmp / "jpg", args.images, cores)
            stoker.pack(tmp / "jpg", tmp / "jpg-ds")
            for m in ("decode", "augment"):
                data[m] = (tmp / "jpg", str(tmp / "jpg-ds"))
            print(f"images: {args.images} JPEGs 400x300, {nbytes / args.images / 1000:.0f} KB "
                  f"each, made and packed in {time.perf_counter() - t:.1f} s", flush=True)
        for mode in modes:
            root, uri = data[mode]
            rows = {}
            for w in counts:
                rows[w] = {side: measure(mode, side, root, uri, w, args.repeats)
                           for side in ("dataloader", "stoker")}
                print(f"  {mode} {w} workers: " + ", ".join(
                    f"{s} {r['samples_per_s']:,.0f}/s" if "samples_per_s" in r
                    else f"{s} unsupported" for s, r in rows[w].items()),
                    flush=True)
            summary = table(mode, rows)
            out["modes"][mode] = {"rows": rows, "summary": summary}
    finally:
        if not args.dir:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
