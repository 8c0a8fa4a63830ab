"""stoker.ShardedTensor: a state saved by 4 rank processes, each holding pieces
of global tensors (rows, columns, flat ZeRO ranges, replicated), loads into
ShardedTensor targets of another split on 1, 2, 3 and 8 ranks, element for
element; per-rank scalars follow the stated rule (docs/checkpoint.md §6.1);
bad targets are refused naming both layouts. DTensor where torch has it.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import stoker

SHAPES = {"w": (64, 40), "v": (12, 30), "z": (50, 9), "b": (7,)}


def global_tensors():
    g = torch.Generator().manual_seed(33)
    return {
        "w": torch.randn(SHAPES["w"], generator=g),
        "v": torch.randn(SHAPES["v"], generator=g).to(torch.bfloat16),
        "z": torch.randn(SHAPES["z"], generator=g),
        "b": torch.arange(7, dtype=torch.int64),
    }


def split(n, parts, i):
    base, extra = divmod(n, parts)
    lo = i * base + min(i, extra)
    return lo, lo + base + (1 if i < extra else 0)


def rows(t, world, rank):
    lo, hi = split(t.shape[0], world, rank)
    return stoker.ShardedTensor(t[lo:hi].clone(), t.shape, (lo,) + (0,) * (t.dim() - 1))


def cols(t, world, rank):
    lo, hi = split(t.shape[1], world, rank)
    return stoker.ShardedTensor(t[:, lo:hi].clone(), t.shape, (0, lo))


def flat(t, world, rank):
    lo, hi = split(t.numel(), world, rank)
    return stoker.ShardedTensor(t.reshape(-1)[lo:hi].clone(), t.shape, flat_start=lo)


def saved_state(world, rank):
    g = global_tensors()
    return {"model": {"w": rows(g["w"], world, rank), "v": cols(g["v"], world, rank),
                      "b": g["b"].clone()},
            "optim": {"z": flat(g["z"], world, rank)},
            "step": 5, "rng": 100 + rank}


def wanted_state(world, rank):
    """Another split: columns of w, rows of v, rows of the flat-saved z, b as a piece."""
    g = global_tensors()
    zero = {k: torch.zeros_like(v) for k, v in g.items()}
    w, v = cols(zero["w"], world, rank), rows(zero["v"], world, rank)
    z = rows(zero["z"], world, rank)
    b = stoker.ShardedTensor(zero["b"].clone(), (7,), (0,))
    return {"model": {"w": w, "v": v, "b": b}, "optim": {"z": z}, "step": None, "rng": None}


def expected(world, rank):
    g = global_tensors()
    return {"w": cols(g["w"], world, rank).local, "v": rows(g["v"], world, rank).local,
            "z": rows(g["z"], world, rank).local, "b": g["b"]}


SAVE = """
import sys
sys.path.insert(0, {tests!r})
import stoker
import test_checkpoint_reshard as t
uri, world, rank, how = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
stoker.save(getattr(t, how)(world, rank), uri, step=1, rank=rank, world_size=world)
print("saved", rank)
"""


def run_ranks(code, world, *args, env=None):
    env = dict(env or os.environ)
    for k in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"):
        env.pop(k, None)
    procs = [subprocess.Popen([sys.executable, "-c", code, *args[:1], str(world), str(r),
                               *args[1:]], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for r in range(world)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
        outs.append(out)
    return outs


def save_on_ranks(uri, world, how="saved_state"):
    run_ranks(SAVE.format(tests=os.path.dirname(__file__)), world, uri, how)


def without_w_on_rank_1(world, rank):
    g = global_tensors()
    return {"w": rows(g["w"], world, rank)} if rank != 1 else {"other": torch.zeros(3)}


@pytest.fixture(scope="module")
def saved_by_four(tmp_path_factory):
    uri = str(tmp_path_factory.mktemp("reshard") / "ckpt")
    save_on_ranks(uri, 4)
    return uri


@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_saved_by_four_loads_on_any_world_size(saved_by_four, world):
    for rank in range(world):
        into = wanted_state(world, rank)
        got = stoker.load(saved_by_four, rank=rank, world_size=world, into=into)
        want = expected(world, rank)
        assert got["model"]["w"] is into["model"]["w"], "the targets are filled in place"
        for path, piece in (("w", got["model"]["w"]), ("v", got["model"]["v"]),
                            ("z", got["optim"]["z"]), ("b", got["model"]["b"])):
            assert torch.equal(piece.local, want[path]), (path, rank, world)
        assert got["step"] == 5
        # Per-rank values: this rank's where the checkpoint has it, else rank 0's.
        assert got["rng"] == (100 + rank if rank < 4 else 100)


def test_without_into_pieces_come_back_as_sharded_tensors(saved_by_four):
    state = stoker.load(saved_by_four, rank=2, world_size=4)
    w = state["model"]["w"]
    assert isinstance(w, stoker.ShardedTensor)
    assert w.global_shape == SHAPES["w"] and w.offsets == (32, 0)
    assert torch.equal(w.local, global_tensors()["w"][32:48])
    z = state["optim"]["z"]
    assert z.offsets is None and z.flat_start == split(450, 4, 2)[0]
    assert isinstance(state["model"]["b"], torch.Tensor)
    info = stoker.Checkpointer(saved_by_four).info()
    assert info["world_size"] == 4


def test_numpy_and_strided_targets(saved_by_four):
    g = global_tensors()
    z = np.zeros((25, 9), dtype=np.float32)
    wt = torch.zeros(SHAPES["w"][1], 64).t()[:, 0:20]  # a strided view: filled after the read
    into = {"optim": {"z": stoker.ShardedTensor(z, SHAPES["z"], (25, 0))},
            "model": {"w": stoker.ShardedTensor(wt, SHAPES["w"], (0, 0))}}
    stoker.load(saved_by_four, rank=1, world_size=2, into=into)
    assert np.array_equal(z, g["z"][25:].numpy())
    assert torch.equal(wt, g["w"][:, 0:20])


def test_bad_targets_name_both_layouts(saved_by_four):
    wrong_dtype = {"model": {"w": stoker.ShardedTensor(torch.zeros(32, 40, dtype=torch.float64),
                                                       SHAPES["w"], (0, 0))}}
    with pytest.raises(ValueError, match=r"model.*w.*float64.*'model.w' is float32"):
        stoker.load(saved_by_four, rank=0, world_size=2, into=wrong_dtype)
    wrong_shape = {"model": {"w": stoker.ShardedTensor(torch.zeros(32, 40), (65, 40), (0, 0))}}
    with pytest.raises(stoker.InvalidArgumentError,
                       match=r"'model.w': another global shape \(the destination is float32 box "
                             r"\[32, 40\] at \[0, 0\] of \[65, 40\]; the checkpoint holds float32 "
                             r"of global shape \[64, 40\] in 4 piece"):
        stoker.load(saved_by_four, rank=0, world_size=2, into=wrong_shape)
    with pytest.raises(ValueError, match=r"dimension 0: \[60, 70\) is not inside \[0, 64\)"):
        stoker.ShardedTensor(torch.zeros(10, 40), SHAPES["w"], (60, 0))
    with pytest.raises(ValueError, match="exactly one of offsets"):
        stoker.ShardedTensor(torch.zeros(10), (10,))


def test_a_missing_piece_names_the_rank(tmp_path):
    uri = str(tmp_path / "ckpt")
    save_on_ranks(uri, 2, "without_w_on_rank_1")
    into = {"w": stoker.ShardedTensor(torch.zeros(SHAPES["w"]), SHAPES["w"], (0, 0))}
    with pytest.raises(stoker.NotFoundError,
                       match=r"tensor 'w': no saved piece holds element \[32, 0\] of \[64, 40\].*"
                             r"rank\(s\) 1 saved no piece of it"):
        stoker.load(uri, rank=0, world_size=1, into=into)


DTENSOR = """
import os, sys, json
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, Replicate, distribute_tensor
import stoker
uri, world, rank, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))
dist.init_process_group("gloo", rank=rank, world_size=world)
mesh = init_device_mesh("cpu", (world,))
g = torch.Generator().manual_seed(5)
w, b = torch.randn(30, 8, generator=g), torch.randn(8, generator=g)
if mode == "save":
    state = {"w": distribute_tensor(w, mesh, [Shard(0)]), "b": distribute_tensor(b, mesh, [Replicate()])}
    stoker.save(state, uri, step=1)
else:
    into = {"w": distribute_tensor(torch.zeros(30, 8), mesh, [Shard(1)]),
            "b": distribute_tensor(torch.zeros(8), mesh, [Shard(0)])}
    stoker.load(uri, into=into)
    ok = torch.equal(into["w"].full_tensor(), w) and torch.equal(into["b"].full_tensor(), b)
    print(json.dumps({"ok": ok}))
dist.barrier()
dist.destroy_process_group()
"""


def test_dtensor_saved_on_two_loads_on_three(tmp_path):
    if stoker.checkpoint._dtensor_type() is None:
        pytest.skip(f"torch {torch.__version__} has no torch.distributed.tensor.DTensor "
                    "(the GPU machine's torch runs this)")
    uri = str(tmp_path / "ckpt")
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000))
    run_ranks(DTENSOR, 2, uri, "save", env=env)
    env["MASTER_PORT"] = str(int(env["MASTER_PORT"]) + 1)
    outs = run_ranks(DTENSOR, 3, uri, "load", env=env)
    assert all(json.loads(o.strip().splitlines()[-1])["ok"] for o in outs)
