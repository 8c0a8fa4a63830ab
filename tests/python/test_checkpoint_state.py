"""stoker.save/stoker.load over C++'s state trees (EncodeState, LoadState):
one call into C++ per load, the walk's edge cases, and C++ readers seeing
exactly what Python saved."""

import collections
import json
import os
import subprocess

import numpy as np
import pytest
import torch

import stoker


class Calls:
    """The Checkpointer binding, with the names of the methods called on it."""

    def __init__(self, impl):
        self.impl, self.names = impl, []

    def __getattr__(self, name):
        self.names.append(name)
        return getattr(self.impl, name)


@pytest.mark.parametrize("into", [False, True])
def test_a_load_is_one_call_into_cpp(tmp_path, into):
    root = str(tmp_path / "ckpt")
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    saved = {"model": model.state_dict(), "extra": torch.ones(3), "step": 4}
    stoker.save(saved, root, name="c", rank=0, world_size=1)
    ck = stoker.Checkpointer(root)
    ck._impl = Calls(ck._impl)
    target = {"model": torch.nn.Sequential(torch.nn.Linear(4, 8),
                                           torch.nn.Linear(8, 2)).state_dict()}
    back = ck.load("c", into=target if into else None)
    assert ck._impl.names == ["load_state"]
    for k, t in saved["model"].items():
        assert torch.equal(back["model"][k], t)
        if into:
            assert back["model"][k] is target["model"][k]
    assert back["step"] == 4 and torch.equal(back["extra"], torch.ones(3))
    ck._impl = ck._impl.impl
    ck.close()


def test_ordered_dict_order_and_depth(tmp_path):
    root = str(tmp_path / "ckpt")
    od = collections.OrderedDict([("a", 1), ("b", torch.zeros(2)), ("c", 3)])
    od.move_to_end("a")  # the OrderedDict's order, not its dict's
    stoker.save({"od": od}, root, name="od", rank=0, world_size=1)
    back = stoker.load(root, "od")["od"]
    assert type(back) is collections.OrderedDict and list(back) == ["b", "c", "a"]
    deep = leaf = []
    for _ in range(80):
        leaf.append([])
        leaf = leaf[0]
    with pytest.raises(ValueError, match=r"state(\[0\]){60}: nested deeper than 60 containers"):
        stoker.save(deep, root, name="deep", rank=0, world_size=1)
    with pytest.raises(TypeError, match=r"state\['s'\]: a str that is not valid Unicode"):
        stoker.save({"s": "\ud800"}, root, name="surrogate", rank=0, world_size=1)
    with pytest.raises(TypeError, match=r"a key of state: a str that is not valid Unicode"):
        stoker.save({"\udc00": 1}, root, name="surrogate", rank=0, world_size=1)
    nested = leaf = {}
    for _ in range(50):  # deep, but within what the readers take
        leaf["x"] = {}
        leaf = leaf["x"]
    leaf["t"] = torch.ones(1)
    stoker.save(nested, root, name="nested", rank=0, world_size=1)
    node = stoker.load(root, "nested")
    for _ in range(50):
        node = node["x"]
    assert torch.equal(node["t"], torch.ones(1))


def test_cpp_reads_what_python_saved_exactly(tmp_path):
    binary = os.environ.get("STOKER_BIN")
    if not binary:
        pytest.skip("STOKER_BIN (the stoker command) not set; ctest sets it")
    root = str(tmp_path / "ckpt")
    big = -(2**70) + 1
    stoker.save({"big": big, "u": 2**64 - 1, "np": np.float32(1.5), "b": b"\x00\xff"}, root,
                name="s", rank=0, world_size=1)
    back = stoker.load(root, "s")
    assert back["big"] == big and back["u"] == 2**64 - 1 and back["b"] == b"\x00\xff"
    assert type(back["np"]) is np.float32
    show = subprocess.run([binary, "ckpt", "show", "--json", root, "s"], capture_output=True,
                          text=True, check=True)
    entries = {e["path"]: e for e in json.loads(show.stdout)["structure"]}
    assert entries["u"]["value"] == 2**64 - 1 and entries["big"]["type"] == "int"
    assert entries["big"]["value"] == str(big)  # beyond 64 bits: its digits, as a string
    human = subprocess.run([binary, "ckpt", "show", root, "s"], capture_output=True, text=True,
                           check=True).stdout
    assert str(big) in human  # every digit
    got = subprocess.run([binary, "ckpt", "get", root, "s", "big"], capture_output=True,
                         text=True, check=True)
    assert got.stdout.strip() == str(big)
