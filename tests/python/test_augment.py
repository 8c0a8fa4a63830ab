"""decode={... "crop", "flip", "normalize", "dtype", "layout"}: torchvision's
training and evaluation transforms in the C++ workers, checked against
torchvision itself (its RandomResizedCrop.get_params distribution, and
resized_crop + hflip + to_tensor + normalize on the image PIL decodes)."""

import io

import numpy as np
import pytest

import stoker
from stoker import _stoker

Image = pytest.importorskip("PIL.Image")
torch = pytest.importorskip("torch")
T = pytest.importorskip("torchvision.transforms")
F = pytest.importorskip("torchvision.transforms.functional")

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def picture(h, w, seed):
    """Smooth colour fields with some edges: like a photo to a JPEG coder."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    channels = []
    for _ in range(3):
        fx, fy, phase = rng.uniform(0.005, 0.05, 2).tolist() + [rng.uniform(0, 6)]
        channels.append(128 + 100 * np.sin(x * fx + phase) * np.cos(y * fy))
    img = np.stack(channels, -1)
    for _ in range(6):  # a few flat rectangles with hard edges
        y0, x0 = int(rng.integers(0, h - 20)), int(rng.integers(0, w - 20))
        img[y0:y0 + int(rng.integers(10, h // 3)), x0:x0 + int(rng.integers(10, w // 3))] = \
            rng.integers(0, 256, 3)
    return np.clip(img, 0, 255).astype(np.uint8)


def jpeg_bytes(pixels, mode="RGB", **save):
    img = Image.fromarray(pixels)
    if mode != "RGB":
        img = img.convert(mode)
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=save.pop("quality", 92), **save)
    return buf.getvalue()


def options(**kw):
    """The options object stoker.Loader builds from decode={...}."""
    from stoker.loader import _decode_options
    return _decode_options({"field": "image", **kw})[3]


def ks_statistic(a, b):
    """Two-sample Kolmogorov-Smirnov D."""
    a, b = np.sort(a), np.sort(b)
    grid = np.concatenate([a, b])
    return np.max(np.abs(np.searchsorted(a, grid, "right") / len(a)
                         - np.searchsorted(b, grid, "right") / len(b)))


def test_crop_boxes_follow_torchvision_get_params():
    """Area fraction and aspect ratio: in range, and the same distribution as
    torchvision's get_params (two-sample KS test at the 0.1% level)."""
    H, W, n = 375, 500, 4000
    o = options(crop="random_resized", size=224, flip=0.5)
    ours = np.array([_stoker._sample_crop(o, H, W, 11, 2, i) for i in range(n)], dtype=np.float64)
    top, left, h, w, flip = ours.T
    assert (top >= 0).all() and (left >= 0).all()
    assert (top + h <= H).all() and (left + w <= W).all()
    torch.manual_seed(0)
    img = Image.new("RGB", (W, H))
    theirs = np.array([T.RandomResizedCrop.get_params(img, (0.08, 1.0), (3 / 4, 4 / 3))
                       for _ in range(n)], dtype=np.float64)
    area, their_area = h * w / (H * W), theirs[:, 2] * theirs[:, 3] / (H * W)
    aspect, their_aspect = w / h, theirs[:, 3] / theirs[:, 2]
    whole = (h == H) & (w == W)  # the fallback (or a whole-image draw)
    assert (area[~whole] >= 0.08 * 0.97).all() and (area <= 1).all()
    assert ((aspect[~whole] >= 0.75 * 0.985) & (aspect[~whole] <= 4 / 3 * 1.015)).all()
    critical = 1.95 * np.sqrt(2 / n)  # alpha = 0.001
    assert ks_statistic(area, their_area) < critical, (area.mean(), their_area.mean())
    assert ks_statistic(aspect, their_aspect) < critical
    assert abs(area.mean() - their_area.mean()) < 0.02
    # Flips: Binomial(n, 0.5), within 5 standard deviations.
    assert abs(flip.sum() - n / 2) < 5 * np.sqrt(n / 4)


def _torchvision_reference(jpeg, box, size, flip):
    """torchvision on the image PIL decodes, with the box stoker drew."""
    top, left, h, w = (int(round(v)) for v in box)
    img = Image.open(io.BytesIO(jpeg)).convert("RGB")
    out = F.resized_crop(img, top, left, h, w, list(size), T.InterpolationMode.BILINEAR)
    if flip:
        out = F.hflip(out)
    return F.normalize(F.to_tensor(out), MEAN, STD).numpy()


def test_normalize_matches_torchvision_on_the_same_crop():
    """RandomResizedCrop + flip + ToTensor + Normalize against torchvision
    applying the same box to PIL's decode. The pixels differ by DCT scaling
    (stoker decodes at the smallest scale that covers the output, then
    resamples bilinearly) against PIL's antialiased bilinear on the full
    image: a few grey levels. The arithmetic after the pixels is
    torchvision's, to float32 rounding."""
    size = (160, 160)
    o = options(crop="random_resized", size=size, flip=0.5, normalize=(MEAN, STD),
                layout="NCHW")
    diffs = []
    for k in range(12):
        pixels = picture(300 + 17 * k, 400 - 9 * k, k)
        jpeg = jpeg_bytes(pixels)
        got = _stoker._decode_sample(o, jpeg, 5, 1, k)
        assert got.dtype == np.float32 and got.shape == (3, *size)
        top, left, h, w, flip = _stoker._sample_crop(o, *pixels.shape[:2], 5, 1, k)
        want = _torchvision_reference(jpeg, (top, left, h, w), size, flip)
        # In grey levels: undo the std.
        diffs.append(np.abs(got - want) * np.array(STD)[:, None, None] * 255)
    diff = np.stack(diffs)
    print(f"stoker vs torchvision (same box, PIL decode): mean {diff.mean():.2f}, "
          f"p99 {np.percentile(diff, 99):.1f}, max {diff.max():.1f} grey levels")
    # Measured: mean 0.52, 99th percentile 6, max 39 (at the hard edges).
    assert diff.mean() < 1.5
    assert np.percentile(diff, 99) < 10


def test_center_crop_matches_torchvision_resize_then_center_crop():
    o = options(crop="center", size=224, normalize=True)
    pixels = picture(300, 400, 7)
    jpeg = jpeg_bytes(pixels)
    got = _stoker._decode_sample(o, jpeg)
    assert got.shape == (224, 224, 3)  # NHWC by default
    img = Image.open(io.BytesIO(jpeg)).convert("RGB")
    want = F.normalize(F.to_tensor(F.center_crop(F.resize(img, 256), 224)), MEAN, STD).numpy()
    diff = np.abs(got.transpose(2, 0, 1) - want) * np.array(STD)[:, None, None] * 255
    print(f"center crop: mean {diff.mean():.2f}, max {diff.max():.1f} grey levels")
    assert diff.mean() < 1.5  # measured: 0.70


def test_float16_is_float32_rounded_and_nchw_is_nhwc_transposed():
    jpeg = jpeg_bytes(picture(240, 320, 3))
    base = dict(crop="random_resized", size=(96, 128), flip=0.5, normalize=True)
    f32 = _stoker._decode_sample(options(**base), jpeg, 1, 2, 3)
    f16 = _stoker._decode_sample(options(**base, dtype="float16"), jpeg, 1, 2, 3)
    chw = _stoker._decode_sample(options(**base, layout="NCHW"), jpeg, 1, 2, 3)
    assert f16.dtype == np.float16 and f32.shape == f16.shape == (96, 128, 3)
    np.testing.assert_array_equal(f16, f32.astype(np.float16))  # numpy rounds to nearest even
    np.testing.assert_array_equal(chw, f32.transpose(2, 0, 1))
    u8 = _stoker._decode_sample(options(crop="random_resized", size=(96, 128), flip=0.5), jpeg,
                                1, 2, 3)
    want = ((u8.astype(np.float32) / np.float32(255) - np.array(MEAN, np.float32))
            / np.array(STD, np.float32))
    np.testing.assert_array_equal(f32, want)


@pytest.mark.parametrize("mode,save", [("L", {}), ("CMYK", {}), ("RGB", {"progressive": True}),
                                       ("RGB", {"subsampling": 0})])
def test_jpeg_kinds_decode_to_rgb_as_pil_does(mode, save):
    pixels = picture(120, 160, 1)
    jpeg = jpeg_bytes(pixels, mode, **save)
    want = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"), dtype=np.int16)
    got = _stoker._decode_sample(options(size=(120, 160)), jpeg)  # no resampling
    diff = np.abs(got.astype(np.int16) - want)
    assert diff.max() <= 1, (mode, save, diff.max())
    if mode == "L":
        assert (got[..., 0] == got[..., 1]).all() and (got[..., 1] == got[..., 2]).all()


def test_corrupt_and_truncated_jpegs_are_corruption():
    jpeg = jpeg_bytes(picture(200, 200, 2))
    o = options(size=64)
    for bad in (b"", b"\xff\xd8 not a jpeg", jpeg[:len(jpeg) // 2]):
        with pytest.raises(stoker.CorruptionError):
            _stoker._decode_sample(o, bad)


@pytest.mark.parametrize("decode,key", [
    ({"crop": "random"}, "crop"),
    ({"scale": (0.5, 0.2)}, "scale"),
    ({"scale": (0.0, 1.0)}, "scale"),
    ({"scale": (0.1, 1.5)}, "scale"),
    ({"scale": 0.5}, "scale"),
    ({"ratio": (0, 1)}, "ratio"),
    ({"ratio": (2, 1)}, "ratio"),
    ({"flip": 1.5}, "flip"),
    ({"flip": "yes"}, "flip"),
    ({"normalize": ((0, 0, 0), (1, 0, 1))}, "std"),
    ({"normalize": ((0, 0), (1, 1, 1))}, "normalize"),
    ({"normalize": True, "dtype": "uint8"}, "normalize"),
    ({"dtype": "int32"}, "dtype"),
    ({"layout": "HWC"}, "layout"),
    ({"crop": "center", "resize_shorter": 100}, "resize_shorter"),
    ({"skip_corrupt": "no"}, "skip_corrupt"),
    ({"colour": 1}, "colour"),
])
def test_bad_decode_options_name_the_key(tmp_path, decode, key):
    with pytest.raises((ValueError, TypeError), match=key):
        stoker.Loader(tmp_path / "nowhere", 4, decode={"field": "image", **decode}, rank=0,
                      world_size=1)


def _dataset(tmp_path, count=24):
    src = tmp_path / "src"
    for i in range(count):
        folder = src / f"c{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:03d}.jpg").write_bytes(jpeg_bytes(picture(90 + i, 120 - i, i)))
    stoker.pack(src, tmp_path / "ds", shuffle=False)
    return tmp_path / "ds"


AUGMENT = {"field": "image", "size": (48, 64), "crop": "random_resized", "flip": 0.5,
           "normalize": (MEAN, STD), "dtype": "float16", "layout": "NCHW"}


def _epoch(path, epoch=0, **kw):
    """{sample id: image} of one epoch."""
    loader = stoker.Loader(path, 8, decode=AUGMENT, seed=4, rank=0, world_size=1, **kw)
    loader.set_epoch(epoch)
    out = {}
    for batch in loader:
        for sid, img in zip(batch["sample_ids"].tolist(), batch["image"]):
            out[sid] = np.array(img)
    loader.close()
    return out


def test_loader_delivers_float16_nchw_the_same_for_any_thread_count(tmp_path):
    path = _dataset(tmp_path)
    loader = stoker.Loader(path, 8, decode=AUGMENT, seed=4, rank=0, world_size=1,
                           format="torch")
    batch = next(iter(loader))
    assert batch["image"].dtype == torch.float16
    assert tuple(batch["image"].shape) == (8, 3, 48, 64)
    loader.close()
    one, two = _epoch(path, threads=1), _epoch(path, threads=2)
    assert sorted(one) == list(range(24))
    for sid in one:
        np.testing.assert_array_equal(one[sid], two[sid])
    # What the loader gives is DecodeSample's bytes for (seed, epoch, sample).
    o = options(**{k: v for k, v in AUGMENT.items() if k != "field"})
    jpegs = sorted((tmp_path / "src").rglob("*.jpg"), key=lambda p: (p.parent.name, p.name))
    for sid in (0, 5, 17):
        want = _stoker._decode_sample(o, jpegs[sid].read_bytes(), 4, 0, sid)
        np.testing.assert_array_equal(one[sid], want)


def test_another_epoch_draws_other_crops_the_same_epoch_the_same(tmp_path):
    path = _dataset(tmp_path, 8)
    first, again, second = _epoch(path, 0), _epoch(path, 0), _epoch(path, 1)
    assert sorted(first) == sorted(second) == list(range(8))
    assert all(np.array_equal(first[s], again[s]) for s in first)
    assert sum(not np.array_equal(first[s], second[s]) for s in first) == 8


def test_corrupt_image_fails_naming_the_sample_or_is_skipped_and_counted(tmp_path):
    src = tmp_path / "src" / "c0"
    src.mkdir(parents=True)
    for i in range(6):
        (src / f"{i}.jpg").write_bytes(jpeg_bytes(picture(80, 100, i)))
    good = jpeg_bytes(picture(80, 100, 9))
    (src / "3.jpg").write_bytes(good[:len(good) // 3])  # truncated
    stoker.pack(tmp_path / "src", tmp_path / "ds", shuffle=False)
    with pytest.raises(stoker.CorruptionError, match="sample 3"):
        list(stoker.Loader(tmp_path / "ds", 3, decode=AUGMENT, rank=0, world_size=1))
    loader = stoker.Loader(tmp_path / "ds", 3, decode={**AUGMENT, "skip_corrupt": True},
                           rank=0, world_size=1)
    images = {s: np.array(i) for b in loader for s, i in zip(b["sample_ids"].tolist(), b["image"])}
    assert sorted(images) == list(range(6))
    assert not images[3].any() and all(images[s].any() for s in (0, 1, 2, 4, 5))
    assert loader.stats()["decode_skipped"] == 1
