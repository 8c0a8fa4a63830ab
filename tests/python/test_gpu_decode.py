"""decode={..., "device": "cuda:N"}: the GPU decode's options and its CPU
fallback (issue 34). The GPU itself is covered by tests/gpu_decode_test.cc
(scripts/gpu/decode.sh on the GPU machine)."""

import pytest

import stoker
from test_decode import write_jpegs


def test_decode_device_needs_the_batches_on_that_gpu(tmp_path):
    write_jpegs(tmp_path / "src", 4)
    stoker.pack(tmp_path / "src", tmp_path / "ds")
    with pytest.raises(ValueError, match=r"pass device='cuda:0'"):
        stoker.Loader(tmp_path / "ds", 2, decode={"field": "image", "device": "cuda:0"},
                      rank=0, world_size=1)
    with pytest.raises(ValueError, match="decode device"):
        stoker.Loader(tmp_path / "ds", 2, decode={"field": "image", "device": "gpu0"},
                      rank=0, world_size=1)


def test_stats_say_which_path_decoded(tmp_path):
    write_jpegs(tmp_path / "src", 6)
    stoker.pack(tmp_path / "src", tmp_path / "ds")
    loader = stoker.Loader(tmp_path / "ds", 3, decode={"field": "image", "size": 16,
                                                       "device": "cpu"},
                           rank=0, world_size=1)
    assert sum(len(b["sample_ids"]) for b in loader) == 6
    s = loader.stats()
    assert s["decode_path"] == "cpu"
    assert (s["decoded_cpu"], s["decoded_hardware"], s["decoded_cuda"]) == (6, 0, 0)
    raw = stoker.Loader(tmp_path / "ds", 3, rank=0, world_size=1)
    assert raw.stats()["decode_path"] == ""
    # Without the GPU decode no share is handed to the CPU, balanced or not;
    # the option is a bool.
    balanced = stoker.Loader(tmp_path / "ds", 3, decode={"field": "image", "size": 16,
                                                         "cpu_share": 0.25,
                                                         "cpu_share_balance": True},
                             rank=0, world_size=1)
    assert sum(len(b["sample_ids"]) for b in balanced) == 6
    assert balanced.stats()["decode_cpu_share"] == 0.0
    with pytest.raises(TypeError, match="cpu_share_balance"):
        stoker.Loader(tmp_path / "ds", 3, decode={"field": "image", "cpu_share_balance": "yes"},
                      rank=0, world_size=1)
    # worker_nice: a whole number, its range checked in C++.
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="worker_nice"):
            stoker.Loader(tmp_path / "ds", 3, decode={"field": "image", "worker_nice": bad},
                          rank=0, world_size=1)
    with pytest.raises(ValueError, match="worker_nice 20: a nice increment"):
        stoker.Loader(tmp_path / "ds", 3, decode={"field": "image", "worker_nice": 20},
                      rank=0, world_size=1)
    assert sum(len(b["sample_ids"]) for b in stoker.Loader(
        tmp_path / "ds", 3, decode={"field": "image", "size": 16, "worker_nice": 0},
        rank=0, world_size=1)) == 6


def test_bfloat16_images_are_for_device_delivery(tmp_path):
    write_jpegs(tmp_path / "src", 2)
    stoker.pack(tmp_path / "src", tmp_path / "ds")
    with pytest.raises(ValueError, match="bfloat16.*device delivery"):
        stoker.Loader(tmp_path / "ds", 2, decode={"field": "image", "dtype": "bfloat16"},
                      rank=0, world_size=1)
