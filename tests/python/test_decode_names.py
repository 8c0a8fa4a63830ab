"""crop, dtype and layout are read by C++ alone (stoker/decode.h, Parse*): the
CLI's --crop/--dtype/--layout and Python's decode={...} accept the same
words and refuse the others with the same message (issue 35)."""

import os
import subprocess

import numpy as np
import pytest

import stoker
from stoker import _stoker
from stoker.loader import _decode_options

STOKER_BIN = os.environ.get("STOKER_BIN")

# (option, word, accepted)
WORDS = [
    ("crop", "resize", True),
    ("crop", "center", True),
    ("crop", "random-resized", True),
    ("crop", "random_resized", True),
    ("crop", "Random_Resized", True),
    ("crop", "CENTER", True),
    ("crop", "random", False),
    ("crop", "resized", False),
    ("crop", "", False),
    ("dtype", "uint8", True),
    ("dtype", "float32", True),
    ("dtype", "float16", True),
    ("dtype", "bfloat16", True),
    ("dtype", "Float16", True),
    ("dtype", "int32", False),
    ("dtype", "float", False),
    ("layout", "nhwc", True),
    ("layout", "NCHW", True),
    ("layout", "nChw", True),
    ("layout", "hwc", False),
    ("layout", "CHW", False),
]


def _python_error(option, word):
    """None when Python's decode= takes the word, else the message."""
    try:
        _decode_options({"field": "image", option: word})
    except stoker.InvalidArgumentError as e:
        return str(e)
    return None


def _cli_error(option, word, tmp_path):
    """None when `stoker bench loader` takes the word (it then fails on the
    missing dataset), else its message."""
    r = subprocess.run([STOKER_BIN, "bench", "loader", str(tmp_path / "nowhere"),
                        f"--{option}", word], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0, r.stdout
    message = r.stderr.strip().removeprefix("stoker: ")
    if message.startswith("Not found:"):
        return None
    return message.removeprefix("Invalid argument: ")


@pytest.mark.skipif(not STOKER_BIN, reason="STOKER_BIN (the stoker command) is not set")
@pytest.mark.parametrize("option,word,accepted", WORDS)
def test_cli_and_python_accept_and_refuse_the_same_words(option, word, accepted, tmp_path):
    if option == "crop" and word == "":
        pytest.skip("an empty --crop is the CLI's 'not given'")
    python, cli = _python_error(option, word), _cli_error(option, word, tmp_path)
    if accepted:
        assert python is None and cli is None, (python, cli)
    else:
        assert python is not None and python.startswith(f"{option} must be "), python
        assert python.endswith(f", not '{word}'")
        assert cli == f"--{python}"


def test_an_empty_crop_is_refused_by_python():
    assert _python_error("crop", "") == \
        "crop must be resize, center or random-resized, not ''"


def test_the_parsers_are_bound_with_their_names_and_enums():
    assert _stoker.parse_crop_mode("random_resized") == _stoker.CropMode.RANDOM_RESIZED
    assert _stoker.parse_image_dtype("BFLOAT16") == _stoker.ImageDType.BFLOAT16
    assert _stoker.parse_image_layout("NCHW") == _stoker.ImageLayout.NCHW
    for mode in _stoker.CropMode.__members__.values():
        assert _stoker.parse_crop_mode(_stoker.crop_mode_name(mode)) == mode
    for t in _stoker.ImageDType.__members__.values():
        assert _stoker.parse_image_dtype(_stoker.image_dtype_name(t)) == t
    for layout in _stoker.ImageLayout.__members__.values():
        assert _stoker.parse_image_layout(_stoker.image_layout_name(layout)) == layout
    with pytest.raises(ValueError, match="layout must be nhwc or nchw, not 'hwc'"):
        _stoker.parse_image_layout("hwc")


def test_numpy_and_torch_dtypes_and_none_for_the_default():
    o = _decode_options({"field": "image", "dtype": np.float16})[3]
    assert o.dtype == _stoker.ImageDType.FLOAT16
    torch = pytest.importorskip("torch")
    o = _decode_options({"field": "image", "dtype": torch.float32})[3]
    assert o.dtype == _stoker.ImageDType.FLOAT32
    default = _stoker._DecodeOptions()
    o = _decode_options({"field": "image", "crop": None, "dtype": None, "layout": None})[3]
    assert (o.crop, o.dtype, o.layout) == (default.crop, default.dtype, default.layout)
    # normalize's float32 stays when dtype is None (not given).
    o = _decode_options({"field": "image", "normalize": True, "dtype": None})[3]
    assert o.dtype == _stoker.ImageDType.FLOAT32


@pytest.mark.skipif(not STOKER_BIN, reason="STOKER_BIN (the stoker command) is not set")
def test_cli_and_python_refuse_the_same_worker_nice(tmp_path):
    # The range is C++'s (ValidateDecodeOptions): one message for both.
    for nice, accepted in ((0, True), (19, True), (20, False)):
        r = subprocess.run([STOKER_BIN, "bench", "loader", str(tmp_path / "nowhere"), "--decode",
                            "--decode-worker-nice", str(nice)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0, r.stdout
        cli = r.stderr.strip().removeprefix("stoker: ")
        try:
            _decode_options({"field": "image", "worker_nice": nice})
            python = None
        except stoker.InvalidArgumentError as e:
            python = str(e)
        if accepted:
            assert python is None and cli.startswith("Not found:"), (python, cli)
        else:
            assert python == "decode worker_nice 20: a nice increment, between 0 and 19", python
            assert cli == "Invalid argument: " + python
    r = subprocess.run([STOKER_BIN, "bench", "loader", str(tmp_path / "nowhere"),
                        "--decode-worker-nice", "-1"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "--decode-worker-nice" in r.stderr, r.stderr
