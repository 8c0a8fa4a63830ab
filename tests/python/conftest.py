"""Shared fixtures: every test makes its own data in a temporary folder.

Run with the package from a build on PYTHONPATH:
    PYTHONPATH=build/python /usr/bin/python3 -m pytest -q tests/python
"""

import os
import random
import sys
from pathlib import Path

import pytest

try:
    import stoker
except ImportError as e:  # pragma: no cover - a setup problem, said plainly
    raise ImportError(
        f"cannot import stoker ({e}); build with -DSTOKER_WITH_PYTHON=ON and set "
        "PYTHONPATH=<build>/python") from e

SOURCE_DIR = Path(os.environ.get("STOKER_SOURCE_DIR", Path(__file__).resolve().parents[2]))


class SourceData:
    """An ImageFolder of random files and what each global sample id must hold.

    pack sorts files by class then name, so sample id i is the i-th file in
    (class, name) order: `expected[i] == (bytes, label)`.
    """

    def __init__(self, root, classes, per_class, seed, min_size=50, max_size=3000):
        rng = random.Random(seed)
        self.root = Path(root)
        self.expected = []
        for c in range(classes):
            folder = self.root / f"class{c:02d}"
            folder.mkdir(parents=True)
            for i in range(per_class):
                size = rng.randint(min_size, max_size)
                # The first bytes name the sample, the rest is random.
                head = f"c{c}/{i};".encode()
                data = head + rng.randbytes(max(0, size - len(head)))
                (folder / f"{i:05d}.bin").write_bytes(data)
                self.expected.append((data, c))

    def __len__(self):
        return len(self.expected)


def make_dataset(tmp_path, classes=4, per_class=50, shard_mib=1 / 64, seed=1, name="ds"):
    """Packs a random ImageFolder; returns (dataset path, SourceData)."""
    src = SourceData(tmp_path / f"{name}-src", classes, per_class, seed)
    dst = tmp_path / name
    stoker.pack(src.root, dst, shard_mib=shard_mib, shuffle=False)  # sample id = source index
    return str(dst), src


@pytest.fixture
def dataset(tmp_path):
    """200 samples of 50 B to 3 KB in ~16 KiB shards (about 25 shards)."""
    return make_dataset(tmp_path)


def collect_ids(loader):
    """Sample ids per batch of one iteration of `loader`."""
    return [b["sample_ids"].tolist() for b in loader]


def run_python(code, env=None, timeout=120):
    """Runs `code` in a fresh /usr/bin/python3 (the same interpreter as this one)."""
    import subprocess

    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True,
                          text=True, timeout=timeout)
