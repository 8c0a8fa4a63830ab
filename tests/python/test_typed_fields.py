"""Format 3's typed fields as the loader collates them (include/stoker/loader.h,
Batch): scalars and fixed arrays as (N, *shape) arrays of their dtype, str and
json as lists, variable arrays padded with NAME_lengths or back to back with
NAME_offsets; numpy and torch; every value of every sample checked."""

import json

import numpy as np
import pytest

import stoker
from stoker import _stoker

# name, type as `stoker pack` users write it, numpy dtype of its elements
ARRAYS = {
    "emb": ("float32[4]", np.float32),
    "patch": ("uint8[2,3]", np.uint8),
    "half": ("float16[3]", np.float16),
    "bf": ("bfloat16[2]", np.uint16),  # raw bits (numpy has no bfloat16)
    "u16": ("uint16[2]", np.uint16),
    "u32": ("uint32[3]", np.uint32),
    "i32": ("int32[2]", np.int32),
    "i64arr": ("int64[2]", np.int64),
    "one": ("float32[]", np.float32),
}
RAGGED = {
    "tokens": ("uint32[*]", np.uint32, ()),
    "boxes": ("float32[*,2,2]", np.float32, (2, 2)),
    "ids": ("int64[*]", np.int64, ()),
}


def _shape(type_):
    dims = type_[type_.index("[") + 1:-1]
    return tuple(int(d) for d in dims.split(",")) if dims else ()


class TypedData:
    """A format-3 dataset with one field of every kind; `rows[i]` holds
    sample i's values by field name (numpy arrays for arrays)."""

    def __init__(self, path, n=45, shard_bytes=2048):
        rng = np.random.default_rng(7)
        self.fields = [("img", "bytes"), ("label", "int64"), ("score", "float32"),
                       ("weight", "float64"), ("text", "str"), ("meta", "json")]
        self.fields += [(k, t) for k, (t, _) in ARRAYS.items()]
        self.fields += [(k, t) for k, (t, _, _) in RAGGED.items()]
        self.rows, records = [], []
        for i in range(n):
            row = {
                "img": rng.bytes(int(rng.integers(0, 200))),
                "label": i * 1000 - 7,
                "score": np.float32(i * 0.5 - 3.25),
                "weight": i / 3.0 + 1e10,
                "text": "" if i % 4 == 0 else f"sample {i} héllo ✓",
                "meta": {"id": i, "tags": ["a", None if i % 2 else True], "x": i / 4},
            }
            for k, (t, dt) in ARRAYS.items():
                shape = _shape(t)
                if np.issubdtype(dt, np.floating):
                    row[k] = rng.standard_normal(shape).astype(dt)
                else:
                    row[k] = rng.integers(0, np.iinfo(dt).max, size=shape, dtype=dt,
                                          endpoint=True)
            for k, (t, dt, rest) in RAGGED.items():
                rows = 0 if i % 3 == 1 else (i * 5) % 7 + 1
                if np.issubdtype(dt, np.floating):
                    row[k] = rng.standard_normal((rows, *rest)).astype(dt)
                else:
                    row[k] = rng.integers(0, np.iinfo(dt).max, size=(rows, *rest), dtype=dt)
            self.rows.append(row)
            rec = []
            for name, type_ in self.fields:
                v = row[name]
                if type_ == "json":
                    v = json.dumps(v)
                elif isinstance(v, np.ndarray):
                    v = v.tobytes()
                elif isinstance(v, np.floating):
                    v = float(v)
                rec.append(v)
            records.append(rec)
        self.uri = str(path)
        self.info = _stoker._write_test_dataset(self.uri, self.fields, records, shard_bytes)
        assert self.info["shards"] > 2


@pytest.fixture(scope="module")
def typed(tmp_path_factory):
    return TypedData(tmp_path_factory.mktemp("typed") / "ds")


def _np(x):
    """A numpy array of a numpy array or a CPU torch tensor."""
    return x if isinstance(x, np.ndarray) else x.numpy()


def check_batch(typed, b, ragged, torch_format):
    ids = _np(b["sample_ids"]).tolist()
    n = len(ids)
    want = [typed.rows[i] for i in ids]
    if torch_format:
        import torch
        assert b["score"].dtype == torch.float32 and b["weight"].dtype == torch.float64
        assert b["bf"].dtype == torch.bfloat16
        assert b["u16"].dtype == torch.int32 and b["u32"].dtype == torch.int64  # widened
        assert b["tokens"].dtype == torch.int64
        assert b["half"].dtype == torch.float16
        bf_bits = b["bf"].view(torch.int16).numpy().view(np.uint16)
    else:
        assert b["score"].dtype == np.float32 and b["weight"].dtype == np.float64
        for k, (_, dt) in ARRAYS.items():
            assert b[k].dtype == dt, k
        bf_bits = b["bf"]
    assert tuple(b["score"].shape) == (n,) and tuple(b["weight"].shape) == (n,)
    np.testing.assert_array_equal(_np(b["score"]), [w["score"] for w in want])
    np.testing.assert_array_equal(_np(b["weight"]), [w["weight"] for w in want])
    np.testing.assert_array_equal(_np(b["label"]), [w["label"] for w in want])
    for k, (t, dt) in ARRAYS.items():
        assert tuple(b[k].shape) == (n, *_shape(t)), k
        got = _np(bf_bits) if k == "bf" else _np(b[k])
        np.testing.assert_array_equal(got, np.stack([w[k] for w in want]), err_msg=k)
    assert b["text"] == [w["text"] for w in want]
    assert all(type(s) is str for s in b["text"])
    assert b["meta"] == [w["meta"] for w in want]
    assert b["img"].tolist() == [w["img"] for w in want]
    for k, (t, dt, rest) in RAGGED.items():
        lengths = [len(w[k]) for w in want]
        if ragged == "padded":
            assert f"{k}_offsets" not in b
            got_lengths = _np(b[f"{k}_lengths"])
            assert got_lengths.dtype == np.int64
            np.testing.assert_array_equal(got_lengths, lengths)
            longest = max(lengths)
            arr = _np(b[k])
            assert arr.shape == (n, longest, *rest), k
            for j, w in enumerate(want):
                np.testing.assert_array_equal(arr[j, :lengths[j]], w[k], err_msg=k)
                assert not arr[j, lengths[j]:].any(), f"{k}: padding is zeros"
        else:
            assert f"{k}_lengths" not in b
            offsets = _np(b[f"{k}_offsets"])
            assert offsets.dtype == np.int64
            np.testing.assert_array_equal(offsets, np.concatenate([[0], np.cumsum(lengths)]))
            arr = _np(b[k])
            assert arr.shape == (sum(lengths), *rest), k
            for j, w in enumerate(want):
                np.testing.assert_array_equal(arr[offsets[j]:offsets[j + 1]], w[k], err_msg=k)


@pytest.mark.parametrize("ragged", ["padded", "offsets"])
@pytest.mark.parametrize("read_unit", ["shard", "sample"])
def test_numpy_every_value(typed, ragged, read_unit):
    loader = stoker.Loader(typed.uri, 8, seed=3, ragged=ragged, read_unit=read_unit,
                           rank=0, world_size=1)
    seen = []
    for b in loader:
        check_batch(typed, b, ragged, torch_format=False)
        seen += b["sample_ids"].tolist()
    assert sorted(seen) == list(range(len(typed.rows)))
    loader.close()


@pytest.mark.parametrize("ragged", ["padded", "offsets"])
def test_torch_every_value(typed, ragged):
    torch = pytest.importorskip("torch")
    loader = stoker.Loader(typed.uri, 16, seed=1, ragged=ragged, format="torch", rank=0,
                           world_size=1)
    batches = 0
    for b in loader:
        check_batch(typed, b, ragged, torch_format=True)
        assert isinstance(b["emb"], torch.Tensor) and b["emb"].dtype == torch.float32
        assert isinstance(b["patch"], torch.Tensor) and b["patch"].dtype == torch.uint8
        batches += 1
    assert batches == len(loader)
    loader.close()


def test_arrays_are_views_of_the_batch_buffer(typed):
    loader = stoker.Loader(typed.uri, 8, shuffle=False, rank=0, world_size=1)
    b = next(iter(loader))
    address, size = loader._impl.last_buffer
    for k in list(ARRAYS) + list(RAGGED) + ["score", "weight", "tokens_lengths"]:
        a = b[k]
        assert a.base is not None, k
        p = a.__array_interface__["data"][0]
        assert address <= p <= address + size, k
    loader.close()


def test_info_names_dtype_and_shape(typed):
    fields = {f["name"]: f for f in stoker.inspect(typed.uri)["fields"]}
    assert fields["boxes"]["type"] == "array"
    assert fields["boxes"]["dtype"] == "float32"
    assert fields["boxes"]["shape"] == (None, 2, 2)
    assert fields["patch"]["shape"] == (2, 3)
    assert fields["one"]["shape"] == ()
    assert "dtype" not in fields["text"]
    assert typed.info["format_version"] == 3


def test_selected_fields(typed):
    loader = stoker.Loader(typed.uri, 45, shuffle=False, fields=["tokens", "meta"], rank=0,
                           world_size=1)
    b = next(iter(loader))
    assert sorted(b) == ["meta", "padding", "sample_ids", "tokens", "tokens_lengths"]
    assert b["meta"][3] == typed.rows[3]["meta"]
    loader.close()


def test_ragged_option_checked_by_cpp(typed):
    with pytest.raises(stoker.InvalidArgumentError,
                       match="ragged must be padded or offsets, not 'jagged'"):
        stoker.Loader(typed.uri, 8, ragged="jagged", rank=0, world_size=1)
    with pytest.raises(TypeError, match="ragged"):
        stoker.Loader(typed.uri, 8, ragged=1, rank=0, world_size=1)


def test_index_key_that_is_a_field_is_refused(tmp_path):
    uri = str(tmp_path / "clash")
    _stoker._write_test_dataset(uri, [("tok", "uint32[*]"), ("tok_lengths", "int64")],
                                [[b"\x01\x00\x00\x00", 1]])
    with pytest.raises(ValueError, match="tok_lengths"):
        stoker.Loader(uri, 1, rank=0, world_size=1)
    # With offsets the clash is gone.
    loader = stoker.Loader(uri, 1, ragged="offsets", rank=0, world_size=1)
    b = next(iter(loader))
    assert b["tok"].tolist() == [1] and b["tok_offsets"].tolist() == [0, 1]
    assert b["tok_lengths"].tolist() == [1]
    loader.close()


def test_json_that_does_not_parse_names_field(tmp_path):
    uri = str(tmp_path / "badjson")
    # The format keeps JSON byte for byte; a writer that did not check it
    # could store this, and the batch says which field failed.
    try:
        _stoker._write_test_dataset(uri, [("m", "json")], [["{not json"]])
    except stoker.StokerError:
        pytest.skip("the shard builder checks JSON itself")
    loader = stoker.Loader(uri, 1, rank=0, world_size=1)
    with pytest.raises(ValueError, match="json field 'm'"):
        next(iter(loader))
    loader.close()
