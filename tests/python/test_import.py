"""stoker.import_webdataset / import_jsonl / export_webdataset: the C++
importers from Python, with progress and cancellation."""
import io
import json
import os
import tarfile

import pytest

import stoker


def write_tar(path, samples):
    """A WebDataset tar written by Python's tarfile, as users' tools do:
    samples is [(key, {ext: bytes})]."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as t:
        for key, members in samples:
            for ext, data in members.items():
                info = tarfile.TarInfo("%s.%s" % (key, ext))
                info.size = len(data)
                info.mtime = 1700000000
                t.addfile(info, io.BytesIO(data))


def members(path):
    with tarfile.open(path) as t:
        return [(m.name, t.extractfile(m).read()) for m in t.getmembers()]


def sample(i):
    return ("shard/%06d" % i, {"jpg": os.urandom(100 + i % 300),
                               "txt": ("caption %d" % i).encode(),
                               "json": json.dumps({"i": i, "w": 500}).encode()})


def test_webdataset_import_export_round_trip(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    per_tar, tars = 400, 3
    for t in range(tars):
        write_tar(src / ("%05d.tar" % t), [sample(t * per_tar + i) for i in range(per_tar)])
    seen = []
    r = stoker.import_webdataset([str(src)], str(tmp_path / "ds"), shard_bytes=64 << 10,
                                 progress=seen.append)
    assert r["samples"] == per_tar * tars and r["skipped"] == 0
    assert r["fields"][0] == "'__key__' (str)"
    assert [os.path.basename(s) for s in r["sources"]] == ["00000.tar", "00001.tar", "00002.tar"]
    assert seen and seen[-1]["samples"] == per_tar * tars
    assert seen[-1]["bytes_read"] == seen[-1]["bytes_total"] == r["source_bytes"]

    # The loader sees the keys and the captions as strings, JSON parsed.
    loader = stoker.Loader(str(tmp_path / "ds"), batch_size=100, shuffle=False, format="numpy")
    keys, caps, meta = [], [], []
    for b in loader:
        keys += b["__key__"]
        caps += b["txt"]
        meta += b["json"]
    assert keys == ["shard/%06d" % i for i in range(per_tar * tars)]
    assert caps[7] == "caption 7" and meta[1199]["i"] == 1199

    out = tmp_path / "out"
    ex_seen = []
    e = stoker.export_webdataset(str(tmp_path / "ds"), str(out), samples_per_tar=per_tar,
                                 progress=ex_seen.append)
    assert e["tars"] == tars and e["samples"] == per_tar * tars
    assert ex_seen[-1]["samples"] == ex_seen[-1]["samples_total"] == per_tar * tars
    for t in range(tars):
        assert members(out / ("%06d.tar" % t)) == members(src / ("%05d.tar" % t))


def test_a_raising_progress_cancels_and_commits_nothing(tmp_path):
    src = tmp_path / "src.tar"
    # Big enough for several progress calls (one about every 16 MiB read).
    write_tar(src, [("k%05d" % i, {"bin": os.urandom(256 << 10)}) for i in range(200)])
    calls = []

    def progress(p):
        calls.append(p)
        if p["bytes_read"] > 0:
            raise KeyError("stop here")

    with pytest.raises(KeyError, match="stop here"):
        stoker.import_webdataset(str(src), str(tmp_path / "ds"), progress=progress)
    assert len(calls) == 1
    assert not os.path.exists(tmp_path / "ds" / "manifest.stoker")
    # A re-run into the same place goes through (the leftovers are cleaned).
    r = stoker.import_webdataset(str(src), str(tmp_path / "ds"))
    assert r["samples"] == 200


def test_bad_tar_names_the_tar_and_member(tmp_path):
    good, bad = tmp_path / "a.tar", tmp_path / "b.tar"
    write_tar(good, [sample(i) for i in range(5)])
    # A duplicate field in one sample.
    write_tar(bad, [("x/1", {"jpg": b"1"}), ("x/1", {"jpg": b"2"})])
    with pytest.raises(stoker.CorruptionError) as e:
        stoker.import_webdataset([str(good), str(bad)], str(tmp_path / "ds"))
    assert "b.tar" in str(e.value) and "x/1" in str(e.value)
    assert not os.path.exists(tmp_path / "ds" / "manifest.stoker")
    with pytest.raises(stoker.NotFoundError, match="nope.tar"):
        stoker.import_webdataset(str(tmp_path / "nope.tar"), str(tmp_path / "ds2"))


def test_jsonl_declared_fields_and_errors(tmp_path):
    p = tmp_path / "c.jsonl"
    with open(p, "w") as f:
        for i in range(50):
            f.write(json.dumps({"text": "doc %d" % i, "tokens": list(range(i % 7 + 1)),
                                "extra": i}) + "\n")
    r = stoker.import_jsonl(str(p), str(tmp_path / "ds"),
                            fields={"text": "str", "tokens": ("uint16", None)})
    assert r["samples"] == 50
    loader = stoker.Loader(str(tmp_path / "ds"), batch_size=50, shuffle=False, format="numpy")
    b = next(iter(loader))
    assert b["text"][3] == "doc 3"
    assert list(b["tokens"][6][:b["tokens_lengths"][6]]) == list(range(7))
    assert str(b["tokens"].dtype) == "uint16"

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"tokens": [1, 2]}\n{"tokens": [1, 70000]}\n')
    with pytest.raises(stoker.OutOfRangeError) as e:
        stoker.import_jsonl(str(bad), str(tmp_path / "ds3"), fields={"tokens": "uint16[*]"})
    assert "bad.jsonl:2" in str(e.value)
    assert not os.path.exists(tmp_path / "ds3" / "manifest.stoker")


def test_an_empty_part_commits_with_the_others(tmp_path):
    uri = str(tmp_path / "ds")
    fields = {"x": "bytes", "i": "int64"}
    for part in range(3):
        with stoker.Writer(uri, fields=fields, part=part) as w:
            if part != 1:  # rank 1 got no input
                for i in range(10):
                    w.write({"x": b"v", "i": part * 10 + i})
    s = stoker.commit_parts(uri, 3)
    assert s["samples"] == 20
    got = sorted(int(v) for b in stoker.Loader(uri, batch_size=5, format="numpy")
                 for v in b["i"])
    assert got == list(range(10)) + list(range(20, 30))
