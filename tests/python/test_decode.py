"""decode=...: JPEG -> uint8 N x H x W x 3, resized like torchvision's Resize((h, w))."""

import io

import numpy as np
import pytest

import stoker

Image = pytest.importorskip("PIL.Image")


def write_jpegs(root, count):
    """Images of different sizes: a solid colour per class, or a smooth gradient."""
    rng = np.random.default_rng(0)
    expected = []
    for i in range(count):
        c = i % 2
        folder = root / f"c{c}"
        folder.mkdir(parents=True, exist_ok=True)
        h, w = int(rng.integers(40, 120)), int(rng.integers(40, 120))
        if c == 0:
            colour = rng.integers(0, 256, 3).astype(np.uint8)
            pixels = np.broadcast_to(colour, (h, w, 3)).copy()
        else:
            y, x = np.mgrid[0:h, 0:w]
            pixels = np.stack([x * 255 // w, y * 255 // h, (x + y) * 127 // (w + h)], -1)
            pixels = pixels.astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="JPEG", quality=95)
        (folder / f"{i:04d}.jpg").write_bytes(buf.getvalue())
        expected.append((c, buf.getvalue()))
    # pack's order: class, then name
    return [x for c in (0, 1) for x in expected if x[0] == c]


@pytest.mark.parametrize("decode,size", [("image", (224, 224)),
                                         ({"field": "image", "size": (24, 40)}, (24, 40)),
                                         ({"field": "image", "size": 16}, (16, 16))])
def test_decode_resizes_to_the_asked_size(tmp_path, decode, size):
    expected = write_jpegs(tmp_path / "src", 12)
    stoker.pack(tmp_path / "src", tmp_path / "ds", shuffle=False)
    loader = stoker.Loader(tmp_path / "ds", 5, decode=decode, rank=0, world_size=1)
    seen = 0
    for batch in loader:
        images = batch["image"]
        assert isinstance(images, np.ndarray) and images.dtype == np.uint8
        assert images.shape == (len(batch["sample_ids"]), *size, 3)
        address, length = loader._impl.last_buffer
        assert address <= images.__array_interface__["data"][0] < address + length
        for k, sid in enumerate(batch["sample_ids"].tolist()):
            _, jpeg = expected[sid]
            reference = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB").resize(
                (size[1], size[0]), Image.BILINEAR), dtype=np.int16)
            diff = np.abs(images[k].astype(np.int16) - reference)
            assert diff.mean() < 6, f"sample {sid}: mean difference {diff.mean():.1f}"
        seen += len(batch["sample_ids"])
    assert seen == 12


def test_corrupt_jpeg_is_a_corruption_error(tmp_path):
    folder = tmp_path / "src" / "c0"
    folder.mkdir(parents=True)
    (folder / "bad.jpg").write_bytes(b"\xff\xd8 this is not a jpeg")
    stoker.pack(tmp_path / "src", tmp_path / "ds", shuffle=False)
    with pytest.raises(stoker.CorruptionError):
        list(stoker.Loader(tmp_path / "ds", 1, decode="image", rank=0, world_size=1))
