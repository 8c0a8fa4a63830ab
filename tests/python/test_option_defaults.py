"""Every default is C++'s (issue 35): a stoker object made without its
optional arguments hands C++ exactly the default-constructed options struct,
because the Python keyword arguments default to None and only what is given
is set."""

import pytest

import stoker
from stoker import _stoker
from stoker import mix as _mix


def _is_struct(value):
    t = type(value)
    return t.__module__ == _stoker.__name__ and not hasattr(t, "__members__")  # not an enum


def fields(obj):
    """The readable fields of a bound options struct, nested ones as dicts."""
    out = {}
    for name in dir(type(obj)):
        if name.startswith("_") or not isinstance(getattr(type(obj), name), property):
            continue
        value = getattr(obj, name)
        if _is_struct(value):
            value = fields(value)
        elif isinstance(value, list):
            value = [fields(v) if _is_struct(v) else v for v in value]
        out[name] = value
    return out


@pytest.fixture(autouse=True)
def no_launcher(monkeypatch):
    # rank and world_size from the environment would be 0 and 1 too; make sure.
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK",
                "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(var, raising=False)


def test_the_helper_sees_every_field():
    f = fields(_stoker._LoaderOptions())
    for name in ("batch_size", "shuffle", "seed", "read_unit", "ragged", "cache_policy",
                 "sequence_verify", "read_timeout_s"):
        assert name in f
    assert isinstance(f["store"], dict) and "posix_engine" in f["store"]
    assert isinstance(f["decode"], dict) and "crop" in f["decode"]
    o = _stoker._LoaderOptions()
    o.store.io_threads = 3
    assert fields(o) != f  # a nested difference shows


def test_loader(dataset):
    uri, _ = dataset
    default = _stoker._LoaderOptions()
    with stoker.Loader(uri, default.batch_size) as loader:
        assert fields(loader._options) == fields(default)


def test_checkpointer_and_save_options(tmp_path):
    c = stoker.Checkpointer(str(tmp_path / "ckpt"))
    try:
        assert fields(c._options) == fields(_stoker._CheckpointerOptions())
        assert c._options.device_staging == "snapshot"
    finally:
        c.close()
    assert fields(stoker.Checkpointer._save_options()) == fields(_stoker._SaveOptions())
    assert _stoker._SaveOptions().step is None
    assert _stoker._SaveOptions().commit_timeout_s == 600.0  # as documented in C++


def test_mix_options():
    default = _stoker._MixOptions()
    assert (fields(_mix._options(default.batch_size, default.sequence_length))
            == fields(default))


def test_given_values_still_reach_cpp(dataset, tmp_path):
    uri, _ = dataset
    with stoker.Loader(uri, 8, shuffle=False, seed=5, read_unit="shard", ragged="offsets",
                       cache_policy="lru", sequence_verify=False) as loader:
        o = loader._options
        assert (o.shuffle, o.seed, o.read_unit, o.ragged, o.cache_policy, o.sequence_verify) \
            == (False, 5, "shard", "offsets", "lru", False)
        assert (loader.shuffle, loader.seed, loader.ragged) == (False, 5, "offsets")
    c = stoker.Checkpointer(str(tmp_path / "c"), direct_io=False, device_staging="bounded",
                            staging_ring_bytes=1 << 21)
    try:
        assert (c._options.direct_reads, c._options.store.direct_writes) == (False, False)
        assert (c._options.device_staging, c._options.staging_ring_bytes) == ("bounded", 1 << 21)
    finally:
        c.close()
    s = stoker.Checkpointer._save_options(step=3, metadata={"a": 1}, keep_last=2, attempt="x",
                                          commit_timeout=5)
    assert (s.step, s.metadata_json, s.keep_last, s.attempt, s.commit_timeout_s) \
        == (3, '{"a":1}', 2, "x", 5.0)
    m = _mix._options(16, 32, seed=2, shuffle=False, dtype="int32", positions=True, verify=False,
                      prefetch=7)
    assert (m.seed, m.shuffle, m.sequence_dtype, m.sequence_positions, m.sequence_verify,
            m.prefetch_batches) == (2, False, "int32", True, False, 7)
