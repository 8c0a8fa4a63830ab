#!/usr/bin/python3
"""Train a small CNN on Fashion-MNIST from a stoker dataset, on CPU, with resume.

The images come from Debian's dataset-fashion-mnist package (the original
idx files). The first run turns them into one raw 784-byte file per image and a
"PATH LABEL" list file in a random order, packs that with stoker.pack and
removes the files; later runs reuse the dataset.

Each step's batch arrives as views of one buffer (no copy): the "image"
field's bytes are 784 per sample, back to back, so the whole batch is one
reshape away from N x 1 x 28 x 28. With --checkpoint DIR (a folder or a
rados:// root) the model, the optimizer and the loader's state_dict are saved
together with stoker.save, asynchronously (training goes on while the
checkpoint is written) and atomically (a crash mid-save leaves the previous
one); a run started with the same --checkpoint resumes exactly where the
latest one stopped, mid-epoch included, and gives the same batches an
uninterrupted run would.

    export PYTHONPATH=$PWD/build/python
    /usr/bin/python3 examples/train_fashion_mnist.py --steps 300 --checkpoint /tmp/fm-ckpt
    /usr/bin/python3 examples/train_fashion_mnist.py --steps 600 --checkpoint /tmp/fm-ckpt  # resumes
    stoker ckpt ls /tmp/fm-ckpt

Distributed (each rank reads its share; gradients are averaged by DDP over
gloo, through stoker.timed_allreduce_hook so that the all-reduce is timed):
torchrun --nproc-per-node 2 examples/train_fashion_mnist.py

At the end the run prints where its steps' time went (data / h2d / compute /
comm / checkpoint, % of step; stoker.metrics); --run-log keeps one JSON line
per step for `stoker report RUN_LOG -o report.html`, and --metrics publishes
Prometheus metrics for `stoker exporter`.
"""

import argparse
import gzip
import json
import os
import shutil
import struct
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import stoker

IMAGE_BYTES = 28 * 28


def read_idx(path, magic):
    with gzip.open(path, "rb") as f:
        data = f.read()
    got = struct.unpack(">I", data[:4])[0]
    if got != magic:
        raise ValueError(f"{path}: not an idx file of this kind (magic {got:#x}, want {magic:#x})")
    dims = struct.unpack(f">{magic & 0xFF}I", data[4:4 + 4 * (magic & 0xFF)])
    return np.frombuffer(data, np.uint8, offset=4 + 4 * len(dims)).reshape(dims)


def prepare(fashion_dir, work_dir, split, limit):
    """Packs the first `limit` images of a split (train or t10k); returns the dataset path."""
    name = f"fashion-mnist-{split}-{limit or 'all'}"
    dataset = Path(work_dir) / name
    if (dataset / "manifest.stoker").exists():
        return str(dataset)
    images = read_idx(Path(fashion_dir) / f"{split}-images-idx3-ubyte.gz", 0x803)
    labels = read_idx(Path(fashion_dir) / f"{split}-labels-idx1-ubyte.gz", 0x801)
    if limit:
        images, labels = images[:limit], labels[:limit]
    folder = Path(work_dir) / (name + ".files")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    # A list file in a random order, not an ImageFolder: pack keeps a list's
    # order, and the loader shuffles within windows of shards, so shards
    # holding one class each (an ImageFolder packs class by class) would give
    # batches of few classes for much of an epoch.
    order = np.random.default_rng(12345).permutation(len(images))
    lines = []
    for i in order:
        (folder / f"{i:05d}.raw").write_bytes(images[i].tobytes())
        lines.append(f"{i:05d}.raw {labels[i]}\n")
    (folder / "list.txt").write_text("".join(lines))
    t = time.time()
    info = stoker.pack(folder / "list.txt", dataset)
    shutil.rmtree(folder)
    print(f"packed {info['samples']} {split} images into {info['shards']} shards at {dataset} "
          f"({time.time() - t:.1f} s)", flush=True)
    return str(dataset)


def images_of(batch):
    """The batch's raw images as N x 1 x 28 x 28 float, from the zero-copy bytes."""
    column = batch["image"]
    n = len(column)
    if not torch.equal(column.offsets, torch.arange(n + 1) * IMAGE_BYTES):
        raise ValueError("a sample is not a 28 x 28 image")
    return column.data[:n * IMAGE_BYTES].view(n, 1, 28, 28).float().div_(255)


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 7 * 7, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def save_checkpoint(root, model, optimizer, loader, step):
    """Starts an asynchronous save; returns its handle. The state is copied
    before this returns, so training may change the weights right away; the
    previous checkpoint stays the latest until this one is committed."""
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "loader": loader.state_dict(), "step": step}
    return stoker.save(state, root, step=step, async_=True, keep_last=2)


def load_checkpoint(root):
    """The latest committed checkpoint under root, or None if there is none."""
    try:
        return stoker.load(root)
    except FileNotFoundError:  # stoker.NotFoundError: no checkpoint there yet
        return None


def evaluate(model, uri, batch_size):
    loader = stoker.Loader(uri, batch_size, shuffle=False, format="torch")
    correct = total = 0
    model.eval()
    with torch.no_grad():
        for batch in loader:
            keep = ~batch["padding"]  # repeats that even out the ranks count once
            predicted = model(images_of(batch)).argmax(1)
            correct += (predicted == batch["label"])[keep].sum().item()
            total += keep.sum().item()
    model.train()
    return correct, total


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--fashion-dir", default="/usr/share/datasets/fashion-mnist",
                   help="the idx .gz files (Debian: dataset-fashion-mnist)")
    p.add_argument("--work-dir", default="fashion-mnist-stoker",
                   help="where the packed datasets go (reused by later runs)")
    p.add_argument("--limit", type=int, default=0, help="use the first N training images")
    p.add_argument("--steps", type=int, default=500, help="train until this many steps in total")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="stoker's workers (0 = cores)")
    p.add_argument("--checkpoint", help="a checkpoint root (folder or rados:// URI): save there "
                   "every --save-every steps and at the end; resume from its latest")
    p.add_argument("--save-every", type=int, default=100)
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--log-json", help="append one JSON line per step (step, epoch, loss, ids)")
    p.add_argument("--run-log", help="append each step's breakdown (JSON lines, `stoker report`)")
    p.add_argument("--metrics", action="store_true",
                   help="publish Prometheus metrics for `stoker exporter`")
    p.add_argument("--eval-limit", type=int, default=-1,
                   help="evaluate on the first N test images at the end (0 = all, -1 = none)")
    args = p.parse_args(argv)

    torch.manual_seed(args.seed)
    train_uri = prepare(args.fashion_dir, args.work_dir, "train", args.limit)
    if args.metrics:
        stoker.metrics.enable()
    stoker.metrics.start()  # before the Loader, so that it measures its data wait
    loader = stoker.Loader(train_uri, args.batch_size, seed=args.seed, threads=args.threads,
                           format="torch")
    model = SmallCNN()
    if loader.world_size > 1:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("gloo")
        model = DistributedDataParallel(model)
        model.register_comm_hook(None, stoker.timed_allreduce_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    step, epoch = 0, 0
    checkpoint = load_checkpoint(args.checkpoint) if args.checkpoint else None
    if checkpoint is not None:
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        loader.load_state_dict(checkpoint["loader"])
        step, epoch = checkpoint["step"], checkpoint["loader"]["epoch"]
        print(f"resumed from {args.checkpoint} at step {step} (epoch {epoch}, position "
              f"{checkpoint['loader']['position']})", flush=True)

    pending = None  # the save in flight
    log = open(args.log_json, "a") if args.log_json else None
    start, start_step = time.monotonic(), step
    stoker.metrics.start(args.run_log)  # the first step begins now
    print(f"training on {loader.info['samples']} images, {len(loader)} batches per epoch, "
          f"rank {loader.rank}/{loader.world_size}", flush=True)
    while step < args.steps:
        loader.set_epoch(epoch)  # keeps a resume point in this epoch
        for batch in loader:  # the Loader times its data wait itself
            with stoker.phase("compute"):  # the DDP hook's all-reduce inside counts as comm
                loss = F.cross_entropy(model(images_of(batch)), batch["label"])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            step += 1
            if log:
                log.write(json.dumps({"step": step, "epoch": epoch, "loss": loss.item(),
                                      "ids": batch["sample_ids"].tolist()}) + "\n")
            if step % args.log_every == 0 or step == args.steps:
                print(f"step {step} epoch {epoch} loss {loss.item():.4f}", flush=True)
            if args.checkpoint and (step % args.save_every == 0 or step == args.steps):
                if pending is not None:
                    with stoker.phase("checkpoint"):  # waiting for the last save stalls too
                        pending.wait()  # raises if that save failed: never lost silently
                pending = save_checkpoint(args.checkpoint, model, optimizer, loader, step)
            stoker.metrics.step()
            if step >= args.steps:
                break
        else:
            epoch += 1
    elapsed = time.monotonic() - start
    if pending is not None:
        pending.wait()
    if log:
        log.close()
    stats = loader.stats()
    if step > start_step:
        totals = stoker.metrics.totals()
        measured = sum(totals[p] for p in stoker.metrics.PHASES)
        print(f"{step - start_step} steps in {elapsed:.1f} s, waited for data "
              f"{stats['wait_seconds']:.2f} s", flush=True)
        print(stoker.metrics.table(totals))
        print(f"breakdown: {measured:.3f} s of {elapsed:.3f} s measured "
              f"({100 * measured / elapsed:.1f}%)", flush=True)
    if args.eval_limit >= 0:
        test_uri = prepare(args.fashion_dir, args.work_dir, "t10k", args.eval_limit)
        correct, total = evaluate(model, test_uri, 256)
        print(f"test accuracy {correct / total:.3f} ({correct}/{total})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
