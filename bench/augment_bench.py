#!/usr/bin/python3
"""Decode + augmentation per core: stoker's DecodeSample against PIL +
torchvision, one thread each, on the same JPEGs, in one run.

What a decode worker does per sample, without the loader around it (no
reads, no batches, no queues), so that the ratio is per core and does not
depend on how many cores the machine has:

  train    torchvision: PIL decode (Image.open(...).convert("RGB")) +
           RandomResizedCrop(224) + RandomHorizontalFlip() + ToTensor() +
           Normalize(ImageNet), float32 3 x 224 x 224.
           stoker: decode={"crop": "random_resized", "flip": 0.5,
           "normalize": True, "layout": "NCHW"} (float32), and float16.
  eval     Resize(256) + CenterCrop(224) + ToTensor + Normalize against
           crop "center".
  resize   Resize((224, 224)) to uint8 (np.asarray of the PIL image)
           against crop "resize", uint8 HWC.

stoker's train row is also run with the decoder doing less of the work
(DecodeOptions::extent): the whole image at the same DCT scaling, and the
whole image at full size as PIL decodes it. The gaps between those rows are
what the partial decode (jpeg_skip_scanlines / jpeg_crop_scanline) and the
DCT scaling gain.

Each figure is the median of 3 passes over all images (images/s, one
thread; torch.set_num_threads(1)); the passes of all pipelines are
interleaved. The images are synthesized: photo-like
(smooth fields, edges and noise), W x H, JPEG quality 90, 4:2:0.

    PYTHONPATH=build/python /usr/bin/python3 bench/augment_bench.py \\
        [--images 300] [--size 500x375] [--json out.json]
"""

import argparse
import io
import json
import platform
import statistics
import sys
import time

import numpy as np

import stoker  # noqa: F401  (the package that holds _stoker)
from stoker import _stoker
from stoker.loader import _decode_options


def synth_jpegs(count, width, height, seed=0):
    from PIL import Image
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    out = []
    for _ in range(count):
        img = np.zeros((height, width, 3), np.float32)
        for c in range(3):
            fx, fy = rng.uniform(0.003, 0.04, 2)
            img[..., c] = 128 + 90 * np.sin(x * fx + rng.uniform(0, 6)) * np.cos(y * fy)
        for _ in range(8):
            y0, x0 = rng.integers(0, height - 30), rng.integers(0, width - 30)
            img[y0:y0 + rng.integers(20, height // 2), x0:x0 + rng.integers(20, width // 2)] = \
                rng.integers(0, 256, 3)
        img += rng.normal(0, 12, img.shape)  # texture: what makes photos cost to decode
        buf = io.BytesIO()
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def pass_rate(fn, jpegs, first_id):
    """images/s of one pass over all images."""
    t = time.perf_counter()
    for i, j in enumerate(jpegs):
        fn(j, first_id + i)
    return len(jpegs) / (time.perf_counter() - t)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=300)
    p.add_argument("--size", default="500x375", help="WxH of the synthesized JPEGs")
    p.add_argument("--json")
    p.add_argument("--write", metavar="DIR", help="also save the JPEGs there (0000.jpg, ...)")
    a = p.parse_args()
    width, height = (int(v) for v in a.size.split("x"))

    import torch
    import torchvision
    import torchvision.transforms as T
    from PIL import Image
    torch.set_num_threads(1)

    jpegs = synth_jpegs(a.images, width, height)
    kib = sum(map(len, jpegs)) / len(jpegs) / 1024
    if a.write:
        import os
        os.makedirs(a.write, exist_ok=True)
        for i, j in enumerate(jpegs):
            with open(os.path.join(a.write, f"{i:04d}.jpg"), "wb") as f:
                f.write(j)
    print(f"{len(jpegs)} JPEGs of {width}x{height}, {kib:.0f} KiB on average; one thread; "
          f"torch {torch.__version__}, torchvision {torchvision.__version__}, "
          f"PIL {Image.__version__}, {platform.processor() or platform.machine()}")

    def pil(j):
        return Image.open(io.BytesIO(j)).convert("RGB")

    norm = T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    tv_train = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), norm])
    tv_eval = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), norm])
    tv_resize = T.Resize((224, 224))

    def ours(extent=0, **kw):
        o = _decode_options({"field": "image", "size": 224, **kw})[3]
        o.extent = extent
        return lambda j, i: _stoker._decode_sample(o, j, 0, 0, i)

    train = dict(crop="random_resized", flip=0.5, normalize=True, layout="NCHW")
    rows = [
        ("train", "torchvision", lambda j, i: tv_train(pil(j))),
        ("train", "stoker float32", ours(**train)),
        ("train", "stoker float16", ours(**train, dtype="float16")),
        ("train", "stoker, whole image DCT-scaled", ours(1, **train)),
        ("train", "stoker, whole image full size", ours(2, **train)),
        ("eval", "torchvision", lambda j, i: tv_eval(pil(j))),
        ("eval", "stoker float32", ours(crop="center", normalize=True, layout="NCHW")),
        ("resize", "PIL", lambda j, i: np.asarray(tv_resize(pil(j)))),
        ("resize", "stoker uint8", ours()),
    ]
    # The passes interleaved (pass r of every pipeline, then pass r + 1), so
    # that load from other work on the machine falls on all of them alike.
    for _, _, fn in rows:
        fn(jpegs[0], 0)  # warm up
    rates = [[] for _ in rows]
    for r in range(3):
        for k, (_, _, fn) in enumerate(rows):
            rates[k].append(pass_rate(fn, jpegs, r * len(jpegs)))
    results, peer = [], {}
    print(f"{'workload':8} {'pipeline':34} {'images/s':>9} {'vs peer':>8}")
    for (workload, name, _), rs in zip(rows, rates):
        r = statistics.median(rs)
        peer.setdefault(workload, r)
        ratio = r / peer[workload]
        results.append({"workload": workload, "pipeline": name, "images_per_s": round(r, 1),
                        "ratio": round(ratio, 2), "passes": [round(x, 1) for x in rs]})
        print(f"{workload:8} {name:34} {r:9.0f} {ratio:7.2f}x", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"images": len(jpegs), "size": [width, height], "kib": round(kib, 1),
                       "results": results}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
