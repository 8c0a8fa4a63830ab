"""The peer of `stoker bench comm`: torch.distributed all_reduce, timed the
same way (warm-up, the ranks start together, `iters` back to back, the mean
per iteration averaged over ranks; busbw = bytes / time x 2(n-1)/n, as
nccl-tests). gloo on host memory, nccl on each rank's GPU.

Launch it as stoker: `mpirun -np 4 python3 bench/comm_peer.py --backend
gloo ...` (the rendezvous is MASTER_ADDR:MASTER_PORT, default
127.0.0.1:29533) or `torchrun --nproc-per-node N bench/comm_peer.py ...`.
Prints one JSON object on rank 0: {"results": [{op, dtype, bytes,
time_us, algbw_gbps, busbw_gbps}, ...]}, the results checked (the sum of
every rank's rank-dependent input)."""
import argparse
import datetime
import json
import os
import time

import torch
import torch.distributed as dist


def launcher_env():
    # The bench's own launcher lookup: this script is a peer, not the stoker
    # package (whose rank discovery is stoker.distributed_env).
    for rank, size, local in (("RANK", "WORLD_SIZE", "LOCAL_RANK"),
                              ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                               "OMPI_COMM_WORLD_LOCAL_RANK")):
        if rank in os.environ and size in os.environ:
            return int(os.environ[rank]), int(os.environ[size]), int(os.environ.get(local, 0))
    raise SystemExit("comm_peer.py: start it under mpirun or torchrun")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    p.add_argument("--sizes", default="67108864", help="comma-separated bytes")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--copy-in", action="store_true",
                   help="copy the input into the buffer before each all_reduce (out of place, "
                        "as stoker's bench; for one rank, where NCCL's in-place sum has nothing "
                        "to do)")
    a = p.parse_args()
    rank, world, local = launcher_env()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    device = torch.device("cpu")
    if a.backend == "nccl":
        device = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(device)
    dist.init_process_group(a.backend, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    dtype = getattr(torch, a.dtype)
    sync = torch.cuda.synchronize if a.backend == "nccl" else (lambda: None)
    results = []
    for size in [int(s) for s in a.sizes.split(",")]:
        count = size // torch.empty((), dtype=dtype).element_size()
        x = torch.full((count,), float(rank + 1), dtype=dtype, device=device)
        for _ in range(max(a.warmup, 1)):
            y = x.clone()
            dist.all_reduce(y)
        sync()
        want = world * (world + 1) / 2
        if not bool((y == want).all()):
            raise SystemExit(f"comm_peer.py: rank {rank}: wrong all_reduce at {size} B")
        dist.barrier()
        y = torch.empty_like(x)
        start = time.perf_counter()
        for _ in range(a.iters):
            if a.copy_in:
                y.copy_(x)
                dist.all_reduce(y)
            else:
                dist.all_reduce(x)  # in place, as DDP does; the values grow, the time does not
        sync()
        us = (time.perf_counter() - start) / a.iters * 1e6
        t = torch.tensor([us], dtype=torch.float64, device=device)
        dist.all_reduce(t)
        us = t.item() / world
        algbw = size / us / 1e3
        results.append({"op": "allreduce", "dtype": a.dtype, "bytes": size, "time_us": us,
                        "algbw_gbps": algbw, "busbw_gbps": algbw * 2 * (world - 1) / world})
    if rank == 0:
        print(json.dumps({"peer": f"torch.distributed {a.backend} {torch.__version__}"
                                  + (" copy+all_reduce" if a.copy_in else ""),
                          "world_size": world, "results": results}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
