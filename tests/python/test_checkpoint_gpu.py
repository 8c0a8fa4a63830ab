"""Checkpoints of CUDA tensors on a GPU (docs/checkpoint.md §9): saved through
pinned staging after the current stream, async saves that return before the
copies land (wait_staged), snapshot and bounded modes, restores straight into
device memory (map_location, into=), ShardedTensors on the GPU. Skipped where
torch has no CUDA device (the build VM); scripts/gpu/ckpt_gpu.sh runs it on
the GPU machine. The staging logic itself is tested here too, against a
stand-in runtime (tests/ckpt_device_test.cc).
"""

import os

import pytest
import torch

import stoker

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def state(device="cuda:0", n=4, rows=1024):
    g = torch.Generator(device=device).manual_seed(3)
    return {f"layer{i}": {"w": torch.randn(rows, 1024, device=device, generator=g)
                          .to(torch.bfloat16),
                          "m": torch.randn(rows, 1024, device=device, generator=g)}
            for i in range(n)}


def same(a, b):
    for k in a:
        for j in a[k]:
            assert torch.equal(a[k][j].cpu(), b[k][j].cpu()), (k, j)


@pytest.mark.parametrize("mode", ["snapshot", "bounded"])
def test_async_save_of_cuda_tensors_then_changes_after_wait_staged(tmp_path, mode):
    c = stoker.Checkpointer(str(tmp_path / "ckpt"), device_staging=mode,
                            staging_ring_bytes=64 << 20)
    s = state()
    # Work still queued on the current stream when save() is called: the
    # copies must see its result.
    torch.cuda._sleep(50_000_000)
    for v in s.values():
        v["w"].add_(1)
    want = {k: {j: t.clone() for j, t in v.items()} for k, v in s.items()}
    h = c.save(s, "step-1", async_=True)
    h.wait_staged()
    for v in s.values():  # the optimizer step
        v["w"].zero_()
        v["m"].zero_()
    assert h.wait()
    got = c.load("step-1", map_location="cuda:0")
    assert got["layer0"]["w"].device.type == "cuda"
    same(got, want)
    c.close()


def test_load_into_cuda_targets_and_sharded_pieces(tmp_path):
    uri = str(tmp_path / "ckpt")
    s = state(n=2, rows=256)
    stoker.save(s, uri, step=1)
    into = state(n=2, rows=256)
    for v in into.values():
        v["w"].zero_()
    got = stoker.load(uri, into=into)
    assert got["layer0"]["w"] is into["layer0"]["w"]
    same(into, s)
    w = torch.arange(64 * 32, dtype=torch.float32, device="cuda").reshape(64, 32)
    stoker.save({"w": stoker.ShardedTensor(w[:32].contiguous(), (64, 32), (0, 0))}, uri + "2",
                step=1, rank=0, world_size=1)
    target = stoker.ShardedTensor(torch.zeros(16, 32, device="cuda"), (64, 32), (8, 0))
    stoker.load(uri + "2", into={"w": target})
    assert torch.equal(target.local, w[8:24])


def resident_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_hundred_saves_hold_the_same_memory(tmp_path):
    c = stoker.Checkpointer(str(tmp_path / "ckpt"))
    s = state(n=2, rows=256)  # 3 MiB of CUDA tensors: 3 MiB of pinned staging a save
    torch.cuda.synchronize()
    for i in range(100):
        h = c.save(s, f"s-{i}", async_=True, keep_last=2)
        h.wait_staged()
        h.wait()
        if i == 1:
            device = torch.cuda.memory_allocated()
            resident = resident_bytes()
    assert torch.cuda.memory_allocated() == device
    # Pinned staging is resident: staging allocated anew by each of the 98
    # saves would add ~294 MiB; reused, the process stays within a few MiB.
    grown = resident_bytes() - resident
    assert grown < 32 << 20, f"resident memory grew by {grown} bytes over 98 saves"
    c.close()
