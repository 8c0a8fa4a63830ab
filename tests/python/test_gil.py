"""The GIL is released while stoker waits: other Python threads keep running."""

import io
import sys
import threading
import time

import numpy as np
import pytest

import stoker

Image = pytest.importorskip("PIL.Image")


class Spinner:
    """A Python thread that notes the time whenever it gets to run."""

    def __init__(self):
        self.times = []
        self.stop = False
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop:
            self.times.append(time.perf_counter())
            time.sleep(0)

    def ran_between(self, start, end):
        return any(start < t < end for t in self.times)


@pytest.fixture
def fast_switch():
    old = sys.getswitchinterval()
    sys.setswitchinterval(0.001)
    yield
    sys.setswitchinterval(old)


def call_while_spinning(fn):
    spinner = Spinner()
    spinner.thread.start()
    time.sleep(0.01)
    start = time.perf_counter()
    result = fn()
    end = time.perf_counter()
    spinner.stop = True
    spinner.thread.join()
    # A thread holding the GIL in C++ lets no other run until it returns;
    # 20 ms of margin covers the switch before the call and after it.
    return result, end - start, spinner.ran_between(start + 0.02, end - 0.02)


def test_waiting_for_a_batch_releases_the_gil(tmp_path, fast_switch):
    rng = np.random.default_rng(0)
    folder = tmp_path / "src" / "c0"
    folder.mkdir(parents=True)
    for i in range(48):
        pixels = rng.integers(0, 256, (1024, 1024, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
        (folder / f"{i:03d}.jpg").write_bytes(buf.getvalue())
    stoker.pack(tmp_path / "src", tmp_path / "ds")
    # One worker decoding 48 megapixel JPEGs: the first batch takes a while.
    loader = stoker.Loader(tmp_path / "ds", 48, decode={"field": "image", "size": (512, 512)},
                           threads=1, rank=0, world_size=1)
    batch, waited, others_ran = call_while_spinning(lambda: next(iter(loader)))
    assert batch["image"].shape == (48, 512, 512, 3)
    assert waited > 0.1, f"the first batch came too fast ({waited:.3f} s) to tell"
    assert others_ran, "another Python thread must run while Next() waits"


def test_pack_releases_the_gil(tmp_path, fast_switch):
    # Many small files: pack's cost is opening them, one worker at a time.
    for c in range(4):
        folder = tmp_path / "src" / f"c{c}"
        folder.mkdir(parents=True)
        for i in range(1500):
            (folder / f"{i:05d}.bin").write_bytes(i.to_bytes(4, "little"))
    info, took, others_ran = call_while_spinning(
        lambda: stoker.pack(tmp_path / "src", tmp_path / "ds", threads=1))
    assert info["samples"] == 6000
    if took < 0.1:
        pytest.skip(f"pack of 6000 files took only {took:.3f} s: too fast to tell")
    assert others_ran, "another Python thread must run while pack works"
