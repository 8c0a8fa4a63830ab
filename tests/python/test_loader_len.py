"""len(loader) and loader.num_batches are the C++ plan's counts (issue 35,
item 1): for every loader mode, what iterating yields. Node affinity on
uneven shards is the case a Python recount got wrong (25 said, 30 yielded)."""
import pytest

import stoker

from test_tokens import named_docs, stoker_bin, write_megatron  # noqa: F401


@pytest.fixture(scope="module")
def uneven(tmp_path_factory):
    """A dataset whose shards hold very different sample counts."""
    uri = str(tmp_path_factory.mktemp("len") / "ds")
    with stoker.Writer(uri, fields={"x": "bytes", "i": "int64"}, shard_bytes=16 << 10) as w:
        for i in range(997):
            # Runs of large then small records: shards of ~3 and of ~150 samples.
            size = 5000 if (i // 40) % 2 == 0 else 60
            w.write({"x": b"v" * size, "i": i})
    assert stoker.inspect(uri)["shards"] > 8
    return uri


def yielded(loader):
    return sum(1 for _ in loader)


MODES = [
    dict(),
    dict(drop_last=True),
    dict(shuffle=False),
    dict(shuffle=False, drop_last=True),
    dict(world_size=3),
    dict(world_size=3, drop_last=True),
    dict(world_size=4, node_affinity=True, ranks_per_node=2),
    dict(world_size=4, node_affinity=True, ranks_per_node=2, drop_last=True),
    dict(world_size=6, node_affinity=True, ranks_per_node=3, shuffle_window=2),
]


@pytest.mark.parametrize("mode", MODES, ids=[",".join(f"{k}={v}" for k, v in m.items()) or
                                             "default" for m in MODES])
def test_len_is_what_every_rank_yields(uneven, mode):
    world = mode.get("world_size", 1)
    for seed in (0, 1, 7):
        for rank in range(world):
            opts = dict(mode, rank=rank, world_size=world, seed=seed)
            loader = stoker.Loader(uneven, batch_size=16, format="numpy", **opts)
            for epoch in (0, 1):
                loader.set_epoch(epoch)
                n = len(loader)
                assert loader.num_batches == n
                assert yielded(loader) == n, (opts, epoch)


def test_num_batches_after_a_resume_mid_epoch(uneven):
    for mode in (dict(), dict(world_size=4, node_affinity=True, ranks_per_node=2)):
        world = mode.get("world_size", 1)
        loaders = [stoker.Loader(uneven, batch_size=8, format="numpy", seed=2, rank=r,
                                 world_size=world, **{k: v for k, v in mode.items()
                                                      if k != "world_size"})
                   for r in range(world)]
        its = [iter(ld) for ld in loaders]
        for it in its:
            for _ in range(5):
                next(it)
        state = loaders[0].state_dict()
        for r in range(world):
            other = stoker.Loader(uneven, batch_size=8, format="numpy", seed=2, rank=r,
                                  world_size=world, **{k: v for k, v in mode.items()
                                                       if k != "world_size"})
            other.load_state_dict(state)
            n = other.num_batches
            assert n == len(loaders[r]) - 5
            assert yielded(other) == n


def test_len_of_token_windows(tmp_path):
    import subprocess
    write_megatron(tmp_path / "c", named_docs(60, seed=4))
    uri = str(tmp_path / "ds")
    r = subprocess.run([stoker_bin(), "pack", "--quiet", "--shard-mib", "0.01",
                        str(tmp_path / "c.idx"), uri], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for world in (1, 3):
        for drop_last in (False, True):
            for rank in range(world):
                loader = stoker.Loader(uri, batch_size=5, sequence_length=31, rank=rank,
                                       world_size=world, drop_last=drop_last)
                assert yielded(loader) == len(loader) > 0
