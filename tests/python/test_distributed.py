"""Ranks as separate processes, each finding its rank in the launcher's variables."""

import json

import pytest

import stoker
from conftest import run_python

RANK_SCRIPT = """
import json, sys, stoker
loader = stoker.Loader(sys.argv[1] if len(sys.argv) > 1 else {uri!r}, {batch}, seed=7,
                       drop_last={drop_last})
loader.set_epoch(1)
batches = [(b["sample_ids"].tolist(), b["padding"].tolist()) for b in loader]
print(json.dumps({{"rank": loader.rank, "world": loader.world_size, "len": len(loader),
                  "batches": batches}}))
"""


def run_ranks(uri, world, batch, drop_last, env_of_rank):
    import subprocess
    import sys
    import os

    code = RANK_SCRIPT.format(uri=uri, batch=batch, drop_last=drop_last)
    procs = []
    for rank in range(world):
        env = dict(os.environ)
        for var in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                    "PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
            env.pop(var, None)
        env.update(env_of_rank(rank, world))
        procs.append(subprocess.Popen([sys.executable, "-c", code], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(json.loads(out))
    return results


def torchrun_env(rank, world):
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)}


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_split_the_dataset(dataset, world, drop_last):
    uri, src = dataset
    n, batch = len(src), 16
    results = run_ranks(uri, world, batch, drop_last, torchrun_env)
    assert [r["rank"] for r in results] == list(range(world))
    assert all(r["world"] == world for r in results)
    counts = {len(r["batches"]) for r in results}
    assert counts == {results[0]["len"]}, "every rank gets the same number of batches"

    real, padding = [], []
    for r in results:
        for ids, pad in r["batches"]:
            real += [i for i, p in zip(ids, pad) if not p]
            padding += [i for i, p in zip(ids, pad) if p]
    assert len(real) == len(set(real)), "no sample twice, apart from padding"
    if drop_last:
        assert not padding
        assert len(real) == n // (world * batch) * world * batch
    else:
        assert sorted(real) == list(range(n)), "the ranks together see the whole dataset"
        per_rank = -(-n // world)
        assert len(padding) == per_rank * world - n
        assert set(padding) <= set(real)


@pytest.mark.parametrize("launcher", ["mpirun", "slurm"])
def test_rank_from_mpirun_and_slurm_variables(dataset, launcher):
    uri, src = dataset
    names = {"mpirun": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
             "slurm": ("SLURM_PROCID", "SLURM_NTASKS")}[launcher]
    results = run_ranks(uri, 2, 10, False,
                        lambda rank, world: {names[0]: str(rank), names[1]: str(world)})
    assert [(r["rank"], r["world"]) for r in results] == [(0, 2), (1, 2)]
    ids = [i for r in results for b in r["batches"] for i, p in zip(*b) if not p]
    assert sorted(ids) == list(range(len(src)))


def test_distributed_env_precedence_and_errors():
    env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1"}
    assert stoker.distributed_env(env) == (3, 8, 1, "slurm")
    env.update({"RANK": "5", "WORLD_SIZE": "16", "LOCAL_RANK": "2"})  # torchrun under srun
    assert stoker.distributed_env(env) == (5, 16, 2, "torchrun")
    assert stoker.distributed_env({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}) \
        == (1, 2, 0, "openmpi")
    assert stoker.distributed_env({"RANK": "1"}) == (0, 1, 0, None)  # half a pair is no launcher
    assert stoker.distributed_env({}) == (0, 1, 0, None)
    with pytest.raises(ValueError, match="WORLD_SIZE='four'"):
        stoker.distributed_env({"RANK": "0", "WORLD_SIZE": "four"})
    with pytest.raises(ValueError, match="RANK=4 is not below WORLD_SIZE=4"):
        stoker.distributed_env({"RANK": "4", "WORLD_SIZE": "4"})


def test_loader_takes_rank_from_environment(dataset, monkeypatch):
    uri, _ = dataset
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    loader = stoker.Loader(uri, 8)
    assert (loader.rank, loader.world_size) == (2, 3)
    explicit = stoker.Loader(uri, 8, rank=0, world_size=1)
    assert (explicit.rank, explicit.world_size) == (0, 1)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="RANK=2 is not below WORLD_SIZE=2"):
        stoker.Loader(uri, 8)
    with pytest.raises(ValueError, match="rank 1 must be below world_size 1"):
        stoker.Loader(uri, 8, rank=1, world_size=1)


def test_fork_child_gets_an_error_not_a_hang(dataset):
    uri, _ = dataset
    result = run_python(f"""
import os, sys, stoker
loader = stoker.Loader({uri!r}, 8, rank=0, world_size=1)
it = iter(loader); next(it)
pid = os.fork()
if pid == 0:
    try:
        next(iter(loader))
    except RuntimeError as e:
        os._exit(0 if "forked child" in str(e) else 2)
    os._exit(1)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
print("parent", len(list(it)) + 1 == len(loader))
""", timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["child", "0", "parent", "True"]
