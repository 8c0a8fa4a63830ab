"""The Loader's defaults fit the dataset: memory sized from it and the machine."""

import pytest

import stoker
from conftest import SourceData


def big_samples(tmp_path):
    """60 samples of 150-300 KB in 1 MiB shards: a wide window of them is big."""
    src = SourceData(tmp_path / "src", classes=2, per_class=30, seed=3, min_size=150_000,
                     max_size=300_000)
    dst = tmp_path / "ds"
    stoker.pack(src.root, dst, shard_mib=1, shuffle=False)
    return str(dst), src


def test_default_budget_reads_big_samples_with_a_wide_window(tmp_path):
    uri, src = big_samples(tmp_path)
    with stoker.Loader(uri, 16, rank=0, world_size=1, read_unit="shard",
                       shuffle_window=8) as loader:
        seen = {}
        for batch in loader:
            for i, sid in enumerate(batch["sample_ids"].tolist()):
                lo, hi = batch["image"].offsets[i], batch["image"].offsets[i + 1]
                seen[sid] = bytes(batch["image"].data[lo:hi])
        assert len(seen) == len(src)
        assert all(seen[i] == src.expected[i][0] for i in seen)
        stats = loader.stats()
        assert stats["decode_skipped"] == 0
        assert stats["samples_delivered"] == len(src)


def test_explicit_small_budget_is_refused_with_what_it_needs(tmp_path):
    uri, _ = big_samples(tmp_path)
    with pytest.raises(ValueError, match="memory_budget 4 MiB is too small.*needs at least"):
        stoker.Loader(uri, 16, rank=0, world_size=1, read_unit="shard", shuffle_window=8,
                      memory_budget=4 << 20)
