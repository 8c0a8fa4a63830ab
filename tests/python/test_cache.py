"""The node cache from Python: stoker.Loader(..., cache=DIR, cache_bytes=N)."""

import pytest

import stoker


def _epoch(loader):
    out = {}
    for batch in loader:
        for k, sid in enumerate(batch["sample_ids"].tolist()):
            out[sid] = batch["image"][k].tobytes()
    return out


def test_cache_serves_later_epochs_and_a_second_loader(dataset, tmp_path):
    uri, src = dataset
    cache = tmp_path / "cache"
    with stoker.Loader(uri, 16, cache=cache, rank=0, world_size=1) as loader:
        first = _epoch(loader)
        s = loader.stats()
        assert s["remote_bytes"] > 0  # fetched by the reads or the prefetch
        loader.set_epoch(1)
        second = _epoch(loader)
        s2 = loader.stats()
        assert s2["remote_bytes"] == s["remote_bytes"], "epoch 2 read nothing from the store"
        assert s2["cache_hits"] > s["cache_hits"]
    assert first == second
    assert first == {i: data for i, (data, _) in enumerate(src.expected)}
    # Another job on the same folder: everything from the cache.
    with stoker.Loader(uri, 16, cache=str(cache), rank=0, world_size=1,
                       cache_policy="lru") as other:
        assert _epoch(other) == first
        assert other.stats()["remote_bytes"] == 0


def test_cache_options_are_checked(dataset, tmp_path):
    uri, _ = dataset
    with pytest.raises(ValueError, match="cache_policy"):
        stoker.Loader(uri, 16, cache=tmp_path / "c", cache_policy="fifo", rank=0, world_size=1)
    with pytest.raises(ValueError, match="cache_bytes"):
        stoker.Loader(uri, 16, cache=tmp_path / "c", cache_bytes=-1, rank=0, world_size=1)
