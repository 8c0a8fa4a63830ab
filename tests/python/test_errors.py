"""Bad input at every entry point: a fitting exception with a clear message,
never a crash or a hang."""

from pathlib import Path

import pytest

import stoker
from stoker import _stoker

# Every status code: its class and the built-in exception it also is.
MAPPING = [
    ("Invalid argument", stoker.InvalidArgumentError, ValueError),
    ("Not found", stoker.NotFoundError, FileNotFoundError),
    ("Already exists", stoker.AlreadyExistsError, FileExistsError),
    ("Permission denied", stoker.PermissionDeniedError, PermissionError),
    ("Corruption", stoker.CorruptionError, stoker.StokerError),
    ("Unsupported", stoker.UnsupportedError, NotImplementedError),
    ("I/O error", stoker.StorageIOError, OSError),
    ("Timed out", stoker.StorageTimeoutError, TimeoutError),
    ("Unavailable", stoker.UnavailableError, ConnectionError),
    ("No space", stoker.NoSpaceError, OSError),
    ("Cancelled", stoker.CancelledError, stoker.StokerError),
    ("Out of range", stoker.OutOfRangeError, IndexError),
    ("Internal error", stoker.InternalError, RuntimeError),
]


@pytest.mark.parametrize("code_name,cls,builtin", MAPPING)
def test_every_status_code_has_its_exception(code_name, cls, builtin):
    code = _stoker.STATUS_CODES[code_name]
    with pytest.raises(cls) as info:
        _stoker._raise_status(code, "shard-7: sample 3: what went wrong", code == 8)
    e = info.value
    assert isinstance(e, stoker.StokerError) and isinstance(e, builtin)
    assert str(e) == "shard-7: sample 3: what went wrong"
    assert e.code == code_name
    assert e.retryable == (code == 8)
    assert len(_stoker.STATUS_CODES) == len(MAPPING)


def test_bad_uri(tmp_path):
    with pytest.raises(ValueError, match='unknown scheme "nosuch"'):
        stoker.Loader("nosuch://x/y", 8, rank=0, world_size=1)
    with pytest.raises(ValueError, match="uri is empty"):
        stoker.Loader("", 8, rank=0, world_size=1)
    with pytest.raises(TypeError):
        stoker.Loader(42, 8, rank=0, world_size=1)
    # Without RADOS in the build: Unsupported; with it and no cluster: an
    # error naming the pool, after op_timeout at most.
    with pytest.raises(stoker.StokerError, match="RADOS|nosuchpool|Ceph"):
        stoker.Loader("rados://nosuchpool/ds", 8, rank=0, world_size=1, store={"op_timeout": 2})


def test_missing_dataset(tmp_path):
    missing = tmp_path / "nothing-here"
    with pytest.raises(FileNotFoundError, match="no stoker dataset at") as info:
        stoker.Loader(missing, 8, rank=0, world_size=1)
    assert isinstance(info.value, stoker.NotFoundError)
    assert str(missing) in str(info.value)
    with pytest.raises(stoker.NotFoundError, match="no stoker dataset"):
        stoker.inspect(missing)
    with pytest.raises(stoker.NotFoundError):
        stoker.verify(missing)


def flip_byte(path, offset):
    data = bytearray(Path(path).read_bytes())
    data[offset] ^= 0x5A
    Path(path).write_bytes(bytes(data))


def shard_files(uri):
    return sorted(p for p in Path(uri).rglob("*.stks"))


def test_corrupt_sample_fails_the_batch_that_needs_it(dataset):
    uri, src = dataset
    shard = shard_files(uri)[3]
    flip_byte(shard, 64 + 10)  # inside the first record, after the 64-byte header
    loader = stoker.Loader(uri, 8, shuffle=False, rank=0, world_size=1)
    delivered = []
    with pytest.raises(stoker.CorruptionError) as info:
        for batch in loader:
            delivered += batch["sample_ids"].tolist()
    message = str(info.value)
    assert shard.name in message and "checksum mismatch" in message, message
    assert uri in message
    assert info.value.retryable is False
    # Every batch before the one holding the bad sample was delivered.
    bad_sample = sum(stoker.inspect(uri)["shard_samples"][:3])  # shard 3's first sample
    assert delivered == list(range(bad_sample // 8 * 8))
    # The loader stays failed (no hang), and a new epoch fails again the same way.
    with pytest.raises(stoker.CorruptionError):
        list(loader)
    report = stoker.verify(uri)
    assert not report["ok"]
    assert report["problems"] == [{
        "shard": str(shard.relative_to(uri)), "sample": bad_sample, "code": "Corruption",
        "message": report["problems"][0]["message"]}]
    assert "checksum mismatch" in report["problems"][0]["message"]


def test_corrupt_shard_header(dataset):
    uri, _ = dataset
    shard = shard_files(uri)[0]
    flip_byte(shard, 0)  # the magic
    with pytest.raises(stoker.CorruptionError, match=shard.name):
        list(stoker.Loader(uri, 8, shuffle=False, rank=0, world_size=1))
    problems = stoker.verify(uri)["problems"]
    assert len(problems) == 1 and problems[0]["sample"] is None


def test_missing_shard(dataset):
    uri, _ = dataset
    shard = shard_files(uri)[-1]
    shard.unlink()
    with pytest.raises(stoker.NotFoundError, match=shard.name):
        list(stoker.Loader(uri, 8, rank=0, world_size=1))


def test_corrupt_manifest(dataset):
    uri, _ = dataset
    manifest = Path(uri) / "manifest.stoker"
    data = manifest.read_bytes()
    manifest.write_bytes(data[:-20] + b"x" * 20)
    with pytest.raises(stoker.CorruptionError, match="manifest"):
        stoker.Loader(uri, 8, rank=0, world_size=1)
    with pytest.raises(stoker.CorruptionError):
        stoker.verify(uri)
    with pytest.raises(stoker.CorruptionError):
        stoker.inspect(uri)


@pytest.mark.parametrize("kwargs,exc,message", [
    (dict(batch_size=0), ValueError, "batch_size must be at least 1, got 0"),
    (dict(batch_size=-3), ValueError, "batch_size must be at least 1"),
    (dict(batch_size=2.5), TypeError, "batch_size must be an int"),
    (dict(rank=2, world_size=2), ValueError, "rank 2 must be below world_size 2"),
    (dict(rank=0, world_size=0), ValueError, "world_size must be at least 1"),
    (dict(decode={"field": "image", "quality": 3}), ValueError, "unknown decode option 'quality'"),
    (dict(decode={"size": (8, 8)}), ValueError, "decode needs a 'field'"),
    (dict(decode={"field": "image", "size": (0, 8)}), ValueError, "decode size"),
    (dict(decode={"field": "image", "size": "big"}), ValueError, "decode size"),
    (dict(decode=3), TypeError, "decode must be"),
    (dict(decode="label"), ValueError, "decode field 'label' is not a bytes field"),
    (dict(decode="nope"), ValueError, "decode field 'nope' is not among the fields"),
    (dict(fields=["image", "nope"]), ValueError, "no field 'nope'"),
    (dict(fields="image"), TypeError, "fields must be a list"),
    (dict(format="jax"), ValueError, "format must be 'numpy', 'torch' or 'dlpack'"),
    (dict(shuffle="yes"), TypeError, "shuffle must be True or False"),
    (dict(reads_in_flight=-1), ValueError, "reads_in_flight must be at least 0"),
    (dict(shuffle_window=0), ValueError, "shuffle_window must be at least 1"),
    (dict(read_timeout=0), ValueError, "read_timeout must be positive"),
    (dict(seed=-1), ValueError, "seed must be at least 0"),
    (dict(store={"engine": "x"}), ValueError, "unknown store option 'engine'"),
    (dict(store={"posix_engine": "aio"}), ValueError, "posix_engine must be one of"),
    (dict(store={"keep_mapped_bytes": -1}), ValueError, "keep_mapped_bytes must be at least 0"),
    (dict(store={"keep_mapped_bytes": 1.5}), TypeError, "keep_mapped_bytes must be an int"),
    (dict(memory_budget=64 << 10), ValueError, "memory_budget 0 MiB is too small"),
    (dict(unknown_option=1), TypeError, "unknown_option"),
])
def test_invalid_arguments(dataset, kwargs, exc, message):
    uri, _ = dataset
    args = dict(batch_size=8, rank=0, world_size=1)
    args.update(kwargs)
    with pytest.raises(exc, match=message.replace("(", r"\(").replace(")", r"\)")):
        stoker.Loader(uri, **args)


def test_invalid_epoch_and_state_arguments(dataset):
    uri, _ = dataset
    loader = stoker.Loader(uri, 8, rank=0, world_size=1)
    with pytest.raises(ValueError, match="epoch must be at least 0"):
        loader.set_epoch(-1)
    with pytest.raises(TypeError):
        loader.set_epoch("1")


def test_pack_errors(tmp_path, dataset):
    uri, src = dataset
    with pytest.raises(FileExistsError):
        stoker.pack(src.root, uri)
    with pytest.raises(FileNotFoundError):
        stoker.pack(tmp_path / "no-such-folder", tmp_path / "out")
    with pytest.raises(ValueError, match="shard_mib"):
        stoker.pack(src.root, tmp_path / "out", shard_mib=0)
    with pytest.raises(ValueError, match="unknown scheme"):
        stoker.pack(src.root, "nosuch://out")
