"""stoker.Writer: a user's own records, typed, into a dataset the Loader reads."""
import json
import os
import threading
import time

import numpy as np
import pytest

import stoker


FIELDS = {"image": "jpeg", "caption": "str", "meta": "json", "score": "float32",
          "tokens": ("uint32", None), "emb": ("float32", (4,)), "label": "int64"}


def record(i):
    return {"image": bytes([i % 256]) * (i % 50 + 1), "caption": "cap %d ü" % i,
            "meta": {"i": i, "tags": ["a", "b"]}, "score": i / 4,
            "tokens": np.arange(i % 5, dtype=np.uint32) + i,
            "emb": [float(i), 1.0, 2.0, 3.0], "label": i}


def test_round_trip_through_the_loader(tmp_path):
    uri = str(tmp_path / "ds")
    seen = []
    with stoker.Writer(uri, fields=FIELDS, shard_bytes=16 << 10,
                       progress=seen.append) as w:
        for i in range(300):
            w.write(record(i))
    summary = w.close()
    assert summary["samples"] == 300 and summary["shards"] > 1
    assert summary["format_version"] == 3
    assert seen and seen[-1]["records"] == 300
    loader = stoker.Loader(uri, batch_size=50, shuffle=False, format="numpy")
    got = {}
    for batch in loader:
        for k, label in enumerate(batch["label"]):
            got[int(label)] = (batch["caption"][k], batch["meta"][k], float(batch["score"][k]),
                               list(batch["tokens"][k][:batch["tokens_lengths"][k]]),
                               list(batch["emb"][k]))
    assert sorted(got) == list(range(300))
    for i in (0, 7, 299):
        cap, meta, score, tokens, emb = got[i]
        assert cap == "cap %d ü" % i
        assert meta == {"i": i, "tags": ["a", "b"]}
        assert score == i / 4
        assert tokens == list(range(i, i + i % 5))
        assert emb == [float(i), 1.0, 2.0, 3.0]


def test_bad_records_name_the_record_and_field(tmp_path):
    uri = str(tmp_path / "ds")
    with stoker.Writer(uri, fields=FIELDS) as w:
        w.write(record(0))
        bad = record(1)
        bad["emb"] = [1.0, 2.0]
        with pytest.raises(stoker.InvalidArgumentError, match=r"record 1: field 'emb'.*length 8"):
            w.write(bad)
        bad = record(1)
        bad["meta"] = "{not json"
        with pytest.raises(stoker.InvalidArgumentError, match="'meta' \\(json\\) is not one JSON"):
            w.write(bad)
        bad = record(1)
        del bad["caption"]
        with pytest.raises(KeyError, match="caption"):
            w.write(bad)
        w.write(record(1))
    assert stoker.inspect(uri)["samples"] == 2
    with pytest.raises(stoker.InvalidArgumentError, match="unknown type"):
        stoker.Writer(str(tmp_path / "x"), fields={"a": "uint33[*]"})
    with pytest.raises(stoker.AlreadyExistsError):
        stoker.Writer(uri, fields=FIELDS)


def test_an_exception_in_the_block_leaves_no_dataset(tmp_path):
    uri = str(tmp_path / "ds")
    with pytest.raises(RuntimeError):
        with stoker.Writer(uri, fields=FIELDS, shard_bytes=8192) as w:
            for i in range(200):
                w.write(record(i))
            raise RuntimeError("the user's code failed")
    assert not os.path.exists(os.path.join(uri, "manifest.stoker"))
    with pytest.raises(stoker.NotFoundError):
        stoker.inspect(uri)
    with stoker.Writer(uri, fields=FIELDS) as w:  # a re-run writes it cleanly
        w.write(record(0))
    assert stoker.inspect(uri)["samples"] == 1


def test_parts_from_threads_commit_once(tmp_path):
    uri = str(tmp_path / "ds")

    def part(p):
        with stoker.Writer(uri, fields=FIELDS, part=p, shard_bytes=8192) as w:
            for i in range(p * 100, p * 100 + 100):
                w.write(record(i))

    threads = [threading.Thread(target=part, args=(p,)) for p in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert stoker.commit_parts(uri, 3)["samples"] == 300
    labels = sorted(int(x) for b in stoker.Loader(uri, batch_size=64, format="numpy")
                    for x in b["label"])
    assert labels == list(range(300))


def test_python_rate_against_cpp_writer(tmp_path):
    """Not a timing test: the benchmark (docs/benchmarks.md) measures the rate;
    this checks the GIL is released while writing (another thread runs)."""
    uri = str(tmp_path / "ds")
    payload = os.urandom(100_000)
    ticks = []
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0)

    t = threading.Thread(target=spin)
    t.start()
    with stoker.Writer(uri, fields={"image": "bytes", "label": "int64"}) as w:
        for i in range(500):
            w.write({"image": payload, "label": i})
    stop.set()
    t.join()
    assert stoker.inspect(uri)["samples"] == 500
    assert len(ticks) > 0
