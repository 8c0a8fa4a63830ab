"""pack, inspect, verify from Python."""

import subprocess
import json
import os

import pytest

import stoker
from conftest import SourceData


def test_pack_inspect_verify(tmp_path):
    src = SourceData(tmp_path / "src", classes=3, per_class=40, seed=4)
    calls = []
    info = stoker.pack(src.root, tmp_path / "ds", shard_mib=1 / 32, threads=2,
                       progress=lambda p: calls.append(dict(p)))
    assert info["samples"] == len(src) == sum(info["shard_samples"])
    assert info["shards"] == len(info["shard_samples"]) > 1
    assert info["classes"] == ["class00", "class01", "class02"]
    assert info["fields"] == [{"name": "image", "type": "bytes"},
                              {"name": "label", "type": "int64"}]
    assert info["payload_bytes"] >= sum(len(d) for d, _ in src.expected)
    assert calls and calls[-1]["files_done"] == calls[-1]["files_total"] == len(src)
    inspected = stoker.inspect(tmp_path / "ds")
    assert inspected["dataset_id"] == info["dataset_id"] and len(info["dataset_id"]) == 32
    report = stoker.verify(f"file://{tmp_path / 'ds'}")
    assert report["ok"] and report["problems"] == []
    assert report["shards_checked"] == info["shards"]
    assert report["samples_checked"] == len(src)
    assert report["bytes_read"] >= info["bytes"]


def test_inspect_agrees_with_the_cli(dataset):
    binary = os.environ.get("STOKER_BIN")
    if not binary:
        pytest.skip("STOKER_BIN (the stoker command) not set; ctest sets it")
    uri, _ = dataset
    cli = json.loads(subprocess.run([binary, "inspect", uri, "--json"], check=True,
                                    capture_output=True, text=True).stdout)
    mine = stoker.inspect(uri)
    for key, value in cli.items():
        assert mine[key] == value, key


def test_pack_from_a_list_file(tmp_path):
    src = SourceData(tmp_path / "src", classes=2, per_class=10, seed=5)
    lines = [f"{p.relative_to(tmp_path)} {7 + i % 3}"
             for i, p in enumerate(sorted(src.root.rglob("*.bin")))]
    (tmp_path / "list.txt").write_text("# path label\n" + "\n".join(lines) + "\n")
    info = stoker.pack(tmp_path / "list.txt", f"file://{tmp_path / 'ds'}", shuffle=False)
    assert info["samples"] == 20
    batch = next(iter(stoker.Loader(tmp_path / "ds", 20, shuffle=False, rank=0, world_size=1)))
    assert batch["label"].tolist() == [7 + i % 3 for i in range(20)]


def test_pack_to_memory_store_and_load_in_process(tmp_path):
    src = SourceData(tmp_path / "src", classes=2, per_class=15, seed=6)
    stoker.pack(src.root, "mem://pytest-pack", shuffle=False)
    loader = stoker.Loader("mem://pytest-pack", 4, shuffle=False, rank=0, world_size=1)
    got = [x for b in loader for x in b["image"].tolist()]
    assert got == [d for d, _ in src.expected]


def test_default_pack_shuffles_reproducibly(tmp_path):
    src = SourceData(tmp_path / "src", classes=2, per_class=15, seed=6)
    stoker.pack(src.root, tmp_path / "a")
    stoker.pack(src.root, tmp_path / "b")
    stoker.pack(src.root, tmp_path / "c", seed=1)

    def order(uri):
        loader = stoker.Loader(uri, 30, shuffle=False, rank=0, world_size=1)
        return [x for b in loader for x in b["image"].tolist()]

    a = order(tmp_path / "a")
    assert a == order(tmp_path / "b")           # same seed, same packed order
    assert a != order(tmp_path / "c")           # another seed, another order
    assert a != [d for d, _ in src.expected]    # shuffled, not the source order
    assert sorted(a) == sorted(d for d, _ in src.expected)


def test_progress_callback_exception_is_raised(tmp_path):
    src = SourceData(tmp_path / "src", classes=1, per_class=5, seed=7)

    def progress(p):
        raise KeyError("stop here")

    with pytest.raises(KeyError, match="stop here"):
        stoker.pack(src.root, tmp_path / "ds", progress=progress)
