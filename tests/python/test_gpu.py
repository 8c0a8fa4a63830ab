"""Device delivery from Python: option checks everywhere; on a machine with a
GPU and a CUDA build, batches arrive as CUDA tensors through DLPack, equal
to the host batches, and ordered after the loader's copy on the consumer's
torch stream."""

import pytest

import stoker
from stoker import _stoker
from conftest import make_dataset


def test_device_needs_a_gpu_format(dataset):
    path, _ = dataset
    with pytest.raises(ValueError, match="format='torch' or 'dlpack'"):
        stoker.Loader(path, 16, device="cuda:0")
    with pytest.raises(ValueError, match="device delivery"):
        stoker.Loader(path, 16, format="dlpack")


def test_bad_device_name_is_named(dataset):
    path, _ = dataset
    with pytest.raises(stoker.InvalidArgumentError, match="gpu:1"):
        stoker.Loader(path, 16, device="gpu:1", format="dlpack")


def _gpu():
    """The reason there is no usable GPU here, or None."""
    if not _stoker._built_with_cuda():
        return "stoker was built without CUDA"
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    return None


def test_no_gpu_is_a_clear_error(dataset):
    if not _stoker._built_with_cuda():
        pytest.skip("stoker was built without CUDA")
    if _gpu() is None:
        pytest.skip("this machine has a GPU; the no-GPU path is for CI")
    path, _ = dataset
    with pytest.raises(stoker.StokerError, match="cuda:0"):
        stoker.Loader(path, 16, device="cuda:0", format="dlpack")


@pytest.fixture
def gpu():
    reason = _gpu()
    if reason:
        pytest.skip(f"needs a CUDA GPU: {reason}")
    import torch
    return torch


def test_batches_arrive_on_the_gpu_equal_to_host_batches(tmp_path, gpu):
    torch = gpu
    path, src = make_dataset(tmp_path, classes=4, per_class=100)
    opts = dict(seed=3, shuffle_window=4, threads=2)
    host = stoker.Loader(path, 32, format="torch", **opts)
    dev = stoker.Loader(path, 32, format="torch", device="cuda:0", **opts)
    side = torch.cuda.Stream()
    n = 0
    for h, d in zip(host, dev):
        for key in ("sample_ids", "padding", "label"):
            assert d[key].is_cuda and d[key].device.index == 0
            assert torch.equal(d[key].cpu(), h[key]), key
        assert d["image"].data.is_cuda
        # Used on another stream: that stream waits for the copy too.
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            total = d["image"].data.sum(dtype=torch.int64)
        assert total.item() == int(h["image"].data.sum(dtype=torch.int64))
        for i in range(len(h["sample_ids"])):
            data, label = src.expected[int(h["sample_ids"][i])]
            assert bytes(d["image"][i].cpu().numpy()) == data
        n += 1
    assert n == len(host)
    stats = dev.stats()
    assert stats["h2d_bytes"] > 0 and stats["device_bytes"] > 0


def test_dlpack_objects_follow_the_consumer_stream(tmp_path, gpu):
    torch = gpu
    path, _ = make_dataset(tmp_path)
    loader = stoker.Loader(path, 16, format="dlpack", device="cuda:0", seed=1)
    stream = torch.cuda.Stream()
    for batch in loader:
        ids = batch["sample_ids"]
        assert ids.__dlpack_device__() == (2, 0)
        with torch.cuda.stream(stream):
            t = torch.from_dlpack(ids)  # waits on `stream`
            assert t.is_cuda and t.dtype == torch.uint64
        with pytest.raises(ValueError, match="ambiguous"):
            ids.__dlpack__(stream=0)


def test_augmented_images_arrive_as_float16_nchw_equal_to_host(tmp_path, gpu):
    """decode with crop, flip, normalize into float16 NCHW: the device tensor
    has the host batch's dtype, shape and values (DLPack carries the type)."""
    torch = gpu
    import io
    import numpy as np
    Image = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(0)
    for i in range(16):
        folder = tmp_path / "src" / f"c{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (60 + i, 90, 3), np.uint8)).save(buf, "JPEG")
        (folder / f"{i}.jpg").write_bytes(buf.getvalue())
    stoker.pack(tmp_path / "src", tmp_path / "ds", shuffle=False)
    decode = {"field": "image", "size": (32, 48), "crop": "random_resized", "flip": 0.5,
              "normalize": True, "dtype": "float16", "layout": "NCHW"}
    opts = dict(decode=decode, seed=2, rank=0, world_size=1)
    host = stoker.Loader(tmp_path / "ds", 8, format="torch", **opts)
    dev = stoker.Loader(tmp_path / "ds", 8, format="torch", device="cuda:0", **opts)
    n = 0
    for h, d in zip(host, dev):
        assert d["image"].is_cuda and d["image"].dtype == torch.float16
        assert tuple(d["image"].shape) == tuple(h["image"].shape) == (8, 3, 32, 48)
        assert torch.equal(d["image"].cpu(), h["image"])
        n += 1
    assert n == 2
