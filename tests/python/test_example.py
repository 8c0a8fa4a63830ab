"""examples/train_fashion_mnist.py: trains a few steps, checkpoints, resumes exactly."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SOURCE_DIR

SCRIPT = SOURCE_DIR / "examples" / "train_fashion_mnist.py"
FASHION = Path("/usr/share/datasets/fashion-mnist")

pytestmark = pytest.mark.skipif(not (FASHION / "train-images-idx3-ubyte.gz").exists(),
                                reason="Debian's dataset-fashion-mnist is not installed")


def train(tmp_path, *args):
    cmd = [sys.executable, str(SCRIPT), "--work-dir", str(tmp_path / "work"), "--limit", "1000",
           "--batch-size", "64", "--threads", "2", "--log-every", "5", *args]
    env = dict(os.environ)
    for var in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"):
        env.pop(var, None)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def read_log(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def test_train_checkpoint_resume_equals_uninterrupted(tmp_path):
    # 1000 images in batches of 64: 16 batches an epoch; 30 steps cross an epoch.
    out = train(tmp_path, "--steps", "30", "--log-json", str(tmp_path / "straight.jsonl"),
                "--eval-limit", "500")
    assert "packed 1000 train images" in out
    assert "step 30 epoch 1" in out
    accuracy = float(out.split("test accuracy ")[1].split()[0])
    assert accuracy > 0.3, out  # 30 steps of SGD learn something (chance is 0.1)

    ckpt = tmp_path / "fm-ckpt"
    out = train(tmp_path, "--steps", "12", "--checkpoint", str(ckpt), "--save-every", "5",
                "--log-json", str(tmp_path / "resumed.jsonl"))
    assert "packed" not in out, "the second run reuses the packed dataset"
    assert (ckpt / "latest").read_text() == "step-000000000012\n"
    committed = sorted(p.parent.name for p in ckpt.glob("*/manifest.stkc"))
    assert committed == ["step-000000000010", "step-000000000012"], "keep_last=2"
    out = train(tmp_path, "--steps", "30", "--checkpoint", str(ckpt),
                "--log-json", str(tmp_path / "resumed.jsonl"))
    assert "resumed from" in out and "at step 12 (epoch 0, position 768)" in out, out

    straight, resumed = read_log(tmp_path / "straight.jsonl"), read_log(tmp_path / "resumed.jsonl")
    assert [s["step"] for s in resumed] == list(range(1, 31))
    assert [s["ids"] for s in resumed] == [s["ids"] for s in straight], \
        "the resumed run sees exactly the batches of the uninterrupted one"
    assert [s["epoch"] for s in resumed] == [s["epoch"] for s in straight]
    for a, b in zip(straight, resumed):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4, abs=1e-5), a["step"]

    # Resuming a finished run does nothing more.
    out = train(tmp_path, "--steps", "30", "--checkpoint", str(ckpt))
    assert "at step 30" in out and "steps in" not in out
