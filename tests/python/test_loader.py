"""stoker.Loader: content, zero copy, lifetime, epochs, len, resume."""

import gc
import pickle

import numpy as np
import pytest

import stoker
from conftest import collect_ids, make_dataset


def check_batch_content(batch, src):
    """Every sample's bytes and label equal the source file's."""
    ids = batch["sample_ids"]
    images = batch["image"]
    assert isinstance(images, stoker.BytesColumn)
    assert len(images) == len(ids) == len(batch["label"]) == len(batch["padding"])
    for k, sid in enumerate(ids.tolist()):
        data, label = src.expected[sid]
        assert images[k].tobytes() == data, f"sample {sid}"
        assert batch["label"][k] == label


def test_one_epoch_delivers_every_sample_once_with_its_bytes(dataset):
    uri, src = dataset
    loader = stoker.Loader(uri, batch_size=16, rank=0, world_size=1)
    seen = []
    for batch in loader:
        assert batch["sample_ids"].dtype == np.uint64
        assert batch["label"].dtype == np.int64
        assert batch["padding"].dtype == np.bool_ and not batch["padding"].any()
        assert batch["image"].offsets.dtype == np.uint64
        assert batch["image"].data.dtype == np.uint8
        check_batch_content(batch, src)
        seen += batch["sample_ids"].tolist()
    assert sorted(seen) == list(range(len(src)))
    assert seen != sorted(seen), "shuffle=True should not give the packed order"


def test_read_units_deliver_the_same_batches(dataset):
    uri, src = dataset
    runs = {}
    for unit in ("shard", "sample", "map"):
        loader = stoker.Loader(uri, batch_size=16, rank=0, world_size=1, seed=3, read_unit=unit)
        assert loader.read_unit == unit
        runs[unit] = []
        for batch in loader:
            check_batch_content(batch, src)
            runs[unit].append((batch["sample_ids"].tolist(), batch["label"].tolist(),
                               batch["image"].data.tobytes()))
    assert runs["shard"] == runs["sample"] == runs["map"]
    # Mapped reads keeping no mapping between epochs: the same batches, twice.
    loader = stoker.Loader(uri, batch_size=16, rank=0, world_size=1, seed=3, read_unit="map",
                           store={"keep_mapped_bytes": 1})
    for epoch in range(2):
        loader.set_epoch(epoch)
        got = [(b["sample_ids"].tolist(), b["label"].tolist(), b["image"].data.tobytes())
               for b in loader]
        if epoch == 0:
            assert got == runs["map"]
        assert sorted(i for ids, _, _ in got for i in ids) == list(range(len(src)))
    # Small samples: auto keeps whole-shard reads.
    assert stoker.Loader(uri, 16, rank=0, world_size=1).read_unit == "shard"
    with pytest.raises(ValueError, match="read_unit must be"):
        stoker.Loader(uri, 16, rank=0, world_size=1, read_unit="records")


def test_no_shuffle_gives_packed_order(dataset):
    uri, src = dataset
    ids = [i for b in collect_ids(stoker.Loader(uri, 7, shuffle=False, world_size=1, rank=0))
           for i in b]
    assert ids == list(range(len(src)))


def test_info_describes_the_dataset(dataset):
    uri, src = dataset
    loader = stoker.Loader(uri, 8, world_size=1, rank=0)
    assert loader.info["samples"] == len(src)
    assert loader.info["classes"] == [f"class{c:02d}" for c in range(4)]
    assert [f["name"] for f in loader.info["fields"]] == ["image", "label"]
    assert loader.info == stoker.inspect(uri)


def test_fields_selects_what_is_delivered(dataset):
    uri, src = dataset
    batch = next(iter(stoker.Loader(uri, 8, fields=["label"], world_size=1, rank=0)))
    assert set(batch) == {"sample_ids", "padding", "label"}
    assert batch["label"].tolist() == [src.expected[i][1] for i in batch["sample_ids"].tolist()]


def test_bytes_column_indexing_and_tolist(dataset):
    uri, src = dataset
    batch = next(iter(stoker.Loader(uri, 5, world_size=1, rank=0)))
    col = batch["image"]
    expected = [src.expected[i][0] for i in batch["sample_ids"].tolist()]
    assert col.tolist() == expected
    assert col[-1].tobytes() == expected[-1]
    assert [x.tobytes() for x in col] == expected
    with pytest.raises(IndexError):
        col[5]


# ---- zero copy and lifetime ----------------------------------------------------


def array_address(a):
    return a.__array_interface__["data"][0]


def arrays_of(batch):
    for value in batch.values():
        if isinstance(value, stoker.BytesColumn):
            yield value.offsets
            yield value.data
        else:
            yield value


def test_arrays_are_views_of_the_batch_buffer(dataset):
    uri, _ = dataset
    loader = stoker.Loader(uri, 16, world_size=1, rank=0)
    buffers = set()
    for batch in loader:
        address, size = loader._impl.last_buffer
        assert size > 0
        buffers.add(address)
        for a in arrays_of(batch):
            start = array_address(a)
            assert address <= start and start + a.nbytes <= address + size, \
                "array memory must lie inside the batch buffer (no copy)"
            assert not a.flags.owndata
    # One array's base is the batch's buffer owner, shared by all its arrays.
    assert len(buffers) >= 2


def test_arrays_outlive_loader_and_later_epochs(tmp_path):
    uri, src = make_dataset(tmp_path, classes=3, per_class=60)
    loader = stoker.Loader(uri, 8, prefetch=1, world_size=1, rank=0)
    kept = []  # (sample ids, labels, offsets, data) arrays only; the dicts are dropped
    for batch in loader:
        kept.append((batch["sample_ids"], batch["label"], batch["image"].offsets,
                     batch["image"].data))
    del batch
    # Another epoch recycles the pool's buffers: held ones must not be reused.
    loader.set_epoch(1)
    for batch in loader:
        batch["image"].data[:] = 0xEE  # scribble over the new batches' memory
    del batch
    loader.close()
    del loader
    gc.collect()
    garbage = [np.full(1 << 16, 0xAB, np.uint8) for _ in range(64)]  # reuse freed memory
    seen = []
    for ids, labels, offsets, data in kept:
        for k, sid in enumerate(ids.tolist()):
            expected, label = src.expected[sid]
            assert data[offsets[k]:offsets[k + 1]].tobytes() == expected
            assert labels[k] == label
        seen += ids.tolist()
    assert sorted(seen) == list(range(len(src)))
    del garbage


def test_dropped_batches_go_back_to_the_pool(dataset):
    uri, _ = dataset
    loader = stoker.Loader(uri, 4, prefetch=2, world_size=1, rank=0)
    delivered_bytes = 0
    for epoch in range(4):
        loader.set_epoch(epoch)
        for batch in loader:
            delivered_bytes += loader._impl.last_buffer[1]
    stats = loader.stats()
    assert stats["batches_delivered"] == 4 * len(loader)
    # Shard buffers aside, the batch buffers in use at once are a handful:
    # far less than everything delivered, which a leak would need.
    shard_bytes = stoker.inspect(uri)["bytes"]
    assert stats["peak_buffer_bytes"] - shard_bytes < delivered_bytes / 4


# ---- len, epochs ---------------------------------------------------------------


@pytest.mark.parametrize("batch_size,world_size,drop_last", [
    (1, 1, False), (7, 1, False), (7, 1, True), (16, 3, False), (16, 3, True), (64, 4, False),
    (64, 4, True), (300, 2, False), (300, 2, True)])
def test_len_is_what_an_epoch_yields(dataset, batch_size, world_size, drop_last):
    uri, src = dataset
    for rank in range(world_size):
        loader = stoker.Loader(uri, batch_size, rank=rank, world_size=world_size,
                               drop_last=drop_last)
        assert len(loader) == loader._impl.num_batches()
        assert len(collect_ids(loader)) == len(loader) == loader.num_batches


def test_same_epoch_same_order_other_epoch_other_order(dataset):
    uri, _ = dataset
    loader = stoker.Loader(uri, 10, seed=3, world_size=1, rank=0)
    first = collect_ids(loader)
    again = collect_ids(loader)  # no set_epoch: epoch 0 again, like DistributedSampler
    assert again == first
    loader.set_epoch(1)
    second = collect_ids(loader)
    assert second != first
    assert sorted(sum(second, [])) == sorted(sum(first, []))
    other = stoker.Loader(uri, 10, seed=3, world_size=1, rank=0)
    other.set_epoch(1)
    assert collect_ids(other) == second  # deterministic across loaders
    assert collect_ids(stoker.Loader(uri, 10, seed=4, world_size=1, rank=0)) != first


def test_new_iter_ends_the_previous_iterator(dataset):
    uri, _ = dataset
    loader = stoker.Loader(uri, 10, world_size=1, rank=0)
    it1 = iter(loader)
    next(it1)
    it2 = iter(loader)
    with pytest.raises(RuntimeError, match="newer iter"):
        next(it1)
    assert len(list(it2)) == len(loader)


def test_epoch_after_epoch_reads_ahead(dataset):
    uri, _ = dataset
    loader = stoker.Loader(uri, 10, world_size=1, rank=0)
    for epoch in range(3):
        loader.set_epoch(epoch)
        ids = collect_ids(loader)
        assert len(ids) == len(loader)
        reference = stoker.Loader(uri, 10, world_size=1, rank=0)
        reference.set_epoch(epoch)
        assert ids == collect_ids(reference)


# ---- resume --------------------------------------------------------------------


@pytest.mark.parametrize("stop_after", [0, 1, 5, 13])
def test_resume_mid_epoch_equals_uninterrupted(dataset, stop_after):
    uri, _ = dataset
    kwargs = dict(batch_size=9, seed=11, world_size=1, rank=0)
    full = stoker.Loader(uri, **kwargs)
    full.set_epoch(2)
    uninterrupted = collect_ids(full)

    first = stoker.Loader(uri, **kwargs)
    first.set_epoch(2)
    got = []
    it = iter(first)
    for _ in range(stop_after):
        got.append(next(it)["sample_ids"].tolist())
    state = pickle.loads(pickle.dumps(first.state_dict()))  # it must survive a checkpoint
    assert state["epoch"] == 2 and state["position"] == min(9 * stop_after, len(dataset[1]))
    first.close()

    second = stoker.Loader(uri, **kwargs)
    second.load_state_dict(state)
    assert second.state_dict()["position"] == state["position"]
    for epoch in range(2, 4):  # the usual loop; set_epoch(2) keeps the resume point
        second.set_epoch(epoch)
        if epoch == 2:
            assert second.num_batches == len(second) - stop_after
            got += collect_ids(second)
    assert got == uninterrupted


def test_state_after_an_epoch_says_it_is_done(dataset):
    uri, src = dataset
    loader = stoker.Loader(uri, 32, world_size=1, rank=0)
    assert loader.state_dict()["epoch"] == 0 and loader.state_dict()["position"] == 0
    collect_ids(loader)
    state = loader.state_dict()
    assert (state["epoch"], state["position"]) == (0, len(src))
    resumed = stoker.Loader(uri, 32, world_size=1, rank=0)
    resumed.load_state_dict(state)
    assert collect_ids(resumed) == []  # nothing left of epoch 0
    resumed.set_epoch(1)
    assert resumed.state_dict()["position"] == 0
    assert len(collect_ids(resumed)) == len(resumed)


def test_resume_on_another_world_size_covers_the_rest(dataset):
    uri, src = dataset
    one = stoker.Loader(uri, 8, seed=5, world_size=1, rank=0)
    it = iter(one)
    consumed = [i for _ in range(6) for i in next(it)["sample_ids"].tolist()]
    state = one.state_dict()
    rest = []
    for rank in range(3):
        part = stoker.Loader(uri, 8, seed=5, rank=rank, world_size=3)
        part.load_state_dict(state)
        for batch in part:
            rest += batch["sample_ids"][~batch["padding"]].tolist()
    assert sorted(consumed + rest) == list(range(len(src)))


def test_load_state_dict_refuses_a_state_of_something_else(tmp_path, dataset):
    uri, src = dataset
    loader = stoker.Loader(uri, 8, seed=1, world_size=1, rank=0)
    state = loader.state_dict()
    with pytest.raises(ValueError, match="seed 1, this loader has 2"):  # C++'s message
        stoker.Loader(uri, 8, seed=2, world_size=1, rank=0).load_state_dict(state)
    with pytest.raises(ValueError, match="shuffle"):
        stoker.Loader(uri, 8, seed=1, shuffle=False, world_size=1, rank=0).load_state_dict(state)
    other_uri, _ = make_dataset(tmp_path, name="other")
    with pytest.raises(ValueError, match="dataset"):
        stoker.Loader(other_uri, 8, seed=1, world_size=1, rank=0).load_state_dict(state)
    with pytest.raises(ValueError, match="past the end"):
        loader.load_state_dict(dict(state, position=len(src) + 1))
    with pytest.raises(ValueError, match="missing"):
        loader.load_state_dict({"epoch": 1})
    with pytest.raises(TypeError):
        loader.load_state_dict([0, 0])


def test_resume_identity_is_checked_in_cpp_and_old_states_still_load(dataset):
    uri, src = dataset
    saver = stoker.Loader(uri, 8, seed=1, shuffle_window=4, world_size=2, rank=0)
    state = saver.state_dict()
    assert state["version"] == stoker._stoker.LOADER_STATE_VERSION
    assert (state["dataset_id"], state["seed"], state["shuffle"], state["shuffle_window"],
            state["world_size"]) == (saver.info["dataset_id"], 1, True, 4, 2)
    # The previous version's dict (no world_size), a bare position and a part
    # of the identity all load; keys a state lacks are not checked.
    previous = {k: v for k, v in state.items() if k != "world_size"}
    for old in (dict(previous, position=16), {"epoch": 0, "position": 16},
                {"epoch": 0, "position": 16, "seed": 1}):
        loader = stoker.Loader(uri, 8, seed=1, shuffle_window=4, world_size=1, rank=0)
        loader.load_state_dict(old)
        assert loader.state_dict()["position"] == 16
        assert len(collect_ids(loader)) == len(loader) - 2
    stoker.Loader(uri, 8, seed=9, world_size=1, rank=0).load_state_dict({"epoch": 0, "position": 8})
    # A mismatch raises C++'s message (CheckResumeState), word for word,
    # after the dataset it names.
    tail = ": the position would select other samples"
    for kwargs, message in (
            ({"seed": 2}, "resume state was saved with seed 1, this loader has 2" + tail),
            ({"shuffle_window": 8},
             "resume state was saved with shuffle_window_shards 4, this loader has 8" + tail),
            ({"shuffle": False}, "resume state was saved with shuffle 1, this loader has 0" + tail)):
        loader = stoker.Loader(uri, 8, **{"seed": 1, "shuffle_window": 4, **kwargs},
                               world_size=1, rank=0)
        for old in (state, previous, {"epoch": 0, "position": 0, **{k: state[k] for k in kwargs}}):
            with pytest.raises(stoker.InvalidArgumentError) as info:
                loader.load_state_dict(old)
            assert str(info.value) == f"{uri}: {message}"
    with pytest.raises(stoker.InvalidArgumentError,
                       match=f"saved for dataset 0123, this loader reads {state['dataset_id']}"):
        saver.load_state_dict(dict(state, dataset_id="0123"))
    with pytest.raises(stoker.UnsupportedError, match="newer stoker"):
        saver.load_state_dict(dict(state, version=state["version"] + 1))


def test_context_manager_closes(dataset):
    uri, _ = dataset
    with stoker.Loader(uri, 8, world_size=1, rank=0) as loader:
        batch = next(iter(loader))
    with pytest.raises(stoker.CancelledError, match="closed"):
        iter(loader)
    assert batch["label"].shape == batch["sample_ids"].shape  # still readable
